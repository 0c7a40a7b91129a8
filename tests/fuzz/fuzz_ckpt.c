/*
 * fuzz_ckpt.c — the checkpoint metadata reader (ckpt_read_info / ckpt_read_meta, src/ckpt/ckpt_meta.c).
 *
 * Raw HDF5 bytes would mostly fuzz libhdf5's own file parser, which is not ours. Instead the
 * input is a recipe for the attributes of a checkpoint: starting from those of a valid one
 * (the tiny model after 100 steps), each attribute in schema order takes one control byte
 * (input past its end reads as 0 = keep) that keeps it, replaces its value (an edge value from
 * a table, or raw bytes), drops it, gives it the wrong class (a string for a number and the
 * other way round), another type (i64 as float64 or uint64, float64 as float32 or int,
 * a variable-length string), or makes it an array. Optional attributes (markov_branch,
 * meta_crc32c) are absent unless their byte asks for them, so the reader's range checks run
 * on every mutated value instead of stopping at a checksum mismatch. Each group takes one byte too (keep, drop,
 * or make it a dataset). The file is written with HDF5 to /dev/shm and read back with
 * ckpt_read_info, the function `--resume` and `pipelm inspect` use first.
 */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <hdf5.h>
#include "fuzz.h"
#include "ckpt/ckpt.h"
#include "model/stage.h"

typedef enum { A_I64, A_F64, A_STR } akind;
typedef struct {
    const char *group; /* NULL: root */
    const char *name;
    akind kind;
    long long i;
    double d;
    const char *s;
    int optional; /* absent from the valid file: control byte 0 leaves it out, 3 writes it */
} attr_def;

static const attr_def schema[] = {
    {NULL, "format", A_STR, 0, 0, "pipelm-checkpoint", 0},
    {NULL, "format_version", A_I64, 1, 0, NULL, 0},
    {NULL, "pipelm_version", A_STR, 0, 0, "0.1.0", 0},
    {NULL, "step", A_I64, 100, 0, NULL, 0},
    {NULL, "created", A_STR, 0, 0, "2024-01-01T00:00:00Z", 0},
    {"config", "vocab_size", A_I64, 256, 0, NULL, 0},
    {"config", "padded_vocab_size", A_I64, 256, 0, NULL, 0},
    {"config", "max_seq_len", A_I64, 64, 0, NULL, 0},
    {"config", "n_layer", A_I64, 4, 0, NULL, 0},
    {"config", "n_head", A_I64, 4, 0, NULL, 0},
    {"config", "n_embd", A_I64, 64, 0, NULL, 0},
    {"optim", "name", A_STR, 0, 0, "adamw", 0},
    {"optim", "beta1", A_F64, 0, 0.9, NULL, 0},
    {"optim", "beta2", A_F64, 0, 0.95, NULL, 0},
    {"optim", "eps", A_F64, 0, 1e-8, NULL, 0},
    {"optim", "weight_decay", A_F64, 0, 0.1, NULL, 0},
    {"optim", "lr", A_F64, 0, 3e-3, NULL, 0},
    {"optim", "step", A_I64, 100, 0, NULL, 0},
    {"train", "step", A_I64, 100, 0, NULL, 0},
    {"train", "tokens_seen", A_I64, 102400, 0, NULL, 0},
    {"train", "data_pos", A_I64, 100, 0, NULL, 0},
    {"train", "seed", A_I64, 1337, 0, NULL, 0},
    {"train", "data_seed", A_I64, 1, 0, NULL, 0},
    {"train", "data", A_STR, 0, 0, "markov", 0},
    {"train", "lr", A_F64, 0, 3e-3, NULL, 0},
    {"train", "min_lr", A_F64, 0, 3e-4, NULL, 0},
    {"train", "warmup_steps", A_I64, 20, 0, NULL, 0},
    {"train", "total_steps", A_I64, 400, 0, NULL, 0},
    {"train", "lr_schedule", A_STR, 0, 0, "cosine", 0},
    {"train", "grad_clip", A_F64, 0, 1.0, NULL, 0},
    {"train", "batch", A_I64, 16, 0, NULL, 0},
    {"train", "seq_len", A_I64, 64, 0, NULL, 0},
    {"train", "microbatches", A_I64, 8, 0, NULL, 0},
    {"train", "schedule", A_STR, 0, 0, "1f1b", 0},
    {"train", "nstages", A_I64, 4, 0, NULL, 0},
    {"train", "markov_branch", A_I64, 4, 0, NULL, 1},
    {NULL, "meta_crc32c", A_I64, 0x12345678, 0, NULL, 1},
};
#define NSCHEMA ((int)(sizeof schema / sizeof schema[0]))

static const long long edge_i[] = {0, 1, -1, 2, -5, 3, 7, 127, 128, 129, 255, 256, 1023, 1024, 1025,
                                   65535, 65536, INT_MAX, INT_MIN, (long long)INT_MAX + 1, 5000000000LL,
                                   1000000000000LL, LLONG_MAX, LLONG_MIN, LLONG_MAX - 1, -100};
static const double edge_d[] = {0.0, -0.0, 1.0, -1.0, 0.5, 0.999999, 1.0000001, 2.0, 1e-300, 1e300,
                                -1e300, DBL_MAX, DBL_MIN, 5e-324, 1e-8, 3e-3, 9.2233720368547758e18};

#define CK(x) do { if ((x) < 0) goto out; } while (0)

/* Write one attribute of class kind (value v or string s) with file type ft, n values. */
static void put_num(hid_t loc, const char *name, hid_t ft, hid_t mt, int n, const void *vals) {
    hsize_t dim = (hsize_t)n;
    hid_t sp = n > 0 ? H5Screate_simple(1, &dim, NULL) : H5Screate(H5S_SCALAR), a = -1;
    CK(sp);
    CK(a = H5Acreate2(loc, name, ft, sp, H5P_DEFAULT, H5P_DEFAULT));
    H5Awrite(a, mt, vals);
out:
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
}

static void put_str(hid_t loc, const char *name, const char *s, size_t len, int vlen, int nullpad) {
    hid_t t = H5Tcopy(H5T_C_S1), sp = -1, a = -1;
    CK(t);
    if (vlen) CK(H5Tset_size(t, H5T_VARIABLE));
    else {
        CK(H5Tset_size(t, len ? len + !nullpad : 1));
        CK(H5Tset_strpad(t, nullpad ? H5T_STR_NULLPAD : H5T_STR_NULLTERM));
    }
    CK(sp = H5Screate(H5S_SCALAR));
    CK(a = H5Acreate2(loc, name, t, sp, H5P_DEFAULT, H5P_DEFAULT));
    if (vlen) H5Awrite(a, t, &s);
    else {
        char *buf = calloc(len + 2, 1);
        memcpy(buf, s, len);
        H5Awrite(a, t, buf);
        free(buf);
    }
out:
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
}

/* A string from the input: a length byte, then that many bytes (may hold NULs). */
static size_t take_str(fuzz_in *in, char *buf, size_t cap) {
    size_t len = fuzz_u8(in) % cap;
    for (size_t i = 0; i < len; i++) buf[i] = (char)fuzz_u8(in);
    buf[len] = 0;
    return len;
}

static void put_attr(hid_t loc, const attr_def *d, fuzz_in *in) {
    uint8_t c = fuzz_u8(in);
    int mode = c & 7;
    long long i = d->i;
    double x = d->d;
    char sbuf[300];
    const char *s = d->s;
    size_t slen = s ? strlen(s) : 0;
    if (d->optional && mode == 0) return; /* absent by default */
    if (mode == 3) {
        if (!d->optional) return; /* dropped */
        mode = 0;                 /* an optional one written with its default */
    }
    if (mode == 1) {       /* an edge value */
        uint8_t k = fuzz_u8(in);
        i = edge_i[k % (sizeof edge_i / sizeof edge_i[0])];
        x = k & 0x80 ? (k & 1 ? NAN : (k & 2 ? -INFINITY : INFINITY)) : edge_d[k % (sizeof edge_d / sizeof edge_d[0])];
        if (k & 0x40) x = -x;
        if (d->kind == A_STR) { slen = take_str(in, sbuf, sizeof sbuf); s = sbuf; }
    } else if (mode == 2) { /* raw bits */
        uint64_t u = fuzz_u64(in);
        memcpy(&i, &u, 8);
        memcpy(&x, &u, 8);
        if (d->kind == A_STR) { slen = take_str(in, sbuf, sizeof sbuf); s = sbuf; }
    }
    switch (d->kind) {
    case A_I64:
        if (mode == 4) { slen = take_str(in, sbuf, sizeof sbuf); put_str(loc, d->name, sbuf, slen, c & 8, 0); }
        else if (mode == 5) { double v = (double)i + (c & 8 ? 0.5 : 0.0); put_num(loc, d->name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 0, &v); }
        else if (mode == 6) { long long v[4] = {i, i, i, i}; put_num(loc, d->name, H5T_STD_I64LE, H5T_NATIVE_LLONG, 1 + (c >> 3) % 4, v); }
        else if (mode == 7) { unsigned long long v = (unsigned long long)i | (c & 8 ? 1ULL << 63 : 0); put_num(loc, d->name, c & 16 ? H5T_STD_U64LE : H5T_STD_I8LE, H5T_NATIVE_ULLONG, 0, &v); }
        else put_num(loc, d->name, H5T_STD_I64LE, H5T_NATIVE_LLONG, 0, &i);
        break;
    case A_F64:
        if (mode == 4) { slen = take_str(in, sbuf, sizeof sbuf); put_str(loc, d->name, sbuf, slen, c & 8, 0); }
        else if (mode == 5) { long long v = (long long)fuzz_u64(in); put_num(loc, d->name, H5T_STD_I64LE, H5T_NATIVE_LLONG, 0, &v); }
        else if (mode == 6) { double v[4] = {x, x, x, x}; put_num(loc, d->name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 1 + (c >> 3) % 4, v); }
        else if (mode == 7) put_num(loc, d->name, H5T_IEEE_F32LE, H5T_NATIVE_DOUBLE, 0, &x);
        else put_num(loc, d->name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 0, &x);
        break;
    case A_STR:
        if (mode == 4) put_num(loc, d->name, H5T_STD_I64LE, H5T_NATIVE_LLONG, 0, &i);
        else if (mode == 5) put_str(loc, d->name, s, slen, 1, 0);
        else if (mode == 6) { long long v[2] = {1, 2}; put_num(loc, d->name, H5T_STD_I64LE, H5T_NATIVE_LLONG, 2, v); }
        else if (mode == 7) put_str(loc, d->name, s, slen, 0, 1);
        else put_str(loc, d->name, s, slen, 0, 0);
        break;
    }
}

/* The /train split: control byte 0 = [1,1,1,1]; 1 = drop; else n values from the input. */
static void put_split(hid_t g, fuzz_in *in) {
    uint8_t c = fuzz_u8(in);
    int split[CKPT_MAX_STAGES + 8] = {1, 1, 1, 1};
    int n = 4;
    if (c == 1) return;
    if (c > 1) {
        n = c & 1 ? c >> 1 : 1 + (int)(fuzz_u32(in) % (CKPT_MAX_STAGES + 4));
        for (int k = 0; k < n; k++) split[k] = (int)(k < 8 ? fuzz_u32(in) : (uint32_t)fuzz_u8(in));
    }
    put_num(g, "split", H5T_STD_I32LE, H5T_NATIVE_INT, n, split);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* our writes of odd attributes may fail: quietly */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_in in = {data, size};
    const char *path = fuzz_path("ckpt.h5");
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) abort();
    const char *groups[] = {"config", "optim", "train"};
    hid_t gid[3] = {-1, -1, -1};
    for (int k = 0; k < 3; k++) {
        uint8_t c = fuzz_u8(&in) % 8;
        if (c == 1) continue; /* no such group */
        if (c == 2) {         /* a dataset of that name instead */
            hsize_t one = 1;
            hid_t sp = H5Screate_simple(1, &one, NULL);
            hid_t ds = H5Dcreate2(f, groups[k], H5T_NATIVE_INT, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
            if (ds >= 0) gid[k] = ds; /* attributes go on the dataset */
            H5Sclose(sp);
            continue;
        }
        gid[k] = H5Gcreate2(f, groups[k], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    }
    for (int a = 0; a < NSCHEMA; a++) {
        const attr_def *d = &schema[a];
        hid_t loc = f;
        for (int k = 0; k < 3; k++)
            if (d->group && strcmp(d->group, groups[k]) == 0) loc = gid[k];
        if (loc < 0) { fuzz_u8(&in); continue; }
        put_attr(loc, d, &in);
    }
    if (gid[2] >= 0) put_split(gid[2], &in);
    for (int k = 0; k < 3; k++)
        if (gid[k] >= 0) H5Oclose(gid[k]);
    H5Fclose(f);

    model_config cfg;
    static ckpt_meta meta;
    char err[2048];
    int which = fuzz_u8(&in) % 3; /* both, config only, meta only */
    ckpt_read_info(path, which == 2 ? NULL : &cfg, which == 1 ? NULL : &meta, err, sizeof err);
    unlink(path);
    return 0;
}
