/*
 * exact.c — fixed-point sums for `--grad-accum exact` (see exact.h): folding a micro-batch's
 * float gradients into the integer accumulator, rounding the sums back once, the loss and
 * norm sums, and the MPI type and sum of 128-bit integers.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <math.h>
#include "util/exact.h"

_Static_assert(EXACT_FRAC == 90, "exact_to_float's scale table assumes units of 2^-90");

#define EXACT_BOUND ((pl_fx)1 << 110) /* a rank's loss or norm sum: W ranks of them stay < 2^127 */

float exact_to_float(pl_fx v) {
    if (v == EXACT_POISON) return NAN;
    /* the integer rounded once to fp32 (to nearest even), then scaled by a power of two:
     * exact, as a nonzero sum is at least 2^-90, far from fp32's subnormals. Under 2^62 one
     * int64 conversion; above, shifted to under 2^62 with the bits shifted out kept as a
     * sticky lowest bit (38 or more bits below fp32's last one), which rounds the same */
    unsigned __int128 a = v < 0 ? -(unsigned __int128)v : (unsigned __int128)v;
    int k = 0;
    while ((a >> k) >= ((unsigned __int128)1 << 62)) k += 32;
    if (k > 64) return NAN; /* at or above 2^126: beyond EXACT_MAX_ADDENDS's bound, never a sum */
    uint64_t w = (uint64_t)(a >> k);
    if (k && (a & (((unsigned __int128)1 << k) - 1))) w |= 1;
    static const float scale[3] = {0x1p-90f, 0x1p-58f, 0x1p-26f}; /* 2^(k - 90), k = 0, 32, 64 */
    float f = (float)(int64_t)w * scale[k / 32];
    return v < 0 ? -f : f;
}

void exact_fold(pl_fx *acc, float *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (src[i] == 0.0f) continue;
        acc[i] = exact_add(acc[i], exact_fx_float(src[i]));
        src[i] = 0.0f;
    }
}

void exact_round(float *dst, const pl_fx *acc, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = exact_to_float(acc[i]);
}

pl_fx exact_fx_double(double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    uint64_t e = (u >> 52) & 0x7ffu, m = u & 0xfffffffffffffull;
    if (e == 0) {
        if (!m) return 0;
        e = 1;
    } else {
        m |= 1ull << 52;
    }
    if (e >= 1023 + 40) return EXACT_POISON;
    int sh = (int)e - 1075 + 64; /* x = m 2^(e - 1075), in units of 2^-64 */
    pl_fx v;
    if (sh >= 0) {
        v = (pl_fx)m << sh;
    } else if (-sh > 54) {
        v = 0;
    } else {
        int s = -sh;
        uint64_t q = m >> s, r = m & ((1ull << s) - 1), half = 1ull << (s - 1);
        if (r > half || (r == half && (q & 1))) q++;
        v = (pl_fx)q;
    }
    return (u >> 63) ? -v : v;
}

double exact_fx_to_double(pl_fx v) {
    if (v == EXACT_POISON) return NAN;
    return ldexp((double)v, -64);
}

pl_fx exact_sumsq(const float *x, size_t n) {
    pl_fx s = 0;
    for (size_t i = 0; i < n; i++) {
        double q = (double)x[i] * (double)x[i]; /* the square is exact in double */
        if (q < 0x1p-2) { /* in units of 2^-64 below 2^62: rounded to nearest even as exact_fx_double would */
            s += (pl_fx)llrint(q * 0x1p64);
            continue;
        }
        pl_fx v = exact_fx_double(q); /* also NaN (poison) */
        if (v == EXACT_POISON || (s += v) >= EXACT_BOUND) return EXACT_POISON;
    }
    return s >= EXACT_BOUND ? EXACT_POISON : s;
}

void exact_to_limbs(pl_fx v, double *limb) {
    int bad = v == EXACT_POISON || v >= EXACT_BOUND || v <= -EXACT_BOUND;
    unsigned __int128 u = bad ? 0 : (unsigned __int128)v;
    for (int k = 0; k < EXACT_NLIMB; k++) limb[k] = (double)(uint32_t)(u >> (32 * k));
    limb[EXACT_NLIMB] = bad ? NAN : 0.0;
}

pl_fx exact_from_limbs(const double *limb) {
    if (!isfinite(limb[EXACT_NLIMB])) return EXACT_POISON;
    unsigned __int128 u = 0; /* two's complement sums wrap to the signed sum */
    for (int k = 0; k < EXACT_NLIMB; k++) u += (unsigned __int128)(uint64_t)limb[k] << (32 * k);
    return (pl_fx)u;
}

static MPI_Datatype fx_type = MPI_DATATYPE_NULL;
static MPI_Op fx_sum = MPI_OP_NULL;

static void fx_sum_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const pl_fx *a = in;
    pl_fx *b = inout;
    for (int i = 0; i < *len; i++) {
        pl_fx x, y;
        memcpy(&x, a + i, sizeof x); /* MPI's buffers need not be 16-byte aligned */
        memcpy(&y, b + i, sizeof y);
        y = exact_add(x, y);
        memcpy(b + i, &y, sizeof y);
    }
}

MPI_Datatype exact_mpi_type(void) {
    if (fx_type == MPI_DATATYPE_NULL) {
        MPI_Type_contiguous((int)sizeof(pl_fx), MPI_BYTE, &fx_type);
        MPI_Type_commit(&fx_type);
    }
    return fx_type;
}

MPI_Op exact_mpi_sum(void) {
    if (fx_sum == MPI_OP_NULL) MPI_Op_create(fx_sum_fn, 1, &fx_sum);
    return fx_sum;
}

void exact_mpi_free(void) {
    if (fx_type != MPI_DATATYPE_NULL) MPI_Type_free(&fx_type);
    if (fx_sum != MPI_OP_NULL) MPI_Op_free(&fx_sum);
}
