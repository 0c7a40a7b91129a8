/*
 * test_backends.c: the backend conformance test. Every registered backend that can run here
 * (init accepts it), in every precision it accepts, runs every compute op of backend_ops.h on
 * random inputs beside the CPU reference (backend_cpu), op by op; inputs go in with
 * from_host and results come back with to_host, so host and device backends are tested the
 * same way. Tolerances (tests/unit/backend_compare.h): fp32 max-rel <= 1e-5 for every op; bf16:
 * the matmuls l2-rel <= 1e-2 and cosine >= 0.9999, attention l2-rel <= 2e-2 and cosine >=
 * 0.9998 (and not as exact as fp32), every other op fp32 (the norms, softmax, loss and AdamW
 * stay fp32 in every backend); sumsq within 1e-12 relative (both sum in double). The memory
 * ops (copy, zero, map/unmap, synchronize) must round-trip exactly.
 * Also checked, on the registry: no built backend was refused; a host-memory table with NULL
 * ops is completed with backend_cpu's, a device table with one is refused naming the op; the
 * declared options (--backend-opt) are checked, and an option beats its environment alias.
 * A backend or precision that cannot run here (no GPU for cuda; no native bf16 for onednn
 * bf16) is reported as skipped. Exit 77 only when no backend besides cpu is runnable (cpu
 * against itself proves nothing); TEST_BACKENDS_VERBOSE=1 prints every measured error.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipelm/backend.h"
#include "util/common.h"
#include "backend_compare.h"

/* A backend and precision that init accepted here. */
typedef struct { const backend *be; int prec; } target;
static target targets[8];
static int ntargets = 0;

static const backend *cpu = &backend_cpu;
static const backend *be; /* the backend under test in the current loop */
static int bf;            /* its precision is bf16 */

// ----------------------------------------------------------------------------
// buffers: host arrays for backend_cpu, backend memory for the backend under test

static float *hrand(size_t n, double lo, double hi) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    ck_assert_ptr_nonnull(x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * rng_u01());
    return x;
}
static float *hdup(const float *h, size_t n) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    ck_assert_ptr_nonnull(x);
    memcpy(x, h, sizeof(float) * n);
    return x;
}
static void *dput_bytes(const void *h, size_t bytes) {
    void *d = NULL;
    int rc = be->alloc(&d, bytes);
    ck_assert_msg(rc == 0 && d, "%s alloc of %zu bytes: %d %s", be->name, bytes, rc, be->error());
    rc = be->from_host(d, h, bytes);
    ck_assert_msg(rc == 0, "%s from_host: %s", be->name, be->error());
    return d;
}
static float *dput(const float *h, size_t n) { return dput_bytes(h, sizeof(float) * n); }
/* d's n floats, back on the host (the caller frees them). */
static float *dget(const float *d, size_t n) {
    float *h = malloc(sizeof(float) * (n ? n : 1));
    ck_assert_ptr_nonnull(h);
    int rc = be->to_host(h, d, sizeof(float) * n);
    ck_assert_msg(rc == 0, "%s to_host: %s", be->name, be->error());
    return h;
}

#define OK(call) do { int rc_ = (call); ck_assert_msg(rc_ == 0, "%s: %s: %d %s", be->name, #call, rc_, be->error()); } while (0)
#define CPU_OK(call) do { int rc_ = (call); ck_assert_msg(rc_ == 0, "cpu: %s: %d %s", #call, rc_, cpu->error()); } while (0)

/* The device result d (n floats) against the CPU's ref: fp32 bounds, or bf16 ones for a
 * product (kind 1: matmul, 2: attention) in bf16; base: the pre-filled value of an
 * accumulating op (host, or NULL). */
static void compare(const char *op, const float *d, const float *ref, const float *base, size_t n, int kind) {
    char what[128];
    snprintf(what, sizeof what, "%s %s %s", be->name, bf ? "bf16" : "fp32", op);
    float *x = dget(d, n);
    if (bf && kind) check16(what, x, ref, base, n, kind == 2);
    else check32(what, x, ref, base, n);
    free(x);
}

/* Run body once per runnable backend and precision, with be and bf set. */
#define FOR_TARGETS(body)                                                                      \
    for (int ti_ = 0; ti_ < ntargets; ti_++) {                                                 \
        be = targets[ti_].be;                                                                  \
        bf = targets[ti_].prec == PL_PREC_BF16;                                                \
        backend_options o_ = {targets[ti_].prec, 1, -1, 0, 0, NULL};                           \
        char e_[512] = "";                                                                     \
        ck_assert_msg(be->init(&o_, e_, sizeof e_) == 0, "%s init again: %s", be->name, e_);  \
        body;                                                                                  \
    }

// ----------------------------------------------------------------------------
// the ops

/* encoder fwd and bwd (accumulating), N = 37 rows of T = 13, V = 50 tokens. */
static void encoder_case(void) {
    enum { N = 37, T = 13, C = 24, V = 50 };
    int tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int)(rng_u01() * V);
    float *wte = hrand((size_t)V * C, -1, 1), *wpe = hrand((size_t)T * C, -1, 1), *dout = hrand((size_t)N * C, -1, 1);
    float *out = hrand((size_t)N * C, 0, 0), *dwte = hrand((size_t)V * C, -1, 1), *dwpe = hrand((size_t)T * C, -1, 1);
    float *dwte0 = hdup(dwte, (size_t)V * C), *dwpe0 = hdup(dwpe, (size_t)T * C);
    int *g_tok = dput_bytes(tok, sizeof tok);
    float *g_wte = dput(wte, (size_t)V * C), *g_wpe = dput(wpe, (size_t)T * C), *g_dout = dput(dout, (size_t)N * C);
    float *g_out = dput(out, (size_t)N * C), *g_dwte = dput(dwte, (size_t)V * C), *g_dwpe = dput(dwpe, (size_t)T * C);
    CPU_OK(cpu->encoder_fwd(out, tok, wte, wpe, N, T, C));
    CPU_OK(cpu->encoder_bwd(dwte, dwpe, dout, tok, N, T, C));
    OK(be->encoder_fwd(g_out, g_tok, g_wte, g_wpe, N, T, C));
    OK(be->encoder_bwd(g_dwte, g_dwpe, g_dout, g_tok, N, T, C));
    compare("encoder_fwd", g_out, out, NULL, (size_t)N * C, 0);
    compare("encoder_bwd dwte", g_dwte, dwte, dwte0, (size_t)V * C, 0);
    compare("encoder_bwd dwpe", g_dwpe, dwpe, dwpe0, (size_t)T * C, 0);
    float *h[] = {wte, wpe, dout, out, dwte, dwpe, dwte0, dwpe0}, *g[] = {g_wte, g_wpe, g_dout, g_out, g_dwte, g_dwpe};
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) free(h[i]);
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) be->free(g[i]);
    be->free(g_tok);
}

/* LayerNorm (norm == 0) or RMSNorm (norm == 1): fwd, bwd_input and bwd_weight (both
 * accumulating), on N = 300 rows of C = 203 (several column-sum chunks, none full). */
static void norm_case(int norm) {
    enum { N = 300, C = 203 };
    size_t nc = (size_t)N * C;
    float *x = hrand(nc, -2, 2), *w = hrand(C, 0.5, 1.5), *b = hrand(C, -0.5, 0.5), *dout = hrand(nc, -1, 1);
    float *out = hrand(nc, 0, 0), *mean = hrand(N, 0, 0), *rstd = hrand(N, 0, 0), *dx = hrand(nc, -1, 1);
    float *dw = hrand(C, -1, 1), *db = hrand(C, -1, 1);
    float *dx0 = hdup(dx, nc), *dw0 = hdup(dw, C), *db0 = hdup(db, C);
    float *g_x = dput(x, nc), *g_w = dput(w, C), *g_b = dput(b, C), *g_dout = dput(dout, nc), *g_out = dput(out, nc);
    float *g_mean = dput(mean, N), *g_rstd = dput(rstd, N), *g_dx = dput(dx, nc), *g_dw = dput(dw, C), *g_db = dput(db, C);
    if (norm == 0) {
        CPU_OK(cpu->layernorm_fwd(out, mean, rstd, x, w, b, N, C));
        CPU_OK(cpu->layernorm_bwd_input(dx, dout, x, w, mean, rstd, N, C));
        CPU_OK(cpu->layernorm_bwd_weight(dw, db, dout, x, mean, rstd, N, C));
        OK(be->layernorm_fwd(g_out, g_mean, g_rstd, g_x, g_w, g_b, N, C));
        OK(be->layernorm_bwd_input(g_dx, g_dout, g_x, g_w, g_mean, g_rstd, N, C));
        OK(be->layernorm_bwd_weight(g_dw, g_db, g_dout, g_x, g_mean, g_rstd, N, C));
        compare("layernorm_fwd mean", g_mean, mean, NULL, N, 0);
        compare("layernorm_bwd_weight db", g_db, db, db0, C, 0);
    } else {
        CPU_OK(cpu->rmsnorm_fwd(out, rstd, x, w, N, C, 1e-5f));
        CPU_OK(cpu->rmsnorm_bwd_input(dx, dout, x, w, rstd, N, C));
        CPU_OK(cpu->rmsnorm_bwd_weight(dw, dout, x, rstd, N, C));
        OK(be->rmsnorm_fwd(g_out, g_rstd, g_x, g_w, N, C, 1e-5f));
        OK(be->rmsnorm_bwd_input(g_dx, g_dout, g_x, g_w, g_rstd, N, C));
        OK(be->rmsnorm_bwd_weight(g_dw, g_dout, g_x, g_rstd, N, C));
    }
    compare(norm ? "rmsnorm_fwd" : "layernorm_fwd", g_out, out, NULL, nc, 0);
    compare(norm ? "rmsnorm_fwd rstd" : "layernorm_fwd rstd", g_rstd, rstd, NULL, N, 0);
    compare(norm ? "rmsnorm_bwd_input" : "layernorm_bwd_input", g_dx, dx, dx0, nc, 0);
    compare(norm ? "rmsnorm_bwd_weight" : "layernorm_bwd_weight dw", g_dw, dw, dw0, C, 0);
    float *h[] = {x, w, b, dout, out, mean, rstd, dx, dw, db, dx0, dw0, db0};
    float *g[] = {g_x, g_w, g_b, g_dout, g_out, g_mean, g_rstd, g_dx, g_dw, g_db};
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) free(h[i]);
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) be->free(g[i]);
}

/* The three matmuls, fwd with and without bias, bwd_weight accumulating into dW and db; the
 * decode product (matmul_decode_fwd) with bias. */
static void matmul_case(int N, int C, int OC) {
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *x = hrand(ni, -1, 1), *w = hrand(nw, -1, 1), *b = hrand(OC, -1, 1), *dout = hrand(no, -1, 1);
    float *out = hrand(no, 0, 0), *out2 = hrand(no, 0, 0), *dx = hrand(ni, 0, 0), *dw = hrand(nw, -0.5, 0.5);
    float *db = hrand(OC, -0.5, 0.5), *dw0 = hdup(dw, nw), *db0 = hdup(db, OC);
    float *g_x = dput(x, ni), *g_w = dput(w, nw), *g_b = dput(b, OC), *g_dout = dput(dout, no), *g_out = dput(out, no);
    float *g_out2 = dput(out, no), *g_dx = dput(dx, ni), *g_dw = dput(dw, nw), *g_db = dput(db, OC);
    CPU_OK(cpu->matmul_fwd(out, x, w, b, N, C, OC));
    CPU_OK(cpu->matmul_fwd(out2, x, w, NULL, N, C, OC));
    CPU_OK(cpu->matmul_bwd_input(dx, dout, w, N, C, OC));
    CPU_OK(cpu->matmul_bwd_weight(dw, db, dout, x, N, C, OC));
    OK(be->matmul_fwd(g_out, g_x, g_w, g_b, N, C, OC));
    OK(be->matmul_fwd(g_out2, g_x, g_w, NULL, N, C, OC));
    OK(be->matmul_bwd_input(g_dx, g_dout, g_w, N, C, OC));
    OK(be->matmul_bwd_weight(g_dw, g_db, g_dout, g_x, N, C, OC));
    compare("matmul_fwd+bias", g_out, out, NULL, no, 1);
    compare("matmul_fwd", g_out2, out2, NULL, no, 1);
    compare("matmul_bwd_input", g_dx, dx, NULL, ni, 1);
    compare("matmul_bwd_weight dW+=", g_dw, dw, dw0, nw, 1);
    compare("matmul_bwd_weight db+=", g_db, db, db0, OC, 0); /* a column sum: fp32 in every precision */
    CPU_OK(cpu->matmul_decode_fwd(out, x, w, b, N, C, OC)); /* decoding's product (cuda: its matmul_fwd) */
    OK(be->matmul_decode_fwd(g_out, g_x, g_w, g_b, N, C, OC));
    compare("matmul_decode_fwd+bias", g_out, out, NULL, no, !be->host_memory); /* host backends: the CPU's, fp32 */
    float *h[] = {x, w, b, dout, out, out2, dx, dw, db, dw0, db0};
    float *g[] = {g_x, g_w, g_b, g_dout, g_out, g_out2, g_dx, g_dw, g_db};
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) free(h[i]);
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) be->free(g[i]);
}

/* GELU, SwiGLU, residual, add_inplace, scale (elementwise over n = 1031), sumsq. */
static void elementwise_case(void) {
    enum { n = 1031 };
    float *x = hrand(n, -3, 3), *y = hrand(n, -3, 3), *d = hrand(n, -1, 1), *o = hrand(n, 0, 0), *o2 = hrand(n, 0, 0);
    float *g_x = dput(x, n), *g_y = dput(y, n), *g_d = dput(d, n), *g_o = dput(o, n), *g_o2 = dput(o, n);
    CPU_OK(cpu->gelu_fwd(o, x, n));
    OK(be->gelu_fwd(g_o, g_x, n));
    compare("gelu_fwd", g_o, o, NULL, n, 0);
    CPU_OK(cpu->gelu_bwd(o, x, d, n));
    OK(be->gelu_bwd(g_o, g_x, g_d, n));
    compare("gelu_bwd", g_o, o, NULL, n, 0);
    CPU_OK(cpu->swiglu_fwd(o, x, y, n));
    OK(be->swiglu_fwd(g_o, g_x, g_y, n));
    compare("swiglu_fwd", g_o, o, NULL, n, 0);
    CPU_OK(cpu->swiglu_bwd(o, o2, d, x, y, n));
    OK(be->swiglu_bwd(g_o, g_o2, g_d, g_x, g_y, n));
    compare("swiglu_bwd dup", g_o, o, NULL, n, 0);
    compare("swiglu_bwd dgate", g_o2, o2, NULL, n, 0);
    CPU_OK(cpu->residual_fwd(o, x, y, n));
    OK(be->residual_fwd(g_o, g_x, g_y, n));
    compare("residual_fwd", g_o, o, NULL, n, 0);
    CPU_OK(cpu->add_inplace(o, d, n));
    OK(be->add_inplace(g_o, g_d, n));
    compare("add_inplace", g_o, o, NULL, n, 0);
    CPU_OK(cpu->scale(o, 0.37f, n));
    OK(be->scale(g_o, 0.37f, n));
    compare("scale", g_o, o, NULL, n, 0);
    double s1 = -1, s2 = -2;
    CPU_OK(cpu->sumsq(o, n, &s1));
    OK(be->sumsq(g_o, n, &s2));
    ck_assert_msg(fabs(s1 - s2) <= 1e-12 * s1 && s1 > 0, "%s sumsq %.17g vs cpu %.17g", be->name, s2, s1);
    float *h[] = {x, y, d, o, o2}, *g[] = {g_x, g_y, g_d, g_o, g_o2};
    for (size_t i = 0; i < 5; i++) free(h[i]), be->free(g[i]);
}

/* Cross-entropy fwd (softmax in place, losses) and bwd, V = 37 of Vp = 40 columns; AdamW two
 * steps from zero moments. */
static void loss_optim_case(void) {
    enum { N = 21, V = 37, Vp = 40, n = 777 };
    int tgt[N];
    for (int i = 0; i < N; i++) tgt[i] = (int)(rng_u01() * V);
    float *lg = hrand((size_t)N * Vp, -3, 3), *ls = hrand(N, 0, 0);
    int *g_tgt = dput_bytes(tgt, sizeof tgt);
    float *g_lg = dput(lg, (size_t)N * Vp), *g_ls = dput(ls, N);
    CPU_OK(cpu->crossentropy_fwd(ls, lg, tgt, N, V, Vp));
    OK(be->crossentropy_fwd(g_ls, g_lg, g_tgt, N, V, Vp));
    compare("crossentropy_fwd losses", g_ls, ls, NULL, N, 0);
    compare("crossentropy_fwd probs", g_lg, lg, NULL, (size_t)N * Vp, 0);
    CPU_OK(cpu->crossentropy_bwd(lg, tgt, 1.0f / N, N, V, Vp));
    OK(be->crossentropy_bwd(g_lg, g_tgt, 1.0f / N, N, V, Vp));
    compare("crossentropy_bwd", g_lg, lg, NULL, (size_t)N * Vp, 0);
    float *p = hrand(n, -1, 1), *g = hrand(n, -1, 1), *m = hrand(n, 0, 0), *v = hrand(n, 0, 0);
    float *g_p = dput(p, n), *g_g = dput(g, n), *g_m = dput(m, n), *g_v = dput(v, n);
    for (int t = 1; t <= 2; t++) {
        CPU_OK(cpu->adamw(p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t));
        OK(be->adamw(g_p, g_g, g_m, g_v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t));
    }
    compare("adamw p", g_p, p, NULL, n, 0);
    compare("adamw m", g_m, m, NULL, n, 0);
    compare("adamw v", g_v, v, NULL, n, 0);
    float *h[] = {lg, ls, p, g, m, v}, *d[] = {g_lg, g_ls, g_p, g_g, g_m, g_v};
    for (size_t i = 0; i < 6; i++) free(h[i]), be->free(d[i]);
    be->free(g_tgt);
}

/* RoPE fwd and bwd on a fused qkv row of NH = 4, NKV = 2 heads of HS = 6, T = 5. */
static void rope_case(void) {
    enum { N = 15, T = 5, NH = 4, NKV = 2, HS = 6, W = (NH + 2 * NKV) * HS };
    float fc[T * HS / 2], fs[T * HS / 2];
    for (int t = 0; t < T; t++)
        for (int i = 0; i < HS / 2; i++) {
            double a = t * pow(10000.0, -2.0 * i / HS);
            fc[t * (HS / 2) + i] = (float)cos(a);
            fs[t * (HS / 2) + i] = (float)sin(a);
        }
    float *x = hrand((size_t)N * W, -1, 1), *y = hrand((size_t)N * W, 0, 0), *y2 = hrand((size_t)N * W, 0, 0);
    float *g_fc = dput(fc, T * HS / 2), *g_fs = dput(fs, T * HS / 2), *g_x = dput(x, (size_t)N * W);
    float *g_y = dput(y, (size_t)N * W), *g_y2 = dput(y, (size_t)N * W);
    CPU_OK(cpu->rope_fwd(y, x, fc, fs, N, T, NH, NKV, HS));
    CPU_OK(cpu->rope_bwd(y2, x, fc, fs, N, T, NH, NKV, HS));
    OK(be->rope_fwd(g_y, g_x, g_fc, g_fs, N, T, NH, NKV, HS));
    OK(be->rope_bwd(g_y2, g_x, g_fc, g_fs, N, T, NH, NKV, HS));
    compare("rope_fwd", g_y, y, NULL, (size_t)N * W, 0);
    compare("rope_bwd", g_y2, y2, NULL, (size_t)N * W, 0);
    free(x); free(y); free(y2);
    be->free(g_fc); be->free(g_fs); be->free(g_x); be->free(g_y); be->free(g_y2);
}

/* Grouped-query attention fwd (out, att) and bwd (dqkv, overwritten); NKV == NH is GPT-2's. */
static void attention_case(int B, int T, int NH, int NKV, int HS) {
    size_t nq = (size_t)B * T * (NH + 2 * NKV) * HS, no = (size_t)B * T * NH * HS, na = (size_t)B * NH * T * T;
    char what[96];
    float *qkv = hrand(nq, -1, 1), *dout = hrand(no, -1, 1), *out = hrand(no, 0, 0), *att = hrand(na, 0, 0);
    float *dq = hrand(nq, 5, 5);
    float *g_qkv = dput(qkv, nq), *g_dout = dput(dout, no), *g_out = dput(out, no), *g_att = dput(att, na);
    float *g_dq = dput(dq, nq);
    CPU_OK(cpu->attention_gqa_fwd(out, att, qkv, B, T, NH, NKV, HS, NULL));
    CPU_OK(cpu->attention_gqa_bwd(dq, dout, qkv, att, B, T, NH, NKV, HS, NULL));
    OK(be->attention_gqa_fwd(g_out, g_att, g_qkv, B, T, NH, NKV, HS, NULL));
    OK(be->attention_gqa_bwd(g_dq, g_dout, g_qkv, g_att, B, T, NH, NKV, HS, NULL));
    snprintf(what, sizeof what, "attention_gqa_fwd out B%d T%d NH%d NKV%d HS%d", B, T, NH, NKV, HS);
    compare(what, g_out, out, NULL, no, 2);
    /* att is each backend's own state for the backward (backend_ops.h): the host backends keep
     * the probabilities; cuda's fused kernels keep the row log-sum-exp and the output */
    if (be->host_memory) {
        snprintf(what, sizeof what, "attention_gqa_fwd att NH%d NKV%d", NH, NKV);
        compare(what, g_att, att, NULL, na, 2);
    }
    snprintf(what, sizeof what, "attention_gqa_bwd dqkv NH%d NKV%d", NH, NKV);
    compare(what, g_dq, dq, NULL, nq, 2);
    free(qkv); free(dout); free(out); free(att); free(dq);
    be->free(g_qkv); be->free(g_dout); be->free(g_out); be->free(g_att); be->free(g_dq);
}

/* Decoding over a KV cache (attention_kv_fwd): on the CPU, a prefill of `split` rows then the
 * rest is the causal grouped-query attention of the whole sequence (attention_gqa_fwd, B = 1);
 * the backend's output and caches equal the CPU's. */
static void kv_case(int T, int NH, int NKV, int HS, int split) {
    int W = (NH + 2 * NKV) * HS, KW = NKV * HS, maxT = T + 3;
    size_t nq = (size_t)T * W, no = (size_t)T * NH * HS, nk = (size_t)maxT * KW;
    char what[96];
    float *qkv = hrand(nq, -1, 1), *ref = hrand(no, 0, 0), *att = hrand((size_t)NH * T * T, 0, 0);
    float *out = hrand(no, 0, 0), *kc = hrand(nk, 0, 0), *vc = hrand(nk, 0, 0);
    CPU_OK(cpu->attention_gqa_fwd(ref, att, qkv, 1, T, NH, NKV, HS, NULL));
    CPU_OK(cpu->attention_kv_fwd(out, kc, vc, qkv, 0, split, NH, NKV, HS));
    CPU_OK(cpu->attention_kv_fwd(out + (size_t)split * NH * HS, kc, vc, qkv + (size_t)split * W, split, T - split, NH,
                                 NKV, HS));
    snprintf(what, sizeof what, "cpu attention_kv_fwd = attention_gqa_fwd T%d NH%d NKV%d HS%d", T, NH, NKV, HS);
    check32(what, out, ref, NULL, no);
    float *g_qkv = dput(qkv, nq), *g_out = dput(ref, no), *z = hrand(nk, 0, 0), *g_kc = dput(z, nk), *g_vc = dput(z, nk);
    OK(be->attention_kv_fwd(g_out, g_kc, g_vc, g_qkv, 0, split, NH, NKV, HS));
    OK(be->attention_kv_fwd(g_out + (size_t)split * NH * HS, g_kc, g_vc, g_qkv + (size_t)split * W, split, T - split,
                            NH, NKV, HS));
    snprintf(what, sizeof what, "attention_kv_fwd out T%d NH%d NKV%d split %d", T, NH, NKV, split);
    compare(what, g_out, out, NULL, no, 0);
    compare("attention_kv_fwd k cache", g_kc, kc, NULL, (size_t)T * KW, 0);
    compare("attention_kv_fwd v cache", g_vc, vc, NULL, (size_t)T * KW, 0);
    free(qkv); free(ref); free(att); free(out); free(kc); free(vc); free(z);
    be->free(g_qkv); be->free(g_out); be->free(g_kc); be->free(g_vc);
}

/* copy (overlapping too), zero, map READ / WRITE, synchronize: exact. */
static void memory_case(void) {
    enum { n = 1000 };
    float *h = hrand(n, -1, 1), *z = hrand(n, 0, 0);
    float *a = dput(h, n), *b = dput(z, n);
    OK(be->copy(b, a, sizeof(float) * n));
    OK(be->copy(a + 10, a, sizeof(float) * 500)); /* overlapping: memmove */
    memmove(z, h, sizeof(float) * n);
    memmove(h + 10, h, sizeof(float) * 500);
    OK(be->zero(b + 100, sizeof(float) * 50));
    memset(z + 100, 0, sizeof(float) * 50);
    OK(be->synchronize());
    float *x = dget(a, n), *y = dget(b, n);
    check_same("copy (overlapping)", x, h, n);
    check_same("copy, zero", y, z, n);
    void *v = NULL;
    OK(be->map(&v, a, sizeof(float) * n, PL_MAP_READ));
    check_same("map READ", v, h, n);
    OK(be->unmap(v, a, sizeof(float) * n, PL_MAP_READ));
    OK(be->map(&v, b, sizeof(float) * n, PL_MAP_WRITE));
    memcpy(v, h, sizeof(float) * n);
    OK(be->unmap(v, b, sizeof(float) * n, PL_MAP_WRITE));
    free(y);
    y = dget(b, n);
    check_same("map WRITE / unmap", y, h, n);
    free(h); free(z); free(x); free(y);
    be->free(a); be->free(b);
}

// ----------------------------------------------------------------------------
// the cases, over every runnable backend and precision

START_TEST(test_memory) { rng_seed(1); FOR_TARGETS(memory_case()); }
END_TEST
START_TEST(test_encoder) { rng_seed(2); FOR_TARGETS(encoder_case()); }
END_TEST
START_TEST(test_norms) { rng_seed(3); FOR_TARGETS(norm_case(0); norm_case(1)); }
END_TEST
START_TEST(test_matmul) { rng_seed(4); FOR_TARGETS(matmul_case(37, 24, 61); matmul_case(130, 96, 200); matmul_case(3, 40, 50)); }
END_TEST
START_TEST(test_elementwise) { rng_seed(5); FOR_TARGETS(elementwise_case(); rope_case()); }
END_TEST
START_TEST(test_loss_optim) { rng_seed(6); FOR_TARGETS(loss_optim_case()); }
END_TEST
START_TEST(test_attention) {
    rng_seed(7);
    FOR_TARGETS(attention_case(3, 13, 3, 3, 8); attention_case(2, 40, 4, 4, 24); attention_case(2, 17, 6, 2, 6);
                attention_case(2, 9, 8, 1, 12));
    /* 200 positions: past one block of the CUDA kernel (128 threads over the keys) */
    FOR_TARGETS(kv_case(13, 3, 3, 8, 5); kv_case(20, 6, 2, 6, 19); kv_case(9, 8, 1, 12, 1); kv_case(200, 4, 2, 16, 150));
}
END_TEST

/* The registry's rules (backend.h): completion, refusal, declared options and their aliases. */
START_TEST(test_registry) {
    ck_assert_msg(backend_refusal()[0] == 0, "a built backend was refused: %s", backend_refusal());
    char err[256] = "";
    backend t = backend_cpu;
    t.name = "host-test";
    t.gelu_fwd = NULL;
    t.synchronize = NULL;
    ck_assert_int_eq(backend_complete(&t, err, sizeof err), PL_OK);
    ck_assert(t.gelu_fwd == backend_cpu.gelu_fwd && t.synchronize == backend_cpu.synchronize);
    t.host_memory = 0;
    t.name = "device-test";
    t.rope_bwd = NULL;
    ck_assert_int_eq(backend_complete(&t, err, sizeof err), PL_EINVAL);
    ck_assert_msg(strstr(err, "device-test") && strstr(err, "rope_bwd"), "refusal: '%s'", err);
    static const backend_opt_decl decls[] = {{"flag", "a flag", "0", "0|1", "PIPELM_TEST_BACKEND_FLAG"},
                                             {NULL, NULL, NULL, NULL, NULL}};
    t.opts = decls;
    ck_assert_int_eq(backend_opts_check(&t, "flag=1,flag=0", err, sizeof err), PL_OK);
    ck_assert_int_eq(backend_opts_check(&t, "nosuch=1", err, sizeof err), PL_EINVAL);
    ck_assert_msg(strstr(err, "nosuch") && strstr(err, "flag=0|1"), "unknown key: '%s'", err);
    ck_assert_int_eq(backend_opts_check(&t, "flag=2", err, sizeof err), PL_EINVAL);
    ck_assert_int_eq(backend_opts_check(&t, "flag", err, sizeof err), PL_EINVAL);
    ck_assert_int_eq(backend_opts_check(&backend_cpu, "x=1", err, sizeof err), PL_EINVAL);
    ck_assert_msg(strstr(err, "takes: attention=auto|tiled|full"), "cpu options: '%s'", err);
    backend_options o = {PL_PREC_FP32, 1, -1, 0, 0, NULL};
    ck_assert_int_eq(backend_opt_flag(decls, &o, "flag"), 0); /* the default */
    setenv("PIPELM_TEST_BACKEND_FLAG", "1", 1);
    ck_assert_int_eq(backend_opt_flag(decls, &o, "flag"), 1); /* the alias */
    o.settings = "flag=1,flag=0";
    ck_assert_int_eq(backend_opt_flag(decls, &o, "flag"), 0); /* the option wins, its last value */
    unsetenv("PIPELM_TEST_BACKEND_FLAG");
}
END_TEST

static Suite *backends_suite(void) {
    Suite *s = suite_create("backends");
    struct { const char *name; const TTest *test; } cases[] = {
        {"registry", test_registry}, {"memory", test_memory}, {"encoder", test_encoder}, {"norms", test_norms},
        {"matmul", test_matmul}, {"elementwise", test_elementwise}, {"loss_optim", test_loss_optim},
        {"attention", test_attention},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

/* Every registered backend but cpu, in fp32 and bf16: a target where init accepts it. */
static void find_targets(void) {
    char list[128];
    snprintf(list, sizeof list, "%s", backend_list());
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        const backend *b = backend_find(name);
        if (b == cpu) continue;
        for (int prec = PL_PREC_FP32; prec <= PL_PREC_BF16; prec++) {
            backend_options o = {prec, 1, -1, 0, 0, NULL};
            char err[512] = "";
            if (b->init(&o, err, sizeof err) == 0 && ntargets < 8) {
                targets[ntargets++] = (target){b, prec};
                printf("test_backends: %s %s: tested\n", name, backend_precision_name(prec));
            } else
                printf("test_backends: %s %s: skipped: %s\n", name, backend_precision_name(prec), err);
        }
    }
}

int main(void) {
    const char *vb = getenv("TEST_BACKENDS_VERBOSE");
    verbose = vb && *vb && strcmp(vb, "0") != 0;
    /* the CPU reference keeps the (T, T) probabilities, which the attention cases compare
     * (its tiled path is test_attention.c's); the variable also reaches the CPU backend's
     * init inside another host backend's */
    setenv("PIPELM_CPU_ATTENTION", "full", 1);
    backend_options co = {PL_PREC_FP32, 1, -1, 0, 0, NULL};
    char err[512] = "";
    if (cpu->init(&co, err, sizeof err) != 0) {
        fprintf(stderr, "test_backends: cpu backend init failed: %s\n", err);
        return EXIT_FAILURE;
    }
    find_targets();
    SRunner *sr = srunner_create(backends_suite());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    printf("test_backends: worst fp32 max-rel %.3e; bf16 matmul l2-rel %.3e cos %.7f; bf16 attention l2-rel %.3e "
           "cos %.7f\n", worst32, worst16, worst16cos, worst16a, worst16acos);
    for (int i = 0; i < ntargets; i++) targets[i].be->finalize();
    if (failed) return EXIT_FAILURE;
    if (ntargets == 0) {
        printf("test_backends: SKIP (exit 77): no backend besides cpu can run here\n");
        return 77;
    }
    return EXIT_SUCCESS;
}
