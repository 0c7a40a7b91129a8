/*
 * test_crc.c: Check tests for CRC-32C (src/util/crc32c.c): the ISA-L path (crc32_iscsi, when the
 * build has it) must give exactly the values of the built-in SSE4.2 and table versions, or
 * checkpoints written by one build would not load in another.
 *
 *   known vectors   "123456789" -> 0xE3069283 and RFC 3720's 32-byte vectors, every version;
 *   random buffers  every length 0..1100 and lengths around the three-stream block (4096) and
 *                   the ISA-L threshold, at 16 alignments, all versions equal;
 *   incremental     random splits into up to 8 pieces, each piece through a different version,
 *                   equal to the one-shot CRC.
 *
 * CRC_BENCH=1 also prints the speed of each version on a 64 MiB buffer (one thread, best of 5).
 */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/crc32c.h"

/* xorshift64*: deterministic bytes */
static uint64_t rng_state;
static void rng_seed(uint64_t s) { rng_state = s * 0x9E3779B97F4A7C15ull + 0x1234567ull; }
static uint64_t rng_next(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}
static void fill_bytes(unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(rng_next() >> 56);
}

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);
static const crc_fn impls[] = {crc32c_extend_sw, crc32c_extend_hw, crc32c_extend_isal, crc32c_extend};
static const char *const impl_names[] = {"sw", "hw", "isal", "extend"};
#define NIMPL 4

START_TEST(test_known_vectors) {
    printf("crc32c: %s; SSE4.2 %s; ISA-L %s\n", crc32c_implementation(), crc32c_hw_available() ? "yes" : "no",
           crc32c_isal_available() ? "linked" : "not in this build");
    const char *check = "123456789";
    unsigned char zeros[32], ones[32], inc[32];
    memset(zeros, 0, 32);
    memset(ones, 0xff, 32);
    for (int i = 0; i < 32; i++) inc[i] = (unsigned char)i;
    for (int k = 0; k < NIMPL; k++) {
        ck_assert_msg(impls[k](0, check, 9) == 0xE3069283u, "%s: check value", impl_names[k]);
        ck_assert_msg(impls[k](0, zeros, 32) == 0x8A9136AAu, "%s: 32 zero bytes", impl_names[k]);
        ck_assert_msg(impls[k](0, ones, 32) == 0x62A8AB43u, "%s: 32 0xff bytes", impl_names[k]);
        ck_assert_msg(impls[k](0, inc, 32) == 0x46DD794Eu, "%s: 0..31", impl_names[k]);
        ck_assert_msg(impls[k](0x12345678u, check, 0) == 0x12345678u, "%s: empty keeps the CRC", impl_names[k]);
    }
    ck_assert_uint_eq(crc32c(check, 9), 0xE3069283u);
    ck_assert_uint_eq(crc32c(check, 0), 0);
}
END_TEST

/* Every version agrees on random data of many lengths at 16 alignments. */
START_TEST(test_random_buffers) {
    enum { MAXLEN = 3 * 4096 * 2 + 64 };
    unsigned char *buf = malloc(MAXLEN + 16);
    ck_assert_ptr_nonnull(buf);
    rng_seed(1);
    fill_bytes(buf, MAXLEN + 16);
    size_t lens[1300];
    int nl = 0;
    for (size_t n = 0; n <= 1100; n++) lens[nl++] = n;
    const size_t edges[] = {4095, 4096, 4097, 8191, 8192, 12287, 12288, 12289, 12295, 16384,
                            24575, 24576, 24577, 24583, MAXLEN};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) lens[nl++] = edges[i];
    for (int r = 0; r < 100; r++) lens[nl++] = (size_t)(rng_next() % MAXLEN);
    long checked = 0;
    for (int a = 0; a < 16; a++)
        for (int l = 0; l < nl; l++) {
            const unsigned char *p = buf + a;
            uint32_t want = crc32c_extend_sw(0, p, lens[l]);
            for (int k = 1; k < NIMPL; k++) {
                uint32_t got = impls[k](0, p, lens[l]);
                ck_assert_msg(got == want, "%s: length %zu at alignment %d: 0x%08x, table version 0x%08x",
                              impl_names[k], lens[l], a, got, want);
            }
            /* a non-zero starting CRC too */
            uint32_t seed = (uint32_t)rng_next();
            uint32_t want2 = crc32c_extend_sw(seed, p, lens[l]);
            for (int k = 1; k < NIMPL; k++)
                ck_assert_msg(impls[k](seed, p, lens[l]) == want2, "%s: length %zu, start 0x%08x",
                              impl_names[k], lens[l], seed);
            ck_assert_uint_eq(crc32c(p, lens[l]), want);
            checked++;
        }
    printf("crc32c: %ld buffers, all versions equal\n", checked);
    /* one changed byte changes the CRC */
    uint32_t before = crc32c(buf, 4097);
    buf[2000] ^= 1;
    ck_assert_uint_ne(crc32c(buf, 4097), before);
    ck_assert_uint_ne(crc32c_extend_isal(0, buf, 4097), before);
    free(buf);
}
END_TEST

/* A CRC built piece by piece, each piece through another version, equals the one-shot CRC. */
START_TEST(test_incremental) {
    enum { MAXLEN = 40000 };
    unsigned char *buf = malloc(MAXLEN);
    ck_assert_ptr_nonnull(buf);
    rng_seed(2);
    fill_bytes(buf, MAXLEN);
    for (int t = 0; t < 2000; t++) {
        size_t n = (size_t)(rng_next() % (t < 1000 ? 2000 : MAXLEN));
        size_t off = (size_t)(rng_next() % 8);
        if (off + n > MAXLEN) n = MAXLEN - off;
        const unsigned char *p = buf + off;
        uint32_t want = crc32c_extend_sw(0, p, n);
        int pieces = 1 + (int)(rng_next() % 8);
        uint32_t crc = 0;
        size_t at = 0;
        for (int i = 0; i < pieces; i++) {
            size_t k = i == pieces - 1 ? n - at : (size_t)(rng_next() % (n - at + 1));
            crc = impls[rng_next() % NIMPL](crc, p + at, k);
            at += k;
        }
        ck_assert_msg(crc == want, "%zu bytes in %d pieces: 0x%08x, one-shot 0x%08x", n, pieces, crc, want);
        size_t cut = n ? (size_t)(rng_next() % n) : 0;
        ck_assert_uint_eq(crc32c_extend(crc32c(p, cut), p + cut, n - cut), want);
        ck_assert_uint_eq(crc32c_extend_isal(crc32c_extend_hw(0, p, cut), p + cut, n - cut), want);
    }
    free(buf);
}
END_TEST

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* CRC_BENCH=1: GB/s of each version on a 64 MiB buffer, one thread, best of 5 (2 for the table). */
static void bench(void) {
    size_t n = (size_t)64 << 20;
    unsigned char *buf = malloc(n);
    if (!buf) return;
    rng_seed(3);
    fill_bytes(buf, n);
    uint32_t sink = 0;
    for (int k = 0; k < NIMPL; k++) {
        double best = 1e30;
        for (int rep = 0; rep < (k == 0 ? 2 : 5); rep++) {
            double t = now();
            sink ^= impls[k](0, buf, n);
            t = now() - t;
            if (t < best) best = t;
        }
        printf("crc32c bench: %-6s %6.2f GB/s (64 MiB, one thread)\n", impl_names[k], (double)n / best / 1e9);
    }
    printf("crc32c bench: (checksum %08x)\n", sink);
    free(buf);
}

static Suite *crc_suite(void) {
    Suite *su = suite_create("crc32c");
    TCase *tc = tcase_create("crc32c");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_known_vectors);
    tcase_add_test(tc, test_random_buffers);
    tcase_add_test(tc, test_incremental);
    suite_add_tcase(su, tc);
    return su;
}

int main(void) {
    const char *b = getenv("CRC_BENCH");
    if (b && *b && strcmp(b, "0") != 0) bench();
    SRunner *sr = srunner_create(crc_suite());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
