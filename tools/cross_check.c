/*
 * cross_check.c - the self-test driver of tools/cross_check.sh: runs a fixed,
 * deterministic corpus of batches through ln_batch_run on every
 * instruction-set level this build and CPU support, and writes what each
 * level computed (return codes, y, mean, var) to a binary file per level,
 * with a text file of one hash per case beside it. Built natively (x86-64:
 * scalar, portable, avx2, avx512) and for aarch64 (scalar, portable = NEON),
 * the files of every level of both must be identical byte for byte: the
 * reproducibility contract across architectures (csrc/ln_contract.h).
 *
 *   cross_check OUTDIR ARCH       writes OUTDIR/ARCH-LEVEL.bin and .sums
 *   cross_check --show CASE LEVEL prints the case and its outputs in words
 *   cross_check --count           prints the number of cases
 *
 * The corpus: d = 1..64, then 65 ... 70000 (block and lane edges, 4097,
 * 65536, 70000), every storage dtype (float16, bfloat16, float32, float64),
 * eleven value families (ordinary values; offsets 1e2, 1e4, 1e6; tiny and
 * huge magnitudes: 1e-30/1e30 in float32, 1e-300/1e200 in float64;
 * subnormals; NaN/infinities in records; constant records; mixed exponents;
 * a small spread on a large offset), with and without weight/bias, eps 0 and
 * 1e-5 (and now and then an invalid eps), x narrower than the job dtype and
 * parameters of any dtype no wider, strided, reversed, misaligned,
 * column-major and in-place layouts, and batches large enough for two
 * threads. Most cases are LayerNorm; one in eight each is RMSNorm,
 * LayerNorm's backward (means given or recomputed) and RMSNorm's backward
 * (dx, and the exact dweight/dbias sums: their state's hash and values). Values are made with exact operations only (integers, powers of
 * two, one rounding to the storage type), so both builds see the same bits.
 *
 * Plain C11 and the kernel API (csrc/layernorm.h); no Python.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "layernorm.h"
#include "ln_half.h"

/* ---- deterministic numbers --------------------------------------------- */

typedef struct {
    uint64_t s;
} rng;

static uint64_t next_u64(rng *g)
{
    uint64_t z = (g->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* An integer in [lo, hi]. */
static int64_t irange(rng *g, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(next_u64(g) % (uint64_t)(hi - lo + 1));
}

/* ---- dtypes ------------------------------------------------------------ */

#include "ln_values.h" /* dtype_names, put_value, get_value */

/* Store raw bits (the low ln_dtype_size(t) bytes of u). */
static void put_bits(uint64_t u, ln_dtype t, void *dst)
{
    uint16_t h = (uint16_t)u;
    uint32_t w = (uint32_t)u;
    switch (ln_dtype_size(t)) {
    case 8:
        memcpy(dst, &u, 8);
        break;
    case 4:
        memcpy(dst, &w, 4);
        break;
    default:
        memcpy(dst, &h, 2);
        break;
    }
}

/* ---- value families ---------------------------------------------------- */

enum {
    FAM_NORMAL,       /* values in about [-4, 4] */
    FAM_OFFSET_1E2,   /* 100 + ordinary values */
    FAM_OFFSET_1E4,
    FAM_OFFSET_1E6,
    FAM_TINY,         /* magnitudes near 1e-30 (float32) / 1e-300 (float64) */
    FAM_HUGE,         /* near 1e30 / 1e200 */
    FAM_SUBNORMAL,    /* subnormals of the storage type */
    FAM_NANINF,       /* NaN (quiet, signalling, with payloads) and infinities */
    FAM_CONSTANT,     /* equal values: var = 0 */
    FAM_MIXED_EXP,    /* exponents spread over +-60 */
    FAM_TIGHT_OFFSET, /* 1e4 + a tiny spread */
    NFAM
};

static const char *const family_names[NFAM] = {
    "ordinary", "offset 1e2", "offset 1e4", "offset 1e6", "tiny", "huge", "subnormal",
    "NaN/inf", "constant", "mixed exponents", "tight offset"};

/* Scale of the tiny / huge families for a storage type. */
static double tiny_of(ln_dtype t)
{
    return t == LN_F64 ? 1e-300 : (t == LN_F16 ? ldexp(1.0, -20) : 1e-30);
}

static double huge_of(ln_dtype t)
{
    return t == LN_F64 ? 1e200 : (t == LN_F16 ? ldexp(1.0, 14) : 1e30);
}

static int subnormal_exp(ln_dtype t)
{
    return t == LN_F64 ? -1074 : (t == LN_F16 ? -24 : -149);
}

/* A quiet NaN with a payload, a signalling NaN, +inf, -inf. */
static uint64_t special_bits(ln_dtype t, int which)
{
    static const uint64_t bits[LN_NDTYPES][4] = {
        [LN_F16] = {0x7e01u, 0xfc01u, 0x7c00u, 0xfc00u},
        [LN_BF16] = {0x7fc1u, 0xff81u, 0x7f80u, 0xff80u},
        [LN_F32] = {0x7fc00123u, 0xff800001u, 0x7f800000u, 0xff800000u},
        [LN_F64] = {0x7ff8000000000123ull, 0xfff0000000000001ull, 0x7ff0000000000000ull,
                    0xfff0000000000000ull},
    };
    return bits[t][which];
}

/* Record r (n values of t at p, packed) of family fam. */
static void make_record(rng *g, int fam, ln_dtype t, size_t n, size_t r, char *p)
{
    size_t isz = ln_dtype_size(t);
    double c = (double)irange(g, -64, 64) / 8.0; /* a constant for the record */
    for (size_t i = 0; i < n; i++) {
        double k = (double)irange(g, -(1 << 20), 1 << 20);
        double v;
        switch (fam) {
        case FAM_NORMAL:
        case FAM_NANINF:
            v = k * 0x1p-18;
            break;
        case FAM_OFFSET_1E2:
            v = 100.0 + k * 0x1p-18;
            break;
        case FAM_OFFSET_1E4:
            v = 1e4 + k * 0x1p-18;
            break;
        case FAM_OFFSET_1E6:
            v = 1e6 + k * 0x1p-18;
            break;
        case FAM_TINY:
            v = tiny_of(t) * (1.0 + k * 0x1p-22);
            break;
        case FAM_HUGE:
            v = huge_of(t) * (k * 0x1p-20);
            break;
        case FAM_SUBNORMAL:
            v = ldexp(k, subnormal_exp(t) - 10); /* rounds to a few ulps of subnormal */
            break;
        case FAM_CONSTANT:
            v = c;
            break;
        case FAM_MIXED_EXP:
            v = ldexp(k, (int)irange(g, -80, 40));
            break;
        default: /* FAM_TIGHT_OFFSET */
            v = 1e4 + k * 0x1p-30;
            break;
        }
        put_value(v, t, p + i * isz);
    }
    if (fam == FAM_NANINF && n > 0) {
        /* record by record: a quiet NaN, a signalling NaN, +inf, +inf and
         * -inf, nothing (a finite record between NaN records) */
        size_t at = (size_t)irange(g, 0, (int64_t)n - 1);
        switch (r % 5) {
        case 0: put_bits(special_bits(t, 0), t, p + at * isz); break;
        case 1: put_bits(special_bits(t, 1), t, p + at * isz); break;
        case 2: put_bits(special_bits(t, 2), t, p + at * isz); break;
        case 3:
            put_bits(special_bits(t, 2), t, p + at * isz);
            put_bits(special_bits(t, 3), t, p + (n - 1 - at) * isz);
            break;
        default: break;
        }
    }
}

/* ---- cases ------------------------------------------------------------- */

enum { LAYOUT_PACKED, LAYOUT_STRIDED, LAYOUT_REVERSED, LAYOUT_MISALIGNED, LAYOUT_COLMAJOR,
       LAYOUT_IN_PLACE, NLAYOUTS };

static const char *const layout_names[NLAYOUTS] = {
    "packed", "strided (col 2 items, weight reversed)", "reversed rows, per-record parameters",
    "misaligned (odd byte offsets), eps broadcast", "column-major", "in place (y = x, row gap)"};

static const char *const op_names[LN_NOPS] = {
    [LN_OP_LAYER_NORM] = "layer_norm", [LN_OP_LAYER_NORM_BACKWARD] = "layer_norm_backward",
    [LN_OP_RMS_NORM] = "rms_norm", [LN_OP_RMS_NORM_BACKWARD] = "rms_norm_backward"};

static int is_backward(ln_op op)
{
    return op == LN_OP_LAYER_NORM_BACKWARD || op == LN_OP_RMS_NORM_BACKWARD;
}

typedef struct {
    int index;
    ln_op op;
    int given_mean; /* LayerNorm's backward: the forward's mean passed in */
    ln_dtype t, xt, wt, bt, st;
    size_t d, rows;
    int fam, has_w, has_b, layout, threads, bad_eps;
    double eps;
    uint64_t seed;
} cc_case;

static const size_t large_d[] = {65,   96,   127,  128,  129,  200,  255,   256,  257,
                                 300,  511,  512,  513,  768,  1000, 1023,  1024, 1025,
                                 2048, 4095, 4096, 4097, 8191, 65536, 70000};
#define N_SMALL_D 64
#define N_D (N_SMALL_D + sizeof large_d / sizeof large_d[0])

/* Batches of 2 MiB and more: ln_batch_run starts threads for them. */
static const struct {
    ln_dtype t, xt;
    size_t d, rows;
} big_cases[] = {
    {LN_F32, LN_F32, 65536, 9}, {LN_F64, LN_F64, 70000, 4}, {LN_F16, LN_F16, 4097, 300},
    {LN_BF16, LN_BF16, 1000, 1100}, {LN_F32, LN_F16, 768, 800}, {LN_F64, LN_F32, 257, 1100},
    {LN_F32, LN_F32, 16, 20000}, /* short records' backward in groups, across spills */
};
#define N_BIG (sizeof big_cases / sizeof big_cases[0])

static int n_cases(void)
{
    return (int)(N_D * LN_NDTYPES * NFAM + N_BIG);
}

/* The dtypes no wider than t (x: strictly narrower, or t). */
static ln_dtype narrower(ln_dtype t, unsigned pick, int strict)
{
    ln_dtype c[LN_NDTYPES];
    unsigned n = 0;
    c[n++] = t;
    for (int u = 0; u < LN_NDTYPES; u++) {
        size_t us = ln_dtype_size((ln_dtype)u), ts = ln_dtype_size(t);
        if (u != (int)t && (strict ? us < ts : us <= ts))
            c[n++] = (ln_dtype)u;
    }
    return c[pick % n];
}

static cc_case case_of(int i)
{
    cc_case c;
    memset(&c, 0, sizeof c);
    c.index = i;
    c.seed = 0x5eed0000ull + (uint64_t)i * 0x100000001b3ull;
    if (i >= (int)(N_D * LN_NDTYPES * NFAM)) {
        int b = i - (int)(N_D * LN_NDTYPES * NFAM);
        c.t = big_cases[b].t;
        c.xt = big_cases[b].xt;
        c.wt = c.bt = c.t;
        c.st = c.t == LN_F64 ? LN_F64 : LN_F32;
        c.d = big_cases[b].d;
        c.rows = big_cases[b].rows;
        c.fam = b % 2 ? FAM_OFFSET_1E2 : FAM_NORMAL;
        c.has_w = c.has_b = 1;
        c.layout = b % 3 == 2 ? LAYOUT_STRIDED : LAYOUT_PACKED;
        c.threads = 2;
        c.eps = 1e-5;
        c.op = b == 4 || b == 6 ? LN_OP_LAYER_NORM_BACKWARD : LN_OP_LAYER_NORM;
        return c;
    }
    int di = i / (LN_NDTYPES * NFAM);
    c.t = (ln_dtype)(i / NFAM % LN_NDTYPES);
    c.fam = i % NFAM;
    c.d = di < N_SMALL_D ? (size_t)di + 1 : large_d[di - N_SMALL_D];
    c.rows = c.d <= 64 ? 5 : (c.d <= 1025 ? 3 : (c.d <= 8191 ? 2 : 1));
    unsigned k = (unsigned)(di * 7 + c.fam * 3 + (int)c.t); /* spreads the combinations */
    c.has_w = k % 4 == 1 || k % 4 == 3;
    c.has_b = k % 4 >= 2;
    c.eps = (k / 4 + (unsigned)c.fam) % 2 ? 1e-5 : 0.0;
    c.layout = (int)((k / 2 + (unsigned)di) % NLAYOUTS);
    c.xt = narrower(c.t, k / 3, 1);
    c.wt = narrower(c.t, k / 5, 0);
    c.bt = narrower(c.t, k / 7, 0);
    if (c.layout == LAYOUT_IN_PLACE && c.xt != c.t)
        c.layout = LAYOUT_PACKED;
    c.st = c.t == LN_F64 || k % 3 == 0 ? LN_F64 : LN_F32;
    c.threads = 1 + (int)(k % 2);
    c.bad_eps = i % 37 == 5; /* the last record gets eps = -1 */
    /* The op: LayerNorm most of the time, then RMSNorm and both backwards
     * (drawn from the case's seed: every family, dtype and d meets every op). */
    static const ln_op ops[8] = {LN_OP_LAYER_NORM, LN_OP_LAYER_NORM, LN_OP_LAYER_NORM,
                                 LN_OP_LAYER_NORM, LN_OP_LAYER_NORM, LN_OP_RMS_NORM,
                                 LN_OP_LAYER_NORM_BACKWARD, LN_OP_RMS_NORM_BACKWARD};
    rng pick = {c.seed ^ 0x0b5ull};
    c.op = ops[next_u64(&pick) % 8];
    if (c.op == LN_OP_RMS_NORM || c.op == LN_OP_RMS_NORM_BACKWARD)
        c.has_b = 0; /* no bias in RMSNorm */
    if (is_backward(c.op)) {
        c.has_b = 0; /* the backward takes no bias */
        c.given_mean = c.op == LN_OP_LAYER_NORM_BACKWARD && k % 2;
        if (c.layout == LAYOUT_IN_PLACE)
            c.layout = LAYOUT_PACKED;
    }
    return c;
}

static void describe(const cc_case *c, char *buf, size_t n)
{
    snprintf(buf, n,
             "case %d: %s%s, %s job, d=%zu, %zu records, x %s, weight %s, bias %s, eps %g%s, "
             "values %s, layout %s, mean/var %s, %d thread%s",
             c->index, op_names[c->op], c->given_mean ? " (mean given)" : "",
             dtype_names[c->t], c->d, c->rows, dtype_names[c->xt],
             c->has_w ? dtype_names[c->wt] : "none", c->has_b ? dtype_names[c->bt] : "none",
             c->eps, c->bad_eps ? " (last record -1)" : "", family_names[c->fam],
             layout_names[c->layout], dtype_names[c->st], c->threads, c->threads > 1 ? "s" : "");
}

static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* ---- running a case ----------------------------------------------------- */

/* A strided operand over its own buffer. */
typedef struct {
    char *block, *origin;
    size_t bytes;
    ptrdiff_t row, col;
    ln_dtype t;
} buf_op;

static void *xcalloc(size_t n)
{
    void *p = calloc(n ? n : 1, 1);
    if (p == NULL) {
        fprintf(stderr, "cross_check: out of memory\n");
        exit(2);
    }
    return p;
}

/* rows x cols items at (row, col) byte strides, `pad` bytes of offset. */
static buf_op op_new(size_t rows, size_t cols, ptrdiff_t row, ptrdiff_t col, ln_dtype t,
                     size_t pad)
{
    buf_op o;
    ptrdiff_t lo = 0, hi = 0, isz = (ptrdiff_t)ln_dtype_size(t);
    if (rows > 0 && cols > 0) {
        ptrdiff_t re = (ptrdiff_t)(rows - 1) * row, ce = (ptrdiff_t)(cols - 1) * col;
        lo = (re < 0 ? re : 0) + (ce < 0 ? ce : 0);
        hi = (re > 0 ? re : 0) + (ce > 0 ? ce : 0) + isz;
    }
    o.bytes = (size_t)(hi - lo) + pad + 64;
    o.block = xcalloc(o.bytes);
    /* 64-byte aligned base (calloc gives 16), then the pad */
    char *base = (char *)(((uintptr_t)o.block + 63) & ~(uintptr_t)63);
    o.origin = base + pad - lo;
    o.row = row;
    o.col = col;
    o.t = t;
    return o;
}

static char *at(const buf_op *o, size_t r, size_t c)
{
    return o->origin + (ptrdiff_t)r * o->row + (ptrdiff_t)c * o->col;
}

static ln_operand as_ln(const buf_op *o, int present)
{
    ln_operand op = {.ptr = present ? o->origin : NULL, .row = o->row, .col = o->col,
                     .dtype = o->t};
    return op;
}

/* Layout of an operand of rows x d items of t. */
static void layout_of(int layout, int which, size_t rows, size_t d, ln_dtype t,
                      ptrdiff_t *row, ptrdiff_t *col, size_t *pad)
{
    ptrdiff_t isz = (ptrdiff_t)ln_dtype_size(t);
    *pad = 0;
    *col = isz;
    *row = (ptrdiff_t)d * isz;
    switch (layout) {
    case LAYOUT_STRIDED:
        if (which == 0) {
            *col = 2 * isz;
            *row = 2 * (ptrdiff_t)d * isz + isz;
        }
        break;
    case LAYOUT_REVERSED:
        *row = -(ptrdiff_t)d * isz;
        break;
    case LAYOUT_MISALIGNED:
        *pad = which == 0 ? 1 : 3;
        *row = (ptrdiff_t)d * isz + 1;
        break;
    case LAYOUT_COLMAJOR:
        *col = (ptrdiff_t)rows * isz;
        *row = isz;
        break;
    case LAYOUT_IN_PLACE:
        *row = (ptrdiff_t)(d + 3) * isz;
        break;
    default:
        break;
    }
}

typedef struct {
    unsigned char *data;
    size_t n, cap;
} bytes;

static void emit(bytes *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->data = realloc(b->data, b->cap);
        if (b->data == NULL) {
            fprintf(stderr, "cross_check: out of memory\n");
            exit(2);
        }
    }
    memcpy(b->data + b->n, p, n);
    b->n += n;
}

typedef struct {
    buf_op x, dy, w, b, eps;
} case_inputs;

static case_inputs inputs_new(const cc_case *c)
{
    case_inputs in;
    rng g = {c->seed};
    ptrdiff_t row, col;
    size_t pad;
    size_t xsz = ln_dtype_size(c->xt);
    layout_of(c->layout, 0, c->rows, c->d, c->xt, &row, &col, &pad);
    in.x = op_new(c->rows, c->d, row, col, c->xt, pad);
    char *rec = xcalloc(c->d * 8);
    for (size_t r = 0; r < c->rows; r++) {
        make_record(&g, c->fam, c->xt, c->d, r, rec);
        for (size_t i = 0; i < c->d; i++)
            memcpy(at(&in.x, r, i), rec + i * xsz, xsz);
    }
    /* weight and bias: shared (row stride 0), reversed, or per record */
    for (int p = 0; p < 2; p++) {
        ln_dtype pt = p == 0 ? c->wt : c->bt;
        ptrdiff_t psz = (ptrdiff_t)ln_dtype_size(pt);
        size_t prow = c->layout == LAYOUT_REVERSED ? c->rows : 1;
        ptrdiff_t pr = c->layout == LAYOUT_REVERSED ? (ptrdiff_t)c->d * psz : 0;
        ptrdiff_t pc = c->layout == LAYOUT_STRIDED && p == 0 ? -psz : psz;
        buf_op o = op_new(prow, c->d, pr, pc, pt, c->layout == LAYOUT_MISALIGNED ? 5 : 0);
        o.row = pr;
        for (size_t r = 0; r < prow; r++)
            for (size_t i = 0; i < c->d; i++) {
                double v = p == 0 ? 1.0 + (double)irange(&g, -2048, 2048) * 0x1p-11
                                  : (double)irange(&g, -4096, 4096) * 0x1p-10;
                put_value(v, pt, at(&o, r, i));
            }
        if (p == 0)
            in.w = o;
        else
            in.b = o;
    }
    int bcast = c->layout == LAYOUT_MISALIGNED;
    in.eps = op_new(bcast ? 1 : c->rows, 1, bcast ? 0 : 8, 8, LN_F64, 0);
    for (size_t r = 0; r < (bcast ? 1 : c->rows); r++) {
        double e = c->bad_eps && r + 1 == c->rows && !bcast ? -1.0 : c->eps;
        memcpy(at(&in.eps, r, 0), &e, 8);
    }
    /* the backward's dy: ordinary values, laid out like x */
    in.dy = op_new(c->rows, c->d, in.x.row, in.x.col, c->xt, c->layout == LAYOUT_MISALIGNED);
    for (size_t r = 0; r < c->rows; r++) {
        make_record(&g, FAM_NORMAL, c->xt, c->d, r, rec);
        for (size_t i = 0; i < c->d; i++)
            memcpy(at(&in.dy, r, i), rec + i * xsz, xsz);
    }
    free(rec);
    return in;
}

static void inputs_free(case_inputs *in)
{
    free(in->x.block);
    free(in->dy.block);
    free(in->w.block);
    free(in->b.block);
    free(in->eps.block);
}

/* Run case c on level k; append rc, then per record y (packed), mean, var. */
static void run_case(const cc_case *c, const case_inputs *in, const ln_kernels *k, bytes *out)
{
    ptrdiff_t row, col;
    size_t pad;
    buf_op y, mean, var;
    buf_op x = in->x;
    char *x_copy = NULL;
    if (c->layout == LAYOUT_IN_PLACE) {
        /* y = x: a copy of x, overwritten by the kernels */
        x.block = xcalloc(in->x.bytes);
        memcpy(x.block, in->x.block, in->x.bytes);
        x.origin = x.block + (in->x.origin - in->x.block);
        y = x;
        x_copy = x.block;
    } else {
        layout_of(c->layout, 1, c->rows, c->d, c->t, &row, &col, &pad);
        y = op_new(c->rows, c->d, row, col, c->t, pad);
    }
    size_t ssz = ln_dtype_size(c->st);
    mean = op_new(c->rows, 1, (ptrdiff_t)ssz, 0, c->st, 0);
    var = op_new(c->rows, 1, -(ptrdiff_t)ssz, 0, c->st, 0);
    int back = is_backward(c->op);
    ln_job job = {
        .op = c->op, .dtype = c->t, .n_rows = c->rows, .d = c->d,
        .x = as_ln(&x, 1), .w = as_ln(&in->w, c->has_w), .b = as_ln(&in->b, c->has_b),
        .eps = as_ln(&in->eps, 1), .y = as_ln(&y, 1),
        .mean = as_ln(&mean, !back), .var = as_ln(&var, !back),
    };
    ln_acc dw, db;
    int32_t rc = 0;
    if (back) {
        if (c->given_mean) { /* the forward's mean, by the same level */
            ln_job fwd = job;
            fwd.op = LN_OP_LAYER_NORM;
            fwd.mean = as_ln(&mean, 1);
            fwd.var = as_ln(&var, 1);
            rc = ln_batch_run(k, &fwd, c->threads);
            job.mean = as_ln(&mean, 1);
        }
        job.dy = as_ln(&in->dy, 1);
        if (ln_acc_init(&dw, c->d) != 0 || ln_acc_init(&db, c->d) != 0) {
            fprintf(stderr, "cross_check: out of memory\n");
            exit(2);
        }
        job.dw = &dw;
        job.db = c->op == LN_OP_LAYER_NORM_BACKWARD ? &db : NULL;
    }
    int32_t rc2 = ln_batch_run(k, &job, c->threads);
    rc = rc > rc2 ? rc : rc2;
    int32_t idx = c->index;
    emit(out, &idx, 4);
    emit(out, &rc, 4);
    size_t isz = ln_dtype_size(c->t);
    for (size_t r = 0; r < c->rows; r++) {
        for (size_t i = 0; i < c->d; i++)
            emit(out, at(&y, r, i), isz);
        if (!back) {
            emit(out, at(&mean, r, 0), ssz);
            emit(out, at(&var, r, 0), ssz);
        }
    }
    if (back) {
        /* dweight (and dbias): the exact sums' state, then rounded once */
        double *v = xcalloc(c->d * sizeof *v);
        uint64_t *words = xcalloc(c->d * LN_ACC_STATE_WORDS * sizeof *words);
        for (int s = 0; s < (c->op == LN_OP_LAYER_NORM_BACKWARD ? 2 : 1); s++) {
            ln_acc *a = s ? &db : &dw;
            ln_acc_export(a, words); /* the exact state, as one hash */
            uint64_t h = fnv1a((const unsigned char *)words,
                               c->d * LN_ACC_STATE_WORDS * sizeof *words);
            emit(out, &h, 8);
            ln_acc_value(a, v, 53);
            emit(out, v, c->d * sizeof *v);
        }
        free(v);
        free(words);
        ln_acc_free(&dw);
        ln_acc_free(&db);
    }
    if (x_copy)
        free(x_copy);
    else
        free(y.block);
    free(mean.block);
    free(var.block);
}

/* ---- main --------------------------------------------------------------- */

static int levels(const ln_kernels **ks, const char **names)
{
    int n = 0;
    for (int i = 0; i < (int)LN_NISAS; i++)
        if (ln_isa_supported((ln_isa)i)) {
            ks[n] = ln_kernels_for((ln_isa)i);
            names[n++] = ln_isa_name((ln_isa)i);
        }
    return n;
}

/* --show CASE LEVEL: the case and its outputs, one item a line. */
static int show(int i, const char *level)
{
    ln_isa isa;
    if (i < 0 || i >= n_cases() || ln_isa_from_name(level, &isa) != 0 || !ln_isa_supported(isa)) {
        fprintf(stderr, "cross_check: no case %d or level %s here\n", i, level);
        return 2;
    }
    cc_case c = case_of(i);
    char desc[512];
    describe(&c, desc, sizeof desc);
    printf("%s\n", desc);
    case_inputs in = inputs_new(&c);
    bytes out = {NULL, 0, 0};
    run_case(&c, &in, ln_kernels_for(isa), &out);
    int32_t rc;
    memcpy(&rc, out.data + 4, 4);
    printf("return code %d\n", (int)rc);
    size_t isz = ln_dtype_size(c.t), ssz = ln_dtype_size(c.st), pos = 8;
    int back = is_backward(c.op);
    for (size_t r = 0; r < c.rows; r++) {
        for (size_t k = 0; k < c.d; k++, pos += isz) {
            uint64_t u = 0;
            memcpy(&u, out.data + pos, isz);
            printf("record %zu %s[%zu] = 0x%0*" PRIx64 " %.17g   x = %.17g\n", r,
                   back ? "dx" : "y", k, (int)(2 * isz), u, get_value(out.data + pos, c.t),
                   get_value(at(&in.x, r, k), c.xt));
        }
        for (int s = 0; s < 2 && !back; s++, pos += ssz) {
            uint64_t u = 0;
            memcpy(&u, out.data + pos, ssz);
            printf("record %zu %s = 0x%0*" PRIx64 " %.17g\n", r, s ? "var" : "mean",
                   (int)(2 * ssz), u, get_value(out.data + pos, c.st));
        }
    }
    for (int s = 0; back && s < (c.op == LN_OP_LAYER_NORM_BACKWARD ? 2 : 1); s++) {
        const char *name = s ? "dbias" : "dweight";
        uint64_t h;
        memcpy(&h, out.data + pos, 8);
        pos += 8;
        printf("%s: hash of the exact sums' state 0x%016" PRIx64 "\n", name, h);
        for (size_t k = 0; k < c.d; k++, pos += 8) {
            uint64_t u;
            memcpy(&u, out.data + pos, 8);
            printf("%s[%zu] = 0x%016" PRIx64 " %.17g\n", name, k, u, get_value(out.data + pos, LN_F64));
        }
    }
    free(out.data);
    inputs_free(&in);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--count") == 0) {
        printf("%d\n", n_cases());
        return 0;
    }
    if (argc == 4 && strcmp(argv[1], "--show") == 0)
        return show(atoi(argv[2]), argv[3]);
    if (argc != 3) {
        fprintf(stderr, "usage: cross_check OUTDIR ARCH | --show CASE LEVEL | --count\n");
        return 2;
    }
    const ln_kernels *ks[LN_NISAS];
    const char *names[LN_NISAS];
    int nl = levels(ks, names);
    FILE *bin[LN_NISAS], *sums[LN_NISAS];
    for (int l = 0; l < nl; l++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s-%s.bin", argv[1], argv[2], names[l]);
        bin[l] = fopen(path, "wb");
        snprintf(path, sizeof path, "%s/%s-%s.sums", argv[1], argv[2], names[l]);
        sums[l] = fopen(path, "w");
        if (!bin[l] || !sums[l]) {
            fprintf(stderr, "cross_check: cannot write %s\n", path);
            return 2;
        }
    }
    size_t total = 0, items = 0;
    int n = n_cases();
    for (int i = 0; i < n; i++) {
        cc_case c = case_of(i);
        char desc[512];
        describe(&c, desc, sizeof desc);
        case_inputs in = inputs_new(&c);
        items += c.rows * c.d;
        for (int l = 0; l < nl; l++) {
            bytes out = {NULL, 0, 0};
            run_case(&c, &in, ks[l], &out);
            if (fwrite(out.data, 1, out.n, bin[l]) != out.n) {
                fprintf(stderr, "cross_check: write error\n");
                return 2;
            }
            fprintf(sums[l], "%016" PRIx64 " %s\n", fnv1a(out.data, out.n), desc);
            if (l == 0)
                total += out.n;
            free(out.data);
        }
        inputs_free(&in);
    }
    for (int l = 0; l < nl; l++) {
        fclose(bin[l]);
        fclose(sums[l]);
    }
    printf("cross_check: %s: %d cases (%zu values), %zu bytes of results per level; levels:", argv[2],
           n, items, total);
    for (int l = 0; l < nl; l++)
        printf(" %s", names[l]);
    printf("\n");
    return 0;
}
