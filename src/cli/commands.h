/*
 * commands.h — the registry of subcommands: one row each ({name, main, summary}) in
 * commands.c's table, which `pipelm --help` lists and pipelm_main dispatches on. Adding a
 * subcommand: its own file with a main of this signature, and one row (docs/contributing.md).
 *
 * A main gets the whole argv (argv[1] is the subcommand, its options start at argv[2]), the
 * job's communicator, and sets *abort_needed when this rank failed alone while its peers may
 * be blocked (the caller then MPI_Aborts). It returns the process exit status: 0 done, 1 a
 * failure, 2 a bad command line or setting, 75 (PIPELM_EXIT_PREEMPTED) stopped by a signal.
 * Every rank calls it; a subcommand that runs on rank 0 only returns 0 on the others.
 */
#ifndef PIPELM_COMMANDS_H
#define PIPELM_COMMANDS_H

#include <mpi.h>

typedef int (*pl_command_main)(int argc, char **argv, MPI_Comm comm, int *abort_needed);

typedef struct {
    const char *name;       /* what the user types: pipelm NAME */
    pl_command_main main;
    const char *summary;    /* one line of `pipelm --help` */
} pl_command;

/* The table, ended by a row whose name is NULL. */
extern const pl_command pl_commands[];

/* The row named name, or NULL. */
const pl_command *pl_command_find(const char *name);

/* The subcommands' mains that live in src/cli/ (the others are declared by their modules). */
int train_cmd_main(int argc, char **argv, MPI_Comm comm, int *abort_needed);
int bench_cmd_main(int argc, char **argv, MPI_Comm comm, int *abort_needed);
int schedule_main(int argc, char **argv, MPI_Comm comm, int *abort_needed);

#endif
