/*
 * engine.h — runs one rank's schedule for one step with non-blocking MPI.
 *
 * A rank runs V >= 1 chunks (stages): chunk c is the global stage the schedule's placement
 * gives it (sched.h): c P + rank in the loop layout, so with V > 1 activations wrap from the
 * last rank back to rank 0; in the V layout stages rank and 2P - 1 - rank, and the two stages
 * of rank P - 1 hand over by a copy. At the start
 * of a step every receive the rank's action list names is posted (one buffer per chunk,
 * micro-batch and direction), so a rank blocks only in MPI_Wait when the data it needs next
 * has not arrived; sends are MPI_Isend and complete in the background (their buffers stay
 * untouched until the step ends). Tags encode direction, step parity, the receiving stage
 * and the micro-batch, so messages cannot pair up wrongly. The engine times forward
 * compute, backward compute and MPI waits, and (through the stages) counts the
 * micro-batches whose activations it holds at once.
 */
#ifndef PIPELM_ENGINE_H
#define PIPELM_ENGINE_H

#include <mpi.h>
#include "model/stage.h"
#include "pipeline/sched.h"

typedef struct trace trace;

typedef struct {
    MPI_Comm comm;
    int rank, P, M, V, S;                  /* S = P V global stages */
    stage *st;                             /* V chunks: st[c] runs sched_place_stage(place, P, rank, c) */
    const sched *sc;
    float **recv_f, **recv_b, **send_b;    /* per chunk: M slices of N*C each (backend), or NULL */
    void **hv;                             /* 4 V M host views of message buffers (engine.c) */
    MPI_Request *rq_f, *rq_b, *sq_f, *sq_b; /* V M each, index c M + mb */
    double *mb_loss;                       /* M: loss sums on the last stage */
    unsigned char *b_done;                 /* V M: B has run, send_b holds its input gradient */
    int *next_f, *next_b;                  /* V: gradients are added in micro-batch order */
    int first_bad_fwd;                     /* lowest s M + mb whose forward gave a non-finite value, -1 */
    double t_fwd, t_bwd, t_wait;           /* seconds, accumulated; caller resets */
    double t_op[SCHED_NOPS];               /* seconds in F, B, I, W actions, and their counts */
    long n_op[SCHED_NOPS];                 /* (for measured costs; the caller resets) */
    double *t_opc;                         /* V SCHED_NOPS: the same per chunk, [c SCHED_NOPS + op] */
    long *n_opc;                           /* (engine_reset_costs resets both) */
    int inflight, inflight_peak;           /* micro-batches held over all chunks, now and at most */
    double act_bytes, act_bytes_peak;      /* their activations (stage_act_bytes_per_slot), now and at most */
    int fail_rank, fail_step, fail_during; /* test-only fault injection */
    trace *tr;                             /* optional timeline */
    double slow_s;                         /* test-only: seconds added to each F, B, I, W (0: none) */
} engine;

/* st: the V chunks of this rank (sc->V of them, V = 1: one stage). */
int engine_init(engine *e, stage *st, int V, const sched *sc, MPI_Comm comm, char *err, size_t errlen);
void engine_free(engine *e);
/* Zero the per-op timers and counts (rank totals and per chunk), at the start of a timed part. */
void engine_reset_costs(engine *e);
/* Test-only fault injection: pipeline rank fail_rank (-1: none) fails at fail_step, during
 * the step's pipeline (during != 0) or before it. */
void engine_set_faults(engine *e, int fail_rank, int fail_step, int during);
/* Test-only: every F, B, I and W of this rank runs ms milliseconds longer (a slow rank). */
void engine_set_slow(engine *e, double ms);
/* Before a step: zero the F/B/wait timers and forget the last non-finite forward. */
void engine_begin_step(engine *e);
/* Record a timeline into tr (NULL: none); engine_take_trace hands it back and stops. */
void engine_set_trace(engine *e, trace *tr);
trace *engine_take_trace(engine *e);
/* One training step: inputs/targets are the whole batch (B*T, host); every stage's
 * gradients accumulate; on the last stage *loss_sum = sum of token losses in micro-batch
 * order (else 0). dloss = 1/(B*T). */
int engine_step(engine *e, long step, const int *inputs, const int *targets, float dloss, double *loss_sum);
/* Forward only (evaluation) over one batch, the micro-batches pipelined through the stages
 * (every receive posted first, sends waited for at the end); *loss_sum on the last stage, in
 * micro-batch order. */
int engine_eval(engine *e, const int *inputs, const int *targets, double *loss_sum);

#endif
