/*
 * ep.h — expert parallelism (--ep E): the EP group of a rank and the all-to-all exchanges of
 * the MoE layer (archs/mixtral.c calls them through model.h's model_ep_hook).
 *
 * The E ranks of a group are E data-parallel replicas of one (stage, TP rank): replicas d with
 * the same d / E, EP rank d % E. EP rank j computes experts [j E_n / E, (j + 1) E_n / E) of
 * every MoE layer of its stage for the whole group: each rank routes its own tokens, sends
 * each expert's rows to that expert's rank and gets the results back in its own order. An
 * exchange is one count exchange (MPI_Ialltoall, the rows per (rank, expert)) and then the
 * rows (MPI_Ialltoallv of each array: the rows for rank j are contiguous, since a rank's
 * dispatched rows are in ascending expert order), waited on under the watchdog (comm.h), so a
 * dead peer ends the job with the exchange named.
 */
#ifndef PIPELM_EP_H
#define PIPELM_EP_H

#include <mpi.h>
#include <stddef.h>
#include "model/model.h"

typedef struct {
    MPI_Comm comm;          /* the E ranks of this group, rank = EP index */
    int E, e;               /* group size, this rank's index */
    double t_a2a;           /* seconds inside the exchanges (counts and rows, post to wait's end) */
    double t_exposed;       /* of which the compute did not overlap (all of it: the waits block) */
    long n_a2a;             /* exchanges */
    double rows_in;         /* rows received by this rank's experts in the forward dispatches */
    double rows_max;        /* the largest forward dispatch this rank received (rows) */
    int fail_step;          /* test-only (--fail-at ep-kill): SIGKILL this rank inside the first exchange of
                             * this step; -1 none */
    int fail_wrank;         /* the world rank named in its note */
} ep_group;

/* The group over comm (E = its size); nothing collective. */
void ep_init(ep_group *g, MPI_Comm comm, int fail_step, int fail_wrank);
/* The hook the MoE layer calls (model_set_ep_hook's argument), over g. */
model_ep_hook ep_hook(ep_group *g);
/* Zero the timers and counters (the start of a timed part). */
void ep_reset_timers(ep_group *g);
/* The phase's name in messages: "the forward's dispatch", ... */
const char *ep_phase_name(int phase);

#endif
