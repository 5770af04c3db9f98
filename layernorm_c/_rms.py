"""RMSNorm: validation, conventions and layout; the C core computes.

``y = x / sqrt(mean(x^2) + eps) * scale`` per record, with ``scale =
weight`` (LLaMA, Qwen, Mistral, T5) or ``scale = 1 + weight`` (Gemma).
"""
from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple, Optional, Tuple, Union, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import _core, _lazy
from ._api import (
    AxisLike,
    EpsLike,
    _as_param,
    _as_real_array,
    _c_entry,
    _check_eps,
    _check_flag,
    _check_out,
    _compute_dtype,
    _copy_records_back,
    _F32,
    _plan,
    _Plan,
    _records_view,
    _result_dtype,
)
from ._backward import ExactSum, _as_rows, _grad_dtype, _like, _native

__all__ = ["rms_norm", "rms_norm_backward", "RMSNormResult", "RMSNormGrads",
           "rms_norm_ufunc", "rms_norm_backward_ufunc", "Convention"]

#: The raw generalized ufunc ``(n),(n),()->(n)``: ``x, scale, eps -> y``.
rms_norm_ufunc: np.ufunc = _core.rms_norm
#: The raw generalized ufunc ``(n),(n),(n),()->(n)``: ``dy, x, scale, eps -> dx``.
rms_norm_backward_ufunc: np.ufunc = _core.rms_norm_backward

#: How the weight scales: ``"weight"`` (LLaMA, Qwen, Mistral, T5) or
#: ``"1+weight"`` (Gemma, whose weights start at 0).
Convention = Literal["weight", "1+weight"]


class RMSNormResult(NamedTuple):
    """What ``rms_norm(..., return_stats=True)`` returns."""

    y: NDArray[Any]
    """The normalized output, shaped like ``x``."""
    ms: NDArray[Any]
    """Per-record mean square ``mean(x^2)`` (without eps), shaped like ``x``
    without the normalized axes."""


class RMSNormGrads(NamedTuple):
    """What :func:`rms_norm_backward` returns."""

    dx: NDArray[Any]
    """The gradient with respect to ``x``, shaped like ``x``."""
    dweight: NDArray[Any]
    """The sum over records of ``dy * x / rms``, shaped like the normalized axes
    (the same for both conventions: d(1 + w)/dw = 1)."""


def _check_convention(convention: object) -> bool:
    """True for the Gemma convention."""
    if convention not in ("weight", "1+weight"):
        raise ValueError(f"convention: expected 'weight' (LLaMA, T5) or '1+weight' (Gemma), "
                         f"got {convention!r}")
    return convention == "1+weight"


def _scale(w: Optional[NDArray[Any]], dtype: np.dtype[Any], plus_one: bool
           ) -> Optional[NDArray[Any]]:
    """Gemma's scale ``1 + weight`` rounded once in the computation's type
    (float32 for float16 results), as its reference code computes it."""
    if w is None:
        return None
    ctype = _compute_dtype(dtype)
    scale: NDArray[Any] = w.astype(ctype) + ctype.type(1)
    return scale


@overload
def rms_norm(x: ArrayLike, weight: Optional[ArrayLike] = ..., eps: EpsLike = ..., *,
             axis: AxisLike = ..., out: Optional[NDArray[Any]] = ...,
             return_stats: Literal[False] = ..., convention: Convention = ...
             ) -> NDArray[Any]: ...
@overload
def rms_norm(x: ArrayLike, weight: Optional[ArrayLike] = ..., eps: EpsLike = ..., *,
             axis: AxisLike = ..., out: Optional[NDArray[Any]] = ...,
             return_stats: Literal[True], convention: Convention = ...) -> RMSNormResult: ...
@overload
def rms_norm(x: ArrayLike, weight: Optional[ArrayLike] = ..., eps: EpsLike = ..., *,
             axis: AxisLike = ..., out: Optional[NDArray[Any]] = ...,
             return_stats: bool = ..., convention: Convention = ...
             ) -> Union[NDArray[Any], RMSNormResult]: ...
@_c_entry(RMSNormResult)
def rms_norm(
    x: ArrayLike,
    weight: Optional[ArrayLike] = None,
    eps: EpsLike = 1e-6,
    *,
    axis: AxisLike = -1,
    out: Optional[NDArray[Any]] = None,
    return_stats: bool = False,
    convention: Convention = "weight",
) -> Union[NDArray[Any], RMSNormResult]:
    """RMS normalization of every record of ``x``::

        y = x / sqrt(mean(x^2) + eps) * weight          (convention="weight")
        y = x / sqrt(mean(x^2) + eps) * (1 + weight)    (convention="1+weight")

    No mean is subtracted. Every guarantee of :func:`layer_norm` holds: the
    sum of squares follows the same fixed order with float64 totals,
    float16 is computed in float32 and never overflows, NaN and infinities
    stay in their record, and a record's result is bit-identical alone or in
    any batch, layout, thread count or instruction set.

    Parameters
    ----------
    x : array_like
        Input with at least one dimension (float16, float32, float64;
        integers and bools in float64).
    weight : array_like, optional
        The scale's parameter, of the normalized axes' shape or one that
        broadcasts to it. ``None``: no scale (1).
    eps : float, optional
        Added to the mean square inside the square root (finite, ``>= 0``,
        used in float64). Default ``1e-6`` (LLaMA's and Gemma's; Mistral and
        Qwen use 1e-5 or 1e-6 by model).
    axis : int or tuple of ints, keyword-only, optional
        The normalized axes. Default -1.
    out : ndarray, keyword-only, optional
        Array to write the result to (the shape of ``x``, the result dtype);
        may share memory with any input.
    return_stats : bool, keyword-only, optional
        Also return the per-record mean square.
    convention : {'weight', '1+weight'}, keyword-only, optional
        ``'weight'`` scales by ``weight`` (LLaMA, Qwen, Mistral, T5);
        ``'1+weight'`` by ``1 + weight`` (Gemma; ``1 + weight`` is rounded
        once in the computation's type). Default ``'weight'``.

    Returns
    -------
    y : ndarray
        Shaped like ``x``, in its memory order, of the promoted dtype.
    RMSNormResult
        If ``return_stats``: ``(y, ms)``, ``ms`` in float32 for float16 and
        float32 input, float64 otherwise.

    Raises
    ------
    TypeError, ValueError
        As :func:`layer_norm`; an unknown ``convention``.

    Examples
    --------
    >>> import numpy as np, layernorm_c as lnc
    >>> lnc.rms_norm(np.array([3.0, 4.0]), eps=0.0)      # rms = sqrt(12.5)
    array([0.84852814, 1.13137085])
    """
    # The common case (last axis, convention "weight") never gets here:
    # the C entry point in front of this function (_c_entry) computes it.
    plus_one = _check_convention(convention)
    if _lazy.kind(x, weight) is not None:  # dask or xarray: a lazy graph
        return _lazy.rms_norm(x, weight, eps, axis, out, return_stats, convention)  # type: ignore[no-any-return]

    plan = _plan(x, axis)
    xa = plan.x
    w = _as_param(weight, "weight", xa.shape, plan.axes)
    eps = _check_eps(eps)
    want_stats = _check_flag(return_stats, "return_stats")
    dtype = _result_dtype(xa, [(weight, w)])
    if out is not None:
        _check_out(out, xa.shape, dtype)
    # The weight in the result dtype, as layer_norm casts its parameters: a
    # Python scalar weight is weak and must not widen the computation.
    scale = _scale(w, dtype, plus_one) if plus_one else \
        None if w is None else w.astype(dtype, copy=False)
    if len(plan.axes) == 1 and plan.axes[0] == xa.ndim - 1 and scale is not None:
        # The scale is in the computation's type: the result keeps x's
        # dtype when that is the result dtype.
        res = _core._fast_rms(xa, _native(np.ascontiguousarray(scale)), eps, out, want_stats,
                              plus_one and dtype == xa.dtype)
        if res is not NotImplemented:
            return RMSNormResult(*res) if want_stats else res

    # Gemma's 1 + weight is rounded once in float for float16 results:
    # those records are computed in float32 and rounded once at the end.
    work = _compute_dtype(dtype) if plus_one and scale is not None else dtype
    stats_dtype = _compute_dtype(dtype)
    y = np.empty_like(xa, dtype=dtype) if out is None else out
    xm, _ = _records_view(xa.astype(work, copy=False), plan)
    ym, is_view = _records_view(y, plan) if work == dtype else (None, False)
    if ym is None:
        ym = np.empty(xm.shape, work)
    ms = np.empty(plan.lead_shape, stats_dtype)
    d = math.prod(plan.norm_shape)
    if scale is None:
        _core._rms_none(xm, np.float64(eps), out=(ym, ms))
    else:
        _core._rms_w(xm, scale.astype(work).reshape(d), np.float64(eps), out=(ym, ms))
    if not is_view:
        _copy_records_back(y, ym, plan, casting="unsafe")
    return RMSNormResult(y, ms) if want_stats else y


def _rms_backward_parts(dy: object, x: object, weight: object, eps: object, axis: object,
                        ms: object, convention: object
                        ) -> Tuple[NDArray[Any], Optional[ExactSum], _Plan]:
    plus_one = _check_convention(convention)
    plan = _plan(x, axis)
    xa = plan.x
    dya = _as_real_array(dy, "dy")
    if dya.shape != xa.shape:
        raise ValueError(f"dy: expected shape {xa.shape} (the shape of x), got shape "
                         f"{dya.shape}")
    w = _as_param(weight, "weight", xa.shape, plan.axes)
    eps = _check_eps(eps)
    from ._backward import _stat_arg
    _stat_arg(ms, "ms", plan)  # checked; the pass over x recomputes it exactly
    dtype = _result_dtype(xa, [(dy, dya), (weight, w)])
    # (in the result dtype, as in rms_norm: a weak scalar weight stays weak)
    scale = _scale(w, dtype, plus_one) if plus_one else \
        None if w is None else w.astype(dtype, copy=False)
    d = math.prod(plan.norm_shape)
    s1 = None if scale is None else _native(np.ascontiguousarray(scale).reshape(d))
    dx2, sw, _ = _core._backward(_as_rows(dya, plan), _as_rows(xa, plan), s1, eps, None, True,
                                 True)
    with np.errstate(over="ignore"):  # an overflow to inf, as the kernels write it silently
        moved = dx2.astype(dtype, copy=False).reshape(plan.lead_shape + plan.norm_shape)
    dx = moved.transpose(tuple(int(i) for i in np.argsort(plan.perm)))
    if not (xa.flags.c_contiguous and plan.perm == tuple(range(xa.ndim))):
        dx = _like(xa, dx)
    return dx, None if sw is None else ExactSum(plan.norm_shape, sw), plan


def rms_norm_backward(
    dy: ArrayLike,
    x: ArrayLike,
    weight: Optional[ArrayLike] = None,
    eps: EpsLike = 1e-6,
    *,
    axis: AxisLike = -1,
    ms: Optional[ArrayLike] = None,
    convention: Convention = "weight",
) -> RMSNormGrads:
    """The gradients of :func:`rms_norm` with respect to its input and its
    weight.

    With ``xhat = x / sqrt(mean(x^2) + eps)`` and ``g = dy * scale``::

        dx = (g - xhat * mean(g * xhat)) / sqrt(mean(x^2) + eps)
        dweight = sum over records of dy * xhat

    ``dweight`` is an exact sum rounded once (see :func:`layer_norm_backward`):
    bit-identical for any thread count, instruction set, layout and order
    of the records.

    Parameters
    ----------
    dy : array_like
        The gradient of the loss with respect to ``rms_norm``'s output.
    x, weight, eps, axis, convention
        As given to :func:`rms_norm`.
    ms : array_like, keyword-only, optional
        The mean squares ``rms_norm(..., return_stats=True)`` returned:
        checked, and recomputed exactly in the pass the backward makes over
        ``x`` (the result never depends on it).

    Returns
    -------
    RMSNormGrads
        ``(dx, dweight)``; ``dweight`` float32 for float16/float32 records,
        float64 for float64 ones.

    Examples
    --------
    >>> import numpy as np, layernorm_c as lnc
    >>> g = lnc.rms_norm_backward(np.ones((1, 2)), np.array([[3.0, 4.0]]), eps=0.0)
    >>> g.dweight
    array([0.84852814, 1.13137085])
    """
    if type(axis) is int and axis == -1 and type(convention) is str and convention == "weight":
        # The common case in C (see layer_norm_backward).
        res = _core._fast_backward(dy, x, weight, eps, ms, True)
        if res is not NotImplemented:
            return RMSNormGrads(*res)
    if _lazy.kind(dy, x, weight, ms) is not None:  # dask or xarray: a lazy graph
        return _lazy.rms_norm_backward(dy, x, weight, eps, axis, ms, convention)  # type: ignore[no-any-return]
    dx, sw, _ = _rms_backward_parts(dy, x, weight, eps, axis, ms, convention)
    assert sw is not None
    return RMSNormGrads(dx, sw.value(_grad_dtype(dx.dtype)))
