/*
 * bench.c — `pipelm bench`: sgemm peak measurement, the matmul peak of a backend (oneDNN
 * fp32 / bf16) through its matmul_fwd (the clock read after the backend's synchronize, so a
 * device backend is timed on its kernels), and the report of a benchmark run.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cblas.h>
#include "pipelm/backend.h"
#include "run/bench.h"
#include "backend/cpu/blas.h"
#include "util/common.h"
#include "util/files.h"

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

/* What the last bench_matmul_* call ran on (the backend's describe line) or why it could not. */
static char matmul_info[512];
static const char *bench_matmul_info(void) { return matmul_info; }

/* GFLOP/s of out(N,OC) = inp(N,C) W^T through backend_name's matmul_fwd in `precision` with
 * `threads` threads, repeated for at least `seconds` after one warm-up call. In bf16 the time
 * includes the fp32 -> bf16 conversion of both inputs, which matmul_fwd does on every call.
 * Negative when the backend is not built, refuses the precision, or a call fails (reason in
 * bench_matmul_info()). Initialises the backend with (precision, threads) and leaves it so. */
static double bench_matmul_shape_gflops(const char *backend_name, int precision, int N, int C, int OC, int threads,
                                 double seconds) {
    matmul_info[0] = 0;
    const backend *be = backend_find(backend_name);
    if (!be) {
        snprintf(matmul_info, sizeof matmul_info, "backend %s is not built into this binary (built: %s)",
                 backend_name, backend_list());
        return -1.0;
    }
    if (N < 1 || C < 1 || OC < 1 || N > 65536 || C > 65536 || OC > 262144) {
        snprintf(matmul_info, sizeof matmul_info, "bad shape %d x %d x %d", N, C, OC);
        return -1.0;
    }
    backend_options opt = {precision, threads, -1, 0, 0, NULL};
    char err[512] = "";
    if (be->init(&opt, err, sizeof err) != 0) {
        snprintf(matmul_info, sizeof matmul_info, "%s", err);
        return -1.0;
    }
    if (be->set_threads(threads) != 0) {
        snprintf(matmul_info, sizeof matmul_info, "set_threads: %s", be->error());
        return -1.0;
    }
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *inp = NULL, *w = NULL, *out = NULL, *hi = malloc(sizeof(float) * ni), *hw = malloc(sizeof(float) * nw);
    double g = -1.0;
    int rc = hi && hw ? 0 : PL_ENOMEM;
    if (!rc) rc = be->alloc((void **)&inp, sizeof(float) * ni);
    if (!rc) rc = be->alloc((void **)&w, sizeof(float) * nw);
    if (!rc) rc = be->alloc((void **)&out, sizeof(float) * no);
    if (!rc) {
        for (size_t i = 0; i < ni; i++) hi[i] = (float)(i % 7) * 0.1f - 0.3f;
        for (size_t i = 0; i < nw; i++) hw[i] = (float)(i % 5) * 0.1f - 0.2f;
        rc = be->from_host(inp, hi, sizeof(float) * ni);
        if (!rc) rc = be->from_host(w, hw, sizeof(float) * nw);
    }
    if (!rc) rc = be->matmul_fwd(out, inp, w, NULL, N, C, OC); /* warm-up: primitive creation */
    if (!rc) rc = be->synchronize(); /* the clock is read once the queued work is done */
    if (!rc) {
        int reps = 0;
        double t0 = pl_now(), t;
        do {
            rc = be->matmul_fwd(out, inp, w, NULL, N, C, OC);
            if (!rc) rc = be->synchronize();
            reps++;
            t = pl_now() - t0;
        } while (!rc && t < seconds);
        if (!rc) g = 2.0 * N * (double)C * OC * reps / t / 1e9;
    }
    if (rc) snprintf(matmul_info, sizeof matmul_info, "%s", hi && hw ? be->error() : "out of memory");
    else be->describe(matmul_info, sizeof matmul_info);
    be->free(inp);
    be->free(w);
    be->free(out);
    free(hi);
    free(hw);
    return g;
}

double bench_matmul_gflops(const char *backend_name, int precision, int n, int threads, double seconds) {
    return bench_matmul_shape_gflops(backend_name, precision, n, n, n, threads, seconds);
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

/* The figures bench_report derives from a bench_result. */
typedef struct {
    double tokens_per_s, tflops, med, mn, mx, peak, mfu, bubble;
    int D, V;
} bench_figures;

/* Throughput, step-time spread, MFU against the measured peak of all D P ranks, and the
 * measured bubble: the share of the pipeline phase (step minus optimizer) that ranks spend
 * not computing, summed over ranks (the quantity the schedule's theory predicts). */
static void bench_derive(const bench_result *br, bench_figures *f) {
    double total_s = 0, compute = 0, pipe = 0;
    for (int i = 0; i < br->nsteps; i++) total_s += br->step_s[i];
    f->med = median(br->step_s, br->nsteps, &f->mn, &f->mx);
    f->tokens_per_s = total_s > 0 ? (double)br->B * br->T * br->nsteps / total_s : 0;
    f->tflops = f->tokens_per_s * br->flops_per_token / 1e12;
    f->peak = 0;
    for (int r = 0; r < br->P; r++) {
        const double *s = br->stage_stats + BENCH_NSTAT * r;
        f->peak += s[6];
        compute += s[0];
        pipe += s[3] - s[2];
    }
    f->D = br->D > 1 ? br->D : 1;
    f->V = br->V > 1 ? br->V : 1;
    f->peak *= f->D * (br->Tp > 1 ? br->Tp : 1) * (br->Cp > 1 ? br->Cp : 1); /* all W = T C D P ranks' peak */
    f->mfu = f->peak > 0 ? f->tflops * 1e3 / f->peak : 0;
    f->bubble = pipe > 0 ? 1.0 - compute / pipe : 0;
}

/* The summary and the per-rank table, on stdout. */
static void bench_print(const bench_result *br, const bench_figures *f) {
    int P = br->P, D = f->D, V = f->V;
    char chunks[48] = "";
    char tp[48] = "";
    if (V > 1) snprintf(chunks, sizeof chunks, " (ranks) x %d chunks", V);
    if (br->Tp > 1) snprintf(tp, sizeof tp, " x %d TP ranks", br->Tp);
    if (br->Cp > 1) snprintf(tp, sizeof tp, " x %d CP ranks", br->Cp);
    pl_info("\nbenchmark: %d stage%s%s x %d replica%s%s%s, schedule %s, %d micro-batches, batch %d x %d, %d timed steps\n",
            P, P > 1 ? "s" : "", chunks, D, D > 1 ? "s" : "", br->zero ? " (ZeRO-1)" : "", tp, br->schedule, br->M, br->B,
            br->T, br->nsteps);
    pl_info("  throughput      %10.1f tokens/s\n", f->tokens_per_s);
    pl_info("  step time       %10.1f ms median (min %.1f, max %.1f)\n", 1e3 * f->med, 1e3 * f->mn, 1e3 * f->mx);
    pl_info("  model FLOP/s    %10.4f TFLOP/s (%.3g FLOP/token = 6N + 6LCT)\n", f->tflops, br->flops_per_token);
    pl_info("  MFU             %10.1f %% of %.1f GFLOP/s measured %s peak (all ranks)\n", 100 * f->mfu, f->peak,
            br->peak_what ? br->peak_what : "sgemm");
    pl_info("  BLAS kernel     %10s (%s)\n", blas_kernel(), blas_kernel_origin());
    pl_info("  bubble          %10.1f %% measured, %.1f %% theoretical\n", 100 * f->bubble,
            100 * br->bubble_theoretical);
    pl_info("  stage  rank  blocks  compute ms  wait ms  optim ms  idle ms  peak RSS MB   peak GF/s  dp-wait ms  AdamW MB"
            "  in flight (bound)  act MB\n");
    for (int r = 0; r < P; r++) {
        const double *s = br->stage_stats + BENCH_NSTAT * r;
        double idle = s[3] - s[0] - s[1] - s[2];
        pl_info("  %5d  %4d  %6.0f  %10.1f  %7.1f  %8.1f  %7.1f  %11.1f  %10.1f  %10.2f  %8.1f  %9.0f (%5.0f)  %6.1f\n", r,
                r * D, s[5], s[0], s[1], s[2], idle > 0 ? idle : 0, s[4], s[6], s[8], s[9], s[10], s[11], s[12]);
    }
    if (V > 1) pl_info("  (a row is a rank: its %d chunks together)\n", V);
    if (D > 1)
        pl_info("  (dp-wait: the replicas' gradient reduction not hidden behind the backward, per step; optim ms "
                "includes it; AdamW MB: m and v on one rank)\n");
    for (int r = 0; D > 1 && r < P; r++) {
        const double *s = br->stage_stats + BENCH_NSTAT * r;
        pl_info("  stage %d: %.1f MB of gradients per step still reducing when the backward ended%s", r, s[13],
                br->zero ? "" : "\n");
        if (br->zero) pl_info("; ZeRO-1 parameter all-gather %.2f ms per step\n", s[14]);
    }
    for (int r = 0; br->Tp > 1 && r < P; r++) {
        const double *s = br->stage_stats + BENCH_NSTAT * r;
        pl_info("  stage %d: TP all-reduce %.2f ms per step, %.1f %% of the step (T=%d; TP rank 0's)\n", r, s[15],
                s[3] > 0 ? 100 * s[15] / s[3] : 0.0, br->Tp);
    }
    for (int r = 0; br->moe && r < P; r++) {
        const double *s = br->stage_stats + BENCH_NSTAT * r;
        pl_info("  stage %d: EP all-to-all %.2f ms per step (E=%d), exposed %.2f ms (%.1f %% of the step); tokens "
                "per expert max/mean %.3f, dropped %.1f per step\n", r, s[16], br->ep > 1 ? br->ep : 1, s[17],
                s[3] > 0 ? 100 * s[17] / s[3] : 0.0, s[18], s[19]);
    }
    for (int r = 0; br->Cp > 1 && r < P; r++) {
        const double *s = br->stage_stats + BENCH_NSTAT * r;
        pl_info("  stage %d: CP attention %.2f ms per step, of it %.2f ms waiting in the K/V exchanges (%.1f %% of the "
                "step, not overlapped; C=%d; CP rank 0's)\n", r, s[21], s[20], s[3] > 0 ? 100 * s[20] / s[3] : 0.0,
                br->Cp);
    }
}

/* The results as one JSON object. */
static void bench_json(FILE *f, const bench_result *br, const bench_figures *g) {
    fprintf(f, "{\"stages_count\":%d,\"schedule\":\"%s\",\"microbatches\":%d,\"batch\":%d,\"seq_len\":%d,"
               "\"steps\":%d,\"tokens_per_s\":%.3f,\"step_ms\":{\"min\":%.3f,\"median\":%.3f,\"max\":%.3f},"
               "\"tflops\":%.6f,\"mfu\":%.6f,\"peak_gflops\":%.3f,\"flops_per_token\":%.6g,"
               "\"bubble_measured\":%.6f,\"bubble_theoretical\":%.6f,\"blas_kernel\":\"%s\",\"stages\":[",
            br->P, br->schedule, br->M, br->B, br->T, br->nsteps, g->tokens_per_s, 1e3 * g->mn, 1e3 * g->med,
            1e3 * g->mx, g->tflops, g->mfu, g->peak, br->flops_per_token, g->bubble, br->bubble_theoretical,
            blas_kernel());
    for (int r = 0; r < br->P; r++) {
        const double *s = br->stage_stats + BENCH_NSTAT * r;
        double idle = s[3] - s[0] - s[1] - s[2];
        fprintf(f, "%s{\"rank\":%d,\"blocks\":%d,\"compute_ms\":%.3f,\"wait_ms\":%.3f,\"optimizer_ms\":%.3f,"
                   "\"idle_ms\":%.3f,\"peak_rss_mb\":%.1f,\"sgemm_gflops\":%.2f,\"threads\":%d,"
                   "\"dp_wait_ms\":%.3f,\"optimizer_state_mb\":%.3f,\"inflight_peak\":%d,"
                   "\"inflight_bound\":%d,\"act_mb_peak\":%.3f,\"dp_pending_mb\":%.3f,\"zero_gather_ms\":%.3f,"
                   "\"tp_allreduce_ms\":%.3f,\"tp_allreduce_share\":%.6f,\"ep_alltoall_ms\":%.3f,"
                   "\"ep_alltoall_exposed_ms\":%.3f,\"moe_load_max_mean\":%.6f,\"moe_dropped\":%.3f,"
                   "\"cp_exchange_ms\":%.3f,\"cp_attention_ms\":%.3f}",
                r ? "," : "", r * g->D, (int)s[5], s[0], s[1], s[2], idle > 0 ? idle : 0, s[4], s[6], (int)s[7],
                s[8], s[9], (int)s[10], (int)s[11], s[12], s[13], s[14], s[15], s[3] > 0 ? s[15] / s[3] : 0.0,
                s[16], s[17], s[18], s[19], s[20], s[21]);
    }
    fprintf(f, "],\"dp\":%d,\"zero\":%d,\"chunks_per_rank\":%d,\"tp\":%d,\"ep\":%d,\"cp\":%d", g->D, br->zero, g->V,
            br->Tp > 1 ? br->Tp : 1, br->ep > 1 ? br->ep : 1, br->Cp > 1 ? br->Cp : 1);
    fprintf(f, "%s%s}\n", br->extra_json ? "," : "", br->extra_json ? br->extra_json : "");
}

/* The results as a CSV header and one row (the per-rank figures as their maxima). */
static void bench_csv(FILE *f, const bench_result *br, const bench_figures *g) {
    fprintf(f, "schedule,stages,microbatches,batch,seq_len,tokens_per_s,step_ms_min,step_ms_median,step_ms_max,"
               "tflops,mfu,peak_gflops,bubble_measured,bubble_theoretical,dp,zero,dp_wait_ms_max,optimizer_state_mb_max,"
               "chunks_per_rank,act_mb_peak_max,tp,tp_allreduce_ms_max\n");
    double dw = 0, om = 0, am = 0, tw = 0;
    for (int r = 0; r < br->P; r++) {
        const double *s = br->stage_stats + BENCH_NSTAT * r;
        if (s[8] > dw) dw = s[8];
        if (s[9] > om) om = s[9];
        if (s[12] > am) am = s[12];
        if (s[15] > tw) tw = s[15];
    }
    fprintf(f, "%s,%d,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,%.6f,%.6f,%.3f,%.6f,%.6f,%d,%d,%.3f,%.3f,%d,%.3f,%d,%.3f\n", br->schedule,
            br->P, br->M, br->B, br->T, g->tokens_per_s, 1e3 * g->mn, 1e3 * g->med, 1e3 * g->mx, g->tflops, g->mfu,
            g->peak, g->bubble, br->bubble_theoretical, g->D, br->zero, dw, om, g->V, am, br->Tp > 1 ? br->Tp : 1, tw);
}

/* Write one output file of the report through write (flag names it in messages). */
static int bench_write(const char *path, const char *flag, const bench_result *br, const bench_figures *g,
                       void (*write)(FILE *, const bench_result *, const bench_figures *)) {
    FILE *f = NULL;
    char e[1024];
    if (pl_open_output(path, flag, &f, e, sizeof e) != PL_OK) {
        pl_error("%s", e);
        return PL_EIO;
    }
    write(f, br, g);
    if (pl_close_output(f, path, flag, e, sizeof e) != PL_OK) {
        pl_error("%s", e);
        return PL_EIO;
    }
    return PL_OK;
}

int bench_report(const bench_result *br, const char *json, const char *csv, bench_summary *out) {
    bench_figures g;
    bench_derive(br, &g);
    bench_print(br, &g);
    if (out) *out = (bench_summary){1e3 * g.med, 1e3 * g.mn, 1e3 * g.mx, g.tokens_per_s, g.mfu, g.bubble};
    int rc = 0;
    if (json && json[0] && bench_write(json, "--json", br, &g, bench_json) != PL_OK) rc = PL_EIO;
    if (csv && csv[0] && bench_write(csv, "--csv", br, &g, bench_csv) != PL_OK) rc = PL_EIO;
    return rc;
}

/* One backend/precision line of --peak: "oneDNN fp32 matmul 2048^3: ..." or "not available". */
static void peak_matmul(const char *label, int prec, int threads, double *g1, double *ga, char *kernel, size_t klen) {
    *g1 = bench_matmul_gflops("onednn", prec, 2048, 1, 1.0);
    snprintf(kernel, klen, "%s", bench_matmul_info());
    if (*g1 < 0) {
        *ga = -1;
        pl_info("oneDNN %s matmul 2048^3: not available: %s\n", label, kernel);
        return;
    }
    *ga = threads == 1 ? *g1 : bench_matmul_gflops("onednn", prec, 2048, threads, 1.0);
    pl_info("oneDNN %s matmul 2048^3: 1 thread %.1f GFLOP/s, %d threads %.1f GFLOP/s (%s)\n", label, *g1, threads,
            *ga, kernel);
}

/* A JSON number, or null for an unavailable measurement. */
static void json_num(FILE *f, const char *key, double v) {
    if (v < 0) fprintf(f, ",\"%s\":null", key);
    else fprintf(f, ",\"%s\":%.3f", key, v);
}
/* A JSON string with quotes and backslashes escaped (kernel names, reasons). */
static void json_str(FILE *f, const char *key, const char *v) {
    fprintf(f, ",\"%s\":\"", key);
    for (; *v; v++) {
        if (*v == '"' || *v == '\\') fputc('\\', f);
        if ((unsigned char)*v >= 0x20) fputc(*v, f);
    }
    fputc('"', f);
}

int bench_peak_main(int argc, char **argv, int first, MPI_Comm comm) {
    int rank;
    const char *json = NULL;
    int threads = 0;
    MPI_Comm_rank(comm, &rank);
    for (int i = first; i < argc; i++) {
        if (strcmp(argv[i], "--peak") == 0) continue;
        if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) json = argv[++i];
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0) threads = atoi(argv[++i]);
        else {
            if (rank == 0) pl_error("bench --peak: unexpected argument '%s' (only --json FILE, --threads N)", argv[i]);
            return 2;
        }
    }
    if (rank != 0) return 0;
    /* --threads N: the "all threads" figures use N threads instead of every core */
    int cores = threads > 0 ? threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    double g1 = bench_sgemm_gflops(2048, 1, 1.0);
    double ga = cores == 1 ? g1 : bench_sgemm_gflops(2048, cores, 1.0);
    pl_info("cblas_sgemm 2048^3: 1 thread %.1f GFLOP/s, %d threads %.1f GFLOP/s (OpenBLAS kernel %s: %s)\n", g1,
            cores, ga, blas_kernel(), blas_kernel_origin());
    /* the oneDNN backend's matmul_fwd, fp32 and bf16 (bf16 time includes the input conversion) */
    double d1 = -1, da = -1, b1 = -1, ba = -1;
    char dk[512], bk[512];
    peak_matmul("fp32", PL_PREC_FP32, cores, &d1, &da, dk, sizeof dk);
    peak_matmul("bf16", PL_PREC_BF16, cores, &b1, &ba, bk, sizeof bk);
    backend_cpu.set_threads(cores);
    if (json) {
        FILE *f = NULL;
        char e[1024];
        if (pl_open_output(json, "--json", &f, e, sizeof e) != PL_OK) { pl_error("%s", e); return 1; }
        fprintf(f, "{\"peak_gflops_1\":%.3f,\"peak_gflops_all\":%.3f,\"threads\":%d,\"n\":2048,\"blas_kernel\":\"%s\"",
                g1, ga, cores, blas_kernel());
        json_num(f, "onednn_fp32_gflops", d1);
        json_num(f, "onednn_fp32_gflops_all", da);
        json_str(f, d1 < 0 ? "onednn_fp32_unavailable" : "onednn_fp32_kernel", dk);
        json_num(f, "bf16_gflops", b1);
        json_num(f, "bf16_gflops_all", ba);
        json_str(f, b1 < 0 ? "bf16_unavailable" : "bf16_kernel", bk);
        fprintf(f, "}\n");
        if (pl_close_output(f, json, "--json", e, sizeof e) != PL_OK) { pl_error("%s", e); return 1; }
    }
    return 0;
}
