/*
 * prefetch.h — one step ahead: a thread reads the next batch's rows of a data source (still
 * with pread, data.h) while the current step computes. prefetch_get(k) hands over batch k if
 * the thread has read it, and starts the read of batch k + 1. A batch that was not asked for
 * ahead (the first step, after a resume), or whose read the thread has not finished (it runs
 * as SCHED_IDLE: on a busy machine it may not have run), is read at once by the caller, which
 * never waits for the thread; the time prefetch_get takes is the step's data wait. The tokens
 * are exactly data_read_rows' (the same call, earlier); a read error is reported by the
 * prefetch_get of that batch, with data.h's message.
 */
#ifndef PIPELM_PREFETCH_H
#define PIPELM_PREFETCH_H

#include <pthread.h>
#include <stddef.h>
#include "formats/data.h"

typedef struct {
    const data_source *d;
    int Bg, row0, n, T;        /* rows [row0, row0 + n) of batches of Bg sequences of T */
    int *in, *tg;              /* (n, T) the prefetched batch's inputs and targets */
    long long want, have;      /* the batch asked for ahead, the batch in the buffers (-1: none) */
    int busy, quit, rc, started;
    char err[4400];            /* the prefetched read's message when rc != PL_OK */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} data_prefetch;

/* Start the reader thread (on = 0: none; every get then reads at once). */
int prefetch_start(data_prefetch *p, const data_source *d, int Bg, int row0, int n, int T, int on, char *err,
                   size_t errlen);
/* Batch k's rows into inputs and targets (n T ints each); *wait_s: the seconds it took here. */
int prefetch_get(data_prefetch *p, long long k, int *inputs, int *targets, double *wait_s, char *err, size_t errlen);
/* Stop and join the thread, free the buffers. */
void prefetch_stop(data_prefetch *p);

#endif
