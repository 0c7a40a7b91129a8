/*
 * bench.c — `pipelm bench`: sgemm peak measurement.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cblas.h>
#include "pipelm/backend.h"
#include "pipelm/bench.h"
#include "pipelm/common.h"

double bench_sgemm_gflops(int n, int threads, double seconds) {
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
    if (!a || !b || !c) { free(a); free(b); free(c); return 0.0; }
    for (long i = 0; i < (long)n * n; i++) { a[i] = (float)(i % 7) * 0.1f; b[i] = (float)(i % 5) * 0.1f; c[i] = 0; }
    backend_cpu_set_threads(threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up */
    int reps = 0;
    double t0 = pl_now(), t;
    do {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        reps++;
        t = pl_now() - t0;
    } while (t < seconds);
    free(a); free(b); free(c);
    return 2.0 * n * n * (double)n * reps / t / 1e9;
}

static void bench_usage(FILE *out) {
    fprintf(out, "usage: pipelm bench --peak [--json FILE]\n"
                 "  --peak        measure one-thread and all-thread cblas_sgemm GFLOP/s\n"
                 "  --json FILE   also write the figures as JSON\n");
}

int bench_main(int argc, char **argv, int first, MPI_Comm comm, int *abort_needed) {
    (void)abort_needed;
    int rank, peak = 0;
    const char *json = NULL;
    MPI_Comm_rank(comm, &rank);
    for (int i = first; i < argc; i++) {
        if (strcmp(argv[i], "--peak") == 0) peak = 1;
        else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) json = argv[++i];
        else if (strcmp(argv[i], "--help") == 0) { if (rank == 0) bench_usage(stdout); return 0; }
        else {
            if (rank == 0) { pl_error("bench: unknown option '%s'", argv[i]); bench_usage(stderr); }
            return 2;
        }
    }
    if (!peak) {
        if (rank == 0) { pl_error("bench: nothing to do"); bench_usage(stderr); }
        return 2;
    }
    if (rank != 0) return 0;
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    double g1 = bench_sgemm_gflops(2048, 1, 1.0);
    double ga = bench_sgemm_gflops(2048, cores, 1.0);
    pl_info("cblas_sgemm 2048^3: 1 thread %.1f GFLOP/s, %d threads %.1f GFLOP/s\n", g1, cores, ga);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) { pl_error("cannot write %s", json); return 1; }
        fprintf(f, "{\"peak_gflops_1\":%.3f,\"peak_gflops_all\":%.3f,\"threads\":%d,\"n\":2048}\n", g1, ga, cores);
        fclose(f);
    }
    return 0;
}
