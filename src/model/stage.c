/*
 * stage.c — the layers one pipeline rank owns: parameters laid out by the architecture's
 * tensor table, activation slots per micro-batch (one allocation each, carved by the
 * table), and the forward, the backward's input part and its weight part as calls into the
 * architecture's math (arch.h). Nothing here asks which architecture it runs.
 *   x = embed(tok)                               (first stage)
 *   x = block_l(x) for l in [l0, l1)
 *   logits = norm(x) head^T; loss = mean CE      (last stage; head backward inside F)
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/arch.h"
#include "pipelm/backend_math.h"
#include "util/common.h"
#include "model/stage.h"

#define STAGE_MAX_TENSOR 2147483647LL /* floats in one buffer (MPI counts are int) */

/* The backend's last message, for errors the stage passes up. */
const char *stage_error(const stage *st) {
    const char *m = st->be && st->be->error ? st->be->error() : "";
    return m && m[0] ? m : "no message from the backend";
}

/* Point the row pointers (embedding, block, head) into params/grads; a tied head row the
 * stage does not hold reads its embedding row; the head's matrix and its gradient target. */
static void bind_pointers(stage *st) {
    const model_arch *A = st->arch;
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        float *p = st->params + t->offset, *g = st->grads + t->offset;
        block_ptrs *bp = t->part == PART_EMBED ? &st->ep : t->part == PART_HEAD ? &st->hp : &st->bp[t->layer - st->l0];
        block_ptrs *bg = t->part == PART_EMBED ? &st->eg : t->part == PART_HEAD ? &st->hg : &st->bg[t->layer - st->l0];
        bp->t[t->row] = p;
        bg->t[t->row] = g;
        if (t->kind == P_WTE) { st->wte = p; st->dwte = g; }
    }
    if (!st->has_head) return;
    for (int i = 0; i < A->head.n; i++)
        if (model_head_row_tied(&st->cfg, i) >= 0 && st->has_embed) {
            st->hp.t[i] = st->ep.t[model_head_row_tied(&st->cfg, i)];
            st->hg.t[i] = st->eg.t[model_head_row_tied(&st->cfg, i)];
        }
    st->head_w = st->hp.t[A->head_matrix];
    st->dhead_w = model_head_row_tied(&st->cfg, A->head_matrix) >= 0 ? st->dwte_head : st->hg.t[A->head_matrix];
}

/* Allocate through the backend; the first failure's status is kept in *rc. */
static void *balloc(stage *st, size_t bytes, int *rc) {
    void *p = NULL;
    if (*rc) return NULL;
    *rc = st->be->alloc(&p, bytes);
    return *rc ? NULL : p;
}

/* The next n floats of an arena being carved (base NULL: only counted), 64-byte aligned as
 * model_slot_act_bytes counts them. */
static float *carve(char *base, size_t *off, size_t n) {
    float *p = base ? (float *)(base + *off) : NULL;
    *off += (n + 15) / 16 * 16 * sizeof(float);
    return p;
}

/* A slot's tensors in its arena: the input, the tokens, per block the rows the mode keeps
 * (the others point into the shared set), the head's rows. Returns the bytes. */
static size_t lay_slot(stage *st, act_slot *s, char *base) {
    const model_arch *A = st->arch;
    size_t off = 0, N = st->N;
    s->x_in = carve(base, &off, N * st->cfg.C);
    s->tok = st->has_embed ? (int *)carve(base, &off, N) : NULL;
    const model_docs *dc = &st->cfg.docs;
    size_t half = dc->mask && dc->restart ? (size_t)(st->cfg.C / st->cfg.NH / 2) : 0;
    s->doc = dc->mask ? (int *)carve(base, &off, N) : NULL;
    s->pcos = half ? carve(base, &off, N * half) : NULL;
    s->psin = half ? carve(base, &off, N * half) : NULL;
    for (int b = 0; b < st->nb; b++)
        for (int i = 0; i < A->acts.n; i++) {
            const arch_act *r = &A->acts.rows[i];
            int kept = r->keep & (1 << st->recompute);
            s->blocks[b].t[i] = kept ? carve(base, &off, N * arch_dim_value(&st->cfg, st->T, r->per_token))
                                     : st->shared_acts.t[i];
        }
    for (int i = 0; st->has_head && i < A->head_acts.n; i++)
        s->head.t[i] = carve(base, &off, N * arch_dim_value(&st->cfg, st->T, A->head_acts.rows[i].per_token));
    return off;
}

/* One slot's allocation, carved. */
static int alloc_slot(stage *st, act_slot *s) {
    if (!s->blocks) s->blocks = calloc(st->nb ? st->nb : 1, sizeof(block_ptrs));
    if (!s->blocks) return PL_ENOMEM;
    int rc = PL_OK;
    st->slot_bytes = lay_slot(st, s, NULL);
    s->arena = balloc(st, st->slot_bytes, &rc);
    if (rc == PL_OK) lay_slot(st, s, s->arena);
    return rc;
}

/* The activation rows the recompute mode does not keep per slot, one set for the stage, in
 * its arena. Returns the bytes (0 under no recomputation). */
static size_t lay_shared_acts(stage *st, char *base) {
    const model_arch *A = st->arch;
    size_t off = 0;
    for (int i = 0; i < A->acts.n; i++) {
        const arch_act *r = &A->acts.rows[i];
        int kept = r->keep & (1 << st->recompute);
        st->shared_acts.t[i] = kept ? NULL : carve(base, &off, (size_t)st->N * arch_dim_value(&st->cfg, st->T,
                                                                                              r->per_token));
    }
    return off;
}

static int alloc_shared_acts(stage *st) {
    size_t bytes = lay_shared_acts(st, NULL);
    if (!bytes) return PL_OK;
    int rc = PL_OK;
    st->shared_arena = balloc(st, bytes, &rc);
    if (rc == PL_OK) lay_shared_acts(st, st->shared_arena);
    return rc;
}

/* A set of output gradients in its arena: per block the architecture's rows, then the
 * embedding's (first stage). Returns the bytes. */
static size_t lay_douts(stage *st, stage_douts *dd, char *base) {
    const model_arch *A = st->arch;
    size_t off = 0, N = st->N;
    for (int b = 0; b < st->nb; b++)
        for (int i = 0; i < A->douts.n; i++)
            dd->blocks[b].t[i] = carve(base, &off, N * arch_dim_value(&st->cfg, st->T, A->douts.rows[i].per_token));
    dd->embed = st->has_embed ? carve(base, &off, N * st->cfg.C) : NULL;
    return off;
}

static int alloc_douts(stage *st, stage_douts *dd) {
    dd->blocks = calloc(st->nb ? st->nb : 1, sizeof(block_ptrs));
    if (!dd->blocks) return PL_ENOMEM;
    int rc = PL_OK;
    dd->arena = balloc(st, lay_douts(st, dd, NULL), &rc);
    if (rc == PL_OK) lay_douts(st, dd, dd->arena);
    return rc;
}

static void free_douts(stage *st, stage_douts *dd) {
    free(dd->blocks);
    st->be->free(dd->arena);
    memset(dd, 0, sizeof *dd);
}

static void free_slot(stage *st, act_slot *s) {
    st->be->free(s->arena);
    s->arena = NULL;
    free(s->blocks);
    s->blocks = NULL;
    if (s->dd && s->dd != &st->shared_dd) {
        free_douts(st, s->dd);
        free(s->dd);
    }
    s->dd = NULL;
}

/* Refuse a micro-batch whose buffers would not fit (each fewer than 2^31 elements). */
static int check_sizes(const model_config *cfg, int has_head, int Bm, int T, char *err, size_t errlen) {
    long long N = (long long)Bm * T, W = (long long)arch_dim_value(cfg, T, AD_WIDE);
    const char *what = NULL;
    if (N > STAGE_MAX_TENSOR / (W > 0 ? W : 1)) what = "the (tokens, MLP hidden) activations";
    else if (has_head && N > STAGE_MAX_TENSOR / cfg->Vp) what = "the (tokens, padded vocab) logits";
    else if ((long long)Bm * cfg->NH > STAGE_MAX_TENSOR / ((long long)T * (cfg->att_cols > 0 && cfg->att_cols < T ? cfg->att_cols : T)))
        what = cfg->att_cols > 0 && cfg->att_cols < T ? "the (micro-batch, heads, T, head size + 1) attention output"
                                                      : "the (micro-batch, heads, T, T) attention";
    if (!what) return PL_OK;
    snprintf(err, errlen, "micro-batch too large: %s of %d x %d = %lld tokens would exceed %lld floats "
             "(lower --batch/--microbatches ratio or --seq-len)", what, Bm, T, N, STAGE_MAX_TENSOR);
    return PL_EINVAL;
}

/* Floats of one scratch row on this stage (0: not needed here). */
static size_t scratch_floats(const stage *st, const arch_scratch *r) {
    if (r->need == SCR_EMBED && !st->has_embed) return 0;
    return (r->per == SCR_PER_TOKEN ? (size_t)st->N : (size_t)st->T) * arch_dim_value(&st->cfg, st->T, r->dim);
}

/* The architecture's scratch rows in their arena. Returns the bytes. */
static size_t lay_scratch(stage *st, char *base) {
    const model_arch *A = st->arch;
    size_t off = 0;
    for (int i = 0; i < A->nscratch; i++) {
        size_t n = scratch_floats(st, &A->scratch[i]);
        st->scr.t[i] = n ? carve(base, &off, n) : NULL;
    }
    return off;
}

static int alloc_scratch(stage *st) {
    size_t bytes = lay_scratch(st, NULL);
    if (!bytes) return PL_OK;
    int rc = PL_OK;
    st->scr_arena = balloc(st, bytes, &rc);
    if (rc == PL_OK) lay_scratch(st, st->scr_arena);
    return rc;
}

/* The SCR_FILL rows (Llama's rotary tables), computed on the host, uploaded once. */
static int fill_scratch(stage *st) {
    const model_arch *A = st->arch;
    for (int i = 0; i < A->nscratch; i++) {
        size_t n = scratch_floats(st, &A->scratch[i]);
        if (A->scratch[i].use != SCR_FILL || !n) continue;
        float *host = malloc(n * sizeof(float));
        int rc = host ? A->scratch_fill(&st->cfg, st->T, i, host) : PL_ENOMEM;
        if (rc == PL_OK) rc = st->be->from_host(st->scr.t[i], host, n * sizeof(float));
        free(host);
        PL_TRY(rc);
    }
    return PL_OK;
}

/* Parameters, gradients, the scratch and the head's buffers; then the slots. */
static int alloc_buffers(stage *st) {
    const model_arch *A = st->arch;
    size_t N = st->N, C = st->cfg.C, F = sizeof(float), pb = st->nparams * F;
    int rc = PL_OK;
    st->params = balloc(st, pb, &rc);
    st->grads = balloc(st, pb, &rc);
    if (!rc) rc = alloc_scratch(st);
    if (st->has_head) {
        if (model_head_row_tied(&st->cfg, A->head_matrix) >= 0)
            st->dwte_head = balloc(st, arch_param_numel(&st->cfg, &A->head.rows[A->head_matrix], 0) * F, &rc);
        st->logits = balloc(st, N * st->cfg.Vp * F, &rc);
        st->losses = balloc(st, N * F, &rc);
        st->tgt = balloc(st, N * sizeof(int), &rc);
        st->host_losses = rc ? NULL : malloc(N * F);
        if (!rc && !st->host_losses) rc = PL_ENOMEM;
    }
    st->dres = balloc(st, N * C * F, &rc);
    if (!rc) rc = alloc_douts(st, &st->shared_dd);
    for (int i = 0; i < st->nslots && !rc; i++) {
        rc = alloc_slot(st, &st->slots[i]);
        st->slots[i].dd = &st->shared_dd;
    }
    return rc;
}

int stage_init(stage *st, const model_config *cfg, int l0, int l1, int has_embed, int has_head,
               int Bm, int T, int nslots, const backend *be, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    if (l0 < 0 || l1 < l0 || l1 > cfg->L || T < 1 || T > cfg->maxT || Bm < 1 || nslots < 1) {
        snprintf(err, errlen, "bad stage shape: blocks [%d,%d) of %d, B=%d T=%d (max %d), slots %d",
                 l0, l1, cfg->L, Bm, T, cfg->maxT, nslots);
        return PL_EINVAL;
    }
    /* the attention buffer as the backend needs it (a fused kernel's output, not T x T) */
    model_config c = *cfg;
    if (cfg->cp > 1) /* --cp: the span kernel's O and log-sum-exp (cp.c), whatever the backend's mode */
        c.att_cols = cfg->C / cfg->NH + 1;
    else if (be->attention_cols)
        c.att_cols = be->attention_cols(Bm, T, (int)arch_dim_value(cfg, 1, AD_NHT), cfg->NH ? cfg->C / cfg->NH : 0);
    PL_TRY(check_sizes(&c, has_head, Bm, T, err, errlen));
    st->cfg = c;
    st->arch = arch_of(cfg);
    st->l0 = l0;
    st->l1 = l1;
    st->nb = l1 - l0;
    st->has_embed = has_embed;
    st->has_head = has_head;
    st->Bm = Bm;
    st->T = T;
    st->N = Bm * T;
    st->be = be;
    st->tensors = calloc((size_t)model_max_tensors(cfg, st->nb), sizeof(param_tensor));
    st->bp = calloc(st->nb ? st->nb : 1, sizeof(block_ptrs));
    st->bg = calloc(st->nb ? st->nb : 1, sizeof(block_ptrs));
    st->slots = calloc(nslots, sizeof(act_slot));
    if (!st->tensors || !st->bp || !st->bg || !st->slots) {
        snprintf(err, errlen, "out of host memory for the stage tables");
        stage_free(st);
        return PL_ENOMEM;
    }
    st->ntensors = model_layout(cfg, l0, l1, has_embed, has_head, st->tensors, &st->nparams);
    st->nslots = nslots;
    int rc = alloc_buffers(st);
    if (rc != PL_OK) {
        snprintf(err, errlen, "backend %s: %s, for a stage of %d blocks (%zu parameters, %d activation "
                 "slots of %d x %d tokens)", be->name, rc == PL_ENOMEM && !be->error()[0] ? "out of host memory"
                 : stage_error(st), st->nb, st->nparams, nslots, Bm, T);
        stage_free(st);
        return rc;
    }
    bind_pointers(st);
    if ((rc = fill_scratch(st)) != PL_OK) {
        snprintf(err, errlen, "backend %s: %s, uploading the rotary tables", be->name, rc == PL_ENOMEM ?
                 "out of host memory" : stage_error(st));
        stage_free(st);
        return rc;
    }
    return PL_OK;
}

/* The holder's shape from its chunks (checked: fresh, in ascending layer order, embeddings
 * only on the first, the head only on the last). */
static int holder_shape(stage *h, const stage *chunks, int V, char *err, size_t errlen) {
    const stage *c0 = &chunks[0], *cl = &chunks[V - 1];
    for (int c = 0; c < V; c++) {
        h->ntensors += chunks[c].ntensors;
        h->nparams += chunks[c].nparams;
        if (chunks[c].shares_params || (c && chunks[c].l0 < chunks[c - 1].l1) || (c && chunks[c].has_embed) ||
            (c < V - 1 && chunks[c].has_head)) {
            snprintf(err, errlen, "stage_init_holder: chunk %d is not a fresh chunk after chunk %d's layers", c, c - 1);
            return PL_EINVAL;
        }
    }
    h->cfg = c0->cfg;
    h->arch = c0->arch;
    h->l0 = c0->l0;
    h->l1 = cl->l1;
    h->nb = h->l1 - h->l0;
    h->has_embed = c0->has_embed;
    h->has_head = cl->has_head;
    h->Bm = c0->Bm;
    h->T = c0->T;
    h->N = c0->N;
    h->be = c0->be;
    h->holds_chunks = 1;
    return PL_OK;
}

int stage_init_holder(stage *h, stage *chunks, int V, char *err, size_t errlen) {
    memset(h, 0, sizeof *h);
    PL_TRY(holder_shape(h, chunks, V, err, errlen));
    h->tensors = calloc((size_t)h->ntensors, sizeof(param_tensor));
    h->bp = calloc(h->nb ? h->nb : 1, sizeof(block_ptrs));
    h->bg = calloc(h->nb ? h->nb : 1, sizeof(block_ptrs));
    int rc = h->tensors && h->bp && h->bg ? PL_OK : PL_ENOMEM;
    h->params = balloc(h, h->nparams * sizeof(float), &rc);
    h->grads = balloc(h, h->nparams * sizeof(float), &rc);
    if (rc != PL_OK) {
        snprintf(err, errlen, "backend %s: %s, for the parameters of %d chunks (%zu floats)", h->be->name,
                 rc == PL_ENOMEM ? "out of memory" : stage_error(h), V, h->nparams);
        stage_free(h);
        return rc;
    }
    /* chunk c's tensors follow chunk c-1's; the chunk keeps offsets relative to its own base */
    size_t off = 0;
    for (int c = 0, k = 0; c < V; c++) {
        stage *st = &chunks[c];
        for (int i = 0; i < st->ntensors; i++, k++) {
            h->tensors[k] = st->tensors[i];
            h->tensors[k].offset += off;
        }
        st->be->free(st->params);
        st->be->free(st->grads);
        st->params = h->params + off;
        st->grads = h->grads + off;
        st->shares_params = 1;
        bind_pointers(st);
        off += st->nparams;
    }
    h->dwte_head = chunks[V - 1].dwte_head; /* stage_tied_grads_local on the holder folds the head chunk's */
    bind_pointers(h);
    return PL_OK;
}

int stage_init_recompute(stage *st, int mode, char *err, size_t errlen) {
    if (mode == STAGE_RECOMPUTE_NONE || st->recompute == mode) return PL_OK;
    if (st->recompute != STAGE_RECOMPUTE_NONE || st->slots_in_use) {
        snprintf(err, errlen, "recomputation can be chosen once, before the first forward");
        return PL_EINVAL;
    }
    /* every slot re-carved for the mode: what it no longer keeps moves to one shared set */
    for (int i = 0; i < st->nslots; i++) {
        st->be->free(st->slots[i].arena);
        st->slots[i].arena = NULL;
    }
    st->recompute = mode;
    int rc = alloc_shared_acts(st);
    for (int i = 0; i < st->nslots && rc == PL_OK; i++) rc = alloc_slot(st, &st->slots[i]);
    if (rc != PL_OK) {
        snprintf(err, errlen, "backend %s: %s, for the recomputation buffers", st->be->name, stage_error(st));
        return rc;
    }
    return PL_OK;
}

size_t stage_act_bytes_per_slot(const stage *st) {
    return model_slot_act_bytes(&st->cfg, st->Bm, st->T, st->nb, st->has_embed, st->has_head, st->recompute);
}

size_t stage_slot_bytes(const stage *st) { return st->slot_bytes; }

int stage_init_deferred(stage *st, char *err, size_t errlen) {
    for (int i = 0; i < st->nslots; i++) {
        if (st->slots[i].dd != &st->shared_dd) continue;
        stage_douts *dd = calloc(1, sizeof *dd);
        int rc = dd ? alloc_douts(st, dd) : PL_ENOMEM;
        if (rc != PL_OK) {
            snprintf(err, errlen, "backend %s: %s, for the deferred weight gradients of %d slots",
                     st->be->name, stage_error(st), st->nslots);
            if (dd) { free_douts(st, dd); free(dd); }
            return rc;
        }
        st->slots[i].dd = dd;
    }
    st->deferred = 1;
    return PL_OK;
}

void stage_free(stage *st) {
    if (!st->be) return;
    const backend *be = st->be;
    if (st->slots)
        for (int i = 0; i < st->nslots; i++) free_slot(st, &st->slots[i]);
    free(st->slots);
    free_douts(st, &st->shared_dd);
    if (st->shares_params) st->params = st->grads = NULL; /* the holder's (stage_init_holder) */
    if (st->holds_chunks) st->dwte_head = NULL;           /* the head chunk's */
    void *bufs[] = {st->params, st->grads, st->dwte_head, st->logits, st->losses, st->dres, st->shared_arena,
                    st->scr_arena, st->tgt};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) be->free(bufs[k]);
    free(st->host_losses);
    free(st->tp_logits);
    if (st->tp_zero) be->free(st->tp_zero);
    free(st->tensors);
    free(st->bp);
    free(st->bg);
    memset(st, 0, sizeof *st);
}

int stage_init_params(stage *st, unsigned long long seed) {
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        float *host = malloc(t->numel * sizeof(float)), *whole = NULL;
        if (!host) return PL_ENOMEM;
        if (st->cfg.tp > 1) { /* --tp: this rank's slice of the whole tensor's values */
            model_config full = st->cfg;
            full.tp = full.tpr = 0;
            tp_slice sl;
            model_tp_slice(&full, st->cfg.tp, st->cfg.tpr, t, &sl);
            param_tensor wt = *t;
            wt.numel = (size_t)sl.rows * sl.cols;
            whole = malloc(wt.numel * sizeof(float));
            if (!whole) { free(host); return PL_ENOMEM; }
            model_init_tensor(&full, &wt, seed, whole);
            memset(host, 0, t->numel * sizeof(float)); /* padding and sink rows of a vocabulary slice */
            model_tp_copy(&sl, whole, host, 1);
            free(whole);
        } else {
            model_init_tensor(&st->cfg, t, seed, host);
        }
        int rc = st->be->from_host(st->params + t->offset, host, t->numel * sizeof(float));
        free(host);
        PL_TRY(rc);
    }
    return PL_OK;
}

const param_tensor *stage_find_tensor(const stage *st, int kind, int layer) {
    for (int i = 0; i < st->ntensors; i++)
        if (st->tensors[i].kind == kind && st->tensors[i].layer == layer) return &st->tensors[i];
    return NULL;
}

/* The gradients, the tied head's share, and the scratch rows that are sinks. */
int stage_zero_grads(stage *st) {
    const model_arch *A = st->arch;
    st->w_done = 0;
    PL_TRY(st->be->zero(st->grads, st->nparams * sizeof(float)));
    if (st->dwte_head)
        PL_TRY(st->be->zero(st->dwte_head, arch_param_numel(&st->cfg, &A->head.rows[A->head_matrix], 0) * sizeof(float)));
    for (int i = 0; i < A->nscratch; i++)
        if (A->scratch[i].use == SCR_SINK && st->scr.t[i])
            PL_TRY(st->be->zero(st->scr.t[i], scratch_floats(st, &A->scratch[i]) * sizeof(float)));
    if (st->exact) memset(st->acc, 0, st->nparams * sizeof(pl_fx));
    return PL_OK;
}

/* Exact mode: the gradients of block b (b >= 0) or of the tensors outside the blocks (b < 0)
 * into the accumulator, zeroed again (see stage.h). Host memory: grads is readable here. */
static void fold_part(stage *st, int b) {
    if (!st->exact) return;
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        if (b >= 0 ? t->layer == st->l0 + b : t->layer < 0)
            exact_fold(st->acc + t->offset, st->grads + t->offset, t->numel);
    }
}

/* Exact mode: the head matrix's gradient of one micro-batch (in dhead_w: dwte_head when tied)
 * into the sums of the head matrix the stage holds (its own copy, or the embedding's). */
static void fold_head(stage *st) {
    if (!st->exact) return;
    const model_arch *A = st->arch;
    size_t n = arch_param_numel(&st->cfg, &A->head.rows[A->head_matrix], 0);
    exact_fold(st->acc + (st->hg.t[A->head_matrix] - st->grads), st->dhead_w, n);
}

void stage_tied_exact_local(stage *st) {
    if (!st->exact || !st->has_head || !st->dwte_head || !st->has_embed) return;
    const model_arch *A = st->arch;
    size_t n = arch_param_numel(&st->cfg, &A->head.rows[A->head_matrix], 0);
    pl_fx *to = st->acc + (st->hg.t[A->head_matrix] - st->grads);
    for (int i = 0; i < st->ntensors; i++)
        if (st->tensors[i].tied_copy)
            for (size_t j = 0; j < n; j++) to[j] = exact_add(to[j], st->acc[st->tensors[i].offset + j]);
    for (int i = 0; i < st->ntensors; i++)
        if (st->tensors[i].tied_copy) memcpy(st->acc + st->tensors[i].offset, to, n * sizeof(pl_fx));
}

int stage_slot_of(const stage *st, int mb) {
    for (int i = 0; i < st->nslots; i++)
        if (st->slots[i].in_use && st->slots[i].mb == mb) return i;
    return -1;
}

void stage_release_all(stage *st) {
    for (int i = 0; i < st->nslots; i++) st->slots[i].in_use = st->slots[i].input_done = 0;
    st->slots_in_use = 0;
    st->w_pending = 0;
}

/* The output of block b of a slot (the next block's input). */
static float *block_out(const stage *st, const act_slot *s, int b) { return s->blocks[b].t[st->arch->block_out]; }

float *stage_output(stage *st, int slot) {
    act_slot *s = &st->slots[slot];
    return st->nb ? block_out(st, s, st->nb - 1) : s->x_in;
}

float *stage_dinput(stage *st) { return st->dres; }

/* The sizes a block's math works on: with --tp this rank's heads and MLP slice (arch.c). */
static block_dims dims_of(const stage *st) {
    const model_config *c = &st->cfg;
    int HS = c->C / c->NH, NH = (int)arch_dim_value(c, 1, AD_NHT), QKV = (int)arch_dim_value(c, st->T, AD_QKV);
    block_dims d = {st->Bm, st->T, c->C, NH, st->N, (QKV / HS - NH) / 2, HS, (int)arch_dim_value(c, 1, AD_H),
                    QKV, c, st->scr.t, st->exact ? st->acc : NULL, st->grads, NULL, NULL, NULL};
    return d;
}

/* dims_of with a slot's document masking (its document starts and per-row rotary tables). */
static block_dims dims_slot(const stage *st, const act_slot *s) {
    block_dims d = dims_of(st);
    d.doc = s->doc;
    d.pcos = s->pcos;
    d.psin = s->psin;
    return d;
}

/* Document masking (cfg.docs): each row's document start from the micro-batch's tokens (a
 * document token opens a document; the rows before a sequence's first one belong to a
 * document that started before the sequence, at its row 0), and with restart each row's
 * rotary table row at its position in its document. */
static int docs_fill(stage *st, act_slot *s, const int *tok) {
    const model_docs *dc = &st->cfg.docs;
    int N = st->N, T = st->T, half = st->cfg.C / st->cfg.NH / 2;
    if (!tok) {
        pl_error("stage blocks [%d,%d): document masking needs the micro-batch's tokens", st->l0, st->l1);
        return PL_EINVAL;
    }
    int *ds = malloc(sizeof(int) * (size_t)N);
    size_t nt = dc->restart ? (size_t)T * half : 0, nr = dc->restart ? (size_t)N * half : 0;
    float *tab = nt ? malloc(sizeof(float) * 2 * (nt + nr)) : NULL;
    int rc = !ds || (nt && !tab) ? PL_ENOMEM : PL_OK;
    for (int i = 0; rc == PL_OK && i < N; i++) {
        int t = i % T;
        ds[i] = t == 0 || tok[i] == dc->token ? t : ds[i - 1];
    }
    if (rc == PL_OK) rc = st->be->from_host(s->doc, ds, sizeof(int) * (size_t)N);
    if (rc == PL_OK && nt) { /* cos (T, half), sin (T, half), then the rows' cos (N, half), sin (N, half) */
        float *tc = tab, *ts = tab + nt, *rcos = ts + nt, *rsin = rcos + nr;
        llama_rope_tables(&st->cfg, T, tc, ts);
        for (int i = 0; i < N; i++) {
            size_t p = (size_t)(i % T - ds[i]) * half;
            memcpy(rcos + (size_t)i * half, tc + p, sizeof(float) * half);
            memcpy(rsin + (size_t)i * half, ts + p, sizeof(float) * half);
        }
        rc = st->be->from_host(s->pcos, rcos, sizeof(float) * nr);
        if (rc == PL_OK) rc = st->be->from_host(s->psin, rsin, sizeof(float) * nr);
    }
    free(ds);
    free(tab);
    return rc;
}

/* --tp: the vocabulary-parallel head. Each TP rank multiplies by its slice of the head's rows
 * (model_tp_vocab: the rank holds only those) and the softmax cross-entropy runs in
 * parallel on host copies of the local logits: the row maxima's and the exponential sums'
 * reductions over the TP ranks (model_tp_host_reduce), the target's loss from the rank that
 * holds its column; full logits are never gathered. The backward: dL/d(norm output) is a
 * partial sum (summed like the blocks'), and the head matrix's gradient lands in this rank's
 * rows, the rank's own. */
static int head_forward_tp(stage *st, act_slot *s, const int *targets, float dloss, double *loss_sum) {
    const backend *be = st->be;
    const model_arch *A = st->arch;
    const model_config *c = &st->cfg;
    int N = st->N, C = c->C, lo, R;
    model_tp_vocab(c, &lo, &R);
    int Vl = c->V - lo < R ? c->V - lo : R; /* the real (not padded) columns of the slice */
    if (Vl < 0) Vl = 0;
    float *lnf = s->head.t[A->head_out], *dlnf = s->head.t[A->head_dout];
    size_t nl = (size_t)N * R;
    if (!st->tp_logits && !(st->tp_logits = malloc((nl ? nl : 1) * sizeof(float)))) return PL_ENOMEM;
    float *h = st->tp_logits, *red = st->host_losses; /* red: one float per row, reused */
    PL_TRY(be->matmul_fwd(st->logits, lnf, st->head_w, NULL, N, C, R)); // (N, R): the local rows
    PL_TRY(be->to_host(h, st->logits, nl * sizeof(float)));
    for (int i = 0; i < N; i++) {
        const float *r = h + (size_t)i * R;
        float mx = -INFINITY;
        for (int j = 0; j < Vl; j++) mx = r[j] > mx ? r[j] : mx;
        red[i] = mx;
    }
    PL_TRY(model_tp_host_reduce(red, (size_t)N, TP_HOST_MAX));
    float *mx = malloc((size_t)N * sizeof(float));
    if (!mx) return PL_ENOMEM;
    memcpy(mx, red, (size_t)N * sizeof(float));
    for (int i = 0; i < N; i++) {
        float *r = h + (size_t)i * R, sum = 0.0f;
        for (int j = 0; j < Vl; j++) { r[j] = exp_fast(r[j] - mx[i]); sum += r[j]; }
        for (int j = Vl; j < R; j++) r[j] = 0.0f;
        red[i] = sum;
    }
    int rc = model_tp_host_reduce(red, (size_t)N, TP_HOST_SUM);
    for (int i = 0; rc == PL_OK && i < N; i++) {
        float *r = h + (size_t)i * R, inv = 1.0f / red[i];
        for (int j = 0; j < Vl; j++) r[j] *= inv;
        int k = targets[i] - lo;
        mx[i] = k >= 0 && k < Vl ? -logf(r[k]) : 0.0f; /* the target's rank holds its loss */
    }
    if (rc == PL_OK) {
        memcpy(red, mx, (size_t)N * sizeof(float));
        rc = model_tp_host_reduce(red, (size_t)N, TP_HOST_SUM); /* one rank's value and zeros: exact */
    }
    free(mx);
    PL_TRY(rc);
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += red[i];
    *loss_sum = sum;
    PL_TRY(be->from_host(st->losses, red, (size_t)N * sizeof(float)));
    if (dloss <= 0.0f) return PL_OK;
    for (int i = 0; i < N; i++) { /* dlogits = (p - onehot(y)) dloss on this rank's columns */
        float *r = h + (size_t)i * R;
        for (int j = 0; j < Vl; j++) r[j] *= dloss;
        int k = targets[i] - lo;
        if (k >= 0 && k < Vl) r[k] -= dloss;
    }
    PL_TRY(be->from_host(st->logits, h, nl * sizeof(float)));
    PL_TRY(be->matmul_bwd_input(dlnf, st->logits, st->head_w, N, C, R)); // (N, C) partial
    block_dims d = dims_of(st);
    PL_TRY(model_tp_sum(&d, dlnf, (size_t)N * C, TP_PHASE_BWD));
    PL_TRY(be->matmul_bwd_weight(st->dhead_w, NULL, st->logits, lnf, N, C, R));
    fold_head(st);
    return PL_OK;
}

/* The last stage's head: logits = norm(x) head^T, the loss, and (dloss > 0) its backward to
 * dL/d(norm output), with the head matrix's gradient added to dhead_w (dwte_head if tied). */
static int head_forward(stage *st, act_slot *s, const float *x, const int *targets, float dloss, double *loss_sum) {
    const backend *be = st->be;
    const model_arch *A = st->arch;
    const model_config *c = &st->cfg;
    int N = st->N, C = c->C;
    block_dims d = dims_of(st);
    float *lnf = s->head.t[A->head_out], *dlnf = s->head.t[A->head_dout];
    PL_TRY(A->head_norm_forward(be, &d, st->hp.t, s->head.t, x));
    if (c->tp > 1) return head_forward_tp(st, s, targets, dloss, loss_sum);
    PL_TRY(be->matmul_fwd(st->logits, lnf, st->head_w, NULL, N, C, c->Vp));       // (N, Vp)
    PL_TRY(be->from_host(st->tgt, targets, (size_t)N * sizeof(int)));
    PL_TRY(be->crossentropy_fwd(st->losses, st->logits, st->tgt, N, c->V, c->Vp)); // (N)
    PL_TRY(be->to_host(st->host_losses, st->losses, (size_t)N * sizeof(float)));
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += st->host_losses[i];
    *loss_sum = sum;
    if (dloss <= 0.0f) return PL_OK;
    /* the head's backward, now that dL/dlogits is known: keep only dL/d(norm output) */
    PL_TRY(be->crossentropy_bwd(st->logits, st->tgt, dloss, N, c->V, c->Vp));
    PL_TRY(be->matmul_bwd_input(dlnf, st->logits, st->head_w, N, C, c->Vp));        // (N, C)
    PL_TRY(be->matmul_bwd_weight(st->dhead_w, NULL, st->logits, lnf, N, C, c->Vp));
    fold_head(st);
    return PL_OK;
}

/* --tp: the vocabulary-parallel embedding. Tokens outside this rank's slice of the token table
 * are looked up in its sink row (zero); the other embedding rows (GPT-2's positions) are
 * added by TP rank 0 only (the others read zeros); the T partial embeddings are summed. */
static int embed_forward_tp(stage *st, act_slot *s, const int *tok) {
    const backend *be = st->be;
    const model_arch *A = st->arch;
    int N = st->N, C = st->cfg.C, lo, n, sink = (int)arch_dim_value(&st->cfg, 0, AD_VP) - 1;
    model_tp_vocab(&st->cfg, &lo, &n);
    int *loc = malloc((size_t)N * sizeof(int));
    if (!loc) return PL_ENOMEM;
    for (int i = 0; i < N; i++) loc[i] = tok[i] >= lo && tok[i] < lo + n ? tok[i] - lo : sink;
    int rc = be->from_host(s->tok, loc, (size_t)N * sizeof(int));
    free(loc);
    PL_TRY(rc);
    block_ptrs ep = st->ep;
    size_t bytes = 0; /* the largest replicated row: one zero buffer serves them all */
    for (int i = 0; i < A->embed.n; i++)
        if (A->embed.rows[i].rows != AD_VP && arch_param_numel(&st->cfg, &A->embed.rows[i], 0) * sizeof(float) > bytes)
            bytes = arch_param_numel(&st->cfg, &A->embed.rows[i], 0) * sizeof(float);
    if (st->cfg.tpr && bytes && !st->tp_zero) {
        void *z = NULL;
        PL_TRY(be->alloc(&z, bytes));
        st->tp_zero = z;
        PL_TRY(be->zero(st->tp_zero, bytes));
    }
    for (int i = 0; i < A->embed.n && st->cfg.tpr; i++) /* replicated rows: added once, by TP rank 0 */
        if (A->embed.rows[i].rows != AD_VP) ep.t[i] = st->tp_zero;
    block_dims d = dims_of(st);
    PL_TRY(A->embed_forward(be, &d, ep.t, s->x_in, s->tok));
    return model_tp_sum(&d, s->x_in, (size_t)N * C, TP_PHASE_FWD);
}

int stage_forward(stage *st, int mb, const int *tok, const float *x_in, const int *targets,
                  float dloss, double *loss_sum, int *slot_out) {
    const backend *be = st->be;
    const model_arch *A = st->arch;
    int N = st->N, C = st->cfg.C, slot = -1;
    for (int i = 0; i < st->nslots; i++)
        if (!st->slots[i].in_use) { slot = i; break; }
    if (slot < 0) {
        pl_error("stage blocks [%d,%d): no free activation slot for micro-batch %d (%d in use)",
                 st->l0, st->l1, mb, st->slots_in_use);
        return PL_EINVAL;
    }
    act_slot *s = &st->slots[slot];
    s->in_use = 1;
    s->input_done = 0;
    s->mb = mb;
    if (++st->slots_in_use > st->slots_peak) st->slots_peak = st->slots_in_use;
    if (st->cfg.docs.mask) PL_TRY(docs_fill(st, s, tok));
    block_dims d = dims_slot(st, s);
    if (st->has_embed && st->cfg.tp > 1) {
        PL_TRY(embed_forward_tp(st, s, tok));
    } else if (st->has_embed) {
        PL_TRY(be->from_host(s->tok, tok, (size_t)N * sizeof(int)));
        PL_TRY(A->embed_forward(be, &d, st->ep.t, s->x_in, s->tok));                 // (N, C)
    } else {
        PL_TRY(be->copy(s->x_in, x_in, (size_t)N * C * sizeof(float)));
    }
    const float *x = s->x_in;
    for (int b = 0; b < st->nb; b++) {
        PL_TRY(A->block_forward(be, &d, st->bp[b].t, s->blocks[b].t, x));
        x = block_out(st, s, b);
    }
    if (st->has_head) PL_TRY(head_forward(st, s, x, targets, dloss, loss_sum));
    *slot_out = slot;
    return PL_OK;
}

/* The slot of a backward part, checked: in use, and in the expected phase. */
static act_slot *backward_slot(stage *st, int slot, int want_input_done, const char *what) {
    act_slot *s = slot >= 0 && slot < st->nslots ? &st->slots[slot] : NULL;
    if (!s || !s->in_use || s->input_done != want_input_done) {
        pl_error("stage blocks [%d,%d): %s of slot %d, which %s", st->l0, st->l1, what, slot,
                 !s || !s->in_use ? "holds no micro-batch" : want_input_done ? "has not run its input part"
                 : "already ran its input part");
        return NULL;
    }
    return s;
}

/* The input of block b of a slot (block b-1's output, or the stage input). */
static const float *block_in(const stage *st, const act_slot *s, int b) {
    return b ? block_out(st, s, b - 1) : s->x_in;
}

/* dres = dL/d(stage output): from the next stage, or through the final norm on the last. */
static int backward_start(stage *st, act_slot *s, const float *dout) {
    const backend *be = st->be;
    size_t nc = (size_t)st->N * st->cfg.C;
    if (!st->has_head) return be->copy(st->dres, dout, nc * sizeof(float));
    block_dims d = dims_of(st);
    PL_TRY(be->zero(st->dres, nc * sizeof(float)));
    return st->arch->head_norm_backward_input(be, &d, st->hp.t, s->head.t, block_in(st, s, st->nb), st->dres);
}

/* The weight ops outside the blocks: the final norm's (last stage). */
static int head_weight(stage *st, act_slot *s) {
    block_dims d = dims_of(st);
    return st->arch->head_norm_backward_weight(st->be, &d, st->hg.t, s->head.t, block_in(st, s, st->nb));
}

/* The embeddings' gradient (first stage) from dL/d(x_in). */
static int embed_weight(stage *st, act_slot *s, const float *dx) {
    block_dims d = dims_of(st);
    PL_TRY(st->arch->embed_backward(st->be, &d, st->eg.t, dx, s->tok));
    if (st->cfg.tp <= 1) return PL_OK;
    /* --tp: the tokens of other ranks' slices left their gradient in the sink row: zero it */
    const model_arch *A = st->arch;
    size_t rows = arch_dim_value(&st->cfg, 0, AD_VP), C = (size_t)st->cfg.C;
    for (int i = 0; i < A->embed.n; i++)
        if (A->embed.rows[i].rows == AD_VP)
            PL_TRY(st->be->zero(st->eg.t[i] + (rows - 1) * C, C * sizeof(float)));
    return PL_OK;
}

/* The data-parallel hook: is this weight part the step's last, and then tell it that block b's
 * gradient (b = -1: the rest) is final. */
static int grad_final(stage *st, int b) {
    if (!st->on_grad_final || st->w_done + 1 != st->w_final) return PL_OK;
    return st->on_grad_final(st->grad_ctx, st, b < 0 ? -1 : st->l0 + b);
}

static int release(stage *st, act_slot *s) {
    st->w_done++;
    s->in_use = s->input_done = 0;
    st->slots_in_use--;
    return PL_OK;
}

/* What the mode dropped from block b of slot s, back before its backward needs it. */
static int recompute_block(stage *st, act_slot *s, int b, const float *x) {
    block_dims d = dims_slot(st, s);
    float *const *a = s->blocks[b].t;
    if (st->recompute == STAGE_RECOMPUTE_FULL) return st->arch->block_forward(st->be, &d, st->bp[b].t, a, x);
    if (st->recompute == STAGE_RECOMPUTE_SELECTIVE) return st->arch->block_recompute_selective(st->be, &d, a);
    return PL_OK;
}

int stage_backward_input(stage *st, int slot, const float *dout) {
    act_slot *s = backward_slot(st, slot, 0, "input part of the backward");
    if (!s) return PL_EINVAL;
    if (!st->deferred && st->w_pending) {
        pl_error("stage blocks [%d,%d): input part of micro-batch %d while a weight part is pending, "
                 "without deferred weight buffers (stage_init_deferred)", st->l0, st->l1, s->mb);
        return PL_EINVAL;
    }
    const backend *be = st->be;
    block_dims d = dims_slot(st, s);
    PL_TRY(backward_start(st, s, dout));
    for (int b = st->nb - 1; b >= 0; b--) {
        const float *x = block_in(st, s, b);
        PL_TRY(recompute_block(st, s, b, x));
        PL_TRY(st->arch->block_backward_input(be, &d, st->bp[b].t, s->blocks[b].t, x, st->dres, s->dd->blocks[b].t));
    }
    if (st->has_embed) PL_TRY(be->copy(s->dd->embed, st->dres, (size_t)st->N * st->cfg.C * sizeof(float)));
    s->input_done = 1;
    st->w_pending++;
    return PL_OK;
}

int stage_backward_weight(stage *st, int slot) {
    act_slot *s = backward_slot(st, slot, 1, "weight part of the backward");
    if (!s) return PL_EINVAL;
    block_dims d = dims_of(st);
    if (st->has_head) PL_TRY(head_weight(st, s));
    for (int b = st->nb - 1; b >= 0; b--) {
        const float *x = block_in(st, s, b);
        if (st->recompute == STAGE_RECOMPUTE_FULL) PL_TRY(recompute_block(st, s, b, x)); /* others kept what W reads */
        PL_TRY(st->arch->block_backward_weight(st->be, &d, st->bg[b].t, s->blocks[b].t, x, s->dd->blocks[b].t));
        fold_part(st, b);
        PL_TRY(grad_final(st, b));
    }
    if (st->has_embed) PL_TRY(embed_weight(st, s, s->dd->embed));
    fold_part(st, -1);
    PL_TRY(grad_final(st, -1));
    st->w_pending--;
    return release(st, s);
}

/* Block by block: each block's weight part right after its input part (the shared output
 * gradients are reused by the next block). */
int stage_backward(stage *st, int slot, const float *dout) {
    act_slot *s = backward_slot(st, slot, 0, "backward");
    if (!s) return PL_EINVAL;
    const backend *be = st->be;
    block_dims d = dims_slot(st, s);
    PL_TRY(backward_start(st, s, dout));
    if (st->has_head) PL_TRY(head_weight(st, s));
    for (int b = st->nb - 1; b >= 0; b--) {
        const float *x = block_in(st, s, b);
        float *const *dd = st->shared_dd.blocks[b].t;
        PL_TRY(recompute_block(st, s, b, x));
        PL_TRY(st->arch->block_backward_input(be, &d, st->bp[b].t, s->blocks[b].t, x, st->dres, dd));
        PL_TRY(st->arch->block_backward_weight(be, &d, st->bg[b].t, s->blocks[b].t, x, dd));
        fold_part(st, b);
        PL_TRY(grad_final(st, b));
    }
    if (st->has_embed) PL_TRY(embed_weight(st, s, st->dres));
    fold_part(st, -1);
    PL_TRY(grad_final(st, -1));
    return release(st, s);
}

/* A tied head's gradient share into its embedding's: added on a stage that holds both ends
 * (and copied to the head chunk's own copy on a holder of two chunks), copied on a last stage
 * only (the two ranks then sum). An untied head: nothing to fold. */
int stage_tied_grads_local(stage *st) {
    if (!st->has_head || !st->dwte_head) return PL_OK;
    const model_arch *A = st->arch;
    size_t n = arch_param_numel(&st->cfg, &A->head.rows[A->head_matrix], 0);
    float *to = st->hg.t[A->head_matrix];
    if (!st->has_embed) return st->be->copy(to, st->dwte_head, n * sizeof(float));
    PL_TRY(st->be->add_inplace(to, st->dwte_head, n));
    /* both ends as two chunks of one holder (the V placement's rank 0): the head chunk's own
       copy of the embedding takes the same gradient, so the two copies stay identical */
    for (int i = 0; i < st->ntensors; i++)
        if (st->tensors[i].tied_copy) PL_TRY(st->be->copy(st->grads + st->tensors[i].offset, to, n * sizeof(float)));
    return PL_OK;
}
