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
#include "cli/config.h"
#include "model/optim.h"
#include "model/stage.h"

#define CKPT_FORMAT_VERSION 1
#define CKPT_MAX_STAGES 1024
#define CKPT_SHARDS_LEN 16384 /* /train/shards: the longest list of --data's files a checkpoint records */

/* Training state saved beside the tensors (the /train and /optim attributes). */
typedef struct {
    long long step;            /* optimizer steps completed */
    long long tokens_seen;
    long long data_pos;        /* index of the next training batch */
    long long seed, data_seed;
    char data[512];            /* the --data spec */
    optim_hparams hp;          /* the AdamW settings (/optim) and the schedule (/train) */
    int batch, seq_len, microbatches;
    char schedule[32];
    int nstages;
    int split[CKPT_MAX_STAGES]; /* blocks per stage at save time */
    /* Added after format_version 1 first shipped (optional on load: an older file lacks them) */
    int markov_branch;         /* --markov-branch of the run; -1 when the file does not say */
    char shards[CKPT_SHARDS_LEN]; /* the token files of --data, data_manifest's list; "" when none or not said */
    int meta_verified;         /* on load: 1 if the file's meta_crc32c held, 0 if it has none */
} ckpt_meta;

/* How this process's checkpoints are written and read (--ckpt-xfer, --ckpt-hints, --ckpt-verify,
 * --ckpt-space-check; README "Checkpoints"). */
typedef struct {
    int collective;    /* 1: collective MPI-IO data transfers; 0 (default): independent ones */
    char hints[1024];  /* MPI-IO hints "key=value,key=value" added to (or overriding) the built-in
                        * romio_cb_write=disable,romio_ds_write=disable; "" for none */
    int verify;        /* 1 (default): re-read and CRC-check a save before publishing it */
    int space_check;   /* 1 (default): check and reserve the free space before writing */
} ckpt_opts;

/* The built-in settings: independent transfers, no extra hints, verify, check the space. */
void ckpt_opts_default(ckpt_opts *c);
/* The settings the options ask for (config_validate has checked them: config_check_ckpt). */
void ckpt_opts_of(const pl_options *o, ckpt_opts *c);
/* Set once at start-up (train from its options, `pipelm convert` from the defaults and their
 * alias variables): every later save and load of this process uses these settings; until
 * then, ckpt_opts_default's. Not thread-safe; call it before any save or load. */
void ckpt_set_opts(const ckpt_opts *c);

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
/* Rank 0 of a training run, once before its first save: every checkpoint in dir above step
 * floor (the step it resumed from; 0 when it starts afresh) was written by another run, so
 * ckpt_save's pruning (--ckpt-keep) leaves it alone unless this run saves that step itself.
 * Always PL_OK (an unreadable directory protects nothing: there is nothing to prune). */
int ckpt_keep_protect(const char *dir, long long floor);
/* 1 if dir holds a ckpt_<step>.h5 file, *step the newest step (-1 when none). */
int ckpt_dir_newest(const char *dir, long long *step);
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

#endif
