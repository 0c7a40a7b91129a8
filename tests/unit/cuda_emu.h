/*
 * cuda_emu.h — a host emulation of the small part of CUDA, cuBLAS and CUB that
 * src/backend/cuda/backend_cuda.cu uses, so that its kernels and host logic run (slowly) on a machine with
 * no GPU: tests/lib/cuda_emu.sh compiles backend_cuda.cu as C++ with -DPIPELM_CUDA_EMU and this
 * header force-included, links it with tests/unit/test_cuda.c and runs the whole test.
 *
 * What it models: every kernel thread is a real thread; a launch runs the grid's blocks one
 * after another, each block's threads at once, with __syncthreads as a barrier of the block and
 * __shfl_down_sync through a barrier of the warp (so a missing barrier or a shuffle reached by
 * part of a warp deadlocks or is caught, instead of passing by luck). __shared__ is a static
 * (blocks run one at a time). Device memory is host memory from malloc, filled with NaN bytes
 * (0xff) so unwritten outputs show; copies check that their device side lies inside an
 * allocation; cublasGemmEx / cublasGemmStridedBatchedEx are column-major loops with cuBLAS's
 * argument checks (leading dimensions), reading bf16 inputs as bf16; the radix sort is a
 * stable sort. Streams are synchronous. EMU_NDEV=0 emulates "no driver".
 * What it cannot model: timing, asynchrony between host and device, the real cuBLAS and CUB
 * code, device limits. It checks logic, not performance or concurrency.
 */
#ifndef PIPELM_CUDA_EMU_H
#define PIPELM_CUDA_EMU_H

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
static thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

/* ---- errors ---- */
typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
};
static cudaError_t emu_last = cudaSuccess;
static inline const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    default: return "unknown error";
    }
}
static inline const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    default: return "cudaErrorUnknown";
    }
}
static inline cudaError_t cudaGetLastError(void) {
    cudaError_t e = emu_last;
    emu_last = cudaSuccess;
    return e;
}
static inline cudaError_t emu_err(cudaError_t e) {
    emu_last = e;
    return e;
}
[[noreturn]] static inline void emu_die(const char *what) {
    fprintf(stderr, "cuda_emu: %s\n", what);
    abort();
}

/* ---- devices ---- */
struct cudaDeviceProp {
    char name[256];
    int major, minor, multiProcessorCount;
    size_t totalGlobalMem;
};
static inline int emu_ndev(void) {
    const char *e = getenv("EMU_NDEV");
    return e ? atoi(e) : 1;
}
static inline cudaError_t cudaGetDeviceCount(int *n) {
    *n = emu_ndev();
    if (*n <= 0) {
        *n = 0;
        return emu_err(cudaErrorInsufficientDriver);
    }
    return cudaSuccess;
}
static int emu_dev = 0;
static inline cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= emu_ndev()) return emu_err(cudaErrorInvalidDevice);
    emu_dev = d;
    return cudaSuccess;
}
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "emulated GPU %d", d);
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 4;
    p->totalGlobalMem = (size_t)1 << 34;
    return cudaSuccess;
}
static inline cudaError_t cudaRuntimeGetVersion(int *v) { *v = 13000; return cudaSuccess; }
static inline cudaError_t cudaDriverGetVersion(int *v) { *v = 13000; return cudaSuccess; }

/* ---- memory ---- */
static std::map<uintptr_t, size_t> &emu_allocs(void) {
    static std::map<uintptr_t, size_t> m;
    return m;
}
#define EMU_MAX_ALLOC ((size_t)1 << 34)
static inline cudaError_t cudaMalloc(void **p, size_t bytes) {
    *p = NULL;
    if (bytes > EMU_MAX_ALLOC) return emu_err(cudaErrorMemoryAllocation);
    void *q = malloc(bytes ? bytes : 1);
    if (!q) return emu_err(cudaErrorMemoryAllocation);
    memset(q, 0xff, bytes); /* NaN: unwritten values show */
    emu_allocs()[(uintptr_t)q] = bytes;
    *p = q;
    return cudaSuccess;
}
template <typename T> static inline cudaError_t cudaMalloc(T **p, size_t bytes) { return cudaMalloc((void **)p, bytes); }
static inline cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    auto it = emu_allocs().find((uintptr_t)p);
    if (it == emu_allocs().end()) emu_die("cudaFree of a pointer cudaMalloc did not return");
    emu_allocs().erase(it);
    free(p);
    return cudaSuccess;
}
static inline cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot) {
    *fr = EMU_MAX_ALLOC;
    *tot = EMU_MAX_ALLOC;
    return cudaSuccess;
}
/* [p, p+n) inside one device allocation */
static inline bool emu_is_dev(const void *p, size_t n) {
    auto &m = emu_allocs();
    auto it = m.upper_bound((uintptr_t)p);
    if (it == m.begin()) return false;
    --it;
    return (uintptr_t)p >= it->first && (uintptr_t)p + n <= it->first + it->second;
}
static inline bool emu_touches_dev(const void *p, size_t n) {
    auto &m = emu_allocs();
    auto it = m.upper_bound((uintptr_t)p + (n ? n - 1 : 0));
    if (it == m.begin()) return false;
    --it;
    return (uintptr_t)p < it->first + it->second && (uintptr_t)p + n > it->first;
}
static std::map<uintptr_t, size_t> &emu_pinned(void) {
    static std::map<uintptr_t, size_t> m;
    return m;
}
static inline cudaError_t cudaMallocHost(void **p, size_t bytes) {
    void *q = malloc(bytes ? bytes : 1);
    if (!q) return emu_err(cudaErrorMemoryAllocation);
    memset(q, 0xee, bytes);
    emu_pinned()[(uintptr_t)q] = bytes;
    *p = q;
    return cudaSuccess;
}
template <typename T> static inline cudaError_t cudaMallocHost(T **p, size_t bytes) {
    return cudaMallocHost((void **)p, bytes);
}
static inline cudaError_t cudaFreeHost(void *p) {
    if (!emu_pinned().erase((uintptr_t)p)) emu_die("cudaFreeHost of a pointer cudaMallocHost did not return");
    free(p);
    return cudaSuccess;
}
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
struct emu_stream { int dummy; };
struct emu_event { int recorded; };
#define cudaEventDisableTiming 2
static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t) {
    bool dd = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
    bool sd = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
    if (dd ? !emu_is_dev(dst, n) : emu_touches_dev(dst, n)) emu_die("cudaMemcpy: destination on the wrong side");
    if (sd ? !emu_is_dev(src, n) : emu_touches_dev(src, n)) emu_die("cudaMemcpy: source on the wrong side");
    if ((const char *)dst < (const char *)src + n && (const char *)src < (const char *)dst + n && dst != src)
        emu_die("cudaMemcpy: overlapping ranges");
    memcpy(dst, src, n);
    return cudaSuccess;
}
static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) {
    if (!emu_is_dev(p, n)) emu_die("cudaMemset outside a device allocation");
    memset(p, v, n);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamCreate(cudaStream_t *s) { *s = new emu_stream(); return cudaSuccess; }
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) { delete s; return cudaSuccess; }
static inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { *e = new emu_event(); return cudaSuccess; }
static inline cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) { e->recorded = 1; return cudaSuccess; }
static inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e->recorded) emu_die("cudaEventSynchronize on an event never recorded");
    return cudaSuccess;
}

/* ---- device intrinsics ---- */
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }

/* ---- the launch: blocks in order, each block's threads concurrently ---- */
struct emu_block {
    std::unique_ptr<std::barrier<>> bar;
    std::vector<std::unique_ptr<std::barrier<>>> warp_bar;
    std::vector<double> slot; /* shuffle exchange, 8 bytes per thread */
};
static emu_block *emu_cur = NULL;
static thread_local unsigned emu_tid = 0;
static inline void __syncthreads(void) { emu_cur->bar->arrive_and_wait(); }
template <typename T> static inline T __shfl_down_sync(unsigned mask, T v, int o) {
    if (mask != 0xffffffffu) emu_die("__shfl_down_sync with a partial mask");
    unsigned w = emu_tid / 32, lane = emu_tid % 32;
    double *s = &emu_cur->slot[w * 32];
    memcpy(&s[lane], &v, sizeof(T));
    emu_cur->warp_bar[w]->arrive_and_wait();
    T r = v;
    if (lane + o < 32) memcpy(&r, &s[lane + o], sizeof(T));
    emu_cur->warp_bar[w]->arrive_and_wait();
    return r;
}
static long emu_launches = 0;
static inline void emu_launch(dim3 g, dim3 b, const std::function<void()> &f) {
    unsigned nt = b.x * b.y * b.z;
    unsigned long long nb = (unsigned long long)g.x * g.y * g.z;
    if (nt == 0 || nt > 1024 || nb == 0 || g.y > 65535 || g.z > 65535) {
        emu_err(cudaErrorInvalidValue);
        return;
    }
    if (nt % 32) emu_die("a block that is not whole warps (this backend never launches one)");
    emu_launches++;
    emu_block blk;
    blk.bar.reset(new std::barrier<>(nt));
    for (unsigned w = 0; w < nt / 32; w++) blk.warp_bar.emplace_back(new std::barrier<>(32));
    blk.slot.assign(nt, 0.0);
    emu_cur = &blk;
    std::vector<std::thread> th;
    th.reserve(nt);
    for (unsigned t = 0; t < nt; t++)
        th.emplace_back([&, t]() {
            emu_tid = t;
            threadIdx = dim3(t % b.x, t / b.x % b.y, t / (b.x * b.y));
            blockDim = b;
            gridDim = g;
            for (unsigned long long k = 0; k < nb; k++) {
                blockIdx = dim3((unsigned)(k % g.x), (unsigned)(k / g.x % g.y), (unsigned)(k / ((unsigned long long)g.x * g.y)));
                f();
                blk.bar->arrive_and_wait(); /* the next block starts when this one is done */
            }
        });
    for (auto &t : th) t.join();
    emu_cur = NULL;
}
#define LAUNCH(kern, grid, block, ...) emu_launch(dim3(grid), dim3(block), [&]() { kern(__VA_ARGS__); })

/* ---- cuBLAS ---- */
typedef struct emu_blas *cublasHandle_t;
struct emu_blas { int dummy; };
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0 } cublasMath_t;
typedef enum { CUBLAS_ATOMICS_NOT_ALLOWED = 0 } cublasAtomicsMode_t;
static inline const char *cublasGetStatusString(cublasStatus_t s) {
    return s == CUBLAS_STATUS_SUCCESS ? "success" : s == CUBLAS_STATUS_INVALID_VALUE ? "invalid value" : "error";
}
static inline cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = new emu_blas(); return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasDestroy(cublasHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasSetAtomicsMode(cublasHandle_t, cublasAtomicsMode_t) { return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasGetVersion(cublasHandle_t, int *v) { *v = 130000; return CUBLAS_STATUS_SUCCESS; }
static inline float emu_ld(const void *p, cudaDataType_t t, size_t i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* tf32: inputs keep 10 mantissa bits (rounded to nearest) */
static inline float emu_tf32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u;
    memcpy(&f, &u, 4);
    return f;
}
static inline cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                                        int m, int n, int k, const void *alpha, const void *A,
                                                        cudaDataType_t at, int lda, long long sA, const void *B,
                                                        cudaDataType_t bt, int ldb, long long sB, const void *beta,
                                                        void *C, cudaDataType_t ct, int ldc, long long sC, int batch,
                                                        cublasComputeType_t comp, cublasGemmAlgo_t) {
    if (!h || m < 0 || n < 0 || k < 0 || batch < 0 || ct != CUDA_R_32F || at != bt) return CUBLAS_STATUS_INVALID_VALUE;
    int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
    if (lda < std::max(1, arows) || ldb < std::max(1, brows) || ldc < std::max(1, m)) return CUBLAS_STATUS_INVALID_VALUE;
    if (comp == CUBLAS_COMPUTE_32F_FAST_TF32 && at != CUDA_R_32F) return CUBLAS_STATUS_INVALID_VALUE;
    size_t es = at == CUDA_R_32F ? 4 : 2;
    float al = *(const float *)alpha, be = *(const float *)beta;
    for (int q = 0; q < batch; q++) {
        const char *Aq = (const char *)A + (size_t)q * sA * es, *Bq = (const char *)B + (size_t)q * sB * es;
        float *Cq = (float *)C + (size_t)q * sC;
        /* every element the product reads or writes lies in device memory */
        size_t acols = ta == CUBLAS_OP_N ? k : m, bcols = tb == CUBLAS_OP_N ? n : k;
        if (m && n && k) {
            if (!emu_is_dev(Aq, ((acols - 1) * (size_t)lda + arows) * es)) emu_die("gemm: A outside device memory");
            if (!emu_is_dev(Bq, ((bcols - 1) * (size_t)ldb + brows) * es)) emu_die("gemm: B outside device memory");
        }
        if (m && n && !emu_is_dev(Cq, ((size_t)(n - 1) * ldc + m) * 4)) emu_die("gemm: C outside device memory");
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float acc = 0.0f;
                for (int l = 0; l < k; l++) {
                    float a = emu_ld(Aq, at, ta == CUBLAS_OP_N ? (size_t)l * lda + i : (size_t)i * lda + l);
                    float b = emu_ld(Bq, bt, tb == CUBLAS_OP_N ? (size_t)j * ldb + l : (size_t)l * ldb + j);
                    if (comp == CUBLAS_COMPUTE_32F_FAST_TF32) {
                        a = emu_tf32(a);
                        b = emu_tf32(b);
                    }
                    acc += a * b;
                }
                float *c = &Cq[(size_t)j * ldc + i];
                *c = be == 0.0f ? al * acc : al * acc + be * *c; /* beta 0: C is not read */
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType_t at, int lda,
                                          const void *B, cudaDataType_t bt, int ldb, const void *beta, void *C,
                                          cudaDataType_t ct, int ldc, cublasComputeType_t comp, cublasGemmAlgo_t g) {
    return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1,
                                      comp, g);
}

/* ---- CUB ---- */
namespace cub {
struct DeviceRadixSort {
    template <typename K, typename V>
    static cudaError_t SortPairs(void *tmp, size_t &bytes, const K *kin, K *kout, const V *vin, V *vout, int n,
                                 int = 0, int = (int)sizeof(K) * 8, cudaStream_t = 0) {
        if (!tmp) {
            bytes = 64 + (size_t)n * 8; /* as CUB: a size query */
            return cudaSuccess;
        }
        if (!emu_is_dev(tmp, bytes)) emu_die("SortPairs: temporary storage outside device memory");
        std::vector<std::pair<K, V>> v((size_t)n);
        for (int i = 0; i < n; i++) v[i] = {kin[i], vin[i]};
        std::stable_sort(v.begin(), v.end(), [](const std::pair<K, V> &a, const std::pair<K, V> &b) { return a.first < b.first; });
        for (int i = 0; i < n; i++) {
            kout[i] = v[i].first;
            vout[i] = v[i].second;
        }
        return cudaSuccess;
    }
};
} // namespace cub

#endif
