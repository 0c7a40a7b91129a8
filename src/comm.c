/*
 * comm.c — waits and collectives under the watchdog, with back-off (see comm.h).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <sched.h>
#include <time.h>
#include "pipelm/comm.h"
#include "pipelm/common.h"
#include "pipelm/signals.h"

double comm_watchdog_s = 600.0;
double comm_stop_grace_s = 60.0;
double comm_notice_s = 30.0;
int comm_polite = 0;
long comm_step = -1;

/* Busy-poll SPIN_S, then poll and yield the core until YIELD_S, then sleep between polls
 * (growing to SLEEP_MAX_S). Every poll also drives MPI's progress (a large non-blocking
 * all-reduce advances only in MPI_Test), so the sleeping phase starts late: only a wait that
 * is already long (a stopped or slow peer) pays its latency. */
#define SPIN_S 20e-3
#define YIELD_S 200e-3
#define SLEEP_MAX_S 1e-3

/* Describe a wait: "1RECV_B3 (peer rank 2, micro-batch 3, step 5)". */
static void describe(const comm_what *w, char *buf, size_t len) {
    int off = snprintf(buf, len, "%s", w && w->what ? w->what : "a message");
    if (!w) return;
    const char *sep = " (";
    if (w->peer >= 0 && off < (int)len) { off += snprintf(buf + off, len - off, "%speer rank %d", sep, w->peer); sep = ", "; }
    if (w->mb >= 0 && off < (int)len) { off += snprintf(buf + off, len - off, "%smicro-batch %d", sep, w->mb); sep = ", "; }
    long step = w->step >= 0 ? w->step : comm_step;
    if (step >= 0 && off < (int)len) { off += snprintf(buf + off, len - off, "%sstep %ld", sep, step); sep = ", "; }
    if (sep[0] == ',' && off < (int)len) snprintf(buf + off, len - off, ")");
}

/* Sleep for s seconds (s < 1). */
static void nap(double s) {
    struct timespec ts = {0, (long)(s * 1e9)};
    nanosleep(&ts, NULL);
}

int comm_wait(MPI_Request *rq, const comm_what *w) {
    if (*rq == MPI_REQUEST_NULL) return PL_OK;
    double t0 = MPI_Wtime(), sleep_s = 1e-5;
    int noticed = 0;
    for (;;) {
        int done = 0;
        PL_MPI_CHECK(MPI_Test(rq, &done, MPI_STATUS_IGNORE));
        if (done) return PL_OK;
        double waited = MPI_Wtime() - t0;
        if (waited < SPIN_S && !comm_polite) continue;
        char d[256];
        if (comm_watchdog_s > 0 && waited > comm_watchdog_s) {
            describe(w, d, sizeof d);
            pl_error("watchdog: waited %.1f s for %s (limit --watchdog %g s); aborting the job", waited, d,
                     comm_watchdog_s);
            return PL_ETIMEOUT;
        }
        int sig = signals_stop_pending();
        if (sig && waited > comm_stop_grace_s) {
            describe(w, d, sizeof d);
            pl_error("%s asked for a stop, but this step cannot finish: waited %.1f s for %s; "
                     "aborting the job without a checkpoint", signals_name(sig), waited, d);
            return PL_ESTOPPED;
        }
        if (!noticed && comm_notice_s > 0 && waited > comm_notice_s) {
            describe(w, d, sizeof d);
            pl_note("still waiting after %.0f s for %s (the watchdog aborts at %g s)", waited, d,
                     comm_watchdog_s);
            noticed = 1;
        }
        if (waited < YIELD_S) {
            sched_yield();
        } else {
            nap(sleep_s);
            sleep_s = sleep_s * 2 < SLEEP_MAX_S ? sleep_s * 2 : SLEEP_MAX_S;
        }
    }
}

int comm_waitall(int n, MPI_Request *rq, const comm_what *w) {
    for (int i = 0; i < n; i++) PL_TRY(comm_wait(&rq[i], w));
    return PL_OK;
}

int comm_allreduce(const void *in, void *out, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c, const char *what) {
    MPI_Request rq;
    comm_what w = {what, -1, -1, -1};
    PL_MPI_CHECK(MPI_Iallreduce(in, out, n, t, op, c, &rq));
    return comm_wait(&rq, &w);
}

int comm_bcast(void *buf, int n, MPI_Datatype t, int root, MPI_Comm c, const char *what) {
    MPI_Request rq;
    comm_what w = {what, -1, -1, -1};
    PL_MPI_CHECK(MPI_Ibcast(buf, n, t, root, c, &rq));
    return comm_wait(&rq, &w);
}

int comm_gather(const void *in, int n, MPI_Datatype t, void *out, int root, MPI_Comm c, const char *what) {
    MPI_Request rq;
    comm_what w = {what, -1, -1, -1};
    PL_MPI_CHECK(MPI_Igather(in, n, t, out, n, t, root, c, &rq));
    return comm_wait(&rq, &w);
}

int comm_barrier(MPI_Comm c, const char *what) {
    MPI_Request rq;
    comm_what w = {what, -1, -1, -1};
    PL_MPI_CHECK(MPI_Ibarrier(c, &rq));
    return comm_wait(&rq, &w);
}

int comm_agree(MPI_Comm c, int rc, int *who) {
    int rank;
    MPI_Comm_rank(c, &rank);
    int in[2] = {rc, rc != PL_OK ? -rank : -2147483647}, out[2];
    PL_TRY(comm_allreduce(in, out, 2, MPI_INT, MPI_MAX, c, "the agreement on a status"));
    if (who) *who = out[0] != PL_OK ? -out[1] : -1;
    return out[0];
}
