/*
 * stage.h — the layers one pipeline rank owns, and the activations of its micro-batches.
 *
 * A stage owns a contiguous range of transformer blocks [l0, l1) and, optionally, the
 * embeddings (first stage) and the final norm + LM head + loss (last stage); with one rank one
 * stage owns everything. Everything is sized and pointed at by the architecture's tables
 * (arch.h); the stage never asks which architecture it runs. Its parameters and gradients
 * live in one backend buffer each, laid out by the model's tensor table (names are per
 * layer, as in the checkpoint schema, so nothing depends on the split); the optimizer
 * (optim.h) owns the rest of the training state. Activations live in "slots", one per
 * micro-batch in flight, each one allocation carved by the table: a forward
 * acquires one, the backward's input part (stage_backward_input) leaves dL/d(input) and the
 * output gradients the weight part needs, and the weight part (stage_backward_weight)
 * accumulates the parameter gradients and releases the slot. stage_backward is the two in
 * one and gives the same bits. With deferred weights off (the default) the output gradients
 * live in one shared set, so the weight part must follow its input part before the next
 * input part; stage_init_deferred gives every slot its own set for zero-bubble schedules.
 * The last stage runs the head's backward inside its forward (the loss gradient is known
 * then), so it keeps only dL/d(lnf) per slot instead of the (N, Vp) logits. A tied head's
 * gradient (GPT-2's, of wte) is kept apart (dwte_head) and added to the embedding's
 * own gradient once per step, so the sum is the same on one rank and across two ranks.
 */
#ifndef PIPELM_STAGE_H
#define PIPELM_STAGE_H

#include <stddef.h>
#include "pipelm/backend.h"
#include "util/exact.h"
#include "model/arch.h"
#include "model/model.h"

/* Output gradients the stage-level weight ops need, beside the blocks': one allocation. */
typedef struct {
    block_ptrs *blocks; /* nb: each block's, by the architecture's output-gradient enum */
    float *embed;       /* (N, C) dL/d(embedding output), first stage */
    void *arena;        /* the one backend allocation they are carved from */
} stage_douts;

/* Everything one in-flight micro-batch needs for its backward, carved from one allocation. */
typedef struct {
    int in_use, mb;
    int input_done;     /* the input part has run; the weight part is pending */
    float *x_in;        /* (N, C) stage input (embedding output on the first stage) */
    int *tok;           /* (N) input tokens, first stage */
    int *doc;           /* (N) document masking (cfg.docs): each row's document start (model.h's block_dims) */
    float *pcos, *psin; /* (N, HS/2) the rows' rotary tables when positions restart at each document */
    block_ptrs *blocks; /* nb: each block's activations, by the architecture's activation enum (the
                         * rows the recompute mode does not keep point into the stage's shared set) */
    block_ptrs head;    /* the head's activations (last stage), by its head-activation enum */
    stage_douts *dd;    /* its own set (deferred weights) or the stage's shared one */
    void *arena;        /* the slot's one backend allocation */
} act_slot;

typedef struct stage {
    model_config cfg;
    const struct model_arch *arch; /* arch_of(&cfg) */
    int l0, l1, nb;              /* blocks [l0, l1), nb = l1 - l0 */
    int has_embed, has_head;
    int Bm, T, N;                /* micro-batch sequences, sequence length, N = Bm*T */
    const backend *be;

    size_t nparams;              /* floats in params (a tied copy held twice counts twice) */
    float *params, *grads;
    int ntensors;
    param_tensor *tensors;
    float *wte, *dwte;                          /* the token embedding (or the head's tied copy), its gradient */
    block_ptrs ep, eg;                          /* embedding rows (first stage), by the architecture's enum */
    block_ptrs hp, hg;                          /* head rows (last stage); a tied row held once reads the embedding's */
    float *head_w, *dhead_w;                    /* the head's output matrix and where its gradient goes */
    float *dwte_head;                           /* (Vp, C) a tied head's share of its embedding's gradient */
    block_ptrs scr;                             /* the architecture's scratch rows (one allocation, scr_arena) */
    void *scr_arena;
    block_ptrs *bp, *bg;                        /* nb each: params and grads, by the architecture's block enum */

    int nslots, slots_in_use, slots_peak;
    act_slot *slots;
    size_t slot_bytes;           /* bytes of each slot's allocation, as carved */
    int deferred;                /* every slot has its own output gradients */
    stage_douts shared_dd;       /* the shared set when not deferred */
    int w_pending;               /* slots whose weight part has not run yet */
    int recompute;               /* STAGE_RECOMPUTE_*: what the backward recomputes */
    block_ptrs shared_acts;      /* the activation rows the mode does not keep per slot: one set */
    void *shared_arena;
    /* data parallelism (dp.h): after the weight part of block b in the step's last micro-batch
     * (the w_final-th weight part since stage_zero_grads), on_grad_final(grad_ctx, st, l0 + b);
     * after that part's last weight op, on_grad_final(grad_ctx, st, -1) (st: which chunk fired).
     * NULL: no hook. */
    int (*on_grad_final)(void *ctx, const struct stage *st, int layer);
    void *grad_ctx;
    int w_final, w_done;
    /* --grad-accum exact (exact.h; host-memory backends): every weight part and every head
     * backward accumulates into zeroed gradients, and right after the ops of a block (or of the
     * tensors outside the blocks, or of the head matrix) those floats are folded into acc
     * (nparams fixed-point sums, a chunk's a slice of its holder's) and zeroed again, before
     * on_grad_final fires. The caller rounds acc into grads once at the step's end. */
    int exact;
    pl_fx *acc;
    /* scratch shared by every slot */
    float *dres;                 /* (N, C) the residual stream's gradient */
    float *logits;               /* (N, Vp) */
    int *tgt;                    /* (N) */
    float *losses;               /* (N) */
    float *host_losses;          /* (N) host copy */
    float *tp_logits;            /* --tp: (N, this rank's vocabulary slice) host copy for the parallel softmax */
    float *tp_zero;              /* --tp, TP ranks > 0: zeros read for the replicated embedding rows (backend) */
    int shares_params;           /* params/grads are a holder's (stage_init_holder), not freed here */
    int holds_chunks;            /* a holder: parameters only, dwte_head borrowed from the head chunk */
} stage;

/* Activation recomputation: none keeps every activation; selective drops the attention
 * probabilities (B NH T T per block, the largest at long T) and recomputes them in the
 * backward; full keeps only each block's output (the next block's input) and recomputes the
 * whole block, for the input part and again for a deferred weight part. The results are the
 * same bits: recomputing runs the same deterministic ops on the same inputs. */
enum { STAGE_RECOMPUTE_NONE = 0, STAGE_RECOMPUTE_SELECTIVE = 1, STAGE_RECOMPUTE_FULL = 2 };

/* Build a stage and allocate its parameters, gradients and nslots activation slots for
 * micro-batches of Bm sequences of length T. Every backend failure comes back with the
 * backend's message in err. */
int stage_init(stage *st, const model_config *cfg, int l0, int l1, int has_embed, int has_head,
               int Bm, int T, int nslots, const backend *be, char *err, size_t errlen);
/* Virtual stages: one rank runs V chunks (stages of non-adjacent layer ranges, in ascending
 * order; chunk 0 may hold the embeddings, chunk V-1 the head). Gather their parameters and
 * gradients into one holder h, so that the optimizer, the checkpoints, the llm.c files and the
 * data-parallel reduction see one stage whose tensor table is the chunks' in order; each
 * chunk computes on its slice of h's buffers (shares_params). Call after stage_init of every
 * chunk and before their weights are set; free h after (or before) the chunks. */
int stage_init_holder(stage *h, stage *chunks, int V, char *err, size_t errlen);
/* Give every slot its own output gradients, so weight parts may be deferred past other
 * micro-batches' input parts (zero-bubble schedules). */
int stage_init_deferred(stage *st, char *err, size_t errlen);
/* Switch to recomputation (after stage_init, before the first forward): every slot is carved
 * again with only the rows the mode keeps (KEEP_* in arch.h); the others live in one shared
 * set. Selective recomputation rewrites a slot's attention output with the bits it had. */
int stage_init_recompute(stage *st, int mode, char *err, size_t errlen);
/* Bytes of activations one in-flight micro-batch holds (model_slot_act_bytes of the stage's
 * shape and mode, for the stage table and the engine's peak), and the bytes its slot
 * allocation actually has (the same, unless the table and the carving disagree). */
size_t stage_act_bytes_per_slot(const stage *st);
size_t stage_slot_bytes(const stage *st);
void stage_free(stage *st);
/* Initialise parameters (model_init_tensor for each tensor). */
int stage_init_params(stage *st, unsigned long long seed);
/* Find a tensor by kind and layer; NULL if this stage does not hold it. */
const param_tensor *stage_find_tensor(const stage *st, int kind, int layer);

/* Forward one micro-batch into a free slot (returned in *slot_out). tok (host, N) on the
 * first stage, and on every stage under document masking (cfg.docs.mask: the documents are
 * found from the tokens), else NULL; x_in (backend, N*C) on the other stages. On the last stage targets (host, N) give the loss:
 * *loss_sum receives the sum of the N token losses and, if dloss > 0, the head's backward runs
 * with dL/dlogit scale dloss. Returns 0, PL_EINVAL if no slot is free, or a backend error. */
int stage_forward(stage *st, int mb, const int *tok, const float *x_in, const int *targets,
                  float dloss, double *loss_sum, int *slot_out);
/* Output activation (backend, N*C) of the micro-batch in a slot (to send to the next stage). */
float *stage_output(stage *st, int slot);
/* Input part of the backward of the micro-batch in a slot: dout (backend, N*C) from the next
 * stage unless this is the last stage; leaves dL/d(input) in stage_dinput(). */
int stage_backward_input(stage *st, int slot, const float *dout);
/* Weight part: accumulates the parameter gradients of the slot's micro-batch; releases it. */
int stage_backward_weight(stage *st, int slot);
/* Both parts, one after the other, block by block (the same bits as input then weight). */
int stage_backward(stage *st, int slot, const float *dout);
float *stage_dinput(stage *st);
/* Slot holding micro-batch mb, or -1. */
int stage_slot_of(const stage *st, int mb);
/* Forget every slot (after an evaluation forward that has no backward). */
void stage_release_all(stage *st);
/* Fold the LM head's share of the tied wte gradient into dwte: added on a stage that holds
 * both ends, copied on a last stage (the two ranks then sum with MPI_Allreduce). Float
 * addition of two values is commutative, so both paths give the same bits. */
int stage_tied_grads_local(stage *st);
/* Zero all gradients (start of a step), and in exact mode the accumulator. */
int stage_zero_grads(stage *st);
/* Exact mode: stage_tied_grads_local on the accumulator. The head's share was folded into the
 * head matrix's own sums as it was computed; on a stage (or holder) with both ends, the
 * embedding's sums take each tied copy's, and the copies take the total. */
void stage_tied_exact_local(stage *st);
/* The backend's message after a failed call, prefixed with what the stage was doing. */
const char *stage_error(const stage *st);

#endif
