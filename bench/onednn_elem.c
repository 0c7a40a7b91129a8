/*
 * onednn_elem.c — the driver of bench/onednn_elem.sh: the memory-bound ops of a bf16 step (the
 * op classes norm/GELU/residual/embedding, loss and optimizer) one at a time through the oneDNN
 * backend, at the tutorial's (or any) shapes: ms a call and GB/s of the bytes each must move
 * (read + written, once), beside a copy (the backend's copy op, memcpy) measured the same way
 * in the same process. Each op's time is the best of REPS calls by the thread's CPU time (a
 * machine other jobs load: the time this thread ran, not the time it waited), one thread.
 *
 *   onednn_elem N C V PARAMS REPS      (the tutorial: 1024 512 10000 30462976 20)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "pipelm/backend.h"

extern const backend backend_onednn;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static float *buf(size_t n, float scale) {
    void *p = NULL;
    if (backend_onednn.alloc(&p, n * sizeof(float)) != 0) { fprintf(stderr, "alloc: %s\n", backend_onednn.error()); exit(1); }
    float *f = p;
    for (size_t i = 0; i < n; i++) f[i] = scale * ((float)(i % 13) - 6.0f) / 6.0f;
    return f;
}

#define TIME(name, bytes, call)                                                                 \
    do {                                                                                        \
        double best = 1e30;                                                                     \
        for (int r = 0; r < reps; r++) {                                                        \
            double t0 = now();                                                                  \
            if ((call) != 0) { fprintf(stderr, "%s: %s\n", name, be->error()); return 1; }      \
            double t = now() - t0;                                                              \
            best = t < best ? t : best;                                                         \
        }                                                                                       \
        printf("%-30s %9.3f ms %8.1f GB/s %6.2f x copy\n", name, 1e3 * best, (bytes) / best / 1e9, \
               copy_gbs > 0 ? (bytes) / best / 1e9 / copy_gbs : 1.0);                          \
        if (copy_gbs < 0) copy_gbs = (bytes) / best / 1e9;                                      \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 6) { fprintf(stderr, "usage: %s N C V PARAMS REPS\n", argv[0]); return 2; }
    int N = atoi(argv[1]), C = atoi(argv[2]), V = atoi(argv[3]), reps = atoi(argv[5]);
    size_t P = (size_t)atol(argv[4]), nc = (size_t)N * C, nh = 4 * nc;
    const backend *be = &backend_onednn;
    char err[512], d[256];
    backend_options o = {PL_PREC_BF16, 1, -1, 0, 0, NULL};
    if (be->init(&o, err, sizeof err)) {
        o.precision = PL_PREC_FP32;
        if (be->init(&o, err, sizeof err)) { fprintf(stderr, "init: %s\n", err); return 1; }
    }
    be->describe(d, sizeof d);
    printf("# %s\n# N %d, C %d, V %d, %zu parameters, best of %d calls (thread CPU time)\n", d, N, C, V, P, reps);
    float *x = buf(nc, 1), *y = buf(nc, 0.5f), *z = buf(nc, 0), *w = buf(C, 1), *b = buf(C, 0.1f);
    float *mean = buf(N, 0), *rstd = buf(N, 1), *h = buf(nh, 1), *h2 = buf(nh, 0.3f), *h3 = buf(nh, 0);
    float *wte = buf((size_t)V * C, 0.02f), *wpe = buf((size_t)128 * C, 0.02f), *dw = buf(C, 0), *db = buf(C, 0);
    float *logits = buf((size_t)N * V, 1), *losses = buf(N, 0);
    float *p = buf(P, 0.02f), *g = buf(P, 0.001f), *m = buf(P, 0), *v = buf(P, 0), *p2 = buf(P, 0);
    int *tok = NULL;
    if (be->alloc((void **)&tok, sizeof(int) * (size_t)N)) return 1;
    for (int i = 0; i < N; i++) tok[i] = (i * 7919) % V;
    double copy_gbs = -1, fb = sizeof(float);
    rstd[0] = 1;
    TIME("copy (N, C) x 64", 2 * fb * nc * 64, be->copy(p2, p, (size_t)(nc * 64 < P ? nc * 64 : P) * sizeof(float)));
    TIME("copy (all parameters)", 2 * fb * P, be->copy(p2, p, P * sizeof(float)));
    TIME("layernorm_fwd (N, C)", 2 * fb * nc, be->layernorm_fwd(z, mean, rstd, x, w, b, N, C));
    TIME("layernorm_bwd_input", 4 * fb * nc, be->layernorm_bwd_input(z, y, x, w, mean, rstd, N, C));
    TIME("layernorm_bwd_weight", 2 * fb * nc, be->layernorm_bwd_weight(dw, db, y, x, mean, rstd, N, C));
    TIME("residual_fwd (N, C)", 3 * fb * nc, be->residual_fwd(z, x, y, nc));
    TIME("add_inplace (N, C)", 3 * fb * nc, be->add_inplace(z, y, nc));
    TIME("gelu_fwd (N, 4C)", 2 * fb * nh, be->gelu_fwd(h3, h, nh));
    TIME("gelu_bwd (N, 4C)", 3 * fb * nh, be->gelu_bwd(h3, h, h2, nh));
    TIME("encoder_fwd (N, C)", 3 * fb * nc, be->encoder_fwd(z, tok, wte, wpe, N, 128, C));
    TIME("encoder_bwd (N, C)", 5 * fb * nc, be->encoder_bwd(wte, wpe, y, tok, N, 128, C));
    TIME("crossentropy_fwd (N, V)", 2 * fb * N * (double)V, be->crossentropy_fwd(losses, logits, tok, N, V, V));
    TIME("crossentropy_bwd (N, V)", 2 * fb * N * (double)V, be->crossentropy_bwd(logits, tok, 1.0f / N, N, V, V));
    TIME("adamw (all parameters)", 7 * fb * P, be->adamw(p, g, m, v, P, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 1));
    double ss;
    TIME("sumsq (all parameters)", fb * P, be->sumsq(g, P, &ss));
    TIME("scale (all parameters)", 2 * fb * P, be->scale(g, 1.0f, P));
    be->finalize();
    return 0;
}
