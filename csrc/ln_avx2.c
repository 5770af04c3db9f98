/*
 * ln_avx2.c - the AVX2 level: the lane form built for AVX2 + FMA + F16C,
 * with non-temporal stores for large outputs (ln_x86.h).
 */
#include "layernorm.h"

#if defined(LN_HAVE_X86_LEVELS)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#define LN_VEC_BYTES 32
/* The forward's sums one block at a time (ln_lane.h): two blocks' lanes
 * and the totals spilled to the stack; float32 (64, 768) 7% faster. */
#define LN_PAIR_BLOCKS 0
#include "ln_x86.h"

#define LN_PRIMS "ln_lane.h"
#define LN_LEVEL_NAME "avx2"
#define LN_LEVEL_TABLE ln_kernels_avx2
/* float16 as its bits, converted by F16C (whole rows in ln_x86.h). */
#define LN_HALF_T uint16_t
#define LN_H2F(h) _cvtsh_ss(h)
#define LN_F2H(f) _cvtss_sh((f), _MM_FROUND_TO_NEAREST_INT)
#include "ln_level.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif /* LN_HAVE_X86_LEVELS */
