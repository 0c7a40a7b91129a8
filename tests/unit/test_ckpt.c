/*
 * test_ckpt.c — checkpoint tests (one MPI process, Check, CK_NOFORK): save/load round trip
 * bit-identical for parameters and both moments; a whole-model checkpoint loads into any
 * split; CRC-32C (SSE4.2 and table versions) against the check value and each other; every
 * dataset contiguous with a crc32c attribute that matches its bytes, in both transfer modes
 * (--ckpt-xfer; its alias refused when unknown, and losing to the option); a flipped byte fails the load naming the dataset and the CRC-32C
 * mismatch; a dataset without a checksum is refused, one with HDF5's Fletcher32 filter (the
 * old format) accepted; config, shape and missing-dataset errors named; injected failures (PIPELM_CKPT_FAIL=write, rename) and a full file system
 * (a tiny tmpfs, skipped where mount is not permitted) leave the previous checkpoint as
 * `latest` and loadable; keep=K prunes only after a successful save; --resume resolution;
 * llm.c -> checkpoint -> llm.c byte-identical (fp32) and bf16 input; inspect's verdict; a load
 * without an optimizer reads the parameters only and a save without one is refused; through
 * a staging backend (host views are copies) saves, loads and llm.c files are the same, and a
 * failed map or unmap is reported with the backend's message. Stages get an optimizer (the
 * moments' owner) beside them, and every value goes through the backend's map/unmap.
 *
 * With arguments it is instead a small multi-rank driver for tests/integration/test_ckpt_ranks.sh and
 * bench/ckpt_bandwidth.sh (see usage() below), e.g. `mpiexec -n 3 test_ckpt save DIR 5 1,1,1 0 7`.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>
#include <mpi.h>
#include <hdf5.h>
#include "ckpt/ckpt_internal.h"
#include "util/common.h"
#include "util/crc32c.h"
#include "formats/llmc.h"
#include "model/optim.h"
#include "util/rng.h"
#include "model/stage.h"

static char tmpdir[256];

/* A path inside the test's scratch directory. */
static const char *tpath(const char *name) {
    static char buf[16][512];
    static int k = 0;
    k = (k + 1) % 16;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

/* The small model of the tests: V=100 (Vp 128), maxT 16, L 3, NH 2, C 16; the driver takes
 * other dimensions from TEST_CKPT_DIMS="V,maxT,L,NH,C". */
static model_config small_cfg(void) {
    model_config c;
    char err[256];
    int d[5] = {100, 16, 3, 2, 16};
    const char *env = getenv("TEST_CKPT_DIMS");
    if (env) sscanf(env, "%d,%d,%d,%d,%d", &d[0], &d[1], &d[2], &d[3], &d[4]);
    gpt2_config_make(&c, d[0], d[1], d[2], d[3], d[4], err, sizeof err);
    return c;
}

/* The backend the test stages are built on: the CPU backend, or the staging one below. */
static const backend *test_be = &backend_cpu;

/* The values fill_state gives tensor t of buffer b (0 params, 1 m, 2 v): streams that depend
 * only on (seed, buffer, kind, layer), so every split holds the same values; v >= 0 as
 * AdamW's is. out holds t->numel. */
static void expected_tensor(const param_tensor *t, int b, unsigned long long seed, float *out) {
    rng_state r;
    rng_seed(&r, seed, 1000000ULL * (unsigned)b + 1000ULL * (unsigned)(t->kind + 1) + (unsigned)(t->layer + 1));
    for (size_t k = 0; k < t->numel; k++) {
        float x = 0.1f * rng_normal(&r);
        out[k] = b == 2 ? fabsf(x) : x;
    }
}

static const int optim_which[3] = {OPTIM_PARAMS, OPTIM_M, OPTIM_V};

/* Fill params, m and v of every tensor (through the optimizer's buffers and host views). A
 * backend failure aborts (the driver mode runs outside Check, where ck_assert cannot). */
static void fill_state(stage *st, optim *opt, unsigned long long seed) {
    const backend *be = st->be;
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        for (int b = 0; b < 3; b++) {
            float *p = optim_buffer(opt, optim_which[b]) + t->offset;
            void *host = NULL;
            if (be->map(&host, p, t->numel * sizeof(float), PL_MAP_WRITE) != 0) {
                fprintf(stderr, "fill_state: map of %s: %s\n", t->name, be->error());
                abort();
            }
            expected_tensor(t, b, seed, host);
            if (be->unmap(host, p, t->numel * sizeof(float), PL_MAP_WRITE) != 0) {
                fprintf(stderr, "fill_state: unmap of %s: %s\n", t->name, be->error());
                abort();
            }
        }
    }
}

/* 1 if buffer b (0 params, 1 m, 2 v) equals fill_state(seed) bit for bit on every tensor
 * this stage holds. */
static int buffer_matches(const stage *st, const optim *opt, int b, unsigned long long seed) {
    const backend *be = st->be;
    int ok = 1;
    for (int i = 0; i < st->ntensors && ok; i++) {
        const param_tensor *t = &st->tensors[i];
        size_t nb = t->numel * sizeof(float);
        float *want = malloc(nb ? nb : 1), *p = b == 0 ? st->params + t->offset : optim_buffer(opt, optim_which[b]) + t->offset;
        void *host = NULL;
        if (!want || be->map(&host, p, nb, PL_MAP_READ) != 0) {
            free(want);
            return 0;
        }
        expected_tensor(t, b, seed, want);
        ok = memcmp(want, host, nb) == 0;
        if (be->unmap(host, p, nb, PL_MAP_READ) != 0) ok = 0;
        if (!ok) fprintf(stderr, "state differs in %s of %s\n", b == 0 ? "params" : b == 1 ? "m" : "v", t->name);
        free(want);
    }
    return ok;
}

/* 1 if params, m and v equal fill_state(seed) bit for bit (on tensors this stage holds). */
static int state_matches(const stage *st, const optim *opt, unsigned long long seed) {
    return buffer_matches(st, opt, 0, seed) && buffer_matches(st, opt, 1, seed) && buffer_matches(st, opt, 2, seed);
}

/* 1 if every value of buffer b (1 m, 2 v) of the optimizer is zero. */
static int moments_zero(const stage *st, const optim *opt, int b) {
    const backend *be = st->be;
    size_t n = st->nparams;
    float *p = optim_buffer(opt, optim_which[b]);
    void *host = NULL;
    if (be->map(&host, p, n * sizeof(float), PL_MAP_READ) != 0) return 0;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) ok = ((const float *)host)[i] == 0.0f;
    if (be->unmap(host, p, n * sizeof(float), PL_MAP_READ) != 0) ok = 0;
    return ok;
}

/* Metadata with a recognisable value in every field. */
static ckpt_meta sample_meta(long long step, int nstages, const int *split) {
    ckpt_meta m;
    memset(&m, 0, sizeof m);
    m.step = step;
    m.tokens_seen = step * 1024;
    m.data_pos = step + 3;
    m.seed = 1337;
    m.data_seed = 42;
    snprintf(m.data, sizeof m.data, "markov");
    m.hp.lr = 3e-3; m.hp.min_lr = 3e-4; m.hp.beta1 = 0.9; m.hp.beta2 = 0.95; m.hp.eps = 1e-8; m.hp.weight_decay = 0.1;
    m.hp.grad_clip = 1.0;
    m.hp.warmup_steps = 20;
    m.hp.total_steps = 400;
    snprintf(m.hp.lr_schedule, sizeof m.hp.lr_schedule, "cosine");
    m.batch = 16; m.seq_len = 16; m.microbatches = 4;
    snprintf(m.schedule, sizeof m.schedule, "1f1b");
    m.nstages = nstages;
    for (int i = 0; i < nstages; i++) m.split[i] = split[i];
    return m;
}

/* AdamW settings for the tests' optimizers (their values do not reach the file). */
static optim_hparams test_hparams(void) {
    optim_hparams h;
    memset(&h, 0, sizeof h);
    h.lr = 3e-3;
    h.min_lr = 3e-4;
    h.warmup_steps = 20;
    h.total_steps = 400;
    snprintf(h.lr_schedule, sizeof h.lr_schedule, "cosine");
    h.beta1 = 0.9;
    h.beta2 = 0.95;
    h.eps = 1e-8;
    h.weight_decay = 0.1;
    h.grad_clip = 1.0;
    return h;
}

/* Stage s of a split (blocks per stage) over P stages, on test_be, with its optimizer. */
static int build_stage(stage *st, optim *opt, const model_config *c, const int *split, int P, int s, char *err,
                       size_t errlen) {
    int l0 = 0;
    for (int i = 0; i < s; i++) l0 += split[i];
    memset(opt, 0, sizeof *opt);
    int rc = stage_init(st, c, l0, l0 + split[s], s == 0, s == P - 1, 1, 1, 1, test_be, err, errlen);
    if (rc != 0) return rc;
    optim_hparams h = test_hparams();
    rc = optim_init(opt, st, &h, err, errlen);
    if (rc != 0) stage_free(st);
    return rc;
}

/* The whole model on one stage, with its optimizer. */
static void whole_stage(stage *st, optim *opt, const model_config *c) {
    char err[256];
    int split[1] = {c->L};
    ck_assert_int_eq(build_stage(st, opt, c, split, 1, 0, err, sizeof err), 0);
}

/* Free a stage and its optimizer. */
static void free_stage(stage *st, optim *opt) {
    optim_free(opt);
    stage_free(st);
}

/* Contents of a small text file ("" if missing). */
static const char *slurp(const char *path) {
    static char buf[1 << 16];
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return buf;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* 1 if path exists; its size in bytes (-1 if missing). */
static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static long long file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
}

/* Number of entries in dir whose name contains `part`. */
static int count_named(const char *dir, const char *part) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -c -- '%s' > '%s/count.txt'", dir, part, tmpdir);
    if (system(cmd) < 0) return -1;
    return atoi(slurp(tpath("count.txt")));
}

/* Flip one byte in the middle of a dataset's data: its file offset from HDF5 (H5Dget_offset
 * for a contiguous dataset, the first chunk's address for a chunked one). */
static int corrupt_dataset(const char *file, const char *dset) {
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return -1;
    hid_t ds = H5Dopen2(f, dset, H5P_DEFAULT), sp = ds >= 0 ? H5Dget_space(ds) : -1;
    hsize_t off[2], size = 0;
    unsigned mask = 0;
    haddr_t addr = ds >= 0 ? H5Dget_offset(ds) : HADDR_UNDEF;
    int rc = 0;
    if (addr != HADDR_UNDEF) size = H5Dget_storage_size(ds);
    else rc = (ds >= 0 && sp >= 0 && H5Dget_chunk_info(ds, sp, 0, off, &mask, &addr, &size) >= 0) ? 0 : -1;
    if (sp >= 0) H5Sclose(sp);
    if (ds >= 0) H5Dclose(ds);
    H5Fclose(f);
    if (rc || size == 0) return -1;
    int fd = open(file, O_RDWR);
    unsigned char b;
    off_t at = (off_t)(addr + size / 2);
    if (fd < 0 || pread(fd, &b, 1, at) != 1) return -1;
    b ^= 0x5a;
    rc = pwrite(fd, &b, 1, at) == 1 ? 0 : -1;
    close(fd);
    return rc;
}

/* Every dataset of a checkpoint (serial HDF5): contiguous, no filter, fp32, and a uint32
 * crc32c attribute equal to the CRC-32C of its bytes. Returns the number checked, -1 on a
 * failure (printed). */
static int check_crc_attrs(const char *file, const model_config *c) {
    ckpt_gtensor *gt = calloc(4 + 12 * (size_t)c->L, sizeof *gt);
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (!gt || f < 0) return -1;
    int n = ckpt_global_tensors(c, gt), good = 0;
    static const char *const sec[3] = {"model", "optim/m", "optim/v"};
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < n; i++) {
            char p[128];
            snprintf(p, sizeof p, "/%s/%s", sec[s], gt[i].path);
            hid_t ds = H5Dopen2(f, p, H5P_DEFAULT);
            hid_t dcpl = ds >= 0 ? H5Dget_create_plist(ds) : -1, ft = ds >= 0 ? H5Dget_type(ds) : -1;
            hid_t a = ds >= 0 ? H5Aopen(ds, "crc32c", H5P_DEFAULT) : -1, at = a >= 0 ? H5Aget_type(a) : -1;
            uint32_t stored = 0, computed = 1;
            float *buf = malloc(gt[i].numel * sizeof(float));
            int ok = ds >= 0 && dcpl >= 0 && a >= 0 && H5Pget_layout(dcpl) == H5D_CONTIGUOUS &&
                     H5Pget_nfilters(dcpl) == 0 && H5Tequal(ft, H5T_IEEE_F32LE) > 0 &&
                     H5Tequal(at, H5T_STD_U32LE) > 0 && H5Aread(a, H5T_NATIVE_UINT32, &stored) >= 0 && buf &&
                     H5Dread(ds, H5T_IEEE_F32LE, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0;
            if (ok) computed = crc32c(buf, gt[i].numel * sizeof(float));
            if (!ok || computed != stored) {
                fprintf(stderr, "%s: %s: layout, type or crc32c wrong (stored 0x%08x, computed 0x%08x)\n", file, p,
                        (unsigned)stored, (unsigned)computed);
                good = -1;
            } else if (good >= 0) {
                good++;
            }
            free(buf);
            if (at >= 0) H5Tclose(at);
            if (a >= 0) H5Aclose(a);
            if (ft >= 0) H5Tclose(ft);
            if (dcpl >= 0) H5Pclose(dcpl);
            if (ds >= 0) H5Dclose(ds);
        }
    H5Fclose(f);
    free(gt);
    return good;
}

/* Save a whole-model checkpoint of fill_state(seed) at `step` into dir (asserting success). */
static void save_whole(const char *dir, long long step, unsigned long long seed, int keep, char *path, size_t len) {
    model_config c = small_cfg();
    stage st;
    optim opt;
    whole_stage(&st, &opt, &c);
    fill_state(&st, &opt, seed);
    int split[1] = {c.L};
    ckpt_meta m = sample_meta(step, 1, split);
    char err[2048] = "";
    double bytes = 0;
    int rc = ckpt_save(dir, &st, &opt, &m, keep, MPI_COMM_SELF, path, len, &bytes, err, sizeof err);
    ck_assert_msg(rc == 0, "save failed: %s", err);
    free_stage(&st, &opt);
}

/* Load a checkpoint into a whole-model stage: status, and whether it holds fill_state(seed). */
static int load_whole(const char *path, unsigned long long seed, int *matches, char *err, size_t errlen) {
    model_config c = small_cfg();
    stage st;
    optim opt;
    whole_stage(&st, &opt, &c);
    ckpt_meta m;
    int rc = ckpt_load(path, &st, &opt, &m, MPI_COMM_SELF, NULL, err, errlen);
    *matches = rc == 0 && state_matches(&st, &opt, seed);
    free_stage(&st, &opt);
    return rc;
}

/* Save and load one stage: parameters, both moments and every metadata field come back
 * bit-identical; DIR (with parents) is created, latest names the file, no temp file stays. */
START_TEST(test_roundtrip) {
    model_config c = small_cfg();
    stage st;
    optim opt;
    whole_stage(&st, &opt, &c);
    fill_state(&st, &opt, 1);
    int split[3] = {1, 1, 1};
    ckpt_meta m = sample_meta(7, 3, split);
    char path[1024], err[2048] = "";
    double bytes = 0;
    const char *dir = tpath("rt/sub"); /* created, parents included */
    int rc = ckpt_save(dir, &st, &opt, &m, 0, MPI_COMM_SELF, path, sizeof path, &bytes, err, sizeof err);
    ck_assert_msg(rc == 0, "save: %s", err);
    ck_assert_str_eq(path, tpath("rt/sub/ckpt_00000007.h5"));
    ck_assert(exists(path));
    ck_assert_str_eq(slurp(tpath("rt/sub/latest")), "ckpt_00000007.h5\n");
    ck_assert_int_eq(count_named(dir, "tmp"), 0);
    ck_assert(bytes == 3.0 * 4.0 * (double)gpt2_num_params(&c)); /* wte once */
    ck_assert_int_eq(check_crc_attrs(path, &c), 120);

    stage ld;
    optim lopt;
    whole_stage(&ld, &lopt, &c);
    ckpt_meta lm;
    double lbytes = 0;
    char resolved[1024];
    ck_assert_int_eq(ckpt_resolve(dir, resolved, sizeof resolved, err, sizeof err), 0);
    ck_assert_str_eq(resolved, path);
    rc = ckpt_load(resolved, &ld, &lopt, &lm, MPI_COMM_SELF, &lbytes, err, sizeof err);
    ck_assert_msg(rc == 0, "load: %s", err);
    ck_assert(state_matches(&ld, &lopt, 1));
    ck_assert(lbytes == bytes);
    ck_assert_int_eq(lm.step, 7);
    ck_assert_int_eq(lm.tokens_seen, 7 * 1024);
    ck_assert_int_eq(lm.data_pos, 10);
    ck_assert_int_eq(lm.seed, 1337);
    ck_assert_int_eq(lm.data_seed, 42);
    ck_assert_str_eq(lm.data, "markov");
    ck_assert(lm.hp.lr == 3e-3 && lm.hp.min_lr == 3e-4 && lm.hp.beta1 == 0.9 && lm.hp.beta2 == 0.95 && lm.hp.eps == 1e-8 &&
              lm.hp.weight_decay == 0.1 && lm.hp.grad_clip == 1.0);
    ck_assert_int_eq(lm.hp.warmup_steps, 20);
    ck_assert_int_eq(lm.hp.total_steps, 400);
    ck_assert_str_eq(lm.hp.lr_schedule, "cosine");
    ck_assert_int_eq(lm.batch, 16);
    ck_assert_int_eq(lm.seq_len, 16);
    ck_assert_int_eq(lm.microbatches, 4);
    ck_assert_str_eq(lm.schedule, "1f1b");
    ck_assert_int_eq(lm.nstages, 3);
    ck_assert(lm.split[0] == 1 && lm.split[1] == 1 && lm.split[2] == 1);

    /* read_info gives the same without the tensors */
    model_config fc;
    ckpt_meta im;
    ck_assert_int_eq(ckpt_read_info(path, &fc, &im, err, sizeof err), 0);
    ck_assert(fc.V == c.V && fc.Vp == c.Vp && fc.L == c.L && fc.C == c.C && fc.NH == c.NH && fc.maxT == c.maxT);
    ck_assert_int_eq(im.step, 7);
    free_stage(&ld, &lopt);
    free_stage(&st, &opt);
}
END_TEST

/* CRC-32C: the check value and RFC 3720's vectors; the SSE4.2 and table versions agree on
 * random data of odd lengths at odd addresses; a CRC extends across pieces. */
START_TEST(test_crc32c) {
    const char *check = "123456789";
    ck_assert_uint_eq(crc32c(check, 9), 0xE3069283u);
    ck_assert_uint_eq(crc32c_extend_sw(0, check, 9), 0xE3069283u);
    ck_assert_uint_eq(crc32c_extend_hw(0, check, 9), 0xE3069283u);
    unsigned char v[32];
    memset(v, 0, 32);
    ck_assert_uint_eq(crc32c(v, 32), 0x8A9136AAu);
    memset(v, 0xff, 32);
    ck_assert_uint_eq(crc32c_extend_sw(0, v, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++) v[i] = (unsigned char)i;
    ck_assert_uint_eq(crc32c_extend_hw(0, v, 32), 0x46DD794Eu);
    ck_assert_uint_eq(crc32c(v, 0), 0);
    printf("crc32c: SSE4.2 %s\n", crc32c_hw_available() ? "used" : "not available (table version only)");
    size_t lens[] = {0, 1, 7, 4097, 1000003, 3 * 4096 * 4 + 13};
    size_t cap = 1000003 + 16;
    unsigned char *buf = malloc(cap);
    ck_assert(buf != NULL);
    rng_state r;
    rng_seed(&r, 77, 1);
    for (size_t i = 0; i < cap; i++) buf[i] = (unsigned char)(rng_uniform(&r) * 256.0f);
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
        for (int off = 0; off < 3; off++) {
            const unsigned char *p = buf + off * 5; /* aligned, and not */
            uint32_t sw = crc32c_extend_sw(0, p, lens[l]), hw = crc32c_extend_hw(0, p, lens[l]);
            ck_assert_msg(sw == hw, "length %zu offset %d: table 0x%08x, SSE4.2 0x%08x", lens[l], off * 5, sw, hw);
            ck_assert_uint_eq(crc32c(p, lens[l]), sw);
            size_t cut = lens[l] / 3;
            ck_assert_uint_eq(crc32c_extend(crc32c(p, cut), p + cut, lens[l] - cut), sw);
            ck_assert_uint_eq(crc32c_extend_sw(crc32c_extend_hw(0, p, cut), p + cut, lens[l] - cut), sw);
        }
    /* a changed byte changes it */
    uint32_t before = crc32c(buf, 4097);
    buf[2000] ^= 1;
    ck_assert_uint_ne(crc32c(buf, 4097), before);
    free(buf);
}
END_TEST

/* --ckpt-xfer collective (ckpt_opts.collective) saves and loads as the default independent
 * transfers do (CRCs right, a corrupted dataset named); an unknown value of the option's alias
 * PIPELM_CKPT_XFER is refused at start-up, naming it, and the option wins over the alias. */
START_TEST(test_xfer_modes) {
    const char *modes[2] = {"collective", "independent"};
    model_config c = small_cfg();
    ckpt_opts co;
    for (int k = 0; k < 2; k++) {
        char dir[64], path[1024], err[2048] = "";
        snprintf(dir, sizeof dir, "xfer_%s", modes[k]);
        ckpt_opts_default(&co);
        co.collective = k == 0;
        ckpt_set_opts(&co);
        save_whole(tpath(dir), 2, 40, 0, path, sizeof path);
        ck_assert_int_eq(check_crc_attrs(path, &c), 120);
        int ok, rc = load_whole(path, 40, &ok, err, sizeof err);
        /* and a corrupted dataset fails the load in this mode too */
        ck_assert_int_eq(corrupt_dataset(path, "/optim/m/h.2/qkv_w"), 0);
        int rc2 = load_whole(path, 40, &ok, err, sizeof err);
        ckpt_opts_default(&co);
        ckpt_set_opts(&co);
        ck_assert_msg(rc == 0, "%s: %s", modes[k], err);
        ck_assert_int_ne(rc2, 0);
        ck_assert_msg(strstr(err, "dataset /optim/m/h.2/qkv_w: CRC-32C mismatch"), "%s: got: %s", modes[k], err);
    }
    pl_options o;
    char err[2048] = "";
    setenv("PIPELM_CKPT_XFER", "sometimes", 1);
    config_defaults(&o);
    int rc = config_validate(&o, err, sizeof err);
    ck_assert_int_ne(rc, 0);
    ck_assert_msg(strstr(err, "PIPELM_CKPT_XFER") && strstr(err, "'sometimes'"), "got: %s", err);
    char *argv[] = {"--ckpt-xfer", "collective"};
    ck_assert_int_eq(config_parse(&o, 2, argv, 0, 0, err, sizeof err), 0);
    unsetenv("PIPELM_CKPT_XFER");
    ck_assert_msg(config_validate(&o, err, sizeof err) == 0, "got: %s", err);
    ckpt_opts_of(&o, &co);
    ck_assert_int_eq(co.collective, 1);
}
END_TEST

/* A whole-model checkpoint loads into every stage of other splits (tied wte on both ends). */
START_TEST(test_load_split) {
    char path[1024], err[2048];
    save_whole(tpath("split"), 3, 2, 0, path, sizeof path);
    model_config c = small_cfg();
    int splits[3][3] = {{1, 1, 1}, {0, 3, 0}, {2, 0, 1}};
    int P[3] = {3, 3, 3};
    for (int k = 0; k < 3; k++)
        for (int s = 0; s < P[k]; s++) {
            if (s > 0 && s < P[k] - 1 && splits[k][s] == 0) continue;
            stage st;
            optim opt;
            ck_assert_int_eq(build_stage(&st, &opt, &c, splits[k], P[k], s, err, sizeof err), 0);
            int rc = ckpt_load(path, &st, &opt, NULL, MPI_COMM_SELF, NULL, err, sizeof err);
            ck_assert_msg(rc == 0, "split %d stage %d: %s", k, s, err);
            ck_assert_msg(state_matches(&st, &opt, 2), "split %d stage %d differs", k, s);
            if (st.has_head) ck_assert(st.wte != NULL);
            free_stage(&st, &opt);
        }
}
END_TEST

/* One flipped byte in a dataset's data: load fails naming the dataset and the CRC-32C
 * mismatch; inspect marks it FAILED and exits 1. */
START_TEST(test_corrupt) {
    char path[1024], err[2048] = "";
    int ok;
    const char *dsets[] = {"/model/h.1/fc_w", "/optim/v/wpe", "/optim/m/lnf_b"};
    for (int i = 0; i < 3; i++) {
        char dir[64];
        snprintf(dir, sizeof dir, "corrupt%d", i);
        save_whole(tpath(dir), 1, 3, 0, path, sizeof path);
        ck_assert_int_eq(load_whole(path, 3, &ok, err, sizeof err), 0);
        ck_assert_int_eq(corrupt_dataset(path, dsets[i]), 0);
        int rc = load_whole(path, 3, &ok, err, sizeof err);
        ck_assert_int_ne(rc, 0);
        ck_assert_msg(strstr(err, dsets[i]) && strstr(err, "CRC-32C mismatch (stored 0x") && strstr(err, "rank 0"),
                      "message does not name %s and the checksum: %s", dsets[i], err);
        if (i == 0) printf("corrupt byte: %s\n", err);
        /* inspect names it and fails */
        FILE *o = fopen(tpath("inspect.txt"), "w");
        pl_out = o;
        char *argv[] = {"pipelm", "inspect", path};
        rc = ckpt_inspect_main(3, argv, 2);
        pl_out = NULL;
        fclose(o);
        ck_assert_int_eq(rc, 1);
        const char *txt = slurp(tpath("inspect.txt"));
        const char *row = strstr(txt, dsets[i]);
        ck_assert_msg(row && strstr(row, "FAILED"), "inspect output does not fail %s", dsets[i]);
        ck_assert(strstr(txt, "CHECKSUM FAILED"));
        ck_assert(strstr(txt, "CRC-32C mismatch"));
    }
}
END_TEST

/* Rewrite a dataset of a checkpoint with another shape, or just delete it (serial HDF5). */
static void tamper(const char *file, const char *dset, int rows, int cols) {
    hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert(f >= 0);
    ck_assert(H5Ldelete(f, dset, H5P_DEFAULT) >= 0);
    if (rows > 0) {
        hsize_t d[2] = {(hsize_t)rows, (hsize_t)cols};
        hid_t sp = H5Screate_simple(cols ? 2 : 1, d, NULL);
        hid_t ds = H5Dcreate2(f, dset, H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        ck_assert(ds >= 0);
        H5Dclose(ds);
        H5Sclose(sp);
    }
    H5Fclose(f);
}

/* A different model (config), a reshaped or missing dataset, a non-HDF5 or missing file:
 * each fails with a message naming the setting or dataset. */
START_TEST(test_mismatch) {
    char path[1024], err[2048] = "";
    save_whole(tpath("mm"), 1, 4, 0, path, sizeof path);
    /* config differences are named with both values */
    int dims[3][5] = {{100, 16, 3, 2, 32}, {100, 16, 2, 2, 16}, {300, 16, 3, 2, 16}};
    const char *want[3] = {"n_embd is 16 in the file but 32 in this run", "n_layer is 3 in the file but 2 in this run",
                           "vocab_size is 100 in the file but 300 in this run"};
    for (int i = 0; i < 3; i++) {
        model_config c;
        gpt2_config_make(&c, dims[i][0], dims[i][1], dims[i][2], dims[i][3], dims[i][4], err, sizeof err);
        stage st;
        optim opt;
        int split[1] = {c.L};
        ck_assert_int_eq(build_stage(&st, &opt, &c, split, 1, 0, err, sizeof err), 0);
        int rc = ckpt_load(path, &st, &opt, NULL, MPI_COMM_SELF, NULL, err, sizeof err);
        ck_assert_int_ne(rc, 0);
        ck_assert_msg(strstr(err, want[i]) && strstr(err, path), "got: %s", err);
        free_stage(&st, &opt);
    }
    /* a dataset with the wrong shape, and a missing one */
    int ok;
    tamper(path, "/model/wpe", 8, 16);
    ck_assert_int_ne(load_whole(path, 4, &ok, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "/model/wpe has shape (8, 16) in the file but this run expects (16, 16)"), "got: %s", err);
    save_whole(tpath("mm2"), 1, 4, 0, path, sizeof path);
    tamper(path, "/optim/m/lnf_b", 0, 0);
    ck_assert_int_ne(load_whole(path, 4, &ok, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "dataset /optim/m/lnf_b is missing"), "got: %s", err);
    /* not a checkpoint at all: HDF5's own message, with rank, call and source line */
    FILE *f = fopen(tpath("junk.h5"), "w");
    fputs("this is not HDF5\n", f);
    fclose(f);
    ck_assert_int_ne(load_whole(tpath("junk.h5"), 4, &ok, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "rank 0") && strstr(err, "H5Fopen") && strstr(err, "ckpt.c:") &&
                  strstr(err, "junk.h5"), "got: %s", err);
    printf("not HDF5: %s\n", err);
    ck_assert_int_ne(load_whole(tpath("nonexistent.h5"), 4, &ok, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "No such file"), "got: %s", err);
}
END_TEST

/* Run inspect on a file into tpath(out); returns its exit status. */
static int inspect_to(const char *file, const char *out) {
    FILE *o = fopen(tpath(out), "w");
    pl_out = o;
    char *argv[] = {"pipelm", "inspect", (char *)file};
    int rc = ckpt_inspect_main(3, argv, 2);
    pl_out = NULL;
    fclose(o);
    return rc;
}

/* /model/lnf_b rewritten with its own values but without the crc32c attribute: with no
 * filter it is refused as unverifiable (load and inspect, NONE); chunked with HDF5's
 * Fletcher32 filter (the format's other checksum) it loads and inspects OK. */
START_TEST(test_checksum_kinds) {
    char path[1024], err[2048] = "";
    const char *d = "/model/lnf_b";
    int ok;
    save_whole(tpath("kinds"), 1, 8, 0, path, sizeof path);
    for (int fl = 0; fl < 2; fl++) {
        hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
        ck_assert(f >= 0);
        float vals[16];
        hid_t ds = H5Dopen2(f, d, H5P_DEFAULT);
        ck_assert(ds >= 0 && H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, vals) >= 0);
        H5Dclose(ds);
        ck_assert(H5Ldelete(f, d, H5P_DEFAULT) >= 0);
        hsize_t dim = 16, ch = 8;
        hid_t sp = H5Screate_simple(1, &dim, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
        if (fl) ck_assert(H5Pset_chunk(dcpl, 1, &ch) >= 0 && H5Pset_fletcher32(dcpl) >= 0);
        ds = H5Dcreate2(f, d, H5T_IEEE_F32LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        ck_assert(ds >= 0 && H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, vals) >= 0);
        H5Dclose(ds);
        H5Pclose(dcpl);
        H5Sclose(sp);
        H5Fclose(f);
        int rc = load_whole(path, 8, &ok, err, sizeof err);
        int irc = inspect_to(path, "kinds.txt");
        const char *row = strstr(slurp(tpath("kinds.txt")), d);
        if (!fl) {
            ck_assert_int_ne(rc, 0);
            ck_assert_msg(strstr(err, "dataset /model/lnf_b has no checksum") && strstr(err, "unverified"), "got: %s", err);
            ck_assert_int_eq(irc, 1);
            ck_assert_msg(row && strncmp(row + strcspn(row, "\n") - 4, "NONE", 4) == 0, "inspect row: %.80s", row);
        } else {
            ck_assert_msg(rc == 0 && ok, "Fletcher32 dataset: %s", err);
            ck_assert_int_eq(irc, 0);
            ck_assert_msg(row && strncmp(row + strcspn(row, "\n") - 2, "OK", 2) == 0, "inspect row: %.80s", row);
        }
    }
}
END_TEST

/* An injected failure leaves the previous checkpoint as latest, loadable, and no temp file. */
static void check_failed_save(const char *mode, const char *dirname, const char *want) {
    char path[1024], err[2048] = "";
    const char *dir = tpath(dirname);
    save_whole(dir, 1, 5, 0, path, sizeof path);
    model_config c = small_cfg();
    stage st;
    optim opt;
    whole_stage(&st, &opt, &c);
    fill_state(&st, &opt, 6);
    int split[1] = {c.L};
    ckpt_meta m = sample_meta(2, 1, split);
    setenv("PIPELM_CKPT_FAIL", mode, 1);
    int rc = ckpt_save(dir, &st, &opt, &m, 1, MPI_COMM_SELF, path, sizeof path, NULL, err, sizeof err);
    unsetenv("PIPELM_CKPT_FAIL");
    ck_assert_int_ne(rc, 0);
    ck_assert_msg(strstr(err, want), "%s: got: %s", mode, err);
    ck_assert_str_eq(slurp(tpath("latest")), ""); /* (sanity: nothing written outside dir) */
    char lf[600];
    snprintf(lf, sizeof lf, "%s/latest", dir);
    ck_assert_str_eq(slurp(lf), "ckpt_00000001.h5\n");
    ck_assert_int_eq(count_named(dir, "tmp"), 0);
    ck_assert_int_eq(count_named(dir, "ckpt_00000002"), 0);
    ck_assert_int_eq(count_named(dir, "ckpt_00000001.h5"), 1); /* keep=1 did not prune it */
    char res[1024];
    ck_assert_int_eq(ckpt_resolve(dir, res, sizeof res, err, sizeof err), 0);
    int ok;
    ck_assert_int_eq(load_whole(res, 5, &ok, err, sizeof err), 0);
    ck_assert(ok);
    free_stage(&st, &opt);
}

/* PIPELM_CKPT_FAIL=write, =rename, and an unknown value. */
START_TEST(test_fail_write) { check_failed_save("write", "fw", "PIPELM_CKPT_FAIL=write"); }
END_TEST
START_TEST(test_fail_rename) { check_failed_save("rename", "fr", "PIPELM_CKPT_FAIL=rename"); }
END_TEST
START_TEST(test_fail_bad_mode) { check_failed_save("bogus", "fb", "PIPELM_CKPT_FAIL='bogus'"); }
END_TEST

/* keep=K removes the oldest beyond K, only after a successful save. */
START_TEST(test_keep) {
    char path[1024], err[2048];
    const char *dir = tpath("keep");
    for (int s = 1; s <= 4; s++) save_whole(dir, s, 10 + s, 2, path, sizeof path);
    ck_assert_int_eq(count_named(dir, "ckpt_0"), 2);
    ck_assert(exists(tpath("keep/ckpt_00000003.h5")) && exists(tpath("keep/ckpt_00000004.h5")));
    /* a failed save prunes nothing */
    model_config c = small_cfg();
    stage st;
    optim opt;
    whole_stage(&st, &opt, &c);
    fill_state(&st, &opt, 15);
    int split[1] = {c.L};
    ckpt_meta m = sample_meta(5, 1, split);
    setenv("PIPELM_CKPT_FAIL", "write", 1);
    ck_assert_int_ne(ckpt_save(dir, &st, &opt, &m, 1, MPI_COMM_SELF, path, sizeof path, NULL, err, sizeof err), 0);
    unsetenv("PIPELM_CKPT_FAIL");
    ck_assert_int_eq(count_named(dir, "ckpt_0"), 2);
    ck_assert_str_eq(slurp(tpath("keep/latest")), "ckpt_00000004.h5\n");
    /* a good one with keep=1 leaves only itself */
    ck_assert_int_eq(ckpt_save(dir, &st, &opt, &m, 1, MPI_COMM_SELF, path, sizeof path, NULL, err, sizeof err), 0);
    ck_assert_int_eq(count_named(dir, "ckpt_0"), 1);
    ck_assert(exists(tpath("keep/ckpt_00000005.h5")));
    free_stage(&st, &opt);
}
END_TEST

/* --resume resolution: latest if it names a file, else the newest ckpt_*.h5, temp files
 * ignored; a file is itself; an empty directory is "no checkpoint in DIR". */
START_TEST(test_resolve) {
    char out[1024], err[1024];
    const char *dir = tpath("res");
    mkdir(dir, 0755);
    ck_assert_int_ne(ckpt_resolve(dir, out, sizeof out, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "no checkpoint in") && strstr(err, dir), "got: %s", err);
    const char *names[] = {"ckpt_00000003.h5", "ckpt_00000010.h5", ".ckpt_00000011.h5.tmp", "ckpt_00000012.h5.tmp",
                           "latest.tmp"};
    for (int i = 0; i < 5; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        FILE *f = fopen(p, "w");
        fputs("x", f);
        fclose(f);
    }
    /* no latest: the newest complete one */
    ck_assert_int_eq(ckpt_resolve(dir, out, sizeof out, err, sizeof err), 0);
    ck_assert_str_eq(out, tpath("res/ckpt_00000010.h5"));
    /* latest wins when it names an existing file */
    FILE *f = fopen(tpath("res/latest"), "w");
    fputs("ckpt_00000003.h5\n", f);
    fclose(f);
    ck_assert_int_eq(ckpt_resolve(dir, out, sizeof out, err, sizeof err), 0);
    ck_assert_str_eq(out, tpath("res/ckpt_00000003.h5"));
    /* a dangling latest falls back to the newest */
    f = fopen(tpath("res/latest"), "w");
    fputs("ckpt_00000099.h5\n", f);
    fclose(f);
    ck_assert_int_eq(ckpt_resolve(dir, out, sizeof out, err, sizeof err), 0);
    ck_assert_str_eq(out, tpath("res/ckpt_00000010.h5"));
    /* a file is itself; nothing is an error */
    ck_assert_int_eq(ckpt_resolve(tpath("res/ckpt_00000003.h5"), out, sizeof out, err, sizeof err), 0);
    ck_assert_str_eq(out, tpath("res/ckpt_00000003.h5"));
    ck_assert_int_ne(ckpt_resolve(tpath("nothing_here"), out, sizeof out, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "nothing_here"), "got: %s", err);
}
END_TEST

/* Write an llm.c fp32 file of fill_state(seed) parameters. */
static void write_llmc(const char *path, unsigned long long seed) {
    model_config c = small_cfg();
    stage st;
    optim opt;
    whole_stage(&st, &opt, &c);
    fill_state(&st, &opt, seed);
    ck_assert_int_eq(llmc_save(path, &st, 0, MPI_COMM_SELF), 0);
    free_stage(&st, &opt);
}

/* Byte-compare two files. */
static int same_bytes(const char *a, const char *b) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
    return system(cmd) == 0;
}

/* pipelm convert: llm.c fp32 -> checkpoint (zero moments, step 0) -> llm.c is byte-identical;
 * inspect of the result exits 0; a file of neither kind is refused. */
START_TEST(test_convert_fp32) {
    const char *in = tpath("m32.bin"), *h5 = tpath("m32.h5"), *back = tpath("m32_back.bin");
    write_llmc(in, 21);
    char *a1[] = {"pipelm", "convert", (char *)in, (char *)h5};
    ck_assert_int_eq(ckpt_convert_main(4, a1, 2), 0);
    char *a2[] = {"pipelm", "convert", (char *)h5, (char *)back};
    ck_assert_int_eq(ckpt_convert_main(4, a2, 2), 0);
    ck_assert_msg(same_bytes(in, back), "llm.c -> h5 -> llm.c is not byte-identical");
    /* the checkpoint: step 0, zero moments, the parameters */
    model_config c = small_cfg();
    stage st;
    optim opt;
    whole_stage(&st, &opt, &c);
    fill_state(&st, &opt, 99);
    ckpt_meta m;
    char err[2048];
    ck_assert_int_eq(ckpt_load(h5, &st, &opt, &m, MPI_COMM_SELF, NULL, err, sizeof err), 0);
    ck_assert_int_eq(m.step, 0);
    ck_assert(moments_zero(&st, &opt, 1) && moments_zero(&st, &opt, 2));
    /* compare parameters with a freshly filled stage */
    ck_assert(buffer_matches(&st, &opt, 0, 21));
    free_stage(&st, &opt);
    /* inspect: every checksum holds */
    FILE *o = fopen(tpath("inspect_ok.txt"), "w");
    pl_out = o;
    char *a3[] = {"pipelm", "inspect", (char *)h5};
    int rc = ckpt_inspect_main(3, a3, 2);
    pl_out = NULL;
    fclose(o);
    ck_assert_int_eq(rc, 0);
    const char *txt = slurp(tpath("inspect_ok.txt"));
    ck_assert_msg(strstr(txt, "all 120 checksums OK") && strstr(txt, "pipelm-checkpoint") &&
                  strstr(txt, "/model/h.2/fcproj_w") && strstr(txt, "(128, 16)"), "inspect output (%zu chars) lacks a line",
                  strlen(txt));
    /* refuses what is neither */
    char *a4[] = {"pipelm", "convert", (char *)tpath("inspect_ok.txt"), (char *)tpath("x.h5")};
    ck_assert_int_ne(ckpt_convert_main(4, a4, 2), 0);
}
END_TEST

/* bf16 (v5) input: the checkpoint holds the bf16 values widened to fp32. */
START_TEST(test_convert_bf16) {
    const char *in32 = tpath("b32.bin"), *in16 = tpath("b16.bin"), *h5 = tpath("b16.h5"), *back = tpath("b16_back.bin");
    write_llmc(in32, 22);
    /* make the v5 file: same header with version 5, each float's high 16 bits */
    FILE *f = fopen(in32, "rb");
    ck_assert(f);
    fseek(f, 0, SEEK_END);
    long n = (ftell(f) - 1024) / 4;
    fseek(f, 0, SEEK_SET);
    int32_t h[256];
    ck_assert_int_eq(fread(h, 4, 256, f), 256);
    uint32_t *u = malloc((size_t)n * 4);
    ck_assert_int_eq(fread(u, 4, (size_t)n, f), (size_t)n);
    fclose(f);
    h[1] = 5;
    uint16_t *b = malloc((size_t)n * 2);
    for (long i = 0; i < n; i++) b[i] = (uint16_t)(u[i] >> 16);
    f = fopen(in16, "wb");
    fwrite(h, 4, 256, f);
    fwrite(b, 2, (size_t)n, f);
    fclose(f);
    char *a1[] = {"pipelm", "convert", (char *)in16, (char *)h5};
    ck_assert_int_eq(ckpt_convert_main(4, a1, 2), 0);
    char *a2[] = {"pipelm", "convert", (char *)h5, (char *)back};
    ck_assert_int_eq(ckpt_convert_main(4, a2, 2), 0);
    /* back is fp32 v3 whose every value is the truncated one */
    f = fopen(back, "rb");
    int32_t hb[256];
    ck_assert_int_eq(fread(hb, 4, 256, f), 256);
    ck_assert_int_eq(hb[1], 3);
    uint32_t *ub = malloc((size_t)n * 4);
    ck_assert_int_eq(fread(ub, 4, (size_t)n, f), (size_t)n);
    fclose(f);
    for (long i = 0; i < n; i++) ck_assert_uint_eq(ub[i], u[i] & 0xffff0000u);
    free(u); free(b); free(ub);
}
END_TEST

/* Save fill_state(seed) of a whole model of config c at `step` into dir; returns the status. */
static int save_cfg(const model_config *c, const char *dir, long long step, unsigned long long seed, int keep,
                    char *path, size_t len, char *err, size_t errlen) {
    stage st;
    optim opt;
    int split[1] = {c->L};
    ck_assert_int_eq(build_stage(&st, &opt, c, split, 1, 0, err, errlen), 0);
    fill_state(&st, &opt, seed);
    ckpt_meta m = sample_meta(step, 1, split);
    int rc = ckpt_save(dir, &st, &opt, &m, keep, MPI_COMM_SELF, path, len, NULL, err, errlen);
    free_stage(&st, &opt);
    return rc;
}

/* A full file system: the second save fails (early, from the free-space check, or inside
 * HDF5 with ENOSPC when the check is off) and the first stays latest, intact and loadable.
 * Needs a tmpfs mount (root, allowed by the container); skipped otherwise. Loop i: the
 * tmpfs holds one checkpoint plus 30% (i < 2) or 70% of another; i odd disables the check. */
START_TEST(test_enospc) {
    char path[1024], err[2048] = "", err2[2048] = "";
    model_config c; /* data large against HDF5's metadata, as real models are: ~7 MB a file */
    gpt2_config_make(&c, 256, 64, 2, 2, 128, err, sizeof err);
    char probe[64];
    snprintf(probe, sizeof probe, "size_probe%d", _i);
    ck_assert_int_eq(save_cfg(&c, tpath(probe), 1, 30, 0, path, sizeof path, err, sizeof err), 0);
    long long S = file_size(path);
    ck_assert(S > 0);
    const char *mnt = tpath("tiny");
    mkdir(mnt, 0755);
    char opts[64];
    long long limit = (S + S * (_i < 2 ? 3 : 7) / 10 + 8191) / 4096 * 4096;
    snprintf(opts, sizeof opts, "size=%lld", limit);
    if (mount("tmpfs", mnt, "tmpfs", 0, opts) != 0) {
        printf("test_enospc: SKIPPED (mount tmpfs: %s)\n", strerror(errno));
        return;
    }
    const char *dir = tpath("tiny/ck");
    int rc1 = save_cfg(&c, dir, 1, 31, 1, path, sizeof path, err, sizeof err);
    ckpt_opts co;
    ckpt_opts_default(&co);
    co.space_check = !(_i % 2); /* --ckpt-space-check 0 */
    ckpt_set_opts(&co);
    int rc = rc1 ? -1 : save_cfg(&c, dir, 2, 32, 1, path, sizeof path, err, sizeof err);
    ckpt_opts_default(&co);
    ckpt_set_opts(&co);
    printf("full disk (%lld-byte tmpfs, %lld-byte checkpoints, space check %s): %s\n", limit, S,
           _i % 2 ? "off" : "on", err);
    /* the first checkpoint, as latest resolves it */
    stage st;
    optim opt;
    int split[1] = {c.L};
    ck_assert_int_eq(build_stage(&st, &opt, &c, split, 1, 0, err2, sizeof err2), 0);
    char res[1024];
    int lrc = ckpt_resolve(dir, res, sizeof res, err2, sizeof err2);
    if (lrc == 0) lrc = ckpt_load(res, &st, &opt, NULL, MPI_COMM_SELF, NULL, err2, sizeof err2);
    int same = lrc == 0 && state_matches(&st, &opt, 31);
    free_stage(&st, &opt);
    int tmps = count_named(dir, "tmp");
    int latest_ok = strcmp(slurp(tpath("tiny/ck/latest")), "ckpt_00000001.h5\n") == 0;
    umount2(mnt, 0);
    ck_assert_int_eq(rc1, 0);
    ck_assert_int_ne(rc, 0);
    ck_assert_msg(strstr(err, "No space left on device"), "got: %s", err);
    ck_assert_msg(_i % 2 || strstr(err, "not enough space"), "the space check did not catch it: %s", err);
    ck_assert(latest_ok);
    ck_assert_int_eq(tmps, 0);
    ck_assert_msg(same, "previous checkpoint not loadable or changed: %s", err2);
}
END_TEST

/* ckpt_load with no optimizer reads the parameters only: the moments of the stage's own
 * optimizer keep their values, *bytes_out counts the parameters, and the moments datasets
 * are still checked (a missing one fails the load). ckpt_save and ckpt_save_file with no
 * optimizer are refused (PL_EINVAL, a message saying why) before anything is written; an
 * optimizer of another stage is refused by a save and a load. */
START_TEST(test_no_optim) {
    char path[1024], err[2048] = "";
    model_config c = small_cfg();
    save_whole(tpath("noopt"), 4, 50, 0, path, sizeof path);
    stage st;
    optim opt;
    whole_stage(&st, &opt, &c);
    fill_state(&st, &opt, 51); /* params to be replaced; moments that must stay */
    ckpt_meta m;
    double bytes = 0;
    int rc = ckpt_load(path, &st, NULL, &m, MPI_COMM_SELF, &bytes, err, sizeof err);
    ck_assert_msg(rc == 0, "load without an optimizer: %s", err);
    ck_assert_int_eq(m.step, 4);
    ck_assert(buffer_matches(&st, &opt, 0, 50));                                 /* params loaded */
    ck_assert(buffer_matches(&st, &opt, 1, 51) && buffer_matches(&st, &opt, 2, 51)); /* moments untouched */
    ck_assert(bytes == 4.0 * (double)gpt2_num_params(&c));                       /* params only */
    /* the moments datasets are checked all the same */
    save_whole(tpath("noopt2"), 4, 50, 0, path, sizeof path);
    tamper(path, "/optim/v/h.1/fc_b", 0, 0);
    rc = ckpt_load(path, &st, NULL, NULL, MPI_COMM_SELF, NULL, err, sizeof err);
    ck_assert_int_ne(rc, 0);
    ck_assert_msg(strstr(err, "dataset /optim/v/h.1/fc_b is missing"), "got: %s", err);
    /* saving without an optimizer is refused, and nothing is created */
    int split[1] = {c.L};
    ckpt_meta sm = sample_meta(5, 1, split);
    err[0] = 0;
    rc = ckpt_save(tpath("noopt_save/sub"), &st, NULL, &sm, 0, MPI_COMM_SELF, path, sizeof path, NULL, err, sizeof err);
    ck_assert_int_eq(rc, PL_EINVAL);
    ck_assert_msg(strstr(err, "no optimizer given") && strstr(err, "rank 0"), "got: %s", err);
    printf("save without an optimizer: %s\n", err);
    ck_assert(!exists(tpath("noopt_save")));
    err[0] = 0;
    rc = ckpt_save_file(tpath("noopt.h5"), &st, NULL, &sm, MPI_COMM_SELF, NULL, err, sizeof err);
    ck_assert_int_eq(rc, PL_EINVAL);
    ck_assert_msg(strstr(err, "no optimizer given"), "got: %s", err);
    ck_assert(!exists(tpath("noopt.h5")) && !exists(tpath("noopt.h5.tmp")));
    /* an optimizer made for another stage */
    stage other;
    optim oopt;
    whole_stage(&other, &oopt, &c);
    rc = ckpt_save(tpath("noopt_other"), &st, &oopt, &sm, 0, MPI_COMM_SELF, path, sizeof path, NULL, err, sizeof err);
    ck_assert_int_eq(rc, PL_EINVAL);
    ck_assert_msg(strstr(err, "belongs to another stage"), "got: %s", err);
    save_whole(tpath("noopt3"), 4, 50, 0, path, sizeof path);
    rc = ckpt_load(path, &st, &oopt, NULL, MPI_COMM_SELF, NULL, err, sizeof err);
    ck_assert_int_eq(rc, PL_EINVAL);
    ck_assert_msg(strstr(err, "belongs to another stage"), "got: %s", err);
    free_stage(&other, &oopt);
    free_stage(&st, &opt);
}
END_TEST

/* ---- a staging backend: the CPU backend whose host views are copies ---------------------
 * host_memory 0, map hands out a separate malloc'd buffer (a READ view holds a copy, a
 * WRITE-only one starts as NaN bytes), unmap checks that it matches its map (same host, p,
 * bytes and mode), copies a WRITE view back and frees it: code that reads backend memory
 * directly, or a view after its unmap, sees wrong values (or ASan does). The k-th map or
 * unmap from now can be made to fail, with a message in error(). */
#define SB_MAX 64
static struct { void *host, *p; size_t bytes; int mode; } sb_live[SB_MAX];
static int sb_nlive, sb_peak, sb_fail_map, sb_fail_unmap;
static long sb_nmaps;
static char sb_err[256];
static backend staging_be;

static int sb_map(void **host, void *p, size_t bytes, int mode) {
    *host = NULL;
    if (sb_fail_map > 0 && --sb_fail_map == 0) {
        snprintf(sb_err, sizeof sb_err, "injected map failure (%zu bytes, staging backend)", bytes);
        return PL_EBACKEND;
    }
    if (sb_nlive == SB_MAX) {
        snprintf(sb_err, sizeof sb_err, "more than %d views mapped at once", SB_MAX);
        return PL_ENOMEM;
    }
    void *h = malloc(bytes ? bytes : 1);
    if (!h) {
        snprintf(sb_err, sizeof sb_err, "out of host memory staging %zu bytes", bytes);
        return PL_ENOMEM;
    }
    if (mode & PL_MAP_READ) memcpy(h, p, bytes);
    else memset(h, 0xff, bytes);
    sb_live[sb_nlive].host = h;
    sb_live[sb_nlive].p = p;
    sb_live[sb_nlive].bytes = bytes;
    sb_live[sb_nlive].mode = mode;
    sb_nlive++;
    sb_peak = sb_nlive > sb_peak ? sb_nlive : sb_peak;
    sb_nmaps++;
    *host = h;
    return 0;
}

static int sb_unmap(void *host, void *p, size_t bytes, int mode) {
    int k = 0;
    while (k < sb_nlive && sb_live[k].host != host) k++;
    if (k == sb_nlive || sb_live[k].p != p || sb_live[k].bytes != bytes || sb_live[k].mode != mode) {
        snprintf(sb_err, sizeof sb_err, "unmap of %p (%zu bytes, mode %d) matches no map", host, bytes, mode);
        return PL_EBACKEND;
    }
    int fail = sb_fail_unmap > 0 && --sb_fail_unmap == 0;
    if (fail) snprintf(sb_err, sizeof sb_err, "injected unmap failure (%zu bytes, staging backend)", bytes);
    else if (mode & PL_MAP_WRITE) memcpy(p, host, bytes);
    memset(host, 0xa5, bytes);
    free(host);
    sb_live[k] = sb_live[--sb_nlive];
    return fail ? PL_EBACKEND : 0;
}

static const char *sb_error(void) { return sb_err[0] ? sb_err : backend_cpu.error(); }

static void staging_setup(void) {
    staging_be = backend_cpu;
    staging_be.name = "cpu-staging";
    staging_be.host_memory = 0;
    staging_be.map = sb_map;
    staging_be.unmap = sb_unmap;
    staging_be.error = sb_error;
    sb_nlive = sb_peak = sb_fail_map = sb_fail_unmap = 0;
    sb_nmaps = 0;
    sb_err[0] = 0;
}

/* Through a staging backend (host views are copies): a save and a load are bit-identical to
 * the CPU backend's (the file loads on either), every view is unmapped, one tensor at a
 * time is staged; an injected map or unmap failure fails the save or load with the
 * backend's message and leaves the previous checkpoint latest; llm.c files written from it
 * are byte-identical and load back, and a failed map there is reported too. */
START_TEST(test_staging_backend) {
    char path[1024], path2[1024], err[2048] = "";
    model_config c = small_cfg();
    int split[1] = {c.L};
    staging_setup();
    test_be = &staging_be;
    stage st;
    optim opt;
    whole_stage(&st, &opt, &c);
    fill_state(&st, &opt, 60);
    ck_assert(state_matches(&st, &opt, 60));
    ckpt_meta m = sample_meta(1, 1, split);
    double bytes = 0;
    sb_peak = 0;
    int rc = ckpt_save(tpath("stg"), &st, &opt, &m, 0, MPI_COMM_SELF, path, sizeof path, &bytes, err, sizeof err);
    ck_assert_msg(rc == 0, "save through the staging backend: %s", err);
    ck_assert_int_eq(sb_nlive, 0);
    ck_assert_int_eq(sb_peak, 1);
    ck_assert(bytes == 3.0 * 4.0 * (double)gpt2_num_params(&c));
    ck_assert_int_eq(check_crc_attrs(path, &c), 120);
    /* it loads on the staging backend, and on the CPU backend */
    stage ld;
    optim lopt;
    whole_stage(&ld, &lopt, &c);
    double lbytes = 0;
    rc = ckpt_load(path, &ld, &lopt, NULL, MPI_COMM_SELF, &lbytes, err, sizeof err);
    ck_assert_msg(rc == 0, "load through the staging backend: %s", err);
    ck_assert(state_matches(&ld, &lopt, 60));
    ck_assert(lbytes == bytes);
    ck_assert_int_eq(sb_nlive, 0);
    test_be = &backend_cpu;
    int ok;
    ck_assert_int_eq(load_whole(path, 60, &ok, err, sizeof err), 0);
    ck_assert(ok);
    /* and what the CPU backend saves loads on the staging backend */
    save_whole(tpath("stg_cpu"), 1, 61, 0, path2, sizeof path2);
    test_be = &staging_be;
    ck_assert_int_eq(ckpt_load(path2, &ld, &lopt, NULL, MPI_COMM_SELF, NULL, err, sizeof err), 0);
    ck_assert(state_matches(&ld, &lopt, 61));
    /* injected failures: save (map, unmap), then load (map, unmap) */
    for (int f = 0; f < 4; f++) {
        sb_err[0] = 0;
        long before = sb_nmaps;
        if (f % 2 == 0) sb_fail_map = 7;
        else sb_fail_unmap = 7;
        m.step = 2 + f;
        rc = f < 2 ? ckpt_save(tpath("stg"), &st, &opt, &m, 0, MPI_COMM_SELF, path2, sizeof path2, NULL, err, sizeof err)
                   : ckpt_load(path, &ld, &lopt, NULL, MPI_COMM_SELF, NULL, err, sizeof err);
        ck_assert_int_eq(rc, PL_EBACKEND);
        ck_assert_msg(strstr(err, f % 2 ? "injected unmap failure" : "injected map failure") &&
                      strstr(err, "backend cpu-staging") && strstr(err, "rank 0") && strstr(err, "dataset /"),
                      "failure %d: got: %s", f, err);
        if (f == 0) printf("staging map failure: %s\n", err);
        ck_assert_int_eq(sb_nlive, 0);
        ck_assert(sb_nmaps - before >= 6);
        sb_fail_map = sb_fail_unmap = 0;
    }
    ck_assert_str_eq(slurp(tpath("stg/latest")), "ckpt_00000001.h5\n");
    ck_assert_int_eq(count_named(tpath("stg"), "tmp"), 0);
    ck_assert_int_eq(count_named(tpath("stg"), "ckpt_0"), 1);
    rc = ckpt_load(path, &ld, &lopt, NULL, MPI_COMM_SELF, NULL, err, sizeof err);
    ck_assert_msg(rc == 0 && state_matches(&ld, &lopt, 60), "after the failures: %s", err);
    /* llm.c files: written from the staging backend, byte-identical to the CPU backend's */
    ck_assert_int_eq(llmc_save(tpath("stg.bin"), &st, 0, MPI_COMM_SELF), 0);
    ck_assert_int_eq(sb_nlive, 0);
    test_be = &backend_cpu;
    write_llmc(tpath("stg_cpu.bin"), 60);
    ck_assert(same_bytes(tpath("stg.bin"), tpath("stg_cpu.bin")));
    test_be = &staging_be;
    fill_state(&ld, &lopt, 62);
    ck_assert_int_eq(llmc_load_stage(tpath("stg.bin"), &ld, err, sizeof err), 0);
    ck_assert(buffer_matches(&ld, &lopt, 0, 60));
    ck_assert_int_eq(sb_nlive, 0);
    sb_fail_map = 3;
    rc = llmc_load_stage(tpath("stg.bin"), &ld, err, sizeof err);
    sb_fail_map = 0;
    ck_assert_int_eq(rc, PL_EBACKEND);
    ck_assert_msg(strstr(err, "injected map failure") && strstr(err, "backend cpu-staging") && strstr(err, "stg.bin"),
                  "got: %s", err);
    ck_assert_int_eq(sb_nlive, 0);
    free_stage(&ld, &lopt);
    free_stage(&st, &opt);
    test_be = &backend_cpu;
}
END_TEST

/* All the tests above in one case (they share nothing but the scratch directory). */
static Suite *ckpt_suite(void) {
    Suite *s = suite_create("ckpt");
    TCase *tc = tcase_create("ckpt");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_crc32c);
    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_xfer_modes);
    tcase_add_test(tc, test_load_split);
    tcase_add_test(tc, test_corrupt);
    tcase_add_test(tc, test_mismatch);
    tcase_add_test(tc, test_checksum_kinds);
    tcase_add_test(tc, test_fail_write);
    tcase_add_test(tc, test_fail_rename);
    tcase_add_test(tc, test_fail_bad_mode);
    tcase_add_test(tc, test_keep);
    tcase_add_test(tc, test_resolve);
    tcase_add_test(tc, test_convert_fp32);
    tcase_add_test(tc, test_convert_bf16);
    tcase_add_test(tc, test_no_optim);
    tcase_add_test(tc, test_staging_backend);
    tcase_add_loop_test(tc, test_enospc, 0, 4);
    suite_add_tcase(s, tc);
    return s;
}

/* ---- the multi-rank driver -------------------------------------------------------------- */

static void usage(void) {
    fprintf(stderr,
            "usage (driver mode, under mpiexec -n P):\n"
            "  test_ckpt save DIR STEP SPLIT KEEP SEED   save fill_state(SEED) with SPLIT (blocks per rank)\n"
            "  test_ckpt load PATH|DIR SPLIT SEED STEP   load and check the values and step\n"
            "  test_ckpt mkllmc OUT SEED                 write an llm.c fp32 file of the test model\n"
            "  test_ckpt corrupt FILE DATASET            flip a byte inside DATASET's data\n"
            "  test_ckpt convert IN OUT | inspect FILE   the pipelm subcommands\n"
            "  test_ckpt bench DIR PRESET REPS           time save and load (tiny|tutorial|gpt2)\n");
}

/* Parse "1,2,1" into split; returns the number of stages. */
static int parse_split(const char *s, int *split) {
    int n = 0;
    for (const char *p = s; *p && n < CKPT_MAX_STAGES;) {
        split[n++] = (int)strtol(p, (char **)&p, 10);
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return n;
}

/* The driver's checkpoint settings: train's defaults, from their alias variables
 * (PIPELM_CKPT_XFER ...), as a run takes them. */
static int driver_opts(int rank) {
    pl_options o;
    char err[512];
    config_defaults(&o);
    if (config_check_ckpt(&o, err, sizeof err) != 0) {
        if (rank == 0) fprintf(stderr, "%s\n", err);
        return 2;
    }
    ckpt_opts co;
    ckpt_opts_of(&o, &co);
    ckpt_set_opts(&co);
    return 0;
}

/* save / load / bench over MPI_COMM_WORLD, one stage per rank. */
static int drive(int argc, char **argv) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    const char *cmd = argv[1];
    char err[2048] = "", path[1024] = "";
    if (driver_opts(rank) != 0) return 2;
    const char *be_env = getenv("TEST_CKPT_BACKEND"); /* "staging": the staging backend of the tests */
    if (be_env && strcmp(be_env, "staging") == 0) {
        staging_setup();
        test_be = &staging_be;
    }
    int split[CKPT_MAX_STAGES];
    if (strcmp(cmd, "convert") == 0) return ckpt_convert_main(argc, argv, 2);
    if (strcmp(cmd, "inspect") == 0) return ckpt_inspect_main(argc, argv, 2);
    if (strcmp(cmd, "corrupt") == 0 && argc == 4) {
        if (rank == 0 && corrupt_dataset(argv[2], argv[3]) != 0) {
            fprintf(stderr, "corrupt: cannot find %s in %s\n", argv[3], argv[2]);
            return 1;
        }
        return 0;
    }
    if (strcmp(cmd, "mkllmc") == 0 && argc == 4) {
        if (rank != 0) return 0;
        model_config c = small_cfg();
        stage st;
        optim opt;
        int s1[1] = {c.L};
        if (build_stage(&st, &opt, &c, s1, 1, 0, err, sizeof err)) return 1;
        fill_state(&st, &opt, strtoull(argv[3], NULL, 10));
        int rc = llmc_save(argv[2], &st, 0, MPI_COMM_SELF);
        free_stage(&st, &opt);
        return rc ? 1 : 0;
    }
    if ((strcmp(cmd, "save") == 0 && argc == 7) || (strcmp(cmd, "load") == 0 && argc == 6)) {
        int save = cmd[0] == 's';
        int P = parse_split(argv[save ? 4 : 3], split);
        if (P != size) {
            if (rank == 0) fprintf(stderr, "%s: split %s has %d stages but the job has %d ranks\n", cmd, argv[save ? 4 : 3], P, size);
            return 2;
        }
        model_config c = small_cfg();
        stage st;
        optim opt;
        if (build_stage(&st, &opt, &c, split, P, rank, err, sizeof err)) {
            fprintf(stderr, "rank %d: %s\n", rank, err);
            return 1;
        }
        int rc;
        if (save) {
            fill_state(&st, &opt, strtoull(argv[6], NULL, 10));
            ckpt_meta m = sample_meta(atoll(argv[3]), P, split);
            double bytes = 0, t0 = MPI_Wtime();
            rc = ckpt_save(argv[2], &st, &opt, &m, atoi(argv[5]), MPI_COMM_WORLD, path, sizeof path, &bytes, err,
                           sizeof err);
            if (rc == 0 && rank == 0) printf("saved %s (%.0f bytes in %.3f s)\n", path, bytes, MPI_Wtime() - t0);
        } else {
            ckpt_meta m;
            rc = ckpt_resolve(argv[2], path, sizeof path, err, sizeof err);
            if (rc == 0) rc = ckpt_load(path, &st, &opt, &m, MPI_COMM_WORLD, NULL, err, sizeof err);
            int good = rc == 0 && state_matches(&st, &opt, strtoull(argv[4], NULL, 10)) && m.step == atoll(argv[5]), all;
            MPI_Allreduce(&good, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
            if (rc == 0 && !all) {
                if (rank == 0) fprintf(stderr, "load: %s loaded but its values or step differ\n", path);
                rc = 1;
            } else if (rc == 0 && rank == 0) {
                printf("loaded %s (step %lld) on %d ranks: values identical\n", path, m.step, size);
            }
        }
        if (rc != 0 && rank == 0) pl_error("%s", err);
        free_stage(&st, &opt);
        return rc ? 1 : 0;
    }
    if (strcmp(cmd, "bench") == 0 && argc == 5) {
        model_config c;
        const char *p = argv[3];
        int rc = strcmp(p, "gpt2") == 0       ? gpt2_config_make(&c, 50257, 1024, 12, 12, 768, err, sizeof err)
                 : strcmp(p, "tutorial") == 0 ? gpt2_config_make(&c, 10000, 128, 8, 8, 512, err, sizeof err)
                                              : gpt2_config_make(&c, 256, 64, 4, 4, 64, err, sizeof err);
        if (rc) return 2;
        for (int s = 0; s < size; s++) split[s] = c.L / size + (s < c.L % size);
        stage st;
        optim opt;
        if (build_stage(&st, &opt, &c, split, size, rank, err, sizeof err)) {
            fprintf(stderr, "rank %d: %s\n", rank, err);
            return 1;
        }
        for (int b = 0; b < 3; b++) { /* through host views, whatever test_be is */
            float *buf = optim_buffer(&opt, optim_which[b]);
            void *host = NULL;
            if (test_be->map(&host, buf, st.nparams * sizeof(float), PL_MAP_WRITE) != 0) {
                fprintf(stderr, "rank %d: map: %s\n", rank, test_be->error());
                free_stage(&st, &opt);
                return 1;
            }
            for (size_t i = 0; i < st.nparams; i++) ((float *)host)[i] = (float)(i % 1013) * 1e-3f;
            if (test_be->unmap(host, buf, st.nparams * sizeof(float), PL_MAP_WRITE) != 0) {
                fprintf(stderr, "rank %d: unmap: %s\n", rank, test_be->error());
                free_stage(&st, &opt);
                return 1;
            }
        }
        ckpt_meta m = sample_meta(1, size, split);
        /* keep = 0 and the previous file removed outside the timed part: a save here is the
         * write of one checkpoint, as the POSIX baseline is (pruning an old checkpoint, which
         * keep > 0 adds to a save, is an unlink of its size) */
        int reps = atoi(argv[4]) > 0 ? atoi(argv[4]) : 1;
        double *ts = calloc((size_t)reps, sizeof(double)), best_l = 1e30, bytes = 0, lbytes = 0;
        for (int r = 0; r < reps && rc == 0; r++) {
            m.step = r + 1;
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            rc = ckpt_save(argv[2], &st, &opt, &m, 0, MPI_COMM_WORLD, path, sizeof path, &bytes, err, sizeof err);
            double t1 = MPI_Wtime();
            if (rc == 0) rc = ckpt_load(path, &st, &opt, NULL, MPI_COMM_WORLD, &lbytes, err, sizeof err);
            double t2 = MPI_Wtime();
            ts[r] = t1 - t0;
            best_l = t2 - t1 < best_l ? t2 - t1 : best_l;
            MPI_Barrier(MPI_COMM_WORLD);
            if (rank == 0) unlink(path);
        }
        for (int i = 1; i < reps; i++) /* sort the save times */
            for (int j = i; j > 0 && ts[j] < ts[j - 1]; j--) {
                double t = ts[j];
                ts[j] = ts[j - 1];
                ts[j - 1] = t;
            }
        double best_s = ts[0], med_s = reps % 2 ? ts[reps / 2] : 0.5 * (ts[reps / 2 - 1] + ts[reps / 2]);
        free(ts);
        if (rc == 0 && rank == 0)
            printf("ckpt ranks=%d bytes=%.0f save_s=%.4f save_MBps=%.1f save_median_MBps=%.1f load_s=%.4f "
                   "load_MBps=%.1f\n", size, bytes, best_s, bytes / best_s / 1e6, bytes / med_s / 1e6, best_l,
                   lbytes / best_l / 1e6);
        if (rc && rank == 0) pl_error("%s", err);
        /* per-rank payload, for the POSIX comparison */
        double mine = 0;
        for (int i = 0; i < st.ntensors; i++)
            if (st.tensors[i].kind != P_WTE || st.has_embed) mine += 3.0 * 4.0 * (double)st.tensors[i].numel;
        if (rc == 0) {
            double *all = rank == 0 ? malloc(sizeof(double) * size) : NULL;
            MPI_Gather(&mine, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
            if (rank == 0) {
                printf("rank_bytes=");
                for (int s = 0; s < size; s++) printf("%s%.0f", s ? "," : "", all[s]);
                printf("\n");
                free(all);
            }
        }
        free_stage(&st, &opt);
        return rc ? 1 : 0;
    }
    if (rank == 0) usage();
    return 2;
}

/* No arguments: the Check suite (one process, CK_NOFORK); with arguments: the driver. */
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &pl_rank);
    int status;
    if (argc > 1) {
        status = drive(argc, argv);
    } else {
        snprintf(tmpdir, sizeof tmpdir, "%s/pipelm_ckpt.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        if (!mkdtemp(tmpdir)) {
            perror("mkdtemp");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        SRunner *sr = srunner_create(ckpt_suite());
        srunner_set_fork_status(sr, CK_NOFORK);
        srunner_run_all(sr, CK_NORMAL);
        status = srunner_ntests_failed(sr) ? 1 : 0;
        srunner_free(sr);
        char cmd[600];
        snprintf(cmd, sizeof cmd, "umount '%s/tiny' 2>/dev/null; rm -rf '%s'", tmpdir, tmpdir);
        if (system(cmd) != 0) { /* best effort */ }
    }
    MPI_Finalize();
    return status;
}
