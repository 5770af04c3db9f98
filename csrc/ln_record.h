/*
 * ln_record.h - one record's statistics and output, from an instance's
 * primitives (ln_contract.h, items 4, 5 and 7). Part of the kernel
 * template (see ln_tmpl.h). No include guard.
 */

/* The square shift of the one-pass statistics: the mean of the first
 * LN_SHIFT_SPAN values, their sum taken in double by a pairwise tree,
 * written out in registers: as a loop over an array, GCC stored the
 * widened values in halves and loaded them whole, and each load waited
 * for its stores (a third of bfloat16's statistics outside the sums). */
_Static_assert(LN_SHIFT_SPAN == 8, "the tree below has eight leaves");
static inline LN_T LN_FN(square_shift)(const LN_S *x)
{
    double v0 = (double)LN_LOAD(x) + (double)LN_LOAD(x + 4);
    double v1 = (double)LN_LOAD(x + 1) + (double)LN_LOAD(x + 5);
    double v2 = (double)LN_LOAD(x + 2) + (double)LN_LOAD(x + 6);
    double v3 = (double)LN_LOAD(x + 3) + (double)LN_LOAD(x + 7);
    return (LN_T)(((v0 + v2) + (v1 + v3)) / LN_SHIFT_SPAN);
}

/* The shift of the first pass (ln_contract.h, item 4): x[0], or for
 * records of more than LN_ONE_PASS_MIN_D features the square shift, whose
 * one pass then gives both sums. */
static inline LN_T LN_FN(mean_shift)(const LN_S *x, size_t d)
{
    return d > LN_ONE_PASS_MIN_D ? LN_FN(square_shift)(x) : LN_LOAD(x);
}

/* mean = s + sum(x - s) / d, s the record's shift: the first pass. */
static inline double LN_FN(mean_of)(const LN_S *x, size_t d)
{
    LN_T shift = LN_FN(mean_shift)(x, d);
    return (double)shift + LN_FN(sum_shifted)(x, d, shift) / (double)d;
}

/* The one-pass statistics of a long record (ln_contract.h, item 5): the
 * mean of item 4 and, when the square shift c lies within a standard
 * deviation of it, the variance from the squares around c (1), else 0:
 * the caller takes the second pass. */
static int LN_FN(stats_one_pass)(const LN_S *x, size_t d, ln_stats *st, int far)
{
    LN_T c = LN_FN(mean_shift)(x, d);
    double s1, s2;
    LN_FN(sum_shifted_squares)(x, d, c, &s1, &s2, far);
    double dm = s1 / (double)d; /* mean - c, without the mean's rounding */
    st->mean = (double)c + dm;
    double var = s2 / (double)d - dm * dm;
    if (!ln_shift_kept(dm, var))
        return 0;
    st->var = var;
    return 1;
}

/* The mean, then var = sum(((x - hi) - lo)^2) / d (one pass for long
 * records when that is accurate). far: the record is read from memory
 * (ln_tmpl.h, ln_prefetch_ahead). */
static void LN_FN(stats)(const LN_S *x, size_t d, ln_stats *st, int far)
{
    if (d > LN_ONE_PASS_MIN_D) {
        if (LN_FN(stats_one_pass)(x, d, st, far))
            return;
    } else {
        st->mean = LN_FN(mean_of)(x, d);
    }
    LN_T hi = (LN_T)st->mean;
    LN_T lo = (LN_T)(st->mean - (double)hi);
    st->var = LN_FN(sum_squares)(x, d, hi, lo, 0) / (double)d;
}

/* RMSNorm's statistics: mean 0 and var the mean square, sum(x^2) / d in
 * the same order (the squares of the centered values with hi = lo = 0). */
static void LN_FN(stats_rms)(const LN_S *x, size_t d, ln_stats *st, int far)
{
    st->mean = 0.0;
    st->var = LN_FN(sum_squares)(x, d, (LN_T)0, (LN_T)0, far) / (double)d;
}

/* Are all the record's values finite? (Asked only when RMSNorm's mean
 * square came out infinite: it has no mean to turn them into NaN.) */
static inline int LN_FN(all_finite)(const LN_S *x, size_t d)
{
    for (size_t i = 0; i < d; i++)
        if (!isfinite((double)LN_LOAD(x + i)))
            return 0;
    return 1;
}

/* Is every value of the record equal (as a number: -0 == +0) to the
 * first, and that finite (and, with zero, 0)? Asked only of records whose
 * variance came out 0. */
static inline int LN_FN(is_constant)(const LN_S *x, size_t d, int zero)
{
    LN_T x0 = LN_LOAD(x);
    if (!isfinite((double)x0) || (zero && x0 != 0))
        return 0;
    /* Whole lane rows without a branch (the compiler vectorizes them),
     * leaving at the first row that differs; 2-byte floats by their bits
     * (equal, or both zeros of either sign), not converted one by one. */
    size_t i = 0;
    uint16_t b0 = 0;
    if (sizeof(LN_S) == 2)
        memcpy(&b0, x, 2);
    for (; i + LN_LANES <= d; i += LN_LANES) {
        int same = 1;
        for (size_t j = 0; j < LN_LANES && sizeof(LN_S) == 2; j++) {
            uint16_t b;
            memcpy(&b, x + i + j, 2);
            same &= (b == b0) | (((b | b0) & 0x7fff) == 0);
        }
        for (size_t j = 0; j < LN_LANES && sizeof(LN_S) != 2; j++)
            same &= LN_LOAD(x + i + j) == x0;
        if (!same)
            return 0;
    }
    for (; i < d; i++)
        if (LN_LOAD(x + i) != x0)
            return 0;
    return 1;
}

/* LayerNorm's statistics, or (rms) RMSNorm's; far: the record is read
 * from memory. */
static inline void LN_FN(stats_of)(const LN_S *x, size_t d, ln_stats *st, int rms, int far)
{
    if (rms)
        LN_FN(stats_rms)(x, d, st, far);
    else
        LN_FN(stats)(x, d, st, far);
}

/* y from the statistics and rstd = 1/sqrt(var + eps) (in double). With
 * mean 0 (RMSNorm) this is x * r, rounded once: fma(x - 0, r, -0). */
static void LN_FN(output)(const LN_S *x, LN_S *y, size_t d, const ln_stats *st,
                          double rstd, const LN_P *w, const LN_P *b, int stream,
                          const void *ahead)
{
    LN_T hi = (LN_T)st->mean;
    LN_T lo = (LN_T)(st->mean - (double)hi);
    LN_T r = (LN_T)rstd;
    LN_FN(apply)(x, y, d, hi, r, LN_FN(offset)(lo, r), w, b, stream, ahead);
}

/* Every output NaN (a NaN record). */
static inline void LN_FN(fill_nan)(LN_S *y, size_t d)
{
    for (size_t i = 0; i < d; i++)
        LN_STORE(y + i, (LN_T)NAN);
}

/* The record's terms dy * xhat and dy, one by one (the scalar path: NaN,
 * infinite and huge terms). x_nan: xhat is NaN (x is not finite). */
static void LN_FN(back_deposit)(const LN_S *x, const LN_S *dy, size_t d,
                                const ln_back_coef *c, ln_acc *dw, ln_acc *db, int x_nan)
{
    LN_T hi = (LN_T)c->mean, r = (LN_T)c->rstd;
    LN_T off = LN_FN(offset)((LN_T)(c->mean - (double)hi), r);
    for (size_t i = 0; i < d; i++) {
        LN_T dyv = LN_LOAD(dy + i);
        if (dw) {
            LN_T xh = x_nan ? (LN_T)NAN : LN_FN(normalize)(LN_LOAD(x + i), hi, r, off);
            ln_acc_deposit_one(dw, i, (double)dyv * (double)xh);
        }
        if (db)
            ln_acc_deposit_one(db, i, (double)dyv);
    }
}

/* A record whose dx is NaN (written as the canonical NaN), its terms
 * deposited one by one. */
static void LN_FN(back_nan)(const LN_S *x, const LN_S *dy, LN_S *dx, size_t d,
                            const ln_back_coef *c, ln_acc *dw, ln_acc *db, int x_nan)
{
    LN_FN(fill_nan)(dx, d);
    LN_FN(back_deposit)(x, dy, d, c, dw, db, x_nan);
}

/* dx of the elements [i0, i1) from the coefficients, and their terms
 * deposited by `path` (any but LN_DEPOSIT_SCALAR): uncounted (see
 * back_counted). stream: dx + i0 is 64-byte aligned, and its whole lane
 * rows are written with non-temporal stores. */
static void LN_FN(back_output_span)(const LN_S *x, const LN_S *dy, LN_S *dx, size_t i0,
                                    size_t i1, const LN_P *w, const ln_back_coef *c,
                                    ln_acc *dw, ln_acc *db, int path, int stream)
{
    LN_T hi = (LN_T)c->mean, r = (LN_T)c->rstd;
    LN_T off = LN_FN(offset)((LN_T)(c->mean - (double)hi), r);
    LN_T a = (LN_T)c->a, bm = (LN_T)c->bm;
    LN_FN(back_apply)(x + i0, dy + i0, dx + i0, i1 - i0, w + i0, hi, r, off, a, bm, dw, db,
                      path, i0, stream);
}

/* A record's vector deposits counted (a spill is the caller's). */
static inline void LN_FN(back_counted)(ln_acc *dw, ln_acc *db, int path)
{
    if (path == LN_DEPOSIT_PLAIN) {
        dw->used = 1; /* the plain path is the benchmark's, with both sums */
        if (db)
            db->used = 1;
        return;
    }
    int levels = path == LN_DEPOSIT_3 ? 3 : 2;
    if (dw)
        ln_acc_count(dw, levels);
    if (db)
        ln_acc_count_db(db, levels, LN_DB_ON_GRID);
}

/* dx from the coefficients, and the terms deposited one by one
 * (LN_DEPOSIT_SCALAR: the rare records kept out of the vector loop, whose
 * callers finish with back_output_span and back_counted). */
static void LN_FN(back_output_scalar)(const LN_S *x, const LN_S *dy, LN_S *dx, size_t d,
                                      const LN_P *w, const ln_back_coef *c, ln_acc *dw,
                                      ln_acc *db)
{
    LN_FN(back_output_span)(x, dy, dx, 0, d, w, c, NULL, NULL, LN_DEPOSIT_SCALAR, 0);
    LN_FN(back_deposit)(x, dy, d, c, dw, db, 0);
}

/* A record done whole, alone (a fallback: float records in double,
 * float64 ones at scale): its terms by the vector deposits when they lie
 * in their range, else one by one. The same integers either way, so the
 * same bits. A (64, 768) call of zero rows (a constant record takes the
 * fallback), one thread: float32 4.2x faster, float64 876 -> 291 us. */
static inline void LN_FN(back_output_alone)(const LN_S *x, const LN_S *dy, LN_S *dx, size_t d,
                                            const LN_P *w, const ln_back_sums *sums,
                                            const ln_back_coef *c, ln_acc *dw, ln_acc *db)
{
    int path = ln_deposit_path(sums, c, dw);
    if (path == LN_DEPOSIT_SCALAR) {
        LN_FN(back_output_scalar)(x, dy, dx, d, w, c, dw, db);
        return;
    }
    LN_FN(back_output_span)(x, dy, dx, 0, d, w, c, dw, db, path, 0);
    LN_FN(back_counted)(dw, db, path);
}
