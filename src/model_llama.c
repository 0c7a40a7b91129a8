/*
 * model_llama.c — Llama 3 (as Meta defines it and llm.c's train_llama3.py writes it): the
 * tensor table, initial values, the rotary tables and one block's math as backend calls.
 *
 *   x = wte[tok]
 *   per block: x = x + attproj(attn_gqa(rope(qkv(rmsnorm1(x)))))
 *              x = x + fcproj(fc(h) * silu(fc2(h))),  h = rmsnorm2(x)
 *   logits = rmsnorm_f(x) lm_head^T;  loss = mean cross-entropy over the V real columns
 * No biases; the head is not tied to wte. qkv is fused as [q (NH heads) | k (NKV) | v (NKV)],
 * head size HS = C / NH; query head h reads kv head h / (NH / NKV). fc is llm.c's c_fc (the
 * "up" input, Meta w3), fc2 its c_fc2 (the gate that goes through silu, Meta w1).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pipelm/common.h"
#include "pipelm/config.h"
#include "pipelm/model.h"
#include "pipelm/rng.h"

#define LLAMA_MAX_VOCAB (1 << 24)
#define LLAMA_MAX_SEQ (1 << 20)
#define LLAMA_MAX_LAYER 10000
#define LLAMA_MAX_EMBD 65536
#define LLAMA_MAX_TENSOR 2147483647LL /* floats in one tensor (MPI counts are int) */
#define LLAMA_MAX_PARAMS (1LL << 40)

/* int(2 * 4C / 3), int(ffn_mult * that) when ffn_mult > 0, rounded up to multiple_of. */
int llama_hidden_size(int C, float ffn_mult, int multiple_of) {
    long long h = 2LL * 4 * C / 3;
    if (ffn_mult > 0) h = (long long)((double)ffn_mult * (double)h);
    if (multiple_of < 1) multiple_of = 1;
    h = (h + multiple_of - 1) / multiple_of * multiple_of;
    return h > 0x7fffffffLL ? 0x7fffffff : (int)h;
}

int llama_config_make(model_config *cfg, int V, int maxT, int L, int NH, int NKV, int C, int multiple_of,
                      float ffn_mult, float norm_eps, float rope_theta, int use_scaled_rope, cfg_naming naming,
                      char *err, size_t errlen) {
    if (V < 2 || maxT < 1 || L < 1 || NH < 1 || C < 1) {
        snprintf(err, errlen, "model dimensions must be positive (vocab-size=%d max-seq-len=%d n-layer=%d "
                 "n-head=%d n-embd=%d; vocab-size at least 2)", V, maxT, L, NH, C);
        return PL_EINVAL;
    }
    const char *names[] = {"vocab-size", "max-seq-len", "n-layer", "n-embd", "n-head"};
    long long vals[] = {V, maxT, L, C, NH};
    long long lims[] = {LLAMA_MAX_VOCAB, LLAMA_MAX_SEQ, LLAMA_MAX_LAYER, LLAMA_MAX_EMBD, C};
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
    /* n-kv-head, multiple-of, use-scaled-rope, ffn-dim-multiplier, norm-eps, rope-theta: the one
     * validation the command line, --init and checkpoints share (config.c) */
    cfg_llama lc = {NH, NKV, multiple_of, use_scaled_rope, 3, 1, ffn_mult, norm_eps, rope_theta};
    PL_TRY(config_check_llama(&lc, naming, err, errlen));
    if ((C / NH) % 2 != 0) {
        snprintf(err, errlen, "the head size n-embd / n-head = %d / %d = %d must be even (rotary embeddings "
                 "rotate pairs of channels)", C, NH, C / NH);
        return PL_EINVAL;
    }
    long long H = llama_hidden_size(C, ffn_mult, multiple_of), c = C, HS = C / NH;
    long long QKV = (long long)(NH + 2 * NKV) * HS, Vp = ((long long)V + 127) / 128 * 128;
    if (H < 1) {
        snprintf(err, errlen, "the MLP hidden size from n-embd %d, ffn-dim-multiplier %g and multiple-of %d is "
                 "not positive", C, (double)ffn_mult, multiple_of);
        return PL_EINVAL;
    }
    const char *tn[] = {"wte / lm_head (padded vocab x n-embd)", "fc_w (hidden x n-embd)", "qkv_w"};
    long long tv[] = {Vp * c, H * c, QKV * c};
    for (int i = 0; i < 3; i++)
        if (tv[i] > LLAMA_MAX_TENSOR) {
            snprintf(err, errlen, "model too large: tensor %s would hold %lld floats, more than %lld "
                     "(vocab-size=%d n-embd=%d hidden=%lld)", tn[i], tv[i], LLAMA_MAX_TENSOR, V, C, H);
            return PL_EINVAL;
        }
    long long n = 2 * Vp * c + c + (long long)L * (2 * c + QKV * c + c * c + 3 * H * c);
    if (n > LLAMA_MAX_PARAMS) {
        snprintf(err, errlen, "model too large: %lld parameters (n-layer=%d n-embd=%d vocab-size=%d), more than "
                 "the %lld this build accepts", n, L, C, V, LLAMA_MAX_PARAMS);
        return PL_EINVAL;
    }
    memset(cfg, 0, sizeof *cfg);
    cfg->V = V;
    cfg->Vp = (int)Vp;
    cfg->maxT = maxT;
    cfg->L = L;
    cfg->NH = NH;
    cfg->C = C;
    cfg->arch = MODEL_LLAMA;
    cfg->NKV = NKV;
    cfg->H = (int)H;
    cfg->multiple_of = multiple_of;
    cfg->use_scaled_rope = use_scaled_rope;
    cfg->ver_major = 3;
    cfg->ver_minor = 1;
    cfg->ffn_mult = ffn_mult; /* 0..64, 0 = none (config_check_llama) */
    cfg->norm_eps = norm_eps;
    cfg->rope_theta = rope_theta;
    return PL_OK;
}

/* [wte] (first), blocks l0..l1-1 in llm.c's order, [lnf_w lm_head] (last). */
int llama_layout(const model_config *c, int l0, int l1, int has_embed, int has_head, param_tensor *out,
                 size_t *total) {
    int C = c->C, H = c->H, QKV = (c->NH + 2 * c->NKV) * (C / c->NH), n = 0;
    size_t off = 0;
    if (has_embed) model_add_tensor(out, &n, &off, P_WTE, -1, 2, c->Vp, C);  // (Vp, C)
    for (int l = l0; l < l1; l++) {
        model_add_tensor(out, &n, &off, P_ATTNORMW, l, 1, C, 0);         // (C)
        model_add_tensor(out, &n, &off, P_QKVW, l, 2, QKV, C);           // (QKV, C)
        model_add_tensor(out, &n, &off, P_ATTPROJW, l, 2, C, C);         // (C, C)
        model_add_tensor(out, &n, &off, P_MLPNORMW, l, 1, C, 0);         // (C)
        model_add_tensor(out, &n, &off, P_FCW, l, 2, H, C);              // (H, C) up
        model_add_tensor(out, &n, &off, P_FC2W, l, 2, H, C);             // (H, C) gate
        model_add_tensor(out, &n, &off, P_FCPROJW, l, 2, C, H);          // (C, H)
    }
    if (has_head) {
        model_add_tensor(out, &n, &off, P_LNFW, -1, 1, C, 0);            // (C)
        model_add_tensor(out, &n, &off, P_LMHEAD, -1, 2, c->Vp, C);      // (Vp, C)
    }
    *total = off;
    return n;
}

/* N(0, 0.02) matrices, residual projections (attproj, fcproj) scaled by 1/sqrt(2L), norm
 * weights 1, padded vocabulary rows 0; one stream per (kind, layer), as for GPT-2. */
void llama_init_tensor(const model_config *c, const param_tensor *t, unsigned long long seed, float *host) {
    if (t->kind == P_ATTNORMW || t->kind == P_MLPNORMW || t->kind == P_LNFW) {
        for (size_t k = 0; k < t->numel; k++) host[k] = 1.0f;
        return;
    }
    rng_state r;
    rng_seed(&r, seed, 1000003ULL * (unsigned long long)(t->kind + 1) + (unsigned long long)(t->layer + 1));
    float std = (t->kind == P_ATTPROJW || t->kind == P_FCPROJW) ? 0.02f / sqrtf(2.0f * c->L) : 0.02f;
    for (size_t k = 0; k < t->numel; k++) host[k] = std * rng_normal(&r);
    if (t->kind == P_WTE || t->kind == P_LMHEAD)
        memset(host + (size_t)c->V * c->C, 0, (size_t)(c->Vp - c->V) * c->C * sizeof(float));
}

/* Llama 3.1's rescaling of one rotary frequency (scale 8, low/high frequency factors 1 and 4,
 * original context 8192): long wavelengths slow down 8x, short ones stay, a smooth blend
 * between. */
static double scaled_freq(double f) {
    const double scale = 8.0, low = 1.0, high = 4.0, old_ctx = 8192.0;
    double wavelen = 2.0 * M_PI / f;
    if (wavelen < old_ctx / high) return f;
    if (wavelen > old_ctx / low) return f / scale;
    double smooth = (old_ctx / wavelen - low) / (high - low);
    return (1.0 - smooth) * f / scale + smooth * f;
}

/* cos and sin of t * theta^(-2i/HS) (scaled if asked), for t < T and i < HS/2. */
void llama_rope_tables(const model_config *c, int T, float *fcos, float *fsin) {
    int HS = c->C / c->NH, half = HS / 2;
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow((double)c->rope_theta, (double)(2 * i) / HS);
        if (c->use_scaled_rope) f = scaled_freq(f);
        for (int t = 0; t < T; t++) {
            double a = (double)t * f;
            fcos[(size_t)t * half + i] = (float)cos(a);
            fsin[(size_t)t * half + i] = (float)sin(a);
        }
    }
}

/* x = x + attproj(attn(rope(qkv(rms1(x)))));  x = x + fcproj(fc(h) * silu(fc2(h))), h = rms2(x).
 * The unrotated projections go to the scratch: only the rotated ones are kept. */
int llama_block_forward(const backend *be, const block_dims *d, const block_params *p, block_acts *a,
                        const float *x) {
    int N = d->N, C = d->C, H = d->H, QKV = d->QKV;
    PL_TRY(be->rmsnorm_fwd(a->ln1, a->ln1_rstd, x, p->ln1w, N, C, d->eps));
    PL_TRY(be->matmul_fwd(d->scratch, a->ln1, p->qkvw, NULL, N, C, QKV));               // (N, QKV)
    PL_TRY(be->rope_fwd(a->qkv, d->scratch, d->fcos, d->fsin, N, d->T, d->NH, d->NKV, d->HS));
    PL_TRY(be->attention_gqa_fwd(a->atty, a->att, a->qkv, d->B, d->T, d->NH, d->NKV, d->HS)); // (N, C)
    PL_TRY(be->matmul_fwd(a->res2, a->atty, p->attprojw, NULL, N, C, C));
    PL_TRY(be->residual_fwd(a->res2, a->res2, x, (size_t)N * C));
    PL_TRY(be->rmsnorm_fwd(a->ln2, a->ln2_rstd, a->res2, p->ln2w, N, C, d->eps));
    PL_TRY(be->matmul_fwd(a->fch, a->ln2, p->fcw, NULL, N, C, H));                      // up (N, H)
    PL_TRY(be->matmul_fwd(a->fch2, a->ln2, p->fc2w, NULL, N, C, H));                    // gate (N, H)
    PL_TRY(be->swiglu_fwd(a->fch_gelu, a->fch, a->fch2, (size_t)N * H));
    PL_TRY(be->matmul_fwd(a->res3, a->fch_gelu, p->fcprojw, NULL, N, H, C));
    return be->residual_fwd(a->res3, a->res3, a->res2, (size_t)N * C);
}

/* dL/dx through the block in reverse op order, dres updated in place; every weight op's
 * output gradient lands in dd (qkv's is the gradient before the rotation). */
int llama_block_backward_input(const backend *be, const block_dims *d, const block_params *p,
                               const block_acts *a, const float *x, float *dres, const block_douts *dd) {
    int N = d->N, C = d->C, H = d->H, QKV = d->QKV;
    size_t nc = (size_t)N * C * sizeof(float);
    /* res3 = res2 + fcproj(up * silu(gate)) */
    PL_TRY(be->copy(dd->fcproj, dres, nc));
    PL_TRY(be->matmul_bwd_input(d->scratch, dres, p->fcprojw, N, H, C));          // d(product) (N, H)
    PL_TRY(be->swiglu_bwd(dd->fc, dd->fc2, d->scratch, a->fch, a->fch2, (size_t)N * H));
    PL_TRY(be->matmul_bwd_input(dd->ln2, dd->fc, p->fcw, N, C, H));               // (N, C)
    PL_TRY(be->matmul_bwd_input(d->scratch, dd->fc2, p->fc2w, N, C, H));          // (N, C)
    PL_TRY(be->add_inplace(dd->ln2, d->scratch, (size_t)N * C));
    PL_TRY(be->rmsnorm_bwd_input(dres, dd->ln2, a->res2, p->ln2w, a->ln2_rstd, N, C));
    /* res2 = x + attproj(attn(rope(qkv(rms1(x))))) */
    PL_TRY(be->copy(dd->attproj, dres, nc));
    PL_TRY(be->matmul_bwd_input(dd->ln1, dres, p->attprojw, N, C, C));            // d(atty)
    PL_TRY(be->attention_gqa_bwd(d->scratch, dd->ln1, a->qkv, a->att, d->B, d->T, d->NH, d->NKV, d->HS));
    PL_TRY(be->rope_bwd(dd->qkv, d->scratch, d->fcos, d->fsin, N, d->T, d->NH, d->NKV, d->HS));
    PL_TRY(be->matmul_bwd_input(dd->ln1, dd->qkv, p->qkvw, N, C, QKV));           // (N, C)
    return be->rmsnorm_bwd_input(dres, dd->ln1, x, p->ln1w, a->ln1_rstd, N, C);
}

/* dW += dY^T X for the block's five matrices and the two RMSNorm weight sums. */
int llama_block_backward_weight(const backend *be, const block_dims *d, block_params *g, const block_acts *a,
                                const float *x, const block_douts *dd) {
    int N = d->N, C = d->C, H = d->H, QKV = d->QKV;
    PL_TRY(be->matmul_bwd_weight(g->fcprojw, NULL, dd->fcproj, a->fch_gelu, N, H, C));
    PL_TRY(be->matmul_bwd_weight(g->fcw, NULL, dd->fc, a->ln2, N, C, H));
    PL_TRY(be->matmul_bwd_weight(g->fc2w, NULL, dd->fc2, a->ln2, N, C, H));
    PL_TRY(be->rmsnorm_bwd_weight(g->ln2w, dd->ln2, a->res2, a->ln2_rstd, N, C));
    PL_TRY(be->matmul_bwd_weight(g->attprojw, NULL, dd->attproj, a->atty, N, C, C));
    PL_TRY(be->matmul_bwd_weight(g->qkvw, NULL, dd->qkv, a->ln1, N, C, QKV));
    return be->rmsnorm_bwd_weight(g->ln1w, dd->ln1, x, a->ln1_rstd, N, C);
}
