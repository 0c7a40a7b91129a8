/*
 * fuzz_config.c — the one validation of a configuration (config_validate, config_model,
 * config_check_llama / _model / _train in src/cli/config.c) against its promise: whatever start-up
 * accepts, the checkpoint loader and the llm.c header reader accept too (so what trains can
 * resume). The input fills a run's model and training settings (byte 0: arch; then each
 * setting takes a control byte: 0 keep the preset's, 1 an edge value from a table, 2 raw
 * bits). An accepted configuration is then checked the loader's way: the values the checkpoint
 * records (floats widened to double, as written) through config_check_llama, llama_config_make
 * and config_check_train with attribute naming; and its llm.c header, written to /dev/shm as
 * llmc_save writes it (tensors left as a hole), through llmc_read_config, which must give back
 * the same model. A refusal there aborts (the input is the bug).
 */
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include "fuzz.h"
#include "cli/config.h"
#include "formats/llmc.h"
#include "model/model.h"

static const long long edge_i[] = {0, 1, -1, 2, 3, 4, 6, 7, 8, 12, 16, 24, 32, 64, 100, 255, 256, 257, 1000, 1001,
                                   1024, 65536, 1 << 20, (1 << 20) + 1, INT_MAX, INT_MIN};
static const double edge_d[] = {0.0, -0.0, 1.0, -1.0, 0.5, 0.999999, 1.0000001, 2.0, 1e-300, 1e-50, 1e-5, 1e-8,
                                64.0, 64.0000001, 1e30, 1.0000001e30, 1e31, 1e39, DBL_MAX, 3e-3, 10000.0, 1.5};

/* An int setting: kept, an edge value, or raw bits. */
static void take_int(fuzz_in *in, int *v) {
    uint8_t c = fuzz_u8(in) % 3;
    if (c == 1) *v = (int)edge_i[fuzz_u8(in) % (sizeof edge_i / sizeof edge_i[0])];
    else if (c == 2) *v = (int)fuzz_u32(in);
}

/* A number setting: kept, an edge value (either sign), or raw bits if finite. */
static void take_dbl(fuzz_in *in, double *v) {
    uint8_t c = fuzz_u8(in) % 3;
    if (c == 1) {
        uint8_t k = fuzz_u8(in);
        *v = edge_d[k % (sizeof edge_d / sizeof edge_d[0])] * (k & 0x80 ? -1 : 1);
    } else if (c == 2) {
        uint64_t u = fuzz_u64(in);
        double x;
        memcpy(&x, &u, sizeof x);
        if (isfinite(x)) *v = x;
    }
}

/* The loader's checks on what a checkpoint of this run records (see ckpt.c read_meta_*). */
static void check_as_loader(const pl_options *o, const model_config *c) {
    char err[1024];
    if (c->arch == MODEL_LLAMA) {
        cfg_llama l = {c->NH, c->NKV, c->llama.multiple_of, c->llama.use_scaled_rope, c->llama.ver_major,
                       c->llama.ver_minor, (double)c->llama.ffn_mult, (double)c->llama.norm_eps,
                       (double)c->llama.rope_theta};
        model_config back;
        if (config_check_llama(&l, CFG_NAME_ATTR, err, sizeof err) != 0 ||
            llama_config_make(&back, c->V, c->maxT, c->L, c->NH, c->NKV, c->C, c->llama.multiple_of, (float)l.ffn_mult,
                              (float)l.norm_eps, (float)l.rope_theta, c->llama.use_scaled_rope, CFG_NAME_ATTR, err,
                              sizeof err) != 0 || back.H != c->H) {
            fprintf(stderr, "fuzz_config: start-up accepted a Llama model its checkpoint refuses: %s\n", err);
            abort();
        }
    }
    cfg_train t;
    config_train_of(o, &t);
    if (config_check_train(&t, c, CFG_NAME_ATTR, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_config: start-up accepted training settings its checkpoint refuses: %s\n", err);
        abort();
    }
}

/* The llm.c header of c (as llmc_save writes it) read back by llmc_read_config. */
static void check_header(const model_config *c) {
    if (model_num_params(c) > (1ull << 30)) return; /* the file's hole stays small enough for tmpfs metadata */
    int32_t h[256] = {0};
    float hf[256] = {0};
    if (c->arch == MODEL_LLAMA) {
        h[0] = LLMC_LLAMA_MAGIC; h[1] = 3; h[2] = c->maxT; h[3] = c->V; h[4] = c->L; h[5] = c->NH;
        h[6] = c->NKV; h[7] = c->C; h[8] = c->llama.multiple_of; h[9] = c->llama.use_scaled_rope;
        h[10] = c->llama.ver_major; h[11] = c->llama.ver_minor;
        hf[0] = c->llama.ffn_mult; hf[1] = c->llama.norm_eps; hf[2] = c->llama.rope_theta;
    } else {
        h[0] = LLMC_MODEL_MAGIC; h[1] = 3; h[2] = c->maxT; h[3] = c->V; h[4] = c->L; h[5] = c->NH; h[6] = c->C;
        h[7] = c->Vp;
    }
    size_t elems = llmc_tensor_offset(c, -1, -1, NULL), last = 0; /* a kind of no file: the whole file */
    const char *path = fuzz_path("config.bin");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, h, sizeof h) != (ssize_t)sizeof h ||
        (c->arch == MODEL_LLAMA && write(fd, hf, sizeof hf) != (ssize_t)sizeof hf) ||
        ftruncate(fd, (off_t)(llmc_header_bytes(c) + (elems + last) * 4)) != 0 || close(fd) != 0) {
        perror(path);
        abort();
    }
    model_config back;
    int version = 0;
    char err[1024];
    int rc = llmc_read_config(path, &back, &version, err, sizeof err);
    unlink(path);
    if (rc != 0 || back.V != c->V || back.maxT != c->maxT || back.L != c->L || back.NH != c->NH || back.C != c->C ||
        back.NKV != c->NKV || back.H != c->H || back.llama.norm_eps != c->llama.norm_eps || back.llama.rope_theta != c->llama.rope_theta) {
        fprintf(stderr, "fuzz_config: start-up accepted a model whose llm.c header is refused or differs: %s\n",
                rc ? err : "(a field differs)");
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_in in = {data, size};
    pl_options o;
    config_defaults(&o);
    char err[1024];
    if (fuzz_u8(&in) & 1) config_preset(&o, "llama-tiny", err, sizeof err);
    int *ints[] = {&o.vocab_size, &o.max_seq_len, &o.n_layer, &o.n_head, &o.n_embd, &o.n_kv_head, &o.multiple_of,
                   &o.use_scaled_rope, &o.batch, &o.seq_len, &o.microbatches, &o.hp.warmup_steps, &o.hp.total_steps,
                   &o.markov_branch};
    double *dbls[] = {&o.ffn_dim_multiplier, &o.norm_eps, &o.rope_theta, &o.hp.lr, &o.hp.min_lr, &o.hp.grad_clip,
                      &o.hp.beta1, &o.hp.beta2, &o.hp.eps, &o.hp.weight_decay};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) take_int(&in, ints[i]);
    for (size_t i = 0; i < sizeof dbls / sizeof dbls[0]; i++) take_dbl(&in, dbls[i]);
    if (fuzz_u8(&in) & 1) o.set_vocab = 1;
    if (config_validate(&o, err, sizeof err) != 0) return 0;
    model_config c;
    if (config_model(&o, config_vocab(&o), &c, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_config: config_validate accepted a model config_model refuses: %s\n", err);
        abort();
    }
    cfg_train t;
    config_train_of(&o, &t);
    if (config_check_train(&t, &c, CFG_NAME_OPTION, err, sizeof err) != 0) return 0; /* train.c refuses it too */
    check_as_loader(&o, &c);
    check_header(&c);
    return 0;
}
