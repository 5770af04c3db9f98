/*
 * ln_avx512.c - AVX-512F kernels.
 *
 * The LN_LANES = 32 double lanes live in four zmm registers (lanes 0-7,
 * 8-15, 16-23, 24-31), so each lane sees exactly the additions of the
 * scalar kernel in the same order. Tails use masked loads: a masked-out
 * lane adds +0.0, which leaves a lane unchanged (lanes are never -0.0).
 * Multiply-adds are fused exactly where the scalar kernel calls fmaf
 * (ln_elem.h) and nowhere else (built with -ffp-contract=off).
 */
#include "layernorm.h"
#include "ln_elem.h"

#if defined(LN_HAVE_X86_KERNELS)
#include <immintrin.h>

#define TARGET __attribute__((target("avx512f,fma")))

/* Mask of the first n of 16 lanes. */
static inline __mmask16 first16(size_t n)
{
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

static inline __mmask8 first8(size_t n)
{
    return n >= 8 ? (__mmask8)0xff : (__mmask8)((1u << n) - 1);
}

/* ln_tree_sum in registers: lanes j += j + 16, j += j + 8 (whole
 * registers), then j += j + 4, j + 2, j + 1 inside the first register. */
TARGET static inline double reduce4(__m512d a0, __m512d a1, __m512d a2,
                                    __m512d a3)
{
    __m512d s = _mm512_add_pd(_mm512_add_pd(a0, a2), _mm512_add_pd(a1, a3));
    __m256d q = _mm256_add_pd(_mm512_castpd512_pd256(s),
                              _mm512_extractf64x4_pd(s, 1));
    __m128d p = _mm_add_pd(_mm256_castpd256_pd128(q),
                           _mm256_extractf128_pd(q, 1));
    return _mm_cvtsd_f64(_mm_add_sd(p, _mm_unpackhi_pd(p, p)));
}

/* Widen 32 floats into 4x8 doubles (lanes 0-7, 8-15, 16-23, 24-31). */
TARGET static inline void widen32(__m512 lo, __m512 hi, __m512d v[4])
{
    v[0] = _mm512_cvtps_pd(_mm512_castps512_ps256(lo));
    v[1] = _mm512_cvtps_pd(
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lo), 1)));
    v[2] = _mm512_cvtps_pd(_mm512_castps512_ps256(hi));
    v[3] = _mm512_cvtps_pd(
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(hi), 1)));
}

/* The last n < 32 floats, zero-filled past n (masked: nothing past the
 * end is read). */
TARGET static inline void load_tail_f32(const float *x, size_t n, __m512d v[4])
{
    __m512 lo = _mm512_maskz_loadu_ps(first16(n), x);
    __m512 hi = _mm512_setzero_ps();
    if (n > 16)
        hi = _mm512_maskz_loadu_ps(first16(n - 16), x + 16);
    widen32(lo, hi, v);
}

TARGET static inline void load_tail_f64(const double *x, size_t n,
                                        __m512d v[4])
{
    for (size_t g = 0; g < 4; g++) {
        size_t have = n > 8 * g ? n - 8 * g : 0;
        v[g] = have ? _mm512_maskz_loadu_pd(first8(have), x + 8 * g)
                    : _mm512_setzero_pd();
    }
}

/* Lane mask of group g (8 lanes) when only n of 32 are valid. */
static inline __mmask8 group_mask(size_t n, size_t g)
{
    return n > 8 * g ? first8(n - 8 * g) : (__mmask8)0;
}

TARGET static inline void add4(__m512d a[4], const __m512d v[4])
{
    for (size_t g = 0; g < 4; g++)
        a[g] = _mm512_add_pd(a[g], v[g]);
}

/* a += (v - mean)^2 on the lanes of mask; +0.0 on the others. */
TARGET static inline void add_squares(__m512d a[4], const __m512d v[4],
                                      __m512d mean, size_t n)
{
    for (size_t g = 0; g < 4; g++) {
        __m512d t = _mm512_sub_pd(v[g], mean);
        __m512d sq = _mm512_maskz_mul_pd(group_mask(n, g), t, t);
        a[g] = _mm512_add_pd(a[g], sq);
    }
}

/* End of a block: float lanes 0-15 (f0) and 16-31 (f1) into the four
 * double registers. */
TARGET static inline void flush_block(__m512d a[4], __m512 f0, __m512 f1)
{
    __m512d v[4];
    widen32(f0, f1, v);
    add4(a, v);
}

/* Masks of the valid float lanes 0-15 and 16-31 of a chunk of n < 32. */
static inline void chunk_masks(size_t n, __mmask16 *m0, __mmask16 *m1)
{
    *m0 = first16(n);
    *m1 = n > 16 ? first16(n - 16) : (__mmask16)0;
}

TARGET static double sum_f32_blocked(const float *x, size_t d, float shift)
{
    __m512d a[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(),
                    _mm512_setzero_pd(), _mm512_setzero_pd()};
    __m512 s = _mm512_set1_ps(shift);
    for (size_t i = 0; i < d;) {
        size_t end = d - i > LN_BLOCK ? i + LN_BLOCK : d;
        __m512 f0 = _mm512_setzero_ps(), f1 = _mm512_setzero_ps();
        for (; i + LN_LANES <= end; i += LN_LANES) {
            f0 = _mm512_add_ps(f0, _mm512_sub_ps(_mm512_loadu_ps(x + i), s));
            f1 = _mm512_add_ps(f1,
                               _mm512_sub_ps(_mm512_loadu_ps(x + i + 16), s));
        }
        if (i < end) { /* the partial chunk: +0.0 in the missing lanes */
            __mmask16 m0, m1;
            chunk_masks(end - i, &m0, &m1);
            f0 = _mm512_add_ps(
                f0, _mm512_maskz_sub_ps(m0, _mm512_maskz_loadu_ps(m0, x + i), s));
            if (m1)
                f1 = _mm512_add_ps(
                    f1, _mm512_maskz_sub_ps(
                            m1, _mm512_maskz_loadu_ps(m1, x + i + 16), s));
            i = end;
        }
        flush_block(a, f0, f1);
    }
    return reduce4(a[0], a[1], a[2], a[3]);
}

/* ln_center_f32 on lanes m, +0.0 elsewhere (whose square adds nothing). */
TARGET static inline __m512 center16(__m512 v, __m512 hi, __m512 lo,
                                     __mmask16 m)
{
    return _mm512_maskz_sub_ps(m, _mm512_sub_ps(v, hi), lo);
}

/* f + t * t, rounded once: ln_add_square_f32. */
TARGET static inline __m512 add_square16(__m512 f, __m512 t)
{
    return _mm512_fmadd_ps(t, t, f);
}

TARGET static double sumsq_f32_blocked(const float *x, size_t d, float mu_hi,
                                       float mu_lo)
{
    __m512d a[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(),
                    _mm512_setzero_pd(), _mm512_setzero_pd()};
    __m512 hi = _mm512_set1_ps(mu_hi), lo = _mm512_set1_ps(mu_lo);
    const __mmask16 all = (__mmask16)0xffff;
    for (size_t i = 0; i < d;) {
        size_t end = d - i > LN_BLOCK ? i + LN_BLOCK : d;
        __m512 f0 = _mm512_setzero_ps(), f1 = _mm512_setzero_ps();
        for (; i + LN_LANES <= end; i += LN_LANES) {
            f0 = add_square16(f0, center16(_mm512_loadu_ps(x + i), hi, lo, all));
            f1 = add_square16(
                f1, center16(_mm512_loadu_ps(x + i + 16), hi, lo, all));
        }
        if (i < end) {
            __mmask16 m0, m1;
            chunk_masks(end - i, &m0, &m1);
            f0 = add_square16(
                f0, center16(_mm512_maskz_loadu_ps(m0, x + i), hi, lo, m0));
            if (m1)
                f1 = add_square16(
                    f1,
                    center16(_mm512_maskz_loadu_ps(m1, x + i + 16), hi, lo, m1));
            i = end;
        }
        flush_block(a, f0, f1);
    }
    return reduce4(a[0], a[1], a[2], a[3]);
}

TARGET static double sum_f32(const float *x, size_t d)
{
    __m512d a[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(),
                    _mm512_setzero_pd(), _mm512_setzero_pd()};
    __m512d v[4];
    size_t i = 0;
    for (; i + LN_LANES <= d; i += LN_LANES) {
        widen32(_mm512_loadu_ps(x + i), _mm512_loadu_ps(x + i + 16), v);
        add4(a, v);
    }
    if (i < d) {
        load_tail_f32(x + i, d - i, v);
        add4(a, v);
    }
    return reduce4(a[0], a[1], a[2], a[3]);
}

TARGET static double sum_f64(const double *x, size_t d)
{
    __m512d a[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(),
                    _mm512_setzero_pd(), _mm512_setzero_pd()};
    __m512d v[4];
    size_t i = 0;
    for (; i + LN_LANES <= d; i += LN_LANES) {
        for (size_t g = 0; g < 4; g++)
            v[g] = _mm512_loadu_pd(x + i + 8 * g);
        add4(a, v);
    }
    if (i < d) {
        load_tail_f64(x + i, d - i, v);
        add4(a, v);
    }
    return reduce4(a[0], a[1], a[2], a[3]);
}

TARGET static double sumsq_f32(const float *x, size_t d, double mean)
{
    __m512d a[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(),
                    _mm512_setzero_pd(), _mm512_setzero_pd()};
    __m512d m = _mm512_set1_pd(mean), v[4];
    size_t i = 0;
    for (; i + LN_LANES <= d; i += LN_LANES) {
        widen32(_mm512_loadu_ps(x + i), _mm512_loadu_ps(x + i + 16), v);
        add_squares(a, v, m, LN_LANES);
    }
    if (i < d) {
        load_tail_f32(x + i, d - i, v);
        add_squares(a, v, m, d - i);
    }
    return reduce4(a[0], a[1], a[2], a[3]);
}

TARGET static double sumsq_f64(const double *x, size_t d, double mean)
{
    __m512d a[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(),
                    _mm512_setzero_pd(), _mm512_setzero_pd()};
    __m512d m = _mm512_set1_pd(mean), v[4];
    size_t i = 0;
    for (; i + LN_LANES <= d; i += LN_LANES) {
        for (size_t g = 0; g < 4; g++)
            v[g] = _mm512_loadu_pd(x + i + 8 * g);
        add_squares(a, v, m, LN_LANES);
    }
    if (i < d) {
        load_tail_f64(x + i, d - i, v);
        add_squares(a, v, m, d - i);
    }
    return reduce4(a[0], a[1], a[2], a[3]);
}

/* ln_out_f32 on 16 floats: fma(x - mu_hi, rstd, c), then gain and bias
 * (fused when both are present); w and b are read on lanes m only. */
TARGET static inline __m512 norm16_f32(__m512 v, __m512 hi, __m512 r,
                                       __m512 c, const float *w,
                                       const float *b, __mmask16 m)
{
    v = _mm512_fmadd_ps(_mm512_sub_ps(v, hi), r, c);
    if (w && b)
        return _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(m, w),
                               _mm512_maskz_loadu_ps(m, b));
    if (w)
        return _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w));
    if (b)
        return _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, b));
    return v;
}

/* Elements to store normally before y + i is 64-byte aligned for
 * streaming stores. */
static inline size_t until_aligned(const void *p, size_t size)
{
    return ((64 - (uintptr_t)p % 64) % 64) / size;
}

TARGET static void apply_f32(const float *x, float *y, size_t d, float mu_hi,
                             float mu_lo, float rstd, const float *w,
                             const float *b, const ln_hints *h)
{
    __m512 hi = _mm512_set1_ps(mu_hi), r = _mm512_set1_ps(rstd);
    __m512 c = _mm512_set1_ps(ln_offset_f32(mu_lo, rstd));
    const __mmask16 all = (__mmask16)0xffff;
    int stream = h && h->stream && (uintptr_t)y % sizeof(float) == 0;
    size_t i = 0;
    if (stream) {
        size_t n = until_aligned(y, sizeof(float));
        if (n > d)
            n = d;
        if (n) {
            __mmask16 m = first16(n);
            __m512 v = norm16_f32(_mm512_maskz_loadu_ps(m, x), hi, r, c, w, b,
                                  m);
            _mm512_mask_storeu_ps(y, m, v);
            i = n;
        }
    }
    for (; i + 16 <= d; i += 16) {
        __m512 v = norm16_f32(_mm512_loadu_ps(x + i), hi, r, c,
                              w ? w + i : NULL, b ? b + i : NULL, all);
        if (stream)
            _mm512_stream_ps(y + i, v);
        else
            _mm512_storeu_ps(y + i, v);
    }
    if (i < d) {
        __mmask16 m = first16(d - i);
        __m512 v = norm16_f32(_mm512_maskz_loadu_ps(m, x + i), hi, r, c,
                              w ? w + i : NULL, b ? b + i : NULL, m);
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

TARGET static inline __m512d norm8_f64(__m512d v, __m512d mu, __m512d r,
                                       const double *w, const double *b,
                                       __mmask8 m)
{
    v = _mm512_mul_pd(_mm512_sub_pd(v, mu), r);
    if (w)
        v = _mm512_mul_pd(v, _mm512_maskz_loadu_pd(m, w));
    if (b)
        v = _mm512_add_pd(v, _mm512_maskz_loadu_pd(m, b));
    return v;
}

TARGET static void apply_f64(const double *x, double *y, size_t d,
                             double mean, double rstd, const double *w,
                             const double *b, const ln_hints *h)
{
    __m512d mu = _mm512_set1_pd(mean), r = _mm512_set1_pd(rstd);
    const __mmask8 all = (__mmask8)0xff;
    int stream = h && h->stream && (uintptr_t)y % sizeof(double) == 0;
    size_t i = 0;
    if (stream) {
        size_t n = until_aligned(y, sizeof(double));
        if (n > d)
            n = d;
        if (n) {
            __mmask8 m = first8(n);
            __m512d v = norm8_f64(_mm512_maskz_loadu_pd(m, x), mu, r, w, b, m);
            _mm512_mask_storeu_pd(y, m, v);
            i = n;
        }
    }
    for (; i + 8 <= d; i += 8) {
        __m512d v = norm8_f64(_mm512_loadu_pd(x + i), mu, r,
                              w ? w + i : NULL, b ? b + i : NULL, all);
        if (stream)
            _mm512_stream_pd(y + i, v);
        else
            _mm512_storeu_pd(y + i, v);
    }
    if (i < d) {
        __mmask8 m = first8(d - i);
        __m512d v = norm8_f64(_mm512_maskz_loadu_pd(m, x + i), mu, r,
                              w ? w + i : NULL, b ? b + i : NULL, m);
        _mm512_mask_storeu_pd(y + i, m, v);
    }
}

TARGET static void half_to_float(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(src + i));
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
    }
    for (; i < n; i++)
        dst[i] = ln_half_to_float(src[i]);
}

TARGET static void float_to_half(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i),
                                    _MM_FROUND_TO_NEAREST_INT |
                                        _MM_FROUND_NO_EXC);
        _mm256_storeu_si256((__m256i *)(dst + i), h);
    }
    for (; i < n; i++)
        dst[i] = ln_float_to_half(src[i]);
}

TARGET static void store_fence(void) { _mm_sfence(); }

const ln_kernels ln_kernels_avx512 = {
    "avx512",        sum_f32_blocked, sumsq_f32_blocked, sum_f32,
    sum_f64,         sumsq_f32,       sumsq_f64,         apply_f32,
    apply_f64,       half_to_float,   float_to_half,     store_fence,
};

#endif /* LN_HAVE_X86_KERNELS */
