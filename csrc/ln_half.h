/*
 * ln_half.h - the 16-bit storage types: IEEE binary16 (float16) and
 * bfloat16, converted exactly to float and back with round to nearest
 * even. Both are computed in float; these conversions are the only place
 * their bits are looked at.
 *
 * The bit-level functions are the reference (the scalar level and the
 * staging code use them); where the compiler has a native _Float16 the
 * vector levels let it convert (F16C on x86, fcvt on aarch64), which gives
 * the same values.
 */
#ifndef LN_HALF_H
#define LN_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t ln_float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float ln_bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* binary16 -> binary32, exact. NaNs come out quiet, keeping their payload,
 * as the F16C and aarch64 instructions make them. */
static inline float ln_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;

    if (exp == 0x1f)
        return ln_bits_float(sign | 0x7f800000u | (mant ? 0x400000u | (mant << 13) : 0));
    if (exp == 0) {
        if (mant == 0)
            return ln_bits_float(sign);
        /* Subnormal: shift the leading 1 up to the implicit position. */
        uint32_t e = 113;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            e--;
        }
        return ln_bits_float(sign | (e << 23) | ((mant & 0x3ffu) << 13));
    }
    return ln_bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

/* binary32 -> binary16, round to nearest even; overflow gives infinity. */
static inline uint16_t ln_float_to_half(float f)
{
    uint32_t x = ln_float_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;

    if (ax > 0x7f800000u) /* NaN: keep the top payload bits, make it quiet */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* >= 65520 rounds past 65504 */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: a subnormal half or zero */
        if (ax <= 0x33000000u) /* <= 2^-25 rounds to zero */
            return sign;
        uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - (ax >> 23);
        uint32_t r = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t h = (ax >> 13) - (112u << 10);
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

/* bfloat16 -> binary32: the stored bits are the top half, exact. */
static inline float ln_bf16_to_float(uint16_t h)
{
    return ln_bits_float((uint32_t)h << 16);
}

/* binary32 -> bfloat16, round to nearest even (overflow gives infinity);
 * NaNs stay NaN, made quiet. Plain integer operations: they vectorize. */
static inline uint16_t ln_float_to_bf16(float f)
{
    uint32_t x = ln_float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* bfloat16 rows of n values to float and back, as plain loops over
 * integers that compilers vectorize for any target (a shift, and the
 * rounding above with a select for NaN): the lane-form levels convert
 * bfloat16 a row at a time with these. */
static inline void ln_bf16_row_to_float(float *v, const uint16_t *p, size_t n)
{
    for (size_t j = 0; j < n; j++)
        v[j] = ln_bf16_to_float(p[j]);
}

static inline void ln_float_row_to_bf16(uint16_t *p, const float *v, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        uint32_t x = ln_float_bits(v[j]);
        uint32_t nearest = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
        uint32_t quiet = (x >> 16) | 0x0040u;
        p[j] = (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? quiet : nearest);
    }
}

#endif /* LN_HALF_H */
