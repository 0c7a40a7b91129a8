/*
 * sched_gen.c — the generators of the schedules with one chunk per rank or V chunks looped
 * (gpipe, 1f1b, zb-h1, interleaved-1f1b, looped-bfs, interleaved-zb): each fills a built
 * shell's per-rank action lists (sched_internal.h).
 */
#include "util/common.h"
#include "pipeline/sched.h"
#include "pipeline/sched_internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// generators

/* GPipe: all forwards in order, then all backwards in ascending order. Each
   send is issued before the next receive, so no rank waits on a peer that is
   itself waiting for this rank's pending send. */
void sched_gen_gpipe(sched *s) {
    for (int r = 0; r < s->P; r++) {
        for (int mb = 0; mb < s->M; mb++) sched_push_fwd(s, r, mb);
        for (int mb = 0; mb < s->M; mb++) sched_push_bwd(s, r, mb);
    }
}

/* 1F1B: stage r runs w = min(P-r-1, M) warm-up forwards, then alternates
   one forward and one backward until the forwards run out, then drains the
   remaining backwards. Backwards stay in ascending mb order so gradient
   accumulation order matches GPipe. In the steady state SEND_F of the new
   forward precedes RECV_B of the backward: the downstream stage needs that
   activation before it can produce the gradient we wait for. */
void sched_gen_1f1b(sched *s) {
    for (int r = 0; r < s->P; r++) {
        int w = s->P - r - 1;
        if (w > s->M) w = s->M;
        int fwd = 0, bwd = 0;
        for (; fwd < w; fwd++) sched_push_fwd(s, r, fwd);
        for (; fwd < s->M; fwd++, bwd++) {
            sched_push_fwd(s, r, fwd);
            sched_push_bwd(s, r, bwd);
        }
        for (; bwd < s->M; bwd++) sched_push_bwd(s, r, bwd);
    }
}

/* the input part of mb's backward (I) with its receive and send (none across a local edge) */
void sched_push_bwd_input(sched *s, int st, int mb) {
    if (st < sched_nstages(s) - 1 && !sched_local_edge(s, st)) sched_push(s, st, SCHED_RECV_B, mb);
    sched_push(s, st, SCHED_I, mb);
    if (st > 0 && !sched_local_edge(s, st - 1)) sched_push(s, st, SCHED_SEND_B, mb);
}

/* ZB-H1 as a list scheduler over the unit-cost model (F = I = W = 1, messages free): at
   each time unit a free rank runs, in this order of preference, the I whose gradient has
   arrived, else the next F if its input has arrived and the rank holds fewer than 1F1B's
   P - r micro-batches (the same activation memory), else its oldest pending W. The W's so
   fill the time a rank would wait, and the I's carry the gradients back at one unit per
   stage. Every choice is made when its data is there, so the list replays without waiting
   in a different order; I, W and F each run in ascending micro-batch order. */
int sched_gen_zbh1(sched *s) {
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
                sched_push_bwd_input(s, r, i);
                AT(idone, r, i) = t + 1;
                ni[r]++;
            } else if (input && f - nw[r] < P - r) {
                sched_push_fwd(s, r, f);
                AT(fdone, r, f) = t + 1;
                nf[r]++;
            } else if (nw[r] < ni[r]) {
                sched_push(s, r, SCHED_W, nw[r]++);
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
int sched_interleave_group(int P, int M) {
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

/* sched_push the k-th forward or backward of rank r in the order padded to a multiple of G,
   unless it belongs to a padding micro-batch (mb >= M) */
static void push_padded(sched *s, int G, int r, int k, int fwd) {
    int P = s->P, V = s->V, group = k / (G * V), within = k % (G * V), chunk = within / G;
    int st = (fwd ? chunk : V - 1 - chunk) * P + r, mb = group * G + within % G;
    if (mb >= s->M) return;
    if (fwd) sched_push_fwd(s, st, mb);
    else sched_push_bwd(s, st, mb);
}

/* Interleaved 1F1B (Narayanan et al. 2021; torch's ScheduleInterleaved1F1B): warm-up
   forwards in the interleaved order, then one forward and one backward in turn, then the
   remaining backwards. Messages as in 1F1B: the receive right before the compute, the send
   right after it, so a new forward's SEND_F precedes the RECV_B of the backward after it.
   Where G does not divide M the lists are those of Mp = the next multiple of G without the
   padding micro-batches: leaving whole micro-batches out of a deadlock-free schedule keeps
   it deadlock-free (any wait cycle among what is left was one in the whole). */
void sched_gen_interleaved(sched *s, int G) {
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
void sched_gen_looped_bfs(sched *s) {
    for (int r = 0; r < s->P; r++) {
        for (int c = 0; c < s->V; c++)
            for (int mb = 0; mb < s->M; mb++) sched_push_fwd(s, c * s->P + r, mb);
        for (int c = s->V - 1; c >= 0; c--)
            for (int mb = 0; mb < s->M; mb++) sched_push_bwd(s, c * s->P + r, mb);
    }
}

/* Interleaved zero bubble (torch's ScheduleInterleavedZeroBubble, ZB1P in Qi et al.) as a
   list scheduler over the unit-cost model, ZB-H1's rule on interleaved-1F1B's orders: at
   each time unit a free rank runs its next I (in interleaved-1F1B's backward order) if the
   gradient has arrived, else its next F (in the interleaved forward order) if its input has
   arrived and the rank holds fewer micro-batches than interleaved-1F1B's peak, else its
   oldest pending W (in I order, so ascending per stage). Every choice is made when its
   data is there, so the lists replay without deadlock. -1 on OOM, -2 if it stalls. */
int sched_gen_interleaved_zb(sched *s, int G) {
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
                sched_push_bwd_input(s, ist, imb);
                AT(idone, ist, imb) = t + 1;
                ni[r]++;
            } else if (input && nf[r] - nw[r] < lim) {
                sched_push_fwd(s, fst, fmb);
                AT(fdone, fst, fmb) = t + 1;
                nf[r]++;
            } else if (nw[r] < ni[r]) {
                int wst, wmb;
                interleave_op(P, V, M, G, r, nw[r]++, 0, &wst, &wmb);
                sched_push(s, wst, SCHED_W, wmb);
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
