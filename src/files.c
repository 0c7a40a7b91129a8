/*
 * files.c — file-type and writability checks for every path from the outside (files.h).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "pipelm/common.h"
#include "pipelm/files.h"

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
