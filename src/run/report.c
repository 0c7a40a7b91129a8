/*
 * report.c — what a training run tells its user: the banner and stage table, step lines,
 * metrics records, the progress bar, the timers table, the diagnosis of a non-finite value,
 * benchmark figures and the end-of-run checks (run.h).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include "model/arch.h"
#include "backend/backend_prof.h"
#include "run/bench.h"
#include "pipeline/sched_cost.h"
#include "backend/cpu/blas.h"
#include "parallel/comm.h"
#include "util/common.h"
#include "util/files.h"
#include "run/run.h"
#include "pipeline/trace.h"
#include "pipeline/waitsplit.h"

/* MB of activations one in-flight micro-batch holds on stage s under recomputation `mode`
 * (model_slot_act_bytes: what stage_act_bytes_per_slot counts and the stage allocates). */
static double act_mb(const run *R, int s, int mode) {
    model_config c = R->cfg; /* --cp: a CP rank's T / C rows (and the span kernel's attention state) */
    if (R->C > 1) c.cp = R->C;
    size_t b = model_slot_act_bytes(&c, R->B / R->M, R->Tl, R->sp.blocks[s], s == 0, s == R->S - 1, mode);
    return (double)b / 1048576.0;
}

int report_grid(run *R) {
    if (R->D <= 1 && R->Tp <= 1) return PL_OK;
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    char (*all)[64] = R->wrank == 0 ? calloc((size_t)R->W, 64) : NULL;
    if (R->wrank == 0 && !all) return PL_ENOMEM;
    PL_TRY(comm_gather(host, 64, MPI_CHAR, all, 0, R->world, "the gather of host names"));
    if (R->wrank == 0) {
        if (R->C > 1) { /* --cp: world rank r is CP rank r % C of stage r / C / D, replica r / C % D */
            int D = R->D / R->C;
            pl_info("context parallel: C=%d ranks per stage x %d replicas x %d stages = %d ranks; each holds %d of "
                    "every sequence's %d tokens (chunks c and %d-c of %d), batch %d = %d x %d sequences per replica\n",
                    R->C, D, R->P, R->W, R->Tl, R->T, 2 * R->C - 1, 2 * R->C, R->Bg, D, R->B);
            pl_info("  stage  replica  cp  rank  host\n");
            for (int r = 0; r < R->W; r++)
                pl_info("  %5d  %7d  %2d  %4d  %s\n", r / R->D, r % R->D / R->C, r % R->C, r, all[r]);
        } else if (R->Tp > 1) { /* --tp: world rank r is TP rank r % T of stage r / T / D, replica r / T % D */
            pl_info("tensor parallel: %d TP ranks x %d replicas x %d stages = %d ranks (TP innermost)\n", R->Tp, R->D,
                    R->P, R->W);
            pl_info("  stage  replica  tp  rank  host\n");
            for (int r = 0; r < R->W; r++)
                pl_info("  %5d  %7d  %2d  %4d  %s\n", r / R->Tp / R->D, r / R->Tp % R->D, r % R->Tp, r, all[r]);
        } else {
            pl_info("data parallel: %d replicas x %d stages = %d ranks, batch %d = %d x %d sequences per replica%s\n",
                    R->D, R->P, R->W, R->Bg, R->D, R->B, R->o->zero ? ", AdamW moments sharded (ZeRO-1)" : "");
            int E = R->have_ep ? R->ep.E : 1, El = R->cfg.moe.n_experts / E; /* --ep: replica d computes d % E's */
            pl_info("  stage  replica  rank  %shost\n", E > 1 ? "experts  " : "");
            for (int r = 0; r < R->W; r++) {
                char ex[32] = "";
                if (E > 1) snprintf(ex, sizeof ex, "%3d-%-3d  ", r % R->D % E * El, (r % R->D % E + 1) * El - 1);
                pl_info("  %5d  %7d  %4d  %s%s\n", r / R->D, r % R->D, r, ex, all[r]);
            }
        }
    }
    free(all);
    return PL_OK;
}

/* Rank 0 prints the stage table: who owns what, and its estimated cost. */
void report_stage_table(run *R) {
    const split *sp = &R->sp;
    int Bm = R->B / R->M;
    char desc[256];
    arch_of(&R->cfg)->describe(&R->cfg, desc, sizeof desc);
    pl_info("model: %s, %zu parameters\n", desc, model_num_params(&R->cfg));
    char lay[512];
    layout_describe(&R->lay, lay, sizeof lay);
    pl_info("layout: %s\n", lay);
    pl_info("BLAS: OpenBLAS %s, kernel %s (%s)%s\n", blas_flavour(), blas_kernel(), blas_kernel_origin(),
            getenv("PIPELM_WAIT_CHOSEN") ? "; OMP_WAIT_POLICY=PASSIVE set by pipelm (two thread pools)" : "");
    char bdesc[256] = "";
    R->be->describe(bdesc, sizeof bdesc);
    pl_info("backend: %s, precision %s%s\n", bdesc, R->o->precision,
            strcmp(R->o->backend, "auto") == 0 ? " (chosen by --backend auto)" : "");
    if (R->V > 1 && R->sc.place == SCHED_PLACE_V)
        pl_info("pipeline: %d stages = %d ranks x %d chunks (V-shaped: stages r and %d-r on rank r), schedule %s, %d "
                "micro-batch%s of %d x %d tokens, split %s\n", R->S, R->P, R->V, R->S - 1, R->sc.name, R->M,
                R->M > 1 ? "es" : "", Bm, R->T, R->o->split);
    else if (R->V > 1)
        pl_info("pipeline: %d stages = %d ranks x %d chunks (stage s on rank s mod %d), schedule %s, %d micro-batch%s "
                "of %d x %d tokens, split %s\n", R->S, R->P, R->V, R->P, R->sc.name, R->M, R->M > 1 ? "es" : "", Bm,
                R->T, R->o->split);
    else
        pl_info("pipeline: %d stage%s, schedule %s, %d micro-batch%s of %d x %d tokens, split %s\n",
                R->P, R->P > 1 ? "s" : "", R->sc.name, R->M, R->M > 1 ? "es" : "", Bm, R->T, R->o->split);
    if (R->Tp > 1)
        pl_info("tensor parallel: T=%d ranks per stage, each %d of %d heads and %d of %d MLP columns (params and "
                "GFLOP below are the stage's, all T together)\n", R->Tp, R->cfg.NH / R->Tp, R->cfg.NH, R->cfg.H / R->Tp,
                R->cfg.H);
    if (R->have_ep)
        pl_info("expert parallel: E=%d replicas share each stage's experts (%d groups of the %d replicas): each rank "
                "computes %d of the %d experts of every MoE layer for its group (the experts column below); the "
                "expert weights stay whole on every rank\n", R->ep.E, R->D / R->ep.E, R->D,
                R->cfg.moe.n_experts / R->ep.E, R->cfg.moe.n_experts);
    if (R->C > 1)
        pl_info("context parallel: C=%d ranks per stage, each %d of every sequence's %d tokens (act MB below: one CP "
                "rank's; GFLOP: the stage's, all C together)\n", R->C, R->Tl, R->T);
    pl_info("  stage  rank  blocks    parts        params   GFLOP/mb(f+b)  act MB/mb  in-flight  recompute%s\n",
            R->Tp > 1 ? "  T" : "");
    for (int s = 0; s < sp->P; s++) {
        char parts[32];
        snprintf(parts, sizeof parts, "%s%s", s == 0 ? "E" : "", s == sp->P - 1 ? "H" : "");
        char blocks[32];
        if (sp->blocks[s]) snprintf(blocks, sizeof blocks, "%d-%d", sp->first[s], sp->first[s] + sp->blocks[s] - 1);
        else snprintf(blocks, sizeof blocks, "-");
        double gf = 3.0 * split_stage_flops(sp, &R->cfg, s, R->T) * Bm * R->T / 1e9;
        static const char *const rc_name[] = {"none", "selective", "full"};
        int mode = R->rc_modes ? R->rc_modes[s] : 0;
        char tcol[16] = "";
        if (R->Tp > 1) snprintf(tcol, sizeof tcol, "%*s  %d", 9 - (int)strlen(rc_name[mode]), "", R->Tp); /* rc names <= 9 */
        pl_info("  %5d  %4d  %-8s  %-5s  %12zu   %13.3f  %9.1f  %9d  %s%s\n", s, sched_stage_rank(&R->sc, s), blocks, parts,
                split_stage_params(sp, &R->cfg, s), gf, act_mb(R, s, mode), sched_max_inflight_stage(&R->sc, s),
                rc_name[mode], tcol);
    }
    if (R->V > 1) { /* a rank's chunks are not all at their peaks at once */
        char line[1024];
        int off = 0;
        for (int r = 0; r < R->P && off < (int)sizeof line - 16; r++)
            off += snprintf(line + off, sizeof line - off, "%s%d", r ? ", " : "", sched_max_inflight(&R->sc, r));
        pl_info("  in-flight micro-batches per rank, all its chunks together: %s\n", line);
    }
    pl_info("  (E = embeddings, H = final norm + LM head + loss; blocks are layer numbers)\n");
    if (R->exact)
        pl_info("gradient sums: exact (--grad-accum exact): each micro-batch's gradient in 128-bit fixed point, "
                "summed as integers, rounded once; 16 bytes a parameter more (%.1f MB on rank 0)\n",
                (double)R->st.nparams * sizeof(pl_fx) / 1048576.0);
}
/* Index of this stage's first tensor whose values (grads: its gradient) are not finite, or -1. */
static int first_nonfinite_tensor(const stage *st, int grads) {
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        double sq = 0.0;
        if (st->be->sumsq((grads ? st->grads : st->params) + t->offset, t->numel, &sq) != PL_OK || !isfinite(sq))
            return i; /* a backend that cannot even sum it: name the tensor too */
    }
    return -1;
}
/* "stage S (rank W)", with replicas "stage S of replica D (rank W)", with chunks "rank W (its
 * V chunks)": the one way messages name a world rank's place, so --dp runs never mix stage and
 * rank numbers. */
static void place_name(const run *R, int wrank, char *buf, size_t len) {
    int prank = wrank / R->Tp / R->D, d = wrank / R->Tp % R->D; /* --tp: TP innermost */
    if (R->V > 1 && R->D > 1)
        snprintf(buf, len, "pipeline rank %d (its %d chunks) of replica %d (rank %d)", prank, R->V, d, wrank);
    else if (R->V > 1) snprintf(buf, len, "rank %d (its %d chunks)", wrank, R->V);
    else if (R->D > 1) snprintf(buf, len, "stage %d of replica %d (rank %d)", prank, d, wrank);
    else snprintf(buf, len, "stage %d (rank %d)", prank, wrank);
}
/* Why a weight is not finite: written there by --fail-at nan, present since the weights were
 * loaded or initialised (no update has run yet), or made by an update (an overflow). */
static const char *nonfinite_cause(int code) {
    if (code == 2) return "injected there by --fail-at nan (a test), not an overflow";
    if (code == 1) return "present before any update of this run: the --init or --resume file holds it";
    return "written by an earlier update, which overflowed (try a lower --lr or --grad-clip)";
}
/* After a non-finite loss or gradient: find where it first appears. Every rank reaches this
 * (the norm all-reduce told them all); each names its first non-finite parameter, the world
 * gathers them, and world rank 0 alone gives the one diagnosis: the lowest (stage, replica)
 * whose weights were already bad and why (injected, loaded, or an update), else which forward
 * went non-finite first, else the backward. */
void report_nonfinite(run *R, int step, const step_news *nw, double loss, double norm, const char *where) {
    int cause = R->nan_injected == step ? 2 : step == R->first_step ? 1 : 0;
    int mine[3] = {first_nonfinite_tensor(&R->st, 0), first_nonfinite_tensor(&R->st, 1), cause};
    int *all = calloc(3 * (size_t)R->W, sizeof(int));
    char (*names)[32] = calloc((size_t)R->W, 32);
    char name[32] = "", here[160];
    place_name(R, R->wrank, here, sizeof here);
    if (mine[0] >= 0) snprintf(name, sizeof name, "%s", R->st.tensors[mine[0]].name);
    if (mine[0] >= 0)
        pl_error("step %d: parameter %s of %s is not finite: %s", step, name, here, nonfinite_cause(cause));
    int ok = all && names;
    MPI_Request rq[2];
    comm_what w = {"the NaN diagnosis", -1, -1, step};
    if (ok && MPI_Iallgather(mine, 3, MPI_INT, all, 3, MPI_INT, R->world, &rq[0]) == MPI_SUCCESS &&
        MPI_Iallgather(name, 32, MPI_CHAR, names, 32, MPI_CHAR, R->world, &rq[1]) == MPI_SUCCESS)
        ok = comm_waitall(2, rq, &w) == PL_OK;
    if (R->wrank == 0) {
        int ps = -1; /* the lowest stage (then replica) holding a bad weight: world ranks in stage order */
        for (int r = 0; ok && r < R->W && ps < 0; r++) if (all[3 * r] >= 0) ps = r;
        char at[160];
        if (ps >= 0) {
            place_name(R, ps, at, sizeof at);
            pl_error("step %d: non-finite loss %g / gradient norm %g: the weights of %s already hold a non-finite "
                     "value, first in %s, %s; stopping all ranks", step, loss, norm, at, names[ps],
                     nonfinite_cause(all[3 * ps + 2]));
        } else if (nw->fwd_stage >= 0) {
            place_name(R, nw->fwd_wrank >= 0 ? nw->fwd_wrank : sched_stage_rank(&R->sc, nw->fwd_stage) * R->D * R->Tp, at,
                       sizeof at);
            pl_error("step %d: non-finite loss %g / gradient norm %g: it first appears in the forward of global "
                     "stage %d on %s, micro-batch %d, whose weights are finite everywhere: the activations "
                     "overflowed; stopping all ranks (try a lower --lr or --grad-clip)", step, loss, norm,
                     nw->fwd_stage, at, nw->fwd_mb);
        } else {
            pl_error("step %d: non-finite gradient (norm %g, loss %g) first in %s, with a finite forward and "
                     "finite weights: the backward overflowed; stopping all ranks (try a lower --lr or "
                     "--grad-clip)", step, norm, loss, where);
        }
    }
    free(all);
    free(names);
}
/* Name of a norm slot for messages. */
void report_norm_slot(const run *R, int slot, char *buf, size_t len) {
    if (slot == 0) snprintf(buf, len, "the embeddings (stage 0)");
    else if (slot == R->cfg.L + 1)
        snprintf(buf, len, "%s (stage %d)", arch_of(&R->cfg)->head_desc, R->S - 1);
    else {
        int l = slot - 1, s = 0;
        while (s < R->S - 1 && l >= R->sp.first[s] + R->sp.blocks[s]) s++;
        snprintf(buf, len, "block %d (stage %d, rank %d)", l, s, sched_stage_rank(&R->sc, s));
    }
}
/* Gather every rank's timers (ms per step over the interval) and print min/median/max. */
int report_timers(run *R, int step) {
    double mine[TM_N + 1], *all = NULL;
    int k = R->tm_steps ? R->tm_steps : 1;
    for (int i = 0; i < TM_N; i++) mine[i] = 1e3 * R->tm[i] / k;
    mine[TM_N] = mine[TM_STEP] - mine[TM_FWD] - mine[TM_BWD] - mine[TM_WAIT] - mine[TM_OPT] - mine[TM_DATA];
    if (mine[TM_N] < 0) mine[TM_N] = 0;
    if (R->rank == 0) all = malloc(sizeof(double) * (TM_N + 1) * R->P);
    if (R->rank == 0 && !all) return PL_ENOMEM;
    PL_TRY(comm_gather(mine, TM_N + 1, MPI_DOUBLE, all, 0, R->comm, "the gather of the timers"));
    if (R->rank == 0 && all) {
        const char *names[TM_N + 1] = {"forward", "backward", "MPI wait", "optimizer", "step", "data wait", "idle"};
        pl_info("timers over steps %d-%d (ms per step)    min   median      max  (rank of max)\n",
                step - R->tm_steps + 1, step);
        for (int i = 0; i < TM_N + 1; i++) {
            double *col = malloc(sizeof(double) * R->P);
            int argmax = 0;
            for (int r = 0; r < R->P; r++) {
                col[r] = all[r * (TM_N + 1) + i];
                if (col[r] > all[argmax * (TM_N + 1) + i]) argmax = r;
            }
            for (int a = 1; a < R->P; a++) /* insertion sort: P is small */
                for (int b = a; b > 0 && col[b] < col[b - 1]; b--) { double t = col[b]; col[b] = col[b - 1]; col[b - 1] = t; }
            double med = R->P % 2 ? col[R->P / 2] : 0.5 * (col[R->P / 2 - 1] + col[R->P / 2]);
            pl_info("  %-36s %8.2f %8.2f %8.2f  (%d)\n", names[i], col[0], med, col[R->P - 1], argmax);
            free(col);
        }
        char line[8192];
        int off = snprintf(line, sizeof line, "{\"event\":\"timers\",\"step\":%d,\"ranks\":[", step);
        for (int r = 0; r < R->P && off < (int)sizeof line - 256; r++) {
            const double *t = all + r * (TM_N + 1);
            off += snprintf(line + off, sizeof line - off,
                            "%s{\"rank\":%d,\"fwd_ms\":%.3f,\"bwd_ms\":%.3f,\"wait_ms\":%.3f,\"opt_ms\":%.3f,"
                            "\"data_ms\":%.3f,\"idle_ms\":%.3f,\"step_ms\":%.3f}", r ? "," : "", r, t[TM_FWD], t[TM_BWD],
                            t[TM_WAIT], t[TM_OPT], t[TM_DATA], t[TM_N], t[TM_STEP]);
        }
        snprintf(line + off, sizeof line - off, "]}");
        metrics_line(&R->mx, "%s", line);
        free(all);
    }
    memset(R->tm, 0, sizeof R->tm);
    R->tm_steps = 0;
    return PL_OK;
}
/* Progress bar on a terminal, redrawn in place under the step lines. */
static void draw_progress(run *R, int step, int steps, double elapsed) {
    if (!R->tty || R->rank != 0) return;
    int width = 30, fill = steps ? width * step / steps : width;
    double eta = step ? elapsed / step * (steps - step) : 0;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    fprintf(pl_out, "\r\033[K[%s] %d/%d  ETA %dm%02ds", bar, step, steps, (int)eta / 60, (int)eta % 60);
    fflush(pl_out);
}
/* The "run" line of the metrics file. */
void report_run_line(run *R) {
    if (!R->mx.f) return;
    FILE *f = R->mx.f;
    char ent[64];
    metrics_num(ent, sizeof ent, R->have_train ? R->train.entropy : NAN);
    fprintf(f, "{\"event\":\"run\",\"version\":\"%s\",\"config\":", PACKAGE_VERSION);
    pl_options o = *R->o; /* the backend that ran, not "auto" */
    snprintf(o.backend, sizeof o.backend, "%s", R->be->name);
    config_write_json(&o, f);
    fprintf(f, ",\"model\":{\"vocab_size\":%d,\"padded_vocab_size\":%d,\"max_seq_len\":%d,\"n_layer\":%d,"
            "\"n_head\":%d,\"n_embd\":%d,\"params\":%zu}", R->cfg.V, R->cfg.Vp, R->cfg.maxT, R->cfg.L,
            R->cfg.NH, R->cfg.C, model_num_params(&R->cfg));
    fprintf(f, ",\"ranks\":%d,\"stages\":%d,\"split\":", R->P, R->S);
    split_write_json(&R->sp, f);
    fprintf(f, ",\"schedule\":\"%s\",\"microbatches\":%d,\"data\":\"%s\",\"entropy_floor\":%s,"
            "\"chunks_per_rank\":%d}\n", R->sc.name, R->M, R->have_train ? R->train.desc : "", ent, R->V);
    metrics_commit(&R->mx);
}
/* Where the timed steps went, by op class, per rank (ms per step) and as a share of the
 * rank's compute: the next bottleneck, visible. */
static int report_op_classes(run *R, int nsteps) {
    double mine[PROF_NCLASS + 1], *all = NULL;
    backend_prof_read(mine, NULL);
    mine[PROF_NCLASS] = 0;
    for (int i = 0; i < PROF_NCLASS; i++) mine[PROF_NCLASS] += mine[i];
    if (R->rank == 0 && !(all = malloc(sizeof mine * R->P))) return PL_ENOMEM;
    int rc = comm_gather(mine, PROF_NCLASS + 1, MPI_DOUBLE, all, 0, R->comm, "the gather of op-class timers");
    if (rc == PL_OK && R->rank == 0) {
        pl_info("  op classes (ms per step, %% of the rank's op time), backend %s, precision %s:\n", R->be->name,
                R->o->precision);
        pl_info("  %-30s", "rank");
        for (int r = 0; r < R->P; r++) pl_info("  %15d", r);
        pl_info("\n");
        for (int i = 0; i <= PROF_NCLASS; i++) {
            pl_info("  %-30s", i < PROF_NCLASS ? prof_class_name[i] : "all ops");
            for (int r = 0; r < R->P; r++) {
                const double *a = all + (size_t)r * (PROF_NCLASS + 1);
                pl_info("  %8.2f (%3.0f%%)", 1e3 * a[i] / nsteps, a[PROF_NCLASS] > 0 ? 100 * a[i] / a[PROF_NCLASS] : 0);
            }
            pl_info("\n");
        }
    }
    free(all);
    return rc;
}

/* Half the round-trip time of a bytes-long message between ranks 0 and 1 (median of 9). */
static int pingpong(run *R, size_t bytes, char *buf, double *half_rtt) {
    double t[9];
    for (int k = 0; k < 9; k++) {
        PL_TRY(comm_barrier(R->comm, "the message cost measurement"));
        double t0 = pl_now();
        if (R->rank == 0) {
            PL_MPI_CHECK(MPI_Send(buf, (int)bytes, MPI_BYTE, 1, 99, R->comm));
            PL_MPI_CHECK(MPI_Recv(buf, (int)bytes, MPI_BYTE, 1, 99, R->comm, MPI_STATUS_IGNORE));
        } else if (R->rank == 1) {
            PL_MPI_CHECK(MPI_Recv(buf, (int)bytes, MPI_BYTE, 0, 99, R->comm, MPI_STATUS_IGNORE));
            PL_MPI_CHECK(MPI_Send(buf, (int)bytes, MPI_BYTE, 0, 99, R->comm));
        }
        t[k] = (pl_now() - t0) / 2;
    }
    for (int a = 1; a < 9; a++)
        for (int b = a; b > 0 && t[b] < t[b - 1]; b--) { double x = t[b]; t[b] = t[b - 1]; t[b - 1] = x; }
    *half_rtt = t[4];
    return PL_OK;
}

/* --costs-out: mean seconds of each F, B, I and W per stage over the timed steps, and a
 * message's latency and bandwidth between ranks 0 and 1, for `pipelm schedule --costs`. */
static int report_costs(run *R) {
    int V = R->V, S = R->S;
    double *mine = malloc(sizeof(double) * 6 * V), *all = R->rank == 0 ? malloc(sizeof(double) * 6 * S) : NULL;
    const sched_op ops[4] = {SCHED_F, SCHED_B, SCHED_I, SCHED_W};
    if (!mine || (R->rank == 0 && !all)) { free(mine); free(all); return PL_ENOMEM; }
    for (int c = 0; c < V; c++) { /* chunk c: the rank's optimizer step shared out evenly */
        const double *t = R->eng.t_opc + (size_t)c * SCHED_NOPS;
        const long *n = R->eng.n_opc + (size_t)c * SCHED_NOPS;
        for (int k = 0; k < 4; k++) mine[c * 6 + k] = n[ops[k]] ? t[ops[k]] / n[ops[k]] : 0.0;
        mine[c * 6 + 4] = R->tm_steps ? R->tm[TM_OPT] / R->tm_steps / V : 0.0;
        mine[c * 6 + 5] = (double)stage_act_bytes_per_slot(&R->stv[c]);
    }
    int grc = comm_gather(mine, 6 * V, MPI_DOUBLE, all, 0, R->comm, "the gather of action costs");
    free(mine);
    if (grc != PL_OK) { free(all); return grc; }
    size_t bytes = (size_t)R->st.N * R->cfg.C * sizeof(float);
    double lat = 0, big = 0;
    char *buf = R->P > 1 ? calloc(bytes, 1) : NULL;
    int rc = R->P > 1 && !buf ? PL_ENOMEM : PL_OK;
    if (R->P > 1 && rc == PL_OK && (rc = pingpong(R, 8, buf, &lat)) == PL_OK) rc = pingpong(R, bytes, buf, &big);
    free(buf);
    if (rc == PL_OK && R->rank == 0) {
        sched_costs c = {S, NULL, NULL, NULL, NULL, NULL, lat, big > lat ? bytes / (big - lat) : 0.0, (double)bytes, NULL, NULL,
                         1, R->Tp, R->C};
        double *cols = malloc(sizeof(double) * 6 * S);
        if (!cols) rc = PL_ENOMEM;
        /* rank r's row holds its chunks c = 0..V-1, global stages c P + r: F B I W O A */
        for (int k = 0; cols && k < 6; k++)
            for (int r = 0; r < R->P; r++)
                for (int ch = 0; ch < V; ch++)
                    cols[k * S + sched_place_stage(R->sc.place, R->P, r, ch)] = all[(size_t)r * 6 * V + ch * 6 + k];
        if (cols) {
            c.f = cols, c.b = cols + S, c.i = cols + 2 * S, c.w = cols + 3 * S, c.opt = cols + 4 * S;
            c.act = cols + 5 * S;
            c.blocks = R->sp.blocks; /* global stage order */
            c.dp = R->D / R->C; /* --cp: the C ranks of a replica are key cp */
            FILE *f = NULL;
            char e[4400];
            int wrc = pl_open_output(R->o->costs_out, "--costs-out", &f, e, sizeof e);
            if (wrc == PL_OK && sched_costs_write(&c, f) != 0) {
                snprintf(e, sizeof e, "--costs-out %s: writing it failed", R->o->costs_out);
                wrc = PL_EIO;
                fclose(f);
            } else if (wrc == PL_OK) {
                wrc = pl_close_output(f, R->o->costs_out, "--costs-out", e, sizeof e);
            }
            if (wrc != PL_OK) {
                pl_error("%s", e);
                rc = PL_EIO;
            } else {
                pl_info("  costs             %s (message %zu bytes: %.1f us latency, %.2f GB/s)\n", R->o->costs_out,
                        bytes, 1e6 * lat, c.bytes_per_s / 1e9);
            }
            free(cols);
        }
    }
    free(all);
    return comm_agree(R->comm, rc, NULL);
}

/* The wait split's lines, printed under the benchmark table (rank 0). */
static char split_text[8192];

/* Rank 0: the wait split and its straggler as text (split_text) and as JSON into json. */
static void print_wait_split(const run *R, const wait_split *w, char *json, size_t jlen) {
    int to = snprintf(split_text, sizeof split_text, "  wait split (ms per step): measured = schedule + straggler + "
                      "transfer + other\n");
    int off = snprintf(json, jlen, "\"wait_split\":{\"ranks\":[");
    for (int r = 0; r < R->P; r++) {
        if (to < (int)sizeof split_text - 128)
            to += snprintf(split_text + to, sizeof split_text - to, "    rank %d: %8.2f = %8.2f + %8.2f + %8.2f + %8.2f\n",
                           r, 1e3 * w->measured_s[r], 1e3 * w->sched_s[r], 1e3 * w->straggler_s[r],
                           1e3 * w->transfer_s[r], 1e3 * w->other_s[r]);
        if (off < (int)jlen - 200)
            off += snprintf(json + off, jlen - off, "%s{\"rank\":%d,\"measured_ms\":%.3f,\"schedule_ms\":%.3f,"
                            "\"straggler_ms\":%.3f,\"transfer_ms\":%.3f,\"other_ms\":%.3f}", r ? "," : "", r,
                            1e3 * w->measured_s[r], 1e3 * w->sched_s[r], 1e3 * w->straggler_s[r],
                            1e3 * w->transfer_s[r], 1e3 * w->other_s[r]);
    }
    if (off < (int)jlen - 100) off += snprintf(json + off, jlen - off, "],\"over_cost\":[");
    for (int st = 0; st < w->S && off < (int)jlen - 40; st++)
        off += snprintf(json + off, jlen - off, "%s%.4f", st ? "," : "", w->over[st]);
    if (w->worst >= 0 && to < (int)sizeof split_text - 600)
        snprintf(split_text + to, sizeof split_text - to, "  straggler: %s\n", w->why);
    if (off < (int)jlen - 64 - (int)strlen(w->why))
        snprintf(json + off, jlen - off, "],\"straggler_stage\":%d,\"straggler_rank\":%d,\"straggler\":\"%s\"}",
                 w->worst, w->worst >= 0 ? sched_stage_rank(&R->sc, w->worst) : -1, w->why);
}

/* Rank 0: the measured costs of the S stages (from every rank's chunks, cf[r][c][F B I W]),
 * the baseline (--costs-in, or NULL) and the split; parts[4 r ..] rank r's four parts in ms. */
static int split_on_root(run *R, const double *cf, const double *wait_ms, double xfer, char *json, size_t jlen,
                         double *parts) {
    int S = R->S, V = R->V;
    sched_costs meas, base;
    memset(&base, 0, sizeof base);
    PL_TRY(sched_costs_alloc(&meas, S));
    double *flops = malloc(sizeof(double) * (size_t)(S + R->P)), *ws = flops ? flops + S : NULL;
    int rc = flops ? PL_OK : PL_ENOMEM;
    for (int r = 0; rc == PL_OK && r < R->P; r++) {
        ws[r] = wait_ms[r] / 1e3;
        for (int c = 0; c < V; c++) {
            int st = sched_place_stage(R->sc.place, R->P, r, c);
            const double *v = cf + ((size_t)r * V + c) * 4;
            meas.f[st] = v[0], meas.b[st] = v[1], meas.i[st] = v[2], meas.w[st] = v[3];
        }
    }
    for (int st = 0; rc == PL_OK && st < S; st++) flops[st] = split_stage_flops(&R->sp, &R->cfg, st, R->T);
    char err[1024] = "";
    if (rc == PL_OK && R->o->costs_in[0]) {
        rc = run_costs_read(R, &base, err, sizeof err);
    }
    wait_split w;
    if (rc == PL_OK) rc = wait_split_compute(&R->sc, &meas, R->o->costs_in[0] ? &base : NULL, flops, xfer, ws, &w, err,
                                             sizeof err);
    if (rc == PL_OK) {
        print_wait_split(R, &w, json, jlen);
        for (int r = 0; r < R->P && r < 64; r++) { /* ms, for the trace's counters */
            parts[4 * r] = 1e3 * w.sched_s[r], parts[4 * r + 1] = 1e3 * w.straggler_s[r];
            parts[4 * r + 2] = 1e3 * w.transfer_s[r], parts[4 * r + 3] = 1e3 * w.other_s[r];
        }
        wait_split_free(&w);
    }
    else pl_error("the wait split: %s%s%s", R->o->costs_in[0] ? R->o->costs_in : "", R->o->costs_in[0] ? ": " : "",
                  err[0] ? err : "out of memory");
    free(flops);
    sched_costs_free(&meas);
    sched_costs_free(&base);
    return rc;
}

/* The wait split of a benchmark (waitsplit.h): every rank's mean F, B, I, W seconds per chunk
 * and its wait (ms per step) gathered, a message's cost measured (ping-pong, ranks 0 and 1);
 * rank 0 prints the split and puts it into json; every rank puts its parts on the trace as
 * counters (up to 64 ranks). Collective. */
static int report_wait_split(run *R, double wait_ms, char *json, size_t jlen) {
    int V = R->V, S = R->S;
    const sched_op ops[4] = {SCHED_F, SCHED_B, SCHED_I, SCHED_W};
    double *mine = malloc(sizeof(double) * 4 * V), *all = R->rank == 0 ? malloc(sizeof(double) * (4 * S + R->P)) : NULL;
    if (!mine || (R->rank == 0 && !all)) { free(mine); free(all); return PL_ENOMEM; }
    for (int c = 0; c < V; c++)
        for (int k = 0; k < 4; k++) {
            size_t j = (size_t)c * SCHED_NOPS + ops[k];
            mine[c * 4 + k] = R->eng.n_opc[j] ? R->eng.t_opc[j] / R->eng.n_opc[j] : 0.0;
        }
    int rc = comm_gather(mine, 4 * V, MPI_DOUBLE, all, 0, R->comm, "the gather of action costs");
    if (rc == PL_OK) rc = comm_gather(&wait_ms, 1, MPI_DOUBLE, all ? all + 4 * S : NULL, 0, R->comm,
                                      "the gather of the waits");
    free(mine);
    size_t bytes = (size_t)R->st.N * R->cfg.C * sizeof(float);
    double lat = 0, big = 0;
    char *buf = R->P > 1 && rc == PL_OK ? calloc(bytes, 1) : NULL;
    if (R->P > 1 && rc == PL_OK && !buf) rc = PL_ENOMEM;
    if (R->P > 1 && rc == PL_OK && (rc = pingpong(R, 8, buf, &lat)) == PL_OK) rc = pingpong(R, bytes, buf, &big);
    free(buf);
    double parts[4 * 64] = {0}, mypart[4];
    if (rc == PL_OK && R->rank == 0) rc = split_on_root(R, all, all + 4 * S, big > 0 ? big : lat, json, jlen, parts);
    free(all);
    PL_TRY(comm_agree(R->comm, rc, NULL));
    if (R->P > 64) return PL_OK;
    /* every rank puts its own parts on its track of the trace, as counters */
    PL_MPI_CHECK(MPI_Scatter(parts, 4, MPI_DOUBLE, mypart, 4, MPI_DOUBLE, 0, R->comm));
    const char *names[4] = {"wait: schedule ms", "wait: straggler ms", "wait: transfer ms", "wait: other ms"};
    for (int k = 0; k < 4 && R->eng.tr; k++) trace_counter(R->eng.tr, names[k], mypart[k], pl_now());
    return PL_OK;
}

/* Per-rank figures a benchmark gathers at the end (ms per timed step). */
int report_bench(run *R, const double *step_s, int nsteps) {
    double mine[BENCH_NSTAT];
    int k = R->tm_steps ? R->tm_steps : 1;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    mine[0] = 1e3 * (R->tm[TM_FWD] + R->tm[TM_BWD]) / k;
    mine[1] = 1e3 * R->tm[TM_WAIT] / k;
    mine[2] = 1e3 * R->tm[TM_OPT] / k;
    mine[3] = 1e3 * R->tm[TM_STEP] / k;
    mine[4] = ru.ru_maxrss / 1024.0;
    mine[5] = 0;
    for (int c = 0; c < R->V; c++) mine[5] += R->stv[c].nb; /* blocks this rank runs */
    int threads = R->be->get_threads();
    /* MFU against the peak of the products this run makes: sgemm on the cpu backend, else
     * the backend's own matmul in its precision (bf16 runs against the bf16 peak) */
    int prec = PL_PREC_FP32;
    backend_parse_precision(R->o->precision, &prec);
    if (R->o->peak_gflops > 0) mine[6] = R->o->peak_gflops * threads;
    else if (strcmp(R->be->name, "cpu") == 0) mine[6] = bench_sgemm_gflops(1024, threads, 1.0);
    else mine[6] = bench_matmul_gflops(R->be->name, prec, 1024, threads, 1.0);
    mine[7] = threads;
    /* data parallelism: the reduction wait the backward did not hide, and the optimizer state */
    mine[8] = R->have_dp ? 1e3 * R->dp.t_hidden_wait / k : 0.0;
    mine[9] = (R->have_dp ? (double)R->dp.moment_floats : (double)R->st.nparams) * 2 * sizeof(float) / 1048576.0;
    mine[10] = R->eng.inflight_peak;
    mine[11] = sched_max_inflight(&R->sc, R->rank);
    mine[12] = R->eng.act_bytes_peak / 1048576.0;
    mine[13] = R->have_dp ? R->dp.pending_floats * sizeof(float) / 1048576.0 / k : 0.0;
    mine[14] = R->have_dp ? 1e3 * R->dp.t_gather / k : 0.0;
    mine[15] = R->have_tp ? 1e3 * R->tp.t_sum / k : 0.0;
    mine[16] = R->have_ep ? 1e3 * R->ep.t_a2a / k : 0.0;
    mine[17] = R->have_ep ? 1e3 * R->ep.t_exposed / k : 0.0;
    mine[18] = R->moe_steps ? R->moe_lb / R->moe_steps : 0.0;
    mine[19] = R->moe_steps ? R->moe_dropped / R->moe_steps : 0.0;
    mine[20] = R->have_cp ? 1e3 * R->cp.t_comm / k : 0.0;
    mine[21] = R->have_cp ? 1e3 * R->cp.t_att / k : 0.0;
    static char split_json[16384];
    split_json[0] = split_text[0] = 0;
    if (R->D == 1) PL_TRY(report_wait_split(R, mine[1], split_json, sizeof split_json)); /* printed below the table */
    double *all = R->rank == 0 ? malloc(sizeof mine * R->P) : NULL;
    if (R->rank == 0 && !all) return PL_ENOMEM;
    PL_TRY(comm_gather(mine, BENCH_NSTAT, MPI_DOUBLE, all, 0, R->comm, "the gather of benchmark figures"));
    int rc = PL_OK;
    if (R->rank == 0 && R->t == 0) { /* --tp: TP rank 0's pipeline reports */
        bench_result br;
        memset(&br, 0, sizeof br);
        br.P = R->P;
        br.Tp = R->Tp;
        br.moe = R->cfg.moe.n_experts > 0;
        br.ep = R->have_ep ? R->ep.E : 1;
        br.V = R->V;
        br.M = R->M;
        br.B = R->Bg;
        br.D = R->D / R->C; /* --cp: the C ranks of a replica are counted by br.Cp */
        br.Cp = R->C;
        br.zero = R->o->zero && R->D > 1;
        br.T = R->T;
        snprintf(br.schedule, sizeof br.schedule, "%s", R->sc.name);
        br.nsteps = nsteps;
        br.step_s = step_s;
        br.flops_per_token = model_train_flops_per_token(&R->cfg, R->T);
        sched_sim sim;
        char err[512];
        br.bubble_theoretical = sched_simulate(&R->sc, &sim, err, sizeof err) == 0 ? sim.bubble : NAN;
        if (br.bubble_theoretical == br.bubble_theoretical) sched_sim_free(&sim);
        br.stage_stats = all;
        char what[64];
        snprintf(what, sizeof what, "%s %s matmul", R->be->name, R->o->precision);
        br.peak_what = strcmp(R->be->name, "cpu") == 0 || R->o->peak_gflops > 0 ? NULL : what;
        br.extra_json = split_json[0] ? split_json : NULL;
        rc = bench_report(&br, R->o->json, R->o->csv, R->summary);
        if (split_text[0]) pl_info("%s", split_text);
    }
    free(all);
    PL_TRY(comm_agree(R->comm, rc, NULL));
    if (R->profiled) PL_TRY(report_op_classes(R, k));
    return R->o->costs_out[0] ? report_costs(R) : PL_OK;
}
/* Both ends on this rank as two chunks (the V placement): its wte and the head chunk's copy. */
static int tied_copies_local(run *R, int *same) {
    const param_tensor *t = NULL;
    for (int i = 0; i < R->st.ntensors; i++)
        if (R->st.tensors[i].tied_copy) t = &R->st.tensors[i];
    if (!t) return PL_OK;
    size_t n = t->numel * sizeof(float);
    void *a = NULL, *b = NULL;
    int rc = R->be->map(&a, R->st.wte, n, PL_MAP_READ);
    if (rc == PL_OK) rc = R->be->map(&b, R->st.params + t->offset, n, PL_MAP_READ);
    if (rc == PL_OK) *same = memcmp(a, b, n) == 0;
    else pl_error("backend %s: a host view of the tied embedding: %s", R->be->name, stage_error(&R->st));
    if (b) R->be->unmap(b, R->st.params + t->offset, n, PL_MAP_READ);
    if (a) R->be->unmap(a, R->st.wte, n, PL_MAP_READ);
    return rc;
}

/* The two copies of the tied embedding (stage 0 and the last stage) must be bit-identical. */
static int check_tied_copies(run *R, int *same) {
    *same = 1;
    if (!model_is_tied(&R->cfg)) return PL_OK; /* an untied head: nothing to compare */
    if (R->P > 1 && R->st.has_embed && R->st.has_head) PL_TRY(tied_copies_local(R, same)); /* a V's rank 0 */
    else if (R->P > 1 && (R->st.has_embed || R->st.has_head)) {
        size_t n = arch_dim_value(&R->st.cfg, 0, AD_VP) * R->cfg.C; /* --tp: this rank's vocabulary slice */
        float *other = malloc(n * sizeof(float));
        int peer = R->st.has_embed ? 1 : 0; /* rank within the tied communicator */
        if (!other) return PL_ENOMEM;
        MPI_Request rq[2];
        comm_what w = {"the tied-embedding comparison", peer ? R->P - 1 : 0, -1, -1};
        void *mine = NULL;
        int rc = R->be->map(&mine, R->st.wte, n * sizeof(float), PL_MAP_READ);
        if (rc != PL_OK) {
            pl_error("backend %s: a host view of the tied embedding: %s", R->be->name, stage_error(&R->st));
            free(other);
            return rc;
        }
        if ((rc = MPI_Irecv(other, (int)n, MPI_FLOAT, peer, 7, R->tied, &rq[0])) == MPI_SUCCESS &&
            (rc = MPI_Isend(mine, (int)n, MPI_FLOAT, peer, 7, R->tied, &rq[1])) == MPI_SUCCESS)
            rc = comm_waitall(2, rq, &w);
        else
            rc = PL_EMPI;
        if (rc == PL_OK) *same = memcmp(other, mine, n * sizeof(float)) == 0;
        int rc2 = R->be->unmap(mine, R->st.wte, n * sizeof(float), PL_MAP_READ);
        free(other);
        PL_TRY(rc);
        PL_TRY(rc2);
    }
    PL_TRY(comm_allreduce(MPI_IN_PLACE, same, 1, MPI_INT, MPI_MIN, R->comm, "the tied-embedding comparison"));
    if (R->P > 1) {
        if (*same) pl_info("tied embedding: the copies on stage 0 and stage %d are bit-identical\n", R->S - 1);
        else if (R->rank == 0) pl_error("tied embedding: the copies on stage 0 and stage %d differ", R->S - 1);
    }
    return PL_OK;
}
/* The end of a run: the tied-copy check, the in-flight peaks, the "end" metrics line. */
int report_finish(run *R, int first_step, int done_steps, double wall, double last_loss, int stopped) {
    int tied_same = 1, tp_same = 1;
    PL_TRY(check_tied_copies(R, &tied_same));
    if (R->have_tp) { /* --tp: the replicated tensors must have stayed the same bits on the T ranks */
        char name[64];
        PL_TRY(tp_check_replicas(&R->tp, &R->st, &tp_same, name, sizeof name));
        if (!tp_same) pl_error("tensor parallel: the replicated tensor %s differs across the TP ranks", name);
        PL_TRY(comm_allreduce(MPI_IN_PLACE, &tp_same, 1, MPI_INT, MPI_MIN, R->world, "the TP replica comparison"));
        if (tp_same) pl_info("tensor parallel: the replicated tensors are bit-identical on the %d TP ranks of every "
                             "stage\n", R->Tp);
    }
    /* the engine's own accounting of activations held at once, per stage */
    int *peaks = calloc((size_t)R->P, sizeof(int));
    if (!peaks) return PL_ENOMEM;
    int rc = comm_gather(&R->eng.inflight_peak, 1, MPI_INT, peaks, 0, R->comm, "the gather of in-flight peaks");
    if (rc == PL_OK && R->rank == 0) {
        char l[64], buf[2048];
        int off = 0;
        for (int s = 0; s < R->P && off < (int)sizeof buf - 16; s++)
            off += snprintf(buf + off, sizeof buf - off, "%s%d", s ? "," : "", peaks[s]);
        metrics_num(l, sizeof l, last_loss);
        metrics_line(&R->mx, "{\"event\":\"end\",\"steps\":%d,\"final_loss\":%s,\"wall_s\":%.3f,"
                     "\"inflight_peak\":[%s],\"tied_identical\":%s%s}", done_steps, l, wall, buf,
                     tied_same ? "true" : "false", stopped ? ",\"preempted\":true" : "");
        if (done_steps >= first_step)
            pl_info("done: %d steps in %.1f s, final loss %.6f\n", done_steps - first_step + 1, wall, last_loss);
        else
            pl_info("done: no steps run (the checkpoint is already at step %d)\n", first_step - 1);
    }
    free(peaks);
    PL_TRY(rc);
    return tied_same && tp_same ? PL_OK : PL_ENUM;
}
/* Step lines, metrics and the progress bar (rank 0). */
void report_step(run *R, int step, int first_step, int last_step, double loss, double lr, double norm,
                        double secs, double t_start) {
    if (R->rank != 0) return;
    const pl_options *o = R->o;
    double ms = 1e3 * secs, tps = (double)R->Bg * R->T / secs;
    if (step % o->log_every == 0 || step == last_step) {
        if (R->tty) fprintf(pl_out, "\r\033[K");
        pl_info("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %8.1f ms | %9.0f tok/s\n", step, last_step, loss,
                lr, norm, ms, tps);
    }
    char l[64], g[64];
    metrics_num(l, sizeof l, loss);
    metrics_num(g, sizeof g, norm);
    metrics_line(&R->mx, "{\"event\":\"step\",\"step\":%d,\"loss\":%s,\"lr\":%.9g,\"grad_norm\":%s,"
                 "\"step_ms\":%.3f,\"tokens_per_s\":%.1f}", step, l, lr, g, ms, tps);
    draw_progress(R, step - first_step + 1, last_step - first_step + 1, pl_now() - t_start);
}
