/*
 * data.h — where training tokens come from.
 *
 * Three sources, chosen by the --data spec:
 *   "markov" (default, built in): a seeded random sparse Markov chain over the vocabulary;
 *       each token allows `branch` next tokens with random probabilities. Its entropy rate
 *       (nats/token, the best loss any model can reach) is computed exactly from the
 *       stationary distribution and reported as the entropy floor.
 *   "FILE": an llm.c token file: magic 20240520, version 1, uint16 tokens (GPT-2), or magic
 *       20240801, version 7, uint32 tokens (llm.c's Llama 3 files).
 *   "text:FILE": any file, one token per byte (vocabulary 256).
 *   "GLOB" or "A,B,...": many llm.c token files, shuffled per epoch (shards.h; "inorder:"
 *       in front: in order).
 * Files are not memory-mapped (a file truncated under a mapping kills the process with
 * SIGBUS): each batch is read with pread, and a file that changed size or holds a token
 * >= V since it was opened is refused with a message naming it.
 * Batch k (B sequences of T tokens) is a pure function of k, so any rank can produce the
 * batch of any step and a resumed run continues exactly. Files: batch k reads tokens
 * [j*B*T, (j+1)*B*T] with j = k mod (number of whole batches), as llm.c reads in order and
 * wraps. The Markov source generates sequence k*B+r from its own RNG stream, starting from
 * the stationary distribution.
 */
#ifndef PIPELM_DATA_H
#define PIPELM_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef enum { DATA_MARKOV, DATA_TOKENS, DATA_TEXT, DATA_SHARDS } data_kind;

typedef struct data_source {
    data_kind kind;
    char desc[512];        /* for messages and metrics: "markov(V=256,branch=4,seed=1)" */
    int V;                 /* token ids are < V */
    /* Markov chain */
    uint64_t seed, stream0;
    int branch;
    int *succ;             /* (V, branch) next tokens */
    float *cdf;            /* (V, branch) cumulative probabilities */
    double *stationary;    /* (V) */
    float *stat_cdf;       /* (V) */
    double entropy;        /* nats/token, NaN if unknown */
    /* files (read with pread, never mapped) */
    int fd;                /* -1 when closed */
    char path[4096];
    size_t file_bytes;     /* size at open: a batch refuses a file whose size changed */
    size_t ntok;
    int tok_bytes;         /* bytes per token in a token file: 2 (uint16) or 4 (uint32) */
    /* shard sets (shards.h) */
    int nshards, shuffle;  /* shuffle: per epoch, seeded by seed */
    int inorder;           /* the spec said "inorder:" */
    struct data_source *shard; /* (nshards) each an llm.c token file */
} data_source;

/* Open a source. V is the model's vocabulary: a file token >= V is an error. For "markov",
 * seed picks the chain, stream0 separates the training and validation streams. */
int data_open(data_source *d, const char *spec, int V, int branch, uint64_t seed,
              uint64_t stream0, char *err, size_t errlen);
/* Check that one batch of B x T fits in the source (files need B*T+1 tokens). */
int data_check_batch(const data_source *d, int B, int T, char *err, size_t errlen);
/* Fill inputs and targets (B*T ints each) with batch k. PL_EIO with a message naming the
 * file if it cannot be read (shrank, changed size, a token >= V since it was opened). */
int data_read_batch(const data_source *d, long long k, int B, int T, int *inputs, int *targets, char *err,
                    size_t errlen);
/* Rows [row0, row0 + n) of batch k of Bg sequences (a data-parallel replica's share): the same
 * tokens as those rows of data_read_batch(d, k, Bg, ...), inputs and targets (n*T ints each). */
int data_read_rows(const data_source *d, long long k, int Bg, int row0, int n, int T, int *inputs, int *targets,
                   char *err, size_t errlen);
/* --shuffle: -1 leaves the spec's order (a set of several shards shuffled, anything else in
 * order), 0 reads in order, 1 shuffles (a single token file becomes a set of one shard, seeded
 * by seed). PL_EINVAL naming the conflict for markov, text: or "inorder:" with 1. */
int data_set_shuffle(data_source *d, int shuffle, uint64_t seed, char *err, size_t errlen);
/* Where row `row` of batch k of Bg sequences of T comes from, for the data log (test hook):
 * "FILE POS" (the token the row starts at) of a token or text file or a shard set, "-" for
 * generated data. */
void data_row_where(const data_source *d, long long k, int Bg, int row, int T, char *buf, size_t len);
void data_close(data_source *d);
/* Open one llm.c token file (d->V set): its header, size and every token checked. */
int data_open_tokens(data_source *d, const char *path, char *err, size_t errlen);
/* Tokens [start, start + n) of a token or text file into out, checked against V and against
 * a change of the file's size since it was opened. */
int data_read_tokens(const data_source *d, size_t start, size_t n, int *out, char *err, size_t errlen);
/* Vocabulary the spec implies (256 for text:, 0 if it does not say). */
int data_spec_vocab(const char *spec);
/* The data position's file list for a checkpoint (formats.md, /train/shards): for a token
 * file or a shard set, one "NAME,BYTES,CRC" entry per file in reading order, each ended by
 * ';' (NAME the base name, CRC the CRC-32C of its 1024-byte header, 8 hex digits), a shard
 * set's after "shuffle=0;" or "shuffle=1;" (its order); "" for other data. PL_EINVAL if it does not fit in len, PL_EIO if a header cannot be read. */
int data_manifest(const data_source *d, char *buf, size_t len, char *err, size_t errlen);
/* 0 if two manifests are equal; else 1 and msg names the first shard that differs. */
int data_manifest_diff(const char *saved, const char *now, char *msg, size_t len);
/* Write an llm.c token file (used by tests and tools). */
int data_write_tokens(const char *path, const uint16_t *tok, size_t ntok);
/* Write an llm.c uint32 token file (magic 20240801, version 7). */
int data_write_tokens32(const char *path, const uint32_t *tok, size_t ntok);

#endif
