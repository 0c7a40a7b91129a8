/*
 * backend_prof.c — the timing wrapper of backend_prof.h: one forwarding function per op of
 * backend_ops.h's list (generated from it: no op is named here), each adding its wall time to
 * the op's class.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <time.h>
#include "backend/backend_prof.h"

const char *const prof_class_name[PROF_NCLASS] = {
    "matmul", "attention", "norm/GELU/residual/embedding", "loss", "optimizer", "memory",
};

static const backend *in;                 /* the wrapped backend */
static backend prof;                      /* its timed copy */
static double prof_s[PROF_NCLASS];
static long prof_n[PROF_NCLASS];

static double prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* One forwarding function: time in->OP(args) into class CLS. The clock is read after the
 * backend's queued work is done (synchronize), on both sides, so that a device backend's
 * op is timed, not its launch; a host backend's synchronize returns at once. A device backend
 * that records events could time the op on its own stream instead, without the waits. */
#define TIMED(OP, CLS, PARAMS, ARGS)                                                     \
    static int prof_##OP PARAMS {                                                        \
        int rc = in->synchronize();                                                      \
        if (rc) return rc;                                                               \
        double t0 = prof_now();                                                          \
        rc = in->OP ARGS;                                                                \
        if (!rc) rc = in->synchronize();                                                 \
        prof_s[CLS] += prof_now() - t0;                                                  \
        prof_n[CLS]++;                                                                   \
        return rc;                                                                       \
    }

/* The wrappers, from backend_ops.h: every compute op, and the memory ops of class MEMORY
 * (copies); the others (alloc, free, map, unmap, synchronize) are the inner backend's own. */
#define TIMED_MEM_MEMORY(name, params, args) TIMED(name, PROF_MEMORY, params, args)
#define TIMED_MEM_NONE(name, params, args)
#define PL_MEM_OP(ret, name, params, args, cls) TIMED_MEM_##cls(name, params, args)
#define PL_COMPUTE_OP(ret, name, params, args, cls) TIMED(name, PROF_##cls, params, args)
#include "pipelm/backend_ops.h"

const backend *backend_profiled(const backend *inner) {
    in = inner;
    prof = *inner; /* name, memory, map, threads: unchanged */
#define SET_MEM_MEMORY(name) prof.name = prof_##name;
#define SET_MEM_NONE(name)
#define PL_MEM_OP(ret, name, params, args, cls) SET_MEM_##cls(name)
#define PL_COMPUTE_OP(ret, name, params, args, cls) prof.name = prof_##name;
#include "pipelm/backend_ops.h"
    backend_prof_reset();
    return &prof;
}

void backend_prof_read(double secs[PROF_NCLASS], long calls[PROF_NCLASS]) {
    for (int i = 0; i < PROF_NCLASS; i++) {
        secs[i] = prof_s[i];
        if (calls) calls[i] = prof_n[i];
    }
}

void backend_prof_reset(void) {
    for (int i = 0; i < PROF_NCLASS; i++) prof_s[i] = 0, prof_n[i] = 0;
}
