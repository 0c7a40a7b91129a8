/*
 * backend_cuda.cu — the CUDA backend ("cuda"): every tensor in device memory, cuBLAS for every
 * matrix product, CUDA kernels for everything else, all on one stream of one device per rank.
 *
 * Device: opt->device when >= 0, else opt->local_rank of opt->local_ranks (the trainer's
 *   MPI_Comm_split_type) when given, else the node-local rank that the launcher exports
 *   (MPI_LOCALRANKID from MPICH's hydra, OMPI_COMM_WORLD_LOCAL_RANK, MV2_COMM_WORLD_LOCAL_RANK,
 *   SLURM_LOCALID, in that order; 0 when none is set). More local ranks than devices is refused
 *   unless --backend-opt share=1 (alias PIPELM_CUDA_SHARE=1; then rank r uses device r % count).
 *   No device, or no driver, is a clean init failure: "no CUDA device: cudaGetDeviceCount:
 *   <CUDA's error string>".
 * Precision: fp32 products through cublasGemmEx with CUBLAS_COMPUTE_32F (TF32 only with
 *   --backend-opt tf32=1, alias PIPELM_CUDA_TF32=1: CUBLAS_COMPUTE_32F_FAST_TF32); bf16: both
 *   inputs of every product (matmuls and the four attention products) converted on the GPU from
 *   the fp32 tensors, round to nearest even with denormals flushed to zero (backend_math.h's
 *   f32_to_bf16, as backend_onednn's conversion), fp32
 *   accumulation (CUBLAS_COMPUTE_32F) and fp32 output. Softmax, LayerNorm, loss, AdamW: fp32.
 * Memory: cudaMalloc, zero-filled; map/unmap stage through pinned host buffers kept in a small
 *   pool (an unmap(WRITE) copies host -> device on the stream and records an event that a later
 *   map of the same buffer waits for). to_host/from_host/map(READ)/sumsq synchronise the stream;
 *   copy/zero and every op are queued on it (stream order), so a failure of a queued kernel is
 *   reported by the next synchronising call, synchronize among them (--backend-opt sync=1,
 *   alias PIPELM_CUDA_SYNC=1, synchronises after every op).
 * Determinism (same bits run after run on the same GPU type; no atomics anywhere):
 *   - products: cuBLAS on one stream with its default CUBLAS_ATOMICS_NOT_ALLOWED;
 *   - row reductions (LayerNorm, softmax, cross-entropy): one block per row, a fixed block size,
 *     per-thread strided sums then a fixed shuffle tree;
 *   - column sums over rows (LayerNorm dw/db, matmul db): fixed chunks of CS_ROWS rows summed in
 *     a fixed order into partials, then the partials of each column in CS_TY strided lanes,
 *     the lanes added in order;
 *   - fused attention (flash=1): one query (or key) row per thread, keys (queries) visited in
 *     increasing order in fixed tiles, each sum in a fixed order;
 *   - embedding gradient: dwpe per (t, c) adds rows t, t+T, ... in order; dwte sorts the token
 *     ids with their row numbers (CUB's radix sort: stable, so the result is unique), then one
 *     block per distinct token adds its rows in increasing row order, as backend_cpu does
 *     (bit-identical to it);
 *   - Llama ops: RMSNorm as LayerNorm (a block per row; dw through the same fixed-chunk column
 *     sums); grouped-query attention repeats each kv head for its query heads, runs the
 *     multi-head products, and sums each kv head's dk, dv over its query heads in ascending h
 *     in one kernel (no atomics); RoPE and SwiGLU are elementwise;
 *   - sum of squares: chunks of 16384 values in double (fixed per-thread order, fixed tree),
 *     then the chunk sums in one block in a fixed order; no launch parameter depends on the
 *     device (SM count) or the timing.
 * Error text: every CUDA and cuBLAS call is checked; error() names the op, its shape, the call
 *   and CUDA's / cuBLAS's own string.
 * Not thread-safe: one caller thread per process, as every backend here.
 * Host code of this file sees only plain C headers (backend.h): no MPI.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifndef PIPELM_CUDA_EMU
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cub/device/device_radix_sort.cuh>
/* A kernel launch on the backend's stream. */
#define LAUNCH(kern, grid, block, ...) kern<<<(grid), (block), 0, S.st>>>(__VA_ARGS__)
#endif
#include "pipelm/backend.h"
#include "pipelm/backend_math.h"
#include "pipelm/backend_cuda_opts.h"

/* pipelm/common.h's status codes (that header includes mpi.h, which must stay out of nvcc's
 * view); tests/unit/test_cuda.c checks that they agree. */
enum { CU_EINVAL = 1, CU_ENOMEM = 3, CU_EBACKEND = 11 };

#define LN_EPS 1e-5f
#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define SUMSQ_CHUNK 16384              /* values per partial sum of sumsq (as backend_cpu) */
#define CS_ROWS 64                     /* rows per partial of the column sums */
#define CS_TY 8                        /* row lanes per column in the column-sum blocks */
#define EW_THREADS 256                 /* elementwise kernels */
#define LN_THREADS 256                 /* LayerNorm: one block per row */
#define SM_THREADS 128                 /* causal softmax: one block per row */
#define CE_THREADS 512                 /* cross-entropy: one block per row */
#define SQ_THREADS 256                 /* sum of squares */
#define POOL_MAX_BYTES ((size_t)1 << 30) /* pinned staging kept for reuse, at most */

/* ======================================================================================== */
/* device code                                                                              */
/* ======================================================================================== */

/* exp_fast, tanh_fast and the bf16 rounding are backend_math.h's, shared with backend_cpu and
 * backend_onednn (the same bits where the order of operations is the same). */
__device__ __forceinline__ void store_cvt(float *d, float v) { *d = v; }
__device__ __forceinline__ void store_cvt(uint16_t *d, float v) { *d = f32_to_bf16(v); }

/* Sums over a warp and over a block (blockDim.x a multiple of 32, every thread calling): a
 * fixed shuffle tree, so the result depends only on the values and the block size. sh: 32
 * slots of shared memory; safe to call repeatedly with the same sh. */
template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}
template <typename T> __device__ T block_sum(T v, T *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* the previous call's readers of sh[0] are done */
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        T r = lane < nw ? sh[lane] : (T)0;
        r = warp_sum(r);
        if (lane == 0) sh[0] = r;
    }
    __syncthreads();
    return sh[0];
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_down_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}
__device__ float block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        float r = lane < nw ? sh[lane] : sh[0];
        r = warp_max(r);
        if (lane == 0) sh[0] = r;
    }
    __syncthreads();
    return sh[0];
}

#define GRID_STRIDE(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

__global__ void k_cvt_bf16(uint16_t *dst, const float *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = f32_to_bf16(src[i]);
}

/* out(N,OC) = b broadcast, or 0 (a product with C = 0). */
__global__ void k_fill_bias(float *out, const float *b, size_t n, int OC) {
    GRID_STRIDE(i, n) out[i] = b ? b[i % (size_t)OC] : 0.0f;
}
__global__ void k_add_bias(float *out, const float *b, size_t n, int OC) {
    GRID_STRIDE(i, n) out[i] += b[i % (size_t)OC];
}

__global__ void k_encoder_fwd(float *out, const int *tok, const float *wte, const float *wpe, int N, int T, int C) {
    size_t n = (size_t)N * C;
    GRID_STRIDE(i, n) {
        size_t r = i / C, c = i % C;
        out[i] = wte[(size_t)tok[r] * C + c] + wpe[(r % T) * C + c];
    }
}

/* dwpe(t, c) += dout rows t, t+T, t+2T, ... in that order (backend_cpu's order). */
__global__ void k_encoder_bwd_wpe(float *dwpe, const float *dout, int N, int T, int C) {
    size_t n = (size_t)T * C;
    GRID_STRIDE(i, n) {
        size_t t = i / C, c = i % C;
        float acc = dwpe[i];
        for (size_t r = t; r < (size_t)N; r += T) acc += dout[r * C + c];
        dwpe[i] = acc;
    }
}

__global__ void k_iota(int *v, int n) {
    GRID_STRIDE(i, (size_t)n) v[i] = (int)i;
}

/* One block per position k of the token ids sorted with their rows (stable): the block at the
 * first position of each distinct id owns that row of dwte and adds the id's rows in increasing
 * row order; the other blocks do nothing. */
__global__ void k_encoder_bwd_wte(float *dwte, const float *dout, const int *keys, const int *rows, int N, int C) {
    int k = blockIdx.x;
    int v = keys[k];
    if (k > 0 && keys[k - 1] == v) return; /* whole block: no barrier below */
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float *dst = dwte + (size_t)v * C + c;
        float acc = *dst;
        for (int j = k; j < N && keys[j] == v; j++) acc += dout[(size_t)rows[j] * C + c];
        *dst = acc;
    }
}

/* One block per row: mean, biased variance (two passes, as backend_cpu), y = xhat * w + b. */
__global__ void k_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                const float *b, int C) {
    __shared__ float sh[32];
    size_t row = blockIdx.x;
    const float *x = inp + row * C;
    float s = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) s += x[c];
    float m = block_sum(s, sh) / (float)C;
    float v = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float d = x[c] - m;
        v += d * d;
    }
    v = block_sum(v, sh) / (float)C;
    float r = 1.0f / sqrtf(v + LN_EPS);
    float *o = out + row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = (x[c] - m) * r * w[c] + b[c];
    if (threadIdx.x == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

/* dx += rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat)), dnorm = w dy; one block per row. */
__global__ void k_layernorm_bwd_input(float *dinp, const float *dout, const float *inp, const float *w,
                                      const float *mean, const float *rstd, int C) {
    __shared__ float sh[32];
    size_t row = blockIdx.x;
    const float *dy = dout + row * C, *x = inp + row * C;
    float m = mean[row], s = rstd[row];
    float a = 0.0f, bs = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float xh = (x[c] - m) * s, dn = w[c] * dy[c];
        a += dn;
        bs += dn * xh;
    }
    a = block_sum(a, sh) / (float)C;
    bs = block_sum(bs, sh) / (float)C;
    float *dx = dinp + row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float xh = (x[c] - m) * s, dn = w[c] * dy[c];
        dx[c] += (dn - a - xh * bs) * s;
    }
}

/* Column sums, step 1: block (p, tile) sums rows [p*CS_ROWS, (p+1)*CS_ROWS) of 32 columns;
 * lane y takes rows r0+y, r0+y+CS_TY, ... in order, then lane 0 adds the CS_TY lanes in order.
 * pdb[p*C + c] = sum dy; with LN also pdw[p*C + c] = sum dy * xhat. blockDim (32, CS_TY). */
template <int LN>
__global__ void k_colsum_part(float *pdw, float *pdb, const float *dout, const float *inp, const float *mean,
                              const float *rstd, int N, int C) {
    __shared__ float sdb[CS_TY][33];
    __shared__ float sdw[CS_TY][33];
    int tx = threadIdx.x, ty = threadIdx.y;
    int c = blockIdx.y * 32 + tx;
    int p = blockIdx.x;
    float adb = 0.0f, adw = 0.0f;
    if (c < C) {
        int r0 = p * CS_ROWS, r1 = r0 + CS_ROWS < N ? r0 + CS_ROWS : N;
        for (int i = r0 + ty; i < r1; i += CS_TY) {
            float dy = dout[(size_t)i * C + c];
            adb += dy;
            if (LN) adw += dy * ((inp[(size_t)i * C + c] - mean[i]) * rstd[i]);
        }
    }
    sdb[ty][tx] = adb;
    sdw[ty][tx] = adw;
    __syncthreads();
    if (ty == 0 && c < C) {
        float s = 0.0f, w = 0.0f;
        for (int k = 0; k < CS_TY; k++) {
            s += sdb[k][tx];
            w += sdw[k][tx];
        }
        pdb[(size_t)p * C + c] = s;
        if (LN) pdw[(size_t)p * C + c] = w;
    }
}
/* Step 2: dst[c] += the sum of the R partials of column c: block (tile) takes 32 columns, lane
 * y adds partials y, y+CS_TY, ... in order, then lane 0 adds the CS_TY lanes in order (so
 * CS_TY times the threads of one per column, and a fixed order). blockDim (32, CS_TY). */
__global__ void k_colsum_final(float *dst, const float *part, int R, int C) {
    __shared__ float sh[CS_TY][33];
    int tx = threadIdx.x, ty = threadIdx.y, c = blockIdx.x * 32 + tx;
    float acc = 0.0f;
    if (c < C)
        for (int p = ty; p < R; p += CS_TY) acc += part[(size_t)p * C + c];
    sh[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && c < C) {
        float s = 0.0f;
        for (int k = 0; k < CS_TY; k++) s += sh[k][tx];
        dst[c] += s;
    }
}

/* dst (B, NH, T, hs) <- src (B, T, *) with row stride ld, head h at column h*hs (src already
 * offset to q, k or v), converted to the product's input type. */
template <typename TT>
__global__ void k_permute(TT *dst, const float *src, int ld, int B, int T, int C, int NH) {
    size_t n = (size_t)B * T * C;
    int hs = C / NH;
    GRID_STRIDE(i, n) {
        size_t bt = i / C;
        int c = (int)(i % C), h = c / hs, d = c % hs;
        size_t b = bt / T, t = bt % T;
        store_cvt(dst + (((b * NH + h) * T + t) * hs + d), src[bt * ld + c]);
    }
}
/* dst (B, T, *) with row stride ld (offset to its column block) <- src (B, NH, T, hs). */
__global__ void k_unpermute(float *dst, int ld, const float *src, int B, int T, int C, int NH) {
    size_t n = (size_t)B * T * C;
    int hs = C / NH;
    GRID_STRIDE(i, n) {
        size_t bt = i / C;
        int c = (int)(i % C), h = c / hs, d = c % hs;
        size_t b = bt / T, t = bt % T;
        dst[bt * ld + c] = src[((b * NH + h) * T + t) * hs + d];
    }
}

/* The first visible key of row t of (sequence, head) pair bh: backend_ops.h's document
 * masking (doc: B*T starts, or NULL: 0). */
__device__ __forceinline__ int doc_at(const int *doc, size_t bh, int NH, int T, int t) {
    return doc ? doc[(bh / NH) * T + t] : 0;
}

/* Causal softmax of one row of att (B*NH*T rows of T) per block, in place; row t keeps columns
 * s..t (s: its document's first, 0 without doc), the rest zeroed. */
__global__ void k_softmax_causal(float *att, int T, const int *doc, int NH) {
    __shared__ float sh[32];
    size_t row = blockIdx.x;
    int t = (int)(row % T), s0 = doc_at(doc, row / T, NH, T, t);
    float *a = att + row * T;
    float mx = a[s0];
    for (int j = s0 + threadIdx.x; j <= t; j += blockDim.x) mx = a[j] > mx ? a[j] : mx;
    mx = block_max(mx, sh);
    float s = 0.0f;
    for (int j = s0 + threadIdx.x; j <= t; j += blockDim.x) {
        float e = exp_fast(a[j] - mx);
        a[j] = e;
        s += e;
    }
    float inv = 1.0f / block_sum(s, sh);
    for (int j = s0 + threadIdx.x; j <= t; j += blockDim.x) a[j] *= inv; /* this thread's own values */
    for (int j = threadIdx.x; j < s0; j += blockDim.x) a[j] = 0.0f;
    for (int j = t + 1 + threadIdx.x; j < T; j += blockDim.x) a[j] = 0.0f;
}
/* dpre = a (datt - sum_j a datt), in place on datt, one row per block; masked columns 0. */
__global__ void k_softmax_causal_bwd(float *datt, const float *att, int T, const int *doc, int NH) {
    __shared__ float sh[32];
    size_t row = blockIdx.x;
    int t = (int)(row % T), s0 = doc_at(doc, row / T, NH, T, t);
    const float *a = att + row * T;
    float *d = datt + row * T;
    float s = 0.0f;
    for (int j = s0 + threadIdx.x; j <= t; j += blockDim.x) s += a[j] * d[j];
    float dot = block_sum(s, sh);
    for (int j = s0 + threadIdx.x; j <= t; j += blockDim.x) d[j] = a[j] * (d[j] - dot);
    for (int j = threadIdx.x; j < s0; j += blockDim.x) d[j] = 0.0f;
    for (int j = t + 1 + threadIdx.x; j < T; j += blockDim.x) d[j] = 0.0f;
}

/* ---- fused causal attention (flash-attention style), on permuted (BH, T, hs) q, k, v ----
 * No T x T buffer: a block of FA_Q threads takes FA_Q consecutive query rows of one (b, h),
 * one row per thread, and walks the key rows 0..t in tiles of FA_K staged in shared memory,
 * keeping the running max m, the running sum l and the unnormalised output o of its row
 * (online softmax: each tile's scores first, then one rescale of l and o per tile). Keys are
 * visited in increasing order and each sum runs in a fixed order, so the result depends only
 * on the values (no atomics, no dependence on the device). Inputs are TT (fp32, or bf16 for
 * --precision bf16, where the probabilities and the score gradients are also rounded to bf16
 * before their products, as the matrix-product path rounds att and dpre); accumulation fp32.
 * The forward leaves, in the att buffer, the row log-sum-exp lse (BH*T floats) and the
 * permuted output O (BH*T*hs floats) that the backward reads. HSM: a bound on hs (32, 64,
 * 128) sizing the per-thread registers. */
#define FA_Q 64 /* query rows per block (one per thread) */
#define FA_K 32 /* key rows per shared-memory tile */
__device__ __forceinline__ float ld_f32(const float *p) { return *p; }
__device__ __forceinline__ float ld_f32(const uint16_t *p) { return __int_as_float((int)((uint32_t)*p << 16)); }
/* x rounded to bf16 and back when bf (the product's input precision), else x. */
__device__ __forceinline__ float round_as(float x, int bf) {
    if (!bf) return x;
    uint16_t h = f32_to_bf16(x);
    return ld_f32(&h);
}

/* Forward: O, lse for query rows t of pair bh = blockIdx.y. */
template <int HSM, typename TT>
__global__ void k_flash_fwd(float *O, float *lse, const TT *q, const TT *k, const TT *v, int T, int hs,
                            float scale, int bf, const int *doc, int NH) {
    __shared__ float ks[FA_K][HSM + 1], vs[FA_K][HSM + 1];
    size_t base = (size_t)blockIdx.y * T * hs;
    int t0 = blockIdx.x * FA_Q, t = t0 + threadIdx.x, tl = t0 + FA_Q - 1 < T - 1 ? t0 + FA_Q - 1 : T - 1;
    float qr[HSM], o[HSM], m = -1e30f, l = 0.0f;
#pragma unroll
    for (int d = 0; d < HSM; d++) {
        qr[d] = t < T && d < hs ? ld_f32(q + base + (size_t)t * hs + d) : 0.0f;
        o[d] = 0.0f;
    }
    /* document masking: the key tiles before the block's first row's document are masked for
     * every row of the block (starts do not decrease along a sequence): skipped */
    int lo = t < T ? doc_at(doc, blockIdx.y, NH, T, t) : 0;
    for (int j0 = doc_at(doc, blockIdx.y, NH, T, t0) / FA_K * FA_K; j0 <= tl; j0 += FA_K) {
        for (int e = threadIdx.x; e < FA_K * hs; e += blockDim.x) {
            int jj = e / hs, d = e % hs, j = j0 + jj;
            ks[jj][d] = j < T ? ld_f32(k + base + (size_t)j * hs + d) : 0.0f;
            vs[jj][d] = j < T ? ld_f32(v + base + (size_t)j * hs + d) : 0.0f;
        }
        __syncthreads();
        int n = t - j0 + 1 < FA_K ? t - j0 + 1 : FA_K, j1 = lo - j0 > 0 ? lo - j0 : 0;
        if (t < T && j0 <= t && j1 < n) {
            float s[FA_K], mt = m;
            for (int jj = j1; jj < n; jj++) {
                float acc = 0.0f;
#pragma unroll
                for (int d = 0; d < HSM; d++) acc += d < hs ? qr[d] * ks[jj][d] : 0.0f;
                s[jj] = acc * scale;
                mt = s[jj] > mt ? s[jj] : mt;
            }
            float corr = exp_fast(m - mt);
            l *= corr;
#pragma unroll
            for (int d = 0; d < HSM; d++) o[d] *= corr;
            for (int jj = j1; jj < n; jj++) {
                float p = exp_fast(s[jj] - mt);
                l += p;
                p = round_as(p, bf);
#pragma unroll
                for (int d = 0; d < HSM; d++) o[d] += d < hs ? p * vs[jj][d] : 0.0f;
            }
            m = mt;
        }
        __syncthreads();
    }
    if (t < T) {
        float inv = 1.0f / l;
        for (int d = 0; d < hs; d++) O[base + (size_t)t * hs + d] = o[d] * inv;
        lse[(size_t)blockIdx.y * T + t] = m + logf(l);
    }
}

/* Backward, step 1: Dr[row] = dy_row . O_row (= sum_j p_j dp_j), one thread per row. */
template <typename TT>
__global__ void k_flash_rowdot(float *Dr, const TT *dy, const float *O, size_t rows, int hs) {
    GRID_STRIDE(r, rows) {
        float acc = 0.0f;
        for (int d = 0; d < hs; d++) acc += ld_f32(dy + r * hs + d) * O[r * hs + d];
        Dr[r] = acc;
    }
}

/* Backward, step 2: dq_t = scale sum_{j<=t} ds_tj k_j, ds_tj = p_tj (dy_t . v_j - Dr_t), p_tj =
 * exp(scale q_t . k_j - lse_t); one query row per thread, key tiles in shared memory. */
template <int HSM, typename TT>
__global__ void k_flash_bwd_dq(float *dq, const TT *q, const TT *k, const TT *v, const TT *dy, const float *lse,
                               const float *Dr, int T, int hs, float scale, int bf, const int *doc, int NH) {
    __shared__ float ks[FA_K][HSM + 1], vs[FA_K][HSM + 1];
    size_t base = (size_t)blockIdx.y * T * hs, row = (size_t)blockIdx.y * T;
    int t0 = blockIdx.x * FA_Q, t = t0 + threadIdx.x, tl = t0 + FA_Q - 1 < T - 1 ? t0 + FA_Q - 1 : T - 1;
    float qr[HSM], dyr[HSM], acc[HSM];
#pragma unroll
    for (int d = 0; d < HSM; d++) {
        qr[d] = t < T && d < hs ? ld_f32(q + base + (size_t)t * hs + d) : 0.0f;
        dyr[d] = t < T && d < hs ? ld_f32(dy + base + (size_t)t * hs + d) : 0.0f;
        acc[d] = 0.0f;
    }
    float L = t < T ? lse[row + t] : 0.0f, D = t < T ? Dr[row + t] : 0.0f;
    int lo = t < T ? doc_at(doc, blockIdx.y, NH, T, t) : 0;
    for (int j0 = doc_at(doc, blockIdx.y, NH, T, t0) / FA_K * FA_K; j0 <= tl; j0 += FA_K) {
        for (int e = threadIdx.x; e < FA_K * hs; e += blockDim.x) {
            int jj = e / hs, d = e % hs, j = j0 + jj;
            ks[jj][d] = j < T ? ld_f32(k + base + (size_t)j * hs + d) : 0.0f;
            vs[jj][d] = j < T ? ld_f32(v + base + (size_t)j * hs + d) : 0.0f;
        }
        __syncthreads();
        int n = t < T ? (t - j0 + 1 < FA_K ? t - j0 + 1 : FA_K) : 0;
        for (int jj = lo - j0 > 0 ? lo - j0 : 0; jj < n; jj++) {
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int d = 0; d < HSM; d++) {
                s += d < hs ? qr[d] * ks[jj][d] : 0.0f;
                dp += d < hs ? dyr[d] * vs[jj][d] : 0.0f;
            }
            float p = exp_fast(s * scale - L), ds = round_as(p * (dp - D), bf);
#pragma unroll
            for (int d = 0; d < HSM; d++) acc[d] += d < hs ? ds * ks[jj][d] : 0.0f;
        }
        __syncthreads();
    }
    if (t < T)
        for (int d = 0; d < hs; d++) dq[base + (size_t)t * hs + d] = acc[d] * scale;
}

/* Backward, step 3: for key row j (one per thread), dv_j = sum_{t>=j} p_tj dy_t and dk_j =
 * scale sum_{t>=j} ds_tj q_t, over query tiles (q, dy, lse, Dr) staged in shared memory. */
template <int HSM, typename TT>
__global__ void k_flash_bwd_dkdv(float *dk, float *dv, const TT *q, const TT *k, const TT *v, const TT *dy,
                                 const float *lse, const float *Dr, int T, int hs, float scale, int bf,
                                 const int *doc, int NH) {
    __shared__ float qs[FA_K][HSM + 1], dys[FA_K][HSM + 1], Ls[FA_K], Ds[FA_K];
    size_t base = (size_t)blockIdx.y * T * hs, row = (size_t)blockIdx.y * T;
    int j = blockIdx.x * FA_Q + threadIdx.x, jf = blockIdx.x * FA_Q;
    float kr[HSM], vr[HSM], ak[HSM], av[HSM];
#pragma unroll
    for (int d = 0; d < HSM; d++) {
        kr[d] = j < T && d < hs ? ld_f32(k + base + (size_t)j * hs + d) : 0.0f;
        vr[d] = j < T && d < hs ? ld_f32(v + base + (size_t)j * hs + d) : 0.0f;
        ak[d] = av[d] = 0.0f;
    }
    int jl = jf + FA_Q - 1; /* the block's last key row */
    for (int i0 = jf - jf % FA_K; i0 < T; i0 += FA_K) {
        /* document masking: from the first query tile whose document starts past every key
         * row of the block, nothing is visible (starts do not decrease): stop */
        if (doc_at(doc, blockIdx.y, NH, T, i0) > jl) break;
        for (int e = threadIdx.x; e < FA_K * hs; e += blockDim.x) {
            int ii = e / hs, d = e % hs, i = i0 + ii;
            qs[ii][d] = i < T ? ld_f32(q + base + (size_t)i * hs + d) : 0.0f;
            dys[ii][d] = i < T ? ld_f32(dy + base + (size_t)i * hs + d) : 0.0f;
        }
        for (int ii = threadIdx.x; ii < FA_K; ii += blockDim.x) {
            Ls[ii] = i0 + ii < T ? lse[row + i0 + ii] : 0.0f;
            Ds[ii] = i0 + ii < T ? Dr[row + i0 + ii] : 0.0f;
        }
        __syncthreads();
        for (int ii = 0; ii < FA_K && j < T; ii++) {
            int i = i0 + ii;
            if (i < j || i >= T || doc_at(doc, blockIdx.y, NH, T, i) > j) continue;
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int d = 0; d < HSM; d++) {
                s += d < hs ? qs[ii][d] * kr[d] : 0.0f;
                dp += d < hs ? dys[ii][d] * vr[d] : 0.0f;
            }
            float p = exp_fast(s * scale - Ls[ii]), ds = round_as(p * (dp - Ds[ii]), bf), pr = round_as(p, bf);
#pragma unroll
            for (int d = 0; d < HSM; d++) {
                av[d] += d < hs ? pr * dys[ii][d] : 0.0f;
                ak[d] += d < hs ? ds * qs[ii][d] : 0.0f;
            }
        }
        __syncthreads();
    }
    if (j < T)
        for (int d = 0; d < hs; d++) {
            dk[base + (size_t)j * hs + d] = ak[d] * scale;
            dv[base + (size_t)j * hs + d] = av[d];
        }
}

__global__ void k_gelu_fwd(float *out, const float *inp, size_t n) {
    GRID_STRIDE(i, n) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanh_fast(u));
    }
}
/* dinp may alias dout: each element read before it is written, by the same thread. */
__global__ void k_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n) {
    GRID_STRIDE(i, n) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = tanh_fast(u);
        float sech2 = 1.0f - th * th;
        float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = g * dout[i];
    }
}
__global__ void k_residual(float *out, const float *a, const float *b, size_t n) {
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}
__global__ void k_add_inplace(float *dst, const float *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] += src[i];
}
__global__ void k_scale(float *x, float s, size_t n) {
    GRID_STRIDE(i, n) x[i] *= s;
}
/* c1, c2: the bias corrections 1 - b^t, computed on the host as backend_cpu does. Every product
 * and sum rounded on its own (no fused multiply-add), in backend_cpu's order: the same formula
 * operation by operation (division and sqrtf are IEEE-rounded without --use_fast_math). */
__global__ void k_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2,
                        float eps, float wd, float c1, float c2) {
    GRID_STRIDE(i, n) {
        float gi = g[i];
        float mi = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(1.0f - b1, gi));
        float vi = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(__fmul_rn(1.0f - b2, gi), gi));
        m[i] = mi;
        v[i] = vi;
        float mh = mi / c1, vh = vi / c2;
        float pi = p[i];
        float upd = __fadd_rn(mh / (sqrtf(vh) + eps), __fmul_rn(wd, pi));
        p[i] = __fsub_rn(pi, __fmul_rn(lr, upd));
    }
}

/* Softmax over the first V of Vp columns of one row per block, in place; padded columns 0;
 * losses[row] = -log p[target] (NaN for a target outside [0, V)). */
__global__ void k_ce_fwd(float *losses, float *logits, const int *targets, int V, int Vp) {
    __shared__ float sh[32];
    size_t row = blockIdx.x;
    float *r = logits + row * Vp;
    float mx = r[0];
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = r[j] > mx ? r[j] : mx;
    mx = block_max(mx, sh);
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float e = exp_fast(r[j] - mx);
        r[j] = e;
        s += e;
    }
    float inv = 1.0f / block_sum(s, sh);
    for (int j = threadIdx.x; j < V; j += blockDim.x) r[j] *= inv;
    for (int j = V + threadIdx.x; j < Vp; j += blockDim.x) r[j] = 0.0f;
    __syncthreads(); /* r[target] was written by some thread of this block */
    if (threadIdx.x == 0) {
        int tg = targets[row];
        losses[row] = tg >= 0 && tg < V ? -logf(r[tg]) : __int_as_float(0x7fc00000);
    }
}
/* probs -> (probs - onehot) * dloss over the first V columns; padded columns untouched (0). The
 * product is rounded before the subtraction, as backend_cpu's two statements. */
__global__ void k_ce_bwd(float *probs, const int *targets, float dloss, int N, int V, int Vp) {
    /* a 2-D grid: x over the columns, y over the rows (strided past 65535), so no division */
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= V) return;
    for (size_t row = blockIdx.y; row < (size_t)N; row += gridDim.y) {
        float *r = probs + row * Vp;
        float g = __fmul_rn(r[j], dloss);
        if (j == targets[row]) g -= dloss;
        r[j] = g;
    }
}

/* Sum of squares, step 1: block k sums values [k*SUMSQ_CHUNK, ...) in double. */
__global__ void k_sumsq_part(double *part, const float *x, size_t n) {
    __shared__ double sh[32];
    size_t i0 = (size_t)blockIdx.x * SUMSQ_CHUNK;
    size_t i1 = i0 + SUMSQ_CHUNK < n ? i0 + SUMSQ_CHUNK : n;
    double s = 0.0;
    for (size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) s += (double)x[i] * (double)x[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}
/* Step 2, one block: thread j adds partials j, j+blockDim, ... in order, then the tree. */
__global__ void k_sumsq_final(double *out, const double *part, size_t nchunk) {
    __shared__ double sh[32];
    double s = 0.0;
    for (size_t k = threadIdx.x; k < nchunk; k += blockDim.x) s += part[k];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) *out = s;
}

/* ---- Llama ops ---- */

/* RMSNorm, one block per row: rstd = 1/sqrt(mean(x^2) + eps), y = x rstd w. */
__global__ void k_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int C, float eps) {
    __shared__ float sh[32];
    size_t row = blockIdx.x;
    const float *x = inp + row * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) ss += x[c] * x[c];
    float r = 1.0f / sqrtf(block_sum(ss, sh) / (float)C + eps);
    float *o = out + row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = x[c] * r * w[c];
    if (threadIdx.x == 0) rstd[row] = r;
}

/* dx += rstd (dn - x rstd^2 mean(dn x)), dn = w dy; one block per row. */
__global__ void k_rmsnorm_bwd_input(float *dinp, const float *dout, const float *inp, const float *w,
                                    const float *rstd, int C) {
    __shared__ float sh[32];
    size_t row = blockIdx.x;
    const float *dy = dout + row * C, *x = inp + row * C;
    float s = rstd[row];
    float a = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) a += w[c] * dy[c] * x[c];
    a = block_sum(a, sh) / (float)C * s * s;
    float *dx = dinp + row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dx[c] += (w[c] * dy[c] - x[c] * a) * s;
}

/* The RMSNorm weight gradient's column-sum partials, as k_colsum_part: block (p, tile) sums
 * dy x rstd over rows [p*CS_ROWS, (p+1)*CS_ROWS) of 32 columns, lanes in a fixed order;
 * k_colsum_final then adds the partials in chunk order. blockDim (32, CS_TY). */
__global__ void k_rms_colsum_part(float *pdw, const float *dout, const float *inp, const float *rstd, int N, int C) {
    __shared__ float sdw[CS_TY][33];
    int tx = threadIdx.x, ty = threadIdx.y;
    int c = blockIdx.y * 32 + tx;
    int p = blockIdx.x;
    float adw = 0.0f;
    if (c < C) {
        int r0 = p * CS_ROWS, r1 = r0 + CS_ROWS < N ? r0 + CS_ROWS : N;
        for (int i = r0 + ty; i < r1; i += CS_TY) adw += dout[(size_t)i * C + c] * (inp[(size_t)i * C + c] * rstd[i]);
    }
    sdw[ty][tx] = adw;
    __syncthreads();
    if (ty == 0 && c < C) {
        float w = 0.0f;
        for (int k = 0; k < CS_TY; k++) w += sdw[k][tx];
        pdw[(size_t)p * C + c] = w;
    }
}

/* RoPE on the pairs of a fused row (N, W), W = (NH + 2 NKV) HS: the first nrot = (NH + NKV) HS
 * columns (q and k heads) are rotated by theta_{t,i}, t = row % T, i = pair within the head;
 * dir = -1 is the inverse rotation (the backward); v is copied. */
__global__ void k_rope(float *out, const float *inp, const float *fcos, const float *fsin, int N, int T, int W,
                       int nrot, int HS, float dir) {
    size_t np = (size_t)N * (W / 2);
    GRID_STRIDE(k, np) {
        size_t r = k / (W / 2);
        int j = (int)(k % (W / 2)) * 2;
        const float *x = inp + r * W + j;
        float *o = out + r * W + j;
        float x0 = x[0], x1 = x[1];
        if (j < nrot) {
            size_t ti = (r % T) * (HS / 2) + (j % HS) / 2;
            float c = fcos[ti], s = dir * fsin[ti];
            o[0] = x0 * c - x1 * s;
            o[1] = x0 * s + x1 * c;
        } else {
            o[0] = x0;
            o[1] = x1;
        }
    }
}

/* dst (B, NHd, T, hs) <- src (B, T, *) with row stride ld, destination head h reading source
 * head h / G at column (h / G) hs (src offset to k or v): the kv heads repeated for their query
 * heads. G = 1 is k_permute. */
template <typename TT>
__global__ void k_permute_rep(TT *dst, const float *src, int ld, int B, int T, int NHd, int G, int hs) {
    size_t C = (size_t)NHd * hs, n = (size_t)B * T * C;
    GRID_STRIDE(i, n) {
        size_t bt = i / C;
        int c = (int)(i % C), h = c / hs, d = c % hs;
        size_t b = bt / T, t = bt % T;
        store_cvt(dst + (((b * NHd + h) * T + t) * hs + d), src[bt * ld + (size_t)(h / G) * hs + d]);
    }
}
/* dst (B, T, *) with row stride ld (offset to the k or v block) <- the sum over the G query
 * heads j = 0..G-1 of kv head g of src (B, NH, T, hs), j ascending (G = 1: a copy). */
__global__ void k_unpermute_sum(float *dst, int ld, const float *src, int B, int T, int NKV, int G, int hs) {
    size_t C = (size_t)NKV * hs, n = (size_t)B * T * C;
    int NH = NKV * G;
    GRID_STRIDE(i, n) {
        size_t bt = i / C;
        int c = (int)(i % C), g = c / hs, d = c % hs;
        size_t b = bt / T, t = bt % T;
        const float *p = src + ((b * NH + (size_t)g * G) * T + t) * hs + d;
        float acc = p[0];
        for (int j = 1; j < G; j++) acc += p[(size_t)j * T * hs];
        dst[bt * ld + c] = acc;
    }
}

/* SwiGLU: out = up silu(gate), silu(g) = g / (1 + exp(-g)). */
__global__ void k_swiglu_fwd(float *out, const float *up, const float *gate, size_t n) {
    GRID_STRIDE(i, n) {
        float g = gate[i];
        out[i] = up[i] * (g / (1.0f + exp_fast(-g)));
    }
}
/* dup = dout silu(g), dgate = dout up sigma(g) (1 + g (1 - sigma(g))); inputs read first. */
__global__ void k_swiglu_bwd(float *dup, float *dgate, const float *dout, const float *up, const float *gate,
                             size_t n) {
    GRID_STRIDE(i, n) {
        float g = gate[i], u = up[i], d = dout[i];
        float sg = 1.0f / (1.0f + exp_fast(-g));
        dup[i] = d * (g * sg);
        dgate[i] = d * u * (sg * (1.0f + g * (1.0f - sg)));
    }
}

/* ---- mixture of experts (backend_ops.h moe_*): one thread per output float / per dot ---- */
__global__ void k_moe_gather(float *out, const float *x, const int *rows, const float *scale, int M, int C) {
    GRID_STRIDE(i, (size_t)M * C) {
        size_t r = i / (size_t)C, c = i % (size_t)C;
        float v = x[(size_t)rows[r] * C + c];
        out[i] = scale ? scale[r] * v : v;
    }
}
/* each output float sums its K terms in k order, as the CPU does */
__global__ void k_moe_combine(float *out, const float *y, const int *slot, const float *w, int N, int K, int C) {
    GRID_STRIDE(i, (size_t)N * C) {
        size_t t = i / (size_t)C, c = i % (size_t)C;
        float o = out[i];
        for (int k = 0; k < K; k++) {
            int j = slot[t * K + k];
            if (j >= 0) o += (w ? w[t * K + k] : 1.0f) * y[(size_t)j * C + c];
        }
        out[i] = o;
    }
}
/* one thread per (token, k): a sequential double dot over C (small N K; not a hot op) */
__global__ void k_moe_rowdot(float *dw, const float *dout, const float *y, const int *slot, int N, int K, int C) {
    GRID_STRIDE(i, (size_t)N * K) {
        int j = slot[i];
        double acc = 0.0;
        const float *d = dout + (i / (size_t)K) * C;
        for (int c = 0; j >= 0 && c < C; c++) acc += (double)d[c] * (double)y[(size_t)j * C + c];
        dw[i] = (float)acc;
    }
}

/* ======================================================================================== */
/* host side: state, errors                                                                 */
/* ======================================================================================== */

/* Scratch slots (device memory grown on demand, freed by finalize). */
enum {
    SCR_A, SCR_B,                      /* bf16 inputs of a matmul */
    SCR_Q, SCR_K, SCR_V, SCR_DY,       /* attention: permuted q, k, v, dout (fp32 or bf16) */
    SCR_ATT_T,                         /* attention: att, then dpre, in bf16 */
    SCR_DATT,                          /* attention backward: datt -> dpre (fp32) */
    SCR_Y, SCR_DK, SCR_DV,             /* attention: permuted fp32 results */
    SCR_PART,                          /* column-sum partials */
    SCR_SUMSQ,                         /* sum-of-squares partials */
    SCR_SORT, SCR_KEYS, SCR_ROWS_IN, SCR_ROWS_OUT, /* embedding backward */
    SCR_COPY,                          /* an overlapping copy */
    NSCR
};

typedef struct {
    void *h;          /* pinned host buffer */
    size_t cap;
    int busy;         /* handed out by map, not yet unmapped */
    int pending;      /* ev recorded after a host -> device copy from it */
    cudaEvent_t ev;
} pinned_buf;

static struct {
    int inited;
    int dev, ndev, local_rank, local_size, shared;
    int prec;
    int tf32;
    int sync_each;
    int flash;                         /* 1: the fused attention kernels where they fit */
    int threads;
    cudaStream_t st;
    cublasHandle_t blas;
    cudaDeviceProp prop;
    double *hd;                        /* pinned double for sumsq */
    void *scr[NSCR];
    size_t scr_bytes[NSCR];
    pinned_buf *pool;
    int npool, cappool;
    size_t pool_bytes;
} S;

/* What the current call is (for messages): op name and its shape, formatted only on failure. */
static struct {
    const char *op;
    const char *fmt;
    long long a, b, c, d;
} ctx;

static char cu_errbuf[1024];
static const char *cu_error(void) { return cu_errbuf; }

static int cu_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cu_fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cu_errbuf, sizeof cu_errbuf, fmt, ap);
    va_end(ap);
    return code;
}

/* "op (shape, precision)" of the current call. */
static void ctx_text(char *buf, size_t len) {
    char shape[160] = "";
    if (ctx.fmt) {
        /* ctx.fmt is one of this file's literal formats of %lld conversions */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        snprintf(shape, sizeof shape, ctx.fmt, ctx.a, ctx.b, ctx.c, ctx.d);
#pragma GCC diagnostic pop
    }
    snprintf(buf, len, "%s (%s%s%s)", ctx.op ? ctx.op : "?", shape, shape[0] ? ", " : "",
             S.prec == PL_PREC_BF16 ? "bf16" : S.tf32 ? "fp32, tf32" : "fp32");
}

static int fail_cuda(cudaError_t e, const char *call) {
    char where[256];
    ctx_text(where, sizeof where);
    (void)cudaGetLastError(); /* clear a non-sticky error */
    return cu_fail(e == cudaErrorMemoryAllocation ? CU_ENOMEM : CU_EBACKEND, "cuda backend: %s: %s: %s (%s)",
                   where, call, cudaGetErrorString(e), cudaGetErrorName(e));
}
static int fail_blas(cublasStatus_t s, const char *call) {
    char where[256];
    ctx_text(where, sizeof where);
    return cu_fail(s == CUBLAS_STATUS_ALLOC_FAILED ? CU_ENOMEM : CU_EBACKEND, "cuda backend: %s: %s: %s (status %d)",
                   where, call, cublasGetStatusString(s), (int)s);
}
static int fail_shape(void) {
    char where[256];
    ctx_text(where, sizeof where);
    return cu_fail(CU_EBACKEND, "cuda backend: %s: invalid shape", where);
}

#define CU_TRY(call)                                              \
    do {                                                          \
        cudaError_t cu_e_ = (call);                               \
        if (cu_e_ != cudaSuccess) return fail_cuda(cu_e_, #call); \
    } while (0)
#define BLAS_TRY(call)                                                      \
    do {                                                                    \
        cublasStatus_t cu_s_ = (call);                                      \
        if (cu_s_ != CUBLAS_STATUS_SUCCESS) return fail_blas(cu_s_, #call); \
    } while (0)
#define TRY(call)                      \
    do {                               \
        int cu_rc_ = (call);           \
        if (cu_rc_) return cu_rc_;     \
    } while (0)

/* Start of every entry point: initialised, and what it is for messages. */
#define OP(name, f, x0, x1, x2, x3)                                                          \
    do {                                                                                     \
        ctx.op = (name);                                                                     \
        ctx.fmt = (f);                                                                       \
        ctx.a = (long long)(x0);                                                             \
        ctx.b = (long long)(x1);                                                             \
        ctx.c = (long long)(x2);                                                             \
        ctx.d = (long long)(x3);                                                             \
        if (!S.inited) return cu_fail(CU_EBACKEND, "cuda backend: %s before init", (name)); \
    } while (0)

/* After a launch: the launch's own error; with the sync option also the kernel's. */
static int launched(const char *kern) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return fail_cuda(e, kern);
    if (S.sync_each) {
        e = cudaStreamSynchronize(S.st);
        if (e != cudaSuccess) return fail_cuda(e, kern);
    }
    return 0;
}
#define KERNEL(kern, grid, block, ...)             \
    do {                                           \
        LAUNCH(kern, grid, block, __VA_ARGS__);    \
        TRY(launched(#kern));                      \
    } while (0)

/* Blocks for n elements of a grid-stride kernel (n > 0). */
static unsigned ew_grid(size_t n) {
    size_t g = (n + EW_THREADS - 1) / EW_THREADS;
    return (unsigned)(g > ((size_t)1 << 20) ? ((size_t)1 << 20) : g);
}

/* Scratch slot k of at least bytes. */
static int scratch(int k, size_t bytes, void **p) {
    if (bytes == 0) bytes = 256;
    if (S.scr_bytes[k] < bytes) {
        if (S.scr[k]) CU_TRY(cudaFree(S.scr[k])); /* synchronises: no queued user left */
        S.scr[k] = NULL;
        S.scr_bytes[k] = 0;
        size_t r = (bytes + 255) / 256 * 256;
        cudaError_t e = cudaMalloc(&S.scr[k], r);
        if (e != cudaSuccess) {
            S.scr[k] = NULL;
            char where[256];
            ctx_text(where, sizeof where);
            (void)cudaGetLastError();
            return cu_fail(e == cudaErrorMemoryAllocation ? CU_ENOMEM : CU_EBACKEND,
                           "cuda backend: %s: cudaMalloc of %zu bytes of scratch: %s (%s)", where, r,
                           cudaGetErrorString(e), cudaGetErrorName(e));
        }
        S.scr_bytes[k] = r;
    }
    *p = S.scr[k];
    return 0;
}

/* ======================================================================================== */
/* init, finalize, describe, threads                                                        */
/* ======================================================================================== */

/* A non-negative integer environment variable (a launcher's): 1 and *v, or 0 when unset or
 * malformed. */
static int env_int(const char *name, int *v) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end = NULL;
    long x = strtol(s, &end, 10);
    if (*end || x < 0 || x > 1 << 20) return 0;
    *v = (int)x;
    return 1;
}

/* The node-local rank and size the launcher exported (-1 when unknown), and from where. */
static const char *local_rank_of_env(int *lr, int *ls) {
    static const char *const rank_vars[] = {"MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK",
                                            "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"};
    static const char *const size_vars[] = {"MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                            "MV2_COMM_WORLD_LOCAL_SIZE", NULL};
    *lr = -1;
    *ls = -1;
    for (int i = 0; i < 4; i++)
        if (env_int(rank_vars[i], lr)) {
            if (size_vars[i]) env_int(size_vars[i], ls);
            return rank_vars[i];
        }
    return NULL;
}

static void pool_release_all(void) {
    for (int i = 0; i < S.npool; i++) {
        if (S.pool[i].pending) cudaEventSynchronize(S.pool[i].ev);
        cudaEventDestroy(S.pool[i].ev);
        cudaFreeHost(S.pool[i].h);
    }
    free(S.pool);
    S.pool = NULL;
    S.npool = S.cappool = 0;
    S.pool_bytes = 0;
}

static void cu_finalize(void) {
    if (!S.inited) return;
    cudaStreamSynchronize(S.st);
    for (int k = 0; k < NSCR; k++) {
        if (S.scr[k]) cudaFree(S.scr[k]);
        S.scr[k] = NULL;
        S.scr_bytes[k] = 0;
    }
    pool_release_all();
    if (S.hd) cudaFreeHost(S.hd);
    S.hd = NULL;
    cublasDestroy(S.blas);
    cudaStreamDestroy(S.st);
    S.inited = 0;
}

/* The settings of this backend (--backend-opt): backend_cuda_opts.h's, which the loader
 * (backend_cuda_load.c) declares too before this file is loaded. */
#define cu_opts backend_cuda_opts

/* The device count, or a clean refusal: no driver, no device. */
static int cu_count_devices(int *n, char *err, size_t errlen) {
    *n = 0;
    cudaError_t e = cudaGetDeviceCount(n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(err, errlen, "no CUDA device: cudaGetDeviceCount: %s (%s)%s", cudaGetErrorString(e),
                 cudaGetErrorName(e),
                 e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice
                     ? "; no NVIDIA GPU or driver is visible to this process"
                     : "");
        return CU_EINVAL;
    }
    if (*n <= 0) {
        snprintf(err, errlen, "no CUDA device: cudaGetDeviceCount found none");
        return CU_EINVAL;
    }
    return 0;
}

/* This rank's device among n: opt->device, else the local rank (the trainer's, else the
 * launcher's) modulo n, refused when there are more local ranks than devices and share is 0.
 * *lr, *ls: the local rank and size used (-1: unknown). */
static int cu_pick_device(const backend_options *opt, int n, int share, int *dev, int *lr, int *ls, char *err,
                          size_t errlen) {
    const char *from = NULL;
    *lr = 0;
    *ls = -1;
    if (opt && opt->device >= 0) {
        if (opt->device >= n) {
            snprintf(err, errlen, "backend cuda: device %d asked for, but this node has %d CUDA device%s", opt->device,
                     n, n == 1 ? "" : "s");
            return CU_EINVAL;
        }
        *dev = opt->device;
        return 0;
    }
    if (opt && opt->local_ranks > 0) { /* the trainer's MPI_Comm_split_type(SHARED) */
        *lr = opt->local_rank;
        *ls = opt->local_ranks;
        from = "MPI_Comm_split_type";
    } else if (!(from = local_rank_of_env(lr, ls))) {
        *lr = 0;
        from = "no launcher variable: local rank 0";
    }
    int need = *ls > *lr ? *ls : *lr + 1;
    if (need > n && !share) {
        snprintf(err, errlen,
                 "backend cuda: %d rank%s on this node (local rank %d, from %s%s) but %d CUDA device%s: one device "
                 "per rank, or --backend-opt share=1 (PIPELM_CUDA_SHARE=1) to let ranks share devices",
                 need, need == 1 ? "" : "s", *lr, from,
                 *ls >= 0 && !(opt && opt->local_ranks > 0) ? " and its size variable" : "", n, n == 1 ? "" : "s");
        return CU_EINVAL;
    }
    *dev = *lr % n;
    return 0;
}

/* Device dev made current: its properties, the stream, the pinned double of sumsq, the cuBLAS
 * handle on the stream (default math, no atomics). On failure nothing is left allocated. */
static int cu_setup_device(int dev, char *err, size_t errlen) {
    memset(&S.prop, 0, sizeof S.prop);
    cudaError_t e = cudaSetDevice(dev);
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&S.prop, dev);
    if (e == cudaSuccess) e = cudaStreamCreate(&S.st);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(err, errlen, "backend cuda: setting up device %d: %s (%s)", dev, cudaGetErrorString(e),
                 cudaGetErrorName(e));
        return CU_EINVAL;
    }
    e = cudaMallocHost((void **)&S.hd, sizeof(double));
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cudaStreamDestroy(S.st);
        snprintf(err, errlen, "backend cuda: cudaMallocHost on device %d: %s", dev, cudaGetErrorString(e));
        return CU_EINVAL;
    }
    cublasStatus_t s = cublasCreate(&S.blas);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(S.blas, S.st);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetMathMode(S.blas, CUBLAS_DEFAULT_MATH);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetAtomicsMode(S.blas, CUBLAS_ATOMICS_NOT_ALLOWED);
    if (s != CUBLAS_STATUS_SUCCESS) {
        cudaFreeHost(S.hd);
        S.hd = NULL;
        cudaStreamDestroy(S.st);
        snprintf(err, errlen, "backend cuda: cuBLAS on device %d: %s (status %d)", dev, cublasGetStatusString(s),
                 (int)s);
        return CU_EINVAL;
    }
    return 0;
}

/* Device, stream, cuBLAS handle. May be called again (another precision): the device set-up
 * is kept when the device is the same. The settings (share, sync, tf32) are read each time. */
static int cu_init(const backend_options *opt, char *err, size_t errlen) {
    int prec = opt ? opt->precision : PL_PREC_FP32;
    if (prec != PL_PREC_FP32 && prec != PL_PREC_BF16) {
        snprintf(err, errlen, "backend cuda: unknown precision %d (fp32 or bf16)", prec);
        return CU_EINVAL;
    }
    int n = 0, lr = 0, ls = -1, dev = 0, share = backend_opt_flag(cu_opts, opt, "share");
    TRY(cu_count_devices(&n, err, errlen));
    TRY(cu_pick_device(opt, n, share, &dev, &lr, &ls, err, errlen));
    if (S.inited && S.dev != dev) cu_finalize();
    if (!S.inited) {
        TRY(cu_setup_device(dev, err, errlen));
        S.dev = dev;
        S.ndev = n;
        S.local_rank = lr;
        S.local_size = ls;
        S.shared = share && (ls > n || lr >= n);
        S.inited = 1;
    }
    S.prec = prec;
    S.tf32 = backend_opt_flag(cu_opts, opt, "tf32");
    S.sync_each = backend_opt_flag(cu_opts, opt, "sync");
    S.flash = backend_opt_flag(cu_opts, opt, "flash");
    if (opt && opt->threads > 0) S.threads = opt->threads;
    cu_errbuf[0] = 0;
    return 0;
}

static void cu_describe(char *buf, size_t len) {
    if (!S.inited) {
        snprintf(buf, len, "cuda (not initialised)");
        return;
    }
    int rt = 0, drv = 0, bv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    cublasGetVersion(S.blas, &bv);
    snprintf(buf, len,
             "cuda: device %d of %d %s (sm_%d%d, %d SMs, %.1f GiB)%s, CUDA runtime %d.%d driver %d.%d, cuBLAS %d.%d.%d, "
             "precision %s%s",
             S.dev, S.ndev, S.prop.name, S.prop.major, S.prop.minor, S.prop.multiProcessorCount,
             (double)S.prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), S.shared ? " shared" : "", rt / 1000,
             rt % 1000 / 10, drv / 1000, drv % 1000 / 10, bv / 10000, bv / 100 % 100, bv % 100,
             backend_precision_name(S.prec),
             S.prec == PL_PREC_BF16 ? " (bf16 inputs, fp32 accumulation)" : S.tf32 ? " (TF32 allowed)" : "");
}

/* Host threads play no part in this backend: kept for get_threads. */
static int cu_set_threads(int n) {
    S.threads = n < 1 ? 1 : n;
    return 0;
}
static int cu_get_threads(void) { return S.threads > 0 ? S.threads : 1; }

/* ======================================================================================== */
/* memory                                                                                   */
/* ======================================================================================== */

static int cu_alloc(void **p, size_t bytes) {
    *p = NULL;
    if (backend_alloc_should_fail())
        return cu_fail(CU_ENOMEM, "cuda backend: cudaMalloc of %zu bytes failed (injected by PIPELM_FAIL_ALLOC)", bytes);
    OP("alloc", "%lld bytes", bytes, 0, 0, 0);
    if (bytes == 0) bytes = 256;
    if (bytes > SIZE_MAX - 256) return cu_fail(CU_ENOMEM, "cuda backend: allocation of %zu bytes: too large", bytes);
    size_t r = (bytes + 255) / 256 * 256;
    void *q = NULL;
    cudaError_t e = cudaMalloc(&q, r);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        (void)cudaGetLastError();
        return cu_fail(e == cudaErrorMemoryAllocation ? CU_ENOMEM : CU_EBACKEND,
                       "cuda backend: cudaMalloc of %zu bytes on device %d: %s (%s; %zu of %zu MiB free)", bytes, S.dev,
                       cudaGetErrorString(e), cudaGetErrorName(e), fr >> 20, tot >> 20);
    }
    e = cudaMemsetAsync(q, 0, r, S.st);
    if (e != cudaSuccess) {
        cudaFree(q);
        return fail_cuda(e, "cudaMemsetAsync");
    }
    *p = q;
    return 0;
}

static void cu_free(void *p) {
    if (!p || !S.inited) return;
    cudaError_t e = cudaFree(p); /* synchronises the device first */
    if (e != cudaSuccess) { /* nothing to return: the message stays for error() */
        ctx.op = "free";
        ctx.fmt = NULL;
        fail_cuda(e, "cudaFree");
    }
}

static int cu_to_host(void *dst, const void *src, size_t bytes) {
    OP("to_host", "%lld bytes", bytes, 0, 0, 0);
    if (!bytes) return 0;
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, S.st));
    CU_TRY(cudaStreamSynchronize(S.st));
    return 0;
}
static int cu_from_host(void *dst, const void *src, size_t bytes) {
    OP("from_host", "%lld bytes", bytes, 0, 0, 0);
    if (!bytes) return 0;
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, S.st));
    CU_TRY(cudaStreamSynchronize(S.st)); /* the caller may reuse its buffer at once */
    return 0;
}
/* Device to device, stream-ordered; overlapping ranges go through scratch (memmove). */
static int cu_copy(void *dst, const void *src, size_t bytes) {
    OP("copy", "%lld bytes", bytes, 0, 0, 0);
    if (!bytes || dst == src) return 0;
    const char *d = (const char *)dst, *s = (const char *)src;
    if (d < s + bytes && s < d + bytes) {
        void *tmp = NULL;
        TRY(scratch(SCR_COPY, bytes, &tmp));
        CU_TRY(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, S.st));
        src = tmp;
    }
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, S.st));
    return launched("copy");
}
static int cu_zero(void *p, size_t bytes) {
    OP("zero", "%lld bytes", bytes, 0, 0, 0);
    if (!bytes) return 0;
    CU_TRY(cudaMemsetAsync(p, 0, bytes, S.st));
    return launched("zero");
}

/* A pinned buffer of at least bytes from the pool (the smallest free one that fits), else a
 * new one. A buffer whose last host -> device copy may still run is waited for. */
static int pool_get(size_t bytes, void **host) {
    int best = -1;
    for (int i = 0; i < S.npool; i++)
        if (!S.pool[i].busy && S.pool[i].cap >= bytes && (best < 0 || S.pool[i].cap < S.pool[best].cap)) best = i;
    if (best >= 0) {
        pinned_buf *b = &S.pool[best];
        if (b->pending) {
            CU_TRY(cudaEventSynchronize(b->ev));
            b->pending = 0;
        }
        b->busy = 1;
        *host = b->h;
        return 0;
    }
    if (S.npool == S.cappool) {
        int nc = S.cappool ? 2 * S.cappool : 16;
        pinned_buf *np = (pinned_buf *)realloc(S.pool, sizeof(pinned_buf) * (size_t)nc);
        if (!np) return cu_fail(CU_ENOMEM, "cuda backend: map: out of host memory for the staging pool");
        S.pool = np;
        S.cappool = nc;
    }
    size_t cap = bytes < 4096 ? 4096 : (bytes + 4095) / 4096 * 4096;
    pinned_buf nb;
    memset(&nb, 0, sizeof nb);
    cudaError_t e = cudaMallocHost(&nb.h, cap);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cu_fail(CU_ENOMEM, "cuda backend: map of %zu bytes: cudaMallocHost: %s (%s)", bytes,
                       cudaGetErrorString(e), cudaGetErrorName(e));
    }
    e = cudaEventCreateWithFlags(&nb.ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        cudaFreeHost(nb.h);
        return fail_cuda(e, "cudaEventCreateWithFlags");
    }
    nb.cap = cap;
    nb.busy = 1;
    S.pool[S.npool++] = nb;
    S.pool_bytes += cap;
    *host = nb.h;
    return 0;
}
/* Back to the pool; after a host -> device copy (copied = 1) its event marks when the buffer is
 * free again. Beyond POOL_MAX_BYTES of pinned memory the buffer is released instead. */
static int pool_put(void *host, int copied) {
    for (int i = 0; i < S.npool; i++) {
        pinned_buf *b = &S.pool[i];
        if (b->h != host) continue;
        if (!b->busy) return cu_fail(CU_EBACKEND, "cuda backend: unmap of a staging buffer that is not mapped");
        b->busy = 0;
        if (S.pool_bytes > POOL_MAX_BYTES) {
            if (copied) CU_TRY(cudaStreamSynchronize(S.st));
            CU_TRY(cudaEventDestroy(b->ev));
            CU_TRY(cudaFreeHost(b->h));
            S.pool_bytes -= b->cap;
            S.pool[i] = S.pool[--S.npool];
            return 0;
        }
        if (copied) {
            CU_TRY(cudaEventRecord(b->ev, S.st));
            b->pending = 1;
        }
        return 0;
    }
    return cu_fail(CU_EBACKEND, "cuda backend: unmap of %p: not a buffer handed out by map", host);
}

/* READ: a pinned copy of the device bytes; WRITE: a pinned buffer that unmap copies in. */
static int cu_map(void **host, void *p, size_t bytes, int mode) {
    *host = NULL;
    OP("map", "%lld bytes, mode %lld", bytes, mode, 0, 0);
    if (!(mode & (PL_MAP_READ | PL_MAP_WRITE))) return fail_shape();
    void *h = NULL;
    TRY(pool_get(bytes, &h));
    if ((mode & PL_MAP_READ) && bytes) {
        cudaError_t e = cudaMemcpyAsync(h, p, bytes, cudaMemcpyDeviceToHost, S.st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(S.st);
        if (e != cudaSuccess) {
            pool_put(h, 0);
            return fail_cuda(e, "cudaMemcpyAsync device -> pinned host");
        }
    }
    *host = h;
    return 0;
}
static int cu_unmap(void *host, void *p, size_t bytes, int mode) {
    OP("unmap", "%lld bytes, mode %lld", bytes, mode, 0, 0);
    if (!host) return 0;
    int copied = 0;
    if ((mode & PL_MAP_WRITE) && bytes) {
        cudaError_t e = cudaMemcpyAsync(p, host, bytes, cudaMemcpyHostToDevice, S.st);
        if (e != cudaSuccess) {
            pool_put(host, 0);
            return fail_cuda(e, "cudaMemcpyAsync pinned host -> device");
        }
        copied = 1;
    }
    return pool_put(host, copied);
}

/* Wait for everything queued on the stream: the clock readers' barrier (backend.h). A
 * failure of a queued kernel surfaces here. A profiler wanting per-op device time without the
 * host waits would record cudaEvents around each op instead; not needed yet. */
static int cu_synchronize(void) {
    OP("synchronize", NULL, 0, 0, 0, 0);
    CU_TRY(cudaStreamSynchronize(S.st));
    return 0;
}

/* ======================================================================================== */
/* matrix products                                                                          */
/* ======================================================================================== */

/* Row-major C(M,N) = alpha op(A)(M,K) op(B)(K,N) + beta C, as cblas_sgemm(CblasRowMajor, ...),
 * batch times with element strides sA, sB, sC. cuBLAS is column-major: the row-major C is the
 * column-major C^T = op(B)^T op(A)^T, i.e. the same call with A and B (and M and N) swapped and
 * the same transpose flags. bf16: A and B hold bf16 bits. Output and accumulation fp32. */
static int gemm(int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda, long long sA,
                const void *B, int ldb, long long sB, float beta, float *C, int ldc, long long sC, int batch, int bf16) {
    cudaDataType_t dt = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasComputeType_t ct = !bf16 && S.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (batch == 1)
        BLAS_TRY(cublasGemmEx(S.blas, ob, oa, N, M, K, &alpha, B, dt, ldb, A, dt, lda, &beta, C, CUDA_R_32F, ldc, ct,
                              CUBLAS_GEMM_DEFAULT));
    else
        BLAS_TRY(cublasGemmStridedBatchedEx(S.blas, ob, oa, N, M, K, &alpha, B, dt, ldb, sB, A, dt, lda, sA, &beta, C,
                                            CUDA_R_32F, ldc, sC, batch, ct, CUBLAS_GEMM_DEFAULT));
    return S.sync_each ? launched("cublas") : 0;
}

/* bf16 copy of n floats in scratch slot k. */
static int to_bf16(int k, const float *src, size_t n, const void **out) {
    void *p = NULL;
    TRY(scratch(k, n * sizeof(uint16_t), &p));
    if (n) KERNEL(k_cvt_bf16, ew_grid(n), EW_THREADS, (uint16_t *)p, src, n);
    *out = p;
    return 0;
}

/* dst[c] += column sums of dout (N, C) (and, with LN, dw[c] += sum dout * xhat). */
static int colsum(float *dw, float *db, const float *dout, const float *inp, const float *mean, const float *rstd,
                  int N, int C, int ln) {
    if (N == 0 || C == 0) return 0;
    int R = (N + CS_ROWS - 1) / CS_ROWS, tiles = (C + 31) / 32;
    if (tiles > 65535) return fail_shape();
    void *pv = NULL;
    TRY(scratch(SCR_PART, sizeof(float) * (size_t)R * C * (ln ? 2 : 1), &pv));
    float *pdb = (float *)pv, *pdw = ln ? pdb + (size_t)R * C : NULL;
    dim3 grid((unsigned)R, (unsigned)tiles), block(32, CS_TY);
    if (ln)
        KERNEL(k_colsum_part<1>, grid, block, pdw, pdb, dout, inp, mean, rstd, N, C);
    else
        KERNEL(k_colsum_part<0>, grid, block, (float *)NULL, pdb, dout, (const float *)NULL, (const float *)NULL,
               (const float *)NULL, N, C);
    KERNEL(k_colsum_final, (unsigned)tiles, block, db, pdb, R, C);
    if (ln) KERNEL(k_colsum_final, (unsigned)tiles, block, dw, pdw, R, C);
    return 0;
}

static int cu_matmul_fwd(float *out, const float *inp, const float *w, const float *b, int N, int C, int OC) {
    OP("matmul_fwd", "N=%lld C=%lld OC=%lld", N, C, OC, 0);
    if (N < 0 || C < 0 || OC < 0) return fail_shape();
    if (N == 0 || OC == 0) return 0;
    size_t no = (size_t)N * OC;
    if (C == 0) {
        KERNEL(k_fill_bias, ew_grid(no), EW_THREADS, out, b, no, OC);
        return 0;
    }
    int bf = S.prec == PL_PREC_BF16;
    const void *A = inp, *B = w;
    if (bf) {
        TRY(to_bf16(SCR_A, inp, (size_t)N * C, &A));
        TRY(to_bf16(SCR_B, w, (size_t)OC * C, &B));
    }
    TRY(gemm(0, 1, N, OC, C, 1.0f, A, C, 0, B, C, 0, 0.0f, out, OC, 0, 1, bf));
    if (b) KERNEL(k_add_bias, ew_grid(no), EW_THREADS, out, b, no, OC);
    return 0;
}

static int cu_matmul_bwd_input(float *dinp, const float *dout, const float *w, int N, int C, int OC) {
    OP("matmul_bwd_input", "N=%lld C=%lld OC=%lld", N, C, OC, 0);
    if (N < 0 || C < 0 || OC < 0) return fail_shape();
    if (N == 0 || C == 0) return 0;
    if (OC == 0) {
        CU_TRY(cudaMemsetAsync(dinp, 0, sizeof(float) * (size_t)N * C, S.st));
        return 0;
    }
    int bf = S.prec == PL_PREC_BF16;
    const void *A = dout, *B = w;
    if (bf) {
        TRY(to_bf16(SCR_A, dout, (size_t)N * OC, &A));
        TRY(to_bf16(SCR_B, w, (size_t)OC * C, &B));
    }
    return gemm(0, 0, N, C, OC, 1.0f, A, OC, 0, B, C, 0, 0.0f, dinp, C, 0, 1, bf);
}

static int cu_matmul_bwd_weight(float *dw, float *db, const float *dout, const float *inp, int N, int C, int OC) {
    OP("matmul_bwd_weight", "N=%lld C=%lld OC=%lld", N, C, OC, 0);
    if (N < 0 || C < 0 || OC < 0) return fail_shape();
    if (N == 0 || OC == 0) return 0;
    if (C > 0) {
        int bf = S.prec == PL_PREC_BF16;
        const void *A = dout, *B = inp;
        if (bf) {
            TRY(to_bf16(SCR_A, dout, (size_t)N * OC, &A));
            TRY(to_bf16(SCR_B, inp, (size_t)N * C, &B));
        }
        TRY(gemm(1, 0, OC, C, N, 1.0f, A, OC, 0, B, C, 0, 1.0f, dw, C, 0, 1, bf));
    }
    if (db) TRY(colsum(NULL, db, dout, NULL, NULL, NULL, N, OC, 0));
    return 0;
}

/* ======================================================================================== */
/* attention: q, k, v permuted to (B, NH, T, hs), batched strided products over the B*NH     */
/* pairs, the causal softmax kernel, results permuted back                                   */
/* ======================================================================================== */

/* dst (B,NH,T,hs) in the product's input type from src with row stride ld. */
static int permute_in(void *dst, const float *src, int ld, int B, int T, int C, int NH, int bf) {
    size_t n = (size_t)B * T * C;
    if (bf)
        KERNEL(k_permute<uint16_t>, ew_grid(n), EW_THREADS, (uint16_t *)dst, src, ld, B, T, C, NH);
    else
        KERNEL(k_permute<float>, ew_grid(n), EW_THREADS, (float *)dst, src, ld, B, T, C, NH);
    return 0;
}

/* The fused kernels run when --backend-opt flash=1 (the default), hs <= 128 (the registers'
 * bound) and T > hs; the att buffer then holds lse and O, B*NH*T*(hs+1) floats, and the stage
 * allocates only that (cu_attention_cols). */
static int flash_fits(int B, int T, int NH, int hs) {
    return S.flash && hs <= 128 && T > hs && (long long)B * NH <= 65535;
}

/* backend.h's attention_cols: where the fused kernels run, the att buffer holds lse and O,
 * hs + 1 floats per (token, head), instead of the T x T probabilities. */
static int cu_attention_cols(int B, int T, int NH, int HS) { return flash_fits(B, T, NH, HS) ? HS + 1 : T; }

/* The forward's launch for one register bound HSM and input type TT. */
template <int HSM, typename TT>
static int flash_fwd_launch(float *O, float *lse, const void *q, const void *k, const void *v, int BH, int T, int hs,
                            float scale, int bf, const int *doc, int NH) {
    auto fk = k_flash_fwd<HSM, TT>;
    dim3 grid((unsigned)((T + FA_Q - 1) / FA_Q), (unsigned)BH);
    KERNEL(fk, grid, FA_Q, O, lse, (const TT *)q, (const TT *)k, (const TT *)v, T, hs, scale, bf, doc, NH);
    return 0;
}
/* The backward's launches (row dots, dq, dk and dv) for HSM and TT. */
template <int HSM, typename TT>
static int flash_bwd_launch(float *dq, float *dk, float *dv, float *Dr, const void *q, const void *k, const void *v,
                            const void *dy, const float *O, const float *lse, int BH, int T, int hs, float scale,
                            int bf, const int *doc, int NH) {
    auto fd = k_flash_rowdot<TT>;
    auto fq = k_flash_bwd_dq<HSM, TT>;
    auto fkv = k_flash_bwd_dkdv<HSM, TT>;
    size_t rows = (size_t)BH * T;
    dim3 grid((unsigned)((T + FA_Q - 1) / FA_Q), (unsigned)BH);
    KERNEL(fd, ew_grid(rows), EW_THREADS, Dr, (const TT *)dy, O, rows, hs);
    KERNEL(fq, grid, FA_Q, dq, (const TT *)q, (const TT *)k, (const TT *)v, (const TT *)dy, lse, Dr, T, hs, scale, bf,
           doc, NH);
    KERNEL(fkv, grid, FA_Q, dk, dv, (const TT *)q, (const TT *)k, (const TT *)v, (const TT *)dy, lse, Dr, T, hs, scale,
           bf, doc, NH);
    return 0;
}
/* Dispatch on hs's register bound (32, 64, 128) and the precision. */
static int flash_fwd(float *O, float *lse, const void *q, const void *k, const void *v, int BH, int T, int hs,
                     float scale, int bf, const int *doc, int NH) {
#define FLASH_FWD(H, TT) flash_fwd_launch<H, TT>(O, lse, q, k, v, BH, T, hs, scale, bf, doc, NH)
    if (hs <= 32) return bf ? FLASH_FWD(32, uint16_t) : FLASH_FWD(32, float);
    if (hs <= 64) return bf ? FLASH_FWD(64, uint16_t) : FLASH_FWD(64, float);
    return bf ? FLASH_FWD(128, uint16_t) : FLASH_FWD(128, float);
#undef FLASH_FWD
}
static int flash_bwd(float *dq, float *dk, float *dv, float *Dr, const void *q, const void *k, const void *v,
                     const void *dy, const float *O, const float *lse, int BH, int T, int hs, float scale, int bf,
                     const int *doc, int NH) {
#define FLASH_BWD(H, TT) flash_bwd_launch<H, TT>(dq, dk, dv, Dr, q, k, v, dy, O, lse, BH, T, hs, scale, bf, doc, NH)
    if (hs <= 32) return bf ? FLASH_BWD(32, uint16_t) : FLASH_BWD(32, float);
    if (hs <= 64) return bf ? FLASH_BWD(64, uint16_t) : FLASH_BWD(64, float);
    return bf ? FLASH_BWD(128, uint16_t) : FLASH_BWD(128, float);
#undef FLASH_BWD
}

/* ======================================================================================== */
/* the other ops                                                                            */
/* ======================================================================================== */

static int cu_encoder_fwd(float *out, const int *tok, const float *wte, const float *wpe, int N, int T, int C) {
    OP("encoder_fwd", "N=%lld T=%lld C=%lld", N, T, C, 0);
    if (N < 0 || T <= 0 || C < 0) return fail_shape();
    size_t n = (size_t)N * C;
    if (n) KERNEL(k_encoder_fwd, ew_grid(n), EW_THREADS, out, tok, wte, wpe, N, T, C);
    return 0;
}

static int cu_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int *tok, int N, int T, int C) {
    OP("encoder_bwd", "N=%lld T=%lld C=%lld", N, T, C, 0);
    if (N < 0 || T <= 0 || C < 0) return fail_shape();
    if (N == 0 || C == 0) return 0;
    KERNEL(k_encoder_bwd_wpe, ew_grid((size_t)T * C), EW_THREADS, dwpe, dout, N, T, C);
    void *keys, *rin, *rout, *tmp;
    size_t tmp_bytes = 0;
    CU_TRY(cub::DeviceRadixSort::SortPairs(NULL, tmp_bytes, tok, (int *)NULL, (const int *)NULL, (int *)NULL, N, 0,
                                           32, S.st));
    TRY(scratch(SCR_SORT, tmp_bytes, &tmp));
    TRY(scratch(SCR_KEYS, sizeof(int) * (size_t)N, &keys));
    TRY(scratch(SCR_ROWS_IN, sizeof(int) * (size_t)N, &rin));
    TRY(scratch(SCR_ROWS_OUT, sizeof(int) * (size_t)N, &rout));
    KERNEL(k_iota, ew_grid((size_t)N), EW_THREADS, (int *)rin, N);
    CU_TRY(cub::DeviceRadixSort::SortPairs(tmp, tmp_bytes, tok, (int *)keys, (const int *)rin, (int *)rout, N, 0, 32,
                                           S.st));
    TRY(launched("cub::DeviceRadixSort::SortPairs"));
    KERNEL(k_encoder_bwd_wte, (unsigned)N, 128, dwte, dout, (const int *)keys, (const int *)rout, N, C);
    return 0;
}

static int cu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                            int N, int C) {
    OP("layernorm_fwd", "N=%lld C=%lld", N, C, 0, 0);
    if (N < 0 || C <= 0) return fail_shape();
    if (N) KERNEL(k_layernorm_fwd, (unsigned)N, LN_THREADS, out, mean, rstd, inp, w, b, C);
    return 0;
}
static int cu_layernorm_bwd_input(float *dinp, const float *dout, const float *inp, const float *w, const float *mean,
                                  const float *rstd, int N, int C) {
    OP("layernorm_bwd_input", "N=%lld C=%lld", N, C, 0, 0);
    if (N < 0 || C <= 0) return fail_shape();
    if (N) KERNEL(k_layernorm_bwd_input, (unsigned)N, LN_THREADS, dinp, dout, inp, w, mean, rstd, C);
    return 0;
}
static int cu_layernorm_bwd_weight(float *dw, float *db, const float *dout, const float *inp, const float *mean,
                                   const float *rstd, int N, int C) {
    OP("layernorm_bwd_weight", "N=%lld C=%lld", N, C, 0, 0);
    if (N < 0 || C < 0) return fail_shape();
    return colsum(dw, db, dout, inp, mean, rstd, N, C, 1);
}

static int cu_gelu_fwd(float *out, const float *inp, size_t n) {
    OP("gelu_fwd", "n=%lld", n, 0, 0, 0);
    if (n) KERNEL(k_gelu_fwd, ew_grid(n), EW_THREADS, out, inp, n);
    return 0;
}
static int cu_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n) {
    OP("gelu_bwd", "n=%lld", n, 0, 0, 0);
    if (n) KERNEL(k_gelu_bwd, ew_grid(n), EW_THREADS, dinp, inp, dout, n);
    return 0;
}
static int cu_residual_fwd(float *out, const float *a, const float *b, size_t n) {
    OP("residual_fwd", "n=%lld", n, 0, 0, 0);
    if (n) KERNEL(k_residual, ew_grid(n), EW_THREADS, out, a, b, n);
    return 0;
}
static int cu_add_inplace(float *dst, const float *src, size_t n) {
    OP("add_inplace", "n=%lld", n, 0, 0, 0);
    if (n) KERNEL(k_add_inplace, ew_grid(n), EW_THREADS, dst, src, n);
    return 0;
}
static int cu_scale(float *x, float s, size_t n) {
    OP("scale", "n=%lld", n, 0, 0, 0);
    if (n) KERNEL(k_scale, ew_grid(n), EW_THREADS, x, s, n);
    return 0;
}

static int cu_crossentropy_fwd(float *losses, float *logits, const int *targets, int N, int V, int Vp) {
    OP("crossentropy_fwd", "N=%lld V=%lld Vp=%lld", N, V, Vp, 0);
    if (N < 0 || V <= 0 || Vp < V) return fail_shape();
    if (N) KERNEL(k_ce_fwd, (unsigned)N, CE_THREADS, losses, logits, targets, V, Vp);
    return 0;
}
static int cu_crossentropy_bwd(float *probs, const int *targets, float dloss, int N, int V, int Vp) {
    OP("crossentropy_bwd", "N=%lld V=%lld Vp=%lld", N, V, Vp, 0);
    if (N < 0 || V <= 0 || Vp < V) return fail_shape();
    if (N == 0) return 0;
    dim3 grid((unsigned)((V + EW_THREADS - 1) / EW_THREADS), (unsigned)(N < 65535 ? N : 65535));
    KERNEL(k_ce_bwd, grid, EW_THREADS, probs, targets, dloss, N, V, Vp);
    return 0;
}

static int cu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2, float eps,
                    float wd, int t) {
    OP("adamw", "n=%lld t=%lld", n, t, 0, 0);
    float c1 = 1.0f - powf(b1, (float)t), c2 = 1.0f - powf(b2, (float)t);
    if (n) KERNEL(k_adamw, ew_grid(n), EW_THREADS, p, g, m, v, n, lr, b1, b2, eps, wd, c1, c2);
    return 0;
}

static int cu_sumsq(const float *x, size_t n, double *out) {
    OP("sumsq", "n=%lld", n, 0, 0, 0);
    if (n == 0) {
        *out = 0.0;
        return 0;
    }
    size_t nchunk = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    if (nchunk > 0x7fffffffu) return fail_shape();
    void *pv = NULL;
    TRY(scratch(SCR_SUMSQ, sizeof(double) * (nchunk + 1), &pv));
    double *res = (double *)pv, *part = res + 1;
    KERNEL(k_sumsq_part, (unsigned)nchunk, SQ_THREADS, part, x, n);
    KERNEL(k_sumsq_final, 1, SQ_THREADS, res, (const double *)part, nchunk);
    CU_TRY(cudaMemcpyAsync(S.hd, res, sizeof(double), cudaMemcpyDeviceToHost, S.st));
    CU_TRY(cudaStreamSynchronize(S.st));
    *out = *S.hd;
    return 0;
}

/* ======================================================================================== */
/* Llama ops                                                                                */
/* ======================================================================================== */

static int cu_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    OP("rmsnorm_fwd", "N=%lld C=%lld", N, C, 0, 0);
    if (N < 0 || C <= 0) return fail_shape();
    if (N) KERNEL(k_rmsnorm_fwd, (unsigned)N, LN_THREADS, out, rstd, inp, w, C, eps);
    return 0;
}
static int cu_rmsnorm_bwd_input(float *dinp, const float *dout, const float *inp, const float *w, const float *rstd,
                                int N, int C) {
    OP("rmsnorm_bwd_input", "N=%lld C=%lld", N, C, 0, 0);
    if (N < 0 || C <= 0) return fail_shape();
    if (N) KERNEL(k_rmsnorm_bwd_input, (unsigned)N, LN_THREADS, dinp, dout, inp, w, rstd, C);
    return 0;
}
/* dw += sum_rows dy x rstd: fixed chunks of CS_ROWS rows into partials, then k_colsum_final's
 * fixed order. */
static int cu_rmsnorm_bwd_weight(float *dw, const float *dout, const float *inp, const float *rstd, int N, int C) {
    OP("rmsnorm_bwd_weight", "N=%lld C=%lld", N, C, 0, 0);
    if (N < 0 || C < 0) return fail_shape();
    if (N == 0 || C == 0) return 0;
    int R = (N + CS_ROWS - 1) / CS_ROWS, tiles = (C + 31) / 32;
    if (tiles > 65535) return fail_shape();
    void *pv = NULL;
    TRY(scratch(SCR_PART, sizeof(float) * (size_t)R * C, &pv));
    dim3 grid((unsigned)R, (unsigned)tiles), block(32, CS_TY);
    KERNEL(k_rms_colsum_part, grid, block, (float *)pv, dout, inp, rstd, N, C);
    KERNEL(k_colsum_final, (unsigned)tiles, block, dw, (const float *)pv, R, C);
    return 0;
}

static int rope(const char *name, float *out, const float *inp, const float *fcos, const float *fsin, int N, int T,
                int NH, int NKV, int HS, float dir) {
    OP(name, "N=%lld T=%lld heads=%lld HS=%lld", N, T, (long long)NH * 1000 + NKV, HS);
    if (N < 0 || T <= 0 || NH < 0 || NKV < 0 || HS <= 0 || HS % 2) return fail_shape();
    int W = (NH + 2 * NKV) * HS;
    size_t np = (size_t)N * (W / 2);
    if (np) KERNEL(k_rope, ew_grid(np), EW_THREADS, out, inp, fcos, fsin, N, T, W, (NH + NKV) * HS, HS, dir);
    return 0;
}
static int cu_rope_fwd(float *out, const float *inp, const float *fcos, const float *fsin, int N, int T, int NH,
                       int NKV, int HS) {
    return rope("rope_fwd", out, inp, fcos, fsin, N, T, NH, NKV, HS, 1.0f);
}
static int cu_rope_bwd(float *dinp, const float *dout, const float *fcos, const float *fsin, int N, int T, int NH,
                       int NKV, int HS) {
    return rope("rope_bwd", dinp, dout, fcos, fsin, N, T, NH, NKV, HS, -1.0f);
}

/* Grouped-query attention: q permuted to (B, NH, T, HS), k and v permuted with each kv head
 * repeated for its G = NH / NKV query heads (G = 1, GPT-2's multi-head attention: a plain
 * permute), batched strided products over the B*NH pairs, the causal softmax kernel, results
 * permuted back. */
static int gqa_shape_ok(int B, int T, int NH, int NKV, int HS) {
    return B >= 0 && T >= 0 && NH > 0 && NKV > 0 && HS > 0 && NH % NKV == 0 && (long long)B * NH * T <= 0x7fffffffLL;
}

static int cu_attention_gqa_fwd(float *out, float *att, const float *qkv, int B, int T, int NH, int NKV, int HS,
                                const int *doc) {
    OP("attention_gqa_fwd", "B=%lld T=%lld heads=%lld HS=%lld", B, T, (long long)NH * 1000 + NKV, HS);
    if (!gqa_shape_ok(B, T, NH, NKV, HS)) return fail_shape();
    if (B == 0 || T == 0) return 0;
    int bf = S.prec == PL_PREC_BF16, hs = HS, BH = B * NH, G = NH / NKV, C = NH * HS, W = (NH + 2 * NKV) * HS;
    size_t es = bf ? 2 : 4, n1 = (size_t)B * T * C;
    long long THS = (long long)T * hs, TT = (long long)T * T;
    float scale = 1.0f / sqrtf((float)hs);
    void *q, *k, *v, *y;
    TRY(scratch(SCR_Q, n1 * es, &q));
    TRY(scratch(SCR_K, n1 * es, &k));
    TRY(scratch(SCR_V, n1 * es, &v));
    TRY(scratch(SCR_Y, n1 * sizeof(float), &y));
    TRY(permute_in(q, qkv, W, B, T, C, NH, bf));
    if (bf) {
        KERNEL(k_permute_rep<uint16_t>, ew_grid(n1), EW_THREADS, (uint16_t *)k, qkv + C, W, B, T, NH, G, hs);
        KERNEL(k_permute_rep<uint16_t>, ew_grid(n1), EW_THREADS, (uint16_t *)v, qkv + C + NKV * HS, W, B, T, NH, G, hs);
    } else {
        KERNEL(k_permute_rep<float>, ew_grid(n1), EW_THREADS, (float *)k, qkv + C, W, B, T, NH, G, hs);
        KERNEL(k_permute_rep<float>, ew_grid(n1), EW_THREADS, (float *)v, qkv + C + NKV * HS, W, B, T, NH, G, hs);
    }
    if (flash_fits(B, T, NH, hs)) { /* att holds lse (BH*T), then the permuted output O */
        float *O = att + (size_t)BH * T;
        TRY(flash_fwd(O, att, q, k, v, BH, T, hs, scale, bf, doc, NH));
        KERNEL(k_unpermute, ew_grid(n1), EW_THREADS, out, C, (const float *)O, B, T, C, NH);
        return 0;
    }
    TRY(gemm(0, 1, T, T, hs, scale, q, hs, THS, k, hs, THS, 0.0f, att, T, TT, BH, bf));
    KERNEL(k_softmax_causal, (unsigned)((size_t)BH * T), SM_THREADS, att, T, doc, NH);
    const void *a = att;
    if (bf) TRY(to_bf16(SCR_ATT_T, att, (size_t)BH * TT, &a));
    TRY(gemm(0, 0, T, hs, T, 1.0f, a, T, TT, v, hs, THS, 0.0f, (float *)y, hs, THS, BH, bf));
    KERNEL(k_unpermute, ew_grid(n1), EW_THREADS, out, C, (const float *)y, B, T, C, NH);
    return 0;
}

/* dqkv <- the permuted dq, and dk, dv summed over each kv head's G query heads in ascending h
 * (k_unpermute_sum; G = 1: a copy): no atomics, a fixed order. */
static int unpermute_grads(float *dqkv, const float *dq, const float *dk, const float *dv, int B, int T, int NH,
                           int NKV, int hs) {
    int G = NH / NKV, C = NH * hs, W = (NH + 2 * NKV) * hs;
    size_t n1 = (size_t)B * T * C, nkv = (size_t)B * T * NKV * hs;
    KERNEL(k_unpermute, ew_grid(n1), EW_THREADS, dqkv, W, dq, B, T, C, NH);
    KERNEL(k_unpermute_sum, ew_grid(nkv), EW_THREADS, dqkv + C, W, dk, B, T, NKV, G, hs);
    KERNEL(k_unpermute_sum, ew_grid(nkv), EW_THREADS, dqkv + C + NKV * hs, W, dv, B, T, NKV, G, hs);
    return 0;
}

/* datt = dy v^T; dv = att^T dy; dpre = att (datt - rowsum(att datt)); dq = s dpre k;
 * dk = s dpre^T q, on the repeated k, v; the per-query-head dk, dv are then summed over each
 * group in ascending h (k_unpermute_sum; G = 1: a copy): no atomics, a fixed order. dqkv
 * overwritten. */
static int cu_attention_gqa_bwd(float *dqkv, const float *dout, const float *qkv, const float *att, int B, int T,
                                int NH, int NKV, int HS, const int *doc) {
    OP("attention_gqa_bwd", "B=%lld T=%lld heads=%lld HS=%lld", B, T, (long long)NH * 1000 + NKV, HS);
    if (!gqa_shape_ok(B, T, NH, NKV, HS)) return fail_shape();
    if (B == 0 || T == 0) return 0;
    int bf = S.prec == PL_PREC_BF16, hs = HS, BH = B * NH, G = NH / NKV, C = NH * HS, W = (NH + 2 * NKV) * HS;
    size_t es = bf ? 2 : 4, n1 = (size_t)B * T * C;
    long long THS = (long long)T * hs, TT = (long long)T * T;
    float scale = 1.0f / sqrtf((float)hs);
    void *q, *k, *v, *dy, *datt, *dq, *dk, *dv;
    TRY(scratch(SCR_Q, n1 * es, &q));
    TRY(scratch(SCR_K, n1 * es, &k));
    TRY(scratch(SCR_V, n1 * es, &v));
    TRY(scratch(SCR_DY, n1 * es, &dy));
    int fl = flash_fits(B, T, NH, hs);
    TRY(scratch(SCR_DATT, sizeof(float) * (size_t)BH * (fl ? T : TT), &datt)); /* flash: the row dots */
    TRY(scratch(SCR_Y, n1 * sizeof(float), &dq));
    TRY(scratch(SCR_DK, n1 * sizeof(float), &dk));
    TRY(scratch(SCR_DV, n1 * sizeof(float), &dv));
    TRY(permute_in(q, qkv, W, B, T, C, NH, bf));
    if (bf) {
        KERNEL(k_permute_rep<uint16_t>, ew_grid(n1), EW_THREADS, (uint16_t *)k, qkv + C, W, B, T, NH, G, hs);
        KERNEL(k_permute_rep<uint16_t>, ew_grid(n1), EW_THREADS, (uint16_t *)v, qkv + C + NKV * HS, W, B, T, NH, G, hs);
    } else {
        KERNEL(k_permute_rep<float>, ew_grid(n1), EW_THREADS, (float *)k, qkv + C, W, B, T, NH, G, hs);
        KERNEL(k_permute_rep<float>, ew_grid(n1), EW_THREADS, (float *)v, qkv + C + NKV * HS, W, B, T, NH, G, hs);
    }
    TRY(permute_in(dy, dout, C, B, T, C, NH, bf));
    if (fl) {
        TRY(flash_bwd((float *)dq, (float *)dk, (float *)dv, (float *)datt, q, k, v, dy, att + (size_t)BH * T, att, BH,
                      T, hs, scale, bf, doc, NH));
        return unpermute_grads(dqkv, (const float *)dq, (const float *)dk, (const float *)dv, B, T, NH, NKV, hs);
    }
    const void *a = att;
    if (bf) TRY(to_bf16(SCR_ATT_T, att, (size_t)BH * TT, &a));
    TRY(gemm(0, 1, T, T, hs, 1.0f, dy, hs, THS, v, hs, THS, 0.0f, (float *)datt, T, TT, BH, bf));
    TRY(gemm(1, 0, T, hs, T, 1.0f, a, T, TT, dy, hs, THS, 0.0f, (float *)dv, hs, THS, BH, bf));
    KERNEL(k_softmax_causal_bwd, (unsigned)((size_t)BH * T), SM_THREADS, (float *)datt, att, T, doc, NH);
    const void *dp = datt;
    if (bf) TRY(to_bf16(SCR_ATT_T, (const float *)datt, (size_t)BH * TT, &dp));
    TRY(gemm(0, 0, T, hs, T, scale, dp, T, TT, k, hs, THS, 0.0f, (float *)dq, hs, THS, BH, bf));
    TRY(gemm(1, 0, T, hs, T, scale, dp, T, TT, q, hs, THS, 0.0f, (float *)dk, hs, THS, BH, bf));
    return unpermute_grads(dqkv, (const float *)dq, (const float *)dk, (const float *)dv, B, T, NH, NKV, hs);
}

static int cu_swiglu_fwd(float *out, const float *up, const float *gate, size_t n) {
    OP("swiglu_fwd", "n=%lld", n, 0, 0, 0);
    if (n) KERNEL(k_swiglu_fwd, ew_grid(n), EW_THREADS, out, up, gate, n);
    return 0;
}
static int cu_swiglu_bwd(float *dup, float *dgate, const float *dout, const float *up, const float *gate, size_t n) {
    OP("swiglu_bwd", "n=%lld", n, 0, 0, 0);
    if (n) KERNEL(k_swiglu_bwd, ew_grid(n), EW_THREADS, dup, dgate, dout, up, gate, n);
    return 0;
}

static int cu_moe_gather(float *out, const float *x, const int *rows, const float *scale, int M, int C) {
    OP("moe_gather", "M=%lld C=%lld", M, C, 0, 0);
    if ((size_t)M * C > 0) KERNEL(k_moe_gather, ew_grid((size_t)M * C), EW_THREADS, out, x, rows, scale, M, C);
    return 0;
}
static int cu_moe_combine(float *out, const float *y, const int *slot, const float *w, int N, int K, int C) {
    OP("moe_combine", "N=%lld K=%lld C=%lld", N, K, C, 0);
    if ((size_t)N * C > 0) KERNEL(k_moe_combine, ew_grid((size_t)N * C), EW_THREADS, out, y, slot, w, N, K, C);
    return 0;
}
static int cu_moe_rowdot(float *dw, const float *dout, const float *y, const int *slot, int N, int K, int C) {
    OP("moe_rowdot", "N=%lld K=%lld C=%lld", N, K, C, 0);
    if ((size_t)N * K > 0) KERNEL(k_moe_rowdot, ew_grid((size_t)N * K), EW_THREADS, dw, dout, y, slot, N, K, C);
    return 0;
}

/* ---- decoding with a KV cache (backend_ops.h attention_kv_fwd) ---- */
#define KV_MAXLEN 4096 /* cache positions one block's shared scores hold */

/* The new rows' keys and values into the cache, one float per thread. */
__global__ void k_kv_append(float *kc, float *vc, const float *qkv, int pos, int n, int W, int koff, int KW) {
    GRID_STRIDE(i, (size_t)n * KW) {
        size_t r = i / KW, c = i % KW;
        kc[((size_t)pos + r) * KW + c] = qkv[r * W + koff + c];
        vc[((size_t)pos + r) * KW + c] = qkv[r * W + koff + KW + c];
    }
}

/* One (new row, query head) pair per block: the scores of cache rows 0..pos+row in shared
 * memory, their softmax (block reductions in a fixed tree), then each channel's weighted sum
 * of the values on one thread, in key order. */
__global__ void k_kv_attn(float *out, const float *kc, const float *vc, const float *qkv, int pos, int NH, int G,
                          int HS, int W, int KW) {
    __shared__ float w[KV_MAXLEN];
    __shared__ float sh[32];
    int i = blockIdx.x / NH, h = blockIdx.x % NH, g = h / G, len = pos + i + 1;
    const float *q = qkv + (size_t)i * W + (size_t)h * HS;
    float scale = 1.0f / sqrtf((float)HS), mx = -INFINITY, sum = 0.0f;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        const float *k = kc + (size_t)j * KW + (size_t)g * HS;
        float s = 0.0f;
        for (int c = 0; c < HS; c++) s += q[c] * k[c];
        w[j] = s * scale;
        mx = w[j] > mx ? w[j] : mx;
    }
    mx = block_max(mx, sh);
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        float e = expf(w[j] - mx);
        w[j] = e;
        sum += e;
    }
    float inv = 1.0f / block_sum(sum, sh); /* its barriers publish w */
    for (int c = threadIdx.x; c < HS; c += blockDim.x) {
        float a = 0.0f;
        for (int j = 0; j < len; j++) a += w[j] * vc[(size_t)j * KW + (size_t)g * HS + c];
        out[(size_t)i * NH * HS + (size_t)h * HS + c] = a * inv;
    }
}

/* attention_kv_fwd: append, then attend (fp32 in both precisions). */
static int cu_attention_kv_fwd(float *out, float *kc, float *vc, const float *qkv, int pos, int n, int NH, int NKV,
                               int HS) {
    OP("attention_kv_fwd", "pos=%lld n=%lld heads=%lld HS=%lld", pos, n, (long long)NH * 1000 + NKV, HS);
    if (NH < 1 || NKV < 1 || NH % NKV || HS < 1 || pos < 0 || n < 1 || (long long)pos + n > KV_MAXLEN)
        return fail_shape();
    int W = (NH + 2 * NKV) * HS, KW = NKV * HS;
    KERNEL(k_kv_append, ew_grid((size_t)n * KW), EW_THREADS, kc, vc, qkv, pos, n, W, NH * HS, KW);
    KERNEL(k_kv_attn, (unsigned)(n * NH), SM_THREADS, out, kc, vc, qkv, pos, NH, NH / NKV, HS, W, KW);
    return 0;
}

extern "C" const backend backend_cuda;
extern "C" const backend backend_cuda = {
    .name = "cuda",
    .host_memory = 0,
    .init = cu_init,
    .finalize = cu_finalize,
    .error = cu_error,
    .describe = cu_describe,
    .set_threads = cu_set_threads,
    .get_threads = cu_get_threads,
    .opts = cu_opts,
    .attention_cols = cu_attention_cols,
    .alloc = cu_alloc,
    .free = cu_free,
    .to_host = cu_to_host,
    .from_host = cu_from_host,
    .copy = cu_copy,
    .zero = cu_zero,
    .map = cu_map,
    .unmap = cu_unmap,
    .synchronize = cu_synchronize,
    .encoder_fwd = cu_encoder_fwd,
    .encoder_bwd = cu_encoder_bwd,
    .layernorm_fwd = cu_layernorm_fwd,
    .layernorm_bwd_input = cu_layernorm_bwd_input,
    .layernorm_bwd_weight = cu_layernorm_bwd_weight,
    .matmul_fwd = cu_matmul_fwd,
    .matmul_bwd_input = cu_matmul_bwd_input,
    .matmul_bwd_weight = cu_matmul_bwd_weight,
    .gelu_fwd = cu_gelu_fwd,
    .gelu_bwd = cu_gelu_bwd,
    .residual_fwd = cu_residual_fwd,
    .add_inplace = cu_add_inplace,
    .crossentropy_fwd = cu_crossentropy_fwd,
    .crossentropy_bwd = cu_crossentropy_bwd,
    .adamw = cu_adamw,
    .sumsq = cu_sumsq,
    .scale = cu_scale,
    .rmsnorm_fwd = cu_rmsnorm_fwd,
    .rmsnorm_bwd_input = cu_rmsnorm_bwd_input,
    .rmsnorm_bwd_weight = cu_rmsnorm_bwd_weight,
    .rope_fwd = cu_rope_fwd,
    .rope_bwd = cu_rope_bwd,
    .attention_gqa_fwd = cu_attention_gqa_fwd,
    .attention_gqa_bwd = cu_attention_gqa_bwd,
    .swiglu_fwd = cu_swiglu_fwd,
    .swiglu_bwd = cu_swiglu_bwd,
    .matmul_decode_fwd = cu_matmul_fwd, /* cuBLAS's product does not repack per call: the same op */
    .attention_kv_fwd = cu_attention_kv_fwd,
    .moe_gather = cu_moe_gather,
    .moe_combine = cu_moe_combine,
    .moe_rowdot = cu_moe_rowdot,
};
