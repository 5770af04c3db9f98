/*
 * ln_x86.h - what the x86 levels add to the lane form: non-temporal stores
 * for outputs too large to stay in the caches, and the fence that orders
 * them. Included by ln_avx2.c and ln_avx512.c under their target pragma,
 * with LN_VEC_BYTES (32 or 64) set.
 */
#ifndef LN_X86_H
#define LN_X86_H

#include <float.h>
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "ln_half.h"
#include "ln_tmpl.h"

_Static_assert(LN_VEC_BYTES == 32 || LN_VEC_BYTES == 64, "LN_VEC_BYTES: 32 or 64");

/* n bytes (a multiple of 64) from src to the 64-byte aligned dst, 32
 * bytes at a time at both levels: src is a row the output loops have just
 * written, at the AVX-512 level in 256-bit stores too (ln_avx512.c's
 * LN_PLAIN_APPLY_ATTR), and a 64-byte load cannot take its bytes from two
 * stores in flight (float32 (4096, 768) out= took 1.86x the time). */
static inline void ln_stream_bytes(void *dst, const void *src, size_t n)
{
    char *d = dst;
    const char *s = src;
    for (size_t k = 0; k < n; k += 32)
        _mm256_stream_si256((__m256i *)(d + k), _mm256_loadu_si256((const __m256i *)(s + k)));
}

static void ln_sfence(void) { _mm_sfence(); }

/* ln_tree_sum (ln_tmpl.h) of LN_LANES double lanes held in eight
 * registers, lanes 4h to 4h + 3 in t[h]: the same additions in the same
 * order, without storing the lanes first. */
_Static_assert(LN_LANES == 32, "the register tree takes 32 lanes, four to a register");
static inline double ln_tree_sum_regs(const __m256d t[8])
{
    __m256d s0 = _mm256_add_pd(t[0], t[4]), s1 = _mm256_add_pd(t[1], t[5]);
    __m256d s2 = _mm256_add_pd(t[2], t[6]), s3 = _mm256_add_pd(t[3], t[7]);
    __m256d v = _mm256_add_pd(_mm256_add_pd(s0, s2), _mm256_add_pd(s1, s3));
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

/* float16 rows of LN_LANES elements, converted a register at a time
 * (GCC does not vectorize _Float16 conversions by itself). The conversion
 * instructions round to nearest even, as the scalar conversions do. */
static inline void ln_load_row_f16(float *v, const uint16_t *p)
{
    for (size_t j = 0; j < LN_LANES; j += LN_VEC_BYTES / 4) {
#if LN_VEC_BYTES == 64
        _mm512_storeu_ps(v + j, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + j))));
#else
        _mm256_storeu_ps(v + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + j))));
#endif
    }
}

static inline void ln_store_row_f16(uint16_t *p, const float *v)
{
    for (size_t j = 0; j < LN_LANES; j += LN_VEC_BYTES / 4) {
#if LN_VEC_BYTES == 64
        _mm256_storeu_si256((__m256i *)(p + j),
                            _mm512_cvtps_ph(_mm512_loadu_ps(v + j), _MM_FROUND_TO_NEAREST_INT));
#else
        _mm_storeu_si128((__m128i *)(p + j),
                         _mm256_cvtps_ph(_mm256_loadu_ps(v + j), _MM_FROUND_TO_NEAREST_INT));
#endif
    }
}

/* float16 rows as doubles, for the float16 instance's double fallback
 * (ln_level.h), whose element-by-element conversions (a scalar
 * conversion each way, and the rounding to odd) had kept its loops
 * scalar: a (64, 768) float16 backward of constant records (which take
 * that fallback), one thread, 516 -> 215 us (ordinary records: 58 us).
 * Four lanes at a time, in 256-bit registers at either level. */
static inline void ln_load_row_f16d(double *v, const uint16_t *p)
{
    for (size_t j = 0; j < LN_LANES; j += 8) {
        __m256 f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + j)));
        _mm256_storeu_pd(v + j, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
        _mm256_storeu_pd(v + j + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
    }
}

/* ln_double_to_float_odd (ln_tmpl.h) of four doubles, the same steps:
 * rounded to nearest, one unit back where that went away from zero, the
 * last bit set where inexact (neither for NaN). */
static inline __m128 ln_float_odd4(__m256d v)
{
    const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffff));
    const __m256i low_halves = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    __m128 f = _mm256_cvtpd_ps(v);
    __m256d back = _mm256_cvtps_pd(f);
    __m256d away = _mm256_cmp_pd(_mm256_and_pd(back, abs_mask), _mm256_and_pd(v, abs_mask),
                                 _CMP_GT_OQ);
    __m256d inexact = _mm256_cmp_pd(back, v, _CMP_NEQ_OQ);
    /* the 64-bit masks (all ones or zeros) as 32-bit ones */
    __m128i a = _mm256_castsi256_si128(
        _mm256_permutevar8x32_epi32(_mm256_castpd_si256(away), low_halves));
    __m128i e = _mm256_castsi256_si128(
        _mm256_permutevar8x32_epi32(_mm256_castpd_si256(inexact), low_halves));
    __m128i u = _mm_add_epi32(_mm_castps_si128(f), a); /* + (-1): one unit back */
    u = _mm_or_si128(u, _mm_and_si128(e, _mm_set1_epi32(1)));
    return _mm_castsi128_ps(u);
}

/* doubles to a float16 row, each rounded once (to odd in float, then to
 * nearest even in float16: ln_level.h's LN_STORE of the fallback). */
static inline void ln_store_row_f16d(uint16_t *p, const double *v)
{
    for (size_t j = 0; j < LN_LANES; j += 8) {
        __m256 f = _mm256_set_m128(ln_float_odd4(_mm256_loadu_pd(v + j + 4)),
                                   ln_float_odd4(_mm256_loadu_pd(v + j)));
        _mm_storeu_si128((__m128i *)(p + j), _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT));
    }
}

/* ... and written to the 64-byte aligned p with non-temporal stores, a
 * whole vector at a time. Through a buffer, a wide load over two of the
 * conversion's narrower stores cannot be forwarded from them (streamed
 * float16 (16384, 4096) took 2.2x as long). */
static inline void ln_stream_row_f16(uint16_t *p, const float *v)
{
    for (size_t j = 0; j < LN_LANES; j += LN_VEC_BYTES / 2) {
#if LN_VEC_BYTES == 64
        __m256i lo = _mm512_cvtps_ph(_mm512_loadu_ps(v + j), _MM_FROUND_TO_NEAREST_INT);
        __m256i hi = _mm512_cvtps_ph(_mm512_loadu_ps(v + j + 16), _MM_FROUND_TO_NEAREST_INT);
        _mm512_stream_si512((void *)(p + j), _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
#else
        __m128i lo = _mm256_cvtps_ph(_mm256_loadu_ps(v + j), _MM_FROUND_TO_NEAREST_INT);
        __m128i hi = _mm256_cvtps_ph(_mm256_loadu_ps(v + j + 8), _MM_FROUND_TO_NEAREST_INT);
        _mm256_stream_si256((__m256i *)(p + j), _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
#endif
    }
}

/* Eight bfloat16 values as floats (exact: the bits moved up), for both
 * levels' 256-bit loops. */
static inline __m256 ln_float8_of_bf16(__m128i h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The first n <= width of a row (zeros beyond, up to width), and back: masked loads
 * and stores with AVX-512, a small zero-padded buffer with AVX2 (which has
 * no 16-bit masked moves). Nothing past n is read or written. */
#if LN_VEC_BYTES == 64
static inline __mmask16 ln_first16(size_t n)
{
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}
#endif

#if LN_VEC_BYTES == 32
static inline __m128i ln_bf16_of8(__m256 f);

/* Eight 16-bit values as floats (bf: bfloat16, else float16), and eight
 * floats rounded to them (to nearest even). */
static inline __m256 ln_float_of_h8(__m128i h, int bf)
{
    return bf ? ln_float8_of_bf16(h) : _mm256_cvtph_ps(h);
}

static inline __m128i ln_h8_of(__m256 f, int bf)
{
    return bf ? ln_bf16_of8(f) : _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT);
}

/* The first n <= width 16-bit values of a row as floats, zeros beyond up
 * to width (a multiple of 8), and back: whole vectors of eight converted
 * where they are, only the last partial one through a small buffer (the
 * whole row had gone through one, with a call to memcpy, every time). */
static inline void ln_load_part_h8(float *v, const uint16_t *p, size_t n, size_t width, int bf)
{
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(v + j, ln_float_of_h8(_mm_loadu_si128((const __m128i *)(p + j)), bf));
    if (j < n) {
        uint16_t buf[8] = {0};
        memcpy(buf, p + j, (n - j) * sizeof *p);
        _mm256_storeu_ps(v + j, ln_float_of_h8(_mm_loadu_si128((const __m128i *)buf), bf));
        j += 8;
    }
    for (; j < width; j += 8)
        _mm256_storeu_ps(v + j, _mm256_setzero_ps());
}

static inline void ln_store_part_h8(uint16_t *p, const float *v, size_t n, int bf)
{
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm_storeu_si128((__m128i *)(p + j), ln_h8_of(_mm256_loadu_ps(v + j), bf));
    if (j < n) {
        uint16_t buf[8];
        _mm_storeu_si128((__m128i *)buf, ln_h8_of(_mm256_loadu_ps(v + j), bf));
        memcpy(p + j, buf, (n - j) * sizeof *p);
    }
}
#endif

static inline void ln_load_part_f16(float *v, const uint16_t *p, size_t n, size_t width)
{
#if LN_VEC_BYTES == 64
    for (size_t j = 0; j < width; j += 16) {
        __m256i h = _mm256_maskz_loadu_epi16(ln_first16(n > j ? n - j : 0), p + j);
        _mm512_storeu_ps(v + j, _mm512_cvtph_ps(h));
    }
#else
    ln_load_part_h8(v, p, n, width, 0);
#endif
}

static inline void ln_store_part_f16(uint16_t *p, const float *v, size_t n, size_t width)
{
#if LN_VEC_BYTES == 64
    for (size_t j = 0; j < width; j += 16) {
        __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(v + j), _MM_FROUND_TO_NEAREST_INT);
        _mm256_mask_storeu_epi16(p + j, ln_first16(n > j ? n - j : 0), h);
    }
#else
    (void)width;
    ln_store_part_h8(p, v, n, 0);
#endif
}

/* The first n < LN_LANES floats or doubles of a row, zeros beyond, with
 * masked loads (GCC's own masked loads for such loops are not reliable).
 * AVX2 masks only the vector that holds the end: AMD's Zen cores run
 * vmaskmov slowly (a masked store is several times a plain one), and
 * whole vectors inside the row need no mask; a store past the end's
 * vector writes nothing. */
static inline void ln_load_part_f32(float *v, const float *p, size_t n, size_t width)
{
    for (size_t j = 0; j < width; j += LN_VEC_BYTES / 4) {
        size_t k = n > j ? n - j : 0;
#if LN_VEC_BYTES == 64
        _mm512_storeu_ps(v + j, _mm512_maskz_loadu_ps(ln_first16(k), p + j));
#else
        if (k >= 8) {
            _mm256_storeu_ps(v + j, _mm256_loadu_ps(p + j));
            continue;
        }
        __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)k), lane);
        _mm256_storeu_ps(v + j, _mm256_maskload_ps(p + j, m));
#endif
    }
}

static inline void ln_load_part_f64(double *v, const double *p, size_t n, size_t width)
{
    for (size_t j = 0; j < width; j += LN_VEC_BYTES / 8) {
        size_t k = n > j ? n - j : 0;
#if LN_VEC_BYTES == 64
        _mm512_storeu_pd(v + j, _mm512_maskz_loadu_pd((__mmask8)ln_first16(k > 8 ? 8 : k), p + j));
#else
        if (k >= 4) {
            _mm256_storeu_pd(v + j, _mm256_loadu_pd(p + j));
            continue;
        }
        __m256i lane = _mm256_setr_epi64x(0, 1, 2, 3);
        __m256i m = _mm256_cmpgt_epi64(_mm256_set1_epi64x((long long)k), lane);
        _mm256_storeu_pd(v + j, _mm256_maskload_pd(p + j, m));
#endif
    }
}

/* ... and the first n of v stored to p (nothing beyond). */
static inline void ln_store_part_f32(float *p, const float *v, size_t n, size_t width)
{
    for (size_t j = 0; j < width; j += LN_VEC_BYTES / 4) {
        size_t k = n > j ? n - j : 0;
#if LN_VEC_BYTES == 64
        _mm512_mask_storeu_ps(p + j, ln_first16(k), _mm512_loadu_ps(v + j));
#else
        if (k >= 8) {
            _mm256_storeu_ps(p + j, _mm256_loadu_ps(v + j));
            continue;
        }
        if (k == 0)
            break;
        __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)k), lane);
        _mm256_maskstore_ps(p + j, m, _mm256_loadu_ps(v + j));
#endif
    }
}

static inline void ln_store_part_f64(double *p, const double *v, size_t n, size_t width)
{
    for (size_t j = 0; j < width; j += LN_VEC_BYTES / 8) {
        size_t k = n > j ? n - j : 0;
#if LN_VEC_BYTES == 64
        _mm512_mask_storeu_pd(p + j, (__mmask8)ln_first16(k > 8 ? 8 : k), _mm512_loadu_pd(v + j));
#else
        if (k >= 4) {
            _mm256_storeu_pd(p + j, _mm256_loadu_pd(v + j));
            continue;
        }
        if (k == 0)
            break;
        __m256i lane = _mm256_setr_epi64x(0, 1, 2, 3);
        __m256i m = _mm256_cmpgt_epi64(_mm256_set1_epi64x((long long)k), lane);
        _mm256_maskstore_pd(p + j, m, _mm256_loadu_pd(v + j));
#endif
    }
}

/* An 8 x 8 block of floats transposed: dst[c * ds + r] = src[r * ss + c]
 * (the short groups' rows into their transposed layout and back,
 * ln_lane.h; element by element, GCC moved each float on its own). */
static inline void ln_transpose8_f32(float *dst, size_t ds, const float *src, size_t ss)
{
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps(src + (size_t)i * ss);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(dst + (size_t)i * ds, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(dst + (size_t)(i + 4) * ds,
                         _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}
#define LN_TRANSPOSE8_F32 ln_transpose8_f32

/* The same for a 4 x 4 block of doubles. */
static inline void ln_transpose4_f64(double *dst, size_t ds, const double *src, size_t ss)
{
    __m256d r[4], t[4];
    for (int i = 0; i < 4; i++)
        r[i] = _mm256_loadu_pd(src + (size_t)i * ss);
    for (int i = 0; i < 4; i += 2) {
        t[i] = _mm256_unpacklo_pd(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_pd(r[i], r[i + 1]);
    }
    _mm256_storeu_pd(dst, _mm256_permute2f128_pd(t[0], t[2], 0x20));
    _mm256_storeu_pd(dst + ds, _mm256_permute2f128_pd(t[1], t[3], 0x20));
    _mm256_storeu_pd(dst + 2 * ds, _mm256_permute2f128_pd(t[0], t[2], 0x31));
    _mm256_storeu_pd(dst + 3 * ds, _mm256_permute2f128_pd(t[1], t[3], 0x31));
}
#define LN_TRANSPOSE4_F64 ln_transpose4_f64

#define LN_LOAD_PART_F32 ln_load_part_f32
#define LN_STORE_PART_F32 ln_store_part_f32
#define LN_STORE_PART_F64 ln_store_part_f64
#define LN_LOAD_PART_F64 ln_load_part_f64
/* bfloat16 a register at a time: widening is a shift of the bits; the
 * narrowing is ln_float_to_bf16's integer rounding (to nearest even, NaNs
 * made quiet), vectorized. */
#if LN_VEC_BYTES == 64
static inline __m512 ln_float_of_bf16(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline __m256i ln_bf16_of(__m512 f)
{
    __m512i u = _mm512_castps_si512(f);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i nearest = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(nearest, nan, quiet));
}

static inline void ln_load_row_bf16(float *v, const uint16_t *p)
{
    for (size_t j = 0; j < LN_LANES; j += 16)
        _mm512_storeu_ps(v + j, ln_float_of_bf16(_mm256_loadu_si256((const __m256i *)(p + j))));
}

/* The lanes of f that are subnormal floats: one vfpclassps (AVX512-DQ),
 * where testing the exponent and the fraction took four instructions and
 * two mask moves. */
#define LN_FPCLASS_DENORMAL 0x20 /* vfpclassps's category bit 5 */
static inline __mmask16 ln_subnormal_lanes(__m512 f)
{
    return _mm512_fpclass_ps_mask(f, LN_FPCLASS_DENORMAL);
}

/* 32 floats rounded to bfloat16 by AVX512-BF16's vcvtne2ps2bf16, whose
 * rounding and NaNs are ln_bf16_of's (round to nearest even on the bits;
 * a NaN keeps its top bits with the quiet bit set) except that it
 * flushes subnormal floats to zero: the caller sends those vectors to
 * ln_bf16_of. Inline assembly rather than the intrinsic, whose target
 * attribute would keep it from being inlined into this level's loops
 * (built for CPUs without the instruction too: ln_cpu_bf16_convert
 * says when it may run). The low 16 results come from lo. */
static inline __m512i ln_bf16_pair_of(__m512 lo, __m512 hi)
{
    __m512i h;
    __asm__("vcvtne2ps2bf16 %2, %1, %0" : "=v"(h) : "v"(hi), "v"(lo));
    return h;
}

/* The same for 16 floats in two 256-bit halves, and its subnormal test. */
static inline __m256i ln_bf16_pair_of8(__m256 lo, __m256 hi)
{
    __m256i h;
    __asm__("vcvtne2ps2bf16 %2, %1, %0" : "=v"(h) : "v"(hi), "v"(lo));
    return h;
}

static inline __mmask8 ln_subnormal_lanes8(__m256 f)
{
    return _mm256_fpclass_ps_mask(f, LN_FPCLASS_DENORMAL);
}

static inline void ln_store_row_bf16(uint16_t *p, const float *v)
{
    _Static_assert(LN_LANES % 32 == 0, "bfloat16 rows convert 32 floats at a time");
    for (size_t j = 0; j < LN_LANES; j += 32) {
        __m512 lo = _mm512_loadu_ps(v + j), hi = _mm512_loadu_ps(v + j + 16);
        if (ln_cpu_bf16_convert && !(ln_subnormal_lanes(lo) | ln_subnormal_lanes(hi))) {
            _mm512_storeu_si512((void *)(p + j), ln_bf16_pair_of(lo, hi));
        } else {
            _mm256_storeu_si256((__m256i *)(p + j), ln_bf16_of(lo));
            _mm256_storeu_si256((__m256i *)(p + j + 16), ln_bf16_of(hi));
        }
    }
}

/* Parts with 16-bit masked loads and stores (AVX-512BW). */
static inline void ln_load_part_bf16(float *v, const uint16_t *p, size_t n, size_t width)
{
    for (size_t j = 0; j < width; j += 16)
        _mm512_storeu_ps(v + j, ln_float_of_bf16(_mm256_maskz_loadu_epi16(
                                    ln_first16(n > j ? n - j : 0), p + j)));
}

static inline void ln_store_part_bf16(uint16_t *p, const float *v, size_t n, size_t width)
{
    for (size_t j = 0; j < width; j += 16)
        _mm256_mask_storeu_epi16(p + j, ln_first16(n > j ? n - j : 0),
                                 ln_bf16_of(_mm512_loadu_ps(v + j)));
}
#define LN_LOAD_PART_BF16 ln_load_part_bf16
#define LN_STORE_PART_BF16 ln_store_part_bf16
#else
/* The bfloat16 bits of eight floats, each in the low half of its 32-bit
 * lane: ln_float_to_bf16's rounding (to nearest even on the bits), right
 * for every float but NaN (ln_bf16_quiet). */
static inline __m256i ln_bf16_round(__m256 f)
{
    __m256i u = _mm256_castps_si256(f);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb),
                             16);
}

/* h (ln_bf16_round of f) with f's NaNs as ln_float_to_bf16 has them: the
 * top bits, made quiet. */
static inline __m256i ln_bf16_quiet(__m256i h, __m256 f)
{
    __m256i top = _mm256_or_si256(_mm256_srli_epi32(_mm256_castps_si256(f), 16),
                                  _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(h, top, _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q)));
}

/* ln_float_to_bf16 of eight floats, in the low halves of their lanes; the
 * NaNs' blend only when there are any. */
static inline __m256i ln_bf16_bits(__m256 f)
{
    __m256i h = ln_bf16_round(f);
    if (_mm256_movemask_ps(_mm256_cmp_ps(f, f, _CMP_UNORD_Q)))
        h = ln_bf16_quiet(h, f);
    return h;
}

/* Sixteen floats (lo's eight first) as bfloat16, in order: one test for
 * NaNs in either half, one pack (32 -> 16 bits, values below 2^16: no
 * saturation) and one lane permute for both halves. */
static inline __m256i ln_bf16_of16(__m256 lo, __m256 hi)
{
    __m256i a = ln_bf16_round(lo), b = ln_bf16_round(hi);
    if (_mm256_movemask_ps(_mm256_cmp_ps(lo, hi, _CMP_UNORD_Q))) {
        a = ln_bf16_quiet(a, lo);
        b = ln_bf16_quiet(b, hi);
    }
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
}

/* Eight floats as bfloat16, in order. */
static inline __m128i ln_bf16_of8(__m256 f)
{
    __m256i h = ln_bf16_bits(f);
    return _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

static inline void ln_load_part_bf16(float *v, const uint16_t *p, size_t n, size_t width)
{
    ln_load_part_h8(v, p, n, width, 1);
}

static inline void ln_store_part_bf16(uint16_t *p, const float *v, size_t n, size_t width)
{
    (void)width;
    ln_store_part_h8(p, v, n, 1);
}
#define LN_LOAD_PART_BF16 ln_load_part_bf16
#define LN_STORE_PART_BF16 ln_store_part_bf16

static inline void ln_load_row_bf16(float *v, const uint16_t *p)
{
    for (size_t j = 0; j < LN_LANES; j += 8)
        _mm256_storeu_ps(v + j, ln_float8_of_bf16(_mm_loadu_si128((const __m128i *)(p + j))));
}

static inline void ln_store_row_bf16(uint16_t *p, const float *v)
{
    _Static_assert(LN_LANES % 16 == 0, "bfloat16 rows are stored 16 values at a time");
    for (size_t j = 0; j < LN_LANES; j += 16)
        _mm256_storeu_si256((__m256i *)(p + j),
                            ln_bf16_of16(_mm256_loadu_ps(v + j), _mm256_loadu_ps(v + j + 8)));
}
#endif
#define LN_LOAD_ROW_BF16 ln_load_row_bf16
#define LN_STORE_ROW_BF16 ln_store_row_bf16

/* ---- the backward's sums, 256-bit ------------------------------------- */
/* This part, to the end of the group loops, is 256-bit code: the AVX2
 * level's own, and the AVX-512 level's too where it sets LN_YMM_LOOPS
 * (ln_avx512.c), built there with its 32 registers. */
#if LN_VEC_BYTES == 32 || defined(LN_YMM_LOOPS)
/*
 * back_sums of ln_lane.h (the four sums of ln_contract.h, item 10, and the
 * two maxima) with its lanes in registers: sixteen lanes at a time (two
 * registers per sum; all 32 would take the 16 registers four times over),
 * each pass over the whole record, and the block lanes flushed into the
 * double totals in registers. The lane form's loop keeps the same order
 * but flushed out of line through the stack, and its float16 and bfloat16
 * rows took all 32 lanes at once and spilled: about half of its time at
 * d = 768 went outside the loop. Every lane sees the same operations in
 * the same order: the same bits.
 */
enum { LN_ROWS_F32, LN_ROWS_F16, LN_ROWS_BF16, LN_ROWS_F64 };

/* Eight elements of a row at p as floats (exact conversions), and the
 * first n < 8 of them with zeros beyond (nothing past n is read). */
static inline __m256 ln_load8(const void *p, int kind)
{
    if (kind == LN_ROWS_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    if (kind == LN_ROWS_BF16)
        return ln_float8_of_bf16(_mm_loadu_si128((const __m128i *)p));
    return _mm256_loadu_ps((const float *)p);
}

static inline __m256 ln_load8_first(const void *p, size_t n, int kind)
{
    if (kind == LN_ROWS_F32) {
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        return _mm256_maskload_ps((const float *)p, m);
    }
    uint16_t buf[8] = {0};
    memcpy(buf, p, n * sizeof *buf);
    return ln_load8(buf, kind);
}

/* Eight floats stored as a row of `kind` (rounded to nearest even). */
static inline void ln_store8(void *p, __m256 v, int kind)
{
    if (kind == LN_ROWS_F16) {
        _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    } else if (kind == LN_ROWS_BF16) {
#if LN_VEC_BYTES == 64
        /* (ln_store_row_bf16's choice, at 256 bits) */
        __m256i h = ln_cpu_bf16_convert && !ln_subnormal_lanes8(v)
                        ? ln_bf16_pair_of8(v, _mm256_setzero_ps())
                        : ln_bf16_of(_mm512_zextps256_ps512(v));
        _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(h));
#else
        _mm_storeu_si128((__m128i *)p, ln_bf16_of8(v));
#endif
    } else {
        _mm256_storeu_ps((float *)p, v);
    }
}

/* Sixteen floats (lo, then hi) stored as a row of `kind`. bfloat16 rows
 * on the AVX-512 level convert both halves in one 256-bit vcvtne2ps2bf16
 * (ln_bf16_pair_of8), where ln_store8 converts each half alone. */
static inline void ln_store16(void *p, __m256 lo, __m256 hi, int kind)
{
#if LN_VEC_BYTES == 64
    if (kind == LN_ROWS_BF16 && ln_cpu_bf16_convert &&
        !(ln_subnormal_lanes8(lo) | ln_subnormal_lanes8(hi))) {
        _mm256_storeu_si256((__m256i *)p, ln_bf16_pair_of8(lo, hi));
        return;
    }
#endif
    ln_store8(p, lo, kind);
    ln_store8((char *)p + 8 * (kind == LN_ROWS_F32 ? 4 : 2), hi, kind);
}

/* Element 0 of a row of `kind` as a float. */
static inline float ln_elem0(const void *p, int kind)
{
    if (kind == LN_ROWS_F32)
        return *(const float *)p;
    uint16_t h;
    memcpy(&h, p, sizeof h);
    if (kind == LN_ROWS_F16)
        return _cvtsh_ss(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Eight lanes' block sums (of t, t^2, g and g t) and the running maxima
 * of |dy| and |t|. */
typedef struct {
    __m256 l[4];
} ln_back_lanes8;

/* One element per lane: ln_lane.h's back_sums_step. */
static inline void ln_back_step8(ln_back_lanes8 *s, __m256 *mdy, __m256 *mt, __m256 xv,
                                 __m256 dyv, __m256 wv, __m256 m0)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 t = _mm256_sub_ps(xv, m0), g = _mm256_mul_ps(dyv, wv);
    s->l[0] = _mm256_add_ps(s->l[0], t);
    s->l[1] = _mm256_fmadd_ps(t, t, s->l[1]);
    s->l[2] = _mm256_add_ps(s->l[2], g);
    s->l[3] = _mm256_fmadd_ps(g, t, s->l[3]);
    *mdy = _mm256_max_ps(_mm256_and_ps(dyv, abs_mask), *mdy);
    *mt = _mm256_max_ps(_mm256_and_ps(t, abs_mask), *mt);
}

/* The mask of lanes n..7 of eight (n <= 8): the lanes a partial lane row
 * of n elements leaves as they were. */
static inline __m256 ln_lanes_from8(size_t n)
{
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                                  _mm256_set1_epi32((int)n - 1)));
}

/* The record's last, partial lane row: lanes below n take their element,
 * the others keep what they had. */
static inline void ln_back_step8_first(ln_back_lanes8 *s, __m256 *mdy, __m256 *mt,
                                       const void *x, const void *dy, const float *w,
                                       size_t n, __m256 m0, int kind)
{
    if (n == 0)
        return;
    __m256 keep = ln_lanes_from8(n);
    ln_back_lanes8 next = *s;
    __m256 ndy = *mdy, nt = *mt;
    ln_back_step8(&next, &ndy, &nt, ln_load8_first(x, n, kind), ln_load8_first(dy, n, kind),
                  ln_load8_first(w, n, LN_ROWS_F32), m0);
    for (int q = 0; q < 4; q++)
        s->l[q] = _mm256_blendv_ps(next.l[q], s->l[q], keep);
    *mdy = _mm256_blendv_ps(ndy, *mdy, keep);
    *mt = _mm256_blendv_ps(nt, *mt, keep);
}

/* Four float lanes, widened, added to their double totals. */
static inline __m256d ln_add_widened4(__m256d t, __m128 v)
{
    return _mm256_add_pd(t, _mm256_cvtps_pd(v));
}

#if LN_VEC_BYTES == 64
/* Eight float lanes, widened at once, added to their double totals. */
static inline __m512d ln_add_widened8(__m512d t, __m256 v)
{
    return _mm512_add_pd(t, _mm512_cvtps_pd(v));
}
#endif

/* The double totals of a part's sixteen lanes of each sum (its halves
 * h = 0, 1 of eight). At the AVX-512 level they stay in registers and
 * each block's lanes are widened eight at a time, as the forward's one
 * pass does (ln_stats_part16); AVX2's sixteen registers hold the block
 * lanes, so its totals are the caller's, in memory (a copy of its own had
 * cost 1.05-1.08x). Either way each lane's total adds
 * the same values in the same order: the same bits. One thread,
 * AVX-512 level, time vs totals in memory: backward float32 (64, 768)
 * and (4096, 768) 0.98-0.99x, float16 0.96-0.98x, bfloat16 0.98x, RMSNorm
 * float32 0.97x. */
#if LN_VEC_BYTES == 64
typedef struct {
    __m512d t[4][2];
} ln_back_totals16;

static inline void ln_back_totals_at(ln_back_totals16 *t, double tot[4][LN_LANES], size_t j0)
{
    (void)tot, (void)j0; /* stored by ln_back_totals_put */
    for (int q = 0; q < 4; q++)
        t->t[q][0] = t->t[q][1] = _mm512_setzero_pd();
}

/* End of a block: half h's eight block lanes into their totals. */
static inline void ln_back_flush8(ln_back_totals16 *t, int h, const ln_back_lanes8 *s)
{
    for (int q = 0; q < 4; q++)
        t->t[q][h] = ln_add_widened8(t->t[q][h], s->l[q]);
}

/* The part's totals into lanes j0 .. j0 + 15 of tot. */
static inline void ln_back_totals_put(const ln_back_totals16 *t, double tot[4][LN_LANES],
                                      size_t j0)
{
    for (int q = 0; q < 4; q++) {
        _mm512_storeu_pd(tot[q] + j0, t->t[q][0]);
        _mm512_storeu_pd(tot[q] + j0 + 8, t->t[q][1]);
    }
}
#else
typedef struct {
    double (*tot)[LN_LANES]; /* the caller's totals */
    size_t j0;               /* the part's first lane */
} ln_back_totals16;

static inline void ln_back_totals_at(ln_back_totals16 *t, double tot[4][LN_LANES], size_t j0)
{
    t->tot = tot;
    t->j0 = j0;
    for (int q = 0; q < 4; q++)
        memset(tot[q] + j0, 0, 16 * sizeof(double));
}

static inline void ln_back_flush8(ln_back_totals16 *t, int h, const ln_back_lanes8 *s)
{
    for (int q = 0; q < 4; q++) {
        double *p = t->tot[q] + t->j0 + 8 * (size_t)h;
        _mm256_storeu_pd(p, ln_add_widened4(_mm256_loadu_pd(p), _mm256_castps256_ps128(s->l[q])));
        _mm256_storeu_pd(p + 4,
                         ln_add_widened4(_mm256_loadu_pd(p + 4), _mm256_extractf128_ps(s->l[q], 1)));
    }
}

static inline void ln_back_totals_put(const ln_back_totals16 *t, double tot[4][LN_LANES],
                                      size_t j0)
{
    (void)t, (void)tot, (void)j0; /* already there */
}
#endif

static inline float ln_hmax8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

/* The totals (lane by lane, before the tree) and the maxima of a
 * record's backward sums around m0; rows of `kind`, weights float. */
static inline __attribute__((always_inline)) void
ln_back_sums_rows(const void *x, const void *dy, const float *w, size_t d, float m0,
                  double tot[4][LN_LANES], float *max_dy, float *max_t, int kind)
{
    const size_t es = kind == LN_ROWS_F32 ? 4 : 2;
    const char *xb = x, *db = dy;
    const __m256 vm0 = _mm256_set1_ps(m0);
    __m256 mdy = _mm256_setzero_ps(), mt = _mm256_setzero_ps();
    _Static_assert(LN_LANES % 16 == 0, "whole parts of sixteen lanes");
    for (size_t j0 = 0; j0 < LN_LANES; j0 += 16) {
        ln_back_totals16 part;
        ln_back_totals_at(&part, tot, j0);
        for (size_t i = 0; i < d;) {
            size_t end = d - i > LN_BLOCK ? i + LN_BLOCK : d;
            ln_back_lanes8 a = {{_mm256_setzero_ps(), _mm256_setzero_ps(),
                                 _mm256_setzero_ps(), _mm256_setzero_ps()}};
            ln_back_lanes8 b = a;
            for (; i + LN_LANES <= end; i += LN_LANES) {
                size_t k = i + j0;
                ln_back_step8(&a, &mdy, &mt, ln_load8(xb + k * es, kind),
                              ln_load8(db + k * es, kind), _mm256_loadu_ps(w + k), vm0);
                ln_back_step8(&b, &mdy, &mt, ln_load8(xb + (k + 8) * es, kind),
                              ln_load8(db + (k + 8) * es, kind), _mm256_loadu_ps(w + k + 8),
                              vm0);
            }
            if (i + j0 < end) { /* the partial lane row at the record's end */
                size_t k = i + j0, n = end - k;
                ln_back_step8_first(&a, &mdy, &mt, xb + k * es, db + k * es, w + k,
                                    n < 8 ? n : 8, vm0, kind);
                if (n > 8)
                    ln_back_step8_first(&b, &mdy, &mt, xb + (k + 8) * es, db + (k + 8) * es,
                                        w + k + 8, n - 8 < 8 ? n - 8 : 8, vm0, kind);
            }
            ln_back_flush8(&part, 0, &a);
            ln_back_flush8(&part, 1, &b);
            i = end;
        }
        ln_back_totals_put(&part, tot, j0);
    }
    *max_dy = ln_hmax8(mdy);
    *max_t = ln_hmax8(mt);
}

static void ln_back_sums_f32(const float *x, const float *dy, const float *w, size_t d,
                             float m0, double tot[4][LN_LANES], float *max_dy, float *max_t)
{
    ln_back_sums_rows(x, dy, w, d, m0, tot, max_dy, max_t, LN_ROWS_F32);
}

static void ln_back_sums_f16(const uint16_t *x, const uint16_t *dy, const float *w, size_t d,
                             float m0, double tot[4][LN_LANES], float *max_dy, float *max_t)
{
    ln_back_sums_rows(x, dy, w, d, m0, tot, max_dy, max_t, LN_ROWS_F16);
}

static void ln_back_sums_bf16(const uint16_t *x, const uint16_t *dy, const float *w, size_t d,
                              float m0, double tot[4][LN_LANES], float *max_dy, float *max_t)
{
    ln_back_sums_rows(x, dy, w, d, m0, tot, max_dy, max_t, LN_ROWS_BF16);
}

/* The mask of the first n (< 4) of four double lanes: a float64 row's
 * partial register, read with maskload and blended back. */
static inline __m256i ln_first4d(size_t n)
{
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x((long long)n), _mm256_setr_epi64x(0, 1, 2, 3));
}

/*
 * The same for float64 rows, whose block lanes are double: eight lanes a
 * part (two registers for each of the four sums; sixteen would take all
 * sixteen registers), the four parts of a block one after the other (the
 * block's lines, missed by every part, are asked for close together:
 * (4096, 768) 0.90-0.94x the time of each part over the whole record,
 * (100, 5000) 0.71-0.89x), each part's block lanes added to the totals in
 * memory, in line. The lane form flushed them through an out-of-line
 * call with its lanes on the stack
 * (about a third of a float64 (64, 768) backward went to these sums).
 * The same operations in the same order for every lane: the same bits.
 * The float types' double fallback (ln_level.h's double instances, which
 * constant records take) runs the same loop on its rows converted to
 * double as they are read: in lane form it was most of a float32
 * (4096, 16) backward of zero rows (one thread: 1994 -> 1220 us; (64, 768)
 * 132 -> 106 us, bfloat16 258 -> 180, float16 169 -> 139).
 */
typedef struct {
    __m256d l[4];
} ln_back_lanes4d;

/* One element per lane: ln_lane.h's back_sums_step. */
static inline void ln_back_step4d(ln_back_lanes4d *s, __m256d *mdy, __m256d *mt, __m256d xv,
                                  __m256d dyv, __m256d wv, __m256d m0)
{
    const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
    __m256d t = _mm256_sub_pd(xv, m0), g = _mm256_mul_pd(dyv, wv);
    s->l[0] = _mm256_add_pd(s->l[0], t);
    s->l[1] = _mm256_fmadd_pd(t, t, s->l[1]);
    s->l[2] = _mm256_add_pd(s->l[2], g);
    s->l[3] = _mm256_fmadd_pd(g, t, s->l[3]);
    *mdy = _mm256_max_pd(_mm256_and_pd(dyv, abs_mask), *mdy);
    *mt = _mm256_max_pd(_mm256_and_pd(t, abs_mask), *mt);
}

/* Four elements of a row of `kind` at p as doubles (exact conversions),
 * and the first n < 4 of them with zeros beyond (nothing past n read). */
static inline __m256d ln_load4d(const void *p, int kind)
{
    if (kind == LN_ROWS_F64)
        return _mm256_loadu_pd((const double *)p);
    if (kind == LN_ROWS_F32)
        return _mm256_cvtps_pd(_mm_loadu_ps((const float *)p));
    __m128i h = _mm_loadl_epi64((const __m128i *)p);
    if (kind == LN_ROWS_F16)
        return _mm256_cvtps_pd(_mm_cvtph_ps(h));
    return _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16)));
}

static inline __m256d ln_load4d_first(const void *p, size_t n, int kind)
{
    if (kind == LN_ROWS_F64)
        return _mm256_maskload_pd((const double *)p, ln_first4d(n));
    unsigned char buf[16] = {0};
    memcpy(buf, p, n * (kind == LN_ROWS_F32 ? 4 : 2));
    return ln_load4d(buf, kind);
}

/* The first n < 4 lanes take their element (nothing past n read), the
 * others keep what they had. */
static inline void ln_back_step4d_first(ln_back_lanes4d *s, __m256d *mdy, __m256d *mt,
                                        const void *x, const void *dy, const void *w,
                                        size_t n, __m256d m0, int kind, int wkind)
{
    __m256d m = _mm256_castsi256_pd(ln_first4d(n));
    ln_back_lanes4d next = *s;
    __m256d ndy = *mdy, nt = *mt;
    ln_back_step4d(&next, &ndy, &nt, ln_load4d_first(x, n, kind), ln_load4d_first(dy, n, kind),
                   ln_load4d_first(w, n, wkind), m0);
    for (int q = 0; q < 4; q++)
        s->l[q] = _mm256_blendv_pd(s->l[q], next.l[q], m);
    *mdy = _mm256_blendv_pd(*mdy, ndy, m);
    *mt = _mm256_blendv_pd(*mt, nt, m);
}

/* End of a block: four block lanes into their totals. */
static inline void ln_back_flush4d(double tot[4][LN_LANES], size_t j, const ln_back_lanes4d *s)
{
    for (int q = 0; q < 4; q++)
        _mm256_storeu_pd(tot[q] + j, _mm256_add_pd(_mm256_loadu_pd(tot[q] + j), s->l[q]));
}

static inline double ln_hmax4d(__m256d v)
{
    __m128d m = _mm_max_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_max_sd(m, _mm_unpackhi_pd(m, m)));
}

/* Rows of `kind`, weights of wkind (LN_ROWS_F64 or LN_ROWS_F32), in double
 * lanes. */
static inline __attribute__((always_inline)) void
ln_back_sums4d_rows(const void *x, const void *dy, const void *w, size_t d, double m0,
                    double tot[4][LN_LANES], double *max_dy, double *max_t, int kind, int wkind)
{
    const size_t es = kind == LN_ROWS_F64 ? 8 : kind == LN_ROWS_F32 ? 4 : 2;
    const size_t ws = wkind == LN_ROWS_F64 ? 8 : 4;
    const char *xb = x, *db = dy, *wb = w;
    const __m256d vm0 = _mm256_set1_pd(m0);
    __m256d mdy = _mm256_setzero_pd(), mt = _mm256_setzero_pd();
    memset(tot, 0, 4 * LN_LANES * sizeof(double));
    for (size_t i0 = 0; i0 < d; i0 += LN_BLOCK) {
        size_t end = d - i0 > LN_BLOCK ? i0 + LN_BLOCK : d;
        for (size_t j0 = 0; j0 < LN_LANES; j0 += 8) {
            size_t i = i0;
            ln_back_lanes4d a = {{_mm256_setzero_pd(), _mm256_setzero_pd(),
                                  _mm256_setzero_pd(), _mm256_setzero_pd()}};
            ln_back_lanes4d b = a;
            for (; i + LN_LANES <= end; i += LN_LANES) {
                size_t k = i + j0;
                ln_back_step4d(&a, &mdy, &mt, ln_load4d(xb + k * es, kind),
                               ln_load4d(db + k * es, kind), ln_load4d(wb + k * ws, wkind), vm0);
                ln_back_step4d(&b, &mdy, &mt, ln_load4d(xb + (k + 4) * es, kind),
                               ln_load4d(db + (k + 4) * es, kind),
                               ln_load4d(wb + (k + 4) * ws, wkind), vm0);
            }
            if (i + j0 < end) { /* the partial lane row at the record's end */
                size_t k = i + j0, n = end - k;
                if (n >= 4)
                    ln_back_step4d(&a, &mdy, &mt, ln_load4d(xb + k * es, kind),
                                   ln_load4d(db + k * es, kind), ln_load4d(wb + k * ws, wkind),
                                   vm0);
                else
                    ln_back_step4d_first(&a, &mdy, &mt, xb + k * es, db + k * es, wb + k * ws, n,
                                         vm0, kind, wkind);
                if (n >= 8)
                    ln_back_step4d(&b, &mdy, &mt, ln_load4d(xb + (k + 4) * es, kind),
                                   ln_load4d(db + (k + 4) * es, kind),
                                   ln_load4d(wb + (k + 4) * ws, wkind), vm0);
                else if (n > 4)
                    ln_back_step4d_first(&b, &mdy, &mt, xb + (k + 4) * es, db + (k + 4) * es,
                                         wb + (k + 4) * ws, n - 4, vm0, kind, wkind);
            }
            ln_back_flush4d(tot, j0, &a);
            ln_back_flush4d(tot, j0 + 4, &b);
        }
    }
    *max_dy = ln_hmax4d(mdy);
    *max_t = ln_hmax4d(mt);
}

static void ln_back_sums_f64(const double *x, const double *dy, const double *w, size_t d,
                             double m0, double tot[4][LN_LANES], double *max_dy, double *max_t)
{
    ln_back_sums4d_rows(x, dy, w, d, m0, tot, max_dy, max_t, LN_ROWS_F64, LN_ROWS_F64);
}

/* The float types' double fallback (float weights). */
static void ln_back_sums_f32d(const float *x, const float *dy, const float *w, size_t d,
                              double m0, double tot[4][LN_LANES], double *max_dy, double *max_t)
{
    ln_back_sums4d_rows(x, dy, w, d, m0, tot, max_dy, max_t, LN_ROWS_F32, LN_ROWS_F32);
}

static void ln_back_sums_f16d(const uint16_t *x, const uint16_t *dy, const float *w, size_t d,
                              double m0, double tot[4][LN_LANES], double *max_dy, double *max_t)
{
    ln_back_sums4d_rows(x, dy, w, d, m0, tot, max_dy, max_t, LN_ROWS_F16, LN_ROWS_F32);
}

static void ln_back_sums_bf16d(const uint16_t *x, const uint16_t *dy, const float *w, size_t d,
                               double m0, double tot[4][LN_LANES], double *max_dy,
                               double *max_t)
{
    ln_back_sums4d_rows(x, dy, w, d, m0, tot, max_dy, max_t, LN_ROWS_BF16, LN_ROWS_F32);
}
#define LN_BACK_SUMS_F64 ln_back_sums_f64
#define LN_BACK_SUMS_F32_WIDE ln_back_sums_f32d
#define LN_BACK_SUMS_F16_WIDE ln_back_sums_f16d
#define LN_BACK_SUMS_BF16_WIDE ln_back_sums_bf16d
_Static_assert(LN_LANES % 16 == 0 && LN_BLOCK % LN_LANES == 0,
               "back sums take lanes 16 at a time, blocks of whole lane rows");
#define LN_BACK_SUMS_F32 ln_back_sums_f32
#define LN_BACK_SUMS_F16 ln_back_sums_f16
#define LN_BACK_SUMS_BF16 ln_back_sums_bf16

/* ---- the forward's one-pass sums, 256-bit ----------------------------- */
/*
 * sum_shifted_squares of ln_lane.h (ln_contract.h, item 5: u = x - c into
 * one set of lanes, the squares of u into another) with sixteen lanes
 * at a time in registers, as ln_back_sums_rows takes them: the part's
 * block lanes (four registers) and double totals (eight) never leave
 * them. The lane form kept all 32 lanes' totals on the stack, and its
 * flush at the end of each block, through it, took more than half of
 * the pass (float32, d = 4096, in cache). Every lane sees the same
 * additions in the same order: the same bits.
 */
/* Parts in registers together: AVX-512's 32 registers hold two (eight
 * independent chains of additions), AVX2's 16 one. */
#define LN_STATS_PARTS (LN_VEC_BYTES == 64 ? 2 : 1)
_Static_assert(LN_LANES % (16 * LN_STATS_PARTS) == 0, "whole parts of sixteen lanes");

typedef struct {
    __m256 a[2], q[2]; /* block lanes: sums of u = x - c, of u^2 */
#if LN_VEC_BYTES == 64
    __m512d t1[2], t2[2]; /* the double totals of a[r] and q[r]'s lanes */
#else
    __m256d t1[4], t2[4]; /* the double totals of lanes 4i to 4i + 3 */
#endif
} ln_stats_part16;

/*
 * A part's sixteen lanes in two registers. float32 and float16 rows: lanes
 * 0-7, then 8-15. bfloat16 rows: lanes 0-3 and 8-11, then 4-7 and 12-15,
 * the order in which one 32-byte load unpacks to floats (one unpack each,
 * where the natural order took two widening loads and two shifts:
 * bfloat16 forward (64, 768) to (4096, 768) 0.92-0.93x the time). Each
 * lane still sums its own elements in the same order, so the layout
 * changes no bits; the flush adds each lane to its own total.
 */
static inline int ln_part16_unpacked(int kind)
{
    return kind == LN_ROWS_BF16;
}

/* The first lane of 128-bit half k of register r. */
static inline int ln_part16_lane(int kind, int r, int k)
{
    return ln_part16_unpacked(kind) ? 4 * r + 8 * k : 8 * r + 4 * k;
}

/* A lane row's sixteen elements of the part at p, as floats. */
static inline void ln_load16(const void *p, int kind, __m256 v[2])
{
    if (ln_part16_unpacked(kind)) {
        __m256i h = _mm256_loadu_si256((const __m256i *)p), z = _mm256_setzero_si256();
        v[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, h));
        v[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, h));
        return;
    }
    v[0] = ln_load8(p, kind);
    v[1] = ln_load8((const char *)p + 8 * (kind == LN_ROWS_F32 ? 4 : 2), kind);
}

/* The first n <= 16 (zeros beyond; nothing past n is read). */
static inline void ln_load16_first(const void *p, size_t n, int kind, __m256 v[2])
{
    if (ln_part16_unpacked(kind)) {
        uint16_t buf[16] = {0};
        memcpy(buf, p, n * sizeof *buf);
        ln_load16(buf, kind, v);
        return;
    }
    size_t es = kind == LN_ROWS_F32 ? 4 : 2;
    v[0] = ln_load8_first(p, n < 8 ? n : 8, kind);
    v[1] = ln_load8_first((const char *)p + 8 * es, n > 8 ? n - 8 : 0, kind);
}

/* One lane row's sixteen elements of the part, v[0] and v[1]; without
 * shifted (a constant), the squares of v alone (c is 0 then, and v - 0
 * is v). */
static inline void ln_stats_step16(ln_stats_part16 *p, const __m256 v[2], __m256 c, int shifted)
{
    if (!shifted) {
        p->q[0] = _mm256_fmadd_ps(v[0], v[0], p->q[0]);
        p->q[1] = _mm256_fmadd_ps(v[1], v[1], p->q[1]);
        return;
    }
    /* v[1] - c as fma(v[1], 1, -c), the same rounding, on the
     * multiply-add units: three operations on each kind of unit. */
    const __m256 one = _mm256_set1_ps(1.0f), nc = _mm256_sub_ps(_mm256_setzero_ps(), c);
    __m256 u0 = _mm256_sub_ps(v[0], c), u1 = _mm256_fmadd_ps(v[1], one, nc);
    p->a[0] = _mm256_add_ps(p->a[0], u0);
    p->a[1] = _mm256_add_ps(p->a[1], u1);
    p->q[0] = _mm256_fmadd_ps(u0, u0, p->q[0]);
    p->q[1] = _mm256_fmadd_ps(u1, u1, p->q[1]);
}

/* The partial lane row at the record's end (its first n <= 16 elements in
 * the part): lanes below n take their element, the others keep what they
 * had. */
static inline void ln_stats_step16_first(ln_stats_part16 *p, const void *x, size_t n, __m256 c,
                                         int kind, int shifted)
{
    __m256 a[2] = {p->a[0], p->a[1]}, q[2] = {p->q[0], p->q[1]}, v[2];
    ln_load16_first(x, n, kind, v);
    ln_stats_step16(p, v, c, shifted);
    for (int r = 0; r < 2; r++) {
        int l0 = ln_part16_lane(kind, r, 0), l1 = ln_part16_lane(kind, r, 1);
        __m256i lane = _mm256_setr_epi32(l0, l0 + 1, l0 + 2, l0 + 3, l1, l1 + 1, l1 + 2, l1 + 3);
        __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32((int)n - 1)));
        p->a[r] = _mm256_blendv_ps(p->a[r], a[r], keep);
        p->q[r] = _mm256_blendv_ps(p->q[r], q[r], keep);
    }
}


/* End of a block: the block lanes into the double totals, then cleared.
 * AVX-512 widens a register's eight lanes at once (no extraction of its
 * upper half first). */
static inline void ln_stats_flush16(ln_stats_part16 *p, int kind)
{
    (void)kind;
    for (int r = 0; r < 2; r++) {
#if LN_VEC_BYTES == 64
        p->t1[r] = ln_add_widened8(p->t1[r], p->a[r]);
        p->t2[r] = ln_add_widened8(p->t2[r], p->q[r]);
#else
        int i0 = ln_part16_lane(kind, r, 0) / 4, i1 = ln_part16_lane(kind, r, 1) / 4;
        p->t1[i0] = ln_add_widened4(p->t1[i0], _mm256_castps256_ps128(p->a[r]));
        p->t1[i1] = ln_add_widened4(p->t1[i1], _mm256_extractf128_ps(p->a[r], 1));
        p->t2[i0] = ln_add_widened4(p->t2[i0], _mm256_castps256_ps128(p->q[r]));
        p->t2[i1] = ln_add_widened4(p->t2[i1], _mm256_extractf128_ps(p->q[r], 1));
#endif
        p->a[r] = p->q[r] = _mm256_setzero_ps();
    }
}

static inline void ln_stats_clear16(ln_stats_part16 *p)
{
    p->a[0] = p->a[1] = p->q[0] = p->q[1] = _mm256_setzero_ps();
#if LN_VEC_BYTES == 64
    p->t1[0] = p->t1[1] = p->t2[0] = p->t2[1] = _mm512_setzero_pd();
#else
    for (int h = 0; h < 4; h++)
        p->t1[h] = p->t2[h] = _mm256_setzero_pd();
#endif
}

/* A part's totals of one sum (t1, or t2 with `second`), lanes 4h to
 * 4h + 3 in t[h]. */
static inline void ln_stats_totals16(const ln_stats_part16 *p, int kind, int second,
                                     __m256d t[4])
{
#if LN_VEC_BYTES == 64
    for (int r = 0; r < 2; r++) {
        __m512d v = second ? p->t2[r] : p->t1[r];
        t[ln_part16_lane(kind, r, 0) / 4] = _mm512_castpd512_pd256(v);
        t[ln_part16_lane(kind, r, 1) / 4] = _mm512_extractf64x4_pd(v, 1);
    }
#else
    (void)kind;
    for (int h = 0; h < 4; h++)
        t[h] = second ? p->t2[h] : p->t1[h];
#endif
}

/* The parts of lanes j0 to j0 + 16 * LN_STATS_PARTS - 1 of a record's
 * one-pass sums, each part's block lanes flushed into its totals. */
static inline __attribute__((always_inline)) void
ln_stats_parts(ln_stats_part16 p[LN_STATS_PARTS], const char *xb, size_t d, size_t j0,
               __m256 vc, int kind, int shifted, int far)
{
    const size_t es = kind == LN_ROWS_F32 ? 4 : 2;
    for (int k = 0; k < LN_STATS_PARTS; k++)
        ln_stats_clear16(&p[k]);
    for (size_t i = 0; i < d;) {
        size_t end = d - i > LN_BLOCK ? i + LN_BLOCK : d;
        if (far && j0 == 0)
            ln_prefetch_ahead(xb, i * es, (end - i) * es, d * es);
        for (; i + LN_LANES <= end; i += LN_LANES)
            for (int k = 0; k < LN_STATS_PARTS; k++) {
                __m256 v[2];
                ln_load16(xb + (i + j0 + 16 * k) * es, kind, v);
                ln_stats_step16(&p[k], v, vc, shifted);
            }
        for (int k = 0; k < LN_STATS_PARTS; k++) {
            size_t j = i + j0 + 16 * k;
            if (j < end)
                ln_stats_step16_first(&p[k], xb + j * es, end - j < 16 ? end - j : 16, vc,
                                      kind, shifted);
            ln_stats_flush16(&p[k], kind);
        }
        i = end;
    }
}

/* A record's one-pass sums; rows of `kind`. Without shifted (a constant;
 * s1 unused), the squares of x alone: sum_squares of ln_lane.h with hi =
 * lo = 0 (RMSNorm's sums), whose centered values are x itself, in the
 * same order. AVX-512's two parts keep their totals in registers, where
 * the tree adds them (ln_tree_sum_regs; each part its own variable:
 * through an array indexed by a pass, GCC kept them on the stack). With
 * the flush's whole-register widening, one thread, time vs the totals
 * stored for ln_tree_sum: float32 forward (64, 768) and (4096, 768)
 * 0.96x, float16 0.94x, bfloat16 0.96x, RMSNorm float32 0.92-0.95x. AVX2
 * takes its parts one after the other and stores each one's totals: held
 * in registers through the second pass, they had made it 1.1x slower. */
static inline __attribute__((always_inline)) void
ln_shifted_squares_rows(const void *x, size_t d, float c, double *s1, double *s2, int kind,
                        int shifted, int far)
{
    const __m256 vc = _mm256_set1_ps(c);
    _Static_assert(LN_LANES == 32, "two parts of sixteen lanes");
#if LN_STATS_PARTS == 2
    ln_stats_part16 p[2];
    ln_stats_parts(p, x, d, 0, vc, kind, shifted, far);
    __m256d t[8];
    ln_stats_totals16(&p[0], kind, 1, t);
    ln_stats_totals16(&p[1], kind, 1, t + 4);
    *s2 = ln_tree_sum_regs(t);
    if (shifted) {
        ln_stats_totals16(&p[0], kind, 0, t);
        ln_stats_totals16(&p[1], kind, 0, t + 4);
        *s1 = ln_tree_sum_regs(t);
    }
#else
    double t1[LN_LANES], t2[LN_LANES];
    for (size_t j0 = 0; j0 < LN_LANES; j0 += 16) {
        ln_stats_part16 p;
        __m256d t[4];
        ln_stats_parts(&p, x, d, j0, vc, kind, shifted, far);
        ln_stats_totals16(&p, kind, 0, t);
        for (int h = 0; h < 4 && shifted; h++)
            _mm256_storeu_pd(t1 + j0 + 4 * h, t[h]);
        ln_stats_totals16(&p, kind, 1, t);
        for (int h = 0; h < 4; h++)
            _mm256_storeu_pd(t2 + j0 + 4 * h, t[h]);
    }
    *s2 = ln_tree_sum(t2);
    if (shifted)
        *s1 = ln_tree_sum(t1);
#endif
}

/* The level's hook (ln_lane.h's sum_shifted_squares and sum_squares): s1
 * NULL asks for the squares of x alone (c 0). */
static inline __attribute__((always_inline)) void
ln_shifted_squares_kind(const void *x, size_t d, float c, double *s1, double *s2, int kind,
                        int far)
{
    if (s1)
        ln_shifted_squares_rows(x, d, c, s1, s2, kind, 1, far);
    else
        ln_shifted_squares_rows(x, d, 0.0f, NULL, s2, kind, 0, far);
}

static void ln_shifted_squares_f32(const float *x, size_t d, float c, double *s1, double *s2,
                                   int far)
{
    ln_shifted_squares_kind(x, d, c, s1, s2, LN_ROWS_F32, far);
}

static void ln_shifted_squares_f16(const uint16_t *x, size_t d, float c, double *s1, double *s2,
                                   int far)
{
    ln_shifted_squares_kind(x, d, c, s1, s2, LN_ROWS_F16, far);
}

static void ln_shifted_squares_bf16(const uint16_t *x, size_t d, float c, double *s1, double *s2,
                                    int far)
{
    ln_shifted_squares_kind(x, d, c, s1, s2, LN_ROWS_BF16, far);
}
/*
 * The same for float64 rows, whose block lanes are double: sixteen lanes
 * (four registers per sum) at a time, each part over the whole record,
 * its block lanes added to the totals in memory once per block (no
 * conversion to pay). The lane form kept the 32 lanes of both sums, 16
 * registers, and GCC spilled some of them into load-add-store chains in
 * the inner loop: more than 40% of a float64 (64, 768) forward. The same
 * additions in the same order for every lane: the same bits.
 */
static inline void ln_stats_step4d(__m256d *a, __m256d *q, __m256d v, __m256d c)
{
    __m256d u = _mm256_sub_pd(v, c);
    *a = _mm256_add_pd(*a, u);
    *q = _mm256_fmadd_pd(u, u, *q);
}

/* The first n < 4 elements at x into the first n lanes; the others keep
 * what they had. */
static inline void ln_stats_step4d_first(__m256d *a, __m256d *q, const double *x, size_t n,
                                         __m256d c)
{
    __m256i take = ln_first4d(n);
    __m256d a0 = *a, q0 = *q, m = _mm256_castsi256_pd(take);
    ln_stats_step4d(a, q, _mm256_maskload_pd(x, take), c);
    *a = _mm256_blendv_pd(a0, *a, m);
    *q = _mm256_blendv_pd(q0, *q, m);
}

static void ln_shifted_squares_f64(const double *x, size_t d, double c, double *s1, double *s2,
                                   int far)
{
    const __m256d vc = _mm256_set1_pd(c);
    double t1[LN_LANES], t2[LN_LANES];
    for (size_t j = 0; j < LN_LANES; j++)
        t1[j] = t2[j] = 0;
    for (size_t j0 = 0; j0 < LN_LANES; j0 += 16) {
        for (size_t i = 0; i < d;) {
            size_t end = d - i > LN_BLOCK ? i + LN_BLOCK : d;
            __m256d a[4], q[4];
            for (int h = 0; h < 4; h++)
                a[h] = q[h] = _mm256_setzero_pd();
            if (far && j0 == 0)
                ln_prefetch_ahead(x, i * 8, (end - i) * 8, d * 8);
            for (; i + LN_LANES <= end; i += LN_LANES)
                for (int h = 0; h < 4; h++)
                    ln_stats_step4d(&a[h], &q[h], _mm256_loadu_pd(x + i + j0 + 4 * h), vc);
            for (int h = 0; h < 4; h++) { /* the block's partial lane row */
                size_t k = i + j0 + 4 * (size_t)h;
                if (k + 4 <= end)
                    ln_stats_step4d(&a[h], &q[h], _mm256_loadu_pd(x + k), vc);
                else if (k < end)
                    ln_stats_step4d_first(&a[h], &q[h], x + k, end - k, vc);
            }
            for (int h = 0; h < 4; h++) {
                double *p1 = t1 + j0 + 4 * h, *p2 = t2 + j0 + 4 * h;
                _mm256_storeu_pd(p1, _mm256_add_pd(_mm256_loadu_pd(p1), a[h]));
                _mm256_storeu_pd(p2, _mm256_add_pd(_mm256_loadu_pd(p2), q[h]));
            }
            i = end;
        }
    }
    *s1 = ln_tree_sum(t1);
    *s2 = ln_tree_sum(t2);
}
#define LN_SHIFTED_SQUARES_F32 ln_shifted_squares_f32
#define LN_SHIFTED_SQUARES_F16 ln_shifted_squares_f16
#define LN_SHIFTED_SQUARES_BF16 ln_shifted_squares_bf16
#define LN_SHIFTED_SQUARES_F64 ln_shifted_squares_f64


/* ---- short records' forward, 256-bit ---------------------------------- */
/*
 * The forward of a short group (ln_lane.h: records of more than half and
 * at most two lane rows, float compute, as float rows read in place or
 * copied zero-padded) with
 * each record's lanes in registers: lane j of ln_contract.h is element j
 * of the row's first lane row (plus element j + 32 of its second), eight
 * lanes a register, and the tree's levels are additions of whole
 * registers down to four lanes, then two in-register steps. The
 * transposed form in C did every step across the group's records, but
 * through arrays on the stack (about 50 ns a record of 64 floats, most of
 * it loads and stores of its temporaries). The same operations in the
 * same order as the record path: the same bits.
 */
_Static_assert(LN_LANES == 32, "a lane row is four registers of eight floats");

/* The lanes of a record's row past d: all bits clear (the row holds
 * zeros there, but x - shift of a zero is not +0.0). */
static inline __m256 ln_lane_mask8(size_t d, size_t j)
{
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(
        _mm256_set1_epi32((int)d), _mm256_add_epi32(_mm256_set1_epi32((int)j),
                                                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))));
}

/* The masks of the first nv registers of a record's row (ln_lane_mask8). */
static inline __attribute__((always_inline)) void ln_lane_masks(__m256 m[8], size_t d, int nv)
{
    for (int q = 0; q < nv; q++)
        m[q] = ln_lane_mask8(d, 8 * (size_t)q);
}

/* A record's 32 block lanes (lanes 8q..8q+7 in a[q]) as doubles through
 * the tree's levels (ln_contract.h, item 3) down to four lanes: lanes
 * 0..3 of the tree in one register. Only the first na registers (1, 2
 * or 4) are read: the lanes past them are +0.0, and a level that adds
 * +0.0 to a lane leaves it as it is (0.0 + a lane, its total, is the
 * lane itself: block lanes are never -0.0), so a record of at most 8 or
 * 16 features skips those levels with the same bits. */
static inline __attribute__((always_inline)) __m256d ln_tree_to4(const __m256 a[4], int na)
{
#if LN_VEC_BYTES == 64
    /* AVX-512: a register's eight lanes widened at once, the levels 16
     * and 8 lanes apart added eight lanes at a time, the level 4 apart as
     * the two halves of one register: the same additions in the same
     * order, in 8 instructions where the four-lane form takes 19. One
     * thread, both orders of a paired run: float32 forward out= (4096, 64)
     * and (4096, 32) 0.91x the time, (1e6, 16) 0.94x, (1e6, 48) 0.92x;
     * RMSNorm (1e6, 64) 0.92x; float16 (1e6, 64) 0.91x; float32 backward
     * (4096, 32) 0.91-0.95x, (1e5, 24) 0.89-0.95x. */
    __m512d z[4];
    for (int q = 0; q < na; q++)
        z[q] = _mm512_cvtps_pd(a[q]);
    for (int h = na / 2; h >= 1; h /= 2)
        for (int i = 0; i < h; i++)
            z[i] = _mm512_add_pd(z[i], z[i + h]);
    return _mm256_add_pd(_mm512_castpd512_pd256(z[0]), _mm512_extractf64x4_pd(z[0], 1));
#else
    __m256d t[8];
    for (int q = 0; q < na; q++) {
        t[2 * q] = _mm256_cvtps_pd(_mm256_castps256_ps128(a[q]));
        t[2 * q + 1] = _mm256_cvtps_pd(_mm256_extractf128_ps(a[q], 1));
    }
    for (int h = na; h >= 1; h /= 2) /* registers 4 h lanes apart */
        for (int i = 0; i < h; i++)
            t[i] = _mm256_add_pd(t[i], t[i + h]);
    return t[0];
#endif
}

/* The tree's last two levels (lane 0 += lane 2 and 1 += 3, then 0 += 1)
 * for four records at once, their lanes 0..3 in r[0..3]: the four
 * totals, record i's in element i. */
static inline __m256d ln_tree_last4(const __m256d r[4])
{
    __m256d a = _mm256_unpacklo_pd(r[0], r[1]), b = _mm256_unpackhi_pd(r[0], r[1]);
    __m256d c = _mm256_unpacklo_pd(r[2], r[3]), e = _mm256_unpackhi_pd(r[2], r[3]);
    __m256d l0 = _mm256_permute2f128_pd(a, c, 0x20), l2 = _mm256_permute2f128_pd(a, c, 0x31);
    __m256d l1 = _mm256_permute2f128_pd(b, e, 0x20), l3 = _mm256_permute2f128_pd(b, e, 0x31);
    return _mm256_add_pd(_mm256_add_pd(l0, l2), _mm256_add_pd(l1, l3));
}

/* Records k..k+3 of n (rows src_row bytes apart; past n, the last). */
static inline void ln_rows4(const char *p[4], const char *src, ptrdiff_t src_row, size_t n,
                            size_t k)
{
    for (size_t i = 0; i < 4; i++)
        p[i] = src + (ptrdiff_t)(k + i < n ? k + i : n - 1) * src_row;
}

/* The means of the first `count` (a multiple of four) of n records
 * (rows of `kind` src_row bytes apart, nv registers of them read, lanes
 * past d masked unless full: see ln_short_stats_nv), four records at a
 * time (past n, the last again): the shifted first pass (ln_contract.h,
 * item 4) and each mean's split hi + lo. */
static inline __attribute__((always_inline)) void
ln_short_means_nv(const char *src, ptrdiff_t src_row, size_t n, size_t count, size_t d,
                  double *mean, float *hi, float *lo, int nv, int full, int kind)
{
    const size_t es = kind == LN_ROWS_F32 ? 4 : 2;
    const __m256d dd = _mm256_set1_pd((double)d);
    const __m256 zero = _mm256_setzero_ps();
    const int na = nv < 4 ? nv : 4; /* the registers of lanes */
    __m256 m[8];
    ln_lane_masks(m, d, nv);
#define LN_MASKED(q, v) (full ? (v) : _mm256_and_ps(m[q], (v)))
    for (size_t k = 0; k < count; k += 4) {
        const char *p[4];
        __m256d r[4];
        ln_rows4(p, src, src_row, n, k);
        for (int i = 0; i < 4; i++) { /* the sum of x - x[0] */
            __m256 a[4], x0 = _mm256_set1_ps(ln_elem0(p[i], kind));
            for (int q = 0; q < na; q++)
                a[q] = _mm256_add_ps(
                    zero, LN_MASKED(q, _mm256_sub_ps(ln_load8(p[i] + 8 * q * es, kind), x0)));
            for (int q = 4; q < nv; q++)
                a[q - 4] = _mm256_add_ps(
                    a[q - 4], LN_MASKED(q, _mm256_sub_ps(ln_load8(p[i] + 8 * q * es, kind), x0)));
            r[i] = ln_tree_to4(a, na);
        }
        __m256d x0 = _mm256_cvtps_pd(_mm_setr_ps(ln_elem0(p[0], kind), ln_elem0(p[1], kind),
                                                 ln_elem0(p[2], kind), ln_elem0(p[3], kind)));
        __m256d mu = _mm256_add_pd(x0, _mm256_div_pd(ln_tree_last4(r), dd));
        __m128 h = _mm256_cvtpd_ps(mu);
        _mm256_storeu_pd(mean + k, mu);
        _mm_storeu_ps(hi + k, h);
        _mm_storeu_ps(lo + k, _mm256_cvtpd_ps(_mm256_sub_pd(mu, _mm256_cvtps_pd(h))));
    }
#undef LN_MASKED
}

/* x - hi - lo, the value a record's second pass squares; for RMSNorm,
 * whose hi and lo are +0, x itself: the same value (x - 0 is x for
 * every x, -0 and NaN included), without the two subtractions (float32
 * RMSNorm (1e6, 16) had taken 1.16x LayerNorm's time, (4096, 16) 1.11x). */
static inline __m256 ln_short_centered(__m256 x, __m256 hi, __m256 lo, int rms)
{
    return rms ? x : _mm256_sub_ps(_mm256_sub_ps(x, hi), lo);
}

/* The statistics of n records (float rows src_row bytes apart, nv
 * registers of them read: 1, 2 or 4 for a quarter, half or one lane row,
 * 8 for two, the first four summed into the lanes and the others added
 * to them; lanes past d masked, or, full, none past d), four records at
 * a time (the
 * last four repeat the last record; the outputs have room for a
 * multiple of four): the mean by the shifted first pass (item 4) and its
 * split hi + lo (or, rms, zeros), and the variance by the centered
 * second (item 5). All n means come first, then the variances, so that a
 * record's second pass does not wait on its mean's division (float32
 * (4096, 32..64) in cache 0.91-0.97x the time). */
static inline __attribute__((always_inline)) void
ln_short_stats_nv(const char *src, ptrdiff_t src_row, size_t n, size_t d, int rms,
                  double *mean, double *var, float *hi, float *lo, int nv, int full, int kind)
{
    const size_t es = kind == LN_ROWS_F32 ? 4 : 2;
    const __m256d dd = _mm256_set1_pd((double)d);
    const __m256 zero = _mm256_setzero_ps();
    const int na = nv < 4 ? nv : 4; /* the registers of lanes */
    __m256 m[8];
    ln_lane_masks(m, d, nv);
#define LN_MASKED(q, v) (full ? (v) : _mm256_and_ps(m[q], (v)))
    if (rms) {
        for (size_t k = 0; k < n; k += 4) {
            _mm256_storeu_pd(mean + k, _mm256_setzero_pd());
            _mm_storeu_ps(hi + k, _mm_setzero_ps());
            _mm_storeu_ps(lo + k, _mm_setzero_ps());
        }
    } else {
        ln_short_means_nv(src, src_row, n, n, d, mean, hi, lo, nv, full, kind);
    }
    for (size_t k = 0; k < n; k += 4) {
        const char *p[4];
        __m256d r[4];
        ln_rows4(p, src, src_row, n, k);
        for (int i = 0; i < 4; i++) { /* the squares of (x - hi) - lo */
            __m256 a[4], h = _mm256_set1_ps(hi[k + i]), l = _mm256_set1_ps(lo[k + i]);
            for (int q = 0; q < na; q++) {
                __m256 c = LN_MASKED(q, ln_short_centered(ln_load8(p[i] + 8 * q * es, kind), h,
                                                          l, rms));
                a[q] = _mm256_fmadd_ps(c, c, zero);
            }
            for (int q = 4; q < nv; q++) {
                __m256 c = LN_MASKED(q, ln_short_centered(ln_load8(p[i] + 8 * q * es, kind), h,
                                                          l, rms));
                a[q - 4] = _mm256_fmadd_ps(c, c, a[q - 4]);
            }
            r[i] = ln_tree_to4(a, na);
        }
        _mm256_storeu_pd(var + k, _mm256_div_pd(ln_tree_last4(r), dd));
    }
#undef LN_MASKED
}

/* The outputs of n records (item 6) from their float rows to dst's: the
 * normalized value, then the gain and bias (w, b: 2 LN_LANES of them,
 * padded; NULL when absent). */
static inline __attribute__((always_inline)) void
ln_short_output_nv(const char *src, ptrdiff_t src_row, char *dst, ptrdiff_t dst_row, size_t n,
                   const float *hi, const float *r, const float *c, const float *w,
                   const float *b, int nv, int skind, int dkind)
{
    const size_t es = skind == LN_ROWS_F32 ? 4 : 2, eo = dkind == LN_ROWS_F32 ? 4 : 2;
    for (size_t k = 0; k < n; k++) {
        const char *p = src + (ptrdiff_t)k * src_row;
        char *o = dst + (ptrdiff_t)k * dst_row;
        __m256 h = _mm256_set1_ps(hi[k]), rv = _mm256_set1_ps(r[k]), cv = _mm256_set1_ps(c[k]);
        __m256 v[8]; /* nv <= 8 */
        for (int q = 0; q < nv; q++) {
            v[q] = _mm256_fmadd_ps(_mm256_sub_ps(ln_load8(p + 8 * q * es, skind), h), rv, cv);
            if (w && b)
                v[q] = _mm256_fmadd_ps(v[q], _mm256_loadu_ps(w + 8 * q),
                                       _mm256_loadu_ps(b + 8 * q));
            else if (w)
                v[q] = _mm256_mul_ps(v[q], _mm256_loadu_ps(w + 8 * q));
            else if (b)
                v[q] = _mm256_add_ps(v[q], _mm256_loadu_ps(b + 8 * q));
        }
        int q = 0;
        for (; q + 2 <= nv; q += 2)
            ln_store16(o + 8 * q * eo, v[q], v[q + 1], dkind);
        if (q < nv)
            ln_store8(o + 8 * q * eo, v[q], dkind);
    }
}

/* Records of at most half a lane row (ln_lane.h gives this level float32
 * d = 8 and 16, read in place: group_direct), in a function of their
 * own, so that the longer records' code below is compiled as it was. */
static void ln_short_stats_half(const char *src, ptrdiff_t src_row, size_t n, size_t d, int rms,
                                double *mean, double *var, float *hi, float *lo)
{
    if (d == LN_LANES / 2)
        ln_short_stats_nv(src, src_row, n, d, rms, mean, var, hi, lo, 2, 1, LN_ROWS_F32);
    else if (d > LN_LANES / 4)
        ln_short_stats_nv(src, src_row, n, d, rms, mean, var, hi, lo, 2, 0, LN_ROWS_F32);
    else if (d == LN_LANES / 4)
        ln_short_stats_nv(src, src_row, n, d, rms, mean, var, hi, lo, 1, 1, LN_ROWS_F32);
    else
        ln_short_stats_nv(src, src_row, n, d, rms, mean, var, hi, lo, 1, 0, LN_ROWS_F32);
}

static void ln_short_stats_avx2(const char *src, ptrdiff_t src_row, size_t n, size_t d, int rms,
                                double *mean, double *var, float *hi, float *lo)
{
    if (d <= LN_LANES / 2)
        ln_short_stats_half(src, src_row, n, d, rms, mean, var, hi, lo);
    else if (d == LN_LANES) /* whole lane rows: no lane past d */
        ln_short_stats_nv(src, src_row, n, d, rms, mean, var, hi, lo, 4, 1, LN_ROWS_F32);
    else if (d == 2 * LN_LANES)
        ln_short_stats_nv(src, src_row, n, d, rms, mean, var, hi, lo, 8, 1, LN_ROWS_F32);
    else if (d > LN_LANES)
        ln_short_stats_nv(src, src_row, n, d, rms, mean, var, hi, lo, 8, 0, LN_ROWS_F32);
    else
        ln_short_stats_nv(src, src_row, n, d, rms, mean, var, hi, lo, 4, 0, LN_ROWS_F32);
}

/* One affine case of the outputs (w, b constant or NULL where inlined)
 * in the registers of the record's lane width: with half (a constant),
 * records of at most half a lane row (one register, or two); else one
 * lane row (four) or two (eight). */
static inline __attribute__((always_inline)) void
ln_short_output_wb(const char *src, ptrdiff_t src_row, char *dst, ptrdiff_t dst_row, size_t n,
                   size_t d, const float *hi, const float *r, const float *c, const float *w,
                   const float *b, int half, int skind, int dkind)
{
    if (half)
        ln_short_output_nv(src, src_row, dst, dst_row, n, hi, r, c, w, b,
                           d > LN_LANES / 4 ? 2 : 1, skind, dkind);
    else if (d > LN_LANES)
        ln_short_output_nv(src, src_row, dst, dst_row, n, hi, r, c, w, b, 8, skind, dkind);
    else
        ln_short_output_nv(src, src_row, dst, dst_row, n, hi, r, c, w, b, 4, skind, dkind);
}

/* The affine cases, each a loop of its own. */
static inline __attribute__((always_inline)) void
ln_short_output_affine(const char *src, ptrdiff_t src_row, char *dst, ptrdiff_t dst_row,
                       size_t n, size_t d, const float *hi, const float *r, const float *c,
                       const float *w, const float *b, int half, int skind, int dkind)
{
    if (w && b)
        ln_short_output_wb(src, src_row, dst, dst_row, n, d, hi, r, c, w, b, half, skind, dkind);
    else if (w)
        ln_short_output_wb(src, src_row, dst, dst_row, n, d, hi, r, c, w, NULL, half, skind,
                           dkind);
    else if (b)
        ln_short_output_wb(src, src_row, dst, dst_row, n, d, hi, r, c, NULL, b, half, skind,
                           dkind);
    else
        ln_short_output_wb(src, src_row, dst, dst_row, n, d, hi, r, c, NULL, NULL, half, skind,
                           dkind);
}

/* Records of at most half a lane row, as ln_short_stats_half. */
static void ln_short_output_half(const char *src, ptrdiff_t src_row, char *dst,
                                 ptrdiff_t dst_row, size_t n, size_t d, const float *hi,
                                 const float *r, const float *c, const float *w, const float *b)
{
    ln_short_output_affine(src, src_row, dst, dst_row, n, d, hi, r, c, w, b, 1, LN_ROWS_F32,
                           LN_ROWS_F32);
}

static void ln_short_output_avx2(const char *src, ptrdiff_t src_row, char *dst, ptrdiff_t dst_row,
                                 size_t n, size_t d, const float *hi, const float *r,
                                 const float *c, const float *w, const float *b)
{
    if (d <= LN_LANES / 2)
        ln_short_output_half(src, src_row, dst, dst_row, n, d, hi, r, c, w, b);
    else
        ln_short_output_affine(src, src_row, dst, dst_row, n, d, hi, r, c, w, b, 0, LN_ROWS_F32,
                               LN_ROWS_F32);
}
#define LN_SHORT_STATS_AVX ln_short_stats_avx2
#define LN_SHORT_OUTPUT_AVX ln_short_output_avx2

/* float16 and bfloat16 records of d = 8 or 16 (a quarter or half a lane
 * row: one or two registers once converted), read in place and written
 * in place (to_float 0) or as float rows (to_float 1: a group whose
 * records are not all kept goes through its rows), converted in
 * registers: through the group's float rows, float16 (1e6, 16) had taken
 * 1.13x float32's time per element, bfloat16 1.19x. The same values: the
 * conversions are exact one way and rounded once the other, as the rows'
 * are. */
static void ln_short_stats_narrow16(const char *src, ptrdiff_t src_row, size_t n, size_t d,
                                    int rms, double *mean, double *var, float *hi, float *lo,
                                    int kind)
{
    int nv = d == LN_LANES / 2 ? 2 : 1;
    if (kind == LN_ROWS_F16 && nv == 2)
        ln_short_stats_nv(src, src_row, n, d, rms, mean, var, hi, lo, 2, 1, LN_ROWS_F16);
    else if (kind == LN_ROWS_F16)
        ln_short_stats_nv(src, src_row, n, d, rms, mean, var, hi, lo, 1, 1, LN_ROWS_F16);
    else if (nv == 2)
        ln_short_stats_nv(src, src_row, n, d, rms, mean, var, hi, lo, 2, 1, LN_ROWS_BF16);
    else
        ln_short_stats_nv(src, src_row, n, d, rms, mean, var, hi, lo, 1, 1, LN_ROWS_BF16);
}

static void ln_short_output_narrow16(const char *src, ptrdiff_t src_row, char *dst,
                                     ptrdiff_t dst_row, size_t n, size_t d, const float *hi,
                                     const float *r, const float *c, const float *w,
                                     const float *b, int kind, int to_float)
{
    if (kind == LN_ROWS_F16 && !to_float)
        ln_short_output_affine(src, src_row, dst, dst_row, n, d, hi, r, c, w, b, 1, LN_ROWS_F16,
                               LN_ROWS_F16);
    else if (kind == LN_ROWS_F16)
        ln_short_output_affine(src, src_row, dst, dst_row, n, d, hi, r, c, w, b, 1, LN_ROWS_F16,
                               LN_ROWS_F32);
    else if (!to_float)
        ln_short_output_affine(src, src_row, dst, dst_row, n, d, hi, r, c, w, b, 1, LN_ROWS_BF16,
                               LN_ROWS_BF16);
    else
        ln_short_output_affine(src, src_row, dst, dst_row, n, d, hi, r, c, w, b, 1, LN_ROWS_BF16,
                               LN_ROWS_F32);
}

/* ---- short records' backward, 256-bit --------------------------------- */
/*
 * The backward of a short group (ln_lane.h's back_group: float compute,
 * records of at most two lane rows, rows read in place or float copies
 * zero-padded to their lane width) with each record's lanes in
 * registers, as the forward's short loops above: back_sums' lanes (one
 * element each: 0 + t, t * t, 0 + g and g * t, each rounded once)
 * through the same tree, then dx (ln_elem.h's normalize and grad_input)
 * with the parameter-gradient terms of the group's records summed in
 * registers, eight features at a time. The transposed form in C went
 * through arrays on the stack for every step: (1e6, 16) float32 about
 * 50 ns a record without the deposits; records of more than one lane
 * row took the record path, which these loops take 0.60x the time of at
 * float32 (4096, 64). The same operations in the same order: the same
 * bits.
 */

/* The largest lane of each of four registers v[0..3] (none NaN): record
 * i's in element i. */
static inline __m128 ln_max_last4(const __m256 v[4])
{
    __m128 m[4];
    for (int i = 0; i < 4; i++)
        m[i] = _mm_max_ps(_mm256_castps256_ps128(v[i]), _mm256_extractf128_ps(v[i], 1));
    /* a: records 0 and 1, lanes {0, 2} and {1, 3} paired; b: 2 and 3 */
    __m128 a = _mm_max_ps(_mm_unpacklo_ps(m[0], m[1]), _mm_unpackhi_ps(m[0], m[1]));
    __m128 b = _mm_max_ps(_mm_unpacklo_ps(m[2], m[3]), _mm_unpackhi_ps(m[2], m[3]));
    return _mm_max_ps(_mm_movelh_ps(a, b), _mm_movehl_ps(b, a));
}

/* back_group's sums of its LN_SHORT_GROUP records (n of them real; past
 * n, the last again): the forward's first-pass means (LayerNorm without
 * given means; else 0), the shifts m0 (given[k], else that mean, as a
 * float; 0 for RMSNorm), and around them each record's four sums, four
 * records at a time, with the largest |dy| and |t|. x, dy: float rows
 * x_row and dy_row bytes apart, nv registers of them read (1, 2 or 4;
 * 8 for two lane rows, the second's elements added into the first's
 * lanes as back_sums adds them), lanes past d masked unless full. wp:
 * the gain, padded with ones. */
static inline __attribute__((always_inline)) void
ln_short_back_sums_nv(const char *x, ptrdiff_t x_row, const char *dy, ptrdiff_t dy_row,
                      size_t n, size_t d, const float *wp, const double *given, int rms,
                      ln_back_group_sums *s, float *m0, int nv, int full, int kind)
{
    const size_t es = kind == LN_ROWS_F32 ? 4 : 2;
    float hi[LN_SHORT_GROUP], lo[LN_SHORT_GROUP];
    for (size_t k = 0; k < LN_SHORT_GROUP; k++)
        s->mean[k] = 0.0;
    if (!rms && !given)
        ln_short_means_nv(x, x_row, n, LN_SHORT_GROUP, d, s->mean, hi, lo, nv, full, kind);
    for (size_t k = 0; k < LN_SHORT_GROUP; k++)
        m0[k] = rms ? 0.0f : (float)(given && k < n ? given[k] : s->mean[k]);
    const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const int na = nv < 4 ? nv : 4; /* the registers of lanes */
    __m256 mk[8], w[8];
    ln_lane_masks(mk, d, nv);
    for (int q = 0; q < nv; q++)
        w[q] = _mm256_loadu_ps(wp + 8 * q);
    double *sums[4] = {s->st, s->stt, s->g, s->gt};
    for (size_t k = 0; k < LN_SHORT_GROUP; k += 4) {
        const char *px[4], *pd[4];
        __m256d r[4][4]; /* each sum's lanes 0..3 of the tree, by record */
        __m256 mdy[4], mt[4];
        ln_rows4(px, x, x_row, n, k);
        ln_rows4(pd, dy, dy_row, n, k);
        for (int i = 0; i < 4; i++) {
            __m256 l[4][4], c = _mm256_set1_ps(m0[k + i]);
            mdy[i] = mt[i] = zero;
            for (int q = 0; q < nv; q++) {
                __m256 t = _mm256_sub_ps(ln_load8(px[i] + 8 * q * es, kind), c);
                __m256 dv = ln_load8(pd[i] + 8 * q * es, kind);
                if (!full) {
                    t = _mm256_and_ps(mk[q], t);
                    dv = _mm256_and_ps(mk[q], dv);
                }
                __m256 g = _mm256_mul_ps(dv, w[q]);
                if (q < 4) {
                    /* 0 + t as t * 1 + 0, rounded once: the same value,
                     * on the multiply ports (the adds' are the tree's
                     * and the conversions') */
                    l[0][q] = _mm256_fmadd_ps(t, one, zero);
                    l[1][q] = _mm256_fmadd_ps(t, t, zero);
                    l[2][q] = _mm256_fmadd_ps(g, one, zero);
                    l[3][q] = _mm256_fmadd_ps(g, t, zero);
                } else { /* the second lane row, into the same lanes */
                    l[0][q - 4] = _mm256_add_ps(l[0][q - 4], t);
                    l[1][q - 4] = _mm256_fmadd_ps(t, t, l[1][q - 4]);
                    l[2][q - 4] = _mm256_add_ps(l[2][q - 4], g);
                    l[3][q - 4] = _mm256_fmadd_ps(g, t, l[3][q - 4]);
                }
                /* max(v, m) is m when v is NaN, as back_sums' v > m ? v : m */
                mdy[i] = _mm256_max_ps(_mm256_andnot_ps(sign, dv), mdy[i]);
                mt[i] = _mm256_max_ps(_mm256_andnot_ps(sign, t), mt[i]);
            }
            for (int j = 0; j < 4; j++)
                r[j][i] = ln_tree_to4(l[j], na);
        }
        for (int j = 0; j < 4; j++)
            _mm256_storeu_pd(sums[j] + k, ln_tree_last4(r[j]));
        _mm256_storeu_pd(s->max_dy + k, _mm256_cvtps_pd(ln_max_last4(mdy)));
        _mm256_storeu_pd(s->max_t + k, _mm256_cvtps_pd(ln_max_last4(mt)));
    }
}

static void ln_short_back_sums_avx2(const char *x, ptrdiff_t x_row, const char *dy,
                                    ptrdiff_t dy_row, size_t n, size_t d, const float *wp,
                                    const double *given, int rms, ln_back_group_sums *s,
                                    float *m0)
{
    if (d == 8)
        ln_short_back_sums_nv(x, x_row, dy, dy_row, n, d, wp, given, rms, s, m0, 1, 1, LN_ROWS_F32);
    else if (d < 8)
        ln_short_back_sums_nv(x, x_row, dy, dy_row, n, d, wp, given, rms, s, m0, 1, 0, LN_ROWS_F32);
    else if (d == 16)
        ln_short_back_sums_nv(x, x_row, dy, dy_row, n, d, wp, given, rms, s, m0, 2, 1, LN_ROWS_F32);
    else if (d < 16)
        ln_short_back_sums_nv(x, x_row, dy, dy_row, n, d, wp, given, rms, s, m0, 2, 0, LN_ROWS_F32);
    else if (d == 32)
        ln_short_back_sums_nv(x, x_row, dy, dy_row, n, d, wp, given, rms, s, m0, 4, 1, LN_ROWS_F32);
    else if (d < 32)
        ln_short_back_sums_nv(x, x_row, dy, dy_row, n, d, wp, given, rms, s, m0, 4, 0, LN_ROWS_F32);
    else if (d == 64)
        ln_short_back_sums_nv(x, x_row, dy, dy_row, n, d, wp, given, rms, s, m0, 8, 1, LN_ROWS_F32);
    else
        ln_short_back_sums_nv(x, x_row, dy, dy_row, n, d, wp, given, rms, s, m0, 8, 0, LN_ROWS_F32);
}

/* A group's float coefficients (ln_ops.h's back_short_rows: hi, r, c of
 * normalize, a and bm of grad_input) and the records it keeps. */
typedef struct {
    float hi[LN_SHORT_GROUP], r[LN_SHORT_GROUP], c[LN_SHORT_GROUP];
    float a[LN_SHORT_GROUP], bm[LN_SHORT_GROUP];
    int keep[LN_SHORT_GROUP];
} ln_short_back_coefs;

/* The two parameter-gradient terms of eight features (dweight's dy *
 * xhat and dbias's dy, in double) summed across records on `levels`
 * levels in registers, then put into the features' level sums.
 * AVX-512 holds the eight doubles in one register; AVX2 takes two halves
 * of four. Either way each term is deposited as ln_deposit3/ln_deposit2
 * and ln_deposit_db do, and integers are summed: the same bits.
 * on_grid (float16 rows): dbias's terms skip the lowest level. */
_Static_assert(2 * FLT_MANT_DIG <= DBL_MANT_DIG,
               "the product of two floats is exact in double (ln_deposit2_product8)");
#if LN_VEC_BYTES == 64
typedef struct {
    __m512i w[LN_ACC_LEVELS], b[LN_ACC_LEVELS];
} ln_terms8;

/* ln_deposit_top and ln_deposit2 (ln_tmpl.h) of eight terms, their level
 * sums s[0..2] in registers (each level's body has one width of them). */
static inline __m512d ln_deposit_top8(__m512i s[3], __m512d v)
{
    const __m512d c0 = _mm512_set1_pd(LN_ACC_C0);
    __m512d t = _mm512_add_pd(v, c0);
    s[0] = _mm512_add_epi64(s[0], _mm512_castpd_si512(t));
    return _mm512_sub_pd(v, _mm512_sub_pd(t, c0));
}

static inline __m512i ln_on_level1_8(__m512i s1, __m512d v)
{
    return _mm512_add_epi64(s1, _mm512_castpd_si512(_mm512_add_pd(v, _mm512_set1_pd(LN_ACC_C1))));
}

static inline void ln_deposit2_8(__m512i s[3], __m512d v)
{
    __m512d t = _mm512_add_pd(v, _mm512_set1_pd(LN_ACC_C1));
    s[1] = _mm512_add_epi64(s[1], _mm512_castpd_si512(t));
    s[2] = _mm512_add_epi64(
        s[2], _mm512_castpd_si512(_mm512_add_pd(v, _mm512_sub_pd(_mm512_set1_pd(LN_ACC_C12), t))));
}

/* ln_deposit2_8 of the product v = a * b of two floats widened to
 * double: a * b is exact in double (48 significant bits at most, the
 * assertion above, and an exponent between -298 and 256, inside double's
 * normal range), so fma(a, b, C) rounds v + C once, as the add does: the
 * same integers, one multiply fewer. One thread, time vs the multiply,
 * both orders: float32 backward (64, 768) 0.95-0.99x, (4096, 768) 0.96x,
 * (4096, 1024) 0.97-1.01x; float16 (64, 768) 0.94-0.98x; AVX2 level
 * float32 0.98-0.99x. */
static inline void ln_deposit2_product8(__m512i s[3], __m512d a, __m512d b)
{
    __m512d t = _mm512_fmadd_pd(a, b, _mm512_set1_pd(LN_ACC_C1));
    s[1] = _mm512_add_epi64(s[1], _mm512_castpd_si512(t));
    __m512d q = _mm512_sub_pd(_mm512_set1_pd(LN_ACC_C12), t);
    s[2] = _mm512_add_epi64(s[2], _mm512_castpd_si512(_mm512_fmadd_pd(a, b, q)));
}

static inline void ln_terms8_zero(ln_terms8 *s)
{
    for (int l = 0; l < LN_ACC_LEVELS; l++)
        s->w[l] = s->b[l] = _mm512_setzero_si512();
}

/* dv, xh: the eight features' dy and xhat (floats); dy_f32, the same dy
 * in memory when the row is float32 (else NULL: AVX2 reads its halves
 * from there). */
static inline void ln_terms8_add(ln_terms8 *s, __m256 dv, __m256 xh, const float *dy_f32,
                                 int levels, int on_grid)
{
    (void)dy_f32;
    __m512d u = _mm512_cvtps_pd(dv), xd = _mm512_cvtps_pd(xh);
    if (levels == 3) {
        ln_deposit2_8(s->w, ln_deposit_top8(s->w, _mm512_mul_pd(u, xd)));
        u = ln_deposit_top8(s->b, u);
    } else {
        ln_deposit2_product8(s->w, u, xd);
    }
    if (on_grid) /* u's remainder on the lowest level is 0 */
        s->b[1] = ln_on_level1_8(s->b[1], u);
    else
        ln_deposit2_8(s->b, u);
}

/* Level l's eight sums of each term to pw and pb: added to what is
 * there, or (add 0) stored. */
static inline void ln_terms8_put(const ln_terms8 *s, int l, uint64_t *pw, uint64_t *pb, int add)
{
    __m512i w = s->w[l], b = s->b[l];
    if (add) {
        w = _mm512_add_epi64(_mm512_loadu_si512(pw), w);
        b = _mm512_add_epi64(_mm512_loadu_si512(pb), b);
    }
    _mm512_storeu_si512(pw, w);
    _mm512_storeu_si512(pb, b);
}
#else
typedef struct {
    __m256i w[2][LN_ACC_LEVELS], b[2][LN_ACC_LEVELS]; /* [lanes 0-3, 4-7][level] */
} ln_terms8;

/* ln_deposit_top and ln_deposit2 (ln_tmpl.h) of four terms, their level
 * sums s[0..2] in registers. */
static inline __m256d ln_deposit_top4(__m256i s[3], __m256d v)
{
    const __m256d c0 = _mm256_set1_pd(LN_ACC_C0);
    __m256d t = _mm256_add_pd(v, c0);
    s[0] = _mm256_add_epi64(s[0], _mm256_castpd_si256(t));
    return _mm256_sub_pd(v, _mm256_sub_pd(t, c0));
}

static inline void ln_deposit2_4(__m256i s[3], __m256d v)
{
    __m256d t = _mm256_add_pd(v, _mm256_set1_pd(LN_ACC_C1));
    s[1] = _mm256_add_epi64(s[1], _mm256_castpd_si256(t));
    s[2] = _mm256_add_epi64(
        s[2], _mm256_castpd_si256(_mm256_add_pd(v, _mm256_sub_pd(_mm256_set1_pd(LN_ACC_C12), t))));
}

/* ln_deposit2_4 of the exact product a * b (see ln_deposit2_product8). */
static inline void ln_deposit2_product4(__m256i s[3], __m256d a, __m256d b)
{
    __m256d t = _mm256_fmadd_pd(a, b, _mm256_set1_pd(LN_ACC_C1));
    s[1] = _mm256_add_epi64(s[1], _mm256_castpd_si256(t));
    __m256d q = _mm256_sub_pd(_mm256_set1_pd(LN_ACC_C12), t);
    s[2] = _mm256_add_epi64(s[2], _mm256_castpd_si256(_mm256_fmadd_pd(a, b, q)));
}

static inline void ln_terms8_zero(ln_terms8 *s)
{
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < LN_ACC_LEVELS; l++)
            s->w[h][l] = s->b[h][l] = _mm256_setzero_si256();
}

static inline void ln_terms8_add(ln_terms8 *s, __m256 dv, __m256 xh, const float *dy_f32,
                                 int levels, int on_grid)
{
    for (int h = 0; h < 2; h++) {
        __m128 xhh = h ? _mm256_extractf128_ps(xh, 1) : _mm256_castps256_ps128(xh);
        /* float32 dy's halves converted from memory: no extract */
        __m128 dh = dy_f32 ? _mm_loadu_ps(dy_f32 + 4 * h)
                    : h    ? _mm256_extractf128_ps(dv, 1)
                           : _mm256_castps256_ps128(dv);
        __m256d u = _mm256_cvtps_pd(dh), xd = _mm256_cvtps_pd(xhh);
        if (levels == 3) {
            ln_deposit2_4(s->w[h], ln_deposit_top4(s->w[h], _mm256_mul_pd(u, xd)));
            u = ln_deposit_top4(s->b[h], u);
        } else {
            ln_deposit2_product4(s->w[h], u, xd);
        }
        if (on_grid) /* u's remainder on the lowest level is 0 */
            s->b[h][1] = _mm256_add_epi64(
                s->b[h][1], _mm256_castpd_si256(_mm256_add_pd(u, _mm256_set1_pd(LN_ACC_C1))));
        else
            ln_deposit2_4(s->b[h], u);
    }
}

static inline void ln_terms8_put(const ln_terms8 *s, int l, uint64_t *pw, uint64_t *pb, int add)
{
    for (int h = 0; h < 2; h++) {
        __m256i *qw = (__m256i *)(pw + 4 * h), *qb = (__m256i *)(pb + 4 * h);
        __m256i w = s->w[h][l], b = s->b[h][l];
        if (add) {
            w = _mm256_add_epi64(_mm256_loadu_si256(qw), w);
            b = _mm256_add_epi64(_mm256_loadu_si256(qb), b);
        }
        _mm256_storeu_si256(qw, w);
        _mm256_storeu_si256(qb, b);
    }
}
#endif

/* dx of the kept records of a group (as ln_short_back_sums_nv reads x and
 * dy) into dst's rows, and the terms of all LN_SHORT_GROUP records (dy *
 * xhat and dy in double; 0 for a record not kept) on `levels` levels (2
 * or 3; 0: none) summed into sw (dweight's) and sb (dbias's), features 8q
 * .. 8q + 7 at a time. */
static inline __attribute__((always_inline)) void
ln_short_back_output_nv(const char *x, ptrdiff_t x_row, const char *dy, ptrdiff_t dy_row,
                        char *dst, ptrdiff_t dst_row, size_t n, const float *wp,
                        const ln_short_back_coefs *co, int levels,
                        uint64_t sw[LN_ACC_LEVELS][2 * LN_LANES],
                        uint64_t sb[LN_ACC_LEVELS][2 * LN_LANES], int nv, int kind)
{
    const size_t es = kind == LN_ROWS_F32 ? 4 : 2;
    for (int q = 0; q < nv; q++) {
        const __m256 w = _mm256_loadu_ps(wp + 8 * q);
        ln_terms8 s;
        ln_terms8_zero(&s);
        for (size_t k = 0; k < LN_SHORT_GROUP; k++) {
            size_t kk = k < n ? k : n - 1;
            __m256 xv = ln_load8(x + (ptrdiff_t)kk * x_row + 8 * q * es, kind);
            __m256 dv = ln_load8(dy + (ptrdiff_t)kk * dy_row + 8 * q * es, kind);
            __m256 r = _mm256_set1_ps(co->r[k]);
            __m256 xh = _mm256_fmadd_ps(_mm256_sub_ps(xv, _mm256_set1_ps(co->hi[k])), r,
                                        _mm256_set1_ps(co->c[k]));
            __m256 g = _mm256_mul_ps(dv, w);
            __m256 o = _mm256_mul_ps(_mm256_fnmadd_ps(xh, _mm256_set1_ps(co->bm[k]),
                                                      _mm256_sub_ps(g, _mm256_set1_ps(co->a[k]))),
                                     r);
            if (co->keep[k])
                ln_store8(dst + (ptrdiff_t)k * dst_row + 8 * q * es, o, kind);
            if (!levels)
                continue;
            /* a record not kept adds terms of +0 (dy and xhat both +0:
             * no NaN from its xhat) */
            __m256 km = _mm256_castsi256_ps(_mm256_set1_epi32(-(int)(co->keep[k] != 0)));
            ln_terms8_add(&s, _mm256_and_ps(dv, km), _mm256_and_ps(xh, km), NULL, levels, 0);
        }
        for (int l = LN_ACC_LEVELS - levels; levels && l < LN_ACC_LEVELS; l++)
            ln_terms8_put(&s, l, sw[l] + 8 * q, sb[l] + 8 * q, 0);
    }
}

/* One copy per (registers, levels) of rows of `kind` (a constant). */
static inline __attribute__((always_inline)) void
ln_short_back_output_of(const char *x, ptrdiff_t x_row, const char *dy, ptrdiff_t dy_row,
                        char *dst, ptrdiff_t dst_row, size_t n, size_t d, const float *wp,
                        const ln_short_back_coefs *co, int levels,
                        uint64_t sw[LN_ACC_LEVELS][2 * LN_LANES],
                        uint64_t sb[LN_ACC_LEVELS][2 * LN_LANES], int kind)
{
    int nv = d > 32 ? 8 : d > 16 ? 4 : d > 8 ? 2 : 1;
    for (int v = 1; v <= 8; v *= 2) {
        if (nv != v)
            continue;
        if (levels == 3)
            ln_short_back_output_nv(x, x_row, dy, dy_row, dst, dst_row, n, wp, co, 3, sw, sb, v,
                                    kind);
        else if (levels == 2)
            ln_short_back_output_nv(x, x_row, dy, dy_row, dst, dst_row, n, wp, co, 2, sw, sb, v,
                                    kind);
        else
            ln_short_back_output_nv(x, x_row, dy, dy_row, dst, dst_row, n, wp, co, 0, sw, sb, v,
                                    kind);
    }
}

static void ln_short_back_output_avx2(const char *x, ptrdiff_t x_row, const char *dy,
                                      ptrdiff_t dy_row, char *dst, ptrdiff_t dst_row, size_t n,
                                      size_t d, const float *wp, const ln_short_back_coefs *co,
                                      int levels, uint64_t sw[LN_ACC_LEVELS][2 * LN_LANES],
                                      uint64_t sb[LN_ACC_LEVELS][2 * LN_LANES])
{
    ln_short_back_output_of(x, x_row, dy, dy_row, dst, dst_row, n, d, wp, co, levels, sw, sb,
                            LN_ROWS_F32);
}
#define LN_SHORT_BACK_SUMS_AVX ln_short_back_sums_avx2
#define LN_SHORT_BACK_OUTPUT_AVX ln_short_back_output_avx2

/* float16 and bfloat16 records of whole registers (d = 8, 16, 32 or 64),
 * read and written in place, converted in registers, as float32's are
 * (ln_lane.h's back_direct). For one kind (a constant), each width its
 * own branch: a loop over them is not unrolled, and the copy it leaves
 * takes the count at run time. */
static inline __attribute__((always_inline)) void
ln_short_back_sums_whole(const char *x, ptrdiff_t x_row, const char *dy, ptrdiff_t dy_row,
                         size_t n, size_t d, const float *wp, const double *given, int rms,
                         ln_back_group_sums *s, float *m0, int kind)
{
    if (d == 8)
        ln_short_back_sums_nv(x, x_row, dy, dy_row, n, d, wp, given, rms, s, m0, 1, 1, kind);
    else if (d == 16)
        ln_short_back_sums_nv(x, x_row, dy, dy_row, n, d, wp, given, rms, s, m0, 2, 1, kind);
    else if (d == 32)
        ln_short_back_sums_nv(x, x_row, dy, dy_row, n, d, wp, given, rms, s, m0, 4, 1, kind);
    else
        ln_short_back_sums_nv(x, x_row, dy, dy_row, n, d, wp, given, rms, s, m0, 8, 1, kind);
}

static void ln_short_back_sums_16(const char *x, ptrdiff_t x_row, const char *dy,
                                  ptrdiff_t dy_row, size_t n, size_t d, const float *wp,
                                  const double *given, int rms, ln_back_group_sums *s, float *m0,
                                  int kind)
{
    if (kind == LN_ROWS_F16)
        ln_short_back_sums_whole(x, x_row, dy, dy_row, n, d, wp, given, rms, s, m0,
                                 LN_ROWS_F16);
    else
        ln_short_back_sums_whole(x, x_row, dy, dy_row, n, d, wp, given, rms, s, m0,
                                 LN_ROWS_BF16);
}

static void ln_short_back_output_16(const char *x, ptrdiff_t x_row, const char *dy,
                                    ptrdiff_t dy_row, char *dst, ptrdiff_t dst_row, size_t n,
                                    size_t d, const float *wp, const ln_short_back_coefs *co,
                                    int levels, uint64_t sw[LN_ACC_LEVELS][2 * LN_LANES],
                                    uint64_t sb[LN_ACC_LEVELS][2 * LN_LANES], int kind)
{
    if (kind == LN_ROWS_F16)
        ln_short_back_output_of(x, x_row, dy, dy_row, dst, dst_row, n, d, wp, co, levels, sw, sb,
                                LN_ROWS_F16);
    else
        ln_short_back_output_of(x, x_row, dy, dy_row, dst, dst_row, n, d, wp, co, levels, sw, sb,
                                LN_ROWS_BF16);
}

/* ---- a group's parameter-gradient terms, 256-bit ---------------------- */
/*
 * The deposits of the m float32 or float16 LayerNorm records ln_ops.h's
 * back_finish finishes together, features [i0, i1) of each (a chunk),
 * eight features at a time: each record's terms there (dy * xhat and dy,
 * in double, xhat as the dx loop has it) summed on `levels` levels in
 * registers across the records, then added to the features' level sums
 * once. Record by record, every term had been a load and a store of its
 * level sums. The same integers summed: the same bits. float16's dbias
 * terms go to the levels above the lowest (ln_tmpl.h's ln_deposit_db);
 * float16 in the caches, one thread, against its records one by one:
 * (64, 768) 0.975x the time, (256, 1000) 0.96x, (512, 768) 0.98x,
 * (64, 4096) 1.006x.
 *
 * With `apply` (a constant), the same loop also writes each record's dx
 * (ln_elem.h's grad_input, from its coefficients a and bm: the dx loop of
 * back_apply): records in the caches, read once. Without it, the terms
 * alone: streamed records, whose dx loop (non-temporal stores) has just
 * read the chunk; that loop also asks for the next group's lines, a line
 * of each record every other step (ln_ask_next).
 */
/* One line of x and of dy of the next group's record j (ln_group_rows's
 * an, ax, ady), into the caches while this group computes (its back_sums
 * then reads them from there): the line half a row away from feature i,
 * so that rows 4 KiB apart (d = 1024) do not meet the lines being read in
 * one L1 set. */
static inline void ln_ask_next(const ln_group_rows *g, size_t j, size_t i, size_t es)
{
    size_t o = es * (i < g->half ? i + g->half : i - g->half);
    __builtin_prefetch(g->ax + (ptrdiff_t)j * g->ax_row + o, 0, 1);
    __builtin_prefetch(g->ady + (ptrdiff_t)j * g->ady_row + o, 0, 1);
}

/* Element i of a row of `kind` (LN_ROWS_F32 or LN_ROWS_F16) as a float;
 * eight floats stored there. */
static inline float ln_group_get(const void *row, size_t i, int kind)
{
    if (kind == LN_ROWS_F16)
        return _cvtsh_ss(((const uint16_t *)row)[i]);
    return ((const float *)row)[i];
}


/* Features one step of the group loop takes from each streamed record: at
 * the AVX-512 level sixteen (two sets of sums in registers), a whole
 * 64-byte line of float32 x and of dy, used up while it is in L1. Eight at
 * a time, each line was read twice, fifteen other lines apart: with rows a
 * multiple of 4 KiB apart (float32 d = 1024, 4096) the 16 lines of a step
 * share one L1 set of 8 ways, and every load came from L2 (float32
 * (16384, 4096), one thread: the deposits took 2.3x the time of the dx
 * pass, against 1.2x at d = 4080). Sixteen: (16384, 4096) 0.75x the time,
 * (1024, 4096) 0.89x, (4096, 1024) 0.83-0.86x, (4096, 768) level. Records
 * in the caches (apply) keep eight, (64, 768) having been 1.09x slower
 * with sixteen, unless their rows share L1 sets (ln_back_group_wide). */
#if LN_VEC_BYTES == 64
#define LN_GROUP_STEP 16
#else
#define LN_GROUP_STEP 8 /* AVX2's 16 registers hold one set of sums */
#endif
_Static_assert(LN_GROUP_STEP % 8 == 0 && 16 % LN_GROUP_STEP == 0,
               "a step is whole sets of eight features, at most one ask for the next group");

/* Records a group of long rows takes when they lie a multiple of 4 KiB
 * apart (ln_ops.h's back_group_size). At the AVX2 level, eight such rows
 * meet in one L1 set with each step's lines of x, dy and dx (from 64 KiB
 * apart, in one L2 set too): four at a time, float32 one thread, (256,
 * 4096) 0.76-0.79x the time, (512, 4096) 0.91x, (16384, 4096) 0.90x,
 * (64, 16384) 0.77x, (16, 65536) 0.79x; float16 (128, 8192) 0.90x, (32,
 * 32768) 0.87x. Rows of less than 16 KiB lost by it ((1024, 1024) 1.08x,
 * (2048, 2048) 1.04x, float16 (256, 4096) 1.07x). The AVX-512 level
 * keeps eight: its sixteen-feature steps are its answer to those sets,
 * and it was not measured. */
#if LN_VEC_BYTES == 64
#define LN_BACK_ALIASED_GROUP 8
#else
#define LN_BACK_ALIASED_GROUP 4
#endif
#define LN_BACK_ALIASED_ROW_MIN 16384

/* Features [i, i + 8 * nh) of the group's m records (nh sets of eight):
 * their dx with apply, and their terms summed in registers, then added to
 * the level sums; with ask, a line of each of the next group's records
 * asked for (once per 16 features). */
static inline __attribute__((always_inline)) void
ln_back_group_step(const ln_group_rows *g, size_t m, size_t i, int nh, int ask,
                   uint64_t *const *sw, uint64_t *const *sb, int levels, int apply, int kind)
{
    const size_t es = kind == LN_ROWS_F16 ? 2 : 4;
    const int on_grid = kind == LN_ROWS_F16; /* ln_deposit_db's */
    ln_terms8 s[LN_GROUP_STEP / 8];
    __m256 wv[LN_GROUP_STEP / 8];
    for (int h = 0; h < nh; h++) {
        ln_terms8_zero(&s[h]);
        wv[h] = apply ? _mm256_loadu_ps(g->w + i + 8 * h) : _mm256_setzero_ps();
    }
    for (size_t j = 0; j < m; j++) {
        if (!apply && ask && j < g->an)
            ln_ask_next(g, j, i, es);
        __m256 rv = _mm256_set1_ps(g->r[j]);
        for (int h = 0; h < nh; h++) {
            size_t ih = i + 8 * (size_t)h;
            const char *xr = (const char *)g->x[j] + ih * es;
            const char *dr = (const char *)g->dy[j] + ih * es;
            __m256 dv = ln_load8(dr, kind);
            __m256 xh = _mm256_fmadd_ps(_mm256_sub_ps(ln_load8(xr, kind),
                                                      _mm256_set1_ps(g->hi[j])),
                                        rv, _mm256_set1_ps(g->c[j]));
            if (apply) { /* fma(-xhat, bm, g - a) * r */
                __m256 ga = _mm256_sub_ps(_mm256_mul_ps(dv, wv[h]), _mm256_set1_ps(g->a[j]));
                ln_store8((char *)g->dx[j] + ih * es,
                          _mm256_mul_ps(_mm256_fnmadd_ps(xh, _mm256_set1_ps(g->bm[j]), ga), rv),
                          kind);
            }
            ln_terms8_add(&s[h], dv, xh, kind == LN_ROWS_F32 ? (const float *)dr : NULL,
                          levels, on_grid);
        }
    }
    for (int h = 0; h < nh; h++)
        for (int l = LN_ACC_LEVELS - levels; l < LN_ACC_LEVELS; l++)
            ln_terms8_put(&s[h], l, sw[l] + i + 8 * h, sb[l] + i + 8 * h, 1);
}

/* Do the group's rows lie a multiple of 4 KiB apart (the span of an L1
 * way: each line of a step then shares its set with the same line of
 * every other record)? */
static inline int ln_rows_share_sets(const ln_group_rows *g, size_t m)
{
    return m > 1 && ((uintptr_t)g->x[1] - (uintptr_t)g->x[0]) % 4096 == 0;
}

static inline __attribute__((always_inline)) void
ln_back_group_nv(const ln_group_rows *g, size_t m, size_t i0, size_t i1, uint64_t *const *sw,
                 uint64_t *const *sb, int levels, int apply, int wide, int kind)
{
    const int on_grid = kind == LN_ROWS_F16; /* ln_deposit_db's */
    size_t i = i0;
    for (; wide && i + LN_GROUP_STEP <= i1; i += LN_GROUP_STEP)
        ln_back_group_step(g, m, i, LN_GROUP_STEP / 8, i % 16 == 0 || LN_GROUP_STEP == 16, sw,
                           sb, levels, apply, kind);
    for (; i + 8 <= i1; i += 8)
        ln_back_group_step(g, m, i, 1, i % 16 == 0, sw, sb, levels, apply, kind);
    for (; i < i1; i++) /* the last features, a term at a time */
        for (size_t j = 0; j < m; j++) {
            float dyv = ln_group_get(g->dy[j], i, kind);
            float xh = fmaf(ln_group_get(g->x[j], i, kind) - g->hi[j], g->r[j], g->c[j]);
            if (apply) {
                float o = fmaf(-xh, g->bm[j], dyv * g->w[i] - g->a[j]) * g->r[j];
                if (kind == LN_ROWS_F16)
                    ((uint16_t *)g->dx[j])[i] = _cvtss_sh(o, _MM_FROUND_TO_NEAREST_INT);
                else
                    ((float *)g->dx[j])[i] = o;
            }
            double u = (double)dyv, v = u * (double)xh;
            if (levels == 3)
                ln_deposit3(sw[0], sw[1], sw[2], i, v);
            else
                ln_deposit2(sw[1], sw[2], i, v);
            ln_deposit_db(sb[0], sb[1], sb[2], i, u, levels, on_grid);
        }
}

/* Records in the caches whose rows share L1 sets (ln_rows_share_sets),
 * sixteen features a step: one thread, float32 (64, 1024) 0.86-0.88x the
 * time, (256, 1024) 0.73-0.81x, (128, 4096) 0.66-0.69x, (512, 2048)
 * 0.92-0.97x, float16 (64, 2048) 0.73x. Out of line: with these copies
 * among the others, records that keep eight a step ((64, 768)) were
 * 1.04-1.06x slower. */
static LN_NOINLINE void ln_back_group_wide(const ln_group_rows *g, size_t m, size_t i0,
                                           size_t i1, uint64_t *const *sw, uint64_t *const *sb,
                                           int levels, int kind)
{
    if (levels == 3 && kind == LN_ROWS_F16)
        ln_back_group_nv(g, m, i0, i1, sw, sb, 3, 1, 1, LN_ROWS_F16);
    else if (kind == LN_ROWS_F16)
        ln_back_group_nv(g, m, i0, i1, sw, sb, 2, 1, 1, LN_ROWS_F16);
    else if (levels == 3)
        ln_back_group_nv(g, m, i0, i1, sw, sb, 3, 1, 1, LN_ROWS_F32);
    else
        ln_back_group_nv(g, m, i0, i1, sw, sb, 2, 1, 1, LN_ROWS_F32);
}

/* One copy of the loop per (levels, apply), each with constants:
 * streamed records sixteen features a step, records in the caches eight
 * (but see ln_back_group_wide). */
static inline __attribute__((always_inline)) void
ln_back_group_kind(const ln_group_rows *g, size_t m, size_t i0, size_t i1, uint64_t *const *sw,
                   uint64_t *const *sb, int levels, int apply, int kind)
{
    if (apply && LN_GROUP_STEP > 8 && ln_rows_share_sets(g, m))
        ln_back_group_wide(g, m, i0, i1, sw, sb, levels, kind);
    else if (apply && levels == 3)
        ln_back_group_nv(g, m, i0, i1, sw, sb, 3, 1, 0, kind);
    else if (apply)
        ln_back_group_nv(g, m, i0, i1, sw, sb, 2, 1, 0, kind);
    else if (levels == 3)
        ln_back_group_nv(g, m, i0, i1, sw, sb, 3, 0, 1, kind);
    else
        ln_back_group_nv(g, m, i0, i1, sw, sb, 2, 0, 1, kind);
}

static void ln_back_group_f32(const ln_group_rows *g, size_t m, size_t i0, size_t i1,
                              uint64_t *const *sw, uint64_t *const *sb, int levels, int apply)
{
    ln_back_group_kind(g, m, i0, i1, sw, sb, levels, apply, LN_ROWS_F32);
}

static void ln_back_group_f16(const ln_group_rows *g, size_t m, size_t i0, size_t i1,
                              uint64_t *const *sw, uint64_t *const *sb, int levels, int apply)
{
    ln_back_group_kind(g, m, i0, i1, sw, sb, levels, apply, LN_ROWS_F16);
}
#define LN_BACK_GROUP_F32 ln_back_group_f32
#define LN_BACK_GROUP_F16 ln_back_group_f16
#endif

#define LN_LOAD_ROW_F16 ln_load_row_f16
#define LN_LOAD_ROW_F16_WIDE ln_load_row_f16d
#define LN_STORE_ROW_F16_WIDE ln_store_row_f16d
#define LN_STORE_ROW_F16 ln_store_row_f16
#define LN_STREAM_ROW_F16 ln_stream_row_f16
#define LN_LOAD_PART_F16 ln_load_part_f16
#define LN_STORE_PART_F16 ln_store_part_f16

#define LN_STREAM_BYTES ln_stream_bytes
#define LN_STORE_FENCE ln_sfence

#endif /* LN_X86_H */
