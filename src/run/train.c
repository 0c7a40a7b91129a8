/*
 * train.c — the training loop of one rank: set-up, steps, evaluation, reporting.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>
#include "backend/backend_poll.h"
#include "backend/backend_prof.h"
#include "run/bench.h"
#include "backend/cpu/blas.h"
#include "ckpt/ckpt.h"
#include "ckpt/ckpt_async.h"
#include "parallel/comm.h"
#include "util/common.h"
#include "util/crc32c.h"
#include "cli/config.h"
#include "formats/data.h"
#include "pipeline/engine.h"
#include "util/exact.h"
#include "run/eval.h"
#include "run/generate.h"
#include "util/files.h"
#include "formats/hf.h"
#include "run/layout.h"
#include "formats/llmc.h"
#include "run/metrics.h"
#include "model/stage.h"
#include "pipeline/sched.h"
#include "util/signals.h"
#include "pipeline/split.h"
#include "parallel/tp.h"
#include "pipeline/trace.h"
#include "run/run.h"
#include "formats/safetensors.h"
#include "run/train.h"
#include "pipeline/tune.h"

/* The learning rate of a step: the optimizer's schedule over the run's hyper-parameters. */
double train_lr(const pl_options *o, int step) { return optim_lr(&o->hp, step); }

/* All ranks agree on a status: the worst code wins; rank 0 says who failed. */
static int agree(run *R, int rc, const char *phase) {
    int who = -1, out = comm_agree(R->world, rc, &who);
    if (out != PL_OK && R->wrank == 0 && R->W > 1 && who >= 0) {
        if (R->D > 1)
            fprintf(stderr, "pipelm: stopping all %d ranks: rank %d (pipeline rank %d of replica %d) failed during %s "
                    "(message above)\n", R->W, who, who / R->D, who % R->D, phase);
        else
            fprintf(stderr, "pipelm: stopping all %d ranks: rank %d failed during %s (message above)\n",
                    R->W, who, phase);
    }
    return out;
}
/* --init's model against the model settings given explicitly (o->set_mask: the command line
 * or the config file, never a preset's or the default values): the first that differs is
 * refused, naming it and the file's value. */
static int init_conflicts(const pl_options *o, const model_config *c, char *err, size_t errlen) {
    if ((o->set_mask & CFG_SET_ARCH) && strcmp(o->arch, model_arch_name(c->arch)) != 0) {
        snprintf(err, errlen, "--arch %s conflicts with %.512s, which is a %s model", o->arch, o->init,
                 model_arch_name(c->arch));
        return PL_EINVAL;
    }
    const char *names[] = {"vocab-size", "max-seq-len", "n-layer", "n-head", "n-embd", "n-kv-head"};
    unsigned bits[] = {CFG_SET_VOCAB, CFG_SET_MAXT, CFG_SET_LAYER, CFG_SET_HEAD, CFG_SET_EMBD, CFG_SET_KVHEAD};
    int a[] = {o->vocab_size, o->max_seq_len, o->n_layer, o->n_head, o->n_embd, o->n_kv_head ? o->n_kv_head : o->n_head};
    int b[] = {c->V, c->maxT, c->L, c->NH, c->C, c->NKV};
    for (int i = 0; i < 6; i++)
        if ((o->set_mask & bits[i]) && a[i] != b[i]) {
            snprintf(err, errlen, "--%s %d conflicts with %.512s, which has %s %d", names[i], a[i], o->init, names[i],
                     b[i]);
            return PL_EINVAL;
        }
    return arch_of(c)->init_conflicts(o, c, err, errlen); /* the architecture's own settings */
}
/* eval and generate from --resume: a model setting given on the command line that differs
 * from the checkpoint's is refused as --init's is (the message names the checkpoint). */
static int resume_conflicts(const pl_options *o, const model_config *c, char *err, size_t errlen) {
    pl_options *named = malloc(sizeof *named);
    if (!named) return PL_ENOMEM;
    *named = *o;
    snprintf(named->init, sizeof named->init, "checkpoint %.4000s",
             strcmp(o->resume, "latest") == 0 ? o->ckpt_dir : o->resume);
    int rc = init_conflicts(named, c, err, errlen);
    free(named);
    return rc;
}
/* Resolve the model dimensions: from --init's header, else from the options; then the
 * training settings that depend on the model (seq-len, markov-branch), by the one validation
 * the checkpoint loader uses too. */
static int resolve_config(run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    if (o->init[0] && hf_is_model(o->init)) { /* a Hugging Face model: config.json holds every setting */
        PL_TRY(hf_read_config(o->init, &R->cfg, err, errlen));
        PL_TRY(init_conflicts(o, &R->cfg, err, errlen));
    } else if (o->init[0]) {
        int version;
        PL_TRY(llmc_read_config(o->init, &R->cfg, &version, err, errlen));
        PL_TRY(init_conflicts(o, &R->cfg, err, errlen));
        if (arch_of(&R->cfg)->llmc_options) PL_TRY(arch_of(&R->cfg)->llmc_options(o, &R->cfg, err, errlen));
    } else if (o->eval_mode && o->resume[0]) {
        PL_TRY(train_resume_config(o, &R->cfg, err, errlen));
        PL_TRY(resume_conflicts(o, &R->cfg, err, errlen));
    }
    else PL_TRY(config_model(o, config_vocab(o), &R->cfg, err, errlen));
    cfg_train t;
    config_train_of(o, &t);
    return config_check_train(&t, &R->cfg, CFG_NAME_OPTION, err, errlen);
}
/* No output may be an input, or another output: the table of train, bench, eval and
 * generate (pl_check_io: by inode, inside an input directory, or by resolved name for files
 * not written yet). */
static int check_outputs_distinct(const pl_options *o, char *err, size_t errlen) {
    const char *data = strncmp(o->data, "text:", 5) == 0 ? o->data + 5 : o->data;
    const char *val = strncmp(o->val_data, "text:", 5) == 0 ? o->val_data + 5 : o->val_data;
    const char *resume = strcmp(o->resume, "latest") == 0 ? o->ckpt_dir : o->resume;
    const gen_opts *g = o->eval_mode == 2 ? o->gen : NULL;
    int bench = o->bench || (g && g->bench);
    pl_io in[] = {{"--data", strcmp(data, "markov") ? data : ""}, {"--val-data", strcmp(val, "markov") ? val : ""},
                  {"--init", o->init}, {"--config", o->config}, {"--resume", resume},
                  {"--schedule-csv", o->schedule_csv}, {"--costs-in", o->costs_in}, {"--ckpt-dir", o->ckpt_dir},
                  {"--prompt-file", g ? g->prompt_file : ""}, {"--tokenizer", g ? g->tokenizer : ""}};
    pl_io out[] = {{"--save-final", o->save_final}, {"--trace", o->trace}, {"--dump-grads", o->dump_grads},
                   {"--metrics", o->metrics}, {"--json", o->bench ? o->json : o->eval_json},
                   {"--csv", o->bench ? o->csv : ""}, {"--costs-out", o->bench ? o->costs_out : ""},
                   {"--tokens-out", g ? g->tokens_out : ""}, {"--logits-out", g ? g->logits_out : ""},
                   {"--json", g && bench ? g->bench_json : ""}};
    return pl_check_io(in, (int)(sizeof in / sizeof in[0]), out, (int)(sizeof out / sizeof out[0]), err, errlen);
}

/* Every output path must be writable before step 1: work is not lost at the end. */
static int check_outputs(const run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    if (R->wrank == 0 && o->save_final[0]) PL_TRY(pl_check_output_file(o->save_final, "--save-final", err, errlen));
    if (R->wrank == 0 && o->trace[0]) PL_TRY(pl_check_output_file(o->trace, "--trace", err, errlen));
    if (R->wrank == 0 && o->dump_grads[0]) PL_TRY(pl_check_output_file(o->dump_grads, "--dump-grads", err, errlen));
    if (o->bench && R->wrank == 0 && o->json[0]) PL_TRY(pl_check_output_file(o->json, "--json", err, errlen));
    if (o->bench && R->wrank == 0 && o->csv[0]) PL_TRY(pl_check_output_file(o->csv, "--csv", err, errlen));
    if (o->bench && R->wrank == 0 && o->costs_out[0])
        PL_TRY(pl_check_output_file(o->costs_out, "--costs-out", err, errlen));
    if (o->ckpt_dir[0] && !o->bench) PL_TRY(pl_check_output_dir(o->ckpt_dir, "--ckpt-dir", err, errlen));
    if (R->wrank == 0 && o->ckpt_dir[0] && !o->bench) { /* the pointer each save replaces */
        char latest[PL_PATH + 16];
        snprintf(latest, sizeof latest, "%s/latest", o->ckpt_dir);
        if (access(latest, F_OK) == 0 || errno != ENOENT) PL_TRY(pl_check_output_file(latest, "--ckpt-dir's", err, errlen));
    }
    return check_outputs_distinct(o, err, errlen);
}
/* Rank 0: take the lock of --ckpt-dir before step 1, so that one job at a time writes it
 * (ckpt_lock_take; a held lock fails the set-up on every rank through its agreement). */
static int lock_ckpt_dir(const run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    if (!o->ckpt_dir[0] || o->bench || R->wrank != 0) return PL_OK;
    char note[1024];
    PL_TRY(ckpt_lock_take(o->ckpt_dir, note, sizeof note, err, errlen));
    if (note[0]) pl_note("%s", note);
    return train_ckpt_guard(R, err, errlen);
}
/* The backend named by --backend (auto: config_backend's choice), set up with --precision
 * and this rank's threads. */
static int setup_backend(run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    backend_options bo = {PL_PREC_FP32, R->lay.threads, -1, R->lay.local_rank, R->lay.local_ranks, o->backend_opt};
    if (backend_parse_precision(o->precision, &bo.precision) != 0) {
        snprintf(err, errlen, "--precision %s: not fp32 or bf16", o->precision);
        return PL_EINVAL;
    }
    const char *name = config_backend(o);
    const backend *be = backend_find(name);
    if (!be) {
        snprintf(err, errlen, "unknown or unbuilt backend '%s' (this build has: %s)%s%s", name, backend_list(),
                 backend_refusal()[0] ? "; refused: " : "", backend_refusal());
        return PL_EINVAL;
    }
    char e2[512] = "";
    if (be->init(&bo, e2, sizeof e2) != 0) {
        snprintf(err, errlen, "backend %s%s cannot run here: %s", be->name,
                 strcmp(o->backend, "auto") == 0 ? " (--backend auto's choice for this precision)" : "", e2);
        return PL_EINVAL;
    }
    /* a benchmark also says where the step goes: its ops are timed by class (--profile-ops,
     * alias PIPELM_PROFILE_OPS) */
    const char *pe = getenv("PIPELM_PROFILE_OPS");
    R->profiled = o->bench || o->profile_ops || (pe && strcmp(pe, "0") != 0 && pe[0]);
    R->be = R->profiled ? backend_profiled(be) : be;
    /* replicas: their reductions are tested after every op (dp.c's poll) */
    if (R->D > 1) R->be = backend_polled(R->be);
    return be->set_threads(R->lay.threads);
}

/* The pipeline rank of the last stage (the loss): P - 1, or 0 when a V places it there. */
static int last_rank(const run *R) {
    return sched_place_rank(R->sc.place, R->P, R->S > 0 ? R->S - 1 : R->P - 1);
}

/* --recompute for every stage (R->rc_modes): one mode for all, or one per stage. */
static int recompute_modes(run *R, char *err, size_t errlen) {
    char list[256];
    snprintf(list, sizeof list, "%s", R->o->recompute);
    int n = 0, k = 0;
    for (const char *p = list; *p; p++) n += *p == ',';
    n++;
    if (n != 1 && n != R->S) {
        snprintf(err, errlen, "--recompute %s: give one mode or one per stage (%d here), not %d", R->o->recompute,
                 R->S, n);
        return PL_EINVAL;
    }
    char *save = NULL;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save), k++) {
        int m = !strcmp(t, "none") ? STAGE_RECOMPUTE_NONE : !strcmp(t, "selective") ? STAGE_RECOMPUTE_SELECTIVE
              : !strcmp(t, "full") ? STAGE_RECOMPUTE_FULL : -1;
        if (m < 0) {
            snprintf(err, errlen, "--recompute: '%s' is not none, selective or full", t);
            return PL_EINVAL;
        }
        for (int st = 0; st < R->S; st++)
            if (n == 1 || k == st) R->rc_modes[st] = m;
    }
    if (k != n) {
        snprintf(err, errlen, "--recompute %s: an empty entry", R->o->recompute);
        return PL_EINVAL;
    }
    return PL_OK;
}

/* --schedule auto: the tuner's first pick for --costs-in (measured with this M) on P ranks and
 * this replica's batch under the node's memory per rank; sets R->M, *name (into buf) and *V. */
static int auto_schedule(run *R, char *buf, size_t len, int *V, char *err, size_t errlen) {
    const pl_options *o = R->o;
    if (!o->costs_in[0]) {
        snprintf(err, errlen, "--schedule auto needs --costs-in FILE (pipelm bench --costs-out, measured with "
                 "--microbatches %d)", R->M);
        return PL_EINVAL;
    }
    sched_costs c;
    PL_TRY(run_costs_read(R, &c, err, errlen));
    int rc;
    long pages = sysconf(_SC_PHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
    tune_query q = {R->P, R->B, R->M, pages > 0 && ps > 0 ? (double)pages * ps / 1048576.0 / R->W : -1, 0, R->cfg.L, NULL, 0, 0, 1, 1, 1};
    tune_cand *t = NULL;
    int n = 0, tried = 0;
    const sched_costs *cs[TUNE_NMODES] = {&c, NULL, NULL};
    rc = tune_search(&q, cs, &t, &n, &tried, err, errlen);
    sched_costs_free(&c);
    if (rc == PL_OK) {
        snprintf(buf, len, "%s", t[0].schedule);
        *V = t[0].V;
        R->M = t[0].M;
        if (R->wrank == 0)
            pl_info("--schedule auto: %s, %d micro-batches, %d chunk(s) per rank (predicted %.2f ms per step, bubble "
                    "%.1f%%: the best of %d layouts for %s)\n", buf, R->M, *V, 1e3 * t[0].step_s, 100 * t[0].bubble,
                    tried, o->costs_in);
    }
    free(t);
    return rc;
}

/* The schedule: --schedule-csv's file or --schedule built for P ranks x V chunks; sets R->V, R->S. */
static int choose_schedule(run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    int V = o->chunks > 0 ? o->chunks : sched_default_chunks(o->schedule);
    char name[32];
    snprintf(name, sizeof name, "%s", o->schedule);
    if (!o->schedule_csv[0] && strcmp(o->schedule, "auto") == 0) PL_TRY(auto_schedule(R, name, sizeof name, &V, err, errlen));
    if (o->schedule_csv[0]) {
        FILE *f = fmemopen(R->csv_text, R->csv_len, "r");
        if (!f) {
            snprintf(err, errlen, "schedule file %.512s: out of memory", o->schedule_csv);
            return PL_ENOMEM;
        }
        int rc = sched_read_csv(f, "csv", &R->sc, err, errlen);
        fclose(f);
        PL_TRY(rc);
        if (R->sc.P != R->P) {
            snprintf(err, errlen, "schedule file %.512s has %d rows (ranks) but the job has %d pipeline ranks",
                     o->schedule_csv, R->sc.P, R->P);
            return PL_EINVAL;
        }
        if (R->sc.M != R->M) {
            snprintf(err, errlen, "schedule file %.512s uses %d micro-batches but --microbatches is %d",
                     o->schedule_csv, R->sc.M, R->M);
            return PL_EINVAL;
        }
        if (o->chunks > 0 && o->chunks != R->sc.V) {
            snprintf(err, errlen, "schedule file %.512s has %d chunk(s) per rank (%d stages on %d rows) but "
                     "--chunks-per-rank is %d", o->schedule_csv, R->sc.V, R->sc.V * R->sc.P, R->sc.P, o->chunks);
            return PL_EINVAL;
        }
        V = R->sc.V > 1 ? R->sc.V : 1;
    } else {
        PL_TRY(sched_build_chunks(name, R->P, V, R->M, &R->sc, err, errlen));
    }
    PL_TRY(sched_validate(&R->sc, err, errlen));
    if (V > 1 && R->P < 2) {
        snprintf(err, errlen, "%d chunks per rank on one pipeline rank: virtual stages need at least 2 pipeline "
                 "ranks (on one they would only send to themselves; run --chunks-per-rank 1)", V);
        return PL_EINVAL;
    }
    R->V = V;
    R->S = R->P * V;
    return PL_OK;
}

/* The V stages this rank computes (chunk c = global stage c P + rank) with their slots,
 * deferred weight buffers and recomputation; with V > 1 the holder of their parameters. */
static int setup_stages(run *R, char *err, size_t errlen) {
    int P = R->P, V = R->V, S = R->S;
    R->rc_modes = calloc((size_t)S, sizeof(int));
    R->stv = V > 1 ? calloc((size_t)V, sizeof(stage)) : &R->st;
    if (!R->rc_modes || !R->stv) return PL_ENOMEM;
    PL_TRY(recompute_modes(R, err, errlen));
    model_config lc = R->cfg; /* --tp: the stages hold this rank's slice of the blocks */
    if (R->Tp > 1) { lc.tp = R->Tp; lc.tpr = R->t; }
    if (R->C > 1) { lc.cp = R->C; lc.cpr = R->c; } /* --cp: T / C rows of each sequence (model_cp_pos) */
    lc.moe.mb_share = (float)((double)(R->B / R->M) / R->Bg); /* a micro-batch's share of the step (MoE aux loss) */
    for (int c = 0; c < V; c++) {
        int s = sched_place_stage(R->sc.place, P, R->rank, c), nslots = sched_max_inflight_stage(&R->sc, s);
        stage *st = &R->stv[c];
        PL_TRY(stage_init(st, &lc, R->sp.first[s], R->sp.first[s] + R->sp.blocks[s], s == 0, s == S - 1,
                          R->B / R->M, R->Tl, nslots > 0 ? nslots : 1, R->be, err, errlen));
        if (sched_defers_weights_stage(&R->sc, s)) PL_TRY(stage_init_deferred(st, err, errlen));
        PL_TRY(stage_init_recompute(st, R->rc_modes[s], err, errlen));
    }
    if (V > 1) PL_TRY(stage_init_holder(&R->st, R->stv, V, err, errlen));
    return PL_OK;
}

/* --grad-accum exact (exact.h): refused where it cannot hold, else the accumulator of the
 * rank's parameters (the holder's, each chunk a slice of it). */
static int setup_exact(run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    if (strcmp(o->grad_accum, "exact") != 0 || o->eval_mode) return PL_OK;
    const char *why = R->Tp > 1 && R->cfg.NKV < R->Tp ? "kv heads shared by several TP ranks (--n-kv-head below --tp)"
                      : 2LL * R->D * R->M > EXACT_MAX_ADDENDS ? "more than 65536 micro-batches a step over the replicas"
                      : NULL;
    if (!R->be->host_memory) {
        snprintf(err, errlen, "--grad-accum exact: backend %s keeps the gradients in device memory; the exact sums "
                 "run on host-memory backends (cpu, onednn)", R->be->name);
        return PL_EINVAL;
    }
    if (why) {
        snprintf(err, errlen, "--grad-accum exact does not support %s", why);
        return PL_EINVAL;
    }
    R->exact = 1;
    R->st.acc = calloc(R->st.nparams ? R->st.nparams : 1, sizeof(pl_fx));
    if (!R->st.acc) {
        snprintf(err, errlen, "--grad-accum exact: out of memory for %zu fixed-point sums (16 bytes each)",
                 R->st.nparams);
        return PL_ENOMEM;
    }
    R->st.exact = 1;
    for (int c = 0; c < R->V; c++) {
        R->stv[c].exact = 1;
        R->stv[c].acc = R->st.acc + (R->stv[c].grads - R->st.grads);
    }
    return PL_OK;
}

/* --tp: the model must slice evenly, and what does not run with it yet is refused; the group
 * (nothing collective) and the blocks' sum hook. */
static int setup_tp(run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    if (R->Tp <= 1) return PL_OK;
    PL_TRY(model_tp_check(&R->cfg, R->Tp, err, errlen));
    const char *no = o->eval_mode == 2 ? "pipelm generate" : o->ckpt_async ? "--ckpt-async" : NULL;
    if (no) {
        snprintf(err, errlen, "--tp %d: %s does not run with tensor parallelism yet (use --tp 1)", R->Tp, no);
        return PL_EINVAL;
    }
    int kill = strcmp(o->hooks.fail_at, "tp-kill") == 0;
    int fail = o->hooks.fail_rank == R->wrank && (kill || strcmp(o->hooks.fail_at, "tp") == 0) ? o->hooks.fail_step : -1;
    PL_TRY(tp_init(&R->tp, R->tpc, R->be, fail, R->wrank, err, errlen));
    R->tp.fail_kill = kill;
    R->have_tp = 1;
    model_set_tp_hook(tp_sum, tp_host_reduce, &R->tp);
    return PL_OK;
}

/* --ep E: a Mixtral model whose experts split evenly over E of the D replicas, on a
 * host-memory backend without --tp; the group (nothing collective) and the MoE layer's hook. */
static int setup_ep(run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    int E = o->ep, n = R->cfg.moe.n_experts;
    if (E == 1 || o->eval_mode) return PL_OK;
    const char *why = E < 1 ? "it must be at least 1"
                      : n <= 0 ? "expert parallelism needs a mixture-of-experts model (--arch mixtral)"
                      : R->D % E != 0 ? "it must divide --dp (the EP ranks are carved from the data-parallel replicas)"
                      : n % E != 0 ? "it must divide --n-experts (each EP rank holds n-experts / E of them)"
                      : R->Tp > 1 ? "--tp > 1 is not supported with --ep > 1 yet (use --tp 1)"
                      : !R->be->host_memory ? "the experts' exchange runs on host-memory backends (cpu, onednn)"
                      : NULL;
    if (why) {
        snprintf(err, errlen, "--ep %d: %s (--dp %d, --n-experts %d, --tp %d, backend %s)", E, why, R->D, n, R->Tp,
                 R->be->name);
        return PL_EINVAL;
    }
    int kill = strcmp(o->hooks.fail_at, "ep-kill") == 0 && o->hooks.fail_rank == R->wrank;
    ep_init(&R->ep, R->epc, kill ? o->hooks.fail_step : -1, R->wrank);
    model_ep_hook h = ep_hook(&R->ep);
    model_set_ep_hook(&h);
    R->have_ep = 1;
    return PL_OK;
}

/* --cp: what does not run with context parallelism yet is refused by name; the group
 * (nothing collective) and the attention hook. */
static int setup_cp(run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    if (R->C <= 1) return PL_OK;
    const char *no = R->Tp > 1 ? "--tp (tensor parallelism)" : o->eval_mode == 2 ? "pipelm generate"
                   : strcmp(R->be->name, "cpu") != 0 ? "a backend other than cpu (the fused fp32 attention is the cpu "
                                                       "backend's)" : R->cfg.moe.n_experts > 0 ? "a mixture-of-experts model"
                   : o->doc_mask ? "--doc-mask (document masking)" : NULL;
    if (no) {
        snprintf(err, errlen, "--cp %d: %s does not run with context parallelism yet (use --cp 1)", R->C, no);
        return PL_EINVAL;
    }
    int kill = strcmp(o->hooks.fail_at, "cp-kill") == 0;
    int fail = o->hooks.fail_rank == R->wrank && (kill || strcmp(o->hooks.fail_at, "cp") == 0) ? o->hooks.fail_step : -1;
    PL_TRY(cp_init(&R->cp, R->cpc, strcmp(o->cp_comm, "allgather") != 0, fail, kill, R->wrank, err, errlen));
    R->have_cp = 1;
    model_set_cp_hook(cp_attention_fwd, cp_attention_bwd, &R->cp);
    return PL_OK;
}

/* --cp: this rank's chunks of its replica's rows of the batch just read (R->inputs, targets). */
static void cp_tokens(run *R) {
    if (R->C <= 1) return;
    cp_local_tokens(R->gin, R->cin, R->B, R->T, R->C, R->c); /* gin: the replica's own rows */
    cp_local_tokens(R->gtg, R->ctg, R->B, R->T, R->C, R->c);
}

/* --init's weights (a Hugging Face model or an llm.c file); with --tp read whole into a
 * copy of the stage and cut (nothing collective: every TP rank reads the file). */
static int load_init(run *R, char *err, size_t errlen) {
    const char *path = R->o->init;
    tp_whole w;
    stage *into = &R->st;
    if (R->have_tp) {
        PL_TRY(tp_whole_make(&R->tp, &R->st, NULL, 0, 0, 0, 1, &w, err, errlen));
        into = &w.st;
    }
    int rc = hf_is_model(path) ? hf_load_stage(path, into, err, errlen) : llmc_load_stage(path, into, err, errlen);
    if (R->have_tp) {
        if (rc == PL_OK && tp_whole_put(&R->tp, &w, &R->st, NULL, TPW_PARAMS) != PL_OK) {
            snprintf(err, errlen, "backend %s: cutting the --init weights into the TP slices failed", R->be->name);
            rc = PL_EBACKEND;
        }
        tp_whole_free(&w);
    }
    return rc;
}

/* --save-final / --dump-grads (run.h): the model file, whole, from TP rank 0's pipeline. */
static int train_save_model(run *R, const char *path, int grads) {
    const pl_options *o = R->o;
    tp_whole w;
    stage *from = &R->st;
    int rc = PL_OK;
    if (R->have_tp) {
        char err[512] = "";
        rc = tp_whole_make(&R->tp, &R->st, NULL, grads ? TPW_GRADS : TPW_PARAMS, 0, 0, 1, &w, err, sizeof err);
        if (rc != PL_OK) pl_error("%s", err);
        from = &w.st;
    }
    if (rc == PL_OK && R->t == 0) /* TP rank 0's pipeline writes the whole tensors */
        rc = !grads && hf_is_safetensors_name(path)
                 ? hf_save(path, from, strcmp(o->save_dtype, "bf16") == 0 ? ST_BF16 : ST_F32, 0, R->comm)
                 : llmc_save(path, from, grads, R->comm);
    if (R->have_tp) {
        if (from == &w.st) tp_whole_free(&w);
        rc = comm_agree(R->tpc, rc, NULL);
    }
    return rc;
}

/* A --split of block counts must give one per stage; the advice names the world size that
 * fits it, n stages x D replicas (split.c knows nothing of replicas). */
static int split_count(const run *R, char *err, size_t errlen) {
    const char *spec = R->o->split;
    size_t len = strlen(spec); /* a malformed one is left to split.c's parser, which says where */
    if (strcmp(spec, "auto") == 0 || !len || strspn(spec, "0123456789,") != len || spec[0] == ',' ||
        spec[len - 1] == ',' || strstr(spec, ",,"))
        return PL_OK;
    int n = 1;
    for (const char *p = spec; *p; p++) n += *p == ',';
    if (n == R->S) return PL_OK;
    snprintf(err, errlen, "--split '%.200s' gives %d stages but the pipeline has %d (ranks x chunks per rank); run "
             "with mpiexec -n %d (%d stage%s x --dp %d, one chunk per rank), or give %d block counts", spec, n, R->S,
             n * R->D, n, n > 1 ? "s" : "", R->D, R->S);
    return PL_EINVAL;
}
/* The data-parallel reducer: collective over the stage's replicas (MPI_Comm_dup), so it runs
 * only once every rank's set-up has succeeded (a rank that failed before it would leave its
 * replicas blocked in the dup). */
static int setup_dp(run *R, char *err, size_t errlen) {
    if (R->D <= 1 || R->o->eval_mode) return PL_OK; /* eval: replicas only all-reduce the loss */
    PL_TRY(dp_init(&R->dp, &R->st, &R->opt, R->dpc, R->o->zero, R->M, err, errlen));
    R->have_dp = 1;
    for (int c = 0; R->V > 1 && c < R->V; c++) dp_hook(&R->dp, &R->stv[c], R->M);
    return PL_OK;
}

/* --doc-mask: the document token (--doc-token, or the data's: GPT-2's <|endoftext|> 50256 in an
 * llm.c token file, Llama 3's <|begin_of_text|> 128000 where the vocabulary holds it; 0 for the
 * Markov chain and text, which have no document token of their own) and the positions into
 * the run's config (each stage's, as att_cols). */
static int setup_docs(run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    model_docs *dc = &R->cfg.docs;
    memset(dc, 0, sizeof *dc);
    if (o->doc_mask != 0 && o->doc_mask != 1) {
        snprintf(err, errlen, "--doc-mask %d is out of range (0 or 1)", o->doc_mask);
        return PL_EINVAL;
    }
    if (!o->doc_mask) return PL_OK;
    int llmc = strcmp(o->data, "markov") != 0 && strncmp(o->data, "text:", 5) != 0;
    dc->mask = 1;
    dc->token = o->doc_token >= 0 ? o->doc_token : !llmc ? 0 : R->cfg.V > 128000 ? 128000 : 50256;
    dc->restart = strcmp(o->doc_positions, "restart") == 0;
    if (dc->token >= R->cfg.V) {
        snprintf(err, errlen, "--doc-mask: the document token %d is outside the vocabulary (%d tokens); give "
                 "--doc-token", dc->token, R->cfg.V);
        return PL_EINVAL;
    }
    if (dc->restart && R->cfg.llama.rope_theta <= 0) {
        snprintf(err, errlen, "--doc-positions restart needs rotary positions (--arch llama or mixtral); this "
                 "model's positions are a learned table");
        return PL_EINVAL;
    }
    return PL_OK;
}

/* Split, schedule, stage, data, metrics: everything that can fail before step 1, none of it
 * collective (the ranks agree on the outcome before anything collective runs). */
/* The small inputs every rank parses (--costs-in, --schedule-csv): read by rank 0 and broadcast
 * (collective: first in the set-up, before any step that can fail on some ranks only). */
static int read_shared_inputs(run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    if (o->costs_in[0])
        PL_TRY(comm_read_bcast(o->costs_in, "costs file", 1 << 24, R->world, &R->costs_text, &R->costs_len, err,
                               errlen));
    if (o->schedule_csv[0])
        PL_TRY(comm_read_bcast(o->schedule_csv, "schedule file", SCHED_CSV_MAX_BYTES, R->world, &R->csv_text,
                               &R->csv_len, err, errlen));
    return PL_OK;
}

int run_costs_read(const run *R, sched_costs *c, char *err, size_t errlen) {
    FILE *f = R->costs_text ? fmemopen(R->costs_text, R->costs_len, "r") : NULL;
    if (!f) {
        snprintf(err, errlen, "costs file %.512s: %s", R->o->costs_in, R->costs_text ? "out of memory" : "not read");
        return R->costs_text ? PL_ENOMEM : PL_EINVAL;
    }
    int rc = sched_costs_read(f, c, err, errlen);
    fclose(f);
    return rc;
}

static int setup(run *R, char *err, size_t errlen) {
    const pl_options *o = R->o;
    PL_TRY(read_shared_inputs(R, err, errlen));
    PL_TRY(check_outputs(R, err, errlen));
    PL_TRY(lock_ckpt_dir(R, err, errlen));
    if (hooks_fail_here(&o->hooks, R->wrank, 0, "during")) {
        snprintf(err, errlen, "injected failure during set-up (--fail-rank %d --fail-step 0)", o->hooks.fail_rank);
        return PL_EPEER;
    }
    PL_TRY(setup_backend(R, err, errlen));
    const backend *be = R->be;
    PL_TRY(resolve_config(R, err, errlen));
    PL_TRY(setup_tp(R, err, errlen));
    PL_TRY(setup_ep(R, err, errlen));
    PL_TRY(setup_cp(R, err, errlen));
    PL_TRY(choose_schedule(R, err, errlen));
    PL_TRY(split_count(R, err, errlen));
    /* the attention buffer as the backend keeps it (a fused kernel's output and log-sum-exp,
     * not T x T), so the split's memory model and the stage table count what the stages
     * allocate (stage_init asks the same) */
    if (be->attention_cols && R->cfg.NH)
        R->cfg.att_cols = be->attention_cols(R->B / R->M, R->Tl, R->cfg.NH, R->cfg.C / R->cfg.NH);
    if (R->C > 1 && R->cfg.NH) R->cfg.att_cols = R->cfg.C / R->cfg.NH + 1; /* --cp: cp.c keeps O and lse */
    PL_TRY(setup_docs(R, err, errlen));
    PL_TRY(split_make_placed(&R->sp, o->split, &R->cfg, R->P, R->V, R->sc.place, R->M, R->B / R->M, R->Tl, err,
                             errlen));
    PL_TRY(setup_stages(R, err, errlen));
    PL_TRY(setup_exact(R, err, errlen));
    if (o->init[0]) PL_TRY(load_init(R, err, errlen));
    else if (stage_init_params(&R->st, (unsigned long long)o->seed) != PL_OK) {
        snprintf(err, errlen, "backend %s: setting the initial weights: %s", be->name, stage_error(&R->st));
        return PL_EBACKEND;
    }
    if (!o->eval_mode) PL_TRY(optim_init(&R->opt, &R->st, &o->hp, err, errlen)); /* eval, generate: no moments */
    PL_TRY(train_ckpt_async_check(R, err, errlen)); /* --ckpt-async: MPI's thread level, the snapshot's memory */
    PL_TRY(engine_init(&R->eng, R->stv, R->V, &R->sc, R->comm, err, errlen));
    /* --fail-rank names a world rank */
    engine_set_faults(&R->eng, o->hooks.fail_rank == R->wrank ? R->rank : -1, o->hooks.fail_step,
                      strcmp(o->hooks.fail_at, "during") == 0);
    if (o->hooks.slow_rank == R->rank) engine_set_slow(&R->eng, o->hooks.slow_ms); /* test-only: a straggler */
    /* data: the first stage (rank 0) needs inputs, the last (rank P - 1; rank 0 in a V) the targets;
     * under --doc-mask every stage finds the documents in the inputs */
    if (R->rank == 0 || R->rank == last_rank(R) || R->cfg.docs.mask) {
        PL_TRY(data_open(&R->train, o->data, R->cfg.V, o->markov_branch, (uint64_t)o->data_seed, 0,
                         err, errlen));
        R->have_train = 1;
        PL_TRY(data_set_shuffle(&R->train, o->shuffle, (uint64_t)o->data_seed, err, errlen));
        PL_TRY(data_check_batch(&R->train, R->Bg, R->T, err, errlen));
        const char *vspec = o->val_data[0] ? o->val_data : strcmp(o->data, "markov") == 0 ? "markov" : NULL;
        if (vspec) {
            PL_TRY(data_open(&R->val, vspec, R->cfg.V, o->markov_branch, (uint64_t)o->data_seed,
                             1ULL << 60, err, errlen));
            R->have_val = 1;
            PL_TRY(data_check_batch(&R->val, R->Bg, R->T, err, errlen));
        }
        /* this replica reads and trains on rows [dr B, (dr + 1) B) of the global batch (dr: the data
         * replica; with --cp its C ranks read the same rows and keep their chunks, cp_tokens) */
        int dr = R->d / R->C;
        R->gin = malloc(sizeof(int) * (size_t)R->B * R->T);
        R->gtg = malloc(sizeof(int) * (size_t)R->B * R->T);
        R->inputs = R->gin;
        R->targets = R->gtg;
        if (R->C > 1 && R->gin && R->gtg) { /* --cp: this rank's chunks of its replica's rows (cp_tokens) */
            R->cin = malloc(sizeof(int) * (size_t)R->B * R->Tl);
            R->ctg = malloc(sizeof(int) * (size_t)R->B * R->Tl);
            R->inputs = R->cin;
            R->targets = R->ctg;
        }
        const char *pf = hooks_env("PIPELM_PREFETCH"); /* test hook: 0 reads each batch when its step needs it */
        if (R->gin && R->gtg && !o->eval_mode)
            PL_TRY(prefetch_start(&R->pf, &R->train, R->Bg, dr * R->B, R->B, R->T, !pf || strcmp(pf, "0") != 0,
                                  err, errlen));
        if (!R->gin || !R->gtg || (R->C > 1 && (!R->cin || !R->ctg))) {
            snprintf(err, errlen, "out of memory for the batch");
            return PL_ENOMEM;
        }
    }
    if (R->wrank == 0 && o->metrics[0]) PL_TRY(metrics_open(&R->mx, o->metrics, err, errlen));
    return PL_OK;
}
/* --tp: each tensor's squared norm becomes the share this TP rank owns (tp.h); replicated kv
 * heads' rows are measured over the same ranges as the rest (a replica's pieces with --dp). */
static int tp_norm_shares(run *R, double *sq) {
    stage *st = &R->st;
    double *kv = NULL;
    int rc = PL_OK;
    if (st->cfg.NKV < R->Tp) {
        int nr = R->have_dp ? R->dp.nb : 1;
        optim_range *r = calloc((size_t)nr, sizeof *r);
        kv = calloc((size_t)st->ntensors, sizeof *kv);
        if (!r || !kv) rc = PL_ENOMEM;
        for (int k = 0; rc == PL_OK && k < nr; k++) {
            r[k].lo = R->have_dp ? R->dp.b[k].lo + R->dp.b[k].plo : 0;
            r[k].n = R->have_dp ? R->dp.b[k].pn : st->nparams;
        }
        if (rc == PL_OK) rc = tp_kv_sumsq(&R->tp, st, r, nr, kv);
        free(r);
    }
    if (rc == PL_OK) tp_owned_sumsq(&R->tp, st, sq, kv);
    free(kv);
    return rc;
}
/* --grad-accum exact: this rank's share of the squared gradient norm (each element's square in
 * fixed point, over the ranges the float path measures: the replica's pieces of the tensors
 * this TP rank owns, a tied copy once) and of the loss sum (each micro-batch's in fixed
 * point), as limbs whose sums over the ranks are exact (exact.h): x[0..4], x[5..9]. */
static int exact_shares(run *R, double *x) {
    stage *st = &R->st;
    double *own = malloc(sizeof(double) * (size_t)(st->ntensors ? st->ntensors : 1));
    if (!own) return PL_ENOMEM;
    for (int i = 0; i < st->ntensors; i++) own[i] = 1.0;
    if (R->have_tp) tp_owned_sumsq(&R->tp, st, own, NULL); /* zero where another TP rank counts it */
    pl_fx sq = 0, loss = 0;
    int nr = R->have_dp ? R->dp.nb : 1;
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        if (t->tied_copy || own[i] == 0.0) continue;
        for (int k = 0; k < nr; k++) {
            size_t lo = R->have_dp ? R->dp.b[k].lo + R->dp.b[k].plo : 0, xlo, xn;
            if (optim_overlap(t, lo, R->have_dp ? R->dp.b[k].pn : st->nparams, &xlo, &xn))
                sq = exact_add(sq, exact_sumsq(st->grads + xlo, xn));
        }
    }
    free(own);
    if (st->has_head && R->t == 0)
        for (int m = 0; m < R->M; m++) loss = exact_add(loss, exact_fx_double(R->eng.mb_loss[m]));
    exact_to_limbs(sq, x);
    exact_to_limbs(loss, x + EXACT_NLIMB + 1);
    return PL_OK;
}
/* Squared gradient norms per part (slot 0 embeddings, 1+l block l, L+1 final norm), the loss
 * sum in slot L+2, then per rank its stop signal and its first non-finite forward (1 + mb),
 * summed over ranks: every slot has one owner, so the sums are exact. */
static int reduce_norm_loss(run *R, double loss_sum, double *norm, double *loss, int *bad_slot, step_news *nw) {
    stage *st = &R->st;
    int L = R->cfg.L, W = R->W, n = L + 3 + 2 * W + (R->exact ? 2 * (EXACT_NLIMB + 1) : 0);
    double *v = calloc(n, sizeof(double)), *g = calloc(n, sizeof(double)), *sq = calloc(st->ntensors, sizeof(double));
    int rc = !(v && g && sq) ? PL_ENOMEM : R->have_dp ? dp_grad_sumsq(&R->dp, sq) : optim_grad_sumsq(&R->opt, sq);
    if (rc != PL_OK) {
        if (rc != PL_ENOMEM) pl_error("backend %s: the gradient norm: %s", st->be->name, stage_error(st));
        free(v); free(g); free(sq);
        return rc;
    }
    if (R->have_tp) rc = tp_norm_shares(R, sq);
    if (rc != PL_OK) {
        free(v); free(g); free(sq);
        return rc;
    }
    for (int i = 0; i < st->ntensors; i++) {
        const param_tensor *t = &st->tensors[i];
        if (t->tied_copy) continue; /* the tied copy counts once, from its owner */
        int slot = t->part == PART_BLOCK ? 1 + t->layer : t->part == PART_HEAD ? L + 1 : 0;
        v[slot] += sq[i];
    }
    free(sq);
    if (st->has_head && R->t == 0) v[L + 2] = loss_sum; /* --tp: every TP rank computed the same loss */
    v[L + 3 + R->wrank] = signals_stop_pending();
    v[L + 3 + W + R->wrank] = R->eng.first_bad_fwd + 1; /* 1 + s M + mb */
    if (R->exact && (rc = exact_shares(R, v + L + 3 + 2 * W)) != PL_OK) {
        free(v); free(g);
        return rc;
    }
    rc = comm_allreduce(v, g, n, MPI_DOUBLE, MPI_SUM, R->world, "the all-reduce of the gradient norm and loss");
    double total = 0.0;
    *bad_slot = -1;
    for (int i = 0; i <= L + 1; i++) {
        total += g[i];
        if (!isfinite(g[i]) && *bad_slot < 0) *bad_slot = i;
    }
    *norm = sqrt(total);
    *loss = g[L + 2] / ((double)R->Bg * R->T);
    if (R->exact) { /* the same sums, in an order that does not matter */
        const double *x = g + L + 3 + 2 * W;
        *norm = sqrt(exact_fx_to_double(exact_from_limbs(x)));
        *loss = exact_fx_to_double(exact_from_limbs(x + EXACT_NLIMB + 1)) / ((double)R->Bg * R->T);
    }
    nw->stop_sig = 0;
    nw->stop_rank = nw->fwd_stage = nw->fwd_mb = nw->fwd_wrank = -1;
    for (int r = W - 1; r >= 0; r--) { /* world rank r runs stage r / D */
        if (g[L + 3 + r] > 0) { nw->stop_sig = (int)g[L + 3 + r]; nw->stop_rank = r; }
    }
    int low = -1, low_r = -1; /* the lowest (stage, micro-batch) over the ranks, and whose */
    for (int r = 0; r < W; r++)
        if (g[L + 3 + W + r] > 0 && (low < 0 || (int)g[L + 3 + W + r] - 1 < low)) {
            low = (int)g[L + 3 + W + r] - 1;
            low_r = r;
        }
    nw->fwd_wrank = low_r;
    if (low >= 0) { nw->fwd_stage = low / R->M; nw->fwd_mb = low % R->M; }
    free(v);
    free(g);
    return rc;
}
/* Validation: nbatches batches forward only; every rank gets the mean loss (run.h). */
int train_evaluate(run *R, int nbatches, double *val_loss) {
    double sum = 0.0;
    for (int k = 0; k < nbatches; k++) {
        char err[4400];
        if (R->have_val &&
            data_read_rows(&R->val, k, R->Bg, (R->d / R->C) * R->B, R->B, R->T, R->gin, R->gtg, err, sizeof err) != PL_OK) {
            pl_error("%s", err);
            return PL_EIO;
        }
        if (R->have_val) cp_tokens(R);
        double l = 0.0;
        PL_TRY(engine_eval(&R->eng, R->inputs, R->targets, &l));
        sum += l;
    }
    double in = R->st.has_head && R->t == 0 ? sum : 0.0, out = 0.0; /* --tp: TP rank 0's */
    PL_TRY(comm_allreduce(&in, &out, 1, MPI_DOUBLE, MPI_SUM, R->world, "the all-reduce of the validation loss"));
    *val_loss = out / ((double)nbatches * R->Bg * R->T);
    return PL_OK;
}
/* The trainer's validation: --val-batches batches. */
static int evaluate(run *R, double *val_loss) { return train_evaluate(R, R->o->val_batches, val_loss); }
/* Validation at a step, if any rank has validation data; prints and records val_loss. */
static int maybe_evaluate(run *R, int step) {
    int anyval = R->have_val;
    PL_TRY(comm_allreduce(MPI_IN_PLACE, &anyval, 1, MPI_INT, MPI_MAX, R->world, "the validation check"));
    if (!anyval) return PL_OK;
    double vl;
    PL_TRY(evaluate(R, &vl));
    if (R->tty && R->rank == 0) fprintf(pl_out, "\r\033[K");
    pl_info("val   %5d | val_loss %.6f\n", step, vl);
    metrics_line(&R->mx, "{\"event\":\"val\",\"step\":%d,\"val_loss\":%.17g}", step, vl);
    return PL_OK;
}
/* --grad-accum exact: the tied embedding's sum on the fixed-point sums, then, without replicas,
 * every gradient rounded once from its sum (with them, dp.c rounds each replica's pieces). */
static int exact_grads(run *R) {
    stage *st = &R->st;
    PL_TRY(optim_tied_grads_exact(&R->opt, R->tied, last_rank(R) == 0 ? 1 : R->P));
    if (!R->have_dp) exact_round(st->grads, st->acc, st->nparams);
    return PL_OK;
}
/* One optimizer step: tied-gradient sum, norm and loss, clipping, AdamW on every tensor. */
static int optimizer_step(run *R, int step, double loss_sum, double *loss, double *norm, double lr, step_news *nw) {
    stage *st = &R->st;
    const pl_options *o = R->o;
    /* dwte = embedding share + head share: added locally on one rank, summed across two */
    /* a V places both ends on rank 0: its tied sum is local (the communicator goes unused) */
    if (!R->exact) PL_TRY(optim_tied_grads(&R->opt, R->tied, last_rank(R) == 0 ? 1 : R->P));
    else PL_TRY(exact_grads(R)); /* the fixed-point sums' tied sum; rounded here, or by the replicas' reduction */
    /* the replicas' sum: the blocks' buckets started during the backward, the tied wte now */
    /* --tp with kv heads shared by several TP ranks: their rows' gradients summed over them,
     * on whole gradients (the replicas' gathers done) */
    int kvrep = R->have_tp && st->cfg.NKV < R->Tp;
    if (R->have_dp) PL_TRY(dp_finish(&R->dp, (step == 1 && o->dump_grads[0]) || kvrep));
    if (kvrep) PL_TRY(tp_kv_grads(&R->tp, st));
    int bad;
    PL_TRY(reduce_norm_loss(R, loss_sum, norm, loss, &bad, nw));
    if (bad >= 0 || !isfinite(*loss) || !isfinite(*norm)) {
        char where[128] = "the loss";
        if (bad >= 0) report_norm_slot(R, bad, where, sizeof where);
        else if (isfinite(*loss)) snprintf(where, sizeof where, "the gradient norm (beyond --grad-accum exact's range)");
        report_nonfinite(R, step, nw, *loss, *norm, where);
        return PL_ENUM;
    }
    /* a model that guesses uniformly scores ln(V): far above it, the run has diverged */
    double lnV = log((double)R->cfg.V), limit = fmax(2.0 * lnV, lnV + 10.0);
    if (*loss > limit) {
        if (R->wrank == 0)
            pl_error("step %d: loss %.4f is far above ln(V) = %.4f (uniform guessing; limit %.4f): the run has "
                     "diverged; stopping all ranks before it reaches a checkpoint (try a lower --lr)",
                     step, *loss, lnV, limit);
        return PL_ENUM;
    }
    if (step == 1 && o->dump_grads[0] && R->d == 0) PL_TRY(train_save_model(R, o->dump_grads, 1));
    if (R->ca) { /* --ckpt-async: the writer's copy of these values is complete before they change */
        double w;
        ckpt_async_fence(R->ca, &w);
        R->ca_fence += w;
    }
    int rc = R->have_dp ? dp_optim_step(&R->dp, step, lr, *norm) : optim_step(&R->opt, step, lr, *norm);
    if (rc != PL_OK) pl_error("backend %s: the optimizer step: %s", st->be->name, stage_error(st));
    return rc;
}
/* Threads and binding per rank (layout.c); when ranks x threads exceed the CPUs, waiting
 * ranks yield their core (R->polite) and the user is told. */
static int set_threads(run *R) {
    PL_TRY(layout_choose(&R->lay, R->world, R->o->threads, R->o->bind));
    /* the backend chosen later is set up with the same */
    if (backend_cpu.set_threads(R->lay.threads) != PL_OK) {
        pl_error("backend cpu: setting %d threads failed", R->lay.threads);
        return PL_EBACKEND;
    }
    R->polite = R->lay.oversubscribed;
    if (R->polite)
        pl_info("note: %d rank%s x %d thread%s on %d CPUs oversubscribe them: expect slow steps "
                "(waiting ranks yield their core)\n", R->lay.local_ranks, R->lay.local_ranks > 1 ? "s" : "",
                R->lay.threads, R->lay.threads > 1 ? "s" : "", R->lay.cpus);
    return PL_OK;
}
/* Test hook PIPELM_DATA_LOG=PREFIX: the first stage's TP rank 0 of each replica appends
 * "step row SHARD POS" for each row it read to PREFIX.<world rank> (docs/testing.md). */
static void data_log(const run *R, int step) {
    const char *prefix = hooks_env("PIPELM_DATA_LOG");
    if (!prefix || R->rank != 0 || R->t != 0) return;
    char path[PL_PATH + 32], where[PL_PATH + 32];
    snprintf(path, sizeof path, "%s.%d", prefix, R->wrank);
    FILE *f = fopen(path, "a");
    if (!f) return;
    for (int b = 0; b < R->B; b++) {
        data_row_where(&R->train, step - 1, R->Bg, (R->d / R->C) * R->B + b, R->T, where, sizeof where);
        fprintf(f, "%d %d %s\n", step, (R->d / R->C) * R->B + b, where);
    }
    fclose(f);
}
/* Test-only fault injection: does --fail-rank fail here, at --fail-at `where` of `step`? */
static int fail_here(const run *R, int step, const char *where) {
    const pl_options *o = R->o;
    if (!hooks_fail_here(&o->hooks, R->wrank, step, where)) return 0;
    if (strcmp(where, "nan") != 0)
        pl_error("injected failure (--fail-rank %d --fail-step %d --fail-at %s) at step %d on %s", o->hooks.fail_rank,
                 o->hooks.fail_step, where, step, R->D > 1 ? "this replica's stage" : "this stage");
    return 1;
}
/* One training step: data, the pipeline, the optimizer. A failure that peers cannot see
 * (*agreed = 0) must end in the job-wide abort; one seen by all (a NaN) is agreed. */
static int train_step(run *R, int step, double *loss, double *norm, double *lr, step_news *nw, int *agreed) {
    const pl_options *o = R->o;
    *lr = train_lr(o, step);
    *agreed = 0;
    if (fail_here(R, step, "before")) return PL_EPEER;
    if (fail_here(R, step, "nan")) {
        const float nan = NAN;
        PL_TRY(R->st.be->from_host(R->st.params + R->st.nparams / 2, &nan, sizeof nan));
        R->nan_injected = step;
    }
    char err[4400];
    double dwait = 0.0;
    if (R->have_train && prefetch_get(&R->pf, step - 1, R->gin, R->gtg, &dwait, err, sizeof err) != PL_OK) {
        pl_error("step %d: %s", step, err);
        return PL_EIO;
    }
    R->tm[TM_DATA] += dwait;
    if (R->have_train) data_log(R, step);
    if (R->have_train) cp_tokens(R);
    for (int c = 0; c < R->V; c++)
        if (stage_zero_grads(&R->stv[c]) != PL_OK) {
            pl_error("backend %s: zeroing the gradients: %s", R->st.be->name, stage_error(&R->stv[c]));
            return PL_EBACKEND;
        }
    engine_begin_step(&R->eng);
    double loss_sum = 0.0;
    float dloss = (float)(1.0 / ((double)R->Bg * R->T));
    PL_TRY(engine_step(&R->eng, step, R->inputs, R->targets, dloss, &loss_sum));
    double t1 = pl_now();
    int rc = optimizer_step(R, step, loss_sum, loss, norm, *lr, nw);
    *agreed = rc == PL_ENUM; /* a bad norm or loss is seen by every rank at once */
    PL_TRY(rc);
    *agreed = 0;
    double t2 = pl_now();
    trace_event(R->eng.tr, "optimizer", "optim", -1, t1, t2);
    R->tm[TM_FWD] += R->eng.t_fwd;
    R->tm[TM_BWD] += R->eng.t_bwd;
    R->tm[TM_WAIT] += R->eng.t_wait;
    R->tm[TM_OPT] += t2 - t1;
    R->tm_steps++;
    if (fail_here(R, step, "after")) return PL_EPEER;
    *agreed = 1;
    return PL_OK;
}
/* Everything between set-up and the loop: entropy floor, banner, resume, output checks. */
static int before_loop(run *R, int *first_step) {
    const pl_options *o = R->o;
    /* rank 0 must know the entropy floor, which only data ranks compute */
    if (R->P > 1) {
        double ent = R->have_train ? R->train.entropy : NAN;
        PL_TRY(comm_bcast(&ent, 1, MPI_DOUBLE, last_rank(R), R->comm, "the broadcast of the entropy floor"));
        if (R->rank == 0) R->train.entropy = ent;
    }
    report_stage_table(R);
    PL_TRY(report_grid(R));
    if (o->eval_mode == 1 && R->have_val) /* what eval reads: --val-data, else --data */
        pl_info("evaluated data: %s\n", R->val.desc);
    else if (o->eval_mode) {
    } else if (isfinite(R->train.entropy))
        pl_info("data: %s, entropy floor %.4f nats/token (the best loss any model can reach)\n", R->train.desc,
                R->train.entropy);
    else if (R->have_train)
        pl_info("data: %s\n", R->train.desc);
    report_run_line(R);
    *first_step = 1;
    if (!o->eval_mode) PL_TRY(train_data_manifest(R));
    if (o->resume[0] && !o->eval_mode) PL_TRY(train_resume_checkpoint(R, first_step));
    if (o->ckpt_dir[0] && !o->eval_mode && !o->bench && R->wrank == 0) /* what --ckpt-keep must leave alone */
        ckpt_keep_protect(o->ckpt_dir, *first_step - 1);
    if (o->trace[0] && R->d == 0) { /* replica 0's pipeline: the others run the same schedule */
        trace *tr = trace_open(R->comm);
        if (!tr) return PL_ENOMEM;
        engine_set_trace(&R->eng, tr);
    }
    return PL_OK;
}
/* Where the loop stands: the step range, the step reached, timings, what the last
 * all-reduce said. */
typedef struct {
    int first_step, last_step, step, stopped;
    double t_start, last_loss, slowest, grace;
    double *step_s;            /* per-step seconds (bench) */
    step_news nw;
} loop_state;

/* The layouts W ranks can run with T in [t0, t1]: "--dp D --stages P, ..." (T = 1) or
 * "--tp T --dp D --stages P, ...", for a refusal's advice. */
static void layout_fits(int W, int t0, int t1, char *buf, size_t len) {
    int off = 0;
    buf[0] = 0;
    for (int t = t0; t <= t1 && t <= W; t++)
        for (int k = 1; W % t == 0 && k <= W / t && off < (int)len - 48; k++)
            if ((W / t) % k == 0) {
                if (t > 1) off += snprintf(buf + off, len - off, "%s--tp %d ", off ? ", " : "", t);
                off += snprintf(buf + off, len - off, "%s--dp %d --stages %d", off && t == 1 ? ", " : "", k, W / t / k);
            }
}

/* D replicas x P stages (x T TP ranks) from --dp / --stages / --tp and the world size, and the
 * batch each replica trains on; a layout that does not fit is refused with the ones that would. */
static int layout_grid(run *R, const pl_options *o) {
    int Tp = o->tp > 1 ? o->tp : 1, Cp = o->cp > 1 ? o->cp : 1, W = R->W / Tp, D = o->dp, P = o->stages;
    char fits[512];
    if (Cp > 1 && (R->W % (Tp * Cp) || D < 0 || P < 0)) { /* --cp: T x C x D x P ranks, C next to TP */
        if (R->wrank == 0 && R->W % (Tp * Cp))
            pl_error("--cp %d%s does not fit %d ranks (T x C x D x P must be the world size)", Cp,
                     Tp > 1 ? " with --tp" : "", R->W);
        else if (R->wrank == 0)
            pl_error("--cp %d with --dp auto or --stages auto is not supported yet: give --dp and --stages", Cp);
        return PL_EINVAL;
    }
    if (Cp > 1) {
        int cs2 = 2 * Cp;
        if (R->T % cs2) {
            if (R->wrank == 0)
                pl_error("--cp %d: --seq-len %d is not divisible by 2C = %d (each rank holds 2 of 2C equal chunks "
                         "of every sequence)", Cp, R->T, cs2);
            return PL_EINVAL;
        }
        W /= Cp;
    }
    if (Tp > 1 && (R->W % Tp || D < 0 || P < 0)) { /* --tp: T x D x P ranks, TP innermost */
        if (R->wrank == 0 && R->W % Tp) {
            layout_fits(R->W, 2, R->W, fits, sizeof fits);
            pl_error("--tp %d does not fit %d ranks (T x D x P must be the world size); this job can run %s", Tp,
                     R->W, fits[0] ? fits : "--tp 1");
        } else if (R->wrank == 0) {
            pl_error("--tp %d with --dp auto or --stages auto is not supported yet: give --dp and --stages", Tp);
        }
        return PL_EINVAL;
    }
    if ((D < 0 || P < 0) && train_layout_auto(R, o, &D, &P) != PL_OK) return PL_EINVAL; /* auto: from what the job has */
    if (!D && !P) D = 1;
    if (!D) D = P > 0 && W % P == 0 ? W / P : 0;
    if (!P) P = D > 0 && W % D == 0 ? W / D : 0;
    if (D < 1 || P < 1 || D * P != W) {
        if (R->wrank == 0) {
            layout_fits(R->W, Tp, Tp, fits, sizeof fits);
            if (Tp > 1)
                pl_error("--tp %d --dp %d --stages %d does not fit %d ranks (T x D x P must be the world size); this job "
                         "can run %s", Tp, o->dp, o->stages, R->W, fits);
            else
                pl_error("--dp %d --stages %d does not fit %d ranks (D x P must be the world size); this job can run %s",
                         o->dp, o->stages, W, fits);
        }
        return PL_EINVAL;
    }
    if (R->Bg % (D * R->M) != 0) {
        if (R->wrank == 0)
            pl_error("--batch %d must be divisible by --dp %d x --microbatches %d (each replica trains on batch / D "
                     "sequences in M micro-batches)", R->Bg, D, R->M);
        return PL_EINVAL;
    }
    if (o->zero && D < 2 && R->wrank == 0) pl_note("--zero 1 with one replica: nothing to shard");
    R->D = D * Cp; /* --cp: the C ranks of a replica are gradient replicas of one another */
    R->P = P;
    R->Tp = Tp;
    R->C = Cp;
    R->Tl = R->T / Cp;
    R->B = R->Bg / D;
    return PL_OK;
}

/* Fields, threads, watchdog, checkpoint settings, signals, the tied communicator: before
 * anything can fail on one rank only. */
static int start_run(run *R, const pl_options *o, MPI_Comm comm, loop_state *L) {
    R->o = o;
    R->world = R->comm = comm;
    R->tied = R->dpc = R->tpc = R->epc = R->cpc = MPI_COMM_NULL;
    R->Tp = R->C = 1;
    MPI_Comm_rank(comm, &R->wrank);
    MPI_Comm_size(comm, &R->W);
    R->Bg = o->batch;
    R->T = o->seq_len;
    R->M = o->microbatches;
    R->tty = o->progress && isatty(fileno(pl_out ? pl_out : stdout));
    /* every rank sees the same options and world size: the refusals below are agreed */
    if (layout_grid(R, o) != PL_OK) return PL_EINVAL;
    if (o->hooks.fail_rank >= R->W) {
        if (R->wrank == 0) pl_error("--fail-rank %d is not a rank of this %d-rank job", o->hooks.fail_rank, R->W);
        return PL_EINVAL;
    }
    /* pipeline outermost: rank r is stage r / D of replica r % D, so a stage's replicas are
     * neighbours (their all-reduce stays on a node) and the pipeline crosses nodes; with --tp
     * T, TP innermost: world rank w is TP rank w % T of rank w / T of that grid */
    int g = R->wrank / R->Tp;
    R->t = R->wrank % R->Tp;
    R->rank = g / R->D;
    R->d = g % R->D;
    R->c = R->d % R->C; /* --cp: T x C x D x P, the C ranks of a (stage, replica) next to TP */
    if (R->D > 1 || R->Tp > 1) {
        PL_MPI_CHECK(MPI_Comm_split(comm, R->d * R->Tp + R->t, R->rank, &R->comm));
        if (R->D > 1) PL_MPI_CHECK(MPI_Comm_split(comm, R->rank * R->Tp + R->t, R->d, &R->dpc));
        if (R->D > 1 && o->ep > 1 && R->D % o->ep == 0) /* --ep: setup_ep refuses what does not fit */
            PL_MPI_CHECK(MPI_Comm_split(R->dpc, R->d / o->ep, R->d, &R->epc));
        if (R->Tp > 1) PL_MPI_CHECK(MPI_Comm_split(comm, g, R->t, &R->tpc));
        if (R->C > 1) PL_MPI_CHECK(MPI_Comm_split(comm, (g / R->C) * R->Tp + R->t, R->c, &R->cpc));
    }
    PL_TRY(set_threads(R));
    comm_watchdog_s = o->watchdog;
    comm_notice_s = o->watchdog > 0 && o->watchdog < 120 ? o->watchdog / 4 : 30.0;
    comm_polite = R->polite;
    ckpt_opts co; /* --ckpt-xfer, --ckpt-hints, --ckpt-verify, --ckpt-space-check: every save and load */
    ckpt_opts_of(o, &co);
    ckpt_set_opts(&co);
    /* --stop-grace (seconds): how long a stop signal waits for a step that cannot end */
    L->grace = o->stop_grace;
    comm_stop_grace_s = L->grace > 0 ? L->grace : 60.0;
    signals_install(); /* from here on a stop request ends the run cleanly */
    int color = (R->rank == 0 || R->rank == R->P - 1) ? R->d * R->Tp + R->t : MPI_UNDEFINED;
    PL_MPI_CHECK(MPI_Comm_split(comm, color, R->rank, &R->tied));
    return PL_OK;
}

/* After a step: timers, validation, checkpoint, as the options ask. */
/* A MoE model's router statistics of the step, summed over the world (model_moe_stats_take):
 * rank 0 prints them beside the step line and writes a metrics event "moe". */
static int report_moe(run *R, int step, int last_step) {
    double v[4];
    model_moe_stats_take(v);
    if (R->cfg.moe.n_experts <= 0) return PL_OK;
    PL_TRY(comm_allreduce(MPI_IN_PLACE, v, 4, MPI_DOUBLE, MPI_SUM, R->world, "the all-reduce of the router statistics"));
    double lb = v[3] > 0 ? v[2] / v[3] : 0;
    R->moe_lb += lb;
    R->moe_dropped += v[1];
    R->moe_steps++;
    if (R->rank != 0) return PL_OK;
    if (step % R->o->log_every == 0 || step == last_step)
        pl_info("moe   %5d | aux_loss %.6f (x %g) | load max/mean %.3f | dropped %.0f\n", step, v[0],
                (double)R->cfg.moe.aux_coef, lb, v[1]);
    metrics_line(&R->mx, "{\"event\":\"moe\",\"step\":%d,\"aux_loss\":%.9g,\"load_max_mean\":%.6g,\"dropped\":%.0f}",
                 step, v[0], lb, v[1]);
    return PL_OK;
}

static int after_step(run *R, const loop_state *L, int *agreed) {
    const pl_options *o = R->o;
    int step = L->step, rc;
    if (o->timers_every && step % o->timers_every == 0 && !o->bench) {
        if ((rc = report_timers(R, step)) != PL_OK) { *agreed = 0; return rc; }
    }
    if (!o->bench && ((o->eval_every && step % o->eval_every == 0) || step == L->last_step)) {
        if ((rc = maybe_evaluate(R, step)) != PL_OK) { *agreed = 0; return rc; }
    }
    if ((rc = train_ckpt_async_poll(R, agreed)) != PL_OK) return rc; /* --ckpt-async: a finished write */
    if (o->ckpt_dir[0] && !o->bench &&
        (L->stopped || step == L->last_step || (o->ckpt_every && step % o->ckpt_every == 0))) {
        if (fail_here(R, step, "save")) { *agreed = 0; return PL_EPEER; }
        return train_save_checkpoint(R, step); /* agreed: every rank took part in the save */
    }
    return PL_OK;
}

/* The steps, until the last one or a stop request. */
static int run_steps(run *R, loop_state *L, int *agreed) {
    const pl_options *o = R->o;
    for (L->step = L->first_step; L->step <= L->last_step; L->step++) {
        int step = L->step;
        if (o->bench && step == o->warmup + 1) { /* the timed part starts now */
            memset(R->tm, 0, sizeof R->tm);
            if (R->have_dp) dp_reset_timers(&R->dp);
            if (R->have_tp) tp_reset_timers(&R->tp);
            if (R->have_ep) ep_reset_timers(&R->ep);
            R->moe_lb = R->moe_dropped = 0;
            R->moe_steps = 0;
            R->tm_steps = 0;
            backend_prof_reset();
            engine_reset_costs(&R->eng);
        }
        double t0 = pl_now(), loss, norm, lr;
        comm_step = step;
        PL_TRY(train_step(R, step, &loss, &norm, &lr, &L->nw, agreed));
        double secs = pl_now() - t0;
        R->tm[TM_STEP] += secs;
        if (secs > L->slowest) L->slowest = secs;
        /* how long a stop waits for the step */
        comm_stop_grace_s = L->grace > 0 ? L->grace : 30.0 + 3.0 * L->slowest;
        if (L->step_s) L->step_s[step] = secs;
        L->last_loss = loss;
        L->stopped = L->nw.stop_sig != 0;
        report_step(R, step, L->first_step, L->last_step, loss, lr, norm, secs, L->t_start);
        PL_TRY(report_moe(R, step, L->last_step));
        PL_TRY(after_step(R, L, agreed));
        if (L->stopped) break;
    }
    return PL_OK;
}

/* After the loop: the stop notice, benchmark or timer figures, the trace, the final
 * weights, the end-of-run checks. */
static int end_run(run *R, loop_state *L, int *agreed) {
    const pl_options *o = R->o;
    int rc, last = L->last_step, step = L->step;
    if (R->tty && R->rank == 0) fprintf(pl_out, "\r\033[K");
    if (L->stopped)
        pl_info("rank %d received %s: stopping after step %d%s\n", L->nw.stop_rank, signals_name(L->nw.stop_sig),
                step, o->ckpt_dir[0] ? " (checkpoint saved)" : " (no --ckpt-dir: nothing saved)");
    if (o->bench) rc = report_bench(R, L->step_s + o->warmup + 1, o->hp.total_steps);
    else rc = R->tm_steps ? report_timers(R, step > last ? last : step) : PL_OK;
    if (rc != PL_OK) { *agreed = 0; return rc; }
    /* the results first (the final weights), the diagnostics after: a trace that cannot be
     * written only warns, so it can never cost the weights */
    int save_rc = PL_OK;
    if (o->save_final[0] && !L->stopped) { /* every replica holds the same weights: replica 0 writes */
        if (R->d == 0) save_rc = train_save_model(R, o->save_final, 0);
        if (R->D > 1) save_rc = comm_agree(R->dpc, save_rc, NULL); /* replica 0's outcome, on every replica */
        if (save_rc == PL_OK) pl_info("saved final weights to %s\n", o->save_final);
        else if (R->wrank == 0) pl_error("--save-final %s was not written (message above)", o->save_final);
    }
    trace *tr = engine_take_trace(&R->eng);
    if (tr) {
        rc = trace_write(tr, o->trace);
        if (rc != PL_OK) { *agreed = 0; return rc; }
    }
    int done_steps = step > last ? last : step;
    if (done_steps < L->first_step - 1) done_steps = L->first_step - 1;
    rc = report_finish(R, L->first_step, done_steps, pl_now() - L->t_start, L->last_loss, L->stopped);
    if (rc != PL_OK && rc != PL_ENUM) *agreed = 0;
    if (rc == PL_OK && save_rc != PL_OK) return save_rc; /* agreed: every rank knows */
    return rc == PL_OK && L->stopped ? PL_EPREEMPT : rc;
}

/* A stop signal that arrived before step 1 (main installs the handlers before MPI_Init):
 * every rank learns of it here and the run ends at once with PL_EPREEMPT (exit 75), nothing
 * trained and nothing saved; a checkpoint it resumed from is still the latest. */
static int stop_before_first_step(run *R, int first_step) {
    int mine[2] = {signals_stop_pending(), signals_stop_pending() ? -R->wrank : -R->W}, all[2];
    PL_TRY(comm_allreduce(mine, all, 2, MPI_INT, MPI_MAX, R->world, "the agreement on a stop before step 1"));
    if (all[0] == 0) return PL_OK;
    if (R->tty && R->rank == 0) fprintf(pl_out, "\r\033[K");
    pl_info("rank %d received %s before step %d: stopping without training (%s)\n", -all[1], signals_name(all[0]),
            first_step, R->o->resume[0] ? "the checkpoint it resumed from is unchanged" : "nothing saved");
    metrics_line(&R->mx, "{\"event\":\"end\",\"steps\":%d,\"final_loss\":null,\"wall_s\":0,\"preempted\":true,"
                 "\"stop_signal\":\"%s\"}", first_step - 1, signals_name(all[0]));
    return PL_EPREEMPT;
}

/* Free everything; after a failure the peers may be anywhere: no collective on that path. */
static void teardown(run *R, int agreed) {
    train_ckpt_async_free(R, agreed); /* first: a write in flight completes while the ranks are in step */
    trace *tr = engine_take_trace(&R->eng);
    if (tr) trace_discard(tr);
    metrics_close(&R->mx);
    if (R->tied != MPI_COMM_NULL && agreed) MPI_Comm_free(&R->tied);
    if (R->have_dp) dp_free(&R->dp, agreed);
    if (R->W > 1 && R->comm != R->world && R->comm != MPI_COMM_NULL && agreed) MPI_Comm_free(&R->comm);
    if (R->dpc != MPI_COMM_NULL && agreed) MPI_Comm_free(&R->dpc);
    if (R->tpc != MPI_COMM_NULL && agreed) MPI_Comm_free(&R->tpc);
    if (R->have_tp) { model_set_tp_hook(NULL, NULL, NULL); tp_free(&R->tp); R->have_tp = 0; }
    if (R->have_ep) { model_set_ep_hook(NULL); R->have_ep = 0; }
    if (R->epc != MPI_COMM_NULL && agreed) MPI_Comm_free(&R->epc);
    if (R->cpc != MPI_COMM_NULL && agreed) MPI_Comm_free(&R->cpc);
    if (R->have_cp) { model_set_cp_hook(NULL, NULL, NULL); cp_free(&R->cp); R->have_cp = 0; }
    free(R->gin);
    free(R->gtg);
    free(R->cin);
    free(R->ctg);
    R->cin = R->ctg = NULL;
    free(R->manifest);
    R->manifest = NULL;
    R->inputs = R->targets = NULL;
    engine_free(&R->eng);
    optim_free(&R->opt);
    free(R->st.acc); /* --grad-accum exact's sums (the chunks' are slices of it) */
    R->st.acc = NULL;
    if (agreed) exact_mpi_free();
    for (int c = 0; R->stv && R->stv != &R->st && c < R->V; c++) stage_free(&R->stv[c]);
    if (R->stv != &R->st) free(R->stv);
    R->stv = NULL;
    stage_free(&R->st);
    sched_free(&R->sc);
    split_free(&R->sp);
    prefetch_stop(&R->pf); /* its thread reads R->train */
    if (R->have_train) data_close(&R->train);
    if (R->have_val) data_close(&R->val);
    free(R->rc_modes);
    free(R->costs_text);
    free(R->csv_text);
    ckpt_lock_release(); /* rank 0's lock of --ckpt-dir, on every way out of the run */
    signals_restore();
    comm_step = -1;
}

/* Collective: a set-up failure printed by every rank that failed, or once (by rank 0) when
 * every rank failed with the same message: a setting each rank checks alike is one line, not
 * one per rank. */
static void setup_error(const run *R, int rc, const char *err) {
    unsigned h = rc != PL_OK && err[0] ? crc32c(err, strlen(err)) | 1u : 0u, lo = h, hi = h;
    if (MPI_Allreduce(&h, &lo, 1, MPI_UNSIGNED, MPI_MIN, R->world) != MPI_SUCCESS ||
        MPI_Allreduce(&h, &hi, 1, MPI_UNSIGNED, MPI_MAX, R->world) != MPI_SUCCESS)
        lo = 0, hi = 1; /* cannot tell: every failing rank says why */
    if (h && (R->wrank == 0 || lo != hi)) pl_error("%s", err);
}

int run_setup(run *R, const pl_options *o, MPI_Comm comm, double *stop_grace) {
    loop_state L;
    memset(R, 0, sizeof *R);
    memset(&L, 0, sizeof L);
    int rc = start_run(R, o, comm, &L);
    *stop_grace = L.grace;
    if (rc != PL_OK) { /* nothing allocated yet; the tied communicator is the last step */
        signals_restore();
        return rc;
    }
    R->set_up = 1;
    char err[1024] = "";
    rc = setup(R, err, sizeof err);
    setup_error(R, rc, err);
    if ((rc = agree(R, rc, "set-up")) != PL_OK) return rc;
    err[0] = 0;
    rc = setup_dp(R, err, sizeof err);
    if (rc != PL_OK && err[0]) pl_error("%s", err);
    if ((rc = agree(R, rc, "the data-parallel set-up")) != PL_OK) return rc;
    err[0] = 0;
    rc = train_ckpt_async_setup(R, err, sizeof err); /* --ckpt-async: the writer's communicator */
    if (rc != PL_OK && err[0]) pl_error("%s", err);
    if ((rc = agree(R, rc, "the set-up of --ckpt-async")) != PL_OK) return rc;
    int first_step = 1;
    rc = before_loop(R, &first_step);
    R->first_step = first_step;
    if ((rc = agree(R, rc, "the start of the run")) != PL_OK) return rc;
    return stop_before_first_step(R, first_step);
}

void run_teardown(run *R, int agreed) {
    if (R->set_up) teardown(R, agreed);
    R->set_up = 0;
}

int train_run(const pl_options *o, MPI_Comm comm, int *agreed) {
    return train_bench(o, comm, agreed, NULL);
}

int train_bench(const pl_options *o, MPI_Comm comm, int *agreed, bench_summary *summary) {
    run R;
    loop_state L;
    *agreed = 1;
    memset(&L, 0, sizeof L);
    L.nw.stop_rank = L.nw.fwd_stage = L.nw.fwd_mb = L.nw.fwd_wrank = -1;
    L.last_loss = NAN;
    int rc = run_setup(&R, o, comm, &L.grace);
    R.summary = summary;
    if (rc != PL_OK) goto done;
    L.first_step = R.first_step;
    L.last_step = o->bench ? o->warmup + o->hp.total_steps : o->hp.total_steps;
    if (L.first_step > L.last_step)
        pl_info("the checkpoint is at step %d: nothing left to do for --steps %d\n", L.first_step - 1, L.last_step);
    L.step_s = o->bench ? calloc(L.last_step + 1, sizeof(double)) : NULL;
    L.t_start = pl_now();
    rc = run_steps(&R, &L, agreed);
    if (rc == PL_OK) rc = train_ckpt_async_drain(&R, agreed); /* --ckpt-async: the write in flight completes */
    if (rc == PL_OK) rc = end_run(&R, &L, agreed);
    if (rc == PL_EINVAL) rc = PL_ESTATE; /* past set-up nothing is a bad setting (exit 1, not 2) */
done:
    free(L.step_s);
    run_teardown(&R, *agreed);
    return rc;
}
