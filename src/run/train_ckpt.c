/*
 * train_ckpt.c — a training run's checkpoints: the state recorded beside the tensors, the
 * collective save with its report, and resuming (settings that change the data stream must
 * match the saved ones). With --ckpt-async a save copies the rank's share into a host
 * snapshot and a writer thread writes the file (ckpt_async.h) while the steps go on; after
 * each step the ranks agree whether every writer has finished (one small all-reduce, only
 * while a write is in flight), so all of them join it, report it and fail on it together.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "ckpt/ckpt.h"
#include "ckpt/ckpt_async.h"
#include "parallel/comm.h"
#include "util/common.h"
#include "run/run.h"
#include "pipeline/trace.h"

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
    if (R->manifest) snprintf(m->shards, sizeof m->shards, "%s", R->manifest); /* data_manifest's list */
}
/* How long a checkpoint's collective HDF5 calls may take before the deadline ends the job:
 * the watchdog's limit plus a second per MB of the file (parameters and both moments). */
static double ckpt_deadline_s(const run *R) {
    return comm_watchdog_s + 12.0 * (double)model_num_params(&R->cfg) / 1e6;
}
/* The metrics line of a save that was published (rank 0; docs/formats.md §6): blocked_ms is
 * how long training was held (the whole save when synchronous; the snapshot and any wait for
 * the previous write when asynchronous; the longest of any rank), write_ms the time to the
 * published file (rank 0's). */
static void ckpt_metrics_line(run *R, int step, double bytes, double blocked_s, double write_s, double wait_s,
                              double snap_s, double fence_s, int async) {
    metrics_line(&R->mx, "{\"event\":\"ckpt\",\"step\":%d,\"bytes\":%.0f,\"blocked_ms\":%.3f,\"write_ms\":%.3f,"
                 "\"mode\":\"%s\",\"wait_ms\":%.3f,\"snapshot_ms\":%.3f,\"fence_ms\":%.3f}", step, bytes,
                 blocked_s * 1e3, write_s * 1e3, async ? "async" : "sync", wait_s * 1e3, snap_s * 1e3, fence_s * 1e3);
}
static int save_async(run *R, int step);

/* After a failed save (rank 0): only what is known, latest (which a failed save never moves)
 * and the file it names. */
static void report_failed_save(const run *R, int step) {
    char prev[PL_PATH + 64], e2[PL_PATH + 600];
    if (R->wrank != 0) return;
    if (ckpt_latest(R->o->ckpt_dir, prev, sizeof prev, e2, sizeof e2) == PL_OK)
        pl_error("checkpoint at step %d failed; %s/latest still names the previous checkpoint %s", step,
                 R->o->ckpt_dir, prev);
    else
        pl_error("checkpoint at step %d failed; no earlier checkpoint is named by %s/latest (%s)", step,
                 R->o->ckpt_dir, e2);
}
/* Collective: save a checkpoint after `step`, reporting its size and bandwidth. */
int train_save_checkpoint(run *R, int step) {
    if (R->ca) return save_async(R, step);
    ckpt_meta m;
    fill_meta(R, step, &m);
    char path[PL_PATH + 64], err[1024] = "";
    double bytes = 0, t0 = pl_now();
    trace_event(R->eng.tr, "checkpoint", "ckpt", -1, t0, t0);
    /* ZeRO-1: the moments whole for the file (each replica writes a share of the tensors) */
    int rc = R->have_dp ? dp_moments_full(&R->dp, 1) : PL_OK;
    rc = comm_agree(R->world, rc, NULL);
    /* --tp: the TP ranks' slices gathered whole; each rank writes a share of the tensors */
    tp_whole w;
    int have_w = 0;
    if (rc == PL_OK && R->have_tp) {
        rc = tp_whole_make(&R->tp, &R->st, &R->opt, TPW_PARAMS | TPW_MOMENTS, 1, R->d, R->D, &w, err, sizeof err);
        have_w = rc == PL_OK;
        rc = comm_agree(R->world, rc, NULL);
    }
    if (rc == PL_OK) rc = comm_deadline_arm("the checkpoint save (collective HDF5)", ckpt_deadline_s(R));
    const pl_options *o = R->o;
    if (rc == PL_OK && hooks_fail_here(&o->hooks, R->wrank, step, "stall"))
        sleep(3600); /* test-only: a rank that hangs where the peers block inside HDF5 */
    comm_deadline_enter();
    if (rc == PL_OK)
        rc = ckpt_save(R->o->ckpt_dir, have_w ? &w.st : &R->st, have_w ? &w.opt : &R->opt, &m, R->o->ckpt_keep,
                       R->world, path, sizeof path, &bytes, err, sizeof err);
    comm_deadline_disarm();
    if (have_w) tp_whole_free(&w);
    if (R->have_dp) {
        int r2 = dp_moments_pieces(&R->dp);
        if (rc == PL_OK) rc = r2;
    }
    double t1 = pl_now();
    trace_event(R->eng.tr, "checkpoint", "ckpt", -1, t0, t1);
    if (rc != PL_OK) {
        if (err[0]) pl_error("checkpoint at step %d: %s", step, err);
        report_failed_save(R, step);
        return rc;
    }
    pl_info("checkpoint %s: step %d, %.1f MB in %.2f s (%.1f MB/s)\n", path, step, bytes / 1e6, t1 - t0,
            bytes / 1e6 / (t1 - t0 > 0 ? t1 - t0 : 1e-9));
    ckpt_metrics_line(R, step, bytes, t1 - t0, t1 - t0, 0.0, 0.0, 0.0, 0);
    return PL_OK;
}
/* Rank 0, before step 1: a run that does not resume never writes into a --ckpt-dir that
 * holds checkpoints (it would replace them, move latest back below them and let --ckpt-keep
 * remove them), unless --ckpt-overwrite 1 says to start over. */
int train_ckpt_guard(const run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    long long newest;
    if (o->resume[0] || o->ckpt_overwrite || o->eval_mode || !ckpt_dir_newest(o->ckpt_dir, &newest)) return PL_OK;
    snprintf(err, errlen, "--ckpt-dir %s holds checkpoints (the newest: step %lld) and this run does not resume: "
             "resume from them (--resume), start over in it with --ckpt-overwrite 1, or give another directory",
             o->ckpt_dir, newest);
    return PL_EINVAL;
}

/* Settings that would change the data stream must be the checkpoint's (rank 0 names the
 * first that is not). */
static int resume_settings(const run *R, const ckpt_meta *m, const char *path) {
    const pl_options *o = R->o;
    const char *what = NULL;
    char a[600] = "", b[600] = "";
    if (m->batch != R->Bg) { what = "batch"; snprintf(a, sizeof a, "%d", m->batch); snprintf(b, sizeof b, "%d", R->Bg); }
    else if (m->seq_len != R->T) { what = "seq-len"; snprintf(a, sizeof a, "%d", m->seq_len); snprintf(b, sizeof b, "%d", R->T); }
    else if (strcmp(m->data, o->data) != 0 && !o->data_changed) { what = "data"; snprintf(a, sizeof a, "%.500s", m->data); snprintf(b, sizeof b, "%.500s", o->data); }
    else if (m->data_seed != o->data_seed) { what = "data-seed"; snprintf(a, sizeof a, "%lld", m->data_seed); snprintf(b, sizeof b, "%lld", o->data_seed); }
    else if (m->markov_branch > 0 && m->markov_branch != o->markov_branch && strcmp(o->data, "markov") == 0) {
        what = "markov-branch";
        snprintf(a, sizeof a, "%d", m->markov_branch);
        snprintf(b, sizeof b, "%d", o->markov_branch);
    }
    if (!what && m->markov_branch <= 0 && strcmp(o->data, "markov") == 0 && R->wrank == 0)
        fprintf(stderr, "pipelm: rank 0: note: %s does not record --markov-branch (saved by an older pipelm): "
                "cannot check that this run's --markov-branch %d is the one it was trained with\n", path,
                o->markov_branch);
    if (what) {
        if (R->wrank == 0)
            pl_error("cannot resume from %s: it was saved with --%s %s but this run has --%s %s", path, what, a, what, b);
        return PL_EINVAL;
    }
    return PL_OK;
}
/* The token files of --data must be those the checkpoint records (names, sizes, header
 * CRCs), unless --data-changed 1 accepts a new list; an older checkpoint says nothing. */
static int resume_shards(const run *R, const ckpt_meta *m, const char *path) {
    char msg[2 * PL_PATH + 300];
    if (!R->manifest || !R->manifest[0]) return PL_OK;
    if (!m->shards[0]) {
        if (R->wrank == 0)
            fprintf(stderr, "pipelm: rank 0: note: %s does not record the files of --data (saved by an older pipelm): "
                    "cannot check that they are the ones it was trained on\n", path);
        return PL_OK;
    }
    if (!data_manifest_diff(m->shards, R->manifest, msg, sizeof msg)) return PL_OK;
    if (R->o->data_changed) {
        if (R->wrank == 0)
            fprintf(stderr, "pipelm: rank 0: note: --data-changed 1: the files of --data differ from %s's (%s); the run "
                    "goes on at data position %lld of the new list\n", path, msg, m->data_pos);
        return PL_OK;
    }
    if (R->wrank == 0)
        pl_error("cannot resume from %s: the files of --data are not those it was trained on: %s (--data-changed 1 "
                 "resumes anyway, at data position %lld of the new list)", path, msg, m->data_pos);
    return PL_EINVAL;
}
/* Collective, before the loop: world rank 0 (the first stage, which reads --data) lists the
 * token files of --data (data_manifest) for the checkpoints, and every rank gets the list. */
int train_data_manifest(run *R) {
    long long hdr[2] = {1, PL_OK}; /* length with the NUL, status */
    char err[PL_PATH + 200];
    R->manifest = calloc(CKPT_SHARDS_LEN, 1);
    if (!R->manifest) hdr[1] = PL_ENOMEM;
    if (R->wrank == 0 && R->manifest && R->have_train) {
        hdr[1] = data_manifest(&R->train, R->manifest, CKPT_SHARDS_LEN, err, sizeof err);
        hdr[0] = (long long)strlen(R->manifest) + 1;
        if (hdr[1] != PL_OK) pl_error("%s", err);
    }
    PL_TRY(comm_bcast(hdr, 2, MPI_LONG_LONG, 0, R->world, "the broadcast of the data's file list"));
    if (hdr[1] == PL_OK && !R->manifest) hdr[1] = PL_ENOMEM; /* this rank's own allocation */
    if (hdr[1] != PL_OK) return (int)hdr[1];
    return comm_bcast(R->manifest, (int)hdr[0], MPI_CHAR, 0, R->world, "the broadcast of the data's file list");
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
    tp_whole w; /* --tp: read whole, keep this rank's slices */
    int have_w = 0;
    if (rc == PL_OK && R->have_tp) {
        rc = tp_whole_make(&R->tp, &R->st, &R->opt, 0, 1, R->d, R->D, &w, err, sizeof err);
        have_w = rc == PL_OK;
    }
    rc = comm_agree(R->world, rc, NULL);
    if (rc == PL_OK) rc = comm_deadline_arm("the checkpoint load (collective HDF5)", ckpt_deadline_s(R));
    comm_deadline_enter();
    if (rc == PL_OK)
        rc = ckpt_load(path, have_w ? &w.st : &R->st, have_w ? &w.opt : &R->opt, &m, R->world, &bytes, err, sizeof err);
    comm_deadline_disarm();
    if (have_w) {
        if (rc == PL_OK && tp_whole_put(&R->tp, &w, &R->st, &R->opt, TPW_PARAMS | TPW_MOMENTS) != PL_OK) {
            snprintf(err, sizeof err, "backend %s: cutting the checkpoint's tensors into the TP slices failed",
                     R->be->name);
            rc = PL_EBACKEND;
        }
        tp_whole_free(&w);
    }
    if (R->have_dp) {
        int r2 = dp_moments_pieces(&R->dp);
        if (rc == PL_OK) rc = r2;
    }
    double t1 = pl_now();
    if (rc != PL_OK) {
        if (err[0]) pl_error("resuming from %s: %s", path, err);
        return rc;
    }
    PL_TRY(resume_settings(R, &m, path));
    PL_TRY(resume_shards(R, &m, path));
    *first_step = (int)m.step + 1;
    char split[256] = "";
    for (int s = 0, off = 0; s < m.nstages && s < CKPT_MAX_STAGES && off < (int)sizeof split - 16; s++)
        off += snprintf(split + off, sizeof split - off, "%s%d", s ? "," : "", m.split[s]);
    pl_info("resumed from %s: step %lld (saved on %d stage%s, split %s), %.1f MB in %.2f s (%.1f MB/s)\n", path,
            m.step, m.nstages, m.nstages > 1 ? "s" : "", split, bytes / 1e6, t1 - t0,
            bytes / 1e6 / (t1 - t0 > 0 ? t1 - t0 : 1e-9));
    return PL_OK;
}

/* ---- --ckpt-async ------------------------------------------------------------------------ */


/* Before step 1, not collective (in the set-up): --ckpt-async needs MPI_THREAD_MULTIPLE, and
 * its snapshot must fit in this rank's share of the node's available memory. */
int train_ckpt_async_check(run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    if (!o->ckpt_async || !o->ckpt_dir[0] || o->bench) return PL_OK;
    const char *level;
    if (!ckpt_async_thread_ok(&level)) {
        snprintf(err, errlen, "--ckpt-async needs MPI_THREAD_MULTIPLE (its writer thread makes MPI calls beside "
                 "training), but the MPI library gave %s: run without --ckpt-async", level);
        return PL_EINVAL;
    }
    double need = ckpt_async_snapshot_bytes(&R->st, &R->opt), have = pl_mem_available("PIPELM_CKPT_ASYNC_MEM_MB"); /* test-only stand-in */
    int share = R->lay.local_ranks > 0 ? R->lay.local_ranks : 1;
    if (have >= 0 && need > have / share) {
        snprintf(err, errlen, "--ckpt-async: the checkpoint snapshot of this rank needs %.1f MB of host memory, but "
                 "only %.1f MB are available to each of the node's %d rank%s (MemAvailable %.1f MB): run without "
                 "--ckpt-async, or on more ranks", need / 1e6, have / share / 1e6, share, share > 1 ? "s" : "",
                 have / 1e6);
        return PL_ENOMEM;
    }
    return PL_OK;
}

/* Collective, after the agreed set-up: the writer's communicator, and the banner line with
 * the snapshot's size (the largest rank's, and all ranks' together). */
int train_ckpt_async_setup(run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    if (!o->ckpt_async || !o->ckpt_dir[0] || o->bench) return PL_OK;
    double mine = ckpt_async_snapshot_bytes(&R->st, &R->opt), most = 0.0, sum = 0.0;
    PL_TRY(comm_allreduce(&mine, &most, 1, MPI_DOUBLE, MPI_MAX, R->world, "the snapshot size"));
    PL_TRY(comm_allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, R->world, "the snapshot size"));
    PL_TRY(ckpt_async_init(&R->ca, R->world, err, errlen));
    PL_TRY(ckpt_async_prepare(R->ca, &R->st, &R->opt, err, errlen));
    pl_info("checkpoints: --ckpt-async: a host snapshot of at most %.1f MB per rank (%.1f MB on all %d ranks), "
            "allocated now and written by a background thread\n", most / 1e6, sum / 1e6, R->W);
    return PL_OK;
}

/* A rank that must end while its writer thread is inside an MPI call: MPI_Abort from this
 * thread then races the writer's progress engine (UCX asserts and the rank dies of SIGABRT),
 * so the rank ends itself, as the deadline watcher of comm.c does, and the launcher ends the
 * others. A second for the launcher to forward the message first. */
static void end_rank_now(void) {
    fflush(stdout);
    fflush(stderr);
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    _exit(1);
}

/* Wait (this rank alone) for the writer in flight to return, under the checkpoint's
 * deadline: past it the writer is stuck in a collective call (a peer stopped taking part),
 * and the job is ended (end_rank_now). */
static int wait_writer(run *R, double *waited) {
    double t0 = pl_now(), limit = ckpt_deadline_s(R);
    while (!ckpt_async_done(R->ca)) {
        if (comm_watchdog_s > 0 && ckpt_async_age(R->ca) > limit) {
            pl_error("watchdog: the checkpoint writer of step %lld has been writing for %.0f s (the limit is "
                     "--watchdog plus 12 s per million parameters: %.0f s): a rank stopped taking part in its "
                     "collective HDF5 calls; ending the job", ckpt_async_step(R->ca), ckpt_async_age(R->ca), limit);
            end_rank_now();
        }
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    *waited = pl_now() - t0;
    return PL_OK;
}

/* Every rank's writer has returned: join it, report the save (or its failure, the same on
 * every rank: the writers agreed) and write its metrics line. */
static int finish_write(run *R) {
    char path[PL_PATH + 64], err[1024] = "";
    double bytes = 0.0, write_s = 0.0;
    int step = (int)ckpt_async_step(R->ca);
    int rc = ckpt_async_join(R->ca, path, sizeof path, &bytes, &write_s, err, sizeof err);
    /* the metrics give the longest hold of any rank (every rank is here: the callers are collective) */
    /* the fence's wait for a deferred snapshot held training too (inside the next step) */
    double held[4] = {R->ca_blocked + R->ca_fence, R->ca_wait, R->ca_snap, R->ca_fence}, most[4];
    int r2 = comm_allreduce(held, most, 4, MPI_DOUBLE, MPI_MAX, R->world, "the checkpoint's times");
    if (r2 != PL_OK) return r2;
    if (rc != PL_OK) {
        if (err[0]) pl_error("checkpoint at step %d (written in the background): %s", step, err);
        report_failed_save(R, step);
        return rc;
    }
    pl_info("checkpoint %s: step %d, %.1f MB written in the background in %.2f s (%.1f MB/s); training was held "
            "%.3f s\n", path, step, bytes / 1e6, write_s, bytes / 1e6 / (write_s > 0 ? write_s : 1e-9),
            most[0]);
    ckpt_metrics_line(R, step, bytes, most[0], write_s, most[1], most[2], most[3], 1);
    return PL_OK;
}

/* Collective: an asynchronous save after `step`: wait for the write in flight (saying how
 * long), then the snapshot, then the writer; the ranks agree that every snapshot was taken. */
static int save_async(run *R, int step) {
    double t0 = pl_now(), wait_s = 0.0, snap_s = 0.0;
    int rc = PL_OK;
    if (ckpt_async_busy(R->ca)) {
        long long prev = ckpt_async_step(R->ca);
        PL_TRY(wait_writer(R, &wait_s)); /* not agreed: the job ends */
        PL_TRY(finish_write(R));
        pl_info("checkpoint at step %d waited %.2f s for the write of step %lld to finish\n", step, wait_s, prev);
    }
    ckpt_meta m;
    fill_meta(R, step, &m);
    char err[1024] = "";
    const pl_options *o = R->o;
    if (hooks_fail_here(&o->hooks, R->wrank, step, "stall")) {
        char how[32]; /* test-only: this rank's writer hangs inside HDF5 (the writer's own injection) */
        snprintf(how, sizeof how, "stall:%d", R->wrank);
        setenv("PIPELM_CKPT_FAIL", how, 1);
    }
    trace_event(R->eng.tr, "checkpoint snapshot", "ckpt", -1, t0, t0);
    rc = R->have_dp ? dp_moments_full(&R->dp, 1) : PL_OK; /* ZeRO-1: whole moments, as for a synchronous save */
    rc = comm_agree(R->world, rc, NULL);
    /* the copy is left to the writer (made before the next optimizer step: train.c's fence)
     * unless ZeRO-1's whole moments must go back to their shards now */
    int defer = !(R->have_dp && R->o->zero);
    if (rc == PL_OK) rc = ckpt_async_begin(R->ca, R->o->ckpt_dir, &R->st, &R->opt, &m, R->o->ckpt_keep, defer, &snap_s, err,
                                           sizeof err);
    if (rc != PL_OK && err[0]) pl_error("checkpoint at step %d: %s", step, err);
    if (R->have_dp) {
        int r2 = dp_moments_pieces(&R->dp);
        if (rc == PL_OK) rc = r2;
    }
    /* a rank whose writer did not start leaves the others' writers waiting: ended together here,
     * before the next step */
    int who = -1;
    rc = comm_agree(R->world, rc, &who);
    double t1 = pl_now();
    trace_event(R->eng.tr, "checkpoint snapshot", "ckpt", -1, t0, t1);
    if (rc != PL_OK) {
        if (R->wrank == 0 && who >= 0) pl_error("checkpoint at step %d: rank %d could not start its write", step, who);
        return rc;
    }
    R->ca_blocked = t1 - t0;
    R->ca_wait = wait_s;
    R->ca_snap = snap_s;
    R->ca_fence = 0.0;
    return PL_OK;
}

/* Collective, after each step: while a write is in flight, have all writers returned? Then
 * every rank joins its writer at this step. A writer past its deadline ends the job. */
int train_ckpt_async_poll(run *R, int *agreed) {
    if (!ckpt_async_busy(R->ca)) return PL_OK;
    int mine = ckpt_async_done(R->ca), all = 0;
    if (!mine && comm_watchdog_s > 0 && ckpt_async_age(R->ca) > ckpt_deadline_s(R)) {
        double w;
        return wait_writer(R, &w); /* the deadline has passed: says so and ends the rank */
    }
    int rc = comm_allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, R->world, "the agreement on the checkpoint writers");
    if (rc != PL_OK) { *agreed = 0; return rc; }
    return all ? finish_write(R) : PL_OK;
}

/* Collective: the end of the run (or a stop): the write in flight completes before the run
 * ends; its failure fails the run. */
int train_ckpt_async_drain(run *R, int *agreed) {
    if (!ckpt_async_busy(R->ca)) return PL_OK;
    double w;
    (void)agreed; /* a writer past its deadline ends the rank (wait_writer) */
    PL_TRY(wait_writer(R, &w));
    return finish_write(R);
}

/* The end of the run on any path: after an agreed failure the write in flight still
 * completes (and is reported); after one that is not agreed the writer is left to the abort. */
void train_ckpt_async_free(run *R, int agreed) {
    if (!R->ca) return;
    if (!agreed && ckpt_async_busy(R->ca)) end_rank_now(); /* its message is out; no MPI_Abort beside the writer */
    int dummy = agreed;
    if (agreed && ckpt_async_busy(R->ca) && train_ckpt_async_drain(R, &dummy) != PL_OK) {
        /* reported; the run already failed */
    }
    ckpt_async_free(R->ca, agreed && dummy);
    R->ca = NULL;
}

int train_resume_config(const pl_options *o, model_config *cfg, char *err, size_t errlen) {
    char path[PL_PATH + 64], e2[1024];
    if (ckpt_resolve(strcmp(o->resume, "latest") == 0 ? o->ckpt_dir : o->resume, path, sizeof path, e2,
                     sizeof e2) != PL_OK) {
        snprintf(err, errlen, "--resume: %s", e2);
        return PL_EIO;
    }
    if (ckpt_read_info(path, cfg, NULL, e2, sizeof e2) != PL_OK) {
        snprintf(err, errlen, "--resume %s: %s", path, e2);
        return PL_EIO;
    }
    return PL_OK;
}
