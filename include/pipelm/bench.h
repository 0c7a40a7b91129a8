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

/* What a benchmark run measured, gathered on rank 0. stage_stats holds 8 doubles per rank:
 * compute ms, MPI-wait ms, optimizer ms, step ms (per timed step), peak RSS MB, blocks,
 * measured sgemm GFLOP/s with the rank's threads, threads. */
typedef struct {
    int P, M, B, T;
    char schedule[32];
    int nsteps;
    const double *step_s;       /* nsteps wall times (rank 0) */
    double flops_per_token;     /* 6N + 6 L C T, as llm.c counts */
    double bubble_theoretical;  /* from the schedule's unit-cost simulation */
    const double *stage_stats;
} bench_result;

/* Print the table, and write JSON / CSV when the paths are non-empty. */
int bench_report(const bench_result *br, const char *json, const char *csv);

/* sgemm GFLOP/s with `threads` threads on n x n x n products. */
double bench_sgemm_gflops(int n, int threads, double seconds);
/* `pipelm bench --peak [--json FILE]`: the sgemm figures alone (rank 0). */
int bench_peak_main(int argc, char **argv, int first, MPI_Comm comm);

#endif
