/*
 * ln_tmpl.h - what the kernel template shares, and how it is put together.
 *
 * Every instruction-set level is one translation unit (ln_scalar.c,
 * ln_portable.c, ln_avx2.c, ln_avx512.c) that sets its compiler target and
 * includes ln_level.h. ln_level.h instantiates the template once per
 * (storage type, compute type) pair:
 *
 *   ln_ref.h or ln_lane.h   the primitives (sums and the output pass), as
 *                           plain reference loops or in lane form
 *   ln_elem.h               the element formulas both of them use
 *   ln_record.h             a record's statistics and output from them
 *
 * and then, once per storage type, ln_ops.h: the record kernels of the ops
 * (fallback decisions, NaN records), which become the level's kernel table.
 *
 * Template parameters, defined by ln_level.h around each inclusion:
 *   LN_S           C type of a stored row element
 *   LN_T           compute type: float or double
 *   LN_P           C type of weight/bias as kernels receive them
 *   LN_LOAD(p)     the element at p as LN_T, exactly
 *   LN_STORE(p, v) store LN_T v at p, rounded once to nearest even
 *   LN_DB_ON_GRID  1 when every row value lies on the exact sums' level-1
 *                  grid (float16 rows): see ln_deposit_db; else 0
 *   LN_FN(name)    the instance's name for a function
 *
 * This header itself is an ordinary header: helpers for every instance.
 */
#ifndef LN_TMPL_H
#define LN_TMPL_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "layernorm.h"
#include "ln_half.h"

/* Inlined whatever the compiler's size heuristics say: the loops that
 * must be specialized for constant arguments (no gain, no bias, no
 * streaming) and vectorized in place. */
#if defined(__GNUC__) || defined(__clang__)
#define LN_ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define LN_ALWAYS_INLINE static inline
#endif

/* Kept out of line, where inlining cost the vectorized form. */
#if defined(__GNUC__) || defined(__clang__)
#define LN_NOINLINE __attribute__((noinline))
#else
#define LN_NOINLINE
#endif

/* One fused multiply-add in the compute type (fmaf or fma). */
#define LN_FMA(a, b, c) _Generic((a), float: fmaf, default: fma)((a), (b), (c))

/* Fully unrolled loops, so that the vector levels keep the lanes in
 * registers (the loops' bounds are compile-time constants). */
#if defined(__GNUC__) && !defined(__clang__)
#define LN_UNROLL _Pragma("GCC unroll 32")
#else
#define LN_UNROLL
#endif

/* Combine the total lanes by the fixed pairwise tree (ln_contract.h, 3). */
static inline double ln_tree_sum(double lanes[LN_LANES])
{
    LN_UNROLL
    for (size_t h = LN_LANES / 2; h >= 1; h /= 2)
        LN_UNROLL
        for (size_t j = 0; j < h; j++)
            lanes[j] += lanes[j + h];
    return lanes[0];
}

/* Ask for the cache lines of [p, p + bytes) ahead of their use (rows
 * contiguous in memory, as the record kernels' are). */
static inline void ln_prefetch(const char *p, size_t bytes)
{
#if defined(__GNUC__) || defined(__clang__)
    for (size_t off = 0; off < bytes; off += 64)
        __builtin_prefetch(p + off, 0, 3);
#else
    (void)p;
    (void)bytes;
#endif
}

/* How far ahead of its reads the statistics pass of a long record in a
 * large call asks for lines of the same record (ln_ops.h, stats_ahead).
 * The hardware prefetcher appears to start over at each 4 KiB page, so a
 * record read from memory waited for lines once per page: the statistics
 * pass took two thirds of a float32 (16384, 4096) out= call, twice a
 * plain read of the same bytes. Asked for 4 KiB ahead, out=, 1 thread,
 * against the output pass asking for the whole next record (as it still
 * does for rows below 8 KiB): float32 (16384, 4096) 0.71-0.73x the time
 * (1.07x np.copyto instead of 1.46-1.52x), (8192, 3072) 0.71-0.79x,
 * (16384, 2048) 0.90-0.93x; float64 (8192, 4096) 0.86-0.87x, (16384,
 * 1024) 0.92-0.94x; float16 (16384, 4096) 0.79-0.81x, bfloat16 0.82x;
 * RMSNorm float32 (16384, 4096) 0.83x; the avx2 level's float32 (16384,
 * 4096) 0.87x. An earlier form, a lane row at a time and past the
 * record's end, timed in separate processes: 1 KiB ahead 1.16-1.21x
 * copyto, 4 KiB 1.03-1.13x, 8 KiB 1.10-1.11x. Now a block at a time and
 * inside the record only, so nothing past the array is asked for. */
#define LN_STATS_AHEAD 4096

/* The lines of [at, at + bytes) of a record of `end` bytes at x, moved
 * LN_STATS_AHEAD bytes ahead, when they are still inside the record. */
static inline void ln_prefetch_ahead(const void *x, size_t at, size_t bytes, size_t end)
{
    if (at + LN_STATS_AHEAD + bytes <= end)
        ln_prefetch((const char *)x + at + LN_STATS_AHEAD, bytes);
}

static inline int ln_eps_is_valid(double eps)
{
    /* false for NaN and inf; & rather than && (the same value), so that
     * loops of it across records have no branches */
    return (eps >= 0.0) & (eps <= DBL_MAX);
}

/* 1 / sqrt(var + eps) in double, so float16/float32 records never see eps
 * rounded to their precision; NaN for an invalid eps. When var + eps
 * overflows (eps near DBL_MAX) the same value at a quarter: the scaling by
 * 4 and 2 is exact, so no bit differs from the unbounded formula, where
 * 1/sqrt(inf) = 0 would erase the record. */
static inline double ln_inverse_std(double var, double eps)
{
    if (!ln_eps_is_valid(eps))
        return NAN;
    double s = var + eps;
    if (s > DBL_MAX)
        return 0.5 / sqrt(var * 0.25 + eps * 0.25);
    return 1.0 / sqrt(s);
}

/* NaN statistics as the canonical quiet NaN, whatever payload the sums
 * carried: payload propagation depends on operand order. */
static inline void ln_canonical_nans(ln_stats *st)
{
    if (isnan(st->mean))
        st->mean = NAN;
    if (isnan(st->var))
        st->var = NAN;
}

/* A record whose statistics are NaN (a NaN or infinities among its
 * values), or whose eps is invalid, is all NaN. So is a constant record
 * with eps = 0 (0/0), which the output paths detect (ln_ops.h). All are
 * written as the canonical quiet NaN: the NaN arithmetic would make
 * differs between machines (x86's default NaN is negative, aarch64's
 * positive). */
static inline int ln_record_is_nan(const ln_stats *st, double eps)
{
    return isnan(st->mean) || isnan(st->var) || !ln_eps_is_valid(eps);
}

/* double -> float rounded to odd: exact values stay, others get their last
 * bit set. Rounding that to a 16-bit type (8 or 11 significant bits, far
 * fewer than float's 24) gives the double rounded once. */
static inline float ln_double_to_float_odd(double v)
{
    float f = (float)v;
    uint32_t u = ln_float_bits(f);
    /* Without branches: a call to nextafterf and a branch on every
     * element of the double instances' dx loops had made a (64, 768)
     * backward of zero rows take 1237 us in float16 (now 516), 1188 in
     * bfloat16 (303). Rounded away from zero: step back one unit of the
     * magnitude (from infinity, the largest float); then, inexact, the
     * last bit set. NaN stays. The same floats as the branches gave (2.5e8
     * doubles compared: edges, halfway cases, floats +- a few units). */
    u -= (uint32_t)(fabs((double)f) > fabs(v));
    u |= (uint32_t)((double)f != v && !isnan(v));
    return ln_bits_float(u);
}

/* Item 5's test of a shift c, from dm = mean - c and var = (sum of
 * squares around c) / d - dm^2: c within a standard deviation of the
 * mean, so the subtraction lost at most a bit, and var finite (false for
 * NaN). The forward's one pass and the backward's (item 10) keep c on it. */
static inline int ln_shift_kept(double dm, double var)
{
    return dm * dm <= var && var <= DBL_MAX;
}

/* The backward's sums over one record (t = x - m0, g = dy * weight): sum
 * of t, of t^2, of g and of g * t in the contract's order, and the largest
 * |dy| and |t| (which only choose how the terms are deposited). */
typedef struct {
    double st, stt, g, gt;
    double max_dy, max_t;
} ln_back_sums;

/* Do a record's sums around m0 show a constant record: every x equal to
 * m0 (max |x - m0| = 0; a NaN, which the maximum skips, makes the sum of
 * t NaN), and m0 finite? Then m0 is its forward mean, and these are the
 * sums around it (ln_ops.h's backward takes no other pass for it). */
static inline int ln_back_constant(const ln_back_sums *s, double m0)
{
    return s->max_t == 0.0 && isfinite(m0) && isfinite(s->st);
}

/* The records of a short group (ln_lane.h: short records are done that
 * many at a time). */
#define LN_SHORT_GROUP 16

/* The backward sums of a short group's records, an array of each field
 * (their coefficients are computed across the group), with each record's
 * forward first-pass mean (LayerNorm without given means; else 0): filled
 * by ln_lane.h's back_group or by a level's own loop (ln_x86.h). */
typedef struct {
    double mean[LN_SHORT_GROUP];
    double st[LN_SHORT_GROUP], stt[LN_SHORT_GROUP], g[LN_SHORT_GROUP], gt[LN_SHORT_GROUP];
    double max_dy[LN_SHORT_GROUP], max_t[LN_SHORT_GROUP];
} ln_back_group_sums;

/* Record k's sums of a short group. */
static inline ln_back_sums ln_back_group_sums_at(const ln_back_group_sums *s, size_t k)
{
    return (ln_back_sums){.st = s->st[k], .stt = s->stt[k], .g = s->g[k], .gt = s->gt[k],
                          .max_dy = s->max_dy[k], .max_t = s->max_t[k]};
}

/* How a record's parameter-gradient terms are deposited: all three levels,
 * the lower two (every term below LN_ACC_SMALL), or one by one (a huge or
 * non-finite term). Every way gives the same sums. */
enum { LN_DEPOSIT_3 = 0, LN_DEPOSIT_2 = 1, LN_DEPOSIT_SCALAR = 2, LN_DEPOSIT_PLAIN = 3 };

/* A record's backward statistics and coefficients, in double: its mean
 * and variance refined from the sums around the shift m0 (exact enough
 * whatever the offset, since m0 is within a standard deviation of the
 * mean, or within a float of it: ln_contract.h, item 10),
 * rstd = 1/sqrt(var + eps), a = mean(g), bm = mean(g * xhat). */
typedef struct {
    double mean, var, rstd, a, bm, md;
} ln_back_coef;

/* ln_inverse_std, or with `common` (a constant where it is inlined) its
 * common case, for a caller that has checked eps valid and will check var
 * + eps finite: then the same value, without branches (the short groups
 * compute sixteen records' coefficients as vectors). */
static inline double ln_inverse_std_if(double var, double eps, int common)
{
    return common ? 1.0 / sqrt(var + eps) : ln_inverse_std(var, eps);
}

/* The coefficients (ln_contract.h, items 10 and 11), arithmetic only
 * (`common`: see ln_inverse_std_if) ... */
static inline void ln_back_coef_values(const ln_back_sums *s, double m0, size_t d, double eps,
                                       ln_back_coef *c, int common)
{
    double md = s->st / (double)d;
    double var = s->stt / (double)d - md * md;
    c->md = md;
    c->mean = m0 + md;
    c->var = var > 0.0 ? var : 0.0;
    c->rstd = ln_inverse_std_if(c->var, eps, common);
    c->a = s->g / (double)d;
    c->bm = c->rstd * (s->gt - md * s->g) / (double)d;
}

/* ... and what they tell of the record: 1 if it is finite, 0 if its x is
 * not (or it is constant with eps = 0: 0/0), -1 if only its dy (or
 * dy * weight) is not. The tests are written with & rather than && (the
 * same values) so that a loop of them across a group has no branches and
 * vectorizes. */
static inline int ln_back_x_finite(const ln_back_sums *s, const ln_back_coef *c)
{
    return isfinite(s->st + s->stt) & isfinite(c->mean) & !(c->rstd > DBL_MAX);
}

static inline int ln_back_dy_finite(const ln_back_sums *s) { return isfinite(s->g + s->gt); }

static inline int ln_back_coef_class(const ln_back_sums *s, const ln_back_coef *c)
{
    if (!ln_back_x_finite(s, c))
        return 0;
    return ln_back_dy_finite(s) ? 1 : -1;
}

static inline int ln_back_coef_of(const ln_back_sums *s, double m0, size_t d, double eps,
                                  ln_back_coef *c)
{
    ln_back_coef_values(s, m0, d, eps, c, 0);
    return ln_back_coef_class(s, c);
}

/* RMSNorm's coefficients: mean 0, var the mean square (sum of x^2 / d),
 * a = 0 (no mean to subtract), bm = mean(g * xhat) = rstd * sum(g x) / d;
 * the same classes as LayerNorm's. */
static inline void ln_rms_coef_values(const ln_back_sums *s, size_t d, double eps,
                                      ln_back_coef *c, int common)
{
    c->md = 0.0;
    c->mean = 0.0;
    c->var = s->stt / (double)d;
    c->rstd = ln_inverse_std_if(c->var, eps, common);
    c->a = 0.0;
    c->bm = c->rstd * s->gt / (double)d;
}

static inline int ln_rms_x_finite(const ln_back_sums *s, const ln_back_coef *c)
{
    return isfinite(s->stt) & !(c->rstd > DBL_MAX);
}

static inline int ln_rms_dy_finite(const ln_back_sums *s) { return isfinite(s->gt); }

static inline int ln_rms_coef_class(const ln_back_sums *s, const ln_back_coef *c)
{
    if (!ln_rms_x_finite(s, c))
        return 0;
    return ln_rms_dy_finite(s) ? 1 : -1;
}

static inline int ln_rms_coef_of(const ln_back_sums *s, size_t d, double eps, ln_back_coef *c)
{
    ln_rms_coef_values(s, d, eps, c, 0);
    return ln_rms_coef_class(s, c);
}

/* A bound on the record's |xhat| <= (max|x - m0| + |mean - m0|) * rstd
 * (1% for the roundings of the float formulas). */
static inline double ln_xhat_bound(const ln_back_sums *s, const ln_back_coef *c)
{
    return (s->max_t + fabs(c->md)) * c->rstd * 1.01 + 1.0;
}

/* Can a type whose finite values lie in [min, max] (min: its smallest
 * normal) compute dx = fma(-xhat, bm, g - a) * r? Only when r is normal
 * there (a subnormal r has lost digits) and when no intermediate can
 * overflow: |g - a| + |xhat * bm| <= |dy| * w_max + |a| + xhat * |bm|
 * (w_max bounds |weight|). Then the formulas make no infinity that dx
 * does not have, and no NaN from finite inputs (inf - inf, 0 * inf),
 * whose sign would be up to the machine. False for NaN coefficients. */
static inline int ln_back_fits(const ln_back_sums *s, const ln_back_coef *c, double w_max,
                               double min, double max)
{
    double xh = ln_xhat_bound(s, c);
    double p = (s->max_dy * w_max + fabs(c->a) + xh * fabs(c->bm)) * 1.01;
    return (c->rstd >= min) & (c->rstd <= max) & (p <= max);
}

/* How many levels a record's terms need on the vector path, from bounds
 * on its terms |dy| and |dy * xhat| (ln_xhat_bound): 2, 3, or 0 (a term
 * too large for the vector path, or NaN). */
static inline int ln_deposit_levels(const ln_back_sums *s, const ln_back_coef *c)
{
    double term = s->max_dy * ln_xhat_bound(s, c);
    int two = (s->max_dy < LN_ACC_SMALL) & (term < LN_ACC_SMALL);
    int three = (s->max_dy < LN_ACC_LIMIT) & (term < LN_ACC_LIMIT);
    return three * (3 - two); /* LN_ACC_SMALL < LN_ACC_LIMIT: two implies three */
}

/* The deposit path of a record. LN_DEPOSIT_PLAIN: the benchmark's
 * baseline of plain float64 sums (ln_acc.plain), never the library's. */
static inline int ln_deposit_path(const ln_back_sums *s, const ln_back_coef *c,
                                  const ln_acc *dw)
{
    if (dw && dw->plain)
        return LN_DEPOSIT_PLAIN;
    int levels = ln_deposit_levels(s, c);
    return levels == 2 ? LN_DEPOSIT_2 : levels == 3 ? LN_DEPOSIT_3 : LN_DEPOSIT_SCALAR;
}
/* What a lane-form backward loop deposits: nothing, both sums on three or
 * on two levels, only dweight's (RMSNorm has no bias), or the benchmark's
 * plain float64 sums (both, or dweight's alone). Always a constant
 * at each call, so that every loop is compiled without a test per element. */
enum { LN_BACK_NONE = 0, LN_BACK_3 = 1, LN_BACK_2 = 2, LN_BACK_PLAIN = 3, LN_BACK_W3 = 4,
       LN_BACK_W2 = 5, LN_BACK_WPLAIN = 6 };

/* The levels of a term, vector path: round(v / grid) into each level's
 * bits sum (see ln_accum.h). The lower two levels of |v| < 2^13. */
LN_ALWAYS_INLINE void ln_deposit2(uint64_t *restrict s1, uint64_t *restrict s2, size_t i,
                                  double v)
{
    double t = v + LN_ACC_C1;
    s1[i] += ln_acc_bits(t);
    s2[i] += ln_acc_bits(v + (LN_ACC_C12 - t));
}

/* The top level's share of v into s0; returns the remainder
 * (|v - h| <= 2^13), which goes down. */
LN_ALWAYS_INLINE double ln_deposit_top(uint64_t *restrict s0, size_t i, double v)
{
    double t = v + LN_ACC_C0;
    s0[i] += ln_acc_bits(t);
    return v - (t - LN_ACC_C0);
}

/* All three levels. */
LN_ALWAYS_INLINE void ln_deposit3(uint64_t *restrict s0, uint64_t *restrict s1,
                                  uint64_t *restrict s2, size_t i, double v)
{
    ln_deposit2(s1, s2, i, ln_deposit_top(s0, i, v));
}

/* dbias's term u (that is, dy) into the `levels` lowest levels, or, with
 * on_grid (a constant: the instance's rows are float16), into the levels
 * above the lowest: every float16 value is a multiple of 2^-24, on level
 * 1's grid of 2^-36, so its remainder there is exactly 0 and the lowest
 * level would only get bits(C2) per term, which its count then takes
 * back (ln_acc_count_above counts such terms). The same sums. */
LN_ALWAYS_INLINE void ln_deposit_db(uint64_t *restrict s0, uint64_t *restrict s1,
                                    uint64_t *restrict s2, size_t i, double u, int levels,
                                    int on_grid)
{
    if (!on_grid) {
        if (levels == 3)
            ln_deposit3(s0, s1, s2, i, u);
        else
            ln_deposit2(s1, s2, i, u);
        return;
    }
    if (levels == 3)
        u = ln_deposit_top(s0, i, u);
    s1[i] += ln_acc_bits(u + LN_ACC_C1);
}

/* A record's (or a group record's) dbias deposits counted. */
static inline void ln_acc_count_db(ln_acc *db, int levels, int on_grid)
{
    if (on_grid)
        ln_acc_count_above(db, levels);
    else
        ln_acc_count(db, levels);
}

/* The rows of a group of records (float32 or float16, as the loop's
 * instance has them) and their float coefficients, as a level's group
 * loops take them (ln_x86.h's ln_back_group_nv). */
typedef struct {
    const void *const *x, *const *dy; /* the m records' rows */
    void *const *dx;                    /* written by the apply loop only */
    const float *w;                      /* the gain (ones without one), apply only */
    const float *hi, *r, *c, *a, *bm;    /* per record: normalize's and grad_input's */
    /* The next group's an records (0: none) to ask for ahead: their
     * first rows in x and dy, the rows' strides, and half a row in
     * features (a multiple of 16: whole lines). */
    const char *ax, *ady;
    ptrdiff_t ax_row, ady_row;
    size_t an, half;
} ln_group_rows;

/* A spare row of `bytes` bytes (64-byte aligned) for the rare paths of a
 * record kernel, allocated on first use per worker (ln_batch.c); NULL if
 * memory cannot be had. */
void *ln_spare_row(ln_spare *spare, size_t bytes);

#endif /* LN_TMPL_H */
