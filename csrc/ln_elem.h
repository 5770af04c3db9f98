/*
 * ln_elem.h - the float32 formulas of one element, shared by the scalar
 * kernels and the scalar heads/tails of the SIMD kernels, so that every
 * path rounds in exactly the same places. The SIMD loops use the same
 * operations lane by lane (fmaf <-> vfmadd: one rounding either way).
 */
#ifndef LN_ELEM_H
#define LN_ELEM_H

#include <math.h>
#include <stddef.h>

/* x - mean, with mean = mu_hi + mu_lo as two floats. */
static inline float ln_center_f32(float x, float mu_hi, float mu_lo)
{
    return (x - mu_hi) - mu_lo;
}

/* acc + t * t, rounded once. */
static inline float ln_add_square_f32(float acc, float t)
{
    return fmaf(t, t, acc);
}

/* The constant folding mu_lo into the output: (x - mu_hi - mu_lo) * rstd
 * = (x - mu_hi) * rstd + c. */
static inline float ln_offset_f32(float mu_lo, float rstd)
{
    return -(mu_lo * rstd);
}

/* One output: fma(x - mu_hi, rstd, c), then the gain and bias (fused when
 * both are present). */
static inline float ln_out_f32(float x, float mu_hi, float rstd, float c,
                               const float *w, const float *b)
{
    float v = fmaf(x - mu_hi, rstd, c);
    if (w && b)
        return fmaf(v, *w, *b);
    if (w)
        return v * *w;
    if (b)
        return v + *b;
    return v;
}

#endif /* LN_ELEM_H */
