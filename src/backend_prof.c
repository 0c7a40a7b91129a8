/*
 * backend_prof.c — the timing wrapper of backend_prof.h: one forwarding function per op,
 * each adding its wall time to the op's class.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <time.h>
#include "pipelm/backend_prof.h"

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

/* One forwarding function: time in->OP(args) into class CLS. */
#define TIMED(OP, CLS, PARAMS, ARGS)                                                     \
    static int prof_##OP PARAMS {                                                        \
        double t0 = prof_now();                                                          \
        int rc = in->OP ARGS;                                                            \
        prof_s[CLS] += prof_now() - t0;                                                  \
        prof_n[CLS]++;                                                                   \
        return rc;                                                                       \
    }

TIMED(to_host, PROF_MEMORY, (void *d, const void *s, size_t n), (d, s, n))
TIMED(from_host, PROF_MEMORY, (void *d, const void *s, size_t n), (d, s, n))
TIMED(copy, PROF_MEMORY, (void *d, const void *s, size_t n), (d, s, n))
TIMED(zero, PROF_MEMORY, (void *p, size_t n), (p, n))
TIMED(encoder_fwd, PROF_ELEMENTWISE, (float *o, const int *t, const float *we, const float *wp, int N, int T, int C),
      (o, t, we, wp, N, T, C))
TIMED(encoder_bwd, PROF_ELEMENTWISE, (float *dwe, float *dwp, const float *d, const int *t, int N, int T, int C),
      (dwe, dwp, d, t, N, T, C))
TIMED(layernorm_fwd, PROF_ELEMENTWISE, (float *o, float *m, float *r, const float *x, const float *w, const float *b,
      int N, int C), (o, m, r, x, w, b, N, C))
TIMED(layernorm_bwd_input, PROF_ELEMENTWISE, (float *dx, const float *d, const float *x, const float *w,
      const float *m, const float *r, int N, int C), (dx, d, x, w, m, r, N, C))
TIMED(layernorm_bwd_weight, PROF_ELEMENTWISE, (float *dw, float *db, const float *d, const float *x, const float *m,
      const float *r, int N, int C), (dw, db, d, x, m, r, N, C))
TIMED(matmul_fwd, PROF_MATMUL, (float *o, const float *x, const float *w, const float *b, int N, int C, int OC),
      (o, x, w, b, N, C, OC))
TIMED(matmul_bwd_input, PROF_MATMUL, (float *dx, const float *d, const float *w, int N, int C, int OC),
      (dx, d, w, N, C, OC))
TIMED(matmul_bwd_weight, PROF_MATMUL, (float *dw, float *db, const float *d, const float *x, int N, int C, int OC),
      (dw, db, d, x, N, C, OC))
TIMED(attention_fwd, PROF_ATTENTION, (float *o, float *a, const float *q, int B, int T, int C, int NH),
      (o, a, q, B, T, C, NH))
TIMED(attention_bwd, PROF_ATTENTION, (float *dq, const float *d, const float *q, const float *a, int B, int T, int C,
      int NH), (dq, d, q, a, B, T, C, NH))
TIMED(gelu_fwd, PROF_ELEMENTWISE, (float *o, const float *x, size_t n), (o, x, n))
TIMED(gelu_bwd, PROF_ELEMENTWISE, (float *dx, const float *x, const float *d, size_t n), (dx, x, d, n))
TIMED(residual_fwd, PROF_ELEMENTWISE, (float *o, const float *a, const float *b, size_t n), (o, a, b, n))
TIMED(add_inplace, PROF_ELEMENTWISE, (float *d, const float *s, size_t n), (d, s, n))
TIMED(crossentropy_fwd, PROF_LOSS, (float *l, float *lg, const int *t, int N, int V, int Vp), (l, lg, t, N, V, Vp))
TIMED(crossentropy_bwd, PROF_LOSS, (float *p, const int *t, float dl, int N, int V, int Vp), (p, t, dl, N, V, Vp))
TIMED(adamw, PROF_OPTIMIZER, (float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2,
      float eps, float wd, int t), (p, g, m, v, n, lr, b1, b2, eps, wd, t))
TIMED(sumsq, PROF_OPTIMIZER, (const float *x, size_t n, double *out), (x, n, out))
TIMED(scale, PROF_OPTIMIZER, (float *x, float s, size_t n), (x, s, n))
/* the Llama ops: RMSNorm, RoPE (an elementwise rotation) and SwiGLU with the norms and GELU,
 * grouped-query attention with attention */
TIMED(rmsnorm_fwd, PROF_ELEMENTWISE, (float *o, float *r, const float *x, const float *w, int N, int C, float eps),
      (o, r, x, w, N, C, eps))
TIMED(rmsnorm_bwd_input, PROF_ELEMENTWISE, (float *dx, const float *d, const float *x, const float *w, const float *r,
      int N, int C), (dx, d, x, w, r, N, C))
TIMED(rmsnorm_bwd_weight, PROF_ELEMENTWISE, (float *dw, const float *d, const float *x, const float *r, int N, int C),
      (dw, d, x, r, N, C))
TIMED(rope_fwd, PROF_ELEMENTWISE, (float *o, const float *x, const float *fc, const float *fs, int N, int T, int NH,
      int NKV, int HS), (o, x, fc, fs, N, T, NH, NKV, HS))
TIMED(rope_bwd, PROF_ELEMENTWISE, (float *dx, const float *d, const float *fc, const float *fs, int N, int T, int NH,
      int NKV, int HS), (dx, d, fc, fs, N, T, NH, NKV, HS))
TIMED(attention_gqa_fwd, PROF_ATTENTION, (float *o, float *a, const float *q, int B, int T, int NH, int NKV, int HS),
      (o, a, q, B, T, NH, NKV, HS))
TIMED(attention_gqa_bwd, PROF_ATTENTION, (float *dq, const float *d, const float *q, const float *a, int B, int T,
      int NH, int NKV, int HS), (dq, d, q, a, B, T, NH, NKV, HS))
TIMED(swiglu_fwd, PROF_ELEMENTWISE, (float *o, const float *u, const float *g, size_t n), (o, u, g, n))
TIMED(swiglu_bwd, PROF_ELEMENTWISE, (float *du, float *dg, const float *d, const float *u, const float *g, size_t n),
      (du, dg, d, u, g, n))

const backend *backend_profiled(const backend *inner) {
    in = inner;
    prof = *inner; /* name, memory, map, threads: unchanged */
    prof.to_host = prof_to_host;
    prof.from_host = prof_from_host;
    prof.copy = prof_copy;
    prof.zero = prof_zero;
    prof.encoder_fwd = prof_encoder_fwd;
    prof.encoder_bwd = prof_encoder_bwd;
    prof.layernorm_fwd = prof_layernorm_fwd;
    prof.layernorm_bwd_input = prof_layernorm_bwd_input;
    prof.layernorm_bwd_weight = prof_layernorm_bwd_weight;
    prof.matmul_fwd = prof_matmul_fwd;
    prof.matmul_bwd_input = prof_matmul_bwd_input;
    prof.matmul_bwd_weight = prof_matmul_bwd_weight;
    prof.attention_fwd = prof_attention_fwd;
    prof.attention_bwd = prof_attention_bwd;
    prof.gelu_fwd = prof_gelu_fwd;
    prof.gelu_bwd = prof_gelu_bwd;
    prof.residual_fwd = prof_residual_fwd;
    prof.add_inplace = prof_add_inplace;
    prof.crossentropy_fwd = prof_crossentropy_fwd;
    prof.crossentropy_bwd = prof_crossentropy_bwd;
    prof.adamw = prof_adamw;
    prof.sumsq = prof_sumsq;
    prof.scale = prof_scale;
    prof.rmsnorm_fwd = prof_rmsnorm_fwd;
    prof.rmsnorm_bwd_input = prof_rmsnorm_bwd_input;
    prof.rmsnorm_bwd_weight = prof_rmsnorm_bwd_weight;
    prof.rope_fwd = prof_rope_fwd;
    prof.rope_bwd = prof_rope_bwd;
    prof.attention_gqa_fwd = prof_attention_gqa_fwd;
    prof.attention_gqa_bwd = prof_attention_gqa_bwd;
    prof.swiglu_fwd = prof_swiglu_fwd;
    prof.swiglu_bwd = prof_swiglu_bwd;
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
