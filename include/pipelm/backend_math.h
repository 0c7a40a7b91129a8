/*
 * backend_math.h — the scalar functions every backend computes the same way, written once
 * so that the CPU loops, the oneDNN backend's softmax and the CUDA kernels agree bit for bit
 * where their order of operations does: exp_fast (the softmax and the GELU/SiLU exponentials),
 * tanh_fast on top of it, one row of the causal softmax, and the fp32 -> bf16 rounding of the bf16 products. Plain C99 that
 * nvcc compiles as host and device code (PL_MATH_FN), with no library calls, so loops over it
 * vectorise.
 */
#ifndef PIPELM_BACKEND_MATH_H
#define PIPELM_BACKEND_MATH_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define PL_MATH_FN static __host__ __device__ __forceinline__
#else
#define PL_MATH_FN static inline
#endif

/* exp(x) for float, vectorisable (no calls, no tables): x = k ln2 + r with |r| <= ln2/2,
 * exp(r) by a degree-6 minimax polynomial (Cephes' coefficients), 2^k built in the exponent
 * bits. Relative error about 2e-7; inputs are clamped to the finite range. */
PL_MATH_FN float exp_fast(float x) {
    x = x > 88.3f ? 88.3f : x;
    x = x < -87.3f ? -87.3f : x;
    float t = x * 1.44269504088896341f;
    float fk = (t + 12582912.0f) - 12582912.0f; /* round to nearest: 1.5 * 2^23 trick */
    /* a NaN x (a diverged run) keeps k = 0 so its result stays NaN without the undefined
     * float-to-int conversion and the shift of a negative (UBSan, test_pipeline.sh NaN) */
    int k = (int)(fk == fk ? fk : 0.0f);
    float r = x - fk * 0.693359375f + fk * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int bits = (k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* tanh(u) = 1 - 2 / (1 + exp(2u)), through exp_fast (absolute error ~1e-7). */
PL_MATH_FN float tanh_fast(float u) { return 1.0f - 2.0f / (1.0f + exp_fast(2.0f * u)); }

/* One row of the causal softmax, in place: row r of T scores at position t keeps columns
 * 0..t (max-subtracted, exponentiated, normalised in that order) and zeroes the rest. The
 * CPU attention and the oneDNN backend's share it, so their probabilities are the same bits. */
PL_MATH_FN void softmax_causal_row(float *r, int t, int T) {
    float mx = r[0];
    for (int j = 1; j <= t; j++) mx = r[j] > mx ? r[j] : mx;
    float sum = 0.0f;
    for (int j = 0; j <= t; j++) { r[j] = exp_fast(r[j] - mx); sum += r[j]; }
    float inv = 1.0f / sum;
    for (int j = 0; j <= t; j++) r[j] *= inv;
    for (int j = t + 1; j < T; j++) r[j] = 0.0f;
}

/* Document masking (backend_ops.h's doc): the first key column row t of a sequence sees, given
 * the sequence's doc row ds (NULL: 0, plain causal). */
PL_MATH_FN int doc_first(const int *ds, int t) { return ds ? ds[t] : 0; }

/* softmax_causal_row over the columns s..t only (a document starting at s), the rest zeroed;
 * s = 0 is softmax_causal_row, the same bits. */
PL_MATH_FN void softmax_doc_row(float *r, int s, int t, int T) {
    softmax_causal_row(r + s, t - s, T - s);
    for (int j = 0; j < s; j++) r[j] = 0.0f;
}

/* fp32 -> bf16 bits, round to nearest even; as VCVTNEPS2BF16 does, denormal inputs flush to
 * a signed zero and a NaN stays a (quiet) NaN. */
PL_MATH_FN uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif
