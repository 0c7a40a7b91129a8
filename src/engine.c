/*
 * engine.c — the per-rank action interpreter of a pipeline schedule.
 *
 * MPI never touches backend memory directly: every buffer a message reads or fills is a host
 * view from the backend's map (the buffer itself on a host backend, a staged copy on a
 * device backend), held from the post until the request completes, then unmapped.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "pipelm/comm.h"
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
    e->first_bad_fwd = -1;
    size_t slice = (size_t)st->N * st->cfg.C * sizeof(float), M = e->M;
    int first = e->rank == 0, last = e->rank == e->P - 1, rc = PL_OK;
    void *p = NULL;
    if (!first && (rc = st->be->alloc(&p, M * slice)) == PL_OK) e->recv_f = p;
    if (!last && rc == PL_OK && (rc = st->be->alloc(&p, M * slice)) == PL_OK) e->recv_b = p;
    if (!first && rc == PL_OK && (rc = st->be->alloc(&p, M * slice)) == PL_OK) e->send_b = p;
    if (rc != PL_OK) {
        snprintf(err, errlen, "backend %s: %s, for %zu micro-batch communication buffers", st->be->name,
                 stage_error(st), M);
        engine_free(e);
        return rc;
    }
    e->hv = calloc(4 * M, sizeof(void *));
    e->rq_f = malloc(sizeof(MPI_Request) * M);
    e->rq_b = malloc(sizeof(MPI_Request) * M);
    e->sq_f = malloc(sizeof(MPI_Request) * M);
    e->sq_b = malloc(sizeof(MPI_Request) * M);
    e->mb_loss = calloc(M, sizeof(double));
    e->b_done = calloc(M, 1);
    if (!e->hv || !e->rq_f || !e->rq_b ||
        !e->sq_f || !e->sq_b || !e->mb_loss || !e->b_done) {
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
    free(e->hv);
    free(e->rq_f);
    free(e->rq_b);
    free(e->sq_f);
    free(e->sq_b);
    free(e->mb_loss);
    free(e->b_done);
    memset(e, 0, sizeof *e);
}

/* Wait for a request under the watchdog (comm.c), charging the time to t_wait and the
 * trace. `act` is the action the wait belongs to, named in the watchdog's message. */
static int timed_wait(engine *e, MPI_Request *rq, const char *what, sched_op op, int mb, int peer, long step) {
    double t0 = pl_now();
    char name[64];
    sched_action a = {op, e->rank, mb};
    if (sched_action_format(&a, name, sizeof name) != 0) snprintf(name, sizeof name, "%s", what);
    snprintf(name + strlen(name), sizeof name - strlen(name), " (%s)", what);
    comm_what w = {name, peer, mb, step};
    PL_TRY(comm_wait(rq, &w));
    double t1 = pl_now();
    e->t_wait += t1 - t0;
    if (e->tr && t1 - t0 > 1e-6) trace_event(e->tr, what, "wait", mb, t0, t1);
    return PL_OK;
}

/* Host views: [0, M) receive F, [M, 2M) receive B, [2M, 3M) send F, [3M, 4M) send B. */
enum { HV_RF, HV_RB, HV_SF, HV_SB };

/* A host view of n floats at p for a message (kind HV_*, micro-batch m). */
static int view(engine *e, int kind, int m, float *p, size_t n, void **host) {
    int mode = kind == HV_RF || kind == HV_RB ? PL_MAP_WRITE : PL_MAP_READ;
    int rc = e->st->be->map(host, p, n * sizeof(float), mode);
    if (rc != PL_OK) {
        pl_error("backend %s: mapping micro-batch %d's message buffer: %s", e->st->be->name, m, stage_error(e->st));
        return rc;
    }
    e->hv[(size_t)kind * e->M + m] = *host;
    return PL_OK;
}

/* After the request completed: a received message is copied into backend memory. */
static int unview(engine *e, int kind, int m, float *p, size_t n) {
    void **h = &e->hv[(size_t)kind * e->M + m];
    if (!*h) return PL_OK;
    int mode = kind == HV_RF || kind == HV_RB ? PL_MAP_WRITE : PL_MAP_READ;
    int rc = e->st->be->unmap(*h, p, n * sizeof(float), mode);
    *h = NULL;
    if (rc != PL_OK) pl_error("backend %s: unmapping micro-batch %d's message buffer: %s", e->st->be->name, m,
                              stage_error(e->st));
    return rc;
}

/* Run one F: wait for its input, forward it into the micro-batch's slot. */
static int run_forward(engine *e, long step, int m, const int *inputs, const int *targets, float dloss) {
    stage *st = e->st;
    int r = e->rank, slot, rows = st->Bm * st->T;
    size_t slice = (size_t)st->N * st->cfg.C;
    /* the LM head's weight gradient is added inside the last stage's forward */
    if (st->has_head && dloss > 0.0f && m != e->next_f) {
        pl_error("step %ld: action %dF%d adds to the head's gradient out of micro-batch order "
                 "(micro-batch %d is next); refusing to run it", step, r, m, e->next_f);
        return PL_EINVAL;
    }
    if (r > 0) {
        PL_TRY(timed_wait(e, &e->rq_f[m], "wait recv F", SCHED_RECV_F, m, r - 1, step));
        PL_TRY(unview(e, HV_RF, m, e->recv_f + m * slice, slice));
    }
    double t0 = pl_now();
    PL_TRY(stage_forward(st, m, st->has_embed ? inputs + (size_t)m * rows : NULL,
                         r > 0 ? e->recv_f + m * slice : NULL, st->has_head ? targets + (size_t)m * rows : NULL,
                         dloss, &e->mb_loss[m], &slot));
    double t1 = pl_now();
    e->t_fwd += t1 - t0;
    e->t_op[SCHED_F] += t1 - t0;
    e->n_op[SCHED_F]++;
    e->next_f++;
    /* remember where a non-finite value first shows, for the NaN message */
    double out_sq = 0.0;
    if (!st->has_head) PL_TRY(st->be->sumsq(stage_output(st, slot), slice, &out_sq));
    if (e->first_bad_fwd < 0 && !(st->has_head ? isfinite(e->mb_loss[m]) : isfinite(out_sq)))
        e->first_bad_fwd = m;
    if (e->tr) trace_event(e->tr, "F", "compute", m, t0, t1);
    return PL_OK;
}

/* Run one B (op SCHED_B) or its input part I (SCHED_I): wait for the output gradient and
 * for the forward send that reads the slot, then the backward; the input gradient moves at
 * once into the micro-batch's own send buffer (the stage's dinput is scratch the next
 * backward overwrites). B adds to the weight gradients, so it runs in micro-batch order. */
static int run_backward(engine *e, long step, int m, sched_op op) {
    stage *st = e->st;
    int r = e->rank, P = e->P, whole = op == SCHED_B;
    size_t slice = (size_t)st->N * st->cfg.C;
    int slot = stage_slot_of(st, m);
    const char *name = whole ? "B" : "I";
    if (slot < 0) {
        pl_error("step %ld: schedule runs %d%s%d before its forward", step, r, name, m);
        return PL_EINVAL;
    }
    if (whole && m != e->next_b) {
        pl_error("step %ld: action %dB%d adds to the weight gradients out of micro-batch order "
                 "(micro-batch %d is next); refusing to run it", step, r, m, e->next_b);
        return PL_EINVAL;
    }
    if (r < P - 1) {
        PL_TRY(timed_wait(e, &e->rq_b[m], "wait recv B", SCHED_RECV_B, m, r + 1, step));
        PL_TRY(unview(e, HV_RB, m, e->recv_b + m * slice, slice));
    }
    if (e->sq_f[m] != MPI_REQUEST_NULL) {
        PL_TRY(timed_wait(e, &e->sq_f[m], "wait send F", SCHED_SEND_F, m, r + 1, step));
        PL_TRY(unview(e, HV_SF, m, stage_output(st, slot), slice));
    }
    double t0 = pl_now();
    const float *dout = r < P - 1 ? e->recv_b + m * slice : NULL;
    PL_TRY(whole ? stage_backward(st, slot, dout) : stage_backward_input(st, slot, dout));
    if (r > 0) PL_TRY(st->be->copy(e->send_b + m * slice, stage_dinput(st), slice * sizeof(float)));
    e->b_done[m] = 1;
    if (whole) e->next_b++;
    double t1 = pl_now();
    e->t_bwd += t1 - t0;
    e->t_op[op] += t1 - t0;
    e->n_op[op]++;
    if (e->tr) trace_event(e->tr, name, "compute", m, t0, t1);
    return PL_OK;
}

/* Run one W: the weight part of a micro-batch whose I has run, in micro-batch order. */
static int run_weight(engine *e, long step, int m) {
    stage *st = e->st;
    int r = e->rank, slot = stage_slot_of(st, m);
    if (slot < 0 || !e->b_done[m]) {
        pl_error("step %ld: schedule runs %dW%d before its %s", step, r, m, slot < 0 ? "forward" : "input part (I)");
        return PL_EINVAL;
    }
    if (m != e->next_b) {
        pl_error("step %ld: action %dW%d adds to the weight gradients out of micro-batch order "
                 "(micro-batch %d is next); refusing to run it", step, r, m, e->next_b);
        return PL_EINVAL;
    }
    double t0 = pl_now();
    PL_TRY(stage_backward_weight(st, slot));
    e->next_b++;
    double t1 = pl_now();
    e->t_bwd += t1 - t0;
    e->t_op[SCHED_W] += t1 - t0;
    e->n_op[SCHED_W]++;
    if (e->tr) trace_event(e->tr, "W", "compute", m, t0, t1);
    return PL_OK;
}

/* Injected failure (--fail-rank/--fail-step/--fail-at during) in the middle of a step. */
static int injected(const engine *e, long step, int i) {
    if (i != 1 || e->rank != e->fail_rank || step != e->fail_step || !e->fail_during) return 0;
    pl_error("injected failure (--fail-rank %d --fail-step %d) in the middle of step %ld", e->fail_rank,
             e->fail_step, step);
    return 1;
}

/* Post every receive of the step up front, each into its micro-batch's buffer. */
static int post_receives(engine *e, long step) {
    int M = e->M, r = e->rank;
    size_t slice = (size_t)e->st->N * e->st->cfg.C;
    const sched_action *acts = e->sc->acts[r];
    int n = e->sc->n[r];
    for (int i = 0; i < n; i++) {
        int m = acts[i].mb;
        void *h;
        if (acts[i].op == SCHED_RECV_F) {
            PL_TRY(view(e, HV_RF, m, e->recv_f + m * slice, slice, &h));
            PL_MPI_CHECK(MPI_Irecv(h, (int)slice, MPI_FLOAT, r - 1, msg_tag(0, step, m, M), e->comm, &e->rq_f[m]));
        } else if (acts[i].op == SCHED_RECV_B) {
            PL_TRY(view(e, HV_RB, m, e->recv_b + m * slice, slice, &h));
            PL_MPI_CHECK(MPI_Irecv(h, (int)slice, MPI_FLOAT, r + 1, msg_tag(1, step, m, M), e->comm, &e->rq_b[m]));
        }
    }
    return PL_OK;
}

/* Finish the sends of this step and release their views; every receive must be used. */
static int finish_sends(engine *e, long step) {
    stage *st = e->st;
    int M = e->M, r = e->rank;
    size_t slice = (size_t)st->N * st->cfg.C;
    for (int m = 0; m < M; m++) {
        if (e->sq_f[m] != MPI_REQUEST_NULL)
            PL_TRY(timed_wait(e, &e->sq_f[m], "wait send F", SCHED_SEND_F, m, r + 1, step));
        if (e->sq_b[m] != MPI_REQUEST_NULL)
            PL_TRY(timed_wait(e, &e->sq_b[m], "wait send B", SCHED_SEND_B, m, r - 1, step));
        /* a send F's slot may be gone (its B ran): its view is only released here */
        if (e->hv[(size_t)HV_SF * M + m]) {
            int slot = stage_slot_of(st, m);
            PL_TRY(st->be->unmap(e->hv[(size_t)HV_SF * M + m], slot >= 0 ? stage_output(st, slot) : NULL,
                                 slice * sizeof(float), PL_MAP_READ));
            e->hv[(size_t)HV_SF * M + m] = NULL;
        }
        PL_TRY(unview(e, HV_SB, m, e->send_b + m * slice, slice));
        if (e->rq_f[m] != MPI_REQUEST_NULL || e->rq_b[m] != MPI_REQUEST_NULL) {
            pl_error("step %ld: a receive of micro-batch %d was never consumed by the schedule", step, m);
            return PL_EINVAL;
        }
    }
    return PL_OK;
}

int engine_step(engine *e, long step, const int *inputs, const int *targets, float dloss, double *loss_sum) {
    stage *st = e->st;
    int M = e->M, r = e->rank;
    size_t slice = (size_t)st->N * st->cfg.C;
    for (int m = 0; m < M; m++) {
        e->rq_f[m] = e->rq_b[m] = e->sq_f[m] = e->sq_b[m] = MPI_REQUEST_NULL;
        e->mb_loss[m] = 0.0;
        e->b_done[m] = 0;
    }
    e->next_f = e->next_b = 0;
    PL_TRY(post_receives(e, step));
    const sched_action *acts = e->sc->acts[r];
    int n = e->sc->n[r];
    for (int i = 0; i < n; i++) {
        int m = acts[i].mb, slot;
        void *h;
        if (injected(e, step, i)) return PL_EPEER;
        switch (acts[i].op) {
        case SCHED_RECV_F:
        case SCHED_RECV_B:
            break; /* already posted */
        case SCHED_F:
            PL_TRY(run_forward(e, step, m, inputs, targets, dloss));
            break;
        case SCHED_SEND_F:
            slot = stage_slot_of(st, m);
            if (slot < 0) {
                pl_error("step %ld: schedule sends %dSEND_F%d before computing its forward", step, r, m);
                return PL_EINVAL;
            }
            PL_TRY(view(e, HV_SF, m, stage_output(st, slot), slice, &h));
            PL_MPI_CHECK(MPI_Isend(h, (int)slice, MPI_FLOAT, r + 1, msg_tag(0, step, m, M), e->comm, &e->sq_f[m]));
            if (e->tr) { double t = pl_now(); trace_event(e->tr, "send F", "comm", m, t, t); }
            break;
        case SCHED_B:
        case SCHED_I:
            PL_TRY(run_backward(e, step, m, acts[i].op));
            break;
        case SCHED_W:
            PL_TRY(run_weight(e, step, m));
            break;
        case SCHED_SEND_B:
            if (!e->b_done[m]) {
                pl_error("step %ld: schedule sends %dSEND_B%d before its backward", step, r, m);
                return PL_EINVAL;
            }
            PL_TRY(view(e, HV_SB, m, e->send_b + m * slice, slice, &h));
            PL_MPI_CHECK(MPI_Isend(h, (int)slice, MPI_FLOAT, r - 1, msg_tag(1, step, m, M), e->comm, &e->sq_b[m]));
            if (e->tr) { double t = pl_now(); trace_event(e->tr, "send B", "comm", m, t, t); }
            break;
        }
    }
    PL_TRY(finish_sends(e, step));
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
        MPI_Request rq = MPI_REQUEST_NULL;
        comm_what w = {"evaluation forward input", r - 1, m, -1};
        void *h;
        if (r > 0) {
            PL_TRY(view(e, HV_RF, 0, e->recv_f, slice, &h));
            PL_MPI_CHECK(MPI_Irecv(h, (int)slice, MPI_FLOAT, r - 1, 4 * e->M + m, e->comm, &rq));
            PL_TRY(comm_wait(&rq, &w));
            PL_TRY(unview(e, HV_RF, 0, e->recv_f, slice));
        }
        PL_TRY(stage_forward(st, m, st->has_embed ? inputs + (size_t)m * rows : NULL,
                             r > 0 ? e->recv_f : NULL, st->has_head ? targets + (size_t)m * rows : NULL,
                             0.0f, &l, &slot));
        if (r < P - 1) {
            w.what = "evaluation forward output";
            w.peer = r + 1;
            PL_TRY(view(e, HV_SF, 0, stage_output(st, slot), slice, &h));
            PL_MPI_CHECK(MPI_Isend(h, (int)slice, MPI_FLOAT, r + 1, 4 * e->M + m, e->comm, &rq));
            PL_TRY(comm_wait(&rq, &w));
            PL_TRY(unview(e, HV_SF, 0, stage_output(st, slot), slice));
        }
        stage_release_all(st);
        sum += l;
    }
    *loss_sum = sum;
    return PL_OK;
}
