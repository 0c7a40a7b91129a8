/*
 * common.c — logging helpers shared by every module.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdarg.h>
#include <stdlib.h>
#include "pipelm/common.h"

int pl_rank = -1;
FILE *pl_out = NULL;

void pl_info(const char *fmt, ...) {
    if (pl_rank > 0) return;
    FILE *out = pl_out ? pl_out : stdout;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    fflush(out);
}

void pl_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (pl_rank >= 0) fprintf(stderr, "pipelm: rank %d: error: ", pl_rank);
    else fprintf(stderr, "pipelm: error: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
}

void *pl_malloc(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) pl_error("out of memory allocating %zu bytes for %s", bytes, what);
    return p;
}

void *pl_calloc(size_t n, size_t size, const char *what) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) pl_error("out of memory allocating %zu x %zu bytes for %s", n, size, what);
    return p;
}

double pl_now(void) { return MPI_Wtime(); }
