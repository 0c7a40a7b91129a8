/*
 * onednn_elem.c — the oneDNN backend's AVX-512 residual, add, scale, embedding and bias-gradient
 * loops (onednn_elem.h). Built for the baseline x86-64 ISA, the CPU backend's versions of these
 * run in 4 lanes (the column sum in whatever the compiler makes of a chunked loop); here they
 * run in 16, with the CPU backend's arithmetic and order, so their bits are its bits. Used only
 * when onednn_ops_select found AVX-512 (the column sum's bf16 copy also needs AVX512-BF16).
 * Also the transposed bf16 conversion of matmul_bwd_weight's dout (onednn_cvt_bf16_t,
 * onednn_colsum_bf16_t), with the column sums in the same pass, and the bf16 conversion of its
 * activation into oneDNN's blocked 16a64b2a layout (onednn_cvt_bf16_vnni).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdint.h>
#include <string.h>
#include "pipelm/backend.h"
#include "pipelm/backend_math.h"
#include "backend/backend_host.h"
#include "backend/onednn/onednn_elem.h"
#include "backend/onednn/onednn_ops.h"
#include "backend/onednn/onednn_simd.h"

#define COLSUM_CHUNK 256 /* host_colsum's column chunk: the same split of the work */

#ifdef OPS_X86
#define VEC_BF16 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,fma,avx512bf16")))

VEC static void residual_vec(float *out, const float *a, const float *b, size_t n) {
    ELEM_LOOP(n, {
        __m512 x = _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i));
        _mm512_mask_storeu_ps(out + i, m, x);
    });
}

VEC static void scale_vec(float *x, float s, size_t n) {
    __m512 vs = _mm512_set1_ps(s);
    ELEM_LOOP(n, { _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vs)); });
}

/* dst (+)= src over C values (add = 0: dst = src + base, the forward's wte + wpe). */
VEC static inline void row_add(float *dst, const float *a, const float *b, int C) {
    for (int c = 0; c < C; c += 16) {
        __mmask16 k = tail(c, C);
        _mm512_mask_storeu_ps(dst + c, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, a + c), _mm512_maskz_loadu_ps(k, b + c)));
    }
}

VEC static void encoder_fwd_vec(float *out, const int *tok, const float *wte, const float *wpe, int N, int T, int C) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++)
        row_add(out + (size_t)i * C, wte + (size_t)tok[i] * C, wpe + (size_t)(i % T) * C, C);
}

/* Serial over rows as the CPU backend's: two rows may hit the same token, in a fixed order. */
VEC static void encoder_bwd_vec(float *dwte, float *dwpe, const float *dout, const int *tok, int N, int T, int C) {
    for (int i = 0; i < N; i++) {
        const float *d = dout + (size_t)i * C;
        float *dw = dwte + (size_t)tok[i] * C, *dp = dwpe + (size_t)(i % T) * C;
        row_add(dw, dw, d, C);
        row_add(dp, dp, d, C);
    }
}

/* Columns [j0, j1) of the column sum, 64 at a time in registers, rows in order; with o16 the
 * bf16 of every value read. A template over the conversion: CVT(dst, x, mask) or nothing. */
#define COLSUM_BLOCK(CVT)                                                                      \
    for (int j = j0; j < j1; j += 64) {                                                        \
        __mmask16 k[4];                                                                        \
        __m512 s[4];                                                                           \
        for (int u = 0; u < 4; u++) {                                                          \
            k[u] = j + 16 * u < j1 ? tail(j + 16 * u, j1) : 0;                                 \
            s[u] = db ? _mm512_maskz_loadu_ps(k[u], db + j + 16 * u) : _mm512_setzero_ps();   \
        }                                                                                      \
        for (int i = 0; i < N; i++) {                                                          \
            const float *d = dout + (size_t)i * OC + j;                                        \
            for (int u = 0; u < 4; u++) {                                                      \
                __m512 x = _mm512_maskz_loadu_ps(k[u], d + 16 * u);                            \
                s[u] = _mm512_add_ps(s[u], x);                                                 \
                CVT(o16 + (size_t)i * OC + j + 16 * u, x, k[u]);                               \
            }                                                                                  \
        }                                                                                      \
        if (db)                                                                                \
            for (int u = 0; u < 4; u++) _mm512_mask_storeu_ps(db + j + 16 * u, k[u], s[u]);    \
    }

#define NO_CVT(dst, x, m) (void)0
#define BF16_CVT(dst, x, m) _mm256_mask_storeu_epi16((dst), (m), (__m256i)_mm512_cvtneps_pbh(x))

VEC static void colsum_vec(float *db, const float *dout, int N, int OC) {
    int nchunk = (OC + COLSUM_CHUNK - 1) / COLSUM_CHUNK;
    uint16_t *o16 = NULL;
    (void)o16;
    #pragma omp parallel for schedule(static)
    for (int kc = 0; kc < nchunk; kc++) {
        int j0 = kc * COLSUM_CHUNK, j1 = j0 + COLSUM_CHUNK < OC ? j0 + COLSUM_CHUNK : OC;
        COLSUM_BLOCK(NO_CVT)
    }
}

VEC_BF16 static void colsum_bf16_vec(float *db, uint16_t *o16, const float *dout, int N, int OC) {
    int nchunk = (OC + COLSUM_CHUNK - 1) / COLSUM_CHUNK;
    #pragma omp parallel for schedule(static)
    for (int kc = 0; kc < nchunk; kc++) {
        int j0 = kc * COLSUM_CHUNK, j1 = j0 + COLSUM_CHUNK < OC ? j0 + COLSUM_CHUNK : OC;
        COLSUM_BLOCK(BF16_CVT)
    }
}

/* 16 x 16 floats transposed in registers: row k in r[k] becomes column k in r[k]. */
VEC static inline void tr16(__m512 *r) {
    __m512 t[16];
    for (int k = 0; k < 16; k += 2) {
        t[k] = _mm512_unpacklo_ps(r[k], r[k + 1]);
        t[k + 1] = _mm512_unpackhi_ps(r[k], r[k + 1]);
    }
    for (int k = 0; k < 16; k += 4) {
        r[k] = _mm512_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[k + 1] = _mm512_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[k + 2] = _mm512_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[k + 3] = _mm512_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int h = 0; h < 16; h += 8)
        for (int k = 0; k < 4; k++) {
            t[h + k] = _mm512_shuffle_f32x4(r[h + k], r[h + k + 4], 0x88);
            t[h + k + 4] = _mm512_shuffle_f32x4(r[h + k], r[h + k + 4], 0xdd);
        }
    for (int k = 0; k < 8; k++) {
        r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
        r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
    }
}

/* Columns [j0, j1) (at most COLSUM_CHUNK) of src (N, OC) as rows of dst (OC, N) in bf16: 32
 * rows at a time (read along the rows), 16 columns by 32 rows a block (two register transposes,
 * one VCVTNE2PS2BF16 a column); with db, the column sums in the same pass, each column's rows
 * in order from db's value (host_colsum's bits), kept in acc between the row blocks. */
VEC_BF16 static void colsum_t_cols(float *db, uint16_t *dst, const float *src, int N, int OC, int j0, int j1) {
    float acc[COLSUM_CHUNK] __attribute__((aligned(64)));
    if (db) memcpy(acc, db + j0, sizeof(float) * (size_t)(j1 - j0));
    for (int i = 0; i < N; i += 32) {
        int nr = N - i < 32 ? N - i : 32;
        __mmask32 m = nr == 32 ? 0xffffffffu : (1u << nr) - 1u;
        for (int j = j0; j < j1; j += 16) {
            __mmask16 kc = tail(j, j1);
            __m512 a[32], s = db ? _mm512_maskz_loadu_ps(kc, acc + (j - j0)) : _mm512_setzero_ps();
            for (int k = 0; k < 32; k++) {
                a[k] = k < nr ? _mm512_maskz_loadu_ps(kc, src + (size_t)(i + k) * OC + j) : _mm512_setzero_ps();
                if (db && k < nr) s = _mm512_add_ps(s, a[k]);
            }
            if (db) _mm512_mask_storeu_ps(acc + (j - j0), kc, s);
            tr16(a);
            tr16(a + 16);
            for (int c = 0; c < 16 && j + c < j1; c++)
                _mm512_mask_storeu_epi16(dst + (size_t)(j + c) * N + i, m, (__m512i)_mm512_cvtne2ps_pbh(a[16 + c], a[c]));
        }
    }
    if (db) memcpy(db + j0, acc, sizeof(float) * (size_t)(j1 - j0));
}
#endif /* OPS_X86 */

/* Portable: columns [j0, j1) of src (N, OC) as rows of dst (OC, N), in blocks of 32 rows. */
static void cvt_t_scalar(uint16_t *dst, const float *src, int N, int OC, int j0, int j1) {
    for (int i0 = 0; i0 < N; i0 += 32)
        for (int j = j0; j < j1; j++)
            for (int i = i0; i < i0 + 32 && i < N; i++) dst[(size_t)j * N + i] = f32_to_bf16(src[(size_t)i * OC + j]);
}

/* The transposed conversion over column chunks, with db's sums where the vector loop runs
 * (returns 1 then); 0: converted by the portable loop, db untouched. */
static int colsum_t(float *db, uint16_t *dst, const float *src, int N, int OC) {
    int nchunk = (OC + COLSUM_CHUNK - 1) / COLSUM_CHUNK, vec = 0;
#ifdef OPS_X86
    vec = __builtin_cpu_supports("avx512bf16");
#endif
    #pragma omp parallel for schedule(static)
    for (int kc = 0; kc < nchunk; kc++) {
        int j0 = kc * COLSUM_CHUNK, j1 = j0 + COLSUM_CHUNK < OC ? j0 + COLSUM_CHUNK : OC;
#ifdef OPS_X86
        if (vec) { colsum_t_cols(db, dst, src, N, OC, j0, j1); continue; }
#endif
        cvt_t_scalar(dst, src, N, OC, j0, j1);
    }
    return vec;
}

/* ---------------------------------------------------------------------------------------- */
/* bf16 in oneDNN's blocked layout for a product's weights operand (onednn_elem.h) */

/* Where element (k, n) of the (K, N) operand lies in the 16a64b2a layout (blocks of 32 rows
 * by 64 columns; inside one, 16 pairs of rows, each pair's 64 columns as (row k, row k + 1)
 * bf16 pairs), with sk, sn the strides of the row and column blocks. */
static inline size_t vnni_at(int k, int n, int64_t sk, int64_t sn) {
    return (size_t)((k / 32) * sk + (n / 64) * sn) + (size_t)((k % 32) / 2 * 128 + (n % 64) * 2 + k % 2);
}

/* Portable: row block kb (rows [32 kb, 32 kb + 32) of the padded operand), padding zero. */
static void vnni_scalar(uint16_t *dst, const float *src, int K, int N, int64_t sk, int64_t sn, int kb) {
    int Np = (N + 63) / 64 * 64;
    for (int k = kb * 32; k < kb * 32 + 32; k++)
        for (int n = 0; n < Np; n++)
            dst[vnni_at(k, n, sk, sn)] = k < K && n < N ? f32_to_bf16(src[(size_t)k * N + n]) : 0;
}

#ifdef OPS_X86
/* Row block kb in 16 columns a step: rows k and k + 1 converted by one VCVTNE2PS2BF16 (the
 * rounding of every other conversion here) and interleaved into the 32 bf16 of the 16 pairs. */
VEC_BF16 static void vnni_vec(uint16_t *dst, const float *src, int K, int N, int64_t sk, int64_t sn, int kb) {
    const __m512i ilv = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    int Np = (N + 63) / 64 * 64;
    for (int k = kb * 32; k < kb * 32 + 32; k += 2) {
        const float *r0 = src + (size_t)k * N, *r1 = r0 + N;
        for (int n = 0; n < Np; n += 16) {
            __mmask16 m = tail(n, N);
            __m512 a = k < K ? _mm512_maskz_loadu_ps(m, r0 + n) : _mm512_setzero_ps();
            __m512 b = k + 1 < K ? _mm512_maskz_loadu_ps(m, r1 + n) : _mm512_setzero_ps();
            __m512i p = _mm512_permutexvar_epi16(ilv, (__m512i)_mm512_cvtne2ps_pbh(b, a));
            _mm512_storeu_si512((void *)(dst + vnni_at(k, n, sk, sn)), p);
        }
    }
}
#endif

void onednn_cvt_bf16_vnni(uint16_t *dst, const float *src, int K, int N, int64_t sk, int64_t sn) {
    int nkb = (K + 31) / 32, vec = 0;
    if (K <= 0 || N <= 0) return;
#ifdef OPS_X86
    vec = __builtin_cpu_supports("avx512bf16");
#endif
    #pragma omp parallel for schedule(static)
    for (int kb = 0; kb < nkb; kb++) {
#ifdef OPS_X86
        if (vec) { vnni_vec(dst, src, K, N, sk, sn, kb); continue; }
#endif
        vnni_scalar(dst, src, K, N, sk, sn, kb);
    }
    (void)vec;
}

void onednn_cvt_bf16_t(uint16_t *dst, const float *src, int N, int OC) {
    if (N > 0 && OC > 0) colsum_t(NULL, dst, src, N, OC);
}

int onednn_colsum_bf16_t(float *db, uint16_t *dst, const float *dout, int N, int OC) {
    if (N <= 0 || OC <= 0) return 1;
    if (db && !onednn_ops_active()) { /* the CPU backend's loops: the caller sums */
        colsum_t(NULL, dst, dout, N, OC);
        return 0;
    }
    return colsum_t(db, dst, dout, N, OC);
}

int onednn_residual_fwd(float *out, const float *a, const float *b, size_t n) {
#ifdef OPS_X86
    if (onednn_ops_active()) { residual_vec(out, a, b, n); return 0; }
#endif
    return backend_cpu.residual_fwd(out, a, b, n);
}

int onednn_add_inplace(float *dst, const float *src, size_t n) {
#ifdef OPS_X86
    if (onednn_ops_active()) { residual_vec(dst, dst, src, n); return 0; }
#endif
    return backend_cpu.add_inplace(dst, src, n);
}

int onednn_scale(float *x, float s, size_t n) {
#ifdef OPS_X86
    if (onednn_ops_active()) { scale_vec(x, s, n); return 0; }
#endif
    return backend_cpu.scale(x, s, n);
}

int onednn_encoder_fwd(float *out, const int *tok, const float *wte, const float *wpe, int N, int T, int C) {
#ifdef OPS_X86
    if (onednn_ops_active() && T > 0) { encoder_fwd_vec(out, tok, wte, wpe, N, T, C); return 0; }
#endif
    return backend_cpu.encoder_fwd(out, tok, wte, wpe, N, T, C);
}

int onednn_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int *tok, int N, int T, int C) {
#ifdef OPS_X86
    if (onednn_ops_active() && T > 0) { encoder_bwd_vec(dwte, dwpe, dout, tok, N, T, C); return 0; }
#endif
    return backend_cpu.encoder_bwd(dwte, dwpe, dout, tok, N, T, C);
}

int onednn_colsum_bf16(float *db, uint16_t *out16, const float *dout, int N, int OC) {
    if (N <= 0 || OC <= 0) return out16 != NULL;
#ifdef OPS_X86
    if (onednn_ops_active() && out16 && __builtin_cpu_supports("avx512bf16")) {
        colsum_bf16_vec(db, out16, dout, N, OC);
        return 1;
    }
#endif
    if (out16) return 0; /* nothing done: the caller converts and sums */
#ifdef OPS_X86
    if (onednn_ops_active()) {
        if (db) colsum_vec(db, dout, N, OC);
        return 0;
    }
#endif
    if (db) host_colsum(db, dout, N, OC);
    return 0;
}
