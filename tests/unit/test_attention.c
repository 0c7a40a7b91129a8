/*
 * test_attention.c: Check tests for the CPU backend's fused causal attention
 * (src/backend/cpu/cpu_attention.c, `--backend-opt attention=tiled`) against the (T, T)
 * path it replaces (`attention=full`, itself checked against double references and finite
 * differences in test_ops.c), and against a double-precision reference of the output and
 * the row log-sum-exp written out here.
 *
 * Tolerances: err = max|a - r| / max(max|r|, 1) over the whole tensor.
 *   TOL = 1e-5  tiled against full, out and every gradient (dq, dk, dv), and the output and
 *               log-sum-exp against the double reference (observed <= ~1e-6: the two paths
 *               differ only in float rounding: per-tile maxima, sums in another order).
 * Shapes: T = 1, 7, 63, 64, 65, 200 and 1000 (one tile, its edges, several tiles), head sizes
 * 5, 16 and 64 (GPT-2's), NKV = NH and grouped-query heads (NH / NKV = 3 and 4), inputs up
 * to 3 in magnitude (scores past exp's range without the running maximum).
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipelm/backend.h"
#include "util/common.h"
#include "backend/cpu/cpu_attention.h"

#define TOL 1e-5

static const backend *be = &backend_cpu;
static int verbose = 0; /* TEST_ATTENTION_VERBOSE=1 prints every measured error */

/* xorshift64*, seeded per test */
static uint64_t rng_state;
static void rng_seed(uint64_t s) { rng_state = s * 0x9E3779B97F4A7C15ull + 0x1234567ull; }
static double rng_u01(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}
static float *frand(size_t n, double lo, double hi) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    ck_assert_ptr_nonnull(x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * rng_u01());
    return x;
}
static float *fconst(size_t n, float v) {
    float *x = frand(n, 0, 0);
    for (size_t i = 0; i < n; i++) x[i] = v;
    return x;
}

/* The CPU backend with attention=MODE (NULL: no setting, the default or the environment). */
static void cpu_mode(const char *settings, int threads) {
    char err[256] = "";
    backend_options o = {PL_PREC_FP32, threads, -1, 0, 0, settings};
    ck_assert_msg(be->init(&o, err, sizeof err) == 0, "cpu init '%s': %s", settings ? settings : "", err);
}

static void check_close(const char *what, const float *a, const float *r, size_t n, double tol) {
    double mx = 1.0, err = 0.0;
    for (size_t i = 0; i < n; i++) mx = fabs(r[i]) > mx ? fabs(r[i]) : mx;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - r[i]);
        ck_assert_msg(e == e, "%s: NaN at %zu", what, i);
        err = e > err ? e : err;
    }
    if (verbose) printf("  %-60s err %.3e\n", what, err / mx);
    ck_assert_msg(err / mx <= tol, "%s: error %.3e > %.0e", what, err / mx, tol);
}

typedef struct { int B, T, NH, NKV, HS; double range; } shape;

/* Double reference of one (b, h): out row t and lse[t] = log sum_j exp(s_tj), causal. */
static void ref_head(double *o, double *lse, const float *qkv, int b, int h, const shape *s) {
    int W = (s->NH + 2 * s->NKV) * s->HS, g = h / (s->NH / s->NKV), T = s->T, HS = s->HS;
    const float *row = qkv + (size_t)b * T * W;
    double *p = malloc(sizeof(double) * T);
    for (int t = 0; t < T; t++) {
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j <= t; j++) {
            double d = 0.0;
            for (int c = 0; c < HS; c++) d += (double)row[(size_t)t * W + h * HS + c] * row[(size_t)j * W + (s->NH + g) * HS + c];
            p[j] = d / sqrt((double)HS);
            mx = p[j] > mx ? p[j] : mx;
        }
        for (int j = 0; j <= t; j++) sum += (p[j] = exp(p[j] - mx));
        lse[t] = mx + log(sum);
        for (int c = 0; c < HS; c++) {
            double acc = 0.0;
            for (int j = 0; j <= t; j++) acc += p[j] * row[(size_t)j * W + (s->NH + s->NKV + g) * HS + c];
            o[(size_t)t * HS + c] = acc / sum;
        }
    }
    free(p);
}

/* The tiled state's O rows equal out (bits) and O, lse match the double reference. */
static void check_state(const float *out, const float *state, const float *qkv, const shape *s) {
    int T = s->T, HS = s->HS, CO = s->NH * HS;
    double *o = malloc(sizeof(double) * T * HS), *lse = malloc(sizeof(double) * T);
    float *got = malloc(sizeof(float) * T * (HS + 1)), *ref = malloc(sizeof(float) * T * (HS + 1));
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->NH; h++) {
            const float *st = state + ((size_t)b * s->NH + h) * T * (HS + 1);
            for (int t = 0; t < T; t++)
                ck_assert_msg(memcmp(st + (size_t)t * HS, out + ((size_t)b * T + t) * CO + h * HS, sizeof(float) * HS) == 0,
                              "state O differs from out at b %d h %d t %d", b, h, t);
            ref_head(o, lse, qkv, b, h, s);
            for (size_t i = 0; i < (size_t)T * HS; i++) ref[i] = (float)o[i];
            for (int t = 0; t < T; t++) ref[(size_t)T * HS + t] = (float)lse[t];
            memcpy(got, st, sizeof(float) * T * (HS + 1));
            check_close("tiled O and lse vs double reference", got, ref, (size_t)T * (HS + 1), TOL);
        }
    free(o); free(lse); free(got); free(ref);
}

/* Tiled (direct call, any T) against full (the backend's op with attention=full): out and
 * dqkv within TOL; dqkv is overwritten (pre-filled with 1000). */
static void tiled_vs_full(const shape *s) {
    int B = s->B, T = s->T, NH = s->NH, NKV = s->NKV, HS = s->HS, W = (NH + 2 * NKV) * HS;
    size_t nq = (size_t)B * T * W, no = (size_t)B * T * NH * HS;
    float *qkv = frand(nq, -s->range, s->range), *dout = frand(no, -1, 1);
    float *out_f = fconst(no, 0), *att_f = fconst((size_t)B * NH * T * T, 0), *dq_f = fconst(nq, 1000);
    float *out_t = fconst(no, 999), *st = fconst((size_t)B * NH * T * (HS + 1), 7), *dq_t = fconst(nq, 1000);
    cpu_mode("attention=full", 2);
    ck_assert_int_eq(be->attention_gqa_fwd(out_f, att_f, qkv, B, T, NH, NKV, HS, NULL), 0);
    ck_assert_int_eq(be->attention_gqa_bwd(dq_f, dout, qkv, att_f, B, T, NH, NKV, HS, NULL), 0);
    ck_assert_int_eq(cpu_attention_tiled_fwd(out_t, st, qkv, B, T, NH, NKV, HS, NULL, 0), 0);
    ck_assert_int_eq(cpu_attention_tiled_bwd(dq_t, dout, qkv, st, B, T, NH, NKV, HS, NULL, 0), 0);
    char what[128];
    snprintf(what, sizeof what, "out B%d T%d NH%d NKV%d HS%d", B, T, NH, NKV, HS);
    check_close(what, out_t, out_f, no, TOL);
    const char *part[3] = {"dq", "dk", "dv"};
    int off[4] = {0, NH * HS, (NH + NKV) * HS, W};
    for (int k = 0; k < 3; k++) { /* each gradient by itself, against its own magnitude */
        size_t n = (size_t)B * T * (off[k + 1] - off[k]);
        float *a = malloc(sizeof(float) * n), *r = malloc(sizeof(float) * n);
        for (size_t i = 0, j = 0; i < (size_t)B * T; i++)
            for (int c = off[k]; c < off[k + 1]; c++, j++) a[j] = dq_t[i * W + c], r[j] = dq_f[i * W + c];
        snprintf(what, sizeof what, "%s B%d T%d NH%d NKV%d HS%d", part[k], B, T, NH, NKV, HS);
        check_close(what, a, r, n, TOL);
        free(a); free(r);
    }
    check_state(out_t, st, qkv, s);
    free(qkv); free(dout); free(out_f); free(att_f); free(dq_f); free(out_t); free(st); free(dq_t);
    cpu_mode(NULL, 2);
}

START_TEST(test_tiled_vs_full) {
    static const int Ts[] = {1, 7, 63, 64, 65, 200};
    static const shape kinds[] = {
        {2, 0, 4, 4, 16, 1.0},  /* multi-head (GPT-2's NKV == NH) */
        {1, 0, 6, 2, 64, 1.0},  /* grouped-query, GPT-2's head size */
        {2, 0, 4, 1, 5, 3.0},   /* one kv head, odd head size, large scores */
        {1, 0, 3, 1, 16, 3.0},  /* grouped-query (3 per kv head), large scores */
    };
    rng_seed(40);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
            shape s = kinds[k];
            s.T = Ts[i];
            tiled_vs_full(&s);
        }
    static const shape longer = {1, 1000, 4, 2, 64, 1.0}; /* the T = 1000: 8 key tiles */
    tiled_vs_full(&longer);
}
END_TEST

/* The same bits with 1, 2 and 3 threads: out, the state and dqkv. */
START_TEST(test_tiled_threads) {
    enum { B = 2, T = 150, NH = 6, NKV = 2, HS = 16, W = (NH + 2 * NKV) * HS };
    size_t nq = (size_t)B * T * W, no = (size_t)B * T * NH * HS, ns = (size_t)B * NH * T * (HS + 1);
    rng_seed(41);
    float *qkv = frand(nq, -2, 2), *dout = frand(no, -1, 1), *out[3], *st[3], *dq[3];
    cpu_mode("attention=tiled", 2);
    for (int r = 0; r < 3; r++) {
        be->set_threads(r + 1);
        out[r] = fconst(no, 0), st[r] = fconst(ns, 0), dq[r] = fconst(nq, 0);
        ck_assert_int_eq(be->attention_gqa_fwd(out[r], st[r], qkv, B, T, NH, NKV, HS, NULL), 0);
        ck_assert_int_eq(be->attention_gqa_bwd(dq[r], dout, qkv, st[r], B, T, NH, NKV, HS, NULL), 0);
    }
    be->set_threads(2);
    for (int r = 1; r < 3; r++) {
        ck_assert_msg(memcmp(out[0], out[r], sizeof(float) * no) == 0, "tiled out differs, 1 and %d threads", r + 1);
        ck_assert_msg(memcmp(st[0], st[r], sizeof(float) * ns) == 0, "tiled state differs, 1 and %d threads", r + 1);
        ck_assert_msg(memcmp(dq[0], dq[r], sizeof(float) * nq) == 0, "tiled dqkv differs, 1 and %d threads", r + 1);
    }
    for (int r = 0; r < 3; r++) { free(out[r]); free(st[r]); free(dq[r]); }
    free(qkv); free(dout);
}
END_TEST

/* The setting: attention_cols, the op's choice of path (its bits and the floats it writes),
 * the option check and the environment alias. */
START_TEST(test_dispatch) {
    char err[256];
    ck_assert_int_eq(backend_opts_check(be, "attention=tiled", err, sizeof err), 0);
    ck_assert_int_eq(backend_opts_check(be, "attention=full", err, sizeof err), 0);
    ck_assert_int_eq(backend_opts_check(be, "attention=auto", err, sizeof err), 0);
    ck_assert_int_ne(backend_opts_check(be, "attention=flash", err, sizeof err), 0);
    ck_assert_msg(strstr(err, "attention=auto|tiled|full"), "refusal names the choices: %s", err);
    cpu_mode(NULL, 2); /* the default, auto: tiled from T = 128 where T exceeds the head size */
    ck_assert_int_eq(be->attention_cols(4, 1024, 12, 64), 65);
    ck_assert_int_eq(be->attention_cols(4, 128, 12, 64), 65);
    ck_assert_int_eq(be->attention_cols(4, 127, 12, 64), 127);
    ck_assert_int_eq(be->attention_cols(4, 128, 2, 128), 128);
    ck_assert_int_eq(be->attention_cols(4, 129, 2, 128), 129);
    cpu_mode("attention=tiled", 2); /* tiled wherever T exceeds the head size */
    ck_assert_int_eq(be->attention_cols(4, 1024, 12, 64), 65);
    ck_assert_int_eq(be->attention_cols(4, 65, 12, 64), 65);
    ck_assert_int_eq(be->attention_cols(4, 64, 12, 64), 64);
    ck_assert_int_eq(be->attention_cols(4, 7, 12, 64), 7);
    enum { B = 1, T = 70, NH = 2, NKV = 1, HS = 8, W = (NH + 2 * NKV) * HS };
    size_t nq = (size_t)B * T * W, no = (size_t)B * T * NH * HS, ns = (size_t)B * NH * T * (HS + 1);
    rng_seed(42);
    float *qkv = frand(nq, -1, 1), *o1 = fconst(no, 0), *o2 = fconst(no, 0);
    float *a1 = fconst((size_t)B * NH * T * T, -5), *a2 = fconst(ns, 0);
    ck_assert_int_eq(be->attention_gqa_fwd(o1, a1, qkv, B, T, NH, NKV, HS, NULL), 0);
    ck_assert_int_eq(cpu_attention_tiled_fwd(o2, a2, qkv, B, T, NH, NKV, HS, NULL, 0), 0);
    ck_assert_msg(memcmp(o1, o2, sizeof(float) * no) == 0 && memcmp(a1, a2, sizeof(float) * ns) == 0,
                  "the op with attention=tiled is not the tiled kernel");
    for (size_t i = ns; i < (size_t)B * NH * T * T; i++)
        ck_assert_msg(a1[i] == -5.0f, "the tiled op wrote past its state (float %zu)", i);
    cpu_mode("attention=full", 2);
    ck_assert_int_eq(be->attention_cols(4, 1024, 12, 64), 1024);
    setenv("PIPELM_CPU_ATTENTION", "full", 1);
    cpu_mode(NULL, 2);
    ck_assert_int_eq(be->attention_cols(4, 1024, 12, 64), 1024);
    cpu_mode("attention=tiled", 2); /* the setting wins over the variable */
    ck_assert_int_eq(be->attention_cols(4, 1024, 12, 64), 65);
    unsetenv("PIPELM_CPU_ATTENTION");
    cpu_mode(NULL, 2);
    free(qkv); free(o1); free(o2); free(a1); free(a2);
}
END_TEST


/* Document masking (backend_ops.h's doc): a packed sequence of documents gives, for each
 * document, the output and the q, k, v gradients of that document run alone as its own
 * sequence (plain causal), within TOL, on the full path and the tiled one (documents crossing
 * the 64-row query tiles and the 128-key backward tiles; the first sequence of the batch is one
 * document, starting at its row 0); an all-zero doc gives NULL's bits. */
static void doc_vs_alone(const char *mode, int T, int NH, int NKV, int HS, const int *cuts, int ncuts) {
    enum { B = 2 };
    int W = (NH + 2 * NKV) * HS, CO = NH * HS;
    size_t nq = (size_t)B * T * W, no = (size_t)B * T * CO;
    float *qkv = frand(nq, -2, 2), *dout = frand(no, -1, 1);
    int *doc = calloc((size_t)B * T, sizeof(int));
    for (int t = 0, c = 0, cur = 0; t < T; t++) { /* sequence 1: documents from each cut */
        if (c < ncuts && cuts[c] == t) cur = cuts[c++];
        doc[T + t] = cur;
    }
    cpu_mode(mode, 2);
    float *out = fconst(no, 0), *att = fconst((size_t)B * NH * T * T, 0), *dq = fconst(nq, 1000);
    ck_assert_int_eq(be->attention_gqa_fwd(out, att, qkv, B, T, NH, NKV, HS, doc), 0);
    ck_assert_int_eq(be->attention_gqa_bwd(dq, dout, qkv, att, B, T, NH, NKV, HS, doc), 0);
    int bnd[34], nb = 0; /* sequence 1's documents: [bnd[i], bnd[i + 1]) */
    bnd[nb++] = 0;
    for (int c = 0; c < ncuts && nb < 32; c++)
        if (cuts[c] > bnd[nb - 1]) bnd[nb++] = cuts[c];
    bnd[nb++] = T;
    for (int c = -1; c < nb - 1; c++) { /* c = -1: sequence 0, one document */
        int b = c < 0 ? 0 : 1, t0 = c < 0 ? 0 : bnd[c], t1 = c < 0 ? T : bnd[c + 1], n = t1 - t0;
        float *q1 = malloc(sizeof(float) * n * W), *d1 = malloc(sizeof(float) * n * CO);
        float *o1 = fconst((size_t)n * CO, 0), *a1 = fconst((size_t)NH * n * n, 0), *g1 = fconst((size_t)n * W, 0);
        float *oa = malloc(sizeof(float) * n * CO), *ga = malloc(sizeof(float) * n * W);
        memcpy(q1, qkv + ((size_t)b * T + t0) * W, sizeof(float) * n * W);
        memcpy(d1, dout + ((size_t)b * T + t0) * CO, sizeof(float) * n * CO);
        memcpy(oa, out + ((size_t)b * T + t0) * CO, sizeof(float) * n * CO);
        memcpy(ga, dq + ((size_t)b * T + t0) * W, sizeof(float) * n * W);
        cpu_mode("attention=full", 2);
        ck_assert_int_eq(be->attention_gqa_fwd(o1, a1, q1, 1, n, NH, NKV, HS, NULL), 0);
        ck_assert_int_eq(be->attention_gqa_bwd(g1, d1, q1, a1, 1, n, NH, NKV, HS, NULL), 0);
        cpu_mode(mode, 2);
        char what[160];
        snprintf(what, sizeof what, "doc %s rows [%d,%d) of seq %d out, T%d NH%d NKV%d HS%d", mode, t0, t1, b, T, NH,
                 NKV, HS);
        check_close(what, oa, o1, (size_t)n * CO, TOL);
        snprintf(what, sizeof what, "doc %s rows [%d,%d) of seq %d dqkv, T%d NH%d NKV%d HS%d", mode, t0, t1, b, T,
                 NH, NKV, HS);
        check_close(what, ga, g1, (size_t)n * W, TOL);
        free(q1); free(d1); free(o1); free(a1); free(g1); free(oa); free(ga);
    }
    /* no document token: an all-zero doc is NULL, bit for bit */
    memset(doc, 0, sizeof(int) * B * T);
    float *o2 = fconst(no, 0), *a2 = fconst((size_t)B * NH * T * T, 0), *g2 = fconst(nq, 0);
    float *o3 = fconst(no, 0), *a3 = fconst((size_t)B * NH * T * T, 0), *g3 = fconst(nq, 0);
    ck_assert_int_eq(be->attention_gqa_fwd(o2, a2, qkv, B, T, NH, NKV, HS, doc), 0);
    ck_assert_int_eq(be->attention_gqa_bwd(g2, dout, qkv, a2, B, T, NH, NKV, HS, doc), 0);
    ck_assert_int_eq(be->attention_gqa_fwd(o3, a3, qkv, B, T, NH, NKV, HS, NULL), 0);
    ck_assert_int_eq(be->attention_gqa_bwd(g3, dout, qkv, a3, B, T, NH, NKV, HS, NULL), 0);
    ck_assert_msg(memcmp(o2, o3, sizeof(float) * no) == 0 && memcmp(g2, g3, sizeof(float) * nq) == 0,
                  "%s: an all-zero doc differs from no doc", mode);
    free(o2); free(a2); free(g2); free(o3); free(a3); free(g3);
    free(qkv); free(dout); free(doc); free(out); free(att); free(dq);
    cpu_mode(NULL, 2);
}

START_TEST(test_doc_mask) {
    static const int cuts[] = {0, 1, 2, 30, 63, 64, 65, 128, 129, 250, 299}; /* tile edges: 64, 128, 256 */
    static const int late[] = {100, 101};                                    /* rows 0..99: one document */
    rng_seed(43);
    doc_vs_alone("attention=full", 300, 4, 2, 16, cuts, sizeof cuts / sizeof cuts[0]);
    doc_vs_alone("attention=tiled", 300, 4, 2, 16, cuts, sizeof cuts / sizeof cuts[0]);
    doc_vs_alone("attention=tiled", 300, 3, 3, 5, late, 2);
    doc_vs_alone("attention=full", 9, 2, 1, 4, late, 0);
}
END_TEST

static Suite *attention_suite(void) {
    Suite *su = suite_create("attention");
    TCase *tc = tcase_create("tiled");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_tiled_vs_full);
    tcase_add_test(tc, test_tiled_threads);
    tcase_add_test(tc, test_dispatch);
    tcase_add_test(tc, test_doc_mask);
    suite_add_tcase(su, tc);
    return su;
}

int main(void) {
    const char *vb = getenv("TEST_ATTENTION_VERBOSE");
    verbose = vb && *vb && strcmp(vb, "0") != 0;
    unsetenv("PIPELM_CPU_ATTENTION");
    SRunner *sr = srunner_create(attention_suite());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    be->finalize();
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
