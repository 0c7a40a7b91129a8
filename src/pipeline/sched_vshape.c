/*
 * sched_vshape.c — the V-shaped schedules (zb-v, dualpipev): two chunks per rank, stages r
 * and 2P-1-r on rank r, generated rank by rank.
 */
#include "util/common.h"
#include "pipeline/sched.h"
#include "pipeline/sched_internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

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
    if (mb < v->s->M) sched_push_fwd(v->s, v->st[c], mb);
}

/* the next input part of chunk c; queue: its W goes to the pending queue */
static void v_inp(vrank *v, int c, int queue) {
    int mb = v->ni[c]++;
    if (queue) { v->qc[v->qt] = c; v->qm[v->qt++] = mb; }
    if (mb < v->s->M) sched_push_bwd_input(v->s, v->st[c], mb);
}

/* the next full backward of chunk c (its I and W counters both move) */
static void v_bwd(vrank *v, int c) {
    int mb = v->ni[c]++;
    v->nw[c]++;
    if (mb < v->s->M) sched_push_bwd(v->s, v->st[c], mb);
}

/* the next weight part of chunk c */
static void v_wgt(vrank *v, int c) {
    int mb = v->nw[c]++;
    if (mb < v->s->M) sched_push(v->s, v->st[c], SCHED_W, mb);
}

/* the oldest pending weight part, if any */
static void v_wgt_queued(vrank *v) {
    if (v->qh == v->qt) return;
    int c = v->qc[v->qh], mb = v->qm[v->qh++];
    v->nw[c]++;
    if (mb < v->s->M) sched_push(v->s, v->st[c], SCHED_W, mb);
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
int sched_gen_vshape(sched *s, int dual) {
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
