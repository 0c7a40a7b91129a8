/*
 * crc32c.h — CRC-32C (Castagnoli; the iSCSI / ext4 / SCTP checksum): reflected polynomial
 * 0x82F63B78, initial value 0xFFFFFFFF, final xor 0xFFFFFFFF; crc32c("123456789", 9) is
 * 0xE3069283. Checkpoints store one per dataset (docs/formats.md §2). crc32c() uses ISA-L's
 * crc32_iscsi() when the build found libisal (configure's HAVE_ISAL; ~65 GB/s in cache with
 * AVX-512 folding, ~12 GB/s from memory on a 64 MiB buffer, one thread), else the built-in
 * SSE4.2 crc32 instruction over three interleaved streams where the CPU has it (~20 GB/s in
 * cache, ~12 GB/s from memory) and a slicing-by-8 table otherwise (~1.7 GB/s). All give the
 * same values and are exported for the unit tests. All functions are thread-safe.
 * A CRC extends across buffers: crc32c_extend(crc32c(a, na), b, nb) == crc32c(a || b), and
 * crc32c_extend(0, p, n) == crc32c(p, n).
 */
#ifndef PIPELM_CRC32C_H
#define PIPELM_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32C of n bytes at p, the fastest way this CPU allows. */
uint32_t crc32c(const void *p, size_t n);
/* Continue crc (a finished CRC-32C of the bytes before p) over n more bytes. */
uint32_t crc32c_extend(uint32_t crc, const void *p, size_t n);
/* The table-driven software version (any CPU). */
uint32_t crc32c_extend_sw(uint32_t crc, const void *p, size_t n);
/* The SSE4.2 version; only if crc32c_hw_available() (else it falls back to the software one). */
uint32_t crc32c_extend_hw(uint32_t crc, const void *p, size_t n);
/* 1 if this CPU has the SSE4.2 crc32 instruction (and this build can use it). */
int crc32c_hw_available(void);
/* ISA-L's crc32_iscsi(), same values; without ISA-L in the build, crc32c_extend_hw. */
uint32_t crc32c_extend_isal(uint32_t crc, const void *p, size_t n);
/* 1 if this build uses ISA-L (configure found libisal). */
int crc32c_isal_available(void);
/* What crc32c() runs on for large buffers, for messages: "ISA-L crc32_iscsi", "built-in SSE4.2"... */
const char *crc32c_implementation(void);

#endif
