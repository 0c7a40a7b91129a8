/*
 * cuda_flash.cuh — device code: the fused causal attention (flash=1)
 * Part of the CUDA backend's one translation unit: included by backend_cuda.cu only, in
 * the order that file gives (see its top comment).
 */
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
