/*
 * sched_cost.h — a schedule's step time predicted from measured costs.
 *
 * The unit-cost dry run (sched.h) says whether a schedule can run; this says how long it
 * takes on a real model: the seconds of each F, B, I and W on each stage (measured by
 * `pipelm bench --costs-out`), and a message costing latency + bytes / bandwidth (measured
 * by a ping-pong between neighbouring ranks). Sends do not block the sender (MPI_Isend);
 * a receive completes when the message has arrived. The file format is in docs/formats.md
 * ("Schedule costs"). Pure bookkeeping, no MPI.
 */
#ifndef PIPELM_SCHED_COST_H
#define PIPELM_SCHED_COST_H

#include <stdio.h>
#include "pipeline/sched.h"

typedef struct {
    int P;                      /* stages */
    double *f, *b, *i, *w;      /* seconds per action on each stage (P each) */
    double *opt;                /* seconds of the optimizer step (with its all-reduces) per stage */
    double latency_s;           /* one message: latency_s + msg_bytes / bytes_per_s */
    double bytes_per_s;
    double msg_bytes;
    double *act;                /* activation bytes one micro-batch holds on each stage (P; key A),
                                   0 where unknown */
    int *blocks;                /* the transformer blocks each stage held when measured (P; key N),
                                   -1 where unknown */
    int dp;                     /* the data-parallel replicas of the measured run (key dp; 1) */
    int tp;                     /* the --tp the actions were measured at (key tp; 1 when absent) */
    int cp;                     /* the --cp the actions were measured at (key cp; 1 when absent) */
} sched_costs;

typedef struct {
    int P;
    double makespan_s;          /* when the last rank finishes its last action */
    double step_s;              /* makespan + the slowest stage's optimizer step */
    double bubble;              /* 1 - sum of compute / (P * makespan) */
    double *busy_s;             /* compute seconds per rank */
    double *wait_s;             /* seconds each rank waits for a message */
    double *act_peak;           /* activation bytes each rank holds at most (its chunks together) */
} sched_pred;

/* Allocate costs for P stages (zeroed). PL_OK or PL_ENOMEM. */
int sched_costs_alloc(sched_costs *c, int P);
void sched_costs_free(sched_costs *c);
/* Read / write the text form (PL_OK; PL_EINVAL with err for a malformed file, PL_EIO for a
 * write error). A missing I or W is taken as half of B, a missing B as I + W. */
int sched_costs_read(FILE *f, sched_costs *c, char *err, size_t errlen);
int sched_costs_write(const sched_costs *c, FILE *f);
/* Tensor parallelism: costs measured at tp 1 made T ranks' (each stage's F, B, I, W divided
 * by T, and two TP all-reduces a block (the stage's N) added to each F and I (and B), each
 * costing latency_s + (T - 1) msg_bytes / bytes_per_s: a rank receives the T - 1 other parts);
 * costs measured at T are kept. *ar_s: the seconds of one all-reduce (0 when kept). PL_EINVAL
 * with err for costs measured at another T > 1. */
int sched_costs_tp(sched_costs *c, int T, double *ar_s, char *err, size_t errlen);
/* Context parallelism: costs measured at cp 1 made one of C CP ranks' (parallel/cp.h): every
 * action and the activations / C (each rank holds T / C tokens; the load-balanced chunks give
 * it 1 / C of the causal attention too), the boundary message / C, and per block the
 * all-gather of the qkv rows (latency_s + (C - 1) msg_bytes / C qkv / bytes_per_s; qkv: the
 * fused projection's width over the model width) added to F, and in the backward (I and B)
 * that gather again plus the exchange of the key and value gradients (kv: their width over
 * the model width). *ex_s: the seconds of one forward gather (0 when kept). Costs measured at
 * C are kept; PL_EINVAL with err for another C > 1. */
int sched_costs_cp(sched_costs *c, int C, double qkv, double kv, double *ex_s, char *err, size_t errlen);
/* Play the schedule with these costs (its P must be the costs' P). PL_OK, or PL_EINVAL
 * (PL_ENOMEM) with err. */
int sched_predict(const sched *s, const sched_costs *c, sched_pred *out, char *err, size_t errlen);
void sched_pred_free(sched_pred *p);

#endif
