/*
 * backend_onednn.c — the oneDNN backend ("onednn"): matrix products through oneDNN matmul
 * primitives, in fp32 or in bf16 (bf16 inputs, fp32 accumulation and output), host memory.
 *
 * What runs where:
 *   matmul_fwd / matmul_bwd_input / matmul_bwd_weight: one oneDNN matmul each. The weight
 *     gradient accumulates into dW through a sum post-op (dW = 1 * dW + dout^T inp); the fwd
 *     bias is oneDNN's bias argument (fp32). db = colsum(dout) is onednn_elem.c's loop: threads
 *     split the columns in chunks of 256 and each chunk sums the rows in order, so db does not
 *     depend on the thread count and is backend_cpu's bits; in bf16 the same pass writes dout's
 *     bf16 transposed, the dense (OC, N) dout^T that the product takes without a copy of its own,
 *     and inp's bf16 goes straight into the blocked layout the primitive picks for its weights
 *     operand when that is AMX's 16a64b2a (wgrad-layout=1), which the kernel otherwise copies a
 *     plain operand into at every call.
 *   attention_gqa_fwd / attention_gqa_bwd: fp32: G = NH/NKV batched 4-D matmuls over the
 *     (B, NKV) pairs (one per query head of a group), on strided views of the fused qkv (B, T,
 *     (NH + 2 NKV) HS); dk and dv accumulate over the group's query heads in ascending order
 *     through the sum post-op (GPT-2's NKV == NH: one batched matmul per product over (B, NH)).
 *     bf16: the conversion writes q, k and v (and dy) head-major into dense (B, H, T, HS)
 *     copies, and every product runs on dense operands, which oneDNN's brgemm kernels (AMX's
 *     among them) take, where the strided views went to gemm:jit at half the speed; a kv
 *     head's G query heads are one product (rows j T + t), so their gradient sums lie inside
 *     its inner dimension; dq, dk, dv come out dense and are put back into dqkv's heads. The
 *     causal softmax and its backward are fp32 loops of our own, parallel over rows (each
 *     row's arithmetic fixed, so thread-count independent); the products are full T x T.
 *   LayerNorm, GELU, cross-entropy, AdamW, sumsq: onednn_ops.c's vector loops (GELU through a
 *     sigmoid in bf16). Encoder, residual, add, scale: onednn_elem.c's (backend_cpu's bits).
 *     RMSNorm, SwiGLU: onednn_llama.c's in bf16, backend_cpu's in fp32.
 *   alloc, free, from_host, copy, zero, map, unmap, scale and AdamW: the CPU backend's (or the
 *     vector loops), each telling the weight cache (onednn_wcache.c) what it writes.
 *   everything else (RoPE, the decode matmul and KV-cache attention, to_host, synchronize) is
 *     not in this backend's table: the registry fills it with backend_cpu's (host memory in
 *     both), and its failures report into the same message (backend_host.c), which is this
 *     backend's error().
 * Two tables: backend_onednn (--backend onednn) and backend_onednn_auto (--backend auto's, for
 *   bf16: fp32 products where onednn_bf16_products_fast says bf16 ones would be slower;
 *   onednn_auto.h), the same ops.
 * bf16: the two inputs of every product are converted fp32 -> bf16 (round to nearest even,
 *   AVX512-BF16 VCVTNEPS2BF16 when the CPU has it, an equivalent scalar loop otherwise) into
 *   scratch owned by this file, on every call; except the weights of matmul_fwd and
 *   matmul_bwd_input, whose bf16 copies onednn_wcache.c keeps from one update to the next
 *   (weight-cache=1, the default): one conversion per optimizer step instead of two per
 *   micro-batch, with the same bits. Softmax, its backward, bias, and all accumulation stay fp32.
 * Primitives are created once per (shapes, strides, data type, post-ops, scale, threads) and
 *   kept in a small table (MM_CACHE entries, round-robin replacement). Each one made is
 *   counted by its label and the implementation oneDNN chose (impl-report=1 prints them as
 *   they are made, with a WARNING for a bf16 product off the brgemm kernels; the tests read
 *   the table and the count of bf16 products made on operands that are not dense).
 * Determinism: same inputs and thread count give bit-identical outputs (oneDNN's matmuls use a
 *   fixed partition for a given primitive and thread count; tests/unit/test_onednn.c checks it).
 *   Only db and the softmax loops are thread-count independent by construction.
 * Not thread-safe: one caller thread (the rank's) at a time, as every backend here.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DN_HAVE_X86 1
#endif
#include <dnnl.h>
#include <dnnl_debug.h>
#include "pipelm/backend.h"
#include "backend/backend_host.h"
#include "backend/cpu/cpu_attention.h"
#include "pipelm/backend_math.h"
#include "util/common.h"
#include "backend/onednn/onednn_auto.h"
#include "backend/onednn/onednn_elem.h"
#include "backend/onednn/onednn_llama.h"
#include "backend/onednn/onednn_ops.h"
#include "backend/onednn/onednn_wcache.h"

#define MM_CACHE 64
#define MAXD 4

/* ---------------------------------------------------------------------------------------- */
/* state and errors */

/* Failures go through backend_host.c's message, which the ops taken from the CPU backend
 * report into as well: error() is the last failure of either. */
#define dn_fail host_fail

/* A failed oneDNN call: its status name and number, the call, and what we were doing. */
#define DN_CHECK(call, what)                                                                   \
    do {                                                                                       \
        dnnl_status_t dn_s_ = (call);                                                          \
        if (dn_s_ != dnnl_success)                                                             \
            return dn_fail(PL_EBACKEND, "oneDNN: %s: %s failed: %s (status %d)", (what), #call, \
                           dnnl_status2str(dn_s_), (int)dn_s_);                               \
    } while (0)

/* A matmul of the cache: its description (the key) and what was built from it. */
typedef struct {
    int nd;         /* 2 or 4 */
    int dt;         /* dnnl_f32 or dnnl_bf16: the two inputs; dst and bias are f32 */
    int sum;        /* 1: dst += product (sum post-op) */
    int bias;       /* 1: bias (1 x N) f32 */
    int threads;    /* OpenMP threads the primitive was made for */
    float scale;    /* output scale (1 = none) */
    int bvnni;      /* 1: B (the weights operand) in the layout oneDNN picks, when it is 16a64b2a */
    int bany;       /* 1: B in whatever layout oneDNN picks (a weight's kept copy, made by a reorder) */
    int64_t ad[MAXD], as[MAXD], bd[MAXD], bs[MAXD], cd[MAXD], cs[MAXD];
} mm_key;

typedef struct {
    int used;
    mm_key key;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    dnnl_memory_t mem[4]; /* src, weights, dst, bias */
    int vnni;             /* B is in the 16a64b2a layout (key.bvnni and oneDNN chose it) */
    int64_t vsk, vsn;     /* its strides of the row and column blocks */
    size_t vbytes;        /* its size, padding included */
    int blocked;          /* key.bany and oneDNN chose a layout other than the key's plain strides */
    int wkind;            /* then: the weight cache's kind of that layout (1 + 2 x its index in S.wmd) */
} mm_entry;

/* A product made, by its label (op, precision, shapes) and the implementation oneDNN chose. */
#define MAX_IMPLS 512
typedef struct {
    char what[112];
    char impl[48];
    int dense;   /* every operand dense (a permutation of a plain layout) */
    long made;   /* primitives created with this label and implementation */
} impl_use;

static struct {
    int inited;
    dnnl_engine_t eng;
    dnnl_stream_t st;
    int prec;
    int threads;
    int native_bf16;       /* the CPU converts with VCVTNEPS2BF16 */
    int wcache;            /* bf16 weight copies kept between updates (onednn_wcache.h) */
    int wgrad_vnni;        /* bf16 weight gradient: the activation in oneDNN's blocked layout */
    char impl[112];        /* matmul implementations of the probe products, for describe */
    char auto_note[96];    /* --backend auto's choice for bf16 and its reason ("" when not auto) */
    mm_entry cache[MM_CACHE];
    int next_victim;
    long created;          /* primitives created (tests, diagnostics) */
    long nondense;         /* of them, bf16 ones with an operand that is not dense (tests) */
    long vnni;             /* weight-gradient products on an activation in the 16a64b2a layout (tests) */
    long wblocked;         /* products on weights in a blocked layout, kept or reordered now (tests) */
    int wlayout;           /* bf16 weights kept in the layout each product picks (weight-layout=1) */
    dnnl_memory_desc_t wmd[32]; /* the blocked weights layouts seen, for the cache's kinds */
    int nwmd;
    int impl_report;       /* --backend-opt impl-report=1: print each new impls[] entry */
    impl_use impls[MAX_IMPLS];
    int nimpls;
    /* scratch: bf16 copies and fp32 temporaries, grown on demand, freed by finalize */
    void *scr[5];
    size_t scr_bytes[5];
} S;

enum { SCR_A = 0, SCR_B = 1, SCR_C = 2, SCR_F = 3, SCR_D = 4 };

/* Scratch slot k of at least `bytes` (64-byte aligned). */
static int scratch(int k, size_t bytes, void **p) {
    if (bytes == 0) bytes = 64;
    if (S.scr_bytes[k] < bytes) {
        free(S.scr[k]);
        S.scr[k] = NULL;
        S.scr_bytes[k] = 0;
        if (bytes > SIZE_MAX - 64)
            return dn_fail(PL_ENOMEM, "oneDNN backend: scratch of %zu bytes: too large", bytes);
        size_t r = (bytes + 63) / 64 * 64;
        S.scr[k] = aligned_alloc(64, r);
        if (!S.scr[k]) return dn_fail(PL_ENOMEM, "oneDNN backend: out of memory for %zu bytes of scratch", bytes);
        S.scr_bytes[k] = r;
    }
    *p = S.scr[k];
    return 0;
}

static int cur_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* ---------------------------------------------------------------------------------------- */
/* fp32 -> bf16, round to nearest even */

static void cvt_scalar(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
}

#ifdef DN_HAVE_X86
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
static void cvt_avx512(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 lo = _mm512_loadu_ps(src + i), hi = _mm512_loadu_ps(src + i + 16);
        __m512bh y = _mm512_cvtne2ps_pbh(hi, lo);
        _mm512_storeu_si512((void *)(dst + i), (__m512i)y);
    }
    for (; i + 16 <= n; i += 16) {
        __m256bh y = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
        _mm256_storeu_si256((__m256i *)(dst + i), (__m256i)y);
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        __m256bh y = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
        _mm256_mask_storeu_epi16(dst + i, m, (__m256i)y);
    }
}
#endif

/* Exported for tests/unit/test_onednn.c only (not part of backend.h): convert n values, in
 * parallel over fixed chunks; force_scalar = 1 takes the portable loop. */
void onednn_cvt_bf16(uint16_t *dst, const float *src, size_t n, int force_scalar);
void onednn_cvt_bf16(uint16_t *dst, const float *src, size_t n, int force_scalar) {
    const size_t chunk = 1 << 15;
    size_t nchunk = (n + chunk - 1) / chunk;
    int vec = 0;
#ifdef DN_HAVE_X86
    vec = !force_scalar && __builtin_cpu_supports("avx512bf16");
#else
    (void)force_scalar;
#endif
    #pragma omp parallel for schedule(static) if (nchunk > 1)
    for (size_t k = 0; k < nchunk; k++) {
        size_t i0 = k * chunk, m = i0 + chunk < n ? chunk : n - i0;
#ifdef DN_HAVE_X86
        if (vec) { cvt_avx512(dst + i0, src + i0, m); continue; }
#endif
        cvt_scalar(dst + i0, src + i0, m);
    }
    (void)vec;
}

/* bf16 copy of n floats in scratch slot k. */
static int to_bf16(int k, const float *src, size_t n, const void **out) {
    void *p = NULL;
    PL_TRY(scratch(k, n * sizeof(uint16_t), &p));
    onednn_cvt_bf16(p, src, n, 0);
    *out = p;
    return 0;
}

/* The weight cache's converter: onednn_cvt_bf16's rounding, so a kept copy has the bits a
 * per-call conversion would have. */
static void cvt_for_cache(uint16_t *dst, const float *src, size_t n) { onednn_cvt_bf16(dst, src, n, 0); }

/* bf16 of the weights w (n floats): the copy kept since w last changed (onednn_wcache.h), or
 * converted now into scratch slot k when w is not a weight range the cache knows. */
static int weight_bf16(int k, const float *w, size_t n, const void **out) {
    const uint16_t *c = NULL;
    wcache_get(w, n, &c);
    if (c) {
        *out = c;
        return 0;
    }
    return to_bf16(k, w, n, out);
}

/* ---------------------------------------------------------------------------------------- */
/* matmul primitives, cached */

static void entry_destroy(mm_entry *e) {
    for (int i = 0; i < 4; i++)
        if (e->mem[i]) dnnl_memory_destroy(e->mem[i]);
    if (e->prim) dnnl_primitive_destroy(e->prim);
    if (e->pd) dnnl_primitive_desc_destroy(e->pd);
    memset(e, 0, sizeof *e);
}

static void cache_clear(void) {
    for (int i = 0; i < MM_CACHE; i++)
        if (S.cache[i].used) entry_destroy(&S.cache[i]);
    S.next_victim = 0;
}

/* fp32 2-D products whose weights (B) are row-major, i.e. dinp = dout W and dW += dout^T inp:
 * oneDNN 2.6 ranks brg:avx512_core first, but measured here (one thread, N = 1024) it falls to
 * 40-50 GFLOP/s on 1024x768x3072 and 768x1024x3072 where gemm:jit runs 130-145, and is ~10%
 * slower than gemm:jit on the other shapes tried; so gemm:jit is taken when offered. The
 * choice depends on the shape only, never on a timing, so every run makes the same one. bf16
 * keeps oneDNN's order (its first choice is the AMX kernel where there is AMX). */
static int prefer_gemm_jit(const mm_key *k) { return k->dt == dnnl_f32 && k->nd == 2 && k->bs[1] == 1; }

/* The first implementation oneDNN offers for md/attr, or gemm:jit if offered and preferred. */
static dnnl_status_t pick_pd(dnnl_primitive_desc_t *pd, const dnnl_matmul_desc_t *md, const_dnnl_primitive_attr_t attr,
                             int prefer_jit) {
    if (!prefer_jit) return dnnl_primitive_desc_create(pd, md, attr, S.eng, NULL);
    dnnl_primitive_desc_iterator_t it;
    dnnl_status_t s = dnnl_primitive_desc_iterator_create(&it, md, attr, S.eng, NULL);
    if (s != dnnl_success) return s;
    dnnl_primitive_desc_t first = NULL, pick = NULL;
    do {
        dnnl_primitive_desc_t p = dnnl_primitive_desc_iterator_fetch(it);
        if (!p) break;
        const char *impl = NULL;
        if (dnnl_primitive_desc_query(p, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl &&
            strcmp(impl, "gemm:jit") == 0) {
            pick = p;
            break;
        }
        if (!first) first = p;
        else dnnl_primitive_desc_destroy(p);
    } while (dnnl_primitive_desc_iterator_next(it) == dnnl_success);
    dnnl_primitive_desc_iterator_destroy(it);
    if (pick) {
        if (first) dnnl_primitive_desc_destroy(first);
        *pd = pick;
    } else if (first) *pd = first;
    else return dnnl_unimplemented;
    return dnnl_success;
}

/* Build the primitive descriptor of k (no primitive): also used to name the kernel. */
static int make_pd(const mm_key *k, dnnl_primitive_desc_t *pd, const char *what) {
    dnnl_memory_desc_t a, b, c, bias;
    dnnl_data_type_t dt = (dnnl_data_type_t)k->dt;
    /* the API takes full dnnl_dims_t arrays (DNNL_MAX_NDIMS) */
    dnnl_dims_t ad = {0}, as = {0}, bd = {0}, bs = {0}, cd = {0}, cs = {0};
    for (int i = 0; i < k->nd; i++) {
        ad[i] = k->ad[i]; as[i] = k->as[i];
        bd[i] = k->bd[i]; bs[i] = k->bs[i];
        cd[i] = k->cd[i]; cs[i] = k->cs[i];
    }
    DN_CHECK(dnnl_memory_desc_init_by_strides(&a, k->nd, ad, dt, as), what);
    if (k->bvnni || k->bany) DN_CHECK(dnnl_memory_desc_init_by_tag(&b, k->nd, bd, dt, dnnl_format_tag_any), what);
    else DN_CHECK(dnnl_memory_desc_init_by_strides(&b, k->nd, bd, dt, bs), what);
    DN_CHECK(dnnl_memory_desc_init_by_strides(&c, k->nd, cd, dnnl_f32, cs), what);
    if (k->bias) { /* (1, ..., 1, N), dense */
        dnnl_dims_t bbd = {0}, bbs = {0};
        for (int i = 0; i < k->nd; i++) { bbd[i] = 1; bbs[i] = k->cd[k->nd - 1]; }
        bbd[k->nd - 1] = k->cd[k->nd - 1];
        bbs[k->nd - 1] = 1;
        DN_CHECK(dnnl_memory_desc_init_by_strides(&bias, k->nd, bbd, dnnl_f32, bbs), what);
    }
    dnnl_matmul_desc_t md;
    DN_CHECK(dnnl_matmul_desc_init(&md, &a, &b, k->bias ? &bias : NULL, &c), what);
    dnnl_primitive_attr_t attr;
    DN_CHECK(dnnl_primitive_attr_create(&attr), what);
    dnnl_status_t s = dnnl_success;
    if (k->scale != 1.0f) s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->scale);
    if (s == dnnl_success && k->sum) {
        dnnl_post_ops_t po;
        s = dnnl_post_ops_create(&po);
        if (s == dnnl_success) {
            s = dnnl_post_ops_append_sum(po, 1.0f);
            if (s == dnnl_success) s = dnnl_primitive_attr_set_post_ops(attr, po);
            dnnl_post_ops_destroy(po);
        }
    }
    if (s == dnnl_success) s = pick_pd(pd, &md, attr, prefer_gemm_jit(k));
    dnnl_primitive_attr_destroy(attr);
    DN_CHECK(s, what);
    return 0;
}

/* Whether the nd-D view (dims d, strides st) is dense: some order of its dims lays it out with
 * no gaps (row-major, transposed, or a plain layout with two dims swapped; dims of 1 do not
 * count). oneDNN 2.6's brgemm matmul (AMX included) takes only those; a sub-block or a view
 * into a wider row (the fused qkv's heads) sends the product to gemm:jit. */
static int view_dense(int nd, const int64_t *d, const int64_t *st) {
    int used[MAXD] = {0};
    int64_t want = 1;
    for (int n = 0; n < nd; n++) { /* the dim with stride `want` is the next one out */
        int f = -1;
        for (int i = 0; i < nd && f < 0; i++)
            if (!used[i] && (d[i] == 1 || st[i] == want)) f = i;
        if (f < 0) return 0;
        used[f] = 1;
        want *= d[f];
    }
    return 1;
}
static int key_dense(const mm_key *k) {
    return view_dense(k->nd, k->ad, k->as) && view_dense(k->nd, k->bd, k->bs) && view_dense(k->nd, k->cd, k->cs);
}

/* bf16 on anything but oneDNN's brgemm kernels (gemm:jit, ref) is the slow path. */
static int impl_fallback(const char *impl) { return strncmp(impl, "brg:", 4) != 0; }

/* impl-report=1: each new (label, implementation) as it is made, to stderr, a fallback of a
 * bf16 product flagged. */
static void impl_print(const impl_use *u, int bf) {
    fprintf(stderr, "onednn: impl %s: %s%s\n", u->what, u->impl, u->dense ? "" : " (operands not dense)");
    if (bf && impl_fallback(u->impl))
        fprintf(stderr, "onednn: WARNING: bf16 product on a fallback implementation: %s: %s\n", u->what, u->impl);
}

/* The product e was made: its label and implementation counted (the report, the tests). */
static void impl_record(const mm_entry *e, const char *what) {
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(e->pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl) impl = "?";
    int dense = key_dense(&e->key);
    if (e->key.dt == dnnl_bf16 && !dense) S.nondense++;
    for (int i = 0; i < S.nimpls; i++)
        if (strcmp(S.impls[i].what, what) == 0 && strcmp(S.impls[i].impl, impl) == 0) {
            S.impls[i].made++;
            return;
        }
    if (S.nimpls == MAX_IMPLS) return; /* the report names the first ones */
    impl_use *u = &S.impls[S.nimpls++];
    snprintf(u->what, sizeof u->what, "%s", what);
    snprintf(u->impl, sizeof u->impl, "%s", impl);
    u->dense = dense;
    u->made = 1;
    if (S.impl_report) impl_print(u, e->key.dt == dnnl_bf16);
}

/* Whether the weights of pd are oneDNN's 16a64b2a layout of a 2-D (K, N) operand (AMX's bf16
 * brgemm takes it as it is; other kernels pick other layouts or a plain one), and its strides
 * and size. */
static int weights_vnni(const_dnnl_primitive_desc_t pd, int64_t *sk, int64_t *sn, size_t *bytes) {
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    if (!md || md->ndims != 2 || md->format_kind != dnnl_blocked || md->data_type != dnnl_bf16) return 0;
    const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
    if (b->inner_nblks != 3 || b->inner_blks[0] != 16 || b->inner_idxs[0] != 0 || b->inner_blks[1] != 64 ||
        b->inner_idxs[1] != 1 || b->inner_blks[2] != 2 || b->inner_idxs[2] != 0 || md->offset0 != 0)
        return 0;
    *sk = b->strides[0];
    *sn = b->strides[1];
    *bytes = dnnl_memory_desc_get_size(md);
    return 1;
}

/* With bany: whether oneDNN chose a layout other than the key's plain one for the weights, its
 * size, and the weight cache's kind for it (one per layout and per view, the forward's W^T and
 * the input gradient's W: the same layout of other values); a layout past the table's room
 * goes back to the plain strides. */
static int weights_layout(mm_entry *e, const char *what) {
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(e->pd, dnnl_query_weights_md, 0);
    dnnl_memory_desc_t plain;
    dnnl_dims_t bd = {0}, bs = {0};
    for (int i = 0; i < e->key.nd; i++) { bd[i] = e->key.bd[i]; bs[i] = e->key.bs[i]; }
    DN_CHECK(dnnl_memory_desc_init_by_strides(&plain, e->key.nd, bd, dnnl_bf16, bs), what);
    if (!md || dnnl_memory_desc_equal(md, &plain)) return 0;
    int i = 0;
    while (i < S.nwmd && !dnnl_memory_desc_equal(md, &S.wmd[i])) i++;
    if (i == S.nwmd && i < (int)(sizeof S.wmd / sizeof S.wmd[0])) S.wmd[S.nwmd++] = *md;
    if (i < S.nwmd) {
        e->blocked = 1;
        e->wkind = 1 + 2 * i + (e->key.bs[0] == 1); /* bs[0] == 1: the forward's W^T view */
        e->vbytes = dnnl_memory_desc_get_size(md);
        return 0;
    }
    dnnl_primitive_desc_destroy(e->pd);
    e->pd = NULL;
    mm_key k = e->key;
    k.bany = 0;
    return make_pd(&k, &e->pd, what);
}

/* The descriptor of k: with bvnni, the weights in oneDNN's layout if it is 16a64b2a, else
 * (another CPU, another kernel) the plain strides of the key after all. */
static int make_entry_pd(mm_entry *e, const char *what) {
    PL_TRY(make_pd(&e->key, &e->pd, what));
    if (e->key.bany) return weights_layout(e, what);
    if (!e->key.bvnni) return 0;
    e->vnni = weights_vnni(e->pd, &e->vsk, &e->vsn, &e->vbytes);
    if (e->vnni) return 0;
    dnnl_primitive_desc_destroy(e->pd);
    e->pd = NULL;
    mm_key plain = e->key;
    plain.bvnni = 0;
    return make_pd(&plain, &e->pd, what);
}

static int get_primitive(const mm_key *k, mm_entry **out, const char *what) {
    for (int i = 0; i < MM_CACHE; i++)
        if (S.cache[i].used && memcmp(&S.cache[i].key, k, sizeof *k) == 0) {
            *out = &S.cache[i];
            return 0;
        }
    mm_entry *e = &S.cache[S.next_victim];
    S.next_victim = (S.next_victim + 1) % MM_CACHE;
    if (e->used) entry_destroy(e);
    e->key = *k;
    int rc = make_entry_pd(e, what);
    if (rc) { e->pd = NULL; entry_destroy(e); return rc; }
    dnnl_status_t s = dnnl_primitive_create(&e->prim, e->pd);
    for (int i = 0; s == dnnl_success && i < (k->bias ? 4 : 3); i++) {
        static const dnnl_query_t q[4] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md,
                                          dnnl_query_weights_md};
        const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(e->pd, q[i], i == 3 ? 1 : 0);
        s = md ? dnnl_memory_create(&e->mem[i], md, S.eng, DNNL_MEMORY_NONE) : dnnl_invalid_arguments;
    }
    if (s != dnnl_success) {
        entry_destroy(e);
        DN_CHECK(s, what);
    }
    e->used = 1;
    S.created++;
    impl_record(e, what);
    *out = e;
    return 0;
}

/* Run the product of k on A, B -> C (+ bias). */
static int mm_run(const mm_key *k, const void *A, const void *B, float *C, const float *bias,
                  const char *what) {
    mm_entry *e = NULL;
    PL_TRY(get_primitive(k, &e, what));
    DN_CHECK(dnnl_memory_set_data_handle_v2(e->mem[0], (void *)A, S.st), what);
    DN_CHECK(dnnl_memory_set_data_handle_v2(e->mem[1], (void *)B, S.st), what);
    DN_CHECK(dnnl_memory_set_data_handle_v2(e->mem[2], C, S.st), what);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->mem[0]}, {DNNL_ARG_WEIGHTS, e->mem[1]}, {DNNL_ARG_DST, e->mem[2]}};
    int nargs = 3;
    if (k->bias) {
        DN_CHECK(dnnl_memory_set_data_handle_v2(e->mem[3], (void *)bias, S.st), what);
        args[3].arg = DNNL_ARG_BIAS;
        args[3].memory = e->mem[3];
        nargs = 4;
    }
    DN_CHECK(dnnl_primitive_execute(e->prim, S.st, nargs, args), what);
    DN_CHECK(dnnl_stream_wait(S.st), what);
    return 0;
}

static void key_init(mm_key *k, int nd, int bf16, int sum, int bias, float scale) {
    memset(k, 0, sizeof *k);
    k->nd = nd;
    k->dt = bf16 ? dnnl_bf16 : dnnl_f32;
    k->sum = sum;
    k->bias = bias;
    k->scale = scale;
    k->threads = cur_threads();
}

/* 2-D: C(M,N) = A(M,K) B(K,N), A element (m,k) at m*sam + k*sak, B (k,n) at k*sbk + n*sbn,
 * C row-major with leading dimension ldc. */
static void key_2d(mm_key *k, int64_t M, int64_t K, int64_t N, int64_t sam, int64_t sak, int64_t sbk,
                   int64_t sbn, int64_t ldc) {
    k->ad[0] = M; k->ad[1] = K; k->as[0] = sam; k->as[1] = sak;
    k->bd[0] = K; k->bd[1] = N; k->bs[0] = sbk; k->bs[1] = sbn;
    k->cd[0] = M; k->cd[1] = N; k->cs[0] = ldc; k->cs[1] = 1;
}

/* ---------------------------------------------------------------------------------------- */
/* init, describe, threads */

static const char *isa_name(dnnl_cpu_isa_t isa) {
    switch ((int)isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
    }
}

/* Native bf16 products: AVX512-BF16 (or AMX, which includes it) in the effective ISA. */
static int isa_has_bf16(dnnl_cpu_isa_t isa) {
    return ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) == (unsigned)dnnl_cpu_isa_avx512_core_bf16;
}

static int dn_set_threads(int n) {
    if (n < 1) n = 1;
    S.threads = n;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    int rc = backend_cpu.set_threads(n); /* OpenMP and OpenBLAS for the delegated ops */
    if (rc) return dn_fail(rc, "cpu backend set_threads: %s", backend_cpu.error());
    return 0;
}
static int dn_get_threads(void) { return S.threads > 0 ? S.threads : cur_threads(); }

/* The kernel chosen for a typical 1024 x 768 x 768 product in precision prec, in the forward
 * layout (weights transposed) and the backward one (weights row-major): "X" or "fwd X, bwd Y". */
static int probe_impl(int prec, char *buf, size_t len) {
    char name[2][48];
    for (int i = 0; i < 2; i++) {
        mm_key k;
        key_init(&k, 2, prec == PL_PREC_BF16, 0, i == 0, 1.0f);
        if (i == 0) key_2d(&k, 1024, 768, 768, 768, 1, 1, 768, 768);
        else key_2d(&k, 1024, 768, 768, 768, 1, 768, 1, 768);
        dnnl_primitive_desc_t pd;
        PL_TRY(make_pd(&k, &pd, "probe matmul"));
        const char *impl = NULL;
        dnnl_status_t s = dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
        snprintf(name[i], sizeof name[i], "%s", s == dnnl_success && impl ? impl : "?");
        dnnl_primitive_desc_destroy(pd);
    }
    if (strcmp(name[0], name[1]) == 0) snprintf(buf, len, "%s", name[0]);
    else snprintf(buf, len, "fwd %s, bwd %s", name[0], name[1]);
    return 0;
}

static void dn_finalize(void) {
    cache_clear();
    wcache_clear();
    S.nimpls = 0;
    S.nondense = 0;
    S.nwmd = 0;
    for (int i = 0; i < 5; i++) { free(S.scr[i]); S.scr[i] = NULL; S.scr_bytes[i] = 0; }
    if (S.st) dnnl_stream_destroy(S.st);
    if (S.eng) dnnl_engine_destroy(S.eng);
    S.st = NULL;
    S.eng = NULL;
    S.inited = 0;
    backend_cpu.finalize();
}

/* The settings of this backend (--backend-opt). */
static const backend_opt_decl dn_opts[] = {
    {"allow-emulated", "1: run --precision bf16 on a CPU without native bf16 (emulated, slower than fp32)", "0",
     "0|1", "PIPELM_ONEDNN_ALLOW_EMULATED"},
    {"vec-ops", "1: the backend's AVX-512 LayerNorm, GELU, softmax, loss, AdamW, residual, embedding and bias sums "
     "(RMSNorm, SwiGLU in bf16) where the CPU has AVX-512; 0: the CPU backend's loops (the former bits)", "1", "0|1",
     NULL},
    {"impl-report", "1: print each matmul oneDNN makes (op, precision, shapes) with the implementation it chose, "
     "to stderr as it is made, and a WARNING for a bf16 product off the brgemm kernels (a fallback)", "0", "0|1",
     NULL},
    {"weight-cache", "1: in bf16 each weight's bf16 copy is made once after it changes (AdamW, a load) and kept "
     "for every product until then; 0: converted on every product (the same bits, slower)", "1", "0|1", NULL},
    {"attention", "tiled: fused causal attention keeping the output and the row log-sum-exp (O(T) memory; the CPU "
     "backend's tiled kernels, in bf16 with bf16 inputs to every product) wherever T exceeds the head size; full: "
     "the (T, T) probabilities through oneDNN's products (the reference); auto: in fp32 tiled from T = 256, in bf16 "
     "full (bench/attention_cpu.sh: fp32 tiled 1.07x at T = 256, 1.7x at 1024; bf16 tiled, on fp32 products, 0.65x "
     "of the AMX products at 1024)",
     "auto", "auto|tiled|full", "PIPELM_ONEDNN_ATTENTION"},
    {"weight-layout", "1: in bf16 each weight's kept copy (weight-cache=1) is in the layout each product's "
     "oneDNN kernel picks (AMX: blocked), made by a reorder once per update (pays with several micro-batches); "
     "0: plain rows, which the kernel copies into its layout at every call", "0", "0|1", NULL},
    {"wgrad-layout", "1: in bf16 the weight gradient's activation is converted straight into the blocked layout "
     "oneDNN's AMX kernel multiplies (where it picks that layout); 0: plain rows, which the kernel copies into it "
     "at every call", "1", "0|1", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* attention=: tiled (cpu_attention.c's kernels), the (T, T) path, or auto (DN_ATT_AUTO_MIN_T). */
enum { DN_ATT_FULL, DN_ATT_TILED, DN_ATT_AUTO };
static int dn_att_mode = DN_ATT_AUTO;
/* attention=auto's smallest T for the tiled path in fp32 (bf16 stays on the full path, whose
 * AMX products the tiled kernels' fp32 products do not match). */
#define DN_ATT_AUTO_MIN_T 256

/* Whether attention of T tokens, head size HS runs tiled (only where its HS + 1 floats per
 * token and head are fewer than the T probabilities). */
static int dn_tiled_for(int T, int HS) {
    if (T <= HS || dn_att_mode == DN_ATT_FULL) return 0;
    return dn_att_mode == DN_ATT_TILED || (S.prec == PL_PREC_FP32 && T >= DN_ATT_AUTO_MIN_T);
}

/* backend.h's attention_cols. */
static int dn_attention_cols(int B, int T, int NH, int HS) {
    (void)B;
    (void)NH;
    return dn_tiled_for(T, HS) ? HS + 1 : T;
}

/* Engine and stream once; precision checked against the CPU each time. May be called again
 * (a new precision or thread count); the primitives already made stay valid (their key holds
 * data type and threads). */
static int dn_init(const backend_options *opt, char *err, size_t errlen) {
    int prec = opt ? opt->precision : PL_PREC_FP32;
    if (prec != PL_PREC_FP32 && prec != PL_PREC_BF16) {
        snprintf(err, errlen, "backend onednn: unknown precision %d (fp32 or bf16)", prec);
        return PL_EINVAL;
    }
    if (!S.eng) {
        dnnl_status_t s = dnnl_engine_create(&S.eng, dnnl_cpu, 0);
        if (s == dnnl_success) s = dnnl_stream_create(&S.st, S.eng, dnnl_stream_default_flags);
        if (s != dnnl_success) {
            snprintf(err, errlen, "oneDNN: cannot create the CPU engine and stream: %s (status %d)",
                     dnnl_status2str(s), (int)s);
            if (S.eng) dnnl_engine_destroy(S.eng);
            S.eng = NULL;
            S.st = NULL;
            return PL_EBACKEND;
        }
    }
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    if (prec == PL_PREC_BF16 && !isa_has_bf16(isa)) {
        if (!backend_opt_flag(dn_opts, opt, "allow-emulated")) {
            snprintf(err, errlen,
                     "backend onednn: --precision bf16: this CPU has no native bf16 support (needs AVX512-BF16 "
                     "or AMX-BF16; oneDNN's effective ISA here is %s, where bf16 would be emulated, slower "
                     "than fp32; --backend-opt allow-emulated=1, or PIPELM_ONEDNN_ALLOW_EMULATED=1, allows it)",
                     isa_name(isa));
            return PL_EBACKEND;
        }
    }
    backend_options co = {PL_PREC_FP32, opt ? opt->threads : 0, -1, 0, 0, NULL};
    int rc = backend_cpu.init(&co, err, errlen);
    if (rc) return rc;
    rc = dn_set_threads(opt && opt->threads > 0 ? opt->threads : cur_threads());
    if (rc) { snprintf(err, errlen, "%s", host_error()); return rc; }
    S.prec = prec;
    onednn_ops_select(backend_opt_flag(dn_opts, opt, "vec-ops"));
    onednn_ops_bf16(prec == PL_PREC_BF16);
    S.wcache = prec == PL_PREC_BF16 && backend_opt_flag(dn_opts, opt, "weight-cache");
    S.impl_report = backend_opt_flag(dn_opts, opt, "impl-report");
    char att[16];
    backend_opt_get(dn_opts, opt, "attention", att, sizeof att);
    dn_att_mode = strcmp(att, "tiled") == 0 ? DN_ATT_TILED : strcmp(att, "full") == 0 ? DN_ATT_FULL : DN_ATT_AUTO;
    S.wgrad_vnni = backend_opt_flag(dn_opts, opt, "wgrad-layout");
    S.wlayout = backend_opt_flag(dn_opts, opt, "weight-layout");
    wcache_enable(S.wcache, cvt_for_cache);
    rc = probe_impl(prec, S.impl, sizeof S.impl);
    if (rc) {
        snprintf(err, errlen, "backend onednn: %s matmul unavailable: %s", backend_precision_name(prec), host_error());
        return rc;
    }
#ifdef DN_HAVE_X86
    S.native_bf16 = __builtin_cpu_supports("avx512bf16") != 0;
#endif
    S.inited = 1;
    host_fail(0, "%s", ""); /* no failure yet */
    return 0;
}

static int dn_init_plain(const backend_options *opt, char *err, size_t errlen) {
    S.auto_note[0] = 0;
    return dn_init(opt, err, errlen);
}

/* --backend auto's init: for bf16, real bf16 products when onednn_bf16_products_fast says they
 * win here, else this backend's fp32 path (the products and every other op as in fp32); the
 * choice and its reason go on the describe line. */
static int dn_init_auto(const backend_options *opt, char *err, size_t errlen) {
    if (!opt || opt->precision != PL_PREC_BF16) return dn_init_plain(opt, err, errlen);
    char why[64];
    int fast = onednn_bf16_products_fast(why, sizeof why);
    if (fast < 0) return dn_init_plain(opt, err, errlen); /* no native bf16: refused as --backend onednn is */
    backend_options o = *opt;
    if (!fast) o.precision = PL_PREC_FP32;
    int rc = dn_init(&o, err, errlen);
    snprintf(S.auto_note, sizeof S.auto_note, "auto: %s products (%s)", fast ? "bf16" : "fp32", why);
    return rc;
}

static void dn_describe(char *buf, size_t len) {
    const dnnl_version_t *v = dnnl_version();
    if (!S.inited) {
        snprintf(buf, len, "onednn: oneDNN %d.%d.%d (not initialised)", v->major, v->minor, v->patch);
        return;
    }
    /* "<name>: library, kernel, precision" as backend_cpu's line */
    int bf = S.prec == PL_PREC_BF16;
    static const char *const att[] = {"full", "tiled", "auto"};
    snprintf(buf, len, "onednn: oneDNN %d.%d.%d, ISA %s, matmul %s, %s%s%s, %s, attention %s%s%s", v->major,
             v->minor, v->patch, isa_name(dnnl_get_effective_cpu_isa()), S.impl, backend_precision_name(S.prec),
             bf ? (S.native_bf16 ? " (inputs converted with avx512_bf16" : " (inputs converted by a scalar loop") : "",
             bf ? (S.wcache ? ", weights once per update)" : ", weights on every product)") : "",
             onednn_ops_active() ? "other ops avx512" : "other ops the cpu backend's", att[dn_att_mode],
             S.auto_note[0] ? "; " : "", S.auto_note);
}

/* The verdict of onednn_auto.h: by ISA and vendor (a timing could differ between ranks). */
int onednn_bf16_products_fast(char *why, size_t len) {
    const char *e = getenv("PIPELM_ONEDNN_BF16_FAST");
    if (e && (strcmp(e, "0") == 0 || strcmp(e, "1") == 0)) {
        snprintf(why, len, "PIPELM_ONEDNN_BF16_FAST=%s", e);
        return e[0] == '1';
    }
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    if (((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_amx) == (unsigned)dnnl_cpu_isa_avx512_core_amx) {
        snprintf(why, len, "AMX-BF16 tiles");
        return 1;
    }
    if (!isa_has_bf16(isa)) {
        snprintf(why, len, "no native bf16 (ISA %s)", isa_name(isa));
        return -1;
    }
#ifdef DN_HAVE_X86
    if (__builtin_cpu_is("amd")) {
        snprintf(why, len, "AMD AVX512-BF16: 2x the fp32 FMA rate");
        return 1;
    }
    if (__builtin_cpu_is("intel")) {
        snprintf(why, len, "Intel AVX512-BF16 without AMX: the fp32 FMA rate");
        return 0;
    }
#endif
    snprintf(why, len, "native bf16, CPU vendor not known");
    return 1;
}

#define NEED_INIT(what)                                                                        \
    do {                                                                                       \
        if (!S.inited) return dn_fail(PL_EBACKEND, "oneDNN backend: %s before init", (what)); \
    } while (0)

/* ---------------------------------------------------------------------------------------- */
/* matmuls */

static int bad_shape(const char *op, int a, int b, int c) {
    return dn_fail(PL_EBACKEND, "oneDNN backend: %s: invalid shape (%d, %d, %d)", op, a, b, c);
}

/* The weight cache's maker of a blocked copy: a oneDNN reorder of the fp32 view of the key's B
 * into the layout the product picked (made once per update; oneDNN caches the primitive). */
typedef struct {
    const mm_key *k;
    const dnnl_memory_desc_t *dst;
} blocked_ctx;
static int make_blocked(void *ctx, uint16_t *dst, const float *w) {
    const blocked_ctx *c = ctx;
    dnnl_memory_desc_t src;
    dnnl_dims_t bd = {0}, bs = {0};
    for (int i = 0; i < c->k->nd; i++) { bd[i] = c->k->bd[i]; bs[i] = c->k->bs[i]; }
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t p = NULL;
    dnnl_memory_t ms = NULL, md = NULL;
    dnnl_status_t s = dnnl_memory_desc_init_by_strides(&src, c->k->nd, bd, dnnl_f32, bs);
    if (s == dnnl_success) s = dnnl_reorder_primitive_desc_create(&pd, &src, S.eng, c->dst, S.eng, NULL);
    if (s == dnnl_success) s = dnnl_primitive_create(&p, pd);
    if (s == dnnl_success) s = dnnl_memory_create(&ms, &src, S.eng, (void *)w);
    if (s == dnnl_success) s = dnnl_memory_create(&md, c->dst, S.eng, dst);
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, ms}, {DNNL_ARG_TO, md}};
        s = dnnl_primitive_execute(p, S.st, 2, args);
        if (s == dnnl_success) s = dnnl_stream_wait(S.st);
    }
    if (md) dnnl_memory_destroy(md);
    if (ms) dnnl_memory_destroy(ms);
    if (p) dnnl_primitive_destroy(p);
    if (pd) dnnl_primitive_desc_destroy(pd);
    return s != dnnl_success;
}

/* The bf16 weights operand of the product k (its B, the view of w that k's strides give): with
 * weight-layout=1, in the layout the product picks (k becomes that product): the weight cache's
 * kept copy where w is a weight, else a reorder into scratch now, so that the product and its
 * bits do not depend on the cache (its A/B keeps its meaning) nor on whether w was updated yet;
 * with weight-layout=0 or a plain layout, weight_bf16's plain copy or conversion (k plain). */
static int weights_for(mm_key *k, const float *w, size_t n, const void **B, const char *what) {
    if (S.wlayout) {
        k->bany = 1;
        mm_entry *e = NULL;
        PL_TRY(get_primitive(k, &e, what));
        if (e->blocked) {
            blocked_ctx c = {k, dnnl_primitive_desc_query_md(e->pd, dnnl_query_weights_md, 0)};
            const uint16_t *copy = NULL;
            if (S.wcache) wcache_get_made(w, n, e->wkind, e->vbytes, make_blocked, &c, &copy);
            S.wblocked++;
            if (copy) {
                *B = copy;
                return 0;
            }
            void *p = NULL;
            PL_TRY(scratch(SCR_B, e->vbytes, &p));
            if (make_blocked(&c, p, w) != 0)
                return dn_fail(PL_EBACKEND, "oneDNN: %s: the reorder of the weights into the product's layout failed",
                               what);
            *B = p;
            return 0;
        }
        k->bany = 0;
    }
    return weight_bf16(SCR_B, w, n, B);
}

/* out(N,OC) = inp(N,C) W^T + b: A = inp (N,C), B = W^T viewed (C,OC) with strides (1, C). */
static int dn_matmul_fwd(float *out, const float *inp, const float *w, const float *b, int N, int C, int OC) {
    NEED_INIT("matmul_fwd");
    if (N < 0 || C < 0 || OC < 0) return bad_shape("matmul_fwd", N, C, OC);
    if (N == 0 || OC == 0) return 0;
    if (C == 0) { /* no product: out = b (or 0) */
        for (size_t i = 0; i < (size_t)N; i++)
            for (int j = 0; j < OC; j++) out[i * OC + j] = b ? b[j] : 0.0f;
        return 0;
    }
    int bf = S.prec == PL_PREC_BF16;
    char what[96];
    snprintf(what, sizeof what, "matmul_fwd %s N=%d C=%d OC=%d", bf ? "bf16" : "fp32", N, C, OC);
    const void *A = inp, *B = w;
    mm_key k;
    key_init(&k, 2, bf, 0, b != NULL, 1.0f);
    key_2d(&k, N, C, OC, C, 1, 1, C, OC);
    if (bf) {
        PL_TRY(to_bf16(SCR_A, inp, (size_t)N * C, &A));
        PL_TRY(weights_for(&k, w, (size_t)OC * C, &B, what));
    }
    return mm_run(&k, A, B, out, b, what);
}

/* dinp(N,C) = dout(N,OC) W(OC,C). */
static int dn_matmul_bwd_input(float *dinp, const float *dout, const float *w, int N, int C, int OC) {
    NEED_INIT("matmul_bwd_input");
    if (N < 0 || C < 0 || OC < 0) return bad_shape("matmul_bwd_input", N, C, OC);
    if (N == 0 || C == 0) return 0;
    if (OC == 0) { memset(dinp, 0, sizeof(float) * (size_t)N * C); return 0; }
    int bf = S.prec == PL_PREC_BF16;
    char what[96];
    snprintf(what, sizeof what, "matmul_bwd_input %s N=%d C=%d OC=%d", bf ? "bf16" : "fp32", N, C, OC);
    const void *A = dout, *B = w;
    mm_key k;
    key_init(&k, 2, bf, 0, 0, 1.0f);
    key_2d(&k, N, OC, C, OC, 1, C, 1, C);
    if (bf) {
        PL_TRY(to_bf16(SCR_A, dout, (size_t)N * OC, &A));
        PL_TRY(weights_for(&k, w, (size_t)OC * C, &B, what));
    }
    return mm_run(&k, A, B, dinp, NULL, what);
}

/* The bf16 of the activation inp (N, C), the weight gradient's B: in oneDNN's blocked layout
 * when the product k takes it (wgrad-layout=1 and the AMX kernel: its own copy of a plain B into
 * that layout at every call cost up to a third of the product), converted in the same pass;
 * else plain row-major. */
static int wgrad_act_bf16(const mm_key *k, const float *inp, int N, int C, const void **B, const char *what) {
    mm_entry *e = NULL;
    if (k->bvnni) PL_TRY(get_primitive(k, &e, what));
    if (!e || !e->vnni) return to_bf16(SCR_B, inp, (size_t)N * C, B);
    void *p = NULL;
    PL_TRY(scratch(SCR_B, e->vbytes, &p));
    onednn_cvt_bf16_vnni(p, inp, N, C, e->vsk, e->vsn);
    S.vnni++;
    *B = p;
    return 0;
}

/* dW(OC,C) += dout^T inp: A = dout^T viewed (OC,N) with strides (1, OC), sum post-op. */
static int dn_matmul_bwd_weight(float *dw, float *db, const float *dout, const float *inp, int N, int C, int OC) {
    NEED_INIT("matmul_bwd_weight");
    if (N < 0 || C < 0 || OC < 0) return bad_shape("matmul_bwd_weight", N, C, OC);
    if (N == 0 || OC == 0) return 0;
    if (C > 0) {
        int bf = S.prec == PL_PREC_BF16;
        char what[96];
        snprintf(what, sizeof what, "matmul_bwd_weight %s N=%d C=%d OC=%d", bf ? "bf16" : "fp32", N, C, OC);
        const void *A = dout, *B = inp;
        mm_key k;
        key_init(&k, 2, bf, 1, 0, 1.0f);
        if (bf) {
            /* dout^T's bf16 as a dense (OC, N): oneDNN's kernel reads a transposed A through
             * a copy of its own at every call (measured 490-690 GFLOP/s against 620-1020);
             * db's column sums in the same pass where the CPU allows */
            void *a16 = NULL;
            PL_TRY(scratch(SCR_A, sizeof(uint16_t) * (size_t)N * OC, &a16));
            if (onednn_colsum_bf16_t(db, a16, dout, N, OC)) db = NULL; /* summed in the same pass */
            A = a16;
            key_2d(&k, OC, N, C, N, 1, C, 1, C);
            k.bvnni = S.wgrad_vnni;
            PL_TRY(wgrad_act_bf16(&k, inp, N, C, &B, what));
        } else key_2d(&k, OC, N, C, 1, OC, C, 1, C);
        PL_TRY(mm_run(&k, A, B, dw, NULL, what));
    }
    if (db) onednn_colsum_bf16(db, NULL, dout, N, OC); /* host_colsum's order: the CPU backend's bits */
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* attention */

/* 4-D view (B, NH, rows, cols) with strides (sb, sh, sr, sc). */
static void view4(int64_t *d, int64_t *s, int64_t B, int64_t NH, int64_t r, int64_t c, int64_t sb, int64_t sh,
                  int64_t sr, int64_t sc) {
    d[0] = B; d[1] = NH; d[2] = r; d[3] = c;
    s[0] = sb; s[1] = sh; s[2] = sr; s[3] = sc;
}

/* A dense 4-D (B, H, rows, cols) view, or its last two dims swapped (the transposed view of a
 * dense (B, H, cols, rows)). */
static void dense4(int64_t *d, int64_t *s, int64_t B, int64_t H, int64_t r, int64_t c, int transposed) {
    if (transposed) view4(d, s, B, H, r, c, H * r * c, r * c, 1, r);
    else view4(d, s, B, H, r, c, H * r * c, r * c, c, 1);
}

/* Grouped-query attention on a fused qkv (B, T, W), W = (NH + 2 NKV) HS: query head h = g G + j
 * (G = NH / NKV) reads kv head g. */
static int check_gqa(const char *op, int B, int T, int NH, int NKV, int HS) {
    if (B < 0 || T < 0 || NH <= 0 || NKV <= 0 || HS <= 0 || NH % NKV != 0)
        return dn_fail(PL_EBACKEND, "oneDNN backend: %s: invalid shape B=%d T=%d NH=%d NKV=%d HS=%d "
                       "(query heads must divide into kv heads)", op, B, T, NH, NKV, HS);
    return 0;
}

/* fp32: G batched 4-D matmuls over the (B, NKV) pairs (one per query head j of a group), on
 * strided views of the fused qkv: for each j the j-th query heads form a batch (B, NKV)
 * against the kv heads (query head stride G HS, kv head stride HS). NKV == NH (G = 1) is one
 * batched product over (B, NH): GPT-2's former multi-head attention and its bits. */
static int att_fwd_fp32(float *out, float *att, const float *qkv, int B, int T, int NH, int NKV, int HS,
                        const int *doc, const char *what) {
    int64_t G = NH / NKV, hs = HS, W = (int64_t)(NH + 2 * NKV) * HS, CO = (int64_t)NH * HS, TT = (int64_t)T * T;
    int64_t sbw = (int64_t)T * W;
    const float *q = qkv, *kk = qkv + (size_t)NH * HS, *v = qkv + (size_t)(NH + NKV) * HS;
    mm_key k;
    for (int64_t j = 0; j < G; j++) {
        key_init(&k, 4, 0, 0, 0, 1.0f / sqrtf((float)hs));
        view4(k.ad, k.as, B, NKV, T, hs, sbw, G * hs, W, 1);      /* q_h (T, hs) */
        view4(k.bd, k.bs, B, NKV, hs, T, sbw, hs, 1, W);          /* k_g^T (hs, T) */
        view4(k.cd, k.cs, B, NKV, T, T, NH * TT, G * TT, T, 1);   /* att_h (T, T) */
        PL_TRY(mm_run(&k, q + j * hs, kk, att + j * TT, NULL, what));
    }
    onednn_softmax_causal(att, NULL, B * NH, T, doc, NH);
    for (int64_t j = 0; j < G; j++) {
        key_init(&k, 4, 0, 0, 0, 1.0f);
        view4(k.ad, k.as, B, NKV, T, T, NH * TT, G * TT, T, 1);   /* att_h */
        view4(k.bd, k.bs, B, NKV, T, hs, sbw, hs, W, 1);          /* v_g (T, hs) */
        view4(k.cd, k.cs, B, NKV, T, hs, T * CO, G * hs, CO, 1);  /* out_h (T, hs) of (B,T,NH HS) */
        PL_TRY(mm_run(&k, att + j * TT, v, out + j * hs, NULL, what));
    }
    return 0;
}

/* datt_h = dy_h v_g^T; dv_g (+)= att_h^T dy_h; dpre = softmax backward; dq_h = s dpre_h k_g;
 * dk_g (+)= s dpre_h^T q_h. j = 0 overwrites dk, dv; j > 0 accumulates (sum post-op), so each kv
 * head's gradient sums its query heads in ascending h. fp32, on the fused views. */
static int att_bwd_fp32(float *dqkv, const float *dout, const float *qkv, const float *att, int B, int T, int NH,
                        int NKV, int HS, const int *doc, const char *what) {
    int64_t G = NH / NKV, hs = HS, W = (int64_t)(NH + 2 * NKV) * HS, CO = (int64_t)NH * HS, TT = (int64_t)T * T;
    int64_t sbw = (int64_t)T * W, sbo = (int64_t)T * CO;
    float scale = 1.0f / sqrtf((float)hs), *datt = NULL;
    PL_TRY(scratch(SCR_F, sizeof(float) * (size_t)B * NH * TT, (void **)&datt));
    const float *q = qkv, *kk = qkv + (size_t)NH * HS, *v = qkv + (size_t)(NH + NKV) * HS;
    float *dq = dqkv, *dk = dqkv + (size_t)NH * HS, *dv = dqkv + (size_t)(NH + NKV) * HS;
    mm_key k;
    for (int64_t j = 0; j < G; j++) {
        key_init(&k, 4, 0, 0, 0, 1.0f); /* datt_h = dy_h v_g^T */
        view4(k.ad, k.as, B, NKV, T, hs, sbo, G * hs, CO, 1);
        view4(k.bd, k.bs, B, NKV, hs, T, sbw, hs, 1, W);
        view4(k.cd, k.cs, B, NKV, T, T, NH * TT, G * TT, T, 1);
        PL_TRY(mm_run(&k, dout + j * hs, v, datt + j * TT, NULL, what));
        key_init(&k, 4, 0, j > 0, 0, 1.0f); /* dv_g (+)= att_h^T dy_h */
        view4(k.ad, k.as, B, NKV, T, T, NH * TT, G * TT, 1, T);
        view4(k.bd, k.bs, B, NKV, T, hs, sbo, G * hs, CO, 1);
        view4(k.cd, k.cs, B, NKV, T, hs, sbw, hs, W, 1);
        PL_TRY(mm_run(&k, att + j * TT, dout + j * hs, dv, NULL, what));
    }
    onednn_softmax_causal_bwd(datt, NULL, att, B * NH, T, doc, NH);
    for (int64_t j = 0; j < G; j++) {
        key_init(&k, 4, 0, 0, 0, scale); /* dq_h = s dpre_h k_g */
        view4(k.ad, k.as, B, NKV, T, T, NH * TT, G * TT, T, 1);
        view4(k.bd, k.bs, B, NKV, T, hs, sbw, hs, W, 1);
        view4(k.cd, k.cs, B, NKV, T, hs, sbw, G * hs, W, 1);
        PL_TRY(mm_run(&k, datt + j * TT, kk, dq + j * hs, NULL, what));
        key_init(&k, 4, 0, j > 0, 0, scale); /* dk_g (+)= s dpre_h^T q_h */
        view4(k.ad, k.as, B, NKV, T, T, NH * TT, G * TT, 1, T);
        view4(k.bd, k.bs, B, NKV, T, hs, sbw, G * hs, W, 1);
        view4(k.cd, k.cs, B, NKV, T, hs, sbw, hs, W, 1);
        PL_TRY(mm_run(&k, datt + j * TT, q + j * hs, dk, NULL, what));
    }
    return 0;
}

/* bf16 runs every product on dense operands, which oneDNN's brgemm kernels (AMX's among them)
 * take; on the fused qkv's strided views oneDNN 2.6 falls back to gemm:jit, at half the speed.
 * The G query heads of kv head g are one product: the dense (B, NH, T, HS) copy of q is the
 * dense (B, NKV, G T, HS), and att (B, NH, T, T) the dense (B, NKV, G T, T), so query head
 * h = g G + j is rows [j T, (j + 1) T) of batch g; kv head g's gradients sum the G heads
 * inside the product's inner dimension (a fixed order). The products are full T x T (the
 * softmax writes zeros above the diagonal, and overwrites or never reads what a product puts
 * there): a causal split would take sub-blocks, which are not dense. */

/* A (B, T, ld) tensor's rows as np head-major parts: part p is H[p] heads of HS, dense (B, H[p],
 * T, HS) at d[p], the parts' heads side by side from column 0 of each row. One pass over the
 * rows (each read or written in order), parallel over rows. */
typedef struct {
    int np, H[3];
    void *d[3];
} heads_parts;

/* Where head h of part p holds row (b, t). */
static size_t head_at(const heads_parts *hp, int p, int64_t b, int64_t t, int64_t h, int T, int HS) {
    return (size_t)(((b * hp->H[p] + h) * T + t) * HS);
}

#ifdef DN_HAVE_X86
#define DN_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
DN_BF16_TARGET static void rows_to_heads_vec(const heads_parts *hp, const float *src, int B, int T, int HS, int64_t ld) {
    #pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        const float *s = src + bt * ld;
        for (int p = 0; p < hp->np; p++)
            for (int64_t h = 0; h < hp->H[p]; h++, s += HS)
                cvt_avx512((uint16_t *)hp->d[p] + head_at(hp, p, bt / T, bt % T, h, T, HS), s, (size_t)HS);
    }
}
__attribute__((target("avx512f"))) static void heads_to_rows_vec(float *dst, const heads_parts *hp, int B, int T,
                                                                 int HS, int64_t ld) {
    #pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        float *o = dst + bt * ld;
        for (int p = 0; p < hp->np; p++)
            for (int64_t h = 0; h < hp->H[p]; h++, o += HS) {
                const float *s = (const float *)hp->d[p] + head_at(hp, p, bt / T, bt % T, h, T, HS);
                for (int i = 0; i < HS; i += 16) {
                    __mmask16 m = HS - i >= 16 ? 0xffff : (__mmask16)((1u << (HS - i)) - 1u);
                    _mm512_mask_storeu_ps(o + i, m, _mm512_maskz_loadu_ps(m, s + i));
                }
            }
    }
}
#endif

/* The rows of src (B, T, ld) in bf16 into the parts (the dense copies the products take). */
static void rows_to_heads_bf16(const heads_parts *hp, const float *src, int B, int T, int HS, int64_t ld) {
#ifdef DN_HAVE_X86
    if (S.native_bf16) { rows_to_heads_vec(hp, src, B, T, HS, ld); return; }
#endif
    #pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        const float *s = src + bt * ld;
        for (int p = 0; p < hp->np; p++)
            for (int64_t h = 0; h < hp->H[p]; h++, s += HS)
                cvt_scalar((uint16_t *)hp->d[p] + head_at(hp, p, bt / T, bt % T, h, T, HS), s, (size_t)HS);
    }
}

/* The reverse, in fp32: the parts (dense products' outputs) into the rows of dst (B, T, ld). */
static void heads_to_rows(float *dst, const heads_parts *hp, int B, int T, int HS, int64_t ld) {
#ifdef DN_HAVE_X86
    if (__builtin_cpu_supports("avx512f")) { heads_to_rows_vec(dst, hp, B, T, HS, ld); return; }
#endif
    #pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        float *o = dst + bt * ld;
        for (int p = 0; p < hp->np; p++)
            for (int64_t h = 0; h < hp->H[p]; h++, o += HS)
                memcpy(o, (const float *)hp->d[p] + head_at(hp, p, bt / T, bt % T, h, T, HS), sizeof(float) * HS);
    }
}

/* Dense bf16 q (B, NH, T, HS), k and v (B, NKV, T, HS) of qkv, one after the other in slot SCR_A. */
static int qkv_dense_bf16(const float *qkv, int B, int T, int NH, int NKV, int HS, uint16_t **q, uint16_t **k,
                          uint16_t **v) {
    int64_t W = (int64_t)(NH + 2 * NKV) * HS, nq = (int64_t)B * NH * T * HS, nk = (int64_t)B * NKV * T * HS;
    void *p = NULL;
    PL_TRY(scratch(SCR_A, sizeof(uint16_t) * (size_t)(nq + 2 * nk), &p));
    *q = p;
    *k = *q + nq;
    *v = *k + nk;
    heads_parts hp = {3, {NH, NKV, NKV}, {*q, *k, *v}};
    rows_to_heads_bf16(&hp, qkv, B, T, HS, W);
    return 0;
}

/* One batched bf16 product over (B, NKV) on dense views: C (M, N) = s A (M, K) B (K, N), A or
 * B read transposed (ta, tb: the dense (K, M) or (N, K) behind it), C dense. */
static int mm_dense(int64_t B, int64_t H, int64_t M, int64_t K, int64_t N, const void *A, int ta, const void *Bm,
                    int tb, float *C, float s, const char *what) {
    mm_key k;
    key_init(&k, 4, 1, 0, 0, s);
    dense4(k.ad, k.as, B, H, M, K, ta);
    dense4(k.bd, k.bs, B, H, K, N, tb);
    dense4(k.cd, k.cs, B, H, M, N, 0);
    return mm_run(&k, A, Bm, C, NULL, what);
}

/* bf16 forward: att = softmax_causal(q k^T / sqrt(HS)), out = att v, on dense copies. */
static int att_fwd_bf16(float *out, float *att, const float *qkv, int B, int T, int NH, int NKV, int HS,
                        const int *doc, const char *what) {
    int64_t G = NH / NKV, GT = G * T, TT = (int64_t)T * T, CO = (int64_t)NH * HS;
    uint16_t *q, *kk, *v;
    PL_TRY(qkv_dense_bf16(qkv, B, T, NH, NKV, HS, &q, &kk, &v));
    PL_TRY(mm_dense(B, NKV, GT, HS, T, q, 0, kk, 1, att, 1.0f / sqrtf((float)HS), what)); /* (B,NKV,GT,T) */
    void *a16 = NULL; /* the softmax writes att's bf16 copy in its own pass where it can */
    PL_TRY(scratch(SCR_B, sizeof(uint16_t) * (size_t)B * NH * TT, &a16));
    if (!onednn_softmax_causal(att, a16, B * NH, T, doc, NH)) onednn_cvt_bf16(a16, att, (size_t)B * NH * TT, 0);
    if (G == 1) { /* out (B, T, NH HS) is the dense (B, NH, T, HS) with its middle dims swapped */
        mm_key k;
        key_init(&k, 4, 1, 0, 0, 1.0f);
        dense4(k.ad, k.as, B, NH, T, T, 0);
        dense4(k.bd, k.bs, B, NH, T, HS, 0);
        view4(k.cd, k.cs, B, NH, T, HS, T * CO, HS, CO, 1);
        return mm_run(&k, a16, v, out, NULL, what);
    }
    float *o = NULL; /* (B, NKV, GT, HS) = dense (B, NH, T, HS), then into out's heads */
    PL_TRY(scratch(SCR_D, sizeof(float) * (size_t)B * NH * T * HS, (void **)&o));
    PL_TRY(mm_dense(B, NKV, GT, T, HS, a16, 0, v, 0, o, 1.0f, what));
    heads_parts hp = {1, {NH, 0, 0}, {o, NULL, NULL}};
    heads_to_rows(out, &hp, B, T, HS, CO);
    return 0;
}

/* bf16 backward on dense copies: datt = dy v^T; dv = att^T dy; dpre = softmax backward;
 * dq = s dpre k; dk = s dpre^T q; the three into dqkv's heads. */
static int att_bwd_bf16(float *dqkv, const float *dout, const float *qkv, const float *att, int B, int T, int NH,
                        int NKV, int HS, const int *doc, const char *what) {
    int64_t G = NH / NKV, GT = G * T, TT = (int64_t)T * T, W = (int64_t)(NH + 2 * NKV) * HS;
    int64_t nq = (int64_t)B * NH * T * HS, nk = (int64_t)B * NKV * T * HS;
    float s = 1.0f / sqrtf((float)HS), *datt = NULL, *g = NULL;
    uint16_t *q, *kk, *v, *dy = NULL, *a16 = NULL;
    PL_TRY(qkv_dense_bf16(qkv, B, T, NH, NKV, HS, &q, &kk, &v));
    PL_TRY(scratch(SCR_B, sizeof(uint16_t) * (size_t)nq, (void **)&dy));
    PL_TRY(scratch(SCR_C, sizeof(uint16_t) * (size_t)B * NH * TT, (void **)&a16));
    PL_TRY(scratch(SCR_F, sizeof(float) * (size_t)B * NH * TT, (void **)&datt));
    PL_TRY(scratch(SCR_D, sizeof(float) * (size_t)(nq + 2 * nk), (void **)&g)); /* dq, dk, dv dense */
    heads_parts hy = {1, {NH, 0, 0}, {dy, NULL, NULL}};
    rows_to_heads_bf16(&hy, dout, B, T, HS, (int64_t)NH * HS);
    onednn_cvt_bf16(a16, att, (size_t)B * NH * TT, 0);
    PL_TRY(mm_dense(B, NKV, GT, HS, T, dy, 0, v, 1, datt, 1.0f, what));       /* datt (B,NKV,GT,T) */
    PL_TRY(mm_dense(B, NKV, T, GT, HS, a16, 1, dy, 0, g + nq + nk, 1.0f, what)); /* dv (B,NKV,T,HS) */
    /* the bf16 att is not needed any more: the bf16 dpre takes its place */
    if (!onednn_softmax_causal_bwd(datt, a16, att, B * NH, T, doc, NH)) onednn_cvt_bf16(a16, datt, (size_t)B * NH * TT, 0);
    PL_TRY(mm_dense(B, NKV, GT, T, HS, a16, 0, kk, 0, g, s, what));      /* dq (B,NKV,GT,HS) */
    PL_TRY(mm_dense(B, NKV, T, GT, HS, a16, 1, q, 0, g + nq, s, what));  /* dk (B,NKV,T,HS) */
    heads_parts hg = {3, {NH, NKV, NKV}, {g, g + nq, g + nq + nk}};
    heads_to_rows(dqkv, &hg, B, T, HS, W);
    return 0;
}

static int dn_attention_gqa_fwd(float *out, float *att, const float *qkv, int B, int T, int NH, int NKV, int HS,
                                const int *doc) {
    NEED_INIT("attention_gqa_fwd");
    PL_TRY(check_gqa("attention_gqa_fwd", B, T, NH, NKV, HS));
    if (B == 0 || T == 0) return 0;
    int bf = S.prec == PL_PREC_BF16;
    if (dn_tiled_for(T, HS)) return cpu_attention_tiled_fwd(out, att, qkv, B, T, NH, NKV, HS, doc, bf);
    char what[128];
    snprintf(what, sizeof what, "attention_gqa_fwd %s B=%d T=%d NH=%d NKV=%d HS=%d", bf ? "bf16" : "fp32", B, T, NH,
             NKV, HS);
    if (bf) return att_fwd_bf16(out, att, qkv, B, T, NH, NKV, HS, doc, what);
    return att_fwd_fp32(out, att, qkv, B, T, NH, NKV, HS, doc, what);
}

static int dn_attention_gqa_bwd(float *dqkv, const float *dout, const float *qkv, const float *att, int B, int T,
                                int NH, int NKV, int HS, const int *doc) {
    NEED_INIT("attention_gqa_bwd");
    PL_TRY(check_gqa("attention_gqa_bwd", B, T, NH, NKV, HS));
    if (B == 0 || T == 0) return 0;
    int bf = S.prec == PL_PREC_BF16;
    if (dn_tiled_for(T, HS)) return cpu_attention_tiled_bwd(dqkv, dout, qkv, att, B, T, NH, NKV, HS, doc, bf);
    char what[128];
    snprintf(what, sizeof what, "attention_gqa_bwd %s B=%d T=%d NH=%d NKV=%d HS=%d", bf ? "bf16" : "fp32", B, T, NH,
             NKV, HS);
    if (bf) return att_bwd_bf16(dqkv, dout, qkv, att, B, T, NH, NKV, HS, doc, what);
    return att_bwd_fp32(dqkv, dout, qkv, att, B, T, NH, NKV, HS, doc, what);
}

/* ---------------------------------------------------------------------------------------- */
/* writes the weight cache must see: the CPU backend's memory ops, AdamW and scale, each
 * telling onednn_wcache.c what it allocates, frees or writes */

/* Memory the cache may take weights from: the CPU backend's allocation, recorded. */
static int dn_alloc(void **p, size_t bytes) {
    int rc = backend_cpu.alloc(p, bytes);
    if (rc == 0) wcache_alloc(*p, bytes);
    return rc;
}
/* The allocation and every copy inside it go. */
static void dn_free(void *p) {
    wcache_free(p);
    backend_cpu.free(p);
}
/* from_host, copy, zero: the copies over the destination are stale. */
static int dn_from_host(void *dst, const void *src, size_t bytes) {
    wcache_write(dst, bytes);
    return backend_cpu.from_host(dst, src, bytes);
}
static int dn_copy(void *dst, const void *src, size_t bytes) {
    wcache_write(dst, bytes);
    return backend_cpu.copy(dst, src, bytes);
}
static int dn_zero(void *p, size_t bytes) {
    wcache_write(p, bytes);
    return backend_cpu.zero(p, bytes);
}
/* A view for writing: stale from the map (host memory: the view is the buffer) to the unmap. */
static int dn_map(void **host, void *p, size_t bytes, int mode) {
    if (mode & PL_MAP_WRITE) wcache_write(p, bytes);
    return backend_cpu.map(host, p, bytes, mode);
}
static int dn_unmap(void *host, void *p, size_t bytes, int mode) {
    if (mode & PL_MAP_WRITE) wcache_write_whole(p, bytes);
    return backend_cpu.unmap(host, p, bytes, mode);
}
/* The optimizer's update: the weights' copies are made again on their next product. */
static int dn_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2, float eps,
                    float wd, int t) {
    wcache_update(p, n);
    return onednn_adamw(p, g, m, v, n, lr, b1, b2, eps, wd, t);
}
/* scale writes x (the optimizer scales gradients, but any caller may scale weights). */
static int dn_scale(float *x, float s, size_t n) {
    wcache_write(x, n * sizeof(float));
    return onednn_scale(x, s, n);
}

/* Exported for tests/unit/test_onednn.c only: primitives created so far (the cache's misses). */
long onednn_primitives_created(void);
long onednn_primitives_created(void) { return S.created; }
/* Exported for tests/unit/test_onednn.c only: bf16 primitives created with an operand that is
 * not dense (0: every bf16 product could take the brgemm kernels), the products run with the
 * weight gradient's activation in oneDNN's 16a64b2a layout (wgrad-layout=1 on AMX) and with
 * weights in a blocked layout (weight-layout=1), and the implementation of the i-th (label,
 * implementation) made, NULL past the last. */
long onednn_nondense_created(void);
long onednn_nondense_created(void) { return S.nondense; }
long onednn_vnni_used(void);
long onednn_vnni_used(void) { return S.vnni; }
long onednn_wblocked_used(void);
long onednn_wblocked_used(void) { return S.wblocked; }
const char *onednn_impl_made(int i, const char **what);
const char *onednn_impl_made(int i, const char **what) {
    if (i < 0 || i >= S.nimpls) return NULL;
    if (what) *what = S.impls[i].what;
    return S.impls[i].impl;
}

/* Only what differs from the CPU backend: the matrix products and attention (oneDNN matmuls),
 * threads, init and describe. Every other op, memory included, is the CPU backend's (filled in
 * at registration, backend.h): the memory is host memory in both. */
#define DN_TABLE(INIT) { \
    .name = "onednn", \
    .host_memory = 1, \
    .init = INIT, \
    .finalize = dn_finalize, \
    .error = host_error, \
    .describe = dn_describe, \
    .set_threads = dn_set_threads, \
    .get_threads = dn_get_threads, \
    .opts = dn_opts, \
    .attention_cols = dn_attention_cols, \
    /* the CPU backend's memory ops, telling the weight cache */ \
    .alloc = dn_alloc, \
    .free = dn_free, \
    .from_host = dn_from_host, \
    .copy = dn_copy, \
    .zero = dn_zero, \
    .map = dn_map, \
    .unmap = dn_unmap, \
    .scale = dn_scale, \
    .matmul_fwd = dn_matmul_fwd, \
    .matmul_bwd_input = dn_matmul_bwd_input, \
    .matmul_bwd_weight = dn_matmul_bwd_weight, \
    .attention_gqa_fwd = dn_attention_gqa_fwd, \
    .attention_gqa_bwd = dn_attention_gqa_bwd, \
    /* onednn_ops.c: AVX-512 loops, or backend_cpu's ops on a CPU without AVX-512 */ \
    .layernorm_fwd = onednn_layernorm_fwd, \
    .layernorm_bwd_input = onednn_layernorm_bwd_input, \
    .layernorm_bwd_weight = onednn_layernorm_bwd_weight, \
    .gelu_fwd = onednn_gelu_fwd, \
    .gelu_bwd = onednn_gelu_bwd, \
    .crossentropy_fwd = onednn_crossentropy_fwd, \
    .crossentropy_bwd = onednn_crossentropy_bwd, \
    .adamw = dn_adamw, /* onednn_adamw, telling the weight cache */ \
    .sumsq = onednn_sumsq, \
    /* onednn_elem.c: the CPU backend's bits in 16 lanes */ \
    .encoder_fwd = onednn_encoder_fwd, \
    .encoder_bwd = onednn_encoder_bwd, \
    .residual_fwd = onednn_residual_fwd, \
    .add_inplace = onednn_add_inplace, \
    /* onednn_llama.c: AVX-512 in bf16, backend_cpu's in fp32 */ \
    .rmsnorm_fwd = onednn_rmsnorm_fwd, \
    .rmsnorm_bwd_input = onednn_rmsnorm_bwd_input, \
    .rmsnorm_bwd_weight = onednn_rmsnorm_bwd_weight, \
    .swiglu_fwd = onednn_swiglu_fwd, \
    .swiglu_bwd = onednn_swiglu_bwd, \
}
const backend backend_onednn = DN_TABLE(dn_init_plain);
/* --backend auto --precision bf16 (onednn_auto.h): the same table, its own init */
const backend backend_onednn_auto = DN_TABLE(dn_init_auto);
