/*
 * stage.c — the layers one pipeline rank owns: parameters laid out by the model's tensor
 * table, activation slots per micro-batch, and the forward, the backward's input part and
 * its weight part as calls into the model's block math.
 *   x = wte[tok] + wpe[pos]                      (first stage)
 *   x = block_l(x) for l in [l0, l1)
 *   logits = lnf(x) wte^T; loss = mean CE        (last stage; head backward inside F)
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pipelm/common.h"
#include "pipelm/stage.h"

#define STAGE_MAX_TENSOR 2147483647LL /* floats in one buffer (MPI counts are int) */

/* The backend's last message, for errors the stage passes up. */
const char *stage_error(const stage *st) {
    const char *m = st->be && st->be->error ? st->be->error() : "";
    return m && m[0] ? m : "no message from the backend";
}

/* Point bp/bg (and the embedding/head pointers) into params/grads. */
static void bind_pointers(stage *st) {
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        float *p = st->params + t->offset, *g = st->grads + t->offset;
        if (t->layer < 0) {
            switch (t->kind) {
            case P_WTE: st->wte = p; st->dwte = g; break;
            case P_WPE: st->wpe = p; st->dwpe = g; break;
            case P_LNFW: st->lnfw = p; st->dlnfw = g; break;
            case P_LNFB: st->lnfb = p; st->dlnfb = g; break;
            case P_LMHEAD: st->lmhead = p; st->dlmhead = g; break;
            }
            continue;
        }
        block_params *bp = &st->bp[t->layer - st->l0], *bg = &st->bg[t->layer - st->l0];
        float **pp = NULL, **gg = NULL;
        switch (t->kind) {
        case P_LN1W: pp = &bp->ln1w; gg = &bg->ln1w; break;
        case P_LN1B: pp = &bp->ln1b; gg = &bg->ln1b; break;
        case P_QKVW: pp = &bp->qkvw; gg = &bg->qkvw; break;
        case P_QKVB: pp = &bp->qkvb; gg = &bg->qkvb; break;
        case P_ATTPROJW: pp = &bp->attprojw; gg = &bg->attprojw; break;
        case P_ATTPROJB: pp = &bp->attprojb; gg = &bg->attprojb; break;
        case P_LN2W: pp = &bp->ln2w; gg = &bg->ln2w; break;
        case P_LN2B: pp = &bp->ln2b; gg = &bg->ln2b; break;
        case P_FCW: pp = &bp->fcw; gg = &bg->fcw; break;
        case P_FCB: pp = &bp->fcb; gg = &bg->fcb; break;
        case P_FCPROJW: pp = &bp->fcprojw; gg = &bg->fcprojw; break;
        case P_FCPROJB: pp = &bp->fcprojb; gg = &bg->fcprojb; break;
        case P_ATTNORMW: pp = &bp->ln1w; gg = &bg->ln1w; break;
        case P_MLPNORMW: pp = &bp->ln2w; gg = &bg->ln2w; break;
        case P_FC2W: pp = &bp->fc2w; gg = &bg->fc2w; break;
        }
        *pp = p;
        *gg = g;
    }
}

/* Allocate through the backend; the first failure's status is kept in *rc. */
static void *balloc(stage *st, size_t bytes, int *rc) {
    void *p = NULL;
    if (*rc) return NULL;
    *rc = st->be->alloc(&p, bytes);
    return *rc ? NULL : p;
}

/* Widths of a block's fused qkv and MLP hidden layer: 3C and 4C for GPT-2. */
static size_t qkv_width(const model_config *c) {
    return c->arch == MODEL_LLAMA ? (size_t)(c->NH + 2 * c->NKV) * (c->C / c->NH) : 3 * (size_t)c->C;
}
static size_t hidden_width(const model_config *c) { return c->arch == MODEL_LLAMA ? (size_t)c->H : 4 * (size_t)c->C; }

/* One block's activations (res3 too unless skip_res3); GPT-2 per token 16 C + 4 floats,
 * Llama 5 C + QKV + 3 H + 2; plus the B NH T T probabilities. */
static void alloc_acts(stage *st, block_acts *a, int skip_res3, int *rc) {
    size_t N = st->N, C = st->cfg.C, F = sizeof(float), Q = qkv_width(&st->cfg), H = hidden_width(&st->cfg);
    int llama = st->cfg.arch == MODEL_LLAMA;
    a->ln1 = balloc(st, N * C * F, rc);
    a->ln1_mean = llama ? NULL : balloc(st, N * F, rc);
    a->ln1_rstd = balloc(st, N * F, rc);
    a->qkv = balloc(st, N * Q * F, rc);
    a->att = balloc(st, (size_t)st->Bm * st->cfg.NH * st->T * st->T * F, rc);
    a->atty = balloc(st, N * C * F, rc);
    a->res2 = balloc(st, N * C * F, rc);
    a->ln2 = balloc(st, N * C * F, rc);
    a->ln2_mean = llama ? NULL : balloc(st, N * F, rc);
    a->ln2_rstd = balloc(st, N * F, rc);
    a->fch = balloc(st, N * H * F, rc);
    a->fch2 = llama ? balloc(st, N * H * F, rc) : NULL;
    a->fch_gelu = balloc(st, N * H * F, rc);
    a->res3 = skip_res3 ? NULL : balloc(st, N * C * F, rc);
}

/* Activations of one slot: its input, and per block alloc_acts'. */
static void alloc_slot(stage *st, act_slot *s, int *rc) {
    size_t N = st->N, C = st->cfg.C, F = sizeof(float);
    s->x_in = balloc(st, N * C * F, rc);
    s->tok = st->has_embed ? balloc(st, N * sizeof(int), rc) : NULL;
    s->blocks = calloc(st->nb ? st->nb : 1, sizeof(block_acts));
    if (!s->blocks) { if (!*rc) *rc = PL_ENOMEM; return; }
    for (int b = 0; b < st->nb; b++) alloc_acts(st, &s->blocks[b], 0, rc);
    if (st->has_head) {
        s->lnf = balloc(st, N * C * F, rc);
        s->lnf_mean = balloc(st, N * F, rc);
        s->lnf_rstd = balloc(st, N * F, rc);
        s->dlnf = balloc(st, N * C * F, rc);
    }
}

/* One set of output gradients: per block 11 C floats per token (Llama 4 C + QKV + 2 H), plus
 * the embedding's. */
static int alloc_douts(stage *st, stage_douts *dd) {
    size_t N = st->N, C = st->cfg.C, F = sizeof(float), Q = qkv_width(&st->cfg), H = hidden_width(&st->cfg);
    int rc = PL_OK;
    dd->blocks = calloc(st->nb ? st->nb : 1, sizeof(block_douts));
    if (!dd->blocks) return PL_ENOMEM;
    for (int b = 0; b < st->nb; b++) {
        block_douts *d = &dd->blocks[b];
        d->fcproj = balloc(st, N * C * F, &rc);
        d->fc = balloc(st, N * H * F, &rc);
        d->fc2 = st->cfg.arch == MODEL_LLAMA ? balloc(st, N * H * F, &rc) : NULL;
        d->ln2 = balloc(st, N * C * F, &rc);
        d->attproj = balloc(st, N * C * F, &rc);
        d->qkv = balloc(st, N * Q * F, &rc);
        d->ln1 = balloc(st, N * C * F, &rc);
    }
    dd->embed = st->has_embed ? balloc(st, N * C * F, &rc) : NULL;
    return rc;
}

static void free_douts(stage *st, stage_douts *dd) {
    if (dd->blocks)
        for (int b = 0; b < st->nb; b++) {
            block_douts *d = &dd->blocks[b];
            float *all[] = {d->fcproj, d->fc, d->ln2, d->attproj, d->qkv, d->ln1, d->fc2};
            for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) st->be->free(all[k]);
        }
    free(dd->blocks);
    st->be->free(dd->embed);
    memset(dd, 0, sizeof *dd);
}

/* Free a block's activations, except those shared by every slot under recomputation. */
static void free_block_acts(stage *st, block_acts *a) {
    float *all[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->att, a->atty, a->res2,
                    a->ln2, a->ln2_mean, a->ln2_rstd, a->fch, a->fch_gelu, a->res3, a->fch2};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        float *p = all[k];
        if (p == st->att_shared) continue;
        if (st->recompute == STAGE_RECOMPUTE_FULL && p != a->res3) continue; /* the shared set */
        st->be->free(p);
    }
}

static void free_slot(stage *st, act_slot *s) {
    const backend *be = st->be;
    be->free(s->x_in);
    be->free(s->tok);
    if (s->blocks) {
        for (int b = 0; b < st->nb; b++) free_block_acts(st, &s->blocks[b]);
        free(s->blocks);
    }
    be->free(s->lnf);
    be->free(s->lnf_mean);
    be->free(s->lnf_rstd);
    be->free(s->dlnf);
    if (s->dd && s->dd != &st->shared_dd) {
        free_douts(st, s->dd);
        free(s->dd);
    }
}

/* Refuse a micro-batch whose buffers would not fit (each fewer than 2^31 elements). */
static int check_sizes(const model_config *cfg, int has_head, int Bm, int T, char *err, size_t errlen) {
    long long N = (long long)Bm * T, W = (long long)(hidden_width(cfg) > qkv_width(cfg) ? hidden_width(cfg)
                                                                                       : qkv_width(cfg));
    const char *what = NULL;
    if (N > STAGE_MAX_TENSOR / (W > 0 ? W : 1)) what = "the (tokens, MLP hidden) activations";
    else if (has_head && N > STAGE_MAX_TENSOR / cfg->Vp) what = "the (tokens, padded vocab) logits";
    else if ((long long)Bm * cfg->NH > STAGE_MAX_TENSOR / ((long long)T * T)) what = "the (micro-batch, heads, T, T) attention";
    if (!what) return PL_OK;
    snprintf(err, errlen, "micro-batch too large: %s of %d x %d = %lld tokens would exceed %lld floats "
             "(lower --batch/--microbatches ratio or --seq-len)", what, Bm, T, N, STAGE_MAX_TENSOR);
    return PL_EINVAL;
}

/* Parameters, gradients and the shared scratch; then the slots. */
static int alloc_buffers(stage *st) {
    size_t N = st->N, C = st->cfg.C, F = sizeof(float), pb = st->nparams * F;
    int rc = PL_OK;
    st->params = balloc(st, pb, &rc);
    st->grads = balloc(st, pb, &rc);
    if (st->cfg.arch == MODEL_LLAMA) { /* the rotary tables are filled by stage_init */
        size_t half = (size_t)(C / st->cfg.NH) / 2, w = qkv_width(&st->cfg) > hidden_width(&st->cfg)
                                                         ? qkv_width(&st->cfg) : hidden_width(&st->cfg);
        st->rope_cos = balloc(st, (size_t)st->T * half * F, &rc);
        st->rope_sin = balloc(st, (size_t)st->T * half * F, &rc);
        st->blk_scratch = balloc(st, N * w * F, &rc);
        if (st->has_embed) {
            st->zero_pos = balloc(st, (size_t)st->T * C * F, &rc);
            st->dzero_pos = balloc(st, (size_t)st->T * C * F, &rc);
        }
    }
    if (st->has_head) {
        if (st->cfg.arch != MODEL_LLAMA) st->dwte_head = balloc(st, (size_t)st->cfg.Vp * C * F, &rc);
        st->logits = balloc(st, N * st->cfg.Vp * F, &rc);
        st->losses = balloc(st, N * F, &rc);
        st->tgt = balloc(st, N * sizeof(int), &rc);
        st->host_losses = rc ? NULL : malloc(N * F);
        if (!rc && !st->host_losses) rc = PL_ENOMEM;
    }
    st->dres = balloc(st, N * C * F, &rc);
    if (!rc) rc = alloc_douts(st, &st->shared_dd);
    for (int i = 0; i < st->nslots && !rc; i++) {
        alloc_slot(st, &st->slots[i], &rc);
        st->slots[i].dd = &st->shared_dd;
    }
    return rc;
}

/* Llama: the cos/sin tables of positions 0..T-1, computed on the host in double, uploaded once. */
static int upload_rope(stage *st) {
    size_t n = (size_t)st->T * (size_t)(st->cfg.C / st->cfg.NH / 2);
    float *c = malloc(n * sizeof(float)), *s = malloc(n * sizeof(float));
    int rc = c && s ? PL_OK : PL_ENOMEM;
    if (rc == PL_OK) {
        llama_rope_tables(&st->cfg, st->T, c, s);
        rc = st->be->from_host(st->rope_cos, c, n * sizeof(float));
        if (rc == PL_OK) rc = st->be->from_host(st->rope_sin, s, n * sizeof(float));
    }
    free(c);
    free(s);
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
    PL_TRY(check_sizes(cfg, has_head, Bm, T, err, errlen));
    st->cfg = *cfg;
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
    st->bp = calloc(st->nb ? st->nb : 1, sizeof(block_params));
    st->bg = calloc(st->nb ? st->nb : 1, sizeof(block_params));
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
    if (cfg->arch == MODEL_LLAMA && (rc = upload_rope(st)) != PL_OK) {
        snprintf(err, errlen, "backend %s: %s, uploading the rotary tables", be->name, rc == PL_ENOMEM ?
                 "out of host memory" : stage_error(st));
        stage_free(st);
        return rc;
    }
    return PL_OK;
}

int stage_init_holder(stage *h, stage *chunks, int V, char *err, size_t errlen) {
    memset(h, 0, sizeof *h);
    const stage *c0 = &chunks[0], *cl = &chunks[V - 1];
    int ntensors = 0;
    size_t nparams = 0;
    for (int c = 0; c < V; c++) {
        ntensors += chunks[c].ntensors;
        nparams += chunks[c].nparams;
        if (chunks[c].shares_params || (c && chunks[c].l0 < chunks[c - 1].l1) || (c && chunks[c].has_embed) ||
            (c < V - 1 && chunks[c].has_head)) {
            snprintf(err, errlen, "stage_init_holder: chunk %d is not a fresh chunk after chunk %d's layers", c, c - 1);
            return PL_EINVAL;
        }
    }
    h->cfg = c0->cfg;
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
    h->nparams = nparams;
    h->ntensors = ntensors;
    h->tensors = calloc((size_t)ntensors, sizeof(param_tensor));
    h->bp = calloc(h->nb ? h->nb : 1, sizeof(block_params));
    h->bg = calloc(h->nb ? h->nb : 1, sizeof(block_params));
    int rc = h->tensors && h->bp && h->bg ? PL_OK : PL_ENOMEM;
    h->params = balloc(h, nparams * sizeof(float), &rc);
    h->grads = balloc(h, nparams * sizeof(float), &rc);
    if (rc != PL_OK) {
        snprintf(err, errlen, "backend %s: %s, for the parameters of %d chunks (%zu floats)", h->be->name,
                 rc == PL_ENOMEM ? "out of memory" : stage_error(h), V, nparams);
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
    bind_pointers(h);
    h->dwte_head = cl->dwte_head; /* stage_tied_grads_local on the holder folds the head chunk's */
    return PL_OK;
}

/* One block's activations into a (the shared set of full recomputation). */
static int alloc_block_acts(stage *st, block_acts *a) {
    int rc = PL_OK;
    alloc_acts(st, a, 1, &rc); /* res3: every slot keeps its own block outputs */
    return rc;
}

int stage_init_recompute(stage *st, int mode, char *err, size_t errlen) {
    if (mode == STAGE_RECOMPUTE_NONE || st->recompute == mode) return PL_OK;
    if (st->recompute != STAGE_RECOMPUTE_NONE || st->slots_in_use) {
        snprintf(err, errlen, "recomputation can be chosen once, before the first forward");
        return PL_EINVAL;
    }
    size_t N = st->N, C = st->cfg.C, F = sizeof(float);
    int rc = PL_OK;
    if (mode == STAGE_RECOMPUTE_SELECTIVE) {
        st->att_shared = balloc(st, (size_t)st->Bm * st->cfg.NH * st->T * st->T * F, &rc);
        st->atty_scratch = balloc(st, N * C * F, &rc);
    } else {
        rc = alloc_block_acts(st, &st->shared_acts);
    }
    if (rc != PL_OK) {
        snprintf(err, errlen, "backend %s: %s, for the recomputation buffers", st->be->name, stage_error(st));
        return rc;
    }
    for (int i = 0; i < st->nslots; i++)
        for (int b = 0; b < st->nb; b++) {
            block_acts *a = &st->slots[i].blocks[b];
            st->recompute = STAGE_RECOMPUTE_NONE; /* this block's own buffers, all of them */
            free_block_acts(st, a);
            st->recompute = mode; /* from here on (a failure included) it holds the mode's */
            float *res3 = NULL;
            if (mode == STAGE_RECOMPUTE_SELECTIVE) {
                /* keep everything but the probabilities: re-allocate the rest */
                rc = alloc_block_acts(st, a);
                st->be->free(a->att);
                a->att = st->att_shared;
            } else {
                *a = st->shared_acts;
            }
            res3 = balloc(st, N * C * F, &rc);
            a->res3 = res3;
            if (rc != PL_OK) {
                snprintf(err, errlen, "backend %s: %s, for the recomputation buffers", st->be->name, stage_error(st));
                return rc;
            }
        }
    st->recompute = mode;
    return PL_OK;
}

size_t stage_act_bytes_per_slot(const stage *st) {
    size_t N = st->N, C = st->cfg.C, att = (size_t)st->Bm * st->cfg.NH * st->T * st->T;
    size_t per_block = st->recompute == STAGE_RECOMPUTE_FULL ? N * C
                     : N * model_block_act_floats_per_token(&st->cfg) +
                       (st->recompute == STAGE_RECOMPUTE_SELECTIVE ? 0 : att);
    size_t head = st->cfg.arch == MODEL_LLAMA ? N * (2 * C + 1) : N * (2 * C + 2);
    size_t n = N * C + (size_t)st->nb * per_block + (st->has_head ? head : 0);
    return n * sizeof(float);
}

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
    if (st->recompute == STAGE_RECOMPUTE_FULL) {
        block_acts keep = st->shared_acts;
        st->recompute = STAGE_RECOMPUTE_NONE; /* free the shared set itself */
        keep.att = keep.att == st->att_shared ? NULL : keep.att;
        free_block_acts(st, &keep);
    }
    if (st->shares_params) st->params = st->grads = NULL; /* the holder's (stage_init_holder) */
    if (st->holds_chunks) st->dwte_head = NULL;           /* the head chunk's */
    float *bufs[] = {st->params, st->grads, st->dwte_head, st->logits, st->losses, st->dres, st->att_shared,
                     st->atty_scratch, st->rope_cos, st->rope_sin, st->blk_scratch, st->zero_pos, st->dzero_pos};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) be->free(bufs[k]);
    be->free(st->tgt);
    free(st->host_losses);
    free(st->tensors);
    free(st->bp);
    free(st->bg);
    memset(st, 0, sizeof *st);
}

int stage_init_params(stage *st, unsigned long long seed) {
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        float *host = malloc(t->numel * sizeof(float));
        if (!host) return PL_ENOMEM;
        model_init_tensor(&st->cfg, t, seed, host);
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

int stage_zero_grads(stage *st) {
    st->w_done = 0;
    PL_TRY(st->be->zero(st->grads, st->nparams * sizeof(float)));
    if (st->dwte_head) PL_TRY(st->be->zero(st->dwte_head, (size_t)st->cfg.Vp * st->cfg.C * sizeof(float)));
    if (st->dzero_pos) PL_TRY(st->be->zero(st->dzero_pos, (size_t)st->T * st->cfg.C * sizeof(float)));
    return PL_OK;
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

float *stage_output(stage *st, int slot) {
    act_slot *s = &st->slots[slot];
    return st->nb ? s->blocks[st->nb - 1].res3 : s->x_in;
}

float *stage_dinput(stage *st) { return st->dres; }

static block_dims dims_of(const stage *st) {
    const model_config *c = &st->cfg;
    block_dims d = {st->Bm, st->T, c->C, c->NH, st->N, c->NKV, c->C / c->NH, (int)hidden_width(c),
                    (int)qkv_width(c), c->norm_eps, st->rope_cos, st->rope_sin, st->blk_scratch};
    return d;
}

/* One block's math in the stage's architecture. */
static int block_forward(const stage *st, const block_dims *d, const block_params *p, block_acts *a,
                         const float *x) {
    if (st->cfg.arch == MODEL_LLAMA) return llama_block_forward(st->be, d, p, a, x);
    return gpt2_block_forward(st->be, d, p, a, x);
}
static int block_backward_input(const stage *st, const block_dims *d, const block_params *p,
                                const block_acts *a, const float *x, float *dres, const block_douts *dd) {
    if (st->cfg.arch == MODEL_LLAMA) return llama_block_backward_input(st->be, d, p, a, x, dres, dd);
    return gpt2_block_backward_input(st->be, d, p, a, x, dres, dd);
}
static int block_backward_weight(const stage *st, const block_dims *d, block_params *g, const block_acts *a,
                                 const float *x, const block_douts *dd) {
    if (st->cfg.arch == MODEL_LLAMA) return llama_block_backward_weight(st->be, d, g, a, x, dd);
    return gpt2_block_backward_weight(st->be, d, g, a, x, dd);
}

/* The last stage's head: logits = lnf(x) wte^T, the loss, and (dloss > 0) its backward to
 * dL/d(lnf), with the head's wte gradient added to dwte_head. */
static int head_forward(stage *st, act_slot *s, const float *x, const int *targets, float dloss, double *loss_sum) {
    const backend *be = st->be;
    const model_config *c = &st->cfg;
    int N = st->N, C = c->C, llama = c->arch == MODEL_LLAMA;
    const float *head = llama ? st->lmhead : st->wte; /* Llama's head is its own tensor */
    if (llama) PL_TRY(be->rmsnorm_fwd(s->lnf, s->lnf_rstd, x, st->lnfw, N, C, c->norm_eps));
    else PL_TRY(be->layernorm_fwd(s->lnf, s->lnf_mean, s->lnf_rstd, x, st->lnfw, st->lnfb, N, C));
    PL_TRY(be->matmul_fwd(st->logits, s->lnf, head, NULL, N, C, c->Vp));           // (N, Vp)
    PL_TRY(be->from_host(st->tgt, targets, (size_t)N * sizeof(int)));
    PL_TRY(be->crossentropy_fwd(st->losses, st->logits, st->tgt, N, c->V, c->Vp)); // (N)
    PL_TRY(be->to_host(st->host_losses, st->losses, (size_t)N * sizeof(float)));
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += st->host_losses[i];
    *loss_sum = sum;
    if (dloss <= 0.0f) return PL_OK;
    /* the head's backward, now that dL/dlogits is known: keep only dL/d(lnf) */
    PL_TRY(be->crossentropy_bwd(st->logits, st->tgt, dloss, N, c->V, c->Vp));
    PL_TRY(be->matmul_bwd_input(s->dlnf, st->logits, head, N, C, c->Vp));          // (N, C)
    return be->matmul_bwd_weight(llama ? st->dlmhead : st->dwte_head, NULL, st->logits, s->lnf, N, C, c->Vp);
}

int stage_forward(stage *st, int mb, const int *tok, const float *x_in, const int *targets,
                  float dloss, double *loss_sum, int *slot_out) {
    const backend *be = st->be;
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
    if (st->has_embed) {
        PL_TRY(be->from_host(s->tok, tok, (size_t)N * sizeof(int)));
        const float *pos = st->cfg.arch == MODEL_LLAMA ? st->zero_pos : st->wpe; /* Llama: x = wte[tok] */
        PL_TRY(be->encoder_fwd(s->x_in, s->tok, st->wte, pos, N, st->T, C));       // (N, C)
    } else {
        PL_TRY(be->copy(s->x_in, x_in, (size_t)N * C * sizeof(float)));
    }
    block_dims d = dims_of(st);
    const float *x = s->x_in;
    for (int b = 0; b < st->nb; b++) {
        PL_TRY(block_forward(st, &d, &st->bp[b], &s->blocks[b], x));
        x = s->blocks[b].res3;
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

/* dres = dL/d(stage output): from the next stage, or through lnf on the last. */
static int backward_start(stage *st, act_slot *s, const float *dout) {
    const backend *be = st->be;
    size_t nc = (size_t)st->N * st->cfg.C;
    if (!st->has_head) return be->copy(st->dres, dout, nc * sizeof(float));
    const float *x_last = st->nb ? s->blocks[st->nb - 1].res3 : s->x_in;
    PL_TRY(be->zero(st->dres, nc * sizeof(float)));
    if (st->cfg.arch == MODEL_LLAMA)
        return be->rmsnorm_bwd_input(st->dres, s->dlnf, x_last, st->lnfw, s->lnf_rstd, st->N, st->cfg.C);
    return be->layernorm_bwd_input(st->dres, s->dlnf, x_last, st->lnfw, s->lnf_mean, s->lnf_rstd, st->N, st->cfg.C);
}

/* The weight ops outside the blocks: the final norm's (last stage). */
static int head_weight(stage *st, act_slot *s) {
    const float *x_last = st->nb ? s->blocks[st->nb - 1].res3 : s->x_in;
    if (st->cfg.arch == MODEL_LLAMA)
        return st->be->rmsnorm_bwd_weight(st->dlnfw, s->dlnf, x_last, s->lnf_rstd, st->N, st->cfg.C);
    return st->be->layernorm_bwd_weight(st->dlnfw, st->dlnfb, s->dlnf, x_last, s->lnf_mean, s->lnf_rstd,
                                        st->N, st->cfg.C);
}

/* The embeddings' gradient (first stage) from dL/d(x_in) kept in dd->embed. */
static int embed_weight(stage *st, act_slot *s) {
    float *dpos = st->cfg.arch == MODEL_LLAMA ? st->dzero_pos : st->dwpe; /* Llama: a scratch, never read */
    return st->be->encoder_bwd(st->dwte, dpos, s->dd->embed, s->tok, st->N, st->T, st->cfg.C);
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
    block_dims d = dims_of(st);
    block_acts *a = &s->blocks[b];
    if (st->recompute == STAGE_RECOMPUTE_FULL) return block_forward(st, &d, &st->bp[b], a, x);
    if (st->recompute == STAGE_RECOMPUTE_SELECTIVE && st->cfg.arch == MODEL_LLAMA)
        return st->be->attention_gqa_fwd(st->atty_scratch, a->att, a->qkv, st->Bm, st->T, st->cfg.NH, st->cfg.NKV,
                                         d.HS);
    if (st->recompute == STAGE_RECOMPUTE_SELECTIVE)
        return st->be->attention_gqa_fwd(st->atty_scratch, a->att, a->qkv, st->Bm, st->T, st->cfg.NH, st->cfg.NH,
                                         st->cfg.C / st->cfg.NH);
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
    block_dims d = dims_of(st);
    PL_TRY(backward_start(st, s, dout));
    for (int b = st->nb - 1; b >= 0; b--) {
        const float *x = b ? s->blocks[b - 1].res3 : s->x_in;
        PL_TRY(recompute_block(st, s, b, x));
        PL_TRY(block_backward_input(st, &d, &st->bp[b], &s->blocks[b], x, st->dres, &s->dd->blocks[b]));
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
        const float *x = b ? s->blocks[b - 1].res3 : s->x_in;
        if (st->recompute == STAGE_RECOMPUTE_FULL) PL_TRY(recompute_block(st, s, b, x)); /* others kept what W reads */
        PL_TRY(block_backward_weight(st, &d, &st->bg[b], &s->blocks[b], x, &s->dd->blocks[b]));
        PL_TRY(grad_final(st, b));
    }
    if (st->has_embed) PL_TRY(embed_weight(st, s));
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
    block_dims d = dims_of(st);
    PL_TRY(backward_start(st, s, dout));
    if (st->has_head) PL_TRY(head_weight(st, s));
    for (int b = st->nb - 1; b >= 0; b--) {
        const float *x = b ? s->blocks[b - 1].res3 : s->x_in;
        const block_douts *dd = &st->shared_dd.blocks[b];
        PL_TRY(recompute_block(st, s, b, x));
        PL_TRY(block_backward_input(st, &d, &st->bp[b], &s->blocks[b], x, st->dres, dd));
        PL_TRY(block_backward_weight(st, &d, &st->bg[b], &s->blocks[b], x, dd));
        PL_TRY(grad_final(st, b));
    }
    if (st->has_embed) {
        float *dpos = st->cfg.arch == MODEL_LLAMA ? st->dzero_pos : st->dwpe;
        PL_TRY(be->encoder_bwd(st->dwte, dpos, st->dres, s->tok, st->N, st->T, st->cfg.C));
    }
    PL_TRY(grad_final(st, -1));
    return release(st, s);
}

int stage_tied_grads_local(stage *st) {
    size_t n = (size_t)st->cfg.Vp * st->cfg.C;
    if (st->cfg.arch == MODEL_LLAMA) return PL_OK; /* untied head: nothing to fold */
    if (st->has_embed && st->has_head) return st->be->add_inplace(st->dwte, st->dwte_head, n);
    if (st->has_head) return st->be->copy(st->dwte, st->dwte_head, n * sizeof(float));
    return PL_OK;
}
