/*
 * onednn_matmul.c — the driver of bench/onednn_matmul.sh: GFLOP/s of matmul_fwd, matmul_bwd_input
 * and matmul_bwd_weight per shape through backend_cpu (OpenBLAS), backend_onednn fp32 and bf16,
 * and what the bf16 conversion costs: its time inside each bf16 op (the same conversion the op
 * does, timed alone) and the same conversion through a oneDNN reorder primitive instead.
 *
 *   onednn_matmul N THREADS SECONDS CxOC...      (e.g. 1024 1 0.5 768x2304 3072x768)
 *
 * W is made a weight as in training (one AdamW call with lr 0): in bf16 its copy is then
 * kept (the weight cache), so fwd and bwd_input convert only their activation, as in a step.
 * bf16 bwd_weight is timed twice more, interleaved: --backend-opt wgrad-layout=1 (the default:
 * the activation converted into oneDNN's blocked layout) and wgrad-layout=0 (plain rows, the
 * kernel's own copy), the best of three rounds each.
 */
#include <dnnl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "pipelm/backend.h"

extern const backend backend_onednn;
void onednn_cvt_bf16(uint16_t *dst, const float *src, size_t n, int force_scalar);

/* Wall-clock, or with BENCH_CPU_TIME=1 the process's CPU time (a machine other jobs load: the
 * time this process ran, not the time it waited for a core; meaningful with one thread). */
static double now(void) {
    static int cpu = -1;
    if (cpu < 0) cpu = getenv("BENCH_CPU_TIME") && atoi(getenv("BENCH_CPU_TIME")) > 0;
    struct timespec ts;
    clock_gettime(cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static float *buf(const backend *be, size_t n, float scale) {
    void *p = NULL;
    if (be->alloc(&p, n * sizeof(float)) != 0) { fprintf(stderr, "alloc: %s\n", be->error()); exit(1); }
    float *f = p;
    for (size_t i = 0; i < n; i++) f[i] = scale * ((float)(i % 13) - 6.0f) / 6.0f;
    return f;
}

/* seconds per call of op k (0 fwd, 1 bwd_input, 2 bwd_weight), after one warm-up call */
static double time_op(const backend *be, int k, float *inp, float *w, float *b, float *out, float *dinp,
                      float *dw, float *db, int N, int C, int OC, double seconds) {
    int reps = 0, rc = 0;
    double t0 = 0;
    for (int it = -1;; it++) {
        if (it == 0) t0 = now();
        if (k == 0) rc = be->matmul_fwd(out, inp, w, b, N, C, OC);
        else if (k == 1) rc = be->matmul_bwd_input(dinp, out, w, N, C, OC);
        else rc = be->matmul_bwd_weight(dw, db, out, inp, N, C, OC);
        if (rc) { fprintf(stderr, "%s op %d: %s\n", be->name, k, be->error()); exit(1); }
        if (it >= 0) reps++;
        if (it >= 0 && now() - t0 >= seconds) break;
    }
    return (now() - t0) / reps;
}

static double time_cvt(const float *src, uint16_t *dst, size_t n, double seconds) {
    int reps = 0;
    double t0 = now();
    do { onednn_cvt_bf16(dst, src, n, 0); reps++; } while (now() - t0 < seconds);
    return (now() - t0) / reps;
}

static double time_reorder(float *src, uint16_t *dst, size_t n, double seconds) {
    dnnl_engine_t eng;
    dnnl_stream_t st;
    dnnl_memory_desc_t a, b;
    dnnl_dims_t d = {(dnnl_dim_t)n};
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p;
    dnnl_memory_t ma, mb;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) || dnnl_stream_create(&st, eng, dnnl_stream_default_flags) ||
        dnnl_memory_desc_init_by_tag(&a, 1, d, dnnl_f32, dnnl_a) || dnnl_memory_desc_init_by_tag(&b, 1, d, dnnl_bf16, dnnl_a) ||
        dnnl_reorder_primitive_desc_create(&pd, &a, eng, &b, eng, NULL) || dnnl_primitive_create(&p, pd) ||
        dnnl_memory_create(&ma, &a, eng, src) || dnnl_memory_create(&mb, &b, eng, dst))
        return -1;
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, ma}, {DNNL_ARG_TO, mb}};
    dnnl_primitive_execute(p, st, 2, args);
    dnnl_stream_wait(st);
    int reps = 0;
    double t0 = now();
    do { dnnl_primitive_execute(p, st, 2, args); dnnl_stream_wait(st); reps++; } while (now() - t0 < seconds);
    double t = (now() - t0) / reps;
    dnnl_memory_destroy(ma); dnnl_memory_destroy(mb); dnnl_primitive_destroy(p); dnnl_primitive_desc_destroy(pd);
    dnnl_stream_destroy(st); dnnl_engine_destroy(eng);
    return t;
}

/* The core's instruction peaks, 12 independent accumulators: vfmadd231ps (32 FLOP) and
 * vdpbf16ps (64 FLOP) on zmm registers, GFLOP/s; what a bf16 matmul without AMX can reach. */
#define R12(op) op " %%zmm20,%%zmm21,%%zmm0\n" op " %%zmm20,%%zmm21,%%zmm1\n" op " %%zmm20,%%zmm21,%%zmm2\n" \
    op " %%zmm20,%%zmm21,%%zmm3\n" op " %%zmm20,%%zmm21,%%zmm4\n" op " %%zmm20,%%zmm21,%%zmm5\n"               \
    op " %%zmm20,%%zmm21,%%zmm6\n" op " %%zmm20,%%zmm21,%%zmm7\n" op " %%zmm20,%%zmm21,%%zmm8\n"               \
    op " %%zmm20,%%zmm21,%%zmm9\n" op " %%zmm20,%%zmm21,%%zmm10\n" op " %%zmm20,%%zmm21,%%zmm11\n"
__attribute__((target("avx512f,avx512bf16"), noinline)) static void insn_peaks(void) {
#if defined(__x86_64__)
    long n = 50000000;
    if (!__builtin_cpu_supports("avx512f")) return;
    double t0 = now();
    __asm__ volatile("vpxord %%zmm20,%%zmm20,%%zmm20\n vpxord %%zmm21,%%zmm21,%%zmm21\n mov %0,%%rcx\n1:\n" R12("vfmadd231ps")
                     "dec %%rcx\n jnz 1b\n" ::"r"(n)
                     : "rcx", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
                       "xmm11", "xmm20", "xmm21", "memory");
    double f = 12.0 * n * 32 / (now() - t0) / 1e9, b = -1;
    if (__builtin_cpu_supports("avx512bf16")) {
        t0 = now();
        __asm__ volatile("vpxord %%zmm20,%%zmm20,%%zmm20\n vpxord %%zmm21,%%zmm21,%%zmm21\n mov %0,%%rcx\n1:\n" R12("vdpbf16ps")
                         "dec %%rcx\n jnz 1b\n" ::"r"(n)
                         : "rcx", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
                           "xmm11", "xmm20", "xmm21", "memory");
        b = 12.0 * n * 64 / (now() - t0) / 1e9;
    }
    if (b > 0)
        printf("# one core's instruction peak: vfmadd231ps %.1f GFLOP/s, vdpbf16ps %.1f GFLOP/s (%.2f x fp32)\n", f, b,
               b / f);
    else
        printf("# one core's instruction peak: vfmadd231ps %.1f GFLOP/s, no vdpbf16ps\n", f);
#endif
}

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: %s N THREADS SECONDS CxOC...\n", argv[0]); return 2; }
    int N = atoi(argv[1]), threads = atoi(argv[2]);
    double secs = atof(argv[3]);
    const char *opname[3] = {"fwd", "bwd_input", "bwd_weight"};
    const backend *bes[3] = {&backend_cpu, &backend_onednn, &backend_onednn};
    const int precs[3] = {PL_PREC_FP32, PL_PREC_FP32, PL_PREC_BF16};
    const char *label[3] = {"cpu fp32", "onednn fp32", "onednn bf16"};
    int have16 = 1;
    char err[512];
    backend_options o = {PL_PREC_BF16, threads, -1};
    if (backend_onednn.init(&o, err, sizeof err)) { printf("bf16 not available: %s\n", err); have16 = 0; }
    char d[256];
    for (int b = 0; b < 3; b++) {
        o.precision = precs[b];
        if (b == 2 && !have16) continue;
        if (bes[b]->init(&o, err, sizeof err)) { printf("%s: %s\n", label[b], err); return 1; }
        bes[b]->describe(d, sizeof d);
        printf("# %-12s %s\n", label[b], d);
    }
    insn_peaks();
    printf("%-6s %-11s %-11s %10s %10s %10s %s\n", "N", "CxOC", "op", "cpu fp32", "dnn fp32", "dnn bf16",
           "GFLOP/s | bf16: conversion share, own AVX-512 loop vs oneDNN reorder (ms)");
    for (int s = 4; s < argc; s++) {
        int C, OC;
        if (sscanf(argv[s], "%dx%d", &C, &OC) != 2) { fprintf(stderr, "bad shape %s\n", argv[s]); return 2; }
        const backend *be = &backend_onednn;
        size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
        float *inp = buf(be, ni, 1), *w = buf(be, nw, 0.05f), *b = buf(be, OC, 0.1f), *out = buf(be, no, 1);
        float *dinp = buf(be, ni, 0), *dw = buf(be, nw, 0), *db = buf(be, OC, 0);
        double flops = 2.0 * N * (double)C * OC;
        double t[3][3], tl[2] = {1e30, 1e30};
        { /* W becomes a weight range (the bf16 weight cache keeps its copy), as in training */
            float *z = buf(be, 2 * nw, 0);
            be->adamw(w, z, z, z + nw, nw, 0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 1);
            be->free(z);
        }
        for (int bi = 0; bi < 3; bi++) {
            if (bi == 2 && !have16) { for (int k = 0; k < 3; k++) t[bi][k] = 0; continue; }
            o.precision = precs[bi];
            bes[bi]->init(&o, err, sizeof err);
            for (int k = 0; k < 3; k++) t[bi][k] = time_op(bes[bi], k, inp, w, b, out, dinp, dw, db, N, C, OC, secs);
        }
        for (int round = 0; have16 && round < 3; round++)
            for (int lay = 0; lay < 2; lay++) {
                backend_options ol = {PL_PREC_BF16, threads, -1, 0, 0, lay ? "wgrad-layout=1" : "wgrad-layout=0"};
                backend_onednn.init(&ol, err, sizeof err);
                double tt = time_op(&backend_onednn, 2, inp, w, b, out, dinp, dw, db, N, C, OC, secs / 2);
                tl[lay] = tt < tl[lay] ? tt : tl[lay];
            }
        /* conversions each bf16 op does: fwd inp, bwd_input dout (W's copy is kept: a weight),
         * bwd_weight dout + inp */
        size_t big = ni > no ? ni : no;
        big = big > nw ? big : nw;
        uint16_t *dst = malloc(2 * big);
        float *src = buf(be, big, 1);
        double ci = time_cvt(src, dst, ni, secs / 4), cw = time_cvt(src, dst, nw, secs / 4),
               co = time_cvt(src, dst, no, secs / 4);
        double ri = time_reorder(src, dst, ni, secs / 4), rw = time_reorder(src, dst, nw, secs / 4),
               ro = time_reorder(src, dst, no, secs / 4);
        double cv[3] = {ci, co, co + ci}, rv[3] = {ri, ro, ro + ri};
        (void)cw;
        (void)rw;
        for (int k = 0; k < 3; k++) {
            printf("%-6d %-11s %-11s %10.1f %10.1f %10.1f", N, argv[s], opname[k], flops / t[0][k] / 1e9,
                   flops / t[1][k] / 1e9, have16 ? flops / t[2][k] / 1e9 : 0.0);
            if (have16)
                printf(" | cvt %4.1f %% of the op, %.3f ms own vs %.3f ms reorder", 100 * cv[k] / t[2][k], 1e3 * cv[k],
                       1e3 * rv[k]);
            if (have16 && k == 2)
                printf(" | wgrad-layout=1 %.1f, =0 %.1f GFLOP/s (best of 3, interleaved)", flops / tl[1] / 1e9,
                       flops / tl[0] / 1e9);
            printf("\n");
        }
        fflush(stdout);
        float *all[] = {inp, w, b, out, dinp, dw, db, src};
        for (int i = 0; i < 8; i++) be->free(all[i]);
        free(dst);
    }
    backend_onednn.finalize();
    return 0;
}
