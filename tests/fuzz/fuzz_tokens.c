/*
 * fuzz_tokens.c — the data file readers (src/formats/data.c): an llm.c token file (magic 20240520,
 * version 1, uint16 tokens) or, when the first input byte is odd, a text: file. The input
 * after the first two bytes is the file; the second picks the vocabulary size. Once the file
 * is accepted, batches of a few shapes are read from it and every token checked against V;
 * a refused file must leave no descriptor open.
 */
#include <fcntl.h>
#include <stdlib.h>
#include "fuzz.h"
#include "formats/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_in in = {data, size};
    int text = fuzz_u8(&in) & 1;
    int V = 2 + fuzz_u8(&in) * 257; /* 2 .. 65537 */
    const char *path = fuzz_path("tokens.bin");
    fuzz_write_file(path, in.p, in.n);
    char spec[300], err[1024];
    snprintf(spec, sizeof spec, "%s%s", text ? "text:" : "", path);
    /* the lowest free descriptor before and after: a refused file must not stay open */
    int fd0 = open("/dev/null", O_RDONLY);
    close(fd0);
    data_source d;
    if (data_open(&d, spec, V, 4, 1, 0, err, sizeof err) == 0) {
        static const int shapes[][2] = {{1, 1}, {1, 7}, {2, 3}, {4, 64}};
        for (int s = 0; s < 4; s++) {
            int B = shapes[s][0], T = shapes[s][1];
            if (data_check_batch(&d, B, T, err, sizeof err) != 0) continue;
            int *x = malloc(sizeof(int) * B * T), *y = malloc(sizeof(int) * B * T);
            for (long long k = 0; k < 3; k++) {
                if (data_read_batch(&d, k * 1000003LL, B, T, x, y, err, sizeof err) != 0) {
                    fprintf(stderr, "data_read_batch refused an unchanged file: %s\n", err);
                    abort();
                }
                for (int i = 0; i < B * T; i++)
                    if (x[i] < 0 || x[i] >= V || y[i] < 0 || y[i] >= V) {
                        fprintf(stderr, "token %d/%d out of range 0..%d\n", x[i], y[i], V - 1);
                        abort();
                    }
            }
            free(x);
            free(y);
        }
        data_close(&d);
    } else {
        int fd1 = open("/dev/null", O_RDONLY);
        close(fd1);
        if (fd1 != fd0) {
            fprintf(stderr, "data_open refused %s (%s) but left a file descriptor open\n", path, err);
            abort();
        }
    }
    unlink(path);
    return 0;
}
