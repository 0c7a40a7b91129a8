/*
 * layout.c — threads and CPU binding per rank (see layout.h).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util/common.h"
#include "run/layout.h"

/* The i-th CPU (in ascending order) of a mask, or -1. */
static int nth_cpu(const cpu_set_t *set, int i) {
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, set) && i-- == 0) return c;
    return -1;
}

/* A positive integer from the environment, or 0. */
static int env_int(const char *name) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    long n = strtol(v, &end, 10);
    return *end == 0 && n > 0 && n < 1 << 20 ? (int)n : 0;
}

int layout_choose(layout *L, MPI_Comm comm, int threads_opt, int bind) {
    memset(L, 0, sizeof *L);
    L->bound_first = -1;
    MPI_Comm node;
    PL_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    MPI_Comm_size(node, &L->local_ranks);
    MPI_Comm_rank(node, &L->local_rank);
    cpu_set_t mask;
    CPU_ZERO(&mask);
    L->node_cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    L->cpus = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : L->node_cpus;
    if (L->cpus < 1) L->cpus = 1;
    /* do the node's ranks share one mask (nobody bound them)? compare a hash of the masks */
    unsigned long h = 1469598103934665603UL, lo, hi;
    for (int c = 0; c < CPU_SETSIZE; c++) if (CPU_ISSET(c, &mask)) h = (h ^ (unsigned long)c) * 1099511628211UL;
    int rc1 = MPI_Allreduce(&h, &lo, 1, MPI_UNSIGNED_LONG, MPI_MIN, node);
    int rc2 = MPI_Allreduce(&h, &hi, 1, MPI_UNSIGNED_LONG, MPI_MAX, node);
    MPI_Comm_free(&node);
    if (rc1 != MPI_SUCCESS || rc2 != MPI_SUCCESS) return PL_EMPI;
    L->shared_mask = lo == hi;
    int sharers = L->shared_mask ? L->local_ranks : 1;
    if (threads_opt > 0) { L->threads = threads_opt; L->threads_from = "--threads"; }
    else if (env_int("OMP_NUM_THREADS")) { L->threads = env_int("OMP_NUM_THREADS"); L->threads_from = "OMP_NUM_THREADS"; }
    else {
        L->threads = L->cpus / sharers > 0 ? L->cpus / sharers : 1;
        L->threads_from = sharers > 1 ? "CPUs / ranks on the node" : "CPUs of the rank";
    }
    L->oversubscribed = (long)sharers * L->threads > L->cpus;
    /* bind each rank to its own slice when they all start on the same CPUs and it fits */
    if (L->shared_mask && sharers > 1 && !L->oversubscribed && bind) {
        cpu_set_t mine;
        CPU_ZERO(&mine);
        int first = L->local_rank * L->threads;
        for (int i = 0; i < L->threads; i++) {
            int c = nth_cpu(&mask, first + i);
            if (c >= 0) CPU_SET(c, &mine);
        }
        if (CPU_COUNT(&mine) == L->threads && sched_setaffinity(0, sizeof mine, &mine) == 0) {
            L->bound_first = nth_cpu(&mask, first);
            L->bound_n = L->threads;
        }
    }
    return PL_OK;
}

void layout_describe(const layout *L, char *buf, size_t len) {
    int off = snprintf(buf, len, "%d rank%s on this node x %d thread%s (%s), %d of the node's %d CPUs per rank",
                       L->local_ranks, L->local_ranks > 1 ? "s" : "", L->threads, L->threads > 1 ? "s" : "",
                       L->threads_from, L->cpus, L->node_cpus);
    if (off >= (int)len) return;
    if (L->bound_first >= 0)
        snprintf(buf + off, len - off, "; local rank %d bound to %d CPU%s from CPU %d", L->local_rank, L->bound_n,
                 L->bound_n > 1 ? "s" : "", L->bound_first);
    else if (!L->shared_mask)
        snprintf(buf + off, len - off, "; binding from the launcher kept");
    else
        snprintf(buf + off, len - off, "; not bound");
}
