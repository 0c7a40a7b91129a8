/*
 * ckpt.c — checkpoints as one parallel-HDF5 file per save (docs/formats.md §2).
 *
 * Every rank opens the file through MPI-IO with collective metadata, and creates every group,
 * attribute and dataset (HDF5 metadata is collective). Tensors are named by layer, so any
 * split reads any checkpoint. Datasets are fp32, CONTIGUOUS (no chunks, no filters), created
 * with H5D_FILL_TIME_NEVER so that creating one writes nothing; each carries a uint32
 * attribute `crc32c`, the CRC-32C of its little-endian bytes in row-major order (crc32c.h).
 *
 * Writing: the owner of a tensor (the stage holding it; the first stage for the tied wte)
 * computes its CRC and writes the whole dataset, both from a host view of the backend buffer
 * (backend map/unmap: the buffer itself on a host-memory backend, a staged copy on a device
 * one). The tensors come from the optimizer (optim_buffer: parameters, m, v). Where mapping
 * is free every view is mapped before the data phase and the CRCs run on a second thread
 * alongside the writes, the views unmapped only after it joins; a staging backend maps one
 * tensor at a time around its write. The data transfer is INDEPENDENT by default (only the
 * owner calls H5Dwrite: no collective at all per dataset) or, with PIPELM_CKPT_XFER=collective,
 * one collective H5Dwrite per dataset in which the others select nothing. The CRCs reach every
 * rank in the one MPI_Allreduce that also agrees on the status of the whole data phase; every
 * rank then writes the same attribute values, and the file is flushed.
 *
 * Collective discipline: a rank never leaves the sequence of collective calls on its own.
 * A rank that fails (an HDF5 error, an injected failure) keeps its first message, skips its
 * own data writes from then on, and still makes every collective metadata call of the data
 * phase in the same order (their errors go to a scratch buffer), so no other rank is left
 * waiting in a collective; all ranks then agree once, at the end of the data phase, and the
 * message of the lowest failing rank is broadcast so every rank reports the same cause.
 * (Independent writes contain no collective to hang in. With collective transfers a rank
 * whose H5Dcreate alone fails would leave the others in that dataset's H5Dwrite; metadata
 * calls run the same code on the same metadata on every rank, so they fail alike.)
 *
 * Reading: every rank opens every dataset (collective metadata) and checks its shape and
 * checksum kind; the ranks whose stage holds the tensor read all of it, independently (or,
 * with PIPELM_CKPT_XFER=collective, in a collective H5Dread where the others select nothing),
 * into a host view of the tensor (map for writing, unmap copies it into the backend), and
 * check the CRC-32C of what they read against the attribute. Without an optimizer only the
 * parameters are read (the moments datasets are still checked as those of other stages).
 * A dataset without a crc32c attribute is accepted only if it carries HDF5's Fletcher32
 * filter (which HDF5 verifies as it reads); one with neither is refused. The same
 * discipline as writing: one agreement.
 *
 * Atomic save: DIR/.ckpt_<step>.<tag>.h5.tmp (tag: rank 0's "<host>.<pid>", ckpt_job_tag, so
 * no two processes write one temporary file) is written and closed, all ranks agree; every
 * rank re-opens it, checks the metadata and re-reads the datasets it wrote, checking each
 * CRC-32C against its attribute (verify_file), and all agree again; only then does rank 0
 * fsync and rename it to DIR/ckpt_<step>.h5, write DIR/latest.<tag>.tmp (the file name) and
 * rename it to DIR/latest, and remove checkpoints beyond `keep`. Any failure removes the
 * temporary file and leaves latest and every older checkpoint as they were. A training run
 * also holds the directory's lock, DIR/.lock (ckpt_lock.c), so one job at a time writes it.
 *
 * A full disk: rank 0 checks the free space first and then reserves the file's blocks
 * (fallocate), so that a write cannot fail half way on one rank; a failed save empties its
 * file before closing it.
 *
 * Environment: PIPELM_CKPT_XFER = independent (default) | collective: the data transfers of
 * saves and loads (see above; collective ones cost a few MPI collectives per dataset, about
 * 10 ms each when ranks outnumber cores); PIPELM_CKPT_HINTS="key=value,..." adds MPI-IO
 * hints. Test-only: PIPELM_CKPT_FAIL = write[:R]
 * (rank R, default the last, fails after writing half the datasets), rename (rank 0 fails
 * just before the rename), kill[:R] (rank R raises SIGKILL half way through the datasets),
 * corrupt (rank 0 flips a byte of the last dataset after the write, before the verification);
 * PIPELM_CKPT_VERIFY=0 (no verification: only to measure its cost); PIPELM_CKPT_NO_SPACE_CHECK=1
 * (no free-space check or reservation).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* fallocate(2) */
#endif
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <hdf5.h>
#define PIPELM_CKPT_INTERNAL 1
#include "pipelm/ckpt.h"
#include "pipelm/config.h"
#include "pipelm/common.h"
#include "pipelm/crc32c.h"
#include "pipelm/files.h"

#define CKPT_FORMAT "pipelm-checkpoint"
#define CRC_ATTR "crc32c" /* the per-dataset checksum attribute */

/* ---- error reporting ------------------------------------------------------------------- */

/* Innermost and outermost descriptions found on HDF5's error stack. */
typedef struct {
    char first[256], last[512];
    int n;
} h5_walk_state;

/* H5Ewalk2 callback: remember the outermost (API) and innermost (cause) descriptions. */
static herr_t h5_walk_cb(unsigned n, const H5E_error2_t *e, void *data) {
    h5_walk_state *w = data;
    const char *d = e->desc && e->desc[0] ? e->desc : e->func_name ? e->func_name : "?";
    if (n == 0) snprintf(w->first, sizeof w->first, "%s", d);
    snprintf(w->last, sizeof w->last, "%s", d);
    w->n++;
    return 0;
}

/* Name of the function in a stringified call ("ds = H5Dcreate2(a, b)" -> "H5Dcreate2"). */
static void call_name(const char *call, char *out, size_t len) {
    const char *p = strchr(call, '(');
    if (!p) p = call + strlen(call);
    const char *b = p;
    while (b > call && (isalnum((unsigned char)b[-1]) || b[-1] == '_')) b--;
    snprintf(out, len, "%.*s", (int)(p - b), b);
}

/* HDF5 prints its error stack itself by default; CKPT_H5 reports instead. */
void ckpt_h5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

/* The body of CKPT_H5: turn HDF5's error stack (walked with H5Ewalk2) into one message with
 * the checkpoint, rank, object, call and source line. */
int ckpt_h5_fail(h5ctx *cx, const char *file, int line, const char *call) {
    h5_walk_state w;
    memset(&w, 0, sizeof w);
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, h5_walk_cb, &w);
    H5Eclear2(H5E_DEFAULT);
    for (char *c = w.last; *c; c++) /* MPI-IO messages carry newlines */
        if (*c == '\n' || *c == '\t') *c = ' ';
    char fn[64];
    call_name(call, fn, sizeof fn);
    char cause[800];
    if (!w.n) snprintf(cause, sizeof cause, "(HDF5 gave no message)");
    else if (w.n > 1 && strcmp(w.first, w.last) != 0) snprintf(cause, sizeof cause, "%s (%s)", w.last, w.first);
    else snprintf(cause, sizeof cause, "%s", w.last);
    snprintf(cx->err, cx->errlen, "checkpoint %s: rank %d: %s%s%s failed: %s [%s:%d]", cx->file, cx->rank,
             cx->obj[0] ? cx->obj : "", cx->obj[0] ? ": " : "", fn, cause, file, line);
    return PL_EHDF5;
}

/* Fill err with "checkpoint FILE: rank R: message" for a failure outside HDF5. */
static int fail_msg(h5ctx *cx, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail_msg(h5ctx *cx, int rc, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(cx->err, cx->errlen, "checkpoint %s: rank %d: %s", cx->file, cx->rank, msg);
    return rc;
}

/* All ranks agree on a status, in one MPI_Allreduce (MPI_MAX) that can carry more values:
 * vals[1 .. nvals] (if vals != NULL) are reduced by MAX along with the status, and vals[0]
 * is the status slot (overwritten). On failure every rank returns the lowest failing rank's
 * code and its message lands in every rank's err (an MPI_Bcast, on failure only), so any
 * rank can print the real cause. */
static int agree_max(MPI_Comm comm, int rc, char *err, size_t errlen, unsigned long long *vals, int nvals) {
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

/* agree_max with nothing else to reduce. */
static int agree(MPI_Comm comm, int rc, char *err, size_t errlen) { return agree_max(comm, rc, err, errlen, NULL, 0); }

/* CRC-32C of n floats as little-endian fp32 bytes (the bytes of the file). */
uint32_t ckpt_crc_floats(const float *p, size_t n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    uint32_t crc = 0, tmp[1024];
    for (size_t i = 0; i < n;) {
        size_t k = n - i < 1024 ? n - i : 1024;
        memcpy(tmp, p + i, k * 4);
        for (size_t j = 0; j < k; j++) tmp[j] = __builtin_bswap32(tmp[j]);
        crc = crc32c_extend(crc, tmp, k * 4);
        i += k;
    }
    return crc;
#else
    return crc32c(p, n * sizeof(float));
#endif
}

/* ---- the global tensor list (same on every rank, schema order) -------------------------- */

/* Every tensor of the whole model in schema order (wte, wpe, h.0/ln1_w ... h.L-1/fcproj_b,
 * lnf_w, lnf_b) with its shape: the sequence of datasets every rank walks in step. */
int ckpt_global_tensors(const model_config *c, ckpt_gtensor *g) {
    int n = 0, C = c->C;
    if (c->arch == MODEL_LLAMA) { /* the model's own table of the whole model: its order is the schema's */
        param_tensor *t = calloc((size_t)model_max_tensors(c, c->L), sizeof *t);
        size_t total;
        if (!t) return 0;
        n = model_layout(c, 0, c->L, 1, 1, t, &total);
        for (int i = 0; i < n; i++) {
            g[i].kind = t[i].kind;
            g[i].layer = t[i].layer;
            g[i].ndim = t[i].ndim;
            g[i].shape[0] = t[i].shape[0];
            g[i].shape[1] = t[i].shape[1];
            g[i].numel = t[i].numel;
            if (t[i].layer >= 0) snprintf(g[i].path, sizeof g[i].path, "h.%d/%s", t[i].layer, param_kind_name[t[i].kind]);
            else snprintf(g[i].path, sizeof g[i].path, "%s", param_kind_name[t[i].kind]);
        }
        free(t);
        return n;
    }
    /* per-kind shape: rows, cols (cols 0 = 1-D) */
    int rows[P_NKINDS_GPT2] = {c->Vp, c->maxT, C, C, 3 * C, 3 * C, C, C, C, C, 4 * C, 4 * C, C, C, C, C};
    int cols[P_NKINDS_GPT2] = {C, C, 0, 0, C, 0, C, 0, 0, 0, C, 0, 4 * C, 0, 0, 0};
    for (int k = 0; k < P_NKINDS_GPT2; k++) {
        int block = k >= P_LN1W && k <= P_FCPROJB;
        if (block && k != P_LN1W) continue; /* blocks are emitted layer by layer below */
        int nl = block ? c->L : 1;
        for (int l = 0; l < nl; l++) {
            int k0 = block ? P_LN1W : k, k1 = block ? P_FCPROJB : k;
            for (int kk = k0; kk <= k1; kk++) {
                ckpt_gtensor *t = &g[n++];
                t->kind = kk;
                t->layer = block ? l : -1;
                t->ndim = cols[kk] ? 2 : 1;
                t->shape[0] = rows[kk];
                t->shape[1] = cols[kk] ? cols[kk] : 1;
                t->numel = (size_t)rows[kk] * (size_t)t->shape[1];
                if (block) snprintf(t->path, sizeof t->path, "h.%d/%s", l, param_kind_name[kk]);
                else snprintf(t->path, sizeof t->path, "%s", param_kind_name[kk]);
            }
        }
    }
    return n;
}

/* ---- small HDF5 helpers (every call through CKPT_H5) ---------------------------------- */

/* Write a scalar or 1-D attribute of a native type to loc. */
static int attr_write(hid_t loc, const char *name, hid_t ftype, hid_t mtype, int n, const void *val, h5ctx *cx) {
    int rc = PL_OK;
    hid_t sp = -1, a = -1;
    hsize_t dim = (hsize_t)n;
    snprintf(cx->obj, sizeof cx->obj, "attribute %s", name);
    CKPT_H5(sp = n > 0 ? H5Screate_simple(1, &dim, NULL) : H5Screate(H5S_SCALAR));
    CKPT_H5(a = H5Acreate2(loc, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT));
    CKPT_H5(H5Awrite(a, mtype, val));
done:
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
    if (rc == PL_OK) cx->obj[0] = 0;
    return rc;
}

/* Scalar int64 / float64 attributes. */
static int attr_i64(hid_t loc, const char *name, long long v, h5ctx *cx) {
    return attr_write(loc, name, H5T_STD_I64LE, H5T_NATIVE_LLONG, 0, &v, cx);
}
static int attr_f64(hid_t loc, const char *name, double v, h5ctx *cx) {
    return attr_write(loc, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 0, &v, cx);
}

/* A fixed-length, NUL-terminated string attribute (h5py reads it as bytes). */
static int attr_str(hid_t loc, const char *name, const char *s, h5ctx *cx) {
    int rc = PL_OK;
    hid_t t = -1;
    snprintf(cx->obj, sizeof cx->obj, "attribute %s", name);
    CKPT_H5(t = H5Tcopy(H5T_C_S1));
    CKPT_H5(H5Tset_size(t, strlen(s) + 1));
    CKPT_H5(H5Tset_strpad(t, H5T_STR_NULLTERM));
    rc = attr_write(loc, name, t, t, 0, s, cx);
done:
    if (t >= 0) H5Tclose(t);
    return rc;
}

/* "/train/nstages" (or "/step" at the root) for messages. */
static void attr_label(const char *grp, const char *name, char *buf, size_t len) {
    snprintf(buf, len, "%s%s%s", grp, strcmp(grp, "/") == 0 ? "" : "/", name);
}

/* Read an attribute of exactly n values converted to mtype, refusing one that is missing,
 * of another type class than mtype's (an integer where a float is expected, or the reverse:
 * HDF5 would convert either silently) or of another size. grp names it in messages. */
static int attr_read(hid_t loc, const char *grp, const char *name, hid_t mtype, int n, void *val, h5ctx *cx) {
    int rc = PL_OK;
    hid_t a = -1, sp = -1, ft = -1;
    char lab[96];
    attr_label(grp, name, lab, sizeof lab);
    snprintf(cx->obj, sizeof cx->obj, "attribute %s", lab);
    htri_t there;
    CKPT_H5(there = H5Aexists(loc, name));
    if (!there) {
        rc = fail_msg(cx, PL_EIO, "attribute %s is missing (not a pipelm checkpoint, or damaged)", lab);
        goto done;
    }
    CKPT_H5(a = H5Aopen(loc, name, H5P_DEFAULT));
    CKPT_H5(ft = H5Aget_type(a));
    H5T_class_t cls, want = H5Tget_class(mtype);
    CKPT_H5(cls = H5Tget_class(ft));
    if (cls != want) {
        rc = fail_msg(cx, PL_EIO, "attribute %s has the wrong type (HDF5 class %d; expected %s)", lab, (int)cls,
                      want == H5T_INTEGER ? "an integer" : "a floating-point number");
        goto done;
    }
    CKPT_H5(sp = H5Aget_space(a));
    hssize_t np;
    CKPT_H5(np = H5Sget_simple_extent_npoints(sp));
    if (np != n) {
        rc = fail_msg(cx, PL_EIO, "attribute %s holds %lld values, %d expected", lab, (long long)np, n);
        goto done;
    }
    CKPT_H5(H5Aread(a, mtype, val));
done:
    if (ft >= 0) H5Tclose(ft);
    if (sp >= 0) H5Sclose(sp);
    if (a >= 0) H5Aclose(a);
    if (rc == PL_OK) cx->obj[0] = 0;
    return rc;
}

/* Scalar attributes read as long long or double (never narrowed: ranges are checked by the
 * caller on the 64-bit value). */
static int attr_get_i64(hid_t loc, const char *grp, const char *name, long long *v, h5ctx *cx) {
    return attr_read(loc, grp, name, H5T_NATIVE_LLONG, 1, v, cx);
}
static int attr_get_f64(hid_t loc, const char *grp, const char *name, double *v, h5ctx *cx) {
    return attr_read(loc, grp, name, H5T_NATIVE_DOUBLE, 1, v, cx);
}

/* Open a string attribute and check its shape: refused if it is missing, not a string or
 * not exactly one value. The handles it opens (*a, *ft, *sp) are left to the caller to
 * close, so that they close in the same order whichever check fails. lab names it. */
static int str_attr_open(hid_t loc, const char *name, const char *lab, hid_t *a, hid_t *ft, hid_t *sp,
                         h5ctx *cx) {
    int rc = PL_OK;
    htri_t there;
    CKPT_H5(there = H5Aexists(loc, name));
    if (!there) {
        rc = fail_msg(cx, PL_EIO, "attribute %s is missing (not a pipelm checkpoint, or damaged)", lab);
        goto done;
    }
    CKPT_H5(*a = H5Aopen(loc, name, H5P_DEFAULT));
    CKPT_H5(*ft = H5Aget_type(*a));
    H5T_class_t cls;
    CKPT_H5(cls = H5Tget_class(*ft));
    if (cls != H5T_STRING) {
        rc = fail_msg(cx, PL_EIO, "attribute %s is not a string", lab);
        goto done;
    }
    CKPT_H5(*sp = H5Aget_space(*a));
    hssize_t np;
    CKPT_H5(np = H5Sget_simple_extent_npoints(*sp));
    if (np != 1) {
        rc = fail_msg(cx, PL_EIO, "attribute %s holds %lld strings, one expected", lab, (long long)np);
        goto done;
    }
done:
    return rc;
}

/* Read a variable-length string attribute into a fresh NUL-terminated *tmp of *sz bytes
 * (HDF5's own copy is freed at once). *mt is the memory type, closed by the caller. */
static int str_attr_read_vl(hid_t a, const char *lab, hid_t *mt, char **tmp, size_t *sz, h5ctx *cx) {
    int rc = PL_OK;
    char *s = NULL;
    CKPT_H5(*mt = H5Tcopy(H5T_C_S1));
    CKPT_H5(H5Tset_size(*mt, H5T_VARIABLE));
    CKPT_H5(H5Aread(a, *mt, &s));
    *sz = s ? strlen(s) : 0;
    *tmp = calloc(*sz + 1, 1);
    if (*tmp && s) memcpy(*tmp, s, *sz);
    H5free_memory(s);
    if (!*tmp) { rc = fail_msg(cx, PL_ENOMEM, "out of memory reading attribute %s", lab); goto done; }
done:
    return rc;
}

/* Read a fixed-length string attribute (file type ft) into a fresh *tmp of *sz bytes and
 * a NUL: a size over 1 MiB is refused before anything is allocated. *mt as above. */
static int str_attr_read_fixed(hid_t a, hid_t ft, const char *lab, size_t len, hid_t *mt, char **tmp, size_t *sz,
                               h5ctx *cx) {
    int rc = PL_OK;
    *sz = H5Tget_size(ft); /* 0 on failure */
    if (*sz == 0) {
        rc = ckpt_h5_fail(cx, __FILE__, __LINE__, "H5Tget_size(ft)");
        goto done;
    }
    if (*sz > 1u << 20) {
        rc = fail_msg(cx, PL_EIO, "attribute %s is a string of %zu bytes, at most %zu expected", lab, *sz, len - 1);
        goto done;
    }
    *tmp = calloc(*sz + 1, 1);
    if (!*tmp) { rc = fail_msg(cx, PL_ENOMEM, "out of memory reading attribute %s", lab); goto done; }
    CKPT_H5(*mt = H5Tcopy(H5T_C_S1));
    CKPT_H5(H5Tset_size(*mt, *sz + 1)); /* room for a NUL HDF5 adds to a full-width string */
    CKPT_H5(H5Tset_strpad(*mt, H5T_STR_NULLTERM));
    CKPT_H5(H5Aread(a, *mt, *tmp));
done:
    return rc;
}

/* Check the sz bytes read (tmp, NUL-terminated): nothing after the terminating NUL, fewer
 * than len characters, and no control character. No HDF5 call. */
static int str_attr_check(const char *tmp, size_t sz, const char *lab, size_t len, h5ctx *cx) {
    size_t n = strlen(tmp);
    for (size_t i = n; i < sz; i++)
        if (tmp[i]) return fail_msg(cx, PL_EIO, "attribute %s holds bytes after its terminating NUL", lab);
    if (n >= len)
        return fail_msg(cx, PL_EIO, "attribute %s is a string of %zu characters, at most %zu expected", lab, n,
                        len - 1);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)tmp[i] < 0x20 || tmp[i] == 0x7f)
            return fail_msg(cx, PL_EIO, "attribute %s holds a control character (\\x%02x at %zu)", lab,
                            (unsigned char)tmp[i], i);
    return PL_OK;
}

/* Read a string attribute into buf: refused if it is not a string, is len or more bytes
 * long, or holds a control character or a byte after its terminating NUL. The handles are
 * owned here and closed in one place, in the same order on every path. */
static int attr_get_str(hid_t loc, const char *grp, const char *name, char *buf, size_t len, h5ctx *cx) {
    int rc = PL_OK;
    hid_t a = -1, ft = -1, mt = -1, sp = -1;
    char *tmp = NULL, lab[96];
    size_t sz = 0;
    attr_label(grp, name, lab, sizeof lab);
    snprintf(cx->obj, sizeof cx->obj, "attribute %s", lab);
    buf[0] = 0;
    if ((rc = str_attr_open(loc, name, lab, &a, &ft, &sp, cx))) goto done;
    htri_t vl;
    CKPT_H5(vl = H5Tis_variable_str(ft));
    if (vl) rc = str_attr_read_vl(a, lab, &mt, &tmp, &sz, cx);
    else rc = str_attr_read_fixed(a, ft, lab, len, &mt, &tmp, &sz, cx);
    if (rc || (rc = str_attr_check(tmp, sz, lab, len, cx))) goto done;
    memcpy(buf, tmp, strlen(tmp) + 1);
done:
    free(tmp);
    if (sp >= 0) H5Sclose(sp);
    if (mt >= 0) H5Tclose(mt);
    if (ft >= 0) H5Tclose(ft);
    if (a >= 0) H5Aclose(a);
    if (rc == PL_OK) cx->obj[0] = 0;
    return rc;
}

/* Create a group under loc. */
static int group_create(hid_t loc, const char *name, hid_t *g, h5ctx *cx) {
    int rc = PL_OK;
    snprintf(cx->obj, sizeof cx->obj, "group %s", name);
    CKPT_H5(*g = H5Gcreate2(loc, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    cx->obj[0] = 0;
done:
    return rc;
}

/* Open an existing group. */
static int group_open(hid_t loc, const char *name, hid_t *g, h5ctx *cx) {
    int rc = PL_OK;
    snprintf(cx->obj, sizeof cx->obj, "group %s", name);
    CKPT_H5(*g = H5Gopen2(loc, name, H5P_DEFAULT));
    cx->obj[0] = 0;
done:
    return rc;
}

/* Close a group or dataset on the normal path, checked (unwind paths close unchecked: the
 * first error is the one worth reporting). Sets *id to -1. */
static int obj_close(hid_t *id, h5ctx *cx) {
    int rc = PL_OK;
    if (*id >= 0) CKPT_H5(H5Oclose(*id));
done:
    *id = -1;
    return rc;
}

/* A dataset-transfer property list for collective (or independent) MPI-IO. */
static int dxpl_make(hid_t *dxpl, int collective, h5ctx *cx) {
    int rc = PL_OK;
    CKPT_H5(*dxpl = H5Pcreate(H5P_DATASET_XFER));
    CKPT_H5(H5Pset_dxpl_mpio(*dxpl, collective ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT));
done:
    return rc;
}

/* Flush the file's metadata (collective), so that a full disk shows up here, while the
 * file can still be emptied and closed cleanly, rather than inside H5Fclose. */
static int flush_file(hid_t f, h5ctx *cx) {
    int rc = PL_OK;
    cx->obj[0] = 0;
    CKPT_H5(H5Fflush(f, H5F_SCOPE_GLOBAL));
done:
    return rc;
}

/* Close the file (collective under MPI-IO; it flushes what is left). Sets *f to -1. */
int ckpt_h5_close_file(hid_t *f, h5ctx *cx) {
    int rc = PL_OK;
    cx->obj[0] = 0;
    if (*f >= 0) CKPT_H5(H5Fclose(*f));
done:
    *f = -1;
    return rc;
}

/* MPI-IO hints. Each dataset is one contiguous extent written by its owner alone, so ROMIO's
 * two-phase collective buffering (which funnels the data through aggregator ranks) and data
 * sieving (which reads and rewrites gaps) only cost time: both off. PIPELM_CKPT_HINTS =
 * "key=value,key=value" adds or overrides hints (e.g. Lustre striping_factor). */
static MPI_Info make_hints(void) {
    MPI_Info info;
    if (MPI_Info_create(&info) != MPI_SUCCESS) return MPI_INFO_NULL;
    MPI_Info_set(info, "romio_cb_write", "disable");
    MPI_Info_set(info, "romio_ds_write", "disable");
    const char *h = getenv("PIPELM_CKPT_HINTS");
    char k[128], v[128];
    while (h && sscanf(h, " %127[^=]=%127[^,]", k, v) == 2) {
        MPI_Info_set(info, k, v);
        h = strchr(h, ',');
        if (h) h++;
    }
    return info;
}

/* Open a file through MPI-IO on comm with collective metadata reads and writes; serial
 * (comm == MPI_COMM_NULL) uses HDF5's default POSIX driver. */
int ckpt_h5_open(const char *path, int create, MPI_Comm comm, hid_t *file, h5ctx *cx) {
    int rc = PL_OK;
    hid_t fapl = -1;
    *file = -1;
    cx->obj[0] = 0;
    CKPT_H5(fapl = H5Pcreate(H5P_FILE_ACCESS));
    if (comm != MPI_COMM_NULL) {
        MPI_Info info = make_hints();
        herr_t set = H5Pset_fapl_mpio(fapl, comm, info); /* HDF5 keeps its own copy */
        if (info != MPI_INFO_NULL) MPI_Info_free(&info);
        CKPT_H5(set);
        CKPT_H5(H5Pset_all_coll_metadata_ops(fapl, 1));
        CKPT_H5(H5Pset_coll_metadata_write(fapl, 1));
    }
    if (create) CKPT_H5(*file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
    else CKPT_H5(*file = H5Fopen(path, H5F_ACC_RDONLY, fapl));
done:
    if (fapl >= 0) H5Pclose(fapl);
    return rc;
}

/* ---- failure injection ------------------------------------------------------------------ */

enum { FAIL_NONE, FAIL_WRITE, FAIL_RENAME, FAIL_KILL, FAIL_CORRUPT };

/* Parse PIPELM_CKPT_FAIL: mode and the rank that fails (default the last rank). */
static int fail_mode(int size, int *who, h5ctx *cx) {
    const char *s = getenv("PIPELM_CKPT_FAIL");
    *who = size - 1;
    if (!s || !s[0]) return FAIL_NONE;
    int mode = strncmp(s, "write", 5) == 0 ? FAIL_WRITE : strncmp(s, "rename", 6) == 0 ? FAIL_RENAME
             : strncmp(s, "kill", 4) == 0 ? FAIL_KILL : strncmp(s, "corrupt", 7) == 0 ? FAIL_CORRUPT : -1;
    if (mode < 0) {
        fail_msg(cx, PL_EINVAL, "PIPELM_CKPT_FAIL='%s' is not one of write[:RANK], rename, kill[:RANK], corrupt", s);
        return -1;
    }
    const char *colon = strchr(s, ':');
    if (colon) *who = atoi(colon + 1);
    if (mode == FAIL_RENAME || mode == FAIL_CORRUPT) *who = 0;
    return mode;
}

/* ---- writing one file ------------------------------------------------------------------- */

/* How the data of a dataset travels (PIPELM_CKPT_XFER). */
enum { XFER_INDEPENDENT, XFER_COLLECTIVE };

/* Parse PIPELM_CKPT_XFER (default independent); -1 with a message if it is something else. */
static int xfer_mode(h5ctx *cx) {
    const char *s = getenv("PIPELM_CKPT_XFER");
    if (!s || !s[0] || strcmp(s, "independent") == 0) return XFER_INDEPENDENT;
    if (strcmp(s, "collective") == 0) return XFER_COLLECTIVE;
    fail_msg(cx, PL_EINVAL, "PIPELM_CKPT_XFER='%s' is not independent or collective", s);
    return -1;
}

/* Create one dataset under parent (contiguous, fp32, never filled: creating it writes
 * nothing) and leave it open in *ds; write data if not NULL (the owner, whole dataset).
 * With collective transfers a rank without data takes part with an empty selection; with
 * independent ones it does not call H5Dwrite at all. */
static int write_dataset(hid_t parent, const ckpt_gtensor *g, const float *data, int xfer, hid_t dxpl, hid_t *ds,
                         h5ctx *cx) {
    static const float dummy = 0.0f; /* a non-NULL buffer for empty selections */
    int rc = PL_OK;
    hid_t sp = -1, dcpl = -1;
    hsize_t dims[2] = {(hsize_t)g->shape[0], (hsize_t)g->shape[1]};
    const char *leaf = strrchr(g->path, '/') ? strrchr(g->path, '/') + 1 : g->path;
    CKPT_H5(sp = H5Screate_simple(g->ndim, dims, NULL));
    CKPT_H5(dcpl = H5Pcreate(H5P_DATASET_CREATE));
    CKPT_H5(H5Pset_layout(dcpl, H5D_CONTIGUOUS));
    CKPT_H5(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER)); /* every element is written */
    CKPT_H5(*ds = H5Dcreate2(parent, leaf, H5T_IEEE_F32LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    if (data) {
        CKPT_H5(H5Dwrite(*ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, dxpl, data));
    } else if (xfer == XFER_COLLECTIVE) {
        CKPT_H5(H5Sselect_none(sp));
        CKPT_H5(H5Dwrite(*ds, H5T_NATIVE_FLOAT, sp, sp, dxpl, &dummy));
    }
done:
    if (dcpl >= 0) H5Pclose(dcpl);
    if (sp >= 0) H5Sclose(sp);
    return rc;
}

/* The scalar uint32 crc32c attribute of an open dataset (collective, same value everywhere). */
static int write_crc_attr(hid_t ds, const char *dpath, uint32_t crc, h5ctx *cx) {
    int rc = PL_OK;
    hid_t sp = -1, a = -1;
    snprintf(cx->obj, sizeof cx->obj, "dataset %s: attribute " CRC_ATTR, dpath);
    CKPT_H5(sp = H5Screate(H5S_SCALAR));
    CKPT_H5(a = H5Acreate2(ds, CRC_ATTR, H5T_STD_U32LE, sp, H5P_DEFAULT, H5P_DEFAULT));
    CKPT_H5(H5Awrite(a, H5T_NATIVE_UINT32, &crc));
    CKPT_H5(H5Aclose(a));
    a = -1;
done:
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
    return rc;
}

/* Every attribute of a checkpoint's metadata, as written or as read back. */
typedef struct {
    char format[64], version[64], created[64], optim_name[32];
    long long format_version, root_step, optim_step;
    double optim_lr;
    long long cfg[6]; /* vocab_size, padded_vocab_size, max_seq_len, n_layer, n_head, n_embd */
    int has_arch;     /* /config/arch present (a file of an older pipelm has none: gpt2) */
    char arch[16];
    /* /config, Llama only: n_kv_head, ffn_hidden, multiple_of, use_scaled_rope, llama_version_major,
     * llama_version_minor; ffn_dim_multiplier, norm_eps, rope_theta */
    long long lcfg[6];
    double lf[3];
    ckpt_meta m;      /* /train (m.step is /train step) and /optim beta1.. */
    int has_branch;   /* /train markov_branch present */
} meta_all;

/* The Llama attributes of /config (docs/formats.md), in the order of meta_all.lcfg / lf. */
static const char *const llama_int_attr[6] = {"n_kv_head", "ffn_hidden", "multiple_of", "use_scaled_rope",
                                              "llama_version_major", "llama_version_minor"};
static const char *const llama_f64_attr[3] = {"ffn_dim_multiplier", "norm_eps", "rope_theta"};

/* meta_all's Llama fields from a config (c->arch == MODEL_LLAMA). */
static void llama_meta(const model_config *c, meta_all *a) {
    long long li[6] = {c->NKV, c->H, c->multiple_of, c->use_scaled_rope, c->ver_major, c->ver_minor};
    double lf[3] = {c->ffn_mult, c->norm_eps, c->rope_theta};
    memcpy(a->lcfg, li, sizeof li);
    memcpy(a->lf, lf, sizeof lf);
}

/* The canonical text of the metadata that meta_crc32c covers (docs/formats.md): one
 * "path=value\n" line per attribute in a fixed order; integers in decimal, floats as
 * printf("%.17g"), strings as stored, split as comma-separated decimals. Returns its length
 * (or 0 if buf is too small). */
static size_t meta_canon(const meta_all *a, char *buf, size_t len) {
    static const char *const cn[6] = {"vocab_size", "padded_vocab_size", "max_seq_len", "n_layer", "n_head", "n_embd"};
    const ckpt_meta *m = &a->m;
    size_t o = 0;
#define CANON(...) do { if (o < len) o += (size_t)snprintf(buf + o, len - o, __VA_ARGS__); } while (0)
    CANON("format=%s\nformat_version=%lld\npipelm_version=%s\nstep=%lld\ncreated=%s\n", a->format,
          a->format_version, a->version, a->root_step, a->created);
    for (int i = 0; i < 6; i++) CANON("/config/%s=%lld\n", cn[i], a->cfg[i]);
    if (a->has_arch) CANON("/config/arch=%s\n", a->arch);
    if (a->has_arch && strcmp(a->arch, "llama") == 0) {
        for (int i = 0; i < 6; i++) CANON("/config/%s=%lld\n", llama_int_attr[i], a->lcfg[i]);
        for (int i = 0; i < 3; i++) CANON("/config/%s=%.17g\n", llama_f64_attr[i], a->lf[i]);
    }
    CANON("/optim/name=%s\n/optim/beta1=%.17g\n/optim/beta2=%.17g\n/optim/eps=%.17g\n/optim/weight_decay=%.17g\n"
          "/optim/lr=%.17g\n/optim/step=%lld\n", a->optim_name, m->beta1, m->beta2, m->eps, m->weight_decay,
          a->optim_lr, a->optim_step);
    CANON("/train/step=%lld\n/train/tokens_seen=%lld\n/train/data_pos=%lld\n/train/seed=%lld\n/train/data_seed=%lld\n"
          "/train/data=%s\n/train/lr=%.17g\n/train/min_lr=%.17g\n/train/warmup_steps=%d\n/train/total_steps=%d\n"
          "/train/lr_schedule=%s\n/train/grad_clip=%.17g\n/train/batch=%d\n/train/seq_len=%d\n"
          "/train/microbatches=%d\n/train/schedule=%s\n/train/nstages=%d\n/train/split=",
          m->step, m->tokens_seen, m->data_pos, m->seed, m->data_seed, m->data, m->lr, m->min_lr, m->warmup_steps,
          m->total_steps, m->lr_schedule, m->grad_clip, m->batch, m->seq_len, m->microbatches, m->schedule,
          m->nstages);
    for (int i = 0; i < m->nstages && i < CKPT_MAX_STAGES; i++) CANON("%s%d", i ? "," : "", m->split[i]);
    CANON("\n");
    if (a->has_branch) CANON("/train/markov_branch=%d\n", m->markov_branch);
#undef CANON
    return o < len ? o : 0;
}

/* CRC-32C of the canonical metadata text (0 if it does not fit, which cannot happen for
 * values that passed the range checks). */
static uint32_t meta_crc(const meta_all *a) {
    size_t cap = 16384 + 8 * CKPT_MAX_STAGES;
    char *buf = malloc(cap);
    if (!buf) return 0;
    size_t n = meta_canon(a, buf, cap);
    uint32_t c = crc32c(buf, n);
    free(buf);
    return c;
}

/* The root, /config, /optim and /train attributes (identical on every rank), and the root
 * meta_crc32c over all of them. */
static int write_attrs(hid_t f, const model_config *c, const ckpt_meta *m, const char *created, h5ctx *cx) {
    int rc = PL_OK;
    hid_t g = -1;
    meta_all all;
    memset(&all, 0, sizeof all);
    snprintf(all.format, sizeof all.format, "%s", CKPT_FORMAT);
    snprintf(all.version, sizeof all.version, "%s", PACKAGE_VERSION);
    snprintf(all.created, sizeof all.created, "%s", created);
    snprintf(all.optim_name, sizeof all.optim_name, "adamw");
    all.format_version = CKPT_FORMAT_VERSION;
    all.root_step = all.optim_step = m->step;
    all.optim_lr = m->lr;
    long long cv[6] = {c->V, c->Vp, c->maxT, c->L, c->NH, c->C};
    memcpy(all.cfg, cv, sizeof cv);
    all.has_arch = 1;
    snprintf(all.arch, sizeof all.arch, "%s", model_arch_name(c->arch));
    if (c->arch == MODEL_LLAMA) llama_meta(c, &all);
    all.m = *m;
    all.m.nstages = m->nstages > 0 && m->nstages <= CKPT_MAX_STAGES ? m->nstages : 0;
    all.has_branch = m->markov_branch > 0; /* written only when the run says (<= 0: not known) */
    PL_TRY(attr_str(f, "format", CKPT_FORMAT, cx));
    PL_TRY(attr_i64(f, "format_version", CKPT_FORMAT_VERSION, cx));
    PL_TRY(attr_str(f, "pipelm_version", PACKAGE_VERSION, cx));
    PL_TRY(attr_i64(f, "step", m->step, cx));
    PL_TRY(attr_str(f, "created", created, cx));
    uint32_t mcrc = meta_crc(&all);
    PL_TRY(attr_write(f, "meta_crc32c", H5T_STD_U32LE, H5T_NATIVE_UINT32, 0, &mcrc, cx));

    PL_TRY(group_create(f, "config", &g, cx));
    if ((rc = attr_i64(g, "vocab_size", c->V, cx)) || (rc = attr_i64(g, "padded_vocab_size", c->Vp, cx)) ||
        (rc = attr_i64(g, "max_seq_len", c->maxT, cx)) || (rc = attr_i64(g, "n_layer", c->L, cx)) ||
        (rc = attr_i64(g, "n_head", c->NH, cx)) || (rc = attr_i64(g, "n_embd", c->C, cx)) ||
        (rc = attr_str(g, "arch", all.arch, cx)))
        goto done;
    for (int i = 0; c->arch == MODEL_LLAMA && i < 6; i++)
        if ((rc = attr_i64(g, llama_int_attr[i], all.lcfg[i], cx))) goto done;
    for (int i = 0; c->arch == MODEL_LLAMA && i < 3; i++)
        if ((rc = attr_f64(g, llama_f64_attr[i], all.lf[i], cx))) goto done;
    if ((rc = obj_close(&g, cx))) goto done;
    PL_TRY(group_create(f, "optim", &g, cx));
    if ((rc = attr_str(g, "name", "adamw", cx)) || (rc = attr_f64(g, "beta1", m->beta1, cx)) ||
        (rc = attr_f64(g, "beta2", m->beta2, cx)) || (rc = attr_f64(g, "eps", m->eps, cx)) ||
        (rc = attr_f64(g, "weight_decay", m->weight_decay, cx)) || (rc = attr_f64(g, "lr", m->lr, cx)) ||
        (rc = attr_i64(g, "step", m->step, cx)))
        goto done;
    if ((rc = obj_close(&g, cx))) goto done;
    PL_TRY(group_create(f, "train", &g, cx));
    int ns = all.m.nstages;
    if ((rc = attr_i64(g, "step", m->step, cx)) || (rc = attr_i64(g, "tokens_seen", m->tokens_seen, cx)) ||
        (rc = attr_i64(g, "data_pos", m->data_pos, cx)) || (rc = attr_i64(g, "seed", m->seed, cx)) ||
        (rc = attr_i64(g, "data_seed", m->data_seed, cx)) || (rc = attr_str(g, "data", m->data, cx)) ||
        (rc = attr_f64(g, "lr", m->lr, cx)) || (rc = attr_f64(g, "min_lr", m->min_lr, cx)) ||
        (rc = attr_i64(g, "warmup_steps", m->warmup_steps, cx)) ||
        (rc = attr_i64(g, "total_steps", m->total_steps, cx)) ||
        (rc = attr_str(g, "lr_schedule", m->lr_schedule, cx)) || (rc = attr_f64(g, "grad_clip", m->grad_clip, cx)) ||
        (rc = attr_i64(g, "batch", m->batch, cx)) || (rc = attr_i64(g, "seq_len", m->seq_len, cx)) ||
        (rc = attr_i64(g, "microbatches", m->microbatches, cx)) ||
        (rc = attr_str(g, "schedule", m->schedule, cx)) || (rc = attr_i64(g, "nstages", ns, cx)) ||
        (all.has_branch && (rc = attr_i64(g, "markov_branch", m->markov_branch, cx))))
        goto done;
    if (ns > 0 && (rc = attr_write(g, "split", H5T_STD_I32LE, H5T_NATIVE_INT, ns, m->split, cx))) goto done;
    rc = obj_close(&g, cx);
done:
    if (g >= 0) H5Gclose(g);
    return rc;
}

/* ---- host views of backend memory ------------------------------------------------------ */

/* Section s of the schema (0 /model, 1 /optim/m, 2 /optim/v) as a backend buffer: the
 * optimizer's (laid out as st->params) or, with no optimizer, the parameters only. */
static float *section_base(const stage *st, const optim *opt, int s) {
    static const int which[3] = {OPTIM_PARAMS, OPTIM_M, OPTIM_V};
    if (opt) return optim_buffer(opt, which[s]);
    return s == 0 ? st->params : NULL;
}

/* The tensor of this stage that dataset g's data is written from: NULL where this rank
 * writes none (the tied wte is written from the first stage only). */
static const param_tensor *written_tensor(const stage *st, const optim *opt, const ckpt_gtensor *g, int i) {
    const param_tensor *t = stage_find_tensor(st, g->kind, g->layer);
    /* data parallelism: the D replicas of a stage share its tensors out, tensor i to replica i mod D */
    int D = opt && opt->dp_size > 1 ? opt->dp_size : 1, d = D > 1 ? opt->dp_rank : 0;
    return t && (g->kind != P_WTE || st->has_embed) && i % D == d ? t : NULL;
}

/* A host view of one tensor of a section, for one dataset: map (mode PL_MAP_READ to write
 * the file from it, PL_MAP_WRITE to read the file into it) and unmap, with the same p,
 * bytes and mode. A failure names the backend, the dataset and be->error(). */
typedef struct {
    float *host; /* NULL: not mapped */
    float *p;    /* the backend memory */
    size_t bytes;
} host_view;

static int view_map(const backend *be, float *base, const param_tensor *t, int mode, const char *dpath,
                    host_view *v, h5ctx *cx) {
    void *host = NULL;
    v->host = NULL;
    v->p = base + t->offset;
    v->bytes = t->numel * sizeof(float);
    int r = be->map(&host, v->p, v->bytes, mode);
    if (r != PL_OK || !host) {
        const char *why = be->error ? be->error() : "";
        return fail_msg(cx, PL_EBACKEND, "backend %s: mapping %zu bytes of dataset %s for %s failed: %s", be->name,
                        v->bytes, dpath, mode == PL_MAP_READ ? "writing the file" : "reading the file",
                        r == PL_OK ? "it returned no host view" : why && why[0] ? why : "no message from the backend");
    }
    v->host = host;
    return PL_OK;
}

/* Unmap a view (no-op if not mapped); dpath names the dataset in the message. */
static int view_unmap(const backend *be, int mode, const char *dpath, host_view *v, h5ctx *cx) {
    if (!v->host) return PL_OK;
    int r = be->unmap(v->host, v->p, v->bytes, mode);
    v->host = NULL;
    if (r != PL_OK) {
        const char *why = be->error ? be->error() : "";
        return fail_msg(cx, PL_EBACKEND, "backend %s: unmapping %zu bytes of dataset %s after %s failed: %s",
                        be->name, v->bytes, dpath, mode == PL_MAP_READ ? "writing the file" : "reading the file",
                        why && why[0] ? why : "no message from the backend");
    }
    return PL_OK;
}

/* "/model/h.3/qkv_w": the dataset of section s for tensor g. */
static const char *const sections[3] = {"model", "optim/m", "optim/v"};
static void dataset_path(int s, const ckpt_gtensor *g, char *buf, size_t len) {
    snprintf(buf, len, "/%s/%s", sections[s], g->path);
}

/* The CRC-32C of every dataset this rank writes, computed on a second thread while the main
 * thread writes, from host views mapped before the thread starts and unmapped after it
 * joins (both only read them). vals[1 + k] for dataset k = s n + i gets CRC | 1 << 32. The
 * thread makes no MPI, HDF5 or backend call. */
typedef struct {
    const host_view *views; /* [3 n] */
    const ckpt_gtensor *gt;
    int n;
    unsigned long long *vals;
} crc_job;

static void *crc_worker(void *arg) {
    crc_job *j = arg;
    for (int k = 0; k < 3 * j->n; k++)
        if (j->views[k].host) j->vals[1 + k] = 1ULL << 32 | ckpt_crc_floats(j->views[k].host, j->gt[k % j->n].numel);
    return NULL;
}

/* Check before any collective HDF5 call that every rank has the same model and that each
 * tensor has exactly one writer; otherwise the collective calls would not match. */
static int check_ownership(const stage *st, const optim *opt, const ckpt_gtensor *gt, int n, MPI_Comm comm, h5ctx *cx) {
    int dims[9] = {st->cfg.V, st->cfg.maxT, st->cfg.L, st->cfg.NH, st->cfg.C, st->cfg.Vp, st->cfg.arch,
                   st->cfg.NKV, st->cfg.H}, lo[9], hi[9];
    int rc = PL_OK;
    int *cnt = calloc((size_t)n, sizeof(int)), *sum = calloc((size_t)n, sizeof(int));
    if (!cnt || !sum) { rc = fail_msg(cx, PL_ENOMEM, "out of memory"); goto done; }
    for (int i = 0; i < n; i++)
        cnt[i] = written_tensor(st, opt, &gt[i], i) != NULL;
    if (MPI_Allreduce(dims, lo, 9, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS ||
        MPI_Allreduce(dims, hi, 9, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS ||
        MPI_Allreduce(cnt, sum, n, MPI_INT, MPI_SUM, comm) != MPI_SUCCESS) {
        rc = fail_msg(cx, PL_EMPI, "MPI_Allreduce failed while checking the stages");
        goto done;
    }
    if (memcmp(lo, hi, sizeof lo) != 0) {
        rc = fail_msg(cx, PL_EINVAL, "the ranks' stages disagree on the model dimensions");
        goto done;
    }
    for (int i = 0; i < n; i++)
        if (sum[i] != 1) {
            rc = fail_msg(cx, PL_EINVAL, "tensor %s is held by %d stages (the stages must hold each block once)",
                          gt[i].path, sum[i]);
            break;
        }
done:
    free(cnt);
    free(sum);
    return rc;
}

/* Bytes a checkpoint of model c takes on disk, generously: the tensors (parameters and both
 * moments) plus 2 KiB of HDF5 metadata per dataset (about 0.5 KiB are used: a contiguous
 * dataset has no chunk index) and 1 MiB. */
static double space_needed(const model_config *c, int ntensors) {
    return 3.0 * 4.0 * (double)model_num_params(c) + 3.0 * ntensors * 2048.0 + 1048576.0;
}

/* PIPELM_CKPT_NO_SPACE_CHECK=1 turns off the free-space check and the reservation below
 * (only for tests of a disk that fills up half way, on one rank). */
static int space_check_off(void) {
    const char *s = getenv("PIPELM_CKPT_NO_SPACE_CHECK");
    return s && s[0] == '1';
}

/* Rank 0, before creating the file: refuse early if the file system clearly lacks room. */
static int check_space(const char *path, const model_config *c, int ntensors, h5ctx *cx) {
    if (space_check_off()) return PL_OK;
    char dir[4400];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *(slash == dir ? slash + 1 : slash) = 0;
    else snprintf(dir, sizeof dir, ".");
    struct statvfs vf;
    if (statvfs(dir, &vf) != 0) return PL_OK; /* cannot tell: the reservation decides */
    double need = space_needed(c, ntensors), have = (double)vf.f_bavail * (double)vf.f_frsize;
    if (have < need)
        return fail_msg(cx, PL_EIO, "not enough space in %s: %.1f MB free, the checkpoint needs about %.1f MB "
                        "(No space left on device)", dir, have / 1e6, need / 1e6);
    return PL_OK;
}

/* Rank 0, once the file exists: reserve its blocks (fallocate, file size unchanged) so that a
 * disk filling up during the save fails here, before any collective write. A write failing
 * on one rank in the middle of HDF5's collective calls leaves the other ranks waiting in the
 * next one (a hang), so this matters. File systems without fallocate skip it. */
static int reserve_space(const char *path, const model_config *c, int ntensors, h5ctx *cx) {
    if (space_check_off()) return PL_OK;
    int fd = open(path, O_WRONLY);
    if (fd < 0) return fail_msg(cx, PL_EIO, "cannot open %s to reserve space: %s", path, strerror(errno));
    int rc = PL_OK;
    if (fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)space_needed(c, ntensors)) != 0 && errno != EOPNOTSUPP &&
        errno != ENOSYS && errno != EINVAL)
        rc = fail_msg(cx, PL_EIO, "reserving %.1f MB for the checkpoint failed: %s", space_needed(c, ntensors) / 1e6,
                      strerror(errno));
    close(fd);
    return rc;
}

/* Rank 0, after closing: give back the reserved blocks beyond the end of the file (truncating
 * to its own size drops them). */
static void release_space(const char *path) {
    struct stat sb;
    if (space_check_off() || stat(path, &sb) != 0) return;
    if (truncate(path, sb.st_size) != 0) { /* harmless: the blocks stay reserved */ }
}

/* Collective: write the whole checkpoint file at path (see the file comment for how). */
int ckpt_write_file(const char *path, const char *label, stage *st, optim *opt, const ckpt_meta *meta_in,
                    MPI_Comm comm, double *bytes_out, char *err, size_t errlen) {
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    ckpt_h5_quiet();
    h5ctx cxs = {label ? label : path, "", err, errlen, rank}, *cx = &cxs;
    /* where the errors of a rank that has already failed go (its first message is kept) */
    char scratch[1024];
    h5ctx later = {cxs.file, "", scratch, sizeof scratch, rank};
    err[0] = 0;
    int rc = PL_OK, n = model_num_tensors(&st->cfg), r2;
    hid_t f = -1, sec = -1, sub = -1, lay = -1, dxpl = -1;
    const backend *be = st->be;
    ckpt_gtensor *gt = calloc((size_t)n, sizeof *gt);
    hid_t *dsets = malloc(3 * (size_t)n * sizeof *dsets); /* every dataset, open until its attribute is written */
    host_view *views = calloc(3 * (size_t)n, sizeof *views); /* [k]: the host view dataset k is written from */
    /* Where mapping is free (a host-memory backend: the view is the buffer itself) every view
     * is mapped before the data phase, so that a second thread can compute the CRCs alongside
     * the writes, and unmapped after it joins. A staging backend maps one tensor at a time,
     * around its write, so that no more than one tensor is staged on the host at once. */
    const int eager = be->host_memory;
    /* [0]: agree_max's status slot; [1 + k]: dataset k's CRC-32C | 1 << 32 on its owner, else 0 */
    unsigned long long *vals = calloc(1 + 3 * (size_t)n, sizeof *vals);
    double mybytes = 0.0;
    for (int k = 0; dsets && k < 3 * n; k++) dsets[k] = -1;
    /* every rank writes rank 0's metadata and time stamp, so the attributes match */
    ckpt_meta meta = *meta_in;
    char created[32] = "";
    if (rank == 0) {
        time_t now = time(NULL);
        struct tm tmv;
        gmtime_r(&now, &tmv);
        strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    }
    if (MPI_Bcast(&meta, (int)sizeof meta, MPI_BYTE, 0, comm) != MPI_SUCCESS ||
        MPI_Bcast(created, (int)sizeof created, MPI_CHAR, 0, comm) != MPI_SUCCESS)
        rc = fail_msg(cx, PL_EMPI, "MPI_Bcast of the metadata failed");
    if (!gt || !dsets || !vals || !views) rc = fail_msg(cx, PL_ENOMEM, "out of memory");
    else if (!opt)
        rc = fail_msg(cx, PL_EINVAL, "no optimizer given: a checkpoint holds the AdamW moments beside the parameters, "
                      "so saving one needs the stage's optimizer");
    else if (opt->st != st)
        rc = fail_msg(cx, PL_EINVAL, "the optimizer given belongs to another stage (its moments are laid out by "
                      "that stage's tensors)");
    if ((rc = agree(comm, rc, err, errlen)) != PL_OK) goto out;
    n = ckpt_global_tensors(&st->cfg, gt);
    rc = check_ownership(st, opt, gt, n, comm, cx);
    int who, mode = fail_mode(size, &who, cx), xfer = xfer_mode(cx);
    if (mode < 0 || xfer < 0) rc = PL_EINVAL;
    for (int s = 0; eager && rc == PL_OK && s < 3; s++)
        for (int i = 0; i < n && rc == PL_OK; i++) {
            const param_tensor *t = written_tensor(st, opt, &gt[i], i);
            char dpath[96];
            dataset_path(s, &gt[i], dpath, sizeof dpath);
            if (t) rc = view_map(be, section_base(st, opt, s), t, PL_MAP_READ, dpath, &views[s * n + i], cx);
        }
    if ((rc = agree(comm, rc, err, errlen)) != PL_OK) goto out;

    if (rank == 0) rc = check_space(path, &st->cfg, n, cx);
    if ((rc = agree(comm, rc, err, errlen)) != PL_OK) goto out;
    rc = ckpt_h5_open(path, 1, comm, &f, cx);
    if ((rc = agree(comm, rc, err, errlen)) != PL_OK) goto out;
    if (rank == 0) rc = reserve_space(path, &st->cfg, n, cx);
    if ((rc = agree(comm, rc, err, errlen)) != PL_OK) goto close;
    rc = write_attrs(f, &st->cfg, &meta, created, cx);
    if (rc == PL_OK) rc = dxpl_make(&dxpl, xfer == XFER_COLLECTIVE, cx);
    if ((rc = agree(comm, rc, err, errlen)) != PL_OK) goto close;

    /* The data phase: /model, /optim/m, /optim/v. Every rank walks the same datasets in the
     * same order and makes every collective call, failed or not; no agreement until the end. */
    int total = 3 * n, k = 0;
    h5ctx *use;
    /* the CRCs overlap the writes on a second thread where every view is mapped up front (else,
     * or if the thread cannot start, each is computed just before its write) */
    crc_job job = {views, gt, n, vals};
    pthread_t crc_thread;
    int threaded = eager && pthread_create(&crc_thread, NULL, crc_worker, &job) == 0;
#define FIRST_ERROR(call) (use = rc == PL_OK ? cx : &later, r2 = (call), rc = rc == PL_OK ? r2 : rc)
    for (int s = 0; s < 3; s++) {
        if (s == 0) FIRST_ERROR(group_create(f, "model", &sec, use));
        else {
            /* /optim exists (its attributes); m and v go under it */
            FIRST_ERROR(group_open(f, "optim", &sub, use));
            FIRST_ERROR(group_create(sub, s == 1 ? "m" : "v", &sec, use));
        }
        int cur = -1;
        for (int i = 0; i < n; i++, k++) {
            const ckpt_gtensor *g = &gt[i];
            if (g->layer != cur) { /* entering a block (or leaving the last one) */
                FIRST_ERROR(obj_close(&lay, use));
                cur = g->layer;
                if (cur >= 0) {
                    char name[32];
                    snprintf(name, sizeof name, "h.%d", cur);
                    FIRST_ERROR(group_create(sec, name, &lay, use));
                }
            }
            char dpath[96];
            dataset_path(s, g, dpath, sizeof dpath);
            /* a rank that has failed writes no more data */
            const param_tensor *t = rc == PL_OK ? written_tensor(st, opt, g, i) : NULL;
            if (t && !eager) FIRST_ERROR(view_map(be, section_base(st, opt, s), t, PL_MAP_READ, dpath, &views[k], use));
            const float *data = rc == PL_OK ? views[k].host : NULL;
            if (data && !threaded) vals[1 + k] = 1ULL << 32 | ckpt_crc_floats(data, g->numel);
            use = rc == PL_OK ? cx : &later;
            snprintf(use->obj, sizeof use->obj, "dataset %s", dpath);
            FIRST_ERROR(write_dataset(cur >= 0 ? lay : sec, g, data, xfer, dxpl, &dsets[k], use));
            if (r2 == PL_OK && data) mybytes += (double)g->numel * sizeof(float);
            if (!eager) FIRST_ERROR(view_unmap(be, PL_MAP_READ, dpath, &views[k], use));
            if (rc == PL_OK && rank == who && k + 1 == total / 2) {
                if (mode == FAIL_KILL) raise(SIGKILL);
                if (mode == FAIL_WRITE)
                    rc = fail_msg(cx, PL_EIO, "injected failure after %d of %d datasets (PIPELM_CKPT_FAIL=write)",
                                  k + 1, total);
            }
        }
        FIRST_ERROR(obj_close(&lay, use));
        FIRST_ERROR(obj_close(&sec, use));
        FIRST_ERROR(obj_close(&sub, use));
    }
    cx->obj[0] = 0;
    if (threaded) pthread_join(crc_thread, NULL);
    /* the views outlive the CRC thread's reads; a staging backend's are unmapped already */
    for (k = 0; k < total; k++)
        if (views[k].host) {
            char dpath[96];
            dataset_path(k / n, &gt[k % n], dpath, sizeof dpath);
            FIRST_ERROR(view_unmap(be, PL_MAP_READ, dpath, &views[k], use));
        }
    /* the one agreement of the data phase; the same MPI_Allreduce brings every CRC to every rank */
    rc = agree_max(comm, rc, err, errlen, vals, total);
    for (k = 0; k < total && rc == PL_OK; k++)
        if (!(vals[1 + k] >> 32)) /* the same on every rank */
            rc = fail_msg(cx, PL_EINVAL, "no rank computed the CRC-32C of dataset /%s/%s", sections[k / n],
                          gt[k % n].path);
    if (rc == PL_OK) {
        for (k = 0; k < total; k++) {
            char dpath[96];
            dataset_path(k / n, &gt[k % n], dpath, sizeof dpath);
            FIRST_ERROR(write_crc_attr(dsets[k], dpath, (uint32_t)vals[1 + k], use));
            snprintf(use->obj, sizeof use->obj, "dataset %s", dpath);
            FIRST_ERROR(obj_close(&dsets[k], use));
        }
        FIRST_ERROR(flush_file(f, use));
        rc = agree(comm, rc, err, errlen);
    }
#undef FIRST_ERROR
close:
    if (dxpl >= 0) H5Pclose(dxpl);
    for (k = 0; dsets && k < 3 * n; k++)
        if (dsets[k] >= 0) H5Dclose(dsets[k]);
    if (lay >= 0) H5Gclose(lay);
    if (sec >= 0) H5Gclose(sec);
    if (sub >= 0) H5Gclose(sub);
    if (rc != PL_OK && f >= 0) {
        /* The file is abandoned. Empty it before H5Fclose flushes what is left: on a full disk
         * that flush would fail too, and HDF5 1.10 does not recover from a failed H5Fclose
         * (the file ID is left dangling and the library crashes at exit). Every rank has
         * finished its writes here (the agreement above). */
        MPI_Barrier(comm);
        if (rank == 0 && truncate(path, 0) != 0) { /* best effort: the file is removed later */ }
        MPI_Barrier(comm);
    }
    {
        /* H5Fclose is collective and flushes the metadata: it can fail too. After an earlier
         * failure its message goes to a scratch buffer: the first cause is the one reported. */
        h5ctx cc = {cx->file, "", scratch, sizeof scratch, rank};
        int crc = ckpt_h5_close_file(&f, rc == PL_OK ? cx : &cc);
        if (rc == PL_OK) rc = agree(comm, crc, err, errlen);
    }
    if (rc == PL_OK && rank == 0) release_space(path);
    if (rc == PL_OK && bytes_out) {
        double all = 0.0;
        MPI_Allreduce(&mybytes, &all, 1, MPI_DOUBLE, MPI_SUM, comm);
        *bytes_out = all;
    }
out:
    /* after a failure before the data phase's end: views still mapped (their errors go to the
     * scratch buffer, the first cause is the one reported) */
    for (k = 0; views && k < 3 * n; k++)
        if (views[k].host) {
            char dpath[96];
            dataset_path(k / n, &gt[k % n], dpath, sizeof dpath);
            view_unmap(be, PL_MAP_READ, dpath, &views[k], &later);
        }
    free(gt);
    free(dsets);
    free(vals);
    free(views);
    return rc;
}

/* ---- the atomic save -------------------------------------------------------------------- */

/* Parse "ckpt_<digits>.h5" -> step; -1 if the name is anything else (temp files included). */
long long ckpt_name_step(const char *name) {
    if (strncmp(name, "ckpt_", 5) != 0) return -1;
    const char *p = name + 5, *q = p;
    while (isdigit((unsigned char)*q)) q++;
    if (q == p || q - p > 18 || strcmp(q, ".h5") != 0) return -1;
    return atoll(p);
}

/* mkdir -p. */
int ckpt_make_dirs(const char *dir) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
    struct stat sb;
    if (stat(buf, &sb) != 0) return -1;
    if (!S_ISDIR(sb.st_mode)) { errno = ENOTDIR; return -1; }
    return 0;
}

/* fsync a file or directory by path. */
static int fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    int r = fsync(fd);
    /* some file systems refuse fsync on directories: not a failure of the save */
    if (r != 0 && (errno == EINVAL || errno == EROFS)) r = 0;
    int e = errno;
    close(fd);
    errno = e;
    return r;
}

/* Is a temporary file of a save stale? name is ".ckpt_<step>.<host>.<pid>.h5.tmp" or
 * "latest.<host>.<pid>.tmp" (or the untagged names of an older pipelm). Stale: this job's
 * own (tag), any at all while this job holds the directory's lock, an untagged one, or one
 * of this host whose pid is gone. Another host's, or a live process's, is left alone. */
static int temp_is_stale(const char *name, const char *tag, int locked) {
    const char *p, *end;
    if (strncmp(name, ".ckpt_", 6) == 0 && (end = strstr(name, ".h5.tmp")) && end[7] == 0) {
        p = name + 6;
        while (isdigit((unsigned char)*p)) p++;
    } else if (strcmp(name, "latest.tmp") == 0) {
        return 1; /* an older pipelm's */
    } else if (strncmp(name, "latest.", 7) == 0 && strlen(name) > 11 && strcmp(name + strlen(name) - 4, ".tmp") == 0) {
        p = name + 6;
        end = name + strlen(name) - 4;
    } else return 0;
    if (p >= end) return 1; /* untagged: ".ckpt_00000001.h5.tmp", "latest.tmp" */
    if (*p != '.') return 0;
    char t[256];
    snprintf(t, sizeof t, "%.*s", (int)(end - p - 1), p + 1);
    if (strcmp(t, tag) == 0 || locked) return 1;
    char *dot = strrchr(t, '.'), mine[256];
    if (!dot) return 0;
    *dot = 0;
    snprintf(mine, sizeof mine, "%s", tag);
    char *md = strrchr(mine, '.');
    if (md) *md = 0;
    return strcmp(t, mine) == 0 && !ckpt_pid_alive(atol(dot + 1));
}

/* Remove temporary files left by a save that died (a killed rank); rank 0 at a save's start.
 * Only stale ones (temp_is_stale): never a live job's. */
static void remove_stale_temps(const char *dir, const char *tag) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[4400];
    int locked = ckpt_lock_held(dir);
    while ((e = readdir(d)))
        if (temp_is_stale(e->d_name, tag, locked)) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
}

/* Compare steps for qsort (ascending). */
static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

/* Remove checkpoints beyond the newest `keep` (oldest first), never `current`. A file that
 * cannot be removed is reported as a warning: the save itself succeeded. */
static void prune(const char *dir, int keep, long long current) {
    if (keep <= 0) return;
    DIR *d = opendir(dir);
    if (!d) return;
    size_t n = 0, cap = 64;
    long long *steps = malloc(cap * sizeof *steps);
    struct dirent *e;
    while (steps && (e = readdir(d))) {
        long long s = ckpt_name_step(e->d_name);
        if (s < 0) continue;
        if (n == cap) {
            long long *t = realloc(steps, 2 * cap * sizeof *steps);
            if (!t) break;
            steps = t;
            cap *= 2;
        }
        steps[n++] = s;
    }
    closedir(d);
    if (!steps) return;
    qsort(steps, n, sizeof *steps, cmp_ll);
    for (size_t i = 0; i + (size_t)keep < n; i++) {
        if (steps[i] == current) continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/ckpt_%08lld.h5", dir, steps[i]);
        if (unlink(p) != 0 && errno != ENOENT)
            fprintf(stderr, "pipelm: rank 0: warning: could not remove old checkpoint %s: %s\n", p, strerror(errno));
    }
    free(steps);
}

/* Rank 0: make a closed, verified temporary file durable and move it into place; then point
 * latest at it (through latest.<tag>.tmp). Returns an error (and leaves latest alone) if any
 * step fails. */
static int publish(const char *dir, const char *tmp, const char *final, const char *name, const char *tag,
                   h5ctx *cx) {
    char lt[4400], lf[4400];
    snprintf(lt, sizeof lt, "%s/latest.%s.tmp", dir, tag);
    snprintf(lf, sizeof lf, "%s/latest", dir);
    if (fsync_path(tmp) != 0) return fail_msg(cx, PL_EIO, "fsync of %s failed: %s", tmp, strerror(errno));
    char why[4400];
    if (pl_output_replace(tmp, final, "checkpoint", why, sizeof why) != PL_OK) /* never over a device */
        return fail_msg(cx, PL_EIO, "%s", why);
    fsync_path(dir);
    FILE *fp = fopen(lt, "w");
    if (!fp) return fail_msg(cx, PL_EIO, "cannot create %s: %s (%s is saved but latest still names the previous one)",
                             lt, strerror(errno), final);
    int ok = fprintf(fp, "%s\n", name) > 0;
    ok = fflush(fp) == 0 && ok;
    ok = fsync(fileno(fp)) == 0 && ok;
    int e = errno;
    ok = fclose(fp) == 0 && ok;
    if (!ok) {
        unlink(lt);
        return fail_msg(cx, PL_EIO, "updating %s failed: %s (%s is saved but latest still names the previous one)",
                        lf, strerror(e), final);
    }
    if (pl_output_replace(lt, lf, "latest", why, sizeof why) != PL_OK)
        return fail_msg(cx, PL_EIO, "%s (%s is saved but latest still names the previous one)", why, final);
    fsync_path(dir);
    return PL_OK;
}

/* Test-only (PIPELM_CKPT_FAIL=corrupt), rank 0: flip one byte in the data of the file's last
 * dataset (/optim/v of the last tensor, written by the last stage), as a disk or a second
 * writer would, after the file is closed and before it is verified. */
static int inject_corruption(const char *tmp, const char *dpath, h5ctx *cx) {
    int rc = PL_OK;
    hid_t f = -1, ds = -1;
    haddr_t off = HADDR_UNDEF;
    if ((rc = ckpt_h5_open(tmp, 0, MPI_COMM_NULL, &f, cx)) != PL_OK) return rc;
    CKPT_H5(ds = H5Dopen2(f, dpath, H5P_DEFAULT));
    off = H5Dget_offset(ds);
done:
    if (ds >= 0) H5Dclose(ds);
    if (f >= 0) ckpt_h5_close_file(&f, cx);
    if (rc != PL_OK) return rc;
    if (off == HADDR_UNDEF) return fail_msg(cx, PL_EIO, "PIPELM_CKPT_FAIL=corrupt: dataset %s has no data", dpath);
    int fd = open(tmp, O_RDWR);
    unsigned char c = 0;
    int ok = fd >= 0 && pread(fd, &c, 1, (off_t)off) == 1;
    c ^= 0x5a;
    ok = ok && pwrite(fd, &c, 1, (off_t)off) == 1;
    if (fd >= 0) close(fd);
    return ok ? PL_OK : fail_msg(cx, PL_EIO, "PIPELM_CKPT_FAIL=corrupt: cannot change %s: %s", tmp, strerror(errno));
}

/* Collective: read back one dataset of a closed file and check it against its crc32c (every
 * rank opens it and reads the attribute: collective metadata; buf != NULL: this rank wrote
 * it and reads its data, independently). */
static int verify_dataset(hid_t f, const char *dpath, float *buf, size_t numel, h5ctx *cx) {
    int rc = PL_OK, has_crc = 0, fletcher = 0;
    uint32_t stored = 0;
    hid_t ds = -1;
    snprintf(cx->obj, sizeof cx->obj, "dataset %s", dpath);
    CKPT_H5(ds = H5Dopen2(f, dpath, H5P_DEFAULT));
    if ((rc = ckpt_dataset_checksum(ds, dpath, &has_crc, &stored, &fletcher, cx)) != PL_OK) goto done;
    if (!has_crc) {
        rc = fail_msg(cx, PL_EIO, "dataset %s has no " CRC_ATTR " attribute", dpath);
        goto done;
    }
    if (buf) {
        CKPT_H5(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf));
        uint32_t computed = ckpt_crc_floats(buf, numel);
        if (computed != stored)
            rc = fail_msg(cx, PL_EIO, "dataset %s: CRC-32C mismatch (stored 0x%08x, read back 0x%08x)", dpath,
                          (unsigned)stored, (unsigned)computed);
    }
done:
    if (ds >= 0) H5Dclose(ds);
    return rc;
}

/* PIPELM_CKPT_VERIFY=0 skips the read-back (only to measure what it costs). */
static int verify_off(void) {
    const char *s = getenv("PIPELM_CKPT_VERIFY");
    return s && strcmp(s, "0") == 0;
}

/* Collective: verify a written, closed checkpoint before it is published: the metadata
 * (ckpt_read_meta: ranges and meta_crc32c) on every rank, and every dataset's CRC-32C, each
 * re-read by the rank that wrote it. One agreement; err names the first failure. */
static int verify_file(const char *tmp, const char *label, stage *st, optim *opt, MPI_Comm comm, char *err,
                       size_t errlen) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    h5ctx cxs = {label, "", err, errlen, rank}, *cx = &cxs;
    char scratch[1024];
    h5ctx later = {label, "", scratch, sizeof scratch, rank};
    int rc = PL_OK, n = model_num_tensors(&st->cfg);
    size_t most = 0;
    ckpt_gtensor *gt = calloc((size_t)n, sizeof *gt);
    if (gt) n = ckpt_global_tensors(&st->cfg, gt);
    for (int i = 0; gt && i < n; i++)
        if (written_tensor(st, opt, &gt[i], i) && gt[i].numel > most) most = gt[i].numel;
    float *buf = most ? malloc(most * sizeof *buf) : NULL;
    hid_t f = -1;
    if (!gt || (most && !buf)) rc = fail_msg(cx, PL_ENOMEM, "out of memory for verifying the file");
    if ((rc = agree(comm, rc, err, errlen)) != PL_OK) goto out;
    rc = ckpt_h5_open(tmp, 0, comm, &f, cx);
    if ((rc = agree(comm, rc, err, errlen)) != PL_OK) goto out;
    rc = ckpt_read_meta(f, NULL, NULL, cx);
    for (int k = 0; k < 3 * n; k++) { /* after a failure: every collective call, no data */
        char dpath[96];
        dataset_path(k / n, &gt[k % n], dpath, sizeof dpath);
        int mine = rc == PL_OK && written_tensor(st, opt, &gt[k % n], k % n) != NULL;
        int r2 = verify_dataset(f, dpath, mine ? buf : NULL, gt[k % n].numel, rc == PL_OK ? cx : &later);
        if (rc == PL_OK) rc = r2;
    }
    rc = agree(comm, rc, err, errlen);
    {
        h5ctx cc = {label, "", scratch, sizeof scratch, rank};
        int crc = ckpt_h5_close_file(&f, rc == PL_OK ? cx : &cc);
        if (rc == PL_OK) rc = agree(comm, crc, err, errlen);
    }
out:
    free(buf);
    free(gt);
    return rc;
}

/* Collective: after the file is written and closed: the test-only corruption, the
 * verification, and rank 0's publication; returns the agreed status. */
static int check_and_publish(const char *dir, const char *tmp, const char *final, const char *name, const char *tag,
                             stage *st, optim *opt, MPI_Comm comm, char *err, size_t errlen) {
    int rank, size, who;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    h5ctx cxs = {final, "", err, errlen, rank}, *cx = &cxs;
    int rc = PL_OK, mode = fail_mode(size, &who, cx);
    if (mode == FAIL_CORRUPT && rank == 0) {
        ckpt_gtensor *gt = calloc((size_t)model_num_tensors(&st->cfg), sizeof *gt);
        char dpath[96];
        int n = gt ? ckpt_global_tensors(&st->cfg, gt) : 0;
        if (gt) dataset_path(2, &gt[n - 1], dpath, sizeof dpath);
        rc = gt ? inject_corruption(tmp, dpath, cx) : fail_msg(cx, PL_ENOMEM, "out of memory");
        free(gt);
    }
    if ((rc = agree(comm, rc, err, errlen)) != PL_OK) return rc;
    if (!verify_off()) {
        rc = verify_file(tmp, final, st, opt, comm, err, errlen);
        if (rc != PL_OK) {
            char e2[1024];
            snprintf(e2, sizeof e2, "%s", err);
            snprintf(err, errlen, "verifying the written file before publishing it: %s; the temporary file was "
                     "removed and latest was not moved", e2);
            return rc;
        }
    }
    if (rank == 0) {
        if (mode == FAIL_RENAME)
            rc = fail_msg(cx, PL_EIO, "injected failure before renaming %s (PIPELM_CKPT_FAIL=rename)", tmp);
        else rc = publish(dir, tmp, final, name, tag, cx);
    }
    return agree(comm, rc, err, errlen);
}

/* Collective: the atomic save into DIR (see the file comment); returns the agreed status. */
int ckpt_save(const char *dir, stage *st, optim *opt, const ckpt_meta *meta, int keep, MPI_Comm comm,
              char *path_out, size_t pathlen, double *bytes_out, char *err, size_t errlen) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    char tmp[4400], final[4400], name[64], tag[128];
    ckpt_job_tag(tag, sizeof tag); /* rank 0's, so that every rank names the same temporary file */
    PL_MPI_CHECK(MPI_Bcast(tag, (int)sizeof tag, MPI_CHAR, 0, comm));
    snprintf(name, sizeof name, "ckpt_%08lld.h5", meta->step);
    snprintf(tmp, sizeof tmp, "%s/.ckpt_%08lld.%s.h5.tmp", dir, meta->step, tag);
    snprintf(final, sizeof final, "%s/%s", dir, name);
    h5ctx cxs = {final, "", err, errlen, rank}, *cx = &cxs;
    err[0] = 0;
    if (path_out && pathlen) snprintf(path_out, pathlen, "%s", final);
    int rc = PL_OK;
    if (!opt) /* before anything is created (ckpt_write_file checks it too) */
        rc = fail_msg(cx, PL_EINVAL, "no optimizer given: a checkpoint holds the AdamW moments beside the "
                      "parameters, so saving one needs the stage's optimizer");
    else if (meta->step < 0) rc = fail_msg(cx, PL_EINVAL, "negative step %lld", meta->step);
    else if (strlen(dir) > 4000) rc = fail_msg(cx, PL_EINVAL, "directory name too long");
    else if (rank == 0) {
        if (ckpt_make_dirs(dir) != 0) rc = fail_msg(cx, PL_EIO, "cannot create directory %s: %s", dir, strerror(errno));
        else remove_stale_temps(dir, tag);
    }
    if ((rc = agree(comm, rc, err, errlen)) != PL_OK) return rc;

    rc = ckpt_write_file(tmp, final, st, opt, meta, comm, bytes_out, err, errlen);
    if (rc == PL_OK) rc = check_and_publish(dir, tmp, final, name, tag, st, opt, comm, err, errlen);
    if (rc != PL_OK) {
        if (rank == 0) unlink(tmp); /* the previous checkpoint and latest stay untouched */
        return rc;
    }
    if (rank == 0) prune(dir, keep, meta->step);
    PL_MPI_CHECK(MPI_Barrier(comm)); /* nobody looks at DIR before the pruning is over */
    return PL_OK;
}

/* Collective: one checkpoint at an explicit path, through path.tmp and a rename. */
int ckpt_save_file(const char *path_in, stage *st, optim *opt, const ckpt_meta *meta, MPI_Comm comm,
                   double *bytes_out, char *err, size_t errlen) {
    char path[4200];
    pl_output_target(path_in, path, sizeof path); /* through a link, to the file it names */
    int rank;
    MPI_Comm_rank(comm, &rank);
    char tmp[4400];
    h5ctx cxs = {path, "", err, errlen, rank};
    /* the target first: only a regular file or nothing is replaced; one temporary name for
     * all ranks, unique to this job (rank 0's pid) */
    int rc = PL_OK;
    long id = (long)getpid();
    if (rank == 0 && pl_is_dev_null_path(path))
        rc = fail_msg(&cxs, PL_EINVAL, "a checkpoint cannot be written to /dev/null (it is published by a rename)");
    else if (rank == 0) rc = pl_check_output_file(path, "checkpoint", err, errlen);
    PL_MPI_CHECK(MPI_Bcast(&id, 1, MPI_LONG, 0, comm));
    rc = agree(comm, rc, err, errlen);
    if (rc != PL_OK) return rc;
    pl_output_tmp_name(path, id, tmp, sizeof tmp);
    rc = ckpt_write_file(tmp, path, st, opt, meta, comm, bytes_out, err, errlen);
    if (rc == PL_OK && rank == 0) {
        if (fsync_path(tmp) != 0) rc = fail_msg(&cxs, PL_EIO, "fsync of %s failed: %s", tmp, strerror(errno));
        else rc = pl_output_replace(tmp, path, "checkpoint", err, errlen);
    }
    rc = agree(comm, rc, err, errlen);
    if (rc != PL_OK && rank == 0) unlink(tmp);
    return rc;
}

/* ---- resolving --resume ----------------------------------------------------------------- */

/* The newest ckpt_<step>.h5 in dir (step -1 if none); PL_EIO if dir cannot be read. */
static int newest_in_dir(const char *dir, long long *best, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    *best = -1;
    if (!d) {
        snprintf(err, errlen, "checkpoint directory %s: %s", dir, strerror(errno));
        return PL_EIO;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s = ckpt_name_step(e->d_name);
        if (s > *best) *best = s;
    }
    closedir(d);
    return PL_OK;
}

/* DIR/latest: *found = 1 and path if it names an existing checkpoint; *found = 0 and `why`
 * if it is missing or names a file that is gone; PL_EIO with err if it is unusable. */
static int read_latest(const char *dir, char *path, size_t pathlen, int *found, char *why, size_t whylen, char *err,
                       size_t errlen) {
    struct stat sb;
    char lf[4400], cand[4400 + 512];
    *found = 0;
    snprintf(lf, sizeof lf, "%s/latest", dir);
    if (lstat(lf, &sb) != 0) {
        snprintf(why, whylen, "%s is missing", lf);
        return PL_OK;
    }
    /* DIR/latest holds one line: the file name of the newest complete checkpoint in DIR */
    FILE *fp = NULL;
    char name[512] = "", e2[4600];
    if (pl_open_input(lf, "checkpoint pointer", 4096, &fp, e2, sizeof e2) != PL_OK) {
        snprintf(err, errlen, "%s (it should hold the name of the newest checkpoint; remove it to use the "
                 "newest ckpt_*.h5)", e2);
        return PL_EIO;
    }
    size_t got = fread(name, 1, sizeof name - 1, fp);
    fclose(fp);
    name[got] = 0;
    size_t n = strcspn(name, "\n");
    int garbage = strlen(name) != got || (name[n] == '\n' && name[n + 1] != 0); /* a NUL, or a second line */
    name[n] = 0;
    if (!garbage && name[0] && (strchr(name, '/') || strstr(name, "..") || ckpt_name_step(name) < 0)) garbage = 1;
    if (!name[0] || garbage) {
        char shown[160];
        size_t o = 0;
        for (size_t i = 0; i < n && i < 60 && o + 6 < sizeof shown; i++) {
            unsigned char c = (unsigned char)name[i];
            if (c >= 0x20 && c < 0x7f) shown[o++] = (char)c;
            else o += (size_t)snprintf(shown + o, sizeof shown - o, "\\x%02x", c);
        }
        shown[o] = 0;
        snprintf(err, errlen, "checkpoint pointer %s is %s: it must hold one file name ckpt_<step>.h5 of a "
                 "checkpoint in %s (remove it to resume from the newest ckpt_*.h5, or give --resume FILE)", lf,
                 !name[0] && !garbage ? "empty" : strchr(name, '/') || strstr(name, "..")
                 ? "refused (it names a path outside the checkpoint directory)" : "not a checkpoint name", dir);
        if (name[0]) snprintf(err + strlen(err), errlen - strlen(err), "; it holds '%s'", shown);
        return PL_EIO;
    }
    snprintf(cand, sizeof cand, "%s/%s", dir, name);
    if (stat(cand, &sb) != 0) {
        snprintf(why, whylen, "%s names %s, which is gone (%s)", lf, name, strerror(errno));
        return PL_OK;
    }
    PL_TRY(pl_check_input_file(cand, "checkpoint", err, errlen));
    snprintf(path, pathlen, "%s", cand);
    *found = 1;
    return PL_OK;
}

/* The checkpoint DIR/latest names, without any fallback (see ckpt.h; one process). */
int ckpt_latest(const char *dir, char *path, size_t pathlen, char *err, size_t errlen) {
    int found;
    char why[5200] = "";
    PL_TRY(read_latest(dir, path, pathlen, &found, why, sizeof why, err, errlen));
    if (!found) snprintf(err, errlen, "%s", why);
    return found ? PL_OK : PL_EIO;
}

/* What --resume names: a file, or the checkpoint DIR/latest names (see ckpt.h; one process). */
int ckpt_resolve(const char *path_or_dir, char *path, size_t pathlen, char *err, size_t errlen) {
    struct stat sb;
    if (stat(path_or_dir, &sb) != 0) {
        snprintf(err, errlen, "checkpoint %s: %s", path_or_dir, strerror(errno));
        return PL_EIO;
    }
    if (!S_ISDIR(sb.st_mode)) {
        PL_TRY(pl_check_input_file(path_or_dir, "checkpoint", err, errlen));
        snprintf(path, pathlen, "%s", path_or_dir);
        return PL_OK;
    }
    int found;
    char why[5200] = "";
    PL_TRY(read_latest(path_or_dir, path, pathlen, &found, why, sizeof why, err, errlen));
    if (found) return PL_OK;
    /* no usable latest: the highest-numbered ckpt_*.h5 (temporary files do not match), loudly */
    long long best;
    PL_TRY(newest_in_dir(path_or_dir, &best, err, errlen));
    if (best < 0) {
        snprintf(err, errlen, "no checkpoint in %s (%s and there is no ckpt_*.h5)", path_or_dir, why);
        return PL_EIO;
    }
    snprintf(path, pathlen, "%s/ckpt_%08lld.h5", path_or_dir, best);
    PL_TRY(pl_check_input_file(path, "checkpoint", err, errlen));
    if (pl_rank <= 0)
        fprintf(stderr, "pipelm: rank 0: warning: %s: resuming from the newest checkpoint file instead, %s\n", why, path);
    return PL_OK;
}

/* ---- loading ---------------------------------------------------------------------------- */

/* Range checks of the metadata read back, each naming the attribute and its value. */
#define CKPT_MAX_STEP 2147483646LL /* steps are int in a run, and the next step must be too */
#define META_INT_IN(lab, v, lo, hi)                                                               \
    do {                                                                                          \
        if ((v) < (lo) || (v) > (hi))                                                             \
            return fail_msg(cx, PL_EIO, "attribute %s = %lld is out of range (%lld..%lld)", lab,  \
                            (long long)(v), (long long)(lo), (long long)(hi));                    \
    } while (0)
#define META_DBL_OK(lab, v, cond, want)                                                           \
    do {                                                                                          \
        if (!isfinite(v) || !(cond))                                                              \
            return fail_msg(cx, PL_EIO, "attribute %s = %g is out of range (%s)", lab, (v), want); \
    } while (0)

/* Check every value of the metadata for range and consistency (see ckpt.h). */
static int validate_meta(const meta_all *a, const long long *tr, h5ctx *cx) {
    const ckpt_meta *m = &a->m;
    META_INT_IN("/step", a->root_step, 0, CKPT_MAX_STEP);
    if (tr[0] != a->root_step || a->optim_step != a->root_step)
        return fail_msg(cx, PL_EIO, "attributes /step = %lld, /train/step = %lld and /optim/step = %lld disagree",
                        a->root_step, tr[0], a->optim_step);
    META_INT_IN("/train/tokens_seen", m->tokens_seen, 0, LLONG_MAX);
    META_INT_IN("/train/data_pos", m->data_pos, 0, LLONG_MAX);
    /* batch, seq_len, microbatches and schedule are all 0 / empty in a file that no run saved
     * (pipelm convert); otherwise they are a valid run's */
    int norun = tr[3] == 0 && tr[4] == 0 && tr[5] == 0 && !m->schedule[0];
    long long maxst = a->cfg[3] + 2 < CKPT_MAX_STAGES ? a->cfg[3] + 2 : CKPT_MAX_STAGES;
    META_INT_IN("/train/nstages", tr[6], 1, maxst);
    META_DBL_OK("/optim/lr", a->optim_lr, a->optim_lr >= 0, ">= 0 and finite");
    /* the training settings: the one validation the command line uses too (config.c) */
    cfg_train t = {m->lr, m->min_lr, m->grad_clip, m->beta1, m->beta2, m->eps, m->weight_decay, m->lr_schedule,
                   tr[1], tr[2], tr[3], tr[4], tr[5], a->has_branch ? tr[7] : -1, norun};
    model_config bounds; /* what config_check_train reads of the model: V and maxT, 1..INT_MAX here */
    memset(&bounds, 0, sizeof bounds);
    bounds.V = (int)a->cfg[0];
    bounds.maxT = (int)a->cfg[2];
    char e2[512];
    if (config_check_train(&t, &bounds, CFG_NAME_ATTR, e2, sizeof e2) != PL_OK) return fail_msg(cx, PL_EIO, "%s", e2);
    if (strcmp(a->optim_name, "adamw") != 0)
        return fail_msg(cx, PL_EIO, "attribute /optim/name is '%s', not 'adamw'", a->optim_name);
    if (!norun && !m->schedule[0]) return fail_msg(cx, PL_EIO, "attribute /train/schedule is empty");
    long long sum = 0;
    for (int s = 0; s < m->nstages; s++) {
        if (m->split[s] < 0 || (m->split[s] == 0 && s > 0 && s < m->nstages - 1))
            return fail_msg(cx, PL_EIO, "attribute /train/split: stage %d holds %d blocks (at least %d)", s,
                            m->split[s], s > 0 && s < m->nstages - 1 ? 1 : 0);
        sum += m->split[s];
    }
    if (sum != a->cfg[3])
        return fail_msg(cx, PL_EIO, "attribute /train/split adds up to %lld blocks but /config/n_layer is %lld", sum,
                        a->cfg[3]);
    return PL_OK;
}

/* The root attributes: format and format_version must be this pipelm's; pipelm_version,
 * step and created are read for the checksum (step is range-checked by validate_meta). */
static int read_meta_root(hid_t f, meta_all *a, h5ctx *cx) {
    PL_TRY(attr_get_str(f, "/", "format", a->format, sizeof a->format, cx));
    if (strcmp(a->format, CKPT_FORMAT) != 0)
        return fail_msg(cx, PL_EIO, "format is '%s', not '%s'", a->format, CKPT_FORMAT);
    PL_TRY(attr_get_i64(f, "/", "format_version", &a->format_version, cx));
    if (a->format_version != CKPT_FORMAT_VERSION)
        return fail_msg(cx, PL_EIO, "format_version is %lld; this pipelm reads version %d", a->format_version,
                        CKPT_FORMAT_VERSION);
    PL_TRY(attr_get_str(f, "/", "pipelm_version", a->version, sizeof a->version, cx));
    PL_TRY(attr_get_i64(f, "/", "step", &a->root_step, cx));
    PL_TRY(attr_get_str(f, "/", "created", a->created, sizeof a->created, cx));
    return PL_OK;
}

/* /config/arch of the open group g: "gpt2" or "llama"; absent (an older pipelm's file): gpt2. */
static int read_meta_arch(hid_t g, meta_all *a, h5ctx *cx) {
    int rc = PL_OK;
    htri_t ha;
    snprintf(cx->obj, sizeof cx->obj, "attribute /config/arch");
    CKPT_H5(ha = H5Aexists(g, "arch"));
    cx->obj[0] = 0;
    a->has_arch = ha > 0;
    snprintf(a->arch, sizeof a->arch, "gpt2");
    if (a->has_arch && (rc = attr_get_str(g, "/config", "arch", a->arch, sizeof a->arch, cx))) goto done;
    if (strcmp(a->arch, "gpt2") != 0 && strcmp(a->arch, "llama") != 0)
        rc = fail_msg(cx, PL_EIO, "attribute /config/arch is '%s', not gpt2 or llama", a->arch);
done:
    return rc;
}

/* The Llama attributes of /config (every one required), range-checked by name before
 * anything narrows them: by the one validation of Llama settings the command line and
 * --init use too (config.c), so a run's checkpoints always pass it. */
static int read_meta_llama(hid_t g, meta_all *a, h5ctx *cx) {
    for (int i = 0; i < 6; i++) PL_TRY(attr_get_i64(g, "/config", llama_int_attr[i], &a->lcfg[i], cx));
    for (int i = 0; i < 3; i++) PL_TRY(attr_get_f64(g, "/config", llama_f64_attr[i], &a->lf[i], cx));
    /* ffn_hidden is derived: read_meta_config compares it with the size the others give */
    if (a->lcfg[1] < 1 || a->lcfg[1] > INT_MAX)
        return fail_msg(cx, PL_EIO, "attribute /config/ffn_hidden = %lld is out of range (1..%d)", a->lcfg[1], INT_MAX);
    cfg_llama l = {a->cfg[4], a->lcfg[0], a->lcfg[2], a->lcfg[3], a->lcfg[4], a->lcfg[5], a->lf[0], a->lf[1], a->lf[2]};
    char e2[512];
    if (config_check_llama(&l, CFG_NAME_ATTR, e2, sizeof e2) != PL_OK) return fail_msg(cx, PL_EIO, "%s", e2);
    return PL_OK;
}

/* /config: 64-bit, range-checked by gpt2_config_make before anything narrows them; the
 * model it describes goes to *cfg. */
static int read_meta_config(hid_t f, meta_all *a, model_config *cfg, h5ctx *cx) {
    static const char *const cn[6] = {"vocab_size", "padded_vocab_size", "max_seq_len", "n_layer", "n_head", "n_embd"};
    int rc = PL_OK;
    hid_t g = -1;
    if ((rc = group_open(f, "config", &g, cx))) goto done;
    for (int i = 0; i < 6; i++)
        if ((rc = attr_get_i64(g, "/config", cn[i], &a->cfg[i], cx))) goto done;
    for (int i = 0; i < 6; i++)
        if (a->cfg[i] < 1 || a->cfg[i] > INT_MAX) {
            rc = fail_msg(cx, PL_EIO, "attribute /config/%s = %lld is out of range (1..%d)", cn[i], a->cfg[i], INT_MAX);
            goto done;
        }
    char e2[256];
    if ((rc = read_meta_arch(g, a, cx))) goto done;
    if (a->has_arch && strcmp(a->arch, "llama") == 0) {
        if ((rc = read_meta_llama(g, a, cx))) goto done;
        if (llama_config_make(cfg, (int)a->cfg[0], (int)a->cfg[2], (int)a->cfg[3], (int)a->cfg[4], (int)a->lcfg[0],
                              (int)a->cfg[5], (int)a->lcfg[2], (float)a->lf[0], (float)a->lf[1], (float)a->lf[2],
                              (int)a->lcfg[3], CFG_NAME_ATTR, e2, sizeof e2) != PL_OK) {
            rc = fail_msg(cx, PL_EIO, "bad /config (llama): %s", e2);
            goto done;
        }
        if (cfg->H != a->lcfg[1]) {
            rc = fail_msg(cx, PL_EIO, "attribute /config/ffn_hidden = %lld is not the MLP hidden size %d that "
                          "n_embd, ffn_dim_multiplier and multiple_of give", a->lcfg[1], cfg->H);
            goto done;
        }
        cfg->ver_major = (int)a->lcfg[4];
        cfg->ver_minor = (int)a->lcfg[5];
    } else if (gpt2_config_make(cfg, (int)a->cfg[0], (int)a->cfg[2], (int)a->cfg[3], (int)a->cfg[4], (int)a->cfg[5], e2,
                                sizeof e2) != PL_OK) {
        rc = fail_msg(cx, PL_EIO, "bad /config: %s", e2);
        goto done;
    }
    if (cfg->Vp != a->cfg[1]) {
        rc = fail_msg(cx, PL_EIO, "padded_vocab_size %lld is not vocab_size %lld rounded up to 128", a->cfg[1],
                      a->cfg[0]);
        goto done;
    }
    rc = obj_close(&g, cx);
done:
    if (g >= 0) H5Gclose(g);
    return rc;
}

/* /optim: the AdamW settings and the optimizer's own lr and step (checked by validate_meta). */
static int read_meta_optim(hid_t f, meta_all *a, h5ctx *cx) {
    ckpt_meta *m = &a->m;
    int rc = PL_OK;
    hid_t g = -1;
    if ((rc = group_open(f, "optim", &g, cx))) goto done;
    if ((rc = attr_get_str(g, "/optim", "name", a->optim_name, sizeof a->optim_name, cx)) ||
        (rc = attr_get_f64(g, "/optim", "beta1", &m->beta1, cx)) ||
        (rc = attr_get_f64(g, "/optim", "beta2", &m->beta2, cx)) || (rc = attr_get_f64(g, "/optim", "eps", &m->eps, cx)) ||
        (rc = attr_get_f64(g, "/optim", "weight_decay", &m->weight_decay, cx)) ||
        (rc = attr_get_f64(g, "/optim", "lr", &a->optim_lr, cx)) ||
        (rc = attr_get_i64(g, "/optim", "step", &a->optim_step, cx)))
        goto done;
    rc = obj_close(&g, cx);
done:
    if (g >= 0) H5Gclose(g);
    return rc;
}

/* The scalar attributes of the open /train group g, in a fixed order (the same on every
 * rank), and the optional markov_branch (a->has_branch says whether it is there). The
 * int-valued ones land in tr[] as 64-bit values (see ckpt_read_meta), so that they are
 * range-checked before anything narrows them. */
static int read_meta_train_scalars(hid_t g, meta_all *a, long long *tr, h5ctx *cx) {
    ckpt_meta *m = &a->m;
    int rc = PL_OK;
    if ((rc = attr_get_i64(g, "/train", "step", &tr[0], cx)) ||
        (rc = attr_get_i64(g, "/train", "tokens_seen", &m->tokens_seen, cx)) ||
        (rc = attr_get_i64(g, "/train", "data_pos", &m->data_pos, cx)) ||
        (rc = attr_get_i64(g, "/train", "seed", &m->seed, cx)) ||
        (rc = attr_get_i64(g, "/train", "data_seed", &m->data_seed, cx)) ||
        (rc = attr_get_str(g, "/train", "data", m->data, sizeof m->data, cx)) ||
        (rc = attr_get_f64(g, "/train", "lr", &m->lr, cx)) || (rc = attr_get_f64(g, "/train", "min_lr", &m->min_lr, cx)) ||
        (rc = attr_get_i64(g, "/train", "warmup_steps", &tr[1], cx)) ||
        (rc = attr_get_i64(g, "/train", "total_steps", &tr[2], cx)) ||
        (rc = attr_get_str(g, "/train", "lr_schedule", m->lr_schedule, sizeof m->lr_schedule, cx)) ||
        (rc = attr_get_f64(g, "/train", "grad_clip", &m->grad_clip, cx)) ||
        (rc = attr_get_i64(g, "/train", "batch", &tr[3], cx)) || (rc = attr_get_i64(g, "/train", "seq_len", &tr[4], cx)) ||
        (rc = attr_get_i64(g, "/train", "microbatches", &tr[5], cx)) ||
        (rc = attr_get_str(g, "/train", "schedule", m->schedule, sizeof m->schedule, cx)) ||
        (rc = attr_get_i64(g, "/train", "nstages", &tr[6], cx)))
        goto done;
    htri_t hb;
    snprintf(cx->obj, sizeof cx->obj, "attribute /train/markov_branch");
    CKPT_H5(hb = H5Aexists(g, "markov_branch"));
    a->has_branch = hb > 0;
    if (a->has_branch && (rc = attr_get_i64(g, "/train", "markov_branch", &tr[7], cx))) goto done;
    cx->obj[0] = 0;
done:
    return rc;
}

/* /train/split of the open group g: nstages (tr[6]) is range-checked first, since it sizes
 * the read, then each stage's block count against n_layer, before they narrow to int. */
static int read_meta_split(hid_t g, meta_all *a, const long long *tr, h5ctx *cx) {
    ckpt_meta *m = &a->m;
    long long maxst = a->cfg[3] + 2 < CKPT_MAX_STAGES ? a->cfg[3] + 2 : CKPT_MAX_STAGES; /* middle stages hold a block */
    if (tr[6] < 1 || tr[6] > maxst)
        return fail_msg(cx, PL_EIO, "attribute /train/nstages = %lld is out of range (1..%lld for n_layer %lld)", tr[6],
                        maxst, a->cfg[3]);
    m->nstages = (int)tr[6];
    long long sp[CKPT_MAX_STAGES];
    PL_TRY(attr_read(g, "/train", "split", H5T_NATIVE_LLONG, m->nstages, sp, cx));
    for (int s = 0; s < m->nstages; s++) {
        if (sp[s] < 0 || sp[s] > a->cfg[3])
            return fail_msg(cx, PL_EIO, "attribute /train/split: stage %d holds %lld blocks (0..%lld)", s, sp[s],
                            a->cfg[3]);
        m->split[s] = (int)sp[s];
    }
    return PL_OK;
}

/* /train: the run's state (read_meta_train_scalars) and its split (read_meta_split). */
static int read_meta_train(hid_t f, meta_all *a, long long *tr, h5ctx *cx) {
    int rc = PL_OK;
    hid_t g = -1;
    if ((rc = group_open(f, "train", &g, cx))) goto done;
    if ((rc = read_meta_train_scalars(g, a, tr, cx)) || (rc = read_meta_split(g, a, tr, cx))) goto done;
    rc = obj_close(&g, cx);
done:
    if (g >= 0) H5Gclose(g);
    return rc;
}

/* The checksum over all of the metadata: verified against the root meta_crc32c where the
 * file has one (m.meta_verified = 1); a file without one (an older pipelm's) is noted on
 * rank 0 and accepted on its range checks alone. a must be complete (see meta_canon). */
static int check_meta_crc(hid_t f, meta_all *a, h5ctx *cx) {
    ckpt_meta *m = &a->m;
    int rc = PL_OK;
    htri_t hc;
    snprintf(cx->obj, sizeof cx->obj, "attribute /meta_crc32c");
    CKPT_H5(hc = H5Aexists(f, "meta_crc32c"));
    cx->obj[0] = 0;
    if (hc > 0) {
        long long stored;
        if ((rc = attr_get_i64(f, "/", "meta_crc32c", &stored, cx))) goto done;
        uint32_t computed = meta_crc(a);
        if (stored < 0 || stored > 0xffffffffLL || (uint32_t)stored != computed) {
            rc = fail_msg(cx, PL_EIO, "metadata checksum mismatch: meta_crc32c is 0x%08llx but the attributes give "
                          "0x%08x (an attribute was changed after the save, or the file is damaged)",
                          (unsigned long long)stored & 0xffffffffULL, (unsigned)computed);
            goto done;
        }
        m->meta_verified = 1;
    } else {
        m->meta_verified = 0;
        if (cx->rank == 0)
            fprintf(stderr, "pipelm: rank 0: note: checkpoint %s has no meta_crc32c attribute (saved by an older "
                    "pipelm): its metadata is range-checked but cannot be verified\n", cx->file);
    }
done:
    return rc;
}

/* Check the root attributes (format, version), read /config and the metadata, check every
 * value's type and range, and verify meta_crc32c where the file has one. Every rank makes
 * the same HDF5 calls in the same order: root, /config, /optim, /train, meta_crc32c. */
int ckpt_read_meta(hid_t f, model_config *cfg_out, ckpt_meta *m_out, h5ctx *cx) {
    int rc = PL_OK;
    meta_all a;
    memset(&a, 0, sizeof a);
    ckpt_meta *m = &a.m;
    long long tr[8] = {0}; /* /train step, warmup_steps, total_steps, batch, seq_len, microbatches, nstages, markov_branch */
    model_config cfg;
    PL_TRY(read_meta_root(f, &a, cx));
    if ((rc = read_meta_config(f, &a, &cfg, cx)) || (rc = read_meta_optim(f, &a, cx)) ||
        (rc = read_meta_train(f, &a, tr, cx)) || (rc = validate_meta(&a, tr, cx)))
        goto done;
    m->step = a.root_step;
    m->warmup_steps = (int)tr[1];
    m->total_steps = (int)tr[2];
    m->batch = (int)tr[3];
    m->seq_len = (int)tr[4];
    m->microbatches = (int)tr[5];
    m->markov_branch = a.has_branch ? (int)tr[7] : -1;
    if ((rc = check_meta_crc(f, &a, cx))) goto done;
    if (cfg_out) *cfg_out = cfg;
    if (m_out) *m_out = *m;
done:
    if (rc == PL_OK) cx->obj[0] = 0;
    return rc;
}

/* The /config of the file must equal the run's model; name the first difference. */
static int check_config(const model_config *f, const model_config *r, h5ctx *cx) {
    if (f->arch != r->arch)
        return fail_msg(cx, PL_EINVAL, "arch is %s in the file but %s in this run", model_arch_name(f->arch),
                        model_arch_name(r->arch));
    const char *names[] = {"vocab_size", "padded_vocab_size", "max_seq_len", "n_layer", "n_head", "n_embd",
                           "n_kv_head", "ffn_hidden", "use_scaled_rope"};
    int a[] = {f->V, f->Vp, f->maxT, f->L, f->NH, f->C, f->NKV, f->H, f->use_scaled_rope};
    int b[] = {r->V, r->Vp, r->maxT, r->L, r->NH, r->C, r->NKV, r->H, r->use_scaled_rope};
    for (int i = 0; i < 9; i++)
        if (a[i] != b[i]) return fail_msg(cx, PL_EINVAL, "%s is %d in the file but %d in this run", names[i], a[i], b[i]);
    if (f->norm_eps != r->norm_eps || f->rope_theta != r->rope_theta)
        return fail_msg(cx, PL_EINVAL, "%s is %g in the file but %g in this run",
                        f->norm_eps != r->norm_eps ? "norm_eps" : "rope_theta",
                        (double)(f->norm_eps != r->norm_eps ? f->norm_eps : f->rope_theta),
                        (double)(f->norm_eps != r->norm_eps ? r->norm_eps : r->rope_theta));
    return PL_OK;
}

/* The checksum a dataset carries (see ckpt.h). */
int ckpt_dataset_checksum(hid_t ds, const char *dpath, int *has_crc, uint32_t *stored, int *fletcher, h5ctx *cx) {
    int rc = PL_OK;
    hid_t a = -1, sp = -1, dcpl = -1;
    *has_crc = *fletcher = 0;
    snprintf(cx->obj, sizeof cx->obj, "dataset %s: attribute " CRC_ATTR, dpath);
    htri_t there;
    CKPT_H5(there = H5Aexists(ds, CRC_ATTR));
    if (there) {
        CKPT_H5(a = H5Aopen(ds, CRC_ATTR, H5P_DEFAULT));
        CKPT_H5(sp = H5Aget_space(a));
        hssize_t np;
        CKPT_H5(np = H5Sget_simple_extent_npoints(sp));
        if (np != 1) {
            rc = fail_msg(cx, PL_EIO, "dataset %s: attribute " CRC_ATTR " holds %lld values, not one", dpath,
                          (long long)np);
            goto done;
        }
        CKPT_H5(H5Aread(a, H5T_NATIVE_UINT32, stored));
        *has_crc = 1;
    } else {
        snprintf(cx->obj, sizeof cx->obj, "dataset %s", dpath);
        CKPT_H5(dcpl = H5Dget_create_plist(ds));
        int nf;
        CKPT_H5(nf = H5Pget_nfilters(dcpl));
        for (int i = 0; i < nf; i++) {
            unsigned flags, cd[8];
            size_t ncd = 8;
            char fname[64];
            H5Z_filter_t id;
            CKPT_H5(id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, cd, sizeof fname, fname, NULL));
            if (id == H5Z_FILTER_FLETCHER32) *fletcher = 1;
        }
    }
done:
    if (dcpl >= 0) H5Pclose(dcpl);
    if (sp >= 0) H5Sclose(sp);
    if (a >= 0) H5Aclose(a);
    snprintf(cx->obj, sizeof cx->obj, "dataset %s", dpath);
    return rc;
}

/* Collective metadata: open one dataset, check its shape and that it carries a checksum
 * (every rank, the same answers); read it where buf != NULL and verify the CRC-32C of what
 * was read (or HDF5's Fletcher32 filter does, as it reads). With collective transfers the
 * ranks without buf take part in the H5Dread selecting nothing; with independent ones they
 * do not call it. A failure names the dataset. */
static int read_dataset(hid_t f, const char *dpath, const ckpt_gtensor *g, float *buf, int xfer, hid_t dxpl,
                        int nonneg, h5ctx *cx) {
    static float dummy;
    int rc = PL_OK;
    hid_t ds = -1, sp = -1;
    snprintf(cx->obj, sizeof cx->obj, "dataset %s", dpath);
    htri_t there;
    CKPT_H5(there = H5Lexists(f, dpath, H5P_DEFAULT));
    if (!there) {
        rc = fail_msg(cx, PL_EIO, "dataset %s is missing", dpath);
        goto done;
    }
    CKPT_H5(ds = H5Dopen2(f, dpath, H5P_DEFAULT));
    CKPT_H5(sp = H5Dget_space(ds));
    int nd;
    hsize_t dims[2] = {0, 0};
    CKPT_H5(nd = H5Sget_simple_extent_ndims(sp));
    if (nd >= 1 && nd <= 2) CKPT_H5(H5Sget_simple_extent_dims(sp, dims, NULL));
    if (nd != g->ndim || dims[0] != (hsize_t)g->shape[0] || (nd == 2 && dims[1] != (hsize_t)g->shape[1])) {
        char want[48], have[48];
        if (g->ndim == 2) snprintf(want, sizeof want, "(%d, %d)", g->shape[0], g->shape[1]);
        else snprintf(want, sizeof want, "(%d)", g->shape[0]);
        if (nd == 2) snprintf(have, sizeof have, "(%llu, %llu)", (unsigned long long)dims[0], (unsigned long long)dims[1]);
        else if (nd == 1) snprintf(have, sizeof have, "(%llu)", (unsigned long long)dims[0]);
        else snprintf(have, sizeof have, "%d dimensions", nd);
        rc = fail_msg(cx, PL_EIO, "dataset %s has shape %s in the file but this run expects %s", dpath, have, want);
        goto done;
    }
    int has_crc, fletcher;
    uint32_t stored = 0;
    if ((rc = ckpt_dataset_checksum(ds, dpath, &has_crc, &stored, &fletcher, cx)) != PL_OK) goto done;
    if (!has_crc && !fletcher) {
        rc = fail_msg(cx, PL_EIO, "dataset %s has no checksum (neither a " CRC_ATTR " attribute nor a Fletcher32 "
                      "filter): refusing to load it unverified", dpath);
        goto done;
    }
    if (buf) {
        CKPT_H5(H5Dread(ds, H5T_NATIVE_FLOAT, sp, sp, dxpl, buf));
    } else if (xfer == XFER_COLLECTIVE) {
        CKPT_H5(H5Sselect_none(sp));
        CKPT_H5(H5Dread(ds, H5T_NATIVE_FLOAT, sp, sp, dxpl, &dummy));
    }
    if (buf && has_crc) {
        uint32_t computed = ckpt_crc_floats(buf, g->numel);
        if (computed != stored) {
            rc = fail_msg(cx, PL_EIO, "dataset %s: CRC-32C mismatch (stored 0x%08x, computed 0x%08x)", dpath,
                          (unsigned)stored, (unsigned)computed);
            goto done;
        }
    }
    if (buf) { /* a checksum says the bytes are what was saved, not that they are usable */
        for (size_t i = 0; i < g->numel; i++)
            if (!isfinite(buf[i]) || (nonneg && buf[i] < 0.0f)) {
                char tname[64];
                if (g->layer >= 0) snprintf(tname, sizeof tname, "h.%d.%s", g->layer, param_kind_name[g->kind]);
                else snprintf(tname, sizeof tname, "%s", param_kind_name[g->kind]);
                rc = fail_msg(cx, PL_EIO, "dataset %s (tensor %s) holds %s value %g at element %zu: refusing to "
                              "load it", dpath, tname, isfinite(buf[i]) ? "a negative second-moment" : "a non-finite",
                              (double)buf[i], i);
                goto done;
            }
    }
    CKPT_H5(H5Sclose(sp));
    sp = -1;
    CKPT_H5(H5Dclose(ds));
    ds = -1;
done:
    if (sp >= 0) H5Sclose(sp);
    if (ds >= 0) H5Dclose(ds);
    return rc;
}

/* Collective: read this stage's tensors (and, with an optimizer, its moments) and the
 * metadata, verifying checksums, shapes and the model config; returns the agreed status. */
int ckpt_load(const char *path, stage *st, optim *opt, ckpt_meta *meta, MPI_Comm comm, double *bytes_out,
              char *err, size_t errlen) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    ckpt_h5_quiet();
    h5ctx cxs = {path, "", err, errlen, rank}, *cx = &cxs;
    char scratch[1024]; /* the errors of a rank that has already failed */
    h5ctx later = {path, "", scratch, sizeof scratch, rank};
    err[0] = 0;
    int rc = PL_OK, n = model_num_tensors(&st->cfg);
    hid_t f = -1, dxpl = -1;
    const backend *be = st->be;
    ckpt_gtensor *gt = calloc((size_t)n, sizeof *gt);
    double mybytes = 0.0;
    char e3[4400];
    int xfer = xfer_mode(cx);
    if (xfer < 0) rc = PL_EINVAL;
    else if (!gt) rc = fail_msg(cx, PL_ENOMEM, "out of memory");
    else if (opt && opt->st != st)
        rc = fail_msg(cx, PL_EINVAL, "the optimizer given belongs to another stage (its moments are laid out by "
                      "that stage's tensors)");
    else if (pl_check_input_file(path, "checkpoint", e3, sizeof e3) != PL_OK) rc = fail_msg(cx, PL_EIO, "%s", e3);
    if ((rc = agree(comm, rc, err, errlen)) != PL_OK) goto out;
    n = ckpt_global_tensors(&st->cfg, gt);

    rc = ckpt_h5_open(path, 0, comm, &f, cx);
    if ((rc = agree(comm, rc, err, errlen)) != PL_OK) goto out;
    model_config fc;
    ckpt_meta m;
    rc = ckpt_read_meta(f, &fc, &m, cx);
    if (rc == PL_OK) rc = check_config(&fc, &st->cfg, cx);
    if (rc == PL_OK) rc = dxpl_make(&dxpl, xfer == XFER_COLLECTIVE, cx);
    if ((rc = agree(comm, rc, err, errlen)) != PL_OK) goto close;

    /* Every rank walks every dataset (collective metadata) and reads those its stage holds
     * (the moments only with an optimizer), each into a host view of its tensor, mapped for
     * writing just around its read. As in a save, a rank that fails keeps its first message,
     * reads no more data and still makes every collective call; all agree once, at the end. */
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < n; i++) {
            const ckpt_gtensor *g = &gt[i];
            /* wte: first and last stage */
            const param_tensor *t = rc == PL_OK ? stage_find_tensor(st, g->kind, g->layer) : NULL;
            float *base = section_base(st, opt, s); /* NULL: moments without an optimizer */
            char dpath[96];
            dataset_path(s, g, dpath, sizeof dpath);
            host_view v = {NULL, NULL, 0};
            h5ctx *use = rc == PL_OK ? cx : &later;
            int r2 = t && base ? view_map(be, base, t, PL_MAP_WRITE, dpath, &v, use) : PL_OK;
            int r3 = read_dataset(f, dpath, g, v.host, xfer, dxpl, s == 2, r2 == PL_OK ? use : &later);
            if (r3 == PL_OK && v.host) mybytes += (double)t->numel * sizeof(float);
            if (r2 == PL_OK) r2 = r3;
            r3 = view_unmap(be, PL_MAP_WRITE, dpath, &v, r2 == PL_OK ? use : &later);
            if (r2 == PL_OK) r2 = r3;
            if (rc == PL_OK) rc = r2;
        }
    rc = agree(comm, rc, err, errlen);
    cx->obj[0] = 0;
    if (rc == PL_OK && meta) *meta = m;
close:
    if (dxpl >= 0) H5Pclose(dxpl);
    {
        h5ctx cc = {path, "", scratch, sizeof scratch, rank};
        int crc = ckpt_h5_close_file(&f, rc == PL_OK ? cx : &cc);
        if (rc == PL_OK) rc = agree(comm, crc, err, errlen);
    }
    if (rc == PL_OK && bytes_out) {
        double all = 0.0;
        MPI_Allreduce(&mybytes, &all, 1, MPI_DOUBLE, MPI_SUM, comm);
        *bytes_out = all;
    }
out:
    free(gt);
    return rc;
}

/* One process: a checkpoint's config and metadata, without its tensors. */
int ckpt_read_info(const char *path, model_config *cfg, ckpt_meta *meta, char *err, size_t errlen) {
    ckpt_h5_quiet();
    h5ctx cxs = {path, "", err, errlen, pl_rank < 0 ? 0 : pl_rank};
    err[0] = 0;
    hid_t f = -1;
    if (pl_check_input_file(path, "checkpoint", err, errlen) != PL_OK) return PL_EIO;
    int rc = ckpt_h5_open(path, 0, MPI_COMM_NULL, &f, &cxs);
    if (rc == PL_OK) rc = ckpt_read_meta(f, cfg, meta, &cxs);
    int crc = ckpt_h5_close_file(&f, &cxs);
    return rc != PL_OK ? rc : crc;
}
