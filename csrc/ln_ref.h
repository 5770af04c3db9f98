/*
 * ln_ref.h - the reference primitives: the contract (ln_contract.h) as
 * plain loops, one element at a time, element i into lane i % LN_LANES.
 * This is the spec the other levels are tested against bit for bit (the
 * tests, the fuzzer and tools/cross_check.sh), and the scalar level's code.
 * Part of the kernel template (see ln_tmpl.h). No include guard.
 */
#include "ln_elem.h"

/* Sum of x[i] - shift. */
static double LN_FN(sum_shifted)(const LN_S *x, size_t d, LN_T shift)
{
    double total[LN_LANES] = {0};
    LN_T lane[LN_LANES] = {0};
    for (size_t i = 0; i < d; i++) {
        lane[i % LN_LANES] += LN_LOAD(x + i) - shift;
        if ((i + 1) % LN_BLOCK == 0 || i + 1 == d)
            LN_FN(flush)(total, lane);
    }
    return ln_tree_sum(total);
}

/* Sum of squares of the centered values (x - hi) - lo. */
static double LN_FN(sum_squares)(const LN_S *x, size_t d, LN_T hi, LN_T lo)
{
    double total[LN_LANES] = {0};
    LN_T lane[LN_LANES] = {0};
    for (size_t i = 0; i < d; i++) {
        LN_T t = LN_FN(center)(LN_LOAD(x + i), hi, lo);
        lane[i % LN_LANES] = LN_FN(add_square)(lane[i % LN_LANES], t);
        if ((i + 1) % LN_BLOCK == 0 || i + 1 == d)
            LN_FN(flush)(total, lane);
    }
    return ln_tree_sum(total);
}

/* y = affine(normalize(x)). The reference never streams. */
static void LN_FN(apply)(const LN_S *x, LN_S *y, size_t d, LN_T hi, LN_T r,
                         LN_T c, const LN_P *w, const LN_P *b, int stream)
{
    (void)stream;
    for (size_t i = 0; i < d; i++)
        LN_STORE(y + i, LN_FN(affine)(LN_FN(normalize)(LN_LOAD(x + i), hi, r, c),
                                      w, b, i));
}

/* n values to the compute type, exactly (mixed-dtype rows are staged with
 * this: a float16 row of a float32 call, a float32 row of a float64 one). */
static inline void LN_FN(widen)(const void *src, void *dst, size_t n)
{
    const LN_S *s = src;
    LN_T *t = dst;
    for (size_t i = 0; i < n; i++)
        t[i] = LN_LOAD(s + i);
}
