/*
 * safetensors.c — reading and laying out Hugging Face safetensors files (safetensors.h):
 * the header parsed with jansson and checked entry by entry, tensors read by element range
 * and converted from F32, BF16 or F16 to fp32.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util/common.h"
#include "util/files.h"
#include "formats/safetensors.h"

static const char *const dtype_names[] = {"F32", "BF16", "F16"};

size_t st_dtype_size(int dtype) { return dtype == ST_F32 ? 4 : 2; }
const char *st_dtype_name(int dtype) { return dtype >= 0 && dtype <= ST_F16 ? dtype_names[dtype] : "?"; }

/* One entry of the header ({"dtype", "shape", "data_offsets"}) into t; the message names it. */
static int parse_entry(const char *path, const char *name, json_t *v, size_t data_bytes, st_tensor *t, char *err,
                       size_t errlen) {
    if (strlen(name) >= ST_MAX_NAME) {
        snprintf(err, errlen, "safetensors file %s: a tensor name of %zu bytes (at most %d)", path, strlen(name),
                 ST_MAX_NAME - 1);
        return PL_EIO;
    }
    snprintf(t->name, sizeof t->name, "%s", name);
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"), *of = json_object_get(v, "data_offsets");
    if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(sh) || !json_is_array(of) || json_array_size(of) != 2) {
        snprintf(err, errlen, "safetensors file %s: tensor %s: an entry needs \"dtype\" (a string), \"shape\" (an "
                 "array) and \"data_offsets\" ([begin, end])", path, name);
        return PL_EIO;
    }
    t->dtype = -1;
    for (int i = 0; i <= ST_F16; i++)
        if (strcmp(json_string_value(dt), dtype_names[i]) == 0) t->dtype = i;
    if (t->dtype < 0) {
        snprintf(err, errlen, "safetensors file %s: tensor %s: dtype %.32s is not supported (F32, BF16 or F16)", path,
                 name, json_string_value(dt));
        return PL_EIO;
    }
    t->ndim = (int)json_array_size(sh);
    if (t->ndim > ST_MAX_DIMS) {
        snprintf(err, errlen, "safetensors file %s: tensor %s has %d dimensions (at most %d)", path, name, t->ndim,
                 ST_MAX_DIMS);
        return PL_EIO;
    }
    size_t numel = 1, lim = data_bytes + 1;
    for (int i = 0; i < t->ndim; i++) {
        json_t *d = json_array_get(sh, (size_t)i);
        long long x = json_is_integer(d) ? (long long)json_integer_value(d) : -1;
        if (x < 0 || (x > 0 && numel > lim / (size_t)x)) {
            snprintf(err, errlen, "safetensors file %s: tensor %s: dimension %d of its shape is not a count that fits "
                     "the file", path, name, i);
            return PL_EIO;
        }
        t->shape[i] = x;
        numel *= (size_t)x;
    }
    t->numel = numel;
    json_t *b = json_array_get(of, 0), *e = json_array_get(of, 1);
    long long lb = json_is_integer(b) ? (long long)json_integer_value(b) : -1;
    long long le = json_is_integer(e) ? (long long)json_integer_value(e) : -1;
    if (lb < 0 || le < lb || (unsigned long long)le > data_bytes) {
        snprintf(err, errlen, "safetensors file %s: tensor %s: data_offsets [%lld, %lld] out of bounds (the data holds "
                 "%zu bytes)", path, name, lb, le, data_bytes);
        return PL_EIO;
    }
    t->begin = (size_t)lb;
    t->end = (size_t)le;
    if (t->end - t->begin != numel * st_dtype_size(t->dtype)) {
        snprintf(err, errlen, "safetensors file %s: tensor %s: data_offsets [%zu, %zu] hold %zu bytes, but its shape "
                 "and dtype %s need %zu", path, name, t->begin, t->end, t->end - t->begin, dtype_names[t->dtype],
                 numel * st_dtype_size(t->dtype));
        return PL_EIO;
    }
    return PL_OK;
}

/* Order by begin (then end), for the overlap check. */
static int by_begin(const void *a, const void *b) {
    const st_tensor *x = *(st_tensor *const *)a, *y = *(st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* No two tensors' byte ranges overlap (empty tensors take no bytes). */
static int check_overlaps(const st_file *f, char *err, size_t errlen) {
    st_tensor **s = malloc((f->n ? (size_t)f->n : 1) * sizeof *s);
    if (!s) return PL_ENOMEM;
    for (int i = 0; i < f->n; i++) s[i] = &f->t[i];
    qsort(s, (size_t)f->n, sizeof *s, by_begin);
    int rc = PL_OK;
    const st_tensor *top = NULL; /* the non-empty tensor reaching furthest so far */
    for (int i = 0; i < f->n && rc == PL_OK; i++) {
        const st_tensor *b = s[i];
        if (b->end == b->begin) continue;
        if (top && b->begin < top->end) {
            snprintf(err, errlen, "safetensors file %s: tensors %s [%zu, %zu) and %s [%zu, %zu) overlap", f->path,
                     top->name, top->begin, top->end, b->name, b->begin, b->end);
            rc = PL_EIO;
        }
        if (!top || b->end > top->end) top = b;
    }
    free(s);
    return rc;
}

/* "__metadata__" must be an object of strings (the format's rule). */
static int check_metadata(const char *path, json_t *m, char *err, size_t errlen) {
    const char *k;
    json_t *v;
    if (!json_is_object(m)) goto bad;
    json_object_foreach(m, k, v) if (!json_is_string(v)) goto bad;
    return PL_OK;
bad:
    snprintf(err, errlen, "safetensors file %s: __metadata__ must be an object of strings", path);
    return PL_EIO;
}

/* Parse a header (len bytes of JSON, not NUL-terminated) for a file whose data holds
 * data_bytes: f->t, f->n filled (f->path names the file in messages). PL_EIO and a message
 * naming the entry on any malformed input. */
static int st_parse_header(const char *json, size_t len, size_t data_bytes, st_file *f, char *err, size_t errlen) {
    json_error_t je;
    f->n = 0;
    f->t = NULL;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root || !json_is_object(root)) {
        snprintf(err, errlen, "safetensors file %s: the header is not a JSON object (%s, at byte %d)", f->path,
                 root ? "another JSON value" : je.text, root ? 0 : je.position);
        json_decref(root);
        return PL_EIO;
    }
    f->t = calloc(json_object_size(root) + 1, sizeof *f->t);
    if (!f->t) {
        json_decref(root);
        return PL_ENOMEM;
    }
    const char *k;
    json_t *v;
    int rc = PL_OK;
    json_object_foreach(root, k, v) {
        if (strcmp(k, "__metadata__") == 0) rc = check_metadata(f->path, v, err, errlen);
        else if ((rc = parse_entry(f->path, k, v, data_bytes, &f->t[f->n], err, errlen)) == PL_OK) f->n++;
        if (rc != PL_OK) break;
    }
    json_decref(root);
    if (rc == PL_OK) rc = check_overlaps(f, err, errlen);
    if (rc != PL_OK) st_close(f);
    return rc;
}

int st_open(const char *path, st_file *f, char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    int fd;
    size_t size = 0;
    PL_TRY(pl_open_input_fd(path, "safetensors file", 0, &fd, &size, err, errlen));
    unsigned char h8[8];
    uint64_t n = 0;
    if (size < 8 || pread(fd, h8, 8, 0) != 8) {
        close(fd);
        snprintf(err, errlen, "safetensors file %s: shorter than its 8-byte header length", path);
        return PL_EIO;
    }
    for (int i = 7; i >= 0; i--) n = n << 8 | h8[i];
    if (n > size - 8 || n > ST_MAX_HEADER || n < 2) {
        close(fd);
        snprintf(err, errlen, "safetensors file %s: header length %llu %s (the file holds %zu bytes)", path,
                 (unsigned long long)n, n > ST_MAX_HEADER ? "is past the format's 100 MB limit" : n < 2 ?
                 "is too short for a JSON object" : "runs past the end of the file", size);
        return PL_EIO;
    }
    char *json = malloc((size_t)n);
    if (!json) {
        close(fd);
        return PL_ENOMEM;
    }
    ssize_t got = pread(fd, json, (size_t)n, 8);
    close(fd);
    int rc = PL_EIO;
    if (got != (ssize_t)n) snprintf(err, errlen, "safetensors file %s: short read of its header", path);
    else {
        f->data_start = 8 + (size_t)n;
        f->data_bytes = size - f->data_start;
        rc = st_parse_header(json, (size_t)n, f->data_bytes, f, err, errlen);
    }
    free(json);
    return rc;
}

void st_close(st_file *f) {
    free(f->t);
    f->t = NULL;
    f->n = 0;
}

const st_tensor *st_find(const st_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
    return NULL;
}

/* IEEE half -> float (subnormals, inf and NaN included). */
static float half_to_float(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023u, u;
    if (e == 0) {
        float f = ldexpf((float)m, -24);
        return s ? -f : f;
    }
    u = e == 31 ? s | 0x7f800000u | m << 13 : s | (e + 112) << 23 | m << 13;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int st_read(const st_file *f, const st_tensor *t, size_t first, size_t count, float *out, char *err, size_t errlen) {
    size_t esz = st_dtype_size(t->dtype);
    if (first + count > t->numel) {
        snprintf(err, errlen, "safetensors file %s: tensor %s: elements past its end requested", f->path, t->name);
        return PL_EINVAL;
    }
    int fd;
    PL_TRY(pl_open_input_fd(f->path, "safetensors file", 0, &fd, NULL, err, errlen));
    void *raw = esz == 4 ? (void *)out : malloc(count ? count * esz : 1);
    int rc = PL_OK;
    if (!raw) rc = PL_ENOMEM;
    else if (pread(fd, raw, count * esz, (off_t)(f->data_start + t->begin + first * esz)) != (ssize_t)(count * esz)) {
        snprintf(err, errlen, "safetensors file %s: short read of tensor %s", f->path, t->name);
        rc = PL_EIO;
    }
    close(fd);
    for (size_t k = 0; rc == PL_OK && esz == 2 && k < count; k++) {
        uint16_t b;
        memcpy(&b, (const char *)raw + 2 * k, 2);
        if (t->dtype == ST_F16) out[k] = half_to_float(b);
        else {
            uint32_t u = (uint32_t)b << 16;
            memcpy(&out[k], &u, 4);
        }
    }
    if (esz == 2) free(raw);
    for (size_t k = 0; rc == PL_OK && k < count; k++)
        if (!isfinite(out[k])) {
            snprintf(err, errlen, "safetensors file %s: tensor %s holds a non-finite value (%g) at element %zu: refusing "
                     "to start from it", f->path, t->name, (double)out[k], first + k);
            rc = PL_EIO;
        }
    return rc;
}

int st_make_header(st_tensor *t, int n, char **json, size_t *len) {
    *json = NULL;
    json_t *root = json_object();
    size_t off = 0;
    int ok = root != NULL;
    for (int i = 0; ok && i < n; i++) {
        json_t *sh = json_array(), *e = json_object();
        for (int d = 0; sh && d < t[i].ndim; d++) json_array_append_new(sh, json_integer(t[i].shape[d]));
        t[i].begin = off;
        t[i].end = off += t[i].numel * st_dtype_size(t[i].dtype);
        ok = sh && e && json_object_set_new(e, "dtype", json_string(dtype_names[t[i].dtype])) == 0 &&
             json_object_set_new(e, "shape", sh) == 0 &&
             json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)t[i].begin, (json_int_t)t[i].end)) == 0 &&
             json_object_set_new(root, t[i].name, e) == 0;
    }
    char *s = ok ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!s) return PL_ENOMEM;
    size_t l = strlen(s), padded = (l + 7) / 8 * 8;
    *json = malloc(padded);
    if (*json) {
        memcpy(*json, s, l);
        memset(*json + l, ' ', padded - l);
        *len = padded;
    }
    free(s);
    return *json ? PL_OK : PL_ENOMEM;
}
