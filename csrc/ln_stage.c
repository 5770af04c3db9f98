/*
 * ln_stage.c - staging rows into and out of scratch (see ln_stage.h).
 * Element reads and writes go through memcpy: operands may be misaligned.
 */
#include <string.h>

#include "ln_half.h"
#include "ln_stage.h"
#include "ln_tmpl.h"

int ln_dtype_is_double(ln_dtype t)
{
    return t == LN_F64;
}

ln_dtype ln_compute_dtype(ln_dtype t)
{
    return t == LN_F64 ? LN_F64 : LN_F32;
}

static char *row_ptr(const ln_operand *op, size_t r)
{
    return op->ptr + (ptrdiff_t)r * op->row;
}

/* Alignment by mask, not by %: a division by a variable costs tens of
 * cycles, several times per call, which a one-record call notices. */
int ln_row_is_direct(const ln_operand *op, size_t r, ln_dtype want)
{
    size_t isz = ln_dtype_size(want);
    return op->dtype == want && op->col == (ptrdiff_t)isz &&
           ((uintptr_t)row_ptr(op, r) & (isz - 1)) == 0;
}

int ln_rows_are_direct(const ln_operand *op, ln_dtype want)
{
    size_t isz = ln_dtype_size(want);
    return ln_row_is_direct(op, 0, want) && ((size_t)op->row & (isz - 1)) == 0;
}

/* One element as float or double, exactly (16-bit and float values are
 * all representable in both). */
static float elem_as_float(const char *p, ln_dtype t)
{
    uint16_t h;
    float f;
    switch (t) {
    case LN_F16:
        memcpy(&h, p, sizeof h);
        return ln_half_to_float(h);
    case LN_BF16:
        memcpy(&h, p, sizeof h);
        return ln_bf16_to_float(h);
    default:
        memcpy(&f, p, sizeof f);
        return f;
    }
}

static double elem_as_double(const char *p, ln_dtype t)
{
    double v;
    if (t != LN_F64)
        return (double)elem_as_float(p, t);
    memcpy(&v, p, sizeof v);
    return v;
}

/* n items of isz bytes, from src (items scol bytes apart) to dst (dcol
 * apart). */
static inline void copy_items(char *dst, ptrdiff_t dcol, const char *src, ptrdiff_t scol,
                              size_t isz, size_t n)
{
    for (size_t i = 0; i < n; i++)
        memcpy(dst + (ptrdiff_t)i * dcol, src + (ptrdiff_t)i * scol, isz);
}

/* The same with the item size a constant in each call, so that every
 * copy is one load and one store: a memcpy of a variable size is a call
 * per item, and the strided records of a Fortran-ordered array were
 * staged at about 5 ns an item. */
static void copy_strided(char *dst, ptrdiff_t dcol, const char *src, ptrdiff_t scol,
                         size_t isz, size_t n)
{
    if (isz == 2)
        copy_items(dst, dcol, src, scol, 2, n);
    else if (isz == 4)
        copy_items(dst, dcol, src, scol, 4, n);
    else if (isz == 8)
        copy_items(dst, dcol, src, scol, 8, n);
    else
        copy_items(dst, dcol, src, scol, isz, n);
}

/* n items of `from` at src (stride col) into dst as `to` (never narrower:
 * same type, or float/double from a narrower type). */
static void convert(const char *src, ptrdiff_t col, ln_dtype from, void *dst,
                    ln_dtype to, size_t n)
{
    size_t isz = ln_dtype_size(from);
    if (from == to) {
        char *out = dst;
        if (col == (ptrdiff_t)isz)
            memcpy(out, src, n * isz);
        else
            copy_strided(out, (ptrdiff_t)isz, src, col, isz, n);
    } else if (from == LN_F32 && to == LN_F64 && col == 4 && (uintptr_t)src % 4 == 0) {
        /* The common mixed call (float32 x, float64 parameters): a plain
         * loop the compiler vectorizes. */
        const float *in = (const float *)src;
        double *out = dst;
        for (size_t i = 0; i < n; i++)
            out[i] = (double)in[i];
    } else if (to == LN_F64) {
        double *out = dst;
        for (size_t i = 0; i < n; i++)
            out[i] = elem_as_double(src + (ptrdiff_t)i * col, from);
    } else {
        float *out = dst;
        for (size_t i = 0; i < n; i++)
            out[i] = elem_as_float(src + (ptrdiff_t)i * col, from);
    }
}

const void *ln_stage_in(const ln_kernels *k, const ln_operand *op, size_t r, size_t d,
                        ln_dtype want, void *buf)
{
    if (ln_row_is_direct(op, r, want))
        return row_ptr(op, r);
    ln_widen widen = k->widen[op->dtype][want];
    if (widen && ln_row_is_direct(op, r, op->dtype)) {
        widen(row_ptr(op, r), buf, d);
        return buf;
    }
    convert(row_ptr(op, r), op->col, op->dtype, buf, want, d);
    return buf;
}

void ln_stage_out(const void *buf, const ln_operand *op, size_t r, size_t d)
{
    size_t isz = ln_dtype_size(op->dtype);
    char *dst = row_ptr(op, r);
    const char *in = buf;
    if (op->col == (ptrdiff_t)isz) {
        memcpy(dst, in, d * isz);
        return;
    }
    copy_strided(dst, op->col, in, (ptrdiff_t)isz, isz, d);
}

void ln_stage_tile_in(const ln_operand *op, size_t r, size_t n, size_t d, void *buf)
{
    size_t isz = ln_dtype_size(op->dtype);
    const char *src = row_ptr(op, r);
    for (size_t j = 0; j < d; j++)
        copy_strided((char *)buf + j * isz, (ptrdiff_t)(d * isz), src + (ptrdiff_t)j * op->col,
                     op->row, isz, n);
}

void ln_stage_tile_out(const void *buf, const ln_operand *op, size_t r, size_t n, size_t d)
{
    size_t isz = ln_dtype_size(op->dtype);
    char *dst = row_ptr(op, r);
    for (size_t j = 0; j < d; j++)
        copy_strided(dst + (ptrdiff_t)j * op->col, op->row, (const char *)buf + j * isz,
                     (ptrdiff_t)(d * isz), isz, n);
}

double ln_read_scalar(const ln_operand *op, size_t r)
{
    return elem_as_double(row_ptr(op, r), op->dtype);
}

void ln_write_scalar(const ln_operand *op, size_t r, double v)
{
    char *p = row_ptr(op, r);
    float f = ln_double_to_float_odd(v); /* then rounded once to a 16-bit type */
    uint16_t h;
    switch (op->dtype) {
    case LN_F64:
        memcpy(p, &v, sizeof v);
        break;
    case LN_F32:
        f = (float)v;
        memcpy(p, &f, sizeof f);
        break;
    case LN_F16:
        h = ln_float_to_half(f);
        memcpy(p, &h, sizeof h);
        break;
    case LN_BF16:
        h = ln_float_to_bf16(f);
        memcpy(p, &h, sizeof h);
        break;
    default:
        break;
    }
}
