/*
 * ln_elem.h - the element formulas of the contract (ln_contract.h, items 5
 * and 6), written once for both compute types. Part of the kernel
 * template: ln_ref.h and ln_lane.h include it for every instance, with
 * LN_T, LN_P and LN_FN defined (see ln_tmpl.h). No include guard.
 */

/* x - mean, with mean = hi + lo as two LN_T values. */
static inline LN_T LN_FN(center)(LN_T x, LN_T hi, LN_T lo)
{
    return (x - hi) - lo;
}

/* acc + t * t, rounded once. */
static inline LN_T LN_FN(add_square)(LN_T acc, LN_T t)
{
    return LN_FMA(t, t, acc);
}

/* The normalized value (x - hi - lo) * r as fma(x - hi, r, c), with
 * c = -(lo * r) computed once per record by LN_FN(offset). */
static inline LN_T LN_FN(offset)(LN_T lo, LN_T r)
{
    return -(lo * r);
}

static inline LN_T LN_FN(normalize)(LN_T x, LN_T hi, LN_T r, LN_T c)
{
    return LN_FMA(x - hi, r, c);
}

/* Gain and bias of feature i: fused when both are present. */
static inline LN_T LN_FN(affine)(LN_T v, const LN_P *w, const LN_P *b, size_t i)
{
    if (w && b)
        return LN_FMA(v, (LN_T)w[i], (LN_T)b[i]);
    if (w)
        return v * (LN_T)w[i];
    if (b)
        return v + (LN_T)b[i];
    return v;
}

/* The backward (ln_contract.h, 10): g = dy * weight, rounded once (the
 * batch layer passes ones for a layer without gain: dy * 1 is dy) ... */
static inline LN_T LN_FN(gain_grad)(LN_T dy, const LN_P *w, size_t i)
{
    return dy * (LN_T)w[i];
}

/* ... acc + g * t, rounded once (the sum of g * (x - m0)) ... */
static inline LN_T LN_FN(add_product)(LN_T acc, LN_T g, LN_T t)
{
    return LN_FMA(g, t, acc);
}

/* ... and the gradient of one input, (g - a - xhat * b) * r with
 * a = mean(g) and b = mean(g * xhat): fma(-xhat, b, g - a) * r. */
static inline LN_T LN_FN(grad_input)(LN_T g, LN_T xh, LN_T a, LN_T bm, LN_T r)
{
    return LN_FMA(-xh, bm, g - a) * r;
}

/* One element v of the one-pass statistics (ln_contract.h, item 5) into
 * its lanes: with u = v - c, a += u, q += u^2 rounded once. */
LN_ALWAYS_INLINE void LN_FN(add_shifted_square)(LN_T *a, LN_T *q, LN_T v, LN_T c)
{
    LN_T u = v - c;
    *a += u;
    *q = LN_FN(add_square)(*q, u);
}

/* End of a block: n block lanes into their double total lanes, then
 * clear (n is a constant where it is inlined, so the loop vectorizes:
 * GCC turned the backward's part-width flush, written out beside three
 * others in one loop, into scalar conversions). */
LN_ALWAYS_INLINE void LN_FN(flush_lanes)(double *total, LN_T *lane, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        total[j] += (double)lane[j];
        lane[j] = 0;
    }
}

static inline void LN_FN(flush)(double total[LN_LANES], LN_T lane[LN_LANES])
{
    LN_FN(flush_lanes)(total, lane, LN_LANES);
}
