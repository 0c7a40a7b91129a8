/*
 * cpu_attention.c — fused causal grouped-query attention on the CPU (cpu_attention.h): the
 * tiled forward with an online softmax, and the FlashAttention-2 backward that recomputes
 * the probabilities tile by tile from the row log-sum-exp.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "pipelm/backend_math.h"
#include "backend/backend_host.h"
#include "backend/cpu/cpu_attention.h"
#include "util/common.h"

#define TQ CPU_ATT_TQ /* query rows of a forward tile */
#define TK CPU_ATT_TK /* key columns of a forward tile */
#define TB CPU_ATT_TB /* key columns of a backward tile */
#define LANES 16

/* The row loops (exponentials, maxima, sums) in an AVX-512 copy where the CPU has it, chosen
 * once at load time (the build targets the baseline ISA; OpenBLAS picks its kernels at run
 * time too): the same machine always runs the same copy, so the bits stay fixed there. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(PIPELM_NO_CLONES)
#define ROW_CLONES __attribute__((target_clones("avx512f", "default")))
#else
#define ROW_CLONES
#endif

/* x rounded to bf16 (nearest even) and back. */
static inline float round16(float x) {
    uint32_t u = (uint32_t)f32_to_bf16(x) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The rows [0, nr) x columns [0, nc) of x (leading dimension ld) rounded to bf16 in place. */
static void round_rows(float *x, int nr, int nc, int ld) {
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) x[(size_t)r * ld + c] = round16(x[(size_t)r * ld + c]);
}

/* A bf16-rounded copy of n floats (NULL: out of memory). */
static float *rounded_copy(const float *x, size_t n) {
    float *y = malloc(sizeof(float) * (n ? n : 1));
    if (!y) return NULL;
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) y[i] = round16(x[i]);
    return y;
}

/* OpenBLAS at one thread per product while the kernels' threads run (the OpenMP flavour does
 * it by itself inside a parallel region); returns the count to restore, 0 for none. */
static int blas_one(void) {
    int n = openblas_get_num_threads();
    if (openblas_get_parallel() != 1 || n <= 1) return 0;
    openblas_set_num_threads(1);
    return n;
}
static void blas_back(int n) {
    if (n) openblas_set_num_threads(n);
}

/* max(m, x[0..n)): LANES running maxima, then compared in a fixed tree. */
static inline float row_max(const float *x, int n, float m) {
    float lane[LANES];
    for (int l = 0; l < LANES; l++) lane[l] = m;
    int c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int l = 0; l < LANES; l++) lane[l] = x[c + l] > lane[l] ? x[c + l] : lane[l];
    for (; c < n; c++) lane[0] = x[c] > lane[0] ? x[c] : lane[0];
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) lane[l] = lane[l + w] > lane[l] ? lane[l + w] : lane[l];
    return lane[0];
}

/* x[c] = exp(x[c] - m) for c < n; returns their sum: LANES partial sums (lane l adds columns
 * l, l + LANES, ...; the tail goes to lane 0), then added in a fixed tree. */
static inline float row_exp_sum(float *x, int n, float m) {
    float lane[LANES] = {0};
    int c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int l = 0; l < LANES; l++) {
            x[c + l] = exp_fast(x[c + l] - m);
            lane[l] += x[c + l];
        }
    for (; c < n; c++) {
        x[c] = exp_fast(x[c] - m);
        lane[0] += x[c];
    }
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

/* Per-thread scratch of the forward: scores / probabilities s (TQ, TK), the running output
 * o (TQ, HS), the running maximum m (TQ) and sum l (TQ); on (TQ): the row has met its first
 * unmasked column; ds: the current sequence's document starts (T), or NULL. */
typedef struct {
    float *s, *o, *m, *l;
    int on[TQ];
    const int *ds;
    int bf16; /* round the probabilities to bf16 before p v */
} fwd_scratch;

/* The online softmax of a tile's rows (fwd_tile): per row, over its visible columns (its
 * document's, up to the diagonal), the new maximum, o and l rescaled by exp(m_old - m_new),
 * p = exp(s - m_new) (0 on the masked columns), l += sum p. A row's first visible tile starts
 * its sums. */
ROW_CLONES static void fwd_rows(fwd_scratch *w, int r0, int nq, int k0, int nk, int hs) {
    /* r0: the position of the tile's first query row (keys: positions from 0) */
    for (int r = 0; r < nq; r++) {
        float *sr = w->s + (size_t)r * TK, *orow = w->o + (size_t)r * hs;
        int nv = r0 + r - k0 + 1; /* causal columns of this row in the tile (none: <= 0) */
        nv = nv < nk ? nv : nk;
        nv = nv > 0 ? nv : 0;
        int lo = doc_first(w->ds, r0 + r) - k0; /* the columns before its document's first */
        lo = lo > 0 ? lo : 0;
        if (nv <= lo) { /* the whole tile is past this row's diagonal or before its document */
            memset(sr, 0, sizeof(float) * nk);
            continue;
        }
        int first = !w->on[r];
        float mx = row_max(sr + lo, nv - lo, first ? sr[lo] : w->m[r]);
        float alpha = first ? 0.0f : exp_fast(w->m[r] - mx);
        float sum = row_exp_sum(sr + lo, nv - lo, mx);
        memset(sr, 0, sizeof(float) * lo);
        memset(sr + nv, 0, sizeof(float) * (nk - nv));
        w->l[r] = (first ? 0.0f : w->l[r] * alpha) + sum;
        w->m[r] = mx;
        w->on[r] = 1;
        if (first) memset(orow, 0, sizeof(float) * hs);
        else for (int c = 0; c < hs; c++) orow[c] *= alpha;
    }
}

/* One key tile [k0, k0 + nk) for the query rows [r0, r0 + nq): s = scale q k^T, the online
 * softmax (fwd_rows), then o += p v. */
static void fwd_tile(fwd_scratch *w, const float *q, const float *k, const float *v, int r0, int nq, int k0, int nk,
                     int W, int hs, float scale) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, scale, q, W, k + (size_t)k0 * W, W, 0.0f, w->s,
                TK); // s (nq, nk)
    fwd_rows(w, r0, nq, k0, nk, hs);
    if (w->bf16) round_rows(w->s, nq, nk, TK);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hs, nk, 1.0f, w->s, TK, v + (size_t)k0 * W, W, 1.0f,
                w->o, hs); // o (nq, hs) += p (nq, nk) v (nk, hs)
}

/* One query tile [r0, r0 + nq) of one (sequence, query head): q, k, v are the head's columns
 * of the sequence's qkv rows (leading dimension W; k and v: row j holds position j); qpos
 * the position of query row 0, kn > 0: only keys [0, kn) exist; out (ldo), O (rows, hs) and
 * lse (rows) get the tile's rows. */
static void fwd_query_tile(fwd_scratch *w, float *out, float *O, float *lse, const float *q, const float *k,
                           const float *v, int r0, int nq, int qpos, int kn, int W, int ldo, int hs) {
    float scale = 1.0f / sqrtf((float)hs);
    int p0 = qpos + r0, end = kn > 0 && kn < p0 + nq ? kn : p0 + nq; /* first query position; keys [0, end) */
    memset(w->on, 0, sizeof w->on);
    /* the key tiles before the one holding the first row's document start are masked for
     * every row of the tile (document starts do not decrease along a sequence): skipped */
    for (int k0 = doc_first(w->ds, p0) / TK * TK; k0 < end; k0 += TK) {
        int nk = end - k0 < TK ? end - k0 : TK;
        fwd_tile(w, q + (size_t)r0 * W, k, v, p0, nq, k0, nk, W, hs, scale);
    }
    for (int r = 0; r < nq; r++) {
        float inv = 1.0f / w->l[r];
        const float *orow = w->o + (size_t)r * hs;
        float *dst = out + (size_t)(r0 + r) * ldo, *keep = O + (size_t)(r0 + r) * hs;
        for (int c = 0; c < hs; c++) {
            dst[c] = orow[c] * inv;
            keep[c] = dst[c];
        }
        lse[r0 + r] = w->m[r] + logf(w->l[r]);
    }
}

static int check_shape(const char *op, int B, int T, int NH, int NKV, int HS) {
    if (B < 1 || T < 1 || HS < 1 || NKV < 1 || NH % NKV)
        return host_fail(PL_EBACKEND, "%s: bad shape B=%d T=%d NH=%d NKV=%d HS=%d (query heads must divide into kv "
                         "heads)", op, B, T, NH, NKV, HS);
    return 0;
}

/* Parallel over the (sequence, query head, query tile) triples: each is independent and
 * computed the same way on whichever thread, so the bits do not depend on the thread count. */
int cpu_attention_span_fwd(const cpu_att_span *s) {
    int B = s->B, T = s->nq, NH = s->NH, NKV = s->NKV, HS = s->HS;
    PL_TRY(check_shape("attention_gqa_fwd (tiled)", B, T, NH, NKV, HS));
    int nb = blas_one();
    int W = (NH + 2 * NKV) * HS, CO = NH * HS, G = NH / NKV, nqt = (T + TQ - 1) / TQ, failed = 0;
    #pragma omp parallel
    {
        fwd_scratch w = {0};
        w.bf16 = s->bf16;
        float *buf = malloc(sizeof(float) * ((size_t)TQ * TK + (size_t)TQ * HS + 2 * TQ));
        if (buf) w.s = buf, w.o = buf + (size_t)TQ * TK, w.m = w.o + (size_t)TQ * HS, w.l = w.m + TQ;
        else {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (long it = 0; it < (long)B * NH * nqt; it++) {
            if (!buf) continue;
            int bh = (int)(it / nqt), qt = nqt - 1 - (int)(it % nqt); /* the long tiles first */
            int b = bh / NH, h = bh % NH, g = h / G, r0 = qt * TQ, nq = T - r0 < TQ ? T - r0 : TQ;
            const float *row = s->q + (size_t)b * s->q_seq, *kv = s->kv + (size_t)b * s->kv_seq; // (., W)
            float *O = s->O + (size_t)bh * s->st_bh; // (T, HS); lse (T) at s->lse + bh st_bh
            w.ds = s->doc ? s->doc + (size_t)b * s->doc_seq : NULL;
            fwd_query_tile(&w, s->out + (size_t)b * s->out_seq + (size_t)h * HS, O, s->lse + (size_t)bh * s->st_bh,
                           row + (size_t)h * HS, kv + (size_t)(NH + g) * HS, kv + (size_t)(NH + NKV + g) * HS, r0, nq,
                           s->qpos, s->nk, W, CO, HS);
        }
        free(buf);
    }
    blas_back(nb);
    if (failed) return host_fail(PL_ENOMEM, "attention_gqa_fwd (tiled): out of memory for a %d x %d tile", TQ, TK);
    return 0;
}

/* The whole causal sequence: one span from position 0 over the same rows. */
static cpu_att_span whole_span(const float *qkv, int B, int T, int NH, int NKV, int HS, float *state,
                               const int *doc, int bf16) {
    int W = (NH + 2 * NKV) * HS;
    cpu_att_span s = {.B = B, .NH = NH, .NKV = NKV, .HS = HS, .nq = T, .qpos = 0, .q = qkv, .kv = qkv,
                      .q_seq = (size_t)T * W, .kv_seq = (size_t)T * W, .out_seq = (size_t)T * NH * HS,
                      .O = state, .lse = state + (size_t)T * HS, .st_bh = (size_t)T * (HS + 1), .zero_dkv = 1,
                      .doc = doc, .doc_seq = (size_t)T, .bf16 = bf16};
    return s;
}

int cpu_attention_tiled_fwd(float *out, float *state, const float *qkv, int B, int T, int NH, int NKV, int HS,
                            const int *doc, int bf16) {
    PL_TRY(check_shape("attention_gqa_fwd (tiled)", B, T, NH, NKV, HS));
    float *q16 = NULL; // (B, T, W) rounded to bf16
    if (bf16 && !(q16 = rounded_copy(qkv, (size_t)B * T * (NH + 2 * NKV) * HS)))
        return host_fail(PL_ENOMEM, "attention_gqa_fwd (tiled): out of memory for the bf16 copy of qkv");
    cpu_att_span s = whole_span(q16 ? q16 : qkv, B, T, NH, NKV, HS, state, doc, bf16);
    s.out = out;
    int rc = cpu_attention_span_fwd(&s);
    free(q16);
    return rc;
}

/* Per-thread scratch of the backward: probabilities p (T, TB) of a key tile against every
 * query row, their gradient dp (T, TB), and D (T) = rowsum(dO * O) of the current query
 * head. */
typedef struct {
    float *p, *dp, *D;
} bwd_scratch;

/* The views of one (sequence, query head) pair for the backward: rows of leading dimension
 * W (q, k, v and their gradients) or ldo (dO), O (T, hs) and lse (T) from the state. */
typedef struct {
    const float *q, *k, *v, *dO, *O, *lse;
    float *dq, *dk, *dv;
    const int *ds; /* the sequence's document starts (T), or NULL */
    int bf16;      /* round p and ds to bf16 before their products */
    int T, qpos, nk, W, ldo, hs; /* T query rows, the first at position qpos; keys from position 0 (nk > 0: nk of them) */
    float scale;
} bwd_head;

/* p (nq, TB) = exp(s - lse) over each row's visible columns of the key tile [k0, k0 + nk),
 * 0 past the diagonal and before the row's document; query row r0 + r is at position
 * qpos + r0 + r. */
ROW_CLONES static void bwd_probs(float *p, const float *lse, const int *ds, int r0, int nq, int qpos, int k0,
                                 int nk) {
    for (int r = 0; r < nq; r++) {
        float *pr = p + (size_t)r * TB, l = lse[r0 + r];
        int pos = qpos + r0 + r, nv = pos - k0 + 1, lo = doc_first(ds, pos) - k0;
        nv = nv < nk ? nv : nk;
        nv = nv > 0 ? nv : 0;
        lo = lo < 0 ? 0 : lo < nv ? lo : nv;
        for (int c = 0; c < lo; c++) pr[c] = 0.0f;
        for (int c = lo; c < nv; c++) pr[c] = exp_fast(pr[c] - l);
        for (int c = nv; c < nk; c++) pr[c] = 0.0f;
    }
}

/* ds = p (dp - D) in place of dp (nq, TB). */
ROW_CLONES static void bwd_dscores(float *dp, const float *p, const float *D, int r0, int nq, int nk) {
    for (int r = 0; r < nq; r++) {
        const float *pr = p + (size_t)r * TB;
        float *dr = dp + (size_t)r * TB, d = D[r0 + r];
        for (int c = 0; c < nk; c++) dr[c] = pr[c] * (dr[c] - d);
    }
}

/* Query rows [r0, r0 + nq) against key tile [k0, k0 + nk): p = exp(scale q k^T - lse) (0
 * past the diagonal); dv += p^T dO; dp = dO v^T; ds = p (dp - D); dk += scale ds^T q;
 * dq += scale ds k. */
static void bwd_tile(bwd_scratch *w, const bwd_head *a, int r0, int nq, int k0, int nk) {
    int W = a->W, hs = a->hs;
    const float *q = a->q + (size_t)r0 * W, *k = a->k + (size_t)k0 * W, *v = a->v + (size_t)k0 * W;
    const float *dO = a->dO + (size_t)r0 * a->ldo;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, a->scale, q, W, k, W, 0.0f, w->p,
                TB); // s (nq, nk)
    bwd_probs(w->p, a->lse, a->ds, r0, nq, a->qpos, k0, nk);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, 1.0f, dO, a->ldo, v, W, 0.0f, w->dp,
                TB); // dp (nq, nk)
    bwd_dscores(w->dp, w->p, w->D, r0, nq, nk);
    if (a->bf16) round_rows(w->p, nq, nk, TB), round_rows(w->dp, nq, nk, TB);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nq, 1.0f, w->p, TB, dO, a->ldo, 1.0f,
                a->dv + (size_t)k0 * W, W); // dv (nk, hs) += p^T dO
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nq, a->scale, w->dp, TB, q, W, 1.0f,
                a->dk + (size_t)k0 * W, W); // dk (nk, hs) += scale ds^T q
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hs, nk, a->scale, w->dp, TB, k, W, 1.0f,
                a->dq + (size_t)r0 * W, W); // dq (nq, hs) += scale ds k
}

/* One query head's share of its kv head's backward: D, then key tiles ascending, each
 * against every query row at or below it that can see it (document starts do not decrease
 * along a sequence: the rows from the first whose document starts past the tile see none of
 * it, skipped) in one product of each kind. */
static void bwd_one_head(bwd_scratch *w, const bwd_head *a) {
    for (int t = 0; t < a->T; t++) {
        const float *o = a->O + (size_t)t * a->hs, *d = a->dO + (size_t)t * a->ldo;
        float s = 0.0f;
        for (int c = 0; c < a->hs; c++) s += d[c] * o[c];
        w->D[t] = s;
    }
    int kend = a->nk > 0 && a->nk < a->qpos + a->T ? a->nk : a->qpos + a->T; /* keys [0, kend) */
    int end = 0; /* the first row whose document starts past the current tile */
    for (int k0 = 0; k0 < kend; k0 += TB) {
        int nk = kend - k0 < TB ? kend - k0 : TB, r0 = k0 > a->qpos ? k0 - a->qpos : 0; /* rows at or below */
        if (end < r0) end = r0;
        while (end < a->T && doc_first(a->ds, a->qpos + end) < k0 + nk) end++;
        bwd_tile(w, a, r0, end - r0, k0, nk);
    }
}

/* Zero rows of n columns at p, T rows of leading dimension W. */
static void zero_cols(float *p, int T, int W, int n) {
    for (int t = 0; t < T; t++) memset(p + (size_t)t * W, 0, sizeof(float) * n);
}

/* One (sequence, kv head g): its G query heads in ascending order into dq of each and the
 * shared dk, dv (zeroed first when the span asks). */
static void bwd_group(bwd_scratch *w, const cpu_att_span *s, int b, int g) {
    int NH = s->NH, NKV = s->NKV, HS = s->HS, T = s->nq;
    int W = (NH + 2 * NKV) * HS, CO = NH * HS, G = NH / NKV;
    const float *row = s->q + (size_t)b * s->q_seq, *kv = s->kv + (size_t)b * s->kv_seq; // (., W)
    float *drow = s->dq + (size_t)b * s->q_seq, *dkv = s->dkv + (size_t)b * s->kv_seq;    // (., W)
    bwd_head a = {.k = kv + (size_t)(NH + g) * HS, .v = kv + (size_t)(NH + NKV + g) * HS,
                  .dk = dkv + (size_t)(NH + g) * HS, .dv = dkv + (size_t)(NH + NKV + g) * HS,
                  .ds = s->doc ? s->doc + (size_t)b * s->doc_seq : NULL, .bf16 = s->bf16,
                  .T = T, .qpos = s->qpos, .nk = s->nk, .W = W, .ldo = CO, .hs = HS, .scale = 1.0f / sqrtf((float)HS)};
    if (s->zero_dkv) {
        zero_cols(a.dk, s->nk > 0 ? s->nk : s->qpos + T, W, HS);
        zero_cols(a.dv, s->nk > 0 ? s->nk : s->qpos + T, W, HS);
    }
    for (int h = g * G; h < (g + 1) * G; h++) {
        size_t bh = (size_t)b * NH + h;
        a.q = row + (size_t)h * HS;
        a.dq = drow + (size_t)h * HS;
        a.dO = s->dout + (size_t)b * s->out_seq + (size_t)h * HS;
        a.O = s->O + bh * s->st_bh;
        a.lse = s->lse + bh * s->st_bh;
        if (!s->acc_dq) zero_cols(a.dq, T, W, HS);
        bwd_one_head(w, &a);
    }
}

/* Parallel over the (sequence, kv head) pairs, each on one thread (cpu_attention.h). */
int cpu_attention_span_bwd(const cpu_att_span *s) {
    int T = s->nq;
    PL_TRY(check_shape("attention_gqa_bwd (tiled)", s->B, T, s->NH, s->NKV, s->HS));
    int failed = 0, nb = blas_one();
    #pragma omp parallel
    {
        bwd_scratch w = {0};
        float *buf = malloc(sizeof(float) * (2 * (size_t)TB * T + (size_t)T));
        if (buf) w.p = buf, w.dp = buf + (size_t)TB * T, w.D = w.dp + (size_t)TB * T;
        else {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int bg = 0; bg < s->B * s->NKV; bg++)
            if (buf) bwd_group(&w, s, bg / s->NKV, bg % s->NKV);
        free(buf);
    }
    blas_back(nb);
    if (failed) return host_fail(PL_ENOMEM, "attention_gqa_bwd (tiled): out of memory for scratch of T = %d", T);
    return 0;
}

int cpu_attention_tiled_bwd(float *dqkv, const float *dout, const float *qkv, const float *state, int B, int T,
                            int NH, int NKV, int HS, const int *doc, int bf16) {
    PL_TRY(check_shape("attention_gqa_bwd (tiled)", B, T, NH, NKV, HS));
    float *q16 = NULL, *d16 = NULL; // qkv (B, T, W) and dout (B, T, NH HS) rounded to bf16
    if (bf16) {
        q16 = rounded_copy(qkv, (size_t)B * T * (NH + 2 * NKV) * HS);
        d16 = q16 ? rounded_copy(dout, (size_t)B * T * NH * HS) : NULL;
        if (!d16) {
            free(q16);
            return host_fail(PL_ENOMEM, "attention_gqa_bwd (tiled): out of memory for the bf16 copies");
        }
    }
    cpu_att_span s = whole_span(q16 ? q16 : qkv, B, T, NH, NKV, HS, (float *)state, doc, bf16);
    s.dout = d16 ? d16 : dout;
    s.dq = s.dkv = dqkv;
    int rc = cpu_attention_span_bwd(&s);
    free(q16);
    free(d16);
    return rc;
}
