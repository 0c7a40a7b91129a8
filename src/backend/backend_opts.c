/*
 * backend_opts.c — what every backend calls back (backend.h): the precision names, the
 * injected allocation failure of the tests, and the declared options (--backend-opt
 * KEY=VALUE): their check and their values. Apart from the registry (backend.c), so a backend
 * depends on these and the registry on the backends, with no cycle.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pipelm/backend.h"
#include "util/common.h"
#include "util/hooks.h"

int backend_parse_precision(const char *s, int *prec) {
    if (strcmp(s, "fp32") == 0) *prec = PL_PREC_FP32;
    else if (strcmp(s, "bf16") == 0) *prec = PL_PREC_BF16;
    else return -1;
    return 0;
}

const char *backend_precision_name(int prec) { return prec == PL_PREC_BF16 ? "bf16" : "fp32"; }

/* Allocations left before the injected failure; 0 = none armed, -1 = not read yet. */
static long fail_countdown = -1;

void backend_fail_alloc_after(long k) { fail_countdown = k > 0 ? k : 0; }

/* Called by every backend's alloc: 1 when this allocation must fail (PIPELM_FAIL_ALLOC=k
 * makes the k-th allocation of the process fail, for the failure-path tests). */
int backend_alloc_should_fail(void) {
    if (fail_countdown < 0) {
        const char *e = hooks_env("PIPELM_FAIL_ALLOC");
        fail_countdown = e ? atol(e) : 0;
        if (fail_countdown < 0) fail_countdown = 0;
    }
    if (fail_countdown == 0) return 0;
    return --fail_countdown == 0;
}

/* ---- declared options (--backend-opt KEY=VALUE) ---- */

/* The declaration of key in decls, or NULL. */
static const backend_opt_decl *opt_decl(const backend_opt_decl *decls, const char *key, size_t keylen) {
    for (const backend_opt_decl *d = decls; d && d->key; d++)
        if (strlen(d->key) == keylen && strncmp(d->key, key, keylen) == 0) return d;
    return NULL;
}

/* value (vlen bytes) is one of d's '|'-separated choices. */
static int opt_choice_ok(const backend_opt_decl *d, const char *value, size_t vlen) {
    for (const char *c = d->choices; c && *c;) {
        size_t k = strcspn(c, "|");
        if (k == vlen && strncmp(c, value, k) == 0) return 1;
        c += k + (c[k] == '|');
    }
    return !d->choices;
}

/* "share, sync, tf32" for b's options, or "none". */
static void opt_keys(const backend *b, char *buf, size_t len) {
    snprintf(buf, len, "%s", b->opts && b->opts->key ? "" : "none");
    for (const backend_opt_decl *d = b->opts; d && d->key; d++)
        snprintf(buf + strlen(buf), len - strlen(buf), "%s%s=%s", d == b->opts ? "" : ", ", d->key,
                 d->choices ? d->choices : "VALUE");
}

int backend_opts_check(const backend *b, const char *s, char *err, size_t errlen) {
    for (const char *p = s ? s : ""; *p;) {
        size_t n = strcspn(p, ","), k = strcspn(p, "=");
        if (k > n) k = n;
        const backend_opt_decl *d = k < n ? opt_decl(b->opts, p, k) : NULL;
        if (!d || !opt_choice_ok(d, p + k + 1, n - k - 1)) {
            char keys[256];
            opt_keys(b, keys, sizeof keys);
            snprintf(err, errlen, "--backend-opt '%.*s': %s (backend %s takes: %s)", (int)(n < 64 ? n : 64), p,
                     k == n ? "not KEY=VALUE" : !d ? "unknown key" : "bad value", b->name, keys);
            return PL_EINVAL;
        }
        p += n + (p[n] == ',');
    }
    return PL_OK;
}

const char *backend_opt_get(const backend_opt_decl *decls, const backend_options *o, const char *key, char *buf,
                            size_t len) {
    const backend_opt_decl *d = opt_decl(decls, key, strlen(key));
    const char *found = NULL;
    size_t flen = 0;
    for (const char *p = o && o->settings ? o->settings : ""; *p;) {
        size_t n = strcspn(p, ","), k = strcspn(p, "=");
        if (k < n && k == strlen(key) && strncmp(p, key, k) == 0) found = p + k + 1, flen = n - k - 1;
        p += n + (p[n] == ',');
    }
    const char *env = d && d->env ? getenv(d->env) : NULL;
    if (found) snprintf(buf, len, "%.*s", (int)flen, found);
    else snprintf(buf, len, "%s", env && *env ? env : d && d->def ? d->def : "");
    return buf;
}

int backend_opt_flag(const backend_opt_decl *decls, const backend_options *o, const char *key) {
    char v[16];
    return strcmp(backend_opt_get(decls, o, key, v, sizeof v), "1") == 0;
}
