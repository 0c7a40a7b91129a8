/*
 * backend_cuda_opts.h — the CUDA backend's settings (--backend-opt KEY=VALUE), each with the
 * environment variable it replaces as its alias. Two files declare the backend: the backend
 * itself (src/backend/cuda/backend_cuda.cu, in the module pipelm_cuda.so) and its loader
 * (src/backend/cuda/backend_cuda_load.c, in every binary), which must check and list the settings before the
 * module is loaded; both take the table from here, so they cannot disagree. Internal to those two.
 */
#ifndef PIPELM_BACKEND_CUDA_OPTS_H
#define PIPELM_BACKEND_CUDA_OPTS_H

#include "pipelm/backend.h"

static const backend_opt_decl backend_cuda_opts[] = {
    {"share", "1: more ranks on a node than GPUs share them (rank r uses device r % count)", "0", "0|1",
     "PIPELM_CUDA_SHARE"},
    {"sync", "1: synchronise after every op, so a failing kernel is named by its own op (slow)", "0", "0|1",
     "PIPELM_CUDA_SYNC"},
    {"tf32", "1: fp32 products may use TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32)", "0", "0|1",
     "PIPELM_CUDA_TF32"},
    {"flash", "1: causal attention by the fused kernels (no T x T products; hs <= 128, T > hs), 0: cuBLAS "
              "products and the softmax kernel", "1", "0|1", "PIPELM_CUDA_FLASH"},
    {NULL, NULL, NULL, NULL, NULL},
};

#endif
