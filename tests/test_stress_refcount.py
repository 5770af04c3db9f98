"""No leaked and no stolen references, on success and on error paths.

For lnc.layer_norm and lnc.rms_norm (fast path and general path), the C
fast paths _core._fast and _core._fast_rms called directly, the raw
gufuncs and the private statistics gufuncs, both backward passes and both
layers, in every float dtype (bfloat16 too when ml_dtypes is installed):
the reference counts of every argument (x, weight, bias, eps,
out), of the singletons and dtype objects the C code touches, and of the
functions themselves are the same before and after many calls; every
result is freed once the caller drops it (a weak reference to it dies).
A leaked reference would keep arrays alive forever (memory growth in a
notebook); a stolen one would free an array still in use (a crash later).
"""
from __future__ import annotations

import gc
import sys
import warnings
import weakref

import numpy as np
import pytest

import layernorm_c as lnc
from cases import FLOAT_DTYPES, LANES
from layernorm_c import _bf16, _core

#: The dtypes tried: float16/32/64, and bfloat16 when ml_dtypes is installed.
DTYPES = FLOAT_DTYPES + ((_bf16.BFLOAT16,) if _bf16.BFLOAT16 is not None else ())

N_CALLS = 25


def call_fast(x, w, b, eps, rs, out=None):
    """The C fast path, called directly: _fast(x, weight, bias, eps, out, return_stats)."""
    return _core._fast(x, w, b, eps, out, rs)


#: Interpreter-wide objects the C code returns or touches on every call.
#: The rest of the interpreter uses them too (a cache entry freed now and
#: then moves None's count by one), so for them only a per-call drift
#: counts: at least N_CALLS // 2 over N_CALLS calls.
SHARED = [None, True, False, NotImplemented, *DTYPES, lnc.layer_norm, lnc.layer_norm_ufunc,
          _core._fast, _core._ln_wb, _core._ln_none, lnc.rms_norm, lnc.rms_norm_ufunc,
          lnc.rms_norm_backward_ufunc, _core._fast_rms, _core._rms_w, _core._rms_none,
          _core._backward]


def tracked(*objs):
    """The call's own arguments (exact counts), then the shared objects.
    An argument that is itself interpreter-wide (None, a bool) is counted
    with the shared ones."""
    own = [o for o in objs if not (o is None or isinstance(o, bool) or o is NotImplemented)]
    return own + SHARED


def refcounts(objs):
    return [sys.getrefcount(o) for o in objs]


def assert_refcounts_stable(fn, *objs, expect_error=None):
    """Call fn() N_CALLS times (dropping results); counts must not drift."""
    objs = tracked(*objs)
    # With automatic collection off, any reference cycle made by the calls
    # (an exception and its traceback) is young, and a cheap generation-0
    # collection frees it; a full collection per check would dominate.
    enabled = gc.isenabled()
    gc.disable()
    try:
        # Warm up: first calls may cache things (NumPy's type resolution).
        for _ in range(3):
            _call(fn, expect_error)
        gc.collect(0)
        before = refcounts(objs)
        for _ in range(N_CALLS):
            _call(fn, expect_error)
        gc.collect(0)
        after = refcounts(objs)
    finally:
        if enabled:
            gc.enable()
    n_own = len(objs) - len(SHARED)
    drift = [(i, type(o).__name__, a - b) for i, (o, b, a) in enumerate(zip(objs, before, after))
             if (a != b if i < n_own else abs(a - b) >= N_CALLS // 2)]
    assert not drift, f"reference counts changed by (index, type, delta): {drift}"


def _call(fn, expect_error):
    if expect_error is None:
        fn()  # the result is dropped at once
        return
    try:
        fn()
    except expect_error as exc:
        # Drop the traceback (it references this frame's locals) at once.
        exc.__traceback__ = None
        del exc
        return
    raise AssertionError(f"expected {expect_error.__name__}")


def assert_result_freed(fn):
    """Every array a call returns dies when the caller lets it go."""
    res = fn()
    arrays = list(res) if isinstance(res, tuple) else [res]
    refs = [weakref.ref(a) for a in arrays if isinstance(a, np.ndarray)]
    assert refs
    del res, arrays
    gc.collect()
    alive = [r() for r in refs if r() is not None]
    assert not alive, f"{len(alive)} result array(s) still referenced after the call"


#: Records one element past a lane row.
D = LANES + 1


@pytest.fixture(params=DTYPES, ids=str)
def data(request):
    dt = request.param
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, D)).astype(dt)
    w = rng.standard_normal(D).astype(dt)
    b = rng.standard_normal(D).astype(dt)
    return x, w, b


@pytest.mark.parametrize("rs", [False, True])
def test_layer_norm_fast_path(data, rs):
    x, w, b = data
    eps = 1e-5
    assert_refcounts_stable(lambda: lnc.layer_norm(x, w, b, eps, return_stats=rs), x, w, b, eps)
    assert_refcounts_stable(lambda: lnc.layer_norm(x, None, b, eps, return_stats=rs), x, b)
    assert_result_freed(lambda: lnc.layer_norm(x, w, b, eps, return_stats=rs))


@pytest.mark.parametrize("rs", [False, True])
def test_fast_entry_point_directly(data, rs):
    x, w, b = data
    eps = 1e-5
    assert_refcounts_stable(lambda: call_fast(x, w, b, eps, rs), x, w, b, eps)
    assert_result_freed(lambda: call_fast(x, w, b, eps, rs))
    # Arguments the fast path declines (NotImplemented) or rejects.
    for args in [(x.T, w, b, eps, rs), (x, w[:-1], b, eps, rs), (x, w, b, -1.0, rs),
                 (x, w, b, 1, rs), (x.astype(np.int32), None, None, eps, rs),
                 (x[:, :0], None, None, eps, rs), ([1.0, 2.0], None, None, eps, rs)]:
        assert_refcounts_stable(lambda: call_fast(*args), *args)
    assert_refcounts_stable(lambda: _core._fast(x), x)          # wrong arity
    assert_refcounts_stable(lambda: _core._fast(), )


def test_entry_points(data):
    """The C entry points of layer_norm and rms_norm (_core._entry): calls
    by keyword, the named tuple they build, calls they hand on to the
    Python function, and errors raised there."""
    x, w, b = data
    out = np.empty_like(x)
    # the entries' own references: the default eps and the result type
    held = [f.__wrapped__.__defaults__[-1] for f in (lnc.layer_norm, lnc.rms_norm)] + \
        [lnc.LayerNormResult, lnc.RMSNormResult]
    for f, kw in [(lnc.layer_norm, {"bias": b}), (lnc.rms_norm, {"convention": "weight"})]:
        assert_refcounts_stable(lambda: f(x, w, **kw), x, w, b, *held)
        assert_refcounts_stable(lambda: f(x, w, return_stats=True, **kw), x, w, b, *held)
        assert_refcounts_stable(lambda: f(x, w, eps=1e-3, axis=-1, out=out, **kw), x, w, b, out)
        assert_refcounts_stable(lambda: f(x, weight=w, return_stats=True, **kw), x, w, b)
        assert_result_freed(lambda: f(x, w, return_stats=True, **kw))
        assert_refcounts_stable(lambda: f(x[:, ::-1], w), x, w)  # handed on: a strided x
        assert_refcounts_stable(lambda: f(x, w, axis=2 ** 70), x, w, expect_error=ValueError)
        assert_refcounts_stable(lambda: f(x, w, bogus=1), x, w, expect_error=TypeError)
        assert_refcounts_stable(lambda: f(x, w, weight=w), x, w, expect_error=TypeError)
        assert_refcounts_stable(lambda: f(x, eps=-1.0), x, expect_error=ValueError)


def test_fast_return_stats_not_a_bool(data):
    """return_stats that is not a bool (even one whose truth value raises):
    the fast path steps aside without asking its truth value, the wrapper
    raises TypeError, nothing leaks."""
    x, w, b = data

    class Bad:
        def __bool__(self):
            raise ValueError("no truth value")

    bad = Bad()
    assert call_fast(x, w, b, 1e-5, bad) is NotImplemented
    assert_refcounts_stable(lambda: call_fast(x, w, b, 1e-5, bad), x, w, b, bad)
    assert_refcounts_stable(lambda: lnc.layer_norm(x, w, b, return_stats=bad), x, w, b, bad,
                            expect_error=TypeError)


@pytest.mark.parametrize("rs", [False, True])
def test_layer_norm_general_path(data, rs):
    x, w, b = data
    xs = x[:, ::-1]                         # strided: general path
    out = np.empty_like(x)
    assert_refcounts_stable(lambda: lnc.layer_norm(xs, w, b, return_stats=rs), xs, w, b)
    assert_refcounts_stable(lambda: lnc.layer_norm(x, w, b, out=out, return_stats=rs),
                            x, w, b, out)
    assert_refcounts_stable(lambda: lnc.layer_norm(x, axis=(0, 1), return_stats=rs), x)
    assert_refcounts_stable(lambda: lnc.layer_norm(x.T, axis=0, return_stats=rs), x)
    assert_result_freed(lambda: lnc.layer_norm(xs, w, b, return_stats=rs))
    # out= is returned, with one more reference while the caller holds it
    base = sys.getrefcount(out)
    res = lnc.layer_norm(x, w, b, out=out)
    assert res is out and sys.getrefcount(out) == base + 1
    del res
    assert sys.getrefcount(out) == base


def test_layer_norm_error_paths(data):
    x, w, b = data
    out_bad = np.empty((3, 3), x.dtype)
    cases = [
        ((x, np.ones(5), b), {}, ValueError),
        ((x, w, np.ones((2, D))), {}, ValueError),
        ((x, w, b), {"eps": -1.0}, ValueError),
        ((x, w, b), {"eps": float("nan")}, ValueError),
        ((x, w, b), {"eps": "1e-5"}, TypeError),
        # (not a cached small int: those are shared by the whole interpreter)
        ((x, w, b), {"axis": int("10000001")}, ValueError),
        ((x, w, b), {"axis": (0, 0)}, ValueError),
        ((x, w, b), {"out": out_bad}, ValueError),
        ((x, w, b), {"out": np.empty(x.shape, np.int32)}, TypeError),
        ((x, w, b), {"out": [0.0]}, TypeError),
        ((x.astype(complex), None, None), {}, TypeError),
        ((np.zeros((2, 0), x.dtype), None, None), {}, ValueError),
    ]
    for args, kwargs, exc in cases:
        assert_refcounts_stable(lambda: lnc.layer_norm(*args, **kwargs),
                                *args, *kwargs.values(), expect_error=exc)


@pytest.mark.parametrize("with_out", [False, True])
def test_raw_gufunc(data, with_out):
    x, w, b = data
    eps = np.full(4, 1e-5)
    out = np.empty_like(x)
    kw = {"out": out} if with_out else {}
    assert_refcounts_stable(lambda: lnc.layer_norm_ufunc(x, w, b, eps, **kw), x, w, b, eps, out)
    assert_refcounts_stable(lambda: _core._ln_wb(x, w, b, 1e-5), x, w, b)
    assert_refcounts_stable(lambda: _core._ln_none(x, 1e-5), x)
    if not with_out:
        assert_result_freed(lambda: lnc.layer_norm_ufunc(x, w, b, eps))
        assert_result_freed(lambda: _core._ln_wb(x, w, b, 1e-5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        # invalid eps: NaN records + FP flag, not an exception
        assert_refcounts_stable(lambda: lnc.layer_norm_ufunc(x, w, b, -1.0, **kw), x, w, b, out)
    assert_refcounts_stable(lambda: lnc.layer_norm_ufunc(x, w[:-1], b, 1e-5), x, w, b,
                            expect_error=ValueError)
    assert_refcounts_stable(lambda: lnc.layer_norm_ufunc(x.astype(complex), w, b, 1e-5), x, w,
                            expect_error=TypeError)


def test_settings_functions():
    isa = lnc.get_isa()
    n = lnc.get_num_threads()
    try:
        assert_refcounts_stable(lambda: lnc.set_isa(isa))
        assert_refcounts_stable(lambda: lnc.set_isa("nope"), expect_error=ValueError)
        assert_refcounts_stable(lambda: _core.set_isa(3), expect_error=TypeError)
        assert_refcounts_stable(lambda: lnc.set_num_threads(n))
        assert_refcounts_stable(lambda: _core.set_num_threads(0), expect_error=ValueError)
        assert_refcounts_stable(lambda: lnc.supported_isas())
        assert_refcounts_stable(lambda: lnc.get_isa())
    finally:
        lnc.set_isa(isa)
        lnc.set_num_threads(n)


def test_backward_functions(data):
    """layer_norm_backward, its core entry point and the exact sums: no
    reference drift on success and error paths."""
    x, w, b = data
    dy = x[::-1].copy()
    mean = lnc.layer_norm(x, w, return_stats=True).mean
    assert_refcounts_stable(lambda: lnc.layer_norm_backward(dy, x, w), dy, x, w)
    assert_refcounts_stable(lambda: lnc.layer_norm_backward(dy, x, w, mean=mean), dy, x, w, mean)
    assert_refcounts_stable(lambda: _core._backward(dy, x, w, 1e-5, mean, True), dy, x, w, mean)
    assert_refcounts_stable(lambda: _core._backward(dy, x, None, 1e-5, None, False), dy, x)
    assert_refcounts_stable(lambda: lnc.layer_norm_backward_ufunc(dy, x, w, 1e-5), dy, x, w)
    state = _core._backward(dy, x, w, 1e-5, None, True)[1]
    assert_refcounts_stable(lambda: _core._acc_value(state, True), state)
    assert_refcounts_stable(lambda: _core._acc_merge(state, state), state)
    bad = np.zeros((3, 5), np.uint64)
    assert_refcounts_stable(lambda: _core._acc_merge(state, bad), state, bad,
                            expect_error=TypeError)
    assert_refcounts_stable(lambda: _core._backward(dy, x[:, :-1], w, 1e-5, None, True), dy, x,
                            w, expect_error=TypeError)
    assert_refcounts_stable(lambda: lnc.layer_norm_backward(dy[:, :-1], x, w), dy, x, w,
                            expect_error=ValueError)
    layer = lnc.LayerNorm(x.shape[-1], dtype=x.dtype)

    def step():
        layer(x)
        return layer.backward(dy)

    assert_refcounts_stable(step, x, dy)


# ------------------------------------------------------------------- RMSNorm

def call_fast_rms(x, w, eps, rs, out=None, *scale):
    """_fast_rms(x, weight, eps, out, return_stats[, scale]), called directly."""
    return _core._fast_rms(x, w, eps, out, rs, *scale)


@pytest.mark.parametrize("rs", [False, True])
def test_rms_norm_fast_path(data, rs):
    x, w, _ = data
    eps = 1e-6
    assert_refcounts_stable(lambda: lnc.rms_norm(x, w, eps, return_stats=rs), x, w, eps)
    assert_refcounts_stable(lambda: lnc.rms_norm(x, None, eps, return_stats=rs), x, eps)
    assert_result_freed(lambda: lnc.rms_norm(x, w, eps, return_stats=rs))
    assert_refcounts_stable(lambda: call_fast_rms(x, w, eps, rs), x, w, eps)
    assert_result_freed(lambda: call_fast_rms(x, w, eps, rs))
    # the applied scale in x's compute type (Gemma's 1 + weight)
    s = w.astype(np.float64 if x.dtype == np.float64 else np.float32) + 1
    assert_refcounts_stable(lambda: call_fast_rms(x, s, eps, rs, None, True), x, s, eps)
    assert_result_freed(lambda: call_fast_rms(x, s, eps, rs, None, True))
    # Arguments the fast path declines (NotImplemented) or rejects.
    for args in [(x.T, w, eps, rs), (x, w[:-1], eps, rs), (x, w, -1.0, rs), (x, w, 1, rs),
                 (x.astype(np.int32), None, eps, rs), (x[:, :0], None, eps, rs),
                 ([1.0, 2.0], None, eps, rs), (x, w, eps, 1)]:
        assert_refcounts_stable(lambda: call_fast_rms(*args), *args)
    assert_refcounts_stable(lambda: call_fast_rms(x, None, eps, rs, None, True), x, eps)
    assert_refcounts_stable(lambda: _core._fast_rms(x), x)          # wrong arity
    assert_refcounts_stable(lambda: _core._fast_rms(x, w, eps, None, rs, True, 1), x, w, eps)


def test_fast_rms_scale_flag_truth_value_raises(data):
    """A scale flag whose truth value raises: the error, nothing leaked."""
    x, w, _ = data

    class Bad:
        def __bool__(self):
            raise ValueError("no truth value")

    bad = Bad()
    assert_refcounts_stable(lambda: _core._fast_rms(x, w, 1e-6, None, False, bad), x, w, bad,
                            expect_error=ValueError)


@pytest.mark.parametrize("rs", [False, True])
def test_rms_norm_general_path(data, rs):
    x, w, _ = data
    xs = x[:, ::-1]                         # strided: general path
    out = np.empty_like(x)
    assert_refcounts_stable(lambda: lnc.rms_norm(xs, w, return_stats=rs), xs, w)
    assert_refcounts_stable(lambda: lnc.rms_norm(x, w, out=out, return_stats=rs), x, w, out)
    assert_refcounts_stable(lambda: lnc.rms_norm(x, axis=(0, 1), return_stats=rs), x)
    assert_refcounts_stable(lambda: lnc.rms_norm(x.T, w, axis=0, return_stats=rs), x, w)
    assert_refcounts_stable(lambda: lnc.rms_norm(x, w, convention="1+weight",
                                                 return_stats=rs), x, w)
    assert_refcounts_stable(lambda: lnc.rms_norm(xs, w, convention="1+weight",
                                                 return_stats=rs), xs, w)
    xc = x.copy()
    assert_refcounts_stable(lambda: lnc.rms_norm(xc, w, out=xc), xc, w)     # in place
    assert_result_freed(lambda: lnc.rms_norm(xs, w, return_stats=rs))
    assert_result_freed(lambda: lnc.rms_norm(x, w, convention="1+weight", return_stats=rs))
    base = sys.getrefcount(out)
    res = lnc.rms_norm(x, w, out=out)
    assert res is out and sys.getrefcount(out) == base + 1
    del res
    assert sys.getrefcount(out) == base


def test_rms_norm_error_paths(data):
    x, w, _ = data
    cases = [
        ((x, np.ones(5)), {}, ValueError),
        ((x, w), {"eps": -1.0}, ValueError),
        ((x, w), {"eps": float("nan")}, ValueError),
        ((x, w), {"eps": "1e-6"}, TypeError),
        ((x, w), {"axis": int("10000001")}, ValueError),
        ((x, w), {"axis": (0, 0)}, ValueError),
        ((x, w), {"out": np.empty((3, 3), x.dtype)}, ValueError),
        ((x, w), {"out": np.empty(x.shape, np.int32)}, TypeError),
        ((x, w), {"out": [0.0]}, TypeError),
        ((x, w), {"return_stats": 1}, TypeError),
        ((x, w), {"convention": "gemma"}, ValueError),
        ((x, w), {"convention": None}, ValueError),
        ((x.astype(complex), None), {}, TypeError),
        ((np.zeros((2, 0), x.dtype), None), {}, ValueError),
    ]
    for args, kwargs, exc in cases:
        assert_refcounts_stable(lambda: lnc.rms_norm(*args, **kwargs),
                                *args, *kwargs.values(), expect_error=exc)


@pytest.mark.parametrize("with_out", [False, True])
def test_rms_raw_gufuncs(data, with_out):
    x, w, _ = data
    eps = np.full(4, 1e-6)
    out = np.empty_like(x)
    ms = np.empty(4, np.float64 if x.dtype == np.float64 else np.float32)
    kw = {"out": out} if with_out else {}
    assert_refcounts_stable(lambda: lnc.rms_norm_ufunc(x, w, eps, **kw), x, w, eps, out)
    assert_refcounts_stable(lambda: lnc.rms_norm_backward_ufunc(x, x, w, eps, **kw), x, w, eps,
                            out)
    assert_refcounts_stable(lambda: _core._rms_w(x, w, 1e-6), x, w)
    assert_refcounts_stable(lambda: _core._rms_none(x, 1e-6), x)
    if with_out:
        assert_refcounts_stable(lambda: _core._rms_w(x, w, 1e-6, out=(out, ms)), x, w, out, ms)
    else:
        assert_result_freed(lambda: lnc.rms_norm_ufunc(x, w, eps))
        assert_result_freed(lambda: lnc.rms_norm_backward_ufunc(x, x, w, eps))
        assert_result_freed(lambda: _core._rms_w(x, w, 1e-6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        # invalid eps: NaN records + FP flag, not an exception
        assert_refcounts_stable(lambda: lnc.rms_norm_ufunc(x, w, -1.0, **kw), x, w, out)
        assert_refcounts_stable(lambda: _core._rms_none(x, float("nan")), x)
    assert_refcounts_stable(lambda: lnc.rms_norm_ufunc(x, w[:-1], 1e-6), x, w,
                            expect_error=ValueError)
    assert_refcounts_stable(lambda: lnc.rms_norm_ufunc(x.astype(complex), w, 1e-6), x, w,
                            expect_error=TypeError)
    assert_refcounts_stable(lambda: lnc.rms_norm_backward_ufunc(x, x[:, :-1], w, 1e-6), x, w,
                            expect_error=ValueError)


def test_rms_backward_functions(data):
    """rms_norm_backward, its core entry point (the rms flag of _backward)
    and the RMSNorm layer: no reference drift on success and error paths."""
    x, w, _ = data
    dy = x[::-1].copy()
    ms = lnc.rms_norm(x, w, return_stats=True).ms
    assert_refcounts_stable(lambda: lnc.rms_norm_backward(dy, x, w), dy, x, w)
    assert_refcounts_stable(lambda: lnc.rms_norm_backward(dy, x, w, ms=ms), dy, x, w, ms)
    assert_refcounts_stable(lambda: lnc.rms_norm_backward(dy, x), dy, x)
    assert_refcounts_stable(lambda: lnc.rms_norm_backward(dy.T, x.T, w, axis=0), dy, x, w)
    assert_refcounts_stable(lambda: lnc.rms_norm_backward(dy, x, w, convention="1+weight"),
                            dy, x, w)
    assert_result_freed(lambda: lnc.rms_norm_backward(dy, x, w))
    assert_refcounts_stable(lambda: _core._backward(dy, x, w, 1e-6, None, True, True), dy, x, w)
    assert_refcounts_stable(lambda: _core._backward(dy, x, None, 1e-6, None, False, True), dy, x)
    for args, kwargs, exc in [
            ((dy[:, :-1], x, w), {}, ValueError),
            ((dy, x, np.ones(5)), {}, ValueError),
            ((dy, x, w), {"ms": np.zeros(5)}, ValueError),
            ((dy, x, w), {"eps": -1.0}, ValueError),
            ((dy, x, w), {"convention": "gemma"}, ValueError),
            ((dy.astype(complex), x, w), {}, TypeError)]:
        assert_refcounts_stable(lambda: lnc.rms_norm_backward(*args, **kwargs), *args,
                                *kwargs.values(), expect_error=exc)
    assert_refcounts_stable(lambda: _core._backward(dy, x[:, :-1], w, 1e-6, None, True, True),
                            dy, x, w, expect_error=TypeError)
    for convention in ("weight", "1+weight"):
        layer = lnc.RMSNorm(x.shape[-1], dtype=x.dtype, convention=convention)

        def step():
            layer(x)
            return layer.backward(dy)

        assert_refcounts_stable(step, x, dy)
        assert_refcounts_stable(lambda: layer(x[:, :-1]), x, expect_error=ValueError)
        assert_refcounts_stable(lambda: layer.backward(dy[:, :-1]), dy, expect_error=ValueError)
    fresh = lnc.RMSNorm(x.shape[-1], dtype=x.dtype)
    assert_refcounts_stable(lambda: fresh.backward(dy), dy, expect_error=RuntimeError)
