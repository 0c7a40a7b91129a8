/*
 * main.c — the `pipelm` program: MPI start-up and shut-down around pipelm_main.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <mpi.h>
#include "pipelm/pipelm.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int abort_needed = 0;
    int status = pipelm_main(argc, argv, MPI_COMM_WORLD, NULL, &abort_needed);
    if (abort_needed) MPI_Abort(MPI_COMM_WORLD, status ? status : 1);
    MPI_Finalize();
    return status;
}
