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

#define PL_PATH 4096

typedef struct {
    char preset[32];
    /* model */
    int vocab_size, max_seq_len, n_layer, n_head, n_embd;
    char arch[16];               /* gpt2 | llama */
    int n_kv_head;               /* llama: key/value heads (0: n_head) */
    int multiple_of, use_scaled_rope;
    double ffn_dim_multiplier;   /* llama: 0 = none */
    double norm_eps, rope_theta;
    /* training */
    int steps, batch, seq_len, microbatches;
    double lr, min_lr;
    char lr_schedule[16];
    int warmup_steps;
    double weight_decay, grad_clip, beta1, beta2, eps;
    long long seed, data_seed;
    int markov_branch;
    char data[PL_PATH], val_data[PL_PATH];
    int eval_every, val_batches;
    char init[PL_PATH], save_final[PL_PATH], metrics[PL_PATH], config[PL_PATH];
    char dump_grads[PL_PATH];
    /* pipeline */
    char split[512], schedule[32], schedule_csv[PL_PATH];
    int chunks;           /* model chunks per pipeline rank (virtual stages) */
    int dp, stages, zero; /* data-parallel replicas, pipeline stages, ZeRO-1 (train.c checks them against the world) */
    char recompute[256];  /* none | selective | full, or one per stage (train.c checks it) */
    /* runtime */
    char backend[16];    /* checked when the run starts: backend_find() knows what is built */
    char precision[8];   /* fp32 | bf16 (checked as it is parsed) */
    int threads, log_every, timers_every, progress;
    /* checkpoints */
    char ckpt_dir[PL_PATH], resume[PL_PATH];
    int ckpt_every, ckpt_keep;
    /* timeline */
    char trace[PL_PATH];
    /* benchmark (pipelm bench only) */
    int bench, warmup;
    char json[PL_PATH], csv[PL_PATH], costs_out[PL_PATH];
    double peak_gflops;
    /* test-only fault injection: rank fail_rank stops at step fail_step */
    int fail_rank, fail_step;
    char fail_at[16];    /* before | during | after (the step) | save (in a checkpoint) | nan */
    double watchdog;     /* seconds one wait may take before the job is aborted; 0 = never */
    /* which model dimensions were given explicitly (so --init can check or adopt them) */
    int set_vocab, set_dims;
} pl_options;

/* Fill defaults (preset "tiny"). */
void config_defaults(pl_options *o);
/* Apply a preset by name; PL_EINVAL for an unknown one (err names the known ones). */
int config_preset(pl_options *o, const char *name, char *err, size_t errlen);
/* Parse argv[first..argc): --config first, then the preset, then file values, then flags.
 * With bench != 0 the benchmark-only options (--warmup, --json, --csv, --peak-gflops) are
 * accepted too. argv is not modified. Uses getopt_long's global state (optind, optarg...),
 * reset on each call: not thread-safe, and a caller's own getopt loop must not be mid-way. */
int config_parse(pl_options *o, int argc, char **argv, int first, int bench, char *err, size_t errlen);
/* Check ranges and combinations (batch divisible by microbatches, seq-len <= max...). */
int config_validate(const pl_options *o, char *err, size_t errlen);
/* Print the option table as --help text (bench-only options when bench != 0). */
void config_print_help(FILE *out, int bench);
/* Write the settings as a JSON object (for the metrics "run" line). */
void config_write_json(const pl_options *o, FILE *out);

#endif
