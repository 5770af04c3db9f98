/*
 * ln_accum.c - the exact accumulators of ln_accum.h: allocation, spills,
 * the scalar path, merging, and the final rounding to double.
 */
#include <math.h>
#include <stdlib.h>

#include "ln_accum.h"

static const double magic[LN_ACC_LEVELS] = {LN_ACC_C0, LN_ACC_C1, LN_ACC_C2};

/* The layout of an accumulator's block: the totals first (16-byte
 * aligned, as malloc gives): the first spill clears them. Then the level
 * sums, the huge sums and the flags, which start at 0. calloc: a large
 * block comes zeroed from the system, and its pages that a call never
 * touches (the totals, the top level, flags and huge sums, as a rule)
 * are never faulted in ((1, 65536) float32 backward: most of its time
 * had been page faults of the memset). */
static size_t totals_bytes(size_t d) { return LN_ACC_LEVELS * (d ? d : 1) * sizeof(ln_i128); }

static size_t zeroed_bytes(size_t d)
{
    size_t n = d ? d : 1;
    return LN_ACC_LEVELS * n * sizeof(uint64_t) + n * sizeof(double) + n;
}

int ln_acc_init(ln_acc *a, size_t d)
{
    memset(a, 0, sizeof *a);
    size_t n = d ? d : 1;
    char *p = calloc(1, totals_bytes(d) + zeroed_bytes(d));
    if (p == NULL)
        return -1;
    a->block = p;
    a->d = d;
    a->total = (ln_i128 *)p;
    p += totals_bytes(d);
    for (int l = 0; l < LN_ACC_LEVELS; l++, p += n * sizeof(uint64_t))
        a->sum[l] = (uint64_t *)p;
    a->huge = (double *)p;
    p += n * sizeof(double);
    a->flags = (uint8_t *)p;
    return 0;
}

void ln_acc_clear(ln_acc *a)
{
    /* A level's sums hold nothing but deposits counted since the last
     * spill, which zeroes them (level_bases relies on the same). */
    size_t n = a->d ? a->d : 1;
    for (int l = 0; l < LN_ACC_LEVELS; l++)
        if (a->count[l] != 0)
            memset(a->sum[l], 0, n * sizeof(uint64_t));
    if (a->scalar || a->plain) {
        memset(a->huge, 0, n * sizeof(double));
        memset(a->flags, 0, n);
    }
    memset(a->count, 0, sizeof a->count);
    a->spilled = a->plain = a->used = a->scalar = 0;
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

/* The totals, cleared before their first use. */
static void totals_ready(ln_acc *a)
{
    if (!a->spilled)
        memset(a->total, 0, totals_bytes(a->d));
    a->spilled = 1;
}

/* What each level's sum holds beyond its integers since the last spill:
 * count * bits(C), mod 2^64. */
static void level_bases(const ln_acc *a, uint64_t base[LN_ACC_LEVELS])
{
    for (int l = 0; l < LN_ACC_LEVELS; l++)
        base[l] = a->count[l] * ln_acc_bits(magic[l]);
}

void ln_acc_spill(ln_acc *a)
{
    if (a->count[0] == 0 && a->count[1] == 0 && a->count[2] == 0)
        return;
    totals_ready(a);
    uint64_t base[LN_ACC_LEVELS];
    level_bases(a, base);
    for (int l = 0; l < LN_ACC_LEVELS; l++) {
        if (a->count[l] == 0)
            continue;
        for (size_t j = 0; j < a->d; j++) {
            /* The level's integer sum, exact in 63 bits by LN_ACC_SPILL. */
            add_i128(&a->total[j * LN_ACC_LEVELS + l], (int64_t)(a->sum[l][j] - base[l]));
            a->sum[l][j] = 0;
        }
        a->count[l] = 0;
    }
}

void ln_acc_deposit_one(ln_acc *a, size_t j, double v)
{
    a->used = 1;
    if (isnan(v)) {
        a->flags[j] |= LN_ACC_NAN;
        a->scalar = 1;
    } else if (isinf(v)) {
        a->flags[j] |= v > 0 ? LN_ACC_PINF : LN_ACC_NINF;
        a->scalar = 1;
    } else if (!(fabs(v) < LN_ACC_LIMIT)) {
        a->flags[j] |= LN_ACC_HUGE;
        a->huge[j] += v;
        a->scalar = 1;
    } else {
        /* The vector path's arithmetic, on one term, straight into the
         * totals (the level sums stay in step with count). */
        totals_ready(a);
        for (int l = 0; l < LN_ACC_LEVELS; l++) {
            double t = v + magic[l];
            add_i128(&a->total[j * LN_ACC_LEVELS + l],
                     (int64_t)(ln_acc_bits(t) - ln_acc_bits(magic[l])));
            v = v - (t - magic[l]);
        }
    }
}

/* Can src's level sums be added to dst's as they are? Neither spilled,
 * and the deposits of both together no more than a spill allows, so
 * that each level's integer sum stays exact in 63 bits. dst then stays
 * unspilled, and ln_acc_value reads it by its quick path: a threaded call
 * of a few workers' records ((64, 768) float32 backward, two threads) had
 * spent a sixth of its time rounding 128-bit totals after the spills. */
static int sums_fit(const ln_acc *dst, const ln_acc *src)
{
    if (dst->spilled || src->spilled)
        return 0;
    for (int l = 0; l < LN_ACC_LEVELS; l++)
        if (dst->count[l] + src->count[l] > LN_ACC_SPILL)
            return 0;
    return 1;
}

void ln_acc_merge(ln_acc *dst, ln_acc *src)
{
    if (!dst->used && dst->d == src->d) {
        ln_acc tmp = *dst;
        *dst = *src;
        *src = tmp;
        dst->used = 1;
        return;
    }
    dst->used = 1;
    dst->plain |= src->plain;
    if (sums_fit(dst, src)) {
        /* sum - count * bits(C) of the two is the sum of theirs */
        for (int l = 0; l < LN_ACC_LEVELS; l++) {
            for (size_t j = 0; j < dst->d; j++)
                dst->sum[l][j] += src->sum[l][j];
            dst->count[l] += src->count[l];
        }
    } else {
        ln_acc_spill(src);
        totals_ready(dst);
        for (size_t j = 0; j < dst->d; j++)
            for (int l = 0; l < LN_ACC_LEVELS && src->spilled; l++)
                add_i128_i128(&dst->total[j * LN_ACC_LEVELS + l],
                              src->total[j * LN_ACC_LEVELS + l]);
    }
    if (src->scalar || src->plain) {
        for (size_t j = 0; j < dst->d; j++) {
            dst->flags[j] |= src->flags[j];
            dst->huge[j] += src->huge[j];
        }
        dst->scalar = 1;
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

/* 2^e as a double, for |e| < 1000 (exact; no libm call). */
static double pow2(int e)
{
    uint64_t b = (uint64_t)(e + 1023) << 52;
    double v;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* Leading zeros of a nonzero word. */
static int clz64(uint64_t v)
{
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_clzll(v);
#else
    int n = 0;
    while (!(v & (UINT64_C(1) << 63))) {
        v <<= 1;
        n++;
    }
    return n;
#endif
}

/* 64 bits of t from bit `pos` up (pos may be negative: zeros below 0). */
static uint64_t bits_from(const u256 *t, int pos)
{
    if (pos < 0)
        return t->w[0] << -pos;
    int i = pos / 64, sh = pos % 64;
    uint64_t v = i < 4 ? t->w[i] >> sh : 0;
    if (sh && i + 1 < 4)
        v |= t->w[i + 1] << (64 - sh);
    return v;
}

/* Any bit of t below bit `pos`? */
static int any_below(const u256 *t, int pos)
{
    if (pos <= 0)
        return 0;
    int i = pos / 64, sh = pos % 64;
    for (int k = 0; k < i && k < 4; k++)
        if (t->w[k])
            return 1;
    return sh && i < 4 && (t->w[i] & ((UINT64_C(1) << sh) - 1)) != 0;
}

/* A nonnegative 256-bit integer times 2^scale, rounded to nearest even to
 * `bits` significant bits (53: double; 24: float, exactly representable in
 * a double, so a cast to float then changes nothing). The sums' grid keeps
 * every nonzero value far above the subnormal ranges of both. */
static double round_to_bits(const u256 *m, int scale, int bits)
{
    int w = 3;
    while (w >= 0 && m->w[w] == 0)
        w--;
    if (w < 0)
        return 0.0;
    int top = 64 * w + 63 - clz64(m->w[w]);
    uint64_t window = bits_from(m, top - 63); /* the top bit at bit 63 */
    uint64_t mant = window >> (64 - bits);
    uint64_t rest = window << bits; /* the bits below mant, left-aligned */
    int round_bit = (int)(rest >> 63);
    int sticky = (rest << 1) != 0 || any_below(m, top - 63);
    if (round_bit && (sticky || (mant & 1u)))
        mant++; /* may reach 2^bits: still exact */
    return (double)mant * pow2(scale + top - (bits - 1));
}


/* T1 2^50 + T2 (units of 2^-86) rounded to `bits` bits (53 or 24, a
 * constant where it is inlined) in double arithmetic, when
 * |T1 + carry| < 2^51: T2's part above 2^50 carried into T1 leaves two
 * exact doubles, A = (T1 + carry) 2^50 and B = T2 mod 2^50, whose sum
 * A + B is rounded once (53 bits). For 24 bits that sum is rounded once
 * more, to float: the same as rounding the exact value once, unless the
 * first rounding landed on a point halfway between two floats (rounding
 * to nearest is monotone and those points are doubles, so the exact value
 * lies on the same side of every other one). With `ties` (a constant
 * where it is inlined), a sum on such a point that is exact (A + B - A ==
 * B: |A| >= 2^50 > |B| unless A is 0, so that difference is exact) is a
 * true tie, rounded to even; an inexact one, every one without `ties`,
 * and larger T1 are left to the caller's exact path: the result is
 * nonzero for them (*out then meaningless), 0 when *out is the sum. Ties
 * are common in a call of a few records (two float32 terms of one binade
 * make one a coin toss), where they had sent a quarter of the float32
 * sums of a (4, 16384) backward to the 128-bit exact path; the vector
 * loop over all features (quick_values) leaves them to the scalar call
 * with `ties`, which costs it nothing where there are none.
 *
 * Written without branches, 64-bit integer conversions or 64-bit
 * compares, so that ln_acc_value's loop over the features vectorizes
 * even on SSE2 ((1, 768) float32 backward: 4 of its 8.5 us went to
 * rounding its 1536 sums one at a time): A + carry converts by the magic
 * constant 1.5 * 2^52, B by 2^52, and the float rounding is done on the
 * sum's bits (a halfway sum being excluded, half up on the magnitude is
 * to nearest; |sum| lies far inside float's normal range), all exact. */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((always_inline))
#endif
static inline uint64_t double_value(uint64_t t1, uint64_t t2, int bits, int ties, double *out)
{
    const uint64_t unit = (uint64_t)1 << LN_ACC_WIDTH, sign = (uint64_t)1 << 13;
    const uint64_t below = ((uint64_t)1 << (53 - 24)) - 1, half = (below >> 1) + 1;
    /* low = T2 mod 2^50 and carry = floor(T2 / 2^50), 14 bits sign-extended
     * (no signed shift; a branch on the sign of T2, a coin toss for
     * gradient sums, had made half the time of a (1, 768) backward call) */
    uint64_t low = t2 & (unit - 1);
    uint64_t carry = (((t2 - low) >> LN_ACC_WIDTH) ^ sign) - sign;
    uint64_t hi_bits = ln_acc_bits(0x1.8p52) + t1 + carry, lo_bits = ln_acc_bits(0x1p52) | low;
    double hi, lo;
    memcpy(&hi, &hi_bits, sizeof hi);
    memcpy(&lo, &lo_bits, sizeof lo);
    double a = (hi - 0x1.8p52) * pow2(LN_ACC_WIDTH), b = lo - 0x1p52, sum = a + b;
    uint64_t no = (t1 + carry + ((uint64_t)1 << 51)) >> 52; /* |T1 + carry| >= 2^51 */
    if (bits == 24) {
        uint64_t u = ln_acc_bits(sum);
        uint64_t halfway = (((u & below) ^ half) - 1) >> 63;
        uint64_t off = ln_acc_bits(sum - a) ^ ln_acc_bits(b); /* 0 when sum is exact */
        no |= halfway & (ties ? (off | (0 - off)) >> 63 : 1);
        /* to nearest, ties to even: half - 1, and 1 more when the last
         * kept bit is odd, carries out of the dropped bits (without
         * `ties`, no tie gets here: half up is the same) */
        u = (u + (ties ? (half - 1) + ((u >> (53 - 24)) & 1) : half)) & ~below;
        memcpy(&sum, &u, sizeof sum);
    }
    *out = sum * pow2(LN_ACC_TOP_EXP - LN_ACC_WIDTH * (LN_ACC_LEVELS - 1));
    return no;
}

#if defined(__SIZEOF_INT128__)
/* The common case, |sum| < 2^28 (the top level's total is 0 and the
 * others fit in 64 bits): the sum in units of 2^-86 fits in 128 bits and
 * rounds with a few word operations. */
static int small_value(const ln_i128 *t, int bits, double *out)
{
    if (t[0].lo != 0 || t[0].hi != 0)
        return 0;
    /* T1 and T2 must be 64-bit values (hi the sign extension of lo). */
    for (int l = 1; l < LN_ACC_LEVELS; l++)
        if (t[l].hi != ((int64_t)t[l].lo < 0 ? -1 : 0))
            return 0;
    double quick;
    if ((bits == 53 || bits == 24) && !double_value(t[1].lo, t[2].lo, bits, 1, &quick)) {
        *out = quick;
        return 1;
    }
    /* T1 * 2^LN_ACC_WIDTH as a product: a left shift of a negative value
     * is undefined behaviour (UBSan), and |T1| < 2^63 keeps it in range. */
    __int128 v = (__int128)(int64_t)t[1].lo * ((__int128)1 << LN_ACC_WIDTH) +
                 (__int128)(int64_t)t[2].lo;
    int negative = v < 0;
    unsigned __int128 m = negative ? -(unsigned __int128)v : (unsigned __int128)v;
    uint64_t hi = (uint64_t)(m >> 64), lo = (uint64_t)m;
    if (hi == 0 && lo == 0) {
        *out = 0.0;
        return 1;
    }
    int top = hi ? 127 - clz64(hi) : 63 - clz64(lo);
    double r;
    if (top < bits) {
        r = (double)lo; /* exact: fewer than `bits` bits */
    } else {
        unsigned __int128 window = m << (127 - top); /* the top bit at bit 127 */
        uint64_t mant = (uint64_t)(window >> (128 - bits));
        unsigned __int128 rest = window << bits;
        int round_bit = (int)(rest >> 127);
        int sticky = (rest << 1) != 0;
        if (round_bit && (sticky || (mant & 1u)))
            mant++;
        r = (double)mant * pow2(top - (bits - 1));
    }
    r *= pow2(LN_ACC_TOP_EXP - LN_ACC_WIDTH * (LN_ACC_LEVELS - 1));
    *out = negative ? -r : r;
    return 1;
}
#endif

/* The levels' exact integers T_l of feature j: the spilled totals plus
 * what the level sums hold since (base: count * bits(C) of each level). */
static void level_totals(const ln_acc *a, size_t j, const uint64_t base[LN_ACC_LEVELS],
                         ln_i128 t[LN_ACC_LEVELS])
{
    for (int l = 0; l < LN_ACC_LEVELS; l++) {
        t[l] = a->spilled ? a->total[j * LN_ACC_LEVELS + l] : (ln_i128){0, 0};
        add_i128(&t[l], (int64_t)(a->sum[l][j] - base[l]));
    }
}

/* The exact sum of feature j, rounded to `bits` bits. */
static double exact_value(const ln_acc *a, size_t j, const uint64_t base[LN_ACC_LEVELS],
                          int bits)
{
    ln_i128 lt[LN_ACC_LEVELS];
    level_totals(a, j, base, lt);
#if defined(__SIZEOF_INT128__)
    double fast;
    if (small_value(lt, bits, &fast))
        return fast;
#endif
    /* total = sum_l T_l * 2^(14 - 50 l) = (T_0 2^100 + T_1 2^50 + T_2) 2^-86 */
    u256 t = {{0, 0, 0, 0}};
    for (int l = 0; l < LN_ACC_LEVELS; l++)
        add_shifted(&t, lt[l], (unsigned)(LN_ACC_WIDTH * (LN_ACC_LEVELS - 1 - l)));
    int negative = (int64_t)t.w[3] < 0;
    if (negative)
        negate(&t);
    double v = round_to_bits(&t, LN_ACC_TOP_EXP - LN_ACC_WIDTH * (LN_ACC_LEVELS - 1), bits);
    return negative ? -v : v;
}

/* Feature j of an accumulator never spilled whose top level holds
 * nothing: the lower levels' totals are the level sums less their bases,
 * in 64 bits, and double_value rounds them (small_value's case, without
 * its 128-bit totals: a call of a few records, (1, 768) float32, spent
 * 5 us of its 13 rounding its 1536 sums). 0 in any other case. */
static int unspilled_value(const ln_acc *a, size_t j, const uint64_t base[LN_ACC_LEVELS],
                           int bits, double *out)
{
    if (a->spilled || a->sum[0][j] != base[0])
        return 0;
    return (bits == 53 || bits == 24) &&
           !double_value(a->sum[1][j] - base[1], a->sum[2][j] - base[2], bits, 1, out);
}

/* double_value for the features [j0, j0 + n) of an accumulator never
 * spilled, into out[j], and bad[j] nonzero where feature j needs
 * ln_acc_value's general path (double_value's cases, or its top level
 * set; the caller tests the flags: bytes among the loop's 64-bit words
 * had made it take 16 features a step, and run its scalar copy). */
#define LN_QUICK_CHUNK 256
#if defined(__GNUC__) || defined(__clang__)
__attribute__((always_inline)) /* bits a constant where it is called */
#endif
static inline void quick_values(const ln_acc *a, size_t j0, size_t n,
                                const uint64_t base[LN_ACC_LEVELS], int bits, double *out,
                                uint64_t *bad)
{
    _Static_assert(LN_ACC_LEVELS == 3, "a top level and two lower ones");
    const uint64_t *s0 = a->sum[0] + j0, *s1 = a->sum[1] + j0, *s2 = a->sum[2] + j0;
    const uint64_t b0 = base[0], b1 = base[1], b2 = base[2];
    for (size_t j = 0; j < n; j++)
        bad[j] = double_value(s1[j] - b1, s2[j] - b2, bits, 0, &out[j]) | (s0[j] - b0);
}

/* quick_values for each rounding, as functions of their own: on x86-64
 * Linux GCC and clang also build an AVX2 copy, which the loader picks on
 * a CPU that has it (target_clones; the same integer and double
 * operations, exact, so the same values). 4 doubles a step instead of 2:
 * a (1, 768) float32 backward call 6.9 us instead of 8.0. */
#if defined(__x86_64__) && defined(__linux__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define LN_ACC_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#if !defined(LN_ACC_CLONES)
#define LN_ACC_CLONES
#endif

LN_ACC_CLONES static void quick_values_53(const ln_acc *a, size_t j0, size_t n,
                                          const uint64_t base[LN_ACC_LEVELS], double *out,
                                          uint64_t *bad)
{
    quick_values(a, j0, n, base, 53, out, bad);
}

LN_ACC_CLONES static void quick_values_24(const ln_acc *a, size_t j0, size_t n,
                                          const uint64_t base[LN_ACC_LEVELS], double *out,
                                          uint64_t *bad)
{
    quick_values(a, j0, n, base, 24, out, bad);
}

/* Feature j by the general path. */
static double feature_value(ln_acc *a, size_t j, const uint64_t base[LN_ACC_LEVELS], int bits)
{
    unsigned f = a->flags[j];
    double v;
    if (f == 0 && !a->plain && unspilled_value(a, j, base, bits, &v))
        return v;
    if ((f & LN_ACC_NAN) || ((f & LN_ACC_PINF) && (f & LN_ACC_NINF)))
        return NAN;
    if (f & LN_ACC_PINF)
        return INFINITY;
    if (f & LN_ACC_NINF)
        return -INFINITY;
    if ((f & LN_ACC_HUGE) || a->plain)
        return exact_value(a, j, base, 53) + a->huge[j];
    return exact_value(a, j, base, bits);
}

/* ln_acc_value into doubles (out), or rounded to 24 bits into floats
 * (fout, exact): a float32 call's values had gone through a temporary
 * array of d doubles, fresh pages for a long record ((1, 65536) float32
 * backward: about a fifth of its time in their page faults). */
static void values_into(ln_acc *a, double *out, float *fout, int bits)
{
    /* Read without a spill: a call of a few records writes no totals. */
    uint64_t base[LN_ACC_LEVELS];
    level_bases(a, base);
    int quick = !a->spilled && !a->plain && (bits == 53 || bits == 24);
    /* Into arrays of this frame, which nothing else can point into: a
     * loop storing into `out` had been checked for overlaps with the
     * sums at run time, and run scalar. One loop per rounding (bits a
     * constant in each). */
    double val[LN_QUICK_CHUNK];
    uint64_t bad[LN_QUICK_CHUNK];
    for (size_t j0 = 0; j0 < a->d; j0 += LN_QUICK_CHUNK) {
        size_t n = a->d - j0 < LN_QUICK_CHUNK ? a->d - j0 : LN_QUICK_CHUNK;
        if (!quick) {
            for (size_t j = 0; j < n; j++)
                val[j] = feature_value(a, j0 + j, base, bits);
        } else {
            if (bits == 53)
                quick_values_53(a, j0, n, base, val, bad);
            else
                quick_values_24(a, j0, n, base, val, bad);
            /* Most chunks need no general path: one vector pass finds
             * that, where the choice element by element took a fifth of a
             * (1, 768) float32 backward call. */
            uint64_t any = 0;
            for (size_t j = 0; j < n; j++)
                any |= bad[j] | a->flags[j0 + j];
            for (size_t j = 0; any && j < n; j++)
                if (bad[j] | a->flags[j0 + j])
                    val[j] = feature_value(a, j0 + j, base, bits);
        }
        if (fout) {
            for (size_t j = 0; j < n; j++)
                fout[j0 + j] = (float)val[j];
        } else {
            memcpy(out + j0, val, n * sizeof *val);
        }
    }
}

void ln_acc_value(ln_acc *a, double *out, int bits) { values_into(a, out, NULL, bits); }

void ln_acc_value_float(ln_acc *a, float *out) { values_into(a, NULL, out, 24); }

/* Read without a spill, like ln_acc_value: a call of a few records then
 * writes no totals, and the state is one pass over the sums ((1, 768)
 * float32 backward: the spill, then the export, had been half of the
 * call's 12 us). */
void ln_acc_export(const ln_acc *a, uint64_t *words)
{
    uint64_t base[LN_ACC_LEVELS];
    level_bases(a, base);
    for (size_t j = 0; j < a->d; j++) {
        uint64_t *w = words + j * LN_ACC_STATE_WORDS;
        ln_i128 t[LN_ACC_LEVELS];
        level_totals(a, j, base, t);
        for (int l = 0; l < LN_ACC_LEVELS; l++) {
            w[2 * l] = t[l].lo;
            w[2 * l + 1] = (uint64_t)t[l].hi;
        }
        w[2 * LN_ACC_LEVELS] = a->flags[j];
        memcpy(&w[2 * LN_ACC_LEVELS + 1], &a->huge[j], sizeof(double));
    }
}

/* Word i of a state, wherever it lies (memcpy: no alignment assumed). */
static uint64_t state_word(const unsigned char *words, size_t i)
{
    uint64_t w;
    memcpy(&w, words + i * sizeof w, sizeof w);
    return w;
}

void ln_acc_import(ln_acc *a, const void *words)
{
    a->used = 1;
    a->scalar = 1;
    ln_acc_spill(a);
    totals_ready(a);
    for (size_t j = 0; j < a->d; j++) {
        const unsigned char *w = (const unsigned char *)words +
                                 j * LN_ACC_STATE_WORDS * sizeof(uint64_t);
        for (int l = 0; l < LN_ACC_LEVELS; l++) {
            a->total[j * LN_ACC_LEVELS + l].lo = state_word(w, 2 * l);
            a->total[j * LN_ACC_LEVELS + l].hi = (int64_t)state_word(w, 2 * l + 1);
        }
        a->flags[j] = (uint8_t)state_word(w, 2 * LN_ACC_LEVELS);
        uint64_t huge = state_word(w, 2 * LN_ACC_LEVELS + 1);
        memcpy(&a->huge[j], &huge, sizeof(double));
    }
}
