/*
 * metrics.h — the JSON-lines metrics file (`--metrics FILE`), written by rank 0.
 *
 * One JSON object per line, flushed as it is written so a crashed or preempted run keeps
 * every line it reached. Events: "run" (first), "step", "val", "timers", "end" (last); the
 * required keys are listed in shared/notes/formats.md §3. A closed or never-opened metrics
 * object ignores writes, so callers need not check which rank they are on.
 */
#ifndef PIPELM_METRICS_H
#define PIPELM_METRICS_H

#include <stdio.h>

typedef struct { FILE *f; } metrics;

/* Open (truncate) path for writing; PL_EIO with a message if it cannot. */
int metrics_open(metrics *m, const char *path, char *err, size_t errlen);
/* Append one line (fmt must produce one JSON object without the newline) and flush. */
void metrics_line(metrics *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A double as JSON: finite numbers with 17 significant digits, else null. */
void metrics_num(char *buf, size_t len, double x);
void metrics_close(metrics *m);

#endif
