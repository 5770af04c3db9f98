/*
 * ln_avx512.c - the AVX-512 level (F, BW, VL, DQ): the lane form built for
 * 512-bit vectors, with non-temporal stores for large outputs (ln_x86.h).
 * The 32 double lanes fill four zmm registers, the float block lanes two.
 */
#include "layernorm.h"

#if defined(LN_HAVE_X86_LEVELS)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,prefer-vector-width=512")
#endif

#define LN_VEC_BYTES 64
/* ln_x86.h's 256-bit loops (the backward's sums and parameter-gradient
 * groups, the one-pass statistics, short records) in this level too: on
 * Zen 4 (AVX-512, one thread) the lane form at 512 bits without them took
 * 1.27-1.37x their time for a float32 backward of (4096, 768), 1.9-2.0x
 * of (1e6, 64), 1.4-1.5x for float16 and bfloat16 (1e6, 64), and 1.4-1.5x
 * for a float32 forward of (1e6, 16) and (1e6, 64). The same bits (the
 * same order). */
#define LN_YMM_LOOPS 1
/* The float32 and float64 output loops (ln_lane.h's apply) in 256-bit
 * vectors: at 512 bits, on Zen 4, one thread, a float32 forward of
 * (4096, 768) took 1.14-1.28x the time with out=, 1.10x allocating,
 * RMSNorm 1.2x; (64, 768) 1.01-1.03x; float64 level. float16 and
 * bfloat16 rows keep 512 bits (bfloat16 at 256 took 1.15x). GCC only:
 * clang's target attribute has no such option. */
#if !defined(__clang__)
#define LN_PLAIN_APPLY_ATTR __attribute__((target("prefer-vector-width=256")))
#endif
#include "ln_x86.h"

#define LN_PRIMS "ln_lane.h"
#define LN_LEVEL_NAME "avx512"
#define LN_LEVEL_TABLE ln_kernels_avx512
/* float16 as its bits, converted by F16C (whole rows in ln_x86.h). */
#define LN_HALF_T uint16_t
#define LN_H2F(h) _cvtsh_ss(h)
#define LN_F2H(f) _cvtss_sh((f), _MM_FROUND_TO_NEAREST_INT)
#include "ln_level.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif /* LN_HAVE_X86_LEVELS */
