/*
 * layernorm.h - LayerNorm kernels over the last axis, in plain C.
 *
 * Nothing here knows about Python or NumPy: the glue lives in _coremodule.c.
 *
 * For one record r of d features:
 *     mean = sum(r) / d
 *     var  = sum((r - mean)^2) / d        (population variance, two passes)
 *     y    = (r - mean) / sqrt(var + eps) * weight + bias
 *
 * Reproducibility contract: every sum is accumulated in LN_LANES lanes,
 * element i going to lane i % LN_LANES (float32 records: float lanes
 * flushed into double lanes every LN_BLOCK elements), and the lanes are
 * combined by one fixed pairwise tree. Every instruction-set level (scalar,
 * AVX2, AVX-512) follows this order exactly, and fuses multiply-adds in
 * exactly the places the formulas of ln_elem.h do (fmaf in scalar code,
 * vfmadd in SIMD code: one rounding either way) and nowhere else (built with
 * -ffp-contract=off), so a record's result depends on its d values alone,
 * bit for bit.
 */
#ifndef LAYERNORM_H
#define LAYERNORM_H

#include <stddef.h>
#include <stdint.h>

#define LN_LANES 32

/* The blocked float32 sums add LN_BLOCK elements (LN_BLOCK / LN_LANES per
 * lane) in float lanes, then flush each float lane into its double lane.
 * Short float runs keep the rounding small; float lanes run at twice the
 * width of double lanes. */
#define LN_BLOCK 256

/* GCC and Clang on x86 build the AVX2 and AVX-512 kernels with per-function
 * target attributes; every other platform gets the scalar kernels only. */
#if (defined(__GNUC__) || defined(__clang__)) && \
    (defined(__x86_64__) || defined(__i386__))
#define LN_HAVE_X86_KERNELS 1
#endif

typedef enum { LN_F16 = 0, LN_F32 = 1, LN_F64 = 2 } ln_dtype;

/* Memory hints for the output pass of one record. They change where data
 * sits in the caches, never a result. (Software prefetch of the next
 * record was measured slower than the hardware prefetchers alone.) */
typedef struct {
    int stream; /* write y with non-temporal stores (large outputs) */
} ln_hints;

/* Per-ISA primitives. The record-level logic in ln_row.c is shared. */
typedef struct {
    const char *name;
    /* Blocked float sums (see LN_BLOCK): sum of (x[i] - shift), and sum of
     * ((x[i] - mu_hi) - mu_lo)^2. The fast path for float32 records. */
    double (*sum_f32_blocked)(const float *x, size_t d, float shift);
    double (*sumsq_f32_blocked)(const float *x, size_t d, float mu_hi,
                                float mu_lo);
    /* Sum of x[0..d) into LN_LANES lanes; returns the lanes combined. */
    double (*sum_f32)(const float *x, size_t d);
    double (*sum_f64)(const double *x, size_t d);
    /* Sum of (x[i] - mean)^2, computed in double, same lane order. */
    double (*sumsq_f32)(const float *x, size_t d, double mean);
    double (*sumsq_f64)(const double *x, size_t d, double mean);
    /* y = ((x - mu_hi) - mu_lo) * rstd [* w] [+ b], all in float.
     * mean = mu_hi + mu_lo split keeps float32 exact enough with offsets. */
    void (*apply_f32)(const float *x, float *y, size_t d, float mu_hi,
                      float mu_lo, float rstd, const float *w, const float *b,
                      const ln_hints *hints);
    /* y = (x - mean) * rstd [* w] [+ b], all in double. */
    void (*apply_f64)(const double *x, double *y, size_t d, double mean,
                      double rstd, const double *w, const double *b,
                      const ln_hints *hints);
    /* IEEE binary16 <-> binary32, round to nearest even. */
    void (*half_to_float)(const uint16_t *src, float *dst, size_t n);
    void (*float_to_half)(const float *src, uint16_t *dst, size_t n);
    /* Order streamed (non-temporal) stores before the results are used. */
    void (*store_fence)(void);
} ln_kernels;

/* Instruction-set levels, from most portable to widest. */
typedef enum { LN_ISA_SCALAR = 0, LN_ISA_AVX2 = 1, LN_ISA_AVX512 = 2 } ln_isa;

extern const ln_kernels ln_kernels_scalar;
#if defined(LN_HAVE_X86_KERNELS)
extern const ln_kernels ln_kernels_avx2;
extern const ln_kernels ln_kernels_avx512;
#endif

/* Runtime dispatch (ln_dispatch.c). */
int ln_isa_supported(ln_isa isa);         /* 1 if this CPU and build can run it */
ln_isa ln_isa_best(void);                 /* widest supported level */
const ln_kernels *ln_kernels_for(ln_isa isa);
const char *ln_isa_name(ln_isa isa);
int ln_isa_from_name(const char *name, ln_isa *isa); /* 0 on success */

/* Combine LN_LANES partial sums by the fixed pairwise tree. */
double ln_tree_sum(double lanes[LN_LANES]);

/* Scalar half conversions, also used by the SIMD paths for tails. */
float ln_half_to_float(uint16_t h);
uint16_t ln_float_to_half(float f);

/* Statistics of one record. */
typedef struct {
    double mean;
    double var;
} ln_stats;

/* One contiguous record. w and b may be NULL (gain 1, bias 0).
 * x and y may be the same buffer. Returns 0, or -1 if eps is invalid
 * (negative, NaN or infinite), in which case y is NaN; the statistics do
 * not depend on eps and are always written. */
int ln_row_f32(const ln_kernels *k, const float *x, float *y, size_t d,
               const float *w, const float *b, double eps,
               const ln_hints *hints, ln_stats *st);
int ln_row_f64(const ln_kernels *k, const double *x, double *y, size_t d,
               const double *w, const double *b, double eps,
               const ln_hints *hints, ln_stats *st);

/* The two steps of ln_row_*, for callers that interleave records:
 * statistics (never fails), then the output (0, or -1 for an invalid eps). */
void ln_stats_f32(const ln_kernels *k, const float *x, size_t d,
                  ln_stats *st);
void ln_stats_f64(const ln_kernels *k, const double *x, size_t d,
                  ln_stats *st);
int ln_apply_f32(const ln_kernels *k, const float *x, float *y, size_t d,
                 const float *w, const float *b, double eps,
                 const ln_stats *st, const ln_hints *hints);
int ln_apply_f64(const ln_kernels *k, const double *x, double *y, size_t d,
                 const double *w, const double *b, double eps,
                 const ln_stats *st, const ln_hints *hints);

/*
 * A batch of records with arbitrary byte strides (rows and columns may be
 * negative, zero for broadcast parameters). Statistics are written as
 * float for LN_F16/LN_F32 and as double for LN_F64.
 */
typedef struct {
    ln_dtype dtype;
    size_t n_rows, d;
    const char *x;   ptrdiff_t x_row, x_col;
    const char *w;   ptrdiff_t w_row, w_col;  /* w may be NULL */
    const char *b;   ptrdiff_t b_row, b_col;  /* b may be NULL */
    const char *eps; ptrdiff_t eps_row;       /* one double per record */
    char *y;         ptrdiff_t y_row, y_col;
    char *mean;      ptrdiff_t mean_row;      /* may be NULL */
    char *var;       ptrdiff_t var_row;       /* may be NULL */
} ln_batch;

/* Result codes of ln_batch_run. */
#define LN_OK 0
#define LN_ENOMEM 1      /* scratch allocation failed; nothing reliable written */
#define LN_EBADEPS 2     /* some record had an invalid eps; it is NaN */

/* Run a batch with up to n_threads threads (records split, never a record).
 * Small batches always run on the calling thread. */
int ln_batch_run(const ln_kernels *k, const ln_batch *job, int n_threads);

/* Write NaN to every output of a batch (y, mean, var): what a caller that
 * cannot raise reports when ln_batch_run returned LN_ENOMEM. */
void ln_batch_fill_nan(const ln_batch *job);

/* Bytes of work below which ln_batch_run never starts threads. */
size_t ln_thread_threshold(void);

#endif /* LAYERNORM_H */
