/*
 * ln_portable.c - the portable vector level: the lane-form primitives
 * (ln_lane.h) in plain C, vectorized by the compiler for its target. It is
 * the default level on aarch64 (NEON) and every other non-x86 platform.
 * On x86-64 it is built with the AVX2 level's target features (FMA and
 * F16C included) but none of its intrinsics, so that what ARM users get
 * can be measured on x86 too.
 */
#include "layernorm.h"

#if defined(LN_HAVE_X86_LEVELS)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif
#endif

#define LN_PRIMS "ln_lane.h"
#define LN_LEVEL_NAME "portable"
#define LN_LEVEL_TABLE ln_kernels_portable
#if defined(__FLT16_MANT_DIG__)
/* The compiler converts _Float16 itself (F16C, or aarch64's fcvt). */
#define LN_HALF_T _Float16
#define LN_H2F(h) ((float)(h))
#define LN_F2H(f) ((_Float16)(f))
#else
#define LN_HALF_T uint16_t
#define LN_H2F(h) ln_half_to_float(h)
#define LN_F2H(f) ln_float_to_half(f)
#endif
#include "ln_level.h"

#if defined(LN_HAVE_X86_LEVELS) && defined(__clang__)
#pragma clang attribute pop
#endif
