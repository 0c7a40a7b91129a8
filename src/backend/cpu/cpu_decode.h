/*
 * cpu_decode.h — the CPU backend's kernels for decoding (pipelm generate): the matrix
 * product over the few rows of a decode step (matmul_decode_fwd) and the attention of new
 * rows over a KV cache (attention_kv_fwd); contracts in backend_ops.h. Both are built on one
 * dot product with a fixed order: 16 lanes, lane l summing elements l, l+16, l+32, ... by
 * fused multiply-adds from zero, then the lanes added in a fixed tree (l + l+8, + l+4, + l+2,
 * + l+1). An output row therefore depends on its own input row only, never on how many rows
 * share the call (so a decode gives the same bits whatever the groups, prefill chunks or
 * pipeline stages), nor on the thread count. The AVX-512 code is used where the CPU has it;
 * the portable C (fmaf, the same lanes and tree) gives the same bits elsewhere, and is what
 * the tests compare it with. The training path keeps OpenBLAS (matmul_fwd): it packs the
 * weight matrix on every call, which costs more than the product itself for a few rows.
 */
#ifndef PIPELM_CPU_DECODE_H
#define PIPELM_CPU_DECODE_H

/* out(N,OC) = inp(N,C) W^T + b, W stored (OC,C); b may be NULL. */
int cpu_matmul_decode_fwd(float *out, const float *inp, const float *w, const float *b, int N, int C, int OC);
/* backend_ops.h's attention_kv_fwd on host memory. */
int cpu_attention_kv_fwd(float *out, float *kc, float *vc, const float *qkv, int pos, int n, int NH, int NKV, int HS);
/* Tests: 1 forces the portable C even where AVX-512 is available; 0 lets the CPU choose. */
void cpu_decode_force_portable(int on);

#endif
