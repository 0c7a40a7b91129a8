/*
 * backend.h — the compute backend: a small table of function pointers, chosen once at start-up.
 *
 * Model code allocates every tensor through a backend and only passes those pointers back to
 * the backend's ops; it never dereferences them (a GPU backend's pointers are device memory).
 * Values cross the boundary with to_host/from_host. The CPU backend ("cpu": OpenBLAS
 * cblas_sgemm for every matmul, OpenMP C loops for the rest) is always built and is the
 * reference the others are tested against. Every op is deterministic: the same inputs give
 * bit-identical outputs run after run. The C loops also give the same bits whatever the
 * thread count, because reductions over rows run in a fixed order; cblas_sgemm products are
 * reproducible only at a fixed OpenBLAS thread count (it may split long sums differently
 * with more threads), so runs compared bit for bit use the same threads per rank. Shapes follow llm.c's alphabet: N rows (= B*T tokens), C channels, OC output
 * channels, NH heads, T sequence length, V vocabulary (Vp padded). Plain C, no MPI, so CUDA
 * translation units can include it.
 */
#ifndef PIPELM_BACKEND_H
#define PIPELM_BACKEND_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct backend {
    const char *name;
    int host_memory;   /* 1 if pointers are host memory that MPI may read and write directly */
    int (*init)(char *err, size_t errlen);   /* 0 ok; non-zero: backend unusable (e.g. no GPU) */
    void (*finalize)(void);

    void *(*alloc)(size_t bytes);            /* zero-filled; NULL on failure */
    void (*free)(void *p);
    void (*to_host)(void *dst, const void *src, size_t bytes);
    void (*from_host)(void *dst, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);
    void (*zero)(void *p, size_t bytes);

    /* Row-major C(M,N) = alpha op(A) op(B) + beta C, op = transpose when trans != 0. */
    void (*sgemm)(int transa, int transb, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc);

    /* out(N,C) = wte[tok] + wpe[t], t = row % T. */
    void (*encoder_fwd)(float *out, const int *tok, const float *wte, const float *wpe,
                        int N, int T, int C);
    /* dwte[tok] += dout, dwpe[t] += dout, rows in order. */
    void (*encoder_bwd)(float *dwte, float *dwpe, const float *dout, const int *tok,
                        int N, int T, int C);
    /* out = (x - mean) * rstd * w + b per row; saves mean, rstd (N). eps 1e-5. */
    void (*layernorm_fwd)(float *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, int N, int C);
    /* dinp += ..., dw += ..., db += ... (accumulating). */
    void (*layernorm_bwd)(float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const float *mean,
                          const float *rstd, int N, int C);
    /* out(N,OC) = inp(N,C) W^T + b, W stored (OC,C); b may be NULL. */
    void (*matmul_fwd)(float *out, const float *inp, const float *w, const float *b,
                       int N, int C, int OC);
    /* dinp = dout W (overwrites; skipped if NULL); dw += dout^T inp; db += colsum(dout). */
    void (*matmul_bwd)(float *dinp, float *dw, float *db, const float *dout,
                       const float *inp, const float *w, int N, int C, int OC);
    /* Causal multi-head attention. qkv (B,T,3C) = [q|k|v]; att (B,NH,T,T) softmax probs kept
     * for backward; out (B,T,C). Scale 1/sqrt(C/NH). */
    void (*attention_fwd)(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
    /* dqkv (overwrites) from dout, given qkv and att. */
    void (*attention_bwd)(float *dqkv, const float *dout, const float *qkv, const float *att,
                          int B, int T, int C, int NH);
    /* GELU, tanh approximation, elementwise over n. */
    void (*gelu_fwd)(float *out, const float *inp, size_t n);
    /* dinp = gelu'(inp) * dout (overwrites). */
    void (*gelu_bwd)(float *dinp, const float *inp, const float *dout, size_t n);
    /* out = a + b (out may alias a). */
    void (*residual_fwd)(float *out, const float *a, const float *b, size_t n);
    /* dst += src. */
    void (*add_inplace)(float *dst, const float *src, size_t n);
    /* Softmax over the first V of Vp columns of logits(N,Vp), in place -> probs; padded columns
     * set to 0; losses[i] = -log probs[i][targets[i]]. */
    void (*crossentropy_fwd)(float *losses, float *logits, const int *targets, int N, int V, int Vp);
    /* In place: probs -> dlogits = (probs - onehot(target)) * dloss; padded columns 0. */
    void (*crossentropy_bwd)(float *probs, const int *targets, float dloss, int N, int V, int Vp);
    /* AdamW on n values, step t >= 1 (bias-corrected), decoupled weight decay wd:
     * m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr (mhat/(sqrt(vhat)+eps) + wd p). */
    void (*adamw)(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                  float b2, float eps, float wd, int t);
    /* Sum of squares in double, in a fixed chunked order (deterministic for any threads). */
    double (*sumsq)(const float *x, size_t n);
    /* x *= s. */
    void (*scale)(float *x, float s, size_t n);
} backend;

/* The CPU backend (always built). */
extern const backend backend_cpu;
/* Find a backend by name ("cpu", "cuda"); NULL if unknown or not built. */
const backend *backend_find(const char *name);
/* Set the CPU thread count used by OpenMP loops and OpenBLAS. */
void backend_cpu_set_threads(int n);
int backend_cpu_get_threads(void);

#ifdef __cplusplus
}
#endif
#endif
