/*
 * onednn_elem.h — the oneDNN backend's AVX-512 loops for the memory-bound ops it used to take
 * from the CPU backend (src/backend/onednn/onednn_elem.c): the residual sum, the in-place add, the gradient
 * scale, the embedding lookup and its backward, and the bias-gradient column sum, alone or in
 * the same pass as the bf16 copy of dout that the weight-gradient product multiplies. Each is
 * the same arithmetic in the same order as the CPU backend's (an add or a multiply per value,
 * the column sums row by row), so the results are the CPU backend's bits for any thread count,
 * in fp32 and bf16; they only read and write in 16 lanes. On a CPU without AVX-512, or with the
 * vector ops off (onednn_ops_select(0)), each calls backend_cpu's op.
 */
#ifndef PIPELM_ONEDNN_ELEM_H
#define PIPELM_ONEDNN_ELEM_H

#include <stddef.h>
#include <stdint.h>

int onednn_residual_fwd(float *out, const float *a, const float *b, size_t n);
int onednn_add_inplace(float *dst, const float *src, size_t n);
int onednn_scale(float *x, float s, size_t n);
int onednn_encoder_fwd(float *out, const int *tok, const float *wte, const float *wpe, int N, int T, int C);
int onednn_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int *tok, int N, int T, int C);
/* db[j] += sum_i dout[i][j] (host_colsum's order: each column sums its rows in order); with out16
 * not NULL the same pass writes dout's bf16 copy there (VCVTNEPS2BF16, f32_to_bf16's rounding) and
 * returns 1, or, without AVX512-BF16 or with the vector ops off, does nothing and returns 0 (the
 * caller converts and sums). With out16 NULL it sums and returns 0. db may be NULL (only the copy). */
int onednn_colsum_bf16(float *db, uint16_t *out16, const float *dout, int N, int OC);
/* dst (OC, N) = the bf16 of src (N, OC) transposed (round to nearest even, f32_to_bf16's
 * rounding; register transposes and VCVTNE2PS2BF16 where the CPU has AVX512-BF16), in parallel
 * over column chunks: the dense dout^T the weight-gradient product takes without a
 * transposing copy of its own. onednn_colsum_bf16_t adds db's column sums in the same pass
 * (onednn_colsum_bf16's bits) and returns 1, or returns 0 with db untouched (the caller sums):
 * without AVX512-BF16, or with the vector ops off. */
void onednn_cvt_bf16_t(uint16_t *dst, const float *src, int N, int OC);
int onednn_colsum_bf16_t(float *db, uint16_t *dst, const float *dout, int N, int OC);
/* dst = the bf16 of src (K, N) in oneDNN's "16a64b2a" blocked layout, the one its AMX matmul
 * wants for a weights operand (and otherwise makes at every call in a copy of its own): rows in
 * blocks of 32 (stride sk elements), columns in blocks of 64 (stride sn), inside a block pairs
 * of rows interleaved value by value; K padded to 32 and N to 64 with zeros. One pass, in
 * parallel over the row blocks; f32_to_bf16's rounding (VCVTNE2PS2BF16 where the CPU has it). */
void onednn_cvt_bf16_vnni(uint16_t *dst, const float *src, int K, int N, int64_t sk, int64_t sn);

#endif
