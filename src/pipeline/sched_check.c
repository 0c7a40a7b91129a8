/*
 * sched_check.c — the unit-cost simulation of a schedule (deadlocks found, makespan and
 * bubble measured) and its validation (every action present once, in an order that can run).
 */
#include "util/common.h"
#include "pipeline/sched.h"
#include "pipeline/sched_internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// simulation

/* index of a sent message in the "issued at" table: kind 0 = forward
   activations (SEND_F from global stage), kind 1 = gradients (SEND_B from stage);
   S is the number of global stages */
static size_t msg_index(int kind, int stage, int mb, int S, int M) {
    return ((size_t)kind * (size_t)S + (size_t)stage) * (size_t)M + (size_t)mb;
}

/* check the per-action facts the simulator relies on: known op, stage and
   mb in range, and a peer stage that exists for communication actions */
static int check_actions(const sched *s, char *err, size_t errlen) {
    char b[64];
    int S = sched_nstages(s);
    for (int r = 0; r < s->P; r++) {
        for (int i = 0; i < s->n[r]; i++) {
            const sched_action *a = &s->acts[r][i];
            if (!sched_op_known((int)a->op)) {
                sched_err(err, errlen, "rank %d, action #%d: invalid op code %d", r, i, (int)a->op);
                return PL_EINVAL;
            }
            if (a->stage < 0 || a->stage >= S) {
                sched_err(err, errlen, "rank %d, action #%d (%s): stage %d out of range 0..%d",
                        r, i, sched_act_str(a, b, sizeof(b)), a->stage, S - 1);
                return PL_EINVAL;
            }
            if (a->mb < 0 || a->mb >= s->M) {
                sched_err(err, errlen, "rank %d, action #%d (%s): micro-batch %d out of range 0..%d",
                        r, i, sched_act_str(a, b, sizeof(b)), a->mb, s->M - 1);
                return PL_EINVAL;
            }
            int peer = sched_peer_stage(a);
            if (!sched_op_computes(a->op) && (peer < 0 || peer >= S)) {
                sched_err(err, errlen, "rank %d, action #%d (%s): has no partner, stage %d is the %s stage",
                        r, i, sched_act_str(a, b, sizeof(b)), a->stage, peer < 0 ? "first" : "last");
                return PL_EINVAL;
            }
        }
    }
    return PL_OK;
}

/* unit-cost dry run; see header. Each rank keeps its own clock; a SEND
   stamps the message with the sender's clock, a RECV can only proceed once
   that stamp exists and moves the receiver's clock up to it. Ranks are
   swept repeatedly until nobody can move; the resulting times do not depend
   on the sweep order. */
/* The unit-cost play: every rank runs its list in order as far as its receives allow, round
 * after round until nothing moves; pc[r] is where rank r stopped, clock[r] its time, sent[]
 * when each message left (-1: not yet). */
static void sim_play(const sched *s, sched_sim *out, int *pc, int *clock, int *sent) {
    int P = s->P, M = s->M, S = sched_nstages(s);
    int progress = 1;
    while (progress) {
        progress = 0;
        for (int r = 0; r < P; r++) {
            while (pc[r] < s->n[r]) {
                const sched_action *a = &s->acts[r][pc[r]];
                int t = clock[r];
                if (a->op == SCHED_RECV_F || a->op == SCHED_RECV_B) {
                    int kind = a->op == SCHED_RECV_F ? 0 : 1;
                    int t_sent = sent[msg_index(kind, sched_peer_stage(a), a->mb, S, M)];
                    if (t_sent < 0) break; // blocked
                    if (t_sent > t) t = t_sent;
                } else if (a->op == SCHED_SEND_F || a->op == SCHED_SEND_B) {
                    int kind = a->op == SCHED_SEND_F ? 0 : 1;
                    size_t k = msg_index(kind, a->stage, a->mb, S, M);
                    if (sent[k] < 0) sent[k] = t;
                }
                int idx = out->off[r] + pc[r];
                out->start[idx] = t;
                out->end[idx] = t + sched_op_cost(a->op);
                out->busy += sched_op_cost(a->op);
                clock[r] = t + sched_op_cost(a->op);
                pc[r]++;
                progress = 1;
            }
        }
    }
}

/* err: "deadlock:" and, for each rank that could not finish, the action it is blocked at
 * and what it waits for. */
static void sim_report_deadlock(const sched *s, const int *pc, char *err, size_t errlen) {
    char b1[64], b2[64];
    sched_err(err, errlen, "deadlock:");
    for (int r = 0; r < s->P; r++) {
        if (pc[r] >= s->n[r]) continue;
        const sched_action *a = &s->acts[r][pc[r]];
        sched_action want = { sched_partner_op(a->op), sched_peer_stage(a), a->mb };
        sched_err_append(err, errlen, " rank %d blocked at action #%d %s (waiting for %s from rank %d);",
                   r, pc[r], sched_act_str(a, b1, sizeof(b1)), sched_act_str(&want, b2, sizeof(b2)), sched_stage_rank(s, want.stage));
    }
}

/* The unit-cost simulation (sched.h): allocate, play, report a deadlock or the makespan. */
int sched_simulate(const sched *s, sched_sim *out, char *err, size_t errlen) {
    if (out == NULL) { sched_err(err, errlen, "sched_simulate: NULL output"); return PL_EINVAL; }
    memset(out, 0, sizeof(*out));
    if (s == NULL || s->P < 1 || s->M < 1 || s->n == NULL || s->acts == NULL) {
        sched_err(err, errlen, "sched_simulate: empty or malformed schedule");
        return PL_EINVAL;
    }
    if ((long)s->P * sched_nchunks(s) > (1L << 30)) {
        sched_err(err, errlen, "sched_simulate: P=%d V=%d: too many stages", s->P, s->V);
        return PL_EINVAL;
    }
    if (check_actions(s, err, errlen) != 0) return PL_EINVAL;
    int P = s->P, M = s->M, S = sched_nstages(s);
    out->P = P;
    out->off = malloc((size_t)(P + 1) * sizeof(int));
    int *pc = calloc((size_t)P, sizeof(int));
    int *clock = calloc((size_t)P, sizeof(int));
    int *sent = malloc(2 * (size_t)S * (size_t)M * sizeof(int));
    if (out->off == NULL || pc == NULL || clock == NULL || sent == NULL) goto oom;
    out->off[0] = 0;
    for (int r = 0; r < P; r++) out->off[r + 1] = out->off[r] + s->n[r];
    int total = out->off[P];
    out->start = malloc((size_t)(total ? total : 1) * sizeof(int));
    out->end = malloc((size_t)(total ? total : 1) * sizeof(int));
    if (out->start == NULL || out->end == NULL) goto oom;
    for (size_t k = 0; k < 2 * (size_t)S * (size_t)M; k++) sent[k] = -1;
    sim_play(s, out, pc, clock, sent);
    int stuck = 0;
    for (int r = 0; r < P; r++) if (pc[r] < s->n[r]) stuck = 1;
    if (stuck) {
        sim_report_deadlock(s, pc, err, errlen);
        free(pc); free(clock); free(sent);
        sched_sim_free(out);
        return PL_EINVAL;
    }
    for (int r = 0; r < P; r++) if (clock[r] > out->makespan) out->makespan = clock[r];
    out->bubble = out->makespan > 0 ? 1.0 - (double)out->busy / ((double)P * out->makespan) : 0.0;
    free(pc); free(clock); free(sent);
    return PL_OK;

oom:
    free(pc); free(clock); free(sent);
    sched_sim_free(out);
    sched_err(err, errlen, "sched_simulate: out of memory");
    return PL_ENOMEM;
}

/* free simulation arrays and reset */
void sched_sim_free(sched_sim *sim) {
    if (sim == NULL) return;
    free(sim->off);
    free(sim->start);
    free(sim->end);
    memset(sim, 0, sizeof(*sim));
}

// ----------------------------------------------------------------------------
// validation

/* check every rule in the header, in an order that gives the most specific
   message first: per-action sanity, duplicates, send/recv pairing across
   ranks, per-stage completeness and ordering, and finally deadlock freedom */
/* Position of each (global stage, op, mb) in its rank's list, -1 if absent. */
#define POS(st, op, mb) pos[((size_t)(st) * SCHED_NOPS + (size_t)(op)) * (size_t)s->M + (size_t)(mb)]

/* 1. Stage s runs on its rank only (s % P in the loop placement; with V = 1: rank r runs
 * stage r only); then the position table, which catches duplicates. */
static int validate_positions(const sched *s, int *pos, char *err, size_t errlen) {
    char b1[64];
    int V = sched_nchunks(s);
    for (int r = 0; r < s->P; r++)
        for (int i = 0; i < s->n[r]; i++) {
            int st = s->acts[r][i].stage, home = sched_stage_rank(s, st);
            if (home == r) continue;
            if (V == 1)
                sched_err(err, errlen, "rank %d, action #%d (%s): wrong stage, rank %d runs only stage %d",
                        r, i, sched_act_str(&s->acts[r][i], b1, sizeof(b1)), r, r);
            else if (s->place == SCHED_PLACE_LOOP)
                sched_err(err, errlen, "rank %d, action #%d (%s): wrong stage, stage %d runs on rank %d (stage s "
                        "on rank s mod %d: rank %d runs stages %d, %d, ..., %d)", r, i,
                        sched_act_str(&s->acts[r][i], b1, sizeof(b1)), st, home, s->P, r, r, r + s->P,
                        r + (V - 1) * s->P);
            else
                sched_err(err, errlen, "rank %d, action #%d (%s): wrong stage, stage %d runs on rank %d (V-shaped "
                        "placement: rank %d runs stages %d and %d)", r, i, sched_act_str(&s->acts[r][i], b1, sizeof(b1)),
                        st, home, r, sched_place_stage(s->place, s->P, r, 0), sched_place_stage(s->place, s->P, r, 1));
            return PL_EINVAL;
        }
    for (int r = 0; r < s->P; r++)
        for (int i = 0; i < s->n[r]; i++) {
            const sched_action *a = &s->acts[r][i];
            if (POS(a->stage, a->op, a->mb) >= 0) {
                sched_err(err, errlen, "rank %d, action #%d (%s): duplicate of action #%d",
                        r, i, sched_act_str(a, b1, sizeof(b1)), POS(a->stage, a->op, a->mb));
                return PL_EINVAL;
            }
            POS(a->stage, a->op, a->mb) = i;
        }
    return PL_OK;
}

/* 2. Every SEND meets its RECV on the peer stage's rank and vice versa: SEND_F of stage s
 * pairs with RECV_F of stage s+1, SEND_B of stage s with RECV_B of stage s-1. */
static int validate_pairs(const sched *s, const int *pos, char *err, size_t errlen) {
    char b1[64], b2[64];
    for (int r = 0; r < s->P; r++)
        for (int i = 0; i < s->n[r]; i++) {
            const sched_action *a = &s->acts[r][i];
            if (sched_op_computes(a->op)) continue;
            int lo = sched_peer_stage(a) < a->stage ? sched_peer_stage(a) : a->stage;
            if (sched_local_edge(s, lo)) {
                sched_err(err, errlen, "rank %d, action #%d (%s): stages %d and %d both run on rank %d, which hands "
                        "the %s over in memory: no SEND or RECV between them", r, i, sched_act_str(a, b1, sizeof(b1)), lo,
                        lo + 1, r, a->op == SCHED_SEND_F || a->op == SCHED_RECV_F ? "activations" : "gradients");
                return PL_EINVAL;
            }
            sched_action want = { sched_partner_op(a->op), sched_peer_stage(a), a->mb };
            if (POS(want.stage, want.op, want.mb) < 0) {
                int is_send = a->op == SCHED_SEND_F || a->op == SCHED_SEND_B;
                sched_err(err, errlen, "rank %d, action #%d (%s): no matching %s on the peer (%s is missing from rank %d)",
                        r, i, sched_act_str(a, b1, sizeof(b1)), is_send ? "RECV" : "SEND",
                        sched_act_str(&want, b2, sizeof(b2)), sched_stage_rank(s, want.stage));
                return PL_EINVAL;
            }
        }
    return PL_OK;
}

/* 3b. A local edge (stages st and st + 1 on one rank) has no messages: the rank's list must
 * run stage st's forward of mb before stage st + 1's, and st + 1's input-side backward (B or
 * I) before st's, since each hands its result straight to the other. */
static int validate_local(const sched *s, const int *pos, int st, int mb, char *err, size_t errlen) {
    char b1[64], b2[64];
    if (!sched_local_edge(s, st)) return PL_OK;
    int r = sched_stage_rank(s, st), pf0 = POS(st, SCHED_F, mb), pf1 = POS(st + 1, SCHED_F, mb);
    sched_action f0 = { SCHED_F, st, mb }, f1 = { SCHED_F, st + 1, mb };
    if (pf1 >= 0 && pf1 < pf0) {
        sched_err(err, errlen, "rank %d, action #%d (%s): comes before %s (action #%d); stage %d's forward input is "
                "stage %d's output on the same rank", r, pf1, sched_act_str(&f1, b1, sizeof(b1)), sched_act_str(&f0, b2, sizeof(b2)),
                pf0, st + 1, st);
        return PL_EINVAL;
    }
    int pb1 = POS(st + 1, SCHED_B, mb) >= 0 ? POS(st + 1, SCHED_B, mb) : POS(st + 1, SCHED_I, mb);
    int pb0 = POS(st, SCHED_B, mb) >= 0 ? POS(st, SCHED_B, mb) : POS(st, SCHED_I, mb);
    sched_action b0 = { POS(st, SCHED_B, mb) >= 0 ? SCHED_B : SCHED_I, st, mb };
    sched_action b1a = { POS(st + 1, SCHED_B, mb) >= 0 ? SCHED_B : SCHED_I, st + 1, mb };
    if (pb0 >= 0 && pb1 >= 0 && pb0 < pb1) {
        sched_err(err, errlen, "rank %d, action #%d (%s): comes before %s (action #%d); stage %d's output gradient is "
                "stage %d's input gradient on the same rank", r, pb0, sched_act_str(&b0, b1, sizeof(b1)),
                sched_act_str(&b1a, b2, sizeof(b2)), pb1, st, st + 1);
        return PL_EINVAL;
    }
    return PL_OK;
}

/* 3. On global stage st (its rank), micro-batch mb: one F and one B (or I and W), F before
 * B, the messages around them (the engine's storage contract, sched.h: every value lives in
 * its micro-batch's own buffer of that stage from its producer to its last reader). */
static int validate_mb(const sched *s, const int *pos, int st, int mb, char *err, size_t errlen) {
    int S = sched_nstages(s), r = sched_stage_rank(s, st);
    char b1[64], b2[64];
    sched_action f = { SCHED_F, st, mb }, bw = { SCHED_B, st, mb }, in = { SCHED_I, st, mb }, wt = { SCHED_W, st, mb };
    int pf = POS(st, SCHED_F, mb), pb = POS(st, SCHED_B, mb), pi = POS(st, SCHED_I, mb), pw = POS(st, SCHED_W, mb);
    if (pf < 0 || (pb < 0 && pi < 0 && pw < 0)) {
        sched_err(err, errlen, "rank %d: missing %s (every micro-batch needs one %s on every stage)", r,
                sched_act_str(pf < 0 ? &f : &bw, b1, sizeof(b1)), pf < 0 ? "forward" : "backward (B, or I and W)");
        return PL_EINVAL;
    }
    if (pb >= 0 && (pi >= 0 || pw >= 0)) {
        sched_err(err, errlen, "rank %d, action #%d (%s): micro-batch %d has both a B and an %s (a backward is "
                "one B, or an I and a W)", r, pb, sched_act_str(&bw, b1, sizeof(b1)), mb, pi >= 0 ? "I" : "W");
        return PL_EINVAL;
    }
    if (pb < 0 && (pi < 0 || pw < 0)) {
        sched_err(err, errlen, "rank %d: missing %s (%s of micro-batch %d has no %s)", r,
                sched_act_str(pi < 0 ? &in : &wt, b1, sizeof(b1)), pi < 0 ? "the W" : "the I", mb,
                pi < 0 ? "input part" : "weight part");
        return PL_EINVAL;
    }
    /* the input side of the backward (B or I) */
    const sched_action *bin = pb >= 0 ? &bw : &in;
    int pin = pb >= 0 ? pb : pi;
    if (pin < pf) {
        sched_err(err, errlen, "rank %d, action #%d (%s): backward before forward (%s is action #%d)",
                r, pin, sched_act_str(bin, b1, sizeof(b1)), sched_act_str(&f, b2, sizeof(b2)), pf);
        return PL_EINVAL;
    }
    if (pb < 0 && pw < pi) {
        sched_err(err, errlen, "rank %d, action #%d (%s): weight part before its input part (%s is action #%d)",
                r, pw, sched_act_str(&wt, b1, sizeof(b1)), sched_act_str(&in, b2, sizeof(b2)), pi);
        return PL_EINVAL;
    }
    /* required comm actions and the compute they must precede/follow */
    int up = st > 0 && !sched_local_edge(s, st - 1), down = st < S - 1 && !sched_local_edge(s, st);
    struct { int need; sched_op op; int before; const sched_action *c; const char *what; } req[5] = {
        { up,   SCHED_RECV_F, 1, &f,  "the forward input must be received before the forward" },
        { down, SCHED_SEND_F, 0, &f,  "the forward output must be sent to the next stage after the forward" },
        { down, SCHED_SEND_F, 1, bin, "the forward output lives in the micro-batch's activation slot, "
                                      "which its backward frees: send it before the backward" },
        { down, SCHED_RECV_B, 1, bin, "the output gradient must be received before the backward" },
        { up,   SCHED_SEND_B, 0, bin, "the input gradient must be sent to the previous stage after the backward" },
    };
    for (int q = 0; q < 5; q++) {
        if (!req[q].need) continue;
        sched_action c = { req[q].op, st, mb };
        int pc = POS(st, req[q].op, mb), pcomp = POS(st, req[q].c->op, mb);
        if (pc < 0) {
            sched_err(err, errlen, "rank %d: missing %s (%s)", r, sched_act_str(&c, b1, sizeof(b1)), req[q].what);
            return PL_EINVAL;
        }
        if (req[q].before ? pc > pcomp : pc < pcomp) {
            sched_action early = req[q].before ? *req[q].c : c, late = req[q].before ? c : *req[q].c;
            int pe = req[q].before ? pcomp : pc, pl = req[q].before ? pc : pcomp;
            sched_err(err, errlen, "rank %d, action #%d (%s): wrong order, comes before %s (action #%d); %s",
                    r, pe, sched_act_str(&early, b1, sizeof(b1)), sched_act_str(&late, b2, sizeof(b2)), pl, req[q].what);
            return PL_EINVAL;
        }
    }
    return validate_local(s, pos, st, mb, err, errlen);
}

/* 4. The gradient accumulators: each stage's weight gradients are sums over micro-batches,
 * and float sums depend on their order, so every stage adds them in ascending micro-batch
 * order (B or W everywhere; F on the last stage, where the LM head's backward runs inside the
 * forward). Chunks of one rank have their own weights, so the order is per stage. */
static int validate_accum_order(const sched *s, const int *pos, char *err, size_t errlen) {
    char b1[64], b2[64];
    int S = sched_nstages(s);
    for (int st = 0; st < S; st++)
        for (int k = 0; k < 2; k++) {
            if (k && st != S - 1) continue;
            for (int mb = 1; mb < s->M; mb++) {
                /* the weight adder of mb: F on the last stage (k = 1), else its B or W */
                sched_op op = k ? SCHED_F : POS(st, SCHED_B, mb) >= 0 ? SCHED_B : SCHED_W;
                sched_op pop = k ? SCHED_F : POS(st, SCHED_B, mb - 1) >= 0 ? SCHED_B : SCHED_W;
                if (POS(st, op, mb) > POS(st, pop, mb - 1)) continue;
                sched_action a = { op, st, mb }, prev = { pop, st, mb - 1 };
                sched_err(err, errlen, "rank %d, action #%d (%s): comes before %s (action #%d); %s add to the "
                        "gradients in ascending micro-batch order%s, so that every schedule sums them as one "
                        "process does (bit-identical results)", sched_stage_rank(s, st), POS(st, op, mb),
                        sched_act_str(&a, b1, sizeof(b1)), sched_act_str(&prev, b2, sizeof(b2)), POS(st, pop, mb - 1),
                        k == 0 ? "backwards (B or W)" : "the last stage's forwards (they run the LM head's backward)",
                        sched_nchunks(s) > 1 ? " on each stage" : "");
                return PL_EINVAL;
            }
        }
    return PL_OK;
}
#undef POS

/* Sections 1-4 over the position table. */
static int validate_table(const sched *s, int *pos, char *err, size_t errlen) {
    if (validate_positions(s, pos, err, errlen) != 0 || validate_pairs(s, pos, err, errlen) != 0) return PL_EINVAL;
    int S = sched_nstages(s);
    for (int st = 0; st < S; st++)
        for (int mb = 0; mb < s->M; mb++)
            if (validate_mb(s, pos, st, mb, err, errlen) != 0) return PL_EINVAL;
    return validate_accum_order(s, pos, err, errlen);
}

/* validate; see header */
int sched_validate(const sched *s, char *err, size_t errlen) {
    if (s == NULL || s->n == NULL || s->acts == NULL) {
        sched_err(err, errlen, "invalid schedule: empty");
        return PL_EINVAL;
    }
    if (s->P < 1 || s->M < 1) {
        sched_err(err, errlen, "invalid schedule: P=%d M=%d (both must be >= 1)", s->P, s->M);
        return PL_EINVAL;
    }
    if ((long)s->P * sched_nchunks(s) > (1L << 30)) {
        sched_err(err, errlen, "invalid schedule: P=%d V=%d: too many stages", s->P, s->V);
        return PL_EINVAL;
    }
    /* ranges and partner existence first, so the table below is indexed in range */
    if (check_actions(s, err, errlen) != 0) return PL_EINVAL;
    size_t npos = (size_t)sched_nstages(s) * SCHED_NOPS * (size_t)s->M;
    int *pos = malloc(npos * sizeof(int));
    if (pos == NULL) { sched_err(err, errlen, "sched_validate: out of memory"); return PL_ENOMEM; }
    for (size_t k = 0; k < npos; k++) pos[k] = -1;
    int rc = validate_table(s, pos, err, errlen);
    free(pos);
    if (rc != PL_OK) return rc;
    /* 5. deadlock freedom: blocking RECV, non-blocking SEND */
    sched_sim sim;
    if ((rc = sched_simulate(s, &sim, err, errlen)) != PL_OK) return rc;
    sched_sim_free(&sim);
    return PL_OK;
}
