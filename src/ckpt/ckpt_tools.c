/*
 * ckpt_tools.c — `pipelm convert` (llm.c model file <-> checkpoint) and `pipelm inspect`.
 *
 * Both run in one process (rank 0 of MPI_COMM_WORLD; other ranks of a larger job do nothing).
 * convert builds one stage that holds the whole model on MPI_COMM_SELF and reuses the
 * library's own readers and writers, so a converted file is exactly what a run would save:
 * llm.c (fp32 v3 or bf16 v5) -> checkpoint with zero AdamW moments at step 0, and
 * checkpoint -> llm.c fp32 v3 (fp32 -> checkpoint -> fp32 is byte-identical).
 * inspect prints the metadata and reads every dataset back, verifying its checksum: the
 * CRC-32C of the bytes read against its crc32c attribute (or, for a dataset without one,
 * HDF5's Fletcher32 filter as it reads); it exits 0 only if every dataset has one and it holds.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "ckpt/ckpt_internal.h"
#include "util/args.h"
#include "util/common.h"
#include "cli/config.h"
#include "util/crc32c.h"
#include "util/files.h"
#include "formats/hf.h"
#include "formats/llmc.h"
#include "formats/safetensors.h"
#include "model/optim.h"
#include "model/stage.h"

/* What a file is, from its first bytes. */
enum { KIND_UNKNOWN, KIND_LLMC, KIND_HDF5, KIND_HF };

/* Sniff a file: an architecture's model-file magic (int32 20240326 GPT-2, 20240803 Llama 3,
 * 20261206 pipelm's Mixtral: the registry's) or the HDF5 signature. */
static int file_kind(const char *path, char *err, size_t errlen) {
    unsigned char b[8] = {0};
    FILE *f = NULL;
    if (pl_open_input(path, "input file", 0, &f, err, errlen) != PL_OK) return -1;
    size_t got = fread(b, 1, sizeof b, f);
    fclose(f);
    static const unsigned char h5sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    if (got == 8 && memcmp(b, h5sig, 8) == 0) return KIND_HDF5;
    int32_t magic = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
    for (int i = 0; got >= 4 && i < arch_count; i++)
        if (magic == arch_registry[i]->magic) return KIND_LLMC;
    return KIND_UNKNOWN;
}

/* The whole model on one CPU stage, with its optimizer (zero moments): what convert reads
 * into and writes from. On failure nothing is left allocated. */
static int tool_stage(const model_config *cfg, stage *st, optim *opt, char *err, size_t errlen) {
    pl_options o;
    config_defaults(&o);
    memset(opt, 0, sizeof *opt);
    PL_TRY(stage_init(st, cfg, 0, cfg->L, 1, 1, 1, 1, 1, &backend_cpu, err, errlen));
    int rc = optim_init(opt, st, &o.hp, err, errlen); /* the moments start at zero, pipelm's default settings */
    if (rc != PL_OK) stage_free(st);
    return rc;
}

/* llm.c model file or Hugging Face model -> checkpoint at step 0 with zero moments and the
 * default AdamW settings. */
static int llmc_to_ckpt(const char *in, int kind, const char *out, char *err, size_t errlen) {
    model_config cfg;
    int version = 3;
    if (kind == KIND_HF) PL_TRY(hf_read_config(in, &cfg, err, errlen));
    else PL_TRY(llmc_read_config(in, &cfg, &version, err, errlen));
    stage st;
    optim opt;
    PL_TRY(tool_stage(&cfg, &st, &opt, err, errlen));
    /* the moments stay zero */
    int rc = kind == KIND_HF ? hf_load_stage(in, &st, err, errlen) : llmc_load_stage(in, &st, err, errlen);
    if (rc == PL_OK) {
        pl_options o;
        config_defaults(&o);
        ckpt_meta m;
        memset(&m, 0, sizeof m);
        m.seed = o.seed;
        m.data_seed = o.data_seed;
        m.hp = o.hp;
        m.hp.total_steps = 0; /* a converted model belongs to no run */
        snprintf(m.data, sizeof m.data, "(converted from %.400s)", in);
        m.nstages = 1;
        m.split[0] = cfg.L;
        double bytes;
        rc = ckpt_save_file(out, &st, &opt, &m, MPI_COMM_SELF, &bytes, err, errlen);
        if (rc == PL_OK)
            printf("converted %s (%s %s %s, %zu parameters) -> checkpoint %s (step 0, zero moments)\n", in,
                   kind == KIND_HF ? "Hugging Face" : "llm.c", model_arch_name(cfg.arch),
                   kind == KIND_HF ? "model" : version == 3 ? "fp32" : "bf16", model_num_params(&cfg), out);
    }
    optim_free(&opt);
    stage_free(&st);
    return rc;
}

/* Checkpoint -> llm.c fp32 (version 3) model file; every checksum is verified on the way (the
 * moments too: they are read into an optimizer, then dropped). */
static int ckpt_to_llmc(const char *in, const char *out, char *err, size_t errlen) {
    model_config cfg;
    PL_TRY(ckpt_read_info(in, &cfg, NULL, err, errlen));
    stage st;
    optim opt;
    PL_TRY(tool_stage(&cfg, &st, &opt, err, errlen));
    ckpt_meta m;
    int rc = ckpt_load(in, &st, &opt, &m, MPI_COMM_SELF, NULL, err, errlen);
    if (rc == PL_OK) {
        rc = llmc_save(out, &st, 0, MPI_COMM_SELF); /* reports its own errors */
        if (rc != PL_OK) snprintf(err, errlen, "writing %s failed (message above)", out);
        else
            printf("converted checkpoint %s (step %lld, %zu parameters) -> llm.c fp32 model file %s\n", in, m.step,
                   model_num_params(&cfg), out);
    }
    optim_free(&opt);
    stage_free(&st);
    return rc;
}

/* The checkpoint settings of a tool: train's defaults, with their alias variables
 * (PIPELM_CKPT_XFER, ...), so that convert writes and reads as a run would. */
static int set_tool_opts(char *err, size_t errlen) {
    pl_options o;
    config_defaults(&o);
    PL_TRY(config_check_ckpt(&o, err, errlen));
    ckpt_opts co;
    ckpt_opts_of(&o, &co);
    ckpt_set_opts(&co);
    return PL_OK;
}

/* Any model input (llm.c file, checkpoint, Hugging Face model) -> Hugging Face files (F32 or
 * BF16, shards of at most shard bytes), through one CPU stage. */
static int any_to_hf(const char *in, int kind, const char *out, int dtype, size_t shard, char *err, size_t errlen) {
    model_config cfg;
    int version;
    if (kind == KIND_HF) PL_TRY(hf_read_config(in, &cfg, err, errlen));
    else if (kind == KIND_LLMC) PL_TRY(llmc_read_config(in, &cfg, &version, err, errlen));
    else PL_TRY(ckpt_read_info(in, &cfg, NULL, err, errlen));
    stage st;
    optim opt;
    PL_TRY(tool_stage(&cfg, &st, &opt, err, errlen));
    ckpt_meta m;
    int rc = kind == KIND_HF ? hf_load_stage(in, &st, err, errlen) : kind == KIND_LLMC ?
             llmc_load_stage(in, &st, err, errlen) : ckpt_load(in, &st, &opt, &m, MPI_COMM_SELF, NULL, err, errlen);
    if (rc == PL_OK) {
        rc = hf_save(out, &st, dtype, shard, MPI_COMM_SELF); /* reports its own errors */
        if (rc != PL_OK) snprintf(err, errlen, "writing %s failed (message above)", out);
        else
            printf("converted %s (%s, %zu parameters) -> Hugging Face %s %s\n", in, model_arch_name(cfg.arch),
                   model_num_params(&cfg), st_dtype_name(dtype), out);
    }
    optim_free(&opt);
    stage_free(&st);
    return rc;
}

/* convert's options before IN OUT: --to hf, --dtype f32|bf16, --shard-size BYTES; the index
 * of IN, or -1 (a message printed). */
static int convert_opts(int argc, char **argv, int first, int *to_hf, int *dtype, size_t *shard) {
    static const char *const names[] = {"to", "dtype", "shard-size"};
    char err[512];
    int i = first;
    if (args_check_names(argc, argv, first, names, 3, "convert", err, sizeof err) != PL_OK) {
        pl_error("%s", err);
        return -1;
    }
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        int k;
        const char *v;
        char *end = NULL;
        if (args_next(argc, argv, &i, names, 3, "convert", &k, &v, err, sizeof err) != PL_OK) {
            pl_error("%s", err);
            return -1;
        }
        if (k == 0 && strcmp(v, "hf") == 0) *to_hf = 1;
        else if (k == 1 && (strcmp(v, "f32") == 0 || strcmp(v, "bf16") == 0))
            *dtype = strcmp(v, "f32") == 0 ? ST_F32 : ST_BF16;
        else if (k == 2 && (*shard = strtoull(v, &end, 10), end && !*end && v[0] != '-'))
            continue;
        else {
            pl_error("convert: --%s %s is not a valid value (--to hf, --dtype f32|bf16, --shard-size BYTES)",
                     k >= 0 ? names[k] : "help", v ? v : "");
            return -1;
        }
    }
    return i;
}

/* `pipelm convert IN OUT`: the direction comes from IN's first bytes. Exit status 0/1/2. */
int ckpt_convert_main(int argc, char **argv, int first) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0) return 0;
    if (argc - first == 1 && (strcmp(argv[first], "--help") == 0 || strcmp(argv[first], "-h") == 0)) {
        printf("usage: pipelm convert [--to hf [--dtype f32|bf16] [--shard-size BYTES]] IN OUT\n"
               "  IN an llm.c model file (fp32 v3 or bf16 v5) -> OUT a checkpoint (.h5) at step 0, zero moments\n"
               "  IN a Hugging Face model (DIR or .safetensors) -> OUT a checkpoint (.h5) at step 0, zero moments\n"
               "  IN a checkpoint (.h5)                         -> OUT an llm.c fp32 (v3) model file\n"
               "  --to hf: IN any of these -> OUT a Hugging Face directory (config.json, model.safetensors or\n"
               "           shards of at most --shard-size bytes, default 5000000000, with an index) or, for a\n"
               "           name ending in .safetensors, that one file; --dtype f32 (default) or bf16\n");
        return 0;
    }
    int to_hf = 0, dtype = ST_F32;
    size_t shard = 5000000000ULL;
    first = convert_opts(argc, argv, first, &to_hf, &dtype, &shard);
    if (first < 0) return 2;
    if (argc - first != 2) {
        pl_error("convert: expected IN OUT (see pipelm convert --help)");
        return 2;
    }
    const char *in = argv[first], *out = argv[first + 1];
    char err[2048] = "";
    /* the output is checked before any work: never the input itself, never a device or FIFO */
    pl_io tin[] = {{"input", in}}, tout[] = {{"output", out}}; /* in a directory too (a Hugging Face model) */
    if (pl_check_io(tin, 1, tout, 1, err, sizeof err) != PL_OK) {
        pl_error("convert: %s", err);
        return 2;
    }
    if (!(to_hf && !hf_is_safetensors_name(out)) && pl_check_output_file(out, "output", err, sizeof err) != PL_OK) {
        pl_error("convert: %s", err);
        return 1;
    }
    if (set_tool_opts(err, sizeof err) != PL_OK) {
        pl_error("convert: %s", err);
        return 2;
    }
    int kind = hf_is_model(in) ? KIND_HF : file_kind(in, err, sizeof err), rc;
    if (kind < 0) rc = PL_EIO;
    else if (to_hf && kind != KIND_UNKNOWN) rc = any_to_hf(in, kind, out, dtype, shard, err, sizeof err);
    else if (kind == KIND_LLMC || kind == KIND_HF) rc = llmc_to_ckpt(in, kind, out, err, sizeof err);
    else if (kind == KIND_HDF5) rc = ckpt_to_llmc(in, out, err, sizeof err);
    else {
        snprintf(err, sizeof err, "%s is neither an llm.c model file (magic %d, or %d for Llama 3) nor an HDF5 "
                 "checkpoint", in, LLMC_MODEL_MAGIC, LLMC_LLAMA_MAGIC);
        rc = PL_EINVAL;
    }
    if (rc != PL_OK) pl_error("convert: %s", err[0] ? err : "failed");
    return rc == PL_OK ? 0 : 1;
}

/* ---- inspect ---------------------------------------------------------------------------- */

/* Print one attribute's value, whatever its type (strings, integers, floats; 1-D arrays). */
static herr_t print_attr(hid_t loc, const char *name, const H5A_info_t *info, void *data) {
    (void)info;
    h5ctx *cx = data;
    FILE *out = pl_out ? pl_out : stdout;
    int rc = PL_OK;
    hid_t a = -1, t = -1, sp = -1, mt = -1;
    void *buf = NULL;
    snprintf(cx->obj, sizeof cx->obj, "attribute %s", name);
    CKPT_H5(a = H5Aopen(loc, name, H5P_DEFAULT));
    CKPT_H5(t = H5Aget_type(a));
    CKPT_H5(sp = H5Aget_space(a));
    hssize_t n;
    CKPT_H5(n = H5Sget_simple_extent_npoints(sp));
    H5T_class_t cls;
    CKPT_H5(cls = H5Tget_class(t));
    fprintf(out, "  %-18s ", name);
    if (cls == H5T_STRING && n != 1) { /* one buffer is read below: never more than one string */
        fprintf(out, "(%lld strings: pipelm writes one)", (long long)n);
    } else if (cls == H5T_STRING) {
        htri_t vl;
        CKPT_H5(vl = H5Tis_variable_str(t));
        CKPT_H5(mt = H5Tcopy(H5T_C_S1));
        if (vl) {
            char *s = NULL;
            CKPT_H5(H5Tset_size(mt, H5T_VARIABLE));
            CKPT_H5(H5Aread(a, mt, &s));
            fprintf(out, "\"%s\"", s ? s : "");
            free(s);
        } else {
            size_t sz = H5Tget_size(t); /* 0 on failure */
            if (sz == 0) {
                rc = ckpt_h5_fail(cx, __FILE__, __LINE__, "H5Tget_size(t)");
                goto done;
            }
            buf = calloc(sz + 1, 1);
            if (!buf) { fprintf(out, "(out of memory)"); goto done; }
            CKPT_H5(H5Tset_size(mt, sz));
            CKPT_H5(H5Aread(a, mt, buf));
            fprintf(out, "\"%s\"", (char *)buf);
        }
    } else if ((cls == H5T_INTEGER || cls == H5T_FLOAT) && n >= 1) {
        buf = calloc((size_t)n, 8);
        if (!buf) { fprintf(out, "(out of memory)"); goto done; }
        CKPT_H5(H5Aread(a, cls == H5T_INTEGER ? H5T_NATIVE_LLONG : H5T_NATIVE_DOUBLE, buf));
        if (n > 1) fputc('[', out);
        for (hssize_t i = 0; i < n && i < 64; i++) {
            if (cls == H5T_INTEGER) fprintf(out, "%s%lld", i ? ", " : "", ((long long *)buf)[i]);
            else fprintf(out, "%s%.9g", i ? ", " : "", ((double *)buf)[i]);
        }
        if (n > 64) fprintf(out, ", ... (%lld values)", (long long)n);
        if (n > 1) fputc(']', out);
    } else {
        fprintf(out, "(HDF5 type class %d, %lld values)", (int)cls, (long long)n);
    }
done:
    fputc('\n', out);
    free(buf);
    if (mt >= 0) H5Tclose(mt);
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    if (rc != PL_OK) fprintf(out, "  (%s)\n", cx->err);
    cx->obj[0] = 0;
    return 0; /* keep going: one bad attribute should not hide the rest */
}

/* Print the attributes of one group, if it exists. */
static void print_group_attrs(hid_t f, const char *group, h5ctx *cx) {
    FILE *out = pl_out ? pl_out : stdout;
    int rc = PL_OK;
    hid_t g = -1;
    htri_t there = 1;
    if (strcmp(group, "/") != 0) CKPT_H5(there = H5Lexists(f, group, H5P_DEFAULT));
    if (!there) goto done;
    CKPT_H5(g = H5Gopen2(f, group, H5P_DEFAULT));
    fprintf(out, "%s\n", group);
    hsize_t idx = 0;
    CKPT_H5(H5Aiterate2(g, H5_INDEX_NAME, H5_ITER_INC, &idx, print_attr, cx));
done:
    if (g >= 0) H5Gclose(g);
    if (rc != PL_OK) fprintf(out, "  (%s)\n", cx->err);
}

/* Dataset names found by the walk. */
typedef struct {
    char **names;
    size_t n, cap;
    int oom;
    h5ctx *cx;
} name_list;

/* H5Lvisit callback: collect every dataset ("/model/h.0/ln1_w"); a failure stops the walk. */
static herr_t collect_dataset(hid_t g, const char *name, const H5L_info_t *info, void *data) {
    name_list *L = data;
    h5ctx *cx = L->cx;
    int rc = PL_OK;
    hid_t o = -1;
    H5I_type_t type;
    if (info->type != H5L_TYPE_HARD) return 0;
    snprintf(cx->obj, sizeof cx->obj, "object /%s", name);
    CKPT_H5(o = H5Oopen(g, name, H5P_DEFAULT));
    CKPT_H5(type = H5Iget_type(o));
    if (type == H5I_DATASET) {
        if (L->n == L->cap) {
            size_t cap = L->cap ? 2 * L->cap : 256;
            char **t = realloc(L->names, cap * sizeof *t);
            if (!t) { L->oom = 1; rc = PL_ENOMEM; goto done; }
            L->names = t;
            L->cap = cap;
        }
        size_t len = strlen(name) + 2;
        char *s = malloc(len);
        if (!s) { L->oom = 1; rc = PL_ENOMEM; goto done; }
        snprintf(s, len, "/%s", name);
        L->names[L->n++] = s;
    }
    CKPT_H5(H5Oclose(o));
    o = -1;
    cx->obj[0] = 0;
done:
    if (o >= 0) H5Oclose(o);
    return rc == PL_OK ? 0 : -1;
}

/* Natural order: digit runs compare as numbers, so h.2 comes before h.10. */
static int natural_cmp_str(const char *a, const char *b) {
    while (*a && *b) {
        if (*a >= '0' && *a <= '9' && *b >= '0' && *b <= '9') {
            char *ea, *eb;
            unsigned long long x = strtoull(a, &ea, 10), y = strtoull(b, &eb, 10);
            if (x != y) return x < y ? -1 : 1;
            a = ea;
            b = eb;
        } else {
            if (*a != *b) return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
            a++;
            b++;
        }
    }
    return (unsigned char)*a - (unsigned char)*b;
}

/* Schema position of each dataset name (-1: not in the schema), for the sort. */
static const char **g_order;
static int g_norder;

static int schema_pos(const char *name) {
    for (int i = 0; i < g_norder; i++)
        if (strcmp(g_order[i], name) == 0) return i;
    return -1;
}

/* Schema order first (model, m, v; by layer), then anything else in natural order. */
static int dataset_cmp(const void *pa, const void *pb) {
    const char *a = *(char *const *)pa, *b = *(char *const *)pb;
    int x = schema_pos(a), y = schema_pos(b);
    if (x >= 0 && y >= 0) return x - y;
    if (x >= 0 || y >= 0) return x >= 0 ? -1 : 1;
    return natural_cmp_str(a, b);
}

/* "147.4 MiB" */
static void human(double b, char *buf, size_t len) {
    if (b < 1024) snprintf(buf, len, "%.0f B", b);
    else if (b < 1048576.0) snprintf(buf, len, "%.1f KiB", b / 1024);
    else if (b < 1073741824.0) snprintf(buf, len, "%.1f MiB", b / 1048576.0);
    else snprintf(buf, len, "%.2f GiB", b / 1073741824.0);
}

/* One row of the dataset table: read it back and verify its checksum (the CRC-32C of the
 * file's bytes against its crc32c attribute, or HDF5's Fletcher32 filter as it reads).
 * Returns 0 if the dataset has a checksum and it holds. */
static int inspect_dataset(hid_t f, const char *name, int width, double *bytes, h5ctx *cx) {
    FILE *out = pl_out ? pl_out : stdout;
    int rc = PL_OK, has_crc = 0, fletcher = 0;
    uint32_t stored = 0;
    hid_t ds = -1, sp = -1, ft = -1;
    void *buf = NULL;
    char shape[96] = "?", size[32] = "?";
    snprintf(cx->obj, sizeof cx->obj, "dataset %s", name);
    CKPT_H5(ds = H5Dopen2(f, name, H5P_DEFAULT));
    CKPT_H5(sp = H5Dget_space(ds));
    int nd;
    hsize_t dims[8];
    CKPT_H5(nd = H5Sget_simple_extent_ndims(sp));
    if (nd > 8) nd = 8;
    CKPT_H5(H5Sget_simple_extent_dims(sp, dims, NULL));
    int off = snprintf(shape, sizeof shape, "(");
    for (int i = 0; i < nd && off < (int)sizeof shape - 24; i++)
        off += snprintf(shape + off, sizeof shape - off, "%s%llu", i ? ", " : "", (unsigned long long)dims[i]);
    snprintf(shape + off, sizeof shape - off, ")");
    hssize_t n;
    CKPT_H5(n = H5Sget_simple_extent_npoints(sp));
    CKPT_H5(ft = H5Dget_type(ds));
    size_t fsz = H5Tget_size(ft); /* 0 on failure */
    if (fsz == 0) {
        rc = ckpt_h5_fail(cx, __FILE__, __LINE__, "H5Tget_size(ft)");
        goto done;
    }
    *bytes = (double)n * (double)fsz;
    human(*bytes, size, sizeof size);
    if ((rc = ckpt_dataset_checksum(ds, name, &has_crc, &stored, &fletcher, cx)) != PL_OK) goto done;
    buf = malloc((size_t)(n > 0 ? n : 1) * fsz);
    if (!buf) {
        snprintf(cx->err, cx->errlen, "out of memory reading %s", name);
        rc = PL_ENOMEM;
        goto done;
    }
    /* in the file's own type: the bytes as stored (little-endian fp32), which the CRC covers */
    CKPT_H5(H5Dread(ds, ft, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf));
    if (has_crc) {
        uint32_t computed = crc32c(buf, (size_t)n * fsz);
        if (computed != stored) {
            snprintf(cx->err, cx->errlen, "checkpoint %s: rank %d: dataset %s: CRC-32C mismatch (stored 0x%08x, "
                     "computed 0x%08x)", cx->file, cx->rank, name, (unsigned)stored, (unsigned)computed);
            rc = PL_EIO;
        }
    }
done:
    free(buf);
    if (ft >= 0) H5Tclose(ft);
    if (sp >= 0) H5Sclose(sp);
    if (ds >= 0) H5Dclose(ds);
    int has_sum = has_crc || fletcher;
    const char *verdict = rc != PL_OK ? "FAILED" : has_sum ? "OK" : "NONE";
    fprintf(out, "  %-*s  %-14s %11s  %s\n", width, name, shape, size, verdict);
    if (rc != PL_OK) fprintf(out, "      %s\n", cx->err);
    cx->obj[0] = 0;
    return rc != PL_OK || !has_sum;
}

/* The names of every dataset a checkpoint of model cfg must hold ("/model/...", then
 * "/optim/m/...", "/optim/v/..."), in schema order: the rows of the table that must be
 * there, and the sort order of the rest. Out of memory, *nexp stays 0: nothing expected. */
static void schema_datasets(const model_config *cfg, char (**expect)[64], const char ***order, int *nexp) {
    int n = model_num_tensors(cfg);
    ckpt_gtensor *gt = calloc((size_t)n, sizeof *gt);
    *expect = calloc(3 * (size_t)n, sizeof **expect);
    *order = calloc(3 * (size_t)n, sizeof **order);
    if (gt && *expect && *order) {
        n = ckpt_global_tensors(cfg, gt);
        static const char *const sec[3] = {"model", "optim/m", "optim/v"};
        for (int s = 0; s < 3; s++)
            for (int i = 0; i < n; i++) {
                snprintf((*expect)[*nexp], sizeof (*expect)[*nexp], "/%s/%s", sec[s], gt[i].path);
                (*order)[*nexp] = (*expect)[*nexp];
                (*nexp)++;
            }
    }
    free(gt);
}

/* Read and check the metadata as a load would (into its own context cq, whose message lands
 * in e2: a failure is reported in the output, not fatal) and print its verdict. If it
 * holds, the schema's datasets of its model go to *expect / *order. Returns whether it holds. */
static int inspect_meta(hid_t f, const char *path, char *e2, size_t e2len, char (**expect)[64], const char ***order,
                        int *nexp) {
    FILE *out = pl_out ? pl_out : stdout;
    model_config cfg;
    ckpt_meta meta;
    h5ctx cq = {path, "", e2, e2len, 0};
    int meta_ok = ckpt_read_meta(f, &cfg, &meta, &cq) == PL_OK;
    if (meta_ok)
        fprintf(out, "metadata: every attribute in range; %s\n", meta.meta_verified ? "meta_crc32c OK"
                : "no meta_crc32c (an older checkpoint): not verified");
    else
        fprintf(out, "metadata: FAILED: %s\n", e2);
    if (meta_ok) schema_datasets(&cfg, expect, order, nexp);
    return meta_ok;
}

/* The dataset table: a header, one row per dataset of the (sorted) list L, each read back
 * and verified, then a MISSING row for each schema dataset (g_order) not in the file.
 * Returns the number of bad rows, missing ones included; *missing counts those alone,
 * *first_bad names the first bad row, *total adds up the bytes of tensor data. */
static int inspect_table(hid_t f, const name_list *L, int *missing, const char **first_bad, double *total,
                         h5ctx *cx) {
    FILE *out = pl_out ? pl_out : stdout;
    int bad = 0;
    int width = 7;
    for (size_t i = 0; i < L->n; i++) width = (int)strlen(L->names[i]) > width ? (int)strlen(L->names[i]) : width;
    fprintf(out, "datasets\n  %-*s  %-14s %11s  %s\n", width, "name", "shape", "size", "checksum");
    double b;
    for (size_t i = 0; i < L->n; i++) {
        b = 0.0;
        if (inspect_dataset(f, L->names[i], width, &b, cx)) {
            bad++;
            if (!*first_bad) *first_bad = L->names[i];
        }
        *total += b;
    }
    for (int i = 0; i < g_norder; i++) {
        int found = 0;
        for (size_t k = 0; k < L->n && !found; k++) found = strcmp(L->names[k], g_order[i]) == 0;
        if (!found) {
            fprintf(out, "  %-*s  %-14s %11s  %s\n", width, g_order[i], "-", "-", "MISSING");
            if (!*first_bad) *first_bad = g_order[i];
            (*missing)++;
        }
    }
    return bad + *missing;
}

/* The closing lines: the checksum verdict over the table (bad rows, missing among them), an
 * incomplete listing, and the metadata's failure (e2) again. Returns bad plus each further
 * failure it reports. */
static int inspect_verdict(const name_list *L, int bad, int missing, const char *first_bad, double total,
                           int meta_ok, const char *e2) {
    FILE *out = pl_out ? pl_out : stdout;
    char tot[32];
    human(total, tot, sizeof tot);
    if (L->oom) {
        fprintf(out, "out of memory listing the datasets: the table is incomplete\n");
        bad++;
    }
    if (L->n == 0) {
        fprintf(out, "no datasets: not a pipelm checkpoint\n");
        bad++;
    } else if (bad == 0) {
        fprintf(out, "all %zu checksums OK (%s of tensor data)\n", L->n, tot);
    } else if (bad > 0) {
        fprintf(out, "CHECKSUM FAILED or missing for %d of %zu datasets (first: %s)\n", bad,
                L->n + (size_t)missing, first_bad ? first_bad : "?");
    }
    if (!meta_ok) {
        fprintf(out, "METADATA FAILED: %s\n", e2);
        bad++;
    }
    return bad;
}

/* The arguments of `pipelm inspect`: --help (or -h) prints the usage; anything but one
 * argument is a usage error. Returns the exit code for those (0, 2), or -1 to go on and
 * inspect the one file argv[first]. */
static int inspect_args(int argc, char **argv, int first) {
    FILE *out = pl_out ? pl_out : stdout;
    if (argc - first == 1 && (strcmp(argv[first], "--help") == 0 || strcmp(argv[first], "-h") == 0)) {
        fprintf(out, "usage: pipelm inspect FILE\n"
                     "  prints a checkpoint's metadata and every dataset (shape, size), reading each back so\n"
                     "  that its checksum (CRC-32C, or Fletcher32) is verified; exits 0 if every dataset has\n"
                     "  a checksum and it holds, 1 otherwise\n");
        return 0;
    }
    if (argc - first != 1) {
        pl_error("inspect: expected one checkpoint file (see pipelm inspect --help)");
        return 2;
    }
    return -1;
}

/* `pipelm inspect FILE`: metadata, a table of every dataset read back, and a verdict. */
int ckpt_inspect_main(int argc, char **argv, int first) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0) return 0;
    FILE *out = pl_out ? pl_out : stdout;
    int ac = inspect_args(argc, argv, first);
    if (ac >= 0) return ac;
    const char *path = argv[first];
    ckpt_h5_quiet();
    char err[2048] = "";
    h5ctx cxs = {path, "", err, sizeof err, 0}, *cx = &cxs;
    struct stat sb;
    if (pl_check_input_file(path, "checkpoint", err, sizeof err) != PL_OK || stat(path, &sb) != 0) {
        pl_error("inspect: %s", err[0] ? err : "cannot open it");
        return 1;
    }
    hid_t f = -1;
    if (ckpt_h5_open(path, 0, MPI_COMM_NULL, &f, cx) != PL_OK) {
        pl_error("inspect: %s", err);
        return 1;
    }
    fprintf(out, "checkpoint %s (%lld bytes)\n", path, (long long)sb.st_size);
    print_group_attrs(f, "/", cx);
    print_group_attrs(f, "/config", cx);
    print_group_attrs(f, "/optim", cx);
    print_group_attrs(f, "/train", cx);

    name_list L = {NULL, 0, 0, 0, cx};
    int rc = PL_OK, bad = 0, missing = 0;
    char (*expect)[64] = NULL;
    const char **order = NULL;
    int nexp = 0;
    CKPT_H5(H5Lvisit(f, H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &L));
    /* a pipelm checkpoint lists in schema order and every schema dataset must be there */
    char e2[1024];
    int meta_ok = inspect_meta(f, path, e2, sizeof e2, &expect, &order, &nexp);
    g_order = order;
    g_norder = order ? nexp : 0;
    qsort(L.names, L.n, sizeof *L.names, dataset_cmp);
    double total = 0.0;
    const char *first_bad = NULL;
    bad = inspect_table(f, &L, &missing, &first_bad, &total, cx);
    bad = inspect_verdict(&L, bad, missing, first_bad, total, meta_ok, e2);
done:
    if (rc != PL_OK) {
        pl_error("inspect: %s", err);
        bad++;
    }
    for (size_t i = 0; i < L.n; i++) free(L.names[i]);
    free(L.names);
    free(expect);
    free(order);
    g_order = NULL;
    g_norder = 0;
    ckpt_h5_close_file(&f, cx);
    return bad ? 1 : 0;
}
