/*
 * fuzz_bpe.c — the BPE tokenizer's file readers and encoder (src/formats/bpe.h). The input is
 * a length (two bytes), that many bytes of tokenizer file (a tokenizer.json or a tiktoken rank
 * file, told apart as bpe_load does) and then a text. Once the file is accepted, the text is
 * encoded with and without special tokens; every id must be below the vocabulary and the
 * tokens' bytes must give the text back (decode(encode(x)) == x for any bytes). A refused
 * file must leave no descriptor open.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include "fuzz.h"
#include "formats/bpe.h"

static void roundtrip(bpe *b, const uint8_t *text, size_t n, int special) {
    bpe_ids ids = {0};
    if (bpe_encode(b, (const char *)text, n, special, &ids) != 0) abort(); /* only out of memory */
    char *back = malloc(n + 1);
    size_t at = 0;
    for (size_t i = 0; i < ids.n; i++) {
        size_t len;
        const char *s = bpe_token(b, ids.v[i], &len);
        if (ids.v[i] < 0 || ids.v[i] >= bpe_vocab(b) || !s || at + len > n ||
            memcmp(text + at, s, len) != 0) {
            fprintf(stderr, "token %zu (id %d) does not give the text back at byte %zu\n", i, ids.v[i], at);
            abort();
        }
        memcpy(back + at, s, len);
        at += len;
    }
    if (at != n) {
        fprintf(stderr, "the tokens give %zu bytes of the text's %zu\n", at, n);
        abort();
    }
    free(back);
    bpe_ids_free(&ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_in in = {data, size};
    size_t flen = fuzz_u8(&in);
    flen |= (size_t)fuzz_u8(&in) << 8;
    if (flen > in.n) flen = in.n;
    const char *path = fuzz_path("tokenizer");
    fuzz_write_file(path, in.p, flen);
    int fd0 = open("/dev/null", O_RDONLY);
    close(fd0);
    bpe *b = NULL;
    char err[1024];
    if (bpe_load(&b, path, NULL, err, sizeof err) == 0) {
        roundtrip(b, in.p + flen, in.n - flen, 0);
        roundtrip(b, in.p + flen, in.n - flen, 1);
        bpe_free(b);
    } else {
        int fd1 = open("/dev/null", O_RDONLY);
        close(fd1);
        if (fd1 != fd0 || !err[0]) {
            fprintf(stderr, "bpe_load refused %s without a message or left a descriptor open (%s)\n", path, err);
            abort();
        }
    }
    return 0;
}
