/*
 * model.h — GPT-2 (as llm.c defines it): dimensions, the one table of parameter tensors
 * (name, kind, layer, shape, decay) that the stage, the optimizer, checkpoints and llm.c
 * files all read, and the math of one transformer block as calls to the backend.
 *
 * A block's backward comes in two parts, as zero-bubble schedules need them: the input part
 * (dL/dx, through every op) and the weight part (dW += dY^T X and the bias and LayerNorm
 * sums). The input part leaves, per block, the output gradients each weight op needs
 * (block_douts); the weight part reads them. Shapes: B micro-batch sequences, T positions,
 * C channels, NH heads, N = B*T rows.
 */
#ifndef PIPELM_MODEL_H
#define PIPELM_MODEL_H

#include <stddef.h>
#include "pipelm/backend.h"

/* Model dimensions. Vp = V rounded up to a multiple of 128. */
typedef struct {
    int V, Vp, maxT, L, NH, C;
} gpt2_config;

/* The 16 llm.c tensor kinds, in llm.c file order. */
enum {
    P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB, P_LN2W, P_LN2B,
    P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB, P_NKINDS
};
extern const char *const param_kind_name[P_NKINDS]; /* checkpoint leaf names: "wte", "qkv_w".. */

/* One named tensor of a stage's parameters. */
typedef struct {
    char name[32];     /* "wte", "wpe", "h.3.qkv_w", "lnf_w" */
    int kind;          /* P_* */
    int layer;         /* block index for block tensors, else -1 */
    size_t offset;     /* in floats, into stage.params / grads / m / v */
    size_t numel;
    int ndim, shape[2];
    int decay;         /* 1 for 2-D weights (AdamW weight decay) */
} param_tensor;

/* Pointers to one block's parameters (or gradients) inside a stage buffer. */
typedef struct {
    float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    float *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} block_params;

/* Saved activations of one block for one micro-batch. */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd;   // (N, C), (N), (N)
    float *qkv;                         // (N, 3C)
    float *att;                         // (B, NH, T, T) softmax probabilities
    float *atty;                        // (N, C) attention output before the projection
    float *res2;                        // (N, C) x + attproj(...)
    float *ln2, *ln2_mean, *ln2_rstd;   // (N, C), (N), (N)
    float *fch, *fch_gelu;              // (N, 4C) each
    float *res3;                        // (N, C) block output
} block_acts;

/* Output gradients of one block's weight ops, left by the input part for the weight part. */
typedef struct {
    float *fcproj;   // (N, C)  dL/d(res3) = dL/d(fcproj output)
    float *fc;       // (N, 4C) dL/d(fch)
    float *ln2;      // (N, C)  dL/d(ln2 output)
    float *attproj;  // (N, C)  dL/d(res2)
    float *qkv;      // (N, 3C) dL/d(qkv)
    float *ln1;      // (N, C)  dL/d(ln1 output)
} block_douts;

/* The sizes one block's math works on. */
typedef struct {
    int B, T, C, NH, N;
} block_dims;

/* Fill cfg from dimensions; computes Vp. Returns 0 or PL_EINVAL with a message in err. */
int gpt2_config_make(gpt2_config *cfg, int V, int maxT, int L, int NH, int C, char *err, size_t errlen);
/* Parameter count of the whole model (wte once), as llm.c counts it. */
size_t gpt2_num_params(const gpt2_config *cfg);
/* Forward FLOPs of each part for one token at sequence length T (block, embedding, head). */
double gpt2_block_flops(const gpt2_config *cfg, int T);
double gpt2_head_flops(const gpt2_config *cfg);

/* Lay out the tensors of blocks [l0, l1) plus the embeddings (has_embed) and the final norm
 * and the tied head copy of wte (has_head) into out (capacity 16 + 12 (l1 - l0)); returns
 * the count, and the total floats (each tensor 64-byte aligned) in *total. */
int gpt2_layout(const gpt2_config *c, int l0, int l1, int has_embed, int has_head, param_tensor *out,
                size_t *total);
/* Initial values of one tensor (GPT-2's: N(0, 0.02), residual projections scaled by
 * 1/sqrt(2L), LayerNorm weight 1, biases 0, padded vocabulary rows 0), from a stream seeded
 * by (seed, kind, layer) so the values do not depend on the split. host holds t->numel. */
void gpt2_init_tensor(const gpt2_config *c, const param_tensor *t, unsigned long long seed, float *host);

/* One block forward: a from x (N, C). */
int gpt2_block_forward(const backend *be, const block_dims *d, const block_params *p, block_acts *a,
                       const float *x);
/* Input part of one block's backward: on entry dres = dL/d(block output), on exit
 * dL/d(block input) (updated in place); fills g's output gradients in dd. scratch (N, C). */
int gpt2_block_backward_input(const backend *be, const block_dims *d, const block_params *p,
                              const block_acts *a, const float *x, float *dres, const block_douts *dd);
/* Weight part: accumulate g from the activations and the output gradients in dd. */
int gpt2_block_backward_weight(const backend *be, const block_dims *d, block_params *g, const block_acts *a,
                               const float *x, const block_douts *dd);

#endif
