/*
 * generate.c — `pipelm generate` (generate.h): the options and prompts, the pipelined decode
 * loop every rank runs, sampling on the last stage, and the report.
 *
 * A message between stages is one float buffer: a header (kind, item number, segments, stop
 * flag, then per segment its sequence, first position, rows and whether it is sampled; all
 * small integers, exact in float) followed by the item's activations. The last stage answers
 * rank 0 with an int message: stop flag, count, then (sequence, token) pairs. Every rank
 * processes the items in the order rank 0 issues them, so the loop needs no other agreement.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "parallel/comm.h"
#include "pipeline/sched.h"
#include "util/common.h"
#include "run/eval.h"
#include "util/files.h"
#include "run/generate.h"
#include "model/kvcache.h"
#include "run/metrics.h"
#include "util/rng.h"
#include "run/run.h"
#include "util/signals.h"
#include "formats/tokenizer.h"

enum { K_WORK = 1, K_END = 2 };      /* header kinds */
enum { H_KIND, H_ITEM, H_NSEG, H_STOP, H_LEN }; /* header fields, then 4 per segment */
enum { TAG_TOK = 7, TAG_ACT = 8 };   /* + stage for activations */
#define GEN_NBUF 8                   /* send buffers in flight per rank */

/* One rank's state during generation. */
typedef struct {
    run *R;
    const gen_opts *g;
    int P, V, S, rank, G, gmax, rows, hdr, last_rank;
    kv_stage *kv;                    /* V: one per chunk */
    float *rbuf, *sbuf[GEN_NBUF];    /* message buffers (host) */
    int *tbuf[GEN_NBUF + 1];         /* [0]: rank 0's receive; then the last stage's answers */
    MPI_Request sreq[GEN_NBUF], treq[GEN_NBUF];
    int snext, tnext;
    float *logits;                   /* (gmax, Vp) host */
    int *tokrows;                    /* (rows) the item's tokens */
    kv_seg *seg;
    /* rank 0: the sequences */
    int **tok, *ntok, *fed, *waiting, *done, *ngen, rr, pending, stop;
    long *pend;                      /* (nprompts + 1) ring: items whose answer is awaited, oldest first */
    int pend_head, lag;              /* lag: a rank runs chunk c of item k - c lag in its round k */
    unsigned char *cdone;            /* V: the chunk has passed the end item */
    double *t_first;                 /* per sequence: seconds to its first token */
    long items;
    double t0, busy, busy_cpu, t_end; /* busy, busy_cpu: wall and thread CPU seconds in the stage's compute */
    FILE *lf;                        /* --logits-out (last stage) */
    const tokenizer *tk;
} gen_state;

/* This thread's CPU seconds: the compute time that other processes on the core do not inflate. */
static double gen_cpu_now(void) {
    struct timespec ts;
    return clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0 ? ts.tv_sec + 1e-9 * ts.tv_nsec : 0.0;
}

/* The rank that owns global stage s: the schedule's placement (the loop: rank s mod P; the V:
 * rank 0 holds the first and the last stage). */
static int gen_owner(const gen_state *gs, int s) { return sched_place_rank(gs->R->sc.place, gs->P, s); }

/* A logit and its id, for sorting. */
typedef struct {
    float l;
    int i;
} gen_cand;

/* Descending logit, then ascending id: a total order, so the cut is the same everywhere. */
static int gen_cand_cmp(const void *a, const void *b) {
    const gen_cand *x = a, *y = b;
    if (x->l != y->l) return x->l > y->l ? -1 : 1;
    return x->i - y->i;
}

/* Sift c[i] down the heap c[0..n) whose root is the last in gen_cand_cmp's order. */
static void gen_heap_down(gen_cand *c, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, m = i;
        if (l < n && gen_cand_cmp(&c[l], &c[m]) > 0) m = l;
        if (l + 1 < n && gen_cand_cmp(&c[l + 1], &c[m]) > 0) m = l + 1;
        if (m == i) return;
        gen_cand t = c[i];
        c[i] = c[m];
        c[m] = t;
        i = m;
    }
}

/* c[0..k) = the k first candidates of the row in gen_cand_cmp's order, sorted: with k < V a
 * heap of k, not a sort of the whole vocabulary per token (the order is total, so it is the
 * same prefix as the full sort's). */
static void gen_top(const float *lg, int V, int k, gen_cand *c) {
    for (int i = 0; i < k; i++) c[i] = (gen_cand){lg[i], i};
    if (k < V) {
        for (int i = k / 2 - 1; i >= 0; i--) gen_heap_down(c, k, i);
        for (int i = k; i < V; i++) {
            gen_cand x = {lg[i], i};
            if (gen_cand_cmp(&x, &c[0]) >= 0) continue;
            c[0] = x;
            gen_heap_down(c, k, 0);
        }
    }
    qsort(c, (size_t)k, sizeof *c, gen_cand_cmp);
}

/* Sample a token from one row of logits: argmax at temperature 0 (the lowest id among equal
 * maxima), else softmax(logits / T) over the top-k, cut to the smallest prefix whose
 * probability reaches top-p, drawn from the stream of (seed, sequence, position). */
static int gen_sample(const gen_opts *g, const float *lg, int V, unsigned long long seed, int seq, int pos,
                      gen_cand *c) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (lg[i] > lg[best]) best = i;
    if (g->temperature <= 0) return best;
    int k = g->top_k > 0 && g->top_k < V ? g->top_k : V;
    gen_top(lg, V, k, c);
    double z = 0, acc = 0;
    for (int i = 0; i < k; i++) z += exp(((double)c[i].l - c[0].l) / g->temperature);
    int n = k;
    for (int i = 0; i < k && g->top_p < 1.0; i++) {
        acc += exp(((double)c[i].l - c[0].l) / g->temperature) / z;
        if (acc >= g->top_p) { n = i + 1; break; }
    }
    double zn = 0;
    for (int i = 0; i < n; i++) zn += exp(((double)c[i].l - c[0].l) / g->temperature);
    rng_state r;
    rng_seed(&r, seed, ((unsigned long long)seq << 32) | (unsigned)pos);
    double u = rng_uniform_d(&r) * zn, run_sum = 0;
    for (int i = 0; i < n; i++) {
        run_sum += exp(((double)c[i].l - c[0].l) / g->temperature);
        if (u < run_sum) return c[i].i;
    }
    return c[n - 1].i;
}

/* Rank 0: a new token of sequence q; the sequence ends at the end-of-text id, after
 * --max-new-tokens, or at max_seq_len. */
static void gen_apply(gen_state *gs, int q, int t) {
    gs->tok[q][gs->ntok[q]++] = t;
    gs->waiting[q] = 0;
    if (gs->ngen[q]++ == 0) gs->t_first[q] = pl_now() - gs->t0;
    if (t == gs->g->eot || gs->ngen[q] >= gs->g->max_new || gs->ntok[q] >= gs->R->cfg.maxT) gs->done[q] = 1;
}

/* Rank 0: one answer of the last stage (blocking): its tokens applied, its stop flag kept. */
static int gen_recv_tokens(gen_state *gs) {
    MPI_Request rq;
    comm_what w = {"the new tokens of the last stage", gs->last_rank, -1, -1};
    int *b = gs->tbuf[0];
    PL_MPI_CHECK(MPI_Irecv(b, 2 + 2 * gs->gmax, MPI_INT, gs->last_rank, TAG_TOK, gs->R->comm, &rq));
    PL_TRY(comm_wait(&rq, &w));
    if (b[0]) gs->stop = b[0];
    for (int i = 0; i < b[1]; i++) gen_apply(gs, b[2 + 2 * i], b[3 + 2 * i]);
    gs->pending--;
    gs->pend_head = (gs->pend_head + 1) % (gs->g->nprompts + 1);
    return PL_OK;
}

/* Rank 0: every answer that has arrived already (without waiting), so the last stage's sends
 * never wait on rank 0 however many are in flight. */
static int gen_drain_tokens(gen_state *gs) {
    while (gs->pending > 0) {
        int flag = 0;
        PL_MPI_CHECK(MPI_Iprobe(gs->last_rank, TAG_TOK, gs->R->comm, &flag, MPI_STATUS_IGNORE));
        if (!flag) return PL_OK;
        PL_TRY(gen_recv_tokens(gs));
    }
    return PL_OK;
}

/* Rank 0: the segments of group grp's next step (every sequence that can go on), into the
 * header and the token rows; 0 segments when none can. */
static int gen_group_item(gen_state *gs, int grp, float *h) {
    const gen_opts *g = gs->g;
    int nseg = 0, row = 0;
    for (int q = grp; q < g->nprompts; q += gs->G) {
        if (gs->done[q] || gs->waiting[q] || gs->fed[q] >= gs->ntok[q]) continue;
        int pos = g->kv_cache ? gs->fed[q] : 0, left = gs->ntok[q] - pos;
        int n = g->kv_cache && left > g->chunk ? g->chunk : left, smp = pos + n == gs->ntok[q];
        float *sh = h + H_LEN + 4 * nseg++;
        sh[0] = (float)q; sh[1] = (float)pos; sh[2] = (float)n; sh[3] = (float)smp;
        memcpy(gs->tokrows + row, gs->tok[q] + pos, sizeof(int) * n);
        row += n;
        gs->fed[q] = pos + n;
        gs->waiting[q] = smp;
    }
    h[H_NSEG] = (float)nseg;
    return nseg;
}

/* Rank 0: the next item in round-robin group order; when every group's sequences wait for
 * their tokens, it waits for the oldest answer if the last stage answers it in an earlier
 * round (chunks run lag items apart: waiting for a later round would deadlock), else it
 * sends an empty item through (always when rank 0 holds the last stage, as under a V: its
 * answer comes from this rank's own later chunk); an end item when every sequence is done or a stop was asked
 * for. */
static int gen_next_item(gen_state *gs, float *h) {
    int nprompts = gs->g->nprompts;
    h[H_KIND] = K_END;
    h[H_NSEG] = 0;
    h[H_ITEM] = (float)gs->items;
    for (;;) {
        PL_TRY(gen_drain_tokens(gs));
        if (signals_stop_pending()) gs->stop = signals_stop_pending();
        if (gs->stop) return PL_OK;
        int all_done = 1, any_wait = 0;
        for (int q = 0; q < nprompts; q++) {
            all_done &= gs->done[q];
            any_wait |= gs->waiting[q];
        }
        if (all_done) return PL_OK;
        for (int k = 0; k < gs->G; k++) {
            int grp = (gs->rr + k) % gs->G;
            if (gen_group_item(gs, grp, h) > 0) {
                gs->rr = (grp + 1) % gs->G;
                h[H_KIND] = K_WORK;
                gs->items++;
                return PL_OK;
            }
        }
        if (!any_wait) return PL_OK; /* nothing can go on (not reached) */
        if (gs->last_rank == 0 || gs->pend[gs->pend_head] + (long)(gs->V - 1) * gs->lag >= gs->items) {
            h[H_KIND] = K_WORK; /* answered in this round or later: an empty item keeps the rounds going */
            gs->items++;
            return PL_OK;
        }
        PL_TRY(gen_recv_tokens(gs));
    }
}

/* The item's segments from a header (rows laid out in segment order). */
static int gen_segs(gen_state *gs, const float *h) {
    int nseg = (int)h[H_NSEG], row = 0;
    for (int i = 0; i < nseg; i++) {
        const float *sh = h + H_LEN + 4 * i;
        gs->seg[i] = (kv_seg){(int)sh[0], row, (int)sh[2], (int)sh[1], (int)sh[3], NULL, NULL};
        row += gs->seg[i].n;
    }
    return row;
}

/* A free send buffer (its last send complete). */
static int gen_sbuf(gen_state *gs, float **buf, MPI_Request **rq) {
    int i = gs->snext;
    gs->snext = (i + 1) % GEN_NBUF;
    comm_what w = {"a send to the next stage", -1, -1, -1};
    PL_TRY(comm_wait(&gs->sreq[i], &w));
    *buf = gs->sbuf[i];
    *rq = &gs->sreq[i];
    return PL_OK;
}

/* The last stage: sample every sampled segment, write --logits-out, answer rank 0. */
static int gen_answer(gen_state *gs, const float *h) {
    const model_config *c = &gs->R->cfg;
    int nseg = (int)h[H_NSEG], ns = 0, i = gs->tnext, *b = gs->tbuf[1 + i];
    gen_cand *cand = (gen_cand *)(gs->logits + (size_t)gs->gmax * c->Vp);
    if (gs->last_rank != 0) {
        comm_what w = {"a send of new tokens to rank 0", 0, -1, -1};
        PL_TRY(comm_wait(&gs->treq[i], &w));
    }
    for (int k = 0; k < nseg; k++) {
        const kv_seg *s = &gs->seg[k];
        if (!s->sample) continue;
        const float *lg = gs->logits + (size_t)ns * c->Vp;
        int t = gen_sample(gs->g, lg, c->V, (unsigned long long)gs->R->o->seed, s->seq, s->pos + s->n, cand);
        if (gs->lf) {
            fprintf(gs->lf, "%d,%d,%d", s->seq, s->pos + s->n, t);
            for (int v = 0; v < c->V; v++) fprintf(gs->lf, ",%.9g", lg[v]);
            fputc('\n', gs->lf);
        }
        b[2 + 2 * ns] = s->seq;
        b[3 + 2 * ns] = t;
        ns++;
    }
    if (!ns) return PL_OK;
    if (gs->last_rank == 0) {
        for (int k = 0; k < ns; k++) gen_apply(gs, b[2 + 2 * k], b[3 + 2 * k]);
        return PL_OK;
    }
    b[0] = (int)h[H_STOP] | signals_stop_pending();
    b[1] = ns;
    gs->tnext = (i + 1) % GEN_NBUF;
    PL_MPI_CHECK(MPI_Isend(b, 2 + 2 * ns, MPI_INT, 0, TAG_TOK, gs->R->comm, &gs->treq[i]));
    return PL_OK;
}

/* Chunk c's input: the next item from rank 0's driver (stage 0), else the previous stage's message. */
static int gen_input(gen_state *gs, int s, float *h) {
    if (s == 0) {
        PL_TRY(gen_next_item(gs, h));
        h[H_STOP] = (float)gs->stop;
        return PL_OK;
    }
    MPI_Request rq;
    comm_what w = {"the previous stage's activations", gen_owner(gs, s - 1), -1, -1};
    PL_MPI_CHECK(MPI_Irecv(h, gs->hdr + gs->rows * gs->R->cfg.C, MPI_FLOAT, gen_owner(gs, s - 1), TAG_ACT + s,
                           gs->R->comm, &rq));
    return comm_wait(&rq, &w);
}

/* Chunk c's part of one item: its input, the stage's blocks, then on to the next stage (or,
 * on the last, the sampling). *end: it was the end item. */
static int gen_step(gen_state *gs, int c, int *end) {
    int s = sched_place_stage(gs->R->sc.place, gs->P, gs->rank, c), C = gs->R->cfg.C;
    float *h = gs->rbuf, *out = NULL;
    MPI_Request *rq = NULL;
    PL_TRY(gen_input(gs, s, h));
    *end = h[H_KIND] == K_END;
    int rows = *end ? 0 : gen_segs(gs, h), nseg = *end ? 0 : (int)h[H_NSEG], smp = 0;
    for (int i = 0; i < nseg; i++) smp |= gs->seg[i].sample;
    if (s == 0 && smp && gs->last_rank != 0)
        gs->pend[(gs->pend_head + gs->pending++) % (gs->g->nprompts + 1)] = gs->items - 1;
    if (s < gs->S - 1) {
        PL_TRY(gen_sbuf(gs, &out, &rq));
        memcpy(out, h, sizeof(float) * gs->hdr);
        out[H_STOP] = (float)((int)h[H_STOP] | signals_stop_pending());
    }
    if (!*end && nseg > 0) {
        double t = pl_now(), tc = gen_cpu_now();
        int rc = kv_stage_forward(&gs->kv[c], gs->seg, nseg, gs->tokrows, h + gs->hdr, out ? out + gs->hdr : NULL,
                                  gs->logits);
        gs->busy += pl_now() - t;
        gs->busy_cpu += gen_cpu_now() - tc;
        if (rc != PL_OK) {
            pl_error("backend %s: generating (stage %d): %s", gs->R->be->name, s,
                     rc == PL_EINVAL ? "an item larger than the buffers" : gs->R->be->error());
            return PL_EBACKEND;
        }
    }
    if (s == gs->S - 1) return *end || !nseg ? PL_OK : gen_answer(gs, h);
    PL_MPI_CHECK(MPI_Isend(out, gs->hdr + rows * C, MPI_FLOAT, gen_owner(gs, s + 1), TAG_ACT + s + 1, gs->R->comm,
                           rq));
    return PL_OK;
}

/* Every rank, in rounds: chunk c runs item k - c lag in round k (so with chunks a rank works
 * on a later item's first chunk while an earlier one goes round the other ranks), until the
 * end item has passed all of its chunks; rank 0 then takes the answers still in flight
 * (after a stop), and every send completes. */
static int gen_loop(gen_state *gs) {
    gs->t0 = pl_now();
    int ended = 0;
    for (long k = 0; ended < gs->V; k++)
        for (int c = 0; c < gs->V; c++) {
            int end = 0;
            if (gs->cdone[c] || k - (long)c * gs->lag < 0) continue;
            PL_TRY(gen_step(gs, c, &end));
            if (end) { gs->cdone[c] = 1; ended++; }
        }
    while (gs->rank == 0 && gs->pending > 0) PL_TRY(gen_recv_tokens(gs));
    comm_what w = {"the last sends of generation", -1, -1, -1};
    PL_TRY(comm_waitall(GEN_NBUF, gs->sreq, &w));
    PL_TRY(comm_waitall(GEN_NBUF, gs->treq, &w));
    gs->t_end = pl_now();
    return PL_OK;
}

/* The refusals every rank makes alike before any work: the layout, the prompts against the
 * model. */
static int gen_check(const run *R, const gen_opts *g, char *err, size_t errlen) {
    if (R->D > 1) {
        snprintf(err, errlen, "generate runs one pipeline: --dp %d is not supported (use --dp 1)", R->D);
        return PL_EINVAL;
    }
    for (int i = 0; i < g->nprompts; i++) {
        if (g->plen[i] > R->cfg.maxT) {
            snprintf(err, errlen, "prompt %d has %d tokens, more than the model's max_seq_len %d", i, g->plen[i],
                     R->cfg.maxT);
            return PL_EINVAL;
        }
        for (int j = 0; j < g->plen[i]; j++)
            if (g->prompt[i][j] >= R->cfg.V) {
                snprintf(err, errlen, "prompt %d: token %d (position %d) is not below the vocabulary size %d", i,
                         g->prompt[i][j], j, R->cfg.V);
                return PL_EINVAL;
            }
    }
    if (g->eot >= R->cfg.V) {
        snprintf(err, errlen, "--eot-token %d is not below the vocabulary size %d", g->eot, R->cfg.V);
        return PL_EINVAL;
    }
    return PL_OK;
}

/* Sizes and buffers of the loop (every rank), the sequences (rank 0), --logits-out (last stage). */
static int gen_alloc(gen_state *gs, char *err, size_t errlen) {
    const gen_opts *g = gs->g;
    const model_config *c = &gs->R->cfg;
    int n = g->nprompts, chunk = g->chunk < c->maxT ? g->chunk : c->maxT;
    gs->G = g->groups > 0 && g->groups < n ? g->groups : g->groups > 0 ? n : (n < gs->S ? n : gs->S);
    gs->gmax = (n + gs->G - 1) / gs->G;
    gs->rows = gs->gmax * (g->kv_cache ? chunk : c->maxT);
    gs->hdr = H_LEN + 4 * gs->gmax;
    gs->lag = gs->V > 1 ? (gs->P + gs->V - 1) / gs->V : 0;
    gs->kv = calloc((size_t)gs->V, sizeof(kv_stage));
    gs->cdone = calloc((size_t)gs->V, 1);
    gs->pend = calloc((size_t)n + 1, sizeof(long));
    if (!gs->kv || !gs->cdone || !gs->pend) return PL_ENOMEM;
    for (int k = 0; k < gs->V; k++) PL_TRY(kv_stage_init(&gs->kv[k], &gs->R->stv[k], n, gs->rows, gs->gmax, err, errlen));
    size_t msg = sizeof(float) * ((size_t)gs->hdr + (size_t)gs->rows * c->C);
    gs->rbuf = malloc(msg);
    for (int i = 0; i < GEN_NBUF; i++) {
        gs->sbuf[i] = malloc(msg);
        gs->sreq[i] = gs->treq[i] = MPI_REQUEST_NULL;
        if (!gs->sbuf[i]) return PL_ENOMEM;
    }
    for (int i = 0; i <= GEN_NBUF; i++)
        if (!(gs->tbuf[i] = malloc(sizeof(int) * (2 + 2 * (size_t)gs->gmax)))) return PL_ENOMEM;
    gs->logits = malloc(sizeof(float) * (size_t)gs->gmax * c->Vp + sizeof(gen_cand) * c->Vp);
    gs->tokrows = malloc(sizeof(int) * gs->rows);
    gs->seg = malloc(sizeof(kv_seg) * gs->gmax);
    if (!gs->rbuf || !gs->logits || !gs->tokrows || !gs->seg) return PL_ENOMEM;
    gs->tok = calloc((size_t)n, sizeof(int *));
    int *ar = calloc((size_t)n * 5, sizeof(int));
    gs->t_first = calloc((size_t)n, sizeof(double));
    if (!gs->tok || !ar || !gs->t_first) return PL_ENOMEM;
    gs->ntok = ar; gs->fed = ar + n; gs->waiting = ar + 2 * n; gs->done = ar + 3 * n; gs->ngen = ar + 4 * n;
    for (int q = 0; q < n; q++) {
        if (!(gs->tok[q] = malloc(sizeof(int) * ((size_t)c->maxT + 1)))) return PL_ENOMEM;
        memcpy(gs->tok[q], g->prompt[q], sizeof(int) * g->plen[q]);
        gs->ntok[q] = g->plen[q];
        gs->done[q] = g->max_new < 1;
    }
    return PL_OK;
}

/* Everything gen_alloc allocated. */
static void gen_free(gen_state *gs) {
    for (int k = 0; gs->kv && k < gs->V; k++) kv_stage_free(&gs->kv[k]);
    free(gs->kv);
    free(gs->rbuf);
    for (int i = 0; i < GEN_NBUF; i++) free(gs->sbuf[i]);
    for (int i = 0; i <= GEN_NBUF; i++) free(gs->tbuf[i]);
    free(gs->logits); free(gs->tokrows); free(gs->seg);
    for (int q = 0; gs->tok && q < gs->g->nprompts; q++) free(gs->tok[q]);
    free(gs->tok); free(gs->ntok); free(gs->t_first); free(gs->cdone); free(gs->pend);
    if (gs->lf) fclose(gs->lf);
}

/* Rank 0: the generated ids of every prompt, one line each, comma-separated (--tokens-out). */
static int gen_write_tokens(const gen_state *gs, const char *path) {
    FILE *f;
    char err[PL_PATH + 256];
    if (pl_open_output(path, "--tokens-out", &f, err, sizeof err) != PL_OK) {
        pl_error("%s", err);
        return PL_EIO;
    }
    for (int q = 0; q < gs->g->nprompts; q++) {
        for (int j = gs->g->plen[q]; j < gs->ntok[q]; j++) fprintf(f, "%s%d", j > gs->g->plen[q] ? "," : "", gs->tok[q][j]);
        fputc('\n', f);
    }
    if (pl_close_output(f, path, "--tokens-out", err, sizeof err) != PL_OK) {
        pl_error("%s", err);
        return PL_EIO;
    }
    return PL_OK;
}

/* Rank 0: each prompt and its continuation, as text with a tokenizer, else as ids. */
static void gen_print(const gen_state *gs) {
    for (int q = 0; q < gs->g->nprompts; q++) {
        fprintf(pl_out, "[%d] ", q);
        for (int j = 0; j < gs->ntok[q]; j++) {
            if (j == gs->g->plen[q]) fputs(gs->tk ? "\033[1m" : " |", pl_out);
            if (gs->tk) tokenizer_write(gs->tk, gs->tok[q][j], pl_out);
            else fprintf(pl_out, "%s%d", j && j != gs->g->plen[q] ? "," : " ", gs->tok[q][j]);
        }
        fputs(gs->tk ? "\033[0m\n" : "\n", pl_out);
    }
}

/* The figures: time to first token, decode tokens/s, the bubble of every rank (1 - compute
 * time / wall time of the loop) and its compute's CPU time; printed by rank 0, --json in the
 * benchmark. */
static int gen_report(gen_state *gs) {
    double mine[3] = {gs->busy, gs->t_end - gs->t0, gs->busy_cpu}, *all = malloc(sizeof(double) * 3 * gs->P);
    if (!all) return PL_ENOMEM;
    int rc = comm_gather(mine, 3, MPI_DOUBLE, all, 0, gs->R->comm, "the generation timers");
    if (rc != PL_OK || gs->rank != 0) { free(all); return rc; }
    long total = 0, dec = 0;
    double ttft = 0, wall = all[1], bub = 0, bmax = 0;
    for (int q = 0; q < gs->g->nprompts; q++) {
        total += gs->ngen[q];
        dec += gs->ngen[q] > 1 ? gs->ngen[q] - 1 : 0;
        ttft += gs->t_first[q] / gs->g->nprompts;
    }
    for (int r = 0; r < gs->P; r++) {
        double b = all[3 * r + 1] > 0 ? 1.0 - all[3 * r] / all[3 * r + 1] : 0;
        bub += b / gs->P;
        if (b > bmax) bmax = b;
    }
    double dec_s = wall - ttft > 0 ? dec / (wall - ttft) : 0;
    pl_info("generate | %d prompts in %d groups on %d stages | %ld new tokens in %.3f s (%.1f tok/s) | first token "
            "%.1f ms (mean) | decode %.1f tok/s | bubble %.1f%% (mean over ranks, max %.1f%%)\n", gs->g->nprompts,
            gs->G, gs->S, total, wall, total / (wall > 0 ? wall : 1e-9), ttft * 1e3, dec_s, bub * 100, bmax * 100);
    metrics_line(&gs->R->mx, "{\"event\":\"generate\",\"prompts\":%d,\"groups\":%d,\"ranks\":%d,\"new_tokens\":%ld,"
                 "\"wall_s\":%.6f,\"ttft_ms\":%.3f,\"decode_tok_s\":%.3f,\"bubble\":%.4f}", gs->g->nprompts, gs->G,
                 gs->P, total, wall, ttft * 1e3, dec_s, bub);
    if (gs->g->bench_json[0]) {
        FILE *f;
        char err[PL_PATH + 256];
        rc = pl_open_output(gs->g->bench_json, "--json", &f, err, sizeof err);
        if (rc == PL_OK) {
            fprintf(f, "{\"ranks\":%d,\"stages\":%d,\"prompts\":%d,\"groups\":%d,\"kv_cache\":%d,\"new_tokens\":%ld,"
                    "\"wall_s\":%.6f,\"ttft_ms\":%.3f,\"decode_tok_s\":%.3f,\"tok_s\":%.3f,\"bubble\":%.4f,"
                    "\"bubble_ranks\":[", gs->P, gs->S, gs->g->nprompts, gs->G, gs->g->kv_cache, total, wall, ttft * 1e3,
                    dec_s, total / (wall > 0 ? wall : 1e-9), bub);
            for (int r = 0; r < gs->P; r++)
                fprintf(f, "%s%.4f", r ? "," : "", all[3 * r + 1] > 0 ? 1.0 - all[3 * r] / all[3 * r + 1] : 0);
            fputs("],\"cpu_s_ranks\":[", f);
            for (int r = 0; r < gs->P; r++) fprintf(f, "%s%.6f", r ? "," : "", all[3 * r + 2]);
            fputs("]}\n", f);
            rc = pl_close_output(f, gs->g->bench_json, "--json", err, sizeof err);
        }
        if (rc != PL_OK) pl_error("%s", err);
    }
    free(all);
    return rc;
}

/* Before any work, on every rank: the checks, the tokenizer, the outputs, the buffers. */
static int gen_prepare(gen_state *gs, tokenizer *tk, char *err, size_t errlen) {
    const gen_opts *g = gs->g;
    run *R = gs->R;
    PL_TRY(gen_check(R, g, err, errlen));
    if (g->tokenizer[0]) { /* read once by rank 0, parsed alike everywhere */
        char *text = NULL;
        size_t len = 0;
        PL_TRY(comm_read_bcast(g->tokenizer, "--tokenizer", 1 << 26, R->world, &text, &len, err, errlen));
        FILE *f = fmemopen(text, len ? len : 1, "rb");
        int rc = f ? tokenizer_read(tk, g->tokenizer, f, R->cfg.V, err, errlen) : PL_ENOMEM;
        if (f) fclose(f);
        free(text);
        PL_TRY(rc);
        gs->tk = tk;
    }
    if (gs->rank == 0 && g->tokens_out[0]) PL_TRY(pl_check_output_file(g->tokens_out, "--tokens-out", err, errlen));
    if (gs->rank == 0 && g->bench_json[0]) PL_TRY(pl_check_output_file(g->bench_json, "--json", err, errlen));
    if (gs->rank == gs->last_rank && g->logits_out[0]) {
        PL_TRY(pl_open_output(g->logits_out, "--logits-out", &gs->lf, err, errlen)); /* never a FIFO or device */
    }
    int rc = gen_alloc(gs, err, errlen);
    if (rc == PL_ENOMEM) snprintf(err, errlen, "out of memory for the generation buffers");
    return rc;
}

/* Collective: `pipelm generate` after run_setup; *agreed as train_run's. */
static int generate_after_setup(run *R, int *agreed) {
    gen_opts g = *R->o->gen;
    gen_state gs;
    tokenizer tk;
    memset(&gs, 0, sizeof gs);
    memset(&tk, 0, sizeof tk);
    gs.R = R;
    gs.g = &g;
    gs.P = R->P; gs.V = R->V; gs.S = R->S; gs.rank = R->rank;
    gs.last_rank = sched_place_rank(R->sc.place, R->P, R->S - 1);
    char err[PL_PATH + 512] = "";
    int rc = R->o->resume[0] ? eval_load_resume(R) : PL_OK;
    if (rc != PL_OK) return rc; /* agreed: the load is collective */
    rc = gen_prepare(&gs, &tk, err, sizeof err);
    if (g.eot < 0) g.eot = gs.tk ? gs.tk->eot : -1;
    if (rc != PL_OK && err[0] && (gs.rank == 0 || !strstr(err, "prompt"))) pl_error("%s", err);
    if ((rc = comm_agree(R->world, rc, NULL)) == PL_OK) {
        rc = gen_loop(&gs);
        if (rc != PL_OK) *agreed = 0;
    }
    if (rc == PL_OK && gs.rank == 0 && !g.bench) gen_print(&gs);
    if (rc == PL_OK && gs.rank == 0 && g.tokens_out[0]) rc = gen_write_tokens(&gs, g.tokens_out);
    if (gs.lf) { /* a write that failed (a full disk) is reported, not lost in fclose */
        FILE *f = gs.lf;
        gs.lf = NULL;
        if (pl_close_output(f, g.logits_out, "--logits-out", err, sizeof err) != PL_OK && rc == PL_OK) {
            pl_error("%s", err);
            rc = PL_EIO;
        }
    }
    if (*agreed) rc = comm_agree(R->world, rc, NULL);
    if (rc == PL_OK) rc = gen_report(&gs);
    if (*agreed) rc = comm_agree(R->world, rc, NULL);
    int stopped = gs.stop || (gs.rbuf && (int)gs.rbuf[H_STOP]);
    if (rc == PL_OK && stopped) {
        pl_info("stopped by a signal: the tokens generated so far are above\n");
        rc = PL_EPREEMPT;
    }
    gen_free(&gs);
    tokenizer_free(&tk);
    return rc;
}

/* Append the prompt t[0..n) (malloc'ed, taken) to g's list. */
static int gen_add_ids(gen_opts *g, int *t, int n, const char *where, char *err, size_t errlen) {
    int **np = t ? realloc(g->prompt, sizeof(int *) * (g->nprompts + 1)) : NULL;
    int *nl = np ? realloc(g->plen, sizeof(int) * (g->nprompts + 1)) : NULL;
    if (np) g->prompt = np;
    if (!np || !nl) { free(t); return PL_ENOMEM; }
    g->plen = nl;
    if (n == 0) {
        snprintf(err, errlen, "%s: an empty prompt", where);
        free(t);
        return PL_EINVAL;
    }
    g->prompt[g->nprompts] = t;
    g->plen[g->nprompts++] = n;
    return PL_OK;
}

/* One prompt from text: token ids separated by commas or spaces, appended to g's list. */
static int gen_add_prompt(gen_opts *g, const char *text, const char *where, char *err, size_t errlen) {
    int cap = 16, n = 0, *t = malloc(sizeof(int) * cap);
    const char *p = text;
    while (t) {
        int commas = 0;
        for (; *p == ',' || *p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'; p++) commas += *p == ',';
        if (commas > (n > 0 && *p) || (commas && !*p)) { /* "1,,2", ",1" or "1,": an empty id */
            snprintf(err, errlen, "%s: an empty token id between commas in '%.60s'", where, text);
            free(t);
            return PL_EINVAL;
        }
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT_MAX || (*end && !strchr(", \t\r\n", *end))) {
            snprintf(err, errlen, "%s: '%.40s' is not a token id (a non-negative integer)", where, p);
            free(t);
            return PL_EINVAL;
        }
        if (n == cap) {
            int *nt = realloc(t, sizeof(int) * (cap *= 2));
            if (!nt) { free(t); t = NULL; break; }
            t = nt;
        }
        t[n++] = (int)v;
        p = end;
    }
    return gen_add_ids(g, t, n, where, err, errlen);
}

/* Every line of a prompt file is one prompt (a blank line is refused by its number): rank 0
 * reads the file and every rank parses the same bytes (comm_read_bcast; a FIFO is refused). */
static int gen_read_prompts(gen_opts *g, const char *path, MPI_Comm comm, char *err, size_t errlen) {
    char *text = NULL, where[PL_PATH + 64];
    size_t len = 0;
    PL_TRY(comm_read_bcast(path, "--prompt-file", 1 << 24, comm, &text, &len, err, errlen));
    int rc = PL_OK, ln = 1;
    for (char *p = text; rc == PL_OK && p < text + len; ln++) {
        char *nl = memchr(p, '\n', (size_t)(text + len - p));
        if (nl) *nl = 0;
        snprintf(where, sizeof where, "--prompt-file %s line %d", path, ln);
        if (strspn(p, " \t\r") == strlen(p)) {
            snprintf(err, errlen, "%s: a blank line (one prompt per line: remove it)", where);
            rc = PL_EINVAL;
        } else rc = gen_add_prompt(g, p, where, err, errlen);
        p = nl ? nl + 1 : text + len;
    }
    free(text);
    return rc;
}

/* One text prompt encoded with b (special-token text allowed), appended to g's list. */
static int gen_add_text(gen_opts *g, bpe *b, const char *text, size_t len, const char *where, char *err,
                        size_t errlen) {
    bpe_ids ids = {0};
    int rc = bpe_encode(b, text, len, 1, &ids);
    if (rc != PL_OK) {
        bpe_ids_free(&ids);
        snprintf(err, errlen, "%s: out of memory", where);
        return rc;
    }
    return gen_add_ids(g, ids.v, (int)ids.n, where, err, errlen);
}

/* --prompt TEXT (repeatable, first) and, with --prompt-format text, --prompt-file's non-blank
 * lines: encoded with the BPE --tokenizer (tokenizer.json or tiktoken ranks). A text file taken
 * here is cleared from so[1] (the id prompts' reader). */
static int gen_text_prompts(gen_opts *g, int argc, char **argv, sub_opt *so, const char *fmt, char *err,
                            size_t errlen) {
    int text_file = fmt && strcmp(fmt, "text") == 0, any = text_file && so[1].val, rc = PL_OK;
    if (fmt && !text_file && strcmp(fmt, "ids") != 0) {
        snprintf(err, errlen, "--prompt-format '%.40s' is not text or ids", fmt);
        return PL_EINVAL;
    }
    for (int i = 2; i < argc; i++) any |= strcmp(argv[i], "--prompt") == 0 || strncmp(argv[i], "--prompt=", 9) == 0;
    if (!any) return PL_OK;
    bpe *b = NULL;
    if (!so[12].val) snprintf(err, errlen, "--prompt TEXT needs --tokenizer FILE (a tokenizer.json or tiktoken file)");
    PL_TRY(so[12].val ? bpe_load(&b, so[12].val, NULL, err, errlen) : PL_EINVAL);
    for (int i = 2; rc == PL_OK && i < argc; i++)
        if (strcmp(argv[i], "--prompt") == 0 && i + 1 < argc)
            rc = gen_add_text(g, b, argv[i + 1], strlen(argv[i + 1]), "--prompt", err, errlen), i++;
        else if (strncmp(argv[i], "--prompt=", 9) == 0)
            rc = gen_add_text(g, b, argv[i] + 9, strlen(argv[i] + 9), "--prompt", err, errlen);
    FILE *f = NULL;
    if (rc == PL_OK && text_file) rc = pl_open_input(so[1].val, "--prompt-file", 0, &f, err, errlen);
    char line[1 << 16], where[PL_PATH + 64];
    for (int ln = 1; rc == PL_OK && f && fgets(line, sizeof line, f); ln++) {
        size_t n = strcspn(line, "\r\n");
        snprintf(where, sizeof where, "--prompt-file %s line %d", so[1].val, ln);
        if (strspn(line, " \t\r\n") < strlen(line)) rc = gen_add_text(g, b, line, n, where, err, errlen);
    }
    if (f) fclose(f);
    if (text_file) so[1].val = NULL;
    bpe_free(b);
    return rc;
}

/* The options of generate: numbers in range, strings that fit. */
static int gen_parse(gen_opts *g, sub_opt *so, MPI_Comm comm, char *err, size_t errlen) {
    long long v;
    if (so[0].val) PL_TRY(gen_add_prompt(g, so[0].val, "--prompt-tokens", err, errlen));
    if (so[1].val) PL_TRY(gen_read_prompts(g, so[1].val, comm, err, errlen));
    if (so[1].val) snprintf(g->prompt_file, sizeof g->prompt_file, "%s", so[1].val);
    if (!g->nprompts) {
        snprintf(err, errlen, "no prompt: give --prompt TEXT, --prompt-tokens ID,ID,... or --prompt-file FILE");
        return PL_EINVAL;
    }
    int *ints[] = {&g->max_new, &g->top_k, &g->groups, &g->chunk, &g->kv_cache, &g->eot};
    long long lo[] = {0, 0, 0, 1, 0, -1}, hi[] = {1 << 24, INT_MAX, 1 << 20, 1 << 20, 1, INT_MAX};
    for (int i = 0; i < 6; i++)
        if (so[2 + i].val) {
            PL_TRY(sub_opt_int(&so[2 + i], lo[i], hi[i], &v, err, errlen));
            *ints[i] = (int)v;
        }
    double *dbl[] = {&g->temperature, &g->top_p};
    for (int i = 0; i < 2; i++)
        if (so[8 + i].val) {
            char *end;
            *dbl[i] = strtod(so[8 + i].val, &end);
            if (end == so[8 + i].val || *end || !(*dbl[i] >= 0) || *dbl[i] > (i ? 1.0 : 1e6) || (i && *dbl[i] <= 0)) {
                snprintf(err, errlen, "--%s '%.60s' is out of range (%s)", so[8 + i].name, so[8 + i].val,
                         i ? "0 < top-p <= 1" : "0 <= temperature <= 1e6");
                return PL_EINVAL;
            }
        }
    char *strs[] = {g->tokens_out, g->logits_out, g->tokenizer, g->bench_json};
    for (int i = 0; i < 4; i++)
        if (so[10 + i].val) {
            if (strlen(so[10 + i].val) >= PL_PATH) {
                snprintf(err, errlen, "--%s: the path is too long", so[10 + i].name);
                return PL_EINVAL;
            }
            strcpy(strs[i], so[10 + i].val);
        }
    return PL_OK;
}

/* Help text of generate (and of bench --generate). */
static void gen_usage(FILE *out, int bench) {
    fprintf(out, "usage: mpiexec -n P pipelm %s --init FILE|--resume CKPT (--prompt TEXT|--prompt-tokens ID,..|--prompt-file FILE)\n"
                 "       [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [options]\n\n"
                 "Generates from a model on P pipeline stages with a KV cache per stage; prompts are spread over\n"
                 "groups (micro-batches) that keep every stage busy. Greedy at --temperature 0.\n\n"
                 "  --prompt TEXT         one prompt as text, encoded with --tokenizer (repeatable; first)\n"
                 "  --prompt-tokens IDS   one prompt: token ids, comma-separated\n"
                 "  --prompt-file FILE    one prompt per line (ids separated by commas or spaces)\n"
                 "  --prompt-format F     ids (default) or text: --prompt-file's lines as text\n"
                 "  --max-new-tokens N    tokens to generate per prompt (default 32)\n"
                 "  --temperature T       0 (default): greedy; else softmax(logits / T) sampling\n"
                 "  --top-k K             sample among the K most likely tokens (0: all)\n"
                 "  --top-p P             sample from the smallest set of probability >= P (default 1)\n"
                 "  --seed S              the sampling seed (and of the weights without --init)\n"
                 "  --groups G            prompt groups in flight (0: min(prompts, stages))\n"
                 "  --prefill-chunk N     prompt tokens per prefill step (default 64)\n"
                 "  --kv-cache 0|1        0: recompute the whole prefix every step (a reference; slow)\n"
                 "  --eot-token ID        stop a sequence at this id (default: the tokenizer's end-of-text)\n"
                 "  --tokenizer FILE      print text, not ids: llm.c's gpt2_tokenizer.bin, or a BPE\n"
                 "                        tokenizer.json / tiktoken file (which also encodes --prompt)\n"
                 "  --tokens-out FILE     one line per prompt: the generated ids, comma-separated\n"
                 "  --logits-out FILE     (last stage) seq,position,token,logits... per generated token\n"
                 "%s\noptions shared with train:\n", bench ? "bench --generate" : "generate",
            bench ? "  --json FILE           the benchmark's figures as JSON (rank 0)\n" : "");
    config_print_help(out, CFG_CMD_GENERATE);
}

int generate_main(int argc, char **argv, MPI_Comm comm, int bench, int *abort_needed) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            if (rank == 0) gen_usage(pl_out, bench);
            return 0;
        }
    sub_opt so[] = {{"prompt-tokens", 0, NULL}, {"prompt-file", 0, NULL}, {"max-new-tokens", 0, NULL},
                    {"top-k", 0, NULL}, {"groups", 0, NULL}, {"prefill-chunk", 0, NULL}, {"kv-cache", SUB_SWITCH, NULL},
                    {"eot-token", 0, NULL}, {"temperature", 0, NULL}, {"top-p", 0, NULL}, {"tokens-out", 0, NULL},
                    {"logits-out", 0, NULL}, {"tokenizer", 0, NULL}, {"json", 0, NULL}, {"generate", 1, NULL}};
    static gen_opts g;
    memset(&g, 0, sizeof g);
    g.max_new = 32; g.chunk = 64; g.kv_cache = 1; g.eot = -1; g.top_p = 1.0; g.bench = bench;
    char **rest = NULL, err[PL_PATH + 512] = "";
    int nrest = 0, nso = bench ? 15 : 13;
    pl_options o;
    config_defaults(&o);
    sub_opt to[] = {{"prompt", 0, NULL}, {"prompt-format", 0, NULL}}; /* text prompts */
    const char *names[20];
    for (int k = 0; k < nso; k++) names[k] = so[k].name;
    names[nso] = to[0].name, names[nso + 1] = to[1].name;
    char **rest0 = NULL;
    int nrest0 = 0, rc = config_check_names(argc, argv, 2, CFG_CMD_GENERATE, names, nso + 2, err, sizeof err);
    if (rc == PL_OK) rc = sub_opts_take(argc, argv, 2, -1, to, 2, &rest0, &nrest0, err, sizeof err);
    if (rc == PL_OK) rc = sub_opts_take(nrest0, rest0, 2, -1, so, nso, &rest, &nrest, err, sizeof err);
    if (rc == PL_OK) rc = config_parse(&o, nrest, rest, 2, CFG_CMD_GENERATE, err, sizeof err);
    if (rc == PL_OK) rc = gen_text_prompts(&g, argc, argv, so, to[1].val, err, sizeof err);
    if (rc == PL_OK) rc = gen_parse(&g, so, comm, err, sizeof err);
    free(rest0);
    free(rest);
    if (rc == PL_OK && o.dp > 1) {
        snprintf(err, sizeof err, "generate runs one pipeline: --dp %d is not supported (use --dp 1)", o.dp);
        rc = PL_EINVAL;
    }
    o.batch = o.microbatches = o.seq_len = 1; /* the trainer's set-up: one tiny slot per stage */
    if (o.chunks > 1 && strcmp(o.schedule, "1f1b") == 0) strcpy(o.schedule, "interleaved-1f1b");
    if (rc == PL_OK) rc = config_validate(&o, err, sizeof err);
    if (rc != PL_OK) {
        if (rank == 0) pl_error("%s", err);
        return 2;
    }
    o.eval_mode = 2;
    o.gen = &g;
    o.progress = 0;
    int agreed = 1;
    run R;
    double grace;
    rc = run_setup(&R, &o, comm, &grace);
    if (rc == PL_OK) rc = generate_after_setup(&R, &agreed);
    run_teardown(&R, agreed);
    for (int i = 0; i < g.nprompts; i++) free(g.prompt[i]);
    free(g.prompt);
    free(g.plen);
    if (rc != PL_OK && !agreed) *abort_needed = 1;
    if (rc == PL_EPREEMPT) return PIPELM_EXIT_PREEMPTED;
    return rc == PL_OK ? 0 : rc == PL_EINVAL ? 2 : 1;
}
