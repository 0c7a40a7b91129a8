/*
 * bpe.c — byte-level BPE's tables and its encoder (bpe.h): the vocabulary and merge hashes,
 * the pre-tokenizer regex, the special-token split and the merges by rank over a heap.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util/common.h"
#include "formats/bpe_internal.h"

/* FNV-1a over bytes. */
static uint64_t bpe_hash(const char *s, size_t len) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t pair_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

int bpe_alloc(bpe *b, int n) {
    b->n = n;
    b->len = calloc((size_t)n, sizeof *b->len);
    b->off = calloc((size_t)n, sizeof *b->off);
    b->bytes_cap = (size_t)n * 8 + 256;
    b->bytes = malloc(b->bytes_cap);
    b->vcap = 16;
    while (b->vcap < (size_t)n * 2) b->vcap *= 2;
    b->vslot = malloc(sizeof(int) * b->vcap);
    b->mcap = b->vcap * 2; /* grows: a tiktoken vocabulary's tokens may split several ways */
    b->merge = malloc(sizeof(bpe_merge) * b->mcap);
    if (!b->len || !b->off || !b->bytes || !b->vslot || !b->merge) return PL_ENOMEM;
    memset(b->vslot, 0xff, sizeof(int) * b->vcap);
    memset(b->merge, 0xff, sizeof(bpe_merge) * b->mcap);
    b->doc = b->end = -1;
    return PL_OK;
}

int bpe_lookup(const bpe *b, const char *s, size_t len) {
    size_t mask = b->vcap - 1;
    for (size_t i = bpe_hash(s, len) & mask;; i = (i + 1) & mask) {
        int id = b->vslot[i];
        if (id < 0) return -1;
        if (b->len[id] == len && memcmp(b->bytes + b->off[id], s, len) == 0) return id;
    }
}

int bpe_set_token(bpe *b, int id, const char *s, size_t len) {
    if (id < 0 || id >= b->n || b->len[id] || len == 0 || len > UINT32_MAX || bpe_lookup(b, s, len) >= 0)
        return PL_EINVAL;
    if (b->bytes_used + len > b->bytes_cap) {
        size_t cap = (b->bytes_cap + len) * 2;
        char *nb = realloc(b->bytes, cap);
        if (!nb) return PL_ENOMEM;
        b->bytes = nb;
        b->bytes_cap = cap;
    }
    memcpy(b->bytes + b->bytes_used, s, len);
    b->off[id] = b->bytes_used;
    b->len[id] = (uint32_t)len;
    b->bytes_used += len;
    size_t mask = b->vcap - 1, i = bpe_hash(s, len) & mask;
    while (b->vslot[i] >= 0) i = (i + 1) & mask;
    b->vslot[i] = id;
    return PL_OK;
}

/* The slot of pair key k in m (mcap slots): its own, or the empty one where it would go. */
static size_t merge_slot(const bpe_merge *m, size_t mcap, uint64_t k) {
    size_t mask = mcap - 1, i = pair_hash(k) & mask;
    while (m[i].key != UINT64_MAX && m[i].key != k) i = (i + 1) & mask;
    return i;
}

static int merge_grow(bpe *b) {
    size_t cap = b->mcap * 2;
    bpe_merge *m = malloc(sizeof(bpe_merge) * cap);
    if (!m) return PL_ENOMEM;
    memset(m, 0xff, sizeof(bpe_merge) * cap);
    for (size_t i = 0; i < b->mcap; i++)
        if (b->merge[i].key != UINT64_MAX) m[merge_slot(m, cap, b->merge[i].key)] = b->merge[i];
    free(b->merge);
    b->merge = m, b->mcap = cap;
    return PL_OK;
}

int bpe_add_merge(bpe *b, int left, int right, int rank, int res) {
    if ((b->mcount + 1) * 2 > b->mcap) PL_TRY(merge_grow(b));
    uint64_t k = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    bpe_merge *m = &b->merge[merge_slot(b->merge, b->mcap, k)];
    if (m->key == k) { /* the first (lowest) rank wins, as a merges list read in order */
        if (rank < m->rank) m->rank = rank, m->res = res;
        return PL_OK;
    }
    *m = (bpe_merge){k, rank, res};
    b->mcount++;
    return PL_OK;
}

/* The merge of left + right: its rank (INT32_MAX: none) and *res. */
static inline int merge_find(const bpe *b, int left, int right, int *res) {
    uint64_t k = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t mask = b->mcap - 1;
    for (size_t i = pair_hash(k) & mask;; i = (i + 1) & mask) {
        const bpe_merge *m = &b->merge[i];
        if (m->key == k) {
            *res = m->res;
            return m->rank;
        }
        if (m->key == UINT64_MAX) return INT32_MAX;
    }
}

/* The pattern with \s and \S as Unicode's White_Space property, which tiktoken's and Hugging
 * Face's regex engines use: PCRE2's own \s also matches U+180E (Mongolian vowel separator),
 * no longer a space since Unicode 6.3. NULL when out of memory. */
static char *white_space(const char *pattern) {
    size_t n = strlen(pattern);
    char *out = malloc(n * 8 + 1), *o = out;
    if (!out) return NULL;
    for (const char *p = pattern; *p; p++) {
        if (p[0] == '\\' && (p[1] == 's' || p[1] == 'S')) {
            o += sprintf(o, "\\%c{White_Space}", p[1] == 's' ? 'p' : 'P');
            p++;
        } else if (p[0] == '\\' && p[1]) {
            *o++ = *p++;
            *o++ = *p;
        } else {
            *o++ = *p;
        }
    }
    *o = 0;
    return out;
}

int bpe_compile(bpe *b, const char *pattern, char *err, size_t errlen) {
    int ec;
    PCRE2_SIZE eo;
    char *pat = white_space(pattern);
    if (!pat) return PL_ENOMEM;
    b->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                          &ec, &eo, NULL);
    free(pat);
    if (!b->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        snprintf(err, errlen, "its pre-tokenizer regex does not compile: %s", (char *)msg);
        return PL_EINVAL;
    }
    pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE); /* without JIT (a platform without it) it still matches */
    b->md = pcre2_match_data_create_from_pattern(b->re, NULL);
    return b->md ? PL_OK : PL_ENOMEM;
}

/* Added tokens longest first (a longer one wins where one is the other's prefix), then by id. */
static void sort_special(bpe *b) {
    for (int i = 1; i < b->nspecial; i++) {
        int x = b->special[i], j = i;
        unsigned char a = b->always[i];
        while (j > 0 && (b->len[b->special[j - 1]] < b->len[x] ||
                         (b->len[b->special[j - 1]] == b->len[x] && b->special[j - 1] > x))) {
            b->special[j] = b->special[j - 1], b->always[j] = b->always[j - 1];
            j--;
        }
        b->special[j] = x, b->always[j] = a;
    }
}

int bpe_finish(bpe *b, char *err, size_t errlen) {
    for (int c = 0; c < 256; c++) {
        char ch = (char)c;
        b->byte_id[c] = bpe_lookup(b, &ch, 1);
        if (b->byte_id[c] < 0) {
            snprintf(err, errlen, "byte 0x%02x has no token: not a byte-level vocabulary", c);
            return PL_EINVAL;
        }
    }
    sort_special(b);
    memset(b->first, 0, sizeof b->first);
    for (int i = 0; i < b->nspecial; i++) b->first[(unsigned char)b->bytes[b->off[b->special[i]]]] = 1;
    return PL_OK;
}

static int ids_push(bpe_ids *o, int id) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 1024;
        int *nv = realloc(o->v, sizeof(int) * cap);
        if (!nv) return PL_ENOMEM;
        o->v = nv, o->cap = cap;
    }
    o->v[o->n++] = id;
    return PL_OK;
}

void bpe_ids_free(bpe_ids *ids) {
    free(ids->v);
    memset(ids, 0, sizeof *ids);
}

static int scratch(bpe *b, size_t L) {
    if (L <= b->scap) return PL_OK;
    size_t cap = L * 2;
    free(b->sym), free(b->next), free(b->prev), free(b->heap);
    b->sym = malloc(sizeof(int) * cap);
    b->next = malloc(sizeof(int) * cap);
    b->prev = malloc(sizeof(int) * cap);
    b->heap = malloc(sizeof(bpe_cand) * cap);
    b->scap = (b->sym && b->next && b->prev && b->heap) ? cap : 0;
    return b->scap ? PL_OK : PL_ENOMEM;
}

/* Heap order: lower rank first, then the leftmost pair. */
static inline int cand_less(const bpe_cand *x, const bpe_cand *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void heap_push(bpe_cand *h, int *n, bpe_cand c) {
    int i = (*n)++;
    while (i > 0 && cand_less(&c, &h[(i - 1) / 2])) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
    h[i] = c;
}

static bpe_cand heap_pop(bpe_cand *h, int *n) {
    bpe_cand top = h[0], last = h[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c])) c++;
        if (!cand_less(&h[c], &last)) break;
        h[i] = h[c], i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

/* Push the pair starting at symbol i, if it has a merge. */
static inline void pair_push(bpe *b, int *hn, int i) {
    int j = b->next[i], res;
    if (j < 0) return;
    int r = merge_find(b, b->sym[i], b->sym[j], &res);
    if (r != INT32_MAX) heap_push(b->heap, hn, (bpe_cand){r, i, b->sym[i], b->sym[j]});
}

/* One piece p[0..L): its bytes' tokens merged by rank. Symbol i starts as byte i; a merge
 * keeps the left symbol and unlinks the right one; a heap entry whose symbols changed since
 * it was pushed is stale and skipped. */
static int encode_piece(bpe *b, const char *p, size_t L, bpe_ids *out) {
    if (L == 1) return ids_push(out, b->byte_id[(unsigned char)p[0]]);
    if (b->ignore_merges) {
        int id = bpe_lookup(b, p, L);
        if (id >= 0) return ids_push(out, id);
    }
    PL_TRY(scratch(b, L));
    int n = (int)L, hn = 0, res = -1;
    for (int i = 0; i < n; i++) {
        b->sym[i] = b->byte_id[(unsigned char)p[i]];
        b->next[i] = i + 1 < n ? i + 1 : -1;
        b->prev[i] = i - 1;
    }
    for (int i = 0; i + 1 < n; i++) pair_push(b, &hn, i);
    while (hn > 0) {
        bpe_cand c = heap_pop(b->heap, &hn);
        int i = c.pos, j = b->next[i];
        if (b->sym[i] != c.left || j < 0 || b->sym[j] != c.right) continue; /* stale */
        merge_find(b, c.left, c.right, &res);
        b->sym[i] = res;
        b->sym[j] = -1;
        b->next[i] = b->next[j];
        if (b->next[j] >= 0) b->prev[b->next[j]] = i;
        if (b->prev[i] >= 0) pair_push(b, &hn, b->prev[i]);
        pair_push(b, &hn, i);
    }
    for (int i = 0; i >= 0; i = b->next[i]) PL_TRY(ids_push(out, b->sym[i]));
    return PL_OK;
}

/* A piece through the cache: pieces repeat (words, indentation), and a hit costs one hash. */
static int encode_cached(bpe *b, const char *p, size_t L, bpe_ids *out) {
    if (L < 2 || L > BPE_CACHE_MAXLEN) return encode_piece(b, p, L, out);
    if (!b->cache) {
        b->cache = calloc(BPE_CACHE_SLOTS, sizeof(bpe_cslot));
        b->arena = malloc(BPE_CACHE_ARENA);
        if (!b->cache || !b->arena) return PL_ENOMEM;
    }
    uint64_t h = bpe_hash(p, L) | 1;
    size_t mask = BPE_CACHE_SLOTS - 1, i = h & mask;
    for (;; i = (i + 1) & mask) {
        const bpe_cslot *c = &b->cache[i];
        if (!c->hash) break;
        if (c->hash == h && c->len == L && memcmp(b->arena + c->off, p, L) == 0) {
            for (unsigned k = 0; k < c->nids; k++) {
                int id;
                memcpy(&id, b->arena + c->off + L + k * sizeof(int), sizeof id);
                PL_TRY(ids_push(out, id));
            }
            return PL_OK;
        }
    }
    size_t n0 = out->n;
    PL_TRY(encode_piece(b, p, L, out));
    size_t nids = out->n - n0, need = L + nids * sizeof(int);
    if (b->cache_count * 2 >= BPE_CACHE_SLOTS || b->arena_used + need > BPE_CACHE_ARENA) { /* full: start over */
        memset(b->cache, 0, sizeof(bpe_cslot) * BPE_CACHE_SLOTS);
        b->arena_used = 0, b->cache_count = 0;
        i = h & mask;
    }
    b->cache[i] = (bpe_cslot){h, (uint32_t)b->arena_used, (uint16_t)L, (uint16_t)nids};
    memcpy(b->arena + b->arena_used, p, L);
    memcpy(b->arena + b->arena_used + L, out->v + n0, nids * sizeof(int));
    b->arena_used += need;
    b->cache_count++;
    return PL_OK;
}

/* Ordinary text (no added tokens in it): the regex's pieces, and what it leaves between
 * them (bytes that are not UTF-8) as pieces of their own. */
static int encode_ordinary(bpe *b, const char *t, size_t n, bpe_ids *out) {
    size_t at = 0;
    while (at < n) {
        int rc = b->re ? pcre2_match(b->re, (PCRE2_SPTR)t, n, at, 0, b->md, NULL) : PCRE2_ERROR_NOMATCH;
        if (rc < 0) return encode_cached(b, t + at, n - at, out);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(b->md);
        size_t s = ov[0], e = ov[1];
        if (s > at) PL_TRY(encode_cached(b, t + at, s - at, out));
        if (e == s) { /* an empty match: no pattern here has one, but never loop on it */
            e = s + 1;
            while (e < n && ((unsigned char)t[e] & 0xc0) == 0x80) e++;
        }
        PL_TRY(encode_cached(b, t + s, e - s, out));
        at = e;
    }
    return PL_OK;
}

/* The added token at t[0..n), or -1 (longest first; special ones only when allowed). */
static int added_at(const bpe *b, const char *t, size_t n, int allow_special) {
    for (int k = 0; k < b->nspecial; k++) {
        int id = b->special[k];
        if (!allow_special && !b->always[k]) continue;
        if (b->len[id] <= n && memcmp(t, b->bytes + b->off[id], b->len[id]) == 0) return id;
    }
    return -1;
}

int bpe_encode(bpe *b, const char *text, size_t n, int allow_special, bpe_ids *out) {
    int any = 0;
    for (int k = 0; k < b->nspecial; k++) any |= allow_special || b->always[k];
    if (!any) return encode_ordinary(b, text, n, out);
    size_t from = 0;
    for (size_t i = 0; i < n; i++) {
        if (!b->first[(unsigned char)text[i]]) continue;
        int id = added_at(b, text + i, n - i, allow_special);
        if (id < 0) continue;
        PL_TRY(encode_ordinary(b, text + from, i - from, out));
        PL_TRY(ids_push(out, id));
        i += b->len[id] - 1;
        from = i + 1;
    }
    return encode_ordinary(b, text + from, n - from, out);
}

int bpe_vocab(const bpe *b) { return b->n; }

const char *bpe_token(const bpe *b, int id, size_t *len) {
    if (id < 0 || id >= b->n || !b->len[id]) {
        *len = 0;
        return NULL;
    }
    *len = b->len[id];
    return b->bytes + b->off[id];
}

int bpe_find(const bpe *b, const char *text) { return bpe_lookup(b, text, strlen(text)); }
int bpe_doc_token(const bpe *b) { return b->doc; }
int bpe_end_token(const bpe *b) { return b->end; }
const char *bpe_desc(const bpe *b) { return b->desc; }

void bpe_free(bpe *b) {
    if (!b) return;
    free(b->len), free(b->off), free(b->bytes), free(b->vslot);
    free(b->merge), free(b->cache), free(b->arena);
    free(b->special), free(b->always);
    free(b->sym), free(b->next), free(b->prev), free(b->heap);
    if (b->md) pcre2_match_data_free(b->md);
    if (b->re) pcre2_code_free(b->re);
    free(b);
}
