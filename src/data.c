/*
 * data.c — the Markov chain source, llm.c token files and raw-byte text files.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "pipelm/common.h"
#include "pipelm/data.h"
#include "pipelm/rng.h"

#define TOKENS_MAGIC 20240520
#define TOKENS_HEADER_BYTES 1024

/* Build the chain: token i may be followed by (i+1), (i+2) mod V — which makes the chain
 * irreducible and aperiodic (cycles of length V and V-1) — and branch-2 random others, with
 * probabilities proportional to exp(2 g), g ~ N(0,1). */
static int markov_build(data_source *d, char *err, size_t errlen) {
    int V = d->V, K = d->branch;
    d->succ = malloc(sizeof(int) * (size_t)V * K);
    d->cdf = malloc(sizeof(float) * (size_t)V * K);
    d->stationary = malloc(sizeof(double) * V);
    d->stat_cdf = malloc(sizeof(float) * V);
    double *prob = malloc(sizeof(double) * (size_t)V * K), *next = malloc(sizeof(double) * V);
    if (!d->succ || !d->cdf || !d->stationary || !d->stat_cdf || !prob || !next) {
        free(prob);
        free(next);
        snprintf(err, errlen, "out of memory for the Markov chain (V=%d)", V);
        return PL_ENOMEM;
    }
    rng_state r;
    rng_seed(&r, d->seed, 0x6d61726b6f76ULL);
    for (int i = 0; i < V; i++) {
        int *s = d->succ + (size_t)i * K;
        for (int k = 0; k < K; k++) {
            int cand;
            if (k == 0) cand = (i + 1) % V;
            else if (k == 1) cand = (i + 2) % V;
            else {
                int dup;
                do { /* distinct successors */
                    cand = (int)(rng_u64(&r) % (uint64_t)V);
                    dup = 0;
                    for (int j = 0; j < k; j++) dup |= s[j] == cand;
                } while (dup);
            }
            s[k] = cand;
        }
        double tot = 0.0;
        for (int k = 0; k < K; k++) {
            prob[(size_t)i * K + k] = exp(2.0 * rng_normal(&r));
            tot += prob[(size_t)i * K + k];
        }
        double c = 0.0;
        for (int k = 0; k < K; k++) {
            prob[(size_t)i * K + k] /= tot;
            c += prob[(size_t)i * K + k];
            d->cdf[(size_t)i * K + k] = (float)c;
        }
        d->cdf[(size_t)i * K + K - 1] = 1.0f;
    }
    /* stationary distribution by power iteration: pi <- pi P until it stops moving */
    for (int i = 0; i < V; i++) d->stationary[i] = 1.0 / V;
    for (int it = 0; it < 200000; it++) {
        memset(next, 0, sizeof(double) * V);
        for (int i = 0; i < V; i++)
            for (int k = 0; k < K; k++)
                next[d->succ[(size_t)i * K + k]] += d->stationary[i] * prob[(size_t)i * K + k];
        double diff = 0.0;
        for (int i = 0; i < V; i++) diff += fabs(next[i] - d->stationary[i]);
        memcpy(d->stationary, next, sizeof(double) * V);
        if (diff < 1e-14) break;
    }
    /* entropy rate H = sum_i pi_i H(P_i) */
    double H = 0.0, c = 0.0;
    for (int i = 0; i < V; i++) {
        double h = 0.0;
        for (int k = 0; k < K; k++) {
            double p = prob[(size_t)i * K + k];
            if (p > 0) h -= p * log(p);
        }
        H += d->stationary[i] * h;
        c += d->stationary[i];
        d->stat_cdf[i] = (float)c;
    }
    d->stat_cdf[V - 1] = 1.0f;
    d->entropy = H;
    free(prob);
    free(next);
    return PL_OK;
}

/* Index of the first cdf entry > u (linear; cdfs are short or sampled once per sequence). */
static int sample_cdf(const float *cdf, int n, float u) {
    for (int k = 0; k < n; k++)
        if (u < cdf[k]) return k;
    return n - 1;
}

/* Map a file read-only and validate its size. */
static int map_file(data_source *d, const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        snprintf(err, errlen, "data file %s: %s", path, strerror(errno));
        return PL_EIO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(err, errlen, "data file %s: not a regular file", path);
        close(fd);
        return PL_EIO;
    }
    d->map_bytes = (size_t)sb.st_size;
    if (d->map_bytes == 0) {
        snprintf(err, errlen, "data file %s: empty", path);
        close(fd);
        return PL_EIO;
    }
    d->map = mmap(NULL, d->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (d->map == MAP_FAILED) {
        d->map = NULL;
        snprintf(err, errlen, "data file %s: mmap: %s", path, strerror(errno));
        return PL_EIO;
    }
    return PL_OK;
}

/* Validate an llm.c token file: magic, version, size = 1024 + 2 ntok, every token < V. */
static int tokens_open(data_source *d, const char *path, char *err, size_t errlen) {
    PL_TRY(map_file(d, path, err, errlen));
    if (d->map_bytes < TOKENS_HEADER_BYTES) {
        snprintf(err, errlen, "token file %s: %zu bytes, shorter than the 1024-byte header", path, d->map_bytes);
        return PL_EIO;
    }
    int32_t h[3];
    memcpy(h, d->map, sizeof h);
    if (h[0] != TOKENS_MAGIC) {
        snprintf(err, errlen, "token file %s: bad magic %d (expected %d, an llm.c token file%s)",
                 path, h[0], TOKENS_MAGIC, h[0] == 20240801 ? "; the llama-3 uint32 variant is not supported" : "");
        return PL_EIO;
    }
    if (h[1] != 1) {
        snprintf(err, errlen, "token file %s: unsupported version %d (expected 1)", path, h[1]);
        return PL_EIO;
    }
    if (h[2] < 0 || d->map_bytes != TOKENS_HEADER_BYTES + 2 * (size_t)h[2]) {
        snprintf(err, errlen, "token file %s: header says %d tokens (%zu bytes) but the file has %zu bytes",
                 path, h[2], TOKENS_HEADER_BYTES + 2 * (size_t)h[2], d->map_bytes);
        return PL_EIO;
    }
    d->ntok = (size_t)h[2];
    d->tok16 = (const uint16_t *)((const char *)d->map + TOKENS_HEADER_BYTES);
    for (size_t i = 0; i < d->ntok; i++)
        if (d->tok16[i] >= d->V) {
            snprintf(err, errlen, "token file %s: token %u at position %zu is >= the vocabulary size %d",
                     path, d->tok16[i], i, d->V);
            return PL_EIO;
        }
    return PL_OK;
}

int data_spec_vocab(const char *spec) { return strncmp(spec, "text:", 5) == 0 ? 256 : 0; }

int data_open(data_source *d, const char *spec, int V, int branch, uint64_t seed,
              uint64_t stream0, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    d->V = V;
    d->entropy = NAN;
    if (strcmp(spec, "markov") == 0) {
        if (branch < 1 || branch > V) {
            snprintf(err, errlen, "markov-branch %d must be in 1..vocab-size (%d)", branch, V);
            return PL_EINVAL;
        }
        if (branch < 2) branch = 2;
        if (branch > V) branch = V;
        d->kind = DATA_MARKOV;
        d->seed = seed;
        d->stream0 = stream0;
        d->branch = branch;
        snprintf(d->desc, sizeof d->desc, "markov(V=%d,branch=%d,seed=%llu)", V, branch,
                 (unsigned long long)seed);
        return markov_build(d, err, errlen);
    }
    if (strncmp(spec, "text:", 5) == 0) {
        d->kind = DATA_TEXT;
        if (V < 256) {
            snprintf(err, errlen, "text data needs vocab-size >= 256 (got %d)", V);
            return PL_EINVAL;
        }
        snprintf(d->desc, sizeof d->desc, "%s", spec);
        PL_TRY(map_file(d, spec + 5, err, errlen));
        d->bytes = d->map;
        d->ntok = d->map_bytes;
        return PL_OK;
    }
    d->kind = DATA_TOKENS;
    snprintf(d->desc, sizeof d->desc, "%s", spec);
    return tokens_open(d, spec, err, errlen);
}

int data_check_batch(const data_source *d, int B, int T, char *err, size_t errlen) {
    if (d->kind == DATA_MARKOV) return PL_OK;
    size_t need = (size_t)B * T + 1;
    if (d->ntok < need) {
        snprintf(err, errlen, "data %s: %zu tokens, fewer than one batch of %d x %d + 1 = %zu",
                 d->desc, d->ntok, B, T, need);
        return PL_EIO;
    }
    return PL_OK;
}

/* Token i of a file source. */
static inline int file_tok(const data_source *d, size_t i) {
    return d->kind == DATA_TEXT ? d->bytes[i] : d->tok16[i];
}

void data_batch(const data_source *d, long long k, int B, int T, int *inputs, int *targets) {
    if (d->kind == DATA_MARKOV) {
        int K = d->branch;
        for (int b = 0; b < B; b++) {
            rng_state r;
            rng_seed(&r, d->seed, d->stream0 + (uint64_t)k * B + b);
            int cur = sample_cdf(d->stat_cdf, d->V, rng_uniform(&r));
            for (int t = 0; t < T; t++) {
                inputs[b * T + t] = cur;
                cur = d->succ[(size_t)cur * K + sample_cdf(d->cdf + (size_t)cur * K, K, rng_uniform(&r))];
                targets[b * T + t] = cur;
            }
        }
        return;
    }
    size_t bt = (size_t)B * T, nbatch = (d->ntok - 1) / bt;
    size_t start = (size_t)(k % (long long)nbatch) * bt;
    for (size_t i = 0; i < bt; i++) {
        inputs[i] = file_tok(d, start + i);
        targets[i] = file_tok(d, start + i + 1);
    }
}

void data_close(data_source *d) {
    free(d->succ);
    free(d->cdf);
    free(d->stationary);
    free(d->stat_cdf);
    if (d->map) munmap((void *)d->map, d->map_bytes);
    memset(d, 0, sizeof *d);
}

int data_write_tokens(const char *path, const uint16_t *tok, size_t ntok) {
    FILE *f = fopen(path, "wb");
    if (!f) return PL_EIO;
    int32_t h[256] = {0};
    h[0] = TOKENS_MAGIC;
    h[1] = 1;
    h[2] = (int32_t)ntok;
    int ok = fwrite(h, sizeof h, 1, f) == 1 && fwrite(tok, 2, ntok, f) == ntok;
    ok &= fclose(f) == 0;
    return ok ? PL_OK : PL_EIO;
}
