/*
 * model.c — GPT-2's tensor table and the math of one block, as calls to the backend.
 *
 * Straight-line llm.c-style code, in the order the paper writes the model:
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
    "attn_norm_w", "mlp_norm_w", "fc2_w", "lm_head",
};

/* Limits on model dimensions: generous for any real GPT-2-style model, small enough that
 * every size below is computed without overflow and the split search stays fast. */
#define GPT2_MAX_VOCAB (1 << 24)
#define GPT2_MAX_SEQ (1 << 20)
#define GPT2_MAX_LAYER 10000
#define GPT2_MAX_EMBD 65536
#define GPT2_MAX_TENSOR 2147483647LL       /* floats in one tensor (MPI counts are int) */
#define GPT2_MAX_PARAMS (1LL << 40)        /* floats in the whole model (16 TiB with AdamW) */

int gpt2_config_make(model_config *cfg, int V, int maxT, int L, int NH, int C, char *err, size_t errlen) {
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
    memset(cfg, 0, sizeof *cfg);
    cfg->V = V;
    cfg->Vp = (int)Vp;
    cfg->maxT = maxT;
    cfg->L = L;
    cfg->NH = NH;
    cfg->C = C;
    cfg->arch = MODEL_GPT2;
    cfg->NKV = NH;
    cfg->H = 4 * C;
    return PL_OK;
}

/* N = Vp C + maxT C + L (12 C^2 + 13 C) + 2 C, the llm.c count (wte once, padded). */
size_t gpt2_num_params(const model_config *c) {
    size_t C = c->C;
    return (size_t)c->Vp * C + (size_t)c->maxT * C + (size_t)c->L * (12 * C * C + 13 * C) + 2 * C;
}

/* Forward FLOPs per token of one block: 2*12C^2 in matmuls + 2*2*T*C in attention (full T,
 * as the kernels compute it). */
double gpt2_block_flops(const model_config *c, int T) {
    double C = c->C;
    return 24.0 * C * C + 4.0 * T * C;
}

/* Forward FLOPs per token of the LM head (2 Vp C) plus softmax (~5V). */
double gpt2_head_flops(const model_config *c) {
    return 2.0 * c->Vp * c->C + 5.0 * c->V;
}

/* Append one tensor to the table, 64-byte aligned. */
void model_add_tensor(param_tensor *out, int *n, size_t *off, int kind, int layer, int ndim, int d0, int d1) {
    param_tensor *t = &out[(*n)++];
    memset(t, 0, sizeof *t);
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
    *off += (t->numel + 15) / 16 * 16;
}

/* [wte wpe] (first), blocks l0..l1-1, [lnf_w lnf_b wte] (last; one wte when both). */
int gpt2_layout(const model_config *c, int l0, int l1, int has_embed, int has_head, param_tensor *out,
                size_t *total) {
    int C = c->C, n = 0;
    size_t off = 0;
    if (has_embed) {
        model_add_tensor(out, &n, &off, P_WTE, -1, 2, c->Vp, C);    // (Vp, C)
        model_add_tensor(out, &n, &off, P_WPE, -1, 2, c->maxT, C);  // (maxT, C)
    }
    for (int l = l0; l < l1; l++) {
        model_add_tensor(out, &n, &off, P_LN1W, l, 1, C, 0);         // (C)
        model_add_tensor(out, &n, &off, P_LN1B, l, 1, C, 0);         // (C)
        model_add_tensor(out, &n, &off, P_QKVW, l, 2, 3 * C, C);     // (3C, C)
        model_add_tensor(out, &n, &off, P_QKVB, l, 1, 3 * C, 0);     // (3C)
        model_add_tensor(out, &n, &off, P_ATTPROJW, l, 2, C, C);     // (C, C)
        model_add_tensor(out, &n, &off, P_ATTPROJB, l, 1, C, 0);     // (C)
        model_add_tensor(out, &n, &off, P_LN2W, l, 1, C, 0);         // (C)
        model_add_tensor(out, &n, &off, P_LN2B, l, 1, C, 0);         // (C)
        model_add_tensor(out, &n, &off, P_FCW, l, 2, 4 * C, C);      // (4C, C)
        model_add_tensor(out, &n, &off, P_FCB, l, 1, 4 * C, 0);      // (4C)
        model_add_tensor(out, &n, &off, P_FCPROJW, l, 2, C, 4 * C);  // (C, 4C)
        model_add_tensor(out, &n, &off, P_FCPROJB, l, 1, C, 0);      // (C)
    }
    if (has_head) {
        model_add_tensor(out, &n, &off, P_LNFW, -1, 1, C, 0);        // (C)
        model_add_tensor(out, &n, &off, P_LNFB, -1, 1, C, 0);        // (C)
        if (!has_embed) model_add_tensor(out, &n, &off, P_WTE, -1, 2, c->Vp, C);
    }
    *total = off;
    return n;
}

void gpt2_init_tensor(const model_config *c, const param_tensor *t, unsigned long long seed, float *host) {
    float resid_std = 0.02f / sqrtf(2.0f * c->L);
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
}

/* x = x + attproj(attn(qkv(ln1(x))));  x = x + fcproj(gelu(fc(ln2(x)))). */
int gpt2_block_forward(const backend *be, const block_dims *d, const block_params *p, block_acts *a,
                       const float *x) {
    int N = d->N, C = d->C;
    PL_TRY(be->layernorm_fwd(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1w, p->ln1b, N, C));
    PL_TRY(be->matmul_fwd(a->qkv, a->ln1, p->qkvw, p->qkvb, N, C, 3 * C));           // (N, 3C)
    PL_TRY(be->attention_gqa_fwd(a->atty, a->att, a->qkv, d->B, d->T, d->NH, d->NH, C / d->NH)); // (N, C)
    PL_TRY(be->matmul_fwd(a->res2, a->atty, p->attprojw, p->attprojb, N, C, C));     // (N, C)
    PL_TRY(be->residual_fwd(a->res2, a->res2, x, (size_t)N * C));
    PL_TRY(be->layernorm_fwd(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->ln2w, p->ln2b, N, C));
    PL_TRY(be->matmul_fwd(a->fch, a->ln2, p->fcw, p->fcb, N, C, 4 * C));              // (N, 4C)
    PL_TRY(be->gelu_fwd(a->fch_gelu, a->fch, (size_t)N * 4 * C));
    PL_TRY(be->matmul_fwd(a->res3, a->fch_gelu, p->fcprojw, p->fcprojb, N, 4 * C, C)); // (N, C)
    return be->residual_fwd(a->res3, a->res3, a->res2, (size_t)N * C);
}

/* dL/dx through the block, dres updated in place, in reverse op order; every weight op's
 * output gradient lands in dd (the residual gradients are copied: dres moves on). */
int gpt2_block_backward_input(const backend *be, const block_dims *d, const block_params *p,
                              const block_acts *a, const float *x, float *dres, const block_douts *dd) {
    int N = d->N, C = d->C;
    size_t nc = (size_t)N * C * sizeof(float);
    /* res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
    PL_TRY(be->copy(dd->fcproj, dres, nc));
    PL_TRY(be->matmul_bwd_input(dd->fc, dres, p->fcprojw, N, 4 * C, C));      // (N, 4C)
    PL_TRY(be->gelu_bwd(dd->fc, a->fch, dd->fc, (size_t)N * 4 * C));
    PL_TRY(be->matmul_bwd_input(dd->ln2, dd->fc, p->fcw, N, C, 4 * C));       // (N, C)
    PL_TRY(be->layernorm_bwd_input(dres, dd->ln2, a->res2, p->ln2w, a->ln2_mean, a->ln2_rstd, N, C));
    /* res2 = x + attproj(attn(qkv(ln1(x)))) */
    PL_TRY(be->copy(dd->attproj, dres, nc));
    PL_TRY(be->matmul_bwd_input(dd->ln1, dres, p->attprojw, N, C, C));        // (N, C) d(atty)
    PL_TRY(be->attention_gqa_bwd(dd->qkv, dd->ln1, a->qkv, a->att, d->B, d->T, d->NH, d->NH, C / d->NH)); // (N, 3C)
    PL_TRY(be->matmul_bwd_input(dd->ln1, dd->qkv, p->qkvw, N, C, 3 * C));     // (N, C)
    return be->layernorm_bwd_input(dres, dd->ln1, x, p->ln1w, a->ln1_mean, a->ln1_rstd, N, C);
}

/* dW += dY^T X and the bias / LayerNorm sums of the block, in the input part's op order. */
int gpt2_block_backward_weight(const backend *be, const block_dims *d, block_params *g, const block_acts *a,
                               const float *x, const block_douts *dd) {
    int N = d->N, C = d->C;
    PL_TRY(be->matmul_bwd_weight(g->fcprojw, g->fcprojb, dd->fcproj, a->fch_gelu, N, 4 * C, C));
    PL_TRY(be->matmul_bwd_weight(g->fcw, g->fcb, dd->fc, a->ln2, N, C, 4 * C));
    PL_TRY(be->layernorm_bwd_weight(g->ln2w, g->ln2b, dd->ln2, a->res2, a->ln2_mean, a->ln2_rstd, N, C));
    PL_TRY(be->matmul_bwd_weight(g->attprojw, g->attprojb, dd->attproj, a->atty, N, C, C));
    PL_TRY(be->matmul_bwd_weight(g->qkvw, g->qkvb, dd->qkv, a->ln1, N, C, 3 * C));
    return be->layernorm_bwd_weight(g->ln1w, g->ln1b, dd->ln1, x, a->ln1_mean, a->ln1_rstd, N, C);
}

/* ---- both architectures: the entry points the stage, split, report and files call ---- */

const char *model_arch_name(int arch) { return arch == MODEL_LLAMA ? "llama" : "gpt2"; }

/* 16 + 12 per block (GPT-2) covers Llama's 3 + 7 per block too. */
int model_max_tensors(const model_config *c, int nb) {
    (void)c;
    return 16 + 12 * nb;
}

int model_num_tensors(const model_config *c) {
    return c->arch == MODEL_LLAMA ? 3 + 7 * c->L : 4 + 12 * c->L;
}

int model_layout(const model_config *c, int l0, int l1, int has_embed, int has_head, param_tensor *out,
                 size_t *total) {
    if (c->arch == MODEL_LLAMA) return llama_layout(c, l0, l1, has_embed, has_head, out, total);
    return gpt2_layout(c, l0, l1, has_embed, has_head, out, total);
}

void model_init_tensor(const model_config *c, const param_tensor *t, unsigned long long seed, float *host) {
    if (c->arch == MODEL_LLAMA) llama_init_tensor(c, t, seed, host);
    else gpt2_init_tensor(c, t, seed, host);
}

/* Llama block: norms 2C, qkv QKV C, attproj C^2, MLP 3 H C. */
size_t model_block_params(const model_config *c) {
    size_t C = c->C;
    if (c->arch != MODEL_LLAMA) return 12 * C * C + 13 * C;
    size_t HS = C / c->NH, QKV = (size_t)(c->NH + 2 * c->NKV) * HS;
    return 2 * C + QKV * C + C * C + 3 * (size_t)c->H * C;
}

size_t model_embed_params(const model_config *c) {
    size_t n = (size_t)c->Vp * c->C;
    return c->arch == MODEL_LLAMA ? n : n + (size_t)c->maxT * c->C;
}

/* GPT-2: lnf w and b, plus the tied head's copy of wte unless the stage holds the embedding;
 * Llama: the final norm and lm_head. */
size_t model_head_params(const model_config *c, int has_embed) {
    size_t C = c->C, head = (size_t)c->Vp * C;
    if (c->arch == MODEL_LLAMA) return C + head;
    return 2 * C + (has_embed ? 0 : head);
}

/* The whole model, each tensor once (GPT-2's tied wte once), padded vocabulary included. */
size_t model_num_params(const model_config *c) {
    if (c->arch != MODEL_LLAMA) return gpt2_num_params(c);
    return model_embed_params(c) + (size_t)c->L * model_block_params(c) + model_head_params(c, 1);
}

/* 2 FLOPs per weight of the block's matmuls, plus attention's two products over the full T
 * (NH heads of HS = C channels in total, as the kernels compute it). */
double model_block_flops(const model_config *c, int T) {
    if (c->arch != MODEL_LLAMA) return gpt2_block_flops(c, T);
    double C = c->C, HS = C / c->NH, QKV = (c->NH + 2.0 * c->NKV) * HS;
    return 2.0 * (QKV * C + C * C + 3.0 * c->H * C) + 4.0 * T * C;
}

double model_head_flops(const model_config *c) { return gpt2_head_flops(c); }

/* Per token: GPT-2 16 C + 4 (stage_act_bytes_per_slot's count); Llama ln1, atty, res2, ln2,
 * res3 (5 C), qkv (QKV), 3 H (up, gate, product) and 2 rstd. */
size_t model_block_act_floats_per_token(const model_config *c) {
    size_t C = c->C;
    if (c->arch != MODEL_LLAMA) return 16 * C + 4;
    size_t QKV = (size_t)(c->NH + 2 * c->NKV) * (C / c->NH);
    return 5 * C + QKV + 3 * (size_t)c->H + 2;
}

double model_train_flops_per_token(const model_config *c, int T) {
    double att = 6.0 * c->L * c->C * T;
    if (c->arch != MODEL_LLAMA) return 6.0 * gpt2_num_params(c) + att;
    return 6.0 * (double)(model_num_params(c) - (size_t)c->Vp * c->C) + att;
}
