/*
 * cpu_decode.c — the CPU backend's decode kernels (cpu_decode.h): one fixed-order dot
 * product, in AVX-512 and in portable C with the same bits, and the matrix product and the
 * KV-cache attention built on it.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CD_X86 1
#endif
#include "backend/backend_host.h"
#include "util/common.h"
#include "backend/cpu/cpu_decode.h"

#define CD_LANES 16
#define CD_CHUNK 256 /* attention scores kept per pass (stack) */

static int force_portable;

/* Tests: the portable C even on an AVX-512 CPU (cpu_decode.h). */
void cpu_decode_force_portable(int on) { force_portable = on; }

/* Whether the AVX-512 code runs (the CPU has it and the tests did not turn it off). */
static int cd_avx512(void) {
#ifdef CD_X86
    static int have = -1;
    if (have < 0) have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    return have && !force_portable;
#else
    return 0;
#endif
}

/* ---- portable C: the reference order ---- */

/* The lanes added in the fixed tree: l + l+8, then + l+4, + l+2, + l+1. */
static float cd_tree(float *a) {
    for (int l = 0; l < 8; l++) a[l] += a[l + 8];
    for (int l = 0; l < 4; l++) a[l] += a[l + 4];
    for (int l = 0; l < 2; l++) a[l] += a[l + 2];
    return a[0] + a[1];
}

/* sum a[c] b[c], c < n: lane l takes c = l, l+16, ... (fused, from zero; past n both are zero). */
static float cd_dot_c(const float *a, const float *b, int n) {
    float acc[CD_LANES] = {0};
    for (int c0 = 0; c0 < n; c0 += CD_LANES)
        for (int l = 0; l < CD_LANES; l++) {
            int c = c0 + l;
            acc[l] = fmaf(c < n ? a[c] : 0.0f, c < n ? b[c] : 0.0f, acc[l]);
        }
    return cd_tree(acc);
}

/* o[c] = fma(w, v[c], o[c]). */
static void cd_axpy_c(float *o, float w, const float *v, int n) {
    for (int c = 0; c < n; c++) o[c] = fmaf(w, v[c], o[c]);
}

/* The matrix product, one dot per output. */
static void cd_matmul_c(float *out, const float *inp, const float *w, const float *b, int N, int C, int OC) {
    #pragma omp parallel for schedule(static)
    for (int o = 0; o < OC; o++)
        for (int i = 0; i < N; i++) {
            float s = cd_dot_c(inp + (size_t)i * C, w + (size_t)o * C, C);
            out[(size_t)i * OC + o] = b ? s + b[o] : s;
        }
}

/* ---- AVX-512: the same lanes, tree and fused multiply-adds ---- */
#ifdef CD_X86
#define CD_AVX512 __attribute__((target("avx512f,avx512dq")))

/* cd_tree in registers. */
CD_AVX512 static inline float cd_hsum(__m512 a) {
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* Lanes c..c+15 of p, zero past n. */
CD_AVX512 static inline __m512 cd_load(const float *p, int c, int n) {
    if (c + CD_LANES <= n) return _mm512_loadu_ps(p + c);
    return _mm512_maskz_loadu_ps((__mmask16)((1u << (n - c)) - 1), p + c);
}

/* cd_dot_c in registers. */
CD_AVX512 static float cd_dot_v(const float *a, const float *b, int n) {
    __m512 acc = _mm512_setzero_ps();
    for (int c = 0; c < n; c += CD_LANES) acc = _mm512_fmadd_ps(cd_load(a, c, n), cd_load(b, c, n), acc);
    return cd_hsum(acc);
}

/* cd_axpy_c in registers (the tail masked). */
CD_AVX512 static void cd_axpy_v(float *o, float w, const float *v, int n) {
    __m512 wv = _mm512_set1_ps(w);
    int c = 0;
    for (; c + CD_LANES <= n; c += CD_LANES)
        _mm512_storeu_ps(o + c, _mm512_fmadd_ps(wv, _mm512_loadu_ps(v + c), _mm512_loadu_ps(o + c)));
    if (c < n) {
        __mmask16 m = (__mmask16)((1u << (n - c)) - 1);
        _mm512_mask_storeu_ps(o + c, m, _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, v + c),
                                                        _mm512_maskz_loadu_ps(m, o + c)));
    }
}

/* out rows i0..i0+ni-1, columns o0..o0+no-1 (ni, no <= 4): 16 accumulators, every weight
 * vector loaded once for the 4 input rows; pf (or NULL): 4 weight rows to prefetch meanwhile
 * (the hardware prefetcher alone left a decode at half the memory bandwidth). */
CD_AVX512 static void cd_tile(float *out, const float *inp, const float *w, const float *b, int i0, int ni, int o0,
                              int no, int C, int OC, const float *pf) {
    const float *wr[4], *xr[4];
    __m512 a[4][4];
    for (int j = 0; j < 4; j++) wr[j] = w + (size_t)(o0 + (j < no ? j : 0)) * C;
    for (int i = 0; i < 4; i++) xr[i] = inp + (size_t)(i0 + (i < ni ? i : 0)) * C;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) a[i][j] = _mm512_setzero_ps();
    for (int c = 0; c < C; c += CD_LANES) {
        if (pf)
            for (int j = 0; j < 4; j++) _mm_prefetch((const char *)(pf + (size_t)j * C + c), _MM_HINT_T0);
        __m512 w0 = cd_load(wr[0], c, C), w1 = cd_load(wr[1], c, C), w2 = cd_load(wr[2], c, C),
               w3 = cd_load(wr[3], c, C);
        for (int i = 0; i < 4; i++) {
            __m512 x = cd_load(xr[i], c, C);
            a[i][0] = _mm512_fmadd_ps(x, w0, a[i][0]);
            a[i][1] = _mm512_fmadd_ps(x, w1, a[i][1]);
            a[i][2] = _mm512_fmadd_ps(x, w2, a[i][2]);
            a[i][3] = _mm512_fmadd_ps(x, w3, a[i][3]);
        }
    }
    for (int i = 0; i < ni; i++)
        for (int j = 0; j < no; j++) {
            float s = cd_hsum(a[i][j]);
            out[(size_t)(i0 + i) * OC + o0 + j] = b ? s + b[o0 + j] : s;
        }
}

/* Blocks of CD_ROWS input rows (kept in L1/L2 while the weights stream past), threads
 * splitting the columns in tiles of 4, the weight rows CD_AHEAD rows on prefetched: for a
 * decode step (N <= CD_ROWS) each weight row is read from memory once, which is what bounds
 * a decode. */
#define CD_ROWS 16
#define CD_AHEAD 8
CD_AVX512 static void cd_matmul_v(float *out, const float *inp, const float *w, const float *b, int N, int C,
                                  int OC) {
    for (int r0 = 0; r0 < N; r0 += CD_ROWS) {
        int r1 = N - r0 < CD_ROWS ? N : r0 + CD_ROWS;
        #pragma omp parallel for schedule(static)
        for (int o0 = 0; o0 < OC; o0 += 4)
            for (int i0 = r0; i0 < r1; i0 += 4)
                cd_tile(out, inp, w, b, i0, r1 - i0 < 4 ? r1 - i0 : 4, o0, OC - o0 < 4 ? OC - o0 : 4, C, OC,
                        i0 == r0 && o0 + CD_AHEAD + 4 <= OC ? w + (size_t)(o0 + CD_AHEAD) * C : NULL);
    }
}
#endif

/* The dot in the code vec names (1: AVX-512, which only an x86 CPU has). */
static float cd_dot(const float *a, const float *b, int n, int vec) {
#ifdef CD_X86
    if (vec) return cd_dot_v(a, b, n);
#endif
    (void)vec;
    return cd_dot_c(a, b, n);
}
/* The axpy in the code vec names. */
static void cd_axpy(float *o, float w, const float *v, int n, int vec) {
#ifdef CD_X86
    if (vec) {
        cd_axpy_v(o, w, v, n);
        return;
    }
#endif
    (void)vec;
    cd_axpy_c(o, w, v, n);
}

/* The AVX-512 tiles where the CPU has them, else the portable C: the same bits. */
int cpu_matmul_decode_fwd(float *out, const float *inp, const float *w, const float *b, int N, int C, int OC) {
    if (N < 0 || C < 0 || OC < 0) return host_fail(PL_EBACKEND, "matmul_decode_fwd: bad shape (N=%d C=%d OC=%d)", N, C, OC);
#ifdef CD_X86
    if (cd_avx512()) {
        cd_matmul_v(out, inp, w, b, N, C, OC);
        return 0;
    }
#endif
    cd_matmul_c(out, inp, w, b, N, C, OC);
    return 0;
}

/* One query head of one new row over the cache: t_j = dot(q, k_j) / sqrt(hs) for keys
 * 0..len-1, their maximum, then o = sum_j exp(t_j - max) v_j / sum_j exp(t_j - max), each sum
 * in key order. The scores are kept for up to CD_CHUNK keys (computed twice beyond). */
static void cd_head(float *o, const float *q, const float *kc, const float *vc, int len, int kvw, int hs, int vec) {
    float t[CD_CHUNK], scale = 1.0f / sqrtf((float)hs), mx = -INFINITY, sum = 0.0f;
    for (int pass = 0; pass < 2; pass++)
        for (int j0 = 0; j0 < len; j0 += CD_CHUNK) {
            int n = len - j0 < CD_CHUNK ? len - j0 : CD_CHUNK;
            if (pass == 0 || len > CD_CHUNK)
                for (int j = 0; j < n; j++) t[j] = cd_dot(q, kc + (size_t)(j0 + j) * kvw, hs, vec) * scale;
            if (pass == 0) {
                for (int j = 0; j < n; j++)
                    if (t[j] > mx) mx = t[j];
                continue;
            }
            if (j0 == 0) memset(o, 0, sizeof(float) * hs);
            for (int j = 0; j < n; j++) {
                float e = expf(t[j] - mx);
                sum += e;
                cd_axpy(o, e, vc + (size_t)(j0 + j) * kvw, hs, vec);
            }
        }
    for (int c = 0; c < hs; c++) o[c] /= sum;
}

/* The new rows' keys and values into the cache, then every (row, query head) pair in
 * parallel, each on one thread (the same bits for any thread count). */
int cpu_attention_kv_fwd(float *out, float *kc, float *vc, const float *qkv, int pos, int n, int NH, int NKV, int HS) {
    if (NKV < 1 || NH % NKV || pos < 0 || n < 1)
        return host_fail(PL_EBACKEND, "attention_kv_fwd: bad shape (NH=%d NKV=%d pos=%d n=%d)", NH, NKV, pos, n);
    int W = (NH + 2 * NKV) * HS, KW = NKV * HS, G = NH / NKV, vec = cd_avx512();
    for (int i = 0; i < n; i++) {
        memcpy(kc + (size_t)(pos + i) * KW, qkv + (size_t)i * W + (size_t)NH * HS, sizeof(float) * KW);
        memcpy(vc + (size_t)(pos + i) * KW, qkv + (size_t)i * W + (size_t)(NH + NKV) * HS, sizeof(float) * KW);
    }
    #pragma omp parallel for schedule(static)
    for (int ih = 0; ih < n * NH; ih++) {
        int i = ih / NH, h = ih % NH, g = h / G;
        cd_head(out + (size_t)i * NH * HS + (size_t)h * HS, qkv + (size_t)i * W + (size_t)h * HS, kc + (size_t)g * HS,
                vc + (size_t)g * HS, pos + i + 1, KW, HS, vec);
    }
    return 0;
}
