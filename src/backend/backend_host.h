/*
 * backend_host.h — pieces shared by the backends whose memory is host memory (cpu, onednn):
 * the aligned, zero-filled allocation with the fault injection every backend honours, the
 * bias-gradient column sum whose fixed order makes db independent of the thread count, and
 * the one failure message they share (an op the oneDNN backend takes from the CPU backend
 * reports into the same error() as its own ops).
 */
#ifndef PIPELM_BACKEND_HOST_H
#define PIPELM_BACKEND_HOST_H

#include <stddef.h>

/* 64-byte aligned and zero-filled; 0, or PL_ENOMEM with the reason in why (injected by
 * PIPELM_FAIL_ALLOC, too large, out of host memory). */
int host_alloc(void **p, size_t bytes, char *why, size_t whylen);
/* db[j] += sum_i dout[i][j] over N rows of OC columns: threads split the columns (chunks of
 * 256), each chunk sums the rows in order. */
void host_colsum(float *db, const float *dout, int N, int OC);
/* Record the message of a failed host-backend call and return code. */
int host_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The message of the last failed call of a host-memory backend ("" if none). */
const char *host_error(void);

#endif
