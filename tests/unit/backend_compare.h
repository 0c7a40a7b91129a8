/*
 * backend_compare.h — what the backend tests share to compare a backend's results with the
 * CPU reference's: the random inputs, the error measures and the checks with their
 * tolerances, in one place (tests/unit/test_backends.c, tests/unit/test_onednn.c, tests/unit/test_cuda.c).
 * Header-only (static functions), so tests/lib/cuda_emu.sh needs no extra file to build.
 *
 * Measures: max-rel = max|x - ref| / max|ref| over the whole tensor; l2-rel = ||x - ref|| /
 * ||ref||; cos = cosine(x, ref). For an accumulating op x and ref are the increments over the
 * pre-filled base. Tolerances:
 *   fp32 against backend_cpu:            max-rel <= TOL32 = 1e-5 (only the summation order
 *                                        differs, and a GPU may fuse a multiply-add);
 *   bf16 products vs the fp32 reference: l2-rel <= TOL16_REL = 1e-2, cos >= TOL16_COS = 0.9999,
 *                                        and l2-rel >= TOL16_MIN = 1e-4 (a "bf16" result as exact
 *                                        as fp32 means the products did not run in bf16);
 *   bf16 attention (out, att, dqkv):     l2-rel <= TOL16_ATT_REL = 2e-2, cos >= TOL16_ATT_COS =
 *                                        0.9998 (dqkv goes through two bf16 products in a row).
 * verbose (the test's *_VERBOSE=1) prints every measured value; the worst ones are kept for the
 * summary line.
 */
#ifndef PIPELM_TESTS_BACKEND_COMPARE_H
#define PIPELM_TESTS_BACKEND_COMPARE_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL32 1e-5
#define TOL16_REL 1e-2
#define TOL16_COS 0.9999
#define TOL16_MIN 1e-4
#define TOL16_ATT_REL 2e-2
#define TOL16_ATT_COS 0.9998

static int verbose = 0;
static double worst32 = 0, worst16 = 0, worst16cos = 1, worst16a = 0, worst16acos = 1;

/* xorshift64*: the same stream in every test for a seed. */
static uint64_t rng_state;
static void rng_seed(uint64_t s) { rng_state = s * 0x9E3779B97F4A7C15ull + 0x1234567ull; }
static double rng_u01(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}

/* max|x - r| / max|r| (a NaN in x counts as infinite). */
static double max_rel(const double *x, const double *r, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(x[i] - r[i]);
        if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
        if (fabs(r[i]) > den) den = fabs(r[i]);
    }
    return den > 0 ? num / den : num;
}
/* ||x - r|| / ||r|| and cosine(x, r). */
static void l2_cos(const double *x, const double *r, size_t n, double *rel, double *cs) {
    double dd = 0, rr = 0, xx = 0, xr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = x[i] - r[i];
        dd += d * d;
        rr += r[i] * r[i];
        xx += x[i] * x[i];
        xr += x[i] * r[i];
    }
    *rel = rr > 0 ? sqrt(dd / rr) : sqrt(dd);
    *cs = xx > 0 && rr > 0 ? xr / sqrt(xx * rr) : 0;
    if (isnan(*rel)) *rel = INFINITY;
    if (isnan(*cs)) *cs = -1;
}
/* x - base (base may be NULL), widened; the caller frees it. */
static double *incr(const float *x, const float *base, size_t n) {
    double *d = malloc(sizeof(double) * (n ? n : 1));
    ck_assert_ptr_nonnull(d);
    for (size_t i = 0; i < n; i++) d[i] = (double)x[i] - (base ? (double)base[i] : 0.0);
    return d;
}

/* max-rel of the increments over base <= tol. */
static void check_max(const char *what, const float *x, const float *ref, const float *base, size_t n, double tol) {
    double *a = incr(x, base, n), *r = incr(ref, base, n);
    double e = max_rel(a, r, n);
    free(a);
    free(r);
    if (verbose) printf("  %-50s max-rel %.3e (tol %.0e)\n", what, e, tol);
    if (tol == TOL32 && e > worst32) worst32 = e;
    ck_assert_msg(e <= tol, "%s: max relative error %.3e > %.0e", what, e, tol);
}
static void check32(const char *what, const float *x, const float *ref, const float *base, size_t n) {
    check_max(what, x, ref, base, n, TOL32);
}
/* bf16 against the fp32 reference: l2-rel, cosine, and not suspiciously exact; att: attention's
 * looser bounds. */
static void check16(const char *what, const float *x, const float *ref, const float *base, size_t n, int att) {
    double *a = incr(x, base, n), *r = incr(ref, base, n);
    double rel, cs;
    l2_cos(a, r, n, &rel, &cs);
    free(a);
    free(r);
    double trel = att ? TOL16_ATT_REL : TOL16_REL, tcos = att ? TOL16_ATT_COS : TOL16_COS;
    if (verbose) printf("  %-50s l2-rel %.3e cos %.7f (tol %.0e, %.4f)\n", what, rel, cs, trel, tcos);
    if (att) {
        if (rel > worst16a) worst16a = rel;
        if (cs < worst16acos) worst16acos = cs;
    } else {
        if (rel > worst16) worst16 = rel;
        if (cs < worst16cos) worst16cos = cs;
    }
    ck_assert_msg(rel <= trel, "%s: bf16 l2 relative error %.3e > %.0e", what, rel, trel);
    ck_assert_msg(cs >= tcos, "%s: bf16 cosine %.7f < %.4f", what, cs, tcos);
    ck_assert_msg(rel >= TOL16_MIN, "%s: bf16 result as exact as fp32 (l2-rel %.3e): were the products bf16?", what,
                  rel);
}
/* n floats bit-identical (the first difference named). */
static void check_same(const char *what, const float *a, const float *b, size_t n) {
    size_t nd = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0 && nd++ == 0) first = i;
    if (verbose) printf("  %-50s %s\n", what, nd ? "DIFFERS" : "bit-identical");
    ck_assert_msg(nd == 0, "%s: %zu of %zu values differ (first [%zu]: %.9g vs %.9g)", what, nd, n, first,
                  nd ? (double)a[first] : 0.0, nd ? (double)b[first] : 0.0);
}

#endif
