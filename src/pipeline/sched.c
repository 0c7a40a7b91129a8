/*
 * sched.c: pipeline schedules (build, text/CSV form, validation, unit-cost
 * simulation, grid printing). See src/pipeline/sched.h.
 */
#include "util/common.h"
#include "pipeline/sched.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// small helpers

/* printf into the caller's error buffer (which may be NULL) */
static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (err == NULL || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* append printf output to the error buffer, silently truncating */
static void append_err(char *err, size_t errlen, const char *fmt, ...) {
    if (err == NULL || errlen == 0) return;
    size_t used = strlen(err);
    if (used + 1 >= errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + used, errlen - used, fmt, ap);
    va_end(ap);
}

/* format an action for messages; never fails (falls back to "?") */
static const char *act_str(const sched_action *a, char *buf, size_t len) {
    if (sched_action_format(a, buf, len) != 0) snprintf(buf, len, "?");
    return buf;
}

/* the spelling torch uses for each op, indexed by sched_op */
static const char *const op_names[SCHED_NOPS] = {
    "F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "I", "W"
};

/* F, B, I and W compute; the rest move data */
static int is_compute(sched_op op) {
    return op == SCHED_F || op == SCHED_B || op == SCHED_I || op == SCHED_W;
}

/* true if op is one of the known kinds */
static int op_valid(int op) {
    return op >= 0 && op < SCHED_NOPS;
}

/* compute time of an action under the unit-cost model */
static int op_cost(sched_op op) {
    if (op == SCHED_F) return SCHED_COST_F;
    if (op == SCHED_B) return SCHED_COST_B;
    if (op == SCHED_I) return SCHED_COST_I;
    if (op == SCHED_W) return SCHED_COST_W;
    return 0;
}

/* the stage a communication action talks to (-1 for compute actions) */
static int peer_stage(const sched_action *a) {
    switch (a->op) {
    case SCHED_SEND_F: case SCHED_RECV_B: return a->stage + 1;
    case SCHED_RECV_F: case SCHED_SEND_B: return a->stage - 1;
    default: return -1;
    }
}

/* the op on the peer that pairs with a communication op */
static sched_op partner_op(sched_op op) {
    switch (op) {
    case SCHED_SEND_F: return SCHED_RECV_F;
    case SCHED_RECV_F: return SCHED_SEND_F;
    case SCHED_SEND_B: return SCHED_RECV_B;
    case SCHED_RECV_B: return SCHED_SEND_B;
    default: return op;
    }
}

/* chunks per rank: V, with 0 (a struct zeroed by hand) read as 1 */
static int nchunks(const sched *s) {
    return s->V > 1 ? s->V : 1;
}

/* the number of global stages S = P * V */
int sched_nstages(const sched *s) {
    return s == NULL ? 0 : s->P * nchunks(s);
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
static int local_edge(const sched *s, int a) {
    return s->place == SCHED_PLACE_V && a >= 0 && a + 1 < sched_nstages(s) &&
           sched_stage_rank(s, a) == sched_stage_rank(s, a + 1);
}

/* append one action of global stage st to its rank (capacity was sized by the caller) */
static void push(sched *s, int st, sched_op op, int mb) {
    int r = sched_stage_rank(s, st);
    sched_action *a = &s->acts[r][s->n[r]++];
    a->op = op;
    a->stage = st;
    a->mb = mb;
}

/* push the forward of mb on stage st with its receive (not on stage 0) and its send
   (not on the last stage); receive first, send right after the compute; none across a
   local edge (both stages on this rank) */
static void push_fwd(sched *s, int st, int mb) {
    if (st > 0 && !local_edge(s, st - 1)) push(s, st, SCHED_RECV_F, mb);
    push(s, st, SCHED_F, mb);
    if (st < sched_nstages(s) - 1 && !local_edge(s, st)) push(s, st, SCHED_SEND_F, mb);
}

/* push the backward of mb on stage st with its receive (not on the last stage) and its
   send (not on stage 0); none across a local edge */
static void push_bwd(sched *s, int st, int mb) {
    if (st < sched_nstages(s) - 1 && !local_edge(s, st)) push(s, st, SCHED_RECV_B, mb);
    push(s, st, SCHED_B, mb);
    if (st > 0 && !local_edge(s, st - 1)) push(s, st, SCHED_SEND_B, mb);
}

// ----------------------------------------------------------------------------
// generators

/* GPipe: all forwards in order, then all backwards in ascending order. Each
   send is issued before the next receive, so no rank waits on a peer that is
   itself waiting for this rank's pending send. */
static void gen_gpipe(sched *s) {
    for (int r = 0; r < s->P; r++) {
        for (int mb = 0; mb < s->M; mb++) push_fwd(s, r, mb);
        for (int mb = 0; mb < s->M; mb++) push_bwd(s, r, mb);
    }
}

/* 1F1B: stage r runs w = min(P-r-1, M) warm-up forwards, then alternates
   one forward and one backward until the forwards run out, then drains the
   remaining backwards. Backwards stay in ascending mb order so gradient
   accumulation order matches GPipe. In the steady state SEND_F of the new
   forward precedes RECV_B of the backward: the downstream stage needs that
   activation before it can produce the gradient we wait for. */
static void gen_1f1b(sched *s) {
    for (int r = 0; r < s->P; r++) {
        int w = s->P - r - 1;
        if (w > s->M) w = s->M;
        int fwd = 0, bwd = 0;
        for (; fwd < w; fwd++) push_fwd(s, r, fwd);
        for (; fwd < s->M; fwd++, bwd++) {
            push_fwd(s, r, fwd);
            push_bwd(s, r, bwd);
        }
        for (; bwd < s->M; bwd++) push_bwd(s, r, bwd);
    }
}

/* the input part of mb's backward (I) with its receive and send (none across a local edge) */
static void push_bwd_input(sched *s, int st, int mb) {
    if (st < sched_nstages(s) - 1 && !local_edge(s, st)) push(s, st, SCHED_RECV_B, mb);
    push(s, st, SCHED_I, mb);
    if (st > 0 && !local_edge(s, st - 1)) push(s, st, SCHED_SEND_B, mb);
}

/* ZB-H1 as a list scheduler over the unit-cost model (F = I = W = 1, messages free): at
   each time unit a free rank runs, in this order of preference, the I whose gradient has
   arrived, else the next F if its input has arrived and the rank holds fewer than 1F1B's
   P - r micro-batches (the same activation memory), else its oldest pending W. The W's so
   fill the time a rank would wait, and the I's carry the gradients back at one unit per
   stage. Every choice is made when its data is there, so the list replays without waiting
   in a different order; I, W and F each run in ascending micro-batch order. */
static int gen_zbh1(sched *s) {
    int P = s->P, M = s->M;
    int *nf = calloc((size_t)P, sizeof(int)), *ni = calloc((size_t)P, sizeof(int));
    int *nw = calloc((size_t)P, sizeof(int)), *busy = calloc((size_t)P, sizeof(int));
    long *fdone = malloc(sizeof(long) * (size_t)P * M), *idone = malloc(sizeof(long) * (size_t)P * M);
    if (!nf || !ni || !nw || !busy || !fdone || !idone) {
        free(nf); free(ni); free(nw); free(busy); free(fdone); free(idone);
        return PL_ENOMEM;
    }
    for (size_t k = 0; k < (size_t)P * M; k++) fdone[k] = idone[k] = -1;
#define AT(a, r, mb) (a)[(size_t)(r) * M + (mb)]
    int left = P * M * 3;
    for (long t = 0; left > 0; t++)
        for (int r = 0; r < P; r++) {
            if (busy[r] > t) continue;
            int i = ni[r], f = nf[r];
            int grad = i < f && (r == P - 1 ? AT(fdone, r, i) >= 0 && AT(fdone, r, i) <= t
                                            : AT(idone, r + 1, i) >= 0 && AT(idone, r + 1, i) <= t);
            int input = f < M && (r == 0 || (AT(fdone, r - 1, f) >= 0 && AT(fdone, r - 1, f) <= t));
            if (grad) {
                push_bwd_input(s, r, i);
                AT(idone, r, i) = t + 1;
                ni[r]++;
            } else if (input && f - nw[r] < P - r) {
                push_fwd(s, r, f);
                AT(fdone, r, f) = t + 1;
                nf[r]++;
            } else if (nw[r] < ni[r]) {
                push(s, r, SCHED_W, nw[r]++);
            } else {
                continue;
            }
            busy[r] = (int)(t + 1);
            left--;
        }
#undef AT
    free(nf); free(ni); free(nw); free(busy); free(fdone); free(idone);
    return PL_OK;
}

/* The group size G of the interleaved orders: the forwards visit a rank's chunks G
   micro-batches at a time, G = ceil(M / rounds) with rounds = max(1, floor(M / P)), so
   P <= G < 2P once M >= P (torch's flexible form of Megatron's G = P; torch takes only the
   M that are a multiple of their rounds, where G = M / rounds). */
static int interleave_group(int P, int M) {
    int rounds = M / P > 1 ? M / P : 1;
    return (M + rounds - 1) / rounds;
}

/* The k-th forward (fwd = 1) or backward (fwd = 0) of rank r in the interleaved orders, as
   its global stage and micro-batch: micro-batches in consecutive groups of G, each group
   through the chunks 0..V-1 (forwards) or V-1..0 (backwards); within a chunk micro-batches
   ascend. When G does not divide M the last group is short: the order is that of the next
   multiple of G with the missing micro-batches left out. */
static void interleave_op(int P, int V, int M, int G, int r, int k, int fwd, int *st, int *mb) {
    int group = k / (G * V), within = k % (G * V);
    int g = M - group * G < G ? M - group * G : G; /* the last group may be short */
    int chunk = within / g;
    if (!fwd) chunk = V - 1 - chunk;
    *st = chunk * P + r;
    *mb = group * G + within % g;
}

/* Interleaved-1F1B's warm-up on rank r, counted in the order padded to Mp = a multiple of
   G micro-batches: (V-1)G forwards that fill the later chunks, plus two per hop to the
   last rank (a backward costs two forwards), at most all V*Mp. */
static int interleave_warmup(int P, int V, int Mp, int G, int r) {
    long w = (long)(V - 1) * G + 2L * (P - 1 - r);
    return w < (long)V * Mp ? (int)w : V * Mp;
}

/* push the k-th forward or backward of rank r in the order padded to a multiple of G,
   unless it belongs to a padding micro-batch (mb >= M) */
static void push_padded(sched *s, int G, int r, int k, int fwd) {
    int P = s->P, V = s->V, group = k / (G * V), within = k % (G * V), chunk = within / G;
    int st = (fwd ? chunk : V - 1 - chunk) * P + r, mb = group * G + within % G;
    if (mb >= s->M) return;
    if (fwd) push_fwd(s, st, mb);
    else push_bwd(s, st, mb);
}

/* Interleaved 1F1B (Narayanan et al. 2021; torch's ScheduleInterleaved1F1B): warm-up
   forwards in the interleaved order, then one forward and one backward in turn, then the
   remaining backwards. Messages as in 1F1B: the receive right before the compute, the send
   right after it, so a new forward's SEND_F precedes the RECV_B of the backward after it.
   Where G does not divide M the lists are those of Mp = the next multiple of G without the
   padding micro-batches: leaving whole micro-batches out of a deadlock-free schedule keeps
   it deadlock-free (any wait cycle among what is left was one in the whole). */
static void gen_interleaved(sched *s, int G) {
    int P = s->P, V = s->V, Mp = (s->M + G - 1) / G * G, n = V * Mp;
    for (int r = 0; r < P; r++) {
        int w = interleave_warmup(P, V, Mp, G, r), f = 0, b = 0;
        for (; f < w; f++) push_padded(s, G, r, f, 1);
        for (; f < n; f++, b++) {
            push_padded(s, G, r, f, 1);
            push_padded(s, G, r, b, 0);
        }
        for (; b < n; b++) push_padded(s, G, r, b, 0);
    }
}

/* Looped BFS (torch's ScheduleLoopedBFS): every forward of the rank's chunk 0, then of
   chunk 1, ...; then the backwards from the last chunk down to chunk 0, each chunk's in
   ascending micro-batch order (torch descends; the gradient-order rule wants them up). */
static void gen_looped_bfs(sched *s) {
    for (int r = 0; r < s->P; r++) {
        for (int c = 0; c < s->V; c++)
            for (int mb = 0; mb < s->M; mb++) push_fwd(s, c * s->P + r, mb);
        for (int c = s->V - 1; c >= 0; c--)
            for (int mb = 0; mb < s->M; mb++) push_bwd(s, c * s->P + r, mb);
    }
}

/* Interleaved zero bubble (torch's ScheduleInterleavedZeroBubble, ZB1P in Qi et al.) as a
   list scheduler over the unit-cost model, ZB-H1's rule on interleaved-1F1B's orders: at
   each time unit a free rank runs its next I (in interleaved-1F1B's backward order) if the
   gradient has arrived, else its next F (in the interleaved forward order) if its input has
   arrived and the rank holds fewer micro-batches than interleaved-1F1B's peak, else its
   oldest pending W (in I order, so ascending per stage). Every choice is made when its
   data is there, so the lists replay without deadlock. -1 on OOM, -2 if it stalls. */
static int gen_interleaved_zb(sched *s, int G) {
    int P = s->P, V = s->V, M = s->M, S = P * V, n = V * M;
    int *nf = calloc((size_t)P, sizeof(int)), *ni = calloc((size_t)P, sizeof(int));
    int *nw = calloc((size_t)P, sizeof(int)), *busy = calloc((size_t)P, sizeof(int));
    long *fdone = malloc(sizeof(long) * (size_t)S * M), *idone = malloc(sizeof(long) * (size_t)S * M);
    int rc = PL_OK;
    if (!nf || !ni || !nw || !busy || !fdone || !idone) { rc = PL_ENOMEM; goto out; }
    for (size_t k = 0; k < (size_t)S * M; k++) fdone[k] = idone[k] = -1;
#define AT(a, st, mb) (a)[(size_t)(st) * M + (mb)]
#define ARRIVED(a, st, mb, t) (AT(a, st, mb) >= 0 && AT(a, st, mb) <= (t))
    long left = 3L * S * M;
    for (long t = 0; left > 0; t++) {
        int acted = 0, waiting = 0;
        for (int r = 0; r < P; r++) {
            if (busy[r] > t) { waiting = 1; continue; }
            int ist = -1, imb = 0, fst = -1, fmb = 0;
            if (ni[r] < n) interleave_op(P, V, M, G, r, ni[r], 0, &ist, &imb);
            if (nf[r] < n) interleave_op(P, V, M, G, r, nf[r], 1, &fst, &fmb);
            int lim = interleave_warmup(P, V, (M + G - 1) / G * G, G, r) + 1;
            if (lim > n) lim = n;
            int grad = ist >= 0 && ARRIVED(fdone, ist, imb, t) &&
                       (ist == S - 1 || ARRIVED(idone, ist + 1, imb, t));
            int input = fst >= 0 && (fst == 0 || ARRIVED(fdone, fst - 1, fmb, t));
            if (grad) {
                push_bwd_input(s, ist, imb);
                AT(idone, ist, imb) = t + 1;
                ni[r]++;
            } else if (input && nf[r] - nw[r] < lim) {
                push_fwd(s, fst, fmb);
                AT(fdone, fst, fmb) = t + 1;
                nf[r]++;
            } else if (nw[r] < ni[r]) {
                int wst, wmb;
                interleave_op(P, V, M, G, r, nw[r]++, 0, &wst, &wmb);
                push(s, wst, SCHED_W, wmb);
            } else {
                continue;
            }
            busy[r] = (int)(t + 1);
            acted = 1;
            left--;
        }
        if (!acted && !waiting) { rc = PL_ESTATE; break; } /* nothing runs and nothing will arrive */
    }
#undef ARRIVED
#undef AT
out:
    free(nf); free(ni); free(nw); free(busy); free(fdone); free(idone);
    return rc;
}

/* One rank's list in a V-shaped schedule: its two stages (chunk 0 = stage r, chunk 1 =
   stage 2P-1-r), the next micro-batch of each chunk's F, I (a full B counts as one) and W,
   and the queue of I's whose W is still to run (dualpipev). The list is built for Mp >= M
   micro-batches and the actions of micro-batches >= M are left out: whole micro-batches
   removed from a deadlock-free schedule leave one (the full run's order, restricted to
   what is left, is an order the smaller one can run), and each stage's order stays
   ascending. */
typedef struct {
    sched *s;
    int st[2], nf[2], ni[2], nw[2];
    int *qc, *qm, qh, qt;
} vrank;

/* the next forward of chunk c */
static void v_fwd(vrank *v, int c) {
    int mb = v->nf[c]++;
    if (mb < v->s->M) push_fwd(v->s, v->st[c], mb);
}

/* the next input part of chunk c; queue: its W goes to the pending queue */
static void v_inp(vrank *v, int c, int queue) {
    int mb = v->ni[c]++;
    if (queue) { v->qc[v->qt] = c; v->qm[v->qt++] = mb; }
    if (mb < v->s->M) push_bwd_input(v->s, v->st[c], mb);
}

/* the next full backward of chunk c (its I and W counters both move) */
static void v_bwd(vrank *v, int c) {
    int mb = v->ni[c]++;
    v->nw[c]++;
    if (mb < v->s->M) push_bwd(v->s, v->st[c], mb);
}

/* the next weight part of chunk c */
static void v_wgt(vrank *v, int c) {
    int mb = v->nw[c]++;
    if (mb < v->s->M) push(v->s, v->st[c], SCHED_W, mb);
}

/* the oldest pending weight part, if any */
static void v_wgt_queued(vrank *v) {
    if (v->qh == v->qt) return;
    int c = v->qc[v->qh], mb = v->qm[v->qh++];
    v->nw[c]++;
    if (mb < v->s->M) push(v->s, v->st[c], SCHED_W, mb);
}

/* ZB-V (Qi et al., section 6) on rank r for Mp = max(M, 2P-1) micro-batches: 2(P-r)-1
   forwards of chunk 0; r pairs (chunk 1, chunk 0) of forwards; P-r rounds of chunk 1's F, I,
   W; the steady rounds (chunk 0's F while any is left, I, W; chunk 1's F, I, W) until both
   chunks have run every forward; r pairs of input parts (chunk 0, chunk 1); P-r rounds of
   chunk 0's I and oldest W; then chunk 1's and chunk 0's remaining W's. */
static void gen_zbv_rank(vrank *v, int P, int r, int Mp) {
    for (int k = 0; k < 2 * (P - r) - 1; k++) v_fwd(v, 0);
    for (int k = 0; k < r; k++) { v_fwd(v, 1); v_fwd(v, 0); }
    for (int k = 0; k < P - r; k++) { v_fwd(v, 1); v_inp(v, 1, 0); v_wgt(v, 1); }
    while (v->nf[1] < v->nf[0] || v->nf[0] < Mp) {
        if (v->nf[0] < Mp) v_fwd(v, 0);
        v_inp(v, 0, 0); v_wgt(v, 0);
        v_fwd(v, 1); v_inp(v, 1, 0); v_wgt(v, 1);
    }
    for (int k = 0; k < r; k++) { v_inp(v, 0, 0); v_inp(v, 1, 0); }
    for (int k = 0; k < P - r; k++) { v_inp(v, 0, 0); v_wgt(v, 0); }
    while (v->nw[1] < v->ni[1]) v_wgt(v, 1);
    while (v->nw[0] < v->ni[0]) v_wgt(v, 0);
}

/* DualPipeV (DeepSeek's DualPipe on P ranks, torch's ScheduleDualPipeV) on rank r for
   Mp = max(M, 2P): 2(P-r-1) forwards of chunk 0; r+1 pairs of forwards (0, 1); P-r-1 rounds
   of chunk 1's I, the oldest W, chunk 1's F; the main rounds (chunk 0's F with chunk 1's B,
   chunk 1's F with chunk 0's B: torch overlaps each pair, here they run in turn); P-r-1
   rounds of chunk 1's B then chunk 1's F with chunk 0's B; r+1 rounds of a backward of each
   chunk, the later half split into I (W queued; odd ranks switch one chunk earlier); P-r-1
   rounds of the oldest W and chunk 0's backward; the W's left. */
static void gen_dualpipev_rank(vrank *v, int P, int r, int Mp) {
    for (int k = 0; k < 2 * (P - r - 1); k++) v_fwd(v, 0);
    for (int k = 0; k < r + 1; k++) { v_fwd(v, 0); v_fwd(v, 1); }
    for (int k = 0; k < P - r - 1; k++) { v_inp(v, 1, 1); v_wgt_queued(v); v_fwd(v, 1); }
    for (int k = 0; k < Mp - 2 * P + r + 1; k++) { v_fwd(v, 0); v_bwd(v, 1); v_fwd(v, 1); v_bwd(v, 0); }
    for (int k = 0; k < P - r - 1; k++) { v_bwd(v, 1); v_fwd(v, 1); v_bwd(v, 0); }
    int zb = 0, half = (r + 1) / 2;
    for (int i = 0; i < r + 1; i++) {
        if (i == half && r % 2 == 1) zb = 1;
        if (zb) v_inp(v, 1, 1); else v_bwd(v, 1);
        if (i == half && r % 2 == 0) zb = 1;
        if (zb) v_inp(v, 0, 1); else v_bwd(v, 0);
    }
    for (int k = 0; k < P - r - 1; k++) {
        v_wgt_queued(v);
        if (zb) v_inp(v, 0, 1); else v_bwd(v, 0);
    }
    while (v->qh < v->qt) v_wgt_queued(v);
}

/* zb-v (dual = 0) or dualpipev (dual = 1) on every rank; the schedule is V = 2, placed V */
static int gen_vshape(sched *s, int dual) {
    int P = s->P, M = s->M, Mp = dual ? (M > 2 * P ? M : 2 * P) : (M > 2 * P - 1 ? M : 2 * P - 1);
    vrank v;
    v.qc = malloc(sizeof(int) * 2 * (size_t)Mp);
    v.qm = malloc(sizeof(int) * 2 * (size_t)Mp);
    if (!v.qc || !v.qm) { free(v.qc); free(v.qm); return PL_ENOMEM; }
    for (int r = 0; r < P; r++) {
        v.s = s;
        v.st[0] = sched_place_stage(s->place, P, r, 0);
        v.st[1] = sched_place_stage(s->place, P, r, 1);
        v.nf[0] = v.nf[1] = v.ni[0] = v.ni[1] = v.nw[0] = v.nw[1] = 0;
        v.qh = v.qt = 0;
        if (dual) gen_dualpipev_rank(&v, P, r, Mp);
        else gen_zbv_rank(&v, P, r, Mp);
    }
    free(v.qc);
    free(v.qm);
    return PL_OK;
}

/* the schedules sched_build_chunks knows, with the M they need, for messages and --help */
static const struct { const char *name; int chunks; const char *rule; } known[] = {
    { "gpipe", 0, "any M; holds M micro-batches per rank" },
    { "1f1b", 0, "any M; bubble (P-1)/(M+P-1)" },
    { "zb-h1", 0, "any M; 1f1b's memory, less bubble once M >= P" },
    { "interleaved-1f1b", 1, "any M (torch: M < 2P or a multiple of floor(M/P)); the bubble is (P-1)/(V*M) "
                             "of the ideal exactly when P divides M, and M = 1 gains nothing over 1f1b" },
    { "looped-bfs", 1, "any M; holds V*M micro-batches per rank" },
    { "interleaved-zb", 1, "any M (torch: as interleaved-1f1b); interleaved-1f1b's memory" },
    { "zb-v", 2, "2 chunks per rank in a V; any M (zero unit-cost bubble once M >= 2P-1); 1f1b's memory" },
    { "dualpipev", 2, "2 chunks per rank in a V; any M (torch: M >= 2P); F and B of two chunks paired" },
};
#define NKNOWN (int)(sizeof(known) / sizeof(known[0]))

/* 2 for the V-shaped schedules (they run exactly two chunks per rank), else 1 */
int sched_default_chunks(const char *name) {
    for (int k = 0; name && k < NKNOWN; k++)
        if (strcmp(name, known[k].name) == 0) return known[k].chunks == 2 ? 2 : 1;
    return 1;
}

/* the V-shaped schedules are placed V, the others loop */
int sched_name_place(const char *name) {
    return sched_default_chunks(name) == 2 ? SCHED_PLACE_V : SCHED_PLACE_LOOP;
}

/* the M rule of a schedule, or NULL if the name is unknown */
const char *sched_constraint(const char *name) {
    for (int k = 0; name && k < NKNOWN; k++)
        if (strcmp(name, known[k].name) == 0) return known[k].rule;
    return NULL;
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
    if (s == NULL) { set_err(err, errlen, "sched_build: NULL output"); return PL_EINVAL; }
    memset(s, 0, sizeof(*s));
    if (name == NULL) { set_err(err, errlen, "sched_build: no schedule name"); return PL_EINVAL; }
    int k = 0;
    while (k < NKNOWN && strcmp(name, known[k].name) != 0) k++;
    if (k == NKNOWN) {
        set_err(err, errlen, "sched_build: unknown schedule '%s' (expected gpipe, 1f1b or zb-h1; with chunks "
                "per rank interleaved-1f1b, looped-bfs or interleaved-zb; with 2 chunks in a V zb-v or dualpipev)",
                name);
        return PL_EINVAL;
    }
    if (P < 1) { set_err(err, errlen, "sched_build: need at least 1 stage, got P=%d", P); return PL_EINVAL; }
    if (M < 1) { set_err(err, errlen, "sched_build: need at least 1 micro-batch, got M=%d", M); return PL_EINVAL; }
    if (V < 1) { set_err(err, errlen, "sched_build: need at least 1 chunk per rank, got V=%d", V); return PL_EINVAL; }
    if (M > (1 << 24) || P > (1 << 16) || V > (1 << 10) || (long)P * V > (1 << 16)) {
        set_err(err, errlen, "sched_build: P=%d V=%d M=%d too large", P, V, M);
        return PL_EINVAL;
    }
    if (known[k].chunks == 2 && V != 2) {
        set_err(err, errlen, "sched_build: %s runs exactly 2 chunks per rank (stages r and 2P-1-r on rank r), got %d",
                name, V);
        return PL_EINVAL;
    }
    if (V > 1 && !known[k].chunks) {
        set_err(err, errlen, "sched_build: %s runs one chunk per rank, got %d chunks per rank (the schedules that "
                "take chunks: interleaved-1f1b, looped-bfs, interleaved-zb)", name, V);
        return PL_EINVAL;
    }
    int G = interleave_group(P, M);
    if (sched_alloc(s, name, P, V, M) != 0) { set_err(err, errlen, "sched_build: out of memory"); return PL_ENOMEM; }
    s->place = sched_name_place(name);
    // at most 7 actions per micro-batch per chunk: F, I and W (or B), four comm actions
    for (int r = 0; r < P; r++) {
        s->acts[r] = malloc((size_t)M * (size_t)V * 7 * sizeof(sched_action));
        if (s->acts[r] == NULL) {
            sched_free(s);
            set_err(err, errlen, "sched_build: out of memory");
            return PL_ENOMEM;
        }
    }
    int rc = PL_OK;
    /* with one chunk the chunked schedules are the plain ones they generalise */
    if (strcmp(name, "gpipe") == 0 || (V == 1 && strcmp(name, "looped-bfs") == 0)) gen_gpipe(s);
    else if (strcmp(name, "1f1b") == 0 || (V == 1 && strcmp(name, "interleaved-1f1b") == 0)) gen_1f1b(s);
    else if (strcmp(name, "zb-h1") == 0 || (V == 1 && strcmp(name, "interleaved-zb") == 0)) rc = gen_zbh1(s);
    else if (strcmp(name, "looped-bfs") == 0) gen_looped_bfs(s);
    else if (strcmp(name, "interleaved-1f1b") == 0) gen_interleaved(s, G);
    else if (strcmp(name, "zb-v") == 0) rc = gen_vshape(s, 0);
    else if (strcmp(name, "dualpipev") == 0) rc = gen_vshape(s, 1);
    else rc = gen_interleaved_zb(s, G);
    if (rc != PL_OK) {
        sched_free(s);
        if (rc == PL_ENOMEM) set_err(err, errlen, "sched_build: out of memory");
        else set_err(err, errlen, "sched_build: %s P=%d V=%d M=%d stalls (no rank can move); report it", name, P, V, M);
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
// action strings

/* spelling of an op; NULL if out of range */
const char *sched_op_str(sched_op op) {
    return op_valid((int)op) ? op_names[op] : NULL;
}

/* "{stage}{op}{mb}", the torch _Action repr */
int sched_action_format(const sched_action *a, char *buf, size_t len) {
    if (a == NULL || buf == NULL || len == 0) return PL_EINVAL;
    if (!op_valid((int)a->op) || a->stage < 0 || a->mb < 0) { buf[0] = '\0'; return PL_EINVAL; }
    int k = snprintf(buf, len, "%d%s%d", a->stage, op_names[a->op], a->mb);
    if (k < 0 || (size_t)k >= len) { buf[0] = '\0'; return PL_EINVAL; }
    return PL_OK;
}

/* read a run of at most 9 decimal digits (so no int overflow); returns the
   number of characters consumed, 0 if there was no digit or too many */
static int read_uint(const char *p, int *val) {
    int i = 0, v = 0;
    while (p[i] >= '0' && p[i] <= '9') {
        if (i == 9) return 0;
        v = v * 10 + (p[i] - '0');
        i++;
    }
    *val = v;
    return i;
}

/* parse exactly one action string; the longest op name that matches wins
   (so "SEND_F" is never mistaken for something shorter) */
int sched_action_parse(const char *str, sched_action *a) {
    if (str == NULL || a == NULL) return PL_EINVAL;
    int stage, mb;
    int k = read_uint(str, &stage);
    if (k == 0) return PL_EINVAL;
    const char *p = str + k;
    int best = -1;
    size_t best_len = 0;
    for (int op = 0; op < SCHED_NOPS; op++) {
        size_t l = strlen(op_names[op]);
        if (strncmp(p, op_names[op], l) == 0 && l > best_len) { best = op; best_len = l; }
    }
    if (best < 0) return PL_EINVAL;
    p += best_len;
    k = read_uint(p, &mb);
    if (k == 0) return PL_EINVAL;
    if (p[k] != '\0') return PL_EINVAL;
    a->op = (sched_op)best;
    a->stage = stage;
    a->mb = mb;
    return PL_OK;
}

// ----------------------------------------------------------------------------
// CSV

/* one row per rank, comma separated, '\n' terminated */
int sched_write_csv(const sched *s, FILE *f) {
    if (s == NULL || f == NULL || s->n == NULL || s->acts == NULL) return PL_EINVAL;
    char buf[64];
    for (int r = 0; r < s->P; r++) {
        for (int i = 0; i < s->n[r]; i++) {
            if (sched_action_format(&s->acts[r][i], buf, sizeof(buf)) != 0) return PL_EINVAL;
            if (fprintf(f, "%s%s", i ? "," : "", buf) < 0) return PL_EIO;
        }
        if (fputc('\n', f) == EOF) return PL_EIO;
    }
    return ferror(f) ? -1 : 0;
}

/* read one line (without its '\n', with a trailing '\r' removed) into a
   growing buffer; returns 1 if a line was read, 0 at EOF, -1 on OOM */
static int read_line(FILE *f, char **line, size_t *cap) {
    size_t len = 0;
    int c, got = 0;
    while ((c = fgetc(f)) != EOF) {
        got = 1;
        if (c == '\n') break;
        if (len + 2 > *cap) {
            size_t nc = *cap ? *cap * 2 : 256;
            char *nl = realloc(*line, nc);
            if (nl == NULL) return -1;
            *line = nl;
            *cap = nc;
        }
        (*line)[len++] = (char)c;
    }
    if (!got) return 0;
    if (*line == NULL) {
        *line = malloc(1);
        if (*line == NULL) return -1;
        *cap = 1;
    }
    if (len > 0 && (*line)[len - 1] == '\r') len--;
    (*line)[len] = '\0';
    return 1;
}

/* parse one cell: an action, or torch's "(0F3;1B0)OVERLAP_F_B" as its sub-actions in order;
   appends to acts[*n]. PL_OK or PL_EINVAL. */
static int parse_cell(char *cell, sched_action *acts, int *n) {
    static const char tail[] = ")OVERLAP_F_B";
    size_t l = strlen(cell), tl = sizeof tail - 1;
    if (cell[0] != '(') {
        if (sched_action_parse(cell, &acts[*n]) != 0) return PL_EINVAL;
        (*n)++;
        return PL_OK;
    }
    if (l <= tl + 1 || strcmp(cell + l - tl, tail) != 0) return PL_EINVAL;
    cell[l - tl] = '\0';
    for (char *sub = cell + 1, *semi;; sub = semi + 1) {
        semi = strchr(sub, ';');
        if (semi) *semi = '\0';
        while (*sub == ' ') sub++;
        if (sched_action_parse(sub, &acts[*n]) != 0) return PL_EINVAL;
        (*n)++;
        if (!semi) return PL_OK;
    }
}

/* parse one CSV row into a freshly allocated action list */
static int parse_row(char *line, int row, sched_action **out, int *nout,
                     char *err, size_t errlen) {
    int cap = 1;
    for (char *p = line; *p; p++) if (*p == ',' || *p == ';') cap++;
    sched_action *acts = malloc((size_t)cap * sizeof(sched_action));
    if (acts == NULL) { set_err(err, errlen, "sched_read_csv: out of memory"); return PL_ENOMEM; }
    int n = 0, col = 0;
    char *cell = line;
    for (;;) {
        char *comma = strchr(cell, ',');
        if (comma) *comma = '\0';
        // trim blanks around the cell; empty cells (torch's None) are skipped
        while (*cell == ' ' || *cell == '\t') cell++;
        size_t l = strlen(cell);
        while (l > 0 && (cell[l - 1] == ' ' || cell[l - 1] == '\t')) cell[--l] = '\0';
        if (l > 0) {
            char shown[128];
            snprintf(shown, sizeof shown, "%s", cell);
            if (parse_cell(cell, acts, &n) != 0) {
                set_err(err, errlen, "sched_read_csv: row %d (rank %d), column %d: cannot parse action '%s'",
                        row + 1, row, col + 1, shown);
                free(acts);
                return PL_EINVAL;
            }
        }
        col++;
        if (!comma) break;
        cell = comma + 1;
    }
    *out = acts;
    *nout = n;
    return PL_OK;
}

/* the placement every action of s fits: loop first, then V (which must also have no SEND or
   RECV between two stages of one rank, as torch writes it); loop if neither (the validator
   then names the action on the wrong row) */
static int infer_place(sched *s) {
    for (int place = SCHED_PLACE_LOOP; place <= SCHED_PLACE_V; place++) {
        int fits = 1;
        s->place = place;
        for (int r = 0; fits && r < s->P; r++)
            for (int i = 0; fits && i < s->n[r]; i++) {
                const sched_action *a = &s->acts[r][i];
                fits = sched_stage_rank(s, a->stage) == r;
                if (fits && !is_compute(a->op) && place != SCHED_PLACE_LOOP) {
                    int lo = peer_stage(a) < a->stage ? peer_stage(a) : a->stage;
                    fits = !local_edge(s, lo);
                }
            }
        if (fits) return place;
    }
    return SCHED_PLACE_LOOP;
}

/* read torch-style CSV: P = rows, M = largest mb + 1, V = (largest stage + 1) / P when the
   stages go beyond the rows (else 1, and any stage missing is the validator's to name) */
int sched_read_csv(FILE *f, const char *name, sched *s, char *err, size_t errlen) {
    if (s == NULL) { set_err(err, errlen, "sched_read_csv: NULL output"); return PL_EINVAL; }
    memset(s, 0, sizeof(*s));
    if (f == NULL) { set_err(err, errlen, "sched_read_csv: NULL file"); return PL_EINVAL; }
    char *line = NULL;
    size_t cap = 0;
    int rows_cap = 0, rc = 0;
    snprintf(s->name, sizeof(s->name), "%s", name ? name : "csv");
    for (;;) {
        int got = read_line(f, &line, &cap);
        if (got < 0) { set_err(err, errlen, "sched_read_csv: out of memory"); rc = PL_ENOMEM; break; }
        if (got == 0) break;
        if (s->P == rows_cap) {
            int nc = rows_cap ? rows_cap * 2 : 8;
            int *nn = realloc(s->n, (size_t)nc * sizeof(int));
            if (nn) s->n = nn;
            sched_action **na = realloc(s->acts, (size_t)nc * sizeof(sched_action *));
            if (na) s->acts = na;
            if (nn == NULL || na == NULL) {
                set_err(err, errlen, "sched_read_csv: out of memory");
                rc = PL_ENOMEM;
                break;
            }
            rows_cap = nc;
        }
        if (parse_row(line, s->P, &s->acts[s->P], &s->n[s->P], err, errlen) != 0) { rc = PL_EINVAL; break; }
        s->P++;
    }
    free(line);
    if (rc == PL_OK && ferror(f)) { set_err(err, errlen, "sched_read_csv: read error"); rc = PL_EIO; }
    if (rc == PL_OK && s->P == 0) { set_err(err, errlen, "sched_read_csv: empty file (no rows)"); rc = PL_EINVAL; }
    if (rc == PL_OK) {
        int maxmb = -1, maxst = -1;
        for (int r = 0; r < s->P; r++)
            for (int i = 0; i < s->n[r]; i++) {
                if (s->acts[r][i].mb > maxmb) maxmb = s->acts[r][i].mb;
                if (s->acts[r][i].stage > maxst) maxst = s->acts[r][i].stage;
            }
        size_t total = 0;
        for (int r = 0; r < s->P; r++) total += (size_t)s->n[r];
        /* stages beyond the rows are chunks: S = maxst + 1 stages, V = S / P per row */
        size_t S = maxst >= s->P ? (size_t)maxst + 1 : (size_t)s->P;
        if (maxmb < 0) { set_err(err, errlen, "sched_read_csv: no actions in any row"); rc = PL_EINVAL; }
        else if (S % (size_t)s->P != 0) {
            set_err(err, errlen, "sched_read_csv: stages 0..%d (%zu) on %d rows: with several chunks per rank "
                    "the stage count must be a multiple of the row count (stage s runs on row s mod %d)",
                    maxst, S, s->P, s->P);
            rc = PL_EINVAL;
        }
        /* a schedule holds an F and a B of every micro-batch on every stage: refuse an M (or S)
           that no file this size can hold before anything sizes S x M tables by it (fuzz: big-mb) */
        else if (S * ((size_t)maxmb + 1) > total) {
            if (S == (size_t)s->P)
                set_err(err, errlen, "sched_read_csv: micro-batch %d on %d rank(s) needs at least %zu actions, "
                        "the file has %zu", maxmb, s->P, (size_t)s->P * ((size_t)maxmb + 1), total);
            else
                set_err(err, errlen, "sched_read_csv: micro-batch %d on %zu stages (%d rows) needs at least %zu "
                        "actions, the file has %zu", maxmb, S, s->P, S * ((size_t)maxmb + 1), total);
            rc = PL_EINVAL;
        }
        else {
            s->M = maxmb + 1;
            s->V = (int)(S / (size_t)s->P);
            s->place = infer_place(s);
        }
    }
    if (rc != PL_OK) sched_free(s);
    return rc;
}

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
            if (!op_valid((int)a->op)) {
                set_err(err, errlen, "rank %d, action #%d: invalid op code %d", r, i, (int)a->op);
                return PL_EINVAL;
            }
            if (a->stage < 0 || a->stage >= S) {
                set_err(err, errlen, "rank %d, action #%d (%s): stage %d out of range 0..%d",
                        r, i, act_str(a, b, sizeof(b)), a->stage, S - 1);
                return PL_EINVAL;
            }
            if (a->mb < 0 || a->mb >= s->M) {
                set_err(err, errlen, "rank %d, action #%d (%s): micro-batch %d out of range 0..%d",
                        r, i, act_str(a, b, sizeof(b)), a->mb, s->M - 1);
                return PL_EINVAL;
            }
            int peer = peer_stage(a);
            if (!is_compute(a->op) && (peer < 0 || peer >= S)) {
                set_err(err, errlen, "rank %d, action #%d (%s): has no partner, stage %d is the %s stage",
                        r, i, act_str(a, b, sizeof(b)), a->stage, peer < 0 ? "first" : "last");
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
                    int t_sent = sent[msg_index(kind, peer_stage(a), a->mb, S, M)];
                    if (t_sent < 0) break; // blocked
                    if (t_sent > t) t = t_sent;
                } else if (a->op == SCHED_SEND_F || a->op == SCHED_SEND_B) {
                    int kind = a->op == SCHED_SEND_F ? 0 : 1;
                    size_t k = msg_index(kind, a->stage, a->mb, S, M);
                    if (sent[k] < 0) sent[k] = t;
                }
                int idx = out->off[r] + pc[r];
                out->start[idx] = t;
                out->end[idx] = t + op_cost(a->op);
                out->busy += op_cost(a->op);
                clock[r] = t + op_cost(a->op);
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
    set_err(err, errlen, "deadlock:");
    for (int r = 0; r < s->P; r++) {
        if (pc[r] >= s->n[r]) continue;
        const sched_action *a = &s->acts[r][pc[r]];
        sched_action want = { partner_op(a->op), peer_stage(a), a->mb };
        append_err(err, errlen, " rank %d blocked at action #%d %s (waiting for %s from rank %d);",
                   r, pc[r], act_str(a, b1, sizeof(b1)), act_str(&want, b2, sizeof(b2)), sched_stage_rank(s, want.stage));
    }
}

/* The unit-cost simulation (sched.h): allocate, play, report a deadlock or the makespan. */
int sched_simulate(const sched *s, sched_sim *out, char *err, size_t errlen) {
    if (out == NULL) { set_err(err, errlen, "sched_simulate: NULL output"); return PL_EINVAL; }
    memset(out, 0, sizeof(*out));
    if (s == NULL || s->P < 1 || s->M < 1 || s->n == NULL || s->acts == NULL) {
        set_err(err, errlen, "sched_simulate: empty or malformed schedule");
        return PL_EINVAL;
    }
    if ((long)s->P * nchunks(s) > (1L << 30)) {
        set_err(err, errlen, "sched_simulate: P=%d V=%d: too many stages", s->P, s->V);
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
    set_err(err, errlen, "sched_simulate: out of memory");
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
    int V = nchunks(s);
    for (int r = 0; r < s->P; r++)
        for (int i = 0; i < s->n[r]; i++) {
            int st = s->acts[r][i].stage, home = sched_stage_rank(s, st);
            if (home == r) continue;
            if (V == 1)
                set_err(err, errlen, "rank %d, action #%d (%s): wrong stage, rank %d runs only stage %d",
                        r, i, act_str(&s->acts[r][i], b1, sizeof(b1)), r, r);
            else if (s->place == SCHED_PLACE_LOOP)
                set_err(err, errlen, "rank %d, action #%d (%s): wrong stage, stage %d runs on rank %d (stage s "
                        "on rank s mod %d: rank %d runs stages %d, %d, ..., %d)", r, i,
                        act_str(&s->acts[r][i], b1, sizeof(b1)), st, home, s->P, r, r, r + s->P,
                        r + (V - 1) * s->P);
            else
                set_err(err, errlen, "rank %d, action #%d (%s): wrong stage, stage %d runs on rank %d (V-shaped "
                        "placement: rank %d runs stages %d and %d)", r, i, act_str(&s->acts[r][i], b1, sizeof(b1)),
                        st, home, r, sched_place_stage(s->place, s->P, r, 0), sched_place_stage(s->place, s->P, r, 1));
            return PL_EINVAL;
        }
    for (int r = 0; r < s->P; r++)
        for (int i = 0; i < s->n[r]; i++) {
            const sched_action *a = &s->acts[r][i];
            if (POS(a->stage, a->op, a->mb) >= 0) {
                set_err(err, errlen, "rank %d, action #%d (%s): duplicate of action #%d",
                        r, i, act_str(a, b1, sizeof(b1)), POS(a->stage, a->op, a->mb));
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
            if (is_compute(a->op)) continue;
            int lo = peer_stage(a) < a->stage ? peer_stage(a) : a->stage;
            if (local_edge(s, lo)) {
                set_err(err, errlen, "rank %d, action #%d (%s): stages %d and %d both run on rank %d, which hands "
                        "the %s over in memory: no SEND or RECV between them", r, i, act_str(a, b1, sizeof(b1)), lo,
                        lo + 1, r, a->op == SCHED_SEND_F || a->op == SCHED_RECV_F ? "activations" : "gradients");
                return PL_EINVAL;
            }
            sched_action want = { partner_op(a->op), peer_stage(a), a->mb };
            if (POS(want.stage, want.op, want.mb) < 0) {
                int is_send = a->op == SCHED_SEND_F || a->op == SCHED_SEND_B;
                set_err(err, errlen, "rank %d, action #%d (%s): no matching %s on the peer (%s is missing from rank %d)",
                        r, i, act_str(a, b1, sizeof(b1)), is_send ? "RECV" : "SEND",
                        act_str(&want, b2, sizeof(b2)), sched_stage_rank(s, want.stage));
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
    if (!local_edge(s, st)) return PL_OK;
    int r = sched_stage_rank(s, st), pf0 = POS(st, SCHED_F, mb), pf1 = POS(st + 1, SCHED_F, mb);
    sched_action f0 = { SCHED_F, st, mb }, f1 = { SCHED_F, st + 1, mb };
    if (pf1 >= 0 && pf1 < pf0) {
        set_err(err, errlen, "rank %d, action #%d (%s): comes before %s (action #%d); stage %d's forward input is "
                "stage %d's output on the same rank", r, pf1, act_str(&f1, b1, sizeof(b1)), act_str(&f0, b2, sizeof(b2)),
                pf0, st + 1, st);
        return PL_EINVAL;
    }
    int pb1 = POS(st + 1, SCHED_B, mb) >= 0 ? POS(st + 1, SCHED_B, mb) : POS(st + 1, SCHED_I, mb);
    int pb0 = POS(st, SCHED_B, mb) >= 0 ? POS(st, SCHED_B, mb) : POS(st, SCHED_I, mb);
    sched_action b0 = { POS(st, SCHED_B, mb) >= 0 ? SCHED_B : SCHED_I, st, mb };
    sched_action b1a = { POS(st + 1, SCHED_B, mb) >= 0 ? SCHED_B : SCHED_I, st + 1, mb };
    if (pb0 >= 0 && pb1 >= 0 && pb0 < pb1) {
        set_err(err, errlen, "rank %d, action #%d (%s): comes before %s (action #%d); stage %d's output gradient is "
                "stage %d's input gradient on the same rank", r, pb0, act_str(&b0, b1, sizeof(b1)),
                act_str(&b1a, b2, sizeof(b2)), pb1, st, st + 1);
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
        set_err(err, errlen, "rank %d: missing %s (every micro-batch needs one %s on every stage)", r,
                act_str(pf < 0 ? &f : &bw, b1, sizeof(b1)), pf < 0 ? "forward" : "backward (B, or I and W)");
        return PL_EINVAL;
    }
    if (pb >= 0 && (pi >= 0 || pw >= 0)) {
        set_err(err, errlen, "rank %d, action #%d (%s): micro-batch %d has both a B and an %s (a backward is "
                "one B, or an I and a W)", r, pb, act_str(&bw, b1, sizeof(b1)), mb, pi >= 0 ? "I" : "W");
        return PL_EINVAL;
    }
    if (pb < 0 && (pi < 0 || pw < 0)) {
        set_err(err, errlen, "rank %d: missing %s (%s of micro-batch %d has no %s)", r,
                act_str(pi < 0 ? &in : &wt, b1, sizeof(b1)), pi < 0 ? "the W" : "the I", mb,
                pi < 0 ? "input part" : "weight part");
        return PL_EINVAL;
    }
    /* the input side of the backward (B or I) */
    const sched_action *bin = pb >= 0 ? &bw : &in;
    int pin = pb >= 0 ? pb : pi;
    if (pin < pf) {
        set_err(err, errlen, "rank %d, action #%d (%s): backward before forward (%s is action #%d)",
                r, pin, act_str(bin, b1, sizeof(b1)), act_str(&f, b2, sizeof(b2)), pf);
        return PL_EINVAL;
    }
    if (pb < 0 && pw < pi) {
        set_err(err, errlen, "rank %d, action #%d (%s): weight part before its input part (%s is action #%d)",
                r, pw, act_str(&wt, b1, sizeof(b1)), act_str(&in, b2, sizeof(b2)), pi);
        return PL_EINVAL;
    }
    /* required comm actions and the compute they must precede/follow */
    int up = st > 0 && !local_edge(s, st - 1), down = st < S - 1 && !local_edge(s, st);
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
            set_err(err, errlen, "rank %d: missing %s (%s)", r, act_str(&c, b1, sizeof(b1)), req[q].what);
            return PL_EINVAL;
        }
        if (req[q].before ? pc > pcomp : pc < pcomp) {
            sched_action early = req[q].before ? *req[q].c : c, late = req[q].before ? c : *req[q].c;
            int pe = req[q].before ? pcomp : pc, pl = req[q].before ? pc : pcomp;
            set_err(err, errlen, "rank %d, action #%d (%s): wrong order, comes before %s (action #%d); %s",
                    r, pe, act_str(&early, b1, sizeof(b1)), act_str(&late, b2, sizeof(b2)), pl, req[q].what);
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
                set_err(err, errlen, "rank %d, action #%d (%s): comes before %s (action #%d); %s add to the "
                        "gradients in ascending micro-batch order%s, so that every schedule sums them as one "
                        "process does (bit-identical results)", sched_stage_rank(s, st), POS(st, op, mb),
                        act_str(&a, b1, sizeof(b1)), act_str(&prev, b2, sizeof(b2)), POS(st, pop, mb - 1),
                        k == 0 ? "backwards (B or W)" : "the last stage's forwards (they run the LM head's backward)",
                        nchunks(s) > 1 ? " on each stage" : "");
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
        set_err(err, errlen, "invalid schedule: empty");
        return PL_EINVAL;
    }
    if (s->P < 1 || s->M < 1) {
        set_err(err, errlen, "invalid schedule: P=%d M=%d (both must be >= 1)", s->P, s->M);
        return PL_EINVAL;
    }
    if ((long)s->P * nchunks(s) > (1L << 30)) {
        set_err(err, errlen, "invalid schedule: P=%d V=%d: too many stages", s->P, s->V);
        return PL_EINVAL;
    }
    /* ranges and partner existence first, so the table below is indexed in range */
    if (check_actions(s, err, errlen) != 0) return PL_EINVAL;
    size_t npos = (size_t)sched_nstages(s) * SCHED_NOPS * (size_t)s->M;
    int *pos = malloc(npos * sizeof(int));
    if (pos == NULL) { set_err(err, errlen, "sched_validate: out of memory"); return PL_ENOMEM; }
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
    if (nchunks(s) == 1) {
        int pending = 0;
        for (int i = 0; i < s->n[stage]; i++) {
            sched_op op = s->acts[stage][i].op;
            if ((op == SCHED_I || op == SCHED_B) && pending) return 1;
            if (op == SCHED_I) pending++;
            else if (op == SCHED_W) pending--;
        }
        return 0;
    }
    for (int c = 0; c < nchunks(s); c++)
        if (sched_defers_weights_stage(s, sched_place_stage(s->place, s->P, stage, c))) return 1;
    return 0;
}

/* decimal digits of a non-negative int */
static int ndigits(int v) {
    int d = 1;
    while (v >= 10) { v /= 10; d++; }
    return d;
}

/* the chunked summary: per rank its peak in-flight activations (all chunks together, then
   each chunk's peak) and its own bubble 1 - busy / makespan; the interleaved theory */
static void print_chunk_summary(const sched *s, const sched_sim *sim, FILE *out) {
    int V = nchunks(s), rw = ndigits(s->P - 1);
    for (int r = 0; r < s->P; r++) {
        long busy = 0;
        for (int i = 0; i < s->n[r]; i++) busy += sim->end[sim->off[r] + i] - sim->start[sim->off[r] + i];
        fprintf(out, "rank %*d: peak in-flight %d (stages", rw, r, sched_max_inflight(s, r));
        for (int c = 0; c < V; c++) {
            int st = sched_place_stage(s->place, s->P, r, c);
            fprintf(out, " %d:%d", st, sched_max_inflight_stage(s, st));
        }
        fprintf(out, "), bubble %.2f%%\n", sim->makespan > 0 ? 100.0 * (1.0 - (double)busy / sim->makespan) : 0.0);
    }
    double vm = (double)V * s->M;
    fprintf(out, "interleaved theory (Narayanan et al.): bubble (P-1)/(V*M) = %.2f%% of the ideal time, "
            "a fraction (P-1)/(V*M+P-1) = %.2f%% of the step%s\n", 100.0 * (s->P - 1) / vm,
            100.0 * (s->P - 1) / (vm + s->P - 1), strcmp(s->name, "interleaved-1f1b") == 0 && s->M % s->P == 0
            ? " (exact for interleaved-1f1b when P divides M)" : "");
}

/* rank x time grid from the unit-cost simulation, then a summary. A cell
   is the compute action occupying that time unit ("F3", "B3"; with chunks
   "5F3", the global stage first, as torch writes it) or '.' */
void sched_print_grid(const sched *s, FILE *out) {
    if (out == NULL) return;
    if (s == NULL) { fprintf(out, "(no schedule)\n"); return; }
    char err[512];
    sched_sim sim;
    if (sched_simulate(s, &sim, err, sizeof(err)) != 0) {
        fprintf(out, "schedule %s P=%d M=%d cannot be simulated: %s\n", s->name, s->P, s->M, err);
        return;
    }
    int T = sim.makespan, V = nchunks(s), S = sched_nstages(s);
    int sw = V > 1 ? ndigits(S - 1) : 0;            // stage digits in a chunked cell
    int cw = sw + 1 + ndigits(s->M > 0 ? s->M - 1 : 0);  // cell width: [stage] "F" + mb digits
    int rw = ndigits(s->P - 1);
    const sched_action **cell = malloc((size_t)(T ? T : 1) * sizeof(*cell));
    if (cell == NULL) { sched_sim_free(&sim); fprintf(out, "(out of memory)\n"); return; }
    for (int r = 0; r < s->P; r++) {
        for (int t = 0; t < T; t++) cell[t] = NULL;
        for (int i = 0; i < s->n[r]; i++) {
            int idx = sim.off[r] + i;
            for (int t = sim.start[idx]; t < sim.end[idx]; t++) cell[t] = &s->acts[r][i];
        }
        // every cell padded to the same width, except the last (no trailing blanks)
        fprintf(out, "rank %*d:", rw, r);
        for (int t = 0; t < T; t++) {
            int w = t < T - 1 ? cw : 1;
            if (cell[t] == NULL) fprintf(out, " %-*s", w, ".");
            else if (V == 1) fprintf(out, " %s%-*d", op_names[cell[t]->op], w > 1 ? w - 1 : 1, cell[t]->mb);
            else {
                char b[64];
                snprintf(b, sizeof b, "%d%s%d", cell[t]->stage, op_names[cell[t]->op], cell[t]->mb);
                fprintf(out, " %-*s", t < T - 1 ? cw : 1, b);
            }
        }
        fputc('\n', out);
    }
    free(cell);
    if (V == 1) {
        fprintf(out, "schedule %s: P=%d stages, M=%d micro-batches, makespan %d units (F=%d, B=%d, I=%d, W=%d, comm=0)\n",
                s->name, s->P, s->M, T, SCHED_COST_F, SCHED_COST_B, SCHED_COST_I, SCHED_COST_W);
        fprintf(out, "bubble: %.2f%% (GPipe formula (P-1)/(M+P-1) = %.2f%%)\n",
                100.0 * sim.bubble, 100.0 * (double)(s->P - 1) / (double)(s->M + s->P - 1));
        fprintf(out, "max in-flight micro-batches per stage:");
        for (int r = 0; r < s->P; r++) fprintf(out, " %d", sched_max_inflight(s, r));
        fputc('\n', out);
    } else {
        if (s->place == SCHED_PLACE_V)
            fprintf(out, "schedule %s: P=%d ranks x V=%d chunks = %d stages (V-shaped: stages r and %d-r on rank r), "
                    "M=%d micro-batches, makespan %d units (F=%d, B=%d, I=%d, W=%d per stage, comm=0)\n", s->name, s->P,
                    V, S, 2 * s->P - 1, s->M, T, SCHED_COST_F, SCHED_COST_B, SCHED_COST_I, SCHED_COST_W);
        else
            fprintf(out, "schedule %s: P=%d ranks x V=%d chunks = %d stages (stage s on rank s mod %d), M=%d "
                    "micro-batches, makespan %d units (F=%d, B=%d, I=%d, W=%d per stage, comm=0)\n", s->name, s->P,
                    V, S, s->P, s->M, T, SCHED_COST_F, SCHED_COST_B, SCHED_COST_I, SCHED_COST_W);
        fprintf(out, "bubble: %.2f%% (GPipe formula over the ranks (P-1)/(M+P-1) = %.2f%%)\n",
                100.0 * sim.bubble, 100.0 * (double)(s->P - 1) / (double)(s->M + s->P - 1));
        print_chunk_summary(s, &sim, out);
    }
    sched_sim_free(&sim);
}
