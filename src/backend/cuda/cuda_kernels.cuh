/*
 * cuda_kernels.cuh — device code: reductions, conversions, embedding, LayerNorm, column sums,
 * permutes, the T x T softmax, GELU, residual, AdamW, cross-entropy, sum of squares
 * Part of the CUDA backend's one translation unit: included by backend_cuda.cu only, in
 * the order that file gives (see its top comment).
 */
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
