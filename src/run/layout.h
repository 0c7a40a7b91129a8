/*
 * layout.h — how many threads a rank runs and on which CPUs, chosen so that nothing fights.
 *
 * A rank may use the CPUs of its affinity mask (what Slurm's --cpus-per-task / --cpu-bind or
 * the launcher gave it). The threads default to those CPUs divided among the job's ranks on
 * the node that share them, unless --threads or OMP_NUM_THREADS says otherwise. When the
 * ranks of a node all start with the whole node (no binding from outside), each is bound to
 * its own slice of CPUs, so ranks do not migrate onto each other's cores; a binding from
 * outside is kept. More busy threads than CPUs is allowed when asked for, with a warning,
 * and makes waiting ranks yield their core. --bind 0 (or PIPELM_BIND=0) turns the binding off.
 */
#ifndef PIPELM_LAYOUT_H
#define PIPELM_LAYOUT_H

#include <stddef.h>
#include <mpi.h>

typedef struct {
    int local_ranks, local_rank; /* this job's ranks on this node, and this rank's index */
    int node_cpus;               /* online CPUs of the node */
    int cpus;                    /* CPUs in this rank's affinity mask (before binding) */
    int threads;                 /* threads per rank */
    const char *threads_from;    /* "--threads", "OMP_NUM_THREADS", "CPUs / ranks on the node" */
    int bound_first, bound_n;    /* CPUs pipelm bound this rank to (first index in the mask, count), or -1 */
    int shared_mask;             /* the node's ranks started with the same mask */
    int oversubscribed;          /* local_ranks x threads > CPUs the ranks share */
} layout;

/* Collective over comm (a node split): choose threads and binding; threads_opt is --threads
 * (0: not given), bind is --bind (0: never bind). Returns PL_OK or PL_EMPI. */
int layout_choose(layout *L, MPI_Comm comm, int threads_opt, int bind);
/* One line for the banner: "2 ranks on this node x 1 thread, 2 CPUs; bound: rank 0 -> CPU 0". */
void layout_describe(const layout *L, char *buf, size_t len);

#endif
