/*
 * waitsplit.c — the measured wait split into schedule, straggler, transfer and remainder
 * (src/pipeline/waitsplit.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util/common.h"
#include "pipeline/waitsplit.h"

/* The seconds of one micro-batch's F and backward (B, or I + W) on stage st. */
static double stage_work(const sched_costs *c, int st) {
    double bw = c->b[st] > 0 ? c->b[st] : c->i[st] + c->w[st];
    return c->f[st] + bw;
}

/* A copy of c's shape with every cost of stage st scaled by k[st] (k NULL: 1), messages
 * costing xfer seconds each. */
static int scaled(const sched_costs *c, const double *k, double xfer, sched_costs *out) {
    PL_TRY(sched_costs_alloc(out, c->P));
    for (int st = 0; st < c->P; st++) {
        double f = k ? k[st] : 1.0;
        out->f[st] = c->f[st] * f;
        out->b[st] = c->b[st] * f;
        out->i[st] = c->i[st] * f;
        out->w[st] = c->w[st] * f;
        out->opt[st] = c->opt[st];
        out->act[st] = c->act[st];
    }
    out->latency_s = xfer;
    out->bytes_per_s = 0;
    out->msg_bytes = 0;
    return PL_OK;
}

/* The median of n values (sorted in place). */
static double median(double *v, int n) {
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && v[b] < v[b - 1]; b--) { double t = v[b]; v[b] = v[b - 1]; v[b - 1] = t; }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* k[st]: what scales stage st's measured costs to its baseline; over[st] = 1 / k - 1. Against
 * a costs file its own work; else the median seconds per FLOP over the stages. */
static int baseline_scale(const sched_costs *meas, const sched_costs *base, const double *flops, double *k,
                          double *over) {
    int S = meas->P;
    double *r = malloc(sizeof(double) * (size_t)S);
    if (!r) return PL_ENOMEM;
    for (int st = 0; st < S; st++) r[st] = flops && flops[st] > 0 ? stage_work(meas, st) / flops[st] : 0;
    double med = 0;
    if (!base) {
        memcpy(k, r, sizeof(double) * (size_t)S);
        med = median(k, S);
    }
    for (int st = 0; st < S; st++) {
        double m = stage_work(meas, st), want = base ? stage_work(base, st) : med * (flops ? flops[st] : 0);
        k[st] = m > 0 && want > 0 ? want / m : 1.0;
        over[st] = m > 0 && want > 0 ? m / want - 1.0 : 0.0;
    }
    free(r);
    return PL_OK;
}

/* The wait of each rank in one play (seconds), into w; PL_OK or the prediction's failure. */
static int play_wait(const sched *s, const sched_costs *c, double *w, char *err, size_t errlen) {
    sched_pred pr;
    PL_TRY(sched_predict(s, c, &pr, err, errlen));
    for (int r = 0; r < s->P; r++) w[r] = pr.wait_s[r];
    sched_pred_free(&pr);
    return PL_OK;
}

/* The straggler's sentence: its stage and rank, its actions over cost, who waits how long. */
static void name_straggler(const sched *s, const sched_costs *meas, wait_split *w) {
    int st = w->worst, r0 = sched_stage_rank(s, st), off = 0, n = 0;
    const char *ops[4] = {"F", "B", "I", "W"};
    const double *v[4] = {meas->f, meas->b, meas->i, meas->w};
    char list[64] = "";
    for (int k = 0; k < 4; k++)
        if (v[k][st] > 0) n++;
    for (int k = 0, j = 0; k < 4; k++) {
        if (!(v[k][st] > 0)) continue;
        off += snprintf(list + off, sizeof list - off, "%s%s", j == 0 ? "" : j == n - 1 ? " and " : ", ", ops[k]);
        j++;
    }
    char who[256] = "";
    double total = 0;
    int wo = 0;
    for (int r = 0; r < s->P && wo < (int)sizeof who - 32; r++) { /* runs of ranks as "0-1", "3" */
        if (r == r0 || !(w->straggler_s[r] > 0)) continue;
        int e = r;
        while (e + 1 < s->P && e + 1 != r0 && w->straggler_s[e + 1] > 0) e++;
        for (int k = r; k <= e; k++) total += w->straggler_s[k];
        wo += e > r ? snprintf(who + wo, sizeof who - wo, "%s%d-%d", wo ? "," : "", r, e)
                    : snprintf(who + wo, sizeof who - wo, "%s%d", wo ? "," : "", r);
        r = e;
    }
    snprintf(w->why, sizeof w->why, "stage %d on rank %d: %s %.0f%% over cost; %s%s wait %.1f ms for it", st, r0, list,
             100.0 * w->over[st], wo ? "ranks " : "no rank", who, 1e3 * total);
}

/* The split (waitsplit.h). */
int wait_split_compute(const sched *s, const sched_costs *meas, const sched_costs *base, const double *flops,
                       double xfer_s, const double *measured_s, wait_split *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    int P = s->P, S = sched_nstages(s);
    if (meas->P != S || (base && base->P != S)) {
        snprintf(err, errlen, "wait split: costs for %d stages, the schedule has %d", base && base->P != S ? base->P
                 : meas->P, S);
        return PL_EINVAL;
    }
    out->P = P, out->S = S, out->worst = -1;
    double *all = calloc((size_t)P * 8 + (size_t)S * 2, sizeof(double));
    if (!all) return PL_ENOMEM;
    out->measured_s = all, out->sched_s = all + P, out->straggler_s = all + 2 * P, out->transfer_s = all + 3 * P;
    out->other_s = all + 4 * P;
    double *w1 = all + 5 * P, *w2 = all + 6 * P, *k = all + 8 * P;
    out->over = all + 8 * P + S;
    sched_costs b0, b1, m1;
    memset(&b0, 0, sizeof b0), memset(&b1, 0, sizeof b1), memset(&m1, 0, sizeof m1);
    int rc = baseline_scale(meas, base, flops, k, out->over);
    if (rc == PL_OK) rc = scaled(meas, k, 0.0, &b0);
    if (rc == PL_OK) rc = scaled(meas, k, xfer_s, &b1);
    if (rc == PL_OK) rc = scaled(meas, NULL, xfer_s, &m1);
    if (rc == PL_OK) rc = play_wait(s, &b0, out->sched_s, err, errlen);
    if (rc == PL_OK) rc = play_wait(s, &b1, w1, err, errlen);
    if (rc == PL_OK) rc = play_wait(s, &m1, w2, err, errlen);
    sched_costs_free(&b0), sched_costs_free(&b1), sched_costs_free(&m1);
    if (rc != PL_OK) { wait_split_free(out); return rc; }
    for (int r = 0; r < P; r++) {
        out->measured_s[r] = measured_s[r];
        out->transfer_s[r] = w1[r] > out->sched_s[r] ? w1[r] - out->sched_s[r] : 0.0;
        out->straggler_s[r] = w2[r] > w1[r] ? w2[r] - w1[r] : 0.0;
        out->other_s[r] = measured_s[r] - out->sched_s[r] - out->transfer_s[r] - out->straggler_s[r];
    }
    for (int st = 0; st < S; st++)
        if (out->over[st] > WAITSPLIT_OVER && (out->worst < 0 || out->over[st] > out->over[out->worst])) out->worst = st;
    if (out->worst >= 0) name_straggler(s, meas, out);
    return PL_OK;
}

/* Release the split's arrays. */
void wait_split_free(wait_split *w) {
    free(w->measured_s);
    memset(w, 0, sizeof *w);
}
