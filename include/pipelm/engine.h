/*
 * engine.h — runs one rank's schedule for one step with non-blocking MPI.
 *
 * At the start of a step every receive the rank's action list names is posted (one buffer
 * per micro-batch and direction), so a rank blocks only in MPI_Wait when the data it needs
 * next has not arrived; sends are MPI_Isend and complete in the background (their buffers
 * stay untouched until the step ends). Tags encode direction, micro-batch and step parity,
 * so messages cannot pair up wrongly. The engine times forward compute, backward compute
 * and MPI waits, and (through the stage) counts the micro-batches whose activations it
 * holds at once.
 */
#ifndef PIPELM_ENGINE_H
#define PIPELM_ENGINE_H

#include <mpi.h>
#include "pipelm/stage.h"
#include "pipelm/sched.h"

typedef struct trace trace;

typedef struct {
    MPI_Comm comm;
    int rank, P, M;
    stage *st;
    const sched *sc;
    float *recv_f, *recv_b, *send_b;       /* M slices of N*C each, backend memory */
    void **hv;                             /* 4M host views of message buffers (engine.c) */
    MPI_Request *rq_f, *rq_b, *sq_f, *sq_b;
    double *mb_loss;                       /* M: loss sums on the last stage */
    unsigned char *b_done;                 /* M: B has run, send_b holds its input gradient */
    int next_f, next_b;                    /* gradients are added in micro-batch order */
    int first_bad_fwd;                     /* first mb whose forward gave a non-finite value, -1 */
    double t_fwd, t_bwd, t_wait;           /* seconds, accumulated; caller resets */
    double t_op[SCHED_NOPS];               /* seconds in F, B, I, W actions, and their counts */
    long n_op[SCHED_NOPS];                 /* (for measured costs; the caller resets) */
    int fail_rank, fail_step, fail_during; /* test-only fault injection */
    trace *tr;                             /* optional timeline */
} engine;

int engine_init(engine *e, stage *st, const sched *sc, MPI_Comm comm, char *err, size_t errlen);
void engine_free(engine *e);
/* One training step: inputs/targets are the whole batch (B*T, host); every stage's
 * gradients accumulate; on the last stage *loss_sum = sum of token losses in micro-batch
 * order (else 0). dloss = 1/(B*T). */
int engine_step(engine *e, long step, const int *inputs, const int *targets, float dloss, double *loss_sum);
/* Forward only (evaluation) over one batch, blocking point-to-point; *loss_sum on the last stage. */
int engine_eval(engine *e, const int *inputs, const int *targets, double *loss_sum);

#endif
