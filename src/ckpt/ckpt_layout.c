/*
 * ckpt_layout.c — the datasets of a checkpoint: one per tensor of the whole model, named by
 * layer (/model/h.<i>/qkv_w ...), never by stage, so any split reads any checkpoint; the
 * same list under /optim/m and /optim/v for the AdamW moments. Datasets are fp32, CONTIGUOUS
 * (no chunks, no filters), each with a uint32 attribute crc32c, the CRC-32C of its
 * little-endian bytes in row-major order (crc32c.h). Also which rank writes which dataset
 * (the stage holding it; the first stage for the tied wte) and the host views of backend
 * memory it is written from or read into (backend map/unmap: the buffer itself on a
 * host-memory backend, a staged copy on a device one).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/ckpt_internal.h"
#include "util/common.h"
#include "util/crc32c.h"

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

/* One row of the schema: kind, layer (-1 outside the blocks) and shape (cols 0 = 1-D). */
static void schema_row(ckpt_gtensor *t, int kind, int layer, int rows, int cols) {
    t->kind = kind;
    t->layer = layer;
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols ? cols : 1;
    t->numel = (size_t)rows * (size_t)t->shape[1];
    if (layer >= 0) snprintf(t->path, sizeof t->path, "h.%d/%s", layer, param_kind_name[kind]);
    else snprintf(t->path, sizeof t->path, "%s", param_kind_name[kind]);
}

/* The model's own table of the whole model: its order is the schema's. 0 if out of memory. */
int ckpt_schema_of_model(const model_config *c, ckpt_gtensor *g) {
    param_tensor *t = calloc((size_t)model_max_tensors(c, c->L), sizeof *t);
    size_t total;
    if (!t) return 0;
    int n = model_layout(c, 0, c->L, 1, 1, t, &total);
    for (int i = 0; i < n; i++) {
        schema_row(&g[i], t[i].kind, t[i].layer, t[i].shape[0], 0); /* the name; the shape as the table has it */
        g[i].ndim = t[i].ndim;
        g[i].shape[1] = t[i].shape[1];
        g[i].numel = t[i].numel;
    }
    free(t);
    return n;
}

/* ---- host views of backend memory ------------------------------------------------------ */

/* Section s of the schema (0 /model, 1 /optim/m, 2 /optim/v) as a backend buffer: the
 * optimizer's (laid out as st->params) or, with no optimizer, the parameters only. */
float *ckpt_section_base(const stage *st, const optim *opt, int s) {
    static const int which[3] = {OPTIM_PARAMS, OPTIM_M, OPTIM_V};
    if (opt) return optim_buffer(opt, which[s]);
    return s == 0 ? st->params : NULL;
}

/* The tensor of this stage that dataset g's data is written from: NULL where this rank
 * writes none (a tied copy is written from its owner, the first stage). */
const param_tensor *ckpt_written_tensor(const stage *st, const optim *opt, const ckpt_gtensor *g, int i) {
    const param_tensor *t = stage_find_tensor(st, g->kind, g->layer);
    /* data parallelism: the D replicas of a stage share its tensors out, tensor i to replica i mod D */
    int D = opt && opt->dp_size > 1 ? opt->dp_size : 1, d = D > 1 ? opt->dp_rank : 0;
    return t && !t->tied_copy && i % D == d ? t : NULL;
}

/* The second tensor of this stage with t's kind and layer, or NULL: a stage that holds both
 * ends of a tied embedding as two chunks (the V placement's rank 0) keeps the head's copy of
 * wte beside wte itself, and a read fills both. */
static const param_tensor *ckpt_tied_twin(const stage *st, const param_tensor *t) {
    for (int i = 0; t && i < st->ntensors; i++)
        if (&st->tensors[i] != t && st->tensors[i].kind == t->kind && st->tensors[i].layer == t->layer)
            return &st->tensors[i];
    return NULL;
}

/* Copy a dataset just read into t's host view (src) into t's twin, if the stage has one. */
int ckpt_fill_twin(const backend *be, float *base, const stage *st, const param_tensor *t, const void *src,
                   const char *dpath, h5ctx *cx) {
    const param_tensor *tw = ckpt_tied_twin(st, t);
    if (!tw || !src) return PL_OK;
    ckpt_view v = {NULL, NULL, 0};
    PL_TRY(ckpt_view_map(be, base, tw, PL_MAP_WRITE, dpath, &v, cx));
    memcpy(v.host, src, tw->numel * sizeof(float));
    return ckpt_view_unmap(be, PL_MAP_WRITE, dpath, &v, cx);
}

/* A host view of one tensor of a section, for one dataset: map (mode PL_MAP_READ to write
 * the file from it, PL_MAP_WRITE to read the file into it) and unmap, with the same p,
 * bytes and mode. A failure names the backend, the dataset and be->error(). */
int ckpt_view_map(const backend *be, float *base, const param_tensor *t, int mode, const char *dpath, ckpt_view *v,
                  h5ctx *cx) {
    void *host = NULL;
    v->host = NULL;
    v->p = base + t->offset;
    v->bytes = t->numel * sizeof(float);
    int r = be->map(&host, v->p, v->bytes, mode);
    if (r != PL_OK || !host) {
        const char *why = be->error ? be->error() : "";
        return ckpt_fail(cx, PL_EBACKEND, "backend %s: mapping %zu bytes of dataset %s for %s failed: %s", be->name,
                         v->bytes, dpath, mode == PL_MAP_READ ? "writing the file" : "reading the file",
                         r == PL_OK ? "it returned no host view" : why && why[0] ? why : "no message from the backend");
    }
    v->host = host;
    return PL_OK;
}

/* Unmap a view (no-op if not mapped); dpath names the dataset in the message. */
int ckpt_view_unmap(const backend *be, int mode, const char *dpath, ckpt_view *v, h5ctx *cx) {
    if (!v->host) return PL_OK;
    int r = be->unmap(v->host, v->p, v->bytes, mode);
    v->host = NULL;
    if (r != PL_OK) {
        const char *why = be->error ? be->error() : "";
        return ckpt_fail(cx, PL_EBACKEND, "backend %s: unmapping %zu bytes of dataset %s after %s failed: %s",
                         be->name, v->bytes, dpath, mode == PL_MAP_READ ? "writing the file" : "reading the file",
                         why && why[0] ? why : "no message from the backend");
    }
    return PL_OK;
}

/* "/model/h.3/qkv_w": the dataset of section s for tensor g. */
const char *const ckpt_sections[3] = {"model", "optim/m", "optim/v"};
void ckpt_dataset_path(int s, const ckpt_gtensor *g, char *buf, size_t len) {
    snprintf(buf, len, "/%s/%s", ckpt_sections[s], g->path);
}
