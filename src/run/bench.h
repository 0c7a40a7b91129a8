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
 * the measured matmul peak GFLOP/s with the rank's threads (sgemm on the cpu backend, the backend's own in its precision otherwise), threads. */
/* Figures per stage rank in bench_result.stage_stats: compute, wait, optimizer and step ms,
 * peak RSS MB, blocks, peak GFLOP/s, threads, data-parallel reduction wait ms, AdamW state MB,
 * micro-batches held at most (measured by the engine), the schedule's bound for the rank
 * (sched_max_inflight), the activation MB held at most (measured); data parallelism: the
 * gradient MB whose reduction the backward had not finished, the ZeRO-1 parameter all-gather
 * ms (per step); tensor parallelism: the ms per step inside the TP all-reduces (tp.h); a MoE
 * model: the ms per step inside the EP all-to-alls and the part of them the compute did not
 * hide (ep.h), the tokens per expert max / mean (the mean over layers and micro-batches) and
 * the dropped assignments per step; context parallelism: the ms per step waiting in the CP
 * exchanges of keys, values and their gradients, and in the CP attention in all (exchanges
 * included; cp.h). */
#define BENCH_NSTAT 22

typedef struct {
    int P, M, B, T;             /* pipeline ranks, micro-batches per replica, global batch, sequence */
    int V;                      /* chunks per rank (P V stages); 0 is read as 1 */
    int D, zero;                /* data-parallel replicas (1: none), ZeRO-1 on */
    int Tp;                     /* tensor-parallel ranks per stage (0 or 1: none); stage_stats are TP rank 0's */
    int moe, ep;                /* a mixture-of-experts model; its expert-parallel ranks (0 or 1: none) */
    int Cp;                     /* context-parallel ranks per stage (0 or 1: none); stage_stats are CP rank 0's */
    char schedule[32];
    int nsteps;
    const double *step_s;       /* nsteps wall times (rank 0) */
    double flops_per_token;     /* 6N + 6 L C T, as llm.c counts */
    double bubble_theoretical;  /* from the schedule's unit-cost simulation */
    const double *stage_stats;  /* BENCH_NSTAT per stage (replica 0's ranks) */
    const char *peak_what;      /* what the peak column measured ("sgemm", "onednn bf16 matmul"); NULL: sgemm */
    const char *extra_json;     /* more "key":value members for --json (the wait split), or NULL */
} bench_result;

/* What a caller (pipelm tune --verify) takes from a benchmark without reading its JSON. */
typedef struct {
    double step_ms_median, step_ms_min, step_ms_max; /* the timed steps' wall time */
    double tokens_per_s, mfu, bubble;                /* as the table prints them */
} bench_summary;

/* Print the table, and write JSON / CSV when the paths are non-empty; fill *out when not
 * NULL. */
int bench_report(const bench_result *br, const char *json, const char *csv, bench_summary *out);

/* sgemm GFLOP/s with `threads` threads on n x n x n products. */
double bench_sgemm_gflops(int n, int threads, double seconds);
/* GFLOP/s of an n x n x n product through backend_name's matmul_fwd in precision (PL_PREC_*)
 * with `threads` threads; negative when that backend or precision is unavailable here (the
 * reason printed by the peak report). (Re)initialises that backend with precision and threads. */
double bench_matmul_gflops(const char *backend_name, int precision, int n, int threads, double seconds);
/* `pipelm bench --peak [--json FILE] [--threads N]`: the sgemm figures, then the oneDNN fp32
 * and bf16 matmul figures (or "not available: why") (rank 0). */
int bench_peak_main(int argc, char **argv, int first, MPI_Comm comm);

#endif
