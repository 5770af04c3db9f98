"""Shared strategies and checks for the tests of the C core (tests/test_core_*.py).

Imported by plain ``import core_strategies`` (pytest's pythonpath includes tests/).
"""
from __future__ import annotations

import contextlib
import math
from typing import NamedTuple, Optional

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import layernorm_c as lnc
from cases import (BLOCK, F16, F32, F64, FLOAT_DTYPES, LANES, SMALL_D, STATS_TOL, Y_TOL,
                   with_layout)

#: Largest magnitude of generated inputs per dtype. float16 uses its whole
#: finite range: it is computed in float32 and must never overflow; float32
#: too: its outputs must stay finite whatever the spread.
X_BOUND = {F16: 65504.0, F32: float(np.finfo(np.float32).max), F64: 1e100}
PARAM_BOUND = 8.0


# ---------------------------------------------------------------- settings

@contextlib.contextmanager
def kernel_settings(isa: Optional[str] = None, threads: Optional[int] = None):
    """Temporarily switch ISA and/or thread count; always restore both.

    Usable inside hypothesis tests, where function-scoped fixtures are not.
    """
    old_isa, old_threads = lnc.get_isa(), lnc.get_num_threads()
    try:
        if isa is not None:
            lnc.set_isa(isa)
        if threads is not None:
            lnc.set_num_threads(threads)
        yield
    finally:
        lnc.set_isa(old_isa)
        lnc.set_num_threads(old_threads)


# ---------------------------------------------------------------- dtypes

def result_dtype(*arrays) -> np.dtype:
    """The documented result dtype: integers and bools count as float64,
    then NumPy promotion of x, weight and bias."""
    dts = [np.dtype(np.float64) if a.dtype.kind in "biu" else a.dtype
           for a in arrays if a is not None]
    return np.result_type(*dts)


def stats_dtype(dtype) -> np.dtype:
    return F32 if np.dtype(dtype) == F16 else np.dtype(dtype)


# ---------------------------------------------------------------- strategies

def finite_values(dtype, bound: Optional[float] = None) -> st.SearchStrategy:
    """Finite floats representable in ``dtype``, |v| <= bound."""
    dtype = np.dtype(dtype)
    bound = X_BOUND[dtype] if bound is None else bound
    bound = float(np.array(bound, dtype))  # the nearest value of that width
    return st.floats(-bound, bound, width=8 * dtype.itemsize,
                     allow_nan=False, allow_infinity=False)


def param_arrays(dtype, shape) -> st.SearchStrategy:
    """weight or bias: None, or an array of the given shape."""
    return st.none() | hnp.arrays(dtype, shape, elements=finite_values(dtype, PARAM_BOUND))


eps_values = st.one_of(st.just(1e-5), st.floats(1e-12, 1.0))

#: Feature counts: everything up to past the first block, plus some large ones.
feature_counts = st.one_of(st.integers(1, SMALL_D), st.sampled_from([768, 1000, 16 * BLOCK + 1]))


class Problem(NamedTuple):
    x: np.ndarray
    weight: Optional[np.ndarray]
    bias: Optional[np.ndarray]
    eps: float
    axis: object


@st.composite
def problems(draw, dtypes=FLOAT_DTYPES, max_dims=3, mixed_dtypes=True,
             max_size=600) -> Problem:
    """A random layer_norm call: x of 1-3 dims, an int axis (maybe negative)
    or a tuple of axes, weight and bias each present or absent (possibly of
    another float dtype), and eps."""
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    shape = list(draw(hnp.array_shapes(min_dims=1, max_dims=max_dims, max_side=5)))
    ndim = len(shape)
    axes = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
    # Make one normalized axis long sometimes, to reach whole lane rows.
    long_side = draw(st.integers(1, 2 * LANES + LANES // 2))
    if math.prod(shape) // shape[axes[0]] * long_side <= max_size:
        shape[axes[0]] = long_side
    shape = tuple(shape)
    signed = [a - ndim if draw(st.booleans()) else a for a in axes]
    axis = tuple(signed) if len(signed) > 1 or draw(st.booleans()) else signed[0]
    norm_shape = tuple(shape[a] for a in sorted(axes))

    x = draw(hnp.arrays(dtype, shape, elements=finite_values(dtype)))
    pdtypes = st.sampled_from((dtype,) + tuple(dtypes)) if mixed_dtypes else st.just(dtype)
    weight = draw(param_arrays(draw(pdtypes), norm_shape))
    bias = draw(param_arrays(draw(pdtypes), norm_shape))
    return Problem(x, weight, bias, draw(eps_values), axis)


def random_records(rng: np.random.Generator, dtype, n: int, d: int) -> np.ndarray:
    """n records of d features with varied scales and offsets (finite in dtype)."""
    dtype = np.dtype(dtype)
    big = 1e3 if dtype == F16 else 1e6
    scale = 10.0 ** rng.uniform(-3, 2, size=(n, 1))
    offset = rng.choice([0.0, 1.0, -3.0, 100.0, big], size=(n, 1))
    if dtype != F16:
        # Some rows whose squares leave the float32 range (var > 1e30 or
        # < 1e-30), or that are subnormal in float32.
        extreme = rng.choice([1.0, 1e25, 1e-22, 1e-42], size=(n, 1), p=[0.85, 0.05, 0.05, 0.05])
        scale, offset = np.where(extreme == 1, scale, extreme), np.where(extreme == 1, offset, 0)
    return (offset + scale * rng.standard_normal((n, d))).astype(dtype)


def random_params(rng: np.random.Generator, dtype, d: int, which: str):
    """(weight, bias) with ``which`` in {'none', 'w', 'b', 'wb'}."""
    w = rng.uniform(-2, 2, d).astype(dtype) if "w" in which else None
    b = rng.uniform(-2, 2, d).astype(dtype) if "b" in which else None
    return w, b


WB_COMBOS = ("none", "w", "b", "wb")


# ---------------------------------------------------------------- checks

def as_bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")


def assert_same_bits(got, want, what="array"):
    """Bit-for-bit equality; a NaN only has to meet a NaN (payloads and
    NaN signs carry no information)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    g_nan, w_nan = np.isnan(got), np.isnan(want)
    assert np.array_equal(g_nan, w_nan), f"{what}: NaN positions differ"
    same = (as_bits(got) == as_bits(want)) | g_nan
    if not same.all():
        i = np.argwhere(~same)[0]
        raise AssertionError(
            f"{what}: {int((~same).sum())} elements differ in their bits, first at "
            f"{tuple(i)}: {got[tuple(i)]!r} != {want[tuple(i)]!r}")


def assert_same_result(got, want, what="result"):
    """Bitwise equality of two (y, mean, var) results."""
    for name, g, w in zip(("y", "mean", "var"), got, want):
        assert_same_bits(g, w, f"{what}.{name}")


def assert_byte_order_ignored(res, x, weight=None, bias=None, eps=1e-5, axis=-1):
    """x, then weight and bias, then all three in the other byte order
    ('>f4' for '<f4'): exactly the bits, and the native dtypes, of the
    native call's result ``res`` (a layer_norm(..., return_stats=True))."""
    def swap(a):
        if a is None:
            return None
        swapped = with_layout(a, "byteswapped")
        assert a.dtype.kind != "f" or not swapped.dtype.isnative, swapped.dtype
        return swapped

    calls = [("x", (swap(x), weight, bias))]
    if weight is not None or bias is not None:
        calls += [("weight and bias", (x, swap(weight), swap(bias))),
                  ("x, weight and bias", (swap(x), swap(weight), swap(bias)))]
    for what, args in calls:
        got = lnc.layer_norm(*args, eps, axis=axis, return_stats=True)
        assert_same_result(got, res, f"byte-swapped {what}")


def _param_view(p, x_shape, axes):
    shape = [1] * len(x_shape)
    for a in axes:
        shape[a] = x_shape[a]
    return np.abs(np.asarray(p, np.float64)).reshape(shape)


def assert_matches_reference(res, x, weight=None, bias=None, eps=1e-5, axis=-1):
    """Compare a layer_norm(..., return_stats=True) result with the float64
    reference computed from the same input values.

    Per element the allowed error is T * (1 + |xhat|*|w| + |b|) with T from
    Y_TOL for the result dtype; for float64 results the condition number
    max|x| / sqrt(var + eps) of the record is added to |xhat| (the rounding
    of the mean itself, which the reference shares)."""
    x = np.asarray(x)
    dtype = result_dtype(x, weight, bias)
    ndim = x.ndim
    axes = tuple(sorted(a % ndim for a in ((axis,) if np.ndim(axis) == 0 else axis)))
    ref = lnc.reference_layer_norm(x, weight, bias, eps, axis)
    xhat = np.abs(lnc.reference_layer_norm(x, None, None, eps, axis).y)

    assert isinstance(res, lnc.LayerNormResult)
    y, mean, var = res
    assert y.dtype == dtype and y.shape == x.shape
    assert mean.dtype == var.dtype == stats_dtype(dtype)
    assert mean.shape == var.shape == ref.mean.shape

    x64 = x.astype(np.float64)
    row_max = np.max(np.abs(x64), axis=axes, keepdims=True)
    if dtype == F64:
        var_k = np.expand_dims(ref.var, axes)
        xhat = xhat + row_max / np.sqrt(var_k + eps)
    mag = xhat * (1.0 if weight is None else _param_view(weight, x.shape, axes))
    if bias is not None:
        mag = mag + _param_view(bias, x.shape, axes)
    assert np.all(np.isfinite(y)), "non-finite output for finite input"
    _assert_within("y", y, ref.y, Y_TOL[dtype] * (1.0 + mag))

    ts = STATS_TOL[dtype]
    tiny = float(np.finfo(stats_dtype(dtype)).smallest_subnormal)  # stats rounding floor
    row_max = np.squeeze(row_max, axes)
    _assert_within("mean", mean, ref.mean, ts * row_max + tiny)
    # float32 statistics of float32 data overflow when the variance does.
    with np.errstate(over="ignore"):
        want_var = np.where(np.isinf(ref.var.astype(var.dtype)), np.inf, ref.var)
    _assert_within("var", var, want_var, ts * ref.var + (ts * row_max) ** 2 + tiny)


def _assert_within(what, got, want, tol):
    got = np.asarray(got)
    with np.errstate(invalid="ignore"):
        err = np.abs(got.astype(np.float64) - want)
    bad = ~((err <= tol) | (got == want))
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}{i} = {got[i]!r}, reference {want[i]!r}, "
                             f"error {err[i]:.3g} > tolerance {np.broadcast_to(tol, err.shape)[i]:.3g}")
