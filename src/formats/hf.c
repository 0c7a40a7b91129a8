/*
 * hf.c — Hugging Face models in (hf.h): finding config.json and the safetensors shards,
 * config.json through the architecture's reader, every tensor name checked against the
 * architecture's hf_name column, and each of a stage's tensors assembled from its parts
 * (transposed, un-permuted from rotate-half, stacked), converted to fp32.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <dirent.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "model/arch.h"
#include "util/common.h"
#include "formats/hf.h"
#include "formats/hf_internal.h"
#include "formats/safetensors.h"

#define HF_PATH 4200
#define HF_MAX_SHARDS 4096

/* The opened files of one model: its shards and the prefix before every name. */
typedef struct {
    int n;
    st_file *f;
    char prefix[64];
} hf_files;

int hf_is_model(const char *path) {
    struct stat sb;
    size_t n = strlen(path);
    if (n > 12 && strcmp(path + n - 12, ".safetensors") == 0) return 1;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* config.json of a model path: DIR/config.json, or the one beside FILE.safetensors. */
static void config_path(const char *path, char *out, size_t len) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(out, len, "%s/config.json", path);
        return;
    }
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, len, "config.json");
    else snprintf(out, len, "%.*s/config.json", (int)(slash - path), path);
}


int hf_read_config(const char *path, model_config *cfg, char *err, size_t errlen) {
    char cp[HF_PATH];
    config_path(path, cp, sizeof cp);
    json_error_t je;
    json_t *root = json_load_file(cp, JSON_REJECT_DUPLICATES, &je);
    if (!root || !json_is_object(root)) {
        snprintf(err, errlen, "%s: %s", cp, root ? "not a JSON object" : je.text);
        json_decref(root);
        return PL_EIO;
    }
    const char *mt = hf_json_str(root, "model_type");
    const model_arch *A = NULL;
    for (int i = 0; mt && i < arch_count; i++)
        if (arch_registry[i]->hf_model_type && strcmp(arch_registry[i]->hf_model_type, mt) == 0) A = arch_registry[i];
    int rc = PL_EIO;
    if (!A) snprintf(err, errlen, "%s: model_type %.64s%s is not one pipelm trains (gpt2, llama or mixtral)", cp,
                     mt ? mt : "(missing)", "");
    else rc = A->hf_config_read(root, cp, cfg, err, errlen);
    json_decref(root);
    return rc;
}

/* A directory read through its index: every .safetensors file in it must be one the index
 * names (a model.safetensors or shards left by another save would be a second model). */
static int check_unnamed(const char *path, char (*names)[HF_PATH], int n, char *err, size_t errlen) {
    DIR *d = opendir(path);
    if (!d) return PL_OK;
    struct dirent *e;
    int rc = PL_OK;
    while (rc == PL_OK && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l <= 12 || strcmp(e->d_name + l - 12, ".safetensors") != 0) continue;
        char full[HF_PATH];
        snprintf(full, sizeof full, "%s/%s", path, e->d_name);
        int named = 0;
        for (int i = 0; i < n && !named; i++) named = strcmp(names[i], full) == 0;
        if (!named) {
            snprintf(err, errlen, "%s holds %.255s, which its model.safetensors.index.json does not name: %s",
                     path, e->d_name, strcmp(e->d_name, "model.safetensors") == 0 ? "a single file and an index "
                     "(two models; remove the stale one)" : "a stale shard (remove it)");
            rc = PL_EIO;
        }
    }
    closedir(d);
    return rc;
}

/* The directory has no index: shards named like an index's (model-00001-of-00002...) are
 * left from a sharded save whose index is gone. */
static int check_orphans(const char *path, char *err, size_t errlen) {
    DIR *d = opendir(path);
    if (!d) return PL_OK;
    struct dirent *e;
    int rc = PL_OK;
    while (rc == PL_OK && (e = readdir(d))) {
        int a, b;
        char tail[32];
        if (sscanf(e->d_name, "model-%d-of-%d%31s", &a, &b, tail) == 3 && strcmp(tail, ".safetensors") == 0) {
            snprintf(err, errlen, "%s holds %.255s but no model.safetensors.index.json: shards of another save "
                     "(remove them)", path, e->d_name);
            rc = PL_EIO;
        }
    }
    closedir(d);
    return rc;
}

/* The shard files: the index's weight_map values (each once), or model.safetensors, or the
 * one file given. */
static int shard_names(const char *path, char (**names)[HF_PATH], int *n, char *err, size_t errlen) {
    struct stat sb;
    *n = 0;
    *names = calloc(HF_MAX_SHARDS, sizeof **names);
    if (!*names) return PL_ENOMEM;
    if (!(stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))) {
        snprintf((*names)[(*n)++], HF_PATH, "%s", path);
        return PL_OK;
    }
    char ix[HF_PATH];
    snprintf(ix, sizeof ix, "%s/model.safetensors.index.json", path);
    if (stat(ix, &sb) != 0) {
        snprintf((*names)[(*n)++], HF_PATH, "%s/model.safetensors", path);
        return check_orphans(path, err, errlen);
    }
    json_error_t je;
    json_t *root = json_load_file(ix, JSON_REJECT_DUPLICATES, &je), *wm = json_object_get(root, "weight_map");
    int rc = PL_OK;
    if (!json_is_object(wm)) {
        snprintf(err, errlen, "%s: %s", ix, root ? "no \"weight_map\" object" : je.text);
        rc = PL_EIO;
    }
    const char *k;
    json_t *v;
    if (rc == PL_OK) json_object_foreach(wm, k, v) {
        const char *s = json_string_value(v);
        if (!s || !s[0] || strchr(s, '/') || strcmp(s, "..") == 0) {
            snprintf(err, errlen, "%s: weight_map[\"%.200s\"] is not a file name in the directory", ix, k);
            rc = PL_EIO;
            break;
        }
        int seen = 0;
        char full[HF_PATH];
        snprintf(full, sizeof full, "%s/%s", path, s);
        for (int i = 0; i < *n && !seen; i++) seen = strcmp((*names)[i], full) == 0;
        if (!seen && *n >= HF_MAX_SHARDS) {
            snprintf(err, errlen, "%s: more than %d shard files", ix, HF_MAX_SHARDS);
            rc = PL_EIO;
            break;
        }
        if (!seen) snprintf((*names)[(*n)++], HF_PATH, "%s", full);
    }
    json_decref(root);
    return rc == PL_OK ? check_unnamed(path, *names, *n, err, errlen) : rc;
}

static void close_files(hf_files *h) {
    for (int i = 0; i < h->n; i++) st_close(&h->f[i]);
    free(h->f);
    h->f = NULL;
    h->n = 0;
}

/* The tensor of a full name in any shard (a name in two shards is refused at open). */
static const st_tensor *find_tensor(const hf_files *h, const char *name, const st_file **in) {
    for (int i = 0; i < h->n; i++) {
        const st_tensor *t = st_find(&h->f[i], name);
        if (t) {
            *in = &h->f[i];
            return t;
        }
    }
    return NULL;
}

/* With an index: every name it maps is in the shard it names, and every tensor of the shards
 * is mapped (a shard holding a tensor the index puts elsewhere is refused). */
static int check_index(const char *path, const hf_files *h, char *err, size_t errlen) {
    char ix[HF_PATH];
    struct stat sb;
    snprintf(ix, sizeof ix, "%s/model.safetensors.index.json", path);
    if (!(stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) || stat(ix, &sb) != 0) return PL_OK;
    json_t *root = json_load_file(ix, JSON_REJECT_DUPLICATES, NULL), *wm = json_object_get(root, "weight_map");
    int rc = PL_OK;
    size_t mapped = 0, held = 0;
    const char *k;
    json_t *v;
    json_object_foreach(wm, k, v) {
        char full[HF_PATH];
        snprintf(full, sizeof full, "%s/%s", path, json_string_value(v));
        const st_file *in = NULL;
        for (int i = 0; i < h->n && !in; i++)
            if (strcmp(h->f[i].path, full) == 0) in = &h->f[i];
        if (!in || !st_find(in, k)) {
            snprintf(err, errlen, "%s: weight_map puts tensor %.200s in %.200s, which does not hold it", ix, k,
                     json_string_value(v));
            rc = PL_EIO;
            break;
        }
        mapped++;
    }
    for (int i = 0; i < h->n; i++) held += (size_t)h->f[i].n;
    if (rc == PL_OK && held != mapped) {
        snprintf(err, errlen, "%s: the shards hold %zu tensors, but weight_map names %zu", ix, held, mapped);
        rc = PL_EIO;
    }
    json_decref(root);
    return rc;
}

/* Open every shard, refuse a name held twice, and find the prefix: what the file puts before
 * the token embedding's name (embedding row 0 of every architecture). */
static int open_files(const char *path, const model_config *c, hf_files *h, char *err, size_t errlen) {
    char (*names)[HF_PATH] = NULL;
    memset(h, 0, sizeof *h);
    int rc = shard_names(path, &names, &h->n, err, errlen);
    h->f = rc == PL_OK ? calloc((size_t)h->n, sizeof *h->f) : NULL;
    if (rc == PL_OK && !h->f) rc = PL_ENOMEM;
    int opened = 0;
    for (; rc == PL_OK && opened < h->n; opened++) rc = st_open(names[opened], &h->f[opened], err, errlen);
    free(names);
    if (rc != PL_OK) {
        h->n = opened;
        close_files(h);
        return rc;
    }
    for (int i = 0; i < h->n; i++)
        for (int k = 0; k < h->f[i].n; k++)
            for (int j = 0; j < i; j++)
                if (st_find(&h->f[j], h->f[i].t[k].name)) {
                    snprintf(err, errlen, "%s: tensor %s is also in %s", h->f[i].path, h->f[i].t[k].name, h->f[j].path);
                    close_files(h);
                    return PL_EIO;
                }
    if (check_index(path, h, err, errlen) != PL_OK) {
        close_files(h);
        return PL_EIO;
    }
    const char *emb = arch_of(c)->embed.rows[0].hf_name;
    size_t el = strlen(emb);
    for (int i = 0; i < h->n; i++)
        for (int k = 0; k < h->f[i].n; k++) {
            const char *nm = h->f[i].t[k].name;
            size_t nl = strlen(nm);
            if (nl >= el && strcmp(nm + nl - el, emb) == 0 && (nl == el || nm[nl - el - 1] == '.') &&
                nl - el < sizeof h->prefix) {
                snprintf(h->prefix, sizeof h->prefix, "%.*s", (int)(nl - el), nm);
                return PL_OK;
            }
        }
    snprintf(err, errlen, "%s: missing tensor %s (the token embedding)", h->f[0].path, emb);
    close_files(h);
    return PL_EIO;
}

/* The file's name of an unprefixed one. */
static void full_name(const hf_files *h, const char *name, char *out, size_t len) {
    if (snprintf(out, len, "%s%s", h->prefix, name) >= (int)len) out[len - 1] = 0;
}

/* One part's name: fmt with the layer put in for "%d" (layer INT_MIN: kept) and expert e for
 * "%e" (e < 0: none). */
static void part_name(const char *fmt, int layer, int e, char *out, size_t len) {
    char a[ST_MAX_NAME];
    const char *x = e >= 0 ? strstr(fmt, "%e") : NULL;
    if (x && snprintf(a, sizeof a, "%.*s%d%s", (int)(x - fmt), fmt, e, x + 2) >= (int)sizeof a) a[sizeof a - 1] = 0;
    if (!x) snprintf(a, sizeof a, "%s", fmt);
    char *d = layer == INT_MIN ? NULL : strstr(a, "%d");
    if (d) {
        *d = 0;
        if (snprintf(out, len, "%s%d%s", a, layer, d + 2) >= (int)len)
            out[len - 1] = 0; /* too long to be any file's name: reported missing */
    } else snprintf(out, len, "%s", a);
}

/* Split a row's hf_name into its parts (each with its '~' / '^' flags and the layer put in;
 * layer INT_MIN: the names keep their "%d", patterns for name_matches); a part naming "%e"
 * is nexp parts, experts 0..nexp-1 (Mixtral's, at most HF_MAX_PARTS in all). */
int hf_split_parts(const char *spec, int layer, int nexp, hf_part *p) {
    int n = 0;
    for (const char *s = spec; *s && n < HF_MAX_PARTS;) {
        const char *bar = strchr(s, '|');
        size_t len = bar ? (size_t)(bar - s) : strlen(s);
        int tr = 0, pm = 0;
        while (len && (*s == '~' || *s == '^')) {
            if (*s == '~') tr = 1;
            else pm = 1;
            s++, len--;
        }
        char fmt[ST_MAX_NAME];
        snprintf(fmt, sizeof fmt, "%.*s", (int)len, s);
        int ne = strstr(fmt, "%e") ? nexp : 1;
        for (int e = 0; e < ne && n < HF_MAX_PARTS; e++, n++) {
            p[n].transposed = tr;
            p[n].permuted = pm;
            part_name(fmt, layer, strstr(fmt, "%e") ? e : -1, p[n].name, sizeof p[n].name);
        }
        s += len + (bar ? 1 : 0);
    }
    return n;
}

size_t hf_part_rows(const model_config *c, const param_tensor *t, int k, int n) {
    const model_arch *A = arch_of(c);
    const arch_params *p = t->part == PART_EMBED ? &A->embed : t->part == PART_BLOCK ? &A->block : &A->head;
    arch_dim d = p->rows[t->row].rows;
    size_t all = arch_dim_value(c, 0, d == AD_VP ? AD_V : d), C = (size_t)c->C;
    if (n <= 1) return all;
    const char *spec = hf_tensor_spec(c, t);
    if (spec && strstr(spec, "%e")) return all / (size_t)n; /* stacked experts: equal shares */
    return k == 0 ? C : (all - C) / (size_t)(n - 1);
}

size_t hf_file_row(const hf_part *p, size_t r, int hs) {
    if (!p->permuted) return r;
    /* ours: head h, pair i, half c at h hs + 2i + c; theirs (rotate-half) at h hs + c hs/2 + i */
    size_t hh = r / (size_t)hs, w = r % (size_t)hs;
    return hh * (size_t)hs + (w % 2) * (size_t)(hs / 2) + w / 2;
}

/* Does name match pattern, "%d" matching a decimal number (into *num; -1 without one)? */
static int name_matches(const char *pat, const char *name, long *num) {
    *num = -1;
    while (*pat) {
        if (pat[0] == '%' && pat[1] == 'd') {
            if (*name < '0' || *name > '9' || (name[0] == '0' && name[1] >= '0' && name[1] <= '9')) return 0;
            *num = 0;
            while (*name >= '0' && *name <= '9' && *num < 100000000) *num = *num * 10 + (*name++ - '0');
            pat += 2;
        } else if (*pat++ != *name++) return 0;
    }
    return *name == 0;
}

const char *hf_tensor_spec(const model_config *c, const param_tensor *t) {
    const model_arch *A = arch_of(c);
    if (t->tied_copy) return A->embed.rows[model_head_row_tied(c, t->row)].hf_name;
    const arch_params *p = t->part == PART_EMBED ? &A->embed : t->part == PART_BLOCK ? &A->block : &A->head;
    if (t->part == PART_HEAD && model_head_row_tied(c, t->row) >= 0) return NULL;
    return p->rows[t->row].hf_name;
}

/* The hf_name of a head row in this config: a tied row reads its embedding's. */
static const char *row_spec(const model_config *c, int part, int row) {
    const model_arch *A = arch_of(c);
    if (part == PART_HEAD && model_head_row_tied(c, row) >= 0) return NULL; /* read through the embedding */
    const arch_params *p = part == PART_EMBED ? &A->embed : part == PART_BLOCK ? &A->block : &A->head;
    return p->rows[row].hf_name;
}

/* Is this name (with or without the prefix) one the architecture ignores? */
static int name_ignored(const model_config *c, const char *name) {
    const model_arch *A = arch_of(c);
    long l;
    for (int i = 0; A->hf_ignore && A->hf_ignore[i]; i++)
        if (name_matches(A->hf_ignore[i], name, &l)) return 1;
    return 0;
}

/* Is this (unprefixed) name one the model reads (any row, any layer) or one it ignores? */
static int name_known(const model_config *c, const char *name) {
    const model_arch *A = arch_of(c);
    const arch_params *parts[3] = {&A->embed, &A->block, &A->head};
    long l;
    for (int p = 0; p < 3; p++)
        for (int i = 0; i < parts[p]->n; i++) {
            const char *spec = row_spec(c, p, i);
            hf_part hp[HF_MAX_PARTS];
            int n = spec ? hf_split_parts(spec, INT_MIN, c->moe.n_experts, hp) : 0;
            for (int k = 0; k < n; k++)
                if (name_matches(hp[k].name, name, &l)) return p != PART_BLOCK || (l >= 0 && l < c->L);
        }
    return name_ignored(c, name);
}

/* Every tensor of the files is known; every one the model reads is there. */
static int check_names(const model_config *c, const hf_files *h, char *err, size_t errlen) {
    size_t pl = strlen(h->prefix);
    for (int i = 0; i < h->n; i++)
        for (int k = 0; k < h->f[i].n; k++) {
            const char *nm = h->f[i].t[k].name;
            if ((strncmp(nm, h->prefix, pl) != 0 || !name_known(c, nm + pl)) && !name_ignored(c, nm)) {
                snprintf(err, errlen, "%s: unexpected tensor %s (not a tensor of this %s model)", h->f[i].path, nm,
                         arch_of(c)->name);
                return PL_EIO;
            }
        }
    const model_arch *A = arch_of(c);
    const arch_params *parts[3] = {&A->embed, &A->block, &A->head};
    for (int p = 0; p < 3; p++)
        for (int i = 0; i < parts[p]->n; i++)
            for (int l = p == PART_BLOCK ? 0 : -1; l < (p == PART_BLOCK ? c->L : 0); l++) {
                const char *spec = row_spec(c, p, i);
                hf_part hp[HF_MAX_PARTS];
                int n = spec ? hf_split_parts(spec, l, c->moe.n_experts, hp) : 0;
                for (int k = 0; k < n; k++) {
                    char full[ST_MAX_NAME + 64];
                    const st_file *in;
                    full_name(h, hp[k].name, full, sizeof full);
                    if (!find_tensor(h, full, &in)) {
                        snprintf(err, errlen, "%s: missing tensor %s", h->f[0].path, full);
                        return PL_EIO;
                    }
                }
            }
    return PL_OK;
}

/* One part (rows [r0, r0 + rows) of a (R, cols) tensor) into dst, from the file's tensor of
 * shape (rows, cols), or (cols, rows) when transposed, or (rows) for a 1-D row;
 * un-permuted per head of hs rows when permuted. */
static int read_part(const hf_files *h, const hf_part *p, const param_tensor *t, int hs, size_t want, size_t *r0,
                     float *dst, char *err, size_t errlen) {
    char full[ST_MAX_NAME + 64];
    const st_file *in = NULL;
    full_name(h, p->name, full, sizeof full);
    const st_tensor *f = find_tensor(h, full, &in);
    if (!f) {
        snprintf(err, errlen, "%s: missing tensor %s", h->f[0].path, full);
        return PL_EIO;
    }
    size_t cols = t->ndim == 2 ? (size_t)t->shape[1] : 1;
    long long rows = f->ndim >= 1 ? f->shape[p->transposed ? 1 : 0] : 0;
    long long fc = f->ndim == 2 ? f->shape[p->transposed ? 0 : 1] : 1;
    if (f->ndim != t->ndim || fc != (long long)cols || rows != (long long)want || (p->permuted && rows % hs != 0)) {
        char shp[64] = "";
        for (int d = 0, o = 0; d < f->ndim && o < 60; d++)
            o += snprintf(shp + o, sizeof shp - (size_t)o, "%s%lld", d ? ", " : "", f->shape[d]);
        snprintf(err, errlen, "%s: tensor %s has shape (%s), which disagrees with the config (%s: %zu x %zu%s)",
                 in->path, full, shp, t->name, want, cols, p->transposed ? ", stored transposed" : "");
        return PL_EIO;
    }
    size_t n = (size_t)rows * cols;
    float *tmp = malloc(n * sizeof(float));
    if (!tmp) return PL_ENOMEM;
    int rc = st_read(in, f, 0, n, tmp, err, errlen);
    float *out = dst + *r0 * cols;
    for (size_t r = 0; rc == PL_OK && r < (size_t)rows; r++) {
        size_t src = hf_file_row(p, r, hs); /* the file's row of our row r */
        for (size_t k = 0; k < cols; k++)
            out[r * cols + k] = p->transposed ? tmp[k * (size_t)rows + src] : tmp[src * cols + k];
    }
    free(tmp);
    *r0 += (size_t)rows;
    return rc;
}

/* One tensor of the stage: its parts stacked; the rows past them (the padded vocabulary)
 * zero; a count of rows that is not the config's refused. */
static int load_tensor(const hf_files *h, const stage *st, const param_tensor *t, float *dst, char *err,
                       size_t errlen) {
    const model_config *c = &st->cfg;
    const char *spec = hf_tensor_spec(c, t);
    size_t r0 = 0;
    hf_part hp[HF_MAX_PARTS];
    int n = spec ? hf_split_parts(spec, t->layer, c->moe.n_experts, hp) : 0;
    memset(dst, 0, t->numel * sizeof(float));
    for (int k = 0; k < n; k++)
        PL_TRY(read_part(h, &hp[k], t, c->C / c->NH, hf_part_rows(c, t, k, n), &r0, dst, err, errlen));
    return PL_OK;
}

int hf_load_stage(const char *path, stage *st, char *err, size_t errlen) {
    hf_files h;
    PL_TRY(open_files(path, &st->cfg, &h, err, errlen));
    int rc = check_names(&st->cfg, &h, err, errlen);
    const backend *be = st->be;
    for (int i = 0; rc == PL_OK && i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        float *p = st->params + t->offset;
        void *host = NULL;
        size_t bytes = t->numel * sizeof(float);
        if (be->map(&host, p, bytes, PL_MAP_WRITE) != PL_OK || !host) {
            snprintf(err, errlen, "%s: backend %s: mapping tensor %s for reading failed", path, be->name, t->name);
            rc = PL_EBACKEND;
            break;
        }
        rc = load_tensor(&h, st, t, host, err, errlen);
        if (be->unmap(host, p, bytes, PL_MAP_WRITE) != PL_OK && rc == PL_OK) {
            snprintf(err, errlen, "%s: backend %s: copying tensor %s into the backend failed", path, be->name, t->name);
            rc = PL_EBACKEND;
        }
    }
    close_files(&h);
    return rc;
}
