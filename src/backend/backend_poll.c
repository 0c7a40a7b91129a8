/*
 * backend_poll.c — the polling wrapper of backend_poll.h: one forwarding function per compute
 * op of backend_ops.h's list (generated from it), each calling the hook after the op.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stddef.h>
#include "backend/backend_poll.h"

static const backend *in;          /* the wrapped backend */
static backend polled;             /* its polling copy */
static int (*poll_hook)(void *);
static void *poll_ctx;

/* One forwarding function: in->OP(args), then the hook if one is set and the op succeeded. */
#define POLLED(OP, PARAMS, ARGS)                                                         \
    static int poll_##OP PARAMS {                                                        \
        int rc = in->OP ARGS;                                                            \
        if (!rc && poll_hook) rc = poll_hook(poll_ctx);                                  \
        return rc;                                                                       \
    }
#define PL_COMPUTE_OP(ret, name, params, args, cls) POLLED(name, params, args)
#include "pipelm/backend_ops.h"

/* A copy of inner with its compute ops replaced by the forwarding ones. */
const backend *backend_polled(const backend *inner) {
    in = inner;
    polled = *inner;
#define PL_COMPUTE_OP(ret, name, params, args, cls) polled.name = poll_##name;
#include "pipelm/backend_ops.h"
    return &polled;
}

/* The hook and its context (NULL: none). */
void backend_poll_set(int (*hook)(void *ctx), void *ctx) {
    poll_hook = hook;
    poll_ctx = ctx;
}
