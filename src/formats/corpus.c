/*
 * corpus.c — reading a corpus's documents (corpus.h): plain or gzip files, whole, by lines, or
 * as JSON lines, over a byte range.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include "util/common.h"
#include "util/files.h"
#include "formats/corpus.h"

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

int corpus_stat(corpus_file *f, const char *path, const char *format, int lines, char *err, size_t errlen) {
    int fd;
    unsigned char m[2] = {0, 0};
    memset(f, 0, sizeof *f);
    f->path = path;
    PL_TRY(pl_open_input_fd(path, "input", 0, &fd, &f->size, err, errlen));
    f->gz = pread(fd, m, 2, 0) == 2 && m[0] == 0x1f && m[1] == 0x8b;
    close(fd);
    int json = ends_with(path, ".jsonl") || ends_with(path, ".json") || ends_with(path, ".jsonl.gz") ||
               ends_with(path, ".json.gz");
    if (strcmp(format, "jsonl") == 0) json = 1;
    else if (strcmp(format, "text") == 0) json = 0;
    else if (strcmp(format, "auto") != 0) {
        snprintf(err, errlen, "--format %s: not auto, text or jsonl", format);
        return PL_EINVAL;
    }
    f->kind = json ? CORPUS_JSONL : lines ? CORPUS_LINES : CORPUS_TEXT;
    return PL_OK;
}

int corpus_splittable(const corpus_file *f) { return !f->gz && f->kind != CORPUS_TEXT; }

/* A chunked reader: plain (pread from pos) or gzip. */
typedef struct {
    int fd;
    gzFile gz;
    size_t pos;            /* file offset of buf[len] (plain) */
    char *buf;
    size_t cap, len, at;   /* bytes held, bytes consumed */
    int eof;
} reader;

/* Keep buf[at..len), then read more (growing buf when a line fills it). */
static int reader_fill(reader *r, corpus_cb *cb) {
    memmove(r->buf, r->buf + r->at, r->len - r->at);
    r->len -= r->at, r->at = 0;
    if (r->len == r->cap) {
        char *nb = realloc(r->buf, r->cap * 2);
        if (!nb) return PL_ENOMEM;
        r->buf = nb, r->cap *= 2;
    }
    long got = r->gz ? gzread(r->gz, r->buf + r->len, (unsigned)(r->cap - r->len))
                     : (long)pread(r->fd, r->buf + r->len, r->cap - r->len, (off_t)r->pos);
    if (got < 0) return PL_EIO;
    r->eof = got == 0;
    if (r->eof && r->gz) { /* a truncated or corrupt stream ends with an error, not a clean end */
        int ge;
        gzerror(r->gz, &ge);
        if (ge != Z_OK && ge != Z_STREAM_END) return PL_EIO;
    }
    r->len += (size_t)got, r->pos += (size_t)got;
    cb->done += (size_t)got;
    return PL_OK;
}

/* The next line (without its newline) and its file offset (plain); 0 at the end. */
static int reader_line(reader *r, corpus_cb *cb, const char **line, size_t *n, size_t *off, int *rc) {
    for (;;) {
        char *nl = memchr(r->buf + r->at, '\n', r->len - r->at);
        if (nl || (r->eof && r->at < r->len)) {
            size_t end = nl ? (size_t)(nl - r->buf) : r->len;
            *line = r->buf + r->at, *n = end - r->at;
            *off = r->pos - r->len + r->at;
            r->at = nl ? end + 1 : end;
            return 1;
        }
        if (r->eof) return 0;
        if ((*rc = reader_fill(r, cb)) != PL_OK) return 0;
    }
}

/* One JSON line: its text under cb->key, or a bad line. */
static int json_line(corpus_cb *cb, const char *line, size_t n, long long idx) {
    size_t sp = 0;
    while (sp < n && strchr(" \t\r", line[sp])) sp++;
    if (sp == n) return PL_OK; /* a blank line: no document */
    json_error_t je;
    json_t *j = json_loadb(line, n, JSON_ALLOW_NUL, &je);
    const json_t *t = j ? json_object_get(j, cb->key) : NULL;
    int rc;
    if (!j) rc = cb->bad(cb->ctx, idx, "not JSON (or not UTF-8)") ? PL_EINVAL : PL_OK;
    else if (!t) rc = cb->bad(cb->ctx, idx, "no text key") ? PL_EINVAL : PL_OK;
    else if (!json_is_string(t)) rc = cb->bad(cb->ctx, idx, "the text key is not a string") ? PL_EINVAL : PL_OK;
    else rc = cb->doc(cb->ctx, json_string_value(t), json_string_length(t));
    json_decref(j);
    return rc;
}

/* The lines that start in [s, e): from s - 1, the first line fragment dropped. */
static int read_lines(const corpus_file *f, reader *r, size_t s, size_t e, corpus_cb *cb) {
    int rc = PL_OK, skip = s > 0 && !r->gz;
    r->pos = skip ? s - 1 : 0;
    const char *line;
    size_t n, off;
    while (reader_line(r, cb, &line, &n, &off, &rc)) {
        if (skip) {
            skip = 0;
            continue;
        }
        if (!r->gz && off >= e) break;
        long long idx = cb->lines++;
        if (f->kind == CORPUS_JSONL) rc = json_line(cb, line, n, idx);
        else if (n > 0 && !(n == 1 && line[0] == '\r')) rc = cb->doc(cb->ctx, line, n);
        if (rc != PL_OK) return rc;
    }
    return rc;
}

static int read_whole(reader *r, corpus_cb *cb) {
    while (!r->eof) PL_TRY(reader_fill(r, cb)); /* at stays 0: everything kept, the buffer grows */
    return r->len ? cb->doc(cb->ctx, r->buf, r->len) : PL_OK;
}

int corpus_read(const corpus_file *f, size_t s, size_t e, corpus_cb *cb, char *err, size_t errlen) {
    reader r;
    memset(&r, 0, sizeof r);
    PL_TRY(pl_open_input_fd(f->path, "input", 0, &r.fd, NULL, err, errlen));
    r.cap = (size_t)4 << 20;
    r.buf = malloc(r.cap);
    if (f->gz) r.gz = gzdopen(dup(r.fd), "rb");
    int rc = !r.buf || (f->gz && !r.gz) ? PL_ENOMEM : PL_OK;
    if (rc == PL_OK) rc = f->kind == CORPUS_TEXT ? read_whole(&r, cb) : read_lines(f, &r, s, e, cb);
    if (rc == PL_EIO)
        snprintf(err, errlen, "input %s: reading it failed%s", f->path, f->gz ? " (a corrupt gzip stream?)" : "");
    else if (rc == PL_ENOMEM)
        snprintf(err, errlen, "input %s: out of memory", f->path);
    if (r.gz) gzclose(r.gz);
    close(r.fd);
    free(r.buf);
    return rc;
}
