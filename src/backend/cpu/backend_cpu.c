/*
 * backend_cpu.c — the CPU backend: OpenBLAS cblas_sgemm for every matrix product of training,
 * C loops parallelised with OpenMP for everything else; the decode kernels (matmul_decode_fwd,
 * attention_kv_fwd) are in cpu_decode.c.
 *
 * Determinism: every loop that sums over rows (bias, LayerNorm and embedding gradients, the
 * squared norm) runs the rows in a fixed order inside one thread, and threads split the
 * *output* (channels or fixed-size chunks), so those results do not depend on the thread
 * count (sgemm's do, in OpenBLAS, for long inner dimensions).
 * Shapes as in backend.h: N rows, C channels, OC output channels.
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
#include <stdint.h>
#include <stdio.h>
#include "pipelm/backend.h"

/* whether the message that points to the oneDNN backend adds that it is not built here */
#ifdef HAVE_ONEDNN
#define BUILT_ONEDNN ""
#else
#define BUILT_ONEDNN ", not built here"
#endif
#include "backend/backend_host.h"
#include "pipelm/backend_math.h"
#include "backend/cpu/blas.h"
#include "util/common.h"
#include "backend/cpu/cpu_decode.h"
#include "backend/cpu/cpu_attention.h"
#include "backend/cpu/cpu_moe.h"

/* Threads of this backend (OpenMP loops and OpenBLAS), set through its set_threads. */
static int cpu_threads = 1;

#define LN_EPS 1e-5f
#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

static int cpu_set_threads(int n);

/* The settings of this backend (--backend-opt). */
static const backend_opt_decl cpu_opts[] = {
    {"attention", "tiled: fused causal attention keeping the output and the row log-sum-exp (O(T) memory, "
     "FlashAttention-2's backward) wherever T exceeds the head size; full: the (T, T) probabilities (the "
     "reference); auto: tiled from T = 128 (where it measured faster), full below",
     "auto", "auto|tiled|full", "PIPELM_CPU_ATTENTION"},
    {NULL, NULL, NULL, NULL, NULL},
};

/* attention=: which path attention_gqa_fwd / _bwd take (att_tiled_for). */
enum { ATT_FULL, ATT_TILED, ATT_AUTO };
static int att_mode = ATT_AUTO;
/* attention=auto's smallest T for the tiled path: below it the (T, T) path measured as fast
 * or faster (bench/attention_cpu.sh: head sizes 16, 64, 128). */
#define ATT_AUTO_MIN_T 128

/* fp32 only: the reference precision. */
static int cpu_init(const backend_options *opt, char *err, size_t errlen) {
    if (opt && opt->precision != PL_PREC_FP32) {
        snprintf(err, errlen, "backend cpu computes in fp32 only (--precision %s needs --backend onednn%s)",
                 backend_precision_name(opt->precision), BUILT_ONEDNN);
        return PL_EINVAL;
    }
    char v[16];
    backend_opt_get(cpu_opts, opt, "attention", v, sizeof v);
    att_mode = strcmp(v, "full") == 0 ? ATT_FULL : strcmp(v, "tiled") == 0 ? ATT_TILED : ATT_AUTO;
    if (opt && opt->threads > 0) cpu_set_threads(opt->threads);
    return 0;
}
static void cpu_finalize(void) {}

static void cpu_describe(char *buf, size_t len) {
    static const char *const name[] = {"full", "tiled", "auto"};
    snprintf(buf, len, "cpu: OpenBLAS %s, kernel %s, fp32, attention %s", blas_flavour(), blas_kernel(),
             name[att_mode]);
}

/* Whether attention of T tokens, head size HS runs tiled: only where its state (HS + 1
 * floats per token and head) is smaller than the T probabilities of the full path, and under
 * auto only from ATT_AUTO_MIN_T. */
static int att_tiled_for(int T, int HS) {
    return att_mode != ATT_FULL && T > HS && (att_mode == ATT_TILED || T >= ATT_AUTO_MIN_T);
}

/* backend.h's attention_cols: the tiled path keeps O and the log-sum-exp. */
static int cpu_attention_cols(int B, int T, int NH, int HS) {
    (void)B;
    (void)NH;
    return att_tiled_for(T, HS) ? HS + 1 : T;
}

/* 64-byte aligned, zero-filled (backend_host.c). */
static int cpu_alloc(void **p, size_t bytes) {
    char why[200];
    int rc = host_alloc(p, bytes, why, sizeof why);
    return rc ? host_fail(rc, "%s", why) : 0;
}
static void cpu_free(void *p) { free(p); }
static int cpu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) memmove(dst, src, bytes);
    return 0;
}
static int cpu_zero(void *p, size_t bytes) {
    if (bytes) memset(p, 0, bytes);
    return 0;
}
/* Host memory: the view is the buffer itself. */
static int cpu_map(void **host, void *p, size_t bytes, int mode) {
    (void)bytes;
    (void)mode;
    *host = p;
    return 0;
}
static int cpu_unmap(void *host, void *p, size_t bytes, int mode) {
    (void)host;
    (void)p;
    (void)bytes;
    (void)mode;
    return 0;
}
/* Every op has finished when it returns: nothing to wait for. */
static int cpu_synchronize(void) { return 0; }

/* out[i] = wte[tok[i]] + wpe[i % T]. */
static int cpu_encoder_fwd(float *out, const int *tok, const float *wte, const float *wpe,
                            int N, int T, int C) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *we = wte + (size_t)tok[i] * C, *pe = wpe + (size_t)(i % T) * C;
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
    }
    return 0;
}

/* Serial over rows: two rows may hit the same token, and the order must be fixed. */
static int cpu_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int *tok,
                            int N, int T, int C) {
    for (int i = 0; i < N; i++) {
        const float *d = dout + (size_t)i * C;
        float *dw = dwte + (size_t)tok[i] * C, *dp = dwpe + (size_t)(i % T) * C;
        for (int c = 0; c < C; c++) { dw[c] += d[c]; dp[c] += d[c]; }
    }
    return 0;
}

/* y = (x - mean)/sqrt(var + eps) * w + b, biased variance, per row. */
static int cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        float v = 0.0f;
        for (int c = 0; c < C; c++) { float d = x[c] - m; v += d * d; }
        v /= C;
        float s = 1.0f / sqrtf(v + LN_EPS);
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
        mean[i] = m;
        rstd[i] = s;
    }
    return 0;
}

/* dx += rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat)), dnorm = w dy; rows in parallel. */
static int cpu_layernorm_bwd_input(float *dinp, const float *dout, const float *inp, const float *w,
                                   const float *mean, const float *rstd, int N, int C) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *dy = dout + (size_t)i * C, *x = inp + (size_t)i * C;
        float m = mean[i], s = rstd[i];
        float a = 0.0f, bsum = 0.0f;
        for (int c = 0; c < C; c++) {
            float xh = (x[c] - m) * s, dn = w[c] * dy[c];
            a += dn;
            bsum += dn * xh;
        }
        a /= C;
        bsum /= C;
        float *dx = dinp + (size_t)i * C;
        for (int c = 0; c < C; c++) {
            float xh = (x[c] - m) * s, dn = w[c] * dy[c];
            dx[c] += (dn - a - xh * bsum) * s;
        }
    }
    return 0;
}

/* dw += sum_i dy xhat; db += sum_i dy: channels in parallel, rows in order. */
static int cpu_layernorm_bwd_weight(float *dw, float *db, const float *dout, const float *inp,
                                    const float *mean, const float *rstd, int N, int C) {
    int nchunk = (C + 63) / 64;
    #pragma omp parallel for schedule(static)
    for (int k = 0; k < nchunk; k++) {
        int c0 = k * 64, c1 = c0 + 64 < C ? c0 + 64 : C;
        for (int i = 0; i < N; i++) {
            const float *dy = dout + (size_t)i * C, *x = inp + (size_t)i * C;
            float m = mean[i], s = rstd[i];
            for (int c = c0; c < c1; c++) {
                db[c] += dy[c];
                dw[c] += dy[c] * ((x[c] - m) * s);
            }
        }
    }
    return 0;
}

/* out = inp W^T + b: one sgemm, then the bias row added in parallel. */
static int cpu_matmul_fwd(float *out, const float *inp, const float *w, const float *b,
                           int N, int C, int OC) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, 0.0f, out, OC);
    if (!b) return 0;
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *o = out + (size_t)i * OC;
        for (int j = 0; j < OC; j++) o[j] += b[j];
    }
    return 0;
}

/* dinp(N,C) = dout(N,OC) W(OC,C). */
static int cpu_matmul_bwd_input(float *dinp, const float *dout, const float *w, int N, int C, int OC) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C, 0.0f, dinp, C);
    return 0;
}

/* dW(OC,C) += dout^T inp; db += column sums of dout (rows in order per chunk). */
static int cpu_matmul_bwd_weight(float *dw, float *db, const float *dout, const float *inp, int N, int C, int OC) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
    if (db) host_colsum(db, dout, N, OC);
    return 0;
}

/* While threads split the (b, h) pairs of attention, each product runs on one thread: the
 * OpenMP flavour of OpenBLAS does so by itself inside a parallel region; the pthread flavour
 * is told (its own pool would serve the concurrent calls one at a time). */
static int blas_threads_outside(void) {
    if (openblas_get_parallel() != 1 || cpu_threads <= 1) return 0;
    openblas_set_num_threads(1);
    return 1;
}
static void blas_threads_restore(int changed) {
    if (changed) openblas_set_num_threads(cpu_threads);
}

/* gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
static int cpu_gelu_fwd(float *out, const float *inp, size_t n) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanh_fast(u));
    }
    return 0;
}

/* d gelu/dx = 0.5 (1 + tanh u) + 0.5 x sech^2(u) sqrt(2/pi) (1 + 3 0.044715 x^2). */
static int cpu_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = tanh_fast(u);
        float sech2 = 1.0f - th * th;
        float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = g * dout[i];
    }
    return 0;
}

static int cpu_residual_fwd(float *out, const float *a, const float *b, size_t n) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    return 0;
}

static int cpu_add_inplace(float *dst, const float *src, size_t n) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
    return 0;
}

/* Softmax over the V real columns of each row (padded columns excluded), loss = -log p[y]. */
static int cpu_crossentropy_fwd(float *losses, float *logits, const int *targets, int N, int V, int Vp) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *r = logits + (size_t)i * Vp;
        float mx = r[0];
        for (int j = 1; j < V; j++) mx = r[j] > mx ? r[j] : mx;
        float sum = 0.0f;
        for (int j = 0; j < V; j++) { r[j] = exp_fast(r[j] - mx); sum += r[j]; }
        float inv = 1.0f / sum;
        for (int j = 0; j < V; j++) r[j] *= inv;
        for (int j = V; j < Vp; j++) r[j] = 0.0f;
        losses[i] = -logf(r[targets[i]]);
    }
    return 0;
}

/* dlogits = (p - onehot(y)) dloss, in place; padded columns stay 0. */
static int cpu_crossentropy_bwd(float *probs, const int *targets, float dloss, int N, int V, int Vp) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *r = probs + (size_t)i * Vp;
        for (int j = 0; j < V; j++) r[j] *= dloss;
        r[targets[i]] -= dloss;
    }
    return 0;
}

/* AdamW with bias correction and decoupled weight decay (as llm.c). */
static int cpu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                      float b2, float eps, float wd, int t) {
    float c1 = 1.0f - powf(b1, (float)t), c2 = 1.0f - powf(b2, (float)t);
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float mh = mi / c1, vh = vi / c2;
        p[i] -= lr * (mh / (sqrtf(vh) + eps) + wd * p[i]);
    }
    return 0;
}

/* Chunks of 16384 values summed in double, then the chunk sums added in order. */
#define SUMSQ_CHUNK 16384
static int cpu_sumsq(const float *x, size_t n, double *out) {
    size_t nchunk = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    double stackbuf[64];
    double *part = nchunk <= 64 ? stackbuf : malloc(sizeof(double) * nchunk);
    if (!part) return host_fail(PL_ENOMEM, "sum of squares: out of memory for %zu partial sums", nchunk);
    #pragma omp parallel for schedule(static)
    for (size_t k = 0; k < nchunk; k++) {
        size_t i0 = k * SUMSQ_CHUNK, i1 = i0 + SUMSQ_CHUNK < n ? i0 + SUMSQ_CHUNK : n;
        double s = 0.0;
        for (size_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
        part[k] = s;
    }
    double total = 0.0;
    for (size_t k = 0; k < nchunk; k++) total += part[k];
    if (part != stackbuf) free(part);
    *out = total;
    return 0;
}

static int cpu_scale(float *x, float s, size_t n) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= s;
    return 0;
}


/* ---------------------------------------------------------------------------------------- */
/* Llama ops: RMSNorm, RoPE, grouped-query attention, SwiGLU                                  */

/* RMSNorm (Zhang & Sennrich 2019): y = x / sqrt(mean(x^2) + eps) * w, per row; rstd saved. */
static int cpu_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float ss = 0.0f;
        for (int c = 0; c < C; c++) ss += x[c] * x[c];
        float s = 1.0f / sqrtf(ss / C + eps);
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = x[c] * s * w[c];
        rstd[i] = s;
    }
    return 0;
}

/* dx += rstd (dn - x rstd^2 mean(dn x)), dn = w dy (d rstd/dx_j = -rstd^3 x_j / C); rows in
 * parallel, each row's sums in order. */
static int cpu_rmsnorm_bwd_input(float *dinp, const float *dout, const float *inp, const float *w,
                                 const float *rstd, int N, int C) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *dy = dout + (size_t)i * C, *x = inp + (size_t)i * C;
        float s = rstd[i];
        float a = 0.0f;
        for (int c = 0; c < C; c++) a += w[c] * dy[c] * x[c];
        a = a / C * s * s;
        float *dx = dinp + (size_t)i * C;
        for (int c = 0; c < C; c++) dx[c] += (w[c] * dy[c] - x[c] * a) * s;
    }
    return 0;
}

/* dw += sum_i dy x rstd: threads split the channels in chunks of 64, rows in order (as
 * layernorm's dw), so the sum does not depend on the thread count. */
static int cpu_rmsnorm_bwd_weight(float *dw, const float *dout, const float *inp, const float *rstd, int N, int C) {
    int nchunk = (C + 63) / 64;
    #pragma omp parallel for schedule(static)
    for (int k = 0; k < nchunk; k++) {
        int c0 = k * 64, c1 = c0 + 64 < C ? c0 + 64 : C;
        for (int i = 0; i < N; i++) {
            const float *dy = dout + (size_t)i * C, *x = inp + (size_t)i * C;
            float s = rstd[i];
            for (int c = c0; c < c1; c++) dw[c] += dy[c] * (x[c] * s);
        }
    }
    return 0;
}

/* RoPE (Su et al. 2021, RoFormer) on the q and k heads of each fused row, interleaved pairs:
 * (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos) at angle theta_{t,i}; dir = -1 applies the
 * inverse rotation (sin -> -sin), which is the transpose: the backward. v is copied. */
static void rope_rotate(float *out, const float *inp, const float *fcos, const float *fsin,
                        int N, int T, int NH, int NKV, int HS, float dir) {
    int nrot = (NH + NKV) * HS, W = (NH + 2 * NKV) * HS, half = HS / 2;
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < N; r++) {
        const float *x = inp + (size_t)r * W, *cs = fcos + (size_t)(r % T) * half;
        const float *sn = fsin + (size_t)(r % T) * half;
        float *o = out + (size_t)r * W;
        for (int j = 0; j < nrot; j += 2) {
            int i = (j % HS) / 2;
            float c = cs[i], s = dir * sn[i], x0 = x[j], x1 = x[j + 1];
            o[j] = x0 * c - x1 * s;
            o[j + 1] = x0 * s + x1 * c;
        }
        for (int j = nrot; j < W; j++) o[j] = x[j];
    }
}
static int cpu_rope_fwd(float *out, const float *inp, const float *fcos, const float *fsin,
                        int N, int T, int NH, int NKV, int HS) {
    if (HS % 2) return host_fail(PL_EBACKEND, "rope_fwd: head size %d is odd", HS);
    rope_rotate(out, inp, fcos, fsin, N, T, NH, NKV, HS, 1.0f);
    return 0;
}
static int cpu_rope_bwd(float *dinp, const float *dout, const float *fcos, const float *fsin,
                        int N, int T, int NH, int NKV, int HS) {
    if (HS % 2) return host_fail(PL_EBACKEND, "rope_bwd: head size %d is odd", HS);
    rope_rotate(dinp, dout, fcos, fsin, N, T, NH, NKV, HS, -1.0f);
    return 0;
}

/* One (b, h) pair of grouped-query attention (Ainslie et al. 2023): q, k, v are views with
 * leading dimension W = (NH + 2 NKV) HS, o has leading dimension NH HS. The same three steps
 * softmax-causal steps for every head; GPT-2's multi-head attention is the case NKV == NH. */
static void gqa_fwd_head(float *o, float *a, const float *q, const float *k, const float *v,
                         int T, int W, int ldo, int hs, const int *ds) {
    float scale = 1.0f / sqrtf((float)hs);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, W, k, W, 0.0f, a, T);
    for (int t = 0; t < T; t++) {
        float *r = a + (size_t)t * T;
        softmax_doc_row(r, doc_first(ds, t), t, T); /* ds: the sequence's document starts, or NULL */
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, W, 0.0f, o, ldo);
}

/* a = softmax_causal(q_h k_g^T / sqrt(HS)), o_h = a v_g with g = h / (NH / NKV); parallel over
 * the B*NH (b, h) pairs, each pair's products on one thread. */
static int cpu_attention_gqa_fwd(float *out, float *att, const float *qkv, int B, int T, int NH, int NKV, int HS,
                                 const int *doc) {
    if (att_tiled_for(T, HS)) {
        int changed = blas_threads_outside();
        int rc = cpu_attention_tiled_fwd(out, att, qkv, B, T, NH, NKV, HS, doc, 0);
        blas_threads_restore(changed);
        return rc;
    }
    if (NKV < 1 || NH % NKV)
        return host_fail(PL_EBACKEND, "attention_gqa_fwd: %d query heads do not divide into %d kv heads", NH, NKV);
    int W = (NH + 2 * NKV) * HS, CO = NH * HS, G = NH / NKV;
    int changed = blas_threads_outside();
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH, g = h / G;
        const float *row = qkv + (size_t)b * T * W;
        gqa_fwd_head(out + (size_t)b * T * CO + h * HS, att + (size_t)bh * T * T, row + h * HS,
                     row + (NH + g) * HS, row + (NH + NKV + g) * HS, T, W, CO, HS, doc ? doc + (size_t)b * T : NULL);
    }
    blas_threads_restore(changed);
    return 0;
}

/* One query head's backward into its kv head's gradients: datt = dy v^T; dv (+)= a^T dy;
 * dpre = a (datt - rowsum(a datt)); dq = s dpre k; dk (+)= s dpre^T q. beta 0 for the first
 * query head of the group (overwrite), 1 for the rest (accumulate in h order). */
static void gqa_bwd_head(float *dq, float *dk, float *dv, float *datt, const float *dy, const float *q,
                         const float *k, const float *v, const float *a, int T, int W, int ldo, int hs,
                         float beta, const int *ds) {
    float scale = 1.0f / sqrtf((float)hs);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dy, ldo, v, W, 0.0f, datt, T);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, dy, ldo, beta, dv, W);
    for (int t = 0; t < T; t++) {
        const float *ar = a + (size_t)t * T;
        float *dr = datt + (size_t)t * T;
        float dot = 0.0f;
        int s0 = doc_first(ds, t); /* columns before the token's document: probability 0 */
        for (int j = s0; j <= t; j++) dot += ar[j] * dr[j];
        for (int j = 0; j < s0; j++) dr[j] = 0.0f;
        for (int j = s0; j <= t; j++) dr[j] = ar[j] * (dr[j] - dot);
        for (int j = t + 1; j < T; j++) dr[j] = 0.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, datt, T, k, W, 0.0f, dq, W);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, datt, T, q, W, beta, dk, W);
}

/* The backward of cpu_attention_gqa_fwd, in parallel over the B*NKV (b, kv head) pairs: each
 * pair runs its G query heads in ascending order on one thread, so dk and dv are summed in a
 * fixed order whatever the thread count; dqkv is overwritten. */
static int cpu_attention_gqa_bwd(float *dqkv, const float *dout, const float *qkv, const float *att,
                                 int B, int T, int NH, int NKV, int HS, const int *doc) {
    if (att_tiled_for(T, HS)) {
        int changed = blas_threads_outside();
        int rc = cpu_attention_tiled_bwd(dqkv, dout, qkv, att, B, T, NH, NKV, HS, doc, 0);
        blas_threads_restore(changed);
        return rc;
    }
    if (NKV < 1 || NH % NKV)
        return host_fail(PL_EBACKEND, "attention_gqa_bwd: %d query heads do not divide into %d kv heads", NH, NKV);
    int W = (NH + 2 * NKV) * HS, CO = NH * HS, G = NH / NKV, nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    float *datt = malloc(sizeof(float) * (size_t)T * T * nt);
    if (!datt) return host_fail(PL_ENOMEM, "attention_gqa backward: out of memory for %d x %d scratch", nt, T);
    int changed = blas_threads_outside();
    #pragma omp parallel for schedule(static)
    for (int bg = 0; bg < B * NKV; bg++) {
        int b = bg / NKV, g = bg % NKV, me = 0;
#ifdef _OPENMP
        me = omp_get_thread_num();
#endif
        const float *row = qkv + (size_t)b * T * W;
        float *drow = dqkv + (size_t)b * T * W;
        for (int h = g * G; h < (g + 1) * G; h++)
            gqa_bwd_head(drow + h * HS, drow + (NH + g) * HS, drow + (NH + NKV + g) * HS, datt + (size_t)me * T * T,
                         dout + (size_t)b * T * CO + h * HS, row + h * HS, row + (NH + g) * HS,
                         row + (NH + NKV + g) * HS, att + ((size_t)b * NH + h) * T * T, T, W, CO, HS,
                         h == g * G ? 0.0f : 1.0f, doc ? doc + (size_t)b * T : NULL);
    }
    blas_threads_restore(changed);
    free(datt);
    return 0;
}

/* SwiGLU (Shazeer 2020): out = up * silu(gate), silu(g) = g sigma(g), sigma(g) = 1/(1+exp(-g)). */
static int cpu_swiglu_fwd(float *out, const float *up, const float *gate, size_t n) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = up[i] * (g / (1.0f + exp_fast(-g)));
    }
    return 0;
}

/* silu'(g) = sigma(g) (1 + g (1 - sigma(g))); every input is read before either output is
 * written, so dup or dgate may alias dout. */
static int cpu_swiglu_bwd(float *dup, float *dgate, const float *dout, const float *up, const float *gate, size_t n) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], u = up[i], d = dout[i];
        float sg = 1.0f / (1.0f + exp_fast(-g));
        dup[i] = d * (g * sg);
        dgate[i] = d * u * (sg * (1.0f + g * (1.0f - sg)));
    }
    return 0;
}


/* Sets the OpenMP and OpenBLAS thread counts together. */
static int cpu_set_threads(int n) {
    if (n < 1) n = 1;
    cpu_threads = n;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    openblas_set_num_threads(n);
    return 0;
}

static int cpu_get_threads(void) { return cpu_threads; }

const backend backend_cpu = {
    .name = "cpu",
    .host_memory = 1,
    .init = cpu_init,
    .finalize = cpu_finalize,
    .error = host_error, /* shared with onednn, which takes ops from here */
    .describe = cpu_describe,
    .set_threads = cpu_set_threads,
    .get_threads = cpu_get_threads,
    .opts = cpu_opts,
    .attention_cols = cpu_attention_cols,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_host = cpu_copy,
    .from_host = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .map = cpu_map,
    .unmap = cpu_unmap,
    .synchronize = cpu_synchronize,
    .encoder_fwd = cpu_encoder_fwd,
    .encoder_bwd = cpu_encoder_bwd,
    .layernorm_fwd = cpu_layernorm_fwd,
    .layernorm_bwd_input = cpu_layernorm_bwd_input,
    .layernorm_bwd_weight = cpu_layernorm_bwd_weight,
    .matmul_fwd = cpu_matmul_fwd,
    .matmul_decode_fwd = cpu_matmul_decode_fwd,
    .matmul_bwd_input = cpu_matmul_bwd_input,
    .matmul_bwd_weight = cpu_matmul_bwd_weight,
    .gelu_fwd = cpu_gelu_fwd,
    .gelu_bwd = cpu_gelu_bwd,
    .residual_fwd = cpu_residual_fwd,
    .add_inplace = cpu_add_inplace,
    .crossentropy_fwd = cpu_crossentropy_fwd,
    .crossentropy_bwd = cpu_crossentropy_bwd,
    .adamw = cpu_adamw,
    .sumsq = cpu_sumsq,
    .scale = cpu_scale,
    .rmsnorm_fwd = cpu_rmsnorm_fwd,
    .rmsnorm_bwd_input = cpu_rmsnorm_bwd_input,
    .rmsnorm_bwd_weight = cpu_rmsnorm_bwd_weight,
    .rope_fwd = cpu_rope_fwd,
    .rope_bwd = cpu_rope_bwd,
    .attention_gqa_fwd = cpu_attention_gqa_fwd,
    .attention_gqa_bwd = cpu_attention_gqa_bwd,
    .swiglu_fwd = cpu_swiglu_fwd,
    .swiglu_bwd = cpu_swiglu_bwd,
    .attention_kv_fwd = cpu_attention_kv_fwd,
    .moe_gather = cpu_moe_gather,
    .moe_combine = cpu_moe_combine,
    .moe_rowdot = cpu_moe_rowdot,
};
