/*
 * dp.c — the replicas' gradient reduction in a fixed order, overlapped with the backward, and
 * the ZeRO-1 sharded optimizer (see dp.h).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend_poll.h"
#include "parallel/comm.h"
#include "util/common.h"
#include "util/hooks.h"
#include "parallel/dp.h"
#include "util/exact.h"

/* Piece j of a bucket of n floats over D replicas: [j n / D, (j + 1) n / D). */
static size_t piece_lo(size_t n, int D, int j) { return n * (size_t)j / (size_t)D; }
static size_t piece_n(size_t n, int D, int j) { return piece_lo(n, D, j + 1) - piece_lo(n, D, j); }

/* The buckets of a stage: the tensors of one block together (they are consecutive in the
 * tensor table), every other tensor alone. Fails if a block's range would hold another
 * tensor (a layout this code does not expect). */
static int make_buckets(dp_reducer *r, char *err, size_t errlen) {
    const stage *st = r->st;
    r->b = calloc((size_t)st->ntensors, sizeof *r->b);
    if (!r->b) return PL_ENOMEM;
    int nb = 0;
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        dp_bucket *last = nb ? &r->b[nb - 1] : NULL;
        if (t->layer >= 0 && last && last->layer == t->layer) {
            last->n = t->offset + t->numel - last->lo;
            continue;
        }
        dp_bucket *b = &r->b[nb++];
        b->lo = t->offset;
        b->n = t->numel;
        b->layer = t->layer;
        b->tied = model_tensor_is_tied(&st->cfg, t);
        b->rq = b->prq = MPI_REQUEST_NULL;
    }
    r->nb = nb;
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        for (int k = 0; k < nb; k++) {
            const dp_bucket *b = &r->b[k];
            if (b->layer >= 0 && t->layer != b->layer && t->offset < b->lo + b->n && t->offset + t->numel > b->lo) {
                snprintf(err, errlen, "data parallelism: tensor %s lies inside block %d's gradient range", t->name,
                         b->layer);
                return PL_EINVAL;
            }
        }
    }
    return PL_OK;
}

/* Map bucket k's gradients and post the scatter of its pieces (replica j gets piece j). */
static int start_bucket(dp_reducer *r, int k) {
    dp_bucket *b = &r->b[k];
    if (b->state != DP_IDLE) return PL_OK;
    const backend *be = r->st->be;
    void *host = NULL;
    PL_TRY(be->map(&host, r->st->grads + b->lo, b->n * sizeof(float), PL_MAP_READ | PL_MAP_WRITE));
    b->host = host;
    int mrc = r->exact /* the fixed-point sums (exact.h); the rounded floats come back into host */
              ? MPI_Ialltoallv(r->st->acc + b->lo, b->scnt, b->dsp, exact_mpi_type(), b->xrecv, b->rcnt, b->rdsp,
                               exact_mpi_type(), r->comm, &b->rq)
              : MPI_Ialltoallv(b->host, b->scnt, b->dsp, MPI_FLOAT, b->recv, b->rcnt, b->rdsp, MPI_FLOAT, r->comm,
                               &b->rq);
    if (mrc != MPI_SUCCESS) {
        pl_error("MPI_Ialltoallv of a gradient bucket (%zu floats) failed", b->n);
        return PL_EMPI;
    }
    b->state = DP_SCATTER;
    r->order[r->nstarted++] = k;
    return PL_OK;
}

/* The scatter of bucket k has arrived: sum its D pieces in replica order into this
 * replica's piece, then (full) post the all-gather of the sums. */
static int reduce_bucket(dp_reducer *r, int k, int full) {
    dp_bucket *b = &r->b[k];
    float *out = b->host + b->plo;
    size_t pn = b->pn;
    /* term j: replica j's piece as received; this replica's own is read in place (never sent
     * to itself), element i before out[i] is written */
    const float **t = r->terms;
    for (int j = 0; j < r->D; j++) t[j] = j == r->d ? out : b->recv + (size_t)j * pn;
    if (r->exact) { /* integer sums: any order gives the same; each rounded once */
        const pl_fx *own = r->st->acc + b->lo + b->plo;
        for (size_t i = 0; i < pn; i++) {
            pl_fx x = own[i];
            for (int j = 0; j < r->D; j++)
                if (j != r->d) x = exact_add(x, b->xrecv[(size_t)j * pn + i]);
            out[i] = exact_to_float(x);
        }
    } else if (r->D == 2) {
        const float *t0 = t[0], *t1 = t[1];
        for (size_t i = 0; i < pn; i++) out[i] = t0[i] + t1[i];
    } else {
        for (size_t i = 0; i < pn; i++) {
            float s = t[0][i];
            for (int j = 1; j < r->D; j++) s += t[j][i];
            out[i] = s;
        }
    }
    if (!full) {
        b->state = DP_DONE;
        return PL_OK;
    }
    if (MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, b->host, b->cnt, b->dsp, MPI_FLOAT, r->gcomm, &b->rq) !=
        MPI_SUCCESS) {
        pl_error("MPI_Iallgatherv of a gradient bucket (%zu floats) failed", b->n);
        return PL_EMPI;
    }
    b->state = DP_GATHER;
    return PL_OK;
}

/* Move the buckets on as far as they can go without waiting: the scatters summed and their
 * gathers posted in start order, then the posted gathers tested, oldest first (each MPI_Test
 * also drives MPI's progress of every request, the engine's too). */
static int progress(dp_reducer *r) {
    while (r->next_gather < r->nstarted) {
        int k = r->order[r->next_gather], done = 0;
        PL_MPI_CHECK(MPI_Test(&r->b[k].rq, &done, MPI_STATUS_IGNORE));
        if (!done) break;
        PL_TRY(reduce_bucket(r, k, !r->zero));
        r->next_gather++;
    }
    while (r->next_gdone < r->next_gather) {
        dp_bucket *b = &r->b[r->order[r->next_gdone]];
        if (b->state == DP_GATHER) {
            int done = 0;
            PL_MPI_CHECK(MPI_Test(&b->rq, &done, MPI_STATUS_IGNORE));
            if (!done) break;
            b->state = DP_GATHERED;
        }
        r->next_gdone++;
    }
    /* ZeRO's parameter gathers, posted by optim_step_buckets */
    while (r->pg_done < r->npg) {
        int done = 0;
        PL_MPI_CHECK(MPI_Test(&r->b[r->order[r->pg_done]].prq, &done, MPI_STATUS_IGNORE));
        if (!done) break;
        r->pg_done++;
    }
    return PL_OK;
}

/* Anything in flight (the poll's test). */
static int in_flight(const dp_reducer *r) { return r->next_gdone < r->nstarted || r->pg_done < r->npg; }

/* backend_poll.h's hook, after every compute op: MPI moves a reduction on only inside MPI
 * calls, and a rendezvous message needs both replicas to call in, so testing between the ops
 * of the backward (not only once a block) is what hides it. Nothing in flight: at once. */
static int poll_ops(void *ctx) {
    dp_reducer *r = ctx;
    /* MPICH over UCX moves a large message about 512 KB per MPI call: several calls per op */
    for (int i = 0; i < r->poll && in_flight(r); i++) {
        r->npolls++;
        PL_TRY(progress(r));
    }
    return PL_OK;
}

/* stage.h's hook: the gradient of block `layer` (or, -1, of the tensors outside the blocks,
 * but the tied wte) is final for this step. */
static int on_final(void *ctx, const stage *st, int layer) {
    dp_reducer *r = ctx;
    /* with chunks (stage_init_holder) several stages fire -1: each for the tensors in its slice */
    size_t lo = (size_t)(st->grads - r->st->grads), hi = lo + st->nparams;
    for (int k = 0; k < r->nb; k++)
        if (r->b[k].layer == layer && !r->b[k].tied && r->b[k].lo >= lo && r->b[k].lo < hi)
            PL_TRY(start_bucket(r, k));
    return progress(r);
}

/* The on_grad_final hook of one stage (or chunk), fired after its M-th weight backward. */
void dp_hook(dp_reducer *r, stage *chunk, int M) {
    chunk->on_grad_final = on_final;
    chunk->grad_ctx = r;
    chunk->w_final = M;
}

/* ZeRO-1: the optimizer keeps the moments of this replica's pieces only, bucket by bucket. */
static int shard_optimizer(dp_reducer *r, char *err, size_t errlen) {
    optim_range *pieces = malloc(sizeof *pieces * (size_t)(r->nb ? r->nb : 1));
    if (!pieces) {
        snprintf(err, errlen, "out of memory for the optimizer's shard");
        return PL_ENOMEM;
    }
    for (int k = 0; k < r->nb; k++) pieces[k] = (optim_range){r->b[k].lo + r->b[k].plo, r->b[k].pn};
    int rc = optim_shard(r->opt, pieces, r->nb, err, errlen);
    free(pieces);
    return rc;
}

/* The replicas' communicators, the buckets and their pieces, the shard (ZeRO), the hook. */
int dp_init(dp_reducer *r, stage *st, optim *opt, MPI_Comm comm, int zero, int M, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    r->comm = comm;
    r->st = st;
    r->opt = opt;
    r->zero = zero;
    r->gcomm = MPI_COMM_NULL;
    r->exact = st->exact;
    MPI_Comm_size(comm, &r->D);
    MPI_Comm_rank(comm, &r->d);
    if (MPI_Comm_dup(comm, &r->gcomm) != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Comm_dup of the replicas' communicator failed");
        return PL_EMPI;
    }
    optim_set_replica(opt, r->d, r->D);
    int rc = make_buckets(r, err, errlen);
    if (rc != PL_OK) return rc;
    r->order = malloc(sizeof(int) * (size_t)(r->nb ? r->nb : 1));
    r->terms = malloc(sizeof *r->terms * (size_t)r->D);
    if (!r->order || !r->terms) return PL_ENOMEM;
    for (int k = 0; k < r->nb; k++) {
        dp_bucket *b = &r->b[k];
        if (b->n > (size_t)0x7fffffff) {
            snprintf(err, errlen, "data parallelism: a gradient bucket of %zu floats is too large for MPI counts", b->n);
            return PL_EINVAL;
        }
        b->plo = piece_lo(b->n, r->D, r->d);
        b->pn = piece_n(b->n, r->D, r->d);
        b->recv = malloc(sizeof(float) * (b->pn * (size_t)r->D + 1));
        if (r->exact && !(b->xrecv = malloc(sizeof(pl_fx) * (b->pn * (size_t)r->D + 1)))) {
            snprintf(err, errlen, "out of memory for the exact gradient reduction's buffers");
            return PL_ENOMEM;
        }
        b->cnt = malloc(sizeof(int) * 5 * (size_t)r->D);
        if (b->cnt) {
            b->dsp = b->cnt + r->D;
            b->rcnt = b->dsp + r->D;
            b->rdsp = b->rcnt + r->D;
            b->scnt = b->rdsp + r->D;
            for (int j = 0; j < r->D; j++) {
                b->cnt[j] = (int)piece_n(b->n, r->D, j);
                b->dsp[j] = (int)piece_lo(b->n, r->D, j);
                b->scnt[j] = j == r->d ? 0 : b->cnt[j]; /* its own piece stays in place */
                b->rcnt[j] = j == r->d ? 0 : (int)b->pn;
                b->rdsp[j] = (int)(b->pn * (size_t)j);
            }
        }
        if (!b->recv || !b->cnt) {
            snprintf(err, errlen, "out of memory for the gradient reduction buffers");
            return PL_ENOMEM;
        }
    }
    if (zero) PL_TRY(shard_optimizer(r, err, errlen));
    r->moment_floats = opt->nmoment;
    if (!st->holds_chunks) dp_hook(r, st, M);
    /* PIPELM_DP_POLL=N: N tests after each op (0: only at the blocks' ends, the benchmark's "before") */
    const char *pe = hooks_env("PIPELM_DP_POLL");
    r->poll = pe && pe[0] ? atoi(pe) : DP_POLL_DEFAULT;
    if (r->poll < 0) r->poll = 0;
    if (r->poll) backend_poll_set(poll_ops, r);
    /* PIPELM_DP_DEFER=0: every gather waited for in dp_finish (the benchmark's "before") */
    const char *de = hooks_env("PIPELM_DP_DEFER");
    r->defer = !(de && strcmp(de, "0") == 0);
    return PL_OK;
}

/* Unhook, unmap, free (the communicator only when the peers are known to be here too). */
void dp_free(dp_reducer *r, int free_comm) {
    if (r->poll) backend_poll_set(NULL, NULL);
    /* agreed (a NaN seen after dp_finish): the peers have the same gathers posted, so they end */
    comm_what w = {"the data-parallel reduction of the gradients", -1, -1, -1};
    for (int k = 0; free_comm && r->b && k < r->nb; k++) {
        if (r->b[k].rq != MPI_REQUEST_NULL) comm_wait(&r->b[k].rq, &w);
        if (r->b[k].prq != MPI_REQUEST_NULL) comm_wait(&r->b[k].prq, &w);
    }
    if (r->st && r->st->grad_ctx == r) {
        r->st->on_grad_final = NULL;
        r->st->grad_ctx = NULL;
    }
    for (int k = 0; r->b && k < r->nb; k++) {
        if (r->b[k].host) r->st->be->unmap(r->b[k].host, r->st->grads + r->b[k].lo, r->b[k].n * sizeof(float),
                                           PL_MAP_READ | PL_MAP_WRITE);
        free(r->b[k].recv);
        free(r->b[k].xrecv);
        free(r->b[k].cnt);
    }
    free(r->b);
    free(r->order);
    free(r->terms);
    if (r->gcomm != MPI_COMM_NULL && free_comm) MPI_Comm_free(&r->gcomm);
    memset(r, 0, sizeof *r);
}

/* Every bucket's gradients back into backend memory (a no-op on host backends), every bucket
 * idle again: nothing in flight, so the poll stops. Returns rc, or the unmap's failure. */
static int release_buckets(dp_reducer *r, int rc) {
    r->nstarted = r->next_gather = r->next_gdone = 0;
    r->npg = r->pg_done = 0;
    r->deferred = 0;
    for (int k = 0; k < r->nb; k++) {
        dp_bucket *b = &r->b[k];
        b->state = DP_IDLE;
        if (!b->host) continue;
        int r2 = r->st->be->unmap(b->host, r->st->grads + b->lo, b->n * sizeof(float), PL_MAP_READ | PL_MAP_WRITE);
        b->host = NULL;
        if (rc == PL_OK && r2 != PL_OK) {
            pl_error("backend %s: unmapping a gradient bucket: %s", r->st->be->name, stage_error(r->st));
            rc = PL_EBACKEND;
        }
    }
    return rc;
}

/* Start what is left, sum every bucket in start order, gather where wanted; then either wait
 * for the gathers and unmap, or (a host backend, no whole gradients wanted before the update)
 * leave the gathers in flight for dp_optim_step, which waits for each bucket's just before
 * updating it: the last buckets' gathers hide behind the first buckets' AdamW. */
int dp_finish(dp_reducer *r, int full) {
    double t0 = pl_now();
    int rc = PL_OK, wanted = full;
    for (int k = 0; k < r->nb; k++) /* what the backward left unfinished, for the benchmark */
        if (r->b[k].state != DP_GATHERED && r->b[k].state != DP_DONE) r->pending_floats += (double)r->b[k].n;
    for (int k = 0; k < r->nb && rc == PL_OK; k++) rc = start_bucket(r, k); /* the tied wte, and any not started */
    comm_what w = {"the data-parallel reduction of the gradients", -1, -1, -1};
    full = full || !r->zero;
    /* the sums in start order; under ZeRO a piece-only sum that --dump-grads wants whole is
     * gathered after them all, in start order (the poll summed some of them already, how many
     * differs between replicas: the gathers' order on gcomm must not) */
    for (; r->next_gather < r->nstarted && rc == PL_OK; r->next_gather++) {
        int k = r->order[r->next_gather];
        rc = comm_wait(&r->b[k].rq, &w);
        if (rc == PL_OK) rc = reduce_bucket(r, k, !r->zero);
    }
    for (int i = 0; i < r->nstarted && rc == PL_OK; i++) {
        dp_bucket *b = &r->b[r->order[i]];
        if (b->state != DP_DONE || !full) continue;
        if (MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, b->host, b->cnt, b->dsp, MPI_FLOAT, r->gcomm, &b->rq) !=
            MPI_SUCCESS) rc = PL_EMPI;
        b->state = DP_GATHER;
    }
    r->deferred = rc == PL_OK && !wanted && r->st->be->host_memory && r->defer;
    if (!r->deferred) {
        for (int k = 0; k < r->nb && rc == PL_OK; k++)
            if (r->b[k].state == DP_GATHER) rc = comm_wait(&r->b[k].rq, &w);
        rc = release_buckets(r, rc);
    }
    r->t_hidden_wait += pl_now() - t0;
    return rc;
}

/* The timers and counters of the reductions and the ZeRO gather start again from zero. */
void dp_reset_timers(dp_reducer *r) {
    r->t_hidden_wait = r->t_gather = r->pending_floats = 0;
    r->npolls = 0;
}

/* Each tensor's squared gradient norm over this replica's pieces. */
int dp_grad_sumsq(const dp_reducer *r, double *sq) {
    const stage *st = r->st;
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        sq[i] = 0.0;
        for (int k = 0; k < r->nb; k++) {
            size_t lo, n;
            if (!optim_overlap(t, r->b[k].lo + r->b[k].plo, r->b[k].pn, &lo, &n)) continue;
            double s;
            PL_TRY(st->be->sumsq(st->grads + lo, n, &s));
            sq[i] += s;
        }
    }
    return PL_OK;
}

/* The optimizer's step when dp_finish did not leave the gathers in flight: optim_step (under
 * ZeRO on this replica's shard only), then (ZeRO) the parameters' all-gather. */
static int optim_step_whole(dp_reducer *r, int step, double lr, double norm) {
    PL_TRY(optim_step(r->opt, step, lr, norm));
    if (!r->zero) return PL_OK;
    stage *st = r->st;
    const backend *be = st->be;
    /* every replica's pieces of the parameters to every replica */
    double t0 = pl_now();
    comm_what w = {"the ZeRO-1 all-gather of the parameters", -1, -1, -1};
    void *host = NULL;
    PL_TRY(be->map(&host, st->params, st->nparams * sizeof(float), PL_MAP_READ | PL_MAP_WRITE));
    int rc = PL_OK;
    for (int k = 0; k < r->nb && rc == PL_OK; k++) {
        dp_bucket *b = &r->b[k];
        if (MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, (float *)host + b->lo, b->cnt, b->dsp, MPI_FLOAT,
                            r->comm, &b->rq) != MPI_SUCCESS) rc = PL_EMPI;
    }
    for (int k = 0; k < r->nb; k++)
        if (rc == PL_OK) rc = comm_wait(&r->b[k].rq, &w);
    int r2 = be->unmap(host, st->params, st->nparams * sizeof(float), PL_MAP_READ | PL_MAP_WRITE);
    r->t_gather += pl_now() - t0;
    return rc != PL_OK ? rc : r2;
}

/* Bucket by bucket in start order (a host backend, the gathers left in flight by dp_finish):
 * wait for its gradient gather, clip and update it (under ZeRO this replica's piece only) and
 * (ZeRO) post its parameters' all-gather; the poll after each AdamW call moves the later
 * gathers on. The same AdamW calls on the same elements as optim_step: the same bits. */
static int optim_step_buckets(dp_reducer *r, int step, double lr, double norm) {
    comm_what wg = {"the data-parallel reduction of the gradients", -1, -1, -1};
    comm_what wp = {"the ZeRO-1 all-gather of the parameters", -1, -1, -1};
    stage *st = r->st;
    /* the gathers write every replica's pieces of the parameters: through a host view of all
     * of them, so that the backend sees the write (a cache of weight copies drops them) */
    void *view = NULL;
    int rc = r->zero ? st->be->map(&view, st->params, st->nparams * sizeof(float), PL_MAP_READ | PL_MAP_WRITE) : PL_OK;
    float *params = view;
    for (int i = 0; i < r->nstarted && rc == PL_OK; i++) {
        dp_bucket *b = &r->b[r->order[i]];
        if (b->state == DP_GATHER) {
            double t0 = pl_now();
            rc = comm_wait(&b->rq, &wg);
            r->t_hidden_wait += pl_now() - t0;
            b->state = DP_GATHERED;
            if (rc != PL_OK) break;
        }
        size_t lo = r->zero ? b->lo + b->plo : b->lo, n = r->zero ? b->pn : b->n;
        rc = optim_step_range(r->opt, lo, n, step, lr, norm);
        if (rc != PL_OK || !r->zero) continue;
        if (MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, params + b->lo, b->cnt, b->dsp, MPI_FLOAT, r->comm, &b->prq) !=
            MPI_SUCCESS) {
            pl_error("MPI_Iallgatherv of a parameter bucket (%zu floats) failed", b->n);
            rc = PL_EMPI;
        }
        r->npg = i + 1;
    }
    double t0 = pl_now();
    for (int i = 0; i < r->npg && rc == PL_OK; i++) rc = comm_wait(&r->b[r->order[i]].prq, &wp);
    r->t_gather += pl_now() - t0;
    if (view) {
        int r2 = st->be->unmap(view, st->params, st->nparams * sizeof(float), PL_MAP_READ | PL_MAP_WRITE);
        if (rc == PL_OK) rc = r2;
    }
    return release_buckets(r, rc);
}

/* The optimizer's step over the replicas' reduced gradients (see dp.h). */
int dp_optim_step(dp_reducer *r, int step, double lr, double norm) {
    return r->deferred ? optim_step_buckets(r, step, lr, norm) : optim_step_whole(r, step, lr, norm);
}

/* Whole-size moments from the optimizer, this replica's pieces in place, then (gather)
 * every replica's pieces all-gathered into them, bucket by bucket. */
int dp_moments_full(dp_reducer *r, int gather) {
    if (!r->zero) return PL_OK;
    stage *st = r->st;
    const backend *be = st->be;
    PL_TRY(optim_unshard(r->opt, gather));
    if (!gather) return PL_OK;
    float *full[2] = {optim_buffer(r->opt, OPTIM_M), optim_buffer(r->opt, OPTIM_V)};
    comm_what w = {"the ZeRO-1 all-gather of the moments for a checkpoint", -1, -1, -1};
    int rc = PL_OK;
    for (int s = 0; s < 2 && rc == PL_OK; s++) {
        void *host = NULL;
        PL_TRY(be->map(&host, full[s], st->nparams * sizeof(float), PL_MAP_READ | PL_MAP_WRITE));
        for (int k = 0; k < r->nb && rc == PL_OK; k++) {
            dp_bucket *b = &r->b[k];
            if (MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, (float *)host + b->lo, b->cnt, b->dsp, MPI_FLOAT,
                                r->comm, &b->rq) != MPI_SUCCESS) rc = PL_EMPI;
            if (rc == PL_OK) rc = comm_wait(&b->rq, &w);
        }
        int r2 = be->unmap(host, full[s], st->nparams * sizeof(float), PL_MAP_READ | PL_MAP_WRITE);
        if (rc == PL_OK) rc = r2;
    }
    return rc;
}

/* The optimizer folds the whole-size moments back into its shard. */
int dp_moments_pieces(dp_reducer *r) {
    if (!r->zero) return PL_OK;
    return optim_reshard(r->opt);
}
