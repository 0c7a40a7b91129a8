/*
 * onednn_wcache.h — the oneDNN backend's bf16 weight copies (src/backend/onednn/onednn_wcache.c): in bf16 a
 * matmul multiplies bf16 weights, and a weight changes only when the optimizer updates it or
 * a checkpoint, an llm.c file or a data-parallel gather writes it; so its bf16 copy is made
 * once after each change and reused by every micro-batch's forward and input-gradient product
 * until the next one, instead of being converted again on every call. A range counts as
 * weights only when it lies inside memory this backend allocated and AdamW has updated it, or
 * inside such an allocation after a write through a view of all of it (ZeRO-1's gather) —
 * memory that only this backend's calls write, by the backend contract; every write the
 * backend sees (AdamW, scale, from_host, copy, zero, a map or unmap for writing, free) drops
 * the copies it overlaps. The copies are the same rounding of the same values as a per-call
 * conversion, so the products keep their bits. A copy may also be in a layout of the caller's
 * (wcache_get_made: the blocked weights operand a product's kernel picks), one per layout, with
 * the same staleness. One caller thread, as every backend here.
 */
#ifndef PIPELM_ONEDNN_WCACHE_H
#define PIPELM_ONEDNN_WCACHE_H

#include <stddef.h>
#include <stdint.h>

/* Converter the copies are made with (the backend's fp32 -> bf16, round to nearest even). */
typedef void (*wcache_cvt_fn)(uint16_t *dst, const float *src, size_t n);

/* on = 1: keep copies (converting with cvt); 0: keep none (wcache_get always says "convert
 * it yourself"). Switching off frees the copies; the tracking of allocations goes on. */
void wcache_enable(int on, wcache_cvt_fn cvt);
/* Memory the backend allocated, and freed (the copies and weight ranges inside it go). */
void wcache_alloc(const void *p, size_t bytes);
void wcache_free(const void *p);
/* bytes at p were (or are about to be) written: the copies overlapping them are stale. */
void wcache_write(const void *p, size_t bytes);
/* A write through one view of all of the allocation at p (bytes: its size): as wcache_write,
 * and if AdamW updated a part of it, all of it is weights (under ZeRO-1 a replica's AdamW
 * updates its own shard and a gather writes the whole parameter buffer). */
void wcache_write_whole(const void *p, size_t bytes);
/* AdamW updated n floats at p: stale as above, and [p, p + n) is a weight range if it lies
 * inside memory this backend allocated. */
void wcache_update(const float *p, size_t n);
/* The bf16 copy of the n floats at w in *out, made now if there is none or it is stale; *out
 * = NULL when w is not inside a weight range, the cache is off or a copy cannot be allocated:
 * the caller converts it itself. */
void wcache_get(const float *w, size_t n, const uint16_t **out);
/* Makes a copy in another layout: dst (the bytes wcache_get_made was given) from the floats at
 * w; returns 0, or non-zero when it could not (the caller then converts itself). */
typedef int (*wcache_make_fn)(void *ctx, uint16_t *dst, const float *w);
/* As wcache_get, for a copy of the n floats at w in a layout of the caller's (a product's
 * blocked weights operand), bytes long, told apart from other layouts of the same w by kind
 * (> 0; kind 0 is wcache_get's plain copy) and made by make(ctx, ...) when stale or new. The
 * same weights, the same staleness: every write the cache is told of makes every kind stale. */
void wcache_get_made(const float *w, size_t n, int kind, size_t bytes, wcache_make_fn make, void *ctx,
                     const uint16_t **out);
/* Every copy, weight range and allocation forgotten (the backend's finalize). */
void wcache_clear(void);

/* Counters since the last wcache_clear (tests, benchmarks): copies made, copies reused,
 * requests that were not weights, bytes of copies held. */
typedef struct {
    long made, reused, declined;
    size_t bytes;
} wcache_stats;
void wcache_get_stats(wcache_stats *s);

#endif
