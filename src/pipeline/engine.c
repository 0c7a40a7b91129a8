/*
 * engine.c — the per-rank action interpreter of a pipeline schedule.
 *
 * Every action names a global stage s; this rank runs it as chunk c = s / P. Activations go
 * from stage s to s + 1 and gradients from s to s - 1, on the ranks the schedule's placement
 * names (sched.h): in the loop placement stage s is on rank s mod P, so with one chunk per
 * rank the peers are rank +- 1, and with V chunks the last rank's output of chunk c goes to
 * rank 0's chunk c + 1; in the V placement stages P - 1 and P are both on rank P - 1, which
 * hands the activation (and the gradient) from one chunk to the other by a copy, with no
 * message. Each (chunk, micro-batch) owns its receive and send buffers.
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
#include <time.h>
#include "parallel/comm.h"
#include "util/common.h"
#include "pipeline/engine.h"
#include "pipeline/trace.h"

/* Message tag: direction (0 activations, 1 gradients), step parity, receiving stage, micro-batch. */
static int msg_tag(const engine *e, int dir, long step, int s_recv, int mb) {
    return (((int)(step & 1) * 2 + dir) * e->S + s_recv) * e->M + mb;
}
/* Evaluation messages sit above every training tag. */
static int eval_tag(const engine *e, int s_recv, int mb) { return (4 * e->S + s_recv) * e->M + mb; }

/* The rank of global stage s (the schedule's placement). */
static int rank_of(const engine *e, int s) { return sched_place_rank(e->sc->place, e->P, s); }

/* The global stage this rank runs as chunk c. */
static int stage_of(const engine *e, int c) { return sched_place_stage(e->sc->place, e->P, e->rank, c); }

/* 1 if stages a and a + 1 both run on this rank in a V placement: a copy, no message. */
static int local_edge(const engine *e, int a) {
    return e->sc->place == SCHED_PLACE_V && a >= 0 && a + 1 < e->S && rank_of(e, a) == e->rank &&
           rank_of(e, a + 1) == e->rank;
}

int engine_init(engine *e, stage *st, int V, const sched *sc, MPI_Comm comm, char *err, size_t errlen) {
    memset(e, 0, sizeof *e);
    e->comm = comm;
    MPI_Comm_rank(comm, &e->rank);
    MPI_Comm_size(comm, &e->P);
    e->M = sc->M;
    e->V = V;
    e->S = e->P * V;
    e->st = st;
    e->sc = sc;
    e->fail_rank = -1;
    e->first_bad_fwd = -1;
    int scv = sc->V > 1 ? sc->V : 1;
    if (sc->P != e->P || scv != V) {
        snprintf(err, errlen, "the schedule has %d ranks x %d chunks but the engine runs %d ranks x %d chunks",
                 sc->P, scv, e->P, V);
        return PL_EINVAL;
    }
    int *ub = NULL, flag = 0;
    MPI_Comm_get_attr(comm, MPI_TAG_UB, &ub, &flag);
    long long need = 5LL * e->S * e->M;
    if (flag && ub && need - 1 > *ub) {
        snprintf(err, errlen, "%d stages x %d micro-batches need message tags up to %lld, but this MPI allows "
                 "%d (MPI_TAG_UB): use fewer micro-batches or chunks", e->S, e->M, need - 1, *ub);
        return PL_EINVAL;
    }
    size_t M = e->M, VM = (size_t)V * M;
    e->recv_f = calloc(V, sizeof(float *));
    e->recv_b = calloc(V, sizeof(float *));
    e->send_b = calloc(V, sizeof(float *));
    e->hv = calloc(4 * VM, sizeof(void *));
    e->rq_f = malloc(sizeof(MPI_Request) * VM);
    e->rq_b = malloc(sizeof(MPI_Request) * VM);
    e->sq_f = malloc(sizeof(MPI_Request) * VM);
    e->sq_b = malloc(sizeof(MPI_Request) * VM);
    e->mb_loss = calloc(M, sizeof(double));
    e->b_done = calloc(VM, 1);
    e->next_f = calloc(V, sizeof(int));
    e->next_b = calloc(V, sizeof(int));
    e->t_opc = calloc((size_t)V * SCHED_NOPS, sizeof(double));
    e->n_opc = calloc((size_t)V * SCHED_NOPS, sizeof(long));
    if (!e->t_opc || !e->n_opc || !e->recv_f || !e->recv_b || !e->send_b || !e->hv || !e->rq_f || !e->rq_b || !e->sq_f || !e->sq_b ||
        !e->mb_loss || !e->b_done || !e->next_f || !e->next_b) {
        snprintf(err, errlen, "out of memory for %zu micro-batch communication buffers", VM);
        engine_free(e);
        return PL_ENOMEM;
    }
    for (int c = 0; c < V; c++) {
        const stage *cs = &st[c];
        size_t slice = (size_t)cs->N * cs->cfg.C * sizeof(float);
        int s = stage_of(e, c), first = s == 0, last = s == e->S - 1, rc = PL_OK;
        void *p = NULL;
        if (!first && (rc = cs->be->alloc(&p, M * slice)) == PL_OK) e->recv_f[c] = p;
        if (!last && rc == PL_OK && (rc = cs->be->alloc(&p, M * slice)) == PL_OK) e->recv_b[c] = p;
        if (!first && rc == PL_OK && (rc = cs->be->alloc(&p, M * slice)) == PL_OK) e->send_b[c] = p;
        if (rc != PL_OK) {
            snprintf(err, errlen, "backend %s: %s, for %zu micro-batch communication buffers of stage %d",
                     cs->be->name, stage_error(cs), M, s);
            engine_free(e);
            return rc;
        }
    }
    return PL_OK;
}

void engine_free(engine *e) {
    for (int c = 0; e->st && e->recv_f && c < e->V; c++) {
        e->st[c].be->free(e->recv_f[c]);
        e->st[c].be->free(e->recv_b[c]);
        e->st[c].be->free(e->send_b[c]);
    }
    free(e->recv_f);
    free(e->recv_b);
    free(e->send_b);
    free(e->hv);
    free(e->rq_f);
    free(e->rq_b);
    free(e->sq_f);
    free(e->sq_b);
    free(e->mb_loss);
    free(e->b_done);
    free(e->next_f);
    free(e->next_b);
    free(e->t_opc);
    free(e->n_opc);
    memset(e, 0, sizeof *e);
}

void engine_reset_costs(engine *e) {
    memset(e->t_op, 0, sizeof e->t_op);
    memset(e->n_op, 0, sizeof e->n_op);
    if (e->t_opc) memset(e->t_opc, 0, sizeof(double) * (size_t)e->V * SCHED_NOPS);
    if (e->n_opc) memset(e->n_opc, 0, sizeof(long) * (size_t)e->V * SCHED_NOPS);
}

/* The test-only slow rank: sleep inside the action's timed span (engine_set_slow). */
static void slow_down(const engine *e) {
    if (e->slow_s <= 0) return;
    struct timespec ts = {(time_t)e->slow_s, (long)((e->slow_s - (double)(time_t)e->slow_s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {}
}

/* Charge [t0, t1) to op on chunk c. */
static void charge(engine *e, int c, sched_op op, double t0, double t1) {
    e->t_op[op] += t1 - t0;
    e->n_op[op]++;
    e->t_opc[(size_t)c * SCHED_NOPS + op] += t1 - t0;
    e->n_opc[(size_t)c * SCHED_NOPS + op]++;
}

/* Wait for a request under the watchdog (comm.c), charging the time to t_wait and the
 * trace. The action the wait belongs to (op, global stage s, mb) is named in the watchdog's
 * message. */
static int timed_wait(engine *e, MPI_Request *rq, const char *what, sched_op op, int s, int mb, int peer, long step) {
    double t0 = pl_now();
    char name[64];
    sched_action a = {op, s, mb};
    if (sched_action_format(&a, name, sizeof name) != 0) snprintf(name, sizeof name, "%s", what);
    snprintf(name + strlen(name), sizeof name - strlen(name), " (%s)", what);
    comm_what w = {name, peer, mb, step};
    PL_TRY(comm_wait(rq, &w));
    double t1 = pl_now();
    e->t_wait += t1 - t0;
    if (e->tr && t1 - t0 > 1e-6) trace_event(e->tr, what, "wait", mb, t0, t1);
    return PL_OK;
}

/* Host views: kind k of (chunk c, micro-batch m) at hv[(k V + c) M + m]:
 * receive F, receive B, send F, send B. */
enum { HV_RF, HV_RB, HV_SF, HV_SB };

static void **hv_at(engine *e, int kind, int c, int m) { return &e->hv[((size_t)kind * e->V + c) * e->M + m]; }

/* A host view of n floats at p for a message (kind HV_*, chunk c, micro-batch m). */
static int view(engine *e, int kind, int c, int m, float *p, size_t n, void **host) {
    int mode = kind == HV_RF || kind == HV_RB ? PL_MAP_WRITE : PL_MAP_READ;
    const stage *st = &e->st[c];
    int rc = st->be->map(host, p, n * sizeof(float), mode);
    if (rc != PL_OK) {
        pl_error("backend %s: mapping micro-batch %d's message buffer: %s", st->be->name, m, stage_error(st));
        return rc;
    }
    *hv_at(e, kind, c, m) = *host;
    return PL_OK;
}

/* After the request completed: a received message is copied into backend memory. */
static int unview(engine *e, int kind, int c, int m, float *p, size_t n) {
    void **h = hv_at(e, kind, c, m);
    if (!*h) return PL_OK;
    const stage *st = &e->st[c];
    int mode = kind == HV_RF || kind == HV_RB ? PL_MAP_WRITE : PL_MAP_READ;
    int rc = st->be->unmap(*h, p, n * sizeof(float), mode);
    *h = NULL;
    if (rc != PL_OK) pl_error("backend %s: unmapping micro-batch %d's message buffer: %s", st->be->name, m,
                              stage_error(st));
    return rc;
}

/* The chunk of this rank that runs global stage s, or -1 (with the error printed). */
static int chunk_of(const engine *e, long step, const sched_action *a) {
    if (a->stage < 0 || a->stage >= e->S || rank_of(e, a->stage) != e->rank) {
        char name[48] = "?";
        sched_action_format(a, name, sizeof name);
        pl_error("step %ld: action %s names stage %d, which rank %d does not run", step, name, a->stage, e->rank);
        return -1;
    }
    return sched_place_chunk(e->sc->place, e->P, a->stage);
}

/* Run one F of chunk c: wait for its input, forward it into the micro-batch's slot. */
static int run_forward(engine *e, long step, int c, int m, const int *inputs, const int *targets, float dloss) {
    stage *st = &e->st[c];
    int s = stage_of(e, c), slot, rows = st->Bm * st->T;
    size_t slice = (size_t)st->N * st->cfg.C, k = (size_t)c * e->M + m;
    /* the LM head's weight gradient is added inside the last stage's forward */
    if (st->has_head && dloss > 0.0f && m != e->next_f[c]) {
        pl_error("step %ld: action %dF%d adds to the head's gradient out of micro-batch order "
                 "(micro-batch %d is next); refusing to run it", step, s, m, e->next_f[c]);
        return PL_EINVAL;
    }
    if (s > 0 && !local_edge(e, s - 1)) { /* a local input was copied in by stage s - 1's F */
        PL_TRY(timed_wait(e, &e->rq_f[k], "wait recv F", SCHED_RECV_F, s, m, rank_of(e, s - 1), step));
        PL_TRY(unview(e, HV_RF, c, m, e->recv_f[c] + m * slice, slice));
    }
    PL_TRY(st->be->synchronize()); /* the clock times this F, not what a device backend still runs */
    double t0 = pl_now();
    PL_TRY(stage_forward(st, m, (st->has_embed || st->cfg.docs.mask) && inputs ? inputs + (size_t)m * rows : NULL,
                         s > 0 ? e->recv_f[c] + m * slice : NULL, st->has_head ? targets + (size_t)m * rows : NULL,
                         dloss, &e->mb_loss[m], &slot));
    if (local_edge(e, s)) { /* the next stage is this rank's: its input is this output */
        int cn = sched_place_chunk(e->sc->place, e->P, s + 1);
        PL_TRY(st->be->copy(e->recv_f[cn] + m * slice, stage_output(st, slot), slice * sizeof(float)));
    }
    PL_TRY(st->be->synchronize());
    slow_down(e);
    double t1 = pl_now();
    e->t_fwd += t1 - t0;
    charge(e, c, SCHED_F, t0, t1);
    e->next_f[c]++;
    if (++e->inflight > e->inflight_peak) e->inflight_peak = e->inflight;
    e->act_bytes += (double)stage_act_bytes_per_slot(st);
    if (e->act_bytes > e->act_bytes_peak) e->act_bytes_peak = e->act_bytes;
    /* remember where a non-finite value first shows, for the NaN message */
    double out_sq = 0.0;
    if (!st->has_head) PL_TRY(st->be->sumsq(stage_output(st, slot), slice, &out_sq));
    int where = s * e->M + m;
    if (!(st->has_head ? isfinite(e->mb_loss[m]) : isfinite(out_sq)) && (e->first_bad_fwd < 0 || where < e->first_bad_fwd))
        e->first_bad_fwd = where;
    if (e->tr) trace_event_stage(e->tr, "F", "compute", m, s, t0, t1);
    return PL_OK;
}

/* Run one B (op SCHED_B) or its input part I (SCHED_I) of chunk c: wait for the output
 * gradient and for the forward send that reads the slot, then the backward; the input
 * gradient moves at once into the micro-batch's own send buffer (the stage's dinput is
 * scratch the next backward overwrites). B adds to the weight gradients, so it runs in
 * micro-batch order. */
static int run_backward(engine *e, long step, int c, int m, sched_op op) {
    stage *st = &e->st[c];
    int s = stage_of(e, c), whole = op == SCHED_B;
    size_t slice = (size_t)st->N * st->cfg.C, k = (size_t)c * e->M + m;
    int slot = stage_slot_of(st, m);
    const char *name = whole ? "B" : "I";
    if (slot < 0) {
        pl_error("step %ld: schedule runs %d%s%d before its forward", step, s, name, m);
        return PL_EINVAL;
    }
    if (whole && m != e->next_b[c]) {
        pl_error("step %ld: action %dB%d adds to the weight gradients out of micro-batch order "
                 "(micro-batch %d is next); refusing to run it", step, s, m, e->next_b[c]);
        return PL_EINVAL;
    }
    if (s < e->S - 1 && !local_edge(e, s)) { /* a local gradient was copied in by stage s + 1 */
        PL_TRY(timed_wait(e, &e->rq_b[k], "wait recv B", SCHED_RECV_B, s, m, rank_of(e, s + 1), step));
        PL_TRY(unview(e, HV_RB, c, m, e->recv_b[c] + m * slice, slice));
    }
    if (e->sq_f[k] != MPI_REQUEST_NULL) {
        PL_TRY(timed_wait(e, &e->sq_f[k], "wait send F", SCHED_SEND_F, s, m, rank_of(e, s + 1), step));
        PL_TRY(unview(e, HV_SF, c, m, stage_output(st, slot), slice));
    }
    PL_TRY(st->be->synchronize());
    double t0 = pl_now();
    const float *dout = s < e->S - 1 ? e->recv_b[c] + m * slice : NULL;
    PL_TRY(whole ? stage_backward(st, slot, dout) : stage_backward_input(st, slot, dout));
    if (s > 0 && local_edge(e, s - 1)) { /* the previous stage is this rank's: straight into its input */
        int cp = sched_place_chunk(e->sc->place, e->P, s - 1);
        PL_TRY(st->be->copy(e->recv_b[cp] + m * slice, stage_dinput(st), slice * sizeof(float)));
    } else if (s > 0) PL_TRY(st->be->copy(e->send_b[c] + m * slice, stage_dinput(st), slice * sizeof(float)));
    e->b_done[k] = 1;
    if (whole) e->next_b[c]++;
    PL_TRY(st->be->synchronize());
    slow_down(e);
    double t1 = pl_now();
    e->t_bwd += t1 - t0;
    charge(e, c, op, t0, t1);
    if (whole) { /* the slot is free */
        e->inflight--;
        e->act_bytes -= (double)stage_act_bytes_per_slot(st);
    }
    if (e->tr) trace_event_stage(e->tr, name, "compute", m, s, t0, t1);
    return PL_OK;
}

/* Run one W of chunk c: the weight part of a micro-batch whose I has run, in micro-batch order. */
static int run_weight(engine *e, long step, int c, int m) {
    stage *st = &e->st[c];
    int s = stage_of(e, c), slot = stage_slot_of(st, m);
    if (slot < 0 || !e->b_done[(size_t)c * e->M + m]) {
        pl_error("step %ld: schedule runs %dW%d before its %s", step, s, m, slot < 0 ? "forward" : "input part (I)");
        return PL_EINVAL;
    }
    if (m != e->next_b[c]) {
        pl_error("step %ld: action %dW%d adds to the weight gradients out of micro-batch order "
                 "(micro-batch %d is next); refusing to run it", step, s, m, e->next_b[c]);
        return PL_EINVAL;
    }
    PL_TRY(st->be->synchronize());
    double t0 = pl_now();
    PL_TRY(stage_backward_weight(st, slot));
    e->next_b[c]++;
    PL_TRY(st->be->synchronize());
    slow_down(e);
    double t1 = pl_now();
    e->t_bwd += t1 - t0;
    charge(e, c, SCHED_W, t0, t1);
    e->inflight--;
    e->act_bytes -= (double)stage_act_bytes_per_slot(st);
    if (e->tr) trace_event_stage(e->tr, "W", "compute", m, s, t0, t1);
    return PL_OK;
}

/* Injected failure (--fail-rank/--fail-step/--fail-at during) in the middle of a step. */
static int injected(const engine *e, long step, int i) {
    if (i != 1 || e->rank != e->fail_rank || step != e->fail_step || !e->fail_during) return 0;
    pl_error("injected failure (--fail-rank %d --fail-step %d) in the middle of step %ld", pl_rank, /* a world rank */
             e->fail_step, step);
    return 1;
}

/* Post every receive of the step up front, each into its (chunk, micro-batch)'s buffer. */
static int post_receives(engine *e, long step) {
    int r = e->rank;
    const sched_action *acts = e->sc->acts[r];
    int n = e->sc->n[r];
    for (int i = 0; i < n; i++) {
        if (acts[i].op != SCHED_RECV_F && acts[i].op != SCHED_RECV_B) continue;
        int m = acts[i].mb, s = acts[i].stage, c = chunk_of(e, step, &acts[i]);
        if (c < 0) return PL_EINVAL;
        size_t slice = (size_t)e->st[c].N * e->st[c].cfg.C, k = (size_t)c * e->M + m;
        void *h;
        if (acts[i].op == SCHED_RECV_F) {
            PL_TRY(view(e, HV_RF, c, m, e->recv_f[c] + m * slice, slice, &h));
            PL_MPI_CHECK(MPI_Irecv(h, (int)slice, MPI_FLOAT, rank_of(e, s - 1), msg_tag(e, 0, step, s, m), e->comm,
                                   &e->rq_f[k]));
        } else {
            PL_TRY(view(e, HV_RB, c, m, e->recv_b[c] + m * slice, slice, &h));
            PL_MPI_CHECK(MPI_Irecv(h, (int)slice, MPI_FLOAT, rank_of(e, s + 1), msg_tag(e, 1, step, s, m), e->comm,
                                   &e->rq_b[k]));
        }
    }
    return PL_OK;
}

/* Finish the sends of this step and release their views; every receive must be used. */
static int finish_sends(engine *e, long step) {
    for (int c = 0; c < e->V; c++) {
        stage *st = &e->st[c];
        int s = stage_of(e, c);
        size_t slice = (size_t)st->N * st->cfg.C;
        for (int m = 0; m < e->M; m++) {
            size_t k = (size_t)c * e->M + m;
            if (e->sq_f[k] != MPI_REQUEST_NULL)
                PL_TRY(timed_wait(e, &e->sq_f[k], "wait send F", SCHED_SEND_F, s, m, rank_of(e, s + 1), step));
            if (e->sq_b[k] != MPI_REQUEST_NULL)
                PL_TRY(timed_wait(e, &e->sq_b[k], "wait send B", SCHED_SEND_B, s, m, rank_of(e, s > 0 ? s - 1 : 0), step));
            /* a send F's slot may be gone (its B ran): its view is only released here */
            void **h = hv_at(e, HV_SF, c, m);
            if (*h) {
                int slot = stage_slot_of(st, m);
                PL_TRY(st->be->unmap(*h, slot >= 0 ? stage_output(st, slot) : NULL, slice * sizeof(float),
                                     PL_MAP_READ));
                *h = NULL;
            }
            if (e->send_b[c]) PL_TRY(unview(e, HV_SB, c, m, e->send_b[c] + m * slice, slice));
            if (e->rq_f[k] != MPI_REQUEST_NULL || e->rq_b[k] != MPI_REQUEST_NULL) {
                pl_error("step %ld: a receive of stage %d, micro-batch %d was never consumed by the schedule", step,
                         s, m);
                return PL_EINVAL;
            }
        }
    }
    return PL_OK;
}

/* SEND_F or SEND_B of (chunk c, micro-batch m): post the non-blocking send. */
static int run_send(engine *e, long step, int c, int m, sched_op op) {
    stage *st = &e->st[c];
    int s = stage_of(e, c);
    size_t slice = (size_t)st->N * st->cfg.C, k = (size_t)c * e->M + m;
    void *h;
    if (op == SCHED_SEND_F) {
        int slot = stage_slot_of(st, m);
        if (slot < 0 || s == e->S - 1) {
            pl_error("step %ld: schedule sends %dSEND_F%d %s", step, s, m, slot < 0 ? "before computing its forward"
                     : "from the last stage");
            return PL_EINVAL;
        }
        PL_TRY(view(e, HV_SF, c, m, stage_output(st, slot), slice, &h));
        PL_MPI_CHECK(MPI_Isend(h, (int)slice, MPI_FLOAT, rank_of(e, s + 1), msg_tag(e, 0, step, s + 1, m), e->comm,
                               &e->sq_f[k]));
        if (e->tr) { double t = pl_now(); trace_event(e->tr, "send F", "comm", m, t, t); }
        return PL_OK;
    }
    if (!e->b_done[k] || s == 0) {
        pl_error("step %ld: schedule sends %dSEND_B%d %s", step, s, m, s == 0 ? "from the first stage"
                 : "before its backward");
        return PL_EINVAL;
    }
    PL_TRY(view(e, HV_SB, c, m, e->send_b[c] + m * slice, slice, &h));
    PL_MPI_CHECK(MPI_Isend(h, (int)slice, MPI_FLOAT, rank_of(e, s - 1), msg_tag(e, 1, step, s - 1, m), e->comm,
                           &e->sq_b[k]));
    if (e->tr) { double t = pl_now(); trace_event(e->tr, "send B", "comm", m, t, t); }
    return PL_OK;
}

int engine_step(engine *e, long step, const int *inputs, const int *targets, float dloss, double *loss_sum) {
    int M = e->M, r = e->rank;
    for (size_t k = 0; k < (size_t)e->V * M; k++) {
        e->rq_f[k] = e->rq_b[k] = e->sq_f[k] = e->sq_b[k] = MPI_REQUEST_NULL;
        e->b_done[k] = 0;
    }
    for (int m = 0; m < M; m++) e->mb_loss[m] = 0.0;
    for (int c = 0; c < e->V; c++) e->next_f[c] = e->next_b[c] = 0;
    e->inflight = 0;
    e->act_bytes = 0;
    PL_TRY(post_receives(e, step));
    const sched_action *acts = e->sc->acts[r];
    int n = e->sc->n[r];
    for (int i = 0; i < n; i++) {
        int m = acts[i].mb, c = chunk_of(e, step, &acts[i]);
        if (c < 0) return PL_EINVAL;
        if (injected(e, step, i)) return PL_EPEER;
        switch (acts[i].op) {
        case SCHED_RECV_F:
        case SCHED_RECV_B:
            break; /* already posted */
        case SCHED_F:
            PL_TRY(run_forward(e, step, c, m, inputs, targets, dloss));
            break;
        case SCHED_SEND_F:
        case SCHED_SEND_B:
            PL_TRY(run_send(e, step, c, m, acts[i].op));
            break;
        case SCHED_B:
        case SCHED_I:
            PL_TRY(run_backward(e, step, c, m, acts[i].op));
            break;
        case SCHED_W:
            PL_TRY(run_weight(e, step, c, m));
            break;
        }
    }
    PL_TRY(finish_sends(e, step));
    double sum = 0.0;
    for (int m = 0; m < M; m++) sum += e->mb_loss[m];
    *loss_sum = sum;
    return PL_OK;
}

/* Evaluation: every forward input's receive, posted before the first forward (into the
 * micro-batch's slice of recv_f). */
static int eval_post_receives(engine *e) {
    for (int c = 0; c < e->V; c++) {
        stage *st = &e->st[c];
        int s = stage_of(e, c);
        size_t slice = (size_t)st->N * st->cfg.C;
        for (int m = 0; m < e->M; m++) {
            size_t k = (size_t)c * e->M + m;
            e->rq_f[k] = e->sq_f[k] = MPI_REQUEST_NULL;
            if (s == 0 || local_edge(e, s - 1)) continue; /* a local input is copied in by stage s - 1 */
            void *h;
            PL_TRY(view(e, HV_RF, c, m, e->recv_f[c] + m * slice, slice, &h));
            PL_MPI_CHECK(MPI_Irecv(h, (int)slice, MPI_FLOAT, rank_of(e, s - 1), eval_tag(e, s, m), e->comm,
                                   &e->rq_f[k]));
        }
    }
    return PL_OK;
}

/* Evaluation: micro-batch m's output of chunk c to the next stage, without waiting: copied
 * into the micro-batch's slice of recv_b (unused without a backward), so the activation slot
 * is free for the next forward. */
static int eval_send(engine *e, int c, int m, int slot) {
    stage *st = &e->st[c];
    int s = stage_of(e, c);
    size_t slice = (size_t)st->N * st->cfg.C;
    float *buf = e->recv_b[c] + m * slice;
    void *h;
    PL_TRY(st->be->copy(buf, stage_output(st, slot), slice * sizeof(float)));
    PL_TRY(view(e, HV_SF, c, m, buf, slice, &h));
    PL_MPI_CHECK(MPI_Isend(h, (int)slice, MPI_FLOAT, rank_of(e, s + 1), eval_tag(e, s + 1, m), e->comm,
                           &e->sq_f[(size_t)c * e->M + m]));
    return PL_OK;
}

/* Forward of every micro-batch through every stage, in (micro-batch, stage) order, as a
 * pipeline: every receive is posted first and no send is waited for until the end, so while
 * stage s + 1 computes micro-batch m, stage s computes m + 1 (each rank meets its own stages
 * in that order and waits only for an input, so it cannot deadlock). */
int engine_eval(engine *e, const int *inputs, const int *targets, double *loss_sum) {
    double sum = 0.0;
    PL_TRY(eval_post_receives(e));
    for (int m = 0; m < e->M; m++)
        for (int c = 0; c < e->V; c++) {
            stage *st = &e->st[c];
            int s = stage_of(e, c), slot, rows = st->N;
            size_t slice = (size_t)st->N * st->cfg.C, k = (size_t)c * e->M + m;
            double l = 0.0;
            if (e->rq_f[k] != MPI_REQUEST_NULL) {
                comm_what w = {"evaluation forward input", rank_of(e, s - 1), m, -1};
                PL_TRY(comm_wait(&e->rq_f[k], &w));
                PL_TRY(unview(e, HV_RF, c, m, e->recv_f[c] + m * slice, slice));
            }
            PL_TRY(stage_forward(st, m, (st->has_embed || st->cfg.docs.mask) && inputs ? inputs + (size_t)m * rows : NULL,
                                 s > 0 ? e->recv_f[c] + m * slice : NULL, st->has_head ? targets + (size_t)m * rows : NULL,
                                 0.0f, &l, &slot));
            if (local_edge(e, s)) {
                int cn = sched_place_chunk(e->sc->place, e->P, s + 1);
                PL_TRY(st->be->copy(e->recv_f[cn] + m * slice, stage_output(st, slot), slice * sizeof(float)));
            } else if (s < e->S - 1) PL_TRY(eval_send(e, c, m, slot));
            stage_release_all(st);
            sum += l;
        }
    for (int c = 0; c < e->V; c++) {
        int s = stage_of(e, c);
        size_t slice = (size_t)e->st[c].N * e->st[c].cfg.C;
        for (int m = 0; m < e->M; m++) {
            size_t k = (size_t)c * e->M + m;
            if (e->sq_f[k] == MPI_REQUEST_NULL) continue;
            comm_what w = {"evaluation forward output", rank_of(e, s + 1), m, -1};
            PL_TRY(comm_wait(&e->sq_f[k], &w));
            PL_TRY(unview(e, HV_SF, c, m, e->recv_b[c] + m * slice, slice));
        }
    }
    *loss_sum = sum;
    return PL_OK;
}

/* The test-only slow rank (engine.h). */
void engine_set_slow(engine *e, double ms) { e->slow_s = ms > 0 ? ms / 1e3 : 0.0; }

/* The test-only faults (engine.h). */
void engine_set_faults(engine *e, int fail_rank, int fail_step, int during) {
    e->fail_rank = fail_rank;
    e->fail_step = fail_step;
    e->fail_during = during;
}

/* A step's timers start at zero; no forward has gone non-finite yet. */
void engine_begin_step(engine *e) {
    e->t_fwd = e->t_bwd = e->t_wait = 0;
    e->first_bad_fwd = -1;
}

/* The timeline the engine records into, if any. */
void engine_set_trace(engine *e, trace *tr) { e->tr = tr; }

/* The timeline, handed back to the caller (to write or discard); the engine records no more. */
trace *engine_take_trace(engine *e) {
    trace *tr = e->tr;
    e->tr = NULL;
    return tr;
}
