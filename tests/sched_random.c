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
 * dry run accepts. Each one, with a random split of the blocks, trains the tiny model for
 * 2 steps through pipelm_main; losses and final weights must be bit-identical to the
 * one-process run (--reference writes those). It also draws schedules without the
 * gradient-order rule and requires the validator to refuse every one that breaks it.
 *
 * usage: mpiexec -n P sched_random --dir DIR [--reference] [--count N] [--seed S]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>
#include "pipelm/pipelm.h"
#include "pipelm/rng.h"
#include "pipelm/sched.h"

#define MAXM 8
#define NLAYER 4

typedef struct {
    int P, M;
    int *n, *done;          /* per rank: actions placed; done[r][op][mb] */
    unsigned char *split;   /* split[r][mb]: this backward is an I and a W */
    sched_action **acts;
} gen;

#define DONE(g, r, op, mb) (g)->done[((r) * SCHED_NOPS + (op)) * (g)->M + (mb)]
#define SPLIT(g, r, mb) (g)->split[(r) * (g)->M + (mb)]
/* the weight gradients of mb have been added on rank r (its B or its W ran) */
#define WDONE(g, r, mb) (DONE(g, r, SCHED_B, mb) || DONE(g, r, SCHED_W, mb))

/* Is action (op, mb) on rank r ready: its local producers placed, a RECV's SEND issued? */
static int ready(const gen *g, int r, sched_op op, int mb, int ordered) {
    int P = g->P, last = r == P - 1;
    if (DONE(g, r, op, mb)) return 0;
    switch (op) {
    case SCHED_RECV_F: return r > 0 && DONE(g, r - 1, SCHED_SEND_F, mb);
    case SCHED_RECV_B: return !last && DONE(g, r + 1, SCHED_SEND_B, mb);
    case SCHED_F:
        return (r == 0 || DONE(g, r, SCHED_RECV_F, mb)) && (!ordered || !last || mb == 0 || DONE(g, r, SCHED_F, mb - 1));
    case SCHED_SEND_F: return !last && DONE(g, r, SCHED_F, mb);
    case SCHED_B:
    case SCHED_I:
        if ((op == SCHED_I) != SPLIT(g, r, mb)) return 0;
        return DONE(g, r, SCHED_F, mb) && (last || (DONE(g, r, SCHED_RECV_B, mb) && DONE(g, r, SCHED_SEND_F, mb))) &&
               (op == SCHED_I || !ordered || mb == 0 || WDONE(g, r, mb - 1));
    case SCHED_W:
        return SPLIT(g, r, mb) && DONE(g, r, SCHED_I, mb) && (!ordered || mb == 0 || WDONE(g, r, mb - 1));
    case SCHED_SEND_B: return r > 0 && (DONE(g, r, SCHED_B, mb) || DONE(g, r, SCHED_I, mb));
    }
    return 0;
}

/* Draw one schedule into s (P ranks, M micro-batches); ordered: obey the gradient order. */
static void draw(rng_state *rng, int P, int M, int ordered, sched *s) {
    gen g = {P, M, calloc(P, sizeof(int)), calloc((size_t)P * SCHED_NOPS * M, sizeof(int)), calloc((size_t)P * M, 1),
             NULL};
    for (int k = 0; k < P * M; k++) g.split[k] = rng_u64(rng) & 1;
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "random");
    s->P = P;
    s->M = M;
    s->n = g.n;
    s->acts = calloc(P, sizeof *s->acts);
    for (int r = 0; r < P; r++) s->acts[r] = calloc((size_t)SCHED_NOPS * M, sizeof(sched_action));
    sched_action cand[4 * SCHED_NOPS * MAXM];
    for (;;) {
        int nc = 0;
        for (int r = 0; r < P; r++)
            for (int op = 0; op < SCHED_NOPS; op++)
                for (int mb = 0; mb < M; mb++)
                    if (ready(&g, r, (sched_op)op, mb, ordered)) cand[nc++] = (sched_action){(sched_op)op, r, mb};
        if (nc == 0) break;
        sched_action a = cand[rng_u64(rng) % (uint64_t)nc];
        s->acts[a.stage][g.n[a.stage]++] = a;
        DONE(&g, a.stage, a.op, a.mb) = 1;
    }
    free(g.done);
    free(g.split);
}

/* A random split of NLAYER blocks over P stages, as "a,b,c" (the first and last stage may
 * be empty, a middle one may not). */
static void draw_split(rng_state *rng, int P, char *buf, size_t len) {
    int b[4] = {0, 0, 0, 0}, left = NLAYER;
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
    int reference = 0, count = 50;
    unsigned long long seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--reference")) reference = 1;
        else if (!strcmp(argv[i], "--count") && i + 1 < argc) count = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
    }
    if (!dir) {
        if (rank == 0) fprintf(stderr, "usage: sched_random --dir DIR [--reference] [--count N] [--seed S]\n");
        MPI_Finalize();
        return 2;
    }
    FILE *devnull = fopen("/dev/null", "w");
    char path[600], refbin[600], reflos[600], csv[600], split[32], err[1024];
    double t0 = MPI_Wtime();
    int failures = 0, runs = 0, refused = 0, unordered = 0;
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
        /* 2. an ordered draw: accepted, and trained bit-identically */
        draw(&rng, P, M, 1, &s);
        draw_split(&rng, P, split, sizeof split);
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
                fprintf(stderr, "schedule %d (P=%d M=%d split %s, rc %d) differs from one process; its CSV:\n", k, P, M,
                        split, rc);
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
        printf("P=%d: %d random schedules trained, %d differed from one process; %d unconstrained draws broke the "
               "gradient order and %d of them were refused by name; %.1f s\n", P, runs, failures, unordered, refused,
               MPI_Wtime() - t0);
    fclose(devnull);
    MPI_Finalize();
    return failures || refused != unordered ? 1 : 0;
}
