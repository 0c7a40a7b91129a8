/*
 * tune.c — the layout tuner's search (include/pipelm/tune.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "pipelm/common.h"
#include "pipelm/sched.h"
#include "pipelm/tune.h"

/* The schedules searched, with the chunks per rank each is tried with (0 ends a list). */
static const struct { const char *name; int V[3]; } searched[] = {
    {"gpipe", {1, 0, 0}},
    {"1f1b", {1, 0, 0}},
    {"zb-h1", {1, 0, 0}},
    {"interleaved-1f1b", {2, 4, 0}},
    {"interleaved-zb", {2, 4, 0}},
    {"looped-bfs", {2, 0, 0}},
    {"zb-v", {2, 0, 0}},
    {"dualpipev", {2, 0, 0}},
};
#define NSEARCHED (int)(sizeof searched / sizeof searched[0])

/* A copy of c for micro-batches k times the size measured: every action's seconds, its
 * activation bytes and the message bytes scale with the sequences a micro-batch holds (the
 * optimizer step does not). */
static int costs_scaled(const sched_costs *c, double k, sched_costs *out) {
    PL_TRY(sched_costs_alloc(out, c->P));
    for (int s = 0; s < c->P; s++) {
        out->f[s] = c->f[s] * k, out->b[s] = c->b[s] * k, out->i[s] = c->i[s] * k, out->w[s] = c->w[s] * k;
        out->act[s] = c->act[s] * k;
        out->opt[s] = c->opt[s];
    }
    out->latency_s = c->latency_s, out->bytes_per_s = c->bytes_per_s, out->msg_bytes = c->msg_bytes * k;
    return PL_OK;
}

/* Play one candidate; 1 if it was built and played (filled into t), 0 if it cannot run here. */
static int play_one(const tune_query *q, const sched_costs *c, const char *name, int V, int M, tune_cand *t) {
    int S = q->P * V;
    if (c->P != S && c->P != q->P) return 0; /* costs for another stage count */
    if (q->P < 2 && V > 1) return 0;         /* chunks need two ranks (train refuses them) */
    if (q->n_layer > 0 && S - 2 > q->n_layer) return 0; /* more stages than blocks (split_make refuses) */
    sched s;
    char err[512];
    if (sched_build_chunks(name, q->P, V, M, &s, err, sizeof err) != PL_OK) return 0;
    sched_costs cm;
    double k = q->costs_M > 0 ? (double)q->costs_M / M : 1.0;
    int ok = costs_scaled(c, k, &cm) == PL_OK;
    sched_pred pr;
    if (ok) ok = sched_predict(&s, &cm, &pr, err, sizeof err) == PL_OK;
    if (ok) {
        snprintf(t->schedule, sizeof t->schedule, "%s", name);
        t->M = M, t->V = V, t->step_s = pr.step_s, t->bubble = pr.bubble, t->peak_mem_mb = 0;
        for (int r = 0; r < q->P; r++)
            if (pr.act_peak[r] / 1048576.0 > t->peak_mem_mb) t->peak_mem_mb = pr.act_peak[r] / 1048576.0;
        sched_pred_free(&pr);
    }
    sched_costs_free(&cm);
    sched_free(&s);
    return ok;
}

/* Best first: the predicted step, then the bubble, then the memory, then the name (stable). */
static int by_step(const void *a, const void *b) {
    const tune_cand *x = a, *y = b;
    if (x->step_s != y->step_s) return x->step_s < y->step_s ? -1 : 1;
    if (x->bubble != y->bubble) return x->bubble < y->bubble ? -1 : 1;
    if (x->peak_mem_mb != y->peak_mem_mb) return x->peak_mem_mb < y->peak_mem_mb ? -1 : 1;
    int k = strcmp(x->schedule, y->schedule);
    return k ? k : x->M != y->M ? x->M - y->M : x->V - y->V;
}

/* The search (tune.h). */
int tune_search(const tune_query *q, const sched_costs *c, tune_cand **out, int *n, int *tried, char *err,
                size_t errlen) {
    *out = NULL, *n = 0, *tried = 0;
    if (q->P < 1 || q->batch < 1) {
        snprintf(err, errlen, "tune: need at least one rank and one sequence per step (P=%d, batch %d)", q->P, q->batch);
        return PL_EINVAL;
    }
    int maxM = q->max_M > 0 && q->max_M < q->batch ? q->max_M : q->batch, cap = 0;
    for (int M = 1; M <= maxM; M++) cap += q->batch % M == 0;
    tune_cand *t = malloc(sizeof *t * (size_t)cap * NSEARCHED * 3);
    if (!t) { snprintf(err, errlen, "tune: out of memory"); return PL_ENOMEM; }
    int k = 0;
    for (int M = 1; M <= maxM; M++) {
        if (q->batch % M) continue;
        for (int j = 0; j < NSEARCHED; j++)
            for (int v = 0; v < 3 && searched[j].V[v]; v++) {
                tune_cand x;
                if (!play_one(q, c, searched[j].name, searched[j].V[v], M, &x)) continue;
                (*tried)++;
                if (q->mem_cap_mb > 0 && x.peak_mem_mb > q->mem_cap_mb) continue;
                t[k++] = x;
            }
    }
    qsort(t, (size_t)k, sizeof *t, by_step);
    *out = t, *n = k;
    if (k == 0) {
        snprintf(err, errlen, "tune: no layout of the %d tried fits %.1f MB of activations per rank (costs for %d "
                 "stages, P=%d, batch %d)", *tried, q->mem_cap_mb, c->P, q->P, q->batch);
        return PL_EINVAL;
    }
    return PL_OK;
}

/* The train arguments of a candidate. */
void tune_command(const tune_cand *t, char *buf, size_t len) {
    int o = snprintf(buf, len, "--schedule %s --microbatches %d", t->schedule, t->M);
    if (t->V > 1 && o > 0 && (size_t)o < len) snprintf(buf + o, len - o, " --chunks-per-rank %d", t->V);
}

/* The JSON of the candidates (tune.h). */
void tune_write_json(FILE *f, const tune_query *q, const tune_cand *t, int n, const char *extra) {
    fprintf(f, "{\"ranks\":%d,\"batch\":%d,\"mem_cap_mb\":%.3f,\"candidates\":[", q->P, q->batch, q->mem_cap_mb);
    for (int i = 0; i < n; i++) {
        char cmd[256];
        tune_command(&t[i], cmd, sizeof cmd);
        fprintf(f, "%s\n{\"command\":\"pipelm train %s%s%s\",\"predicted_ms\":%.4f,\"bubble\":%.6f,\"peak_mem_mb\":%.4f,"
                "\"schedule\":\"%s\",\"microbatches\":%d,\"chunks_per_rank\":%d}", i ? "," : "", cmd,
                extra && extra[0] ? " " : "", extra ? extra : "", 1e3 * t[i].step_s, t[i].bubble, t[i].peak_mem_mb,
                t[i].schedule, t[i].M, t[i].V);
    }
    fprintf(f, "\n]}\n");
}
