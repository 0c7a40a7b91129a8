/*
 * files.c — file-type and writability checks for every path from the outside (files.h).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "util/common.h"
#include "util/files.h"

/* Name of a file type for messages. */
const char *pl_file_type_name(mode_t mode) {
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

/* Open without blocking (a FIFO with no writer would block open(2) forever), check the type
 * and size, then make the descriptor blocking again. */
int pl_open_input_fd(const char *path, const char *what, size_t max_bytes, int *fd_out, size_t *size, char *err,
                     size_t errlen) {
    *fd_out = -1;
    if (!path || !path[0]) {
        snprintf(err, errlen, "%s: empty file name", what);
        return PL_EIO;
    }
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        snprintf(err, errlen, "%s %s: cannot open it: %s", what, path, strerror(errno));
        return PL_EIO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        snprintf(err, errlen, "%s %s: fstat: %s", what, path, strerror(errno));
        close(fd);
        return PL_EIO;
    }
    if (!S_ISREG(sb.st_mode)) {
        snprintf(err, errlen, "%s %s: is %s, not a regular file", what, path, pl_file_type_name(sb.st_mode));
        close(fd);
        return PL_EIO;
    }
    if (max_bytes && (unsigned long long)sb.st_size > (unsigned long long)max_bytes) {
        snprintf(err, errlen, "%s %s: %lld bytes, more than the %zu this reader accepts", what, path,
                 (long long)sb.st_size, max_bytes);
        close(fd);
        return PL_EIO;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        snprintf(err, errlen, "%s %s: fcntl: %s", what, path, strerror(errno));
        close(fd);
        return PL_EIO;
    }
    if (size) *size = (size_t)sb.st_size;
    *fd_out = fd;
    return PL_OK;
}

/* pl_open_input_fd wrapped in a stdio stream. */
int pl_open_input(const char *path, const char *what, size_t max_bytes, FILE **out, char *err, size_t errlen) {
    int fd;
    *out = NULL;
    PL_TRY(pl_open_input_fd(path, what, max_bytes, &fd, NULL, err, errlen));
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        snprintf(err, errlen, "%s %s: fdopen: %s", what, path, strerror(errno));
        close(fd);
        return PL_EIO;
    }
    *out = f;
    return PL_OK;
}

/* Open-and-close check of an input. */
int pl_check_input_file(const char *path, const char *what, char *err, size_t errlen) {
    int fd;
    PL_TRY(pl_open_input_fd(path, what, 0, &fd, NULL, err, errlen));
    close(fd);
    return PL_OK;
}

/* The directory part of path ("." for a bare name, "/" for "/x"). */
static void dir_of(const char *path, char *dir, size_t len) {
    snprintf(dir, len, "%s", path);
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') dir[--n] = 0; /* "a/b/" names b */
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, len, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
}

/* Is this character device /dev/null (the one device an output may be)? */
static int is_dev_null(const struct stat *sb) {
    struct stat nb;
    return S_ISCHR(sb->st_mode) && stat("/dev/null", &nb) == 0 && nb.st_rdev == sb->st_rdev;
}

/* Check an output file: writable where it is, or creatable where it is not. */
int pl_check_output_file(const char *path, const char *what, char *err, size_t errlen) {
    if (!path || !path[0]) {
        snprintf(err, errlen, "%s: empty file name", what);
        return PL_EIO;
    }
    if (strlen(path) >= 4000) {
        snprintf(err, errlen, "%s: file name of %zu characters is too long", what, strlen(path));
        return PL_EIO;
    }
    if (path[strlen(path) - 1] == '/') {
        snprintf(err, errlen, "%s %s: names a directory, not a file", what, path);
        return PL_EIO;
    }
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (is_dev_null(&sb)) return PL_OK;
        if (!S_ISREG(sb.st_mode)) {
            snprintf(err, errlen, "%s %s: is %s, not a regular file that can be written", what, path,
                     pl_file_type_name(sb.st_mode));
            return PL_EIO;
        }
        /* opened for writing without O_TRUNC or O_CREAT: nothing about it changes */
        int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
        if (fd < 0) {
            snprintf(err, errlen, "%s %s: cannot be written: %s", what, path, strerror(errno));
            return PL_EIO;
        }
        close(fd);
        return PL_OK;
    }
    if (errno != ENOENT) {
        snprintf(err, errlen, "%s %s: %s", what, path, strerror(errno));
        return PL_EIO;
    }
    char dir[4096];
    dir_of(path, dir, sizeof dir);
    if (stat(dir, &sb) != 0) {
        snprintf(err, errlen, "%s %s: its directory %s: %s", what, path, dir, strerror(errno));
        return PL_EIO;
    }
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(err, errlen, "%s %s: %s is %s, not a directory", what, path, dir, pl_file_type_name(sb.st_mode));
        return PL_EIO;
    }
    /* the probe: create it exclusively and remove it (the file did not exist) */
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "%s %s: cannot be created: %s", what, path, strerror(errno));
        return PL_EIO;
    }
    close(fd);
    unlink(path);
    return PL_OK;
}

/* Check a directory that will receive files (created with mkdir -p if missing). */
int pl_check_output_dir(const char *dir, const char *what, char *err, size_t errlen) {
    if (!dir || !dir[0]) {
        snprintf(err, errlen, "%s: empty directory name", what);
        return PL_EIO;
    }
    if (strlen(dir) >= 4000) {
        snprintf(err, errlen, "%s: directory name of %zu characters is too long", what, strlen(dir));
        return PL_EIO;
    }
    struct stat sb;
    char cur[4096];
    snprintf(cur, sizeof cur, "%s", dir);
    /* the nearest existing ancestor (dir itself if it exists) */
    for (;;) {
        if (stat(cur, &sb) == 0) break;
        if (errno != ENOENT && errno != ENOTDIR) {
            snprintf(err, errlen, "%s %s: %s: %s", what, dir, cur, strerror(errno));
            return PL_EIO;
        }
        char up[4096];
        dir_of(cur, up, sizeof up);
        if (strcmp(up, cur) == 0) {
            snprintf(err, errlen, "%s %s: no existing parent directory", what, dir);
            return PL_EIO;
        }
        snprintf(cur, sizeof cur, "%s", up);
    }
    int exists = strcmp(cur, dir) == 0;
    if (!S_ISDIR(sb.st_mode)) {
        if (exists) snprintf(err, errlen, "%s %s: is %s, not a directory", what, dir, pl_file_type_name(sb.st_mode));
        else snprintf(err, errlen, "%s %s: cannot be created: %s is %s, not a directory", what, dir, cur,
                      pl_file_type_name(sb.st_mode));
        return PL_EIO;
    }
    if (access(cur, W_OK | X_OK) != 0) {
        if (exists) snprintf(err, errlen, "%s %s: directory is not writable: %s", what, dir, strerror(errno));
        else snprintf(err, errlen, "%s %s: cannot be created: %s is not writable: %s", what, dir, cur,
                      strerror(errno));
        return PL_EIO;
    }
    return PL_OK;
}

/* Is path /dev/null (the one device an output may name)? */
int pl_is_dev_null_path(const char *path) {
    struct stat sb;
    return path && path[0] && stat(path, &sb) == 0 && is_dev_null(&sb);
}

/* Open an in-place output: O_NONBLOCK so a FIFO cannot block the open, no O_TRUNC until fstat
 * has shown a regular file (so a device or FIFO is never touched), then blocking again. */
int pl_open_output(const char *path, const char *what, FILE **out, char *err, size_t errlen) {
    *out = NULL;
    PL_TRY(pl_check_output_file(path, what, err, errlen));
    int fd = open(path, O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "%s %s: cannot open it for writing: %s", what, path, strerror(errno));
        return PL_EIO;
    }
    struct stat sb;
    int rc = PL_OK;
    if (fstat(fd, &sb) != 0) {
        snprintf(err, errlen, "%s %s: fstat: %s", what, path, strerror(errno));
        rc = PL_EIO;
    } else if (!S_ISREG(sb.st_mode) && !is_dev_null(&sb)) { /* replaced since the check */
        snprintf(err, errlen, "%s %s: is %s, not a regular file that can be written", what, path,
                 pl_file_type_name(sb.st_mode));
        rc = PL_EIO;
    } else if (S_ISREG(sb.st_mode) && ftruncate(fd, 0) != 0) {
        snprintf(err, errlen, "%s %s: cannot truncate it: %s", what, path, strerror(errno));
        rc = PL_EIO;
    } else {
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
            snprintf(err, errlen, "%s %s: fcntl: %s", what, path, strerror(errno));
            rc = PL_EIO;
        }
    }
    FILE *f = rc == PL_OK ? fdopen(fd, "w") : NULL;
    if (rc == PL_OK && !f) {
        snprintf(err, errlen, "%s %s: fdopen: %s", what, path, strerror(errno));
        rc = PL_EIO;
    }
    if (rc != PL_OK) {
        close(fd);
        return rc;
    }
    *out = f;
    return PL_OK;
}

/* Close an output: a write that failed earlier (ferror), the final flush and the close itself
 * (where a full disk or quota shows up last) all count; f is closed in every case. */
int pl_close_output(FILE *f, const char *path, const char *what, char *err, size_t errlen) {
    if (!f) return PL_OK;
    /* the flush first: after an earlier failed write it retries what is buffered and so
     * reports the reason (ENOSPC, EDQUOT) that ferror alone would not */
    errno = 0;
    int bad = fflush(f) != 0;
    int e = bad ? errno : 0;
    if (!bad && ferror(f)) { bad = 1; e = 0; }
    if (fclose(f) != 0 && !bad) { bad = 1; e = errno; }
    if (!bad) return PL_OK;
    snprintf(err, errlen, "%s %s: writing it failed: %s", what, path, e ? strerror(e) : "write error");
    return PL_EIO;
}

/* A temporary name beside path, unique to one writer: path.HOST.ID.tmp (ID: the writing
 * rank's pid), so two jobs writing the same path never share a temporary file. */
void pl_output_tmp_name(const char *path, long id, char *tmp, size_t len) {
    char host[64] = "host";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "host");
    host[sizeof host - 1] = 0;
    for (char *p = host; *p; p++)
        if (*p == '/' || *p == '.') *p = '_';
    snprintf(tmp, len, "%s.%s.%ld.tmp", path, host, id);
}

/* Where a rename-published output really goes: through a symbolic link to its target (so the
 * link survives and the file it names is replaced), else path itself. */
void pl_output_target(const char *path, char *out, size_t len) {
    struct stat sb;
    char real[PATH_MAX];
    if (lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode) && realpath(path, real)) snprintf(out, len, "%s", real);
    else snprintf(out, len, "%s", path);
}

/* Publish tmp as path with rename(2), but only over a regular file or nothing: a device, FIFO,
 * socket, directory or symbolic link at path is never replaced (tmp is removed instead). */
int pl_output_replace(const char *tmp, const char *path, const char *what, char *err, size_t errlen) {
    struct stat sb;
    if (lstat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        snprintf(err, errlen, "%s %s: is %s now, which is never replaced; nothing written", what, path,
                 S_ISLNK(sb.st_mode) ? "a symbolic link" : pl_file_type_name(sb.st_mode));
        unlink(tmp);
        return PL_EIO;
    }
    if (rename(tmp, path) != 0) {
        snprintf(err, errlen, "%s: renaming %s to %s: %s", what, tmp, path, strerror(errno));
        unlink(tmp);
        return PL_EIO;
    }
    return PL_OK;
}

/* Refuse an output that is an input: the same inode (hard links and symbolic links included).
 * An output that does not exist yet cannot be any input. */
/* The name a path that does not exist yet will have: its directory's real path, then the last
 * component ("" if the directory cannot be resolved). */
static void future_name(const char *path, char *out, size_t len) {
    char dir[4096], real[PATH_MAX];
    dir_of(path, dir, sizeof dir);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (realpath(dir, real)) snprintf(out, len, "%s/%s", real, base);
    else out[0] = 0;
}

int pl_check_distinct(const char *out, const char *what_out, const char *in, const char *what_in, char *err,
                      size_t errlen) {
    struct stat so, si;
    if (!out || !out[0] || !in || !in[0]) return PL_OK;
    int eo = stat(out, &so) == 0, ei = stat(in, &si) == 0, same = 0;
    if (eo && ei) same = so.st_dev == si.st_dev && so.st_ino == si.st_ino && !is_dev_null(&so);
    else if (!eo && !ei) { /* two outputs to be: the same name once resolved */
        char a[PATH_MAX + 256], b[PATH_MAX + 256];
        future_name(out, a, sizeof a);
        future_name(in, b, sizeof b);
        same = a[0] && strcmp(a, b) == 0;
    }
    if (same) {
        snprintf(err, errlen, "%s %s is the same file as %s %s: refusing to overwrite it", what_out, out, what_in,
                 in);
        return PL_EINVAL;
    }
    return PL_OK;
}

/* mkdir -p. */
int pl_make_dirs(const char *dir) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
    struct stat sb;
    if (stat(buf, &sb) != 0) return -1;
    if (!S_ISDIR(sb.st_mode)) { errno = ENOTDIR; return -1; }
    return 0;
}

/* An output against every regular file directly inside the input directory dir. */
static int check_in_dir(const pl_io *out, const pl_io *dir, char *err, size_t errlen) {
    DIR *d = opendir(dir->path);
    if (!d) return PL_OK; /* unreadable: its reader says so */
    struct dirent *e;
    int rc = PL_OK;
    char file[PATH_MAX + 256], what[1024];
    while (rc == PL_OK && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(file, sizeof file, "%s/%s", dir->path, e->d_name);
        snprintf(what, sizeof what, "%s %.256s's file", dir->opt, dir->path);
        struct stat sb;
        if (stat(file, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        rc = pl_check_distinct(out->path, out->opt, file, what, err, errlen);
    }
    closedir(d);
    return rc;
}

int pl_check_io(const pl_io *in, int nin, const pl_io *out, int nout, char *err, size_t errlen) {
    for (int i = 0; i < nout; i++) {
        if (!out[i].path || !out[i].path[0]) continue;
        for (int j = 0; j < nin; j++) {
            struct stat sb;
            if (!in[j].path || !in[j].path[0]) continue;
            PL_TRY(pl_check_distinct(out[i].path, out[i].opt, in[j].path, in[j].opt, err, errlen));
            if (stat(in[j].path, &sb) == 0 && S_ISDIR(sb.st_mode)) PL_TRY(check_in_dir(&out[i], &in[j], err, errlen));
        }
        for (int j = i + 1; j < nout; j++)
            if (out[j].path && out[j].path[0])
                PL_TRY(pl_check_distinct(out[i].path, out[i].opt, out[j].path, out[j].opt, err, errlen));
    }
    return PL_OK;
}

long pl_read_whole(const char *path, const char *what, size_t max_bytes, char **text, char *err, size_t errlen) {
    FILE *f = NULL;
    *text = NULL;
    if (pl_open_input(path, what, max_bytes, &f, err, errlen) != PL_OK) return -1;
    size_t cap = 4096, n = 0;
    char *b = malloc(cap + 1);
    while (b) {
        n += fread(b + n, 1, cap - n, f);
        if (n < cap || cap >= max_bytes) break;
        char *nb = realloc(b, (cap *= 2) + 1);
        if (!nb) { free(b); b = NULL; }
        else b = nb;
    }
    int bad = !b || ferror(f);
    fclose(f);
    if (bad) {
        snprintf(err, errlen, "%s %s: %s", what, path, b ? "cannot read it" : "out of memory");
        free(b);
        return -1;
    }
    b[n] = 0;
    *text = b;
    return (long)n;
}

