/*
 * fuzz.h — shared helpers of pipelm's fuzz targets (tests/fuzz/fuzz_*.c).
 *
 * Each target defines LLVMFuzzerTestOneInput. Built two ways:
 *   - with clang -fsanitize=fuzzer,address,undefined by tests/fuzz/run.sh (libFuzzer drives it);
 *   - with the normal compiler by `make check` (linked with tests/fuzz/replay.c, which feeds it
 *     every file of its committed corpus, tests/fuzz/corpus/<target>/, as a regression test).
 * Parsers that take a path get the input through a file in /dev/shm (tmpfs), one per process.
 */
#ifndef PIPELM_FUZZ_H
#define PIPELM_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A per-process scratch path "/dev/shm/pipelm-fuzz-<pid>-<tag>" (falls back to TMPDIR, /tmp). */
static inline const char *fuzz_path(const char *tag) {
    static char buf[8][256];
    static int next;
    char *p = buf[next++ & 7];
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(p, 256, "%s/pipelm-fuzz-%ld-%s", dir, (long)getpid(), tag);
    return p;
}

/* Write the bytes to path (truncating); aborts if the scratch file cannot be written. */
static inline void fuzz_write_file(const char *path, const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

/* Consume bytes from the input front to back (zeros once it runs out). */
typedef struct {
    const uint8_t *p;
    size_t n;
} fuzz_in;

static inline uint8_t fuzz_u8(fuzz_in *in) {
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}
static inline uint32_t fuzz_u32(fuzz_in *in) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)fuzz_u8(in) << (8 * i);
    return v;
}
static inline uint64_t fuzz_u64(fuzz_in *in) {
    uint64_t lo = fuzz_u32(in);
    return lo | (uint64_t)fuzz_u32(in) << 32;
}

#endif
