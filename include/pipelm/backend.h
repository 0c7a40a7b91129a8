/*
 * backend.h — the compute backend (interface v2): a table of function pointers, chosen once
 * at start-up from the registry (backend.c), in the manner of ior's aiori and libfabric's hmem.
 *
 * Model code allocates every tensor through a backend and only passes those pointers back to
 * the backend's ops; it never dereferences them (a GPU backend's pointers are device memory).
 * Every op and memory call returns a status: 0, or PL_EBACKEND / PL_ENOMEM with the backend's
 * own message in be->error() (the library's text: "cudaMalloc: out of memory", a oneDNN
 * status), so a failure reaches the agreed abort instead of a silent wrong result. Values
 * cross the boundary with to_host/from_host, or through map/unmap, which give MPI and file I/O
 * a host view of backend memory: a host-memory backend hands out its own pointer, a device
 * backend stages through a pinned host buffer. Tensors are fp32 in every backend; a backend's
 * precision (PL_PREC_BF16) says what its matmuls multiply (bf16 inputs, fp32 accumulation),
 * while master weights, moments, norm statistics, softmax and loss stay fp32.
 * The CPU backend ("cpu": OpenBLAS for every matmul, OpenMP C loops for the rest) is always
 * built and is the reference the others are tested against. Every op is deterministic: the
 * same inputs and thread count give bit-identical outputs. Shapes follow llm.c's alphabet:
 * N rows (= B*T tokens), C channels, OC output channels, NH heads, T sequence length, V
 * vocabulary (Vp padded). Plain C, no MPI, so CUDA translation units can include it.
 */
#ifndef PIPELM_BACKEND_H
#define PIPELM_BACKEND_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Precision of a backend's matrix products. */
enum { PL_PREC_FP32 = 0, PL_PREC_BF16 = 1 };
/* map/unmap modes: READ gives a host view holding the data; WRITE a host buffer whose
 * contents are copied into backend memory by unmap. */
enum { PL_MAP_READ = 1, PL_MAP_WRITE = 2 };

/* What a backend is set up with (from the command line). */
typedef struct {
    int precision;   /* PL_PREC_* */
    int threads;     /* host threads for the backend's own loops and libraries */
    int device;      /* accelerator ordinal for device backends (-1: the local rank's) */
    int local_rank;  /* this rank's index among the job's ranks on its node, when local_ranks > 0 */
    int local_ranks; /* the job's ranks on this node (MPI_Comm_split_type); 0: unknown, ask the launcher */
} backend_options;

typedef struct backend {
    const char *name;        /* "cpu", "onednn", "cuda" */
    int host_memory;         /* 1: pointers are host memory (map is free, MPI may use them) */
    /* 0, or non-zero with a message in err: the backend cannot run here (no GPU, no bf16
     * support, a precision it does not offer). */
    int (*init)(const backend_options *opt, char *err, size_t errlen);
    void (*finalize)(void);
    /* The backend's message for its last failed call ("" if none). */
    const char *(*error)(void);
    /* One line for the banner: library, kernel or ISA, device, precision. */
    void (*describe)(char *buf, size_t len);
    int (*set_threads)(int n);
    int (*get_threads)(void);

    /* Memory. alloc zero-fills; free(NULL) is a no-op. */
    int (*alloc)(void **p, size_t bytes);
    void (*free)(void *p);
    int (*to_host)(void *dst, const void *src, size_t bytes);
    int (*from_host)(void *dst, const void *src, size_t bytes);
    int (*copy)(void *dst, const void *src, size_t bytes);
    int (*zero)(void *p, size_t bytes);
    /* Host view of [p, p+bytes) for MPI or I/O, valid until unmap (same p, bytes, mode). */
    int (*map)(void **host, void *p, size_t bytes, int mode);
    int (*unmap)(void *host, void *p, size_t bytes, int mode);

    /* out(N,C) = wte[tok] + wpe[t], t = row % T. tok is backend memory. */
    int (*encoder_fwd)(float *out, const int *tok, const float *wte, const float *wpe,
                       int N, int T, int C);
    /* dwte[tok] += dout, dwpe[t] += dout, rows in order (a weight gradient). */
    int (*encoder_bwd)(float *dwte, float *dwpe, const float *dout, const int *tok,
                       int N, int T, int C);
    /* out = (x - mean) * rstd * w + b per row; saves mean, rstd (N). eps 1e-5. */
    int (*layernorm_fwd)(float *out, float *mean, float *rstd, const float *inp,
                         const float *w, const float *b, int N, int C);
    /* Input part of the backward: dinp += dL/dx (accumulating). */
    int (*layernorm_bwd_input)(float *dinp, const float *dout, const float *inp, const float *w,
                               const float *mean, const float *rstd, int N, int C);
    /* Weight part: dw += sum_rows dout * xhat, db += sum_rows dout (rows in order). */
    int (*layernorm_bwd_weight)(float *dw, float *db, const float *dout, const float *inp,
                                const float *mean, const float *rstd, int N, int C);
    /* out(N,OC) = inp(N,C) W^T + b, W stored (OC,C); b may be NULL. */
    int (*matmul_fwd)(float *out, const float *inp, const float *w, const float *b,
                      int N, int C, int OC);
    /* Input part: dinp(N,C) = dout(N,OC) W (overwrites). */
    int (*matmul_bwd_input)(float *dinp, const float *dout, const float *w, int N, int C, int OC);
    /* Weight part: dW(OC,C) += dout^T inp; db(OC) += colsum(dout) (db may be NULL). */
    int (*matmul_bwd_weight)(float *dw, float *db, const float *dout, const float *inp,
                             int N, int C, int OC);
    /* Causal multi-head attention. qkv (B,T,3C) = [q|k|v]; att (B,NH,T,T) softmax probs kept
     * for backward; out (B,T,C). Scale 1/sqrt(C/NH). */
    int (*attention_fwd)(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
    /* dqkv (overwrites) from dout, given qkv and att. */
    int (*attention_bwd)(float *dqkv, const float *dout, const float *qkv, const float *att,
                         int B, int T, int C, int NH);
    /* GELU, tanh approximation, elementwise over n. */
    int (*gelu_fwd)(float *out, const float *inp, size_t n);
    /* dinp = gelu'(inp) * dout (overwrites; dinp may alias dout). */
    int (*gelu_bwd)(float *dinp, const float *inp, const float *dout, size_t n);
    /* out = a + b (out may alias a). */
    int (*residual_fwd)(float *out, const float *a, const float *b, size_t n);
    /* dst += src. */
    int (*add_inplace)(float *dst, const float *src, size_t n);
    /* Softmax over the first V of Vp columns of logits(N,Vp), in place -> probs; padded columns
     * set to 0; losses[i] = -log probs[i][targets[i]]. targets is backend memory. */
    int (*crossentropy_fwd)(float *losses, float *logits, const int *targets, int N, int V, int Vp);
    /* In place: probs -> dlogits = (probs - onehot(target)) * dloss; padded columns 0. */
    int (*crossentropy_bwd)(float *probs, const int *targets, float dloss, int N, int V, int Vp);
    /* AdamW on n values, step t >= 1 (bias-corrected), decoupled weight decay wd:
     * m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr (mhat/(sqrt(vhat)+eps) + wd p). */
    int (*adamw)(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                 float b2, float eps, float wd, int t);
    /* *out = sum of squares in double, in a fixed chunked order (same for any threads). */
    int (*sumsq)(const float *x, size_t n, double *out);
    /* x *= s. */
    int (*scale)(float *x, float s, size_t n);

    /* ---- Llama ops ---- */
    /* RMSNorm: out = x * rstd * w per row, rstd = 1/sqrt(mean_c(x^2) + eps), saved (N). */
    int (*rmsnorm_fwd)(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
    /* Input part: dinp += dL/dx (accumulating, like layernorm_bwd_input). */
    int (*rmsnorm_bwd_input)(float *dinp, const float *dout, const float *inp, const float *w,
                             const float *rstd, int N, int C);
    /* Weight part: dw += sum over rows (in order) of dout * x * rstd. */
    int (*rmsnorm_bwd_weight)(float *dw, const float *dout, const float *inp, const float *rstd, int N, int C);
    /* Rotary position embedding (Meta Llama / llm.c train_llama3.py: interleaved pairs) on a fused
     * row qkv (N, (NH + 2 NKV) HS) = [q (NH heads) | k (NKV heads) | v (NKV heads)]: in every q and k
     * head, the pair (x[2i], x[2i+1]) at position t = row % T becomes
     * (x0 cos - x1 sin, x0 sin + x1 cos) with cos = fcos[t*(HS/2)+i], sin = fsin[t*(HS/2)+i]
     * (backend memory, T x HS/2, filled by the model); v is copied. out != inp. */
    int (*rope_fwd)(float *out, const float *inp, const float *fcos, const float *fsin,
                    int N, int T, int NH, int NKV, int HS);
    /* Its backward: the inverse rotation of the q and k parts of dout (the transpose), v copied;
     * dinp overwritten, dinp != dout. */
    int (*rope_bwd)(float *dinp, const float *dout, const float *fcos, const float *fsin,
                    int N, int T, int NH, int NKV, int HS);
    /* Causal grouped-query attention over a fused qkv (B, T, (NH + 2 NKV) HS) laid out as above:
     * query head h reads kv head h / (NH / NKV); att (B, NH, T, T) softmax probabilities kept for
     * the backward; out (B, T, NH HS); scale 1/sqrt(HS). NKV == NH is ordinary multi-head attention. */
    int (*attention_gqa_fwd)(float *out, float *att, const float *qkv, int B, int T, int NH, int NKV, int HS);
    /* dqkv (overwrites; the k and v gradients of a shared kv head sum over its query heads in a
     * fixed order, h ascending) from dout, given qkv and att. */
    int (*attention_gqa_bwd)(float *dqkv, const float *dout, const float *qkv, const float *att,
                             int B, int T, int NH, int NKV, int HS);
    /* SwiGLU: out = up * silu(gate), silu(g) = g / (1 + exp(-g)), elementwise over n. */
    int (*swiglu_fwd)(float *out, const float *up, const float *gate, size_t n);
    /* dup = dout * silu(gate), dgate = dout * up * silu'(gate) (both overwritten). */
    int (*swiglu_bwd)(float *dup, float *dgate, const float *dout, const float *up, const float *gate, size_t n);
} backend;

/* The CPU backend (always built). */
extern const backend backend_cpu;

/* Registry (backend.c). Find a backend by name; NULL if unknown or not built. */
const backend *backend_find(const char *name);
/* Comma-separated names of the backends built into this binary ("cpu,onednn"). */
const char *backend_list(void);
/* Parse "fp32" / "bf16" into *prec; 0 or -1. */
int backend_parse_precision(const char *s, int *prec);
const char *backend_precision_name(int prec);

/* Test-only fault injection: the k-th allocation from now (1 = the next) fails with
 * PL_ENOMEM in every backend that calls backend_alloc_should_fail(); 0 disarms. Armed from
 * PIPELM_FAIL_ALLOC=k at start-up. */
void backend_fail_alloc_after(long k);
int backend_alloc_should_fail(void);

#ifdef __cplusplus
}
#endif
#endif
