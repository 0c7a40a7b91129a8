/*
 * pipelm.c — subcommand dispatch: the library entry point behind `main`.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "run/bench.h"
#include "ckpt/ckpt.h"
#include "util/common.h"
#include "cli/config.h"
#include "run/eval.h"
#include "run/generate.h"
#include "run/tokenize.h"
#include "util/files.h"
#include "cli/pipelm.h"
#include "pipeline/sched.h"
#include "pipeline/sched_cost.h"
#include "run/train.h"
#include "pipeline/tune.h"

static void usage(FILE *out) {
    fprintf(out,
            "pipelm %s — pipeline-parallel training of GPT-2 and Llama 3 models over MPI\n\n"
            "usage: mpiexec -n P pipelm <command> [options]\n\n"
            "commands:\n"
            "  train      train a GPT-2 or Llama 3 model, one pipeline stage per MPI rank\n"
            "  eval       the loss and perplexity of a model file or checkpoint on a data set, pipelined\n"
            "  generate   sample from a model through the pipeline stages, with a KV cache per stage\n"
            "  tokenize   text or JSON-lines corpora to llm.c token shards with a BPE tokenizer, over R ranks\n"
            "  schedule   print a pipeline schedule as a grid (and write torch CSV)\n"
            "  bench      measure performance (--peak: sgemm GFLOP/s)\n"
            "  tune       the fastest schedule x micro-batches x chunks for measured costs (bench --costs-out)\n"
            "  convert    llm.c model file <-> pipelm HDF5 checkpoint (pipelm convert IN OUT)\n"
            "  inspect    print a checkpoint's metadata and tensors, verify every checksum\n\n"
            "  pipelm <command> --help   options of a command\n"
            "  pipelm --version\n",
            PACKAGE_VERSION);
}

/* Exit statuses and stop signals, shared by train and bench help. */
static void exit_help(FILE *out) {
    fprintf(out, "\nstopping: the first SIGTERM, SIGINT or SIGUSR1 (to one rank or all) finishes the step,\n"
                 "saves a checkpoint with --ckpt-dir and exits 75 (one that arrives before step 1 ends the run\n"
                 "there, nothing trained or saved, also 75); a second SIGTERM/SIGINT ends at once.\n"
                 "A rank that waits longer than --watchdog seconds for a peer names what it waits for\n"
                 "and aborts the job.\n\n"
                 "exit status:\n"
                 "  0        done\n"
                 "  1        a failure: every rank ends; the message names the rank and the cause\n"
                 "           (a bad file, a failed or killed peer, the watchdog, a NaN or divergence,\n"
                 "           a --ckpt-dir locked by another job: DIR/.lock names its host and pid)\n"
                 "  2        bad command line or settings\n"
                 "  75       stopped by a signal at a step boundary (checkpoint saved with --ckpt-dir)\n"
                 "  128+N    a second signal N ended the rank at once (130: SIGINT, 143: SIGTERM)\n");
}

static void train_usage(FILE *out) {
    fprintf(out, "usage: mpiexec -n P pipelm train [options]\n\n"
                 "Trains GPT-2 or Llama 3 (--arch; llm.c's definitions) split into P pipeline stages, one per rank.\n"
                 "Settings come from the preset, then --config FILE, then the command line.\n\noptions:\n");
    config_print_help(out, 0);
    exit_help(out);
}

static void bench_usage(FILE *out) {
    fprintf(out, "usage: mpiexec -n P pipelm bench [train options] [--warmup N] [--steps N] [--json FILE] [--csv FILE]\n"
                 "       pipelm bench --peak [--json FILE]\n"
                 "       pipelm bench --generate [generate options] [--json FILE]   (`pipelm bench --generate --help`)\n\n"
                 "Runs --warmup untimed steps then --steps timed ones (defaults 2 and 5) and reports\n"
                 "tokens/s, step time, model TFLOP/s (6N + 6LCT per token), MFU against the measured\n"
                 "sgemm peak of every rank, measured and theoretical bubble, and per-stage compute,\n"
                 "MPI wait, idle time and peak memory. --peak measures the sgemm and oneDNN fp32/bf16 matmul peaks.\n\noptions:\n");
    config_print_help(out, 1);
    exit_help(out);
}

/* The summary lines of a schedule too big for a grid: unit-cost makespan, bubble, peaks. */
static void print_schedule_summary(const sched *s) {
    sched_sim sim;
    char err[512];
    if (sched_simulate(s, &sim, err, sizeof err) != PL_OK) return;
    int peak = 0;
    for (int r = 0; r < s->P; r++) {
        int k = sched_max_inflight(s, r);
        peak = k > peak ? k : peak;
    }
    if (s->V > 1)
        pl_info("schedule %s: P=%d ranks x V=%d chunks = %d stages, M=%d micro-batches, makespan %d units "
                "(F=%d, B=%d, I=%d, W=%d per stage, comm=0)\nbubble: %.2f%% (interleaved theory (P-1)/(V*M+P-1) = "
                "%.2f%%); max in-flight micro-batches on any rank, all its chunks: %d (rank 0 %d, last %d)\n",
                s->name, s->P, s->V, s->P * s->V, s->M, sim.makespan, SCHED_COST_F, SCHED_COST_B, SCHED_COST_I,
                SCHED_COST_W, 100.0 * sim.bubble, 100.0 * (s->P - 1) / ((double)s->V * s->M + s->P - 1), peak,
                sched_max_inflight(s, 0), sched_max_inflight(s, s->P - 1));
    else
        pl_info("schedule %s: P=%d stages, M=%d micro-batches, makespan %d units (F=%d, B=%d, I=%d, W=%d, comm=0)\n"
                "bubble: %.2f%%; max in-flight micro-batches on any stage: %d (first stage %d, last %d)\n",
                s->name, s->P, s->M, sim.makespan, SCHED_COST_F, SCHED_COST_B, SCHED_COST_I, SCHED_COST_W,
                100.0 * sim.bubble, peak, sched_max_inflight(s, 0), sched_max_inflight(s, s->P - 1));
    sched_sim_free(&sim);
}

/* Predict the step with the measured costs in `path` (PL_OK, or the failure, reported). */
static int predict_with_costs(const sched *s, const char *path, int tp) {
    char err[1024];
    FILE *f = NULL;
    if (pl_open_input(path, "costs file", 1 << 24, &f, err, sizeof err) != PL_OK) {
        pl_error("schedule: %s", err);
        return PL_EIO;
    }
    sched_costs c;
    int rc = sched_costs_read(f, &c, err, sizeof err);
    fclose(f);
    if (rc != PL_OK) { pl_error("schedule: %s: %s", path, err); return rc; }
    double ar = 0.0;
    if ((rc = sched_costs_tp(&c, tp, &ar, err, sizeof err)) != PL_OK) {
        pl_error("schedule: %s: %s", path, err);
        sched_costs_free(&c);
        return rc;
    }
    if (ar > 0 || tp > 1)
        pl_info("--tp %d: F, B, I, W divided by %d, each F and I with its stage's TP all-reduces at %.1f us each "
                "(%.0f bytes)%s\n", tp, tp, 1e6 * ar, c.msg_bytes,
                c.bytes_per_s > 0 ? "" : "; the costs have no message bandwidth (one stage): all-reduces counted at 0");
    sched_pred pr;
    if ((rc = sched_predict(s, &c, &pr, err, sizeof err)) != PL_OK) {
        pl_error("schedule: %s: %s", path, err);
        sched_costs_free(&c);
        return rc;
    }
    pl_info("predicted from %s: step %.2f ms (pipeline %.2f ms + optimizer), bubble %.1f%% (message %.0f bytes: "
            "%.1f us)\n", path, 1e3 * pr.step_s, 1e3 * pr.makespan_s, 100.0 * pr.bubble, c.msg_bytes,
            1e6 * (c.latency_s + (c.bytes_per_s > 0 ? c.msg_bytes / c.bytes_per_s : 0)));
    for (int r = 0; r < s->P && r < 64; r++)
        if (pr.act_peak[r] > 0)
            pl_info("  rank %d: compute %.2f ms, waiting %.2f ms, in flight %d, activations %.1f MB\n", r,
                    1e3 * pr.busy_s[r], 1e3 * pr.wait_s[r], sched_max_inflight(s, r), pr.act_peak[r] / 1048576.0);
        else
            pl_info("  rank %d: compute %.2f ms, waiting %.2f ms, in flight %d\n", r, 1e3 * pr.busy_s[r],
                    1e3 * pr.wait_s[r], sched_max_inflight(s, r));
    sched_pred_free(&pr);
    sched_costs_free(&c);
    return PL_OK;
}

/* The schedule to show: read from --load (V = 0: as the file says), else built by name
   with V chunks per rank. 0, or the exit status. */
static int schedule_get(const char *in, const char *name, int P, int V, int M, double mem_gb, sched *s) {
    char err[1024];
    if (V < 0) {
        pl_error("schedule: --chunks-per-rank must be a positive integer");
        return 2;
    }
    if (!in && P > 0 && M > 0) { /* the build's memory, before any of it is taken */
        double need = sched_build_bytes(P, V > 0 ? V : 1, M) / 1073741824.0;
        if (need > mem_gb) {
            pl_error("schedule: P=%d x V=%d x M=%d needs about %.1f GiB to build and simulate (%.0f bytes per "
                     "stage and micro-batch), more than the --mem-limit-gb %.1f GiB allowed; give a larger "
                     "--mem-limit-gb to build it anyway", P, V > 0 ? V : 1, M, need, SCHED_BYTES_PER_PAIR, mem_gb);
            return 2;
        }
    }
    if (in) {
        FILE *f = NULL;
        if (pl_open_input(in, "schedule file", SCHED_CSV_MAX_BYTES, &f, err, sizeof err) != PL_OK) {
            pl_error("schedule: %s", err);
            return 1;
        }
        int rc = sched_read_csv(f, in, s, err, sizeof err);
        fclose(f);
        if (rc != PL_OK) { pl_error("schedule %s: %s", in, err); return 1; }
        if (V > 0 && s->V != V) {
            pl_error("schedule %s: the file has %d chunk(s) per rank, --chunks-per-rank says %d", in, s->V, V);
            sched_free(s);
            return 2;
        }
        /* --stages and --microbatches beside --load must say what the file holds */
        if ((P != 0 && P != s->P) || (M != 0 && M != s->M)) {
            pl_error("schedule %s: the file has %d ranks and %d micro-batches, but %s%s%d", in, s->P, s->M,
                     P != 0 && P != s->P ? "--stages is " : "--microbatches is ", "",
                     P != 0 && P != s->P ? P : M);
            sched_free(s);
            return 2;
        }
        return 0;
    }
    if (P <= 0 || M <= 0) {
        pl_error("schedule: --stages and --microbatches must be positive integers");
        return 2;
    }
    if (sched_build_chunks(name, P, V > 0 ? V : sched_default_chunks(name), M, s, err, sizeof err) != PL_OK) {
        pl_error("schedule: %s", err);
        return 2;
    }
    return 0;
}

/* The default --mem-limit-gb of `pipelm schedule`: half the machine's memory, at most 8 GiB. */
static double schedule_default_mem_gb(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    double half = pages > 0 && psize > 0 ? 0.5 * (double)pages * (double)psize / 1073741824.0 : 8.0;
    return half < 8.0 ? half : 8.0;
}

/* `pipelm schedule --help`. */
static void schedule_usage(void) {
    printf("usage: pipelm schedule --stages P --microbatches M [--schedule NAME] [--chunks-per-rank V]\n"
           "       [--csv OUT.csv] [--load IN.csv] [--costs FILE [--tp T]] [--grid auto|yes|no]\n"
           "Prints the per-rank action grid, the bubble fraction and the in-flight micro-batches;\n"
           "--csv writes torch.distributed.pipelining's CSV form; --load reads and validates one.\n"
           "--chunks-per-rank V (alias --virtual-stages): each of the P ranks runs V model chunks, the\n"
           "model cut into P*V stages, stage s on rank s mod P (cells then read \"5F3\": stage 5's\n"
           "forward of micro-batch 3). Schedules and what they need of M (P ranks, V chunks):\n");
    const char *names[] = { "gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "looped-bfs", "interleaved-zb", "zb-v",
                            "dualpipev" };
    for (int k = 0; k < 8; k++)
        printf("  %-17s %s%s\n", names[k], k < 3 ? "V = 1; " : k < 6 ? "any V; " : "V = 2 (the default), stages r and "
               "2P-1-r on rank r; ", sched_constraint(names[k]));
    printf("--costs FILE (written by `pipelm bench --costs-out`): predicts the step time, bubble and\n"
           "per-rank compute and wait from measured F/B/I/W seconds and message costs (one line per\n"
           "stage; a file measured with one chunk per rank is scaled: stage s costs 1/V of stage s/V).\n"
           "--tp T with --costs: predict T tensor-parallel ranks per stage from costs measured at --tp 1\n"
           "(F, B, I, W divided by T plus each stage's TP all-reduces at the file's message costs).\n"
           "--grid auto prints the grid only up to 64 ranks x 4096 time units.\n"
           "--mem-limit-gb X: refuse (exit 2) a build estimated above X GiB before it starts (default:\n"
           "half the machine's memory, at most 8; about %.0f bytes per stage and micro-batch).\n"
           "--stages/--microbatches/--chunks-per-rank beside --load must match the file.\n",
           SCHED_BYTES_PER_PAIR);
}

/* Write the schedule as torch's CSV to an output checked as every output is; PL_OK or the
 * failure, reported. */
static int schedule_write_csv(const sched *s, const char *csv) {
    char err[4400];
    FILE *f = NULL;
    int wrc = pl_open_output(csv, "--csv", &f, err, sizeof err);
    if (wrc == PL_OK && sched_write_csv(s, f) != PL_OK) {
        snprintf(err, sizeof err, "--csv %s: writing it failed", csv);
        fclose(f);
        wrc = PL_EIO;
    } else if (wrc == PL_OK) {
        wrc = pl_close_output(f, csv, "--csv", err, sizeof err);
    }
    if (wrc != PL_OK) {
        pl_error("schedule: %s", err);
        return wrc;
    }
    pl_info("wrote %s\n", csv);
    return PL_OK;
}

/* The options of `pipelm schedule` (0 or -1: not given or malformed, checked later). */
typedef struct {
    int P, M, V;
    const char *name, *csv, *in, *costs, *grid;
    double mem_gb;
    int tp;                     /* --tp: predict T ranks per stage from --costs */
} schedule_args;

/* Parse the options of `pipelm schedule`; *stop = 1 when the command ends here (--help, or a
 * malformed command line), with the exit status returned. */
static int schedule_parse(int argc, char **argv, int first, int rank, schedule_args *sa, int *stop) {
    *sa = (schedule_args){0, 0, 0, "1f1b", NULL, NULL, NULL, "auto", schedule_default_mem_gb(), 1};
    *stop = 1;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0) {
            if (rank == 0) schedule_usage();
            return 0;
        }
        if (i + 1 >= argc) {
            if (rank == 0) pl_error("schedule: option %s needs a value", a);
            return 2;
        }
        const char *v = argv[++i];
        char *end;
        if (strcmp(a, "--stages") == 0) {
            sa->P = (int)strtol(v, &end, 10);
            if (*end || sa->P < 1) sa->P = -1;
        } else if (strcmp(a, "--microbatches") == 0) {
            sa->M = (int)strtol(v, &end, 10);
            if (*end || sa->M < 1) sa->M = -1;
        }
        else if (strcmp(a, "--schedule") == 0) sa->name = v;
        else if (strcmp(a, "--chunks-per-rank") == 0 || strcmp(a, "--virtual-stages") == 0) {
            sa->V = (int)strtol(v, &end, 10);
            if (*end || sa->V < 1) sa->V = -1;
        }
        else if (strcmp(a, "--csv") == 0) sa->csv = v;
        else if (strcmp(a, "--load") == 0) sa->in = v;
        else if (strcmp(a, "--costs") == 0) sa->costs = v;
        else if (strcmp(a, "--tp") == 0) {
            sa->tp = (int)strtol(v, &end, 10);
            if (*end || sa->tp < 1 || sa->tp > 64) sa->tp = -1;
        }
        else if (strcmp(a, "--grid") == 0) sa->grid = v;
        else if (strcmp(a, "--mem-limit-gb") == 0) {
            sa->mem_gb = strtod(v, &end);
            if (*end || !(sa->mem_gb > 0)) sa->mem_gb = -1;
        }
        else {
            if (rank == 0) pl_error("schedule: unknown option '%s' (see pipelm schedule --help)", a);
            return 2;
        }
    }
    *stop = 0;
    return 0;
}

/* `pipelm schedule --stages P --microbatches M --schedule NAME [--chunks-per-rank V] [--csv FILE]` */
static int schedule_main(int argc, char **argv, int first, int rank) {
    schedule_args sa;
    int stop, xrc = schedule_parse(argc, argv, first, rank, &sa, &stop);
    if (stop) return xrc;
    int P = sa.P, M = sa.M, V = sa.V;
    const char *name = sa.name, *csv = sa.csv, *in = sa.in, *costs = sa.costs, *grid = sa.grid;
    double mem_gb = sa.mem_gb;
    if (rank != 0) return 0;
    if (strcmp(grid, "auto") != 0 && strcmp(grid, "yes") != 0 && strcmp(grid, "no") != 0) {
        pl_error("schedule: --grid must be auto, yes or no, not '%s'", grid);
        return 2;
    }
    if (mem_gb <= 0) {
        pl_error("schedule: --mem-limit-gb must be a positive number of GiB");
        return 2;
    }
    if (sa.tp < 1 || (sa.tp > 1 && !costs)) {
        pl_error("schedule: --tp must be 1 to 64 and goes with --costs FILE");
        return 2;
    }
    sched s;
    char err[1024];
    /* the output first: never an input, never a device or FIFO (found before any work) */
    if (csv && ((in && pl_check_distinct(csv, "--csv", in, "--load", err, sizeof err) != PL_OK) ||
                (costs && pl_check_distinct(csv, "--csv", costs, "--costs", err, sizeof err) != PL_OK))) {
        pl_error("schedule: %s", err);
        return 2;
    }
    if (csv && pl_check_output_file(csv, "--csv", err, sizeof err) != PL_OK) {
        pl_error("schedule: %s", err);
        return 1;
    }
    int grc = schedule_get(in, name, P, V, M, mem_gb, &s);
    if (grc) return grc;
    if (sched_validate(&s, err, sizeof err) != PL_OK) {
        pl_error("schedule %s is invalid: %s", s.name, err);
        sched_free(&s);
        return 1;
    }
    double t0 = pl_now();
    sched_sim sim;
    int big = 0;
    if (sched_simulate(&s, &sim, err, sizeof err) == PL_OK) {
        big = s.P > 64 || sim.makespan > 4096;
        sched_sim_free(&sim);
    }
    if (strcmp(grid, "yes") == 0 || (strcmp(grid, "auto") == 0 && !big)) sched_print_grid(&s, pl_out ? pl_out : stdout);
    else print_schedule_summary(&s);
    pl_info("simulated in %.2f s\n", pl_now() - t0);
    if (costs && predict_with_costs(&s, costs, sa.tp) != PL_OK) {
        sched_free(&s);
        return 1;
    }
    if (csv && schedule_write_csv(&s, csv) != PL_OK) {
        sched_free(&s);
        return 1;
    }
    sched_free(&s);
    return 0;
}

int pipelm_main(int argc, char **argv, MPI_Comm comm, FILE *out, int *abort_needed) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    pl_rank = rank;
    pl_out = out ? out : stdout;
    *abort_needed = 0;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        if (rank == 0) usage(argc < 2 ? stderr : pl_out);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        if (rank == 0) fprintf(pl_out, "pipelm %s\n", PACKAGE_VERSION);
        return 0;
    }
    if (strcmp(argv[1], "schedule") == 0) return schedule_main(argc, argv, 2, rank);
    if (strcmp(argv[1], "eval") == 0) return eval_main(argc, argv, comm, abort_needed);
    if (strcmp(argv[1], "generate") == 0) return generate_main(argc, argv, comm, 0, abort_needed);
    if (strcmp(argv[1], "tokenize") == 0) return tokenize_main(argc, argv, comm);
    if (strcmp(argv[1], "tune") == 0) return tune_main(argc, argv, 2, comm);
    if (strcmp(argv[1], "convert") == 0) return rank == 0 ? ckpt_convert_main(argc, argv, 2) : 0;
    if (strcmp(argv[1], "inspect") == 0) return rank == 0 ? ckpt_inspect_main(argc, argv, 2) : 0;
    int bench = strcmp(argv[1], "bench") == 0;
    if (bench)
        for (int i = 2; i < argc; i++) {
            if (strcmp(argv[i], "--peak") == 0) return bench_peak_main(argc, argv, 2, comm);
            if (strcmp(argv[i], "--generate") == 0) return generate_main(argc, argv, comm, 1, abort_needed);
        }
    if (strcmp(argv[1], "train") != 0 && !bench) {
        if (rank == 0) {
            pl_error("unknown command '%s'", argv[1]);
            usage(stderr);
        }
        return 2;
    }
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            if (rank == 0) (bench ? bench_usage : train_usage)(pl_out);
            return 0;
        }
    pl_options o;
    config_defaults(&o);
    if (bench) { /* a short, quiet run unless told otherwise */
        o.hp.total_steps = 5;
        o.warmup = 2;
        o.log_every = 1000000;
        o.progress = 0;
    }
    char err[1024];
    /* every rank parses the same arguments, so every rank sees the same error: no hang */
    if (config_parse(&o, argc, argv, 2, bench, err, sizeof err) != PL_OK ||
        config_validate(&o, err, sizeof err) != PL_OK) {
        if (rank == 0) pl_error("%s", err);
        return 2;
    }
    o.bench = bench;
    int agreed = 1;
    int rc = train_run(&o, comm, &agreed);
    if (rc != PL_OK && !agreed) *abort_needed = 1;
    if (rc == PL_EPREEMPT) return PIPELM_EXIT_PREEMPTED;
    /* PL_EINVAL from train_run is always a bad setting (it maps run-time ones to PL_ESTATE) */
    return rc == PL_OK ? 0 : rc == PL_EINVAL ? 2 : 1;
}
