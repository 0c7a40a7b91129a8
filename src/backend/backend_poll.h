/*
 * backend_poll.h — a backend that runs another and, after each of its compute ops, calls a
 * hook: what lets data parallelism move its non-blocking reductions on (MPI progresses a
 * collective only inside MPI calls, and MPICH's rendezvous needs both ends to call in)
 * between the ops of the backward, not only between blocks. The ops and their results are
 * the inner backend's, bit for bit; with no hook set, the cost is one test per op. One
 * polled backend per process (like backend_prof.h), so one hook.
 */
#ifndef PIPELM_BACKEND_POLL_H
#define PIPELM_BACKEND_POLL_H

#include "pipelm/backend.h"

/* The polling wrapper around inner (its name and memory ops are inner's). */
const backend *backend_polled(const backend *inner);
/* After every compute op that succeeded, hook(ctx) runs; its failure is the op's. NULL: none. */
void backend_poll_set(int (*hook)(void *ctx), void *ctx);

#endif
