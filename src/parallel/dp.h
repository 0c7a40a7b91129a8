/*
 * dp.h — data parallelism: the D replicas of one pipeline stage reduce their gradients over
 * their own communicator, bucket by bucket, while the step goes on, and (ZeRO stage 1) each
 * keeps and updates 1/D of the optimizer state.
 *
 * A bucket is a contiguous range of the stage's gradient buffer: one per transformer block,
 * one per tensor outside the blocks. A block's bucket starts as soon as its gradient is final
 * in the step (the weight part of the step's last micro-batch: stage.h's on_grad_final hook),
 * so its reduction overlaps the rest of the backward and the cool-down; the tied token
 * embedding starts after the tied sum of the step's end. The reduction is a reduce-scatter
 * written out so that its order is fixed: replica j receives piece j of every replica's
 * bucket (MPI_Ialltoallv) and sums it in replica order, ((g_0 + g_1) + g_2) + ..., element by
 * element; an all-gather (MPI_Iallgatherv) then gives every replica the whole sum. So every
 * replica holds the same bits, run after run, and since each element's sum does not depend
 * on how the buffer is cut, they do not depend on the stage split either. With ZeRO-1 the
 * gradient all-gather is skipped: replica j runs AdamW on piece j only (its moments are the
 * only ones it stores) and the parameters are all-gathered instead. The gradient norm is
 * summed from the pieces in both modes, so ZeRO on and off give the same bits. Every wait
 * goes through comm.h (watchdog, stop signals). Backend memory is reached through map/unmap.
 *
 * MPI moves a collective on only inside MPI calls (MPICH over UCX: about 512 KB of a large
 * message per call, and a rendezvous needs both replicas to call in), so the reducer tests
 * its requests DP_POLL_DEFAULT times after every backend op (backend_poll.h), not only at the
 * blocks' ends. On a host backend dp_finish leaves the gradient all-gathers in flight (the
 * norm needs only the summed pieces) and dp_optim_step updates bucket by bucket in start
 * order, waiting for each bucket's gather just before its AdamW and, under ZeRO, posting its
 * parameter all-gather right after: the last buckets' gathers overlap the first buckets'
 * updates. The same AdamW calls on the same elements: the same bits.
 */
#ifndef PIPELM_DP_H
#define PIPELM_DP_H

#include <mpi.h>
#include <stddef.h>
#include "model/optim.h"
#include "model/stage.h"

/* One contiguous range of the stage's buffers reduced as a unit. */
typedef struct {
    size_t lo, n;          /* [lo, lo + n) floats of grads (and params, m, v) */
    size_t plo, pn;        /* this replica's piece: [lo + plo, lo + plo + pn) */
    int layer;             /* block, or -1 */
    int tied;              /* the tied wte (started after the tied sum) */
    int state;             /* DP_IDLE.. */
    float *host;           /* host view of grads[lo, lo + n) while reducing */
    float *recv;           /* D pieces of this replica's piece size */
    pl_fx *xrecv;          /* exact mode: the same of the fixed-point sums (the float recv unused) */
    int *cnt, *dsp;        /* D each: every replica's piece (size, offset in the bucket) */
    int *rcnt, *rdsp;      /* D each: what this replica receives from each (pn, j pn; nothing
                            * from itself) */
    int *scnt;             /* D: what it sends each (cnt, nothing to itself); MPI reads all five
                            * until the collective completes */
    MPI_Request rq;        /* its scatter, then its gradient gather */
    MPI_Request prq;       /* ZeRO: its parameters' all-gather after the update */
} dp_bucket;

/* DP_DONE: summed, no gather (ZeRO, or not yet posted); DP_GATHERED: summed and gathered. */
#define DP_POLL_DEFAULT 8
enum { DP_IDLE = 0, DP_SCATTER = 1, DP_GATHER = 2, DP_DONE = 3, DP_GATHERED = 4 };

typedef struct {
    MPI_Comm comm;         /* the D replicas of this stage: the scatters */
    MPI_Comm gcomm;        /* a duplicate for the gathers: the scatters are posted at fixed points
                            * of the backward, the gathers when the sums are done, so the two
                            * interleave differently on each replica; MPI matches collectives by
                            * their order on a communicator, so each kind has its own */
    int D, d;              /* replicas, this one's index */
    int zero;              /* ZeRO-1: moments sharded, parameters all-gathered */
    int exact;             /* --grad-accum exact: the scatter carries the stage's fixed-point sums
                            * (st->acc), each replica sums its piece as integers and rounds it once
                            * into the gradients; the gathers move those floats as before */
    stage *st;
    optim *opt;
    int nb;
    dp_bucket *b;
    /* Collectives on one communicator must be posted in the same order on every rank: the
     * buckets' scatters go out in the order the backward finishes them (the same on every
     * replica), and each gather only after every earlier bucket's gather was posted. */
    int *order, nstarted, next_gather;
    const float **terms;   /* D: the terms of one piece's sum (reduce_bucket's scratch) */
    int next_gdone;        /* order[] before it: gathered (or, ZeRO, not gathered) */
    int poll;              /* MPI tests after every backend op (backend_poll.h): PIPELM_DP_POLL, else
                            * DP_POLL_DEFAULT; 0: only at the blocks' ends */
    long npolls;           /* polls that found a reduction in flight */
    int defer;             /* dp_finish may leave the gathers to dp_optim_step (not PIPELM_DP_DEFER=0) */
    int deferred;          /* it did: dp_optim_step goes bucket by bucket */
    int npg, pg_done;      /* ZeRO: order[] before npg has its parameter gather posted, before pg_done done */
    double t_hidden_wait;  /* seconds waited at the step's end for reductions (not hidden) */
    double t_gather;       /* seconds of the ZeRO parameter all-gather */
    double pending_floats; /* gradient floats whose reduction the backward had not finished */
    size_t moment_floats;  /* floats in each of m and v on this replica (the optimizer's nmoment) */
} dp_reducer;

/* Set up the buckets of st over comm (D = its size); with zero, shard opt (optim_shard) to
 * this replica's pieces. Installs the stage's on_grad_final hook (M = micro-batches per step),
 * unless st is a holder of chunks: then dp_hook each chunk. */
int dp_init(dp_reducer *r, stage *st, optim *opt, MPI_Comm comm, int zero, int M, char *err, size_t errlen);
/* Install the hook on one chunk of a holder st (stage_init_holder): dp_init does it for a
 * stage that computes itself. */
void dp_hook(dp_reducer *r, stage *chunk, int M);
/* free_comm = 0 after a failure (the peers may be anywhere: no collective call); with 1, a
 * reduction still in flight (a NaN stopped the step after dp_finish) is waited for first. */
void dp_free(dp_reducer *r, int free_comm);
/* The step's end: start what is left (the tied wte, after optim_tied_grads), wait for every
 * bucket's sum. full = 1 all-gathers the gradients even under ZeRO (for --dump-grads) and
 * waits for them; otherwise, on a host backend, the gathers may still be in flight after it
 * (this replica's pieces are final: dp_grad_sumsq may run), and dp_optim_step must follow. */
int dp_finish(dp_reducer *r, int full);
/* Zero t_hidden_wait, t_gather, pending_floats, npolls (the start of a timed part). */
void dp_reset_timers(dp_reducer *r);
/* Squared norm of each tensor over this replica's pieces (sum over replicas = the norm). */
int dp_grad_sumsq(const dp_reducer *r, double *sq);
/* The update of the replicas' summed gradients: optim_step (under ZeRO this replica's pieces
 * only) then (ZeRO) the parameters' all-gather, or, after a dp_finish that left gathers in
 * flight, the same bucket by bucket with the gathers overlapping the updates. Nothing is in
 * flight after it. */
int dp_optim_step(dp_reducer *r, int step, double lr, double norm);
/* ZeRO: whole-size moments for a checkpoint (gather = 1: filled from every replica's pieces,
 * for a save; 0: zero, for a load), and back to the pieces after it. No-ops without ZeRO. */
int dp_moments_full(dp_reducer *r, int gather);
int dp_moments_pieces(dp_reducer *r);

#endif
