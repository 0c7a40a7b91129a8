/*
 * safetensors.h — Hugging Face's safetensors files: 8 bytes of little-endian header length N,
 * N bytes of a JSON object (parsed with jansson) naming each tensor's dtype, shape and
 * [begin, end) byte range in the data that follows, then the raw tensors. A file is opened by
 * its header alone, every entry checked (a header past the file, a dtype other than F32,
 * BF16 or F16, a range out of bounds, of the wrong size or overlapping another, a duplicate
 * name: each refused, named); tensors are read in element ranges and converted to fp32,
 * non-finite values refused by tensor and element. Writing takes the header's entries and
 * lays the data out in their order (F32 or BF16), the header padded with spaces to 8 bytes.
 */
#ifndef PIPELM_SAFETENSORS_H
#define PIPELM_SAFETENSORS_H

#include <stddef.h>

enum { ST_F32 = 0, ST_BF16 = 1, ST_F16 = 2 };
#define ST_MAX_NAME 256
#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u << 20) /* the format's own limit on the header: 100 MB */

typedef struct {
    char name[ST_MAX_NAME];
    int dtype;                   /* ST_* */
    int ndim;
    long long shape[ST_MAX_DIMS];
    size_t numel;
    size_t begin, end;           /* bytes, from the start of the data */
} st_tensor;

typedef struct {
    char path[4096];
    size_t data_start;           /* 8 + N */
    size_t data_bytes;           /* file size - data_start */
    int n;
    st_tensor *t;
} st_file;

/* Bytes of one element of a dtype. */
size_t st_dtype_size(int dtype);
/* "F32", "BF16", "F16". */
const char *st_dtype_name(int dtype);
/* Open a file: read and parse its header. */
int st_open(const char *path, st_file *f, char *err, size_t errlen);
void st_close(st_file *f);
/* The tensor of that name, or NULL. */
const st_tensor *st_find(const st_file *f, const char *name);
/* Elements [first, first + count) of a tensor (row-major), as fp32 into out; a non-finite
 * value is refused naming the tensor and the element. */
int st_read(const st_file *f, const st_tensor *t, size_t first, size_t count, float *out, char *err, size_t errlen);
/* The header of a new file holding these tensors in this order, data ranges assigned back to
 * back (each entry's name, dtype, ndim, shape; begin/end filled): the JSON, padded with
 * spaces to a multiple of 8 bytes, malloc'd into *json (length *len); NULL on failure. */
int st_make_header(st_tensor *t, int n, char **json, size_t *len);

#endif
