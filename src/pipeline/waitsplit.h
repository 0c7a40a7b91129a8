/*
 * waitsplit.h — why a rank waited: the measured MPI wait of a benchmark split into what the
 * schedule itself implies, what a slower peer (a straggler) adds and what the messages take.
 *
 * Three plays of the schedule with sched_predict (sched_cost.h) separate them: with the
 * baseline costs and free messages (the schedule's own wait: its bubble on that rank), with
 * the baseline costs and the measured message cost (+ transfer), and with the measured costs
 * (+ straggler: a stage that ran longer than its baseline). What the plays do not explain (the
 * engine's final send waits, noise) is the remainder, so the four parts add up to the
 * measured wait exactly. The baseline is a costs file measured before (bench --costs-out), or
 * else each stage's measured cost scaled to the median cost per FLOP over the stages, so a
 * stage slower per FLOP than the others stands out. A stage whose actions run more than
 * WAITSPLIT_OVER over their baseline is named as a straggler. Pure bookkeeping, no MPI.
 */
#ifndef PIPELM_WAITSPLIT_H
#define PIPELM_WAITSPLIT_H

#include <stddef.h>
#include "pipeline/sched.h"
#include "pipeline/sched_cost.h"

#define WAITSPLIT_OVER 0.10

typedef struct {
    int P, S;
    double *measured_s, *sched_s, *straggler_s, *transfer_s, *other_s; /* per rank, per step */
    double *over;        /* per stage: its actions' time over the baseline's, as a fraction */
    int worst;           /* the stage furthest over, if over WAITSPLIT_OVER; else -1 */
    char why[512];       /* "stage 2 on rank 2: F and B 18% over cost; ranks 0-1 wait 140 ms for it", or "" */
} wait_split;

/* Split the measured wait (seconds per step, per rank) of schedule s: meas holds the measured
 * per-stage costs, base the baseline (NULL: from meas and flops, the forward FLOPs of each
 * stage), xfer_s a message's cost. PL_OK, or PL_EINVAL / PL_ENOMEM with err. */
int wait_split_compute(const sched *s, const sched_costs *meas, const sched_costs *base, const double *flops,
                       double xfer_s, const double *measured_s, wait_split *out, char *err, size_t errlen);
void wait_split_free(wait_split *w);

#endif
