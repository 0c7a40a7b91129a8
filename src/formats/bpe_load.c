/*
 * bpe_load.c — the two kinds of tokenizer file (bpe.h): Hugging Face's tokenizer.json and
 * tiktoken rank files with a named preset (pattern, special tokens).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "util/common.h"
#include "util/files.h"
#include "formats/bpe_internal.h"

#define PAT_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define PAT_CL100K "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
                   "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define O200K_LOW "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define O200K_UP "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define O200K_CONTR "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
#define PAT_O200K "[^\\r\\n\\p{L}\\p{N}]?" O200K_UP "*" O200K_LOW "+" O200K_CONTR "|[^\\r\\n\\p{L}\\p{N}]?" O200K_UP \
                  "+" O200K_LOW "*" O200K_CONTR "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* A rank file's preset: its pattern, rank count, special tokens from first_special on. */
typedef struct {
    const char *name, *pattern;
    int nranks;
    const char *const *specials; /* NULL-terminated: "text" at id first_special + i, "" a hole */
    int first_special;
    const char *doc, *end;
} bpe_preset;

static const char *const SP_GPT2[] = {"<|endoftext|>", NULL};
static const char *const SP_CL100K[] = {"", "<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "", "", "", "", "", "", "", "", "", "", "", "", "", "", "", "", "<|endofprompt|>", NULL};
static const char *const SP_O200K[] = {"", "<|endoftext|>", "", "", "", "", "", "", "", "", "", "", "", "", "", "",
    "", "", "", "", "<|endofprompt|>", NULL};
static const char *const SP_LLAMA3[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>", NULL};

static const bpe_preset PRESETS[] = {
    {"gpt2", PAT_GPT2, 50256, SP_GPT2, 50256, "<|endoftext|>", "<|endoftext|>"},
    {"cl100k", PAT_CL100K, 100256, SP_CL100K, 100256, "<|endoftext|>", "<|endoftext|>"},
    {"llama3", PAT_CL100K, 128000, SP_LLAMA3, 128000, "<|begin_of_text|>", "<|end_of_text|>"},
    {"o200k", PAT_O200K, 199998, SP_O200K, 199998, "<|endoftext|>", "<|endoftext|>"},
};
#define NPRESETS (int)(sizeof PRESETS / sizeof PRESETS[0])
#define LLAMA3_SPECIALS 256 /* the rest are <|reserved_special_token_N|>, N from 3 */

const char *bpe_pattern(const char *name) {
    for (int i = 0; i < NPRESETS; i++)
        if (strcmp(name, PRESETS[i].name) == 0) return PRESETS[i].pattern;
    return NULL;
}

int bpe_add_special(bpe *b, int id, const char *text, int always) {
    size_t len = strlen(text);
    int have = bpe_lookup(b, text, len);
    if (have >= 0 && have != id) return PL_EINVAL;
    if (have < 0) PL_TRY(bpe_set_token(b, id, text, len));
    int *ns = realloc(b->special, sizeof(int) * (b->nspecial + 1));
    if (!ns) return PL_ENOMEM;
    b->special = ns;
    unsigned char *na = realloc(b->always, b->nspecial + 1);
    if (!na) return PL_ENOMEM;
    b->always = na;
    b->special[b->nspecial] = id;
    b->always[b->nspecial++] = (unsigned char)always;
    return PL_OK;
}

/* ---- tiktoken rank files ---- */

static int b64_val(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Decode base64 s[0..n) into out (n * 3 / 4 bytes at most); the length, or -1 if malformed. */
static long b64_decode(const char *s, size_t n, unsigned char *out) {
    long o = 0;
    unsigned acc = 0;
    int bits = 0;
    size_t i = 0;
    for (; i < n && s[i] != '='; i++) {
        int v = b64_val((unsigned char)s[i]);
        if (v < 0) return -1;
        acc = (acc << 6) | (unsigned)v;
        if ((bits += 6) >= 8) out[o++] = (unsigned char)(acc >> (bits -= 8));
    }
    for (; i < n; i++)
        if (s[i] != '=') return -1;
    return o;
}

/* Every two-token split of every ranked token (not the special ones) is a merge at the token's rank: tiktoken's rule (the
 * lowest-ranked token that two neighbours make) as pairs. */
static int rank_merges(bpe *b, int nranks) {
    for (int id = 0; id < nranks; id++) {
        const char *s = b->bytes + b->off[id];
        for (uint32_t k = 1; k < b->len[id]; k++) {
            int l = bpe_lookup(b, s, k), r = l < 0 ? -1 : bpe_lookup(b, s + k, b->len[id] - k);
            if (r >= 0) PL_TRY(bpe_add_merge(b, l, r, id, id));
        }
    }
    return PL_OK;
}

/* The lines "base64 rank": ranks must be 0, 1, 2, ... in order. */
static int rank_lines(bpe *b, char *text, size_t size, int *nranks, char *err, size_t errlen) {
    unsigned char tok[1024];
    int n = 0, line = 0;
    for (char *p = text, *end = text + size; p < end; line++) {
        char *nl = memchr(p, '\n', (size_t)(end - p)), *e = nl ? nl : end, *sp = memchr(p, ' ', (size_t)(e - p));
        if (e == p) { p = e + 1; continue; }
        long blen = sp && (size_t)(sp - p) <= sizeof tok * 4 / 3 ? b64_decode(p, (size_t)(sp - p), tok) : -1;
        char *q = NULL;
        long r = sp ? strtol(sp + 1, &q, 10) : -1;
        if (blen <= 0 || q != e || r != n) {
            snprintf(err, errlen, "line %d is not \"base64 rank\" with rank %d", line + 1, n);
            return PL_EINVAL;
        }
        if (n == b->n) return PL_EINVAL; /* counted before: cannot happen */
        if (bpe_set_token(b, n, (const char *)tok, (size_t)blen) != PL_OK) {
            snprintf(err, errlen, "line %d: token %d repeats an earlier token's bytes", line + 1, n);
            return PL_EINVAL;
        }
        n++;
        p = e + 1;
    }
    *nranks = n;
    return PL_OK;
}

static const bpe_preset *find_preset(const char *name, int nranks, char *err, size_t errlen) {
    for (int i = 0; i < NPRESETS; i++)
        if (name && name[0] ? strcmp(name, PRESETS[i].name) == 0 : PRESETS[i].nranks == nranks) return &PRESETS[i];
    if (name && name[0])
        snprintf(err, errlen, "no pre-tokenizer pattern named '%s' (gpt2, cl100k, llama3, o200k)", name);
    else
        snprintf(err, errlen, "%d ranks match no preset (gpt2 50256, cl100k 100256, llama3 128000, o200k 199998): "
                 "name one with --tokenizer-pattern", nranks);
    return NULL;
}

static int preset_specials(bpe *b, const bpe_preset *ps, int nranks) {
    int id = nranks > ps->first_special ? nranks : ps->first_special, i = 0;
    for (; ps->specials[i]; i++, id++)
        if (ps->specials[i][0]) PL_TRY(bpe_add_special(b, id, ps->specials[i], 0));
    char name[64];
    for (int k = 3; strcmp(ps->name, "llama3") == 0 && i < LLAMA3_SPECIALS; i++, id++, k++) {
        snprintf(name, sizeof name, "<|reserved_special_token_%d|>", k);
        PL_TRY(bpe_add_special(b, id, name, 0));
    }
    b->doc = bpe_find(b, ps->doc);
    b->end = bpe_find(b, ps->end);
    return PL_OK;
}

static int load_ranks(bpe *b, char *text, size_t size, const char *pattern, char *err, size_t errlen) {
    int lines = 1, nranks = 0;
    for (size_t i = 0; i < size; i++) lines += text[i] == '\n';
    PL_TRY(bpe_alloc(b, lines + 300));
    PL_TRY(rank_lines(b, text, size, &nranks, err, errlen));
    const bpe_preset *ps = find_preset(pattern, nranks, err, errlen);
    if (!ps) return PL_EINVAL;
    b->n = nranks + (ps->first_special > nranks ? ps->first_special - nranks : 0) + 300;
    if (preset_specials(b, ps, nranks) != PL_OK) {
        snprintf(err, errlen, "its special tokens (preset %s) clash with its ranks", ps->name);
        return PL_EINVAL;
    }
    int top = 0;
    for (int id = 0; id < b->n; id++)
        if (b->len[id]) top = id + 1;
    b->n = top;
    b->ignore_merges = 1;
    PL_TRY(rank_merges(b, nranks));
    snprintf(b->desc, sizeof b->desc, "tiktoken ranks (%d, pattern %s)", nranks, ps->name);
    return bpe_compile(b, ps->pattern, err, errlen);
}

/* ---- bpe_load ---- */

int bpe_load_mem(bpe **out, const char *path, char *text, size_t size, const char *pattern, char *err,
                 size_t errlen) {
    *out = NULL;
    char e2[400] = "";
    bpe *b = calloc(1, sizeof *b);
    int rc = b ? PL_OK : PL_ENOMEM;
    if (rc == PL_OK) {
        text[size] = 0;
        size_t i = strspn(text, " \t\r\n");
        uint32_t magic = 0;
        memcpy(&magic, text, size >= 4 ? 4 : 0);
        if (magic == 20240328) /* llm.c's tokenizer file (tokenizer.h): a decoding table only */
            snprintf(e2, sizeof e2, "llm.c's tokenizer file only decodes: encoding needs a tokenizer.json or a "
                     "tiktoken rank file"), rc = PL_EINVAL;
        else if (text[i] == '{') rc = bpe_load_json(b, text, size, e2, sizeof e2);
        else rc = load_ranks(b, text, size, pattern, e2, sizeof e2);
    }
    if (rc == PL_OK) rc = bpe_finish(b, e2, sizeof e2);
    if (rc != PL_OK) {
        snprintf(err, errlen, "tokenizer %s: %s", path, rc == PL_ENOMEM ? "out of memory" : e2[0] ? e2 :
                 "not a tokenizer file");
        bpe_free(b);
        return rc == PL_OK ? PL_EINVAL : rc;
    }
    *out = b;
    return PL_OK;
}

int bpe_load(bpe **out, const char *path, const char *pattern, char *err, size_t errlen) {
    *out = NULL;
    FILE *f;
    PL_TRY(pl_open_input(path, "tokenizer", (size_t)1 << 31, &f, err, errlen));
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = size >= 0 ? malloc((size_t)size + 1) : NULL;
    int rc = !text ? PL_ENOMEM : fread(text, 1, (size_t)size, f) == (size_t)size ? PL_OK : PL_EIO;
    fclose(f);
    if (rc != PL_OK) snprintf(err, errlen, "tokenizer %s: %s", path, rc == PL_ENOMEM ? "out of memory" :
                              "reading it failed");
    else rc = bpe_load_mem(out, path, text, (size_t)size, pattern, err, errlen);
    free(text);
    return rc;
}
