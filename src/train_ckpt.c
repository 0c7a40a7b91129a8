/*
 * train_ckpt.c — a training run's checkpoints: the state recorded beside the tensors, the
 * collective save with its report, and resuming (settings that change the data stream must
 * match the saved ones).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "pipelm/ckpt.h"
#include "pipelm/comm.h"
#include "pipelm/common.h"
#include "pipelm/run.h"
#include "pipelm/trace.h"

/* The training state that goes into a checkpoint beside the tensors. */
static void fill_meta(const run *R, int step, ckpt_meta *m) {
    const pl_options *o = R->o;
    memset(m, 0, sizeof *m);
    m->step = step;
    m->tokens_seen = (long long)step * R->Bg * R->T;
    m->data_pos = step; /* batch k of the data source is read at step k+1 */
    m->seed = o->seed;
    m->data_seed = o->data_seed;
    snprintf(m->data, sizeof m->data, "%.500s", o->data);
    m->hp = o->hp;
    m->batch = R->Bg; /* the global batch: the same whatever --dp */
    m->seq_len = R->T;
    m->microbatches = R->M;
    snprintf(m->schedule, sizeof m->schedule, "%s", R->sc.name);
    m->nstages = R->S; /* global stages: P ranks x V chunks */
    for (int s = 0; s < R->S && s < CKPT_MAX_STAGES; s++) m->split[s] = R->sp.blocks[s];
    m->markov_branch = o->markov_branch; /* the stream of "markov" data depends on it */
}
/* How long a checkpoint's collective HDF5 calls may take before the deadline ends the job:
 * the watchdog's limit plus a second per MB of the file (parameters and both moments). */
static double ckpt_deadline_s(const run *R) {
    return comm_watchdog_s + 12.0 * (double)model_num_params(&R->cfg) / 1e6;
}
/* Collective: save a checkpoint after `step`, reporting its size and bandwidth. */
int train_save_checkpoint(run *R, int step) {
    ckpt_meta m;
    fill_meta(R, step, &m);
    char path[PL_PATH + 64], err[1024] = "";
    double bytes = 0, t0 = pl_now();
    trace_event(R->eng.tr, "checkpoint", "ckpt", -1, t0, t0);
    /* ZeRO-1: the moments whole for the file (each replica writes a share of the tensors) */
    int rc = R->have_dp ? dp_moments_full(&R->dp, 1) : PL_OK;
    rc = comm_agree(R->world, rc, NULL);
    if (rc == PL_OK) rc = comm_deadline_arm("the checkpoint save (collective HDF5)", ckpt_deadline_s(R));
    const pl_options *o = R->o;
    if (rc == PL_OK && o->fail_rank == R->wrank && o->fail_step == step && strcmp(o->fail_at, "stall") == 0)
        sleep(3600); /* test-only: a rank that hangs where the peers block inside HDF5 */
    comm_deadline_enter();
    if (rc == PL_OK)
        rc = ckpt_save(R->o->ckpt_dir, &R->st, &R->opt, &m, R->o->ckpt_keep, R->world, path, sizeof path, &bytes, err,
                       sizeof err);
    comm_deadline_disarm();
    if (R->have_dp) {
        int r2 = dp_moments_pieces(&R->dp);
        if (rc == PL_OK) rc = r2;
    }
    double t1 = pl_now();
    trace_event(R->eng.tr, "checkpoint", "ckpt", -1, t0, t1);
    if (rc != PL_OK) {
        if (err[0]) pl_error("checkpoint at step %d: %s", step, err);
        /* only what is known: latest (which a failed save never moves) and the file it names */
        char prev[PL_PATH + 64], e2[PL_PATH + 600];
        if (R->wrank == 0 && ckpt_latest(R->o->ckpt_dir, prev, sizeof prev, e2, sizeof e2) == PL_OK)
            pl_error("checkpoint at step %d failed; %s/latest still names the previous checkpoint %s", step,
                     R->o->ckpt_dir, prev);
        else if (R->wrank == 0)
            pl_error("checkpoint at step %d failed; no earlier checkpoint is named by %s/latest (%s)", step,
                     R->o->ckpt_dir, e2);
        return rc;
    }
    pl_info("checkpoint %s: step %d, %.1f MB in %.2f s (%.1f MB/s)\n", path, step, bytes / 1e6, t1 - t0,
            bytes / 1e6 / (t1 - t0 > 0 ? t1 - t0 : 1e-9));
    return PL_OK;
}
/* Collective: resume from --resume (a file, or the newest in --ckpt-dir); *first_step is the
 * step after the saved one. Settings that would change the data stream must match. */
int train_resume_checkpoint(run *R, int *first_step) {
    const pl_options *o = R->o;
    char path[PL_PATH + 64], err[1024] = "";
    int rc = ckpt_resolve(strcmp(o->resume, "latest") == 0 ? o->ckpt_dir : o->resume, path, sizeof path, err, sizeof err);
    if (rc != PL_OK) {
        if (R->wrank == 0) pl_error("--resume: %s", err);
        return rc; /* every rank resolved the same name the same way */
    }
    ckpt_meta m;
    double bytes = 0, t0 = pl_now();
    rc = R->have_dp ? dp_moments_full(&R->dp, 0) : PL_OK; /* ZeRO-1: read whole, keep the pieces */
    rc = comm_agree(R->world, rc, NULL);
    if (rc == PL_OK) rc = comm_deadline_arm("the checkpoint load (collective HDF5)", ckpt_deadline_s(R));
    comm_deadline_enter();
    if (rc == PL_OK) rc = ckpt_load(path, &R->st, &R->opt, &m, R->world, &bytes, err, sizeof err);
    comm_deadline_disarm();
    if (R->have_dp) {
        int r2 = dp_moments_pieces(&R->dp);
        if (rc == PL_OK) rc = r2;
    }
    double t1 = pl_now();
    if (rc != PL_OK) {
        if (err[0]) pl_error("resuming from %s: %s", path, err);
        return rc;
    }
    const char *what = NULL;
    char a[600] = "", b[600] = "";
    if (m.batch != R->Bg) { what = "batch"; snprintf(a, sizeof a, "%d", m.batch); snprintf(b, sizeof b, "%d", R->Bg); }
    else if (m.seq_len != R->T) { what = "seq-len"; snprintf(a, sizeof a, "%d", m.seq_len); snprintf(b, sizeof b, "%d", R->T); }
    else if (strcmp(m.data, o->data) != 0) { what = "data"; snprintf(a, sizeof a, "%.500s", m.data); snprintf(b, sizeof b, "%.500s", o->data); }
    else if (m.data_seed != o->data_seed) { what = "data-seed"; snprintf(a, sizeof a, "%lld", m.data_seed); snprintf(b, sizeof b, "%lld", o->data_seed); }
    else if (m.markov_branch > 0 && m.markov_branch != o->markov_branch && strcmp(o->data, "markov") == 0) {
        what = "markov-branch";
        snprintf(a, sizeof a, "%d", m.markov_branch);
        snprintf(b, sizeof b, "%d", o->markov_branch);
    }
    if (!what && m.markov_branch <= 0 && strcmp(o->data, "markov") == 0 && R->wrank == 0)
        fprintf(stderr, "pipelm: rank 0: note: %s does not record --markov-branch (saved by an older pipelm): "
                "cannot check that this run's --markov-branch %d is the one it was trained with\n", path,
                o->markov_branch);
    if (what) {
        if (R->wrank == 0)
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
