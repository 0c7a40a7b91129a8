/*
 * onednn_ops.h — the oneDNN backend's own versions of the non-matmul ops (src/backend/onednn/onednn_ops.c):
 * AVX-512 loops for LayerNorm, GELU, the cross-entropy, AdamW, the squared norm and the causal
 * softmax of attention, with the signatures of backend_ops.h. Each one is the same math as
 * backend_cpu's, in the same per-row (or per-chunk, per-channel) structure, so its results
 * do not depend on the thread count; only the order of the sums inside a row (16 lanes, then
 * a fixed reduction) and fused multiply-adds differ, so the bits are not the CPU's. On a CPU
 * without AVX-512, or with the vector ops switched off (onednn_ops_select(0)), each one calls
 * backend_cpu's op (the softmax: the scalar loops the backend always had), bit for bit the
 * former results.
 */
#ifndef PIPELM_ONEDNN_OPS_H
#define PIPELM_ONEDNN_OPS_H

#include <stddef.h>

/* on = 1: use the vector loops if this CPU has AVX-512 (F, DQ, BW, VL); 0: never. Returns
 * whether they are used. */
int onednn_ops_select(int on);
/* Whether the vector loops are in use (for describe). */
int onednn_ops_active(void);
/* on = 1: the bf16 precision's kernels, whose rounding differs from the fp32 loops' (GELU as
 * x sigma(2u), onednn_llama.h's RMSNorm and SwiGLU); 0: the fp32 loops' bits; -1: only ask.
 * Returns the setting. The backend's init sets it from the precision. */
int onednn_ops_bf16(int on);

/* Causal softmax of the B*NH*T rows of att (T each), in place, upper triangle zeroed; with
 * out16 not NULL the vector loops also write the probabilities there as bf16 (the next
 * product's input, f32_to_bf16's rounding) in the same pass. Returns 1 when out16 was
 * written, 0 when not (the scalar loops: the caller converts). doc (B*T) or NULL: document
 * masking (backend_ops.h), row (b, h, t) keeps only columns doc[b T + t]..t (NH: heads per
 * sequence, to find b). */
int onednn_softmax_causal(float *att, unsigned short *out16, int BH, int T, const int *doc, int NH);
/* Its backward, in place on datt: dpre = a (datt - rowsum(a datt)); out16 and doc as above. */
int onednn_softmax_causal_bwd(float *datt, unsigned short *out16, const float *att, int BH, int T, const int *doc,
                              int NH);

int onednn_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                         int N, int C);
int onednn_layernorm_bwd_input(float *dinp, const float *dout, const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C);
int onednn_layernorm_bwd_weight(float *dw, float *db, const float *dout, const float *inp, const float *mean,
                                const float *rstd, int N, int C);
int onednn_gelu_fwd(float *out, const float *inp, size_t n);
int onednn_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n);
int onednn_crossentropy_fwd(float *losses, float *logits, const int *targets, int N, int V, int Vp);
int onednn_crossentropy_bwd(float *probs, const int *targets, float dloss, int N, int V, int Vp);
int onednn_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2, float eps,
                 float wd, int t);
int onednn_sumsq(const float *x, size_t n, double *out);

#endif
