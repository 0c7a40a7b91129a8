/*
 * backend_host.h — pieces shared by the backends whose memory is host memory (cpu, onednn):
 * the aligned, zero-filled allocation with the fault injection every backend honours, and
 * the bias-gradient column sum whose fixed order makes db independent of the thread count.
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

#endif
