/*
 * cpu_moe.h — the CPU backend's mixture-of-experts ops (backend_ops.h: moe_gather,
 * moe_combine, moe_rowdot): the row permutations of a sparse layer's dispatch and combine.
 * Each output row depends on its own inputs only and sums in a fixed order, so the bits do
 * not depend on the thread count.
 */
#ifndef PIPELM_CPU_MOE_H
#define PIPELM_CPU_MOE_H

int cpu_moe_gather(float *out, const float *x, const int *rows, const float *scale, int M, int C);
int cpu_moe_combine(float *out, const float *y, const int *slot, const float *w, int N, int K, int C);
int cpu_moe_rowdot(float *dw, const float *dout, const float *y, const int *slot, int N, int K, int C);

#endif
