/*
 * model_tp.c — the TP sums the blocks and the head call (arch.h: model_tp_sum,
 * model_tp_host_reduce), through the hook the run installs (model_set_tp_hook): the model
 * layer stays below the parallel one, which provides the reduction.
 */
#include <stddef.h>
#include "model/arch.h"
#include "util/common.h"

static model_tp_hook tp_hook;
static model_tp_host_hook tp_host_hook;
static void *tp_hook_ctx;

/* The TP group's reductions the blocks and the head call (one group per process). */
void model_set_tp_hook(model_tp_hook fn, model_tp_host_hook host_fn, void *ctx) {
    tp_hook = fn;
    tp_host_hook = host_fn;
    tp_hook_ctx = ctx;
}

/* A partial product summed over the TP ranks, or nothing without --tp. */
int model_tp_sum(const block_dims *d, float *buf, size_t n, int phase) {
    if (d->cfg->tp <= 1) return PL_OK;
    if (!tp_hook) {
        pl_error("tensor parallelism: no TP group installed for the blocks' sums");
        return PL_EINVAL;
    }
    return tp_hook(tp_hook_ctx, buf, n, phase);
}

/* A host array reduced over the TP ranks (the vocabulary-parallel head). */
int model_tp_host_reduce(float *host, size_t n, int op) {
    if (!tp_host_hook) {
        pl_error("tensor parallelism: no TP group installed for the head's reductions");
        return PL_EINVAL;
    }
    return tp_host_hook(tp_hook_ctx, host, n, op);
}
