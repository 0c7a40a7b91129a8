/*
 * tp.c — tensor parallelism (tp.h): the deterministic sum of the blocks' partial products
 * over the TP ranks, the sum of replicated kv heads' gradients, the gradient norm's owned
 * shares, and the whole-shaped copy of a TP rank's stage that checkpoints and model files
 * read and write. Backend memory is reached through map / unmap, as dp.c does.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <limits.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/comm.h"
#include "util/common.h"
#include "util/crc32c.h"
#include "parallel/tp.h"

/* The group over comm: its size and this rank's index; nothing collective. */
int tp_init(tp_group *g, MPI_Comm comm, const backend *be, int fail_step, int fail_wrank, char *err,
            size_t errlen) {
    memset(g, 0, sizeof *g);
    g->comm = comm;
    g->be = be;
    g->fail_step = fail_step;
    g->fail_wrank = fail_wrank;
    MPI_Comm_size(comm, &g->T);
    MPI_Comm_rank(comm, &g->t);
    (void)err; (void)errlen;
    return PL_OK;
}

/* The gather buffer. */
void tp_free(tp_group *g) {
    free(g->all);
    g->all = NULL;
    g->cap = 0;
}

/* Zero the timers bench reads. */
void tp_reset_timers(tp_group *g) {
    g->t_sum = 0.0;
    g->nsum = 0;
    g->floats = 0.0;
}

/* Room for T parts of n floats in g->all. */
static int reserve(tp_group *g, size_t n) {
    if (n <= g->cap) return PL_OK;
    float *p = realloc(g->all, (size_t)g->T * n * sizeof(float));
    if (!p) {
        pl_error("out of memory for the TP all-reduce (%zu floats x %d ranks)", n, g->T);
        return PL_ENOMEM;
    }
    g->all = p;
    g->cap = n;
    return PL_OK;
}

/* Gather n floats of every TP rank (host src) into g->all (rank r's at r n), under the
 * watchdog; what names the collective. */
static int gather_parts(tp_group *g, const float *src, size_t n, const char *what) {
    if (n > INT_MAX) {
        pl_error("%s: %zu floats exceed MPI's count", what, n);
        return PL_EINVAL;
    }
    PL_TRY(reserve(g, n));
    MPI_Request rq;
    PL_MPI_CHECK(MPI_Iallgather(src, (int)n, MPI_FLOAT, g->all, (int)n, MPI_FLOAT, g->comm, &rq));
    comm_what w = {what, -1, -1, comm_step};
    return comm_wait(&rq, &w);
}

static const char *const phase_name[2] = {"forward", "backward (input part)"};

/* The blocks' hook: gather the T parts of a backend buffer and add them in rank order. */
int tp_sum(void *ctx, float *buf, size_t n, int phase) {
    tp_group *g = ctx;
    const backend *be = g->be;
    const char *what = phase == TP_PHASE_BWD ? "the TP all-reduce of the backward (input part)"
                                             : "the TP all-reduce of the forward";
    if (g->fail_step >= 1 && comm_step == g->fail_step && g->fail_kill) { /* test-only: --fail-at tp-kill */
        /* the gather posted, so the peers are inside this all-reduce with this rank; then the
         * rank dies as a crashed process or a lost node does, with nothing flushed or sent */
        MPI_Request rq;
        PL_TRY(reserve(g, n));
        PL_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_FLOAT, g->all, (int)n, MPI_FLOAT, g->comm, &rq));
        fprintf(stderr, "pipelm: rank %d: note: --fail-at tp-kill: killing this rank (SIGKILL) inside the TP all-reduce "
                "of the %s, step %ld\n", g->fail_wrank, phase_name[phase == TP_PHASE_BWD], comm_step);
        fflush(stderr);
        raise(SIGKILL);
    }
    if (g->fail_step >= 1 && comm_step == g->fail_step) { /* test-only: --fail-at tp */
        pl_error("injected failure (--fail-rank %d --fail-step %d --fail-at tp) inside a TP all-reduce of the %s, "
                 "step %ld", g->fail_wrank, g->fail_step, phase_name[phase == TP_PHASE_BWD], comm_step);
        g->fail_step = -1;
        return PL_EPEER;
    }
    double t0 = pl_now();
    void *h = NULL;
    size_t bytes = n * sizeof(float);
    PL_TRY(be->map(&h, buf, bytes, PL_MAP_READ));
    int rc = gather_parts(g, h, n, what);
    int r2 = be->unmap(h, buf, bytes, PL_MAP_READ);
    PL_TRY(rc);
    PL_TRY(r2);
    PL_TRY(be->map(&h, buf, bytes, PL_MAP_WRITE));
    float *out = h;
    const float *p0 = g->all, *p1 = g->all + n;
    /* rank order: ((p_0 + p_1) + p_2) + ..., the same bits on every rank */
    for (size_t i = 0; i < n; i++) out[i] = p0[i] + p1[i];
    for (int r = 2; r < g->T; r++) {
        const float *pr = g->all + (size_t)r * n;
        for (size_t i = 0; i < n; i++) out[i] += pr[i];
    }
    PL_TRY(be->unmap(h, buf, bytes, PL_MAP_WRITE));
    g->t_sum += pl_now() - t0;
    g->nsum++;
    g->floats += (double)n;
    return PL_OK;
}

/* The head's hook: a host array's sum (rank order) or maximum over the TP ranks. */
int tp_host_reduce(void *ctx, float *host, size_t n, int op) {
    tp_group *g = ctx;
    double t0 = pl_now();
    PL_TRY(gather_parts(g, host, n, op == TP_HOST_MAX ? "the TP maximum of the head's logits"
                                                       : "the TP sum of the head's softmax"));
    for (size_t i = 0; i < n; i++) { /* rank order: the same bits on every rank */
        float v = g->all[i];
        for (int r = 1; r < g->T; r++) {
            float x = g->all[(size_t)r * n + i];
            v = op == TP_HOST_MAX ? (x > v ? x : v) : v + x;
        }
        host[i] = v;
    }
    g->t_sum += pl_now() - t0;
    g->nsum++;
    g->floats += (double)n;
    return PL_OK;
}

/* The whole config of a stage's TP config. */
static model_config whole_cfg(const stage *st) {
    model_config c = st->cfg;
    c.tp = c.tpr = 0;
    return c;
}

/* The replicated kv rows of tensor t: 1 and their floats [*lo, *lo + *n) inside the tensor
 * (the k and v segments, contiguous), 0 when t has none (NKV >= T, or not a qkv tensor). */
static int kv_rows(const tp_group *g, const stage *st, const param_tensor *t, size_t *lo, size_t *n) {
    if (st->cfg.NKV >= g->T) return 0;
    model_config full = whole_cfg(st);
    tp_slice s;
    model_tp_slice(&full, g->T, g->t, t, &s);
    if (s.mode != TPS_ROWS || s.nseg != 3) return 0;
    *lo = (size_t)s.n[0] * s.cols;
    *n = (size_t)(s.n[1] + s.n[2]) * s.cols;
    return 1;
}

/* Shared kv heads: their rows' gradients packed, gathered, summed over the sharing ranks. */
int tp_kv_grads(tp_group *g, stage *st) {
    if (st->cfg.NKV >= g->T) return PL_OK;
    size_t tot = 0, lo, n;
    for (int i = 0; i < st->ntensors; i++)
        if (kv_rows(g, st, &st->tensors[i], &lo, &n)) tot += n;
    if (!tot) return PL_OK;
    float *pack = malloc(tot * sizeof(float));
    if (!pack) return PL_ENOMEM;
    const backend *be = st->be;
    size_t k = 0;
    int rc = PL_OK;
    for (int i = 0; i < st->ntensors && rc == PL_OK; i++)
        if (kv_rows(g, st, &st->tensors[i], &lo, &n)) {
            rc = be->to_host(pack + k, st->grads + st->tensors[i].offset + lo, n * sizeof(float));
            k += n;
        }
    if (rc == PL_OK) rc = gather_parts(g, pack, tot, "the TP sum of the shared key/value heads' gradients");
    if (rc == PL_OK) {
        int share = g->T / st->cfg.NKV, r0 = g->t / share * share; /* the ranks sharing this rank's kv head */
        for (size_t i = 0; i < tot; i++) {
            float s = g->all[(size_t)r0 * tot + i];
            for (int r = r0 + 1; r < r0 + share; r++) s += g->all[(size_t)r * tot + i];
            pack[i] = s;
        }
        k = 0;
        for (int i = 0; i < st->ntensors && rc == PL_OK; i++)
            if (kv_rows(g, st, &st->tensors[i], &lo, &n)) {
                rc = be->from_host(st->grads + st->tensors[i].offset + lo, pack + k, n * sizeof(float));
                k += n;
            }
    }
    free(pack);
    return rc;
}

/* The squared norm of the shared kv rows inside the given ranges, per tensor. */
int tp_kv_sumsq(const tp_group *g, const stage *st, const optim_range *r, int nr, double *kvsq) {
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        size_t lo, n;
        kvsq[i] = 0.0;
        if (!kv_rows(g, st, t, &lo, &n)) continue;
        param_tensor kt = *t; /* the kv rows as a tensor of their own, for optim_overlap */
        kt.offset += lo;
        kt.numel = n;
        for (int k = 0; k < nr; k++) {
            size_t xlo, xn;
            double s;
            if (!optim_overlap(&kt, r[k].lo, r[k].n, &xlo, &xn)) continue;
            PL_TRY(st->be->sumsq(st->grads + xlo, xn, &s));
            kvsq[i] += s;
        }
    }
    return PL_OK;
}

/* Each tensor's norm share this TP rank owns (replicated: rank 0; shared kv rows: the first). */
void tp_owned_sumsq(const tp_group *g, const stage *st, double *sq, const double *kvsq) {
    model_config full = whole_cfg(st);
    int share = st->cfg.NKV < g->T ? g->T / st->cfg.NKV : 1;
    for (int i = 0; i < st->ntensors; i++) {
        tp_slice s;
        model_tp_slice(&full, g->T, g->t, &st->tensors[i], &s);
        if (s.mode == TPS_REPL && g->t != 0) sq[i] = 0.0;
        else if (kvsq && g->t % share != 0) sq[i] -= kvsq[i]; /* the first sharing rank counts the kv rows */
    }
}

/* The replicated tensors' CRC-32C on every TP rank, compared: *same, and the first differing
 * tensor's name (or ""). */
int tp_check_replicas(tp_group *g, const stage *st, int *same, char *name, size_t len) {
    int n = st->ntensors;
    uint32_t *mine = calloc((size_t)n, sizeof *mine), *all = calloc((size_t)n * g->T, sizeof *all);
    int rc = mine && all ? PL_OK : PL_ENOMEM;
    model_config full = whole_cfg(st);
    for (int i = 0; rc == PL_OK && i < n; i++) {
        const param_tensor *t = &st->tensors[i];
        tp_slice s;
        model_tp_slice(&full, g->T, g->t, t, &s);
        if (s.mode != TPS_REPL) continue;
        void *h = NULL;
        if ((rc = st->be->map(&h, st->params + t->offset, t->numel * sizeof(float), PL_MAP_READ)) != PL_OK) break;
        mine[i] = crc32c(h, t->numel * sizeof(float));
        rc = st->be->unmap(h, st->params + t->offset, t->numel * sizeof(float), PL_MAP_READ);
    }
    *same = 1;
    name[0] = 0;
    if (rc == PL_OK) {
        MPI_Request rq;
        comm_what w = {"the TP comparison of the replicated tensors", -1, -1, -1};
        PL_MPI_CHECK(MPI_Iallgather(mine, n, MPI_UINT32_T, all, n, MPI_UINT32_T, g->comm, &rq));
        rc = comm_wait(&rq, &w);
    }
    for (int r = 1; rc == PL_OK && r < g->T && *same; r++)
        for (int i = 0; i < n && *same; i++)
            if (all[(size_t)r * n + i] != all[i]) {
                *same = 0;
                snprintf(name, len, "%s", st->tensors[i].name);
            }
    free(mine);
    free(all);
    return rc;
}

/* Everything tp_whole_make allocated. */
void tp_whole_free(tp_whole *w) {
    if (w->have_opt) optim_free(&w->opt);
    if (w->st.be) {
        w->st.be->free(w->st.params);
        w->st.be->free(w->st.grads);
    }
    free(w->st.tensors);
    memset(w, 0, sizeof *w);
}

/* Gather one buffer (local layout, nloc floats, host view of src) of every TP rank and put
 * each rank's slices into the whole buffer dst (backend memory, the whole table's layout). */
static int gather_into(tp_group *g, const stage *st, const float *src, size_t nloc, const tp_whole *w,
                       float *dst, const char *what) {
    const backend *be = st->be;
    void *h = NULL;
    PL_TRY(be->map(&h, (void *)src, nloc * sizeof(float), PL_MAP_READ));
    int rc = gather_parts(g, h, nloc, what);
    int r2 = be->unmap(h, (void *)src, nloc * sizeof(float), PL_MAP_READ);
    PL_TRY(rc);
    PL_TRY(r2);
    size_t nwhole = w->st.nparams;
    PL_TRY(be->map(&h, dst, nwhole * sizeof(float), PL_MAP_WRITE));
    float *out = h;
    model_config full = whole_cfg(st);
    for (int r = g->T - 1; r >= 0; r--) /* rank 0's last: a replicated tensor holds its values */
        for (int i = 0; i < st->ntensors; i++) {
            tp_slice s;
            model_tp_slice(&full, g->T, r, &st->tensors[i], &s);
            if (s.mode == TPS_REPL && r != 0) continue;
            model_tp_copy(&s, out + w->st.tensors[i].offset, g->all + (size_t)r * nloc + st->tensors[i].offset, 0);
        }
    return be->unmap(h, dst, nwhole * sizeof(float), PL_MAP_WRITE);
}

/* The whole-shaped table and buffers, then the asked-for gathers. */
int tp_whole_make(tp_group *g, const stage *st, const optim *opt, int what, int want_opt, int d, int D,
                  tp_whole *w, char *err, size_t errlen) {
    memset(w, 0, sizeof *w);
    model_config full = whole_cfg(st);
    stage *ws = &w->st;
    ws->cfg = full;
    ws->arch = st->arch;
    ws->l0 = st->l0;
    ws->l1 = st->l1;
    ws->nb = st->nb;
    ws->has_embed = st->has_embed;
    ws->has_head = st->has_head;
    ws->Bm = st->Bm;
    ws->T = st->T;
    ws->N = st->N;
    ws->tensors = calloc((size_t)st->ntensors, sizeof *ws->tensors);
    if (!ws->tensors) {
        snprintf(err, errlen, "out of memory for the whole tensor table of --tp");
        return PL_ENOMEM;
    }
    size_t off = 0;
    for (int i = 0; i < st->ntensors; i++) { /* the local table with whole shapes */
        const param_tensor *t = &st->tensors[i];
        tp_slice s;
        model_tp_slice(&full, g->T, g->t, t, &s);
        model_add_tensor(ws->tensors, &ws->ntensors, &off, t->kind, t->layer, t->ndim, s.rows, s.cols);
        param_tensor *u = &ws->tensors[i];
        u->decay = t->decay;
        u->part = t->part;
        u->row = t->row;
        u->tied_copy = t->tied_copy;
    }
    ws->nparams = off;
    const backend *be = st->be;
    ws->be = be;
    void *p = NULL, *q = NULL;
    int rc = be->alloc(&p, off * sizeof(float));
    ws->params = p;
    if (rc == PL_OK) rc = be->alloc(&q, off * sizeof(float));
    ws->grads = q;
    if (rc == PL_OK) rc = be->zero(ws->params, off * sizeof(float));
    if (rc == PL_OK) rc = be->zero(ws->grads, off * sizeof(float));
    if (rc != PL_OK) {
        snprintf(err, errlen, "backend %s: the whole copy of the stage for --tp (%zu floats): %s", be->name, off,
                 be->error ? be->error() : "");
        tp_whole_free(w);
        return rc;
    }
    if (want_opt) {
        optim_hparams h = opt ? opt->h : (optim_hparams){0};
        rc = optim_init(&w->opt, ws, &h, err, errlen);
        if (rc != PL_OK) { tp_whole_free(w); return rc; }
        w->have_opt = 1;
        optim_set_replica(&w->opt, d * g->T + g->t, D * g->T);
        if (rc == PL_OK) rc = be->zero(w->opt.m, off * sizeof(float));
        if (rc == PL_OK) rc = be->zero(w->opt.v, off * sizeof(float));
    }
    const char *wh = "the TP gather of the whole tensors";
    if (rc == PL_OK && (what & TPW_PARAMS)) rc = gather_into(g, st, st->params, st->nparams, w, ws->params, wh);
    if (rc == PL_OK && (what & TPW_GRADS)) rc = gather_into(g, st, st->grads, st->nparams, w, ws->grads, wh);
    if (rc == PL_OK && (what & TPW_MOMENTS) && opt && w->have_opt) {
        rc = gather_into(g, st, optim_buffer(opt, OPTIM_M), st->nparams, w, w->opt.m, wh);
        if (rc == PL_OK) rc = gather_into(g, st, optim_buffer(opt, OPTIM_V), st->nparams, w, w->opt.v, wh);
    }
    if (rc != PL_OK) {
        snprintf(err, errlen, "the TP gather of the whole tensors failed");
        tp_whole_free(w);
    }
    return rc;
}

/* Cut this rank's slices of one whole buffer (src) into a local one (dst), backend memory. */
static int put_one(const tp_group *g, const stage *st, const tp_whole *w, float *src, float *dst) {
    const backend *be = st->be;
    void *hs = NULL, *hd = NULL;
    size_t nw = w->st.nparams * sizeof(float), nl = st->nparams * sizeof(float);
    PL_TRY(be->map(&hs, src, nw, PL_MAP_READ));
    int rc = be->map(&hd, dst, nl, PL_MAP_WRITE);
    if (rc == PL_OK) {
        model_config full = whole_cfg(st);
        for (int i = 0; i < st->ntensors; i++) {
            tp_slice s;
            model_tp_slice(&full, g->T, g->t, &st->tensors[i], &s);
            model_tp_copy(&s, (float *)hs + w->st.tensors[i].offset, (float *)hd + st->tensors[i].offset, 1);
        }
        rc = be->unmap(hd, dst, nl, PL_MAP_WRITE);
    }
    int r2 = be->unmap(hs, src, nw, PL_MAP_READ);
    return rc != PL_OK ? rc : r2;
}

/* This rank's slices of the whole copy back into the stage and the optimizer. */
int tp_whole_put(const tp_group *g, tp_whole *w, stage *st, optim *opt, int what) {
    if (what & TPW_PARAMS) PL_TRY(put_one(g, st, w, w->st.params, st->params));
    if ((what & TPW_MOMENTS) && opt && w->have_opt) {
        PL_TRY(put_one(g, st, w, w->opt.m, optim_buffer(opt, OPTIM_M)));
        PL_TRY(put_one(g, st, w, w->opt.v, optim_buffer(opt, OPTIM_V)));
    }
    return PL_OK;
}
