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
#include <string.h>
#include "pipelm/comm.h"
#include "pipelm/common.h"
#include "pipelm/optim.h"

int optim_init(optim *o, stage *st, const optim_hparams *h, char *err, size_t errlen) {
    memset(o, 0, sizeof *o);
    o->st = st;
    o->be = st->be;
    o->h = *h;
    o->dp_size = 1;
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

void optim_free(optim *o) {
    if (o->be) {
        o->be->free(o->m);
        o->be->free(o->v);
    }
    memset(o, 0, sizeof *o);
}

/* Linear warm-up to lr over warmup_steps, then cosine to min_lr at total_steps (or flat). */
double optim_lr(const optim_hparams *h, int step) {
    if (h->warmup_steps > 0 && step <= h->warmup_steps) return h->lr * step / h->warmup_steps;
    if (!h->cosine || h->total_steps <= h->warmup_steps) return h->lr;
    double progress = (double)(step - h->warmup_steps) / (double)(h->total_steps - h->warmup_steps);
    if (progress > 1.0) progress = 1.0;
    return h->min_lr + 0.5 * (h->lr - h->min_lr) * (1.0 + cos(M_PI * progress));
}

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
    if (st->cfg.arch == MODEL_LLAMA) return PL_OK; /* Llama's head is not tied to wte */
    if (nranks <= 1 || !(st->has_embed || st->has_head)) return PL_OK;
    size_t n = (size_t)st->cfg.Vp * st->cfg.C;
    void *host = NULL;
    PL_TRY(be->map(&host, st->dwte, n * sizeof(float), PL_MAP_READ | PL_MAP_WRITE));
    int rc = comm_allreduce(MPI_IN_PLACE, host, (int)n, MPI_FLOAT, MPI_SUM, tied,
                            "the all-reduce of the tied embedding's gradient");
    int rc2 = be->unmap(host, st->dwte, n * sizeof(float), PL_MAP_READ | PL_MAP_WRITE);
    return rc != PL_OK ? rc : rc2;
}

int optim_grad_sumsq(const optim *o, double *sq) {
    const stage *st = o->st;
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        PL_TRY(o->be->sumsq(st->grads + t->offset, t->numel, &sq[i]));
    }
    return PL_OK;
}

int optim_step(optim *o, int step, double lr, double norm) {
    stage *st = o->st;
    const optim_hparams *h = &o->h;
    if (h->grad_clip > 0 && norm > h->grad_clip) {
        float s = (float)(h->grad_clip / (norm + 1e-6));
        PL_TRY(o->be->scale(st->grads, s, st->nparams));
    }
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        float wd = t->decay ? (float)h->weight_decay : 0.0f; /* the decay group: 2-D weights */
        PL_TRY(o->be->adamw(st->params + t->offset, st->grads + t->offset, o->m + t->offset, o->v + t->offset,
                            t->numel, (float)lr, (float)h->beta1, (float)h->beta2, (float)h->eps, wd, step));
    }
    return PL_OK;
}
