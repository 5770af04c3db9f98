/*
 * fuzz_kernels.c - libFuzzer target for the LayerNorm kernels in csrc/ln_*.c
 * (no Python: _coremodule.c is not linked).
 *
 * Every input is decoded into one of three jobs, run on every instruction-set
 * level this CPU supports:
 *
 *   row    ln_row_f32 / ln_row_f64 on exact-size buffers (x, y, weight, bias
 *          each malloc'd to exactly its bytes, at an element-aligned offset
 *          from a 64-byte boundary), with or without weight/bias, in place
 *          or not, with the streaming-store hint on or off;
 *   batch  ln_batch_run on float16/32/64 records with arbitrary byte strides
 *          (negative, zero for broadcast rows, odd byte strides that
 *          misalign every element), per-record eps, optional mean/var
 *          outputs, 1-4 threads; each operand's buffer is exactly the span
 *          its strides address;
 *   half   the float16 <-> float32 conversions of each ISA on raw bit
 *          patterns, against the scalar ln_half_to_float/ln_float_to_half.
 *
 * Value bytes come straight from the fuzzer (raw bit patterns: NaNs with
 * payloads, infinities, subnormals) or, by a mode byte, as small integers or
 * offset data, so both extreme and ordinary records are reached.
 *
 * Checks: AddressSanitizer (any read or write outside a buffer),
 * UndefinedBehaviorSanitizer, and the reproducibility contract: every ISA's
 * outputs (y, mean, var, return code) equal the scalar ISA's bit for bit,
 * NaN payloads included, and the inputs are left unchanged. Set
 * LN_FUZZ_NAN_LOOSE=1 to accept NaNs whose payloads differ between ISAs.
 *
 * Build and run: fuzz/build.sh, then e.g.
 *     fuzz/build/fuzz_kernels -max_total_time=300 fuzz/build/corpus
 */
#define _POSIX_C_SOURCE 200809L /* posix_memalign */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layernorm.h"

/* ---- input reader ------------------------------------------------------ */

typedef struct {
    const uint8_t *p;
    size_t n;
} reader;

static unsigned take8(reader *r)
{
    if (r->n == 0)
        return 0;
    r->n--;
    return *r->p++;
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

/* ---- values ----------------------------------------------------------- */

enum { V_RAW = 0, V_SMALL = 1, V_OFFSET = 2, V_SPECIAL = 3 };

static const double specials[] = {
    0.0, -0.0, 1.0, -1.0, INFINITY, -INFINITY, NAN, 5e-324, -5e-324,
    2.2250738585072014e-308, 1.7976931348623157e308, 3.4028234663852886e38,
    1.401298464324817e-45, 65504.0, 6.103515625e-05, 5.960464477539063e-08,
};

/* One value of `size` bytes (2, 4, 8) written to dst, from the input. */
static void make_value(reader *r, int mode, size_t size, void *dst)
{
    double v;
    switch (mode) {
    case V_RAW: {
        uint64_t bits = take64(r);
        memcpy(dst, &bits, size); /* little-endian: the low bytes */
        return;
    }
    case V_SMALL:
        v = (double)(int8_t)take8(r) / 8.0;
        break;
    case V_OFFSET:
        v = 1000.0 + (double)(int8_t)take8(r) / 256.0;
        break;
    default: {
        unsigned s = take8(r);
        v = s < 2 * (sizeof specials / sizeof specials[0])
                ? specials[s % (sizeof specials / sizeof specials[0])]
                : (double)(int8_t)s;
        break;
    }
    }
    if (size == 8) {
        memcpy(dst, &v, 8);
    } else if (size == 4) {
        float f = (float)v;
        memcpy(dst, &f, 4);
    } else {
        uint16_t h = ln_float_to_half((float)v);
        memcpy(dst, &h, 2);
    }
}

static void fill(reader *r, int mode, size_t size, void *buf, size_t n_items)
{
    for (size_t i = 0; i < n_items; i++)
        make_value(r, mode, size, (char *)buf + i * size);
}

static double pick_eps(reader *r)
{
    static const double table[] = {1e-5, 0.0, 1e-12, 5e-324, 1.0, 1e300,
                                   1.7976931348623157e308, -1.0, NAN, INFINITY,
                                   -0.0, 1e-3};
    unsigned s = take8(r);
    if (s < 240)
        return table[s % (sizeof table / sizeof table[0])];
    double e;
    uint64_t bits = take64(r);
    memcpy(&e, &bits, 8);
    return e;
}

/* ---- comparison -------------------------------------------------------- */

static int nan_loose = -1;

static int nan_loose_mode(void)
{
    if (nan_loose < 0) {
        const char *e = getenv("LN_FUZZ_NAN_LOOSE");
        nan_loose = e && *e && *e != '0';
    }
    return nan_loose;
}

static int is_nan_bits(const unsigned char *p, size_t size)
{
    if (size == 8) {
        double v;
        memcpy(&v, p, 8);
        return isnan(v);
    }
    if (size == 4) {
        float v;
        memcpy(&v, p, 4);
        return isnan(v);
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

/* Bit-for-bit equality of two buffers of `size`-byte values; on a
 * mismatch, say where and abort (libFuzzer keeps the input). */
static void same_bits(const char *what, const char *isa, const void *a,
                      const void *b, size_t bytes, size_t size)
{
    if (memcmp(a, b, bytes) == 0)
        return;
    nan_loose_mode();
    const unsigned char *pa = a, *pb = b;
    for (size_t i = 0; i + size <= bytes; i += size) {
        if (memcmp(pa + i, pb + i, size) == 0)
            continue;
        int both_nan = is_nan_bits(pa + i, size) && is_nan_bits(pb + i, size);
        if (both_nan && nan_loose)
            continue;
        uint64_t ua = 0, ub = 0;
        memcpy(&ua, pa + i, size);
        memcpy(&ub, pb + i, size);
        fprintf(stderr,
                "fuzz_kernels: %s differs between scalar and %s at byte %zu: "
                "scalar bits 0x%0*llx, %s bits 0x%0*llx%s\n",
                what, isa, i, (int)(2 * size), (unsigned long long)ua, isa,
                (int)(2 * size), (unsigned long long)ub,
                both_nan ? " (both NaN: only the NaN payloads differ)" : "");
        abort();
    }
}

/* The batch being checked, to print its inputs next to a mismatch. */
static const ln_batch *g_job;

static void print_item(const char *name, const char *base, ptrdiff_t row,
                       ptrdiff_t col, size_t r, size_t c, size_t size)
{
    if (!base)
        return;
    uint64_t u = 0;
    memcpy(&u, base + (ptrdiff_t)r * row + (ptrdiff_t)c * col, size);
    fprintf(stderr, "fuzz_kernels:   %s[%zu, %zu] bits 0x%0*llx\n", name, r, c,
            (int)(2 * size), (unsigned long long)u);
}

static void print_inputs(size_t r, size_t c)
{
    const ln_batch *j = g_job;
    if (!j)
        return;
    size_t isz = j->dtype == LN_F16 ? 2 : (j->dtype == LN_F32 ? 4 : 8);
    print_item("x", j->x, j->x_row, j->x_col, r, c, isz);
    print_item("weight", j->w, j->w_row, j->w_col, r, c, isz);
    print_item("bias", j->b, j->b_row, j->b_col, r, c, isz);
    print_item("eps", j->eps, j->eps_row, 0, r, 0, 8);
    for (size_t i = 0; i < j->d && i < 64; i++)
        print_item("x (record)", j->x, j->x_row, j->x_col, r, i, isz);
}

/* Compare two copies of a strided output item by item (rows x cols items
 * of `size` bytes at origin + r*row + c*col in each buffer), then the
 * whole buffers: a difference outside every item is a stray write. */
static void same_items(const char *what, const char *isa, const char *buf0,
                       const char *buf1, size_t bytes, ptrdiff_t origin,
                       size_t rows, size_t cols, ptrdiff_t row, ptrdiff_t col,
                       size_t size)
{
    if (memcmp(buf0, buf1, bytes) == 0)
        return;
    for (size_t r = 0; r < rows; r++) {
        for (size_t c = 0; c < cols; c++) {
            ptrdiff_t at = origin + (ptrdiff_t)r * row + (ptrdiff_t)c * col;
            if (memcmp(buf0 + at, buf1 + at, size) == 0)
                continue;
            char label[160];
            snprintf(label, sizeof label, "%s[row %zu, col %zu]", what, r, c);
            if (memcmp(buf0 + at, buf1 + at, size) != 0 && !nan_loose_mode())
                print_inputs(r, c);
            same_bits(label, isa, buf0 + at, buf1 + at, size, size);
        }
    }
    /* Every item matched (or differs in NaN payload only, under
     * LN_FUZZ_NAN_LOOSE): the rest must be the untouched fill. */
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            ptrdiff_t at = origin + (ptrdiff_t)r * row + (ptrdiff_t)c * col;
            memcpy((char *)buf1 + at, buf0 + at, size);
        }
    if (memcmp(buf0, buf1, bytes) != 0) {
        fprintf(stderr, "fuzz_kernels: %s: %s wrote outside the output items\n", what,
                isa);
        abort();
    }
}

static void unchanged(const char *what, const void *now, const void *before,
                      size_t bytes)
{
    if (bytes && memcmp(now, before, bytes) != 0) {
        fprintf(stderr, "fuzz_kernels: %s was modified by the kernel\n", what);
        abort();
    }
}

/* ---- exact-size buffers ------------------------------------------------ */

/* `bytes` bytes starting `off` bytes past a 64-byte boundary. The
 * allocation ends exactly at start + bytes, so ASan flags any read or write
 * past the end; with off = 0 it also starts exactly at start. */
typedef struct {
    void *block;
    char *p;
} buffer;

static buffer buf_new(size_t bytes, size_t off)
{
    buffer b;
    off %= 64;
    if (posix_memalign(&b.block, 64, off + bytes ? off + bytes : 1) != 0)
        abort();
    b.p = (char *)b.block + off;
    return b;
}

static void buf_free(buffer *b)
{
    free(b->block);
    b->block = NULL;
    b->p = NULL;
}

/* ---- ISAs ------------------------------------------------------------ */

static int isa_list(const ln_kernels **ks, const char **names)
{
    int n = 0;
    for (int i = 0; i <= (int)LN_ISA_AVX512; i++) {
        if (!ln_isa_supported((ln_isa)i))
            continue;
        ks[n] = ln_kernels_for((ln_isa)i);
        names[n] = ln_isa_name((ln_isa)i);
        n++;
    }
    return n;
}

/* ---- job 1: one record ------------------------------------------------- */

static void fuzz_row(reader *r)
{
    unsigned flags = take8(r);
    int f64 = flags & 1, has_w = flags & 2, has_b = flags & 4;
    int inplace = flags & 8, stream = flags & 16;
    int mode = (flags >> 6) & 3;
    size_t d = take16(r) % 1100;
    if (take8(r) & 1)
        d %= 70; /* short records most of the time */
    size_t isz = f64 ? 8 : 4;
    size_t bytes = d * isz;
    size_t off[4];
    for (int i = 0; i < 4; i++)
        off[i] = (take8(r) % 16) * isz; /* element-aligned, 64-byte phase */
    double eps = pick_eps(r);

    /* The values, once; each ISA gets fresh exact-size copies. */
    char *xv = malloc(bytes + 1), *wv = malloc(bytes + 1), *bv = malloc(bytes + 1);
    if (!xv || !wv || !bv)
        abort();
    fill(r, mode, isz, xv, d);
    fill(r, mode == V_RAW ? V_SMALL : mode, isz, wv, d);
    fill(r, mode == V_RAW ? V_SMALL : mode, isz, bv, d);

    const ln_kernels *ks[3];
    const char *names[3];
    int n_isa = isa_list(ks, names);
    char *y0 = malloc(bytes + 1);
    ln_stats st0 = {0, 0};
    int rc0 = 0;
    if (!y0)
        abort();

    for (int k = 0; k < n_isa; k++) {
        buffer x = buf_new(bytes, off[0]), y = buf_new(bytes, off[1]);
        buffer w = buf_new(has_w ? bytes : 0, off[2]);
        buffer b = buf_new(has_b ? bytes : 0, off[3]);
        memcpy(x.p, xv, bytes);
        if (has_w)
            memcpy(w.p, wv, bytes);
        if (has_b)
            memcpy(b.p, bv, bytes);
        char *yp = inplace ? x.p : y.p;
        ln_hints hints;
        memset(&hints, 0, sizeof hints);
        hints.stream = stream ? 1 : 0;
        ln_stats st = {0, 0};
        int rc;
        if (f64)
            rc = ln_row_f64(ks[k], (const double *)x.p, (double *)yp, d,
                            has_w ? (const double *)w.p : NULL,
                            has_b ? (const double *)b.p : NULL, eps, &hints, &st);
        else
            rc = ln_row_f32(ks[k], (const float *)x.p, (float *)yp, d,
                            has_w ? (const float *)w.p : NULL,
                            has_b ? (const float *)b.p : NULL, eps, &hints, &st);
        if (ks[k]->store_fence)
            ks[k]->store_fence();
        if (!inplace)
            unchanged("row x", x.p, xv, bytes);
        if (has_w)
            unchanged("row weight", w.p, wv, bytes);
        if (has_b)
            unchanged("row bias", b.p, bv, bytes);
        if (k == 0) {
            memcpy(y0, yp, bytes);
            st0 = st;
            rc0 = rc;
        } else {
            same_bits(f64 ? "row y (f64)" : "row y (f32)", names[k], y0, yp,
                      bytes, isz);
            same_bits("row mean", names[k], &st0.mean, &st.mean, 8, 8);
            same_bits("row var", names[k], &st0.var, &st.var, 8, 8);
            if (rc != rc0) {
                fprintf(stderr, "fuzz_kernels: row rc %d (scalar) vs %d (%s)\n",
                        rc0, rc, names[k]);
                abort();
            }
        }
        buf_free(&x);
        buf_free(&y);
        buf_free(&w);
        buf_free(&b);
    }
    free(y0);
    free(xv);
    free(wv);
    free(bv);
}

/* ---- job 2: a strided batch ------------------------------------------- */

/* Byte extent [lo, hi) addressed by rows x cols items of `size` bytes. */
static void extent(size_t rows, size_t cols, ptrdiff_t row, ptrdiff_t col,
                   size_t size, ptrdiff_t *lo, ptrdiff_t *hi)
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

typedef struct {
    buffer buf;
    char *origin; /* element (0, 0) */
    size_t bytes;
} operand;

static operand operand_new(size_t rows, size_t cols, ptrdiff_t row,
                           ptrdiff_t col, size_t size, size_t off)
{
    ptrdiff_t lo, hi;
    operand o;
    extent(rows, cols, row, col, size, &lo, &hi);
    o.bytes = (size_t)(hi - lo);
    o.buf = buf_new(o.bytes, off);
    o.origin = o.buf.p - lo;
    return o;
}

/* A column stride in bytes: packed, spaced, reversed, or odd (misaligned
 * elements). */
static ptrdiff_t pick_col(reader *r, size_t isz)
{
    switch (take8(r) % 8) {
    case 0: case 1: case 2: return (ptrdiff_t)isz;
    case 3: return 2 * (ptrdiff_t)isz;
    case 4: return -(ptrdiff_t)isz;
    case 5: return (ptrdiff_t)isz + 1;
    case 6: return -3 * (ptrdiff_t)isz;
    default: return 3 * (ptrdiff_t)isz - 1;
    }
}

/* A row stride in bytes for rows of d items at column stride col: packed
 * after the row, with a gap, reversed, or 0 (every row the same memory;
 * inputs only). */
static ptrdiff_t pick_row(reader *r, size_t d, ptrdiff_t col, size_t isz,
                          int allow_zero)
{
    ptrdiff_t span = (ptrdiff_t)d * (col < 0 ? -col : col);
    if (span < (ptrdiff_t)isz)
        span = (ptrdiff_t)isz;
    switch (take8(r) % 6) {
    case 0: case 1: return span;
    case 2: return span + (ptrdiff_t)(take8(r) % 9);
    case 3: return -span;
    case 4: return allow_zero ? 0 : span + 1;
    default: return -(span + (ptrdiff_t)(take8(r) % 5) * (ptrdiff_t)isz);
    }
}

static void fuzz_batch(reader *r)
{
    unsigned flags = take8(r);
    ln_dtype t = (ln_dtype)(flags % 3);
    int has_w = flags & 4, has_b = flags & 8, stats = flags & 16;
    /* Rare (two magic bytes): a batch just above the threading threshold. */
    int big = (flags & 32) && take8(r) == 0x5A && take8(r) == 0xC3;
    int mode = (take8(r) >> 0) & 3;
    size_t isz = t == LN_F16 ? 2 : (t == LN_F32 ? 4 : 8);
    size_t ssz = t == LN_F64 ? 8 : 4;
    size_t d = take16(r) % 300;
    size_t rows = take8(r) % 7;
    int n_threads = 1 + (int)(take8(r) % 4);

    ptrdiff_t x_col = pick_col(r, isz), w_col = pick_col(r, isz);
    ptrdiff_t b_col = pick_col(r, isz), y_col = pick_col(r, isz);
    ptrdiff_t x_row = pick_row(r, d, x_col, isz, 1);
    ptrdiff_t w_row = (take8(r) & 1) ? 0 : pick_row(r, d, w_col, isz, 1);
    ptrdiff_t b_row = (take8(r) & 1) ? 0 : pick_row(r, d, b_col, isz, 1);
    ptrdiff_t y_row = pick_row(r, d, y_col, isz, 0);
    ptrdiff_t eps_row = (take8(r) & 1) ? 8 : 0;
    ptrdiff_t m_row = (ptrdiff_t)ssz * ((take8(r) & 1) ? 1 : -2);
    if (big) {
        /* Enough work for the batch to start threads: many rows that all
         * read the same input row (x_row = 0), written to a packed y. */
        d = 512 + d;
        rows = ln_thread_threshold() / (d * isz) + 1 + take8(r) % 5;
        x_row = 0;
        x_col = (ptrdiff_t)isz;
        y_col = (ptrdiff_t)isz;
        y_row = (ptrdiff_t)(d * isz);
        eps_row = 0;
    }
    size_t off[8];
    for (int i = 0; i < 8; i++)
        off[i] = take8(r) % 64;

    /* Inputs, filled once, from the fuzzer's bytes. */
    operand x = operand_new(rows, d, x_row, x_col, isz, off[0]);
    operand w = operand_new(has_w ? rows : 0, d, w_row, w_col, isz, off[1]);
    operand b = operand_new(has_b ? rows : 0, d, b_row, b_col, isz, off[2]);
    operand e = operand_new(rows, 1, eps_row, 8, 8, off[3] & ~(size_t)7);
    fill(r, mode, isz, x.buf.p, x.bytes / isz);
    fill(r, mode == V_RAW ? V_SMALL : mode, isz, w.buf.p, w.bytes / isz);
    fill(r, mode == V_RAW ? V_SMALL : mode, isz, b.buf.p, b.bytes / isz);
    for (size_t i = 0; i + 8 <= e.bytes; i += 8) {
        double v = pick_eps(r);
        memcpy(e.buf.p + i, &v, 8);
    }
    char *x_copy = malloc(x.bytes + 1), *w_copy = malloc(w.bytes + 1);
    char *b_copy = malloc(b.bytes + 1);
    if (!x_copy || !w_copy || !b_copy)
        abort();
    memcpy(x_copy, x.buf.p, x.bytes);
    memcpy(w_copy, w.buf.p, w.bytes);
    memcpy(b_copy, b.buf.p, b.bytes);

    const ln_kernels *ks[3];
    const char *names[3];
    int n_isa = isa_list(ks, names);
    char *y0 = NULL, *m0 = NULL, *v0 = NULL;
    int rc0 = 0;
    size_t y_bytes = 0, s_bytes = 0;

    for (int k = 0; k < n_isa; k++) {
        operand y = operand_new(rows, d, y_row, y_col, isz, off[4]);
        operand mean = operand_new(stats ? rows : 0, 1, m_row, (ptrdiff_t)ssz,
                                   ssz, off[5] & ~(ssz - 1));
        operand var = operand_new(stats ? rows : 0, 1, m_row, (ptrdiff_t)ssz,
                                  ssz, off[6] & ~(ssz - 1));
        /* Output gaps keep a known pattern: a kernel that writes where it
         * should not shows up as a difference (or an ASan report). */
        memset(y.buf.p, 0xA5, y.bytes);
        memset(mean.buf.p, 0xA5, mean.bytes);
        memset(var.buf.p, 0xA5, var.bytes);

        ln_batch job;
        memset(&job, 0, sizeof job);
        job.dtype = t;
        job.n_rows = rows;
        job.d = d;
        job.x = x.origin; job.x_row = x_row; job.x_col = x_col;
        if (has_w) { job.w = w.origin; job.w_row = w_row; job.w_col = w_col; }
        if (has_b) { job.b = b.origin; job.b_row = b_row; job.b_col = b_col; }
        job.eps = e.origin; job.eps_row = eps_row;
        job.y = y.origin; job.y_row = y_row; job.y_col = y_col;
        if (stats) {
            job.mean = mean.origin; job.mean_row = m_row;
            job.var = var.origin; job.var_row = m_row;
        }
        g_job = &job;
        /* Scalar runs on one thread: the reference for every ISA and
         * thread count. */
        int rc = ln_batch_run(ks[k], &job, k == 0 ? 1 : n_threads);
        if (rc == LN_ENOMEM) {
            fprintf(stderr, "fuzz_kernels: LN_ENOMEM on a small batch\n");
            abort();
        }
        unchanged("batch x", x.buf.p, x_copy, x.bytes);
        unchanged("batch weight", w.buf.p, w_copy, w.bytes);
        unchanged("batch bias", b.buf.p, b_copy, b.bytes);
        if (k == 0) {
            y_bytes = y.bytes;
            s_bytes = mean.bytes;
            y0 = malloc(y_bytes + 1);
            m0 = malloc(s_bytes + 1);
            v0 = malloc(s_bytes + 1);
            if (!y0 || !m0 || !v0)
                abort();
            memcpy(y0, y.buf.p, y_bytes);
            memcpy(m0, mean.buf.p, s_bytes);
            memcpy(v0, var.buf.p, s_bytes);
            rc0 = rc;
        } else {
            ptrdiff_t y_at = y.origin - y.buf.p;
            same_items(t == LN_F16 ? "batch y (f16)" : t == LN_F32 ? "batch y (f32)"
                                                                 : "batch y (f64)",
                       names[k], y0, y.buf.p, y_bytes, y_at, rows, d, y_row, y_col,
                       isz);
            if (stats) {
                same_items("batch mean", names[k], m0, mean.buf.p, s_bytes,
                           mean.origin - mean.buf.p, rows, 1, m_row, 0, ssz);
                same_items("batch var", names[k], v0, var.buf.p, s_bytes,
                           var.origin - var.buf.p, rows, 1, m_row, 0, ssz);
            }
            if (rc != rc0) {
                fprintf(stderr, "fuzz_kernels: batch rc %d (scalar) vs %d (%s)\n",
                        rc0, rc, names[k]);
                abort();
            }
        }
        buf_free(&y.buf);
        buf_free(&mean.buf);
        buf_free(&var.buf);
    }
    free(y0);
    free(m0);
    free(v0);
    free(x_copy);
    free(w_copy);
    free(b_copy);
    buf_free(&x.buf);
    buf_free(&w.buf);
    buf_free(&b.buf);
    buf_free(&e.buf);
}

/* ---- job 3: half conversions ------------------------------------------ */

static void fuzz_half(reader *r)
{
    size_t n = take8(r) % 80;
    size_t off = (take8(r) % 32);
    const ln_kernels *ks[3];
    const char *names[3];
    int n_isa = isa_list(ks, names);

    uint16_t *hv = malloc(2 * n + 2);
    uint32_t *fv = malloc(4 * n + 4);
    float *ref_f = malloc(4 * n + 4);
    uint16_t *ref_h = malloc(2 * n + 2);
    if (!hv || !fv || !ref_f || !ref_h)
        abort();
    for (size_t i = 0; i < n; i++) {
        hv[i] = (uint16_t)take16(r);
        fv[i] = (uint32_t)take16(r) | ((uint32_t)take16(r) << 16);
        ref_f[i] = ln_half_to_float(hv[i]);
        float f;
        memcpy(&f, &fv[i], 4);
        ref_h[i] = ln_float_to_half(f);
    }
    for (int k = 0; k < n_isa; k++) {
        buffer src16 = buf_new(2 * n, 2 * (off % 32)), dst32 = buf_new(4 * n, 4 * (off % 16));
        buffer src32 = buf_new(4 * n, 4 * (off % 16)), dst16 = buf_new(2 * n, 2 * (off % 32));
        memcpy(src16.p, hv, 2 * n);
        memcpy(src32.p, fv, 4 * n);
        ks[k]->half_to_float((const uint16_t *)src16.p, (float *)dst32.p, n);
        ks[k]->float_to_half((const float *)src32.p, (uint16_t *)dst16.p, n);
        same_bits("half_to_float (vs ln_half_to_float)", names[k], ref_f, dst32.p,
                  4 * n, 4);
        same_bits("float_to_half (vs ln_float_to_half)", names[k], ref_h, dst16.p,
                  2 * n, 2);
        unchanged("half src", src16.p, hv, 2 * n);
        unchanged("float src", src32.p, fv, 4 * n);
        buf_free(&src16);
        buf_free(&dst32);
        buf_free(&src32);
        buf_free(&dst16);
    }
    free(hv);
    free(fv);
    free(ref_f);
    free(ref_h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size};
    switch (take8(&r) % 5) {
    case 0:
    case 1:
        fuzz_row(&r);
        break;
    case 2:
    case 3:
        fuzz_batch(&r);
        break;
    default:
        fuzz_half(&r);
        break;
    }
    return 0;
}
