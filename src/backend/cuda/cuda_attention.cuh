/*
 * cuda_attention.cuh — host side: multi-head attention
 * Part of the CUDA backend's one translation unit: included by backend_cuda.cu only, in
 * the order that file gives (see its top comment).
 */
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
