/*
 * cpu_attention.h — the CPU backend's fused causal grouped-query attention in O(T) memory
 * (FlashAttention-2, Dao 2023): the forward walks the key tiles of each query tile with a
 * running row maximum and sum (online softmax) and keeps, per (sequence, query head), only
 * the output O (T, HS) and the row log-sum-exp (T); the backward recomputes each tile's
 * probabilities from the log-sum-exp. Contracts as attention_gqa_fwd / _bwd in backend_ops.h,
 * except that att holds this state, B * NH * T * (HS + 1) floats, instead of the (T, T)
 * probabilities.
 *
 * Fixed order: the tiles have fixed sizes whatever the thread count; a query row's key tiles
 * are visited in ascending order, a row's maximum and sum in 16 lanes added in a fixed tree;
 * the backward runs each (sequence, kv head) on one thread, its query heads ascending, then
 * key tiles ascending, so every sum of dq, dk and dv has one order. Each tile's products are
 * single-threaded OpenBLAS sgemm calls of fixed shapes (the OpenMP flavour of OpenBLAS runs
 * one thread inside a parallel region; the caller tells the pthread flavour, as the backend's
 * ops do). The results are therefore the same bits for any thread count, stage split or
 * schedule.
 */
#ifndef PIPELM_CPU_ATTENTION_H
#define PIPELM_CPU_ATTENTION_H

/* The forward's tiles: CPU_ATT_TQ query rows against CPU_ATT_TK key columns; the backward's:
 * CPU_ATT_TB key columns against every query row at or below them (one product each). */
#define CPU_ATT_TQ 64
#define CPU_ATT_TK 256
#define CPU_ATT_TB 128

/* A span of the causal attention: nq query rows of each sequence, the first at position qpos,
 * against the keys at positions 0 .. qpos + nq - 1 (context parallelism, parallel/cp.h: a
 * rank's chunk of queries against the gathered keys). q and kv are fused qkv rows as
 * attention_gqa_fwd's (leading dimension W = (NH + 2 NKV) HS): the queries' columns are read
 * from q's rows, the keys' and values' from kv's (row j: position j); q_seq, kv_seq, out_seq:
 * floats between sequences. The state of (sequence b, query head h), bh = b NH + h: O (nq, HS)
 * rows at O + bh st_bh, the log-sum-exps (nq) at lse + bh st_bh. The backward overwrites the
 * query columns of dq's rows (laid out as q) and adds into the key and value columns of dkv's
 * rows (laid out as kv), zeroing those first when zero_dkv. nk > 0: only kv's first nk rows
 * exist (a block of keys at positions 0 .. nk - 1; a query row sees those at or before its
 * position); acc_dq: add into dq instead (the ring's blocks, parallel/cp.c). Same fixed
 * order as below. */
typedef struct {
    int B, NH, NKV, HS, nq, qpos, nk, acc_dq;
    const float *q, *kv;
    size_t q_seq, kv_seq, out_seq, st_bh;
    float *out, *O, *lse;        /* forward: out (nq, NH HS) rows; O and lse written */
    const float *dout;           /* backward: dout laid out as out */
    float *dq, *dkv;
    int zero_dkv;
    const int *doc;              /* document starts by position (doc_seq a sequence), or NULL: causal */
    size_t doc_seq;
    int bf16;                    /* bf16 rounding of the probabilities and score gradients (below) */
} cpu_att_span;
int cpu_attention_span_fwd(const cpu_att_span *s);
int cpu_attention_span_bwd(const cpu_att_span *s);

/* out (B, T, NH HS) and state (B, NH, T, HS + 1: O rows, then the T log-sum-exps) from qkv
 * (B, T, (NH + 2 NKV) HS); scale 1/sqrt(HS). Any T >= 1. doc (B*T) or NULL: backend_ops.h's
 * document masking; a query tile starts at the key tile of its first row's document (the
 * tiles before it are masked for every row: skipped), and a row starts its online softmax at
 * its first unmasked column. */
int cpu_attention_tiled_fwd(float *out, float *state, const float *qkv, int B, int T, int NH, int NKV, int HS,
                            const int *doc, int bf16);
/* dqkv (B, T, (NH + 2 NKV) HS, overwritten) from dout (B, T, NH HS), qkv and the forward's
 * state and doc; a key tile takes only the query rows whose document starts inside or before
 * it (the rows after them are masked: skipped). */
int cpu_attention_tiled_bwd(float *dqkv, const float *dout, const float *qkv, const float *state, int B, int T,
                            int NH, int NKV, int HS, const int *doc, int bf16);

/* bf16 (the oneDNN backend's --precision bf16): every product takes bf16 inputs with fp32
 * accumulation, as the T x T path's do: q, k, v and dout are rounded to bf16 (a rounded copy,
 * B T (NH + 2 NKV) HS floats, for the call), and so are the probabilities before p v and
 * p^T dO and the score gradients before their products (as the CUDA fused kernels do); the
 * softmax, the log-sum-exp, D and every sum stay fp32. The same fixed order, so the same bits
 * for any thread count. bf16 = 0: the fp32 kernels above, unchanged. Both entry points keep
 * OpenBLAS to one thread per product while their threads run (the pthread flavour is told). */

#endif
