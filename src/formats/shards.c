/*
 * shards.c — many llm.c token files read as one data set, shuffled per epoch (shards.h).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include "util/common.h"
#include "formats/shards.h"

#define INORDER "inorder:"

int shards_spec(const char *spec) {
    return strncmp(spec, INORDER, strlen(INORDER)) == 0 || strpbrk(spec, ",*?[") != NULL;
}

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A bijection of [0, n) keyed by key: a 4-round Feistel network on the next even power of two,
 * walking the cycle until the value falls inside. */
static uint64_t permute(uint64_t i, uint64_t n, uint64_t key) {
    if (n <= 1) return 0;
    int bits = 2;
    while ((1ull << bits) < n) bits++;
    bits += bits & 1;
    int h = bits / 2;
    uint64_t mask = (1ull << h) - 1;
    do {
        uint64_t l = i >> h, r = i & mask;
        for (uint64_t round = 0; round < 4; round++) {
            uint64_t f = mix64(r ^ mix64(key + round)) & mask;
            uint64_t nl = r;
            r = l ^ f;
            l = nl;
        }
        i = l << h | r;
    } while (i >= n);
    return i;
}

/* Sequences of T + 1 tokens at stride T in shard s. */
static uint64_t nseq(const data_source *d, int s, int T) {
    return d->shard[s].ntok > 0 ? (d->shard[s].ntok - 1) / (size_t)T : 0;
}

void shards_locate(const data_source *d, long long q, int T, int *shard, size_t *pos) {
    uint64_t N = 0;
    for (int s = 0; s < d->nshards; s++) N += nseq(d, s, T);
    uint64_t e = (uint64_t)q / N, r = (uint64_t)q % N, ke = mix64(d->seed ^ mix64(e + 1));
    for (int p = 0; p < d->nshards; p++) {
        int s = d->shuffle ? (int)permute((uint64_t)p, (uint64_t)d->nshards, ke) : p;
        uint64_t ns = nseq(d, s, T);
        if (r < ns) {
            uint64_t l = d->shuffle ? permute(r, ns, mix64(ke ^ (uint64_t)(s + 1))) : r;
            *shard = s;
            *pos = (size_t)(l * (uint64_t)T);
            return;
        }
        r -= ns;
    }
    *shard = 0, *pos = 0; /* cannot happen: r < N */
}

/* One pattern (a glob, or a plain path) appended to d's shards. */
static int add_pattern(data_source *d, const char *pat, char *err, size_t errlen) {
    glob_t g;
    int grc = glob(pat, 0, NULL, &g);
    if (grc != 0) {
        snprintf(err, errlen, "--data %s: %s", pat, grc == GLOB_NOMATCH ? "no file matches it" : "glob failed");
        if (grc != GLOB_NOMATCH) globfree(&g);
        return PL_EIO;
    }
    int rc = PL_OK;
    for (size_t i = 0; i < g.gl_pathc && rc == PL_OK; i++) {
        data_source *ns = realloc(d->shard, sizeof *ns * (size_t)(d->nshards + 1));
        if (!ns) {
            rc = PL_ENOMEM;
            break;
        }
        d->shard = ns;
        data_source *s = &d->shard[d->nshards++];
        memset(s, 0, sizeof *s);
        s->fd = -1, s->V = d->V, s->kind = DATA_TOKENS;
        snprintf(s->desc, sizeof s->desc, "%s", g.gl_pathv[i]);
        rc = data_open_tokens(s, g.gl_pathv[i], err, errlen);
        if (rc == PL_OK && s->tok_bytes != d->shard[0].tok_bytes)
            snprintf(err, errlen, "--data: shard %s holds uint%d tokens but %s uint%d: mixed kinds of shard",
                     s->path, 8 * s->tok_bytes, d->shard[0].path, 8 * d->shard[0].tok_bytes), rc = PL_EINVAL;
    }
    globfree(&g);
    return rc;
}

int shards_open(data_source *d, const char *spec, uint64_t seed, char *err, size_t errlen) {
    d->kind = DATA_SHARDS;
    d->seed = seed;
    int inorder = strncmp(spec, INORDER, strlen(INORDER)) == 0;
    char *list = strdup(spec + (inorder ? strlen(INORDER) : 0)), *save = NULL;
    if (!list) return PL_ENOMEM;
    int rc = PL_OK;
    for (char *p = strtok_r(list, ",", &save); p && rc == PL_OK; p = strtok_r(NULL, ",", &save))
        rc = add_pattern(d, p, err, errlen);
    free(list);
    if (rc == PL_OK && d->nshards == 0) {
        snprintf(err, errlen, "--data %s: no shard", spec);
        rc = PL_EINVAL;
    }
    if (rc != PL_OK) return rc;
    d->inorder = inorder;
    d->shuffle = !inorder && d->nshards > 1; /* --shuffle's default: shuffled when there are several */
    d->tok_bytes = d->shard[0].tok_bytes;
    for (int s = 0; s < d->nshards; s++) d->ntok += d->shard[s].ntok;
    shards_describe(d);
    return PL_OK;
}

void shards_describe(data_source *d) {
    snprintf(d->desc, sizeof d->desc, "%d shard%s (%.200s, %zu tokens, %s)", d->nshards, d->nshards > 1 ? "s" : "",
             d->shard[0].path, d->ntok, d->shuffle ? "shuffled per epoch" : "in order");
}

int shards_check(const data_source *d, int T, char *err, size_t errlen) {
    for (int s = 0; s < d->nshards; s++)
        if (nseq(d, s, T) == 0) {
            snprintf(err, errlen, "data shard %s: %zu tokens, fewer than one sequence of %d + 1", d->shard[s].path,
                     d->shard[s].ntok, T);
            return PL_EIO;
        }
    return PL_OK;
}

int shards_read_rows(const data_source *d, long long k, int Bg, int row0, int n, int T, int *inputs, int *targets,
                     char *err, size_t errlen) {
    int *tok = malloc(sizeof(int) * (size_t)(T + 1)), rc = tok ? PL_OK : PL_ENOMEM; /* (T + 1) */
    if (k < 0 || row0 < 0 || row0 + n > Bg) rc = PL_EINVAL;
    for (int b = 0; b < n && rc == PL_OK; b++) {
        int s;
        size_t pos;
        shards_locate(d, k * Bg + row0 + b, T, &s, &pos);
        rc = data_read_tokens(&d->shard[s], pos, (size_t)T + 1, tok, err, errlen);
        for (int t = 0; t < T && rc == PL_OK; t++) {
            inputs[(size_t)b * T + t] = tok[t];
            targets[(size_t)b * T + t] = tok[t + 1];
        }
    }
    if (rc == PL_ENOMEM) snprintf(err, errlen, "data %s: out of memory for a batch", d->desc);
    if (rc == PL_EINVAL) snprintf(err, errlen, "data %s: rows %d..%d of batch %lld do not exist", d->desc, row0,
                                  row0 + n - 1, k);
    free(tok);
    return rc;
}

void shards_close(data_source *d) {
    for (int s = 0; s < d->nshards; s++) data_close(&d->shard[s]);
    free(d->shard);
    d->shard = NULL;
    d->nshards = 0;
}
