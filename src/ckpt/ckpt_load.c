/*
 * ckpt_load.c — reading a checkpoint into any split. Every rank opens every dataset
 * (collective metadata) and checks its shape and checksum kind; the ranks whose stage holds
 * the tensor read all of it, independently (or, with collective transfers, in a collective
 * H5Dread where the others select nothing), into a host view of the tensor (map for writing,
 * unmap copies it into the backend), and check the CRC-32C of what they read against the
 * attribute. Without an optimizer only the parameters are read (the moments datasets are
 * still checked as those of other stages). A dataset without a crc32c attribute is accepted
 * only if it carries HDF5's Fletcher32 filter (which HDF5 verifies as it reads); one with
 * neither is refused. The same discipline as writing: one agreement.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/ckpt_internal.h"
#include "util/common.h"
#include "util/files.h"

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
            rc = ckpt_fail(cx, PL_EIO, "dataset %s: attribute " CRC_ATTR " holds %lld values, not one", dpath,
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
        rc = ckpt_fail(cx, PL_EIO, "dataset %s is missing", dpath);
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
        if (nd == 2)
            snprintf(have, sizeof have, "(%llu, %llu)", (unsigned long long)dims[0], (unsigned long long)dims[1]);
        else if (nd == 1) snprintf(have, sizeof have, "(%llu)", (unsigned long long)dims[0]);
        else snprintf(have, sizeof have, "%d dimensions", nd);
        rc = ckpt_fail(cx, PL_EIO, "dataset %s has shape %s in the file but this run expects %s", dpath, have, want);
        goto done;
    }
    int has_crc, fletcher;
    uint32_t stored = 0;
    if ((rc = ckpt_dataset_checksum(ds, dpath, &has_crc, &stored, &fletcher, cx)) != PL_OK) goto done;
    if (!has_crc && !fletcher) {
        rc = ckpt_fail(cx, PL_EIO, "dataset %s has no checksum (neither a " CRC_ATTR " attribute nor a Fletcher32 "
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
            rc = ckpt_fail(cx, PL_EIO, "dataset %s: CRC-32C mismatch (stored 0x%08x, computed 0x%08x)", dpath,
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
                rc = ckpt_fail(cx, PL_EIO, "dataset %s (tensor %s) holds %s value %g at element %zu: refusing to "
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
    int xfer = ckpt_xfer_mode(cx);
    if (xfer < 0) rc = PL_EINVAL;
    else if (!gt) rc = ckpt_fail(cx, PL_ENOMEM, "out of memory");
    else if (opt && opt->st != st)
        rc = ckpt_fail(cx, PL_EINVAL, "the optimizer given belongs to another stage (its moments are laid out by "
                       "that stage's tensors)");
    else if (pl_check_input_file(path, "checkpoint", e3, sizeof e3) != PL_OK) rc = ckpt_fail(cx, PL_EIO, "%s", e3);
    if ((rc = ckpt_agree(comm, rc, err, errlen)) != PL_OK) goto out;
    n = ckpt_global_tensors(&st->cfg, gt);

    rc = ckpt_h5_open(path, 0, comm, &f, cx);
    if ((rc = ckpt_agree(comm, rc, err, errlen)) != PL_OK) goto out;
    model_config fc;
    ckpt_meta m;
    rc = ckpt_read_meta(f, &fc, &m, cx);
    if (rc == PL_OK) rc = ckpt_check_config(&fc, &st->cfg, cx);
    if (rc == PL_OK) rc = ckpt_dxpl_make(&dxpl, xfer == XFER_COLLECTIVE, cx);
    if ((rc = ckpt_agree(comm, rc, err, errlen)) != PL_OK) goto close;

    /* Every rank walks every dataset (collective metadata) and reads those its stage holds
     * (the moments only with an optimizer), each into a host view of its tensor, mapped for
     * writing just around its read. As in a save, a rank that fails keeps its first message,
     * reads no more data and still makes every collective call; all agree once, at the end. */
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < n; i++) {
            const ckpt_gtensor *g = &gt[i];
            /* wte: first and last stage */
            const param_tensor *t = rc == PL_OK ? stage_find_tensor(st, g->kind, g->layer) : NULL;
            float *base = ckpt_section_base(st, opt, s); /* NULL: moments without an optimizer */
            char dpath[96];
            ckpt_dataset_path(s, g, dpath, sizeof dpath);
            ckpt_view v = {NULL, NULL, 0};
            h5ctx *use = rc == PL_OK ? cx : &later;
            int r2 = t && base ? ckpt_view_map(be, base, t, PL_MAP_WRITE, dpath, &v, use) : PL_OK;
            int r3 = read_dataset(f, dpath, g, v.host, xfer, dxpl, s == 2, r2 == PL_OK ? use : &later);
            if (r3 == PL_OK && v.host) mybytes += (double)t->numel * sizeof(float);
            if (r3 == PL_OK && v.host) r3 = ckpt_fill_twin(be, base, st, t, v.host, dpath, use);
            if (r2 == PL_OK) r2 = r3;
            r3 = ckpt_view_unmap(be, PL_MAP_WRITE, dpath, &v, r2 == PL_OK ? use : &later);
            if (r2 == PL_OK) r2 = r3;
            if (rc == PL_OK) rc = r2;
        }
    rc = ckpt_agree(comm, rc, err, errlen);
    cx->obj[0] = 0;
    if (rc == PL_OK && meta) *meta = m;
close:
    if (dxpl >= 0) H5Pclose(dxpl);
    {
        h5ctx cc = {path, "", scratch, sizeof scratch, rank};
        int crc = ckpt_h5_close_file(&f, rc == PL_OK ? cx : &cc);
        if (rc == PL_OK) rc = ckpt_agree(comm, crc, err, errlen);
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
