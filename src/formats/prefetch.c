/*
 * prefetch.c — the next batch read on a thread while the step computes (prefetch.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* SCHED_IDLE */
#endif
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include "util/common.h"
#include "formats/prefetch.h"

/* The reader: waits for a batch to be asked for, reads it into the buffers. */
static void *reader(void *arg) {
    data_prefetch *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && (p->want < 0 || p->want == p->have)) pthread_cond_wait(&p->cv, &p->mu);
        if (p->quit) break;
        long long k = p->want;
        p->busy = 1;
        pthread_mutex_unlock(&p->mu);
        char err[sizeof p->err];
        int rc = data_read_rows(p->d, k, p->Bg, p->row0, p->n, p->T, p->in, p->tg, err, sizeof err);
        pthread_mutex_lock(&p->mu);
        p->rc = rc;
        if (rc != PL_OK) memcpy(p->err, err, sizeof err);
        p->have = k;
        p->busy = 0;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int prefetch_start(data_prefetch *p, const data_source *d, int Bg, int row0, int n, int T, int on, char *err,
                   size_t errlen) {
    memset(p, 0, sizeof *p);
    p->d = d, p->Bg = Bg, p->row0 = row0, p->n = n, p->T = T;
    p->want = p->have = -1;
    if (!on) return PL_OK;
    p->in = malloc(sizeof(int) * (size_t)n * T);
    p->tg = malloc(sizeof(int) * (size_t)n * T);
    if (!p->in || !p->tg) {
        free(p->in), free(p->tg);
        p->in = p->tg = NULL;
        snprintf(err, errlen, "out of memory for the prefetched batch");
        return PL_ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->th, NULL, reader, p) != 0) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
        free(p->in), free(p->tg);
        p->in = p->tg = NULL;
        snprintf(err, errlen, "starting the data prefetch thread failed");
        return PL_ENOMEM;
    }
    /* SCHED_IDLE: the reader runs on time the steps leave, and its wake-up never preempts the
     * step's thread on a busy CPU (a wait the step would see); refused, it keeps the default */
    struct sched_param sp = {0};
    pthread_setschedparam(p->th, SCHED_IDLE, &sp);
    p->started = 1;
    return PL_OK;
}

int prefetch_get(data_prefetch *p, long long k, int *inputs, int *targets, double *wait_s, char *err, size_t errlen) {
    double t0 = pl_now();
    size_t nt = (size_t)p->n * p->T;
    int rc;
    if (!p->started) {
        rc = data_read_rows(p->d, k, p->Bg, p->row0, p->n, p->T, inputs, targets, err, errlen);
        *wait_s = pl_now() - t0;
        return rc;
    }
    pthread_mutex_lock(&p->mu);
    if (p->have == k && !p->busy) { /* read ahead: the buffers are the reader's again once want moves on */
        rc = p->rc;
        if (rc == PL_OK) memcpy(inputs, p->in, nt * sizeof(int)), memcpy(targets, p->tg, nt * sizeof(int));
        else snprintf(err, errlen, "%s", p->err);
    } else { /* not asked for, not begun or not finished (a busy machine): read here, never wait for it */
        if (!p->busy) p->want = -1; /* the reader sleeps */
        pthread_mutex_unlock(&p->mu);
        rc = data_read_rows(p->d, k, p->Bg, p->row0, p->n, p->T, inputs, targets, err, errlen);
        pthread_mutex_lock(&p->mu);
    }
    p->want = k + 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    *wait_s = pl_now() - t0;
    return rc;
}

void prefetch_stop(data_prefetch *p) {
    if (p->started) {
        pthread_mutex_lock(&p->mu);
        p->quit = 1;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->th, NULL);
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
    }
    free(p->in);
    free(p->tg);
    memset(p, 0, sizeof *p);
}
