/*
 * ln_x86.h - what the x86 levels add to the lane form: non-temporal stores
 * for outputs too large to stay in the caches, and the fence that orders
 * them. Included by ln_avx2.c and ln_avx512.c under their target pragma,
 * with LN_VEC_BYTES (32 or 64) set.
 */
#ifndef LN_X86_H
#define LN_X86_H

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

_Static_assert(LN_VEC_BYTES == 32 || LN_VEC_BYTES == 64, "LN_VEC_BYTES: 32 or 64");

/* n bytes (a multiple of 64) from src to the 64-byte aligned dst. */
static inline void ln_stream_bytes(void *dst, const void *src, size_t n)
{
    char *d = dst;
    const char *s = src;
    for (size_t k = 0; k < n; k += LN_VEC_BYTES) {
#if LN_VEC_BYTES == 64
        _mm512_stream_si512((void *)(d + k), _mm512_loadu_si512((const void *)(s + k)));
#else
        _mm256_stream_si256((__m256i *)(d + k), _mm256_loadu_si256((const __m256i *)(s + k)));
#endif
    }
}

static void ln_sfence(void) { _mm_sfence(); }

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

/* The first n < LN_LANES of a row (zeros beyond), and back: masked loads
 * and stores with AVX-512, a small zero-padded buffer with AVX2 (which has
 * no 16-bit masked moves). Nothing past n is read or written. */
#if LN_VEC_BYTES == 64
static inline __mmask16 ln_first16(size_t n)
{
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}
#endif

static inline void ln_load_part_f16(float *v, const uint16_t *p, size_t n)
{
#if LN_VEC_BYTES == 64
    for (size_t j = 0; j < LN_LANES; j += 16) {
        __m256i h = _mm256_maskz_loadu_epi16(ln_first16(n > j ? n - j : 0), p + j);
        _mm512_storeu_ps(v + j, _mm512_cvtph_ps(h));
    }
#else
    uint16_t buf[LN_LANES] = {0};
    memcpy(buf, p, n * sizeof *p);
    ln_load_row_f16(v, buf);
#endif
}

static inline void ln_store_part_f16(uint16_t *p, const float *v, size_t n)
{
#if LN_VEC_BYTES == 64
    for (size_t j = 0; j < LN_LANES; j += 16) {
        __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(v + j), _MM_FROUND_TO_NEAREST_INT);
        _mm256_mask_storeu_epi16(p + j, ln_first16(n > j ? n - j : 0), h);
    }
#else
    uint16_t buf[LN_LANES];
    ln_store_row_f16(buf, v);
    memcpy(p, buf, n * sizeof *p);
#endif
}

#define LN_LOAD_ROW_F16 ln_load_row_f16
#define LN_STORE_ROW_F16 ln_store_row_f16
#define LN_LOAD_PART_F16 ln_load_part_f16
#define LN_STORE_PART_F16 ln_store_part_f16

#define LN_STREAM_BYTES ln_stream_bytes
#define LN_STORE_FENCE ln_sfence

#endif /* LN_X86_H */
