/*
 * ln_contract.h - the reproducibility contract: the one place that says in
 * which order a record's sums are taken and where multiply-adds are fused.
 * docs/math.rst and README link here; every kernel level follows it.
 *
 * A record's result depends on its d values (and eps, weight, bias) alone,
 * bit for bit, on every instruction-set level, thread count and layout:
 *
 * 1. Lanes. Element i of a record goes to lane i % LN_LANES. Each lane
 *    adds its elements in increasing i.
 * 2. Blocks. Elements are summed LN_BLOCK at a time in block lanes of the
 *    compute type (float for float16/bfloat16/float32 records, double for
 *    float64), starting at +0.0; at the end of each block (and of the
 *    record) block lane j is added to total lane j, a double. Short float
 *    runs keep float rounding small while float lanes run at twice the
 *    width of double ones.
 * 3. Tree. The LN_LANES total lanes are combined pairwise:
 *    for h = LN_LANES/2, ..., 2, 1: lane[j] += lane[j + h], j < h.
 * 4. Shift. The first pass sums u = x[i] - s (in the compute type), so a
 *    large common offset never enters the float sums; mean = s + sum/d
 *    in double. The shift s is x[0] for records of up to
 *    LN_ONE_PASS_MIN_D features, and for longer ones the square shift c:
 *    the mean of the first LN_SHIFT_SPAN values, summed in double by the
 *    pairwise tree of item 3, divided by LN_SHIFT_SPAN and rounded to T
 *    (closer to the mean than x[0], and one u serves both sums of item 5).
 * 5. Centering. mean is split into hi = (T)mean and lo = (T)(mean - hi);
 *    the second pass sums squares of t = (x - hi) - lo.
 *    Records of more than LN_ONE_PASS_MIN_D features take one pass
 *    instead, whenever it is accurate: beside the sum of item 4 it sums
 *    the squares of the same u = x - c (fma(u, u, acc), items 1-3). With
 *    dm = sum/d (mean - c, free of the mean's rounding),
 *    var = sum u^2 / d - dm^2 (double)
 *    when dm^2 <= var and var is finite: c is then within a standard
 *    deviation of the mean and the subtraction loses at most one bit.
 *    Otherwise (a shift far from the mean, NaN, overflow) the second pass
 *    of item 5 computes var, exactly as for shorter records.
 * 6. Fusing. Multiply-adds are fused (one rounding) in exactly three
 *    places of the forward, and nowhere else (everything is built with
 *    -ffp-contract=off; the backward's are item 10):
 *      the square:  acc = fma(t, t, acc) (or fma(u, u, acc), item 5)
 *      the output:  v = fma(x - hi, r, c), with r = (T)(1/sqrt(var + eps))
 *                   and c = -(lo * r)
 *      the affine:  y = fma(v, w, b) when both gain and bias are present
 *                   (v * w or v + b when only one is).
 * 7. Rounding. 1/sqrt(var + eps) is computed in double (at a quarter,
 *    exactly, when var + eps overflows); the result is
 *    rounded once to the output type (round to nearest even).
 * 8. Fallbacks, decided from the record's own statistics: a float record
 *    whose variance leaves [LN_F32_VAR_MIN, LN_F32_VAR_MAX] (squares could
 *    overflow or underflow in float lanes), whose mean is not finite, or
 *    whose 1/std leaves the range of normal floats is computed with the same formulas
 *    in double (block lanes of double); a float64 record whose squares leave
 *    the double range is computed at an exact power-of-two scale.
 * 9. NaN. A record with a NaN or infinity among its values, an invalid
 *    eps, or a constant record with eps = 0 (0/0) is written as the
 *    canonical quiet NaN (NaNs made by arithmetic differ in sign between
 *    x86 and aarch64).
 * 10. The backward. One pass over (x, dy) around a shift m0, in the
 *    compute type with t = x - m0 and g = dy * weight (rounded once; ones
 *    for no gain): four sums in the order of items 1-3, of t, of t^2 and
 *    g*t (fused: fma(t, t, acc), fma(g, t, acc)) and of g. In double:
 *    md = sum t / d, mean = m0 + md, var = max(sum t^2 / d - md^2, 0),
 *    r = 1/sqrt(var + eps),
 *    a = sum g / d, bm = r (sum g t - md sum g) / d. Then per element,
 *    xhat = fma(x - hi, r, c) as in item 6 and dx = fma(-xhat, bm, g - a) * r,
 *    rounded once to the output type. The parameter gradients' terms
 *    dy * xhat and dy are summed exactly (ln_accum.h) and rounded once, so
 *    their order never matters. The shift: for records of more than
 *    LN_ONE_PASS_MIN_D features, m0 = c, item 5's square shift, kept when
 *    md^2 <= var (c within a standard deviation of the mean: the
 *    subtraction loses at most a bit) and the record needs none of the
 *    fallbacks below; otherwise, and for shorter records, the pass is
 *    taken around the forward's mean (given, or recomputed by items 1-4:
 *    the same bits; md is then within rounding of 0). Whether c is kept
 *    depends on the record's x, dy and weight, never on a given mean, so
 *    a given mean changes no bit.
 *    Fallbacks and NaN records as in items 8-9,
 *    and: a float record whose float sums overflow, or whose formulas
 *    could overflow in float (|dy| max|weight| + |a| + max|xhat| |bm|
 *    beyond FLT_MAX) or use a subnormal r, is computed in double; a record
 *    whose formulas could overflow even in double is NaN.
 * 11. RMSNorm is the same with the mean fixed at 0 (hi = lo = 0): its
 *    mean square is item 2-3's sum of fma(x, x, acc) over d, its output
 *    v = fma(x - 0, r, -0) * scale, and its backward item 10 with m0 = 0,
 *    md = 0, a = 0 and bm = r sum(g x) / d.
 */
#ifndef LN_CONTRACT_H
#define LN_CONTRACT_H

#define LN_LANES 32
#define LN_BLOCK 256

/* Item 5: the one-pass statistics, and the values their shift is the
 * mean of. Shorter records (two lane rows at most: the short paths keep
 * them in registers) always take two passes. */
#define LN_ONE_PASS_MIN_D (2 * LN_LANES)
#define LN_SHIFT_SPAN 8
_Static_assert(LN_ONE_PASS_MIN_D >= LN_SHIFT_SPAN, "the shift's values lie in the record");
_Static_assert((LN_SHIFT_SPAN & (LN_SHIFT_SPAN - 1)) == 0, "a pairwise tree over the span");

/* Variances the float block lanes hold safely. */
#define LN_F32_VAR_MIN 1e-30
#define LN_F32_VAR_MAX 1e30

/* The tree halves the lane count down to 1, and the SIMD levels hold the
 * lanes in whole registers (8 doubles or 16 floats of AVX-512). */
_Static_assert(LN_LANES >= 16 && (LN_LANES & (LN_LANES - 1)) == 0,
               "LN_LANES must be a power of two, at least 16");
/* A block is a whole number of lane rows, so blocks start at lane 0. */
_Static_assert(LN_BLOCK % LN_LANES == 0, "LN_BLOCK must be a multiple of LN_LANES");

#endif /* LN_CONTRACT_H */
