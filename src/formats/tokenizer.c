/*
 * tokenizer.c — llm.c's tokenizer file, read whole and checked (tokenizer.h).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util/common.h"
#include "util/files.h"
#include "formats/tokenizer.h"

/* The header: magic, version, vocabulary (the model's), end-of-text id. */
static int tok_header(tokenizer *t, const char *path, FILE *f, int V, char *err, size_t errlen) {
    uint32_t h[256];
    if (fread(h, sizeof h, 1, f) != 1) {
        snprintf(err, errlen, "tokenizer %s: shorter than its 1024-byte header", path);
        return PL_EIO;
    }
    if (h[0] != TOKENIZER_MAGIC || (h[1] != 1 && h[1] != 2)) {
        snprintf(err, errlen, "tokenizer %s: not an llm.c tokenizer file (magic %u version %u; want %d, 1 or 2)",
                 path, h[0], h[1], TOKENIZER_MAGIC);
        return PL_EIO;
    }
    if ((long long)h[2] != V) {
        snprintf(err, errlen, "tokenizer %s has %u tokens but the model's vocabulary is %d: it does not match the "
                 "model", path, h[2], V);
        return PL_EIO;
    }
    t->n = (int)h[2];
    t->version = (int)h[1];
    t->eot = h[1] == 2 ? (int)h[3] : -1;
    if (t->eot >= t->n) {
        snprintf(err, errlen, "tokenizer %s: end-of-text id %d is not below its %d tokens", path, t->eot, t->n);
        return PL_EIO;
    }
    return PL_OK;
}

/* The token table: one length byte and the bytes per token. */
static int tok_table(tokenizer *t, const char *path, FILE *f, char *err, size_t errlen) {
    size_t cap = (size_t)t->n * 8 + 16, used = 0;
    t->len = malloc((size_t)t->n);
    t->off = malloc(sizeof(size_t) * t->n);
    t->bytes = malloc(cap);
    if (!t->len || !t->off || !t->bytes) return PL_ENOMEM;
    for (int i = 0; i < t->n; i++) {
        int c = fgetc(f);
        if (c == EOF || c == 0) {
            snprintf(err, errlen, "tokenizer %s: token %d %s", path, i, c == EOF ? "is missing (file truncated)"
                                                                                  : "has length 0");
            return PL_EIO;
        }
        if (used + (size_t)c > cap) {
            char *nb = realloc(t->bytes, cap * 2 + 256);
            if (!nb) return PL_ENOMEM;
            t->bytes = nb;
            cap = cap * 2 + 256;
        }
        if (fread(t->bytes + used, 1, (size_t)c, f) != (size_t)c) {
            snprintf(err, errlen, "tokenizer %s: token %d is truncated", path, i);
            return PL_EIO;
        }
        t->len[i] = (unsigned char)c;
        t->off[i] = used;
        used += (size_t)c;
    }
    return PL_OK;
}

/* A BPE tokenizer file (its bytes read from f): its vocabulary within the model's. */
static int tok_bpe(tokenizer *t, const char *path, FILE *f, int V, char *err, size_t errlen) {
    size_t cap = 1 << 16, n = 0, got;
    char *text = malloc(cap + 1);
    while (text && (got = fread(text + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *bigger = realloc(text, 2 * cap + 1);
            if (!bigger) { free(text); text = NULL; break; }
            text = bigger, cap *= 2;
        }
    }
    if (!text) {
        snprintf(err, errlen, "tokenizer %s: out of memory", path);
        return PL_ENOMEM;
    }
    int rc = bpe_load_mem(&t->bpe, path, text, n, NULL, err, errlen);
    free(text);
    PL_TRY(rc);
    t->n = bpe_vocab(t->bpe);
    t->eot = bpe_end_token(t->bpe);
    if (t->n > V) {
        snprintf(err, errlen, "tokenizer %s has %d tokens but the model's vocabulary is %d: it does not match the "
                 "model", path, t->n, V);
        return PL_EIO;
    }
    return PL_OK;
}

/* llm.c's tokenizer file (by its magic), else a BPE tokenizer file. */
int tokenizer_read(tokenizer *t, const char *path, FILE *f, int V, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    uint32_t magic = 0;
    if (fread(&magic, 4, 1, f) != 1 || magic != TOKENIZER_MAGIC) {
        rewind(f);
        int rc = tok_bpe(t, path, f, V, err, errlen);
        if (rc != PL_OK) tokenizer_free(t);
        return rc;
    }
    rewind(f);
    int rc = tok_header(t, path, f, V, err, errlen);
    if (rc == PL_OK) rc = tok_table(t, path, f, err, errlen);
    if (rc == PL_ENOMEM) snprintf(err, errlen, "tokenizer %s: out of memory", path);
    if (rc != PL_OK) tokenizer_free(t);
    return rc;
}

int tokenizer_load(tokenizer *t, const char *path, int V, char *err, size_t errlen) {
    FILE *f;
    memset(t, 0, sizeof *t);
    PL_TRY(pl_open_input(path, "tokenizer", 1 << 26, &f, err, errlen));
    int rc = tokenizer_read(t, path, f, V, err, errlen);
    fclose(f);
    return rc;
}

void tokenizer_free(tokenizer *t) {
    bpe_free(t->bpe);
    free(t->len);
    free(t->off);
    free(t->bytes);
    memset(t, 0, sizeof *t);
}

void tokenizer_write(const tokenizer *t, int id, FILE *out) {
    size_t len;
    const char *s = t->bpe ? bpe_token(t->bpe, id, &len) : NULL;
    if (t->bpe && s) fwrite(s, 1, len, out);
    else if (id < 0 || id >= t->n || t->bpe) fprintf(out, "<%d>", id);
    else fwrite(t->bytes + t->off[id], 1, t->len[id], out);
}
