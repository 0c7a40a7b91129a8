/*
 * ckpt_async.c — the asynchronous checkpoint writer (see ckpt_async.h).
 *
 * The snapshot is a stage of its own as the checkpoint code sees one: the model config, a
 * copy of the tensor table whose written tensors are laid out one after another in host
 * buffers (parameters, m, v), the CPU backend (host memory: map is free) and an optimizer
 * whose moments are those buffers. ckpt_save run on it writes the file the live stage would
 * (the same datasets from the same values, the same attributes from the same metadata), and
 * nothing of it points into the live stage, so training may change (or free) that.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* SCHED_IDLE */
#endif
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ckpt/ckpt_async.h"
#include "ckpt/ckpt_internal.h"
#include "util/common.h"
#include "util/hooks.h"

struct ckpt_async {
    MPI_Comm comm;              /* the writer's own duplicate of the job's communicator */
    stage snap;                 /* the snapshot as a stage: cfg, tensors (copied), params */
    optim sopt;                 /* its moments */
    param_tensor *tensors;      /* the copied table (snap.tensors) */
    unsigned char *written;     /* [j]: tensor j of the table is written by this rank */
    float *buf[3];              /* parameters, m, v: the written tensors back to back */
    size_t nfloat;              /* floats in each of buf[] */
    pthread_t thread;
    int running;                /* started and not joined */
    atomic_int done;            /* the writer has returned */
    /* a deferred snapshot (ckpt_async_begin's defer): the writer copies from the live stage
     * first; the training thread waits for copied before it changes what is copied */
    const stage *live_st;
    const optim *live_opt;
    int copied;                 /* under mu: the snapshot holds the save's values */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* the save the writer runs, and what it returns */
    char dir[PL_PATH];
    ckpt_meta meta;
    int keep, rc;
    double t_begin, t_end, bytes;
    char path[PL_PATH + 64], err[1024];
};

/* Floats of the tensors this rank writes (the schema walk every save makes). */
static size_t written_floats(const stage *st, const optim *opt, ckpt_gtensor *gt, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const param_tensor *t = ckpt_written_tensor(st, opt, &gt[i], i);
        if (t) total += t->numel;
    }
    return total;
}

/* Host bytes of one snapshot: 3 floats (params, m, v) per written parameter. */
double ckpt_async_snapshot_bytes(const stage *st, const optim *opt) {
    ckpt_gtensor *gt = calloc((size_t)model_num_tensors(&st->cfg), sizeof *gt);
    if (!gt) return 0.0;
    int n = ckpt_global_tensors(&st->cfg, gt);
    double b = 3.0 * sizeof(float) * (double)written_floats(st, opt, gt, n);
    free(gt);
    return b;
}

/* The thread level MPI gave, by name; 1 if a second thread may call MPI. */
int ckpt_async_thread_ok(const char **level) {
    static const char *names[] = {"MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED", "MPI_THREAD_SERIALIZED",
                                  "MPI_THREAD_MULTIPLE"};
    int p = MPI_THREAD_SINGLE;
    MPI_Query_thread(&p);
    *level = p == MPI_THREAD_SINGLE ? names[0] : p == MPI_THREAD_FUNNELED ? names[1]
           : p == MPI_THREAD_SERIALIZED ? names[2] : names[3];
    return p == MPI_THREAD_MULTIPLE;
}

/* The writer's own communicator (collective) and an empty state. */
int ckpt_async_init(ckpt_async **out, MPI_Comm comm, char *err, size_t errlen) {
    ckpt_async *a = calloc(1, sizeof *a);
    *out = NULL;
    if (!a) {
        snprintf(err, errlen, "--ckpt-async: out of memory");
        return PL_ENOMEM;
    }
    if (MPI_Comm_dup(comm, &a->comm) != MPI_SUCCESS) {
        snprintf(err, errlen, "--ckpt-async: MPI_Comm_dup of the writer's communicator failed");
        free(a);
        return PL_EMPI;
    }
    atomic_init(&a->done, 0);
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    *out = a;
    return PL_OK;
}

/* The snapshot's layout (once, at the first save): the copied table with the written
 * tensors at consecutive offsets, the three host buffers, the stage and optimizer views. */
static int snapshot_layout(ckpt_async *a, const stage *st, const optim *opt, char *err, size_t errlen) {
    int n = model_num_tensors(&st->cfg);
    ckpt_gtensor *gt = calloc((size_t)n, sizeof *gt);
    a->tensors = calloc((size_t)st->ntensors, sizeof *a->tensors);
    a->written = calloc((size_t)st->ntensors, 1);
    if (!gt || !a->tensors || !a->written) goto oom;
    n = ckpt_global_tensors(&st->cfg, gt);
    memcpy(a->tensors, st->tensors, (size_t)st->ntensors * sizeof *a->tensors);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const param_tensor *t = ckpt_written_tensor(st, opt, &gt[i], i);
        if (!t) continue;
        a->tensors[t - st->tensors].offset = off;
        a->written[t - st->tensors] = 1;
        off += t->numel;
    }
    a->nfloat = off;
    for (int s = 0; s < 3; s++)
        if (!(a->buf[s] = malloc((off ? off : 1) * sizeof(float)))) goto oom;
    memset(&a->snap, 0, sizeof a->snap);
    a->snap.cfg = st->cfg;
    a->snap.arch = st->arch;
    a->snap.l0 = st->l0;
    a->snap.l1 = st->l1;
    a->snap.nb = st->nb;
    a->snap.has_embed = st->has_embed;
    a->snap.has_head = st->has_head;
    a->snap.be = &backend_cpu; /* host memory: the writer maps for free and computes the CRCs beside the writes */
    a->snap.nparams = off;
    a->snap.params = a->buf[0];
    a->snap.ntensors = st->ntensors;
    a->snap.tensors = a->tensors;
    memset(&a->sopt, 0, sizeof a->sopt);
    a->sopt.st = &a->snap;
    a->sopt.be = &backend_cpu;
    a->sopt.h = opt->h;
    a->sopt.m = a->buf[1];
    a->sopt.v = a->buf[2];
    a->sopt.nmoment = off;
    a->sopt.dp_rank = opt->dp_rank;
    a->sopt.dp_size = opt->dp_size;
    free(gt);
    return PL_OK;
oom:
    free(gt);
    snprintf(err, errlen, "--ckpt-async: out of memory for the snapshot (%.1f MB of host memory)",
             3.0 * sizeof(float) * (double)a->nfloat / 1e6);
    return PL_ENOMEM;
}

/* The snapshot's buffers, allocated and touched once, before the first save. */
int ckpt_async_prepare(ckpt_async *a, const stage *st, const optim *opt, char *err, size_t errlen) {
    if (a->tensors) return PL_OK;
    PL_TRY(snapshot_layout(a, st, opt, err, errlen));
    for (int s = 0; s < 3; s++) memset(a->buf[s], 0, a->nfloat * sizeof(float)); /* the pages, now */
    return PL_OK;
}

/* Copy every written tensor of the three buffers into the snapshot, through the backend, or
 * (host: the writer thread's deferred copy of a host-memory backend's buffers) with memcpy,
 * so that the writer never enters the backend, nor its op profiler's counters. */
static int snapshot_copy(ckpt_async *a, const stage *st, const optim *opt, int host, char *err, size_t errlen) {
    static const int which[3] = {OPTIM_PARAMS, OPTIM_M, OPTIM_V};
    const backend *be = st->be;
    for (int s = 0; s < 3; s++) {
        const float *src = optim_buffer(opt, which[s]);
        for (int j = 0; j < st->ntensors; j++) {
            const param_tensor *t = &st->tensors[j];
            if (!a->written[j]) continue;
            if (host) {
                memcpy(a->buf[s] + a->tensors[j].offset, src + t->offset, t->numel * sizeof(float));
                continue;
            }
            if (be->to_host(a->buf[s] + a->tensors[j].offset, src + t->offset, t->numel * sizeof(float)) != PL_OK) {
                const char *why = be->error ? be->error() : "";
                snprintf(err, errlen, "--ckpt-async: backend %s: copying tensor %d into the snapshot failed: %s",
                         be->name, j, why && why[0] ? why : "no message from the backend");
                return PL_EBACKEND;
            }
        }
    }
    return PL_OK;
}

/* The writer thread: the ordinary atomic save, from the snapshot, on the writer's
 * communicator; it touches nothing the training thread uses. */
static void *writer_main(void *arg) {
    ckpt_async *a = arg;
    /* The writer takes only what the training threads leave idle (SCHED_IDLE: their MPI waits,
     * the pipeline's bubbles), so that a step during the write is barely slower; the CRC thread
     * of the save inherits it. Where the policy is refused it runs at the normal priority. */
    struct sched_param sp = {0};
    if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp) != 0) { /* normal priority */ }
    ckpt_write_piece = 4u << 20; /* MPI-IO writes of 4 MiB: the training thread's MPI calls get in between */
    const char *e = hooks_env("PIPELM_CKPT_ASYNC_PIECE"); /* bytes per write */
    if (e && atol(e) > 0) ckpt_write_piece = (size_t)atol(e);
    if (a->live_st) { /* deferred: copy first (host memory), then let the optimizer go on */
        const char *d = hooks_env("PIPELM_CKPT_ASYNC_COPY_DELAY_MS"); /* a slow copy */
        long ms = d ? atol(d) : 0;
        if (ms > 0) {
            struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        a->rc = snapshot_copy(a, a->live_st, a->live_opt, 1, a->err, sizeof a->err);
        pthread_mutex_lock(&a->mu);
        a->copied = 1;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        /* every rank defers alike (train_ckpt.c): the writers agree on their copies first, so
         * a failed one ends every rank's save and none waits in ckpt_save for it */
        a->rc = ckpt_agree(a->comm, a->rc, a->err, sizeof a->err);
    }
    if (a->rc == PL_OK)
        a->rc = ckpt_save(a->dir, &a->snap, &a->sopt, &a->meta, a->keep, a->comm, a->path, sizeof a->path, &a->bytes,
                          a->err, sizeof a->err);
    a->t_end = pl_now();
    atomic_store(&a->done, 1);
    return NULL;
}

/* Snapshot, then start the writer (no MPI here: the writers' calls are collective). */
int ckpt_async_begin(ckpt_async *a, const char *dir, stage *st, optim *opt, const ckpt_meta *meta, int keep,
                     int defer, double *snap_s, char *err, size_t errlen) {
    double t0 = pl_now();
    *snap_s = 0.0;
    if (a->running) {
        snprintf(err, errlen, "--ckpt-async: the save of step %lld is still being written", a->meta.step);
        return PL_ESTATE;
    }
    PL_TRY(ckpt_async_prepare(a, st, opt, err, errlen));
    if (a->snap.ntensors != st->ntensors) {
        snprintf(err, errlen, "--ckpt-async: the stage's tensor table changed between saves");
        return PL_ESTATE;
    }
    defer = defer && st->be->host_memory;
    if (!defer) PL_TRY(snapshot_copy(a, st, opt, 0, err, errlen));
    a->live_st = defer ? st : NULL, a->live_opt = defer ? opt : NULL, a->copied = !defer;
    snprintf(a->dir, sizeof a->dir, "%s", dir);
    a->meta = *meta;
    a->sopt.h = opt->h;
    a->keep = keep;
    a->rc = PL_OK;
    a->err[0] = a->path[0] = 0;
    a->bytes = 0.0;
    a->t_begin = t0;
    atomic_store(&a->done, 0);
    if (pthread_create(&a->thread, NULL, writer_main, a) != 0) {
        snprintf(err, errlen, "--ckpt-async: cannot start the writer thread");
        return PL_ENOMEM;
    }
    a->running = 1;
    *snap_s = pl_now() - t0;
    return PL_OK;
}

/* Before the training thread changes the parameters or moments (the optimizer step): a
 * deferred snapshot still being copied is waited for; *wait_s the seconds waited. */
void ckpt_async_fence(ckpt_async *a, double *wait_s) {
    *wait_s = 0.0;
    if (!a || !a->running || !a->live_st) return;
    double t0 = pl_now();
    pthread_mutex_lock(&a->mu);
    while (!a->copied) pthread_cond_wait(&a->cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
    a->live_st = NULL, a->live_opt = NULL; /* the writer read them before it set copied */
    *wait_s = pl_now() - t0;
}

/* A writer started and not joined? */
int ckpt_async_busy(const ckpt_async *a) { return a && a->running; }

/* The writer has returned (joinable without waiting)? */
int ckpt_async_done(const ckpt_async *a) { return a && a->running && atomic_load(&a->done); }

/* Seconds since the running writer started. */
double ckpt_async_age(const ckpt_async *a) { return a && a->running ? pl_now() - a->t_begin : 0.0; }

/* The step the writer saves. */
long long ckpt_async_step(const ckpt_async *a) { return a ? a->meta.step : -1; }

/* Join a writer that has returned: its agreed status and figures. */
int ckpt_async_join(ckpt_async *a, char *path, size_t pathlen, double *bytes, double *write_s, char *err,
                    size_t errlen) {
    if (!a->running) {
        snprintf(err, errlen, "--ckpt-async: no writer to join");
        return PL_ESTATE;
    }
    pthread_join(a->thread, NULL);
    a->running = 0;
    a->live_st = NULL, a->live_opt = NULL;
    snprintf(path, pathlen, "%s", a->path);
    *bytes = a->bytes;
    *write_s = a->t_end - a->t_begin;
    snprintf(err, errlen, "%s", a->err);
    return a->rc;
}

/* Free what the writer used, unless it still runs (the rank is about to end). */
void ckpt_async_free(ckpt_async *a, int agreed) {
    if (!a) return;
    if (a->running) return; /* on the way to MPI_Abort: the writer may still read its state */
    if (agreed && a->comm != MPI_COMM_NULL) MPI_Comm_free(&a->comm);
    for (int s = 0; s < 3; s++) free(a->buf[s]);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a->tensors);
    free(a->written);
    free(a);
}
