/*
 * cuda_matmul.cuh — host side: matrix products (cuBLAS)
 * Part of the CUDA backend's one translation unit: included by backend_cuda.cu only, in
 * the order that file gives (see its top comment).
 */
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
