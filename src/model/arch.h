/*
 * arch.h — one descriptor per model architecture, and the registry that finds them by name
 * (as backend.h finds backends). A descriptor is tables, not code: the parameter rows of the
 * embeddings, of one block and of the head (leaf name, shape as dimension codes of the
 * config, decay, initial-value rule, place in the llm.c file, Hugging Face name, tied), the
 * activation rows of one block and of the head (floats per token, which recompute modes keep
 * them per slot), the output-gradient rows of one block and the stage-wide scratch rows.
 * Everything sized by the model walks these rows: the stage's layout and arenas, the
 * parameter counts, the activation estimates of the split and the report, the llm.c file
 * sizes and the checkpoint's shapes. Beside the tables, the functions that differ: the math
 * of a block (forward, input part, weight part, what selective recomputation redoes), of the
 * embedding and of the head's norm, config making and checking, the llm.c header and the
 * checkpoint's /config attributes. Outside model.c (GPT-2), model_llama.c (Llama 3) and
 * arch.c no code asks which architecture it is.
 */
#ifndef PIPELM_ARCH_H
#define PIPELM_ARCH_H

#include <stddef.h>
#include <stdint.h>
#include "pipelm/backend.h"
#include "cli/config.h"
#include "model/kvcache.h"
#include "model/model.h"

/* A dimension as a function of the config (and, for activations, of the sequence length T). */
typedef enum {
    AD_NONE = 0, /* no second dimension (a 1-D tensor) */
    AD_1,        /* 1 */
    AD_C,        /* channels */
    AD_QKV,      /* the fused projection's width, (NH + 2 NKV) C / NH (3 C for GPT-2) */
    AD_H,        /* the MLP hidden size */
    AD_VP,       /* padded vocabulary */
    AD_V,        /* vocabulary */
    AD_MAXT,     /* max sequence length */
    AD_NHT,      /* NH T: attention probabilities per token */
    AD_HALF_HS,  /* half a head (a rotary table row) */
    AD_WIDE,     /* max(H, QKV) (with --tp: of the slices, and at least C) */
    AD_CA,       /* the attention's width NH HS = C (with --tp: this rank's heads, C / T) */
    AD_E,        /* Mixtral: routed experts E */
    AD_EF,       /* Mixtral: E F, the experts' stacked hidden rows */
    AD_EC,       /* Mixtral: E C, the experts' stacked output rows */
    AD_F,        /* Mixtral: one expert's hidden size F */
    AD_SF,       /* Mixtral: the shared experts' hidden size S F (0 without them) */
    AD_K,        /* Mixtral: experts per token K */
    AD_KC,       /* Mixtral: K C (a token's K routed copies) */
    AD_KF,       /* Mixtral: K F */
} arch_dim;

/* Update rules of a parameter tensor (param_tensor.rule): AdamW, or, for the kind P_ROUTERB
 * (the sigmoid-bias router's bias), b -= rate sign(g) with g the step's load error (optim.c). */
enum { UPDATE_ADAMW = 0, UPDATE_SIGN = 1 };

/* Initial-value rules of a parameter row (model_init_tensor). */
enum { INIT_ONE, INIT_ZERO, INIT_NORMAL, INIT_RESID };

/* One parameter tensor of an architecture (per layer when it is a block row). */
typedef struct {
    const char *name;     /* leaf name, "qkv_w" (== param_kind_name[kind]) */
    int kind;             /* P_*: checkpoint name and initial-value stream */
    arch_dim rows, cols;  /* shape; cols AD_NONE for a 1-D tensor */
    int decay;            /* AdamW weight decay applies */
    int init;             /* INIT_* (a row of AD_VP rows has its padded rows zeroed) */
    int file_index;       /* its place in the llm.c file (kinds in this order, each all layers); -1: not there */
    arch_dim file_rows;   /* rows the llm.c file holds (AD_V: V of the Vp) */
    int mfu;              /* counted by model_train_flops_per_token (6 FLOPs per weight) */
    const char *hf_name;  /* Hugging Face name ("model.layers.%d...."; hf.h: '|' parts stacked by rows,
                           * the first C rows, the others the rest in equal shares (Llama's q | k | v);
                           * '~' stored transposed, '^' permuted for rotate-half); NULL: none */
    int tied;             /* >= 0: holds the values of that embedding row (GPT-2's head reads wte); -1 */
} arch_param;

/* Recompute modes that keep an activation row per slot: bit 1 << STAGE_RECOMPUTE_*. A row a
 * mode does not keep lives in one stage-wide set the recomputation refills. */
enum { KEEP_NONE = 1, KEEP_SELECTIVE = 2, KEEP_FULL = 4, KEEP_ALL = 7 };

/* One activation (or output-gradient, or head-activation) row: floats per token. */
typedef struct {
    const char *name;
    arch_dim per_token;
    int keep;             /* KEEP_* bits (output gradients and head rows: KEEP_ALL) */
} arch_act;

/* One stage-wide scratch buffer of an architecture (one arena per stage, zero-filled). */
enum { SCR_PER_TOKEN, SCR_PER_POSITION };
enum { SCR_ALL, SCR_EMBED }; /* which stages need it */
enum {
    SCR_FILL,  /* filled once by scratch_fill (Llama's rotary tables) */
    SCR_ZEROS, /* zeros, or a transient the math overwrites before reading */
    SCR_SINK,  /* written, never read: zeroed with the gradients so it cannot grow */
};
typedef struct {
    const char *name;
    arch_dim dim;         /* floats per token or per position */
    int per;              /* SCR_PER_* */
    int need;             /* SCR_ALL | SCR_EMBED */
    int use;              /* SCR_FILL | SCR_ZEROS | SCR_SINK */
} arch_scratch;

/* A part of the parameter table. */
typedef struct {
    const arch_param *rows;
    int n;
} arch_params;
typedef struct {
    const arch_act *rows;
    int n;
} arch_acts;

/* A part's rows from a static array. */
#define ARCH_ROWS(a) {(a), (int)(sizeof(a) / sizeof((a)[0]))}

/* The most /config attributes of one type an architecture adds (test_model checks every row). */
#define ARCH_MAX_ATTRS 8

typedef struct model_arch {
    const char *name;        /* "gpt2": --arch, /config/arch, messages */
    int id;                  /* its index in the registry: model_config.arch */
    arch_params embed, block, head;
    arch_acts acts;          /* one block's activations */
    arch_acts douts;         /* one block's output gradients */
    arch_acts head_acts;     /* the head's, per slot */
    const arch_scratch *scratch;
    int nscratch;
    int block_out;           /* acts row of the block output (the next block's input; kept per slot always) */
    int head_out, head_dout; /* head_acts rows: the final norm's output, dL/d(it) */
    int head_matrix;         /* head row of the (Vp, C) output projection */
    int tied;                /* 1: a head row is tied to an embedding row */
    const char *head_desc;   /* "the final LayerNorm": the head's part in messages */
    /* config */
    int (*config_from_options)(const pl_options *o, int V, model_config *cfg, char *err, size_t errlen);
    int (*config_check)(const model_config *c, cfg_naming naming, char *err, size_t errlen);
    /* the --init conflicts of the architecture's own settings (train.c checks the common ones) */
    int (*init_conflicts)(const pl_options *o, const model_config *c, char *err, size_t errlen);
    /* run-time settings that must equal between a file and the run (after the dimensions) */
    int (*same_settings)(const model_config *file, const model_config *run, cfg_naming naming, char *err,
                         size_t errlen);
    void (*describe)(const model_config *c, char *buf, size_t len); /* "V=.. C=.. L=..", the model line */
    /* math */
    int (*block_forward)(const backend *be, const block_dims *d, float *const *p, float *const *a, const float *x);
    int (*block_backward_input)(const backend *be, const block_dims *d, float *const *p, float *const *a,
                                const float *x, float *dres, float *const *dd);
    int (*block_backward_weight)(const backend *be, const block_dims *d, float *const *g, float *const *a,
                                 const float *x, float *const *dd);
    /* what selective recomputation dropped (the rows without KEEP_SELECTIVE), back from the kept ones */
    int (*block_recompute_selective)(const backend *be, const block_dims *d, float *const *a);
    int (*embed_forward)(const backend *be, const block_dims *d, float *const *p, float *x, const int *tok);
    int (*embed_backward)(const backend *be, const block_dims *d, float *const *g, const float *dx, const int *tok);
    int (*head_norm_forward)(const backend *be, const block_dims *d, float *const *p, float *const *a, const float *x);
    /* dres += dL/dx through the norm, from a[head_dout] */
    int (*head_norm_backward_input)(const backend *be, const block_dims *d, float *const *p, float *const *a,
                                    const float *x, float *dres);
    int (*head_norm_backward_weight)(const backend *be, const block_dims *d, float *const *g, float *const *a,
                                     const float *x);
    int (*scratch_fill)(const model_config *c, int T, int row, float *host); /* the SCR_FILL rows; PL_ENOMEM */
    /* llm.c model files (llmc.c) */
    int32_t magic;
    size_t header_bytes;
    const char *file_desc;   /* "an llm.c GPT-2 model file" */
    void (*llmc_header_write)(const model_config *c, void *hdr);  /* header_bytes, zeroed by the caller */
    /* hdr holds got bytes (at least 1024; magic and version checked); messages name `path` */
    int (*llmc_header_read)(const char *path, const void *hdr, size_t got, model_config *cfg, char *err,
                            size_t errlen);
    /* checkpoint /config attributes beyond the common six and arch (docs/formats.md), at most
     * ARCH_MAX_ATTRS of each type */
    const char *const *attr_int;
    int nattr_int;
    const char *const *attr_f64;
    int nattr_f64;
    void (*attrs_of)(const model_config *c, long long *ints, double *f64);
    /* cfg from the common six (vocab_size, padded_vocab_size, max_seq_len, n_layer, n_head,
     * n_embd) and the architecture's attributes, all range-checked first; PL_EIO and a message */
    int (*config_of_attrs)(const long long *common, const long long *ints, const double *f64, model_config *cfg,
                           char *err, size_t errlen);
    /* decoding with a KV cache (kvcache.h): one block over an item's d->N rows x (their
     * positions and caches in kv; the new keys and values are written to the caches), the
     * output in a[block_out]; a holds the activation rows for d->N rows (AD_NHT ones unused) */
    int (*block_decode)(const backend *be, const block_dims *d, float *const *p, float *const *a, const kv_batch *kv,
                        const float *x);
    /* the embedding of an item's tokens (backend memory) at their positions */
    int (*embed_decode)(const backend *be, const block_dims *d, float *const *p, float *x, const int *tok,
                        const kv_batch *kv);
    /* slots an llm.c file holds as zeros for a tensor the model lacks (Llama 3's bias slots,
     * llm.c's write_tensors), by part (embeddings, one block, the head): rows of the same
     * form with file_index and file_rows, kind P_* of the GPT-2 slot; written as zeros and
     * refused on read when not zero. Rows sharing a file_index are packed in table order
     * within each layer (Llama's fcw slot: fc_w then fc2_w). */
    arch_params llmc_zeros[3];
    /* --init from an llm.c file: the settings its header cannot hold (Llama's tie and
     * rope_scaling factors), taken from the options; NULL: none */
    int (*llmc_options)(const pl_options *o, model_config *c, char *err, size_t errlen);
    /* Hugging Face models (hf.c): config.json's model_type; names a file may hold that the
     * model does not read ("%d" a layer; NULL-terminated); config.json (a json_t object) into
     * a config, through hf.h's getters, messages naming path and key */
    const char *hf_model_type;
    const char *const *hf_ignore;
    int (*hf_config_read)(const void *json, const char *path, model_config *c, char *err, size_t errlen);
    void (*hf_config_write)(const model_config *c, void *json); /* the keys transformers loads */
    /* what the Hugging Face layout cannot hold (Mixtral's shared experts, sigmoid-bias router):
     * PL_EINVAL and a message, checked before a model is written; NULL: everything fits */
    int (*hf_check)(const model_config *c, char *err, size_t errlen);
} model_arch;

/* The architectures, in id order; the count. */
extern const model_arch *const arch_registry[];
extern const int arch_count;
/* An architecture by name, or NULL. */
const model_arch *arch_find(const char *name);
/* The architecture of a config (its id; an id out of range is a bug: GPT-2's is returned). */
const model_arch *arch_of(const model_config *c);
/* The value of a dimension code for a config at sequence length T. */
size_t arch_dim_value(const model_config *c, int T, arch_dim d);
/* Floats of one row's tensor (a parameter's numel; file: the llm.c file's rows). */
size_t arch_param_numel(const model_config *c, const arch_param *r, int file);
/* "gpt2|llama" and "gpt2 or llama": the registry's names, for help and messages. */
void arch_names(const char *sep, char *buf, size_t len);

/* The registry's rows (archs/gpt2.c, archs/llama.c, archs/mixtral.c). */
extern const model_arch arch_gpt2, arch_llama, arch_mixtral;

#endif
