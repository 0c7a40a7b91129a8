/*
 * sched_print.c — a schedule printed as a grid of ranks x time units, with its summary.
 */
#include "util/common.h"
#include "pipeline/sched.h"
#include "pipeline/sched_internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static int ndigits(int v) {
    int d = 1;
    while (v >= 10) { v /= 10; d++; }
    return d;
}

/* the chunked summary: per rank its peak in-flight activations (all chunks together, then
   each chunk's peak) and its own bubble 1 - busy / makespan; the interleaved theory */
static void print_chunk_summary(const sched *s, const sched_sim *sim, FILE *out) {
    int V = sched_nchunks(s), rw = ndigits(s->P - 1);
    for (int r = 0; r < s->P; r++) {
        long busy = 0;
        for (int i = 0; i < s->n[r]; i++) busy += sim->end[sim->off[r] + i] - sim->start[sim->off[r] + i];
        fprintf(out, "rank %*d: peak in-flight %d (stages", rw, r, sched_max_inflight(s, r));
        for (int c = 0; c < V; c++) {
            int st = sched_place_stage(s->place, s->P, r, c);
            fprintf(out, " %d:%d", st, sched_max_inflight_stage(s, st));
        }
        fprintf(out, "), bubble %.2f%%\n", sim->makespan > 0 ? 100.0 * (1.0 - (double)busy / sim->makespan) : 0.0);
    }
    double vm = (double)V * s->M;
    fprintf(out, "interleaved theory (Narayanan et al.): bubble (P-1)/(V*M) = %.2f%% of the ideal time, "
            "a fraction (P-1)/(V*M+P-1) = %.2f%% of the step%s\n", 100.0 * (s->P - 1) / vm,
            100.0 * (s->P - 1) / (vm + s->P - 1), strcmp(s->name, "interleaved-1f1b") == 0 && s->M % s->P == 0
            ? " (exact for interleaved-1f1b when P divides M)" : "");
}

/* rank x time grid from the unit-cost simulation, then a summary. A cell
   is the compute action occupying that time unit ("F3", "B3"; with chunks
   "5F3", the global stage first, as torch writes it) or '.' */
void sched_print_grid(const sched *s, FILE *out) {
    if (out == NULL) return;
    if (s == NULL) { fprintf(out, "(no schedule)\n"); return; }
    char err[512];
    sched_sim sim;
    if (sched_simulate(s, &sim, err, sizeof(err)) != 0) {
        fprintf(out, "schedule %s P=%d M=%d cannot be simulated: %s\n", s->name, s->P, s->M, err);
        return;
    }
    int T = sim.makespan, V = sched_nchunks(s), S = sched_nstages(s);
    int sw = V > 1 ? ndigits(S - 1) : 0;            // stage digits in a chunked cell
    int cw = sw + 1 + ndigits(s->M > 0 ? s->M - 1 : 0);  // cell width: [stage] "F" + mb digits
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
            else if (V == 1) fprintf(out, " %s%-*d", sched_op_names[cell[t]->op], w > 1 ? w - 1 : 1, cell[t]->mb);
            else {
                char b[64];
                snprintf(b, sizeof b, "%d%s%d", cell[t]->stage, sched_op_names[cell[t]->op], cell[t]->mb);
                fprintf(out, " %-*s", t < T - 1 ? cw : 1, b);
            }
        }
        fputc('\n', out);
    }
    free(cell);
    if (V == 1) {
        fprintf(out, "schedule %s: P=%d stages, M=%d micro-batches, makespan %d units (F=%d, B=%d, I=%d, W=%d, comm=0)\n",
                s->name, s->P, s->M, T, SCHED_COST_F, SCHED_COST_B, SCHED_COST_I, SCHED_COST_W);
        fprintf(out, "bubble: %.2f%% (GPipe formula (P-1)/(M+P-1) = %.2f%%)\n",
                100.0 * sim.bubble, 100.0 * (double)(s->P - 1) / (double)(s->M + s->P - 1));
        fprintf(out, "max in-flight micro-batches per stage:");
        for (int r = 0; r < s->P; r++) fprintf(out, " %d", sched_max_inflight(s, r));
        fputc('\n', out);
    } else {
        if (s->place == SCHED_PLACE_V)
            fprintf(out, "schedule %s: P=%d ranks x V=%d chunks = %d stages (V-shaped: stages r and %d-r on rank r), "
                    "M=%d micro-batches, makespan %d units (F=%d, B=%d, I=%d, W=%d per stage, comm=0)\n", s->name, s->P,
                    V, S, 2 * s->P - 1, s->M, T, SCHED_COST_F, SCHED_COST_B, SCHED_COST_I, SCHED_COST_W);
        else
            fprintf(out, "schedule %s: P=%d ranks x V=%d chunks = %d stages (stage s on rank s mod %d), M=%d "
                    "micro-batches, makespan %d units (F=%d, B=%d, I=%d, W=%d per stage, comm=0)\n", s->name, s->P,
                    V, S, s->P, s->M, T, SCHED_COST_F, SCHED_COST_B, SCHED_COST_I, SCHED_COST_W);
        fprintf(out, "bubble: %.2f%% (GPipe formula over the ranks (P-1)/(M+P-1) = %.2f%%)\n",
                100.0 * sim.bubble, 100.0 * (double)(s->P - 1) / (double)(s->M + s->P - 1));
        print_chunk_summary(s, &sim, out);
    }
    sched_sim_free(&sim);
}
