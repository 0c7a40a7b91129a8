/*
 * schedule_cmd.c — `pipelm schedule`: a schedule built by name (or read from torch's CSV),
 * validated, simulated at unit costs and printed as a grid, optionally predicted from measured
 * costs and written as CSV. Runs on rank 0 only.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli/commands.h"
#include "pipeline/sched.h"
#include "pipeline/sched_cost.h"
#include "util/args.h"
#include "util/common.h"
#include "util/files.h"

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

/* Predict the step with the measured costs in `path` (PL_OK, or the failure, reported);
 * quiet: only check that the costs fit the schedule (before anything is printed). */
static int predict_with_costs(const sched *s, const char *path, int tp, int cp, int quiet) {
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
    if (!quiet && (ar > 0 || tp > 1))
        pl_info("--tp %d: F, B, I, W divided by %d, each F and I with its stage's TP all-reduces at %.1f us each "
                "(%.0f bytes)%s\n", tp, tp, 1e6 * ar, c.msg_bytes,
                c.bytes_per_s > 0 ? "" : "; the costs have no message bandwidth (one stage): all-reduces counted at 0");
    double ex = 0.0; /* --cp: multi-head attention's widths (qkv 3 C, k and v 2 C): the model is not known here */
    if ((rc = sched_costs_cp(&c, cp, 3.0, 2.0, &ex, err, sizeof err)) != PL_OK) {
        pl_error("schedule: %s: %s", path, err);
        sched_costs_free(&c);
        return rc;
    }
    if (!quiet && (ex > 0 || cp > 1))
        pl_info("--cp %d: F, B, I, W and activations divided by %d, each F with its stage's K/V exchanges at %.1f us "
                "each, I and B with two%s\n", cp, cp, 1e6 * ex,
                c.bytes_per_s > 0 ? "" : "; the costs have no message bandwidth (one stage): exchanges counted at 0");
    sched_pred pr;
    if ((rc = sched_predict(s, &c, &pr, err, sizeof err)) != PL_OK) {
        pl_error("schedule: %s: %s", path, err);
        sched_costs_free(&c);
        return rc;
    }
    if (quiet) {
        sched_pred_free(&pr);
        sched_costs_free(&c);
        return PL_OK;
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
           "       [--csv OUT.csv] [--load IN.csv] [--costs FILE [--tp T | --cp C]] [--grid auto|yes|no]\n"
           "Prints the per-rank action grid, the bubble fraction and the in-flight micro-batches;\n"
           "--csv writes torch.distributed.pipelining's CSV form; --load reads and validates one.\n"
           "--chunks-per-rank V (alias --virtual-stages): each of the P ranks runs V model chunks, the\n"
           "model cut into P*V stages, stage s on rank s mod P (cells then read \"5F3\": stage 5's\n"
           "forward of micro-batch 3). Schedules and what they need of M (P ranks, V chunks):\n");
    for (const sched_kind *k = sched_kinds; k->name; k++)
        printf("  %-17s %s%s\n", k->name, k->chunks == SCHED_CHUNKS_ONE ? "V = 1; " : k->chunks == SCHED_CHUNKS_ANY ?
               "any V; " : "V = 2 (the default), stages r and 2P-1-r on rank r; ", k->rule);
    printf("--costs FILE (written by `pipelm bench --costs-out`): predicts the step time, bubble and\n"
           "per-rank compute and wait from measured F/B/I/W seconds and message costs (one line per\n"
           "stage; a file measured with one chunk per rank is scaled: stage s costs 1/V of stage s/V).\n"
           "--tp T with --costs: predict T tensor-parallel ranks per stage from costs measured at --tp 1\n"
           "(F, B, I, W divided by T plus each stage's TP all-reduces at the file's message costs).\n"
           "--cp C with --costs: predict C context-parallel ranks per stage from costs measured at --cp 1\n"
           "(F, B, I, W, activations and messages divided by C plus each block's K/V exchanges, counted\n"
           "for multi-head attention's widths).\n"
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
    int cp;                     /* --cp: predict C ranks per stage from --costs */
} schedule_args;

/* The options of `pipelm schedule`, in schedule_parse's order. */
static const char *const sched_opt_names[] = {"stages", "microbatches", "schedule", "chunks-per-rank", "virtual-stages",
                                              "csv", "load", "costs", "tp", "grid", "mem-limit-gb", "cp"};
#define NSCHED_OPTS (int)(sizeof sched_opt_names / sizeof sched_opt_names[0])

/* A positive integer value, or -1 (refused later, naming the option). */
static int positive_int(const char *v, int max) {
    char *end;
    long x = strtol(v, &end, 10);
    return *end || x < 1 || x > max ? -1 : (int)x;
}

/* Parse the options of `pipelm schedule`; *stop = 1 when the command ends here (--help, or a
 * malformed command line), with the exit status returned. */
static int schedule_parse(int argc, char **argv, int first, int rank, schedule_args *sa, int *stop) {
    *sa = (schedule_args){0, 0, 0, "1f1b", NULL, NULL, NULL, "auto", schedule_default_mem_gb(), 1, 1};
    *stop = 1;
    char err[512];
    if (args_check_names(argc, argv, first, sched_opt_names, NSCHED_OPTS, "schedule", err, sizeof err) != PL_OK) {
        if (rank == 0) pl_error("%s", err);
        return 2;
    }
    for (int i = first; i < argc; i++) {
        int k;
        const char *v;
        if (args_next(argc, argv, &i, sched_opt_names, NSCHED_OPTS, "schedule", &k, &v, err, sizeof err) != PL_OK) {
            if (rank == 0) pl_error("%s", err);
            return 2;
        }
        char *end;
        switch (k) {
        case -1: if (rank == 0) schedule_usage(); return 0;
        case 0: sa->P = positive_int(v, 1 << 30); break;
        case 1: sa->M = positive_int(v, 1 << 30); break;
        case 2: sa->name = v; break;
        case 3: case 4: sa->V = positive_int(v, 1 << 30); break;
        case 5: sa->csv = v; break;
        case 6: sa->in = v; break;
        case 7: sa->costs = v; break;
        case 8: sa->tp = positive_int(v, 64); break;
        case 9: sa->grid = v; break;
        case 11: sa->cp = positive_int(v, 64); break;
        default:
            sa->mem_gb = strtod(v, &end);
            if (*end || !(sa->mem_gb > 0)) sa->mem_gb = -1;
        }
    }
    *stop = 0;
    return 0;
}

int schedule_main(int argc, char **argv, MPI_Comm comm, int *abort_needed) {
    int rank, first = 2;
    MPI_Comm_rank(comm, &rank);
    *abort_needed = 0;
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
    if (sa.cp < 1 || (sa.cp > 1 && (!costs || sa.tp > 1))) {
        pl_error("schedule: --cp must be 1 to 64 and goes with --costs FILE, without --tp");
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
    if (costs && predict_with_costs(&s, costs, sa.tp, sa.cp, 1) != PL_OK) { /* costs that do not fit the schedule: */
        sched_free(&s);                                             /* said before any grid, exit 2 */
        return 2;
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
    if (costs && predict_with_costs(&s, costs, sa.tp, sa.cp, 0) != PL_OK) {
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
