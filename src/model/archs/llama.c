/*
 * model_llama.c — Llama 3 (as Meta defines it and llm.c's train_llama3.py writes it): its
 * descriptor (the rows of arch.h), the rotary tables, and the math of one block, of the
 * embedding and of the final RMSNorm as backend calls.
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
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/arch.h"
#include "util/common.h"
#include "model/model_check.h"
#include "util/json.h"
#include "formats/llmc.h"

/* Llama's tables, each indexed by its own enum. */
enum { LE_WTE };                                                             /* embeddings */
enum { L_ATTNORM, L_QKVW, L_ATTPROJW, L_MLPNORM, L_FCW, L_FC2W, L_FCPROJW }; /* one block */
enum { LH_NORM, LH_LMHEAD };                                                 /* the head */
enum { LA_ATTNORM, LA_ATTNORM_RSTD, LA_QKV, LA_ATT, LA_ATTY, LA_RES2, LA_MLPNORM, LA_MLPNORM_RSTD, LA_UP, LA_GATE,
       LA_PROD, LA_RES3 };                                                   /* a block's activations */
enum { LD_FCPROJ, LD_UP, LD_GATE, LD_MLPNORM, LD_ATTPROJ, LD_QKV, LD_ATTNORM }; /* its output gradients */
enum { LHA_NORM, LHA_RSTD, LHA_DNORM };                                      /* the head's activations */
enum { LX_COS, LX_SIN, LX_SCRATCH, LX_ZERO_POS, LX_DZERO_POS };              /* stage scratch */

/* name, kind, rows, cols, decay, init, file index, file rows, mfu, hf name, tied. The file
 * indices are llm.c's train_llama3.py write_tensors slots: GPT-2's 16, lm_head in wpe's, up
 * and gate packed per layer in fcw's, the bias slots zeros (llama_llmc_zeros). */
static const arch_param llama_embed[] = {
    /* a lookup: not in the MFU */
    {"wte", P_WTE, AD_VP, AD_C, 1, INIT_NORMAL, 0, AD_V, 0, "model.embed_tokens.weight", -1},
};
static const arch_param llama_block[] = {
    {"attn_norm_w", P_ATTNORMW, AD_C, AD_NONE, 0, INIT_ONE, 2, AD_C, 1, "model.layers.%d.input_layernorm.weight",
     -1},
    /* q and k stored permuted for rotate-half RoPE ('^'), stacked with v */
    {"qkv_w", P_QKVW, AD_QKV, AD_C, 1, INIT_NORMAL, 4, AD_QKV, 1,
     "^model.layers.%d.self_attn.q_proj.weight|^model.layers.%d.self_attn.k_proj.weight|"
     "model.layers.%d.self_attn.v_proj.weight", -1},
    {"attproj_w", P_ATTPROJW, AD_C, AD_CA, 1, INIT_RESID, 6, AD_C, 1, "model.layers.%d.self_attn.o_proj.weight", -1},
    {"mlp_norm_w", P_MLPNORMW, AD_C, AD_NONE, 0, INIT_ONE, 8, AD_C, 1,
     "model.layers.%d.post_attention_layernorm.weight", -1},
    /* up: fcw's first half; gate: its second half */
    {"fc_w", P_FCW, AD_H, AD_C, 1, INIT_NORMAL, 10, AD_H, 1, "model.layers.%d.mlp.up_proj.weight", -1},
    {"fc2_w", P_FC2W, AD_H, AD_C, 1, INIT_NORMAL, 10, AD_H, 1, "model.layers.%d.mlp.gate_proj.weight", -1},
    {"fcproj_w", P_FCPROJW, AD_C, AD_H, 1, INIT_RESID, 12, AD_C, 1, "model.layers.%d.mlp.down_proj.weight", -1},
};
static const arch_param llama_head[] = {
    {"lnf_w", P_LNFW, AD_C, AD_NONE, 0, INIT_ONE, 14, AD_C, 1, "model.norm.weight", -1},
    {"lm_head", P_LMHEAD, AD_VP, AD_C, 1, INIT_NORMAL, 1, AD_V, 1, "lm_head.weight", -1}, /* in GPT-2's wpe slot */
};
/* the zero bias slots of llm.c's Llama 3 file (llm.c's names), per block and of the head */
static const arch_param llama_zero_block[] = {
    {"ln1b", P_LN1B, AD_C, AD_NONE, 0, INIT_ZERO, 3, AD_C, 0, NULL, -1},
    {"qkvb", P_QKVB, AD_QKV, AD_NONE, 0, INIT_ZERO, 5, AD_QKV, 0, NULL, -1},
    {"attprojb", P_ATTPROJB, AD_C, AD_NONE, 0, INIT_ZERO, 7, AD_C, 0, NULL, -1},
    {"ln2b", P_LN2B, AD_C, AD_NONE, 0, INIT_ZERO, 9, AD_C, 0, NULL, -1},
    {"fcb", P_FCB, AD_H, AD_NONE, 0, INIT_ZERO, 11, AD_H, 0, NULL, -1},  /* (2H): c_fc's half */
    {"fcb", P_FCB, AD_H, AD_NONE, 0, INIT_ZERO, 11, AD_H, 0, NULL, -1},  /* c_fc2's half */
    {"fcprojb", P_FCPROJB, AD_C, AD_NONE, 0, INIT_ZERO, 13, AD_C, 0, NULL, -1},
};
static const arch_param llama_zero_head[] = {
    {"lnfb", P_LNFB, AD_C, AD_NONE, 0, INIT_ZERO, 15, AD_C, 0, NULL, -1},
};
#define K_NS (KEEP_NONE | KEEP_SELECTIVE)
/* name, floats per token, modes that keep it per slot */
static const arch_act llama_acts[] = {
    {"attn_norm", AD_C, K_NS}, {"attn_norm_rstd", AD_1, K_NS}, {"qkv", AD_QKV, K_NS}, /* qkv: rotated */
    {"att", AD_NHT, KEEP_NONE}, {"atty", AD_C, K_NS}, {"res2", AD_C, K_NS}, {"mlp_norm", AD_C, K_NS},
    {"mlp_norm_rstd", AD_1, K_NS}, {"up", AD_H, K_NS}, {"gate", AD_H, K_NS}, {"up_silu_gate", AD_H, K_NS},
    {"res3", AD_C, KEEP_ALL},
};
static const arch_act llama_douts[] = {
    {"fcproj", AD_C, KEEP_ALL}, {"up", AD_H, KEEP_ALL}, {"gate", AD_H, KEEP_ALL}, {"mlp_norm", AD_C, KEEP_ALL},
    {"attproj", AD_C, KEEP_ALL}, {"qkv", AD_QKV, KEEP_ALL}, {"attn_norm", AD_C, KEEP_ALL},
};
static const arch_act llama_head_acts[] = {
    {"norm", AD_C, KEEP_ALL}, {"norm_rstd", AD_1, KEEP_ALL}, {"dnorm", AD_C, KEEP_ALL},
};
/* the rotary tables; one transient of N max(H, QKV); the zero position rows the shared
 * embedding op adds (Llama has no wpe) and their gradient, never read */
static const arch_scratch llama_scratch[] = {
    {"rope_cos", AD_HALF_HS, SCR_PER_POSITION, SCR_ALL, SCR_FILL},
    {"rope_sin", AD_HALF_HS, SCR_PER_POSITION, SCR_ALL, SCR_FILL},
    {"block_scratch", AD_WIDE, SCR_PER_TOKEN, SCR_ALL, SCR_ZEROS},
    {"zero_pos", AD_C, SCR_PER_POSITION, SCR_EMBED, SCR_ZEROS},
    {"dzero_pos", AD_C, SCR_PER_POSITION, SCR_EMBED, SCR_SINK},
};

#define LLAMA_MAX_VOCAB (1 << 24)
#define LLAMA_MAX_SEQ (1 << 20)
#define LLAMA_MAX_LAYER 10000
#define LLAMA_MAX_EMBD 65536
#define LLAMA_MAX_TENSOR 2147483647LL /* floats in one tensor (MPI counts are int) */
#define LLAMA_MAX_PARAMS (1LL << 40)

/* int(2 * 4C / 3), int(ffn_mult * that) when ffn_mult > 0, rounded up to multiple_of. */
static int llama_hidden_size(int C, float ffn_mult, int multiple_of) {
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
    cfg->llama.multiple_of = multiple_of;
    cfg->llama.use_scaled_rope = use_scaled_rope;
    cfg->llama.ver_major = 3;
    cfg->llama.ver_minor = 1;
    cfg->llama.ffn_mult = ffn_mult; /* 0..64, 0 = none (config_check_llama) */
    cfg->llama.norm_eps = norm_eps;
    cfg->llama.rope_theta = rope_theta;
    cfg->llama.rope_factor = 8.0f; /* Llama 3.1's rope_scaling; llama_set_rope_scaling changes it */
    cfg->llama.rope_low_freq = 1.0f;
    cfg->llama.rope_high_freq = 4.0f;
    cfg->llama.rope_orig_ctx = 8192;
    return PL_OK;
}

/* Set a Llama config's rope_scaling (factor, low/high frequency factors, original context),
 * range-checked: factor 1..1e6, 0 < low < high <= 1e6, original 1..2^30. */
static int llama_set_rope_scaling(model_config *cfg, double factor, double low, double high, long long orig, char *err,
                           size_t errlen) {
    if (!(factor >= 1 && factor <= 1e6) || !(low > 0 && low <= 1e6) || !(high > low && high <= 1e6) ||
        orig < 1 || orig > (1 << 30)) {
        snprintf(err, errlen, "rope scaling factor %g, low_freq_factor %g, high_freq_factor %g, "
                 "original_max_position_embeddings %lld: out of range (factor 1..1e6, 0 < low < high <= 1e6, "
                 "original 1..2^30)", factor, low, high, orig);
        return PL_EINVAL;
    }
    cfg->llama.rope_factor = (float)factor;
    cfg->llama.rope_low_freq = (float)low;
    cfg->llama.rope_high_freq = (float)high;
    cfg->llama.rope_orig_ctx = (int)orig;
    return PL_OK;
}

/* Llama 3.1's rescaling of one rotary frequency (the config's factor, low/high frequency
 * factors and original context; Llama 3.1: 8, 1, 4, 8192): long wavelengths slow down by the
 * factor, short ones stay, a smooth blend between. */
static double scaled_freq(const llama_config *q, double f) {
    const double scale = q->rope_factor, low = q->rope_low_freq, high = q->rope_high_freq, old_ctx = q->rope_orig_ctx;
    double wavelen = 2.0 * M_PI / f;
    if (wavelen < old_ctx / high) return f;
    if (wavelen > old_ctx / low) return f / scale;
    double smooth = (old_ctx / wavelen - low) / (high - low);
    return (1.0 - smooth) * f / scale + smooth * f;
}

/* cos and sin of pos(t) * theta^(-2i/HS) (scaled if asked), for t < T and i < HS/2; pos(t) = t
 * but on a CP rank's stage (model_cp_pos). */
void llama_rope_tables(const model_config *c, int T, float *fcos, float *fsin) {
    int HS = c->C / c->NH, half = HS / 2;
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow((double)c->llama.rope_theta, (double)(2 * i) / HS);
        if (c->llama.use_scaled_rope) f = scaled_freq(&c->llama, f);
        for (int t = 0; t < T; t++) {
            double a = (double)model_cp_pos(c, T, t) * f; /* --cp: the row's position in the sequence */
            fcos[(size_t)t * half + i] = (float)cos(a);
            fsin[(size_t)t * half + i] = (float)sin(a);
        }
    }
}

/* --tie-embeddings (0 or 1) and the rope_scaling options into a made config. */
static int llama_extras_from_options(const pl_options *o, model_config *cfg, char *err, size_t errlen) {
    if (o->tie_embeddings != 0 && o->tie_embeddings != 1) {
        snprintf(err, errlen, "--tie-embeddings %d is out of range (0 or 1)", o->tie_embeddings);
        return PL_EINVAL;
    }
    cfg->tie_embed = o->tie_embeddings;
    char e2[400];
    if (llama_set_rope_scaling(cfg, o->rope_factor, o->rope_low_freq, o->rope_high_freq, o->rope_orig_ctx, e2,
                               sizeof e2) != PL_OK) {
        snprintf(err, errlen, "--rope-scaling-factor / --rope-low-freq-factor / --rope-high-freq-factor / "
                 "--rope-original-max-pos: %s", e2);
        return PL_EINVAL;
    }
    return PL_OK;
}

/* The options' Llama: wide first, so a value the float would turn into inf or 0 is named as
 * it was given. */
static int llama_from_options(const pl_options *o, int V, model_config *cfg, char *err, size_t errlen) {
    cfg_llama l = {o->n_head, o->n_kv_head ? o->n_kv_head : o->n_head, o->multiple_of, o->use_scaled_rope, 3, 1,
                   o->ffn_dim_multiplier, o->norm_eps, o->rope_theta};
    if (o->n_head >= 1) PL_TRY(config_check_llama(&l, CFG_NAME_OPTION, err, errlen));
    PL_TRY(llama_config_make(cfg, V, o->max_seq_len, o->n_layer, o->n_head, (int)l.n_kv_head, o->n_embd,
                             o->multiple_of, (float)o->ffn_dim_multiplier, (float)o->norm_eps, (float)o->rope_theta,
                             o->use_scaled_rope, CFG_NAME_OPTION, err, errlen));
    return llama_extras_from_options(o, cfg, err, errlen);
}

/* A built model's Llama settings through the one validation (config_check_llama). */
static int llama_check(const model_config *c, cfg_naming naming, char *err, size_t errlen) {
    const llama_config *q = &c->llama;
    cfg_llama l = {c->NH, c->NKV, q->multiple_of, q->use_scaled_rope, q->ver_major, q->ver_minor, q->ffn_mult,
                   q->norm_eps, q->rope_theta};
    return config_check_llama(&l, naming, err, errlen);
}

/* --init's Llama settings against those given explicitly: multiple-of, use-scaled-rope,
 * then ffn-dim-multiplier, norm-eps and rope-theta (compared as the floats the file holds). */
static int llama_conflicts(const pl_options *o, const model_config *c, char *err, size_t errlen) {
    const llama_config *q = &c->llama;
    const char *names[] = {"multiple-of", "use-scaled-rope"};
    unsigned bits[] = {CFG_SET_MULT, CFG_SET_SCALED};
    int a[] = {o->multiple_of, o->use_scaled_rope}, b[] = {q->multiple_of, q->use_scaled_rope};
    for (int i = 0; i < 2; i++)
        if ((o->set_mask & bits[i]) && a[i] != b[i]) {
            snprintf(err, errlen, "--%s %d conflicts with %.512s, which has %s %d", names[i], a[i], o->init, names[i],
                     b[i]);
            return PL_EINVAL;
        }
    const char *fn[] = {"ffn-dim-multiplier", "norm-eps", "rope-theta"};
    unsigned fb[] = {CFG_SET_FFN, CFG_SET_EPS, CFG_SET_THETA};
    double fa[] = {o->ffn_dim_multiplier, o->norm_eps, o->rope_theta}, ff[] = {q->ffn_mult, q->norm_eps, q->rope_theta};
    for (int i = 0; i < 3; i++)
        if ((o->set_mask & fb[i]) && (float)fa[i] != (float)ff[i]) {
            snprintf(err, errlen, "--%s %g conflicts with %.512s, which has %s %g", fn[i], fa[i], o->init, fn[i], ff[i]);
            return PL_EINVAL;
        }
    return PL_OK;
}

/* The tie and the rope_scaling of a file against the run's. */
static int llama_same_extras(const model_config *f, const model_config *r, int attr, char *err, size_t errlen) {
    const llama_config *a = &f->llama, *b = &r->llama;
    if (f->tie_embed != r->tie_embed) {
        snprintf(err, errlen, "%s is %d in the file but %d in this run", attr ? "tie_embeddings" : "tie-embeddings",
                 f->tie_embed, r->tie_embed);
        return PL_EINVAL;
    }
    if (a->rope_factor != b->rope_factor || a->rope_low_freq != b->rope_low_freq ||
        a->rope_high_freq != b->rope_high_freq || a->rope_orig_ctx != b->rope_orig_ctx) {
        snprintf(err, errlen, "rope scaling (factor, low, high, original) is (%g, %g, %g, %d) in the file but "
                 "(%g, %g, %g, %d) in this run", (double)a->rope_factor, (double)a->rope_low_freq,
                 (double)a->rope_high_freq, a->rope_orig_ctx, (double)b->rope_factor, (double)b->rope_low_freq,
                 (double)b->rope_high_freq, b->rope_orig_ctx);
        return PL_EINVAL;
    }
    return PL_OK;
}

/* A file's settings beyond the dimensions against the run's: use-scaled-rope, norm-eps,
 * rope-theta (named as attributes or as llm.c header fields). */
static int llama_same(const model_config *f, const model_config *r, cfg_naming naming, char *err, size_t errlen) {
    int attr = naming == CFG_NAME_ATTR;
    const llama_config *a = &f->llama, *b = &r->llama;
    if (a->use_scaled_rope != b->use_scaled_rope) {
        snprintf(err, errlen, "%s is %d in the file but %d in this run", attr ? "use_scaled_rope" : "use-scaled-rope",
                 a->use_scaled_rope, b->use_scaled_rope);
        return PL_EINVAL;
    }
    if (a->norm_eps != b->norm_eps || a->rope_theta != b->rope_theta) {
        int eps = a->norm_eps != b->norm_eps;
        snprintf(err, errlen, "%s is %g in the file but %g in this run",
                 eps ? (attr ? "norm_eps" : "norm-eps") : (attr ? "rope_theta" : "rope-theta"),
                 (double)(eps ? a->norm_eps : a->rope_theta), (double)(eps ? b->norm_eps : b->rope_theta));
        return PL_EINVAL;
    }
    /* an llm.c header holds neither the tie nor the rope_scaling factors (llmc_options) */
    return naming == CFG_NAME_HEADER ? PL_OK : llama_same_extras(f, r, attr, err, errlen);
}

/* The banner's model line. */
static void llama_describe(const model_config *c, char *buf, size_t len) {
    char sc[96] = "";
    if (c->llama.use_scaled_rope)
        snprintf(sc, sizeof sc, " (scaled x%g)", (double)c->llama.rope_factor);
    snprintf(buf, len, "llama V=%d (padded %d) C=%d L=%d NH=%d NKV=%d hidden=%d maxT=%d theta=%g%s eps=%g%s", c->V,
             c->Vp, c->C, c->L, c->NH, c->NKV, c->H, c->maxT, (double)c->llama.rope_theta, sc,
             (double)c->llama.norm_eps, c->tie_embed ? " tied" : "");
}

/* x = x + attproj(attn(rope(qkv(rms1(x)))));  x = x + fcproj(fc(h) * silu(fc2(h))), h = rms2(x).
 * The unrotated projections go to the scratch: only the rotated ones are kept. */
static int llama_block_forward(const backend *be, const block_dims *d, float *const *p, float *const *a,
                               const float *x) {
    int N = d->N, C = d->C, H = d->H, QKV = d->QKV;
    float eps = d->cfg->llama.norm_eps, *scr = d->x[LX_SCRATCH];
    PL_TRY(be->rmsnorm_fwd(a[LA_ATTNORM], a[LA_ATTNORM_RSTD], x, p[L_ATTNORM], N, C, eps));
    PL_TRY(be->matmul_fwd(scr, a[LA_ATTNORM], p[L_QKVW], NULL, N, C, QKV));                  // (N, QKV)
    PL_TRY(be->rope_fwd(a[LA_QKV], scr, d->pcos ? d->pcos : d->x[LX_COS], d->psin ? d->psin : d->x[LX_SIN], N,
                        d->pcos ? N : d->T, d->NH, d->NKV, d->HS));
    PL_TRY(model_attention_fwd(be, d, a[LA_ATTY], a[LA_ATT], a[LA_QKV], d->NKV)); // (N, C)
    PL_TRY(be->matmul_fwd(a[LA_RES2], a[LA_ATTY], p[L_ATTPROJW], NULL, N, d->NH * d->HS, C));
    PL_TRY(model_tp_sum(d, a[LA_RES2], (size_t)N * C, TP_PHASE_FWD)); // --tp: partial sums
    PL_TRY(be->residual_fwd(a[LA_RES2], a[LA_RES2], x, (size_t)N * C));
    PL_TRY(be->rmsnorm_fwd(a[LA_MLPNORM], a[LA_MLPNORM_RSTD], a[LA_RES2], p[L_MLPNORM], N, C, eps));
    PL_TRY(be->matmul_fwd(a[LA_UP], a[LA_MLPNORM], p[L_FCW], NULL, N, C, H));                // up (N, H)
    PL_TRY(be->matmul_fwd(a[LA_GATE], a[LA_MLPNORM], p[L_FC2W], NULL, N, C, H));             // gate (N, H)
    PL_TRY(be->swiglu_fwd(a[LA_PROD], a[LA_UP], a[LA_GATE], (size_t)N * H));
    PL_TRY(be->matmul_fwd(a[LA_RES3], a[LA_PROD], p[L_FCPROJW], NULL, N, H, C));
    PL_TRY(model_tp_sum(d, a[LA_RES3], (size_t)N * C, TP_PHASE_FWD));
    return be->residual_fwd(a[LA_RES3], a[LA_RES3], a[LA_RES2], (size_t)N * C);
}

/* dL/dx through the block in reverse op order, dres updated in place; every weight op's
 * output gradient lands in dd (qkv's is the gradient before the rotation). */
static int llama_block_backward_input(const backend *be, const block_dims *d, float *const *p, float *const *a,
                                      const float *x, float *dres, float *const *dd) {
    int N = d->N, C = d->C, H = d->H, QKV = d->QKV;
    size_t nc = (size_t)N * C * sizeof(float);
    float *scr = d->x[LX_SCRATCH];
    /* res3 = res2 + fcproj(up * silu(gate)) */
    PL_TRY(be->copy(dd[LD_FCPROJ], dres, nc));
    PL_TRY(be->matmul_bwd_input(scr, dres, p[L_FCPROJW], N, H, C));                  // d(product) (N, H)
    PL_TRY(be->swiglu_bwd(dd[LD_UP], dd[LD_GATE], scr, a[LA_UP], a[LA_GATE], (size_t)N * H));
    PL_TRY(be->matmul_bwd_input(dd[LD_MLPNORM], dd[LD_UP], p[L_FCW], N, C, H));      // (N, C)
    PL_TRY(be->matmul_bwd_input(scr, dd[LD_GATE], p[L_FC2W], N, C, H));              // (N, C)
    PL_TRY(be->add_inplace(dd[LD_MLPNORM], scr, (size_t)N * C));
    PL_TRY(model_tp_sum(d, dd[LD_MLPNORM], (size_t)N * C, TP_PHASE_BWD));
    PL_TRY(be->rmsnorm_bwd_input(dres, dd[LD_MLPNORM], a[LA_RES2], p[L_MLPNORM], a[LA_MLPNORM_RSTD], N, C));
    /* res2 = x + attproj(attn(rope(qkv(rms1(x))))) */
    PL_TRY(be->copy(dd[LD_ATTPROJ], dres, nc));
    PL_TRY(be->matmul_bwd_input(dd[LD_ATTNORM], dres, p[L_ATTPROJW], N, d->NH * d->HS, C));  // d(atty)
    PL_TRY(model_attention_bwd(be, d, scr, dd[LD_ATTNORM], a[LA_QKV], a[LA_ATT], d->NKV));
    PL_TRY(be->rope_bwd(dd[LD_QKV], scr, d->pcos ? d->pcos : d->x[LX_COS], d->psin ? d->psin : d->x[LX_SIN], N,
                        d->pcos ? N : d->T, d->NH, d->NKV, d->HS));
    PL_TRY(be->matmul_bwd_input(dd[LD_ATTNORM], dd[LD_QKV], p[L_QKVW], N, C, QKV));  // (N, C)
    PL_TRY(model_tp_sum(d, dd[LD_ATTNORM], (size_t)N * C, TP_PHASE_BWD));
    return be->rmsnorm_bwd_input(dres, dd[LD_ATTNORM], x, p[L_ATTNORM], a[LA_ATTNORM_RSTD], N, C);
}

/* dW += dY^T X for the block's five matrices and the two RMSNorm weight sums. */
static int llama_block_backward_weight(const backend *be, const block_dims *d, float *const *g, float *const *a,
                                       const float *x, float *const *dd) {
    int N = d->N, C = d->C, H = d->H, QKV = d->QKV;
    PL_TRY(be->matmul_bwd_weight(g[L_FCPROJW], NULL, dd[LD_FCPROJ], a[LA_PROD], N, H, C));
    PL_TRY(be->matmul_bwd_weight(g[L_FCW], NULL, dd[LD_UP], a[LA_MLPNORM], N, C, H));
    PL_TRY(be->matmul_bwd_weight(g[L_FC2W], NULL, dd[LD_GATE], a[LA_MLPNORM], N, C, H));
    PL_TRY(be->rmsnorm_bwd_weight(g[L_MLPNORM], dd[LD_MLPNORM], a[LA_RES2], a[LA_MLPNORM_RSTD], N, C));
    PL_TRY(be->matmul_bwd_weight(g[L_ATTPROJW], NULL, dd[LD_ATTPROJ], a[LA_ATTY], N, d->NH * d->HS, C));
    PL_TRY(be->matmul_bwd_weight(g[L_QKVW], NULL, dd[LD_QKV], a[LA_ATTNORM], N, C, QKV));
    return be->rmsnorm_bwd_weight(g[L_ATTNORM], dd[LD_ATTNORM], x, a[LA_ATTNORM_RSTD], N, C);
}

/* Selective recomputation dropped the probabilities: recompute them from the rotated qkv. */
static int llama_recompute_selective(const backend *be, const block_dims *d, float *const *a) {
    return model_attention_fwd(be, d, a[LA_ATTY], a[LA_ATT], a[LA_QKV], d->NKV);
}

/* x = wte[tok] (the shared embedding op, adding zero position rows), and its gradient (the
 * positions' share lands in a sink). */
static int llama_embed_forward(const backend *be, const block_dims *d, float *const *p, float *x, const int *tok) {
    return be->encoder_fwd(x, tok, p[LE_WTE], d->x[LX_ZERO_POS], d->N, d->T, d->C);
}
static int llama_embed_backward(const backend *be, const block_dims *d, float *const *g, const float *dx,
                                const int *tok) {
    return be->encoder_bwd(g[LE_WTE], d->x[LX_DZERO_POS], dx, tok, d->N, d->T, d->C);
}

/* The final RMSNorm, its input part (into dres) and its weight part. */
static int llama_head_norm_forward(const backend *be, const block_dims *d, float *const *p, float *const *a,
                                   const float *x) {
    return be->rmsnorm_fwd(a[LHA_NORM], a[LHA_RSTD], x, p[LH_NORM], d->N, d->C, d->cfg->llama.norm_eps);
}
static int llama_head_norm_backward_input(const backend *be, const block_dims *d, float *const *p, float *const *a,
                                          const float *x, float *dres) {
    return be->rmsnorm_bwd_input(dres, a[LHA_DNORM], x, p[LH_NORM], a[LHA_RSTD], d->N, d->C);
}
static int llama_head_norm_backward_weight(const backend *be, const block_dims *d, float *const *g, float *const *a,
                                           const float *x) {
    return be->rmsnorm_bwd_weight(g[LH_NORM], a[LHA_DNORM], x, a[LHA_RSTD], d->N, d->C);
}

/* The rotary tables (both computed, the row's kept). */
static int llama_scratch_fill(const model_config *c, int T, int row, float *host) {
    size_t n = (size_t)T * (size_t)(c->C / c->NH / 2);
    float *other = malloc(n ? n * sizeof(float) : 1);
    if (!other) return PL_ENOMEM;
    if (row == LX_COS) llama_rope_tables(c, T, host, other);
    else llama_rope_tables(c, T, other, host);
    free(other);
    return PL_OK;
}

/* llm.c's Llama 3 header: 256 int32 (magic, version, maxT, V, L, NH, NKV, C, multiple_of,
 * use_scaled_rope, version major, minor), then 256 float32 (ffn_mult, norm_eps, rope_theta). */
static void llama_header_write(const model_config *c, void *hdr) {
    int32_t *h = hdr;
    float *hf = (float *)((char *)hdr + 1024);
    const llama_config *q = &c->llama;
    h[0] = LLMC_LLAMA_MAGIC; h[1] = 3; h[2] = c->maxT; h[3] = c->V; h[4] = c->L; h[5] = c->NH;
    h[6] = c->NKV; h[7] = c->C; h[8] = q->multiple_of; h[9] = q->use_scaled_rope;
    h[10] = q->ver_major; h[11] = q->ver_minor;
    hf[0] = q->ffn_mult; hf[1] = q->norm_eps; hf[2] = q->rope_theta;
}

/* A Llama 3 header into cfg; the message names the bad field. Its Llama settings go through
 * the one validation the command line and checkpoints use (config.c), so a model --init
 * accepts trains into checkpoints that resume. A bad header is a bad file: PL_EIO. */
static int llama_header_read(const char *path, const void *hdr, size_t got, model_config *cfg, char *err,
                             size_t errlen) {
    const int32_t *h = hdr;
    const float *f = (const float *)((const char *)hdr + 1024);
    if (got < 2048) {
        snprintf(err, errlen, "model file %s: shorter than the 2048-byte Llama 3 header", path);
        return PL_EIO;
    }
    char e2[512];
    cfg_llama l = {h[5], h[6], h[8], h[9], h[10], h[11], f[0], f[1], f[2]};
    int rc = h[5] >= 1 ? config_check_llama(&l, CFG_NAME_HEADER, e2, sizeof e2) : PL_OK;
    if (rc == PL_OK)
        rc = llama_config_make(cfg, h[3], h[2], h[4], h[5], h[6], h[7], h[8], f[0], f[1], f[2], h[9], CFG_NAME_HEADER,
                               e2, sizeof e2);
    if (rc != PL_OK) {
        snprintf(err, errlen, "model file %s: bad header: %s", path, e2);
        return PL_EIO;
    }
    cfg->llama.ver_major = h[10];
    cfg->llama.ver_minor = h[11];
    return PL_OK;
}

/* The Llama attributes of /config (docs/formats.md), in the order of attrs_of. */
static const char *const llama_attr_int[] = {"n_kv_head", "ffn_hidden", "multiple_of", "use_scaled_rope",
                                             "llama_version_major", "llama_version_minor", "tie_embeddings",
                                             "rope_original_max_pos"};
static const char *const llama_attr_f64[] = {"ffn_dim_multiplier", "norm_eps", "rope_theta", "rope_scaling_factor",
                                             "rope_low_freq_factor", "rope_high_freq_factor"};

static void llama_attrs_of(const model_config *c, long long *ints, double *f64) {
    const llama_config *q = &c->llama;
    long long li[8] = {c->NKV, c->H, q->multiple_of, q->use_scaled_rope, q->ver_major, q->ver_minor, c->tie_embed,
                       q->rope_orig_ctx};
    double lf[6] = {q->ffn_mult, q->norm_eps, q->rope_theta, q->rope_factor, q->rope_low_freq, q->rope_high_freq};
    memcpy(ints, li, sizeof li);
    memcpy(f64, lf, sizeof lf);
}

/* The model of a checkpoint's /config: every Llama attribute range-checked by name before
 * anything narrows it (the one validation, config.c), then made; ffn_hidden, derived, must
 * be the size the others give. */
static int llama_of_attrs(const long long *k, const long long *li, const double *lf, model_config *cfg, char *err,
                          size_t errlen) {
    if (li[1] < 1 || li[1] > INT_MAX) {
        snprintf(err, errlen, "attribute /config/ffn_hidden = %lld is out of range (1..%d)", li[1], INT_MAX);
        return PL_EIO;
    }
    cfg_llama l = {k[4], li[0], li[2], li[3], li[4], li[5], lf[0], lf[1], lf[2]};
    char e2[512];
    if (config_check_llama(&l, CFG_NAME_ATTR, err, errlen) != PL_OK) return PL_EIO;
    if (llama_config_make(cfg, (int)k[0], (int)k[2], (int)k[3], (int)k[4], (int)li[0], (int)k[5], (int)li[2],
                          (float)lf[0], (float)lf[1], (float)lf[2], (int)li[3], CFG_NAME_ATTR, e2, sizeof e2) != PL_OK) {
        snprintf(err, errlen, "bad /config (llama): %s", e2);
        return PL_EIO;
    }
    if (cfg->H != li[1]) {
        snprintf(err, errlen, "attribute /config/ffn_hidden = %lld is not the MLP hidden size %d that n_embd, "
                 "ffn_dim_multiplier and multiple_of give", li[1], cfg->H);
        return PL_EIO;
    }
    cfg->llama.ver_major = (int)li[4];
    cfg->llama.ver_minor = (int)li[5];
    if (li[6] != 0 && li[6] != 1) {
        snprintf(err, errlen, "attribute /config/tie_embeddings = %lld is out of range (0 or 1)", li[6]);
        return PL_EIO;
    }
    cfg->tie_embed = (int)li[6];
    if (llama_set_rope_scaling(cfg, lf[3], lf[4], lf[5], li[7], e2, sizeof e2) != PL_OK) {
        snprintf(err, errlen, "attributes /config/rope_*: %s", e2);
        return PL_EIO;
    }
    return PL_OK;
}

static int llama_block_decode(const backend *be, const block_dims *d, float *const *p, float *const *a,
                              const kv_batch *kv, const float *x);
static int llama_embed_decode(const backend *be, const block_dims *d, float *const *p, float *x, const int *tok,
                              const kv_batch *kv);
/* Names a Hugging Face Llama file may hold that the model does not read (old rotary buffers). */
static const char *const llama_hf_ignore[] = {"model.layers.%d.self_attn.rotary_emb.inv_freq", NULL};

/* rope_scaling of config.json: null (none), or rope_type "llama3" with its four numbers. */
static int llama_hf_rope(const void *j, const char *path, model_config *cfg, char *err, size_t errlen) {
    int rc;
    const void *rs = hf_json_obj(j, path, "rope_scaling", &rc, err, errlen);
    if (rc != PL_OK || !rs) return rc;
    const char *ty = hf_json_str(rs, "rope_type") ? hf_json_str(rs, "rope_type") : hf_json_str(rs, "type");
    if (!ty || strcmp(ty, "llama3") != 0) {
        snprintf(err, errlen, "%s: rope_scaling type %.32s is not supported (llama3 or null)", path, ty ? ty : "(none)");
        return PL_EIO;
    }
    double f = 0, lo = 0, hi = 0;
    long long orig = 0;
    PL_TRY(hf_json_num(rs, path, "factor", 1, 1, 1e6, &f, err, errlen));
    PL_TRY(hf_json_num(rs, path, "low_freq_factor", 1, 1e-6, 1e6, &lo, err, errlen));
    PL_TRY(hf_json_num(rs, path, "high_freq_factor", 1, 1e-6, 1e6, &hi, err, errlen));
    PL_TRY(hf_json_int(rs, path, "original_max_position_embeddings", 1, 1, 1 << 30, &orig, err, errlen));
    char e2[400];
    if (llama_set_rope_scaling(cfg, f, lo, hi, orig, e2, sizeof e2) != PL_OK) {
        snprintf(err, errlen, "%s: %s", path, e2);
        return PL_EIO;
    }
    cfg->llama.use_scaled_rope = 1;
    return PL_OK;
}

/* LlamaForCausalLM's config.json: the dimensions, intermediate_size (as multiple_of with no
 * ffn multiplier when it is at least int(8C/3), which every Llama 3 is), rms_norm_eps,
 * rope_theta, tie_word_embeddings, rope_scaling; what pipelm's Llama is not refused by key. */
static int llama_hf_config(const void *j, const char *path, model_config *cfg, char *err, size_t errlen) {
    long long V = 0, T = 0, L = 0, NH = 0, NKV = -1, C = 0, I = 0, hd = -1;
    double eps = 1e-6, theta = 10000.0;
    int tie = 0, ab = 0, mb = 0;
    PL_TRY(hf_json_int(j, path, "vocab_size", 1, 1, LLAMA_MAX_VOCAB, &V, err, errlen));
    PL_TRY(hf_json_int(j, path, "max_position_embeddings", 1, 1, LLAMA_MAX_SEQ, &T, err, errlen));
    PL_TRY(hf_json_int(j, path, "hidden_size", 1, 1, LLAMA_MAX_EMBD, &C, err, errlen));
    PL_TRY(hf_json_int(j, path, "intermediate_size", 1, 1, 1 << 20, &I, err, errlen));
    PL_TRY(hf_json_int(j, path, "num_hidden_layers", 1, 1, LLAMA_MAX_LAYER, &L, err, errlen));
    PL_TRY(hf_json_int(j, path, "num_attention_heads", 1, 1, LLAMA_MAX_EMBD, &NH, err, errlen));
    PL_TRY(hf_json_int(j, path, "num_key_value_heads", 0, 1, LLAMA_MAX_EMBD, &NKV, err, errlen));
    PL_TRY(hf_json_int(j, path, "head_dim", 0, 1, LLAMA_MAX_EMBD, &hd, err, errlen));
    PL_TRY(hf_json_num(j, path, "rms_norm_eps", 0, 1e-30, 1, &eps, err, errlen));
    PL_TRY(hf_json_num(j, path, "rope_theta", 0, 1, 1e30, &theta, err, errlen));
    PL_TRY(hf_json_bool(j, path, "tie_word_embeddings", &tie, err, errlen));
    PL_TRY(hf_json_bool(j, path, "attention_bias", &ab, err, errlen));
    PL_TRY(hf_json_bool(j, path, "mlp_bias", &mb, err, errlen));
    const char *act = hf_json_str(j, "hidden_act");
    if (ab || mb || (act && strcmp(act, "silu") != 0) || (hd != -1 && hd * NH != C)) {
        snprintf(err, errlen, "%s: %s is not what pipelm's Llama is (no biases, silu, head_dim = hidden_size / "
                 "num_attention_heads)", path, ab ? "attention_bias" : mb ? "mlp_bias" : hd != -1 && hd * NH != C ?
                 "head_dim" : "hidden_act");
        return PL_EIO;
    }
    if (NKV < 0) NKV = NH;
    if (I < llama_hidden_size((int)C, 0, 1)) {
        snprintf(err, errlen, "%s: intermediate_size %lld is below int(8 hidden_size / 3) = %d, which pipelm's "
                 "Llama cannot express", path, I, llama_hidden_size((int)C, 0, 1));
        return PL_EIO;
    }
    char e2[400];
    if (llama_config_make(cfg, (int)V, (int)T, (int)L, (int)NH, (int)NKV, (int)C, (int)I, 0.0f, (float)eps,
                          (float)theta, 0, CFG_NAME_HEADER, e2, sizeof e2) != PL_OK) {
        snprintf(err, errlen, "%s: %s", path, e2);
        return PL_EIO;
    }
    cfg->tie_embed = tie;
    return llama_hf_rope(j, path, cfg, err, errlen);
}

/* config.json of a LlamaForCausalLM ("architectures" as one string; hf_save makes it a list). */
static void llama_hf_config_write(const model_config *c, void *j) {
    const llama_config *q = &c->llama;
    hf_json_set_str(j, "architectures", "LlamaForCausalLM");
    hf_json_set_int(j, "vocab_size", c->V);
    hf_json_set_int(j, "hidden_size", c->C);
    hf_json_set_int(j, "intermediate_size", c->H);
    hf_json_set_int(j, "num_hidden_layers", c->L);
    hf_json_set_int(j, "num_attention_heads", c->NH);
    hf_json_set_int(j, "num_key_value_heads", c->NKV);
    hf_json_set_int(j, "head_dim", c->C / c->NH);
    hf_json_set_int(j, "max_position_embeddings", c->maxT);
    hf_json_set_float(j, "rms_norm_eps", q->norm_eps);
    hf_json_set_float(j, "rope_theta", q->rope_theta);
    hf_json_set_str(j, "hidden_act", "silu");
    hf_json_set_bool(j, "attention_bias", 0);
    hf_json_set_bool(j, "mlp_bias", 0);
    hf_json_set_bool(j, "tie_word_embeddings", c->tie_embed);
    if (q->use_scaled_rope) {
        void *r = hf_json_set_obj(j, "rope_scaling");
        hf_json_set_str(r, "rope_type", "llama3");
        hf_json_set_float(r, "factor", q->rope_factor);
        hf_json_set_float(r, "low_freq_factor", q->rope_low_freq);
        hf_json_set_float(r, "high_freq_factor", q->rope_high_freq);
        hf_json_set_int(r, "original_max_position_embeddings", q->rope_orig_ctx);
    }
}

const model_arch arch_llama = {
    .name = "llama", .id = MODEL_LLAMA,
    .embed = ARCH_ROWS(llama_embed), .block = ARCH_ROWS(llama_block), .head = ARCH_ROWS(llama_head),
    .acts = ARCH_ROWS(llama_acts), .douts = ARCH_ROWS(llama_douts), .head_acts = ARCH_ROWS(llama_head_acts),
    .scratch = llama_scratch, .nscratch = (int)(sizeof llama_scratch / sizeof llama_scratch[0]),
    .block_out = LA_RES3, .head_out = LHA_NORM, .head_dout = LHA_DNORM, .head_matrix = LH_LMHEAD, .tied = 0,
    .head_desc = "the final RMSNorm or lm_head",
    .config_from_options = llama_from_options, .config_check = llama_check, .init_conflicts = llama_conflicts,
    .same_settings = llama_same, .describe = llama_describe,
    .block_forward = llama_block_forward, .block_backward_input = llama_block_backward_input,
    .block_backward_weight = llama_block_backward_weight, .block_recompute_selective = llama_recompute_selective,
    .embed_forward = llama_embed_forward, .embed_backward = llama_embed_backward,
    .head_norm_forward = llama_head_norm_forward, .head_norm_backward_input = llama_head_norm_backward_input,
    .head_norm_backward_weight = llama_head_norm_backward_weight, .scratch_fill = llama_scratch_fill,
    .magic = LLMC_LLAMA_MAGIC, .header_bytes = 2048, .file_desc = "an llm.c Llama 3 one",
    .llmc_header_write = llama_header_write, .llmc_header_read = llama_header_read,
    .attr_int = llama_attr_int, .nattr_int = 8, .attr_f64 = llama_attr_f64, .nattr_f64 = 6,
    .attrs_of = llama_attrs_of, .config_of_attrs = llama_of_attrs,
    .block_decode = llama_block_decode, .embed_decode = llama_embed_decode,
    .llmc_zeros = {{NULL, 0}, ARCH_ROWS(llama_zero_block), ARCH_ROWS(llama_zero_head)},
    .llmc_options = llama_extras_from_options,
    .hf_model_type = "llama", .hf_ignore = llama_hf_ignore, .hf_config_read = llama_hf_config,
    .hf_config_write = llama_hf_config_write,
};

/* ---- decoding with a KV cache (kvcache.h) ---- */

/* The block over an item's rows: as llama_block_forward, each segment rotated at its own
 * positions (the tables from its first one) and attending over its sequence's cache. */
static int llama_block_decode(const backend *be, const block_dims *d, float *const *p, float *const *a,
                              const kv_batch *kv, const float *x) {
    int N = d->N, C = d->C, H = d->H, QKV = d->QKV, half = d->HS / 2;
    float eps = d->cfg->llama.norm_eps, *scr = d->x[LX_SCRATCH];
    PL_TRY(be->rmsnorm_fwd(a[LA_ATTNORM], a[LA_ATTNORM_RSTD], x, p[L_ATTNORM], N, C, eps));
    PL_TRY(be->matmul_decode_fwd(scr, a[LA_ATTNORM], p[L_QKVW], NULL, N, C, QKV));
    for (int i = 0; i < kv->nseg; i++) {
        const kv_seg *s = &kv->seg[i];
        size_t r = (size_t)s->row;
        PL_TRY(be->rope_fwd(a[LA_QKV] + r * QKV, scr + r * QKV, d->x[LX_COS] + (size_t)s->pos * half,
                            d->x[LX_SIN] + (size_t)s->pos * half, s->n, s->n, d->NH, d->NKV, d->HS));
        PL_TRY(be->attention_kv_fwd(a[LA_ATTY] + r * C, s->k, s->v, a[LA_QKV] + r * QKV, s->pos, s->n, d->NH, d->NKV,
                                    d->HS));
    }
    PL_TRY(be->matmul_decode_fwd(a[LA_RES2], a[LA_ATTY], p[L_ATTPROJW], NULL, N, C, C));
    PL_TRY(be->residual_fwd(a[LA_RES2], a[LA_RES2], x, (size_t)N * C));
    PL_TRY(be->rmsnorm_fwd(a[LA_MLPNORM], a[LA_MLPNORM_RSTD], a[LA_RES2], p[L_MLPNORM], N, C, eps));
    PL_TRY(be->matmul_decode_fwd(a[LA_UP], a[LA_MLPNORM], p[L_FCW], NULL, N, C, H));
    PL_TRY(be->matmul_decode_fwd(a[LA_GATE], a[LA_MLPNORM], p[L_FC2W], NULL, N, C, H));
    PL_TRY(be->swiglu_fwd(a[LA_PROD], a[LA_UP], a[LA_GATE], (size_t)N * H));
    PL_TRY(be->matmul_decode_fwd(a[LA_RES3], a[LA_PROD], p[L_FCPROJW], NULL, N, H, C));
    return be->residual_fwd(a[LA_RES3], a[LA_RES3], a[LA_RES2], (size_t)N * C);
}

/* x = wte[tok] for each segment's rows (the shared op adds the zero position rows). */
static int llama_embed_decode(const backend *be, const block_dims *d, float *const *p, float *x, const int *tok,
                              const kv_batch *kv) {
    int C = d->C;
    for (int i = 0; i < kv->nseg; i++) {
        const kv_seg *s = &kv->seg[i];
        PL_TRY(be->encoder_fwd(x + (size_t)s->row * C, tok + s->row, p[LE_WTE], d->x[LX_ZERO_POS], s->n, s->n, C));
    }
    return PL_OK;
}
