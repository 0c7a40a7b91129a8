/*
 * split.c — stage partitioning: explicit specs and the cost-model balancer.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <float.h>
#include <stdlib.h>
#include <string.h>
#include "util/common.h"
#include "pipeline/sched.h"
#include "pipeline/split.h"

/* Embedding lookup: a gather and an add per channel, counted as 2C "flops" of work. */
static double embed_flops(const model_config *c) { return 2.0 * c->C; }

double split_stage_flops(const split *sp, const model_config *cfg, int s, int T) {
    double f = sp->blocks[s] * model_block_flops(cfg, T);
    if (s == 0) f += embed_flops(cfg);
    if (s == sp->P - 1) f += model_head_flops(cfg);
    return f;
}

size_t split_stage_params(const split *sp, const model_config *c, int s) {
    size_t n = (size_t)sp->blocks[s] * model_block_params(c);
    if (s == 0) n += model_embed_params(c);
    if (s == sp->P - 1) n += model_head_params(c, s == 0);
    return n;
}

size_t split_stage_act_bytes(const split *sp, const model_config *c, int s, int Bm, int T) {
    return model_slot_act_bytes(c, Bm, T, sp->blocks[s], s == 0, s == sp->P - 1, 0);
}

static int alloc_split(split *sp, int P) {
    sp->P = P;
    sp->blocks = calloc(P, sizeof(int));
    sp->first = calloc(P, sizeof(int));
    return sp->blocks && sp->first ? PL_OK : PL_ENOMEM;
}

long long split_exact_limit = 4000000;

/* What a stage's cost depends on: the model, the pipeline, and a scratch split whose
 * blocks[stage] is set to the count being costed (split_stage_* read only that entry). */
typedef struct {
    const model_config *cfg;
    int M, Bm, T;
    split one;
} cost_ctx;

/* Cost of stage `stage` holding n blocks: compute (forward FLOPs per token) and memory
 * (bytes: parameters with their gradients and two AdamW moments, plus the activations of the
 * micro-batches it holds at once under 1F1B, min(P - stage, M)). */
static void stage_cost(cost_ctx *x, int stage, int n, double *flops, double *bytes) {
    int P = x->one.P;
    x->one.blocks[stage] = n;
    *flops = split_stage_flops(&x->one, x->cfg, stage, x->T);
    int inflight = P - stage < x->M ? P - stage : x->M;
    *bytes = 16.0 * split_stage_params(&x->one, x->cfg, stage) +
             (double)inflight * split_stage_act_bytes(&x->one, x->cfg, stage, x->Bm, x->T);
}

/* The cost the programme minimises for stage holding n blocks: FLOPs, or memory when use_mem
 * (DBL_MAX where the FLOPs exceed flop_cap). */
static double cost_of(cost_ctx *x, int stage, int n, int use_mem, double flop_cap) {
    double f, b;
    stage_cost(x, stage, n, &f, &b);
    if (use_mem && f > flop_cap) return DBL_MAX;
    return use_mem ? b : f;
}

/* One dynamic programme over (stages, blocks): minimise the largest stage cost, where a
 * stage's cost is its FLOPs (use_mem = 0) or its memory (use_mem = 1, subject to every
 * stage's FLOPs staying within flop_cap). Middle stages hold at least one block. For each
 * (stage s, blocks l) the choice is the smallest k (blocks before stage s) that reaches the
 * minimum. Small problems (P L^2 <= split_exact_limit) try every k; larger ones use that
 * best[s-1][k] is non-decreasing in k and a stage's cost strictly increasing in its blocks,
 * so max(best[s-1][k], cost(l - k)) falls then rises in k: a binary search finds the turn,
 * O(P L log L) with the same answer. Returns DBL_MAX (and leaves sp alone) if no split is
 * feasible, -1 on out of memory. */
static double split_dp(split *sp, cost_ctx *x, int use_mem, double flop_cap) {
    int P = sp->P, L = x->cfg->L;
    int exact = (double)P * (L + 1) * (L + 1) <= (double)split_exact_limit;
    double *prev = malloc(sizeof(double) * ((size_t)L + 1)), *cur = malloc(sizeof(double) * ((size_t)L + 1));
    int *arg = malloc(sizeof(int) * ((size_t)P + 1) * ((size_t)L + 1));
    if (!prev || !cur || !arg) {
        free(prev);
        free(cur);
        free(arg);
        return -1.0;
    }
    for (int l = 0; l <= L; l++) prev[l] = DBL_MAX;
    prev[0] = 0.0;
    for (int s = 1; s <= P; s++) {
        int stage = s - 1, middle = stage > 0 && stage < P - 1;
        int *a = arg + (size_t)s * (L + 1);
        int kfirst = 0; /* the smallest k with a feasible prefix */
        while (kfirst <= L && prev[kfirst] == DBL_MAX) kfirst++;
        for (int l = 0; l <= L; l++) {
            cur[l] = DBL_MAX;
            a[l] = -1;
            if (s == P && l != L) continue;
            if (exact) {
                for (int k = 0; k <= l; k++) { /* stage takes blocks [k, l) */
                    double pv = prev[k];
                    if (pv == DBL_MAX || (middle && l - k < 1)) continue;
                    double c = cost_of(x, stage, l - k, use_mem, flop_cap);
                    if (c == DBL_MAX) continue;
                    double m = c > pv ? c : pv;
                    if (m < cur[l]) {
                        cur[l] = m;
                        a[l] = k;
                    }
                }
                continue;
            }
            int klo = kfirst, khi = middle ? l - 1 : l;
            if (klo > khi) continue;
            /* smallest k in [klo, khi] with prev[k] >= cost(l - k) (khi + 1 if none) */
            int lo = klo, hi = khi + 1;
            while (lo < hi) {
                int mid = lo + (hi - lo) / 2;
                if (prev[mid] >= cost_of(x, stage, l - mid, use_mem, flop_cap)) hi = mid;
                else lo = mid + 1;
            }
            for (int k = lo - 1; k <= lo; k++) {
                if (k < klo || k > khi || prev[k] == DBL_MAX) continue;
                double c = cost_of(x, stage, l - k, use_mem, flop_cap);
                if (c == DBL_MAX) continue;
                double m = c > prev[k] ? c : prev[k];
                if (m < cur[l]) {
                    cur[l] = m;
                    a[l] = k;
                }
            }
        }
        double *t = prev;
        prev = cur;
        cur = t;
    }
    double result = prev[L];
    int l = L;
    for (int s = P; s >= 1 && result != DBL_MAX; s--) {
        int k = arg[(size_t)s * (L + 1) + l];
        sp->blocks[s - 1] = l - k;
        l = k;
    }
    free(prev);
    free(cur);
    free(arg);
    return result;
}

/* Balance compute first; among the splits whose largest stage is that cheap, take the one
 * with the smallest largest memory footprint (the first stage holds the most micro-batches). */
static int split_auto(split *sp, const model_config *cfg, int M, int Bm, int T) {
    cost_ctx x = {cfg, M, Bm, T, {sp->P, NULL, NULL}};
    x.one.blocks = calloc((size_t)sp->P, sizeof(int));
    if (!x.one.blocks) return PL_ENOMEM;
    double fmax = split_dp(sp, &x, 0, 0.0);
    int rc = fmax < 0 ? PL_ENOMEM : fmax == DBL_MAX ? PL_EINVAL : PL_OK;
    if (rc == PL_OK) {
        double r = split_dp(sp, &x, 1, fmax * (1.0 + 1e-9));
        rc = r < 0 ? PL_ENOMEM : PL_OK; /* the FLOP-balanced split itself is feasible */
    }
    free(x.one.blocks);
    return rc;
}

int split_make(split *sp, const char *spec, const model_config *cfg, int P, int M, int Bm, int T, char *err,
               size_t errlen) {
    memset(sp, 0, sizeof *sp);
    int L = cfg->L;
    if (P < 1 || P > 1024) {
        snprintf(err, errlen, "%d stages: pipelm supports 1 to 1024", P);
        return PL_EINVAL;
    }
    if (P - 2 > L) {
        snprintf(err, errlen, "%d stages need at least %d blocks (every middle stage holds one) but "
                 "the model has n-layer=%d; run with at most %d stages (ranks x chunks per rank)", P, P - 2, L, L + 2);
        return PL_EINVAL;
    }
    if (alloc_split(sp, P) != PL_OK) {
        snprintf(err, errlen, "out of memory");
        return PL_ENOMEM;
    }
    if (strcmp(spec, "auto") == 0) {
        int rc = split_auto(sp, cfg, M, Bm, T);
        if (rc != PL_OK) {
            snprintf(err, errlen, "--split auto: %s for n-layer=%d over %d stages",
                     rc == PL_ENOMEM ? "out of memory for the split search" : "no feasible split", L, P);
            split_free(sp);
            return rc;
        }
    } else {
        int n = 0;
        long long sum = 0;
        const char *p = spec;
        for (;;) {
            /* one entry: decimal digits only (no sign, no spaces, nothing empty) */
            const char *q = p;
            while (*q >= '0' && *q <= '9') q++;
            if (q == p || (*q && *q != ',')) {
                snprintf(err, errlen, "--split '%.200s': expected 'auto' or comma-separated block counts like "
                         "4,3,5 (%s at character %d)", spec,
                         q == p && *p == '-' ? "a negative count"
                         : q == p && (*p == ',' || !*p) ? "an empty entry" : "not a number",
                         (int)(q - spec) + 1);
                goto fail;
            }
            if (q - p > 9) {
                snprintf(err, errlen, "--split '%.200s': block count %.*s is larger than the model's n-layer=%d",
                         spec, (int)(q - p), p, L);
                goto fail;
            }
            long v = strtol(p, NULL, 10);
            if (n < P) sp->blocks[n] = (int)v;
            n++;
            sum += v;
            if (!*q) break;
            p = q + 1;
        }
        if (n != P) {
            snprintf(err, errlen, "--split '%s' gives %d stages but the pipeline has %d (ranks x chunks per "
                     "rank); run with mpiexec -n %d (one chunk per rank), or give %d block counts", spec, n, P, n, P);
            goto fail;
        }
        if (sum != L) {
            snprintf(err, errlen, "--split '%.200s' adds up to %lld blocks but the model has n-layer=%d", spec, sum, L);
            goto fail;
        }
        for (int s = 1; s < P - 1; s++)
            if (sp->blocks[s] == 0) {
                snprintf(err, errlen, "--split '%s': middle stage %d holds no block (only the first "
                         "and last stage may hold 0 blocks)", spec, s);
                goto fail;
            }
    }
    for (int s = 0, f = 0; s < P; s++) {
        sp->first[s] = f;
        f += sp->blocks[s];
    }
    return PL_OK;
fail:
    split_free(sp);
    return PL_EINVAL;
}

/* Water-filling: add `left` units one at a time to the item whose cost after the addition is
 * least (the lowest index on a tie); item i costs unit * n[i] + extra[i]. With equal units
 * this minimises the largest cost over every way of adding them. */
static void water_fill(int *n, const double *extra, int count, int left, double unit) {
    for (; left > 0; left--) {
        int best = 0;
        for (int i = 1; i < count; i++)
            if (unit * (n[i] + 1) + extra[i] < unit * (n[best] + 1) + extra[best]) best = i;
        n[best]++;
    }
}

/* "auto" over P ranks x V chunks. Every block costs the same, so a rank's load is its number
 * of blocks plus the embedding (rank 0) and the head (rank P-1): first the ranks' block totals
 * minimise the busiest rank (the steady state of an interleaved schedule runs at the pace of
 * the busiest rank, not of the busiest stage), then each rank's total is spread over its
 * chunks to even out its stages (the warm-up and cool-down). A middle stage holds >= 1 block. */
static int split_auto_chunks(split *sp, const model_config *cfg, int P, int V, int place, int T) {
    int S = P * V, L = cfg->L, rc = PL_OK, hr = sched_place_rank(place, P, S - 1);
    int *nr = calloc((size_t)P, sizeof(int)), *nc = calloc((size_t)V, sizeof(int));
    double *er = calloc((size_t)P, sizeof(double)), *ec = calloc((size_t)V, sizeof(double));
    if (!nr || !nc || !er || !ec) rc = PL_ENOMEM;
    double blk = model_block_flops(cfg, T), E = embed_flops(cfg), H = model_head_flops(cfg);
    int used = 0;
    for (int r = 0; rc == PL_OK && r < P; r++) {
        for (int c = 0; c < V; c++) { /* the middle stages' one */
            int st = sched_place_stage(place, P, r, c);
            nr[r] += st > 0 && st < S - 1;
        }
        used += nr[r];
        er[r] = (r == 0 ? E : 0.0) + (r == hr ? H : 0.0);
    }
    if (rc == PL_OK && used > L) rc = PL_EINVAL;
    if (rc == PL_OK) water_fill(nr, er, P, L - used, blk);
    for (int r = 0; rc == PL_OK && r < P; r++) {
        int base = 0;
        for (int c = 0; c < V; c++) {
            int st = sched_place_stage(place, P, r, c);
            nc[c] = st > 0 && st < S - 1;
            base += nc[c];
            ec[c] = (st == 0 ? E : 0.0) + (st == S - 1 ? H : 0.0);
        }
        water_fill(nc, ec, V, nr[r] - base, blk);
        for (int c = 0; c < V; c++) sp->blocks[sched_place_stage(place, P, r, c)] = nc[c];
    }
    free(nr);
    free(nc);
    free(er);
    free(ec);
    return rc;
}

int split_make_chunks(split *sp, const char *spec, const model_config *cfg, int P, int V, int M, int Bm, int T,
                      char *err, size_t errlen) {
    return split_make_placed(sp, spec, cfg, P, V, SCHED_PLACE_LOOP, M, Bm, T, err, errlen);
}

/* The split over P ranks x V chunks placed by `place` (split.h). */
int split_make_placed(split *sp, const char *spec, const model_config *cfg, int P, int V, int place, int M, int Bm,
                      int T, char *err, size_t errlen) {
    if (V <= 1 || strcmp(spec, "auto") != 0) return split_make(sp, spec, cfg, P * (V > 1 ? V : 1), M, Bm, T, err, errlen);
    PL_TRY(split_make(sp, "auto", cfg, P * V, M, Bm, T, err, errlen)); /* the checks, and the buffers */
    int rc = split_auto_chunks(sp, cfg, P, V, place, T);
    if (rc != PL_OK) {
        snprintf(err, errlen, "--split auto: %s for n-layer=%d over %d ranks x %d chunks",
                 rc == PL_ENOMEM ? "out of memory" : "no feasible split", cfg->L, P, V);
        split_free(sp);
        return rc;
    }
    for (int s = 0, f = 0; s < sp->P; s++) {
        sp->first[s] = f;
        f += sp->blocks[s];
    }
    return PL_OK;
}

void split_free(split *sp) {
    free(sp->blocks);
    free(sp->first);
    memset(sp, 0, sizeof *sp);
}

void split_write_json(const split *sp, FILE *out) {
    fputc('[', out);
    for (int s = 0; s < sp->P; s++) fprintf(out, "%s%d", s ? "," : "", sp->blocks[s]);
    fputc(']', out);
}
