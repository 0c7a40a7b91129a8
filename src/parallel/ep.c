/*
 * ep.c — expert parallelism (ep.h): the EP group's count and row exchanges the MoE layer
 * calls, as non-blocking all-to-alls waited on under the watchdog, timed for pipelm bench.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/comm.h"
#include "util/common.h"
#include "parallel/ep.h"

#define EP_MAX_BUFS 8 /* arrays one exchange moves */

static const char *const phase_names[EP_NPHASE] = {
    "the forward's dispatch", "the forward's combine", "the backward's dispatch (input part)",
    "the backward's combine (input part)", "the backward's dispatch (weight part)",
};

const char *ep_phase_name(int phase) { return phase >= 0 && phase < EP_NPHASE ? phase_names[phase] : "an exchange"; }

void ep_init(ep_group *g, MPI_Comm comm, int fail_step, int fail_wrank) {
    memset(g, 0, sizeof *g);
    g->comm = comm;
    MPI_Comm_size(comm, &g->E);
    MPI_Comm_rank(comm, &g->e);
    g->fail_step = fail_step;
    g->fail_wrank = fail_wrank;
}

void ep_reset_timers(ep_group *g) {
    g->t_a2a = g->t_exposed = 0.0;
    g->n_a2a = 0;
    g->rows_in = g->rows_max = 0.0;
}

/* Test-only (--fail-at ep-kill): the exchange posted, so the peers are inside it with this
 * rank; then the rank dies as a crashed process or a lost node does, nothing flushed or sent. */
static void maybe_die(ep_group *g, int phase) {
    if (g->fail_step < 1 || comm_step != g->fail_step) return;
    fprintf(stderr, "pipelm: rank %d: note: --fail-at ep-kill: killing this rank (SIGKILL) inside the EP all-to-all "
            "of %s, step %ld\n", g->fail_wrank, ep_phase_name(phase), comm_step);
    fflush(stderr);
    raise(SIGKILL);
}

/* The counts: n ints to and from every rank of the group. */
static int ep_counts(void *ctx, const int *send, int *recv, int n, int phase) {
    ep_group *g = ctx;
    double t0 = pl_now();
    MPI_Request rq;
    char what[128];
    snprintf(what, sizeof what, "the EP all-to-all of the counts of %s", ep_phase_name(phase));
    PL_MPI_CHECK(MPI_Ialltoall(send, n, MPI_INT, recv, n, MPI_INT, g->comm, &rq));
    maybe_die(g, phase);
    comm_what w = {what, -1, -1, comm_step};
    int rc = comm_wait(&rq, &w);
    g->t_a2a += pl_now() - t0;
    g->t_exposed += pl_now() - t0;
    return rc;
}

/* Counts and displacements of rows of `width` floats, in floats, for MPI (its int counts). */
static int ep_layout(const ep_group *g, const int *rows, int width, int *cnt, int *dsp, const char *what) {
    long long at = 0;
    for (int j = 0; j < g->E; j++) {
        long long n = (long long)rows[j] * width;
        if (n > INT_MAX || at > INT_MAX) {
            pl_error("%s: %lld floats exceed MPI's count", what, at + n);
            return PL_EINVAL;
        }
        cnt[j] = (int)n;
        dsp[j] = (int)at;
        at += n;
    }
    return PL_OK;
}

/* nbuf arrays at once: one MPI_Ialltoallv each, waited on together. */
static int ep_rows(void *ctx, int nbuf, const float *const *send, float *const *recv, const int *width,
                   const int *scount, const int *rcount, int phase) {
    ep_group *g = ctx;
    double t0 = pl_now();
    char what[128];
    snprintf(what, sizeof what, "the EP all-to-all of %s", ep_phase_name(phase));
    if (nbuf > EP_MAX_BUFS) return PL_EINVAL;
    int *lay = malloc(sizeof(int) * 4 * (size_t)g->E * (size_t)nbuf);
    if (!lay) return PL_ENOMEM;
    MPI_Request rq[EP_MAX_BUFS];
    int rc = PL_OK, posted = 0;
    for (int i = 0; rc == PL_OK && i < nbuf; i++) {
        int *sc = lay + (size_t)4 * g->E * i, *sd = sc + g->E, *rcn = sd + g->E, *rd = rcn + g->E;
        rc = ep_layout(g, scount, width[i], sc, sd, what);
        if (rc == PL_OK) rc = ep_layout(g, rcount, width[i], rcn, rd, what);
        if (rc == PL_OK && MPI_Ialltoallv(send[i], sc, sd, MPI_FLOAT, recv[i], rcn, rd, MPI_FLOAT, g->comm, &rq[i]) !=
                               MPI_SUCCESS)
            rc = PL_EMPI;
        if (rc == PL_OK) posted++;
    }
    if (rc == PL_OK) maybe_die(g, phase);
    comm_what w = {what, -1, -1, comm_step};
    int r2 = posted ? comm_waitall(posted, rq, &w) : PL_OK;
    free(lay);
    double dt = pl_now() - t0;
    g->t_a2a += dt;
    g->t_exposed += dt;
    g->n_a2a++;
    if (phase == EP_PHASE_DISPATCH) {
        double n = 0;
        for (int j = 0; j < g->E; j++) n += rcount[j];
        g->rows_in += n;
        g->rows_max = n > g->rows_max ? n : g->rows_max;
    }
    return rc != PL_OK ? rc : r2;
}

model_ep_hook ep_hook(ep_group *g) {
    model_ep_hook h = {g->E, g->e, g, ep_counts, ep_rows};
    return h;
}
