/*
 * config.h — every setting of a run, its defaults, the presets, and how they are read.
 *
 * One table describes each option once (name, type, default, help); the command line
 * (`--name value` or `--name=value`, through getopt_long; names spelled in full, abbreviations
 * refused) and INI config files (`--config FILE`, `name = value`, parsed by inih) both go
 * through it, underscores and dashes equivalent in names. A config file must
 * be a regular file of at most 1 MiB; `[section]` lines, a name given twice, control
 * characters and lines that are not `name = value` are refused naming the line. Numbers
 * must be decimal (no 0x, inf or nan). Messages escape non-printable bytes as \xHH.
 * Precedence: built-in defaults < preset (`--preset`) < config file < command line.
 * Unknown names and malformed values are refused with a message naming them.
 */
#ifndef PIPELM_CONFIG_H
#define PIPELM_CONFIG_H

#include <stddef.h>
#include <stdio.h>
#include "model/hparams.h"
#include "model/model.h"
#include "model/model_check.h"
#include "util/common.h" /* PL_PATH */
#include "util/hooks.h"


struct gen_opts; /* generate.h */

typedef struct {
    char preset[32];
    /* model */
    int vocab_size, max_seq_len, n_layer, n_head, n_embd;
    char arch[16];               /* gpt2 | llama | mixtral */
    int n_kv_head;               /* llama: key/value heads (0: n_head) */
    int multiple_of, use_scaled_rope;
    double ffn_dim_multiplier;   /* llama: 0 = none */
    double norm_eps, rope_theta;
    int tie_embeddings;          /* llama: 1 = lm_head is wte (Llama 3.2's tie_word_embeddings) */
    double rope_factor, rope_low_freq, rope_high_freq; /* llama: rope_scaling (with use_scaled_rope) */
    int rope_orig_ctx;           /* llama: rope_scaling's original_max_position_embeddings */
    int n_experts, experts_per_token, moe_ffn_dim, shared_experts; /* mixtral: E, K, F, S */
    char router[16];             /* mixtral: softmax | sigmoid-bias */
    double router_aux_coef, router_bias_rate, capacity_factor; /* mixtral */
    int ep;                      /* mixtral: expert-parallel ranks carved from --dp (1: none; parallel/ep.h) */
    /* training */
    optim_hparams hp;            /* --lr .. --grad-clip, and --steps (hp.total_steps) */
    int batch, seq_len, microbatches;
    long long seed, data_seed;
    int markov_branch;
    char data[PL_PATH], val_data[PL_PATH];
    int shuffle;                 /* -1 (default): shuffled when --data names several shards; 0 | 1 */
    int data_changed;            /* 1: resume although the checkpoint's shard list differs from --data's */
    int eval_every, val_batches;
    char init[PL_PATH], save_final[PL_PATH], metrics[PL_PATH], config[PL_PATH];
    char dump_grads[PL_PATH];
    char save_dtype[8];          /* f32 | bf16: the dtype of a --save-final FILE.safetensors */
    /* pipeline */
    char split[512], schedule[32], schedule_csv[PL_PATH];
    int chunks;           /* model chunks per pipeline rank (virtual stages) */
    int dp, stages, zero; /* data-parallel replicas, pipeline stages, ZeRO-1 (train.c checks them against the world) */
    int tp;               /* tensor-parallel ranks per stage (tp.h; 1: none) */
    int cp;               /* context-parallel ranks per stage (cp.h; 1: none) */
    char cp_comm[16];     /* ring | allgather: how --cp exchanges keys and values */
    char recompute[256];  /* none | selective | full, or one per stage (train.c checks it) */
    char grad_accum[8];   /* float (a float sum in each rank's order) | exact (exact.h: fixed-point, any order) */
    int doc_mask;         /* 1: attention stops at the document token (model.h's model_docs) */
    int doc_token;        /* the document token; -1: the data's (train.c: doc_token_of) */
    char doc_positions[12]; /* continue (Llama 3's training) | restart (rotary positions from each document) */
    /* runtime */
    char backend[16];    /* checked when the run starts: backend_find() knows what is built */
    char precision[8];   /* fp32 | bf16 (checked as it is parsed) */
    char backend_opt[256]; /* --backend-opt KEY=VALUE, repeatable: "k=v,k=v" (checked against the backend) */
    int profile_ops;     /* 1: time the backend's ops by class (always on in bench) */
    int threads, log_every, timers_every, progress;
    int bind, blas_auto;  /* 1 (default) or 0: bind the ranks to CPUs (layout.c), choose the OpenBLAS kernel (main.c) */
    /* checkpoints */
    char ckpt_dir[PL_PATH], resume[PL_PATH];
    int ckpt_every, ckpt_keep;
    int ckpt_overwrite;   /* 1: start over in a --ckpt-dir that holds checkpoints (train_ckpt_guard) */
    char ckpt_xfer[16];   /* independent | collective: MPI-IO data transfers (config_check_ckpt checks it) */
    char ckpt_hints[1024]; /* MPI-IO hints "key=value,..." added to the built-in ones */
    int ckpt_verify, ckpt_space_check; /* 1 (default) or 0: re-read a save before publishing it; check the space */
    int ckpt_async;       /* 1: save from a host snapshot on a writer thread while training goes on (ckpt_async.h) */
    /* timeline */
    char trace[PL_PATH];
    /* benchmark (pipelm bench only) */
    int bench, warmup;
    char json[PL_PATH], csv[PL_PATH], costs_out[PL_PATH];
    double peak_gflops;
    /* the test hooks (util/hooks.h: --fail-*, --slow-*; not in --help) */
    pl_hooks hooks;
    double watchdog;     /* seconds one wait may take before the job is aborted; 0 = never */
    double stop_grace;   /* seconds a stop signal waits for a step that cannot end; 0 = automatic */
    /* the wait split of `pipelm bench`: a test-only slow rank, and the costs it is measured against */
    char costs_in[PL_PATH]; /* bench: the costs (bench --costs-out) a straggler is judged by */
    /* which model settings were given explicitly, on the command line or in the config file
     * (so --init can check or adopt them, and name only those): set_vocab for --vocab-size,
     * set_dims for any dimension or --arch, set_mask one bit per setting (CFG_SET_*) */
    int set_vocab, set_dims;
    unsigned set_mask;
    /* pipelm eval (eval.c): 1 when the run only evaluates; batches to evaluate (0: the whole
     * file); the JSON result file */
    int eval_mode, eval_batches;   /* eval_mode 2: pipelm generate (generate.c), with gen */
    char eval_json[PL_PATH];
    const struct gen_opts *gen;
} pl_options;

/* Bits of pl_options.set_mask: the model settings an --init file's header also holds. */
enum {
    CFG_SET_VOCAB = 1u << 0, CFG_SET_MAXT = 1u << 1, CFG_SET_LAYER = 1u << 2, CFG_SET_HEAD = 1u << 3,
    CFG_SET_EMBD = 1u << 4, CFG_SET_KVHEAD = 1u << 5, CFG_SET_ARCH = 1u << 6, CFG_SET_MULT = 1u << 7,
    CFG_SET_FFN = 1u << 8, CFG_SET_EPS = 1u << 9, CFG_SET_THETA = 1u << 10, CFG_SET_SCALED = 1u << 11,
    CFG_SET_TIE = 1u << 12, CFG_SET_ROPESC = 1u << 13,
};



/* The training settings of the options, as the checkpoint will record them. */
void config_train_of(const pl_options *o, cfg_train *t);
/* The vocabulary a run without --init trains: --vocab-size, or the data's own (text: 256). */
int config_vocab(const pl_options *o);
/* The model the options describe (no --init), vocabulary V; messages name the options. */
int config_model(const pl_options *o, int V, model_config *cfg, char *err, size_t errlen);

/* Fill defaults (preset "tiny"). The run options that have an environment variable as an alias
 * (PIPELM_BIND, PIPELM_BLAS_AUTO, PIPELM_STOP_GRACE, PIPELM_CKPT_XFER, PIPELM_CKPT_HINTS,
 * PIPELM_CKPT_VERIFY, PIPELM_CKPT_NO_SPACE_CHECK: docs/testing.md) take their default from it. */
void config_defaults(pl_options *o);
/* Apply a preset by name; PL_EINVAL for an unknown one (err names the known ones). */
int config_preset(pl_options *o, const char *name, char *err, size_t errlen);
/* The subcommands that read the option table; each takes its own part of it (the training
 * options are refused by eval and generate, the benchmark's own by train). */
enum { CFG_CMD_TRAIN, CFG_CMD_BENCH, CFG_CMD_EVAL, CFG_CMD_GENERATE, CFG_CMD_TUNE, CFG_NCMDS };

/* Parse argv[first..argc) for subcommand cmd (CFG_CMD_*): every option name is checked first
 * (an unknown one, or one cmd does not take, is refused by name before anything else), then
 * --config, then the preset, then file values, then flags. `--name value` and `--name=value`
 * both work; a value that starts with "--" only as --name=--value; an empty value is refused;
 * a 0/1 switch may be given bare (--ckpt-async). argv is not modified. Uses getopt_long's global state (optind, optarg...),
 * reset on each call: not thread-safe, and a caller's own getopt loop must not be mid-way. */
int config_parse(pl_options *o, int argc, char **argv, int first, int cmd, char *err, size_t errlen);
/* Check the checkpoint settings (--ckpt-xfer, --ckpt-hints, --ckpt-verify, --ckpt-space-check),
 * whether they came from the options or from their alias variables (a message names both);
 * config_validate does it, and `pipelm convert` on its defaults. */
int config_check_ckpt(const pl_options *o, char *err, size_t errlen);
/* Check ranges and combinations (batch divisible by microbatches, seq-len <= max...). */
int config_validate(const pl_options *o, char *err, size_t errlen);
/* The backend name a run uses: --backend, with "auto" resolved for --precision. */
const char *config_backend(const pl_options *o);
/* Check every option name of argv[first..argc) before anything else: each must be one cmd
 * takes from the table, or one of the subcommand's own extra[0..nextra) (names without "--").
 * PL_EINVAL names the first that is not ("unknown option '--x' for eval"). */
int config_check_names(int argc, char **argv, int first, int cmd, const char *const *extra, int nextra, char *err,
                       size_t errlen);
/* Row i of the option table (for the option parser's tests): PL_OK with its name, whether
 * subcommand cmd takes it and whether its value may be left out; PL_EINVAL past the end. */
int config_option_at(int i, int cmd, const char **name, int *taken, int *optional);
/* Print the options subcommand cmd (CFG_CMD_*) takes, as --help text. */
void config_print_help(FILE *out, int cmd);
/* Write the settings as a JSON object (for the metrics "run" line). */
void config_write_json(const pl_options *o, FILE *out);

#endif
