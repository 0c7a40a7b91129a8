/*
 * cuda_kvcache.cuh — decoding with a KV cache: kernels and the op
 * Part of the CUDA backend's one translation unit: included by backend_cuda.cu only, in
 * the order that file gives (see its top comment).
 */
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
