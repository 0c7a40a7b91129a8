/*
 * llmc.c — llm.c model-file reading and collective writing.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "pipelm/common.h"
#include "pipelm/config.h"
#include "pipelm/files.h"
#include "pipelm/llmc.h"

#define HEADER_BYTES 1024 /* GPT-2: 256 int32 */
#define LLAMA_HEADER_BYTES 2048 /* Llama 3: 256 int32, then 256 float32 */

/* The kinds of each architecture's file in file order (each block kind holds all layers). */
static const int gpt2_order[] = {P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB, P_LN2W,
                                 P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB};
static const int llama_order[] = {P_WTE, P_ATTNORMW, P_QKVW, P_ATTPROJW, P_MLPNORMW, P_FCW, P_FC2W, P_FCPROJW,
                                  P_LNFW, P_LMHEAD};

size_t llmc_header_bytes(const model_config *c) { return c->arch == MODEL_LLAMA ? LLAMA_HEADER_BYTES : HEADER_BYTES; }

/* Floats of one layer's slice of a Llama kind in the file (wte and lm_head unpadded: V rows). */
static size_t llama_kind_numel(const model_config *c, int kind) {
    size_t C = c->C, H = c->H, QKV = (size_t)(c->NH + 2 * c->NKV) * (C / c->NH);
    switch (kind) {
    case P_WTE: case P_LMHEAD: return (size_t)c->V * C;
    case P_QKVW: return QKV * C;
    case P_ATTPROJW: return C * C;
    case P_FCW: case P_FC2W: case P_FCPROJW: return H * C;
    default: return C; /* the three norms */
    }
}

/* Floats of one layer's slice of a kind (or of the whole tensor for non-block kinds). */
static size_t kind_numel(const model_config *c, int kind) {
    size_t C = c->C;
    if (c->arch == MODEL_LLAMA) return llama_kind_numel(c, kind);
    switch (kind) {
    case P_WTE: return (size_t)c->Vp * C;
    case P_WPE: return (size_t)c->maxT * C;
    case P_QKVW: return 3 * C * C;
    case P_QKVB: return 3 * C;
    case P_ATTPROJW: return C * C;
    case P_FCW: case P_FCPROJW: return 4 * C * C;
    case P_FCB: return 4 * C;
    default: return C; /* ln*, attprojb, fcprojb, lnf* */
    }
}

static int is_block_kind(int kind) {
    return (kind >= P_LN1W && kind <= P_FCPROJB) || kind == P_ATTNORMW || kind == P_MLPNORMW || kind == P_FC2W;
}

/* In file order: the kinds before `kind`, all layers each, then `layer` slices of it. */
size_t llmc_tensor_offset(const model_config *c, int kind, int layer, size_t *numel) {
    size_t off = 0; /* in elements after the header */
    const int *order = c->arch == MODEL_LLAMA ? llama_order : gpt2_order;
    int n = c->arch == MODEL_LLAMA ? (int)(sizeof llama_order / sizeof *llama_order) : P_NKINDS_GPT2;
    for (int i = 0; i < n && order[i] != kind; i++)
        off += kind_numel(c, order[i]) * (is_block_kind(order[i]) ? (size_t)c->L : 1);
    if (is_block_kind(kind)) off += kind_numel(c, kind) * (size_t)layer;
    if (numel) *numel = kind_numel(c, kind);
    return off;
}

/* Elements of the whole file after the header. */
static size_t file_elems(const model_config *c) {
    int last = c->arch == MODEL_LLAMA ? P_LMHEAD : P_LNFB;
    return llmc_tensor_offset(c, last, -1, NULL) + kind_numel(c, last);
}

/* A Llama 3 header (ints h, floats f) into cfg; the message names the bad field. Its Llama
 * settings go through the one validation the command line and checkpoints use (config.c), so
 * a model --init accepts trains into checkpoints that resume. A bad header is a bad file:
 * PL_EIO. */
static int llama_header(const char *path, const int32_t *h, const float *f, model_config *cfg, char *err,
                        size_t errlen) {
    char e2[512];
    cfg_llama l = {h[5], h[6], h[8], h[9], h[10], h[11], f[0], f[1], f[2]};
    int rc = h[5] >= 1 ? config_check_llama(&l, CFG_NAME_HEADER, e2, sizeof e2) : PL_OK;
    if (rc == PL_OK)
        rc = llama_config_make(cfg, h[3], h[2], h[4], h[5], h[6], h[7], h[8], f[0], f[1], f[2], h[9], CFG_NAME_HEADER,
                               e2, sizeof e2);
    if (rc != PL_OK) {
        snprintf(err, errlen, "model file %s: bad header: %s", path, e2);
        return PL_EIO;
    }
    cfg->ver_major = h[10];
    cfg->ver_minor = h[11];
    return PL_OK;
}

int llmc_read_config(const char *path, model_config *cfg, int *version, char *err, size_t errlen) {
    int fd;
    size_t fsize = 0;
    PL_TRY(pl_open_input_fd(path, "model file", 0, &fd, &fsize, err, errlen));
    int32_t h[256];
    float hf[256];
    ssize_t r = pread(fd, h, sizeof h, 0);
    ssize_t rf = r == (ssize_t)sizeof h && h[0] == LLMC_LLAMA_MAGIC ? pread(fd, hf, sizeof hf, sizeof h) : 0;
    close(fd);
    size_t got = r > 0 ? (size_t)r / sizeof(int32_t) : 0;
    long long size = (long long)fsize;
    if (got != 256) {
        snprintf(err, errlen, "model file %s: shorter than the 1024-byte header", path);
        return PL_EIO;
    }
    if (h[0] != LLMC_MODEL_MAGIC && h[0] != LLMC_LLAMA_MAGIC) {
        snprintf(err, errlen, "model file %s: bad magic %d (expected %d, an llm.c GPT-2 model file, or %d, an llm.c "
                 "Llama 3 one)", path, h[0], LLMC_MODEL_MAGIC, LLMC_LLAMA_MAGIC);
        return PL_EIO;
    }
    if (h[1] != 3 && h[1] != 5) {
        snprintf(err, errlen, "model file %s: unsupported version %d (3 = fp32, 5 = bf16)", path, h[1]);
        return PL_EIO;
    }
    char e2[512];
    if (h[0] == LLMC_LLAMA_MAGIC) {
        if (rf != (ssize_t)sizeof hf) {
            snprintf(err, errlen, "model file %s: shorter than the 2048-byte Llama 3 header", path);
            return PL_EIO;
        }
        PL_TRY(llama_header(path, h, hf, cfg, err, errlen));
    } else if (gpt2_config_make(cfg, h[3], h[2], h[4], h[5], h[6], e2, sizeof e2) != PL_OK) {
        snprintf(err, errlen, "model file %s: bad header: %s", path, e2);
        return PL_EIO;
    }
    if (h[0] == LLMC_MODEL_MAGIC && h[7] != cfg->Vp) {
        snprintf(err, errlen, "model file %s: padded vocab %d is not V=%d rounded up to 128 (%d)",
                 path, h[7], cfg->V, cfg->Vp);
        return PL_EIO;
    }
    size_t expect = llmc_header_bytes(cfg) + file_elems(cfg) * (h[1] == 3 ? 4 : 2);
    if ((size_t)size != expect) {
        snprintf(err, errlen, "model file %s: %lld bytes, but its header (%s V=%d L=%d C=%d, version %d) "
                 "needs %zu", path, size, model_arch_name(cfg->arch), cfg->V, cfg->L, cfg->C, h[1], expect);
        return PL_EIO;
    }
    *version = h[1];
    return PL_OK;
}

/* bf16 -> fp32: the 16 bits are the high half of the float. */
static float bf16_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The backend's message after a failed call. */
static const char *backend_msg(const backend *be) {
    const char *m = be->error ? be->error() : "";
    return m && m[0] ? m : "no message from the backend";
}

/* Read one tensor (numel values of version `version` at element offset off after a header
 * of hdr bytes) into a host view of its slice of the stage's parameters, and check it is
 * finite. */
static int load_tensor(int fd, const char *path, const param_tensor *t, int version, size_t hdr, size_t off,
                       size_t numel, float *host, char *err, size_t errlen) {
    size_t esz = version == 3 ? 4 : 2;
    uint16_t *raw = NULL;
    void *dst = host;
    if (version != 3) {
        raw = malloc(numel ? numel * esz : 1);
        if (!raw) {
            snprintf(err, errlen, "out of memory reading %s", t->name);
            return PL_ENOMEM;
        }
        dst = raw;
    }
    int rc = PL_OK;
    ssize_t got = pread(fd, dst, numel * esz, (off_t)(hdr + off * esz));
    if (got != (ssize_t)(numel * esz)) {
        snprintf(err, errlen, "model file %s: short read of %s", path, t->name);
        rc = PL_EIO;
    } else {
        if (raw)
            for (size_t k = 0; k < numel; k++) host[k] = bf16_to_float(raw[k]);
        for (size_t k = 0; k < numel; k++)
            if (!isfinite(host[k])) {
                snprintf(err, errlen, "model file %s: tensor %s holds a non-finite value (%g) at element %zu: "
                         "refusing to start from it", path, t->name, (double)host[k], k);
                rc = PL_EIO;
                break;
            }
    }
    free(raw);
    return rc;
}

/* Each tensor is read straight into a host view of the stage's parameters (map for writing:
 * the buffer itself on a host-memory backend; unmap copies a staged view into the backend). */
int llmc_load_stage(const char *path, stage *st, char *err, size_t errlen) {
    model_config fc;
    int version;
    PL_TRY(llmc_read_config(path, &fc, &version, err, errlen));
    const model_config *c = &st->cfg;
    const backend *be = st->be;
    if (fc.arch != c->arch) {
        snprintf(err, errlen, "model file %s: a %s model, but this run trains %s", path, model_arch_name(fc.arch),
                 model_arch_name(c->arch));
        return PL_EINVAL;
    }
    const char *names[] = {"vocab-size", "max-seq-len", "n-layer", "n-head", "n-embd", "n-kv-head",
                           "MLP hidden size", "use-scaled-rope"};
    int a[] = {fc.V, fc.maxT, fc.L, fc.NH, fc.C, fc.NKV, fc.H, fc.use_scaled_rope};
    int b[] = {c->V, c->maxT, c->L, c->NH, c->C, c->NKV, c->H, c->use_scaled_rope};
    if (fc.arch == MODEL_LLAMA && (fc.norm_eps != c->norm_eps || fc.rope_theta != c->rope_theta)) {
        snprintf(err, errlen, "model file %s: %s is %g in the file but %g in this run", path,
                 fc.norm_eps != c->norm_eps ? "norm-eps" : "rope-theta",
                 (double)(fc.norm_eps != c->norm_eps ? fc.norm_eps : fc.rope_theta),
                 (double)(fc.norm_eps != c->norm_eps ? c->norm_eps : c->rope_theta));
        return PL_EINVAL;
    }
    for (int i = 0; i < 8; i++)
        if (a[i] != b[i]) {
            snprintf(err, errlen, "model file %s: %s is %d in the file but %d in this run",
                     path, names[i], a[i], b[i]);
            return PL_EINVAL;
        }
    int fd;
    PL_TRY(pl_open_input_fd(path, "model file", 0, &fd, NULL, err, errlen));
    int rc = PL_OK;
    for (int i = 0; i < st->ntensors && rc == PL_OK; i++) {
        const param_tensor *t = &st->tensors[i];
        size_t numel;
        size_t off = llmc_tensor_offset(c, t->kind, t->layer, &numel);
        float *p = st->params + t->offset;
        void *host = NULL;
        size_t bytes = t->numel * sizeof(float); /* Llama's wte, lm_head: the file holds V of Vp rows */
        if (be->map(&host, p, bytes, PL_MAP_WRITE) != PL_OK || !host) {
            snprintf(err, errlen, "model file %s: backend %s: mapping tensor %s (%zu bytes) for reading failed: %s",
                     path, be->name, t->name, bytes, backend_msg(be));
            rc = PL_EBACKEND;
            break;
        }
        rc = load_tensor(fd, path, t, version, llmc_header_bytes(c), off, numel, host, err, errlen);
        if (numel < t->numel) memset((float *)host + numel, 0, (t->numel - numel) * sizeof(float));
        /* unmapped even after a failed read (the stage's values are then unspecified) */
        if (be->unmap(host, p, bytes, PL_MAP_WRITE) != PL_OK && rc == PL_OK) {
            snprintf(err, errlen, "model file %s: backend %s: copying tensor %s (%zu bytes) into the backend "
                     "failed: %s", path, be->name, t->name, bytes, backend_msg(be));
            rc = PL_EBACKEND;
        }
    }
    close(fd);
    return rc;
}

/* Write every tensor this stage is responsible for into an open file, each from a host view
 * of the backend buffer (map for reading). The last stage skips wte unless it is also the
 * first (the first stage's copy is the one written). */
static int write_stage(int fd, stage *st, int grads, char *err, size_t errlen) {
    const model_config *c = &st->cfg;
    const backend *be = st->be;
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        if (t->kind == P_WTE && !st->has_embed) continue;
        size_t numel;
        size_t off = llmc_tensor_offset(c, t->kind, t->layer, &numel);
        float *p = (grads ? st->grads : st->params) + t->offset;
        void *host = NULL;
        if (be->map(&host, p, numel * sizeof(float), PL_MAP_READ) != PL_OK || !host) {
            snprintf(err, errlen, "backend %s: mapping %s %s (%zu bytes) for writing failed: %s", be->name,
                     grads ? "the gradient of" : "tensor", t->name, numel * sizeof(float), backend_msg(be));
            return PL_EBACKEND;
        }
        ssize_t put = pwrite(fd, host, numel * 4, (off_t)(llmc_header_bytes(c) + off * 4));
        int perr = errno;
        int urc = be->unmap(host, p, numel * sizeof(float), PL_MAP_READ);
        if (put != (ssize_t)(numel * 4)) {
            snprintf(err, errlen, "writing %s: %s", t->name, put < 0 ? strerror(perr) : "short write");
            return PL_EIO;
        }
        if (urc != PL_OK) {
            snprintf(err, errlen, "backend %s: unmapping %s %s after writing it failed: %s", be->name,
                     grads ? "the gradient of" : "tensor", t->name, backend_msg(be));
            return PL_EBACKEND;
        }
    }
    return PL_OK;
}

int llmc_save(const char *path_in, stage *st, int grads, MPI_Comm comm) {
    char path[4200];
    pl_output_target(path_in, path, sizeof path); /* through a link, to the file it names */
    int rank;
    MPI_Comm_rank(comm, &rank);
    char tmp[4300];
    char err[512] = "";
    int rc = PL_OK;
    const model_config *c = &st->cfg;
    /* one temporary name for all ranks, unique to this job (rank 0's pid); the target is
     * checked first: only a regular file (or nothing) is ever replaced */
    long id = (long)getpid();
    int null_out = 0;
    if (rank == 0) {
        null_out = pl_is_dev_null_path(path);
        if (!null_out && pl_check_output_file(path, "model file", err, sizeof err) != PL_OK) rc = PL_EIO;
    }
    PL_MPI_CHECK(MPI_Bcast(&id, 1, MPI_LONG, 0, comm));
    PL_MPI_CHECK(MPI_Bcast(&null_out, 1, MPI_INT, 0, comm));
    if (null_out) return PL_OK; /* /dev/null: the file is discarded, so nothing is written */
    pl_output_tmp_name(path, id, tmp, sizeof tmp);
    if (rank == 0 && rc == PL_OK) {
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) {
            snprintf(err, sizeof err, "%s", strerror(errno));
            rc = PL_EIO;
        } else {
            int32_t h[256] = {0};
            float hf[256] = {0};
            if (c->arch == MODEL_LLAMA) { /* llm.c's Llama 3 header: ints, then floats */
                h[0] = LLMC_LLAMA_MAGIC; h[1] = 3; h[2] = c->maxT; h[3] = c->V; h[4] = c->L; h[5] = c->NH;
                h[6] = c->NKV; h[7] = c->C; h[8] = c->multiple_of; h[9] = c->use_scaled_rope;
                h[10] = c->ver_major; h[11] = c->ver_minor;
                hf[0] = c->ffn_mult; hf[1] = c->norm_eps; hf[2] = c->rope_theta;
            } else {
                h[0] = LLMC_MODEL_MAGIC; h[1] = 3; h[2] = c->maxT; h[3] = c->V; h[4] = c->L;
                h[5] = c->NH; h[6] = c->C; h[7] = c->Vp;
            }
            int llama = c->arch == MODEL_LLAMA;
            if (pwrite(fd, h, sizeof h, 0) != (ssize_t)sizeof h ||
                (llama && pwrite(fd, hf, sizeof hf, sizeof h) != (ssize_t)sizeof hf) ||
                ftruncate(fd, (off_t)(llmc_header_bytes(c) + file_elems(c) * 4)) != 0) {
                snprintf(err, sizeof err, "%s", strerror(errno));
                rc = PL_EIO;
            }
            if (close(fd) != 0 && rc == PL_OK) { snprintf(err, sizeof err, "%s", strerror(errno)); rc = PL_EIO; }
        }
    }
    int any;
    PL_MPI_CHECK(MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, comm));
    if (any == PL_OK) {
        int fd = open(tmp, O_WRONLY);
        if (fd < 0) {
            snprintf(err, sizeof err, "%s", strerror(errno));
            rc = PL_EIO;
        } else {
            rc = write_stage(fd, st, grads, err, sizeof err);
            if (fsync(fd) != 0 && rc == PL_OK) { snprintf(err, sizeof err, "fsync: %s", strerror(errno)); rc = PL_EIO; }
            if (close(fd) != 0 && rc == PL_OK) { snprintf(err, sizeof err, "close: %s", strerror(errno)); rc = PL_EIO; }
        }
        PL_MPI_CHECK(MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, comm));
    }
    if (rc != PL_OK) pl_error("writing model file %s: %s", path, err);
    if (any != PL_OK) {
        if (rank == 0) unlink(tmp);
        return any;
    }
    if (rank == 0 && pl_output_replace(tmp, path, "model file", err, sizeof err) != PL_OK) {
        pl_error("%s", err);
        rc = PL_EIO;
    }
    PL_MPI_CHECK(MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, comm));
    return any;
}
