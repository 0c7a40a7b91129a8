/*
 * signals.h — how pipelm stops on SIGTERM, SIGINT and SIGUSR1.
 *
 * The first SIGTERM, SIGINT or SIGUSR1 asks for a clean stop: the step in progress finishes,
 * every rank learns of it in the step's all-reduce, a checkpoint is saved (with --ckpt-dir)
 * and the run exits with status 75. A second SIGTERM or SIGINT ends the rank at once with a
 * message and status 128 + signal; the launcher (mpiexec, srun) then ends the other ranks.
 * A stop that the current step cannot honour (a peer is gone or stopped) is caught by the
 * waits in comm.c after comm_stop_grace_s. For train and bench the handlers are installed by a
 * constructor in main.c, before MPI_Init; a stop that arrives before step 1 is agreed on at the
 * start of the run, which then ends at once with status 75 (nothing trained, nothing saved).
 */
#ifndef PIPELM_SIGNALS_H
#define PIPELM_SIGNALS_H

/* Install the handlers (idempotent). */
void signals_install(void);
/* Restore the previous handlers and forget a pending stop. */
void signals_restore(void);
/* The signal number of a pending stop request, or 0. */
int signals_stop_pending(void);
/* Name of a signal for messages ("SIGTERM"). */
const char *signals_name(int sig);

#endif
