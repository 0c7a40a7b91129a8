/*
 * backend_cuda_load.c — the CUDA backend's loader (backend_cuda_load.h): the registry's "cuda"
 * table, which loads the module on init and then holds the module's table.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backend/cuda/backend_cuda_load.h"
#include "pipelm/backend_cuda_opts.h"
#include "util/common.h"

#ifndef PIPELM_PKGLIBDIR
#define PIPELM_PKGLIBDIR "/usr/local/lib/pipelm"
#endif
#define CUDA_MODULE "pipelm_cuda.so"

/* The backend linked into this program, if it is (weak: NULL where it is not). */
extern const backend backend_cuda __attribute__((weak));

static char load_err[1024];

/* The module's table: the linked one, else the first module found (dlopen'ed once, kept). */
static const backend *load_table(void) {
    if (&backend_cuda) return &backend_cuda;
    char exe[PATH_MAX] = "", here[PATH_MAX + 32] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        snprintf(here, sizeof here, "%s/" CUDA_MODULE, exe);
    }
    /* an explicit module is the only one tried: a wrong path is not replaced by another */
    const char *env = getenv("PIPELM_CUDA_MODULE");
    const char *paths[3] = {NULL, NULL, NULL};
    int np = 0;
    if (env && *env) paths[np++] = env;
    else {
        if (here[0]) paths[np++] = here;
        paths[np++] = PIPELM_PKGLIBDIR "/" CUDA_MODULE;
    }
    size_t off = (size_t)snprintf(load_err, sizeof load_err, "the CUDA backend module could not be loaded: tried");
    for (int i = 0; paths[i]; i++) {
        const char *why = NULL;
        void *h = NULL;
        const backend *t = NULL;
        if (access(paths[i], F_OK) != 0) why = "absent";
        else if (!(h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL))) why = dlerror();
        else if (!(t = dlsym(h, "backend_cuda"))) why = "no backend_cuda table in it";
        if (t) return t;
        if (h) dlclose(h);
        if (off < sizeof load_err)
            off += (size_t)snprintf(load_err + off, sizeof load_err - off, "%s %s (%s)", i ? "," : "", paths[i], why);
    }
    if (off < sizeof load_err)
        snprintf(load_err + off, sizeof load_err - off, "; set PIPELM_CUDA_MODULE to its path, or build with "
                 "./configure --with-cuda (it is built beside the pipelm executable)");
    return NULL;
}

/* init: load the module, become its table, and run its init. */
static int lazy_init(const backend_options *opt, char *err, size_t errlen) {
    const backend *t = load_table();
    if (!t) {
        snprintf(err, errlen, "%s", load_err);
        return PL_EBACKEND;
    }
    backend_cuda_lazy = *t;
    return backend_cuda_lazy.init(opt, err, errlen);
}

static void lazy_finalize(void) {}
static const char *lazy_error(void) { return load_err; }
static void lazy_describe(char *buf, size_t len) { snprintf(buf, len, "cuda: not loaded"); }
static int lazy_set_threads(int n) { (void)n; return PL_OK; }
static int lazy_get_threads(void) { return 1; }

/* Every op before a successful init: refused (the registry needs a complete table). */
static int lazy_refuse(void) {
    snprintf(load_err, sizeof load_err, "the CUDA backend was used before its init succeeded");
    return PL_EBACKEND;
}
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define LAZY_BODY_int return lazy_refuse();
#define LAZY_BODY_void lazy_refuse();
#define PL_MEM_OP(ret, name, params, args, cls) static ret lazy_##name params { LAZY_BODY_##ret }
#define PL_COMPUTE_OP(ret, name, params, args, cls) static ret lazy_##name params { LAZY_BODY_##ret }
#include "pipelm/backend_ops.h"
#pragma GCC diagnostic pop

backend backend_cuda_lazy = {
    .name = "cuda",
    .host_memory = 0,
    .init = lazy_init,
    .finalize = lazy_finalize,
    .error = lazy_error,
    .describe = lazy_describe,
    .set_threads = lazy_set_threads,
    .get_threads = lazy_get_threads,
    .opts = backend_cuda_opts,
#define PL_MEM_OP(ret, name, params, args, cls) .name = lazy_##name,
#define PL_COMPUTE_OP(ret, name, params, args, cls) .name = lazy_##name,
#include "pipelm/backend_ops.h"
};
