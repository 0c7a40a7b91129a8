/*
 * train_layout.c — `--dp auto` / `--stages auto`: the layout D x P a job of W ranks runs, chosen
 * from what it has (issue 27's elastic restart: a job requeued on fewer nodes resumes on the
 * ranks it now has). Every rank computes the same choice from the same inputs; rank 0 prints
 * it with the reason and the layouts it passed over.
 *
 * The candidates are the D x P = W with P <= n_layer + 2 (a stage holds at least one block but
 * the first and the last) and the global batch divisible by D x --microbatches. Of those, the
 * most replicas win whose stage fits the rank's memory: the rank's share of the node's
 * available memory (MemAvailable / the job's ranks on the node; test-only PIPELM_RANK_MEM_MB
 * stands in for it) must hold the largest stage's parameters, gradients and AdamW moments
 * (16 bytes a parameter; ZeRO-1: 8 + 8 / D), the stage being at least 1/P of the model and at
 * least its token embedding, plus the --ckpt-async snapshot (12 bytes a parameter it writes).
 * Activations are not counted. A layout the schedule cannot run is passed over too (V chunks
 * on one pipeline rank, or what sched_build_chunks refuses for P, V and --microbatches), so
 * zb-v on 4 ranks picks 2 x 2, not 4 x 1. More replicas first: data parallelism has no pipeline bubble,
 * and at a fixed D a checkpoint resumes bit-identically on any P.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util/common.h"
#include "util/hooks.h"
#include "formats/llmc.h"
#include "pipeline/sched.h"
#include "run/run.h"

/* This rank's share of its node's available memory, in bytes (-1: unknown); collective over
 * the world (the ranks on each node are counted with MPI_Comm_split_type). */
static double rank_memory(MPI_Comm world) {
    const char *e = hooks_env("PIPELM_RANK_MEM_MB");
    if (e && e[0]) return atof(e) * 1e6;
    MPI_Comm node;
    int local = 1;
    if (MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_size(node, &local);
        MPI_Comm_free(&node);
    }
    double have = pl_mem_available(NULL);
    return have < 0 ? -1.0 : have / local;
}

/* Bytes the largest stage of D x P needs on one rank (see the file comment). */
static double stage_bytes(const model_config *c, const pl_options *o, int D, int P) {
    double n = (double)model_num_params(c), stage = n / P, embed = (double)c->Vp * c->C;
    if (stage < embed) stage = embed;
    double per = o->zero && D > 1 ? 8.0 + 8.0 / D : 16.0;
    double snap = o->ckpt_async ? 12.0 / D : 0.0;
    return stage * (per + snap);
}

static void judge_schedule(const pl_options *o, int P, int V, char *why, size_t len);

/* Why D x P cannot run (into why), or "" if it can: the model, the batch, the memory, then
 * the schedule. */
static void judge(const model_config *c, const pl_options *o, int W, int D, int P, int V, double mem, char *why,
                  size_t len) {
    int M = o->microbatches;
    why[0] = 0;
    if (P * V > c->L + 2)
        snprintf(why, len, "%d stage%s x %d chunk%s exceed n_layer + 2 = %d", P, P > 1 ? "s" : "", V, V > 1 ? "s" : "",
                 c->L + 2);
    else if (o->batch % (D * M) != 0)
        snprintf(why, len, "--batch %d is not divisible by D x --microbatches = %d", o->batch, D * M);
    else if (mem >= 0 && stage_bytes(c, o, D, P) > mem)
        snprintf(why, len, "a stage needs about %.0f MB, more than the %.0f MB of a rank", stage_bytes(c, o, D, P) / 1e6,
                 mem / 1e6);
    else judge_schedule(o, P, V, why, len);
    (void)W;
}

/* Why --schedule cannot run on P pipeline ranks with V chunks each and --microbatches (into
 * why), or "" if it can: the schedule is built as the run would build it (auto and a
 * --schedule-csv file are judged when the run reads them). */
static void judge_schedule(const pl_options *o, int P, int V, char *why, size_t len) {
    if (o->schedule_csv[0] || strcmp(o->schedule, "auto") == 0) return;
    if (V > 1 && P < 2) {
        snprintf(why, len, "--schedule %s runs %d chunks per rank, which needs at least 2 pipeline ranks", o->schedule, V);
        return;
    }
    sched sc;
    char e[512] = "";
    memset(&sc, 0, sizeof sc);
    if (sched_build_chunks(o->schedule, P, V, o->microbatches, &sc, e, sizeof e) != PL_OK)
        snprintf(why, len, "--schedule %s: %.200s", o->schedule, e);
    else sched_free(&sc);
}

/* How the layout line names a setting: auto, not given, or its value. */
static const char *layout_word(int v, char *buf, size_t len) {
    if (v < 0) return "auto";
    if (v == 0) return "not given";
    snprintf(buf, len, "%d", v);
    return buf;
}

/* Collective: the most replicas D (and P = W / D) that fit, printed with the reason. */
int train_layout_auto(run *R, const pl_options *o, int *D, int *P) {
    int W = R->W, V = o->chunks > 0 ? o->chunks : strcmp(o->schedule, "auto") ? sched_default_chunks(o->schedule) : 1;
    model_config c;
    char err[1024] = "", why[256], passed[1024] = "";
    int version, rc = o->init[0] ? llmc_read_config(o->init, &c, &version, err, sizeof err)
                                 : config_model(o, config_vocab(o), &c, err, sizeof err);
    double mem = rank_memory(R->world);
    if (rc != PL_OK) {
        if (R->wrank == 0) pl_error("--dp auto / --stages auto: %s", err);
        return PL_EINVAL;
    }
    int found = 0, off = 0;
    for (int d = W; d >= 1 && !found; d--) {
        if (W % d != 0 || (*D > 0 && d != *D) || (*P > 0 && W / d != *P)) continue;
        judge(&c, o, W, d, W / d, V, mem, why, sizeof why);
        if (!why[0]) {
            found = 1;
            *D = d;
            *P = W / d;
        } else if (off < (int)sizeof passed - 64)
            off += snprintf(passed + off, sizeof passed - off, "; %d x %d: %s", d, W / d, why);
    }
    char bd[16], bp[16];
    const char *wd = layout_word(o->dp, bd, sizeof bd), *wp = layout_word(o->stages, bp, sizeof bp);
    if (!found) {
        if (R->wrank == 0) pl_error("--dp %s --stages %s: no layout of %d ranks fits%s", wd, wp, W, passed);
        return PL_EINVAL;
    }
    char memtxt[64] = "unknown";
    if (mem >= 0) snprintf(memtxt, sizeof memtxt, "%.0f MB", mem / 1e6);
    pl_info("layout: D x P = %d x %d on %d rank%s (--dp %s --stages %s): the most replicas whose stage fits (about "
            "%.0f MB of parameters, gradients and moments of the %s a rank) and whose pipeline --schedule %s runs "
            "(%d chunk%s a rank, %d micro-batches)%s%s\n", *D, *P, W, W > 1 ? "s" : "", wd, wp,
            stage_bytes(&c, o, *D, *P) / 1e6, memtxt, o->schedule, V, V > 1 ? "s" : "", o->microbatches,
            passed[0] ? "; passed over" : "", passed);
    return PL_OK;
}
