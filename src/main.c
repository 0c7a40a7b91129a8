/*
 * main.c — the `pipelm` program: MPI start-up and shut-down around pipelm_main.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdio.h>
#include <time.h>
#include <mpi.h>
#include "pipelm/blas.h"
#include "pipelm/pipelm.h"

int main(int argc, char **argv) {
    blas_choose_kernel(argv); /* may re-execute with OPENBLAS_CORETYPE set: before MPI starts */
    MPI_Init(&argc, &argv);
    int abort_needed = 0;
    int status = pipelm_main(argc, argv, MPI_COMM_WORLD, NULL, &abort_needed);
    if (abort_needed) {
        /* the peers may be blocked in MPI: end the whole job. Give the launcher a moment to
         * forward this rank's message first (it is lost if the job dies at once). */
        fflush(stdout);
        fflush(stderr);
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
        MPI_Abort(MPI_COMM_WORLD, status ? status : 1);
    }
    MPI_Finalize();
    return status;
}
