/*
 * split.h — how the L blocks are divided among P stages.
 *
 * Stage s owns blocks [first[s], first[s] + blocks[s]); stage 0 also owns the embeddings and
 * stage P-1 the final LayerNorm, LM head and loss. "auto" minimises the most expensive
 * stage under a cost model of forward+backward FLOPs per token (each block, the embedding
 * lookup, the head and its softmax); among splits whose costliest stage costs that least, it
 * takes the one whose largest memory (parameters, gradients, AdamW moments and the
 * activations of the micro-batches held at once under 1F1B) is smallest. An explicit "4,3,5" gives the blocks per stage; stages in the middle
 * must hold at least one block, the first and last may hold none.
 */
#ifndef PIPELM_SPLIT_H
#define PIPELM_SPLIT_H

#include <stddef.h>
#include <stdio.h>
#include "model/model.h"

typedef struct {
    int P;
    int *blocks, *first;   /* P each */
} split;

/* "auto" tries every choice exactly when P L^2 is at most this (default 4e6), else uses the
 * O(P L log L) search that gives the same split; tests set it to compare the two. */
extern long long split_exact_limit;
/* Parse or compute a split of cfg's L blocks over P stages, for M micro-batches of Bm x T. */
int split_make(split *sp, const char *spec, const model_config *cfg, int P, int M, int Bm, int T, char *err,
               size_t errlen);
/* The same over P ranks x V chunks (P V stages, stage s on rank s mod P): an explicit spec
 * gives P V counts; "auto" (V > 1) balances the ranks' loads (each the sum of its chunks),
 * then each rank's stages; V = 1 is split_make. */
int split_make_chunks(split *sp, const char *spec, const model_config *cfg, int P, int V, int M, int Bm, int T,
                      char *err, size_t errlen);
/* The same with the stages placed by `place` (sched.h's SCHED_PLACE_*: a rank's load is the
 * sum of the stages the placement gives it; the V shape puts the embedding and the head both
 * on rank 0); split_make_chunks is place = SCHED_PLACE_LOOP. */
int split_make_placed(split *sp, const char *spec, const model_config *cfg, int P, int V, int place, int M, int Bm,
                      int T, char *err, size_t errlen);
void split_free(split *sp);
/* Estimated forward FLOPs per token of stage s. */
double split_stage_flops(const split *sp, const model_config *cfg, int s, int T);
/* Parameters held by stage s (the tied wte counted on both first and last stage). */
size_t split_stage_params(const split *sp, const model_config *cfg, int s);
/* Estimated activation bytes of one micro-batch slot of Bm x T on stage s. */
size_t split_stage_act_bytes(const split *sp, const model_config *cfg, int s, int Bm, int T);
/* "[3,3,2]" for metrics. */
void split_write_json(const split *sp, FILE *out);

#endif
