/*
 * config.c — the option table, presets, command line and INI parsing.
 *
 * The command line goes through glibc's getopt_long, with a `struct option` array built from
 * the table, held to the parser's own rules: optstring "+:" and opterr = 0 (no permutation, no
 * messages of its own: every error is worded here), optind = 0 before each parse (a full
 * re-initialisation, so config_parse may run more than once in a process), a copy of argv
 * with a program name in front (the caller's array is never reordered, and argv[first] may be
 * any argument). Around it: a word that does not start with "--" (or is "--" alone, getopt's
 * end of options) is refused before getopt sees it; '_' in a name is turned into '-' first (a
 * copy of that word); a bare optional value (--resume) takes the next word unless it starts
 * with "--"; and a name getopt matched by a unique prefix is refused (abbreviations would let
 * a script's --val mean something else once an option is added).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ini.h>
#include "pipelm/backend.h"
#include "util/common.h"
#include "model/arch.h"
#include "cli/config.h"
#include "formats/data.h"
#include "pipeline/sched.h"
#include "util/files.h"

/* A config file larger than this is refused (a settings file is a few hundred bytes). */
#define CONFIG_MAX_BYTES (1u << 20)

typedef enum { OPT_INT, OPT_LL, OPT_DBL, OPT_STR } opt_type;

/* scope: the subcommands that take the option (CFG_CMD_* bits: CMDS_RUN for everything a
 * run reads, CMDS_TRAIN for what only training and its benchmark use, CMDS_BENCH for the
 * benchmark's own); optional: the value may be left out (then `optional_default` is stored),
 * as in a bare --resume or --ckpt-async; choices: NULL, or the values a string option may
 * take, '|'-separated, checked as it is parsed. */
typedef struct {
    const char *name;
    opt_type type;
    size_t offset, size;
    const char *help;
    unsigned scope;
    const char *optional_default;
    const char *choices;
} opt_desc;

#define CMD_BIT(c) (1 << (c))
#define CMDS_BENCH (CMD_BIT(CFG_CMD_BENCH) | CMD_BIT(CFG_CMD_TUNE))
#define CMDS_TRAIN (CMD_BIT(CFG_CMD_TRAIN) | CMDS_BENCH)
#define CMDS_RUN (CMDS_TRAIN | CMD_BIT(CFG_CMD_EVAL) | CMD_BIT(CFG_CMD_GENERATE))
#define O_INT(n, f, h) {n, OPT_INT, offsetof(pl_options, f), sizeof(int), h, CMDS_RUN, NULL, NULL}
#define O_LL(n, f, h) {n, OPT_LL, offsetof(pl_options, f), sizeof(long long), h, CMDS_RUN, NULL, NULL}
#define O_DBL(n, f, h) {n, OPT_DBL, offsetof(pl_options, f), sizeof(double), h, CMDS_RUN, NULL, NULL}
#define O_STR(n, f, h) {n, OPT_STR, offsetof(pl_options, f), sizeof(((pl_options *)0)->f), h, CMDS_RUN, NULL, NULL}
#define O_CHOICE(n, f, c, h) {n, OPT_STR, offsetof(pl_options, f), sizeof(((pl_options *)0)->f), h, CMDS_RUN, NULL, c}
#define O_BENCH(n, t, f, h) {n, t, offsetof(pl_options, f), sizeof(((pl_options *)0)->f), h, CMDS_BENCH, NULL, NULL}
/* a 0/1 switch: a bare --NAME is --NAME 1 */
#define O_FLAG(n, f, h) {n, OPT_INT, offsetof(pl_options, f), sizeof(int), h, CMDS_RUN, "1", NULL}
/* a test hook (util/hooks.h): taken by the subcommands in scope, never listed by --help */
#define HIDDEN (1u << 30)
#define OH_INT(n, f, sc, h) {n, OPT_INT, offsetof(pl_options, f), sizeof(int), h, (sc) | HIDDEN, NULL, NULL}
#define OH_DBL(n, f, sc, h) {n, OPT_DBL, offsetof(pl_options, f), sizeof(double), h, (sc) | HIDDEN, NULL, NULL}
#define OH_STR(n, f, sc, h) {n, OPT_STR, offsetof(pl_options, f), sizeof(((pl_options *)0)->f), h, (sc) | HIDDEN, NULL, NULL}
/* the same rows for what only training (and its benchmark and tuner) reads: eval and
 * generate refuse these */
#define OT_INT(n, f, h) {n, OPT_INT, offsetof(pl_options, f), sizeof(int), h, CMDS_TRAIN, NULL, NULL}
#define OT_DBL(n, f, h) {n, OPT_DBL, offsetof(pl_options, f), sizeof(double), h, CMDS_TRAIN, NULL, NULL}
#define OT_STR(n, f, h) {n, OPT_STR, offsetof(pl_options, f), sizeof(((pl_options *)0)->f), h, CMDS_TRAIN, NULL, NULL}
#define OT_CHOICE(n, f, c, h) {n, OPT_STR, offsetof(pl_options, f), sizeof(((pl_options *)0)->f), h, CMDS_TRAIN, NULL, c}
#define OT_FLAG(n, f, h) {n, OPT_INT, offsetof(pl_options, f), sizeof(int), h, CMDS_TRAIN, "1", NULL}

static const opt_desc options[] = {
    O_STR("preset", preset, "model preset: tiny | tutorial | gpt2 | gpt2-medium | llama-tiny | llama-1b | "
          "mixtral-tiny (default tiny)"),
    O_STR("config", config, "INI file of `name = value` settings (command line wins)"),
    O_INT("vocab-size", vocab_size, "vocabulary size V"),
    O_INT("max-seq-len", max_seq_len, "maximum sequence length (position table rows)"),
    O_INT("n-layer", n_layer, "transformer blocks L"),
    O_INT("n-head", n_head, "attention heads NH"),
    O_INT("n-embd", n_embd, "channels C"),
    O_CHOICE("arch", arch, "gpt2|llama|mixtral", "architecture: gpt2 (llm.c GPT-2), llama (Llama 3: RMSNorm, RoPE, "
             "grouped-query attention, SwiGLU, untied head) or mixtral (Llama 3's attention, a sparse mixture of "
             "SwiGLU experts)"),
    O_INT("n-kv-head", n_kv_head, "(llama) key/value heads; n-head must be a multiple (0: n-head)"),
    O_DBL("ffn-dim-multiplier", ffn_dim_multiplier, "(llama) MLP hidden size factor on int(8C/3) (0: none)"),
    O_INT("multiple-of", multiple_of, "(llama) round the MLP hidden size up to a multiple of this"),
    O_DBL("norm-eps", norm_eps, "(llama) RMSNorm epsilon"),
    O_DBL("rope-theta", rope_theta, "(llama) rotary embedding base"),
    O_FLAG("use-scaled-rope", use_scaled_rope, "(llama) 1: Llama 3.1's rotary frequency scaling"),
    O_FLAG("tie-embeddings", tie_embeddings, "(llama) 1: lm_head is the token embedding (Llama 3.2's "
          "tie_word_embeddings; default 0)"),
    O_DBL("rope-scaling-factor", rope_factor, "(llama) rope_scaling factor (Llama 3.1: 8, 3.2: 32)"),
    O_DBL("rope-low-freq-factor", rope_low_freq, "(llama) rope_scaling low_freq_factor (default 1)"),
    O_DBL("rope-high-freq-factor", rope_high_freq, "(llama) rope_scaling high_freq_factor (default 4)"),
    O_INT("rope-original-max-pos", rope_orig_ctx, "(llama) rope_scaling original_max_position_embeddings "
          "(default 8192)"),
    O_INT("n-experts", n_experts, "(mixtral) routed experts E per layer"),
    O_INT("experts-per-token", experts_per_token, "(mixtral) experts K each token is sent to (top-k, 1..E; default 2)"),
    O_INT("moe-ffn-dim", moe_ffn_dim, "(mixtral) each expert's SwiGLU hidden size"),
    O_DBL("router-aux-coef", router_aux_coef, "(mixtral) load-balancing loss coefficient (default 0.02, Mixtral's)"),
    O_INT("shared-experts", shared_experts, "(mixtral) always-on experts added to the routed ones (DeepSeek-V3; 0: none)"),
    O_CHOICE("router", router, "softmax|sigmoid-bias", "(mixtral) softmax (Mixtral) or sigmoid-bias (DeepSeek-V3: "
             "sigmoid scores, a balancing bias for the choice only, updated each step)"),
    O_DBL("router-bias-rate", router_bias_rate, "(mixtral) the sigmoid-bias router's bias step per optimizer step "
          "(default 0.001)"),
    O_DBL("capacity-factor", capacity_factor, "(mixtral) drop tokens over ceil(c N K / E) per expert, lowest router "
          "weight first (0: dropless, the default)"),
    OT_INT("ep", ep, "(mixtral) expert-parallel ranks E carved from --dp: each of E replicas computes n-experts / E "
           "experts for the group (E divides --dp and --n-experts; not with --tp)"),
    OT_INT("steps", hp.total_steps, "total optimizer steps of the run"),
    O_INT("batch", batch, "sequences per step B (the global batch)"),
    O_INT("seq-len", seq_len, "tokens per sequence T"),
    O_INT("microbatches", microbatches, "micro-batches M per step (B/M sequences each)"),
    OT_DBL("lr", hp.lr, "peak learning rate"),
    OT_DBL("min-lr", hp.min_lr, "final learning rate of the cosine schedule"),
    OT_STR("lr-schedule", hp.lr_schedule, "cosine | constant (both after linear warm-up)"),
    OT_INT("warmup-steps", hp.warmup_steps, "linear warm-up steps"),
    OT_DBL("weight-decay", hp.weight_decay, "AdamW decoupled weight decay (2-D weights only)"),
    OT_DBL("grad-clip", hp.grad_clip, "clip the global gradient norm to this (0 disables)"),
    OT_DBL("beta1", hp.beta1, "AdamW beta1"),
    OT_DBL("beta2", hp.beta2, "AdamW beta2"),
    OT_DBL("eps", hp.eps, "AdamW epsilon"),
    O_LL("seed", seed, "seed of the weight initialisation"),
    O_STR("data", data, "training data: markov | FILE (llm.c tokens) | text:FILE (bytes) | GLOB or A,B,... (llm.c "
          "shards; docs/formats.md)"),
    O_STR("val-data", val_data, "validation data (default: a held-out Markov stream, or none)"),
    O_LL("data-seed", data_seed, "seed of the Markov chain, and of the shards' order"),
    O_INT("shuffle", shuffle, "0: read the token files in order; 1: each epoch in a seeded random order (default: "
          "1 when --data names more than one shard, else 0)"),
    OT_FLAG("data-changed", data_changed, "1: resume although the shards of --data (names, sizes, header checksums) "
            "differ from those the checkpoint records"),
    O_INT("markov-branch", markov_branch, "next tokens allowed per token in the Markov chain"),
    OT_INT("eval-every", eval_every, "validation loss every N steps (0: only at the end)"),
    O_INT("val-batches", val_batches, "batches per validation"),
    O_STR("init", init, "start from an llm.c model file, GPT-2 or Llama 3 (fp32 version 3 or bf16 version 5)"),
    OT_STR("save-final", save_final, "write the final weights as an llm.c model file (a name ending in "
          ".safetensors: a Hugging Face safetensors file)"),
    OT_CHOICE("save-dtype", save_dtype, "f32|bf16", "dtype of a --save-final FILE.safetensors (default f32)"),
    O_STR("metrics", metrics, "write JSON-lines metrics to FILE (rank 0)"),
    OT_STR("dump-grads", dump_grads, "write step 1's gradients as an llm.c model file"),
    O_STR("split", split, "blocks per stage: auto | b0,b1,... (one per rank)"),
    OT_STR("recompute", recompute, "activation recomputation: none | selective (attention probabilities) | full "
          "(whole blocks); or one per stage, comma-separated (default none)"),
    O_STR("schedule", schedule, NULL), /* help built from the schedule registry: help_text() */
    O_STR("schedule-csv", schedule_csv, "run the schedule in this torch-style CSV file"),
    O_INT("chunks-per-rank", chunks, "model chunks V per pipeline rank (virtual stages: P x V stages, stage s on "
          "rank s mod P; for interleaved-1f1b, looped-bfs, interleaved-zb; needs P >= 2; 0: the --schedule-csv "
          "file's, 2 for zb-v and dualpipev (stages r and 2P-1-r on rank r), else 1)"),
    O_INT("virtual-stages", chunks, "alias of --chunks-per-rank"),
    O_INT("dp", dp, "data-parallel replicas D of the pipeline (0: world size / --stages, else 1; auto: the most "
          "replicas whose stage fits the memory, batch and model); rank r runs stage r / D of replica r % D"),
    O_INT("stages", stages, "pipeline stages P (0: world size / --dp; auto: as --dp auto chooses); with both, D x P "
          "must be the world size"),
    O_INT("tp", tp, "tensor-parallel ranks T per stage (Megatron: heads and MLP sliced, 4 all-reduces per block; "
          "innermost: the T ranks of a stage are neighbouring ranks, T x D x P = the world size)"),
    O_INT("cp", cp, "context-parallel ranks C per stage: each sequence split into 2C chunks, rank i holding "
          "chunks i and 2C-1-i; keys and values passed around a ring of the C ranks (--cp-comm); C next to "
          "TP (T x C x D x P = the world size); --seq-len divisible by 2C; cpu backend, no --tp"),
    O_CHOICE("cp-comm", cp_comm, "ring|allgather", "how --cp passes keys and values: ring (default: each rank's "
             "block sent on to the next rank while the tiles of the one it holds run, partial outputs merged by their "
             "log-sum-exp, the K/V gradients going round the same way) | allgather (every rank's rows gathered, "
             "the gradients sent back in one exchange)"),
    OT_CHOICE("grad-accum", grad_accum, "float|exact", "how micro-batches' and replicas' weight gradients are summed: "
             "float (default: in each rank's order, float noise across --dp) | exact (each micro-batch's gradient "
             "to 128-bit fixed point, summed as integers, rounded once: the same bits on any --dp, --stages, chunks "
             "and schedule at fixed --tp and the same micro-batches (--batch, and D x M, the same); 16 bytes a parameter more; host-memory backends)"),
    OT_FLAG("doc-mask", doc_mask, "1: document masking of packed sequences: attention stops at the document token "
            "(each document attends only to itself, as Llama 3's training did); 0: plain causal (default)"),
    OT_INT("doc-token", doc_token, "the token that opens a document under --doc-mask (-1, the default: the data's: "
           "50256, GPT-2's <|endoftext|>, for an llm.c token file, 128000, Llama 3's <|begin_of_text|>, when the "
           "vocabulary has it; 0 for markov and text: data)"),
    OT_CHOICE("doc-positions", doc_positions, "continue|restart", "positions under --doc-mask: continue (default; "
             "Llama 3's training: only the mask changes, positions run on through the packed sequence) or restart "
             "(rotary positions count from each document token; llama and mixtral)"),
    OT_FLAG("zero", zero, "1: shard the AdamW moments over the D replicas (ZeRO stage 1); 0: every replica keeps them"),
    O_STR("backend", backend, NULL), /* help built at run time: help_text() */
    O_CHOICE("precision", precision, "fp32|bf16",
             "matmul precision: fp32, or bf16 (bf16 inputs, fp32 accumulation; --backend onednn or cuda)"),
    O_STR("backend-opt", backend_opt, "a backend setting KEY=VALUE (repeatable, or k=v,k=v; the keys are listed "
          "below)"),
    O_FLAG("profile-ops", profile_ops, "1: time the backend ops by class, as bench always does and reports "
          "(alias PIPELM_PROFILE_OPS=1)"),
    O_INT("threads", threads, "CPU threads per rank (0: cores / ranks on the node)"),
    O_INT("log-every", log_every, "print a step line every N steps"),
    O_INT("timers-every", timers_every, "print the per-rank timer table every N steps (0: end only)"),
    O_FLAG("progress", progress, "progress bar on a terminal: 1 auto, 0 never"),
    O_FLAG("bind", bind, "1: when a node's ranks all start on the same CPUs, bind each to its own slice; 0: never "
          "(default 1, or PIPELM_BIND)"),
    O_FLAG("blas-auto", blas_auto, "1: if OpenBLAS fell back to a pre-AVX2 kernel, re-execute once with the best one the "
          "CPU allows; 0: keep the library's choice (default 1, or PIPELM_BLAS_AUTO)"),
    O_STR("ckpt-dir", ckpt_dir, "directory for checkpoints (one HDF5 file per save)"),
    OT_INT("ckpt-every", ckpt_every, "save a checkpoint every N steps (0: only on preemption/at the end)"),
    OT_INT("ckpt-keep", ckpt_keep, "keep the newest K checkpoints (0: keep all); it removes only checkpoints this run "
           "wrote or older than the one it resumed from"),
    OT_FLAG("ckpt-overwrite", ckpt_overwrite, "1: start over in a --ckpt-dir that already holds checkpoints without "
            "resuming (its saves replace those of the same step and move latest to this run's; the others stay); "
            "0 (default): such a directory is refused unless the run resumes"),
    O_CHOICE("ckpt-xfer", ckpt_xfer, "independent|collective", "MPI-IO data transfers of checkpoints: independent "
             "(each tensor's owner alone) or collective (default independent, or PIPELM_CKPT_XFER)"),
    O_STR("ckpt-hints", ckpt_hints, "MPI-IO hints key=value,key=value for checkpoint files, added to (or "
          "overriding) romio_cb_write=disable,romio_ds_write=disable (default none, or PIPELM_CKPT_HINTS)"),
    OT_FLAG("ckpt-verify", ckpt_verify, "1: re-read every dataset of a save and check its CRC-32C before publishing "
          "it; 0: skip that (only to measure its cost; default 1, or PIPELM_CKPT_VERIFY)"),
    OT_FLAG("ckpt-space-check", ckpt_space_check, "1: check and reserve the free space before writing a checkpoint; "
          "0: do not (default 1, or PIPELM_CKPT_NO_SPACE_CHECK=1 for 0)"),
    OT_FLAG("ckpt-async", ckpt_async, "1: copy each save into host memory and write it on a background thread while "
          "training goes on (the same file; needs MPI_THREAD_MULTIPLE); 0: training waits for the save (default)"),
    {"resume", OPT_STR, offsetof(pl_options, resume), sizeof(((pl_options *)0)->resume),
     "resume from FILE, or bare: the newest checkpoint in --ckpt-dir", CMDS_RUN, "latest", NULL},
    O_STR("trace", trace, "write a Chrome trace-event timeline of every rank to FILE"),
    O_BENCH("warmup", OPT_INT, warmup, "(bench) untimed warm-up steps"),
    O_BENCH("json", OPT_STR, json, "(bench) write the results as JSON to FILE"),
    O_BENCH("csv", OPT_STR, csv, "(bench) write the results as CSV to FILE"),
    O_BENCH("costs-out", OPT_STR, costs_out, "(bench) write the measured F/B/I/W seconds per stage and message costs "
            "to FILE, for `pipelm schedule --costs`"),
    O_BENCH("peak-gflops", OPT_DBL, peak_gflops, "(bench) per-thread sgemm peak for MFU (default: measured)"),
    OT_STR("costs-in", costs_in, "a costs file (bench --costs-out): what bench's wait split judges each stage's "
          "actions by (default: the stages' median cost per FLOP), and what --schedule auto searches with"),
    /* the test hooks (util/hooks.h, docs/testing.md): accepted, never listed by --help */
    OH_INT("slow-rank", hooks.slow_rank, CMDS_TRAIN, "pipeline rank whose every F, B, I and W runs --slow-ms longer"),
    OH_DBL("slow-ms", hooks.slow_ms, CMDS_TRAIN, "the milliseconds --slow-rank adds to each of its actions"),
    OH_INT("fail-rank", hooks.fail_rank, CMDS_RUN, "rank that fails on purpose"),
    OH_INT("fail-step", hooks.fail_step, CMDS_RUN, "step at which --fail-rank fails"),
    OH_STR("fail-at", hooks.fail_at, CMDS_RUN, "where in --fail-step: before | during | after | save | nan | stall (hang inside the "
          "checkpoint's collective HDF5 calls) | tp (inside the step's first TP all-reduce) | tp-kill (SIGKILL there) | ep-kill (SIGKILL inside the step's "
          "first EP all-to-all) | cp (inside the step's first CP exchange "
          "of keys and values) | cp-kill (SIGKILL there)"),
    O_DBL("watchdog", watchdog, "abort the job if a rank waits longer than this for one message or "
                                "collective (seconds, default 600, 0 disables)"),
    O_DBL("stop-grace", stop_grace, "seconds a stop signal waits for a step that cannot end before the job is aborted "
          "(0: 30 s plus 3 times the slowest step; default 0, or PIPELM_STOP_GRACE)"),
};
#define NOPT ((int)(sizeof options / sizeof options[0]))

/* The checkpoint settings' aliases, read as they always were: PIPELM_CKPT_XFER's value as is
 * (empty: independent; anything else is refused by config_check_ckpt, naming it), the hints as
 * they are, PIPELM_CKPT_VERIFY=0 skips the verification, PIPELM_CKPT_NO_SPACE_CHECK=1 (a value
 * starting with 1) the space check. Hints too long for the option are refused, not cut. */
static void ckpt_env_aliases(pl_options *o) {
    const char *v = getenv("PIPELM_CKPT_XFER");
    snprintf(o->ckpt_xfer, sizeof o->ckpt_xfer, "%s", v && v[0] ? v : "independent");
    v = getenv("PIPELM_CKPT_HINTS");
    snprintf(o->ckpt_hints, sizeof o->ckpt_hints, "%s", v ? v : "");
    if (v && strlen(v) >= sizeof o->ckpt_hints) o->ckpt_hints[0] = '\x01'; /* too long: config_check_ckpt says so */
    v = getenv("PIPELM_CKPT_VERIFY");
    o->ckpt_verify = !(v && strcmp(v, "0") == 0);
    v = getenv("PIPELM_CKPT_NO_SPACE_CHECK");
    o->ckpt_space_check = !(v && v[0] == '1');
}

/* The run options whose environment variable is kept as an alias: it sets the default, a config
 * file or the command line wins. Read as they always were: "0" turns the binding or the kernel
 * choice off, anything else leaves it on; a grace that is not a positive number is automatic. */
static void env_aliases(pl_options *o) {
    const char *v = getenv("PIPELM_BIND");
    o->bind = !(v && strcmp(v, "0") == 0);
    v = getenv("PIPELM_BLAS_AUTO");
    o->blas_auto = !(v && strcmp(v, "0") == 0);
    v = getenv("PIPELM_STOP_GRACE");
    double g = v ? atof(v) : 0;
    o->stop_grace = isfinite(g) && g > 0 && g <= 1e7 ? g : 0;
    ckpt_env_aliases(o);
}

void config_defaults(pl_options *o) {
    memset(o, 0, sizeof *o);
    char err[256];
    config_preset(o, "tiny", err, sizeof err);
    o->hp.lr_schedule[0] = 0;
    strcpy(o->hp.lr_schedule, "cosine");
    o->hp.beta1 = 0.9;
    o->hp.beta2 = 0.95;
    o->hp.eps = 1e-8;
    o->hp.weight_decay = 0.1;
    o->hp.grad_clip = 1.0;
    o->seed = 1337;
    o->data_seed = 1;
    o->markov_branch = 4;
    o->shuffle = -1;
    strcpy(o->data, "markov");
    o->val_batches = 4;
    o->microbatches = 1;
    strcpy(o->split, "auto");
    strcpy(o->schedule, "1f1b");
    strcpy(o->backend, "auto");
    strcpy(o->precision, "fp32");
    strcpy(o->recompute, "none");
    o->doc_token = -1;
    strcpy(o->doc_positions, "continue");
    strcpy(o->grad_accum, "float");
    strcpy(o->arch, "gpt2");
    o->multiple_of = 256;
    o->norm_eps = 1e-5;
    o->rope_theta = 500000.0;
    strcpy(o->save_dtype, "f32");
    o->rope_factor = 8.0; /* Llama 3.1's rope_scaling */
    o->rope_low_freq = 1.0;
    o->rope_high_freq = 4.0;
    o->rope_orig_ctx = 8192;
    o->n_experts = 8; /* Mixtral 8x7B's routing; the dimensions come from a preset or the options */
    o->experts_per_token = 2;
    o->moe_ffn_dim = 128;
    o->router_aux_coef = 0.02;
    o->router_bias_rate = 0.001;
    strcpy(o->router, "softmax");
    o->ep = 1;
    o->log_every = 1;
    o->progress = 1;
    hooks_defaults(&o->hooks);
    o->tp = 1;
    o->cp = 1;
    snprintf(o->cp_comm, sizeof o->cp_comm, "ring");
    o->watchdog = 600.0;
    env_aliases(o);
}

/* Presets: model dimensions plus the training settings they were tuned with. */
int config_preset(pl_options *o, const char *name, char *err, size_t errlen) {
    if (strcmp(name, "tiny") == 0) {
        o->vocab_size = 256; o->max_seq_len = 64; o->n_layer = 4; o->n_head = 4; o->n_embd = 64;
        o->seq_len = 64; o->batch = 16; o->hp.total_steps = 400; o->hp.lr = 3e-3; o->hp.min_lr = 3e-4;
        o->hp.warmup_steps = 20; o->eval_every = 100;
    } else if (strcmp(name, "tutorial") == 0) {
        o->vocab_size = 10000; o->max_seq_len = 128; o->n_layer = 8; o->n_head = 8; o->n_embd = 512;
        o->seq_len = 128; o->batch = 8; o->hp.total_steps = 100; o->hp.lr = 1e-3; o->hp.min_lr = 1e-4;
        o->hp.warmup_steps = 10; o->eval_every = 50;
    } else if (strcmp(name, "gpt2") == 0) {
        o->vocab_size = 50257; o->max_seq_len = 1024; o->n_layer = 12; o->n_head = 12; o->n_embd = 768;
        o->seq_len = 1024; o->batch = 4; o->hp.total_steps = 100; o->hp.lr = 6e-4; o->hp.min_lr = 6e-5;
        o->hp.warmup_steps = 10; o->eval_every = 50;
    } else if (strcmp(name, "gpt2-medium") == 0) {
        o->vocab_size = 50257; o->max_seq_len = 1024; o->n_layer = 24; o->n_head = 16; o->n_embd = 1024;
        o->seq_len = 1024; o->batch = 4; o->hp.total_steps = 100; o->hp.lr = 3e-4; o->hp.min_lr = 3e-5;
        o->hp.warmup_steps = 10; o->eval_every = 50;
    } else if (strcmp(name, "llama-tiny") == 0) { /* tests: HS = 12, not a power of two */
        o->vocab_size = 256; o->max_seq_len = 64; o->n_layer = 4; o->n_head = 6; o->n_embd = 72;
        o->n_kv_head = 2; o->multiple_of = 32; o->ffn_dim_multiplier = 0; o->norm_eps = 1e-5;
        o->rope_theta = 10000.0; o->use_scaled_rope = 0;
        o->seq_len = 64; o->batch = 16; o->hp.total_steps = 400; o->hp.lr = 3e-3; o->hp.min_lr = 3e-4;
        o->hp.warmup_steps = 20; o->eval_every = 100;
    } else if (strcmp(name, "mixtral-tiny") == 0) { /* tests: llama-tiny's attention, 5 experts top-2 */
        o->vocab_size = 256; o->max_seq_len = 64; o->n_layer = 4; o->n_head = 6; o->n_embd = 72;
        o->n_kv_head = 2; o->norm_eps = 1e-5; o->rope_theta = 10000.0; o->use_scaled_rope = 0;
        o->n_experts = 5; o->experts_per_token = 2; o->moe_ffn_dim = 48; o->shared_experts = 0;
        o->router_aux_coef = 0.02;
        o->seq_len = 64; o->batch = 16; o->hp.total_steps = 400; o->hp.lr = 3e-3; o->hp.min_lr = 3e-4;
        o->hp.warmup_steps = 20; o->eval_every = 100;
    } else if (strcmp(name, "llama-1b") == 0) { /* Llama 3.2 1B (meta-llama/Llama-3.2-1B's config.json) */
        o->vocab_size = 128256; o->max_seq_len = 131072; o->n_layer = 16; o->n_head = 32; o->n_embd = 2048;
        o->n_kv_head = 8; o->multiple_of = 256; o->ffn_dim_multiplier = 1.5; o->norm_eps = 1e-5;
        o->rope_theta = 500000.0; o->use_scaled_rope = 1;
        o->tie_embeddings = 1; o->rope_factor = 32.0; o->rope_low_freq = 1.0; o->rope_high_freq = 4.0;
        o->rope_orig_ctx = 8192;
        o->seq_len = 1024; o->batch = 4; o->hp.total_steps = 100; o->hp.lr = 3e-4; o->hp.min_lr = 3e-5;
        o->hp.warmup_steps = 10; o->eval_every = 50;
    } else {
        snprintf(err, errlen, "unknown preset '%s' (known: tiny, tutorial, gpt2, gpt2-medium, llama-tiny, llama-1b, "
                 "mixtral-tiny)",
                 name);
        return PL_EINVAL;
    }
    snprintf(o->arch, sizeof o->arch, "%s",
             strncmp(name, "llama", 5) == 0 ? "llama" : strncmp(name, "mixtral", 7) == 0 ? "mixtral" : "gpt2");
    snprintf(o->preset, sizeof o->preset, "%s", name);
    return PL_OK;
}

/* Look an option up, treating '_' and '-' alike. */
static const opt_desc *find_option(const char *name) {
    char norm[64];
    size_t n = strlen(name);
    if (n >= sizeof norm) return NULL;
    for (size_t i = 0; i <= n; i++) norm[i] = name[i] == '_' ? '-' : name[i];
    for (int i = 0; i < NOPT; i++)
        if (strcmp(options[i].name, norm) == 0) return &options[i];
    return NULL;
}

/* Copy s into out (len bytes) for a message: printable ASCII as is, anything else as \xHH,
 * cut with "..." beyond about 80 characters, so binary input never reaches the terminal. */
static void escape_str(const char *s, char *out, size_t len) {
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && o + 8 < len; p++) {
        if (o >= 80) {
            o += (size_t)snprintf(out + o, len - o, "...");
            break;
        }
        if (*p >= 0x20 && *p < 0x7f && *p != '\\') out[o++] = (char)*p;
        else o += (size_t)snprintf(out + o, len - o, "\\x%02x", *p);
    }
    out[o < len ? o : len - 1] = 0;
}

/* A decimal integer: optional sign, then digits only (no spaces, no 0x, no suffix). */
static int is_decimal_int(const char *v) {
    if (*v == '+' || *v == '-') v++;
    if (!*v) return 0;
    for (; *v; v++)
        if (*v < '0' || *v > '9') return 0;
    return 1;
}

/* A decimal number: digits, '.', an exponent, signs; at least one digit; no hex, inf or nan
 * (strtod takes all three, and '0x10' would become 16). */
static int is_decimal_number(const char *v) {
    int digits = 0;
    for (; *v; v++) {
        if (*v >= '0' && *v <= '9') digits = 1;
        else if (!strchr("+-.eE", *v)) return 0;
    }
    return digits;
}

/* 1 if val is one of the '|'-separated choices. */
static int is_choice(const char *choices, const char *val) {
    size_t n = strlen(val);
    for (const char *c = choices; *c;) {
        size_t k = strcspn(c, "|");
        if (k == n && strncmp(c, val, n) == 0) return 1;
        c += k + (c[k] == '|');
    }
    return 0;
}

/* "a|b|c" as "a, b or c". */
static void choices_text(const char *choices, char *out, size_t len) {
    size_t o = 0;
    out[0] = 0;
    for (const char *c = choices; *c && o + 1 < len;) {
        size_t k = strcspn(c, "|");
        const char *sep = c == choices ? "" : c[k] ? ", " : " or ";
        o += (size_t)snprintf(out + o, len - o, "%s%.*s", sep, (int)k, c);
        c += k + (c[k] == '|');
    }
}

/* Convert and store one value; `where` says where it came from for the message. */
static int set_option_value(pl_options *o, const opt_desc *d, const char *val, const char *where,
                            char *err, size_t errlen) {
    char *end = NULL;
    void *dst = (char *)o + d->offset;
    errno = 0;
    switch (d->type) {
    case OPT_INT: {
        if ((d->offset == offsetof(pl_options, dp) || d->offset == offsetof(pl_options, stages)) &&
            strcmp(val, "auto") == 0) { /* -1: chosen from the job's ranks (train_layout.c) */
            *(int *)dst = -1;
            break;
        }
        if (!is_decimal_int(val)) goto bad;
        long long v = strtoll(val, &end, 10);
        if (*end || errno || v < INT_MIN || v > INT_MAX) goto bad;
        *(int *)dst = (int)v;
        break;
    }
    case OPT_LL: {
        if (!is_decimal_int(val)) goto bad;
        long long v = strtoll(val, &end, 10);
        if (*end || errno) goto bad;
        *(long long *)dst = v;
        break;
    }
    case OPT_DBL: {
        if (!is_decimal_number(val)) goto bad;
        double v = strtod(val, &end);
        if (*end || errno || !isfinite(v)) goto bad;
        *(double *)dst = v;
        break;
    }
    case OPT_STR:
        if (d->choices && !is_choice(d->choices, val)) {
            char shown[128], list[128];
            escape_str(val, shown, sizeof shown);
            choices_text(d->choices, list, sizeof list);
            snprintf(err, errlen, "%s: bad value '%s' for --%s (expected %s)", where, shown, d->name, list);
            return PL_EINVAL;
        }
        /* --backend-opt is repeatable: each one adds "," and its value */
        size_t have = d->offset == offsetof(pl_options, backend_opt) && *(char *)dst ? strlen(dst) + 1 : 0;
        if (have + strlen(val) >= d->size) {
            snprintf(err, errlen, "%s: value of --%s is too long (%zu characters, at most %zu)",
                     where, d->name, have + strlen(val), d->size - 1);
            return PL_EINVAL;
        }
        if (have) strcat(strcat((char *)dst, ","), val);
        else strcpy((char *)dst, val);
        break;
    }
    static const struct { size_t off; unsigned bit; } model_bits[] = {
        {offsetof(pl_options, vocab_size), CFG_SET_VOCAB}, {offsetof(pl_options, max_seq_len), CFG_SET_MAXT},
        {offsetof(pl_options, n_layer), CFG_SET_LAYER}, {offsetof(pl_options, n_head), CFG_SET_HEAD},
        {offsetof(pl_options, n_embd), CFG_SET_EMBD}, {offsetof(pl_options, n_kv_head), CFG_SET_KVHEAD},
        {offsetof(pl_options, arch), CFG_SET_ARCH}, {offsetof(pl_options, multiple_of), CFG_SET_MULT},
        {offsetof(pl_options, ffn_dim_multiplier), CFG_SET_FFN}, {offsetof(pl_options, norm_eps), CFG_SET_EPS},
        {offsetof(pl_options, rope_theta), CFG_SET_THETA}, {offsetof(pl_options, use_scaled_rope), CFG_SET_SCALED},
        {offsetof(pl_options, tie_embeddings), CFG_SET_TIE}, {offsetof(pl_options, rope_factor), CFG_SET_ROPESC},
        {offsetof(pl_options, rope_low_freq), CFG_SET_ROPESC}, {offsetof(pl_options, rope_high_freq), CFG_SET_ROPESC},
        {offsetof(pl_options, rope_orig_ctx), CFG_SET_ROPESC},
    };
    for (size_t i = 0; i < sizeof model_bits / sizeof model_bits[0]; i++)
        if (d->offset == model_bits[i].off) o->set_mask |= model_bits[i].bit;
    o->set_vocab = (o->set_mask & CFG_SET_VOCAB) != 0;
    o->set_dims = (o->set_mask & (CFG_SET_MAXT | CFG_SET_LAYER | CFG_SET_HEAD | CFG_SET_EMBD | CFG_SET_KVHEAD |
                                  CFG_SET_ARCH)) != 0;
    return PL_OK;
bad: {
    char shown[128];
    escape_str(val, shown, sizeof shown);
    const char *range = "";
    if (d->type == OPT_INT && is_decimal_int(val)) range = " in -2147483648..2147483647";
    else if (d->type == OPT_LL && is_decimal_int(val)) range = " that fits in 64 bits";
    else if (d->type == OPT_DBL && is_decimal_number(val)) range = " that is finite";
    snprintf(err, errlen, "%s: bad value '%s' for --%s (expected %s%s)", where, shown, d->name,
             d->type == OPT_DBL ? "a decimal number" : "a decimal integer", range);
    return PL_EINVAL;
}

}

/* Store one setting; an empty value is refused: `--resume ""` or `resume =` would otherwise
 * mean "not given" and quietly act as if it were not (a run that did not resume). */
static int set_option(pl_options *o, const opt_desc *d, const char *val, const char *where, char *err,
                      size_t errlen) {
    if (!val[0]) {
        snprintf(err, errlen, "%s: option --%s has an empty value (leave the option out for its default)", where,
                 d->name);
        return PL_EINVAL;
    }
    return set_option_value(o, d, val, where, err, errlen);
}

/* A name/value pair gathered before applying (presets go first); line: its line in the
 * config file (0 on the command line). */
typedef struct { const opt_desc *d; char *val; char where[PL_PATH + 48]; int line; } pending;
typedef struct {
    pending *v;
    int n, cap;
    int failed;
    char *err;
    size_t errlen;
    const char *file;
    /* the config file being parsed: its text, where the reader is, the current line number */
    const char *text;
    size_t pos, size;
    int lineno;
} pending_list;

static int pending_add(pending_list *l, const opt_desc *d, const char *val, const char *where, int line) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 32;
        pending *nv = realloc(l->v, sizeof(pending) * cap);
        if (!nv) return PL_ENOMEM;
        l->v = nv;
        l->cap = cap;
    }
    pending *p = &l->v[l->n++];
    p->d = d;
    p->val = strdup(val);
    p->line = line;
    snprintf(p->where, sizeof p->where, "%s", where);
    return p->val ? PL_OK : PL_ENOMEM;
}

/* Record the first error of a config file (later ones are not reported). */
static void file_fail(pending_list *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void file_fail(pending_list *l, const char *fmt, ...) {
    if (l->failed) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(l->err, l->errlen, "config file %s, line %d: %s", l->file, l->lineno, msg);
    l->failed = 1;
}

/* inih reader over the file's text: hands out one line at a time (leading blanks removed,
 * so an indented line is never taken as a continuation of the previous value), counts
 * lines, and refuses what inih would take silently or mangle: [sections], control
 * characters and lines too long for inih's buffer. Returns NULL at the end or on an error. */
static char *config_reader(char *str, int num, void *stream) {
    pending_list *l = stream;
    if (l->failed || l->pos >= l->size) return NULL;
    const char *p = l->text + l->pos, *nl = memchr(p, '\n', l->size - l->pos);
    size_t n = nl ? (size_t)(nl - p) + 1 : l->size - l->pos;
    l->pos += n;
    l->lineno++;
    size_t b = 0;
    while (b < n && (p[b] == ' ' || p[b] == '\t')) b++;
    for (size_t i = b; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\n' || c == '\t' || (c == '\r' && (i + 1 == n || p[i + 1] == '\n'))) continue;
        if (c < 0x20 || c == 0x7f) {
            file_fail(l, "control character \\x%02x in column %zu (not a text file?)", c, i + 1);
            return NULL;
        }
    }
    if (n - b + 1 > (size_t)num) {
        file_fail(l, "line of %zu characters is longer than the %d allowed", n - b, num - 2);
        return NULL;
    }
    if (b < n && p[b] == '[') {
        char shown[128], raw[128];
        size_t k = n - b < sizeof raw - 1 ? n - b : sizeof raw - 1;
        memcpy(raw, p + b, k);
        raw[k] = 0;
        raw[strcspn(raw, "\r\n")] = 0;
        escape_str(raw, shown, sizeof shown);
        file_fail(l, "'%s': sections are not supported (write plain `name = value` lines)", shown);
        return NULL;
    }
    memcpy(str, p + b, n - b);
    str[n - b] = 0;
    return str;
}

/* inih callback: record one `name = value` of the config file; refuse unknown names and a
 * setting given twice. */
static int config_ini_line(void *user, const char *section, const char *name, const char *value) {
    (void)section; /* always "": the reader refuses section headers */
    pending_list *l = user;
    char shown[128];
    const opt_desc *d = find_option(name);
    if (!d || d->offset == offsetof(pl_options, config) || d->scope == CMDS_BENCH) {
        escape_str(name, shown, sizeof shown);
        file_fail(l, "unknown setting '%s'", shown);
        return 0;
    }
    if (!value[0]) { /* `resume =` would read as "not given" */
        file_fail(l, "'%s' has an empty value (leave the line out for its default)", d->name);
        return 0;
    }
    for (int i = 0; i < l->n; i++)
        if (l->v[i].d == d) {
            file_fail(l, "'%s' is set twice (first on line %d)", d->name, l->v[i].line);
            return 0;
        }
    char where[PL_PATH + 48];
    snprintf(where, sizeof where, "config file %.*s, line %d", PL_PATH, l->file, l->lineno);
    if (pending_add(l, d, value, where, l->lineno) != PL_OK) {
        file_fail(l, "out of memory");
        return 0;
    }
    return 1;
}

static void pending_free(pending_list *l) {
    for (int i = 0; i < l->n; i++) free(l->v[i].val);
    free(l->v);
}

/* The option name of a command-line word "--name[=value]" as typed, cut to 63 characters. */
static void word_name(const char *word, char name[64]) {
    const char *eq = strchr(word + 2, '=');
    size_t n = eq ? (size_t)(eq - word - 2) : strlen(word + 2);
    if (n >= 64) n = 63;
    memcpy(name, word + 2, n);
    name[n] = 0;
}

/* '_' and '-' are one in names: a word whose name holds '_' is given to getopt_long as a copy
 * (*owned, freed by the caller) with '-' instead; *arg then points at it. */
static int dash_name(const char *word, char **owned, char **arg, char *err, size_t errlen) {
    size_t nlen = strcspn(word, "=");
    if (!memchr(word, '_', nlen)) return PL_OK;
    if (!(*owned = strdup(word))) {
        snprintf(err, errlen, "out of memory parsing the command line");
        return PL_ENOMEM;
    }
    for (size_t k = 2; k < nlen; k++)
        if ((*owned)[k] == '_') (*owned)[k] = '-';
    *arg = *owned;
    return PL_OK;
}

/* The subcommands' names, for messages (CFG_CMD_* order). */
static const char *const cmd_names[] = {"train", "bench", "eval", "generate", "tune"};

static int in_scope(const opt_desc *d, int cmd) {
    return d && (d->scope & CMD_BIT(cmd)) != 0;
}

/* Refuse what getopt_long matched unless it is the option d the word spells in full (m: its
 * match, or -1): an abbreviation, an unknown name, or an option this subcommand (cmd) does
 * not take. */
static int check_match(const char *name, const opt_desc *d, int m, int cmd, char *err, size_t errlen) {
    char shown[128];
    if (m >= 0 && !d && in_scope(&options[m], cmd)) {
        escape_str(name, shown, sizeof shown);
        snprintf(err, errlen, "option '--%s' is not spelled in full (did you mean --%s? abbreviations are "
                 "not accepted)", shown, options[m].name);
        return PL_EINVAL;
    }
    if (!d || m < 0 || &options[m] != d || !in_scope(d, cmd)) {
        escape_str(name, shown, sizeof shown);
        snprintf(err, errlen, "unknown option '--%s' for %s%s (see pipelm %s --help)", shown, cmd_names[cmd],
                 d && d->scope == CMDS_BENCH ? ": it is a bench option" : d ? ": it is a training option" : "",
                 cmd_names[cmd]);
        return PL_EINVAL;
    }
    return PL_OK;
}

/* Before anything else is read: every word that names an option names one this subcommand
 * takes, from the table or from its own list extra[0..nextra) (a value given as --name=--value
 * or after an option is not a name). */
int config_check_names(int argc, char **argv, int first, int cmd, const char *const *extra, int nextra, char *err,
                       size_t errlen) {
    if (cmd < 0 || cmd >= CFG_NCMDS) cmd = CFG_CMD_TRAIN;
    for (int i = first; i < argc; i++) {
        const char *w = argv[i];
        if (strncmp(w, "--", 2) != 0 || !w[2]) continue;
        char name[64], shown[128];
        word_name(w, name);
        const opt_desc *d = find_option(name);
        int own = 0;
        for (int k = 0; k < nextra && !own; k++) own = strcmp(extra[k], name) == 0;
        if (!own && !in_scope(d, cmd)) {
            escape_str(name, shown, sizeof shown);
            int prefix = 0; /* an abbreviation of a known option: getopt_long's check names it */
            for (int k = 0; k < NOPT && !prefix; k++)
                prefix = in_scope(&options[k], cmd) && strncmp(options[k].name, name, strlen(name)) == 0;
            if (prefix && !d) continue;
            snprintf(err, errlen, "unknown option '--%s' for %s%s (see pipelm %s --help)", shown, cmd_names[cmd],
                     d && d->scope == CMDS_BENCH ? ": it is a bench option" : d ? ": it is a training option" : "",
                     cmd_names[cmd]);
            return PL_EINVAL;
        }
        /* the next word is this option's value unless it is an option itself */
        if (!strchr(w, '=') && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) i++;
    }
    return PL_OK;
}

/* Gather the command line argv[first..argc) into cli through getopt_long (see the top of the
 * file); *preset: the value of --preset, if given. */
static int parse_command_line(pending_list *cli, int argc, char **argv, int first, int cmd,
                              const char **preset, char *err, size_t errlen) {
    struct option lo[NOPT + 1];
    for (int i = 0; i < NOPT; i++)
        lo[i] = (struct option){options[i].name, options[i].optional_default ? optional_argument : required_argument,
                                NULL, 256 + i};
    lo[NOPT] = (struct option){NULL, 0, NULL, 0};
    int nargs = (argc > first ? argc - first : 0) + 1;
    /* args: a program name, then the words; owned[k]: args[k] if it is our normalised copy */
    char **args = malloc(sizeof *args * (size_t)(nargs + 1)), **owned = calloc((size_t)nargs, sizeof *owned);
    int rc = PL_OK;
    if (!args || !owned) {
        snprintf(err, errlen, "out of memory parsing the command line");
        rc = PL_ENOMEM;
        goto out;
    }
    args[0] = (char *)"pipelm";
    for (int k = 1; k < nargs; k++) args[k] = argv[first + k - 1];
    args[nargs] = NULL;
    optind = 0; /* glibc: re-initialise completely */
    opterr = 0;
    for (;;) {
        int cur = optind ? optind : 1; /* the word getopt_long reads next */
        if (cur >= nargs) break;
        const char *word = argv[first + cur - 1];
        char name[64], shown[128];
        if (strncmp(word, "--", 2) != 0) {
            escape_str(word, shown, sizeof shown);
            snprintf(err, errlen, "unexpected argument '%s' (options start with --; see --help)", shown);
            rc = PL_EINVAL;
            goto out;
        }
        word_name(word, name);
        const opt_desc *d = find_option(name); /* the option spelled in full, or NULL */
        int r = 0, m = -1; /* getopt_long's answer; the option it matched (with r == ':', the
                            * one whose value is missing), or -1 */
        if (word[2]) {     /* "--" alone never reaches getopt_long: it would end the options */
            if ((rc = dash_name(word, &owned[cur], &args[cur], err, errlen)) != PL_OK) goto out;
            r = getopt_long(nargs, args, "+:", lo, NULL);
            if (r == -1) break;
            m = r >= 256 ? r - 256 : r == ':' && optopt >= 256 ? optopt - 256 : -1;
        }
        if ((rc = check_match(name, d, m, cmd, err, errlen)) != PL_OK) goto out;
        const char *val = optarg;
        /* a value that is the next word and starts with "--" is the next option: this one has
         * none (a value that starts with "--" is given as --name=--value) */
        if (r == ':' || (val && !strchr(word, '=') && strncmp(val, "--", 2) == 0)) {
            snprintf(err, errlen, "option --%s needs a value%s%s%s", name, r == ':' ? "" : " (the next word, '",
                     r == ':' ? "" : val, r == ':' ? "" : "', is an option: a value that starts with -- is given as "
                     "--name=--value)");
            rc = PL_EINVAL;
            goto out;
        }
        if (!val) { /* an optional value left out of --name=value: the next word, or the default */
            if (optind < nargs && strncmp(args[optind], "--", 2) != 0) val = args[optind++];
            else val = d->optional_default;
        }
        if (!val[0]) { /* --resume "" would read as "not given"; refused before any value is used */
            snprintf(err, errlen, "option --%s has an empty value (leave the option out for its default)", d->name);
            rc = PL_EINVAL;
            goto out;
        }
        if ((rc = pending_add(cli, d, val, "command line", 0)) != PL_OK) goto out;
        if (d->offset == offsetof(pl_options, preset)) *preset = cli->v[cli->n - 1].val;
    }
out:
    if (owned)
        for (int k = 0; k < nargs; k++) free(owned[k]);
    free(owned);
    free(args);
    return rc;
}

int config_parse(pl_options *o, int argc, char **argv, int first, int cmd, char *err, size_t errlen) {
    pending_list cli = {0}, file = {0};
    int rc = PL_OK;
    const char *preset = NULL;
    if (cmd < 0 || cmd >= CFG_NCMDS) cmd = CFG_CMD_TRAIN;
    /* 1. the command line: unknown names first, then gathered */
    if ((rc = config_check_names(argc, argv, first, cmd, NULL, 0, err, errlen)) != PL_OK) goto out;
    if ((rc = parse_command_line(&cli, argc, argv, first, cmd, &preset, err, errlen)) != PL_OK) goto out;
    /* 2. the config file, if any, gathered */
    for (int i = 0; i < cli.n; i++)
        if (cli.v[i].d->offset == offsetof(pl_options, config)) {
            snprintf(o->config, sizeof o->config, "%s", cli.v[i].val);
        }
    if (o->config[0]) {
        file.err = err;
        file.errlen = errlen;
        file.file = o->config;
        FILE *cf = NULL;
        char *text = NULL;
        if (pl_open_input(o->config, "config file", CONFIG_MAX_BYTES, &cf, err, errlen) != PL_OK) {
            rc = PL_EINVAL;
            goto out;
        }
        text = malloc(CONFIG_MAX_BYTES + 1);
        size_t got = text ? fread(text, 1, CONFIG_MAX_BYTES + 1, cf) : 0;
        int rerr = text ? ferror(cf) : 1;
        fclose(cf);
        if (rerr || got > CONFIG_MAX_BYTES) {
            snprintf(err, errlen, "config file %s: %s", o->config,
                     rerr ? "cannot read it" : "larger than the 1 MiB a config file may be");
            free(text);
            rc = PL_EINVAL;
            goto out;
        }
        text[got] = 0;
        file.text = text;
        file.size = got;
        int r = ini_parse_stream(config_reader, &file, config_ini_line, &file);
        if (!file.failed && r > 0) {
            /* inih's own complaint: a line that is not `name = value` (r is its number) */
            char raw[128] = "", shown[160];
            const char *p = text;
            for (int k = 1; k < r && p; k++) {
                p = memchr(p, '\n', got - (size_t)(p - text));
                if (p) p++;
            }
            if (p) {
                size_t n = strcspn(p, "\r\n");
                if (n > (size_t)(got - (size_t)(p - text))) n = got - (size_t)(p - text);
                if (n > sizeof raw - 1) n = sizeof raw - 1;
                memcpy(raw, p, n);
                raw[n] = 0;
            }
            escape_str(raw, shown, sizeof shown);
            snprintf(err, errlen, "config file %s, line %d: '%s' is not a `name = value` line", o->config, r, shown);
            file.failed = 1;
        } else if (!file.failed && r < 0) {
            snprintf(err, errlen, "config file %s: out of memory while parsing it", o->config);
            file.failed = 1;
        }
        free(text);
        file.text = NULL;
        if (file.failed) { rc = PL_EINVAL; goto out; }
        if (!preset)
            for (int i = 0; i < file.n; i++)
                if (file.v[i].d->offset == offsetof(pl_options, preset)) preset = file.v[i].val;
    }
    /* 3. preset, then file values, then command-line values */
    if (preset && (rc = config_preset(o, preset, err, errlen)) != PL_OK) goto out;
    for (int i = 0; i < file.n; i++)
        if ((rc = set_option(o, file.v[i].d, file.v[i].val, file.v[i].where, err, errlen)) != PL_OK) goto out;
    for (int i = 0; i < cli.n; i++)
        if ((rc = set_option(o, cli.v[i].d, cli.v[i].val, cli.v[i].where, err, errlen)) != PL_OK) goto out;
out:
    pending_free(&cli);
    pending_free(&file);
    return rc;
}

void config_train_of(const pl_options *o, cfg_train *t) {
    memset(t, 0, sizeof *t);
    t->hp = o->hp;
    t->warmup_steps = o->hp.warmup_steps;
    t->total_steps = o->hp.total_steps;
    t->batch = o->batch;
    t->seq_len = o->seq_len;
    t->microbatches = o->microbatches;
    /* recorded when positive (train_ckpt.c); with Markov data it must be valid in any case */
    t->markov_branch = strcmp(o->data, "markov") == 0 || o->markov_branch > 0 ? o->markov_branch : -1;
}

int config_vocab(const pl_options *o) {
    int dv = data_spec_vocab(o->data);
    return dv && !o->set_vocab ? dv : o->vocab_size;
}

int config_model(const pl_options *o, int V, model_config *cfg, char *err, size_t errlen) {
    const model_arch *A = arch_find(o->arch);
    if (!A) { /* the option's choices are the registry's names: only a caller filling o by hand gets here */
        char known[128];
        arch_names(" or ", known, sizeof known);
        snprintf(err, errlen, "--arch must be %s (got '%s')", known, o->arch);
        return PL_EINVAL;
    }
    return A->config_from_options(o, V, cfg, err, errlen);
}

/* The model and training settings of a run without --init, through the one validation; with
 * --init only what does not depend on the model (train.c checks the rest once the header is
 * read). */
static int validate_model_and_train(const pl_options *o, char *err, size_t errlen) {
    cfg_train t;
    config_train_of(o, &t);
    model_config c;
    if (!o->init[0]) PL_TRY(config_model(o, config_vocab(o), &c, err, errlen));
    return config_check_train(&t, o->init[0] ? NULL : &c, CFG_NAME_OPTION, err, errlen);
}

/* One item of a hint list: "key=value", the key (leading blanks dropped) and the value each
 * 1..127 characters, as ckpt.c's make_hints takes them. */
static int hint_ok(const char *h, size_t n) {
    size_t b = strspn(h, " \t"), eq = strcspn(h, "=");
    return eq < n && eq > b && eq - b < 128 && n - eq > 1 && n - eq - 1 < 128;
}

int config_check_ckpt(const pl_options *o, char *err, size_t errlen) {
    char shown[128];
    if (strcmp(o->ckpt_xfer, "independent") != 0 && strcmp(o->ckpt_xfer, "collective") != 0) {
        escape_str(o->ckpt_xfer, shown, sizeof shown);
        snprintf(err, errlen, "--ckpt-xfer (or PIPELM_CKPT_XFER) must be independent or collective (got '%s')", shown);
        return PL_EINVAL;
    }
    if (o->ckpt_hints[0] == '\x01') {
        snprintf(err, errlen, "PIPELM_CKPT_HINTS is longer than the %zu characters --ckpt-hints takes",
                 sizeof o->ckpt_hints - 1);
        return PL_EINVAL;
    }
    for (const char *h = o->ckpt_hints; *h;) {
        size_t n = strcspn(h, ",");
        if (n && !hint_ok(h, n)) {
            char item[256];
            snprintf(item, sizeof item, "%.*s", (int)(n < 200 ? n : 200), h);
            escape_str(item, shown, sizeof shown);
            snprintf(err, errlen, "--ckpt-hints (or PIPELM_CKPT_HINTS): '%s' is not key=value (each of 1 to 127 "
                     "characters; items separated by ',')", shown);
            return PL_EINVAL;
        }
        h += n + (h[n] == ',');
    }
    if (o->ckpt_verify != 0 && o->ckpt_verify != 1) {
        snprintf(err, errlen, "--ckpt-verify must be 0 or 1 (got %d)", o->ckpt_verify);
        return PL_EINVAL;
    }
    if (o->ckpt_space_check != 0 && o->ckpt_space_check != 1) {
        snprintf(err, errlen, "--ckpt-space-check must be 0 or 1 (got %d)", o->ckpt_space_check);
        return PL_EINVAL;
    }
    if (o->ckpt_async != 0 && o->ckpt_async != 1) {
        snprintf(err, errlen, "--ckpt-async must be 0 or 1 (got %d)", o->ckpt_async);
        return PL_EINVAL;
    }
    return PL_OK;
}

int config_validate(const pl_options *o, char *err, size_t errlen) {
#define REQUIRE(cond, ...) do { if (!(cond)) { snprintf(err, errlen, __VA_ARGS__); return PL_EINVAL; } } while (0)
    REQUIRE(o->hp.total_steps >= 1, "--steps must be >= 1 (got %d): it counts the optimizer steps of the run",
            o->hp.total_steps);
    REQUIRE(o->batch >= 1, "--batch must be >= 1 (got %d)", o->batch);
    REQUIRE(o->seq_len >= 1, "--seq-len must be >= 1 (got %d)", o->seq_len);
    REQUIRE(o->microbatches >= 1, "--microbatches must be >= 1 (got %d)", o->microbatches);
    REQUIRE(o->hp.warmup_steps >= 0, "--warmup-steps must be >= 0 (got %d)", o->hp.warmup_steps);
    REQUIRE(o->eval_every >= 0, "--eval-every must be >= 0 (got %d)", o->eval_every);
    REQUIRE(o->val_batches >= 1, "--val-batches must be >= 1 (got %d)", o->val_batches);
    REQUIRE(o->log_every >= 1, "--log-every must be >= 1 (got %d)", o->log_every);
    REQUIRE(o->timers_every >= 0, "--timers-every must be >= 0 (got %d)", o->timers_every);
    REQUIRE(o->dp >= -1, "--dp must be >= 0 or auto (got %d)", o->dp);
    REQUIRE(o->stages >= -1, "--stages must be >= 0 or auto (got %d)", o->stages);
    REQUIRE(o->chunks >= 0 && o->chunks <= 64, "--chunks-per-rank must be 0 to 64 (got %d)", o->chunks);
    REQUIRE(o->tp >= 1 && o->tp <= 64, "--tp must be 1 to 64 (got %d)", o->tp);
    REQUIRE(o->cp >= 1 && o->cp <= 64, "--cp must be 1 to 64 (got %d)", o->cp);
        REQUIRE(o->zero == 0 || o->zero == 1, "--zero must be 0 or 1 (got %d)", o->zero);
    REQUIRE(o->threads >= 0, "--threads must be >= 0 (got %d)", o->threads);
    REQUIRE(o->bind == 0 || o->bind == 1, "--bind must be 0 or 1 (got %d)", o->bind);
    REQUIRE(o->blas_auto == 0 || o->blas_auto == 1, "--blas-auto must be 0 or 1 (got %d)", o->blas_auto);
    REQUIRE(o->stop_grace >= 0 && o->stop_grace <= 1e7, "--stop-grace must be in [0, 1e7] seconds (got %g)",
            o->stop_grace);
    REQUIRE(o->ckpt_every >= 0, "--ckpt-every must be >= 0 (got %d)", o->ckpt_every);
    REQUIRE(o->ckpt_keep >= 0, "--ckpt-keep must be >= 0 (got %d)", o->ckpt_keep);
    REQUIRE(o->ckpt_overwrite == 0 || o->ckpt_overwrite == 1, "--ckpt-overwrite must be 0 or 1 (got %d)",
            o->ckpt_overwrite);
    REQUIRE(o->shuffle >= -1 && o->shuffle <= 1, "--shuffle must be 0 or 1 (got %d)", o->shuffle);
    REQUIRE(o->data_changed == 0 || o->data_changed == 1, "--data-changed must be 0 or 1 (got %d)", o->data_changed);
    REQUIRE(!o->ckpt_every || o->ckpt_dir[0], "--ckpt-every needs --ckpt-dir");
    REQUIRE(strcmp(o->resume, "latest") != 0 || o->ckpt_dir[0], "a bare --resume needs --ckpt-dir (or give --resume FILE)");
    if (config_check_ckpt(o, err, errlen) != PL_OK) return PL_EINVAL;
    REQUIRE(o->warmup >= 0, "--warmup must be >= 0 (got %d)", o->warmup);
    REQUIRE(o->peak_gflops >= 0, "--peak-gflops must be >= 0 (got %g)", o->peak_gflops);
    REQUIRE(o->watchdog >= 0 && o->watchdog <= 1e7, "--watchdog must be in [0, 1e7] seconds (got %g)", o->watchdog);
    REQUIRE(strcmp(o->hooks.fail_at, "before") == 0 || strcmp(o->hooks.fail_at, "during") == 0 ||
                strcmp(o->hooks.fail_at, "after") == 0 || strcmp(o->hooks.fail_at, "save") == 0 ||
                strcmp(o->hooks.fail_at, "nan") == 0 || strcmp(o->hooks.fail_at, "stall") == 0 || strcmp(o->hooks.fail_at, "tp") == 0 ||
                strcmp(o->hooks.fail_at, "tp-kill") == 0 || strcmp(o->hooks.fail_at, "ep-kill") == 0 ||
                strcmp(o->hooks.fail_at, "cp") == 0 || strcmp(o->hooks.fail_at, "cp-kill") == 0,
            "--fail-at must be before, during, after, save, nan, stall, tp, tp-kill, ep-kill, cp or cp-kill (got '%s')",
            o->hooks.fail_at);
    char kinds[512];
    sched_kind_names(kinds, sizeof kinds);
    REQUIRE(sched_kind_find(o->schedule) != NULL || strcmp(o->schedule, "auto") == 0,
            "--schedule must be one of %s, or auto (got '%s')", kinds, o->schedule);
    REQUIRE(!o->init[0] || !o->resume[0], "--init cannot be used with --resume: a resumed run takes its weights "
            "from the checkpoint (drop --init; or drop --resume to start from %.512s)", o->init);
    REQUIRE(strcmp(o->backend, "auto") != 0 || strcmp(o->precision, "bf16") != 0 || backend_find("onednn"),
            "--precision bf16: --backend auto takes onednn for bf16, and this binary was built without it "
            "(built: %s; ./configure finds Debian's libdnnl-dev%s)", backend_list(),
            backend_find("cuda") ? "; or --backend cuda on a GPU" : "");
    const backend *be = backend_find(config_backend(o)); /* an unknown one: the run says which are built */
    if (be && backend_opts_check(be, o->backend_opt, err, errlen) != PL_OK) return PL_EINVAL;
#undef REQUIRE
    /* lr, betas, eps, weight decay, batch, seq-len, markov-branch, the model: the checkpoint's ranges */
    return validate_model_and_train(o, err, errlen);
}

/* The backend a run uses: --backend, or for "auto" the one for --precision: for bf16 the
 * oneDNN backend's auto variant ("onednn/auto", onednn_auto.h: named onednn, it multiplies in
 * bf16 where that beats fp32 on this CPU by its ISA and vendor, e.g. AMX or AMD's AVX512-BF16,
 * and runs fp32 products otherwise, e.g. Intel's AVX512-BF16 without AMX, saying which and why
 * on the banner; whether it can run at all is its init's to say, with a message), cpu for
 * fp32, because OpenBLAS is the fp32 reference (so the default run's bits are the
 * reference's). Later: a GPU backend when one is built and a GPU is present (its init would
 * have to be tried here). */
const char *config_backend(const pl_options *o) {
    if (strcmp(o->backend, "auto") != 0) return o->backend;
    if (strcmp(o->precision, "bf16") != 0) return "cpu";
    return backend_find("onednn/auto") ? "onednn/auto" : "onednn";
}

/* --schedule's help line, from the schedule registry. */
static const char *schedule_help(char *buf, size_t len) {
    char kinds[256];
    sched_kind_names(kinds, sizeof kinds);
    snprintf(buf, len, "pipeline schedule: %s (`pipelm schedule --help`: each one's chunks and what it needs of M), "
             "or auto (the fastest for --costs-in FILE, measured with this --microbatches: schedule, M and V "
             "chosen by pipelm tune's search)", kinds);
    return buf;
}

/* An option's help line; --backend's names the backends this binary was built with,
 * --schedule's the registry's schedules. */
static const char *help_text(const opt_desc *d, char *buf, size_t len) {
    if (d->offset == offsetof(pl_options, schedule)) return schedule_help(buf, len);
    if (d->offset != offsetof(pl_options, backend)) return d->help;
    char names[128]; /* backend_list()'s "cpu,onednn" as "cpu | onednn" */
    size_t o = 0;
    for (const char *b = backend_list(); *b && o + 4 < sizeof names; b++) {
        if (*b == ',') {
            memcpy(names + o, " | ", 3);
            o += 3;
        } else names[o++] = *b;
    }
    names[o] = 0;
    snprintf(buf, len, "compute backend: %s (the ones built into this binary), or auto (default: onednn for "
             "--precision bf16, cpu for fp32)", names);
    return buf;
}

int config_option_at(int i, int cmd, const char **name, int *taken, int *optional) {
    if (i < 0 || i >= NOPT || cmd < 0 || cmd >= CFG_NCMDS) return PL_EINVAL;
    *name = options[i].name;
    *taken = in_scope(&options[i], cmd);
    *optional = options[i].optional_default != NULL;
    return PL_OK;
}

void config_print_help(FILE *out, int cmd) {
    if (cmd < 0 || cmd >= CFG_NCMDS) cmd = CFG_CMD_TRAIN;
    for (int i = 0; i < NOPT; i++) {
        if (!in_scope(&options[i], cmd) || (options[i].scope & HIDDEN)) continue;
        const char *arg = options[i].type == OPT_STR ? "S" : options[i].type == OPT_DBL ? "X" : "N";
        char flag[64], help[512];
        snprintf(flag, sizeof flag, "--%s %s%s%s", options[i].name, options[i].optional_default ? "[" : "", arg,
                 options[i].optional_default ? "]" : "");
        fprintf(out, "  %-24s %s\n", flag, help_text(&options[i], help, sizeof help));
    }
    fprintf(out, "  backend settings (--backend-opt KEY=VALUE; the variable named is an older alias):\n");
    backend_print_opts(out);
}

/* Print a string as a JSON string literal. */
static void json_str(FILE *out, const char *s) {
    fputc('"', out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
        else if (c < 0x20) fprintf(out, "\\u%04x", c);
        else fputc(c, out);
    }
    fputc('"', out);
}

void config_write_json(const pl_options *o, FILE *out) {
    fputc('{', out);
    for (int i = 0; i < NOPT; i++) {
        const opt_desc *d = &options[i];
        const void *src = (const char *)o + d->offset;
        fprintf(out, "%s\"%s\":", i ? "," : "", d->name);
        switch (d->type) {
        case OPT_INT: fprintf(out, "%d", *(const int *)src); break;
        case OPT_LL: fprintf(out, "%lld", *(const long long *)src); break;
        case OPT_DBL: fprintf(out, "%.9g", *(const double *)src); break;
        case OPT_STR: json_str(out, (const char *)src); break;
        }
    }
    fputc('}', out);
}
