/*
 * sched_random.c — the schedule property test: random schedules train exactly.
 *
 * For P ranks (this job's size) and M = 1..8 micro-batches it generates random schedules:
 * each rank's F/B/SEND/RECV actions in a random order that respects only the true data
 * dependencies (RECV_F < F < SEND_F, RECV_B < B < SEND_B, F < B, SEND_F < B: the slot that
 * holds the forward output is freed by its backward, and the gradient sums' order: B in
 * ascending micro-batch order, and F too on the last stage, which runs the LM head's
 * backward) and that cannot deadlock. About half the backwards are drawn split, as an I
 * (input part: takes B's place for RECV_B, SEND_F and SEND_B) and a later W (weight part:
 * takes B's place in the gradient order), so zero-bubble orders are covered too. They are drawn as one global interleaving in which a
 * RECV is placed only after its SEND was issued, which is exactly the set of schedules the
 * dry run accepts. On P = 2 and 3 ranks every other one has two chunks per rank (2P stages,
 * stage s on rank s mod P, activations wrapping from the last rank to rank 0), drawn the same
 * way over the 2P stages, and every other one of those is V-shaped (stage s on rank s for s < P,
 * on rank 2P-1-s after; rank P-1's two stages exchange no messages, its list carries the
 * hand-over). Each one, with a random split of the blocks, trains the tiny model for
 * 2 steps through pipelm_main; losses and final weights must be bit-identical to the
 * one-process run (--reference writes those). It also draws schedules without the
 * gradient-order rule and requires the validator to refuse every one that breaks it.
 *
 * --chunks-only (no training, no MPI ranks needed: --ranks P sets P) checks the validator
 * alone on schedules with V = 1, 2, 3 chunks per rank (S = P*V stages, stage s on rank
 * s % P, so activations wrap from the last rank to rank 0), with about half the backwards
 * split into I and W, every other two-chunk draw V-shaped: (a) a global interleaving that obeys every rule must be accepted;
 * (b) one without the gradient-order rule must be refused, by name, exactly when some
 * stage adds its weight gradients out of micro-batch order; (c) one drawn per rank without
 * looking at the peers (each RECV may come before its SEND was issued, with a random
 * probability per draw) must be accepted exactly when it cannot deadlock, which an
 * independent oracle decides: the graph of program order plus SEND -> RECV edges has no
 * cycle (Kahn's algorithm). The dry run must agree too, and every drawn CSV must read back
 * with the same V.
 *
 * usage: mpiexec -n P sched_random --dir DIR [--reference] [--count N] [--seed S]
 *        mpiexec -n 1 sched_random --chunks-only [--ranks P] [--count N] [--seed S]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>
#include "cli/pipelm.h"
#include "util/rng.h"
#include "pipeline/sched.h"

#define MAXM 8
#define NLAYER 4

typedef struct {
    int S, M;               /* global stages (P * V), micro-batches */
    int P, place;           /* ranks, the placement (sched.h) */
    int *done;              /* done[stage][op][mb] */
    unsigned char *split;   /* split[stage][mb]: this backward is an I and a W */
} gen;

#define DONE(g, r, op, mb) (g)->done[((r) * SCHED_NOPS + (op)) * (g)->M + (mb)]
#define SPLIT(g, r, mb) (g)->split[(r) * (g)->M + (mb)]
/* the weight gradients of mb have been added on stage r (its B or its W ran) */
#define WDONE(g, r, mb) (DONE(g, r, SCHED_B, mb) || DONE(g, r, SCHED_W, mb))

/* Is action (op, mb) on global stage r ready: its local producers placed, a RECV's SEND
 * issued (unless peers = 0: a draw that looks at its own rank only)? */
/* Stages a and a + 1 on one rank of a V placement: no messages, the list order carries the data. */
static int local(const gen *g, int a) {
    return g->place == SCHED_PLACE_V && a >= 0 && a + 1 < g->S &&
           sched_place_rank(g->place, g->P, a) == sched_place_rank(g->place, g->P, a + 1);
}

/* The input side of stage r's backward of mb has run (its B or its I). */
static int bdone(const gen *g, int r, int mb) { return DONE(g, r, SCHED_B, mb) || DONE(g, r, SCHED_I, mb); }

static int ready(const gen *g, int r, sched_op op, int mb, int ordered, int peers) {
    int last = r == g->S - 1;
    if (DONE(g, r, op, mb)) return 0;
    switch (op) {
    case SCHED_RECV_F: return r > 0 && !local(g, r - 1) && (!peers || DONE(g, r - 1, SCHED_SEND_F, mb));
    case SCHED_RECV_B: return !last && !local(g, r) && (!peers || DONE(g, r + 1, SCHED_SEND_B, mb));
    case SCHED_F:
        return (r == 0 || (local(g, r - 1) ? DONE(g, r - 1, SCHED_F, mb) : DONE(g, r, SCHED_RECV_F, mb))) &&
               (!ordered || !last || mb == 0 || DONE(g, r, SCHED_F, mb - 1));
    case SCHED_SEND_F: return !last && !local(g, r) && DONE(g, r, SCHED_F, mb);
    case SCHED_B:
    case SCHED_I:
        if ((op == SCHED_I) != SPLIT(g, r, mb)) return 0;
        return DONE(g, r, SCHED_F, mb) &&
               (last || (local(g, r) ? bdone(g, r + 1, mb) : DONE(g, r, SCHED_RECV_B, mb) && DONE(g, r, SCHED_SEND_F, mb))) &&
               (op == SCHED_I || !ordered || mb == 0 || WDONE(g, r, mb - 1));
    case SCHED_W:
        return SPLIT(g, r, mb) && DONE(g, r, SCHED_I, mb) && (!ordered || mb == 0 || WDONE(g, r, mb - 1));
    case SCHED_SEND_B: return r > 0 && !local(g, r - 1) && bdone(g, r, mb);
    }
    return 0;
}

/* Draw one schedule into s (P ranks of V chunks, M micro-batches) as one global interleaving
 * of the actions of all stages, each appended to its rank's list (stage st on rank st % P);
 * ordered: obey the gradient order. early: the chance (in 1/1000) that a RECV whose SEND
 * has not been issued is a candidate anyway (0: never, so the draw cannot deadlock). With
 * V = 1 and early = 0 this is the draw the training part has always used. */
static void draw_placed(rng_state *rng, int P, int V, int place, int M, int ordered, int early, sched *s) {
    int S = P * V;
    gen g = {S, M, P, place, calloc((size_t)S * SCHED_NOPS * M, sizeof(int)), calloc((size_t)S * M, 1)};
    for (int k = 0; k < S * M; k++) g.split[k] = rng_u64(rng) & 1;
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "random");
    s->P = P;
    s->V = V;
    s->M = M;
    s->place = place;
    s->n = calloc(P, sizeof(int));
    s->acts = calloc(P, sizeof *s->acts);
    for (int r = 0; r < P; r++) s->acts[r] = calloc((size_t)SCHED_NOPS * M * V, sizeof(sched_action));
    sched_action *cand = malloc(sizeof(sched_action) * (size_t)S * SCHED_NOPS * M);
    for (;;) {
        int nc = 0;
        for (int r = 0; r < S; r++)
            for (int op = 0; op < SCHED_NOPS; op++)
                for (int mb = 0; mb < M; mb++)
                    if (ready(&g, r, (sched_op)op, mb, ordered, 1) ||
                        (early && ready(&g, r, (sched_op)op, mb, ordered, 0) && (int)(rng_u64(rng) % 1000) < early))
                        cand[nc++] = (sched_action){(sched_op)op, r, mb};
        if (nc == 0) break;
        sched_action a = cand[rng_u64(rng) % (uint64_t)nc];
        int rk = sched_place_rank(place, P, a.stage);
        s->acts[rk][s->n[rk]++] = a;
        DONE(&g, a.stage, a.op, a.mb) = 1;
    }
    free(cand);
    free(g.done);
    free(g.split);
}

/* The same in the loop placement (stage st on rank st % P). */
static void draw_chunks(rng_state *rng, int P, int V, int M, int ordered, int early, sched *s) {
    draw_placed(rng, P, V, SCHED_PLACE_LOOP, M, ordered, early, s);
}

/* Draw one schedule into s (P ranks, M micro-batches); ordered: obey the gradient order. */
static void draw(rng_state *rng, int P, int M, int ordered, sched *s) {
    draw_chunks(rng, P, 1, M, ordered, 0, s);
}

/* The oracle of deadlock freedom under blocking receives and non-blocking sends: every
 * action is a node, with an edge to the next action of its rank and from each SEND to its
 * RECV; the schedule completes iff this graph has no cycle. Kahn's algorithm. 1 = completes. */
static int acyclic(const sched *s) {
    int P = s->P, S = P * s->V, M = s->M, total = 0;
    int *off = malloc(sizeof(int) * (P + 1));
    off[0] = 0;
    for (int r = 0; r < P; r++) off[r + 1] = off[r] + s->n[r];
    total = off[P];
    int *recv = malloc(sizeof(int) * 2 * (size_t)S * M), *indeg = calloc(total ? total : 1, sizeof(int));
    int *queue = malloc(sizeof(int) * (total ? total : 1));
    for (int k = 0; k < 2 * S * M; k++) recv[k] = -1;
    /* recv[kind][sender stage][mb] = the node of the RECV that takes that message */
    for (int r = 0; r < P; r++)
        for (int i = 0; i < s->n[r]; i++) {
            const sched_action *a = &s->acts[r][i];
            if (a->op == SCHED_RECV_F) recv[((size_t)0 * S + a->stage - 1) * M + a->mb] = off[r] + i;
            if (a->op == SCHED_RECV_B) recv[((size_t)1 * S + a->stage + 1) * M + a->mb] = off[r] + i;
            if (i > 0) indeg[off[r] + i]++;
        }
    for (int r = 0; r < P; r++)
        for (int i = 0; i < s->n[r]; i++) {
            const sched_action *a = &s->acts[r][i];
            int kind = a->op == SCHED_SEND_F ? 0 : a->op == SCHED_SEND_B ? 1 : -1;
            if (kind >= 0 && recv[((size_t)kind * S + a->stage) * M + a->mb] >= 0)
                indeg[recv[((size_t)kind * S + a->stage) * M + a->mb]]++;
        }
    int head = 0, tail = 0;
    for (int v = 0; v < total; v++) if (indeg[v] == 0) queue[tail++] = v;
    while (head < tail) {
        int v = queue[head++], r = 0;
        while (off[r + 1] <= v) r++;
        const sched_action *a = &s->acts[r][v - off[r]];
        if (v + 1 < off[r + 1] && --indeg[v + 1] == 0) queue[tail++] = v + 1;
        int kind = a->op == SCHED_SEND_F ? 0 : a->op == SCHED_SEND_B ? 1 : -1;
        int to = kind >= 0 ? recv[((size_t)kind * S + a->stage) * M + a->mb] : -1;
        if (to >= 0 && --indeg[to] == 0) queue[tail++] = to;
    }
    free(off); free(recv); free(indeg); free(queue);
    return tail == total;
}

/* Does some stage add its weight gradients (B or W; F on the last stage) out of order? */
static int order_broken(const sched *s) {
    int P = s->P, S = P * s->V, broken = 0;
    int *nb = calloc(S, sizeof(int)), nf = 0;
    for (int r = 0; r < P; r++)
        for (int i = 0; i < s->n[r]; i++) {
            const sched_action *a = &s->acts[r][i];
            if (a->op == SCHED_B || a->op == SCHED_W) broken |= a->mb != nb[a->stage]++;
            if (a->op == SCHED_F && a->stage == S - 1) broken |= a->mb != nf++;
        }
    free(nb);
    return broken;
}

/* The validator-only property over chunks (see the top): returns the number of failures
 * and prints one summary line. */
static int chunk_property(int P, int count, unsigned long long seed) {
    rng_state rng;
    rng_seed(&rng, seed, 5000 + (uint64_t)P);
    char err[1024];
    int fails = 0, accepted = 0, deadlocked = 0, free_ok = 0, unordered = 0, named = 0, draws = 0;
    const int early[4] = {5, 30, 200, 1000};
    for (int k = 0; k < count; k++)
        for (int V = 1; V <= 3; V++) {
            int M = 1 + k % MAXM;
            sched s;
            for (int kind = 0; kind < 3; kind++) {
                /* every other draw with two chunks is V-shaped (stage s on rank s, then 2P-1-s) */
                int place = V == 2 && k % 2 ? SCHED_PLACE_V : SCHED_PLACE_LOOP;
                draw_placed(&rng, P, V, place, M, kind != 1, kind == 2 ? early[k % 4] : 0, &s);
                draws++;
                int rc = sched_validate(&s, err, sizeof err), completes = acyclic(&s);
                sched_sim sim;
                int simok = sched_simulate(&s, &sim, err + 512, sizeof err - 512) == 0;
                if (simok) sched_sim_free(&sim);
                if (simok != completes) {
                    fprintf(stderr, "P=%d V=%d M=%d: the dry run %s, the oracle says it %s\n", P, V, M,
                            simok ? "completes" : "deadlocks", completes ? "completes" : "deadlocks");
                    fails++;
                }
                if (kind == 0) { /* obeys every rule */
                    if (rc != 0) { fprintf(stderr, "P=%d V=%d M=%d: refused a valid draw: %s\n", P, V, M, err); fails++; }
                    free_ok += rc == 0;
                } else if (kind == 1) { /* no gradient order; never deadlocks */
                    int broken = order_broken(&s);
                    unordered += broken;
                    if (broken != (rc != 0)) {
                        fprintf(stderr, "P=%d V=%d M=%d: order %s, validator %s: %s\n", P, V, M,
                                broken ? "broken" : "kept", rc ? "refused" : "accepted", rc ? err : "");
                        fails++;
                    }
                    if (broken && rc != 0) named += strstr(err, "ascending micro-batch order") != NULL;
                } else { /* drawn without the peers: accepted exactly when it completes */
                    if ((rc == 0) != completes ||
                        (rc != 0 && strstr(err, "deadlock") == NULL)) {
                        fprintf(stderr, "P=%d V=%d M=%d: oracle %s, validator: %s\n", P, V, M,
                                completes ? "completes" : "deadlocks", rc ? err : "accepted");
                        fails++;
                    }
                    accepted += rc == 0;
                    deadlocked += !completes;
                }
                /* its CSV reads back with the same shape */
                FILE *f = tmpfile();
                sched t;
                if (!f || sched_write_csv(&s, f) != 0) { fails++; sched_free(&s); if (f) fclose(f); continue; }
                rewind(f);
                if (sched_read_csv(f, "again", &t, err, sizeof err) != 0) {
                    fprintf(stderr, "P=%d V=%d M=%d: the CSV does not read back: %s\n", P, V, M, err);
                    fails++;
                } else {
                    /* a V draw may read back as loop only where the two coincide (P = 1) */
                    if (t.P != P || t.V != V || t.M != M || (P > 1 && t.place != place)) {
                        fprintf(stderr, "P=%d V=%d M=%d: the CSV reads back as P=%d V=%d M=%d\n", P, V, M, t.P, t.V,
                                t.M);
                        fails++;
                    }
                    sched_free(&t);
                }
                fclose(f);
                sched_free(&s);
                if (fails > 5) return fails;
            }
        }
    printf("P=%d chunks V=1..3: %d draws; %d rule-abiding ones accepted; %d of %d drawn without the peers "
           "deadlock and were refused, the other %d accepted; %d unordered draws broke the gradient order, %d refused "
           "by name; %d failures\n", P, draws, free_ok, deadlocked, count * 3, accepted, unordered, named, fails);
    return fails + (named != unordered);
}

/* A random split of NLAYER blocks over P stages, as "a,b,c" (the first and last stage may
 * be empty, a middle one may not). */
static void draw_split(rng_state *rng, int P, char *buf, size_t len) {
    int b[8] = {0}, left = NLAYER;
    for (int r = 1; r < P - 1; r++) { b[r] = 1; left--; }
    for (int l = 0; l < left; l++) b[rng_u64(rng) % (uint64_t)P]++;
    int off = 0;
    for (int r = 0; r < P; r++) off += snprintf(buf + off, len - off, "%s%d", r ? "," : "", b[r]);
}

/* Read a whole file; NULL if it cannot be read. */
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(n + 1);
    if (buf && fread(buf, 1, n, f) != (size_t)n) { free(buf); buf = NULL; }
    fclose(f);
    if (buf) buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

/* The step losses of a metrics file, exactly as written, one per line, into out. */
static void losses(const char *path, char *out, size_t len) {
    size_t n;
    char *buf = slurp(path, &n), *p = buf;
    out[0] = 0;
    while (p && (p = strstr(p, "\"event\":\"step\"")) != NULL) {
        char *l = strstr(p, "\"loss\":");
        if (!l) break;
        l += 7;
        size_t k = strcspn(l, ",}");
        strncat(out, l, k < len - strlen(out) - 2 ? k : 0);
        strcat(out, "\n");
        p = l;
    }
    free(buf);
}

/* Train 2 steps of the tiny model on this job through pipelm_main. csv may be NULL. */
static int train(const char *dir, int M, const char *csv, const char *split, FILE *devnull) {
    char b[16], mb[16], out[600], met[600], csvarg[600];
    snprintf(b, sizeof b, "%d", M);
    snprintf(mb, sizeof mb, "%d", M);
    snprintf(out, sizeof out, "%s/out.bin", dir);
    snprintf(met, sizeof met, "%s/m.jsonl", dir);
    char *argv[40] = {"pipelm", "train", "--batch", b, "--microbatches", mb, "--seq-len", "8", "--steps", "2",
                      "--warmup-steps", "0", "--lr", "0.01", "--save-final", out, "--metrics", met, "--progress",
                      "0", "--log-every", "1000", "--val-batches", "1", "--threads", "1", "--split", (char *)split};
    int argc = 28;
    if (csv) {
        snprintf(csvarg, sizeof csvarg, "%s", csv);
        argv[argc++] = "--schedule-csv";
        argv[argc++] = csvarg;
    }
    int abort_needed = 0;
    int rc = pipelm_main(argc, argv, MPI_COMM_WORLD, devnull, &abort_needed);
    if (abort_needed) MPI_Abort(MPI_COMM_WORLD, 3);
    return rc;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, P;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    const char *dir = NULL;
    int reference = 0, count = 50, chunks_only = 0, ranks = 0;
    unsigned long long seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--reference")) reference = 1;
        else if (!strcmp(argv[i], "--count") && i + 1 < argc) count = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--chunks-only")) chunks_only = 1;
        else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) ranks = atoi(argv[++i]);
    }
    if (chunks_only) {
        int fails = rank == 0 ? chunk_property(ranks > 0 ? ranks : P, count, seed) : 0;
        MPI_Finalize();
        return fails ? 1 : 0;
    }
    if (!dir) {
        if (rank == 0) fprintf(stderr, "usage: sched_random --dir DIR [--reference] [--count N] [--seed S]\n");
        MPI_Finalize();
        return 2;
    }
    FILE *devnull = fopen("/dev/null", "w");
    char path[600], refbin[600], reflos[600], csv[600], split[32], err[1024];
    double t0 = MPI_Wtime();
    int failures = 0, runs = 0, chunked = 0, refused = 0, unordered = 0;
    if (reference) { /* the one-process runs every schedule must reproduce */
        for (int M = 1; M <= MAXM; M++) {
            if (train(dir, M, NULL, "4", devnull) != 0) { fprintf(stderr, "reference run M=%d failed\n", M); failures++; }
            snprintf(path, sizeof path, "%s/out.bin", dir);
            snprintf(refbin, sizeof refbin, "%s/ref%d.bin", dir, M);
            rename(path, refbin);
            snprintf(path, sizeof path, "%s/m.jsonl", dir);
            snprintf(reflos, sizeof reflos, "%s/ref%d.jsonl", dir, M);
            rename(path, reflos);
        }
    }
    rng_state rng;
    rng_seed(&rng, seed, 1000 + (uint64_t)P); /* every rank draws the same schedules */
    for (int k = 0; k < count; k++) {
        int M = 1 + k % MAXM;
        sched s;
        /* 1. an unconstrained draw: the validator must refuse it iff it breaks the gradient order */
        draw(&rng, P, M, 0, &s);
        int broken = 0;
        for (int r = 0; r < P; r++) {
            int nb = 0, nf = 0;
            for (int i = 0; i < s.n[r]; i++) {
                const sched_action *a = &s.acts[r][i];
                if (a->op == SCHED_B || a->op == SCHED_W) broken |= a->mb != nb++;
                if (a->op == SCHED_F && r == P - 1) broken |= a->mb != nf++;
            }
        }
        int rc = sched_validate(&s, err, sizeof err);
        unordered += broken;
        if (broken && rc == 0) { if (rank == 0) fprintf(stderr, "validator accepted an out-of-order schedule\n"); failures++; }
        if (broken && rc != 0) refused += strstr(err, "ascending micro-batch order") != NULL;
        if (!broken && rc != 0) { if (rank == 0) fprintf(stderr, "validator refused: %s\n", err); failures++; }
        sched_free(&s);
        /* 2. an ordered draw: accepted, and trained bit-identically; every other one with two
         * chunks per rank where the 4 blocks fill the P V stages' middle (P = 2, 3) */
        int V = (P == 2 || P == 3) && k % 2 == 1 ? 2 : 1;
        /* and every other chunked one V-shaped */
        draw_placed(&rng, P, V, V == 2 && k % 4 == 3 ? SCHED_PLACE_V : SCHED_PLACE_LOOP, M, 1, 0, &s);
        draw_split(&rng, P * V, split, sizeof split);
        if (sched_validate(&s, err, sizeof err) != 0) {
            if (rank == 0) fprintf(stderr, "validator refused a schedule that obeys every rule: %s\n", err);
            failures++;
            sched_free(&s);
            continue;
        }
        snprintf(csv, sizeof csv, "%s/s.csv", dir);
        if (rank == 0) {
            FILE *f = fopen(csv, "w");
            if (!f || sched_write_csv(&s, f) != 0) { fprintf(stderr, "cannot write %s\n", csv); MPI_Abort(MPI_COMM_WORLD, 2); }
            fclose(f);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        rc = train(dir, M, csv, split, devnull);
        runs++;
        chunked += V > 1;
        if (rank == 0) {
            size_t n1, n2;
            snprintf(path, sizeof path, "%s/out.bin", dir);
            snprintf(refbin, sizeof refbin, "%s/ref%d.bin", dir, M);
            char *a = slurp(path, &n1), *b = slurp(refbin, &n2);
            char la[4096], lb[4096];
            snprintf(path, sizeof path, "%s/m.jsonl", dir);
            snprintf(reflos, sizeof reflos, "%s/ref%d.jsonl", dir, M);
            losses(path, la, sizeof la);
            losses(reflos, lb, sizeof lb);
            int same = rc == 0 && a && b && n1 == n2 && !memcmp(a, b, n1) && la[0] && !strcmp(la, lb);
            if (!same) {
                failures++;
                fprintf(stderr, "schedule %d (P=%d V=%d M=%d split %s, rc %d) differs from one process; its CSV:\n", k,
                        P, V, M, split, rc);
                sched_write_csv(&s, stderr);
                char keep[640];
                snprintf(keep, sizeof keep, "%s/failed%d.csv", dir, k);
                FILE *f = fopen(keep, "w");
                if (f) { sched_write_csv(&s, f); fclose(f); }
            }
            free(a);
            free(b);
            remove(path);
        }
        MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        sched_free(&s);
        if (failures > 5) break;
    }
    if (rank == 0)
        printf("P=%d: %d random schedules trained (%d with 2 chunks per rank), %d differed from one process; %d "
               "unconstrained draws broke the gradient order and %d of them were refused by name; %.1f s\n", P, runs,
               chunked, failures, unordered, refused, MPI_Wtime() - t0);
    fclose(devnull);
    MPI_Finalize();
    return failures || refused != unordered ? 1 : 0;
}
