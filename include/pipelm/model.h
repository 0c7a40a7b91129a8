/*
 * model.h — GPT-2 (as llm.c defines it) split into pipeline stages.
 *
 * A stage owns a contiguous range of transformer blocks [l0, l1) and, optionally, the
 * embeddings (first stage) and the final LayerNorm + tied LM head + loss (last stage); with one
 * rank one stage owns everything. Its parameters live in one backend buffer, laid out block by
 * block and described by a table of named tensors (names are per layer, as in the checkpoint
 * schema, so nothing depends on the stage split). Activations live in "slots": one per
 * micro-batch in flight, acquired by a forward and released by the matching backward.
 * The last stage runs the head's backward inside its forward (the loss gradient is known
 * then), so it keeps only dL/d(lnf) per slot instead of the (N, Vp) logits. The token
 * embedding's gradient from the head is kept apart (dwte_head) and added to the embedding's
 * own gradient once per step, so the sum is the same on one rank and across two ranks.
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
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *res3;
} block_acts;

/* Everything one in-flight micro-batch needs for its backward. */
typedef struct {
    int in_use, mb;
    float *x_in;        /* (N, C) stage input (embedding output on the first stage) */
    int *tok;           /* (N) input tokens, first stage */
    block_acts *blocks; /* nb */
    float *lnf, *lnf_mean, *lnf_rstd, *dlnf; /* last stage */
} act_slot;

typedef struct {
    gpt2_config cfg;
    int l0, l1, nb;              /* blocks [l0, l1), nb = l1 - l0 */
    int has_embed, has_head;
    int Bm, T, N;                /* micro-batch sequences, sequence length, N = Bm*T */
    const backend *be;

    size_t nparams;              /* floats in params (a tied wte held twice counts twice) */
    float *params, *grads, *m, *v;
    int ntensors;
    param_tensor *tensors;
    float *wte, *wpe, *lnfw, *lnfb;             /* into params, NULL if not owned */
    float *dwte, *dwpe, *dlnfw, *dlnfb;         /* into grads */
    float *dwte_head;                           /* head's share of dwte (last stage) */
    block_params *bp, *bg;                      /* nb each: params and grads */

    int nslots, slots_in_use, slots_peak;
    act_slot *slots;
    /* scratch shared by every slot's backward */
    float *dres, *dbuf_c, *dbuf_4c, *dbuf_3c, *logits;
    int *tgt;
    float *losses;
} stage;

/* Fill cfg from dimensions; computes Vp. Returns 0 or PL_EINVAL with a message in err. */
int gpt2_config_make(gpt2_config *cfg, int V, int maxT, int L, int NH, int C, char *err, size_t errlen);
/* Parameter count of the whole model (wte once), as llm.c counts it. */
size_t gpt2_num_params(const gpt2_config *cfg);
/* Forward FLOPs of each part for one token at sequence length T (block, embedding, head). */
double gpt2_block_flops(const gpt2_config *cfg, int T);
double gpt2_head_flops(const gpt2_config *cfg);

/* Build a stage and allocate its parameters, gradients, optimizer state and nslots
 * activation slots for micro-batches of Bm sequences of length T. */
int stage_init(stage *st, const gpt2_config *cfg, int l0, int l1, int has_embed, int has_head,
               int Bm, int T, int nslots, const backend *be, char *err, size_t errlen);
void stage_free(stage *st);
/* Initialise parameters as GPT-2 does (N(0, 0.02), residual projections scaled by
 * 1/sqrt(2L), LayerNorm weight 1), each tensor from its own seeded stream so that the values
 * do not depend on the split. */
void stage_init_params(stage *st, unsigned long long seed);
/* Find a tensor by kind and layer; NULL if this stage does not hold it. */
const param_tensor *stage_find_tensor(const stage *st, int kind, int layer);

/* Forward one micro-batch into a free slot (returned in *slot_out). tok (host, N) on the
 * first stage, else x_in (backend, N*C). On the last stage targets (host, N) give the loss:
 * *loss_sum receives the sum of the N token losses and, if dloss > 0, the head's backward runs
 * with dL/dlogit scale dloss. Returns 0, or PL_EINVAL if no slot is free. */
int stage_forward(stage *st, int mb, const int *tok, const float *x_in, const int *targets,
                  float dloss, double *loss_sum, int *slot_out);
/* Output activation (backend, N*C) of the micro-batch in a slot (to send to the next stage). */
float *stage_output(stage *st, int slot);
/* Backward of the micro-batch in a slot: dout (backend, N*C) from the next stage unless this
 * is the last stage. Accumulates parameter gradients; leaves dL/d(input) in stage_dinput().
 * Releases the slot. */
int stage_backward(stage *st, int slot, const float *dout);
float *stage_dinput(stage *st);
/* Slot holding micro-batch mb, or -1. */
int stage_slot_of(const stage *st, int mb);
/* Forget every slot (after an evaluation forward that has no backward). */
void stage_release_all(stage *st);
/* Fold the LM head's share of the tied wte gradient into dwte: added on a stage that holds
 * both ends, copied on a last stage (the two ranks then sum with MPI_Allreduce). Float
 * addition of two values is commutative, so both paths give the same bits. */
void stage_tied_grads_local(stage *st);
/* Zero all gradients (start of a step). */
void stage_zero_grads(stage *st);

#endif
