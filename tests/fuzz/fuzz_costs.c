/*
 * fuzz_costs.c — the schedule-costs reader (src/pipeline/sched_cost.c) and the tuner's search on what it
 * accepts (src/pipeline/tune.c): the input is a costs file. What sched_costs_read accepts is written
 * back and read again (the same numbers: %.9g of what was read, so a second round trip is
 * exact), played with 1f1b for its stage count, and searched by tune_search for a small batch
 * with and without a model (the split and D x P search need one): nothing may crash, leak or
 * trip a sanitizer, and every candidate must fit the cap it was given.
 */
#include <math.h>
#include "fuzz.h"
#include "cli/config.h"
#include "pipeline/sched_cost.h"
#include "pipeline/tune.h"

/* Written and read back: the same stage count, replicas and block counts. */
static void round_trip(const sched_costs *c) {
    char *out = NULL, err[512];
    size_t len = 0;
    FILE *w = open_memstream(&out, &len);
    if (!w) return;
    if (sched_costs_write(c, w) != 0) abort();
    fclose(w);
    FILE *r = fmemopen(out, len, "r");
    sched_costs d;
    if (!r || sched_costs_read(r, &d, err, sizeof err) != 0) {
        fprintf(stderr, "sched_costs_write wrote what sched_costs_read refuses: %s\n%s", err, out);
        abort();
    }
    fclose(r);
    if (d.P != c->P || d.dp != c->dp) abort();
    for (int s = 0; s < c->P; s++)
        if (d.blocks[s] != c->blocks[s]) abort();
    sched_costs_free(&d);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fmemopen(size ? (void *)data : (void *)"", size, "r");
    if (!f) return 0;
    sched_costs c;
    char err[1024];
    int rc = sched_costs_read(f, &c, err, sizeof err);
    fclose(f);
    if (rc != 0) return 0;
    round_trip(&c);
    if (c.P <= 16) {
        sched s;
        if (sched_build_chunks("1f1b", c.P, 1, 2, &s, err, sizeof err) == 0) {
            sched_pred p;
            if (sched_predict(&s, &c, &p, err, sizeof err) == 0) sched_pred_free(&p);
            sched_free(&s);
        }
        static model_config cfg; /* the default model (tiny GPT-2, L = 4) */
        static int have_cfg = -1;
        if (have_cfg < 0) {
            pl_options o;
            config_defaults(&o);
            have_cfg = config_model(&o, config_vocab(&o), &cfg, err, sizeof err) == 0;
        }
        for (int with_model = 0; with_model < 2; with_model++) {
            if (with_model && !have_cfg) break;
            tune_query q = {c.P, 4, 2, 1.0, 0, cfg.L, with_model ? &cfg : NULL, 16, with_model ? 4 : 0, 0, 0, 0};
            const sched_costs *cs[TUNE_NMODES] = {&c, NULL, &c};
            tune_cand *t = NULL;
            int n = 0, tried = 0;
            if (tune_search(&q, cs, &t, &n, &tried, err, sizeof err) == 0)
                for (int i = 0; i < n; i++)
                    if (!(t[i].peak_mem_mb <= q.mem_cap_mb) || !isfinite(t[i].step_s)) abort();
            free(t);
        }
    }
    sched_costs_free(&c);
    return 0;
}
