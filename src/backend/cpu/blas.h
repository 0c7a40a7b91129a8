/*
 * blas.h — which OpenBLAS kernel pipelm runs on, chosen before the library is first used.
 *
 * OpenBLAS picks its kernel from the CPU model when it loads; a model it does not know
 * (Debian's 0.3.21 on Intel family 6 model 207, Emerald/Sapphire Rapids) falls back to the
 * SSE3 "Prescott" kernel, 4-5x slower than the AVX-512 one the CPU can run. The choice is
 * read from OPENBLAS_CORETYPE when the library loads, before main, so blas_choose_kernel
 * re-executes the program once, before MPI starts, with the variable set to the best kernel
 * the CPU's features allow. A kernel the user or the site set in OPENBLAS_CORETYPE always
 * wins, and a CPU OpenBLAS recognised is left alone. --blas-auto 0 (or PIPELM_BLAS_AUTO=0) turns
 * this off.
 */
#ifndef PIPELM_BLAS_H
#define PIPELM_BLAS_H

/* Call first thing in main (before MPI_Init): may not return (re-executes argv[0]). enabled: the
 * run's --blas-auto (0: leave the library's kernel). */
void blas_choose_kernel(char **argv, int enabled);
/* The kernel in use ("Cooperlake") and how it came to be ("chosen by pipelm for AVX512-BF16",
 * "OPENBLAS_CORETYPE set by the user", "detected by OpenBLAS"). */
const char *blas_kernel(void);
const char *blas_kernel_origin(void);
/* The library's threading: "OpenMP" (one runtime with pipelm's loops), "pthreads", "sequential". */
const char *blas_flavour(void);

#endif
