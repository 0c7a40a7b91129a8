/*
 * pipelm.h — the library entry point behind the `pipelm` program.
 *
 * `main` only initialises MPI and calls pipelm_main; tests call pipelm_main too (on
 * MPI_COMM_WORLD or MPI_COMM_SELF) and capture rank 0's output through `out`. Subcommands:
 * the table of cli/commands.h; plus --help and --version. The return value is the process exit
 * status (0 success, 1 failure, 2 usage error); *abort_needed is set when this rank failed
 * alone while its peers may be blocked, in which case the caller must MPI_Abort.
 */
#ifndef PIPELM_PIPELM_H
#define PIPELM_PIPELM_H

#include <stdio.h>
#include <mpi.h>
#include "util/common.h" /* PIPELM_EXIT_PREEMPTED */

int pipelm_main(int argc, char **argv, MPI_Comm comm, FILE *out, int *abort_needed);

#endif
