/*
 * trace.c — in-memory event log per rank, gathered to rank 0 as Chrome trace JSON.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "parallel/comm.h"
#include "util/common.h"
#include "util/files.h"
#include "pipeline/trace.h"

/* One event, fixed size so ranks can ship arrays of them as bytes. */
typedef struct {
    char name[24], cat[12];
    int mb, stage;      /* stage < 0: not written */
    double t0, t1;
} trace_ev;

struct trace {
    MPI_Comm comm;
    int rank, size;
    double origin;
    trace_ev *ev;
    size_t n, cap;
};

trace *trace_open(MPI_Comm comm) {
    trace *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->comm = comm;
    MPI_Comm_rank(comm, &t->rank);
    MPI_Comm_size(comm, &t->size);
    if (comm_barrier(comm, "the barrier that starts the trace") != PL_OK) {
        free(t);
        return NULL;
    }
    t->origin = MPI_Wtime();
    return t;
}

void trace_event(trace *t, const char *name, const char *cat, int mb, double t0, double t1) {
    trace_event_stage(t, name, cat, mb, -1, t0, t1);
}

void trace_event_stage(trace *t, const char *name, const char *cat, int mb, int stage, double t0, double t1) {
    if (!t) return;
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 4096;
        trace_ev *nv = realloc(t->ev, cap * sizeof *nv);
        if (!nv) return; /* a trace is best effort: drop events rather than fail the run */
        t->ev = nv;
        t->cap = cap;
    }
    trace_ev *e = &t->ev[t->n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->cat, sizeof e->cat, "%s", cat);
    e->mb = mb;
    e->stage = stage;
    e->t0 = t0 - t->origin;
    e->t1 = t1 - t->origin;
}

/* A counter sample: stored as an event with mb = -2 and the value in t1 (trace_write writes
 * it as a "C" event with args {name: value}). */
void trace_counter(trace *t, const char *name, double value, double at) {
    if (!t) return;
    trace_event_stage(t, name, "counter", -2, -1, at, at);
    t->ev[t->n - 1].t1 = value; /* the value, not a time: no origin taken off */
}

int trace_write(trace *t, const char *path) {
    if (!t) return PL_OK;
    int rc = PL_OK;
    int count = (int)t->n * (int)sizeof(trace_ev);
    int *counts = NULL, *displs = NULL;
    char *all = NULL;
    if (t->rank == 0) {
        counts = calloc(t->size, sizeof(int));
        displs = calloc(t->size, sizeof(int));
    }
    if (t->rank == 0 && (!counts || !displs)) rc = PL_ENOMEM;
    rc = comm_agree(t->comm, rc, NULL);
    if (rc == PL_OK) rc = comm_gather(&count, 1, MPI_INT, counts, 0, t->comm, "the gather of trace sizes");
    if (rc != PL_OK) goto out;
    if (t->rank == 0) {
        size_t total = 0;
        for (int i = 0; i < t->size; i++) { displs[i] = (int)total; total += counts[i]; }
        all = malloc(total ? total : 1);
    }
    MPI_Request rq;
    comm_what w = {"the gather of trace events", 0, -1, -1};
    PL_MPI_CHECK(MPI_Igatherv(t->ev, count, MPI_BYTE, all, counts, displs, MPI_BYTE, 0, t->comm, &rq));
    PL_TRY(comm_wait(&rq, &w));
    if (t->rank == 0) {
        /* a diagnostic: a trace that cannot be written is reported and removed, and the run
         * goes on (its weights and checkpoints never depend on it) */
        FILE *f = NULL;
        char e[4400];
        if (pl_open_output(path, "trace", &f, e, sizeof e) != PL_OK) {
            pl_warn("%s; no trace written (training results are not affected)", e);
        } else {
            fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
            int firstev = 1;
            for (int r = 0; r < t->size; r++) {
                fprintf(f, "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":\"rank %d\"}}",
                        firstev ? "" : ",\n", r, r);
                firstev = 0;
                const trace_ev *ev = (const trace_ev *)(all + displs[r]);
                int ne = counts[r] / (int)sizeof(trace_ev);
                for (int i = 0; i < ne; i++) {
                    double us0 = ev[i].t0 * 1e6, dur = (ev[i].t1 - ev[i].t0) * 1e6;
                    if (ev[i].mb == -2 && !strcmp(ev[i].cat, "counter"))
                        fprintf(f, ",\n{\"name\":\"%s\",\"ph\":\"C\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,\"args\":{\"%s\":%.6g}}",
                                ev[i].name, r, us0, ev[i].name, ev[i].t1);
                    else if (ev[i].mb >= 0 && ev[i].stage >= 0)
                        fprintf(f, ",\n{\"name\":\"%s%s%d\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,"
                                "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"mb\":%d,\"stage\":%d}}",
                                ev[i].name, strlen(ev[i].name) > 1 ? " " : "", ev[i].mb, ev[i].cat, r, us0, dur, ev[i].mb,
                                ev[i].stage);
                    else if (ev[i].mb >= 0)
                        fprintf(f, ",\n{\"name\":\"%s%s%d\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,"
                                "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"mb\":%d}}",
                                ev[i].name, strlen(ev[i].name) > 1 ? " " : "", ev[i].mb, ev[i].cat, r, us0, dur, ev[i].mb);
                    else
                        fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,"
                                "\"ts\":%.3f,\"dur\":%.3f}", ev[i].name, ev[i].cat, r, us0, dur);
                }
            }
            fprintf(f, "\n]}\n");
            if (pl_close_output(f, path, "trace", e, sizeof e) != PL_OK) {
                int kept = !pl_is_dev_null_path(path) && unlink(path) != 0;
                pl_warn("%s; %s (training results are not affected)", e,
                         kept ? "the partial trace is left as it is" : "the partial trace was removed");
            } else {
                pl_info("wrote trace %s\n", path);
            }
        }
    }
    rc = comm_agree(t->comm, rc, NULL);
out:
    free(counts);
    free(displs);
    free(all);
    free(t->ev);
    free(t);
    return rc;
}

void trace_discard(trace *t) {
    if (!t) return;
    free(t->ev);
    free(t);
}
