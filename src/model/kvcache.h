/*
 * kvcache.h — the key/value cache of one pipeline stage for decoding (pipelm generate), and
 * the decode step through that stage. Each stage caches the keys and values of its own
 * blocks only: per cached sequence and block, K and V of (maxT, NKV HS) floats in one backend
 * allocation. A decode step ("item") is a batch of row segments: segment i holds n rows that
 * are positions pos..pos+n-1 of one sequence, so one item can be a chunk of several prompts'
 * prefill or one new token of each sequence of a group; every matrix product runs over all
 * the item's rows at once, the attention per segment over that sequence's cache (the
 * attention_kv_fwd op, backend_ops.h). The architecture's decode functions (arch.h:
 * block_decode, embed_decode) do the math; this module owns the buffers and walks the blocks.
 */
#ifndef PIPELM_KVCACHE_H
#define PIPELM_KVCACHE_H

#include <stddef.h>
#include "pipelm/backend.h"
#include "model/model.h"

/* Rows [row, row + n) of an item are positions pos..pos+n-1 of sequence seq; k and v are that
 * sequence's cache of the block being computed ((maxT, NKV HS) each, backend memory), set by
 * kv_stage_forward before each block. sample: the last row's logits are wanted. */
typedef struct {
    int seq, row, n, pos, sample;
    float *k, *v;
} kv_seg;

/* The segments of one item, as the architecture's decode functions see them. */
typedef struct {
    int nseg;
    const kv_seg *seg;
} kv_batch;

struct stage;

/* One stage's decoding state. */
typedef struct {
    struct stage *st;
    int nseq, maxT, kvw, rows;  /* cached sequences, positions, NKV HS, most rows of one item */
    int nsample;                /* most sampled rows (segments) of one item */
    float *cache;               /* (nseq, nb, 2, maxT, kvw) */
    block_ptrs work;            /* the architecture's block activation rows, for `rows` rows */
    block_ptrs head;            /* its head activation rows, for `rows` rows */
    block_ptrs scr;             /* its scratch rows: per position for maxT, per token for `rows` */
    float *x;                   /* (rows, C) the residual stream */
    float *hx;                  /* (nsample, C) the rows whose logits are wanted */
    float *logits;              /* (nsample, Vp) */
    int *tok;                   /* (rows) tokens (first stage) */
    void *arena;
} kv_stage;

/* Allocate the cache of nseq sequences and buffers for items of at most `rows` rows and
 * `nsample` segments on stage st (its weights set already). err gets the backend's message. */
int kv_stage_init(kv_stage *kv, struct stage *st, int nseq, int rows, int nsample, char *err, size_t errlen);
void kv_stage_free(kv_stage *kv);
/* The stage's part of an item: tok_host (rows, first stage) or x_in (host, rows x C) in;
 * out_host (rows x C) receives the output unless this is the last stage; on the last stage
 * logits_host receives (number of sample segments) x Vp logits, in segment order. */
int kv_stage_forward(kv_stage *kv, kv_seg *seg, int nseg, const int *tok_host, const float *x_in, float *out_host,
                     float *logits_host);

#endif
