/*
 * eval.h — `pipelm eval`: the loss of a set of weights (--init FILE, or --resume CKPT or a
 * checkpoint directory) on --data, forward only, through the same stages, schedule
 * micro-batches and --dp replicas as training. It is the trainer's run with nothing trained:
 * the set-up of train.c, then the validation path the trainer reports val_loss with
 * (train_evaluate in run.h), so the loss is the trainer's bit for bit for the same weights,
 * batches and micro-batch count, on any P and D. Also the small helper both eval and
 * generate use to take their own options out of a command line before the common option
 * table (config.h) parses the rest.
 */
#ifndef PIPELM_EVAL_H
#define PIPELM_EVAL_H

#include <mpi.h>
#include <stddef.h>
#include "cli/config.h"
#include "model/model.h"

/* `pipelm eval ...` on comm: exit status (0, 1, 2, 75); *abort_needed as pipelm_main's. */
int eval_main(int argc, char **argv, MPI_Comm comm, int *abort_needed);

/* One option of a subcommand's own: "--name VALUE" or "--name=VALUE"; flag: no value. */
typedef struct {
    const char *name;
    int flag;       /* SUB_VALUE: takes a value; SUB_FLAG: none; SUB_SWITCH: 0/1, bare is 1 */
    char *val;      /* out: the value ("1" for a bare flag or switch), or NULL when not given */
} sub_opt;
enum { SUB_VALUE, SUB_FLAG, SUB_SWITCH };
/* Take the subcommand's own options out of argv[first..argc): the rest (with argv[0] and
 * argv[1] in front) go to *rest (malloc'ed, free it) for config_parse(.., first = 2). Every
 * option name is checked first (config_check_names for subcommand cmd, with these as its own;
 * cmd < 0: the caller checked them): an unknown one is refused by name before any value is read. `--name value` and `--name=value` both work; a missing or
 * empty value is refused by name, and so is a value that is the next word and starts with
 * "--" (a value that starts with "--" is given as --name=--value). */
int sub_opts_take(int argc, char **argv, int first, int cmd, sub_opt *opts, int n, char ***rest, int *nrest,
                  char *err, size_t errlen);
/* A decimal integer option in [lo, hi]; PL_EINVAL naming it otherwise. */
int sub_opt_int(const sub_opt *o, long long lo, long long hi, long long *out, char *err, size_t errlen);

#endif
