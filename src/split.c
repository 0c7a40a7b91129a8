/*
 * split.c — stage partitioning: explicit specs and the cost-model balancer.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <float.h>
#include <stdlib.h>
#include <string.h>
#include "pipelm/common.h"
#include "pipelm/split.h"

/* Embedding lookup: a gather and an add per channel, counted as 2C "flops" of work. */
static double embed_flops(const gpt2_config *c) { return 2.0 * c->C; }

double split_stage_flops(const split *sp, const gpt2_config *cfg, int s, int T) {
    double f = sp->blocks[s] * gpt2_block_flops(cfg, T);
    if (s == 0) f += embed_flops(cfg);
    if (s == sp->P - 1) f += gpt2_head_flops(cfg);
    return f;
}

size_t split_stage_params(const split *sp, const gpt2_config *c, int s) {
    size_t C = c->C, n = (size_t)sp->blocks[s] * (12 * C * C + 13 * C);
    if (s == 0) n += (size_t)c->Vp * C + (size_t)c->maxT * C;
    if (s == sp->P - 1) n += 2 * C + (s == 0 ? 0 : (size_t)c->Vp * C);
    return n;
}

size_t split_stage_act_bytes(const split *sp, const gpt2_config *c, int s, int Bm, int T) {
    size_t N = (size_t)Bm * T, C = c->C;
    size_t per_block = N * (16 * C + 4) + (size_t)Bm * c->NH * T * T;
    size_t n = N * C + (size_t)sp->blocks[s] * per_block;
    if (s == sp->P - 1) n += N * (2 * C + 2);
    return n * sizeof(float);
}

static int alloc_split(split *sp, int P) {
    sp->P = P;
    sp->blocks = calloc(P, sizeof(int));
    sp->first = calloc(P, sizeof(int));
    return sp->blocks && sp->first ? PL_OK : PL_ENOMEM;
}

/* Cost of stage `stage` holding blocks [k, l): compute (forward FLOPs per token) and memory
 * (bytes: parameters with their gradients and two AdamW moments, plus the activations of the
 * micro-batches it holds at once under 1F1B, min(P - stage, M)). */
static void stage_cost(const gpt2_config *cfg, int P, int M, int Bm, int T, int stage, int k, int l,
                       double *flops, double *bytes) {
    split one = {.P = P};
    int blocks[1024] = {0};
    one.blocks = blocks;
    blocks[stage] = l - k;
    *flops = split_stage_flops(&one, cfg, stage, T);
    int inflight = P - stage < M ? P - stage : M;
    *bytes = 16.0 * split_stage_params(&one, cfg, stage) +
             (double)inflight * split_stage_act_bytes(&one, cfg, stage, Bm, T);
}

/* One dynamic programme over (stages, blocks): minimise the largest stage cost, where a
 * stage's cost is its FLOPs (use_mem = 0) or its memory (use_mem = 1, subject to every
 * stage's FLOPs staying within flop_cap). Middle stages hold at least one block. */
static double split_dp(split *sp, const gpt2_config *cfg, int M, int Bm, int T, int use_mem, double flop_cap) {
    int P = sp->P, L = cfg->L;
    double *best = malloc(sizeof(double) * (P + 1) * (L + 1));
    int *arg = malloc(sizeof(int) * (P + 1) * (L + 1));
    for (int i = 0; i < (P + 1) * (L + 1); i++) best[i] = DBL_MAX, arg[i] = -1;
    best[0] = 0.0;
    for (int s = 1; s <= P; s++) {
        int stage = s - 1, middle = stage > 0 && stage < P - 1;
        for (int l = 0; l <= L; l++) {
            if (s == P && l != L) continue;
            for (int k = 0; k <= l; k++) { /* stage takes blocks [k, l) */
                double prev = best[(s - 1) * (L + 1) + k];
                if (prev == DBL_MAX || (middle && l - k < 1)) continue;
                double f, b;
                stage_cost(cfg, P, M, Bm, T, stage, k, l, &f, &b);
                if (use_mem && f > flop_cap) continue;
                double c = use_mem ? b : f, m = c > prev ? c : prev;
                if (m < best[s * (L + 1) + l]) {
                    best[s * (L + 1) + l] = m;
                    arg[s * (L + 1) + l] = k;
                }
            }
        }
    }
    double result = best[P * (L + 1) + L];
    int l = L;
    for (int s = P; s >= 1 && result != DBL_MAX; s--) {
        int k = arg[s * (L + 1) + l];
        sp->blocks[s - 1] = l - k;
        l = k;
    }
    free(best);
    free(arg);
    return result;
}

/* Balance compute first; among the splits whose largest stage is that cheap, take the one
 * with the smallest largest memory footprint (the first stage holds the most micro-batches). */
static void split_auto(split *sp, const gpt2_config *cfg, int M, int Bm, int T) {
    double fmax = split_dp(sp, cfg, M, Bm, T, 0, 0.0);
    split_dp(sp, cfg, M, Bm, T, 1, fmax * (1.0 + 1e-9));
}

int split_make(split *sp, const char *spec, const gpt2_config *cfg, int P, int M, int Bm, int T, char *err,
               size_t errlen) {
    memset(sp, 0, sizeof *sp);
    int L = cfg->L;
    if (P < 1 || P > 1024) {
        snprintf(err, errlen, "%d stages: pipelm supports 1 to 1024", P);
        return PL_EINVAL;
    }
    if (P - 2 > L) {
        snprintf(err, errlen, "%d stages need at least %d blocks (every middle stage holds one) but "
                 "the model has n-layer=%d; run with at most %d ranks", P, P - 2, L, L + 2);
        return PL_EINVAL;
    }
    if (alloc_split(sp, P) != PL_OK) {
        snprintf(err, errlen, "out of memory");
        return PL_ENOMEM;
    }
    if (strcmp(spec, "auto") == 0) {
        split_auto(sp, cfg, M, Bm, T);
    } else {
        int n = 0, sum = 0;
        const char *p = spec;
        while (*p) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || (*end && *end != ',')) {
                snprintf(err, errlen, "--split '%s': expected 'auto' or comma-separated block counts like 4,3,5", spec);
                goto fail;
            }
            if (v < 0) {
                snprintf(err, errlen, "--split '%s': block count %ld is negative", spec, v);
                goto fail;
            }
            if (n < P) sp->blocks[n] = (int)v;
            n++;
            sum += (int)v;
            p = *end ? end + 1 : end;
        }
        if (n != P) {
            snprintf(err, errlen, "--split '%s' gives %d stages but there are %d ranks; run with "
                     "mpiexec -n %d, or give %d block counts", spec, n, P, n, P);
            goto fail;
        }
        if (sum != L) {
            snprintf(err, errlen, "--split '%s' adds up to %d blocks but the model has n-layer=%d", spec, sum, L);
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
