/*
 * model.c — GPT-2 (as llm.c defines it): its descriptor (the rows of arch.h) and the math of
 * one block, of the embedding and of the final LayerNorm, as calls to the backend.
 *
 * Straight-line llm.c-style code, in the order the paper writes the model:
 *   x = wte[tok] + wpe[pos]
 *   per block: x = x + attproj(attn(qkv(ln1(x))));  x = x + fcproj(gelu(fc(ln2(x))))
 *   logits = lnf(x) wte^T;  loss = mean cross-entropy over the V real columns
 * The head is tied: its output matrix is wte. Shapes use B (micro-batch sequences) T C NH L
 * V, N = B*T rows.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include "model/arch.h"
#include "util/common.h"
#include "util/json.h"
#include "formats/llmc.h"

/* GPT-2's tables, each indexed by its own enum. */
enum { GE_WTE, GE_WPE };                                          /* embeddings */
enum { G_LN1W, G_LN1B, G_QKVW, G_QKVB, G_ATTPROJW, G_ATTPROJB, G_LN2W, G_LN2B, G_FCW, G_FCB, G_FCPROJW,
       G_FCPROJB };                                               /* one block */
enum { GH_LNFW, GH_LNFB, GH_WTE };                                /* the head */
enum { GA_LN1, GA_LN1_MEAN, GA_LN1_RSTD, GA_QKV, GA_ATT, GA_ATTY, GA_RES2, GA_LN2, GA_LN2_MEAN, GA_LN2_RSTD,
       GA_FCH, GA_FCH_GELU, GA_RES3 };                            /* a block's activations */
enum { GD_FCPROJ, GD_FC, GD_LN2, GD_ATTPROJ, GD_QKV, GD_LN1 };    /* its output gradients */
enum { GHA_LNF, GHA_MEAN, GHA_RSTD, GHA_DLNF };                   /* the head's activations */

/* name, kind, rows, cols, decay, init, file index, file rows, mfu, hf name, tied */
static const arch_param gpt2_embed[] = {
    {"wte", P_WTE, AD_VP, AD_C, 1, INIT_NORMAL, 0, AD_VP, 1, "wte.weight", -1},
    {"wpe", P_WPE, AD_MAXT, AD_C, 1, INIT_NORMAL, 1, AD_MAXT, 1, "wpe.weight", -1},
};
static const arch_param gpt2_block[] = {
    {"ln1_w", P_LN1W, AD_C, AD_NONE, 0, INIT_ONE, 2, AD_C, 1, "h.%d.ln_1.weight", -1},
    {"ln1_b", P_LN1B, AD_C, AD_NONE, 0, INIT_ZERO, 3, AD_C, 1, "h.%d.ln_1.bias", -1},
    {"qkv_w", P_QKVW, AD_QKV, AD_C, 1, INIT_NORMAL, 4, AD_QKV, 1, "~h.%d.attn.c_attn.weight", -1},
    {"qkv_b", P_QKVB, AD_QKV, AD_NONE, 0, INIT_ZERO, 5, AD_QKV, 1, "h.%d.attn.c_attn.bias", -1},
    {"attproj_w", P_ATTPROJW, AD_C, AD_CA, 1, INIT_RESID, 6, AD_C, 1, "~h.%d.attn.c_proj.weight", -1},
    {"attproj_b", P_ATTPROJB, AD_C, AD_NONE, 0, INIT_ZERO, 7, AD_C, 1, "h.%d.attn.c_proj.bias", -1},
    {"ln2_w", P_LN2W, AD_C, AD_NONE, 0, INIT_ONE, 8, AD_C, 1, "h.%d.ln_2.weight", -1},
    {"ln2_b", P_LN2B, AD_C, AD_NONE, 0, INIT_ZERO, 9, AD_C, 1, "h.%d.ln_2.bias", -1},
    {"fc_w", P_FCW, AD_H, AD_C, 1, INIT_NORMAL, 10, AD_H, 1, "~h.%d.mlp.c_fc.weight", -1},
    {"fc_b", P_FCB, AD_H, AD_NONE, 0, INIT_ZERO, 11, AD_H, 1, "h.%d.mlp.c_fc.bias", -1},
    {"fcproj_w", P_FCPROJW, AD_C, AD_H, 1, INIT_RESID, 12, AD_C, 1, "~h.%d.mlp.c_proj.weight", -1},
    {"fcproj_b", P_FCPROJB, AD_C, AD_NONE, 0, INIT_ZERO, 13, AD_C, 1, "h.%d.mlp.c_proj.bias", -1},
};
static const arch_param gpt2_head[] = {
    {"lnf_w", P_LNFW, AD_C, AD_NONE, 0, INIT_ONE, 14, AD_C, 1, "ln_f.weight", -1},
    {"lnf_b", P_LNFB, AD_C, AD_NONE, 0, INIT_ZERO, 15, AD_C, 1, "ln_f.bias", -1},
    {"wte", P_WTE, AD_VP, AD_C, 1, INIT_NORMAL, -1, AD_VP, 1, NULL, GE_WTE}, /* tied: the head reads wte */
};
/* name, floats per token, modes that keep it per slot */
static const arch_act gpt2_acts[] = {
    {"ln1", AD_C, KEEP_NONE | KEEP_SELECTIVE}, {"ln1_mean", AD_1, KEEP_NONE | KEEP_SELECTIVE},
    {"ln1_rstd", AD_1, KEEP_NONE | KEEP_SELECTIVE}, {"qkv", AD_QKV, KEEP_NONE | KEEP_SELECTIVE},
    {"att", AD_NHT, KEEP_NONE}, {"atty", AD_C, KEEP_NONE | KEEP_SELECTIVE},
    {"res2", AD_C, KEEP_NONE | KEEP_SELECTIVE}, {"ln2", AD_C, KEEP_NONE | KEEP_SELECTIVE},
    {"ln2_mean", AD_1, KEEP_NONE | KEEP_SELECTIVE}, {"ln2_rstd", AD_1, KEEP_NONE | KEEP_SELECTIVE},
    {"fch", AD_H, KEEP_NONE | KEEP_SELECTIVE}, {"fch_gelu", AD_H, KEEP_NONE | KEEP_SELECTIVE},
    {"res3", AD_C, KEEP_ALL},
};
static const arch_act gpt2_douts[] = {
    {"fcproj", AD_C, KEEP_ALL}, {"fc", AD_H, KEEP_ALL}, {"ln2", AD_C, KEEP_ALL},
    {"attproj", AD_C, KEEP_ALL}, {"qkv", AD_QKV, KEEP_ALL}, {"ln1", AD_C, KEEP_ALL},
};
static const arch_act gpt2_head_acts[] = {
    {"lnf", AD_C, KEEP_ALL}, {"lnf_mean", AD_1, KEEP_ALL}, {"lnf_rstd", AD_1, KEEP_ALL}, {"dlnf", AD_C, KEEP_ALL},
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


/* The options' GPT-2 (nothing beyond the dimensions). */
static int gpt2_from_options(const pl_options *o, int V, model_config *cfg, char *err, size_t errlen) {
    return gpt2_config_make(cfg, V, o->max_seq_len, o->n_layer, o->n_head, o->n_embd, err, errlen);
}

/* GPT-2 has no settings beyond the dimensions gpt2_config_make bounds: nothing to check,
 * nothing an --init file could conflict with, nothing else a file must agree on. */
static int gpt2_check(const model_config *c, cfg_naming naming, char *err, size_t errlen) {
    (void)c; (void)naming; (void)err; (void)errlen;
    return PL_OK;
}
static int gpt2_conflicts(const pl_options *o, const model_config *c, char *err, size_t errlen) {
    (void)o; (void)c; (void)err; (void)errlen;
    return PL_OK;
}
static int gpt2_same(const model_config *f, const model_config *r, cfg_naming naming, char *err, size_t errlen) {
    (void)f; (void)r; (void)naming; (void)err; (void)errlen;
    return PL_OK;
}

/* The banner's model line. */
static void gpt2_describe(const model_config *c, char *buf, size_t len) {
    snprintf(buf, len, "V=%d (padded %d) C=%d L=%d NH=%d maxT=%d", c->V, c->Vp, c->C, c->L, c->NH, c->maxT);
}

/* x = x + attproj(attn(qkv(ln1(x))));  x = x + fcproj(gelu(fc(ln2(x)))). With --tp each rank
 * holds a slice of the heads (qkv, attention) and of the MLP (fc): the two output products
 * give partial sums, summed over the ranks (model_tp_sum) with the bias added once. */
static int gpt2_block_forward(const backend *be, const block_dims *d, float *const *p, float *const *a,
                              const float *x) {
    int N = d->N, C = d->C, H = d->H, CA = d->NH * d->HS;
    PL_TRY(be->layernorm_fwd(a[GA_LN1], a[GA_LN1_MEAN], a[GA_LN1_RSTD], x, p[G_LN1W], p[G_LN1B], N, C));
    PL_TRY(be->matmul_fwd(a[GA_QKV], a[GA_LN1], p[G_QKVW], p[G_QKVB], N, C, d->QKV));          // (N, 3C)
    PL_TRY(model_attention_fwd(be, d, a[GA_ATTY], a[GA_ATT], a[GA_QKV], d->NH)); // (N, C)
    PL_TRY(be->matmul_fwd(a[GA_RES2], a[GA_ATTY], p[G_ATTPROJW], d->cfg->tpr ? NULL : p[G_ATTPROJB], N, CA, C)); // (N, C)
    PL_TRY(model_tp_sum(d, a[GA_RES2], (size_t)N * C, TP_PHASE_FWD));
    PL_TRY(be->residual_fwd(a[GA_RES2], a[GA_RES2], x, (size_t)N * C));
    PL_TRY(be->layernorm_fwd(a[GA_LN2], a[GA_LN2_MEAN], a[GA_LN2_RSTD], a[GA_RES2], p[G_LN2W], p[G_LN2B], N, C));
    PL_TRY(be->matmul_fwd(a[GA_FCH], a[GA_LN2], p[G_FCW], p[G_FCB], N, C, H));                 // (N, 4C)
    PL_TRY(be->gelu_fwd(a[GA_FCH_GELU], a[GA_FCH], (size_t)N * H));
    PL_TRY(be->matmul_fwd(a[GA_RES3], a[GA_FCH_GELU], p[G_FCPROJW], d->cfg->tpr ? NULL : p[G_FCPROJB], N, H, C)); // (N, C)
    PL_TRY(model_tp_sum(d, a[GA_RES3], (size_t)N * C, TP_PHASE_FWD));
    return be->residual_fwd(a[GA_RES3], a[GA_RES3], a[GA_RES2], (size_t)N * C);
}

/* dL/dx through the block, dres updated in place, in reverse op order; every weight op's
 * output gradient lands in dd (the residual gradients are copied: dres moves on). With --tp
 * the gradients of the two norms' outputs are partial sums until summed over the ranks. */
static int gpt2_block_backward_input(const backend *be, const block_dims *d, float *const *p, float *const *a,
                                     const float *x, float *dres, float *const *dd) {
    int N = d->N, C = d->C, H = d->H, CA = d->NH * d->HS;
    size_t nc = (size_t)N * C * sizeof(float);
    /* res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
    PL_TRY(be->copy(dd[GD_FCPROJ], dres, nc));
    PL_TRY(be->matmul_bwd_input(dd[GD_FC], dres, p[G_FCPROJW], N, H, C));           // (N, 4C)
    PL_TRY(be->gelu_bwd(dd[GD_FC], a[GA_FCH], dd[GD_FC], (size_t)N * H));
    PL_TRY(be->matmul_bwd_input(dd[GD_LN2], dd[GD_FC], p[G_FCW], N, C, H));         // (N, C)
    PL_TRY(model_tp_sum(d, dd[GD_LN2], (size_t)N * C, TP_PHASE_BWD));
    PL_TRY(be->layernorm_bwd_input(dres, dd[GD_LN2], a[GA_RES2], p[G_LN2W], a[GA_LN2_MEAN], a[GA_LN2_RSTD], N, C));
    /* res2 = x + attproj(attn(qkv(ln1(x)))) */
    PL_TRY(be->copy(dd[GD_ATTPROJ], dres, nc));
    PL_TRY(be->matmul_bwd_input(dd[GD_LN1], dres, p[G_ATTPROJW], N, CA, C));        // (N, C) d(atty)
    PL_TRY(model_attention_bwd(be, d, dd[GD_QKV], dd[GD_LN1], a[GA_QKV], a[GA_ATT], d->NH));
    PL_TRY(be->matmul_bwd_input(dd[GD_LN1], dd[GD_QKV], p[G_QKVW], N, C, d->QKV));  // (N, C)
    PL_TRY(model_tp_sum(d, dd[GD_LN1], (size_t)N * C, TP_PHASE_BWD));
    return be->layernorm_bwd_input(dres, dd[GD_LN1], x, p[G_LN1W], a[GA_LN1_MEAN], a[GA_LN1_RSTD], N, C);
}

/* dW += dY^T X and the bias / LayerNorm sums of the block, in the input part's op order.
 * With --tp a row-parallel product's bias gradient is the same on every rank (dY is whole). */
static int gpt2_block_backward_weight(const backend *be, const block_dims *d, float *const *g, float *const *a,
                                      const float *x, float *const *dd) {
    int N = d->N, C = d->C, H = d->H, CA = d->NH * d->HS;
    PL_TRY(be->matmul_bwd_weight(g[G_FCPROJW], g[G_FCPROJB], dd[GD_FCPROJ], a[GA_FCH_GELU], N, H, C));
    PL_TRY(be->matmul_bwd_weight(g[G_FCW], g[G_FCB], dd[GD_FC], a[GA_LN2], N, C, H));
    PL_TRY(be->layernorm_bwd_weight(g[G_LN2W], g[G_LN2B], dd[GD_LN2], a[GA_RES2], a[GA_LN2_MEAN], a[GA_LN2_RSTD], N,
                                    C));
    PL_TRY(be->matmul_bwd_weight(g[G_ATTPROJW], g[G_ATTPROJB], dd[GD_ATTPROJ], a[GA_ATTY], N, CA, C));
    PL_TRY(be->matmul_bwd_weight(g[G_QKVW], g[G_QKVB], dd[GD_QKV], a[GA_LN1], N, C, d->QKV));
    return be->layernorm_bwd_weight(g[G_LN1W], g[G_LN1B], dd[GD_LN1], x, a[GA_LN1_MEAN], a[GA_LN1_RSTD], N, C);
}

/* Selective recomputation dropped the probabilities: recompute them (the output is rewritten
 * with the bits it had). */
static int gpt2_recompute_selective(const backend *be, const block_dims *d, float *const *a) {
    return model_attention_fwd(be, d, a[GA_ATTY], a[GA_ATT], a[GA_QKV], d->NH);
}

/* x = wte[tok] + wpe[pos], and its gradient. On a CP rank's stage (cfg->cp > 1) each sequence's
 * two chunks are contiguous runs of positions (model_cp_pos): one call each, at its rows of wpe. */
static int gpt2_embed_forward(const backend *be, const block_dims *d, float *const *p, float *x, const int *tok) {
    if (d->cfg->cp <= 1) return be->encoder_fwd(x, tok, p[GE_WTE], p[GE_WPE], d->N, d->T, d->C);
    int cs = d->T / 2;
    for (int r = 0; r < d->N; r += cs) /* the chunks of the B sequences in row order */
        PL_TRY(be->encoder_fwd(x + (size_t)r * d->C, tok + r, p[GE_WTE],
                               p[GE_WPE] + (size_t)model_cp_pos(d->cfg, d->T, r % d->T) * d->C, cs, cs, d->C));
    return PL_OK;
}
static int gpt2_embed_backward(const backend *be, const block_dims *d, float *const *g, const float *dx,
                               const int *tok) {
    if (d->cfg->cp <= 1) return be->encoder_bwd(g[GE_WTE], g[GE_WPE], dx, tok, d->N, d->T, d->C);
    int cs = d->T / 2;
    for (int r = 0; r < d->N; r += cs)
        PL_TRY(be->encoder_bwd(g[GE_WTE], g[GE_WPE] + (size_t)model_cp_pos(d->cfg, d->T, r % d->T) * d->C,
                               dx + (size_t)r * d->C, tok + r, cs, cs, d->C));
    return PL_OK;
}

/* The final LayerNorm, its input part (into dres) and its weight part. */
static int gpt2_head_norm_forward(const backend *be, const block_dims *d, float *const *p, float *const *a,
                                  const float *x) {
    return be->layernorm_fwd(a[GHA_LNF], a[GHA_MEAN], a[GHA_RSTD], x, p[GH_LNFW], p[GH_LNFB], d->N, d->C);
}
static int gpt2_head_norm_backward_input(const backend *be, const block_dims *d, float *const *p, float *const *a,
                                         const float *x, float *dres) {
    return be->layernorm_bwd_input(dres, a[GHA_DLNF], x, p[GH_LNFW], a[GHA_MEAN], a[GHA_RSTD], d->N, d->C);
}
static int gpt2_head_norm_backward_weight(const backend *be, const block_dims *d, float *const *g, float *const *a,
                                          const float *x) {
    return be->layernorm_bwd_weight(g[GH_LNFW], g[GH_LNFB], a[GHA_DLNF], x, a[GHA_MEAN], a[GHA_RSTD], d->N, d->C);
}

/* llm.c's GPT-2 header: 256 int32 (magic, version, maxT, V, L, NH, C, Vp). */
static void gpt2_header_write(const model_config *c, void *hdr) {
    int32_t *h = hdr;
    h[0] = LLMC_MODEL_MAGIC; h[1] = 3; h[2] = c->maxT; h[3] = c->V; h[4] = c->L;
    h[5] = c->NH; h[6] = c->C; h[7] = c->Vp;
}
static int gpt2_header_read(const char *path, const void *hdr, size_t got, model_config *cfg, char *err,
                            size_t errlen) {
    const int32_t *h = hdr;
    char e2[512];
    (void)got;
    if (gpt2_config_make(cfg, h[3], h[2], h[4], h[5], h[6], e2, sizeof e2) != PL_OK) {
        snprintf(err, errlen, "model file %s: bad header: %s", path, e2);
        return PL_EIO;
    }
    if (h[7] != cfg->Vp) {
        snprintf(err, errlen, "model file %s: padded vocab %d is not V=%d rounded up to 128 (%d)",
                 path, h[7], cfg->V, cfg->Vp);
        return PL_EIO;
    }
    return PL_OK;
}

/* No /config attributes beyond the common ones. */
static void gpt2_attrs_of(const model_config *c, long long *ints, double *f64) { (void)c; (void)ints; (void)f64; }
static int gpt2_of_attrs(const long long *k, const long long *ints, const double *f64, model_config *cfg, char *err,
                         size_t errlen) {
    char e2[256];
    (void)ints; (void)f64;
    if (gpt2_config_make(cfg, (int)k[0], (int)k[2], (int)k[3], (int)k[4], (int)k[5], e2, sizeof e2) != PL_OK) {
        snprintf(err, errlen, "bad /config: %s", e2);
        return PL_EIO;
    }
    return PL_OK;
}

static int gpt2_block_decode(const backend *be, const block_dims *d, float *const *p, float *const *a,
                             const kv_batch *kv, const float *x);
static int gpt2_embed_decode(const backend *be, const block_dims *d, float *const *p, float *x, const int *tok,
                             const kv_batch *kv);
/* Names a Hugging Face GPT-2 file may hold that the model does not read: the causal-mask
 * buffers of old transformers versions and the tied lm_head. */
static const char *const gpt2_hf_ignore[] = {"h.%d.attn.bias", "h.%d.attn.masked_bias", "lm_head.weight", NULL};

/* GPT2LMHeadModel's config.json: the dimensions, and refusals of what llm.c's GPT-2 is not
 * (another LayerNorm epsilon, another activation, an MLP width other than 4 n_embd). */
static int gpt2_hf_config(const void *j, const char *path, model_config *cfg, char *err, size_t errlen) {
    long long V = 0, T = 0, L = 0, NH = 0, C = 0, inner = -1;
    PL_TRY(hf_json_int(j, path, "vocab_size", 1, 1, GPT2_MAX_VOCAB, &V, err, errlen));
    PL_TRY(hf_json_int(j, path, "n_positions", 1, 1, GPT2_MAX_SEQ, &T, err, errlen));
    PL_TRY(hf_json_int(j, path, "n_embd", 1, 1, GPT2_MAX_EMBD, &C, err, errlen));
    PL_TRY(hf_json_int(j, path, "n_layer", 1, 1, GPT2_MAX_LAYER, &L, err, errlen));
    PL_TRY(hf_json_int(j, path, "n_head", 1, 1, GPT2_MAX_EMBD, &NH, err, errlen));
    PL_TRY(hf_json_int(j, path, "n_inner", 0, 1, 1LL << 31, &inner, err, errlen));
    double eps = 1e-5;
    PL_TRY(hf_json_num(j, path, "layer_norm_epsilon", 0, 0, 1, &eps, err, errlen));
    const char *act = hf_json_str(j, "activation_function");
    if ((float)eps != 1e-5f || (act && strcmp(act, "gelu_new") != 0 && strcmp(act, "gelu_pytorch_tanh") != 0) ||
        (inner != -1 && inner != 4 * C)) {
        snprintf(err, errlen, "%s: %s is not llm.c's GPT-2 (layer_norm_epsilon 1e-5, activation_function gelu_new, "
                 "n_inner 4 n_embd)", path, (float)eps != 1e-5f ? "layer_norm_epsilon" : inner != -1 && inner != 4 * C ?
                 "n_inner" : "activation_function");
        return PL_EIO;
    }
    char e2[400];
    if (gpt2_config_make(cfg, (int)V, (int)T, (int)L, (int)NH, (int)C, e2, sizeof e2) != PL_OK) {
        snprintf(err, errlen, "%s: %s", path, e2);
        return PL_EIO;
    }
    return PL_OK;
}

/* config.json of a GPT2LMHeadModel ("architectures" as one string; hf_save makes it a list). */
static void gpt2_hf_config_write(const model_config *c, void *j) {
    hf_json_set_str(j, "architectures", "GPT2LMHeadModel");
    hf_json_set_int(j, "vocab_size", c->V);
    hf_json_set_int(j, "n_positions", c->maxT);
    hf_json_set_int(j, "n_ctx", c->maxT);
    hf_json_set_int(j, "n_embd", c->C);
    hf_json_set_int(j, "n_layer", c->L);
    hf_json_set_int(j, "n_head", c->NH);
    hf_json_set_str(j, "activation_function", "gelu_new");
    hf_json_set_num(j, "layer_norm_epsilon", 1e-5);
    hf_json_set_bool(j, "tie_word_embeddings", 1);
}

const model_arch arch_gpt2 = {
    .name = "gpt2", .id = MODEL_GPT2,
    .embed = ARCH_ROWS(gpt2_embed), .block = ARCH_ROWS(gpt2_block), .head = ARCH_ROWS(gpt2_head),
    .acts = ARCH_ROWS(gpt2_acts), .douts = ARCH_ROWS(gpt2_douts), .head_acts = ARCH_ROWS(gpt2_head_acts),
    .scratch = NULL, .nscratch = 0,
    .block_out = GA_RES3, .head_out = GHA_LNF, .head_dout = GHA_DLNF, .head_matrix = GH_WTE, .tied = 1,
    .head_desc = "the final LayerNorm",
    .config_from_options = gpt2_from_options, .config_check = gpt2_check, .init_conflicts = gpt2_conflicts,
    .same_settings = gpt2_same, .describe = gpt2_describe,
    .block_forward = gpt2_block_forward, .block_backward_input = gpt2_block_backward_input,
    .block_backward_weight = gpt2_block_backward_weight, .block_recompute_selective = gpt2_recompute_selective,
    .embed_forward = gpt2_embed_forward, .embed_backward = gpt2_embed_backward,
    .head_norm_forward = gpt2_head_norm_forward, .head_norm_backward_input = gpt2_head_norm_backward_input,
    .head_norm_backward_weight = gpt2_head_norm_backward_weight, .scratch_fill = NULL,
    .magic = LLMC_MODEL_MAGIC, .header_bytes = 1024, .file_desc = "an llm.c GPT-2 model file",
    .llmc_header_write = gpt2_header_write, .llmc_header_read = gpt2_header_read,
    .attr_int = NULL, .nattr_int = 0, .attr_f64 = NULL, .nattr_f64 = 0,
    .attrs_of = gpt2_attrs_of, .config_of_attrs = gpt2_of_attrs,
    .block_decode = gpt2_block_decode, .embed_decode = gpt2_embed_decode,
    .hf_model_type = "gpt2", .hf_ignore = gpt2_hf_ignore, .hf_config_read = gpt2_hf_config,
    .hf_config_write = gpt2_hf_config_write,
};

/* ---- decoding with a KV cache (kvcache.h) ---- */

/* The block over an item's rows: as gpt2_block_forward, with the attention of each segment
 * over its sequence's cache (the new keys and values appended to it). */
static int gpt2_block_decode(const backend *be, const block_dims *d, float *const *p, float *const *a,
                             const kv_batch *kv, const float *x) {
    int N = d->N, C = d->C, NH = d->NH, HS = C / NH;
    PL_TRY(be->layernorm_fwd(a[GA_LN1], a[GA_LN1_MEAN], a[GA_LN1_RSTD], x, p[G_LN1W], p[G_LN1B], N, C));
    PL_TRY(be->matmul_decode_fwd(a[GA_QKV], a[GA_LN1], p[G_QKVW], p[G_QKVB], N, C, 3 * C));
    for (int i = 0; i < kv->nseg; i++) {
        const kv_seg *s = &kv->seg[i];
        PL_TRY(be->attention_kv_fwd(a[GA_ATTY] + (size_t)s->row * C, s->k, s->v, a[GA_QKV] + (size_t)s->row * 3 * C,
                                    s->pos, s->n, NH, NH, HS));
    }
    PL_TRY(be->matmul_decode_fwd(a[GA_RES2], a[GA_ATTY], p[G_ATTPROJW], p[G_ATTPROJB], N, C, C));
    PL_TRY(be->residual_fwd(a[GA_RES2], a[GA_RES2], x, (size_t)N * C));
    PL_TRY(be->layernorm_fwd(a[GA_LN2], a[GA_LN2_MEAN], a[GA_LN2_RSTD], a[GA_RES2], p[G_LN2W], p[G_LN2B], N, C));
    PL_TRY(be->matmul_decode_fwd(a[GA_FCH], a[GA_LN2], p[G_FCW], p[G_FCB], N, C, 4 * C));
    PL_TRY(be->gelu_fwd(a[GA_FCH_GELU], a[GA_FCH], (size_t)N * 4 * C));
    PL_TRY(be->matmul_decode_fwd(a[GA_RES3], a[GA_FCH_GELU], p[G_FCPROJW], p[G_FCPROJB], N, 4 * C, C));
    return be->residual_fwd(a[GA_RES3], a[GA_RES3], a[GA_RES2], (size_t)N * C);
}

/* x = wte[tok] + wpe[pos] for each segment's rows (the position table from its first position). */
static int gpt2_embed_decode(const backend *be, const block_dims *d, float *const *p, float *x, const int *tok,
                             const kv_batch *kv) {
    int C = d->C;
    for (int i = 0; i < kv->nseg; i++) {
        const kv_seg *s = &kv->seg[i];
        PL_TRY(be->encoder_fwd(x + (size_t)s->row * C, tok + s->row, p[GE_WTE], p[GE_WPE] + (size_t)s->pos * C, s->n,
                               s->n, C));
    }
    return PL_OK;
}
