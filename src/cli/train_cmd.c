/*
 * train_cmd.c — `pipelm train` and `pipelm bench` (bench --peak and --generate are their own
 * programs): their --help, the option table's settings, then the training run.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdio.h>
#include <string.h>
#include "cli/commands.h"
#include "cli/config.h"
#include "run/bench.h"
#include "run/generate.h"
#include "run/train.h"
#include "util/common.h"

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

/* `pipelm train` and `pipelm bench` (bench --peak and --generate are their own programs):
 * the option table's settings, then the training run. */
static int train_or_bench(int argc, char **argv, MPI_Comm comm, int bench, int *abort_needed) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    *abort_needed = 0;
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

int train_cmd_main(int argc, char **argv, MPI_Comm comm, int *abort_needed) {
    return train_or_bench(argc, argv, comm, 0, abort_needed);
}

int bench_cmd_main(int argc, char **argv, MPI_Comm comm, int *abort_needed) {
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--peak") == 0) {
            *abort_needed = 0;
            return bench_peak_main(argc, argv, 2, comm);
        }
        if (strcmp(argv[i], "--generate") == 0) return generate_main(argc, argv, comm, 1, abort_needed);
    }
    return train_or_bench(argc, argv, comm, 1, abort_needed);
}
