/*
 * cuda_llama_kernels.cuh — device code: RMSNorm, RoPE, GQA permutes, SwiGLU, mixture of experts
 * Part of the CUDA backend's one translation unit: included by backend_cuda.cu only, in
 * the order that file gives (see its top comment).
 */
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
