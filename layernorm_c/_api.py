"""The public LayerNorm function: validation, dtype rules, axis handling.

All numerics run in the C gufuncs of :mod:`layernorm_c._core`; this module
only checks arguments, picks the computation dtype and arranges views.
"""
from __future__ import annotations

import functools
import math
import numbers
from typing import (Any, Callable, Literal, NamedTuple, Optional, Sequence, Tuple, TypeVar, Union,
                    cast, overload)

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import _bf16, _core

__all__ = ["layer_norm", "LayerNormResult", "layer_norm_ufunc"]

#: The raw generalized ufunc ``(n),(n),(n),()->(n)``: ``x, weight, bias, eps -> y``.
layer_norm_ufunc: np.ufunc = _core.layer_norm

#: What ``eps`` accepts: a Python or NumPy real number.
EpsLike = Union[float, "np.floating[Any]"]
#: An axis or a tuple of axes.
AxisLike = Union[int, Sequence[int]]

_AxisError = getattr(getattr(np, "exceptions", np), "AxisError")

# Private gufuncs that also return per-record mean and variance, one per
# parameter convention: (has weight, has bias) -> ufunc.
_STATS_UFUNCS = {
    (True, True): _core._ln_wb,
    (True, False): _core._ln_w,
    (False, True): _core._ln_b,
    (False, False): _core._ln_none,
}

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)


_F64 = np.dtype(np.float64)


def _is_bf16(dt: np.dtype[Any]) -> bool:
    return _bf16.BFLOAT16 is not None and dt == _bf16.BFLOAT16


def _is_float_dtype(dt: np.dtype[Any]) -> bool:
    """A dtype the kernels compute (float16, bfloat16, float32, float64)."""
    return (dt.kind == "f" and dt.itemsize <= 8) or _is_bf16(dt)


def _compute_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The type a result dtype is computed in, which is also its statistics'
    and its parameter gradients' dtype: float32 for float16, bfloat16 and
    float32 results, float64 for float64."""
    return _F64 if dtype == _F64 else _F32


_EXPECTED = ("a real array: float16, float32 or float64 (or ml_dtypes.bfloat16; "
             "integer and bool arrays are computed in float64)")


class LayerNormResult(NamedTuple):
    """What ``layer_norm(..., return_stats=True)`` returns."""

    y: NDArray[Any]
    """The normalized output, shaped like ``x``."""
    mean: NDArray[Any]
    """Per-record mean, shaped like ``x`` without the normalized axes."""
    var: NDArray[Any]
    """Per-record population variance (divided by d, without eps)."""


def _short_repr(value: object, limit: int = 40) -> str:
    """``repr(value)``, cut to about ``limit`` characters for huge values."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit // 2]}...{text[-8:]} ({len(text)} characters)"


def _as_real_array(a: object, name: str) -> NDArray[Any]:
    """``np.asarray(a)`` with integer/bool widened to float64; other
    non-float dtypes (complex, object, strings, datetimes...) rejected.

    Masked arrays are refused: their mask would be dropped silently and the
    masked values would still feed the statistics."""
    if a is None:
        raise TypeError(f"{name}: expected array_like, got None")
    if isinstance(a, np.ma.MaskedArray):
        raise TypeError(
            f"{name}: masked arrays are not supported (the mask would be ignored and "
            f"the masked values would still enter the statistics); pass "
            f"np.ma.filled({name}, fill_value) to choose the values of the masked "
            f"entries, or {name}.data to normalize the raw values")
    try:
        arr = np.asarray(a)
    except (TypeError, ValueError) as exc:
        error = ValueError if isinstance(exc, ValueError) else TypeError
        hint = ""
        if "Tracer" in type(exc).__name__:
            hint = ("; layernorm_c computes on NumPy arrays, so call it outside "
                    "jax.jit (or through jax.pure_callback)")
        raise error(f"{name}: expected array_like, got {type(a).__name__} that could not "
                   f"be converted to a NumPy array ({type(exc).__name__}: {exc}){hint}"
                   ) from exc
    kind = arr.dtype.kind
    if kind in "biu":
        return arr.astype(np.float64)
    if _is_float_dtype(arr.dtype):
        return arr
    raise TypeError(f"{name}: expected {_EXPECTED}, got dtype {arr.dtype}")


def _normalize_axes(axis: object, ndim: int) -> Tuple[int, ...]:
    """Sorted, non-negative, unique axes; AxisError (a ValueError) if bad."""
    if isinstance(axis, (bool, np.bool_)):
        raise TypeError(f"axis: expected an int or a tuple of ints, got {axis!r}")
    axes: Tuple[int, ...]
    if isinstance(axis, (numbers.Integral,)):
        axes = (int(axis),)
    elif isinstance(axis, (tuple, list)) and all(
        isinstance(a, numbers.Integral) and not isinstance(a, (bool, np.bool_))
        for a in axis
    ):
        axes = tuple(int(a) for a in axis)
    else:
        raise TypeError(f"axis: expected an int or a tuple of ints, got {axis!r}")
    if not axes:
        raise ValueError("axis: expected at least one axis to normalize over, got ()")
    for a in axes:
        if not -ndim <= a < ndim:
            raise _AxisError(
                f"axis: {a} is out of bounds for x with {ndim} dimension(s) "
                f"(expected {-ndim} <= axis < {ndim})"
            )
    norm = tuple(sorted(a % ndim for a in axes))
    if len(set(norm)) != len(norm):
        raise ValueError(f"axis: repeated axis in {axis!r}")
    return norm


def _as_param(p: object, name: str, x_shape: Tuple[int, ...],
              axes: Tuple[int, ...]) -> Optional[NDArray[Any]]:
    """weight or bias as an array of the normalized shape, broadcast the way
    NumPy would broadcast it in ``g * xhat + b``: a scalar, ``(1, d)``, or a
    keepdims shape (1 on every axis that is not normalized) are accepted."""
    if p is None:
        return None
    arr = _as_real_array(p, name)
    norm_shape = tuple(x_shape[a] for a in axes)
    shape = arr.shape
    if len(shape) == len(x_shape) and len(shape) > len(norm_shape) and all(
            shape[i] == 1 for i in range(len(shape)) if i not in axes):
        # keepdims form, e.g. (d, 1) for x of shape (B, d, T) normalized over axis 1
        arr = arr.reshape(tuple(shape[a] for a in axes))
    else:
        extra = len(shape) - len(norm_shape)
        if extra > 0 and all(n == 1 for n in shape[:extra]):
            arr = arr.reshape(shape[extra:])  # leading 1s: (1, 1, d) for (B, T, d)
    try:
        if np.broadcast_shapes(arr.shape, norm_shape) == norm_shape:
            return np.broadcast_to(arr, norm_shape)
    except ValueError:
        pass
    raise ValueError(
        f"{name}: expected shape {norm_shape} (the normalized axes of x) or a shape "
        f"that broadcasts to it, got shape {shape}"
    )


def _check_eps(eps: object) -> float:
    if isinstance(eps, np.ndarray) and eps.ndim == 0:
        eps = eps[()]
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real):
        raise TypeError(
            f"eps: expected a real number, got {type(eps).__name__} {_short_repr(eps)}"
        )
    try:
        value = float(eps)
    except OverflowError:  # an int beyond the float range
        value = math.inf
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"eps: expected a finite number >= 0, got {_short_repr(eps)}")
    return value


def _check_flag(value: object, name: str) -> bool:
    """A bool argument: True/False or a NumPy bool, nothing merely truthy."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__} "
                        f"{_short_repr(value)}")
    return bool(value)


def _check_out(out: object, shape: Tuple[int, ...], dtype: np.dtype[Any]) -> NDArray[Any]:
    if isinstance(out, np.ma.MaskedArray):
        raise TypeError("out: expected a numpy.ndarray, got a masked array (its mask "
                        "would not be written)")
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out: expected a numpy.ndarray, got {type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"out: expected shape {shape} (the shape of x), got {out.shape}")
    if not (out.dtype == dtype if _is_bf16(dtype) or _is_bf16(out.dtype) else
            out.dtype.kind == "f" and out.dtype.itemsize == dtype.itemsize):
        raise TypeError(f"out: expected dtype {dtype} (the result dtype), got {out.dtype}")
    if not out.flags.writeable:
        raise ValueError("out: expected a writeable array, got a read-only one")
    return out


class _Plan(NamedTuple):
    """How a call maps onto the gufuncs: the checked input and its
    normalized axes."""

    x: NDArray[Any]
    axes: Tuple[int, ...]
    lead_shape: Tuple[int, ...]
    norm_shape: Tuple[int, ...]
    perm: Tuple[int, ...]


def _plan(x: object, axis: object) -> _Plan:
    """Validate x and axis."""
    xa = _as_real_array(x, "x")
    if xa.ndim == 0:
        raise ValueError(
            "x: expected an array with at least 1 dimension, got a 0-d array"
        )
    axes = _normalize_axes(axis, xa.ndim)
    norm_shape = tuple(xa.shape[a] for a in axes)
    if math.prod(norm_shape) == 0:
        raise ValueError(
            f"x: expected normalized axes of nonzero length, got shape "
            f"{xa.shape} normalized over axis {axis!r}"
        )
    lead = tuple(i for i in range(xa.ndim) if i not in axes)
    return _Plan(xa, axes, tuple(xa.shape[i] for i in lead), norm_shape, lead + axes)


def _result_dtype(x: NDArray[Any], params: Sequence[Tuple[object, Optional[NDArray[Any]]]]
                  ) -> np.dtype[Any]:
    """NumPy's promotion of x and the parameters, as ``g * xhat + b`` would
    give it: integer and bool arrays count as float64, and a Python scalar
    parameter is weak (it never widens the result)."""
    dts = [x.dtype] + [a.dtype for given, a in params
                       if a is not None and type(given) not in (bool, int, float)]
    if any(_is_bf16(dt) for dt in dts):
        # bfloat16 alone stays bfloat16; with a float dtype it promotes as
        # NumPy (ml_dtypes) promotes it, except that float16 and bfloat16
        # together give float32, as in PyTorch (NumPy has no common type).
        others = [dt for dt in dts if not _is_bf16(dt)]
        if not others:
            return dts[0] if _is_bf16(dts[0]) else np.dtype(_bf16.BFLOAT16)
        return np.dtype(np.result_type(_F32, *others).char)
    return np.dtype(np.result_type(*dts).char)


def _records_view(a: NDArray[Any], plan: _Plan) -> Tuple[NDArray[Any], bool]:
    """``a`` (shaped like x) with the normalized axes moved last and, if
    there are several, flattened into one: ``(view, True)`` when that is a
    view of ``a``, else ``(copy, False)``."""
    moved = a.transpose(plan.perm)
    if len(plan.axes) == 1:
        return moved, True
    flat = moved.reshape(plan.lead_shape + (math.prod(plan.norm_shape),))
    return flat, a.size == 0 or np.may_share_memory(flat, a)


def _copy_records_back(y: NDArray[Any], ym: NDArray[Any], plan: _Plan,
                       casting: Literal["same_kind", "unsafe"] = "same_kind") -> None:
    """The records ``ym`` (a copy :func:`_records_view` made) into ``y``.

    A helper of its own: the generator here, inlined in a public function,
    would make its local a closure cell, created on every call (120 ns of
    a 1 us call on the fast path)."""
    np.copyto(y.transpose(plan.perm), ym.reshape(tuple(y.shape[i] for i in plan.perm)),
              casting=casting)


_F = TypeVar("_F", bound=Callable[..., Any])


def _c_entry(result: type) -> Callable[[_F], _F]:
    """``impl`` behind its C entry point (``_core._entry``): the common
    call, the one ``_core._fast`` takes, runs in C with no Python frame in
    front of it (~110 ns of a (1, 768) call's ~600), returning ``result``
    (a named tuple) with the statistics; any other call, or one the fast
    path declines, reaches ``impl`` with its arguments as given. The entry
    carries ``impl``'s name, docstring and signature (``__wrapped__``)."""
    def entry(impl: _F) -> _F:
        c_entry = _core._entry(impl, impl.__name__, result)
        functools.update_wrapper(c_entry, impl)
        return cast(_F, c_entry)
    return entry


@overload
def layer_norm(x: ArrayLike, weight: Optional[ArrayLike] = ..., bias: Optional[ArrayLike] = ...,
               eps: EpsLike = ..., *, axis: AxisLike = ...,
               out: Optional[NDArray[Any]] = ...,
               return_stats: Literal[False] = ...) -> NDArray[Any]: ...
@overload
def layer_norm(x: ArrayLike, weight: Optional[ArrayLike] = ..., bias: Optional[ArrayLike] = ...,
               eps: EpsLike = ..., *, axis: AxisLike = ...,
               out: Optional[NDArray[Any]] = ...,
               return_stats: Literal[True]) -> LayerNormResult: ...
@overload
def layer_norm(x: ArrayLike, weight: Optional[ArrayLike] = ..., bias: Optional[ArrayLike] = ...,
               eps: EpsLike = ..., *, axis: AxisLike = ...,
               out: Optional[NDArray[Any]] = ...,
               return_stats: bool = ...) -> Union[NDArray[Any], LayerNormResult]: ...
@_c_entry(LayerNormResult)
def layer_norm(
    x: ArrayLike,
    weight: Optional[ArrayLike] = None,
    bias: Optional[ArrayLike] = None,
    eps: EpsLike = 1e-5,
    *,
    axis: AxisLike = -1,
    out: Optional[NDArray[Any]] = None,
    return_stats: bool = False,
) -> Union[NDArray[Any], LayerNormResult]:
    """Layer normalization of every record of ``x``.

    Each record (by default each 1-d slice along the last axis) is
    normalized by its own mean and population variance::

        y = (x - mean) / sqrt(var + eps) * weight + bias

    No statistic crosses records: a record's output is bit-for-bit the same
    alone or inside any batch, at any position, stride or memory order.

    Parameters
    ----------
    x : array_like
        Input with at least one dimension. float16, float32 and float64 are
        computed natively (float16 internally in float32; statistics are
        totalled in float64); integer and bool inputs are computed in
        float64. Masked arrays are refused (see Raises).
    weight : array_like, optional
        Gain, of the normalized axes' shape (``(d,)`` for one axis) or any
        shape NumPy broadcasts to it, as in a hand-written
        ``weight * xhat + bias``: a scalar, ``(1, d)``, or ``x``'s number of
        dimensions with 1 on every axis that is not normalized. ``None``
        means no gain (gain 1).
    bias : array_like, optional
        Bias, shaped like ``weight``. ``None`` means no bias.
    eps : float, optional
        Added to the variance inside the square root; must be finite and
        ``>= 0``. It is used in float64 whatever the input dtype.
        Default ``1e-5``.
    axis : int or tuple of ints, keyword-only, optional
        The axis to normalize over, default -1 (the last). A tuple
        normalizes over those axes jointly, like ``normalized_shape`` over
        trailing dimensions in PyTorch; weight and bias then have those
        axes' shape.
    out : ndarray, keyword-only, optional
        Array to write the result to: the shape of ``x`` and the result
        dtype. ``out=x`` normalizes in place. ``out`` may share memory with
        any input (``x``, ``weight``, ``bias``): the result is always the
        one computed from the inputs as they were before the call.
    return_stats : bool, keyword-only, optional
        Also return the per-record mean and variance.

    Returns
    -------
    y : ndarray
        The normalized array, shaped like ``x`` and in ``x``'s memory order
        (a Fortran-ordered ``x`` gives a Fortran-ordered ``y``, as
        ``np.empty_like`` does), of the dtype NumPy's promotion gives for
        ``x``, ``weight`` and ``bias`` (integer and bool arrays count as
        float64; a Python scalar parameter never widens the result).
        ``out`` itself if it was given.
    LayerNormResult
        If ``return_stats``: the named tuple ``(y, mean, var)``. ``mean`` and
        ``var`` are shaped like ``x`` without the normalized axes, in the
        computation dtype (float32 for float16 and float32 input). ``var`` is the
        population variance, without eps.

    Raises
    ------
    TypeError
        ``x`` is None or cannot be converted to an array; an unsupported
        dtype (complex, object, string, datetime, longdouble) for ``x``,
        ``weight``, ``bias`` or ``out``; a masked array (its mask would be
        ignored: pass ``np.ma.filled(x, value)`` or ``x.data``); a non-real
        ``eps``; a ``return_stats`` that is not a bool.
    ValueError
        0-d ``x``; a normalized axis of length 0; ``weight`` or ``bias`` of
        a shape that does not broadcast to the normalized axes; ``eps``
        negative, NaN or infinite; ``out`` of the wrong shape or read-only;
        an axis out of range (``AxisError``).

    See Also
    --------
    layer_norm_ufunc : the underlying generalized ufunc.
    reference_layer_norm : a plain NumPy float64 implementation.

    Examples
    --------
    >>> import numpy as np
    >>> import layernorm_c as lnc
    >>> lnc.layer_norm(np.array([1.0, 2.0, 3.0, 4.0]), eps=0.0)
    array([-1.34164079, -0.4472136 ,  0.4472136 ,  1.34164079])
    >>> r = lnc.layer_norm(np.array([[10.0, 12.0, 8.0, 14.0]]), return_stats=True)
    >>> r.mean, r.var
    (array([11.]), array([5.]))
    """
    # The common case (last axis, an ndarray the kernels read as is) never
    # gets here: the C entry point in front of this function (_c_entry)
    # computes it with no ufunc machinery. This is the general path.
    if _lazy.kind(x, weight, bias) is not None:  # dask or xarray: a lazy graph
        return _lazy.layer_norm(x, weight, bias, eps, axis, out, return_stats)  # type: ignore[no-any-return]

    plan = _plan(x, axis)
    xa = plan.x
    w = _as_param(weight, "weight", xa.shape, plan.axes)
    b = _as_param(bias, "bias", xa.shape, plan.axes)
    eps = _check_eps(eps)
    want_stats = _check_flag(return_stats, "return_stats")
    dtype = _result_dtype(xa, [(weight, w), (bias, b)])
    if out is not None:
        _check_out(out, xa.shape, dtype)
    stats_dtype = _compute_dtype(dtype)

    # The output keeps x's memory order (like np.empty_like). The gufunc
    # sees x and y with the normalized axes last: views, so NumPy's overlap
    # logic sees the real memory of both.
    y = np.empty_like(xa, dtype=dtype) if out is None else out
    xm, _ = _records_view(xa.astype(dtype, copy=False), plan)
    ym, is_view = _records_view(y, plan)
    mean = np.empty(plan.lead_shape, stats_dtype)
    var = np.empty(plan.lead_shape, stats_dtype)
    d = math.prod(plan.norm_shape)
    params = []  # a loop, not a comprehension: see _copy_records_back
    for p in (w, b):
        if p is not None:
            params.append(p.astype(dtype, copy=False).reshape(d))
    ufunc = _STATS_UFUNCS[(w is not None, b is not None)]
    ufunc(xm, *params, np.float64(eps), out=(ym, mean, var))
    if not is_view:
        _copy_records_back(y, ym, plan)
    if want_stats:
        return LayerNormResult(y, mean, var)
    return y


# dask arrays and xarray DataArrays (imported last: _lazy uses the helpers above)
from . import _lazy  # noqa: E402
