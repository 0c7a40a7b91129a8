/*
 * bpe_json.c — Hugging Face's tokenizer.json into bpe's tables (bpe.h): the BPE model's
 * vocabulary and merges (their ByteLevel alphabet undone into raw bytes), the added tokens,
 * the pre-tokenizer's regex; anything that would change the ids is refused by name.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "util/common.h"
#include "formats/bpe_internal.h"

/* GPT-2's bytes_to_unicode, inverted: the byte of each code point below 324, or -1. */
static void byte_level_inverse(int inv[324]) {
    for (int c = 0; c < 324; c++) inv[c] = -1;
    int n = 0;
    for (int x = 0; x < 256; x++) {
        int keep = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174);
        inv[keep ? x : 256 + n++] = x;
    }
}

/* A vocabulary string in the ByteLevel alphabet to raw bytes; the length, or -1. */
static long byte_level_decode(const int inv[324], const char *s, unsigned char *out, size_t cap) {
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        unsigned cp;
        if (*p < 0x80) cp = *p++;
        else if ((*p & 0xe0) == 0xc0 && (p[1] & 0xc0) == 0x80) cp = (unsigned)(*p & 0x1f) << 6 | (p[1] & 0x3f), p += 2;
        else return -1; /* every ByteLevel code point is below U+0800 */
        if (cp >= 324 || inv[cp] < 0 || o == cap) return -1;
        out[o++] = (unsigned char)inv[cp];
    }
    return (long)o;
}

/* The refusals of settings that change the ids: a normalizer, another model, options. */
static int json_model_check(const json_t *root, const json_t *model, char *err, size_t errlen) {
    const json_t *norm = json_object_get(root, "normalizer");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (norm && !json_is_null(norm)) {
        snprintf(err, errlen, "normalizer %s is not supported (only none)",
                 json_string_value(json_object_get(norm, "type")) ? json_string_value(json_object_get(norm, "type"))
                                                                   : "?");
        return PL_EINVAL;
    }
    if (!type || strcmp(type, "BPE") != 0) {
        snprintf(err, errlen, "model type %s is not supported (only BPE)", type ? type : "(none)");
        return PL_EINVAL;
    }
    const char *pre = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *suf = json_string_value(json_object_get(model, "end_of_word_suffix"));
    const json_t *drop = json_object_get(model, "dropout");
    if ((pre && pre[0]) || (suf && suf[0]) || json_is_true(json_object_get(model, "byte_fallback")) ||
        (drop && !json_is_null(drop))) {
        snprintf(err, errlen, "the BPE model's continuing_subword_prefix, end_of_word_suffix, byte_fallback or "
                 "dropout is set: not supported");
        return PL_EINVAL;
    }
    return PL_OK;
}

/* One ByteLevel pre-tokenizer: no prefix space; its own regex or none. */
static int json_byte_level(const json_t *pt, int *use_regex, char *err, size_t errlen) {
    if (json_is_true(json_object_get(pt, "add_prefix_space"))) {
        snprintf(err, errlen, "the ByteLevel pre-tokenizer's add_prefix_space is not supported");
        return PL_EINVAL;
    }
    const json_t *ur = json_object_get(pt, "use_regex");
    *use_regex = !ur || json_is_true(ur);
    return PL_OK;
}

/* The pre-tokenizer's regex: ByteLevel (GPT-2's), or Sequence [Split(Regex, Isolated),
 * ByteLevel(use_regex false)]. */
static int json_pretok(bpe *b, const json_t *pt, char *err, size_t errlen) {
    const char *type = json_string_value(json_object_get(pt, "type"));
    int ur = 0;
    if (type && strcmp(type, "ByteLevel") == 0) {
        PL_TRY(json_byte_level(pt, &ur, err, errlen));
        snprintf(b->desc, sizeof b->desc, "tokenizer.json (ByteLevel%s)", ur ? ", GPT-2 regex" : "");
        return ur ? bpe_compile(b, bpe_pattern("gpt2"), err, errlen) : PL_OK;
    }
    const json_t *seq = json_object_get(pt, "pretokenizers");
    const json_t *split = json_array_get(seq, 0), *bl = json_array_get(seq, 1);
    const char *st = json_string_value(json_object_get(split, "type"));
    const char *bt = json_string_value(json_object_get(bl, "type"));
    const char *re = json_string_value(json_object_get(json_object_get(split, "pattern"), "Regex"));
    const char *beh = json_string_value(json_object_get(split, "behavior"));
    if (!type || strcmp(type, "Sequence") != 0 || json_array_size(seq) != 2 || !st || strcmp(st, "Split") != 0 ||
        !bt || strcmp(bt, "ByteLevel") != 0 || !re || !beh || strcmp(beh, "Isolated") != 0 ||
        json_is_true(json_object_get(split, "invert"))) {
        snprintf(err, errlen, "pre-tokenizer %s is not supported (ByteLevel, or a Sequence of Split with a Regex, "
                 "Isolated, and ByteLevel)", type ? type : "(none)");
        return PL_EINVAL;
    }
    PL_TRY(json_byte_level(bl, &ur, err, errlen));
    if (ur) {
        snprintf(err, errlen, "a Split followed by ByteLevel with use_regex true is not supported");
        return PL_EINVAL;
    }
    snprintf(b->desc, sizeof b->desc, "tokenizer.json (Split regex, ByteLevel)");
    return bpe_compile(b, re, err, errlen);
}

/* The vocabulary: n from the largest id (of it and the added tokens), then every entry. */
static int json_vocab(bpe *b, const json_t *vocab, const json_t *added, const int inv[324], char *err, size_t errlen) {
    const char *key;
    json_t *v;
    long long top = -1;
    size_t i;
    json_object_foreach((json_t *)vocab, key, v) top = json_integer_value(v) > top ? json_integer_value(v) : top;
    json_array_foreach(added, i, v) {
        long long id = json_integer_value(json_object_get(v, "id"));
        top = id > top ? id : top;
    }
    if (top < 255 || top >= (1 << 30)) {
        snprintf(err, errlen, "its vocabulary has %lld entries: not a byte-level BPE vocabulary", top + 1);
        return PL_EINVAL;
    }
    PL_TRY(bpe_alloc(b, (int)top + 1));
    unsigned char buf[4096];
    json_object_foreach((json_t *)vocab, key, v) {
        long len = byte_level_decode(inv, key, buf, sizeof buf);
        long long id = json_integer_value(v);
        if (len <= 0 || !json_is_integer(v) || id < 0 || bpe_set_token(b, (int)id, (const char *)buf, (size_t)len)) {
            snprintf(err, errlen, "vocabulary entry \"%.60s\" (id %lld): %s", key, id, len <= 0 ?
                     "not in the ByteLevel alphabet" : "its id or its bytes repeat another entry's");
            return PL_EINVAL;
        }
    }
    return PL_OK;
}

/* A merge's two sides as ids: "a b" or ["a", "b"]; the id they merge into, or -1. */
static int merge_sides(const bpe *b, const json_t *m, const int inv[324], int *l, int *r) {
    char both[2048];
    const char *a, *c;
    if (json_is_string(m)) {
        snprintf(both, sizeof both, "%s", json_string_value(m));
        char *sp = strchr(both, ' ');
        if (!sp) return -1;
        *sp = 0, a = both, c = sp + 1;
    } else {
        a = json_string_value(json_array_get(m, 0)), c = json_string_value(json_array_get(m, 1));
        if (!a || !c || json_array_size(m) != 2) return -1;
    }
    unsigned char x[2048];
    long la = byte_level_decode(inv, a, x, sizeof x / 2), lc = byte_level_decode(inv, c, x + sizeof x / 2, sizeof x / 2);
    if (la <= 0 || lc <= 0) return -1;
    memmove(x + la, x + sizeof x / 2, (size_t)lc);
    *l = bpe_lookup(b, (const char *)x, (size_t)la);
    *r = bpe_lookup(b, (const char *)x + la, (size_t)lc);
    int res = bpe_lookup(b, (const char *)x, (size_t)(la + lc));
    return *l < 0 || *r < 0 ? -1 : res;
}

static int json_merges(bpe *b, const json_t *merges, const int inv[324], char *err, size_t errlen) {
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        int l, r, res = merge_sides(b, m, inv, &l, &r);
        if (res < 0) {
            char *s = json_dumps(m, JSON_ENCODE_ANY);
            snprintf(err, errlen, "merge %zu (%.60s): a side or the result is not in the vocabulary", i, s ? s : "?");
            free(s);
            return PL_EINVAL;
        }
        PL_TRY(bpe_add_merge(b, l, r, (int)i, res));
    }
    return PL_OK;
}

static int json_added(bpe *b, const json_t *added, char *err, size_t errlen) {
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        const char *content = json_string_value(json_object_get(a, "content"));
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        int rc = content && content[0] ? bpe_add_special(b, (int)id, content,
                                                         !json_is_true(json_object_get(a, "special"))) : PL_EINVAL;
        if (rc != PL_OK) {
            snprintf(err, errlen, "added token %zu (\"%.60s\", id %lld): %s", i, content ? content : "",
                     (long long)id, rc == PL_ENOMEM ? "out of memory" : "empty, or its id is another token's");
            return rc;
        }
    }
    b->doc = bpe_find(b, "<|begin_of_text|>") >= 0 ? bpe_find(b, "<|begin_of_text|>") : bpe_find(b, "<|endoftext|>");
    b->end = bpe_find(b, "<|end_of_text|>") >= 0 ? bpe_find(b, "<|end_of_text|>") : bpe_find(b, "<|endoftext|>");
    return PL_OK;
}

int bpe_load_json(bpe *b, const char *text, size_t size, char *err, size_t errlen) {
    json_error_t je;
    json_t *root = json_loadb(text, size, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        snprintf(err, errlen, "not JSON (line %d: %s)", je.line, je.text);
        return PL_EINVAL;
    }
    const json_t *model = json_object_get(root, "model"), *added = json_object_get(root, "added_tokens");
    const json_t *dec = json_object_get(root, "decoder");
    const char *dt = json_string_value(json_object_get(dec, "type"));
    int inv[324], rc = json_model_check(root, model, err, errlen);
    byte_level_inverse(inv);
    if (rc == PL_OK && (!dt || strcmp(dt, "ByteLevel") != 0)) {
        snprintf(err, errlen, "decoder %s is not supported (only ByteLevel)", dt ? dt : "(none)");
        rc = PL_EINVAL;
    }
    if (rc == PL_OK) rc = json_vocab(b, json_object_get(model, "vocab"), added, inv, err, errlen);
    if (rc == PL_OK) rc = json_merges(b, json_object_get(model, "merges"), inv, err, errlen);
    if (rc == PL_OK) rc = json_added(b, added, err, errlen);
    if (rc == PL_OK) rc = json_pretok(b, json_object_get(root, "pre_tokenizer"), err, errlen);
    b->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    json_decref(root);
    return rc;
}
