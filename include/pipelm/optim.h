/*
 * optim.h — the optimizer of one stage: AdamW with decoupled weight decay, its parameter
 * groups (2-D weights decay, biases, norms and nothing else do not), global-norm clipping,
 * the tied-embedding gradient sum and the learning-rate schedule, in one place.
 *
 * It owns the training state beside the weights: the first and second moments m and v, one
 * float per parameter, laid out as the stage's params (the same tensor table and offsets).
 * The fp32 master weights are the stage's params: every backend keeps parameters in fp32 and
 * a bf16 backend rounds them only inside its matmuls, so a checkpoint holds the same state
 * whatever the precision. Checkpoints read and write the state through optim_buffer(), by
 * tensor offset, so the file does not depend on how the optimizer stores it.
 */
#ifndef PIPELM_OPTIM_H
#define PIPELM_OPTIM_H

#include <mpi.h>
#include "pipelm/stage.h"

/* Hyper-parameters (from the command line; recorded in checkpoints). */
typedef struct {
    double lr, min_lr;
    int warmup_steps, total_steps;
    int cosine;                 /* 1: cosine decay to min_lr after warm-up; 0: constant */
    double beta1, beta2, eps, weight_decay, grad_clip;
} optim_hparams;

/* The state buffers, as optim_buffer() names them. */
enum { OPTIM_PARAMS = 0, OPTIM_M = 1, OPTIM_V = 2, OPTIM_NBUF = 3 };

typedef struct {
    stage *st;                  /* the parameters and gradients it updates */
    const backend *be;
    optim_hparams h;
    float *m, *v;               /* (nparams) each, backend memory, zero at the start; with ZeRO-1
                                 * (dp.h) only this replica's pieces */
    float *mfull, *vfull;       /* ZeRO-1: whole-size moments while a checkpoint is read or written */
    int dp_rank, dp_size;       /* this stage's replica and the replicas (1 without --dp) */
} optim;

/* Allocate the moments (zero) for a stage's parameters. */
int optim_init(optim *o, stage *st, const optim_hparams *h, char *err, size_t errlen);
void optim_free(optim *o);
/* Learning rate at step (1-based): linear warm-up, then cosine to min_lr or constant. */
double optim_lr(const optim_hparams *h, int step);
/* Backend buffer OPTIM_PARAMS / OPTIM_M / OPTIM_V (offsets as in st->tensors). */
float *optim_buffer(const optim *o, int which);
/* dwte = the embedding's share + the head's share: added on a stage holding both ends,
 * summed with MPI over `tied` (the first and last ranks) otherwise. Collective on tied when
 * nranks > 1 and the stage holds either end. */
int optim_tied_grads(optim *o, MPI_Comm tied, int nranks);
/* Squared gradient norm of each tensor into sq[i] (the tensor table's order). */
int optim_grad_sumsq(const optim *o, double *sq);
/* Clip to grad_clip given the global norm (no-op when under it or clipping is off), then
 * AdamW on every tensor with its group's weight decay. */
int optim_step(optim *o, int step, double lr, double norm);

#endif
