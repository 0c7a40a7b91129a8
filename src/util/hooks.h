/*
 * hooks.h — every test hook of pipelm in one place: the faults and delays the tests inject
 * to prove that a failure ends every rank, that a straggler is named, that an async save
 * waits for its copy. None of them is for users: they are not in any --help, and
 * docs/testing.md ("Test hooks") lists each with the tests that use it.
 *
 * Two kinds:
 *   - the run's, from the command line (--fail-rank, --fail-step, --fail-at, --slow-rank,
 *     --slow-ms), in pl_hooks (pl_options.hooks): hooks_fail_here asks whether this rank
 *     fails here and now;
 *   - the process's, from the environment (PIPELM_FAIL_ALLOC, PIPELM_CKPT_FAIL, ...), read
 *     through hooks_env, which knows every one of them by name (a name not in its table is a
 *     bug: it returns NULL and says so on stderr), so this file is their only list.
 */
#ifndef PIPELM_HOOKS_H
#define PIPELM_HOOKS_H

/* The run's injected faults (the options' defaults: none). */
typedef struct {
    int fail_rank, fail_step; /* world rank that fails (-1: none) at this step (0: set-up) */
    char fail_at[16];         /* before | during | after (the step) | save | nan | stall | tp | tp-kill | cp | cp-kill */
    int slow_rank;            /* pipeline rank whose every F, B, I and W runs slow_ms longer (-1: none) */
    double slow_ms;
} pl_hooks;

/* No fault, no straggler. */
void hooks_defaults(pl_hooks *h);
/* 1 when world rank wrank fails at step `step`, at `where` (one of fail_at's values). */
int hooks_fail_here(const pl_hooks *h, int wrank, int step, const char *where);
/* The value of a test-only environment variable (NULL: not set); name must be in the table
 * of hooks.c. */
const char *hooks_env(const char *name);

#endif
