/*
 * ln_accum.c - the exact accumulators of ln_accum.h: allocation, spills,
 * the scalar path, merging, and the final rounding to double.
 */
#include <math.h>
#include <stdlib.h>

#include "ln_accum.h"

static const double magic[LN_ACC_LEVELS] = {LN_ACC_C0, LN_ACC_C1, LN_ACC_C2};

int ln_acc_init(ln_acc *a, size_t d)
{
    memset(a, 0, sizeof *a);
    size_t n = d ? d : 1;
    size_t bytes = LN_ACC_LEVELS * n * sizeof(uint64_t) +
                   LN_ACC_LEVELS * n * sizeof(ln_i128) + n * sizeof(double) + n;
    char *p = calloc(1, bytes);
    if (p == NULL)
        return -1;
    a->block = p;
    a->d = d;
    for (int l = 0; l < LN_ACC_LEVELS; l++, p += n * sizeof(uint64_t))
        a->sum[l] = (uint64_t *)p;
    a->total = (ln_i128 *)p;
    p += LN_ACC_LEVELS * n * sizeof(ln_i128);
    a->huge = (double *)p;
    p += n * sizeof(double);
    a->flags = (uint8_t *)p;
    return 0;
}

void ln_acc_free(ln_acc *a)
{
    free(a->block);
    memset(a, 0, sizeof *a);
}

static void add_i128(ln_i128 *t, int64_t v)
{
    uint64_t lo = t->lo + (uint64_t)v;
    t->hi += (v < 0 ? -1 : 0) + (lo < t->lo ? 1 : 0);
    t->lo = lo;
}

static void add_i128_i128(ln_i128 *t, ln_i128 v)
{
    uint64_t lo = t->lo + v.lo;
    t->hi += v.hi + (lo < t->lo ? 1 : 0);
    t->lo = lo;
}

void ln_acc_spill(ln_acc *a)
{
    for (int l = 0; l < LN_ACC_LEVELS; l++) {
        if (a->count[l] == 0)
            continue;
        uint64_t base = a->count[l] * ln_acc_bits(magic[l]); /* mod 2^64 */
        for (size_t j = 0; j < a->d; j++) {
            /* The level's integer sum, exact in 63 bits by LN_ACC_SPILL. */
            add_i128(&a->total[j * LN_ACC_LEVELS + l], (int64_t)(a->sum[l][j] - base));
            a->sum[l][j] = 0;
        }
        a->count[l] = 0;
    }
}

void ln_acc_deposit_one(ln_acc *a, size_t j, double v)
{
    if (isnan(v)) {
        a->flags[j] |= LN_ACC_NAN;
    } else if (isinf(v)) {
        a->flags[j] |= v > 0 ? LN_ACC_PINF : LN_ACC_NINF;
    } else if (!(fabs(v) < LN_ACC_LIMIT)) {
        a->flags[j] |= LN_ACC_HUGE;
        a->huge[j] += v;
    } else {
        /* The vector path's arithmetic, on one term, straight into the
         * totals (the level sums stay in step with count). */
        for (int l = 0; l < LN_ACC_LEVELS; l++) {
            double t = v + magic[l];
            add_i128(&a->total[j * LN_ACC_LEVELS + l],
                     (int64_t)(ln_acc_bits(t) - ln_acc_bits(magic[l])));
            v = v - (t - magic[l]);
        }
    }
}

void ln_acc_merge(ln_acc *dst, ln_acc *src)
{
    dst->plain |= src->plain;
    ln_acc_spill(src);
    for (size_t j = 0; j < dst->d; j++) {
        for (int l = 0; l < LN_ACC_LEVELS; l++)
            add_i128_i128(&dst->total[j * LN_ACC_LEVELS + l], src->total[j * LN_ACC_LEVELS + l]);
        dst->flags[j] |= src->flags[j];
        dst->huge[j] += src->huge[j];
    }
}

/* ---- the exact value, rounded once --------------------------------------- */

/* A 256-bit two's complement integer, little-endian words. */
typedef struct {
    uint64_t w[4];
} u256;

/* t += v << shift (v sign-extended; shift a multiple of... any < 192). */
static void add_shifted(u256 *t, ln_i128 v, unsigned shift)
{
    uint64_t ext = v.hi < 0 ? ~(uint64_t)0 : 0;
    uint64_t src[4] = {v.lo, (uint64_t)v.hi, ext, ext};
    uint64_t sh[4] = {0, 0, 0, 0};
    unsigned words = shift / 64, bits = shift % 64;
    for (int i = 3; i >= 0; i--) {
        int k = i - (int)words;
        if (k < 0)
            continue;
        uint64_t part = src[k] << bits;
        if (bits && k > 0)
            part |= src[k - 1] >> (64 - bits);
        sh[i] = part;
    }
    uint64_t carry = 0;
    for (int i = 0; i < 4; i++) {
        uint64_t s = t->w[i] + sh[i];
        uint64_t c1 = s < t->w[i];
        uint64_t s2 = s + carry;
        uint64_t c2 = s2 < s;
        t->w[i] = s2;
        carry = c1 | c2;
    }
}

static void negate(u256 *t)
{
    uint64_t carry = 1;
    for (int i = 0; i < 4; i++) {
        uint64_t v = ~t->w[i] + carry;
        carry = carry && v == 0;
        t->w[i] = v;
    }
}

static int bit_at(const u256 *t, int i)
{
    return (int)((t->w[i / 64] >> (i % 64)) & 1u);
}

/* A nonnegative 256-bit integer times 2^scale, rounded to nearest even to
 * `bits` significant bits (53: double; 24: float, exactly representable in
 * a double, so a cast to float then changes nothing). The sums' grid keeps
 * every nonzero value far above the subnormal ranges of both. */
static double round_to_bits(const u256 *m, int scale, int bits)
{
    int top = -1;
    for (int i = 255; i >= 0; i--)
        if (bit_at(m, i)) {
            top = i;
            break;
        }
    if (top < 0)
        return 0.0;
    if (top < bits) {
        double v = 0.0; /* exact: at most `bits` bits */
        for (int i = top; i >= 0; i--)
            v = 2.0 * v + bit_at(m, i);
        return ldexp(v, scale);
    }
    uint64_t mant = 0;
    for (int i = top; i > top - bits; i--)
        mant = (mant << 1) | (uint64_t)bit_at(m, i);
    int round_bit = bit_at(m, top - bits), sticky = 0;
    for (int i = top - bits - 1; i >= 0 && !sticky; i--)
        sticky = bit_at(m, i);
    if (round_bit && (sticky || (mant & 1u)))
        mant++; /* may reach 2^bits: still exact */
    return ldexp((double)mant, scale + top - (bits - 1));
}

/* The exact sum of feature j (after a spill), rounded to `bits` bits. */
static double exact_value(const ln_acc *a, size_t j, int bits)
{
    /* total = sum_l T_l * 2^(14 - 50 l) = (T_0 2^100 + T_1 2^50 + T_2) 2^-86 */
    u256 t = {{0, 0, 0, 0}};
    for (int l = 0; l < LN_ACC_LEVELS; l++)
        add_shifted(&t, a->total[j * LN_ACC_LEVELS + l],
                    (unsigned)(LN_ACC_WIDTH * (LN_ACC_LEVELS - 1 - l)));
    int negative = (int64_t)t.w[3] < 0;
    if (negative)
        negate(&t);
    double v = round_to_bits(&t, LN_ACC_TOP_EXP - LN_ACC_WIDTH * (LN_ACC_LEVELS - 1), bits);
    return negative ? -v : v;
}

void ln_acc_value(ln_acc *a, double *out, int bits)
{
    ln_acc_spill(a);
    for (size_t j = 0; j < a->d; j++) {
        unsigned f = a->flags[j];
        if ((f & LN_ACC_NAN) || ((f & LN_ACC_PINF) && (f & LN_ACC_NINF)))
            out[j] = NAN;
        else if (f & LN_ACC_PINF)
            out[j] = INFINITY;
        else if (f & LN_ACC_NINF)
            out[j] = -INFINITY;
        else if ((f & LN_ACC_HUGE) || a->plain)
            out[j] = exact_value(a, j, 53) + a->huge[j];
        else
            out[j] = exact_value(a, j, bits);
    }
}

void ln_acc_export(ln_acc *a, uint64_t *words)
{
    ln_acc_spill(a);
    for (size_t j = 0; j < a->d; j++) {
        uint64_t *w = words + j * LN_ACC_STATE_WORDS;
        for (int l = 0; l < LN_ACC_LEVELS; l++) {
            w[2 * l] = a->total[j * LN_ACC_LEVELS + l].lo;
            w[2 * l + 1] = (uint64_t)a->total[j * LN_ACC_LEVELS + l].hi;
        }
        w[2 * LN_ACC_LEVELS] = a->flags[j];
        memcpy(&w[2 * LN_ACC_LEVELS + 1], &a->huge[j], sizeof(double));
    }
}

void ln_acc_import(ln_acc *a, const uint64_t *words)
{
    ln_acc_spill(a);
    for (size_t j = 0; j < a->d; j++) {
        const uint64_t *w = words + j * LN_ACC_STATE_WORDS;
        for (int l = 0; l < LN_ACC_LEVELS; l++) {
            a->total[j * LN_ACC_LEVELS + l].lo = w[2 * l];
            a->total[j * LN_ACC_LEVELS + l].hi = (int64_t)w[2 * l + 1];
        }
        a->flags[j] = (uint8_t)w[2 * LN_ACC_LEVELS];
        memcpy(&a->huge[j], &w[2 * LN_ACC_LEVELS + 1], sizeof(double));
    }
}
