/*
 * eval.c — `pipelm eval`: the trainer's set-up and validation path with nothing trained
 * (eval.h). The evaluated data is --data (the trainer's --val-data; Markov data: the
 * held-out stream the trainer validates on); the weights come from --init, --resume, or
 * the seed.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/ckpt.h"
#include "parallel/comm.h"
#include "util/common.h"
#include "run/eval.h"
#include "util/files.h"
#include "run/metrics.h"
#include "run/run.h"
#include "parallel/tp.h"

/* Match one argument against the table: the option's index, or -1; *val points at an
 * inline "=VALUE" or is NULL. */
static int sub_match(const char *a, const sub_opt *opts, int n, const char **val) {
    for (int i = 0; i < n; i++) {
        size_t l = strlen(opts[i].name);
        if (strncmp(a, "--", 2) != 0 || strncmp(a + 2, opts[i].name, l) != 0) continue;
        if (a[2 + l] == 0) { *val = NULL; return i; }
        if (a[2 + l] == '=') { *val = a + 3 + l; return i; }
    }
    return -1;
}

/* The value of option opts[m] given as argv[*i] (inline: the text after '=', or NULL);
 * *i moves past a value taken from the next word. PL_EINVAL names a missing one. */
static int sub_value(int argc, char **argv, int *i, const sub_opt *o, const char *inl, const char **v, char *err,
                     size_t errlen) {
    *v = inl;
    if (o->flag == SUB_FLAG) { *v = inl ? inl : "1"; return PL_OK; }
    int next = *i + 1 < argc && strncmp(argv[*i + 1], "--", 2) != 0;
    if (!inl && next) *v = argv[++*i];
    if (!*v && o->flag == SUB_SWITCH) *v = "1";
    if (!*v) {
        snprintf(err, errlen, "option --%s needs a value%s", o->name, *i + 1 < argc ? " (the next word is an option: "
                 "a value that starts with -- is given as --name=--value)" : "");
        return PL_EINVAL;
    }
    if (!(*v)[0]) {
        snprintf(err, errlen, "option --%s has an empty value (leave the option out for its default)", o->name);
        return PL_EINVAL;
    }
    return PL_OK;
}

int sub_opts_take(int argc, char **argv, int first, int cmd, sub_opt *opts, int n, char ***rest, int *nrest,
                  char *err, size_t errlen) {
    const char *names[32];
    for (int k = 0; k < n && k < 32; k++) names[k] = opts[k].name;
    if (cmd >= 0 && config_check_names(argc, argv, first, cmd, names, n < 32 ? n : 32, err, errlen) != PL_OK)
        return PL_EINVAL;
    char **r = calloc((size_t)argc + 2, sizeof(char *));
    if (!r) return PL_ENOMEM;
    int k = 0;
    r[k++] = argv[0];
    r[k++] = argv[1];
    for (int i = first; i < argc; i++) {
        const char *v;
        int m = sub_match(argv[i], opts, n, &v);
        if (m < 0) { r[k++] = argv[i]; continue; }
        if (sub_value(argc, argv, &i, &opts[m], v, &v, err, errlen) != PL_OK) {
            free(r);
            return PL_EINVAL;
        }
        opts[m].val = (char *)v;
    }
    *rest = r;
    *nrest = k;
    return PL_OK;
}

int sub_opt_int(const sub_opt *o, long long lo, long long hi, long long *out, char *err, size_t errlen) {
    char *end;
    errno = 0;
    long long v = strtoll(o->val, &end, 10);
    if (errno || end == o->val || *end || v < lo || v > hi) {
        snprintf(err, errlen, "--%s '%.100s' is not an integer in %lld..%lld", o->name, o->val, lo, hi);
        return PL_EINVAL;
    }
    *out = v;
    return PL_OK;
}


/* Collective: the weights of --resume (parameters only; the training settings need not match). */
int eval_load_resume(run *R) {
    const pl_options *o = R->o;
    char path[PL_PATH + 64], err[1024] = "";
    int rc = ckpt_resolve(strcmp(o->resume, "latest") == 0 ? o->ckpt_dir : o->resume, path, sizeof path, err,
                          sizeof err);
    if (rc != PL_OK) {
        if (R->wrank == 0) pl_error("--resume: %s", err);
        return rc;
    }
    ckpt_meta m;
    double bytes = 0;
    tp_whole w; /* --tp: read whole, keep this rank's slices */
    if (R->have_tp) {
        rc = tp_whole_make(&R->tp, &R->st, NULL, 0, 0, 0, 1, &w, err, sizeof err);
        if (rc != PL_OK) pl_error("%s", err);
        if ((rc = comm_agree(R->world, rc, NULL)) != PL_OK) return rc; /* before the collective load */
    }
    rc = ckpt_load(path, R->have_tp ? &w.st : &R->st, NULL, &m, R->world, &bytes, err, sizeof err);
    if (R->have_tp) {
        if (rc == PL_OK && tp_whole_put(&R->tp, &w, &R->st, NULL, TPW_PARAMS) != PL_OK) {
            snprintf(err, sizeof err, "backend %s: cutting the weights into the TP slices failed", R->be->name);
            rc = PL_EBACKEND;
        }
        tp_whole_free(&w);
    }
    if (rc != PL_OK) {
        if (err[0] && R->wrank == 0) pl_error("evaluating %s: %s", path, err);
        return rc;
    }
    pl_info("weights from %s (step %lld)\n", path, m.step);
    return PL_OK;
}

/* Collective: batches to evaluate: --batches, or every whole batch of a file (Markov data:
 * --val-batches, the trainer's count). */
static int eval_batches(run *R, int *nb) {
    long long n = R->o->eval_batches, have = 0;
    if (R->have_val && R->val.kind != DATA_MARKOV) have = (long long)((R->val.ntok - 1) / ((size_t)R->Bg * R->T));
    PL_TRY(comm_allreduce(MPI_IN_PLACE, &have, 1, MPI_LONG_LONG, MPI_MAX, R->world, "the batch count"));
    if (n <= 0) n = have > 0 ? have : R->o->val_batches;
    if (R->have_val && R->val.kind != DATA_MARKOV && have > 0 && n > have) { /* never a batch twice */
        pl_note("--batches %lld: %s holds %lld whole batches of %d x %d tokens; evaluating those %lld", n,
                R->o->val_data, have, R->Bg, R->T, have);
        n = have;
    }
    if (n > INT_MAX) n = INT_MAX;
    *nb = (int)n;
    return PL_OK;
}

/* Rank 0: the --json result file. */
static int eval_write_json(const run *R, double loss, long long tokens, int nb, double secs) {
    FILE *f;
    char err[PL_PATH + 256];
    if (pl_open_output(R->o->eval_json, "--json", &f, err, sizeof err) != PL_OK) {
        pl_error("%s", err);
        return PL_EIO;
    }
    fprintf(f, "{\"loss\":%.17g,\"perplexity\":%.17g,\"tokens\":%lld,\"batches\":%d,\"stages\":%d,\"dp\":%d,"
            "\"microbatches\":%d,\"seconds\":%.6f}\n", loss, exp(loss), tokens, nb, R->S, R->D, R->M, secs);
    if (pl_close_output(f, R->o->eval_json, "--json", err, sizeof err) != PL_OK) {
        pl_error("%s", err);
        return PL_EIO;
    }
    return PL_OK;
}

/* Collective: `pipelm eval` after run_setup (run.h): load --resume's weights, run
 * train_evaluate over the batches, report; *agreed as train_run's. */
static int eval_after_setup(run *R, int *agreed) {
    const pl_options *o = R->o;
    char err[PL_PATH + 256] = "";
    int rc = R->wrank == 0 && o->eval_json[0] ? pl_check_output_file(o->eval_json, "--json", err, sizeof err) : PL_OK;
    if (rc != PL_OK) pl_error("%s", err);
    PL_TRY(comm_agree(R->world, rc, NULL));
    if (o->resume[0]) PL_TRY(eval_load_resume(R));
    int nb;
    PL_TRY(eval_batches(R, &nb));
    double t0 = pl_now(), loss = 0;
    if ((rc = train_evaluate(R, nb, &loss)) != PL_OK) {
        *agreed = 0;
        return rc;
    }
    double secs = pl_now() - t0;
    long long tokens = (long long)nb * R->Bg * R->T;
    pl_info("eval | loss %.6f | perplexity %.4f | %lld tokens in %d batches | %.2f s (%.0f tok/s)\n", loss, exp(loss),
            tokens, nb, secs, tokens / (secs > 0 ? secs : 1e-9));
    metrics_line(&R->mx, "{\"event\":\"eval\",\"loss\":%.17g,\"perplexity\":%.17g,\"tokens\":%lld,\"batches\":%d,"
                 "\"seconds\":%.6f}", loss, exp(loss), tokens, nb, secs);
    rc = R->wrank == 0 && o->eval_json[0] ? eval_write_json(R, loss, tokens, nb, secs) : PL_OK;
    return comm_agree(R->world, rc, NULL);
}

/* Help text of eval. */
static void eval_usage(FILE *out) {
    fprintf(out, "usage: mpiexec -n P pipelm eval [--init FILE | --resume CKPT|DIR] [--data FILE] [--batches N]\n"
                 "                             [--json FILE] [--metrics FILE] [train options]\n\n"
                 "The mean loss (nats/token) and perplexity of the weights on --data, forward only, through P\n"
                 "pipeline stages (and --dp replicas) with --microbatches M in flight: bit for bit the trainer's\n"
                 "validation loss (--val-data) for the same weights, batches and M. Markov data: the held-out\n"
                 "stream the trainer validates on.\n\n"
                 "  --batches N   batches of --batch x --seq-len tokens (0, default: every whole batch of the\n"
                 "                file; Markov data: --val-batches)\n"
                 "  --json FILE   write {\"loss\", \"perplexity\", \"tokens\", \"batches\", ...} (rank 0)\n\n"
                 "options shared with train:\n");
    config_print_help(out, CFG_CMD_EVAL);
}

int eval_main(int argc, char **argv, MPI_Comm comm, int *abort_needed) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            if (rank == 0) eval_usage(pl_out);
            return 0;
        }
    sub_opt so[] = {{"batches", 0, NULL}, {"json", 0, NULL}};
    char **rest = NULL, err[1024] = "";
    int nrest = 0;
    pl_options o;
    config_defaults(&o);
    long long nb = 0;
    int rc = sub_opts_take(argc, argv, 2, CFG_CMD_EVAL, so, 2, &rest, &nrest, err, sizeof err);
    if (rc == PL_OK) rc = config_parse(&o, nrest, rest, 2, CFG_CMD_EVAL, err, sizeof err);
    if (rc == PL_OK && so[0].val) rc = sub_opt_int(&so[0], 0, INT_MAX, &nb, err, sizeof err);
    if (rc == PL_OK) rc = config_validate(&o, err, sizeof err);
    free(rest);
    if (rc == PL_OK && so[1].val && strlen(so[1].val) >= sizeof o.eval_json) {
        snprintf(err, sizeof err, "--json: the path is too long");
        rc = PL_EINVAL;
    }
    if (rc != PL_OK) {
        if (rank == 0) pl_error("%s", err);
        return 2;
    }
    o.eval_mode = 1;
    o.eval_batches = (int)nb;
    if (so[1].val) snprintf(o.eval_json, sizeof o.eval_json, "%s", so[1].val);
    if (!o.val_data[0]) memcpy(o.val_data, o.data, sizeof o.val_data); /* the evaluated data */
    o.progress = 0;
    int agreed = 1;
    run R;
    double grace;
    rc = run_setup(&R, &o, comm, &grace);
    if (rc == PL_OK) rc = eval_after_setup(&R, &agreed);
    run_teardown(&R, agreed);
    if (rc != PL_OK && !agreed) *abort_needed = 1;
    if (rc == PL_EPREEMPT) return PIPELM_EXIT_PREEMPTED;
    return rc == PL_OK ? 0 : rc == PL_EINVAL ? 2 : 1;
}
