/*
 * files.h — checks on the files a run reads and writes, before it relies on them.
 *
 * Every path from the outside (--data, --val-data, text:FILE, --init, --config, --resume,
 * DIR/latest, --schedule-csv, convert and inspect inputs) is opened through pl_open_input or
 * checked with pl_check_input_file: the file is opened with O_NONBLOCK so a FIFO cannot block
 * the open, fstat()ed, and refused unless it is a regular file (a directory, FIFO, socket or
 * device such as /dev/zero is named with its type), and refused if it is larger than the
 * reader's bound. Outputs (--metrics, --trace, --save-final, --schedule-csv of `schedule`,
 * --ckpt-dir) are checked with pl_check_output_file / pl_check_output_dir before step 1, so
 * an unwritable path is found at start-up instead of after training, then opened with
 * pl_open_output (written in place) or written to pl_output_tmp_name and published with
 * pl_output_replace (llm.c files, checkpoints): nothing but a regular file is ever truncated or
 * renamed over, and an output that is one of the run's inputs is refused (pl_check_distinct).
 * Each returns PL_OK, or PL_EIO with "WHAT PATH: problem" in err; none prints anything.
 */
#ifndef PIPELM_FILES_H
#define PIPELM_FILES_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

/* Open path for reading as a regular file of at most max_bytes (0: no limit); *out gets a
 * FILE* (blocking again) the caller fcloses. `what` names the file in messages ("config
 * file", "model file"). */
int pl_open_input(const char *path, const char *what, size_t max_bytes, FILE **out, char *err, size_t errlen);
/* The same as pl_open_input, but returns a file descriptor (O_CLOEXEC, blocking) and the
 * file's size in *size (may be NULL), for readers that use pread. */
int pl_open_input_fd(const char *path, const char *what, size_t max_bytes, int *fd, size_t *size, char *err,
                     size_t errlen);
/* Check that path is an existing regular file that can be opened for reading (without
 * keeping it open). */
int pl_check_input_file(const char *path, const char *what, char *err, size_t errlen);
/* Check that path can be written later: its directory exists and is writable; the path is
 * not a directory, FIFO, socket or device (/dev/null is allowed); an existing file must be a
 * writable regular file (it is neither truncated nor changed). A path that does not exist is
 * created and removed again as a probe. */
int pl_check_output_file(const char *path, const char *what, char *err, size_t errlen);
/* Check that dir can hold new files: an existing dir must be a writable directory; one that
 * does not exist must be creatable (its nearest existing ancestor a writable directory). */
int pl_check_output_dir(const char *dir, const char *what, char *err, size_t errlen);
/* Is path /dev/null? (Writers that publish with a rename write nothing to it.) */
int pl_is_dev_null_path(const char *path);
/* Open an output that is written in place (metrics, trace, CSV, JSON, costs): checked as
 * pl_check_output_file, opened without blocking and truncated only once fstat shows a regular
 * file (or /dev/null), so a device or FIFO is refused, never written or replaced. */
int pl_open_output(const char *path, const char *what, FILE **out, char *err, size_t errlen);
/* fflush and fclose an output, reporting an earlier failed write, the flush or the close (a
 * full disk) as "WHAT PATH: writing it failed: ..."; f is closed in every case. */
int pl_close_output(FILE *f, const char *path, const char *what, char *err, size_t errlen);
/* The temporary name beside path for a writer that publishes with rename: path.HOST.ID.tmp,
 * ID the writing rank's pid, so two jobs never share one. */
void pl_output_tmp_name(const char *path, long id, char *tmp, size_t len);
/* The file a rename-published output replaces: a symbolic link's target, else path. */
void pl_output_target(const char *path, char *out, size_t len);
/* rename tmp over path only if path is a regular file or absent; otherwise remove tmp and
 * refuse (a device, FIFO, socket, directory or link is never replaced). */
int pl_output_replace(const char *tmp, const char *path, const char *what, char *err, size_t errlen);
/* PL_EINVAL if out and in are the same file: the same device and inode when both exist, the
 * same resolved name when neither does (two outputs); /dev/null is never the same. */
int pl_check_distinct(const char *out, const char *what_out, const char *in, const char *what_in, char *err,
                      size_t errlen);
/* The whole of a small input (at most max_bytes, through pl_open_input: a FIFO, device or
 * directory is refused by name, never opened blocking): its length, *text malloc'ed and
 * NUL-terminated (free it), or -1 with err. comm_read_bcast (parallel/comm.h) reads one on
 * rank 0 for every rank. */
long pl_read_whole(const char *path, const char *what, size_t max_bytes, char **text, char *err, size_t errlen);
/* One input or output of a subcommand, for pl_check_io: the option that names it ("--json",
 * "input") and its path ("" or NULL: not given). */
typedef struct {
    const char *opt;
    const char *path;
} pl_io;
/* A subcommand's table of inputs and outputs, checked at once: every output against every
 * input (pl_check_distinct), against every file inside an input that is a directory (a
 * checkpoint or Hugging Face directory), and against every other output. PL_EINVAL with
 * "OUT PATH is the same file as IN PATH: refusing to overwrite it" (exit 2) for the first
 * pair that is one file. */
int pl_check_io(const pl_io *in, int nin, const pl_io *out, int nout, char *err, size_t errlen);
/* Name of a file type from st_mode: "a directory", "a FIFO (named pipe)", ... */
const char *pl_file_type_name(mode_t mode);

/* mkdir -p dir (mode 0755): 0, or -1 with errno (ENOTDIR: a part of it is not a directory). */
int pl_make_dirs(const char *dir);

#endif
