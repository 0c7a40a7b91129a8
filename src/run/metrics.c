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
#include <unistd.h>
#include "util/common.h"
#include "util/files.h"
#include "run/metrics.h"

int metrics_open(metrics *m, const char *path, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    PL_TRY(pl_open_output(path, "metrics file", &m->f, err, errlen));
    snprintf(m->path, sizeof m->path, "%s", path);
    return PL_OK;
}

/* The first failed write: say so once, cut the file back to its last whole line, stop. */
static void metrics_failed(metrics *m, int e) {
    pl_warn("metrics file %s: writing it failed: %s; it keeps its first %ld bytes (whole lines) and no more "
             "metrics are written (training goes on)", m->path, e ? strerror(e) : "write error", m->good);
    m->failed = 1;
    int fd = fileno(m->f);
    if (fd >= 0 && ftruncate(fd, (off_t)m->good) != 0) { /* nothing more to do: already reported */ }
    fclose(m->f); /* its own error is the one just reported */
    m->f = NULL;
}

void metrics_commit(metrics *m) {
    if (!m || !m->f) return;
    errno = 0;
    if (ferror(m->f) || fflush(m->f) != 0) {
        metrics_failed(m, errno);
        return;
    }
    long at = ftell(m->f);
    if (at >= 0) m->good = at;
}

void metrics_line(metrics *m, const char *fmt, ...) {
    if (!m || !m->f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(m->f, fmt, ap);
    va_end(ap);
    fputc('\n', m->f);
    metrics_commit(m);
}

void metrics_num(char *buf, size_t len, double x) {
    if (isfinite(x)) snprintf(buf, len, "%.17g", x);
    else snprintf(buf, len, "null");
}

void metrics_close(metrics *m) {
    if (!m->f) return;
    char err[4400];
    int e = 0;
    if (fflush(m->f) != 0) e = errno ? errno : EIO;
    if (e) { metrics_failed(m, e); return; }
    if (pl_close_output(m->f, m->path, "metrics file", err, sizeof err) != PL_OK) pl_warn("%s", err);
    m->f = NULL;
}
