/*
 * ln_scalar.c - the portable kernels. They define the reduction order that
 * the SIMD kernels reproduce bit for bit: element i is added to lane
 * i % LN_LANES, lanes start at +0.0, and ln_tree_sum combines them.
 */
#include <string.h>

#include "layernorm.h"
#include "ln_elem.h"

/* Pairwise tree: lane j += lane j + h for h = 16, 8, 4, 2, 1. */
double ln_tree_sum(double lanes[LN_LANES])
{
    for (size_t h = LN_LANES / 2; h >= 1; h /= 2) {
        for (size_t j = 0; j < h; j++)
            lanes[j] = lanes[j] + lanes[j + h];
    }
    return lanes[0];
}

/* Add float lanes into double lanes and clear them: the end of a block. */
static void flush_block(double lane[LN_LANES], float f[LN_LANES])
{
    for (size_t j = 0; j < LN_LANES; j++) {
        lane[j] += (double)f[j];
        f[j] = 0.0f;
    }
}

static double sum_f32_blocked(const float *x, size_t d, float shift)
{
    double lane[LN_LANES] = {0};
    float f[LN_LANES] = {0};
    for (size_t i = 0; i < d; i++) {
        f[i % LN_LANES] += x[i] - shift;
        if ((i + 1) % LN_BLOCK == 0 || i + 1 == d)
            flush_block(lane, f);
    }
    return ln_tree_sum(lane);
}

static double sumsq_f32_blocked(const float *x, size_t d, float mu_hi,
                                float mu_lo)
{
    double lane[LN_LANES] = {0};
    float f[LN_LANES] = {0};
    for (size_t i = 0; i < d; i++) {
        float t = ln_center_f32(x[i], mu_hi, mu_lo);
        f[i % LN_LANES] = ln_add_square_f32(f[i % LN_LANES], t);
        if ((i + 1) % LN_BLOCK == 0 || i + 1 == d)
            flush_block(lane, f);
    }
    return ln_tree_sum(lane);
}

static double sum_f32(const float *x, size_t d)
{
    double lane[LN_LANES] = {0};
    size_t i = 0;
    for (; i + LN_LANES <= d; i += LN_LANES)
        for (size_t j = 0; j < LN_LANES; j++)
            lane[j] += (double)x[i + j];
    for (size_t j = 0; i + j < d; j++)
        lane[j] += (double)x[i + j];
    return ln_tree_sum(lane);
}

static double sum_f64(const double *x, size_t d)
{
    double lane[LN_LANES] = {0};
    size_t i = 0;
    for (; i + LN_LANES <= d; i += LN_LANES)
        for (size_t j = 0; j < LN_LANES; j++)
            lane[j] += x[i + j];
    for (size_t j = 0; i + j < d; j++)
        lane[j] += x[i + j];
    return ln_tree_sum(lane);
}

/* Centered second pass: no E[x^2] - E[x]^2 cancellation. */
static double sumsq_f32(const float *x, size_t d, double mean)
{
    double lane[LN_LANES] = {0};
    size_t i = 0;
    for (; i + LN_LANES <= d; i += LN_LANES)
        for (size_t j = 0; j < LN_LANES; j++) {
            double t = (double)x[i + j] - mean;
            lane[j] += t * t;
        }
    for (size_t j = 0; i + j < d; j++) {
        double t = (double)x[i + j] - mean;
        lane[j] += t * t;
    }
    return ln_tree_sum(lane);
}

static double sumsq_f64(const double *x, size_t d, double mean)
{
    double lane[LN_LANES] = {0};
    size_t i = 0;
    for (; i + LN_LANES <= d; i += LN_LANES)
        for (size_t j = 0; j < LN_LANES; j++) {
            double t = x[i + j] - mean;
            lane[j] += t * t;
        }
    for (size_t j = 0; i + j < d; j++) {
        double t = x[i + j] - mean;
        lane[j] += t * t;
    }
    return ln_tree_sum(lane);
}

static void apply_f32(const float *x, float *y, size_t d, float mu_hi,
                      float mu_lo, float rstd, const float *w, const float *b,
                      const ln_hints *hints)
{
    float c = ln_offset_f32(mu_lo, rstd);
    for (size_t i = 0; i < d; i++)
        y[i] = ln_out_f32(x[i], mu_hi, rstd, c, w ? w + i : NULL,
                          b ? b + i : NULL);
}

static void apply_f64(const double *x, double *y, size_t d, double mean,
                      double rstd, const double *w, const double *b,
                      const ln_hints *hints)
{
    for (size_t i = 0; i < d; i++) {
        double v = (x[i] - mean) * rstd;
        if (w)
            v = v * w[i];
        if (b)
            v = v + b[i];
        y[i] = v;
    }
}

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Exact: every binary16 value is a binary32 value. NaNs come out quiet,
 * as the F16C instruction makes them. */
float ln_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;

    if (exp == 0x1f) {
        if (mant == 0)
            return bits_float(sign | 0x7f800000u);
        return bits_float(sign | 0x7fc00000u | (mant << 13));
    }
    if (exp == 0) {
        if (mant == 0)
            return bits_float(sign);
        /* Subnormal: shift the leading 1 up to the implicit position. */
        uint32_t e = 113;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            e--;
        }
        return bits_float(sign | (e << 23) | ((mant & 0x3ffu) << 13));
    }
    return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

/* Round to nearest, ties to even; overflow gives infinity. */
uint16_t ln_float_to_half(float f)
{
    uint32_t x = float_bits(f);
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

static void half_to_float(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = ln_half_to_float(src[i]);
}

static void float_to_half(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = ln_float_to_half(src[i]);
}

/* The portable kernels never stream, so there is nothing to order. */
static void store_fence(void) {}

const ln_kernels ln_kernels_scalar = {
    "scalar",        sum_f32_blocked, sumsq_f32_blocked, sum_f32,
    sum_f64,         sumsq_f32,       sumsq_f64,         apply_f32,
    apply_f64,       half_to_float,   float_to_half,     store_fence,
};
