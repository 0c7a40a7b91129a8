/*
 * comm.h — every wait of pipelm on another rank goes through here, so none can hang a job.
 *
 * A wait polls its request: it spins for 20 ms (a message that is about to arrive costs no
 * sleep, and every poll drives MPI's progress of a large non-blocking collective), then
 * yields the core between polls until 200 ms, then sleeps between polls, growing to 1 ms, so
 * a rank that waits for minutes does not burn a core. While it waits it watches three things: the watchdog
 * (a wait longer than comm_watchdog_s seconds prints what it waits for — action, peer,
 * micro-batch, step, how long — and fails with PL_ETIMEOUT), a stop signal that the current
 * step cannot honour (a wait that goes on for comm_stop_grace_s after SIGTERM/SIGINT fails
 * with PL_ESTOPPED), and a note after comm_notice_s so a stalled peer is never silent.
 * Collectives are the non-blocking MPI-3 forms waited on the same way; the blocking ones of
 * HDF5 run under a deadline watched by a thread (comm_deadline_arm). A failing wait
 * returns an error code; the caller does not attempt another collective but reaches the
 * job-wide abort (pipelm_main -> MPI_Abort).
 */
#ifndef PIPELM_COMM_H
#define PIPELM_COMM_H

#include <mpi.h>

/* Seconds one wait may take before the job is aborted (0: never). Default 600. */
extern double comm_watchdog_s;
/* Seconds a wait may go on once a stop signal is pending before the rank gives up. */
extern double comm_stop_grace_s;
/* Seconds after which a wait prints one note naming what it waits for. */
extern double comm_notice_s;
/* Yield the core from the first poll (ranks outnumber cores). */
extern int comm_polite;
/* The training step in progress, named by waits that do not know it (-1: none). */
extern long comm_step;

/* What a wait is for, for the watchdog's message. peer/mb/step < 0: not applicable. */
typedef struct {
    const char *what;   /* "1RECV_B3", "allreduce of the gradient norm" */
    int peer, mb;
    long step;
} comm_what;

/* Wait for one request under the watchdog. PL_OK, PL_EMPI, PL_ETIMEOUT or PL_ESTOPPED. */
int comm_wait(MPI_Request *rq, const comm_what *w);
/* Wait for every request in rq[0..n) (MPI_REQUEST_NULL entries are skipped). */
int comm_waitall(int n, MPI_Request *rq, const comm_what *w);

/* Collectives under the watchdog; `what` names the collective in messages. */
int comm_allreduce(const void *in, void *out, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c, const char *what);
int comm_bcast(void *buf, int n, MPI_Datatype t, int root, MPI_Comm c, const char *what);
int comm_gather(const void *in, int n, MPI_Datatype t, void *out, int root, MPI_Comm c, const char *what);
int comm_barrier(MPI_Comm c, const char *what);
/* Collective over comm: rank 0 reads the whole of a small input (pl_read_whole: at most
 * max_bytes, 0 for 1 GiB; a FIFO, device or directory refused by name) and broadcasts it under
 * the watchdog, so every rank parses the same bytes, a stream is never read differently by two
 * ranks, and a rank 0 stuck in the read ends the job by the others' watchdog. *text
 * (NUL-terminated, *len bytes; free it) on every rank, or the same failure on every rank with
 * the message in err on rank 0 (empty on the others: one line, not P). */
int comm_read_bcast(const char *path, const char *what, size_t max_bytes, MPI_Comm comm, char **text, size_t *len,
                    char *err, size_t errlen);
/* Every rank agrees on a status: the worst code wins, *who is the lowest failing rank (or -1). */
int comm_agree(MPI_Comm c, int rc, int *who);

/* A blocking collective the polls cannot watch (HDF5's collective file calls, MPI-IO): arm a
 * deadline of `seconds` before it and disarm after. If it passes still armed, a watcher
 * thread prints that the rank is stuck in `what` and ends the process with exit 1 (mpiexec or
 * srun then ends the others). Nothing is armed when comm_watchdog_s is 0. PL_OK or PL_ENOMEM
 * (no thread). */
int comm_deadline_arm(const char *what, double seconds);
/* Mark the armed deadline's rank as inside the collective: when it passes, a rank that never
 * got there says it stalled, and ranks inside (which report 2 s later, so the stalled one is
 * heard first) say they waited for a peer. */
void comm_deadline_enter(void);
void comm_deadline_disarm(void);

/* MPI_Init_thread at the level a run needs: MPI_THREAD_MULTIPLE when `multiple` (an
 * asynchronous checkpoint writer makes MPI calls beside the training thread), else
 * MPI_THREAD_SINGLE as MPI_Init gives. Test-only: PIPELM_MPI_THREAD=single|funneled|
 * serialized|multiple asks for that level instead (to see --ckpt-async refused). Returns
 * MPI_Init_thread's status. */
int comm_init_thread(int *argc, char ***argv, int multiple);

#endif
