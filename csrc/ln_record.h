/*
 * ln_record.h - one record's statistics and output, from an instance's
 * primitives (ln_contract.h, items 4, 5 and 7). Part of the kernel
 * template (see ln_tmpl.h). No include guard.
 */

/* mean = x[0] + sum(x - x[0]) / d, var = sum(((x - hi) - lo)^2) / d. */
static void LN_FN(stats)(const LN_S *x, size_t d, ln_stats *st)
{
    LN_T shift = LN_LOAD(x);
    st->mean = (double)shift + LN_FN(sum_shifted)(x, d, shift) / (double)d;
    LN_T hi = (LN_T)st->mean;
    LN_T lo = (LN_T)(st->mean - (double)hi);
    st->var = LN_FN(sum_squares)(x, d, hi, lo) / (double)d;
}

/* y from the statistics and rstd = 1/sqrt(var + eps) (in double). */
static void LN_FN(output)(const LN_S *x, LN_S *y, size_t d, const ln_stats *st,
                          double rstd, const LN_P *w, const LN_P *b, int stream)
{
    LN_T hi = (LN_T)st->mean;
    LN_T lo = (LN_T)(st->mean - (double)hi);
    LN_T r = (LN_T)rstd;
    LN_FN(apply)(x, y, d, hi, r, LN_FN(offset)(lo, r), w, b, stream);
}

/* Every output NaN (a NaN record). */
static inline void LN_FN(fill_nan)(LN_S *y, size_t d)
{
    for (size_t i = 0; i < d; i++)
        LN_STORE(y + i, (LN_T)NAN);
}
