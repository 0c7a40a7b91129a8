/*
 * arch.c — the architecture registry and everything derived from an architecture's tables:
 * the stage's tensor layout, initial values, parameter and tensor counts, FLOPs, and the
 * bytes of a slot's activations and of a set of output gradients (the figures the split,
 * the report and the stage's own arenas share). In the spirit of llm.c's
 * fill_in_parameter_sizes: sizes are computed from the rows, never written out again.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "model/arch.h"
#include "util/common.h"
#include "util/rng.h"

const model_arch *const arch_registry[] = {&arch_gpt2, &arch_llama, &arch_mixtral};
const int arch_count = (int)(sizeof arch_registry / sizeof arch_registry[0]);

const char *const param_kind_name[P_NKINDS] = {
    "wte", "wpe", "ln1_w", "ln1_b", "qkv_w", "qkv_b", "attproj_w", "attproj_b",
    "ln2_w", "ln2_b", "fc_w", "fc_b", "fcproj_w", "fcproj_b", "lnf_w", "lnf_b",
    "attn_norm_w", "mlp_norm_w", "fc2_w", "lm_head",
    "router_w", "experts_w1", "experts_w3", "experts_w2", "router_bias", "shared_w1", "shared_w3", "shared_w2",
};

/* Look an architecture up by its name, as backend_find does backends. */
const model_arch *arch_find(const char *name) {
    for (int i = 0; name && i < arch_count; i++)
        if (strcmp(arch_registry[i]->name, name) == 0) return arch_registry[i];
    return NULL;
}

/* The descriptor of a config's id (GPT-2's for an id out of range, which no maker produces). */
const model_arch *arch_of(const model_config *c) {
    return c->arch >= 0 && c->arch < arch_count ? arch_registry[c->arch] : arch_registry[0];
}

const char *model_arch_name(int arch) {
    return arch >= 0 && arch < arch_count ? arch_registry[arch]->name : arch_registry[0]->name;
}

/* The names joined by sep ("|" for help, " or " for messages). */
void arch_names(const char *sep, char *buf, size_t len) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < arch_count && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? sep : "", arch_registry[i]->name);
}

size_t arch_dim_value(const model_config *c, int T, arch_dim d) {
    size_t C = c->C, HS = c->NH ? C / c->NH : 0;
    /* --tp: a stage's config holds its rank's slice of the heads and of the MLP (tp.h) */
    int tp = c->tp > 1 ? c->tp : 1;
    size_t NH = (size_t)c->NH / tp, NKV = c->NKV >= tp ? (size_t)c->NKV / tp : 1, H = (size_t)c->H / tp;
    size_t QKV = (NH + 2 * NKV) * HS, wide = H > QKV ? H : QKV;
    switch (d) {
    case AD_NONE: case AD_1: return 1;
    case AD_C: return C;
    case AD_QKV: return QKV;
    case AD_H: return H;
    case AD_VP: return tp > 1 ? ((size_t)c->Vp + tp - 1) / tp + 1 : (size_t)c->Vp; /* --tp: a slice and a sink row */
    case AD_V: return (size_t)c->V;
    case AD_MAXT: return (size_t)c->maxT;
    case AD_NHT: /* --cp: the span kernel's O and log-sum-exp (att_cols = hs + 1) even where T is shorter (a CP
                  * stage has T >= 2; T = 1 asks for the head count) */
        if (c->cp > 1 && c->att_cols > 0 && T > 1) return NH * (size_t)c->att_cols;
        return NH * (c->att_cols > 0 && (size_t)c->att_cols < (size_t)T ? (size_t)c->att_cols : (size_t)T);
    case AD_HALF_HS: return HS / 2;
    case AD_WIDE: return tp > 1 && C > wide ? C : wide;
    case AD_CA: return NH * HS;
    case AD_E: return (size_t)c->moe.n_experts;
    case AD_EF: return (size_t)c->moe.n_experts * (size_t)c->moe.ffn;
    case AD_EC: return (size_t)c->moe.n_experts * C;
    case AD_F: return (size_t)c->moe.ffn;
    case AD_SF: return (size_t)c->moe.shared * (size_t)c->moe.ffn;
    case AD_K: return (size_t)c->moe.top_k;
    case AD_KC: return (size_t)c->moe.top_k * C;
    case AD_KF: return (size_t)c->moe.top_k * (size_t)c->moe.ffn;
    }
    return 0;
}

size_t arch_param_numel(const model_config *c, const arch_param *r, int file) {
    return arch_dim_value(c, 0, file ? r->file_rows : r->rows) * arch_dim_value(c, 0, r->cols);
}

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

int model_head_row_tied(const model_config *c, int row) {
    const model_arch *A = arch_of(c);
    if (row < 0 || row >= A->head.n) return -1;
    if (A->head.rows[row].tied >= 0) return A->head.rows[row].tied;
    return c->tie_embed && row == A->head_matrix ? 0 : -1;
}

int model_is_tied(const model_config *c) {
    for (int i = 0; i < arch_of(c)->head.n; i++)
        if (model_head_row_tied(c, i) >= 0) return 1;
    return 0;
}

/* Append the tensor of one row (part, index) to a table; a tied copy takes its embedding's
 * kind (and so its name: the checkpoint holds it once, as the embedding). */
static void add_row(const model_config *c, param_tensor *out, int *n, size_t *off, const arch_param *r, int part,
                    int row, int layer, int tied_copy) {
    int d0 = (int)arch_dim_value(c, 0, r->rows), d1 = (int)arch_dim_value(c, 0, r->cols);
    int kind = tied_copy ? arch_of(c)->embed.rows[model_head_row_tied(c, row)].kind : r->kind;
    model_add_tensor(out, n, off, kind, layer, r->cols == AD_NONE ? 1 : 2, d0, d1);
    param_tensor *t = &out[*n - 1];
    t->decay = r->decay;
    t->rule = r->kind == P_ROUTERB ? UPDATE_SIGN : UPDATE_ADAMW;
    t->part = part;
    t->row = row;
    t->tied_copy = tied_copy;
}

int model_tensor_is_tied(const model_config *c, const param_tensor *t) {
    const model_arch *A = arch_of(c);
    if (t->tied_copy) return 1;
    for (int i = 0; t->part == PART_EMBED && i < A->head.n; i++)
        if (model_head_row_tied(c, i) == t->row) return 1;
    return 0;
}

/* [embeddings] (first), blocks l0..l1-1, [head] (last; its tied rows only without the
 * embeddings, as copies). */
int model_layout(const model_config *c, int l0, int l1, int has_embed, int has_head, param_tensor *out,
                 size_t *total) {
    const model_arch *A = arch_of(c);
    int n = 0;
    size_t off = 0;
    for (int i = 0; has_embed && i < A->embed.n; i++) add_row(c, out, &n, &off, &A->embed.rows[i], PART_EMBED, i, -1, 0);
    for (int l = l0; l < l1; l++)
        for (int i = 0; i < A->block.n; i++) add_row(c, out, &n, &off, &A->block.rows[i], PART_BLOCK, i, l, 0);
    for (int i = 0; has_head && i < A->head.n; i++) {
        const arch_param *r = &A->head.rows[i];
        int tied = model_head_row_tied(c, i) >= 0;
        if (tied && has_embed) continue; /* the embedding's tensor itself serves */
        add_row(c, out, &n, &off, r, PART_HEAD, i, -1, tied);
    }
    *total = off;
    return n;
}

int model_max_tensors(const model_config *c, int nb) {
    const model_arch *A = arch_of(c);
    return A->embed.n + A->head.n + nb * A->block.n;
}

int model_num_tensors(const model_config *c) {
    const model_arch *A = arch_of(c);
    int n = A->embed.n + c->L * A->block.n;
    for (int i = 0; i < A->head.n; i++) n += model_head_row_tied(c, i) < 0;
    return n;
}

/* The row a table entry was laid out from. */
static const arch_param *row_of(const model_config *c, const param_tensor *t) {
    const model_arch *A = arch_of(c);
    const arch_params *p = t->part == PART_EMBED ? &A->embed : t->part == PART_BLOCK ? &A->block : &A->head;
    return &p->rows[t->row];
}

void model_init_tensor(const model_config *c, const param_tensor *t, unsigned long long seed, float *host) {
    const arch_param *r = row_of(c, t);
    if (r->init == INIT_ONE || r->init == INIT_ZERO) {
        for (size_t k = 0; k < t->numel; k++) host[k] = r->init == INIT_ONE ? 1.0f : 0.0f;
        return;
    }
    /* one stream per (kind, layer): independent of which stage holds the tensor */
    rng_state g;
    rng_seed(&g, seed, 1000003ULL * (unsigned long long)(t->kind + 1) + (unsigned long long)(t->layer + 1));
    float std = r->init == INIT_RESID ? 0.02f / sqrtf(2.0f * c->L) : 0.02f;
    for (size_t k = 0; k < t->numel; k++) host[k] = std * rng_normal(&g);
    if (r->rows == AD_VP) /* padded vocabulary rows are zero */
        memset(host + (size_t)c->V * c->C, 0, (size_t)(c->Vp - c->V) * c->C * sizeof(float));
}

/* The cut of a stage tensor out of the whole one, by its row's dimension codes (model.h). */
void model_tp_slice(const model_config *full, int T, int t, const param_tensor *lt, tp_slice *s) {
    const arch_param *r = row_of(full, lt);
    int HS = full->C / full->NH, NHl = full->NH / T, NKVl = full->NKV >= T ? full->NKV / T : 1;
    int kv0 = full->NKV >= T ? t * NKVl : t / (T / full->NKV); /* this rank's first kv head */
    memset(s, 0, sizeof *s);
    s->rows = (int)arch_dim_value(full, 0, r->rows);
    s->cols = (int)arch_dim_value(full, 0, r->cols);
    if (T <= 1) return;
    if (r->rows == AD_QKV) { /* q | k | v, this rank's heads of each */
        s->mode = TPS_ROWS;
        s->nseg = 3;
        s->lo[0] = t * NHl * HS;
        s->n[0] = NHl * HS;
        s->lo[1] = full->NH * HS + kv0 * HS;
        s->lo[2] = (full->NH + full->NKV) * HS + kv0 * HS;
        s->n[1] = s->n[2] = NKVl * HS;
    } else if (r->rows == AD_VP) { /* the token table / head matrix: a slice of the vocabulary rows */
        int lo, n;
        model_config lc = *full;
        lc.tp = T;
        lc.tpr = t;
        model_tp_vocab(&lc, &lo, &n);
        s->mode = TPS_ROWS;
        s->nseg = 1;
        s->lo[0] = lo;
        s->n[0] = n;
    } else if (r->rows == AD_H) { /* the MLP's first products (and their biases) */
        s->mode = TPS_ROWS;
        s->nseg = 1;
        s->n[0] = full->H / T;
        s->lo[0] = t * s->n[0];
    } else if (r->cols == AD_CA || r->cols == AD_H) { /* row-parallel: a slice of the input columns */
        s->mode = TPS_COLS;
        s->nseg = 1;
        s->n[0] = s->cols / T;
        s->lo[0] = t * s->n[0];
    }
}

/* Copy a slice between the whole tensor and the local one (host memory). */
void model_tp_copy(const tp_slice *s, float *whole, float *local, int to_local) {
    size_t cols = (size_t)s->cols, k = 0;
    if (s->mode == TPS_REPL) {
        size_t n = (size_t)s->rows * cols;
        if (to_local) memcpy(local, whole, n * sizeof(float));
        else memcpy(whole, local, n * sizeof(float));
    } else if (s->mode == TPS_ROWS) {
        for (int g = 0; g < s->nseg; g++) {
            float *w = whole + (size_t)s->lo[g] * cols;
            size_t n = (size_t)s->n[g] * cols;
            if (to_local) memcpy(local + k, w, n * sizeof(float));
            else memcpy(w, local + k, n * sizeof(float));
            k += n;
        }
    } else {
        for (int i = 0; i < s->rows; i++) {
            float *w = whole + (size_t)i * cols + s->lo[0], *l = local + (size_t)i * s->n[0];
            if (to_local) memcpy(l, w, (size_t)s->n[0] * sizeof(float));
            else memcpy(w, l, (size_t)s->n[0] * sizeof(float));
        }
    }
}

/* This TP rank's rows of the (Vp, C) token table / head matrix: ceil(Vp / T) each, the last
 * rank's fewer (its local tensor padded with zero rows, then the sink row). */
void model_tp_vocab(const model_config *c, int *lo, int *n) {
    int T = c->tp > 1 ? c->tp : 1, t = c->tp > 1 ? c->tpr : 0, Rp = (c->Vp + T - 1) / T;
    *lo = t * Rp < c->Vp ? t * Rp : c->Vp;
    *n = c->Vp - *lo < Rp ? c->Vp - *lo : Rp;
}

/* --tp T must divide the heads, the kv heads (or be a multiple of them) and the MLP. */
int model_tp_check(const model_config *c, int T, char *err, size_t errlen) {
    if (T <= 1) return PL_OK;
    if (c->moe.n_experts > 0) {
        snprintf(err, errlen, "--tp %d with --arch %s: tensor parallelism does not split the experts of a "
                 "mixture-of-experts model (run --tp 1)", T, arch_of(c)->name);
        return PL_EINVAL;
    }
    const char *what = NULL;
    int v = 0;
    if (c->NH % T) { what = "the head count (--n-head)"; v = c->NH; }
    else if (c->NKV % T && T % c->NKV) { what = "the key/value head count (--n-kv-head; or T a multiple of it)"; v = c->NKV; }
    else if (c->H % T) { what = "the MLP hidden size"; v = c->H; }
    if (!what) return PL_OK;
    snprintf(err, errlen, "--tp %d does not divide %s %d: tensor parallelism slices heads and the MLP evenly "
             "(choose a --tp that divides it)", T, what, v);
    return PL_EINVAL;
}

/* Floats of a part's rows (skip_tied: leave out rows tied to another; only_2d: matrices only;
 * only_mfu: rows the MFU counts, the routed experts' as the K of E a token uses). */
static size_t part_params(const model_config *c, const arch_params *p, int skip_tied, int only_2d, int only_mfu) {
    size_t n = 0;
    for (int i = 0; i < p->n; i++) {
        const arch_param *r = &p->rows[i];
        int tied = p == &arch_of(c)->head ? model_head_row_tied(c, i) >= 0 : r->tied >= 0;
        if ((skip_tied && tied) || (only_2d && r->cols == AD_NONE) || (only_mfu && !r->mfu)) continue;
        size_t k = arch_param_numel(c, r, 0);
        if ((only_2d || only_mfu) && (r->rows == AD_EF || r->rows == AD_EC) && c->moe.n_experts > 0)
            k = k / (size_t)c->moe.n_experts * (size_t)c->moe.top_k; /* active experts only */
        n += k;
    }
    return n;
}

size_t model_block_params(const model_config *c) { return part_params(c, &arch_of(c)->block, 0, 0, 0); }
size_t model_embed_params(const model_config *c) { return part_params(c, &arch_of(c)->embed, 0, 0, 0); }
size_t model_head_params(const model_config *c, int has_embed) {
    return part_params(c, &arch_of(c)->head, has_embed, 0, 0);
}

size_t model_num_params(const model_config *c) {
    return model_embed_params(c) + (size_t)c->L * model_block_params(c) + model_head_params(c, 1);
}

size_t gpt2_num_params(const model_config *c) { return model_num_params(c); }

/* 2 FLOPs per weight of the block's matrices, plus attention's two products over the full T
 * (NH heads of HS = C channels in total, as the kernels compute it). */
double model_block_flops(const model_config *c, int T) {
    return 2.0 * (double)part_params(c, &arch_of(c)->block, 0, 1, 0) + 4.0 * T * (double)c->C;
}

double model_head_flops(const model_config *c) { return 2.0 * c->Vp * c->C + 5.0 * c->V; }

double model_train_flops_per_token(const model_config *c, int T) {
    const model_arch *A = arch_of(c);
    size_t n = part_params(c, &A->embed, 0, 0, 1) + (size_t)c->L * part_params(c, &A->block, 0, 0, 1) +
               part_params(c, &A->head, 1, 0, 1);
    return 6.0 * (double)n + 6.0 * c->L * c->C * T;
}

size_t model_block_act_floats_per_token(const model_config *c) {
    const arch_acts *a = &arch_of(c)->acts;
    size_t n = 0;
    for (int i = 0; i < a->n; i++)
        if (a->rows[i].per_token != AD_NHT) n += arch_dim_value(c, 0, a->rows[i].per_token);
    return n;
}

/* n floats, rounded up to 64 bytes: the unit every arena is carved in. */
static size_t carved(size_t n) { return (n + 15) / 16 * 16; }

/* Floats of the rows of a table a mode keeps per slot, for N tokens. */
static size_t rows_floats(const model_config *c, const arch_acts *a, size_t N, int T, int mode) {
    size_t n = 0;
    for (int i = 0; i < a->n; i++)
        if (a->rows[i].keep & (1 << mode)) n += carved(N * arch_dim_value(c, T, a->rows[i].per_token));
    return n;
}

size_t model_slot_act_bytes(const model_config *c, int Bm, int T, int nb, int has_embed, int has_head, int mode) {
    const model_arch *A = arch_of(c);
    size_t N = (size_t)Bm * T;
    size_t n = carved(N * c->C) + (has_embed ? carved(N) : 0); /* the input, the tokens (int32) */
    n += (size_t)nb * rows_floats(c, &A->acts, N, T, mode);
    if (has_head) n += rows_floats(c, &A->head_acts, N, T, 0);
    if (c->docs.mask) n += carved(N); /* the document starts (int32) */
    if (c->docs.mask && c->docs.restart) n += 2 * carved(N * (size_t)(c->C / c->NH / 2)); /* per-row rotary tables */
    return n * sizeof(float);
}

