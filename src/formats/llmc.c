/*
 * llmc.c — llm.c model-file reading and collective writing. Which tensors a file holds, in
 * which order and with how many rows, is the architecture's table (arch.h: file_index,
 * file_rows, and the llmc_zeros rows of slots the file holds as zeros); its header is the
 * architecture's own. Rows sharing a file index are packed per layer in table order.
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
#include "model/arch.h"
#include "util/common.h"
#include "cli/config.h"
#include "util/files.h"
#include "formats/llmc.h"

/* Visit the rows of file slot i (model rows, then the file's zero rows, of every part) in
 * file order: the per-layer floats before `want` in the slot (*sub), the slot's per-layer
 * floats, whether it is per layer. Returns 1 if the slot exists, 0 past the last one. */
static int file_slot(const model_config *c, int i, const arch_param *want, size_t *sub, size_t *slot,
                     int *per_layer) {
    const model_arch *A = arch_of(c);
    const arch_params *parts[6] = {&A->embed, &A->llmc_zeros[0], &A->block, &A->llmc_zeros[1], &A->head,
                                   &A->llmc_zeros[2]};
    int found = 0;
    *slot = 0;
    for (int p = 0; p < 6; p++)
        for (int k = 0; k < parts[p]->n; k++) {
            const arch_param *r = &parts[p]->rows[k];
            if (r->file_index != i) continue;
            found = 1;
            *per_layer = p / 2 == 1;
            if (r == want) *sub = *slot;
            *slot += arch_param_numel(c, r, 1);
        }
    return found;
}

/* In file order: the slots before the row's, all layers each, then `layer` slices of its
 * slot, then the rows packed before it in that slot. want NULL: the whole file. */
static size_t row_offset(const model_config *c, const arch_param *want, int layer, size_t *numel) {
    size_t off = 0, sub = (size_t)-1, slot; /* in elements after the header */
    int per_layer = 0;
    for (int i = 0; file_slot(c, i, want, &sub, &slot, &per_layer); i++) {
        if (sub != (size_t)-1) {
            if (numel) *numel = arch_param_numel(c, want, 1);
            return off + (per_layer ? slot * (size_t)layer : 0) + sub;
        }
        off += slot * (per_layer ? (size_t)c->L : 1);
    }
    if (numel) *numel = 0; /* not a row of this file: nothing */
    return off;
}

size_t llmc_header_bytes(const model_config *c) { return arch_of(c)->header_bytes; }

/* The first row (model rows, then zero rows) of a kind; NULL if none. */
static const arch_param *row_of_kind(const model_config *c, int kind) {
    const model_arch *A = arch_of(c);
    const arch_params *parts[6] = {&A->embed, &A->block, &A->head, &A->llmc_zeros[0], &A->llmc_zeros[1],
                                   &A->llmc_zeros[2]};
    for (int p = 0; p < 6; p++)
        for (int k = 0; k < parts[p]->n; k++)
            if (parts[p]->rows[k].kind == kind && parts[p]->rows[k].file_index >= 0) return &parts[p]->rows[k];
    return NULL;
}

size_t llmc_tensor_offset(const model_config *c, int kind, int layer, size_t *numel) {
    const arch_param *r = row_of_kind(c, kind);
    if (!r) return row_offset(c, NULL, layer, numel); /* not a kind of this file: the end, nothing */
    return row_offset(c, r, layer, numel);
}

/* Elements of the whole file after the header. */
static size_t file_elems(const model_config *c) {
    return row_offset(c, NULL, -1, NULL);
}

/* "expected 20240326, an llm.c GPT-2 model file, or 20240803, an llm.c Llama 3 one". */
static void known_magics(char *buf, size_t len) {
    size_t o = 0;
    for (int i = 0; i < arch_count && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%d, %s", i ? ", or " : "", (int)arch_registry[i]->magic,
                              arch_registry[i]->file_desc);
}

/* The architecture whose files start with this magic, or NULL. */
static const model_arch *arch_of_magic(int32_t magic) {
    for (int i = 0; i < arch_count; i++)
        if (arch_registry[i]->magic == magic) return arch_registry[i];
    return NULL;
}

#define MAX_HEADER_BYTES 4096

int llmc_read_config(const char *path, model_config *cfg, int *version, char *err, size_t errlen) {
    int fd;
    size_t fsize = 0;
    PL_TRY(pl_open_input_fd(path, "model file", 0, &fd, &fsize, err, errlen));
    int32_t h[MAX_HEADER_BYTES / 4];
    ssize_t r = pread(fd, h, sizeof h, 0);
    close(fd);
    size_t got = r > 0 ? (size_t)r : 0;
    long long size = (long long)fsize;
    if (got < 1024) {
        snprintf(err, errlen, "model file %s: shorter than the 1024-byte header", path);
        return PL_EIO;
    }
    const model_arch *A = arch_of_magic(h[0]);
    if (!A) {
        char known[256];
        known_magics(known, sizeof known);
        snprintf(err, errlen, "model file %s: bad magic %d (expected %s)", path, h[0], known);
        return PL_EIO;
    }
    if (h[1] != 3 && h[1] != 5) {
        snprintf(err, errlen, "model file %s: unsupported version %d (3 = fp32, 5 = bf16)", path, h[1]);
        return PL_EIO;
    }
    PL_TRY(A->llmc_header_read(path, h, got, cfg, err, errlen));
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

/* One zero slot's values (numel at element off, of version `version`) read in pieces: the
 * first non-zero one is refused, named (llm.c writes zeros there; the model has no such
 * tensor, so a value there would be lost). */
static int check_zero_row(int fd, const char *path, const char *name, const char *arch, int version, size_t hdr,
                          size_t off, size_t numel, char *err, size_t errlen) {
    size_t esz = version == 3 ? 4 : 2;
    unsigned char buf[1 << 14];
    for (size_t k = 0; k < numel;) {
        size_t n = numel - k < sizeof buf / esz ? numel - k : sizeof buf / esz;
        if (pread(fd, buf, n * esz, (off_t)(hdr + (off + k) * esz)) != (ssize_t)(n * esz)) {
            snprintf(err, errlen, "model file %s: short read of %s", path, name);
            return PL_EIO;
        }
        for (size_t j = 0; j < n; j++) {
            float v;
            if (esz == 4) memcpy(&v, buf + 4 * j, 4);
            else {
                uint16_t b;
                memcpy(&b, buf + 2 * j, 2);
                v = bf16_to_float(b);
            }
            if (v != 0.0f) {
                snprintf(err, errlen, "model file %s: %s holds %g at element %zu, but this %s model has no such "
                         "bias (its llm.c file keeps zeros in the bias slots): refusing it", path, name, (double)v,
                         k + j, arch);
                return PL_EIO;
            }
        }
        k += n;
    }
    return PL_OK;
}

/* The zero slots of the parts this stage holds (its blocks' and, on the ends, the
 * embeddings' and head's) must be zeros. */
static int check_zero_slots(int fd, const char *path, const stage *st, int version, char *err, size_t errlen) {
    const model_config *c = &st->cfg;
    const model_arch *A = arch_of(c);
    int held[3] = {st->has_embed, st->nb > 0, st->has_head};
    for (int p = 0; p < 3; p++)
        for (int k = 0; held[p] && k < A->llmc_zeros[p].n; k++) {
            const arch_param *r = &A->llmc_zeros[p].rows[k];
            for (int l = p == 1 ? st->l0 : -1; l < (p == 1 ? st->l1 : 0); l++) {
                size_t numel, off = row_offset(c, r, l, &numel);
                char name[64];
                if (l >= 0) snprintf(name, sizeof name, "tensor h.%d.%s", l, r->name);
                else snprintf(name, sizeof name, "tensor %s", r->name);
                PL_TRY(check_zero_row(fd, path, name, A->name, version, llmc_header_bytes(c), off, numel, err, errlen));
            }
        }
    return PL_OK;
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
                           "MLP hidden size"};
    int a[] = {fc.V, fc.maxT, fc.L, fc.NH, fc.C, fc.NKV, fc.H};
    int b[] = {c->V, c->maxT, c->L, c->NH, c->C, c->NKV, c->H};
    for (int i = 0; i < 7; i++)
        if (a[i] != b[i]) {
            snprintf(err, errlen, "model file %s: %s is %d in the file but %d in this run",
                     path, names[i], a[i], b[i]);
            return PL_EINVAL;
        }
    char e2[512];
    if (arch_of(c)->same_settings(&fc, c, CFG_NAME_HEADER, e2, sizeof e2) != PL_OK) {
        snprintf(err, errlen, "model file %s: %s", path, e2);
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
        size_t bytes = t->numel * sizeof(float); /* a row whose file holds V of its Vp rows: the rest 0 */
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
    if (rc == PL_OK) rc = check_zero_slots(fd, path, st, version, err, errlen);
    close(fd);
    return rc;
}

/* An embedding tensor a tied head row reads (a tied Llama's wte) written again into that
 * head row's own slot, when the file has one (llm.c's lm_head slot: llm.c has no tie).
 * Returns the bytes of one copy written (numel * 4) or -1. */
static ssize_t write_tied_slots(int fd, const model_config *c, const param_tensor *t, const void *host,
                                size_t numel) {
    const model_arch *A = arch_of(c);
    for (int i = 0; t->part == PART_EMBED && i < A->head.n; i++) {
        const arch_param *r = &A->head.rows[i];
        if (model_head_row_tied(c, i) != t->row || r->file_index < 0) continue;
        size_t n2, off = row_offset(c, r, -1, &n2);
        if (n2 != numel || pwrite(fd, host, numel * 4, (off_t)(llmc_header_bytes(c) + off * 4)) != (ssize_t)(numel * 4))
            return -1;
    }
    return (ssize_t)(numel * 4);
}

/* Write every tensor this stage is responsible for into an open file, each from a host view
 * of the backend buffer (map for reading). The last stage skips wte unless it is also the
 * first (the first stage's copy is the one written). */
static int write_stage(int fd, stage *st, int grads, char *err, size_t errlen) {
    const model_config *c = &st->cfg;
    const backend *be = st->be;
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        if (t->tied_copy) continue; /* written from its owner, the first stage */
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
        if (put == (ssize_t)(numel * 4)) put = write_tied_slots(fd, c, t, host, numel);
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
            int32_t hdr[MAX_HEADER_BYTES / 4] = {0};
            const model_arch *A = arch_of(c);
            A->llmc_header_write(c, hdr);
            if (pwrite(fd, hdr, A->header_bytes, 0) != (ssize_t)A->header_bytes ||
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
