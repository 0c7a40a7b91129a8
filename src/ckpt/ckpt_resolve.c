/*
 * ckpt_resolve.c — what --resume names: a checkpoint file, or a directory and the checkpoint
 * its DIR/latest pointer names (with a loud fallback to the newest ckpt_*.h5 when latest is
 * missing or names a file that is gone; a malformed latest is refused).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>
#include "ckpt/ckpt_internal.h"
#include "util/common.h"
#include "util/files.h"

/* ---- resolving --resume ----------------------------------------------------------------- */

/* The newest ckpt_<step>.h5 in dir (step -1 if none); PL_EIO if dir cannot be read. */
static int newest_in_dir(const char *dir, long long *best, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    *best = -1;
    if (!d) {
        snprintf(err, errlen, "checkpoint directory %s: %s", dir, strerror(errno));
        return PL_EIO;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s = ckpt_name_step(e->d_name);
        if (s > *best) *best = s;
    }
    closedir(d);
    return PL_OK;
}

/* DIR/latest: *found = 1 and path if it names an existing checkpoint; *found = 0 and `why`
 * if it is missing or names a file that is gone; PL_EIO with err if it is unusable. */
static int read_latest(const char *dir, char *path, size_t pathlen, int *found, char *why, size_t whylen, char *err,
                       size_t errlen) {
    struct stat sb;
    char lf[4400], cand[4400 + 512];
    *found = 0;
    snprintf(lf, sizeof lf, "%s/latest", dir);
    if (lstat(lf, &sb) != 0) {
        snprintf(why, whylen, "%s is missing", lf);
        return PL_OK;
    }
    /* DIR/latest holds one line: the file name of the newest complete checkpoint in DIR */
    FILE *fp = NULL;
    char name[512] = "", e2[4600];
    if (pl_open_input(lf, "checkpoint pointer", 4096, &fp, e2, sizeof e2) != PL_OK) {
        snprintf(err, errlen, "%s (it should hold the name of the newest checkpoint; remove it to use the "
                 "newest ckpt_*.h5)", e2);
        return PL_EIO;
    }
    size_t got = fread(name, 1, sizeof name - 1, fp);
    fclose(fp);
    name[got] = 0;
    size_t n = strcspn(name, "\n");
    int garbage = strlen(name) != got || (name[n] == '\n' && name[n + 1] != 0); /* a NUL, or a second line */
    name[n] = 0;
    if (!garbage && name[0] && (strchr(name, '/') || strstr(name, "..") || ckpt_name_step(name) < 0)) garbage = 1;
    if (!name[0] || garbage) {
        char shown[160];
        size_t o = 0;
        for (size_t i = 0; i < n && i < 60 && o + 6 < sizeof shown; i++) {
            unsigned char c = (unsigned char)name[i];
            if (c >= 0x20 && c < 0x7f) shown[o++] = (char)c;
            else o += (size_t)snprintf(shown + o, sizeof shown - o, "\\x%02x", c);
        }
        shown[o] = 0;
        snprintf(err, errlen, "checkpoint pointer %s is %s: it must hold one file name ckpt_<step>.h5 of a "
                 "checkpoint in %s (remove it to resume from the newest ckpt_*.h5, or give --resume FILE)", lf,
                 !name[0] && !garbage ? "empty" : strchr(name, '/') || strstr(name, "..")
                 ? "refused (it names a path outside the checkpoint directory)" : "not a checkpoint name", dir);
        if (name[0]) snprintf(err + strlen(err), errlen - strlen(err), "; it holds '%s'", shown);
        return PL_EIO;
    }
    snprintf(cand, sizeof cand, "%s/%s", dir, name);
    if (stat(cand, &sb) != 0) {
        snprintf(why, whylen, "%s names %s, which is gone (%s)", lf, name, strerror(errno));
        return PL_OK;
    }
    PL_TRY(pl_check_input_file(cand, "checkpoint", err, errlen));
    snprintf(path, pathlen, "%s", cand);
    *found = 1;
    return PL_OK;
}

/* The checkpoint DIR/latest names, without any fallback (see ckpt.h; one process). */
int ckpt_latest(const char *dir, char *path, size_t pathlen, char *err, size_t errlen) {
    int found;
    char why[5200] = "";
    PL_TRY(read_latest(dir, path, pathlen, &found, why, sizeof why, err, errlen));
    if (!found) snprintf(err, errlen, "%s", why);
    return found ? PL_OK : PL_EIO;
}

/* What --resume names: a file, or the checkpoint DIR/latest names (see ckpt.h; one process). */
int ckpt_resolve(const char *path_or_dir, char *path, size_t pathlen, char *err, size_t errlen) {
    struct stat sb;
    if (stat(path_or_dir, &sb) != 0) {
        snprintf(err, errlen, "checkpoint %s: %s", path_or_dir, strerror(errno));
        return PL_EIO;
    }
    if (!S_ISDIR(sb.st_mode)) {
        PL_TRY(pl_check_input_file(path_or_dir, "checkpoint", err, errlen));
        snprintf(path, pathlen, "%s", path_or_dir);
        return PL_OK;
    }
    int found;
    char why[5200] = "";
    PL_TRY(read_latest(path_or_dir, path, pathlen, &found, why, sizeof why, err, errlen));
    if (found) return PL_OK;
    /* no usable latest: the highest-numbered ckpt_*.h5 (temporary files do not match), loudly */
    long long best;
    PL_TRY(newest_in_dir(path_or_dir, &best, err, errlen));
    if (best < 0) {
        snprintf(err, errlen, "no checkpoint in %s (%s and there is no ckpt_*.h5)", path_or_dir, why);
        return PL_EIO;
    }
    snprintf(path, pathlen, "%s/ckpt_%08lld.h5", path_or_dir, best);
    PL_TRY(pl_check_input_file(path, "checkpoint", err, errlen));
    if (pl_rank <= 0)
        fprintf(stderr, "pipelm: rank 0: warning: %s: resuming from the newest checkpoint file instead, %s\n", why,
                path);
    return PL_OK;
}

