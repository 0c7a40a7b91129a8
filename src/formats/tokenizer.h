/*
 * tokenizer.h — decoding token ids to text with llm.c's tokenizer file (gpt2_tokenizer.bin,
 * written by llm.c's train_gpt2.py): a header of 256 uint32 (magic 20240328, version 1 or 2,
 * vocabulary size, and in version 2 the end-of-text id), then per token its length as one
 * byte (1..255) and its bytes. A file whose vocabulary is not the model's, a bad magic or
 * version, a zero length or a truncated table is refused naming the file and the cause.
 * Any other file is read as a BPE tokenizer (bpe.h: a Hugging Face tokenizer.json or a
 * tiktoken rank file), which also encodes; its vocabulary must not exceed the model's, and its
 * end token is the end-of-text id.
 */
#ifndef PIPELM_TOKENIZER_H
#define PIPELM_TOKENIZER_H

#include <stddef.h>
#include <stdio.h>
#include "formats/bpe.h"

#define TOKENIZER_MAGIC 20240328

typedef struct {
    int n;                 /* vocabulary size */
    int version;           /* 1 or 2 */
    int eot;               /* the end-of-text id (version 2), or -1 */
    unsigned char *len;    /* (n) byte lengths */
    size_t *off;           /* (n) offsets into bytes */
    char *bytes;           /* every token's bytes, back to back */
    bpe *bpe;              /* a BPE tokenizer file (then the tables above are unused), or NULL */
} tokenizer;

/* Load path for a model of vocabulary V. PL_EIO with a message on any mismatch. */
int tokenizer_load(tokenizer *t, const char *path, int V, char *err, size_t errlen);
/* The same from an open stream f (named path in messages): generate reads the file once on
 * rank 0 and parses the broadcast bytes on every rank. */
int tokenizer_read(tokenizer *t, const char *path, FILE *f, int V, char *err, size_t errlen);
void tokenizer_free(tokenizer *t);
/* Write token id's bytes to out (an id outside the table: "<id>"). */
void tokenizer_write(const tokenizer *t, int id, FILE *out);

#endif
