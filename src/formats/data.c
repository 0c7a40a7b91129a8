/*
 * data.c — the Markov chain source, llm.c token files and raw-byte text files (shard sets:
 * shards.c).
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
#include <sys/stat.h>
#include <unistd.h>
#include "util/common.h"
#include "formats/data.h"
#include "formats/shards.h"
#include "util/files.h"
#include "util/crc32c.h"
#include "util/rng.h"

#define TOKENS_MAGIC 20240520
#define TOKENS32_MAGIC 20240801 /* llm.c's Llama 3 token files: uint32 tokens, version 7 */
#define TOKENS_HEADER_BYTES 1024

/* Build the chain: token i may be followed by (i+1), (i+2) mod V — which makes the chain
 * irreducible and aperiodic (cycles of length V and V-1) — and branch-2 random others, with
 * probabilities proportional to exp(2 g), g ~ N(0,1). Branch 1 is the deterministic cycle
 * i -> i+1 (entropy 0; periodic, but its stationary distribution is still the uniform one the
 * power iteration starts from): --markov-branch 1 runs it, as the checkpoint records. */
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

/* Open a data file (regular files only: a FIFO or device would block or never end) and
 * remember its size; batches check it has not changed. */
static int open_file(data_source *d, const char *path, char *err, size_t errlen) {
    if (strlen(path) >= sizeof d->path) {
        snprintf(err, errlen, "data file name of %zu characters is too long", strlen(path));
        return PL_EIO;
    }
    snprintf(d->path, sizeof d->path, "%s", path);
    PL_TRY(pl_open_input_fd(path, "data file", 0, &d->fd, &d->file_bytes, err, errlen));
    if (d->file_bytes == 0) {
        snprintf(err, errlen, "data file %s: empty", path);
        return PL_EIO;
    }
    return PL_OK;
}

/* pread exactly n bytes at off; PL_EIO naming the file if the file is shorter now. */
static int read_exact(const data_source *d, void *buf, size_t n, size_t off, char *err, size_t errlen) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(d->fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            snprintf(err, errlen, "data file %s: read failed: %s", d->path, strerror(errno));
            return PL_EIO;
        }
        if (r == 0) {
            struct stat sb;
            long long now = fstat(d->fd, &sb) == 0 ? (long long)sb.st_size : -1;
            snprintf(err, errlen, "data file %s: shrank while training: %lld bytes now, %zu when it was opened "
                     "(truncated or rewritten?); data files must not change during a run", d->path, now,
                     d->file_bytes);
            return PL_EIO;
        }
        got += (size_t)r;
    }
    return PL_OK;
}

/* Validate an llm.c token file: magic and version (20240520 v1 uint16, or 20240801 v7
 * uint32), size = 1024 + tok_bytes ntok, every token < V (read in chunks; nothing is kept in
 * memory). */
int data_open_tokens(data_source *d, const char *path, char *err, size_t errlen) {
    PL_TRY(open_file(d, path, err, errlen));
    if (d->file_bytes < TOKENS_HEADER_BYTES) {
        snprintf(err, errlen, "token file %s: %zu bytes, shorter than the 1024-byte header", path, d->file_bytes);
        return PL_EIO;
    }
    int32_t h[3];
    PL_TRY(read_exact(d, h, sizeof h, 0, err, errlen));
    if (h[0] != TOKENS_MAGIC && h[0] != TOKENS32_MAGIC) {
        snprintf(err, errlen, "token file %s: bad magic %d (expected %d, an llm.c uint16 token file, or %d, "
                 "a uint32 one)", path, h[0], TOKENS_MAGIC, TOKENS32_MAGIC);
        return PL_EIO;
    }
    int want = h[0] == TOKENS_MAGIC ? 1 : 7;
    if (h[1] != want) {
        snprintf(err, errlen, "token file %s: unsupported version %d (expected %d for magic %d)", path, h[1], want,
                 h[0]);
        return PL_EIO;
    }
    size_t tb = h[0] == TOKENS_MAGIC ? 2 : 4;
    if (h[2] < 0) { /* no size to compare with */
        snprintf(err, errlen, "token file %s: header says %d tokens, a negative count (a corrupt header)", path, h[2]);
        return PL_EIO;
    }
    if (d->file_bytes != TOKENS_HEADER_BYTES + tb * (size_t)h[2]) {
        snprintf(err, errlen, "token file %s: header says %d tokens (%zu bytes) but the file has %zu bytes",
                 path, h[2], TOKENS_HEADER_BYTES + tb * (size_t)h[2], d->file_bytes);
        return PL_EIO;
    }
    d->ntok = (size_t)h[2];
    d->tok_bytes = (int)tb;
    enum { CHUNK = 1 << 19 };
    uint32_t *buf = malloc(CHUNK * sizeof *buf);
    if (!buf) {
        snprintf(err, errlen, "token file %s: out of memory", path);
        return PL_ENOMEM;
    }
    int rc = PL_OK;
    for (size_t i0 = 0; i0 < d->ntok && rc == PL_OK; i0 += CHUNK) {
        size_t n = d->ntok - i0 < CHUNK ? d->ntok - i0 : CHUNK;
        rc = read_exact(d, buf, n * tb, TOKENS_HEADER_BYTES + tb * i0, err, errlen);
        for (size_t i = 0; i < n && rc == PL_OK; i++) {
            uint32_t t;
            if (tb == 2) {
                uint16_t u;
                memcpy(&u, (const char *)buf + 2 * i, 2);
                t = u;
            } else t = buf[i];
            if (t >= (uint32_t)d->V) {
                snprintf(err, errlen, "token file %s: token %u at position %zu is >= the vocabulary size %d",
                         path, t, i0 + i, d->V);
                rc = PL_EIO;
            }
        }
    }
    free(buf);
    return rc;
}

int data_spec_vocab(const char *spec) { return strncmp(spec, "text:", 5) == 0 ? 256 : 0; }

int data_open(data_source *d, const char *spec, int V, int branch, uint64_t seed,
              uint64_t stream0, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    d->fd = -1;
    d->V = V;
    d->entropy = NAN;
    if (strcmp(spec, "markov") == 0) {
        if (branch < 1 || branch > V) {
            snprintf(err, errlen, "markov-branch %d must be in 1..vocab-size (%d)", branch, V);
            return PL_EINVAL;
        }
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
        int rc = open_file(d, spec + 5, err, errlen);
        if (rc != PL_OK) data_close(d);
        d->ntok = d->file_bytes;
        return rc;
    }
    if (shards_spec(spec)) {
        int rc = shards_open(d, spec, seed, err, errlen);
        if (rc != PL_OK) data_close(d);
        return rc;
    }
    d->kind = DATA_TOKENS;
    snprintf(d->desc, sizeof d->desc, "%s", spec);
    int rc = data_open_tokens(d, spec, err, errlen);
    if (rc != PL_OK) data_close(d); /* closes the file */
    return rc;
}

int data_check_batch(const data_source *d, int B, int T, char *err, size_t errlen) {
    if (d->kind == DATA_MARKOV) return PL_OK;
    if (d->kind == DATA_SHARDS) return shards_check(d, T, err, errlen);
    size_t need = (size_t)B * T + 1;
    if (d->ntok < need) {
        snprintf(err, errlen, "data %s: %zu tokens, fewer than one batch of %d x %d + 1 = %zu",
                 d->desc, d->ntok, B, T, need);
        return PL_EIO;
    }
    return PL_OK;
}

int data_read_batch(const data_source *d, long long k, int B, int T, int *inputs, int *targets, char *err,
                    size_t errlen) {
    return data_read_rows(d, k, B, 0, B, T, inputs, targets, err, errlen);
}

/* Rows [row0, row0 + n) of Markov batch k: sequence k Bg + row of its own RNG stream. */
static void markov_rows(const data_source *d, long long k, int Bg, int row0, int n, int T, int *inputs,
                        int *targets) {
    int K = d->branch;
    for (int b = 0; b < n; b++) {
        rng_state r;
        rng_seed(&r, d->seed, d->stream0 + (uint64_t)k * Bg + (uint64_t)(row0 + b));
        int cur = sample_cdf(d->stat_cdf, d->V, rng_uniform(&r));
        for (int t = 0; t < T; t++) {
            inputs[(size_t)b * T + t] = cur;
            cur = d->succ[(size_t)cur * K + sample_cdf(d->cdf + (size_t)cur * K, K, rng_uniform(&r))];
            targets[(size_t)b * T + t] = cur;
        }
    }
}

int data_read_rows(const data_source *d, long long k, int Bg, int row0, int n, int T, int *inputs, int *targets,
                   char *err, size_t errlen) {
    if (row0 < 0 || n < 0 || row0 + n > Bg) {
        snprintf(err, errlen, "data %s: rows %d..%d of a batch of %d do not exist", d->desc, row0, row0 + n - 1, Bg);
        return PL_EINVAL;
    }
    if (d->kind == DATA_MARKOV) {
        markov_rows(d, k, Bg, row0, n, T, inputs, targets);
        return PL_OK;
    }
    if (d->kind == DATA_SHARDS) return shards_read_rows(d, k, Bg, row0, n, T, inputs, targets, err, errlen);
    size_t bt = (size_t)Bg * T, nbatch = (d->ntok - 1) / bt, nt = (size_t)n * T;
    if (k < 0 || nbatch == 0) {
        snprintf(err, errlen, "data %s: batch %lld of %d x %d does not exist", d->desc, k, Bg, T);
        return PL_EINVAL;
    }
    size_t start = (size_t)((unsigned long long)k % nbatch) * bt + (size_t)row0 * T;
    int *tok = malloc((nt + 1) * sizeof(int)); /* (n T + 1) */
    if (!tok) {
        snprintf(err, errlen, "data file %s: out of memory for a batch", d->path);
        return PL_ENOMEM;
    }
    int rc = data_read_tokens(d, start, nt + 1, tok, err, errlen);
    for (size_t i = 0; i < nt && rc == PL_OK; i++) inputs[i] = tok[i], targets[i] = tok[i + 1];
    free(tok);
    return rc;
}

/* A single token file made a set of one shard (it keeps the file descriptor). */
static int tokens_to_set(data_source *d, char *err, size_t errlen) {
    data_source *one = malloc(sizeof *one);
    if (!one) {
        snprintf(err, errlen, "data %s: out of memory", d->desc);
        return PL_ENOMEM;
    }
    *one = *d;
    d->kind = DATA_SHARDS;
    d->fd = -1;
    d->nshards = 1;
    d->shard = one;
    return PL_OK;
}

int data_set_shuffle(data_source *d, int shuffle, uint64_t seed, char *err, size_t errlen) {
    if (shuffle < 0) return PL_OK;
    if (shuffle == 1 && (d->kind == DATA_MARKOV || d->kind == DATA_TEXT || d->inorder)) {
        snprintf(err, errlen, "--shuffle 1 reads llm.c token files in a seeded order, but --data %s %s", d->desc,
                 d->inorder ? "says inorder:" : "is not one");
        return PL_EINVAL;
    }
    if (d->kind == DATA_TOKENS && shuffle == 1) PL_TRY(tokens_to_set(d, err, errlen));
    if (d->kind != DATA_SHARDS) return PL_OK;
    d->seed = seed;
    d->shuffle = shuffle;
    shards_describe(d);
    return PL_OK;
}

void data_row_where(const data_source *d, long long k, int Bg, int row, int T, char *buf, size_t len) {
    if (d->kind == DATA_SHARDS) {
        int s;
        size_t pos;
        shards_locate(d, k * Bg + row, T, &s, &pos);
        snprintf(buf, len, "%s %zu", d->shard[s].path, pos);
    } else if (d->kind == DATA_MARKOV)
        snprintf(buf, len, "-");
    else {
        size_t bt = (size_t)Bg * T, nbatch = (d->ntok - 1) / bt;
        snprintf(buf, len, "%s %zu", d->path, (size_t)((unsigned long long)k % (nbatch ? nbatch : 1)) * bt + (size_t)row * T);
    }
}

int data_read_tokens(const data_source *d, size_t start, size_t n, int *out, char *err, size_t errlen) {
    struct stat sb;
    if (fstat(d->fd, &sb) != 0) {
        snprintf(err, errlen, "data file %s: fstat: %s", d->path, strerror(errno));
        return PL_EIO;
    }
    if ((size_t)sb.st_size != d->file_bytes) {
        snprintf(err, errlen, "data file %s: %s while training: %lld bytes now, %zu when it was opened "
                 "(truncated or rewritten?); data files must not change during a run", d->path,
                 (size_t)sb.st_size < d->file_bytes ? "shrank" : "changed size", (long long)sb.st_size,
                 d->file_bytes);
        return PL_EIO;
    }
    size_t esz = d->kind == DATA_TEXT ? 1 : (size_t)d->tok_bytes, off = d->kind == DATA_TEXT ? 0 : TOKENS_HEADER_BYTES;
    unsigned char *raw = malloc(n * esz);
    if (!raw) {
        snprintf(err, errlen, "data file %s: out of memory for a batch", d->path);
        return PL_ENOMEM;
    }
    int rc = read_exact(d, raw, n * esz, off + start * esz, err, errlen);
    for (size_t i = 0; i < n && rc == PL_OK; i++) {
        int t;
        if (esz == 1) t = raw[i];
        else if (esz == 2) {
            uint16_t u;
            memcpy(&u, raw + 2 * i, 2);
            t = u;
        } else {
            uint32_t u;
            memcpy(&u, raw + 4 * i, 4);
            t = u >= (uint32_t)d->V ? d->V : (int)u; /* refused below */
        }
        if (t >= d->V) {
            snprintf(err, errlen, "data file %s: token %d at position %zu is >= the vocabulary size %d (the file "
                     "changed while training?)", d->path, t, start + i, d->V);
            rc = PL_EIO;
            break;
        }
        out[i] = t;
    }
    free(raw);
    return rc;
}

/* One file's manifest entry appended at buf + *off. */
static int manifest_entry(const data_source *f, char *buf, size_t len, size_t *off, char *err, size_t errlen) {
    unsigned char h[TOKENS_HEADER_BYTES];
    PL_TRY(read_exact(f, h, sizeof h, 0, err, errlen));
    const char *base = strrchr(f->path, '/');
    base = base ? base + 1 : f->path;
    int n = snprintf(buf + *off, len - *off, "%s,%zu,%08x;", base, f->file_bytes, (unsigned)crc32c(h, sizeof h));
    if (n < 0 || (size_t)n >= len - *off) {
        snprintf(err, errlen, "data %s: the list of its shards is over %zu characters, too long for a checkpoint",
                 f->path, len - 1);
        return PL_EINVAL;
    }
    *off += (size_t)n;
    return PL_OK;
}

int data_manifest(const data_source *d, char *buf, size_t len, char *err, size_t errlen) {
    size_t off = 0;
    buf[0] = 0;
    if (d->kind == DATA_TOKENS) return manifest_entry(d, buf, len, &off, err, errlen);
    if (d->kind == DATA_SHARDS) off = (size_t)snprintf(buf, len, "shuffle=%d;", d->shuffle); /* the order too */
    for (int s = 0; d->kind == DATA_SHARDS && s < d->nshards; s++)
        PL_TRY(manifest_entry(&d->shard[s], buf, len, &off, err, errlen));
    return PL_OK;
}

/* Entry i of a manifest into e ("" past its end). */
static void manifest_nth(const char *m, int i, char *e, size_t len) {
    for (; i > 0 && *m; i--) {
        const char *semi = strchr(m, ';');
        m = semi ? semi + 1 : m + strlen(m);
    }
    size_t n = strcspn(m, ";");
    snprintf(e, len, "%.*s", (int)(n < len ? n : len - 1), m);
}

int data_manifest_diff(const char *saved, const char *now, char *msg, size_t len) {
    if (strcmp(saved, now) == 0) return 0;
    char a[PL_PATH + 64], b[PL_PATH + 64];
    for (int i = 0;; i++) {
        manifest_nth(saved, i, a, sizeof a);
        manifest_nth(now, i, b, sizeof b);
        if (strcmp(a, b) == 0 && a[0]) continue;
        i -= strncmp(saved, "shuffle=", 8) == 0; /* shards count from 1 after the order */
        char na[PL_PATH + 64], nb[PL_PATH + 64];
        snprintf(na, sizeof na, "%.*s", (int)strcspn(a, ","), a);
        snprintf(nb, sizeof nb, "%.*s", (int)strcspn(b, ","), b);
        if (strncmp(a, "shuffle=", 8) == 0 || strncmp(b, "shuffle=", 8) == 0)
            snprintf(msg, len, "the order: %s in the checkpoint, %s now",
                     strncmp(a, "shuffle=", 8) == 0 ? a : "a single file", strncmp(b, "shuffle=", 8) == 0 ? b : "a single file");
        else if (!a[0]) snprintf(msg, len, "shard %d, %s, is new (the checkpoint has %d)", i + 1, nb, i);
        else if (!b[0]) snprintf(msg, len, "shard %d, %s, is gone (--data has %d)", i + 1, na, i);
        else if (strcmp(na, nb) != 0) snprintf(msg, len, "shard %d is %s in the checkpoint but %s now", i + 1, na, nb);
        else snprintf(msg, len, "shard %s changed: (name, bytes, header CRC-32C) %s in the checkpoint, %s now", na, a, b);
        return 1;
    }
}

void data_close(data_source *d) {
    if (d->kind == DATA_SHARDS) shards_close(d);
    free(d->succ);
    free(d->cdf);
    free(d->stationary);
    free(d->stat_cdf);
    if (d->fd >= 0 && d->kind != DATA_MARKOV) close(d->fd);
    memset(d, 0, sizeof *d);
    d->fd = -1;
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

int data_write_tokens32(const char *path, const uint32_t *tok, size_t ntok) {
    FILE *f = fopen(path, "wb");
    if (!f) return PL_EIO;
    int32_t h[256] = {0};
    h[0] = TOKENS32_MAGIC;
    h[1] = 7;
    h[2] = (int32_t)ntok;
    int ok = fwrite(h, sizeof h, 1, f) == 1 && fwrite(tok, 4, ntok, f) == ntok;
    ok &= fclose(f) == 0;
    return ok ? PL_OK : PL_EIO;
}
