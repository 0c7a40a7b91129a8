/*
 * args.h — reading a subcommand's own options (pipelm schedule, tune, convert) the one way
 * every pipelm command line is read (the option table of cli/config.c reads train's, bench's,
 * eval's and generate's the same way):
 *   - every word that names an option is checked against the subcommand's list before
 *     anything else is read, so an unknown option is refused by name wherever it stands;
 *   - `--name value` and `--name=value` both work;
 *   - a missing or empty value is refused by name, and so is a value that is the next word
 *     and starts with "--" (a value that starts with "--" is given as --name=--value).
 */
#ifndef PIPELM_ARGS_H
#define PIPELM_ARGS_H

#include <stddef.h>

/* Check every option name in argv[first..argc) against names[0..n) (without "--"), up to a
 * bare "--" (what follows belongs to another command). "--help" is always known. PL_OK, or
 * PL_EINVAL with err naming the first unknown option for cmd ("unknown option '--x' for
 * tune (see pipelm tune --help)"). */
int args_check_names(int argc, char **argv, int first, const char *const *names, int n, const char *cmd,
                     char *err, size_t errlen);

/* Read the option at argv[*i]: *which its index in names (-1 for "--help"), *val its value;
 * *i is left on the last word used. PL_OK, or PL_EINVAL with err naming the option. */
int args_next(int argc, char **argv, int *i, const char *const *names, int n, const char *cmd, int *which,
              const char **val, char *err, size_t errlen);

#endif
