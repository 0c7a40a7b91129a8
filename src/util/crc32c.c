/*
 * crc32c.c — CRC-32C: through ISA-L's crc32_iscsi() when configure found libisal (HAVE_ISAL),
 * else built in, in software (slicing-by-8 tables) and with the SSE4.2 crc32 instruction.
 *
 * ISA-L's convention: crc32_iscsi(buf, len, init) feeds buf into the register `init` and
 * returns the register, with neither the initial nor the final inversion, so
 *     crc32c_extend(crc, p, n) == ~crc32_iscsi(p, n, ~crc)
 * (crc32c("123456789") = ~crc32_iscsi(.., 9, 0xFFFFFFFF) = 0xE3069283): the same values as
 * the built-in code, which tests/unit/test_crc.c checks. Its length is an int, so longer buffers go
 * in pieces of ISAL_CHUNK bytes; below ISAL_MIN bytes the built-in SSE4.2 loop is faster
 * (ISA-L's folding set-up costs more than it saves), so crc32c() keeps those.
 *
 * Notation: the "register" is the CRC state without the initial and final inversions, in the
 * reflected bit order of the polynomial: bit 31 stands for x^0 and bit 0 for x^31. Feeding
 * the register is linear over GF(2), so for buffers A and B
 *     reg(r, A || B) = reg(r, A) * x^(8|B|) mod P  xor  reg(0, B),
 * which lets the SSE4.2 path run three independent streams over three consecutive blocks
 * (the instruction has a latency of 3 cycles but issues one per cycle) and join them with a
 * multiplication by the fixed constant x^(8 BLK) mod P, done with four 256-entry tables.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include "util/crc32c.h"
#ifdef HAVE_ISAL
#include <isa-l/crc.h>
#ifndef ISAL_CHUNK /* (a test build may make it small, to exercise the pieces) */
#define ISAL_CHUNK ((size_t)1 << 30) /* bytes per crc32_iscsi call (its length is an int) */
#endif
#define ISAL_MIN 256                 /* shorter buffers: the built-in SSE4.2 loop (measured) */
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>
#define CRC_HAVE_X86 1
#endif

#define POLY 0x82F63B78u /* x^32 + ... reflected, x^32 left out */
#define BLK 4096         /* bytes per stream in one step of the three-stream loop */

static uint32_t tab[8][256];   /* slicing-by-8: tab[k][b] = register after b then k zero bytes */
static uint32_t shift[4][256]; /* shift[k][b] = (b << 8k) * x^(8 BLK) mod P */
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* a * b mod P (reflected order). */
static uint32_t gf_mul(uint32_t a, uint32_t b) {
    uint32_t p = 0;
    for (int i = 0; i < 32; i++) {
        if (a & (0x80000000u >> i)) p ^= b;       /* the term x^i of a times b */
        b = (b & 1) ? (b >> 1) ^ POLY : b >> 1;   /* b *= x */
    }
    return p;
}

/* x^(8 n) mod P: squaring x^(2^k) for each set bit of 8 n. */
static uint32_t x_pow_8n(uint64_t n) {
    uint32_t r = 0x80000000u, sq = 0x40000000u; /* 1 and x */
    for (uint64_t e = n << 3; e; e >>= 1) {
        if (e & 1) r = gf_mul(r, sq);
        sq = gf_mul(sq, sq);
    }
    return r;
}

static void init_tables(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        tab[0][b] = c;
    }
    for (int k = 1; k < 8; k++)
        for (int b = 0; b < 256; b++) tab[k][b] = (tab[k - 1][b] >> 8) ^ tab[0][tab[k - 1][b] & 0xff];
    uint32_t m = x_pow_8n(BLK);
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) shift[k][b] = gf_mul(b << (8 * k), m);
#ifdef HAVE_ISAL
    /* ISA-L picks its implementation on the first call: make that happen here, once */
    unsigned char none = 0;
    (void)crc32_iscsi(&none, 0, 0);
#endif
}

/* Register r times x^(8 BLK) mod P (r followed by BLK zero bytes). */
static inline uint32_t shift_blk(uint32_t r) {
    return shift[0][r & 0xff] ^ shift[1][(r >> 8) & 0xff] ^ shift[2][(r >> 16) & 0xff] ^ shift[3][r >> 24];
}

/* Software register update, 8 bytes a step. */
static uint32_t reg_sw(uint32_t r, const unsigned char *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        r = (r >> 8) ^ tab[0][(r ^ *p++) & 0xff];
        n--;
    }
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        lo = __builtin_bswap32(lo);
        hi = __builtin_bswap32(hi);
#endif
        lo ^= r;
        r = tab[7][lo & 0xff] ^ tab[6][(lo >> 8) & 0xff] ^ tab[5][(lo >> 16) & 0xff] ^ tab[4][lo >> 24] ^
            tab[3][hi & 0xff] ^ tab[2][(hi >> 8) & 0xff] ^ tab[1][(hi >> 16) & 0xff] ^ tab[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) r = (r >> 8) ^ tab[0][(r ^ *p++) & 0xff];
    return r;
}

uint32_t crc32c_extend_sw(uint32_t crc, const void *p, size_t n) {
    pthread_once(&once, init_tables);
    return ~reg_sw(~crc, p, n);
}

#ifdef CRC_HAVE_X86
/* SSE4.2 register update: three streams of BLK bytes at a time, joined by shift_blk. */
__attribute__((target("sse4.2"))) static uint32_t reg_hw(uint32_t r, const unsigned char *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        r = _mm_crc32_u8(r, *p++);
        n--;
    }
    while (n >= 3 * (size_t)BLK) {
        uint64_t c0 = r, c1 = 0, c2 = 0, w0, w1, w2;
        for (size_t i = 0; i < BLK; i += 8) {
            memcpy(&w0, p + i, 8);
            memcpy(&w1, p + BLK + i, 8);
            memcpy(&w2, p + 2 * BLK + i, 8);
            c0 = _mm_crc32_u64(c0, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
        }
        r = shift_blk(shift_blk((uint32_t)c0) ^ (uint32_t)c1) ^ (uint32_t)c2;
        p += 3 * BLK;
        n -= 3 * BLK;
    }
    uint64_t c = r, w;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
    }
    r = (uint32_t)c;
    while (n--) r = _mm_crc32_u8(r, *p++);
    return r;
}

int crc32c_hw_available(void) { return __builtin_cpu_supports("sse4.2") ? 1 : 0; }

uint32_t crc32c_extend_hw(uint32_t crc, const void *p, size_t n) {
    pthread_once(&once, init_tables);
    if (!crc32c_hw_available()) return ~reg_sw(~crc, p, n);
    return ~reg_hw(~crc, p, n);
}
#else
int crc32c_hw_available(void) { return 0; }
uint32_t crc32c_extend_hw(uint32_t crc, const void *p, size_t n) { return crc32c_extend_sw(crc, p, n); }
#endif

#ifdef HAVE_ISAL
int crc32c_isal_available(void) { return 1; }

uint32_t crc32c_extend_isal(uint32_t crc, const void *p, size_t n) {
    pthread_once(&once, init_tables);
    /* crc32_iscsi takes a non-const pointer but only reads through it */
    unsigned char *b = (unsigned char *)(uintptr_t)p;
    uint32_t r = ~crc;
    while (n) {
        size_t k = n < ISAL_CHUNK ? n : ISAL_CHUNK;
        r = crc32_iscsi(b, (int)k, r);
        b += k;
        n -= k;
    }
    return ~r;
}

uint32_t crc32c_extend(uint32_t crc, const void *p, size_t n) {
    return n < ISAL_MIN ? crc32c_extend_hw(crc, p, n) : crc32c_extend_isal(crc, p, n);
}

const char *crc32c_implementation(void) { return "ISA-L crc32_iscsi"; }
#else
int crc32c_isal_available(void) { return 0; }
uint32_t crc32c_extend_isal(uint32_t crc, const void *p, size_t n) { return crc32c_extend_hw(crc, p, n); }
uint32_t crc32c_extend(uint32_t crc, const void *p, size_t n) { return crc32c_extend_hw(crc, p, n); }

const char *crc32c_implementation(void) {
    return crc32c_hw_available() ? "built-in SSE4.2" : "built-in slicing-by-8 table";
}
#endif

uint32_t crc32c(const void *p, size_t n) { return crc32c_extend(0, p, n); }
