/*
 * onednn_wcache.c — the oneDNN backend's bf16 weight copies (onednn_wcache.h).
 *
 * Three small tables, searched linearly (a stage has tens to a few hundred weight tensors, and
 * a lookup costs nothing beside the product it feeds): the live allocations of the backend,
 * the weight ranges (what AdamW updated inside them: one per tensor, as optim_step calls it),
 * and the copies, keyed by (pointer, length). A copy is never served stale: every write the
 * backend is told of marks the copies it overlaps stale, and a stale copy is made again, in
 * its own buffer, on its next use. Buffers are plain aligned_alloc (not the backend's alloc:
 * a failure here is not an error, the caller converts as before, and the test-only allocation
 * fault injection keeps counting the backend's own allocations only).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "backend/onednn/onednn_wcache.h"

#define MAX_RANGES 65536 /* weight ranges kept at most (a model has far fewer tensors) */

typedef struct {
    uintptr_t lo, hi; /* bytes [lo, hi) */
} span;

typedef struct {
    const float *w;
    size_t n;
    int kind;     /* 0: plain bf16 (the converter's); others: a layout wcache_get_made names */
    size_t bytes; /* of bf */
    uint16_t *bf;
    int fresh; /* bf holds the bf16 of w's current values */
} wcopy;

static struct {
    int on;
    wcache_cvt_fn cvt;
    span *alloc, *wr;
    size_t nalloc, capalloc, nwr, capwr;
    wcopy *cp;
    size_t ncp, capcp;
    wcache_stats st;
} W;

/* Room for need elements of elem bytes in *arr (capacity *cap); 0, or -1 out of memory. */
static int grow(void **arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap * 2 : 64;
    while (c < need) c *= 2;
    void *p = realloc(*arr, c * elem);
    if (!p) return -1;
    *arr = p;
    *cap = c;
    return 0;
}

/* The bytes [p, p + bytes); whether two spans share a byte; whether a lies within outer. */
static span span_of(const void *p, size_t bytes) {
    span s = {(uintptr_t)p, (uintptr_t)p + bytes};
    return s;
}
static int overlaps(span a, span b) { return a.lo < b.hi && b.lo < a.hi; }
static int inside(span a, span outer) { return a.lo >= outer.lo && a.hi <= outer.hi; }

/* Drop copy i (its buffer freed; the last copy takes its place). */
static void drop_copy(size_t i) {
    W.st.bytes -= W.cp[i].bytes;
    free(W.cp[i].bf);
    W.cp[i] = W.cp[--W.ncp];
}

/* Every copy dropped (the cache switched off, or cleared). */
static void drop_copies(void) {
    while (W.ncp) drop_copy(W.ncp - 1);
}

/* On with a converter, or off (the copies go; allocations and weight ranges stay known). */
void wcache_enable(int on, wcache_cvt_fn cvt) {
    W.on = on && cvt;
    W.cvt = cvt;
    if (!W.on) drop_copies();
}

/* A live allocation of the backend; one the table cannot hold is never weights. */
void wcache_alloc(const void *p, size_t bytes) {
    if (!p) return;
    if (grow((void **)&W.alloc, &W.capalloc, W.nalloc + 1, sizeof *W.alloc)) return; /* untracked: never weights */
    W.alloc[W.nalloc++] = span_of(p, bytes ? bytes : 1);
}

/* The allocation p leaves, with every weight range and copy inside it. */
void wcache_free(const void *p) {
    if (!p) return;
    for (size_t i = 0; i < W.nalloc; i++) {
        if (W.alloc[i].lo != (uintptr_t)p) continue;
        span a = W.alloc[i];
        W.alloc[i] = W.alloc[--W.nalloc];
        for (size_t k = W.nwr; k-- > 0;)
            if (overlaps(W.wr[k], a)) W.wr[k] = W.wr[--W.nwr];
        for (size_t k = W.ncp; k-- > 0;)
            if (overlaps(span_of(W.cp[k].w, W.cp[k].n * sizeof(float)), a)) drop_copy(k);
        return;
    }
}

/* The copies overlapping [p, p + bytes) are stale (kept, to be made again in place). */
void wcache_write(const void *p, size_t bytes) {
    if (!bytes) return;
    span s = span_of(p, bytes);
    for (size_t k = 0; k < W.ncp; k++)
        if (overlaps(span_of(W.cp[k].w, W.cp[k].n * sizeof(float)), s)) W.cp[k].fresh = 0;
}

/* Stale as any write; then a weight range when inside a live allocation (once per range). */
void wcache_update(const float *p, size_t n) {
    if (!n) return;
    span s = span_of(p, n * sizeof(float));
    wcache_write(p, n * sizeof(float));
    for (size_t k = 0; k < W.nwr; k++)
        if (W.wr[k].lo == s.lo && W.wr[k].hi == s.hi) return;
    if (W.nwr >= MAX_RANGES) return;
    for (size_t i = 0; i < W.nalloc; i++)
        if (inside(s, W.alloc[i])) {
            if (grow((void **)&W.wr, &W.capwr, W.nwr + 1, sizeof *W.wr)) return;
            W.wr[W.nwr++] = s;
            return;
        }
}

/* A write through a view of all of allocation [p, p + bytes) (a ZeRO-1 gather of every
 * parameter of the stage): stale as any write; and when AdamW updated a part of it, all of it
 * is weights from now on (the other replicas' shards it holds change only so, or by AdamW). */
void wcache_write_whole(const void *p, size_t bytes) {
    wcache_write(p, bytes);
    span s = span_of(p, bytes);
    int known = 0, has_weights = 0;
    for (size_t i = 0; i < W.nalloc && !known; i++) known = W.alloc[i].lo == s.lo && W.alloc[i].hi == s.hi;
    for (size_t k = 0; known && k < W.nwr; k++) {
        if (W.wr[k].lo == s.lo && W.wr[k].hi == s.hi) return; /* already */
        has_weights |= inside(W.wr[k], s);
    }
    if (!has_weights || W.nwr >= MAX_RANGES) return;
    if (grow((void **)&W.wr, &W.capwr, W.nwr + 1, sizeof *W.wr)) return;
    W.wr[W.nwr++] = s;
}

/* Whether s lies within one weight range (a tensor AdamW updates, or a part of one). */
static int is_weight(span s) {
    for (size_t k = 0; k < W.nwr; k++)
        if (inside(s, W.wr[k])) return 1;
    return 0;
}

/* The copy (w, n, kind) of bytes, a new one when there is none (or a stale one of another
 * size: a layout for other threads); NULL when out of memory. */
static wcopy *find_or_add(const float *w, size_t n, int kind, size_t bytes) {
    for (size_t k = 0; k < W.ncp; k++)
        if (W.cp[k].w == w && W.cp[k].n == n && W.cp[k].kind == kind) {
            if (W.cp[k].bytes == bytes) return &W.cp[k];
            drop_copy(k);
            break;
        }
    if (grow((void **)&W.cp, &W.capcp, W.ncp + 1, sizeof *W.cp)) return NULL;
    uint16_t *bf = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!bf) return NULL;
    W.cp[W.ncp] = (wcopy){w, n, kind, bytes, bf, 0};
    W.st.bytes += bytes;
    return &W.cp[W.ncp++];
}

/* The fresh copy (w, n, kind), made now (by make, or the converter) if stale or new; NULL when
 * w is not weights. */
static void get_copy(const float *w, size_t n, int kind, size_t bytes, wcache_make_fn make, void *ctx,
                     const uint16_t **out) {
    *out = NULL;
    if (!W.on || !n || !w || n > SIZE_MAX / sizeof(float) || !is_weight(span_of(w, n * sizeof(float)))) {
        W.st.declined++;
        return;
    }
    wcopy *c = find_or_add(w, n, kind, bytes);
    if (!c) {
        W.st.declined++;
        return;
    }
    if (c->fresh) W.st.reused++;
    else {
        if (make) {
            if (make(ctx, c->bf, w) != 0) { /* not made: the caller converts as without a cache */
                W.st.declined++;
                return;
            }
        } else W.cvt(c->bf, w, n);
        c->fresh = 1;
        W.st.made++;
    }
    *out = c->bf;
}

void wcache_get(const float *w, size_t n, const uint16_t **out) {
    get_copy(w, n, 0, n * sizeof(uint16_t), NULL, NULL, out);
}

void wcache_get_made(const float *w, size_t n, int kind, size_t bytes, wcache_make_fn make, void *ctx,
                     const uint16_t **out) {
    if (kind <= 0 || !make) { /* kind 0 is the converter's */
        *out = NULL;
        W.st.declined++;
        return;
    }
    get_copy(w, n, kind, bytes, make, ctx, out);
}

/* Everything forgotten and freed; the on/off setting and the converter stay. */
void wcache_clear(void) {
    drop_copies();
    free(W.cp);
    free(W.alloc);
    free(W.wr);
    int on = W.on;
    wcache_cvt_fn cvt = W.cvt;
    memset(&W, 0, sizeof W);
    W.on = on;
    W.cvt = cvt;
}

void wcache_get_stats(wcache_stats *s) { *s = W.st; }
