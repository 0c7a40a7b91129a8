/*
 * ckpt_internal.h — what the pieces of the checkpoint module share, and ckpt_tools.c with
 * them (not installed; needs hdf5.h). The pieces, one responsibility each: ckpt.c (the
 * HDF5 error check, files, groups, transfer lists), ckpt_attr.c (typed attributes),
 * ckpt_agree.c (the cross-rank agreement), ckpt_layout.c (the datasets schema, who writes
 * which, host views), ckpt_meta.c (the metadata attributes and their CRC), ckpt_write.c (the
 * collective write of one file), ckpt_load.c (reading into any split), ckpt_save.c (the atomic
 * save) and ckpt_resolve.c (what --resume names). The format: docs/formats.md §2.
 */
#ifndef PIPELM_CKPT_INTERNAL_H
#define PIPELM_CKPT_INTERNAL_H

#include <stdint.h>
#include <hdf5.h>
#include "ckpt/ckpt.h"

#define CKPT_FORMAT "pipelm-checkpoint"
#define CRC_ATTR "crc32c" /* the per-dataset checksum attribute */


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

/* ---- ckpt_h5.c -------------------------------------------------------------------------- */
/* Fill cx->err with "checkpoint FILE: rank R: message" for a failure outside HDF5; returns rc. */
int ckpt_fail(h5ctx *cx, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Create or open a group under loc (*g; messages name it). */
int ckpt_group_create(hid_t loc, const char *name, hid_t *g, h5ctx *cx);
int ckpt_group_open(hid_t loc, const char *name, hid_t *g, h5ctx *cx);
/* Close a group or dataset on the normal path, checked; sets *id to -1. */
int ckpt_obj_close(hid_t *id, h5ctx *cx);
/* A dataset-transfer property list for collective (or independent) MPI-IO. */
int ckpt_dxpl_make(hid_t *dxpl, int collective, h5ctx *cx);
/* Flush the file's metadata (collective). */
int ckpt_flush_file(hid_t f, h5ctx *cx);

/* ---- ckpt_attr.c: scalar and 1-D attributes, every HDF5 call through CKPT_H5 ------------- */
int ckpt_attr_write(hid_t loc, const char *name, hid_t ftype, hid_t mtype, int n, const void *val, h5ctx *cx);
int ckpt_attr_i64(hid_t loc, const char *name, long long v, h5ctx *cx);
int ckpt_attr_f64(hid_t loc, const char *name, double v, h5ctx *cx);
int ckpt_attr_str(hid_t loc, const char *name, const char *s, h5ctx *cx);
/* Read exactly n values as mtype, refusing a missing one or one of another type class or
 * count; grp names it in messages ("/train"). The string reader refuses a string of len or
 * more bytes, a control character or bytes after the NUL. */
int ckpt_attr_read(hid_t loc, const char *grp, const char *name, hid_t mtype, int n, void *val, h5ctx *cx);
int ckpt_attr_get_i64(hid_t loc, const char *grp, const char *name, long long *v, h5ctx *cx);
int ckpt_attr_get_f64(hid_t loc, const char *grp, const char *name, double *v, h5ctx *cx);
int ckpt_attr_get_str(hid_t loc, const char *grp, const char *name, char *buf, size_t len, h5ctx *cx);

/* ---- ckpt_agree.c ----------------------------------------------------------------------- */
/* All ranks agree on a status in one MPI_Allreduce (MPI_MAX) that can carry vals[1 .. nvals]
 * too (vals[0] is the status slot); on failure every rank returns the lowest failing rank's
 * code and its message lands in every rank's err. ckpt_agree: nothing else to reduce. */
int ckpt_agree_max(MPI_Comm comm, int rc, char *err, size_t errlen, unsigned long long *vals, int nvals);
int ckpt_agree(MPI_Comm comm, int rc, char *err, size_t errlen);
/* Before any collective HDF5 call: every rank has the same model and each of the n tensors
 * has exactly one writer (else the collective calls would not match). */
int ckpt_check_ownership(const stage *st, const optim *opt, const ckpt_gtensor *gt, int n, MPI_Comm comm,
                         h5ctx *cx);

/* ---- ckpt_layout.c ---------------------------------------------------------------------- */
/* The schema's three sections: "model", "optim/m", "optim/v". */
extern const char *const ckpt_sections[3];
/* "/model/h.3/qkv_w": the dataset of section s for tensor g. */
void ckpt_dataset_path(int s, const ckpt_gtensor *g, char *buf, size_t len);
/* The schema of any architecture, from the model's own tensor table (model_layout of the
 * whole model, whose order is the schema's); returns the count, 0 if out of memory. */
int ckpt_schema_of_model(const model_config *c, ckpt_gtensor *g);
/* Section s as a backend buffer: the optimizer's (laid out as st->params) or, with no
 * optimizer, the parameters only (NULL for the moments). */
float *ckpt_section_base(const stage *st, const optim *opt, int s);
/* The tensor of this stage that dataset i (g) is written from; NULL where this rank writes
 * none (the tied wte: the first stage; data parallelism: tensor i on replica i mod D). */
const param_tensor *ckpt_written_tensor(const stage *st, const optim *opt, const ckpt_gtensor *g, int i);
/* A host view of one tensor for one dataset (map/unmap with the same p, bytes and mode). */
typedef struct {
    float *host; /* NULL: not mapped */
    float *p;    /* the backend memory */
    size_t bytes;
} ckpt_view;
int ckpt_view_map(const backend *be, float *base, const param_tensor *t, int mode, const char *dpath, ckpt_view *v,
                  h5ctx *cx);
int ckpt_view_unmap(const backend *be, int mode, const char *dpath, ckpt_view *v, h5ctx *cx);
int ckpt_fill_twin(const backend *be, float *base, const stage *st, const param_tensor *t, const void *src,
                   const char *dpath, h5ctx *cx);

/* ---- ckpt_meta.c ------------------------------------------------------------------------ */
/* The root, /config, /optim and /train attributes (identical on every rank) and the root
 * meta_crc32c over all of them. */
int ckpt_write_meta(hid_t f, const model_config *c, const ckpt_meta *m, const char *created, h5ctx *cx);
/* The file's /config must equal the run's model; err names the first difference. */
int ckpt_check_config(const model_config *f, const model_config *r, h5ctx *cx);

/* ---- ckpt_write.c ----------------------------------------------------------------------- */
/* PIPELM_CKPT_FAIL (test-only): the mode and the rank that fails; -1 with a message if unknown. */
enum { FAIL_NONE, FAIL_WRITE, FAIL_RENAME, FAIL_KILL, FAIL_CORRUPT, FAIL_BEFORE, FAIL_AFTER, FAIL_STALL,
       FAIL_DELAY };
int ckpt_fail_mode(int size, int *who, h5ctx *cx);
/* How the data of a dataset travels (ckpt_opts.collective); cx is unused: the setting was
 * checked when it was set, so this never fails. */
enum { XFER_INDEPENDENT, XFER_COLLECTIVE };
int ckpt_xfer_mode(h5ctx *cx);
/* Bytes per H5Dwrite of a dataset with independent transfers, in this thread (0, the default:
 * each dataset in one call). The --ckpt-async writer sets it: MPICH holds its global lock for
 * the whole of an MPI-IO write, so smaller writes let the training thread's MPI calls in
 * between. The file is the same. */
extern _Thread_local size_t ckpt_write_piece;
/* ---- ckpt.c ------------------------------------------------------------------------------ */
/* The settings ckpt_set_opts gave (the built-in ones before any call). */
const ckpt_opts *ckpt_get_opts(void);

#endif
