/*
 * model_check.h — the one validation of a model's and a run's recorded settings: each range
 * is written once, here; the command line, config files, --init headers and the checkpoint
 * loader all call these, so a setting that trains can always resume. Messages name the
 * setting the way its source does (cfg_naming: an option, a checkpoint attribute, an llm.c
 * header field).
 */
#ifndef PIPELM_MODEL_CHECK_H
#define PIPELM_MODEL_CHECK_H

#include <stddef.h>
#include "model/hparams.h"
#include "model/model.h"

/* The Llama settings of a model, wide (64-bit integers, doubles) so that a file's or the
 * command line's values are checked before anything narrows them. */
typedef struct {
    long long n_head, n_kv_head, multiple_of, use_scaled_rope, ver_major, ver_minor;
    double ffn_mult, norm_eps, rope_theta;
} cfg_llama;

/* The training settings a checkpoint records and its loader checks (64-bit, as read). */
typedef struct {
    optim_hparams hp;        /* the floats and the schedule (its warmup_steps and total_steps are not
                              * read: the 64-bit ones below are) */
    long long warmup_steps, total_steps, batch, seq_len, microbatches;
    long long markov_branch; /* < 0: not recorded */
    int no_run;              /* 1: batch, seq_len, microbatches all 0 (a file no run saved: pipelm convert) */
} cfg_train;

/* The one validation of a model's Llama settings, shared by the command line, config files,
 * --init headers and checkpoint loading (so whatever trains can resume): n-kv-head 1..n-head
 * dividing it, multiple-of 1..2^20, use-scaled-rope 0 or 1, Llama version 3.0..3.1000,
 * ffn-dim-multiplier 0..64 (0 none), norm-eps in (0, 1], rope-theta in (1, 1e30]. */
int config_check_llama(const cfg_llama *l, cfg_naming naming, char *err, size_t errlen);

/* The one validation of the training settings a checkpoint records: lr, min-lr, grad-clip,
 * weight-decay >= 0, beta1 and beta2 in [0, 1), eps > 0 (all finite), the lr schedule,
 * warm-up and total steps 0..INT_MAX, batch >= 1, seq-len 1..the model's max-seq-len,
 * micro-batches 1..batch dividing it, markov-branch 1..vocab-size. model NULL: the model is not
 * known yet (--init), its bounds are checked later. */
int config_check_train(const cfg_train *t, const model_config *model, cfg_naming naming, char *err, size_t errlen);

#endif
