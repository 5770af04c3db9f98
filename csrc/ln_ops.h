/*
 * ln_ops.h - the record kernels of one storage type: which instance
 * computes a record (ln_contract.h, item 8) and the NaN records (item 9).
 * Part of the kernel template (see ln_tmpl.h), included once per storage
 * type with:
 *   LN_S, LN_P     as for the instances
 *   LN_CORE(f)     the instance in the record's compute type
 *   LN_WIDE(f)     float-computed types only: the same formulas in double
 *   LN_OPS(f)      names of this storage type's record kernels
 * No include guard.
 */

/* The core instance's compute type. */
#if defined(LN_WIDE)
#define LN_CT float
#define LN_CT_MIN FLT_MIN
#define LN_CT_MAX FLT_MAX
#else
#define LN_CT double
#define LN_CT_MIN DBL_MIN
#define LN_CT_MAX DBL_MAX
#endif

/* Is 1/std one the core instance computes with? For the float types, a
 * normal float (a subnormal 1/std, from a huge eps, has lost digits); for
 * float64, nonzero and not above DBL_MAX (else the record is computed at
 * its scale). */
static inline int LN_OPS(rstd_fits)(double rstd)
{
#if defined(LN_WIDE)
    return (rstd >= FLT_MIN) & (rstd <= FLT_MAX);
#else
    return (rstd != 0.0) & !(rstd > DBL_MAX);
#endif
}

/* Is the record, whose statistics came out with variance 0, one of equal
 * finite values (of zeros, for RMSNorm)? A variance of 0 alone does not
 * tell one: the squares of a tiny spread underflow. Its centered values
 * are exact zeros, so the fallbacks of a variance out of range (double
 * lanes, the scaled record) give its statistics and outputs (every
 * v = +-0) bit for bit as the core instance does: a (64, 768) call of
 * zero rows (padding) 2.8x faster in float32, 5.4x in bfloat16, 8.8x in
 * float16, 8x in float64 ((64, 16) 4.5x). */
static int LN_OPS(constant_record)(const LN_S *x, size_t d, const ln_stats *st, int rms)
{
    return st->var == 0.0 && isfinite(st->mean) && LN_CORE(is_constant)(x, d, rms);
}

#if defined(LN_WIDE)
/* ---- computed in float, with the double instance as the fallback ---- */

static void LN_OPS(ln_stats)(const LN_S *x, size_t d, ln_stats *st, int rms, int far)
{
    LN_CORE(stats_of)(x, d, st, rms, far);
    if (!(st->var >= LN_F32_VAR_MIN && st->var <= LN_F32_VAR_MAX) ||
        !isfinite(st->mean)) {
        if (!LN_OPS(constant_record)(x, d, st, rms))
            LN_WIDE(stats_of)(x, d, st, rms, 0);
    }
    ln_canonical_nans(st);
}

/* Can float lanes compute the output? Not when x - mean could overflow
 * float (huge spread), when the centered values could be subnormal (tiny
 * spread), or when 1/std leaves the range of normal floats (a subnormal
 * 1/std, from a huge eps, has lost digits). */
static int LN_OPS(fits_float)(double var, double rstd)
{
    return (var >= LN_F32_VAR_MIN) & (var <= LN_F32_VAR_MAX) & LN_OPS(rstd_fits)(rstd);
}

static int LN_OPS(ln_output)(const LN_S *x, LN_S *y, size_t d, const LN_P *w,
                             const LN_P *b, double eps, const ln_stats *st, int stream,
                             const void *ahead, ln_spare *spare, int rms)
{
    (void)spare;
    (void)rms;
    double rstd = ln_inverse_std(st->var, eps);
    if (rstd > DBL_MAX) { /* var + eps == 0: a constant record, eps = 0 */
        LN_CORE(fill_nan)(y, d);
        return LN_OK;
    }
    /* var 0: a constant record (constant_record; for float storage no
     * square underflows in double, so the fallback's variance is 0 for
     * no other). */
    int constant = st->var == 0.0 && LN_OPS(rstd_fits)(rstd);
    if (LN_OPS(fits_float)(st->var, rstd) || constant)
        LN_CORE(output)(x, y, d, st, rstd, w, b, stream, ahead);
    else
        LN_WIDE(output)(x, y, d, st, rstd, w, b, 0, NULL);
    return LN_OK;
}

#else
/* ---- computed in double, at an exact scale when squares leave the range ---- */

/* Variances below this may have lost digits to underflowing squares. */
#define LN_F64_VAR_MIN 0x1p-960

/* A power of two that brings the record's largest magnitude into [0.5, 1)
 * (unless that needs a scale beyond 2^+-1000, as for subnormal records):
 * multiplying by it is exact, and no square of the scaled values can
 * overflow, or underflow unless it is negligible. 1 for a record of zeros
 * or with a non-finite value. */
static double LN_OPS(record_scale)(const LN_S *x, size_t d)
{
    double m = 0.0;
    int e;
    for (size_t i = 0; i < d; i++) { /* NaN skipped, as fmax (a libm call) did */
        double a = fabs((double)x[i]);
        m = a > m ? a : m;
    }
    if (!(m > 0.0 && m <= DBL_MAX))
        return 1.0;
    frexp(m, &e);
    e = e > 1000 ? 1000 : (e < -1000 ? -1000 : e);
    return ldexp(1.0, -e);
}

/* The record times s, in the spare row (NULL without memory). */
static const LN_S *LN_OPS(scaled_row)(const LN_S *x, size_t d, double s,
                                      ln_spare *spare)
{
    LN_S *row = ln_spare_row(spare, d * sizeof(LN_S));
    if (row != NULL)
        for (size_t i = 0; i < d; i++)
            row[i] = x[i] * s;
    return row;
}

/* Statistics; a record whose squares leave the double range (|x| above
 * about 1e154, or tiny values) is measured at its scale. LN_ENOMEM if the
 * spare row could not be had. */
static int LN_OPS(ln_stats_scaled)(const LN_S *x, size_t d, ln_stats *st,
                                   ln_spare *spare, int rms, int far)
{
    LN_CORE(stats_of)(x, d, st, rms, far);
    if (isfinite(st->mean) && st->var >= LN_F64_VAR_MIN && st->var <= DBL_MAX)
        return LN_OK;
    if (LN_OPS(constant_record)(x, d, st, rms)) /* the same statistics at any scale */
        return LN_OK;
    double s = LN_OPS(record_scale)(x, d);
    if (s != 1.0) {
        const LN_S *xs = LN_OPS(scaled_row)(x, d, s, spare);
        if (xs == NULL)
            return LN_ENOMEM;
        LN_CORE(stats_of)(xs, d, st, rms, 0);
        st->mean /= s;
        st->var = st->var / s / s; /* inf if the true variance is */
    }
    ln_canonical_nans(st);
    return LN_OK;
}

static int LN_OPS(ln_output)(const LN_S *x, LN_S *y, size_t d, const LN_P *w,
                             const LN_P *b, double eps, const ln_stats *st, int stream,
                             const void *ahead, ln_spare *spare, int rms)
{
    double rstd = ln_inverse_std(st->var, eps);
    double s = 1.0;
    /* At the record's scale when 1/std leaves the double range, or when
     * the variance is so small that it lost digits to underflow (unless
     * eps is so large beside it that eps * s^2 overflows: then the
     * variance does not count). */
    /* (A constant record gives every v = +-0 at any scale: not at scale.) */
    int tiny = st->var < LN_F64_VAR_MIN && !LN_OPS(constant_record)(x, d, st, rms);
    if (tiny)
        s = LN_OPS(record_scale)(x, d);
    if ((!tiny || !(eps * s * s <= DBL_MAX)) && LN_OPS(rstd_fits)(rstd)) {
        LN_CORE(output)(x, y, d, st, rstd, w, b, stream, ahead);
        return LN_OK;
    }
    if (!tiny)
        s = LN_OPS(record_scale)(x, d);
    const LN_S *xs = LN_OPS(scaled_row)(x, d, s, spare);
    if (xs == NULL)
        return LN_ENOMEM;
    ln_stats scaled;
    LN_CORE(stats_of)(xs, d, &scaled, rms, 0);
    rstd = ln_inverse_std(scaled.var, eps * s * s);
    if (rstd > DBL_MAX) /* var + eps == 0 even at scale: constant, eps = 0 */
        LN_CORE(fill_nan)(y, d);
    else
        LN_CORE(output)(xs, y, d, &scaled, rstd, w, b, 0, NULL);
    return LN_OK;
}

#endif

/* Short records are done in groups: first the statistics of the whole
 * group, then its outputs. Each record's statistics are a chain of
 * dependent operations (sum, divide, sum of squares, divide, square root,
 * divide); with several independent chains side by side the CPU overlaps
 * them. The group's rows stay in L1 between the two steps. By row size
 * (measured, float32/float16/float64, 1 thread):
 *   up to LN_GROUP_MAX_ROW_BYTES  groups of LN_GROUP (4; groups of 8
 *                                 took 1.02-1.07x the time without the
 *                                 prefetch below: float32 (300000, 100),
 *                                 (4096, 256), float64 (4096, 100));
 *   up to LN_PAIR_MAX_ROW_BYTES   pairs ((64, 768) 5-15% faster than
 *                                 one at a time);
 *   larger                        one at a time.
 * No group asks for the next one's rows ahead (the hardware prefetcher
 * follows the rows): groups of LN_GROUP did, and rows of 4 to 8 KiB
 * asked for the whole next row, until measured without, 1 thread:
 * float32 (300000, 100) 0.79-0.80x the time, (200000, 256) 0.93-0.94x,
 * (4096, 256) 0.92-0.93x, float16 (200000, 256) 0.95-0.96x, float64
 * (100000, 128) 0.94-0.97x; float64 (64, 768) 0.81-0.84x, float32
 * (64, 2000) 0.85x, (1000, 1536) from memory 0.86-0.88x; float16
 * (16384, 4096), float64 (16384, 768), float32 (8192, 2048) level.
 * Large calls ask for the next group's rows a lane row at a time as they
 * write (record_ahead). */
#ifndef LN_GROUP
#define LN_GROUP 4
#define LN_GROUP_MAX_ROW_BYTES 1024
#define LN_PAIR_MAX_ROW_BYTES 4096
#endif

/* Records per group for rows of `row` bytes. */
static size_t LN_OPS(group_size)(size_t row)
{
    if (row <= LN_GROUP_MAX_ROW_BYTES)
        return LN_GROUP;
    return row <= LN_PAIR_MAX_ROW_BYTES ? 2 : 1;
}

/* Does the statistics pass of a record of this call ask for its lines
 * ahead (ln_tmpl.h, LN_STATS_AHEAD)? In large calls, for rows of at
 * least LN_FAR_ROW_BYTES; shorter rows have the output pass ask for the
 * next group instead (record_ahead), and rows of exactly that size both.
 * out=, 1 thread, against record_ahead alone: both, float32 (16384,
 * 2048) 0.90-0.93x the time, float64 (16384, 1024) 0.92-0.94x, but
 * float64 (16384, 768) 1.13x; for rows of 4 to 8 KiB this pass alone
 * cost float64 (16384, 768) 1.21x. In smaller calls, whose rows are in
 * cache, asking cost float32 (128, 4096) 1-4%. */
#define LN_FAR_ROW_BYTES (2 * LN_STATS_AHEAD)
static int LN_OPS(stats_ahead)(const ln_rows *r)
{
    return r->ahead && r->d * sizeof(LN_S) >= LN_FAR_ROW_BYTES;
}

/* The statistics of record k (0, or LN_ENOMEM): LayerNorm's, or (rms)
 * RMSNorm's, whose record is NaN too when it holds a non-finite value. */
static int LN_OPS(record_stats)(const ln_rows *r, size_t k, int rms)
{
    const LN_S *x = (const LN_S *)((const char *)r->x + (ptrdiff_t)k * r->x_row);
    ln_stats *st = &r->st[k];
#if defined(LN_WIDE)
    LN_OPS(ln_stats)(x, r->d, st, rms, LN_OPS(stats_ahead)(r));
#else
    if (LN_OPS(ln_stats_scaled)(x, r->d, st, r->spare, rms, LN_OPS(stats_ahead)(r)) != LN_OK)
        return LN_ENOMEM;
#endif
    if (rms && !isfinite(st->var) && !LN_CORE(all_finite)(x, r->d))
        st->var = NAN;
    return LN_OK;
}

/*
 * Do the lines of the record ahead lie within LN_AHEAD_ALIAS bytes of
 * the outputs y, modulo 4 KiB, for rows of more than 2 and at most 4
 * KiB? Then their prefetches, which the core holds back behind the
 * stores they seem to depend on (4K aliasing), cost more than they
 * save: none are made. out=np.empty_like(x) starts at x's page offset
 * (as two large allocations do), so rows of 4 KiB land there. One
 * thread, out=np.empty_like(x), separate processes, time vs
 * prefetching: float32 (4096, 1024) 0.68x, (16384, 1024) 0.73x;
 * RMSNorm 0.72x, 0.81x; float64 (8192, 512) 0.81x; float16 (8192,
 * 2048) 0.89x. Rows of 2 KiB keep their prefetches (float32 (32768,
 * 512) 1.09x as long without), as do rows of 8 KiB (float32 (8192,
 * 2048) 1.18x at another offset). Asking from 1 KiB further on in the
 * row instead gained less, and cost RMSNorm up to 1.17x.
 */
#ifndef LN_AHEAD_ALIAS
#define LN_AHEAD_ALIAS 512
#define LN_AHEAD_ALIAS_ROWS_MIN 2048
#define LN_AHEAD_ALIAS_ROWS_MAX 4096
#endif
static inline int LN_OPS(ahead_aliases)(const char *y, const char *ahead, size_t row)
{
    size_t dist = ((uintptr_t)y - (uintptr_t)ahead) % 4096;
    return row > LN_AHEAD_ALIAS_ROWS_MIN && row <= LN_AHEAD_ALIAS_ROWS_MAX &&
           (dist <= LN_AHEAD_ALIAS || dist >= 4096 - LN_AHEAD_ALIAS);
}

/* In a large call (r->ahead: an output of 8 MiB or more) with records
 * of up to LN_FAR_ROW_BYTES, each lane
 * row of outputs asks for the same lines of the record one group ahead
 * (into L2), so that the memory reads the next group while this one is
 * written: its statistics pass then finds it in cache. out=, 1 thread,
 * against no such prefetch: float32 (16384, 4096) 0.85-0.87x the time,
 * (8192, 1536) 0.73-0.80x, (16384, 768) 0.81-0.83x, (65536, 384) 0.94x,
 * (4096, 768) level (its input is in L3); float64 (4096, 768) 0.76-0.81x,
 * (65536, 384) 0.82x. Stored plainly (a new output of 32 MiB or more):
 * float16 (16384, 4096) 0.85-0.86x, float32 (8192, 1536) 0.94x,
 * (16384, 4096) level. In smaller calls, whose rows are in cache anyway,
 * it cost float32 (64, 768) and (128, 4096) 10-20%. The whole next row
 * asked for at once (as norm_rows did once) gained nothing for
 * rows this long. Measured again after the one-pass statistics (10e928a):
 * float32 (16384, 4096) out= took the same time with it, without it and
 * with a T0 hint; a plain load of each line instead was 0.94x there and
 * for float64 (8192, 4096), but 1.05-1.08x for float32 (16384, 768) and
 * 1.14x for float16 (16384, 4096). The other shapes above were not
 * measured again. Rows of up to 1 KiB (groups of LN_GROUP) asked for
 * nothing ahead until measured with it: float32 (200000, 256) 0.82-0.86x,
 * (100000, 200) 0.89-0.90x, (300000, 100) 0.98x, float64 (200000, 100)
 * 0.93x, float16 (200000, 256) 0.97-0.98x; float16 (300000, 100) and
 * float32 (1e6, 72) level. Longer records ask for nothing here since
 * their statistics pass asks for its own lines (stats_ahead): for them
 * this prefetch had come to cost, float32 (16384, 4096) out= 1.41-1.54x
 * np.copyto with it, 1.20-1.33x without. */
static const void *LN_OPS(record_ahead)(const ln_rows *r, size_t k)
{
    size_t group = LN_OPS(group_size)(r->d * sizeof(LN_S));
    if (!r->ahead || k + group >= r->n || r->d * sizeof(LN_S) > LN_FAR_ROW_BYTES)
        return NULL;
    const char *ahead = (const char *)r->x + (ptrdiff_t)(k + group) * r->x_row;
    const char *y = (const char *)r->y + (ptrdiff_t)k * r->y_row;
    return LN_OPS(ahead_aliases)(y, ahead, r->d * sizeof(LN_S)) ? NULL : ahead;
}

/* The output of record k from its statistics: LN_OK, LN_EBADEPS or
 * LN_ENOMEM. */
static int LN_OPS(record_output)(const ln_rows *r, size_t k, int rms)
{
    const LN_S *x = (const LN_S *)((const char *)r->x + (ptrdiff_t)k * r->x_row);
    LN_S *y = (LN_S *)((char *)r->y + (ptrdiff_t)k * r->y_row);
    const ln_stats *st = &r->st[k];
    double eps = r->eps[k];
    if (ln_record_is_nan(st, eps)) {
        LN_CORE(fill_nan)(y, r->d);
        return ln_eps_is_valid(eps) ? LN_OK : LN_EBADEPS;
    }
    return LN_OPS(ln_output)(x, y, r->d, r->w, r->b, eps, st, r->stream,
                             LN_OPS(record_ahead)(r, k), r->spare, rms);
}

#if defined(LN_HAS_SHORT_ROWS)
/* A short record's plain case: a valid eps, a finite mean, and statistics
 * and 1/std inside the range of the core instance. Everything else takes
 * the record path below, which repeats the same operations and then makes
 * its fallback decisions (ln_contract.h, items 8 and 9). Written with &
 * (the same value as &&) so that group_plain's loop has no branches. */
static inline int LN_OPS(short_is_plain)(double mean, double var, double eps, double rstd)
{
    int ok = ln_eps_is_valid(eps) & isfinite(mean);
#if defined(LN_WIDE)
    return ok & LN_OPS(fits_float)(var, rstd);
#else
    return ok & (var >= LN_F64_VAR_MIN) & (var <= DBL_MAX) & LN_OPS(rstd_fits)(rstd);
#endif
}

/* short_is_plain of a group's n records: a whole group in a loop of
 * constant length, which the compiler vectorizes. Record by record, with
 * their branches, the tests had taken a third of the group's own time in
 * perf: one thread, in cache, float32 (4096, 16) now takes 0.90x the time,
 * (4096, 8) 0.88x, (4096, 64) 0.96x, RMSNorm (4096, 16) 0.88x, float64
 * (4096, 16) 0.94x. */
static void LN_OPS(group_plain)(const LN_CORE(short_group) *g, const double *eps, size_t n,
                                int plain[LN_SHORT_GROUP])
{
    if (n == LN_SHORT_GROUP) {
        for (size_t k = 0; k < LN_SHORT_GROUP; k++)
            plain[k] = LN_OPS(short_is_plain)(g->mean[k], g->var[k], eps[k], g->rstd[k]);
        return;
    }
    for (size_t k = 0; k < n; k++)
        plain[k] = LN_OPS(short_is_plain)(g->mean[k], g->var[k], eps[k], g->rstd[k]);
}

/* ... or a constant record (constant_record) with 1/std in that range,
 * which ln_output computes with the core instance too (the record path
 * one at a time had made zero rows, one thread, float32 (4096, 16) take
 * 518 us instead of 138 (ordinary rows 67), float16 557 instead of 168,
 * float64 507 instead of 163; float32 (4096, 64) 432 instead of 161).
 * Out of line: tested only where the plain test fails, it leaves the
 * group's loop as it was (inlined, ordinary float32 (1e6, 16) took 1.06x
 * as long). */
static LN_NOINLINE int LN_OPS(short_is_constant)(const ln_rows *r, size_t k, const ln_stats *st,
                                                 double rstd, int rms)
{
    const LN_S *x = (const LN_S *)((const char *)r->x + (ptrdiff_t)k * r->x_row);
    if (!ln_eps_is_valid(r->eps[k]) || !LN_OPS(rstd_fits)(rstd))
        return 0;
    return LN_OPS(constant_record)(x, r->d, st, rms);
}

static int LN_OPS(record_stats)(const ln_rows *r, size_t k, int rms);
static int LN_OPS(record_output)(const ln_rows *r, size_t k, int rms);

/* Does the group from record k0 ask for the next group's rows before its
 * outputs are written? Only when they are streamed, so that memory reads
 * the next group while this one is written, and for rows of more than
 * two cache lines (float32 out=, 1 thread: (1e6, 64) 0.87-0.89x the time,
 * (1e6, 48) 0.89-0.90x; (1e6, 32) and (1e6, 16) gained nothing). */
static int LN_OPS(short_ahead)(const ln_rows *r, size_t k0)
{
    return r->stream && r->d * sizeof(LN_S) > 128 && k0 + 2 * LN_SHORT_GROUP <= r->n;
}

/* (Inlined: GCC drops a call to a function that only prefetches.) */
LN_ALWAYS_INLINE void LN_OPS(prefetch_next_group)(const ln_rows *r, size_t k0)
{
    for (size_t k = k0 + LN_SHORT_GROUP; k < k0 + 2 * LN_SHORT_GROUP; k++)
        ln_prefetch((const char *)r->x + (ptrdiff_t)k * r->x_row, r->d * sizeof(LN_S));
}

#define LN_SHORT_GROUP_MIN 4
/* Short records a group at a time (see ln_lane.h's short_group): the
 * plain ones from the group, the others by the record path. narrow (a
 * constant): float32 d = 8 or 16, dk that width as a constant; else dk
 * is 0 and the width is read from r->d where it is used (held in a local
 * instead, float64 (4096, 12) and (4096, 16) took 1.16x as long). */
LN_ALWAYS_INLINE int LN_OPS(norm_short_rows_in)(const ln_rows *r, int rms, int narrow,
                                                size_t dk)
{
    int status = LN_OK;
    LN_CORE(short_group) g;
    /* The gain and bias padded to a lane row once per call (ones and
     * zeros past d): the group's outputs are computed for whole lane rows,
     * and the caller's arrays hold d items only. */
    const LN_P *rw = r->w, *rb = r->b;
    LN_P wp[2 * LN_LANES], bp[2 * LN_LANES];
    /* (No loads from NULL: see ln_lane.h's apply_row.) */
    for (size_t j = 0; j < 2 * LN_LANES && rw; j++)
        wp[j] = j < (dk ? dk : r->d) ? rw[j] : (LN_P)1;
    for (size_t j = 0; j < 2 * LN_LANES && rb; j++)
        bp[j] = j < (dk ? dk : r->d) ? rb[j] : (LN_P)0;
    const LN_P *w = rw ? wp : NULL, *b = rb ? bp : NULL;
    for (size_t k0 = 0; k0 < r->n; k0 += LN_SHORT_GROUP) {
        size_t n = r->n - k0 < LN_SHORT_GROUP ? r->n - k0 : LN_SHORT_GROUP;
        int keep[LN_SHORT_GROUP] = {0}, all = 0;
        /* A group costs as much for 1 record as for 16: a few records (a
         * one-record call) all take the record path below, the same bits. */
        if (n >= LN_SHORT_GROUP_MIN) {
            const char *x = (const char *)r->x + (ptrdiff_t)k0 * r->x_row;
            char *y = (char *)r->y + (ptrdiff_t)k0 * r->y_row;
            LN_CORE(group_stats)(&g, x, r->x_row, n, dk ? dk : r->d, r->eps + k0, rms, narrow);
            /* Every record's statistics, in a loop without branches: the
             * record path below computes its own records' again. */
            for (size_t k = 0; k < n; k++)
                r->st[k0 + k] = (ln_stats){.mean = g.mean[k], .var = g.var[k]};
            LN_OPS(group_plain)(&g, r->eps + k0, n, keep);
            all = LN_CORE(group_all_kept)(keep, n);
            for (size_t k = 0; k < n && !all; k++)
                if (!keep[k])
                    keep[k] = LN_OPS(short_is_constant)(r, k0 + k, &r->st[k0 + k], g.rstd[k],
                                                        rms);
            if (LN_OPS(short_ahead)(r, k0))
                LN_OPS(prefetch_next_group)(r, k0);
            LN_CORE(group_output)(&g, x, r->x_row, y, r->y_row, n, dk ? dk : r->d, w, b, keep,
                                  r->stream, narrow, rms);
        }
        for (size_t k = 0; k < n && !all; k++) {
            if (keep[k])
                continue;
            if (LN_OPS(record_stats)(r, k0 + k, rms) != LN_OK)
                return LN_ENOMEM;
            int rc = LN_OPS(record_output)(r, k0 + k, rms);
            if (rc == LN_ENOMEM)
                return rc;
            status = status > rc ? status : rc;
        }
    }
    return status;
}

/* float32 d = 8 and 16, which a level with its own short loops reads in
 * place (narrow: ln_lane.h's group_direct; float16 and bfloat16 too,
 * converted in registers), in a function of their own
 * (the others keep the transposed form: in a copy of d = 16 of it, the
 * portable level's outputs differed from the scalar level's in some
 * records of a group, not investigated further), so that the
 * other widths' code stays as it was: compiled into one function with
 * them, float32 (4096, 20), (4096, 24) and (4096, 48) had taken 1.04-1.14x
 * as long. Other dtypes keep the transposed form's single copy (float16
 * (4096, 8) took 1.48x as long in a copy of d = 8). */
#if defined(LN_SHORT_STATS_AVX)
static LN_NOINLINE int LN_OPS(norm_short_rows_narrow)(const ln_rows *r, int rms)
{
    if (r->d == LN_LANES / 2)
        return LN_OPS(norm_short_rows_in)(r, rms, 1, LN_LANES / 2);
    return LN_OPS(norm_short_rows_in)(r, rms, 1, LN_LANES / 4);
}
#endif

static int LN_OPS(norm_short_rows)(const ln_rows *r, int rms)
{
#if defined(LN_SHORT_STATS_AVX)
    if (LN_CORE(narrow_in_place)() && sizeof(LN_CT) == sizeof(float) &&
        (r->d == LN_LANES / 2 || r->d == LN_LANES / 4))
        return LN_OPS(norm_short_rows_narrow)(r, rms);
#endif
    return LN_OPS(norm_short_rows_in)(r, rms, 0, 0);
}
#endif

/* LayerNorm (or, rms, RMSNorm) of r->n records. */
static int LN_OPS(norm_rows)(const ln_rows *r, int rms)
{
#if defined(LN_HAS_SHORT_ROWS)
    if (LN_CORE(is_short)(r->d))
        return LN_OPS(norm_short_rows)(r, rms);
#endif
    int status = LN_OK;
    size_t group = LN_OPS(group_size)(r->d * sizeof(LN_S));
    for (size_t k0 = 0; k0 < r->n; k0 += group) {
        size_t k1 = r->n - k0 < group ? r->n : k0 + group;
        for (size_t k = k0; k < k1; k++)
            if (LN_OPS(record_stats)(r, k, rms) != LN_OK)
                return LN_ENOMEM;
        for (size_t k = k0; k < k1; k++) {
            int rc = LN_OPS(record_output)(r, k, rms);
            if (rc == LN_ENOMEM)
                return rc;
            status = status > rc ? status : rc;
        }
    }
    return status;
}

static int LN_OPS(layer_norm)(const ln_rows *r)
{
    return LN_OPS(norm_rows)(r, 0);
}

/* RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight (the batch layer passes
 * 1 + weight for the "1 + weight" convention). */
static int LN_OPS(rms_norm)(const ln_rows *r)
{
    return LN_OPS(norm_rows)(r, 1);
}

/* ---- the LayerNorm backward ------------------------------------------- */

/* The mean the forward returns for record x, rounded to the statistics
 * dtype (float32 for float-computed records): the backward's shift m0
 * when the caller gives no mean, so that giving the forward's mean changes
 * no bit. */
static int LN_OPS(forward_mean)(const LN_S *x, size_t d, ln_spare *spare, double *m0)
{
    ln_stats st;
#if defined(LN_WIDE)
    (void)spare;
    LN_OPS(ln_stats)(x, d, &st, 0, 0);
    *m0 = (double)(float)st.mean;
    return LN_OK;
#else
    int rc = LN_OPS(ln_stats_scaled)(x, d, &st, spare, 0, 0);
    *m0 = st.mean;
    return rc;
#endif
}

/* The forward's variance is the only thing besides the first pass that
 * its mean depends on (the fallback of item 8 recomputes both). The
 * backward's own sums measure it too, around m0: when that measure is
 * free of cancellation (the mean within half a standard deviation of
 * m0) and a factor 100 inside the range where the forward keeps its
 * statistics, the forward's variance (the same quantity, within a few
 * float roundings) is inside it as well, and the first pass alone gave
 * the forward's mean. Otherwise the caller computes the forward's
 * statistics in full. */
#if defined(LN_WIDE)
#define LN_QUICK_VAR_MIN (100 * LN_F32_VAR_MIN)
#define LN_QUICK_VAR_MAX (LN_F32_VAR_MAX / 100)
#else
#define LN_QUICK_VAR_MIN (100 * LN_F64_VAR_MIN)
#define LN_QUICK_VAR_MAX (DBL_MAX / 100)
#endif
/* ... from md = sum t / d and ms = sum t^2 / d (the short groups have
 * them as vectors) ... */
LN_ALWAYS_INLINE int LN_OPS(forward_var_ok)(double mean, double md, double ms)
{
    double var = ms - md * md;
    return isfinite(mean) & isfinite(md) & (md * md <= 0.25 * ms) & (var >= LN_QUICK_VAR_MIN) &
           (var <= LN_QUICK_VAR_MAX);
}

/* ... or from the sums. */
static int LN_OPS(forward_var_in_range)(double mean, const ln_back_sums *s, size_t d)
{
    return LN_OPS(forward_var_ok)(mean, s->st / (double)d, s->stt / (double)d);
}
#undef LN_QUICK_VAR_MIN
#undef LN_QUICK_VAR_MAX

/* Are a record's backward coefficients inside the range where the core
 * instance computes it? Else back_record takes the double formulas
 * (float-computed types) or the scaled record (float64). */
static int LN_OPS(coef_in_range)(const ln_back_coef *c)
{
#if defined(LN_WIDE)
    return LN_OPS(fits_float)(c->var, c->rstd);
#else
    return isfinite(c->mean) & (c->var >= LN_F64_VAR_MIN) & (c->var <= DBL_MAX);
#endif
}

/* The coefficients of LayerNorm's backward, or (rms) RMSNorm's. */
static int LN_OPS(coef_of)(const ln_back_sums *sums, double m0, size_t d, double eps,
                           ln_back_coef *c, int rms)
{
    return rms ? ln_rms_coef_of(sums, d, eps, c) : ln_back_coef_of(sums, m0, d, eps, c);
}

#if !defined(LN_WIDE)
/* The backward of a float64 record whose squares leave the double range,
 * at its power-of-two scale s: xhat does not change, dx is s times the
 * scaled record's. LN_UNSCALED when no scale is wanted after all: a tiny
 * record beside which eps is so large that eps * s^2 overflows (its
 * variance, however inexact, does not count beside eps). */
#define LN_UNSCALED (-1)
static int LN_OPS(back_scaled)(const ln_rows *r, const LN_S *x, const LN_S *dy, LN_S *dx,
                               double m0, double eps, double w_max, ln_acc *dw, ln_acc *db,
                               int rms)
{
    size_t d = r->d;
    double s = LN_OPS(record_scale)(x, d);
    if (!(eps * s * s <= DBL_MAX))
        return LN_UNSCALED;
    /* s = 1 (a record of zeros, or a non-finite one): no copy needed */
    const LN_S *xs = s == 1.0 ? x : LN_OPS(scaled_row)(x, d, s, r->spare);
    if (xs == NULL)
        return LN_ENOMEM;
    ln_back_sums sums;
    ln_back_coef c;
    LN_CORE(back_sums)(xs, dy, r->w, d, (LN_CT)(m0 * s), &sums);
    if (LN_OPS(coef_of)(&sums, m0 * s, d, eps * s * s, &c, rms) != 1 ||
        !ln_back_fits(&sums, &c, w_max, DBL_MIN, DBL_MAX)) {
        LN_CORE(back_nan)(xs, dy, dx, d, &c, dw, db, !isfinite(sums.st + sums.stt));
        return LN_OK;
    }
    LN_CORE(back_output_alone)(xs, dy, dx, d, r->w, &sums, &c, dw, db);
    if (s != 1.0)
        for (size_t i = 0; i < d; i++)
            dx[i] = dx[i] * s;
    return LN_OK;
}
#endif


/* A record left to the vector dx loop: its rows, coefficients and
 * deposit path (LN_DEPOSIT_3, _2 or _PLAIN); path -1 when the record was
 * done whole. */
typedef struct {
    const LN_S *x, *dy;
    LN_S *dx;
    ln_back_coef c;
    int path;
} LN_OPS(back_prep);

/* The end of back_record for an ordinary record (finite, in range): dx
 * by the scalar path now (a huge term), or prepared into *p for the
 * vector loop. */
static void LN_OPS(back_ready)(const ln_rows *r, const LN_S *x, const LN_S *dy, LN_S *dx,
                               const ln_back_sums *sums, const ln_back_coef *c,
                               LN_OPS(back_prep) *p)
{
    int path = ln_deposit_path(sums, c, r->dw);
    if (path == LN_DEPOSIT_SCALAR) {
        LN_CORE(back_output_scalar)(x, dy, dx, r->d, r->w, c, r->dw, r->db);
        return;
    }
    *p = (LN_OPS(back_prep)){.x = x, .dy = dy, .dx = dx, .c = *c, .path = path};
}

/* Item 10's one pass around the square shift m0 (a record longer than
 * LN_ONE_PASS_MIN_D): kept when it is accurate, m0 within a standard
 * deviation of the mean (md^2 <= var: the variance's subtraction loses
 * at most a bit, as item 5's), and the record an ordinary one (finite,
 * in the core instance's range); then 1, with its sums and coefficients.
 * Else 0, and the caller takes the pass around the forward's mean. The
 * forward's mean is then needed only by the records that fail: its first
 * pass over x was 10-15% of a float32 (4096, 768) backward. */
static int LN_OPS(back_shifted)(const ln_rows *r, const LN_S *x, const LN_S *dy, double eps,
                                double w_max, ln_back_sums *sums, ln_back_coef *c,
                                double *shift)
{
    LN_CT m0 = (LN_CT)LN_CORE(square_shift)(x);
    *shift = (double)m0;
    LN_CORE(back_sums)(x, dy, r->w, r->d, m0, sums);
    double md = sums->st / (double)r->d;
    if (!ln_shift_kept(md, sums->stt / (double)r->d - md * md))
        return 0;
    return LN_OPS(coef_of)(sums, (double)m0, r->d, eps, c, 0) == 1 &&
           LN_OPS(coef_in_range)(c) && ln_back_fits(sums, c, w_max, LN_CT_MIN, LN_CT_MAX);
}

/* The sums of record k around the forward's mean, *m0 (0 for RMSNorm):
 * without a given mean, the one from the forward's first pass, kept when
 * the sums show its variance safely in range; else from its full
 * statistics. */
static int LN_OPS(back_around_mean)(const ln_rows *r, size_t k, const LN_S *x, const LN_S *dy,
                                    int rms, double *m0, ln_back_sums *sums)
{
    size_t d = r->d;
    int own_mean = !rms && !r->mean;
    double mean = own_mean ? LN_CORE(mean_of)(x, d) : 0.0;
    *m0 = rms ? 0.0 : (double)(LN_CT)(r->mean ? r->mean[k] : mean);
    LN_CORE(back_sums)(x, dy, r->w, d, (LN_CT)*m0, sums);
    /* (A constant record's first pass gave the forward's mean exactly.) */
    if (own_mean && !ln_back_constant(sums, *m0) &&
        !LN_OPS(forward_var_in_range)(mean, sums, d)) {
        if (LN_OPS(forward_mean)(x, d, r->spare, m0) != LN_OK)
            return LN_ENOMEM;
        LN_CORE(back_sums)(x, dy, r->w, d, (LN_CT)*m0, sums);
    }
    return LN_OK;
}

/* The backward of record k: dx, and its terms into r->dw and r->db
 * (LayerNorm's, or with rms RMSNorm's: no mean, so no shift and no bias);
 * known: the sums of its pass around the forward's mean, known_m0, when
 * the caller has them (else NULL).
 * A record for the vector loop is only prepared, into *p, for the caller
 * to finish; every other one is done here. */
static int LN_OPS(back_record)(const ln_rows *r, size_t k, double w_max, int rms,
                               const ln_back_sums *known, double known_m0,
                               LN_OPS(back_prep) *p)
{
    p->path = -1;
    size_t d = r->d;
    const LN_S *x = (const LN_S *)((const char *)r->x + (ptrdiff_t)k * r->x_row);
    const LN_S *dy = (const LN_S *)((const char *)r->dy + (ptrdiff_t)k * r->dy_row);
    LN_S *dx = (LN_S *)((char *)r->y + (ptrdiff_t)k * r->y_row);
    double eps = r->eps[k], m0 = 0.0;
    if (!ln_eps_is_valid(eps)) {
        LN_CORE(fill_nan)(dx, d);
        return LN_EBADEPS;
    }
    ln_back_sums sums;
    ln_back_coef c;
    int shifted = !rms && d > LN_ONE_PASS_MIN_D;
    double shift = 0.0;
    if (shifted && LN_OPS(back_shifted)(r, x, dy, eps, w_max, &sums, &c, &shift)) {
        LN_OPS(back_ready)(r, x, dy, dx, &sums, &c, p);
        return LN_OK;
    }
    if (known) { /* the caller's pass around the forward's mean (known_m0) */
        sums = *known;
        m0 = known_m0;
    } else if (shifted && ln_back_constant(&sums, shift)) {
        /* A constant record: the shift is its forward mean (its first
         * pass sums zeros), so the pass just taken is the one around it
         * (a row of zeros took four more passes). A sign of zero in which
         * they differ changes none of the sums. */
        m0 = shift;
    } else if (LN_OPS(back_around_mean)(r, k, x, dy, rms, &m0, &sums) != LN_OK) {
        return LN_ENOMEM;
    }
    int rc = LN_OPS(coef_of)(&sums, m0, d, eps, &c, rms), ok = rc == 1;
#if defined(LN_WIDE)
    if (!(ok && LN_OPS(coef_in_range)(&c) &&
          ln_back_fits(&sums, &c, w_max, FLT_MIN, FLT_MAX))) {
        /* Out of the float lanes' range, or float sums that overflowed (a
         * spread of 1e20 squares to inf): the same formulas in double,
         * which also tell a truly non-finite record. */
        LN_WIDE(back_sums)(x, dy, r->w, d, m0, &sums);
        if (LN_OPS(coef_of)(&sums, m0, d, eps, &c, rms) != 1 ||
            !ln_back_fits(&sums, &c, w_max, DBL_MIN, DBL_MAX)) {
            LN_WIDE(back_nan)(x, dy, dx, d, &c, r->dw, r->db, !isfinite(sums.st + sums.stt));
            return LN_OK;
        }
        /* (A constant record comes here: its variance is 0, below the
         * float lanes'.) */
        LN_WIDE(back_output_alone)(x, dy, dx, d, r->w, &sums, &c, r->dw, r->db);
        return LN_OK;
    }
#else
    /* Squares that left the double range (rc 0: their sum overflowed, or
     * a non-finite x, which the scaled sums tell) are done at scale. */
    if (rc == 0 || (ok && !LN_OPS(coef_in_range)(&c))) {
        int sc = LN_OPS(back_scaled)(r, x, dy, dx, m0, eps, w_max, r->dw, r->db, rms);
        if (sc != LN_UNSCALED)
            return sc;
    }
#endif
    /* A record whose formulas would overflow even in the widest type is
     * NaN, like one whose sums do (ln_back_fits). */
    if (!ok || !ln_back_fits(&sums, &c, w_max, LN_CT_MIN, LN_CT_MAX)) {
        LN_CORE(back_nan)(x, dy, dx, d, &c, r->dw, r->db, !isfinite(sums.st + sums.stt));
        return LN_OK;
    }
    LN_OPS(back_ready)(r, x, dy, dx, &sums, &c, p);
    return LN_OK;
}

/* Records of more than LN_BACK_CHUNK features are finished LN_BACK_GROUP
 * at a time, a chunk of LN_BACK_CHUNK features of each in turn: the
 * chunk's level sums (32 bytes a feature) then stay in L1 across the
 * group, where a whole record's would not (float32 (16384, 4096), one
 * thread: 200 -> 143 ms; (1024, 3072) 12% faster). Every element and
 * deposit is the same operation in either order, and the deposits are
 * exact: the same bits. */
#define LN_BACK_CHUNK 512
#define LN_BACK_GROUP 8
_Static_assert(LN_BACK_GROUP <= LN_ACC_OVERSHOOT, "a group's deposits fit before a spill");

/* Where a record's streamed dx begins in a streamed call (its first
 * 64-byte aligned element, written after the plain ones before it), or d
 * when it is not streamed: as the forward streams y (ln_lane.h's apply
 * and stream_pays), for rows of at least LN_BACK_STREAM_ROW_MIN bytes
 * (float32 (1e5, 256) was 1.05x slower streamed, (5e4, 512) level).
 * The gufunc's dx alone, float32, one thread: (4096, 768) 0.71x the time,
 * (4096, 1000) 0.73x, (1024, 4096) 0.79x, (16384, 4096) 0.94x; float64
 * (4096, 768) 0.80x. With the parameter gradients (their terms then a
 * loop of their own: ln_lane.h's back_apply), float32 (4096, 768)
 * 0.78-0.98x, (4096, 1024) 0.80-0.91x; float64 (4096, 768) 0.89x; but
 * float16 rows, converted twice, 1.12-1.28x slower: those stream dx only
 * without the sums. */
#define LN_BACK_STREAM_ROW_MIN 2048
static size_t LN_OPS(back_stream_from)(const ln_rows *r, const LN_S *dx)
{
#if defined(LN_STREAM_BYTES)
    if (r->stream && LN_CORE(stream_pays)(r->d) && (sizeof(LN_S) >= 4 || !r->dw) &&
        r->d * sizeof(LN_S) >= LN_BACK_STREAM_ROW_MIN && (uintptr_t)dx % sizeof(LN_S) == 0) {
        size_t head = ((64 - (uintptr_t)dx % 64) % 64) / sizeof(LN_S);
        return head < r->d ? head : r->d;
    }
#else
    (void)dx;
#endif
    return r->d;
}

/* dx of a group's prepared records, chunk by chunk, then their deposits
 * counted (all of them before a spill: ln_acc_count). A streamed record's
 * chunks start at its first aligned element. */
#if defined(LN_BACK_GROUP_LOOP)
/* The terms of a group's records, features [i0, i1), together (the
 * level's loops, ln_x86.h), on three levels when any of them needs them
 * (a term below LN_ACC_SMALL puts 0 on the top level: the same sums; the
 * caller counts them so): with apply, their dx too (records in the
 * caches); without, the terms alone (streamed records, whose dx loop has
 * just read the chunk), and in a large call the next group's records,
 * from `next` on, asked for meanwhile: their back_sums then reads them
 * from the caches, where it had waited for memory. float32, one thread:
 * (4096, 768) 0.88-0.92x the time, (4096, 1024) 0.90-1.02x, (1024, 2048)
 * 0.88-0.94x, (2048, 1536) 0.94-0.97x, (4096, 512) 0.85-0.94x,
 * (16384, 4096) 0.98-0.99x. The other paths asked for the next group
 * after each record's chunk (float16, float64, RMSNorm) and gained
 * nothing. */
static void LN_OPS(group_terms)(const ln_rows *r, const LN_OPS(back_prep) *p, size_t m,
                                size_t i0, size_t i1, int levels, int apply, size_t next)
{
    const void *x[LN_BACK_GROUP], *dy[LN_BACK_GROUP];
    void *dx[LN_BACK_GROUP];
    LN_CT hi[LN_BACK_GROUP], rs[LN_BACK_GROUP], off[LN_BACK_GROUP];
    LN_CT a[LN_BACK_GROUP], bm[LN_BACK_GROUP];
    for (size_t j = 0; j < m; j++) { /* as back_output_span has them */
        x[j] = p[j].x, dy[j] = p[j].dy, dx[j] = p[j].dx;
        hi[j] = (LN_CT)p[j].c.mean;
        rs[j] = (LN_CT)p[j].c.rstd;
        off[j] = LN_CORE(offset)((LN_CT)(p[j].c.mean - (double)hi[j]), rs[j]);
        a[j] = (LN_CT)p[j].c.a;
        bm[j] = (LN_CT)p[j].c.bm;
    }
    ln_group_rows g = {.x = x, .dy = dy, .dx = dx, .w = r->w, .hi = hi, .r = rs, .c = off,
                       .a = a, .bm = bm};
    if (r->ahead && next < r->n) {
        g.ax = (const char *)r->x + (ptrdiff_t)next * r->x_row;
        g.ady = (const char *)r->dy + (ptrdiff_t)next * r->dy_row;
        g.ax_row = r->x_row, g.ady_row = r->dy_row;
        g.an = r->n - next < LN_BACK_GROUP ? r->n - next : LN_BACK_GROUP;
        g.half = (r->d / 2) & ~(size_t)15;
    }
    LN_BACK_GROUP_LOOP(&g, m, i0, i1, r->dw->sum, r->db->sum, levels, apply);
}
#endif

/* The m prepared records of a group finished; next is the first record
 * of the next group (r->n: none). */
static void LN_OPS(back_finish)(const ln_rows *r, const LN_OPS(back_prep) *p, size_t m,
                                size_t next)
{
    size_t d = r->d, from[LN_BACK_GROUP];
    for (size_t j = 0; j < m; j++)
        from[j] = LN_OPS(back_stream_from)(r, p[j].dx);
    /* A group of LayerNorm vector records (none plain) deposits its terms
     * together where the level can (group_terms): streamed records, whose
     * dx loops leave them to a loop of their own (float32, one thread,
     * (4096, 768) 0.94-0.96x the time, (4096, 1024) 0.91-0.96x), and
     * records in the caches, whose dx comes from the same loop (apply;
     * (256, 768) 0.95x). Not a large call's records whose dx is not
     * streamed (a fresh output of 32 MiB or more): eight rows of dx
     * written side by side, (16384, 4096) had taken 1.38x the time;
     * but float16 rows of less than 4 KiB, never streamed with the sums:
     * one thread, (4096, 1536) 0.88-0.90x, (16384, 768) 0.88-0.97x,
     * (4096, 1024) 0.96x, (4096, 768) 0.98x (float16 (16384, 4096) took
     * 1.15x as long). RMSNorm's, dweight's alone, gained nothing. */
    int grouped = 0, apply = 0, levels = 2;
    (void)levels;
#if defined(LN_BACK_GROUP_LOOP)
    size_t streamed = 0;
    grouped = r->dw != NULL && r->db != NULL;
    for (size_t j = 0; j < m; j++) {
        grouped &= p[j].path != LN_DEPOSIT_PLAIN;
        streamed += from[j] < d;
        levels = p[j].path == LN_DEPOSIT_3 ? 3 : levels;
    }
    apply = grouped && streamed == 0 &&
            (!r->ahead || (sizeof(LN_S) == 2 && r->d * sizeof(LN_S) < 4096));
    grouped &= apply || (streamed == m && m > 1); /* in the caches, or all streamed */
#endif
    ln_acc *dw = grouped ? NULL : r->dw, *db = grouped ? NULL : r->db;
    for (size_t c0 = 0; c0 < d; c0 += LN_BACK_CHUNK) {
        for (size_t j = 0; j < m && !apply; j++) {
            int stream = from[j] < d;
            size_t shift = stream ? from[j] : 0, i0 = c0 ? shift + c0 : 0;
            size_t end = shift + c0 + LN_BACK_CHUNK, i1 = end < d ? end : d;
            if (c0 == 0 && shift > 0) { /* the elements before the first aligned one */
                LN_CORE(back_output_span)(p[j].x, p[j].dy, p[j].dx, 0, shift, r->w, &p[j].c,
                                          dw, db, p[j].path, 0);
                i0 = shift;
            }
            if (i0 < i1)
                LN_CORE(back_output_span)(p[j].x, p[j].dy, p[j].dx, i0, i1, r->w, &p[j].c,
                                          dw, db, p[j].path, stream);
        }
#if defined(LN_BACK_GROUP_LOOP)
        if (grouped)
            LN_OPS(group_terms)(r, p, m, c0, c0 + LN_BACK_CHUNK < d ? c0 + LN_BACK_CHUNK : d,
                                levels, apply, next);
#endif
    }
    for (size_t j = 0; j < m; j++) /* a group's records on the group's levels */
        LN_CORE(back_counted)(r->dw, r->db,
                              !grouped ? p[j].path : levels == 3 ? LN_DEPOSIT_3 : LN_DEPOSIT_2);
    if (r->dw)
        ln_acc_spill_if_due(r->dw);
    if (r->db)
        ln_acc_spill_if_due(r->db);
}

#if defined(LN_HAS_SHORT_ROWS)
/* Sixteen records' coefficients, arithmetic only: a loop per op over
 * arrays of each field (the compiler vectorizes it; not through an array
 * of ln_back_coef). */
typedef struct {
    double mean[LN_SHORT_GROUP], var[LN_SHORT_GROUP], rstd[LN_SHORT_GROUP];
    double a[LN_SHORT_GROUP], bm[LN_SHORT_GROUP], md[LN_SHORT_GROUP];
} LN_OPS(group_values);

/* The coefficients of a group's records and which of them the group
 * finishes: coef_of and back_record's tests for each record, the same
 * operations, in loops across the group that the compiler vectorizes
 * (record by record, their divisions, square roots and branches had taken
 * a fifth of a float32 (1e6, 16) backward, and the tests alone, with
 * their branches, a fifth again). A record whose eps is invalid, or whose
 * var + eps overflows (ln_inverse_std's other formula), is left to
 * back_record, which computes it alone, as are records past n. */
typedef struct {
    LN_OPS(group_values) v;
    int keep[LN_SHORT_GROUP];
    int levels; /* 3 when a kept record deposits all three levels, else 2 */
} LN_OPS(group_coef);

LN_ALWAYS_INLINE void LN_OPS(put_coef)(LN_OPS(group_values) *v, size_t k, const ln_back_coef *c)
{
    v->mean[k] = c->mean;
    v->var[k] = c->var;
    v->rstd[k] = c->rstd;
    v->a[k] = c->a;
    v->bm[k] = c->bm;
    v->md[k] = c->md;
}

LN_ALWAYS_INLINE ln_back_coef LN_OPS(get_coef)(const LN_OPS(group_values) *v, size_t k)
{
    return (ln_back_coef){.mean = v->mean[k], .var = v->var[k], .rstd = v->rstd[k],
                          .a = v->a[k], .bm = v->bm[k], .md = v->md[k]};
}

static void LN_OPS(group_values_of)(const LN_CORE(back_group) *bg, size_t d,
                                    const double eps[LN_SHORT_GROUP], int rms,
                                    LN_OPS(group_values) *v)
{
    if (rms) {
        for (size_t k = 0; k < LN_SHORT_GROUP; k++) {
            ln_back_sums s = ln_back_group_sums_at(&bg->s, k);
            ln_back_coef c;
            ln_rms_coef_values(&s, d, eps[k], &c, 1);
            LN_OPS(put_coef)(v, k, &c);
        }
    } else {
        for (size_t k = 0; k < LN_SHORT_GROUP; k++) {
            ln_back_sums s = ln_back_group_sums_at(&bg->s, k);
            ln_back_coef c;
            ln_back_coef_values(&s, (double)bg->m0[k], d, eps[k], &c, 1);
            LN_OPS(put_coef)(v, k, &c);
        }
    }
}

static void LN_OPS(group_coefs)(const LN_CORE(back_group) *bg, const ln_rows *r, size_t k0,
                                size_t n, int rms, LN_OPS(group_coef) *gc)
{
    double eps[LN_SHORT_GROUP];
    int valid[LN_SHORT_GROUP];
    for (size_t k = 0; k < LN_SHORT_GROUP; k++) {
        valid[k] = k < n && ln_eps_is_valid(r->eps[k0 + k]);
        eps[k] = valid[k] ? r->eps[k0 + k] : 0.0;
    }
    LN_OPS(group_values) *v = &gc->v;
    LN_OPS(group_values_of)(bg, r->d, eps, rms, v);
    double ms[LN_SHORT_GROUP]; /* forward_var_ok's, vectorized: c.md is its md */
    for (size_t k = 0; k < LN_SHORT_GROUP; k++)
        ms[k] = bg->s.stt[k] / (double)r->d;
    /* back_record's tests, without branches (ln_deposit_path's plain
     * sums, never kept, are the same for every record; any_mean: the
     * forward's variance is not needed) */
    int finite[LN_SHORT_GROUP]; /* class 1; a loop of its own for each norm */
    for (size_t k = 0; k < LN_SHORT_GROUP; k++) {
        ln_back_sums s = ln_back_group_sums_at(&bg->s, k);
        ln_back_coef c = LN_OPS(get_coef)(v, k);
        if (rms)
            finite[k] = ln_rms_x_finite(&s, &c) & ln_rms_dy_finite(&s);
        else
            finite[k] = ln_back_x_finite(&s, &c) & ln_back_dy_finite(&s);
    }
    int kept = !(r->dw && r->dw->plain), any_mean = rms || r->mean, three = 0;
    for (size_t k = 0; k < LN_SHORT_GROUP; k++) {
        ln_back_sums s = ln_back_group_sums_at(&bg->s, k);
        ln_back_coef c = LN_OPS(get_coef)(v, k);
        int levels = ln_deposit_levels(&s, &c);
        int keep = valid[k] & finite[k] & (c.var + eps[k] <= DBL_MAX) &
                   (any_mean | LN_OPS(forward_var_ok)(bg->s.mean[k], c.md, ms[k])) &
                   LN_OPS(coef_in_range)(&c) &
                   ln_back_fits(&s, &c, r->w_max, LN_CT_MIN, LN_CT_MAX) & (levels != 0) & kept;
        gc->keep[k] = keep;
        three |= keep & (levels == 3);
    }
    gc->levels = three ? 3 : 2;
}

/* The backward of short records a group at a time (ln_lane.h's
 * back_group): the plain ones by the group, the others, and groups of a
 * few records (a call of one record), by back_record. d is r->d, a
 * constant in the common widths' copies (see back_short_rows). */
LN_ALWAYS_INLINE int LN_OPS(back_short_rows_d)(const ln_rows *r, int rms, size_t d)
{
    int status = LN_OK;
    const LN_P *w = r->w;
    LN_P wp[2 * LN_LANES]; /* the gain, padded: the group computes whole lane rows */
    for (size_t j = 0; j < 2 * LN_LANES; j++)
        wp[j] = j < d ? w[j] : (LN_P)1;
    LN_CORE(back_group) bg;
    for (size_t k0 = 0; k0 < r->n; k0 += LN_SHORT_GROUP) {
        size_t n = r->n - k0 < LN_SHORT_GROUP ? r->n - k0 : LN_SHORT_GROUP;
        int *keep, none[LN_SHORT_GROUP] = {0};
        LN_OPS(group_coef) gc;
        keep = none;
        if (n >= LN_SHORT_GROUP_MIN) {
            LN_CT hi[LN_SHORT_GROUP], rs[LN_SHORT_GROUP], off[LN_SHORT_GROUP];
            LN_CT a[LN_SHORT_GROUP], bm[LN_SHORT_GROUP];
            LN_CORE(back_group_sums)(&bg, (const char *)r->x + (ptrdiff_t)k0 * r->x_row,
                                     r->x_row, (const char *)r->dy + (ptrdiff_t)k0 * r->dy_row,
                                     r->dy_row, n, d, wp, r->mean ? r->mean + k0 : NULL, rms);
            LN_OPS(group_coefs)(&bg, r, k0, n, rms, &gc);
            keep = gc.keep;
            for (size_t k = 0; k < LN_SHORT_GROUP; k++) {
                hi[k] = (LN_CT)gc.v.mean[k];
                rs[k] = (LN_CT)gc.v.rstd[k];
                off[k] = LN_CORE(offset)((LN_CT)(gc.v.mean[k] - (double)hi[k]), rs[k]);
                a[k] = (LN_CT)gc.v.a[k];
                bm[k] = (LN_CT)gc.v.bm[k];
            }
            LN_CORE(back_group_output)(&bg, (char *)r->y + (ptrdiff_t)k0 * r->y_row, r->y_row,
                                       n, d, wp, hi, rs, off, a, bm, keep, r->dw, r->db,
                                       gc.levels);
        }
        for (size_t k = 0; k < n; k++) {
            if (keep[k])
                continue;
            /* A constant record (every x equal to the group's shift, the
             * forward's mean, and finite: the sums back_record's pass
             * around that mean would take) leaves with the group's sums:
             * zero rows, one thread, float32 (4096, 16) 1220 -> 757 us
             * (ordinary rows 179), float16 1533 -> 986. */
            ln_back_sums s;
            const ln_back_sums *known = NULL;
            double m0 = 0.0;
            if (keep != none) {
                s = ln_back_group_sums_at(&bg.s, k);
                m0 = (double)bg.m0[k];
                if (ln_back_constant(&s, m0))
                    known = &s;
            }
            LN_OPS(back_prep) p;
            int rc = LN_OPS(back_record)(r, k0 + k, r->w_max, rms, known, m0, &p);
            if (rc == LN_ENOMEM)
                return rc;
            status = status > rc ? status : rc;
            LN_OPS(back_finish)(r, &p, p.path >= 0, r->n);
        }
        if (r->dw)
            ln_acc_spill_if_due(r->dw);
        if (r->db)
            ln_acc_spill_if_due(r->db);
    }
    return status;
}

/* Loops of constant length for the common widths: one thread, (1e5, 16)
 * float32 15% faster, float16 13%, float64 10-20%, and (1e5, 32)
 * float32 10%. float64 (1e5, 8) was 15% slower with its own copy; it
 * and the other widths keep the general loops. */
static int LN_OPS(back_short_rows)(const ln_rows *r, int rms)
{
    if (r->d == 16)
        return LN_OPS(back_short_rows_d)(r, rms, 16);
    if (r->d == 32 && sizeof(LN_CT) == 4)
        return LN_OPS(back_short_rows_d)(r, rms, 32);
    return LN_OPS(back_short_rows_d)(r, rms, r->d);
}
#endif

#if defined(LN_BACK_GROUP_LOOP)
_Static_assert(LN_BACK_ALIASED_GROUP >= 1 && LN_BACK_ALIASED_GROUP <= LN_BACK_GROUP,
               "a group of aliased rows is a smaller group");
/* Records a group takes: fewer for long rows a multiple of 4 KiB apart
 * (ln_x86.h's LN_BACK_ALIASED_GROUP). Any grouping gives the same bits. */
static size_t LN_OPS(back_group_size)(const ln_rows *r)
{
    size_t row = (size_t)(r->x_row < 0 ? -r->x_row : r->x_row);
    if (r->d * sizeof(LN_S) >= LN_BACK_ALIASED_ROW_MIN && row % 4096 == 0)
        return LN_BACK_ALIASED_GROUP;
    return LN_BACK_GROUP;
}
#endif

static int LN_OPS(back_all)(const ln_rows *r, int rms)
{
#if defined(LN_HAS_SHORT_ROWS)
    if (LN_CORE(back_is_short)(r->d))
        return LN_OPS(back_short_rows)(r, rms);
#endif
    int status = LN_OK;
    double w_max = r->w_max; /* the batch layer's bound on |w| */
#if defined(LN_BACK_GROUP_LOOP)
    size_t group = LN_OPS(back_group_size)(r); /* records in the caches too (back_finish) */
#else
    size_t group = r->d > LN_BACK_CHUNK ? LN_BACK_GROUP : 1;
#endif
    LN_OPS(back_prep) p[LN_BACK_GROUP];
    for (size_t k0 = 0; k0 < r->n; k0 += group) {
        size_t k1 = r->n - k0 > group ? k0 + group : r->n, m = 0;
        for (size_t k = k0; k < k1; k++) {
            int rc = LN_OPS(back_record)(r, k, w_max, rms, NULL, 0.0, &p[m]);
            if (rc == LN_ENOMEM)
                return rc;
            status = status > rc ? status : rc;
            m += p[m].path >= 0;
        }
        LN_OPS(back_finish)(r, p, m, k1);
    }
    return status;
}
#undef LN_BACK_CHUNK
#undef LN_BACK_GROUP
#undef LN_BACK_STREAM_ROW_MIN

/* The LayerNorm backward of r->n records. */
static int LN_OPS(layer_norm_backward)(const ln_rows *r)
{
    return LN_OPS(back_all)(r, 0);
}

/* The RMSNorm backward of r->n records (r->db unused). */
static int LN_OPS(rms_norm_backward)(const ln_rows *r)
{
    return LN_OPS(back_all)(r, 1);
}
#undef LN_CT
#undef LN_CT_MIN
#undef LN_CT_MAX
