/*
 * corpus.h — the documents of a text corpus, for `pipelm tokenize`: plain text (one document a
 * file, or one a line with --lines) and JSON lines (one document a line, its text under a key),
 * each plain or gzip-compressed (zlib; told by the gzip magic). A plain file read by lines may
 * be split among ranks by byte range: a range owns the lines that start inside it, so every
 * line has one owner whatever the ranks. A whole-document or compressed file is read whole.
 */
#ifndef PIPELM_CORPUS_H
#define PIPELM_CORPUS_H

#include <stddef.h>

typedef enum { CORPUS_TEXT, CORPUS_LINES, CORPUS_JSONL } corpus_kind;

typedef struct {
    const char *path;
    size_t size;           /* bytes on disk */
    int gz;                /* gzip-compressed: read whole by one rank */
    corpus_kind kind;
} corpus_file;

typedef struct {
    /* a document's text (not NUL-terminated) */
    int (*doc)(void *ctx, const char *text, size_t len);
    /* a bad line: line is the index of the line among those this range read (0-based), cause
     * a short phrase; returns non-zero to stop (the refusal), 0 to skip it */
    int (*bad)(void *ctx, long long line, const char *cause);
    void *ctx;
    const char *key;       /* JSON lines: the text's key */
    size_t done;           /* bytes read so far (for progress), updated as it goes */
    long long lines;       /* lines read (line kinds), counted as it goes */
} corpus_cb;

/* Describe path: size, compression, kind (format "auto": .jsonl / .json(.gz) are JSON lines,
 * anything else text; "text", "jsonl"; lines: text by lines). PL_EIO / PL_EINVAL in err. */
int corpus_stat(corpus_file *f, const char *path, const char *format, int lines, char *err, size_t errlen);
/* Whether a file can be split by byte ranges (plain and read by lines). */
int corpus_splittable(const corpus_file *f);
/* Read the documents of f that start in bytes [s, e) (the whole file when not splittable),
 * in order, through cb. A status; err names the file. */
int corpus_read(const corpus_file *f, size_t s, size_t e, corpus_cb *cb, char *err, size_t errlen);

#endif
