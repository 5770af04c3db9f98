/*
 * ln_accum.h - exact, order-independent sums across records: the
 * parameter gradients of the backward passes (dweight = sum of dy * xhat,
 * dbias = sum of dy, per feature).
 *
 * Every term (a double) is rounded to nearest even on a fixed grid of
 * 2^-86, in three levels of 50 bits (grids 2^14, 2^-36, 2^-86): each level
 * takes round(v / grid) and passes the exact remainder down. Each level
 * sums its integers exactly (64-bit sums, spilled into 128-bit totals
 * before they could overflow). The total is therefore
 *     sum over terms of round(term / 2^-86) * 2^-86,
 * exactly, whatever the order of the terms, the threads, the layout or the
 * chunking (two accumulators merge exactly), and it is rounded to double
 * once, at the end. Terms of magnitude 2^64 or more, and non-finite ones,
 * are rare and take a scalar path (NaN and infinities propagate as in a
 * plain sum; finite terms that large are summed in plain double, the one
 * case whose bits may depend on the order).
 *
 * Depositing a level costs an add, an integer add and two subtractions
 * per term: t = v + C with C = 1.5 * 2^(52 + e) puts round(v / 2^e) in the
 * low bits of t (bits(t) = bits(C) + round(v / 2^e) for |v| < 2^(51 + e)),
 * so the level sums bits(t) and subtracts count * bits(C) when it spills.
 * Terms that lie on a level's grid leave nothing below it: float16's
 * dbias terms (multiples of 2^-24, on the grid 2^-36) skip the lowest
 * level, uncounted there (ln_acc_count_above).
 */
#ifndef LN_ACCUM_H
#define LN_ACCUM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define LN_ACC_LEVELS 3
#define LN_ACC_WIDTH 50 /* bits between the levels' grids */
#define LN_ACC_TOP_EXP 14 /* the top level's grid: 2^14 */

/* The magic constants 1.5 * 2^(52 + e) of the levels' grids 2^e. */
#define LN_ACC_C0 0x1.8p66
#define LN_ACC_C1 0x1.8p16
#define LN_ACC_C2 0x1.8p-34
/* C1 + C2, exact (52 bits). For t = v + C1 = C1 + h (h = round(v / 2^-36)
 * * 2^-36), C12 - t is C2 - h exactly, so v + (C12 - t) is the
 * remainder v - h plus C2, rounded once: the lower level's t, one
 * operation shorter than forming the remainder first. */
#define LN_ACC_C12 (LN_ACC_C1 + LN_ACC_C2)
/* Terms below this magnitude take the vector path (the top level needs
 * |v| < 2^(51 + 14)). Terms below LN_ACC_SMALL round to 0 at the top
 * level (|v| / 2^14 <= 1/2, ties to even), so a row whose terms all are
 * deposits only the other two levels. */
#define LN_ACC_LIMIT 0x1p64
#define LN_ACC_SMALL 0x1p13
/* Deposits between spills: 2^11 terms of up to 2^51 fit in 63 bits. */
#define LN_ACC_SPILL 2048

_Static_assert(LN_ACC_LEVELS == 3, "the deposit code is written for three levels");
/* Floating comparisons are no integer constant expressions: GCC folds them
 * (an extension), clang rejects them ("not an integral constant
 * expression"), so this one is checked by GCC builds only. */
#if defined(__GNUC__) && !defined(__clang__)
_Static_assert(LN_ACC_C0 == 0x1.8p52 * 0x1p14 && LN_ACC_C1 == LN_ACC_C0 * 0x1p-50 &&
                   LN_ACC_C2 == LN_ACC_C1 * 0x1p-50,
               "level grids 2^14, 2^-36, 2^-86, LN_ACC_WIDTH bits apart");
_Static_assert(LN_ACC_C12 - LN_ACC_C1 == LN_ACC_C2, "C1 + C2 is exact");
#endif
/* Deposits a caller may count past the spill point before it checks
 * (ln_acc_count: a group of records finished together). */
#define LN_ACC_OVERSHOOT 64
/* (LN_ACC_SPILL + LN_ACC_OVERSHOOT) * 2^51 < 2^63 */
_Static_assert(LN_ACC_SPILL + LN_ACC_OVERSHOOT < (1ll << (63 - 51)),
               "spill before a level sum overflows");

/* Per-feature flags of the scalar path. */
#define LN_ACC_NAN 1u
#define LN_ACC_PINF 2u
#define LN_ACC_NINF 4u
#define LN_ACC_HUGE 8u

/* A 128-bit two's complement integer. */
typedef struct {
    uint64_t lo;
    int64_t hi;
} ln_i128;

/* The sums of one quantity (dweight or dbias) over d features. */
typedef struct {
    size_t d;
    uint64_t count[LN_ACC_LEVELS];     /* vector deposits per level since the last spill */
    uint64_t *sum[LN_ACC_LEVELS];      /* bits(t) summed mod 2^64, d each */
    ln_i128 *total;                    /* d x LN_ACC_LEVELS spilled totals; zeroed
                                        * at the first spill (a call of a few records
                                        * never touches them) */
    int spilled;                       /* the totals hold something */
    uint8_t *flags;                    /* d: LN_ACC_* of the scalar path */
    double *huge;                      /* d: plain sum of finite terms >= LN_ACC_LIMIT */
    void *block;                       /* the memory of all of the above */
    int plain;                         /* benchmark baseline only: plain float64
                                        * sums in `huge`, in record order */
    int used;                          /* anything deposited, merged or imported:
                                        * while 0 the sums are all zero */
    int scalar;                        /* flags or huge may be nonzero (while 0
                                        * and not plain, ln_acc_clear leaves them) */
} ln_acc;

/* Allocate and zero (0, or -1 without memory); free. */
int ln_acc_init(ln_acc *a, size_t d);
void ln_acc_free(ln_acc *a);

/* Zero an allocated accumulator again, for reuse with the same d: only
 * the level sums that hold deposits (count nonzero), and the flags and
 * huge sums once used (a call of a few records clears two levels, not
 * everything: (1, 16384) float32 backward, a sixth of its time). */
void ln_acc_clear(ln_acc *a);

/* Move the level sums into the totals (call when a count reaches
 * LN_ACC_SPILL, and before reading or merging). */
void ln_acc_spill(ln_acc *a);

/* After a record's vector deposits into the lowest `levels` levels:
 * counted; then, once every record of its group is counted, spilled if
 * due. Records whose deposits are interleaved (a group done a column
 * chunk at a time) are all counted before the spill check: a spill
 * subtracts count * bits(C) from sums that must hold exactly the counted
 * deposits. Such a group has at most LN_ACC_OVERSHOOT records. */
static inline void ln_acc_count_n(ln_acc *a, int levels, unsigned records)
{
    a->used = 1;
    for (int l = LN_ACC_LEVELS - levels; l < LN_ACC_LEVELS; l++)
        a->count[l] += records;
}

static inline void ln_acc_count(ln_acc *a, int levels) { ln_acc_count_n(a, levels, 1); }

/* The same for a quantity whose terms all lie on the grid of the level
 * above the lowest: their remainders there are 0, so they skip it
 * (ln_tmpl.h's ln_deposit_db), and it is not counted. */
static inline void ln_acc_count_above(ln_acc *a, int levels)
{
    a->used = 1;
    for (int l = LN_ACC_LEVELS - levels; l < LN_ACC_LEVELS - 1; l++)
        a->count[l]++;
}

/* Due when either of the lowest two levels (every vector deposit counts
 * the one above the lowest) is full. */
static inline void ln_acc_spill_if_due(ln_acc *a)
{
    if (a->count[LN_ACC_LEVELS - 2] >= LN_ACC_SPILL || a->count[LN_ACC_LEVELS - 1] >= LN_ACC_SPILL)
        ln_acc_spill(a);
}

/* One term of feature j on the scalar path (any value). */
void ln_acc_deposit_one(ln_acc *a, size_t j, double v);

/* dst += src, exactly (src is spilled first; both of the same d). While
 * dst is unused the two swap contents instead: the same sums, without the
 * pass over d (a batch on one thread merges one worker into the job's). */
void ln_acc_merge(ln_acc *dst, ln_acc *src);

/* The sums, each rounded once to nearest even to `bits` significant bits:
 * 53 for double results, 24 for float ones (then exact as a float). */
void ln_acc_value(ln_acc *a, double *out, int bits);

/* The same rounded to 24 bits, stored as floats (exactly). */
void ln_acc_value_float(ln_acc *a, float *out);

/* The state as LN_ACC_STATE_WORDS 64-bit words per feature (the levels'
 * exact totals, as a spill would leave them; a is not changed), and back:
 * what the Python layer keeps and merges. The words
 * read back may lie at any address (a state unpickled into a buffer at
 * an odd offset, as dask's workers do). */
#define LN_ACC_STATE_WORDS (2 * LN_ACC_LEVELS + 2)
void ln_acc_export(const ln_acc *a, uint64_t *words);
void ln_acc_import(ln_acc *a, const void *words);

/* bits(v) as an integer, for the vector deposit loops. */
static inline uint64_t ln_acc_bits(double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

#endif /* LN_ACCUM_H */
