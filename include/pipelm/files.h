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
 * an unwritable path is found at start-up instead of after training. Each returns PL_OK, or
 * PL_EIO with "WHAT PATH: problem" in err; none prints anything.
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
/* Name of a file type from st_mode: "a directory", "a FIFO (named pipe)", ... */
const char *pl_file_type_name(mode_t mode);

#endif
