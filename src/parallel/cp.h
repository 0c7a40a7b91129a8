/*
 * cp.h — context parallelism (--cp C): the C ranks of one (stage, data replica) split the
 * sequence of every micro-batch. The whole sequence of T C tokens is cut into 2 C chunks;
 * CP rank c holds chunks c and 2 C - 1 - c (the load-balanced causal order of Megatron-LM
 * and Llama 3's training: every rank's queries see the same number of causal keys), T tokens
 * in all, so every activation of a stage is 1 / C of a one-rank stage's. Everything outside
 * attention is per token: the embeddings and RoPE take each row's position in the whole
 * sequence (model_cp_pos), the loss is each rank's tokens' share of the global mean, and the
 * weight gradients are summed over the C ranks by the replicas' reduction (dp.h: the run
 * counts the C ranks of a replica among its D C gradient replicas), so --grad-accum exact and
 * ZeRO-1 work unchanged and checkpoints do not depend on C.
 *
 * Attention (the hook model_attention_fwd / _bwd call, model_set_cp_hook), two forms:
 *   - ring (--cp-comm ring, the default): each rank's block of fused qkv rows (its two
 *     chunks) goes round the C ranks. At step j a rank holds the block of rank c - j: it
 *     posts the receive of the next block and the send of this one (MPI_Irecv / MPI_Isend),
 *     runs the tiles of its two query chunks against the block's chunks at or before them
 *     (the fused kernel's span form, cpu_attention.h: a pair's queries at a position offset
 *     against the chunk's keys), merges each pair's output into the chunk's running one by
 *     their log-sum-exps, and only then waits for the transfer: the communication hides
 *     behind the tiles. att keeps the merged O and log-sum-exp. The backward passes the
 *     blocks round again, each with its dk, dv accumulator: a rank adds its queries' part of
 *     the block's gradient (and its own dq) and sends the accumulator on; after C steps each
 *     rank holds its own block's, every rank's part added in ring order from the owner.
 *   - all-gather (--cp-comm allgather): every rank's rows gathered (MPI_Iallgather) and put
 *     in sequence order, each local chunk's queries run against the keys before it; the
 *     backward gathers again and sends each rank the partial dk, dv of its rows
 *     (MPI_Ialltoall), added in rank order. It holds the whole sequence's rows during a layer's
 *     attention and does not overlap its exchanges.
 * Every sum has one order, so a run is the same bits run after run and across pipeline splits
 * at a fixed C and form. Every wait runs under the watchdog (comm.h), naming the exchange and
 * the neighbour.
 *
 * Needs the cpu backend (its fused kernel, fp32), no --tp; T C divisible by 2 C. The ring's
 * blocks carry the whole qkv rows (the query columns ride along: 1/3 of the bytes for MHA).
 */
#ifndef PIPELM_CP_H
#define PIPELM_CP_H

#include <mpi.h>
#include <stddef.h>

typedef struct {
    MPI_Comm comm;          /* the C ranks of this (stage, data replica), rank = CP index */
    int C, c;
    int wrank;              /* world rank, for messages */
    float *all, *seq, *dkv, *send; /* host scratch: gathered rows, in sequence order, dk dv, the parts */
    size_t cap_all, cap_seq, cap_dkv, cap_send;
    double t_comm;          /* seconds waiting in the exchanges */
    double t_att;           /* seconds in cp_attention_fwd / _bwd in all */
    long ncalls;
    int fail_step, fail_kill; /* test-only: --fail-at cp / cp-kill on this rank at that step */
    int ring;               /* 1: the ring (--cp-comm ring), 0: the all-gather */
    int prev, next;         /* the ring's neighbours (CP ranks), and their world ranks for messages */
    int wprev, wnext;
    float *blk[2], *dblk[2], *tout, *tstate; /* ring scratch: K/V blocks, their gradients, a pair's out and state */
    size_t cap_blk[2], cap_dblk[2], cap_tout, cap_tstate;
} cp_group;

/* Set up over comm (C ranks); ring: the ring form, else the all-gather. PL_OK or PL_ENOMEM. */
int cp_init(cp_group *g, MPI_Comm comm, int ring, int fail_step, int fail_kill, int wrank, char *err, size_t errlen);
void cp_free(cp_group *g);

/* The hooks (model.h: model_cp_att_fwd / _bwd); ctx is the cp_group; T is the local rows. */
int cp_attention_fwd(void *ctx, float *out, float *att, const float *qkv, int B, int T, int NH, int NKV, int HS);
int cp_attention_bwd(void *ctx, float *dqkv, const float *dout, const float *qkv, const float *att, int B, int T,
                     int NH, int NKV, int HS);

/* local (B, T / C) = CP rank c's tokens of whole (B, T): chunks c and 2 C - 1 - c of 2 C. */
void cp_local_tokens(const int *whole, int *local, int B, int T, int C, int c);

#endif
