/*
 * ckpt_meta.c — the metadata of a checkpoint: the root, /config, /optim and /train
 * attributes, written identically by every rank, and the root meta_crc32c, the CRC-32C of
 * their canonical text (docs/formats.md §2). On load every attribute is checked for its type
 * and range, by the same validation the command line uses (config.c), before anything
 * narrows it. What depends on the architecture (its own /config attributes, how they make a
 * config) is asked of its table (arch.h).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/arch.h"
#include "ckpt/ckpt_internal.h"
#include "util/common.h"
#include "cli/config.h"
#include "util/crc32c.h"

/* Every attribute of a checkpoint's metadata, as written or as read back. */
typedef struct {
    char format[64], version[64], created[64], optim_name[32];
    long long format_version, root_step, optim_step;
    double optim_lr;
    long long cfg[6]; /* vocab_size, padded_vocab_size, max_seq_len, n_layer, n_head, n_embd */
    int has_arch;     /* /config/arch present (a file of an older pipelm has none: gpt2) */
    char arch[16];
    /* /config: the architecture's own attributes, in its table's order (attr_int, attr_f64) */
    long long lcfg[ARCH_MAX_ATTRS];
    double lf[ARCH_MAX_ATTRS];
    ckpt_meta m;      /* /train (m.step is /train step) and /optim beta1.. */
    int has_branch;   /* /train markov_branch present */
} meta_all;

/* ---- what depends on the architecture: asked of its table (arch.h) ---------------------- */

/* The datasets of the whole model, in the architecture table's order (the schema's). */
int ckpt_global_tensors(const model_config *c, ckpt_gtensor *g) { return ckpt_schema_of_model(c, g); }

/* meta_all's architecture attributes from a config. */
static void arch_meta_fill(const model_config *c, meta_all *a) { arch_of(c)->attrs_of(c, a->lcfg, a->lf); }

/* The architecture's own /config attributes, written into the open group g. */
static int arch_attrs_write(hid_t g, const model_config *c, const meta_all *a, h5ctx *cx) {
    const model_arch *A = arch_of(c);
    for (int i = 0; i < A->nattr_int; i++) PL_TRY(ckpt_attr_i64(g, A->attr_int[i], a->lcfg[i], cx));
    for (int i = 0; i < A->nattr_f64; i++) PL_TRY(ckpt_attr_f64(g, A->attr_f64[i], a->lf[i], cx));
    return PL_OK;
}

/* The architecture the metadata read names (read_meta_arch checked it exists). */
static const model_arch *meta_arch(const meta_all *a) { return arch_find(a->arch); }

/* /config/arch of the open group g, one of the registry's names; absent (an older pipelm's
 * file): gpt2. */
static int read_meta_arch(hid_t g, meta_all *a, h5ctx *cx) {
    int rc = PL_OK;
    htri_t ha;
    snprintf(cx->obj, sizeof cx->obj, "attribute /config/arch");
    CKPT_H5(ha = H5Aexists(g, "arch"));
    cx->obj[0] = 0;
    a->has_arch = ha > 0;
    snprintf(a->arch, sizeof a->arch, "gpt2");
    if (a->has_arch && (rc = ckpt_attr_get_str(g, "/config", "arch", a->arch, sizeof a->arch, cx))) goto done;
    if (!arch_find(a->arch)) {
        char names[64];
        arch_names(" or ", names, sizeof names);
        rc = ckpt_fail(cx, PL_EIO, "attribute /config/arch is '%s', not %s", a->arch, names);
    }
done:
    return rc;
}

/* The model /config describes (its 64-bit values a->cfg range-checked already), into *cfg:
 * the architecture's attributes (every one required) read, then range-checked and made by
 * its table's config_of_attrs before anything narrows them. */
static int arch_config_make(hid_t g, meta_all *a, model_config *cfg, h5ctx *cx) {
    const model_arch *A = meta_arch(a);
    for (int i = 0; i < A->nattr_int; i++) PL_TRY(ckpt_attr_get_i64(g, "/config", A->attr_int[i], &a->lcfg[i], cx));
    for (int i = 0; i < A->nattr_f64; i++) PL_TRY(ckpt_attr_get_f64(g, "/config", A->attr_f64[i], &a->lf[i], cx));
    char e2[640];
    if (A->config_of_attrs(a->cfg, a->lcfg, a->lf, cfg, e2, sizeof e2) != PL_OK) return ckpt_fail(cx, PL_EIO, "%s", e2);
    return PL_OK;
}

/* ---- the hyper-parameters (hparams.h): one table, one function pair -------------------- */

/* Where each hyper-parameter lives in the file, in file order: the AdamW settings under
 * /optim, the schedule under /train. Written, read and put into the canonical text from
 * this table alone. */
typedef struct {
    const char *grp, *name;
    char type; /* 'd' double (float64), 'i' int (int64 in the file), 's' string */
    size_t off;
} hp_attr;
static const hp_attr hp_attrs[] = {
    {"optim", "beta1", 'd', offsetof(optim_hparams, beta1)},
    {"optim", "beta2", 'd', offsetof(optim_hparams, beta2)},
    {"optim", "eps", 'd', offsetof(optim_hparams, eps)},
    {"optim", "weight_decay", 'd', offsetof(optim_hparams, weight_decay)},
    {"train", "lr", 'd', offsetof(optim_hparams, lr)},
    {"train", "min_lr", 'd', offsetof(optim_hparams, min_lr)},
    {"train", "warmup_steps", 'i', offsetof(optim_hparams, warmup_steps)},
    {"train", "total_steps", 'i', offsetof(optim_hparams, total_steps)},
    {"train", "lr_schedule", 's', offsetof(optim_hparams, lr_schedule)},
    {"train", "grad_clip", 'd', offsetof(optim_hparams, grad_clip)},
};
#define HP_NATTR ((int)(sizeof hp_attrs / sizeof hp_attrs[0]))

/* Write the hyper-parameters of group grp ("optim" or "train") into the open group g. */
static int hp_write(hid_t g, const char *grp, const optim_hparams *h, h5ctx *cx) {
    for (int i = 0; i < HP_NATTR; i++) {
        const hp_attr *a = &hp_attrs[i];
        const char *p = (const char *)h + a->off;
        if (strcmp(a->grp, grp) != 0) continue;
        if (a->type == 'd') PL_TRY(ckpt_attr_f64(g, a->name, *(const double *)p, cx));
        else if (a->type == 'i') PL_TRY(ckpt_attr_i64(g, a->name, *(const int *)p, cx));
        else PL_TRY(ckpt_attr_str(g, a->name, p, cx));
    }
    return PL_OK;
}

/* Read the hyper-parameters of group grp from the open group g into h, in the table's order.
 * The integers are read as 64-bit values into wide[0], wide[1], ... (in table order), not
 * into h: the caller range-checks them before they narrow (ckpt_read_meta). */
static int hp_read(hid_t g, const char *grp, optim_hparams *h, long long *wide, h5ctx *cx) {
    char lab[16];
    snprintf(lab, sizeof lab, "/%s", grp);
    for (int i = 0, w = 0; i < HP_NATTR; i++) {
        const hp_attr *a = &hp_attrs[i];
        char *p = (char *)h + a->off;
        if (strcmp(a->grp, grp) != 0) continue;
        if (a->type == 'd') PL_TRY(ckpt_attr_get_f64(g, lab, a->name, (double *)p, cx));
        else if (a->type == 'i') PL_TRY(ckpt_attr_get_i64(g, lab, a->name, &wide[w++], cx));
        else PL_TRY(ckpt_attr_get_str(g, lab, a->name, p, sizeof h->lr_schedule, cx));
    }
    return PL_OK;
}

/* The canonical text of the hyper-parameters of group grp (see meta_canon), appended at *o. */
static void hp_canon(const char *grp, const optim_hparams *h, char *buf, size_t len, size_t *o) {
    for (int i = 0; i < HP_NATTR && *o < len; i++) {
        const hp_attr *a = &hp_attrs[i];
        const char *p = (const char *)h + a->off;
        if (strcmp(a->grp, grp) != 0) continue;
        if (a->type == 'd') *o += (size_t)snprintf(buf + *o, len - *o, "/%s/%s=%.17g\n", grp, a->name, *(const double *)p);
        else if (a->type == 'i') *o += (size_t)snprintf(buf + *o, len - *o, "/%s/%s=%d\n", grp, a->name, *(const int *)p);
        else *o += (size_t)snprintf(buf + *o, len - *o, "/%s/%s=%s\n", grp, a->name, p);
    }
}

/* The canonical text of the metadata that meta_crc32c covers (docs/formats.md): one
 * "path=value\n" line per attribute in a fixed order; integers in decimal, floats as
 * printf("%.17g"), strings as stored, split as comma-separated decimals. Returns its length
 * (or 0 if buf is too small). */
static size_t meta_canon(const meta_all *a, char *buf, size_t len) {
    static const char *const cn[6] = {"vocab_size", "padded_vocab_size", "max_seq_len", "n_layer", "n_head", "n_embd"};
    const ckpt_meta *m = &a->m;
    size_t o = 0;
#define CANON(...) do { if (o < len) o += (size_t)snprintf(buf + o, len - o, __VA_ARGS__); } while (0)
    CANON("format=%s\nformat_version=%lld\npipelm_version=%s\nstep=%lld\ncreated=%s\n", a->format,
          a->format_version, a->version, a->root_step, a->created);
    for (int i = 0; i < 6; i++) CANON("/config/%s=%lld\n", cn[i], a->cfg[i]);
    if (a->has_arch) CANON("/config/arch=%s\n", a->arch);
    const model_arch *A = meta_arch(a);
    if (A) {
        for (int i = 0; i < A->nattr_int; i++) CANON("/config/%s=%lld\n", A->attr_int[i], a->lcfg[i]);
        for (int i = 0; i < A->nattr_f64; i++) CANON("/config/%s=%.17g\n", A->attr_f64[i], a->lf[i]);
    }
    CANON("/optim/name=%s\n", a->optim_name);
    hp_canon("optim", &m->hp, buf, len, &o);
    CANON("/optim/lr=%.17g\n/optim/step=%lld\n", a->optim_lr, a->optim_step);
    CANON("/train/step=%lld\n/train/tokens_seen=%lld\n/train/data_pos=%lld\n/train/seed=%lld\n/train/data_seed=%lld\n"
          "/train/data=%s\n", m->step, m->tokens_seen, m->data_pos, m->seed, m->data_seed, m->data);
    hp_canon("train", &m->hp, buf, len, &o);
    CANON("/train/batch=%d\n/train/seq_len=%d\n/train/microbatches=%d\n/train/schedule=%s\n/train/nstages=%d\n"
          "/train/split=", m->batch, m->seq_len, m->microbatches, m->schedule, m->nstages);
    for (int i = 0; i < m->nstages && i < CKPT_MAX_STAGES; i++) CANON("%s%d", i ? "," : "", m->split[i]);
    CANON("\n");
    if (a->has_branch) CANON("/train/markov_branch=%d\n", m->markov_branch);
    if (m->shards[0]) CANON("/train/shards=%s\n", m->shards);
#undef CANON
    return o < len ? o : 0;
}

/* CRC-32C of the canonical metadata text (0 if it does not fit, which cannot happen for
 * values that passed the range checks). */
static uint32_t meta_crc(const meta_all *a) {
    size_t cap = 16384 + 8 * CKPT_MAX_STAGES + CKPT_SHARDS_LEN;
    char *buf = malloc(cap);
    if (!buf) return 0;
    size_t n = meta_canon(a, buf, cap);
    uint32_t c = crc32c(buf, n);
    free(buf);
    return c;
}

/* The root, /config, /optim and /train attributes (identical on every rank), and the root
 * meta_crc32c over all of them. */
int ckpt_write_meta(hid_t f, const model_config *c, const ckpt_meta *m, const char *created, h5ctx *cx) {
    int rc = PL_OK;
    hid_t g = -1;
    meta_all all;
    memset(&all, 0, sizeof all);
    snprintf(all.format, sizeof all.format, "%s", CKPT_FORMAT);
    snprintf(all.version, sizeof all.version, "%s", PACKAGE_VERSION);
    snprintf(all.created, sizeof all.created, "%s", created);
    snprintf(all.optim_name, sizeof all.optim_name, "adamw");
    all.format_version = CKPT_FORMAT_VERSION;
    all.root_step = all.optim_step = m->step;
    all.optim_lr = m->hp.lr;
    long long cv[6] = {c->V, c->Vp, c->maxT, c->L, c->NH, c->C};
    memcpy(all.cfg, cv, sizeof cv);
    all.has_arch = 1;
    snprintf(all.arch, sizeof all.arch, "%s", model_arch_name(c->arch));
    arch_meta_fill(c, &all);
    all.m = *m;
    all.m.nstages = m->nstages > 0 && m->nstages <= CKPT_MAX_STAGES ? m->nstages : 0;
    all.has_branch = m->markov_branch > 0; /* written only when the run says (<= 0: not known) */
    PL_TRY(ckpt_attr_str(f, "format", CKPT_FORMAT, cx));
    PL_TRY(ckpt_attr_i64(f, "format_version", CKPT_FORMAT_VERSION, cx));
    PL_TRY(ckpt_attr_str(f, "pipelm_version", PACKAGE_VERSION, cx));
    PL_TRY(ckpt_attr_i64(f, "step", m->step, cx));
    PL_TRY(ckpt_attr_str(f, "created", created, cx));
    uint32_t mcrc = meta_crc(&all);
    PL_TRY(ckpt_attr_write(f, "meta_crc32c", H5T_STD_U32LE, H5T_NATIVE_UINT32, 0, &mcrc, cx));

    PL_TRY(ckpt_group_create(f, "config", &g, cx));
    if ((rc = ckpt_attr_i64(g, "vocab_size", c->V, cx)) || (rc = ckpt_attr_i64(g, "padded_vocab_size", c->Vp, cx)) ||
        (rc = ckpt_attr_i64(g, "max_seq_len", c->maxT, cx)) || (rc = ckpt_attr_i64(g, "n_layer", c->L, cx)) ||
        (rc = ckpt_attr_i64(g, "n_head", c->NH, cx)) || (rc = ckpt_attr_i64(g, "n_embd", c->C, cx)) ||
        (rc = ckpt_attr_str(g, "arch", all.arch, cx)))
        goto done;
    if ((rc = arch_attrs_write(g, c, &all, cx))) goto done;
    if ((rc = ckpt_obj_close(&g, cx))) goto done;
    PL_TRY(ckpt_group_create(f, "optim", &g, cx));
    if ((rc = ckpt_attr_str(g, "name", "adamw", cx)) || (rc = hp_write(g, "optim", &m->hp, cx)) ||
        (rc = ckpt_attr_f64(g, "lr", m->hp.lr, cx)) || (rc = ckpt_attr_i64(g, "step", m->step, cx)))
        goto done;
    if ((rc = ckpt_obj_close(&g, cx))) goto done;
    PL_TRY(ckpt_group_create(f, "train", &g, cx));
    int ns = all.m.nstages;
    if ((rc = ckpt_attr_i64(g, "step", m->step, cx)) || (rc = ckpt_attr_i64(g, "tokens_seen", m->tokens_seen, cx)) ||
        (rc = ckpt_attr_i64(g, "data_pos", m->data_pos, cx)) || (rc = ckpt_attr_i64(g, "seed", m->seed, cx)) ||
        (rc = ckpt_attr_i64(g, "data_seed", m->data_seed, cx)) || (rc = ckpt_attr_str(g, "data", m->data, cx)) ||
        (rc = hp_write(g, "train", &m->hp, cx)) ||
        (rc = ckpt_attr_i64(g, "batch", m->batch, cx)) || (rc = ckpt_attr_i64(g, "seq_len", m->seq_len, cx)) ||
        (rc = ckpt_attr_i64(g, "microbatches", m->microbatches, cx)) ||
        (rc = ckpt_attr_str(g, "schedule", m->schedule, cx)) || (rc = ckpt_attr_i64(g, "nstages", ns, cx)) ||
        (all.has_branch && (rc = ckpt_attr_i64(g, "markov_branch", m->markov_branch, cx))) ||
        (m->shards[0] && (rc = ckpt_attr_str(g, "shards", m->shards, cx))))
        goto done;
    if (ns > 0 && (rc = ckpt_attr_write(g, "split", H5T_STD_I32LE, H5T_NATIVE_INT, ns, m->split, cx))) goto done;
    rc = ckpt_obj_close(&g, cx);
done:
    if (g >= 0) H5Gclose(g);
    return rc;
}


/* ---- loading ---------------------------------------------------------------------------- */

/* Range checks of the metadata read back, each naming the attribute and its value. */
#define CKPT_MAX_STEP 2147483646LL /* steps are int in a run, and the next step must be too */
#define META_INT_IN(lab, v, lo, hi)                                                               \
    do {                                                                                          \
        if ((v) < (lo) || (v) > (hi))                                                             \
            return ckpt_fail(cx, PL_EIO, "attribute %s = %lld is out of range (%lld..%lld)", lab,  \
                             (long long)(v), (long long)(lo), (long long)(hi));                    \
    } while (0)
#define META_DBL_OK(lab, v, cond, want)                                                           \
    do {                                                                                          \
        if (!isfinite(v) || !(cond))                                                              \
            return ckpt_fail(cx, PL_EIO, "attribute %s = %g is out of range (%s)", lab, (v), want); \
    } while (0)

/* Check every value of the metadata for range and consistency (see ckpt.h). */
static int validate_meta(const meta_all *a, const long long *tr, h5ctx *cx) {
    const ckpt_meta *m = &a->m;
    META_INT_IN("/step", a->root_step, 0, CKPT_MAX_STEP);
    if (tr[0] != a->root_step || a->optim_step != a->root_step)
        return ckpt_fail(cx, PL_EIO, "attributes /step = %lld, /train/step = %lld and /optim/step = %lld disagree",
                         a->root_step, tr[0], a->optim_step);
    META_INT_IN("/train/tokens_seen", m->tokens_seen, 0, LLONG_MAX);
    META_INT_IN("/train/data_pos", m->data_pos, 0, LLONG_MAX);
    /* batch, seq_len, microbatches and schedule are all 0 / empty in a file that no run saved
     * (pipelm convert); otherwise they are a valid run's */
    int norun = tr[3] == 0 && tr[4] == 0 && tr[5] == 0 && !m->schedule[0];
    long long maxst = a->cfg[3] + 2 < CKPT_MAX_STAGES ? a->cfg[3] + 2 : CKPT_MAX_STAGES;
    META_INT_IN("/train/nstages", tr[6], 1, maxst);
    META_DBL_OK("/optim/lr", a->optim_lr, a->optim_lr >= 0, ">= 0 and finite");
    /* the training settings: the one validation the command line uses too (config.c) */
    cfg_train t = {.hp = m->hp, .warmup_steps = tr[1], .total_steps = tr[2], .batch = tr[3], .seq_len = tr[4],
                   .microbatches = tr[5], .markov_branch = a->has_branch ? tr[7] : -1, .no_run = norun};
    model_config bounds; /* what config_check_train reads of the model: V and maxT, 1..INT_MAX here */
    memset(&bounds, 0, sizeof bounds);
    bounds.V = (int)a->cfg[0];
    bounds.maxT = (int)a->cfg[2];
    char e2[512];
    if (config_check_train(&t, &bounds, CFG_NAME_ATTR, e2, sizeof e2) != PL_OK) return ckpt_fail(cx, PL_EIO, "%s", e2);
    if (strcmp(a->optim_name, "adamw") != 0)
        return ckpt_fail(cx, PL_EIO, "attribute /optim/name is '%s', not 'adamw'", a->optim_name);
    if (!norun && !m->schedule[0]) return ckpt_fail(cx, PL_EIO, "attribute /train/schedule is empty");
    long long sum = 0;
    for (int s = 0; s < m->nstages; s++) {
        if (m->split[s] < 0 || (m->split[s] == 0 && s > 0 && s < m->nstages - 1))
            return ckpt_fail(cx, PL_EIO, "attribute /train/split: stage %d holds %d blocks (at least %d)", s,
                             m->split[s], s > 0 && s < m->nstages - 1 ? 1 : 0);
        sum += m->split[s];
    }
    if (sum != a->cfg[3])
        return ckpt_fail(cx, PL_EIO, "attribute /train/split adds up to %lld blocks but /config/n_layer is %lld", sum,
                         a->cfg[3]);
    return PL_OK;
}

/* The root attributes: format and format_version must be this pipelm's; pipelm_version,
 * step and created are read for the checksum (step is range-checked by validate_meta). */
static int read_meta_root(hid_t f, meta_all *a, h5ctx *cx) {
    PL_TRY(ckpt_attr_get_str(f, "/", "format", a->format, sizeof a->format, cx));
    if (strcmp(a->format, CKPT_FORMAT) != 0)
        return ckpt_fail(cx, PL_EIO, "format is '%s', not '%s'", a->format, CKPT_FORMAT);
    PL_TRY(ckpt_attr_get_i64(f, "/", "format_version", &a->format_version, cx));
    if (a->format_version != CKPT_FORMAT_VERSION)
        return ckpt_fail(cx, PL_EIO, "format_version is %lld; this pipelm reads version %d", a->format_version,
                         CKPT_FORMAT_VERSION);
    PL_TRY(ckpt_attr_get_str(f, "/", "pipelm_version", a->version, sizeof a->version, cx));
    PL_TRY(ckpt_attr_get_i64(f, "/", "step", &a->root_step, cx));
    PL_TRY(ckpt_attr_get_str(f, "/", "created", a->created, sizeof a->created, cx));
    return PL_OK;
}



/* /config: 64-bit, range-checked by gpt2_config_make before anything narrows them; the
 * model it describes goes to *cfg. */
static int read_meta_config(hid_t f, meta_all *a, model_config *cfg, h5ctx *cx) {
    static const char *const cn[6] = {"vocab_size", "padded_vocab_size", "max_seq_len", "n_layer", "n_head", "n_embd"};
    int rc = PL_OK;
    hid_t g = -1;
    if ((rc = ckpt_group_open(f, "config", &g, cx))) goto done;
    for (int i = 0; i < 6; i++)
        if ((rc = ckpt_attr_get_i64(g, "/config", cn[i], &a->cfg[i], cx))) goto done;
    for (int i = 0; i < 6; i++)
        if (a->cfg[i] < 1 || a->cfg[i] > INT_MAX) {
            rc = ckpt_fail(cx, PL_EIO, "attribute /config/%s = %lld is out of range (1..%d)", cn[i], a->cfg[i],
                           INT_MAX);
            goto done;
        }
    if ((rc = read_meta_arch(g, a, cx)) || (rc = arch_config_make(g, a, cfg, cx))) goto done;
    if (cfg->Vp != a->cfg[1]) {
        rc = ckpt_fail(cx, PL_EIO, "padded_vocab_size %lld is not vocab_size %lld rounded up to 128", a->cfg[1],
                       a->cfg[0]);
        goto done;
    }
    rc = ckpt_obj_close(&g, cx);
done:
    if (g >= 0) H5Gclose(g);
    return rc;
}

/* /optim: the AdamW settings and the optimizer's own lr and step (checked by validate_meta). */
static int read_meta_optim(hid_t f, meta_all *a, h5ctx *cx) {
    ckpt_meta *m = &a->m;
    int rc = PL_OK;
    hid_t g = -1;
    if ((rc = ckpt_group_open(f, "optim", &g, cx))) goto done;
    if ((rc = ckpt_attr_get_str(g, "/optim", "name", a->optim_name, sizeof a->optim_name, cx)) ||
        (rc = hp_read(g, "optim", &m->hp, NULL, cx)) ||
        (rc = ckpt_attr_get_f64(g, "/optim", "lr", &a->optim_lr, cx)) ||
        (rc = ckpt_attr_get_i64(g, "/optim", "step", &a->optim_step, cx)))
        goto done;
    rc = ckpt_obj_close(&g, cx);
done:
    if (g >= 0) H5Gclose(g);
    return rc;
}

/* The scalar attributes of the open /train group g, in a fixed order (the same on every
 * rank), and the optional markov_branch (a->has_branch says whether it is there). The
 * int-valued ones land in tr[] as 64-bit values (see ckpt_read_meta), so that they are
 * range-checked before anything narrows them. */
static int read_meta_train_scalars(hid_t g, meta_all *a, long long *tr, h5ctx *cx) {
    ckpt_meta *m = &a->m;
    int rc = PL_OK;
    if ((rc = ckpt_attr_get_i64(g, "/train", "step", &tr[0], cx)) ||
        (rc = ckpt_attr_get_i64(g, "/train", "tokens_seen", &m->tokens_seen, cx)) ||
        (rc = ckpt_attr_get_i64(g, "/train", "data_pos", &m->data_pos, cx)) ||
        (rc = ckpt_attr_get_i64(g, "/train", "seed", &m->seed, cx)) ||
        (rc = ckpt_attr_get_i64(g, "/train", "data_seed", &m->data_seed, cx)) ||
        (rc = ckpt_attr_get_str(g, "/train", "data", m->data, sizeof m->data, cx)) ||
        (rc = hp_read(g, "train", &m->hp, &tr[1], cx)) || /* warmup_steps, total_steps: tr[1], tr[2] */
        (rc = ckpt_attr_get_i64(g, "/train", "batch", &tr[3], cx)) || (rc = ckpt_attr_get_i64(g, "/train", "seq_len", &tr[4], cx)) ||
        (rc = ckpt_attr_get_i64(g, "/train", "microbatches", &tr[5], cx)) ||
        (rc = ckpt_attr_get_str(g, "/train", "schedule", m->schedule, sizeof m->schedule, cx)) ||
        (rc = ckpt_attr_get_i64(g, "/train", "nstages", &tr[6], cx)))
        goto done;
    htri_t hb;
    snprintf(cx->obj, sizeof cx->obj, "attribute /train/markov_branch");
    CKPT_H5(hb = H5Aexists(g, "markov_branch"));
    a->has_branch = hb > 0;
    if (a->has_branch && (rc = ckpt_attr_get_i64(g, "/train", "markov_branch", &tr[7], cx))) goto done;
    snprintf(cx->obj, sizeof cx->obj, "attribute /train/shards");
    CKPT_H5(hb = H5Aexists(g, "shards"));
    if (hb > 0 && (rc = ckpt_attr_get_str(g, "/train", "shards", m->shards, sizeof m->shards, cx))) goto done;
    cx->obj[0] = 0;
done:
    return rc;
}

/* /train/split of the open group g: nstages (tr[6]) is range-checked first, since it sizes
 * the read, then each stage's block count against n_layer, before they narrow to int. */
static int read_meta_split(hid_t g, meta_all *a, const long long *tr, h5ctx *cx) {
    ckpt_meta *m = &a->m;
    /* middle stages hold a block */
    long long maxst = a->cfg[3] + 2 < CKPT_MAX_STAGES ? a->cfg[3] + 2 : CKPT_MAX_STAGES;
    if (tr[6] < 1 || tr[6] > maxst)
        return ckpt_fail(cx, PL_EIO, "attribute /train/nstages = %lld is out of range (1..%lld for n_layer %lld)",
                         tr[6], maxst, a->cfg[3]);
    m->nstages = (int)tr[6];
    long long sp[CKPT_MAX_STAGES];
    PL_TRY(ckpt_attr_read(g, "/train", "split", H5T_NATIVE_LLONG, m->nstages, sp, cx));
    for (int s = 0; s < m->nstages; s++) {
        if (sp[s] < 0 || sp[s] > a->cfg[3])
            return ckpt_fail(cx, PL_EIO, "attribute /train/split: stage %d holds %lld blocks (0..%lld)", s, sp[s],
                             a->cfg[3]);
        m->split[s] = (int)sp[s];
    }
    return PL_OK;
}

/* /train: the run's state (read_meta_train_scalars) and its split (read_meta_split). */
static int read_meta_train(hid_t f, meta_all *a, long long *tr, h5ctx *cx) {
    int rc = PL_OK;
    hid_t g = -1;
    if ((rc = ckpt_group_open(f, "train", &g, cx))) goto done;
    if ((rc = read_meta_train_scalars(g, a, tr, cx)) || (rc = read_meta_split(g, a, tr, cx))) goto done;
    rc = ckpt_obj_close(&g, cx);
done:
    if (g >= 0) H5Gclose(g);
    return rc;
}

/* The checksum over all of the metadata: verified against the root meta_crc32c where the
 * file has one (m.meta_verified = 1); a file without one (an older pipelm's) is noted on
 * rank 0 and accepted on its range checks alone. a must be complete (see meta_canon). */
static int check_meta_crc(hid_t f, meta_all *a, h5ctx *cx) {
    ckpt_meta *m = &a->m;
    int rc = PL_OK;
    htri_t hc;
    snprintf(cx->obj, sizeof cx->obj, "attribute /meta_crc32c");
    CKPT_H5(hc = H5Aexists(f, "meta_crc32c"));
    cx->obj[0] = 0;
    if (hc > 0) {
        long long stored;
        if ((rc = ckpt_attr_get_i64(f, "/", "meta_crc32c", &stored, cx))) goto done;
        uint32_t computed = meta_crc(a);
        if (stored < 0 || stored > 0xffffffffLL || (uint32_t)stored != computed) {
            rc = ckpt_fail(cx, PL_EIO, "metadata checksum mismatch: meta_crc32c is 0x%08llx but the attributes give "
                           "0x%08x (an attribute was changed after the save, or the file is damaged)",
                           (unsigned long long)stored & 0xffffffffULL, (unsigned)computed);
            goto done;
        }
        m->meta_verified = 1;
    } else {
        m->meta_verified = 0;
        if (cx->rank == 0)
            fprintf(stderr, "pipelm: rank 0: note: checkpoint %s has no meta_crc32c attribute (saved by an older "
                    "pipelm): its metadata is range-checked but cannot be verified\n", cx->file);
    }
done:
    return rc;
}

/* Check the root attributes (format, version), read /config and the metadata, check every
 * value's type and range, and verify meta_crc32c where the file has one. Every rank makes
 * the same HDF5 calls in the same order: root, /config, /optim, /train, meta_crc32c. */
int ckpt_read_meta(hid_t f, model_config *cfg_out, ckpt_meta *m_out, h5ctx *cx) {
    int rc = PL_OK;
    meta_all a;
    memset(&a, 0, sizeof a);
    ckpt_meta *m = &a.m;
    /* /train step, warmup_steps, total_steps, batch, seq_len, microbatches, nstages, markov_branch */
    long long tr[8] = {0};
    model_config cfg;
    PL_TRY(read_meta_root(f, &a, cx));
    if ((rc = read_meta_config(f, &a, &cfg, cx)) || (rc = read_meta_optim(f, &a, cx)) ||
        (rc = read_meta_train(f, &a, tr, cx)) || (rc = validate_meta(&a, tr, cx)))
        goto done;
    m->step = a.root_step;
    m->hp.warmup_steps = (int)tr[1];
    m->hp.total_steps = (int)tr[2];
    m->batch = (int)tr[3];
    m->seq_len = (int)tr[4];
    m->microbatches = (int)tr[5];
    m->markov_branch = a.has_branch ? (int)tr[7] : -1;
    if ((rc = check_meta_crc(f, &a, cx))) goto done;
    if (cfg_out) *cfg_out = cfg;
    if (m_out) *m_out = *m;
done:
    if (rc == PL_OK) cx->obj[0] = 0;
    return rc;
}

/* The /config of the file must equal the run's model; name the first difference. */
int ckpt_check_config(const model_config *f, const model_config *r, h5ctx *cx) {
    if (f->arch != r->arch)
        return ckpt_fail(cx, PL_EINVAL, "arch is %s in the file but %s in this run", model_arch_name(f->arch),
                         model_arch_name(r->arch));
    const char *names[] = {"vocab_size", "padded_vocab_size", "max_seq_len", "n_layer", "n_head", "n_embd",
                           "n_kv_head", "ffn_hidden"};
    int a[] = {f->V, f->Vp, f->maxT, f->L, f->NH, f->C, f->NKV, f->H};
    int b[] = {r->V, r->Vp, r->maxT, r->L, r->NH, r->C, r->NKV, r->H};
    for (int i = 0; i < 8; i++)
        if (a[i] != b[i])
            return ckpt_fail(cx, PL_EINVAL, "%s is %d in the file but %d in this run", names[i], a[i], b[i]);
    char e2[256];
    if (arch_of(r)->same_settings(f, r, CFG_NAME_ATTR, e2, sizeof e2) != PL_OK)
        return ckpt_fail(cx, PL_EINVAL, "%s", e2);
    return PL_OK;
}

