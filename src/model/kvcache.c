/*
 * kvcache.c — one stage's KV cache and its decode step (kvcache.h): the buffers carved from
 * one backend allocation by the architecture's tables, and the walk over the stage's blocks.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/arch.h"
#include "util/common.h"
#include "model/kvcache.h"
#include "model/stage.h"

/* The next n floats of the arena (base NULL: only counted), 64-byte aligned. */
static float *kv_carve(char *base, size_t *off, size_t n) {
    float *p = base ? (float *)(base + *off) : NULL;
    *off += (n + 15) / 16 * 16 * sizeof(float);
    return p;
}

/* Floats of one scratch row of the architecture for this decoding state (0: not needed). */
static size_t kv_scratch_floats(const kv_stage *kv, const arch_scratch *r) {
    if (r->need == SCR_EMBED && !kv->st->has_embed) return 0;
    return (r->per == SCR_PER_TOKEN ? (size_t)kv->rows : (size_t)kv->maxT) * arch_dim_value(&kv->st->cfg, 1, r->dim);
}

/* Every buffer in the arena (base NULL: only counted). Returns the bytes. */
static size_t kv_lay(kv_stage *kv, char *base) {
    const stage *st = kv->st;
    const model_arch *A = st->arch;
    const model_config *c = &st->cfg;
    size_t off = 0, R = (size_t)kv->rows;
    kv->cache = kv_carve(base, &off, (size_t)kv->nseq * st->nb * 2 * kv->maxT * kv->kvw);
    for (int i = 0; i < A->acts.n; i++)
        kv->work.t[i] = kv_carve(base, &off, R * arch_dim_value(c, 1, A->acts.rows[i].per_token));
    for (int i = 0; st->has_head && i < A->head_acts.n; i++)
        kv->head.t[i] = kv_carve(base, &off, R * arch_dim_value(c, 1, A->head_acts.rows[i].per_token));
    for (int i = 0; i < A->nscratch; i++) {
        size_t n = kv_scratch_floats(kv, &A->scratch[i]);
        kv->scr.t[i] = n ? kv_carve(base, &off, n) : NULL;
    }
    kv->x = kv_carve(base, &off, R * c->C);
    kv->hx = st->has_head ? kv_carve(base, &off, (size_t)kv->nsample * c->C) : NULL;
    kv->logits = st->has_head ? kv_carve(base, &off, (size_t)kv->nsample * c->Vp) : NULL;
    kv->tok = (int *)kv_carve(base, &off, R);
    return off;
}

/* The rows filled once (the rotary tables), for positions 0..maxT-1. */
static int kv_fill(kv_stage *kv) {
    const model_arch *A = kv->st->arch;
    for (int i = 0; i < A->nscratch; i++) {
        size_t n = kv_scratch_floats(kv, &A->scratch[i]);
        if (A->scratch[i].use != SCR_FILL || !n) continue;
        float *host = malloc(n * sizeof(float));
        int rc = host ? A->scratch_fill(&kv->st->cfg, kv->maxT, i, host) : PL_ENOMEM;
        if (rc == PL_OK) rc = kv->st->be->from_host(kv->scr.t[i], host, n * sizeof(float));
        free(host);
        PL_TRY(rc);
    }
    return PL_OK;
}

int kv_stage_init(kv_stage *kv, stage *st, int nseq, int rows, int nsample, char *err, size_t errlen) {
    memset(kv, 0, sizeof *kv);
    kv->st = st;
    kv->nseq = nseq;
    kv->maxT = st->cfg.maxT;
    kv->kvw = st->cfg.NKV * (st->cfg.C / st->cfg.NH);
    kv->rows = rows;
    kv->nsample = nsample;
    size_t bytes = kv_lay(kv, NULL);
    int rc = st->be->alloc(&kv->arena, bytes);
    if (rc == PL_OK) {
        kv_lay(kv, kv->arena);
        rc = kv_fill(kv);
    }
    if (rc != PL_OK) {
        snprintf(err, errlen, "backend %s: the KV cache of %d sequences (%.1f MB): %s", st->be->name, nseq,
                 bytes / 1e6, rc == PL_ENOMEM ? "out of host memory" : st->be->error());
        kv_stage_free(kv);
    }
    return rc;
}

void kv_stage_free(kv_stage *kv) {
    if (kv->arena) kv->st->be->free(kv->arena);
    kv->arena = NULL;
}

/* Sequence seq's cache of block b (keys; the values follow). */
static float *kv_k(const kv_stage *kv, int seq, int b) {
    return kv->cache + (((size_t)seq * kv->st->nb + b) * 2) * kv->maxT * kv->kvw;
}

/* The last stage: the wanted rows gathered, the final norm and the head over them. */
static int kv_head(kv_stage *kv, const block_dims *d0, const kv_seg *seg, int nseg, float *logits_host) {
    stage *st = kv->st;
    const backend *be = st->be;
    const model_config *c = &st->cfg;
    int ns = 0;
    for (int i = 0; i < nseg; i++)
        if (seg[i].sample) {
            PL_TRY(be->copy(kv->hx + (size_t)ns * c->C, kv->x + (size_t)(seg[i].row + seg[i].n - 1) * c->C,
                            sizeof(float) * c->C));
            ns++;
        }
    if (!ns) return PL_OK;
    block_dims d = *d0;
    d.N = d.T = ns;
    PL_TRY(st->arch->head_norm_forward(be, &d, st->hp.t, kv->head.t, kv->hx));
    PL_TRY(be->matmul_decode_fwd(kv->logits, kv->head.t[st->arch->head_out], st->head_w, NULL, ns, c->C, c->Vp));
    return be->to_host(logits_host, kv->logits, sizeof(float) * ns * c->Vp);
}

int kv_stage_forward(kv_stage *kv, kv_seg *seg, int nseg, const int *tok_host, const float *x_in, float *out_host,
                     float *logits_host) {
    stage *st = kv->st;
    const backend *be = st->be;
    const model_arch *A = st->arch;
    const model_config *c = &st->cfg;
    int N = nseg ? seg[nseg - 1].row + seg[nseg - 1].n : 0;
    if (N < 1 || N > kv->rows || nseg > kv->nsample) return PL_EINVAL;
    size_t nc = sizeof(float) * N * c->C;
    block_dims d = {1, N, c->C, c->NH, N, c->NKV, c->C / c->NH, c->H, (int)arch_dim_value(c, 1, AD_QKV), c, kv->scr.t,
                    NULL, NULL, NULL, NULL, NULL};
    kv_batch b = {nseg, seg};
    if (st->has_embed) {
        PL_TRY(be->from_host(kv->tok, tok_host, sizeof(int) * N));
        PL_TRY(A->embed_decode(be, &d, st->ep.t, kv->x, kv->tok, &b));
    } else PL_TRY(be->from_host(kv->x, x_in, nc));
    for (int l = 0; l < st->nb; l++) {
        for (int i = 0; i < nseg; i++) {
            seg[i].k = kv_k(kv, seg[i].seq, l);
            seg[i].v = seg[i].k + (size_t)kv->maxT * kv->kvw;
        }
        PL_TRY(A->block_decode(be, &d, st->bp[l].t, kv->work.t, &b, kv->x));
        PL_TRY(be->copy(kv->x, kv->work.t[A->block_out], nc));
    }
    if (st->has_head) return kv_head(kv, &d, seg, nseg, logits_host);
    return be->to_host(out_host, kv->x, nc);
}
