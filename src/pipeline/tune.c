/*
 * tune.c — the layout tuner's search (src/pipeline/tune.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "util/common.h"
#include "model/model.h"
#include "pipeline/sched.h"
#include "pipeline/split.h"
#include "pipeline/tune.h"


static const char *const mode_names[TUNE_NMODES] = {"none", "selective", "full"};

/* The costs of one candidate: row s from c[mode[s]], for micro-batches k times the size
 * measured: every action's seconds, its activation bytes and the message bytes scale with the
 * sequences a micro-batch holds (the optimizer step does not). */
static int costs_mixed(const sched_costs *const c[TUNE_NMODES], const int *mode, double k, sched_costs *out) {
    const sched_costs *c0 = c[TUNE_NONE];
    PL_TRY(sched_costs_alloc(out, c0->P));
    for (int s = 0; s < c0->P; s++) {
        const sched_costs *m = c[mode[s]];
        out->f[s] = m->f[s] * k, out->b[s] = m->b[s] * k, out->i[s] = m->i[s] * k, out->w[s] = m->w[s] * k;
        out->act[s] = m->act[s] * k;
        out->opt[s] = m->opt[s];
    }
    out->latency_s = c0->latency_s, out->bytes_per_s = c0->bytes_per_s, out->msg_bytes = c0->msg_bytes * k;
    return PL_OK;
}

/* --recompute for the modes of the costs' rows: one name where they agree, else one per stage;
 * 0 when the list does not fit len. */
static int modes_text(const int *mode, int rows, char *buf, size_t len) {
    int same = 1;
    for (int s = 1; s < rows; s++) same &= mode[s] == mode[0];
    if (same) { snprintf(buf, len, "%s", mode_names[mode[0]]); return 1; }
    size_t o = 0;
    for (int s = 0; s < rows && o < len; s++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", s ? "," : "", mode_names[mode[s]]);
    return o < len;
}

/* Play schedule sc (name, V, M) with the rows' modes; 1 if played (t filled, and *top the rank
 * holding the most activations), 0 if it cannot. */
static int play_modes(const tune_query *q, const sched_costs *const c[TUNE_NMODES], const sched *sc,
                      const char *name, int V, int M, const int *mode, tune_cand *t, int *top) {
    char err[512];
    sched_costs cm;
    /* sequences per micro-batch: batch / (D M) here, batch / (dp M0) where measured */
    int D = q->D > 0 ? q->D : 1;
    double k = (q->costs_M > 0 ? (double)q->costs_M / M : 1.0) * c[TUNE_NONE]->dp / D;
    int ok = costs_mixed(c, mode, k, &cm) == PL_OK;
    sched_pred pr;
    if (ok) ok = sched_predict(sc, &cm, &pr, err, sizeof err) == PL_OK;
    if (ok) {
        snprintf(t->schedule, sizeof t->schedule, "%s", name);
        t->M = M, t->V = V, t->D = D, t->Tp = q->Tp > 1 ? q->Tp : 1, t->Cp = q->Cp > 1 ? q->Cp : 1, t->step_s = pr.step_s, t->bubble = pr.bubble, t->peak_mem_mb = 0, *top = 0;
        for (int r = 0; r < q->P; r++)
            if (pr.act_peak[r] / 1048576.0 > t->peak_mem_mb) t->peak_mem_mb = pr.act_peak[r] / 1048576.0, *top = r;
        ok = modes_text(mode, c[TUNE_NONE]->P, t->recompute, sizeof t->recompute);
        sched_pred_free(&pr);
    }
    sched_costs_free(&cm);
    return ok;
}

/* Keep t when it fits the cap (and count it tried). */
static void keep(const tune_query *q, const tune_cand *x, tune_cand *t, int *k, int *tried) {
    (*tried)++;
    if (q->mem_cap_mb > 0 && x->peak_mem_mb > q->mem_cap_mb) return;
    t[(*k)++] = *x;
}

/* The candidates of schedule sc (name, V, M) with costs c (split text sp, "" for the measured
 * one) into t[*k...]: each mode given for every stage, then, where the rows are stages and a
 * lighter mode is given, the walk from none that moves the heaviest row of the rank holding
 * the most activations to its next lighter mode until the cap is met (the first that fits is
 * kept). At most TUNE_NMODES + 1 kept; the number played in *tried. */
static void play_all(const tune_query *q, const sched_costs *const c[TUNE_NMODES], const sched *sc, const char *name,
                     int V, int M, const char *sp, tune_cand *t, int *k, int *tried) {
    int S = q->P * V, rows = c[TUNE_NONE]->P;
    int *mode = calloc((size_t)rows, sizeof *mode), top = 0, modes = 0;
    tune_cand x;
    snprintf(x.split, sizeof x.split, "%s", sp);
    for (int m = 0; mode && m < TUNE_NMODES; m++) {
        if (!c[m]) continue;
        modes++;
        for (int s = 0; s < rows; s++) mode[s] = m;
        if (play_modes(q, c, sc, name, V, M, mode, &x, &top)) keep(q, &x, t, k, tried);
    }
    if (mode && modes > 1 && rows == S && q->mem_cap_mb > 0) {
        memset(mode, 0, sizeof *mode * (size_t)rows);
        for (int step = 0; step < rows * TUNE_NMODES; step++) {
            if (!play_modes(q, c, sc, name, V, M, mode, &x, &top)) break;
            if (x.peak_mem_mb <= q->mem_cap_mb) {
                if (strchr(x.recompute, ',')) keep(q, &x, t, k, tried); /* a uniform one is kept above */
                break;
            }
            int best = -1, next = 0;
            for (int s = 0; s < rows; s++) {
                if (sched_stage_rank(sc, s) != top) continue;
                int n = mode[s] + 1;
                while (n < TUNE_NMODES && !c[n]) n++;
                if (n < TUNE_NMODES && (best < 0 || c[mode[s]]->act[s] > c[mode[best]]->act[best])) best = s, next = n;
            }
            if (best < 0) break; /* the rank over the cap has nothing lighter left */
            mode[best] = next;
        }
    }
    free(mode);
}

/* A split of S stages with n[s] blocks each (first[] filled in; the caller's arrays). */
static split split_of(int S, int *n, int *first) {
    for (int s = 0, b = 0; s < S; b += n[s], s++) first[s] = b;
    return (split){S, n, first};
}

/* The split of the model's L blocks over S stages (those in the middle at least one block) that
 * minimises the slowest stage, stage s taking speed[s] seconds per forward FLOP per token;
 * into n[]. Dynamic programming over (stage, blocks used): O(S L^2). 0 if none exists or it
 * runs out of memory. */
static int balanced_split(const model_config *cfg, int S, int T, const double *speed, int *n) {
    int L = cfg->L;
    /* the FLOPs of the embedding, one block and the head: stages of the split [0, 1, L - 1] */
    int n3[3] = {0, 1, L - 1}, f3[3];
    split s3 = split_of(3, n3, f3);
    double fe = split_stage_flops(&s3, cfg, 0, T), fb = split_stage_flops(&s3, cfg, 1, T);
    double fh = split_stage_flops(&s3, cfg, 2, T) - (L - 1) * fb;
    double *best = malloc(sizeof(double) * (size_t)S * (L + 1));
    int *pick = malloc(sizeof(int) * (size_t)S * (L + 1)), ok = best && pick && L >= S - 2;
    for (int s = 0; ok && s < S; s++)
        for (int j = 0; j <= L; j++) {
            double b = INFINITY;
            int kb = -1, lo = s > 0 && s < S - 1 ? 1 : 0;
            for (int k = lo; k <= j; k++) {
                double prev = s ? best[(size_t)(s - 1) * (L + 1) + (j - k)] : (j == k ? 0.0 : INFINITY);
                double mine = speed[s] * ((s == 0 ? fe : 0.0) + k * fb + (s == S - 1 ? fh : 0.0));
                double v = prev > mine ? prev : mine;
                if (v < b) b = v, kb = k;
            }
            best[(size_t)s * (L + 1) + j] = b, pick[(size_t)s * (L + 1) + j] = kb;
        }
    ok = ok && isfinite(best[(size_t)(S - 1) * (L + 1) + L]);
    for (int s = S - 1, j = L; ok && s >= 0; s--) {
        n[s] = pick[(size_t)s * (L + 1) + j];
        j -= n[s];
    }
    free(best);
    free(pick);
    return ok;
}

/* The costs c0 (measured with blocks c0->blocks) re-split as n: each row's actions scaled by
 * its FLOP ratio, its activation bytes by the activation ratio, its optimizer step by the
 * parameter ratio. */
static int costs_resplit(const tune_query *q, const sched_costs *c0, int *n, sched_costs *out) {
    int S = c0->P;
    int *f0 = malloc(sizeof(int) * (size_t)S), *f1 = malloc(sizeof(int) * (size_t)S);
    int rc = f0 && f1 ? sched_costs_alloc(out, S) : PL_ENOMEM;
    if (rc == PL_OK) {
        split a = split_of(S, c0->blocks, f0), b = split_of(S, n, f1);
        for (int s = 0; s < S; s++) {
            double r = split_stage_flops(&b, q->cfg, s, q->T) / split_stage_flops(&a, q->cfg, s, q->T);
            double ra = (double)split_stage_act_bytes(&b, q->cfg, s, 1, q->T) /
                        (double)split_stage_act_bytes(&a, q->cfg, s, 1, q->T);
            double ro = (double)split_stage_params(&b, q->cfg, s) / (double)split_stage_params(&a, q->cfg, s);
            out->f[s] = c0->f[s] * r, out->b[s] = c0->b[s] * r, out->i[s] = c0->i[s] * r, out->w[s] = c0->w[s] * r;
            out->act[s] = c0->act[s] * (isfinite(ra) ? ra : 1.0), out->opt[s] = c0->opt[s] * (isfinite(ro) ? ro : 1.0);
            out->blocks[s] = n[s];
        }
        out->latency_s = c0->latency_s, out->bytes_per_s = c0->bytes_per_s, out->msg_bytes = c0->msg_bytes;
    }
    free(f0);
    free(f1);
    return rc;
}

/* Whether the split of stage costs c can be searched for q: rows per stage, every block count
 * known and summing to the model's L, every stage with FLOPs measured. */
static int can_resplit(const tune_query *q, const sched_costs *c, int S) {
    if (!q->cfg || q->T < 1 || c->P != S || !c->blocks) return 0;
    int sum = 0;
    for (int s = 0; s < S; s++) {
        if (c->blocks[s] < 0 || c->f[s] + c->b[s] <= 0) return 0;
        sum += c->blocks[s];
    }
    return sum == q->cfg->L;
}

/* Seconds of the gradient all-reduce of a stage with params parameters over D replicas: a
 * ring, 2 (D-1)/D of the fp32 gradients at the measured bandwidth and 2 (D-1) latencies. */
static double allreduce_s(const sched_costs *c, double params, int D) {
    if (D <= 1 || c->bytes_per_s <= 0) return 0.0;
    return 2.0 * (D - 1) / D * params * sizeof(float) / c->bytes_per_s + 2.0 * (D - 1) * c->latency_s;
}

/* The costs c (measured with c->blocks blocks per stage and c->dp replicas) for P stages and D
 * replicas, per micro-batch of the measured size (play_modes scales that): the same P keeps
 * the rows (each stage's own speed); another P is split "auto" and each stage costs its FLOPs
 * at the stages' mean measured speed, F, I and W in the measured proportions, its activations
 * at the measured bytes per estimated byte. The optimizer step: the measured one less its
 * modelled all-reduce over c->dp, per parameter, plus the all-reduce over D. PL_EINVAL when
 * the model or the blocks per stage are not known. */
static int costs_for_layout(const tune_query *q, const sched_costs *c, int P, int D, sched_costs *out) {
    if (!can_resplit(q, c, c->P)) return PL_EINVAL;
    int S0 = c->P, *f0 = malloc(sizeof(int) * (size_t)S0);
    if (!f0) return PL_ENOMEM;
    split a = split_of(S0, c->blocks, f0), b;
    double fl = 0, fb = 0, ff = 0, fi = 0, fw = 0, act = 0, acte = 0, opt = 0, par = 0;
    for (int s = 0; s < S0; s++) {
        double ps = (double)split_stage_params(&a, q->cfg, s);
        fl += split_stage_flops(&a, q->cfg, s, q->T), ff += c->f[s], fb += c->b[s], fi += c->i[s], fw += c->w[s];
        act += c->act[s], acte += (double)split_stage_act_bytes(&a, q->cfg, s, 1, q->T);
        opt += fmax(0.0, c->opt[s] - allreduce_s(c, ps, c->dp)), par += ps;
    }
    char err[256];
    int rc = P == S0 ? PL_OK : split_make(&b, "auto", q->cfg, P, q->costs_M > 0 ? q->costs_M : 1, 1, q->T, err, sizeof err);
    if (rc == PL_OK) rc = sched_costs_alloc(out, P);
    if (rc == PL_OK) {
        double speed = (ff + fb) / fl, opp = par > 0 ? opt / par : 0.0, ra = acte > 0 ? act / acte : 0.0;
        for (int s = 0; s < P; s++) {
            const split *sp = P == S0 ? &a : &b;
            double ps = (double)split_stage_params(sp, q->cfg, s);
            if (P == S0) {
                out->f[s] = c->f[s], out->b[s] = c->b[s], out->i[s] = c->i[s], out->w[s] = c->w[s];
                out->act[s] = c->act[s];
                out->opt[s] = fmax(0.0, c->opt[s] - allreduce_s(c, ps, c->dp)) + allreduce_s(c, ps, D);
            } else {
                double work = speed * split_stage_flops(sp, q->cfg, s, q->T);
                out->f[s] = work * ff / (ff + fb), out->b[s] = work * fb / (ff + fb);
                out->i[s] = fb > 0 ? out->b[s] * fi / fb : 0.0, out->w[s] = fb > 0 ? out->b[s] * fw / fb : 0.0;
                out->act[s] = ra * (double)split_stage_act_bytes(sp, q->cfg, s, 1, q->T);
                out->opt[s] = opp * ps + allreduce_s(c, ps, D);
            }
            out->blocks[s] = sp->blocks[s];
        }
        out->latency_s = c->latency_s, out->bytes_per_s = c->bytes_per_s, out->msg_bytes = c->msg_bytes;
        out->dp = c->dp;
    }
    if (P != S0 && b.blocks) split_free(&b); /* split_make zeroes it first */
    free(f0);
    return rc == PL_ENOMEM ? PL_ENOMEM : rc == PL_OK ? PL_OK : PL_EINVAL;
}

/* Every candidate of one layout (name, V, M) into t[*k...]: with the measured split (play_all),
 * and where can_resplit, with the split that rebalances the measured speeds. */
static void play_layout(const tune_query *q, const sched_costs *const c[TUNE_NMODES], const char *name, int V, int M,
                        tune_cand *t, int *k, int *tried) {
    int S = q->P * V, rows = c[TUNE_NONE]->P;
    if (rows != S && rows != q->P) return;                /* costs for another stage count */
    if (q->P < 2 && V > 1) return;                        /* chunks need two ranks (train refuses them) */
    if (q->n_layer > 0 && S - 2 > q->n_layer) return;     /* more stages than blocks (split_make refuses) */
    sched sc;
    char err[512];
    if (sched_build_chunks(name, q->P, V, M, &sc, err, sizeof err) != PL_OK) return;
    play_all(q, c, &sc, name, V, M, "", t, k, tried);
    const sched_costs *c0 = c[TUNE_NONE];
    int *n = can_resplit(q, c0, S) ? malloc(sizeof(int) * (size_t)S) : NULL;
    double *speed = n ? malloc(sizeof(double) * (size_t)S) : NULL;
    int *f0 = speed ? malloc(sizeof(int) * (size_t)S) : NULL, same = 1;
    if (f0) {
        split a = split_of(S, c0->blocks, f0);
        for (int s = 0; s < S; s++) speed[s] = (c0->f[s] + c0->b[s]) / split_stage_flops(&a, q->cfg, s, q->T);
    }
    if (f0 && balanced_split(q->cfg, S, q->T, speed, n)) {
        for (int s = 0; s < S; s++) same &= n[s] == c0->blocks[s];
        sched_costs cm[TUNE_NMODES];
        const sched_costs *cp[TUNE_NMODES] = {NULL, NULL, NULL};
        int ok = !same;
        for (int m = 0; ok && m < TUNE_NMODES; m++)
            if (c[m]) {
                ok = costs_resplit(q, c[m], n, &cm[m]) == PL_OK;
                if (ok) cp[m] = &cm[m];
            }
        char sp[512];
        size_t o = 0;
        for (int s = 0; s < S && o < sizeof sp; s++) o += (size_t)snprintf(sp + o, sizeof sp - o, "%s%d", s ? "," : "", n[s]);
        if (ok && o < sizeof sp) play_all(q, cp, &sc, name, V, M, sp, t, k, tried);
        for (int m = 0; m < TUNE_NMODES; m++)
            if (cp[m]) sched_costs_free(&cm[m]);
    }
    free(n);
    free(speed);
    free(f0);
    sched_free(&sc);
}

/* Best first: the predicted step, then the bubble, then the memory, then the name (stable). */
static int by_step(const void *a, const void *b) {
    const tune_cand *x = a, *y = b;
    if (x->step_s != y->step_s) return x->step_s < y->step_s ? -1 : 1;
    if (x->bubble != y->bubble) return x->bubble < y->bubble ? -1 : 1;
    if (x->peak_mem_mb != y->peak_mem_mb) return x->peak_mem_mb < y->peak_mem_mb ? -1 : 1;
    int k = strcmp(x->schedule, y->schedule);
    if (k == 0) k = x->Tp != y->Tp ? x->Tp - y->Tp : x->Cp != y->Cp ? x->Cp - y->Cp : x->D != y->D ? x->D - y->D : x->M != y->M ? x->M - y->M : x->V != y->V ? x->V - y->V
                  : strcmp(x->recompute, y->recompute);
    return k ? k : strcmp(x->split, y->split);
}

/* The search (tune.h). */
/* Whether C CP ranks a stage are searched for replicas D and TP Tc: without --ranks only the
 * costs' own C; with them (and a model) every C whose 2C divides the sequence, without TP, that
 * divides the ranks left (C = 1 always, unless the costs were measured at cp > 1). */
static int cp_fits(const tune_query *q, const sched_costs *c, int D, int Tc, int C) {
    int C0 = c->cp > 1 ? c->cp : 1, W = q->ranks > 0 ? q->ranks : 1;
    if (C0 > 1) return Tc == 1 && C == (q->ranks > 0 ? C0 : 1) && (q->ranks <= 0 || (W / D) % C == 0);
    if (C == 1) return 1;
    return q->ranks > 0 && q->cfg && Tc == 1 && q->T > 0 && q->T % (2 * C) == 0 && (W / D) % C == 0;
}

/* Costs measured at cp 1 made one of C CP ranks' (sched_costs_cp), from the model's widths. */
static int cp_costs(const tune_query *q, sched_costs *c, int C, char *err, size_t errlen) {
    const model_config *m = q->cfg;
    int HS = m->NH ? m->C / m->NH : 0, NKV = m->NKV > 0 ? m->NKV : m->NH;
    double qkv = m->C ? (double)(m->NH + 2 * NKV) * HS / m->C : 3.0, kv = m->C ? 2.0 * NKV * HS / m->C : 2.0;
    double ex;
    return sched_costs_cp(c, C, qkv, kv, &ex, err, errlen);
}

/* Play every candidate of the layout D replicas x T TP x C CP ranks (tune_search's grid). */
static int play_grid(const tune_query *q, const sched_costs *const c[TUNE_NMODES], int D, int T, int C, tune_cand *t,
                     int *k, int *tried, char *err, size_t errlen) {
    int T0 = c[TUNE_NONE]->tp > 1 ? c[TUNE_NONE]->tp : 1, rc = PL_OK;
    int Tc = T0 > 1 ? T0 : T, C0 = c[TUNE_NONE]->cp > 1 ? c[TUNE_NONE]->cp : 1, Cc = C0 > 1 ? C0 : C;
    if (!cp_fits(q, c[TUNE_NONE], D, Tc, C)) return PL_OK;
    tune_query qd = *q;
    qd.D = D, qd.Tp = Tc, qd.Cp = Cc, qd.batch = q->batch / D;
    qd.P = q->ranks > 0 ? q->ranks / (D * Tc * Cc) : q->P;
    sched_costs cm[TUNE_NMODES];
    const sched_costs *cd[TUNE_NMODES] = {c[0], c[1], c[2]};
    int own = q->ranks > 0 && (qd.P != c[TUNE_NONE]->P || D != c[TUNE_NONE]->dp || (T > 1 && T0 == 1) ||
                               Cc != C0), ok = 1;
    for (int m = 0; own && m < TUNE_NMODES; m++) cd[m] = NULL; /* only what is made below is freed */
    for (int m = 0; own && m < TUNE_NMODES; m++) {
        if (!c[m]) continue;
        int r = costs_for_layout(q, c[m], qd.P, D * Cc, &cm[m]); /* --cp: D C ranks sum the gradients */
        if (r == PL_ENOMEM) rc = r;
        if (r != PL_OK) { ok = 0; break; }
        cd[m] = &cm[m];
        if (T > 1 && T0 == 1) { /* one rank of T: its actions, parameters and sliced activations */
            double ar;
            r = sched_costs_tp(&cm[m], T, &ar, err, errlen);
            if (r != PL_OK) { ok = 0; break; }
            for (int s = 0; s < cm[m].P; s++) cm[m].opt[s] /= T, cm[m].act[s] *= (10.0 + 24.0 / T) / 34.0;
        }
        if (C > 1 && C0 == 1 && (r = cp_costs(q, &cm[m], C, err, errlen)) != PL_OK) { ok = 0; break; }
    }
    int mq = qd.max_M > 0 && qd.max_M < qd.batch ? qd.max_M : qd.batch;
    for (int M = 1; ok && M <= mq; M++) {
        if (qd.batch % M) continue;
        for (const sched_kind *j = sched_kinds; j->name; j++)
            for (int v = 0; v < 3 && j->tune_V[v]; v++)
                play_layout(&qd, cd, j->name, j->tune_V[v], M, t, k, tried);
    }
    for (int m = 0; own && m < TUNE_NMODES; m++)
        if (cd[m]) sched_costs_free(&cm[m]);
    return rc;
}

int tune_search(const tune_query *q, const sched_costs *const c[TUNE_NMODES], tune_cand **out, int *n, int *tried, char *err,
                size_t errlen) {
    *out = NULL, *n = 0, *tried = 0;
    if (q->P < 1 || q->batch < 1) {
        snprintf(err, errlen, "tune: need at least one rank and one sequence per step (P=%d, batch %d)", q->P, q->batch);
        return PL_EINVAL;
    }
    int maxM = q->max_M > 0 && q->max_M < q->batch ? q->max_M : q->batch, cap = 0;
    for (int M = 1; M <= maxM; M++) cap += q->batch % M == 0;
    if (!c[TUNE_NONE]) {
        snprintf(err, errlen, "tune: costs measured without recompute are required");
        return PL_EINVAL;
    }
    for (int m = 1; m < TUNE_NMODES; m++)
        if (c[m] && c[m]->P != c[TUNE_NONE]->P) {
            snprintf(err, errlen, "tune: the costs measured with --recompute %s hold %d stages, those without %d: "
                     "measure both with the same layout", mode_names[m], c[m]->P, c[TUNE_NONE]->P);
            return PL_EINVAL;
        }
    int W = q->ranks > 0 ? q->ranks : 1, nDT = 0, T0 = c[TUNE_NONE]->tp > 1 ? c[TUNE_NONE]->tp : 1;
    for (int D = 1; D <= W; D++)
        for (int T = 1; W % D == 0 && T <= W / D; T++) nDT += (W / D) % T == 0 ? 1 + W / D : 0; /* and each C */
    tune_cand *t = malloc(sizeof *t * (size_t)cap * nDT * sched_kind_count() * 3 * 2 * (TUNE_NMODES + 1));
    if (!t) { snprintf(err, errlen, "tune: out of memory"); return PL_ENOMEM; }
    int k = 0, rc = PL_OK;
    for (int D = 1; rc == PL_OK && D <= W; D++) {
        if (q->ranks > 0 && (q->ranks % D || q->batch % D)) continue;
        for (int T = 1; rc == PL_OK && T <= W / D; T++) {
            /* T: with --ranks, each that divides the ranks left and the model (costs measured
             * at tp T0 > 1: that T0 only); without, the costs' own T0 */
            if (T0 > 1 ? T != (q->ranks > 0 ? T0 : 1) : T > 1 && !q->cfg) continue;
            if ((W / D) % T || (T > 1 && T0 == 1 && model_tp_check(q->cfg, T, err, errlen) != PL_OK)) continue;
            /* C: with --ranks and a model, each whose 2C divides the sequence (no TP); else the
             * costs' own */
            for (int C = 1; rc == PL_OK && C <= W / D / T; C++) rc = play_grid(q, c, D, T, C, t, &k, tried, err, errlen);
        }
    }
    if (rc != PL_OK) { free(t); snprintf(err, errlen, "tune: out of memory"); return rc; }
    qsort(t, (size_t)k, sizeof *t, by_step);
    *out = t, *n = k;
    if (k == 0 && *tried == 0 && c[TUNE_NONE]->P != q->P) { /* nothing played: the costs are another layout's */
        snprintf(err, errlen, "tune: the costs file holds %d stages but --stages is %d: no layout could be played "
                 "(measure the costs on %d stages, or search with --ranks and a model whose costs name each "
                 "stage's blocks)", c[TUNE_NONE]->P, q->P, q->P);
        return PL_EINVAL;
    }
    if (k == 0) {
        snprintf(err, errlen, "tune: no layout of the %d tried fits %.1f MB of activations per rank (costs for %d "
                 "stages, P=%d, batch %d)", *tried, q->mem_cap_mb, c[TUNE_NONE]->P, q->P, q->batch);
        return PL_EINVAL;
    }
    return PL_OK;
}

/* The train arguments of a candidate. */
void tune_command(const tune_cand *t, char *buf, size_t len) {
    int o = snprintf(buf, len, "--schedule %s --microbatches %d", t->schedule, t->M);
    if (t->Tp > 1 && o > 0 && (size_t)o < len) o += snprintf(buf + o, len - o, " --tp %d", t->Tp);
    if (t->Cp > 1 && o > 0 && (size_t)o < len) o += snprintf(buf + o, len - o, " --cp %d", t->Cp);
    if (t->D > 1 && o > 0 && (size_t)o < len) o += snprintf(buf + o, len - o, " --dp %d", t->D);
    if (t->V > 1 && o > 0 && (size_t)o < len) o += snprintf(buf + o, len - o, " --chunks-per-rank %d", t->V);
    if (t->recompute[0] && strcmp(t->recompute, "none") && o > 0 && (size_t)o < len)
        o += snprintf(buf + o, len - o, " --recompute %s", t->recompute);
    if (t->split[0] && o > 0 && (size_t)o < len) snprintf(buf + o, len - o, " --split %s", t->split);
}

/* The JSON of the candidates (tune.h). */
void tune_write_json(FILE *f, const tune_query *q, const tune_cand *t, int n, const char *extra) {
    fprintf(f, "{\"ranks\":%d,\"batch\":%d,\"mem_cap_mb\":%.3f,\"candidates\":[", q->P, q->batch, q->mem_cap_mb);
    for (int i = 0; i < n; i++) {
        char cmd[256];
        tune_command(&t[i], cmd, sizeof cmd);
        fprintf(f, "%s\n{\"command\":\"pipelm train %s%s%s\",\"predicted_ms\":%.4f,\"bubble\":%.6f,\"peak_mem_mb\":%.4f,"
                "\"schedule\":\"%s\",\"microbatches\":%d,\"chunks_per_rank\":%d,\"recompute\":\"%s\",\"split\":\"%s\","
                "\"dp\":%d,\"tp\":%d,\"cp\":%d}", i ? "," : "", cmd,
                extra && extra[0] ? " " : "", extra ? extra : "", 1e3 * t[i].step_s, t[i].bubble, t[i].peak_mem_mb,
                t[i].schedule, t[i].M, t[i].V, t[i].recompute[0] ? t[i].recompute : "none", t[i].split,
                t[i].D > 0 ? t[i].D : 1, t[i].Tp > 0 ? t[i].Tp : 1, t[i].Cp > 0 ? t[i].Cp : 1);
    }
    fprintf(f, "\n]}\n");
}
