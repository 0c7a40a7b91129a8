/*
 * hparams.h — the optimizer's hyper-parameters, in one struct: read from the command line
 * and config files (config.h: pl_options.hp), used by the optimizer (optim.h: AdamW and the
 * learning-rate schedule) and recorded in checkpoints (ckpt.h: ckpt_meta.hp; the attributes
 * /optim/beta1, beta2, eps, weight_decay and /train/lr, min_lr, warmup_steps, total_steps,
 * lr_schedule, grad_clip of docs/formats.md §2). Copied by assignment wherever it travels.
 */
#ifndef PIPELM_HPARAMS_H
#define PIPELM_HPARAMS_H

typedef struct {
    double lr, min_lr;          /* peak learning rate; the end of the cosine schedule */
    int warmup_steps;           /* linear warm-up to lr */
    int total_steps;            /* the run's optimizer steps (--steps): where the schedule ends */
    char lr_schedule[16];       /* cosine | constant (after the warm-up) */
    double beta1, beta2, eps;   /* AdamW */
    double weight_decay;        /* decoupled, on the decay group (2-D weights) only */
    double grad_clip;           /* global gradient-norm limit; 0: no clipping */
} optim_hparams;

#endif
