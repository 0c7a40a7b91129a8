/*
 * sched.c: pipeline schedules (build, text/CSV form, validation, unit-cost
 * simulation, grid printing). See include/pipelm/sched.h.
 */
#include "pipelm/sched.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// small helpers

/* printf into the caller's error buffer (which may be NULL) */
static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (err == NULL || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* append printf output to the error buffer, silently truncating */
static void append_err(char *err, size_t errlen, const char *fmt, ...) {
    if (err == NULL || errlen == 0) return;
    size_t used = strlen(err);
    if (used + 1 >= errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + used, errlen - used, fmt, ap);
    va_end(ap);
}

/* format an action for messages; never fails (falls back to "?") */
static const char *act_str(const sched_action *a, char *buf, size_t len) {
    if (sched_action_format(a, buf, len) != 0) snprintf(buf, len, "?");
    return buf;
}

/* the spelling torch uses for each op, indexed by sched_op */
static const char *const op_names[SCHED_NOPS] = {
    "F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "I", "W"
};

/* F, B, I and W compute; the rest move data */
static int is_compute(sched_op op) {
    return op == SCHED_F || op == SCHED_B || op == SCHED_I || op == SCHED_W;
}

/* true if op is one of the known kinds */
static int op_valid(int op) {
    return op >= 0 && op < SCHED_NOPS;
}

/* compute time of an action under the unit-cost model */
static int op_cost(sched_op op) {
    if (op == SCHED_F) return SCHED_COST_F;
    if (op == SCHED_B) return SCHED_COST_B;
    if (op == SCHED_I) return SCHED_COST_I;
    if (op == SCHED_W) return SCHED_COST_W;
    return 0;
}

/* the stage a communication action talks to (-1 for compute actions) */
static int peer_stage(const sched_action *a) {
    switch (a->op) {
    case SCHED_SEND_F: case SCHED_RECV_B: return a->stage + 1;
    case SCHED_RECV_F: case SCHED_SEND_B: return a->stage - 1;
    default: return -1;
    }
}

/* the op on the peer that pairs with a communication op */
static sched_op partner_op(sched_op op) {
    switch (op) {
    case SCHED_SEND_F: return SCHED_RECV_F;
    case SCHED_RECV_F: return SCHED_SEND_F;
    case SCHED_SEND_B: return SCHED_RECV_B;
    case SCHED_RECV_B: return SCHED_SEND_B;
    default: return op;
    }
}

/* allocate an empty schedule shell with P ranks */
static int sched_alloc(sched *s, const char *name, int P, int M) {
    memset(s, 0, sizeof(*s));
    snprintf(s->name, sizeof(s->name), "%s", name ? name : "");
    s->P = P;
    s->M = M;
    s->n = calloc((size_t)P, sizeof(int));
    s->acts = calloc((size_t)P, sizeof(sched_action *));
    if (s->n == NULL || s->acts == NULL) { sched_free(s); return -1; }
    return 0;
}

/* append one action to rank r (capacity was sized by the caller) */
static void push(sched *s, int r, sched_op op, int mb) {
    sched_action *a = &s->acts[r][s->n[r]++];
    a->op = op;
    a->stage = r;
    a->mb = mb;
}

/* push the forward of mb with its receive (not on stage 0) and its send
   (not on the last stage); receive first, send right after the compute */
static void push_fwd(sched *s, int r, int mb) {
    if (r > 0) push(s, r, SCHED_RECV_F, mb);
    push(s, r, SCHED_F, mb);
    if (r < s->P - 1) push(s, r, SCHED_SEND_F, mb);
}

/* push the backward of mb with its receive (not on the last stage) and its
   send (not on stage 0) */
static void push_bwd(sched *s, int r, int mb) {
    if (r < s->P - 1) push(s, r, SCHED_RECV_B, mb);
    push(s, r, SCHED_B, mb);
    if (r > 0) push(s, r, SCHED_SEND_B, mb);
}

// ----------------------------------------------------------------------------
// generators

/* GPipe: all forwards in order, then all backwards in ascending order. Each
   send is issued before the next receive, so no rank waits on a peer that is
   itself waiting for this rank's pending send. */
static void gen_gpipe(sched *s) {
    for (int r = 0; r < s->P; r++) {
        for (int mb = 0; mb < s->M; mb++) push_fwd(s, r, mb);
        for (int mb = 0; mb < s->M; mb++) push_bwd(s, r, mb);
    }
}

/* 1F1B: stage r runs w = min(P-r-1, M) warm-up forwards, then alternates
   one forward and one backward until the forwards run out, then drains the
   remaining backwards. Backwards stay in ascending mb order so gradient
   accumulation order matches GPipe. In the steady state SEND_F of the new
   forward precedes RECV_B of the backward: the downstream stage needs that
   activation before it can produce the gradient we wait for. */
static void gen_1f1b(sched *s) {
    for (int r = 0; r < s->P; r++) {
        int w = s->P - r - 1;
        if (w > s->M) w = s->M;
        int fwd = 0, bwd = 0;
        for (; fwd < w; fwd++) push_fwd(s, r, fwd);
        for (; fwd < s->M; fwd++, bwd++) {
            push_fwd(s, r, fwd);
            push_bwd(s, r, bwd);
        }
        for (; bwd < s->M; bwd++) push_bwd(s, r, bwd);
    }
}

/* the input part of mb's backward (I) with its receive and send */
static void push_bwd_input(sched *s, int r, int mb) {
    if (r < s->P - 1) push(s, r, SCHED_RECV_B, mb);
    push(s, r, SCHED_I, mb);
    if (r > 0) push(s, r, SCHED_SEND_B, mb);
}

/* ZB-H1 as a list scheduler over the unit-cost model (F = I = W = 1, messages free): at
   each time unit a free rank runs, in this order of preference, the I whose gradient has
   arrived, else the next F if its input has arrived and the rank holds fewer than 1F1B's
   P - r micro-batches (the same activation memory), else its oldest pending W. The W's so
   fill the time a rank would wait, and the I's carry the gradients back at one unit per
   stage. Every choice is made when its data is there, so the list replays without waiting
   in a different order; I, W and F each run in ascending micro-batch order. */
static int gen_zbh1(sched *s) {
    int P = s->P, M = s->M;
    int *nf = calloc((size_t)P, sizeof(int)), *ni = calloc((size_t)P, sizeof(int));
    int *nw = calloc((size_t)P, sizeof(int)), *busy = calloc((size_t)P, sizeof(int));
    long *fdone = malloc(sizeof(long) * (size_t)P * M), *idone = malloc(sizeof(long) * (size_t)P * M);
    if (!nf || !ni || !nw || !busy || !fdone || !idone) {
        free(nf); free(ni); free(nw); free(busy); free(fdone); free(idone);
        return -1;
    }
    for (size_t k = 0; k < (size_t)P * M; k++) fdone[k] = idone[k] = -1;
#define AT(a, r, mb) (a)[(size_t)(r) * M + (mb)]
    int left = P * M * 3;
    for (long t = 0; left > 0; t++)
        for (int r = 0; r < P; r++) {
            if (busy[r] > t) continue;
            int i = ni[r], f = nf[r];
            int grad = i < f && (r == P - 1 ? AT(fdone, r, i) >= 0 && AT(fdone, r, i) <= t
                                            : AT(idone, r + 1, i) >= 0 && AT(idone, r + 1, i) <= t);
            int input = f < M && (r == 0 || (AT(fdone, r - 1, f) >= 0 && AT(fdone, r - 1, f) <= t));
            if (grad) {
                push_bwd_input(s, r, i);
                AT(idone, r, i) = t + 1;
                ni[r]++;
            } else if (input && f - nw[r] < P - r) {
                push_fwd(s, r, f);
                AT(fdone, r, f) = t + 1;
                nf[r]++;
            } else if (nw[r] < ni[r]) {
                push(s, r, SCHED_W, nw[r]++);
            } else {
                continue;
            }
            busy[r] = (int)(t + 1);
            left--;
        }
#undef AT
    free(nf); free(ni); free(nw); free(busy); free(fdone); free(idone);
    return 0;
}

/* build a named schedule; see header */
int sched_build(const char *name, int P, int M, sched *s, char *err, size_t errlen) {
    if (s == NULL) { set_err(err, errlen, "sched_build: NULL output"); return -1; }
    memset(s, 0, sizeof(*s));
    if (name == NULL) { set_err(err, errlen, "sched_build: no schedule name"); return -1; }
    if (strcmp(name, "gpipe") != 0 && strcmp(name, "1f1b") != 0 && strcmp(name, "zb-h1") != 0) {
        set_err(err, errlen, "sched_build: unknown schedule '%s' (expected gpipe, 1f1b or zb-h1)", name);
        return -1;
    }
    if (P < 1) { set_err(err, errlen, "sched_build: need at least 1 stage, got P=%d", P); return -1; }
    if (M < 1) { set_err(err, errlen, "sched_build: need at least 1 micro-batch, got M=%d", M); return -1; }
    if (M > (1 << 24) || P > (1 << 16)) {
        set_err(err, errlen, "sched_build: P=%d M=%d too large", P, M);
        return -1;
    }
    if (sched_alloc(s, name, P, M) != 0) { set_err(err, errlen, "sched_build: out of memory"); return -1; }
    // at most 7 actions per micro-batch per rank: F, I and W (or B), four comm actions
    for (int r = 0; r < P; r++) {
        s->acts[r] = malloc((size_t)M * 7 * sizeof(sched_action));
        if (s->acts[r] == NULL) {
            sched_free(s);
            set_err(err, errlen, "sched_build: out of memory");
            return -1;
        }
    }
    if (strcmp(name, "gpipe") == 0) gen_gpipe(s);
    else if (strcmp(name, "1f1b") == 0) gen_1f1b(s);
    else if (gen_zbh1(s) != 0) {
        sched_free(s);
        set_err(err, errlen, "sched_build: out of memory");
        return -1;
    }
    return 0;
}

/* free the per-rank lists and reset the struct */
void sched_free(sched *s) {
    if (s == NULL) return;
    if (s->acts != NULL) {
        for (int r = 0; r < s->P; r++) free(s->acts[r]);
    }
    free(s->acts);
    free(s->n);
    memset(s, 0, sizeof(*s));
}

// ----------------------------------------------------------------------------
// action strings

/* spelling of an op; NULL if out of range */
const char *sched_op_str(sched_op op) {
    return op_valid((int)op) ? op_names[op] : NULL;
}

/* "{stage}{op}{mb}", the torch _Action repr */
int sched_action_format(const sched_action *a, char *buf, size_t len) {
    if (a == NULL || buf == NULL || len == 0) return -1;
    if (!op_valid((int)a->op) || a->stage < 0 || a->mb < 0) { buf[0] = '\0'; return -1; }
    int k = snprintf(buf, len, "%d%s%d", a->stage, op_names[a->op], a->mb);
    if (k < 0 || (size_t)k >= len) { buf[0] = '\0'; return -1; }
    return 0;
}

/* read a run of at most 9 decimal digits (so no int overflow); returns the
   number of characters consumed, 0 if there was no digit or too many */
static int read_uint(const char *p, int *val) {
    int i = 0, v = 0;
    while (p[i] >= '0' && p[i] <= '9') {
        if (i == 9) return 0;
        v = v * 10 + (p[i] - '0');
        i++;
    }
    *val = v;
    return i;
}

/* parse exactly one action string; the longest op name that matches wins
   (so "SEND_F" is never mistaken for something shorter) */
int sched_action_parse(const char *str, sched_action *a) {
    if (str == NULL || a == NULL) return -1;
    int stage, mb;
    int k = read_uint(str, &stage);
    if (k == 0) return -1;
    const char *p = str + k;
    int best = -1;
    size_t best_len = 0;
    for (int op = 0; op < SCHED_NOPS; op++) {
        size_t l = strlen(op_names[op]);
        if (strncmp(p, op_names[op], l) == 0 && l > best_len) { best = op; best_len = l; }
    }
    if (best < 0) return -1;
    p += best_len;
    k = read_uint(p, &mb);
    if (k == 0) return -1;
    if (p[k] != '\0') return -1;
    a->op = (sched_op)best;
    a->stage = stage;
    a->mb = mb;
    return 0;
}

// ----------------------------------------------------------------------------
// CSV

/* one row per rank, comma separated, '\n' terminated */
int sched_write_csv(const sched *s, FILE *f) {
    if (s == NULL || f == NULL || s->n == NULL || s->acts == NULL) return -1;
    char buf[64];
    for (int r = 0; r < s->P; r++) {
        for (int i = 0; i < s->n[r]; i++) {
            if (sched_action_format(&s->acts[r][i], buf, sizeof(buf)) != 0) return -1;
            if (fprintf(f, "%s%s", i ? "," : "", buf) < 0) return -1;
        }
        if (fputc('\n', f) == EOF) return -1;
    }
    return ferror(f) ? -1 : 0;
}

/* read one line (without its '\n', with a trailing '\r' removed) into a
   growing buffer; returns 1 if a line was read, 0 at EOF, -1 on OOM */
static int read_line(FILE *f, char **line, size_t *cap) {
    size_t len = 0;
    int c, got = 0;
    while ((c = fgetc(f)) != EOF) {
        got = 1;
        if (c == '\n') break;
        if (len + 2 > *cap) {
            size_t nc = *cap ? *cap * 2 : 256;
            char *nl = realloc(*line, nc);
            if (nl == NULL) return -1;
            *line = nl;
            *cap = nc;
        }
        (*line)[len++] = (char)c;
    }
    if (!got) return 0;
    if (*line == NULL) {
        *line = malloc(1);
        if (*line == NULL) return -1;
        *cap = 1;
    }
    if (len > 0 && (*line)[len - 1] == '\r') len--;
    (*line)[len] = '\0';
    return 1;
}

/* parse one CSV row into a freshly allocated action list */
static int parse_row(char *line, int row, sched_action **out, int *nout,
                     char *err, size_t errlen) {
    int cap = 1;
    for (char *p = line; *p; p++) if (*p == ',') cap++;
    sched_action *acts = malloc((size_t)cap * sizeof(sched_action));
    if (acts == NULL) { set_err(err, errlen, "sched_read_csv: out of memory"); return -1; }
    int n = 0, col = 0;
    char *cell = line;
    for (;;) {
        char *comma = strchr(cell, ',');
        if (comma) *comma = '\0';
        // trim blanks around the cell; empty cells (torch's None) are skipped
        while (*cell == ' ' || *cell == '\t') cell++;
        size_t l = strlen(cell);
        while (l > 0 && (cell[l - 1] == ' ' || cell[l - 1] == '\t')) cell[--l] = '\0';
        if (l > 0) {
            if (sched_action_parse(cell, &acts[n]) != 0) {
                set_err(err, errlen, "sched_read_csv: row %d (rank %d), column %d: cannot parse action '%s'",
                        row + 1, row, col + 1, cell);
                free(acts);
                return -1;
            }
            n++;
        }
        col++;
        if (!comma) break;
        cell = comma + 1;
    }
    *out = acts;
    *nout = n;
    return 0;
}

/* read torch-style CSV: P = rows, M = largest mb + 1 */
int sched_read_csv(FILE *f, const char *name, sched *s, char *err, size_t errlen) {
    if (s == NULL) { set_err(err, errlen, "sched_read_csv: NULL output"); return -1; }
    memset(s, 0, sizeof(*s));
    if (f == NULL) { set_err(err, errlen, "sched_read_csv: NULL file"); return -1; }
    char *line = NULL;
    size_t cap = 0;
    int rows_cap = 0, rc = 0;
    snprintf(s->name, sizeof(s->name), "%s", name ? name : "csv");
    for (;;) {
        int got = read_line(f, &line, &cap);
        if (got < 0) { set_err(err, errlen, "sched_read_csv: out of memory"); rc = -1; break; }
        if (got == 0) break;
        if (s->P == rows_cap) {
            int nc = rows_cap ? rows_cap * 2 : 8;
            int *nn = realloc(s->n, (size_t)nc * sizeof(int));
            if (nn) s->n = nn;
            sched_action **na = realloc(s->acts, (size_t)nc * sizeof(sched_action *));
            if (na) s->acts = na;
            if (nn == NULL || na == NULL) { set_err(err, errlen, "sched_read_csv: out of memory"); rc = -1; break; }
            rows_cap = nc;
        }
        if (parse_row(line, s->P, &s->acts[s->P], &s->n[s->P], err, errlen) != 0) { rc = -1; break; }
        s->P++;
    }
    free(line);
    if (rc == 0 && ferror(f)) { set_err(err, errlen, "sched_read_csv: read error"); rc = -1; }
    if (rc == 0 && s->P == 0) { set_err(err, errlen, "sched_read_csv: empty file (no rows)"); rc = -1; }
    if (rc == 0) {
        int maxmb = -1;
        for (int r = 0; r < s->P; r++)
            for (int i = 0; i < s->n[r]; i++)
                if (s->acts[r][i].mb > maxmb) maxmb = s->acts[r][i].mb;
        size_t total = 0;
        for (int r = 0; r < s->P; r++) total += (size_t)s->n[r];
        if (maxmb < 0) { set_err(err, errlen, "sched_read_csv: no actions in any row"); rc = -1; }
        /* a schedule holds an F and a B of every micro-batch on every rank: refuse an M that
           no row count can hold before anything sizes P x M tables by it (fuzz: big-mb) */
        else if ((size_t)s->P * ((size_t)maxmb + 1) > total) {
            set_err(err, errlen, "sched_read_csv: micro-batch %d on %d rank(s) needs at least %zu actions, "
                    "the file has %zu", maxmb, s->P, (size_t)s->P * ((size_t)maxmb + 1), total);
            rc = -1;
        }
        else s->M = maxmb + 1;
    }
    if (rc != 0) sched_free(s);
    return rc;
}

// ----------------------------------------------------------------------------
// simulation

/* index of a sent message in the "issued at" table: kind 0 = forward
   activations (SEND_F from stage), kind 1 = gradients (SEND_B from stage) */
static size_t msg_index(int kind, int stage, int mb, int P, int M) {
    return ((size_t)kind * (size_t)P + (size_t)stage) * (size_t)M + (size_t)mb;
}

/* check the per-action facts the simulator relies on: known op, stage and
   mb in range, and a peer stage that exists for communication actions */
static int check_actions(const sched *s, char *err, size_t errlen) {
    char b[64];
    for (int r = 0; r < s->P; r++) {
        for (int i = 0; i < s->n[r]; i++) {
            const sched_action *a = &s->acts[r][i];
            if (!op_valid((int)a->op)) {
                set_err(err, errlen, "rank %d, action #%d: invalid op code %d", r, i, (int)a->op);
                return -1;
            }
            if (a->stage < 0 || a->stage >= s->P) {
                set_err(err, errlen, "rank %d, action #%d (%s): stage %d out of range 0..%d",
                        r, i, act_str(a, b, sizeof(b)), a->stage, s->P - 1);
                return -1;
            }
            if (a->mb < 0 || a->mb >= s->M) {
                set_err(err, errlen, "rank %d, action #%d (%s): micro-batch %d out of range 0..%d",
                        r, i, act_str(a, b, sizeof(b)), a->mb, s->M - 1);
                return -1;
            }
            int peer = peer_stage(a);
            if (!is_compute(a->op) && (peer < 0 || peer >= s->P)) {
                set_err(err, errlen, "rank %d, action #%d (%s): has no partner, stage %d is the %s stage",
                        r, i, act_str(a, b, sizeof(b)), a->stage, peer < 0 ? "first" : "last");
                return -1;
            }
        }
    }
    return 0;
}

/* unit-cost dry run; see header. Each rank keeps its own clock; a SEND
   stamps the message with the sender's clock, a RECV can only proceed once
   that stamp exists and moves the receiver's clock up to it. Ranks are
   swept repeatedly until nobody can move; the resulting times do not depend
   on the sweep order. */
int sched_simulate(const sched *s, sched_sim *out, char *err, size_t errlen) {
    if (out == NULL) { set_err(err, errlen, "sched_simulate: NULL output"); return -1; }
    memset(out, 0, sizeof(*out));
    if (s == NULL || s->P < 1 || s->M < 1 || s->n == NULL || s->acts == NULL) {
        set_err(err, errlen, "sched_simulate: empty or malformed schedule");
        return -1;
    }
    if (check_actions(s, err, errlen) != 0) return -1;
    int P = s->P, M = s->M;
    out->P = P;
    out->off = malloc((size_t)(P + 1) * sizeof(int));
    int *pc = calloc((size_t)P, sizeof(int));
    int *clock = calloc((size_t)P, sizeof(int));
    int *sent = malloc(2 * (size_t)P * (size_t)M * sizeof(int));
    if (out->off == NULL || pc == NULL || clock == NULL || sent == NULL) goto oom;
    out->off[0] = 0;
    for (int r = 0; r < P; r++) out->off[r + 1] = out->off[r] + s->n[r];
    int total = out->off[P];
    out->start = malloc((size_t)(total ? total : 1) * sizeof(int));
    out->end = malloc((size_t)(total ? total : 1) * sizeof(int));
    if (out->start == NULL || out->end == NULL) goto oom;
    for (size_t k = 0; k < 2 * (size_t)P * (size_t)M; k++) sent[k] = -1;

    int progress = 1;
    while (progress) {
        progress = 0;
        for (int r = 0; r < P; r++) {
            while (pc[r] < s->n[r]) {
                const sched_action *a = &s->acts[r][pc[r]];
                int t = clock[r];
                if (a->op == SCHED_RECV_F || a->op == SCHED_RECV_B) {
                    int kind = a->op == SCHED_RECV_F ? 0 : 1;
                    int t_sent = sent[msg_index(kind, peer_stage(a), a->mb, P, M)];
                    if (t_sent < 0) break; // blocked
                    if (t_sent > t) t = t_sent;
                } else if (a->op == SCHED_SEND_F || a->op == SCHED_SEND_B) {
                    int kind = a->op == SCHED_SEND_F ? 0 : 1;
                    size_t k = msg_index(kind, a->stage, a->mb, P, M);
                    if (sent[k] < 0) sent[k] = t;
                }
                int idx = out->off[r] + pc[r];
                out->start[idx] = t;
                out->end[idx] = t + op_cost(a->op);
                out->busy += op_cost(a->op);
                clock[r] = t + op_cost(a->op);
                pc[r]++;
                progress = 1;
            }
        }
    }

    int stuck = 0;
    for (int r = 0; r < P; r++) if (pc[r] < s->n[r]) stuck = 1;
    if (stuck) {
        char b1[64], b2[64];
        set_err(err, errlen, "deadlock:");
        for (int r = 0; r < P; r++) {
            if (pc[r] >= s->n[r]) continue;
            const sched_action *a = &s->acts[r][pc[r]];
            sched_action want = { partner_op(a->op), peer_stage(a), a->mb };
            append_err(err, errlen, " rank %d blocked at action #%d %s (waiting for %s from rank %d);",
                       r, pc[r], act_str(a, b1, sizeof(b1)), act_str(&want, b2, sizeof(b2)), want.stage);
        }
        free(pc); free(clock); free(sent);
        sched_sim_free(out);
        return -1;
    }
    for (int r = 0; r < P; r++) if (clock[r] > out->makespan) out->makespan = clock[r];
    out->bubble = out->makespan > 0 ? 1.0 - (double)out->busy / ((double)P * out->makespan) : 0.0;
    free(pc); free(clock); free(sent);
    return 0;

oom:
    free(pc); free(clock); free(sent);
    sched_sim_free(out);
    set_err(err, errlen, "sched_simulate: out of memory");
    return -1;
}

/* free simulation arrays and reset */
void sched_sim_free(sched_sim *sim) {
    if (sim == NULL) return;
    free(sim->off);
    free(sim->start);
    free(sim->end);
    memset(sim, 0, sizeof(*sim));
}

// ----------------------------------------------------------------------------
// validation

/* check every rule in the header, in an order that gives the most specific
   message first: per-action sanity, duplicates, send/recv pairing across
   ranks, per-rank completeness and ordering, and finally deadlock freedom */
/* Position of each (rank, op, mb) in its rank's list, -1 if absent. */
#define POS(r, op, mb) pos[((size_t)(r) * SCHED_NOPS + (size_t)(op)) * (size_t)s->M + (size_t)(mb)]

/* 1. Rank r runs stage r only; then the position table, which catches duplicates. */
static int validate_positions(const sched *s, int *pos, char *err, size_t errlen) {
    char b1[64];
    for (int r = 0; r < s->P; r++)
        for (int i = 0; i < s->n[r]; i++)
            if (s->acts[r][i].stage != r) {
                set_err(err, errlen, "rank %d, action #%d (%s): wrong stage, rank %d runs only stage %d",
                        r, i, act_str(&s->acts[r][i], b1, sizeof(b1)), r, r);
                return -1;
            }
    for (int r = 0; r < s->P; r++)
        for (int i = 0; i < s->n[r]; i++) {
            const sched_action *a = &s->acts[r][i];
            if (POS(r, a->op, a->mb) >= 0) {
                set_err(err, errlen, "rank %d, action #%d (%s): duplicate of action #%d",
                        r, i, act_str(a, b1, sizeof(b1)), POS(r, a->op, a->mb));
                return -1;
            }
            POS(r, a->op, a->mb) = i;
        }
    return 0;
}

/* 2. Every SEND meets its RECV on the peer and vice versa. */
static int validate_pairs(const sched *s, const int *pos, char *err, size_t errlen) {
    char b1[64], b2[64];
    for (int r = 0; r < s->P; r++)
        for (int i = 0; i < s->n[r]; i++) {
            const sched_action *a = &s->acts[r][i];
            if (is_compute(a->op)) continue;
            sched_action want = { partner_op(a->op), peer_stage(a), a->mb };
            if (POS(want.stage, want.op, want.mb) < 0) {
                int is_send = a->op == SCHED_SEND_F || a->op == SCHED_SEND_B;
                set_err(err, errlen, "rank %d, action #%d (%s): no matching %s on the peer (%s is missing from rank %d)",
                        r, i, act_str(a, b1, sizeof(b1)), is_send ? "RECV" : "SEND",
                        act_str(&want, b2, sizeof(b2)), want.stage);
                return -1;
            }
        }
    return 0;
}

/* 3. On rank r, micro-batch mb: one F and one B, F before B, the messages around them (the
 * engine's storage contract, sched.h: every value lives in its micro-batch's own buffer from
 * its producer to its last reader). */
static int validate_mb(const sched *s, const int *pos, int r, int mb, char *err, size_t errlen) {
    int P = s->P;
    char b1[64], b2[64];
    sched_action f = { SCHED_F, r, mb }, bw = { SCHED_B, r, mb }, in = { SCHED_I, r, mb }, wt = { SCHED_W, r, mb };
    int pf = POS(r, SCHED_F, mb), pb = POS(r, SCHED_B, mb), pi = POS(r, SCHED_I, mb), pw = POS(r, SCHED_W, mb);
    if (pf < 0 || (pb < 0 && pi < 0 && pw < 0)) {
        set_err(err, errlen, "rank %d: missing %s (every micro-batch needs one %s on every stage)", r,
                act_str(pf < 0 ? &f : &bw, b1, sizeof(b1)), pf < 0 ? "forward" : "backward (B, or I and W)");
        return -1;
    }
    if (pb >= 0 && (pi >= 0 || pw >= 0)) {
        set_err(err, errlen, "rank %d, action #%d (%s): micro-batch %d has both a B and an %s (a backward is "
                "one B, or an I and a W)", r, pb, act_str(&bw, b1, sizeof(b1)), mb, pi >= 0 ? "I" : "W");
        return -1;
    }
    if (pb < 0 && (pi < 0 || pw < 0)) {
        set_err(err, errlen, "rank %d: missing %s (%s of micro-batch %d has no %s)", r,
                act_str(pi < 0 ? &in : &wt, b1, sizeof(b1)), pi < 0 ? "the W" : "the I", mb,
                pi < 0 ? "input part" : "weight part");
        return -1;
    }
    /* the input side of the backward (B or I) and the action that frees the slot (B or W) */
    const sched_action *bin = pb >= 0 ? &bw : &in, *bfree = pb >= 0 ? &bw : &wt;
    int pin = pb >= 0 ? pb : pi;
    if (pin < pf) {
        set_err(err, errlen, "rank %d, action #%d (%s): backward before forward (%s is action #%d)",
                r, pin, act_str(bin, b1, sizeof(b1)), act_str(&f, b2, sizeof(b2)), pf);
        return -1;
    }
    if (pb < 0 && pw < pi) {
        set_err(err, errlen, "rank %d, action #%d (%s): weight part before its input part (%s is action #%d)",
                r, pw, act_str(&wt, b1, sizeof(b1)), act_str(&in, b2, sizeof(b2)), pi);
        return -1;
    }
    (void)bfree;
    /* required comm actions and the compute they must precede/follow */
    struct { int need; sched_op op; int before; const sched_action *c; const char *what; } req[5] = {
        { r > 0,     SCHED_RECV_F, 1, &f,  "the forward input must be received before the forward" },
        { r < P - 1, SCHED_SEND_F, 0, &f,  "the forward output must be sent to the next stage after the forward" },
        { r < P - 1, SCHED_SEND_F, 1, bin, "the forward output lives in the micro-batch's activation slot, "
                                           "which its backward frees: send it before the backward" },
        { r < P - 1, SCHED_RECV_B, 1, bin, "the output gradient must be received before the backward" },
        { r > 0,     SCHED_SEND_B, 0, bin, "the input gradient must be sent to the previous stage after the backward" },
    };
    for (int q = 0; q < 5; q++) {
        if (!req[q].need) continue;
        sched_action c = { req[q].op, r, mb };
        int pc = POS(r, req[q].op, mb), pcomp = POS(r, req[q].c->op, mb);
        if (pc < 0) {
            set_err(err, errlen, "rank %d: missing %s (%s)", r, act_str(&c, b1, sizeof(b1)), req[q].what);
            return -1;
        }
        if (req[q].before ? pc > pcomp : pc < pcomp) {
            sched_action early = req[q].before ? *req[q].c : c, late = req[q].before ? c : *req[q].c;
            int pe = req[q].before ? pcomp : pc, pl = req[q].before ? pc : pcomp;
            set_err(err, errlen, "rank %d, action #%d (%s): wrong order, comes before %s (action #%d); %s",
                    r, pe, act_str(&early, b1, sizeof(b1)), act_str(&late, b2, sizeof(b2)), pl, req[q].what);
            return -1;
        }
    }
    return 0;
}

/* 4. The gradient accumulators: weight gradients are sums over micro-batches, and float sums
 * depend on their order, so every rank adds them in ascending micro-batch order (B
 * everywhere; F on the last stage, where the LM head's backward runs inside the forward). */
static int validate_accum_order(const sched *s, const int *pos, char *err, size_t errlen) {
    char b1[64], b2[64];
    for (int r = 0; r < s->P; r++)
        for (int k = 0; k < 2; k++) {
            if (k && r != s->P - 1) continue;
            for (int mb = 1; mb < s->M; mb++) {
                /* the weight adder of mb: F on the last stage (k = 1), else its B or W */
                sched_op op = k ? SCHED_F : POS(r, SCHED_B, mb) >= 0 ? SCHED_B : SCHED_W;
                sched_op pop = k ? SCHED_F : POS(r, SCHED_B, mb - 1) >= 0 ? SCHED_B : SCHED_W;
                if (POS(r, op, mb) > POS(r, pop, mb - 1)) continue;
                sched_action a = { op, r, mb }, prev = { pop, r, mb - 1 };
                set_err(err, errlen, "rank %d, action #%d (%s): comes before %s (action #%d); %s add to the "
                        "gradients in ascending micro-batch order, so that every schedule sums them as one "
                        "process does (bit-identical results)", r, POS(r, op, mb), act_str(&a, b1, sizeof(b1)),
                        act_str(&prev, b2, sizeof(b2)), POS(r, pop, mb - 1),
                        k == 0 ? "backwards (B or W)" : "the last stage's forwards (they run the LM head's backward)");
                return -1;
            }
        }
    return 0;
}
#undef POS

/* Sections 1-4 over the position table. */
static int validate_table(const sched *s, int *pos, char *err, size_t errlen) {
    if (validate_positions(s, pos, err, errlen) != 0 || validate_pairs(s, pos, err, errlen) != 0) return -1;
    for (int r = 0; r < s->P; r++)
        for (int mb = 0; mb < s->M; mb++)
            if (validate_mb(s, pos, r, mb, err, errlen) != 0) return -1;
    return validate_accum_order(s, pos, err, errlen);
}

int sched_validate(const sched *s, char *err, size_t errlen) {
    if (s == NULL || s->n == NULL || s->acts == NULL) {
        set_err(err, errlen, "invalid schedule: empty");
        return -1;
    }
    if (s->P < 1 || s->M < 1) {
        set_err(err, errlen, "invalid schedule: P=%d M=%d (both must be >= 1)", s->P, s->M);
        return -1;
    }
    /* ranges and partner existence first, so the table below is indexed in range */
    if (check_actions(s, err, errlen) != 0) return -1;
    size_t npos = (size_t)s->P * SCHED_NOPS * (size_t)s->M;
    int *pos = malloc(npos * sizeof(int));
    if (pos == NULL) { set_err(err, errlen, "sched_validate: out of memory"); return -1; }
    for (size_t k = 0; k < npos; k++) pos[k] = -1;
    int rc = validate_table(s, pos, err, errlen);
    free(pos);
    if (rc != 0) return -1;
    /* 5. deadlock freedom: blocking RECV, non-blocking SEND */
    sched_sim sim;
    if (sched_simulate(s, &sim, err, errlen) != 0) return -1;
    sched_sim_free(&sim);
    return 0;
}

// ----------------------------------------------------------------------------
// inspection and printing

/* walk rank `stage` counting F minus B and keep the maximum */
int sched_max_inflight(const sched *s, int stage) {
    if (s == NULL || s->n == NULL || s->acts == NULL || stage < 0 || stage >= s->P) return -1;
    int cur = 0, best = 0;
    for (int i = 0; i < s->n[stage]; i++) {
        const sched_action *a = &s->acts[stage][i];
        if (a->op == SCHED_F) cur++;
        else if (a->op == SCHED_B || a->op == SCHED_W) cur--;
        if (cur > best) best = cur;
    }
    return best;
}

/* walk rank `stage`: does an I or B start while another micro-batch's W is pending? */
int sched_defers_weights(const sched *s, int stage) {
    if (s == NULL || s->n == NULL || s->acts == NULL || stage < 0 || stage >= s->P) return 0;
    int pending = 0;
    for (int i = 0; i < s->n[stage]; i++) {
        sched_op op = s->acts[stage][i].op;
        if ((op == SCHED_I || op == SCHED_B) && pending) return 1;
        if (op == SCHED_I) pending++;
        else if (op == SCHED_W) pending--;
    }
    return 0;
}

/* decimal digits of a non-negative int */
static int ndigits(int v) {
    int d = 1;
    while (v >= 10) { v /= 10; d++; }
    return d;
}

/* rank x time grid from the unit-cost simulation, then a summary. A cell
   is the compute action occupying that time unit ("F3", "B3") or '.' */
void sched_print_grid(const sched *s, FILE *out) {
    if (out == NULL) return;
    if (s == NULL) { fprintf(out, "(no schedule)\n"); return; }
    char err[512];
    sched_sim sim;
    if (sched_simulate(s, &sim, err, sizeof(err)) != 0) {
        fprintf(out, "schedule %s P=%d M=%d cannot be simulated: %s\n", s->name, s->P, s->M, err);
        return;
    }
    int T = sim.makespan;
    int cw = 1 + ndigits(s->M > 0 ? s->M - 1 : 0);  // cell width: "F" + mb digits
    int rw = ndigits(s->P - 1);
    const sched_action **cell = malloc((size_t)(T ? T : 1) * sizeof(*cell));
    if (cell == NULL) { sched_sim_free(&sim); fprintf(out, "(out of memory)\n"); return; }
    for (int r = 0; r < s->P; r++) {
        for (int t = 0; t < T; t++) cell[t] = NULL;
        for (int i = 0; i < s->n[r]; i++) {
            int idx = sim.off[r] + i;
            for (int t = sim.start[idx]; t < sim.end[idx]; t++) cell[t] = &s->acts[r][i];
        }
        // every cell padded to the same width, except the last (no trailing blanks)
        fprintf(out, "rank %*d:", rw, r);
        for (int t = 0; t < T; t++) {
            int w = t < T - 1 ? cw : 1;
            if (cell[t] == NULL) fprintf(out, " %-*s", w, ".");
            else fprintf(out, " %s%-*d", op_names[cell[t]->op], w > 1 ? w - 1 : 1, cell[t]->mb);
        }
        fputc('\n', out);
    }
    free(cell);
    fprintf(out, "schedule %s: P=%d stages, M=%d micro-batches, makespan %d units (F=%d, B=%d, I=%d, W=%d, comm=0)\n",
            s->name, s->P, s->M, T, SCHED_COST_F, SCHED_COST_B, SCHED_COST_I, SCHED_COST_W);
    fprintf(out, "bubble: %.2f%% (GPipe formula (P-1)/(M+P-1) = %.2f%%)\n",
            100.0 * sim.bubble, 100.0 * (double)(s->P - 1) / (double)(s->M + s->P - 1));
    fprintf(out, "max in-flight micro-batches per stage:");
    for (int r = 0; r < s->P; r++) fprintf(out, " %d", sched_max_inflight(s, r));
    fputc('\n', out);
    sched_sim_free(&sim);
}
