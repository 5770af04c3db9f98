/*
 * ln_avx2.c - AVX2 + F16C kernels.
 *
 * The LN_LANES = 32 double lanes live in eight ymm registers of four lanes
 * each. Whole blocks of 32 elements run in SIMD; the last partial block is
 * added lane by lane in scalar code on the stored lanes, which is the same
 * operation on the same lane as in the scalar kernel.
 */
#include "layernorm.h"
#include "ln_elem.h"

#if defined(LN_HAVE_X86_KERNELS)
#include <immintrin.h>

#define TARGET __attribute__((target("avx2,fma,f16c")))

#define NREG (LN_LANES / 4)

TARGET static inline void zero_lanes(__m256d a[NREG])
{
    for (size_t g = 0; g < NREG; g++)
        a[g] = _mm256_setzero_pd();
}

/* ln_tree_sum over the lanes in registers: ymm g holds lanes 4g..4g+3, so
 * j += j + 16 is a[g] += a[g + 4], j += j + 8 is a[g] += a[g + 2], and so
 * on down to the two lanes of one 128-bit half. */
TARGET static inline double reduce_lanes(__m256d a[NREG])
{
    for (size_t h = NREG / 2; h >= 1; h /= 2)
        for (size_t g = 0; g < h; g++)
            a[g] = _mm256_add_pd(a[g], a[g + h]);
    __m128d p = _mm_add_pd(_mm256_castpd256_pd128(a[0]),
                           _mm256_extractf128_pd(a[0], 1));
    return _mm_cvtsd_f64(_mm_add_sd(p, _mm_unpackhi_pd(p, p)));
}

/* The partial last block: element j goes to lane j, as in the scalar
 * kernel. The lanes are spilled, updated and reloaded. */
TARGET static inline void add_tail(__m256d a[NREG], const double *tail,
                                   size_t n)
{
    double lanes[LN_LANES];
    for (size_t g = 0; g < NREG; g++)
        _mm256_storeu_pd(lanes + 4 * g, a[g]);
    for (size_t j = 0; j < n; j++)
        lanes[j] += tail[j];
    for (size_t g = 0; g < NREG; g++)
        a[g] = _mm256_loadu_pd(lanes + 4 * g);
}

/* One block of 32 floats widened to eight vectors of four doubles. */
TARGET static inline void load32_f32(const float *x, __m256d v[NREG])
{
    for (size_t g = 0; g < NREG; g += 2) {
        __m256 f = _mm256_loadu_ps(x + 4 * g);
        v[g] = _mm256_cvtps_pd(_mm256_castps256_ps128(f));
        v[g + 1] = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
    }
}

/* Float lanes of a block live in four ymm registers (lanes 8g..8g+7). */
#define NFREG (LN_LANES / 8)

/* End of a block: each float register widens into two double registers. */
TARGET static inline void flush_block(__m256d a[NREG], const __m256 f[NFREG])
{
    for (size_t g = 0; g < NFREG; g++) {
        a[2 * g] = _mm256_add_pd(a[2 * g],
                                 _mm256_cvtps_pd(_mm256_castps256_ps128(f[g])));
        a[2 * g + 1] = _mm256_add_pd(
            a[2 * g + 1], _mm256_cvtps_pd(_mm256_extractf128_ps(f[g], 1)));
    }
}

/* The partial last chunk of a block, element j into float lane j, as in
 * the scalar kernel. */
TARGET static inline void add_tail_f32(__m256 f[NFREG], const float *tail,
                                       size_t n)
{
    float lanes[LN_LANES];
    for (size_t g = 0; g < NFREG; g++)
        _mm256_storeu_ps(lanes + 8 * g, f[g]);
    for (size_t j = 0; j < n; j++)
        lanes[j] += tail[j];
    for (size_t g = 0; g < NFREG; g++)
        f[g] = _mm256_loadu_ps(lanes + 8 * g);
}

TARGET static double sum_f32_blocked(const float *x, size_t d, float shift)
{
    __m256d a[NREG];
    __m256 f[NFREG], s = _mm256_set1_ps(shift);
    float tail[LN_LANES];
    zero_lanes(a);
    for (size_t i = 0; i < d;) {
        size_t end = d - i > LN_BLOCK ? i + LN_BLOCK : d;
        for (size_t g = 0; g < NFREG; g++)
            f[g] = _mm256_setzero_ps();
        for (; i + LN_LANES <= end; i += LN_LANES)
            for (size_t g = 0; g < NFREG; g++)
                f[g] = _mm256_add_ps(
                    f[g], _mm256_sub_ps(_mm256_loadu_ps(x + i + 8 * g), s));
        if (i < end) {
            for (size_t j = 0; i + j < end; j++)
                tail[j] = x[i + j] - shift;
            add_tail_f32(f, tail, end - i);
            i = end;
        }
        flush_block(a, f);
    }
    return reduce_lanes(a);
}

/* The partial last chunk of a block for the sum of squares: element j
 * updates float lane j with ln_add_square_f32, as in the scalar kernel. */
TARGET static inline void add_square_tail_f32(__m256 f[NFREG], const float *x,
                                              size_t n, float mu_hi,
                                              float mu_lo)
{
    float lanes[LN_LANES];
    for (size_t g = 0; g < NFREG; g++)
        _mm256_storeu_ps(lanes + 8 * g, f[g]);
    for (size_t j = 0; j < n; j++)
        lanes[j] = ln_add_square_f32(lanes[j], ln_center_f32(x[j], mu_hi, mu_lo));
    for (size_t g = 0; g < NFREG; g++)
        f[g] = _mm256_loadu_ps(lanes + 8 * g);
}

TARGET static double sumsq_f32_blocked(const float *x, size_t d, float mu_hi,
                                       float mu_lo)
{
    __m256d a[NREG];
    __m256 f[NFREG];
    __m256 hi = _mm256_set1_ps(mu_hi), lo = _mm256_set1_ps(mu_lo);
    zero_lanes(a);
    for (size_t i = 0; i < d;) {
        size_t end = d - i > LN_BLOCK ? i + LN_BLOCK : d;
        for (size_t g = 0; g < NFREG; g++)
            f[g] = _mm256_setzero_ps();
        for (; i + LN_LANES <= end; i += LN_LANES)
            for (size_t g = 0; g < NFREG; g++) {
                __m256 t = _mm256_sub_ps(
                    _mm256_sub_ps(_mm256_loadu_ps(x + i + 8 * g), hi), lo);
                f[g] = _mm256_fmadd_ps(t, t, f[g]);
            }
        if (i < end) {
            add_square_tail_f32(f, x + i, end - i, mu_hi, mu_lo);
            i = end;
        }
        flush_block(a, f);
    }
    return reduce_lanes(a);
}

TARGET static double sum_f32(const float *x, size_t d)
{
    __m256d a[NREG], v[NREG];
    double tail[LN_LANES];
    size_t i = 0;
    zero_lanes(a);
    for (; i + LN_LANES <= d; i += LN_LANES) {
        load32_f32(x + i, v);
        for (size_t g = 0; g < NREG; g++)
            a[g] = _mm256_add_pd(a[g], v[g]);
    }
    for (size_t j = 0; i + j < d; j++)
        tail[j] = (double)x[i + j];
    add_tail(a, tail, d - i);
    return reduce_lanes(a);
}

TARGET static double sum_f64(const double *x, size_t d)
{
    __m256d a[NREG];
    size_t i = 0;
    zero_lanes(a);
    for (; i + LN_LANES <= d; i += LN_LANES)
        for (size_t g = 0; g < NREG; g++)
            a[g] = _mm256_add_pd(a[g], _mm256_loadu_pd(x + i + 4 * g));
    add_tail(a, x + i, d - i);
    return reduce_lanes(a);
}

TARGET static double sumsq_f32(const float *x, size_t d, double mean)
{
    __m256d a[NREG], v[NREG];
    __m256d m = _mm256_set1_pd(mean);
    double tail[LN_LANES];
    size_t i = 0;
    zero_lanes(a);
    for (; i + LN_LANES <= d; i += LN_LANES) {
        load32_f32(x + i, v);
        for (size_t g = 0; g < NREG; g++) {
            __m256d t = _mm256_sub_pd(v[g], m);
            a[g] = _mm256_add_pd(a[g], _mm256_mul_pd(t, t));
        }
    }
    for (size_t j = 0; i + j < d; j++) {
        double t = (double)x[i + j] - mean;
        tail[j] = t * t;
    }
    add_tail(a, tail, d - i);
    return reduce_lanes(a);
}

TARGET static double sumsq_f64(const double *x, size_t d, double mean)
{
    __m256d a[NREG];
    __m256d m = _mm256_set1_pd(mean);
    double tail[LN_LANES];
    size_t i = 0;
    zero_lanes(a);
    for (; i + LN_LANES <= d; i += LN_LANES)
        for (size_t g = 0; g < NREG; g++) {
            __m256d t = _mm256_sub_pd(_mm256_loadu_pd(x + i + 4 * g), m);
            a[g] = _mm256_add_pd(a[g], _mm256_mul_pd(t, t));
        }
    for (size_t j = 0; i + j < d; j++) {
        double t = x[i + j] - mean;
        tail[j] = t * t;
    }
    add_tail(a, tail, d - i);
    return reduce_lanes(a);
}

/* Elements stored normally before y + i is 32-byte aligned for streaming
 * stores (none if streaming is off). */
static inline size_t stream_start(const void *y, size_t size, size_t d)
{
    size_t n = ((32 - (uintptr_t)y % 32) % 32) / size;
    return n < d ? n : d;
}

static inline double norm1_f64(double x, double mean, double rstd,
                               const double *w, const double *b)
{
    double v = (x - mean) * rstd;
    if (w)
        v = v * *w;
    if (b)
        v = v + *b;
    return v;
}

TARGET static void apply_f32(const float *x, float *y, size_t d, float mu_hi,
                             float mu_lo, float rstd, const float *w,
                             const float *b, const ln_hints *h)
{
    float c = ln_offset_f32(mu_lo, rstd);
    __m256 hi = _mm256_set1_ps(mu_hi), r = _mm256_set1_ps(rstd);
    __m256 cv = _mm256_set1_ps(c);
    int stream = h && h->stream && (uintptr_t)y % sizeof(float) == 0;
    size_t i = 0, head = stream ? stream_start(y, sizeof(float), d) : 0;
    for (; i < head; i++)
        y[i] = ln_out_f32(x[i], mu_hi, rstd, c, w ? w + i : NULL,
                          b ? b + i : NULL);
    for (; i + 8 <= d; i += 8) {
        __m256 v = _mm256_fmadd_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), hi),
                                   r, cv);
        if (w && b)
            v = _mm256_fmadd_ps(v, _mm256_loadu_ps(w + i),
                                _mm256_loadu_ps(b + i));
        else if (w)
            v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
        else if (b)
            v = _mm256_add_ps(v, _mm256_loadu_ps(b + i));
        if (stream)
            _mm256_stream_ps(y + i, v);
        else
            _mm256_storeu_ps(y + i, v);
    }
    for (; i < d; i++)
        y[i] = ln_out_f32(x[i], mu_hi, rstd, c, w ? w + i : NULL,
                          b ? b + i : NULL);
}

TARGET static void apply_f64(const double *x, double *y, size_t d,
                             double mean, double rstd, const double *w,
                             const double *b, const ln_hints *h)
{
    __m256d mu = _mm256_set1_pd(mean), r = _mm256_set1_pd(rstd);
    int stream = h && h->stream && (uintptr_t)y % sizeof(double) == 0;
    size_t i = 0, head = stream ? stream_start(y, sizeof(double), d) : 0;
    for (; i < head; i++)
        y[i] = norm1_f64(x[i], mean, rstd, w ? w + i : NULL, b ? b + i : NULL);
    for (; i + 4 <= d; i += 4) {
        __m256d v = _mm256_mul_pd(_mm256_sub_pd(_mm256_loadu_pd(x + i), mu), r);
        if (w)
            v = _mm256_mul_pd(v, _mm256_loadu_pd(w + i));
        if (b)
            v = _mm256_add_pd(v, _mm256_loadu_pd(b + i));
        if (stream)
            _mm256_stream_pd(y + i, v);
        else
            _mm256_storeu_pd(y + i, v);
    }
    for (; i < d; i++)
        y[i] = norm1_f64(x[i], mean, rstd, w ? w + i : NULL, b ? b + i : NULL);
}

TARGET static void half_to_float(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++)
        dst[i] = ln_half_to_float(src[i]);
}

TARGET static void float_to_half(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                    _MM_FROUND_TO_NEAREST_INT |
                                        _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    for (; i < n; i++)
        dst[i] = ln_float_to_half(src[i]);
}

TARGET static void store_fence(void) { _mm_sfence(); }

const ln_kernels ln_kernels_avx2 = {
    "avx2",          sum_f32_blocked, sumsq_f32_blocked, sum_f32,
    sum_f64,         sumsq_f32,       sumsq_f64,         apply_f32,
    apply_f64,       half_to_float,   float_to_half,     store_fence,
};

#endif /* LN_HAVE_X86_KERNELS */
