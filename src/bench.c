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
#include "pipelm/blas.h"
#include "pipelm/common.h"

double bench_sgemm_gflops(int n, int threads, double seconds) {
    if (n < 1 || n > 16384) return 0.0;
    size_t nn = (size_t)n * (size_t)n;
    float *a = malloc(sizeof(float) * nn), *b = malloc(sizeof(float) * nn), *c = malloc(sizeof(float) * nn);
    if (!a || !b || !c) { free(a); free(b); free(c); return 0.0; }
    for (size_t i = 0; i < nn; i++) { a[i] = (float)(i % 7) * 0.1f; b[i] = (float)(i % 5) * 0.1f; c[i] = 0; }
    backend_cpu.set_threads(threads);
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

/* Median of a small array (copied, then insertion-sorted). */
static double median(const double *x, int n, double *mn, double *mx) {
    if (n < 1) { *mn = *mx = 0; return 0; }
    double *c = malloc(sizeof(double) * (size_t)n);
    if (!c) { *mn = *mx = 0; return 0; }
    for (int i = 0; i < n; i++) c[i] = x[i];
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && c[b] < c[b - 1]; b--) { double t = c[b]; c[b] = c[b - 1]; c[b - 1] = t; }
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    *mn = c[0];
    *mx = c[n - 1];
    free(c);
    return m;
}

int bench_report(const bench_result *br, const char *json, const char *csv) {
    int P = br->P;
    double total_s = 0, mn, mx;
    for (int i = 0; i < br->nsteps; i++) total_s += br->step_s[i];
    double med = median(br->step_s, br->nsteps, &mn, &mx);
    double tokens_per_s = total_s > 0 ? (double)br->B * br->T * br->nsteps / total_s : 0;
    double tflops = tokens_per_s * br->flops_per_token / 1e12;
    /* measured bubble: the share of the pipeline phase (step minus optimizer) that ranks
     * spend not computing, summed over ranks — the quantity the schedule's theory predicts */
    double peak = 0, compute = 0, pipe = 0;
    for (int r = 0; r < P; r++) {
        const double *s = br->stage_stats + 8 * r;
        peak += s[6];
        compute += s[0];
        pipe += s[3] - s[2];
    }
    double mfu = peak > 0 ? tflops * 1e3 / peak : 0;
    double bubble = pipe > 0 ? 1.0 - compute / pipe : 0;
    pl_info("\nbenchmark: %d stage%s, schedule %s, %d micro-batches, batch %d x %d, %d timed steps\n",
            P, P > 1 ? "s" : "", br->schedule, br->M, br->B, br->T, br->nsteps);
    pl_info("  throughput      %10.1f tokens/s\n", tokens_per_s);
    pl_info("  step time       %10.1f ms median (min %.1f, max %.1f)\n", 1e3 * med, 1e3 * mn, 1e3 * mx);
    pl_info("  model FLOP/s    %10.4f TFLOP/s (%.3g FLOP/token = 6N + 6LCT)\n", tflops, br->flops_per_token);
    pl_info("  MFU             %10.1f %% of %.1f GFLOP/s measured sgemm peak (all ranks)\n", 100 * mfu, peak);
    pl_info("  BLAS kernel     %10s (%s)\n", blas_kernel(), blas_kernel_origin());
    pl_info("  bubble          %10.1f %% measured, %.1f %% theoretical\n", 100 * bubble, 100 * br->bubble_theoretical);
    pl_info("  stage  rank  blocks  compute ms  wait ms  optim ms  idle ms  peak RSS MB  sgemm GF/s\n");
    for (int r = 0; r < P; r++) {
        const double *s = br->stage_stats + 8 * r;
        double idle = s[3] - s[0] - s[1] - s[2];
        pl_info("  %5d  %4d  %6.0f  %10.1f  %7.1f  %8.1f  %7.1f  %11.1f  %10.1f\n", r, r, s[5], s[0], s[1], s[2],
                idle > 0 ? idle : 0, s[4], s[6]);
    }
    int rc = 0;
    if (json && json[0]) {
        FILE *f = fopen(json, "w");
        if (!f) { pl_error("cannot write %s", json); rc = PL_EIO; }
        else {
            fprintf(f, "{\"stages_count\":%d,\"schedule\":\"%s\",\"microbatches\":%d,\"batch\":%d,\"seq_len\":%d,"
                       "\"steps\":%d,\"tokens_per_s\":%.3f,\"step_ms\":{\"min\":%.3f,\"median\":%.3f,\"max\":%.3f},"
                       "\"tflops\":%.6f,\"mfu\":%.6f,\"peak_gflops\":%.3f,\"flops_per_token\":%.6g,"
                       "\"bubble_measured\":%.6f,\"bubble_theoretical\":%.6f,\"blas_kernel\":\"%s\",\"stages\":[",
                    P, br->schedule, br->M, br->B, br->T, br->nsteps, tokens_per_s, 1e3 * mn, 1e3 * med, 1e3 * mx,
                    tflops, mfu, peak, br->flops_per_token, bubble, br->bubble_theoretical, blas_kernel());
            for (int r = 0; r < P; r++) {
                const double *s = br->stage_stats + 8 * r;
                double idle = s[3] - s[0] - s[1] - s[2];
                fprintf(f, "%s{\"rank\":%d,\"blocks\":%d,\"compute_ms\":%.3f,\"wait_ms\":%.3f,\"optimizer_ms\":%.3f,"
                           "\"idle_ms\":%.3f,\"peak_rss_mb\":%.1f,\"sgemm_gflops\":%.2f,\"threads\":%d}",
                        r ? "," : "", r, (int)s[5], s[0], s[1], s[2], idle > 0 ? idle : 0, s[4], s[6], (int)s[7]);
            }
            fprintf(f, "]}\n");
            if (fclose(f) != 0) rc = PL_EIO;
        }
    }
    if (csv && csv[0]) {
        FILE *f = fopen(csv, "w");
        if (!f) { pl_error("cannot write %s", csv); rc = PL_EIO; }
        else {
            fprintf(f, "schedule,stages,microbatches,batch,seq_len,tokens_per_s,step_ms_min,step_ms_median,step_ms_max,"
                       "tflops,mfu,peak_gflops,bubble_measured,bubble_theoretical\n");
            fprintf(f, "%s,%d,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,%.6f,%.6f,%.3f,%.6f,%.6f\n", br->schedule, P, br->M, br->B,
                    br->T, tokens_per_s, 1e3 * mn, 1e3 * med, 1e3 * mx, tflops, mfu, peak, bubble, br->bubble_theoretical);
            if (fclose(f) != 0) rc = PL_EIO;
        }
    }
    return rc;
}

int bench_peak_main(int argc, char **argv, int first, MPI_Comm comm) {
    int rank;
    const char *json = NULL;
    MPI_Comm_rank(comm, &rank);
    for (int i = first; i < argc; i++) {
        if (strcmp(argv[i], "--peak") == 0) continue;
        if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) json = argv[++i];
        else {
            if (rank == 0) pl_error("bench --peak: unexpected argument '%s' (only --json FILE)", argv[i]);
            return 2;
        }
    }
    if (rank != 0) return 0;
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    double g1 = bench_sgemm_gflops(2048, 1, 1.0);
    double ga = bench_sgemm_gflops(2048, cores, 1.0);
    pl_info("cblas_sgemm 2048^3: 1 thread %.1f GFLOP/s, %d threads %.1f GFLOP/s (OpenBLAS kernel %s: %s)\n", g1,
            cores, ga, blas_kernel(), blas_kernel_origin());
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) { pl_error("cannot write %s", json); return 1; }
        fprintf(f, "{\"peak_gflops_1\":%.3f,\"peak_gflops_all\":%.3f,\"threads\":%d,\"n\":2048,\"blas_kernel\":\"%s\"}\n",
                g1, ga, cores, blas_kernel());
        fclose(f);
    }
    return 0;
}
