/*
 * model.h — GPT-2 (as llm.c defines it) and Llama 3 (as llm.c's train_llama3.py defines it,
 * model_llama.c; cfg.arch says which): dimensions, the one table of parameter tensors
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

/* The architectures (model_config.arch). */
enum { MODEL_GPT2 = 0, MODEL_LLAMA = 1 };

/* Model dimensions, one struct for every architecture. Vp = V rounded up to a multiple of 128;
 * for GPT-2 NKV = NH, H = 4 C and the Llama fields are 0. */
typedef struct {
    int V, Vp, maxT, L, NH, C;
    int arch;              /* MODEL_GPT2 | MODEL_LLAMA */
    int NKV, H;            /* key/value heads (NH for GPT-2), MLP hidden size (4 C for GPT-2) */
    /* Llama only (llm.c's Llama 3 header) */
    int multiple_of;       /* the MLP hidden size is rounded up to a multiple of it */
    int use_scaled_rope;   /* 1: Llama 3.1's frequency scaling of the rotary embedding */
    int ver_major, ver_minor; /* Llama version the file names (3, 1) */
    float ffn_mult;        /* ffn_dim_multiplier; <= 0: none */
    float norm_eps;        /* RMSNorm epsilon */
    float rope_theta;      /* rotary base */
} model_config;

/* Tensor kinds: GPT-2's 16 in llm.c file order, then Llama's own. A Llama model uses wte,
 * qkv_w, attproj_w, fc_w (the MLP's "up" input, llm.c c_fc), fcproj_w and lnf_w (the final
 * RMSNorm) with the meanings they have in GPT-2, plus the kinds below. */
enum {
    P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB, P_LN2W, P_LN2B,
    P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB,
    P_ATTNORMW,  /* Llama: the RMSNorm weight before attention (C) */
    P_MLPNORMW,  /* Llama: the RMSNorm weight before the MLP (C) */
    P_FC2W,      /* Llama: the MLP's gate input, through silu (llm.c c_fc2, Meta w1) (H, C) */
    P_LMHEAD,    /* Llama: the untied output head (Vp, C) */
    P_NKINDS
};
#define P_NKINDS_GPT2 16
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
    float *fc2w;  /* Llama: gate (ln1w / ln2w hold the RMSNorm weights, the biases are NULL) */
} block_params;

/* Saved activations of one block for one micro-batch. */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd;   // (N, C), (N), (N)
    float *qkv;                         // (N, 3C)
    float *att;                         // (B, NH, T, T) softmax probabilities
    float *atty;                        // (N, C) attention output before the projection
    float *res2;                        // (N, C) x + attproj(...)
    float *ln2, *ln2_mean, *ln2_rstd;   // (N, C), (N), (N)
    float *fch, *fch_gelu;              // (N, 4C) each (Llama: (N, H) up, up * silu(gate))
    float *fch2;                        // Llama: (N, H) gate
    float *res3;                        // (N, C) block output
} block_acts;
/* Llama's use of block_acts: ln1/ln1_rstd and ln2/ln2_rstd the RMSNorms (no means), qkv the
 * rotated (N, (NH + 2 NKV) HS) projections. */

/* Output gradients of one block's weight ops, left by the input part for the weight part. */
typedef struct {
    float *fcproj;   // (N, C)  dL/d(res3) = dL/d(fcproj output)
    float *fc;       // (N, 4C) dL/d(fch)
    float *ln2;      // (N, C)  dL/d(ln2 output)
    float *attproj;  // (N, C)  dL/d(res2)
    float *qkv;      // (N, 3C) dL/d(qkv)
    float *ln1;      // (N, C)  dL/d(ln1 output)
    float *fc2;      // Llama: (N, H) dL/d(gate)
} block_douts;

/* The sizes one block's math works on, and (Llama) what it shares across blocks: the RoPE
 * tables and one transient scratch of N max(H, QKV) floats (backend memory). */
typedef struct {
    int B, T, C, NH, N;
    int NKV, HS, H, QKV;            /* QKV = (NH + 2 NKV) HS, the fused projection's width */
    float eps;
    const float *fcos, *fsin;       /* (T, HS/2) */
    float *scratch;
} block_dims;

/* Fill cfg from dimensions; computes Vp. Returns 0 or PL_EINVAL with a message in err. */
int gpt2_config_make(model_config *cfg, int V, int maxT, int L, int NH, int C, char *err, size_t errlen);
/* Parameter count of the whole model (wte once), as llm.c counts it. */
size_t gpt2_num_params(const model_config *cfg);
/* Forward FLOPs of each part for one token at sequence length T (block, embedding, head). */
double gpt2_block_flops(const model_config *cfg, int T);
double gpt2_head_flops(const model_config *cfg);

/* Lay out the tensors of blocks [l0, l1) plus the embeddings (has_embed) and the final norm
 * and the tied head copy of wte (has_head) into out (capacity 16 + 12 (l1 - l0)); returns
 * the count, and the total floats (each tensor 64-byte aligned) in *total. */
int gpt2_layout(const model_config *c, int l0, int l1, int has_embed, int has_head, param_tensor *out,
                size_t *total);
/* Initial values of one tensor (GPT-2's: N(0, 0.02), residual projections scaled by
 * 1/sqrt(2L), LayerNorm weight 1, biases 0, padded vocabulary rows 0), from a stream seeded
 * by (seed, kind, layer) so the values do not depend on the split. host holds t->numel. */
void gpt2_init_tensor(const model_config *c, const param_tensor *t, unsigned long long seed, float *host);

/* ---- both architectures (dispatch on cfg->arch) ---- */
/* Tensors of a stage holding nb blocks, at most (the table's capacity). */
int model_max_tensors(const model_config *c, int nb);
/* Tensors of the whole model (one wte) in schema order: GPT-2 4 + 12 L, Llama 3 + 7 L. */
int model_num_tensors(const model_config *c);
/* The stage's tensor table (gpt2_layout or llama_layout). */
int model_layout(const model_config *c, int l0, int l1, int has_embed, int has_head, param_tensor *out,
                 size_t *total);
/* Initial value of a tensor (gpt2_init_tensor or llama_init_tensor). */
void model_init_tensor(const model_config *c, const param_tensor *t, unsigned long long seed, float *host);
/* Parameter count of the whole model, forward FLOPs per token of a block and of the head,
 * parameters of one block and of the embedding / head parts. */
size_t model_num_params(const model_config *c);
double model_block_flops(const model_config *c, int T);
double model_head_flops(const model_config *c);
size_t model_block_params(const model_config *c);
size_t model_embed_params(const model_config *c);
size_t model_head_params(const model_config *c, int has_embed); /* final norm (+ head unless tied and held) */
/* Floats of activations one block keeps per micro-batch (everything, attention probabilities
 * excluded), and of its output gradients, per token. */
size_t model_block_act_floats_per_token(const model_config *c);
const char *model_arch_name(int arch);
/* Training FLOPs per token (forward + backward), as the benchmark's MFU counts them: 6 per
 * weight that multiplies (GPT-2: every parameter, as llm.c counts; Llama: wte is a lookup
 * and left out) plus 6 L C T for attention. */
double model_train_flops_per_token(const model_config *c, int T);
/* Append one tensor (named "kind" or "h.<layer>.kind") to a table, 64-byte aligned. */
void model_add_tensor(param_tensor *out, int *n, size_t *off, int kind, int layer, int ndim, int d0, int d1);

/* ---- Llama (model_llama.c) ---- */
/* How the model checks (config_check_llama in config.c) name a setting in a message: as the
 * option (`--norm-eps 1.5 is out of range`), as a checkpoint attribute (`attribute
 * /config/norm_eps = 1.5 ...`) or as an llm.c header field (`norm-eps = 1.5 ...`). */
typedef enum { CFG_NAME_OPTION, CFG_NAME_ATTR, CFG_NAME_HEADER } cfg_naming;

/* Fill cfg for Llama (version 3.1): the MLP hidden size from ffn_mult and multiple_of as
 * llm.c's train_llama3.py computes it. Refuses C % NH, an odd head size, sizes too large, and
 * whatever config_check_llama refuses (its messages named by `naming`). */
int llama_config_make(model_config *cfg, int V, int maxT, int L, int NH, int NKV, int C, int multiple_of,
                      float ffn_mult, float norm_eps, float rope_theta, int use_scaled_rope, cfg_naming naming,
                      char *err, size_t errlen);
/* MLP hidden size: int(2 * 4C / 3), times ffn_mult (if > 0), rounded up to multiple_of. */
int llama_hidden_size(int C, float ffn_mult, int multiple_of);
int llama_layout(const model_config *c, int l0, int l1, int has_embed, int has_head, param_tensor *out,
                 size_t *total);
void llama_init_tensor(const model_config *c, const param_tensor *t, unsigned long long seed, float *host);
/* The RoPE tables for positions 0..T-1 (host, T x HS/2 each), computed in double. */
void llama_rope_tables(const model_config *c, int T, float *fcos, float *fsin);
int llama_block_forward(const backend *be, const block_dims *d, const block_params *p, block_acts *a,
                        const float *x);
int llama_block_backward_input(const backend *be, const block_dims *d, const block_params *p,
                               const block_acts *a, const float *x, float *dres, const block_douts *dd);
int llama_block_backward_weight(const backend *be, const block_dims *d, block_params *g, const block_acts *a,
                                const float *x, const block_douts *dd);

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
