/*
 * tune.h — the layout tuner: which schedule, micro-batch count M and chunks per rank V run a
 * step fastest on P ranks within a per-rank memory cap, predicted from measured costs.
 *
 * Every candidate (each schedule pipelm builds, each M dividing the batch, V = 1 for the
 * one-chunk schedules, 2 and 4 for the interleaved ones, 2 for the V-shaped ones; and where
 * costs measured with --recompute selective or full are given, the recompute modes: every
 * stage in one mode, and a per-stage walk from none that moves the stage holding the most
 * activations to its next lighter mode until the cap is met; and where the costs name each
 * stage's blocks (key N) and the model is known, the split that rebalances the measured
 * speeds: stage s's seconds per FLOP (its measured F + B over its FLOPs) times the FLOPs a new
 * split gives it, the slowest stage minimised, each action, activation and optimizer cost
 * scaled by the FLOP, activation and parameter ratios of the stage; and with ranks, every
 * D x P = ranks: each replica's micro-batches of batch / (D M) sequences scaled from the
 * measured ones of batch / (D0 M0), a P other than the measured one re-split from the FLOPs at
 * the stages' mean measured speed, the optimizer step with its gradient all-reduce modelled as
 * a ring over D (2 (D-1)/D of the stage's fp32 gradients at the measured bandwidth, none of it
 * hidden: an upper bound) in place of the measured D0's; and there, every T x D x P = ranks
 * with T the --tp that divides the model's heads and MLP (model_tp_check): costs measured at
 * tp 1 made T ranks' by sched_costs_tp (actions / T plus two TP all-reduces a block), the
 * optimizer step and the DP all-reduce / T (each rank holds 1/T of the parameters), the
 * activations (10 + 24 / T) / 34 of the measured ones (Korthikanti et al. 2022: of a block's
 * 34 s b h bytes, 10 are the replicated residual, norm and dropout-free inputs, 24 are sliced);
 * and every C x D x P = ranks (no TP) with C the --cp whose 2C divides the sequence: costs
 * measured at cp 1 made C ranks' by sched_costs_cp (actions, activations and messages / C, the
 * gathers of the qkv rows and the exchange of the kv gradients a block added), the gradient
 * all-reduce over the D C ranks that sum it) is built and
 * played with sched_predict (sched_cost.h): the step time is its makespan plus the slowest
 * rank's optimizer step, the memory the largest activation bytes a rank holds (the costs'
 * A bytes per micro-batch walked over its list). A costs file measured with M0 micro-batches
 * holds the seconds and bytes of batch / M0 sequences: for M they are scaled by M0 / M
 * (linear in the sequences, so small micro-batches are predicted a little optimistically). Candidates over the cap are
 * left out, and so are those with more stages (P x V) than the model's blocks allow (n_layer + 2:
 * every middle stage holds one); the rest are ranked by predicted step (then bubble, then memory). Pure
 * bookkeeping, no MPI: `pipelm tune` prints, writes JSON and verifies (pipelm.c).
 */
#ifndef PIPELM_TUNE_H
#define PIPELM_TUNE_H

#include <mpi.h>
#include <stddef.h>
#include <stdio.h>
#include "model/model.h"
#include "pipeline/sched_cost.h"

/* The recompute modes a costs file can be measured with (bench --recompute MODE --costs-out). */
enum { TUNE_NONE, TUNE_SELECTIVE, TUNE_FULL, TUNE_NMODES };

typedef struct {
    char schedule[32];
    int M, V, D, Tp;             /* micro-batches, chunks per rank, data-parallel replicas, TP ranks a stage */
    int Cp;                      /* CP ranks a stage (0 = 1) */
    double step_s, bubble, peak_mem_mb;
    char recompute[768];         /* --recompute: "none", one mode, or one per stage */
    char split[512];             /* --split b0,b1,... ("": the split the costs were measured with) */
} tune_cand;

typedef struct {
    int P, batch;                /* pipeline ranks, sequences per step */
    int costs_M;                 /* the M the costs were measured with (0: no scaling) */
    double mem_cap_mb;           /* per rank; <= 0: no cap */
    int max_M;                   /* largest M tried (0: the batch) */
    int n_layer;                 /* the model's blocks: at most n_layer + 2 stages (0: unknown) */
    const model_config *cfg;     /* the model (NULL: unknown; then the split is not searched) */
    int T;                       /* its sequence length (the FLOPs per token of the split) */
    int ranks;                   /* > 0: search D x P = ranks (--dp D), P ignored; 0: D = 1, P */
    int D;                       /* the replicas of a candidate layout (set by the search; 0 = 1) */
    int Tp;                      /* the TP ranks of a candidate layout (set by the search; 0 = 1) */
    int Cp;                      /* the CP ranks of a candidate layout (set by the search; 0 = 1) */
} tune_query;

/* Search every candidate for q with costs c[TUNE_NONE] (required) and c[TUNE_SELECTIVE],
 * c[TUNE_FULL] (each NULL or measured with that --recompute, for as many stages); *out (malloc'd, best first) and *n (all that fit
 * under the cap), *tried (how many were played). PL_OK, or PL_EINVAL / PL_ENOMEM with err. */
int tune_search(const tune_query *q, const sched_costs *const c[TUNE_NMODES], tune_cand **out, int *n, int *tried, char *err,
                size_t errlen);
/* The `pipelm train` arguments of a candidate ("--schedule zb-v --microbatches 8 --chunks-per-rank 2"). */
void tune_command(const tune_cand *t, char *buf, size_t len);
/* The candidates as JSON (best first): command, predicted_ms, bubble, peak_mem_mb, schedule,
 * microbatches, chunks_per_rank, recompute, split, dp, tp, cp; extra: the train arguments added to every command. */
void tune_write_json(FILE *f, const tune_query *q, const tune_cand *t, int n, const char *extra);

/* `pipelm tune` (tune_cli.c): parse, search, print, --json, --verify; the exit status. */
int tune_main(int argc, char **argv, int first, MPI_Comm comm);

#endif
