/*
 * model.c — GPT-2 forward and backward over one pipeline stage.
 *
 * Straight-line llm.c-style code: the layout of a stage's parameters, the per-slot
 * activations, and stage_forward / stage_backward which call the backend's ops in the order
 * the paper writes the model:
 *   x = wte[tok] + wpe[pos]
 *   per block: x = x + attproj(attn(qkv(ln1(x))));  x = x + fcproj(gelu(fc(ln2(x))))
 *   logits = lnf(x) wte^T;  loss = mean cross-entropy over the V real columns
 * Shapes use B (micro-batch sequences) T C NH L V, N = B*T rows.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include "pipelm/common.h"
#include "pipelm/model.h"
#include "pipelm/rng.h"

const char *const param_kind_name[P_NKINDS] = {
    "wte", "wpe", "ln1_w", "ln1_b", "qkv_w", "qkv_b", "attproj_w", "attproj_b",
    "ln2_w", "ln2_b", "fc_w", "fc_b", "fcproj_w", "fcproj_b", "lnf_w", "lnf_b",
};

/* Limits on model dimensions: generous for any real GPT-2-style model, small enough that
 * every size below is computed without overflow and the split search stays fast. */
#define GPT2_MAX_VOCAB (1 << 24)
#define GPT2_MAX_SEQ (1 << 20)
#define GPT2_MAX_LAYER 10000
#define GPT2_MAX_EMBD 65536
#define GPT2_MAX_TENSOR 2147483647LL       /* floats in one tensor (MPI counts are int) */
#define GPT2_MAX_PARAMS (1LL << 40)        /* floats in the whole model (16 TiB with AdamW) */

int gpt2_config_make(gpt2_config *cfg, int V, int maxT, int L, int NH, int C, char *err, size_t errlen) {
    if (V < 2 || maxT < 1 || L < 1 || NH < 1 || C < 1) {
        snprintf(err, errlen, "model dimensions must be positive (vocab-size=%d max-seq-len=%d "
                 "n-layer=%d n-head=%d n-embd=%d; vocab-size at least 2)", V, maxT, L, NH, C);
        return PL_EINVAL;
    }
    const char *names[] = {"vocab-size", "max-seq-len", "n-layer", "n-embd", "n-head"};
    long long vals[] = {V, maxT, L, C, NH}, lims[] = {GPT2_MAX_VOCAB, GPT2_MAX_SEQ, GPT2_MAX_LAYER, GPT2_MAX_EMBD, C};
    for (int i = 0; i < 5; i++)
        if (vals[i] > lims[i]) {
            snprintf(err, errlen, "%s=%lld is too large (at most %lld%s)", names[i], vals[i], lims[i],
                     i == 4 ? ", the n-embd" : "");
            return PL_EINVAL;
        }
    if (C % NH != 0) {
        snprintf(err, errlen, "n-embd (%d) must be a multiple of n-head (%d)", C, NH);
        return PL_EINVAL;
    }
    long long Vp = ((long long)V + 127) / 128 * 128, c = C;
    /* the largest tensors: wte (Vp, C), wpe (maxT, C), fc_w (4C, C) */
    const char *tn[] = {"wte (padded vocab x n-embd)", "wpe (max-seq-len x n-embd)", "fc_w (4 n-embd x n-embd)"};
    long long tv[] = {Vp * c, (long long)maxT * c, 4 * c * c};
    for (int i = 0; i < 3; i++)
        if (tv[i] > GPT2_MAX_TENSOR) {
            snprintf(err, errlen, "model too large: tensor %s would hold %lld floats, more than %lld "
                     "(vocab-size=%d max-seq-len=%d n-embd=%d)", tn[i], tv[i], GPT2_MAX_TENSOR, V, maxT, C);
            return PL_EINVAL;
        }
    /* N = Vp C + maxT C + L (12 C^2 + 13 C) + 2 C, each term < 2^40 here, so no overflow */
    long long n = tv[0] + tv[1] + (long long)L * (12 * c * c + 13 * c) + 2 * c;
    if (n > GPT2_MAX_PARAMS) {
        snprintf(err, errlen, "model too large: %lld parameters (n-layer=%d n-embd=%d vocab-size=%d), more than "
                 "the %lld this build accepts", n, L, C, V, GPT2_MAX_PARAMS);
        return PL_EINVAL;
    }
    cfg->V = V;
    cfg->Vp = (int)Vp;
    cfg->maxT = maxT;
    cfg->L = L;
    cfg->NH = NH;
    cfg->C = C;
    return PL_OK;
}

/* N = Vp C + maxT C + L (12 C^2 + 13 C) + 2 C, the llm.c count (wte once, padded). */
size_t gpt2_num_params(const gpt2_config *c) {
    size_t C = c->C;
    return (size_t)c->Vp * C + (size_t)c->maxT * C + (size_t)c->L * (12 * C * C + 13 * C) + 2 * C;
}

/* Forward FLOPs per token of one block: 2*12C^2 in matmuls + 2*2*T*C in attention (full T,
 * as the kernels compute it). */
double gpt2_block_flops(const gpt2_config *c, int T) {
    double C = c->C;
    return 24.0 * C * C + 4.0 * T * C;
}

/* Forward FLOPs per token of the LM head (2 Vp C) plus softmax (~5V). */
double gpt2_head_flops(const gpt2_config *c) {
    return 2.0 * c->Vp * c->C + 5.0 * c->V;
}

/* Append one tensor to the stage's table; returns its offset. */
static void add_tensor(stage *st, size_t *off, int kind, int layer, int ndim, int d0, int d1) {
    param_tensor *t = &st->tensors[st->ntensors++];
    if (layer >= 0) snprintf(t->name, sizeof t->name, "h.%d.%s", layer, param_kind_name[kind]);
    else snprintf(t->name, sizeof t->name, "%s", param_kind_name[kind]);
    t->kind = kind;
    t->layer = layer;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim == 2 ? d1 : 1;
    t->numel = (size_t)d0 * (ndim == 2 ? d1 : 1);
    t->offset = *off;
    t->decay = ndim == 2;
    *off += (t->numel + 15) / 16 * 16; /* keep every tensor 64-byte aligned */
}

/* Lay out the parameters: [wte wpe] (first), blocks l0..l1-1, [lnf_w lnf_b wte] (last; one
 * wte when the stage is both). */
static size_t layout_params(stage *st) {
    const gpt2_config *c = &st->cfg;
    int C = c->C;
    size_t off = 0;
    st->ntensors = 0;
    if (st->has_embed) {
        add_tensor(st, &off, P_WTE, -1, 2, c->Vp, C);
        add_tensor(st, &off, P_WPE, -1, 2, c->maxT, C);
    }
    for (int l = st->l0; l < st->l1; l++) {
        add_tensor(st, &off, P_LN1W, l, 1, C, 0);
        add_tensor(st, &off, P_LN1B, l, 1, C, 0);
        add_tensor(st, &off, P_QKVW, l, 2, 3 * C, C);
        add_tensor(st, &off, P_QKVB, l, 1, 3 * C, 0);
        add_tensor(st, &off, P_ATTPROJW, l, 2, C, C);
        add_tensor(st, &off, P_ATTPROJB, l, 1, C, 0);
        add_tensor(st, &off, P_LN2W, l, 1, C, 0);
        add_tensor(st, &off, P_LN2B, l, 1, C, 0);
        add_tensor(st, &off, P_FCW, l, 2, 4 * C, C);
        add_tensor(st, &off, P_FCB, l, 1, 4 * C, 0);
        add_tensor(st, &off, P_FCPROJW, l, 2, C, 4 * C);
        add_tensor(st, &off, P_FCPROJB, l, 1, C, 0);
    }
    if (st->has_head) {
        add_tensor(st, &off, P_LNFW, -1, 1, C, 0);
        add_tensor(st, &off, P_LNFB, -1, 1, C, 0);
        if (!st->has_embed) add_tensor(st, &off, P_WTE, -1, 2, c->Vp, C);
    }
    return off;
}

const param_tensor *stage_find_tensor(const stage *st, int kind, int layer) {
    for (int i = 0; i < st->ntensors; i++)
        if (st->tensors[i].kind == kind && st->tensors[i].layer == layer) return &st->tensors[i];
    return NULL;
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
        }
        *pp = p;
        *gg = g;
    }
}

/* Allocate through the backend, remembering failure. */
static void *balloc(stage *st, size_t bytes, int *fail) {
    void *p = st->be->alloc(bytes);
    if (!p) *fail = 1;
    return p;
}

/* Allocate one activation slot: per block 16 C floats + NH T floats + 4 per token. */
static void alloc_slot(stage *st, act_slot *s, int *fail) {
    size_t N = st->N, C = st->cfg.C, F = sizeof(float);
    s->x_in = balloc(st, N * C * F, fail);
    s->tok = st->has_embed ? balloc(st, N * sizeof(int), fail) : NULL;
    s->blocks = calloc(st->nb ? st->nb : 1, sizeof(block_acts));
    if (!s->blocks) { *fail = 1; return; }
    for (int b = 0; b < st->nb; b++) {
        block_acts *a = &s->blocks[b];
        a->ln1 = balloc(st, N * C * F, fail);
        a->ln1_mean = balloc(st, N * F, fail);
        a->ln1_rstd = balloc(st, N * F, fail);
        a->qkv = balloc(st, N * 3 * C * F, fail);
        a->att = balloc(st, (size_t)st->Bm * st->cfg.NH * st->T * st->T * F, fail);
        a->atty = balloc(st, N * C * F, fail);
        a->res2 = balloc(st, N * C * F, fail);
        a->ln2 = balloc(st, N * C * F, fail);
        a->ln2_mean = balloc(st, N * F, fail);
        a->ln2_rstd = balloc(st, N * F, fail);
        a->fch = balloc(st, N * 4 * C * F, fail);
        a->fch_gelu = balloc(st, N * 4 * C * F, fail);
        a->res3 = balloc(st, N * C * F, fail);
    }
    if (st->has_head) {
        s->lnf = balloc(st, N * C * F, fail);
        s->lnf_mean = balloc(st, N * F, fail);
        s->lnf_rstd = balloc(st, N * F, fail);
        s->dlnf = balloc(st, N * C * F, fail);
    }
}

static void free_slot(stage *st, act_slot *s) {
    const backend *be = st->be;
    be->free(s->x_in);
    be->free(s->tok);
    if (s->blocks) {
        for (int b = 0; b < st->nb; b++) {
            block_acts *a = &s->blocks[b];
            float *all[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->att, a->atty, a->res2,
                            a->ln2, a->ln2_mean, a->ln2_rstd, a->fch, a->fch_gelu, a->res3};
            for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) be->free(all[k]);
        }
        free(s->blocks);
    }
    be->free(s->lnf);
    be->free(s->lnf_mean);
    be->free(s->lnf_rstd);
    be->free(s->dlnf);
}

int stage_init(stage *st, const gpt2_config *cfg, int l0, int l1, int has_embed, int has_head,
               int Bm, int T, int nslots, const backend *be, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    if (l0 < 0 || l1 < l0 || l1 > cfg->L || T < 1 || T > cfg->maxT || Bm < 1 || nslots < 1) {
        snprintf(err, errlen, "bad stage shape: blocks [%d,%d) of %d, B=%d T=%d (max %d), slots %d",
                 l0, l1, cfg->L, Bm, T, cfg->maxT, nslots);
        return PL_EINVAL;
    }
    st->cfg = *cfg;
    st->l0 = l0;
    st->l1 = l1;
    st->nb = l1 - l0;
    st->has_embed = has_embed;
    st->has_head = has_head;
    st->Bm = Bm;
    st->T = T;
    /* every buffer below must have a size that fits (and each fewer than 2^31 elements) */
    {
        long long N = (long long)Bm * T, C = cfg->C;
        const char *what = NULL;
        long long big = 0;
        if (N > GPT2_MAX_TENSOR / 4 / (C > 0 ? C : 1)) { what = "the (tokens, 4 n-embd) activations"; big = N; }
        else if (has_head && N > GPT2_MAX_TENSOR / cfg->Vp) { what = "the (tokens, padded vocab) logits"; big = N; }
        else if ((long long)Bm * cfg->NH > GPT2_MAX_TENSOR / ((long long)T * T)) {
            what = "the (micro-batch, heads, T, T) attention";
            big = N;
        }
        if (what) {
            snprintf(err, errlen, "micro-batch too large: %s of %d x %d = %lld tokens would exceed %lld floats "
                     "(lower --batch/--microbatches ratio or --seq-len)", what, Bm, T, big, GPT2_MAX_TENSOR);
            return PL_EINVAL;
        }
    }
    st->N = Bm * T;
    st->be = be;
    st->tensors = calloc(16 + 12 * (size_t)st->nb, sizeof(param_tensor));
    st->bp = calloc(st->nb ? st->nb : 1, sizeof(block_params));
    st->bg = calloc(st->nb ? st->nb : 1, sizeof(block_params));
    st->slots = calloc(nslots, sizeof(act_slot));
    if (!st->tensors || !st->bp || !st->bg || !st->slots) {
        snprintf(err, errlen, "out of host memory for the stage tables");
        return PL_ENOMEM;
    }
    st->nparams = layout_params(st);
    size_t pb = st->nparams * sizeof(float);
    int fail = 0;
    st->params = balloc(st, pb, &fail);
    st->grads = balloc(st, pb, &fail);
    st->m = balloc(st, pb, &fail);
    st->v = balloc(st, pb, &fail);
    if (!fail) bind_pointers(st);
    size_t N = st->N, C = cfg->C, F = sizeof(float);
    if (has_head) {
        st->dwte_head = balloc(st, (size_t)cfg->Vp * C * F, &fail);
        st->logits = balloc(st, N * cfg->Vp * F, &fail);
        st->losses = balloc(st, N * F, &fail);
        st->tgt = balloc(st, N * sizeof(int), &fail);
    }
    st->dres = balloc(st, N * C * F, &fail);
    st->dbuf_c = balloc(st, N * C * F, &fail);
    st->dbuf_3c = balloc(st, N * 3 * C * F, &fail);
    st->dbuf_4c = balloc(st, N * 4 * C * F, &fail);
    st->nslots = nslots;
    for (int i = 0; i < nslots && !fail; i++) alloc_slot(st, &st->slots[i], &fail);
    if (fail) {
        snprintf(err, errlen, "out of %s memory for a stage of %d blocks (%zu parameters, "
                 "%d activation slots of %d x %d tokens)", be->name, st->nb, st->nparams,
                 nslots, Bm, T);
        stage_free(st);
        return PL_ENOMEM;
    }
    return PL_OK;
}

void stage_free(stage *st) {
    if (!st->be) return;
    const backend *be = st->be;
    if (st->slots)
        for (int i = 0; i < st->nslots; i++) free_slot(st, &st->slots[i]);
    free(st->slots);
    float *bufs[] = {st->params, st->grads, st->m, st->v, st->dwte_head, st->logits, st->losses,
                     st->dres, st->dbuf_c, st->dbuf_3c, st->dbuf_4c};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) be->free(bufs[k]);
    be->free(st->tgt);
    free(st->tensors);
    free(st->bp);
    free(st->bg);
    memset(st, 0, sizeof *st);
}

void stage_init_params(stage *st, unsigned long long seed) {
    const gpt2_config *c = &st->cfg;
    float resid_std = 0.02f / sqrtf(2.0f * c->L);
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        float *host = malloc(t->numel * sizeof(float));
        if (!host) abort();
        /* one stream per (kind, layer): independent of which stage holds the tensor */
        rng_state r;
        rng_seed(&r, seed, 1000003ULL * (unsigned long long)(t->kind + 1) + (unsigned long long)(t->layer + 1));
        switch (t->kind) {
        case P_LN1W: case P_LN2W: case P_LNFW:
            for (size_t k = 0; k < t->numel; k++) host[k] = 1.0f;
            break;
        case P_LN1B: case P_LN2B: case P_LNFB: case P_QKVB: case P_ATTPROJB: case P_FCB: case P_FCPROJB:
            memset(host, 0, t->numel * sizeof(float));
            break;
        default: {
            float std = (t->kind == P_ATTPROJW || t->kind == P_FCPROJW) ? resid_std : 0.02f;
            for (size_t k = 0; k < t->numel; k++) host[k] = std * rng_normal(&r);
            if (t->kind == P_WTE) /* padded vocabulary rows are zero */
                memset(host + (size_t)c->V * c->C, 0, (size_t)(c->Vp - c->V) * c->C * sizeof(float));
        }
        }
        st->be->from_host(st->params + t->offset, host, t->numel * sizeof(float));
        free(host);
    }
}

void stage_zero_grads(stage *st) {
    st->be->zero(st->grads, st->nparams * sizeof(float));
    if (st->dwte_head) st->be->zero(st->dwte_head, (size_t)st->cfg.Vp * st->cfg.C * sizeof(float));
}

int stage_slot_of(const stage *st, int mb) {
    for (int i = 0; i < st->nslots; i++)
        if (st->slots[i].in_use && st->slots[i].mb == mb) return i;
    return -1;
}

void stage_release_all(stage *st) {
    for (int i = 0; i < st->nslots; i++) st->slots[i].in_use = 0;
    st->slots_in_use = 0;
}

float *stage_output(stage *st, int slot) {
    act_slot *s = &st->slots[slot];
    return st->nb ? s->blocks[st->nb - 1].res3 : s->x_in;
}

float *stage_dinput(stage *st) { return st->dres; }

/* One transformer block forward for N rows, input x. */
static void block_forward(stage *st, const block_params *p, block_acts *a, const float *x) {
    const backend *be = st->be;
    int N = st->N, C = st->cfg.C, NH = st->cfg.NH;
    be->layernorm_fwd(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1w, p->ln1b, N, C);
    be->matmul_fwd(a->qkv, a->ln1, p->qkvw, p->qkvb, N, C, 3 * C);
    be->attention_fwd(a->atty, a->att, a->qkv, st->Bm, st->T, C, NH);
    be->matmul_fwd(a->res2, a->atty, p->attprojw, p->attprojb, N, C, C);
    be->residual_fwd(a->res2, a->res2, x, (size_t)N * C);
    be->layernorm_fwd(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->ln2w, p->ln2b, N, C);
    be->matmul_fwd(a->fch, a->ln2, p->fcw, p->fcb, N, C, 4 * C);
    be->gelu_fwd(a->fch_gelu, a->fch, (size_t)N * 4 * C);
    be->matmul_fwd(a->res3, a->fch_gelu, p->fcprojw, p->fcprojb, N, 4 * C, C);
    be->residual_fwd(a->res3, a->res3, a->res2, (size_t)N * C);
}

/* One block backward: on entry st->dres = dL/d(block output); on exit dL/d(block input).
 * The residual stream's gradient is updated in place. */
static void block_backward(stage *st, const block_params *p, block_params *g, const block_acts *a,
                           const float *x) {
    const backend *be = st->be;
    int N = st->N, C = st->cfg.C, NH = st->cfg.NH;
    float *dres = st->dres, *dc = st->dbuf_c, *d3c = st->dbuf_3c, *d4c = st->dbuf_4c;
    /* res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
    be->matmul_bwd(d4c, g->fcprojw, g->fcprojb, dres, a->fch_gelu, p->fcprojw, N, 4 * C, C);
    be->gelu_bwd(d4c, a->fch, d4c, (size_t)N * 4 * C);
    be->matmul_bwd(dc, g->fcw, g->fcb, d4c, a->ln2, p->fcw, N, C, 4 * C);
    be->layernorm_bwd(dres, g->ln2w, g->ln2b, dc, a->res2, p->ln2w, a->ln2_mean, a->ln2_rstd, N, C);
    /* res2 = x + attproj(attn(qkv(ln1(x)))) */
    be->matmul_bwd(dc, g->attprojw, g->attprojb, dres, a->atty, p->attprojw, N, C, C);
    be->attention_bwd(d3c, dc, a->qkv, a->att, st->Bm, st->T, C, NH);
    be->matmul_bwd(dc, g->qkvw, g->qkvb, d3c, a->ln1, p->qkvw, N, C, 3 * C);
    be->layernorm_bwd(dres, g->ln1w, g->ln1b, dc, x, p->ln1w, a->ln1_mean, a->ln1_rstd, N, C);
}

int stage_forward(stage *st, int mb, const int *tok, const float *x_in, const int *targets,
                  float dloss, double *loss_sum, int *slot_out) {
    const backend *be = st->be;
    int N = st->N, C = st->cfg.C;
    int slot = -1;
    for (int i = 0; i < st->nslots; i++)
        if (!st->slots[i].in_use) { slot = i; break; }
    if (slot < 0) {
        pl_error("stage blocks [%d,%d): no free activation slot for micro-batch %d (%d in use)",
                 st->l0, st->l1, mb, st->slots_in_use);
        return PL_EINVAL;
    }
    act_slot *s = &st->slots[slot];
    s->in_use = 1;
    s->mb = mb;
    if (++st->slots_in_use > st->slots_peak) st->slots_peak = st->slots_in_use;
    if (st->has_embed) {
        be->from_host(s->tok, tok, (size_t)N * sizeof(int));
        be->encoder_fwd(s->x_in, s->tok, st->wte, st->wpe, N, st->T, C);
    } else {
        be->copy(s->x_in, x_in, (size_t)N * C * sizeof(float));
    }
    const float *x = s->x_in;
    for (int b = 0; b < st->nb; b++) {
        block_forward(st, &st->bp[b], &s->blocks[b], x);
        x = s->blocks[b].res3;
    }
    if (st->has_head) {
        const gpt2_config *c = &st->cfg;
        be->layernorm_fwd(s->lnf, s->lnf_mean, s->lnf_rstd, x, st->lnfw, st->lnfb, N, C);
        be->matmul_fwd(st->logits, s->lnf, st->wte, NULL, N, C, c->Vp);
        be->from_host(st->tgt, targets, (size_t)N * sizeof(int));
        be->crossentropy_fwd(st->losses, st->logits, st->tgt, N, c->V, c->Vp);
        float *host = malloc((size_t)N * sizeof(float));
        if (!host) abort();
        be->to_host(host, st->losses, (size_t)N * sizeof(float));
        double sum = 0.0;
        for (int i = 0; i < N; i++) sum += host[i];
        free(host);
        *loss_sum = sum;
        if (dloss > 0.0f) {
            /* the head's backward, now that dL/dlogits is known: keep only dL/d(lnf) */
            be->crossentropy_bwd(st->logits, st->tgt, dloss, N, c->V, c->Vp);
            be->matmul_bwd(s->dlnf, st->dwte_head, NULL, st->logits, s->lnf, st->wte, N, C, c->Vp);
        }
    }
    *slot_out = slot;
    return PL_OK;
}

int stage_backward(stage *st, int slot, const float *dout) {
    const backend *be = st->be;
    int N = st->N, C = st->cfg.C;
    act_slot *s = &st->slots[slot];
    if (!s->in_use) {
        pl_error("stage blocks [%d,%d): backward of an empty slot %d", st->l0, st->l1, slot);
        return PL_EINVAL;
    }
    const float *x_last = st->nb ? s->blocks[st->nb - 1].res3 : s->x_in;
    if (st->has_head) {
        be->zero(st->dres, (size_t)N * C * sizeof(float));
        be->layernorm_bwd(st->dres, st->dlnfw, st->dlnfb, s->dlnf, x_last, st->lnfw,
                          s->lnf_mean, s->lnf_rstd, N, C);
    } else {
        be->copy(st->dres, dout, (size_t)N * C * sizeof(float));
    }
    for (int b = st->nb - 1; b >= 0; b--) {
        const float *x = b ? s->blocks[b - 1].res3 : s->x_in;
        block_backward(st, &st->bp[b], &st->bg[b], &s->blocks[b], x);
    }
    if (st->has_embed) be->encoder_bwd(st->dwte, st->dwpe, st->dres, s->tok, N, st->T, C);
    s->in_use = 0;
    st->slots_in_use--;
    return PL_OK;
}

void stage_tied_grads_local(stage *st) {
    size_t n = (size_t)st->cfg.Vp * st->cfg.C;
    if (st->has_embed && st->has_head) st->be->add_inplace(st->dwte, st->dwte_head, n);
    else if (st->has_head) st->be->copy(st->dwte, st->dwte_head, n * sizeof(float));
}
