/*
 * common.h — error codes, logging and the one checking macro for MPI calls.
 *
 * Every library function in pipelm returns an int status (PL_OK on success) and lets the
 * caller decide what to do; only the top level (pipelm_main) turns a failure into a
 * collective, non-zero exit. Messages name the rank that saw the problem. MPI calls go
 * through PL_MPI_CHECK, which evaluates the call once and reports file, line, rank and
 * MPI's own error string (the communicators use MPI_ERRORS_RETURN so errors come back).
 */
#ifndef PIPELM_COMMON_H
#define PIPELM_COMMON_H

#include <stddef.h>
#include <stdio.h>
#include <mpi.h>

enum {
    PL_OK = 0,
    PL_EINVAL = 1,   /* bad argument, flag or configuration */
    PL_EIO = 2,      /* file missing, unreadable, corrupt */
    PL_ENOMEM = 3,   /* allocation failed */
    PL_EMPI = 4,     /* an MPI call failed */
    PL_ENUM = 5,     /* NaN/Inf in the loss or gradients */
    PL_EPEER = 6,    /* another rank failed */
    PL_EHDF5 = 7,    /* an HDF5 call failed */
    PL_EPREEMPT = 8, /* stopped by a signal after saving a checkpoint */
    PL_ETIMEOUT = 9, /* the watchdog: a wait on another rank took too long */
    PL_ESTOPPED = 10, /* a stop signal arrived while the step could not finish */
    PL_EBACKEND = 11, /* a compute backend call failed (its message in be->error()) */
    PL_ESTATE = 12,  /* a check failed while running (the engine refused a schedule action): not a setting */
};

/* The world rank, cached at start-up for messages (-1 before MPI_Init). */
extern int pl_rank;
/* Messages from rank 0 only go to this stream (stdout by default, tests redirect it). */
extern FILE *pl_out;

/* Print to pl_out on rank 0 only. */
void pl_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print "pipelm: rank R: error: ..." to stderr, from whichever rank calls it. */
void pl_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print "pipelm: rank R: note: ..." to stderr: something the user should know, not a failure. */
void pl_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print "pipelm: rank R: warning: ..." to stderr: something failed that costs no result (a
 * diagnostic output); the run goes on. */
void pl_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Wall-clock seconds (MPI_Wtime). */
double pl_now(void);
/* The host memory the node can still give (MemAvailable of /proc/meminfo) in bytes, or a
 * negative value when unknown; the environment variable env (test-only, in MB; NULL: none)
 * stands in for it when set. */
double pl_mem_available(const char *env);

/* Check an MPI call: on failure report it and return PL_EMPI from the enclosing function. */
#define PL_MPI_CHECK(call)                                                              \
    do {                                                                                \
        int pl_mpi_rc_ = (call);                                                        \
        if (pl_mpi_rc_ != MPI_SUCCESS) {                                                \
            char pl_mpi_s_[MPI_MAX_ERROR_STRING];                                       \
            int pl_mpi_n_ = 0;                                                          \
            MPI_Error_string(pl_mpi_rc_, pl_mpi_s_, &pl_mpi_n_);                        \
            pl_error("%s:%d: %s failed: %s", __FILE__, __LINE__, #call, pl_mpi_s_);     \
            return PL_EMPI;                                                             \
        }                                                                               \
    } while (0)

/* Propagate a non-zero status from a call to the caller. */
#define PL_TRY(call)                                                                    \
    do {                                                                                \
        int pl_try_rc_ = (call);                                                        \
        if (pl_try_rc_ != PL_OK) return pl_try_rc_;                                     \
    } while (0)

/* Exit status of a run stopped by SIGTERM/SIGUSR1 after saving a checkpoint (EX_TEMPFAIL):
 * a job script requeues on it. */
#define PIPELM_EXIT_PREEMPTED 75

/* The longest path a setting or a message holds (PATH_MAX). */
#define PL_PATH 4096

#endif
