/*
 * ln_row.c - one record: statistics, then the normalized output.
 *
 * Shared by every instruction-set level; only the primitives in
 * ln_kernels differ, and they all follow the same reduction order.
 */
#include <float.h>
#include <math.h>

#include "layernorm.h"

static int eps_is_valid(double eps)
{
    return eps >= 0.0 && eps <= DBL_MAX; /* false for NaN and inf */
}

/* 1 / sqrt(var + eps), NaN for an invalid eps. Always in double, so
 * float16/float32 inputs never see eps rounded to their precision. */
static double inverse_std(double var, double eps)
{
    if (!eps_is_valid(eps))
        return NAN;
    return 1.0 / sqrt(var + eps);
}

/* Float lanes hold squares safely only in this range of variances; outside
 * it (or with a non-finite mean) the record is recomputed in double. */
#define F32_VAR_MIN 1e-30
#define F32_VAR_MAX 1e30

/* mean = mu_hi + mu_lo to twice float precision, so that
 * (x - mu_hi) - mu_lo is accurate while staying in float lanes. */
static void split_mean(double mean, float *mu_hi, float *mu_lo)
{
    *mu_hi = (float)mean;
    *mu_lo = (float)(mean - (double)*mu_hi);
}

/* Statistics of a float record, fast path: float lanes in short blocks.
 * Shifting by x[0] first keeps the float sums small when all values share
 * a large offset (a float32 mean of raw values would lose about one float
 * ulp of the offset). */
static void stats_f32_blocked(const ln_kernels *k, const float *x, size_t d,
                              ln_stats *st)
{
    float shift = x[0];
    float mu_hi, mu_lo;
    st->mean = (double)shift + k->sum_f32_blocked(x, d, shift) / (double)d;
    split_mean(st->mean, &mu_hi, &mu_lo);
    st->var = k->sumsq_f32_blocked(x, d, mu_hi, mu_lo) / (double)d;
}

/* Statistics of a float record in double lanes: slower, but no square
 * can overflow or underflow. */
static void stats_f32_double(const ln_kernels *k, const float *x, size_t d,
                             ln_stats *st)
{
    st->mean = k->sum_f32(x, d) / (double)d;
    st->var = k->sumsq_f32(x, d, st->mean) / (double)d;
}

/* NaN statistics as the canonical quiet NaN, whatever payload the sums
 * carried (see record_is_nan). */
static void canonical_nans(ln_stats *st)
{
    if (isnan(st->mean))
        st->mean = NAN;
    if (isnan(st->var))
        st->var = NAN;
}

void ln_stats_f32(const ln_kernels *k, const float *x, size_t d,
                  ln_stats *st)
{
    if (d == 0) {
        st->mean = st->var = NAN;
        return;
    }
    stats_f32_blocked(k, x, d, st);
    if (!(st->var >= F32_VAR_MIN && st->var <= F32_VAR_MAX) ||
        !isfinite(st->mean))
        stats_f32_double(k, x, d, st);
    canonical_nans(st);
}

/* Variances below this may have lost digits to underflowing squares. */
#define F64_VAR_MIN 0x1p-960

/* A power of two that brings the record's largest magnitude near 1
 * (into [0.5, 1) unless that needs a scale beyond 2^+-1000, as for
 * subnormal records): multiplying by it is exact, and no square of the
 * scaled values can overflow, or underflow unless it is negligible.
 * 1 for a record of zeros or with a non-finite value. */
static double record_scale(const double *x, size_t d)
{
    double m = 0.0;
    int e;
    for (size_t i = 0; i < d; i++)
        m = fmax(m, fabs(x[i]));
    if (!(m > 0.0 && m <= DBL_MAX))
        return 1.0;
    frexp(m, &e);
    e = e > 1000 ? 1000 : (e < -1000 ? -1000 : e);
    return ldexp(1.0, -e);
}

/* Mean and variance of the record scaled by s, in the standard lane
 * order. Used only for records whose squares leave the double range
 * (|x| above about 1e154, or tiny records with eps too small to matter),
 * so it is scalar and shared by every ISA level. */
static void stats_f64_scaled(const double *x, size_t d, double s,
                             ln_stats *scaled)
{
    double lane[LN_LANES] = {0};
    for (size_t i = 0; i < d; i++)
        lane[i % LN_LANES] += x[i] * s;
    scaled->mean = ln_tree_sum(lane) / (double)d;
    for (size_t j = 0; j < LN_LANES; j++)
        lane[j] = 0.0;
    for (size_t i = 0; i < d; i++) {
        double t = x[i] * s - scaled->mean;
        lane[i % LN_LANES] += t * t;
    }
    scaled->var = ln_tree_sum(lane) / (double)d;
}

void ln_stats_f64(const ln_kernels *k, const double *x, size_t d,
                  ln_stats *st)
{
    if (d == 0) {
        st->mean = st->var = NAN;
        return;
    }
    st->mean = k->sum_f64(x, d) / (double)d;
    st->var = k->sumsq_f64(x, d, st->mean) / (double)d;
    if (isfinite(st->mean) && st->var >= F64_VAR_MIN && st->var <= DBL_MAX)
        return;
    double s = record_scale(x, d);
    if (s != 1.0) {
        ln_stats scaled;
        stats_f64_scaled(x, d, s, &scaled);
        st->mean = scaled.mean / s;
        st->var = scaled.var / s / s; /* inf if the true variance is */
    }
    canonical_nans(st);
}

/* The output of a record whose 1/sqrt(var + eps) left the double range
 * (0 or inf), computed at the record's scale. */
static void apply_f64_scaled(const double *x, double *y, size_t d,
                             const double *w, const double *b, double eps)
{
    double s = record_scale(x, d);
    ln_stats scaled;
    stats_f64_scaled(x, d, s, &scaled);
    double rstd = inverse_std(scaled.var, eps * s * s);
    for (size_t i = 0; i < d; i++) {
        double v = (x[i] * s - scaled.mean) * rstd;
        if (w)
            v = v * w[i];
        if (b)
            v = v + b[i];
        y[i] = v;
    }
}

/* Can the float lanes of apply_f32 compute this record? Not when x - mean
 * could overflow float (huge spread), when the centered values could be
 * subnormal (tiny spread), or when 1/sqrt(var + eps) exceeds the float
 * range. Such records go through apply_f32_wide. */
static int fits_float_lanes(double var, double rstd)
{
    return var >= F32_VAR_MIN && var <= F32_VAR_MAX && !(rstd > FLT_MAX);
}

/* The output of a float record in double arithmetic, one rounding at the
 * end. Scalar and shared by every ISA level, so results stay identical. */
static void apply_f32_wide(const float *x, float *y, size_t d, double mean,
                           double rstd, const float *w, const float *b)
{
    for (size_t i = 0; i < d; i++) {
        double v = ((double)x[i] - mean) * rstd;
        if (w)
            v = v * (double)w[i];
        if (b)
            v = v + (double)b[i];
        y[i] = (float)v;
    }
}

/* A record whose statistics are NaN (a NaN, or infinities, among its
 * values) or whose eps is invalid is all NaN. It is written as the one
 * canonical quiet NaN: the payload arithmetic would propagate depends on
 * operand order, which differs between ISA levels. */
static int record_is_nan(const ln_stats *st, double eps)
{
    return isnan(st->mean) || isnan(st->var) || !eps_is_valid(eps);
}

int ln_apply_f32(const ln_kernels *k, const float *x, float *y, size_t d,
                 const float *w, const float *b, double eps,
                 const ln_stats *st, const ln_hints *hints)
{
    if (record_is_nan(st, eps)) {
        for (size_t i = 0; i < d; i++)
            y[i] = NAN;
        return eps_is_valid(eps) ? 0 : -1;
    }
    double rstd = inverse_std(st->var, eps);
    if (fits_float_lanes(st->var, rstd)) {
        float mu_hi, mu_lo;
        split_mean(st->mean, &mu_hi, &mu_lo);
        k->apply_f32(x, y, d, mu_hi, mu_lo, (float)rstd, w, b, hints);
    } else {
        apply_f32_wide(x, y, d, st->mean, rstd, w, b);
    }
    return eps_is_valid(eps) ? 0 : -1;
}

int ln_apply_f64(const ln_kernels *k, const double *x, double *y, size_t d,
                 const double *w, const double *b, double eps,
                 const ln_stats *st, const ln_hints *hints)
{
    if (record_is_nan(st, eps)) {
        for (size_t i = 0; i < d; i++)
            y[i] = NAN;
        return eps_is_valid(eps) ? 0 : -1;
    }
    double rstd = inverse_std(st->var, eps);
    if (rstd == 0.0 || rstd > DBL_MAX)
        apply_f64_scaled(x, y, d, w, b, eps);
    else
        k->apply_f64(x, y, d, st->mean, rstd, w, b, hints);
    return eps_is_valid(eps) ? 0 : -1;
}

int ln_row_f32(const ln_kernels *k, const float *x, float *y, size_t d,
               const float *w, const float *b, double eps,
               const ln_hints *hints, ln_stats *st)
{
    ln_stats_f32(k, x, d, st);
    return ln_apply_f32(k, x, y, d, w, b, eps, st, hints);
}

int ln_row_f64(const ln_kernels *k, const double *x, double *y, size_t d,
               const double *w, const double *b, double eps,
               const ln_hints *hints, ln_stats *st)
{
    ln_stats_f64(k, x, d, st);
    return ln_apply_f64(k, x, y, d, w, b, eps, st, hints);
}
