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

int ln_row_f32(const ln_kernels *k, const float *x, float *y, size_t d,
               const float *w, const float *b, double eps,
               const ln_hints *hints, ln_stats *st)
{
    if (d == 0) {
        st->mean = st->var = NAN;
        return eps_is_valid(eps) ? 0 : -1;
    }
    /* Statistics in double: a float32 mean loses about one float ulp of
     * the offset, which is large next to the spread of offset data. */
    double mean = k->sum_f32(x, d) / (double)d;
    double var = k->sumsq_f32(x, d, mean) / (double)d;
    double rstd = inverse_std(var, eps);

    /* mean = mu_hi + mu_lo (to float precision twice over), so that
     * (x - mu_hi) - mu_lo is accurate while staying in float lanes. */
    float mu_hi = (float)mean;
    float mu_lo = (float)(mean - (double)mu_hi);
    k->apply_f32(x, y, d, mu_hi, mu_lo, (float)rstd, w, b, hints);

    st->mean = mean;
    st->var = var;
    return eps_is_valid(eps) ? 0 : -1;
}

int ln_row_f64(const ln_kernels *k, const double *x, double *y, size_t d,
               const double *w, const double *b, double eps,
               const ln_hints *hints, ln_stats *st)
{
    if (d == 0) {
        st->mean = st->var = NAN;
        return eps_is_valid(eps) ? 0 : -1;
    }
    double mean = k->sum_f64(x, d) / (double)d;
    double var = k->sumsq_f64(x, d, mean) / (double)d;
    double rstd = inverse_std(var, eps);

    k->apply_f64(x, y, d, mean, rstd, w, b, hints);

    st->mean = mean;
    st->var = var;
    return eps_is_valid(eps) ? 0 : -1;
}
