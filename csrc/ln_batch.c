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

/* What one thread keeps while it works through rows: its scratch rows and
 * the parameters shared by all rows, staged once. */
typedef struct {
    ln_scratch s;
    ln_params p;
} ln_worker;

static int worker_init(ln_worker *wk, const ln_kernels *k, const ln_batch *job)
{
    if (scratch_alloc(&wk->s, job) != 0)
        return -1;
    ln_params p = {NULL, NULL, 0, 0};
    if (job->w && job->w_row == 0) {
        p.w = stage_in(k, job, job->w, job->w_col, wk->s.w, wk->s.h);
        p.w_fixed = 1;
    }
    if (job->b && job->b_row == 0) {
        p.b = stage_in(k, job, job->b, job->b_col, wk->s.b, wk->s.h);
        p.b_fixed = 1;
    }
    wk->p = p;
    return 0;
}

static void worker_done(ln_worker *wk, const ln_kernels *k)
{
    k->store_fence();
    free(wk->s.block);
}

/* Records [begin, end): LN_OK, or LN_EBADEPS if one had an invalid eps. */
static int worker_rows(ln_worker *wk, const ln_kernels *k,
                       const ln_batch *job, size_t begin, size_t end)
{
    int status = LN_OK;
    size_t group = group_size(job);
    for (size_t r = begin; r < end; r += group) {
        size_t n = end - r < group ? end - r : group;
        int rc = group > 1 ? run_group(k, job, &wk->p, r, n)
                           : run_row(k, job, &wk->s, &wk->p, r);
        if (rc != 0)
            status = LN_EBADEPS;
    }
    return status;
}

static int run_rows(const ln_kernels *k, const ln_batch *job, size_t begin,
                    size_t end)
{
    ln_worker wk;
    if (begin >= end)
        return LN_OK;
    if (worker_init(&wk, k, job) != 0)
        return LN_ENOMEM;
    int status = worker_rows(&wk, k, job, begin, end);
    worker_done(&wk, k);
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
/*
 * A pool of worker threads, started on first need and kept. A call posts
 * its batch; the caller and the workers then take chunks of about
 * LN_CHUNK_BYTES of records from a shared counter until none are left.
 * The caller waits only for chunks that were taken, never for a worker
 * that has not woken up yet, so a busy machine costs at most the
 * single-thread time. Which thread does a record never matters: each
 * record is done whole by one thread.
 *
 * One call uses the pool at a time; a concurrent call (another Python
 * thread: the GIL is released) runs on its own thread instead.
 */
#define LN_CHUNK_BYTES ((size_t)128 << 10)

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t wake;   /* a batch was posted */
    pthread_cond_t idle;   /* the last taken chunk is done */
    size_t n_started;      /* worker threads running */
    unsigned long posted;  /* batches posted so far */
    /* The current batch, valid while job != NULL; guarded by mu. */
    const ln_kernels *k;
    const ln_batch *job;
    size_t next, chunk;    /* first record not taken; records per take */
    size_t seats;          /* workers that may still join this batch */
    size_t busy;           /* threads inside the batch */
    int status;
} ln_pool;

static ln_pool pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                       PTHREAD_COND_INITIALIZER};
static pthread_mutex_t pool_owner = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t pool_fork_once = PTHREAD_ONCE_INIT;

/* Take chunks until none are left. Called with mu held and busy counted;
 * returns with mu held. */
static void take_chunks(ln_worker *wk, const ln_kernels *k,
                        const ln_batch *job)
{
    while (pool.next < job->n_rows) {
        size_t r = pool.next;
        size_t end = job->n_rows - r < pool.chunk ? job->n_rows
                                                  : r + pool.chunk;
        pool.next = end;
        pthread_mutex_unlock(&pool.mu);
        int rc = worker_rows(wk, k, job, r, end);
        pthread_mutex_lock(&pool.mu);
        pool.status = worse(pool.status, rc);
    }
}

/* Leave the batch; the last one out wakes the caller. mu held. */
static void leave_batch(void)
{
    if (--pool.busy == 0)
        pthread_cond_broadcast(&pool.idle);
}

static void *pool_main(void *arg)
{
    unsigned long seen = 0;
    (void)arg;
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        while (pool.posted == seen)
            pthread_cond_wait(&pool.wake, &pool.mu);
        seen = pool.posted;
        const ln_batch *job = pool.job;
        const ln_kernels *k = pool.k;
        if (job == NULL || pool.seats == 0 || pool.next >= job->n_rows)
            continue; /* finished before this worker woke, or full */
        pool.seats--;
        pool.busy++;
        pthread_mutex_unlock(&pool.mu);
        ln_worker wk;
        int ok = worker_init(&wk, k, job) == 0;
        pthread_mutex_lock(&pool.mu);
        if (ok) {
            take_chunks(&wk, k, job);
            pthread_mutex_unlock(&pool.mu);
            worker_done(&wk, k);
            pthread_mutex_lock(&pool.mu);
        }
        leave_batch();
    }
    return NULL;
}

/* A forked child has none of the parent's threads: start afresh. */
static void pool_after_fork_child(void)
{
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.idle, NULL);
    pthread_mutex_init(&pool_owner, NULL);
    pool.n_started = 0;
    pool.job = NULL;
}

static void pool_register_fork(void)
{
    pthread_atfork(NULL, NULL, pool_after_fork_child);
}

/* Make sure n workers run (fewer if threads cannot be created). mu held. */
static void pool_grow(size_t n)
{
    while (pool.n_started < n) {
        pthread_t tid;
        if (pthread_create(&tid, NULL, pool_main, NULL) != 0)
            break;
        pthread_detach(tid);
        pool.n_started++;
    }
}

int ln_batch_run(const ln_kernels *k, const ln_batch *job, int n_threads)
{
    size_t n = plan_threads(job, n_threads);
    if (n <= 1 || pthread_mutex_trylock(&pool_owner) != 0)
        return run_rows(k, job, 0, job->n_rows);
    pthread_once(&pool_fork_once, pool_register_fork);

    ln_worker wk;
    if (worker_init(&wk, k, job) != 0) {
        pthread_mutex_unlock(&pool_owner);
        return LN_ENOMEM;
    }
    size_t row_bytes = job->d * item_size(job->dtype);
    pthread_mutex_lock(&pool.mu);
    pool_grow(n - 1);
    pool.k = k;
    pool.job = job;
    pool.next = 0;
    pool.chunk = row_bytes >= LN_CHUNK_BYTES ? 1 : LN_CHUNK_BYTES / row_bytes;
    pool.seats = n - 1;
    pool.busy = 1; /* the caller */
    pool.status = LN_OK;
    pool.posted++;
    pthread_cond_broadcast(&pool.wake);

    take_chunks(&wk, k, job);
    leave_batch();
    while (pool.busy > 0)
        pthread_cond_wait(&pool.idle, &pool.mu);
    int status = pool.status;
    pool.job = NULL;
    pthread_mutex_unlock(&pool.mu);

    worker_done(&wk, k);
    pthread_mutex_unlock(&pool_owner);
    return status;
}
#else
int ln_batch_run(const ln_kernels *k, const ln_batch *job, int n_threads)
{
    (void)n_threads;
    return run_rows(k, job, 0, job->n_rows);
}
#endif
