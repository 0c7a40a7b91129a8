/*
 * args.c — a subcommand's own options, read the one way (args.h).
 */
#include <stdio.h>
#include <string.h>
#include "util/args.h"
#include "util/common.h"

/* The index of the option word w ("--name" or "--name=value") in names, -1 for --help, or
 * -2 when it is none of them. */
static int args_find(const char *w, const char *const *names, int n) {
    size_t len = strcspn(w + 2, "=");
    if (len == 4 && strncmp(w + 2, "help", 4) == 0 && !w[6]) return -1;
    for (int k = 0; k < n; k++)
        if (strlen(names[k]) == len && strncmp(w + 2, names[k], len) == 0) return k;
    return -2;
}

int args_check_names(int argc, char **argv, int first, const char *const *names, int n, const char *cmd,
                     char *err, size_t errlen) {
    for (int i = first; i < argc; i++) {
        const char *w = argv[i];
        if (strcmp(w, "--") == 0) return PL_OK;
        if (strncmp(w, "--", 2) != 0) continue;
        if (args_find(w, names, n) == -2) {
            size_t len = strcspn(w, "=");
            snprintf(err, errlen, "unknown option '%.*s' for %s (see pipelm %s --help)", (int)(len > 80 ? 80 : len), w,
                     cmd, cmd);
            return PL_EINVAL;
        }
        /* the next word is this option's value unless it is an option itself */
        if (!strchr(w, '=') && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) i++;
    }
    return PL_OK;
}

int args_next(int argc, char **argv, int *i, const char *const *names, int n, const char *cmd, int *which,
              const char **val, char *err, size_t errlen) {
    const char *w = argv[*i];
    *val = NULL;
    if (strncmp(w, "--", 2) != 0) {
        snprintf(err, errlen, "%s: unexpected argument '%.80s' (options start with --; see pipelm %s --help)", cmd, w,
                 cmd);
        return PL_EINVAL;
    }
    if ((*which = args_find(w, names, n)) == -2) return args_check_names(*i + 1, argv, *i, names, n, cmd, err, errlen);
    if (*which == -1) return PL_OK;
    const char *eq = strchr(w, '=');
    if (eq) *val = eq + 1;
    else if (*i + 1 < argc && strncmp(argv[*i + 1], "--", 2) != 0) *val = argv[++*i];
    if (!*val) {
        snprintf(err, errlen, "%s: option --%s needs a value%s", cmd, names[*which], *i + 1 < argc ? " (the next word "
                 "is an option: a value that starts with -- is given as --name=--value)" : "");
        return PL_EINVAL;
    }
    if (!(*val)[0]) {
        snprintf(err, errlen, "%s: option --%s has an empty value", cmd, names[*which]);
        return PL_EINVAL;
    }
    return PL_OK;
}
