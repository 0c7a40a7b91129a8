/*
 * ckpt_async.h — asynchronous checkpoints (--ckpt-async): at a save each rank copies what it
 * writes of the file (its share of the parameters and of both AdamW moments) into a host
 * snapshot through the backend's to_host (so a device backend stages it), or, deferred, the
 * writer thread makes that copy from host memory before the next optimizer step (which waits
 * for it: ckpt_async_fence), and a background
 * writer thread runs the ordinary atomic save (ckpt_save: the same file, checksums and
 * verification, published by rank 0's rename and DIR/latest only once every rank agreed)
 * from that snapshot, on a communicator of its own (an MPI_Comm_dup of the job's: its
 * collectives never meet the training thread's), while the training thread goes on. MPI
 * must give MPI_THREAD_MULTIPLE. One snapshot at a time: a save that is due while the
 * previous one is writing waits for it. The caller (train_ckpt.c) decides when all ranks
 * join their writers (collectively) and watches the writer's deadline (ckpt_async_age).
 * The writer thread runs at SCHED_IDLE: it takes the cores the training leaves idle. Not
 * thread-safe itself: only the training thread calls these.
 */
#ifndef PIPELM_CKPT_ASYNC_H
#define PIPELM_CKPT_ASYNC_H

#include <stddef.h>
#include <mpi.h>
#include "ckpt/ckpt.h"

typedef struct ckpt_async ckpt_async;

/* Host bytes of one snapshot of this rank: parameters, m and v of every tensor it writes
 * (ckpt_written_tensor: the tied copy is not, and with data parallelism a replica writes
 * tensor i only when i mod D is its replica). */
double ckpt_async_snapshot_bytes(const stage *st, const optim *opt);
/* Does MPI allow a second thread to make MPI calls (MPI_Query_thread gives
 * MPI_THREAD_MULTIPLE)? 0 and the level's name in *level if not. */
int ckpt_async_thread_ok(const char **level);
/* Collective over comm: duplicate it for the writer and make the (empty) state. PL_EMPI or
 * PL_ENOMEM with a message. */
int ckpt_async_init(ckpt_async **out, MPI_Comm comm, char *err, size_t errlen);
/* Allocate the snapshot for st / opt and touch its pages (before step 1, so the first save
 * does not pay for them); ckpt_async_begin does it if it was not done. */
int ckpt_async_prepare(ckpt_async *a, const stage *st, const optim *opt, char *err, size_t errlen);
/* Copy the written tensors of st / opt (the optimizer's buffers: unsharded moments under
 * ZeRO-1, as for ckpt_save) into the snapshot (allocated at the first call, kept for the
 * next) and start the writer on it: ckpt_save(dir, ..., meta, keep). Not collective, but
 * every rank must call it at the same save (the writers' calls are collective). No writer
 * may be running (ckpt_async_busy). *snap_s: the seconds the copy took. defer (honoured for a
 * host-memory backend, and given alike on every rank): the writer thread makes the copy
 * itself before it writes, while training goes on; the caller must then call
 * ckpt_async_fence before it changes st's parameters or opt's moments. */
int ckpt_async_begin(ckpt_async *a, const char *dir, stage *st, optim *opt, const ckpt_meta *meta, int keep,
                     int defer, double *snap_s, char *err, size_t errlen);
/* Wait until a deferred snapshot has been copied (at once if there is none, or it is done);
 * the seconds waited in *wait_s. Call it before the optimizer step. */
void ckpt_async_fence(ckpt_async *a, double *wait_s);
/* 1 while a writer has been started and not joined. */
int ckpt_async_busy(const ckpt_async *a);
/* 1 once the running writer has returned (it can be joined without waiting). */
int ckpt_async_done(const ckpt_async *a);
/* Seconds since the running writer was started (0 if none). */
double ckpt_async_age(const ckpt_async *a);
/* The step the running (or last) writer saves. */
long long ckpt_async_step(const ckpt_async *a);
/* Join the writer (it must be done): its agreed status (every rank's writer returns the
 * same), and the file, its tensor bytes, the seconds from ckpt_async_begin to the published
 * file; on failure err holds the lowest failing rank's message. */
int ckpt_async_join(ckpt_async *a, char *path, size_t pathlen, double *bytes, double *write_s, char *err,
                    size_t errlen);
/* Free the state; agreed 1 frees the writer's communicator (collective). A writer still
 * running is left alone (and its state leaked): the caller is on the way to MPI_Abort. */
void ckpt_async_free(ckpt_async *a, int agreed);

#endif
