/*
 * cuda_ops.cuh — host side: embedding, LayerNorm, GELU, residual, loss, AdamW, sums
 * Part of the CUDA backend's one translation unit: included by backend_cuda.cu only, in
 * the order that file gives (see its top comment).
 */
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
