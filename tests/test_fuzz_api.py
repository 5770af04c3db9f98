"""Fuzzing the Python API: whatever it is handed, layer_norm, rms_norm and
the raw gufuncs layer_norm_ufunc and rms_norm_ufunc return a correct result
or raise TypeError/ValueError; layer_norm_backward, rms_norm_backward and
the RMSNorm layer match the float64 reference (and themselves, bit for
bit, with and without their optional statistics, split into micro-batches).

bfloat16 (ml_dtypes installed) is drawn like the other float dtypes; its
oracle is the contract "computed in float32, rounded once": the call on the
same values widened to float32, itself checked against the reference, gives
the bfloat16 bits once rounded.

Random shapes (0-length axes, SIMD boundaries, very large d), every kind of
NumPy dtype (both byte orders, structured, object, strings, datetimes),
memory layouts (negative, zero and odd strides, Fortran order, unaligned,
byte-swapped, read-only, broadcast), weight/bias of wrong shapes and types,
eps of every value and type, out= of every wrong kind (and overlapping x;
for rms_norm also holding the weight), axis out of range, unknown RMSNorm
conventions. The oracle is in tests/fuzz_support.py.

Two budgets:

* default (part of ``python -m pytest``): derandomized, a few hundred
  examples in all, well under 20 s;
* the long run, randomized, many more examples per test::

      LAYERNORM_C_FUZZ=1 python -m pytest tests/test_fuzz_api.py -q
      python tools/fuzz_api.py --minutes 15      # loops until the time is up,
                                                 # prints calls/time/failures

``LAYERNORM_C_FUZZ_EXAMPLES`` sets the examples per test of the long run
(default 20000).
"""
from __future__ import annotations

import collections
import itertools
import math
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzz_support as fs
import layernorm_c as lnc
from cases import (BLOCK, F16, F32, F64, FLOAT_DTYPES, LANES, LAYOUTS, STATS_TOL,
                   WRITABLE_LAYOUTS, Y_TOL, with_layout)

# The strategies cast and compare extreme values on purpose.
pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]

#: What the fuzz tests did, by outcome (read by tools/fuzz_api.py).
COUNTS: collections.Counter = collections.Counter()

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
           HealthCheck.large_base_example]
if fs.FUZZ:
    FUZZ_SETTINGS = settings(
        max_examples=int(os.environ.get("LAYERNORM_C_FUZZ_EXAMPLES", "20000")),
        derandomize=False, deadline=None, suppress_health_check=_HEALTH,
        print_blob=True, database=None)
else:
    FUZZ_SETTINGS = settings(max_examples=250, derandomize=True, deadline=None,
                             suppress_health_check=_HEALTH, print_blob=True, database=None)

class _Default:
    """The 'argument not passed' marker (readable in failure reports)."""

    def __repr__(self):
        return "DEFAULT"


DEFAULT = _Default()


# ================================================================ layer_norm

@st.composite
def params_for(draw, norm_shape, x, fault=False):
    """weight or bias: None or right; with fault, wrong in one way."""
    if fault:
        kind = draw(st.sampled_from(["shape", "dtype", "scalar", "list", "out", "ok"]))
    else:
        kind = draw(fs.weighted((1, "none"), (2, "ok")))
    shape = norm_shape if norm_shape is not None else (x.shape[-1:] if getattr(x, "ndim", 0) else (3,))
    if kind == "none":
        return None
    if kind == "ok":
        return draw(fs.arrays_in_layouts(shape, draw(fs.real_dtypes)))
    if kind == "shape":
        # wrong, or broadcastable to the normalized shape (both are decided
        # by the contract mirror, param_broadcasts)
        bad = draw(st.sampled_from([shape + (1,), (1,) + shape, shape[:-1],
                                    tuple(n + 1 for n in shape), (),
                                    (1,) * len(shape), (2,) + shape]))
        return draw(fs.arrays_in_layouts(bad, draw(fs.real_dtypes)))
    if kind == "dtype":
        return draw(fs.arrays_in_layouts(shape, draw(fs.any_dtype)))
    if kind == "scalar":
        return draw(st.sampled_from([1.0, 0, np.float32(2.0), np.array(1.0), None]))
    if kind == "list":
        return draw(fs.values_of(shape, F64)).tolist()
    return "OUT"  # replaced by the out= array below, when shapes allow


@st.composite
def axis_values(draw, ndim):
    return draw(fs.weighted(
        (12, st.just(DEFAULT)),
        (4, st.integers(-ndim - 2, ndim + 1)),
        (3, st.lists(st.integers(-ndim - 1, max(ndim, 1)), min_size=1, max_size=max(ndim, 1))
         .map(tuple)),
        (1, st.lists(st.integers(-ndim, max(ndim - 1, 0)), max_size=3)),
        (1, st.sampled_from([10**30, -(10**30), np.int64(-1), np.int8(0), True, 1.0, None,
                             "0", (), ((0,),), (0, 1.0), [np.int32(0)]])),
    ))


@st.composite
def out_for(draw, x, rdt, fault=False):
    """out=: None, right (in any layout), x itself, overlapping x; with
    fault, wrong in one way."""
    xa = x if isinstance(x, np.ndarray) else None
    shape = xa.shape if xa is not None else None
    if fault:
        kind = draw(st.sampled_from(["wrong", "wrong", "inplace", "overlap"]))
    else:
        kind = draw(fs.weighted((6, "none"), (3, "ok"), (1, "inplace"), (1, "overlap")))
    if kind == "none" or shape is None:
        return None, x
    if kind == "ok" and rdt is not None:
        layout = draw(st.sampled_from(WRITABLE_LAYOUTS))
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        return with_layout(np.full(shape, 7, rdt), layout, rng), x
    if kind == "inplace":
        return xa, x
    if kind == "overlap" and rdt is not None and xa.size > 0:
        # x and out are two views of one buffer, out shifted by k elements.
        k = draw(st.integers(-3, 3))
        buf = np.zeros(xa.size + abs(k), rdt)
        lo = max(0, -k)
        xv = buf[lo:lo + xa.size].reshape(shape)
        with np.errstate(all="ignore"):
            xv[...] = xa.astype(rdt) if fs.is_real(xa.dtype) else 0
        ov = buf[lo + k:lo + k + xa.size].reshape(shape)
        if xa.ndim and draw(st.booleans()):
            xv, ov = xv[::-1], ov[::-1]
        return ov, xv
    wrong = draw(st.sampled_from(["shape", "dtype", "readonly", "list", "scalar", "matrix",
                                  "zerod"]))
    if wrong == "shape":
        return np.zeros(shape + (1,)), x
    if wrong == "dtype":
        return np.zeros(shape, draw(fs.any_dtype)), x
    if wrong == "readonly":
        return np.broadcast_to(np.zeros((), rdt or F64), shape), x
    if wrong == "list":
        return np.zeros(shape).tolist(), x
    if wrong == "scalar":
        return np.float64(0.0), x
    if wrong == "matrix" and len(shape) == 2:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return np.asmatrix(np.zeros(shape, rdt or F64)), x
    return np.zeros((), rdt or F64), x


#: The one thing a generated call gets wrong on purpose (or nothing).
FAULTS = ("none",) * 12 + ("x_dtype", "x_kind", "axis", "weight", "bias", "eps", "out",
                           "zero_d")
#: The same for rms_norm: no bias; the convention instead.
RMS_FAULTS = ("none",) * 12 + ("x_dtype", "x_kind", "axis", "weight", "convention", "eps",
                               "out", "zero_d")
#: Conventions rms_norm must refuse (ValueError).
BAD_CONVENTIONS = ("gemma", "Weight", "1 + weight", "", None, 1, b"weight", ("weight",))


def layer_norm_calls():
    """layer_norm(x, weight, bias, eps, axis=, out=, return_stats=)."""
    return norm_calls("layer_norm")


def rms_norm_calls():
    """rms_norm(x, weight, eps, axis=, out=, return_stats=, convention=)."""
    return norm_calls("rms_norm")


@st.composite
def norm_calls(draw, op):
    """A call that is valid except, usually, for one fault; every part is
    also drawn from its "anything goes" strategy now and then. For
    rms_norm, out= may also share memory with the weight (and x)."""
    fault = draw(st.sampled_from(FAULTS if op == "layer_norm" else RMS_FAULTS))
    shape = draw(fs.shapes())
    if fault == "zero_d":
        shape = shape[:-1] + (0,) if shape and draw(st.booleans()) else ()
    dt = draw(fs.any_dtype if fault == "x_dtype" else fs.real_dtypes)
    x = draw(fs.arrays_in_layouts(shape, dt))
    xkind = draw(st.sampled_from(["list", "scalar", "matrix", "masked", "subclass", "none"])
                 if fault == "x_kind" else st.just("array"))
    if xkind == "list" and x.size <= 4096:
        x = x.tolist()
    elif xkind == "scalar":
        x = draw(st.sampled_from([1.0, 3, np.float32(2.0), True]))
    elif xkind == "matrix" and x.ndim == 2:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x = np.asmatrix(x)
    elif xkind == "masked":
        x = np.ma.masked_array(x, mask=np.zeros(x.shape, bool))
    elif xkind == "subclass":
        x = x.view(_SubArray)
    elif xkind == "none":
        x = None
    ndim = len(shape)
    if fault == "axis":
        axis = draw(axis_values(ndim))
    elif ndim and draw(st.integers(0, 3)) == 0:
        # a valid non-default axis: an int or a tuple of distinct axes
        axis = draw(st.one_of(st.integers(-ndim, ndim - 1),
                              st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim,
                                       unique=True).map(tuple)))
    else:
        axis = DEFAULT
    norm_shape = None
    try:
        axes = fs_normalize_axes(-1 if axis is DEFAULT else axis, ndim)
        norm_shape = tuple(shape[a] for a in axes)
    except (TypeError, ValueError, IndexError):
        pass
    xa = np.asarray(x) if x is not None else np.zeros(3)
    weight = draw(params_for(norm_shape, xa, fault == "weight"))
    bias = draw(params_for(norm_shape, xa, fault == "bias")) if op == "layer_norm" else None
    eps = draw(fs.eps_values() if fault == "eps" else
               fs.weighted((3, DEFAULT), (3, fs.valid_eps())))
    rdt = None
    try:
        rdt = fs.compute_dtype(*(np.asarray(a).dtype for a in (x, weight, bias)
                                 if a is not None and not isinstance(a, str)))
        if not fs.is_float(rdt):
            rdt = None
    except Exception:
        pass
    out, x = draw(out_for(x, rdt, fault == "out"))
    if isinstance(weight, str):
        weight = out if isinstance(out, np.ndarray) and norm_shape == getattr(out, "shape", 0) \
            else None
    if isinstance(bias, str):
        bias = None
    return_stats = draw(fs.weighted((6, st.booleans()),
                                    (1, st.sampled_from([0, 1, None, np.bool_(True)]))))
    case = dict(x=x, weight=weight, bias=bias, eps=eps, axis=axis, out=out,
                return_stats=return_stats)
    if op == "layer_norm":
        return case
    case["convention"] = draw(st.sampled_from(BAD_CONVENTIONS) if fault == "convention" else
                              fs.weighted((4, DEFAULT), (2, "weight"), (3, "1+weight")))
    if isinstance(out, np.ndarray) and isinstance(weight, np.ndarray) and out.ndim and \
            out.flags.writeable and axis in (DEFAULT, -1, out.ndim - 1) and \
            weight.shape == out.shape[-1:] and out.size and draw(st.integers(0, 3)) == 0:
        # The weight is the first record of out (and of x, when out is x):
        # it must be read before that record is written.
        view = out[(0,) * (out.ndim - 1)]
        with np.errstate(all="ignore"):
            view[...] = weight if fs.is_real(weight.dtype) else 1
        case["weight"] = view
    return case


class _SubArray(np.ndarray):
    """An ndarray subclass: the C fast path must step aside for it."""


def fs_normalize_axes(axis, ndim):
    """Mirror of the documented axis rule; raises for anything invalid."""
    if isinstance(axis, (bool, np.bool_)):
        raise TypeError
    if isinstance(axis, (int, np.integer)):
        axes = (int(axis),)
    elif isinstance(axis, (tuple, list)) and all(
            isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_))
            for a in axis):
        axes = tuple(int(a) for a in axis)
    else:
        raise TypeError
    if not axes or any(not -ndim <= a < ndim for a in axes):
        raise ValueError
    norm = tuple(sorted(a % ndim for a in axes))
    if len(set(norm)) != len(norm):
        raise ValueError
    return norm


def param_broadcasts(shape, x_shape, axes) -> bool:
    """Mirror of the documented parameter rule: the normalized shape, or a
    shape NumPy broadcasts to it (leading 1s allowed), or x's ndim with 1 on
    every axis that is not normalized."""
    norm = tuple(x_shape[a] for a in axes)
    if len(shape) == len(x_shape) and len(shape) > len(norm) and all(
            shape[i] == 1 for i in range(len(shape)) if i not in axes):
        shape = tuple(shape[a] for a in axes)
    elif len(shape) > len(norm):
        if any(n != 1 for n in shape[:len(shape) - len(norm)]):
            return False
        shape = shape[len(shape) - len(norm):]
    pad = (1,) * (len(norm) - len(shape)) + tuple(shape)
    return all(p in (1, n) for p, n in zip(pad, norm))


def param_to_norm(p, x_shape, axes) -> np.ndarray:
    """A parameter that passed param_broadcasts, as the normalized shape."""
    norm = tuple(x_shape[a] for a in axes)
    shape = p.shape
    if len(shape) == len(x_shape) and len(shape) > len(norm) and all(
            shape[i] == 1 for i in range(len(shape)) if i not in axes):
        p = p.reshape(tuple(shape[a] for a in axes))
    elif len(shape) > len(norm):
        p = p.reshape(shape[len(shape) - len(norm):])
    return np.broadcast_to(p, norm)


def is_weak_scalar(p) -> bool:
    """A Python scalar parameter never widens the result (NumPy 2 rules)."""
    return type(p) in (bool, int, float)


def layer_norm_expectation(x, weight, bias, eps, axis, out, return_stats):
    """None if the documented contract makes this call invalid, else what a
    valid call must produce: (xa, axes, norm_shape, result dtype)."""
    if any(isinstance(a, np.ma.MaskedArray) for a in (x, weight, bias, out)):
        return None  # a mask would be ignored: refused
    if not isinstance(return_stats, (bool, np.bool_)):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            xa = np.asarray(x)
    except Exception:
        return None
    if not fs.is_real(xa.dtype) or xa.ndim == 0:
        return None
    try:
        axes = fs_normalize_axes(-1 if axis is DEFAULT else axis, xa.ndim)
    except (TypeError, ValueError):
        return None
    norm_shape = tuple(xa.shape[a] for a in axes)
    if math.prod(norm_shape) == 0:
        return None
    params = []
    for p in (weight, bias):
        if p is None:
            params.append(None)
            continue
        try:
            pa = np.asarray(p)
        except Exception:
            return None
        if not fs.is_real(pa.dtype) or not param_broadcasts(pa.shape, xa.shape, axes):
            return None
        params.append(pa)
    if eps is not DEFAULT and not fs.eps_is_valid(eps):
        return None
    rdt = fs.compute_dtype(xa.dtype, *(p.dtype for p, given in zip(params, (weight, bias))
                                       if p is not None and not is_weak_scalar(given)))
    if out is not None:
        if not isinstance(out, np.ndarray) or out.shape != xa.shape:
            return None
        if fs.is_bf16(out.dtype) or fs.is_bf16(rdt):
            if out.dtype != rdt:  # bfloat16 only as itself
                return None
        elif out.dtype.kind != "f" or out.dtype.itemsize != rdt.itemsize:
            return None
        if not out.flags.writeable:
            return None
    return xa, axes, norm_shape, rdt, params


def to_rows(a, lead, axes, d):
    """(rows, d) float64 view of an array with the normalized axes last."""
    perm = tuple(lead) + tuple(axes)
    return np.asarray(a).transpose(perm).reshape(-1, d).astype(np.float64)


def check_layer_norm(case) -> str:
    return check_norm_call("layer_norm", case)


def check_rms_norm(case) -> str:
    return check_norm_call("rms_norm", case)


def check_norm_call(op, case) -> str:
    """Call layer_norm or rms_norm as the case says; check it raised
    TypeError/ValueError exactly where the contract says so, left its inputs
    alone, and returned what the contract says."""
    x, weight, bias = case["x"], case["weight"], case["bias"]
    eps, axis, out, rs = case["eps"], case["axis"], case["out"], case["return_stats"]
    conv = case.get("convention", DEFAULT)
    kwargs = {}
    if eps is not DEFAULT:
        kwargs["eps"] = eps
    if axis is not DEFAULT:
        kwargs["axis"] = axis
    if out is not None:
        kwargs["out"] = out
    kwargs["return_stats"] = rs
    if conv is not DEFAULT:
        kwargs["convention"] = conv
    expect = layer_norm_expectation(x, weight, bias, eps, axis, out, rs)
    if conv is not DEFAULT and not (isinstance(conv, str) and conv in ("weight", "1+weight")):
        expect = None
    # What the inputs held before the call (out= may overlap them).
    snaps = {n: fs.snapshot(a) for n, a in (("x", x), ("weight", weight), ("bias", bias))}
    before = None
    if expect is not None:
        xa, axes, norm_shape, rdt, params = expect
        before = (np.array(xa, copy=True),
                  [None if p is None else np.array(p, copy=True) for p in params])
    fn = lnc.layer_norm if op == "layer_norm" else lnc.rms_norm
    args = (x, weight, bias) if op == "layer_norm" else (x, weight)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        try:
            fs.trace(op, x=x, weight=weight, bias=bias, **kwargs)
            res = fn(*args, **kwargs)
        except (TypeError, ValueError) as exc:
            if expect is not None:
                raise AssertionError(f"a valid call raised {type(exc).__name__}: {exc}") from exc
            assert str(exc), "exception without a message"
            for n, s in snaps.items():
                fs.assert_unchanged(s, n)
            return "raised"
    if expect is None:
        raise AssertionError("an invalid call returned instead of raising")
    for n, s in snaps.items():
        fs.assert_unchanged(s, n, out)

    y = res.y if rs else res
    if rs:
        kind = lnc.LayerNormResult if op == "layer_norm" else lnc.RMSNormResult
        assert isinstance(res, kind), type(res)
        assert len(res) == (3 if op == "layer_norm" else 2)
    assert isinstance(y, np.ndarray), type(y)
    if out is not None:
        assert y is out, "out= given but another array returned"
    else:
        assert type(y) is np.ndarray and y.dtype == rdt, (type(y), y.dtype, rdt)
    assert y.shape == xa.shape, (y.shape, xa.shape)

    x0, (w0, b0) = before
    e = (1e-5 if op == "layer_norm" else 1e-6) if eps is DEFAULT else \
        float(eps[()] if isinstance(eps, np.ndarray) else eps)
    c = "weight" if conv is DEFAULT else conv
    if bf16_in(x0, w0, b0, y):
        twin_rdt = F32 if fs.is_bf16(rdt) else rdt
        return check_bf16_twin(op, res, rs, rdt, twin_rdt, x0, (w0, b0), (weight, bias),
                               {k: v for k, v in kwargs.items() if k != "out"},
                               lambda r, w: verify_norm(op, r, rs, widen(x0), w, e, axes,
                                                        norm_shape, twin_rdt, c))
    return verify_norm(op, res, rs, x0, (w0, b0), e, axes, norm_shape, rdt, c)


def widen(a):
    return fs.widen_bf16(a)


def bf16_in(*arrays) -> bool:
    """Any of these is a bfloat16 array."""
    return any(isinstance(a, np.ndarray) and fs.is_bf16(a.dtype) for a in arrays)


def check_bf16_twin(op, res, rs, rdt, twin_rdt, x0, params0, given, kwargs, verify) -> str:
    """bfloat16 is computed in float32 and rounded once: the call on the
    same values widened to float32 (exact), checked against the reference
    by ``verify``, gives the bits of the bfloat16 call once rounded (and
    the same statistics, bit for bit)."""
    # A weak Python scalar parameter stays what it was; arrays are widened.
    wide = [widen(a) if isinstance(g, np.ndarray) else g for a, g in zip(params0, given)]
    fn = lnc.layer_norm if op == "layer_norm" else lnc.rms_norm
    twin = fn(widen(x0), *wide[:2 if op == "layer_norm" else 1], **kwargs)
    y, ty = (res.y, twin.y) if rs else (res, twin)
    assert ty.dtype == twin_rdt, (ty.dtype, twin_rdt)
    verify(twin, tuple(None if a is None else widen(a) for a in params0))
    want = ty.astype(rdt) if fs.is_bf16(rdt) else ty
    assert fs.same_bits(y, want), f"{op}: the bfloat16 call is not the float32 one rounded once"
    if rs:
        for name, a, b in zip(res._fields[1:], res[1:], twin[1:]):
            assert fs.same_bits(a, b), f"{op}: {name} differs from the float32 call's"
    return "ok-bf16"


def verify_norm(op, res, rs, x0, params0, e, axes, norm_shape, rdt, conv) -> str:
    """The result against the float64 reference, within the error bounds."""
    w0, b0 = (tuple(params0) + (None,))[:2]
    y = res.y if rs else res
    w0, b0 = (None if p is None else param_to_norm(p, x0.shape, axes) for p in (w0, b0))
    d = math.prod(norm_shape)
    lead = [i for i in range(x0.ndim) if i not in axes]
    lead_shape = tuple(x0.shape[i] for i in lead)
    if y.size == 0:
        return "ok-empty"
    X = to_rows(x0.astype(rdt) if x0.dtype.kind in "biu" else x0, lead, axes, d)
    W = None if w0 is None else w0.astype(np.float64).reshape(d)
    if op == "rms_norm":
        S = None if W is None else (1.0 + W if conv == "1+weight" else W)
        check_rms_rows(to_rows(y, lead, axes, d), X, S, np.full(len(X), e), rdt, y.dtype,
                       "rms_norm y")
        if rs:
            check_rms_ms(res.ms, lead_shape, X, e, rdt, "rms_norm ms")
        return "ok"
    B = None if b0 is None else b0.astype(np.float64).reshape(d)
    ref = lnc.reference_layer_norm(x0, w0, b0, e, axes)
    ref_y = np.array(to_rows(ref.y, lead, axes, d))
    rmean = np.array(ref.mean, dtype=np.float64).reshape(-1)
    rvar = np.array(ref.var, dtype=np.float64).reshape(-1)
    if rdt == F64:
        fs.rescue_reference(X, W, B, np.full(len(X), e), rmean, rvar, ref_y)
    bound = fs.error_bound(X, W, B, e, rmean, rvar, rdt, y.dtype, ref_y)
    fs.assert_y_close(to_rows(y, lead, axes, d), bound, "layer_norm y")
    if rs:
        sdt = F32 if rdt in (F16, F32) else F64
        assert res.mean.dtype == sdt and res.var.dtype == sdt, (res.mean.dtype, sdt)
        assert res.mean.shape == lead_shape and res.var.shape == lead_shape
        fs.assert_stats_close(res.mean.reshape(-1), res.var.reshape(-1), rmean, rvar,
                              rdt, sdt, d, X, "layer_norm stats")
    return "ok"


# ---------------------------------------------------------------- RMSNorm's oracle

def _rms_units(cdt, d) -> float:
    """Relative error bound of a computed mean square: a sum of positive
    terms, in float32 lane runs (float16, float32) or float64 lanes."""
    return fs.F32_RUN_UNITS + fs.f64_sum_units(d) if cdt != F64 else fs.f64_sum_units(d)


def _rms_reference(X, E):
    """reference_rms_norm of (rows, d) float64 records with per-row eps:
    (y without scale, ms). Records with a NaN or an infinity are zeros
    here (the kernels make them all NaN; the callers check that)."""
    finite = np.isfinite(X).all(axis=1)
    Xf = np.where(finite[:, None], X, 0.0)
    yhat = np.empty_like(Xf)
    ms = np.empty(len(Xf))
    with np.errstate(all="ignore"):
        for e in np.unique(E):
            rows = E == e
            ref = lnc.reference_rms_norm(Xf[rows], eps=float(e))
            yhat[rows], ms[rows] = ref.y, ref.ms
    return yhat, ms, finite


def check_rms_rows(Y, X, S, E, cdt, odt, what) -> None:
    """RMSNorm output rows Y (rows, d) for records X, applied scale S (d,)
    or None, eps per row E, computed in cdt and stored in odt.

    Bound per element, for a reference output ``r``: ``T (1 + |r|)`` (the
    roundings of the output pass in the larger of cdt's and odt's
    tolerance) ``+ |r| u`` (the mean square's relative error ``u``, which
    moves ``1/sqrt`` by half of it). A record with a NaN or an infinity is
    all NaN. An element with an infinite or NaN scale is not finite; one
    whose reference is beyond half of odt's (or whose scale is beyond half
    of cdt's) range is not checked."""
    cdt, odt = np.dtype(cdt).newbyteorder("="), np.dtype(odt).newbyteorder("=")
    Y = np.asarray(Y, np.float64)
    rows, d = X.shape
    yhat, _, finite = _rms_reference(X, E)
    S1 = np.ones(d) if S is None else np.asarray(S, np.float64)
    with np.errstate(all="ignore"):
        ref = yhat * S1
        absr = np.abs(ref)
        T = max(Y_TOL[cdt], Y_TOL[odt] if odt in Y_TOL else fs.BF16_UNIT if fs.is_bf16(odt)
                else 0)
        tol = T * (1 + absr) + absr * _rms_units(cdt, d)
        fin_o = float(fs.finfo(odt).max) if fs.is_float(odt) else np.inf
        big = (absr > 0.5 * fin_o) | (np.abs(S1) > 0.5 * float(fs.finfo(cdt).max))
        err = np.abs(Y - ref)
    wild = np.broadcast_to(~np.isfinite(S1), Y.shape)
    fin = np.broadcast_to(finite[:, None], Y.shape)
    bad_rec = ~finite & ~np.isnan(Y).all(axis=1)  # a NaN or an infinity: all NaN
    bad_nan = fin & ~wild & np.isnan(ref) & ~np.isnan(Y)   # 0/0: eps 0, a zero record
    bad_wild = fin & wild & np.isfinite(Y)
    bad_val = fin & ~wild & ~big & np.isfinite(ref) & ~(err <= tol)
    if bad_rec.any():
        r = int(np.flatnonzero(bad_rec)[0])
        raise AssertionError(f"{what}: record {r} holds a NaN or an infinity but its output "
                             f"is not all NaN: {Y[r][:8]!r}")
    bad = bad_nan | bad_wild | bad_val
    if bad.any():
        idx = tuple(np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} element(s) wrong; first at {idx}: got {Y[idx]!r}, "
            f"reference {ref[idx]!r}, tolerance {tol[idx]!r} (nan:{bad_nan.sum()} "
            f"wild:{bad_wild.sum()} value:{bad_val.sum()})")


def check_rms_ms(ms, lead_shape, X, e, cdt, what) -> None:
    """rms_norm's mean squares: float32 for float-computed records, float64
    for float64 ones; NaN for a record with a NaN or an infinity; else
    within the sum's relative error (and the statistics' tolerance) of the
    reference, where that fits the statistics' dtype."""
    sdt = F64 if cdt == F64 else F32
    assert ms.dtype == sdt and ms.shape == lead_shape, (ms.dtype, ms.shape, sdt, lead_shape)
    M = np.asarray(ms, np.float64).reshape(-1)
    _, ref, finite = _rms_reference(X, np.full(len(X), e))
    assert np.isnan(M[~finite]).all(), f"{what}: a record with a NaN or inf has a number"
    fi = np.finfo(sdt)
    with np.errstate(all="ignore"):
        tol = (_rms_units(cdt, X.shape[1]) + STATS_TOL[cdt]) * ref + float(fi.smallest_subnormal)
        ok = finite & (ref <= 0.5 * float(fi.max))
        bad = ok & ~(np.abs(M - ref) <= tol)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise AssertionError(f"{what}: ms[{i}] = {M[i]!r}, reference {ref[i]!r}, "
                             f"tolerance {tol[i]!r}")


@FUZZ_SETTINGS
@given(case=layer_norm_calls())
def test_fuzz_layer_norm(case):
    COUNTS["layer_norm:" + check_layer_norm(case)] += 1


@FUZZ_SETTINGS
@given(case=rms_norm_calls())
def test_fuzz_rms_norm(case):
    COUNTS["rms_norm:" + check_rms_norm(case)] += 1


# ================================================================ the raw gufunc

UFUNC_FAULTS = ("none",) * 10 + ("shape", "dtype", "eps", "out", "axis", "dtype_kw",
                                  "casting")


def ufunc_calls():
    """layer_norm_ufunc(x, w, b, eps, [out], [axis=], [dtype=], [casting=])."""
    return gufunc_calls("layer_norm")


def rms_ufunc_calls():
    """rms_norm_ufunc(x, scale, eps, [out], [axis=], [dtype=], [casting=])."""
    return gufunc_calls("rms_norm")


@st.composite
def gufunc_calls(draw, op):
    """A call of a forward gufunc: NumPy broadcasting of leading
    dimensions, usually one fault. (rms_norm_ufunc has no bias: ``b`` is
    None.)"""
    fault = draw(st.sampled_from(UFUNC_FAULTS))
    lead = draw(st.lists(fs.weighted((1, 0), (8, st.integers(1, 4))), max_size=3))
    n = draw(fs.weighted((1, 0), (12, st.integers(1, 40)),
                         (2, st.sampled_from(
                             [2 * LANES - 1, 2 * LANES, 2 * LANES + 1, 4 * LANES + 1, 1000,
                              16 * BLOCK + 1])),
                         (1, st.integers(1000, fs.MAX_D // 16))))
    size = max(1, math.prod(lead)) * n
    if size > fs.MAX_SIZE:
        n = max(1, fs.MAX_SIZE // max(1, math.prod(lead)))
    dts = fs.any_dtype if fault == "dtype" else fs.real_dtypes

    def param_shape():
        k = draw(st.integers(0, len(lead)))
        sub = tuple(1 if draw(st.booleans()) else m for m in lead[len(lead) - k:])
        nn = n + draw(st.sampled_from([1, -1])) if fault == "shape" and n else n
        return sub + (max(nn, 0),)

    x = draw(fs.arrays_in_layouts(tuple(lead) + (n,), draw(dts)))
    w = draw(fs.arrays_in_layouts(param_shape(), draw(dts)))
    b = draw(fs.arrays_in_layouts(param_shape(), draw(dts))) if op == "layer_norm" else None
    params = (w,) if b is None else (w, b)
    ekind = draw(st.sampled_from(["bad", "scalar", "rows"]) if fault == "eps"
                 else st.sampled_from(["scalar", "rows"]))
    if ekind == "scalar":
        eps = draw(fs.weighted((4, st.floats(0, 1)), (1, st.floats()),
                               (1, st.sampled_from([1e-5, 0.0, -1.0, math.nan]))))
    elif ekind == "rows":
        k = draw(st.integers(0, len(lead)))
        eshape = tuple(1 if draw(st.booleans()) else m for m in lead[len(lead) - k:])
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        vals = np.array([1e-5, 1e-5, 1e-3, 0.0, 1.0, 5e-324, 1e300, 1e-5, 1e-2, 0.5,
                         -1.0, np.nan, np.inf])
        vals = vals[:rng.integers(10, len(vals) + 1)]  # often no invalid eps at all
        with np.errstate(all="ignore"):
            eps = rng.choice(vals, size=eshape).astype(draw(st.sampled_from(
                [np.float64, np.float32, np.float16])))
    else:
        eps = draw(st.sampled_from([np.zeros(3), np.zeros((7, 1)), "x", None, 1j,
                                    np.array([1], dtype=object)]))
    kwargs = {}
    if fault == "out" or draw(st.integers(0, 3)) == 0:
        okind = draw(st.sampled_from(["wrongshape", "wrongdtype", "readonly", "inplace"])
                     if fault == "out" else st.sampled_from(["ok", "ok", "tuple", "inplace"]))
        oshape = tuple(lead) + (n,)
        try:
            oshape = np.broadcast_shapes(tuple(lead), *(p.shape[:-1] for p in params),
                                         np.shape(eps)) + (n,)
        except ValueError:
            pass
        if okind in ("ok", "tuple"):
            odt = draw(st.sampled_from(FLOAT_DTYPES))
            rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
            o = with_layout(np.full(oshape, 7, odt), draw(st.sampled_from(WRITABLE_LAYOUTS)),
                            rng)
            kwargs["out"] = (o,) if okind == "tuple" else o
        elif okind == "wrongshape":
            kwargs["out"] = np.zeros(oshape + (1,))
        elif okind == "wrongdtype":
            kwargs["out"] = np.zeros(oshape, draw(fs.any_dtype))
        elif okind == "readonly":
            kwargs["out"] = np.broadcast_to(np.zeros(()), oshape)
        elif okind == "inplace" and x.shape == oshape:
            kwargs["out"] = x
    if fault == "axis":
        kwargs["axis"] = draw(st.integers(-3, 2))
    if fault == "dtype_kw":
        kwargs["dtype"] = draw(st.sampled_from([F16, F32, F64, np.dtype(int),
                                                np.dtype(complex)]))
    if fault == "casting":
        kwargs["casting"] = draw(st.sampled_from(["no", "equiv", "safe", "same_kind",
                                                  "unsafe"]))
    return dict(op=op, x=x, w=w, b=b, eps=eps, kwargs=kwargs)


def ufunc_expected_valid(x, w, b, eps, kwargs) -> bool:
    """True where NumPy's rules surely accept the call (a subset); b None
    for rms_norm_ufunc."""
    if set(kwargs) - {"out"}:
        return False
    ops = (x, w) if b is None else (x, w, b)
    if not all(isinstance(a, np.ndarray) and fs.is_real(a.dtype) for a in ops):
        return False
    if not (isinstance(eps, float) or isinstance(eps, np.ndarray) and eps.dtype.kind == "f"):
        return False
    if not all(a.ndim for a in ops) or len({a.shape[-1] for a in ops}) != 1:
        return False
    try:
        lead = np.broadcast_shapes(*(a.shape[:-1] for a in ops), np.shape(eps))
    except ValueError:
        return False
    out = kwargs.get("out")
    if out is not None:
        if isinstance(out, tuple):
            out = out[0]
        if not isinstance(out, np.ndarray) or out.dtype.kind != "f" or \
                not out.flags.writeable or out.shape != lead + (x.shape[-1],):
            return False
        ufunc = lnc.layer_norm_ufunc if b is not None else lnc.rms_norm_ufunc
        loop = fs.resolve_loop(ufunc, tuple(a.dtype for a in ops)
                               + (np.dtype(np.float64), None))[-1]
        if not np.can_cast(loop, out.dtype, "same_kind"):
            return False
    return True


def check_ufunc(case) -> str:
    op = case.get("op", "layer_norm")
    x, w, b, eps, kwargs = case["x"], case["w"], case["b"], case["eps"], case["kwargs"]
    ufunc = lnc.layer_norm_ufunc if op == "layer_norm" else lnc.rms_norm_ufunc
    operands = (x, w, b) if op == "layer_norm" else (x, w)
    valid = ufunc_expected_valid(x, w, b if op == "layer_norm" else None, eps, kwargs)
    snaps = {n: fs.snapshot(a) for n, a in zip(("x", "weight", "bias"), operands)}
    before = [np.array(a, copy=True) for a in operands]
    out = kwargs.get("out")
    if isinstance(out, tuple):
        out = out[0]
    with np.errstate(all="warn"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fs.trace(ufunc.__name__, x=x, w=w, b=b, eps=eps, **kwargs)
            y = ufunc(*operands, eps, **kwargs)
        except (TypeError, ValueError) as exc:
            if valid:
                raise AssertionError(f"a valid gufunc call raised {type(exc).__name__}: "
                                     f"{exc}") from exc
            for n, s in snaps.items():
                fs.assert_unchanged(s, n)
            return "raised"
    for n, s in snaps.items():
        fs.assert_unchanged(s, n, out)
    if out is not None:
        assert y is out
    assert isinstance(y, np.ndarray)

    # Which loop ran: NumPy's own type resolution for these operands.
    eps_dt = np.asarray(eps).dtype if isinstance(eps, np.ndarray) else type(eps)
    nops = len(operands)
    try:
        extra = {}
        if "dtype" in kwargs:
            extra["signature"] = (None,) * (nops + 1) + (kwargs["dtype"],)
        loop = fs.resolve_loop(
            ufunc, tuple(a.dtype for a in before) + (eps_dt, None if out is None else out.dtype),
            casting=kwargs.get("casting", "same_kind"), **extra)[0]
    except Exception:
        loop = y.dtype if out is None else None
    if loop is not None and (fs.is_bf16(loop) or fs.is_bf16(y.dtype)):
        return check_ufunc_bf16_twin(ufunc, y, loop, before, eps, kwargs)
    if loop is None or loop.kind != "f" or y.dtype.kind != "f":
        return "ok-unverified"
    loop = loop.newbyteorder("=")
    ax = kwargs.get("axis")
    with np.errstate(all="ignore"):
        ops = [a.astype(loop) for a in before]
    if ax is not None:
        ops = [np.moveaxis(a, ax, -1) for a in ops]
        ym = np.moveaxis(y, ax, -1)
    else:
        ym = y
    n = ops[0].shape[-1]
    epsa = np.asarray(eps, dtype=np.float64)
    lead = np.broadcast_shapes(*(a.shape[:-1] for a in ops), epsa.shape)
    if out is not None:
        # NumPy broadcasts the inputs to an out= with more leading dims.
        assert np.broadcast_shapes(lead, ym.shape[:-1]) == ym.shape[:-1], (ym.shape, lead)
        lead = ym.shape[:-1]
    assert ym.shape == lead + (n,), (ym.shape, lead, n)
    rows = math.prod(lead)
    X, W = (np.broadcast_to(a, lead + (n,)).reshape(rows, n).astype(np.float64)
            for a in ops[:2])
    E = np.broadcast_to(epsa, lead).reshape(rows)
    bad_eps = ~((E >= 0) & np.isfinite(E))
    if bad_eps.any() and n > 0:
        assert any(issubclass(c.category, RuntimeWarning) for c in caught), \
            "invalid eps without a RuntimeWarning"
    if rows == 0 or n == 0:
        return "ok-empty"
    Y = np.asarray(ym, dtype=np.float64).reshape(rows, n)
    assert np.isnan(Y[bad_eps]).all(), "a record with an invalid eps is not all NaN"
    Ev = np.where(bad_eps, 0.0, E)
    if op == "rms_norm":
        # Records of one scale row each: the scale broadcast per record.
        for r in range(rows):
            if not bad_eps[r]:
                check_rms_rows(Y[r:r + 1], X[r:r + 1], W[r], Ev[r:r + 1], loop, y.dtype,
                               f"rms_norm_ufunc y (record {r})")
        return "ok-invalid-eps" if bad_eps.any() else "ok"
    B = np.broadcast_to(ops[2], lead + (n,)).reshape(rows, n).astype(np.float64)
    ref = lnc.reference_layer_norm(X, eps=0.0)  # statistics do not depend on eps
    rmean, rvar = np.array(ref.mean, dtype=np.float64), np.array(ref.var, dtype=np.float64)
    with np.errstate(all="ignore"):
        ref_y = (X - rmean[:, None]) / np.sqrt(rvar + Ev)[:, None] * W + B
        if loop == F64:
            fs.rescue_reference(X, W, B, Ev, rmean, rvar, ref_y)
        ref_y[bad_eps] = np.nan
    bound = fs.error_bound(X, W, B, Ev, rmean, rvar, loop, y.dtype, ref_y)
    fs.assert_y_close(Y, bound, "layer_norm_ufunc y")
    return "ok-invalid-eps" if bad_eps.any() else "ok"


def check_ufunc_bf16_twin(ufunc, y, loop, before, eps, kwargs) -> str:
    """A bfloat16 loop (or a bfloat16 out=): the same call on the operands
    widened to float32 gives, rounded once to bfloat16 (and cast to the
    out= dtype as NumPy casts the loop's output), the same bits."""
    wide = [widen(a) for a in before]
    kw = {k: v for k, v in kwargs.items() if k != "out"}
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        twin = ufunc(*wide, eps, **kw)
        want = twin.astype(loop) if fs.is_bf16(loop) else twin
        want = want.astype(y.dtype)
    if kwargs.get("axis") is not None:  # y has the out= array's leading dimensions
        ax = kwargs["axis"]
        want = np.moveaxis(np.broadcast_to(np.moveaxis(want, ax, -1),
                                           np.moveaxis(y, ax, -1).shape), -1, ax)
    else:
        want = np.broadcast_to(want, y.shape)
    assert fs.same_bits(y, want), \
        f"{ufunc.__name__}: the bfloat16 loop is not the float32 one rounded once"
    return "ok-bf16"


@FUZZ_SETTINGS
@given(case=ufunc_calls())
def test_fuzz_layer_norm_ufunc(case):
    COUNTS["ufunc:" + check_ufunc(case)] += 1


@FUZZ_SETTINGS
@given(case=rms_ufunc_calls())
def test_fuzz_rms_norm_ufunc(case):
    COUNTS["rms_ufunc:" + check_ufunc(case)] += 1


# ================================================================ fixed cases

_LOOP_OPERANDS = [F16, F32, F64, np.dtype(np.int8), np.dtype(bool),
                  np.dtype(">f4")]


@pytest.mark.parametrize("casting", ["no", "equiv", "safe", "same_kind", "unsafe"])
def test_loop_search_predicts_numpys_loop(casting):
    """fs.resolve_loop on NumPy < 1.24 (no ufunc.resolve_dtypes) searches the
    loops itself; the fuzz oracle relies on it picking NumPy's loop. It must
    agree with resolve_dtypes where that exists, and on every NumPy predict
    whether a call works and its result dtype."""
    ufunc = lnc.layer_norm_ufunc
    for dx, dw, db in itertools.product(_LOOP_OPERANDS, [F16, F64, np.dtype(np.int8)],
                                        [F32, np.dtype(bool)]):
        for eps, dtype, dout in itertools.product([1e-5, np.float16(1e-3)], [None, F16, F64],
                                                  [None, F16, F64]):
            eps_dt = type(eps) if isinstance(eps, float) else eps.dtype
            dtypes = (dx, dw, db, eps_dt, dout)
            signature = None if dtype is None else (None,) * 4 + (dtype,)
            try:
                want = fs.legacy_resolve_loop(ufunc, dtypes, casting, signature)
            except TypeError:
                want = None
            if hasattr(ufunc, "resolve_dtypes"):
                try:
                    numpys = fs.resolve_loop(ufunc, dtypes, casting, signature)
                except TypeError:
                    numpys = None
                assert want == numpys, (dtypes, casting, signature)
            kwargs = {"casting": casting}
            if dtype is not None:
                kwargs["dtype"] = dtype
            if dout is not None:
                kwargs["out"] = np.empty((2, 3), dout)
            try:
                y = ufunc(np.ones((2, 3), dx), np.ones(3, dw), np.ones(3, db), eps, **kwargs)
            except TypeError:
                y = None
            assert (y is None) == (want is None), (dtypes, casting, signature)
            if y is not None and dout is None:
                assert y.dtype == want[-1], (dtypes, casting, signature)


def test_ufunc_invalid_eps_raises_under_errstate():
    """The raw gufunc's invalid-eps signal becomes an error under np.errstate."""
    x = np.ones((2, 3))
    with np.errstate(invalid="raise"):
        with pytest.raises(FloatingPointError):
            lnc.layer_norm_ufunc(x, np.ones(3), np.zeros(3), -1.0)


@pytest.mark.parametrize("isa", lnc.supported_isas())
@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=str)
def test_every_layout_against_reference(isa, dt):
    """Every layout (cases.LAYOUTS), each ISA: a fixed, readable sweep."""
    rng = np.random.default_rng(5)
    old = lnc.get_isa()
    try:
        lnc.set_isa(isa)
        for d in (1, 7, LANES - 1, LANES + 1, 100, 300, 2000):
            base = rng.standard_normal((3, d)).astype(dt)
            for layout in LAYOUTS:
                x = with_layout(base, layout, rng)
                for w, b in ((None, None), (rng.standard_normal(d).astype(dt), None),
                             (None, rng.standard_normal(d).astype(dt))):
                    case = dict(x=x, weight=w, bias=b, eps=DEFAULT, axis=DEFAULT, out=None,
                                return_stats=True)
                    assert check_layer_norm(case) == "ok"
    finally:
        lnc.set_isa(old)


@pytest.mark.parametrize("d", [1 << 20, (1 << 20) + 17])
def test_very_large_d_broadcast(d):
    """A very long record from a zero-stride (broadcast) input and params."""
    pattern = np.arange(64, dtype=np.float32) - 31.5
    x = np.broadcast_to(np.tile(pattern, d // 64 + 1)[:d], (2, d))
    w = np.broadcast_to(np.float32(0.5), (d,))
    case = dict(x=x, weight=w, bias=None, eps=DEFAULT, axis=DEFAULT, out=None,
                return_stats=True)
    assert check_layer_norm(case) == "ok"


# ================================================================ regressions

def test_eps_too_large_for_a_float_is_valueerror():
    """An eps that float() cannot hold (10**400) is a ValueError, never an
    OverflowError (found by this fuzzer)."""
    for eps in (10**400, -(10**400)):
        with pytest.raises(ValueError):
            lnc.layer_norm(np.array([1.0, 2.0]), eps=eps)


@pytest.mark.parametrize("dt", FLOAT_DTYPES + ((fs.BF16,) if fs.BF16 is not None else ()),
                         ids=str)
@pytest.mark.parametrize("axis", [-1, 1, (1,)])
def test_rms_norm_python_scalar_weight_is_weak(dt, axis):
    """A Python scalar weight never widens rms_norm's result, as for
    layer_norm: float16 x with weight=2.0 is float16, the same bits as with
    the weight as an array of x's dtype (found by this fuzzer: the result
    was float64)."""
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(dt)
    for weight in (2.0, 3, True):
        y = lnc.rms_norm(x, weight, axis=axis)
        want = lnc.rms_norm(x, np.full(5, weight, dt), axis=axis)
        assert y.dtype == dt, (weight, y.dtype)
        assert fs.same_bits(y, want), weight


@pytest.mark.parametrize("dt", FLOAT_DTYPES + ((fs.BF16,) if fs.BF16 is not None else ()),
                         ids=str)
@pytest.mark.parametrize("op", ["layer_norm_backward", "rms_norm_backward"])
def test_backward_python_scalar_weight_is_weak(dt, op):
    """The same for the backward passes: a Python scalar weight gives the
    bits of the weight as an array of the records' dtype, dweight included
    (it was computed in float64, and dweight's bits changed)."""
    rng = np.random.default_rng(1)
    x, dy = (rng.standard_normal((4, 37)).astype(dt) for _ in range(2))
    fn = getattr(lnc, op)
    for weight in (2.0, 3, True):
        got, want = fn(dy, x, weight), fn(dy, x, np.full(37, weight, dt))
        for name, a, b in zip(got._fields, got, want):
            assert fs.same_bits(a, b), (weight, name)


@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=str)
def test_out_of_every_wrong_kind_on_the_fast_path(dt):
    """x eligible for the C fast path, out= wrong in every way: a clean
    TypeError/ValueError (or a correct in-place result), never a crash.
    (A 0-d out= once made the fast path read the dimensions of a 0-d array:
    a segfault.)"""
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(dt)
    other = np.float32 if dt != np.float32 else np.float64
    buf = np.zeros(40, dt)
    wrong = [np.zeros((), dt), np.zeros(5, dt), np.zeros((1, 3, 5), dt), np.zeros((5, 3), dt),
             np.zeros((3, 5), other), np.zeros((3, 5), np.int16), np.zeros((3, 5), complex),
             np.zeros((3, 5), object), np.zeros((3, 5), "V8"), np.zeros((3, 10), dt)[:, ::2],
             np.broadcast_to(np.zeros((), dt), (3, 5)), buf[1:16].reshape(3, 5),
             np.zeros((3, 5), np.dtype(dt).newbyteorder()), [[0.0] * 5] * 3, 0.0]
    for out in wrong:
        case = dict(x=x, weight=None, bias=None, eps=DEFAULT, axis=DEFAULT, out=out,
                    return_stats=False)
        assert check_layer_norm(case) in ("ok", "raised"), type(out)


# ================================================================ numerical edges

def test_f32_tiny_spread_with_eps_zero():
    """float32 records with a spread near 1e-39 and eps=0: 1/sqrt(var) is
    beyond the float range, the result must still be about +-1 (found by
    the fuzz oracle, fixed)."""
    for x in (np.array([0.0, 1e-39], np.float32), np.array([0.0, 1.4e-45], np.float32)):
        np.testing.assert_allclose(lnc.layer_norm(x, eps=0.0), [-1.0, 1.0], rtol=1e-5)


def test_f32_values_spanning_more_than_flt_max():
    """float32 values of both signs near FLT_MAX: x - mean exceeds the
    float range, the result must still be finite and right (found by the
    fuzz oracle, fixed)."""
    x = np.array([3.0e38, -3.0e38, -3.0e38], np.float32)
    np.testing.assert_allclose(lnc.layer_norm(x), lnc.reference_layer_norm(x).y, rtol=1e-5)


# Found by fuzz/fuzz_kernels.c: NaN + NaN returns either operand, so with
# two NaN payloads in a record the NaN written used to depend on the ISA.
# NaN records are now written as the canonical quiet NaN.
def test_nan_bits_identical_across_isas():
    """The reproducibility contract, down to the NaN bits: a record holding
    NaNs of different payloads and signs comes out the same on every ISA."""
    x64 = np.zeros(15)
    x64.view(np.uint64)[[0, 4]] = [0x7FF8000000000001, 0xFFF8000000000002]
    x32 = np.zeros(15, np.float32)
    x32.view(np.uint32)[[0, 4]] = [0x7FC00001, 0xFFC00002]
    old = lnc.get_isa()
    try:
        for x in (x64, x32):
            got = {}
            for isa in lnc.supported_isas():
                lnc.set_isa(isa)
                got[isa] = lnc.layer_norm(x).tobytes()
            assert len(set(got.values())) == 1, {k: v.hex()[:32] for k, v in got.items()}
    finally:
        lnc.set_isa(old)


# ================================================================ the backward

def _backward_reference(dy, x, w, eps, axes):
    """The textbook backward in float64 (test_backward.py's oracle)."""
    x = x.astype(np.float64)
    dy = dy.astype(np.float64)
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    r = 1.0 / np.sqrt(var + eps)
    xh = (x - mu) * r
    if w is not None:
        w = w.reshape([x.shape[i] if i in axes else 1 for i in range(x.ndim)])
    g = dy if w is None else dy * w
    dx = r * (g - g.mean(axis=axes, keepdims=True) - xh * (g * xh).mean(axis=axes, keepdims=True))
    lead = tuple(i for i in range(x.ndim) if i not in axes)
    return dx, (dy * xh).sum(axis=lead), dy.sum(axis=lead)


@st.composite
def backward_calls(draw):
    """A layer_norm_backward call, valid or wrong in one way."""
    fault = draw(st.sampled_from(("none",) * 6 + ("dy_shape", "dy_dtype", "weight", "mean",
                                                  "eps", "axis")))
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 2 * LANES + 3), min_size=ndim, max_size=ndim)))
    dt = np.dtype(draw(st.sampled_from(FLOAT_DTYPES)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    offset = draw(st.sampled_from([0.0, 3.0, 300.0 if dt != F16 else 30.0]))
    x = (offset + rng.standard_normal(shape)).astype(dt)
    dy = rng.standard_normal(shape).astype(draw(st.sampled_from(FLOAT_DTYPES)))
    x = with_layout(x, draw(st.sampled_from(sorted(LAYOUTS))), rng)
    dy = with_layout(dy, draw(st.sampled_from(sorted(LAYOUTS))), rng)
    axis = draw(st.integers(-ndim, ndim - 1)) if fault != "axis" else ndim + 1
    ax = (axis % ndim,) if fault != "axis" else (0,)
    norm = tuple(shape[a] for a in ax)
    w = None
    if draw(st.booleans()) or fault == "weight":
        wshape = norm if fault != "weight" else tuple(n + 1 for n in norm)
        w = rng.uniform(0.5, 2, wshape).astype(draw(st.sampled_from(FLOAT_DTYPES)))
    if fault == "dy_shape":
        dy = np.zeros(shape + (2,), dy.dtype)
    if fault == "dy_dtype":
        dy = dy.astype(complex)
    eps = draw(st.sampled_from([1e-5, 0.1])) if fault != "eps" else draw(
        st.sampled_from([-1.0, float("nan"), "1e-5"]))
    mean = None
    if fault == "mean":
        mean = np.zeros(tuple(n + 1 for n in shape))
    elif draw(st.booleans()) and fault in ("none", "dy_dtype", "eps"):
        mean = lnc.layer_norm(x, w, axis=axis, return_stats=True).mean
    return dict(dy=dy, x=x, w=w, eps=eps, axis=axis, mean=mean, fault=fault, axes=ax)


@FUZZ_SETTINGS
@given(case=backward_calls())
def test_fuzz_layer_norm_backward(case):
    dy, x, w, eps, axis, mean = (case[k] for k in ("dy", "x", "w", "eps", "axis", "mean"))
    snaps = {n: fs.snapshot(a) for n, a in (("dy", dy), ("x", x), ("w", w))}
    try:
        g = lnc.layer_norm_backward(dy, x, w, eps, axis=axis, mean=mean)
    except (TypeError, ValueError) as exc:
        assert case["fault"] != "none", f"a valid call raised {type(exc).__name__}: {exc}"
        assert str(exc).split(":")[0] in ("dy", "x", "weight", "mean", "eps", "axis"), str(exc)
        COUNTS["backward:raised"] += 1
        return
    assert case["fault"] == "none", "an invalid call returned"
    for n, s in snaps.items():
        fs.assert_unchanged(s, n)
    axes = case["axes"]
    dx, dw, db = _backward_reference(dy, x, None if w is None else w.astype(np.float64),
                                     float(eps), axes)
    rdt = np.result_type(x.dtype, dy.dtype, *(() if w is None else (w.dtype,)))
    assert g.dx.dtype == rdt and g.dx.shape == x.shape
    t = {F16: 8e-3, F32: 4e-5, F64: 1e-10}[np.dtype(rdt)]
    scale = 1.0 + np.abs(dx).max()
    assert np.abs(g.dx.astype(np.float64) - dx).max() <= t * scale * 8, "dx"
    assert np.abs(g.dweight - dw).max() <= t * (1 + np.abs(dw).max()) * 8, "dweight"
    assert np.abs(g.dbias - db).max() <= 1e-6 * (1 + np.abs(db).max()), "dbias"
    # the same call without (or with) the forward's mean: the same bits,
    # when the forward computed in the backward's dtype (dy of y's dtype)
    fwd = lnc.layer_norm(x, w, axis=axis, return_stats=True)
    if np.result_type(fwd.y.dtype, dy.dtype) == fwd.y.dtype:
        other = lnc.layer_norm_backward(dy, x, w, eps, axis=axis,
                                        mean=None if mean is not None else fwd.mean)
        for name, a, b in zip(g._fields, g, other):
            assert np.array_equal(a.view(f"u{a.dtype.itemsize}"),
                                  b.view(f"u{b.dtype.itemsize}")), name
    COUNTS["backward:ok"] += 1


# ================================================================ RMSNorm's backward

#: The dtypes of the backward and layer fuzz: float16/32/64, and bfloat16
#: when ml_dtypes is installed.
KERNEL_DTYPES = FLOAT_DTYPES + ((fs.BF16,) if fs.BF16 is not None else ())
#: The backward fuzz's tolerance per result dtype (relative to the largest
#: gradient), as for layer_norm_backward.
GRAD_TOL = {F16: 8e-3, F32: 4e-5, F64: 1e-10}


@st.composite
def rms_backward_calls(draw):
    """An rms_norm_backward call, valid or wrong in one way."""
    fault = draw(st.sampled_from(("none",) * 6 + ("dy_shape", "dy_dtype", "weight", "ms",
                                                  "eps", "axis", "convention")))
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 2 * LANES + 3), min_size=ndim, max_size=ndim)))
    dt = np.dtype(draw(st.sampled_from(KERNEL_DTYPES)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    offset = draw(st.sampled_from([0.0, 3.0, 300.0 if dt != F16 else 30.0]))
    x = (offset + rng.standard_normal(shape)).astype(dt)
    dy = rng.standard_normal(shape).astype(draw(st.sampled_from(KERNEL_DTYPES)))
    x = with_layout(x, draw(st.sampled_from(sorted(LAYOUTS))), rng)
    dy = with_layout(dy, draw(st.sampled_from(sorted(LAYOUTS))), rng)
    axis = draw(st.integers(-ndim, ndim - 1)) if fault != "axis" else ndim + 1
    ax = (axis % ndim,) if fault != "axis" else (0,)
    norm = tuple(shape[a] for a in ax)
    w = None
    if draw(st.booleans()) or fault == "weight":
        wshape = norm if fault != "weight" else tuple(n + 1 for n in norm)
        w = rng.uniform(-2, 2, wshape).astype(draw(st.sampled_from(KERNEL_DTYPES)))
    if fault == "dy_shape":
        dy = np.zeros(shape + (2,), dy.dtype)
    if fault == "dy_dtype":
        dy = dy.astype(complex)
    eps = draw(st.sampled_from([1e-6, 0.1])) if fault != "eps" else draw(
        st.sampled_from([-1.0, float("nan"), "1e-5"]))
    conv = draw(st.sampled_from(["weight", "1+weight"])) if fault != "convention" else \
        draw(st.sampled_from(BAD_CONVENTIONS))
    ms = None
    if fault == "ms":
        ms = np.zeros(tuple(n + 1 for n in shape))
    elif draw(st.booleans()) and fault in ("none", "dy_dtype", "eps", "convention"):
        ms = lnc.rms_norm(x, w, axis=axis, return_stats=True).ms
    return dict(dy=dy, x=x, w=w, eps=eps, axis=axis, ms=ms, convention=conv, fault=fault,
                axes=ax)


def _rms_grads_close(g, dy, x, w, eps, axis, conv, rdt) -> None:
    """dx and dweight against reference_rms_norm_backward."""
    ref = lnc.reference_rms_norm_backward(dy.astype(np.float64), x.astype(np.float64),
                                          None if w is None else w.astype(np.float64),
                                          float(eps), axis, conv)
    t = GRAD_TOL[np.dtype(rdt)]
    err = np.abs(g.dx.astype(np.float64) - ref.dx).max()
    assert err <= t * (1.0 + np.abs(ref.dx).max()) * 8, f"dx off by {err}"
    err = np.abs(g.dweight - ref.dweight).max()
    assert err <= t * (1.0 + np.abs(ref.dweight).max()) * 8, f"dweight off by {err}"


@FUZZ_SETTINGS
@given(case=rms_backward_calls())
def test_fuzz_rms_norm_backward(case):
    dy, x, w, eps, axis, ms, conv = (case[k] for k in ("dy", "x", "w", "eps", "axis", "ms",
                                                         "convention"))
    snaps = {n: fs.snapshot(a) for n, a in (("dy", dy), ("x", x), ("w", w), ("ms", ms))}
    try:
        fs.trace("rms_norm_backward", dy=dy, x=x, weight=w, eps=eps, axis=axis, ms=ms,
                 convention=conv)
        g = lnc.rms_norm_backward(dy, x, w, eps, axis=axis, ms=ms, convention=conv)
    except (TypeError, ValueError) as exc:
        assert case["fault"] != "none", f"a valid call raised {type(exc).__name__}: {exc}"
        assert str(exc).split(":")[0] in ("dy", "x", "weight", "ms", "eps", "axis",
                                          "convention"), str(exc)
        COUNTS["rms_backward:raised"] += 1
        return
    assert case["fault"] == "none", "an invalid call returned"
    for n, s in snaps.items():
        fs.assert_unchanged(s, n)
    assert isinstance(g, lnc.RMSNormGrads) and len(g) == 2
    rdt = fs.compute_dtype(x.dtype, dy.dtype, *(() if w is None else (w.dtype,)))
    assert g.dx.dtype == rdt and g.dx.shape == x.shape, (g.dx.dtype, rdt)
    norm = tuple(x.shape[a] for a in case["axes"])
    gdt = F64 if rdt == F64 else F32
    assert g.dweight.dtype == gdt and g.dweight.shape == norm, (g.dweight.dtype, gdt)
    if bf16_in(dy, x, w):
        # bfloat16: the float32 computation of the same values, rounded once
        twin = lnc.rms_norm_backward(widen(dy), widen(x), widen(w), eps, axis=axis,
                                     convention=conv)
        _rms_grads_close(twin, dy, x, w, eps, axis, conv, twin.dx.dtype)
        assert fs.same_bits(g.dx, twin.dx.astype(rdt)), "bfloat16 dx"
        assert fs.same_bits(g.dweight, twin.dweight), "bfloat16 dweight"
        COUNTS["rms_backward:ok-bf16"] += 1
    else:
        _rms_grads_close(g, dy, x, w, eps, axis, conv, rdt)
        COUNTS["rms_backward:ok"] += 1
    # ms is only checked, never used: the same bits with or without it
    other = lnc.rms_norm_backward(dy, x, w, eps, axis=axis, convention=conv,
                                  ms=None if ms is not None else
                                  lnc.rms_norm(x, w, eps, axis=axis, return_stats=True).ms)
    for name, a, b in zip(g._fields, g, other):
        assert fs.same_bits(a, b), f"{name} depends on ms="
    # the raw gufunc, for the LLaMA convention: dx, bit for bit
    if conv == "weight":
        a = case["axes"][0]
        scale = np.ones(x.shape[a], rdt) if w is None else w
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dx = lnc.rms_norm_backward_ufunc(np.moveaxis(dy, a, -1), np.moveaxis(x, a, -1),
                                             scale, eps)
        if dx.dtype == rdt:
            assert fs.same_bits(np.moveaxis(dx, -1, a), g.dx), "rms_norm_backward_ufunc dx"


# ================================================================ the RMSNorm layer

def _grad_tol(dt) -> float:
    return fs.BF16_UNIT if fs.is_bf16(dt) else GRAD_TOL[np.dtype(dt)]


@st.composite
def rms_layer_cases(draw):
    """An RMSNorm layer (any dtype, convention, gain), an input of any
    float dtype and layout, a gradient, a split into two micro-batches,
    and, sometimes, one misuse."""
    k = draw(st.integers(1, 2))
    norm = tuple(draw(st.lists(st.integers(1, 2 * LANES + 3), min_size=k, max_size=k)))
    lead = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=2)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    layer_dt, x_dt, dy_dt = (np.dtype(draw(st.sampled_from(KERNEL_DTYPES))) for _ in range(3))
    scale = draw(st.sampled_from([1.0, 1e-3, 100.0]))
    x = with_layout((scale * rng.standard_normal(lead + norm)).astype(x_dt),
                    draw(st.sampled_from(sorted(LAYOUTS))), rng)
    dy = with_layout(rng.standard_normal(lead + norm).astype(dy_dt),
                     draw(st.sampled_from(sorted(LAYOUTS))), rng)
    return dict(norm=norm, x=x, dy=dy, dtype=layer_dt, weight=rng.uniform(-2, 2, norm),
                gain=draw(st.booleans()),
                convention=draw(st.sampled_from(["weight", "1+weight"])),
                eps=draw(st.sampled_from([0.0, 1e-6, 1e-5, 0.1])),
                split=draw(st.integers(0, lead[0])),
                fault=draw(st.sampled_from(("none",) * 6 + ("x_shape", "dy_shape",
                                                             "no_forward"))))


@FUZZ_SETTINGS
@given(case=rms_layer_cases())
def test_fuzz_rms_layer(case):
    """The layer is rms_norm and rms_norm_backward with its weight, bit for
    bit; its gradient is the same bits however the batch is split; it keeps
    copies (changing x after the forward changes nothing); misuse raises."""
    norm, x, dy, conv, eps = (case[k] for k in ("norm", "x", "dy", "convention", "eps"))
    layer = lnc.RMSNorm(norm, eps, gain=case["gain"], dtype=case["dtype"], convention=conv)
    if layer.weight is not None:
        layer.weight[...] = case["weight"]
    fault = case["fault"]
    if fault == "no_forward":
        with pytest.raises(RuntimeError, match="^backward: call the layer"):
            layer.backward(dy)
        COUNTS["rms_layer:raised"] += 1
        return
    if fault == "x_shape":
        with pytest.raises(ValueError, match=r"^x: expected trailing axes"):
            layer(x[..., :-1] if x.shape[-1] > 1 else np.zeros(x.shape + (2,), x.dtype))
        COUNTS["rms_layer:raised"] += 1
        return
    snaps = {n: fs.snapshot(a) for n, a in (("x", x), ("dy", dy))}
    xc = x.copy()
    y = layer(xc)
    xc[...] = 0  # the layer kept its own copy
    axis = layer.axis
    assert fs.same_bits(y, lnc.rms_norm(x, layer.weight, eps, axis=axis, convention=conv)), "y"
    if fault == "dy_shape":
        with pytest.raises(ValueError, match=r"^dy: expected shape"):
            layer.backward(np.zeros(x.shape[:-1] + (x.shape[-1] + 1,), dy.dtype))
        COUNTS["rms_layer:raised"] += 1
        return
    dx = layer.backward(dy)
    want = lnc.rms_norm_backward(dy, x, layer.weight, eps, axis=axis, convention=conv)
    assert fs.same_bits(dx, want.dx), "dx"
    for n, s in snaps.items():
        fs.assert_unchanged(s, n)
    if layer.weight is None:
        assert layer.grad_weight is None
        COUNTS["rms_layer:ok"] += 1
        return
    assert layer.grad_weight.dtype == layer.dtype and layer.grad_weight.shape == norm
    # the whole batch's gradient against the float64 reference
    ref = lnc.reference_rms_norm_backward(dy.astype(np.float64), x.astype(np.float64),
                                          layer.weight.astype(np.float64), eps, axis, conv)
    # (computed in the promoted dtype, rounded once to the layer's)
    t = max(_grad_tol(fs.compute_dtype(x.dtype, dy.dtype, layer.dtype)), _grad_tol(layer.dtype))
    err = np.abs(layer.grad_weight.astype(np.float64) - ref.dweight).max()
    assert err <= t * (1 + np.abs(ref.dweight).max()) * 8, f"grad_weight off by {err}"
    # two micro-batches (one may be empty of records): the same bits
    parts = lnc.RMSNorm(norm, eps, gain=True, dtype=case["dtype"], convention=conv)
    parts.weight[...] = layer.weight
    k = case["split"]
    for sl in (slice(0, k), slice(k, None)):
        if x[sl].shape[0] == 0:
            continue
        parts(x[sl])
        parts.backward(dy[sl])
    assert fs.same_bits(parts.grad_weight, layer.grad_weight), "grad_weight depends on the split"
    COUNTS["rms_layer:ok"] += 1
