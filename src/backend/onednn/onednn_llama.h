/*
 * onednn_llama.h — the oneDNN backend's AVX-512 loops for Llama's RMSNorm and SwiGLU and their
 * backward (src/backend/onednn/onednn_llama.c), with backend_ops.h's signatures. They keep the CPU backend's
 * per-row structure (each row's sums in 16 lanes, then a fixed reduction; RMSNorm's weight
 * gradient sums each channel's rows in order), so the results do not depend on the thread
 * count or the stage split, but their rounding is not the CPU backend's: they run in bf16
 * precision only (onednn_ops_bf16(1)), where the backend's bits are its own; in fp32, on a
 * CPU without AVX-512, or with the vector ops off, each calls backend_cpu's op, so the fp32
 * bits stay the former ones.
 */
#ifndef PIPELM_ONEDNN_LLAMA_H
#define PIPELM_ONEDNN_LLAMA_H

#include <stddef.h>

int onednn_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
int onednn_rmsnorm_bwd_input(float *dinp, const float *dout, const float *inp, const float *w, const float *rstd,
                             int N, int C);
int onednn_rmsnorm_bwd_weight(float *dw, const float *dout, const float *inp, const float *rstd, int N, int C);
int onednn_swiglu_fwd(float *out, const float *up, const float *gate, size_t n);
int onednn_swiglu_bwd(float *dup, float *dgate, const float *dout, const float *up, const float *gate, size_t n);

#endif
