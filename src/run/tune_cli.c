/*
 * tune_cli.c — `pipelm tune`: the tuner's command line, its table, its JSON, and --verify
 * (the top K benchmarked in this job, measured beside predicted). See src/pipeline/tune.h.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util/args.h"
#include "util/common.h"
#include "cli/config.h"
#include "util/files.h"
#include "run/train.h"
#include "pipeline/tune.h"

typedef struct {
    const char *costs, *json;
    const char *costs_mode[TUNE_NMODES]; /* --costs-selective, --costs-full ([TUNE_NONE] unused) */
    int top, verify;
    int verify_steps, verify_warmup; /* --verify's timed and warm-up steps per candidate */
    int measure;               /* --measure M0: the costs measured here first, M0 micro-batches */
    char measured[TUNE_NMODES][128]; /* the files --measure wrote (none, -, full) */
    tune_query q;
    char extra[2048];          /* the train options after --, for every command */
    model_config cfg;          /* their model, when they give one (q.cfg points here) */
} tune_args;

/* `pipelm tune --help`. */
static void tune_usage(void) {
    printf("usage: [mpiexec -n P] pipelm tune --costs FILE [--stages P] [--batch B] [--mem-cap-gb X]\n"
           "       [--ranks W] [--max-microbatches M] [--costs-microbatches M0] [--n-layer L] [--top N] [--json FILE]\n"
           "       [--costs-selective FILE] [--costs-full FILE] [--measure M0] [--verify K]\n"
           "       [--verify-steps N] [--verify-warmup N] [-- TRAIN OPTIONS]\n"
           "Searches schedule x micro-batches M (the divisors of B) x chunks per rank V for P ranks with\n"
           "the measured costs of FILE (pipelm bench --costs-out) and prints the --top (5) fastest whose\n"
           "activations fit --mem-cap-gb per rank (default: this node's memory / P), with the predicted\n"
           "step, bubble, peak activation memory and the pipelm train command of each. --costs-microbatches\n"
           "M0 (required): the M the costs were measured with at batch B (each action is scaled by M0 / M).\n"
           "--n-layer L: the model's blocks (default: the TRAIN OPTIONS' model, if any): layouts with more\n"
           "than L + 2 stages (P x V) cannot be split and are left out.\n"
           "--costs-selective / --costs-full FILE: costs measured with bench --recompute selective / full (same\n"
           "layout, M0 and batch): the recompute modes are searched too, for every stage at once and per stage\n"
           "(the stage holding the most activations on the fullest rank first) until the cap is met.\n"
           "With a model in the TRAIN OPTIONS and a costs file that names each stage's blocks (N), the split\n"
           "that rebalances the measured speeds (seconds per FLOP of each stage) is searched too (--split).\n"
           "--ranks W: search every D x P = W too (--dp D; needs the model and a costs file with N): the\n"
           "micro-batches scaled to batch / (D M) sequences, another P re-split at the stages' mean measured\n"
           "speed, the gradient all-reduce as a ring over D at the measured bandwidth, none of it hidden;\n"
           "and every T x D x P = W with --tp T (the T that divide the model's heads and MLP): from a tp 1 costs\n"
           "file each action / T plus 2 TP all-reduces a block, the optimizer step / T, the activations\n"
           "(10 + 24/T) / 34 of the measured (a costs file measured at --tp T0 > 1 searches T0 only).\n"
           "--json FILE writes every candidate, best first (command, predicted_ms, bubble, peak_mem_mb, ..., dp, tp).\n"
           "--measure M0 (under mpiexec -n P, instead of --costs): measures the costs here first, pipelm bench\n"
           "with the TRAIN OPTIONS, --batch B, 1f1b and M0 micro-batches, 5 steps after 3, without and with --recompute\n"
           "full (so both are searched), then searches.\n"
           "--verify K (under mpiexec -n P) benchmarks the top K here, --verify-steps (3) timed steps after\n"
           "--verify-warmup (1) each, with the TRAIN OPTIONS after --, and prints measured (the median step)\n"
           "beside predicted; give more steps where a 5%% difference matters on a noisy machine.\n");
}

/* An int option value >= lo, else -1. */
static int int_arg(const char *v, int lo) {
    char *end;
    long x = strtol(v, &end, 10);
    return *end || x < lo || x > (1 << 24) ? -1 : (int)x;
}

/* Split the train options in buf (modified) into argv after "pipelm bench"; their count. */
static int train_argv(char *buf, char **argv, int max) {
    char *save = NULL;
    int argc = 0;
    argv[argc++] = "pipelm", argv[argc++] = "bench";
    for (char *w = strtok_r(buf, " ", &save); w && argc < max; w = strtok_r(NULL, " ", &save)) argv[argc++] = w;
    return argc;
}

/* The model the train options extra describe (preset, its flags, a config file) into *cfg and
 * its sequence length *T; 0 where they do not say (a model file's --init) or do not parse
 * (--verify reports that). */
static int train_options_model(const char *extra, model_config *cfg, int *T) {
    char buf[2048], err[1024], *argv[128];
    snprintf(buf, sizeof buf, "%s", extra);
    int argc = train_argv(buf, argv, 127);
    pl_options o;
    config_defaults(&o);
    if (config_parse(&o, argc, argv, 2, CFG_CMD_TUNE, err, sizeof err) != PL_OK || o.init[0] ||
        config_model(&o, config_vocab(&o), cfg, err, sizeof err) != PL_OK)
        return 0;
    *T = o.seq_len > 0 ? o.seq_len : o.max_seq_len;
    return 1;
}

/* tune's own options, in tune_parse's order */
static const char *const tune_opt_names[] = {"costs", "costs-selective", "costs-full", "json", "stages", "ranks",
    "batch", "top", "verify", "verify-steps", "verify-warmup", "measure", "max-microbatches", "costs-microbatches",
    "n-layer", "mem-cap-gb"};
#define NTUNE_OPTS (int)(sizeof tune_opt_names / sizeof tune_opt_names[0])

/* Store option k's value v; 1 if it is not a valid value. */
static int tune_set(tune_args *a, int k, const char *v, double *gb) {
    switch (k) {
    case 0: a->costs = v; return 0;
    case 1: a->costs_mode[TUNE_SELECTIVE] = v; return 0;
    case 2: a->costs_mode[TUNE_FULL] = v; return 0;
    case 3: a->json = v; return 0;
    case 4: return (a->q.P = int_arg(v, 1)) < 0;
    case 5: return (a->q.ranks = int_arg(v, 1)) < 0;
    case 6: return (a->q.batch = int_arg(v, 1)) < 0;
    case 7: return (a->top = int_arg(v, 1)) < 0;
    case 8: return (a->verify = int_arg(v, 0)) < 0;
    case 9: return (a->verify_steps = int_arg(v, 1)) < 0;
    case 10: return (a->verify_warmup = int_arg(v, 0)) < 0;
    case 11: return (a->measure = a->q.costs_M = int_arg(v, 1)) < 0;
    case 12: return (a->q.max_M = int_arg(v, 1)) < 0;
    case 13: return (a->q.costs_M = int_arg(v, 1)) < 0;
    case 14: return (a->q.n_layer = int_arg(v, 1)) < 0;
    default: return !((*gb = strtod(v, NULL)) > 0);
    }
}

/* Parse the command line; 0 to go on, else the exit status (+1: --help). */
static int tune_parse(int argc, char **argv, int first, int world, tune_args *a) {
    memset(a, 0, sizeof *a);
    a->top = 5, a->verify_steps = 3, a->verify_warmup = 1, a->q.P = world > 1 ? world : 0, a->q.batch = 16, a->q.mem_cap_mb = -1;
    double gb = -1;
    char err[512];
    if (args_check_names(argc, argv, first, tune_opt_names, NTUNE_OPTS, "tune", err, sizeof err) != PL_OK) {
        pl_error("%s (train options go after --)", err);
        return 3;
    }
    for (int i = first; i < argc; i++) {
        if (!strcmp(argv[i], "--")) {
            for (int j = i + 1, off = 0; j < argc && off < (int)sizeof a->extra - 2; j++)
                off += snprintf(a->extra + off, sizeof a->extra - off, "%s%s", off ? " " : "", argv[j]);
            break;
        }
        int k;
        const char *v;
        if (args_next(argc, argv, &i, tune_opt_names, NTUNE_OPTS, "tune", &k, &v, err, sizeof err) != PL_OK) {
            pl_error("%s", err);
            return 3;
        }
        if (k == -1) { if (pl_rank == 0) tune_usage(); return 1; }
        if (tune_set(a, k, v, &gb)) { pl_error("tune: --%s %s: not a valid value", tune_opt_names[k], v); return 3; }
    }
    if (!a->costs && !a->measure) {
        pl_error("tune: --costs FILE (pipelm bench --costs-out writes one) or --measure M0 is required");
        return 3;
    }
    if (a->costs && a->measure) { pl_error("tune: --costs and --measure: give one of them"); return 3; }
    if (a->q.costs_M < 1) {
        pl_error("tune: --costs-microbatches M0 is required: the micro-batch count the costs were measured with "
                 "(with --batch, it sizes every action for the other M)");
        return 3;
    }
    if (a->q.ranks > 0 && a->q.P > 0 && a->q.P != a->q.ranks) {
        pl_error("tune: --ranks %d searches every D x P = %d: leave --stages out", a->q.ranks, a->q.ranks);
        return 3;
    }
    if (a->q.ranks > 0) a->q.P = a->q.ranks;
    if (a->q.P < 1) { pl_error("tune: --stages P (or --ranks W) is required outside mpiexec -n P"); return 3; }
    if ((a->verify || a->measure) && a->q.P != world) {
        pl_error("tune: --%s runs here: start it with mpiexec -n %d (this job has %d)", a->verify ? "verify" : "measure",
                 a->q.P, world);
        return 3;
    }
    if (a->extra[0] && train_options_model(a->extra, &a->cfg, &a->q.T)) {
        a->q.cfg = &a->cfg;
        if (!a->q.n_layer) a->q.n_layer = a->cfg.L;
    }
    long pages = sysconf(_SC_PHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
    a->q.mem_cap_mb = gb > 0 ? gb * 1024.0 : pages > 0 && ps > 0 ? (double)pages * ps / 1048576.0 / a->q.P : -1;
    return 0;
}

/* Read the costs file on rank 0 and parse it on every rank (the text broadcast: the file
 * need not be on every node); PL_OK or the failure, reported by rank 0, on every rank. */
static int read_costs(const char *path, sched_costs *c, MPI_Comm comm) {
    char err[1024] = "";
    long len = -1;
    char *text = NULL;
    if (pl_rank == 0) {
        FILE *f = NULL;
        if (pl_open_input(path, "costs file", 1 << 24, &f, err, sizeof err) == PL_OK) {
            text = malloc((1 << 24) + 1);
            len = text ? (long)fread(text, 1, 1 << 24, f) : -1;
            if (text && ferror(f)) len = -1, snprintf(err, sizeof err, "costs file %s: cannot read it", path);
            fclose(f);
        }
    }
    MPI_Bcast(&len, 1, MPI_LONG, 0, comm);
    if (len < 0) {
        if (pl_rank == 0) pl_error("tune: %s", err[0] ? err : "out of memory");
        free(text);
        return PL_EIO;
    }
    if (pl_rank != 0) text = malloc((size_t)len + 1);
    int have = text != NULL, all = 0;
    MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, comm);
    if (!all) { if (pl_rank == 0) pl_error("tune: out of memory"); free(text); return PL_ENOMEM; }
    MPI_Bcast(text, (int)len, MPI_CHAR, 0, comm);
    text[len] = 0;
    FILE *f = fmemopen(text, (size_t)len + 1, "r");
    int rc = f ? sched_costs_read(f, c, err, sizeof err) : PL_ENOMEM;
    if (f) fclose(f);
    free(text);
    if (rc != PL_OK && pl_rank == 0) pl_error("tune: %s: %s", path, f ? err : "out of memory");
    return rc;
}

/* The table of the best n. */
static void print_best(const tune_args *a, const tune_cand *t, int n, int tried, double secs) {
    pl_info("tune: %d layouts tried for P=%d, batch %d in %.2f s; %d fit %.0f MB of activations per rank; the best %d:\n",
            tried, a->q.P, a->q.batch, secs, n, a->q.mem_cap_mb, n < a->top ? n : a->top);
    pl_info("  %4s  %12s  %7s  %12s  %s\n", "#", "predicted ms", "bubble", "peak act MB", "command");
    for (int i = 0; i < n && i < a->top; i++) {
        char cmd[1024];
        tune_command(&t[i], cmd, sizeof cmd);
        pl_info("  %4d  %12.3f  %6.1f%%  %12.2f  mpiexec -n %d pipelm train %s%s%s\n", i + 1, 1e3 * t[i].step_s,
                100 * t[i].bubble, t[i].peak_mem_mb, a->q.ranks > 0 ? a->q.ranks : a->q.P * t[i].Tp * t[i].D * (t[i].Cp > 1 ? t[i].Cp : 1), cmd,
                a->extra[0] ? " " : "", a->extra);
    }
}

/* A file name of this job's, the same on every rank (rank 0's pid): TMPDIR/pipelm-tune-ID-what. */
static void job_file(const char *what, MPI_Comm comm, char *buf, size_t len) {
    long id = (long)getpid();
    MPI_Bcast(&id, 1, MPI_LONG, 0, comm);
    const char *dir = getenv("TMPDIR");
    snprintf(buf, len, "%s/pipelm-tune-%ld-%s", dir && dir[0] ? dir : "/tmp", id, what);
}

/* Run `pipelm bench` here (every rank: the same arguments) with the layout arguments, --batch,
 * steps timed steps after warmup more, the train options and more (NULL or more arguments,
 * such as --costs-out FILE); *ms the median step, or -1. */
static int bench_here(const tune_args *a, const char *layout, int steps, int warmup, const char *more, MPI_Comm comm,
                      double *ms) {
    char cmd[3200];
    snprintf(cmd, sizeof cmd, "%s --batch %d --steps %d --warmup %d %s %s", layout, a->q.batch, steps, warmup,
             a->extra, more ? more : "");
    char *argv[160];
    int argc = train_argv(cmd, argv, 159);
    pl_options o;
    config_defaults(&o);
    o.hp.total_steps = steps, o.warmup = warmup, o.log_every = 1000000, o.progress = 0;
    char err[1024];
    *ms = -1;
    if (config_parse(&o, argc, argv, 2, CFG_CMD_TUNE, err, sizeof err) != PL_OK || config_validate(&o, err, sizeof err) != PL_OK) {
        if (pl_rank == 0) pl_error("tune: pipelm bench %s: %s", layout, err);
        return PL_EINVAL;
    }
    o.bench = 1;
    bench_summary sum = {-1, -1, -1, 0, 0, 0};
    int agreed = 1, rc = train_bench(&o, comm, &agreed, &sum);
    if (rc == PL_OK && pl_rank == 0) *ms = sum.step_ms_median;
    return rc;
}

/* Benchmark candidate t here; *ms the median step, or -1. */
static int verify_one(const tune_args *a, const tune_cand *t, MPI_Comm comm, double *ms) {
    char cmd[1024];
    tune_command(t, cmd, sizeof cmd);
    return bench_here(a, cmd, a->verify_steps, a->verify_warmup, NULL, comm, ms);
}

/* --measure: the costs of 1f1b with M0 micro-batches, without and with --recompute full, into
 * a->measured (a->costs and a->costs_mode[TUNE_FULL] point there). */
static int measure_costs(tune_args *a, MPI_Comm comm) {
    static const int modes[2] = {TUNE_NONE, TUNE_FULL};
    for (int k = 0; k < 2; k++) {
        int m = modes[k];
        char layout[128], more[300];
        double ms;
        job_file(m == TUNE_NONE ? "costs-none.txt" : "costs-full.txt", comm, a->measured[m], sizeof a->measured[m]);
        snprintf(layout, sizeof layout, "--schedule 1f1b --microbatches %d%s", a->measure,
                 m == TUNE_FULL ? " --recompute full" : "");
        snprintf(more, sizeof more, "--costs-out %s", a->measured[m]);
        PL_TRY(bench_here(a, layout, 5, 3, more, comm, &ms)); /* 3 warm-up steps: the first runs are cold */
        if (pl_rank == 0) pl_info("tune --measure: %s: %.3f ms per step, costs in %s\n", layout, ms, a->measured[m]);
    }
    a->costs = a->measured[TUNE_NONE], a->costs_mode[TUNE_FULL] = a->measured[TUNE_FULL];
    return PL_OK;
}

/* `pipelm tune` (tune.h). */
int tune_main(int argc, char **argv, int first, MPI_Comm comm) {
    int world;
    MPI_Comm_size(comm, &world);
    tune_args a;
    int x = tune_parse(argc, argv, first, world, &a);
    if (x) return x == 1 ? 0 : 2;
    char err[1024];
    pl_io in[] = {{"--costs", a.costs}, {"--costs-selective", a.costs_mode[TUNE_SELECTIVE]},
                  {"--costs-full", a.costs_mode[TUNE_FULL]}};
    pl_io out[] = {{"--json", a.json}};
    if (pl_check_io(in, 3, out, 1, err, sizeof err) != PL_OK) {
        if (pl_rank == 0) pl_error("tune: %s", err);
        return 2;
    }
    sched_costs cm[TUNE_NMODES];
    const sched_costs *c[TUNE_NMODES] = {NULL, NULL, NULL};
    int rc = a.measure ? measure_costs(&a, comm) : PL_OK;
    for (int m = 0; m < TUNE_NMODES && rc == PL_OK; m++) {
        const char *path = m == TUNE_NONE ? a.costs : a.costs_mode[m];
        if (path && (rc = read_costs(path, &cm[m], comm)) == PL_OK) c[m] = &cm[m];
    }
    for (int m = 0; m < TUNE_NMODES; m++)
        if (a.measured[m][0] && pl_rank == 0) unlink(a.measured[m]);
    tune_cand *t = NULL;
    int n = 0, tried = 0;
    double t0 = pl_now();
    if (rc == PL_OK) rc = tune_search(&a.q, c, &t, &n, &tried, err, sizeof err);
    else snprintf(err, sizeof err, "tune: a costs file could not be read (above)");
    for (int m = 0; m < TUNE_NMODES; m++)
        if (c[m]) sched_costs_free(&cm[m]);
    if (rc != PL_OK) { if (pl_rank == 0) pl_error("%s", err); free(t); return rc == PL_EINVAL ? 2 : 1; }
    if (pl_rank == 0) print_best(&a, t, n, tried, pl_now() - t0);
    if (a.json && pl_rank == 0) {
        FILE *f = NULL;
        if (pl_open_output(a.json, "--json", &f, err, sizeof err) != PL_OK) { pl_error("tune: %s", err); rc = PL_EIO; }
        else {
            tune_write_json(f, &a.q, t, n, a.extra);
            if (pl_close_output(f, a.json, "--json", err, sizeof err) != PL_OK) { pl_error("tune: %s", err); rc = PL_EIO; }
        }
    }
    for (int i = 0; rc == PL_OK && i < a.verify && i < n; i++) {
        double ms;
        rc = verify_one(&a, &t[i], comm, &ms);
        char cmd[1024];
        tune_command(&t[i], cmd, sizeof cmd);
        if (rc == PL_OK && pl_rank == 0)
            pl_info("verify %d: %s: measured %.3f ms per step, predicted %.3f ms (%+.1f%%)\n", i + 1, cmd, ms,
                    1e3 * t[i].step_s, ms > 0 ? 100.0 * (ms / (1e3 * t[i].step_s) - 1.0) : 0.0);
    }
    free(t);
    return rc == PL_OK ? 0 : rc == PL_EINVAL ? 2 : 1; /* a bad option after -- is a usage error */
}
