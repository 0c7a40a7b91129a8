/*
 * tokenize.c — `pipelm tokenize` (tokenize.h): a corpus to llm.c token shards over R ranks.
 *
 * The inputs' bytes, in order, are cut into R contiguous ranges; a rank encodes the documents
 * that start in its range (a plain file read by lines is split at line starts, any other file
 * goes whole to the rank its first byte falls to), each preceded by the document token, into
 * memory. The ranks' counts give each its place in the one token stream, which is cut into
 * shards of --shard-tokens (NAME_val_000000.bin first, then NAME_train_000001.bin, ... as
 * llm.c's fineweb.py): rank 0 creates each shard at its full size with its header, every rank
 * writes its tokens at their offsets, and rank 0 publishes the files by rename. The stream
 * depends on the inputs only, so the shards are the same bytes whatever R is.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "formats/bpe.h"
#include "formats/corpus.h"
#include "parallel/comm.h"
#include "run/eval.h"
#include "run/tokenize.h"
#include "util/common.h"
#include "util/hooks.h"
#include "util/files.h"

enum { O_TOK, O_PAT, O_OUT, O_SHARD, O_KEY, O_LINES, O_FORMAT, O_ONERR, O_SPECIAL, O_DECODE, O_HELP, O_N };
#define BAD_SHOWN 5 /* bad lines named one by one on each rank */

typedef struct {
    long long line;        /* index among the lines the rank read in its file */
    int file;
    char cause[48];
} bad_line;

typedef struct {
    sub_opt *so;
    bpe *b;
    int rank, R, skip, special;
    corpus_file *f;
    int nf, cur;           /* files, the one being read */
    uint32_t *tok;         /* (ntok - nspilled) this rank's tokens not yet in the spill file */
    size_t ntok, cap;      /* tokens of this rank in all */
    size_t nspilled, spill_limit; /* tokens in the spill file; the buffer's size that spills */
    int spill_fd;          /* this rank's spill file (native uint32), or -1 */
    char spill_path[PL_PATH + 96], spill_err[PL_PATH + 160];
    bpe_ids ids;
    long long docs, nbad, *lines; /* (nf) lines this rank read in each file */
    bad_line shown[BAD_SHOWN];
    size_t bytes_before, my_bytes;
    corpus_cb *cb;
    double t0, last;
} tk_state;

/* The buffered tokens appended to the spill file (opened on first use, beside the output):
 * a rank's share of a corpus may not fit in memory. */
static int tk_spill(tk_state *s) {
    size_t n = s->ntok - s->nspilled;
    if (s->spill_fd < 0) {
        snprintf(s->spill_path, sizeof s->spill_path, "%s.rank%d.%ld.tokens.tmp", s->so[O_OUT].val, s->rank,
                 (long)getpid());
        s->spill_fd = open(s->spill_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    }
    if (s->spill_fd < 0 || pwrite(s->spill_fd, s->tok, n * 4, (off_t)(s->nspilled * 4)) != (ssize_t)(n * 4)) {
        snprintf(s->spill_err, sizeof s->spill_err, "spill file %s: writing it failed: %s", s->spill_path,
                 strerror(errno));
        return PL_EIO;
    }
    s->nspilled = s->ntok;
    return PL_OK;
}

static int tk_push(tk_state *s, const int *v, size_t n) {
    size_t held = s->ntok - s->nspilled;
    if (held + n > s->cap) {
        size_t cap = (held + n) * 2 + 4096;
        uint32_t *nt = realloc(s->tok, sizeof(uint32_t) * cap);
        if (!nt) return PL_ENOMEM;
        s->tok = nt, s->cap = cap;
    }
    for (size_t i = 0; i < n; i++) s->tok[held + i] = (uint32_t)v[i];
    s->ntok += n;
    return s->ntok - s->nspilled >= s->spill_limit ? tk_spill(s) : PL_OK;
}

/* Tokens [at, at + m) of this rank into out: from the spill file, then the buffer. */
static int tk_tokens(const tk_state *s, size_t at, size_t m, uint32_t *out) {
    size_t from_file = at < s->nspilled ? (s->nspilled - at < m ? s->nspilled - at : m) : 0;
    if (from_file && pread(s->spill_fd, out, from_file * 4, (off_t)(at * 4)) != (ssize_t)(from_file * 4)) return PL_EIO;
    if (m > from_file) memcpy(out + from_file, s->tok + (at + from_file - s->nspilled), (m - from_file) * 4);
    return PL_OK;
}

/* Rank 0, every 2 s: its own share's progress. */
static void tk_progress(tk_state *s) {
    double now = pl_now();
    if (s->rank != 0 || now - s->last < 2.0) return;
    s->last = now;
    double mb = (double)(s->bytes_before + s->cb->done) / 1e6, dt = now - s->t0;
    pl_info("tokenize | rank 0: %.1f of %.1f MB (%.0f%%) | %.2f MB/s | %.0f tokens/s\n", mb, s->my_bytes / 1e6,
            s->my_bytes ? 100.0 * mb * 1e6 / s->my_bytes : 100.0, mb / dt, s->ntok / dt);
}

static int tk_doc(void *ctx, const char *text, size_t len) {
    tk_state *s = ctx;
    int doc = bpe_doc_token(s->b);
    s->ids.n = 0;
    if (doc >= 0) PL_TRY(tk_push(s, &doc, 1));
    PL_TRY(bpe_encode(s->b, text, len, s->special, &s->ids));
    PL_TRY(tk_push(s, s->ids.v, s->ids.n));
    s->docs++;
    tk_progress(s);
    return PL_OK;
}

static int tk_bad(void *ctx, long long line, const char *cause) {
    tk_state *s = ctx;
    if (s->nbad < BAD_SHOWN) {
        bad_line *b = &s->shown[s->nbad];
        b->line = line, b->file = s->cur;
        snprintf(b->cause, sizeof b->cause, "%s", cause);
    }
    s->nbad++;
    return !s->skip; /* refused: stop at the first */
}

/* This rank's part: the documents that start in its byte range, file by file. */
static int tk_encode(tk_state *s, char *err, size_t errlen) {
    size_t total = 0, at = 0;
    for (int i = 0; i < s->nf; i++) total += s->f[i].size;
    size_t lo = (size_t)((unsigned __int128)total * s->rank / s->R);
    size_t hi = (size_t)((unsigned __int128)total * (s->rank + 1) / s->R);
    for (int i = 0; i < s->nf; i++, at += s->f[i - 1].size) {
        size_t a = at, z = at + s->f[i].size;
        int mine = corpus_splittable(&s->f[i]) ? (z > lo && a < hi) || (a == z && a >= lo && a < hi)
                                               : a >= lo && a < hi;
        if (mine) s->my_bytes += corpus_splittable(&s->f[i]) ? (z < hi ? z : hi) - (a > lo ? a : lo) : s->f[i].size;
        s->lines[i] = 0;
    }
    at = 0;
    for (int i = 0; i < s->nf; i++, at += s->f[i - 1].size) {
        size_t a = at, z = at + s->f[i].size;
        int split = corpus_splittable(&s->f[i]);
        if (split ? !(z > lo && a < hi) : !(a >= lo && a < hi)) continue;
        corpus_cb cb = {tk_doc, tk_bad, s, s->so[O_KEY].val ? s->so[O_KEY].val : "text", 0, 0};
        s->cb = &cb;
        s->cur = i;
        int rc = corpus_read(&s->f[i], split && lo > a ? lo - a : 0, split && hi < z ? hi - a : s->f[i].size, &cb,
                             err, errlen);
        s->lines[i] = cb.lines;
        s->bytes_before += cb.done;
        if (rc == PL_ENOMEM) snprintf(err, errlen, "out of memory for the tokens of %s", s->f[i].path);
        if (rc != PL_OK) return rc;
    }
    return PL_OK;
}

/* The bad lines named with their file and line number: each rank's line indices start where
 * the ranks before it stopped in the same file (an exclusive prefix sum). */
static int tk_name_bad(tk_state *s, MPI_Comm comm, char *err, size_t errlen) {
    long long *base = calloc((size_t)s->nf, sizeof(long long));
    if (!base) return PL_ENOMEM;
    PL_MPI_CHECK(MPI_Exscan(s->lines, base, s->nf, MPI_LONG_LONG, MPI_SUM, comm));
    if (s->rank == 0) memset(base, 0, sizeof(long long) * s->nf);
    for (int k = 0; k < s->nbad && k < BAD_SHOWN; k++) {
        bad_line *b = &s->shown[k];
        if (s->skip)
            pl_warn("input %s line %lld: %s: skipped", s->f[b->file].path, base[b->file] + b->line + 1, b->cause);
        else
            snprintf(err, errlen, "input %s line %lld: %s (--on-error skip skips such lines)", s->f[b->file].path,
                     base[b->file] + b->line + 1, b->cause);
    }
    free(base);
    return PL_OK;
}

/* Every failing rank says why; the others, which rank stopped them. The agreed status. */
static int tk_agree(MPI_Comm comm, int rank, int rc, const char *err, const char *phase) {
    int who = -1, out = comm_agree(comm, rc, &who);
    if (rc != PL_OK) pl_error("%s", err[0] ? err : "failed");
    else if (out != PL_OK) pl_error("stopping: rank %d failed %s (its message above)", who, phase);
    (void)rank;
    return out;
}

static void shard_name(char *out, size_t len, const char *base, long long i) {
    snprintf(out, len, "%s_%s_%06lld.bin", base, i == 0 ? "val" : "train", i);
}

/* Rank 0: every shard's temporary file at its full size, with its llm.c header. */
static int shards_create(const char *base, long long nsh, long long S, long long total, int tb, long pid, char *err,
                         size_t errlen) {
    for (long long i = 0; i < nsh; i++) {
        char path[PL_PATH + 64], tmp[PL_PATH + 128];
        shard_name(path, sizeof path, base, i);
        PL_TRY(pl_check_output_file(path, "shard", err, errlen));
        pl_output_tmp_name(path, pid, tmp, sizeof tmp);
        long long n = i + 1 < nsh ? S : total - S * i;
        int32_t h[256] = {0};
        h[0] = tb == 2 ? 20240520 : 20240801;
        h[1] = tb == 2 ? 1 : 7;
        h[2] = (int32_t)n;
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        int ok = fd >= 0 && pwrite(fd, h, sizeof h, 0) == (ssize_t)sizeof h && ftruncate(fd, 1024 + n * tb) == 0;
        if (fd >= 0) ok &= close(fd) == 0;
        if (!ok) {
            snprintf(err, errlen, "shard %s: cannot create it: %s", tmp, strerror(errno));
            return PL_EIO;
        }
    }
    return PL_OK;
}

/* This rank's tokens [off, off + n) of the stream into the shards they fall in. */
static int shards_fill(const tk_state *s, const char *base, long long S, long long off, int tb, long pid, char *err,
                       size_t errlen) {
    size_t done = 0, piece = (size_t)1 << 20;
    uint16_t *u16 = malloc(piece * 2);
    uint32_t *u32 = malloc(piece * 4);
    int rc = u16 && u32 ? PL_OK : PL_ENOMEM, spill_bad = 0;
    while (rc == PL_OK && done < s->ntok) {
        long long pos = off + (long long)done, sh = pos / S, in = pos - sh * S;
        size_t n = s->ntok - done;
        if ((long long)n > S - in) n = (size_t)(S - in);
        char path[PL_PATH + 64], tmp[PL_PATH + 128];
        shard_name(path, sizeof path, base, sh);
        pl_output_tmp_name(path, pid, tmp, sizeof tmp);
        int fd = open(tmp, O_WRONLY | O_CLOEXEC);
        for (size_t k = 0; fd >= 0 && rc == PL_OK && k < n; k += piece) {
            size_t m = n - k < piece ? n - k : piece;
            const void *src = u32;
            if (tk_tokens(s, done + k, m, u32) != PL_OK) {
                spill_bad = 1, rc = PL_EIO;
                break;
            }
            if (tb == 2) {
                for (size_t j = 0; j < m; j++) u16[j] = (uint16_t)u32[j];
                src = u16;
            }
            if (rc == PL_OK && pwrite(fd, src, m * tb, 1024 + (in + (long long)k) * tb) != (ssize_t)(m * tb)) rc = PL_EIO;
        }
        if (fd < 0 || (close(fd) != 0 && rc == PL_OK)) rc = PL_EIO;
        if (rc == PL_EIO && spill_bad) snprintf(err, errlen, "spill file %s: reading it back failed", s->spill_path);
        else if (rc == PL_EIO) snprintf(err, errlen, "shard %s: writing it failed: %s", tmp, strerror(errno));
        done += n;
    }
    free(u16);
    free(u32);
    return rc;
}

/* Rank 0: publish the shards by rename, or remove the temporary files after a failure. */
static int shards_publish(const char *base, long long nsh, long pid, int ok, char *err, size_t errlen) {
    int rc = PL_OK;
    for (long long i = 0; i < nsh; i++) {
        char path[PL_PATH + 64], tmp[PL_PATH + 128];
        shard_name(path, sizeof path, base, i);
        pl_output_tmp_name(path, pid, tmp, sizeof tmp);
        if (!ok || rc != PL_OK) unlink(tmp);
        else rc = pl_output_replace(tmp, path, "shard", err, errlen);
    }
    return rc;
}

/* The token stream's layout, the shards written and published; the counts for the report. */
static int tk_write(tk_state *s, MPI_Comm comm, long long S, long long *total_out, long long *nsh_out) {
    char err[PL_PATH + 512] = "";
    const char *base = s->so[O_OUT].val;
    long long mine = (long long)s->ntok, off = 0, total = 0;
    PL_MPI_CHECK(MPI_Exscan(&mine, &off, 1, MPI_LONG_LONG, MPI_SUM, comm));
    if (s->rank == 0) off = 0;
    PL_MPI_CHECK(MPI_Allreduce(&mine, &total, 1, MPI_LONG_LONG, MPI_SUM, comm));
    long long nsh = (total + S - 1) / S;
    int tb = bpe_vocab(s->b) <= 65536 ? 2 : 4, rc = PL_OK;
    long pid = (long)getpid();
    PL_MPI_CHECK(MPI_Bcast(&pid, 1, MPI_LONG, 0, comm));
    if (total == 0) snprintf(err, sizeof err, "the inputs hold no document: no shard written");
    if (total == 0) rc = s->rank == 0 ? PL_EINVAL : PL_OK;
    if (rc == PL_OK && s->rank == 0) rc = shards_create(base, nsh, S, total, tb, pid, err, sizeof err);
    PL_TRY(tk_agree(comm, s->rank, rc, err, "creating the shards"));
    rc = shards_fill(s, base, S, off, tb, pid, err, sizeof err);
    int ok = comm_agree(comm, rc, NULL) == PL_OK;
    if (rc != PL_OK) pl_error("%s", err);
    if (s->rank == 0) rc = shards_publish(base, nsh, pid, ok, err, sizeof err);
    if (!ok) return PL_EIO;
    PL_TRY(tk_agree(comm, s->rank, rc, err, "publishing the shards"));
    *total_out = total, *nsh_out = nsh;
    return PL_OK;
}

static void tokenize_usage(FILE *out) {
    fprintf(out, "usage: mpiexec -n R pipelm tokenize --tokenizer FILE --out DIR/NAME [options] INPUT...\n"
                 "       pipelm tokenize --tokenizer FILE --decode SHARD      (the shard's text to stdout)\n\n"
                 "Encodes a corpus with a byte-level BPE tokenizer into llm.c token shards: NAME_val_000000.bin,\n"
                 "then NAME_train_000001.bin, ... (uint16 when the vocabulary fits, else uint32), each document\n"
                 "preceded by the tokenizer's document token. The shards are the same bytes on any R.\n\n"
                 "  --tokenizer FILE         a Hugging Face tokenizer.json, or a tiktoken rank file\n"
                 "  --tokenizer-pattern NAME a rank file's pre-tokenizer and special tokens: gpt2, cl100k,\n"
                 "                           llama3, o200k (default: by its rank count)\n"
                 "  --out DIR/NAME           the shards' path and name prefix (DIR must exist)\n"
                 "  --shard-tokens N         tokens per shard (default 100000000, as llm.c's scripts)\n"
                 "  --format auto|text|jsonl inputs' kind (auto: .jsonl/.json[.gz] are JSON lines, else text)\n"
                 "  --lines                  text inputs: one document a line (default: one a file)\n"
                 "  --text-key KEY           JSON lines: the text's key (default text)\n"
                 "  --on-error fail|skip     a JSON line that is not JSON or lacks the key: refuse the\n"
                 "                           input (default), or skip it and count it\n"
                 "  --special 0|1            special-token text in documents encoded as those tokens\n"
                 "                           (default 0: as ordinary text, as llm.c's fineweb.py)\n"
                 "Inputs may be gzip-compressed (read whole by one rank). Bytes that are not UTF-8 are\n"
                 "encoded as bytes.\n");
}

/* `--decode SHARD`: an llm.c token file's text on stdout (rank 0). */
static int tk_decode(const bpe *b, const char *path, char *err, size_t errlen) {
    FILE *f;
    int32_t h[256];
    PL_TRY(pl_open_input(path, "shard", 0, &f, err, errlen));
    int ok = fread(h, sizeof h, 1, f) == 1 && ((h[0] == 20240520 && h[1] == 1) || (h[0] == 20240801 && h[1] == 7));
    int tb = h[0] == 20240520 ? 2 : 4;
    for (int32_t i = 0; ok && i < h[2]; i++) {
        uint32_t t = 0;
        ok = fread(&t, (size_t)tb, 1, f) == 1;
        size_t len;
        const char *s = ok ? bpe_token(b, (int)t, &len) : NULL;
        ok = ok && s;
        if (ok) fwrite(s, 1, len, stdout);
    }
    fclose(f);
    if (!ok) snprintf(err, errlen, "shard %s: not an llm.c token file of this tokenizer's ids (or truncated)", path);
    return ok ? PL_OK : PL_EIO;
}

/* The options every rank parses alike, the tokenizer and the inputs. */
static int tk_setup(tk_state *s, int nrest, char **rest, char *err, size_t errlen) {
    sub_opt *so = s->so;
    const char *on = so[O_ONERR].val ? so[O_ONERR].val : "fail", *sp = so[O_SPECIAL].val ? so[O_SPECIAL].val : "0";
    for (int i = 2; i < nrest; i++)
        if (strncmp(rest[i], "--", 2) == 0) {
            snprintf(err, errlen, "unknown option %s (pipelm tokenize --help)", rest[i]);
            return PL_EINVAL;
        }
    if (!so[O_TOK].val || (!so[O_DECODE].val && (!so[O_OUT].val || nrest <= 2))) {
        snprintf(err, errlen, "give --tokenizer FILE, --out DIR/NAME and inputs (or --decode SHARD)");
        return PL_EINVAL;
    }
    if ((strcmp(on, "fail") && strcmp(on, "skip")) || (strcmp(sp, "0") && strcmp(sp, "1"))) {
        snprintf(err, errlen, "--on-error is fail or skip, --special 0 or 1");
        return PL_EINVAL;
    }
    s->skip = strcmp(on, "skip") == 0, s->special = sp[0] == '1';
    PL_TRY(bpe_load(&s->b, so[O_TOK].val, so[O_PAT].val, err, errlen));
    if (so[O_DECODE].val) return PL_OK;
    s->nf = nrest - 2;
    s->f = calloc((size_t)s->nf, sizeof *s->f);
    s->lines = calloc((size_t)s->nf, sizeof(long long));
    if (!s->f || !s->lines) return PL_ENOMEM;
    for (int i = 0; i < s->nf; i++)
        PL_TRY(corpus_stat(&s->f[i], rest[i + 2], so[O_FORMAT].val ? so[O_FORMAT].val : "auto", so[O_LINES].val != NULL,
                           err, errlen));
    char first[PL_PATH + 64];
    shard_name(first, sizeof first, so[O_OUT].val, 0);
    if (s->rank == 0) PL_TRY(pl_check_output_file(first, "shard", err, errlen));
    if (bpe_doc_token(s->b) < 0) {
        snprintf(err, errlen, "tokenizer %s has no document token (<|endoftext|> or <|begin_of_text|>)",
                 so[O_TOK].val);
        return PL_EINVAL;
    }
    return PL_OK;
}

/* The process's CPU seconds (the encoding's own cost on a loaded machine). */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The closing line: documents, tokens, shards, bytes, rates over every rank. */
static int tk_report(tk_state *s, MPI_Comm comm, long long total, long long nsh, double t_enc, double cpu_enc) {
    long long in[2] = {s->docs, s->nbad}, sum[3] = {0, 0, 0};
    PL_MPI_CHECK(MPI_Reduce(in, sum, 2, MPI_LONG_LONG, MPI_SUM, 0, comm));
    for (int i = 0; i < s->nf; i++) sum[2] += (long long)s->f[i].size; /* the inputs' bytes (compressed) */
    double dt = pl_now() - s->t0;
    pl_info("tokenize | %lld documents, %lld tokens in %lld shard%s (%s, %s) | %.1f MB in %.2f s on %d rank%s "
            "(encoding %.2f s, rank 0's CPU %.2f s): %.2f MB/s, %.0f tokens/s | bad lines: %lld%s\n", sum[0], total, nsh,
            nsh == 1 ? "" : "s", bpe_vocab(s->b) <= 65536 ? "uint16" : "uint32", bpe_desc(s->b), sum[2] / 1e6, dt, s->R,
            s->R == 1 ? "" : "s", t_enc, cpu_enc, sum[2] / 1e6 / dt, total / dt, sum[1], sum[1] ? " (skipped)" : "");
    return PL_OK;
}

static int tk_run(tk_state *s, int nrest, char **rest, MPI_Comm comm) {
    char err[PL_PATH + 512] = "";
    long long S = 100000000, total = 0, nsh = 0;
    int rc = tk_setup(s, nrest, rest, err, sizeof err);
    if (rc == PL_OK && s->so[O_SHARD].val) rc = sub_opt_int(&s->so[O_SHARD], 1, INT32_MAX, &S, err, sizeof err);
    PL_TRY(tk_agree(comm, s->rank, rc, err, "reading the options, the tokenizer or the inputs"));
    if (s->so[O_DECODE].val) {
        rc = s->rank == 0 ? tk_decode(s->b, s->so[O_DECODE].val, err, sizeof err) : PL_OK;
        return tk_agree(comm, s->rank, rc, err, "decoding");
    }
    s->t0 = s->last = pl_now();
    double c0 = cpu_now();
    rc = tk_encode(s, err, sizeof err);
    double cpu_enc = cpu_now() - c0;
    if (s->spill_err[0]) snprintf(err, sizeof err, "%s", s->spill_err);
    if (rc == PL_EINVAL) err[0] = 0; /* a refused line: named below, with its number */
    int who = -1, out = comm_agree(comm, rc, &who);
    double t_enc = pl_now() - s->t0;
    if (out == PL_OK || out == PL_EINVAL) PL_TRY(tk_name_bad(s, comm, err, sizeof err));
    if (out != PL_OK) {
        if (rc != PL_OK) pl_error("%s", err);
        else pl_error("stopping: rank %d failed while encoding (its message above)", who);
        return out;
    }
    PL_TRY(tk_write(s, comm, S, &total, &nsh));
    return tk_report(s, comm, total, nsh, t_enc, cpu_enc);
}

int tokenize_main(int argc, char **argv, MPI_Comm comm) {
    sub_opt so[O_N] = {{"tokenizer", 0, NULL}, {"tokenizer-pattern", 0, NULL}, {"out", 0, NULL},
                       {"shard-tokens", 0, NULL}, {"text-key", 0, NULL}, {"lines", 1, NULL}, {"format", 0, NULL},
                       {"on-error", 0, NULL}, {"special", 0, NULL}, {"decode", 0, NULL}, {"help", 1, NULL}};
    tk_state s;
    memset(&s, 0, sizeof s);
    s.so = so;
    s.spill_fd = -1;
    const char *sl = hooks_env("PIPELM_TOKENIZE_SPILL"); /* tokens held before a spill */
    s.spill_limit = sl && atoll(sl) > 0 ? (size_t)atoll(sl) : (size_t)1 << 24;
    MPI_Comm_rank(comm, &s.rank);
    MPI_Comm_size(comm, &s.R);
    char **rest = NULL, err[256] = "";
    int nrest = 0;
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            if (s.rank == 0) tokenize_usage(pl_out);
            return 0;
        }
    if (sub_opts_take(argc, argv, 2, -1, so, O_N, &rest, &nrest, err, sizeof err) != PL_OK) {
        pl_error("%s", err);
        return 2;
    }
    int rc = tk_run(&s, nrest, rest, comm);
    free(rest);
    bpe_free(s.b);
    bpe_ids_free(&s.ids);
    free(s.tok), free(s.f), free(s.lines);
    if (s.spill_fd >= 0) close(s.spill_fd), unlink(s.spill_path);
    return rc == PL_OK ? 0 : rc == PL_EINVAL ? 2 : 1;
}
