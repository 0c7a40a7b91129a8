/*
 * hooks.c — the test hooks (hooks.h): the run's faults and the table of test-only
 * environment variables.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util/hooks.h"

/* Every test-only variable, with what it does (docs/testing.md copies this table). */
static const struct { const char *name, *what; } env_hooks[] = {
    {"PIPELM_FAIL_ALLOC", "k: the k-th backend allocation of the process fails"},
    {"PIPELM_CKPT_FAIL", "write|rename|kill|corrupt|before|after[:RANK]: a checkpoint save fails there"},
    {"PIPELM_CKPT_ASYNC_PIECE", "bytes per MPI-IO write of the async checkpoint writer"},
    {"PIPELM_CKPT_ASYNC_COPY_DELAY_MS", "the async writer's deferred copy starts this late"},
    {"PIPELM_DP_POLL", "N: MPI tests after each backend op during the backward (0: at the blocks' ends)"},
    {"PIPELM_DP_DEFER", "0: every replica gather is waited for at the step's end"},
    {"PIPELM_MPI_THREAD", "single|funneled|serialized|multiple: the MPI thread level asked for"},
    {"PIPELM_RANK_MEM_MB", "the memory --dp auto / --stages auto believe a rank has"},
    {"PIPELM_CKPT_ASYNC_MEM_MB", "the node's available memory for the async snapshot's check"},
    {"PIPELM_TOKENIZE_SPILL", "N: tokenize spills a rank's tokens to its file every N tokens"},
    {"PIPELM_PREFETCH", "0: training batches are read when their step needs them, not one step ahead"},
    {"PIPELM_DATA_LOG", "PREFIX: each replica's first stage appends \"step row SHARD POS\" per row read to PREFIX.<rank>"},
    {"PIPELM_ONEDNN_BF16_FAST", "0|1: the oneDNN backend's verdict whether bf16 products beat fp32, forced"},
};

void hooks_defaults(pl_hooks *h) {
    memset(h, 0, sizeof *h);
    h->fail_rank = -1;
    h->slow_rank = -1;
    snprintf(h->fail_at, sizeof h->fail_at, "during");
}

int hooks_fail_here(const pl_hooks *h, int wrank, int step, const char *where) {
    return h->fail_rank >= 0 && h->fail_rank == wrank && h->fail_step == step && strcmp(h->fail_at, where) == 0;
}

const char *hooks_env(const char *name) {
    for (size_t i = 0; i < sizeof env_hooks / sizeof env_hooks[0]; i++)
        if (strcmp(env_hooks[i].name, name) == 0) return getenv(name);
    fprintf(stderr, "pipelm: bug: %s is not a test hook of hooks.c\n", name);
    return NULL;
}
