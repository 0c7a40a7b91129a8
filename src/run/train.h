/*
 * train.h — `pipelm train`: set up the stage this rank owns and run the training loop.
 *
 * Set-up failures (bad flags, files, rank counts) are detected on the rank that sees them,
 * then all ranks agree (MPI_Allreduce of the status) and return together, so nobody hangs.
 * Each step: the schedule runs on the engine, the tied embedding's gradient is summed
 * between the first and last stage, one small MPI_Allreduce gives every rank the global
 * gradient norm (per-layer squared norms, summed in layer order so the value does not
 * depend on the split) and the loss, AdamW updates every stage. Rank 0 prints and writes
 * metrics. A non-finite loss or norm stops every rank with the layer that went bad.
 */
#ifndef PIPELM_TRAIN_H
#define PIPELM_TRAIN_H

#include <mpi.h>
#include "cli/config.h"
#include "run/bench.h"

/* Run training with the parsed options on comm. Returns PL_OK or an error code; *agreed is
 * 1 when every rank returns the same code together, 0 when this rank failed alone (the
 * caller must then MPI_Abort, since its peers may be blocked waiting for it). */
int train_run(const pl_options *o, MPI_Comm comm, int *agreed);
/* The same for `pipelm bench` (o->bench set): rank 0's figures in *summary too (NULL: none),
 * as pipelm tune --verify takes them. */
int train_bench(const pl_options *o, MPI_Comm comm, int *agreed, bench_summary *summary);
/* Learning rate at step (1-based): linear warm-up, then cosine to min_lr or constant. */
double train_lr(const pl_options *o, int step);

#endif
