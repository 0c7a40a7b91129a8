/*
 * cpu_moe.c — the CPU backend's mixture-of-experts ops (cpu_moe.h): gather rows into
 * expert-contiguous order, combine the experts' rows back into the tokens' (weighted, in
 * ascending slot order), and the per-assignment dot products of the router weights'
 * gradient. Rows are independent: OpenMP splits them, each row's arithmetic is sequential.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <string.h>
#include "backend/cpu/cpu_moe.h"

/* out(M,C) = x[rows] (scaled per row). */
int cpu_moe_gather(float *out, const float *x, const int *rows, const float *scale, int M, int C) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++) {
        const float *src = x + (size_t)rows[i] * C; // (C)
        float *dst = out + (size_t)i * C;           // (C)
        if (!scale) {
            memcpy(dst, src, (size_t)C * sizeof(float));
            continue;
        }
        float s = scale[i];
        for (int c = 0; c < C; c++) dst[c] = s * src[c];
    }
    return 0;
}

/* out(N,C) += sum_k w[t,k] y[slot[t,k]], k ascending. */
int cpu_moe_combine(float *out, const float *y, const int *slot, const float *w, int N, int K, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * C; // (C)
        for (int k = 0; k < K; k++) {
            int j = slot[(size_t)t * K + k];
            if (j < 0) continue;
            const float *r = y + (size_t)j * C; // (C)
            float s = w ? w[(size_t)t * K + k] : 1.0f;
            for (int c = 0; c < C; c++) o[c] += s * r[c];
        }
    }
    return 0;
}

/* dw(N,K) = dout[t] . y[slot[t,k]], accumulated in double in channel order. */
int cpu_moe_rowdot(float *dw, const float *dout, const float *y, const int *slot, int N, int K, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        const float *d = dout + (size_t)t * C; // (C)
        for (int k = 0; k < K; k++) {
            int j = slot[(size_t)t * K + k];
            double acc = 0.0;
            for (int c = 0; j >= 0 && c < C; c++) acc += (double)d[c] * (double)y[(size_t)j * C + c];
            dw[(size_t)t * K + k] = (float)acc;
        }
    }
    return 0;
}
