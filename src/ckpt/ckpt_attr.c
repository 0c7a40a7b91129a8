/*
 * ckpt_attr.c — typed HDF5 attributes of a checkpoint: scalar and 1-D integers and floats,
 * fixed-length strings, and their checked reads (a missing attribute, another type class,
 * another count or a malformed string is refused, naming it).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/ckpt_internal.h"
#include "util/common.h"

/* ---- small HDF5 helpers (every call through CKPT_H5) ---------------------------------- */

/* Write a scalar or 1-D attribute of a native type to loc. */
int ckpt_attr_write(hid_t loc, const char *name, hid_t ftype, hid_t mtype, int n, const void *val, h5ctx *cx) {
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
int ckpt_attr_i64(hid_t loc, const char *name, long long v, h5ctx *cx) {
    return ckpt_attr_write(loc, name, H5T_STD_I64LE, H5T_NATIVE_LLONG, 0, &v, cx);
}
int ckpt_attr_f64(hid_t loc, const char *name, double v, h5ctx *cx) {
    return ckpt_attr_write(loc, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 0, &v, cx);
}

/* A fixed-length, NUL-terminated string attribute (h5py reads it as bytes). */
int ckpt_attr_str(hid_t loc, const char *name, const char *s, h5ctx *cx) {
    int rc = PL_OK;
    hid_t t = -1;
    snprintf(cx->obj, sizeof cx->obj, "attribute %s", name);
    CKPT_H5(t = H5Tcopy(H5T_C_S1));
    CKPT_H5(H5Tset_size(t, strlen(s) + 1));
    CKPT_H5(H5Tset_strpad(t, H5T_STR_NULLTERM));
    rc = ckpt_attr_write(loc, name, t, t, 0, s, cx);
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
int ckpt_attr_read(hid_t loc, const char *grp, const char *name, hid_t mtype, int n, void *val, h5ctx *cx) {
    int rc = PL_OK;
    hid_t a = -1, sp = -1, ft = -1;
    char lab[96];
    attr_label(grp, name, lab, sizeof lab);
    snprintf(cx->obj, sizeof cx->obj, "attribute %s", lab);
    htri_t there;
    CKPT_H5(there = H5Aexists(loc, name));
    if (!there) {
        rc = ckpt_fail(cx, PL_EIO, "attribute %s is missing (not a pipelm checkpoint, or damaged)", lab);
        goto done;
    }
    CKPT_H5(a = H5Aopen(loc, name, H5P_DEFAULT));
    CKPT_H5(ft = H5Aget_type(a));
    H5T_class_t cls, want = H5Tget_class(mtype);
    CKPT_H5(cls = H5Tget_class(ft));
    if (cls != want) {
        rc = ckpt_fail(cx, PL_EIO, "attribute %s has the wrong type (HDF5 class %d; expected %s)", lab, (int)cls,
                       want == H5T_INTEGER ? "an integer" : "a floating-point number");
        goto done;
    }
    CKPT_H5(sp = H5Aget_space(a));
    hssize_t np;
    CKPT_H5(np = H5Sget_simple_extent_npoints(sp));
    if (np != n) {
        rc = ckpt_fail(cx, PL_EIO, "attribute %s holds %lld values, %d expected", lab, (long long)np, n);
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
int ckpt_attr_get_i64(hid_t loc, const char *grp, const char *name, long long *v, h5ctx *cx) {
    return ckpt_attr_read(loc, grp, name, H5T_NATIVE_LLONG, 1, v, cx);
}
int ckpt_attr_get_f64(hid_t loc, const char *grp, const char *name, double *v, h5ctx *cx) {
    return ckpt_attr_read(loc, grp, name, H5T_NATIVE_DOUBLE, 1, v, cx);
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
        rc = ckpt_fail(cx, PL_EIO, "attribute %s is missing (not a pipelm checkpoint, or damaged)", lab);
        goto done;
    }
    CKPT_H5(*a = H5Aopen(loc, name, H5P_DEFAULT));
    CKPT_H5(*ft = H5Aget_type(*a));
    H5T_class_t cls;
    CKPT_H5(cls = H5Tget_class(*ft));
    if (cls != H5T_STRING) {
        rc = ckpt_fail(cx, PL_EIO, "attribute %s is not a string", lab);
        goto done;
    }
    CKPT_H5(*sp = H5Aget_space(*a));
    hssize_t np;
    CKPT_H5(np = H5Sget_simple_extent_npoints(*sp));
    if (np != 1) {
        rc = ckpt_fail(cx, PL_EIO, "attribute %s holds %lld strings, one expected", lab, (long long)np);
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
    if (!*tmp) { rc = ckpt_fail(cx, PL_ENOMEM, "out of memory reading attribute %s", lab); goto done; }
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
        rc = ckpt_fail(cx, PL_EIO, "attribute %s is a string of %zu bytes, at most %zu expected", lab, *sz, len - 1);
        goto done;
    }
    *tmp = calloc(*sz + 1, 1);
    if (!*tmp) { rc = ckpt_fail(cx, PL_ENOMEM, "out of memory reading attribute %s", lab); goto done; }
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
        if (tmp[i]) return ckpt_fail(cx, PL_EIO, "attribute %s holds bytes after its terminating NUL", lab);
    if (n >= len)
        return ckpt_fail(cx, PL_EIO, "attribute %s is a string of %zu characters, at most %zu expected", lab, n,
                         len - 1);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)tmp[i] < 0x20 || tmp[i] == 0x7f)
            return ckpt_fail(cx, PL_EIO, "attribute %s holds a control character (\\x%02x at %zu)", lab,
                             (unsigned char)tmp[i], i);
    return PL_OK;
}

/* Read a string attribute into buf: refused if it is not a string, is len or more bytes
 * long, or holds a control character or a byte after its terminating NUL. The handles are
 * owned here and closed in one place, in the same order on every path. */
int ckpt_attr_get_str(hid_t loc, const char *grp, const char *name, char *buf, size_t len, h5ctx *cx) {
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
