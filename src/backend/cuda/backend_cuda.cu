/*
 * backend_cuda.cu — the CUDA backend ("cuda"): every tensor in device memory, cuBLAS for every
 * matrix product, CUDA kernels for everything else, all on one stream of one device per rank.
 *
 * Device: opt->device when >= 0, else opt->local_rank of opt->local_ranks (the trainer's
 *   MPI_Comm_split_type) when given, else the node-local rank that the launcher exports
 *   (MPI_LOCALRANKID from MPICH's hydra, OMPI_COMM_WORLD_LOCAL_RANK, MV2_COMM_WORLD_LOCAL_RANK,
 *   SLURM_LOCALID, in that order; 0 when none is set). More local ranks than devices is refused
 *   unless --backend-opt share=1 (alias PIPELM_CUDA_SHARE=1; then rank r uses device r % count).
 *   No device, or no driver, is a clean init failure: "no CUDA device: cudaGetDeviceCount:
 *   <CUDA's error string>".
 * Precision: fp32 products through cublasGemmEx with CUBLAS_COMPUTE_32F (TF32 only with
 *   --backend-opt tf32=1, alias PIPELM_CUDA_TF32=1: CUBLAS_COMPUTE_32F_FAST_TF32); bf16: both
 *   inputs of every product (matmuls and the four attention products) converted on the GPU from
 *   the fp32 tensors, round to nearest even with denormals flushed to zero (backend_math.h's
 *   f32_to_bf16, as backend_onednn's conversion), fp32
 *   accumulation (CUBLAS_COMPUTE_32F) and fp32 output. Softmax, LayerNorm, loss, AdamW: fp32.
 * Memory: cudaMalloc, zero-filled; map/unmap stage through pinned host buffers kept in a small
 *   pool (an unmap(WRITE) copies host -> device on the stream and records an event that a later
 *   map of the same buffer waits for). to_host/from_host/map(READ)/sumsq synchronise the stream;
 *   copy/zero and every op are queued on it (stream order), so a failure of a queued kernel is
 *   reported by the next synchronising call, synchronize among them (--backend-opt sync=1,
 *   alias PIPELM_CUDA_SYNC=1, synchronises after every op).
 * Determinism (same bits run after run on the same GPU type; no atomics anywhere):
 *   - products: cuBLAS on one stream with its default CUBLAS_ATOMICS_NOT_ALLOWED;
 *   - row reductions (LayerNorm, softmax, cross-entropy): one block per row, a fixed block size,
 *     per-thread strided sums then a fixed shuffle tree;
 *   - column sums over rows (LayerNorm dw/db, matmul db): fixed chunks of CS_ROWS rows summed in
 *     a fixed order into partials, then the partials of each column in CS_TY strided lanes,
 *     the lanes added in order;
 *   - fused attention (flash=1): one query (or key) row per thread, keys (queries) visited in
 *     increasing order in fixed tiles, each sum in a fixed order;
 *   - embedding gradient: dwpe per (t, c) adds rows t, t+T, ... in order; dwte sorts the token
 *     ids with their row numbers (CUB's radix sort: stable, so the result is unique), then one
 *     block per distinct token adds its rows in increasing row order, as backend_cpu does
 *     (bit-identical to it);
 *   - Llama ops: RMSNorm as LayerNorm (a block per row; dw through the same fixed-chunk column
 *     sums); grouped-query attention repeats each kv head for its query heads, runs the
 *     multi-head products, and sums each kv head's dk, dv over its query heads in ascending h
 *     in one kernel (no atomics); RoPE and SwiGLU are elementwise;
 *   - sum of squares: chunks of 16384 values in double (fixed per-thread order, fixed tree),
 *     then the chunk sums in one block in a fixed order; no launch parameter depends on the
 *     device (SM count) or the timing.
 * Error text: every CUDA and cuBLAS call is checked; error() names the op, its shape, the call
 *   and CUDA's / cuBLAS's own string.
 * Not thread-safe: one caller thread per process, as every backend here.
 * Host code of this file sees only plain C headers (backend.h): no MPI.
 * Files: one translation unit (nvcc needs no relocatable device code), its sections in parts
 *   included below in this order: device code in cuda_kernels.cuh (shared kernels),
 *   cuda_flash.cuh (fused attention), cuda_llama_kernels.cuh (Llama and MoE); this file's host
 *   state, errors, init and memory; the ops in cuda_matmul.cuh, cuda_attention.cuh, cuda_ops.cuh,
 *   cuda_llama.cuh, cuda_kvcache.cuh; the op table at the end of this file.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifndef PIPELM_CUDA_EMU
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cub/device/device_radix_sort.cuh>
/* A kernel launch on the backend's stream. */
#define LAUNCH(kern, grid, block, ...) kern<<<(grid), (block), 0, S.st>>>(__VA_ARGS__)
#endif
#include "pipelm/backend.h"
#include "pipelm/backend_math.h"
#include "pipelm/backend_cuda_opts.h"

/* pipelm/common.h's status codes (that header includes mpi.h, which must stay out of nvcc's
 * view); tests/unit/test_cuda.c checks that they agree. */
enum { CU_EINVAL = 1, CU_ENOMEM = 3, CU_EBACKEND = 11 };

#define LN_EPS 1e-5f
#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define SUMSQ_CHUNK 16384              /* values per partial sum of sumsq (as backend_cpu) */
#define CS_ROWS 64                     /* rows per partial of the column sums */
#define CS_TY 8                        /* row lanes per column in the column-sum blocks */
#define EW_THREADS 256                 /* elementwise kernels */
#define LN_THREADS 256                 /* LayerNorm: one block per row */
#define SM_THREADS 128                 /* causal softmax: one block per row */
#define CE_THREADS 512                 /* cross-entropy: one block per row */
#define SQ_THREADS 256                 /* sum of squares */
#define POOL_MAX_BYTES ((size_t)1 << 30) /* pinned staging kept for reuse, at most */

#include "cuda_kernels.cuh"
#include "cuda_flash.cuh"
#include "cuda_llama_kernels.cuh"

/* ======================================================================================== */
/* host side: state, errors                                                                 */
/* ======================================================================================== */

/* Scratch slots (device memory grown on demand, freed by finalize). */
enum {
    SCR_A, SCR_B,                      /* bf16 inputs of a matmul */
    SCR_Q, SCR_K, SCR_V, SCR_DY,       /* attention: permuted q, k, v, dout (fp32 or bf16) */
    SCR_ATT_T,                         /* attention: att, then dpre, in bf16 */
    SCR_DATT,                          /* attention backward: datt -> dpre (fp32) */
    SCR_Y, SCR_DK, SCR_DV,             /* attention: permuted fp32 results */
    SCR_PART,                          /* column-sum partials */
    SCR_SUMSQ,                         /* sum-of-squares partials */
    SCR_SORT, SCR_KEYS, SCR_ROWS_IN, SCR_ROWS_OUT, /* embedding backward */
    SCR_COPY,                          /* an overlapping copy */
    NSCR
};

typedef struct {
    void *h;          /* pinned host buffer */
    size_t cap;
    int busy;         /* handed out by map, not yet unmapped */
    int pending;      /* ev recorded after a host -> device copy from it */
    cudaEvent_t ev;
} pinned_buf;

static struct {
    int inited;
    int dev, ndev, local_rank, local_size, shared;
    int prec;
    int tf32;
    int sync_each;
    int flash;                         /* 1: the fused attention kernels where they fit */
    int threads;
    cudaStream_t st;
    cublasHandle_t blas;
    cudaDeviceProp prop;
    double *hd;                        /* pinned double for sumsq */
    void *scr[NSCR];
    size_t scr_bytes[NSCR];
    pinned_buf *pool;
    int npool, cappool;
    size_t pool_bytes;
} S;

/* What the current call is (for messages): op name and its shape, formatted only on failure. */
static struct {
    const char *op;
    const char *fmt;
    long long a, b, c, d;
} ctx;

static char cu_errbuf[1024];
static const char *cu_error(void) { return cu_errbuf; }

static int cu_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cu_fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cu_errbuf, sizeof cu_errbuf, fmt, ap);
    va_end(ap);
    return code;
}

/* "op (shape, precision)" of the current call. */
static void ctx_text(char *buf, size_t len) {
    char shape[160] = "";
    if (ctx.fmt) {
        /* ctx.fmt is one of this file's literal formats of %lld conversions */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        snprintf(shape, sizeof shape, ctx.fmt, ctx.a, ctx.b, ctx.c, ctx.d);
#pragma GCC diagnostic pop
    }
    snprintf(buf, len, "%s (%s%s%s)", ctx.op ? ctx.op : "?", shape, shape[0] ? ", " : "",
             S.prec == PL_PREC_BF16 ? "bf16" : S.tf32 ? "fp32, tf32" : "fp32");
}

static int fail_cuda(cudaError_t e, const char *call) {
    char where[256];
    ctx_text(where, sizeof where);
    (void)cudaGetLastError(); /* clear a non-sticky error */
    return cu_fail(e == cudaErrorMemoryAllocation ? CU_ENOMEM : CU_EBACKEND, "cuda backend: %s: %s: %s (%s)",
                   where, call, cudaGetErrorString(e), cudaGetErrorName(e));
}
static int fail_blas(cublasStatus_t s, const char *call) {
    char where[256];
    ctx_text(where, sizeof where);
    return cu_fail(s == CUBLAS_STATUS_ALLOC_FAILED ? CU_ENOMEM : CU_EBACKEND, "cuda backend: %s: %s: %s (status %d)",
                   where, call, cublasGetStatusString(s), (int)s);
}
static int fail_shape(void) {
    char where[256];
    ctx_text(where, sizeof where);
    return cu_fail(CU_EBACKEND, "cuda backend: %s: invalid shape", where);
}

#define CU_TRY(call)                                              \
    do {                                                          \
        cudaError_t cu_e_ = (call);                               \
        if (cu_e_ != cudaSuccess) return fail_cuda(cu_e_, #call); \
    } while (0)
#define BLAS_TRY(call)                                                      \
    do {                                                                    \
        cublasStatus_t cu_s_ = (call);                                      \
        if (cu_s_ != CUBLAS_STATUS_SUCCESS) return fail_blas(cu_s_, #call); \
    } while (0)
#define TRY(call)                      \
    do {                               \
        int cu_rc_ = (call);           \
        if (cu_rc_) return cu_rc_;     \
    } while (0)

/* Start of every entry point: initialised, and what it is for messages. */
#define OP(name, f, x0, x1, x2, x3)                                                          \
    do {                                                                                     \
        ctx.op = (name);                                                                     \
        ctx.fmt = (f);                                                                       \
        ctx.a = (long long)(x0);                                                             \
        ctx.b = (long long)(x1);                                                             \
        ctx.c = (long long)(x2);                                                             \
        ctx.d = (long long)(x3);                                                             \
        if (!S.inited) return cu_fail(CU_EBACKEND, "cuda backend: %s before init", (name)); \
    } while (0)

/* After a launch: the launch's own error; with the sync option also the kernel's. */
static int launched(const char *kern) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return fail_cuda(e, kern);
    if (S.sync_each) {
        e = cudaStreamSynchronize(S.st);
        if (e != cudaSuccess) return fail_cuda(e, kern);
    }
    return 0;
}
#define KERNEL(kern, grid, block, ...)             \
    do {                                           \
        LAUNCH(kern, grid, block, __VA_ARGS__);    \
        TRY(launched(#kern));                      \
    } while (0)

/* Blocks for n elements of a grid-stride kernel (n > 0). */
static unsigned ew_grid(size_t n) {
    size_t g = (n + EW_THREADS - 1) / EW_THREADS;
    return (unsigned)(g > ((size_t)1 << 20) ? ((size_t)1 << 20) : g);
}

/* Scratch slot k of at least bytes. */
static int scratch(int k, size_t bytes, void **p) {
    if (bytes == 0) bytes = 256;
    if (S.scr_bytes[k] < bytes) {
        if (S.scr[k]) CU_TRY(cudaFree(S.scr[k])); /* synchronises: no queued user left */
        S.scr[k] = NULL;
        S.scr_bytes[k] = 0;
        size_t r = (bytes + 255) / 256 * 256;
        cudaError_t e = cudaMalloc(&S.scr[k], r);
        if (e != cudaSuccess) {
            S.scr[k] = NULL;
            char where[256];
            ctx_text(where, sizeof where);
            (void)cudaGetLastError();
            return cu_fail(e == cudaErrorMemoryAllocation ? CU_ENOMEM : CU_EBACKEND,
                           "cuda backend: %s: cudaMalloc of %zu bytes of scratch: %s (%s)", where, r,
                           cudaGetErrorString(e), cudaGetErrorName(e));
        }
        S.scr_bytes[k] = r;
    }
    *p = S.scr[k];
    return 0;
}

/* ======================================================================================== */
/* init, finalize, describe, threads                                                        */
/* ======================================================================================== */

/* A non-negative integer environment variable (a launcher's): 1 and *v, or 0 when unset or
 * malformed. */
static int env_int(const char *name, int *v) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end = NULL;
    long x = strtol(s, &end, 10);
    if (*end || x < 0 || x > 1 << 20) return 0;
    *v = (int)x;
    return 1;
}

/* The node-local rank and size the launcher exported (-1 when unknown), and from where. */
static const char *local_rank_of_env(int *lr, int *ls) {
    static const char *const rank_vars[] = {"MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK",
                                            "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"};
    static const char *const size_vars[] = {"MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                            "MV2_COMM_WORLD_LOCAL_SIZE", NULL};
    *lr = -1;
    *ls = -1;
    for (int i = 0; i < 4; i++)
        if (env_int(rank_vars[i], lr)) {
            if (size_vars[i]) env_int(size_vars[i], ls);
            return rank_vars[i];
        }
    return NULL;
}

static void pool_release_all(void) {
    for (int i = 0; i < S.npool; i++) {
        if (S.pool[i].pending) cudaEventSynchronize(S.pool[i].ev);
        cudaEventDestroy(S.pool[i].ev);
        cudaFreeHost(S.pool[i].h);
    }
    free(S.pool);
    S.pool = NULL;
    S.npool = S.cappool = 0;
    S.pool_bytes = 0;
}

static void cu_finalize(void) {
    if (!S.inited) return;
    cudaStreamSynchronize(S.st);
    for (int k = 0; k < NSCR; k++) {
        if (S.scr[k]) cudaFree(S.scr[k]);
        S.scr[k] = NULL;
        S.scr_bytes[k] = 0;
    }
    pool_release_all();
    if (S.hd) cudaFreeHost(S.hd);
    S.hd = NULL;
    cublasDestroy(S.blas);
    cudaStreamDestroy(S.st);
    S.inited = 0;
}

/* The settings of this backend (--backend-opt): backend_cuda_opts.h's, which the loader
 * (backend_cuda_load.c) declares too before this file is loaded. */
#define cu_opts backend_cuda_opts

/* The device count, or a clean refusal: no driver, no device. */
static int cu_count_devices(int *n, char *err, size_t errlen) {
    *n = 0;
    cudaError_t e = cudaGetDeviceCount(n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(err, errlen, "no CUDA device: cudaGetDeviceCount: %s (%s)%s", cudaGetErrorString(e),
                 cudaGetErrorName(e),
                 e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice
                     ? "; no NVIDIA GPU or driver is visible to this process"
                     : "");
        return CU_EINVAL;
    }
    if (*n <= 0) {
        snprintf(err, errlen, "no CUDA device: cudaGetDeviceCount found none");
        return CU_EINVAL;
    }
    return 0;
}

/* This rank's device among n: opt->device, else the local rank (the trainer's, else the
 * launcher's) modulo n, refused when there are more local ranks than devices and share is 0.
 * *lr, *ls: the local rank and size used (-1: unknown). */
static int cu_pick_device(const backend_options *opt, int n, int share, int *dev, int *lr, int *ls, char *err,
                          size_t errlen) {
    const char *from = NULL;
    *lr = 0;
    *ls = -1;
    if (opt && opt->device >= 0) {
        if (opt->device >= n) {
            snprintf(err, errlen, "backend cuda: device %d asked for, but this node has %d CUDA device%s", opt->device,
                     n, n == 1 ? "" : "s");
            return CU_EINVAL;
        }
        *dev = opt->device;
        return 0;
    }
    if (opt && opt->local_ranks > 0) { /* the trainer's MPI_Comm_split_type(SHARED) */
        *lr = opt->local_rank;
        *ls = opt->local_ranks;
        from = "MPI_Comm_split_type";
    } else if (!(from = local_rank_of_env(lr, ls))) {
        *lr = 0;
        from = "no launcher variable: local rank 0";
    }
    int need = *ls > *lr ? *ls : *lr + 1;
    if (need > n && !share) {
        snprintf(err, errlen,
                 "backend cuda: %d rank%s on this node (local rank %d, from %s%s) but %d CUDA device%s: one device "
                 "per rank, or --backend-opt share=1 (PIPELM_CUDA_SHARE=1) to let ranks share devices",
                 need, need == 1 ? "" : "s", *lr, from,
                 *ls >= 0 && !(opt && opt->local_ranks > 0) ? " and its size variable" : "", n, n == 1 ? "" : "s");
        return CU_EINVAL;
    }
    *dev = *lr % n;
    return 0;
}

/* Device dev made current: its properties, the stream, the pinned double of sumsq, the cuBLAS
 * handle on the stream (default math, no atomics). On failure nothing is left allocated. */
static int cu_setup_device(int dev, char *err, size_t errlen) {
    memset(&S.prop, 0, sizeof S.prop);
    cudaError_t e = cudaSetDevice(dev);
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&S.prop, dev);
    if (e == cudaSuccess) e = cudaStreamCreate(&S.st);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(err, errlen, "backend cuda: setting up device %d: %s (%s)", dev, cudaGetErrorString(e),
                 cudaGetErrorName(e));
        return CU_EINVAL;
    }
    e = cudaMallocHost((void **)&S.hd, sizeof(double));
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cudaStreamDestroy(S.st);
        snprintf(err, errlen, "backend cuda: cudaMallocHost on device %d: %s", dev, cudaGetErrorString(e));
        return CU_EINVAL;
    }
    cublasStatus_t s = cublasCreate(&S.blas);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(S.blas, S.st);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetMathMode(S.blas, CUBLAS_DEFAULT_MATH);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetAtomicsMode(S.blas, CUBLAS_ATOMICS_NOT_ALLOWED);
    if (s != CUBLAS_STATUS_SUCCESS) {
        cudaFreeHost(S.hd);
        S.hd = NULL;
        cudaStreamDestroy(S.st);
        snprintf(err, errlen, "backend cuda: cuBLAS on device %d: %s (status %d)", dev, cublasGetStatusString(s),
                 (int)s);
        return CU_EINVAL;
    }
    return 0;
}

/* Device, stream, cuBLAS handle. May be called again (another precision): the device set-up
 * is kept when the device is the same. The settings (share, sync, tf32) are read each time. */
static int cu_init(const backend_options *opt, char *err, size_t errlen) {
    int prec = opt ? opt->precision : PL_PREC_FP32;
    if (prec != PL_PREC_FP32 && prec != PL_PREC_BF16) {
        snprintf(err, errlen, "backend cuda: unknown precision %d (fp32 or bf16)", prec);
        return CU_EINVAL;
    }
    int n = 0, lr = 0, ls = -1, dev = 0, share = backend_opt_flag(cu_opts, opt, "share");
    TRY(cu_count_devices(&n, err, errlen));
    TRY(cu_pick_device(opt, n, share, &dev, &lr, &ls, err, errlen));
    if (S.inited && S.dev != dev) cu_finalize();
    if (!S.inited) {
        TRY(cu_setup_device(dev, err, errlen));
        S.dev = dev;
        S.ndev = n;
        S.local_rank = lr;
        S.local_size = ls;
        S.shared = share && (ls > n || lr >= n);
        S.inited = 1;
    }
    S.prec = prec;
    S.tf32 = backend_opt_flag(cu_opts, opt, "tf32");
    S.sync_each = backend_opt_flag(cu_opts, opt, "sync");
    S.flash = backend_opt_flag(cu_opts, opt, "flash");
    if (opt && opt->threads > 0) S.threads = opt->threads;
    cu_errbuf[0] = 0;
    return 0;
}

static void cu_describe(char *buf, size_t len) {
    if (!S.inited) {
        snprintf(buf, len, "cuda (not initialised)");
        return;
    }
    int rt = 0, drv = 0, bv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    cublasGetVersion(S.blas, &bv);
    snprintf(buf, len,
             "cuda: device %d of %d %s (sm_%d%d, %d SMs, %.1f GiB)%s, CUDA runtime %d.%d driver %d.%d, cuBLAS %d.%d.%d, "
             "precision %s%s",
             S.dev, S.ndev, S.prop.name, S.prop.major, S.prop.minor, S.prop.multiProcessorCount,
             (double)S.prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), S.shared ? " shared" : "", rt / 1000,
             rt % 1000 / 10, drv / 1000, drv % 1000 / 10, bv / 10000, bv / 100 % 100, bv % 100,
             backend_precision_name(S.prec),
             S.prec == PL_PREC_BF16 ? " (bf16 inputs, fp32 accumulation)" : S.tf32 ? " (TF32 allowed)" : "");
}

/* Host threads play no part in this backend: kept for get_threads. */
static int cu_set_threads(int n) {
    S.threads = n < 1 ? 1 : n;
    return 0;
}
static int cu_get_threads(void) { return S.threads > 0 ? S.threads : 1; }

/* ======================================================================================== */
/* memory                                                                                   */
/* ======================================================================================== */

static int cu_alloc(void **p, size_t bytes) {
    *p = NULL;
    if (backend_alloc_should_fail())
        return cu_fail(CU_ENOMEM, "cuda backend: cudaMalloc of %zu bytes failed (injected by PIPELM_FAIL_ALLOC)", bytes);
    OP("alloc", "%lld bytes", bytes, 0, 0, 0);
    if (bytes == 0) bytes = 256;
    if (bytes > SIZE_MAX - 256) return cu_fail(CU_ENOMEM, "cuda backend: allocation of %zu bytes: too large", bytes);
    size_t r = (bytes + 255) / 256 * 256;
    void *q = NULL;
    cudaError_t e = cudaMalloc(&q, r);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        (void)cudaGetLastError();
        return cu_fail(e == cudaErrorMemoryAllocation ? CU_ENOMEM : CU_EBACKEND,
                       "cuda backend: cudaMalloc of %zu bytes on device %d: %s (%s; %zu of %zu MiB free)", bytes, S.dev,
                       cudaGetErrorString(e), cudaGetErrorName(e), fr >> 20, tot >> 20);
    }
    e = cudaMemsetAsync(q, 0, r, S.st);
    if (e != cudaSuccess) {
        cudaFree(q);
        return fail_cuda(e, "cudaMemsetAsync");
    }
    *p = q;
    return 0;
}

static void cu_free(void *p) {
    if (!p || !S.inited) return;
    cudaError_t e = cudaFree(p); /* synchronises the device first */
    if (e != cudaSuccess) { /* nothing to return: the message stays for error() */
        ctx.op = "free";
        ctx.fmt = NULL;
        fail_cuda(e, "cudaFree");
    }
}

static int cu_to_host(void *dst, const void *src, size_t bytes) {
    OP("to_host", "%lld bytes", bytes, 0, 0, 0);
    if (!bytes) return 0;
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, S.st));
    CU_TRY(cudaStreamSynchronize(S.st));
    return 0;
}
static int cu_from_host(void *dst, const void *src, size_t bytes) {
    OP("from_host", "%lld bytes", bytes, 0, 0, 0);
    if (!bytes) return 0;
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, S.st));
    CU_TRY(cudaStreamSynchronize(S.st)); /* the caller may reuse its buffer at once */
    return 0;
}
/* Device to device, stream-ordered; overlapping ranges go through scratch (memmove). */
static int cu_copy(void *dst, const void *src, size_t bytes) {
    OP("copy", "%lld bytes", bytes, 0, 0, 0);
    if (!bytes || dst == src) return 0;
    const char *d = (const char *)dst, *s = (const char *)src;
    if (d < s + bytes && s < d + bytes) {
        void *tmp = NULL;
        TRY(scratch(SCR_COPY, bytes, &tmp));
        CU_TRY(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, S.st));
        src = tmp;
    }
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, S.st));
    return launched("copy");
}
static int cu_zero(void *p, size_t bytes) {
    OP("zero", "%lld bytes", bytes, 0, 0, 0);
    if (!bytes) return 0;
    CU_TRY(cudaMemsetAsync(p, 0, bytes, S.st));
    return launched("zero");
}

/* A pinned buffer of at least bytes from the pool (the smallest free one that fits), else a
 * new one. A buffer whose last host -> device copy may still run is waited for. */
static int pool_get(size_t bytes, void **host) {
    int best = -1;
    for (int i = 0; i < S.npool; i++)
        if (!S.pool[i].busy && S.pool[i].cap >= bytes && (best < 0 || S.pool[i].cap < S.pool[best].cap)) best = i;
    if (best >= 0) {
        pinned_buf *b = &S.pool[best];
        if (b->pending) {
            CU_TRY(cudaEventSynchronize(b->ev));
            b->pending = 0;
        }
        b->busy = 1;
        *host = b->h;
        return 0;
    }
    if (S.npool == S.cappool) {
        int nc = S.cappool ? 2 * S.cappool : 16;
        pinned_buf *np = (pinned_buf *)realloc(S.pool, sizeof(pinned_buf) * (size_t)nc);
        if (!np) return cu_fail(CU_ENOMEM, "cuda backend: map: out of host memory for the staging pool");
        S.pool = np;
        S.cappool = nc;
    }
    size_t cap = bytes < 4096 ? 4096 : (bytes + 4095) / 4096 * 4096;
    pinned_buf nb;
    memset(&nb, 0, sizeof nb);
    cudaError_t e = cudaMallocHost(&nb.h, cap);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cu_fail(CU_ENOMEM, "cuda backend: map of %zu bytes: cudaMallocHost: %s (%s)", bytes,
                       cudaGetErrorString(e), cudaGetErrorName(e));
    }
    e = cudaEventCreateWithFlags(&nb.ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        cudaFreeHost(nb.h);
        return fail_cuda(e, "cudaEventCreateWithFlags");
    }
    nb.cap = cap;
    nb.busy = 1;
    S.pool[S.npool++] = nb;
    S.pool_bytes += cap;
    *host = nb.h;
    return 0;
}
/* Back to the pool; after a host -> device copy (copied = 1) its event marks when the buffer is
 * free again. Beyond POOL_MAX_BYTES of pinned memory the buffer is released instead. */
static int pool_put(void *host, int copied) {
    for (int i = 0; i < S.npool; i++) {
        pinned_buf *b = &S.pool[i];
        if (b->h != host) continue;
        if (!b->busy) return cu_fail(CU_EBACKEND, "cuda backend: unmap of a staging buffer that is not mapped");
        b->busy = 0;
        if (S.pool_bytes > POOL_MAX_BYTES) {
            if (copied) CU_TRY(cudaStreamSynchronize(S.st));
            CU_TRY(cudaEventDestroy(b->ev));
            CU_TRY(cudaFreeHost(b->h));
            S.pool_bytes -= b->cap;
            S.pool[i] = S.pool[--S.npool];
            return 0;
        }
        if (copied) {
            CU_TRY(cudaEventRecord(b->ev, S.st));
            b->pending = 1;
        }
        return 0;
    }
    return cu_fail(CU_EBACKEND, "cuda backend: unmap of %p: not a buffer handed out by map", host);
}

/* READ: a pinned copy of the device bytes; WRITE: a pinned buffer that unmap copies in. */
static int cu_map(void **host, void *p, size_t bytes, int mode) {
    *host = NULL;
    OP("map", "%lld bytes, mode %lld", bytes, mode, 0, 0);
    if (!(mode & (PL_MAP_READ | PL_MAP_WRITE))) return fail_shape();
    void *h = NULL;
    TRY(pool_get(bytes, &h));
    if ((mode & PL_MAP_READ) && bytes) {
        cudaError_t e = cudaMemcpyAsync(h, p, bytes, cudaMemcpyDeviceToHost, S.st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(S.st);
        if (e != cudaSuccess) {
            pool_put(h, 0);
            return fail_cuda(e, "cudaMemcpyAsync device -> pinned host");
        }
    }
    *host = h;
    return 0;
}
static int cu_unmap(void *host, void *p, size_t bytes, int mode) {
    OP("unmap", "%lld bytes, mode %lld", bytes, mode, 0, 0);
    if (!host) return 0;
    int copied = 0;
    if ((mode & PL_MAP_WRITE) && bytes) {
        cudaError_t e = cudaMemcpyAsync(p, host, bytes, cudaMemcpyHostToDevice, S.st);
        if (e != cudaSuccess) {
            pool_put(host, 0);
            return fail_cuda(e, "cudaMemcpyAsync pinned host -> device");
        }
        copied = 1;
    }
    return pool_put(host, copied);
}

/* Wait for everything queued on the stream: the clock readers' barrier (backend.h). A
 * failure of a queued kernel surfaces here. A profiler wanting per-op device time without the
 * host waits would record cudaEvents around each op instead; not needed yet. */
static int cu_synchronize(void) {
    OP("synchronize", NULL, 0, 0, 0, 0);
    CU_TRY(cudaStreamSynchronize(S.st));
    return 0;
}

#include "cuda_matmul.cuh"
#include "cuda_attention.cuh"
#include "cuda_ops.cuh"
#include "cuda_llama.cuh"
#include "cuda_kvcache.cuh"

extern "C" const backend backend_cuda;
extern "C" const backend backend_cuda = {
    .name = "cuda",
    .host_memory = 0,
    .init = cu_init,
    .finalize = cu_finalize,
    .error = cu_error,
    .describe = cu_describe,
    .set_threads = cu_set_threads,
    .get_threads = cu_get_threads,
    .opts = cu_opts,
    .attention_cols = cu_attention_cols,
    .alloc = cu_alloc,
    .free = cu_free,
    .to_host = cu_to_host,
    .from_host = cu_from_host,
    .copy = cu_copy,
    .zero = cu_zero,
    .map = cu_map,
    .unmap = cu_unmap,
    .synchronize = cu_synchronize,
    .encoder_fwd = cu_encoder_fwd,
    .encoder_bwd = cu_encoder_bwd,
    .layernorm_fwd = cu_layernorm_fwd,
    .layernorm_bwd_input = cu_layernorm_bwd_input,
    .layernorm_bwd_weight = cu_layernorm_bwd_weight,
    .matmul_fwd = cu_matmul_fwd,
    .matmul_bwd_input = cu_matmul_bwd_input,
    .matmul_bwd_weight = cu_matmul_bwd_weight,
    .gelu_fwd = cu_gelu_fwd,
    .gelu_bwd = cu_gelu_bwd,
    .residual_fwd = cu_residual_fwd,
    .add_inplace = cu_add_inplace,
    .crossentropy_fwd = cu_crossentropy_fwd,
    .crossentropy_bwd = cu_crossentropy_bwd,
    .adamw = cu_adamw,
    .sumsq = cu_sumsq,
    .scale = cu_scale,
    .rmsnorm_fwd = cu_rmsnorm_fwd,
    .rmsnorm_bwd_input = cu_rmsnorm_bwd_input,
    .rmsnorm_bwd_weight = cu_rmsnorm_bwd_weight,
    .rope_fwd = cu_rope_fwd,
    .rope_bwd = cu_rope_bwd,
    .attention_gqa_fwd = cu_attention_gqa_fwd,
    .attention_gqa_bwd = cu_attention_gqa_bwd,
    .swiglu_fwd = cu_swiglu_fwd,
    .swiglu_bwd = cu_swiglu_bwd,
    .matmul_decode_fwd = cu_matmul_fwd, /* cuBLAS's product does not repack per call: the same op */
    .attention_kv_fwd = cu_attention_kv_fwd,
    .moe_gather = cu_moe_gather,
    .moe_combine = cu_moe_combine,
    .moe_rowdot = cu_moe_rowdot,
};
