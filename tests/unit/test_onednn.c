/*
 * test_onednn.c: Check tests for the oneDNN backend (src/backend/onednn/backend_onednn.c) against the CPU
 * reference backend (backend_cpu), in fp32 and in bf16.
 *
 * Every op runs on both backends on the same host buffers (both are host-memory backends),
 * on two odd shapes (matmul N=37 C=24 OC=61 and N=130 C=96 OC=200; attention B=3 T=13 C=24
 * NH=3 and B=2 T=40 C=96 NH=4).
 *
 * Tolerances (measured values in the comments; TEST_ONEDNN_VERBOSE=1 prints every one):
 *   fp32, every tensor:  max|x - ref| / max|ref| <= TOL32 = 1e-5
 *                        (measured <= 5.1e-7: only the summation order differs from OpenBLAS).
 *   bf16 vs the fp32 reference (inputs rounded to bf16, fp32 accumulation):
 *     matmul fwd / bwd_input / bwd_weight increment:
 *                        ||x - ref|| / ||ref|| <= TOL16_REL = 1e-2, cosine >= TOL16_COS = 0.9999
 *                        (measured rel 2.0e-3..2.2e-3, cosine >= 0.999997), and rel >= 1e-4: a
 *                        "bf16" result as exact as fp32 means the products did not run in bf16;
 *     attention out, att, dqkv: rel <= TOL16_ATT_REL = 2e-2, cosine >= TOL16_ATT_COS = 0.9998
 *                        (measured rel out 2.2e-3, att 5.3e-4, dqkv 2.3e-3, cosine >= 0.999997;
 *                        the looser bound because dqkv goes through two bf16 products in a row).
 *   bf16 vs a reference on bf16-rounded inputs (the same rounding done here in double, then
 *     backend_cpu's fp32 matmul on the exactly representable values): max rel <= TOL32: proves
 *     round-to-nearest-even conversion and fp32 accumulation (measured <= 2.1e-7).
 *   db (bias gradient): bit-identical to backend_cpu.
 * Every other op is not in this backend's table: registration fills it with backend_cpu's own
 *   function (test_table checks that, so their bits are the CPU's by construction); the
 *   op-by-op comparison against backend_cpu of every backend is tests/unit/test_backends.c.
 * Llama ops: attention_gqa (B3 T13 NH6 NKV2 HS8, B2 T40 NH8 NKV1 HS12, B2 T17 NH4 NKV4 HS6) to
 *   the attention tolerances above in both precisions, twice the same bits, and with NKV == NH
 *   is GPT-2's multi-head attention (the attention cases above; B3 T13 C24 NH3, B2 T40 C96 NH4).
 * Determinism: every oneDNN op twice on the same inputs is bit-identical (fp32 and bf16). With 1
 *   vs 2 threads: db, the causal softmax and every delegated op are thread-count independent
 *   by construction and checked bit-identical; oneDNN's own products are compared as well on
 *   these shapes (bit-identical here, and also measured so on 1024x768x3072, 1024x3072x768,
 *   1024x512x10000 and attention B4 T256 C768 NH12; oneDNN does not promise it for every shape
 *   or thread count, see the comment at test_threads).
 * bf16 weight cache (onednn_wcache.c): on any CPU, the module through the backend's wrapped
 *   memory ops and AdamW (what becomes weights, which writes make a copy stale, a copy equal to
 *   a conversion made here); where bf16 runs, matmul_fwd and matmul_bwd_input bit-identical
 *   with weight-cache=1 and =0 after every kind of write.
 * Exit status 77 (skip) only when init refuses bf16 for want of native bf16 support on this
 * CPU; the fp32 cases then still run and a failure among them still fails the test.
 */
#include <check.h>
#include <dnnl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "pipelm/backend.h"
#include "util/common.h"
#include "backend/onednn/onednn_auto.h"
#include "backend/onednn/onednn_elem.h"
#include "backend/onednn/onednn_wcache.h"
#include "backend_compare.h"

extern const backend backend_onednn;
/* test hooks exported by src/backend/onednn/backend_onednn.c */
void onednn_cvt_bf16(uint16_t *dst, const float *src, size_t n, int force_scalar);
long onednn_primitives_created(void);
long onednn_nondense_created(void);
long onednn_vnni_used(void);
long onednn_wblocked_used(void);
const char *onednn_impl_made(int i, const char **what);

/* the registered backend (its NULL ops filled with backend_cpu's) and its own table */
static const backend *dn;
static const backend *cpu = &backend_cpu;
static int bf16_ok = 0;           /* init accepted bf16 here */
static char bf16_why[512] = "";   /* else why not */
static int default_threads = 2;

// ----------------------------------------------------------------------------
// helpers

static void fill_rand(float *x, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * rng_u01());
}

static float *falloc(size_t n) {
    void *p = NULL;
    int rc = dn->alloc(&p, n * sizeof(float));
    ck_assert_msg(rc == 0 && p, "alloc of %zu floats: %d %s", n, rc, dn->error());
    return p;
}
static float *fclone(const float *src, size_t n) {
    float *p = falloc(n);
    memcpy(p, src, n * sizeof(float));
    return p;
}

/* Set the oneDNN backend's precision (init again). */
static void use_prec(int prec) {
    backend_options o = {prec, default_threads, -1, 0, 0, NULL};
    char err[512] = "";
    int rc = dn->init(&o, err, sizeof err);
    ck_assert_msg(rc == 0, "onednn init %s: %s", backend_precision_name(prec), err);
}

#define OK(call) do { int rc_ = (call); ck_assert_msg(rc_ == 0, "%s: %d %s", #call, rc_, dn->error()); } while (0)
#define CPU_OK(call) do { int rc_ = (call); ck_assert_msg(rc_ == 0, "%s: %d %s", #call, rc_, cpu->error()); } while (0)

/* bf16 rounding done here, independently (double arithmetic, round to nearest even):
 * the value as a float. Denormals flush to zero as the backend's conversion does. */
static float round_bf16(float f) {
    if (f == 0 || !isfinite(f)) return f;
    int e;
    double m = frexp((double)f, &e); /* f = m 2^e, 0.5 <= |m| < 1 */
    if (e < -125) return copysignf(0.0f, f); /* denormal float */
    double s = ldexp(m, 8);                  /* 8 significant bits */
    double r = nearbyint(s);                 /* default rounding mode: to nearest even */
    return (float)ldexp(r, e - 8);
}
static float *rounded(const float *x, size_t n) {
    float *p = falloc(n);
    for (size_t i = 0; i < n; i++) p[i] = round_bf16(x[i]);
    return p;
}

// ----------------------------------------------------------------------------
// shapes

typedef struct { int N, C, OC; } mm_shape;
static const mm_shape mm_shapes[] = {{37, 24, 61}, {130, 96, 200}};
typedef struct { int B, T, C, NH; } att_shape;
static const att_shape att_shapes[] = {{3, 13, 24, 3}, {2, 40, 96, 4}, {1, 96, 32, 2}}; /* T >= 64: bf16 splits the causal products */

// ----------------------------------------------------------------------------
// init, describe

START_TEST(test_init_describe) {
    char buf[256];
    use_prec(PL_PREC_FP32);
    dn->describe(buf, sizeof buf);
    if (verbose) printf("  %s\n", buf);
    ck_assert_msg(strncmp(buf, "onednn: oneDNN ", 15) == 0, "describe: %s", buf);
    ck_assert_msg(strstr(buf, ", fp32") && !strstr(buf, "bf16 (") && strstr(buf, "ISA ") && strstr(buf, "matmul "),
                  "describe: %s", buf);
    ck_assert_int_eq(dn->host_memory, 1);
    ck_assert_str_eq(dn->name, "onednn");
    ck_assert_ptr_eq(backend_find("onednn"), dn);
    ck_assert_msg(strstr(backend_list(), "onednn") != NULL, "backend_list: %s", backend_list());
    ck_assert_int_eq(dn->get_threads(), default_threads);
    backend_options bad = {7, 1, -1, 0, 0, NULL};
    char err[256] = "";
    ck_assert_int_ne(dn->init(&bad, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "precision"), "bad precision message: %s", err);
    if (bf16_ok) {
        use_prec(PL_PREC_BF16);
        dn->describe(buf, sizeof buf);
        if (verbose) printf("  %s\n", buf);
        ck_assert_msg(strstr(buf, ", bf16 (inputs converted"), "describe: %s", buf);
        use_prec(PL_PREC_FP32);
    }
}
END_TEST

// ----------------------------------------------------------------------------
// bf16 conversion: round to nearest even, specials, vector == scalar

static uint16_t bits16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

START_TEST(test_convert) {
    float v[] = {1.0f, 1.0f + 0x1p-8f, 1.0f + 0x3p-8f, -1.0f - 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, 3.14159265f,
                 INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1e-40f, -1e-40f, 3.3895314e38f, 65504.0f, -2.5e-30f};
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0); 1 + 3 2^-8 -> 1 + 2^-6;
     * just above the tie rounds up; 3.39e38 (max float region) rounds to +inf or max bf16 */
    size_t n = sizeof v / sizeof v[0];
    uint16_t a[16], b[16];
    onednn_cvt_bf16(a, v, n, 0);
    onednn_cvt_bf16(b, v, n, 1);
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(a[i] == b[i], "value %zu (%g): vector %04x scalar %04x", i, v[i], a[i], b[i]);
        if (isnan(v[i])) {
            ck_assert_msg((a[i] & 0x7f80) == 0x7f80 && (a[i] & 0x7f), "NaN -> %04x", a[i]);
            continue;
        }
        float want = round_bf16(v[i]);
        ck_assert_msg(a[i] == bits16(want), "value %zu (%.9g): got %04x want %04x", i, v[i], a[i], bits16(want));
    }
    ck_assert_uint_eq(a[0], 0x3f80);
    ck_assert_uint_eq(a[1], 0x3f80);
    ck_assert_uint_eq(a[2], 0x3f82);
    ck_assert_uint_eq(a[3], 0xbf80);
    ck_assert_uint_eq(a[4], 0x3f81);
    /* many random values of many magnitudes, and lengths around the vector widths */
    rng_seed(99);
    enum { M = 100003 };
    float *x = falloc(M);
    for (size_t i = 0; i < M; i++) x[i] = (float)((2 * rng_u01() - 1) * pow(2.0, 60 * rng_u01() - 30));
    uint16_t *p = malloc(2 * M), *q = malloc(2 * M);
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_nonnull(q);
    size_t lens[] = {0, 1, 15, 16, 17, 31, 32, 33, 1000, M};
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
        memset(p, 0xAB, 2 * M);
        memset(q, 0xAB, 2 * M);
        onednn_cvt_bf16(p, x, lens[l], 0);
        onednn_cvt_bf16(q, x, lens[l], 1);
        ck_assert_msg(memcmp(p, q, 2 * M) == 0, "vector and scalar conversions differ (n=%zu)", lens[l]);
        if (lens[l] < M) ck_assert_uint_eq(p[lens[l]], 0xABAB); /* no write past n */
    }
    for (size_t i = 0; i < M; i++) ck_assert_msg(p[i] == bits16(round_bf16(x[i])), "value %.9g", x[i]);
    /* the transposed conversion (matmul_bwd_weight's dout^T): each (N, OC) as (OC, N), every
     * value the rounding above, nothing written past OC N; row counts around its 32-row blocks
     * and column counts around its 256-column chunks */
    const int tr[][2] = {{1, 1}, {37, 61}, {32, 16}, {33, 257}, {64, 3}, {95, 513}};
    for (size_t t = 0; t < sizeof tr / sizeof tr[0]; t++) {
        int N = tr[t][0], OC = tr[t][1];
        memset(p, 0xAB, 2 * M);
        onednn_cvt_bf16_t(p, x, N, OC);
        for (int i = 0; i < N; i++)
            for (int j = 0; j < OC; j++)
                ck_assert_msg(p[(size_t)j * N + i] == bits16(round_bf16(x[(size_t)i * OC + j])),
                              "transposed N=%d OC=%d: (%d, %d)", N, OC, i, j);
        ck_assert_uint_eq(p[(size_t)N * OC], 0xABAB);
    }
    free(p);
    free(q);
    dn->free(x);
}
END_TEST

// ----------------------------------------------------------------------------
// matmuls

/* One shape in the current precision: fwd (with and without bias), bwd_input, bwd_weight
 * accumulating into non-zero dW, db. */
static void matmul_case(const mm_shape *s, int bf) {
    int N = s->N, C = s->C, OC = s->OC;
    size_t nin = (size_t)N * C, nw = (size_t)OC * C, nout = (size_t)N * OC;
    char what[96];
    float *inp = falloc(nin), *w = falloc(nw), *b = falloc(OC), *dout = falloc(nout);
    fill_rand(inp, nin, -1, 1);
    fill_rand(w, nw, -1, 1);
    fill_rand(b, OC, -1, 1);
    fill_rand(dout, nout, -1, 1);
    float *out = falloc(nout), *ref = falloc(nout);
    float *dinp = falloc(nin), *dinp_ref = falloc(nin);
    float *dw0 = falloc(nw), *db0 = falloc(OC);
    fill_rand(dw0, nw, -0.5, 0.5);
    fill_rand(db0, OC, -0.5, 0.5);
    float *dw = fclone(dw0, nw), *dw_ref = fclone(dw0, nw), *db = fclone(db0, OC), *db_ref = fclone(db0, OC);

    for (int withb = 0; withb < 2; withb++) {
        OK(dn->matmul_fwd(out, inp, w, withb ? b : NULL, N, C, OC));
        CPU_OK(cpu->matmul_fwd(ref, inp, w, withb ? b : NULL, N, C, OC));
        snprintf(what, sizeof what, "matmul_fwd%s %dx%dx%d", withb ? "+bias" : "", N, C, OC);
        if (bf) check16(what, out, ref, NULL, nout, 0); else check32(what, out, ref, NULL, nout);
    }
    OK(dn->matmul_bwd_input(dinp, dout, w, N, C, OC));
    CPU_OK(cpu->matmul_bwd_input(dinp_ref, dout, w, N, C, OC));
    snprintf(what, sizeof what, "matmul_bwd_input %dx%dx%d", N, C, OC);
    if (bf) check16(what, dinp, dinp_ref, NULL, nin, 0); else check32(what, dinp, dinp_ref, NULL, nin);
    OK(dn->matmul_bwd_weight(dw, db, dout, inp, N, C, OC));
    CPU_OK(cpu->matmul_bwd_weight(dw_ref, db_ref, dout, inp, N, C, OC));
    snprintf(what, sizeof what, "matmul_bwd_weight dW+= %dx%dx%d", N, C, OC);
    if (bf) check16(what, dw, dw_ref, dw0, nw, 0); else check32(what, dw, dw_ref, dw0, nw);
    check_same("matmul_bwd_weight db", db, db_ref, OC);
    /* accumulation really happened: dW - dW0 is the product, not dW0 overwritten */
    double *inc = incr(dw, dw0, nw);
    double mx = 0;
    for (size_t i = 0; i < nw; i++) mx = fabs(inc[i]) > mx ? fabs(inc[i]) : mx;
    free(inc);
    ck_assert_msg(mx > 0.1, "dW increment ~0");

    if (bf) {
        /* against a reference on inputs rounded to bf16 here: only the summation order differs */
        float *ri = rounded(inp, nin), *rw = rounded(w, nw), *rd = rounded(dout, nout);
        float *dwr = fclone(dw0, nw), *dw2 = fclone(dw0, nw);
        OK(dn->matmul_fwd(out, inp, w, b, N, C, OC));
        CPU_OK(cpu->matmul_fwd(ref, ri, rw, b, N, C, OC));
        snprintf(what, sizeof what, "bf16-exact matmul_fwd %dx%dx%d", N, C, OC);
        check32(what, out, ref, NULL, nout);
        OK(dn->matmul_bwd_input(dinp, dout, w, N, C, OC));
        CPU_OK(cpu->matmul_bwd_input(dinp_ref, rd, rw, N, C, OC));
        snprintf(what, sizeof what, "bf16-exact matmul_bwd_input %dx%dx%d", N, C, OC);
        check32(what, dinp, dinp_ref, NULL, nin);
        OK(dn->matmul_bwd_weight(dw2, NULL, dout, inp, N, C, OC));
        CPU_OK(cpu->matmul_bwd_weight(dwr, NULL, rd, ri, N, C, OC));
        snprintf(what, sizeof what, "bf16-exact matmul_bwd_weight %dx%dx%d", N, C, OC);
        check32(what, dw2, dwr, dw0, nw);
        dn->free(ri); dn->free(rw); dn->free(rd); dn->free(dwr); dn->free(dw2);
    }
    float *bufs[] = {inp, w, b, dout, out, ref, dinp, dinp_ref, dw0, db0, dw, dw_ref, db, db_ref};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dn->free(bufs[i]);
}

START_TEST(test_matmul_fp32) {
    use_prec(PL_PREC_FP32);
    rng_seed(1);
    for (size_t i = 0; i < sizeof mm_shapes / sizeof mm_shapes[0]; i++) matmul_case(&mm_shapes[i], 0);
}
END_TEST

START_TEST(test_matmul_bf16) {
    if (!bf16_ok) return;
    use_prec(PL_PREC_BF16);
    rng_seed(2);
    for (size_t i = 0; i < sizeof mm_shapes / sizeof mm_shapes[0]; i++) matmul_case(&mm_shapes[i], 1);
    use_prec(PL_PREC_FP32);
}
END_TEST

/* degenerate sizes: nothing to multiply, or an empty inner dimension */
START_TEST(test_matmul_edges) {
    use_prec(PL_PREC_FP32);
    float *x = falloc(64), *y = falloc(64), *b = falloc(8);
    for (int i = 0; i < 8; i++) b[i] = (float)i;
    for (int i = 0; i < 64; i++) y[i] = 5.0f;
    OK(dn->matmul_fwd(y, x, x, b, 4, 0, 8)); /* C = 0: out = b */
    for (int i = 0; i < 32; i++) ck_assert_float_eq(y[i], (float)(i % 8));
    OK(dn->matmul_fwd(y, x, x, b, 0, 4, 8));
    OK(dn->matmul_bwd_input(y, x, x, 4, 8, 0)); /* OC = 0: dinp = 0 */
    for (int i = 0; i < 32; i++) ck_assert_float_eq(y[i], 0.0f);
    OK(dn->matmul_bwd_weight(y, b, x, x, 0, 4, 8));
    ck_assert_int_eq(dn->matmul_fwd(y, x, x, b, -1, 4, 8), PL_EBACKEND);
    ck_assert_msg(strstr(dn->error(), "invalid shape"), "message: %s", dn->error());
    ck_assert_int_eq(dn->attention_gqa_fwd(y, y, x, 1, 2, 3, 2, 4, NULL), PL_EBACKEND); /* NH % NKV != 0 */
    dn->free(x); dn->free(y); dn->free(b);
}
END_TEST

// ----------------------------------------------------------------------------
// attention

static void attention_case(const att_shape *s, int bf) {
    int B = s->B, T = s->T, C = s->C, NH = s->NH;
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
    char what[96];
    float *qkv = falloc(nqkv), *dout = falloc(nout);
    fill_rand(qkv, nqkv, -1, 1);
    fill_rand(dout, nout, -1, 1);
    float *out = falloc(nout), *att = falloc(natt), *dqkv = falloc(nqkv);
    float *out_r = falloc(nout), *att_r = falloc(natt), *dqkv_r = falloc(nqkv);
    for (size_t i = 0; i < nqkv; i++) dqkv[i] = 1e30f; /* overwritten, not accumulated */
    /* GPT-2's multi-head attention: the grouped-query ops with NKV = NH, HS = C / NH */
    OK(dn->attention_gqa_fwd(out, att, qkv, B, T, NH, NH, C / NH, NULL));
    CPU_OK(cpu->attention_gqa_fwd(out_r, att_r, qkv, B, T, NH, NH, C / NH, NULL));
    OK(dn->attention_gqa_bwd(dqkv, dout, qkv, att, B, T, NH, NH, C / NH, NULL));
    CPU_OK(cpu->attention_gqa_bwd(dqkv_r, dout, qkv, att_r, B, T, NH, NH, C / NH, NULL));
    /* the masked upper triangle is exactly 0 and rows sum to 1 */
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < T; t++) {
            const float *r = att + ((size_t)bh * T + t) * T;
            double sum = 0;
            for (int j = 0; j < T; j++) {
                if (j > t) ck_assert_msg(r[j] == 0.0f, "att[%d][%d][%d] = %g above the diagonal", bh, t, j, r[j]);
                sum += r[j];
            }
            ck_assert_msg(fabs(sum - 1) < 1e-5, "att row sum %g", sum);
        }
    const char *names[3] = {"attention out", "attention att", "attention dqkv"};
    const float *got[3] = {out, att, dqkv}, *ref[3] = {out_r, att_r, dqkv_r};
    size_t ns[3] = {nout, natt, nqkv};
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what, "%s B%d T%d C%d NH%d", names[i], B, T, C, NH);
        if (bf) check16(what, got[i], ref[i], NULL, ns[i], 1); else check32(what, got[i], ref[i], NULL, ns[i]);
    }
    float *bufs[] = {qkv, dout, out, att, dqkv, out_r, att_r, dqkv_r};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dn->free(bufs[i]);
}

START_TEST(test_attention_fp32) {
    use_prec(PL_PREC_FP32);
    rng_seed(3);
    for (size_t i = 0; i < sizeof att_shapes / sizeof att_shapes[0]; i++) attention_case(&att_shapes[i], 0);
}
END_TEST

START_TEST(test_attention_bf16) {
    if (!bf16_ok) return;
    use_prec(PL_PREC_BF16);
    rng_seed(4);
    for (size_t i = 0; i < sizeof att_shapes / sizeof att_shapes[0]; i++) attention_case(&att_shapes[i], 1);
    use_prec(PL_PREC_FP32);
}
END_TEST

// ----------------------------------------------------------------------------
// the table: only what differs from backend_cpu; the rest is backend_cpu's own functions

/* Every op the oneDNN table leaves NULL is, once registered, backend_cpu's very function (so
 * its bits are the CPU's by construction); the ones it states are its own. */
START_TEST(test_table) {
    int own = 0, taken = 0;
#define PL_MEM_OP(ret, name, params, args, cls)                                                   \
    if (backend_onednn.name) {                                                                    \
        own++;                                                                                    \
        ck_assert_msg(dn->name == backend_onednn.name, "%s: not the oneDNN backend's", #name);    \
    } else {                                                                                      \
        taken++;                                                                                  \
        ck_assert_msg(dn->name == cpu->name, "%s: not backend_cpu's", #name);                     \
    }
#define PL_COMPUTE_OP(ret, name, params, args, cls) PL_MEM_OP(ret, name, params, args, cls)
#include "pipelm/backend_ops.h"
    /* the three matmuls, the two attention ops, onednn_ops.c's nine (LayerNorm x3, GELU x2,
     * cross-entropy x2, AdamW, sumsq), onednn_elem.c's four (encoder x2, residual, add),
     * onednn_llama.c's five (RMSNorm x3, SwiGLU x2), and alloc, free, from_host, copy, zero,
     * map, unmap and scale wrapped to tell the weight cache */
    ck_assert_int_eq(own, 31);
    ck_assert_ptr_nonnull(backend_onednn.matmul_fwd);
    ck_assert_ptr_nonnull(backend_onednn.attention_gqa_bwd);
    ck_assert_ptr_nonnull(backend_onednn.layernorm_fwd);
    ck_assert_ptr_nonnull(backend_onednn.residual_fwd);
    ck_assert_ptr_null(backend_onednn.rope_fwd);
    ck_assert_int_eq(taken, 9); /* to_host, synchronize, RoPE x2, matmul_decode_fwd, attention_kv_fwd, and
                                 * Mixtral's moe_gather, moe_combine, moe_rowdot */
    ck_assert_int_eq(dn->synchronize(), 0);
    /* an op taken from backend_cpu reports into this backend's error() */
    float x[8] = {0};
    ck_assert_int_eq(dn->rope_fwd(x, x, x, x, 1, 1, 1, 1, 3), PL_EBACKEND); /* odd head size */
    ck_assert_msg(strstr(dn->error(), "rope_fwd") != NULL, "error() = '%s'", dn->error());
    /* memory: host memory, the view is the buffer */
    void *h = NULL;
    OK(dn->map(&h, x, sizeof x, PL_MAP_READ));
    ck_assert_ptr_eq(h, x);
    OK(dn->unmap(h, x, sizeof x, PL_MAP_READ));
}
END_TEST

// ----------------------------------------------------------------------------
// Llama ops: grouped-query attention (oneDNN products) against backend_cpu's; RMSNorm, RoPE
// and SwiGLU (delegated) bit-identical to it

typedef struct { int B, T, NH, NKV, HS; } gqa_shape;
static const gqa_shape gqa_shapes[] = {{3, 13, 6, 2, 8}, {2, 40, 8, 1, 12}, {2, 17, 4, 4, 6}, {1, 71, 4, 2, 8}};

/* withdoc: document masking (backend_ops.h's doc), sequence 0 one document, the others
 * documents from rows 1, T/3 and T/2 (checked against backend_cpu's masked path too, and the
 * masked probabilities zero). */
static void gqa_case(const gqa_shape *s, int bf, int withdoc) {
    int B = s->B, T = s->T, NH = s->NH, NKV = s->NKV, HS = s->HS, W = (NH + 2 * NKV) * HS;
    int *doc = NULL;
    if (withdoc) {
        doc = calloc((size_t)B * T, sizeof(int));
        for (int b = 1; b < B; b++)
            for (int t = 0; t < T; t++) doc[b * T + t] = t >= T / 2 ? T / 2 : t >= T / 3 ? T / 3 : t >= 1 ? 1 : 0;
    }
    size_t nqkv = (size_t)B * T * W, nout = (size_t)B * T * NH * HS, natt = (size_t)B * NH * T * T;
    char what[96];
    float *qkv = falloc(nqkv), *dout = falloc(nout);
    fill_rand(qkv, nqkv, -1, 1);
    fill_rand(dout, nout, -1, 1);
    float *out = falloc(nout), *att = falloc(natt), *dqkv = falloc(nqkv);
    float *out_r = falloc(nout), *att_r = falloc(natt), *dqkv_r = falloc(nqkv);
    for (size_t i = 0; i < nqkv; i++) dqkv[i] = 1e30f; /* overwritten, not accumulated */
    OK(dn->attention_gqa_fwd(out, att, qkv, B, T, NH, NKV, HS, doc));
    CPU_OK(cpu->attention_gqa_fwd(out_r, att_r, qkv, B, T, NH, NKV, HS, doc));
    OK(dn->attention_gqa_bwd(dqkv, dout, qkv, att, B, T, NH, NKV, HS, doc));
    CPU_OK(cpu->attention_gqa_bwd(dqkv_r, dout, qkv, att_r, B, T, NH, NKV, HS, doc));
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < T; j++)
                if (j > t || (doc && j < doc[(bh / NH) * T + t]))
                    ck_assert_msg(att[((size_t)bh * T + t) * T + j] == 0.0f, "gqa att masked at %d %d %d", bh, t, j);
    const char *names[3] = {"gqa out", "gqa att", "gqa dqkv"};
    const float *got[3] = {out, att, dqkv}, *ref[3] = {out_r, att_r, dqkv_r};
    size_t ns[3] = {nout, natt, nqkv};
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what, "%s%s B%d T%d NH%d NKV%d HS%d", names[i], doc ? " doc" : "", B, T, NH, NKV, HS);
        if (bf) check16(what, got[i], ref[i], NULL, ns[i], 1); else check32(what, got[i], ref[i], NULL, ns[i]);
    }
    /* twice: the same bits */
    float *out2 = falloc(nout), *att2 = falloc(natt), *dqkv2 = falloc(nqkv);
    OK(dn->attention_gqa_fwd(out2, att2, qkv, B, T, NH, NKV, HS, doc));
    OK(dn->attention_gqa_bwd(dqkv2, dout, qkv, att2, B, T, NH, NKV, HS, doc));
    check_same("gqa out repeated", out, out2, nout);
    check_same("gqa dqkv repeated", dqkv, dqkv2, nqkv);
    if (doc) { /* no document token: an all-zero doc is NULL's bits */
        memset(doc, 0, sizeof(int) * (size_t)B * T);
        OK(dn->attention_gqa_fwd(out2, att2, qkv, B, T, NH, NKV, HS, doc));
        OK(dn->attention_gqa_bwd(dqkv2, dout, qkv, att2, B, T, NH, NKV, HS, doc));
        OK(dn->attention_gqa_fwd(out_r, att_r, qkv, B, T, NH, NKV, HS, NULL));
        OK(dn->attention_gqa_bwd(dqkv_r, dout, qkv, att_r, B, T, NH, NKV, HS, NULL));
        check_same("gqa out, zero doc and none", out2, out_r, nout);
        check_same("gqa dqkv, zero doc and none", dqkv2, dqkv_r, nqkv);
    }
    free(doc);
    float *bufs[] = {qkv, dout, out, att, dqkv, out_r, att_r, dqkv_r, out2, att2, dqkv2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dn->free(bufs[i]);
}

START_TEST(test_gqa_fp32) {
    use_prec(PL_PREC_FP32);
    rng_seed(21);
    for (size_t i = 0; i < sizeof gqa_shapes / sizeof gqa_shapes[0]; i++) {
        gqa_case(&gqa_shapes[i], 0, 0);
        gqa_case(&gqa_shapes[i], 0, 1);
    }
    float *x = falloc(1024);
    ck_assert_int_eq(dn->attention_gqa_fwd(x, x, x, 1, 2, 3, 2, 4, NULL), PL_EBACKEND); /* NH % NKV != 0 */
    ck_assert_int_eq(dn->attention_gqa_bwd(x, x, x, x, 1, 2, 3, 2, 4, NULL), PL_EBACKEND);
    dn->free(x);
}
END_TEST

START_TEST(test_gqa_bf16) {
    if (!bf16_ok) return;
    use_prec(PL_PREC_BF16);
    rng_seed(22);
    for (size_t i = 0; i < sizeof gqa_shapes / sizeof gqa_shapes[0]; i++) {
        gqa_case(&gqa_shapes[i], 1, 0);
        gqa_case(&gqa_shapes[i], 1, 1);
    }
    use_prec(PL_PREC_FP32);
}
END_TEST


/* attention=tiled (the CPU backend's tiled kernels, bf16 products' inputs rounded in bf16)
 * against this backend's own (T, T) path: fp32 within TOL32, bf16 within the attention bf16
 * bounds of it (and of backend_cpu's fp32: a bf16 result, not fp32); the same bits with 1 and
 * 3 threads; attention_cols HS + 1 (O(T)); with document masking too. */
static void tiled_case(int prec, const int *doc) {
    enum { B = 2, T = 150, NH = 4, NKV = 2, HS = 16, W = (NH + 2 * NKV) * HS };
    size_t nq = (size_t)B * T * W, no = (size_t)B * T * NH * HS, na = (size_t)B * NH * T * T;
    int bf = prec == PL_PREC_BF16;
    float *qkv = falloc(nq), *dout = falloc(no);
    fill_rand(qkv, nq, -1, 1);
    fill_rand(dout, no, -1, 1);
    float *o[3], *g[3], *a[3], *ro = falloc(no), *ra = falloc(na), *rg = falloc(nq);
    CPU_OK(cpu->attention_gqa_fwd(ro, ra, qkv, B, T, NH, NKV, HS, doc));
    CPU_OK(cpu->attention_gqa_bwd(rg, dout, qkv, ra, B, T, NH, NKV, HS, doc));
    static const char *const set[3] = {"attention=full", "attention=tiled", "attention=tiled"};
    for (int m = 0; m < 3; m++) { /* full, tiled on 1 thread, tiled on 3 */
        backend_options op = {prec, m == 2 ? 3 : 1, -1, 0, 0, set[m]};
        char err[512] = "";
        ck_assert_msg(dn->init(&op, err, sizeof err) == 0, "init %s: %s", set[m], err);
        ck_assert_int_eq(dn->attention_cols(B, T, NH, HS), m ? HS + 1 : T);
        o[m] = falloc(no), g[m] = falloc(nq), a[m] = falloc(m ? (size_t)B * NH * T * (HS + 1) : na);
        OK(dn->attention_gqa_fwd(o[m], a[m], qkv, B, T, NH, NKV, HS, doc));
        OK(dn->attention_gqa_bwd(g[m], dout, qkv, a[m], B, T, NH, NKV, HS, doc));
    }
    const char *pn = bf ? "bf16" : "fp32", *dn_ = doc ? " doc" : "";
    char what[128];
    snprintf(what, sizeof what, "%s%s tiled out vs the (T, T) path", pn, dn_);
    if (bf) check16(what, o[1], o[0], NULL, no, 1); else check32(what, o[1], o[0], NULL, no);
    snprintf(what, sizeof what, "%s%s tiled dqkv vs the (T, T) path", pn, dn_);
    if (bf) check16(what, g[1], g[0], NULL, nq, 1); else check32(what, g[1], g[0], NULL, nq);
    if (bf) {
        snprintf(what, sizeof what, "bf16%s tiled out vs backend_cpu fp32", dn_);
        check16(what, o[1], ro, NULL, no, 1);
        snprintf(what, sizeof what, "bf16%s tiled dqkv vs backend_cpu fp32", dn_);
        check16(what, g[1], rg, NULL, nq, 1);
        /* it rounds where the (T, T) path rounds: nearer to that path than to fp32 (a tiled
         * backward left in fp32 is the other way round) */
        double *t = incr(g[1], NULL, nq), *f = incr(g[0], NULL, nq), *c = incr(rg, NULL, nq), r16, r32, cs;
        l2_cos(t, f, nq, &r16, &cs);
        l2_cos(t, c, nq, &r32, &cs);
        free(t); free(f); free(c);
        ck_assert_msg(r16 < r32, "bf16%s tiled dqkv: l2-rel %.3e to the bf16 (T, T) path, %.3e to fp32", dn_, r16, r32);
    }
    snprintf(what, sizeof what, "%s%s tiled out, 1 and 3 threads", pn, dn_);
    check_same(what, o[1], o[2], no);
    snprintf(what, sizeof what, "%s%s tiled dqkv, 1 and 3 threads", pn, dn_);
    check_same(what, g[1], g[2], nq);
    for (int m = 0; m < 3; m++) { dn->free(o[m]); dn->free(g[m]); dn->free(a[m]); }
    dn->free(qkv); dn->free(dout); dn->free(ro); dn->free(ra); dn->free(rg);
}

START_TEST(test_gqa_tiled) {
    enum { B = 2, T = 150 };
    int *doc = calloc((size_t)B * T, sizeof(int));
    for (int t = 0; t < T; t++) doc[T + t] = t >= 100 ? 100 : t >= 64 ? 64 : t >= 3 ? 3 : 0;
    rng_seed(23);
    for (int bf = 0; bf < 2; bf++) {
        if (bf && !bf16_ok) break;
        tiled_case(bf ? PL_PREC_BF16 : PL_PREC_FP32, NULL);
        tiled_case(bf ? PL_PREC_BF16 : PL_PREC_FP32, doc);
    }
    free(doc);
    use_prec(PL_PREC_FP32);
}
END_TEST

// ----------------------------------------------------------------------------
// determinism

/* All the oneDNN ops of one precision on one matmul and one attention shape; results into r[]
 * (10 buffers, allocated here). */
enum { NRES = 7 };
static void run_all(float **r, int bf, int threads, uint64_t seed) {
    (void)bf;
    OK(dn->set_threads(threads));
    ck_assert_int_eq(dn->get_threads(), threads);
    const mm_shape *s = &mm_shapes[1];
    const att_shape *a = &att_shapes[2]; /* T = 96: bf16 splits the causal products */
    int N = s->N, C = s->C, OC = s->OC;
    size_t nin = (size_t)N * C, nw = (size_t)OC * C, nout = (size_t)N * OC;
    size_t nqkv = (size_t)a->B * a->T * 3 * a->C, naout = (size_t)a->B * a->T * a->C,
           natt = (size_t)a->B * a->NH * a->T * a->T;
    rng_seed(seed);
    float *inp = falloc(nin), *w = falloc(nw), *b = falloc(OC), *dout = falloc(nout), *qkv = falloc(nqkv),
          *adout = falloc(naout);
    fill_rand(inp, nin, -1, 1);
    fill_rand(w, nw, -1, 1);
    fill_rand(b, OC, -1, 1);
    fill_rand(dout, nout, -1, 1);
    fill_rand(qkv, nqkv, -1, 1);
    fill_rand(adout, naout, -1, 1);
    r[0] = falloc(nout);
    r[1] = falloc(nin);
    r[2] = falloc(nw);
    r[3] = falloc(OC);
    r[4] = falloc(naout);
    r[5] = falloc(natt);
    r[6] = falloc(nqkv);
    fill_rand(r[2], nw, -0.5, 0.5);
    fill_rand(r[3], OC, -0.5, 0.5);
    OK(dn->matmul_fwd(r[0], inp, w, b, N, C, OC));
    OK(dn->matmul_bwd_input(r[1], dout, w, N, C, OC));
    OK(dn->matmul_bwd_weight(r[2], r[3], dout, inp, N, C, OC));
    OK(dn->attention_gqa_fwd(r[4], r[5], qkv, a->B, a->T, a->NH, a->NH, a->C / a->NH, NULL));
    OK(dn->attention_gqa_bwd(r[6], adout, qkv, r[5], a->B, a->T, a->NH, a->NH, a->C / a->NH, NULL));
    dn->free(inp); dn->free(w); dn->free(b); dn->free(dout); dn->free(qkv); dn->free(adout);
}
static size_t res_bytes(int i) {
    const mm_shape *s = &mm_shapes[1];
    const att_shape *a = &att_shapes[2]; /* T = 96: bf16 splits the causal products */
    size_t n[NRES] = {(size_t)s->N * s->OC, (size_t)s->N * s->C, (size_t)s->OC * s->C, (size_t)s->OC,
                      (size_t)a->B * a->T * a->C, (size_t)a->B * a->NH * a->T * a->T, (size_t)a->B * a->T * 3 * a->C};
    return n[i] * sizeof(float);
}
static const char *res_name[NRES] = {"matmul_fwd", "matmul_bwd_input", "matmul_bwd_weight dW", "matmul_bwd_weight db",
                                     "attention out", "attention att", "attention dqkv"};

START_TEST(test_repeat) {
    for (int bf = 0; bf < 2; bf++) {
        if (bf && !bf16_ok) continue;
        use_prec(bf ? PL_PREC_BF16 : PL_PREC_FP32);
        float *r1[NRES], *r2[NRES];
        run_all(r1, bf, default_threads, 7);
        run_all(r2, bf, default_threads, 7);
        for (int i = 0; i < NRES; i++) {
            char what[96];
            snprintf(what, sizeof what, "%s %s twice", bf ? "bf16" : "fp32", res_name[i]);
            check_same(what, r1[i], r2[i], res_bytes(i) / sizeof(float));
            dn->free(r1[i]);
            dn->free(r2[i]);
        }
    }
    use_prec(PL_PREC_FP32);
}
END_TEST

/* 1 vs 2 threads. By construction (our loops: fixed per-element order, threads split the
 * output): db, the softmax (att rows once the scores are given) and every delegated op. The
 * oneDNN products themselves: oneDNN makes no promise, and a K-split in its parallel
 * decomposition would change the order of the sums; on these shapes the results are
 * bit-identical, which this test asserts so that a change shows up. */
START_TEST(test_threads) {
    for (int bf = 0; bf < 2; bf++) {
        if (bf && !bf16_ok) continue;
        use_prec(bf ? PL_PREC_BF16 : PL_PREC_FP32);
        float *r1[NRES], *r2[NRES];
        run_all(r1, bf, 1, 8);
        run_all(r2, bf, 2, 8);
        for (int i = 0; i < NRES; i++) {
            char what[96];
            snprintf(what, sizeof what, "%s %s with 1 and 2 threads", bf ? "bf16" : "fp32", res_name[i]);
            check_same(what, r1[i], r2[i], res_bytes(i) / sizeof(float));
            dn->free(r1[i]);
            dn->free(r2[i]);
        }
    }
    OK(dn->set_threads(default_threads));
    use_prec(PL_PREC_FP32);
}
END_TEST

/* onednn_ops.c's ops (LayerNorm, GELU, cross-entropy, AdamW, sumsq), onednn_elem.c's (encoder,
 * residual, add, scale, the bias-gradient column sum of matmul_bwd_weight) and onednn_llama.c's
 * (RMSNorm, SwiGLU) on odd shapes (C, V and n not multiples of 16, sumsq over several chunks, db
 * over two column chunks) with `threads` threads and the given --backend-opt settings; results
 * into r[] (VNRES buffers, allocated here). */
enum { VN = 37, VC = 83, VV = 1001, VVP = 1024, VNE = 100003, VEV = 50, VET = 5, VMO = 300, VNRES = 27 };
static const size_t vsize[VNRES] = {VN * VC, VN, VN, VN * VC, VC, VC, VNE, VNE, VN, VN * VVP, VN * VVP, 3 * VNE, 1,
                                    VN * VC, VEV * VC, VET * VC, VNE, VNE, VNE, VN * VC, VN, VN * VC, VC,
                                    VNE, VNE, VNE, VMO};
/* Results that are the CPU backend's bits in both precisions (onednn_elem.c's), and the ones
 * that are in fp32 only (onednn_llama.c's: AVX-512 in bf16). */
static int vres_exact(int i, int bf) { return (i >= 13 && i <= 18) || i == 26 || (!bf && i >= 19 && i <= 25); }
static void vec_ops_run(float **r, int prec, int threads, const char *settings) {
    backend_options o = {prec, threads, -1, 0, 0, settings};
    char err[512] = "";
    ck_assert_msg(dn->init(&o, err, sizeof err) == 0, "init: %s", err);
    OK(dn->set_threads(threads));
    rng_seed(11);
    float *x = falloc(VN * VC), *w = falloc(VC), *b = falloc(VC), *dy = falloc(VNE), *g = falloc(VNE);
    float *wte = falloc(VEV * VC), *wpe = falloc(VET * VC), *mo = falloc(VN * VMO), *dw = falloc(VMO * VC);
    int tg[VN];
    fill_rand(x, VN * VC, -2, 2); fill_rand(w, VC, -1, 1); fill_rand(b, VC, -1, 1);
    fill_rand(dy, VNE, -1, 1); fill_rand(g, VNE, -1e-2, 1e-2);
    fill_rand(wte, VEV * VC, -1, 1); fill_rand(wpe, VET * VC, -1, 1); fill_rand(mo, VN * VMO, -1, 1);
    for (int i = 0; i < VN; i++) tg[i] = (i * 97) % VV;
    for (int i = 0; i < VNRES; i++) r[i] = falloc(vsize[i]);
    fill_rand(r[3], VN * VC, -1, 1); fill_rand(r[4], VC, -1, 1); fill_rand(r[5], VC, -1, 1);
    OK(dn->layernorm_fwd(r[0], r[1], r[2], x, w, b, VN, VC));
    OK(dn->layernorm_bwd_input(r[3], dy, x, w, r[1], r[2], VN, VC));
    OK(dn->layernorm_bwd_weight(r[4], r[5], dy, x, r[1], r[2], VN, VC));
    OK(dn->gelu_fwd(r[6], dy, VNE));
    OK(dn->gelu_bwd(r[7], dy, g, VNE));
    fill_rand(r[9], VN * VVP, -8, 8);
    OK(dn->crossentropy_fwd(r[8], r[9], tg, VN, VV, VVP));
    memcpy(r[10], r[9], sizeof(float) * VN * VVP);
    OK(dn->crossentropy_bwd(r[10], tg, 0.25f, VN, VV, VVP));
    fill_rand(r[11], 3 * VNE, 0, 1e-3); /* p, m, v */
    OK(dn->adamw(r[11], g, r[11] + VNE, r[11] + 2 * VNE, VNE, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3));
    double sq = 0;
    OK(dn->sumsq(dy, VNE, &sq));
    r[12][0] = (float)sq;
    /* the embedding: rows hit tokens repeatedly (tok = i * 7 % VEV), positions i % VET */
    int tok[VN];
    for (int i = 0; i < VN; i++) tok[i] = (i * 7) % VEV;
    OK(dn->encoder_fwd(r[13], tok, wte, wpe, VN, VET, VC));
    fill_rand(r[14], VEV * VC, -1, 1); fill_rand(r[15], VET * VC, -1, 1);
    OK(dn->encoder_bwd(r[14], r[15], x, tok, VN, VET, VC));
    OK(dn->residual_fwd(r[16], dy, g, VNE));
    memcpy(r[17], dy, sizeof(float) * VNE);
    OK(dn->add_inplace(r[17], g, VNE));
    memcpy(r[18], dy, sizeof(float) * VNE);
    OK(dn->scale(r[18], 0.3f, VNE));
    OK(dn->rmsnorm_fwd(r[19], r[20], x, w, VN, VC, 1e-5f));
    fill_rand(r[21], VN * VC, -1, 1); fill_rand(r[22], VC, -1, 1);
    OK(dn->rmsnorm_bwd_input(r[21], dy, x, w, r[20], VN, VC));
    OK(dn->rmsnorm_bwd_weight(r[22], dy, x, r[20], VN, VC));
    fill_rand(r[24], VNE, -4, 4); /* the gate */
    OK(dn->swiglu_fwd(r[23], dy, r[24], VNE));
    memcpy(r[25], r[24], sizeof(float) * VNE);
    OK(dn->swiglu_bwd(r[24], r[25], g, dy, r[25], VNE)); /* dup over a spare, dgate over the gate */
    fill_rand(r[26], VMO, -1, 1);
    OK(dn->matmul_bwd_weight(dw, r[26], mo, x, VN, VC, VMO)); /* db: dout's column sums */
    float *tmp[] = {x, w, b, dy, g, wte, wpe, mo, dw};
    for (size_t i = 0; i < sizeof tmp / sizeof tmp[0]; i++) dn->free(tmp[i]);
}

/* The vector ops: within TOL32 of the CPU backend's (vec-ops=0 is the CPU backend's own, bit for
 * bit; onednn_elem.c's are its bits, and onednn_llama.c's in fp32), and the same bits with 1 and 2
 * threads; both precisions (the ops are fp32 in both). */
START_TEST(test_vec_ops) {
    for (int bf = 0; bf < 2; bf++) {
        if (bf && !bf16_ok) continue;
        int prec = bf ? PL_PREC_BF16 : PL_PREC_FP32;
        float *v1[VNRES], *v2[VNRES], *c[VNRES];
        vec_ops_run(v1, prec, 1, NULL);
        vec_ops_run(v2, prec, 2, NULL);
        vec_ops_run(c, prec, 2, "vec-ops=0");
        float *ref[VNRES];
        /* the CPU backend on the same inputs: vec_ops_run through cpu's table */
        const backend *save = dn;
        dn = cpu;
        vec_ops_run(ref, PL_PREC_FP32, 2, NULL);
        dn = save;
        for (int i = 0; i < VNRES; i++) {
            char what[96];
            snprintf(what, sizeof what, "%s vector op result %d, 1 and 2 threads", bf ? "bf16" : "fp32", i);
            check_same(what, v1[i], v2[i], vsize[i]);
            snprintf(what, sizeof what, "%s vec-ops=0 result %d is the cpu backend's", bf ? "bf16" : "fp32", i);
            check_same(what, c[i], ref[i], vsize[i]);
            snprintf(what, sizeof what, "%s vector op result %d vs cpu", bf ? "bf16" : "fp32", i);
            if (vres_exact(i, bf)) check_same(what, v1[i], ref[i], vsize[i]);
            else if (i != 12) check32(what, v1[i], ref[i], NULL, vsize[i]);
            else ck_assert_msg(fabsf(v1[i][0] - ref[i][0]) <= 1e-6f * ref[i][0], "sumsq %g vs %g", v1[i][0], ref[i][0]);
            dn->free(v1[i]); dn->free(v2[i]); dn->free(c[i]); dn->free(ref[i]);
        }
    }
    OK(dn->set_threads(default_threads));
    use_prec(PL_PREC_FP32);
}
END_TEST

/* the primitive cache: a repeated product creates nothing; more shapes than the cache holds
 * are evicted and still compute correctly */
START_TEST(test_cache) {
    use_prec(PL_PREC_FP32);
    float *x = falloc(64 * 64), *w = falloc(64 * 64), *o = falloc(64 * 64), *ref = falloc(64 * 64);
    rng_seed(9);
    fill_rand(x, 64 * 64, -1, 1);
    fill_rand(w, 64 * 64, -1, 1);
    OK(dn->matmul_fwd(o, x, w, NULL, 5, 7, 9));
    long c0 = onednn_primitives_created();
    OK(dn->matmul_fwd(o, x, w, NULL, 5, 7, 9));
    ck_assert_int_eq(onednn_primitives_created(), c0);
    for (int k = 1; k <= 70; k++) {
        int N = 1 + k % 11, C = 1 + k % 7 + k / 11, OC = 1 + k;
        OK(dn->matmul_fwd(o, x, w, NULL, N, C, OC));
        CPU_OK(cpu->matmul_fwd(ref, x, w, NULL, N, C, OC));
        char what[64];
        snprintf(what, sizeof what, "cache case %d (%dx%dx%d)", k, N, C, OC);
        check32(what, o, ref, NULL, (size_t)N * OC);
    }
    ck_assert_int_ge(onednn_primitives_created(), c0 + 70);
    dn->free(x); dn->free(w); dn->free(o); dn->free(ref);
}
END_TEST


// ----------------------------------------------------------------------------
// the bf16 weight cache (onednn_wcache.c): which ranges are weights, which writes make a copy
// stale; the module runs on any CPU (switched on here by hand, with the backend's converter),
// the products with it only where bf16 runs

static void cvt_vec(uint16_t *d, const float *s, size_t n) { onednn_cvt_bf16(d, s, n, 0); }

static long made(void) {
    wcache_stats s;
    wcache_get_stats(&s);
    return s.made;
}

/* The cache's copy of (w, n), checked against a conversion made here; *mk: copies made for it. */
static void copy_ok(const float *w, size_t n, long want_made, const char *what) {
    long m0 = made();
    const uint16_t *c = NULL;
    wcache_get(w, n, &c);
    ck_assert_msg(c != NULL, "%s: no copy", what);
    uint16_t *ref = malloc(2 * n);
    ck_assert_ptr_nonnull(ref);
    onednn_cvt_bf16(ref, w, n, 1);
    ck_assert_msg(memcmp(c, ref, 2 * n) == 0, "%s: the copy is not the bf16 of the current values", what);
    free(ref);
    ck_assert_msg(made() - m0 == want_made, "%s: %ld copies made, want %ld", what, made() - m0, want_made);
}

enum { WN = 3000, WAT = 1234 };

/* One write of each kind the backend sees, into x[at] (a new value each time); kind 6 is a map
 * for reading (no write). */
static void write_kind(int kind, float *x, size_t at, float *g, float *m, float *v) {
    static float val = 0.25f;
    val += 0.125f;
    void *h = NULL;
    switch (kind) {
    case 0: OK(dn->from_host(x + at, &val, sizeof val)); break;
    case 1: { float *t = falloc(1); *t = val; OK(dn->copy(x + at, t, sizeof(float))); dn->free(t); break; }
    case 2: OK(dn->zero(x + at, sizeof(float))); break;
    case 3: OK(dn->scale(x + at, 3.0f, 1)); break;
    case 4: g[at] = val; OK(dn->adamw(x + at, g + at, m + at, v + at, 1, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, 2)); break;
    case 5:
        OK(dn->map(&h, x, WN * sizeof(float), PL_MAP_WRITE));
        ((float *)h)[at] = val;
        OK(dn->unmap(h, x, WN * sizeof(float), PL_MAP_WRITE));
        break;
    default: OK(dn->map(&h, x, WN * sizeof(float), PL_MAP_READ)); OK(dn->unmap(h, x, WN * sizeof(float), PL_MAP_READ));
    }
}

START_TEST(test_wcache) {
    use_prec(PL_PREC_FP32);
    wcache_enable(1, cvt_vec);
    rng_seed(21);
    float *w = falloc(WN), *g = falloc(WN), *m = falloc(WN), *v = falloc(WN), *o = falloc(WN);
    fill_rand(w, WN, -1, 1);
    fill_rand(g, WN, -1, 1);
    const uint16_t *c = NULL;
    wcache_get(w, WN, &c);
    ck_assert_msg(c == NULL, "a range AdamW never updated is not weights");
    OK(dn->adamw(w, g, m, v, WN, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1));
    copy_ok(w, WN, 1, "after AdamW");
    copy_ok(w, WN, 0, "again, unchanged");
    copy_ok(w + 100, 500, 1, "a part of the weights");
    /* writes beside the weights leave the copies as they are */
    for (int k = 0; k < 7; k++) write_kind(k, o, WAT, g, m, v);
    copy_ok(w, WN, 0, "after writes elsewhere");
    copy_ok(w + 100, 500, 0, "the part, after writes elsewhere");
    for (int k = 0; k < 7; k++) {
        char what[64];
        snprintf(what, sizeof what, "after write kind %d", k);
        if (verbose) printf("  weight cache: %s\n", what);
        write_kind(k, w, WAT, g, m, v);
        copy_ok(w, WN, k == 6 ? 0 : 1, what);
        /* (the map of kind 5 covers the whole buffer, the part too) */
        copy_ok(w + 100, 500, k == 5 ? 1 : 0, "the part, after a write outside it");
        write_kind(k, w, 300, g, m, v);
        copy_ok(w + 100, 500, k == 6 ? 0 : 1, "the part, after a write into it");
        copy_ok(w, WN, k == 6 ? 0 : 1, "the whole, after a write into the part");
    }
    /* a map for writing: stale from the map to the unmap (a copy made in between is redone) */
    void *h = NULL;
    OK(dn->map(&h, w, WN * sizeof(float), PL_MAP_WRITE));
    copy_ok(w, WN, 1, "while mapped for writing");
    ((float *)h)[7] += 1.0f;
    OK(dn->unmap(h, w, WN * sizeof(float), PL_MAP_WRITE));
    copy_ok(w, WN, 1, "after the unmap");
    /* a view of a whole allocation AdamW updated a part of (ZeRO-1's gather): all of it is
     * weights after the unmap; a view of a part, or of an allocation without weights, is not */
    float *za = falloc(2 * WN), *zb = falloc(2 * WN);
    fill_rand(za, 2 * WN, -1, 1);
    OK(dn->adamw(za, g, m, v, WN, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1));
    OK(dn->map(&h, za + WN, WN * sizeof(float), PL_MAP_READ | PL_MAP_WRITE));
    OK(dn->unmap(h, za + WN, WN * sizeof(float), PL_MAP_READ | PL_MAP_WRITE));
    OK(dn->map(&h, zb, 2 * WN * sizeof(float), PL_MAP_READ | PL_MAP_WRITE));
    OK(dn->unmap(h, zb, 2 * WN * sizeof(float), PL_MAP_READ | PL_MAP_WRITE));
    wcache_get(za + WN, WN, &c);
    ck_assert_msg(c == NULL, "the other shard is weights before a view of the whole buffer was written");
    wcache_get(zb, WN, &c);
    ck_assert_msg(c == NULL, "a buffer without weights became weights");
    copy_ok(za, WN, 1, "the shard AdamW updated");
    OK(dn->map(&h, za, 2 * WN * sizeof(float), PL_MAP_READ | PL_MAP_WRITE));
    ((float *)h)[WN + 5] = 2.0f;
    OK(dn->unmap(h, za, 2 * WN * sizeof(float), PL_MAP_READ | PL_MAP_WRITE));
    copy_ok(za + WN, WN, 1, "the other shard after the gather");
    copy_ok(za, WN, 1, "the own shard after the gather");
    copy_ok(za + WN, WN, 0, "the other shard again");
    dn->free(za);
    dn->free(zb);
    /* memory this backend did not allocate is never weights, even after AdamW */
    float *hm = malloc(WN * sizeof(float)), *hg = calloc(WN, sizeof(float)), *hmm = calloc(2 * WN, sizeof(float));
    ck_assert(hm && hg && hmm);
    fill_rand(hm, WN, -1, 1);
    OK(dn->adamw(hm, hg, hmm, hmm + WN, WN, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1));
    wcache_get(hm, WN, &c);
    ck_assert_msg(c == NULL, "host memory of the test's own counted as weights");
    free(hm); free(hg); free(hmm);
    /* free: the copies and the range go with the allocation */
    wcache_stats s;
    wcache_get_stats(&s);
    ck_assert_uint_eq(s.bytes, 2 * (WN + 500));
    dn->free(w);
    wcache_get_stats(&s);
    ck_assert_uint_eq(s.bytes, 0);
    float *w2 = falloc(WN);
    wcache_get(w2, WN, &c);
    ck_assert_msg(c == NULL, "a new allocation is not weights before AdamW updates it");
    /* off: nothing kept */
    OK(dn->adamw(w2, g, m, v, WN, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1));
    copy_ok(w2, WN, 1, "a new allocation after AdamW");
    wcache_enable(0, cvt_vec);
    wcache_get(w2, WN, &c);
    wcache_get_stats(&s);
    ck_assert_msg(c == NULL && s.bytes == 0, "the cache switched off keeps copies");
    dn->free(w2); dn->free(g); dn->free(m); dn->free(v); dn->free(o);
    use_prec(PL_PREC_FP32);
}
END_TEST

/* bf16 products on weights AdamW updated: with the cache, the bits of weight-cache=0, after every
 * kind of write; the forward and input-gradient products of a micro-batch share one copy. */
/* The plain copies (weight-layout=0: one copy per weight, whose count this accounts for);
 * test_wlayout checks the blocked ones, one per weight and layout. */
static void init_cache(int on) {
    backend_options o = {PL_PREC_BF16, default_threads, -1, 0, 0,
                         on ? "weight-cache=1,weight-layout=0" : "weight-cache=0,weight-layout=0"};
    char err[512] = "";
    ck_assert_msg(dn->init(&o, err, sizeof err) == 0, "onednn init bf16 weight-cache=%d: %s", on, err);
}

/* fwd and bwd_input on w with the cache on (out1, dinp1), making want_made copies, and on a
 * fresh allocation holding w's values (out0, dinp0): never weights, so converted per call as with
 * the cache off. The same bits. The cache is not switched off here, so that its copies carry
 * over to the next call (switching it off drops them). */
static void products_same(const char *what, const float *inp, const float *w, const float *dout, int N, int C,
                          int OC, long want_made) {
    float *o1 = falloc((size_t)N * OC), *o0 = falloc((size_t)N * OC), *d1 = falloc((size_t)N * C),
          *d0 = falloc((size_t)N * C), *wc = falloc((size_t)OC * C);
    memcpy(wc, w, (size_t)OC * C * sizeof(float));
    init_cache(1);
    long m0 = made();
    OK(dn->matmul_fwd(o1, inp, w, NULL, N, C, OC));
    OK(dn->matmul_bwd_input(d1, dout, w, N, C, OC));
    ck_assert_msg(made() - m0 == want_made, "%s: %ld copies made, want %ld", what, made() - m0, want_made);
    m0 = made();
    OK(dn->matmul_fwd(o0, inp, wc, NULL, N, C, OC));
    OK(dn->matmul_bwd_input(d0, dout, wc, N, C, OC));
    ck_assert_msg(made() == m0, "%s: a copy made of a buffer that is not weights", what);
    char buf[96];
    snprintf(buf, sizeof buf, "%s: matmul_fwd, cached and converted per call", what);
    check_same(buf, o1, o0, (size_t)N * OC);
    snprintf(buf, sizeof buf, "%s: matmul_bwd_input, cached and converted per call", what);
    check_same(buf, d1, d0, (size_t)N * C);
    dn->free(o1); dn->free(o0); dn->free(d1); dn->free(d0); dn->free(wc);
}

START_TEST(test_wcache_bf16) {
    if (!bf16_ok) return;
    int N = 37, C = 24, OC = 61;
    size_t nw = (size_t)OC * C;
    rng_seed(22);
    float *inp = falloc((size_t)N * C), *dout = falloc((size_t)N * OC), *w = falloc(nw + 64);
    float *g = falloc(nw + 64), *m = falloc(nw + 64), *v = falloc(nw + 64);
    fill_rand(inp, (size_t)N * C, -1, 1);
    fill_rand(dout, (size_t)N * OC, -1, 1);
    fill_rand(w, nw + 64, -1, 1);
    fill_rand(g, nw + 64, -1, 1);
    init_cache(1);
    char d[256];
    dn->describe(d, sizeof d);
    ck_assert_msg(strstr(d, "weights once per update"), "describe: %s", d);
    products_same("before AdamW (not weights yet)", inp, w, dout, N, C, OC, 0);
    OK(dn->adamw(w, g, m, v, nw + 64, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1));
    products_same("after AdamW", inp, w, dout, N, C, OC, 1);
    products_same("unchanged", inp, w, dout, N, C, OC, 0);
    products_same("a second tensor in the range", inp, w + 64, dout, N, C, OC, 1);
    for (int k = 0; k < 6; k++) {
        char what[64];
        snprintf(what, sizeof what, "after write kind %d", k);
        write_kind(k, w, 500, g, m, v);
        products_same(what, inp, w, dout, N, C, OC, 1);
    }
    /* and the same bits as weight-cache=0 itself */
    float *off = falloc((size_t)N * OC), *on = falloc((size_t)N * OC);
    init_cache(0);
    OK(dn->matmul_fwd(off, inp, w, NULL, N, C, OC));
    init_cache(1);
    OK(dn->matmul_fwd(on, inp, w, NULL, N, C, OC));
    check_same("matmul_fwd, weight-cache=1 and weight-cache=0", on, off, (size_t)N * OC);
    dn->free(off); dn->free(on);
    dn->free(inp); dn->free(dout); dn->free(w); dn->free(g); dn->free(m); dn->free(v);
    use_prec(PL_PREC_FP32);
}
END_TEST

// ----------------------------------------------------------------------------
// failure paths

START_TEST(test_failures) {
    use_prec(PL_PREC_FP32);
    void *p = (void *)1;
    backend_fail_alloc_after(1);
    int rc = dn->alloc(&p, 1024);
    ck_assert_int_eq(rc, PL_ENOMEM);
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(dn->error(), "1024 bytes") && strstr(dn->error(), "injected"), "error(): %s", dn->error());
    rc = dn->alloc(&p, 1024); /* disarmed again */
    ck_assert_int_eq(rc, 0);
    ck_assert_ptr_nonnull(p);
    for (int i = 0; i < 1024; i++) ck_assert_int_eq(((unsigned char *)p)[i], 0);
    ck_assert_int_eq((int)((uintptr_t)p % 64), 0);
    dn->free(p);
    backend_fail_alloc_after(2); /* the second from now */
    void *q = NULL;
    ck_assert_int_eq(dn->alloc(&q, 8), 0);
    ck_assert_int_eq(dn->alloc(&p, 8), PL_ENOMEM);
    dn->free(q);
    backend_fail_alloc_after(0);
    rc = dn->alloc(&p, SIZE_MAX);
    ck_assert_int_eq(rc, PL_ENOMEM);
    ck_assert_ptr_null(p);
    ck_assert_msg(strlen(dn->error()) > 0, "no message");
    /* (a size that passes the overflow check and fails in the allocator is not tried: under
     * --enable-sanitizers ASan logs a warning for it, which check-local counts as a report) */
    /* an op before init: an error, not a crash */
    dn->finalize();
    float x[4] = {0};
    rc = dn->matmul_fwd(x, x, x, NULL, 1, 1, 1);
    ck_assert_int_eq(rc, PL_EBACKEND);
    ck_assert_msg(strstr(dn->error(), "before init"), "error(): %s", dn->error());
    use_prec(PL_PREC_FP32);
    OK(dn->matmul_fwd(x, x, x, NULL, 1, 1, 1));
}
END_TEST

// ----------------------------------------------------------------------------
// --backend auto for bf16: the variant table multiplies in bf16 or fp32 as the verdict says

/* matmul_fwd of the table t in precision prec (verdict forced by fast: "0", "1", or NULL for
 * this CPU's), its describe line in d. */
static void auto_product(const backend *t, int prec, const char *fast, const float *x, const float *w, float *o,
                         char *d, size_t dlen) {
    if (fast) setenv("PIPELM_ONEDNN_BF16_FAST", fast, 1);
    else unsetenv("PIPELM_ONEDNN_BF16_FAST");
    backend_options op = {prec, default_threads, -1, 0, 0, NULL};
    char err[512] = "";
    ck_assert_msg(t->init(&op, err, sizeof err) == 0, "init: %s", err);
    unsetenv("PIPELM_ONEDNN_BF16_FAST");
    OK(t->matmul_fwd(o, x, w, NULL, 130, 96, 200));
    t->describe(d, dlen);
}

START_TEST(test_auto) {
    const backend *au = backend_find("onednn/auto");
    ck_assert_ptr_nonnull(au);
    ck_assert_str_eq(au->name, "onednn");
    ck_assert_msg(!strstr(backend_list(), "auto"), "the variant is listed: %s", backend_list());
    ck_assert_ptr_eq(au->matmul_fwd, dn->matmul_fwd); /* the same ops */
    char why[64] = "", d[512];
    int fast = onednn_bf16_products_fast(why, sizeof why);
    ck_assert_msg(why[0], "a verdict without a reason");
    if (!bf16_ok) ck_assert_int_eq(fast, -1); /* no native bf16: refused, as --backend onednn */
    else ck_assert_int_ge(fast, 0);
    rng_seed(31);
    float *x = falloc(130 * 96), *w = falloc(200 * 96), *o32 = falloc(130 * 200), *o16 = falloc(130 * 200);
    float *o = falloc(130 * 200);
    fill_rand(x, 130 * 96, -1, 1);
    fill_rand(w, 200 * 96, -1, 1);
    auto_product(dn, PL_PREC_FP32, NULL, x, w, o32, d, sizeof d);
    ck_assert_msg(!strstr(d, "auto:"), "the explicit table says auto: %s", d);
    /* a slow verdict: the fp32 products, bit for bit, and the banner says so */
    auto_product(au, PL_PREC_BF16, "0", x, w, o, d, sizeof d);
    check_same("auto, slow bf16 verdict: the fp32 product", o, o32, 130 * 200);
    ck_assert_msg(strstr(d, "auto: fp32 products (PIPELM_ONEDNN_BF16_FAST=0)"), "describe: %s", d);
    /* fp32 asked: the plain fp32 path, no note */
    auto_product(au, PL_PREC_FP32, "1", x, w, o, d, sizeof d);
    check_same("auto in fp32: the fp32 product", o, o32, 130 * 200);
    ck_assert_msg(!strstr(d, "auto:"), "describe: %s", d);
    if (bf16_ok) {
        auto_product(dn, PL_PREC_BF16, NULL, x, w, o16, d, sizeof d);
        ck_assert_msg(!strstr(d, "auto:"), "the explicit table says auto: %s", d);
        auto_product(au, PL_PREC_BF16, "1", x, w, o, d, sizeof d);
        check_same("auto, fast bf16 verdict: the bf16 product", o, o16, 130 * 200);
        ck_assert_msg(strstr(d, "auto: bf16 products"), "describe: %s", d);
        /* this CPU's own verdict: the product it names */
        auto_product(au, PL_PREC_BF16, NULL, x, w, o, d, sizeof d);
        check_same("auto, this CPU's verdict", o, fast > 0 ? o16 : o32, 130 * 200);
        if (verbose) printf("  auto verdict here: %s (%s)\n", fast > 0 ? "bf16" : "fp32", why);
    }
    float *bufs[] = {x, w, o32, o16, o};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dn->free(bufs[i]);
    use_prec(PL_PREC_FP32);
}
END_TEST

// ----------------------------------------------------------------------------
// dense operands: every bf16 product is made on dense views (what oneDNN's brgemm kernels, AMX
// among them, take); on any CPU (bf16 emulated where it is not native), and where the CPU has
// AMX, every bf16 product made runs on a brgemm kernel, none on a fallback (gemm:jit, ref)

/* Every bf16 op with products, on odd shapes: matmuls, multi-head and grouped-query attention
 * (G = 1, 2 and 8 query heads a kv head; T >= 64 as the models' causal products). */
static void dense_ops(void) {
    const int mm[][3] = {{37, 24, 61}, {64, 128, 96}};
    const gqa_shape att[] = {{2, 13, 3, 3, 8}, {1, 96, 4, 4, 16}, {2, 17, 4, 2, 6}, {1, 64, 8, 1, 8}};
    size_t n = 1 << 16;
    float *a = falloc(n), *b = falloc(n), *c = falloc(n), *d = falloc(n), *e = falloc(n);
    fill_rand(a, n, -1, 1);
    fill_rand(b, n, -1, 1);
    fill_rand(d, n, -1, 1);
    for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) {
        int N = mm[i][0], C = mm[i][1], OC = mm[i][2];
        OK(dn->matmul_fwd(c, a, b, d, N, C, OC));
        OK(dn->matmul_bwd_input(c, a, b, N, C, OC));
        OK(dn->matmul_bwd_weight(c, e, a, b, N, C, OC));
    }
    for (size_t i = 0; i < sizeof att / sizeof att[0]; i++) {
        const gqa_shape *s = &att[i];
        OK(dn->attention_gqa_fwd(c, e, a, s->B, s->T, s->NH, s->NKV, s->HS, NULL));
        OK(dn->attention_gqa_bwd(d, b, a, e, s->B, s->T, s->NH, s->NKV, s->HS, NULL));
    }
    float *bufs[] = {a, b, c, d, e};
    for (size_t i = 0; i < 5; i++) dn->free(bufs[i]);
}

START_TEST(test_dense) {
    backend_options o = {PL_PREC_BF16, default_threads, -1, 0, 0, "allow-emulated=1"};
    char err[512] = "";
    ck_assert_msg(dn->init(&o, err, sizeof err) == 0, "bf16 init (allow-emulated=1): %s", err);
    rng_seed(41);
    long made0 = onednn_primitives_created(), nd0 = onednn_nondense_created();
    dense_ops();
    ck_assert_msg(onednn_primitives_created() > made0, "no bf16 product was made");
    ck_assert_msg(onednn_nondense_created() == nd0, "%ld bf16 products made on operands that are not dense",
                  onednn_nondense_created() - nd0);
    const char *impl, *what;
    char desc[256];
    dn->describe(desc, sizeof desc);
    int amx = strstr(desc, "ISA avx512_core_amx") != NULL; /* oneDNN's effective ISA: AMX tiles */
    int nbf = 0; /* every bf16 product this process made, the other cases' included */
    for (int i = 0; (impl = onednn_impl_made(i, &what)) != NULL; i++) {
        nbf += strstr(what, "bf16") != NULL;
        if (verbose) printf("test_onednn: made %s: %s\n", what, impl);
        if (amx && strstr(what, "bf16"))
            ck_assert_msg(strncmp(impl, "brg:", 4) == 0, "bf16 product %s on a fallback: %s", what, impl);
    }
    ck_assert_msg(nbf > 0, "no bf16 product recorded");
    use_prec(PL_PREC_FP32);
}
END_TEST

/* oneDNN's own reorder of src (K, N) fp32 into bf16 16a64b2a (its padding zeroed): the
 * reference of onednn_cvt_bf16_vnni, with the layout's strides and size. */
static void vnni_ref(uint16_t *dst, float *src, int K, int N, int64_t *sk, int64_t *sn, size_t *bytes) {
    dnnl_engine_t eng;
    dnnl_stream_t st;
    dnnl_memory_desc_t f, b;
    dnnl_dims_t d = {K, N};
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p;
    dnnl_memory_t mf, mb;
    ck_assert(dnnl_engine_create(&eng, dnnl_cpu, 0) == dnnl_success);
    ck_assert(dnnl_stream_create(&st, eng, dnnl_stream_default_flags) == dnnl_success);
    ck_assert(dnnl_memory_desc_init_by_tag(&f, 2, d, dnnl_f32, dnnl_ab) == dnnl_success);
    ck_assert(dnnl_memory_desc_init_by_tag(&b, 2, d, dnnl_bf16, dnnl_BA16a64b2a) == dnnl_success);
    *sk = b.format_desc.blocking.strides[0];
    *sn = b.format_desc.blocking.strides[1];
    *bytes = dnnl_memory_desc_get_size(&b);
    ck_assert(dnnl_reorder_primitive_desc_create(&pd, &f, eng, &b, eng, NULL) == dnnl_success);
    ck_assert(dnnl_primitive_create(&p, pd) == dnnl_success);
    ck_assert(dnnl_memory_create(&mf, &f, eng, src) == dnnl_success);
    ck_assert(dnnl_memory_create(&mb, &b, eng, dst) == dnnl_success);
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, mf}, {DNNL_ARG_TO, mb}};
    ck_assert(dnnl_primitive_execute(p, st, 2, args) == dnnl_success);
    ck_assert(dnnl_stream_wait(st) == dnnl_success);
    dnnl_memory_destroy(mf);
    dnnl_memory_destroy(mb);
    dnnl_primitive_destroy(p);
    dnnl_primitive_desc_destroy(pd);
    dnnl_stream_destroy(st);
    dnnl_engine_destroy(eng);
}

/* The weight gradient's activation in oneDNN's blocked layout (onednn_cvt_bf16_vnni) is oneDNN's
 * own reorder byte for byte, padding included, on any CPU (the reorder runs everywhere);
 * where the AMX kernel takes it (wgrad-layout=1), dW is bit-identical to the plain layout's. */
START_TEST(test_vnni) {
    const int sh[][2] = {{1, 1}, {37, 61}, {32, 64}, {33, 65}, {64, 130}, {96, 24}};
    rng_seed(64);
    float *x = falloc(96 * 130);
    for (size_t i = 0; i < 96 * 130; i++) x[i] = (float)((2 * rng_u01() - 1) * pow(2.0, 40 * rng_u01() - 20));
    for (size_t t = 0; t < sizeof sh / sizeof sh[0]; t++) {
        int K = sh[t][0], N = sh[t][1];
        int64_t sk, sn;
        size_t bytes;
        uint16_t *ref = calloc(1, 96 * 192 * 2 + 64), *got = malloc(96 * 192 * 2 + 64);
        ck_assert(ref && got);
        vnni_ref(ref, x, K, N, &sk, &sn, &bytes);
        ck_assert(bytes <= 96 * 192 * 2);
        memset(got, 0xAB, 96 * 192 * 2 + 64);
        onednn_cvt_bf16_vnni(got, x, K, N, sk, sn);
        for (size_t i = 0; i < bytes / 2; i++)
            ck_assert_msg(got[i] == ref[i], "16a64b2a K=%d N=%d: element %zu: %04x, oneDNN's %04x", K, N, i, got[i],
                          ref[i]);
        ck_assert_uint_eq(got[bytes / 2], 0xABAB); /* nothing past the layout */
        free(ref);
        free(got);
    }
    dn->free(x);
    if (!bf16_ok) return;
    const int mm[][3] = {{37, 24, 61}, {130, 96, 200}, {256, 128, 64}};
    for (size_t t = 0; t < sizeof mm / sizeof mm[0]; t++) {
        int N = mm[t][0], C = mm[t][1], OC = mm[t][2];
        float *inp = falloc((size_t)N * C), *dout = falloc((size_t)N * OC);
        float *dw[2] = {falloc((size_t)OC * C), falloc((size_t)OC * C)};
        fill_rand(inp, (size_t)N * C, -1, 1);
        fill_rand(dout, (size_t)N * OC, -1, 1);
        long v0 = 0;
        for (int lay = 0; lay < 2; lay++) {
            backend_options o = {PL_PREC_BF16, default_threads, -1, 0, 0, lay ? "wgrad-layout=1" : "wgrad-layout=0"};
            char err[512] = "";
            ck_assert_msg(dn->init(&o, err, sizeof err) == 0, "%s", err);
            if (lay) v0 = onednn_vnni_used();
            OK(dn->matmul_bwd_weight(dw[lay], NULL, dout, inp, N, C, OC));
            OK(dn->matmul_bwd_weight(dw[lay], NULL, dout, inp, N, C, OC));
        }
        char desc[256];
        dn->describe(desc, sizeof desc);
        if (strstr(desc, "ISA avx512_core_amx")) /* the AMX kernel picks the blocked layout */
            ck_assert_msg(onednn_vnni_used() > v0,
                          "wgrad-layout=1 on AMX: no product took the 16a64b2a layout");
        ck_assert_msg(memcmp(dw[0], dw[1], sizeof(float) * (size_t)OC * C) == 0,
                      "dW %dx%dx%d: the blocked layout's bits differ from the plain one's", N, C, OC);
        float *bufs[] = {inp, dout, dw[0], dw[1]};
        for (size_t i = 0; i < 4; i++) dn->free(bufs[i]);
    }
    use_prec(PL_PREC_FP32);
}
END_TEST

/* A weight's copy in the layout its product picks (weight-layout=1): forward and
 * input gradient bit-identical with the weight cache on (the kept blocked copy) and off (a
 * reorder on every call), before w is a weight, after an update (the kept copy made again) and
 * after a second one, and on AMX some product did multiply a blocked copy. (Against the plain
 * layout, weight-layout=0, the bits may differ: oneDNN sums K = 2048 in another order.) */
START_TEST(test_wlayout) {
    if (!bf16_ok) return;
    const int mm[][3] = {{37, 24, 61}, {130, 96, 200}, {64, 128, 128}, {128, 2048, 512}, {128, 512, 10048}};
    enum { UPD = 3 };
    for (size_t t = 0; t < sizeof mm / sizeof mm[0]; t++) {
        int N = mm[t][0], C = mm[t][1], OC = mm[t][2];
        size_t nw = (size_t)OC * C, no = (size_t)N * OC, ni = (size_t)N * C;
        float *inp = falloc(ni), *dout = falloc(no), *w0 = falloc(nw), *w = falloc(nw), *z = falloc(3 * nw);
        float *out[2], *dinp[2];
        fill_rand(inp, ni, -1, 1);
        fill_rand(dout, no, -1, 1);
        fill_rand(w0, nw, -1, 1);
        long b0 = onednn_wblocked_used();
        for (int cache = 1; cache >= 0; cache--) { /* the same updates with the cache on, then off */
            backend_options o = {PL_PREC_BF16, default_threads, -1, 0, 0,
                                 cache ? "weight-cache=1,weight-layout=1" : "weight-cache=0,weight-layout=1"};
            char err[512] = "";
            ck_assert_msg(dn->init(&o, err, sizeof err) == 0, "%s", err);
            out[cache] = falloc(UPD * no);
            dinp[cache] = falloc(UPD * ni);
            OK(dn->copy(w, w0, sizeof(float) * nw));
            rng_seed(7);
            for (int upd = 0; upd < UPD; upd++) {
                OK(dn->matmul_fwd(out[cache] + upd * no, inp, w, NULL, N, C, OC));
                OK(dn->matmul_bwd_input(dinp[cache] + upd * ni, dout, w, N, C, OC));
                memset(z + nw, 0, sizeof(float) * 2 * nw);
                fill_rand(z, nw, -1, 1); /* an update: w changes, every kept copy is stale */
                OK(dn->adamw(w, z, z + nw, z + 2 * nw, nw, 0.05f, 0.9f, 0.95f, 1e-8f, 0.0f, 1));
            }
        }
        for (int upd = 0; upd < UPD; upd++) {
            ck_assert_msg(memcmp(out[0] + upd * no, out[1] + upd * no, sizeof(float) * no) == 0,
                          "matmul_fwd %dx%dx%d (update %d): weight-cache=1 and 0 differ", N, C, OC, upd);
            ck_assert_msg(memcmp(dinp[0] + upd * ni, dinp[1] + upd * ni, sizeof(float) * ni) == 0,
                          "matmul_bwd_input %dx%dx%d (update %d): weight-cache=1 and 0 differ", N, C, OC, upd);
        }
        char desc[256];
        dn->describe(desc, sizeof desc);
        if (strstr(desc, "ISA avx512_core_amx") && t >= 2)
            ck_assert_msg(onednn_wblocked_used() > b0, "weight-layout=1 on AMX: no product took a blocked weight");
        float *bufs[] = {inp, dout, w0, w, z, out[0], out[1], dinp[0], dinp[1]};
        for (size_t i = 0; i < 9; i++) dn->free(bufs[i]);
    }
    use_prec(PL_PREC_FP32);
}
END_TEST

// ----------------------------------------------------------------------------

static Suite *onednn_suite(void) {
    Suite *s = suite_create("onednn");
    struct { const char *name; const TTest *test; } cases[] = {
        {"init", test_init_describe}, {"convert", test_convert}, {"matmul_fp32", test_matmul_fp32},
        {"matmul_bf16", test_matmul_bf16}, {"matmul_edges", test_matmul_edges},
        {"attention_fp32", test_attention_fp32}, {"attention_bf16", test_attention_bf16},
        {"table", test_table}, {"repeat", test_repeat}, {"threads", test_threads},
        {"cache", test_cache}, {"failures", test_failures}, {"gqa_fp32", test_gqa_fp32},
        {"gqa_bf16", test_gqa_bf16}, {"vec_ops", test_vec_ops}, {"wcache", test_wcache},
        {"wcache_bf16", test_wcache_bf16}, {"auto", test_auto}, {"dense", test_dense}, {"gqa_tiled", test_gqa_tiled},
        {"vnni", test_vnni}, {"wlayout", test_wlayout},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void) {
    /* the CPU reference keeps the (T, T) probabilities, which the attention cases compare (its
     * tiled path is test_attention.c's): set before the oneDNN backend's init runs the CPU's */
    setenv("PIPELM_CPU_ATTENTION", "full", 1);
    dn = backend_find("onednn");
    if (!dn) {
        fprintf(stderr, "test_onednn: backend onednn not registered: %s\n", backend_refusal());
        return EXIT_FAILURE;
    }
    const char *vb = getenv("TEST_ONEDNN_VERBOSE");
    verbose = vb && *vb && strcmp(vb, "0") != 0;
#ifdef _OPENMP
    default_threads = omp_get_max_threads();
#endif
    char err[512] = "";
    backend_options o32 = {PL_PREC_FP32, default_threads, -1, 0, 0, NULL};
    if (dn->init(&o32, err, sizeof err) != 0) {
        fprintf(stderr, "test_onednn: onednn init (fp32) failed: %s\n", err);
        return EXIT_FAILURE;
    }
    backend_options o16 = {PL_PREC_BF16, default_threads, -1, 0, 0, NULL};
    if (dn->init(&o16, bf16_why, sizeof bf16_why) == 0) bf16_ok = 1;
    else if (!strstr(bf16_why, "no native bf16 support")) {
        fprintf(stderr, "test_onednn: onednn init (bf16) failed, not for want of a CPU feature: %s\n", bf16_why);
        return EXIT_FAILURE;
    } else
        printf("test_onednn: bf16 cases skipped: %s\n", bf16_why);
    if (dn->init(&o32, err, sizeof err) != 0) return EXIT_FAILURE;
    char d[256];
    dn->describe(d, sizeof d);
    printf("test_onednn: %s; threads %d\n", d, default_threads);
    SRunner *sr = srunner_create(onednn_suite());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (bf16_ok)
        printf("test_onednn: worst errors: fp32 max rel %.3e; bf16 matmul rel %.3e cos %.7f; bf16 attention rel %.3e "
               "cos %.7f\n", worst32, worst16, worst16cos, worst16a, worst16acos);
    else
        printf("test_onednn: worst errors: fp32 max rel %.3e; bf16 not run\n", worst32);
    dn->finalize();
    if (failed) return EXIT_FAILURE;
    return bf16_ok ? EXIT_SUCCESS : 77;
}
