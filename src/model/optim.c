/*
 * optim.c — AdamW over one stage's tensors: groups, clipping, the tied-embedding sum, the
 * learning-rate schedule (optim.h).
 *   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *   p -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd p),  wd = 0 outside the decay group
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/comm.h"
#include "util/common.h"
#include "model/arch.h"
#include "model/optim.h"

/* The whole-size moments, zero; one replica of one. */
int optim_init(optim *o, stage *st, const optim_hparams *h, char *err, size_t errlen) {
    memset(o, 0, sizeof *o);
    o->st = st;
    o->be = st->be;
    o->h = *h;
    o->dp_size = 1;
    o->nmoment = st->nparams;
    size_t bytes = st->nparams * sizeof(float);
    void *m = NULL, *v = NULL;
    int rc = o->be->alloc(&m, bytes);
    if (rc == PL_OK) rc = o->be->alloc(&v, bytes);
    o->m = m;
    o->v = v;
    if (rc != PL_OK) {
        snprintf(err, errlen, "backend %s: %s, for the AdamW moments of %zu parameters", o->be->name,
                 stage_error(st), st->nparams);
        optim_free(o);
        return rc;
    }
    return PL_OK;
}

/* Everything it allocated, the whole-size checkpoint moments included. */
void optim_free(optim *o) {
    if (o->be) {
        o->be->free(o->m);
        o->be->free(o->v);
        if (o->mfull) o->be->free(o->mfull);
        if (o->vfull) o->be->free(o->vfull);
    }
    free(o->shard);
    memset(o, 0, sizeof *o);
}

/* Which replica this is: ckpt_written_tensor reads it. */
void optim_set_replica(optim *o, int d, int D) {
    o->dp_rank = d;
    o->dp_size = D;
}

/* Replace the whole-size moments by those of the ranges (at least one float each, so that an
 * empty shard still has buffers). */
int optim_shard(optim *o, const optim_range *r, int nr, char *err, size_t errlen) {
    const backend *be = o->be;
    size_t total = 0;
    for (int k = 0; k < nr; k++) total += r[k].n;
    o->shard = malloc(sizeof *o->shard * (size_t)(nr ? nr : 1));
    if (!o->shard) {
        snprintf(err, errlen, "out of memory for the optimizer's shard");
        return PL_ENOMEM;
    }
    memcpy(o->shard, r, sizeof *r * (size_t)nr);
    o->nshard = nr;
    o->nmoment = total;
    be->free(o->m);
    be->free(o->v);
    o->m = o->v = NULL;
    void *m = NULL, *v = NULL;
    int rc = be->alloc(&m, (total ? total : 1) * sizeof(float));
    if (rc == PL_OK) rc = be->alloc(&v, (total ? total : 1) * sizeof(float));
    o->m = m;
    o->v = v;
    if (rc != PL_OK)
        snprintf(err, errlen, "backend %s: %s, for the sharded AdamW moments", be->name, stage_error(o->st));
    return rc;
}

/* Copy between the shard's moments and whole-size ones (to_whole: shard -> whole). */
static int copy_shard(const optim *o, float *piece, float *whole, int to_whole) {
    size_t mo = 0;
    for (int k = 0; k < o->nshard; k++) {
        const optim_range *r = &o->shard[k];
        if (r->n) {
            float *w = whole + r->lo, *p = piece + mo;
            PL_TRY(o->be->copy(to_whole ? w : p, to_whole ? p : w, r->n * sizeof(float)));
        }
        mo += r->n;
    }
    return PL_OK;
}

/* Whole-size moments for a checkpoint (see optim.h). */
int optim_unshard(optim *o, int fill) {
    if (!o->shard) return PL_OK;
    size_t bytes = o->st->nparams * sizeof(float);
    void *mf = NULL, *vf = NULL;
    PL_TRY(o->be->alloc(&mf, bytes));
    int rc = o->be->alloc(&vf, bytes);
    o->mfull = mf;
    o->vfull = vf;
    if (rc != PL_OK || !fill) return rc;
    PL_TRY(copy_shard(o, o->m, o->mfull, 1));
    return copy_shard(o, o->v, o->vfull, 1);
}

/* Back to the shard's moments after a checkpoint (see optim.h). */
int optim_reshard(optim *o) {
    if (!o->shard) return PL_OK;
    int rc = PL_OK;
    if (o->mfull && o->vfull) {
        rc = copy_shard(o, o->m, o->mfull, 0);
        if (rc == PL_OK) rc = copy_shard(o, o->v, o->vfull, 0);
    }
    o->be->free(o->mfull);
    o->be->free(o->vfull);
    o->mfull = o->vfull = NULL;
    return rc;
}

/* Interval intersection of a tensor and a range of the parameter buffer. */
int optim_overlap(const param_tensor *t, size_t lo, size_t n, size_t *xlo, size_t *xn) {
    size_t a0 = t->offset, a1 = t->offset + t->numel, b1 = lo + n;
    size_t x0 = a0 > lo ? a0 : lo, x1 = a1 < b1 ? a1 : b1;
    if (x1 <= x0) return 0;
    *xlo = x0;
    *xn = x1 - x0;
    return 1;
}

/* Linear warm-up to lr over warmup_steps, then cosine to min_lr at total_steps (or flat). */
double optim_lr(const optim_hparams *h, int step) {
    if (h->warmup_steps > 0 && step <= h->warmup_steps) return h->lr * step / h->warmup_steps;
    if (strcmp(h->lr_schedule, "constant") == 0 || h->total_steps <= h->warmup_steps) return h->lr;
    double progress = (double)(step - h->warmup_steps) / (double)(h->total_steps - h->warmup_steps);
    if (progress > 1.0) progress = 1.0;
    return h->min_lr + 0.5 * (h->lr - h->min_lr) * (1.0 + cos(M_PI * progress));
}

/* The state buffers by name; the whole-size moments while a checkpoint has them. */
float *optim_buffer(const optim *o, int which) {
    if (which == OPTIM_PARAMS) return o->st->params;
    if (which == OPTIM_M) return o->mfull ? o->mfull : o->m;
    return which == OPTIM_V ? (o->vfull ? o->vfull : o->v) : NULL;
}

/* The all-reduce runs on a host view of dwte (the backend's own memory on a host backend). */
int optim_tied_grads(optim *o, MPI_Comm tied, int nranks) {
    stage *st = o->st;
    const backend *be = o->be;
    PL_TRY(stage_tied_grads_local(st));
    if (!model_is_tied(&st->cfg)) return PL_OK; /* no head row reads an embedding (an untied Llama) */
    if (nranks <= 1 || !(st->has_embed || st->has_head)) return PL_OK;
    size_t n = arch_dim_value(&st->cfg, 0, AD_VP) * st->cfg.C; /* --tp: this rank's vocabulary slice */
    void *host = NULL;
    PL_TRY(be->map(&host, st->dwte, n * sizeof(float), PL_MAP_READ | PL_MAP_WRITE));
    int rc = comm_allreduce(MPI_IN_PLACE, host, (int)n, MPI_FLOAT, MPI_SUM, tied,
                            "the all-reduce of the tied embedding's gradient");
    int rc2 = be->unmap(host, st->dwte, n * sizeof(float), PL_MAP_READ | PL_MAP_WRITE);
    return rc != PL_OK ? rc : rc2;
}

int optim_tied_grads_exact(optim *o, MPI_Comm tied, int nranks) {
    stage *st = o->st;
    stage_tied_exact_local(st);
    if (!model_is_tied(&st->cfg) || nranks <= 1 || !(st->has_embed || st->has_head)) return PL_OK;
    size_t n = arch_dim_value(&st->cfg, 0, AD_VP) * st->cfg.C; /* --tp: this rank's vocabulary slice */
    return comm_allreduce(MPI_IN_PLACE, st->acc + (st->dwte - st->grads), (int)n, exact_mpi_type(), exact_mpi_sum(),
                          tied, "the exact all-reduce of the tied embedding's gradient");
}

int optim_grad_sumsq(const optim *o, double *sq) {
    const stage *st = o->st;
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        PL_TRY(o->be->sumsq(st->grads + t->offset, t->numel, &sq[i]));
    }
    return PL_OK;
}

/* The clipping factor grad_clip / (norm + 1e-6) into *s: 1 when the norm is under it (or
 * clipping is off), then 0 is returned (nothing to scale). */
static int clip_factor(const optim_hparams *h, double norm, float *s) {
    if (!(h->grad_clip > 0 && norm > h->grad_clip)) return 0;
    *s = (float)(h->grad_clip / (norm + 1e-6));
    return 1;
}

/* Global-norm clipping: every gradient scaled by grad_clip / (norm + 1e-6). */
static int optim_clip(optim *o, double norm) {
    float s;
    if (clip_factor(&o->h, norm, &s)) PL_TRY(o->be->scale(o->st->grads, s, o->st->nparams));
    return PL_OK;
}

/* A row with UPDATE_SIGN (Mixtral's balancing bias): p -= rate sign(g) on [lo, lo + n), on
 * host copies; it has no moments. */
static int sign_step(optim *o, size_t lo, size_t n) {
    stage *st = o->st;
    float rate = st->cfg.moe.bias_rate, *h = n ? malloc(2 * n * sizeof(float)) : NULL;
    if (!n) return PL_OK;
    if (!h) return PL_ENOMEM;
    int rc = o->be->to_host(h, st->grads + lo, n * sizeof(float));
    if (rc == PL_OK) rc = o->be->to_host(h + n, st->params + lo, n * sizeof(float));
    for (size_t i = 0; rc == PL_OK && i < n; i++) h[n + i] -= h[i] > 0 ? rate : h[i] < 0 ? -rate : 0.0f;
    if (rc == PL_OK) rc = o->be->from_host(st->params + lo, h + n, n * sizeof(float));
    free(h);
    return rc;
}

/* The one AdamW loop: tensor by tensor, each over the ranges the optimizer owns (the whole
 * buffer when not sharded: then every tensor in one call). */
int optim_step(optim *o, int step, double lr, double norm) {
    stage *st = o->st;
    const optim_hparams *h = &o->h;
    PL_TRY(optim_clip(o, norm));
    const optim_range whole = {0, st->nparams}, *rg = o->shard ? o->shard : &whole;
    int nr = o->shard ? o->nshard : 1;
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        float wd = t->decay ? (float)h->weight_decay : 0.0f; /* the decay group: 2-D weights */
        size_t mo = 0; /* where range k's moments start */
        for (int k = 0; k < nr; mo += rg[k].n, k++) {
            size_t lo, n;
            if (!optim_overlap(t, rg[k].lo, rg[k].n, &lo, &n)) continue;
            size_t at = mo + (lo - rg[k].lo);
            if (t->rule == UPDATE_SIGN) {
                PL_TRY(sign_step(o, lo, n));
                continue;
            }
            PL_TRY(o->be->adamw(st->params + lo, st->grads + lo, o->m + at, o->v + at, n, (float)lr, (float)h->beta1,
                                (float)h->beta2, (float)h->eps, wd, step));
        }
    }
    return PL_OK;
}

/* Where the moments of parameter lo start: lo itself unsharded; sharded, inside the shard
 * range holding all of [lo, lo + n), after the ranges before it (SIZE_MAX: none holds it). */
static size_t moment_at(const optim *o, size_t lo, size_t n) {
    if (!o->shard) return lo;
    size_t mo = 0;
    for (int k = 0; k < o->nshard; mo += o->shard[k].n, k++)
        if (lo >= o->shard[k].lo && lo + n <= o->shard[k].lo + o->shard[k].n) return mo + (lo - o->shard[k].lo);
    return (size_t)-1;
}

/* optim_step's clipping and AdamW on [lo, lo + n) only, tensor by tensor: the same calls on
 * the same elements as optim_step makes there, so the same bits; lets the caller update one
 * range while another's all-gather is in flight. */
int optim_step_range(optim *o, size_t lo, size_t n, int step, double lr, double norm) {
    stage *st = o->st;
    const optim_hparams *h = &o->h;
    size_t base = moment_at(o, lo, n);
    if (base == (size_t)-1) {
        pl_error("optimizer: parameters [%zu, %zu) are not inside one range of this replica's shard", lo, lo + n);
        return PL_EINVAL;
    }
    float s;
    if (n && clip_factor(h, norm, &s)) PL_TRY(o->be->scale(st->grads + lo, s, n));
    for (int i = 0; i < st->ntensors && n; i++) {
        const param_tensor *t = &st->tensors[i];
        float wd = t->decay ? (float)h->weight_decay : 0.0f;
        size_t xlo, xn;
        if (!optim_overlap(t, lo, n, &xlo, &xn)) continue;
        size_t at = base + (xlo - lo);
        if (t->rule == UPDATE_SIGN) {
            PL_TRY(sign_step(o, xlo, xn));
            continue;
        }
        PL_TRY(o->be->adamw(st->params + xlo, st->grads + xlo, o->m + at, o->v + at, xn, (float)lr, (float)h->beta1,
                            (float)h->beta2, (float)h->eps, wd, step));
    }
    return PL_OK;
}
