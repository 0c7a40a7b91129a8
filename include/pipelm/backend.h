/*
 * backend.h — the compute backend (interface v3): a table of function pointers, chosen once
 * at start-up from the registry (backend.c), in the manner of ior's aiori and libfabric's hmem.
 *
 * Model code allocates every tensor through a backend and only passes those pointers back to
 * the backend's ops; it never dereferences them (a GPU backend's pointers are device memory).
 * Every op and memory call returns a status: 0, or PL_EBACKEND / PL_ENOMEM with the backend's
 * own message in be->error() (the library's text: "cudaMalloc: out of memory", a oneDNN
 * status), so a failure reaches the agreed abort instead of a silent wrong result. Values
 * cross the boundary with to_host/from_host, or through map/unmap, which give MPI and file I/O
 * a host view of backend memory: a host-memory backend hands out its own pointer, a device
 * backend stages through a pinned host buffer. A device backend may queue its ops: whoever
 * reads a clock around them calls synchronize first. Tensors are fp32 in every backend; a
 * backend's precision (PL_PREC_BF16) says what its matmuls multiply (bf16 inputs, fp32
 * accumulation), while master weights, moments, norm statistics, softmax and loss stay fp32.
 * The ops are listed once, in backend_ops.h (memory ops apart from compute ops), and the
 * struct's members are generated from that list. Host defaults: a host-memory backend may
 * leave any op NULL, and registration (backend.c) fills it with the CPU backend's, so a table
 * states only what that backend does differently; a device backend must provide every op, and
 * registration refuses one that leaves an op NULL (backend_find does not return it). The CPU
 * backend ("cpu": OpenBLAS for every matmul, OpenMP C loops for the rest) is always built,
 * provides every op and is the reference the others are tested against. Every op is
 * deterministic: the same inputs and thread count give bit-identical outputs. Settings a user
 * may need are a backend's declared options (opts: key, help, default, and the environment
 * variable kept as an alias), given as --backend-opt KEY=VALUE. Shapes follow llm.c's
 * alphabet: N rows (= B*T tokens), C channels, OC output channels, NH heads, T sequence
 * length, V vocabulary (Vp padded). Plain C, no MPI, so CUDA translation units can include it.
 */
#ifndef PIPELM_BACKEND_H
#define PIPELM_BACKEND_H

#include <stddef.h>
#include <stdio.h>

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
    /* --backend-opt settings, "key=value[,key=value...]" (the last of a key wins); NULL or ""
     * for none. Checked against the backend's opts by backend_opts_check. */
    const char *settings;
} backend_options;

/* One setting a backend declares: its key, a help line, its value when not given, the values
 * it may take ('|'-separated), and the environment variable read when it is not given (the
 * older way to set it, kept as an alias; NULL if none). */
typedef struct {
    const char *key, *help, *def, *choices, *env;
} backend_opt_decl;

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

    /* The settings this backend takes (--backend-opt KEY=VALUE), ended by a row with key
     * NULL; NULL: none. */
    const backend_opt_decl *opts;

    /* Floats per (token, head) that attention_gqa_fwd leaves in its att buffer for the
     * backward, for a micro-batch of B sequences of T tokens, NH heads of HS channels (NH the
     * rank's own under --tp), called after init; NULL: T, the (T, T) causal probabilities. A
     * backend with a fused attention keeps less (CUDA's: the output and the log-sum-exp,
     * HS + 1 where its fused kernels run), and the stage sizes the buffer by it. */
    int (*attention_cols)(int B, int T, int NH, int HS);

    /* The ops, one member each, in backend_ops.h's order: memory first, then compute. */
#define PL_MEM_OP(ret, name, params, args, cls) ret(*name) params;
#define PL_COMPUTE_OP(ret, name, params, args, cls) ret(*name) params;
#include "pipelm/backend_ops.h"
} backend;

/* The CPU backend (always built). */
extern const backend backend_cpu;

/* Registry (backend.c). Find a backend by name, its NULL ops filled by the host defaults;
 * NULL if unknown, not built, or refused (backend_refusal() says why). */
const backend *backend_find(const char *name);
/* Why a built backend was refused at registration ("" if none was). */
const char *backend_refusal(void);
/* Complete a backend table: a host-memory backend's NULL ops become the CPU backend's; a
 * device backend with a NULL op, or a table without name, init, error or describe, is refused
 * (PL_EINVAL, the op named in err). Registration does this for every built backend; exposed
 * for the conformance test. */
int backend_complete(backend *b, char *err, size_t errlen);
/* The settings string s checked against b's declared options: PL_EINVAL with the list of b's
 * keys for an unknown key, a missing '=' or a value outside the choices. */
int backend_opts_check(const backend *b, const char *s, char *err, size_t errlen);
/* The value of key for a backend declaring decls: o->settings' (the last one), else the
 * environment alias when set and non-empty, else the default. key must be declared. */
const char *backend_opt_get(const backend_opt_decl *decls, const backend_options *o, const char *key, char *buf,
                            size_t len);
/* backend_opt_get(...) is "1". */
int backend_opt_flag(const backend_opt_decl *decls, const backend_options *o, const char *key);
/* One line per option of every built backend, for --help ("  cuda: sync=0|1 (default 0; ...)"). */
void backend_print_opts(FILE *out);
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
