/*
 * ckpt_save.c — the atomic save of a checkpoint (docs/formats.md §2).
 *
 * DIR/.ckpt_<step>.<tag>.h5.tmp (tag: rank 0's "<host>.<pid>", ckpt_job_tag, so no two
 * processes write one temporary file) is written (ckpt_write.c) and closed, all ranks agree;
 * every rank re-opens it, checks the metadata and re-reads the datasets it wrote, checking
 * each CRC-32C against its attribute (verify_file), and all agree again; only then does rank
 * 0 fsync and rename it to DIR/ckpt_<step>.h5, write DIR/latest.<tag>.tmp (the file name) and
 * rename it to DIR/latest, and remove checkpoints beyond `keep`. Any failure removes the
 * temporary file and leaves latest and every older checkpoint as they were. A training run
 * also holds the directory's lock, DIR/.lock (ckpt_lock.c), so one job at a time writes it.
 *
 * Test-only: PIPELM_CKPT_FAIL = write[:R] (rank R, default the last, fails after writing half
 * the datasets), rename (rank 0 fails just before the rename), kill[:R] (rank R raises SIGKILL
 * half way through the datasets), corrupt (rank 0 flips a byte of the last dataset after the
 * write, before the verification).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ckpt/ckpt_internal.h"
#include "util/common.h"
#include "util/files.h"

/* ---- the atomic save -------------------------------------------------------------------- */

/* Parse "ckpt_<digits>.h5" -> step; -1 if the name is anything else (temp files included). */
long long ckpt_name_step(const char *name) {
    if (strncmp(name, "ckpt_", 5) != 0) return -1;
    const char *p = name + 5, *q = p;
    while (isdigit((unsigned char)*q)) q++;
    if (q == p || q - p > 18 || strcmp(q, ".h5") != 0) return -1;
    return atoll(p);
}


/* fsync a file or directory by path. */
static int fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    int r = fsync(fd);
    /* some file systems refuse fsync on directories: not a failure of the save */
    if (r != 0 && (errno == EINVAL || errno == EROFS)) r = 0;
    int e = errno;
    close(fd);
    errno = e;
    return r;
}

/* Is a temporary file of a save stale? name is ".ckpt_<step>.<host>.<pid>.h5.tmp" or
 * "latest.<host>.<pid>.tmp" (or the untagged names of an older pipelm). Stale: this job's
 * own (tag), any at all while this job holds the directory's lock, an untagged one, or one
 * of this host whose pid is gone. Another host's, or a live process's, is left alone. */
static int temp_is_stale(const char *name, const char *tag, int locked) {
    const char *p, *end;
    if (strncmp(name, ".ckpt_", 6) == 0 && (end = strstr(name, ".h5.tmp")) && end[7] == 0) {
        p = name + 6;
        while (isdigit((unsigned char)*p)) p++;
    } else if (strcmp(name, "latest.tmp") == 0) {
        return 1; /* an older pipelm's */
    } else if (strncmp(name, "latest.", 7) == 0 && strlen(name) > 11 && strcmp(name + strlen(name) - 4, ".tmp") == 0) {
        p = name + 6;
        end = name + strlen(name) - 4;
    } else return 0;
    if (p >= end) return 1; /* untagged: ".ckpt_00000001.h5.tmp", "latest.tmp" */
    if (*p != '.') return 0;
    char t[256];
    snprintf(t, sizeof t, "%.*s", (int)(end - p - 1), p + 1);
    if (strcmp(t, tag) == 0 || locked) return 1;
    char *dot = strrchr(t, '.'), mine[256];
    if (!dot) return 0;
    *dot = 0;
    snprintf(mine, sizeof mine, "%s", tag);
    char *md = strrchr(mine, '.');
    if (md) *md = 0;
    return strcmp(t, mine) == 0 && !ckpt_pid_alive(atol(dot + 1));
}

/* Remove temporary files left by a save that died (a killed rank); rank 0 at a save's start.
 * Only stale ones (temp_is_stale): never a live job's. */
static void remove_stale_temps(const char *dir, const char *tag) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[4400];
    int locked = ckpt_lock_held(dir);
    while ((e = readdir(d)))
        if (temp_is_stale(e->d_name, tag, locked)) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
}

/* Compare steps for qsort (ascending). */
static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

/* The steps of the ckpt_*.h5 files in dir, ascending (*n = 0, NULL when none or unreadable). */
static long long *dir_steps(const char *dir, size_t *n_out) {
    *n_out = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    size_t n = 0, cap = 64;
    long long *steps = malloc(cap * sizeof *steps);
    struct dirent *e;
    while (steps && (e = readdir(d))) {
        long long s = ckpt_name_step(e->d_name);
        if (s < 0) continue;
        if (n == cap) {
            long long *t = realloc(steps, 2 * cap * sizeof *steps);
            if (!t) break;
            steps = t;
            cap *= 2;
        }
        steps[n++] = s;
    }
    closedir(d);
    if (steps) qsort(steps, n, sizeof *steps, cmp_ll);
    *n_out = steps ? n : 0;
    return steps;
}

/* The checkpoints --ckpt-keep must not remove (ckpt_keep_protect): those the directory held
 * when the run started, above the step it resumed from, until this run writes that step
 * itself. One run per process, set before its first save; read and changed only by the
 * thread that saves (one save at a time). */
static long long *protected_steps;
static size_t nprotected;

int ckpt_keep_protect(const char *dir, long long floor) {
    free(protected_steps);
    protected_steps = NULL;
    nprotected = 0;
    size_t n;
    long long *steps = dir_steps(dir, &n);
    for (size_t i = 0; i < n; i++)
        if (steps[i] > floor) steps[nprotected++] = steps[i];
    protected_steps = steps;
    return PL_OK;
}

int ckpt_dir_newest(const char *dir, long long *step) {
    size_t n;
    long long *steps = dir_steps(dir, &n);
    *step = n ? steps[n - 1] : -1;
    free(steps);
    return n > 0;
}

/* Is step one the run must leave alone? With unmark: this run has just written it (it is
 * the run's own from now on). */
static int is_protected(long long step, int unmark) {
    for (size_t i = 0; i < nprotected; i++)
        if (protected_steps[i] == step) {
            if (unmark) protected_steps[i] = -1;
            return !unmark;
        }
    return 0;
}

/* Remove checkpoints beyond the newest `keep` (oldest first), never `current` and never one
 * this run did not write that is newer than the step it resumed from (ckpt_keep_protect:
 * those are neither removed nor counted). A
 * file that cannot be removed is reported as a warning: the save itself succeeded. */
static void prune(const char *dir, int keep, long long current) {
    if (keep <= 0) return;
    size_t n, m = 0;
    long long *steps = dir_steps(dir, &n);
    for (size_t i = 0; i < n; i++) /* what the run may remove (counted against keep) */
        if (!is_protected(steps[i], 0)) steps[m++] = steps[i];
    for (size_t i = 0; i + (size_t)keep < m; i++) {
        if (steps[i] == current) continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/ckpt_%08lld.h5", dir, steps[i]);
        if (unlink(p) != 0 && errno != ENOENT)
            fprintf(stderr, "pipelm: rank 0: warning: could not remove old checkpoint %s: %s\n", p, strerror(errno));
    }
    free(steps);
}

/* Rank 0: make a closed, verified temporary file durable and move it into place; then point
 * latest at it (through latest.<tag>.tmp). Returns an error (and leaves latest alone) if any
 * step fails. */
static int publish(const char *dir, const char *tmp, const char *final, const char *name, const char *tag,
                   h5ctx *cx) {
    char lt[4400], lf[4400];
    snprintf(lt, sizeof lt, "%s/latest.%s.tmp", dir, tag);
    snprintf(lf, sizeof lf, "%s/latest", dir);
    if (fsync_path(tmp) != 0) return ckpt_fail(cx, PL_EIO, "fsync of %s failed: %s", tmp, strerror(errno));
    char why[4400];
    if (pl_output_replace(tmp, final, "checkpoint", why, sizeof why) != PL_OK) /* never over a device */
        return ckpt_fail(cx, PL_EIO, "%s", why);
    fsync_path(dir);
    FILE *fp = fopen(lt, "w");
    if (!fp) return ckpt_fail(cx, PL_EIO, "cannot create %s: %s (%s is saved but latest still names the previous one)",
                              lt, strerror(errno), final);
    int ok = fprintf(fp, "%s\n", name) > 0;
    ok = fflush(fp) == 0 && ok;
    ok = fsync(fileno(fp)) == 0 && ok;
    int e = errno;
    ok = fclose(fp) == 0 && ok;
    if (!ok) {
        unlink(lt);
        return ckpt_fail(cx, PL_EIO, "updating %s failed: %s (%s is saved but latest still names the previous one)",
                         lf, strerror(e), final);
    }
    if (pl_output_replace(lt, lf, "latest", why, sizeof why) != PL_OK)
        return ckpt_fail(cx, PL_EIO, "%s (%s is saved but latest still names the previous one)", why, final);
    fsync_path(dir);
    return PL_OK;
}

/* Test-only (PIPELM_CKPT_FAIL=corrupt), rank 0: flip one byte in the data of the file's last
 * dataset (/optim/v of the last tensor, written by the last stage), as a disk or a second
 * writer would, after the file is closed and before it is verified. */
static int inject_corruption(const char *tmp, const char *dpath, h5ctx *cx) {
    int rc = PL_OK;
    hid_t f = -1, ds = -1;
    haddr_t off = HADDR_UNDEF;
    if ((rc = ckpt_h5_open(tmp, 0, MPI_COMM_NULL, &f, cx)) != PL_OK) return rc;
    CKPT_H5(ds = H5Dopen2(f, dpath, H5P_DEFAULT));
    off = H5Dget_offset(ds);
done:
    if (ds >= 0) H5Dclose(ds);
    if (f >= 0) ckpt_h5_close_file(&f, cx);
    if (rc != PL_OK) return rc;
    if (off == HADDR_UNDEF) return ckpt_fail(cx, PL_EIO, "PIPELM_CKPT_FAIL=corrupt: dataset %s has no data", dpath);
    int fd = open(tmp, O_RDWR);
    unsigned char c = 0;
    int ok = fd >= 0 && pread(fd, &c, 1, (off_t)off) == 1;
    c ^= 0x5a;
    ok = ok && pwrite(fd, &c, 1, (off_t)off) == 1;
    if (fd >= 0) close(fd);
    return ok ? PL_OK : ckpt_fail(cx, PL_EIO, "PIPELM_CKPT_FAIL=corrupt: cannot change %s: %s", tmp, strerror(errno));
}

/* Collective: read back one dataset of a closed file and check it against its crc32c (every
 * rank opens it and reads the attribute: collective metadata; buf != NULL: this rank wrote
 * it and reads its data, independently). */
static int verify_dataset(hid_t f, const char *dpath, float *buf, size_t numel, h5ctx *cx) {
    int rc = PL_OK, has_crc = 0, fletcher = 0;
    uint32_t stored = 0;
    hid_t ds = -1;
    snprintf(cx->obj, sizeof cx->obj, "dataset %s", dpath);
    CKPT_H5(ds = H5Dopen2(f, dpath, H5P_DEFAULT));
    if ((rc = ckpt_dataset_checksum(ds, dpath, &has_crc, &stored, &fletcher, cx)) != PL_OK) goto done;
    if (!has_crc) {
        rc = ckpt_fail(cx, PL_EIO, "dataset %s has no " CRC_ATTR " attribute", dpath);
        goto done;
    }
    if (buf) {
        CKPT_H5(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf));
        uint32_t computed = ckpt_crc_floats(buf, numel);
        if (computed != stored)
            rc = ckpt_fail(cx, PL_EIO, "dataset %s: CRC-32C mismatch (stored 0x%08x, read back 0x%08x)", dpath,
                           (unsigned)stored, (unsigned)computed);
    }
done:
    if (ds >= 0) H5Dclose(ds);
    return rc;
}

/* --ckpt-verify 0 skips the read-back (only to measure what it costs). */
static int verify_off(void) {
    return !ckpt_get_opts()->verify;
}

/* Collective: verify a written, closed checkpoint before it is published: the metadata
 * (ckpt_read_meta: ranges and meta_crc32c) on every rank, and every dataset's CRC-32C, each
 * re-read by the rank that wrote it. One agreement; err names the first failure. */
static int verify_file(const char *tmp, const char *label, stage *st, optim *opt, MPI_Comm comm, char *err,
                       size_t errlen) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    h5ctx cxs = {label, "", err, errlen, rank}, *cx = &cxs;
    char scratch[1024];
    h5ctx later = {label, "", scratch, sizeof scratch, rank};
    int rc = PL_OK, n = model_num_tensors(&st->cfg);
    size_t most = 0;
    ckpt_gtensor *gt = calloc((size_t)n, sizeof *gt);
    if (gt) n = ckpt_global_tensors(&st->cfg, gt);
    for (int i = 0; gt && i < n; i++)
        if (ckpt_written_tensor(st, opt, &gt[i], i) && gt[i].numel > most) most = gt[i].numel;
    float *buf = most ? malloc(most * sizeof *buf) : NULL;
    hid_t f = -1;
    if (!gt || (most && !buf)) rc = ckpt_fail(cx, PL_ENOMEM, "out of memory for verifying the file");
    if ((rc = ckpt_agree(comm, rc, err, errlen)) != PL_OK) goto out;
    rc = ckpt_h5_open(tmp, 0, comm, &f, cx);
    if ((rc = ckpt_agree(comm, rc, err, errlen)) != PL_OK) goto out;
    rc = ckpt_read_meta(f, NULL, NULL, cx);
    for (int k = 0; k < 3 * n; k++) { /* after a failure: every collective call, no data */
        char dpath[96];
        ckpt_dataset_path(k / n, &gt[k % n], dpath, sizeof dpath);
        int mine = rc == PL_OK && ckpt_written_tensor(st, opt, &gt[k % n], k % n) != NULL;
        int r2 = verify_dataset(f, dpath, mine ? buf : NULL, gt[k % n].numel, rc == PL_OK ? cx : &later);
        if (rc == PL_OK) rc = r2;
    }
    rc = ckpt_agree(comm, rc, err, errlen);
    {
        h5ctx cc = {label, "", scratch, sizeof scratch, rank};
        int crc = ckpt_h5_close_file(&f, rc == PL_OK ? cx : &cc);
        if (rc == PL_OK) rc = ckpt_agree(comm, crc, err, errlen);
    }
out:
    free(buf);
    free(gt);
    return rc;
}

/* Collective: after the file is written and closed: the test-only corruption, the
 * verification, and rank 0's publication; returns the agreed status. */
static int check_and_publish(const char *dir, const char *tmp, const char *final, const char *name, const char *tag,
                             stage *st, optim *opt, MPI_Comm comm, char *err, size_t errlen) {
    int rank, size, who;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    h5ctx cxs = {final, "", err, errlen, rank}, *cx = &cxs;
    int rc = PL_OK, mode = ckpt_fail_mode(size, &who, cx);
    if (mode == FAIL_CORRUPT && rank == 0) {
        ckpt_gtensor *gt = calloc((size_t)model_num_tensors(&st->cfg), sizeof *gt);
        char dpath[96];
        int n = gt ? ckpt_global_tensors(&st->cfg, gt) : 0;
        if (gt) ckpt_dataset_path(2, &gt[n - 1], dpath, sizeof dpath);
        rc = gt ? inject_corruption(tmp, dpath, cx) : ckpt_fail(cx, PL_ENOMEM, "out of memory");
        free(gt);
    }
    if ((rc = ckpt_agree(comm, rc, err, errlen)) != PL_OK) return rc;
    if (!verify_off()) {
        rc = verify_file(tmp, final, st, opt, comm, err, errlen);
        if (rc != PL_OK) {
            char e2[1024];
            snprintf(e2, sizeof e2, "%s", err);
            snprintf(err, errlen, "verifying the written file before publishing it: %s; the temporary file was "
                     "removed and latest was not moved", e2);
            return rc;
        }
    }
    if (rank == 0) {
        if (mode == FAIL_RENAME)
            rc = ckpt_fail(cx, PL_EIO, "injected failure before renaming %s (PIPELM_CKPT_FAIL=rename)", tmp);
        else rc = publish(dir, tmp, final, name, tag, cx);
    }
    return ckpt_agree(comm, rc, err, errlen);
}

/* Collective: the atomic save into DIR (see the file comment); returns the agreed status. */
int ckpt_save(const char *dir, stage *st, optim *opt, const ckpt_meta *meta, int keep, MPI_Comm comm,
              char *path_out, size_t pathlen, double *bytes_out, char *err, size_t errlen) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    char tmp[4400], final[4400], name[64], tag[128];
    ckpt_job_tag(tag, sizeof tag); /* rank 0's, so that every rank names the same temporary file */
    PL_MPI_CHECK(MPI_Bcast(tag, (int)sizeof tag, MPI_CHAR, 0, comm));
    snprintf(name, sizeof name, "ckpt_%08lld.h5", meta->step);
    snprintf(tmp, sizeof tmp, "%s/.ckpt_%08lld.%s.h5.tmp", dir, meta->step, tag);
    snprintf(final, sizeof final, "%s/%s", dir, name);
    h5ctx cxs = {final, "", err, errlen, rank}, *cx = &cxs;
    err[0] = 0;
    if (path_out && pathlen) snprintf(path_out, pathlen, "%s", final);
    int rc = PL_OK;
    if (!opt) /* before anything is created (ckpt_write_file checks it too) */
        rc = ckpt_fail(cx, PL_EINVAL, "no optimizer given: a checkpoint holds the AdamW moments beside the "
                       "parameters, so saving one needs the stage's optimizer");
    else if (meta->step < 0) rc = ckpt_fail(cx, PL_EINVAL, "negative step %lld", meta->step);
    else if (strlen(dir) > 4000) rc = ckpt_fail(cx, PL_EINVAL, "directory name too long");
    else if (rank == 0) {
        if (pl_make_dirs(dir) != 0)
            rc = ckpt_fail(cx, PL_EIO, "cannot create directory %s: %s", dir, strerror(errno));
        else remove_stale_temps(dir, tag);
    }
    if ((rc = ckpt_agree(comm, rc, err, errlen)) != PL_OK) return rc;

    rc = ckpt_write_file(tmp, final, st, opt, meta, comm, bytes_out, err, errlen);
    if (rc == PL_OK) rc = check_and_publish(dir, tmp, final, name, tag, st, opt, comm, err, errlen);
    if (rc != PL_OK) {
        if (rank == 0) unlink(tmp); /* the previous checkpoint and latest stay untouched */
        return rc;
    }
    is_protected(meta->step, 1); /* written by this run now: its own to prune */
    if (rank == 0) prune(dir, keep, meta->step);
    PL_MPI_CHECK(MPI_Barrier(comm)); /* nobody looks at DIR before the pruning is over */
    return PL_OK;
}

/* Collective: one checkpoint at an explicit path, through path.tmp and a rename. */
int ckpt_save_file(const char *path_in, stage *st, optim *opt, const ckpt_meta *meta, MPI_Comm comm,
                   double *bytes_out, char *err, size_t errlen) {
    char path[4200];
    pl_output_target(path_in, path, sizeof path); /* through a link, to the file it names */
    int rank;
    MPI_Comm_rank(comm, &rank);
    char tmp[4400];
    h5ctx cxs = {path, "", err, errlen, rank};
    /* the target first: only a regular file or nothing is replaced; one temporary name for
     * all ranks, unique to this job (rank 0's pid) */
    int rc = PL_OK;
    long id = (long)getpid();
    if (rank == 0 && pl_is_dev_null_path(path))
        rc = ckpt_fail(&cxs, PL_EINVAL, "a checkpoint cannot be written to /dev/null (it is published by a rename)");
    else if (rank == 0) rc = pl_check_output_file(path, "checkpoint", err, errlen);
    PL_MPI_CHECK(MPI_Bcast(&id, 1, MPI_LONG, 0, comm));
    rc = ckpt_agree(comm, rc, err, errlen);
    if (rc != PL_OK) return rc;
    pl_output_tmp_name(path, id, tmp, sizeof tmp);
    rc = ckpt_write_file(tmp, path, st, opt, meta, comm, bytes_out, err, errlen);
    if (rc == PL_OK && rank == 0) {
        if (fsync_path(tmp) != 0) rc = ckpt_fail(&cxs, PL_EIO, "fsync of %s failed: %s", tmp, strerror(errno));
        else rc = pl_output_replace(tmp, path, "checkpoint", err, errlen);
    }
    rc = ckpt_agree(comm, rc, err, errlen);
    if (rc != PL_OK && rank == 0) unlink(tmp);
    return rc;
}

