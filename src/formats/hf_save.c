/*
 * hf_save.c — Hugging Face models out (hf.h hf_save): the whole model's tensor list from the
 * architecture's hf_name column (every rank computes the same), laid out into one file or
 * shards, headers written by rank 0, each rank's own tensors written at their offsets
 * (transposed and permuted back as the files hold them, F32 or BF16), then config.json and
 * the index, every file renamed into place only when all ranks succeeded.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "model/arch.h"
#include "util/common.h"
#include "util/files.h"
#include "formats/hf.h"
#include "formats/hf_internal.h"

#define HF_MAX_OUT 100000

/* The output: every tensor (with its shard), the shards' header lengths, the names. */
typedef struct {
    st_tensor *t;
    int *shard;
    int n, nshards;
    size_t *hdr_len;
    char **hdr;
    int dir;                 /* 1: a directory (config.json, index when sharded) */
    char path[4096];
} hf_out;

int hf_is_safetensors_name(const char *path) {
    size_t n = strlen(path);
    return n > 12 && strcmp(path + n - 12, ".safetensors") == 0;
}

/* The list of every tensor the files hold, in table order: the tensors of a one-stage
 * layout, each part of each. */
static int out_list(const model_config *c, int dtype, hf_out *o) {
    int nt = model_max_tensors(c, c->L);
    param_tensor *pt = calloc((size_t)nt, sizeof *pt);
    o->t = calloc((size_t)nt * HF_MAX_PARTS, sizeof *o->t);
    o->shard = calloc((size_t)nt * HF_MAX_PARTS, sizeof *o->shard);
    if (!pt || !o->t || !o->shard) {
        free(pt);
        return PL_ENOMEM;
    }
    size_t total;
    nt = model_layout(c, 0, c->L, 1, 1, pt, &total);
    for (int i = 0; i < nt; i++) {
        const char *spec = hf_tensor_spec(c, &pt[i]);
        hf_part hp[HF_MAX_PARTS];
        int np = spec ? hf_split_parts(spec, pt[i].layer, c->moe.n_experts, hp) : 0;
        for (int k = 0; k < np; k++) {
            st_tensor *t = &o->t[o->n++];
            size_t rows = hf_part_rows(c, &pt[i], k, np), cols = pt[i].ndim == 2 ? (size_t)pt[i].shape[1] : 1;
            snprintf(t->name, sizeof t->name, "%.255s", hp[k].name);
            t->dtype = dtype;
            t->ndim = pt[i].ndim;
            t->shape[0] = (long long)(hp[k].transposed ? cols : rows);
            if (t->ndim == 2) t->shape[1] = (long long)(hp[k].transposed ? rows : cols);
            t->numel = rows * cols;
        }
    }
    free(pt);
    return PL_OK;
}

/* Shards of at most shard_bytes (a tensor larger than that alone in its shard), and each
 * shard's header. */
static int out_layout(hf_out *o, size_t shard_bytes) {
    size_t cur = 0;
    o->nshards = 1;
    for (int i = 0; i < o->n; i++) {
        size_t b = o->t[i].numel * st_dtype_size(o->t[i].dtype);
        if (shard_bytes && cur > 0 && cur + b > shard_bytes) {
            o->nshards++;
            cur = 0;
        }
        cur += b;
        o->shard[i] = o->nshards - 1;
    }
    o->hdr = calloc((size_t)o->nshards, sizeof *o->hdr);
    o->hdr_len = calloc((size_t)o->nshards, sizeof *o->hdr_len);
    if (!o->hdr || !o->hdr_len) return PL_ENOMEM;
    for (int s = 0, first = 0; s < o->nshards; s++) {
        int last = first;
        while (last < o->n && o->shard[last] == s) last++;
        PL_TRY(st_make_header(o->t + first, last - first, &o->hdr[s], &o->hdr_len[s]));
        first = last;
    }
    return PL_OK;
}

static void out_free(hf_out *o) {
    for (int s = 0; o->hdr && s < o->nshards; s++) free(o->hdr[s]);
    free(o->hdr);
    free(o->hdr_len);
    free(o->t);
    free(o->shard);
}

/* The final and the temporary name of shard s. */
static void shard_name(const hf_out *o, int s, int tmp, long id, char *buf, size_t len) {
    char fin[4200];
    if (!o->dir) snprintf(fin, sizeof fin, "%s", o->path);
    else if (o->nshards == 1) snprintf(fin, sizeof fin, "%s/model.safetensors", o->path);
    else snprintf(fin, sizeof fin, "%s/model-%05d-of-%05d.safetensors", o->path, s + 1, o->nshards);
    if (tmp) pl_output_tmp_name(fin, id, buf, len);
    else snprintf(buf, len, "%s", fin);
}

/* Rank 0: each shard created under its temporary name, its header written, its size set. */
static int create_shards(const hf_out *o, long id, char *err, size_t errlen) {
    for (int s = 0; s < o->nshards; s++) {
        char tmp[4400];
        shard_name(o, s, 1, id, tmp, sizeof tmp);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_EXCL | O_CLOEXEC, 0644);
        size_t data = 0;
        for (int i = 0; i < o->n; i++)
            if (o->shard[i] == s && o->t[i].end > data) data = o->t[i].end;
        unsigned char h8[8];
        for (int b = 0; b < 8; b++) h8[b] = (unsigned char)(o->hdr_len[s] >> (8 * b));
        if (fd < 0 || pwrite(fd, h8, 8, 0) != 8 ||
            pwrite(fd, o->hdr[s], o->hdr_len[s], 8) != (ssize_t)o->hdr_len[s] ||
            ftruncate(fd, (off_t)(8 + o->hdr_len[s] + data)) != 0 || close(fd) != 0) {
            snprintf(err, errlen, "%.600s: %s", tmp, strerror(errno));
            return PL_EIO;
        }
    }
    return PL_OK;
}

/* fp32 -> bf16, round to nearest even (NaN kept a NaN). */
static uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* One part of a stage tensor (rows [r0, r0 + rows) of host) into the file's orientation
 * and dtype, written at the tensor's offset in its shard. */
static int write_part(const hf_out *o, long id, const st_tensor *ft, int shard, const hf_part *p, const float *src,
                      size_t rows, size_t cols, int hs, char *err, size_t errlen) {
    size_t esz = st_dtype_size(ft->dtype), n = rows * cols;
    unsigned char *buf = malloc(n ? n * esz : 1);
    if (!buf) return PL_ENOMEM;
    for (size_t r = 0; r < rows; r++)
        for (size_t k = 0; k < cols; k++) {
            size_t fr = hf_file_row(p, r, hs), at = p->transposed ? k * rows + fr : fr * cols + k;
            float v = src[r * cols + k];
            if (esz == 4) memcpy(buf + 4 * at, &v, 4);
            else {
                uint16_t b = float_to_bf16(v);
                memcpy(buf + 2 * at, &b, 2);
            }
        }
    char tmp[4400];
    shard_name(o, shard, 1, id, tmp, sizeof tmp);
    int fd = open(tmp, O_WRONLY | O_CLOEXEC), rc = PL_OK;
    if (fd < 0 || pwrite(fd, buf, n * esz, (off_t)(8 + o->hdr_len[shard] + ft->begin)) != (ssize_t)(n * esz) ||
        fsync(fd) != 0) {
        snprintf(err, errlen, "writing %.255s into %.400s: %s", ft->name, tmp, strerror(errno));
        rc = PL_EIO;
    }
    if (fd >= 0) close(fd);
    free(buf);
    return rc;
}

/* Every tensor this stage writes (not a tied copy: its owner writes it), part by part. */
static int write_stage(const hf_out *o, long id, stage *st, char *err, size_t errlen) {
    const model_config *c = &st->cfg;
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        const char *spec = hf_tensor_spec(c, t);
        if (t->tied_copy || !spec) continue;
        void *host = NULL;
        float *p = st->params + t->offset;
        if (st->be->map(&host, p, t->numel * sizeof(float), PL_MAP_READ) != PL_OK || !host) {
            snprintf(err, errlen, "backend %s: mapping tensor %s for writing failed", st->be->name, t->name);
            return PL_EBACKEND;
        }
        hf_part hp[HF_MAX_PARTS];
        int np = hf_split_parts(spec, t->layer, c->moe.n_experts, hp), rc = PL_OK;
        size_t r0 = 0, cols = t->ndim == 2 ? (size_t)t->shape[1] : 1;
        for (int k = 0; k < np && rc == PL_OK; k++) {
            size_t rows = hf_part_rows(c, t, k, np);
            int j = 0;
            while (j < o->n && strcmp(o->t[j].name, hp[k].name) != 0) j++;
            rc = write_part(o, id, &o->t[j], o->shard[j], &hp[k], (const float *)host + r0 * cols, rows, cols,
                            c->C / c->NH, err, errlen);
            r0 += rows;
        }
        int urc = st->be->unmap(host, p, t->numel * sizeof(float), PL_MAP_READ);
        PL_TRY(rc);
        if (urc != PL_OK) {
            snprintf(err, errlen, "backend %s: unmapping tensor %s failed", st->be->name, t->name);
            return PL_EBACKEND;
        }
    }
    return PL_OK;
}

/* A JSON file written beside path and renamed over it (pl_output_replace: a FIFO, device or
 * link named config.json is never opened or replaced). */
static int dump_json(const json_t *j, const char *path, size_t flags, long id, char *err, size_t errlen) {
    char tmp[4600];
    pl_output_tmp_name(path, id, tmp, sizeof tmp);
    if (json_dump_file(j, tmp, flags) != 0) {
        unlink(tmp);
        snprintf(err, errlen, "writing %.600s failed", tmp);
        return PL_EIO;
    }
    return pl_output_replace(tmp, path, "Hugging Face file", err, errlen);
}

/* Rank 0, after every rank wrote: the shards renamed into place, config.json and the index. */
static int publish(const hf_out *o, const model_config *c, long id, char *err, size_t errlen) {
    for (int s = 0; s < o->nshards; s++) {
        char tmp[4400], fin[4400];
        shard_name(o, s, 1, id, tmp, sizeof tmp);
        shard_name(o, s, 0, id, fin, sizeof fin);
        PL_TRY(pl_output_replace(tmp, fin, "safetensors file", err, errlen));
    }
    if (!o->dir) return PL_OK;
    char p[4400];
    json_t *cfg = json_object(), *arch = json_array();
    const model_arch *A = arch_of(c);
    A->hf_config_write(c, cfg); /* "architectures" as one string: the list transformers reads */
    json_array_append_new(arch, json_string(hf_json_str(cfg, "architectures")));
    json_object_set_new(cfg, "architectures", arch);
    json_object_set_new(cfg, "model_type", json_string(A->hf_model_type));
    json_object_set_new(cfg, "torch_dtype", json_string(o->t[0].dtype == ST_F32 ? "float32" : "bfloat16"));
    snprintf(p, sizeof p, "%s/config.json", o->path);
    int rc = dump_json(cfg, p, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9), id, err, errlen);
    json_decref(cfg);
    if (rc == PL_OK && o->nshards > 1) {
        json_t *ix = json_object(), *wm = json_object(), *md = json_object();
        size_t total = 0;
        for (int i = 0; i < o->n; i++) {
            char fin[4400];
            shard_name(o, o->shard[i], 0, id, fin, sizeof fin);
            json_object_set_new(wm, o->t[i].name, json_string(strrchr(fin, '/') + 1));
            total += o->t[i].numel * st_dtype_size(o->t[i].dtype);
        }
        json_object_set_new(md, "total_size", json_integer((json_int_t)total));
        json_object_set_new(ix, "metadata", md);
        json_object_set_new(ix, "weight_map", wm);
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", o->path);
        rc = dump_json(ix, p, JSON_INDENT(2) | JSON_PRESERVE_ORDER, id, err, errlen);
        json_decref(ix);
    }
    return rc;
}

/* Is name one of the files this save writes into its directory? */
static int out_writes(const hf_out *o, const char *name) {
    if (o->nshards > 1 && strcmp(name, "model.safetensors.index.json") == 0) return 1;
    for (int s = 0; s < o->nshards; s++) {
        char fin[4400];
        shard_name(o, s, 0, 0, fin, sizeof fin);
        if (strcmp(strrchr(fin, '/') + 1, name) == 0) return 1;
    }
    return 0;
}

/* An existing directory must not hold model files this save would not replace (an index and
 * shards beside a new single file, or the reverse, would be read as the model later). */
static int check_stale(const hf_out *o, char *err, size_t errlen) {
    DIR *d = opendir(o->path);
    if (!d) return PL_OK; /* pl_check_output_dir says why */
    struct dirent *e;
    int rc = PL_OK;
    while (rc == PL_OK && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        int model = strcmp(e->d_name, "model.safetensors.index.json") == 0 ||
                    (n > 12 && strcmp(e->d_name + n - 12, ".safetensors") == 0);
        char full[4400];
        struct stat sb;
        snprintf(full, sizeof full, "%s/%s", o->path, e->d_name);
        if ((model || strcmp(e->d_name, "config.json") == 0) && lstat(full, &sb) == 0 && !S_ISREG(sb.st_mode)) {
            snprintf(err, errlen, "%.600s/%.255s: is %s, which is never replaced", o->path, e->d_name,
                     S_ISLNK(sb.st_mode) ? "a symbolic link" : pl_file_type_name(sb.st_mode));
            rc = PL_EINVAL;
        } else if (model && !out_writes(o, e->d_name)) {
            snprintf(err, errlen, "%.600s already holds %.255s, which this %s model would leave beside its own files: "
                     "give a new or empty directory", o->path, e->d_name, o->nshards > 1 ? "sharded" : "one-file");
            rc = PL_EINVAL;
        }
    }
    closedir(d);
    return rc;
}

/* Rank 0's first checks: the target (a file name, or a directory made if missing, holding
 * no model files of another layout). */
static int prepare_target(hf_out *o, char *err, size_t errlen) {
    if (!o->dir) return pl_check_output_file(o->path, "safetensors file", err, errlen);
    if (mkdir(o->path, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "%.600s: %s", o->path, strerror(errno));
        return PL_EIO;
    }
    PL_TRY(pl_check_output_dir(o->path, "Hugging Face model directory", err, errlen));
    return check_stale(o, err, errlen);
}

int hf_save(const char *path, stage *st, int dtype, size_t shard_bytes, MPI_Comm comm) {
    int rank, any;
    MPI_Comm_rank(comm, &rank);
    hf_out o;
    memset(&o, 0, sizeof o);
    snprintf(o.path, sizeof o.path, "%s", path);
    o.dir = !hf_is_safetensors_name(path);
    char err[1024] = "";
    long id = (long)getpid();
    const model_arch *A = arch_of(&st->cfg);
    int rc = A->hf_check ? A->hf_check(&st->cfg, err, sizeof err) : PL_OK;
    if (rc == PL_OK) rc = out_list(&st->cfg, dtype, &o);
    if (rc == PL_OK) rc = out_layout(&o, o.dir ? shard_bytes : 0);
    if (rc == PL_ENOMEM) snprintf(err, sizeof err, "out of memory");
    if (rc == PL_OK && rank == 0) rc = prepare_target(&o, err, sizeof err);
    if (rc == PL_OK && rank == 0) rc = create_shards(&o, id, err, sizeof err);
    PL_MPI_CHECK(MPI_Bcast(&id, 1, MPI_LONG, 0, comm));
    PL_MPI_CHECK(MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, comm));
    if (any == PL_OK) {
        rc = write_stage(&o, id, st, err, sizeof err);
        PL_MPI_CHECK(MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, comm));
    }
    if (any == PL_OK && rank == 0) rc = publish(&o, &st->cfg, id, err, sizeof err);
    if (rc != PL_OK) pl_error("writing Hugging Face model %s: %s", path, err);
    PL_MPI_CHECK(MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, comm));
    if (any != PL_OK && rank == 0)
        for (int s = 0; s < o.nshards; s++) {
            char tmp[4400];
            shard_name(&o, s, 1, id, tmp, sizeof tmp);
            unlink(tmp);
        }
    out_free(&o);
    return any;
}
