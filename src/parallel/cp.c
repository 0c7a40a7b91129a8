/*
 * cp.c — context parallelism (cp.h): the attention over the C ranks' chunks of a sequence.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include "backend/backend_host.h"
#include "backend/cpu/cpu_attention.h"
#include "parallel/comm.h"
#include "parallel/cp.h"
#include "util/common.h"

int cp_init(cp_group *g, MPI_Comm comm, int ring, int fail_step, int fail_kill, int wrank, char *err, size_t errlen) {
    (void)err;
    (void)errlen;
    memset(g, 0, sizeof *g);
    g->comm = comm;
    MPI_Comm_size(comm, &g->C);
    MPI_Comm_rank(comm, &g->c);
    g->wrank = wrank;
    g->fail_step = fail_step;
    g->fail_kill = fail_kill;
    g->ring = ring;
    g->prev = (g->c + g->C - 1) % g->C;
    g->next = (g->c + 1) % g->C;
    MPI_Group cg, wg;
    int in[2] = {g->prev, g->next}, out[2] = {-1, -1};
    if (MPI_Comm_group(comm, &cg) == MPI_SUCCESS && MPI_Comm_group(MPI_COMM_WORLD, &wg) == MPI_SUCCESS) {
        MPI_Group_translate_ranks(cg, 2, in, wg, out);
        MPI_Group_free(&cg);
        MPI_Group_free(&wg);
    }
    g->wprev = out[0], g->wnext = out[1];
    return PL_OK;
}

void cp_free(cp_group *g) {
    free(g->all);
    free(g->seq);
    free(g->dkv);
    free(g->send);
    g->all = g->seq = g->dkv = g->send = NULL;
    for (int i = 0; i < 2; i++) {
        free(g->blk[i]);
        free(g->dblk[i]);
        g->blk[i] = g->dblk[i] = NULL;
    }
    free(g->tout);
    free(g->tstate);
    g->tout = g->tstate = NULL;
}

/* *buf holds at least n floats. */
static int reserve(float **buf, size_t *cap, size_t n) {
    if (*cap >= n) return PL_OK;
    float *p = realloc(*buf, sizeof(float) * n);
    if (!p) {
        pl_error("context parallelism: out of memory for %zu floats of scratch", n);
        return PL_ENOMEM;
    }
    *buf = p;
    *cap = n;
    return PL_OK;
}

/* The position of CP rank r's chunk k (0 or 1) in the whole sequence, in chunks of cs rows. */
static int chunk_pos(int C, int r, int k, int cs) { return (k == 0 ? r : 2 * C - 1 - r) * cs; }

void cp_local_tokens(const int *whole, int *local, int B, int T, int C, int c) {
    int Tl = T / C, cs = Tl / 2;
    for (int b = 0; b < B; b++)
        for (int k = 0; k < 2; k++)
            memcpy(local + (size_t)b * Tl + (size_t)k * cs, whole + (size_t)b * T + chunk_pos(C, c, k, cs),
                   sizeof(int) * cs);
}

/* One thread per product while OpenMP splits the tiles (the pthread flavour of OpenBLAS is
 * told, as the cpu backend's attention does). */
static int blas_one(void) {
    int n = openblas_get_num_threads();
    if (openblas_get_parallel() != 1 || n <= 1) return 0;
    openblas_set_num_threads(1);
    return n;
}
static void blas_back(int n) {
    if (n) openblas_set_num_threads(n);
}

static const char *const phase_name[2] = {"forward", "backward"};

/* Test-only (--fail-at cp / cp-kill): fail or die on entering the exchange of this step. */
static int injected(cp_group *g, int phase, MPI_Request *rq, size_t n) {
    if (g->fail_step < 1 || comm_step != g->fail_step) return PL_OK;
    if (g->fail_kill) { /* the gather posted (the ring: the peers wait for this rank's block) */
        if (!g->ring) PL_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_FLOAT, g->all, (int)n, MPI_FLOAT, g->comm, rq));
        fprintf(stderr, "pipelm: rank %d: note: --fail-at cp-kill: killing this rank (SIGKILL) inside the CP "
                "exchange of the keys and values, %s, step %ld\n", g->wrank, phase_name[phase], comm_step);
        fflush(stderr);
        raise(SIGKILL);
    }
    pl_error("injected failure (--fail-rank %d --fail-step %d --fail-at cp) inside the CP exchange of the keys and "
             "values, %s, step %ld", g->wrank, g->fail_step, phase_name[phase], comm_step);
    g->fail_step = -1;
    return PL_EPEER;
}

/* Every CP rank's qkv rows (B, T, W) into g->seq (B, C T, W) in sequence order. */
static int gather_rows(cp_group *g, const float *qkv, int B, int T, int W, int phase) {
    size_t n = (size_t)B * T * W;
    int C = g->C, cs = T / 2;
    if (n * C > INT_MAX) {
        pl_error("context parallelism: %zu floats of gathered rows are more than one MPI call takes (use --cp-comm "
                 "ring)", n * C);
        return PL_EINVAL;
    }
    PL_TRY(reserve(&g->all, &g->cap_all, n * C));
    PL_TRY(reserve(&g->seq, &g->cap_seq, n * C));
    MPI_Request rq = MPI_REQUEST_NULL;
    PL_TRY(injected(g, phase, &rq, n));
    double t0 = pl_now();
    PL_MPI_CHECK(MPI_Iallgather(qkv, (int)n, MPI_FLOAT, g->all, (int)n, MPI_FLOAT, g->comm, &rq));
    comm_what w = {phase ? "the CP all-gather of the keys and values (backward)"
                         : "the CP all-gather of the keys and values (forward)", -1, -1, -1};
    PL_TRY(comm_wait(&rq, &w));
    g->t_comm += pl_now() - t0;
    for (int r = 0; r < C; r++)
        for (int b = 0; b < B; b++)
            for (int k = 0; k < 2; k++)
                memcpy(g->seq + ((size_t)b * C * T + chunk_pos(C, r, k, cs)) * W,
                       g->all + (((size_t)r * B + b) * T + (size_t)k * cs) * W, sizeof(float) * cs * W);
    return PL_OK;
}

/* The span of local chunk k's queries against the gathered sequence. */
static cpu_att_span chunk_span(const cp_group *g, const float *qkv, float *att, int B, int T, int NH, int NKV, int HS,
                               int k) {
    int W = (NH + 2 * NKV) * HS, cs = T / 2;
    cpu_att_span s = {.B = B, .NH = NH, .NKV = NKV, .HS = HS, .nq = cs, .qpos = chunk_pos(g->C, g->c, k, cs),
                      .q = qkv + (size_t)k * cs * W, .kv = g->seq, .q_seq = (size_t)T * W,
                      .kv_seq = (size_t)g->C * T * W, .out_seq = (size_t)T * NH * HS,
                      .st_bh = (size_t)T * (HS + 1), .O = att + (size_t)k * cs * HS,
                      .lse = att + (size_t)T * HS + (size_t)k * cs};
    return s;
}

/* ---- the ring: K/V blocks passed to the next CP rank while the tiles run ---------------- */

enum { TAG_KV = 4001, TAG_DKV = 4002 };

/* Post the receive of the previous rank's block into rbuf and the send of sbuf to the next. */
static int ring_post(cp_group *g, const float *sbuf, float *rbuf, size_t n, int tag, MPI_Request rq[2]) {
    if (n > INT_MAX) {
        pl_error("context parallelism: a block of %zu floats is more than one MPI message takes (lower --batch or "
                 "--microbatches' sequences, or raise --cp)", n);
        return PL_EINVAL;
    }
    PL_MPI_CHECK(MPI_Irecv(rbuf, (int)n, MPI_FLOAT, g->prev, tag, g->comm, &rq[0]));
    PL_MPI_CHECK(MPI_Isend(sbuf, (int)n, MPI_FLOAT, g->next, tag, g->comm, &rq[1]));
    return PL_OK;
}

/* Wait for a ring_post under the watchdog; the time is the exchange's exposed part. */
static int ring_wait(cp_group *g, MPI_Request rq[2], const char *what) {
    double t0 = pl_now();
    comm_what w = {what, g->wprev, -1, -1};
    PL_TRY(comm_wait(&rq[0], &w));
    w.peer = g->wnext;
    PL_TRY(comm_wait(&rq[1], &w));
    g->t_comm += pl_now() - t0;
    return PL_OK;
}

/* The pair (local query chunk kq, chunk kk of the block of rank r, rows at blk): the span of
 * kq's queries against that chunk's cs keys, the query positions relative to the chunk's
 * first; 0 when the chunk lies wholly after the queries. */
static int pair_span(const cp_group *g, cpu_att_span *s, const float *qkv, const float *blk, int B, int T, int NH,
                     int NKV, int HS, int r, int kq, int kk) {
    int W = (NH + 2 * NKV) * HS, cs = T / 2;
    int qp = chunk_pos(g->C, g->c, kq, cs), kp = chunk_pos(g->C, r, kk, cs);
    if (kp > qp) return 0;
    cpu_att_span z = {.B = B, .NH = NH, .NKV = NKV, .HS = HS, .nq = cs, .qpos = qp - kp, .nk = cs,
                      .q = qkv + (size_t)kq * cs * W, .kv = blk + (size_t)kk * cs * W, .q_seq = (size_t)T * W,
                      .kv_seq = (size_t)T * W, .out_seq = (size_t)T * NH * HS};
    *s = z;
    return 1;
}

/* Merge a pair's state (O, lse of cs rows per (b, h) in tstate: O then lse) into the running
 * one of local chunk kq in att: O = (O_a e^(l_a - m) + O_t e^(l_t - m)) / s, l = m + log s. */
static void merge_state(float *att, const float *ts, int BNH, int T, int HS, int kq) {
    int cs = T / 2;
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < BNH; bh++) {
        float *O = att + (size_t)bh * T * (HS + 1) + (size_t)kq * cs * HS, *L = att + (size_t)bh * T * (HS + 1) +
                   (size_t)T * HS + (size_t)kq * cs;
        const float *Ot = ts + (size_t)bh * cs * (HS + 1), *Lt = Ot + (size_t)cs * HS;
        for (int t = 0; t < cs; t++) {
            float m = L[t] > Lt[t] ? L[t] : Lt[t], wa = expf(L[t] - m), wb = expf(Lt[t] - m), s = wa + wb;
            float a = wa / s, b = wb / s;
            for (int c = 0; c < HS; c++) O[(size_t)t * HS + c] = O[(size_t)t * HS + c] * a + Ot[(size_t)t * HS + c] * b;
            L[t] = m + logf(s);
        }
    }
}

/* The block of rank r at blk against both local chunks: the first pair of a chunk writes its
 * state in att, the later ones are merged in. */
static int ring_fwd_block(cp_group *g, float *att, const float *qkv, const float *blk, int B, int T, int NH, int NKV,
                          int HS, int r, int *have) {
    int cs = T / 2;
    for (int kq = 0; kq < 2; kq++)
        for (int kk = 0; kk < 2; kk++) {
            cpu_att_span s;
            if (!pair_span(g, &s, qkv, blk, B, T, NH, NKV, HS, r, kq, kk)) continue;
            s.out = g->tout;
            s.out_seq = (size_t)cs * NH * HS;
            if (!have[kq]) { /* straight into the state */
                s.O = att + (size_t)kq * cs * HS, s.lse = att + (size_t)T * HS + (size_t)kq * cs;
                s.st_bh = (size_t)T * (HS + 1);
            } else {
                s.O = g->tstate, s.lse = g->tstate + (size_t)cs * HS, s.st_bh = (size_t)cs * (HS + 1);
            }
            PL_TRY(cpu_attention_span_fwd(&s));
            if (have[kq]) merge_state(att, g->tstate, B * NH, T, HS, kq);
            have[kq] = 1;
        }
    return PL_OK;
}

static int ring_fwd(cp_group *g, float *out, float *att, const float *qkv, int B, int T, int NH, int NKV, int HS) {
    double t0 = pl_now();
    int W = (NH + 2 * NKV) * HS, CO = NH * HS, cs = T / 2, have[2] = {0, 0}, rc = PL_OK;
    size_t n = (size_t)B * T * W;
    for (int i = 0; i < 2; i++) PL_TRY(reserve(&g->blk[i], &g->cap_blk[i], n));
    PL_TRY(reserve(&g->tout, &g->cap_tout, (size_t)B * cs * CO));
    PL_TRY(reserve(&g->tstate, &g->cap_tstate, (size_t)B * NH * cs * (HS + 1)));
    MPI_Request rq[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    PL_TRY(injected(g, 0, rq, n));
    const float *cur = qkv; /* step j holds the block of rank c - j */
    int nb = blas_one();
    for (int j = 0; j < g->C && rc == PL_OK; j++) {
        if (j < g->C - 1 && (rc = ring_post(g, cur, g->blk[j & 1], n, TAG_KV, rq)) != PL_OK) break;
        rc = ring_fwd_block(g, att, qkv, cur, B, T, NH, NKV, HS, (g->c - j + g->C) % g->C, have);
        if (rc != PL_OK) pl_error("context parallelism: the attention's forward: %s", host_error());
        if (rc == PL_OK && j < g->C - 1) rc = ring_wait(g, rq, "the CP ring's key/value block (forward)");
        cur = g->blk[j & 1];
    }
    blas_back(nb);
    PL_TRY(rc);
    #pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) /* out (B, T, NH HS) from the merged O of each head */
        for (int h = 0; h < NH; h++)
            memcpy(out + (size_t)bt * CO + (size_t)h * HS,
                   att + ((size_t)(bt / T) * NH + h) * T * (HS + 1) + (size_t)(bt % T) * HS, sizeof(float) * HS);
    g->t_att += pl_now() - t0;
    g->ncalls++;
    return PL_OK;
}

/* The block of rank r at blk, its gradients accumulating at dblk: dq of both local chunks
 * (added), dk and dv of the block's rows (added). */
static int ring_bwd_block(cp_group *g, float *dqkv, const float *dout, const float *qkv, const float *att,
                          const float *blk, float *dblk, int B, int T, int NH, int NKV, int HS, int r) {
    int W = (NH + 2 * NKV) * HS, cs = T / 2;
    for (int kq = 0; kq < 2; kq++)
        for (int kk = 0; kk < 2; kk++) {
            cpu_att_span s;
            if (!pair_span(g, &s, qkv, blk, B, T, NH, NKV, HS, r, kq, kk)) continue;
            s.O = (float *)att + (size_t)kq * cs * HS, s.lse = (float *)att + (size_t)T * HS + (size_t)kq * cs;
            s.st_bh = (size_t)T * (HS + 1);
            s.dout = dout + (size_t)kq * cs * NH * HS;
            s.dq = dqkv + (size_t)kq * cs * W, s.acc_dq = 1;
            s.dkv = dblk + (size_t)kk * cs * W;
            PL_TRY(cpu_attention_span_bwd(&s));
        }
    return PL_OK;
}

static int ring_bwd(cp_group *g, float *dqkv, const float *dout, const float *qkv, const float *att, int B, int T,
                    int NH, int NKV, int HS) {
    double t0 = pl_now();
    int W = (NH + 2 * NKV) * HS, q0 = NH * HS, rc = PL_OK;
    size_t n = (size_t)B * T * W;
    for (int i = 0; i < 2; i++) {
        PL_TRY(reserve(&g->blk[i], &g->cap_blk[i], n));
        PL_TRY(reserve(&g->dblk[i], &g->cap_dblk[i], n));
    }
    MPI_Request rq[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    PL_TRY(injected(g, 1, rq, n));
    memset(dqkv, 0, sizeof(float) * n);
    memset(g->dblk[0], 0, sizeof(float) * n); /* this rank's block's dk, dv start here and go round */
    const float *cur = qkv;
    int nb = blas_one();
    for (int j = 0; j < g->C && rc == PL_OK; j++) {
        if (j < g->C - 1 && (rc = ring_post(g, cur, g->blk[j & 1], n, TAG_KV, rq)) != PL_OK) break;
        rc = ring_bwd_block(g, dqkv, dout, qkv, att, cur, g->dblk[j & 1], B, T, NH, NKV, HS, (g->c - j + g->C) % g->C);
        if (rc != PL_OK) pl_error("context parallelism: the attention's backward: %s", host_error());
        if (rc == PL_OK && j < g->C - 1) rc = ring_wait(g, rq, "the CP ring's key/value block (backward)");
        /* the block's dk, dv on to the next rank; the one that arrives belongs to the next block
         * (after the last step: this rank's own, every rank's part added) */
        if (rc == PL_OK) rc = ring_post(g, g->dblk[j & 1], g->dblk[(j + 1) & 1], n, TAG_DKV, rq);
        if (rc == PL_OK) rc = ring_wait(g, rq, "the CP ring's key/value gradients (backward)");
        cur = g->blk[j & 1];
    }
    blas_back(nb);
    PL_TRY(rc);
    const float *mine = g->dblk[g->C & 1];
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < (size_t)B * T; i++)
        memcpy(dqkv + i * W + q0, mine + i * W + q0, sizeof(float) * (W - q0));
    g->t_att += pl_now() - t0;
    g->ncalls++;
    return PL_OK;
}

int cp_attention_fwd(void *ctx, float *out, float *att, const float *qkv, int B, int T, int NH, int NKV, int HS) {
    cp_group *g = ctx;
    if (g->ring) return ring_fwd(g, out, att, qkv, B, T, NH, NKV, HS);
    double t0 = pl_now();
    int W = (NH + 2 * NKV) * HS, rc = PL_OK;
    PL_TRY(gather_rows(g, qkv, B, T, W, 0));
    int nb = blas_one();
    for (int k = 0; k < 2 && rc == PL_OK; k++) {
        cpu_att_span s = chunk_span(g, qkv, att, B, T, NH, NKV, HS, k);
        s.out = out + (size_t)k * (T / 2) * NH * HS;
        rc = cpu_attention_span_fwd(&s);
    }
    blas_back(nb);
    g->t_att += pl_now() - t0;
    g->ncalls++;
    if (rc != PL_OK) pl_error("context parallelism: the attention's forward: %s", host_error());
    return rc;
}

/* Send each CP rank the partial key and value gradients of its rows in g->dkv (B, C T, W),
 * and add the C parts of this rank's rows into dqkv's key and value columns in rank order. */
static int return_kv_grads(cp_group *g, float *dqkv, int B, int T, int NH, int HS, int W) {
    int C = g->C, cs = T / 2, q0 = NH * HS, KW = W - q0;
    size_t part = (size_t)B * T * KW; // (B, T, KW) per rank
    PL_TRY(reserve(&g->send, &g->cap_send, part * C));
    PL_TRY(reserve(&g->all, &g->cap_all, part * C));
    for (int r = 0; r < C; r++)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                memcpy(g->send + (((size_t)r * B + b) * T + t) * KW,
                       g->dkv + ((size_t)b * C * T + chunk_pos(C, r, t / cs, cs) + t % cs) * W + q0,
                       sizeof(float) * KW);
    MPI_Request rq;
    double t0 = pl_now();
    PL_MPI_CHECK(MPI_Ialltoall(g->send, (int)part, MPI_FLOAT, g->all, (int)part, MPI_FLOAT, g->comm, &rq));
    comm_what w = {"the CP exchange of the key and value gradients (backward)", -1, -1, -1};
    PL_TRY(comm_wait(&rq, &w));
    g->t_comm += pl_now() - t0;
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < (size_t)B * T; i++) {
        float *dst = dqkv + i * W + q0; // (KW) of row i
        for (int j = 0; j < KW; j++) {
            float s = g->all[i * KW + j];
            for (int r = 1; r < C; r++) s += g->all[(size_t)r * part + i * KW + j];
            dst[j] = s;
        }
    }
    return PL_OK;
}

int cp_attention_bwd(void *ctx, float *dqkv, const float *dout, const float *qkv, const float *att, int B, int T,
                     int NH, int NKV, int HS) {
    cp_group *g = ctx;
    if (g->ring) return ring_bwd(g, dqkv, dout, qkv, att, B, T, NH, NKV, HS);
    double t0 = pl_now();
    int W = (NH + 2 * NKV) * HS, rc = PL_OK;
    PL_TRY(gather_rows(g, qkv, B, T, W, 1));
    size_t n = (size_t)B * g->C * T * W;
    PL_TRY(reserve(&g->dkv, &g->cap_dkv, n));
    memset(g->dkv, 0, sizeof(float) * n);
    int nb = blas_one();
    for (int k = 0; k < 2 && rc == PL_OK; k++) {
        cpu_att_span s = chunk_span(g, qkv, (float *)att, B, T, NH, NKV, HS, k);
        s.dout = dout + (size_t)k * (T / 2) * NH * HS;
        s.dq = dqkv + (size_t)k * (T / 2) * W;
        s.dkv = g->dkv;
        rc = cpu_attention_span_bwd(&s);
    }
    blas_back(nb);
    if (rc != PL_OK) {
        pl_error("context parallelism: the attention's backward: %s", host_error());
        return rc;
    }
    rc = return_kv_grads(g, dqkv, B, T, NH, HS, W);
    g->t_att += pl_now() - t0;
    g->ncalls++;
    return rc;
}
