/*
 * fuzz_kernels.c - libFuzzer target for the LayerNorm kernels in csrc/ln_*.c
 * (no Python: _coremodule.c is not linked).
 *
 * Every input is decoded into one of two jobs, run on every instruction-set
 * level this CPU supports and compared with the scalar level:
 *
 *   row    a level's record kernel, k->op[op][dtype] (LayerNorm or RMSNorm),
 *          called directly through an ln_rows: 1 to 16 records of d = 1..1100
 *          (d <= 40 half the time: the short-record path of ln_lane.h) in
 *          float16, bfloat16, float32 or float64, contiguous rows at row
 *          strides of d or more items (negative too), in place (x == y) or
 *          not, weight and bias present or absent (in the compute type),
 *          streaming stores and the prefetch of the rows ahead on or off, and a
 *          real spare row (ln_spare_new);
 *   batch  ln_batch_run with arbitrary byte strides (negative, zero and
 *          overlapping rows for the inputs, column-major and odd strides
 *          that misalign every element, buffers at any byte offset), mixed
 *          storage dtypes (x narrower than the job dtype, weight and bias
 *          of any dtype no wider), per-record eps at any stride, optional
 *          mean/var (float32 or float64), in place or not, 1-4 threads; a
 *          rare big batch (two magic bytes) is large enough to start them.
 *          The op: LayerNorm, or RMSNorm, or either backward (dy laid out
 *          like x; LayerNorm's with the means given or recomputed; the
 *          exact dweight/dbias sums compared state word for word).
 *
 * Value bytes come from the fuzzer: raw bit patterns (NaNs with payloads,
 * infinities, subnormals), special values, or small integers times a unit
 * (2^-1100 to 2^1016) around an offset (0, 1e2 ... 1e6, 1e30, 1e200,
 * 1e-30, ...), which reaches the float-to-double and the scaled float64
 * fallbacks. Once the input is used up, further bytes come from a
 * generator seeded by the input, so short inputs still give full records.
 *
 * Checks:
 *   - AddressSanitizer: every operand is its own allocation of exactly the
 *     bytes its strides address (the bytes before a 64-byte phase offset
 *     are poisoned too), so one byte read or written outside is a report;
 *     UndefinedBehaviorSanitizer;
 *   - every level's outputs (y, mean, var) and return code equal the
 *     scalar level's (single-threaded) bit for bit. Records with a NaN are
 *     written as the canonical NaN on every level, so NaNs are compared
 *     strictly too; and in a record whose inputs are all finite, any NaN
 *     must be the canonical one (a NaN made by arithmetic has the sign the
 *     compiler and the architecture give it, even where all levels agree);
 *   - inputs (x, weight, bias, eps) are unchanged, and nothing is written
 *     outside the output items (gaps are pre-filled and compared).
 *
 * Build and run: fuzz/build.sh, then e.g.
 *     fuzz/build/fuzz_kernels -max_total_time=300 fuzz/build/corpus
 * or tools/fuzz_kernels.sh 300 (seeds included).
 */
#define _POSIX_C_SOURCE 200809L /* posix_memalign */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__has_include)
#if __has_include(<sanitizer/asan_interface.h>)
#include <sanitizer/asan_interface.h>
#endif
#endif
#ifndef ASAN_POISON_MEMORY_REGION
#define ASAN_POISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#define ASAN_UNPOISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#endif

#include "layernorm.h"
#include "ln_half.h"

/* The harness's own data loops (filling, copying, comparing) carry no
 * coverage counters: their edges say nothing about the kernels, and they
 * run once per item. */
#if defined(__clang__)
#define NO_COVERAGE __attribute__((no_sanitize("coverage")))
#else
#define NO_COVERAGE
#endif

/* ---- input reader ------------------------------------------------------ */

/* The fuzzer's bytes, then a generator seeded from them. */
typedef struct {
    const uint8_t *p;
    size_t n;
    uint64_t state;
} reader;

static reader reader_new(const uint8_t *data, size_t size)
{
    uint64_t h = 1469598103934665603ull ^ size; /* FNV-1a */
    for (size_t i = 0; i < size; i++)
        h = (h ^ data[i]) * 1099511628211ull;
    reader r = {data, size, h};
    return r;
}

static unsigned take8(reader *r)
{
    if (r->n > 0) {
        r->n--;
        return *r->p++;
    }
    /* splitmix64 */
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (unsigned)((z ^ (z >> 31)) & 0xff);
}

static unsigned take16(reader *r)
{
    unsigned lo = take8(r);
    return lo | (take8(r) << 8);
}

static uint64_t take64(reader *r)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)take8(r) << (8 * i);
    return v;
}

/* ---- dtypes ------------------------------------------------------------ */

/* the test programs' dtype names, put_value and get_value */
#define LN_VALUES_ATTR NO_COVERAGE
#include "../tools/ln_values.h"

static const char *const op_names[LN_NOPS] = {
    [LN_OP_LAYER_NORM] = "layer_norm", [LN_OP_LAYER_NORM_BACKWARD] = "layer_norm_backward",
    [LN_OP_RMS_NORM] = "rms_norm", [LN_OP_RMS_NORM_BACKWARD] = "rms_norm_backward"};

/* ---- values ------------------------------------------------------------ */

enum { V_RAW = 0, V_SPECIAL = 1, V_AFFINE = 2, V_AFFINE2 = 3, V_NMODES = 4 };

static const double specials[] = {
    0.0, -0.0, 1.0, -1.0, INFINITY, -INFINITY, NAN, -NAN, 5e-324, -5e-324,
    2.2250738585072014e-308, 1.7976931348623157e308, 3.4028234663852886e38,
    1.401298464324817e-45, 1.1754943508222875e-38, 65504.0, 6.103515625e-05,
    5.960464477539063e-08, 3.3895313892515355e38, 1e30, 1e-30, 1e154, 1e-160,
};
#define N_SPECIALS (sizeof specials / sizeof specials[0])

static const double offsets[] = {0.0, 0.0, 0.0, 100.0, 1e4, 1e6, -1e4, 3e7, 1e30,
                                 -1e30, 1e-30, 1e200, -1e200, 1e-300, 65000.0, 1e38};
#define N_OFFSETS (sizeof offsets / sizeof offsets[0])

/* How the values of one operand are made. */
typedef struct {
    int mode;
    double base, unit;
} valgen;

static valgen pick_valgen(reader *r)
{
    valgen g;
    unsigned m = take8(r);
    g.mode = (int)(m % V_NMODES);
    g.base = offsets[take8(r) % N_OFFSETS];
    /* unit 2^e: small steps around 0 most of the time, the whole double
     * range in steps of 8 otherwise */
    int e = (int)(int8_t)take8(r);
    g.unit = ldexp(1.0, (m & 0x80) ? e * 8 : e / 4 - 3);
    return g;
}

NO_COVERAGE static void make_value(reader *r, const valgen *g, ln_dtype t, void *dst)
{
    double v;
    switch (g->mode) {
    case V_RAW: {
        uint64_t bits = take64(r);
        memcpy(dst, &bits, ln_dtype_size(t)); /* little-endian: the low bytes */
        return;
    }
    case V_SPECIAL: {
        unsigned s = take8(r);
        v = s < 2 * N_SPECIALS ? specials[s % N_SPECIALS] : (double)(int8_t)s;
        break;
    }
    case V_AFFINE:
        v = g->base + (double)(int8_t)take8(r) * g->unit;
        break;
    default: /* mostly affine, a special now and then */
    {
        unsigned s = take8(r);
        v = s >= 248 ? specials[take8(r) % N_SPECIALS]
                     : g->base + (double)(int8_t)take8(r) * g->unit;
        break;
    }
    }
    put_value(v, t, dst);
}

/* n_items values of t, packed at buf. */
NO_COVERAGE static void fill(reader *r, const valgen *g, ln_dtype t, void *buf, size_t n_items)
{
    size_t isz = ln_dtype_size(t);
    for (size_t i = 0; i < n_items; i++)
        make_value(r, g, t, (char *)buf + i * isz);
}

static double pick_eps(reader *r)
{
    static const double table[] = {1e-5, 0.0, 1e-12, 5e-324, 1.0, 1e300,
                                   1.7976931348623157e308, -1.0, NAN, INFINITY,
                                   -0.0, 1e-3, 1e-30, 1e30, 1e-300, -5e-324};
    unsigned s = take8(r);
    if (s < 240)
        return table[s % (sizeof table / sizeof table[0])];
    double e;
    uint64_t bits = take64(r);
    memcpy(&e, &bits, 8);
    return e;
}

/* d: short records (d <= 40, the short-record path and its edge at
 * LN_LANES) half the time, else up to 300 (one block edge) or 1100. */
static size_t pick_d(reader *r, size_t lo)
{
    unsigned c = take8(r);
    size_t v = take16(r);
    size_t d = c < 128 ? v % 41 : (c < 192 ? v % 301 : v % 1101);
    return d < lo ? lo : d;
}

/* ---- exact-size buffers ------------------------------------------------ */

/* `bytes` bytes starting `off` bytes past a 64-byte boundary, in an
 * allocation that ends exactly at start + bytes and whose first `off`
 * bytes are poisoned: ASan flags any access outside [start, start + bytes). */
typedef struct {
    void *block;
    char *p;
    size_t off, bytes;
} buffer;

static buffer buf_new(size_t bytes, size_t off)
{
    buffer b;
    b.off = off % 64;
    b.bytes = bytes;
    if (posix_memalign(&b.block, 64, b.off + bytes ? b.off + bytes : 1) != 0)
        abort();
    b.p = (char *)b.block + b.off;
    ASAN_POISON_MEMORY_REGION(b.block, b.off);
    return b;
}

static void buf_free(buffer *b)
{
    if (b->block == NULL)
        return;
    ASAN_UNPOISON_MEMORY_REGION(b->block, b->off);
    free(b->block);
    b->block = NULL;
    b->p = NULL;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL)
        abort();
    return p;
}

/* ---- strided operands -------------------------------------------------- */

/* A strided operand in its own exact-size buffer. */
typedef struct {
    buffer buf;
    char *origin; /* item (0, 0) */
    size_t rows, cols;
    ptrdiff_t row, col;
    ln_dtype dtype;
} operand;

/* Byte extent [lo, hi) of rows x cols items of `size` bytes. */
static void extent(size_t rows, size_t cols, ptrdiff_t row, ptrdiff_t col, size_t size,
                   ptrdiff_t *lo, ptrdiff_t *hi)
{
    *lo = 0;
    *hi = 0;
    if (rows == 0 || cols == 0)
        return;
    ptrdiff_t r_end = (ptrdiff_t)(rows - 1) * row;
    ptrdiff_t c_end = (ptrdiff_t)(cols - 1) * col;
    *lo = (r_end < 0 ? r_end : 0) + (c_end < 0 ? c_end : 0);
    *hi = (r_end > 0 ? r_end : 0) + (c_end > 0 ? c_end : 0) + (ptrdiff_t)size;
}

static operand operand_new(size_t rows, size_t cols, ptrdiff_t row, ptrdiff_t col,
                           ln_dtype t, size_t off)
{
    ptrdiff_t lo, hi;
    operand o;
    extent(rows, cols, row, col, ln_dtype_size(t), &lo, &hi);
    o.buf = buf_new((size_t)(hi - lo), off);
    o.origin = o.buf.p - lo;
    o.rows = rows;
    o.cols = cols;
    o.row = row;
    o.col = col;
    o.dtype = t;
    return o;
}

/* A fresh buffer of the same layout holding the same bytes. */
NO_COVERAGE static operand operand_clone(const operand *src)
{
    operand o = *src;
    o.buf = buf_new(src->buf.bytes, src->buf.off);
    memcpy(o.buf.p, src->buf.p, src->buf.bytes);
    o.origin = o.buf.p + (src->origin - src->buf.p);
    return o;
}

NO_COVERAGE static inline char *item(const operand *o, size_t r, size_t c)
{
    return o->origin + (ptrdiff_t)r * o->row + (ptrdiff_t)c * o->col;
}

static ln_operand as_ln(const operand *o, int present)
{
    ln_operand op = {.ptr = present ? o->origin : NULL, .row = o->row, .col = o->col,
                     .dtype = o->dtype};
    return op;
}

/* The items of o, packed (rows x cols x item size bytes). */
NO_COVERAGE static char *gather(const operand *o)
{
    size_t isz = ln_dtype_size(o->dtype);
    char *out = xmalloc(o->rows * o->cols * isz);
    for (size_t r = 0; r < o->rows; r++)
        for (size_t c = 0; c < o->cols; c++)
            memcpy(out + (r * o->cols + c) * isz, item(o, r, c), isz);
    return out;
}

/* ---- reporting --------------------------------------------------------- */

static char g_case[1024]; /* the job being checked, in words */

static unsigned long long bits_of(const void *p, size_t size)
{
    uint64_t u = 0;
    memcpy(&u, p, size);
    return (unsigned long long)u;
}

static void print_record(const char *name, const operand *o, size_t r)
{
    if (o == NULL || o->buf.block == NULL || o->rows == 0)
        return;
    size_t rr = o->row == 0 ? 0 : r;
    fprintf(stderr, "fuzz_kernels:   %s (%s) of record %zu:", name, dtype_names[o->dtype], r);
    for (size_t c = 0; c < o->cols && c < 48; c++)
        fprintf(stderr, "%s%.17g", c ? ", " : " ", get_value(item(o, rr, c), o->dtype));
    fprintf(stderr, "%s\n", o->cols > 48 ? ", ..." : "");
}

typedef struct {
    const operand *x, *w, *b;
    const double *eps; /* per record, or NULL */
    const operand *dy, *mean; /* the backward's, or NULL */
} inputs;

static inputs g_in;

/* Every input of record r that the failing job read. */
static void print_inputs(size_t r)
{
    print_record("x", g_in.x, r);
    print_record("weight", g_in.w, r);
    print_record("bias", g_in.b, r);
    print_record("dy", g_in.dy, r);
    print_record("mean (given)", g_in.mean, r);
    if (g_in.eps)
        fprintf(stderr, "fuzz_kernels:   eps of record %zu: %.17g\n", r, g_in.eps[r]);
}

static void fail_at(const char *what, const char *level, size_t r, size_t c,
                    const void *want, const void *got, ln_dtype t)
{
    int w = (int)(2 * ln_dtype_size(t));
    fprintf(stderr,
            "fuzz_kernels: %s differs between scalar and %s at record %zu, item %zu: "
            "scalar bits 0x%0*llx (%.17g), %s bits 0x%0*llx (%.17g)\n"
            "fuzz_kernels:   case: %s\n",
            what, level, r, c, w, bits_of(want, ln_dtype_size(t)), get_value(want, t), level,
            w, bits_of(got, ln_dtype_size(t)), get_value(got, t), g_case);
    print_inputs(r);
    abort();
}

static void fail(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "fuzz_kernels: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\nfuzz_kernels:   case: %s\n", g_case);
    abort();
}

/* The items of o equal `want` (packed, as gather makes them) bit for bit. */
NO_COVERAGE static void same_items(const char *what, const char *level, const operand *o,
                       const char *want)
{
    size_t isz = ln_dtype_size(o->dtype);
    char *got = gather(o);
    int same = memcmp(got, want, o->rows * o->cols * isz) == 0;
    free(got);
    if (same)
        return;
    for (size_t r = 0; r < o->rows; r++)
        for (size_t c = 0; c < o->cols; c++) {
            const char *w = want + (r * o->cols + c) * isz;
            if (memcmp(item(o, r, c), w, isz) != 0)
                fail_at(what, level, r, c, w, item(o, r, c), o->dtype);
        }
}

/* Outside its items, o's buffer holds what `before` (a buffer of the same
 * layout) held: nothing was written anywhere else. */
NO_COVERAGE static void untouched_outside(const char *what, const char *level, const operand *o,
                              const operand *before)
{
    size_t isz = ln_dtype_size(o->dtype);
    if (o->buf.bytes == o->rows * o->cols * isz)
        return; /* packed: there is no outside */
    char *now = xmalloc(o->buf.bytes);
    memcpy(now, o->buf.p, o->buf.bytes);
    for (size_t r = 0; r < o->rows; r++)
        for (size_t c = 0; c < o->cols; c++) {
            ptrdiff_t at = item(o, r, c) - o->buf.p;
            memcpy(now + at, before->buf.p + at, isz);
        }
    if (memcmp(now, before->buf.p, o->buf.bytes) != 0)
        fail("%s: %s wrote outside the output items", what, level);
    free(now);
}

NO_COVERAGE static void unchanged(const char *what, const char *level, const buffer *now,
                      const buffer *before)
{
    if (now->bytes && memcmp(now->p, before->p, now->bytes) != 0)
        fail("%s was modified by %s", what, level);
}

/* ---- NaNs made by arithmetic ------------------------------------------ */

/* The canonical quiet NaN of each dtype: what a NaN record is written as. */
static uint64_t canonical_nan(ln_dtype t)
{
    switch (t) {
    case LN_F16: return 0x7e00u;
    case LN_BF16: return 0x7fc0u;
    case LN_F32: return 0x7fc00000u;
    default: return 0x7ff8000000000000ull;
    }
}

/* Are the d items of row r of o (row 0 if it is shared) all finite? An
 * absent operand is. */
NO_COVERAGE static int row_finite(const operand *o, size_t r)
{
    if (o == NULL || o->rows == 0)
        return 1;
    size_t rr = o->row == 0 || o->rows == 1 ? 0 : r;
    for (size_t c = 0; c < o->cols; c++)
        if (!isfinite(get_value(item(o, rr, c), o->dtype)))
            return 0;
    return 1;
}

/* A record whose inputs are all finite (x, dy, weight, bias, eps) can still
 * come out NaN (0/0 records, overflowing intermediates), but only as the
 * canonical NaN: the sign and payload of a NaN made by arithmetic depend on
 * the compiler and the architecture (x86's default NaN is negative,
 * aarch64's positive), so such a NaN breaks the contract even where every
 * level of this build happens to agree. Checked on the reference run. */
NO_COVERAGE static void canonical_nans_only(const char *level, const operand *out,
                                            const operand *const *ins, int n_ins,
                                            const double *eps)
{
    size_t isz = ln_dtype_size(out->dtype);
    uint64_t canon = canonical_nan(out->dtype);
    for (size_t r = 0; r < out->rows; r++) {
        int finite = eps == NULL || isfinite(eps[r]);
        for (int i = 0; finite && i < n_ins; i++)
            finite = row_finite(ins[i], r);
        if (!finite)
            continue;
        for (size_t c = 0; c < out->cols; c++) {
            const char *p = item(out, r, c);
            if (!isnan(get_value(p, out->dtype)) || bits_of(p, isz) == canon)
                continue;
            fprintf(stderr,
                    "fuzz_kernels: a NaN that is not the canonical one, 0x%0*llx instead of "
                    "0x%0*llx, at record %zu, item %zu of a record whose inputs are all "
                    "finite (%s): its sign is up to the compiler and the architecture\n"
                    "fuzz_kernels:   case: %s\n",
                    (int)(2 * isz), bits_of(p, isz), (int)(2 * isz), (unsigned long long)canon,
                    r, c, level, g_case);
            print_inputs(r);
            abort();
        }
    }
}

/* ---- levels ------------------------------------------------------------ */

static int level_list(const ln_kernels **ks, const char **names)
{
    int n = 0;
    for (int i = 0; i < (int)LN_NISAS; i++) {
        if (!ln_isa_supported((ln_isa)i))
            continue;
        ks[n] = ln_kernels_for((ln_isa)i);
        names[n] = ln_isa_name((ln_isa)i);
        n++;
    }
    return n;
}

/* ---- job 1: record kernels directly ------------------------------------ */

static void fuzz_row(reader *r)
{
    unsigned flags = take8(r);
    ln_dtype t = (ln_dtype)(flags & 3);
    int has_w = flags & 4, has_b = flags & 8, in_place = flags & 16;
    int stream = (flags & 32) != 0, more = flags & 64, reverse = flags & 128;
    size_t isz = ln_dtype_size(t);
    ln_dtype pt = t == LN_F64 ? LN_F64 : LN_F32; /* parameters: compute type */
    size_t psz = ln_dtype_size(pt);
    size_t d = pick_d(r, 1); /* record kernels take d >= 1 */
    unsigned nb = take8(r);
    size_t n = 1 + nb % 8 + (more ? 8 : 0);
    ln_op op = (nb >> 3) & 1 ? LN_OP_RMS_NORM : LN_OP_LAYER_NORM;
    int ahead = (nb >> 4) & 1; /* a large call's prefetch of the rows ahead */
    if (op == LN_OP_RMS_NORM)
        has_b = 0; /* RMSNorm has no bias */
    ptrdiff_t x_row = (ptrdiff_t)((d + take8(r) % 5) * isz);
    ptrdiff_t y_row = in_place ? x_row : (ptrdiff_t)((d + take8(r) % 5) * isz);
    if (reverse) {
        x_row = -x_row;
        y_row = -y_row;
    }
    size_t off[4];
    for (int i = 0; i < 4; i++)
        off[i] = (take8(r) % 16) * isz; /* element-aligned, any 64-byte phase */
    valgen gx = pick_valgen(r), gp = pick_valgen(r);

    operand x = operand_new(n, d, x_row, (ptrdiff_t)isz, t, off[0]);
    operand w = operand_new(has_w ? 1 : 0, d, 0, (ptrdiff_t)psz, pt, off[1] / isz * psz);
    operand b = operand_new(has_b ? 1 : 0, d, 0, (ptrdiff_t)psz, pt, off[2] / isz * psz);
    operand y0 = operand_new(n, d, y_row, (ptrdiff_t)isz, t, off[3]);
    fill(r, &gx, t, x.buf.p, x.buf.bytes / isz);
    fill(r, &gp, pt, w.buf.p, w.buf.bytes / psz);
    fill(r, &gp, pt, b.buf.p, b.buf.bytes / psz);
    double *eps = xmalloc(n * sizeof *eps);
    for (size_t k = 0; k < n; k++)
        eps[k] = pick_eps(r);

    snprintf(g_case, sizeof g_case,
             "row job: %s %s record kernel, n=%zu records of d=%zu, x_row=%td y_row=%td bytes "
             "(%s), weight %s, bias %s, stream=%d",
             op_names[op], dtype_names[t], n, d, x_row, y_row, in_place ? "in place" : "x != y",
             has_w ? "yes" : "no", has_b ? "yes" : "no", stream);
    g_in = (inputs){&x, has_w ? &w : NULL, has_b ? &b : NULL, eps, NULL, NULL};

    const ln_kernels *ks[LN_NISAS];
    const char *names[LN_NISAS];
    int n_levels = level_list(ks, names);
    char *y_ref = NULL;
    ln_stats *st_ref = xmalloc(n * sizeof *st_ref);
    int rc_ref = 0;
    for (int k = 0; k < n_levels; k++) {
        /* Outputs pre-filled, by turns with two patterns: a stray write
         * shows as a changed gap, an item left unwritten as a difference. */
        int fill_byte = k % 2 ? 0x5A : 0xA5;
        memset(y0.buf.p, fill_byte, y0.buf.bytes);
        operand xk = operand_clone(&x), wk = operand_clone(&w), bk = operand_clone(&b);
        operand yk = in_place ? xk : operand_clone(&y0);
        buffer epsk = buf_new(n * sizeof(double), 0);
        buffer stk = buf_new(n * sizeof(ln_stats), 0);
        memcpy(epsk.p, eps, n * sizeof(double));
        memset(stk.p, fill_byte, stk.bytes);
        ln_spare *spare = ln_spare_new();
        if (spare == NULL)
            abort();
        ln_rows rows = {
            .n = n, .d = d,
            .x = xk.origin, .x_row = x_row,
            .y = yk.origin, .y_row = y_row,
            .w = has_w ? (const void *)wk.origin : NULL,
            .b = has_b ? (const void *)bk.origin : NULL,
            .eps = (const double *)epsk.p, .st = (ln_stats *)stk.p,
            .spare = spare, .stream = stream, .ahead = ahead,
        };
        int rc = ks[k]->op[op][t](&rows);
        ks[k]->store_fence();
        ln_spare_free(spare);
        if (rc == LN_ENOMEM)
            fail("%s: LN_ENOMEM from the %s record kernel", "row job", names[k]);
        if (!in_place)
            unchanged("x", names[k], &xk.buf, &x.buf);
        unchanged("weight", names[k], &wk.buf, &w.buf);
        unchanged("bias", names[k], &bk.buf, &b.buf);
        unchanged("eps", names[k], &epsk, &(buffer){.p = (char *)eps, .bytes = epsk.bytes});
        /* rows between the records: the fill of x (in place) or the pattern */
        untouched_outside("y", names[k], &yk, in_place ? &x : &y0);
        if (k == 0) {
            const operand *ins[3] = {&x, has_w ? &w : NULL, has_b ? &b : NULL};
            canonical_nans_only(names[k], &yk, ins, 3, eps);
            y_ref = gather(&yk);
            memcpy(st_ref, stk.p, n * sizeof *st_ref);
            rc_ref = rc;
        } else {
            same_items("y", names[k], &yk, y_ref);
            const ln_stats *st = (const ln_stats *)stk.p;
            for (size_t j = 0; j < n; j++) {
                if (memcmp(&st[j].mean, &st_ref[j].mean, 8) != 0)
                    fail_at("mean", names[k], j, 0, &st_ref[j].mean, &st[j].mean, LN_F64);
                if (memcmp(&st[j].var, &st_ref[j].var, 8) != 0)
                    fail_at("var", names[k], j, 0, &st_ref[j].var, &st[j].var, LN_F64);
            }
            if (rc != rc_ref) {
                char a[32], bb[64];
                snprintf(a, sizeof a, "%d", rc_ref);
                snprintf(bb, sizeof bb, "%d (%s)", rc, names[k]);
                fail("return code %s (scalar) vs %s", a, bb);
            }
        }
        buf_free(&xk.buf);
        if (!in_place)
            buf_free(&yk.buf);
        buf_free(&wk.buf);
        buf_free(&bk.buf);
        buf_free(&epsk);
        buf_free(&stk);
    }
    free(y_ref);
    free(st_ref);
    free(eps);
    buf_free(&x.buf);
    buf_free(&w.buf);
    buf_free(&b.buf);
    buf_free(&y0.buf);
}

/* ---- job 2: strided batches -------------------------------------------- */

/* A storage dtype no wider than t (x: strictly narrower or t itself;
 * weight/bias: of at most t's size, which the compute type holds exactly). */
static ln_dtype pick_narrower(reader *r, ln_dtype t, int strict)
{
    unsigned s = take8(r);
    if (s % 2 == 0)
        return t; /* the common case: the job's own dtype */
    ln_dtype c[LN_NDTYPES];
    int n = 0;
    for (int u = 0; u < LN_NDTYPES; u++) {
        size_t us = ln_dtype_size((ln_dtype)u), ts = ln_dtype_size(t);
        if (u == (int)t || (strict ? us < ts : us <= ts))
            c[n++] = (ln_dtype)u;
    }
    return c[(s / 2) % (unsigned)n];
}

/* A column stride in bytes: packed, spaced, reversed, or odd (misaligned
 * items). `colmajor` (outputs too): room for `rows` rows between columns. */
static ptrdiff_t pick_col(reader *r, size_t isz, size_t rows, int *colmajor)
{
    ptrdiff_t s = (ptrdiff_t)isz;
    *colmajor = 0;
    switch (take8(r) % 10) {
    case 0: case 1: case 2: case 3: return s;
    case 4: return 2 * s;
    case 5: return -s;
    case 6: return s + 1;
    case 7: return -3 * s;
    case 8: return 3 * s - 1;
    default:
        *colmajor = 1;
        return (ptrdiff_t)(rows > 0 ? rows : 1) * s + (ptrdiff_t)(take8(r) % 3);
    }
}

/* A row stride for rows of d items at column stride col. Outputs (and
 * in-place x) get strides whose rows never share a byte; inputs may also
 * have zero (broadcast) and overlapping rows. */
static ptrdiff_t pick_row(reader *r, size_t d, ptrdiff_t col, int colmajor, size_t isz,
                          int output)
{
    ptrdiff_t span = d == 0 ? (ptrdiff_t)isz
                            : (ptrdiff_t)(d - 1) * (col < 0 ? -col : col) + (ptrdiff_t)isz;
    unsigned s = take8(r) % 8;
    if (colmajor && s < 5) /* interleaved: the rows side by side */
        return (s & 1) ? -(ptrdiff_t)isz : (ptrdiff_t)isz;
    switch (s) {
    case 0: case 1: return span;
    case 2: return span + (ptrdiff_t)(take8(r) % 9);
    case 3: return -span;
    case 4: return -(span + (ptrdiff_t)(take8(r) % 5) * (ptrdiff_t)isz);
    case 5: return output ? span + 1 : 0;
    case 6: return output ? -span - 3 : (ptrdiff_t)((take8(r) % 3 + 1) * isz);
    default: return output ? 2 * span : -(ptrdiff_t)isz - 1;
    }
}

/* A layout whose extent is over 16 MiB becomes a packed one. */
static void fit_layout(size_t rows, size_t d, ptrdiff_t *row, ptrdiff_t *col, size_t isz)
{
    ptrdiff_t lo, hi;
    extent(rows, d, *row, *col, isz, &lo, &hi);
    if (hi - lo > (ptrdiff_t)16 << 20) {
        *col = (ptrdiff_t)isz;
        *row = (ptrdiff_t)(d * isz);
    }
}

static ptrdiff_t pick_scalar_row(reader *r, size_t isz, int output)
{
    switch (take8(r) % 6) {
    case 0: case 1: return (ptrdiff_t)isz;
    case 2: return -(ptrdiff_t)isz;
    case 3: return (ptrdiff_t)isz + 3; /* misaligned */
    case 4: return output ? -2 * (ptrdiff_t)isz - 1 : 0;
    default: return 2 * (ptrdiff_t)isz;
    }
}

/* Word j of an exported accumulator state (LN_ACC_STATE_WORDS a
 * feature), compared with the reference run's (one thread): a feature's
 * huge sum, the plain float64 sum of its terms of 2^64 and more
 * (ln_accum.h: the one case whose bits may depend on the order), is not
 * compared for runs on several threads, which add those terms in
 * another order. Its flags, and every other word, are. */
static int order_dependent_word(const uint64_t *ref, size_t j, int threads)
{
    return threads > 1 && j % LN_ACC_STATE_WORDS == 2 * LN_ACC_LEVELS + 1 &&
           (ref[j - 1] & LN_ACC_HUGE) != 0;
}

static void fuzz_batch(reader *r)
{
    unsigned flags = take8(r);
    ln_dtype t = (ln_dtype)(flags & 3);
    int has_w = flags & 4, has_b = flags & 8, stats = flags & 16;
    /* Rare (two magic bytes): a batch above the threading threshold. */
    int big = (flags & 32) && take8(r) == 0x5A && take8(r) == 0xC3;
    int want_in_place = flags & 64;
    /* Bit 7: another op than LayerNorm (one more byte says which). */
    ln_op op = LN_OP_LAYER_NORM;
    if (flags & 128) {
        static const ln_op others[3] = {LN_OP_RMS_NORM, LN_OP_LAYER_NORM_BACKWARD,
                                        LN_OP_RMS_NORM_BACKWARD};
        op = others[take8(r) % 3];
    }
    int back = op == LN_OP_LAYER_NORM_BACKWARD || op == LN_OP_RMS_NORM_BACKWARD;
    if (op != LN_OP_LAYER_NORM)
        has_b = 0; /* RMSNorm and the backwards take no bias */
    if (back)
        want_in_place = 0;
    /* LayerNorm's backward: the means given (the mean operand, read) or
     * recomputed; the forwards write mean/var when asked. */
    int given_mean = op == LN_OP_LAYER_NORM_BACKWARD && stats;
    if (op == LN_OP_RMS_NORM_BACKWARD)
        stats = 0;
    if (big) /* a float32 or float64 job: 2 MiB are 512 or 256 K values */
        t = t == LN_F64 || t == LN_BF16 ? LN_F64 : LN_F32;
    ln_dtype xt = pick_narrower(r, t, 1);
    ln_dtype wt = pick_narrower(r, t, 0), bt = pick_narrower(r, t, 0);
    ln_dtype st_t = (take8(r) & 1) || t == LN_F64 ? LN_F64 : LN_F32;
    int in_place = want_in_place && xt == t;
    size_t isz = ln_dtype_size(t), xsz = ln_dtype_size(xt);
    size_t ssz = ln_dtype_size(st_t);
    size_t d = pick_d(r, 0);
    size_t rows = take8(r) % 9;
    int n_threads = 1 + (int)(take8(r) % 4);
    int cm_x, cm_w, cm_b, cm_y;

    if (big) {
        /* 2 or 4 MiB of work: 2 or up to 4 threads (one per MiB, ln_batch.c). */
        d = 256 + d % 768;
        rows = (take8(r) % 4 == 0 ? 2 : 1) * ln_thread_threshold() / (d * isz) + 1 +
               take8(r) % 5;
    }
    ptrdiff_t x_col = pick_col(r, xsz, rows, &cm_x);
    ptrdiff_t w_col = pick_col(r, ln_dtype_size(wt), rows, &cm_w);
    ptrdiff_t b_col = pick_col(r, ln_dtype_size(bt), rows, &cm_b);
    ptrdiff_t y_col = pick_col(r, isz, rows, &cm_y);
    ptrdiff_t x_row = pick_row(r, d, x_col, cm_x, xsz, in_place);
    ptrdiff_t w_row = (take8(r) & 1) ? 0 : pick_row(r, d, w_col, cm_w, ln_dtype_size(wt), 0);
    ptrdiff_t b_row = (take8(r) & 1) ? 0 : pick_row(r, d, b_col, cm_b, ln_dtype_size(bt), 0);
    ptrdiff_t y_row = pick_row(r, d, y_col, cm_y, isz, 1);
    ptrdiff_t eps_row = pick_scalar_row(r, 8, 0);
    ptrdiff_t m_row = pick_scalar_row(r, ssz, 1), v_row = pick_scalar_row(r, ssz, 1);
    if (big) {
        /* Input rows overlapping (x_row a few items, x stays small) or
         * packed; outputs packed (rows used in place) or strided (staged). */
        if (!in_place && (take8(r) & 1)) {
            x_col = (ptrdiff_t)xsz;
            x_row = (ptrdiff_t)((1 + take8(r) % 3) * xsz);
        }
        if (!cm_y && (take8(r) & 1)) {
            y_col = (ptrdiff_t)isz;
            y_row = (ptrdiff_t)(d * isz);
        }
    }
    /* Big batches: no operand of more than 16 MiB (column-major layouts
     * of thousands of rows, spread by a wide column stride, can span GBs). */
    fit_layout(rows, d, &x_row, &x_col, xsz);
    fit_layout(rows, d, &w_row, &w_col, ln_dtype_size(wt));
    fit_layout(rows, d, &b_row, &b_col, ln_dtype_size(bt));
    fit_layout(rows, d, &y_row, &y_col, isz);
    if (in_place) {
        y_col = x_col;
        y_row = x_row;
    }
    size_t off[8];
    for (int i = 0; i < 8; i++)
        off[i] = take8(r) % 64;
    valgen gx = pick_valgen(r), gp = pick_valgen(r);

    /* Inputs, filled once from the fuzzer's bytes (gaps included). */
    operand x = operand_new(rows, d, x_row, x_col, xt, off[0]);
    operand w = operand_new(has_w ? rows : 0, d, w_row, w_col, wt, off[1]);
    operand b = operand_new(has_b ? rows : 0, d, b_row, b_col, bt, off[2]);
    operand e = operand_new(rows, 1, eps_row, 8, LN_F64, off[3]);
    fill(r, &gx, xt, x.buf.p, x.buf.bytes / xsz);
    fill(r, &gp, wt, w.buf.p, w.buf.bytes / ln_dtype_size(wt));
    fill(r, &gp, bt, b.buf.p, b.buf.bytes / ln_dtype_size(bt));
    for (size_t i = 0; i + 8 <= e.buf.bytes; i += 8) {
        double v = pick_eps(r);
        memcpy(e.buf.p + i, &v, 8);
    }
    /* The backward's dy: laid out like x, its own buffer and values. */
    operand dy = operand_new(back ? rows : 0, d, x_row, x_col, xt, off[7]);
    valgen gdy = pick_valgen(r);
    fill(r, &gdy, xt, dy.buf.p, dy.buf.bytes / xsz);
    operand y0 = in_place ? x : operand_new(rows, d, y_row, y_col, t, off[4]);
    operand m0 = operand_new(stats ? rows : 0, 1, m_row, 0, st_t, off[5]);
    operand mean_in = m0; /* given means: values, not a pattern */
    if (given_mean) {
        mean_in = operand_new(rows, 1, m_row, 0, st_t, off[5]);
        fill(r, &gx, st_t, mean_in.buf.p, mean_in.buf.bytes / ssz);
    }
    operand v0 = operand_new(stats ? rows : 0, 1, v_row, 0, st_t, off[6]);
    double *eps = xmalloc(rows * sizeof *eps);
    for (size_t k = 0; k < rows; k++)
        memcpy(&eps[k], item(&e, k, 0), 8);

    snprintf(g_case, sizeof g_case,
             "batch job: %s%s, %s, %zu records of d=%zu, threads=%d; x %s col %td row %td%s; "
             "weight %s col %td row %td; bias %s col %td row %td; eps row %td; y col %td "
             "row %td; mean/var %s rows %td/%td; offsets %zu %zu %zu %zu %zu %zu %zu",
             op_names[op], given_mean ? " (means given)" : "", dtype_names[t], rows, d,
             n_threads, dtype_names[xt], x_col, x_row,
             in_place ? " (y = x)" : "", has_w ? dtype_names[wt] : "none", w_col, w_row,
             has_b ? dtype_names[bt] : "none", b_col, b_row, eps_row, y_col, y_row,
             stats ? dtype_names[st_t] : "none", m_row, v_row, off[0], off[1], off[2], off[3],
             off[4], off[5], off[6]);
    g_in = (inputs){&x, has_w ? &w : NULL, has_b ? &b : NULL, eps, back ? &dy : NULL,
                    given_mean ? &mean_in : NULL};

    const ln_kernels *ks[LN_NISAS];
    const char *names[LN_NISAS];
    int n_levels = level_list(ks, names);
    char *y_ref = NULL, *m_ref = NULL, *v_ref = NULL;
    uint64_t *acc_ref[2] = {NULL, NULL};
    size_t acc_words = d * LN_ACC_STATE_WORDS;
    int rc_ref = 0, n_runs = 0;
    /* Run 0: scalar on one thread, the reference; then every level
     * (scalar again if threads > 1) on n_threads. */
    for (int run = 0; run <= n_levels; run++) {
        int k = run == 0 ? 0 : run - 1;
        int threads = run == 0 ? 1 : n_threads;
        if (run == 1 && threads == 1)
            continue; /* scalar on one thread again */
        /* Outputs pre-filled, by turns with two patterns: a stray write
         * shows as a changed gap, an item left unwritten as a difference. */
        int fill_byte = n_runs++ % 2 ? 0x5A : 0xA5;
        if (!in_place)
            memset(y0.buf.p, fill_byte, y0.buf.bytes);
        memset(m0.buf.p, fill_byte, m0.buf.bytes);
        memset(v0.buf.p, fill_byte, v0.buf.bytes);
        char level[48];
        snprintf(level, sizeof level, "%s on %d thread%s", names[k], threads,
                 threads > 1 ? "s" : "");
        operand xk = operand_clone(&x), wk = operand_clone(&w), bk = operand_clone(&b);
        operand ek = operand_clone(&e);
        operand yk = in_place ? xk : operand_clone(&y0);
        operand mk = operand_clone(&m0), vk = operand_clone(&v0);
        operand dyk = operand_clone(&dy), mik = operand_clone(&mean_in);
        ln_job job = {
            .op = op, .dtype = t, .n_rows = rows, .d = d,
            .x = as_ln(&xk, 1), .w = as_ln(&wk, has_w), .b = as_ln(&bk, has_b),
            .eps = as_ln(&ek, 1), .y = as_ln(&yk, 1),
            .mean = as_ln(&mk, stats && !back), .var = as_ln(&vk, stats && !back),
        };
        ln_acc acc[2];
        if (back) {
            job.dy = as_ln(&dyk, 1);
            job.mean = as_ln(&mik, given_mean);
            for (int a = 0; a < 2; a++)
                if (ln_acc_init(&acc[a], d) != 0)
                    abort();
            job.dw = &acc[0];
            job.db = op == LN_OP_LAYER_NORM_BACKWARD ? &acc[1] : NULL;
        }
        int rc = ln_batch_run(ks[k], &job, threads);
        if (rc == LN_ENOMEM)
            fail("%s: LN_ENOMEM on a small batch (%s)", "batch job", level);
        if (!in_place)
            unchanged("x", level, &xk.buf, &x.buf);
        unchanged("weight", level, &wk.buf, &w.buf);
        unchanged("bias", level, &bk.buf, &b.buf);
        unchanged("eps", level, &ek.buf, &e.buf);
        unchanged("dy", level, &dyk.buf, &dy.buf);
        if (given_mean)
            unchanged("mean (given)", level, &mik.buf, &mean_in.buf);
        untouched_outside("y", level, &yk, &y0);
        if (!back) {
            untouched_outside("mean", level, &mk, &m0);
            untouched_outside("var", level, &vk, &v0);
        }
        /* the backward's sums: their exact state, word for word */
        uint64_t *state[2] = {NULL, NULL};
        for (int a = 0; back && a < 2; a++) {
            state[a] = xmalloc(acc_words * sizeof(uint64_t) + 8);
            ln_acc_export(&acc[a], state[a]);
            ln_acc_free(&acc[a]);
        }
        if (run == 0) {
            const operand *ins[5] = {&x, has_w ? &w : NULL, has_b ? &b : NULL,
                                     back ? &dy : NULL, given_mean ? &mean_in : NULL};
            canonical_nans_only(level, &yk, ins, 5, eps);
            y_ref = gather(&yk);
            m_ref = gather(&mk);
            v_ref = gather(&vk);
            rc_ref = rc;
            acc_ref[0] = state[0];
            acc_ref[1] = state[1];
        } else {
            for (int a = 0; back && a < 2; a++)
                for (size_t j = 0; j < acc_words; j++)
                    if (state[a][j] != acc_ref[a][j] &&
                        !order_dependent_word(acc_ref[a], j, threads))
                        fail_at(a ? "dbias (exact sums' state)" : "dweight (exact sums' state)",
                                level, j / LN_ACC_STATE_WORDS, j % LN_ACC_STATE_WORDS,
                                &acc_ref[a][j], &state[a][j], LN_F64);
            free(state[0]);
            free(state[1]);
            same_items("y", level, &yk, y_ref);
            /* d == 0: ln_batch_run returns at once and writes no
             * statistics (what they should be is not specified). */
            if (d > 0 && !back) {
                same_items("mean", level, &mk, m_ref);
                same_items("var", level, &vk, v_ref);
            }
            if (rc != rc_ref) {
                char a[32], bb[96];
                snprintf(a, sizeof a, "%d", rc_ref);
                snprintf(bb, sizeof bb, "%d (%s)", rc, level);
                fail("return code %s (scalar) vs %s", a, bb);
            }
        }
        buf_free(&xk.buf);
        if (!in_place)
            buf_free(&yk.buf);
        buf_free(&wk.buf);
        buf_free(&bk.buf);
        buf_free(&ek.buf);
        buf_free(&mk.buf);
        buf_free(&vk.buf);
        buf_free(&dyk.buf);
        buf_free(&mik.buf);
    }
    free(acc_ref[0]);
    free(acc_ref[1]);
    buf_free(&dy.buf);
    if (given_mean)
        buf_free(&mean_in.buf);
    free(y_ref);
    free(m_ref);
    free(v_ref);
    free(eps);
    buf_free(&x.buf);
    buf_free(&w.buf);
    buf_free(&b.buf);
    buf_free(&e.buf);
    if (!in_place)
        buf_free(&y0.buf);
    buf_free(&m0.buf);
    buf_free(&v0.buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int verbose = -1;
    if (verbose < 0) {
        const char *v = getenv("FUZZ_KERNELS_VERBOSE");
        verbose = v != NULL && *v != '\0' && *v != '0';
    }
    reader r = reader_new(data, size);
    if (take8(&r) % 2 == 0)
        fuzz_row(&r);
    else
        fuzz_batch(&r);
    if (verbose) /* FUZZ_KERNELS_VERBOSE=1: say what each input was */
        fprintf(stderr, "fuzz_kernels: ok: %s\n", g_case);
    return 0;
}
