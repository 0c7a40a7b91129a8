/*
 * exact.h — `--grad-accum exact`: gradient sums that do not depend on their order.
 *
 * Float addition is not associative, so one rank adding micro-batches 0..3's weight gradients
 * in one chain and two replicas adding (0 + 1) and (2 + 3) then each other's give other bits.
 * In exact mode every micro-batch's gradient of a stage is computed from zero and each float
 * is converted, alone, to a fixed-point integer (pl_fx: a signed 128-bit integer counting
 * units of 2^-90, EXACT_FRAC) and added into the stage's accumulator. Integer addition is
 * associative: the sum over micro-batches, replicas and the tied embedding's two ends is the
 * same integer in any order, and each parameter's gradient is rounded to fp32 once, from it.
 *
 * Range: an addend (one micro-batch's gradient of one parameter) is exact when |g| >= 2^-67
 * (below it, rounded to the nearest 2^-90, ties to even: deterministic, so still the same
 * bits on every layout) and must be finite and below 2^19 (EXACT_LIMIT); one outside is
 * EXACT_POISON, which absorbs every sum it enters and rounds to NaN: the step's gradient norm
 * is then not finite and the run stops as it does for a NaN. At most EXACT_MAX_ADDENDS
 * addends a parameter a step (micro-batches of all replicas, twice for the tied embedding),
 * so a sum stays below 2^126 and never overflows.
 *
 * The loss and the gradient norm's sums are fixed-point too (exact_fx_double: units of
 * 2^-64) and cross the ranks as four 32-bit limbs in doubles, whose sums over up to 2^21
 * ranks are exact.
 */
#ifndef PIPELM_EXACT_H
#define PIPELM_EXACT_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef __int128 pl_fx;

#define EXACT_FRAC 90                  /* a gradient unit is 2^-90 */
#define EXACT_LIMIT 19                 /* |addend| < 2^19 */
#define EXACT_MAX_ADDENDS (1 << 17)    /* addends per parameter and step */
#define EXACT_POISON ((pl_fx)((unsigned __int128)1 << 127)) /* the most negative value: never a sum */
#define EXACT_NLIMB 4                  /* doubles per fixed-point value sent over MPI_SUM */

/* A float gradient as a count of 2^-90 units: exact for |g| >= 2^-67, else rounded to
 * nearest (ties to even); EXACT_POISON when not finite or |g| >= 2^19. */
static inline pl_fx exact_fx_float(float g) {
    uint32_t u;
    memcpy(&u, &g, sizeof u);
    uint32_t e = (u >> 23) & 0xffu;
    uint64_t m = u & 0x7fffffu;
    if (e == 0) {
        if (!m) return 0;
        e = 1; /* subnormal: m 2^-149 */
    } else {
        m |= 0x800000u;
    }
    if (e >= 127 + EXACT_LIMIT) return EXACT_POISON; /* also inf and NaN (e = 255) */
    /* g = m 2^(e - 150), in units: m 2^(e - 150 + 90) */
    int sh = (int)e - 150 + EXACT_FRAC;
    pl_fx v;
    if (sh >= 0) {
        v = (pl_fx)m << sh;
    } else if (-sh > 25) {
        v = 0; /* m < 2^24 < half a unit */
    } else {
        int s = -sh;
        uint64_t q = m >> s, r = m & ((1ull << s) - 1), half = 1ull << (s - 1);
        if (r > half || (r == half && (q & 1))) q++;
        v = (pl_fx)q;
    }
    return (u >> 31) ? -v : v;
}

/* a + b, poison absorbing (sums never reach the poison value: see EXACT_MAX_ADDENDS). */
static inline pl_fx exact_add(pl_fx a, pl_fx b) {
    return a == EXACT_POISON || b == EXACT_POISON ? EXACT_POISON : a + b;
}

/* A sum of 2^-90 units rounded once to fp32 (to nearest even); NaN for the poison. */
float exact_to_float(pl_fx v);
/* acc[i] += fx(src[i]), then src[i] = 0, for i < n (zeros skipped: they add nothing). */
void exact_fold(pl_fx *acc, float *src, size_t n);
/* dst[i] = exact_to_float(acc[i]) for i < n. */
void exact_round(float *dst, const pl_fx *acc, size_t n);
/* A double as a count of 2^-64 units (exact for |x| >= 2^-11, else rounded to nearest even);
 * EXACT_POISON when not finite or |x| >= 2^40. */
pl_fx exact_fx_double(double x);
/* v (units of 2^-64) as a double, correctly rounded; NaN for the poison. */
double exact_fx_to_double(pl_fx v);
/* Sum of the squares of n floats (each square exact in double, then exact_fx_double). */
pl_fx exact_sumsq(const float *x, size_t n);
/* v into EXACT_NLIMB doubles (32-bit limbs, two's complement) plus, in limb[EXACT_NLIMB],
 * NaN for the poison and 0 otherwise; exact_from_limbs reads sums of such over ranks. */
void exact_to_limbs(pl_fx v, double *limb);
pl_fx exact_from_limbs(const double *limb);
/* The MPI datatype of one pl_fx and the poison-absorbing sum (created on first use). */
MPI_Datatype exact_mpi_type(void);
MPI_Op exact_mpi_sum(void);
/* The MPI objects, freed (before MPI_Finalize; safe when never created). */
void exact_mpi_free(void);

#endif
