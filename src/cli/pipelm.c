/*
 * pipelm.c — subcommand dispatch: the library entry point behind `main`.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdlib.h>
#include <string.h>
#include "cli/commands.h"
#include "util/common.h"
#include "cli/pipelm.h"

static void usage(FILE *out) {
    fprintf(out, "pipelm %s — pipeline-parallel training of GPT-2 and Llama 3 models over MPI\n\n"
                 "usage: mpiexec -n P pipelm <command> [options]\n\ncommands:\n", PACKAGE_VERSION);
    for (const pl_command *c = pl_commands; c->name; c++) fprintf(out, "  %-10s %s\n", c->name, c->summary);
    fprintf(out, "\n  pipelm <command> --help   options of a command\n  pipelm --version\n");
}

int pipelm_main(int argc, char **argv, MPI_Comm comm, FILE *out, int *abort_needed) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    pl_rank = rank;
    pl_out = out ? out : stdout;
    *abort_needed = 0;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        if (rank == 0) usage(argc < 2 ? stderr : pl_out);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        if (rank == 0) fprintf(pl_out, "pipelm %s\n", PACKAGE_VERSION);
        return 0;
    }
    const pl_command *c = pl_command_find(argv[1]);
    if (!c) {
        if (rank == 0) {
            pl_error("unknown command '%s'", argv[1]);
            usage(stderr);
        }
        return 2;
    }
    return c->main(argc, argv, comm, abort_needed);
}
