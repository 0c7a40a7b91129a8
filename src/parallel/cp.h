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
 * Attention (the hook model_attention_fwd / _bwd call, model_set_cp_hook): the forward
 * all-gathers the C ranks' fused qkv rows (MPI_Iallgather, waited on under the watchdog),
 * puts them in sequence order, and runs each local chunk's queries against the keys before
 * it with the fused kernel's span form (cpu_attention.h), which keeps O and the log-sum-exp
 * in att. The backward gathers the rows again, computes dq of the local queries and partial
 * dk, dv for every key row, and sends each rank its rows' partial gradients (MPI_Ialltoall);
 * each rank adds the C parts in rank order. Every sum has one order, so a run is the same bits
 * run after run and across pipeline splits at a fixed C. This is the all-gather form, not
 * the ring: the whole sequence's qkv rows are held during a layer's attention (B T C W floats)
 * and its communication is not overlapped with the tiles.
 *
 * Needs the cpu backend (its fused kernel, fp32), no --tp; T C divisible by 2 C.
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
} cp_group;

/* Set up over comm (C ranks). PL_OK or PL_ENOMEM. */
int cp_init(cp_group *g, MPI_Comm comm, int fail_step, int fail_kill, int wrank, char *err, size_t errlen);
void cp_free(cp_group *g);

/* The hooks (model.h: model_cp_att_fwd / _bwd); ctx is the cp_group; T is the local rows. */
int cp_attention_fwd(void *ctx, float *out, float *att, const float *qkv, int B, int T, int NH, int NKV, int HS);
int cp_attention_bwd(void *ctx, float *dqkv, const float *dout, const float *qkv, const float *att, int B, int T,
                     int NH, int NKV, int HS);

/* local (B, T / C) = CP rank c's tokens of whole (B, T): chunks c and 2 C - 1 - c of 2 C. */
void cp_local_tokens(const int *whole, int *local, int B, int T, int C, int c);

#endif
