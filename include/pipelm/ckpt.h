/*
 * ckpt.h — checkpoints: one parallel-HDF5 file per save, written collectively by all ranks.
 *
 * Tensors are named by layer (/model/h.<i>/qkv_w ...), never by stage, so a checkpoint saved
 * on N stages loads on any M (schema: shared/notes/formats.md §2, format_version 1). Every
 * dataset carries a Fletcher32 checksum, verified on load. A save is atomic: written under
 * a temporary name, closed, confirmed complete by every rank, renamed, and only then does
 * DIR/latest move and do checkpoints beyond `keep` get removed; a failure at any point
 * leaves the previous checkpoint intact and loadable.
 */
#ifndef PIPELM_CKPT_H
#define PIPELM_CKPT_H

#include <stddef.h>
#include <mpi.h>
#include "pipelm/model.h"

#define CKPT_FORMAT_VERSION 1
#define CKPT_MAX_STAGES 1024

/* Training state saved beside the tensors (the /train and /optim attributes). */
typedef struct {
    long long step;            /* optimizer steps completed */
    long long tokens_seen;
    long long data_pos;        /* index of the next training batch */
    long long seed, data_seed;
    char data[512];            /* the --data spec */
    double lr, min_lr, beta1, beta2, eps, weight_decay, grad_clip;
    int warmup_steps, total_steps;
    char lr_schedule[16];
    int batch, seq_len, microbatches;
    char schedule[32];
    int nstages;
    int split[CKPT_MAX_STAGES]; /* blocks per stage at save time */
} ckpt_meta;

/* Collective over comm: write every stage's parameters and AdamW moments (st->params, m, v)
 * and meta to DIR/ckpt_<step, 8 digits>.h5 atomically, point DIR/latest at it, then remove
 * the oldest checkpoints beyond `keep` (0 keeps all). The tied wte is written by the first
 * stage. path_out receives the file name. Prints nothing; returns the agreed status. */
int ckpt_save(const char *dir, stage *st, const ckpt_meta *meta, int keep, MPI_Comm comm,
              char *path_out, size_t pathlen, double *bytes_out, char *err, size_t errlen);
/* Resolve what --resume names: a file, or a directory (its newest complete checkpoint).
 * Returns PL_EIO with a message if there is none. */
int ckpt_resolve(const char *path_or_dir, char *path, size_t pathlen, char *err, size_t errlen);
/* Collective over comm: read the tensors this stage owns (params and moments) from a
 * checkpoint file, verifying checksums and shapes, and the metadata; the model config must
 * equal st->cfg (err names the setting and both values). Returns the agreed status. */
int ckpt_load(const char *path, stage *st, ckpt_meta *meta, MPI_Comm comm, double *bytes_out,
              char *err, size_t errlen);
/* `pipelm convert IN OUT` and `pipelm inspect FILE` (single process). */
int ckpt_convert_main(int argc, char **argv, int first);
int ckpt_inspect_main(int argc, char **argv, int first);

#endif
