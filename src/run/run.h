/*
 * run.h — the state of one rank's training run, shared by the loop (train.c), its
 * reporting (report.c: banner, step lines, timers, progress, benchmark figures, the end of
 * the run) and its checkpoints (train_ckpt.c: save and resume). Internal to `pipelm train`
 * and `pipelm eval` and `generate` (eval.c, generate.c, which runs the trainer's set-up and validation path): nothing
 * outside those five files includes it.
 */
#ifndef PIPELM_RUN_H
#define PIPELM_RUN_H

#include <mpi.h>
#include "cli/config.h"
#include "formats/data.h"
#include "formats/prefetch.h"
#include "parallel/dp.h"
#include "pipeline/engine.h"
#include "run/bench.h"
#include "run/layout.h"
#include "run/metrics.h"
#include "model/optim.h"
#include "pipeline/sched.h"
#include "pipeline/sched_cost.h"
#include "pipeline/split.h"
#include "model/stage.h"
#include "parallel/tp.h"
#include "parallel/ep.h"
#include "parallel/cp.h"

/* Per-rank timers in seconds, accumulated between reports. */
enum { TM_FWD, TM_BWD, TM_WAIT, TM_OPT, TM_STEP, TM_DATA, TM_N }; /* TM_DATA: the step's wait for its batch */

/* Everything one rank needs during a run. */
typedef struct {
    const pl_options *o;
    MPI_Comm comm, tied;        /* this replica's pipeline (rank = stage); first + last stage */
    MPI_Comm world, dpc;        /* every rank of the job; this stage's D replicas */
    int rank, P, B, T, M;       /* B: this replica's share of the batch (Bg / D) */
    int wrank, W, D, d, Bg;     /* world rank and size, replicas, this replica, the global batch */
    dp_reducer dp;
    int have_dp;
    MPI_Comm tpc;               /* --tp: the Tp ranks of this (stage, replica), rank = t */
    int Tp, t;                  /* tensor-parallel ranks per stage (1: none), this rank's index */
    tp_group tp;
    int have_tp;
    MPI_Comm epc;               /* --ep E: the E replicas of this stage sharing its experts, rank = d % E */
    ep_group ep;
    int have_ep;
    double moe_lb, moe_dropped; /* a MoE model's timed steps: sums of load max/mean and dropped (bench) */
    int moe_steps;
    MPI_Comm cpc;               /* --cp: the C ranks of this (stage, data replica), rank = c */
    int C, c, Tl;               /* context-parallel ranks per stage (1: none), this rank's index, its T / C rows;
                                 * with --cp the D C ranks of a stage count as its gradient replicas (R->D, R->d
                                 * = data replica d / C's CP rank d % C) */
    cp_group cp;
    int have_cp;
    int *cin, *ctg;             /* --cp: (B, T / C) this rank's tokens of its replica's inputs and targets */
    int exact;                  /* --grad-accum exact: st.acc holds the step's fixed-point sums (exact.h) */
    int *gin, *gtg;             /* (B, T) this replica's rows of the global batch: inputs, targets (data ranks) */
    char *manifest;             /* (CKPT_SHARDS_LEN) the token files of --data (data_manifest), on every rank */
    const backend *be;          /* the backend's table, or its timing wrapper (profiled) */
    int profiled;
    model_config cfg;
    split sp;
    sched sc;
    stage st;                   /* the rank's parameters: its one stage, or (V > 1) the holder of its chunks */
    stage *stv;                 /* the V stages it computes: &st, or V chunks (chunk c = stage c P + rank) */
    int V, S;                   /* chunks per rank, global stages P V */
    optim opt;
    engine eng;
    data_source train, val;
    data_prefetch pf;           /* training batches read one step ahead (prefetch.h) */
    int have_train, have_val;
    int *inputs, *targets;
    metrics mx;
    int tty;
    double tm[TM_N];
    int tm_steps;
    int polite;
    layout lay;
    int *rc_modes;              /* S: each global stage's STAGE_RECOMPUTE_* */
    char *costs_text, *csv_text; /* --costs-in, --schedule-csv: read by rank 0, broadcast (or NULL) */
    size_t costs_len, csv_len;
    int first_step;             /* the run's first step: weights as loaded or initialised */
    int set_up;                 /* run_setup got past its first phase: run_teardown frees */
    bench_summary *summary;     /* bench: where rank 0 leaves the figures (train_bench), or NULL */
    int nan_injected;           /* the step at which --fail-at nan wrote a NaN here, or 0 */
    struct ckpt_async *ca;      /* --ckpt-async's writer (ckpt_async.h), or NULL */
    double ca_blocked, ca_wait, ca_snap; /* the write in flight: seconds training was held, of it waiting, snapshot */
    double ca_fence;             /* and the optimizer's wait for its deferred snapshot (ckpt_async_fence) */
} run;

/* --costs-in's file, as rank 0 read it for every rank in the set-up, parsed into *c
 * (sched_costs_free it). */
int run_costs_read(const run *R, sched_costs *c, char *err, size_t errlen);

/* What one step's all-reduce tells every rank besides the norm and the loss. */
typedef struct {
    int stop_sig, stop_rank;   /* a stop signal seen by a rank (the lowest), or 0 / -1 */
    int fwd_stage, fwd_mb;     /* lowest stage whose forward gave a non-finite value, or -1 */
    int fwd_wrank;             /* the world rank that ran that forward, or -1 */
} step_news;


/* report.c */
void report_stage_table(run *R);
/* Collective over the world: with --dp > 1, rank 0 prints (stage, replica) -> rank and host. */
int report_grid(run *R);
void report_run_line(run *R);
void report_step(run *R, int step, int first_step, int last_step, double loss, double lr, double norm,
                 double secs, double t_start);
int report_timers(run *R, int step);
void report_nonfinite(run *R, int step, const step_news *nw, double loss, double norm, const char *where);
void report_norm_slot(const run *R, int slot, char *buf, size_t len);
int report_bench(run *R, const double *step_s, int nsteps);
int report_finish(run *R, int first_step, int done_steps, double wall, double last_loss, int stopped);

/* train.c (collective): the mean loss of batches 0..nbatches-1 of R->val, forward only,
 * summed in micro-batch and batch order on the last stage, then over the world; the
 * trainer's validation loss is this with --val-batches. */
int train_evaluate(run *R, int nbatches, double *val_loss);

/* The set-up every subcommand that runs the model shares (train.c, collective): the layout,
 * communicators, threads, watchdog and signals, the stages, data, replicas and checkpoint
 * writer, the weights (--init, --resume, or initialised), agreed by every rank, so each rank
 * returns the same status. *stop_grace: the --stop-grace in force. Whatever it returns,
 * run_teardown(R, agreed) ends it. train_run, eval and generate are set-up, their own loop,
 * teardown. */
int run_setup(run *R, const pl_options *o, MPI_Comm comm, double *stop_grace);
void run_teardown(run *R, int agreed);

/* eval.c (collective): the parameters of the checkpoint --resume names into R->st. */
int eval_load_resume(run *R);

/* The model config of the checkpoint --resume names (a file or a directory's latest), for a
 * run that takes its dimensions from it. */
int train_resume_config(const pl_options *o, model_config *cfg, char *err, size_t errlen);
/* train_ckpt.c (collective) */
int train_save_checkpoint(run *R, int step);
int train_resume_checkpoint(run *R, int *first_step);
/* Rank 0, at set-up: refuse (PL_EINVAL) a run that does not resume into a --ckpt-dir holding
 * checkpoints, unless --ckpt-overwrite 1. */
int train_ckpt_guard(const run *R, char *err, size_t errlen);
/* Collective: R->manifest on every rank, the list of --data's token files from world rank 0. */
int train_data_manifest(run *R);
/* --ckpt-async (train_ckpt.c): the set-up's check (thread level, snapshot memory; not
 * collective), the writer's set-up (collective, after the agreed set-up), after each step the
 * agreement on finished writers, the wait for the write in flight at the end of the run, and
 * the clean-up on every way out (*agreed / agreed: whether the ranks are still in step). */
int train_ckpt_async_check(run *R, char *err, size_t errlen);
int train_ckpt_async_setup(run *R, char *err, size_t errlen);
int train_ckpt_async_poll(run *R, int *agreed);
int train_ckpt_async_drain(run *R, int *agreed);
void train_ckpt_async_free(run *R, int agreed);
/* train_layout.c (collective): --dp auto / --stages auto (o->dp, o->stages < 0): the layout
 * D x P of the world's ranks, printed with the reason; *D, *P in: > 0 where given. PL_EINVAL
 * (and the message, from rank 0) when none fits. */
int train_layout_auto(run *R, const pl_options *o, int *D, int *P);

#endif
