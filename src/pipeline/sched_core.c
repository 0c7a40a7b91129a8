/*
 * sched_core.c — what every part of the schedule module shares (sched_internal.h): error
 * formatting, the ops' properties, the placements, and the push helpers a generator adds an
 * action with (its messages included).
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
