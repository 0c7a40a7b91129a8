/*
 * mixtral.c — Mixtral (Hugging Face's MixtralForCausalLM): Llama 3's blocks with the MLP
 * replaced by a sparse mixture-of-experts layer, and the DeepSeek-V3 variants as options.
 * Its descriptor (the rows of arch.h), its math as backend calls, its file header.
 *
 *   per block: x = x + attproj(attn_gqa(rope(qkv(rmsnorm1(x)))))        (as Llama's)
 *              h = rmsnorm2(x);  x = x + shared(h) + sum_k w_k expert_{e_k}(h)
 *   router:    z = h gate^T (E);  softmax: p = softmax(z) (fp32), the K largest (ties: the lower
 *              expert), w = p_e / sum of the K;  sigmoid-bias: s = sigmoid(z), the K largest of
 *              s + bias (the bias only chooses), w = s_e / sum of the K
 *   expert e:  w2_e (silu(w1_e h) * w3_e h), hidden F;  shared: the same with hidden S F
 * A token's output sums its experts in ascending expert order. Dispatch is dropless unless
 * --capacity-factor c: an expert keeps at most ceil(c N K / E) of a micro-batch's N tokens,
 * dropping its lowest router weights first (ties: the later token); a dropped pair adds
 * nothing. The load-balancing loss (Switch / Mixtral) of a layer is
 * aux = E sum_e (n_e / N) P_e, n_e the tokens that chose e, P_e the mean routing probability
 * (the softmax; the sigmoid scores normalised per token); a micro-batch's is the mean over the
 * layers, and the objective adds aux_coef times its mean over the step's micro-batches. With
 * L = 1 and one micro-batch this is Hugging Face's load_balancing_loss_func. The sigmoid-bias
 * router's bias is not trained: its gradient slot carries the step's load error
 * (n_e - N K / E, times 2^-40 so it adds nothing measurable to the gradient norm) and the
 * optimizer steps it by -rate sign(error) (UPDATE_SIGN, optim.c).
 *
 * Routing runs on the host (a micro-batch's N x E logits and N x K choices cross with
 * to_host / from_host); the expert products are one matmul per expert over its
 * expert-contiguous rows; the permutations are the backend's moe_* ops.
 *
 * Under --ep E (parallel/ep.h, through model_set_ep_hook) the products run on the experts'
 * ranks: a rank's rows for EP rank j's experts go there (counts, then rows), which runs one
 * product per (source rank, local expert), the call the source makes at E = 1, and sends the
 * results back; the rank keeps y, up and gate for its backward. In exact mode the weight part
 * folds each source's share as its own addend (block_dims.acc), so E does not change a bit.
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

enum { XE_WTE };
enum { X_ATTNORM, X_QKVW, X_ATTPROJW, X_MLPNORM, X_ROUTER, X_W1, X_W3, X_W2, X_RBIAS, X_SW1, X_SW3, X_SW2 };
enum { XH_NORM, XH_LMHEAD };
enum { XA_ATTNORM, XA_ATTNORM_RSTD, XA_QKV, XA_ATT, XA_ATTY, XA_RES2, XA_MLPNORM, XA_MLPNORM_RSTD, XA_PROBS, XA_TOPW,
       XA_TOPI, XA_SLOT, XA_XG, XA_UP, XA_GATE, XA_PROD, XA_Y, XA_SUP, XA_SGATE, XA_SPROD, XA_RES3 };
enum { XD_Y, XD_UP, XD_GATE, XD_LOGITS, XD_MLPNORM, XD_SOUT, XD_SUP, XD_SGATE, XD_ATTPROJ, XD_QKV, XD_ATTNORM };
enum { XHA_NORM, XHA_RSTD, XHA_DNORM };
enum { XX_COS, XX_SIN, XX_SCRATCH, XX_ZERO_POS, XX_DZERO_POS, XX_E, XX_K, XX_KW, XX_KC, XX_KC2, XX_KF, XX_SF };

#define LOAD_SCALE 9.094947017729282e-13 /* 2^-40: the load error's scale in the bias's gradient slot */
#define MIXTRAL_MAGIC 20261206         /* pipelm's Mixtral model file (llm.c's layout, its own header) */

/* name, kind, rows, cols, decay, init, file index, file rows, mfu, hf name, tied */
static const arch_param mixtral_embed[] = {
    {"wte", P_WTE, AD_VP, AD_C, 1, INIT_NORMAL, 0, AD_V, 0, "model.embed_tokens.weight", -1},
};
static const arch_param mixtral_block[] = {
    {"attn_norm_w", P_ATTNORMW, AD_C, AD_NONE, 0, INIT_ONE, 2, AD_C, 1, "model.layers.%d.input_layernorm.weight", -1},
    {"qkv_w", P_QKVW, AD_QKV, AD_C, 1, INIT_NORMAL, 3, AD_QKV, 1,
     "^model.layers.%d.self_attn.q_proj.weight|^model.layers.%d.self_attn.k_proj.weight|"
     "model.layers.%d.self_attn.v_proj.weight", -1},
    {"attproj_w", P_ATTPROJW, AD_C, AD_CA, 1, INIT_RESID, 4, AD_C, 1, "model.layers.%d.self_attn.o_proj.weight", -1},
    {"mlp_norm_w", P_MLPNORMW, AD_C, AD_NONE, 0, INIT_ONE, 5, AD_C, 1,
     "model.layers.%d.post_attention_layernorm.weight", -1},
    {"router_w", P_ROUTERW, AD_E, AD_C, 1, INIT_NORMAL, 6, AD_E, 1, "model.layers.%d.block_sparse_moe.gate.weight", -1},
    /* the experts stacked by rows; Hugging Face holds one tensor per expert ("%e": hf.h) */
    {"experts_w1", P_EXPW1, AD_EF, AD_C, 1, INIT_NORMAL, 7, AD_EF, 1,
     "model.layers.%d.block_sparse_moe.experts.%e.w1.weight", -1},
    {"experts_w3", P_EXPW3, AD_EF, AD_C, 1, INIT_NORMAL, 8, AD_EF, 1,
     "model.layers.%d.block_sparse_moe.experts.%e.w3.weight", -1},
    {"experts_w2", P_EXPW2, AD_EC, AD_F, 1, INIT_RESID, 9, AD_EC, 1,
     "model.layers.%d.block_sparse_moe.experts.%e.w2.weight", -1},
    /* DeepSeek-V3's variants: not in Hugging Face's Mixtral (mixtral_hf_check refuses them) */
    {"router_bias", P_ROUTERB, AD_E, AD_NONE, 0, INIT_ZERO, 10, AD_E, 0, NULL, -1}, /* UPDATE_SIGN (arch.c) */
    {"shared_w1", P_SHW1, AD_SF, AD_C, 1, INIT_NORMAL, 11, AD_SF, 1, NULL, -1},
    {"shared_w3", P_SHW3, AD_SF, AD_C, 1, INIT_NORMAL, 12, AD_SF, 1, NULL, -1},
    {"shared_w2", P_SHW2, AD_C, AD_SF, 1, INIT_RESID, 13, AD_C, 1, NULL, -1},
};
static const arch_param mixtral_head[] = {
    {"lnf_w", P_LNFW, AD_C, AD_NONE, 0, INIT_ONE, 14, AD_C, 1, "model.norm.weight", -1},
    {"lm_head", P_LMHEAD, AD_VP, AD_C, 1, INIT_NORMAL, 1, AD_V, 1, "lm_head.weight", -1},
};
#define K_NS (KEEP_NONE | KEEP_SELECTIVE)
/* name, floats per token, modes that keep it per slot; topi and slot hold int32 */
static const arch_act mixtral_acts[] = {
    {"attn_norm", AD_C, K_NS}, {"attn_norm_rstd", AD_1, K_NS}, {"qkv", AD_QKV, K_NS}, {"att", AD_NHT, KEEP_NONE},
    {"atty", AD_C, K_NS}, {"res2", AD_C, K_NS}, {"mlp_norm", AD_C, K_NS}, {"mlp_norm_rstd", AD_1, K_NS},
    {"router_probs", AD_E, K_NS}, {"topk_w", AD_K, K_NS}, {"topk_i", AD_K, K_NS}, {"slot", AD_K, K_NS},
    {"dispatched", AD_KC, K_NS}, {"up", AD_KF, K_NS}, {"gate", AD_KF, K_NS}, {"up_silu_gate", AD_KF, K_NS},
    {"expert_out", AD_KC, K_NS}, {"shared_up", AD_SF, K_NS}, {"shared_gate", AD_SF, K_NS},
    {"shared_prod", AD_SF, K_NS}, {"res3", AD_C, KEEP_ALL},
};
static const arch_act mixtral_douts[] = {
    {"expert_out", AD_KC, KEEP_ALL}, {"up", AD_KF, KEEP_ALL}, {"gate", AD_KF, KEEP_ALL},
    {"router_logits", AD_E, KEEP_ALL}, {"mlp_norm", AD_C, KEEP_ALL}, {"shared_out", AD_C, KEEP_ALL},
    {"shared_up", AD_SF, KEEP_ALL}, {"shared_gate", AD_SF, KEEP_ALL}, {"attproj", AD_C, KEEP_ALL},
    {"qkv", AD_QKV, KEEP_ALL}, {"attn_norm", AD_C, KEEP_ALL},
};
static const arch_act mixtral_head_acts[] = {
    {"norm", AD_C, KEEP_ALL}, {"norm_rstd", AD_1, KEEP_ALL}, {"dnorm", AD_C, KEEP_ALL},
};
/* Llama's rotary tables, transient and zero rows; the router's logits, the dispatch's rows and
 * weights, and the experts' transients (N K rows of C and of F, N S F) */
static const arch_scratch mixtral_scratch[] = {
    {"rope_cos", AD_HALF_HS, SCR_PER_POSITION, SCR_ALL, SCR_FILL},
    {"rope_sin", AD_HALF_HS, SCR_PER_POSITION, SCR_ALL, SCR_FILL},
    {"block_scratch", AD_WIDE, SCR_PER_TOKEN, SCR_ALL, SCR_ZEROS},
    {"zero_pos", AD_C, SCR_PER_POSITION, SCR_EMBED, SCR_ZEROS},
    {"dzero_pos", AD_C, SCR_PER_POSITION, SCR_EMBED, SCR_SINK},
    {"moe_logits", AD_E, SCR_PER_TOKEN, SCR_ALL, SCR_ZEROS},
    {"moe_rows", AD_K, SCR_PER_TOKEN, SCR_ALL, SCR_ZEROS},
    {"moe_weights", AD_K, SCR_PER_TOKEN, SCR_ALL, SCR_ZEROS},
    {"moe_kc", AD_KC, SCR_PER_TOKEN, SCR_ALL, SCR_ZEROS},
    {"moe_kc2", AD_KC, SCR_PER_TOKEN, SCR_ALL, SCR_ZEROS},
    {"moe_kf", AD_KF, SCR_PER_TOKEN, SCR_ALL, SCR_ZEROS},
    {"moe_sf", AD_SF, SCR_PER_TOKEN, SCR_ALL, SCR_ZEROS},
};

#define MIXTRAL_MAX_EXPERTS 4096

/* ---- routing on the host ---- */

/* One micro-batch's routing, host copies: probs (N,E) raw scores, topw / topi / slot (N,K),
 * rows and wsorted (M) the assignments in expert-contiguous order, off (E+1) each expert's
 * first row, cnt (E) the tokens that chose each expert (before capacity drops). */
typedef struct {
    int N, E, K, M, dropped;
    float *probs, *topw, *wsorted, *logits, *bias;
    int *topi, *slot, *rows, *off, *cnt;
    void *mem;
} route;

static int route_alloc(route *r, int N, int E, int K) {
    size_t nk = (size_t)N * K, ne = (size_t)N * E, nf = 2 * ne + 2 * nk + (size_t)E, ni = 3 * nk + 2 * (size_t)E + 1;
    memset(r, 0, sizeof *r);
    r->N = N; r->E = E; r->K = K;
    r->mem = calloc(nf + ni, sizeof(float)); /* floats, then int32s */
    if (!r->mem) return PL_ENOMEM;
    float *f = r->mem;
    r->logits = f; f += ne;
    r->probs = f; f += ne;
    r->topw = f; f += nk;
    r->wsorted = f; f += nk;
    r->bias = f; f += E;
    int *i = (int *)f;
    r->topi = i; i += nk;
    r->slot = i; i += nk;
    r->rows = i; i += nk;
    r->off = i; i += E + 1;
    r->cnt = i;
    return PL_OK;
}

/* Token t's K experts: the largest of score (+ bias), ties to the lower index, then sorted
 * ascending; their weights normalised to sum 1. */
static void route_token(route *r, const float *p, const float *bias, int t) {
    int E = r->E, K = r->K, *ti = r->topi + (size_t)t * K;
    float *tw = r->topw + (size_t)t * K;
    for (int k = 0; k < K; k++) {
        int best = -1;
        float bv = 0;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= ti[j] == e;
            float v = p[e] + (bias ? bias[e] : 0.0f);
            if (!taken && (best < 0 || v > bv)) { best = e; bv = v; }
        }
        ti[k] = best;
    }
    for (int a = 1; a < K; a++) /* ascending expert order: the order of the output's sum */
        for (int b = a; b > 0 && ti[b - 1] > ti[b]; b--) { int x = ti[b]; ti[b] = ti[b - 1]; ti[b - 1] = x; }
    float den = 0;
    for (int k = 0; k < K; k++) den += p[ti[k]];
    for (int k = 0; k < K; k++) tw[k] = p[ti[k]] / den;
}

/* The scores of every token: softmax in fp32 (max subtracted), or the sigmoid. */
static void route_scores(route *r, int router) {
    int E = r->E;
    for (int t = 0; t < r->N; t++) {
        const float *z = r->logits + (size_t)t * E;
        float *p = r->probs + (size_t)t * E;
        if (router == MOE_ROUTER_SIGMOID_BIAS) {
            for (int e = 0; e < E; e++) p[e] = 1.0f / (1.0f + expf(-z[e]));
            continue;
        }
        float mx = z[0], s = 0;
        for (int e = 1; e < E; e++) mx = z[e] > mx ? z[e] : mx;
        for (int e = 0; e < E; e++) s += (p[e] = expf(z[e] - mx));
        for (int e = 0; e < E; e++) p[e] /= s;
    }
}

/* An assignment (t K + k) and its router weight, for the capacity's order. */
typedef struct {
    float w;
    int a;
} ranked;

/* Kept first: the higher weight, then the earlier token (the lower assignment index). */
static int ranked_cmp(const void *x, const void *y) {
    const ranked *p = x, *q = y;
    if (p->w != q->w) return p->w > q->w ? -1 : 1;
    return (p->a > q->a) - (p->a < q->a);
}

/* Capacity: each expert keeps its cap best assignments (slot -1 marks the dropped). */
static int route_capacity(route *r, float capacity) {
    int E = r->E, K = r->K, N = r->N;
    if (capacity <= 0) return PL_OK;
    long long cap = (long long)ceil((double)capacity * N * K / E);
    ranked *v = malloc(sizeof *v * ((size_t)N * K + 1));
    if (!v) return PL_ENOMEM;
    for (int e = 0; e < E; e++) {
        if (r->cnt[e] <= cap) continue;
        int n = 0;
        for (int a = 0; a < N * K; a++)
            if (r->topi[a] == e) v[n++] = (ranked){r->topw[a], a};
        qsort(v, (size_t)n, sizeof *v, ranked_cmp);
        for (int i = (int)cap; i < n; i++) {
            r->slot[v[i].a] = -1;
            r->dropped++;
        }
    }
    free(v);
    return PL_OK;
}

/* Route a micro-batch whose logits (and the bias) are in r: scores, choices, capacity (drops:
 * 0 in decoding, which is dropless), and the expert-contiguous order (each expert's tokens
 * ascending). */
static int route_build(route *r, const model_config *c, int drops) {
    int E = r->E, K = r->K, N = r->N, sig = c->moe.router == MOE_ROUTER_SIGMOID_BIAS;
    route_scores(r, c->moe.router);
    memset(r->cnt, 0, sizeof(int) * (size_t)E);
    for (int t = 0; t < N; t++) {
        route_token(r, r->probs + (size_t)t * E, sig ? r->bias : NULL, t);
        for (int k = 0; k < K; k++) r->cnt[r->topi[(size_t)t * K + k]]++;
    }
    for (int a = 0; a < N * K; a++) r->slot[a] = 0;
    r->dropped = 0;
    if (drops) PL_TRY(route_capacity(r, c->moe.capacity));
    r->M = 0;
    for (int e = 0; e < E; e++) {
        r->off[e] = r->M;
        for (int a = 0; a < N * K; a++)
            if (r->topi[a] == e && r->slot[a] >= 0) {
                r->rows[r->M] = a / K;
                r->wsorted[r->M] = r->topw[a];
                r->slot[a] = r->M++;
            }
    }
    r->off[E] = r->M;
    return PL_OK;
}

/* Rebuild the expert order of a routed micro-batch from its kept choices (topi, topw, slot
 * copied to the host): off, rows, wsorted, cnt. */
static void route_from_slots(route *r) {
    int E = r->E, K = r->K, N = r->N;
    memset(r->cnt, 0, sizeof(int) * (size_t)E);
    memset(r->off, 0, sizeof(int) * ((size_t)E + 1));
    r->M = 0;
    for (int a = 0; a < N * K; a++) {
        r->cnt[r->topi[a]]++;
        if (r->slot[a] >= 0) r->off[r->topi[a] + 1]++;
    }
    for (int e = 0; e < E; e++) r->off[e + 1] += r->off[e];
    r->M = r->off[E];
    for (int a = 0; a < N * K; a++)
        if (r->slot[a] >= 0) {
            r->rows[r->slot[a]] = a / K;
            r->wsorted[r->slot[a]] = r->topw[a];
        }
}

/* ---- the MoE layer ---- */

/* A forward product: matmul_fwd, or in decoding matmul_decode_fwd (each row's result
 * independent of how many rows an expert gets, so a decode's bits do not depend on the items). */
typedef int (*mm_fn)(float *out, const float *inp, const float *w, const float *b, int N, int C, int OC);

/* The rows one call of the experts' math runs over: chunk i is expert ex[i]'s n[i] rows, the
 * chunks consecutive from row 0 (one per expert in a rank's own order; with --ep one per
 * (source rank, local expert), each the rows that rank's own order holds for that expert, so
 * every product is the call one process makes: a token's bits do not depend on E). */
typedef struct {
    int nch, rows;
    int *ex, *n;
} chunks;

/* The experts' buffers over a call's rows (R): x, y, dy, dx, tmp (R, C); up, gate, prod,
 * dprod, dup, dgate (R, F). */
typedef struct {
    float *x, *up, *gate, *prod, *y, *dy, *dprod, *dup, *dgate, *dx, *tmp;
} xbufs;

/* The chunks of a rank's own routed micro-batch: one per expert. */
static chunks chunks_of_route(const route *r, int *ex, int *n) {
    for (int e = 0; e < r->E; e++) { ex[e] = e; n[e] = r->off[e + 1] - r->off[e]; }
    return (chunks){r->E, r->M, ex, n};
}

/* The experts' forward over the chunks: up, gate, product, expert output. */
static int experts_fwd(const backend *be, const block_dims *d, float *const *p, const chunks *ch, const xbufs *b,
                       mm_fn mm) {
    size_t C = (size_t)d->C, F = (size_t)d->cfg->moe.ffn, o = 0;
    for (int i = 0; i < ch->nch; o += (size_t)ch->n[i++]) {
        int n = ch->n[i], e = ch->ex[i];
        if (!n) continue; /* an expert no token chose */
        PL_TRY(mm(b->up + o * F, b->x + o * C, p[X_W3] + (size_t)e * F * C, NULL, n, (int)C, (int)F)); // (n, F)
        PL_TRY(mm(b->gate + o * F, b->x + o * C, p[X_W1] + (size_t)e * F * C, NULL, n, (int)C, (int)F));
    }
    PL_TRY(be->swiglu_fwd(b->prod, b->up, b->gate, (size_t)ch->rows * F)); // (R, F)
    o = 0;
    for (int i = 0; i < ch->nch; o += (size_t)ch->n[i++])
        if (ch->n[i])
            PL_TRY(mm(b->y + o * C, b->prod + o * F, p[X_W2] + (size_t)ch->ex[i] * C * F, NULL, ch->n[i], (int)F,
                      (int)C)); // (n, C)
    return PL_OK;
}

/* The experts' input part over the chunks: dprod = dy w2, dup / dgate through SwiGLU, dx =
 * dup w3 + dgate w1 (tmp: the second product). */
static int experts_bwd_in(const backend *be, const block_dims *d, float *const *p, const chunks *ch, const xbufs *b) {
    size_t C = (size_t)d->C, F = (size_t)d->cfg->moe.ffn, o = 0;
    for (int i = 0; i < ch->nch; o += (size_t)ch->n[i++])
        if (ch->n[i])
            PL_TRY(be->matmul_bwd_input(b->dprod + o * F, b->dy + o * C, p[X_W2] + (size_t)ch->ex[i] * C * F,
                                        ch->n[i], (int)F, (int)C)); // (n, F)
    PL_TRY(be->swiglu_bwd(b->dup, b->dgate, b->dprod, b->up, b->gate, (size_t)ch->rows * F));
    o = 0;
    for (int i = 0; i < ch->nch; o += (size_t)ch->n[i++]) {
        int n = ch->n[i], e = ch->ex[i];
        if (!n) continue;
        PL_TRY(be->matmul_bwd_input(b->dx + o * C, b->dup + o * F, p[X_W3] + (size_t)e * F * C, n, (int)C, (int)F));
        PL_TRY(be->matmul_bwd_input(b->tmp + o * C, b->dgate + o * F, p[X_W1] + (size_t)e * F * C, n, (int)C,
                                    (int)F)); // (n, C)
    }
    return be->add_inplace(b->dx, b->tmp, (size_t)ch->rows * C);
}

/* --grad-accum exact under --ep: experts [e0, e0 + ne)'s gradients so far into the fixed-point
 * sums (each source rank's share one addend, as that rank's own would be with --ep 1). */
static void experts_fold(const block_dims *d, float *const *g, int e0, int ne) {
    size_t C = (size_t)d->C, F = (size_t)d->cfg->moe.ffn, n = (size_t)ne * F * C;
    const int rows[3] = {X_W1, X_W3, X_W2};
    for (int k = 0; d->acc && k < 3; k++) {
        float *at = g[rows[k]] + (size_t)e0 * F * C;
        exact_fold(d->acc + (at - d->grads), at, n);
    }
}

/* The experts' weight part over the chunks; fold > 0 (exact mode under --ep): fold after
 * every `fold` chunks (one source rank's), experts ex[0]..ex[fold - 1]. */
static int experts_bwd_w(const backend *be, const block_dims *d, float *const *g, const chunks *ch, const xbufs *b,
                         int fold) {
    size_t C = (size_t)d->C, F = (size_t)d->cfg->moe.ffn, o = 0;
    for (int i = 0; i < ch->nch; o += (size_t)ch->n[i++]) {
        int n = ch->n[i], e = ch->ex[i];
        if (n) {
            const float *x = b->x + o * C; // (n, C)
            PL_TRY(be->matmul_bwd_weight(g[X_W2] + (size_t)e * C * F, NULL, b->dy + o * C, b->prod + o * F, n, (int)F,
                                         (int)C));
            PL_TRY(be->matmul_bwd_weight(g[X_W3] + (size_t)e * F * C, NULL, b->dup + o * F, x, n, (int)C, (int)F));
            PL_TRY(be->matmul_bwd_weight(g[X_W1] + (size_t)e * F * C, NULL, b->dgate + o * F, x, n, (int)C, (int)F));
        }
        if (fold > 0 && (i + 1) % fold == 0) experts_fold(d, g, ch->ex[0], fold);
    }
    return PL_OK;
}

/* ---- expert parallelism (--ep: parallel/ep.h) ---- */

static model_ep_hook ep_group_hook; /* size 0: none installed */

void model_set_ep_hook(const model_ep_hook *h) {
    if (h) ep_group_hook = *h;
    else memset(&ep_group_hook, 0, sizeof ep_group_hook);
}

/* An exchange's plan: this rank's rows to each EP rank (scount, S), the rows each rank sends
 * each local expert (the chunks: source-major, S x El), their sums per source (rcount). */
typedef struct {
    int S, El;
    int *scount, *rcount, *kept, *ex, *n;
    chunks ch;
    void *mem;
} ep_plan;

/* Counts first: each rank's kept rows per expert to the experts' ranks. */
static int ep_plan_make(ep_plan *pl, const route *r, int phase) {
    int S = ep_group_hook.size, El = r->E / S;
    memset(pl, 0, sizeof *pl);
    pl->mem = malloc(sizeof(int) * (2 * (size_t)S + (size_t)r->E + 2 * (size_t)S * El));
    if (!pl->mem) return PL_ENOMEM;
    pl->S = S; pl->El = El;
    pl->scount = pl->mem; pl->rcount = pl->scount + S; pl->kept = pl->rcount + S;
    pl->ex = pl->kept + r->E; pl->n = pl->ex + (size_t)S * El;
    for (int e = 0; e < r->E; e++) pl->kept[e] = r->off[e + 1] - r->off[e];
    for (int j = 0; j < S; j++) pl->scount[j] = r->off[(j + 1) * El] - r->off[j * El];
    int rc = ep_group_hook.counts(ep_group_hook.ctx, pl->kept, pl->n, El, phase);
    if (rc != PL_OK) {
        free(pl->mem);
        pl->mem = NULL;
        return rc;
    }
    int R = 0;
    for (int j = 0; j < S; j++) {
        pl->rcount[j] = 0;
        for (int k = 0; k < El; k++) {
            pl->ex[j * El + k] = ep_group_hook.rank * El + k;
            pl->rcount[j] += pl->n[j * El + k];
        }
        R += pl->rcount[j];
    }
    pl->ch = (chunks){S * El, R, pl->ex, pl->n};
    return PL_OK;
}

/* Host room for R rows of nc arrays of C floats and nf of F (x, then y..., in xbufs order as
 * asked): what the owner of the experts computes into. */
static float *ep_room(size_t R, const block_dims *d, int nc, int nf) {
    return malloc(sizeof(float) * (R * ((size_t)nc * d->C + (size_t)nf * d->cfg->moe.ffn) + 1));
}

/* The forward under --ep: xg's rows to their experts' ranks, the products there, y, up and gate
 * back into this rank's order; prod = swiglu(up, gate) here. */
static int experts_forward_ep(const backend *be, const block_dims *d, float *const *p, float *const *a,
                              const route *r) {
    size_t C = (size_t)d->C, F = (size_t)d->cfg->moe.ffn;
    ep_plan pl;
    PL_TRY(ep_plan_make(&pl, r, EP_PHASE_DISPATCH));
    size_t R = (size_t)pl.ch.rows;
    float *m = ep_room(R, d, 2, 3);
    int rc = m ? PL_OK : PL_ENOMEM;
    xbufs b = {.x = m, .y = m + R * C, .up = m + 2 * R * C, .gate = m + 2 * R * C + R * F,
               .prod = m + 2 * R * C + 2 * R * F};
    const float *s1[1] = {a[XA_XG]};
    float *r1[1] = {b.x};
    int w1[1] = {(int)C}, w3[3] = {(int)C, (int)F, (int)F};
    if (rc == PL_OK) rc = ep_group_hook.rows(ep_group_hook.ctx, 1, s1, r1, w1, pl.scount, pl.rcount, EP_PHASE_DISPATCH);
    if (rc == PL_OK) rc = experts_fwd(be, d, p, &pl.ch, &b, be->matmul_fwd);
    const float *s3[3] = {b.y, b.up, b.gate};
    float *r3[3] = {a[XA_Y], a[XA_UP], a[XA_GATE]};
    if (rc == PL_OK) rc = ep_group_hook.rows(ep_group_hook.ctx, 3, s3, r3, w3, pl.rcount, pl.scount, EP_PHASE_COMBINE);
    if (rc == PL_OK) rc = be->swiglu_fwd(a[XA_PROD], a[XA_UP], a[XA_GATE], (size_t)r->M * F); // (M, F)
    free(m);
    free(pl.mem);
    return rc;
}

/* The input part under --ep: dy, up, gate to the experts' ranks; dx, dup, dgate back (dx into
 * d->x[KC], dup / dgate into their output-gradient rows for the weight part). */
static int experts_backward_ep(const backend *be, const block_dims *d, float *const *p, float *const *a,
                               float *const *dd, const route *r) {
    size_t C = (size_t)d->C, F = (size_t)d->cfg->moe.ffn;
    ep_plan pl;
    PL_TRY(ep_plan_make(&pl, r, EP_PHASE_BWD_DISPATCH));
    size_t R = (size_t)pl.ch.rows;
    float *m = ep_room(R, d, 3, 5);
    int rc = m ? PL_OK : PL_ENOMEM;
    xbufs b = {.dy = m, .dx = m + R * C, .tmp = m + 2 * R * C, .up = m + 3 * R * C, .gate = m + 3 * R * C + R * F,
               .dprod = m + 3 * R * C + 2 * R * F, .dup = m + 3 * R * C + 3 * R * F, .dgate = m + 3 * R * C + 4 * R * F};
    int w[3] = {(int)C, (int)F, (int)F};
    const float *s1[3] = {dd[XD_Y], a[XA_UP], a[XA_GATE]};
    float *r1[3] = {b.dy, b.up, b.gate};
    if (rc == PL_OK) rc = ep_group_hook.rows(ep_group_hook.ctx, 3, s1, r1, w, pl.scount, pl.rcount, EP_PHASE_BWD_DISPATCH);
    if (rc == PL_OK) rc = experts_bwd_in(be, d, p, &pl.ch, &b);
    const float *s2[3] = {b.dx, b.dup, b.dgate};
    float *r2[3] = {d->x[XX_KC], dd[XD_UP], dd[XD_GATE]};
    if (rc == PL_OK) rc = ep_group_hook.rows(ep_group_hook.ctx, 3, s2, r2, w, pl.rcount, pl.scount, EP_PHASE_BWD_COMBINE);
    free(m);
    free(pl.mem);
    return rc;
}

/* The weight part under --ep: x, prod, dy, dup, dgate to the experts' ranks, whose gradients
 * sum every source's rows (exact mode: one fixed-point addend per source rank). */
static int experts_weight_ep(const backend *be, const block_dims *d, float *const *g, float *const *a,
                             float *const *dd, const route *r) {
    size_t C = (size_t)d->C, F = (size_t)d->cfg->moe.ffn;
    ep_plan pl;
    PL_TRY(ep_plan_make(&pl, r, EP_PHASE_WGRAD));
    size_t R = (size_t)pl.ch.rows;
    float *m = ep_room(R, d, 2, 3);
    int rc = m ? PL_OK : PL_ENOMEM;
    xbufs b = {.x = m, .dy = m + R * C, .prod = m + 2 * R * C, .dup = m + 2 * R * C + R * F,
               .dgate = m + 2 * R * C + 2 * R * F};
    int w[5] = {(int)C, (int)F, (int)C, (int)F, (int)F};
    const float *s1[5] = {a[XA_XG], a[XA_PROD], dd[XD_Y], dd[XD_UP], dd[XD_GATE]};
    float *r1[5] = {b.x, b.prod, b.dy, b.dup, b.dgate};
    if (rc == PL_OK) rc = ep_group_hook.rows(ep_group_hook.ctx, 5, s1, r1, w, pl.scount, pl.rcount, EP_PHASE_WGRAD);
    if (rc == PL_OK) rc = experts_bwd_w(be, d, g, &pl.ch, &b, d->acc ? pl.El : 0);
    free(m);
    free(pl.mem);
    return rc;
}

/* The experts of a routed micro-batch: here (one chunk per expert), or under --ep (ep: a
 * training forward with an EP group) on the experts' ranks. */
static int experts_forward(const backend *be, const block_dims *d, float *const *p, float *const *a, const route *r,
                           mm_fn mm, int ep) {
    if (ep) return experts_forward_ep(be, d, p, a, r);
    int ex[MIXTRAL_MAX_EXPERTS], n[MIXTRAL_MAX_EXPERTS];
    chunks ch = chunks_of_route(r, ex, n);
    xbufs b = {.x = a[XA_XG], .up = a[XA_UP], .gate = a[XA_GATE], .prod = a[XA_PROD], .y = a[XA_Y]};
    return experts_fwd(be, d, p, &ch, &b, mm);
}

/* out(N,C) = the shared experts of h, or zeros. */
static int shared_forward(const backend *be, const block_dims *d, float *const *p, float *const *a, const float *h,
                          float *out, mm_fn mm) {
    int N = d->N, C = d->C, SF = d->cfg->moe.shared * d->cfg->moe.ffn;
    if (!SF) return be->zero(out, (size_t)N * C * sizeof(float));
    PL_TRY(mm(a[XA_SUP], h, p[X_SW3], NULL, N, C, SF));   // (N, SF)
    PL_TRY(mm(a[XA_SGATE], h, p[X_SW1], NULL, N, C, SF)); // (N, SF)
    PL_TRY(be->swiglu_fwd(a[XA_SPROD], a[XA_SUP], a[XA_SGATE], (size_t)N * SF));
    return mm(out, a[XA_SPROD], p[X_SW2], NULL, N, SF, C); // (N, C)
}

/* The sparse layer on h = a[MLPNORM]: res3 = res2 + shared(h) + the tokens' experts (drops:
 * training's forward, the capacity applies; 0: decoding, dropless, matmul_decode_fwd). */
static int moe_forward(const backend *be, const block_dims *d, float *const *p, float *const *a, int drops) {
    const model_config *c = d->cfg;
    int N = d->N, C = d->C, E = c->moe.n_experts, K = c->moe.top_k;
    mm_fn mm = drops ? be->matmul_fwd : be->matmul_decode_fwd; /* drops: training's forward, else decoding */
    route r;
    PL_TRY(route_alloc(&r, N, E, K));
    int rc = mm(d->x[XX_E], a[XA_MLPNORM], p[X_ROUTER], NULL, N, C, E); // logits (N, E)
    if (rc == PL_OK) rc = be->to_host(r.logits, d->x[XX_E], (size_t)N * E * sizeof(float));
    if (rc == PL_OK) rc = be->to_host(r.bias, p[X_RBIAS], (size_t)E * sizeof(float));
    if (rc == PL_OK) rc = route_build(&r, c, drops);
    if (rc == PL_OK) {
        size_t nk = (size_t)N * K * sizeof(float);
        rc = be->from_host(a[XA_PROBS], r.probs, (size_t)N * E * sizeof(float));
        if (rc == PL_OK) rc = be->from_host(a[XA_TOPW], r.topw, nk);
        if (rc == PL_OK) rc = be->from_host(a[XA_TOPI], r.topi, nk);
        if (rc == PL_OK) rc = be->from_host(a[XA_SLOT], r.slot, nk);
        if (rc == PL_OK) rc = be->from_host(d->x[XX_K], r.rows, (size_t)r.M * sizeof(int));
    }
    if (rc == PL_OK) rc = be->moe_gather(a[XA_XG], a[XA_MLPNORM], (const int *)d->x[XX_K], NULL, r.M, C); // (M, C)
    if (rc == PL_OK) rc = experts_forward(be, d, p, a, &r, mm, drops && ep_group_hook.size > 1);
    if (rc == PL_OK) rc = shared_forward(be, d, p, a, a[XA_MLPNORM], a[XA_RES3], mm);
    if (rc == PL_OK) rc = be->moe_combine(a[XA_RES3], a[XA_Y], (const int *)a[XA_SLOT], a[XA_TOPW], N, K, C);
    if (rc == PL_OK) rc = be->residual_fwd(a[XA_RES3], a[XA_RES3], a[XA_RES2], (size_t)N * C);
    free(r.mem);
    return rc;
}

/* A routed micro-batch's choices back on the host (topi, topw, slot, probs), its order rebuilt. */
static int route_fetch(const backend *be, const block_dims *d, float *const *a, route *r) {
    int N = d->N, E = d->cfg->moe.n_experts, K = d->cfg->moe.top_k;
    size_t nk = (size_t)N * K * sizeof(float);
    PL_TRY(route_alloc(r, N, E, K));
    int rc = be->to_host(r->topi, a[XA_TOPI], nk);
    if (rc == PL_OK) rc = be->to_host(r->topw, a[XA_TOPW], nk);
    if (rc == PL_OK) rc = be->to_host(r->slot, a[XA_SLOT], nk);
    if (rc == PL_OK) rc = be->to_host(r->probs, a[XA_PROBS], (size_t)N * E * sizeof(float));
    if (rc != PL_OK) {
        free(r->mem);
        r->mem = NULL;
        return rc;
    }
    route_from_slots(r);
    return PL_OK;
}

/* dL/d(logits) of one token (host, in place of dw's room in r->logits): through the weights'
 * normalisation, the aux loss (gaux per chosen count), and the softmax or the sigmoid. */
static void route_token_bwd(const route *r, const model_config *c, int t, const float *dw, double gaux, float *dz) {
    int E = r->E, K = r->K, sig = c->moe.router == MOE_ROUTER_SIGMOID_BIAS;
    const float *p = r->probs + (size_t)t * E, *tw = r->topw + (size_t)t * K;
    const int *ti = r->topi + (size_t)t * K;
    double dp[MIXTRAL_MAX_EXPERTS], den = 0, wd = 0, ps = 0, dq = 0;
    for (int k = 0; k < K; k++) { den += p[ti[k]]; wd += (double)dw[k] * tw[k]; }
    for (int e = 0; e < E; e++) { dp[e] = 0; ps += p[e]; }
    for (int k = 0; k < K; k++) dp[ti[k]] = (dw[k] - wd) / den;
    /* aux = E sum_e (n_e / N) mean_t q_t[e]: dL/dq_t[e] = gaux n_e; q = p (softmax) or p / sum p */
    for (int e = 0; e < E; e++) dq += gaux * r->cnt[e] * (sig ? p[e] / ps : p[e]);
    for (int e = 0; e < E; e++) dp[e] += sig ? (gaux * r->cnt[e] - dq) / ps : gaux * r->cnt[e];
    double s = 0;
    for (int e = 0; !sig && e < E; e++) s += p[e] * dp[e];
    for (int e = 0; e < E; e++) dz[e] = (float)(sig ? dp[e] * p[e] * (1.0 - p[e]) : p[e] * (dp[e] - s));
}

/* The router's backward: dw (N,K) from the combine, dlogits into dd[LOGITS]. */
static int router_backward(const backend *be, const block_dims *d, float *const *a, float *const *dd, const float *dres,
                           route *r) {
    const model_config *c = d->cfg;
    int N = d->N, E = r->E, K = r->K;
    PL_TRY(be->moe_rowdot(d->x[XX_KW], dres, a[XA_Y], (const int *)a[XA_SLOT], N, K, d->C)); // dw (N, K)
    float *dwh = malloc(sizeof(float) * ((size_t)N * K + (size_t)N * E)); /* dw (N, K), then dlogits (N, E) */
    if (!dwh) return PL_ENOMEM;
    float *dz = dwh + (size_t)N * K;
    int rc = be->to_host(dwh, d->x[XX_KW], (size_t)N * K * sizeof(float));
    double share = c->moe.mb_share > 0 ? c->moe.mb_share : 1.0;
    double gaux = (double)c->moe.aux_coef * share * E / ((double)c->L * N * N);
    for (int t = 0; rc == PL_OK && t < N; t++) route_token_bwd(r, c, t, dwh + (size_t)t * K, gaux, dz + (size_t)t * E);
    if (rc == PL_OK) rc = be->from_host(dd[XD_LOGITS], dz, (size_t)N * E * sizeof(float));
    free(dwh);
    return rc;
}

/* The experts' input part: dY = w dres per assignment, through w2, SwiGLU, w1 and w3 (here
 * or under --ep on the experts' ranks); the dispatched rows' gradient into d->x[KC] (M, C). */
static int experts_backward(const backend *be, const block_dims *d, float *const *p, float *const *a,
                            float *const *dd, const float *dres, const route *r) {
    PL_TRY(be->from_host(d->x[XX_K], r->rows, (size_t)r->M * sizeof(int)));
    PL_TRY(be->from_host(d->x[XX_KW], r->wsorted, (size_t)r->M * sizeof(float)));
    PL_TRY(be->moe_gather(dd[XD_Y], dres, (const int *)d->x[XX_K], d->x[XX_KW], r->M, d->C)); // dY (M, C)
    if (ep_group_hook.size > 1) return experts_backward_ep(be, d, p, a, dd, r);
    int ex[MIXTRAL_MAX_EXPERTS], n[MIXTRAL_MAX_EXPERTS];
    chunks ch = chunks_of_route(r, ex, n);
    xbufs b = {.dy = dd[XD_Y], .up = a[XA_UP], .gate = a[XA_GATE], .dprod = d->x[XX_KF], .dup = dd[XD_UP],
               .dgate = dd[XD_GATE], .dx = d->x[XX_KC], .tmp = d->x[XX_KC2]};
    return experts_bwd_in(be, d, p, &ch, &b);
}

/* The shared experts' input part, added into dh (N, C). */
static int shared_backward(const backend *be, const block_dims *d, float *const *p, float *const *a, float *const *dd,
                           const float *dres, float *dh) {
    int N = d->N, C = d->C, SF = d->cfg->moe.shared * d->cfg->moe.ffn;
    if (!SF) return PL_OK;
    float *tmp = d->x[XX_KC2];
    PL_TRY(be->matmul_bwd_input(d->x[XX_SF], dres, p[X_SW2], N, SF, C)); // d(prod) (N, SF)
    PL_TRY(be->swiglu_bwd(dd[XD_SUP], dd[XD_SGATE], d->x[XX_SF], a[XA_SUP], a[XA_SGATE], (size_t)N * SF));
    PL_TRY(be->matmul_bwd_input(tmp, dd[XD_SUP], p[X_SW3], N, C, SF));
    PL_TRY(be->add_inplace(dh, tmp, (size_t)N * C));
    PL_TRY(be->matmul_bwd_input(tmp, dd[XD_SGATE], p[X_SW1], N, C, SF));
    return be->add_inplace(dh, tmp, (size_t)N * C);
}

/* The sparse layer's input part: dd[MLPNORM] = dL/dh (router, experts, shared), then dres
 * through the norm (dres holds dL/d(res3), which is also the residual's share). */
static int moe_backward_input(const backend *be, const block_dims *d, float *const *p, float *const *a, float *dres,
                              float *const *dd) {
    int N = d->N, C = d->C, E = d->cfg->moe.n_experts, K = d->cfg->moe.top_k;
    route r;
    PL_TRY(be->copy(dd[XD_SOUT], dres, (size_t)N * C * sizeof(float)));
    PL_TRY(route_fetch(be, d, a, &r));
    int rc = router_backward(be, d, a, dd, dres, &r);
    if (rc == PL_OK) rc = experts_backward(be, d, p, a, dd, dres, &r);
    if (rc == PL_OK) rc = be->matmul_bwd_input(dd[XD_MLPNORM], dd[XD_LOGITS], p[X_ROUTER], N, C, E); // (N, C)
    if (rc == PL_OK) rc = be->moe_combine(dd[XD_MLPNORM], d->x[XX_KC], (const int *)a[XA_SLOT], NULL, N, K, C);
    if (rc == PL_OK) rc = shared_backward(be, d, p, a, dd, dres, dd[XD_MLPNORM]);
    free(r.mem);
    PL_TRY(rc);
    return be->rmsnorm_bwd_input(dres, dd[XD_MLPNORM], a[XA_RES2], p[X_MLPNORM], a[XA_MLPNORM_RSTD], N, C);
}

/* The router's statistics of this process's weight parts (one per layer and micro-batch of a
 * training step), until model_moe_stats_take: the aux loss's share, the dropped assignments,
 * the sum of max / mean tokens per expert and its count. */
static double moe_stats[4];

void model_moe_stats_take(double out[4]) {
    memcpy(out, moe_stats, sizeof moe_stats);
    memset(moe_stats, 0, sizeof moe_stats);
}

/* A routed micro-batch's aux loss share and load into moe_stats. */
static void moe_stats_add(const route *r, const model_config *c) {
    int N = r->N, E = r->E, sig = c->moe.router == MOE_ROUTER_SIGMOID_BIAS, mx = 0, dropped = 0;
    double aux = 0, share = c->moe.mb_share > 0 ? c->moe.mb_share : 1.0;
    for (int e = 0; e < E; e++) {
        double P = 0;
        for (int t = 0; t < N; t++) {
            const float *p = r->probs + (size_t)t * E;
            double ps = 0;
            for (int j = 0; sig && j < E; j++) ps += p[j];
            P += sig ? p[e] / ps : p[e];
        }
        aux += (double)r->cnt[e] / N * P / N;
        mx = r->cnt[e] > mx ? r->cnt[e] : mx;
    }
    for (int a = 0; a < N * r->K; a++) dropped += r->slot[a] < 0;
    moe_stats[0] += share * E * aux / c->L;
    moe_stats[1] += dropped;
    moe_stats[2] += mx / ((double)N * r->K / E);
    moe_stats[3] += 1;
}

/* The sparse layer's weight part: each expert's three matrices over its rows, the router, the
 * shared experts, the norm; the sigmoid-bias router's load error into the bias's slot. */
static int moe_backward_weight(const backend *be, const block_dims *d, float *const *g, float *const *a,
                               float *const *dd) {
    const model_config *c = d->cfg;
    int N = d->N, C = d->C, F = c->moe.ffn, E = c->moe.n_experts, SF = c->moe.shared * F;
    route r;
    PL_TRY(route_fetch(be, d, a, &r));
    int rc, ex[MIXTRAL_MAX_EXPERTS], n[MIXTRAL_MAX_EXPERTS];
    chunks ch = chunks_of_route(&r, ex, n);
    xbufs b = {.x = a[XA_XG], .prod = a[XA_PROD], .dy = dd[XD_Y], .dup = dd[XD_UP], .dgate = dd[XD_GATE]};
    rc = ep_group_hook.size > 1 ? experts_weight_ep(be, d, g, a, dd, &r) : experts_bwd_w(be, d, g, &ch, &b, 0);
    if (rc == PL_OK) moe_stats_add(&r, c);
    if (rc == PL_OK && c->moe.router == MOE_ROUTER_SIGMOID_BIAS) { /* the load error, scaled (see the top) */
        for (int e = 0; e < E; e++) r.bias[e] = (float)(LOAD_SCALE * (r.cnt[e] - (double)N * c->moe.top_k / E));
        rc = be->from_host(d->x[XX_E], r.bias, (size_t)E * sizeof(float));
        if (rc == PL_OK) rc = be->add_inplace(g[X_RBIAS], d->x[XX_E], (size_t)E);
    }
    free(r.mem);
    PL_TRY(rc);
    PL_TRY(be->matmul_bwd_weight(g[X_ROUTER], NULL, dd[XD_LOGITS], a[XA_MLPNORM], N, C, E));
    if (SF) {
        PL_TRY(be->matmul_bwd_weight(g[X_SW2], NULL, dd[XD_SOUT], a[XA_SPROD], N, SF, C));
        PL_TRY(be->matmul_bwd_weight(g[X_SW3], NULL, dd[XD_SUP], a[XA_MLPNORM], N, C, SF));
        PL_TRY(be->matmul_bwd_weight(g[X_SW1], NULL, dd[XD_SGATE], a[XA_MLPNORM], N, C, SF));
    }
    return be->rmsnorm_bwd_weight(g[X_MLPNORM], dd[XD_MLPNORM], a[XA_RES2], a[XA_MLPNORM_RSTD], N, C);
}

/* ---- the block ---- */

/* x = x + attproj(attn(rope(qkv(rms1(x)))));  then the sparse layer on rms2(x). */
static int mixtral_block_forward(const backend *be, const block_dims *d, float *const *p, float *const *a,
                                 const float *x) {
    int N = d->N, C = d->C, QKV = d->QKV;
    float eps = d->cfg->llama.norm_eps, *scr = d->x[XX_SCRATCH];
    PL_TRY(be->rmsnorm_fwd(a[XA_ATTNORM], a[XA_ATTNORM_RSTD], x, p[X_ATTNORM], N, C, eps));
    PL_TRY(be->matmul_fwd(scr, a[XA_ATTNORM], p[X_QKVW], NULL, N, C, QKV)); // (N, QKV)
    PL_TRY(be->rope_fwd(a[XA_QKV], scr, d->pcos ? d->pcos : d->x[XX_COS], d->psin ? d->psin : d->x[XX_SIN], N,
                        d->pcos ? N : d->T, d->NH, d->NKV, d->HS));
    PL_TRY(model_attention_fwd(be, d, a[XA_ATTY], a[XA_ATT], a[XA_QKV], d->NKV)); // (N, C)
    PL_TRY(be->matmul_fwd(a[XA_RES2], a[XA_ATTY], p[X_ATTPROJW], NULL, N, C, C));
    PL_TRY(be->residual_fwd(a[XA_RES2], a[XA_RES2], x, (size_t)N * C));
    PL_TRY(be->rmsnorm_fwd(a[XA_MLPNORM], a[XA_MLPNORM_RSTD], a[XA_RES2], p[X_MLPNORM], N, C, eps));
    return moe_forward(be, d, p, a, 1);
}

static int mixtral_block_backward_input(const backend *be, const block_dims *d, float *const *p, float *const *a,
                                        const float *x, float *dres, float *const *dd) {
    int N = d->N, C = d->C, QKV = d->QKV;
    float *scr = d->x[XX_SCRATCH];
    PL_TRY(moe_backward_input(be, d, p, a, dres, dd));
    PL_TRY(be->copy(dd[XD_ATTPROJ], dres, (size_t)N * C * sizeof(float)));
    PL_TRY(be->matmul_bwd_input(dd[XD_ATTNORM], dres, p[X_ATTPROJW], N, C, C)); // d(atty)
    PL_TRY(model_attention_bwd(be, d, scr, dd[XD_ATTNORM], a[XA_QKV], a[XA_ATT], d->NKV));
    PL_TRY(be->rope_bwd(dd[XD_QKV], scr, d->pcos ? d->pcos : d->x[XX_COS], d->psin ? d->psin : d->x[XX_SIN], N,
                        d->pcos ? N : d->T, d->NH, d->NKV, d->HS));
    PL_TRY(be->matmul_bwd_input(dd[XD_ATTNORM], dd[XD_QKV], p[X_QKVW], N, C, QKV)); // (N, C)
    return be->rmsnorm_bwd_input(dres, dd[XD_ATTNORM], x, p[X_ATTNORM], a[XA_ATTNORM_RSTD], N, C);
}

static int mixtral_block_backward_weight(const backend *be, const block_dims *d, float *const *g, float *const *a,
                                         const float *x, float *const *dd) {
    int N = d->N, C = d->C, QKV = d->QKV;
    PL_TRY(moe_backward_weight(be, d, g, a, dd));
    PL_TRY(be->matmul_bwd_weight(g[X_ATTPROJW], NULL, dd[XD_ATTPROJ], a[XA_ATTY], N, C, C));
    PL_TRY(be->matmul_bwd_weight(g[X_QKVW], NULL, dd[XD_QKV], a[XA_ATTNORM], N, C, QKV));
    return be->rmsnorm_bwd_weight(g[X_ATTNORM], dd[XD_ATTNORM], x, a[XA_ATTNORM_RSTD], N, C);
}

static int mixtral_recompute_selective(const backend *be, const block_dims *d, float *const *a) {
    return model_attention_fwd(be, d, a[XA_ATTY], a[XA_ATT], a[XA_QKV], d->NKV);
}

static int mixtral_embed_forward(const backend *be, const block_dims *d, float *const *p, float *x, const int *tok) {
    return be->encoder_fwd(x, tok, p[XE_WTE], d->x[XX_ZERO_POS], d->N, d->T, d->C);
}
static int mixtral_embed_backward(const backend *be, const block_dims *d, float *const *g, const float *dx,
                                  const int *tok) {
    return be->encoder_bwd(g[XE_WTE], d->x[XX_DZERO_POS], dx, tok, d->N, d->T, d->C);
}
static int mixtral_head_norm_forward(const backend *be, const block_dims *d, float *const *p, float *const *a,
                                     const float *x) {
    return be->rmsnorm_fwd(a[XHA_NORM], a[XHA_RSTD], x, p[XH_NORM], d->N, d->C, d->cfg->llama.norm_eps);
}
static int mixtral_head_norm_backward_input(const backend *be, const block_dims *d, float *const *p, float *const *a,
                                            const float *x, float *dres) {
    return be->rmsnorm_bwd_input(dres, a[XHA_DNORM], x, p[XH_NORM], a[XHA_RSTD], d->N, d->C);
}
static int mixtral_head_norm_backward_weight(const backend *be, const block_dims *d, float *const *g, float *const *a,
                                             const float *x) {
    return be->rmsnorm_bwd_weight(g[XH_NORM], a[XHA_DNORM], x, a[XHA_RSTD], d->N, d->C);
}

static int mixtral_scratch_fill(const model_config *c, int T, int row, float *host) {
    size_t n = (size_t)T * (size_t)(c->C / c->NH / 2);
    float *other = malloc(n ? n * sizeof(float) : 1);
    if (!other) return PL_ENOMEM;
    if (row == XX_COS) llama_rope_tables(c, T, host, other);
    else llama_rope_tables(c, T, other, host);
    free(other);
    return PL_OK;
}

/* ---- decoding with a KV cache ---- */

static int mixtral_block_decode(const backend *be, const block_dims *d, float *const *p, float *const *a,
                                const kv_batch *kv, const float *x) {
    int N = d->N, C = d->C, QKV = d->QKV, half = d->HS / 2;
    float eps = d->cfg->llama.norm_eps, *scr = d->x[XX_SCRATCH];
    PL_TRY(be->rmsnorm_fwd(a[XA_ATTNORM], a[XA_ATTNORM_RSTD], x, p[X_ATTNORM], N, C, eps));
    PL_TRY(be->matmul_decode_fwd(scr, a[XA_ATTNORM], p[X_QKVW], NULL, N, C, QKV));
    for (int i = 0; i < kv->nseg; i++) {
        const kv_seg *s = &kv->seg[i];
        size_t r = (size_t)s->row;
        PL_TRY(be->rope_fwd(a[XA_QKV] + r * QKV, scr + r * QKV, d->x[XX_COS] + (size_t)s->pos * half,
                            d->x[XX_SIN] + (size_t)s->pos * half, s->n, s->n, d->NH, d->NKV, d->HS));
        PL_TRY(be->attention_kv_fwd(a[XA_ATTY] + r * C, s->k, s->v, a[XA_QKV] + r * QKV, s->pos, s->n, d->NH, d->NKV,
                                    d->HS));
    }
    PL_TRY(be->matmul_decode_fwd(a[XA_RES2], a[XA_ATTY], p[X_ATTPROJW], NULL, N, C, C));
    PL_TRY(be->residual_fwd(a[XA_RES2], a[XA_RES2], x, (size_t)N * C));
    PL_TRY(be->rmsnorm_fwd(a[XA_MLPNORM], a[XA_MLPNORM_RSTD], a[XA_RES2], p[X_MLPNORM], N, C, eps));
    return moe_forward(be, d, p, a, 0); /* decoding is dropless */
}

static int mixtral_embed_decode(const backend *be, const block_dims *d, float *const *p, float *x, const int *tok,
                                const kv_batch *kv) {
    int C = d->C;
    for (int i = 0; i < kv->nseg; i++) {
        const kv_seg *s = &kv->seg[i];
        PL_TRY(be->encoder_fwd(x + (size_t)s->row * C, tok + s->row, p[XE_WTE], d->x[XX_ZERO_POS], s->n, s->n, C));
    }
    return PL_OK;
}

/* ---- config ---- */

/* The MoE settings' ranges, named as options, attributes or header fields. */
static int moe_check(const moe_config *m, cfg_naming naming, char *err, size_t errlen) {
    int opt = naming == CFG_NAME_OPTION;
    const char *what = NULL;
    if (m->n_experts < 1 || m->n_experts > MIXTRAL_MAX_EXPERTS) what = opt ? "--n-experts" : "n_experts";
    else if (m->top_k < 1 || m->top_k > m->n_experts) what = opt ? "--experts-per-token" : "experts_per_token";
    else if (m->ffn < 1 || m->ffn > (1 << 20)) what = opt ? "--moe-ffn-dim" : "moe_ffn_dim";
    else if (m->shared < 0 || m->shared > 64) what = opt ? "--shared-experts" : "shared_experts";
    else if (m->router != MOE_ROUTER_SOFTMAX && m->router != MOE_ROUTER_SIGMOID_BIAS) what = opt ? "--router" : "router";
    else if (!(m->aux_coef >= 0 && m->aux_coef <= 1e3)) what = opt ? "--router-aux-coef" : "router_aux_coef";
    else if (!(m->bias_rate >= 0 && m->bias_rate <= 1e3)) what = opt ? "--router-bias-rate" : "router_bias_rate";
    else if (!(m->capacity >= 0 && m->capacity <= 1e6)) what = opt ? "--capacity-factor" : "capacity_factor";
    if (!what) return PL_OK;
    snprintf(err, errlen, "%s is out of range: n-experts %d (1..%d), experts-per-token %d (1..n-experts: top-k "
             "cannot exceed the expert count), moe-ffn-dim %d (1..2^20), shared-experts %d (0..64), router %d, "
             "router-aux-coef %g (0..1000), router-bias-rate %g (0..1000), capacity-factor %g (0: dropless, or "
             "positive)", what, m->n_experts, MIXTRAL_MAX_EXPERTS, m->top_k, m->ffn, m->shared, m->router,
             (double)m->aux_coef, (double)m->bias_rate, (double)m->capacity);
    return PL_EINVAL;
}

/* A Mixtral config: Llama's attention dimensions (no scaled rope, untied), then the MoE. */
static int mixtral_make(model_config *cfg, int V, int maxT, int L, int NH, int NKV, int C, float eps, float theta,
                        const moe_config *m, cfg_naming naming, char *err, size_t errlen) {
    PL_TRY(moe_check(m, naming, err, errlen));
    PL_TRY(llama_config_make(cfg, V, maxT, L, NH, NKV, C, 1, 0.0f, eps, theta, 0, naming, err, errlen));
    long long expert = (long long)m->n_experts * m->ffn * C;
    if (expert > 2147483647LL) {
        snprintf(err, errlen, "model too large: the stacked experts would hold %lld floats in one tensor", expert);
        return PL_EINVAL;
    }
    cfg->arch = MODEL_MIXTRAL;
    cfg->H = m->ffn;
    cfg->llama.multiple_of = 1;
    cfg->moe = *m;
    cfg->moe.mb_share = 0;
    return PL_OK;
}

static int mixtral_from_options(const pl_options *o, int V, model_config *cfg, char *err, size_t errlen) {
    moe_config m = {o->n_experts, o->experts_per_token, o->moe_ffn_dim, o->shared_experts,
                    strcmp(o->router, "sigmoid-bias") == 0 ? MOE_ROUTER_SIGMOID_BIAS : MOE_ROUTER_SOFTMAX,
                    (float)o->router_aux_coef, (float)o->router_bias_rate, (float)o->capacity_factor, 0};
    if (o->tie_embeddings) {
        snprintf(err, errlen, "--tie-embeddings 1: pipelm's Mixtral has an untied lm_head");
        return PL_EINVAL;
    }
    return mixtral_make(cfg, V, o->max_seq_len, o->n_layer, o->n_head, o->n_kv_head ? o->n_kv_head : o->n_head,
                        o->n_embd, (float)o->norm_eps, (float)o->rope_theta, &m, CFG_NAME_OPTION, err, errlen);
}

static int mixtral_check(const model_config *c, cfg_naming naming, char *err, size_t errlen) {
    cfg_llama l = {c->NH, c->NKV, 1, 0, 3, 1, 0, c->llama.norm_eps, c->llama.rope_theta};
    PL_TRY(config_check_llama(&l, naming, err, errlen));
    return moe_check(&c->moe, naming, err, errlen);
}

static int mixtral_conflicts(const pl_options *o, const model_config *c, char *err, size_t errlen) {
    (void)o; (void)c; (void)err; (void)errlen;
    return PL_OK; /* the MoE options are taken from the file (their set bits are not tracked yet) */
}

static int mixtral_same(const model_config *f, const model_config *r, cfg_naming naming, char *err, size_t errlen) {
    const moe_config *a = &f->moe, *b = &r->moe;
    (void)naming;
    if (f->llama.norm_eps != r->llama.norm_eps || f->llama.rope_theta != r->llama.rope_theta) {
        snprintf(err, errlen, "norm-eps / rope-theta are %g / %g in the file but %g / %g in this run",
                 (double)f->llama.norm_eps, (double)f->llama.rope_theta, (double)r->llama.norm_eps,
                 (double)r->llama.rope_theta);
        return PL_EINVAL;
    }
    if (a->n_experts != b->n_experts || a->top_k != b->top_k || a->ffn != b->ffn || a->shared != b->shared ||
        a->router != b->router || a->aux_coef != b->aux_coef || a->bias_rate != b->bias_rate ||
        a->capacity != b->capacity) {
        snprintf(err, errlen, "the MoE settings (experts, top-k, ffn, shared, router, aux coef, bias rate, capacity) "
                 "are (%d, %d, %d, %d, %d, %g, %g, %g) in the file but (%d, %d, %d, %d, %d, %g, %g, %g) in this run",
                 a->n_experts, a->top_k, a->ffn, a->shared, a->router, (double)a->aux_coef, (double)a->bias_rate,
                 (double)a->capacity, b->n_experts, b->top_k, b->ffn, b->shared, b->router, (double)b->aux_coef,
                 (double)b->bias_rate, (double)b->capacity);
        return PL_EINVAL;
    }
    return PL_OK;
}

static void mixtral_describe(const model_config *c, char *buf, size_t len) {
    const moe_config *m = &c->moe;
    char cap[48] = "dropless";
    if (m->capacity > 0) snprintf(cap, sizeof cap, "capacity %g", (double)m->capacity);
    snprintf(buf, len, "mixtral V=%d (padded %d) C=%d L=%d NH=%d NKV=%d experts=%d top-%d ffn=%d shared=%d router=%s "
             "aux=%g %s maxT=%d theta=%g eps=%g", c->V, c->Vp, c->C, c->L, c->NH, c->NKV, m->n_experts, m->top_k,
             m->ffn, m->shared, m->router == MOE_ROUTER_SIGMOID_BIAS ? "sigmoid-bias" : "softmax",
             (double)m->aux_coef, cap, c->maxT, (double)c->llama.rope_theta, (double)c->llama.norm_eps);
}

/* ---- pipelm's Mixtral model file: llm.c's layout, its own 2048-byte header ---- */
/* 256 int32 (magic, version, maxT, V, L, NH, NKV, C, experts, top-k, ffn, shared, router), then
 * 256 float32 (norm_eps, rope_theta, aux coef, bias rate, capacity factor). */
static void mixtral_header_write(const model_config *c, void *hdr) {
    int32_t *h = hdr;
    float *f = (float *)((char *)hdr + 1024);
    const moe_config *m = &c->moe;
    h[0] = MIXTRAL_MAGIC; h[1] = 3; h[2] = c->maxT; h[3] = c->V; h[4] = c->L; h[5] = c->NH; h[6] = c->NKV;
    h[7] = c->C; h[8] = m->n_experts; h[9] = m->top_k; h[10] = m->ffn; h[11] = m->shared; h[12] = m->router;
    f[0] = c->llama.norm_eps; f[1] = c->llama.rope_theta; f[2] = m->aux_coef; f[3] = m->bias_rate; f[4] = m->capacity;
}

static int mixtral_header_read(const char *path, const void *hdr, size_t got, model_config *cfg, char *err,
                               size_t errlen) {
    const int32_t *h = hdr;
    const float *f = (const float *)((const char *)hdr + 1024);
    if (got < 2048) {
        snprintf(err, errlen, "model file %s: shorter than the 2048-byte Mixtral header", path);
        return PL_EIO;
    }
    moe_config m = {h[8], h[9], h[10], h[11], h[12], f[2], f[3], f[4], 0};
    char e2[512];
    if (h[5] < 1 || mixtral_make(cfg, h[3], h[2], h[4], h[5], h[6], h[7], f[0], f[1], &m, CFG_NAME_HEADER, e2,
                                 sizeof e2) != PL_OK) {
        snprintf(err, errlen, "model file %s: bad header: %s", path, h[5] < 1 ? "n_head < 1" : e2);
        return PL_EIO;
    }
    return PL_OK;
}

static const char *const mixtral_attr_int[] = {"n_kv_head", "n_experts", "experts_per_token", "moe_ffn_dim",
                                               "shared_experts", "router"};
static const char *const mixtral_attr_f64[] = {"norm_eps", "rope_theta", "router_aux_coef", "router_bias_rate",
                                               "capacity_factor"};

static void mixtral_attrs_of(const model_config *c, long long *ints, double *f64) {
    const moe_config *m = &c->moe;
    long long li[6] = {c->NKV, m->n_experts, m->top_k, m->ffn, m->shared, m->router};
    double lf[5] = {c->llama.norm_eps, c->llama.rope_theta, m->aux_coef, m->bias_rate, m->capacity};
    memcpy(ints, li, sizeof li);
    memcpy(f64, lf, sizeof lf);
}

static int mixtral_of_attrs(const long long *k, const long long *li, const double *lf, model_config *cfg, char *err,
                            size_t errlen) {
    for (int i = 0; i < 6; i++)
        if (li[i] < 0 || li[i] > INT_MAX) {
            snprintf(err, errlen, "attribute /config/%s = %lld is out of range", mixtral_attr_int[i], li[i]);
            return PL_EIO;
        }
    moe_config m = {(int)li[1], (int)li[2], (int)li[3], (int)li[4], (int)li[5], (float)lf[2], (float)lf[3],
                    (float)lf[4], 0};
    char e2[512];
    if (mixtral_make(cfg, (int)k[0], (int)k[2], (int)k[3], (int)k[4], (int)li[0], (int)k[5], (float)lf[0],
                     (float)lf[1], &m, CFG_NAME_ATTR, e2, sizeof e2) != PL_OK) {
        snprintf(err, errlen, "bad /config (mixtral): %s", e2);
        return PL_EIO;
    }
    return PL_OK;
}

/* ---- Hugging Face's MixtralForCausalLM ---- */

#define MIXTRAL_HF_MAX_EXPERTS 64 /* hf_internal.h's HF_MAX_EXPERTS: the parts one tensor splits into */

static int mixtral_hf_check(const model_config *c, char *err, size_t errlen) {
    const moe_config *m = &c->moe;
    if (m->shared == 0 && m->router == MOE_ROUTER_SOFTMAX && m->capacity == 0 && m->n_experts <= MIXTRAL_HF_MAX_EXPERTS)
        return PL_OK;
    snprintf(err, errlen, "Hugging Face's Mixtral cannot hold this model: %s (pipelm's own model files and "
             "checkpoints hold it)", m->shared ? "shared experts (--shared-experts)" :
             m->router != MOE_ROUTER_SOFTMAX ? "the sigmoid-bias router" : m->capacity != 0 ?
             "a capacity factor (Mixtral is dropless)" : "more than 64 experts");
    return PL_EINVAL;
}

/* MixtralForCausalLM's config.json: the dimensions, the experts, rms_norm_eps, rope_theta,
 * router_aux_loss_coef; what pipelm's Mixtral is not (a tied head, a sliding window shorter
 * than the context, router jitter, head_dim other than C / NH) refused by key. */
static int mixtral_hf_config(const void *j, const char *path, model_config *cfg, char *err, size_t errlen) {
    long long V = 0, T = 0, L = 0, NH = 0, NKV = -1, C = 0, F = 0, E = 0, K = 2, hd = -1, sw = -1;
    double eps = 1e-5, theta = 1e6, aux = 0.001, jitter = 0;
    int tie = 0;
    PL_TRY(hf_json_int(j, path, "vocab_size", 1, 2, 1 << 24, &V, err, errlen));
    PL_TRY(hf_json_int(j, path, "max_position_embeddings", 1, 1, 1 << 20, &T, err, errlen));
    PL_TRY(hf_json_int(j, path, "hidden_size", 1, 1, 65536, &C, err, errlen));
    PL_TRY(hf_json_int(j, path, "intermediate_size", 1, 1, 1 << 20, &F, err, errlen));
    PL_TRY(hf_json_int(j, path, "num_hidden_layers", 1, 1, 10000, &L, err, errlen));
    PL_TRY(hf_json_int(j, path, "num_attention_heads", 1, 1, 65536, &NH, err, errlen));
    PL_TRY(hf_json_int(j, path, "num_key_value_heads", 0, 1, 65536, &NKV, err, errlen));
    PL_TRY(hf_json_int(j, path, "head_dim", 0, 1, 65536, &hd, err, errlen));
    PL_TRY(hf_json_int(j, path, "num_local_experts", 1, 1, MIXTRAL_HF_MAX_EXPERTS, &E, err, errlen));
    PL_TRY(hf_json_int(j, path, "num_experts_per_tok", 0, 1, MIXTRAL_HF_MAX_EXPERTS, &K, err, errlen));
    PL_TRY(hf_json_int(j, path, "sliding_window", 0, 1, 1LL << 40, &sw, err, errlen));
    PL_TRY(hf_json_num(j, path, "rms_norm_eps", 0, 1e-30, 1, &eps, err, errlen));
    PL_TRY(hf_json_num(j, path, "rope_theta", 0, 1, 1e30, &theta, err, errlen));
    PL_TRY(hf_json_num(j, path, "router_aux_loss_coef", 0, 0, 1e3, &aux, err, errlen));
    PL_TRY(hf_json_num(j, path, "router_jitter_noise", 0, 0, 1e3, &jitter, err, errlen));
    PL_TRY(hf_json_bool(j, path, "tie_word_embeddings", &tie, err, errlen));
    const char *act = hf_json_str(j, "hidden_act");
    const char *bad = tie ? "tie_word_embeddings" : jitter != 0 ? "router_jitter_noise" : hd != -1 && hd * NH != C ?
                      "head_dim" : act && strcmp(act, "silu") != 0 ? "hidden_act" : sw != -1 && sw < T ?
                      "sliding_window" : NULL;
    if (bad) {
        snprintf(err, errlen, "%s: %s is not what pipelm's Mixtral is (untied, no router jitter, head_dim = hidden_size "
                 "/ num_attention_heads, silu, no sliding window shorter than max_position_embeddings)", path, bad);
        return PL_EIO;
    }
    moe_config m = {(int)E, (int)K, (int)F, 0, MOE_ROUTER_SOFTMAX, (float)aux, 0.001f, 0, 0};
    char e2[600];
    if (mixtral_make(cfg, (int)V, (int)T, (int)L, (int)NH, (int)(NKV < 0 ? NH : NKV), (int)C, (float)eps, (float)theta,
                     &m, CFG_NAME_ATTR, e2, sizeof e2) != PL_OK) {
        snprintf(err, errlen, "%s: %s", path, e2);
        return PL_EIO;
    }
    return PL_OK;
}

static void mixtral_hf_config_write(const model_config *c, void *j) {
    hf_json_set_str(j, "architectures", "MixtralForCausalLM");
    hf_json_set_int(j, "vocab_size", c->V);
    hf_json_set_int(j, "hidden_size", c->C);
    hf_json_set_int(j, "intermediate_size", c->moe.ffn);
    hf_json_set_int(j, "num_hidden_layers", c->L);
    hf_json_set_int(j, "num_attention_heads", c->NH);
    hf_json_set_int(j, "num_key_value_heads", c->NKV);
    hf_json_set_int(j, "head_dim", c->C / c->NH);
    hf_json_set_int(j, "max_position_embeddings", c->maxT);
    hf_json_set_int(j, "num_local_experts", c->moe.n_experts);
    hf_json_set_int(j, "num_experts_per_tok", c->moe.top_k);
    hf_json_set_float(j, "router_aux_loss_coef", c->moe.aux_coef);
    hf_json_set_float(j, "router_jitter_noise", 0.0f);
    hf_json_set_float(j, "rms_norm_eps", c->llama.norm_eps);
    hf_json_set_float(j, "rope_theta", c->llama.rope_theta);
    hf_json_set_str(j, "hidden_act", "silu");
    hf_json_set_bool(j, "tie_word_embeddings", 0);
}

const model_arch arch_mixtral = {
    .name = "mixtral", .id = MODEL_MIXTRAL,
    .embed = ARCH_ROWS(mixtral_embed), .block = ARCH_ROWS(mixtral_block), .head = ARCH_ROWS(mixtral_head),
    .acts = ARCH_ROWS(mixtral_acts), .douts = ARCH_ROWS(mixtral_douts), .head_acts = ARCH_ROWS(mixtral_head_acts),
    .scratch = mixtral_scratch, .nscratch = (int)(sizeof mixtral_scratch / sizeof mixtral_scratch[0]),
    .block_out = XA_RES3, .head_out = XHA_NORM, .head_dout = XHA_DNORM, .head_matrix = XH_LMHEAD, .tied = 0,
    .head_desc = "the final RMSNorm or lm_head",
    .config_from_options = mixtral_from_options, .config_check = mixtral_check, .init_conflicts = mixtral_conflicts,
    .same_settings = mixtral_same, .describe = mixtral_describe,
    .block_forward = mixtral_block_forward, .block_backward_input = mixtral_block_backward_input,
    .block_backward_weight = mixtral_block_backward_weight, .block_recompute_selective = mixtral_recompute_selective,
    .embed_forward = mixtral_embed_forward, .embed_backward = mixtral_embed_backward,
    .head_norm_forward = mixtral_head_norm_forward, .head_norm_backward_input = mixtral_head_norm_backward_input,
    .head_norm_backward_weight = mixtral_head_norm_backward_weight, .scratch_fill = mixtral_scratch_fill,
    .magic = MIXTRAL_MAGIC, .header_bytes = 2048, .file_desc = "a pipelm Mixtral one",
    .llmc_header_write = mixtral_header_write, .llmc_header_read = mixtral_header_read,
    .attr_int = mixtral_attr_int, .nattr_int = 6, .attr_f64 = mixtral_attr_f64, .nattr_f64 = 5,
    .attrs_of = mixtral_attrs_of, .config_of_attrs = mixtral_of_attrs,
    .block_decode = mixtral_block_decode, .embed_decode = mixtral_embed_decode,
    .llmc_zeros = {{NULL, 0}, {NULL, 0}, {NULL, 0}},
    .llmc_options = NULL,
    .hf_model_type = "mixtral", .hf_ignore = NULL, .hf_config_read = mixtral_hf_config,
    .hf_config_write = mixtral_hf_config_write, .hf_check = mixtral_hf_check,
};
