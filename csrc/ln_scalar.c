/*
 * ln_scalar.c - the scalar level: the reference of the contract, plain C
 * loops one element at a time (ln_ref.h). It runs anywhere, and is the
 * fallback for CPUs without fused multiply-add in hardware (there fmaf is
 * a correctly rounded library call: slow, but the same bits).
 */
#include "layernorm.h"

#define LN_PRIMS "ln_ref.h"
#define LN_LEVEL_NAME "scalar"
#define LN_LEVEL_TABLE ln_kernels_scalar
#define LN_HALF_T uint16_t
#define LN_H2F(h) ln_half_to_float(h)
#define LN_F2H(f) ln_float_to_half(f)
#include "ln_level.h"
