/*
 * ckpt_agree.c — the cross-rank agreement of the checkpoint module. A rank never leaves the
 * sequence of collective calls on its own: it keeps its first message and goes on, and the
 * ranks agree on one status at fixed points (ckpt_agree), the lowest failing rank's message
 * reaching every rank. Before any collective HDF5 call they also check that their stages
 * describe the same model and hold each tensor once (ckpt_check_ownership).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/ckpt_internal.h"
#include "util/common.h"

/* All ranks agree on a status, in one MPI_Allreduce (MPI_MAX) that can carry more values:
 * vals[1 .. nvals] (if vals != NULL) are reduced by MAX along with the status, and vals[0]
 * is the status slot (overwritten). On failure every rank returns the lowest failing rank's
 * code and its message lands in every rank's err (an MPI_Bcast, on failure only), so any
 * rank can print the real cause. */
int ckpt_agree_max(MPI_Comm comm, int rc, char *err, size_t errlen, unsigned long long *vals, int nvals) {
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    unsigned long long one = 0, *v = vals ? vals : &one;
    v[0] = rc != PL_OK ? (unsigned long long)(size - rank) : 0;
    if (MPI_Allreduce(MPI_IN_PLACE, v, vals ? nvals + 1 : 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm) != MPI_SUCCESS) {
        snprintf(err, errlen, "checkpoint: rank %d: MPI_Allreduce failed while agreeing on a status", rank);
        return PL_EMPI;
    }
    if (v[0] == 0) return PL_OK;
    int root = size - (int)v[0];
    struct { int rc; char msg[1500]; } m;
    memset(&m, 0, sizeof m);
    if (rank == root) {
        m.rc = rc;
        snprintf(m.msg, sizeof m.msg, "%s", err[0] ? err : "failed (no message)");
    }
    if (MPI_Bcast(&m, (int)sizeof m, MPI_BYTE, root, comm) != MPI_SUCCESS) {
        snprintf(err, errlen, "checkpoint: rank %d: rank %d failed; MPI_Bcast of its message failed", rank, root);
        return rc != PL_OK ? rc : PL_EPEER;
    }
    if (rank != root) snprintf(err, errlen, "%s", m.msg);
    return m.rc;
}

/* ckpt_agree_max with nothing else to reduce. */
int ckpt_agree(MPI_Comm comm, int rc, char *err, size_t errlen) {
    return ckpt_agree_max(comm, rc, err, errlen, NULL, 0);
}

/* Check before any collective HDF5 call that every rank has the same model and that each
 * tensor has exactly one writer; otherwise the collective calls would not match. */
int ckpt_check_ownership(const stage *st, const optim *opt, const ckpt_gtensor *gt, int n, MPI_Comm comm,
                         h5ctx *cx) {
    int dims[9] = {st->cfg.V, st->cfg.maxT, st->cfg.L, st->cfg.NH, st->cfg.C, st->cfg.Vp, st->cfg.arch,
                   st->cfg.NKV, st->cfg.H}, lo[9], hi[9];
    int rc = PL_OK;
    int *cnt = calloc((size_t)n, sizeof(int)), *sum = calloc((size_t)n, sizeof(int));
    if (!cnt || !sum) { rc = ckpt_fail(cx, PL_ENOMEM, "out of memory"); goto done; }
    for (int i = 0; i < n; i++)
        cnt[i] = ckpt_written_tensor(st, opt, &gt[i], i) != NULL;
    if (MPI_Allreduce(dims, lo, 9, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS ||
        MPI_Allreduce(dims, hi, 9, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS ||
        MPI_Allreduce(cnt, sum, n, MPI_INT, MPI_SUM, comm) != MPI_SUCCESS) {
        rc = ckpt_fail(cx, PL_EMPI, "MPI_Allreduce failed while checking the stages");
        goto done;
    }
    if (memcmp(lo, hi, sizeof lo) != 0) {
        rc = ckpt_fail(cx, PL_EINVAL, "the ranks' stages disagree on the model dimensions");
        goto done;
    }
    for (int i = 0; i < n; i++)
        if (sum[i] != 1) {
            rc = ckpt_fail(cx, PL_EINVAL, "tensor %s is held by %d stages (the stages must hold each block once)",
                           gt[i].path, sum[i]);
            break;
        }
done:
    free(cnt);
    free(sum);
    return rc;
}

