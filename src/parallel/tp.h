/*
 * tp.h — tensor parallelism: the T ranks of one (stage, replica) share every block of the
 * stage, Megatron style. Each holds a slice of the heads (qkv column-parallel, the attention
 * of its heads) and of the MLP hidden size (the first products column-parallel, Llama's up
 * and gate sliced together); the attention and MLP output projections are row-parallel, so
 * their outputs, and in the backward the gradients of the two norms' outputs, are partial
 * sums that tp_sum adds over the T ranks (four sums per block and micro-batch). Norm weights,
 * the row-parallel biases (added by TP rank 0 only), the embeddings and the head are
 * replicated: every TP rank computes them from the same summed inputs, so their gradients
 * are the same bits on every rank and are counted once (TP rank 0's) in the gradient norm.
 * The cut of each tensor is model_tp_slice (model.h); key/value heads fewer than T are
 * replicated over T / NKV ranks, and their rows' gradients summed over those ranks.
 *
 * The sum is deterministic: every rank gathers the T parts (MPI_Iallgather on host views of
 * the backend buffer, waited on under the watchdog) and adds them in rank order
 * ((p_0 + p_1) + p_2) + ..., so every TP rank holds the same bits, run after run, whatever
 * the pipeline and data-parallel layout at a fixed T.
 *
 * Checkpoints, llm.c and safetensors files stay whole, by layer name: tp_whole_make gathers
 * the T slices of every tensor (parameters, moments, gradients as asked) into a whole-shaped
 * copy of the stage on every TP rank, which the file code reads or writes as it would a
 * stage of one rank; tp_whole_put cuts this rank's slices back out after a load.
 */
#ifndef PIPELM_TP_H
#define PIPELM_TP_H

#include <mpi.h>
#include <stddef.h>
#include "model/optim.h"
#include "model/stage.h"

typedef struct {
    MPI_Comm comm;          /* the T ranks of this (stage, replica), rank = TP index */
    int T, t;
    const backend *be;
    float *all;             /* host: T parts of the largest sum so far */
    size_t cap;             /* floats per part in all */
    double t_sum;           /* seconds inside tp_sum (gather, wait, ordered sum) */
    long nsum;              /* sums */
    double floats;          /* floats summed (one part each) */
    int fail_step;          /* test-only (--fail-at tp): fail inside the first sum of this step; -1 none */
    int fail_wrank;         /* the world rank named in the message */
    int fail_kill;          /* test-only (--fail-at tp-kill): instead, SIGKILL this rank inside that sum */
} tp_group;

/* What tp_whole_make gathers. */
enum { TPW_PARAMS = 1, TPW_MOMENTS = 2, TPW_GRADS = 4 };

/* A whole-shaped copy of a TP rank's stage (and its optimizer's moments) for the files. */
typedef struct {
    stage st;               /* the whole config and tensors; params and grads in backend memory */
    optim opt;              /* its moments (optim_init), replica d T + t of D T for ckpt_save */
    int have_opt;
} tp_whole;

/* The group over comm (T = its size); be for the host views. fail_step >= 1: --fail-at tp. */
int tp_init(tp_group *g, MPI_Comm comm, const backend *be, int fail_step, int fail_wrank, char *err,
            size_t errlen);
void tp_free(tp_group *g);
/* block_dims.tp_sum: buf (backend memory, n floats) = the sum of the T ranks' buf, in rank
 * order. phase (TP_PHASE_*) names the sum in the watchdog's and the fault's messages. */
int tp_sum(void *ctx, float *buf, size_t n, int phase);
/* The head's hook (model.h's model_tp_host_hook): host[0..n) reduced over the TP ranks in rank
 * order, TP_HOST_SUM or TP_HOST_MAX; the same bits on every rank. */
int tp_host_reduce(void *ctx, float *host, size_t n, int op);
/* Zero the timers (the start of a timed part). */
void tp_reset_timers(tp_group *g);
/* Key/value heads replicated over T / NKV ranks: their rows' gradients summed over the ranks
 * that share them (rank order), at the step's end before the norm. Collective over the TP
 * group; a no-op when NKV >= T. */
int tp_kv_grads(tp_group *g, stage *st);
/* The gradient norm counts each element once: sq[i] (stage tensor i's squared norm over this
 * rank's elements, or over a replica's pieces) becomes the share this TP rank owns: 0 for a
 * replicated tensor on ranks other than 0; a replicated kv head's rows counted by the first
 * rank sharing it (kvsq[i]: their squared norm, or NULL when NKV >= T). */
void tp_owned_sumsq(const tp_group *g, const stage *st, double *sq, const double *kvsq);
/* Squared norms of the replicated kv rows of each qkv tensor (0 elsewhere), over the floats
 * [lo, lo + n) of the buffer (a replica's piece; the whole buffer without --dp). */
int tp_kv_sumsq(const tp_group *g, const stage *st, const optim_range *r, int nr, double *kvsq);
/* Collective over the TP group: the whole copy of st (its cfg with tp 0) with `what`
 * gathered from every TP rank's slices (0: allocated only, zero, for a load). opt: st's
 * optimizer (its moments as optim_buffer gives them, whole-size), needed for TPW_MOMENTS;
 * with want_opt the copy gets an optimizer (moments), replica d T + t of D T (d, D: the
 * data-parallel replica and count). */
int tp_whole_make(tp_group *g, const stage *st, const optim *opt, int what, int want_opt, int d, int D,
                  tp_whole *w, char *err, size_t errlen);
/* Cut this rank's slices of the whole copy back into st (params) and opt's moments (when
 * both have them: what & TPW_MOMENTS). */
int tp_whole_put(const tp_group *g, tp_whole *w, stage *st, optim *opt, int what);
void tp_whole_free(tp_whole *w);
/* Collective over the TP group: are the replicated tensors (norms, row-parallel biases, GPT-2's
 * positions) the same bits on every TP rank (CRC-32C of each, compared)? *same, and the first
 * that differs by name. The end of a run checks it, as the tied embedding's copies. */
int tp_check_replicas(tp_group *g, const stage *st, int *same, char *name, size_t len);

#endif
