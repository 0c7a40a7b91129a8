/*
 * train.c — the training loop of one rank: set-up, steps, evaluation, reporting.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>
#include "pipelm/bench.h"
#include "pipelm/blas.h"
#include "pipelm/ckpt.h"
#include "pipelm/comm.h"
#include "pipelm/common.h"
#include "pipelm/config.h"
#include "pipelm/data.h"
#include "pipelm/engine.h"
#include "pipelm/files.h"
#include "pipelm/layout.h"
#include "pipelm/llmc.h"
#include "pipelm/metrics.h"
#include "pipelm/model.h"
#include "pipelm/sched.h"
#include "pipelm/signals.h"
#include "pipelm/split.h"
#include "pipelm/trace.h"
#include "pipelm/train.h"

/* Per-rank timers in seconds, accumulated between reports. */
enum { TM_FWD, TM_BWD, TM_WAIT, TM_OPT, TM_STEP, TM_N };

/* Everything one rank needs during a run. */
typedef struct {
    const pl_options *o;
    MPI_Comm comm, tied;
    int rank, P, B, T, M;
    gpt2_config cfg;
    split sp;
    sched sc;
    stage st;
    engine eng;
    data_source train, val;
    int have_train, have_val;
    int *inputs, *targets;
    metrics mx;
    int tty;
    double tm[TM_N];
    int tm_steps;
    int polite;
    layout lay;
} run;

double train_lr(const pl_options *o, int step) {
    if (o->warmup_steps > 0 && step <= o->warmup_steps) return o->lr * step / o->warmup_steps;
    if (strcmp(o->lr_schedule, "constant") == 0 || o->steps <= o->warmup_steps) return o->lr;
    double progress = (double)(step - o->warmup_steps) / (double)(o->steps - o->warmup_steps);
    if (progress > 1.0) progress = 1.0;
    return o->min_lr + 0.5 * (o->lr - o->min_lr) * (1.0 + cos(M_PI * progress));
}

/* All ranks agree on a status: the worst code wins; rank 0 says who failed. */
static int agree(run *R, int rc, const char *phase) {
    int who = -1, out = comm_agree(R->comm, rc, &who);
    if (out != PL_OK && R->rank == 0 && R->P > 1 && who >= 0)
        fprintf(stderr, "pipelm: stopping all %d ranks: rank %d failed during %s (message above)\n",
                R->P, who, phase);
    return out;
}

/* Resolve the model dimensions: from --init's header, else from the options. */
static int resolve_config(run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    if (o->init[0]) {
        int version;
        PL_TRY(llmc_read_config(o->init, &R->cfg, &version, err, errlen));
        if (o->set_dims || o->set_vocab) {
            const char *names[] = {"vocab-size", "max-seq-len", "n-layer", "n-head", "n-embd"};
            int a[] = {o->vocab_size, o->max_seq_len, o->n_layer, o->n_head, o->n_embd};
            int b[] = {R->cfg.V, R->cfg.maxT, R->cfg.L, R->cfg.NH, R->cfg.C};
            for (int i = 0; i < 5; i++)
                if ((i == 0 ? o->set_vocab : o->set_dims) && a[i] != b[i]) {
                    snprintf(err, errlen, "--%s %d conflicts with %.512s, which has %s %d", names[i], a[i],
                             o->init, names[i], b[i]);
                    return PL_EINVAL;
                }
        }
    } else {
        int V = o->vocab_size, dv = data_spec_vocab(o->data);
        if (dv && !o->set_vocab) V = dv;
        PL_TRY(gpt2_config_make(&R->cfg, V, o->max_seq_len, o->n_layer, o->n_head, o->n_embd, err, errlen));
    }
    if (R->T > R->cfg.maxT) {
        snprintf(err, errlen, "--seq-len %d exceeds the model's max-seq-len %d", R->T, R->cfg.maxT);
        return PL_EINVAL;
    }
    return PL_OK;
}

/* Every output path must be writable before step 1: work is not lost at the end. */
static int check_outputs(const run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    if (R->rank == 0 && o->save_final[0]) PL_TRY(pl_check_output_file(o->save_final, "--save-final", err, errlen));
    if (R->rank == 0 && o->trace[0]) PL_TRY(pl_check_output_file(o->trace, "--trace", err, errlen));
    if (R->rank == 0 && o->dump_grads[0]) PL_TRY(pl_check_output_file(o->dump_grads, "--dump-grads", err, errlen));
    if (o->bench && R->rank == 0 && o->json[0]) PL_TRY(pl_check_output_file(o->json, "--json", err, errlen));
    if (o->bench && R->rank == 0 && o->csv[0]) PL_TRY(pl_check_output_file(o->csv, "--csv", err, errlen));
    if (o->ckpt_dir[0] && !o->bench) PL_TRY(pl_check_output_dir(o->ckpt_dir, "--ckpt-dir", err, errlen));
    return PL_OK;
}

/* Split, schedule, stage, data, metrics: everything that can fail before step 1. */
static int setup(run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    PL_TRY(check_outputs(R, err, errlen));
    if (o->fail_rank == R->rank && o->fail_step == 0 && strcmp(o->fail_at, "during") == 0) {
        snprintf(err, errlen, "injected failure during set-up (--fail-rank %d --fail-step 0)", o->fail_rank);
        return PL_EPEER;
    }
    const backend *be = backend_find(o->backend);
    if (!be) {
        snprintf(err, errlen, "unknown or unbuilt backend '%s' (this build has: cpu)", o->backend);
        return PL_EINVAL;
    }
    PL_TRY(be->init(err, errlen));
    PL_TRY(resolve_config(R, err, errlen));
    PL_TRY(split_make(&R->sp, o->split, &R->cfg, R->P, R->M, R->B / R->M, R->T, err, errlen));
    if (o->schedule_csv[0]) {
        FILE *f = NULL;
        PL_TRY(pl_open_input(o->schedule_csv, "schedule file", SCHED_CSV_MAX_BYTES, &f, err, errlen));
        int rc = sched_read_csv(f, "csv", &R->sc, err, errlen);
        fclose(f);
        PL_TRY(rc ? PL_EINVAL : PL_OK);
        if (R->sc.P != R->P) {
            snprintf(err, errlen, "schedule file %.512s has %d rows (ranks) but the job has %d ranks",
                     o->schedule_csv, R->sc.P, R->P);
            return PL_EINVAL;
        }
        if (R->sc.M != R->M) {
            snprintf(err, errlen, "schedule file %.512s uses %d micro-batches but --microbatches is %d",
                     o->schedule_csv, R->sc.M, R->M);
            return PL_EINVAL;
        }
    } else if (sched_build(o->schedule, R->P, R->M, &R->sc, err, errlen) != 0) {
        return PL_EINVAL;
    }
    if (sched_validate(&R->sc, err, errlen) != 0) return PL_EINVAL;
    int s = R->rank, P = R->P;
    int nslots = sched_max_inflight(&R->sc, s);
    PL_TRY(stage_init(&R->st, &R->cfg, R->sp.first[s], R->sp.first[s] + R->sp.blocks[s], s == 0,
                      s == P - 1, R->B / R->M, R->T, nslots > 0 ? nslots : 1, be, err, errlen));
    if (o->init[0]) PL_TRY(llmc_load_stage(o->init, &R->st, err, errlen));
    else stage_init_params(&R->st, (unsigned long long)o->seed);
    PL_TRY(engine_init(&R->eng, &R->st, &R->sc, R->comm, err, errlen));
    R->eng.fail_rank = o->fail_rank;
    R->eng.fail_step = o->fail_step;
    R->eng.fail_during = strcmp(o->fail_at, "during") == 0;
    /* data: the first stage needs inputs, the last the targets */
    if (s == 0 || s == P - 1) {
        PL_TRY(data_open(&R->train, o->data, R->cfg.V, o->markov_branch, (uint64_t)o->data_seed, 0,
                         err, errlen));
        R->have_train = 1;
        PL_TRY(data_check_batch(&R->train, R->B, R->T, err, errlen));
        const char *vspec = o->val_data[0] ? o->val_data : strcmp(o->data, "markov") == 0 ? "markov" : NULL;
        if (vspec) {
            PL_TRY(data_open(&R->val, vspec, R->cfg.V, o->markov_branch, (uint64_t)o->data_seed,
                             1ULL << 60, err, errlen));
            R->have_val = 1;
            PL_TRY(data_check_batch(&R->val, R->B, R->T, err, errlen));
        }
        R->inputs = malloc(sizeof(int) * (size_t)R->B * R->T);
        R->targets = malloc(sizeof(int) * (size_t)R->B * R->T);
        if (!R->inputs || !R->targets) {
            snprintf(err, errlen, "out of memory for the batch");
            return PL_ENOMEM;
        }
    }
    if (R->rank == 0 && o->metrics[0]) PL_TRY(metrics_open(&R->mx, o->metrics, err, errlen));
    return PL_OK;
}

/* Rank 0 prints the stage table: who owns what, and its estimated cost. */
static void print_stage_table(run *R) {
    const split *sp = &R->sp;
    int Bm = R->B / R->M;
    pl_info("model: V=%d (padded %d) C=%d L=%d NH=%d maxT=%d, %zu parameters\n", R->cfg.V, R->cfg.Vp,
            R->cfg.C, R->cfg.L, R->cfg.NH, R->cfg.maxT, gpt2_num_params(&R->cfg));
    char lay[512];
    layout_describe(&R->lay, lay, sizeof lay);
    pl_info("layout: %s\n", lay);
    pl_info("BLAS: OpenBLAS %s, kernel %s (%s)%s\n", blas_flavour(), blas_kernel(), blas_kernel_origin(),
            getenv("PIPELM_WAIT_CHOSEN") ? "; OMP_WAIT_POLICY=PASSIVE set by pipelm (two thread pools)" : "");
    pl_info("pipeline: %d stage%s, schedule %s, %d micro-batch%s of %d x %d tokens, split %s\n",
            R->P, R->P > 1 ? "s" : "", R->sc.name, R->M, R->M > 1 ? "es" : "", Bm, R->T, R->o->split);
    pl_info("  stage  rank  blocks    parts        params   GFLOP/mb(f+b)  act MB/mb  in-flight\n");
    for (int s = 0; s < sp->P; s++) {
        char parts[32];
        snprintf(parts, sizeof parts, "%s%s", s == 0 ? "E" : "", s == sp->P - 1 ? "H" : "");
        char blocks[32];
        if (sp->blocks[s]) snprintf(blocks, sizeof blocks, "%d-%d", sp->first[s], sp->first[s] + sp->blocks[s] - 1);
        else snprintf(blocks, sizeof blocks, "-");
        double gf = 3.0 * split_stage_flops(sp, &R->cfg, s, R->T) * Bm * R->T / 1e9;
        pl_info("  %5d  %4d  %-8s  %-5s  %12zu   %13.3f  %9.1f  %9d\n", s, s, blocks, parts,
                split_stage_params(sp, &R->cfg, s), gf,
                split_stage_act_bytes(sp, &R->cfg, s, Bm, R->T) / 1048576.0, sched_max_inflight(&R->sc, s));
    }
    pl_info("  (E = embeddings, H = final norm + LM head + loss; blocks are layer numbers)\n");
}

/* What one step's all-reduce tells every rank besides the norm and the loss. */
typedef struct {
    int stop_sig, stop_rank;   /* a stop signal seen by a rank (the lowest), or 0 / -1 */
    int fwd_stage, fwd_mb;     /* lowest stage whose forward gave a non-finite value, or -1 */
} step_news;

/* Squared gradient norms per part (slot 0 embeddings, 1+l block l, L+1 final norm), the loss
 * sum in slot L+2, then per rank its stop signal and its first non-finite forward (1 + mb),
 * summed over ranks: every slot has one owner, so the sums are exact. */
static int reduce_norm_loss(run *R, double loss_sum, double *norm, double *loss, int *bad_slot, step_news *nw) {
    stage *st = &R->st;
    int L = R->cfg.L, P = R->P, n = L + 3 + 2 * P;
    double *v = calloc(n, sizeof(double)), *g = calloc(n, sizeof(double));
    if (!v || !g) { free(v); free(g); return PL_ENOMEM; }
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        if (t->kind == P_WTE && !st->has_embed) continue; /* the tied copy counts once */
        int slot = t->layer >= 0 ? 1 + t->layer : (t->kind == P_LNFW || t->kind == P_LNFB) ? L + 1 : 0;
        v[slot] += st->be->sumsq(st->grads + t->offset, t->numel);
    }
    if (st->has_head) v[L + 2] = loss_sum;
    v[L + 3 + R->rank] = signals_stop_pending();
    v[L + 3 + P + R->rank] = R->eng.first_bad_fwd + 1;
    int rc = comm_allreduce(v, g, n, MPI_DOUBLE, MPI_SUM, R->comm, "the all-reduce of the gradient norm and loss");
    double total = 0.0;
    *bad_slot = -1;
    for (int i = 0; i <= L + 1; i++) {
        total += g[i];
        if (!isfinite(g[i]) && *bad_slot < 0) *bad_slot = i;
    }
    *norm = sqrt(total);
    *loss = g[L + 2] / ((double)R->B * R->T);
    nw->stop_sig = 0;
    nw->stop_rank = nw->fwd_stage = nw->fwd_mb = -1;
    for (int r = P - 1; r >= 0; r--) {
        if (g[L + 3 + r] > 0) { nw->stop_sig = (int)g[L + 3 + r]; nw->stop_rank = r; }
        if (g[L + 3 + P + r] > 0) { nw->fwd_stage = r; nw->fwd_mb = (int)g[L + 3 + P + r] - 1; }
    }
    free(v);
    free(g);
    return rc;
}

/* Index of this stage's first tensor whose values (grads: its gradient) are not finite, or -1. */
static int first_nonfinite_tensor(const stage *st, int grads) {
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        if (!isfinite(st->be->sumsq((grads ? st->grads : st->params) + t->offset, t->numel))) return i;
    }
    return -1;
}

/* After a non-finite loss or gradient: find where it first appears. Every rank reaches this
 * (the norm all-reduce told them all); each names its first non-finite parameter, and rank 0
 * says which stage's forward went non-finite first and whether its weights were already bad. */
static void explain_nonfinite(run *R, int step, const step_news *nw, double loss, double norm, const char *where) {
    int mine[2] = {first_nonfinite_tensor(&R->st, 0), first_nonfinite_tensor(&R->st, 1)};
    int *all = calloc(2 * (size_t)R->P, sizeof(int));
    char (*names)[32] = calloc((size_t)R->P, 32);
    char name[32] = "";
    if (mine[0] >= 0) snprintf(name, sizeof name, "%s", R->st.tensors[mine[0]].name);
    if (mine[0] >= 0)
        pl_error("step %d: parameter %s of stage %d is not finite (a bad --init or checkpoint, or an "
                 "update that overflowed)", step, name, R->rank);
    int ok = all && names;
    MPI_Request rq[2];
    comm_what w = {"the NaN diagnosis", -1, -1, step};
    if (ok && MPI_Iallgather(mine, 2, MPI_INT, all, 2, MPI_INT, R->comm, &rq[0]) == MPI_SUCCESS &&
        MPI_Iallgather(name, 32, MPI_CHAR, names, 32, MPI_CHAR, R->comm, &rq[1]) == MPI_SUCCESS)
        ok = comm_waitall(2, rq, &w) == PL_OK;
    if (R->rank == 0) {
        int ps = -1;
        for (int r = 0; ok && r < R->P && ps < 0; r++) if (all[2 * r] >= 0) ps = r;
        if (ps >= 0)
            pl_error("step %d: non-finite loss %g / gradient norm %g: the weights of stage %d (rank %d) already "
                     "hold a non-finite value, first in %s; stopping all ranks", step, loss, norm, ps, ps, names[ps]);
        else if (nw->fwd_stage >= 0)
            pl_error("step %d: non-finite loss %g / gradient norm %g: it first appears in the forward of stage %d "
                     "(rank %d), micro-batch %d, whose weights are finite: the activations overflowed; stopping "
                     "all ranks (try a lower --lr or --grad-clip)", step, loss, norm, nw->fwd_stage, nw->fwd_stage,
                     nw->fwd_mb);
        else
            pl_error("step %d: non-finite gradient (norm %g, loss %g) first in %s, with a finite forward: the "
                     "backward overflowed; stopping all ranks (try a lower --lr or --grad-clip)", step, norm, loss, where);
    }
    free(all);
    free(names);
}

/* Name of a norm slot for messages. */
static void slot_name(const run *R, int slot, char *buf, size_t len) {
    if (slot == 0) snprintf(buf, len, "the embeddings (stage 0)");
    else if (slot == R->cfg.L + 1) snprintf(buf, len, "the final LayerNorm (stage %d)", R->P - 1);
    else {
        int l = slot - 1, s = 0;
        while (s < R->P - 1 && l >= R->sp.first[s] + R->sp.blocks[s]) s++;
        snprintf(buf, len, "block %d (stage %d, rank %d)", l, s, s);
    }
}

/* Gather every rank's timers (ms per step over the interval) and print min/median/max. */
static int report_timers(run *R, int step) {
    double mine[TM_N + 1], *all = NULL;
    int k = R->tm_steps ? R->tm_steps : 1;
    for (int i = 0; i < TM_N; i++) mine[i] = 1e3 * R->tm[i] / k;
    mine[TM_N] = mine[TM_STEP] - mine[TM_FWD] - mine[TM_BWD] - mine[TM_WAIT] - mine[TM_OPT];
    if (mine[TM_N] < 0) mine[TM_N] = 0;
    if (R->rank == 0) all = malloc(sizeof(double) * (TM_N + 1) * R->P);
    if (R->rank == 0 && !all) return PL_ENOMEM;
    PL_TRY(comm_gather(mine, TM_N + 1, MPI_DOUBLE, all, 0, R->comm, "the gather of the timers"));
    if (R->rank == 0 && all) {
        const char *names[TM_N + 1] = {"forward", "backward", "MPI wait", "optimizer", "step", "idle"};
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
                            "\"idle_ms\":%.3f,\"step_ms\":%.3f}", r ? "," : "", r, t[TM_FWD], t[TM_BWD],
                            t[TM_WAIT], t[TM_OPT], t[TM_N], t[TM_STEP]);
        }
        snprintf(line + off, sizeof line - off, "]}");
        metrics_line(&R->mx, "%s", line);
        free(all);
    }
    memset(R->tm, 0, sizeof R->tm);
    R->tm_steps = 0;
    return PL_OK;
}

/* Validation: val_batches batches forward only; every rank gets the mean loss. */
static int evaluate(run *R, double *val_loss) {
    double sum = 0.0;
    for (int k = 0; k < R->o->val_batches; k++) {
        char err[4400];
        if (R->have_val && data_read_batch(&R->val, k, R->B, R->T, R->inputs, R->targets, err, sizeof err) != PL_OK) {
            pl_error("%s", err);
            return PL_EIO;
        }
        double l = 0.0;
        PL_TRY(engine_eval(&R->eng, R->inputs, R->targets, &l));
        sum += l;
    }
    double in = R->st.has_head ? sum : 0.0, out = 0.0;
    PL_TRY(comm_allreduce(&in, &out, 1, MPI_DOUBLE, MPI_SUM, R->comm, "the all-reduce of the validation loss"));
    *val_loss = out / ((double)R->o->val_batches * R->B * R->T);
    return PL_OK;
}

/* Validation at a step, if any rank has validation data; prints and records val_loss. */
static int maybe_evaluate(run *R, int step) {
    int anyval = R->have_val;
    PL_TRY(comm_allreduce(MPI_IN_PLACE, &anyval, 1, MPI_INT, MPI_MAX, R->comm, "the validation check"));
    if (!anyval) return PL_OK;
    double vl;
    PL_TRY(evaluate(R, &vl));
    if (R->tty && R->rank == 0) fprintf(pl_out, "\r\033[K");
    pl_info("val   %5d | val_loss %.6f\n", step, vl);
    metrics_line(&R->mx, "{\"event\":\"val\",\"step\":%d,\"val_loss\":%.17g}", step, vl);
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

/* One optimizer step: tied-gradient sum, norm and loss, clipping, AdamW on every tensor. */
static int optimizer_step(run *R, int step, double loss_sum, double *loss, double *norm, double lr, step_news *nw) {
    stage *st = &R->st;
    const pl_options *o = R->o;
    size_t wte_n = (size_t)R->cfg.Vp * R->cfg.C;
    /* dwte = embedding share + head share: added locally on one rank, summed across two */
    stage_tied_grads_local(st);
    if (R->P > 1 && (st->has_embed || st->has_head))
        PL_TRY(comm_allreduce(MPI_IN_PLACE, st->dwte, (int)wte_n, MPI_FLOAT, MPI_SUM, R->tied,
                              "the all-reduce of the tied embedding's gradient"));
    int bad;
    PL_TRY(reduce_norm_loss(R, loss_sum, norm, loss, &bad, nw));
    if (bad >= 0 || !isfinite(*loss)) {
        char where[128] = "the loss";
        if (bad >= 0) slot_name(R, bad, where, sizeof where);
        explain_nonfinite(R, step, nw, *loss, *norm, where);
        return PL_ENUM;
    }
    /* a model that guesses uniformly scores ln(V): far above it, the run has diverged */
    double lnV = log((double)R->cfg.V), limit = fmax(2.0 * lnV, lnV + 10.0);
    if (*loss > limit) {
        if (R->rank == 0)
            pl_error("step %d: loss %.4f is far above ln(V) = %.4f (uniform guessing; limit %.4f): the run has "
                     "diverged; stopping all ranks before it reaches a checkpoint (try a lower --lr)",
                     step, *loss, lnV, limit);
        return PL_ENUM;
    }
    if (step == 1 && o->dump_grads[0]) PL_TRY(llmc_save(o->dump_grads, st, 1, R->comm));
    if (o->grad_clip > 0 && *norm > o->grad_clip) {
        float s = (float)(o->grad_clip / (*norm + 1e-6));
        st->be->scale(st->grads, s, st->nparams);
    }
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        st->be->adamw(st->params + t->offset, st->grads + t->offset, st->m + t->offset,
                      st->v + t->offset, t->numel, (float)lr, (float)o->beta1, (float)o->beta2,
                      (float)o->eps, t->decay ? (float)o->weight_decay : 0.0f, step);
    }
    return PL_OK;
}

/* Threads and binding per rank (layout.c); when ranks x threads exceed the CPUs, waiting
 * ranks yield their core (R->polite) and the user is told. */
static int set_threads(run *R) {
    PL_TRY(layout_choose(&R->lay, R->comm, R->o->threads));
    backend_cpu_set_threads(R->lay.threads);
    R->polite = R->lay.oversubscribed;
    if (R->polite)
        pl_info("note: %d rank%s x %d thread%s on %d CPUs oversubscribe them: expect slow steps "
                "(waiting ranks yield their core)\n", R->lay.local_ranks, R->lay.local_ranks > 1 ? "s" : "",
                R->lay.threads, R->lay.threads > 1 ? "s" : "", R->lay.cpus);
    return PL_OK;
}

/* The "run" line of the metrics file. */
static void write_run_line(run *R) {
    if (!R->mx.f) return;
    FILE *f = R->mx.f;
    char ent[64];
    metrics_num(ent, sizeof ent, R->have_train ? R->train.entropy : NAN);
    fprintf(f, "{\"event\":\"run\",\"version\":\"%s\",\"config\":", PACKAGE_VERSION);
    config_write_json(R->o, f);
    fprintf(f, ",\"model\":{\"vocab_size\":%d,\"padded_vocab_size\":%d,\"max_seq_len\":%d,\"n_layer\":%d,"
            "\"n_head\":%d,\"n_embd\":%d,\"params\":%zu}", R->cfg.V, R->cfg.Vp, R->cfg.maxT, R->cfg.L,
            R->cfg.NH, R->cfg.C, gpt2_num_params(&R->cfg));
    fprintf(f, ",\"ranks\":%d,\"stages\":%d,\"split\":", R->P, R->P);
    split_write_json(&R->sp, f);
    fprintf(f, ",\"schedule\":\"%s\",\"microbatches\":%d,\"data\":\"%s\",\"entropy_floor\":%s}\n",
            R->sc.name, R->M, R->have_train ? R->train.desc : "", ent);
    fflush(f);
}

/* The training state that goes into a checkpoint beside the tensors. */
static void fill_meta(const run *R, int step, ckpt_meta *m) {
    const pl_options *o = R->o;
    memset(m, 0, sizeof *m);
    m->step = step;
    m->tokens_seen = (long long)step * R->B * R->T;
    m->data_pos = step; /* batch k of the data source is read at step k+1 */
    m->seed = o->seed;
    m->data_seed = o->data_seed;
    snprintf(m->data, sizeof m->data, "%.500s", o->data);
    m->lr = o->lr;
    m->min_lr = o->min_lr;
    m->beta1 = o->beta1;
    m->beta2 = o->beta2;
    m->eps = o->eps;
    m->weight_decay = o->weight_decay;
    m->grad_clip = o->grad_clip;
    m->warmup_steps = o->warmup_steps;
    m->total_steps = o->steps;
    snprintf(m->lr_schedule, sizeof m->lr_schedule, "%s", o->lr_schedule);
    m->batch = R->B;
    m->seq_len = R->T;
    m->microbatches = R->M;
    snprintf(m->schedule, sizeof m->schedule, "%s", R->sc.name);
    m->nstages = R->P;
    for (int s = 0; s < R->P && s < CKPT_MAX_STAGES; s++) m->split[s] = R->sp.blocks[s];
    m->markov_branch = o->markov_branch; /* the stream of "markov" data depends on it */
}

/* Collective: save a checkpoint after `step`, reporting its size and bandwidth. */
static int save_checkpoint(run *R, int step) {
    ckpt_meta m;
    fill_meta(R, step, &m);
    char path[PL_PATH + 64], err[1024] = "";
    double bytes = 0, t0 = pl_now();
    trace_event(R->eng.tr, "checkpoint", "ckpt", -1, t0, t0);
    int rc = ckpt_save(R->o->ckpt_dir, &R->st, &m, R->o->ckpt_keep, R->comm, path, sizeof path, &bytes, err, sizeof err);
    double t1 = pl_now();
    trace_event(R->eng.tr, "checkpoint", "ckpt", -1, t0, t1);
    if (rc != PL_OK) {
        if (err[0]) pl_error("checkpoint at step %d: %s", step, err);
        char prev[PL_PATH + 64], e2[256];
        if (R->rank == 0 && ckpt_resolve(R->o->ckpt_dir, prev, sizeof prev, e2, sizeof e2) == PL_OK)
            pl_error("checkpoint at step %d failed; the previous checkpoint %s is intact", step, prev);
        else if (R->rank == 0)
            pl_error("checkpoint at step %d failed; there is no earlier checkpoint in %s", step, R->o->ckpt_dir);
        return rc;
    }
    pl_info("checkpoint %s: step %d, %.1f MB in %.2f s (%.1f MB/s)\n", path, step, bytes / 1e6, t1 - t0,
            bytes / 1e6 / (t1 - t0 > 0 ? t1 - t0 : 1e-9));
    return PL_OK;
}

/* Collective: resume from --resume (a file, or the newest in --ckpt-dir); *first_step is the
 * step after the saved one. Settings that would change the data stream must match. */
static int resume_checkpoint(run *R, int *first_step) {
    const pl_options *o = R->o;
    char path[PL_PATH + 64], err[1024] = "";
    int rc = ckpt_resolve(strcmp(o->resume, "latest") == 0 ? o->ckpt_dir : o->resume, path, sizeof path, err, sizeof err);
    if (rc != PL_OK) {
        if (R->rank == 0) pl_error("--resume: %s", err);
        return rc; /* every rank resolved the same name the same way */
    }
    ckpt_meta m;
    double bytes = 0, t0 = pl_now();
    rc = ckpt_load(path, &R->st, &m, R->comm, &bytes, err, sizeof err);
    double t1 = pl_now();
    if (rc != PL_OK) {
        if (err[0]) pl_error("resuming from %s: %s", path, err);
        return rc;
    }
    const char *what = NULL;
    char a[600] = "", b[600] = "";
    if (m.batch != R->B) { what = "batch"; snprintf(a, sizeof a, "%d", m.batch); snprintf(b, sizeof b, "%d", R->B); }
    else if (m.seq_len != R->T) { what = "seq-len"; snprintf(a, sizeof a, "%d", m.seq_len); snprintf(b, sizeof b, "%d", R->T); }
    else if (strcmp(m.data, o->data) != 0) { what = "data"; snprintf(a, sizeof a, "%.500s", m.data); snprintf(b, sizeof b, "%.500s", o->data); }
    else if (m.data_seed != o->data_seed) { what = "data-seed"; snprintf(a, sizeof a, "%lld", m.data_seed); snprintf(b, sizeof b, "%lld", o->data_seed); }
    else if (m.markov_branch > 0 && m.markov_branch != o->markov_branch && strcmp(o->data, "markov") == 0) {
        what = "markov-branch";
        snprintf(a, sizeof a, "%d", m.markov_branch);
        snprintf(b, sizeof b, "%d", o->markov_branch);
    }
    if (!what && m.markov_branch <= 0 && strcmp(o->data, "markov") == 0 && R->rank == 0)
        fprintf(stderr, "pipelm: rank 0: note: %s does not record --markov-branch (saved by an older pipelm): "
                "cannot check that this run's --markov-branch %d is the one it was trained with\n", path,
                o->markov_branch);
    if (what) {
        if (R->rank == 0)
            pl_error("cannot resume from %s: it was saved with --%s %s but this run has --%s %s", path, what, a, what, b);
        return PL_EINVAL;
    }
    *first_step = (int)m.step + 1;
    char split[256] = "";
    for (int s = 0, off = 0; s < m.nstages && s < CKPT_MAX_STAGES && off < (int)sizeof split - 16; s++)
        off += snprintf(split + off, sizeof split - off, "%s%d", s ? "," : "", m.split[s]);
    pl_info("resumed from %s: step %lld (saved on %d stage%s, split %s), %.1f MB in %.2f s (%.1f MB/s)\n", path,
            m.step, m.nstages, m.nstages > 1 ? "s" : "", split, bytes / 1e6, t1 - t0,
            bytes / 1e6 / (t1 - t0 > 0 ? t1 - t0 : 1e-9));
    return PL_OK;
}

/* Per-rank figures a benchmark gathers at the end (ms per timed step). */
static int bench_finish(run *R, const double *step_s, int nsteps) {
    double mine[8];
    int k = R->tm_steps ? R->tm_steps : 1;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    mine[0] = 1e3 * (R->tm[TM_FWD] + R->tm[TM_BWD]) / k;
    mine[1] = 1e3 * R->tm[TM_WAIT] / k;
    mine[2] = 1e3 * R->tm[TM_OPT] / k;
    mine[3] = 1e3 * R->tm[TM_STEP] / k;
    mine[4] = ru.ru_maxrss / 1024.0;
    mine[5] = R->st.nb;
    mine[6] = R->o->peak_gflops > 0 ? R->o->peak_gflops * backend_cpu_get_threads()
                                    : bench_sgemm_gflops(1024, backend_cpu_get_threads(), 1.0);
    mine[7] = backend_cpu_get_threads();
    double *all = R->rank == 0 ? malloc(sizeof mine * R->P) : NULL;
    if (R->rank == 0 && !all) return PL_ENOMEM;
    PL_TRY(comm_gather(mine, 8, MPI_DOUBLE, all, 0, R->comm, "the gather of benchmark figures"));
    int rc = PL_OK;
    if (R->rank == 0) {
        bench_result br;
        memset(&br, 0, sizeof br);
        br.P = R->P;
        br.M = R->M;
        br.B = R->B;
        br.T = R->T;
        snprintf(br.schedule, sizeof br.schedule, "%s", R->sc.name);
        br.nsteps = nsteps;
        br.step_s = step_s;
        br.flops_per_token = 6.0 * gpt2_num_params(&R->cfg) + 6.0 * R->cfg.L * R->cfg.C * R->T;
        sched_sim sim;
        char err[512];
        br.bubble_theoretical = sched_simulate(&R->sc, &sim, err, sizeof err) == 0 ? sim.bubble : NAN;
        if (br.bubble_theoretical == br.bubble_theoretical) sched_sim_free(&sim);
        br.stage_stats = all;
        rc = bench_report(&br, R->o->json, R->o->csv);
        free(all);
    }
    return comm_agree(R->comm, rc, NULL);
}


/* Test-only fault injection: does --fail-rank fail here, at --fail-at `where` of `step`? */
static int fail_here(const run *R, int step, const char *where) {
    const pl_options *o = R->o;
    if (o->fail_rank != R->rank || o->fail_step != step || strcmp(o->fail_at, where) != 0) return 0;
    if (strcmp(where, "nan") != 0)
        pl_error("injected failure (--fail-rank %d --fail-step %d --fail-at %s) at step %d", o->fail_rank,
                 o->fail_step, where, step);
    return 1;
}

/* The two copies of the tied embedding (stage 0 and the last stage) must be bit-identical. */
static int check_tied_copies(run *R, int *same) {
    *same = 1;
    if (R->P > 1 && (R->st.has_embed || R->st.has_head)) {
        size_t n = (size_t)R->cfg.Vp * R->cfg.C;
        float *other = malloc(n * sizeof(float));
        int peer = R->st.has_embed ? 1 : 0; /* rank within the tied communicator */
        if (!other) return PL_ENOMEM;
        MPI_Request rq[2];
        comm_what w = {"the tied-embedding comparison", peer ? R->P - 1 : 0, -1, -1};
        PL_MPI_CHECK(MPI_Irecv(other, (int)n, MPI_FLOAT, peer, 7, R->tied, &rq[0]));
        PL_MPI_CHECK(MPI_Isend(R->st.wte, (int)n, MPI_FLOAT, peer, 7, R->tied, &rq[1]));
        int rc = comm_waitall(2, rq, &w);
        if (rc == PL_OK) *same = memcmp(other, R->st.wte, n * sizeof(float)) == 0;
        free(other);
        PL_TRY(rc);
    }
    PL_TRY(comm_allreduce(MPI_IN_PLACE, same, 1, MPI_INT, MPI_MIN, R->comm, "the tied-embedding comparison"));
    if (R->P > 1) {
        if (*same) pl_info("tied embedding: the copies on stage 0 and stage %d are bit-identical\n", R->P - 1);
        else if (R->rank == 0) pl_error("tied embedding: the copies on stage 0 and stage %d differ", R->P - 1);
    }
    return PL_OK;
}

/* The end of a run: the tied-copy check, the in-flight peaks, the "end" metrics line. */
static int finish_run(run *R, int first_step, int done_steps, double wall, double last_loss, int stopped) {
    int tied_same = 1;
    PL_TRY(check_tied_copies(R, &tied_same));
    /* the engine's own accounting of activations held at once, per stage */
    int *peaks = calloc((size_t)R->P, sizeof(int));
    if (!peaks) return PL_ENOMEM;
    int rc = comm_gather(&R->st.slots_peak, 1, MPI_INT, peaks, 0, R->comm, "the gather of in-flight peaks");
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
    return tied_same ? PL_OK : PL_ENUM;
}

/* Step lines, metrics and the progress bar (rank 0). */
static void report_step(run *R, int step, int first_step, int last_step, double loss, double lr, double norm,
                        double secs, double t_start) {
    if (R->rank != 0) return;
    const pl_options *o = R->o;
    double ms = 1e3 * secs, tps = R->B * R->T / secs;
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

/* One training step: data, the pipeline, the optimizer. A failure that peers cannot see
 * (*agreed = 0) must end in the job-wide abort; one seen by all (a NaN) is agreed. */
static int train_step(run *R, int step, double *loss, double *norm, double *lr, step_news *nw, int *agreed) {
    const pl_options *o = R->o;
    *lr = train_lr(o, step);
    *agreed = 0;
    if (fail_here(R, step, "before")) return PL_EPEER;
    if (fail_here(R, step, "nan")) R->st.params[R->st.nparams / 2] = NAN;
    char err[4400];
    if (R->have_train && data_read_batch(&R->train, step - 1, R->B, R->T, R->inputs, R->targets, err, sizeof err) != PL_OK) {
        pl_error("step %d: %s", step, err);
        return PL_EIO;
    }
    stage_zero_grads(&R->st);
    R->eng.t_fwd = R->eng.t_bwd = R->eng.t_wait = 0;
    R->eng.first_bad_fwd = -1;
    double loss_sum = 0.0;
    float dloss = (float)(1.0 / ((double)R->B * R->T));
    PL_TRY(engine_step(&R->eng, step, R->inputs, R->targets, dloss, &loss_sum));
    double t1 = pl_now();
    int rc = optimizer_step(R, step, loss_sum, loss, norm, *lr, nw);
    *agreed = rc == PL_ENUM; /* a bad norm or loss is seen by every rank at once */
    PL_TRY(rc);
    *agreed = 0;
    double t2 = pl_now();
    trace_event(R->eng.tr, "optimizer", "optim", -1, t1, t2);
    R->tm[TM_FWD] += R->eng.t_fwd;
    R->tm[TM_BWD] += R->eng.t_bwd;
    R->tm[TM_WAIT] += R->eng.t_wait;
    R->tm[TM_OPT] += t2 - t1;
    R->tm_steps++;
    if (fail_here(R, step, "after")) return PL_EPEER;
    *agreed = 1;
    return PL_OK;
}

/* Everything between set-up and the loop: entropy floor, banner, resume, output checks. */
static int before_loop(run *R, int *first_step) {
    const pl_options *o = R->o;
    /* rank 0 must know the entropy floor, which only data ranks compute */
    if (R->P > 1) {
        double ent = R->have_train ? R->train.entropy : NAN;
        PL_TRY(comm_bcast(&ent, 1, MPI_DOUBLE, R->P - 1, R->comm, "the broadcast of the entropy floor"));
        if (R->rank == 0) R->train.entropy = ent;
    }
    print_stage_table(R);
    if (isfinite(R->train.entropy))
        pl_info("data: %s, entropy floor %.4f nats/token (the best loss any model can reach)\n", R->train.desc,
                R->train.entropy);
    else if (R->have_train)
        pl_info("data: %s\n", R->train.desc);
    write_run_line(R);
    *first_step = 1;
    if (o->resume[0]) PL_TRY(resume_checkpoint(R, first_step));
    if (o->trace[0]) {
        R->eng.tr = trace_open(R->comm);
        if (!R->eng.tr) return PL_ENOMEM;
    }
    return PL_OK;
}

int train_run(const pl_options *o, MPI_Comm comm, int *agreed) {
    run R;
    double *step_s = NULL;
    *agreed = 1;
    memset(&R, 0, sizeof R);
    R.o = o;
    R.comm = comm;
    R.tied = MPI_COMM_NULL;
    MPI_Comm_rank(comm, &R.rank);
    MPI_Comm_size(comm, &R.P);
    R.B = o->batch;
    R.T = o->seq_len;
    R.M = o->microbatches;
    R.tty = o->progress && isatty(fileno(pl_out ? pl_out : stdout));
    if (o->fail_rank >= R.P) { /* every rank sees the same options: an agreed refusal */
        if (R.rank == 0) pl_error("--fail-rank %d is not a rank of this %d-rank job", o->fail_rank, R.P);
        return PL_EINVAL;
    }
    PL_TRY(set_threads(&R));
    comm_watchdog_s = o->watchdog;
    comm_notice_s = o->watchdog > 0 && o->watchdog < 120 ? o->watchdog / 4 : 30.0;
    comm_polite = R.polite;
    /* PIPELM_STOP_GRACE (seconds): how long a stop signal waits for a step that cannot end */
    double grace = getenv("PIPELM_STOP_GRACE") ? atof(getenv("PIPELM_STOP_GRACE")) : 0;
    comm_stop_grace_s = grace > 0 ? grace : 60.0;
    signals_install(); /* from here on a stop request ends the run cleanly */
    /* collective calls come before anything that can fail on one rank only */
    int color = (R.rank == 0 || R.rank == R.P - 1) ? 0 : MPI_UNDEFINED;
    PL_MPI_CHECK(MPI_Comm_split(comm, color, R.rank, &R.tied));
    char err[1024] = "";
    int rc = setup(&R, err, sizeof err);
    if (rc != PL_OK && err[0]) pl_error("%s", err);
    rc = agree(&R, rc, "set-up");
    if (rc != PL_OK) goto done;
    int first_step = 1;
    rc = before_loop(&R, &first_step);
    rc = agree(&R, rc, "the start of the run");
    if (rc != PL_OK) goto done;
    int last_step = o->bench ? o->warmup + o->steps : o->steps;
    if (first_step > last_step) pl_info("the checkpoint is at step %d: nothing left to do for --steps %d\n",
                                        first_step - 1, last_step);
    step_s = o->bench ? calloc(last_step + 1, sizeof(double)) : NULL;
    double t_start = pl_now(), last_loss = NAN, slowest = 0;
    int step, stopped = 0;
    step_news nw = {0, -1, -1, -1};
    for (step = first_step; step <= last_step; step++) {
        if (o->bench && step == o->warmup + 1) { /* the timed part starts now */
            memset(R.tm, 0, sizeof R.tm);
            R.tm_steps = 0;
        }
        double t0 = pl_now(), loss, norm, lr;
        comm_step = step;
        rc = train_step(&R, step, &loss, &norm, &lr, &nw, agreed);
        if (rc != PL_OK) goto done;
        double secs = pl_now() - t0;
        R.tm[TM_STEP] += secs;
        if (secs > slowest) slowest = secs;
        comm_stop_grace_s = grace > 0 ? grace : 30.0 + 3.0 * slowest; /* how long a stop waits for the step */
        if (step_s) step_s[step] = secs;
        last_loss = loss;
        stopped = nw.stop_sig != 0;
        report_step(&R, step, first_step, last_step, loss, lr, norm, secs, t_start);
        if (o->timers_every && step % o->timers_every == 0 && !o->bench) {
            rc = report_timers(&R, step);
            if (rc != PL_OK) { *agreed = 0; goto done; }
        }
        if (!o->bench && ((o->eval_every && step % o->eval_every == 0) || step == last_step)) {
            rc = maybe_evaluate(&R, step);
            if (rc != PL_OK) { *agreed = 0; goto done; }
        }
        if (o->ckpt_dir[0] && !o->bench && (stopped || step == last_step || (o->ckpt_every && step % o->ckpt_every == 0))) {
            if (fail_here(&R, step, "save")) { rc = PL_EPEER; *agreed = 0; goto done; }
            rc = save_checkpoint(&R, step);
            if (rc != PL_OK) goto done; /* agreed: every rank took part in the save */
        }
        if (stopped) break;
    }
    if (R.tty && R.rank == 0) fprintf(pl_out, "\r\033[K");
    if (stopped)
        pl_info("rank %d received %s: stopping after step %d%s\n", nw.stop_rank, signals_name(nw.stop_sig), step,
                o->ckpt_dir[0] ? " (checkpoint saved)" : " (no --ckpt-dir: nothing saved)");
    if (o->bench) {
        rc = bench_finish(&R, step_s + o->warmup + 1, o->steps);
        if (rc != PL_OK) { *agreed = 0; goto done; }
    } else if (R.tm_steps) {
        rc = report_timers(&R, step > last_step ? last_step : step);
        if (rc != PL_OK) { *agreed = 0; goto done; }
    }
    if (R.eng.tr) {
        rc = trace_write(R.eng.tr, o->trace);
        R.eng.tr = NULL;
        if (rc != PL_OK) { *agreed = 0; goto done; }
        pl_info("wrote trace %s\n", o->trace);
    }
    if (o->save_final[0] && !stopped) {
        rc = llmc_save(o->save_final, &R.st, 0, comm);
        if (rc != PL_OK) goto done;
        pl_info("saved final weights to %s\n", o->save_final);
    }
    int done_steps = step > last_step ? last_step : step;
    if (done_steps < first_step - 1) done_steps = first_step - 1;
    rc = finish_run(&R, first_step, done_steps, pl_now() - t_start, last_loss, stopped);
    if (rc != PL_OK && rc != PL_ENUM) *agreed = 0;
    if (rc == PL_OK && stopped) rc = PL_EPREEMPT;
done:
    free(step_s);
    /* after a failure the peers may be anywhere: no collective on that path */
    if (R.eng.tr) trace_discard(R.eng.tr);
    R.eng.tr = NULL;
    metrics_close(&R.mx);
    if (R.tied != MPI_COMM_NULL && *agreed) MPI_Comm_free(&R.tied);
    engine_free(&R.eng);
    stage_free(&R.st);
    sched_free(&R.sc);
    split_free(&R.sp);
    if (R.have_train) data_close(&R.train);
    if (R.have_val) data_close(&R.val);
    free(R.inputs);
    free(R.targets);
    signals_restore();
    comm_step = -1;
    return rc;
}
