"""The public LayerNorm function: validation, dtype rules, axis handling.

All numerics run in the C gufuncs of :mod:`layernorm_c._core`; this module
only checks arguments, picks the computation dtype and arranges views.
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core

__all__ = ["layer_norm", "LayerNormResult", "layer_norm_ufunc"]

#: The raw generalized ufunc ``(n),(n),(n),()->(n)``: ``x, weight, bias, eps -> y``.
layer_norm_ufunc: np.ufunc = _core.layer_norm

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
_EXPECTED = ("a real array: float16, float32 or float64 "
             "(integer and bool arrays are computed in float64)")


class LayerNormResult(NamedTuple):
    """What ``layer_norm(..., return_stats=True)`` returns."""

    y: np.ndarray
    """The normalized output, shaped like ``x``."""
    mean: np.ndarray
    """Per-record mean, shaped like ``x`` without the normalized axes."""
    var: np.ndarray
    """Per-record population variance (divided by d, without eps)."""


def _as_real_array(a, name: str) -> np.ndarray:
    """``np.asarray(a)`` with integer/bool widened to float64; other
    non-float dtypes (complex, object, strings, datetimes...) rejected."""
    try:
        arr = np.asarray(a)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name}: could not be converted to an array: {exc}") from exc
    kind = arr.dtype.kind
    if kind in "biu":
        return arr.astype(np.float64)
    if kind == "f" and arr.dtype.itemsize <= 8:
        return arr
    raise TypeError(f"{name}: expected {_EXPECTED}, got dtype {arr.dtype}")


def _normalize_axes(axis, ndim: int) -> Tuple[int, ...]:
    """Sorted, non-negative, unique axes; AxisError (a ValueError) if bad."""
    if isinstance(axis, (bool, np.bool_)):
        raise TypeError(f"axis: expected an int or a tuple of ints, got {axis!r}")
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


def _as_param(p, name: str, norm_shape: Tuple[int, ...]) -> Optional[np.ndarray]:
    if p is None:
        return None
    arr = _as_real_array(p, name)
    if arr.shape != norm_shape:
        raise ValueError(
            f"{name}: expected shape {norm_shape} (the normalized axes of x), "
            f"got shape {arr.shape}"
        )
    return arr


def _check_eps(eps) -> float:
    if isinstance(eps, np.ndarray) and eps.ndim == 0:
        eps = eps[()]
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real):
        raise TypeError(
            f"eps: expected a real number, got {type(eps).__name__} {eps!r}"
        )
    try:
        value = float(eps)
    except OverflowError:  # an int beyond the float range
        value = math.inf
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"eps: expected a finite number >= 0, got {eps!r}")
    return value


def _check_out(out, shape: Tuple[int, ...], dtype: np.dtype) -> None:
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out: expected a numpy.ndarray, got {type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"out: expected shape {shape} (the shape of x), got {out.shape}")
    if out.dtype.kind != "f" or out.dtype.itemsize != dtype.itemsize:
        raise TypeError(f"out: expected dtype {dtype} (the result dtype), got {out.dtype}")
    if not out.flags.writeable:
        raise ValueError("out: expected a writeable array, got a read-only one")


def _flatten_view(a: np.ndarray, shape: Tuple[int, ...]) -> Optional[np.ndarray]:
    """``a.reshape(shape)`` if that is a view of ``a``, else None."""
    v = a.reshape(shape)
    return v if np.may_share_memory(v, a) or a.size == 0 else None


def layer_norm(
    x,
    weight=None,
    bias=None,
    eps: float = 1e-5,
    *,
    axis: Union[int, Sequence[int]] = -1,
    out: Optional[np.ndarray] = None,
    return_stats: bool = False,
):
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
        float64.
    weight : array_like, optional
        Gain, shaped like the normalized axes (``(d,)`` for one axis).
        ``None`` means no gain (gain 1).
    bias : array_like, optional
        Bias, shaped like the normalized axes. ``None`` means no bias.
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
        dtype. ``out=x`` normalizes in place.
    return_stats : bool, keyword-only, optional
        Also return the per-record mean and variance.

    Returns
    -------
    y : ndarray
        The normalized array, shaped like ``x``, of the dtype NumPy's
        promotion gives for ``x``, ``weight`` and ``bias`` (integer and bool
        count as float64). ``out`` itself if it was given.
    LayerNormResult
        If ``return_stats``: the named tuple ``(y, mean, var)``. ``mean`` and
        ``var`` are shaped like ``x`` without the normalized axes, in the
        computation dtype (float32 for float16 and float32 input). ``var`` is the
        population variance, without eps.

    Raises
    ------
    TypeError
        An unsupported dtype (complex, object, string, datetime, longdouble)
        for ``x``, ``weight``, ``bias`` or ``out``; a non-real ``eps``.
    ValueError
        0-d ``x``; a normalized axis of length 0; ``weight`` or ``bias`` of
        the wrong shape; ``eps`` negative, NaN or infinite; ``out`` of the
        wrong shape or read-only; an axis out of range (``AxisError``).

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
    if type(axis) is int and axis == -1:
        # The common case, done in C with no ufunc machinery, or
        # NotImplemented when anything needs the general path below.
        res = _core._fast(x, weight, bias, eps, out, return_stats)
        if res is not NotImplemented:
            return LayerNormResult(*res) if return_stats else res

    xa = _as_real_array(x, "x")
    if xa.ndim == 0:
        raise ValueError(
            "x: expected an array with at least 1 dimension, got a 0-d array"
        )
    axes = _normalize_axes(axis, xa.ndim)
    norm_shape = tuple(xa.shape[a] for a in axes)
    d = math.prod(norm_shape)
    if d == 0:
        raise ValueError(
            f"x: expected normalized axes of nonzero length, got shape "
            f"{xa.shape} normalized over axis {axis!r}"
        )
    w = _as_param(weight, "weight", norm_shape)
    b = _as_param(bias, "bias", norm_shape)
    eps = _check_eps(eps)

    dtype = np.dtype(np.result_type(*[a for a in (xa, w, b) if a is not None]).char)
    if out is not None:
        _check_out(out, xa.shape, dtype)
    stats_dtype = _F32 if dtype == _F16 else dtype

    # Move the normalized axes last (views), then flatten them into one.
    lead = tuple(i for i in range(xa.ndim) if i not in axes)
    perm = lead + axes
    lead_shape = tuple(xa.shape[i] for i in lead)
    flat = lead_shape + (d,)
    xm = xa.transpose(perm).reshape(flat).astype(dtype, copy=False)

    y = np.empty(xa.shape, dtype) if out is None else out
    ym = _flatten_view(y.transpose(perm), flat)
    target = ym if ym is not None else np.empty(flat, dtype)
    mean = np.empty(lead_shape, stats_dtype)
    var = np.empty(lead_shape, stats_dtype)

    params = [p.astype(dtype, copy=False).reshape(d) for p in (w, b) if p is not None]
    ufunc = _STATS_UFUNCS[(w is not None, b is not None)]
    _core._take_enomem()  # start clear
    ufunc(xm, *params, np.float64(eps), out=(target, mean, var))
    if _core._take_enomem():
        raise MemoryError("layer_norm: could not allocate the kernels' scratch rows")

    if ym is None:
        np.copyto(y.transpose(perm), target.reshape(tuple(y.shape[i] for i in perm)))
    if return_stats:
        return LayerNormResult(y, mean, var)
    return y
