/*
 * ln_stage.h - staging: moving a row between its strided, typed place in
 * an operand and the contiguous, aligned row of the kernel's dtype. Every
 * op uses it for every row a kernel cannot read or write in place
 * (strided, misaligned, byte-swapped by the caller beforehand, or of a
 * narrower dtype than the result). Conversions are exact: they only ever
 * widen (the result dtype is the widest operand's), so a record's result
 * never depends on its layout.
 */
#ifndef LN_STAGE_H
#define LN_STAGE_H

#include "layernorm.h"

/* Can row r of op be read or written in place as `want`? Contiguous,
 * aligned to its item size, of that dtype. */
int ln_row_is_direct(const ln_operand *op, size_t r, ln_dtype want);
/* ... and so for every row (the row stride keeps the alignment). */
int ln_rows_are_direct(const ln_operand *op, ln_dtype want);

/* Row r of op as d contiguous values of `want`: the row itself when
 * direct, else a converted copy in buf (d items of `want`), made with the
 * level's vector conversion where the row is contiguous. */
const void *ln_stage_in(const ln_kernels *k, const ln_operand *op, size_t r, size_t d,
                        ln_dtype want, void *buf);

/* Write d values of op's dtype from buf to row r of op. */
void ln_stage_out(const void *buf, const ln_operand *op, size_t r, size_t d);

/* Records [r, r + n) of op, in its own dtype, into n contiguous rows of d
 * items at buf, and back: item j of all n records at a time, one run of
 * memory when the records lie next to each other (a Fortran-ordered
 * array), so that every line is moved once per tile of records. */
void ln_stage_tile_in(const ln_operand *op, size_t r, size_t n, size_t d, void *buf);
void ln_stage_tile_out(const void *buf, const ln_operand *op, size_t r, size_t n, size_t d);

/* Element (r, 0) of a per-record operand as a double (eps, statistics in). */
double ln_read_scalar(const ln_operand *op, size_t r);
/* Store v to element (r, 0) of a per-record operand, rounded to its dtype. */
void ln_write_scalar(const ln_operand *op, size_t r, double v);

#endif /* LN_STAGE_H */
