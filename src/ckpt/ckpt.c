/*
 * ckpt.c — the checkpoint module's HDF5 plumbing: the one error check (CKPT_H5 turns
 * HDF5's error stack into one message naming the file, rank, object, call and source line),
 * messages for failures outside HDF5, files opened through MPI-IO with collective metadata
 * (and the MPI-IO hints), groups, dataset-transfer lists; and the settings of this process's
 * saves and loads (ckpt_opts, set once at start-up).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/ckpt_internal.h"
#include "util/common.h"

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
int ckpt_fail(h5ctx *cx, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int ckpt_fail(h5ctx *cx, int rc, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(cx->err, cx->errlen, "checkpoint %s: rank %d: %s", cx->file, cx->rank, msg);
    return rc;
}


/* Create a group under loc. */
int ckpt_group_create(hid_t loc, const char *name, hid_t *g, h5ctx *cx) {
    int rc = PL_OK;
    snprintf(cx->obj, sizeof cx->obj, "group %s", name);
    CKPT_H5(*g = H5Gcreate2(loc, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    cx->obj[0] = 0;
done:
    return rc;
}

/* Open an existing group. */
int ckpt_group_open(hid_t loc, const char *name, hid_t *g, h5ctx *cx) {
    int rc = PL_OK;
    snprintf(cx->obj, sizeof cx->obj, "group %s", name);
    CKPT_H5(*g = H5Gopen2(loc, name, H5P_DEFAULT));
    cx->obj[0] = 0;
done:
    return rc;
}

/* Close a group or dataset on the normal path, checked (unwind paths close unchecked: the
 * first error is the one worth reporting). Sets *id to -1. */
int ckpt_obj_close(hid_t *id, h5ctx *cx) {
    int rc = PL_OK;
    if (*id >= 0) CKPT_H5(H5Oclose(*id));
done:
    *id = -1;
    return rc;
}

/* A dataset-transfer property list for collective (or independent) MPI-IO. */
int ckpt_dxpl_make(hid_t *dxpl, int collective, h5ctx *cx) {
    int rc = PL_OK;
    CKPT_H5(*dxpl = H5Pcreate(H5P_DATASET_XFER));
    CKPT_H5(H5Pset_dxpl_mpio(*dxpl, collective ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT));
done:
    return rc;
}

/* Flush the file's metadata (collective), so that a full disk shows up here, while the
 * file can still be emptied and closed cleanly, rather than inside H5Fclose. */
int ckpt_flush_file(hid_t f, h5ctx *cx) {
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

/* ---- settings ------------------------------------------------------------------------- */

/* This process's settings: ckpt_set_opts at start-up, the built-in ones until then. */
static ckpt_opts the_opts = {0, "", 1, 1};

/* The built-in settings (what a run without --ckpt-* options or alias variables gets). */
void ckpt_opts_default(ckpt_opts *c) {
    memset(c, 0, sizeof *c);
    c->verify = 1;
    c->space_check = 1;
}

/* The settings the options ask for; config_check_ckpt has checked their values. */
void ckpt_opts_of(const pl_options *o, ckpt_opts *c) {
    ckpt_opts_default(c);
    c->collective = strcmp(o->ckpt_xfer, "collective") == 0;
    snprintf(c->hints, sizeof c->hints, "%s", o->ckpt_hints);
    c->verify = o->ckpt_verify != 0;
    c->space_check = o->ckpt_space_check != 0;
}

/* Set once at start-up, before any save or load. */
void ckpt_set_opts(const ckpt_opts *c) {
    the_opts = *c;
}

/* What the writer, the loader and the save read. */
const ckpt_opts *ckpt_get_opts(void) {
    return &the_opts;
}

/* MPI-IO hints. Each dataset is one contiguous extent written by its owner alone, so ROMIO's
 * two-phase collective buffering (which funnels the data through aggregator ranks) and data
 * sieving (which reads and rewrites gaps) only cost time: both off. --ckpt-hints
 * "key=value,key=value" adds or overrides hints (e.g. Lustre striping_factor); each item is
 * split at its first '=', leading blanks of the key dropped, empty items skipped. */
static MPI_Info make_hints(void) {
    MPI_Info info;
    if (MPI_Info_create(&info) != MPI_SUCCESS) return MPI_INFO_NULL;
    MPI_Info_set(info, "romio_cb_write", "disable");
    MPI_Info_set(info, "romio_ds_write", "disable");
    for (const char *h = the_opts.hints; *h;) {
        size_t n = strcspn(h, ","), eq = strcspn(h, "=");
        char k[128], v[128];
        size_t b = strspn(h, " \t");
        if (eq < n && eq > b && eq - b < sizeof k && n - eq - 1 < sizeof v && n - eq > 1) {
            snprintf(k, sizeof k, "%.*s", (int)(eq - b), h + b);
            snprintf(v, sizeof v, "%.*s", (int)(n - eq - 1), h + eq + 1);
            MPI_Info_set(info, k, v);
        }
        h += n + (h[n] == ',');
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
