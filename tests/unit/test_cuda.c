/*
 * test_cuda.c: Check tests for the CUDA backend (src/backend/cuda/backend_cuda.cu) against the CPU reference
 * backend (backend_cpu), in fp32 (TF32 off) and in bf16.
 *
 * Inputs are drawn on the host, copied to the device with from_host, and the same host values
 * go through backend_cpu; results come back with to_host. Shapes are odd on purpose: C = 15, 24
 * and 96 or 203 (not multiples of 32), T = 7, 13 and 40, NH = 3 and 4, V = 37 with Vp = 40 and
 * 128, N = 21, 37, 130, 300 and 600 rows (not multiples of 32; 300 and 600 span several of the
 * backend's 64-row column-sum chunks).
 * Real sizes, so that the row kernels' strided loops run more than one iteration of their
 * blocks (128 threads for the softmax, 256 for the norms, 512 for cross-entropy): attention at
 * T = 200 (hs 64), cross-entropy at GPT-2's V = 50257 padded to 50304 (5 rows), LayerNorm and
 * RMSNorm at C = 2048 (3 rows), grouped-query attention at NH = 32, NKV = 8, HS = 64 (3
 * tokens); in the full tier (PIPELM_TEST_FULL=1; bench/gpu_check.sh sets it) also attention at
 * T = 1024 with one and two heads, the norms at 70 rows and GQA at B 2 T 6. Same tolerances.
 *
 * Measures (TEST_CUDA_VERBOSE=1 prints every value):
 *   max-rel  = max|x - ref| / max|ref| over the whole tensor; for an accumulating op x and ref
 *              are the increments over the pre-filled base.
 *   l2-rel   = ||x - ref|| / ||ref||;  cos = cosine(x, ref).
 * Tolerances:
 *   fp32, every op against backend_cpu:        max-rel <= TOL32 = 1e-5;
 *   bit-identical to backend_cpu (same order of the same float operations): encoder fwd/bwd,
 *     residual, add_inplace, scale, crossentropy_bwd on the same probs;
 *   sumsq against backend_cpu:                 |x - ref| <= 1e-12 ref (both sum in double);
 *   bf16 matmuls vs the fp32 reference:        l2-rel <= 1e-2, cos >= 0.9999, and l2-rel >=
 *                                              1e-4 (as exact as fp32 = not run in bf16);
 *   bf16 matmuls vs backend_cpu on inputs rounded to bf16 here (round to nearest even, the
 *     exact products of representable values): max-rel <= TOL32 (proves the rounding and the
 *     fp32 accumulation);
 *   bf16 attention vs the fp32 reference:      l2-rel <= 2e-2, cos >= 0.9998, l2-rel >= 1e-4;
 *   bf16 attention vs a double reference that rounds where the backend does (q, k, v, dout,
 *     att, dpre): att (softmax of the rounded q k^T, checked against backend_cpu on the rounded
 *     qkv), out and dv max-rel <= TOL32; dq, dk l2-rel <= 1e-4 (their reference rounds a double
 *     dpre, the backend its fp32 dpre: a value on a rounding boundary may go the other way);
 *   TF32 (--backend-opt tf32=1, and its alias PIPELM_CUDA_TF32=1) matmul vs fp32: max-rel <= 5e-3.
 * Llama ops (RMSNorm N=21 C=24 and N=300 C=203; RoPE HS=6 T=5; grouped-query attention B2 T5
 *   NH6 NKV2 HS6, B2 T13 NH8 NKV1 HS8, B3 T7 NH4 NKV4 HS6; SwiGLU n=1031): fp32 against
 *   backend_cpu max-rel <= TOL32 (the reductions and the products differ from the CPU's only
 *   in summation order, and a GPU may fuse a multiply-add); gqa bf16 as attention above
 *   (l2-rel <= 2e-2, cos >= 0.9998); NKV == NH is GPT-2's multi-head attention (the attention
 *   cases: C = 15, 24, 96 with NH = 3, 3, 4); every op twice bit-identical.
 * Shared measures and checks: tests/unit/backend_compare.h; the op-by-op conformance of every
 *   backend against backend_cpu: tests/unit/test_backends.c.
 * Determinism: every op twice on the same inputs is bit-identical (fp32 and bf16).
 * Failures: an injected allocation failure, a too-large and an impossible allocation return
 *   PL_ENOMEM with a message; a bad shape PL_EBACKEND naming the op; more local ranks than
 *   devices is refused without PIPELM_CUDA_SHARE=1.
 * Without a usable device (no GPU, no driver: this is what CI sees) the checks that need none
 * still run (registry, calls before init, the init message) and the test then exits 77 (skip).
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipelm/backend.h"
#include "util/common.h"
#include "backend_compare.h"

extern const backend backend_cuda;

#define TOL16_EMU_L2 1e-4
#define TOL_TF32 5e-3
#define TOL_SUMSQ 1e-12

static const backend *gpu = &backend_cuda;
static const backend *cpu = &backend_cpu;
static int have_device = 0;
static char init_err[512] = "";

/* The full tier (PIPELM_TEST_FULL=1, as tests/lib/lib.sh): the real-size cases that are slow
 * under tests/lib/cuda_emu.sh run only there (bench/gpu_check.sh sets it on a GPU). */
static int full_tier(void) {
    const char *f = getenv("PIPELM_TEST_FULL");
    return f && strcmp(f, "1") == 0;
}

// ----------------------------------------------------------------------------
// helpers

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    ck_assert_ptr_nonnull(p);
    return p;
}
static float *hrand(size_t n, double lo, double hi) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * rng_u01());
    return x;
}
static float *hconst(size_t n, float v) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = v;
    return x;
}
static float *hdup(const float *src, size_t n) {
    float *x = xmalloc(n * sizeof(float));
    memcpy(x, src, n * sizeof(float));
    return x;
}

#define OK(call)                                                                      \
    do {                                                                              \
        int rc_ = (call);                                                             \
        ck_assert_msg(rc_ == 0, "%s: status %d: %s", #call, rc_, gpu->error());       \
    } while (0)
#define CPU_OK(call)                                                                  \
    do {                                                                              \
        int rc_ = (call);                                                             \
        ck_assert_msg(rc_ == 0, "%s: status %d: %s", #call, rc_, cpu->error());       \
    } while (0)

/* device buffers */
static void *dbytes(size_t bytes) {
    void *p = NULL;
    int rc = gpu->alloc(&p, bytes);
    ck_assert_msg(rc == 0 && p, "cuda alloc of %zu bytes: status %d: %s", bytes, rc, gpu->error());
    return p;
}
static float *dput(const float *h, size_t n) {
    float *d = dbytes(n * sizeof(float));
    OK(gpu->from_host(d, h, n * sizeof(float)));
    return d;
}
static int *dput_i(const int *h, size_t n) {
    int *d = dbytes(n * sizeof(int));
    OK(gpu->from_host(d, h, n * sizeof(int)));
    return d;
}
static float *dconst(size_t n, float v) {
    float *h = hconst(n, v);
    float *d = dput(h, n);
    free(h);
    return d;
}
static float *dget(const float *d, size_t n) {
    float *h = xmalloc(n * sizeof(float));
    OK(gpu->to_host(h, d, n * sizeof(float)));
    return h;
}

/* The CUDA backend in precision prec with the settings opts (init again). */
static void use_opts(int prec, const char *opts) {
    backend_options o = {prec, 1, -1, 0, 0, opts};
    char err[512] = "";
    int rc = gpu->init(&o, err, sizeof err);
    ck_assert_msg(rc == 0, "cuda init %s %s: %s", backend_precision_name(prec), opts, err);
}
/* ... with the product path of attention (flash=0), whose att holds the softmax probabilities
 * that the cases below compare; flash_case runs the fused kernels (flash=1) too. */
static void use_prec(int prec) { use_opts(prec, "flash=0"); }

/* fp32 -> bf16 -> fp32, round to nearest even, denormals to a signed zero, NaN quiet: the
 * conversion the backend documents (backend_onednn's f32_to_bf16). */
static float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0)
        u &= 0x80000000u;
    else if ((u & 0x7fffffffu) > 0x7f800000u)
        u = (u & 0xffff0000u) | 0x00400000u;
    else
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, sizeof f);
    return f;
}
static float *hround(const float *x, size_t n) {
    float *r = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) r[i] = bf16_round(x[i]);
    return r;
}

/* against a double reference (already the increment) */
static void check_vs_double(const char *what, const float *x, const float *base, const double *ref, size_t n,
                            int l2, double tol) {
    double *a = incr(x, base, n);
    double e, cs = 1;
    if (l2)
        l2_cos(a, ref, n, &e, &cs);
    else
        e = max_rel(a, ref, n);
    free(a);
    if (verbose) printf("  %-50s %s %.3e (tol %.0e)\n", what, l2 ? "l2-rel" : "max-rel", e, tol);
    ck_assert_msg(e <= tol, "%s: %s error %.3e > %.0e", what, l2 ? "l2 relative" : "max relative", e, tol);
}
/* the device buffer d holds the same bits as the host h */
static void check_same_dev(const char *what, const float *d, const float *h, size_t n) {
    float *x = dget(d, n);
    check_same(what, x, h, n);
    free(x);
}

// ----------------------------------------------------------------------------
// 0. without a device: registry, calls before init, the init message

START_TEST(test_nodevice) {
    /* the registry's "cuda" is the loader (backend_cuda_load.h): the backend's name and
     * settings before anything is loaded, and, in a program linked with the backend, that
     * table once its init has run (below) */
    const backend *reg = backend_find("cuda");
    ck_assert_ptr_nonnull(reg);
    ck_assert_str_eq(reg->name, "cuda");
    ck_assert_int_eq(reg->host_memory, 0);
    for (int i = 0;; i++) {
        ck_assert_msg(!reg->opts[i].key == !gpu->opts[i].key, "setting %d: loader and backend differ", i);
        if (!gpu->opts[i].key) break;
        ck_assert_str_eq(reg->opts[i].key, gpu->opts[i].key);
        ck_assert_str_eq(reg->opts[i].def, gpu->opts[i].def);
        ck_assert_str_eq(reg->opts[i].choices, gpu->opts[i].choices);
        ck_assert_str_eq(reg->opts[i].env, gpu->opts[i].env);
    }
    ck_assert_msg(strstr(backend_list(), "cuda") != NULL, "backend_list() = '%s'", backend_list());
    ck_assert_str_eq(gpu->name, "cuda");
    ck_assert_int_eq(gpu->host_memory, 0);
    /* this test runs with the backend finalised: every call is refused cleanly */
    gpu->finalize();
    char d[256] = "";
    gpu->describe(d, sizeof d);
    ck_assert_msg(strstr(d, "not initialised") != NULL, "describe before init: '%s'", d);
    void *p = (void *)1;
    ck_assert_int_eq(gpu->alloc(&p, 64), PL_EBACKEND);
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(gpu->error(), "before init") != NULL, "error() = '%s'", gpu->error());
    ck_assert_int_eq(gpu->matmul_fwd(NULL, NULL, NULL, NULL, 4, 4, 4), PL_EBACKEND);
    ck_assert_msg(strstr(gpu->error(), "matmul_fwd before init") != NULL, "error() = '%s'", gpu->error());
    double s = -1;
    ck_assert_int_eq(gpu->sumsq(NULL, 10, &s), PL_EBACKEND);
    gpu->free(NULL);
    /* fault injection comes first, before or after init */
    backend_fail_alloc_after(1);
    ck_assert_int_eq(gpu->alloc(&p, 64), PL_ENOMEM);
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(gpu->error(), "injected") != NULL, "error() = '%s'", gpu->error());
    backend_fail_alloc_after(0);
    /* unknown precision: refused whether or not there is a device */
    backend_options bad = {7, 1, -1, 0, 0, NULL};
    char err[512] = "";
    ck_assert_int_ne(gpu->init(&bad, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "precision") != NULL, "init(precision 7): '%s'", err);
    ck_assert_ptr_ne(reg->matmul_fwd, gpu->matmul_fwd);
    err[0] = 0;
    ck_assert_int_ne(reg->init(&bad, err, sizeof err), 0); /* through the loader: the same refusal */
    ck_assert_msg(strstr(err, "precision") != NULL, "loader init(precision 7): '%s'", err);
    ck_assert_ptr_eq(reg->matmul_fwd, gpu->matmul_fwd);
    ck_assert_ptr_eq(reg->init, gpu->init);
    /* back to what main found: a device, or the message of its absence */
    backend_options o = {PL_PREC_FP32, 1, -1, 0, 0, NULL};
    err[0] = 0;
    int rc = gpu->init(&o, err, sizeof err);
    ck_assert_int_eq(rc == 0, have_device);
    if (!have_device) {
        ck_assert_msg(rc == PL_EINVAL, "init without a device: status %d, want PL_EINVAL", rc);
        ck_assert_msg(strncmp(err, "no CUDA device", 14) == 0, "init without a device: '%s'", err);
        ck_assert_msg(strstr(err, "cudaGetDeviceCount") != NULL, "init without a device: '%s'", err);
        ck_assert_int_eq(gpu->alloc(&p, 64), PL_EBACKEND); /* still refused, no crash */
    }
}
END_TEST

// ----------------------------------------------------------------------------
// 1. memory: zero-fill, copies, map/unmap, overlapping copy

START_TEST(test_memory) {
    enum { n = 1000 };
    rng_seed(1);
    float *a = dbytes(n * sizeof(float));
    float *z = dget(a, n);
    for (int i = 0; i < n; i++) ck_assert_msg(z[i] == 0.0f, "alloc not zero-filled at %d: %g", i, (double)z[i]);
    free(z);
    float *h1 = hrand(n, -1, 1), *h2 = hrand(n, -1, 1), *h3 = hrand(n, -1, 1);
    OK(gpu->from_host(a, h1, n * sizeof(float)));
    check_same_dev("from_host/to_host round trip", a, h1, n);

    /* map READ holds the data; unmap READ needs no device pointer */
    void *v = NULL;
    OK(gpu->map(&v, a, n * sizeof(float), PL_MAP_READ));
    ck_assert_ptr_nonnull(v);
    check_same("map READ", v, h1, n);
    OK(gpu->unmap(v, NULL, n * sizeof(float), PL_MAP_READ));

    /* map WRITE: what is written there reaches the device at unmap */
    float *b = dbytes(n * sizeof(float)), *c = dbytes(n * sizeof(float));
    OK(gpu->map(&v, b, n * sizeof(float), PL_MAP_WRITE));
    memcpy(v, h2, n * sizeof(float));
    OK(gpu->unmap(v, b, n * sizeof(float), PL_MAP_WRITE));
    check_same_dev("map WRITE / unmap", b, h2, n);

    /* several views at once (as the engine holds one per message), unmapped out of order; a
     * pinned buffer reused right after an unmap(WRITE) must not mix the two */
    void *va = NULL, *vb = NULL, *vc = NULL;
    OK(gpu->map(&va, a, n * sizeof(float), PL_MAP_READ));
    OK(gpu->map(&vb, b, n * sizeof(float), PL_MAP_WRITE));
    OK(gpu->map(&vc, c, n * sizeof(float), PL_MAP_WRITE));
    ck_assert(va != vb && vb != vc && va != vc);
    memcpy(vb, h3, n * sizeof(float));
    memcpy(vc, h1, n * sizeof(float));
    OK(gpu->unmap(vc, c, n * sizeof(float), PL_MAP_WRITE));
    OK(gpu->unmap(vb, b, n * sizeof(float), PL_MAP_WRITE));
    check_same("map READ while others are mapped", va, h1, n);
    OK(gpu->unmap(va, a, n * sizeof(float), PL_MAP_READ));
    OK(gpu->map(&v, c, n * sizeof(float), PL_MAP_READ));
    check_same("map READ after unmap WRITE (reused buffer)", v, h1, n);
    OK(gpu->unmap(v, c, n * sizeof(float), PL_MAP_READ));
    check_same_dev("several views: b", b, h3, n);
    check_same_dev("several views: c", c, h1, n);

    /* device copy, overlapping copy (memmove), zero */
    OK(gpu->copy(c, a, n * sizeof(float)));
    check_same_dev("copy", c, h1, n);
    OK(gpu->copy(a + 10, a, 500 * sizeof(float)));
    float *hm = hdup(h1, n);
    memmove(hm + 10, hm, 500 * sizeof(float));
    check_same_dev("overlapping copy forward", a, hm, n);
    OK(gpu->copy(a, a + 7, 600 * sizeof(float)));
    memmove(hm, hm + 7, 600 * sizeof(float));
    check_same_dev("overlapping copy backward", a, hm, n);
    OK(gpu->zero(a + 100, 50 * sizeof(float)));
    memset(hm + 100, 0, 50 * sizeof(float));
    check_same_dev("zero", a, hm, n);

    /* zero-byte calls */
    void *e0 = NULL;
    OK(gpu->alloc(&e0, 0));
    ck_assert_ptr_nonnull(e0);
    OK(gpu->copy(e0, a, 0));
    OK(gpu->zero(e0, 0));
    OK(gpu->to_host(hm, e0, 0));
    OK(gpu->map(&v, e0, 0, PL_MAP_WRITE));
    OK(gpu->unmap(v, e0, 0, PL_MAP_WRITE));
    gpu->free(e0);
    gpu->free(NULL);

    char d[256] = "";
    gpu->describe(d, sizeof d);
    if (verbose) printf("  describe: %s\n", d);
    ck_assert_msg(strncmp(d, "cuda: device", 12) == 0, "describe: '%s'", d);
    gpu->free(a); gpu->free(b); gpu->free(c);
    free(h1); free(h2); free(h3); free(hm);
}
END_TEST

// ----------------------------------------------------------------------------
// 2. failures: allocation, shapes, init refusals

/* set or unset (v NULL) an environment variable */
static void env_set(const char *k, const char *v) {
    if (v)
        setenv(k, v, 1);
    else
        unsetenv(k);
}
static char *env_save(const char *k) {
    const char *v = getenv(k);
    return v ? strdup(v) : NULL;
}

START_TEST(test_failures) {
    void *p = (void *)1;
    backend_fail_alloc_after(1); /* the next allocation fails */
    ck_assert_int_eq(gpu->alloc(&p, 64), PL_ENOMEM);
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(gpu->error(), "injected") != NULL && strstr(gpu->error(), "cudaMalloc") != NULL,
                  "error() = '%s'", gpu->error());
    OK(gpu->alloc(&p, 64)); /* fires once */
    gpu->free(p);
    backend_fail_alloc_after(2);
    OK(gpu->alloc(&p, 64));
    void *q = (void *)1;
    ck_assert_int_eq(gpu->alloc(&q, 64), PL_ENOMEM);
    ck_assert_ptr_null(q);
    gpu->free(p);
    ck_assert_int_eq(gpu->alloc(&p, SIZE_MAX - 8), PL_ENOMEM);
    ck_assert_msg(strstr(gpu->error(), "too large") != NULL, "error() = '%s'", gpu->error());
    ck_assert_int_eq(gpu->alloc(&p, (size_t)1 << 52), PL_ENOMEM); /* 4 PiB: a real cudaMalloc failure */
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(gpu->error(), "cudaMalloc") != NULL, "error() = '%s'", gpu->error());
    if (verbose) printf("  impossible alloc: %s\n", gpu->error());
    OK(gpu->alloc(&p, 64)); /* and the device is still usable */
    gpu->free(p);

    /* bad shapes: refused with the op named, nothing launched */
    ck_assert_int_eq(gpu->attention_gqa_fwd(NULL, NULL, NULL, 2, 7, 5, 2, 24, NULL), PL_EBACKEND); /* NH % NKV */
    ck_assert_msg(strstr(gpu->error(), "attention_gqa_fwd") && strstr(gpu->error(), "invalid shape"), "error() = '%s'",
                  gpu->error());
    ck_assert_int_eq(gpu->matmul_fwd(NULL, NULL, NULL, NULL, -1, 4, 4), PL_EBACKEND);
    ck_assert_msg(strstr(gpu->error(), "matmul_fwd") != NULL, "error() = '%s'", gpu->error());
    ck_assert_int_eq(gpu->crossentropy_fwd(NULL, NULL, NULL, 4, 41, 40), PL_EBACKEND);

    /* more local ranks than devices: refused unless PIPELM_CUDA_SHARE=1 */
    static const char *vars[] = {"MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PIPELM_CUDA_SHARE"};
    char *saved[3];
    for (int i = 0; i < 3; i++) saved[i] = env_save(vars[i]);
    env_set("MPI_LOCALRANKID", "999");
    env_set("MPI_LOCALNRANKS", "1000");
    env_set("PIPELM_CUDA_SHARE", NULL);
    backend_options o = {PL_PREC_FP32, 1, -1, 0, 0, NULL};
    char err[512] = "";
    int rc = gpu->init(&o, err, sizeof err);
    if (verbose) printf("  1000 local ranks: %s\n", err);
    ck_assert_msg(rc == PL_EINVAL && strstr(err, "PIPELM_CUDA_SHARE") != NULL, "init with 1000 local ranks: %d '%s'",
                  rc, err);
    env_set("PIPELM_CUDA_SHARE", "1");
    err[0] = 0;
    rc = gpu->init(&o, err, sizeof err);
    ck_assert_msg(rc == 0, "init with 1000 local ranks and PIPELM_CUDA_SHARE=1: '%s'", err);
    OK(gpu->alloc(&p, 64));
    gpu->free(p);
    /* a device ordinal that does not exist */
    backend_options od = {PL_PREC_FP32, 1, 1 << 20, 0, 0, NULL};
    ck_assert_int_ne(gpu->init(&od, err, sizeof err), 0);
    for (int i = 0; i < 3; i++) {
        env_set(vars[i], saved[i]);
        free(saved[i]);
    }
    use_prec(PL_PREC_FP32);
}
END_TEST

// ----------------------------------------------------------------------------
// 3. encoder

/* fwd exact, bwd bit-identical to backend_cpu (same rows in the same order), twice the same */
static void encoder_case(int B, int T, int C, int V, const int *tok) {
    int N = B * T;
    char what[96];
    float *wte = hrand((size_t)V * C, -1, 1), *wpe = hrand((size_t)T * C, -1, 1), *dout = hrand((size_t)N * C, -1, 1);
    float *dwte0 = hrand((size_t)V * C, -0.5, 0.5), *dwpe0 = hrand((size_t)T * C, -0.5, 0.5);
    float *out = hconst((size_t)N * C, 0);
    CPU_OK(cpu->encoder_fwd(out, tok, wte, wpe, N, T, C));
    float *dwte = hdup(dwte0, (size_t)V * C), *dwpe = hdup(dwpe0, (size_t)T * C);
    CPU_OK(cpu->encoder_bwd(dwte, dwpe, dout, tok, N, T, C));

    int *dtok = dput_i(tok, N);
    float *g_wte = dput(wte, (size_t)V * C), *g_wpe = dput(wpe, (size_t)T * C), *g_dout = dput(dout, (size_t)N * C);
    float *g_out = dconst((size_t)N * C, 12345.0f);
    OK(gpu->encoder_fwd(g_out, dtok, g_wte, g_wpe, N, T, C));
    snprintf(what, sizeof what, "encoder_fwd N=%d T=%d C=%d", N, T, C);
    check_same_dev(what, g_out, out, (size_t)N * C);
    for (int rep = 0; rep < 2; rep++) { /* from the same base twice: the same bits */
        float *g_dwte = dput(dwte0, (size_t)V * C), *g_dwpe = dput(dwpe0, (size_t)T * C);
        OK(gpu->encoder_bwd(g_dwte, g_dwpe, g_dout, dtok, N, T, C));
        snprintf(what, sizeof what, "encoder_bwd dwte N=%d C=%d V=%d (run %d)", N, C, V, rep + 1);
        check_same_dev(what, g_dwte, dwte, (size_t)V * C);
        snprintf(what, sizeof what, "encoder_bwd dwpe N=%d T=%d C=%d (run %d)", N, T, C, rep + 1);
        check_same_dev(what, g_dwpe, dwpe, (size_t)T * C);
        gpu->free(g_dwte);
        gpu->free(g_dwpe);
    }
    gpu->free(dtok); gpu->free(g_wte); gpu->free(g_wpe); gpu->free(g_dout); gpu->free(g_out);
    free(wte); free(wpe); free(dout); free(dwte0); free(dwpe0); free(out); free(dwte); free(dwpe);
}

START_TEST(test_encoder) {
    rng_seed(3);
    /* repeated tokens within and across sequences */
    static const int tok1[21] = {3, 5, 3, 36, 0, 5, 3, 5, 5, 17, 3, 0, 36, 1, 3, 3, 3, 22, 5, 0, 36};
    encoder_case(3, 7, 15, 37, tok1);
    /* 600 rows over 37 tokens: every token many times */
    int *tok2 = xmalloc(600 * sizeof(int));
    for (int i = 0; i < 600; i++) tok2[i] = (int)(rng_u01() * 37);
    tok2[599] = tok2[0];
    encoder_case(60, 10, 24, 37, tok2);
    free(tok2);
}
END_TEST

// ----------------------------------------------------------------------------
// 4. layernorm

static void layernorm_case(int N, int C) {
    char what[96];
    size_t nc = (size_t)N * C;
    float *inp = hrand(nc, -2, 3), *w = hrand(C, -1, 1), *b = hrand(C, -1, 1), *dout = hrand(nc, -1, 1);
    float *dinp0 = hrand(nc, -0.5, 0.5), *dw0 = hrand(C, -0.5, 0.5), *db0 = hrand(C, -0.5, 0.5);
    float *out = hconst(nc, 0), *mean = hconst(N, 0), *rstd = hconst(N, 0);
    CPU_OK(cpu->layernorm_fwd(out, mean, rstd, inp, w, b, N, C));
    float *dinp = hdup(dinp0, nc), *dw = hdup(dw0, C), *db = hdup(db0, C);
    CPU_OK(cpu->layernorm_bwd_input(dinp, dout, inp, w, mean, rstd, N, C));
    CPU_OK(cpu->layernorm_bwd_weight(dw, db, dout, inp, mean, rstd, N, C));

    float *g_inp = dput(inp, nc), *g_w = dput(w, C), *g_b = dput(b, C), *g_dout = dput(dout, nc);
    float *first[6] = {NULL};
    for (int rep = 0; rep < 2; rep++) {
        float *g_out = dbytes(nc * 4), *g_mean = dbytes(N * 4), *g_rstd = dbytes(N * 4);
        OK(gpu->layernorm_fwd(g_out, g_mean, g_rstd, g_inp, g_w, g_b, N, C));
        /* the backward from the CPU's statistics, so each part is checked on its own */
        float *g_m = dput(mean, N), *g_r = dput(rstd, N);
        float *g_dinp = dput(dinp0, nc), *g_dw = dput(dw0, C), *g_db = dput(db0, C);
        OK(gpu->layernorm_bwd_input(g_dinp, g_dout, g_inp, g_w, g_m, g_r, N, C));
        OK(gpu->layernorm_bwd_weight(g_dw, g_db, g_dout, g_inp, g_m, g_r, N, C));
        float *res[6] = {dget(g_out, nc), dget(g_mean, N), dget(g_rstd, N), dget(g_dinp, nc), dget(g_dw, C),
                         dget(g_db, C)};
        if (rep == 0) {
            snprintf(what, sizeof what, "layernorm_fwd out N=%d C=%d", N, C);
            check32(what, res[0], out, NULL, nc);
            snprintf(what, sizeof what, "layernorm_fwd mean N=%d C=%d", N, C);
            check32(what, res[1], mean, NULL, N);
            snprintf(what, sizeof what, "layernorm_fwd rstd N=%d C=%d", N, C);
            check32(what, res[2], rstd, NULL, N);
            snprintf(what, sizeof what, "layernorm_bwd_input dinp (accum) N=%d C=%d", N, C);
            check32(what, res[3], dinp, dinp0, nc);
            snprintf(what, sizeof what, "layernorm_bwd_weight dw (accum) N=%d C=%d", N, C);
            check32(what, res[4], dw, dw0, C);
            snprintf(what, sizeof what, "layernorm_bwd_weight db (accum) N=%d C=%d", N, C);
            check32(what, res[5], db, db0, C);
            for (int i = 0; i < 6; i++) first[i] = res[i];
        } else {
            static const char *names[6] = {"out", "mean", "rstd", "dinp", "dw", "db"};
            size_t sizes[6] = {nc, (size_t)N, (size_t)N, nc, (size_t)C, (size_t)C};
            for (int i = 0; i < 6; i++) {
                snprintf(what, sizeof what, "layernorm %s twice N=%d C=%d", names[i], N, C);
                check_same(what, res[i], first[i], sizes[i]);
                free(res[i]);
                free(first[i]);
            }
        }
        gpu->free(g_out); gpu->free(g_mean); gpu->free(g_rstd); gpu->free(g_m); gpu->free(g_r);
        gpu->free(g_dinp); gpu->free(g_dw); gpu->free(g_db);
    }
    gpu->free(g_inp); gpu->free(g_w); gpu->free(g_b); gpu->free(g_dout);
    free(inp); free(w); free(b); free(dout); free(dinp0); free(dw0); free(db0); free(out); free(mean);
    free(rstd); free(dinp); free(dw); free(db);
}

START_TEST(test_layernorm) {
    rng_seed(4);
    layernorm_case(21, 24);
    layernorm_case(21, 15);
    layernorm_case(300, 203);
    layernorm_case(3, 2048); /* C = 2048: 8 iterations of the 256-thread row loops */
    if (full_tier()) layernorm_case(70, 2048); /* and two column-sum chunks at that width */
}
END_TEST

// ----------------------------------------------------------------------------
// 5. matmul, fp32 and bf16

typedef struct {
    float *out, *dinp, *dw, *db; /* host copies of the results */
} mm_res;

/* The three matmul ops on the GPU in the current precision: out (with or without bias), dinp,
 * dw and db accumulated onto the given bases. */
static mm_res gpu_matmul(const float *inp, const float *w, const float *b, const float *dout, const float *dw0,
                         const float *db0, int N, int C, int OC) {
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *g_inp = dput(inp, ni), *g_w = dput(w, nw), *g_dout = dput(dout, no);
    float *g_b = b ? dput(b, OC) : NULL;
    float *g_out = dconst(no, 999.0f), *g_dinp = dconst(ni, 777.0f);
    float *g_dw = dput(dw0, nw), *g_db = dput(db0, OC);
    OK(gpu->matmul_fwd(g_out, g_inp, g_w, g_b, N, C, OC));
    OK(gpu->matmul_bwd_input(g_dinp, g_dout, g_w, N, C, OC));
    OK(gpu->matmul_bwd_weight(g_dw, g_db, g_dout, g_inp, N, C, OC));
    mm_res r = {dget(g_out, no), dget(g_dinp, ni), dget(g_dw, nw), dget(g_db, OC)};
    gpu->free(g_inp); gpu->free(g_w); gpu->free(g_dout); gpu->free(g_b); gpu->free(g_out); gpu->free(g_dinp);
    gpu->free(g_dw); gpu->free(g_db);
    return r;
}
static mm_res cpu_matmul(const float *inp, const float *w, const float *b, const float *dout, const float *dw0,
                         const float *db0, int N, int C, int OC) {
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    mm_res r = {hconst(no, 0), hconst(ni, 0), hdup(dw0, nw), hdup(db0, OC)};
    CPU_OK(cpu->matmul_fwd(r.out, inp, w, b, N, C, OC));
    CPU_OK(cpu->matmul_bwd_input(r.dinp, dout, w, N, C, OC));
    CPU_OK(cpu->matmul_bwd_weight(r.dw, r.db, dout, inp, N, C, OC));
    return r;
}
static void mm_free(mm_res *r) {
    free(r->out); free(r->dinp); free(r->dw); free(r->db);
}

static void matmul_case(int N, int C, int OC, int withb) {
    char what[128];
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *inp = hrand(ni, -1, 1), *w = hrand(nw, -1, 1), *b = withb ? hrand(OC, -1, 1) : NULL;
    float *dout = hrand(no, -1, 1), *dw0 = hrand(nw, -0.5, 0.5), *db0 = hrand(OC, -0.5, 0.5);
    mm_res ref = cpu_matmul(inp, w, b, dout, dw0, db0, N, C, OC);
    const char *bs = withb ? "bias" : "no bias";

    /* fp32 */
    use_prec(PL_PREC_FP32);
    mm_res g = gpu_matmul(inp, w, b, dout, dw0, db0, N, C, OC);
    snprintf(what, sizeof what, "fp32 matmul_fwd N=%d C=%d OC=%d %s", N, C, OC, bs);
    check32(what, g.out, ref.out, NULL, no);
    snprintf(what, sizeof what, "fp32 matmul_bwd_input N=%d C=%d OC=%d", N, C, OC);
    check32(what, g.dinp, ref.dinp, NULL, ni);
    snprintf(what, sizeof what, "fp32 matmul_bwd_weight dw (accum) N=%d C=%d OC=%d", N, C, OC);
    check32(what, g.dw, ref.dw, dw0, nw);
    snprintf(what, sizeof what, "fp32 matmul_bwd_weight db (accum) N=%d OC=%d", N, OC);
    check32(what, g.db, ref.db, db0, OC);
    mm_res g2 = gpu_matmul(inp, w, b, dout, dw0, db0, N, C, OC);
    snprintf(what, sizeof what, "fp32 matmul twice N=%d C=%d OC=%d", N, C, OC);
    check_same(what, g2.out, g.out, no);
    check_same(what, g2.dinp, g.dinp, ni);
    check_same(what, g2.dw, g.dw, nw);
    check_same(what, g2.db, g.db, OC);
    mm_free(&g2);

    /* bf16: against fp32, and against backend_cpu on the rounded inputs */
    use_prec(PL_PREC_BF16);
    mm_res h = gpu_matmul(inp, w, b, dout, dw0, db0, N, C, OC);
    snprintf(what, sizeof what, "bf16 matmul_fwd N=%d C=%d OC=%d %s", N, C, OC, bs);
    check16(what, h.out, ref.out, NULL, no, 0);
    snprintf(what, sizeof what, "bf16 matmul_bwd_input N=%d C=%d OC=%d", N, C, OC);
    check16(what, h.dinp, ref.dinp, NULL, ni, 0);
    snprintf(what, sizeof what, "bf16 matmul_bwd_weight dw N=%d C=%d OC=%d", N, C, OC);
    check16(what, h.dw, ref.dw, dw0, nw, 0);
    snprintf(what, sizeof what, "bf16 matmul_bwd_weight db = fp32 db N=%d OC=%d", N, OC);
    check_same(what, h.db, g.db, OC); /* the bias gradient is fp32 in both */
    float *ri = hround(inp, ni), *rw = hround(w, nw), *rd = hround(dout, no);
    mm_res rr = cpu_matmul(ri, rw, b, rd, dw0, db0, N, C, OC);
    snprintf(what, sizeof what, "bf16 matmul_fwd vs rounded-input fp32 N=%d C=%d OC=%d", N, C, OC);
    check32(what, h.out, rr.out, NULL, no);
    snprintf(what, sizeof what, "bf16 matmul_bwd_input vs rounded-input fp32");
    check32(what, h.dinp, rr.dinp, NULL, ni);
    snprintf(what, sizeof what, "bf16 matmul_bwd_weight vs rounded-input fp32");
    check32(what, h.dw, rr.dw, dw0, nw);
    mm_res h2 = gpu_matmul(inp, w, b, dout, dw0, db0, N, C, OC);
    snprintf(what, sizeof what, "bf16 matmul twice N=%d C=%d OC=%d", N, C, OC);
    check_same(what, h2.out, h.out, no);
    check_same(what, h2.dinp, h.dinp, ni);
    check_same(what, h2.dw, h.dw, nw);
    mm_free(&h2);
    use_prec(PL_PREC_FP32);

    mm_free(&ref); mm_free(&g); mm_free(&h); mm_free(&rr);
    free(inp); free(w); free(b); free(dout); free(dw0); free(db0); free(ri); free(rw); free(rd);
}

START_TEST(test_matmul) {
    rng_seed(5);
    matmul_case(21, 24, 37, 1);
    matmul_case(21, 24, 37, 0);
    matmul_case(37, 15, 61, 1);
    matmul_case(130, 96, 200, 1);
    matmul_case(300, 24, 601, 1); /* db over 5 row chunks */
    /* NULL db and NULL bias */
    enum { N = 21, C = 24, OC = 37 };
    float *inp = hrand(N * C, -1, 1), *w = hrand(OC * C, -1, 1), *dout = hrand(N * OC, -1, 1);
    float *dw0 = hrand(OC * C, -1, 1), *db0 = hconst(OC, 0);
    mm_res ref = cpu_matmul(inp, w, NULL, dout, dw0, db0, N, C, OC);
    float *g_inp = dput(inp, N * C), *g_dout = dput(dout, N * OC), *g_dw = dput(dw0, OC * C);
    OK(gpu->matmul_bwd_weight(g_dw, NULL, g_dout, g_inp, N, C, OC));
    float *x = dget(g_dw, OC * C);
    check32("fp32 matmul_bwd_weight db NULL", x, ref.dw, dw0, OC * C);
    free(x);
    /* C = 0: the forward is the bias */
    float *b = hrand(OC, -1, 1), *g_b = dput(b, OC), *g_out = dconst(N * OC, 5.0f);
    OK(gpu->matmul_fwd(g_out, g_inp, g_dw, g_b, N, 0, OC));
    x = dget(g_out, N * OC);
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) ck_assert(x[i * OC + o] == b[o]);
    free(x);
    gpu->free(g_inp); gpu->free(g_dout); gpu->free(g_dw); gpu->free(g_b); gpu->free(g_out);
    mm_free(&ref);
    free(inp); free(w); free(dout); free(dw0); free(db0); free(b);
}
END_TEST

START_TEST(test_tf32) {
    enum { N = 130, C = 96, OC = 200 };
    rng_seed(6);
    float *inp = hrand(N * C, -1, 1), *w = hrand(OC * C, -1, 1), *dout = hrand(N * OC, -1, 1);
    float *dw0 = hconst(OC * C, 0), *db0 = hconst(OC, 0);
    mm_res ref = cpu_matmul(inp, w, NULL, dout, dw0, db0, N, C, OC);
    char *saved = env_save("PIPELM_CUDA_TF32");
    env_set("PIPELM_CUDA_TF32", "1");
    use_prec(PL_PREC_FP32);
    char d[256] = "";
    gpu->describe(d, sizeof d);
    ck_assert_msg(strstr(d, "TF32") != NULL, "describe with PIPELM_CUDA_TF32=1: '%s'", d);
    mm_res g = gpu_matmul(inp, w, NULL, dout, dw0, db0, N, C, OC);
    check_max("tf32 matmul_fwd", g.out, ref.out, NULL, N * OC, TOL_TF32);
    check_max("tf32 matmul_bwd_input", g.dinp, ref.dinp, NULL, N * C, TOL_TF32);
    check_max("tf32 matmul_bwd_weight", g.dw, ref.dw, NULL, OC * C, TOL_TF32);
    env_set("PIPELM_CUDA_TF32", NULL);
    use_prec(PL_PREC_FP32);
    gpu->describe(d, sizeof d);
    ck_assert_msg(strstr(d, "TF32") == NULL, "describe without PIPELM_CUDA_TF32: '%s'", d);
    backend_options opt = {PL_PREC_FP32, 1, -1, 0, 0, "sync=0,tf32=1"}; /* the option, not the alias */
    char err[512] = "";
    ck_assert_msg(gpu->init(&opt, err, sizeof err) == 0, "init with tf32=1: %s", err);
    gpu->describe(d, sizeof d);
    ck_assert_msg(strstr(d, "TF32") != NULL, "describe with --backend-opt tf32=1: '%s'", d);
    use_prec(PL_PREC_FP32);
    if (saved) {
        env_set("PIPELM_CUDA_TF32", saved);
        use_prec(PL_PREC_FP32);
        free(saved);
    }
    mm_free(&ref); mm_free(&g);
    free(inp); free(w); free(dout); free(dw0); free(db0);
}
END_TEST

// ----------------------------------------------------------------------------
// 6. attention, fp32 and bf16

typedef struct {
    float *out, *att, *dqkv;
} att_res;

/* forward, then backward from the forward's own att */
static att_res gpu_attention(const float *qkv, const float *dout, int B, int T, int C, int NH) {
    size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    float *g_qkv = dput(qkv, n3), *g_dout = dput(dout, n1);
    float *g_out = dconst(n1, 999.0f), *g_att = dconst(na, 999.0f);
    float *g_dqkv = dconst(n3, 777.0f);
    OK(gpu->attention_gqa_fwd(g_out, g_att, g_qkv, B, T, NH, NH, C / NH, NULL)); /* GPT-2's: NKV = NH */
    OK(gpu->attention_gqa_bwd(g_dqkv, g_dout, g_qkv, g_att, B, T, NH, NH, C / NH, NULL));
    att_res r = {dget(g_out, n1), dget(g_att, na), dget(g_dqkv, n3)};
    gpu->free(g_qkv); gpu->free(g_dout); gpu->free(g_out); gpu->free(g_att); gpu->free(g_dqkv);
    return r;
}
static att_res cpu_attention(const float *qkv, const float *dout, int B, int T, int C, int NH) {
    size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    att_res r = {hconst(n1, 0), hconst(na, 0), hconst(n3, 0)};
    CPU_OK(cpu->attention_gqa_fwd(r.out, r.att, qkv, B, T, NH, NH, C / NH, NULL));
    CPU_OK(cpu->attention_gqa_bwd(r.dqkv, dout, qkv, r.att, B, T, NH, NH, C / NH, NULL));
    return r;
}
static void att_free(att_res *r) {
    free(r->out); free(r->att); free(r->dqkv);
}

/* What the bf16 backend computes, in double, rounding where it rounds: given its att (fp32
 * softmax), out = round(att) v_r; datt = dy_r v_r^T; dv = round(att)^T dy_r; dpre = att (datt -
 * rowsum(att datt)); dq = s round(dpre) k_r; dk = s round(dpre)^T q_r. */
static void bf16_attention_ref(const float *qkv, const float *dout, const float *att, int B, int T, int C, int NH,
                               double *out, double *dqkv) {
    int hs = C / NH, C3 = 3 * C;
    double s = (float)(1.0f / sqrtf((float)hs)); /* the backend's float scale */
    double *datt = xmalloc(sizeof(double) * T * T);
    float *dpre = xmalloc(sizeof(float) * T * T);
#define R(x) ((double)bf16_round(x))
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            const float *dy = dout + (size_t)b * T * C + h * hs;
            const float *a = att + ((size_t)b * NH + h) * T * T;
            double *o = out + (size_t)b * T * C + h * hs;
            double *dq = dqkv + (size_t)b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
            for (int t = 0; t < T; t++)
                for (int d = 0; d < hs; d++) {
                    double acc = 0;
                    for (int j = 0; j < T; j++) acc += R(a[t * T + j]) * R(v[(size_t)j * C3 + d]);
                    o[(size_t)t * C + d] = acc;
                }
            for (int t = 0; t < T; t++) {
                double dot = 0;
                for (int j = 0; j < T; j++) {
                    double acc = 0;
                    for (int d = 0; d < hs; d++) acc += R(dy[(size_t)t * C + d]) * R(v[(size_t)j * C3 + d]);
                    datt[t * T + j] = acc;
                    if (j <= t) dot += (double)a[t * T + j] * acc;
                }
                for (int j = 0; j < T; j++)
                    dpre[t * T + j] = j <= t ? (float)((double)a[t * T + j] * (datt[t * T + j] - dot)) : 0.0f;
            }
            for (int j = 0; j < T; j++)
                for (int d = 0; d < hs; d++) {
                    double acc = 0;
                    for (int t = 0; t < T; t++) acc += R(a[t * T + j]) * R(dy[(size_t)t * C + d]);
                    dv[(size_t)j * C3 + d] = acc;
                }
            for (int t = 0; t < T; t++)
                for (int d = 0; d < hs; d++) {
                    double acc = 0;
                    for (int j = 0; j < T; j++) acc += R(dpre[t * T + j]) * R(k[(size_t)j * C3 + d]);
                    dq[(size_t)t * C3 + d] = s * acc;
                }
            for (int j = 0; j < T; j++)
                for (int d = 0; d < hs; d++) {
                    double acc = 0;
                    for (int t = 0; t < T; t++) acc += R(dpre[t * T + j]) * R(q[(size_t)t * C3 + d]);
                    dk[(size_t)j * C3 + d] = s * acc;
                }
        }
#undef R
    free(datt);
    free(dpre);
}

static void attention_case(int B, int T, int C, int NH) {
    char what[128];
    size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    int hs = C / NH;
    float *qkv = hrand(n3, -1, 1), *dout = hrand(n1, -1, 1);
    att_res ref = cpu_attention(qkv, dout, B, T, C, NH);

    use_prec(PL_PREC_FP32);
    att_res g = gpu_attention(qkv, dout, B, T, C, NH);
    snprintf(what, sizeof what, "fp32 attention out B=%d T=%d C=%d NH=%d", B, T, C, NH);
    check32(what, g.out, ref.out, NULL, n1);
    snprintf(what, sizeof what, "fp32 attention att B=%d T=%d C=%d NH=%d", B, T, C, NH);
    check32(what, g.att, ref.att, NULL, na);
    snprintf(what, sizeof what, "fp32 attention dqkv B=%d T=%d C=%d NH=%d", B, T, C, NH);
    check32(what, g.dqkv, ref.dqkv, NULL, n3);
    for (size_t r = 0; r < (size_t)B * NH * T; r++) /* the masked triangle is exactly 0 */
        for (int j = (int)(r % T) + 1; j < T; j++) ck_assert(g.att[r * T + j] == 0.0f);
    att_res g2 = gpu_attention(qkv, dout, B, T, C, NH);
    snprintf(what, sizeof what, "fp32 attention twice B=%d T=%d C=%d NH=%d", B, T, C, NH);
    check_same(what, g2.out, g.out, n1);
    check_same(what, g2.att, g.att, na);
    check_same(what, g2.dqkv, g.dqkv, n3);
    att_free(&g2);

    use_prec(PL_PREC_BF16);
    att_res h = gpu_attention(qkv, dout, B, T, C, NH);
    snprintf(what, sizeof what, "bf16 attention out B=%d T=%d C=%d NH=%d", B, T, C, NH);
    check16(what, h.out, ref.out, NULL, n1, 1);
    snprintf(what, sizeof what, "bf16 attention att B=%d T=%d C=%d NH=%d", B, T, C, NH);
    check16(what, h.att, ref.att, NULL, na, 1);
    snprintf(what, sizeof what, "bf16 attention dqkv B=%d T=%d C=%d NH=%d", B, T, C, NH);
    check16(what, h.dqkv, ref.dqkv, NULL, n3, 1);
    /* att: the fp32 softmax of the rounded inputs' product */
    float *rq = hround(qkv, n3);
    att_res rr = cpu_attention(rq, dout, B, T, C, NH);
    snprintf(what, sizeof what, "bf16 attention att vs rounded-input fp32");
    check32(what, h.att, rr.att, NULL, na);
    double *eo = xmalloc(sizeof(double) * n1), *ed = xmalloc(sizeof(double) * n3);
    bf16_attention_ref(qkv, dout, h.att, B, T, C, NH, eo, ed);
    snprintf(what, sizeof what, "bf16 attention out vs emulation");
    check_vs_double(what, h.out, NULL, eo, n1, 0, TOL32);
    /* dqkv's three column blocks of each row: q and k through the rounded dpre, v not */
    size_t rows = (size_t)B * T;
    for (int part = 0; part < 3; part++) {
        float *x = xmalloc(sizeof(float) * rows * C);
        double *r = xmalloc(sizeof(double) * rows * C);
        for (size_t i = 0; i < rows; i++)
            for (int c = 0; c < C; c++) {
                x[i * C + c] = h.dqkv[i * 3 * C + part * C + c];
                r[i * C + c] = ed[i * 3 * C + part * C + c];
            }
        static const char *pn[3] = {"dq", "dk", "dv"};
        snprintf(what, sizeof what, "bf16 attention %s vs emulation (hs=%d)", pn[part], hs);
        check_vs_double(what, x, NULL, r, rows * C, part < 2, part < 2 ? TOL16_EMU_L2 : TOL32);
        free(x);
        free(r);
    }
    att_res h2 = gpu_attention(qkv, dout, B, T, C, NH);
    snprintf(what, sizeof what, "bf16 attention twice B=%d T=%d C=%d NH=%d", B, T, C, NH);
    check_same(what, h2.out, h.out, n1);
    check_same(what, h2.att, h.att, na);
    check_same(what, h2.dqkv, h.dqkv, n3);
    att_free(&h2);
    use_prec(PL_PREC_FP32);

    att_free(&ref); att_free(&g); att_free(&h); att_free(&rr);
    free(qkv); free(dout); free(rq); free(eo); free(ed);
}

START_TEST(test_attention) {
    rng_seed(7);
    attention_case(3, 7, 24, 3);
    attention_case(2, 13, 15, 3);
    attention_case(2, 40, 96, 4);
    /* rows past 128 take a second iteration of the 128-thread softmax loops; GPT-2's context
     * (rows of up to 1024: 8 iterations) in the full tier, about 3 minutes emulated */
    attention_case(1, 200, 64, 1);
    if (full_tier()) {
        attention_case(1, 1024, 64, 1);
        attention_case(1, 1024, 128, 2);
    }
}
END_TEST

// ----------------------------------------------------------------------------
// 7. elementwise: GELU, residual, add_inplace, scale

START_TEST(test_elementwise) {
    enum { n = 1031 };
    rng_seed(8);
    float *x = hrand(n, -4, 4), *y = hrand(n, -1, 1);
    float *ref = hconst(n, 0), *dref = hconst(n, 0);
    CPU_OK(cpu->gelu_fwd(ref, x, n));
    CPU_OK(cpu->gelu_bwd(dref, x, y, n));
    float *g_x = dput(x, n), *g_y = dput(y, n), *g_o = dbytes(n * 4);
    float *first = NULL, *dfirst = NULL;
    for (int rep = 0; rep < 2; rep++) {
        OK(gpu->gelu_fwd(g_o, g_x, n));
        float *o = dget(g_o, n);
        float *g_d = dput(y, n);
        OK(gpu->gelu_bwd(g_d, g_x, g_d, n)); /* dinp aliasing dout */
        float *d = dget(g_d, n);
        gpu->free(g_d);
        if (rep == 0) {
            check32("gelu_fwd", o, ref, NULL, n);
            check32("gelu_bwd (dinp = dout)", d, dref, NULL, n);
            first = o;
            dfirst = d;
        } else {
            check_same("gelu_fwd twice", o, first, n);
            check_same("gelu_bwd twice", d, dfirst, n);
            free(o);
            free(d);
        }
    }
    /* exact single operations: the same bits as backend_cpu */
    float *r = hconst(n, 0);
    CPU_OK(cpu->residual_fwd(r, x, y, n));
    OK(gpu->residual_fwd(g_o, g_x, g_y, n));
    check_same_dev("residual_fwd", g_o, r, n);
    float *g_a = dput(x, n);
    OK(gpu->residual_fwd(g_a, g_a, g_y, n)); /* out aliasing a */
    check_same_dev("residual_fwd (out = a)", g_a, r, n);
    float *acc = hdup(x, n);
    CPU_OK(cpu->add_inplace(acc, y, n));
    gpu->free(g_a);
    g_a = dput(x, n);
    OK(gpu->add_inplace(g_a, g_y, n));
    check_same_dev("add_inplace", g_a, acc, n);
    CPU_OK(cpu->scale(acc, -0.37f, n));
    OK(gpu->scale(g_a, -0.37f, n));
    check_same_dev("scale", g_a, acc, n);
    OK(gpu->gelu_fwd(g_o, g_x, 0)); /* n = 0: nothing */
    gpu->free(g_x); gpu->free(g_y); gpu->free(g_o); gpu->free(g_a);
    free(x); free(y); free(ref); free(dref); free(first); free(dfirst); free(r); free(acc);
}
END_TEST

// ----------------------------------------------------------------------------
// 8. cross-entropy with the padded vocabulary

/* One cross-entropy case: N rows of V classes padded to Vp (the padded logits huge, so a
 * kernel that reads them shows); row 3, where there is one, overflows exp unshifted. */
static void crossentropy_case(int N, int V, int Vp) {
    size_t nl = (size_t)N * Vp;
    char what[96];
    float *logits = xmalloc(sizeof(float) * nl);
    int *targets = xmalloc(sizeof(int) * N);
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < Vp; j++) logits[(size_t)i * Vp + j] = j < V ? (float)(6 * rng_u01() - 3) : 1.0e4f + j;
        targets[i] = (int)(rng_u01() * V);
    }
    targets[0] = 0;
    targets[1] = V - 1;
    if (N > 3)
        for (int j = 0; j < V; j++) logits[3 * Vp + j] += 90.0f;
    float *probs = hdup(logits, nl), *losses = hconst(N, 0);
    CPU_OK(cpu->crossentropy_fwd(losses, probs, targets, N, V, Vp));
    int *g_t = dput_i(targets, N);
    float *first = NULL, *lfirst = NULL;
    for (int rep = 0; rep < 2; rep++) {
        float *g_l = dput(logits, nl), *g_loss = dconst(N, 999.0f);
        OK(gpu->crossentropy_fwd(g_loss, g_l, g_t, N, V, Vp));
        float *p = dget(g_l, nl), *l = dget(g_loss, N);
        if (rep == 0) {
            snprintf(what, sizeof what, "crossentropy_fwd probs N=%d V=%d Vp=%d", N, V, Vp);
            check32(what, p, probs, NULL, nl);
            snprintf(what, sizeof what, "crossentropy_fwd losses N=%d V=%d Vp=%d", N, V, Vp);
            check32(what, l, losses, NULL, N);
            for (int i = 0; i < N; i++)
                for (int j = V; j < Vp; j++) ck_assert(p[(size_t)i * Vp + j] == 0.0f);
            /* the backward on the GPU's own probs: the same bits as backend_cpu's */
            float *dl = hdup(p, nl);
            const float dloss = 1.0f / N;
            CPU_OK(cpu->crossentropy_bwd(dl, targets, dloss, N, V, Vp));
            OK(gpu->crossentropy_bwd(g_l, g_t, dloss, N, V, Vp));
            snprintf(what, sizeof what, "crossentropy_bwd N=%d V=%d Vp=%d", N, V, Vp);
            check_same_dev(what, g_l, dl, nl);
            free(dl);
            first = p;
            lfirst = l;
        } else {
            snprintf(what, sizeof what, "crossentropy_fwd twice N=%d V=%d Vp=%d", N, V, Vp);
            check_same(what, p, first, nl);
            check_same(what, l, lfirst, N);
            free(p);
            free(l);
        }
        gpu->free(g_l);
        gpu->free(g_loss);
    }
    gpu->free(g_t);
    free(logits); free(targets); free(probs); free(losses); free(first); free(lfirst);
}

START_TEST(test_crossentropy) {
    rng_seed(9);
    crossentropy_case(21, 37, 40);
    crossentropy_case(21, 37, 128);
    /* GPT-2's vocabulary: each row ~100 iterations of the 512-thread block's loops */
    crossentropy_case(5, 50257, 50304);
}
END_TEST

// ----------------------------------------------------------------------------
// 9. AdamW

START_TEST(test_adamw) {
    enum { n = 1031 };
    rng_seed(10);
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    static const float wds[2] = {0.1f, 0.0f};
    for (int k = 0; k < 2; k++) {
        float *p = hrand(n, -1, 1), *m = hconst(n, 0), *v = hconst(n, 0);
        float *g_p = dput(p, n), *g_m = dput(m, n), *g_v = dput(v, n);
        float *p0 = hdup(p, n);
        for (int t = 1; t <= 3; t++) {
            float *g = hrand(n, -1, 1);
            g[0] = 0.0f;
            g[1] = 1e-6f; /* where eps enters */
            float *g_g = dput(g, n);
            float *pold = hdup(p, n);
            CPU_OK(cpu->adamw(p, g, m, v, n, lr, b1, b2, eps, wds[k], t));
            OK(gpu->adamw(g_p, g_g, g_m, g_v, n, lr, b1, b2, eps, wds[k], t));
            float *xp = dget(g_p, n), *xm = dget(g_m, n), *xv = dget(g_v, n);
            char what[64];
            snprintf(what, sizeof what, "adamw wd=%g t=%d step", (double)wds[k], t);
            check32(what, xp, p, pold, n); /* the step itself, relative */
            snprintf(what, sizeof what, "adamw wd=%g t=%d m", (double)wds[k], t);
            check32(what, xm, m, NULL, n);
            snprintf(what, sizeof what, "adamw wd=%g t=%d v", (double)wds[k], t);
            check32(what, xv, v, NULL, n);
            /* continue from the CPU's state so the steps do not drift apart */
            OK(gpu->from_host(g_p, p, n * sizeof(float)));
            OK(gpu->from_host(g_m, m, n * sizeof(float)));
            OK(gpu->from_host(g_v, v, n * sizeof(float)));
            free(xp); free(xm); free(xv); free(pold); free(g);
            gpu->free(g_g);
        }
        gpu->free(g_p); gpu->free(g_m); gpu->free(g_v);
        free(p); free(m); free(v); free(p0);
    }
}
END_TEST

// ----------------------------------------------------------------------------
// 10. sum of squares

START_TEST(test_sumsq) {
    static const size_t ns[4] = {5, 16384, 16385, 100003};
    rng_seed(11);
    for (int k = 0; k < 4; k++) {
        size_t n = ns[k];
        float *x = hrand(n, -3, 3);
        double ref = -1, a = -1, b = -1;
        CPU_OK(cpu->sumsq(x, n, &ref));
        float *g = dput(x, n);
        OK(gpu->sumsq(g, n, &a));
        OK(gpu->sumsq(g, n, &b));
        if (verbose) printf("  sumsq n=%zu: %.17g vs cpu %.17g (rel %.3e)\n", n, a, ref, fabs(a - ref) / ref);
        ck_assert_msg(fabs(a - ref) <= TOL_SUMSQ * ref, "sumsq n=%zu: %.17g vs %.17g", n, a, ref);
        ck_assert_msg(memcmp(&a, &b, sizeof a) == 0, "sumsq n=%zu twice: %.17g vs %.17g", n, a, b);
        gpu->free(g);
        free(x);
    }
    double z = -1;
    OK(gpu->sumsq(NULL, 0, &z));
    ck_assert(z == 0.0);
}
END_TEST

// ----------------------------------------------------------------------------
// 10. Llama ops: RMSNorm, RoPE, grouped-query attention, SwiGLU

static void rmsnorm_case(int N, int C) {
    char what[128];
    size_t nc = (size_t)N * C;
    float *inp = hrand(nc, -2, 3), *w = hrand(C, -1.5, 1.5), *dout = hrand(nc, -1, 1);
    float *dinp0 = hrand(nc, -0.5, 0.5), *dw0 = hrand(C, -0.5, 0.5);
    float *out = hconst(nc, 0), *rstd = hconst(N, 0), *dinp = hdup(dinp0, nc), *dw = hdup(dw0, C);
    CPU_OK(cpu->rmsnorm_fwd(out, rstd, inp, w, N, C, 1e-5f));
    CPU_OK(cpu->rmsnorm_bwd_input(dinp, dout, inp, w, rstd, N, C));
    CPU_OK(cpu->rmsnorm_bwd_weight(dw, dout, inp, rstd, N, C));
    float *g_inp = dput(inp, nc), *g_w = dput(w, C), *g_dout = dput(dout, nc);
    float *first[4] = {NULL, NULL, NULL, NULL};
    for (int rep = 0; rep < 2; rep++) {
        float *g_out = dconst(nc, 999.0f), *g_rstd = dconst(N, 999.0f), *g_dinp = dput(dinp0, nc), *g_dw = dput(dw0, C);
        OK(gpu->rmsnorm_fwd(g_out, g_rstd, g_inp, g_w, N, C, 1e-5f));
        OK(gpu->rmsnorm_bwd_input(g_dinp, g_dout, g_inp, g_w, g_rstd, N, C));
        OK(gpu->rmsnorm_bwd_weight(g_dw, g_dout, g_inp, g_rstd, N, C));
        float *res[4] = {dget(g_out, nc), dget(g_rstd, N), dget(g_dinp, nc), dget(g_dw, C)};
        static const char *names[4] = {"out", "rstd", "dinp (accum)", "dw (accum)"};
        size_t sizes[4] = {nc, (size_t)N, nc, (size_t)C};
        const float *refs[4] = {out, rstd, dinp, dw}, *bases[4] = {NULL, NULL, dinp0, dw0};
        for (int i = 0; i < 4; i++) {
            if (rep == 0) {
                snprintf(what, sizeof what, "rmsnorm %s N=%d C=%d", names[i], N, C);
                check32(what, res[i], refs[i], bases[i], sizes[i]);
                first[i] = res[i];
            } else {
                snprintf(what, sizeof what, "rmsnorm %s twice N=%d C=%d", names[i], N, C);
                check_same(what, res[i], first[i], sizes[i]);
                free(res[i]);
                free(first[i]);
            }
        }
        gpu->free(g_out); gpu->free(g_rstd); gpu->free(g_dinp); gpu->free(g_dw);
    }
    gpu->free(g_inp); gpu->free(g_w); gpu->free(g_dout);
    free(inp); free(w); free(dout); free(dinp0); free(dw0); free(out); free(rstd); free(dinp); free(dw);
}

START_TEST(test_rmsnorm) {
    rng_seed(12);
    rmsnorm_case(21, 24);
    rmsnorm_case(300, 203);
    rmsnorm_case(3, 2048); /* Llama 3.2 1B's width */
    if (full_tier()) rmsnorm_case(70, 2048);
}
END_TEST

START_TEST(test_rope) {
    enum { B = 2, T = 5, N = B * T, NH = 4, NKV = 2, HS = 6, W = (NH + 2 * NKV) * HS };
    rng_seed(13);
    float *fc = xmalloc(sizeof(float) * T * HS / 2), *fs = xmalloc(sizeof(float) * T * HS / 2);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < HS / 2; i++) {
            double a = t * pow(10000.0, -2.0 * i / HS);
            fc[t * (HS / 2) + i] = (float)cos(a);
            fs[t * (HS / 2) + i] = (float)sin(a);
        }
    float *x = hrand((size_t)N * W, -1.5, 1.5), *rf = hconst((size_t)N * W, 0), *rb = hconst((size_t)N * W, 0);
    CPU_OK(cpu->rope_fwd(rf, x, fc, fs, N, T, NH, NKV, HS));
    CPU_OK(cpu->rope_bwd(rb, x, fc, fs, N, T, NH, NKV, HS));
    float *g_x = dput(x, (size_t)N * W), *g_c = dput(fc, T * HS / 2), *g_s = dput(fs, T * HS / 2);
    float *g_y = dconst((size_t)N * W, 999.0f);
    OK(gpu->rope_fwd(g_y, g_x, g_c, g_s, N, T, NH, NKV, HS));
    float *y = dget(g_y, (size_t)N * W);
    check32("rope_fwd", y, rf, NULL, (size_t)N * W);
    for (int r = 0; r < N; r++) /* v is copied */
        for (int j = (NH + NKV) * HS; j < W; j++) ck_assert(y[r * W + j] == x[r * W + j]);
    OK(gpu->rope_bwd(g_y, g_x, g_c, g_s, N, T, NH, NKV, HS));
    float *yb = dget(g_y, (size_t)N * W);
    check32("rope_bwd", yb, rb, NULL, (size_t)N * W);
    ck_assert_int_eq(gpu->rope_fwd(g_y, g_x, g_c, g_s, N, T, NH, NKV, 5), PL_EBACKEND); /* odd HS */
    ck_assert_msg(strstr(gpu->error(), "rope_fwd"), "error(): %s", gpu->error());
    gpu->free(g_x); gpu->free(g_c); gpu->free(g_s); gpu->free(g_y);
    free(fc); free(fs); free(x); free(rf); free(rb); free(y); free(yb);
}
END_TEST

/* Document masking (backend_ops.h's doc): while not NULL, every gqa and flash case passes these
 * document starts (host, B*T) to both backends (test_attention_doc). */
static int *cur_doc;

static att_res gpu_gqa(const float *qkv, const float *dout, int B, int T, int NH, int NKV, int HS) {
    size_t n3 = (size_t)B * T * (NH + 2 * NKV) * HS, n1 = (size_t)B * T * NH * HS, na = (size_t)B * NH * T * T;
    /* att as small as the backend says (attention_cols: the stage sizes it so), the rest of
     * the host copy 999: the emulation's sanitizer sees a kernel that writes past it */
    int cols = gpu->attention_cols(B, T, NH, HS);
    ck_assert_msg(cols >= 1 && cols <= T, "attention_cols(%d, %d, %d, %d) = %d", B, T, NH, HS, cols);
    size_t nab = (size_t)B * NH * T * cols;
    float *g_qkv = dput(qkv, n3), *g_dout = dput(dout, n1);
    float *g_out = dconst(n1, 999.0f), *g_att = dconst(nab, 999.0f), *g_dqkv = dconst(n3, 777.0f);
    int *g_doc = cur_doc ? dput_i(cur_doc, (size_t)B * T) : NULL;
    OK(gpu->attention_gqa_fwd(g_out, g_att, g_qkv, B, T, NH, NKV, HS, g_doc));
    OK(gpu->attention_gqa_bwd(g_dqkv, g_dout, g_qkv, g_att, B, T, NH, NKV, HS, g_doc));
    gpu->free(g_doc);
    att_res r = {dget(g_out, n1), hconst(na, 999.0f), dget(g_dqkv, n3)};
    float *a = dget(g_att, nab);
    memcpy(r.att, a, nab * sizeof(float));
    free(a);
    gpu->free(g_qkv); gpu->free(g_dout); gpu->free(g_out); gpu->free(g_att); gpu->free(g_dqkv);
    return r;
}

static void gqa_case(int B, int T, int NH, int NKV, int HS) {
    char what[128];
    size_t n3 = (size_t)B * T * (NH + 2 * NKV) * HS, n1 = (size_t)B * T * NH * HS, na = (size_t)B * NH * T * T;
    float *qkv = hrand(n3, -1, 1), *dout = hrand(n1, -1, 1);
    att_res ref = {hconst(n1, 0), hconst(na, 0), hconst(n3, 0)};
    CPU_OK(cpu->attention_gqa_fwd(ref.out, ref.att, qkv, B, T, NH, NKV, HS, cur_doc));
    CPU_OK(cpu->attention_gqa_bwd(ref.dqkv, dout, qkv, ref.att, B, T, NH, NKV, HS, cur_doc));
    static const char *nm[3] = {"out", "att", "dqkv"};
    size_t ns[3] = {n1, na, n3};

    use_prec(PL_PREC_FP32);
    att_res g = gpu_gqa(qkv, dout, B, T, NH, NKV, HS), g2 = gpu_gqa(qkv, dout, B, T, NH, NKV, HS);
    const float *gv[3] = {g.out, g.att, g.dqkv}, *g2v[3] = {g2.out, g2.att, g2.dqkv}, *rv[3] = {ref.out, ref.att, ref.dqkv};
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what, "fp32 gqa %s B=%d T=%d NH=%d NKV=%d HS=%d", nm[i], B, T, NH, NKV, HS);
        check32(what, gv[i], rv[i], NULL, ns[i]);
        snprintf(what, sizeof what, "fp32 gqa %s twice", nm[i]);
        check_same(what, g2v[i], gv[i], ns[i]);
    }
    for (size_t r = 0; r < (size_t)B * NH * T; r++)
        for (int j = (int)(r % T) + 1; j < T; j++) ck_assert(g.att[r * T + j] == 0.0f);
    att_free(&g2);

    use_prec(PL_PREC_BF16);
    att_res h = gpu_gqa(qkv, dout, B, T, NH, NKV, HS), h2 = gpu_gqa(qkv, dout, B, T, NH, NKV, HS);
    const float *hv[3] = {h.out, h.att, h.dqkv}, *h2v[3] = {h2.out, h2.att, h2.dqkv};
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what, "bf16 gqa %s B=%d T=%d NH=%d NKV=%d HS=%d", nm[i], B, T, NH, NKV, HS);
        check16(what, hv[i], rv[i], NULL, ns[i], 1);
        snprintf(what, sizeof what, "bf16 gqa %s twice", nm[i]);
        check_same(what, h2v[i], hv[i], ns[i]);
    }
    att_free(&h); att_free(&h2);
    use_prec(PL_PREC_FP32);
    att_free(&ref); att_free(&g);
    free(qkv); free(dout);
}

/* Two bf16 results that round in different places (the fused kernels round the unnormalised
 * probabilities, the product path the normalised ones) within attention's bf16 bounds of each
 * other; no lower bound, unlike check16 against fp32. */
static void check_bf16_pair(const char *what, const float *x, const float *y, size_t n) {
    double *a = incr(x, NULL, n), *b = incr(y, NULL, n), rel, cs;
    l2_cos(a, b, n, &rel, &cs);
    free(a);
    free(b);
    if (verbose) printf("  %-50s l2-rel %.3e cos %.7f\n", what, rel, cs);
    ck_assert_msg(rel <= TOL16_ATT_REL && cs >= TOL16_ATT_COS, "%s: l2-rel %.3e cos %.7f", what, rel, cs);
}

/* The fused attention kernels (flash=1) against backend_cpu and against the product path
 * (flash=0), fp32 and bf16, each run twice for the same bits: out and dqkv (att holds the
 * fused kernels' own state, lse and O, when they run: T > HS; when T <= HS the product path
 * runs and att is compared too). */
static void flash_case(int B, int T, int NH, int NKV, int HS) {
    char what[160];
    size_t n3 = (size_t)B * T * (NH + 2 * NKV) * HS, n1 = (size_t)B * T * NH * HS, na = (size_t)B * NH * T * T;
    float *qkv = hrand(n3, -1, 1), *dout = hrand(n1, -1, 1);
    att_res ref = {hconst(n1, 0), hconst(na, 0), hconst(n3, 0)};
    CPU_OK(cpu->attention_gqa_fwd(ref.out, ref.att, qkv, B, T, NH, NKV, HS, cur_doc));
    CPU_OK(cpu->attention_gqa_bwd(ref.dqkv, dout, qkv, ref.att, B, T, NH, NKV, HS, cur_doc));
    for (int bf = 0; bf < 2; bf++) {
        int prec = bf ? PL_PREC_BF16 : PL_PREC_FP32;
        use_opts(prec, "flash=0");
        att_res p = gpu_gqa(qkv, dout, B, T, NH, NKV, HS);
        ck_assert_int_eq(gpu->attention_cols(B, T, NH, HS), T); /* the products keep T x T */
        use_opts(prec, "flash=1");
        /* the fused kernels keep O and the log-sum-exp: HS + 1 floats a (token, head) */
        ck_assert_int_eq(gpu->attention_cols(B, T, NH, HS), T > HS && HS <= 128 ? HS + 1 : T);
        att_res f = gpu_gqa(qkv, dout, B, T, NH, NKV, HS), f2 = gpu_gqa(qkv, dout, B, T, NH, NKV, HS);
        const char *pn = bf ? "bf16" : "fp32";
        snprintf(what, sizeof what, "%s flash out B=%d T=%d NH=%d NKV=%d HS=%d vs cpu", pn, B, T, NH, NKV, HS);
        if (bf) check16(what, f.out, ref.out, NULL, n1, 1); else check32(what, f.out, ref.out, NULL, n1);
        snprintf(what, sizeof what, "%s flash dqkv B=%d T=%d NH=%d NKV=%d HS=%d vs cpu", pn, B, T, NH, NKV, HS);
        if (bf) check16(what, f.dqkv, ref.dqkv, NULL, n3, 1); else check32(what, f.dqkv, ref.dqkv, NULL, n3);
        if (T <= HS) { /* the product path ran in both: the same bits, att the probabilities */
            snprintf(what, sizeof what, "%s flash=1 with T <= HS: the product path", pn);
            check_same(what, f.out, p.out, n1);
            check_same(what, f.att, p.att, na);
            check_same(what, f.dqkv, p.dqkv, n3);
        } else {
            snprintf(what, sizeof what, "%s flash out vs the product path", pn);
            if (bf) check_bf16_pair(what, f.out, p.out, n1); else check32(what, f.out, p.out, NULL, n1);
            snprintf(what, sizeof what, "%s flash dqkv vs the product path", pn);
            if (bf) check_bf16_pair(what, f.dqkv, p.dqkv, n3); else check32(what, f.dqkv, p.dqkv, NULL, n3);
        }
        snprintf(what, sizeof what, "%s flash twice", pn);
        check_same(what, f2.out, f.out, n1);
        check_same(what, f2.dqkv, f.dqkv, n3);
        att_free(&p); att_free(&f); att_free(&f2);
    }
    use_prec(PL_PREC_FP32);
    att_free(&ref);
    free(qkv); free(dout);
}

START_TEST(test_attention_flash) {
    rng_seed(15);
    flash_case(2, 13, 3, 3, 8);   /* one tile, hs <= 32 */
    flash_case(2, 5, 6, 2, 6);    /* T <= HS: the product path */
    flash_case(2, 70, 4, 4, 16);  /* a second block of queries and three key tiles */
    flash_case(1, 100, 6, 2, 24); /* grouped-query: three query heads per kv head */
    flash_case(1, 130, 2, 1, 64); /* hs 64 */
    flash_case(1, 140, 1, 1, 100); /* hs 100: the 128-register bound, hs not a power of two */
    if (full_tier()) {
        flash_case(1, 1024, 2, 2, 64);
        flash_case(1, 1024, 4, 1, 128);
    }
}
END_TEST

/* Document masking: sequence 0 one document, sequence 1 documents from rows 1, 31, 32, 63, 64
 * and 65 (the fused kernels' 32-key tiles and 64-row blocks); product path and fused kernels,
 * fp32 and bf16, against backend_cpu's masked path. */
static void doc_case(int B, int T, int NH, int NKV, int HS) {
    static const int cuts[] = {1, 31, 32, 63, 64, 65};
    cur_doc = calloc((size_t)B * T, sizeof(int));
    for (int b = 1; b < B; b++)
        for (int t = 0, c = 0, cur = 0; t < T; t++) {
            if (c < 6 && cuts[c] == t) cur = cuts[c++];
            cur_doc[b * T + t] = cur;
        }
    flash_case(B, T, NH, NKV, HS);
    free(cur_doc);
    cur_doc = NULL;
}

START_TEST(test_attention_doc) {
    rng_seed(40);
    doc_case(2, 70, 4, 2, 16);
    doc_case(2, 66, 2, 2, 8);
}
END_TEST

START_TEST(test_attention_gqa) {
    rng_seed(14);
    gqa_case(2, 5, 6, 2, 6);
    gqa_case(2, 13, 8, 1, 8);
    gqa_case(3, 7, 4, 4, 6);
    gqa_case(1, 3, 32, 8, 64); /* Llama 3.2 1B's heads: 32 query heads on 8 key/value heads */
    if (full_tier()) gqa_case(2, 6, 32, 8, 64);
    float *x = dconst(1024, 0.0f);
    ck_assert_int_eq(gpu->attention_gqa_fwd(x, x, x, 1, 2, 3, 2, 4, NULL), PL_EBACKEND); /* NH % NKV != 0 */
    ck_assert_msg(strstr(gpu->error(), "attention_gqa_fwd") && strstr(gpu->error(), "invalid shape"), "error(): %s",
                  gpu->error());
    ck_assert_int_eq(gpu->attention_gqa_bwd(x, x, x, x, 1, 2, 3, 2, 4, NULL), PL_EBACKEND);
    gpu->free(x);
}
END_TEST

/* Decoding over a KV cache at real length: one new row (and a chunk of 5) after pos cached
 * positions (random keys and values), GPT-2 124M's heads and Llama's grouped ones; the output
 * and the appended cache rows against the CPU's, twice the same bits; more than the shared
 * score buffer's positions is refused by name. */
static void kv_case(int pos, int n, int NH, int NKV, int HS) {
    char what[128];
    int W = (NH + 2 * NKV) * HS, KW = NKV * HS;
    size_t nq = (size_t)n * W, no = (size_t)n * NH * HS, nk = (size_t)(pos + n) * KW;
    float *qkv = hrand(nq, -1, 1), *kc = hrand(nk, -1, 1), *vc = hrand(nk, -1, 1), *out = hconst(no, 0);
    float *g_qkv = dput(qkv, nq), *g_kc = dput(kc, nk), *g_vc = dput(vc, nk), *g_out = dconst(no, 0);
    CPU_OK(cpu->attention_kv_fwd(out, kc, vc, qkv, pos, n, NH, NKV, HS));
    OK(gpu->attention_kv_fwd(g_out, g_kc, g_vc, g_qkv, pos, n, NH, NKV, HS));
    float *o1 = dget(g_out, no), *k1 = dget(g_kc, nk), *v1 = dget(g_vc, nk);
    snprintf(what, sizeof what, "attention_kv_fwd pos=%d n=%d NH=%d NKV=%d HS=%d", pos, n, NH, NKV, HS);
    check32(what, o1, out, NULL, no);
    check_same("attention_kv_fwd k cache", k1, kc, nk);
    check_same("attention_kv_fwd v cache", v1, vc, nk);
    OK(gpu->attention_kv_fwd(g_out, g_kc, g_vc, g_qkv, pos, n, NH, NKV, HS));
    float *o2 = dget(g_out, no);
    check_same("attention_kv_fwd twice", o2, o1, no);
    free(qkv); free(kc); free(vc); free(out); free(o1); free(k1); free(v1); free(o2);
    gpu->free(g_qkv); gpu->free(g_kc); gpu->free(g_vc); gpu->free(g_out);
}

START_TEST(test_attention_kv) {
    rng_seed(16);
    kv_case(1023, 1, 12, 12, 64); /* GPT-2 124M's last position */
    kv_case(300, 5, 32, 8, 64);   /* Llama 3.2 1B's heads, a prefill chunk of 5 */
    float *x = dconst(1024, 0.0f);
    ck_assert_int_eq(gpu->attention_kv_fwd(x, x, x, x, 4096, 1, 2, 2, 4), PL_EBACKEND);
    ck_assert_msg(strstr(gpu->error(), "attention_kv_fwd") && strstr(gpu->error(), "invalid shape"), "error(): %s",
                  gpu->error());
    gpu->free(x);
}
END_TEST

START_TEST(test_swiglu) {
    enum { n = 1031 };
    rng_seed(15);
    float *up = hrand(n, -2, 2), *gate = hrand(n, -8, 8), *dout = hrand(n, -1, 1);
    float *o = hconst(n, 0), *du = hconst(n, 0), *dg = hconst(n, 0);
    CPU_OK(cpu->swiglu_fwd(o, up, gate, n));
    CPU_OK(cpu->swiglu_bwd(du, dg, dout, up, gate, n));
    float *g_u = dput(up, n), *g_g = dput(gate, n), *g_d = dput(dout, n);
    float *first[3] = {NULL, NULL, NULL};
    for (int rep = 0; rep < 2; rep++) {
        float *g_o = dconst(n, 999.0f), *g_du = dconst(n, 999.0f), *g_dg = dconst(n, 999.0f);
        OK(gpu->swiglu_fwd(g_o, g_u, g_g, n));
        OK(gpu->swiglu_bwd(g_du, g_dg, g_d, g_u, g_g, n));
        float *res[3] = {dget(g_o, n), dget(g_du, n), dget(g_dg, n)};
        static const char *names[3] = {"swiglu_fwd", "swiglu_bwd dup", "swiglu_bwd dgate"};
        const float *refs[3] = {o, du, dg};
        for (int i = 0; i < 3; i++) {
            char what[64];
            if (rep == 0) {
                check32(names[i], res[i], refs[i], NULL, n);
                first[i] = res[i];
            } else {
                snprintf(what, sizeof what, "%s twice", names[i]);
                check_same(what, res[i], first[i], n);
                free(res[i]);
                free(first[i]);
            }
        }
        gpu->free(g_o); gpu->free(g_du); gpu->free(g_dg);
    }
    gpu->free(g_u); gpu->free(g_g); gpu->free(g_d);
    free(up); free(gate); free(dout); free(o); free(du); free(dg);
}
END_TEST

// ----------------------------------------------------------------------------

static Suite *nodev_suite(void) {
    Suite *su = suite_create("cuda (no device needed)");
    TCase *tc = tcase_create("registry and refusals");
    tcase_add_test(tc, test_nodevice);
    suite_add_tcase(su, tc);
    return su;
}

static Suite *cuda_suite(void) {
    Suite *su = suite_create("cuda");
    struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"memory", test_memory},       {"failures", test_failures},       {"encoder", test_encoder},
        {"layernorm", test_layernorm}, {"matmul", test_matmul},           {"tf32", test_tf32},
        {"attention", test_attention},
        {"attention_flash", test_attention_flash}, {"elementwise", test_elementwise}, {"crossentropy", test_crossentropy},
        {"adamw", test_adamw},         {"sumsq", test_sumsq},             {"rmsnorm", test_rmsnorm},
        {"rope", test_rope},           {"attention_gqa", test_attention_gqa}, {"swiglu", test_swiglu},
        {"attention_kv", test_attention_kv}, {"attention_doc", test_attention_doc},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(su, tc);
    }
    return su;
}

static int run_suite(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed;
}

int main(void) {
    const char *vb = getenv("TEST_CUDA_VERBOSE");
    verbose = vb && *vb && strcmp(vb, "0") != 0;
    unsetenv("PIPELM_CUDA_TF32"); /* fp32 means fp32 here; test_tf32 sets it itself */
    char err[512] = "";
    /* the CPU reference keeps the (T, T) probabilities, which the attention cases compare
     * (its tiled path is test_attention.c's); the variable also reaches the CPU backend's
     * init inside another host backend's */
    setenv("PIPELM_CPU_ATTENTION", "full", 1);
    backend_options co = {PL_PREC_FP32, 1, -1, 0, 0, NULL};
    if (cpu->init(&co, err, sizeof err) != 0) {
        fprintf(stderr, "test_cuda: cpu backend init failed: %s\n", err);
        return EXIT_FAILURE;
    }
    backend_options go = {PL_PREC_FP32, 1, -1, 0, 0, NULL};
    int rc = gpu->init(&go, init_err, sizeof init_err);
    have_device = rc == 0;
    if (!have_device && strncmp(init_err, "no CUDA device", 14) != 0) {
        fprintf(stderr, "test_cuda: cuda backend init failed (a device is there but unusable?): %s\n", init_err);
        return EXIT_FAILURE;
    }
    int failed = run_suite(nodev_suite());
    if (!have_device) {
        printf("test_cuda: SKIP (exit 77): %s\n", init_err);
        return failed ? EXIT_FAILURE : 77;
    }
    char d[256] = "";
    gpu->describe(d, sizeof d);
    printf("test_cuda: %s\n", d);
    failed += run_suite(cuda_suite());
    printf("test_cuda: worst fp32 max-rel %.3e; bf16 matmul l2-rel %.3e cos %.7f; bf16 attention l2-rel %.3e cos "
           "%.7f\n",
           worst32, worst16, worst16cos, worst16a, worst16acos);
    gpu->finalize();
    cpu->finalize();
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
