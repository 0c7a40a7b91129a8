/*
 * onednn_llama.c — the oneDNN backend's AVX-512 RMSNorm and SwiGLU (onednn_llama.h). The CPU
 * backend's row sums run one value at a time (C does not let the compiler reorder a float sum)
 * and its SwiGLU calls exp_fast per value; here the sums run in 16 lanes and the sigmoid is
 * exp16 with a refined reciprocal instead of a division. Used in bf16 precision on a CPU with
 * AVX-512 (onednn_ops_bf16 and onednn_ops_select); otherwise the CPU backend's ops.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include "pipelm/backend.h"
#include "backend/onednn/onednn_llama.h"
#include "backend/onednn/onednn_ops.h"
#include "backend/onednn/onednn_simd.h"

#ifdef OPS_X86
/* out = x rstd w per row, rstd = 1 / sqrt(mean(x^2) + eps). */
VEC static void rms_fwd_vec(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *o = out + (size_t)i * C;
        __m512 acc = _mm512_setzero_ps();
        for (int c = 0; c < C; c += 16) {
            __m512 v = _mm512_maskz_loadu_ps(tail(c, C), x + c);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        float s = 1.0f / sqrtf(_mm512_reduce_add_ps(acc) / C + eps);
        __m512 vs = _mm512_set1_ps(s);
        for (int c = 0; c < C; c += 16) {
            __mmask16 k = tail(c, C);
            __m512 y = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + c), vs), _mm512_maskz_loadu_ps(k, w + c));
            _mm512_mask_storeu_ps(o + c, k, y);
        }
        rstd[i] = s;
    }
}

/* dx += (w dy - x a) rstd, a = mean(w dy x) rstd^2. */
VEC static void rms_bwd_input_vec(float *dinp, const float *dout, const float *inp, const float *w, const float *rstd,
                                  int N, int C) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *dy = dout + (size_t)i * C, *x = inp + (size_t)i * C;
        float *dx = dinp + (size_t)i * C;
        float s = rstd[i];
        __m512 acc = _mm512_setzero_ps();
        for (int c = 0; c < C; c += 16) {
            __mmask16 k = tail(c, C);
            __m512 dn = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + c), _mm512_maskz_loadu_ps(k, dy + c));
            acc = _mm512_fmadd_ps(dn, _mm512_maskz_loadu_ps(k, x + c), acc);
        }
        __m512 va = _mm512_set1_ps(_mm512_reduce_add_ps(acc) / C * s * s), vs = _mm512_set1_ps(s);
        for (int c = 0; c < C; c += 16) {
            __mmask16 k = tail(c, C);
            __m512 dn = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + c), _mm512_maskz_loadu_ps(k, dy + c));
            __m512 g = _mm512_mul_ps(_mm512_fnmadd_ps(_mm512_maskz_loadu_ps(k, x + c), va, dn), vs);
            _mm512_mask_storeu_ps(dx + c, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, dx + c), g));
        }
    }
}

/* dw += sum_i dy x rstd: each channel sums its rows in order (any split of the channels gives
 * the same bits); threads take blocks of 64 channels, accumulators in registers. */
VEC static void rms_bwd_weight_vec(float *dw, const float *dout, const float *inp, const float *rstd, int N, int C) {
    int nblk = (C + 63) / 64;
    #pragma omp parallel for schedule(static)
    for (int kb = 0; kb < nblk; kb++) {
        int c0 = kb * 64;
        __mmask16 k[4];
        __m512 sw[4];
        for (int u = 0; u < 4; u++) {
            k[u] = c0 + 16 * u < C ? tail(c0 + 16 * u, C) : 0;
            sw[u] = _mm512_maskz_loadu_ps(k[u], dw + c0 + 16 * u);
        }
        for (int i = 0; i < N; i++) {
            const float *dy = dout + (size_t)i * C + c0, *x = inp + (size_t)i * C + c0;
            __m512 vs = _mm512_set1_ps(rstd[i]);
            for (int u = 0; u < 4; u++)
                sw[u] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k[u], dy + 16 * u),
                                        _mm512_mul_ps(_mm512_maskz_loadu_ps(k[u], x + 16 * u), vs), sw[u]);
        }
        for (int u = 0; u < 4; u++) _mm512_mask_storeu_ps(dw + c0 + 16 * u, k[u], sw[u]);
    }
}

/* out = up g sigma(g). */
VEC static void swiglu_fwd_vec(float *out, const float *up, const float *gate, size_t n) {
    ELEM_LOOP(n, {
        __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
        __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, up + i), _mm512_mul_ps(g, sigmoid16(g)));
        _mm512_mask_storeu_ps(out + i, m, y);
    });
}

/* dup = dout g sigma(g), dgate = dout up sigma(g) (1 + g (1 - sigma(g))); every input is read
 * before an output is written, so dup or dgate may alias dout (as the CPU backend's). */
VEC static void swiglu_bwd_vec(float *dup, float *dgate, const float *dout, const float *up, const float *gate,
                               size_t n) {
    ELEM_LOOP(n, {
        __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
        __m512 d = _mm512_maskz_loadu_ps(m, dout + i), one = _mm512_set1_ps(1.0f);
        __m512 sg = sigmoid16(g);
        __m512 ds = _mm512_mul_ps(sg, _mm512_fmadd_ps(g, _mm512_sub_ps(one, sg), one));
        _mm512_mask_storeu_ps(dup + i, m, _mm512_mul_ps(d, _mm512_mul_ps(g, sg)));
        _mm512_mask_storeu_ps(dgate + i, m, _mm512_mul_ps(_mm512_mul_ps(d, u), ds));
    });
}
#define LLAMA_VEC (onednn_ops_active() && onednn_ops_bf16(-1))
#endif /* OPS_X86 */

int onednn_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
#ifdef OPS_X86
    if (LLAMA_VEC && C > 0) { rms_fwd_vec(out, rstd, inp, w, N, C, eps); return 0; }
#endif
    return backend_cpu.rmsnorm_fwd(out, rstd, inp, w, N, C, eps);
}
int onednn_rmsnorm_bwd_input(float *dinp, const float *dout, const float *inp, const float *w, const float *rstd,
                             int N, int C) {
#ifdef OPS_X86
    if (LLAMA_VEC && C > 0) { rms_bwd_input_vec(dinp, dout, inp, w, rstd, N, C); return 0; }
#endif
    return backend_cpu.rmsnorm_bwd_input(dinp, dout, inp, w, rstd, N, C);
}
int onednn_rmsnorm_bwd_weight(float *dw, const float *dout, const float *inp, const float *rstd, int N, int C) {
#ifdef OPS_X86
    if (LLAMA_VEC && C > 0) { rms_bwd_weight_vec(dw, dout, inp, rstd, N, C); return 0; }
#endif
    return backend_cpu.rmsnorm_bwd_weight(dw, dout, inp, rstd, N, C);
}
int onednn_swiglu_fwd(float *out, const float *up, const float *gate, size_t n) {
#ifdef OPS_X86
    if (LLAMA_VEC) { swiglu_fwd_vec(out, up, gate, n); return 0; }
#endif
    return backend_cpu.swiglu_fwd(out, up, gate, n);
}
int onednn_swiglu_bwd(float *dup, float *dgate, const float *dout, const float *up, const float *gate, size_t n) {
#ifdef OPS_X86
    if (LLAMA_VEC) { swiglu_bwd_vec(dup, dgate, dout, up, gate, n); return 0; }
#endif
    return backend_cpu.swiglu_bwd(dup, dgate, dout, up, gate, n);
}
