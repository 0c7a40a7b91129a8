/*
 * metrics.c — JSON-lines output, flushed line by line.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include "pipelm/common.h"
#include "pipelm/files.h"
#include "pipelm/metrics.h"

int metrics_open(metrics *m, const char *path, char *err, size_t errlen) {
    m->f = NULL;
    PL_TRY(pl_check_output_file(path, "metrics file", err, errlen)); /* no FIFO: fopen would block */
    m->f = fopen(path, "w");
    if (!m->f) {
        snprintf(err, errlen, "metrics file %s: %s", path, strerror(errno));
        return PL_EIO;
    }
    return PL_OK;
}

void metrics_line(metrics *m, const char *fmt, ...) {
    if (!m || !m->f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(m->f, fmt, ap);
    va_end(ap);
    fputc('\n', m->f);
    fflush(m->f);
}

void metrics_num(char *buf, size_t len, double x) {
    if (isfinite(x)) snprintf(buf, len, "%.17g", x);
    else snprintf(buf, len, "null");
}

void metrics_close(metrics *m) {
    if (m->f) fclose(m->f);
    m->f = NULL;
}
