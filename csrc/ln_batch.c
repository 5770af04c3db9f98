/*
 * ln_batch.c - many records with arbitrary strides, optionally on threads.
 *
 * The record kernels in ln_row.c want contiguous, aligned rows of the
 * compute type (float for float16/float32, double for float64). A row that
 * is already so is used in place; any other row (strided, misaligned or
 * float16) is staged through a small per-worker scratch row first. Staging
 * copies values exactly, so a record's result never depends on its layout.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "layernorm.h"

#if !defined(_WIN32)
#include <pthread.h>
#define LN_HAVE_PTHREADS 1
#endif

#define LN_MAX_THREADS 64

/* A thread is worth starting only for this much input per thread. */
#define LN_THREAD_MIN_BYTES ((size_t)1 << 20)

/* Outputs at least this large are written with streaming stores: they
 * would not stay in the caches anyway, and streaming them saves reading
 * each output line in before it is overwritten. */
#define LN_STREAM_MIN_BYTES ((size_t)32 << 20)

size_t ln_thread_threshold(void) { return 2 * LN_THREAD_MIN_BYTES; }

static size_t item_size(ln_dtype t)
{
    return t == LN_F16 ? 2 : (t == LN_F32 ? 4 : 8);
}

static size_t compute_size(ln_dtype t) { return t == LN_F64 ? 8 : 4; }

/* Scratch rows of one worker, each d elements of the compute type. */
typedef struct {
    void *x, *y, *w, *b;
    uint16_t *h; /* float16 staging for strided half rows */
    void *block;
} ln_scratch;

/* Can a row at p with this column stride be used in place? */
static int is_direct(const ln_batch *job, const void *p, ptrdiff_t col)
{
    size_t isz = item_size(job->dtype);
    return job->dtype != LN_F16 && col == (ptrdiff_t)isz &&
           (uintptr_t)p % isz == 0;
}

/* Are all rows of one operand usable in place (same alignment each row)? */
static int all_rows_direct(const ln_batch *job, const void *p, ptrdiff_t row,
                           ptrdiff_t col)
{
    return is_direct(job, p, col) &&
           row % (ptrdiff_t)item_size(job->dtype) == 0;
}

static int needs_scratch(const ln_batch *job)
{
    return !all_rows_direct(job, job->x, job->x_row, job->x_col) ||
           !all_rows_direct(job, job->y, job->y_row, job->y_col) ||
           (job->w && !all_rows_direct(job, job->w, job->w_row, job->w_col)) ||
           (job->b && !all_rows_direct(job, job->b, job->b_row, job->b_col));
}

static int scratch_alloc(ln_scratch *s, const ln_batch *job)
{
    memset(s, 0, sizeof *s);
    if (!needs_scratch(job))
        return 0;
    size_t row = job->d * compute_size(job->dtype);
    row = (row + 63) & ~(size_t)63; /* keep each row 64-byte aligned */
    size_t half = job->d * sizeof(uint16_t);
    s->block = malloc(4 * row + half + 64);
    if (!s->block)
        return -1;
    char *base = (char *)(((uintptr_t)s->block + 63) & ~(uintptr_t)63);
    s->x = base;
    s->y = base + row;
    s->w = base + 2 * row;
    s->b = base + 3 * row;
    s->h = (uint16_t *)(base + 4 * row);
    return 0;
}

/* Copy n items of the given size from a strided source, alignment-safe. */
static void gather(const char *src, ptrdiff_t stride, size_t size, void *dst,
                   size_t n)
{
    char *out = dst;
    for (size_t i = 0; i < n; i++)
        memcpy(out + i * size, src + (ptrdiff_t)i * stride, size);
}

static void scatter(const void *src, char *dst, ptrdiff_t stride, size_t size,
                    size_t n)
{
    const char *in = src;
    for (size_t i = 0; i < n; i++)
        memcpy(dst + (ptrdiff_t)i * stride, in + i * size, size);
}

/* A contiguous compute-type view of one input row (x, weight or bias). */
static const void *stage_in(const ln_kernels *k, const ln_batch *job,
                            const char *src, ptrdiff_t col, void *buf,
                            uint16_t *h)
{
    if (is_direct(job, src, col))
        return src;
    if (job->dtype != LN_F16) {
        gather(src, col, item_size(job->dtype), buf, job->d);
        return buf;
    }
    const uint16_t *half = (const uint16_t *)src;
    if (col != 2 || (uintptr_t)src % 2 != 0) {
        gather(src, col, 2, h, job->d);
        half = h;
    }
    k->half_to_float(half, buf, job->d);
    return buf;
}

/* Write a computed row from scratch to its strided, typed destination. */
static void stage_out(const ln_kernels *k, const ln_batch *job,
                      const void *buf, char *dst, uint16_t *h)
{
    if (job->dtype != LN_F16) {
        scatter(buf, dst, job->y_col, item_size(job->dtype), job->d);
        return;
    }
    if (job->y_col == 2 && (uintptr_t)dst % 2 == 0) {
        k->float_to_half(buf, (uint16_t *)dst, job->d);
        return;
    }
    k->float_to_half(buf, h, job->d);
    scatter(h, dst, job->y_col, 2, job->d);
}

static void store_stat(const ln_batch *job, char *dst, double v)
{
    if (job->dtype == LN_F64) {
        memcpy(dst, &v, sizeof v);
    } else {
        float f = (float)v;
        memcpy(dst, &f, sizeof f);
    }
}

/* Parameters shared by all rows (row stride 0) are staged only once. */
typedef struct {
    const void *w, *b;
    int w_fixed, b_fixed;
} ln_params;

static double row_eps(const ln_batch *job, size_t r)
{
    double eps;
    memcpy(&eps, job->eps + (ptrdiff_t)r * job->eps_row, sizeof eps);
    return eps;
}

static void store_stats(const ln_batch *job, size_t r, const ln_stats *st)
{
    if (job->mean)
        store_stat(job, job->mean + (ptrdiff_t)r * job->mean_row, st->mean);
    if (job->var)
        store_stat(job, job->var + (ptrdiff_t)r * job->var_row, st->var);
}

/* Outputs written straight to a large destination are streamed. */
static ln_hints output_hints(const ln_batch *job, int direct_y)
{
    ln_hints h;
    h.stream = direct_y && job->n_rows * job->d * item_size(job->dtype) >=
                               LN_STREAM_MIN_BYTES;
    return h;
}

/* The two steps of one record on contiguous compute-type rows. */
static void row_stats(const ln_kernels *k, const ln_batch *job,
                      const void *x, ln_stats *st)
{
    if (job->dtype == LN_F64)
        ln_stats_f64(k, x, job->d, st);
    else
        ln_stats_f32(k, x, job->d, st);
}

static int row_apply(const ln_kernels *k, const ln_batch *job, const void *x,
                     void *y, const ln_params *p, double eps,
                     const ln_stats *st, const ln_hints *h)
{
    if (job->dtype == LN_F64)
        return ln_apply_f64(k, x, y, job->d, p->w, p->b, eps, st, h);
    return ln_apply_f32(k, x, y, job->d, p->w, p->b, eps, st, h);
}

/* One record of any layout: staged in and out of scratch as needed. */
static int run_row(const ln_kernels *k, const ln_batch *job, ln_scratch *s,
                   const ln_params *shared, size_t r)
{
    const char *xr = job->x + (ptrdiff_t)r * job->x_row;
    char *yr = job->y + (ptrdiff_t)r * job->y_row;
    ln_params p = *shared;
    if (job->w && !p.w_fixed)
        p.w = stage_in(k, job, job->w + (ptrdiff_t)r * job->w_row, job->w_col,
                       s->w, s->h);
    if (job->b && !p.b_fixed)
        p.b = stage_in(k, job, job->b + (ptrdiff_t)r * job->b_row, job->b_col,
                       s->b, s->h);

    const void *x = stage_in(k, job, xr, job->x_col, s->x, s->h);
    int direct_y = is_direct(job, yr, job->y_col);
    void *y = direct_y ? (void *)yr : s->y;
    ln_hints h = output_hints(job, direct_y);

    ln_stats st;
    row_stats(k, job, x, &st);
    int rc = row_apply(k, job, x, y, &p, row_eps(job, r), &st, &h);
    if (!direct_y)
        stage_out(k, job, y, yr, s->h);
    store_stats(job, r, &st);
    return rc;
}

/* Short records are done in groups: first the statistics of the whole
 * group, then its outputs. Each record's statistics are a chain of
 * dependent operations (sum, divide, sum of squares, square root); with
 * several independent chains side by side the CPU overlaps them. The
 * group's rows stay in L1 between the two steps. */
#define LN_GROUP 8
#define LN_GROUP_MAX_ROW_BYTES 1024

static size_t group_size(const ln_batch *job)
{
    if (needs_scratch(job) || (job->w && job->w_row != 0) ||
        (job->b && job->b_row != 0) ||
        job->d * item_size(job->dtype) > LN_GROUP_MAX_ROW_BYTES)
        return 1;
    return LN_GROUP;
}

/* n <= LN_GROUP records from r: all direct, parameters shared. */
static int run_group(const ln_kernels *k, const ln_batch *job,
                     const ln_params *p, size_t r, size_t n)
{
    ln_stats st[LN_GROUP];
    ln_hints h = output_hints(job, 1);
    int status = 0;
    for (size_t i = 0; i < n; i++)
        row_stats(k, job, job->x + (ptrdiff_t)(r + i) * job->x_row, &st[i]);
    for (size_t i = 0; i < n; i++) {
        const char *xr = job->x + (ptrdiff_t)(r + i) * job->x_row;
        char *yr = job->y + (ptrdiff_t)(r + i) * job->y_row;
        status |= row_apply(k, job, xr, yr, p, row_eps(job, r + i), &st[i], &h);
        store_stats(job, r + i, &st[i]);
    }
    return status;
}

static int run_rows(const ln_kernels *k, const ln_batch *job, size_t begin,
                    size_t end)
{
    ln_scratch s;
    if (begin >= end)
        return LN_OK;
    if (scratch_alloc(&s, job) != 0)
        return LN_ENOMEM;

    ln_params p = {NULL, NULL, 0, 0};
    if (job->w && job->w_row == 0) {
        p.w = stage_in(k, job, job->w, job->w_col, s.w, s.h);
        p.w_fixed = 1;
    }
    if (job->b && job->b_row == 0) {
        p.b = stage_in(k, job, job->b, job->b_col, s.b, s.h);
        p.b_fixed = 1;
    }

    int status = LN_OK;
    size_t group = group_size(job);
    for (size_t r = begin; r < end; r += group) {
        size_t n = end - r < group ? end - r : group;
        int rc = group > 1 ? run_group(k, job, &p, r, n)
                           : run_row(k, job, &s, &p, r);
        if (rc != 0)
            status = LN_EBADEPS;
    }
    k->store_fence();
    free(s.block);
    return status;
}

void ln_batch_fill_nan(const ln_batch *job)
{
    float nan_f = NAN;
    double nan_d = NAN;
    uint16_t nan_h = 0x7e00u;
    const void *nan = job->dtype == LN_F16   ? (const void *)&nan_h
                      : job->dtype == LN_F32 ? (const void *)&nan_f
                                             : (const void *)&nan_d;
    size_t isz = item_size(job->dtype);
    for (size_t r = 0; r < job->n_rows; r++) {
        char *yr = job->y + (ptrdiff_t)r * job->y_row;
        for (size_t i = 0; i < job->d; i++)
            memcpy(yr + (ptrdiff_t)i * job->y_col, nan, isz);
        if (job->mean)
            store_stat(job, job->mean + (ptrdiff_t)r * job->mean_row, NAN);
        if (job->var)
            store_stat(job, job->var + (ptrdiff_t)r * job->var_row, NAN);
    }
}

/* How many threads this batch deserves: never more than the rows, and
 * only one per LN_THREAD_MIN_BYTES of input. */
static size_t plan_threads(const ln_batch *job, int n_threads)
{
    size_t bytes = job->n_rows * job->d * item_size(job->dtype);
    size_t n = n_threads < 1 ? 1 : (size_t)n_threads;
    if (n > LN_MAX_THREADS)
        n = LN_MAX_THREADS;
    if (n > job->n_rows)
        n = job->n_rows;
    if (n > bytes / LN_THREAD_MIN_BYTES)
        n = bytes / LN_THREAD_MIN_BYTES;
    return n < 1 ? 1 : n;
}

static int worse(int a, int b)
{
    if (a == LN_ENOMEM || b == LN_ENOMEM)
        return LN_ENOMEM;
    return a != LN_OK ? a : b;
}

#if defined(LN_HAVE_PTHREADS)
typedef struct {
    const ln_kernels *k;
    const ln_batch *job;
    size_t begin, end;
    int status;
} ln_task;

static void *task_main(void *arg)
{
    ln_task *t = arg;
    t->status = run_rows(t->k, t->job, t->begin, t->end);
    return NULL;
}

int ln_batch_run(const ln_kernels *k, const ln_batch *job, int n_threads)
{
    size_t n = plan_threads(job, n_threads);
    if (n <= 1)
        return run_rows(k, job, 0, job->n_rows);

    ln_task task[LN_MAX_THREADS];
    pthread_t tid[LN_MAX_THREADS];
    int started[LN_MAX_THREADS];
    for (size_t i = 0; i < n; i++) {
        task[i].k = k;
        task[i].job = job;
        task[i].begin = job->n_rows * i / n;
        task[i].end = job->n_rows * (i + 1) / n;
        task[i].status = LN_OK;
    }
    for (size_t i = 1; i < n; i++)
        started[i] = pthread_create(&tid[i], NULL, task_main, &task[i]) == 0;
    task_main(&task[0]);

    int status = task[0].status;
    for (size_t i = 1; i < n; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            task_main(&task[i]); /* could not start: do it here */
        status = worse(status, task[i].status);
    }
    return status;
}
#else
int ln_batch_run(const ln_kernels *k, const ln_batch *job, int n_threads)
{
    (void)n_threads;
    return run_rows(k, job, 0, job->n_rows);
}
#endif
