/*
 * backend_host.c — what the host-memory backends share (backend_host.h).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pipelm/backend.h"
#include "backend/backend_host.h"
#include "util/common.h"

int host_alloc(void **p, size_t bytes, char *why, size_t whylen) {
    *p = NULL;
    if (backend_alloc_should_fail()) {
        snprintf(why, whylen, "allocation of %zu bytes failed (injected by PIPELM_FAIL_ALLOC)", bytes);
        return PL_ENOMEM;
    }
    if (bytes == 0) bytes = 64;
    if (bytes > SIZE_MAX - 64) {
        snprintf(why, whylen, "allocation of %zu bytes: too large", bytes);
        return PL_ENOMEM;
    }
    size_t rounded = (bytes + 63) / 64 * 64;
    *p = aligned_alloc(64, rounded);
    if (!*p) {
        snprintf(why, whylen, "out of host memory allocating %zu bytes", bytes);
        return PL_ENOMEM;
    }
    memset(*p, 0, rounded);
    return 0;
}

void host_colsum(float *db, const float *dout, int N, int OC) {
    int nchunk = (OC + 255) / 256;
    #pragma omp parallel for schedule(static)
    for (int k = 0; k < nchunk; k++) {
        int j0 = k * 256, j1 = j0 + 256 < OC ? j0 + 256 : OC;
        for (int i = 0; i < N; i++) {
            const float *d = dout + (size_t)i * OC;
            for (int j = j0; j < j1; j++) db[j] += d[j];
        }
    }
}

/* The one message buffer of the host-memory backends. */
static char host_errbuf[512];

int host_fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(host_errbuf, sizeof host_errbuf, fmt, ap);
    va_end(ap);
    return code;
}

const char *host_error(void) { return host_errbuf; }
