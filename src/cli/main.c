/*
 * main.c — the `pipelm` program: MPI start-up and shut-down around pipelm_main.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <mpi.h>
#include "backend/cpu/blas.h"
#include "util/common.h"
#include "parallel/comm.h"
#include "cli/config.h"
#include "cli/pipelm.h"
#include "util/signals.h"

/* train and bench catch SIGTERM/SIGINT/SIGUSR1 from before main on: this constructor runs
 * once the shared libraries are loaded (again after blas_choose_kernel's re-exec, which resets
 * handlers), so a stop that arrives while MPI starts or the model is built is held, and the run
 * ends before step 1 with exit 75 (signals.h). Other subcommands keep the default actions. */
__attribute__((constructor)) static void early_signals(int argc, char **argv) {
    if (argc > 1 && argv && argv[1] && (strcmp(argv[1], "train") == 0 || strcmp(argv[1], "bench") == 0))
        signals_install();
}

/* The run's --blas-auto, needed before MPI starts (the kernel choice re-executes the program):
 * train and bench parse their options here once more (config file and command line, no MPI),
 * the other commands and options that do not parse (pipelm_main reports them) take the
 * default, which PIPELM_BLAS_AUTO sets. */
static int blas_auto_setting(int argc, char **argv) {
    static pl_options o; /* large: not on the stack */
    char err[1024];
    config_defaults(&o);
    int bench = argc > 1 && strcmp(argv[1], "bench") == 0;
    if (argc > 1 && (bench || strcmp(argv[1], "train") == 0) &&
        config_parse(&o, argc, argv, 2, bench, err, sizeof err) != PL_OK)
        config_defaults(&o);
    return o.blas_auto;
}

/* --ckpt-async needs MPI_THREAD_MULTIPLE (its writer thread makes MPI calls): train parses
 * its options once more for it, as for --blas-auto; anything else starts MPI as before. */
static int wants_threads(int argc, char **argv) {
    static pl_options o;
    char err[1024];
    config_defaults(&o);
    if (argc > 1 && strcmp(argv[1], "train") == 0 && config_parse(&o, argc, argv, 2, 0, err, sizeof err) == PL_OK)
        return o.ckpt_async != 0;
    return 0;
}

int main(int argc, char **argv) {
    /* may re-execute with OPENBLAS_CORETYPE set: before MPI starts */
    blas_choose_kernel(argv, blas_auto_setting(argc, argv));
    comm_init_thread(&argc, &argv, wants_threads(argc, argv));
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
