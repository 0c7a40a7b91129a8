/*
 * model.h — the model every module shares: its dimensions (model_config, one struct for
 * every architecture, with the Llama-only settings in their own sub-struct), the global
 * parameter kinds (checkpoint leaf names), the stage's tensor table, and what is derived from
 * the architecture's descriptor (arch.h): layout, initial values, parameter counts, FLOPs and
 * activation bytes. Nothing here asks which architecture a config is: every function walks
 * the rows of arch_of(cfg). GPT-2 is model.c, Llama 3 model_llama.c, the walkers arch.c.
 *
 * A block's backward comes in two parts, as zero-bubble schedules need them: the input part
 * (dL/dx, through every op) and the weight part (dW += dY^T X and the bias and norm sums).
 * The input part leaves, per block, the output gradients each weight op needs; the weight
 * part reads them. Shapes: B micro-batch sequences, T positions, C channels, NH heads, N = B*T.
 */
#ifndef PIPELM_MODEL_H
#define PIPELM_MODEL_H

#include <stddef.h>
#include "pipelm/backend.h"
#include "util/exact.h"

/* Architecture ids: model_config.arch, the index of the architecture's row in the registry
 * (arch.h). Only code that has not moved to the table yet compares against them. */
enum { MODEL_GPT2 = 0, MODEL_LLAMA = 1, MODEL_MIXTRAL = 2 };

/* Llama's own settings (llm.c's Llama 3 header). */
typedef struct {
    int multiple_of;       /* the MLP hidden size is rounded up to a multiple of it */
    int use_scaled_rope;   /* 1: Llama 3.1's frequency scaling of the rotary embedding */
    int ver_major, ver_minor; /* Llama version the file names (3, 1) */
    float ffn_mult;        /* ffn_dim_multiplier; <= 0: none */
    float norm_eps;        /* RMSNorm epsilon */
    float rope_theta;      /* rotary base */
    /* Llama 3.1's rope_scaling (used when use_scaled_rope): factor, low and high frequency
     * factors, original context (llama_config_make's defaults 8, 1, 4, 8192; Llama 3.2: 32) */
    float rope_factor, rope_low_freq, rope_high_freq;
    int rope_orig_ctx;
} llama_config;

/* Mixtral's sparse MoE layer (archs/mixtral.c); all zero for a dense architecture. */
enum { MOE_ROUTER_SOFTMAX = 0, MOE_ROUTER_SIGMOID_BIAS = 1 };
typedef struct {
    int n_experts;         /* E routed experts per layer */
    int top_k;             /* K experts a token is sent to (1..E) */
    int ffn;               /* F: each expert's SwiGLU hidden size */
    int shared;            /* S always-on experts (DeepSeek-V3), one SwiGLU of hidden S F; 0: none */
    int router;            /* MOE_ROUTER_*: softmax (Mixtral) or sigmoid scores with a balancing bias */
    float aux_coef;        /* load-balancing loss coefficient (Mixtral's router_aux_loss_coef) */
    float bias_rate;       /* sigmoid-bias router: the bias step per optimizer step */
    float capacity;        /* capacity factor c: an expert takes at most ceil(c N K / E) tokens; 0: dropless */
    float mb_share;        /* a run's: one micro-batch's share of the step (Bm / Bg), the aux loss's weight */
} moe_config;

/* Document masking of packed sequences (--doc-mask, --doc-token, --doc-positions): a run's
 * setting that train.c puts in each stage's config, as att_cols. A token equal to token opens a
 * document (it belongs to the document that follows it: llm.c's data puts <|endoftext|> before
 * every document); attention stops at the last such token at or before a row (backend_ops.h's
 * doc); with restart, the rotary positions count from it (0 at the document token). */
typedef struct {
    int mask;              /* 1: on */
    int token;             /* the document token */
    int restart;           /* 1: positions restart at each document (rotary embeddings only) */
} model_docs;

/* Model dimensions, one struct for every architecture. Vp = V rounded up to a multiple of 128;
 * for GPT-2 NKV = NH, H = 4 C and the Llama settings (cfg.llama) are 0. */
typedef struct {
    int V, Vp, maxT, L, NH, C;
    int arch;              /* architecture id: arch_of(cfg) is its descriptor */
    int NKV, H;            /* key/value heads (NH for GPT-2), MLP hidden size (4 C for GPT-2) */
    llama_config llama;    /* Llama's own settings (model_llama.c; Mixtral's attention too) */
    moe_config moe;        /* Mixtral's MoE settings (archs/mixtral.c) */
    int tie_embed;         /* 1: the head's matrix is the token embedding (Llama 3.2's
                            * tie_word_embeddings); GPT-2 ties by its table and leaves it 0 */
    int tp, tpr;           /* tensor parallelism (tp.h): a stage's config on TP rank tpr of tp > 1 ranks
                            * has its blocks' sliced dimensions (AD_QKV, AD_H, AD_CA, AD_NHT local);
                            * 0 (every other config, the whole model): none */
    int cp, cpr;           /* context parallelism (parallel/cp.h): a stage's config on CP rank cpr of
                            * cp > 1 ranks holds T / cp tokens of each sequence, chunks cpr and
                            * 2 cp - 1 - cpr of 2 cp (model_cp_pos); 0 (every other config): none */
    int att_cols;          /* a stage's config: floats per (token, head) of the attention buffer
                            * (AD_NHT) when its backend keeps fewer than T there (backend.h's
                            * attention_cols: a fused kernel's output and log-sum-exp, hs + 1);
                            * 0 (every other config): T, the causal probabilities */
    model_docs docs;       /* a stage's config: document masking (--doc-mask); zero: none */
} model_config;

/* Parameter kinds, global across architectures: checkpoint leaf names and the key of each
 * tensor's initial-value stream. GPT-2's 16 in llm.c file order, then Llama's own; an
 * architecture's rows (arch.h) say which it uses. */
enum {
    P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB, P_LN2W, P_LN2B,
    P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB,
    P_ATTNORMW,  /* Llama: the RMSNorm weight before attention (C) */
    P_MLPNORMW,  /* Llama: the RMSNorm weight before the MLP (C) */
    P_FC2W,      /* Llama: the MLP's gate input, through silu (llm.c c_fc2, Meta w1) (H, C) */
    P_LMHEAD,    /* Llama: the untied output head (Vp, C) */
    P_ROUTERW,   /* Mixtral: the router (gate) (E, C) */
    P_EXPW1,     /* Mixtral: the experts' gate inputs, through silu (E F, C), expert e rows [eF, (e+1)F) */
    P_EXPW3,     /* Mixtral: the experts' up inputs (E F, C) */
    P_EXPW2,     /* Mixtral: the experts' down projections (E C, F) */
    P_ROUTERB,   /* Mixtral: the sigmoid-bias router's balancing bias (E); not trained by AdamW */
    P_SHW1,      /* Mixtral: the shared experts' gate input (S F, C) */
    P_SHW3,      /* Mixtral: the shared experts' up input (S F, C) */
    P_SHW2,      /* Mixtral: the shared experts' down projection (C, S F) */
    P_NKINDS
};
#define P_NKINDS_GPT2 16
extern const char *const param_kind_name[P_NKINDS]; /* checkpoint leaf names: "wte", "qkv_w".. */

/* Which part of the model a tensor belongs to. */
enum { PART_EMBED = 0, PART_BLOCK = 1, PART_HEAD = 2 };

/* One named tensor of a stage's parameters. */
typedef struct {
    char name[32];     /* "wte", "wpe", "h.3.qkv_w", "lnf_w" */
    int kind;          /* P_* */
    int layer;         /* block index for block tensors, else -1 */
    size_t offset;     /* in floats, into stage.params / grads / m / v */
    size_t numel;
    int ndim, shape[2];
    int decay;         /* 1: AdamW weight decay (the row's flag) */
    int part;          /* PART_* */
    int row;           /* index of its row in the part's table (the architecture's own enum) */
    int rule;          /* the row's update rule (arch.h: UPDATE_*): AdamW, or the balancing bias's sign step */
    int tied_copy;     /* 1: the head's copy of an embedding tensor the first stage owns (GPT-2's
                        * wte on a last stage without the embeddings): counted, written and
                        * reduced once, from the owner */
} param_tensor;

/* The most rows one part of an architecture's table has (block parameters, activations...). */
#define ARCH_MAX_ROWS 24

/* Pointers to one block's tensors (parameters, gradients, activations or output gradients)
 * inside a stage buffer, indexed by the architecture's own enum for that table. */
typedef struct {
    float *t[ARCH_MAX_ROWS];
} block_ptrs;

/* The sizes one block's math works on, the config, and the stage-wide buffers the
 * architecture asks for (its scratch rows: Llama's rotary tables and block scratch). */
typedef struct {
    int B, T, C, NH, N;
    int NKV, HS, H, QKV;            /* QKV = (NH + 2 NKV) HS, the fused projection's width; with
                                     * --tp (cfg->tp > 1) NH, NKV, H, QKV are this rank's slice */
    const model_config *cfg;
    float *const *x;                /* the stage's scratch rows, by the architecture's enum */
    pl_fx *acc;                     /* --grad-accum exact: the stage's fixed-point sums (acc[i] is
                                     * grads[i]'s), for a weight part that folds a share early
                                     * (--ep: one per source rank); NULL otherwise */
    float *grads;
    const int *doc;                 /* (N) document masking: each row's document's first row in its
                                     * sequence (backend memory), or NULL: plain causal */
    const float *pcos, *psin;       /* (N, HS/2) per-row rotary tables when positions restart at
                                     * each document (backend memory), else NULL: the scratch's (T, HS/2) */
} block_dims;

/* How the model checks (config_check_llama in config.c) name a setting in a message: as the
 * option (`--norm-eps 1.5 is out of range`), as a checkpoint attribute (`attribute
 * /config/norm_eps = 1.5 ...`) or as an llm.c header field (`norm-eps = 1.5 ...`). */
typedef enum { CFG_NAME_OPTION, CFG_NAME_ATTR, CFG_NAME_HEADER } cfg_naming;

/* ---- GPT-2 (model.c) and Llama (model_llama.c): the config makers callers name ---- */
/* Fill cfg for GPT-2 from dimensions; computes Vp. Returns 0 or PL_EINVAL with a message. */
int gpt2_config_make(model_config *cfg, int V, int maxT, int L, int NH, int C, char *err, size_t errlen);
/* Fill cfg for Llama (version 3.1): the MLP hidden size from ffn_mult and multiple_of as
 * llm.c's train_llama3.py computes it. Refuses C % NH, an odd head size, sizes too large, and
 * whatever config_check_llama refuses (its messages named by `naming`). */
int llama_config_make(model_config *cfg, int V, int maxT, int L, int NH, int NKV, int C, int multiple_of,
                      float ffn_mult, float norm_eps, float rope_theta, int use_scaled_rope, cfg_naming naming,
                      char *err, size_t errlen);
/* The RoPE tables for positions 0..T-1 (host, T x HS/2 each), computed in double. */
void llama_rope_tables(const model_config *c, int T, float *fcos, float *fsin);
/* Parameter count of the whole model (model_num_params; the name tests and ckpt.c call). */
size_t gpt2_num_params(const model_config *cfg);

/* ---- derived from the architecture's table (arch.c) ---- */
/* Tensors of a stage holding nb blocks, at most (the table's capacity). */
int model_max_tensors(const model_config *c, int nb);
/* Tensors of the whole model (a tied copy once) in schema order: GPT-2 4 + 12 L, Llama 3 + 7 L. */
int model_num_tensors(const model_config *c);
/* Lay out the tensors of blocks [l0, l1) plus the embeddings (has_embed) and the head
 * (has_head; a tied head row is laid out only without the embeddings) into out (capacity
 * model_max_tensors); returns the count, and the total floats (each tensor 64-byte aligned). */
int model_layout(const model_config *c, int l0, int l1, int has_embed, int has_head, param_tensor *out,
                 size_t *total);
/* 1 if a tensor's gradient takes part in the tied sum: the head's tied copy, or the embedding
 * row a head row is tied to (GPT-2's wte on either end); 0 otherwise (every Llama tensor). */
int model_tensor_is_tied(const model_config *c, const param_tensor *t);
/* Initial values of one tensor by its row's rule (norm weights 1, biases 0, matrices N(0, 0.02),
 * residual projections scaled by 1/sqrt(2L), padded vocabulary rows 0), from a stream seeded
 * by (seed, kind, layer) so the values do not depend on the split. host holds t->numel. */
void model_init_tensor(const model_config *c, const param_tensor *t, unsigned long long seed, float *host);
/* Parameter count of the whole model (each tensor once, padded vocabulary included), of one
 * block, of the embeddings, and of the head part (its tied rows only when the stage does not
 * hold the embeddings). */
size_t model_num_params(const model_config *c);
size_t model_block_params(const model_config *c);
size_t model_embed_params(const model_config *c);
size_t model_head_params(const model_config *c, int has_embed);
/* Forward FLOPs per token of a block (2 per weight of its matrices, plus attention's two
 * products over the full T) and of the head (2 Vp C, plus ~5 V for the softmax). */
double model_block_flops(const model_config *c, int T);
double model_head_flops(const model_config *c);
/* Training FLOPs per token (forward + backward), as the benchmark's MFU counts them: 6 per
 * weight the rows count (GPT-2: every parameter, as llm.c counts; Llama: wte is a lookup and
 * left out) plus 6 L C T for attention. */
double model_train_flops_per_token(const model_config *c, int T);
/* Floats one block keeps per token under no recomputation, attention probabilities excluded. */
size_t model_block_act_floats_per_token(const model_config *c);
/* Bytes of one activation slot of a stage (its input, its tokens on the first stage, the
 * blocks' kept activations under recompute mode `mode`, the head's), 64-byte aligned each,
 * exactly as the stage carves its slot arena. */
size_t model_slot_act_bytes(const model_config *c, int Bm, int T, int nb, int has_embed, int has_head, int mode);
/* The embedding row that head row `row` holds the values of in this config: the table's tie
 * (GPT-2's wte), or, for the head's matrix when cfg->tie_embed, the token embedding (embedding
 * row 0 of every architecture); -1 when untied. */
int model_head_row_tied(const model_config *c, int row);
/* 1 if any head row of the config reads an embedding (the tied sum and comparison run). */
int model_is_tied(const model_config *c);
/* The architecture's name ("gpt2", "llama") of an id. */
const char *model_arch_name(int arch);
/* Tensor parallelism (arch.c): how a stage tensor on TP rank t of T is cut from the whole
 * tensor. TPS_ROWS: its rows are the whole tensor's row ranges [lo[k], lo[k] + n[k]) in
 * order (column-parallel products: qkv by heads, q | k | v each, the MLP's first products);
 * TPS_COLS: every row's columns [lo[0], lo[0] + n[0]) (row-parallel products); TPS_REPL: the
 * whole tensor (norms, biases of row-parallel products, embeddings, head). rows, cols: the
 * whole tensor's shape. */
enum { TPS_REPL = 0, TPS_ROWS = 1, TPS_COLS = 2 };
typedef struct {
    int mode, nseg;
    int lo[3], n[3];
    int rows, cols;
} tp_slice;
/* The cut of stage tensor t (laid out from a config with tp > 1) out of the whole model's
 * (full: tp 0); kv heads fewer than the ranks are replicated (rank t holds kv head
 * t / (T / NKV)). */
void model_tp_slice(const model_config *full, int T, int t, const param_tensor *lt, tp_slice *s);
/* Copy between a whole tensor's floats and a slice's: to_local = 1 cuts local from whole,
 * 0 puts local back into whole (host memory both). */
void model_tp_copy(const tp_slice *s, float *whole, float *local, int to_local);
/* A block's TP sum of a partial product, in place (the hook tp.c installs: a process holds
 * one TP group), or nothing without --tp (cfg->tp <= 1); phase: where, for messages. A
 * row-parallel product's bias is added by TP rank 0 only (cfg->tpr), before the sum. */
enum { TP_PHASE_FWD = 0, TP_PHASE_BWD = 1 };
typedef int (*model_tp_hook)(void *ctx, float *buf, size_t n, int phase);
/* The vocabulary-parallel head's reductions of host arrays (n per-row values): op 0 the sum
 * in rank order, 1 the maximum. */
enum { TP_HOST_SUM = 0, TP_HOST_MAX = 1 };
typedef int (*model_tp_host_hook)(void *ctx, float *host, size_t n, int op);
void model_set_tp_hook(model_tp_hook fn, model_tp_host_hook host_fn, void *ctx);
int model_tp_sum(const block_dims *d, float *buf, size_t n, int phase);
/* The host reduction of the installed hook (a config with tp > 1 only). */
int model_tp_host_reduce(float *host, size_t n, int op);
/* The vocabulary slice of TP rank tpr of tp (a stage config): rows [*lo, *lo + *n) of the
 * (Vp, C) token table and head matrix, ceil(Vp / tp) rows each but the last's. The local
 * tensor (AD_VP rows: ceil(Vp / tp) + 1) holds them first, zero padding, then a sink row: the
 * embedding's lookup of a token outside the slice reads it (zero) and its gradient lands there
 * (zeroed after the embedding's weight part). */
void model_tp_vocab(const model_config *c, int *lo, int *n);
/* The dimension checks of --tp T for a config: NH, H (and NKV unless T % NKV == 0) divisible
 * by T. PL_EINVAL with a message naming the setting. */
int model_tp_check(const model_config *c, int T, char *err, size_t errlen);

/* Context parallelism (model_cp.c): a stage config with cp > 1 holds local rows t < T of each
 * sequence (T = the whole sequence / cp); model_cp_pos is the position of local row t in the
 * whole sequence (t itself without --cp): the positions the embeddings and RoPE take. The
 * blocks' attention goes through model_attention_fwd / _bwd: the backend's
 * attention_gqa_fwd / _bwd, or with cp > 1 the hook the run installs (cp.c: the keys and
 * values gathered from the CP ranks, their gradients sent back), which keeps O and the
 * log-sum-exp, hs + 1 floats per (token, head), in att. */
int model_cp_pos(const model_config *c, int T, int t);
typedef int (*model_cp_att_fwd)(void *ctx, float *out, float *att, const float *qkv, int B, int T, int NH, int NKV,
                                int HS);
typedef int (*model_cp_att_bwd)(void *ctx, float *dqkv, const float *dout, const float *qkv, const float *att, int B,
                                int T, int NH, int NKV, int HS);
void model_set_cp_hook(model_cp_att_fwd fwd, model_cp_att_bwd bwd, void *ctx);
int model_attention_fwd(const backend *be, const block_dims *d, float *out, float *att, const float *qkv, int NKV);
int model_attention_bwd(const backend *be, const block_dims *d, float *dqkv, const float *dout, const float *qkv,
                        const float *att, int NKV);

/* Mixtral (archs/mixtral.c): the router's statistics of this process's weight parts since the
 * last call, which resets them: [0] the step's aux loss share (sum over its layers and
 * micro-batches of mb_share aux / L), [1] dropped (token, expert) assignments, [2] the sum over
 * (layer, micro-batch) of max / mean tokens per expert, [3] that count. All zero for a dense model. */
void model_moe_stats_take(double out[4]);

/* Expert parallelism (--ep E, parallel/ep.h): the exchanges of the EP group the MoE layer
 * calls, installed by the run (model_set_ep_hook; size 1 or no hook: every rank computes its
 * own tokens' experts). counts: n ints to each of the size ranks (send[j n ..]) and n from each
 * (recv[j n ..]). rows: nbuf arrays exchanged at once, array i sends scount[j] rows of width[i]
 * floats to rank j from send[i] (rank j's rows after rank j - 1's) and receives rcount[j] rows
 * from rank j into recv[i] (likewise in rank order). phase (EP_PHASE_*) names the exchange. */
enum { EP_PHASE_DISPATCH, EP_PHASE_COMBINE, EP_PHASE_BWD_DISPATCH, EP_PHASE_BWD_COMBINE, EP_PHASE_WGRAD,
       EP_NPHASE };
typedef struct {
    int size, rank;
    void *ctx;
    int (*counts)(void *ctx, const int *send, int *recv, int n, int phase);
    int (*rows)(void *ctx, int nbuf, const float *const *send, float *const *recv, const int *width,
                const int *scount, const int *rcount, int phase);
} model_ep_hook;
/* Install (h copied) or remove (NULL) the EP group's exchanges for this process. */
void model_set_ep_hook(const model_ep_hook *h);

/* Append one tensor (named "kind" or "h.<layer>.kind") to a table, 64-byte aligned. */
void model_add_tensor(param_tensor *out, int *n, size_t *off, int kind, int layer, int ndim, int d0, int d1);

#endif
