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
static double LN_FN(sum_squares)(const LN_S *x, size_t d, LN_T hi, LN_T lo, int far)
{
    (void)far; /* the reference asks for nothing ahead */
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

/* One pass, both sums of the one-pass statistics (ln_contract.h, item
 * 5): of x[i] - c, and of their squares. */
static void LN_FN(sum_shifted_squares)(const LN_S *x, size_t d, LN_T c, double *s1, double *s2,
                                       int far)
{
    (void)far;
    double t1[LN_LANES] = {0}, t2[LN_LANES] = {0};
    LN_T l1[LN_LANES] = {0}, l2[LN_LANES] = {0};
    for (size_t i = 0; i < d; i++) {
        LN_FN(add_shifted_square)(&l1[i % LN_LANES], &l2[i % LN_LANES], LN_LOAD(x + i), c);
        if ((i + 1) % LN_BLOCK == 0 || i + 1 == d) {
            LN_FN(flush)(t1, l1);
            LN_FN(flush)(t2, l2);
        }
    }
    *s1 = ln_tree_sum(t1);
    *s2 = ln_tree_sum(t2);
}

/* y = affine(normalize(x)). The reference never streams (nor
 * prefetches the record ahead). */
static void LN_FN(apply)(const LN_S *x, LN_S *y, size_t d, LN_T hi, LN_T r,
                         LN_T c, const LN_P *w, const LN_P *b, int stream, const char *ahead)
{
    (void)stream;
    (void)ahead;
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

/* ---- the backward ---------------------------------------------------- */

/* The four sums of ln_back_sums, each in the contract's order. */
static void LN_FN(back_sums)(const LN_S *x, const LN_S *dy, const LN_P *w, size_t d,
                             LN_T m0, ln_back_sums *s)
{
    double total[4][LN_LANES] = {{0}};
    LN_T lane[4][LN_LANES] = {{0}};
    LN_T max_dy = 0, max_t = 0;
    for (size_t i = 0; i < d; i++) {
        size_t j = i % LN_LANES;
        LN_T t = LN_LOAD(x + i) - m0, dyv = LN_LOAD(dy + i);
        LN_T g = LN_FN(gain_grad)(dyv, w, i);
        lane[0][j] += t;
        lane[1][j] = LN_FN(add_square)(lane[1][j], t);
        lane[2][j] += g;
        lane[3][j] = LN_FN(add_product)(lane[3][j], g, t);
        max_dy = fabs((double)dyv) > max_dy ? (LN_T)fabs((double)dyv) : max_dy;
        max_t = fabs((double)t) > max_t ? (LN_T)fabs((double)t) : max_t;
        if ((i + 1) % LN_BLOCK == 0 || i + 1 == d)
            for (int q = 0; q < 4; q++)
                LN_FN(flush)(total[q], lane[q]);
    }
    s->st = ln_tree_sum(total[0]);
    s->stt = ln_tree_sum(total[1]);
    s->g = ln_tree_sum(total[2]);
    s->gt = ln_tree_sum(total[3]);
    s->max_dy = max_dy;
    s->max_t = max_t;
}

/* dx of n elements, and their terms dy * xhat and dy deposited into the
 * level sums of dw and db at features at, at + 1, ... (path LN_DEPOSIT_3
 * or _2; NULL: no deposit). stream is ignored: plain stores. */
static void LN_FN(back_apply)(const LN_S *x, const LN_S *dy, LN_S *dx, size_t n,
                              const LN_P *w, LN_T hi, LN_T r, LN_T c, LN_T a, LN_T bm,
                              ln_acc *dw, ln_acc *db, int path, size_t at, int stream)
{
    (void)stream;
    for (size_t i = 0; i < n; i++) {
        LN_T xh = LN_FN(normalize)(LN_LOAD(x + i), hi, r, c);
        LN_T dyv = LN_LOAD(dy + i);
        size_t j = at + i;
        LN_STORE(dx + i, LN_FN(grad_input)(LN_FN(gain_grad)(dyv, w, i), xh, a, bm, r));
        if (dw && path == LN_DEPOSIT_PLAIN)
            dw->huge[j] += (double)dyv * (double)xh;
        else if (dw && path == LN_DEPOSIT_3)
            ln_deposit3(dw->sum[0], dw->sum[1], dw->sum[2], j, (double)dyv * (double)xh);
        else if (dw)
            ln_deposit2(dw->sum[1], dw->sum[2], j, (double)dyv * (double)xh);
        if (db && path == LN_DEPOSIT_PLAIN)
            db->huge[j] += (double)dyv;
        else if (db)
            ln_deposit_db(db->sum[0], db->sum[1], db->sum[2], j, (double)dyv,
                          path == LN_DEPOSIT_3 ? 3 : 2, LN_DB_ON_GRID);
    }
}
