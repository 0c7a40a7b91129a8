/*
 * comm.c — waits and collectives under the watchdog, with back-off (see comm.h).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "parallel/comm.h"
#include "util/common.h"
#include "util/files.h"
#include "util/hooks.h"
#include "util/signals.h"

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

/* ---- deadlines for blocking collectives the polls above cannot watch (HDF5, MPI-IO) ---- */

static pthread_mutex_t dl_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dl_cv = PTHREAD_COND_INITIALIZER;
static int dl_started, dl_armed, dl_inside, dl_late;
static double dl_until, dl_limit;
static char dl_what[160];

/* The watcher: sleeps until the armed deadline; if it passes still armed, the rank is stuck
 * inside a blocking collective whose peer is gone or stalled: say so and end the process
 * (mpiexec / srun then end the others). */
static void *deadline_watch(void *arg) {
    (void)arg;
    pthread_mutex_lock(&dl_mu);
    for (;;) {
        while (!dl_armed) pthread_cond_wait(&dl_cv, &dl_mu);
        double now = pl_now();
        if (now < dl_until) {
            double left = dl_until - now;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += (time_t)left;
            ts.tv_nsec += (long)((left - (double)(time_t)left) * 1e9);
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&dl_cv, &dl_mu, &ts);
            continue;
        }
        if (dl_inside && !dl_late) { /* a rank still outside fires first, so it is the one named */
            dl_late = 1;
            dl_until = now + 2.0;
            continue;
        }
        if (dl_inside)
            fprintf(stderr, "pipelm: rank %d: error: watchdog: this rank has waited inside %s for more than %.0f s "
                    "for a peer that stopped taking part (the limit is --watchdog plus 1 s per MB; a rank that never "
                    "reached it names itself); aborting the job\n", pl_rank, dl_what, dl_limit);
        else
            fprintf(stderr, "pipelm: rank %d: error: watchdog: this rank stalled for more than %.0f s before it "
                    "reached %s, where the other ranks wait for it (the limit is --watchdog plus 1 s per MB); "
                    "aborting the job\n", pl_rank, dl_limit, dl_what);
        fflush(stderr);
        _exit(1);
    }
    return NULL;
}

int comm_deadline_arm(const char *what, double seconds) {
    if (comm_watchdog_s <= 0 || seconds <= 0) return PL_OK;
    pthread_mutex_lock(&dl_mu);
    int rc = PL_OK;
    if (!dl_started) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &at, deadline_watch, NULL) == 0) dl_started = 1;
        else rc = PL_ENOMEM;
        pthread_attr_destroy(&at);
    }
    if (rc == PL_OK) {
        snprintf(dl_what, sizeof dl_what, "%s", what);
        dl_limit = seconds;
        dl_until = pl_now() + seconds;
        dl_armed = 1;
        dl_inside = dl_late = 0;
        pthread_cond_signal(&dl_cv);
    }
    pthread_mutex_unlock(&dl_mu);
    return rc;
}

void comm_deadline_enter(void) {
    pthread_mutex_lock(&dl_mu);
    dl_inside = 1;
    pthread_mutex_unlock(&dl_mu);
}

void comm_deadline_disarm(void) {
    pthread_mutex_lock(&dl_mu);
    dl_armed = 0;
    pthread_cond_signal(&dl_cv);
    pthread_mutex_unlock(&dl_mu);
}

/* ---- the thread level ------------------------------------------------------------------ */

int comm_init_thread(int *argc, char ***argv, int multiple) {
    static const char *names[] = {"single", "funneled", "serialized", "multiple"};
    static const int levels[] = {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED,
                                 MPI_THREAD_MULTIPLE};
    int want = multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE, got = MPI_THREAD_SINGLE;
    const char *e = hooks_env("PIPELM_MPI_THREAD");
    for (int i = 0; e && i < 4; i++)
        if (strcmp(e, names[i]) == 0) want = levels[i];
    return MPI_Init_thread(argc, argv, want, &got);
}

int comm_read_bcast(const char *path, const char *what, size_t max_bytes, MPI_Comm comm, char **text, size_t *len,
                    char *err, size_t errlen) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    *text = NULL;
    long n = rank == 0 ? pl_read_whole(path, what, max_bytes ? max_bytes : (size_t)1 << 30, text, err, errlen) : 0;
    PL_TRY(comm_bcast(&n, 1, MPI_LONG, 0, comm, what));
    if (n < 0) {
        if (rank != 0 && errlen) err[0] = 0; /* rank 0 says why, once */
        return PL_EIO;
    }
    if (rank != 0 && !(*text = malloc((size_t)n + 1))) n = -1;
    long worst = n;
    int rc = comm_allreduce(&n, &worst, 1, MPI_LONG, MPI_MIN, comm, what);
    if (rc == PL_OK && worst < 0) {
        snprintf(err, errlen, "%s %s: out of memory", what, path);
        rc = PL_ENOMEM;
    }
    for (long off = 0; rc == PL_OK && off < n; off += 1L << 30) /* counts are int */
        rc = comm_bcast(*text + off, (int)(n - off < (1L << 30) ? n - off : 1L << 30), MPI_CHAR, 0, comm, what);
    if (rc != PL_OK) {
        free(*text);
        *text = NULL;
        return rc;
    }
    (*text)[n] = 0;
    *len = (size_t)n;
    return PL_OK;
}
