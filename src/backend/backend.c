/*
 * backend.c — the backend registry: which backends this binary holds, looked up by name,
 * each completed once with the host defaults (backend.h); the backends' declared options
 * (--backend-opt) and their environment aliases; the precision names; and the test-only
 * allocation fault injection every backend's alloc consults. The backends themselves live in
 * backend_<name>.c; a host-memory one may leave ops to the CPU backend, and knows no other.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pipelm/backend.h"
#include "util/common.h"

#ifdef HAVE_ONEDNN
#include "backend/onednn/onednn_auto.h" /* backend_onednn_auto */
extern const backend backend_onednn;
#endif
#ifdef HAVE_CUDA
#include "backend/cuda/backend_cuda_load.h" /* backend_cuda_lazy: loads pipelm_cuda.so on init */
#endif

/* NULL-terminated table of the backends built into this binary, the reference first. */
static const backend *const built[] = {
    &backend_cpu,
#ifdef HAVE_ONEDNN
    &backend_onednn,
#endif
#ifdef HAVE_CUDA
    &backend_cuda_lazy,
#endif
    NULL,
};
#define NBUILT (sizeof built / sizeof built[0] - 1)

/* The registered backends (NULL-terminated): a complete table as built, else its completed
 * copy in filled[]; refusal: the last table refused, and why. */
static const backend *registry[NBUILT + 1];
static backend filled[NBUILT];
static char refusal[256];
static int registered;

/* backend_complete, counting the ops it filled in *nfilled. */
static int complete(backend *b, int *nfilled, char *err, size_t errlen) {
    *nfilled = 0;
    if (!b->name || !b->init || !b->finalize || !b->error || !b->describe || !b->set_threads || !b->get_threads) {
        snprintf(err, errlen, "backend %s: the table lacks a name, init, finalize, error, describe or thread call",
                 b->name ? b->name : "(unnamed)");
        return PL_EINVAL;
    }
    /* a device backend's decode product is its own matmul_fwd (a host-memory one takes the CPU's, as any op) */
    if (!b->matmul_decode_fwd && !b->host_memory) b->matmul_decode_fwd = b->matmul_fwd;
#define FILL_OP(op)                                                                                           \
    if (!b->op) {                                                                                             \
        if (!b->host_memory) {                                                                                \
            snprintf(err, errlen, "backend %s: op %s not provided (a device backend provides every op; only " \
                     "host-memory backends take the CPU backend's)", b->name, #op);                           \
            return PL_EINVAL;                                                                                 \
        }                                                                                                     \
        b->op = backend_cpu.op;                                                                               \
        ++*nfilled;                                                                                           \
    }
#define PL_MEM_OP(ret, name, params, args, cls) FILL_OP(name)
#define PL_COMPUTE_OP(ret, name, params, args, cls) FILL_OP(name)
#include "pipelm/backend_ops.h"
#undef FILL_OP
    return PL_OK;
}

int backend_complete(backend *b, char *err, size_t errlen) {
    int n;
    return complete(b, &n, err, errlen);
}

/* Once, on first use: complete every built table; a refused one is left out. */
static void register_all(void) {
    if (registered) return;
    registered = 1;
    int n = 0;
    for (size_t i = 0; i < NBUILT; i++) {
        int nfilled = 0;
        char err[200];
        filled[i] = *built[i];
        if (complete(&filled[i], &nfilled, err, sizeof err) != PL_OK) {
            snprintf(refusal, sizeof refusal, "%s", err);
            continue;
        }
        registry[n++] = nfilled ? &filled[i] : built[i];
    }
    registry[n] = NULL;
}

const char *backend_refusal(void) {
    register_all();
    return refusal;
}

/* Tables found by a key of their own and left out of backend_list: a built backend's variant
 * for --backend auto (config_backend names it), with the same name, so the run is reported as
 * that backend's. Completed on first use as the registry's. */
static const struct {
    const char *key;
    const backend *table;
} variants[] = {
#ifdef HAVE_ONEDNN
    {"onednn/auto", &backend_onednn_auto}, /* bf16 products only where they beat fp32 (onednn_auto.h) */
#endif
    {NULL, NULL},
};
#define NVARIANTS (sizeof variants / sizeof variants[0] - 1)
static backend variant_filled[NVARIANTS + 1];
static int variant_state[NVARIANTS + 1]; /* 0 not yet, 1 completed, -1 refused */

/* The variant keyed `name`, completed once; NULL if there is none or it was refused. */
static const backend *find_variant(const char *name) {
    for (size_t i = 0; i < NVARIANTS; i++) {
        if (strcmp(variants[i].key, name) != 0) continue;
        if (variant_state[i] == 0) {
            char err[200];
            int nfilled = 0;
            variant_filled[i] = *variants[i].table;
            variant_state[i] = complete(&variant_filled[i], &nfilled, err, sizeof err) == PL_OK ? 1 : -1;
            if (variant_state[i] < 0) snprintf(refusal, sizeof refusal, "%s", err);
        }
        return variant_state[i] > 0 ? &variant_filled[i] : NULL;
    }
    return NULL;
}

/* Linear search: there are at most a handful. */
const backend *backend_find(const char *name) {
    register_all();
    for (int i = 0; registry[i]; i++)
        if (strcmp(registry[i]->name, name) == 0) return registry[i];
    return find_variant(name);
}

/* Built once from the registry, for messages and --help. */
const char *backend_list(void) {
    static char list[128];
    register_all();
    if (!list[0])
        for (int i = 0; registry[i]; i++) {
            if (i) strncat(list, ",", sizeof list - strlen(list) - 1);
            strncat(list, registry[i]->name, sizeof list - strlen(list) - 1);
        }
    return list;
}

void backend_print_opts(FILE *out) {
    register_all();
    for (int i = 0; registry[i]; i++)
        for (const backend_opt_decl *d = registry[i]->opts; d && d->key; d++)
            fprintf(out, "    %-7s %s=%s  %s (default %s%s%s)\n", registry[i]->name, d->key,
                    d->choices ? d->choices : "VALUE", d->help, d->def, d->env ? "; alias " : "", d->env ? d->env : "");
}
