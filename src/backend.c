/*
 * backend.c — the backend registry: which backends this binary holds, looked up by name,
 * plus the precision names and the test-only allocation fault injection every backend's
 * alloc consults. The backends themselves live in backend_<name>.c and know nothing of
 * each other.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdlib.h>
#include <string.h>
#include "pipelm/backend.h"

#ifdef HAVE_ONEDNN
extern const backend backend_onednn;
#endif
#ifdef HAVE_CUDA
extern const backend backend_cuda;
#endif

/* NULL-terminated table of the backends built into this binary, the reference first. */
static const backend *const backends[] = {
    &backend_cpu,
#ifdef HAVE_ONEDNN
    &backend_onednn,
#endif
#ifdef HAVE_CUDA
    &backend_cuda,
#endif
    NULL,
};

/* Linear search: there are at most a handful. */
const backend *backend_find(const char *name) {
    for (int i = 0; backends[i]; i++)
        if (strcmp(backends[i]->name, name) == 0) return backends[i];
    return NULL;
}

/* Built once from the table, for messages and --help. */
const char *backend_list(void) {
    static char list[128];
    if (!list[0])
        for (int i = 0; backends[i]; i++) {
            if (i) strncat(list, ",", sizeof list - strlen(list) - 1);
            strncat(list, backends[i]->name, sizeof list - strlen(list) - 1);
        }
    return list;
}

int backend_parse_precision(const char *s, int *prec) {
    if (strcmp(s, "fp32") == 0) *prec = PL_PREC_FP32;
    else if (strcmp(s, "bf16") == 0) *prec = PL_PREC_BF16;
    else return -1;
    return 0;
}

const char *backend_precision_name(int prec) { return prec == PL_PREC_BF16 ? "bf16" : "fp32"; }

/* Allocations left before the injected failure; 0 = none armed, -1 = not read yet. */
static long fail_countdown = -1;

void backend_fail_alloc_after(long k) { fail_countdown = k > 0 ? k : 0; }

/* Called by every backend's alloc: 1 when this allocation must fail (PIPELM_FAIL_ALLOC=k
 * makes the k-th allocation of the process fail, for the failure-path tests). */
int backend_alloc_should_fail(void) {
    if (fail_countdown < 0) {
        const char *e = getenv("PIPELM_FAIL_ALLOC");
        fail_countdown = e ? atol(e) : 0;
        if (fail_countdown < 0) fail_countdown = 0;
    }
    if (fail_countdown == 0) return 0;
    return --fail_countdown == 0;
}
