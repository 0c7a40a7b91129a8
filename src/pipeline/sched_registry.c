/*
 * sched_registry.c — the named schedules (sched.h's sched_kind): one row each, and the
 * adapters that give each generator the row's signature. With one chunk a rank, the looped
 * schedules are the plain ones they generalise.
 */
#include <stdio.h>
#include <string.h>
#include "util/common.h"
#include "pipeline/sched.h"
#include "pipeline/sched_internal.h"

static int gen_gpipe(sched *s, int G) {
    (void)G;
    sched_gen_gpipe(s);
    return PL_OK;
}

static int gen_1f1b(sched *s, int G) {
    (void)G;
    sched_gen_1f1b(s);
    return PL_OK;
}

static int gen_zbh1(sched *s, int G) {
    (void)G;
    return sched_gen_zbh1(s);
}

static int gen_interleaved(sched *s, int G) {
    if (s->V == 1) return gen_1f1b(s, G);
    sched_gen_interleaved(s, G);
    return PL_OK;
}

static int gen_looped_bfs(sched *s, int G) {
    if (s->V == 1) return gen_gpipe(s, G);
    sched_gen_looped_bfs(s);
    return PL_OK;
}

static int gen_interleaved_zb(sched *s, int G) {
    return s->V == 1 ? sched_gen_zbh1(s) : sched_gen_interleaved_zb(s, G);
}

static int gen_zbv(sched *s, int G) {
    (void)G;
    return sched_gen_vshape(s, 0);
}

static int gen_dualpipev(sched *s, int G) {
    (void)G;
    return sched_gen_vshape(s, 1);
}

const sched_kind sched_kinds[] = {
    {"gpipe", SCHED_CHUNKS_ONE, gen_gpipe, "any M; holds M micro-batches per rank", {1, 0, 0}},
    {"1f1b", SCHED_CHUNKS_ONE, gen_1f1b, "any M; bubble (P-1)/(M+P-1)", {1, 0, 0}},
    {"zb-h1", SCHED_CHUNKS_ONE, gen_zbh1, "any M; 1f1b's memory, less bubble once M >= P", {1, 0, 0}},
    {"interleaved-1f1b", SCHED_CHUNKS_ANY, gen_interleaved,
     "any M (torch: M < 2P or a multiple of floor(M/P)); the bubble is (P-1)/(V*M) of the ideal exactly when P "
     "divides M, and M = 1 gains nothing over 1f1b", {2, 4, 0}},
    {"looped-bfs", SCHED_CHUNKS_ANY, gen_looped_bfs, "any M; holds V*M micro-batches per rank", {2, 0, 0}},
    {"interleaved-zb", SCHED_CHUNKS_ANY, gen_interleaved_zb,
     "any M (torch: as interleaved-1f1b); interleaved-1f1b's memory", {2, 4, 0}},
    {"zb-v", SCHED_CHUNKS_V, gen_zbv,
     "2 chunks per rank in a V; any M (zero unit-cost bubble once M >= 2P-1); 1f1b's memory", {2, 0, 0}},
    {"dualpipev", SCHED_CHUNKS_V, gen_dualpipev,
     "2 chunks per rank in a V; any M (torch: M >= 2P); F and B of two chunks paired", {2, 0, 0}},
    {NULL, 0, NULL, NULL, {0, 0, 0}},
};

const sched_kind *sched_kind_find(const char *name) {
    for (const sched_kind *k = sched_kinds; name && k->name; k++)
        if (strcmp(k->name, name) == 0) return k;
    return NULL;
}

int sched_kind_count(void) {
    int n = 0;
    while (sched_kinds[n].name) n++;
    return n;
}

void sched_kind_names(char *buf, size_t len) {
    size_t used = 0;
    if (len) buf[0] = 0;
    for (const sched_kind *k = sched_kinds; k->name && used < len; k++) {
        int n = snprintf(buf + used, len - used, "%s%s", used ? ", " : "", k->name);
        if (n < 0) break;
        used += (size_t)n;
    }
}
