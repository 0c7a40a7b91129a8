/*
 * bench.h — `pipelm bench`: measured performance, never guessed.
 *
 * bench_peak measures cblas_sgemm GFLOP/s on this machine (square n x n products, repeated
 * for at least `seconds`), with one thread and with all threads; it is the denominator of
 * every MFU figure pipelm prints.
 */
#ifndef PIPELM_BENCH_H
#define PIPELM_BENCH_H

#include <stdio.h>
#include <mpi.h>

/* sgemm GFLOP/s with `threads` threads on n x n x n products. */
double bench_sgemm_gflops(int n, int threads, double seconds);
/* `pipelm bench ...` */
int bench_main(int argc, char **argv, int first, MPI_Comm comm, int *abort_needed);

#endif
