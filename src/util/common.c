/*
 * common.c — logging helpers shared by every module.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdarg.h>
#include <stdlib.h>
#include <unistd.h>
#include "util/common.h"

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

/* One message line, formatted whole and written with one write(2): lines from several ranks
 * reach the launcher unmixed, and a line is out before an abort can lose it. */
static void emit(const char *kind, const char *fmt, va_list ap) {
    char line[4096];
    int off = pl_rank >= 0 ? snprintf(line, sizeof line, "pipelm: rank %d: %s: ", pl_rank, kind)
                           : snprintf(line, sizeof line, "pipelm: %s: ", kind);
    int n = vsnprintf(line + off, sizeof line - off - 1, fmt, ap);
    off += n < 0 ? 0 : n;
    if (off > (int)sizeof line - 2) off = (int)sizeof line - 2;
    line[off++] = '\n';
    fflush(stderr);
    ssize_t w = write(2, line, (size_t)off);
    (void)w;
}

void pl_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emit("error", fmt, ap);
    va_end(ap);
}

void pl_note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emit("note", fmt, ap);
    va_end(ap);
}

void pl_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emit("warning", fmt, ap);
    va_end(ap);
}

double pl_now(void) { return MPI_Wtime(); }

/* MemAvailable: what the kernel says a new allocation can take without swapping; the stand-in
 * variable lets tests plant a small node. */
double pl_mem_available(const char *env) {
    const char *e = env ? getenv(env) : NULL;
    if (e && e[0]) return atof(e) * 1e6;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = -1.0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb < 0 ? -1.0 : kb * 1024.0;
}
