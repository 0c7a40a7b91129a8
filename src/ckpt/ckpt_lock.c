/*
 * ckpt_lock.c — one job at a time in a checkpoint directory (docs/formats.md §2, "the lock").
 *
 * Two jobs writing one --ckpt-dir overwrite each other's files: the visible checkpoint ends
 * up a mix of both and latest points at it. So rank 0 takes DIR/.lock before step 1 and
 * removes it when the run ends. The lock is created whole or not at all: its text (format
 * line, host, pid, Slurm job id, restart count, start time) is written to a temporary file
 * named after this process, fsynced, and link()ed to DIR/.lock, which fails with EEXIST if
 * the lock is held (atomic on local file systems and on NFS). A lock that is held is judged:
 *   - the same Slurm job id with another restart count: a requeue of that job, whose earlier
 *     run is gone: stale;
 *   - this host and a pid that no longer exists (kill(pid, 0) fails with ESRCH): stale;
 *   - this host and a live pid, or another host (whose pids cannot be checked from here), or
 *     a file that is not a lock: held; the run is refused naming the owner, and told how to
 *     remove a lock it knows to be stale (rm DIR/.lock).
 * A stale lock is taken over with a note: it is renamed to a name of this process (of two
 * jobs taking it over at once only one rename succeeds), checked to be the file judged stale
 * (the same inode), removed, and this job's lock linked in its place.
 *
 * The temporary names of a save carry the tag "<host>.<pid>" of rank 0 (ckpt_job_tag), so
 * two processes never write one temporary file.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include "ckpt/ckpt_internal.h"
#include "util/common.h"
#include "util/files.h"

#define LOCK_NAME ".lock"
#define LOCK_FORMAT "pipelm-ckpt-lock 1"

/* The lock this process holds ("" if none): removed by ckpt_lock_release. */
static char held_lock[4400];

/* What a lock file says about its owner. */
typedef struct {
    char host[128], job[64], started[40];
    long pid, restart;
    int valid; /* the format line and a host and pid were found */
} lock_info;

/* This host's name, reduced to [A-Za-z0-9._-] (it goes into file names). */
static void host_name(char *buf, size_t len) {
    if (gethostname(buf, len) != 0 || !buf[0]) snprintf(buf, len, "unknown");
    buf[len - 1] = 0;
    for (char *p = buf; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
              *p == '-' || *p == '_'))
            *p = '_';
}

/* "<host>.<pid>" of this process: the tag of its temporary file names. */
void ckpt_job_tag(char *buf, size_t len) {
    char h[64];
    host_name(h, sizeof h);
    snprintf(buf, len, "%s.%ld", h, (long)getpid());
}

/* Is a process with this pid alive on this host? kill(pid, 0) failing with ESRCH says no
 * (EPERM: it exists); so does a zombie (Linux /proc/PID/stat state Z or X): a rank killed by
 * MPI_Abort stays one where nobody reaps it (PID 1 of a container), and kill() still finds it. */
int ckpt_pid_alive(long pid) {
    if (pid <= 0) return 0;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 0;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 1; /* no /proc: kill() said it exists */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold spaces and ')' */
    return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

/* This process as a lock's owner: host, pid, SLURM_JOB_ID ("none"), SLURM_RESTART_COUNT. */
static void lock_self(lock_info *me) {
    memset(me, 0, sizeof *me);
    host_name(me->host, sizeof me->host);
    me->pid = (long)getpid();
    const char *j = getenv("SLURM_JOB_ID"), *r = getenv("SLURM_RESTART_COUNT");
    snprintf(me->job, sizeof me->job, "%s", j && j[0] ? j : "none");
    me->restart = r && r[0] ? atol(r) : 0;
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(me->started, sizeof me->started, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    me->valid = 1;
}

/* Parse a lock file's text (key=value lines after the format line). */
static void lock_parse(const char *text, lock_info *li) {
    memset(li, 0, sizeof *li);
    if (strncmp(text, LOCK_FORMAT "\n", strlen(LOCK_FORMAT) + 1) != 0) return;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", text);
    char *save = NULL;
    int have_pid = 0;
    for (char *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (strncmp(l, "host=", 5) == 0) snprintf(li->host, sizeof li->host, "%s", l + 5);
        else if (strncmp(l, "pid=", 4) == 0) { li->pid = atol(l + 4); have_pid = li->pid > 0; }
        else if (strncmp(l, "job=", 4) == 0) snprintf(li->job, sizeof li->job, "%s", l + 4);
        else if (strncmp(l, "restart=", 8) == 0) li->restart = atol(l + 8);
        else if (strncmp(l, "started=", 8) == 0) snprintf(li->started, sizeof li->started, "%s", l + 8);
    }
    if (!li->job[0]) snprintf(li->job, sizeof li->job, "none");
    li->valid = li->host[0] && have_pid;
}

/* Read the lock at path: its text parsed into *li and its inode; -1 with errno if unreadable. */
static int lock_read(const char *path, lock_info *li, ino_t *ino) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat sb;
    char text[1024];
    ssize_t n = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? read(fd, text, sizeof text - 1) : -1;
    int e = errno;
    close(fd);
    if (n < 0) { errno = S_ISREG(sb.st_mode) ? e : EINVAL; return -1; }
    text[n] = 0;
    lock_parse(text, li);
    *ino = sb.st_ino;
    return 0;
}

/* Write this process's lock text to a temporary file of its own (fsynced), to be linked. */
static int lock_write_temp(const char *tmp, const lock_info *me) {
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    char text[512];
    int n = snprintf(text, sizeof text, LOCK_FORMAT "\nhost=%s\npid=%ld\njob=%s\nrestart=%ld\nstarted=%s\n", me->host,
                     me->pid, me->job, me->restart, me->started);
    int ok = write(fd, text, (size_t)n) == n && fsync(fd) == 0;
    int e = errno;
    ok = close(fd) == 0 && ok;
    if (!ok) { unlink(tmp); errno = e; return -1; }
    return 0;
}

/* Is the lock's owner gone? 1 and a reason in `why` if it is stale, 0 if it may be alive. */
static int lock_stale(const lock_info *li, const lock_info *me, char *why, size_t len) {
    if (!li->valid) return 0;
    if (strcmp(li->job, "none") != 0 && strcmp(li->job, me->job) == 0 && li->restart != me->restart) {
        snprintf(why, len, "Slurm job %s, restart %ld, is this job before its requeue (restart %ld)", li->job,
                 li->restart, me->restart);
        return 1;
    }
    if (strcmp(li->host, me->host) == 0 && li->pid != me->pid && !ckpt_pid_alive(li->pid)) {
        snprintf(why, len, "pid %ld on this host (%s) no longer runs", li->pid, li->host);
        return 1;
    }
    return 0;
}

/* The refusal of a lock that is held, naming the directory, the owner and what to do. */
static void lock_refusal(const char *dir, const char *lock, const lock_info *li, const lock_info *me, char *err,
                         size_t errlen) {
    if (!li->valid)
        snprintf(err, errlen, "checkpoint directory %s is locked: %s exists but is not a pipelm lock (it should "
                 "name the owner's host and pid); if no job uses %s, remove it (rm %s)", dir, lock, dir, lock);
    else if (strcmp(li->host, me->host) == 0)
        snprintf(err, errlen, "checkpoint directory %s is in use by another job: host %s, pid %ld, job %s, started "
                 "%s (lock %s); one job at a time may write a checkpoint directory: give this run another "
                 "--ckpt-dir, or wait for that one to end", dir, li->host, li->pid, li->job, li->started, lock);
    else
        snprintf(err, errlen, "checkpoint directory %s is in use by another job: host %s, pid %ld, job %s, started "
                 "%s (lock %s); this host (%s) cannot tell whether that process is still alive: if that job has "
                 "ended, remove the lock (rm %s) and start again, else give this run another --ckpt-dir", dir,
                 li->host, li->pid, li->job, li->started, lock, me->host, lock);
}

/* Move a stale lock (inode ino) out of the way; 1 if done, 0 if another job moved it first. */
static int lock_remove_stale(const char *lock, ino_t ino, const char *tag) {
    char aside[4600];
    snprintf(aside, sizeof aside, "%s.stale.%s", lock, tag);
    if (rename(lock, aside) != 0) return 0;
    struct stat sb;
    if (stat(aside, &sb) == 0 && sb.st_ino != ino) { /* a fresh lock came in between: give it back */
        if (rename(aside, lock) != 0) unlink(aside);
        return 0;
    }
    unlink(aside);
    return 1;
}

/* One process (rank 0): take DIR/.lock (see the file comment). PL_OK, with a note in `note`
 * (or "") if a stale lock was taken over; PL_EINVAL naming the owner if it is held; PL_EIO
 * if the lock cannot be written. */
int ckpt_lock_take(const char *dir, char *note, size_t notelen, char *err, size_t errlen) {
    char lock[4400], tmp[4600], tag[128], why[256];
    lock_info me, li;
    note[0] = err[0] = 0;
    if (strlen(dir) > 4000) { snprintf(err, errlen, "directory name too long"); return PL_EINVAL; }
    if (pl_make_dirs(dir) != 0) {
        snprintf(err, errlen, "cannot create directory %s: %s", dir, strerror(errno));
        return PL_EIO;
    }
    snprintf(lock, sizeof lock, "%s/" LOCK_NAME, dir);
    ckpt_job_tag(tag, sizeof tag);
    snprintf(tmp, sizeof tmp, "%s.%s.tmp", lock, tag);
    lock_self(&me);
    if (lock_write_temp(tmp, &me) != 0) {
        snprintf(err, errlen, "cannot write the lock of checkpoint directory %s (%s): %s", dir, tmp, strerror(errno));
        return PL_EIO;
    }
    int rc = PL_EIO; /* a held lock is a failure (exit 1), not a bad setting */
    for (int attempt = 0; attempt < 5; attempt++) {
        if (link(tmp, lock) == 0) { rc = PL_OK; break; }
        if (errno != EEXIST) {
            snprintf(err, errlen, "cannot create the lock %s: %s", lock, strerror(errno));
            rc = PL_EIO;
            break;
        }
        ino_t ino;
        if (lock_read(lock, &li, &ino) != 0) {
            if (errno == ENOENT) continue; /* released meanwhile: try again */
            snprintf(err, errlen, "checkpoint directory %s is locked: cannot read %s: %s", dir, lock, strerror(errno));
            break;
        }
        if (li.valid && li.pid == me.pid && strcmp(li.host, me.host) == 0) { rc = PL_OK; break; } /* ours */
        if (!lock_stale(&li, &me, why, sizeof why)) { lock_refusal(dir, lock, &li, &me, err, errlen); break; }
        if (lock_remove_stale(lock, ino, tag))
            snprintf(note, notelen, "took over the stale lock %s of host %s, pid %ld, job %s, started %s: %s", lock,
                     li.host, li.pid, li.job, li.started, why);
    }
    if (rc == PL_EIO && !err[0]) snprintf(err, errlen, "checkpoint directory %s: the lock %s keeps changing "
                                              "(other jobs are starting in it)", dir, lock);
    unlink(tmp);
    if (rc == PL_OK) snprintf(held_lock, sizeof held_lock, "%s", lock);
    return rc;
}

/* Remove the lock this process holds, if it still is ours (a lock taken over by a requeued
 * job is left alone). */
void ckpt_lock_release(void) {
    if (!held_lock[0]) return;
    lock_info li, me;
    ino_t ino;
    lock_self(&me);
    if (lock_read(held_lock, &li, &ino) == 0 && li.valid && li.pid == me.pid && strcmp(li.host, me.host) == 0)
        unlink(held_lock);
    held_lock[0] = 0;
}

/* Does this process hold the lock of dir? */
int ckpt_lock_held(const char *dir) {
    char lock[4400];
    snprintf(lock, sizeof lock, "%s/" LOCK_NAME, dir);
    return held_lock[0] && strcmp(lock, held_lock) == 0;
}
