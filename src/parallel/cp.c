/*
 * cp.c — context parallelism (cp.h): the attention over the C ranks' chunks of a sequence.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
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

int cp_init(cp_group *g, MPI_Comm comm, int fail_step, int fail_kill, int wrank, char *err, size_t errlen) {
    (void)err;
    (void)errlen;
    memset(g, 0, sizeof *g);
    g->comm = comm;
    MPI_Comm_size(comm, &g->C);
    MPI_Comm_rank(comm, &g->c);
    g->wrank = wrank;
    g->fail_step = fail_step;
    g->fail_kill = fail_kill;
    return PL_OK;
}

void cp_free(cp_group *g) {
    free(g->all);
    free(g->seq);
    free(g->dkv);
    free(g->send);
    g->all = g->seq = g->dkv = g->send = NULL;
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
    if (g->fail_kill) { /* the gather posted, so the peers are inside it with this rank */
        PL_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_FLOAT, g->all, (int)n, MPI_FLOAT, g->comm, rq));
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

int cp_attention_fwd(void *ctx, float *out, float *att, const float *qkv, int B, int T, int NH, int NKV, int HS) {
    cp_group *g = ctx;
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
