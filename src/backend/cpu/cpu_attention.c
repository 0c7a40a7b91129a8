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

#define TB CPU_ATT_TILE

/* Per-thread scratch of the forward: scores / probabilities s (TB, TB), the running output
 * o (TB, HS), the running maximum m (TB) and sum l (TB). */
typedef struct {
    float *s, *o, *m, *l;
} fwd_scratch;

/* One key tile [k0, k0 + nk) for the query rows [r0, r0 + nq): s = scale q k^T; per row the
 * new maximum over the causal columns, o and l rescaled by exp(m_old - m_new), p = exp(s -
 * m_new) (0 past the diagonal), l += sum p; then o += p v. first: the row's first tile. */
static void fwd_tile(fwd_scratch *w, const float *q, const float *k, const float *v, int r0, int nq, int k0, int nk,
                     int W, int hs, float scale, int first) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, scale, q, W, k + (size_t)k0 * W, W, 0.0f, w->s,
                TB); // s (nq, nk)
    for (int r = 0; r < nq; r++) {
        float *sr = w->s + (size_t)r * TB, *orow = w->o + (size_t)r * hs;
        int nv = r0 + r - k0 + 1; /* causal columns of this row in the tile */
        nv = nv < nk ? nv : nk;
        float mx = first ? sr[0] : w->m[r];
        for (int c = 0; c < nv; c++) mx = sr[c] > mx ? sr[c] : mx;
        float alpha = first ? 0.0f : exp_fast(w->m[r] - mx), sum = 0.0f;
        for (int c = 0; c < nv; c++) { sr[c] = exp_fast(sr[c] - mx); sum += sr[c]; }
        for (int c = nv; c < nk; c++) sr[c] = 0.0f;
        w->l[r] = (first ? 0.0f : w->l[r] * alpha) + sum;
        w->m[r] = mx;
        if (first) memset(orow, 0, sizeof(float) * hs);
        else for (int c = 0; c < hs; c++) orow[c] *= alpha;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hs, nk, 1.0f, w->s, TB, v + (size_t)k0 * W, W, 1.0f,
                w->o, hs); // o (nq, hs) += p (nq, nk) v (nk, hs)
}

/* One query tile [r0, r0 + nq) of one (sequence, query head): q, k, v are the head's columns
 * of the sequence's qkv rows (leading dimension W); out (ldo), O (T, hs) and lse (T) get the
 * tile's rows. */
static void fwd_query_tile(fwd_scratch *w, float *out, float *O, float *lse, const float *q, const float *k,
                           const float *v, int r0, int nq, int W, int ldo, int hs) {
    float scale = 1.0f / sqrtf((float)hs);
    for (int k0 = 0; k0 < r0 + nq; k0 += TB) {
        int nk = r0 + nq - k0 < TB ? r0 + nq - k0 : TB;
        fwd_tile(w, q + (size_t)r0 * W, k, v, r0, nq, k0, nk, W, hs, scale, k0 == 0);
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
int cpu_attention_tiled_fwd(float *out, float *state, const float *qkv, int B, int T, int NH, int NKV, int HS) {
    PL_TRY(check_shape("attention_gqa_fwd (tiled)", B, T, NH, NKV, HS));
    int W = (NH + 2 * NKV) * HS, CO = NH * HS, G = NH / NKV, nqt = (T + TB - 1) / TB, failed = 0;
    #pragma omp parallel
    {
        fwd_scratch w;
        float *buf = malloc(sizeof(float) * ((size_t)TB * TB + (size_t)TB * HS + 2 * TB));
        w.s = buf, w.o = buf + (size_t)TB * TB, w.m = w.o + (size_t)TB * HS, w.l = w.m + TB;
        if (!buf) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (long it = 0; it < (long)B * NH * nqt; it++) {
            if (!buf) continue;
            int bh = (int)(it / nqt), qt = nqt - 1 - (int)(it % nqt); /* the long tiles first */
            int b = bh / NH, h = bh % NH, g = h / G, r0 = qt * TB, nq = T - r0 < TB ? T - r0 : TB;
            const float *row = qkv + (size_t)b * T * W; // (T, W)
            float *O = state + (size_t)bh * T * (HS + 1); // (T, HS), then lse (T)
            fwd_query_tile(&w, out + (size_t)b * T * CO + (size_t)h * HS, O, O + (size_t)T * HS, row + (size_t)h * HS,
                           row + (size_t)(NH + g) * HS, row + (size_t)(NH + NKV + g) * HS, r0, nq, W, CO, HS);
        }
        free(buf);
    }
    if (failed) return host_fail(PL_ENOMEM, "attention_gqa_fwd (tiled): out of memory for a %d x %d tile", TB, HS);
    return 0;
}

/* Per-thread scratch of the backward: probabilities p (TB, TB), their gradient dp (TB, TB),
 * and D (T) = rowsum(dO * O) of the current query head. */
typedef struct {
    float *p, *dp, *D;
} bwd_scratch;

/* The views of one (sequence, query head) pair for the backward: rows of leading dimension
 * W (q, k, v and their gradients) or ldo (dO), O (T, hs) and lse (T) from the state. */
typedef struct {
    const float *q, *k, *v, *dO, *O, *lse;
    float *dq, *dk, *dv;
    int T, W, ldo, hs;
    float scale;
} bwd_head;

/* Query tile [r0, r0 + nq) against key tile [k0, k0 + nk): p = exp(scale q k^T - lse) (0
 * past the diagonal); dv += p^T dO; dp = dO v^T; ds = p (dp - D); dk += scale ds^T q;
 * dq += scale ds k. */
static void bwd_tile(bwd_scratch *w, const bwd_head *a, int r0, int nq, int k0, int nk) {
    int W = a->W, hs = a->hs;
    const float *q = a->q + (size_t)r0 * W, *k = a->k + (size_t)k0 * W, *v = a->v + (size_t)k0 * W;
    const float *dO = a->dO + (size_t)r0 * a->ldo;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, a->scale, q, W, k, W, 0.0f, w->p,
                TB); // s (nq, nk)
    for (int r = 0; r < nq; r++) {
        float *pr = w->p + (size_t)r * TB, l = a->lse[r0 + r];
        int nv = r0 + r - k0 + 1;
        nv = nv < nk ? nv : nk;
        for (int c = 0; c < nv; c++) pr[c] = exp_fast(pr[c] - l);
        for (int c = nv < 0 ? 0 : nv; c < nk; c++) pr[c] = 0.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nq, 1.0f, w->p, TB, dO, a->ldo, 1.0f,
                a->dv + (size_t)k0 * W, W); // dv (nk, hs) += p^T dO
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, 1.0f, dO, a->ldo, v, W, 0.0f, w->dp,
                TB); // dp (nq, nk)
    for (int r = 0; r < nq; r++) {
        const float *pr = w->p + (size_t)r * TB;
        float *dr = w->dp + (size_t)r * TB, d = w->D[r0 + r];
        for (int c = 0; c < nk; c++) dr[c] = pr[c] * (dr[c] - d);
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nq, a->scale, w->dp, TB, q, W, 1.0f,
                a->dk + (size_t)k0 * W, W); // dk (nk, hs) += scale ds^T q
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hs, nk, a->scale, w->dp, TB, k, W, 1.0f,
                a->dq + (size_t)r0 * W, W); // dq (nq, hs) += scale ds k
}

/* One query head's share of its kv head's backward: D, then key tiles ascending, each with
 * its causal query tiles ascending. */
static void bwd_one_head(bwd_scratch *w, const bwd_head *a) {
    for (int t = 0; t < a->T; t++) {
        const float *o = a->O + (size_t)t * a->hs, *d = a->dO + (size_t)t * a->ldo;
        float s = 0.0f;
        for (int c = 0; c < a->hs; c++) s += d[c] * o[c];
        w->D[t] = s;
    }
    for (int k0 = 0; k0 < a->T; k0 += TB) {
        int nk = a->T - k0 < TB ? a->T - k0 : TB;
        for (int r0 = k0; r0 < a->T; r0 += TB) bwd_tile(w, a, r0, a->T - r0 < TB ? a->T - r0 : TB, k0, nk);
    }
}

/* Zero rows of n columns at p, T rows of leading dimension W. */
static void zero_cols(float *p, int T, int W, int n) {
    for (int t = 0; t < T; t++) memset(p + (size_t)t * W, 0, sizeof(float) * n);
}

/* One (sequence, kv head g): its G query heads in ascending order into dq of each and the
 * shared dk, dv. */
static void bwd_group(bwd_scratch *w, float *dqkv, const float *dout, const float *qkv, const float *state, int b,
                      int g, int T, int NH, int NKV, int HS) {
    int W = (NH + 2 * NKV) * HS, CO = NH * HS, G = NH / NKV;
    const float *row = qkv + (size_t)b * T * W; // (T, W)
    float *drow = dqkv + (size_t)b * T * W;    // (T, W)
    bwd_head a = {.k = row + (size_t)(NH + g) * HS, .v = row + (size_t)(NH + NKV + g) * HS,
                  .dk = drow + (size_t)(NH + g) * HS, .dv = drow + (size_t)(NH + NKV + g) * HS,
                  .T = T, .W = W, .ldo = CO, .hs = HS, .scale = 1.0f / sqrtf((float)HS)};
    zero_cols(a.dk, T, W, HS);
    zero_cols(a.dv, T, W, HS);
    for (int h = g * G; h < (g + 1) * G; h++) {
        const float *O = state + ((size_t)b * NH + h) * T * (HS + 1); // (T, HS), then lse (T)
        a.q = row + (size_t)h * HS;
        a.dq = drow + (size_t)h * HS;
        a.dO = dout + (size_t)b * T * CO + (size_t)h * HS;
        a.O = O;
        a.lse = O + (size_t)T * HS;
        zero_cols(a.dq, T, W, HS);
        bwd_one_head(w, &a);
    }
}

/* Parallel over the (sequence, kv head) pairs, each on one thread (cpu_attention.h). */
int cpu_attention_tiled_bwd(float *dqkv, const float *dout, const float *qkv, const float *state, int B, int T,
                            int NH, int NKV, int HS) {
    PL_TRY(check_shape("attention_gqa_bwd (tiled)", B, T, NH, NKV, HS));
    int failed = 0;
    #pragma omp parallel
    {
        bwd_scratch w;
        float *buf = malloc(sizeof(float) * (2 * (size_t)TB * TB + (size_t)T));
        w.p = buf, w.dp = buf + (size_t)TB * TB, w.D = w.dp + (size_t)TB * TB;
        if (!buf) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int bg = 0; bg < B * NKV; bg++)
            if (buf) bwd_group(&w, dqkv, dout, qkv, state, bg / NKV, bg % NKV, T, NH, NKV, HS);
        free(buf);
    }
    if (failed) return host_fail(PL_ENOMEM, "attention_gqa_bwd (tiled): out of memory for scratch of T = %d", T);
    return 0;
}
