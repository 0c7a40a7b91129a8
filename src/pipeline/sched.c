/*
 * sched.c — pipeline schedules: building a named schedule through the registry
 * (sched_registry.c), and the inspection of a built one. The helpers every part shares and
 * the placements: sched_core.c. Generators: sched_gen.c, sched_vshape.c; text and CSV:
 * sched_csv.c; validation and simulation: sched_check.c; the grid: sched_print.c.
 */
#include "util/common.h"
#include "pipeline/sched.h"
#include "pipeline/sched_internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

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
