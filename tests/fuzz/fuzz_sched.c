/*
 * fuzz_sched.c — the schedule CSV reader (src/pipeline/sched.c): the input is the CSV. What
 * sched_read_csv accepts goes through sched_validate and sched_simulate, is printed as a grid,
 * and is written back as CSV and read again: the round trip must give the same schedule.
 */
#include "fuzz.h"
#include "pipeline/sched.h"

static int same(const sched *a, const sched *b) {
    if (a->P != b->P || a->M != b->M) return 0;
    for (int r = 0; r < a->P; r++) {
        if (a->n[r] != b->n[r]) return 0;
        for (int i = 0; i < a->n[r]; i++)
            if (a->acts[r][i].op != b->acts[r][i].op || a->acts[r][i].stage != b->acts[r][i].stage ||
                a->acts[r][i].mb != b->acts[r][i].mb)
                return 0;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fmemopen(size ? (void *)data : (void *)"", size, "r");
    if (!f) return 0;
    sched s;
    char err[1024];
    int rc = sched_read_csv(f, "fuzz", &s, err, sizeof err);
    fclose(f);
    if (rc != 0) return 0;
    int valid = sched_validate(&s, err, sizeof err) == 0;
    sched_sim sim;
    int simok = sched_simulate(&s, &sim, err, sizeof err) == 0;
    if (simok) sched_sim_free(&sim);
    if (valid && !simok) {
        fprintf(stderr, "sched_validate accepted a schedule sched_simulate refuses: %s\n", err);
        abort();
    }
    FILE *devnull = fopen("/dev/null", "w");
    if (valid) sched_print_grid(&s, devnull);
    for (int r = -1; r <= s.P; r++) sched_max_inflight(&s, r);
    fclose(devnull);
    char *out = NULL;
    size_t outlen = 0;
    FILE *w = open_memstream(&out, &outlen);
    if (sched_write_csv(&s, w) == 0) {
        fclose(w);
        w = NULL;
        FILE *r = fmemopen(out, outlen, "r");
        sched t;
        if (r && sched_read_csv(r, "again", &t, err, sizeof err) == 0) {
            /* rows without actions are written as empty lines and read back as empty rows */
            if (!same(&s, &t)) {
                fprintf(stderr, "schedule CSV does not survive a write and a read\n");
                abort();
            }
            sched_free(&t);
        } else if (s.P > 0) {
            fprintf(stderr, "sched_read_csv refuses what sched_write_csv wrote: %s\n", err);
            abort();
        }
        if (r) fclose(r);
    }
    if (w) fclose(w);
    free(out);
    sched_free(&s);
    return 0;
}
