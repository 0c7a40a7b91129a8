/*
 * engine.c — the per-rank action interpreter of a pipeline schedule.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include "pipelm/common.h"
#include "pipelm/engine.h"
#include "pipelm/trace.h"

/* Message tag: direction (0 activations, 1 gradients), step parity, micro-batch. */
static int msg_tag(int dir, long step, int mb, int M) { return ((int)(step & 1) * 2 + dir) * M + mb; }

int engine_init(engine *e, stage *st, const sched *sc, MPI_Comm comm, char *err, size_t errlen) {
    memset(e, 0, sizeof *e);
    e->comm = comm;
    MPI_Comm_rank(comm, &e->rank);
    MPI_Comm_size(comm, &e->P);
    e->M = sc->M;
    e->st = st;
    e->sc = sc;
    e->fail_rank = -1;
    if (!st->be->host_memory) {
        snprintf(err, errlen, "backend %s: the engine needs host-accessible buffers for MPI", st->be->name);
        return PL_EINVAL;
    }
    size_t slice = (size_t)st->N * st->cfg.C * sizeof(float), M = e->M;
    int first = e->rank == 0, last = e->rank == e->P - 1;
    e->recv_f = first ? NULL : st->be->alloc(M * slice);
    e->recv_b = last ? NULL : st->be->alloc(M * slice);
    e->send_b = first ? NULL : st->be->alloc(M * slice);
    e->rq_f = malloc(sizeof(MPI_Request) * M);
    e->rq_b = malloc(sizeof(MPI_Request) * M);
    e->sq_f = malloc(sizeof(MPI_Request) * M);
    e->sq_b = malloc(sizeof(MPI_Request) * M);
    e->mb_loss = calloc(M, sizeof(double));
    if ((!first && (!e->recv_f || !e->send_b)) || (!last && !e->recv_b) || !e->rq_f || !e->rq_b ||
        !e->sq_f || !e->sq_b || !e->mb_loss) {
        snprintf(err, errlen, "out of memory for %zu micro-batch communication buffers", M);
        engine_free(e);
        return PL_ENOMEM;
    }
    return PL_OK;
}

void engine_free(engine *e) {
    if (e->st) {
        e->st->be->free(e->recv_f);
        e->st->be->free(e->recv_b);
        e->st->be->free(e->send_b);
    }
    free(e->rq_f);
    free(e->rq_b);
    free(e->sq_f);
    free(e->sq_b);
    free(e->mb_loss);
    memset(e, 0, sizeof *e);
}

/* Wait for a request, charging the time to t_wait (and the trace). When ranks outnumber
 * cores (e.polite), poll with MPI_Test and yield the core between polls, so a waiting rank
 * does not steal cycles from the rank it is waiting for; otherwise MPI_Wait spins. */
static int timed_wait(engine *e, MPI_Request *rq, const char *what, int mb) {
    double t0 = pl_now();
    if (e->polite) {
        int done = 0;
        for (;;) {
            PL_MPI_CHECK(MPI_Test(rq, &done, MPI_STATUS_IGNORE));
            if (done) break;
            sched_yield();
        }
    } else {
        PL_MPI_CHECK(MPI_Wait(rq, MPI_STATUS_IGNORE));
    }
    double t1 = pl_now();
    e->t_wait += t1 - t0;
    if (e->tr && t1 - t0 > 1e-6) trace_event(e->tr, what, "wait", mb, t0, t1);
    return PL_OK;
}

int engine_step(engine *e, long step, const int *inputs, const int *targets, float dloss, double *loss_sum) {
    stage *st = e->st;
    int M = e->M, r = e->rank, P = e->P, N = st->N, C = st->cfg.C;
    size_t slice = (size_t)N * C;
    for (int m = 0; m < M; m++) {
        e->rq_f[m] = e->rq_b[m] = e->sq_f[m] = e->sq_b[m] = MPI_REQUEST_NULL;
        e->mb_loss[m] = 0.0;
    }
    /* post every receive of the step up front */
    const sched_action *acts = e->sc->acts[r];
    int n = e->sc->n[r];
    for (int i = 0; i < n; i++) {
        int m = acts[i].mb;
        if (acts[i].op == SCHED_RECV_F)
            PL_MPI_CHECK(MPI_Irecv(e->recv_f + m * slice, (int)slice, MPI_FLOAT, r - 1,
                                   msg_tag(0, step, m, M), e->comm, &e->rq_f[m]));
        else if (acts[i].op == SCHED_RECV_B)
            PL_MPI_CHECK(MPI_Irecv(e->recv_b + m * slice, (int)slice, MPI_FLOAT, r + 1,
                                   msg_tag(1, step, m, M), e->comm, &e->rq_b[m]));
    }
    int rows = st->Bm * st->T;
    for (int i = 0; i < n; i++) {
        int m = acts[i].mb, slot;
        if (i == 1 && r == e->fail_rank && step == e->fail_step) {
            pl_error("injected failure (--fail-rank %d --fail-step %d) in the middle of step %ld",
                     e->fail_rank, e->fail_step, step);
            return PL_EPEER;
        }
        switch (acts[i].op) {
        case SCHED_RECV_F:
        case SCHED_RECV_B:
            break; /* already posted */
        case SCHED_F: {
            if (r > 0) PL_TRY(timed_wait(e, &e->rq_f[m], "wait recv F", m));
            double t0 = pl_now();
            PL_TRY(stage_forward(st, m, st->has_embed ? inputs + (size_t)m * rows : NULL,
                                 r > 0 ? e->recv_f + m * slice : NULL,
                                 st->has_head ? targets + (size_t)m * rows : NULL, dloss,
                                 &e->mb_loss[m], &slot));
            double t1 = pl_now();
            e->t_fwd += t1 - t0;
            if (e->tr) trace_event(e->tr, "F", "compute", m, t0, t1);
            break;
        }
        case SCHED_SEND_F:
            slot = stage_slot_of(st, m);
            if (slot < 0) {
                pl_error("schedule sends forward micro-batch %d before computing it", m);
                return PL_EINVAL;
            }
            PL_MPI_CHECK(MPI_Isend(stage_output(st, slot), (int)slice, MPI_FLOAT, r + 1,
                                   msg_tag(0, step, m, M), e->comm, &e->sq_f[m]));
            if (e->tr) { double t = pl_now(); trace_event(e->tr, "send F", "comm", m, t, t); }
            break;
        case SCHED_B: {
            slot = stage_slot_of(st, m);
            if (slot < 0) {
                pl_error("schedule runs backward of micro-batch %d before its forward", m);
                return PL_EINVAL;
            }
            if (r < P - 1) PL_TRY(timed_wait(e, &e->rq_b[m], "wait recv B", m));
            /* the slot's output buffer is reused after this backward: the send must be done */
            if (e->sq_f[m] != MPI_REQUEST_NULL) PL_TRY(timed_wait(e, &e->sq_f[m], "wait send F", m));
            double t0 = pl_now();
            PL_TRY(stage_backward(st, slot, r < P - 1 ? e->recv_b + m * slice : NULL));
            double t1 = pl_now();
            e->t_bwd += t1 - t0;
            if (e->tr) trace_event(e->tr, "B", "compute", m, t0, t1);
            break;
        }
        case SCHED_SEND_B:
            st->be->copy(e->send_b + m * slice, stage_dinput(st), slice * sizeof(float));
            PL_MPI_CHECK(MPI_Isend(e->send_b + m * slice, (int)slice, MPI_FLOAT, r - 1,
                                   msg_tag(1, step, m, M), e->comm, &e->sq_b[m]));
            if (e->tr) { double t = pl_now(); trace_event(e->tr, "send B", "comm", m, t, t); }
            break;
        }
    }
    /* finish the sends of this step */
    for (int m = 0; m < M; m++) {
        if (e->sq_f[m] != MPI_REQUEST_NULL) PL_TRY(timed_wait(e, &e->sq_f[m], "wait send F", m));
        if (e->sq_b[m] != MPI_REQUEST_NULL) PL_TRY(timed_wait(e, &e->sq_b[m], "wait send B", m));
        if (e->rq_f[m] != MPI_REQUEST_NULL || e->rq_b[m] != MPI_REQUEST_NULL) {
            pl_error("step %ld: a receive of micro-batch %d was never consumed by the schedule", step, m);
            return PL_EINVAL;
        }
    }
    double sum = 0.0;
    for (int m = 0; m < M; m++) sum += e->mb_loss[m];
    *loss_sum = sum;
    return PL_OK;
}

int engine_eval(engine *e, const int *inputs, const int *targets, double *loss_sum) {
    stage *st = e->st;
    int r = e->rank, P = e->P, rows = st->N;
    size_t slice = (size_t)st->N * st->cfg.C;
    double sum = 0.0;
    for (int m = 0; m < e->M; m++) {
        int slot;
        double l = 0.0;
        if (r > 0)
            PL_MPI_CHECK(MPI_Recv(e->recv_f, (int)slice, MPI_FLOAT, r - 1, 4 * e->M + m, e->comm, MPI_STATUS_IGNORE));
        PL_TRY(stage_forward(st, m, st->has_embed ? inputs + (size_t)m * rows : NULL,
                             r > 0 ? e->recv_f : NULL, st->has_head ? targets + (size_t)m * rows : NULL,
                             0.0f, &l, &slot));
        if (r < P - 1)
            PL_MPI_CHECK(MPI_Send(stage_output(st, slot), (int)slice, MPI_FLOAT, r + 1, 4 * e->M + m, e->comm));
        stage_release_all(st);
        sum += l;
    }
    *loss_sum = sum;
    return PL_OK;
}
