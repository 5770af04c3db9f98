/*
 * _coremodule.c - the CPython/NumPy glue of layernorm_c._core.
 *
 * Registers the generalized ufuncs whose inner loops hand NumPy's
 * dimensions and strides to ln_batch_run, and the few settings functions
 * (instruction-set level, thread count). No numerics live here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define NPY_NO_DEPRECATED_API NPY_1_23_API_VERSION
#define NPY_TARGET_VERSION NPY_1_23_API_VERSION
#include <numpy/arrayobject.h>
#include <numpy/ufuncobject.h>
#include <fenv.h>
#include <float.h>

#include <string.h>

#include "layernorm.h"

/* Current settings; read by every loop, changed only from Python. */
static const ln_kernels *g_kernels = &ln_kernels_scalar;
static ln_isa g_isa = LN_ISA_SCALAR;
static int g_threads = 1;

/* Which operands a ufunc has, in order: x, [weight], [bias], eps -> y,
 * [mean, var]. The loops read this from the ufunc's data pointer. */
typedef struct {
    int has_w, has_b, has_stats;
} ln_roles;

static const ln_roles roles_public = {1, 1, 0};
static const ln_roles roles_wb = {1, 1, 1};
static const ln_roles roles_w = {1, 0, 1};
static const ln_roles roles_b = {0, 1, 1};
static const ln_roles roles_none = {0, 0, 1};

/* Translate the gufunc's args/dims/steps into an ln_batch. NumPy passes
 * the outer strides of every operand first, then the core-dimension
 * strides of the operands that have the core dimension n, in order. */
static void fill_batch(ln_batch *job, const ln_roles *roles, ln_dtype t,
                       char **args, npy_intp const *dims,
                       npy_intp const *steps)
{
    int nargs = 2 + roles->has_w + roles->has_b + 1 + 2 * roles->has_stats;
    const npy_intp *core = steps + nargs;
    int a = 0, c = 0;

    memset(job, 0, sizeof *job);
    job->dtype = t;
    job->n_rows = (size_t)dims[0];
    job->d = (size_t)dims[1];
    job->x = args[a]; job->x_row = steps[a++]; job->x_col = core[c++];
    if (roles->has_w) {
        job->w = args[a]; job->w_row = steps[a++]; job->w_col = core[c++];
    }
    if (roles->has_b) {
        job->b = args[a]; job->b_row = steps[a++]; job->b_col = core[c++];
    }
    job->eps = args[a]; job->eps_row = steps[a++];
    job->y = args[a]; job->y_row = steps[a++]; job->y_col = core[c++];
    if (roles->has_stats) {
        job->mean = args[a]; job->mean_row = steps[a++];
        job->var = args[a]; job->var_row = steps[a++];
    }
}

#if defined(_MSC_VER) && !defined(__clang__)
#define LN_THREAD_LOCAL __declspec(thread)
#else
#define LN_THREAD_LOCAL _Thread_local
#endif

/* Set by a loop of this thread that could not get scratch memory; the
 * Python wrapper reads and clears it with _take_enomem() after its ufunc
 * call and raises MemoryError. (The loop runs on the calling thread.) */
static LN_THREAD_LOCAL int t_enomem;

/* Loops cannot raise: an invalid eps, or scratch memory that could not be
 * had, gives NaN records and raises the floating-point invalid flag, which
 * NumPy reports as usual (RuntimeWarning, or an error under np.errstate).
 * Any other flag the kernels raise on the way is discarded: it would
 * depend on the code path and thread count, not on the result (a float32
 * record that overflows the fast path is redone in double, for one). */
static void run_loop(char **args, npy_intp const *dims, npy_intp const *steps,
                     void *data, ln_dtype t)
{
    ln_batch job;
    fenv_t env;
    fill_batch(&job, (const ln_roles *)data, t, args, dims, steps);
    feholdexcept(&env);
    int rc = ln_batch_run(g_kernels, &job, g_threads);
    if (rc == LN_ENOMEM) {
        ln_batch_fill_nan(&job);
        t_enomem = 1;
    }
    fesetenv(&env);
    if (rc != LN_OK)
        feraiseexcept(FE_INVALID);
}

static void loop_f16(char **args, npy_intp const *dims, npy_intp const *steps,
                     void *data)
{
    run_loop(args, dims, steps, data, LN_F16);
}

static void loop_f32(char **args, npy_intp const *dims, npy_intp const *steps,
                     void *data)
{
    run_loop(args, dims, steps, data, LN_F32);
}

static void loop_f64(char **args, npy_intp const *dims, npy_intp const *steps,
                     void *data)
{
    run_loop(args, dims, steps, data, LN_F64);
}

static PyUFuncGenericFunction loop_funcs[3] = {loop_f16, loop_f32, loop_f64};

static void *data_public[3] = {(void *)&roles_public, (void *)&roles_public,
                               (void *)&roles_public};
static void *data_wb[3] = {(void *)&roles_wb, (void *)&roles_wb,
                           (void *)&roles_wb};
static void *data_w[3] = {(void *)&roles_w, (void *)&roles_w,
                          (void *)&roles_w};
static void *data_b[3] = {(void *)&roles_b, (void *)&roles_b,
                          (void *)&roles_b};
static void *data_none[3] = {(void *)&roles_none, (void *)&roles_none,
                             (void *)&roles_none};

/* Operand types per loop. eps is always float64; statistics are float32
 * for float16 and float32 records, float64 for float64 records. */
static char types_public[3 * 5] = {
    NPY_HALF,   NPY_HALF,   NPY_HALF,   NPY_DOUBLE, NPY_HALF,
    NPY_FLOAT,  NPY_FLOAT,  NPY_FLOAT,  NPY_DOUBLE, NPY_FLOAT,
    NPY_DOUBLE, NPY_DOUBLE, NPY_DOUBLE, NPY_DOUBLE, NPY_DOUBLE,
};
static char types_wb[3 * 7] = {
    NPY_HALF,   NPY_HALF,   NPY_HALF,   NPY_DOUBLE, NPY_HALF,   NPY_FLOAT,  NPY_FLOAT,
    NPY_FLOAT,  NPY_FLOAT,  NPY_FLOAT,  NPY_DOUBLE, NPY_FLOAT,  NPY_FLOAT,  NPY_FLOAT,
    NPY_DOUBLE, NPY_DOUBLE, NPY_DOUBLE, NPY_DOUBLE, NPY_DOUBLE, NPY_DOUBLE, NPY_DOUBLE,
};
static char types_one[3 * 6] = {
    NPY_HALF,   NPY_HALF,   NPY_DOUBLE, NPY_HALF,   NPY_FLOAT,  NPY_FLOAT,
    NPY_FLOAT,  NPY_FLOAT,  NPY_DOUBLE, NPY_FLOAT,  NPY_FLOAT,  NPY_FLOAT,
    NPY_DOUBLE, NPY_DOUBLE, NPY_DOUBLE, NPY_DOUBLE, NPY_DOUBLE, NPY_DOUBLE,
};
static char types_none[3 * 5] = {
    NPY_HALF,   NPY_DOUBLE, NPY_HALF,   NPY_FLOAT,  NPY_FLOAT,
    NPY_FLOAT,  NPY_DOUBLE, NPY_FLOAT,  NPY_FLOAT,  NPY_FLOAT,
    NPY_DOUBLE, NPY_DOUBLE, NPY_DOUBLE, NPY_DOUBLE, NPY_DOUBLE,
};

static const char public_doc[] =
    "layer_norm_ufunc(x, weight, bias, eps, /, out=None, *, axes=None, ...)\n"
    "\n"
    "Layer normalization as a generalized ufunc, signature\n"
    "(n),(n),(n),()->(n): every record of n features along the core axis\n"
    "is normalized by its own mean and population variance, then scaled by\n"
    "weight and shifted by bias; eps is added to the variance inside the\n"
    "square root. Loops: float16 (computed in float32), float32, float64.\n"
    "An invalid eps (negative, NaN, inf) gives NaN records and the\n"
    "floating-point 'invalid' warning; layer_norm() raises instead.";

static int add_ufunc(PyObject *m, const char *attr, void **data, char *types,
                     int nin, int nout, const char *name, const char *doc,
                     const char *signature)
{
    PyObject *uf = PyUFunc_FromFuncAndDataAndSignature(
        loop_funcs, data, types, 3, nin, nout, PyUFunc_None, name, doc, 0,
        signature);
    if (uf == NULL)
        return -1;
    if (PyModule_AddObject(m, attr, uf) < 0) {
        Py_DECREF(uf);
        return -1;
    }
    return 0;
}

static int add_ufuncs(PyObject *m)
{
    if (add_ufunc(m, "layer_norm", data_public, types_public, 4, 1,
                  "layer_norm", public_doc, "(n),(n),(n),()->(n)") < 0)
        return -1;
    if (add_ufunc(m, "_ln_wb", data_wb, types_wb, 4, 3, "layer_norm",
                  "x, weight, bias, eps -> y, mean, var",
                  "(n),(n),(n),()->(n),(),()") < 0)
        return -1;
    if (add_ufunc(m, "_ln_w", data_w, types_one, 3, 3, "layer_norm",
                  "x, weight, eps -> y, mean, var",
                  "(n),(n),()->(n),(),()") < 0)
        return -1;
    if (add_ufunc(m, "_ln_b", data_b, types_one, 3, 3, "layer_norm",
                  "x, bias, eps -> y, mean, var", "(n),(n),()->(n),(),()") < 0)
        return -1;
    if (add_ufunc(m, "_ln_none", data_none, types_none, 2, 3, "layer_norm",
                  "x, eps -> y, mean, var", "(n),()->(n),(),()") < 0)
        return -1;
    return 0;
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
    switch (PyArray_TYPE(a)) {
    case NPY_HALF: *t = LN_F16; return 0;
    case NPY_FLOAT: *t = LN_F32; return 0;
    case NPY_DOUBLE: *t = LN_F64; return 0;
    default: return -1;
    }
}

/* weight/bias: None, or a 1-d (d,) array of the same dtype as x. */
static int fast_param(PyObject *o, ln_dtype t, npy_intp d, const char **ptr,
                      ptrdiff_t *col)
{
    ln_dtype pt;
    *ptr = NULL;
    *col = 0;
    if (o == Py_None)
        return 0;
    if (fast_dtype(o, &pt) < 0 || pt != t)
        return -1;
    PyArrayObject *a = (PyArrayObject *)o;
    if (PyArray_NDIM(a) != 1 || PyArray_DIM(a, 0) != d)
        return -1;
    *ptr = PyArray_BYTES(a);
    *col = PyArray_STRIDE(a, 0);
    return 0;
}

/* out for the fast path: None (allocate), or an exact, C-contiguous,
 * aligned, writeable array shaped and typed like x that is x itself or
 * does not overlap it (partial overlap needs the ufunc's copy logic). */
static int fast_out(PyObject *o, PyArrayObject *x, PyObject **y)
{
    ln_dtype t;
    if (o == Py_None) {
        *y = PyArray_SimpleNew(PyArray_NDIM(x), PyArray_DIMS(x),
                               PyArray_TYPE(x));
        return *y == NULL ? -2 : 0;
    }
    if (fast_dtype(o, &t) < 0)
        return -1;
    PyArrayObject *a = (PyArrayObject *)o;
    /* ndim first: the shapes are compared over x's ndim entries. */
    if (PyArray_NDIM(a) != PyArray_NDIM(x) ||
        !PyArray_CompareLists(PyArray_DIMS(a), PyArray_DIMS(x),
                              PyArray_NDIM(x)) ||
        PyArray_TYPE(a) != PyArray_TYPE(x) || !PyArray_IS_C_CONTIGUOUS(a) ||
        !PyArray_ISWRITEABLE(a))
        return -1;
    char *ya = PyArray_BYTES(a), *xa = PyArray_BYTES(x);
    npy_intp n = PyArray_NBYTES(x);
    if (ya != xa && ya < xa + n && xa < ya + n)
        return -1;
    Py_INCREF(o);
    *y = o;
    return 0;
}

/* Does [p, p + n) share a byte with the data of a? */
static int overlaps(PyArrayObject *a, const char *p, size_t n)
{
    const char *lo = PyArray_BYTES(a), *hi = lo + PyArray_NBYTES(a);
    return p < hi && lo < p + n;
}

/* If the 1-d parameter at *ptr (d items of isz bytes, stride *col) shares
 * memory with y, replace it by a contiguous copy in *copy (freed by the
 * caller). -1 with MemoryError set if the copy cannot be had. */
static int param_copy_if_overlap(PyArrayObject *y, const char **ptr,
                                 ptrdiff_t *col, npy_intp d, npy_intp isz,
                                 char **copy)
{
    *copy = NULL;
    if (*ptr == NULL)
        return 0;
    ptrdiff_t span = (ptrdiff_t)(d - 1) * *col;
    const char *lo = span < 0 ? *ptr + span : *ptr;
    size_t n = (size_t)(span < 0 ? -span : span) + (size_t)isz;
    if (!overlaps(y, lo, n))
        return 0;
    *copy = PyMem_Malloc((size_t)(d * isz));
    if (*copy == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (npy_intp i = 0; i < d; i++)
        memcpy(*copy + i * isz, *ptr + i * *col, (size_t)isz);
    *ptr = *copy;
    *col = (ptrdiff_t)isz;
    return 0;
}

/*
 * _fast(x, weight, bias, eps, out, return_stats): layer_norm over the last
 * axis for the common case (C-contiguous native float x, same-dtype (d,)
 * parameters or None, a valid float eps, out None or a matching array).
 * Returns NotImplemented for anything else, and the Python wrapper then
 * takes the general path, which validates and explains. It skips the ufunc
 * machinery: for one small record that machinery costs far more than the
 * arithmetic.
 */
static PyObject *fast_layer_norm(PyObject *self, PyObject *const *args,
                                 Py_ssize_t nargs)
{
    if (nargs != 6)
        Py_RETURN_NOTIMPLEMENTED;
    ln_dtype t;
    if (fast_dtype(args[0], &t) < 0)
        Py_RETURN_NOTIMPLEMENTED;
    PyArrayObject *x = (PyArrayObject *)args[0];
    int nd = PyArray_NDIM(x);
    if (nd < 1 || !PyArray_IS_C_CONTIGUOUS(x))
        Py_RETURN_NOTIMPLEMENTED;
    npy_intp d = PyArray_DIM(x, nd - 1);
    if (d < 1 || !PyFloat_Check(args[3]))
        Py_RETURN_NOTIMPLEMENTED;
    double eps = PyFloat_AS_DOUBLE(args[3]);
    if (!(eps >= 0.0 && eps <= DBL_MAX))
        Py_RETURN_NOTIMPLEMENTED;
    if (!PyBool_Check(args[5]))
        Py_RETURN_NOTIMPLEMENTED; /* the wrapper explains */
    int want_stats = args[5] == Py_True;

    ln_batch job;
    memset(&job, 0, sizeof job);
    if (fast_param(args[1], t, d, &job.w, &job.w_col) < 0 ||
        fast_param(args[2], t, d, &job.b, &job.b_col) < 0)
        Py_RETURN_NOTIMPLEMENTED;

    int stat_type = t == LN_F64 ? NPY_DOUBLE : NPY_FLOAT;
    PyObject *y = NULL, *mean = NULL, *var = NULL;
    int rc_out = fast_out(args[4], x, &y);
    if (rc_out == -1)
        Py_RETURN_NOTIMPLEMENTED;
    if (rc_out < 0)
        return NULL;
    if (want_stats) {
        mean = PyArray_SimpleNew(nd - 1, PyArray_DIMS(x), stat_type);
        var = PyArray_SimpleNew(nd - 1, PyArray_DIMS(x), stat_type);
        if (mean == NULL || var == NULL)
            goto fail;
    }

    npy_intp isz = PyArray_ITEMSIZE(x);
    job.dtype = t;
    job.d = (size_t)d;
    job.n_rows = (size_t)(PyArray_SIZE(x) / d);
    job.x = PyArray_BYTES(x);
    job.x_row = d * isz;
    job.x_col = isz;
    job.eps = (const char *)&eps;
    job.eps_row = 0;
    job.y = PyArray_BYTES((PyArrayObject *)y);
    job.y_row = d * isz;
    job.y_col = isz;
    if (want_stats) {
        job.mean = PyArray_BYTES((PyArrayObject *)mean);
        job.var = PyArray_BYTES((PyArrayObject *)var);
        job.mean_row = job.var_row = PyArray_ITEMSIZE((PyArrayObject *)mean);
    }

    /* A parameter that shares memory with y would change under the rows
     * already written: work on a copy of it (d values). */
    char *w_copy = NULL, *b_copy = NULL;
    if (param_copy_if_overlap((PyArrayObject *)y, &job.w, &job.w_col, d, isz,
                              &w_copy) < 0 ||
        param_copy_if_overlap((PyArrayObject *)y, &job.b, &job.b_col, d, isz,
                              &b_copy) < 0) {
        PyMem_Free(w_copy);
        goto fail;
    }

    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ln_batch_run(g_kernels, &job, g_threads);
    Py_END_ALLOW_THREADS
    PyMem_Free(w_copy);
    PyMem_Free(b_copy);
    if (rc == LN_ENOMEM) {
        PyErr_NoMemory();
        goto fail;
    }
    if (!want_stats)
        return y;
    return Py_BuildValue("(NNN)", y, mean, var);

fail:
    Py_XDECREF(y);
    Py_XDECREF(mean);
    Py_XDECREF(var);
    return NULL;
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
                     "isa: expected one of 'scalar', 'avx2', 'avx512', "
                     "got %R", arg);
        return NULL;
    }
    if (!ln_isa_supported(isa)) {
        PyErr_Format(PyExc_ValueError,
                     "isa: %s is not supported by this CPU or build", name);
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
    for (int i = 0; i <= (int)LN_ISA_AVX512; i++) {
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

static PyObject *set_num_threads(PyObject *self, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1 || n > 1024) {
        PyErr_Format(PyExc_ValueError,
                     "n: expected a thread count from 1 to 1024, got %ld", n);
        return NULL;
    }
    g_threads = (int)n;
    Py_RETURN_NONE;
}

static PyObject *take_enomem(PyObject *self, PyObject *noargs)
{
    int v = t_enomem;
    t_enomem = 0;
    return PyBool_FromLong(v);
}

static PyObject *thread_threshold(PyObject *self, PyObject *noargs)
{
    return PyLong_FromSize_t(ln_thread_threshold());
}

static PyMethodDef core_methods[] = {
    {"_fast", (PyCFunction)(void (*)(void))fast_layer_norm, METH_FASTCALL,
     "_fast(x, weight, bias, eps, out, return_stats): the common case of "
     "layer_norm, or NotImplemented."},
    {"get_isa", get_isa, METH_NOARGS,
     "get_isa() -> str: the instruction-set level in use."},
    {"set_isa", set_isa, METH_O,
     "set_isa(name): use 'scalar', 'avx2' or 'avx512' kernels."},
    {"supported_isas", supported_isas, METH_NOARGS,
     "supported_isas() -> tuple: the levels this CPU and build can run."},
    {"get_num_threads", get_num_threads, METH_NOARGS,
     "get_num_threads() -> int: the most threads one call may use."},
    {"set_num_threads", set_num_threads, METH_O,
     "set_num_threads(n): let one call use up to n threads."},
    {"_take_enomem", take_enomem, METH_NOARGS,
     "_take_enomem() -> bool: did a ufunc loop of this thread run out of "
     "scratch memory since the last call? Clears the flag."},
    {"thread_threshold", thread_threshold, METH_NOARGS,
     "thread_threshold() -> int: input bytes below which a call never "
     "starts threads."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "_core",
    "Private C core of layernorm_c: the gufuncs and kernel settings.", -1,
    core_methods,
};

PyMODINIT_FUNC PyInit__core(void)
{
    import_array();
    import_umath();

    g_isa = ln_isa_best();
    g_kernels = ln_kernels_for(g_isa);

    PyObject *m = PyModule_Create(&core_module);
    if (m == NULL)
        return NULL;
    if (add_ufuncs(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
