/*
 * ckpt_write.c — the collective write of one checkpoint file.
 *
 * Every rank opens the file through MPI-IO with collective metadata, and creates every group,
 * attribute and dataset (HDF5 metadata is collective); datasets are created with
 * H5D_FILL_TIME_NEVER so that creating one writes nothing. The owner of a tensor computes its
 * CRC and writes the whole dataset, both from a host view of the backend buffer. The tensors
 * come from the optimizer (optim_buffer: parameters, m, v). Where mapping is free every view
 * is mapped before the data phase and the CRCs run on a second thread alongside the writes,
 * the views unmapped only after it joins; a staging backend maps one tensor at a time around
 * its write. The data transfer is INDEPENDENT by default (only the owner calls H5Dwrite: no
 * collective at all per dataset) or, with --ckpt-xfer collective (ckpt_xfer_mode), one collective H5Dwrite per
 * dataset in which the others select nothing. The CRCs reach every rank in the one
 * MPI_Allreduce that also agrees on the status of the whole data phase; every rank then
 * writes the same attribute values, and the file is flushed.
 *
 * Collective discipline: a rank that fails (an HDF5 error, an injected failure) keeps its
 * first message, skips its own data writes from then on, and still makes every collective
 * metadata call of the data phase in the same order (their errors go to a scratch buffer),
 * so no other rank is left waiting in a collective; all ranks then agree once, at the end of
 * the data phase. (Independent writes contain no collective to hang in. With collective
 * transfers a rank whose H5Dcreate alone fails would leave the others in that dataset's
 * H5Dwrite; metadata calls run the same code on the same metadata on every rank, so they
 * fail alike.)
 *
 * A full disk: rank 0 checks the free space first and then reserves the file's blocks
 * (fallocate), so that a write cannot fail half way on one rank; a failed save empties its
 * file before closing it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* fallocate(2) */
#endif
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include "ckpt/ckpt_internal.h"
#include "util/common.h"
#include "util/hooks.h"

/* ---- failure injection ------------------------------------------------------------------ */


/* Parse PIPELM_CKPT_FAIL: mode and the rank that fails (default the last rank). */
int ckpt_fail_mode(int size, int *who, h5ctx *cx) {
    const char *s = hooks_env("PIPELM_CKPT_FAIL");
    *who = size - 1;
    if (!s || !s[0]) return FAIL_NONE;
    int mode = strncmp(s, "write", 5) == 0 ? FAIL_WRITE : strncmp(s, "rename", 6) == 0 ? FAIL_RENAME
             : strncmp(s, "kill", 4) == 0 ? FAIL_KILL : strncmp(s, "corrupt", 7) == 0 ? FAIL_CORRUPT
             : strncmp(s, "before", 6) == 0 ? FAIL_BEFORE : strncmp(s, "after", 5) == 0 ? FAIL_AFTER
             : strncmp(s, "stall", 5) == 0 ? FAIL_STALL : strncmp(s, "delay", 5) == 0 ? FAIL_DELAY : -1;
    if (mode < 0) {
        ckpt_fail(cx, PL_EINVAL, "PIPELM_CKPT_FAIL='%s' is not one of write[:RANK], rename, kill[:RANK], corrupt, "
                  "before[:RANK], after[:RANK], stall[:RANK], delay[:RANK]", s);
        return -1;
    }
    const char *colon = strchr(s, ':');
    if (colon) *who = atoi(colon + 1);
    if (mode == FAIL_RENAME || mode == FAIL_CORRUPT) *who = 0;
    return mode;
}

/* ---- writing one file ------------------------------------------------------------------- */

/* The transfer mode of the settings (--ckpt-xfer; checked when it was set). */
int ckpt_xfer_mode(h5ctx *cx) {
    (void)cx;
    return ckpt_get_opts()->collective ? XFER_COLLECTIVE : XFER_INDEPENDENT;
}

_Thread_local size_t ckpt_write_piece = 0;

/* An independent write of a whole dataset in pieces of about ckpt_write_piece bytes (whole
 * rows, each a hyperslab of the file's dataspace): the same bytes land at the same places. */
static int write_pieces(hid_t ds, const ckpt_gtensor *g, const float *data, hid_t dxpl, h5ctx *cx) {
    int rc = PL_OK;
    hid_t fsp = -1, msp = -1;
    hsize_t rows = (hsize_t)g->shape[0], cols = g->ndim == 2 ? (hsize_t)g->shape[1] : 1;
    hsize_t step = ckpt_write_piece / (cols * sizeof(float));
    if (step < 1) step = 1;
    for (hsize_t r0 = 0; r0 < rows; r0 += step) {
        hsize_t start[2] = {r0, 0}, cnt[2] = {rows - r0 < step ? rows - r0 : step, cols};
        CKPT_H5(fsp = H5Dget_space(ds));
        CKPT_H5(H5Sselect_hyperslab(fsp, H5S_SELECT_SET, start, NULL, cnt, NULL));
        CKPT_H5(msp = H5Screate_simple(g->ndim, cnt, NULL));
        CKPT_H5(H5Dwrite(ds, H5T_NATIVE_FLOAT, msp, fsp, dxpl, data + r0 * cols));
        H5Sclose(msp);
        H5Sclose(fsp);
        msp = fsp = -1;
    }
done:
    if (msp >= 0) H5Sclose(msp);
    if (fsp >= 0) H5Sclose(fsp);
    return rc;
}

/* Create one dataset under parent (contiguous, fp32, never filled: creating it writes
 * nothing) and leave it open in *ds; write data if not NULL (the owner, whole dataset).
 * With collective transfers a rank without data takes part with an empty selection; with
 * independent ones it does not call H5Dwrite at all. */
static int write_dataset(hid_t parent, const ckpt_gtensor *g, const float *data, int xfer, hid_t dxpl, hid_t *ds,
                         h5ctx *cx) {
    static const float dummy = 0.0f; /* a non-NULL buffer for empty selections */
    int rc = PL_OK;
    hid_t sp = -1, dcpl = -1;
    hsize_t dims[2] = {(hsize_t)g->shape[0], (hsize_t)g->shape[1]};
    const char *leaf = strrchr(g->path, '/') ? strrchr(g->path, '/') + 1 : g->path;
    CKPT_H5(sp = H5Screate_simple(g->ndim, dims, NULL));
    CKPT_H5(dcpl = H5Pcreate(H5P_DATASET_CREATE));
    CKPT_H5(H5Pset_layout(dcpl, H5D_CONTIGUOUS));
    CKPT_H5(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER)); /* every element is written */
    CKPT_H5(*ds = H5Dcreate2(parent, leaf, H5T_IEEE_F32LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    if (data && ckpt_write_piece && xfer == XFER_INDEPENDENT && g->numel * sizeof(float) > ckpt_write_piece) {
        rc = write_pieces(*ds, g, data, dxpl, cx);
    } else if (data) {
        CKPT_H5(H5Dwrite(*ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, dxpl, data));
    } else if (xfer == XFER_COLLECTIVE) {
        CKPT_H5(H5Sselect_none(sp));
        CKPT_H5(H5Dwrite(*ds, H5T_NATIVE_FLOAT, sp, sp, dxpl, &dummy));
    }
done:
    if (dcpl >= 0) H5Pclose(dcpl);
    if (sp >= 0) H5Sclose(sp);
    return rc;
}

/* The scalar uint32 crc32c attribute of an open dataset (collective, same value everywhere). */
static int write_crc_attr(hid_t ds, const char *dpath, uint32_t crc, h5ctx *cx) {
    int rc = PL_OK;
    hid_t sp = -1, a = -1;
    snprintf(cx->obj, sizeof cx->obj, "dataset %s: attribute " CRC_ATTR, dpath);
    CKPT_H5(sp = H5Screate(H5S_SCALAR));
    CKPT_H5(a = H5Acreate2(ds, CRC_ATTR, H5T_STD_U32LE, sp, H5P_DEFAULT, H5P_DEFAULT));
    CKPT_H5(H5Awrite(a, H5T_NATIVE_UINT32, &crc));
    CKPT_H5(H5Aclose(a));
    a = -1;
done:
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
    return rc;
}


/* The CRC-32C of every dataset this rank writes, computed on a second thread while the main
 * thread writes, from host views mapped before the thread starts and unmapped after it
 * joins (both only read them). vals[1 + k] for dataset k = s n + i gets CRC | 1 << 32. The
 * thread makes no MPI, HDF5 or backend call. */
typedef struct {
    const ckpt_view *views; /* [3 n] */
    const ckpt_gtensor *gt;
    int n;
    unsigned long long *vals;
} crc_job;

static void *crc_worker(void *arg) {
    crc_job *j = arg;
    for (int k = 0; k < 3 * j->n; k++)
        if (j->views[k].host) j->vals[1 + k] = 1ULL << 32 | ckpt_crc_floats(j->views[k].host, j->gt[k % j->n].numel);
    return NULL;
}

/* Bytes a checkpoint of model c takes on disk, generously: the tensors (parameters and both
 * moments) plus 2 KiB of HDF5 metadata per dataset (about 0.5 KiB are used: a contiguous
 * dataset has no chunk index) and 1 MiB. */
static double space_needed(const model_config *c, int ntensors) {
    return 3.0 * 4.0 * (double)model_num_params(c) + 3.0 * ntensors * 2048.0 + 1048576.0;
}

/* --ckpt-space-check 0 turns off the free-space check and the reservation below (only for
 * tests of a disk that fills up half way, on one rank). */
static int space_check_off(void) {
    return !ckpt_get_opts()->space_check;
}

/* Rank 0, before creating the file: refuse early if the file system clearly lacks room. */
static int check_space(const char *path, const model_config *c, int ntensors, h5ctx *cx) {
    if (space_check_off()) return PL_OK;
    char dir[4400];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *(slash == dir ? slash + 1 : slash) = 0;
    else snprintf(dir, sizeof dir, ".");
    struct statvfs vf;
    if (statvfs(dir, &vf) != 0) return PL_OK; /* cannot tell: the reservation decides */
    double need = space_needed(c, ntensors), have = (double)vf.f_bavail * (double)vf.f_frsize;
    if (have < need)
        return ckpt_fail(cx, PL_EIO, "not enough space in %s: %.1f MB free, the checkpoint needs about %.1f MB "
                         "(No space left on device)", dir, have / 1e6, need / 1e6);
    return PL_OK;
}

/* Rank 0, once the file exists: reserve its blocks (fallocate, file size unchanged) so that a
 * disk filling up during the save fails here, before any collective write. A write failing
 * on one rank in the middle of HDF5's collective calls leaves the other ranks waiting in the
 * next one (a hang), so this matters. File systems without fallocate skip it. */
static int reserve_space(const char *path, const model_config *c, int ntensors, h5ctx *cx) {
    if (space_check_off()) return PL_OK;
    int fd = open(path, O_WRONLY);
    if (fd < 0) return ckpt_fail(cx, PL_EIO, "cannot open %s to reserve space: %s", path, strerror(errno));
    int rc = PL_OK;
    if (fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)space_needed(c, ntensors)) != 0 && errno != EOPNOTSUPP &&
        errno != ENOSYS && errno != EINVAL)
        rc = ckpt_fail(cx, PL_EIO, "reserving %.1f MB for the checkpoint failed: %s", space_needed(c, ntensors) / 1e6,
                       strerror(errno));
    close(fd);
    return rc;
}

/* Rank 0, after closing: give back the reserved blocks beyond the end of the file (truncating
 * to its own size drops them). */
static void release_space(const char *path) {
    struct stat sb;
    if (space_check_off() || stat(path, &sb) != 0) return;
    if (truncate(path, sb.st_size) != 0) { /* harmless: the blocks stay reserved */ }
}

/* ---- the write of one file, phase by phase ---------------------------------------------- */

/* Everything one rank's write of one file works with. cx holds this rank's first message
 * (in the caller's err); after a failure, messages go to `later` (scratch), so the first
 * cause is the one reported. Not to be copied (later points into it). */
typedef struct {
    const char *path;
    MPI_Comm comm;
    int rank, size;
    stage *st;
    optim *opt;
    const backend *be;
    h5ctx cx, later;
    char scratch[1024];
    int n, total;              /* tensors of the schema; datasets (3 n) */
    ckpt_gtensor *gt;
    hid_t *dsets;              /* every dataset, open until its attribute is written */
    ckpt_view *views;          /* [k]: the host view dataset k is written from */
    /* [0]: ckpt_agree_max's status slot; [1 + k]: dataset k's CRC-32C | 1 << 32 on its owner, else 0 */
    unsigned long long *vals;
    /* Where mapping is free (a host-memory backend: the view is the buffer itself) every view
     * is mapped before the data phase, so that a second thread can compute the CRCs alongside
     * the writes, and unmapped after it joins. A staging backend maps one tensor at a time,
     * around its write, so that no more than one tensor is staged on the host at once. */
    int eager, threaded;
    int mode, who, xfer;       /* the test-only failure, its rank; how the data travels */
    hid_t f, sec, sub, lay, dxpl;
    double mybytes;            /* tensor bytes this rank wrote */
    ckpt_meta meta;            /* rank 0's, and its time stamp: every rank writes the same attributes */
    char created[32];
    int rc;                    /* the data phase: this rank's first failure */
} wfile;

/* The context for the next call of the data phase: cx until this rank fails, then scratch. */
static h5ctx *use(wfile *w) { return w->rc == PL_OK ? &w->cx : &w->later; }

/* Keep the first failure of the data phase; returns r. */
static int keep(wfile *w, int r) {
    if (w->rc == PL_OK) w->rc = r;
    return r;
}

/* Allocate, take rank 0's metadata and time stamp, and check the optimizer (no agreement). */
static int wfile_init(wfile *w, const char *path, const char *label, stage *st, optim *opt, const ckpt_meta *meta_in,
                      MPI_Comm comm, char *err, size_t errlen) {
    memset(w, 0, sizeof *w);
    MPI_Comm_rank(comm, &w->rank);
    MPI_Comm_size(comm, &w->size);
    ckpt_h5_quiet();
    w->path = path;
    w->comm = comm;
    w->st = st;
    w->opt = opt;
    w->be = st->be;
    w->cx = (h5ctx){label ? label : path, "", err, errlen, w->rank};
    w->later = (h5ctx){w->cx.file, "", w->scratch, sizeof w->scratch, w->rank};
    err[0] = 0;
    w->n = model_num_tensors(&st->cfg);
    w->f = w->sec = w->sub = w->lay = w->dxpl = -1;
    w->gt = calloc((size_t)w->n, sizeof *w->gt);
    w->dsets = malloc(3 * (size_t)w->n * sizeof *w->dsets);
    w->views = calloc(3 * (size_t)w->n, sizeof *w->views);
    w->vals = calloc(1 + 3 * (size_t)w->n, sizeof *w->vals);
    w->eager = w->be->host_memory;
    for (int k = 0; w->dsets && k < 3 * w->n; k++) w->dsets[k] = -1;
    w->meta = *meta_in;
    if (w->rank == 0) {
        time_t now = time(NULL);
        struct tm tmv;
        gmtime_r(&now, &tmv);
        strftime(w->created, sizeof w->created, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    }
    int rc = PL_OK;
    if (MPI_Bcast(&w->meta, (int)sizeof w->meta, MPI_BYTE, 0, comm) != MPI_SUCCESS ||
        MPI_Bcast(w->created, (int)sizeof w->created, MPI_CHAR, 0, comm) != MPI_SUCCESS)
        rc = ckpt_fail(&w->cx, PL_EMPI, "MPI_Bcast of the metadata failed");
    if (!w->gt || !w->dsets || !w->vals || !w->views) rc = ckpt_fail(&w->cx, PL_ENOMEM, "out of memory");
    else if (!opt)
        rc = ckpt_fail(&w->cx, PL_EINVAL, "no optimizer given: a checkpoint holds the AdamW moments beside the "
                       "parameters, so saving one needs the stage's optimizer");
    else if (opt->st != st)
        rc = ckpt_fail(&w->cx, PL_EINVAL, "the optimizer given belongs to another stage (its moments are laid out "
                       "by that stage's tensors)");
    return rc;
}

/* The schema, the ownership check, the settings, and (eager) every view mapped. */
static int wfile_prepare(wfile *w) {
    w->n = ckpt_global_tensors(&w->st->cfg, w->gt);
    w->total = 3 * w->n;
    int rc = ckpt_check_ownership(w->st, w->opt, w->gt, w->n, w->comm, &w->cx);
    w->mode = ckpt_fail_mode(w->size, &w->who, &w->cx);
    w->xfer = ckpt_xfer_mode(&w->cx);
    if (w->mode < 0 || w->xfer < 0) rc = PL_EINVAL;
    for (int s = 0; w->eager && rc == PL_OK && s < 3; s++)
        for (int i = 0; i < w->n && rc == PL_OK; i++) {
            const param_tensor *t = ckpt_written_tensor(w->st, w->opt, &w->gt[i], i);
            char dpath[96];
            ckpt_dataset_path(s, &w->gt[i], dpath, sizeof dpath);
            if (t)
                rc = ckpt_view_map(w->be, ckpt_section_base(w->st, w->opt, s), t, PL_MAP_READ, dpath,
                                   &w->views[s * w->n + i], &w->cx);
        }
    return rc;
}

/* Test-only, on the failing rank before its first dataset (the file exists, no data yet):
 * PIPELM_CKPT_FAIL=before fails there, stall hangs there (as a rank whose disk stopped), so
 * that the other ranks wait in the collective calls that follow; delay waits 1 s there (a
 * slow disk: a save that is still being written when the next step ends). */
static void inject_before(wfile *w) {
    if (w->mode == FAIL_BEFORE)
        w->rc = ckpt_fail(&w->cx, PL_EIO, "injected failure before any dataset was written "
                          "(PIPELM_CKPT_FAIL=before)");
    if (w->mode == FAIL_STALL) sleep(3600);
    if (w->mode == FAIL_DELAY) sleep(1);
}

/* Dataset k (tensor i of section s) under parent: its view mapped (staging backends), its
 * CRC (without the thread), the write (only by its owner, only before a failure), the
 * view unmapped; and the test-only failure half way through. */
static void write_one(wfile *w, int s, int i, int k, hid_t parent) {
    const ckpt_gtensor *g = &w->gt[i];
    char dpath[96];
    ckpt_dataset_path(s, g, dpath, sizeof dpath);
    /* a rank that has failed writes no more data */
    const param_tensor *t = w->rc == PL_OK ? ckpt_written_tensor(w->st, w->opt, g, i) : NULL;
    if (t && !w->eager)
        keep(w, ckpt_view_map(w->be, ckpt_section_base(w->st, w->opt, s), t, PL_MAP_READ, dpath, &w->views[k],
                              use(w)));
    if (w->rc == PL_OK && w->rank == w->who && k == 0) inject_before(w);
    const float *data = w->rc == PL_OK ? w->views[k].host : NULL;
    if (data && !w->threaded) w->vals[1 + k] = 1ULL << 32 | ckpt_crc_floats(data, g->numel);
    h5ctx *u = use(w);
    snprintf(u->obj, sizeof u->obj, "dataset %s", dpath);
    int r2 = keep(w, write_dataset(parent, g, data, w->xfer, w->dxpl, &w->dsets[k], u));
    if (r2 == PL_OK && data) w->mybytes += (double)g->numel * sizeof(float);
    if (!w->eager) keep(w, ckpt_view_unmap(w->be, PL_MAP_READ, dpath, &w->views[k], use(w)));
    if (w->rc == PL_OK && w->rank == w->who && k + 1 == w->total / 2) {
        if (w->mode == FAIL_KILL) raise(SIGKILL);
        if (w->mode == FAIL_WRITE)
            w->rc = ckpt_fail(&w->cx, PL_EIO, "injected failure after %d of %d datasets (PIPELM_CKPT_FAIL=write)",
                              k + 1, w->total);
    }
    if (w->rc == PL_OK && w->rank == w->who && k + 1 == w->total && w->mode == FAIL_AFTER)
        w->rc = ckpt_fail(&w->cx, PL_EIO, "injected failure after all %d datasets were written, before the ranks "
                          "agreed (PIPELM_CKPT_FAIL=after)", w->total);
}

/* Section s (/model, /optim/m, /optim/v): its group, a group per block, every dataset. Every
 * rank makes every call, failed or not. */
static void write_section(wfile *w, int s) {
    if (s == 0) keep(w, ckpt_group_create(w->f, "model", &w->sec, use(w)));
    else {
        /* /optim exists (its attributes); m and v go under it */
        keep(w, ckpt_group_open(w->f, "optim", &w->sub, use(w)));
        keep(w, ckpt_group_create(w->sub, s == 1 ? "m" : "v", &w->sec, use(w)));
    }
    int cur = -1;
    for (int i = 0; i < w->n; i++) {
        const ckpt_gtensor *g = &w->gt[i];
        if (g->layer != cur) { /* entering a block (or leaving the last one) */
            keep(w, ckpt_obj_close(&w->lay, use(w)));
            cur = g->layer;
            if (cur >= 0) {
                char name[32];
                snprintf(name, sizeof name, "h.%d", cur);
                keep(w, ckpt_group_create(w->sec, name, &w->lay, use(w)));
            }
        }
        write_one(w, s, i, s * w->n + i, cur >= 0 ? w->lay : w->sec);
    }
    keep(w, ckpt_obj_close(&w->lay, use(w)));
    keep(w, ckpt_obj_close(&w->sec, use(w)));
    keep(w, ckpt_obj_close(&w->sub, use(w)));
}

/* Unmap every view still mapped: keep_first 1 keeps the first error (the data phase's end),
 * 0 sends every error to scratch (the way out after an earlier failure). */
static void unmap_all(wfile *w, int keep_first) {
    for (int k = 0; w->views && k < 3 * w->n; k++)
        if (w->views[k].host) {
            char dpath[96];
            ckpt_dataset_path(k / w->n, &w->gt[k % w->n], dpath, sizeof dpath);
            int r = ckpt_view_unmap(w->be, PL_MAP_READ, dpath, &w->views[k], keep_first ? use(w) : &w->later);
            if (keep_first) keep(w, r);
        }
}

/* The data phase: every rank walks the same datasets in the same order and makes every
 * collective call, failed or not; one agreement at the end (bringing every CRC to every
 * rank), then every rank writes the CRC attributes and the file is flushed. */
static int write_data(wfile *w) {
    crc_job job = {w->views, w->gt, w->n, w->vals};
    pthread_t crc_thread;
    /* the CRCs overlap the writes on a second thread where every view is mapped up front (else,
     * or if the thread cannot start, each is computed just before its write) */
    w->threaded = w->eager && pthread_create(&crc_thread, NULL, crc_worker, &job) == 0;
    w->rc = PL_OK;
    for (int s = 0; s < 3; s++) write_section(w, s);
    w->cx.obj[0] = 0;
    if (w->threaded) pthread_join(crc_thread, NULL);
    unmap_all(w, 1); /* the views outlive the CRC thread's reads; a staging backend's are unmapped already */
    int rc = ckpt_agree_max(w->comm, w->rc, w->cx.err, w->cx.errlen, w->vals, w->total);
    for (int k = 0; k < w->total && rc == PL_OK; k++)
        if (!(w->vals[1 + k] >> 32)) /* the same on every rank */
            rc = ckpt_fail(&w->cx, PL_EINVAL, "no rank computed the CRC-32C of dataset /%s/%s", ckpt_sections[k / w->n],
                           w->gt[k % w->n].path);
    w->rc = rc;
    if (rc != PL_OK) return rc;
    for (int k = 0; k < w->total; k++) {
        char dpath[96];
        ckpt_dataset_path(k / w->n, &w->gt[k % w->n], dpath, sizeof dpath);
        keep(w, write_crc_attr(w->dsets[k], dpath, (uint32_t)w->vals[1 + k], use(w)));
        h5ctx *u = use(w);
        snprintf(u->obj, sizeof u->obj, "dataset %s", dpath);
        keep(w, ckpt_obj_close(&w->dsets[k], u));
    }
    keep(w, ckpt_flush_file(w->f, use(w)));
    return ckpt_agree(w->comm, w->rc, w->cx.err, w->cx.errlen);
}

/* Close everything the write opened; on failure empty the file first. H5Fclose is
 * collective and flushes the metadata: it can fail too (after an earlier failure its
 * message goes to scratch). Returns the agreed status. */
static int close_file(wfile *w, int rc, double *bytes_out) {
    if (w->dxpl >= 0) H5Pclose(w->dxpl);
    for (int k = 0; w->dsets && k < 3 * w->n; k++)
        if (w->dsets[k] >= 0) H5Dclose(w->dsets[k]);
    if (w->lay >= 0) H5Gclose(w->lay);
    if (w->sec >= 0) H5Gclose(w->sec);
    if (w->sub >= 0) H5Gclose(w->sub);
    if (rc != PL_OK && w->f >= 0) {
        /* The file is abandoned. Empty it before H5Fclose flushes what is left: on a full disk
         * that flush would fail too, and HDF5 1.10 does not recover from a failed H5Fclose
         * (the file ID is left dangling and the library crashes at exit). Every rank has
         * finished its writes here (the agreement before). */
        MPI_Barrier(w->comm);
        if (w->rank == 0 && truncate(w->path, 0) != 0) { /* best effort: the file is removed later */ }
        MPI_Barrier(w->comm);
    }
    int crc = ckpt_h5_close_file(&w->f, rc == PL_OK ? &w->cx : &w->later);
    if (rc == PL_OK) rc = ckpt_agree(w->comm, crc, w->cx.err, w->cx.errlen);
    if (rc == PL_OK && w->rank == 0) release_space(w->path);
    if (rc == PL_OK && bytes_out) {
        double all = 0.0;
        MPI_Allreduce(&w->mybytes, &all, 1, MPI_DOUBLE, MPI_SUM, w->comm);
        *bytes_out = all;
    }
    return rc;
}

/* Collective: write the whole checkpoint file at path (see the file comment for how): the
 * phases before the data each end in an agreement, so all ranks go on or stop together. */
int ckpt_write_file(const char *path, const char *label, stage *st, optim *opt, const ckpt_meta *meta_in,
                    MPI_Comm comm, double *bytes_out, char *err, size_t errlen) {
    wfile ws, *w = &ws;
    int rc = wfile_init(w, path, label, st, opt, meta_in, comm, err, errlen);
    if ((rc = ckpt_agree(comm, rc, err, errlen)) != PL_OK) goto out;
    rc = wfile_prepare(w);
    if ((rc = ckpt_agree(comm, rc, err, errlen)) != PL_OK) goto out;
    if (w->rank == 0) rc = check_space(path, &st->cfg, w->n, &w->cx);
    if ((rc = ckpt_agree(comm, rc, err, errlen)) != PL_OK) goto out;
    rc = ckpt_h5_open(path, 1, comm, &w->f, &w->cx);
    if ((rc = ckpt_agree(comm, rc, err, errlen)) != PL_OK) goto out;
    if (w->rank == 0) rc = reserve_space(path, &st->cfg, w->n, &w->cx);
    if ((rc = ckpt_agree(comm, rc, err, errlen)) == PL_OK) {
        rc = ckpt_write_meta(w->f, &st->cfg, &w->meta, w->created, &w->cx);
        if (rc == PL_OK) rc = ckpt_dxpl_make(&w->dxpl, w->xfer == XFER_COLLECTIVE, &w->cx);
        if ((rc = ckpt_agree(comm, rc, err, errlen)) == PL_OK) rc = write_data(w);
    }
    rc = close_file(w, rc, bytes_out);
out:
    /* after a failure before the data phase's end: views still mapped (their errors go to the
     * scratch buffer, the first cause is the one reported) */
    unmap_all(w, 0);
    free(w->gt);
    free(w->dsets);
    free(w->vals);
    free(w->views);
    return rc;
}
