/*
 * backend_prof.h — a backend that times another: every op of the wrapped table runs as
 * before and its wall time is added to its class (matmul, attention, norm/GELU/residual,
 * loss, optimizer, memory: the classes backend_ops.h gives), so a benchmark can say where a
 * step goes. Same results, bit for bit; the cost is two clock reads and two synchronize calls
 * per op (the backend's queued work is waited for, so a device backend's time is its kernels'),
 * which return at once on a host backend. One wrapped backend per process.
 */
#ifndef PIPELM_BACKEND_PROF_H
#define PIPELM_BACKEND_PROF_H

#include "pipelm/backend.h"

enum { PROF_MATMUL, PROF_ATTENTION, PROF_ELEMENTWISE, PROF_LOSS, PROF_OPTIMIZER, PROF_MEMORY, PROF_NCLASS };
extern const char *const prof_class_name[PROF_NCLASS];

/* The timing wrapper around inner (its name is inner's). */
const backend *backend_profiled(const backend *inner);
/* Seconds per class since the last reset, and the number of calls. */
void backend_prof_read(double secs[PROF_NCLASS], long calls[PROF_NCLASS]);
void backend_prof_reset(void);

#endif
