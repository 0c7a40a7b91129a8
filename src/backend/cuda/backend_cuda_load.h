/*
 * backend_cuda_load.h — the CUDA backend as the registry sees it: a table named "cuda" whose
 * init loads the backend from the module pipelm_cuda.so (dlopen) and then becomes the module's
 * table, so a run that does not ask for cuda never maps cuBLAS (half a gigabyte of library
 * whose relocation cost every pipelm process about 0.4 s and 28000 page faults at start-up).
 * A program linked with src/backend/cuda/backend_cuda.cu itself (test_cuda, test_backends, the emulation)
 * uses that copy and loads nothing. The module is looked for at $PIPELM_CUDA_MODULE, next to
 * the executable, and in the installed package library directory, in that order.
 */
#ifndef PIPELM_BACKEND_CUDA_LOAD_H
#define PIPELM_BACKEND_CUDA_LOAD_H

#include "pipelm/backend.h"

/* The registry's "cuda" entry: stubs (every op refuses until init succeeds), the settings of
 * backend_cuda_opts.h; after a successful init, a copy of the backend's own table. */
extern backend backend_cuda_lazy;

#endif
