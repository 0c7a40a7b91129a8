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
 *
 * Data parallelism with ZeRO-1 (dp.h) shards the state: optim_shard tells the optimizer the
 * ranges of the parameters this replica updates, and it keeps the moments of those ranges
 * only; optim_step then updates only them (the caller all-gathers the parameters), and for
 * a checkpoint optim_unshard gives whole-size moments that optim_reshard folds back.
 */
#ifndef PIPELM_OPTIM_H
#define PIPELM_OPTIM_H

#include <mpi.h>
#include "model/hparams.h"
#include "model/stage.h"

/* The state buffers, as optim_buffer() names them. */
enum { OPTIM_PARAMS = 0, OPTIM_M = 1, OPTIM_V = 2, OPTIM_NBUF = 3 };

/* A contiguous range [lo, lo + n) of the stage's parameter buffer. */
typedef struct {
    size_t lo, n;
} optim_range;

typedef struct {
    stage *st;                  /* the parameters and gradients it updates */
    const backend *be;
    optim_hparams h;
    float *m, *v;               /* backend memory, zero at the start: (nparams) each, or, sharded,
                                 * the moments of the shard's ranges one after another */
    optim_range *shard;         /* sharded (optim_shard): the ranges it updates, ascending; else NULL */
    int nshard;
    size_t nmoment;             /* floats in each of m and v */
    float *mfull, *vfull;       /* sharded: whole-size moments while a checkpoint is read or written */
    int dp_rank, dp_size;       /* this stage's replica and the replicas (1 without --dp) */
} optim;

/* Allocate the moments (zero) for a stage's parameters. */
int optim_init(optim *o, stage *st, const optim_hparams *h, char *err, size_t errlen);
void optim_free(optim *o);
/* This stage is replica d of D (data parallelism): which tensors a checkpoint takes from it. */
void optim_set_replica(optim *o, int d, int D);
/* Keep and update the state of these nr ranges only (ascending, disjoint; ZeRO-1): the
 * whole-size moments are replaced by zero ones of the ranges' total size. */
int optim_shard(optim *o, const optim_range *r, int nr, char *err, size_t errlen);
/* Sharded: whole-size moments (optim_buffer then returns them) for a checkpoint, with this
 * replica's ranges filled in (fill = 1, before the caller gathers the others': a save) or
 * zero (fill = 0: a load); then optim_reshard copies the ranges back into the shard and frees
 * them (safe to call when there are none). No-ops when not sharded. */
int optim_unshard(optim *o, int fill);
int optim_reshard(optim *o);
/* The part of tensor t inside the range [lo, lo + n): 1 and [*xlo, *xlo + *xn), or 0 if none. */
int optim_overlap(const param_tensor *t, size_t lo, size_t n, size_t *xlo, size_t *xn);
/* Learning rate at step (1-based): linear warm-up, then cosine to min_lr or constant. */
double optim_lr(const optim_hparams *h, int step);
/* Backend buffer OPTIM_PARAMS / OPTIM_M / OPTIM_V (offsets as in st->tensors). */
float *optim_buffer(const optim *o, int which);
/* dwte = the embedding's share + the head's share: added on a stage holding both ends,
 * summed with MPI over `tied` (the first and last ranks) otherwise. Collective on tied when
 * nranks > 1 and the stage holds either end. */
int optim_tied_grads(optim *o, MPI_Comm tied, int nranks);
/* The same on the exact mode's accumulators (stage.h's acc; an exact MPI sum), before they
 * are rounded to the gradients. */
int optim_tied_grads_exact(optim *o, MPI_Comm tied, int nranks);
/* Squared gradient norm of each tensor into sq[i] (the tensor table's order). */
int optim_grad_sumsq(const optim *o, double *sq);
/* optim_clip, then AdamW with each tensor's group weight decay on every tensor, or, sharded,
 * on the shard's part of each. */
int optim_step(optim *o, int step, double lr, double norm);
/* optim_step restricted to the parameters [lo, lo + n) (sharded: inside one of the shard's
 * ranges), clipping included; elementwise, so updating every range this way gives
 * optim_step's bits. */
int optim_step_range(optim *o, size_t lo, size_t n, int step, double lr, double norm);

#endif
