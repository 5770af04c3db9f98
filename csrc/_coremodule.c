/*
 * _coremodule.c - the CPython/NumPy glue of layernorm_c._core.
 *
 * Registers the generalized ufuncs (one table, looped over), whose inner
 * loops hand NumPy's dimensions and strides to ln_batch_run; the fast path
 * for the common call; and the settings (instruction-set level, threads).
 * No numerics live here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define NPY_NO_DEPRECATED_API NPY_1_23_API_VERSION
#define NPY_TARGET_VERSION NPY_1_23_API_VERSION
#include <numpy/arrayobject.h>
#include <numpy/ufuncobject.h>
#include <fenv.h>
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if !defined(_WIN32)
#include <unistd.h>
#endif

#include "layernorm.h"
#include "ln_cache.h"
#include "ln_pool.h"

/* Current settings; read by every call, changed only from Python. */
static const ln_kernels *g_kernels = &ln_kernels_scalar;
static ln_isa g_isa = LN_ISA_SCALAR;
static int g_threads = 1;

/* A limit on the threads of the calls made from this thread (0: none).
 * Dask tasks set it to 1, so each worker thread computes its own chunk
 * without also waking the pool (see _set_thread_limit). */
#if defined(_MSC_VER)
#define LN_THREAD_LOCAL __declspec(thread)
#else
#define LN_THREAD_LOCAL _Thread_local
#endif
static LN_THREAD_LOCAL int t_thread_limit = 0;

/* The threads of a call: the setting, within this thread's limit. */
static int call_threads(void)
{
    int n = g_threads;
    return t_thread_limit > 0 && t_thread_limit < n ? t_thread_limit : n;
}

/* ---- dtypes ------------------------------------------------------------- */

/* bfloat16 has no NumPy type number until a package (ml_dtypes) registers
 * the type and the Python package hands it to _register_bfloat16: -1
 * until then, and nothing of bfloat16 is reachable. */
static int g_bf16_type = -1;

/* The NumPy type numbers of the storage dtypes. */
static int npy_type_of(ln_dtype t)
{
    switch (t) {
    case LN_F16: return NPY_HALF;
    case LN_BF16: return g_bf16_type;
    case LN_F32: return NPY_FLOAT;
    case LN_F64: return NPY_DOUBLE;
    default: return -1;
    }
}

static int ln_dtype_of(int type_num, ln_dtype *t)
{
    switch (type_num) {
    case NPY_HALF: *t = LN_F16; return 0;
    case NPY_FLOAT: *t = LN_F32; return 0;
    case NPY_DOUBLE: *t = LN_F64; return 0;
    default:
        if (type_num >= 0 && type_num == g_bf16_type) {
            *t = LN_BF16;
            return 0;
        }
        return -1;
    }
}

/* Statistics are float32 for records computed in float, float64 else. */
static ln_dtype stats_dtype(ln_dtype t)
{
    return t == LN_F64 ? LN_F64 : LN_F32;
}

/* ---- the gufuncs -------------------------------------------------------- */

/* The op's public name, for the ufuncs' names and the error messages. */
static const char *op_name(ln_op op)
{
    static const char *const names[LN_NOPS] = {
        [LN_OP_LAYER_NORM] = "layer_norm",
        [LN_OP_LAYER_NORM_BACKWARD] = "layer_norm_backward",
        [LN_OP_RMS_NORM] = "rms_norm",
        [LN_OP_RMS_NORM_BACKWARD] = "rms_norm_backward",
    };
    return names[op];
}

/* The error of scratch memory that could not be had. */
static void set_no_scratch(ln_op op)
{
    PyErr_Format(PyExc_MemoryError, "%s: could not allocate the kernels' scratch rows",
                 op_name(op));
}

/* Jobs of fewer items than this keep the GIL: they take a few
 * microseconds at most (no other thread waits long), and releasing and
 * taking it back costs about as much as the kernels of a (1, 768)
 * record. NumPy's loops keep it below 500 items. */
#define LN_GIL_MIN_ITEMS 4096

/* A job from a direct entry point, the GIL released (but for small
 * jobs): 0, or -1 with MemoryError set when the kernels could not have
 * their scratch rows. */
static int run_job(const ln_job *job)
{
    int rc;
    if (job->n_rows * job->d < LN_GIL_MIN_ITEMS) {
        rc = ln_batch_run(g_kernels, job, call_threads());
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = ln_batch_run(g_kernels, job, call_threads());
        Py_END_ALLOW_THREADS
    }
    if (rc == LN_ENOMEM) {
        set_no_scratch(job->op);
        return -1;
    }
    return 0;
}

/* One generalized ufunc: which operands it has, in NumPy's order
 * [dy], x, [weight], [bias], eps -> y, [mean, var] (or [ms]). */
typedef struct {
    const char *attr;      /* module attribute */
    const char *signature;
    const char *doc;
    ln_op op;
    int has_dy, has_w, has_b;
    int n_stats; /* statistics out: 0, 1 (RMSNorm's mean square), 2 (mean, var) */
} ln_gufunc;

#define LN_LOOP_DTYPES 3 /* float16, float32, float64 */

static const char public_doc[] =
    "layer_norm_ufunc(x, weight, bias, eps, /, out=None, *, axes=None, ...)\n"
    "\n"
    "Layer normalization as a generalized ufunc, signature\n"
    "(n),(n),(n),()->(n): every record of n features along the core axis\n"
    "is normalized by its own mean and population variance, then scaled by\n"
    "weight and shifted by bias; eps is added to the variance inside the\n"
    "square root. Loops: float16 (computed in float32), float32, float64.\n"
    "An invalid eps (negative, NaN, inf) gives NaN records and the\n"
    "floating-point 'invalid' warning; layer_norm() raises instead.\n"
    "MemoryError if the kernels' scratch rows cannot be allocated.";

static const char backward_doc[] =
    "layer_norm_backward_ufunc(dy, x, weight, eps, /, out=None, *, axes=None, ...)\n"
    "\n"
    "The gradient of layer normalization with respect to its input, as a\n"
    "generalized ufunc, signature (n),(n),(n),()->(n): for every record x\n"
    "of n features and the gradient dy of its output, dx. weight is the\n"
    "gain (ones for none). The parameter gradients, sums over records,\n"
    "are what layer_norm_backward adds. Loops: float16 (computed in\n"
    "float32), float32, float64. An invalid eps gives NaN records and the\n"
    "floating-point 'invalid' warning.";

static const char rms_doc[] =
    "rms_norm_ufunc(x, weight, eps, /, out=None, *, axes=None, ...)\n"
    "\n"
    "RMS normalization as a generalized ufunc, signature (n),(n),()->(n):\n"
    "every record of n features is divided by sqrt(mean(x^2) + eps) and\n"
    "scaled by weight (pass 1 + weight for the Gemma convention; rms_norm()\n"
    "names it). Loops: float16 (computed in float32), float32, float64.";

static const char rms_backward_doc[] =
    "rms_norm_backward_ufunc(dy, x, weight, eps, /, out=None, *, axes=None, ...)\n"
    "\n"
    "The gradient of RMS normalization with respect to its input, as a\n"
    "generalized ufunc, signature (n),(n),(n),()->(n): dy, x, weight, eps\n"
    "-> dx per record (weight: the scale actually applied).";

static const ln_gufunc gufuncs[] = {
    {.attr = "layer_norm", .signature = "(n),(n),(n),()->(n)", .doc = public_doc,
     .op = LN_OP_LAYER_NORM, .has_w = 1, .has_b = 1},
    {.attr = "_ln_wb", .signature = "(n),(n),(n),()->(n),(),()",
     .doc = "x, weight, bias, eps -> y, mean, var",
     .op = LN_OP_LAYER_NORM, .has_w = 1, .has_b = 1, .n_stats = 2},
    {.attr = "_ln_w", .signature = "(n),(n),()->(n),(),()",
     .doc = "x, weight, eps -> y, mean, var",
     .op = LN_OP_LAYER_NORM, .has_w = 1, .has_b = 0, .n_stats = 2},
    {.attr = "_ln_b", .signature = "(n),(n),()->(n),(),()",
     .doc = "x, bias, eps -> y, mean, var",
     .op = LN_OP_LAYER_NORM, .has_w = 0, .has_b = 1, .n_stats = 2},
    {.attr = "_ln_none", .signature = "(n),()->(n),(),()",
     .doc = "x, eps -> y, mean, var",
     .op = LN_OP_LAYER_NORM, .has_w = 0, .has_b = 0, .n_stats = 2},
    {.attr = "layer_norm_backward", .signature = "(n),(n),(n),()->(n)", .doc = backward_doc,
     .op = LN_OP_LAYER_NORM_BACKWARD, .has_dy = 1, .has_w = 1},
    {.attr = "rms_norm", .signature = "(n),(n),()->(n)", .doc = rms_doc,
     .op = LN_OP_RMS_NORM, .has_w = 1},
    {.attr = "_rms_w", .signature = "(n),(n),()->(n),()", .doc = "x, weight, eps -> y, ms",
     .op = LN_OP_RMS_NORM, .has_w = 1, .n_stats = 1},
    {.attr = "_rms_none", .signature = "(n),()->(n),()", .doc = "x, eps -> y, ms",
     .op = LN_OP_RMS_NORM, .n_stats = 1},
    {.attr = "rms_norm_backward", .signature = "(n),(n),(n),()->(n)", .doc = rms_backward_doc,
     .op = LN_OP_RMS_NORM_BACKWARD, .has_dy = 1, .has_w = 1},
};
#define LN_NGUFUNCS (sizeof gufuncs / sizeof gufuncs[0])

static int gufunc_nin(const ln_gufunc *g) { return 2 + g->has_dy + g->has_w + g->has_b; }
static int gufunc_nout(const ln_gufunc *g) { return 1 + g->n_stats; }

/* What a loop gets as its data: the gufunc and the dtype of the loop. */
typedef struct {
    const ln_gufunc *g;
    ln_dtype dtype;
} ln_loop_data;

static ln_loop_data loop_data[LN_NGUFUNCS][LN_LOOP_DTYPES];
static void *loop_data_ptrs[LN_NGUFUNCS][LN_LOOP_DTYPES];
static char loop_types[LN_NGUFUNCS][LN_LOOP_DTYPES * 8];
static PyUFuncGenericFunction loop_funcs[LN_NGUFUNCS][LN_LOOP_DTYPES];
static const ln_dtype loop_dtypes[LN_LOOP_DTYPES] = {LN_F16, LN_F32, LN_F64};

/* A strided operand from a loop argument: NumPy passes the outer strides
 * of every operand first, then the core strides of those with (n). */
static ln_operand loop_operand(char *arg, npy_intp row, npy_intp col, ln_dtype t)
{
    ln_operand op = {.ptr = arg, .row = row, .col = col, .dtype = t};
    return op;
}

static void fill_job(ln_job *job, const ln_gufunc *g, ln_dtype t, char **args,
                     npy_intp const *dims, npy_intp const *steps)
{
    int nargs = gufunc_nin(g) + gufunc_nout(g);
    const npy_intp *core = steps + nargs;
    int a = 0, c = 0;

    memset(job, 0, sizeof *job);
    job->op = g->op;
    job->dtype = t;
    job->n_rows = (size_t)dims[0];
    job->d = (size_t)dims[1];
    if (g->has_dy)
        job->dy = loop_operand(args[a], steps[a], core[c++], t), a++;
    job->x = loop_operand(args[a], steps[a], core[c++], t), a++;
    if (g->has_w)
        job->w = loop_operand(args[a], steps[a], core[c++], t), a++;
    if (g->has_b)
        job->b = loop_operand(args[a], steps[a], core[c++], t), a++;
    job->eps = loop_operand(args[a], steps[a], 0, LN_F64), a++;
    job->y = loop_operand(args[a], steps[a], core[c++], t), a++;
    if (g->n_stats == 2)
        job->mean = loop_operand(args[a], steps[a], 0, stats_dtype(t)), a++;
    if (g->n_stats >= 1)
        job->var = loop_operand(args[a], steps[a], 0, stats_dtype(t)), a++;
}

/* The inner loop of every gufunc. An invalid eps gives NaN records and
 * raises the floating-point invalid flag, which NumPy reports as usual
 * (RuntimeWarning, or an error under np.errstate); any other flag the
 * kernels raise on the way is discarded (it would depend on the code path
 * and thread count, not on the result). Scratch memory that cannot be had
 * is a MemoryError, raised here the NumPy way: holding the GIL. */
static void gufunc_loop(char **args, npy_intp const *dims, npy_intp const *steps,
                        void *data)
{
    const ln_loop_data *ld = data;
    ln_job job;
    fenv_t env;
    fill_job(&job, ld->g, ld->dtype, args, dims, steps);
    feholdexcept(&env);
    int rc = ln_batch_run(g_kernels, &job, call_threads());
    fesetenv(&env);
    if (rc == LN_ENOMEM) {
        NPY_ALLOW_C_API_DEF
        NPY_ALLOW_C_API;
        if (!PyErr_Occurred())
            set_no_scratch(ld->g->op);
        NPY_DISABLE_C_API;
    } else if (rc == LN_EBADEPS) {
        feraiseexcept(FE_INVALID);
    }
}

/* Operand types of one loop: the loop dtype for rows and parameters,
 * float64 for eps, the statistics dtype for mean and var. */
static void fill_types(char *types, const ln_gufunc *g, ln_dtype t)
{
    int n = 0;
    char row = (char)npy_type_of(t), stat = (char)npy_type_of(stats_dtype(t));
    if (g->has_dy)
        types[n++] = row;
    types[n++] = row;
    if (g->has_w)
        types[n++] = row;
    if (g->has_b)
        types[n++] = row;
    types[n++] = NPY_DOUBLE;
    types[n++] = row;
    for (int i = 0; i < g->n_stats; i++)
        types[n++] = stat;
}

/* The gufuncs' objects, kept to register the bfloat16 loops later. */
static PyObject *gufunc_objects[LN_NGUFUNCS];

static int add_gufuncs(PyObject *m)
{
    for (size_t i = 0; i < LN_NGUFUNCS; i++) {
        const ln_gufunc *g = &gufuncs[i];
        for (int j = 0; j < LN_LOOP_DTYPES; j++) {
            loop_data[i][j].g = g;
            loop_data[i][j].dtype = loop_dtypes[j];
            loop_data_ptrs[i][j] = &loop_data[i][j];
            loop_funcs[i][j] = gufunc_loop;
            fill_types(loop_types[i] + j * (gufunc_nin(g) + gufunc_nout(g)), g,
                       loop_dtypes[j]);
        }
        PyObject *uf = PyUFunc_FromFuncAndDataAndSignature(
            loop_funcs[i], loop_data_ptrs[i], loop_types[i], LN_LOOP_DTYPES,
            gufunc_nin(g), gufunc_nout(g), PyUFunc_None, op_name(g->op), g->doc, 0,
            g->signature);
        if (uf == NULL)
            return -1;
        gufunc_objects[i] = uf; /* the module keeps the reference */
        if (PyModule_AddObject(m, g->attr, uf) < 0) {
            Py_DECREF(uf);
            return -1;
        }
    }
    return 0;
}

static ln_loop_data bf16_loop_data[LN_NGUFUNCS];

/*
 * _register_bfloat16(dtype): the bfloat16 loops for every gufunc, for the
 * type number of `dtype` (ml_dtypes.bfloat16: the Python package checks
 * its bits are bfloat16's). Rows, weight and bias bfloat16, eps float64,
 * statistics float32. Once per process; calling it again with the same
 * type does nothing, another type is a ValueError.
 */
static PyObject *register_bfloat16(PyObject *self, PyObject *arg)
{
    PyArray_Descr *descr = NULL;
    if (!PyArray_DescrCheck(arg)) {
        PyErr_SetString(PyExc_TypeError, "_register_bfloat16(dtype): expected a dtype");
        return NULL;
    }
    descr = (PyArray_Descr *)arg;
    int type = descr->type_num;
    if (type < NPY_USERDEF || PyDataType_ELSIZE(descr) != 2) {
        PyErr_SetString(PyExc_ValueError,
                        "_register_bfloat16: expected a 2-byte user dtype (ml_dtypes.bfloat16)");
        return NULL;
    }
    if (g_bf16_type == type)
        Py_RETURN_NONE;
    if (g_bf16_type >= 0) {
        PyErr_SetString(PyExc_ValueError, "_register_bfloat16: another type is registered");
        return NULL;
    }
    for (size_t i = 0; i < LN_NGUFUNCS; i++) {
        const ln_gufunc *g = &gufuncs[i];
        int types[16], n = 0;
        if (g->has_dy)
            types[n++] = type;
        types[n++] = type;
        if (g->has_w)
            types[n++] = type;
        if (g->has_b)
            types[n++] = type;
        types[n++] = NPY_DOUBLE;
        types[n++] = type;
        for (int k = 0; k < g->n_stats; k++)
            types[n++] = NPY_FLOAT;
        bf16_loop_data[i] = (ln_loop_data){.g = g, .dtype = LN_BF16};
        if (PyUFunc_RegisterLoopForType((PyUFuncObject *)gufunc_objects[i], type, gufunc_loop,
                                        types, &bf16_loop_data[i]) < 0)
            return NULL;
    }
    g_bf16_type = type;
    Py_RETURN_NONE;
}

/* ---- the fast path ------------------------------------------------------ */

/* The dtype of an array the fast path can take as is: exact ndarray,
 * aligned, native float16/32/64. -1 otherwise. */
static int fast_dtype(PyObject *o, ln_dtype *t)
{
    if (!PyArray_CheckExact(o))
        return -1;
    PyArrayObject *a = (PyArrayObject *)o;
    if (!PyArray_ISALIGNED(a) || !PyArray_ISNOTSWAPPED(a))
        return -1;
    return ln_dtype_of(PyArray_TYPE(a), t);
}

/* The promotion of two dtypes: the wider of float16/32/64; float16 and
 * bfloat16 together give float32 (each converts exactly to it, neither to
 * the other), as in PyTorch. */
static ln_dtype wider(ln_dtype a, ln_dtype b)
{
    if (ln_dtype_size(a) == 2 && ln_dtype_size(b) == 2 && a != b)
        return LN_F32;
    return ln_dtype_size(a) >= ln_dtype_size(b) ? a : b;
}

/* weight/bias: None, or a 1-d (d,) float array of any supported dtype and
 * stride. Widens *result to include its dtype. */
static int fast_param(PyObject *o, npy_intp d, ln_operand *op, ln_dtype *result)
{
    memset(op, 0, sizeof *op);
    if (o == Py_None)
        return 0;
    ln_dtype t;
    if (fast_dtype(o, &t) < 0)
        return -1;
    PyArrayObject *a = (PyArrayObject *)o;
    if (PyArray_NDIM(a) != 1 || PyArray_DIM(a, 0) != d)
        return -1;
    op->ptr = PyArray_BYTES(a);
    op->col = PyArray_STRIDE(a, 0);
    op->dtype = t;
    *result = wider(*result, t);
    return 0;
}

/* ---- output memory ------------------------------------------------------ */

/* A call's new output of LN_CACHE_MIN_BYTES or more is allocated through
 * this handler: when the array dies, its block goes to ln_cache (kept,
 * within the limit set by set_output_cache, for the next output of the
 * same size, whose pages are then already there) instead of back to
 * malloc. Each block begins with its size (NumPy tells free the array's
 * size as it is then; the header is what was allocated), in 16 bytes:
 * the data keep malloc's alignment. Smaller outputs, and every other
 * array, use NumPy's own handler. */
#define OUT_HEADER 16
_Static_assert(OUT_HEADER >= sizeof(size_t) && OUT_HEADER % 16 == 0,
               "the header holds a size and keeps 16-byte alignment");

/* Set by out_malloc: the block came from the cache. Read under the GIL
 * right after the allocation it describes (new_output). */
static LN_THREAD_LOCAL int t_out_reused = 0;

static void *out_data(char *block, size_t bytes)
{
    memcpy(block, &bytes, sizeof bytes);
    return block + OUT_HEADER;
}

static void *out_malloc(void *ctx, size_t bytes)
{
    (void)ctx;
    if (bytes > SIZE_MAX - OUT_HEADER)
        return NULL;
    char *block = ln_cache_take(bytes + OUT_HEADER);
    t_out_reused = block != NULL;
    if (block == NULL)
        block = malloc(bytes + OUT_HEADER);
    if (block == NULL) { /* the kept blocks may be what is missing */
        ln_cache_release();
        block = malloc(bytes + OUT_HEADER);
    }
    return block ? out_data(block, bytes) : NULL;
}

static void *out_calloc(void *ctx, size_t n, size_t size)
{
    (void)ctx;
    if (size != 0 && n > (SIZE_MAX - OUT_HEADER) / size)
        return NULL;
    char *block = calloc(1, n * size + OUT_HEADER);
    return block ? out_data(block, n * size) : NULL;
}

static void *out_realloc(void *ctx, void *data, size_t bytes)
{
    if (data == NULL)
        return out_malloc(ctx, bytes);
    if (bytes > SIZE_MAX - OUT_HEADER)
        return NULL;
    char *block = realloc((char *)data - OUT_HEADER, bytes + OUT_HEADER);
    return block ? out_data(block, bytes) : NULL;
}

static void out_free(void *ctx, void *data, size_t size)
{
    (void)ctx, (void)size; /* the header's size is the block's */
    if (data == NULL)
        return;
    char *block = (char *)data - OUT_HEADER;
    size_t bytes;
    memcpy(&bytes, block, sizeof bytes);
    ln_cache_give(block, bytes + OUT_HEADER);
}

/* The cache's limit at import: 1 GiB, or a sixteenth of the machine's
 * memory when that is less. */
static size_t default_cache_limit(void)
{
    size_t limit = (size_t)1 << 30;
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && (size_t)pages / 16 < limit / (size_t)page)
        limit = (size_t)pages / 16 * (size_t)page;
#endif
    return limit;
}

static PyDataMem_Handler out_handler = {
    .name = "layernorm_c_outputs",
    .version = 1,
    .allocator = {.ctx = NULL, .malloc = out_malloc, .calloc = out_calloc,
                  .realloc = out_realloc, .free = out_free},
};
static PyObject *out_handler_capsule; /* "mem_handler", made at import */

/* A new C-ordered array for a call's output. *fresh: its pages are new
 * (never written: the kernels then do not stream into it, see
 * ln_batch.c), 0 when it reuses a kept block. */
static PyObject *new_output(int nd, npy_intp *dims, ln_dtype t, int *fresh)
{
    int type = npy_type_of(t);
    size_t bytes = (size_t)PyArray_MultiplyList(dims, nd) * ln_dtype_size(t);
    *fresh = 1;
    if (bytes < LN_CACHE_MIN_BYTES || ln_cache_limit() == 0)
        return PyArray_SimpleNew(nd, dims, type);
    PyObject *numpys = PyDataMem_SetHandler(out_handler_capsule);
    if (numpys == NULL)
        return NULL;
    t_out_reused = 0;
    PyObject *y = PyArray_SimpleNew(nd, dims, type);
    int reused = t_out_reused;
    PyObject *ours = PyDataMem_SetHandler(numpys);
    Py_DECREF(numpys);
    if (ours == NULL) {
        Py_XDECREF(y);
        return NULL;
    }
    Py_DECREF(ours);
    *fresh = !reused;
    return y;
}

/* Does [p, p + n) share a byte with the data of a? */
static int overlaps(PyArrayObject *a, const char *p, size_t n)
{
    const char *lo = PyArray_BYTES(a), *hi = lo + PyArray_NBYTES(a);
    return p < hi && lo < p + n;
}

/* out for the fast path: None (allocate), or an exact, C-contiguous,
 * aligned, writeable array shaped like x, of the result dtype, that is x
 * itself or does not overlap it (partial overlap needs the ufunc's copy
 * logic). -1: not for the fast path; -2: error set. */
static int fast_out(PyObject *o, PyArrayObject *x, ln_dtype t, PyObject **y, int *fresh)
{
    ln_dtype ot;
    *fresh = 0;
    if (o == Py_None) {
        *y = new_output(PyArray_NDIM(x), PyArray_DIMS(x), t, fresh);
        return *y == NULL ? -2 : 0;
    }
    if (fast_dtype(o, &ot) < 0 || ot != t)
        return -1;
    PyArrayObject *a = (PyArrayObject *)o;
    /* ndim first: the shapes are compared over x's ndim entries. */
    if (PyArray_NDIM(a) != PyArray_NDIM(x) ||
        !PyArray_CompareLists(PyArray_DIMS(a), PyArray_DIMS(x), PyArray_NDIM(x)) ||
        !PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISWRITEABLE(a))
        return -1;
    int same = PyArray_BYTES(a) == PyArray_BYTES(x) && PyArray_TYPE(a) == PyArray_TYPE(x);
    if (!same && overlaps(a, PyArray_BYTES(x), (size_t)PyArray_NBYTES(x)))
        return -1;
    Py_INCREF(o);
    *y = o;
    return 0;
}

/* If the parameter shares memory with y, replace it by a contiguous copy
 * in *copy (freed by the caller): it would change under the rows already
 * written. -1 with MemoryError set if the copy cannot be had. */
static int param_copy_if_overlap(PyArrayObject *y, ln_operand *p, size_t d, char **copy)
{
    *copy = NULL;
    if (p->ptr == NULL)
        return 0;
    size_t isz = ln_dtype_size(p->dtype);
    ptrdiff_t span = (ptrdiff_t)(d - 1) * p->col;
    const char *lo = span < 0 ? p->ptr + span : p->ptr;
    if (!overlaps(y, lo, (size_t)(span < 0 ? -span : span) + isz))
        return 0;
    *copy = PyMem_Malloc(d * isz);
    if (*copy == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < d; i++)
        memcpy(*copy + i * isz, p->ptr + (ptrdiff_t)i * p->col, isz);
    p->ptr = *copy;
    p->col = (ptrdiff_t)isz;
    return 0;
}

/* A per-record operand of a new contiguous array (statistics out). */
static ln_operand stats_operand(PyObject *a)
{
    ln_operand op = {.ptr = PyArray_BYTES((PyArrayObject *)a),
                     .row = PyArray_ITEMSIZE((PyArrayObject *)a)};
    ln_dtype_of(PyArray_TYPE((PyArrayObject *)a), &op.dtype);
    return op;
}

/*
 * fast_norm: _fast(x, weight, bias, eps, out, return_stats) is layer_norm over the last
 * axis for the common case (C-contiguous native float x; (d,) float
 * parameters of any dtype and stride, or None; a valid float eps; out None
 * or a matching C-contiguous array; a bool return_stats). Returns
 * NotImplemented for anything else, and the Python wrapper then takes the
 * general path, which validates and explains. It skips the ufunc
 * machinery: for one small record that machinery costs far more than the
 * arithmetic. Mixed dtypes are computed in the widest, converting rows as
 * they are read, like the general path's promotion.
 */
static PyObject *fast_norm(ln_op op, PyObject *const *args, int w_in_ctype)
{
    ln_dtype xt;
    if (fast_dtype(args[0], &xt) < 0)
        Py_RETURN_NOTIMPLEMENTED;
    PyArrayObject *x = (PyArrayObject *)args[0];
    int nd = PyArray_NDIM(x);
    if (nd < 1 || !PyArray_IS_C_CONTIGUOUS(x))
        Py_RETURN_NOTIMPLEMENTED;
    npy_intp d = PyArray_DIM(x, nd - 1);
    if (d < 1 || !PyFloat_Check(args[3]))
        Py_RETURN_NOTIMPLEMENTED;
    double eps = PyFloat_AS_DOUBLE(args[3]);
    if (!(eps >= 0.0 && eps <= DBL_MAX) || !PyBool_Check(args[5]))
        Py_RETURN_NOTIMPLEMENTED; /* the wrapper explains */
    int want_stats = args[5] == Py_True;

    ln_job job;
    memset(&job, 0, sizeof job);
    job.op = op;
    job.dtype = xt;
    if (fast_param(args[1], d, &job.w, &job.dtype) < 0 ||
        fast_param(args[2], d, &job.b, &job.dtype) < 0)
        Py_RETURN_NOTIMPLEMENTED;
    if (w_in_ctype) { /* the weight is x's compute type: the result keeps x's dtype */
        if (job.w.ptr == NULL || job.w.dtype != ln_compute_dtype(xt))
            Py_RETURN_NOTIMPLEMENTED;
        job.dtype = xt;
    }

    PyObject *y = NULL, *mean = NULL, *var = NULL;
    int fresh;
    int rc_out = fast_out(args[4], x, job.dtype, &y, &fresh);
    if (rc_out == -1)
        Py_RETURN_NOTIMPLEMENTED;
    if (rc_out < 0)
        return NULL;
    if (want_stats) {
        int st = npy_type_of(stats_dtype(job.dtype));
        var = PyArray_SimpleNew(nd - 1, PyArray_DIMS(x), st);
        if (var == NULL)
            goto fail;
        job.var = stats_operand(var);
        if (op == LN_OP_LAYER_NORM) { /* RMSNorm returns its mean square alone */
            mean = PyArray_SimpleNew(nd - 1, PyArray_DIMS(x), st);
            if (mean == NULL)
                goto fail;
            job.mean = stats_operand(mean);
        }
    }

    npy_intp x_isz = PyArray_ITEMSIZE(x);
    npy_intp y_isz = (npy_intp)ln_dtype_size(job.dtype);
    job.d = (size_t)d;
    job.n_rows = (size_t)(PyArray_SIZE(x) / d);
    job.x = (ln_operand){.ptr = PyArray_BYTES(x), .row = d * x_isz, .col = x_isz,
                         .dtype = xt};
    job.y = (ln_operand){.ptr = PyArray_BYTES((PyArrayObject *)y), .row = d * y_isz,
                         .col = y_isz, .dtype = job.dtype};
    job.y_new = fresh;
    job.eps = (ln_operand){.ptr = (char *)&eps, .dtype = LN_F64};

    char *w_copy = NULL, *b_copy = NULL;
    if (param_copy_if_overlap((PyArrayObject *)y, &job.w, job.d, &w_copy) < 0 ||
        param_copy_if_overlap((PyArrayObject *)y, &job.b, job.d, &b_copy) < 0) {
        PyMem_Free(w_copy);
        goto fail;
    }

    int rc = run_job(&job);
    PyMem_Free(w_copy);
    PyMem_Free(b_copy);
    if (rc < 0)
        goto fail;
    if (!want_stats)
        return y;
    if (op == LN_OP_RMS_NORM)
        return Py_BuildValue("(NN)", y, var);
    return Py_BuildValue("(NNN)", y, mean, var);

fail:
    Py_XDECREF(y);
    Py_XDECREF(mean);
    Py_XDECREF(var);
    return NULL;
}

/* _fast(x, weight, bias, eps, out, return_stats): see fast_norm. */
static PyObject *fast_layer_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6)
        Py_RETURN_NOTIMPLEMENTED;
    return fast_norm(LN_OP_LAYER_NORM, args, 0);
}

/* _fast_rms(x, weight, eps, out, return_stats[, scale]): the same for
 * RMSNorm, returning y or (y, ms). With scale true the weight is the
 * applied scale in x's compute type (Gemma's 1 + weight, rounded once in
 * float for float16 x) and the result keeps x's dtype. */
static PyObject *fast_rms_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 && nargs != 6)
        Py_RETURN_NOTIMPLEMENTED;
    int scale = nargs == 6 ? PyObject_IsTrue(args[5]) : 0;
    if (scale < 0)
        return NULL;
    PyObject *full[6] = {args[0], args[1], Py_None, args[2], args[3], args[4]};
    return fast_norm(LN_OP_RMS_NORM, full, scale);
}

/* ---- the public entry points -------------------------------------------- */

/*
 * layer_norm and rms_norm as C callables in front of their Python
 * implementations (like NumPy's C dispatchers): the common call goes
 * straight to fast_norm, any other call (and any the fast path declines)
 * to the implementation, with the arguments as given. The Python frame
 * in front of _fast had cost ~110 ns of a (1, 768) float32 call's ~600.
 * The implementation validates, explains and documents: functools.wraps
 * copies its name, docstring and signature (__wrapped__) here.
 */
enum { ARG_X, ARG_W, ARG_B, ARG_EPS, ARG_AXIS, ARG_OUT, ARG_STATS, ARG_CONVENTION, N_ARGS };

/* Each entry's parameters: the positional ones in order, then the
 * keyword-only ones (the Python signature's; a test compares them). */
typedef struct {
    const char *name;
    ln_op op;
    int n_pos;
    int params[N_ARGS];
    int n_params;
} ln_entry_kind;

static const char *const arg_names[N_ARGS] = {
    [ARG_X] = "x", [ARG_W] = "weight", [ARG_B] = "bias", [ARG_EPS] = "eps",
    [ARG_AXIS] = "axis", [ARG_OUT] = "out", [ARG_STATS] = "return_stats",
    [ARG_CONVENTION] = "convention",
};

static const ln_entry_kind entry_kinds[] = {
    {.name = "layer_norm", .op = LN_OP_LAYER_NORM, .n_pos = 4,
     .params = {ARG_X, ARG_W, ARG_B, ARG_EPS, ARG_AXIS, ARG_OUT, ARG_STATS}, .n_params = 7},
    {.name = "rms_norm", .op = LN_OP_RMS_NORM, .n_pos = 3,
     .params = {ARG_X, ARG_W, ARG_EPS, ARG_AXIS, ARG_OUT, ARG_STATS, ARG_CONVENTION},
     .n_params = 7},
};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    const ln_entry_kind *kind;
    PyObject *impl;   /* the Python function */
    PyObject *eps;    /* its default eps */
    PyObject *result; /* the named tuple of return_stats=True */
    PyObject *dict;   /* what functools.wraps copies */
    PyObject *weakrefs; /* weak references to it, as to a function */
} ln_entry;

/* The names interned (PyInit__core): keywords in a call from Python code
 * are the same objects, found by address; any other string by value. */
static PyObject *arg_strs[N_ARGS];

/* The parameter of keyword `key`, or -1. */
static int entry_param(const ln_entry_kind *k, PyObject *key)
{
    if (!PyUnicode_Check(key)) /* only a C caller passes one: not the common call */
        return -1;
    for (int i = 0; i < k->n_params; i++)
        if (key == arg_strs[k->params[i]])
            return k->params[i];
    for (int i = 0; i < k->n_params; i++)
        if (PyUnicode_Compare(key, arg_strs[k->params[i]]) == 0)
            return k->params[i];
    return -1;
}

/* The arguments by parameter, defaults filled in; 0 if the call is not
 * the common case (an unknown or repeated keyword, an axis other than
 * the int -1, a return_stats that is no bool, a convention other than
 * "weight"). */
static int entry_args(const ln_entry *e, PyObject *const *args, size_t nargsf, PyObject *kwnames,
                      PyObject *a[N_ARGS])
{
    const ln_entry_kind *k = e->kind;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs > k->n_pos)
        return 0;
    for (int i = 0; i < N_ARGS; i++)
        a[i] = NULL;
    for (Py_ssize_t i = 0; i < nargs; i++)
        a[k->params[i]] = args[i];
    for (Py_ssize_t i = 0; i < nkw; i++) {
        int p = entry_param(k, PyTuple_GET_ITEM(kwnames, i));
        if (p < 0 || a[p] != NULL)
            return 0;
        a[p] = args[nargs + i];
    }
    if (a[ARG_X] == NULL)
        return 0;
    if (a[ARG_AXIS] != NULL) {
        int overflow = 0; /* an int too large for a long: no -1, and no error */
        if (!PyLong_CheckExact(a[ARG_AXIS]) ||
            PyLong_AsLongAndOverflow(a[ARG_AXIS], &overflow) != -1 || overflow)
            return 0;
    }
    if (a[ARG_STATS] != NULL && !PyBool_Check(a[ARG_STATS]))
        return 0;
    if (a[ARG_CONVENTION] != NULL && !(PyUnicode_CheckExact(a[ARG_CONVENTION]) &&
                                        PyUnicode_CompareWithASCIIString(a[ARG_CONVENTION],
                                                                         "weight") == 0))
        return 0;
    a[ARG_W] = a[ARG_W] ? a[ARG_W] : Py_None;
    a[ARG_B] = a[ARG_B] ? a[ARG_B] : Py_None;
    a[ARG_EPS] = a[ARG_EPS] ? a[ARG_EPS] : e->eps;
    a[ARG_OUT] = a[ARG_OUT] ? a[ARG_OUT] : Py_None;
    a[ARG_STATS] = a[ARG_STATS] ? a[ARG_STATS] : Py_False;
    return 1;
}

static PyObject *entry_call(PyObject *self, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames)
{
    ln_entry *e = (ln_entry *)self;
    PyObject *a[N_ARGS];
    if (entry_args(e, args, nargsf, kwnames, a)) {
        PyObject *fast[6] = {a[ARG_X], a[ARG_W], a[ARG_B], a[ARG_EPS], a[ARG_OUT], a[ARG_STATS]};
        PyObject *res = fast_norm(e->kind->op, fast, 0);
        if (res != Py_NotImplemented) {
            if (res == NULL || !PyTuple_CheckExact(res))
                return res; /* y, or the error */
            /* (y, statistics): made the named tuple, as its own __new__ does */
            PyObject *arg = PyTuple_Pack(1, res), *named = NULL;
            Py_DECREF(res);
            if (arg != NULL)
                named = PyTuple_Type.tp_new((PyTypeObject *)e->result, arg, NULL);
            Py_XDECREF(arg);
            return named;
        }
        Py_DECREF(res);
    }
    return PyObject_Vectorcall(e->impl, args, nargsf, kwnames);
}

/* Bound as a method when it is a class attribute, as a function is. */
static PyObject *entry_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

/* Pickled by name, as a function is. */
static PyObject *entry_reduce(PyObject *self, PyObject *noargs)
{
    return PyObject_GetAttrString(((ln_entry *)self)->impl, "__qualname__");
}

static int entry_traverse(PyObject *self, visitproc visit, void *arg)
{
    ln_entry *e = (ln_entry *)self;
    Py_VISIT(e->impl);
    Py_VISIT(e->eps);
    Py_VISIT(e->result);
    Py_VISIT(e->dict);
    return 0;
}

static int entry_clear(PyObject *self)
{
    ln_entry *e = (ln_entry *)self;
    Py_CLEAR(e->impl);
    Py_CLEAR(e->eps);
    Py_CLEAR(e->result);
    Py_CLEAR(e->dict);
    return 0;
}

static void entry_dealloc(PyObject *self)
{
    PyObject_GC_UnTrack(self);
    if (((ln_entry *)self)->weakrefs != NULL)
        PyObject_ClearWeakRefs(self);
    entry_clear(self);
    Py_TYPE(self)->tp_free(self);
}

static PyMethodDef entry_methods[] = {
    {"__reduce__", entry_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef entry_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject entry_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "layernorm_c._core._Entry",
    .tp_doc = "A public function of layernorm_c: its common call in C, the rest in Python.",
    .tp_basicsize = sizeof(ln_entry),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(ln_entry, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = entry_get,
    .tp_dictoffset = offsetof(ln_entry, dict),
    .tp_weaklistoffset = offsetof(ln_entry, weakrefs),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_traverse = entry_traverse,
    .tp_clear = entry_clear,
    .tp_dealloc = entry_dealloc,
    .tp_methods = entry_methods,
    .tp_getset = entry_getset,
};

/* _entry(impl, name, result): the entry point of layer_norm or rms_norm
 * in front of impl, the Python function of that name (its last positional
 * default is eps's); result, the named tuple (a tuple subclass) it returns
 * with the statistics. */
static PyObject *make_entry(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyFunction_Check(args[0]) || !PyUnicode_Check(args[1]) ||
        !PyType_Check(args[2]) || !PyType_IsSubtype((PyTypeObject *)args[2], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError,
                        "_entry(impl, name, result): a function, its name, a tuple type");
        return NULL;
    }
    const ln_entry_kind *kind = NULL;
    for (size_t i = 0; i < sizeof entry_kinds / sizeof entry_kinds[0]; i++)
        if (PyUnicode_CompareWithASCIIString(args[1], entry_kinds[i].name) == 0)
            kind = &entry_kinds[i];
    PyObject *defaults = PyFunction_GetDefaults(args[0]);
    if (kind == NULL || defaults == NULL || !PyTuple_Check(defaults) ||
        PyTuple_GET_SIZE(defaults) < 1) {
        PyErr_SetString(PyExc_ValueError, "_entry: no entry of that name, or no default eps");
        return NULL;
    }
    ln_entry *e = PyObject_GC_New(ln_entry, &entry_type);
    if (e == NULL)
        return NULL;
    e->vectorcall = entry_call;
    e->kind = kind;
    e->impl = args[0];
    e->eps = PyTuple_GET_ITEM(defaults, PyTuple_GET_SIZE(defaults) - 1);
    e->result = args[2];
    Py_INCREF(e->impl);
    Py_INCREF(e->eps);
    Py_INCREF(e->result);
    e->dict = NULL;
    e->weakrefs = NULL;
    PyObject_GC_Track(e);
    return (PyObject *)e;
}

/* The parameter names of entry `name`, in order (for the test that they
 * are the Python signature's). */
static PyObject *entry_params(PyObject *self, PyObject *name)
{
    if (!PyUnicode_Check(name)) {
        PyErr_SetString(PyExc_TypeError, "_entry_params(name): a str");
        return NULL;
    }
    for (size_t i = 0; i < sizeof entry_kinds / sizeof entry_kinds[0]; i++) {
        const ln_entry_kind *k = &entry_kinds[i];
        if (PyUnicode_CompareWithASCIIString(name, k->name) != 0)
            continue;
        PyObject *t = PyTuple_New(k->n_params);
        for (int j = 0; t && j < k->n_params; j++) {
            PyObject *s = PyUnicode_FromString(arg_names[k->params[j]]);
            if (s == NULL)
                Py_CLEAR(t);
            else
                PyTuple_SET_ITEM(t, j, s);
        }
        return t;
    }
    PyErr_SetString(PyExc_ValueError, "_entry_params: no entry of that name");
    return NULL;
}

/* ---- the backward ------------------------------------------------------- */

/* A 2-d float array the kernels can read as is (any strides, native byte
 * order, aligned or not), or -1. */
static int rows_operand(PyObject *o, npy_intp n, npy_intp d, ln_operand *op)
{
    ln_dtype t;
    if (!PyArray_Check(o))
        return -1;
    PyArrayObject *a = (PyArrayObject *)o;
    if (PyArray_NDIM(a) != 2 || PyArray_DIM(a, 0) != n || PyArray_DIM(a, 1) != d ||
        !PyArray_ISNOTSWAPPED(a) || ln_dtype_of(PyArray_TYPE(a), &t) < 0)
        return -1;
    *op = (ln_operand){.ptr = PyArray_BYTES(a), .row = PyArray_STRIDE(a, 0),
                       .col = PyArray_STRIDE(a, 1), .dtype = t};
    return 0;
}

/* A 1-d float array of n values (weight, mean), or -1. */
static int vector_operand(PyObject *o, npy_intp n, ln_operand *op, int per_record)
{
    ln_dtype t;
    if (!PyArray_Check(o))
        return -1;
    PyArrayObject *a = (PyArrayObject *)o;
    if (PyArray_NDIM(a) != 1 || PyArray_DIM(a, 0) != n || !PyArray_ISNOTSWAPPED(a) ||
        ln_dtype_of(PyArray_TYPE(a), &t) < 0)
        return -1;
    npy_intp stride = PyArray_STRIDE(a, 0);
    *op = (ln_operand){.ptr = PyArray_BYTES(a), .row = per_record ? stride : 0,
                       .col = per_record ? 0 : stride, .dtype = t};
    return 0;
}

/* An accumulator's state as a new (d, LN_ACC_STATE_WORDS) uint64 array. */
static PyObject *acc_state(ln_acc *acc, size_t d)
{
    npy_intp dims[2] = {(npy_intp)d, LN_ACC_STATE_WORDS};
    PyObject *a = PyArray_SimpleNew(2, dims, NPY_UINT64);
    if (a != NULL)
        ln_acc_export(acc, (uint64_t *)PyArray_DATA((PyArrayObject *)a));
    return a;
}

/* The sums of recent backward calls, kept for the next ones: a call of a
 * few records would otherwise allocate, zero and fault in fresh pages
 * for them every time (a (1, 4096) call spent most of its 200 us there;
 * (1, 65536) float32 took 4.4 ms, 9x torch's backward, before they were
 * kept for that many features). Taken and given back with the GIL held
 * (a job releases it only in between); at most two, of at most
 * KEEP_FEATURES features each: 81 bytes a feature each, 10.6 MB of
 * address space at most, of which a call of fewer than 2048 records
 * touches 16-33 bytes a feature (a larger one spills into 48 more). */
#define KEEP_FEATURES 65536
static ln_acc g_kept[2];
static int g_n_kept;

/* Sums of d features, zeroed: a kept one, or new. 0, or -1 without memory. */
static int acc_take(ln_acc *a, size_t d)
{
#if !defined(Py_GIL_DISABLED)
    for (int i = g_n_kept - 1; i >= 0; i--) {
        if (g_kept[i].d != d)
            continue;
        *a = g_kept[i];
        g_kept[i] = g_kept[--g_n_kept];
        ln_acc_clear(a);
        return 0;
    }
#endif
    return ln_acc_init(a, d);
}

/* Done with a (allocated or empty): kept if small, else freed. */
static void acc_give(ln_acc *a)
{
#if !defined(Py_GIL_DISABLED)
    if (a->block != NULL && a->d <= KEEP_FEATURES) {
        if (g_n_kept == 2) { /* the oldest goes */
            ln_acc_free(&g_kept[0]);
            g_kept[0] = g_kept[1];
            g_n_kept = 1;
        }
        g_kept[g_n_kept++] = *a;
        memset(a, 0, sizeof *a);
        return;
    }
#endif
    ln_acc_free(a);
}

/* The backward's sums over records: dw, and db unless rms (RMSNorm has
 * no bias; db is then left empty), attached to the job. 0, or -1 with
 * MemoryError set (both given back). */
static int job_sums(ln_job *job, ln_acc *dw, ln_acc *db, size_t d, int rms)
{
    memset(db, 0, sizeof *db);
    memset(dw, 0, sizeof *dw);
    if (acc_take(dw, d) != 0 || (!rms && acc_take(db, d) != 0)) {
        acc_give(dw);
        PyErr_NoMemory();
        return -1;
    }
    job->dw = dw;
    job->db = rms ? NULL : db;
    return 0;
}

/*
 * _backward(dy, x, weight, eps, mean, sums) -> (dx, dweight_state, dbias_state)
 *
 * The LayerNorm backward of records (rows of the 2-d dy and x, any strides
 * and float dtypes): dx (C-contiguous, of the widest dtype), and, with
 * sums true, the exact sums over records of dy * xhat and dy as
 * accumulator states (see _acc_value). weight and mean: None or 1-d.
 * The Python wrapper validates; anything else here is a TypeError.
 */
static PyObject *backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 6 && nargs != 7) || !PyArray_Check(args[1]) ||
        PyArray_NDIM((PyArrayObject *)args[1]) != 2) {
        PyErr_SetString(PyExc_TypeError, "_backward(dy, x, weight, eps, mean, sums[, rms]): "
                                         "expected 2-d arrays");
        return NULL;
    }
    int rms = nargs == 7 ? PyObject_IsTrue(args[6]) : 0;
    if (rms < 0)
        return NULL;
    PyArrayObject *x = (PyArrayObject *)args[1];
    npy_intp n = PyArray_DIM(x, 0), d = PyArray_DIM(x, 1);
    double eps = PyFloat_AsDouble(args[3]);
    /* sums: false, true, or 2 for the benchmark's baseline of plain
     * float64 sums (order-dependent; never used by the library). */
    int want_sums = PyLong_Check(args[5]) && PyLong_AsLong(args[5]) == 2 ? 2
                                                                          : PyObject_IsTrue(args[5]);
    if ((eps == -1.0 && PyErr_Occurred()) || want_sums < 0)
        return NULL;
    ln_job job;
    memset(&job, 0, sizeof job);
    job.op = rms ? LN_OP_RMS_NORM_BACKWARD : LN_OP_LAYER_NORM_BACKWARD;
    job.n_rows = (size_t)n;
    job.d = (size_t)d;
    if (rows_operand(args[1], n, d, &job.x) < 0 || rows_operand(args[0], n, d, &job.dy) < 0 ||
        (args[2] != Py_None && vector_operand(args[2], d, &job.w, 0) < 0) ||
        (args[4] != Py_None && vector_operand(args[4], n, &job.mean, 1) < 0)) {
        PyErr_SetString(PyExc_TypeError, "_backward: dy, x: 2-d float arrays of one shape; "
                                         "weight: None or (d,); mean: None or (rows,)");
        return NULL;
    }
    job.dtype = wider(job.x.dtype, job.dy.dtype);
    if (job.w.ptr)
        job.dtype = wider(job.dtype, job.w.dtype);
    job.eps = (ln_operand){.ptr = (char *)&eps, .dtype = LN_F64};

    npy_intp dims[2] = {n, d};
    int fresh;
    PyObject *dx = new_output(2, dims, job.dtype, &fresh);
    if (dx == NULL)
        return NULL;
    npy_intp isz = (npy_intp)ln_dtype_size(job.dtype);
    job.y = (ln_operand){.ptr = PyArray_BYTES((PyArrayObject *)dx), .row = d * isz,
                         .col = isz, .dtype = job.dtype};
    job.y_new = fresh;
    ln_acc dw, db;
    int have_acc = 0;
    if (want_sums) {
        if (job_sums(&job, &dw, &db, (size_t)d, rms) < 0) {
            Py_DECREF(dx);
            return NULL;
        }
        have_acc = 1;
        dw.plain = db.plain = want_sums == 2; /* the benchmark's baseline */
    }
    PyObject *res = NULL;
    int ran = run_job(&job) == 0;
    if (ran && !have_acc) {
        res = Py_BuildValue("(OOO)", dx, Py_None, Py_None);
    } else if (ran) {
        PyObject *sw = acc_state(&dw, (size_t)d);
        PyObject *sb = rms ? (Py_INCREF(Py_None), Py_None) : acc_state(&db, (size_t)d);
        if (sw && sb)
            res = Py_BuildValue("(ONN)", dx, sw, sb);
        else {
            Py_XDECREF(sw);
            Py_XDECREF(sb);
        }
    }
    if (have_acc) {
        acc_give(&dw);
        acc_give(&db);
    }
    Py_DECREF(dx);
    return res;
}

/* A state array from Python: C-contiguous uint64 (d, LN_ACC_STATE_WORDS). */
static int state_arg(PyObject *o, npy_intp *d)
{
    if (!PyArray_Check(o) || PyArray_TYPE((PyArrayObject *)o) != NPY_UINT64 ||
        PyArray_NDIM((PyArrayObject *)o) != 2 ||
        PyArray_DIM((PyArrayObject *)o, 1) != LN_ACC_STATE_WORDS ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)o) ||
        !PyArray_ISNOTSWAPPED((PyArrayObject *)o)) {
        PyErr_Format(PyExc_TypeError, "state: expected a C-contiguous uint64 array of shape "
                     "(d, %d)", LN_ACC_STATE_WORDS);
        return -1;
    }
    *d = PyArray_DIM((PyArrayObject *)o, 0);
    return 0;
}

/* _acc_merge(a, b) -> the state of both sums together, exactly. */
static PyObject *acc_merge(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    npy_intp da, db_;
    if (nargs != 2 || state_arg(args[0], &da) < 0 || state_arg(args[1], &db_) < 0)
        return NULL;
    if (da != db_) {
        PyErr_SetString(PyExc_ValueError, "state: the two sums have different lengths");
        return NULL;
    }
    ln_acc a, b;
    if (ln_acc_init(&a, (size_t)da) != 0)
        return PyErr_NoMemory();
    if (ln_acc_init(&b, (size_t)da) != 0) {
        ln_acc_free(&a);
        return PyErr_NoMemory();
    }
    ln_acc_import(&a, PyArray_DATA((PyArrayObject *)args[0]));
    ln_acc_import(&b, PyArray_DATA((PyArrayObject *)args[1]));
    ln_acc_merge(&a, &b);
    PyObject *res = acc_state(&a, (size_t)da);
    ln_acc_free(&a);
    ln_acc_free(&b);
    return res;
}

/* _acc_value(state, float32) -> the sums as float64, rounded once to
 * double precision, or (float32 true) to float32 precision. */
static PyObject *acc_value(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    npy_intp d;
    if (nargs != 2 || state_arg(args[0], &d) < 0)
        return NULL;
    int single = PyObject_IsTrue(args[1]);
    if (single < 0)
        return NULL;
    ln_acc a;
    if (ln_acc_init(&a, (size_t)d) != 0)
        return PyErr_NoMemory();
    ln_acc_import(&a, PyArray_DATA((PyArrayObject *)args[0]));
    PyObject *out = PyArray_SimpleNew(1, &d, NPY_DOUBLE);
    if (out != NULL)
        ln_acc_value(&a, (double *)PyArray_DATA((PyArrayObject *)out), single ? 24 : 53);
    ln_acc_free(&a);
    return out;
}

/* An accumulator's sums rounded once, as a new (d,) array of the
 * parameter gradients' dtype: float32 for records computed in float, else
 * float64. */
static PyObject *acc_values(ln_acc *acc, size_t d, ln_dtype ct)
{
    npy_intp n = (npy_intp)d;
    int single = ct == LN_F32;
    PyObject *out = PyArray_SimpleNew(1, &n, single ? NPY_FLOAT : NPY_DOUBLE);
    if (out == NULL)
        return NULL;
    if (!single) {
        ln_acc_value(acc, (double *)PyArray_DATA((PyArrayObject *)out), 53);
        return out;
    }
    ln_acc_value_float(acc, (float *)PyArray_DATA((PyArrayObject *)out));
    return out;
}

/* The per-record statistic the fast backward may be given (the forward's
 * mean, or RMSNorm's ms, checked and not needed): None, or an exact,
 * aligned, native, C-contiguous float array shaped like x without its last
 * axis. -1: not for the fast path. */
static int fast_stat(PyObject *o, PyArrayObject *x, ln_operand *op)
{
    ln_dtype t;
    memset(op, 0, sizeof *op);
    if (o == Py_None)
        return 0;
    if (fast_dtype(o, &t) < 0)
        return -1;
    PyArrayObject *a = (PyArrayObject *)o;
    int nd = PyArray_NDIM(x);
    if (PyArray_NDIM(a) != nd - 1 ||
        !PyArray_CompareLists(PyArray_DIMS(a), PyArray_DIMS(x), nd - 1) ||
        !PyArray_IS_C_CONTIGUOUS(a))
        return -1;
    *op = (ln_operand){.ptr = PyArray_BYTES(a), .row = PyArray_ITEMSIZE(a), .dtype = t};
    return 0;
}

/*
 * _fast_backward(dy, x, weight, eps, stat, rms) -> (dx, dweight, dbias), or
 * (dx, dweight) with rms true: layer_norm_backward (rms_norm_backward,
 * "weight" convention) over the last axis for the common case: dy and x
 * exact, aligned, native, C-contiguous float arrays of one shape; weight as
 * for _fast; a valid float eps; stat as fast_stat takes it. The sums come
 * back rounded, with no state arrays in between. NotImplemented for
 * anything else: the wrapper's general path validates and explains.
 */
static PyObject *fast_backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    ln_dtype xt, dyt;
    if (nargs != 6 || fast_dtype(args[0], &dyt) < 0 || fast_dtype(args[1], &xt) < 0 ||
        !PyBool_Check(args[5]))
        Py_RETURN_NOTIMPLEMENTED;
    int rms = args[5] == Py_True;
    PyArrayObject *dy = (PyArrayObject *)args[0], *x = (PyArrayObject *)args[1];
    int nd = PyArray_NDIM(x);
    if (nd < 1 || PyArray_NDIM(dy) != nd ||
        !PyArray_CompareLists(PyArray_DIMS(dy), PyArray_DIMS(x), nd) ||
        !PyArray_IS_C_CONTIGUOUS(x) || !PyArray_IS_C_CONTIGUOUS(dy))
        Py_RETURN_NOTIMPLEMENTED;
    npy_intp d = PyArray_DIM(x, nd - 1);
    if (d < 1 || !PyFloat_Check(args[3]))
        Py_RETURN_NOTIMPLEMENTED;
    double eps = PyFloat_AS_DOUBLE(args[3]);
    if (!(eps >= 0.0 && eps <= DBL_MAX))
        Py_RETURN_NOTIMPLEMENTED;

    ln_job job;
    memset(&job, 0, sizeof job);
    job.op = rms ? LN_OP_RMS_NORM_BACKWARD : LN_OP_LAYER_NORM_BACKWARD;
    job.dtype = wider(xt, dyt);
    if (fast_param(args[2], d, &job.w, &job.dtype) < 0 || fast_stat(args[4], x, &job.mean) < 0)
        Py_RETURN_NOTIMPLEMENTED;
    if (rms)
        memset(&job.mean, 0, sizeof job.mean); /* RMSNorm's ms is not needed */
    job.d = (size_t)d;
    job.n_rows = (size_t)(PyArray_SIZE(x) / d);
    npy_intp x_isz = PyArray_ITEMSIZE(x), dy_isz = PyArray_ITEMSIZE(dy);
    npy_intp isz = (npy_intp)ln_dtype_size(job.dtype);
    job.x = (ln_operand){.ptr = PyArray_BYTES(x), .row = d * x_isz, .col = x_isz, .dtype = xt};
    job.dy = (ln_operand){.ptr = PyArray_BYTES(dy), .row = d * dy_isz, .col = dy_isz,
                          .dtype = dyt};
    job.eps = (ln_operand){.ptr = (char *)&eps, .dtype = LN_F64};

    int fresh;
    PyObject *dx = new_output(nd, PyArray_DIMS(x), job.dtype, &fresh);
    if (dx == NULL)
        return NULL;
    job.y = (ln_operand){.ptr = PyArray_BYTES((PyArrayObject *)dx), .row = d * isz,
                         .col = isz, .dtype = job.dtype};
    job.y_new = fresh;
    ln_acc dw, db;
    if (job_sums(&job, &dw, &db, (size_t)d, rms) < 0) {
        Py_DECREF(dx);
        return NULL;
    }
    PyObject *res = NULL;
    if (run_job(&job) == 0) {
        ln_dtype ct = ln_compute_dtype(job.dtype);
        PyObject *vw = acc_values(&dw, (size_t)d, ct);
        PyObject *vb = rms || vw == NULL ? NULL : acc_values(&db, (size_t)d, ct);
        if (vw && rms)
            res = Py_BuildValue("(ON)", dx, vw);
        else if (vw && vb)
            res = Py_BuildValue("(ONN)", dx, vw, vb);
        else
            Py_XDECREF(vw);
    }
    acc_give(&dw);
    acc_give(&db);
    Py_DECREF(dx);
    return res;
}

/* ---- settings ---------------------------------------------------------- */

static PyObject *get_isa(PyObject *self, PyObject *noargs)
{
    return PyUnicode_FromString(ln_isa_name(g_isa));
}

static PyObject *set_isa(PyObject *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    ln_isa isa;
    if (name == NULL)
        return NULL;
    if (ln_isa_from_name(name, &isa) != 0) {
        PyErr_Format(PyExc_ValueError,
                     "isa: expected one of 'scalar', 'portable', 'avx2', 'avx512', "
                     "got %R", arg);
        return NULL;
    }
    if (!ln_isa_supported(isa)) {
        PyErr_Format(PyExc_ValueError, "isa: %s is not supported by this CPU or build",
                     name);
        return NULL;
    }
    g_kernels = ln_kernels_for(isa);
    g_isa = isa;
    Py_RETURN_NONE;
}

static PyObject *supported_isas(PyObject *self, PyObject *noargs)
{
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (int i = 0; i < LN_NISAS; i++) {
        if (!ln_isa_supported((ln_isa)i))
            continue;
        PyObject *s = PyUnicode_FromString(ln_isa_name((ln_isa)i));
        if (s == NULL || PyList_Append(out, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(s);
    }
    PyObject *t = PyList_AsTuple(out);
    Py_DECREF(out);
    return t;
}

static PyObject *get_num_threads(PyObject *self, PyObject *noargs)
{
    return PyLong_FromLong(g_threads);
}

/* A thread count from lo to LN_MAX_THREADS as an int, or -1 with
 * ValueError ("n: expected a thread <what> from lo to ..."). */
static int thread_arg(PyObject *arg, long lo, const char *what)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return -1;
    if (n < lo || n > LN_MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "n: expected a thread %s from %ld to %d, got %ld", what,
                     lo, LN_MAX_THREADS, n);
        return -1;
    }
    return (int)n;
}

static PyObject *set_num_threads(PyObject *self, PyObject *arg)
{
    int n = thread_arg(arg, 1, "count");
    if (n < 0)
        return NULL;
    g_threads = n;
    Py_RETURN_NONE;
}

/* _set_thread_limit(n) -> the previous limit: at most n threads for the
 * calls made from the calling thread (0: no limit). */
static PyObject *set_thread_limit(PyObject *self, PyObject *arg)
{
    int n = thread_arg(arg, 0, "limit");
    if (n < 0)
        return NULL;
    int previous = t_thread_limit;
    t_thread_limit = n;
    return PyLong_FromLong(previous);
}

/* The thread setting as plain C functions, exported for threadpoolctl's
 * controller (layernorm_c/_threadpool.py), which calls them through
 * ctypes, as it does OpenBLAS's. set clamps n to 1..LN_MAX_THREADS. */
#if defined(_WIN32)
#define LN_EXPORT __declspec(dllexport)
#else
#define LN_EXPORT __attribute__((visibility("default")))
#endif
LN_EXPORT int layernorm_c_get_num_threads(void);
LN_EXPORT void layernorm_c_set_num_threads(int n);

LN_EXPORT int layernorm_c_get_num_threads(void)
{
    return g_threads;
}

LN_EXPORT void layernorm_c_set_num_threads(int n)
{
    g_threads = n < 1 ? 1 : n > LN_MAX_THREADS ? LN_MAX_THREADS : n;
}

static PyObject *thread_threshold(PyObject *self, PyObject *noargs)
{
    return PyLong_FromSize_t(ln_thread_threshold());
}

/* set_output_cache(limit) -> the previous limit, in bytes. */
static PyObject *set_output_cache(PyObject *self, PyObject *arg)
{
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    if (n == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "max_bytes: expected an int of 0 or more "
                                              "(bytes), below 2**64");
        }
        return NULL;
    }
    size_t limit = n > SIZE_MAX ? SIZE_MAX : (size_t)n;
    return PyLong_FromSize_t(ln_cache_set_limit(limit));
}

/* output_cache() -> (limit, bytes kept, blocks kept). */
static PyObject *output_cache(PyObject *self, PyObject *noargs)
{
    size_t blocks, held = ln_cache_held(&blocks);
    return Py_BuildValue("KKK", (unsigned long long)ln_cache_limit(), (unsigned long long)held,
                         (unsigned long long)blocks);
}

static PyMethodDef core_methods[] = {
    {"_fast", (PyCFunction)(void (*)(void))fast_layer_norm, METH_FASTCALL,
     "_fast(x, weight, bias, eps, out, return_stats): the common case of "
     "layer_norm, or NotImplemented."},
    {"_fast_rms", (PyCFunction)(void (*)(void))fast_rms_norm, METH_FASTCALL,
     "_fast_rms(x, weight, eps, out, return_stats): the common case of rms_norm, or "
     "NotImplemented."},
    {"_entry", (PyCFunction)(void (*)(void))make_entry, METH_FASTCALL,
     "_entry(impl, name, result): layer_norm or rms_norm, its common call in C, in front "
     "of impl."},
    {"_entry_params", entry_params, METH_O,
     "_entry_params(name) -> tuple: the parameters _entry's `name` knows, in order."},
    {"_backward", (PyCFunction)(void (*)(void))backward, METH_FASTCALL,
     "_backward(dy, x, weight, eps, mean, sums[, rms]) -> (dx, dweight_state, dbias_state): "
     "the LayerNorm backward, or RMSNorm's with rms true."},
    {"_fast_backward", (PyCFunction)(void (*)(void))fast_backward, METH_FASTCALL,
     "_fast_backward(dy, x, weight, eps, stat, rms): the common case of "
     "layer_norm_backward (rms_norm_backward with rms true), or NotImplemented."},
    {"_acc_merge", (PyCFunction)(void (*)(void))acc_merge, METH_FASTCALL,
     "_acc_merge(a, b) -> the state of both exact sums together."},
    {"_acc_value", (PyCFunction)(void (*)(void))acc_value, METH_FASTCALL,
     "_acc_value(state, float32) -> the exact sums rounded once (float64 array)."},
    {"_register_bfloat16", register_bfloat16, METH_O,
     "_register_bfloat16(dtype): the bfloat16 loops, for ml_dtypes.bfloat16's type number."},
    {"get_isa", get_isa, METH_NOARGS, "get_isa() -> str: the instruction-set level in use."},
    {"set_isa", set_isa, METH_O,
     "set_isa(name): use the 'scalar', 'portable', 'avx2' or 'avx512' kernels."},
    {"supported_isas", supported_isas, METH_NOARGS,
     "supported_isas() -> tuple: the levels this CPU and build can run."},
    {"get_num_threads", get_num_threads, METH_NOARGS,
     "get_num_threads() -> int: the most threads one call may use."},
    {"set_num_threads", set_num_threads, METH_O,
     "set_num_threads(n): let one call use up to n threads."},
    {"_set_thread_limit", set_thread_limit, METH_O,
     "_set_thread_limit(n) -> int: at most n threads for this thread's calls (0: no "
     "limit); returns the previous limit."},
    {"set_output_cache", set_output_cache, METH_O,
     "set_output_cache(max_bytes) -> int: keep up to max_bytes of large freed outputs for "
     "reuse (0: none); returns the previous limit."},
    {"output_cache", output_cache, METH_NOARGS,
     "output_cache() -> (limit, bytes kept, blocks kept)."},
    {"thread_threshold", thread_threshold, METH_NOARGS,
     "thread_threshold() -> int: input bytes below which a call never starts threads."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_core",
    .m_doc = "Private C core of layernorm_c: the gufuncs and kernel settings.",
    .m_size = -1,
    .m_methods = core_methods,
};

PyMODINIT_FUNC PyInit__core(void)
{
    import_array();
    import_umath();

    g_isa = ln_isa_best();
    g_kernels = ln_kernels_for(g_isa);
    for (int i = 0; i < LN_NISAS; i++) {
        int op, dtype;
        const ln_kernels *k = ln_kernels_for((ln_isa)i);
        if (ln_kernels_missing(k, &op, &dtype)) {
            PyErr_Format(PyExc_ImportError,
                         "layernorm_c: the %s kernel table lacks the kernel of op %d, dtype "
                         "%d (or its store_fence when -1): an entry missing in "
                         "csrc/ln_level.h",
                         k->name ? k->name : "?", op, dtype);
            return NULL;
        }
    }

    if (PyType_Ready(&entry_type) < 0)
        return NULL;
    for (int i = 0; i < N_ARGS; i++)
        if ((arg_strs[i] = PyUnicode_InternFromString(arg_names[i])) == NULL)
            return NULL;
    out_handler_capsule = PyCapsule_New(&out_handler, "mem_handler", NULL);
    if (out_handler_capsule == NULL)
        return NULL;
    ln_cache_set_limit(default_cache_limit());
    PyObject *m = PyModule_Create(&core_module);
    if (m == NULL)
        return NULL;
    /* The reduction order's constants (ln_contract.h), for the tests' error
     * bounds and the docs; never needed to use the library. */
    if (add_gufuncs(m) < 0 || PyModule_AddIntConstant(m, "MAX_THREADS", LN_MAX_THREADS) < 0 ||
        PyModule_AddIntConstant(m, "LANES", LN_LANES) < 0 ||
        PyModule_AddIntConstant(m, "BLOCK", LN_BLOCK) < 0 ||
        PyModule_AddIntConstant(m, "ACC_WORDS", LN_ACC_STATE_WORDS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
