/*
 * test_model.c — whole-model and module tests: the model's gradient against finite
 * differences, the LR schedule, data and model-file loaders on good and broken files, the
 * Markov source's entropy floor, config parsing, stage splits, determinism, and learning
 * (the tiny preset reaches the entropy floor + 0.25 nats). Runs as one MPI process.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <mpi.h>
#include "pipelm/common.h"
#include "pipelm/config.h"
#include "pipelm/data.h"
#include "pipelm/llmc.h"
#include "pipelm/model.h"
#include "pipelm/pipelm.h"
#include "pipelm/rng.h"
#include "pipelm/split.h"
#include "pipelm/train.h"

static char tmpdir[256];

/* A file name inside the test's scratch directory. */
static const char *tpath(const char *name) {
    static char buf[8][512];
    static int k = 0;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

/* Fill every parameter with N(0, std) noise (LayerNorm weights around 1) so that every
 * gradient is non-trivial. */
static void randomize_params(stage *st, float std, unsigned long long seed) {
    rng_state r;
    rng_seed(&r, seed, 7);
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        float *p = st->params + t->offset;
        int lnw = t->kind == P_LN1W || t->kind == P_LN2W || t->kind == P_LNFW;
        for (size_t k = 0; k < t->numel; k++) p[k] = (lnw ? 1.0f : 0.0f) + std * rng_normal(&r);
        if (t->kind == P_WTE)
            memset(p + (size_t)st->cfg.V * st->cfg.C, 0, (size_t)(st->cfg.Vp - st->cfg.V) * st->cfg.C * sizeof(float));
    }
}

/* Mean loss of one batch (forward only). */
static double model_loss(stage *st, const int *tok, const int *tgt) {
    double sum;
    int slot;
    stage_forward(st, 0, tok, NULL, tgt, 0.0f, &sum, &slot);
    stage_release_all(st);
    return sum / st->N;
}

/* Gradient of the whole model (one stage holding everything) against central differences
 * on a few elements of every tensor. Tolerance: |analytic - numeric| <= 2e-3 + 3e-2 |numeric|
 * with h = 1e-2 on float32 (the numeric estimate's noise is ~1e-4 here); a gradient off by
 * 10% on any checked element fails. */
START_TEST(test_model_gradcheck) {
    gpt2_config cfg;
    char err[256];
    ck_assert_int_eq(gpt2_config_make(&cfg, 37, 9, 2, 3, 12, err, sizeof err), 0);
    stage st;
    int B = 2, T = 7, N = B * T;
    ck_assert_int_eq(stage_init(&st, &cfg, 0, 2, 1, 1, B, T, 1, &backend_cpu, err, sizeof err), 0);
    randomize_params(&st, 0.3f, 11);
    int tok[14], tgt[14];
    rng_state r;
    rng_seed(&r, 3, 3);
    for (int i = 0; i < N; i++) { tok[i] = (int)(rng_u64(&r) % 37); tgt[i] = (int)(rng_u64(&r) % 37); }
    stage_zero_grads(&st);
    double sum;
    int slot;
    ck_assert_int_eq(stage_forward(&st, 0, tok, NULL, tgt, 1.0f / N, &sum, &slot), 0);
    ck_assert_int_eq(stage_backward(&st, slot, NULL), 0);
    stage_tied_grads_local(&st);
    int checked = 0;
    for (int i = 0; i < st.ntensors; i++) {
        const param_tensor *t = &st.tensors[i];
        for (int k = 0; k < 4; k++) {
            size_t idx = (size_t)(rng_u64(&r) % t->numel);
            if (t->kind == P_WTE) idx = (size_t)(rng_u64(&r) % ((size_t)cfg.V * cfg.C));
            float *p = st.params + t->offset + idx, orig = *p, h = 1e-2f;
            *p = orig + h;
            double lp = model_loss(&st, tok, tgt);
            *p = orig - h;
            double lm = model_loss(&st, tok, tgt);
            *p = orig;
            double num = (lp - lm) / (2.0 * h), ana = st.grads[t->offset + idx];
            ck_assert_msg(fabs(ana - num) <= 2e-3 + 3e-2 * fabs(num),
                          "%s[%zu]: analytic %.6g numeric %.6g", t->name, idx, ana, num);
            checked++;
        }
    }
    ck_assert_int_ge(checked, 4 * 28);
    /* padded vocabulary rows get no gradient */
    for (size_t k = (size_t)cfg.V * cfg.C; k < (size_t)cfg.Vp * cfg.C; k++) ck_assert(st.dwte[k] == 0.0f);
    stage_free(&st);
}
END_TEST

/* Warm-up then cosine to min_lr; constant after warm-up. Values computed by hand. */
START_TEST(test_lr_schedule) {
    pl_options o;
    config_defaults(&o);
    o.lr = 1e-3; o.min_lr = 1e-4; o.warmup_steps = 10; o.steps = 110;
    strcpy(o.lr_schedule, "cosine");
    ck_assert(fabs(train_lr(&o, 1) - 1e-4) < 1e-15);   /* 1e-3 * 1/10 */
    ck_assert(fabs(train_lr(&o, 10) - 1e-3) < 1e-15);
    ck_assert(fabs(train_lr(&o, 60) - 5.5e-4) < 1e-12); /* halfway: (1e-3 + 1e-4)/2 */
    ck_assert(fabs(train_lr(&o, 110) - 1e-4) < 1e-15);
    /* a quarter of the way: min + (max-min)(1 + cos(pi/4))/2 = 1e-4 + 9e-4 * 0.8535534 */
    ck_assert(fabs(train_lr(&o, 35) - 8.68198052e-4) < 1e-11);
    strcpy(o.lr_schedule, "constant");
    ck_assert(fabs(train_lr(&o, 5) - 5e-4) < 1e-15);
    ck_assert(fabs(train_lr(&o, 100) - 1e-3) < 1e-15);
}
END_TEST

/* Write raw bytes to a scratch file. */
static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* Open with the given spec and check the error mentions `needle` (or success if NULL). */
static void expect_open(const char *spec, int V, int B, int T, const char *needle) {
    data_source d;
    char err[1024] = "";
    int rc = data_open(&d, spec, V, 4, 1, 0, err, sizeof err);
    if (rc == 0) rc = data_check_batch(&d, B, T, err, sizeof err);
    if (needle) {
        ck_assert_msg(rc != 0, "%s: expected an error with '%s'", spec, needle);
        ck_assert_msg(strstr(err, needle) != NULL, "%s: error '%s' lacks '%s'", spec, err, needle);
        ck_assert_msg(strstr(err, spec + (strncmp(spec, "text:", 5) ? 0 : 5)) != NULL || strstr(err, "data") != NULL,
                      "error '%s' does not name the file", err);
    } else {
        ck_assert_msg(rc == 0, "%s: unexpected error %s", spec, err);
    }
    if (rc == 0) data_close(&d);
}

START_TEST(test_token_loader) {
    uint16_t tok[1000];
    for (int i = 0; i < 1000; i++) tok[i] = (uint16_t)(i * 7 % 50);
    ck_assert_int_eq(data_write_tokens(tpath("good.bin"), tok, 1000), 0);
    expect_open(tpath("good.bin"), 50, 4, 16, NULL);
    /* batches in file order, wrapping */
    data_source d;
    char err[256];
    ck_assert_int_eq(data_open(&d, tpath("good.bin"), 50, 4, 1, 0, err, sizeof err), 0);
    int in[64], tg[64];
    data_batch(&d, 1, 4, 16, in, tg);
    for (int i = 0; i < 64; i++) { ck_assert_int_eq(in[i], tok[64 + i]); ck_assert_int_eq(tg[i], tok[65 + i]); }
    data_batch(&d, 15, 4, 16, in, tg); /* 999/64 = 15 whole batches: step 15 wraps to batch 0 */
    ck_assert_int_eq(in[0], tok[0]);
    data_close(&d);
    /* token out of range: the same file, vocabulary 40 */
    expect_open(tpath("good.bin"), 40, 4, 16, ">= the vocabulary");
    /* missing */
    expect_open(tpath("missing.bin"), 50, 4, 16, "No such file");
    /* truncated: header says 1000 tokens, file is shorter */
    FILE *f = fopen(tpath("good.bin"), "rb");
    char buf[2000];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    write_bytes(tpath("trunc.bin"), buf, n - 10);
    expect_open(tpath("trunc.bin"), 50, 4, 16, "header says 1000 tokens");
    /* wrong magic and version */
    int32_t h[256] = {12345, 1, 0};
    write_bytes(tpath("magic.bin"), h, sizeof h);
    expect_open(tpath("magic.bin"), 50, 4, 16, "bad magic");
    h[0] = 20240520; h[1] = 7;
    write_bytes(tpath("version.bin"), h, sizeof h);
    expect_open(tpath("version.bin"), 50, 4, 16, "version");
    /* too few tokens for one batch */
    ck_assert_int_eq(data_write_tokens(tpath("small.bin"), tok, 30), 0);
    expect_open(tpath("small.bin"), 50, 4, 16, "fewer than one batch");
    /* text */
    write_bytes(tpath("t.txt"), "hello, world\n", 13);
    char spec[600];
    snprintf(spec, sizeof spec, "text:%s", tpath("t.txt"));
    expect_open(spec, 256, 1, 8, NULL);
    expect_open(spec, 256, 2, 8, "fewer than one batch");
}
END_TEST

/* The Markov source: stationary, entropy matches the empirical loss of the true model. */
START_TEST(test_markov_entropy) {
    data_source d;
    char err[256];
    ck_assert_int_eq(data_open(&d, "markov", 64, 4, 5, 0, err, sizeof err), 0);
    ck_assert(isfinite(d.entropy) && d.entropy > 0.1 && d.entropy < log(4.0));
    int B = 64, T = 64, in[64 * 64], tg[64 * 64];
    double nll = 0;
    long count = 0;
    for (int k = 0; k < 20; k++) {
        data_batch(&d, k, B, T, in, tg);
        for (int i = 0; i < B * T; i++) {
            int c = in[i], hit = -1;
            for (int j = 0; j < d.branch; j++) if (d.succ[c * d.branch + j] == tg[i]) hit = j;
            ck_assert_int_ge(hit, 0); /* every transition is allowed by the chain */
            float lo = hit ? d.cdf[c * d.branch + hit - 1] : 0.0f;
            nll -= log((double)d.cdf[c * d.branch + hit] - lo);
            count++;
        }
    }
    nll /= count;
    ck_assert_msg(fabs(nll - d.entropy) < 0.03, "empirical %.4f vs entropy %.4f", nll, d.entropy);
    /* batches are a pure function of k */
    int in2[64 * 64], tg2[64 * 64];
    data_batch(&d, 3, B, T, in, tg);
    data_batch(&d, 3, B, T, in2, tg2);
    ck_assert_int_eq(memcmp(in, in2, sizeof in), 0);
    data_close(&d);
}
END_TEST

/* llm.c model file: save (collective on one rank), read back, and refuse broken files. */
START_TEST(test_model_file) {
    gpt2_config cfg;
    char err[512];
    ck_assert_int_eq(gpt2_config_make(&cfg, 37, 9, 2, 3, 12, err, sizeof err), 0);
    stage a, b;
    ck_assert_int_eq(stage_init(&a, &cfg, 0, 2, 1, 1, 1, 9, 1, &backend_cpu, err, sizeof err), 0);
    ck_assert_int_eq(stage_init(&b, &cfg, 0, 2, 1, 1, 1, 9, 1, &backend_cpu, err, sizeof err), 0);
    randomize_params(&a, 0.1f, 5);
    ck_assert_int_eq(llmc_save(tpath("m.bin"), &a, 0, MPI_COMM_SELF), 0);
    ck_assert_int_eq(llmc_load_stage(tpath("m.bin"), &b, err, sizeof err), 0);
    ck_assert_int_eq(memcmp(a.params, b.params, a.nparams * sizeof(float)), 0);
    /* size as llm.c counts it */
    FILE *f = fopen(tpath("m.bin"), "rb");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    ck_assert_int_eq(size, 1024 + 4 * (long)gpt2_num_params(&cfg));
    /* truncated */
    char *buf = malloc(size);
    fseek(f, 0, SEEK_SET);
    ck_assert_int_eq(fread(buf, 1, size, f), size);
    fclose(f);
    write_bytes(tpath("mt.bin"), buf, size - 4);
    int v;
    gpt2_config c2;
    ck_assert_int_ne(llmc_read_config(tpath("mt.bin"), &c2, &v, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "bytes"));
    ((int32_t *)buf)[0] = 1;
    write_bytes(tpath("mm.bin"), buf, size);
    ck_assert_int_ne(llmc_read_config(tpath("mm.bin"), &c2, &v, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "bad magic"));
    free(buf);
    /* a config mismatch names the setting and both values */
    gpt2_config other;
    stage c;
    ck_assert_int_eq(gpt2_config_make(&other, 37, 9, 2, 3, 15, err, sizeof err), 0);
    ck_assert_int_eq(stage_init(&c, &other, 0, 2, 1, 1, 1, 9, 1, &backend_cpu, err, sizeof err), 0);
    ck_assert_int_ne(llmc_load_stage(tpath("m.bin"), &c, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "n-embd is 12 in the file but 15") != NULL, "%s", err);
    stage_free(&a);
    stage_free(&b);
    stage_free(&c);
}
END_TEST

/* Defaults < preset < config file < command line; unknown names and bad values refused. */
START_TEST(test_config) {
    const char *ini = tpath("c.ini");
    FILE *f = fopen(ini, "w");
    fprintf(f, "# comment\n[train]\npreset = tutorial\nlr = 0.002\nbatch = 4\nseq_len = 32\n");
    fclose(f);
    pl_options o;
    char err[1024];
    config_defaults(&o);
    char *argv[] = {"pipelm", "train", "--config", (char *)ini, "--batch=6", "--steps", "7"};
    ck_assert_int_eq(config_parse(&o, 7, argv, 2, 0, err, sizeof err), 0);
    ck_assert_str_eq(o.preset, "tutorial");
    ck_assert_int_eq(o.n_embd, 512);      /* from the preset */
    ck_assert(fabs(o.lr - 0.002) < 1e-15); /* file beats preset */
    ck_assert_int_eq(o.seq_len, 32);      /* seq_len and seq-len are one name */
    ck_assert_int_eq(o.batch, 6);         /* command line beats file */
    ck_assert_int_eq(o.steps, 7);
    config_defaults(&o);
    char *bad1[] = {"pipelm", "train", "--bogus", "1"};
    ck_assert_int_ne(config_parse(&o, 4, bad1, 2, 0, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "--bogus"));
    char *bad2[] = {"pipelm", "train", "--lr", "fast"};
    ck_assert_int_ne(config_parse(&o, 4, bad2, 2, 0, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "'fast'"));
    ck_assert_ptr_nonnull(strstr(err, "--lr"));
    char *bad3[] = {"pipelm", "train", "--batch", "6", "--microbatches", "4"};
    config_defaults(&o);
    ck_assert_int_eq(config_parse(&o, 6, bad3, 2, 0, err, sizeof err), 0);
    ck_assert_int_ne(config_validate(&o, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "not divisible"));
    f = fopen(ini, "w");
    fprintf(f, "colour = blue\n");
    fclose(f);
    char *bad4[] = {"pipelm", "train", "--config", (char *)ini};
    config_defaults(&o);
    ck_assert_int_ne(config_parse(&o, 4, bad4, 2, 0, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "colour"));
}
END_TEST

/* Automatic splits cover every block once; explicit specs are checked. */
START_TEST(test_split) {
    gpt2_config cfg;
    char err[512];
    gpt2_config_make(&cfg, 50257, 1024, 12, 12, 768, err, sizeof err);
    for (int P = 1; P <= 8; P++) {
        split sp;
        ck_assert_int_eq(split_make(&sp, "auto", &cfg, P, 4, 1, 1024, err, sizeof err), 0);
        int sum = 0;
        for (int s = 0; s < P; s++) {
            sum += sp.blocks[s];
            if (s > 0 && s < P - 1) ck_assert_int_ge(sp.blocks[s], 1);
        }
        ck_assert_int_eq(sum, 12);
        /* the head is expensive on GPT-2: the last stage gets fewer blocks than the middle */
        if (P >= 3) ck_assert_int_lt(sp.blocks[P - 1], sp.blocks[1]);
        split_free(&sp);
    }
    split sp;
    ck_assert_int_eq(split_make(&sp, "5,0,7", &cfg, 3, 4, 1, 1024, err, sizeof err), PL_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "middle stage 1"));
    ck_assert_int_eq(split_make(&sp, "4,4", &cfg, 2, 4, 1, 1024, err, sizeof err), PL_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "adds up to 8"));
    ck_assert_int_eq(split_make(&sp, "4,4,4", &cfg, 2, 4, 1, 1024, err, sizeof err), PL_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "3 stages but there are 2 ranks"));
    ck_assert_int_eq(split_make(&sp, "4,-1,9", &cfg, 3, 4, 1, 1024, err, sizeof err), PL_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "negative"));
    ck_assert_int_eq(split_make(&sp, "0,12", &cfg, 2, 4, 1, 1024, err, sizeof err), 0);
    ck_assert_int_eq(sp.first[1], 0);
    split_free(&sp);
}
END_TEST

/* Run `pipelm train ARGS... --metrics FILE` on MPI_COMM_SELF; return the exit status. */
static int run_pipelm(const char *metrics, const char *extra) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "pipelm train --metrics %s --progress 0 --log-every 1000 %s", metrics, extra);
    char *argv[64];
    int argc = 0;
    for (char *tok = strtok(cmd, " "); tok && argc < 63; tok = strtok(NULL, " ")) argv[argc++] = tok;
    argv[argc] = NULL;
    FILE *devnull = fopen("/dev/null", "w");
    int abort_needed;
    int rc = pipelm_main(argc, argv, MPI_COMM_SELF, devnull, &abort_needed);
    fclose(devnull);
    return rc;
}

/* Read the "loss" values of the step lines of a metrics file. */
static int read_losses(const char *path, double *loss, int max) {
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[8192];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < max) {
        if (!strstr(line, "\"event\":\"step\"")) continue;
        char *p = strstr(line, "\"loss\":");
        ck_assert_ptr_nonnull(p);
        loss[n++] = strtod(p + 7, NULL);
    }
    fclose(f);
    return n;
}

/* Same seed and settings: bit-identical losses. */
START_TEST(test_determinism) {
    ck_assert_int_eq(run_pipelm(tpath("d1.jsonl"), "--steps 5 --microbatches 2"), 0);
    ck_assert_int_eq(run_pipelm(tpath("d2.jsonl"), "--steps 5 --microbatches 2"), 0);
    double a[8], b[8];
    ck_assert_int_eq(read_losses(tpath("d1.jsonl"), a, 8), 5);
    ck_assert_int_eq(read_losses(tpath("d2.jsonl"), b, 8), 5);
    ck_assert_int_eq(memcmp(a, b, sizeof(double) * 5), 0);
}
END_TEST

/* The tiny preset at its defaults learns the Markov chain to within 0.25 nats of its floor. */
START_TEST(test_learning) {
    const char *m = tpath("learn.jsonl");
    ck_assert_int_eq(run_pipelm(m, ""), 0);
    double loss[512];
    int n = read_losses(m, loss, 512);
    ck_assert_int_eq(n, 400);
    FILE *f = fopen(m, "r");
    char line[16384];
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    fclose(f);
    char *p = strstr(line, "\"entropy_floor\":");
    ck_assert_ptr_nonnull(p);
    double floor_ = strtod(p + 16, NULL);
    double mean = 0;
    for (int i = n - 20; i < n; i++) mean += loss[i] / 20;
    fprintf(stderr, "learning: first loss %.4f, mean of last 20 %.4f, entropy floor %.4f\n", loss[0], mean, floor_);
    ck_assert_msg(mean < floor_ + 0.25, "mean of last 20 losses %.4f not below floor %.4f + 0.25", mean, floor_);
    ck_assert(loss[0] > floor_ + 3.0); /* and it did have to learn */
}
END_TEST

static Suite *model_suite(void) {
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_model_gradcheck);
    tcase_add_test(tc, test_lr_schedule);
    tcase_add_test(tc, test_token_loader);
    tcase_add_test(tc, test_markov_entropy);
    tcase_add_test(tc, test_model_file);
    tcase_add_test(tc, test_config);
    tcase_add_test(tc, test_split);
    tcase_add_test(tc, test_determinism);
    tcase_add_test(tc, test_learning);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    pl_rank = 0;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pipelm_test_model.XXXXXX");
    if (!mkdtemp(tmpdir)) return 99;
    backend_cpu_set_threads(1);
    SRunner *sr = srunner_create(model_suite());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    MPI_Finalize();
    return failed ? 1 : 0;
}
