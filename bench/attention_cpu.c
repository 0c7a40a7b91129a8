/*
 * attention_cpu.c — the driver of bench/attention_cpu.sh: the CPU backend's causal attention,
 * forward and backward, with --backend-opt attention=full (the (T, T) probabilities) and
 * attention=tiled (the fused path: output and log-sum-exp), milliseconds per layer and the
 * floats each keeps for the backward, and the largest difference between the two. Times are
 * the process's CPU time, the fastest of the repetitions.
 *
 *   attention_cpu B NH NKV HS THREADS SECONDS T...      (e.g. 4 12 12 64 1 2 1024)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "pipelm/backend.h"

static const backend *be = &backend_cpu;
static int prec = PL_PREC_FP32; /* BENCH_BACKEND=onednn BENCH_PRECISION=bf16: the oneDNN backend in bf16 */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts); /* CPU time: steadier than wall time on a shared machine */
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static float *buf(size_t n) {
    void *p = NULL;
    if (be->alloc(&p, n * sizeof(float)) != 0) { fprintf(stderr, "alloc of %zu floats: %s\n", n, be->error()); exit(1); }
    return p;
}

static void mode(const char *settings, int threads) {
    char err[256];
    backend_options o = {prec, threads, -1, 0, 0, settings};
    if (be->init(&o, err, sizeof err)) { fprintf(stderr, "init: %s\n", err); exit(1); }
}

/* The fastest forward and backward (seconds) of the pairs run for `seconds` after one
 * warm-up pair, at least 3: the minimum, as other work on the machine only adds. */
static void time_pair(double *tf, double *tb, float *out, float *att, float *dq, const float *qkv, const float *dout,
                      int B, int T, int NH, int NKV, int HS, double seconds) {
    double total = 0;
    *tf = *tb = 1e30;
    for (int it = -1; it < 3 || total < seconds; it++) {
        double t0 = now();
        if (be->attention_gqa_fwd(out, att, qkv, B, T, NH, NKV, HS, NULL)) { fprintf(stderr, "%s\n", be->error()); exit(1); }
        double t1 = now();
        if (be->attention_gqa_bwd(dq, dout, qkv, att, B, T, NH, NKV, HS, NULL)) { fprintf(stderr, "%s\n", be->error()); exit(1); }
        double t2 = now();
        if (it < 0) continue;
        total += t2 - t0;
        *tf = t1 - t0 < *tf ? t1 - t0 : *tf;
        *tb = t2 - t1 < *tb ? t2 - t1 : *tb;
    }
}

static double maxdiff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs((double)a[i] - b[i]) > m ? fabs((double)a[i] - b[i]) : m;
    return m;
}

int main(int argc, char **argv) {
    if (argc < 8) { fprintf(stderr, "usage: attention_cpu B NH NKV HS THREADS SECONDS T...\n"); return 2; }
    const char *bn = getenv("BENCH_BACKEND"), *pn = getenv("BENCH_PRECISION");
    if (bn && *bn && !(be = backend_find(bn))) { fprintf(stderr, "no backend %s in this build\n", bn); return 2; }
    if (pn && strcmp(pn, "bf16") == 0) prec = PL_PREC_BF16;
    printf("backend %s, %s\n", be->name, prec == PL_PREC_BF16 ? "bf16" : "fp32");
    int B = atoi(argv[1]), NH = atoi(argv[2]), NKV = atoi(argv[3]), HS = atoi(argv[4]), th = atoi(argv[5]);
    double secs = atof(argv[6]);
    printf("%6s %10s %10s %10s %10s %10s %10s %8s %12s %12s %10s\n", "T", "full fwd", "full bwd", "tiled fwd",
           "tiled bwd", "full f+b", "tiled f+b", "speedup", "full MB", "tiled MB", "max diff");
    for (int a = 7; a < argc; a++) {
        int T = atoi(argv[a]), W = (NH + 2 * NKV) * HS;
        size_t nq = (size_t)B * T * W, no = (size_t)B * T * NH * HS, na = (size_t)B * NH * T * T;
        float *qkv = buf(nq), *dout = buf(no), *o[2], *dq[2], *att = buf(na);
        for (size_t i = 0; i < nq; i++) qkv[i] = sinf(0.37f * (float)(i % 1031));
        for (size_t i = 0; i < no; i++) dout[i] = cosf(0.11f * (float)(i % 977));
        double tf[2], tb[2];
        size_t keep[2];
        for (int m = 0; m < 2; m++) {
            mode(m ? "attention=tiled" : "attention=full", th);
            o[m] = buf(no), dq[m] = buf(nq);
            keep[m] = (size_t)B * NH * T * (be->attention_cols ? be->attention_cols(B, T, NH, HS) : T);
            time_pair(&tf[m], &tb[m], o[m], att, dq[m], qkv, dout, B, T, NH, NKV, HS, secs);
        }
        double d = maxdiff(o[0], o[1], no), d2 = maxdiff(dq[0], dq[1], nq);
        printf("%6d %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %7.2fx %12.1f %12.1f %10.1e\n", T, 1e3 * tf[0],
               1e3 * tb[0], 1e3 * tf[1], 1e3 * tb[1], 1e3 * (tf[0] + tb[0]), 1e3 * (tf[1] + tb[1]),
               (tf[0] + tb[0]) / (tf[1] + tb[1]), 4e-6 * keep[0], 4e-6 * keep[1], d > d2 ? d : d2);
        be->free(qkv); be->free(dout); be->free(att);
        for (int m = 0; m < 2; m++) { be->free(o[m]); be->free(dq[m]); }
    }
    return 0;
}
