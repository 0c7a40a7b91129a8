/*
 * test_model.c — whole-model and module tests: the model's gradient against finite
 * differences, the LR schedule, data and model-file loaders on good and broken files, the
 * Markov source's entropy floor, config parsing, stage splits, determinism, learning (the
 * tiny preset reaches the entropy floor + 0.25 nats), and the architecture tables (counts,
 * file sizes and activation bytes against formulas written out here). Runs as one MPI process.
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
#include <sys/stat.h>
#include <time.h>
#include <mpi.h>
#include "model/arch.h"
#include "util/common.h"
#include "cli/config.h"
#include "formats/data.h"
#include "util/files.h"
#include "formats/llmc.h"
#include "model/stage.h"
#include "cli/pipelm.h"
#include "util/rng.h"
#include "pipeline/split.h"
#include "run/train.h"

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
    model_config cfg;
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
    o.hp.lr = 1e-3; o.hp.min_lr = 1e-4; o.hp.warmup_steps = 10; o.hp.total_steps = 110;
    strcpy(o.hp.lr_schedule, "cosine");
    ck_assert(fabs(train_lr(&o, 1) - 1e-4) < 1e-15);   /* 1e-3 * 1/10 */
    ck_assert(fabs(train_lr(&o, 10) - 1e-3) < 1e-15);
    ck_assert(fabs(train_lr(&o, 60) - 5.5e-4) < 1e-12); /* halfway: (1e-3 + 1e-4)/2 */
    ck_assert(fabs(train_lr(&o, 110) - 1e-4) < 1e-15);
    /* a quarter of the way: min + (max-min)(1 + cos(pi/4))/2 = 1e-4 + 9e-4 * 0.8535534 */
    ck_assert(fabs(train_lr(&o, 35) - 8.68198052e-4) < 1e-11);
    strcpy(o.hp.lr_schedule, "constant");
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
    ck_assert(data_read_batch(&d, 1, 4, 16, in, tg, err, sizeof err) == PL_OK);
    for (int i = 0; i < 64; i++) { ck_assert_int_eq(in[i], tok[64 + i]); ck_assert_int_eq(tg[i], tok[65 + i]); }
    ck_assert(data_read_batch(&d, 15, 4, 16, in, tg, err, sizeof err) == PL_OK); /* 999/64 = 15 whole batches: step 15 wraps to batch 0 */
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
        ck_assert(data_read_batch(&d, k, B, T, in, tg, err, sizeof err) == PL_OK);
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
    ck_assert(data_read_batch(&d, 3, B, T, in, tg, err, sizeof err) == PL_OK);
    ck_assert(data_read_batch(&d, 3, B, T, in2, tg2, err, sizeof err) == PL_OK);
    ck_assert_int_eq(memcmp(in, in2, sizeof in), 0);
    data_close(&d);
}
END_TEST

/* llm.c model file: save (collective on one rank), read back, and refuse broken files. */
START_TEST(test_model_file) {
    model_config cfg;
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
    model_config c2;
    ck_assert_int_ne(llmc_read_config(tpath("mt.bin"), &c2, &v, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "bytes"));
    ((int32_t *)buf)[0] = 1;
    write_bytes(tpath("mm.bin"), buf, size);
    ck_assert_int_ne(llmc_read_config(tpath("mm.bin"), &c2, &v, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "bad magic"));
    free(buf);
    /* a config mismatch names the setting and both values */
    model_config other;
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
    fprintf(f, "# comment\r\n  preset = tutorial\nlr = 0.002 ; inline comment\nbatch = 4\r\nseq_len = 32\n");
    fclose(f);
    pl_options o;
    char err[1024];
    config_defaults(&o);
    char *argv[] = {"pipelm", "train", "--config", (char *)ini, "--batch=6", "--steps", "7"};
    ck_assert_int_eq(config_parse(&o, 7, argv, 2, 0, err, sizeof err), 0);
    ck_assert_str_eq(o.preset, "tutorial");
    ck_assert_int_eq(o.n_embd, 512);      /* from the preset */
    ck_assert(fabs(o.hp.lr - 0.002) < 1e-15); /* file beats preset */
    ck_assert_int_eq(o.seq_len, 32);      /* seq_len and seq-len are one name */
    ck_assert_int_eq(o.batch, 6);         /* command line beats file */
    ck_assert_int_eq(o.hp.total_steps, 7);
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
    model_config cfg;
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
    ck_assert_ptr_nonnull(strstr(err, "3 stages but the pipeline has 2"));
    ck_assert_int_eq(split_make(&sp, "4,-1,9", &cfg, 3, 4, 1, 1024, err, sizeof err), PL_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "negative"));
    ck_assert_int_eq(split_make(&sp, "0,12", &cfg, 2, 4, 1, 1024, err, sizeof err), 0);
    ck_assert_int_eq(sp.first[1], 0);
    split_free(&sp);
}
END_TEST

/* The busiest rank's forward FLOPs per token of a split over P ranks x V chunks (stage s on
 * rank s mod P). */
static double busiest_rank(const split *sp, const model_config *c, int P) {
    double worst = 0;
    for (int r = 0; r < P; r++) {
        double load = 0;
        for (int s = r; s < sp->P; s += P) load += split_stage_flops(sp, c, s, 1024);
        if (load > worst) worst = load;
    }
    return worst;
}

/* Every split of the blocks over the stages (middle ones >= 1): the least busiest-rank load. */
static double best_by_search(split *sp, const model_config *c, int P, int s, int left) {
    if (s == sp->P - 1) {
        sp->blocks[s] = left;
        return busiest_rank(sp, c, P);
    }
    double best = 1e300;
    for (int n = s > 0 ? 1 : 0; n <= left - (sp->P - 2 - s > 0 ? sp->P - 2 - s : 0); n++) {
        sp->blocks[s] = n;
        double v = best_by_search(sp, c, P, s + 1, left - n);
        if (v < best) best = v;
    }
    return best;
}

/* "auto" with chunks: a valid split whose busiest rank is as light as an exhaustive search
 * finds, and within 1.5 blocks of the ideal per rank on GPT-2 124M. */
START_TEST(test_split_chunks) {
    char err[512];
    model_config cfgs[2];
    gpt2_config_make(&cfgs[0], 10000, 128, 8, 8, 512, err, sizeof err);    /* the tutorial preset */
    gpt2_config_make(&cfgs[1], 50257, 1024, 12, 12, 768, err, sizeof err); /* GPT-2 124M */
    for (int k = 0; k < 2; k++) {
        const model_config *c = &cfgs[k];
        for (int P = 2; P <= 4; P++)
            for (int V = 2; V <= 3; V++) {
                if (P * V - 2 > c->L) continue;
                split sp, probe;
                ck_assert_int_eq(split_make_chunks(&sp, "auto", c, P, V, 8, 1, 1024, err, sizeof err), 0);
                ck_assert_int_eq(sp.P, P * V);
                int sum = 0;
                for (int s = 0; s < sp.P; s++) {
                    sum += sp.blocks[s];
                    if (s > 0 && s < sp.P - 1) ck_assert_int_ge(sp.blocks[s], 1);
                    ck_assert_int_eq(sp.first[s], sum - sp.blocks[s]);
                }
                ck_assert_int_eq(sum, c->L);
                ck_assert_int_eq(split_make(&probe, "auto", c, P * V, 8, 1, 1024, err, sizeof err), 0);
                if (P * V <= 6) { /* the exhaustive search is small enough */
                    double best = best_by_search(&probe, c, P, 0, c->L);
                    ck_assert_msg(busiest_rank(&sp, c, P) <= best * (1 + 1e-12),
                                  "P=%d V=%d: busiest rank %g, search found %g", P, V, busiest_rank(&sp, c, P), best);
                }
                split_free(&probe);
                split_free(&sp);
            }
    }
    split sp;
    ck_assert_int_eq(split_make_chunks(&sp, "1,2,3", &cfgs[0], 2, 2, 8, 1, 128, err, sizeof err), PL_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "3 stages but the pipeline has 4"));
    ck_assert_int_eq(split_make_chunks(&sp, "0,3,3,2", &cfgs[0], 2, 2, 8, 1, 128, err, sizeof err), 0);
    ck_assert_int_eq(sp.first[3], 6);
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


/* Parse a config file holding `text` (plus argv extras); return the status, err filled. */
static int parse_ini_text(const char *text, char *err, size_t errlen) {
    const char *ini = tpath("bad.ini");
    FILE *f = fopen(ini, "wb");
    ck_assert_ptr_nonnull(f);
    fwrite(text, 1, strlen(text), f);
    fclose(f);
    pl_options o;
    config_defaults(&o);
    char *argv[] = {"pipelm", "train", "--config", (char *)ini};
    return config_parse(&o, 4, argv, 2, 0, err, errlen);
}

/* Expect a refusal whose message holds every needle. */
#define EXPECT_REFUSED(rc, err, ...)                                                            \
    do {                                                                                        \
        const char *needles_[] = {__VA_ARGS__};                                                 \
        ck_assert_msg((rc) != 0, "accepted; expected an error with '%s'", needles_[0]);         \
        for (size_t i_ = 0; i_ < sizeof needles_ / sizeof needles_[0]; i_++)                    \
            ck_assert_msg(strstr(err, needles_[i_]) != NULL, "error '%s' lacks '%s'", err, needles_[i_]); \
    } while (0)

/* Values that strtod/strtol would accept but mean something else, and config files with
 * sections, duplicates, bad lines and binary: refused, naming the line. */
START_TEST(test_config_refusals) {
    pl_options o;
    char err[1024];
    const char *bad_cli[][2] = {{"--lr", "0x10"}, {"--lr", "inf"}, {"--lr", "nan"}, {"--lr", "1e999"},
                                {"--steps", "0x10"}, {"--steps", " 5"}, {"--steps", "5 "}, {"--seed", "1e3"},
                                {"--beta1", "0x1p-1"}, {"--steps", "99999999999"}};
    for (size_t i = 0; i < sizeof bad_cli / sizeof bad_cli[0]; i++) {
        config_defaults(&o);
        char *argv[] = {"pipelm", "train", (char *)bad_cli[i][0], (char *)bad_cli[i][1]};
        int rc = config_parse(&o, 4, argv, 2, 0, err, sizeof err);
        EXPECT_REFUSED(rc, err, "bad value", bad_cli[i][0]);
    }
    config_defaults(&o);
    char *good[] = {"pipelm", "train", "--lr", "-1.5e-3", "--steps", "+12", "--min-lr", ".5"};
    ck_assert_int_eq(config_parse(&o, 8, good, 2, 0, err, sizeof err), 0);
    ck_assert(o.hp.lr == -1.5e-3 && o.hp.total_steps == 12 && o.hp.min_lr == 0.5);
    int rc = parse_ini_text("steps = 3\n[train]\nbatch = 4\n", err, sizeof err);
    EXPECT_REFUSED(rc, err, "line 2", "[train]", "sections");
    rc = parse_ini_text("steps = 3\n# c\nbatch = 4\nsteps = 5\n", err, sizeof err);
    EXPECT_REFUSED(rc, err, "line 4", "'steps' is set twice (first on line 1)");
    rc = parse_ini_text("steps = 3\nseq-len = 8\nseq_len = 9\n", err, sizeof err);
    EXPECT_REFUSED(rc, err, "line 3", "set twice");
    rc = parse_ini_text("\n\nlr = 0x10\n", err, sizeof err);
    EXPECT_REFUSED(rc, err, "line 3", "'0x10'", "--lr");
    rc = parse_ini_text("steps = 3\n\n\nthis is not a setting\n", err, sizeof err);
    EXPECT_REFUSED(rc, err, "line 4", "not a `name = value` line");
    rc = parse_ini_text("steps = 3\nbatch\x01\xff = 2\n", err, sizeof err);
    EXPECT_REFUSED(rc, err, "line 2", "\\x01");
    for (const char *c = err; *c; c++) ck_assert_msg((unsigned char)*c >= 0x20 && (unsigned char)*c < 0x7f, "raw byte in '%s'", err);
    rc = parse_ini_text("colour\xfe = 1\n", err, sizeof err);
    EXPECT_REFUSED(rc, err, "line 1", "unknown setting 'colour\\xfe'");
    /* special files: a directory, /dev/zero, a FIFO are refused at once, naming the type */
    const char *specials[][2] = {{"/dev/zero", "character device"}, {"/tmp", "directory"}};
    for (int i = 0; i < 2; i++) {
        config_defaults(&o);
        char *argv[] = {"pipelm", "train", "--config", (char *)specials[i][0]};
        rc = config_parse(&o, 4, argv, 2, 0, err, sizeof err);
        EXPECT_REFUSED(rc, err, "config file", specials[i][0], specials[i][1]);
    }
    const char *fifo = tpath("cfg.fifo");
    unlink(fifo);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    config_defaults(&o);
    char *fa[] = {"pipelm", "train", "--config", (char *)fifo};
    rc = config_parse(&o, 4, fa, 2, 0, err, sizeof err);
    EXPECT_REFUSED(rc, err, "config file", "FIFO");
    /* larger than 1 MiB */
    FILE *f = fopen(tpath("big.ini"), "w");
    for (int i = 0; i < 70000; i++) fprintf(f, "# padding line %d\n", i);
    fclose(f);
    config_defaults(&o);
    char *ba[] = {"pipelm", "train", "--config", (char *)tpath("big.ini")};
    rc = config_parse(&o, 4, ba, 2, 0, err, sizeof err);
    EXPECT_REFUSED(rc, err, "big.ini", "bytes");
}
END_TEST

/* The file checks of files.h on every kind of special file. */
START_TEST(test_file_checks) {
    char err[1024];
    FILE *f = NULL;
    char fifo[512];
    snprintf(fifo, sizeof fifo, "%s", tpath("in.fifo"));
    unlink(fifo);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    EXPECT_REFUSED(pl_open_input(fifo, "data file", 0, &f, err, sizeof err), err, "data file", "in.fifo", "FIFO");
    EXPECT_REFUSED(pl_check_input_file("/dev/zero", "model file", err, sizeof err), err, "model file /dev/zero", "device");
    EXPECT_REFUSED(pl_check_input_file(tmpdir, "checkpoint", err, sizeof err), err, "directory");
    EXPECT_REFUSED(pl_check_input_file(tpath("nothere"), "x", err, sizeof err), err, "No such file");
    write_bytes(tpath("ten.txt"), "0123456789", 10);
    EXPECT_REFUSED(pl_open_input(tpath("ten.txt"), "config file", 9, &f, err, sizeof err), err, "10 bytes");
    ck_assert_int_eq(pl_open_input(tpath("ten.txt"), "config file", 10, &f, err, sizeof err), 0);
    char b[16] = "";
    ck_assert_int_eq(fread(b, 1, sizeof b, f), 10);
    fclose(f);
    /* outputs: an existing file is left as it is; a new one is not left behind */
    ck_assert_int_eq(pl_check_output_file(tpath("ten.txt"), "metrics file", err, sizeof err), 0);
    struct stat sb;
    ck_assert_int_eq(stat(tpath("ten.txt"), &sb), 0);
    ck_assert_int_eq(sb.st_size, 10);
    ck_assert_int_eq(pl_check_output_file(tpath("new.out"), "trace file", err, sizeof err), 0);
    ck_assert_int_ne(stat(tpath("new.out"), &sb), 0);
    ck_assert_int_eq(pl_check_output_file("/dev/null", "trace file", err, sizeof err), 0);
    EXPECT_REFUSED(pl_check_output_file(fifo, "metrics file", err, sizeof err), err, "metrics file", "FIFO");
    EXPECT_REFUSED(pl_check_output_file(tmpdir, "save-final file", err, sizeof err), err, "directory");
    EXPECT_REFUSED(pl_check_output_file(tpath("no/such/dir/w.bin"), "save-final file", err, sizeof err), err,
                   "no/such/dir", "No such file");
    EXPECT_REFUSED(pl_check_output_file(tpath("ten.txt/x"), "trace file", err, sizeof err), err, "ten.txt/x", "Not a directory");
    EXPECT_REFUSED(pl_check_output_file("/dev/zero", "trace file", err, sizeof err), err, "character device");
    /* directories */
    ck_assert_int_eq(pl_check_output_dir(tmpdir, "--ckpt-dir", err, sizeof err), 0);
    ck_assert_int_eq(pl_check_output_dir(tpath("a/b/c"), "--ckpt-dir", err, sizeof err), 0);
    ck_assert_int_ne(stat(tpath("a"), &sb), 0); /* nothing created */
    EXPECT_REFUSED(pl_check_output_dir(tpath("ten.txt"), "--ckpt-dir", err, sizeof err), err, "not a directory");
    EXPECT_REFUSED(pl_check_output_dir(tpath("ten.txt/sub"), "--ckpt-dir", err, sizeof err), err, "cannot be created");
    /* data sources through them */
    data_source d;
    EXPECT_REFUSED(data_open(&d, fifo, 256, 4, 1, 0, err, sizeof err), err, "data file", "FIFO");
    char spec[600];
    snprintf(spec, sizeof spec, "text:%s", fifo);
    EXPECT_REFUSED(data_open(&d, spec, 256, 4, 1, 0, err, sizeof err), err, "FIFO");
    EXPECT_REFUSED(data_open(&d, "text:/dev/zero", 256, 4, 1, 0, err, sizeof err), err, "/dev/zero", "device");
    int v;
    model_config c;
    EXPECT_REFUSED(llmc_read_config(fifo, &c, &v, err, sizeof err), err, "model file", "FIFO");
}
END_TEST

/* A token file that shrinks or changes under an open source: the next batch is refused,
 * naming the file, instead of a SIGBUS through a mapping. */
START_TEST(test_data_shrinks) {
    uint16_t tok[4000];
    for (int i = 0; i < 4000; i++) tok[i] = (uint16_t)(i % 50);
    ck_assert_int_eq(data_write_tokens(tpath("shrink.bin"), tok, 4000), 0);
    data_source d;
    char err[4400];
    ck_assert_int_eq(data_open(&d, tpath("shrink.bin"), 50, 4, 1, 0, err, sizeof err), 0);
    int in[64], tg[64];
    ck_assert_int_eq(data_read_batch(&d, 40, 4, 16, in, tg, err, sizeof err), 0);
    ck_assert_int_eq(in[0], tok[(40 % ((4000 - 1) / 64)) * 64]);
    ck_assert_int_eq(truncate(tpath("shrink.bin"), 2048), 0);
    EXPECT_REFUSED(data_read_batch(&d, 41, 4, 16, in, tg, err, sizeof err), err, "shrink.bin", "shrank");
    data_close(&d);
    /* the same size but a token beyond the vocabulary written into it */
    ck_assert_int_eq(data_write_tokens(tpath("poke.bin"), tok, 4000), 0);
    ck_assert_int_eq(data_open(&d, tpath("poke.bin"), 50, 4, 1, 0, err, sizeof err), 0);
    FILE *f = fopen(tpath("poke.bin"), "r+b");
    uint16_t big = 60000;
    fseek(f, 1024 + 2 * 10, SEEK_SET);
    fwrite(&big, 2, 1, f);
    fclose(f);
    EXPECT_REFUSED(data_read_batch(&d, 0, 4, 16, in, tg, err, sizeof err), err, "poke.bin", "60000", ">= the vocabulary");
    data_close(&d);
}
END_TEST

/* Absurd dimensions are refused by name, sizes never overflow, --split parses strictly, and
 * the split search is fast for deep models and agrees with the exhaustive one. */
START_TEST(test_dims_and_split) {
    model_config c;
    char err[1024];
    EXPECT_REFUSED(gpt2_config_make(&c, 256, 64, 1000000000, 4, 64, err, sizeof err), err, "n-layer=1000000000", "at most");
    EXPECT_REFUSED(gpt2_config_make(&c, 2147483647, 64, 4, 4, 64, err, sizeof err), err, "vocab-size=2147483647");
    EXPECT_REFUSED(gpt2_config_make(&c, 256, 2147483647, 4, 4, 64, err, sizeof err), err, "max-seq-len");
    EXPECT_REFUSED(gpt2_config_make(&c, 256, 64, 4, 4, 1 << 30, err, sizeof err), err, "n-embd");
    EXPECT_REFUSED(gpt2_config_make(&c, 256, 64, 4, 128, 64, err, sizeof err), err, "n-head=128");
    EXPECT_REFUSED(gpt2_config_make(&c, 256, 64, 4, 1, 65536, err, sizeof err), err, "fc_w", "17179869184");
    EXPECT_REFUSED(gpt2_config_make(&c, 256, 64, 10000, 1, 4096, err, sizeof err), err, "2013799718912 parameters");
    ck_assert_int_eq(gpt2_config_make(&c, 16777216, 1048576, 1, 1, 8, err, sizeof err), 0);
    ck_assert_int_eq(c.Vp, 16777216);
    ck_assert_int_eq(gpt2_config_make(&c, 16777215, 8, 1, 1, 8, err, sizeof err), 0);
    ck_assert_int_eq(c.Vp, 16777216);
    /* a micro-batch whose buffers would exceed 2^31 floats: the (T, T) attention of a backend
     * that keeps the probabilities (the CPU backend's fused path would keep T (HS + 1)) */
    stage st;
    backend probs = backend_cpu;
    probs.attention_cols = NULL;
    ck_assert_int_eq(gpt2_config_make(&c, 256, 1048576, 1, 64, 64, err, sizeof err), 0);
    EXPECT_REFUSED(stage_init(&st, &c, 0, 1, 1, 1, 1, 1048576, 1, &probs, err, sizeof err), err,
                   "micro-batch too large");
    /* --split entries */
    ck_assert_int_eq(gpt2_config_make(&c, 256, 64, 4, 4, 64, err, sizeof err), 0);
    split sp;
    const char *bad[][2] = {{"1,3,", "empty entry"}, {",1,3", "empty entry"}, {"1,,3", "empty entry"},
                            {"1, 3", "not a number"}, {"1,3x", "not a number"}, {"99999999999,0", "99999999999"},
                            {"4294967297,0", "larger than"}, {"+1,3", "not a number"}, {"1,-3", "negative"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        EXPECT_REFUSED(split_make(&sp, bad[i][0], &c, 2, 4, 1, 64, err, sizeof err), err, "--split", bad[i][1]);
    ck_assert_int_eq(split_make(&sp, "1,3", &c, 2, 4, 1, 64, err, sizeof err), 0);
    split_free(&sp);
    /* the fast search gives the exhaustive search's split */
    long long saved = split_exact_limit;
    int Ls[] = {1, 3, 12, 37, 64}, Cs[] = {8, 64, 768};
    for (int li = 0; li < 5; li++)
        for (int ci = 0; ci < 3; ci++)
            for (int P = 1; P <= 8 && P <= Ls[li] + 2; P++)
                for (int M = 1; M <= 8; M *= 8) {
                    model_config g;
                    ck_assert_int_eq(gpt2_config_make(&g, 50257, 1024, Ls[li], 1, Cs[ci], err, sizeof err), 0);
                    split a, b;
                    split_exact_limit = 1LL << 62;
                    ck_assert_int_eq(split_make(&a, "auto", &g, P, M, 1, 256, err, sizeof err), 0);
                    split_exact_limit = 0;
                    ck_assert_int_eq(split_make(&b, "auto", &g, P, M, 1, 256, err, sizeof err), 0);
                    for (int s = 0; s < P; s++)
                        ck_assert_msg(a.blocks[s] == b.blocks[s], "L=%d C=%d P=%d M=%d stage %d: exact %d, fast %d",
                                      Ls[li], Cs[ci], P, M, s, a.blocks[s], b.blocks[s]);
                    split_free(&a);
                    split_free(&b);
                }
    split_exact_limit = saved;
    /* deep and narrow: n-layer 10000 over 64 stages. The bound guards the search's complexity
     * (an exponential search would take hours), not its speed: it is this thread's CPU time, so
     * a loaded machine does not move it, and it is loose enough for a sanitizer build (about
     * 6 s under ASan, about 1 s without). Speed belongs in benchmarks. */
    model_config deep;
    ck_assert_int_eq(gpt2_config_make(&deep, 256, 64, 10000, 1, 8, err, sizeof err), 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    ck_assert_int_eq(split_make(&sp, "auto", &deep, 64, 8, 1, 64, err, sizeof err), 0);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    long long sum = 0;
    for (int s = 0; s < 64; s++) sum += sp.blocks[s];
    ck_assert_int_eq(sum, 10000);
    split_free(&sp);
    fprintf(stderr, "split search: n-layer 10000 over 64 stages in %.3f s of CPU\n", secs);
    ck_assert_msg(secs < 60.0, "split search took %.1f s of CPU", secs);
}
END_TEST

/* The llama-1b preset is Llama 3.2 1B as its config.json gives it: tied embeddings, rope
 * scaling factor 32, hidden 8192, 131072 positions, 1235814400 parameters. */
START_TEST(test_llama_1b_preset) {
    pl_options o;
    char err[1024];
    config_defaults(&o);
    ck_assert_int_eq(config_preset(&o, "llama-1b", err, sizeof err), 0);
    model_config c;
    ck_assert_int_eq(config_model(&o, config_vocab(&o), &c, err, sizeof err), 0);
    ck_assert_int_eq(c.V, 128256);
    ck_assert_int_eq(c.C, 2048);
    ck_assert_int_eq(c.L, 16);
    ck_assert_int_eq(c.NH, 32);
    ck_assert_int_eq(c.NKV, 8);
    ck_assert_int_eq(c.H, 8192);
    ck_assert_int_eq(c.maxT, 131072);
    ck_assert_int_eq(c.tie_embed, 1);
    ck_assert_int_eq(c.llama.use_scaled_rope, 1);
    ck_assert(c.llama.rope_factor == 32.0f && c.llama.rope_low_freq == 1.0f && c.llama.rope_high_freq == 4.0f);
    ck_assert_int_eq(c.llama.rope_orig_ctx, 8192);
    ck_assert(c.llama.rope_theta == 500000.0f && c.llama.norm_eps == 1e-5f);
    ck_assert_uint_eq(model_num_params(&c), 1235814400u); /* Hugging Face's count for Llama-3.2-1B */
}
END_TEST

/* A model file whose weights hold a NaN or an Inf is refused at load, naming the tensor. */
START_TEST(test_model_file_nonfinite) {
    model_config cfg;
    char err[1024];
    ck_assert_int_eq(gpt2_config_make(&cfg, 37, 9, 2, 3, 12, err, sizeof err), 0);
    stage a;
    ck_assert_int_eq(stage_init(&a, &cfg, 0, 2, 1, 1, 1, 9, 1, &backend_cpu, err, sizeof err), 0);
    randomize_params(&a, 0.1f, 5);
    ck_assert_int_eq(llmc_save(tpath("nan.bin"), &a, 0, MPI_COMM_SELF), 0);
    size_t numel, off = llmc_tensor_offset(&cfg, P_QKVW, 1, &numel);
    FILE *f = fopen(tpath("nan.bin"), "r+b");
    float bad = NAN;
    fseek(f, (long)(1024 + 4 * (off + 5)), SEEK_SET);
    fwrite(&bad, 4, 1, f);
    fclose(f);
    EXPECT_REFUSED(llmc_load_stage(tpath("nan.bin"), &a, err, sizeof err), err, "nan.bin", "h.1.qkv_w", "non-finite",
                   "element 5");
    /* a stage that does not hold block 1 does not read it */
    stage b;
    ck_assert_int_eq(stage_init(&b, &cfg, 0, 1, 1, 0, 1, 9, 1, &backend_cpu, err, sizeof err), 0);
    ck_assert_int_eq(llmc_load_stage(tpath("nan.bin"), &b, err, sizeof err), 0);
    stage_free(&b);
    off = llmc_tensor_offset(&cfg, P_LNFB, -1, &numel);
    randomize_params(&a, 0.1f, 5); /* a failed load leaves the stage's tensors unspecified (llmc.h) */
    ck_assert_int_eq(llmc_save(tpath("inf.bin"), &a, 0, MPI_COMM_SELF), 0);
    f = fopen(tpath("inf.bin"), "r+b");
    bad = -INFINITY;
    fseek(f, (long)(1024 + 4 * off), SEEK_SET);
    fwrite(&bad, 4, 1, f);
    fclose(f);
    EXPECT_REFUSED(llmc_load_stage(tpath("inf.bin"), &a, err, sizeof err), err, "lnf_b", "-inf");
    stage_free(&a);
}
END_TEST

/* Forward micro-batches 0 and 1 of a whole-model stage with the same weights. */
static void forward_two(stage *st, const int *tok, const int *tgt, int N) {
    double sum;
    int slot;
    for (int m = 0; m < 2; m++)
        ck_assert_int_eq(stage_forward(st, m, tok + m * N, NULL, tgt + m * N, 1.0f / (2 * N), &sum, &slot), 0);
}

/* The split backward: input parts of micro-batches 0 and 1 first, their weight parts after
 * (as a zero-bubble schedule defers them) give the same bits as two plain backwards, for the
 * gradients and for dL/d(input); without deferred buffers the second input part is refused. */
START_TEST(test_split_backward) {
    model_config cfg;
    char err[256];
    ck_assert_int_eq(gpt2_config_make(&cfg, 37, 9, 3, 3, 12, err, sizeof err), 0);
    int B = 2, T = 7, N = B * T, tok[28], tgt[28];
    rng_state r;
    rng_seed(&r, 4, 4);
    for (int i = 0; i < 2 * N; i++) { tok[i] = (int)(rng_u64(&r) % 37); tgt[i] = (int)(rng_u64(&r) % 37); }
    /* a: the whole model (embeddings, blocks, head); b: a middle stage of blocks 1-2 */
    stage a, b, a2, b2;
    ck_assert_int_eq(stage_init(&a, &cfg, 0, 3, 1, 1, B, T, 2, &backend_cpu, err, sizeof err), 0);
    ck_assert_int_eq(stage_init(&a2, &cfg, 0, 3, 1, 1, B, T, 2, &backend_cpu, err, sizeof err), 0);
    ck_assert_int_eq(stage_init(&b, &cfg, 1, 3, 0, 0, B, T, 2, &backend_cpu, err, sizeof err), 0);
    ck_assert_int_eq(stage_init(&b2, &cfg, 1, 3, 0, 0, B, T, 2, &backend_cpu, err, sizeof err), 0);
    ck_assert_int_eq(stage_init_deferred(&a2, err, sizeof err), 0);
    ck_assert_int_eq(stage_init_deferred(&b2, err, sizeof err), 0);
    randomize_params(&a, 0.3f, 12);
    randomize_params(&a2, 0.3f, 12);
    randomize_params(&b, 0.3f, 12);
    randomize_params(&b2, 0.3f, 12);
    stage *plain[2] = {&a, &b}, *split[2] = {&a2, &b2};
    for (int k = 0; k < 2; k++) {
        stage *p = plain[k], *q = split[k];
        ck_assert_int_eq(stage_zero_grads(p), 0);
        ck_assert_int_eq(stage_zero_grads(q), 0);
        float *dout = malloc(sizeof(float) * N * cfg.C), *din[2];
        for (int i = 0; i < N * cfg.C; i++) dout[i] = 0.01f * rng_normal(&r);
        const float *x_in = k ? stage_output(&a, 0) : NULL; /* any (N, C) input for the middle stage */
        double sum;
        int slot;
        for (int m = 0; m < 2; m++) {
            if (k == 0) {
                forward_two(p, tok, tgt, N);
                forward_two(q, tok, tgt, N);
                break;
            }
            ck_assert_int_eq(stage_forward(p, m, NULL, x_in, tgt + m * N, 1.0f / (2 * N), &sum, &slot), 0);
            ck_assert_int_eq(stage_forward(q, m, NULL, x_in, tgt + m * N, 1.0f / (2 * N), &sum, &slot), 0);
        }
        for (int m = 0; m < 2; m++) {
            ck_assert_int_eq(stage_backward(p, stage_slot_of(p, m), p->has_head ? NULL : dout), 0);
            din[m] = malloc(sizeof(float) * N * cfg.C);
            memcpy(din[m], stage_dinput(p), sizeof(float) * N * cfg.C);
        }
        for (int m = 0; m < 2; m++) {
            ck_assert_int_eq(stage_backward_input(q, stage_slot_of(q, m), q->has_head ? NULL : dout), 0);
            ck_assert_msg(memcmp(din[m], stage_dinput(q), sizeof(float) * N * cfg.C) == 0,
                          "stage %d: dL/dinput of micro-batch %d differs between B and I", k, m);
        }
        ck_assert_int_eq(q->slots_in_use, 2); /* the slots wait for their weight parts */
        for (int m = 0; m < 2; m++) ck_assert_int_eq(stage_backward_weight(q, stage_slot_of(q, m)), 0);
        ck_assert_int_eq(q->slots_in_use, 0);
        ck_assert_int_eq(stage_tied_grads_local(p), 0);
        ck_assert_int_eq(stage_tied_grads_local(q), 0);
        for (int i = 0; i < p->ntensors; i++) {
            const param_tensor *t = &p->tensors[i];
            ck_assert_msg(memcmp(p->grads + t->offset, q->grads + t->offset, t->numel * sizeof(float)) == 0,
                          "stage %d: gradient of %s differs between B and I+W", k, t->name);
        }
        free(dout);
        free(din[0]);
        free(din[1]);
    }
    /* without deferred buffers: I0 then I1 is refused, I0 W0 I1 W1 runs */
    forward_two(&a, tok, tgt, N);
    ck_assert_int_eq(stage_backward_input(&a, stage_slot_of(&a, 0), NULL), 0);
    ck_assert_int_eq(stage_backward_input(&a, stage_slot_of(&a, 1), NULL), PL_EINVAL);
    ck_assert_int_eq(stage_backward_weight(&a, stage_slot_of(&a, 0)), 0);
    ck_assert_int_eq(stage_backward_weight(&a, stage_slot_of(&a, 1)), PL_EINVAL); /* no input part yet */
    ck_assert_int_eq(stage_backward_input(&a, stage_slot_of(&a, 1), NULL), 0);
    ck_assert_int_eq(stage_backward_weight(&a, stage_slot_of(&a, 1)), 0);
    stage_free(&a);
    stage_free(&b);
    stage_free(&a2);
    stage_free(&b2);
}
END_TEST

/* Every backend allocation of stage_init that fails (injected, each in turn until the stage
 * needs no more) stops it with the backend's message and nothing leaked (the sanitizer run
 * checks the second half). A slot is one allocation, so a stage of 2 slots makes 10: the
 * parameters, gradients, the tied head's share, logits, losses, targets, dres, the output
 * gradients and the two slots. */
START_TEST(test_stage_alloc_failure) {
    model_config cfg;
    char err[512];
    ck_assert_int_eq(gpt2_config_make(&cfg, 37, 9, 2, 3, 12, err, sizeof err), 0);
    long failed = 0;
    for (long k = 1; k < 1000; k++) {
        stage st;
        backend_fail_alloc_after(k);
        int rc = stage_init(&st, &cfg, 0, 2, 1, 1, 2, 7, 2, &backend_cpu, err, sizeof err);
        backend_fail_alloc_after(0);
        if (rc == PL_OK) {
            stage_free(&st);
            break;
        }
        failed++;
        ck_assert_int_eq(rc, PL_ENOMEM);
        ck_assert_msg(strstr(err, "injected") && strstr(err, "backend cpu"), "allocation %ld: '%s'", k, err);
        ck_assert_ptr_null(st.params);
    }
    ck_assert_int_eq(failed, 10);
}
END_TEST

/* A Llama config for the table tests (NKV of NH, MLP from multiple_of). */
static void llama_cfg(model_config *c, int V, int maxT, int L, int NH, int NKV, int C, int mult) {
    char err[512];
    ck_assert_int_eq(llama_config_make(c, V, maxT, L, NH, NKV, C, mult, 0.0f, 1e-5f, 500000.0f, 0, CFG_NAME_OPTION,
                                       err, sizeof err), 0);
}

/* The parameter count each architecture's paper gives, written out here independently of the
 * tables: GPT-2 Vp C + maxT C + L (12 C^2 + 13 C) + 2 C; Llama 2 Vp C + C + L (2 C + QKV C +
 * C^2 + 3 H C), QKV = (NH + 2 NKV) C / NH. */
static size_t params_by_formula(const model_config *c) {
    size_t C = c->C, Vp = c->Vp, L = c->L, H = c->H, QKV = (size_t)(c->NH + 2 * c->NKV) * (C / c->NH);
    if (strcmp(arch_of(c)->name, "gpt2") == 0) return Vp * C + (size_t)c->maxT * C + L * (12 * C * C + 13 * C) + 2 * C;
    return 2 * Vp * C + C + L * (2 * C + QKV * C + C * C + 3 * H * C);
}

/* Every row of both architectures, on several configs: its name is its kind's, its shape's
 * product is its count, the whole model's tensors sum to model_num_params and to the
 * formula, the parts to model_embed/block/head_params, and an llm.c file written from a
 * stage is exactly as long as the rows' file shapes say (GPT-2: its padded count; Llama: wte
 * and lm_head with V rows, plus llm.c's zero bias slots). */
START_TEST(test_arch_tables) {
    model_config cfgs[5];
    char err[512];
    ck_assert_int_eq(gpt2_config_make(&cfgs[0], 37, 9, 2, 3, 12, err, sizeof err), 0);
    ck_assert_int_eq(gpt2_config_make(&cfgs[1], 300, 16, 3, 4, 32, err, sizeof err), 0);
    llama_cfg(&cfgs[2], 37, 9, 2, 4, 2, 16, 8);
    llama_cfg(&cfgs[3], 300, 16, 3, 4, 1, 32, 32);
    llama_cfg(&cfgs[4], 256, 8, 1, 2, 2, 8, 1);
    for (int k = 0; k < 5; k++) {
        const model_config *c = &cfgs[k];
        const model_arch *A = arch_of(c);
        const arch_params *parts[3] = {&A->embed, &A->block, &A->head};
        for (int p = 0; p < 3; p++)
            for (int i = 0; i < parts[p]->n; i++)
                ck_assert_str_eq(parts[p]->rows[i].name, param_kind_name[parts[p]->rows[i].kind]);
        param_tensor *t = calloc((size_t)model_max_tensors(c, c->L), sizeof *t);
        size_t total, sum = 0, part_sum[3] = {0, 0, 0};
        int n = model_layout(c, 0, c->L, 1, 1, t, &total);
        ck_assert_int_eq(n, model_num_tensors(c));
        for (int i = 0; i < n; i++) {
            ck_assert_uint_eq(t[i].numel, (size_t)t[i].shape[0] * t[i].shape[1]);
            ck_assert_int_eq(t[i].tied_copy, 0);
            sum += t[i].numel;
            part_sum[t[i].part] += t[i].numel;
        }
        free(t);
        ck_assert_uint_eq(sum, model_num_params(c));
        ck_assert_uint_eq(sum, params_by_formula(c));
        ck_assert_uint_eq(part_sum[PART_EMBED], model_embed_params(c));
        ck_assert_uint_eq(part_sum[PART_BLOCK], (size_t)c->L * model_block_params(c));
        ck_assert_uint_eq(part_sum[PART_HEAD], model_head_params(c, 1));
        /* the file a one-stage run writes */
        stage st;
        ck_assert_int_eq(stage_init(&st, c, 0, c->L, 1, 1, 1, c->maxT, 1, &backend_cpu, err, sizeof err), 0);
        ck_assert_int_eq(stage_init_params(&st, 1), 0);
        ck_assert_int_eq(llmc_save(tpath("rows.bin"), &st, 0, MPI_COMM_SELF), 0);
        struct stat sb;
        ck_assert_int_eq(stat(tpath("rows.bin"), &sb), 0);
        size_t pad = strcmp(A->name, "llama") == 0 ? 2 * (size_t)(c->Vp - c->V) * c->C : 0;
        /* llm.c's Llama 3 file also holds zeros in GPT-2's bias slots (train_llama3.py):
         * ln1b, qkvb, attprojb, ln2b, fcb (2H), fcprojb per layer, and lnfb */
        size_t QKV = (size_t)(c->NH + 2 * c->NKV) * (c->C / c->NH);
        size_t zeros = strcmp(A->name, "llama") == 0
                           ? (size_t)c->L * (4 * (size_t)c->C + QKV + 2 * (size_t)c->H) + (size_t)c->C : 0;
        ck_assert_uint_eq((size_t)sb.st_size, llmc_header_bytes(c) + 4 * (params_by_formula(c) - pad + zeros));
        model_config back;
        int version;
        ck_assert_int_eq(llmc_read_config(tpath("rows.bin"), &back, &version, err, sizeof err), 0);
        ck_assert_int_eq(back.arch, c->arch);
        ck_assert_uint_eq(model_num_params(&back), model_num_params(c));
        stage_free(&st);
    }
    /* a last stage without the embeddings holds GPT-2's head copy of wte, tied */
    stage last;
    ck_assert_int_eq(stage_init(&last, &cfgs[0], 1, 2, 0, 1, 1, 9, 1, &backend_cpu, err, sizeof err), 0);
    const param_tensor *w = stage_find_tensor(&last, P_WTE, -1);
    ck_assert(w && w->tied_copy && w->part == PART_HEAD);
    ck_assert(model_tensor_is_tied(&cfgs[0], w));
    ck_assert(!model_tensor_is_tied(&cfgs[0], stage_find_tensor(&last, P_LNFW, -1)));
    stage lfirst;
    ck_assert_int_eq(stage_init(&lfirst, &cfgs[2], 0, 1, 1, 0, 1, 9, 1, &backend_cpu, err, sizeof err), 0);
    for (int i = 0; i < lfirst.ntensors; i++) ck_assert(!model_tensor_is_tied(&cfgs[2], &lfirst.tensors[i]));
    stage_free(&lfirst);
    stage gfirst;
    ck_assert_int_eq(stage_init(&gfirst, &cfgs[0], 0, 1, 1, 0, 1, 9, 1, &backend_cpu, err, sizeof err), 0);
    ck_assert(model_tensor_is_tied(&cfgs[0], stage_find_tensor(&gfirst, P_WTE, -1)));
    ck_assert(!model_tensor_is_tied(&cfgs[0], stage_find_tensor(&gfirst, P_WPE, -1)));
    stage_free(&gfirst);
    ck_assert_uint_eq(split_stage_params(&(split){.P = 2, .blocks = (int[]){1, 1}}, &cfgs[0], 1),
                      model_block_params(&cfgs[0]) + model_head_params(&cfgs[0], 0));
    stage_free(&last);
}
END_TEST

/* Activation floats per token of one block under no recomputation, written out here: GPT-2
 * 16 C + 4 (ln1, its mean and rstd, qkv 3C, atty, res2, ln2 and its two, fch and gelu 4C each,
 * res3); Llama 5 C + QKV + 3 H + 2 (no means, rotated qkv, up, gate and product). */
static size_t block_floats_by_formula(const model_config *c) {
    size_t C = c->C, QKV = (size_t)(c->NH + 2 * c->NKV) * (C / c->NH);
    return strcmp(arch_of(c)->name, "gpt2") == 0 ? 16 * C + 4 : 5 * C + QKV + 3 * (size_t)c->H + 2;
}

/* The activation bytes the split and the report estimate are what a stage allocates: for both
 * architectures, every recompute mode and first / middle / last / whole stages, the slot's
 * carved bytes equal stage_act_bytes_per_slot, split_stage_act_bytes (no recomputation) and,
 * with N a multiple of 16 (no padding), the formula (input C, tokens 1, per block the kept
 * rows and NH T probabilities, head GPT-2 2C + 2, Llama 2C + 1). */
/* A backend whose attention keeps hs + 1 floats a (token, head) (backend.h's attention_cols,
 * the CUDA fused kernels' and the CPU's tiled path's output and log-sum-exp) gets a stage
 * whose attention buffer is that size, not T x T; a backend without it (onednn) keeps T. */
static int cols_hs1(int B, int T, int NH, int HS) { (void)B; (void)NH; return T > HS ? HS + 1 : T; }
START_TEST(test_attention_cols) {
    model_config cfg;
    char err[256];
    ck_assert_int_eq(gpt2_config_make(&cfg, 256, 64, 2, 4, 64, err, sizeof err), 0); /* HS = 16 */
    backend fused = backend_cpu, probs = backend_cpu;
    fused.attention_cols = cols_hs1;
    probs.attention_cols = NULL;
    stage a, b, c;
    int B = 2, T = 40;
    ck_assert_int_eq(stage_init(&a, &cfg, 0, 2, 1, 1, B, T, 1, &probs, err, sizeof err), 0);
    ck_assert_int_eq(stage_init(&b, &cfg, 0, 2, 1, 1, B, T, 1, &fused, err, sizeof err), 0);
    ck_assert_int_eq(a.cfg.att_cols, 0);
    ck_assert_int_eq(b.cfg.att_cols, 17);
    ck_assert_uint_eq(arch_dim_value(&a.cfg, T, AD_NHT), (size_t)4 * T);
    ck_assert_uint_eq(arch_dim_value(&b.cfg, T, AD_NHT), (size_t)4 * 17);
    ck_assert_uint_eq(arch_dim_value(&b.cfg, 1, AD_NHT), 4); /* the head count, as stage.c reads it */
    /* the att rows of the two blocks shrink by B T NH (T - 17) floats each */
    size_t saved = (size_t)2 * B * T * 4 * (T - 17) * sizeof(float);
    ck_assert_msg(stage_slot_bytes(&a) - stage_slot_bytes(&b) >= saved,
                  "slot bytes %zu (T x T) and %zu (hs + 1): want at least %zu less", stage_slot_bytes(&a),
                  stage_slot_bytes(&b), saved);
    /* T <= HS: the backend keeps T, and the stage sizes T */
    ck_assert_int_eq(stage_init(&c, &cfg, 0, 2, 1, 1, B, 12, 1, &fused, err, sizeof err), 0);
    ck_assert_uint_eq(arch_dim_value(&c.cfg, 12, AD_NHT), (size_t)4 * 12);
    stage_free(&a);
    stage_free(&b);
    stage_free(&c);
}
END_TEST

START_TEST(test_act_bytes) {
    model_config cfgs[3];
    char err[512];
    ck_assert_int_eq(gpt2_config_make(&cfgs[0], 37, 16, 3, 4, 32, err, sizeof err), 0);
    llama_cfg(&cfgs[1], 37, 16, 3, 4, 2, 32, 16);
    llama_cfg(&cfgs[2], 37, 16, 3, 4, 4, 16, 1);
    int shapes[4][4] = {{0, 3, 1, 1}, {0, 1, 1, 0}, {1, 2, 0, 0}, {2, 3, 0, 1}}; /* l0, l1, embed, head */
    for (int k = 0; k < 3; k++)
        for (int sh = 0; sh < 4; sh++)
            for (int mode = 0; mode < 3; mode++) {
                const model_config *c = &cfgs[k];
                int l0 = shapes[sh][0], l1 = shapes[sh][1], e = shapes[sh][2], h = shapes[sh][3], Bm = 2, T = 8;
                stage st;
                ck_assert_int_eq(stage_init(&st, c, l0, l1, e, h, Bm, T, 2, &backend_cpu, err, sizeof err), 0);
                ck_assert_int_eq(stage_init_recompute(&st, mode, err, sizeof err), 0);
                size_t got = stage_slot_bytes(&st), N = (size_t)Bm * T, C = c->C;
                ck_assert_uint_eq(got, stage_act_bytes_per_slot(&st));
                size_t block = mode == STAGE_RECOMPUTE_FULL ? C : block_floats_by_formula(c) + (mode ? 0 : 4 * T);
                size_t head = strcmp(arch_of(c)->name, "gpt2") == 0 ? 2 * C + 2 : 2 * C + 1;
                size_t want = N * (C + (e ? 1 : 0) + (size_t)(l1 - l0) * block + (h ? head : 0)) * sizeof(float);
                ck_assert_msg(got == want, "%s [%d,%d) e%d h%d mode %d: allocated %zu, formula %zu", arch_of(c)->name,
                              l0, l1, e, h, mode, got, want);
                if (mode == 0 && e != h) { /* a two-stage split's stage */
                    split sp = {.P = 2, .blocks = (int[]){e ? l1 - l0 : 3 - (l1 - l0), e ? 3 - (l1 - l0) : l1 - l0}};
                    ck_assert_uint_eq(split_stage_act_bytes(&sp, c, e ? 0 : 1, Bm, T), got);
                }
                stage_free(&st);
            }
}
END_TEST

/* The registry finds each architecture by its name, and nothing else. */
START_TEST(test_arch_find) {
    ck_assert_ptr_eq(arch_find("gpt2"), &arch_gpt2);
    ck_assert_ptr_eq(arch_find("llama"), &arch_llama);
    ck_assert_ptr_null(arch_find("llama3"));
    ck_assert_ptr_null(arch_find("GPT2"));
    ck_assert_ptr_null(arch_find(""));
    ck_assert_ptr_null(arch_find(NULL));
    for (int i = 0; i < arch_count; i++) {
        ck_assert_int_eq(arch_registry[i]->id, i);
        ck_assert_str_eq(model_arch_name(i), arch_registry[i]->name);
        /* the checkpoint metadata holds at most ARCH_MAX_ATTRS of each */
        ck_assert_int_le(arch_registry[i]->nattr_int, ARCH_MAX_ATTRS);
        ck_assert_int_le(arch_registry[i]->nattr_f64, ARCH_MAX_ATTRS);
    }
    pl_options o;
    config_defaults(&o);
    snprintf(o.arch, sizeof o.arch, "mamba");
    model_config c;
    char err[512];
    ck_assert_int_eq(config_model(&o, 256, &c, err, sizeof err), PL_EINVAL);
    ck_assert_msg(strstr(err, "gpt2 or llama") && strstr(err, "mamba"), "%s", err);
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
    tcase_add_test(tc, test_llama_1b_preset);
    tcase_add_test(tc, test_config);
    tcase_add_test(tc, test_split);
    tcase_add_test(tc, test_split_chunks);
    tcase_add_test(tc, test_config_refusals);
    tcase_add_test(tc, test_file_checks);
    tcase_add_test(tc, test_data_shrinks);
    tcase_add_test(tc, test_dims_and_split);
    tcase_add_test(tc, test_model_file_nonfinite);
    tcase_add_test(tc, test_determinism);
    tcase_add_test(tc, test_learning);
    tcase_add_test(tc, test_split_backward);
    tcase_add_test(tc, test_stage_alloc_failure);
    tcase_add_test(tc, test_arch_tables);
    tcase_add_test(tc, test_act_bytes);
    tcase_add_test(tc, test_attention_cols);
    tcase_add_test(tc, test_arch_find);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    pl_rank = 0;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pipelm_test_model.XXXXXX");
    if (!mkdtemp(tmpdir)) return 99;
    backend_cpu.set_threads(1);
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
