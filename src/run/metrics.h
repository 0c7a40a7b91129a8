/*
 * metrics.h — the JSON-lines metrics file (`--metrics FILE`), written by rank 0.
 *
 * One JSON object per line, flushed as it is written so a crashed or preempted run keeps
 * every line it reached. Events: "run" (first), "step", "val", "timers", "end" (last); the
 * required keys are listed in docs/formats.md §6. A closed or never-opened metrics
 * object ignores writes, so callers need not check which rank they are on.
 *
 * The file is a diagnostic: a write that fails (a full disk, a quota) never stops training.
 * The first failure is reported once, naming the file and the error; the file is cut back to
 * its last complete line (so it stays valid JSON lines) and nothing more is written to it.
 */
#ifndef PIPELM_METRICS_H
#define PIPELM_METRICS_H

#include <stdio.h>

typedef struct {
    FILE *f;
    char path[4096];
    long good;  /* bytes up to the end of the last line written whole */
    int failed; /* a write failed: reported, nothing more is written */
} metrics;

/* Open (truncate) path for writing; PL_EIO with a message if it cannot. */
int metrics_open(metrics *m, const char *path, char *err, size_t errlen);
/* Append one line (fmt must produce one JSON object without the newline) and flush. */
void metrics_line(metrics *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* After a line written to m->f directly: flush it and count it as whole (or, if the write
 * failed, report it as metrics_line does). */
void metrics_commit(metrics *m);
/* A double as JSON: finite numbers with 17 significant digits, else null. */
void metrics_num(char *buf, size_t len, double x);
/* Close the file; a failure of the last flush or the close is reported as in metrics_line. */
void metrics_close(metrics *m);

#endif
