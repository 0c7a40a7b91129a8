/*
 * sched_csv.c — actions as text (torch's notation: 0F3, 1SEND_B2) and schedules as torch's
 * CSV form, written and read with every field checked.
 */
#include "util/common.h"
#include "pipeline/sched.h"
#include "pipeline/sched_internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* the spelling torch uses for each op, indexed by sched_op */
const char *const sched_op_names[SCHED_NOPS] = {
    "F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "I", "W"
};

/* format an action for messages; never fails (falls back to "?") */
const char *sched_act_str(const sched_action *a, char *buf, size_t len) {
    if (sched_action_format(a, buf, len) != 0) snprintf(buf, len, "?");
    return buf;
}

// ----------------------------------------------------------------------------
// action strings

/* spelling of an op; NULL if out of range */
const char *sched_op_str(sched_op op) {
    return sched_op_known((int)op) ? sched_op_names[op] : NULL;
}

/* "{stage}{op}{mb}", the torch _Action repr */
int sched_action_format(const sched_action *a, char *buf, size_t len) {
    if (a == NULL || buf == NULL || len == 0) return PL_EINVAL;
    if (!sched_op_known((int)a->op) || a->stage < 0 || a->mb < 0) { buf[0] = '\0'; return PL_EINVAL; }
    int k = snprintf(buf, len, "%d%s%d", a->stage, sched_op_names[a->op], a->mb);
    if (k < 0 || (size_t)k >= len) { buf[0] = '\0'; return PL_EINVAL; }
    return PL_OK;
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
    if (str == NULL || a == NULL) return PL_EINVAL;
    int stage, mb;
    int k = read_uint(str, &stage);
    if (k == 0) return PL_EINVAL;
    const char *p = str + k;
    int best = -1;
    size_t best_len = 0;
    for (int op = 0; op < SCHED_NOPS; op++) {
        size_t l = strlen(sched_op_names[op]);
        if (strncmp(p, sched_op_names[op], l) == 0 && l > best_len) { best = op; best_len = l; }
    }
    if (best < 0) return PL_EINVAL;
    p += best_len;
    k = read_uint(p, &mb);
    if (k == 0) return PL_EINVAL;
    if (p[k] != '\0') return PL_EINVAL;
    a->op = (sched_op)best;
    a->stage = stage;
    a->mb = mb;
    return PL_OK;
}

// ----------------------------------------------------------------------------
// CSV

/* one row per rank, comma separated, '\n' terminated */
int sched_write_csv(const sched *s, FILE *f) {
    if (s == NULL || f == NULL || s->n == NULL || s->acts == NULL) return PL_EINVAL;
    char buf[64];
    for (int r = 0; r < s->P; r++) {
        for (int i = 0; i < s->n[r]; i++) {
            if (sched_action_format(&s->acts[r][i], buf, sizeof(buf)) != 0) return PL_EINVAL;
            if (fprintf(f, "%s%s", i ? "," : "", buf) < 0) return PL_EIO;
        }
        if (fputc('\n', f) == EOF) return PL_EIO;
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

/* parse one cell: an action, or torch's "(0F3;1B0)OVERLAP_F_B" as its sub-actions in order;
   appends to acts[*n]. PL_OK or PL_EINVAL. */
static int parse_cell(char *cell, sched_action *acts, int *n) {
    static const char tail[] = ")OVERLAP_F_B";
    size_t l = strlen(cell), tl = sizeof tail - 1;
    if (cell[0] != '(') {
        if (sched_action_parse(cell, &acts[*n]) != 0) return PL_EINVAL;
        (*n)++;
        return PL_OK;
    }
    if (l <= tl + 1 || strcmp(cell + l - tl, tail) != 0) return PL_EINVAL;
    cell[l - tl] = '\0';
    for (char *sub = cell + 1, *semi;; sub = semi + 1) {
        semi = strchr(sub, ';');
        if (semi) *semi = '\0';
        while (*sub == ' ') sub++;
        if (sched_action_parse(sub, &acts[*n]) != 0) return PL_EINVAL;
        (*n)++;
        if (!semi) return PL_OK;
    }
}

/* parse one CSV row into a freshly allocated action list */
static int parse_row(char *line, int row, sched_action **out, int *nout,
                     char *err, size_t errlen) {
    int cap = 1;
    for (char *p = line; *p; p++) if (*p == ',' || *p == ';') cap++;
    sched_action *acts = malloc((size_t)cap * sizeof(sched_action));
    if (acts == NULL) { sched_err(err, errlen, "sched_read_csv: out of memory"); return PL_ENOMEM; }
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
            char shown[128];
            snprintf(shown, sizeof shown, "%s", cell);
            if (parse_cell(cell, acts, &n) != 0) {
                sched_err(err, errlen, "sched_read_csv: row %d (rank %d), column %d: cannot parse action '%s'",
                        row + 1, row, col + 1, shown);
                free(acts);
                return PL_EINVAL;
            }
        }
        col++;
        if (!comma) break;
        cell = comma + 1;
    }
    *out = acts;
    *nout = n;
    return PL_OK;
}

/* the placement every action of s fits: loop first, then V (which must also have no SEND or
   RECV between two stages of one rank, as torch writes it); loop if neither (the validator
   then names the action on the wrong row) */
static int infer_place(sched *s) {
    for (int place = SCHED_PLACE_LOOP; place <= SCHED_PLACE_V; place++) {
        int fits = 1;
        s->place = place;
        for (int r = 0; fits && r < s->P; r++)
            for (int i = 0; fits && i < s->n[r]; i++) {
                const sched_action *a = &s->acts[r][i];
                fits = sched_stage_rank(s, a->stage) == r;
                if (fits && !sched_op_computes(a->op) && place != SCHED_PLACE_LOOP) {
                    int lo = sched_peer_stage(a) < a->stage ? sched_peer_stage(a) : a->stage;
                    fits = !sched_local_edge(s, lo);
                }
            }
        if (fits) return place;
    }
    return SCHED_PLACE_LOOP;
}

/* read torch-style CSV: P = rows, M = largest mb + 1, V = (largest stage + 1) / P when the
   stages go beyond the rows (else 1, and any stage missing is the validator's to name) */
int sched_read_csv(FILE *f, const char *name, sched *s, char *err, size_t errlen) {
    if (s == NULL) { sched_err(err, errlen, "sched_read_csv: NULL output"); return PL_EINVAL; }
    memset(s, 0, sizeof(*s));
    if (f == NULL) { sched_err(err, errlen, "sched_read_csv: NULL file"); return PL_EINVAL; }
    char *line = NULL;
    size_t cap = 0;
    int rows_cap = 0, rc = 0;
    snprintf(s->name, sizeof(s->name), "%s", name ? name : "csv");
    for (;;) {
        int got = read_line(f, &line, &cap);
        if (got < 0) { sched_err(err, errlen, "sched_read_csv: out of memory"); rc = PL_ENOMEM; break; }
        if (got == 0) break;
        if (s->P == rows_cap) {
            int nc = rows_cap ? rows_cap * 2 : 8;
            int *nn = realloc(s->n, (size_t)nc * sizeof(int));
            if (nn) s->n = nn;
            sched_action **na = realloc(s->acts, (size_t)nc * sizeof(sched_action *));
            if (na) s->acts = na;
            if (nn == NULL || na == NULL) {
                sched_err(err, errlen, "sched_read_csv: out of memory");
                rc = PL_ENOMEM;
                break;
            }
            rows_cap = nc;
        }
        if (parse_row(line, s->P, &s->acts[s->P], &s->n[s->P], err, errlen) != 0) { rc = PL_EINVAL; break; }
        s->P++;
    }
    free(line);
    if (rc == PL_OK && ferror(f)) { sched_err(err, errlen, "sched_read_csv: read error"); rc = PL_EIO; }
    if (rc == PL_OK && s->P == 0) { sched_err(err, errlen, "sched_read_csv: empty file (no rows)"); rc = PL_EINVAL; }
    if (rc == PL_OK) {
        int maxmb = -1, maxst = -1;
        for (int r = 0; r < s->P; r++)
            for (int i = 0; i < s->n[r]; i++) {
                if (s->acts[r][i].mb > maxmb) maxmb = s->acts[r][i].mb;
                if (s->acts[r][i].stage > maxst) maxst = s->acts[r][i].stage;
            }
        size_t total = 0;
        for (int r = 0; r < s->P; r++) total += (size_t)s->n[r];
        /* stages beyond the rows are chunks: S = maxst + 1 stages, V = S / P per row */
        size_t S = maxst >= s->P ? (size_t)maxst + 1 : (size_t)s->P;
        if (maxmb < 0) { sched_err(err, errlen, "sched_read_csv: no actions in any row"); rc = PL_EINVAL; }
        else if (S % (size_t)s->P != 0) {
            sched_err(err, errlen, "sched_read_csv: stages 0..%d (%zu) on %d rows: with several chunks per rank "
                    "the stage count must be a multiple of the row count (stage s runs on row s mod %d)",
                    maxst, S, s->P, s->P);
            rc = PL_EINVAL;
        }
        /* a schedule holds an F and a B of every micro-batch on every stage: refuse an M (or S)
           that no file this size can hold before anything sizes S x M tables by it (fuzz: big-mb) */
        else if (S * ((size_t)maxmb + 1) > total) {
            if (S == (size_t)s->P)
                sched_err(err, errlen, "sched_read_csv: micro-batch %d on %d rank(s) needs at least %zu actions, "
                        "the file has %zu", maxmb, s->P, (size_t)s->P * ((size_t)maxmb + 1), total);
            else
                sched_err(err, errlen, "sched_read_csv: micro-batch %d on %zu stages (%d rows) needs at least %zu "
                        "actions, the file has %zu", maxmb, S, s->P, S * ((size_t)maxmb + 1), total);
            rc = PL_EINVAL;
        }
        else {
            s->M = maxmb + 1;
            s->V = (int)(S / (size_t)s->P);
            s->place = infer_place(s);
        }
    }
    if (rc != PL_OK) sched_free(s);
    return rc;
}
