/*
 * ln_batch.c - many records with arbitrary strides, on the worker pool.
 *
 * Record kernels want contiguous, aligned rows of the result dtype and
 * parameters in the compute type. Rows that are so are handed over in
 * place, many at a time; any other row (strided, misaligned, or of a
 * narrower dtype) is staged through a per-worker scratch row (ln_stage.c).
 * Staging converts exactly, so a record's result never depends on its
 * layout, and which thread runs a record never matters: each record is
 * done whole by one kernel call.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layernorm.h"
#include "ln_pool.h"
#include "ln_stage.h"

/* A thread is worth starting only for this much input per thread. */
#define LN_THREAD_MIN_BYTES ((size_t)1 << 20)

/* Records a worker takes from the pool at a time: about this many bytes. */
#define LN_CHUNK_BYTES ((size_t)128 << 10)

/* A backward call (dx, and the parameter gradients' exact sums) does
 * several times the forward's work per byte of x: a thread is worth
 * starting from LN_BACK_THREAD_MIN_BYTES of x on, and a worker takes
 * smaller chunks, of whole groups of records (LN_BACK_CHUNK_ROWS: the
 * kernels finish records 8 at a time, short ones 16), so that two threads
 * share a small call evenly. Two threads against one, float32 (Zen 3,
 * AVX2 level): (256, 768) 1.40-1.74x, (512, 768) 1.61-1.69x, (48, 4096)
 * 1.12-1.25x, (3100, 64) 1.62x, (12300, 16) 1.67x; float16 (512, 768)
 * 1.13-1.53x; float64 (128, 768) 1.33x; RMSNorm (256, 768) 1.53x. Below
 * the threshold they were level or slower (a worker's wake-up and its
 * own sums): (32, 4096) 0.92-0.99x, (96, 768) 0.95-0.98x, (64, 768)
 * 0.95-1.06x. */
#define LN_BACK_THREAD_MIN_BYTES ((size_t)384 << 10)
#define LN_BACK_CHUNK_BYTES ((size_t)32 << 10)
#define LN_BACK_CHUNK_ROWS 8
/* ... and only for LN_BACK_THREAD_MIN_ROWS records a thread: each worker
 * has sums of its own for every feature (about 70 bytes a feature),
 * allocated, zeroed and merged. With a few long records that had cost
 * more than it gained: float32 (8, 65536) took 3.1x the time on two
 * threads, (16, 16384) 1.09x. */
#define LN_BACK_THREAD_MIN_ROWS 24

/* Outputs at least this large are written with streaming stores (the
 * kernels then stream only records that pay for it, ln_lane.h's
 * stream_pays): they would not stay in the caches anyway, and streaming
 * them saves reading each output line in before it is overwritten.
 * float32 out=, one thread, against 32 MiB before: (4096, 768) 0.70-0.78x
 * the time, (4096, 1024) 0.72-0.90x, float64 (4096, 768) 0.73-0.86x;
 * below 8 MiB ((1024, 768)) streaming gained nothing. */
#define LN_STREAM_MIN_BYTES ((size_t)8 << 20)

/* A new output (job->y_new) is streamed only below this size. Larger
 * ones come from fresh pages (glibc maps allocations of 32 MiB and more
 * afresh each time), which the kernel zeroes through the cache as they
 * fault in, and streaming over those lines was slower than plain stores
 * (float32 (16384, 4096), one thread: 87 ms against 72 ms, x.copy() 77;
 * (12288, 1024) 0.95-1.0x the time). Smaller ones reuse the heap's pages:
 * float32 (4096, 768) 0.72x, (8192, 768) 0.77x, (7680, 1024) 0.77x,
 * float64 (4096, 768) 0.84x. Outputs the Python layer allocates for the
 * gufunc path are not marked new: they are streamed from 8 MiB on. */
#define LN_STREAM_NEW_MAX_BYTES ((size_t)32 << 20)

/* Is an output of `bytes` large enough to leave the caches (streamed,
 * and the forward asking for the rows ahead: ln_ops.h, record_ahead)? */
static int large_output(size_t bytes) { return bytes >= LN_STREAM_MIN_BYTES; }

/* The size of a forward call that moves as much memory as the job, whose
 * output is `bytes` long: a backward reads x and dy and writes dx, three
 * arrays to the forward's two. Its records then leave the caches (are
 * streamed and asked for ahead) from an output of 16/3 MiB on, where the
 * forward's do from 8 MiB: float32 backward, one thread, (2048, 768)
 * 0.76-0.83x the time (shapes below the line, whose path is the same,
 * read 0.89-1.05x in the same runs), float64 (1024, 768) and RMSNorm
 * (2048, 768) level. From 2 MiB on, (1024, 768) had been 1.07-1.10x
 * slower with its inputs in the caches. */
static size_t forward_bytes(int backward, size_t bytes)
{
    return backward ? bytes / 2 * 3 : bytes;
}

/* Is the job's output, `bytes` long, written with streaming stores? */
static int streams_output(const ln_job *job, int backward, size_t bytes)
{
    return large_output(forward_bytes(backward, bytes)) &&
           (!job->y_new || bytes < LN_STREAM_NEW_MAX_BYTES);
}

/* Records per kernel call when rows are used in place. The last group of
 * a call asks for nothing ahead (ln_ops.h's record_ahead and back_finish
 * stop at the call's records): 256 rather than 64, one thread, float32
 * forward (1e6, 16) 0.96x the time, (1e6, 64) 0.95-0.96x, (200000, 256)
 * 0.97-0.99x, (4096, 768) level; backward (4096, 768) and (4096, 1024)
 * 0.98-0.99x. 1024 gained another 0-1.5%; not kept. */
#define LN_CALL_ROWS 256
/* Records of a Fortran-ordered call are staged LN_TILE_ROWS at a time
 * (run_tile): item j of the tile's records is then one run of memory,
 * where record by record every item was another line (and, a column
 * apart, often another page): (4096, 768) float32, one thread, was 11x a
 * C-ordered call. Tiles of at most LN_TILE_MAX_BYTES an operand. */
#define LN_TILE_ROWS 16
#define LN_TILE_MAX_BYTES (512 * 1024)
_Static_assert(LN_TILE_ROWS <= LN_CALL_ROWS, "a tile is one kernel call");

/* The smallest input that may start threads: a backward call's. */
_Static_assert(LN_BACK_THREAD_MIN_BYTES <= LN_THREAD_MIN_BYTES, "the backward's is the smaller");
size_t ln_thread_threshold(void) { return 2 * LN_BACK_THREAD_MIN_BYTES; }

/* ---- spare rows ------------------------------------------------------- */

struct ln_spare {
    void *raw;   /* what malloc gave */
    void *row;   /* 64-byte aligned inside raw */
    size_t bytes;
};

void *ln_spare_row(ln_spare *s, size_t bytes)
{
    if (s->bytes >= bytes)
        return s->row;
    free(s->raw);
    s->raw = malloc(bytes + 64);
    s->bytes = 0;
    s->row = NULL;
    if (s->raw == NULL)
        return NULL;
    s->row = (void *)(((uintptr_t)s->raw + 63) & ~(uintptr_t)63);
    s->bytes = bytes;
    return s->row;
}

ln_spare *ln_spare_new(void)
{
    return calloc(1, sizeof(ln_spare));
}

void ln_spare_free(ln_spare *s)
{
    if (s != NULL)
        free(s->raw);
    free(s);
}

/* ---- the ops ---------------------------------------------------------- */

/* What each op reads and writes beside its x and y rows. */
typedef struct {
    int reads_dy;     /* rows of dy, like x */
    int writes_stats; /* mean and var out (when given) */
    int reads_mean;   /* mean in (when given) */
    int needs_weight; /* a gain row always (ones when the job has none) */
} ln_op_info;

static const ln_op_info op_info[LN_NOPS] = {
    [LN_OP_LAYER_NORM] = {.writes_stats = 1},
    [LN_OP_LAYER_NORM_BACKWARD] = {.reads_dy = 1, .reads_mean = 1, .needs_weight = 1},
    [LN_OP_RMS_NORM] = {.writes_stats = 1},
    [LN_OP_RMS_NORM_BACKWARD] = {.reads_dy = 1, .needs_weight = 1},
};

/* ---- one worker ------------------------------------------------------- */

/* A scratch row per staged operand, the parameters shared by all rows
 * (row stride 0) staged once, and the worker's own sums over records. */
typedef struct {
    void *block;              /* the scratch rows' memory */
    void *x, *dy, *y, *w, *b; /* scratch rows (d items each) */
    const void *w_fixed, *b_fixed;
    double w_max; /* max |w_fixed| (backward) */
    ln_acc dw, db;
    int has_dw, has_db;
    int borrowed; /* the only worker: dw and db are the job's own sums */
    ln_spare spare;
} ln_worker;

typedef struct {
    const ln_kernels *k;
    const ln_job *job;
    const ln_op_info *info;
    ln_kernel kernel;
    ln_dtype ctype;    /* compute dtype of the parameters */
    int in_place;      /* every x (dy) and y row usable in place */
    int tiled;         /* records staged LN_TILE_ROWS at a time (run_tile) */
    int stream;
    int ahead;         /* a large output (large_output), streamed or not */
} ln_batch_ctx;

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

/* What a worker holds, freed (the worker itself is the caller's). */
static void worker_release(ln_worker *wk)
{
    if (wk->has_dw && !wk->borrowed)
        ln_acc_free(&wk->dw);
    if (wk->has_db && !wk->borrowed)
        ln_acc_free(&wk->db);
    free(wk->spare.raw);
    free(wk->block);
}

static void worker_free(ln_worker *wk)
{
    worker_release(wk);
    free(wk);
}

/* Scratch rows only for what cannot be used in place: a 1-million feature
 * float16 record read in place needs no 32 MiB of scratch. */
static int worker_scratch(ln_worker *wk, const ln_batch_ctx *c)
{
    const ln_job *job = c->job;
    int stage_rows = !c->in_place;
    int stage_w = (job->w.ptr && !(job->w.row == 0 && ln_rows_are_direct(&job->w, c->ctype))) ||
                  (!job->w.ptr && c->info->needs_weight);
    int stage_b = job->b.ptr && !(job->b.row == 0 && ln_rows_are_direct(&job->b, c->ctype));
    size_t row = round64(job->d * 8) * (c->tiled ? LN_TILE_ROWS : 1);
    size_t n_rows = (size_t)stage_rows * (2 + (size_t)c->info->reads_dy) + (size_t)stage_w +
                    (size_t)stage_b;
    if (n_rows == 0)
        return 0;
    wk->block = malloc(n_rows * row + 64);
    if (wk->block == NULL)
        return -1;
    char *base = (char *)(((uintptr_t)wk->block + 63) & ~(uintptr_t)63);
    if (stage_rows) {
        wk->x = base;
        wk->y = base + row;
        base += 2 * row;
        if (c->info->reads_dy) {
            wk->dy = base;
            base += row;
        }
    }
    if (stage_w) {
        wk->w = base;
        base += row;
    }
    if (stage_b)
        wk->b = base;
    return 0;
}

/* d ones of the compute type in buf: the gain of a layer without one. */
static const void *ones(void *buf, ln_dtype t, size_t d)
{
    for (size_t i = 0; i < d; i++) {
        if (t == LN_F64)
            ((double *)buf)[i] = 1.0;
        else
            ((float *)buf)[i] = 1.0f;
    }
    return buf;
}

/* |w[i]| of the compute type, in double (exact). */
static inline double gain_abs(const void *w, ln_dtype t, size_t i)
{
    return fabs(t == LN_F64 ? ((const double *)w)[i] : (double)((const float *)w)[i]);
}

/* max |w| over d values of the compute type: the backward's bound on
 * |dy * w| (ln_back_fits), found once for a gain every record shares and
 * once per record for a staged per-record gain. GAIN_MAX_LANES running
 * maxima, each skipping NaN as `a > m ? a : m` does, so that their largest
 * is the one maximum's value: one chain of them had waited on each
 * comparison, 3 cycles a value (a fifth of a (1, 768) float32 backward
 * call). */
#define GAIN_MAX_LANES 8
static double gain_max(const void *w, ln_dtype t, size_t d)
{
    double m[GAIN_MAX_LANES] = {0};
    size_t i = 0;
    for (; i + GAIN_MAX_LANES <= d; i += GAIN_MAX_LANES)
        for (size_t j = 0; j < GAIN_MAX_LANES; j++) {
            double a = gain_abs(w, t, i + j);
            m[j] = a > m[j] ? a : m[j];
        }
    for (; i < d; i++) {
        double a = gain_abs(w, t, i);
        m[0] = a > m[0] ? a : m[0];
    }
    double r = 0.0;
    for (size_t j = 0; j < GAIN_MAX_LANES; j++)
        r = m[j] > r ? m[j] : r;
    return r;
}

/* Set up a zeroed worker: scratch rows, sums, fixed parameters. On
 * failure (LN_ENOMEM) what it got is for worker_release. */
static int worker_init(ln_worker *wk, const ln_batch_ctx *c)
{
    const ln_job *job = c->job;
    if (worker_scratch(wk, c) != 0)
        return LN_ENOMEM;
    if (wk->borrowed) {
        /* Deposits straight into the job's sums (handed back by
         * worker_finish): exact, so the same as a merge, without a second
         * pair of sums to allocate, zero and fault in. */
        if ((wk->has_dw = job->dw != NULL))
            wk->dw = *job->dw;
        if ((wk->has_db = job->db != NULL))
            wk->db = *job->db;
    } else if ((job->dw && (wk->has_dw = ln_acc_init(&wk->dw, job->d) == 0) == 0) ||
               (job->db && (wk->has_db = ln_acc_init(&wk->db, job->d) == 0) == 0)) {
        return LN_ENOMEM;
    }
    /* The benchmark's baseline of plain float64 sums is the job's choice. */
    if (wk->has_dw)
        wk->dw.plain = job->dw->plain;
    if (wk->has_db)
        wk->db.plain = job->db->plain;
    if (job->w.ptr && job->w.row == 0)
        wk->w_fixed = ln_stage_in(c->k, &job->w, 0, job->d, c->ctype, wk->w);
    else if (!job->w.ptr && c->info->needs_weight)
        wk->w_fixed = ones(wk->w, c->ctype, job->d);
    if (job->b.ptr && job->b.row == 0)
        wk->b_fixed = ln_stage_in(c->k, &job->b, 0, job->d, c->ctype, wk->b);
    if (c->info->reads_dy && wk->w_fixed)
        wk->w_max = gain_max(wk->w_fixed, c->ctype, job->d);
    return LN_OK;
}

static int worker_begin(void *vctx, void **state)
{
    ln_worker *wk = calloc(1, sizeof *wk);
    if (wk == NULL)
        return LN_ENOMEM;
    if (worker_init(wk, vctx) != LN_OK) {
        worker_free(wk);
        return LN_ENOMEM;
    }
    *state = wk;
    return LN_OK;
}

/* A worker's streamed stores ordered, and its sums merged into the job's,
 * exactly (the order of the workers never shows). */
static void worker_finish(const ln_batch_ctx *c, ln_worker *wk)
{
    c->k->store_fence();
    if (wk->borrowed) {
        if (wk->has_dw)
            *c->job->dw = wk->dw;
        if (wk->has_db)
            *c->job->db = wk->db;
        return;
    }
    if (wk->has_dw)
        ln_acc_merge(c->job->dw, &wk->dw);
    if (wk->has_db)
        ln_acc_merge(c->job->db, &wk->db);
}

/* The pool calls this one thread at a time. */
static int worker_end(void *vctx, void *state)
{
    worker_finish(vctx, state);
    worker_free(state);
    return LN_OK;
}

/* Records [r, r + n)'s statistics st to the outputs asked for (tested
 * once a run of records: for (1e6, 16) float32, once a record had cost
 * 3% of the call). */
static void store_stats(const ln_batch_ctx *c, size_t r, size_t n, const ln_stats *st)
{
    const ln_job *job = c->job;
    if (!c->info->writes_stats)
        return;
    if (job->mean.ptr)
        for (size_t k = 0; k < n; k++)
            ln_write_scalar(&job->mean, r + k, st[k].mean);
    if (job->var.ptr)
        for (size_t k = 0; k < n; k++)
            ln_write_scalar(&job->var, r + k, st[k].var);
}

static int worse(int a, int b) { return a > b ? a : b; }

/* The rows handed to the kernel: the op's common fields. */
static ln_rows rows_of(const ln_batch_ctx *c, ln_worker *wk, size_t n, ln_stats *st,
                       double *eps, double *mean)
{
    ln_rows rows = {
        .n = n, .d = c->job->d,
        .w = wk->w_fixed, .b = wk->b_fixed, .w_max = wk->w_max,
        .eps = eps, .st = st, .spare = &wk->spare, .stream = c->stream,
        .mean = c->info->reads_mean && c->job->mean.ptr ? mean : NULL,
        .dw = wk->has_dw ? &wk->dw : NULL, .db = wk->has_db ? &wk->db : NULL,
    };
    return rows;
}

/* Records [r, r + n)'s values of a per-record scalar operand (eps, a
 * given mean) as doubles; a broadcast one (row stride 0: the usual
 * scalar eps) is read once, not once a record. */
static void read_scalars(const ln_operand *op, size_t r, size_t n, double *out)
{
    if (op->row == 0) {
        double v = n ? ln_read_scalar(op, r) : 0.0;
        for (size_t k = 0; k < n; k++)
            out[k] = v;
        return;
    }
    for (size_t k = 0; k < n; k++)
        out[k] = ln_read_scalar(op, r + k);
}

/* Records [r, r + n) from rows x and dy to rows y (x_row, dy_row and
 * y_row bytes apart; direct), the parameters fixed. callers: the rows
 * are the caller's arrays (not scratch), so that large calls stream y and
 * ask for the rows ahead. */
static int run_rows(const ln_batch_ctx *c, ln_worker *wk, size_t r, size_t n, const char *x,
                    ptrdiff_t x_row, const char *dy, ptrdiff_t dy_row, char *y,
                    ptrdiff_t y_row, int callers)
{
    const ln_job *job = c->job;
    ln_stats st[LN_CALL_ROWS];
    double eps[LN_CALL_ROWS], mean[LN_CALL_ROWS];
    read_scalars(&job->eps, r, n, eps);
    if (c->info->reads_mean && job->mean.ptr)
        read_scalars(&job->mean, r, n, mean);
    ln_rows rows = rows_of(c, wk, n, st, eps, mean);
    rows.x = x;
    rows.x_row = x_row;
    rows.y = y;
    rows.y_row = y_row;
    rows.stream = callers && c->stream;
    rows.ahead = callers && c->ahead;
    if (c->info->reads_dy) {
        rows.dy = dy;
        rows.dy_row = dy_row;
    }
    int status = c->kernel(&rows);
    store_stats(c, r, n, st);
    return status;
}

/* Records [r, r + n) in place: x (dy) and y rows direct, parameters fixed. */
static int run_in_place(const ln_batch_ctx *c, ln_worker *wk, size_t r, size_t n)
{
    const ln_job *job = c->job;
    const char *dy = c->info->reads_dy ? job->dy.ptr + (ptrdiff_t)r * job->dy.row : NULL;
    return run_rows(c, wk, r, n, job->x.ptr + (ptrdiff_t)r * job->x.row, job->x.row, dy,
                    job->dy.row, job->y.ptr + (ptrdiff_t)r * job->y.row, job->y.row, 1);
}

/* Records [r, r + n) (n <= LN_TILE_ROWS) of a tiled call: staged into
 * the scratch tiles, run there, the outputs staged back. */
static int run_tile(const ln_batch_ctx *c, ln_worker *wk, size_t r, size_t n)
{
    const ln_job *job = c->job;
    size_t d = job->d;
    ptrdiff_t row = (ptrdiff_t)(d * ln_dtype_size(job->dtype));
    ln_stage_tile_in(&job->x, r, n, d, wk->x);
    if (c->info->reads_dy)
        ln_stage_tile_in(&job->dy, r, n, d, wk->dy);
    int status = run_rows(c, wk, r, n, wk->x, row, wk->dy, row, wk->y, row, 0);
    ln_stage_tile_out(wk->y, &job->y, r, n, d);
    return status;
}

/* One record of any layout, staged in and out of scratch as needed. */
static int run_staged(const ln_batch_ctx *c, ln_worker *wk, size_t r)
{
    const ln_job *job = c->job;
    size_t d = job->d;
    ln_stats st;
    double eps = ln_read_scalar(&job->eps, r), mean = 0.0;
    if (c->info->reads_mean && job->mean.ptr)
        mean = ln_read_scalar(&job->mean, r);
    int direct_y = ln_row_is_direct(&job->y, r, job->dtype);
    ln_rows rows = rows_of(c, wk, 1, &st, &eps, &mean);
    rows.x = ln_stage_in(c->k, &job->x, r, d, job->dtype, wk->x);
    rows.y = direct_y ? job->y.ptr + (ptrdiff_t)r * job->y.row : wk->y;
    rows.stream = c->stream && direct_y;
    if (c->info->reads_dy)
        rows.dy = ln_stage_in(c->k, &job->dy, r, d, job->dtype, wk->dy);
    if (job->w.ptr && !wk->w_fixed) {
        rows.w = ln_stage_in(c->k, &job->w, r, d, c->ctype, wk->w);
        if (c->info->reads_dy)
            rows.w_max = gain_max(rows.w, c->ctype, d);
    }
    if (job->b.ptr && !wk->b_fixed)
        rows.b = ln_stage_in(c->k, &job->b, r, d, c->ctype, wk->b);
    int status = c->kernel(&rows);
    if (!direct_y)
        ln_stage_out(wk->y, &job->y, r, d);
    store_stats(c, r, 1, &st);
    return status;
}

/* Gain and bias the same for every record (or absent): staged once per
 * worker. */
static int params_fixed(const ln_job *job)
{
    return (!job->w.ptr || job->w.row == 0) && (!job->b.ptr || job->b.row == 0);
}

static int worker_run(void *vctx, void *state, size_t begin, size_t end)
{
    const ln_batch_ctx *c = vctx;
    ln_worker *wk = state;
    const ln_job *job = c->job;
    int status = LN_OK;
    if (c->in_place && params_fixed(job)) {
        for (size_t r = begin; r < end; r += LN_CALL_ROWS) {
            size_t n = end - r < LN_CALL_ROWS ? end - r : LN_CALL_ROWS;
            status = worse(status, run_in_place(c, wk, r, n));
        }
    } else if (c->tiled) {
        for (size_t r = begin; r < end; r += LN_TILE_ROWS) {
            size_t n = end - r < LN_TILE_ROWS ? end - r : LN_TILE_ROWS;
            status = worse(status, run_tile(c, wk, r, n));
        }
    } else {
        for (size_t r = begin; r < end; r++)
            status = worse(status, run_staged(c, wk, r));
    }
    return status;
}

/* ---- the batch -------------------------------------------------------- */

/* How many threads this batch deserves: only one per min_rows records
 * (at least one) and per min_bytes of input. */
static size_t plan_threads(const ln_job *job, int n_threads, size_t min_bytes, size_t min_rows)
{
    size_t bytes = job->n_rows * job->d * ln_dtype_size(job->dtype);
    size_t n = n_threads < 1 ? 1 : (size_t)n_threads;
    if (n > job->n_rows / min_rows)
        n = job->n_rows / min_rows;
    if (n > bytes / min_bytes)
        n = bytes / min_bytes;
    return n < 1 ? 1 : n;
}

/* Records per chunk a worker takes: about LN_CHUNK_BYTES of rows, or a
 * backward's smaller chunks in whole groups. A threaded backward has at
 * least LN_BACK_THREAD_MIN_ROWS records and LN_BACK_THREAD_MIN_BYTES a
 * thread, so each thread has at least two such chunks to take. */
_Static_assert(LN_BACK_CHUNK_ROWS <= LN_BACK_THREAD_MIN_ROWS / 2 &&
                   LN_BACK_CHUNK_BYTES <= LN_BACK_THREAD_MIN_BYTES / 2,
               "a threaded backward has at least two chunks a thread");
static size_t chunk_rows(size_t row_bytes, int backward)
{
    size_t bytes = backward ? LN_BACK_CHUNK_BYTES : LN_CHUNK_BYTES;
    size_t rows = row_bytes >= bytes ? 1 : bytes / row_bytes;
    if (backward)
        rows = (rows + LN_BACK_CHUNK_ROWS - 1) / LN_BACK_CHUNK_ROWS * LN_BACK_CHUNK_ROWS;
    return rows;
}

/* An operand whose records lie closer together than its items (a
 * Fortran-ordered array), in the call's dtype: worth staging a tile at a
 * time. */
static int tile_operand(const ln_operand *op, ln_dtype t)
{
    ptrdiff_t row = op->row < 0 ? -op->row : op->row, col = op->col < 0 ? -op->col : op->col;
    return op->dtype == t && row < col;
}

/* Can the call stage its records a tile at a time? x like that, dy and y
 * of the call's dtype (any layout: a tile moves them as well as record by
 * record does), fixed parameters, and tiles of at most LN_TILE_MAX_BYTES. */
static int tileable(const ln_job *job, const ln_op_info *info)
{
    return params_fixed(job) && job->d <= LN_TILE_MAX_BYTES / (LN_TILE_ROWS * 8) &&
           tile_operand(&job->x, job->dtype) && job->y.dtype == job->dtype &&
           (!info->reads_dy || job->dy.dtype == job->dtype);
}

int ln_batch_run(const ln_kernels *k, const ln_job *job, int n_threads)
{
    const ln_op_info *info = &op_info[job->op];
    if (job->n_rows == 0)
        return LN_OK;
    if (job->d == 0) { /* empty records: nothing to write but NaN statistics */
        for (size_t r = 0; info->writes_stats && r < job->n_rows; r++) {
            if (job->mean.ptr)
                ln_write_scalar(&job->mean, r, NAN);
            if (job->var.ptr)
                ln_write_scalar(&job->var, r, NAN);
        }
        return LN_OK;
    }
    size_t row_bytes = job->d * ln_dtype_size(job->dtype);
    ln_batch_ctx c = {
        .k = k,
        .job = job,
        .info = info,
        .kernel = k->op[job->op][job->dtype],
        .ctype = ln_compute_dtype(job->dtype),
        .in_place = ln_rows_are_direct(&job->x, job->dtype) &&
                    ln_rows_are_direct(&job->y, job->dtype) &&
                    (!info->reads_dy || ln_rows_are_direct(&job->dy, job->dtype)),
    };
    c.stream = streams_output(job, info->reads_dy, job->n_rows * row_bytes);
    c.ahead = large_output(forward_bytes(info->reads_dy, job->n_rows * row_bytes));
    c.tiled = !c.in_place && tileable(job, info);
    ln_task task = {
        .ctx = &c,
        .begin = worker_begin,
        .run = worker_run,
        .end = worker_end,
        .worse = worse,
    };
    int backward = info->reads_dy;
    size_t threads = backward ? plan_threads(job, n_threads, LN_BACK_THREAD_MIN_BYTES,
                                             LN_BACK_THREAD_MIN_ROWS)
                              : plan_threads(job, n_threads, LN_THREAD_MIN_BYTES, 1);
    size_t chunk = chunk_rows(row_bytes, backward);
    if (threads > 1)
        return ln_parallel_for(job->n_rows, chunk, threads, &task);
    /* One thread: the pool's steps with the worker on the stack (a
     * one-record call from Python notices the allocation). */
    ln_worker wk;
    memset(&wk, 0, sizeof wk);
    wk.borrowed = 1;
    int status = worker_init(&wk, &c);
    if (status == LN_OK) {
        status = worker_run(&c, &wk, 0, job->n_rows);
        worker_finish(&c, &wk);
    }
    worker_release(&wk);
    return status;
}
