/*
 * cuda_llama.cuh — host side: the Llama and mixture-of-experts ops
 * Part of the CUDA backend's one translation unit: included by backend_cuda.cu only, in
 * the order that file gives (see its top comment).
 */
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
