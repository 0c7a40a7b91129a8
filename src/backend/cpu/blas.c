/*
 * blas.c — choosing the OpenBLAS kernel by the CPU's features (see blas.h).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backend/cpu/blas.h"

char *openblas_get_corename(void);
int openblas_get_parallel(void);

/* Kernels of OpenBLAS's DYNAMIC_ARCH build older than AVX2: a fallback on a modern CPU. */
static const char *const pre_avx2[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Sandybridge",
                                       "Atom", "Katmai", "Coppermine", "Northwood", "Banias", "Athlon",
                                       "Opteron", "Opteron_SSE3", "Barcelona", "Nano", "Bobcat", "Bulldozer",
                                       "Piledriver", "Steamroller", "Excavator", "Unknown", NULL};

/* The kernel pipelm would choose on this CPU for a library that fell back to `detected`, or
 * NULL to leave it. */
static const char *blas_better_kernel(const char *detected) {
    int weak = 0;
    for (int i = 0; pre_avx2[i]; i++) weak |= detected && strcasecmp(detected, pre_avx2[i]) == 0;
    if (!weak) return NULL;
    __builtin_cpu_init();
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    /* measured on Xeon model 207, sgemm 2048^3 one thread: Prescott 33, SkylakeX 128,
     * Cooperlake 154 GFLOP/s */
    if (avx512 && __builtin_cpu_supports("avx512bf16")) return "Cooperlake";
    if (avx512) return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
    return NULL;
}

void blas_choose_kernel(char **argv, int enabled) {
    if (getenv("PIPELM_REEXECUTED") || !enabled) return;
    int again = 0;
    const char *better = getenv("OPENBLAS_CORETYPE") ? NULL : blas_better_kernel(openblas_get_corename());
    if (better) {
        setenv("OPENBLAS_CORETYPE", better, 1);
        setenv("PIPELM_BLAS_CHOSEN", better, 1); /* for the banner */
        again = 1;
    }
    /* the pthread flavour keeps its own pool beside pipelm's OpenMP threads: OpenMP threads
     * that spin after each loop would steal its cores, so they sleep instead */
    if (openblas_get_parallel() == 1 && !getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
        setenv("PIPELM_WAIT_CHOSEN", "1", 1);
        again = 1;
    }
    if (!again) return;
    setenv("PIPELM_REEXECUTED", "1", 1); /* once */
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) { /* the real path, so the process keeps its name ("pipelm") for ps and pkill */
        self[n] = 0;
        execv(self, argv);
    }
    /* exec failed: carry on as we are (the banner says which kernel runs) */
    if (better) unsetenv("OPENBLAS_CORETYPE");
}

const char *blas_kernel(void) { return openblas_get_corename(); }

const char *blas_kernel_origin(void) {
    const char *chosen = getenv("PIPELM_BLAS_CHOSEN"), *set = getenv("OPENBLAS_CORETYPE");
    if (chosen && set && strcmp(chosen, set) == 0)
        return "chosen by pipelm from the CPU's features (OpenBLAS fell back to an older kernel)";
    if (set) return "OPENBLAS_CORETYPE, set by the user or the site";
    return "detected by OpenBLAS";
}

const char *blas_flavour(void) {
    switch (openblas_get_parallel()) {
    case 0: return "sequential";
    case 1: return "pthreads";
    case 2: return "OpenMP";
    default: return "unknown threading";
    }
}
