/*
 * tools/ln_values.h - the dtype names and value conversions of the test
 * programs (tools/cross_check.c, fuzz/fuzz_kernels.c; not part of the
 * library): a value stored in a dtype, and read back as a double.
 * Include after layernorm.h and ln_half.h. LN_VALUES_ATTR, if defined
 * first, marks the functions (the fuzzer keeps them out of its coverage).
 */
#ifndef LN_VALUES_H
#define LN_VALUES_H

#include <stdint.h>
#include <string.h>

#ifndef LN_VALUES_ATTR
#define LN_VALUES_ATTR
#endif

static const char *const dtype_names[LN_NDTYPES] = {
    [LN_F16] = "float16", [LN_BF16] = "bfloat16", [LN_F32] = "float32", [LN_F64] = "float64"};

/* v rounded to t (once for float/double, twice for the 16-bit types, via
 * float: fine for making inputs). */
LN_VALUES_ATTR static void put_value(double v, ln_dtype t, void *dst)
{
    float f = (float)v;
    uint16_t h;
    switch (t) {
    case LN_F64:
        memcpy(dst, &v, 8);
        return;
    case LN_F32:
        memcpy(dst, &f, 4);
        return;
    case LN_F16:
        h = ln_float_to_half(f);
        break;
    default:
        h = ln_float_to_bf16(f);
        break;
    }
    memcpy(dst, &h, 2);
}

/* The value stored at src in t, exactly, as a double. */
LN_VALUES_ATTR static double get_value(const void *src, ln_dtype t)
{
    uint16_t h;
    float f;
    double v;
    switch (t) {
    case LN_F64:
        memcpy(&v, src, 8);
        return v;
    case LN_F32:
        memcpy(&f, src, 4);
        return f;
    case LN_F16:
        memcpy(&h, src, 2);
        return ln_half_to_float(h);
    default:
        memcpy(&h, src, 2);
        return ln_bf16_to_float(h);
    }
}

#endif
