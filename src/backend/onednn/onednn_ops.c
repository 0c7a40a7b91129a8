/*
 * onednn_ops.c — the oneDNN backend's vector loops for the ops around its matrix products
 * (onednn_ops.h): LayerNorm, GELU, cross-entropy, AdamW, the squared norm and the causal
 * softmax, in AVX-512 intrinsics. Compiled for any x86-64 (each vector function carries its
 * own target attribute) and used only when the CPU has AVX-512; otherwise, and on other
 * architectures, every op is backend_cpu's.
 *
 * Why: built for the baseline x86-64 ISA, the CPU backend's loops run 4 lanes at best, and
 * its row sums (LayerNorm's mean and variance, the softmax and loss denominators) one value
 * at a time, since C does not let the compiler reorder a float sum. Here the sums run in 16
 * lanes (masked at the row's end), then _mm512_reduce_add_ps's fixed tree: the order depends
 * on the row length only, so every result is independent of the thread count and of how
 * the rows are split between stages.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "pipelm/backend.h"
#include "pipelm/backend_math.h"
#include "util/common.h"
#include "backend/onednn/onednn_ops.h"

#include "backend/onednn/onednn_simd.h"

#define LN_EPS 1e-5f
#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define SUMSQ_CHUNK 16384              /* as backend_cpu's: partial sums per chunk, added in order */

static int use_vec;

int onednn_ops_select(int on) {
    use_vec = 0;
#ifdef OPS_X86
    use_vec = on && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
              __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
    (void)on;
#endif
    return use_vec;
}
int onednn_ops_active(void) { return use_vec; }

/* The bf16 precision's own kernels (GELU through a sigmoid, RMSNorm, SwiGLU): on in bf16,
 * where the backend's bits are not fixed, off in fp32 so that its bits stay the former ones. */
static int bf16_kernels;
int onednn_ops_bf16(int on) {
    if (on >= 0) bf16_kernels = on != 0;
    return bf16_kernels;
}

/* ---------------------------------------------------------------------------------------- */
/* scalar softmax loops: the backend's own before the vector ones, kept for CPUs without them */

/* The first visible column of row rr of the (B*NH*T, T) rows (document masking; 0 without). */
static inline int row_doc(const int *doc, size_t rr, int T, int NH) {
    return doc ? doc[(rr / T / NH) * T + rr % T] : 0;
}

static void softmax_scalar(float *att, int BH, int T, const int *doc, int NH) {
    size_t rows = (size_t)BH * T;
    #pragma omp parallel for schedule(static)
    for (size_t rr = 0; rr < rows; rr++) {
        int t = (int)(rr % T);
        float *r = att + rr * T;
        softmax_doc_row(r, row_doc(doc, rr, T, NH), t, T);
    }
}

static void softmax_bwd_scalar(float *datt, const float *att, int BH, int T, const int *doc, int NH) {
    size_t rows = (size_t)BH * T;
    #pragma omp parallel for schedule(static)
    for (size_t rr = 0; rr < rows; rr++) {
        int t = (int)(rr % T), s0 = row_doc(doc, rr, T, NH);
        const float *ar = att + rr * T;
        float *dr = datt + rr * T;
        float dot = 0.0f;
        for (int j = s0; j <= t; j++) dot += ar[j] * dr[j];
        for (int j = 0; j < s0; j++) dr[j] = 0.0f;
        for (int j = s0; j <= t; j++) dr[j] = ar[j] * (dr[j] - dot);
        for (int j = t + 1; j < T; j++) dr[j] = 0.0f;
    }
}

#ifdef OPS_X86
/* ---------------------------------------------------------------------------------------- */
/* causal softmax (attention) */

/* One row: r[0..t] -> softmax, r[t+1..T) = 0; bf16 copy to o16 if given. */
VEC static void softmax_row(float *r, unsigned short *o16, int t, int T) {
    int n = t + 1;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < n; j += 16) { /* masked loads: the last row's tail must not read past the buffer */
        __mmask16 m = tail(j, n);
        mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, r + j));
    }
    __m512 vmx = _mm512_set1_ps(_mm512_reduce_max_ps(mx)), sum = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        __mmask16 m = tail(j, n);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, r + j), vmx));
        _mm512_mask_storeu_ps(r + j, m, e);
        sum = _mm512_mask_add_ps(sum, m, sum, e);
    }
    __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int j = 0; j < T; j += 16) {
        __mmask16 m = tail(j, T);
        __m512 p = _mm512_maskz_mul_ps(tail(j, n) & m, _mm512_maskz_loadu_ps(m, r + j), inv);
        _mm512_mask_storeu_ps(r + j, m, p);
        if (o16) store16(o16 + j, p, m);
    }
}

/* Zero the n masked columns before a row's document (and their bf16 copy). */
static void zero_head(float *r, unsigned short *o16, int n) {
    if (n <= 0) return;
    memset(r, 0, sizeof(float) * n);
    if (o16) memset(o16, 0, sizeof(unsigned short) * n);
}

/* Row rr of a document-masked softmax: the row from its document's first column s on. */
VEC static void softmax_vec(float *att, unsigned short *out16, int BH, int T, const int *doc, int NH) {
    size_t rows = (size_t)BH * T;
    #pragma omp parallel for schedule(static)
    for (size_t rr = 0; rr < rows; rr++) {
        int s = row_doc(doc, rr, T, NH);
        unsigned short *o16 = out16 ? out16 + rr * T : NULL;
        softmax_row(att + rr * T + s, o16 ? o16 + s : NULL, (int)(rr % T) - s, T - s);
        zero_head(att + rr * T, o16, s);
    }
}

/* One row of the backward: d = a (d - sum_j a_j d_j) over [0, t], 0 beyond. */
VEC static void softmax_bwd_row(float *d, unsigned short *o16, const float *a, int t, int T) {
    int n = t + 1;
    __m512 dot = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        __mmask16 m = tail(j, n);
        dot = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + j), _mm512_maskz_loadu_ps(m, d + j), dot);
    }
    __m512 vd = _mm512_set1_ps(_mm512_reduce_add_ps(dot));
    for (int j = 0; j < T; j += 16) {
        __mmask16 m = tail(j, T), in = tail(j, n) & m;
        __m512 x = _mm512_maskz_mul_ps(in, _mm512_maskz_loadu_ps(in, a + j),
                                       _mm512_sub_ps(_mm512_maskz_loadu_ps(in, d + j), vd));
        _mm512_mask_storeu_ps(d + j, m, x);
        if (o16) store16(o16 + j, x, m);
    }
}

VEC static void softmax_bwd_vec(float *datt, unsigned short *out16, const float *att, int BH, int T, const int *doc,
                                int NH) {
    size_t rows = (size_t)BH * T;
    #pragma omp parallel for schedule(static)
    for (size_t rr = 0; rr < rows; rr++) {
        int s = row_doc(doc, rr, T, NH);
        unsigned short *o16 = out16 ? out16 + rr * T : NULL;
        softmax_bwd_row(datt + rr * T + s, o16 ? o16 + s : NULL, att + rr * T + s, (int)(rr % T) - s, T - s);
        zero_head(datt + rr * T, o16, s);
    }
}
#endif /* OPS_X86 */

int onednn_softmax_causal(float *att, unsigned short *out16, int BH, int T, const int *doc, int NH) {
#ifdef OPS_X86
    if (use_vec) { softmax_vec(att, out16, BH, T, doc, NH); return out16 != NULL; }
#endif
    (void)out16;
    softmax_scalar(att, BH, T, doc, NH);
    return 0;
}

int onednn_softmax_causal_bwd(float *datt, unsigned short *out16, const float *att, int BH, int T, const int *doc,
                              int NH) {
#ifdef OPS_X86
    if (use_vec) { softmax_bwd_vec(datt, out16, att, BH, T, doc, NH); return out16 != NULL; }
#endif
    (void)out16;
    softmax_bwd_scalar(datt, att, BH, T, doc, NH);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* LayerNorm */

#ifdef OPS_X86
/* Sum of a row of n in 16 lanes (the fixed reduction). */
VEC static inline float row_sum(const float *x, int n) {
    __m512 s = _mm512_setzero_ps();
    for (int c = 0; c < n; c += 16) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(tail(c, n), x + c));
    return _mm512_reduce_add_ps(s);
}

VEC static void ln_fwd_vec(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                           int N, int C) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *o = out + (size_t)i * C;
        float m = row_sum(x, C) / C;
        __m512 vm = _mm512_set1_ps(m), acc = _mm512_setzero_ps();
        for (int c = 0; c < C; c += 16) {
            __mmask16 k = tail(c, C);
            __m512 d = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, x + c), vm);
            acc = _mm512_fmadd_ps(d, d, acc);
        }
        float s = 1.0f / sqrtf(_mm512_reduce_add_ps(acc) / C + LN_EPS);
        __m512 vs = _mm512_set1_ps(s);
        for (int c = 0; c < C; c += 16) {
            __mmask16 k = tail(c, C);
            __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + c), vm), vs);
            __m512 y = _mm512_fmadd_ps(xh, _mm512_maskz_loadu_ps(k, w + c), _mm512_maskz_loadu_ps(k, b + c));
            _mm512_mask_storeu_ps(o + c, k, y);
        }
        mean[i] = m;
        rstd[i] = s;
    }
}

/* dx += (dn - mean(dn) - xhat mean(dn xhat)) rstd, dn = w dy. */
VEC static void ln_bwd_input_vec(float *dinp, const float *dout, const float *inp, const float *w, const float *mean,
                                 const float *rstd, int N, int C) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *dy = dout + (size_t)i * C, *x = inp + (size_t)i * C;
        float *dx = dinp + (size_t)i * C;
        __m512 vm = _mm512_set1_ps(mean[i]), vs = _mm512_set1_ps(rstd[i]);
        __m512 a = _mm512_setzero_ps(), bs = _mm512_setzero_ps();
        for (int c = 0; c < C; c += 16) {
            __mmask16 k = tail(c, C);
            __m512 xh = _mm512_mul_ps(_mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, x + c), vm), vs);
            __m512 dn = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + c), _mm512_maskz_loadu_ps(k, dy + c));
            a = _mm512_add_ps(a, dn);
            bs = _mm512_fmadd_ps(dn, xh, bs);
        }
        __m512 va = _mm512_set1_ps(_mm512_reduce_add_ps(a) / C), vb = _mm512_set1_ps(_mm512_reduce_add_ps(bs) / C);
        for (int c = 0; c < C; c += 16) {
            __mmask16 k = tail(c, C);
            __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + c), vm), vs);
            __m512 dn = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + c), _mm512_maskz_loadu_ps(k, dy + c));
            __m512 g = _mm512_mul_ps(_mm512_fnmadd_ps(xh, vb, _mm512_sub_ps(dn, va)), vs);
            _mm512_mask_storeu_ps(dx + c, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, dx + c), g));
        }
    }
}

/* dw += sum_i dy xhat, db += sum_i dy: each channel sums its rows in order, so any split of
 * the channels gives the same bits; threads take blocks of 16 channels, and each block
 * streams the rows (row-major reads, accumulators in registers). */
VEC static void ln_bwd_weight_vec(float *dw, float *db, const float *dout, const float *inp, const float *mean,
                                  const float *rstd, int N, int C) {
    int nblk = (C + 63) / 64;
    #pragma omp parallel for schedule(static)
    for (int kb = 0; kb < nblk; kb++) {
        int c0 = kb * 64;
        __mmask16 k[4];
        __m512 sw[4], sb[4];
        for (int u = 0; u < 4; u++) {
            k[u] = c0 + 16 * u < C ? tail(c0 + 16 * u, C) : 0;
            sw[u] = _mm512_maskz_loadu_ps(k[u], dw + c0 + 16 * u);
            sb[u] = _mm512_maskz_loadu_ps(k[u], db + c0 + 16 * u);
        }
        for (int i = 0; i < N; i++) {
            const float *dy = dout + (size_t)i * C + c0, *x = inp + (size_t)i * C + c0;
            __m512 vm = _mm512_set1_ps(mean[i]), vs = _mm512_set1_ps(rstd[i]);
            for (int u = 0; u < 4; u++) {
                __m512 g = _mm512_maskz_loadu_ps(k[u], dy + 16 * u);
                __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k[u], x + 16 * u), vm), vs);
                sb[u] = _mm512_add_ps(sb[u], g);
                sw[u] = _mm512_fmadd_ps(g, xh, sw[u]);
            }
        }
        for (int u = 0; u < 4; u++) {
            _mm512_mask_storeu_ps(dw + c0 + 16 * u, k[u], sw[u]);
            _mm512_mask_storeu_ps(db + c0 + 16 * u, k[u], sb[u]);
        }
    }
}
#endif

int onednn_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                         int N, int C) {
#ifdef OPS_X86
    if (use_vec && C > 0) { ln_fwd_vec(out, mean, rstd, inp, w, b, N, C); return 0; }
#endif
    return backend_cpu.layernorm_fwd(out, mean, rstd, inp, w, b, N, C);
}
int onednn_layernorm_bwd_input(float *dinp, const float *dout, const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C) {
#ifdef OPS_X86
    if (use_vec && C > 0) { ln_bwd_input_vec(dinp, dout, inp, w, mean, rstd, N, C); return 0; }
#endif
    return backend_cpu.layernorm_bwd_input(dinp, dout, inp, w, mean, rstd, N, C);
}
int onednn_layernorm_bwd_weight(float *dw, float *db, const float *dout, const float *inp, const float *mean,
                                const float *rstd, int N, int C) {
#ifdef OPS_X86
    if (use_vec && C > 0) { ln_bwd_weight_vec(dw, db, dout, inp, mean, rstd, N, C); return 0; }
#endif
    return backend_cpu.layernorm_bwd_weight(dw, db, dout, inp, mean, rstd, N, C);
}

/* ---------------------------------------------------------------------------------------- */
/* GELU (tanh approximation) */

#ifdef OPS_X86

/* bf16 precision: 0.5 x (1 + tanh(u)) = x sigma(2u), one exponential and a refined reciprocal
 * instead of tanh16's division (the same function; not the fp32 loop's bits). */
VEC static void gelu_fwd_sig(float *out, const float *inp, size_t n) {
    ELEM_LOOP(n, {
        __m512 x = _mm512_maskz_loadu_ps(m, inp + i);
        __m512 u = _mm512_mul_ps(_mm512_set1_ps(2.0f * GELU_SCALE),
                                 _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), x), _mm512_mul_ps(x, x), x));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(x, sigmoid16(u)));
    });
}

/* gelu'(x) = s + 2 x s (1 - s) u', s = sigma(2u), u' = sqrt(2/pi) (1 + 3 0.044715 x^2). */
VEC static void gelu_bwd_sig(float *dinp, const float *inp, const float *dout, size_t n) {
    ELEM_LOOP(n, {
        __m512 x = _mm512_maskz_loadu_ps(m, inp + i), one = _mm512_set1_ps(1.0f);
        __m512 x2 = _mm512_mul_ps(x, x);
        __m512 u2 = _mm512_mul_ps(_mm512_set1_ps(2.0f * GELU_SCALE),
                                  _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), x), x2, x));
        __m512 s = sigmoid16(u2);
        __m512 du2 = _mm512_mul_ps(_mm512_set1_ps(2.0f * GELU_SCALE),
                                   _mm512_fmadd_ps(_mm512_set1_ps(3.0f * 0.044715f), x2, one));
        __m512 g = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(x, s), _mm512_sub_ps(one, s)), du2, s);
        _mm512_mask_storeu_ps(dinp + i, m, _mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, dout + i)));
    });
}

VEC static void gelu_fwd_vec(float *out, const float *inp, size_t n) {
    ELEM_LOOP(n, {
        __m512 x = _mm512_maskz_loadu_ps(m, inp + i);
        __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
        __m512 u = _mm512_mul_ps(_mm512_set1_ps(GELU_SCALE), _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), x3, x));
        __m512 y = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), _mm512_add_ps(_mm512_set1_ps(1.0f), tanh16(u)));
        _mm512_mask_storeu_ps(out + i, m, y);
    });
}

/* gelu'(x) = 0.5 (1 + th) + 0.5 x (1 - th^2) sqrt(2/pi) (1 + 3 0.044715 x^2). */
VEC static void gelu_bwd_vec(float *dinp, const float *inp, const float *dout, size_t n) {
    ELEM_LOOP(n, {
        __m512 x = _mm512_maskz_loadu_ps(m, inp + i), one = _mm512_set1_ps(1.0f), half = _mm512_set1_ps(0.5f);
        __m512 x2 = _mm512_mul_ps(x, x);
        __m512 u = _mm512_mul_ps(_mm512_set1_ps(GELU_SCALE), _mm512_fmadd_ps(_mm512_set1_ps(0.044715f),
                                                                             _mm512_mul_ps(x2, x), x));
        __m512 th = tanh16(u);
        __m512 sech2 = _mm512_fnmadd_ps(th, th, one);
        __m512 du = _mm512_mul_ps(_mm512_set1_ps(GELU_SCALE), _mm512_fmadd_ps(_mm512_set1_ps(3.0f * 0.044715f), x2, one));
        __m512 g = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(half, x), sech2), du,
                                   _mm512_mul_ps(half, _mm512_add_ps(one, th)));
        _mm512_mask_storeu_ps(dinp + i, m, _mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, dout + i)));
    });
}
#endif

int onednn_gelu_fwd(float *out, const float *inp, size_t n) {
#ifdef OPS_X86
    if (use_vec && bf16_kernels) { gelu_fwd_sig(out, inp, n); return 0; }
    if (use_vec) { gelu_fwd_vec(out, inp, n); return 0; }
#endif
    return backend_cpu.gelu_fwd(out, inp, n);
}
int onednn_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n) {
#ifdef OPS_X86
    if (use_vec && bf16_kernels) { gelu_bwd_sig(dinp, inp, dout, n); return 0; }
    if (use_vec) { gelu_bwd_vec(dinp, inp, dout, n); return 0; }
#endif
    return backend_cpu.gelu_bwd(dinp, inp, dout, n);
}

/* ---------------------------------------------------------------------------------------- */
/* cross-entropy */

#ifdef OPS_X86
/* Per row: the softmax over the V real columns (the padded ones 0), loss = -log p[y]. */
VEC static void ce_fwd_vec(float *losses, float *logits, const int *targets, int N, int V, int Vp) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *r = logits + (size_t)i * Vp;
        __m512 mx = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
        for (int j = 0; j < V; j += 16) {
            __mmask16 m = tail(j, V);
            mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, r + j));
        }
        __m512 vmx = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        for (int j = 0; j < V; j += 16) {
            __mmask16 k = tail(j, V);
            __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, r + j), vmx));
            _mm512_mask_storeu_ps(r + j, k, e);
            sum = _mm512_mask_add_ps(sum, k, sum, e);
        }
        __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
        for (int j = 0; j < V; j += 16) {
            __mmask16 k = tail(j, V);
            _mm512_mask_storeu_ps(r + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, r + j), inv));
        }
        for (int j = V; j < Vp; j++) r[j] = 0.0f;
        losses[i] = -logf(r[targets[i]]);
    }
}

VEC static void ce_bwd_vec(float *probs, const int *targets, float dloss, int N, int V, int Vp) {
    __m512 d = _mm512_set1_ps(dloss);
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *r = probs + (size_t)i * Vp;
        for (int j = 0; j < V; j += 16) {
            __mmask16 k = tail(j, V);
            _mm512_mask_storeu_ps(r + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, r + j), d));
        }
        r[targets[i]] -= dloss;
    }
}
#endif

int onednn_crossentropy_fwd(float *losses, float *logits, const int *targets, int N, int V, int Vp) {
#ifdef OPS_X86
    if (use_vec && V > 0) { ce_fwd_vec(losses, logits, targets, N, V, Vp); return 0; }
#endif
    return backend_cpu.crossentropy_fwd(losses, logits, targets, N, V, Vp);
}
int onednn_crossentropy_bwd(float *probs, const int *targets, float dloss, int N, int V, int Vp) {
#ifdef OPS_X86
    if (use_vec && V > 0) { ce_bwd_vec(probs, targets, dloss, N, V, Vp); return 0; }
#endif
    return backend_cpu.crossentropy_bwd(probs, targets, dloss, N, V, Vp);
}

/* ---------------------------------------------------------------------------------------- */
/* AdamW and the squared norm: one pass over the memory each */

#ifdef OPS_X86
/* The CPU backend's update (the same divisions and square root, exactly rounded), 16 lanes
 * at a time: 16 bytes read and 12 written per parameter, nothing else. */
VEC static void adamw_vec(float *p, const float *g, float *mm, float *vv, size_t n, float lr, float b1, float b2,
                          float eps, float wd, float c1, float c2) {
    __m512 vb1 = _mm512_set1_ps(b1), vb2 = _mm512_set1_ps(b2), nb1 = _mm512_set1_ps(1.0f - b1);
    __m512 nb2 = _mm512_set1_ps(1.0f - b2), vc1 = _mm512_set1_ps(c1), vc2 = _mm512_set1_ps(c2);
    __m512 veps = _mm512_set1_ps(eps), vwd = _mm512_set1_ps(wd), vlr = _mm512_set1_ps(lr);
    ELEM_LOOP(n, {
        __m512 gi = _mm512_maskz_loadu_ps(m, g + i), pi = _mm512_maskz_loadu_ps(m, p + i);
        __m512 mi = _mm512_fmadd_ps(vb1, _mm512_maskz_loadu_ps(m, mm + i), _mm512_mul_ps(nb1, gi));
        __m512 vi = _mm512_fmadd_ps(vb2, _mm512_maskz_loadu_ps(m, vv + i), _mm512_mul_ps(_mm512_mul_ps(nb2, gi), gi));
        __m512 mh = _mm512_div_ps(mi, vc1), vh = _mm512_div_ps(vi, vc2);
        __m512 upd = _mm512_fmadd_ps(vwd, pi, _mm512_div_ps(mh, _mm512_add_ps(_mm512_sqrt_ps(vh), veps)));
        _mm512_mask_storeu_ps(mm + i, m, mi);
        _mm512_mask_storeu_ps(vv + i, m, vi);
        _mm512_mask_storeu_ps(p + i, m, _mm512_fnmadd_ps(vlr, upd, pi));
    });
}

/* Chunks of SUMSQ_CHUNK values, each summed in double in 16 lanes (x^2 of a float is exact in
 * double, so a fused multiply-add rounds as the scalar loop's add), the chunks added in order. */
VEC static double chunk_sumsq(const float *x, size_t n) {
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), b = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
        s0 = _mm512_fmadd_pd(a, a, s0);
        s1 = _mm512_fmadd_pd(b, b, s1);
    }
    double s = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    for (; i < n; i++) s += (double)x[i] * x[i];
    return s;
}
#endif

int onednn_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2, float eps,
                 float wd, int t) {
#ifdef OPS_X86
    if (use_vec) {
        float c1 = 1.0f - powf(b1, (float)t), c2 = 1.0f - powf(b2, (float)t);
        adamw_vec(p, g, m, v, n, lr, b1, b2, eps, wd, c1, c2);
        return 0;
    }
#endif
    return backend_cpu.adamw(p, g, m, v, n, lr, b1, b2, eps, wd, t);
}

int onednn_sumsq(const float *x, size_t n, double *out) {
#ifdef OPS_X86
    if (use_vec) {
        size_t nchunk = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
        double total = 0.0;
        #pragma omp parallel for schedule(static) ordered
        for (size_t k = 0; k < nchunk; k++) {
            size_t i0 = k * SUMSQ_CHUNK;
            double s = chunk_sumsq(x + i0, i0 + SUMSQ_CHUNK < n ? SUMSQ_CHUNK : n - i0);
            #pragma omp ordered
            total += s;
        }
        *out = total;
        return 0;
    }
#endif
    return backend_cpu.sumsq(x, n, out);
}
