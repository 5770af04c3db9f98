/*
 * ln_level.h - one instruction-set level: the template instances, the
 * record kernels and the kernel table. Included once by each level's file,
 * which defines first:
 *   LN_PRIMS        "ln_ref.h" or "ln_lane.h"
 *   LN_LEVEL_NAME   the level's name, LN_LEVEL_TABLE its table's name
 *   LN_HALF_T       the C type float16 rows are read as (uint16_t, or
 *                   _Float16 where the compiler converts it natively)
 *   LN_H2F(h), LN_F2H(f)  float16 <-> float conversions of that type
 *   LN_STREAM_BYTES(dst, src, n)  optional: n (a multiple of 64) bytes
 *                   from src to the 64-byte aligned dst with non-temporal
 *                   stores; LN_STORE_FENCE orders them
 *   LN_LOAD_ROW_F16(v, p), LN_STORE_ROW_F16(p, v)  optional: LN_LANES
 *                   float16 values converted a register at a time
 *                   (LN_STREAM_ROW_F16(p, v): converted and written to the
 *                   64-byte aligned p with non-temporal stores), and
 *   LN_LOAD_PART_F16(v, p, n, w), LN_STORE_PART_F16(p, v, n, w)  the first
 *                   n of them (w >= n lanes filled, zeros beyond n); and
 *                   the same for float32 and float64 rows (_F32, _F64)
 *   LN_LOAD_ROW_F16_WIDE, LN_STORE_ROW_F16_WIDE  optional: the same rows
 *                   as doubles, for float16's double fallback
 *   LN_BACK_SUMS_F16_WIDE (_BF16_WIDE, _F32_WIDE)  optional: the
 *                   backward's sums of the float types' double fallback
 *
 * bfloat16 rows are converted a row at a time with ln_half.h's plain
 * loops, which the compiler vectorizes (the scalar level's reference
 * primitives read element by element and ignore row hooks).
 */
#include "ln_tmpl.h"

/* ---- instances: (storage, compute) pairs ---------------------------- */

/* float16 rows: float compute, double fallback. */
#define LN_S LN_HALF_T
#define LN_P float
#define LN_T double
#define LN_FN(f) f##_f16_wide
#define LN_DB_ON_GRID 0
#define LN_LOAD(p) ((double)LN_H2F(*(p)))
#define LN_STORE(p, v) (*(p) = LN_F2H(ln_double_to_float_odd(v)))
#if defined(LN_LOAD_ROW_F16_WIDE)
#define LN_LOAD_ROW LN_LOAD_ROW_F16_WIDE
#define LN_STORE_ROW LN_STORE_ROW_F16_WIDE
#endif
#if defined(LN_BACK_SUMS_F16_WIDE)
#define LN_BACK_SUMS_ROWS LN_BACK_SUMS_F16_WIDE
#endif
#include "ln_instance.h"
#undef LN_BACK_SUMS_ROWS
#undef LN_LOAD_ROW
#undef LN_STORE_ROW
#define LN_T float
#define LN_FN(f) f##_f16
#define LN_DB_ON_GRID 1
#define LN_LOAD(p) LN_H2F(*(p))
#define LN_STORE(p, v) (*(p) = LN_F2H(v))
#if defined(LN_BACK_SUMS_F16)
#define LN_BACK_SUMS_ROWS LN_BACK_SUMS_F16
#endif
#if defined(LN_SHIFTED_SQUARES_F16)
#define LN_SHIFTED_SQUARES_ROWS LN_SHIFTED_SQUARES_F16
#endif
#if defined(LN_SHORT_STATS_AVX)
#define LN_SHORT_STATS_ROWS LN_SHORT_STATS_AVX
#define LN_SHORT_OUTPUT_ROWS LN_SHORT_OUTPUT_AVX
/* the row kind of ln_x86.h's in-place 16-bit short loops (ln_lane.h's narrow_in_place) */
#define LN_SHORT_NARROW_KIND LN_ROWS_F16
#endif
#if defined(LN_SHORT_BACK_SUMS_AVX)
#define LN_SHORT_BACK_SUMS_ROWS LN_SHORT_BACK_SUMS_AVX
#define LN_SHORT_BACK_OUTPUT_ROWS LN_SHORT_BACK_OUTPUT_AVX
#endif
#if defined(LN_LOAD_ROW_F16)
#define LN_LOAD_ROW LN_LOAD_ROW_F16
#define LN_STORE_ROW LN_STORE_ROW_F16
#define LN_LOAD_PART LN_LOAD_PART_F16
#define LN_STORE_PART LN_STORE_PART_F16
#endif
#if defined(LN_STREAM_ROW_F16)
#define LN_STREAM_ROW LN_STREAM_ROW_F16
#endif
#include "ln_instance.h"
#undef LN_STREAM_ROW
#undef LN_LOAD_ROW
#undef LN_STORE_ROW
#undef LN_LOAD_PART
#undef LN_STORE_PART
#undef LN_BACK_SUMS_ROWS
#undef LN_SHIFTED_SQUARES_ROWS
#undef LN_SHORT_STATS_ROWS
#undef LN_SHORT_OUTPUT_ROWS
#undef LN_SHORT_NARROW_KIND
#undef LN_SHORT_BACK_SUMS_ROWS
#undef LN_SHORT_BACK_OUTPUT_ROWS
#define LN_CORE(f) f##_f16
#define LN_WIDE(f) f##_f16_wide
#define LN_OPS(f) f##_f16
#if defined(LN_BACK_GROUP_F16)
#define LN_BACK_GROUP_LOOP LN_BACK_GROUP_F16
#endif
#include "ln_ops.h"
#undef LN_BACK_GROUP_LOOP
#undef LN_CORE
#undef LN_WIDE
#undef LN_OPS
#undef LN_S
#undef LN_P

/* bfloat16 rows: float compute, double fallback. */
#define LN_S uint16_t
#define LN_P float
#define LN_T double
#define LN_FN(f) f##_bf16_wide
#define LN_DB_ON_GRID 0
#define LN_LOAD(p) ((double)ln_bf16_to_float(*(p)))
#define LN_STORE(p, v) (*(p) = ln_float_to_bf16(ln_double_to_float_odd(v)))
#if defined(LN_BACK_SUMS_BF16_WIDE)
#define LN_BACK_SUMS_ROWS LN_BACK_SUMS_BF16_WIDE
#endif
#include "ln_instance.h"
#undef LN_BACK_SUMS_ROWS
#define LN_T float
#define LN_FN(f) f##_bf16
#define LN_DB_ON_GRID 0
#define LN_LOAD(p) ln_bf16_to_float(*(p))
#define LN_STORE(p, v) (*(p) = ln_float_to_bf16(v))
#if defined(LN_BACK_SUMS_BF16)
#define LN_BACK_SUMS_ROWS LN_BACK_SUMS_BF16
#endif
#if defined(LN_SHIFTED_SQUARES_BF16)
#define LN_SHIFTED_SQUARES_ROWS LN_SHIFTED_SQUARES_BF16
#endif
#if defined(LN_SHORT_STATS_AVX)
#define LN_SHORT_STATS_ROWS LN_SHORT_STATS_AVX
#define LN_SHORT_OUTPUT_ROWS LN_SHORT_OUTPUT_AVX
#define LN_SHORT_NARROW_KIND LN_ROWS_BF16
#endif
#if defined(LN_SHORT_BACK_SUMS_AVX)
#define LN_SHORT_BACK_SUMS_ROWS LN_SHORT_BACK_SUMS_AVX
#define LN_SHORT_BACK_OUTPUT_ROWS LN_SHORT_BACK_OUTPUT_AVX
#endif
#if defined(LN_LOAD_ROW_BF16)
#define LN_LOAD_ROW LN_LOAD_ROW_BF16
#define LN_STORE_ROW LN_STORE_ROW_BF16
#else
#define LN_LOAD_ROW(v, p) ln_bf16_row_to_float((v), (p), LN_LANES)
#define LN_STORE_ROW(p, v) ln_float_row_to_bf16((p), (v), LN_LANES)
#endif
#if defined(LN_LOAD_PART_BF16)
#define LN_LOAD_PART LN_LOAD_PART_BF16
#define LN_STORE_PART LN_STORE_PART_BF16
#endif
#include "ln_instance.h"
#undef LN_LOAD_ROW
#undef LN_STORE_ROW
#undef LN_LOAD_PART
#undef LN_STORE_PART
#undef LN_BACK_SUMS_ROWS
#undef LN_SHIFTED_SQUARES_ROWS
#undef LN_SHORT_STATS_ROWS
#undef LN_SHORT_OUTPUT_ROWS
#undef LN_SHORT_NARROW_KIND
#undef LN_SHORT_BACK_SUMS_ROWS
#undef LN_SHORT_BACK_OUTPUT_ROWS
#define LN_CORE(f) f##_bf16
#define LN_WIDE(f) f##_bf16_wide
#define LN_OPS(f) f##_bf16
#include "ln_ops.h"
#undef LN_CORE
#undef LN_WIDE
#undef LN_OPS
#undef LN_S
#undef LN_P

/* float32 rows: float compute, double fallback. */
#define LN_S float
#define LN_P float
#define LN_T double
#define LN_FN(f) f##_f32_wide
#define LN_DB_ON_GRID 0
#define LN_LOAD(p) ((double)*(p))
#define LN_STORE(p, v) (*(p) = (float)(v))
#if defined(LN_BACK_SUMS_F32_WIDE)
#define LN_BACK_SUMS_ROWS LN_BACK_SUMS_F32_WIDE
#endif
#include "ln_instance.h"
#undef LN_BACK_SUMS_ROWS
#define LN_T float
#define LN_FN(f) f##_f32
#define LN_DB_ON_GRID 0
#define LN_LOAD(p) (*(p))
#define LN_STORE(p, v) (*(p) = (v))
#if defined(LN_BACK_SUMS_F32)
#define LN_BACK_SUMS_ROWS LN_BACK_SUMS_F32
#endif
#if defined(LN_BACK_GROUP_F32)
#define LN_BACK_GROUP_LOOP LN_BACK_GROUP_F32
#endif
#if defined(LN_SHIFTED_SQUARES_F32)
#define LN_SHIFTED_SQUARES_ROWS LN_SHIFTED_SQUARES_F32
#endif
#if defined(LN_SHORT_STATS_AVX)
#define LN_SHORT_STATS_ROWS LN_SHORT_STATS_AVX
#define LN_SHORT_OUTPUT_ROWS LN_SHORT_OUTPUT_AVX
#endif
#if defined(LN_SHORT_BACK_SUMS_AVX)
#define LN_SHORT_BACK_SUMS_ROWS LN_SHORT_BACK_SUMS_AVX
#define LN_SHORT_BACK_OUTPUT_ROWS LN_SHORT_BACK_OUTPUT_AVX
#endif
#if defined(LN_LOAD_PART_F32)
#define LN_LOAD_PART LN_LOAD_PART_F32
#define LN_STORE_PART LN_STORE_PART_F32
#endif
#include "ln_instance.h"
#undef LN_LOAD_PART
#undef LN_STORE_PART
#undef LN_BACK_SUMS_ROWS
#undef LN_SHIFTED_SQUARES_ROWS
#undef LN_SHORT_STATS_ROWS
#undef LN_SHORT_OUTPUT_ROWS
#undef LN_SHORT_NARROW_KIND
#undef LN_SHORT_BACK_SUMS_ROWS
#undef LN_SHORT_BACK_OUTPUT_ROWS
#define LN_CORE(f) f##_f32
#define LN_WIDE(f) f##_f32_wide
#define LN_OPS(f) f##_f32
#include "ln_ops.h"
#undef LN_BACK_GROUP_LOOP
#undef LN_CORE
#undef LN_WIDE
#undef LN_OPS
#undef LN_S
#undef LN_P

/* float64 rows: double compute, scaled fallback. */
#define LN_S double
#define LN_P double
#define LN_T double
#define LN_FN(f) f##_f64
#define LN_DB_ON_GRID 0
#define LN_LOAD(p) (*(p))
#define LN_STORE(p, v) (*(p) = (v))
#if defined(LN_LOAD_PART_F64)
#define LN_LOAD_PART LN_LOAD_PART_F64
#define LN_STORE_PART LN_STORE_PART_F64
#endif
#if defined(LN_SHIFTED_SQUARES_F64)
#define LN_SHIFTED_SQUARES_ROWS LN_SHIFTED_SQUARES_F64
#endif
#if defined(LN_BACK_SUMS_F64)
#define LN_BACK_SUMS_ROWS LN_BACK_SUMS_F64
#endif
#include "ln_instance.h"
#undef LN_LOAD_PART
#undef LN_STORE_PART
#undef LN_SHIFTED_SQUARES_ROWS
#undef LN_BACK_SUMS_ROWS
#define LN_CORE(f) f##_f64
#define LN_OPS(f) f##_f64
#include "ln_ops.h"
#undef LN_CORE
#undef LN_OPS
#undef LN_S
#undef LN_P

#ifndef LN_STORE_FENCE
/* Nothing streamed, nothing to order. */
static void ln_no_fence(void) {}
#define LN_STORE_FENCE ln_no_fence
#endif

/* ---- the table -------------------------------------------------------- */

const ln_kernels LN_LEVEL_TABLE = {
    .name = LN_LEVEL_NAME,
    .op = {
        [LN_OP_LAYER_NORM] = {
            [LN_F16] = layer_norm_f16,
            [LN_BF16] = layer_norm_bf16,
            [LN_F32] = layer_norm_f32,
            [LN_F64] = layer_norm_f64,
        },
        [LN_OP_LAYER_NORM_BACKWARD] = {
            [LN_F16] = layer_norm_backward_f16,
            [LN_BF16] = layer_norm_backward_bf16,
            [LN_F32] = layer_norm_backward_f32,
            [LN_F64] = layer_norm_backward_f64,
        },
        [LN_OP_RMS_NORM] = {
            [LN_F16] = rms_norm_f16,
            [LN_BF16] = rms_norm_bf16,
            [LN_F32] = rms_norm_f32,
            [LN_F64] = rms_norm_f64,
        },
        [LN_OP_RMS_NORM_BACKWARD] = {
            [LN_F16] = rms_norm_backward_f16,
            [LN_BF16] = rms_norm_backward_bf16,
            [LN_F32] = rms_norm_backward_f32,
            [LN_F64] = rms_norm_backward_f64,
        },
    },
    .widen = {
        [LN_F16] = {[LN_F32] = widen_f16, [LN_F64] = widen_f16_wide},
        [LN_BF16] = {[LN_F32] = widen_bf16, [LN_F64] = widen_bf16_wide},
        [LN_F32] = {[LN_F64] = widen_f32_wide},
    },
    .store_fence = LN_STORE_FENCE,
};
