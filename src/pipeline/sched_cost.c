/*
 * sched_cost.c — the measured-cost model of a schedule (sched_cost.h): the costs file, and
 * the event-driven play of the action lists with real seconds.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "util/common.h"
#include "pipeline/sched_cost.h"

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int sched_costs_alloc(sched_costs *c, int P) {
    memset(c, 0, sizeof *c);
    c->P = P;
    c->f = calloc((size_t)P, sizeof(double));
    c->b = calloc((size_t)P, sizeof(double));
    c->i = calloc((size_t)P, sizeof(double));
    c->w = calloc((size_t)P, sizeof(double));
    c->opt = calloc((size_t)P, sizeof(double));
    c->act = calloc((size_t)P, sizeof(double));
    c->blocks = malloc((size_t)P * sizeof(int));
    if (!c->f || !c->b || !c->i || !c->w || !c->opt || !c->act || !c->blocks) { sched_costs_free(c); return PL_ENOMEM; }
    for (int s = 0; s < P; s++) c->blocks[s] = -1;
    c->dp = 1;
    c->tp = 1;
    c->cp = 1;
    return PL_OK;
}

void sched_costs_free(sched_costs *c) {
    free(c->f);
    free(c->b);
    free(c->i);
    free(c->w);
    free(c->opt);
    free(c->act);
    free(c->blocks);
    memset(c, 0, sizeof *c);
}

int sched_costs_write(const sched_costs *c, FILE *f) {
    fprintf(f, "# pipelm schedule costs, seconds per action (docs/formats.md)\nstages %d\n", c->P);
    fprintf(f, "msg_bytes %.17g\nlatency_s %.17g\nbytes_per_s %.17g\n", c->msg_bytes, c->latency_s, c->bytes_per_s);
    if (c->tp > 1) fprintf(f, "tp %d\n", c->tp);
    if (c->cp > 1) fprintf(f, "cp %d\n", c->cp);
    if (c->dp > 1) fprintf(f, "dp %d\n", c->dp);
    for (int s = 0; s < c->P; s++) {
        fprintf(f, "stage %d F %.9g B %.9g I %.9g W %.9g O %.9g A %.9g", s, c->f[s], c->b[s], c->i[s], c->w[s],
                c->opt ? c->opt[s] : 0.0, c->act ? c->act[s] : 0.0);
        if (c->blocks && c->blocks[s] >= 0) fprintf(f, " N %d", c->blocks[s]);
        fputc('\n', f);
    }
    return ferror(f) ? -1 : 0;
}

/* A finite, non-negative number, or -1. */
static int parse_cost(const char *tok, double *v) {
    char *end;
    *v = strtod(tok, &end);
    return end != tok && *end == 0 && isfinite(*v) && *v >= 0 ? 0 : -1;
}

/* "stage S F x B x I x W x O x A x N n": any of them, in any order (O: the optimizer step, A:
 * the activation bytes of one micro-batch, N: the blocks the stage held). */
static int parse_stage(sched_costs *c, char *rest, int line, char *err, size_t errlen) {
    char *tok = strtok(rest, " \t");
    char *end;
    long s = tok ? strtol(tok, &end, 10) : -1;
    if (!tok || *end || s < 0 || s >= c->P) {
        set_err(err, errlen, "costs line %d: stage number missing or outside 0..%d", line, c->P - 1);
        return PL_EINVAL;
    }
    while ((tok = strtok(NULL, " \t")) != NULL) {
        char *val = strtok(NULL, " \t");
        double v;
        if (!strcmp(tok, "N")) {
            long n = val ? strtol(val, &end, 10) : -1;
            if (!val || *end || n < 0 || n > (1 << 20)) {
                set_err(err, errlen, "costs line %d: N needs a block count, got '%s'", line, val ? val : "");
                return PL_EINVAL;
            }
            c->blocks[s] = (int)n;
            continue;
        }
        double *dst = !strcmp(tok, "F") ? c->f : !strcmp(tok, "B") ? c->b : !strcmp(tok, "I") ? c->i
                      : !strcmp(tok, "W") ? c->w : !strcmp(tok, "O") ? c->opt : !strcmp(tok, "A") ? c->act : NULL;
        if (!dst || !val || parse_cost(val, &v) != 0) {
            set_err(err, errlen, "costs line %d: expected F|B|I|W|O followed by seconds (or A and bytes, N and blocks), got '%s %s'",
                    line, tok, val ? val : "");
            return PL_EINVAL;
        }
        dst[s] = v;
    }
    return PL_OK;
}

int sched_costs_read(FILE *f, sched_costs *c, char *err, size_t errlen) {
    char buf[512];
    int line = 0, P = 0, dp = 1;
    double msg = 0, lat = 0, bw = 0;
    memset(c, 0, sizeof *c);
    while (fgets(buf, sizeof buf, f)) {
        line++;
        buf[strcspn(buf, "\r\n")] = 0;
        char *p = buf + strspn(buf, " \t");
        if (!*p || *p == '#') continue;
        char key[32];
        int k = 0;
        if (sscanf(p, "%31s%n", key, &k) != 1) continue;
        char *rest = p + k + strspn(p + k, " \t");
        double v;
        if (!strcmp(key, "stages")) {
            P = atoi(rest);
            if (P < 1 || P > (1 << 16) || c->P) { set_err(err, errlen, "costs line %d: bad or repeated 'stages'", line); goto bad; }
            if (sched_costs_alloc(c, P) != 0) { set_err(err, errlen, "out of memory"); return PL_ENOMEM; }
        } else if (!strcmp(key, "stage")) {
            if (!c->P) { set_err(err, errlen, "costs line %d: 'stage' before 'stages'", line); goto bad; }
            if (parse_stage(c, rest, line, err, errlen) != 0) goto bad;
        } else if (!strcmp(key, "tp")) {
            char *end;
            long t = strtol(rest, &end, 10);
            if (!c->P || end == rest || *end || t < 1 || t > 64) {
                set_err(err, errlen, "costs line %d: bad 'tp' (1..64, after 'stages')", line);
                goto bad;
            }
            c->tp = (int)t;
        } else if (!strcmp(key, "cp")) {
            char *end;
            long t = strtol(rest, &end, 10);
            if (!c->P || end == rest || *end || t < 1 || t > 64) {
                set_err(err, errlen, "costs line %d: bad 'cp' (1..64, after 'stages')", line);
                goto bad;
            }
            c->cp = (int)t;
        } else if (!strcmp(key, "dp")) {
            char *end;
            long d = strtol(rest, &end, 10);
            if (end == rest || *end || d < 1 || d > (1 << 20)) { set_err(err, errlen, "costs line %d: bad dp '%s'", line, rest); goto bad; }
            dp = (int)d;
        } else if (!strcmp(key, "msg_bytes") || !strcmp(key, "latency_s") || !strcmp(key, "bytes_per_s")) {
            if (parse_cost(rest, &v) != 0) { set_err(err, errlen, "costs line %d: bad %s '%s'", line, key, rest); goto bad; }
            if (!strcmp(key, "msg_bytes")) msg = v;
            else if (!strcmp(key, "latency_s")) lat = v;
            else bw = v;
        } else {
            set_err(err, errlen, "costs line %d: unknown key '%s'", line, key);
            goto bad;
        }
    }
    if (!c->P) { set_err(err, errlen, "costs: no 'stages' line"); return PL_EINVAL; }
    c->msg_bytes = msg;
    c->dp = dp;
    c->latency_s = lat;
    c->bytes_per_s = bw;
    for (int s = 0; s < c->P; s++) { /* fill what one kind of run could not measure */
        if (c->b[s] == 0 && (c->i[s] > 0 || c->w[s] > 0)) c->b[s] = c->i[s] + c->w[s];
        if (c->i[s] == 0) c->i[s] = c->b[s] / 2;
        if (c->w[s] == 0) c->w[s] = c->b[s] / 2;
    }
    return PL_OK;
bad:
    sched_costs_free(c);
    return PL_EINVAL;
}

int sched_costs_tp(sched_costs *c, int T, double *ar_s, char *err, size_t errlen) {
    *ar_s = 0.0;
    if (T <= 1 || c->tp == T) return PL_OK;
    if (c->tp > 1) {
        set_err(err, errlen, "the costs were measured at --tp %d: predict --tp %d from a --tp 1 measurement (or one at "
                "--tp %d)", c->tp, T, T);
        return PL_EINVAL;
    }
    double ar = c->latency_s + (c->bytes_per_s > 0 ? (T - 1) * c->msg_bytes / c->bytes_per_s : 0.0);
    for (int s = 0; s < c->P; s++) {
        double x = c->blocks && c->blocks[s] > 0 ? 2.0 * c->blocks[s] * ar : 0.0; /* 2 all-reduces a block */
        c->f[s] = c->f[s] / T + x;
        c->i[s] = c->i[s] / T + x;
        c->b[s] = c->b[s] / T + x;
        c->w[s] /= T;
    }
    c->tp = T;
    *ar_s = ar;
    return PL_OK;
}

int sched_costs_cp(sched_costs *c, int C, double qkv, double kv, double *ex_s, char *err, size_t errlen) {
    *ex_s = 0.0;
    if (C <= 1 || c->cp == C) return PL_OK;
    if (c->cp > 1) {
        set_err(err, errlen, "the costs were measured at --cp %d: predict --cp %d from a --cp 1 measurement (or one at "
                "--cp %d)", c->cp, C, C);
        return PL_EINVAL;
    }
    double part = c->msg_bytes / C, per = c->bytes_per_s > 0 ? (C - 1) * part / c->bytes_per_s : 0.0;
    double g = c->latency_s + per * qkv, a = c->latency_s + per * kv; /* a gather of qkv rows; the dk dv exchange */
    for (int s = 0; s < c->P; s++) {
        double n = c->blocks && c->blocks[s] > 0 ? c->blocks[s] : 0.0;
        c->f[s] = c->f[s] / C + n * g;
        c->i[s] = c->i[s] / C + n * (g + a);
        c->b[s] = c->b[s] / C + n * (g + a);
        c->w[s] /= C;
        if (c->act) c->act[s] /= C;
    }
    c->msg_bytes = part;
    c->cp = C;
    *ex_s = g;
    return PL_OK;
}

void sched_pred_free(sched_pred *p) {
    free(p->busy_s);
    free(p->wait_s);
    free(p->act_peak);
    memset(p, 0, sizeof *p);
}

/* The costs of global stage st: the file's own line when it has one per stage (c->P = S);
 * for a file measured with one chunk per rank (c->P = P ranks) on a V > 1 schedule, scaled:
 * the model is cut into S = P*V stages in order, so stage st holds 1/V of the layers of the
 * V = 1 stage st / V, and costs 1/V of it (the embedding and head make this approximate).
 * k: 0 F, 1 B, 2 I, 3 W, 4 O, 5 A. */
static double stage_cost(const sched_costs *c, int S, int st, int k) {
    const double *v = k == 0 ? c->f : k == 1 ? c->b : k == 2 ? c->i : k == 3 ? c->w : k == 4 ? c->opt : c->act;
    if (v == NULL) return 0.0;
    if (c->P == S) return v[st];
    int V = S / c->P;
    return v[st / V] / V;
}

/* Seconds of one action (0 for messages: their cost is the transfer). */
static double action_cost(const sched_costs *c, int S, const sched_action *a) {
    switch (a->op) {
    case SCHED_F: return stage_cost(c, S, a->stage, 0);
    case SCHED_B: return stage_cost(c, S, a->stage, 1);
    case SCHED_I: return stage_cost(c, S, a->stage, 2);
    case SCHED_W: return stage_cost(c, S, a->stage, 3);
    default: return 0.0;
    }
}

/* The play with measured costs: every rank runs its list as far as its receives allow, a
 * message arriving xfer seconds after its send; pc, clock and arrive as sched_predict sets
 * them up, busy_s and wait_s accumulated into out. */
static void predict_play(const sched *s, const sched_costs *c, int S, double xfer, int *pc, double *clock,
                         double *arrive, sched_pred *out) {
    int P = s->P, M = s->M;
#define MSG(kind, stage, mb) arrive[((size_t)(kind) * S + (size_t)(stage)) * M + (size_t)(mb)]
    for (int progress = 1; progress;) {
        progress = 0;
        for (int r = 0; r < P; r++)
            for (; pc[r] < s->n[r]; pc[r]++, progress = 1) {
                const sched_action *a = &s->acts[r][pc[r]];
                if (a->stage < 0 || a->stage >= S || a->mb < 0 || a->mb >= M) break; /* malformed: stuck */
                if (a->op == SCHED_RECV_F || a->op == SCHED_RECV_B) {
                    int from = a->op == SCHED_RECV_F ? a->stage - 1 : a->stage + 1;
                    if (from < 0 || from >= S) break;
                    double t = MSG(a->op == SCHED_RECV_B, from, a->mb);
                    if (t < 0) break; /* not sent yet */
                    if (t > clock[r]) { out->wait_s[r] += t - clock[r]; clock[r] = t; }
                } else if (a->op == SCHED_SEND_F || a->op == SCHED_SEND_B) {
                    MSG(a->op == SCHED_SEND_B, a->stage, a->mb) = clock[r] + xfer;
                } else {
                    double d = action_cost(c, S, a);
                    clock[r] += d;
                    out->busy_s[r] += d;
                }
            }
    }
#undef MSG
}

/* The step (the pipeline and the slowest rank's optimizer steps) and each rank's peak
 * activation bytes: its own F takes a micro-batch's slot, its B or W frees it, so the peak is
 * a walk over its own list. */
static void predict_opt_and_memory(const sched *s, const sched_costs *c, int S, sched_pred *out) {
    int P = s->P;
    double opt = 0;
    for (int r = 0; r < P; r++) {
        double o = 0;
        for (int ch = 0; ch < S / P; ch++) o += stage_cost(c, S, sched_place_stage(s->place, P, r, ch), 4);
        opt = o > opt ? o : opt;
    }
    out->step_s = out->makespan_s + opt;
    for (int r = 0; r < P; r++) {
        double held = 0;
        for (int i = 0; i < s->n[r]; i++) {
            const sched_action *a = &s->acts[r][i];
            if (a->op == SCHED_F) held += stage_cost(c, S, a->stage, 5);
            else if (a->op == SCHED_B || a->op == SCHED_W) held -= stage_cost(c, S, a->stage, 5);
            if (held > out->act_peak[r]) out->act_peak[r] = held;
        }
    }
}

/* As sched_simulate, with seconds: each rank keeps its clock, a SEND stamps its message with
 * its arrival time (send time + transfer), a RECV waits for the stamp. Sweeps until no rank
 * can move; the times do not depend on the sweep order. Messages are indexed by the global
 * stage that sent them; a rank's optimizer step is the sum over its chunks. */
int sched_predict(const sched *s, const sched_costs *c, sched_pred *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    int S = s && (long)s->P * (s->V > 1 ? s->V : 1) <= (1L << 30) ? sched_nstages(s) : -1;
    if (!s || !c || (c->P != S && c->P != s->P)) {
        if (s && s->V > 1)
            set_err(err, errlen, "costs are for %d stages, the schedule has %d ranks x %d chunks = %d stages "
                    "(a costs file has one line per stage, or one per rank measured with one chunk, then scaled)",
                    c ? c->P : 0, s->P, s->V, S);
        else
            set_err(err, errlen, "costs are for %d stages, the schedule has %d", c ? c->P : 0, s ? s->P : 0);
        return PL_EINVAL;
    }
    int P = s->P, M = s->M;
    double xfer = c->latency_s + (c->bytes_per_s > 0 ? c->msg_bytes / c->bytes_per_s : 0.0);
    int *pc = calloc((size_t)P, sizeof(int));
    double *clock = calloc((size_t)P, sizeof(double)), *arrive = malloc(2 * sizeof(double) * (size_t)S * M);
    out->P = P;
    out->busy_s = calloc((size_t)P, sizeof(double));
    out->wait_s = calloc((size_t)P, sizeof(double));
    out->act_peak = calloc((size_t)P, sizeof(double));
    if (!pc || !clock || !arrive || !out->busy_s || !out->wait_s || !out->act_peak) {
        free(pc); free(clock); free(arrive);
        sched_pred_free(out);
        set_err(err, errlen, "sched_predict: out of memory");
        return PL_ENOMEM;
    }
    for (size_t k = 0; k < 2 * (size_t)S * M; k++) arrive[k] = -1;
    predict_play(s, c, S, xfer, pc, clock, arrive, out);
    int stuck = -1;
    double busy = 0;
    for (int r = 0; r < P; r++) {
        if (pc[r] < s->n[r] && stuck < 0) stuck = r;
        if (clock[r] > out->makespan_s) out->makespan_s = clock[r];
        busy += out->busy_s[r];
    }
    free(pc); free(clock); free(arrive);
    if (stuck >= 0) {
        set_err(err, errlen, "the schedule deadlocks (rank %d cannot finish): validate it first", stuck);
        sched_pred_free(out);
        return PL_EINVAL;
    }
    out->bubble = out->makespan_s > 0 ? 1.0 - busy / (P * out->makespan_s) : 0.0;
    predict_opt_and_memory(s, c, S, out);
    /* every cost is finite, but their sums and products need not be (1e308 s, a 1e-300 B/s link) */
    int finite = isfinite(out->step_s) && isfinite(out->bubble);
    for (int r = 0; r < P; r++) finite = finite && isfinite(out->act_peak[r]) && isfinite(out->wait_s[r]);
    if (!finite) {
        set_err(err, errlen, "the costs overflow: the predicted step or memory is not a finite number "
                "(a time, size or rate in the costs file is out of range)");
        sched_pred_free(out);
        return PL_EINVAL;
    }
    return PL_OK;
}
