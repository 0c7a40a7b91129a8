/*
 * sched.c — pipeline schedules: the helpers every part shares (sched_internal.h), the
 * placements, building a named schedule through the registry (sched_registry.c), and the
 * inspection of a built one. Generators: sched_gen.c, sched_vshape.c; text and CSV:
 * sched_csv.c; validation and simulation: sched_check.c; the grid: sched_print.c.
 */
#include "util/common.h"
#include "pipeline/sched.h"
#include "pipeline/sched_internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// small helpers

/* printf into the caller's error buffer (which may be NULL) */
void sched_err(char *err, size_t errlen, const char *fmt, ...) {
    if (err == NULL || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* append printf output to the error buffer, silently truncating */
void sched_err_append(char *err, size_t errlen, const char *fmt, ...) {
    if (err == NULL || errlen == 0) return;
    size_t used = strlen(err);
    if (used + 1 >= errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + used, errlen - used, fmt, ap);
    va_end(ap);
}

/* format an action for messages; never fails (falls back to "?") */
const char *sched_act_str(const sched_action *a, char *buf, size_t len) {
    if (sched_action_format(a, buf, len) != 0) snprintf(buf, len, "?");
    return buf;
}

/* the spelling torch uses for each op, indexed by sched_op */
const char *const sched_op_names[SCHED_NOPS] = {
    "F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "I", "W"
};

/* F, B, I and W compute; the rest move data */
int sched_op_computes(sched_op op) {
    return op == SCHED_F || op == SCHED_B || op == SCHED_I || op == SCHED_W;
}

/* true if op is one of the known kinds */
int sched_op_known(int op) {
    return op >= 0 && op < SCHED_NOPS;
}

/* compute time of an action under the unit-cost model */
int sched_op_cost(sched_op op) {
    if (op == SCHED_F) return SCHED_COST_F;
    if (op == SCHED_B) return SCHED_COST_B;
    if (op == SCHED_I) return SCHED_COST_I;
    if (op == SCHED_W) return SCHED_COST_W;
    return 0;
}

/* the stage a communication action talks to (-1 for compute actions) */
int sched_peer_stage(const sched_action *a) {
    switch (a->op) {
    case SCHED_SEND_F: case SCHED_RECV_B: return a->stage + 1;
    case SCHED_RECV_F: case SCHED_SEND_B: return a->stage - 1;
    default: return -1;
    }
}

/* the op on the peer that pairs with a communication op */
sched_op sched_partner_op(sched_op op) {
    switch (op) {
    case SCHED_SEND_F: return SCHED_RECV_F;
    case SCHED_RECV_F: return SCHED_SEND_F;
    case SCHED_SEND_B: return SCHED_RECV_B;
    case SCHED_RECV_B: return SCHED_SEND_B;
    default: return op;
    }
}

/* chunks per rank: V, with 0 (a struct zeroed by hand) read as 1 */
int sched_nchunks(const sched *s) {
    return s->V > 1 ? s->V : 1;
}

/* the number of global stages S = P * V */
int sched_nstages(const sched *s) {
    return s == NULL ? 0 : s->P * sched_nchunks(s);
}

/* allocate an empty schedule shell with P ranks of V chunks */
static int sched_alloc(sched *s, const char *name, int P, int V, int M) {
    memset(s, 0, sizeof(*s));
    snprintf(s->name, sizeof(s->name), "%s", name ? name : "");
    s->P = P;
    s->V = V;
    s->M = M;
    s->n = calloc((size_t)P, sizeof(int));
    s->acts = calloc((size_t)P, sizeof(sched_action *));
    if (s->n == NULL || s->acts == NULL) { sched_free(s); return PL_ENOMEM; }
    return PL_OK;
}

/* the placement map (sched.h): the rank of global stage s */
int sched_place_rank(int place, int P, int s) {
    if (P < 1 || s < 0) return -1;
    int c = s / P, i = s % P;
    return place == SCHED_PLACE_V && (c & 1) ? P - 1 - i : i;
}

/* the chunk of global stage s on its rank: s / P in either placement */
int sched_place_chunk(int place, int P, int s) {
    (void)place;
    return P < 1 || s < 0 ? -1 : s / P;
}

/* the global stage of chunk c on rank r */
int sched_place_stage(int place, int P, int r, int c) {
    return c * P + (place == SCHED_PLACE_V && (c & 1) ? P - 1 - r : r);
}

/* the placement's name, as the dry run and the messages print it */
const char *sched_place_name(int place) {
    return place == SCHED_PLACE_LOOP ? "loop" : place == SCHED_PLACE_V ? "v" : NULL;
}

/* the rank of stage st in schedule s */
int sched_stage_rank(const sched *s, int st) {
    return sched_place_rank(s->place, s->P, st);
}

/* 1 if stages a and a + 1 run on one rank of a V placement (they hand over in memory, no
   messages); the loop placement keeps its messages even where they go to the same rank (one
   rank with V chunks), as it always has */
int sched_local_edge(const sched *s, int a) {
    return s->place == SCHED_PLACE_V && a >= 0 && a + 1 < sched_nstages(s) &&
           sched_stage_rank(s, a) == sched_stage_rank(s, a + 1);
}

/* append one action of global stage st to its rank (capacity was sized by the caller) */
void sched_push(sched *s, int st, sched_op op, int mb) {
    int r = sched_stage_rank(s, st);
    sched_action *a = &s->acts[r][s->n[r]++];
    a->op = op;
    a->stage = st;
    a->mb = mb;
}

/* sched_push the forward of mb on stage st with its receive (not on stage 0) and its send
   (not on the last stage); receive first, send right after the compute; none across a
   local edge (both stages on this rank) */
void sched_push_fwd(sched *s, int st, int mb) {
    if (st > 0 && !sched_local_edge(s, st - 1)) sched_push(s, st, SCHED_RECV_F, mb);
    sched_push(s, st, SCHED_F, mb);
    if (st < sched_nstages(s) - 1 && !sched_local_edge(s, st)) sched_push(s, st, SCHED_SEND_F, mb);
}

/* sched_push the backward of mb on stage st with its receive (not on the last stage) and its
   send (not on stage 0); none across a local edge */
void sched_push_bwd(sched *s, int st, int mb) {
    if (st < sched_nstages(s) - 1 && !sched_local_edge(s, st)) sched_push(s, st, SCHED_RECV_B, mb);
    sched_push(s, st, SCHED_B, mb);
    if (st > 0 && !sched_local_edge(s, st - 1)) sched_push(s, st, SCHED_SEND_B, mb);
}

/* 2 for the V-shaped schedules (they run exactly two chunks per rank), else 1 */
int sched_default_chunks(const char *name) {
    const sched_kind *k = sched_kind_find(name);
    return k && k->chunks == SCHED_CHUNKS_V ? 2 : 1;
}

/* the V-shaped schedules are placed V, the others loop */
int sched_name_place(const char *name) {
    return sched_default_chunks(name) == 2 ? SCHED_PLACE_V : SCHED_PLACE_LOOP;
}

/* the M rule of a schedule, or NULL if the name is unknown */
const char *sched_constraint(const char *name) {
    const sched_kind *k = sched_kind_find(name);
    return k ? k->rule : NULL;
}

/* the memory a build takes, from the pair count; see header */
double sched_build_bytes(int P, int V, int M) {
    return SCHED_BYTES_PER_PAIR * (double)(P > 0 ? P : 1) * (V > 0 ? V : 1) * (M > 0 ? M : 1);
}

/* build a named schedule with one chunk per rank; see header */
int sched_build(const char *name, int P, int M, sched *s, char *err, size_t errlen) {
    return sched_build_chunks(name, P, 1, M, s, err, errlen);
}

/* build a named schedule; see header */
int sched_build_chunks(const char *name, int P, int V, int M, sched *s, char *err, size_t errlen) {
    if (s == NULL) { sched_err(err, errlen, "sched_build: NULL output"); return PL_EINVAL; }
    memset(s, 0, sizeof(*s));
    if (name == NULL) { sched_err(err, errlen, "sched_build: no schedule name"); return PL_EINVAL; }
    const sched_kind *k = sched_kind_find(name);
    if (!k) {
        char names[512];
        sched_kind_names(names, sizeof names);
        sched_err(err, errlen, "sched_build: unknown schedule '%s' (expected one of %s)", name, names);
        return PL_EINVAL;
    }
    if (P < 1) { sched_err(err, errlen, "sched_build: need at least 1 stage, got P=%d", P); return PL_EINVAL; }
    if (M < 1) { sched_err(err, errlen, "sched_build: need at least 1 micro-batch, got M=%d", M); return PL_EINVAL; }
    if (V < 1) { sched_err(err, errlen, "sched_build: need at least 1 chunk per rank, got V=%d", V); return PL_EINVAL; }
    if (M > (1 << 24) || P > (1 << 16) || V > (1 << 10) || (long)P * V > (1 << 16)) {
        sched_err(err, errlen, "sched_build: P=%d V=%d M=%d too large", P, V, M);
        return PL_EINVAL;
    }
    if (k->chunks == SCHED_CHUNKS_V && V != 2) {
        sched_err(err, errlen, "sched_build: %s runs exactly 2 chunks per rank (stages r and 2P-1-r on rank r), got %d",
                name, V);
        return PL_EINVAL;
    }
    if (V > 1 && k->chunks == SCHED_CHUNKS_ONE) {
        char chunked[256] = "";
        for (const sched_kind *c = sched_kinds; c->name; c++)
            if (c->chunks == SCHED_CHUNKS_ANY) sched_err_append(chunked, sizeof chunked, "%s%s", chunked[0] ? ", " : "",
                                                                c->name);
        sched_err(err, errlen, "sched_build: %s runs one chunk per rank, got %d chunks per rank (the schedules that "
                  "take chunks: %s)", name, V, chunked);
        return PL_EINVAL;
    }
    int G = sched_interleave_group(P, M);
    if (sched_alloc(s, name, P, V, M) != 0) { sched_err(err, errlen, "sched_build: out of memory"); return PL_ENOMEM; }
    s->place = sched_name_place(name);
    // at most 7 actions per micro-batch per chunk: F, I and W (or B), four comm actions
    for (int r = 0; r < P; r++) {
        s->acts[r] = malloc((size_t)M * (size_t)V * 7 * sizeof(sched_action));
        if (s->acts[r] == NULL) {
            sched_free(s);
            sched_err(err, errlen, "sched_build: out of memory");
            return PL_ENOMEM;
        }
    }
    int rc = k->generate(s, G);
    if (rc != PL_OK) {
        sched_free(s);
        if (rc == PL_ENOMEM) sched_err(err, errlen, "sched_build: out of memory");
        else sched_err(err, errlen, "sched_build: %s P=%d V=%d M=%d stalls (no rank can move); report it", name, P, V, M);
        return rc;
    }
    return PL_OK;
}

/* free the per-rank lists and reset the struct */
void sched_free(sched *s) {
    if (s == NULL) return;
    if (s->acts != NULL) {
        for (int r = 0; r < s->P; r++) free(s->acts[r]);
    }
    free(s->acts);
    free(s->n);
    memset(s, 0, sizeof(*s));
}

// ----------------------------------------------------------------------------
// inspection and printing

/* walk rank `stage` counting F minus B (or W) over all its chunks and keep the maximum */
int sched_max_inflight(const sched *s, int stage) {
    if (s == NULL || s->n == NULL || s->acts == NULL || stage < 0 || stage >= s->P) return -1;
    int cur = 0, best = 0;
    for (int i = 0; i < s->n[stage]; i++) {
        const sched_action *a = &s->acts[stage][i];
        if (a->op == SCHED_F) cur++;
        else if (a->op == SCHED_B || a->op == SCHED_W) cur--;
        if (cur > best) best = cur;
    }
    return best;
}

/* walk the rank of global stage `stage` counting only that stage's F minus B (or W) */
int sched_max_inflight_stage(const sched *s, int stage) {
    if (s == NULL || s->n == NULL || s->acts == NULL || s->P < 1 || stage < 0 || stage >= sched_nstages(s))
        return -1;
    int r = sched_stage_rank(s, stage), cur = 0, best = 0;
    for (int i = 0; i < s->n[r]; i++) {
        const sched_action *a = &s->acts[r][i];
        if (a->stage != stage) continue;
        if (a->op == SCHED_F) cur++;
        else if (a->op == SCHED_B || a->op == SCHED_W) cur--;
        if (cur > best) best = cur;
    }
    return best;
}

/* walk the rank of global stage `stage`: does an I or B of that stage start while another
   micro-batch's W of that stage is pending? */
int sched_defers_weights_stage(const sched *s, int stage) {
    if (s == NULL || s->n == NULL || s->acts == NULL || s->P < 1 || stage < 0 || stage >= sched_nstages(s))
        return 0;
    int r = sched_stage_rank(s, stage), pending = 0;
    for (int i = 0; i < s->n[r]; i++) {
        if (s->acts[r][i].stage != stage) continue;
        sched_op op = s->acts[r][i].op;
        if ((op == SCHED_I || op == SCHED_B) && pending) return 1;
        if (op == SCHED_I) pending++;
        else if (op == SCHED_W) pending--;
    }
    return 0;
}

/* rank `stage` defers weights if any of its chunks does (with V = 1: its one stage; the
   walk then sees every action of the rank, as before chunks existed) */
int sched_defers_weights(const sched *s, int stage) {
    if (s == NULL || s->n == NULL || s->acts == NULL || stage < 0 || stage >= s->P) return 0;
    if (sched_nchunks(s) == 1) {
        int pending = 0;
        for (int i = 0; i < s->n[stage]; i++) {
            sched_op op = s->acts[stage][i].op;
            if ((op == SCHED_I || op == SCHED_B) && pending) return 1;
            if (op == SCHED_I) pending++;
            else if (op == SCHED_W) pending--;
        }
        return 0;
    }
    for (int c = 0; c < sched_nchunks(s); c++)
        if (sched_defers_weights_stage(s, sched_place_stage(s->place, s->P, stage, c))) return 1;
    return 0;
}

/* decimal digits of a non-negative int */
