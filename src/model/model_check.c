/*
 * model_check.c — the one validation of a model's and a run's recorded settings
 * (model_check.h).
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "model/model_check.h"
#include "util/common.h"

/* ---- the one validation of a configuration ------------------------------------------------
 * Each range is written once, here; the command line, config files, --init headers and the
 * checkpoint loader all call these, so a setting that trains can always resume. */

/* One checked setting's names: as an option (without "--"), a checkpoint attribute, an llm.c
 * header field. */
typedef struct { const char *opt, *attr, *hdr; } cfg_name;

static const cfg_name N_HEAD = {"n-head", "/config/n_head", "n-head"};
static const cfg_name N_KVHEAD = {"n-kv-head", "/config/n_kv_head", "n-kv-head"};
static const cfg_name N_MULT = {"multiple-of", "/config/multiple_of", "multiple-of"};
static const cfg_name N_SCALED = {"use-scaled-rope", "/config/use_scaled_rope", "use-scaled-rope"};
static const cfg_name N_VMAJ = {"llama-version-major", "/config/llama_version_major", "llama-version-major"};
static const cfg_name N_VMIN = {"llama-version-minor", "/config/llama_version_minor", "llama-version-minor"};
static const cfg_name N_FFN = {"ffn-dim-multiplier", "/config/ffn_dim_multiplier", "ffn-dim-multiplier"};
static const cfg_name N_EPS = {"norm-eps", "/config/norm_eps", "norm-eps"};
static const cfg_name N_THETA = {"rope-theta", "/config/rope_theta", "rope-theta"};

/* The name of n in a message: "--norm-eps", "attribute /config/norm_eps" or "norm-eps";
 * bare: without "--" or "attribute ". */
static void cfg_label(const cfg_name *n, cfg_naming naming, int bare, char *buf, size_t len) {
    if (naming == CFG_NAME_ATTR) snprintf(buf, len, "%s%s", bare ? "" : "attribute ", n->attr);
    else if (naming == CFG_NAME_HEADER) snprintf(buf, len, "%s", n->hdr);
    else snprintf(buf, len, "%s%s", bare ? "" : "--", n->opt);
}

/* "NAME = V is out of range (WANT)" ("--name V ..." for an option), for an integer. */
static int range_int(const cfg_name *n, cfg_naming naming, long long v, long long lo, long long hi, const char *note,
                     char *err, size_t errlen) {
    if (v >= lo && v <= hi) return PL_OK;
    char lab[96];
    cfg_label(n, naming, 0, lab, sizeof lab);
    snprintf(err, errlen, "%s%s%lld is out of range (%lld..%lld%s)", lab, naming == CFG_NAME_OPTION ? " " : " = ", v,
             lo, hi, note ? note : "");
    return PL_EINVAL;
}

/* The same for a number: ok says whether v (finite) is in range, want what the range is. */
static int range_dbl(const cfg_name *n, cfg_naming naming, double v, int ok, const char *want, char *err,
                     size_t errlen) {
    if (isfinite(v) && ok) return PL_OK;
    char lab[96];
    cfg_label(n, naming, 0, lab, sizeof lab);
    snprintf(err, errlen, "%s%s%g is out of range (%s)", lab, naming == CFG_NAME_OPTION ? " " : " = ", v, want);
    return PL_EINVAL;
}

int config_check_llama(const cfg_llama *l, cfg_naming naming, char *err, size_t errlen) {
    PL_TRY(range_int(&N_KVHEAD, naming, l->n_kv_head, 1, l->n_head > 1 ? l->n_head : 1, ", the n-head", err, errlen));
    if (l->n_head % l->n_kv_head != 0) {
        char a[96], b[96];
        cfg_label(&N_HEAD, naming, 1, a, sizeof a);
        cfg_label(&N_KVHEAD, naming, 1, b, sizeof b);
        snprintf(err, errlen, "%s (%lld) must be a multiple of %s (%lld) (grouped-query attention: each key/value "
                 "head serves n-head / n-kv-head query heads)", a, l->n_head, b, l->n_kv_head);
        return PL_EINVAL;
    }
    PL_TRY(range_int(&N_MULT, naming, l->multiple_of, 1, 1 << 20, NULL, err, errlen));
    PL_TRY(range_int(&N_SCALED, naming, l->use_scaled_rope, 0, 1, NULL, err, errlen));
    PL_TRY(range_int(&N_VMAJ, naming, l->ver_major, 3, 3, ", Llama 3", err, errlen));
    PL_TRY(range_int(&N_VMIN, naming, l->ver_minor, 0, 1000, NULL, err, errlen));
    PL_TRY(range_dbl(&N_FFN, naming, l->ffn_mult, l->ffn_mult >= 0 && l->ffn_mult <= 64, "0..64, 0 = none", err,
                     errlen));
    PL_TRY(range_dbl(&N_EPS, naming, l->norm_eps, l->norm_eps > 0 && l->norm_eps <= 1, "> 0 and <= 1", err, errlen));
    return range_dbl(&N_THETA, naming, l->rope_theta, l->rope_theta > 1 && l->rope_theta <= (double)1e30f, "> 1 and <= 1e30",
                     err, errlen);
}


static const cfg_name N_LR = {"lr", "/train/lr", "lr"};
static const cfg_name N_MINLR = {"min-lr", "/train/min_lr", "min-lr"};
static const cfg_name N_CLIP = {"grad-clip", "/train/grad_clip", "grad-clip"};
static const cfg_name N_B1 = {"beta1", "/optim/beta1", "beta1"};
static const cfg_name N_B2 = {"beta2", "/optim/beta2", "beta2"};
static const cfg_name N_EPSO = {"eps", "/optim/eps", "eps"};
static const cfg_name N_WD = {"weight-decay", "/optim/weight_decay", "weight-decay"};
static const cfg_name N_WARM = {"warmup-steps", "/train/warmup_steps", "warmup-steps"};
static const cfg_name N_STEPS = {"steps", "/train/total_steps", "steps"};
static const cfg_name N_BATCH = {"batch", "/train/batch", "batch"};
static const cfg_name N_SEQ = {"seq-len", "/train/seq_len", "seq-len"};
static const cfg_name N_MB = {"microbatches", "/train/microbatches", "microbatches"};
static const cfg_name N_BRANCH = {"markov-branch", "/train/markov_branch", "markov-branch"};

/* The optimizer's numbers of config_check_train: each >= 0 (beta1 and beta2 below 1, eps
 * above 0) and finite. */
static int check_optim_numbers(const cfg_train *t, cfg_naming nm, char *err, size_t errlen) {
    PL_TRY(range_dbl(&N_LR, nm, t->hp.lr, t->hp.lr >= 0, ">= 0 and finite", err, errlen));
    PL_TRY(range_dbl(&N_MINLR, nm, t->hp.min_lr, t->hp.min_lr >= 0, ">= 0 and finite", err, errlen));
    PL_TRY(range_dbl(&N_CLIP, nm, t->hp.grad_clip, t->hp.grad_clip >= 0, ">= 0 and finite", err, errlen));
    PL_TRY(range_dbl(&N_B1, nm, t->hp.beta1, t->hp.beta1 >= 0 && t->hp.beta1 < 1, "in [0, 1)", err, errlen));
    PL_TRY(range_dbl(&N_B2, nm, t->hp.beta2, t->hp.beta2 >= 0 && t->hp.beta2 < 1, "in [0, 1)", err, errlen));
    PL_TRY(range_dbl(&N_EPSO, nm, t->hp.eps, t->hp.eps > 0, "> 0 and finite", err, errlen));
    return range_dbl(&N_WD, nm, t->hp.weight_decay, t->hp.weight_decay >= 0, ">= 0 and finite", err, errlen);
}

int config_check_train(const cfg_train *t, const model_config *model, cfg_naming nm, char *err, size_t errlen) {
    PL_TRY(check_optim_numbers(t, nm, err, errlen));
    if (strcmp(t->hp.lr_schedule, "cosine") != 0 && strcmp(t->hp.lr_schedule, "constant") != 0) {
        if (nm == CFG_NAME_ATTR)
            snprintf(err, errlen, "attribute /train/lr_schedule is '%s', not cosine or constant", t->hp.lr_schedule);
        else snprintf(err, errlen, "--lr-schedule must be cosine or constant (got '%s')", t->hp.lr_schedule);
        return PL_EINVAL;
    }
    PL_TRY(range_int(&N_WARM, nm, t->warmup_steps, 0, INT_MAX, NULL, err, errlen));
    PL_TRY(range_int(&N_STEPS, nm, t->total_steps, 0, INT_MAX, NULL, err, errlen));
    int lo = t->no_run ? 0 : 1;
    PL_TRY(range_int(&N_BATCH, nm, t->batch, lo, INT_MAX, NULL, err, errlen));
    if (model) PL_TRY(range_int(&N_SEQ, nm, t->seq_len, lo, model->maxT, ", the model's max-seq-len", err, errlen));
    PL_TRY(range_int(&N_MB, nm, t->microbatches, lo, t->batch, ", the batch", err, errlen));
    if (!t->no_run && t->batch % t->microbatches != 0) {
        if (nm == CFG_NAME_ATTR)
            snprintf(err, errlen, "attribute /train/batch = %lld is not divisible by /train/microbatches = %lld",
                     t->batch, t->microbatches);
        else snprintf(err, errlen, "--batch %lld is not divisible by --microbatches %lld", t->batch, t->microbatches);
        return PL_EINVAL;
    }
    if (model && t->markov_branch >= 0)
        PL_TRY(range_int(&N_BRANCH, nm, t->markov_branch, 1, model->V, ", the vocab-size", err, errlen));
    return PL_OK;
}
