/*
 * onednn_simd.h — the AVX-512 building blocks the oneDNN backend's vector loops share
 * (src/backend/onednn/onednn_ops.c, src/backend/onednn/onednn_elem.c, src/backend/onednn/onednn_llama.c): the target attributes, the mask
 * of a row's last lanes, exp_fast and tanh_fast in 16 lanes (backend_math.h's range reduction
 * and polynomial), the fp32 -> bf16 store (f32_to_bf16's rounding), a reciprocal refined to
 * about 1 ulp, and the elementwise loop over fixed blocks of 16. Internal to the backend: static
 * inline functions, each compiled for AVX-512 by its own target attribute, so the files build
 * on any x86-64 compiler (and define nothing elsewhere) and run them only after a runtime CPU
 * check (onednn_ops_select). ONEDNN_SIMD is defined when they are available.
 */
#ifndef PIPELM_ONEDNN_SIMD_H
#define PIPELM_ONEDNN_SIMD_H

#include <stddef.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define OPS_X86 1
#define VEC __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,fma")))
#define VEC_INLINE VEC static inline

/* Lanes [c, min(c + 16, n)) of a row of n (none when c >= n). */
VEC_INLINE __mmask16 tail(int c, int n) {
    return n - c >= 16 ? (__mmask16)0xFFFF : n <= c ? (__mmask16)0 : (__mmask16)((1u << (n - c)) - 1u);
}

/* exp_fast in 16 lanes: the same range reduction and polynomial, with fused multiply-adds.
 * min/max with the bound first keep a NaN input NaN (as the scalar version's). */
VEC_INLINE __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(88.3f), x);
    x = _mm512_max_ps(_mm512_set1_ps(-87.3f), x);
    __m512 fk = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(fk, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fmadd_ps(fk, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    /* p 2^k: VSCALEFPS is the exact product the exponent-bits construction gives (k is within
     * [-126, 128) after the clamps), in one instruction instead of four */
    return _mm512_scalef_ps(p, fk);
}

/* tanh_fast in 16 lanes: 1 - 2 / (1 + exp(2u)). */
VEC_INLINE __m512 tanh16(__m512 u) {
    __m512 one = _mm512_set1_ps(1.0f);
    __m512 e = exp16(_mm512_add_ps(u, u));
    return _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(one, e)));
}

/* fp32 -> bf16 of the lanes in m, f32_to_bf16's rule in 16 lanes: round to nearest even, a
 * denormal to a signed zero, a NaN quiet. */
VEC_INLINE void store16(unsigned short *dst, __m512 x, __mmask16 m) {
    __m512i u = _mm512_castps_si512(x), hi = _mm512_srli_epi32(u, 16);
    __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __mmask16 den = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000));
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_and_epi32(r, den, hi, _mm512_set1_epi32(0x8000));
    r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
    _mm256_mask_storeu_epi16(dst, m, _mm512_cvtepi32_epi16(r));
}

/* 1 / d to about 1 ulp: VRCP14PS (relative error 2^-14) and one Newton step, in place of
 * a division (several times its throughput). */
VEC_INLINE __m512 rcp16(__m512 d) {
    __m512 r = _mm512_rcp14_ps(d);
    return _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));
}

/* The logistic sigmoid 1 / (1 + exp(-x)) in 16 lanes. */
VEC_INLINE __m512 sigmoid16(__m512 x) {
    return rcp16(_mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

/* Blocks of 16 values, threads over fixed blocks: elementwise, so any split is the same. The
 * full blocks run with m a constant all-ones mask (the masked loads and stores compile to plain
 * ones) and the last partial block, if any, with its mask. The parallel region takes private
 * copies of the body's constants (default(firstprivate)): shared, they sit behind a pointer
 * that the body's stores may alias, and are reloaded every block (AdamW ran at 1.8x its
 * memory time). clang below OpenMP 5.1 lacks the clause (the fuzz build): it shares them. */
#if defined(__clang__)
#define ELEM_OMP_ _Pragma("omp parallel for schedule(static)")
#else
#define ELEM_OMP_ _Pragma("omp parallel for schedule(static) default(firstprivate)")
#endif
#define ELEM_LOOP(n, ...)                                                                     \
    do {                                                                                       \
        size_t n_ = (n), nf_ = n_ / 16;                                                        \
        ELEM_OMP_                                                                              \
        for (size_t b_ = 0; b_ < nf_; b_++) {                                                  \
            size_t i = b_ * 16;                                                                \
            const __mmask16 m = (__mmask16)0xFFFF;                                             \
            __VA_ARGS__                                                                        \
        }                                                                                      \
        if (n_ % 16) {                                                                         \
            size_t i = nf_ * 16;                                                               \
            const __mmask16 m = (__mmask16)((1u << (n_ - i)) - 1u);                            \
            __VA_ARGS__                                                                        \
        }                                                                                      \
    } while (0)
#endif /* x86-64 */

#endif
