/*
 * layernorm.h - the kernel API of layernorm_c, in plain C.
 *
 * Nothing here knows about Python or NumPy: the glue lives in _coremodule.c.
 *
 * For one record r of d features:
 *     mean = sum(r) / d
 *     var  = sum((r - mean)^2) / d        (population variance, two passes)
 *     y    = (r - mean) / sqrt(var + eps) * weight + bias
 *
 * The order of every sum and the places where multiply-adds are fused are
 * fixed by ln_contract.h, so a record's result depends on its values alone.
 *
 * A batch (ln_job) is a set of records with arbitrary byte strides, run by
 * ln_batch_run on one instruction-set level's kernels (ln_kernels), on up
 * to n threads. Adding an op means a record kernel in ln_ops.h (written
 * once, instantiated per dtype), one entry in the kernel table, one in
 * ln_batch.c's op table and a row of _coremodule.c's gufunc table (see
 * docs/adding-an-op.rst).
 */
#ifndef LAYERNORM_H
#define LAYERNORM_H

#include <stddef.h>
#include <stdint.h>

#include "ln_accum.h"
#include "ln_contract.h"

/* Storage types of array elements. */
typedef enum {
    LN_F16 = 0,  /* IEEE binary16, computed in float */
    LN_BF16 = 1, /* bfloat16 (the top half of a binary32), computed in float */
    LN_F32 = 2,
    LN_F64 = 3,
    LN_NDTYPES = 4
} ln_dtype;

/* Bytes per element: 2, 4 or 8, always a power of two (the staging
 * checks test alignment with a mask). Inline: every call asks. */
static inline size_t ln_dtype_size(ln_dtype t)
{
    return t == LN_F64 ? 8 : (t == LN_F32 ? 4 : 2);
}
/* 1 for the dtypes computed in double (float64), 0 for float. */
int ln_dtype_is_double(ln_dtype t);
/* The dtype a storage dtype is computed in: float (LN_F32), or double for
 * float64. Parameters are staged to it. */
ln_dtype ln_compute_dtype(ln_dtype t);

/* One strided operand: element (r, i) lives at ptr + r * row + i * col.
 * Strides are in bytes and may be negative, or zero for broadcasting. */
typedef struct {
    char *ptr; /* NULL for an absent optional operand */
    ptrdiff_t row, col;
    ln_dtype dtype;
} ln_operand;

/* The ops. */
typedef enum {
    LN_OP_LAYER_NORM = 0,          /* x, [weight], [bias], eps -> y, [mean, var] */
    LN_OP_LAYER_NORM_BACKWARD = 1, /* dy, x, [weight], eps, [mean] -> dx, [dweight, dbias] */
    LN_OP_RMS_NORM = 2,            /* x, [weight], eps -> y, [mean (0), ms] */
    LN_OP_RMS_NORM_BACKWARD = 3,   /* dy, x, [weight], eps -> dx, [dweight] */
    LN_NOPS = 4
} ln_op;

/*
 * A batch: n_rows records of d features. The rows are computed in `dtype`
 * (the result dtype: operands of other dtypes are converted exactly, for
 * they are never wider). Which operands an op uses is listed with the op.
 */
typedef struct {
    ln_op op;
    ln_dtype dtype;
    size_t n_rows, d;
    ln_operand x;       /* input rows */
    ln_operand dy;      /* backward: the gradient of the output, rows like x */
    ln_operand w, b;    /* gain and bias: per feature (row stride 0) or per record */
    ln_operand eps;     /* one double per record (col unused) */
    ln_operand y;       /* output rows (y, or dx for the backward), of `dtype` */
    int y_new;          /* y was just allocated for this call, its pages never
                         * touched: written with plain stores (streamed, each
                         * first touch of a page costs more than it saves) */
    ln_operand mean, var; /* per-record statistics (col unused), may be absent:
                           * written by the forward; the backward reads mean */
    ln_acc *dw, *db;    /* backward: the sums over records, or NULL */
} ln_job;

/* Statistics of one record, in double. */
typedef struct {
    double mean;
    double var;
} ln_stats;

/* What a record kernel gets: n records (d >= 1 features each) whose rows
 * are contiguous, aligned and of the kernel's storage dtype (the batch
 * layer stages any other row), with parameters already in the compute type
 * (float or double). */
typedef struct ln_spare ln_spare;
typedef struct {
    size_t n, d;
    const void *x;
    ptrdiff_t x_row;      /* bytes between records */
    const void *dy;       /* backward: rows like x */
    ptrdiff_t dy_row;
    void *y;              /* y, or dx */
    ptrdiff_t y_row;
    const void *w, *b;    /* compute type, contiguous; NULL when absent */
    double w_max;         /* backward: max |w| (w is never NULL there) */
    const double *eps;    /* n values */
    const double *mean;   /* backward: n given means, or NULL to recompute */
    ln_stats *st;         /* n values, written */
    ln_acc *dw, *db;      /* backward: this worker's sums, or NULL */
    ln_spare *spare;      /* a spare row for rare paths, allocated on demand */
    int stream;           /* write y with non-temporal stores */
    int ahead;            /* a large call: the forward asks for the rows ahead
                           * while it writes (ln_ops.h, record_ahead) */
} ln_rows;

/* A spare row for callers of the record kernels other than ln_batch_run
 * (the kernel fuzzer): empty until a kernel needs it; NULL without memory.
 * One per thread at a time. */
ln_spare *ln_spare_new(void);
void ln_spare_free(ln_spare *spare);

/* Result codes (ln_batch_run returns the worst that occurred). */
#define LN_OK 0
#define LN_EBADEPS 1 /* some record had an invalid eps; it is NaN */
#define LN_ENOMEM 2  /* scratch memory could not be had; outputs unreliable */

typedef int (*ln_kernel)(const ln_rows *rows);

/* n contiguous, aligned values of one dtype converted exactly to a wider
 * one (for rows of mixed-dtype calls). */
typedef void (*ln_widen)(const void *src, void *dst, size_t n);

/* One instruction-set level: a record kernel per op and storage dtype. */
typedef struct {
    const char *name;
    ln_kernel op[LN_NOPS][LN_NDTYPES];
    /* widen[from][to]: NULL where `to` is not a wider compute type. */
    ln_widen widen[LN_NDTYPES][LN_NDTYPES];
    /* Order streamed (non-temporal) stores before the results are used. */
    void (*store_fence)(void);
} ln_kernels;

/* Designated initializers leave a forgotten table entry NULL without a
 * warning (-Wmissing-field-initializers does not see them), so the module
 * checks every level's table at import: 1 and the first hole's (op, dtype)
 * if one lacks a kernel (dtype -1: no store_fence), else 0. */
static inline int ln_kernels_missing(const ln_kernels *k, int *op, int *dtype)
{
    for (int o = 0; o < LN_NOPS; o++)
        for (int t = 0; t < LN_NDTYPES; t++)
            if (k->op[o][t] == NULL) {
                *op = o;
                *dtype = t;
                return 1;
            }
    *op = *dtype = -1;
    return k->store_fence == NULL || k->name == NULL;
}

/* Instruction-set levels, from the reference to the widest. */
typedef enum {
    LN_ISA_SCALAR = 0,   /* plain C, the reference of the contract */
    LN_ISA_PORTABLE = 1, /* lane-form C vectorized by the compiler */
    LN_ISA_AVX2 = 2,
    LN_ISA_AVX512 = 3,
    LN_NISAS = 4
} ln_isa;

/* GCC and Clang on x86-64 build the AVX2 and AVX-512 levels with target
 * pragmas; every other platform gets the scalar and portable levels. */
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define LN_HAVE_X86_LEVELS 1
#endif

extern const ln_kernels ln_kernels_scalar;
extern const ln_kernels ln_kernels_portable;
#if defined(LN_HAVE_X86_LEVELS)
extern const ln_kernels ln_kernels_avx2;
extern const ln_kernels ln_kernels_avx512;
#endif

/* Runtime dispatch (ln_dispatch.c). */
int ln_isa_supported(ln_isa isa);   /* 1 if this CPU and build can run it */
ln_isa ln_isa_best(void);           /* the default level */
const ln_kernels *ln_kernels_for(ln_isa isa);
const char *ln_isa_name(ln_isa isa);
int ln_isa_from_name(const char *name, ln_isa *isa); /* 0 on success */

#if defined(LN_HAVE_X86_LEVELS)
/* 1 when the CPU has AVX512-BF16 (set once, when the library is loaded,
 * before any thread can read it): the AVX-512 level then rounds whole
 * bfloat16 rows with its conversion instruction (ln_x86.h). */
extern int ln_cpu_bf16_convert;
#endif

/* Run a batch with up to n_threads threads (records split, never a
 * record). Small batches run on the calling thread. */
int ln_batch_run(const ln_kernels *k, const ln_job *job, int n_threads);

/* Bytes of input (x) below which ln_batch_run never starts threads: a
 * backward call's threshold, the smaller one (a forward starts them from
 * 2 MiB). */
size_t ln_thread_threshold(void);

#endif /* LAYERNORM_H */
