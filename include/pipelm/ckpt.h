/*
 * ckpt.h — checkpoints: one parallel-HDF5 file per save, written collectively by all ranks.
 *
 * Tensors are named by layer (/model/h.<i>/qkv_w ...), never by stage, so a checkpoint saved
 * on N stages loads on any M (schema: docs/formats.md §2, format_version 1). Every
 * dataset is contiguous fp32 with a uint32 attribute `crc32c` (the CRC-32C of its bytes,
 * crc32c.h), verified on load. A save is atomic: written under a temporary name unique to
 * the job (rank 0's host and pid), closed, confirmed complete by every rank, re-read and
 * verified (every dataset's CRC-32C, by the rank that wrote it), renamed, and only then does
 * DIR/latest move and do checkpoints beyond `keep` get removed; a failure at any point leaves
 * latest and the previous checkpoint untouched.
 */
#ifndef PIPELM_CKPT_H
#define PIPELM_CKPT_H

#include <stddef.h>
#include <stdint.h>
#include <mpi.h>
#include "pipelm/optim.h"
#include "pipelm/stage.h"

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
    /* Added after format_version 1 first shipped (optional on load: an older file lacks them) */
    int markov_branch;         /* --markov-branch of the run; -1 when the file does not say */
    int meta_verified;         /* on load: 1 if the file's meta_crc32c held, 0 if it has none */
} ckpt_meta;

/* Collective over comm: write every stage's parameters and AdamW moments (the optimizer's
 * buffers OPTIM_PARAMS, OPTIM_M, OPTIM_V, read through host views: backend map/unmap) and
 * meta to DIR/ckpt_<step, 8 digits>.h5 atomically (through DIR/.ckpt_<step>.<host>.<pid>.h5.tmp,
 * re-read and CRC-checked by every rank before it is renamed), point DIR/latest at it, then remove the
 * oldest checkpoints beyond `keep` (0 keeps all). opt is st's optimizer (opt->st == st); a
 * NULL opt is refused with PL_EINVAL (a checkpoint always holds the moments). The tied wte
 * is written by the first stage. path_out receives the file name. Prints nothing; returns
 * the agreed status. *bytes_out: tensor bytes in the file (parameters and moments, all
 * ranks), the same on every rank. On failure err holds the same message on every rank (the
 * lowest failing rank's, naming that rank, the file and the cause; a backend failure quotes
 * be->error()): print it from one rank. Same for ckpt_load. */
int ckpt_save(const char *dir, stage *st, optim *opt, const ckpt_meta *meta, int keep, MPI_Comm comm,
              char *path_out, size_t pathlen, double *bytes_out, char *err, size_t errlen);
/* Resolve what --resume names: a file, or a directory: the checkpoint DIR/latest names. A
 * latest that is empty, unreadable, not a plain `ckpt_<step>.h5` name in DIR (a '/' or
 * '..'), or not a regular file is refused. A missing latest, or one naming a file that is
 * gone, falls back to the newest ckpt_*.h5 in DIR with a warning on stderr (rank 0) naming
 * the file taken. Returns PL_EIO with a message if there is none. */
int ckpt_resolve(const char *path_or_dir, char *path, size_t pathlen, char *err, size_t errlen);
/* Collective over comm: read the tensors this stage owns (params into st, and the moments
 * into opt, st's optimizer) from a checkpoint file, verifying checksums and shapes, and the
 * metadata. opt may be NULL: then only the parameters are read, and the moments datasets
 * are still opened and checked (present, shaped, carrying a checksum) but not read, as for
 * tensors of other stages; *bytes_out then counts the parameters only. Tensors are read
 * into host views (map PL_MAP_WRITE, then unmap); after a failed load the stage's and the
 * optimizer's tensors are unspecified. The model config must
 * equal st->cfg (err names the setting and both values). Every attribute is checked for its
 * type and range (named on failure: "/train nstages = 999 is out of range ..."), the root
 * meta_crc32c (the CRC-32C of the canonical metadata text, docs/formats.md) is verified if
 * present (an older file without it loads with a note on stderr), and every tensor read must
 * be finite (and /optim/v non-negative): a non-finite one is refused naming the tensor.
 * Returns the agreed status. */
int ckpt_load(const char *path, stage *st, optim *opt, ckpt_meta *meta, MPI_Comm comm, double *bytes_out,
              char *err, size_t errlen);
/* `pipelm convert IN OUT` and `pipelm inspect FILE` (single process). */
int ckpt_convert_main(int argc, char **argv, int first);
int ckpt_inspect_main(int argc, char **argv, int first);

/* Collective over comm: write one checkpoint at exactly `path` (through path.tmp and a
 * rename), without DIR/latest or pruning; opt as for ckpt_save (required). `pipelm convert`
 * uses it on MPI_COMM_SELF. */
int ckpt_save_file(const char *path, stage *st, optim *opt, const ckpt_meta *meta, MPI_Comm comm,
                   double *bytes_out, char *err, size_t errlen);
/* One process, no MPI: read a checkpoint's model config (/config) and metadata (/train,
 * /optim, root step) without its tensors. cfg or meta may be NULL. Lets a run resumed from
 * a checkpoint take the model dimensions and the saved split from the file. */
int ckpt_read_info(const char *path, model_config *cfg, ckpt_meta *meta, char *err, size_t errlen);

/* One process (rank 0 of a training run, before step 1): take the lock DIR/.lock of a
 * checkpoint directory (created if need be), so that one job at a time writes it
 * (docs/formats.md §2). A stale lock (its owner's pid gone on this host, or a requeue of
 * the same Slurm job) is taken over and `note` says so (else note is ""). A lock held by a
 * live process, by another host or unreadable is refused: PL_EINVAL, err naming the
 * directory, the owner's host, pid and job, and how to remove a stale one. PL_EIO if the
 * lock cannot be written. Prints nothing. */
int ckpt_lock_take(const char *dir, char *note, size_t notelen, char *err, size_t errlen);
/* Remove the lock this process took, if any and if it is still its own (safe to call always). */
void ckpt_lock_release(void);
/* Does this process hold the lock of dir (ckpt_lock_take)? */
int ckpt_lock_held(const char *dir);
/* "<host>.<pid>" of this process: the tag in the temporary names of a save. */
void ckpt_job_tag(char *buf, size_t len);
/* Is process pid alive on this host (kill(pid, 0) does not fail with ESRCH)? */
int ckpt_pid_alive(long pid);
/* One process: the checkpoint DIR/latest names, only if latest is a valid pointer to an
 * existing regular file (no fallback to the newest file, nothing printed); else PL_EIO and
 * err says why. */
int ckpt_latest(const char *dir, char *path, size_t pathlen, char *err, size_t errlen);
/* mkdir -p; 0, or -1 with errno. */
int ckpt_make_dirs(const char *dir);

#ifdef PIPELM_CKPT_INTERNAL
/* Shared by ckpt.c and ckpt_tools.c only (needs hdf5.h). */
#include <hdf5.h>

/* What an HDF5 call was working on, for its error message. */
typedef struct {
    const char *file; /* the checkpoint's path */
    char obj[160];    /* "dataset /model/wte", "attribute step", or "" */
    char *err;        /* the caller's message buffer */
    size_t errlen;
    int rank;
} h5ctx;

/* The one check for HDF5 calls: a negative result fills cx->err with the checkpoint file,
 * rank, object, call, HDF5's own message (from its error stack) and file:line, sets rc to
 * PL_EHDF5 and jumps to the function's `done:` label (which closes what it opened). */
#define CKPT_H5(call)                                                                  \
    do {                                                                               \
        if ((call) < 0) {                                                              \
            rc = ckpt_h5_fail(cx, __FILE__, __LINE__, #call);                          \
            goto done;                                                                 \
        }                                                                              \
    } while (0)
int ckpt_h5_fail(h5ctx *cx, const char *file, int line, const char *call);
/* Turn off HDF5's automatic error-stack printing (CKPT_H5 reports instead). */
void ckpt_h5_quiet(void);
/* Open (create != 0: create/truncate) a file: MPI-IO with collective metadata on comm, or
 * HDF5's default driver when comm is MPI_COMM_NULL. */
int ckpt_h5_open(const char *path, int create, MPI_Comm comm, hid_t *file, h5ctx *cx);
int ckpt_h5_close_file(hid_t *file, h5ctx *cx);

/* One dataset of the schema: path below /model (or /optim/m, /optim/v), e.g. "h.3/qkv_w". */
typedef struct {
    int kind, layer, ndim, shape[2];
    size_t numel;
    char path[48];
} ckpt_gtensor;
/* The 4 + 12 L tensors of the whole model in schema order; returns the count. */
int ckpt_global_tensors(const model_config *c, ckpt_gtensor *g);
/* Read and check the root attributes; fill cfg (/config) and meta (/train, /optim) if not NULL. */
int ckpt_read_meta(hid_t file, model_config *cfg, ckpt_meta *meta, h5ctx *cx);
/* Collective: write a checkpoint file at exactly `path` (no temp name, no rename); messages
 * name `label` (the final name of a temporary file), or path if label is NULL. opt as for
 * ckpt_save (required). */
int ckpt_write_file(const char *path, const char *label, stage *st, optim *opt, const ckpt_meta *meta,
                    MPI_Comm comm, double *bytes_out, char *err, size_t errlen);
/* The checksum of an open dataset (metadata reads; under MPI-IO every rank calls it in the
 * same order): *has_crc = 1 and *stored from its uint32 attribute crc32c, else *fletcher = 1
 * if HDF5's Fletcher32 filter is on it (HDF5 then verifies it as it reads). dpath names the
 * dataset in messages. */
int ckpt_dataset_checksum(hid_t ds, const char *dpath, int *has_crc, uint32_t *stored, int *fletcher, h5ctx *cx);
/* CRC-32C of n floats as little-endian fp32 bytes (what a dataset's crc32c covers). */
uint32_t ckpt_crc_floats(const float *p, size_t n);
/* "ckpt_00000042.h5" -> 42; -1 for any other name. */
long long ckpt_name_step(const char *name);
#endif

#endif
