/*
 * bpe_internal.h — the tables bpe.c (encoding) and bpe_load.c (the two file kinds) share.
 */
#ifndef PIPELM_BPE_INTERNAL_H
#define PIPELM_BPE_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include "formats/bpe.h"

/* One merge: the pair (left << 32 | right; UINT64_MAX: an empty slot), its rank and result. */
typedef struct {
    uint64_t key;
    int rank, res;
} bpe_merge;

/* The piece cache: a piece's bytes and ids in the arena, found by its hash. */
typedef struct {
    uint64_t hash;         /* 0: empty */
    uint32_t off;          /* in arena: the bytes, then the ids (int) */
    uint16_t len, nids;
} bpe_cslot;
#define BPE_CACHE_SLOTS (1 << 16)
#define BPE_CACHE_ARENA ((size_t)16 << 20)
#define BPE_CACHE_MAXLEN 256 /* longer pieces are not cached */

/* One heap entry of a piece being merged: the pair starting at symbol `pos`. */
typedef struct {
    int rank, pos, left, right; /* the merge's rank, the left symbol, the two ids it saw */
} bpe_cand;

struct bpe {
    int n;                  /* vocabulary size */
    uint32_t *len;          /* (n) byte length of each token (0: a hole) */
    size_t *off;            /* (n) offset of each token's bytes in bytes */
    char *bytes;            /* every token's bytes, back to back */
    size_t bytes_used, bytes_cap;
    int byte_id[256];       /* the token of each single byte (-1: none) */
    int *vslot;             /* (vcap) bytes -> id, open addressing, -1 empty */
    size_t vcap;
    bpe_merge *merge;       /* (mcap) the merge pairs, open addressing */
    size_t mcap, mcount;
    int ignore_merges;      /* a piece that is a token is that token */
    int *special;           /* (nspecial) added tokens, longest first */
    unsigned char *always;  /* (nspecial) 1: a non-special added token, matched always */
    int nspecial;
    unsigned char first[256]; /* first bytes of the added tokens */
    int doc, end;           /* document and end tokens, or -1 */
    pcre2_code *re;
    pcre2_match_data *md;
    char desc[160];
    /* encoding scratch (one encoder at a time) */
    int *sym, *next, *prev; /* (scap) symbol ids and links of a piece */
    bpe_cand *heap;         /* (scap) */
    size_t scap;
    bpe_cslot *cache;       /* (BPE_CACHE_SLOTS) pieces already encoded; emptied when the arena fills */
    char *arena;
    size_t arena_used;
    unsigned cache_count;
};

/* The pre-tokenizer patterns by name (gpt2, cl100k, llama3, o200k); NULL if unknown. */
const char *bpe_pattern(const char *name);
/* Allocate an empty table for n ids. */
int bpe_alloc(bpe *b, int n);
/* Give id the bytes s[0..len) (and index them). PL_EINVAL if the id or the bytes are taken. */
int bpe_set_token(bpe *b, int id, const char *s, size_t len);
/* The id of bytes s[0..len), or -1. */
int bpe_lookup(const bpe *b, const char *s, size_t len);
/* Record the merge left + right -> res at rank. */
int bpe_add_merge(bpe *b, int left, int right, int rank, int res);
/* Compile the pre-tokenizer regex (UTF, UCP, invalid UTF-8 allowed, JIT). */
int bpe_compile(bpe *b, const char *pattern, char *err, size_t errlen);
/* Add an added token (always: matched even where special tokens are not allowed). */
int bpe_add_special(bpe *b, int id, const char *text, int always);
/* Fill b from a tokenizer.json's text (bpe_json.c); a message without the path in err. */
int bpe_load_json(bpe *b, const char *text, size_t size, char *err, size_t errlen);
/* After the tables are filled: byte ids, added tokens sorted longest first. */
int bpe_finish(bpe *b, char *err, size_t errlen);

#endif
