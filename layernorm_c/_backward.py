"""The LayerNorm backward pass: validation and layout; the C core computes.

``dx`` of every record, and the parameter gradients ``dweight`` (the sum
over records of ``dy * xhat``) and ``dbias`` (the sum of ``dy``), which the
core accumulates exactly: each term is rounded on a fixed grid of 2^-86 and
the integers are summed exactly, so the sums do not depend on the order of
the records, the thread count, the instruction set or the layout, and are
rounded once at the end (see :class:`ExactSum`).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Tuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import _core, _lazy
from ._api import (
    AxisLike,
    EpsLike,
    _as_param,
    _as_real_array,
    _check_eps,
    _compute_dtype,
    _F32,
    _plan,
    _Plan,
    _result_dtype,
)

__all__ = ["layer_norm_backward", "LayerNormGrads", "layer_norm_backward_ufunc", "ExactSum"]

#: The raw generalized ufunc ``(n),(n),(n),()->(n)``: ``dy, x, weight, eps -> dx``.
layer_norm_backward_ufunc: np.ufunc = _core.layer_norm_backward


class LayerNormGrads(NamedTuple):
    """What :func:`layer_norm_backward` returns."""

    dx: NDArray[Any]
    """The gradient with respect to ``x``, shaped like ``x``."""
    dweight: NDArray[Any]
    """The sum over records of ``dy * xhat``, shaped like the normalized axes."""
    dbias: NDArray[Any]
    """The sum over records of ``dy``, shaped like the normalized axes."""


class ExactSum:
    """An exact, order-independent sum of per-feature terms (the parameter
    gradients' accumulator).

    The state holds, per feature, the exact sum of every term rounded to a
    multiple of 2^-86 (terms of magnitude 2^64 or more, and non-finite ones,
    are kept aside: NaN and infinities propagate, finite terms that large
    are summed in plain float64). Two sums merge exactly with ``+``, so
    sums over micro-batches, threads or dask chunks give the same bits in
    any grouping and order. :meth:`value` rounds once.

    Parameters
    ----------
    shape : tuple of int
        The shape of the summed quantity (the normalized axes).
    state : ndarray, optional
        A state from :attr:`state` (uint64, ``(prod(shape), ACC_WORDS)``);
        default: zero.
    """

    __slots__ = ("shape", "state")

    def __init__(self, shape: Tuple[int, ...], state: Optional[NDArray[np.uint64]] = None):
        self.shape = tuple(shape)
        d = math.prod(self.shape)
        if state is None:
            state = np.zeros((d, _core.ACC_WORDS), np.uint64)
        if state.shape != (d, _core.ACC_WORDS) or state.dtype != np.uint64:
            raise ValueError(f"state: expected a uint64 array of shape {(d, _core.ACC_WORDS)}, "
                             f"got {state.dtype} {state.shape}")
        self.state = np.ascontiguousarray(state)

    def __add__(self, other: "ExactSum") -> "ExactSum":
        if not isinstance(other, ExactSum):
            return NotImplemented
        if other.shape != self.shape:
            raise ValueError(f"cannot add sums of shapes {self.shape} and {other.shape}")
        return ExactSum(self.shape, _core._acc_merge(self.state, other.state))

    def value(self, dtype: Any = np.float64) -> NDArray[Any]:
        """The sums rounded once to ``dtype`` (float32 or float64; float16
        rounds through float64)."""
        dtype = np.dtype(dtype)
        single = dtype == _F32
        return _core._acc_value(self.state, single).astype(dtype).reshape(self.shape)

    def __repr__(self) -> str:
        return f"ExactSum(shape={self.shape})"


def _grad_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """dweight/dbias: float32 for records computed in float32, else float64."""
    return _compute_dtype(dtype)


def _stat_arg(a: object, name: str, plan: _Plan) -> Optional[NDArray[Any]]:
    """mean or var as given by layer_norm(..., return_stats=True): the shape
    of x without the normalized axes, or that shape with the normalized axes
    kept as 1s. Returned flat (one value per record), native byte order."""
    if a is None:
        return None
    arr = _as_real_array(a, name)
    keep = tuple(1 if i in plan.axes else n for i, n in enumerate(plan.x.shape))
    if arr.shape not in (plan.lead_shape, keep):
        raise ValueError(f"{name}: expected shape {plan.lead_shape} (x without the normalized "
                         f"axes, as layer_norm(..., return_stats=True) returns it), got shape "
                         f"{arr.shape}")
    return _native(arr.reshape(-1))


def _plain_stat(a: object, x: object) -> bool:
    """True when ``a`` is a float ndarray shaped as ``layer_norm(x, ...,
    return_stats=True)`` returns a statistic over the last axis (or with
    that axis kept as 1): what :func:`_stat_arg` accepts, told without
    planning."""
    if type(a) is not np.ndarray or type(x) is not np.ndarray or a.dtype.kind != "f":
        return False
    lead = x.shape[:-1]
    return x.ndim > 0 and (a.shape == lead or a.shape == lead + (1,))


def _native(a: NDArray[Any]) -> NDArray[Any]:
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


def _as_rows(a: NDArray[Any], plan: _Plan) -> NDArray[Any]:
    """``a`` (shaped like x) as 2-d records (rows, d): a view when the
    layout allows, else a copy; native byte order."""
    d = math.prod(plan.norm_shape)
    return _native(a.transpose(plan.perm).reshape(-1, d))


def _backward_parts(dy: object, x: object, weight: object, eps: object, axis: object,
                    mean: object, var: object, sums: bool = True
                    ) -> Tuple[NDArray[Any], Optional[ExactSum], Optional[ExactSum], _Plan]:
    plan = _plan(x, axis)
    xa = plan.x
    dya = _as_real_array(dy, "dy")
    if dya.shape != xa.shape:
        raise ValueError(f"dy: expected shape {xa.shape} (the shape of x), got shape "
                         f"{dya.shape}")
    w = _as_param(weight, "weight", xa.shape, plan.axes)
    eps = _check_eps(eps)
    m = _stat_arg(mean, "mean", plan)
    _stat_arg(var, "var", plan)  # checked; the pass over x refines the variance itself
    dtype = _result_dtype(xa, [(dy, dya), (weight, w)])
    d = math.prod(plan.norm_shape)
    # The weight in the result dtype: a weak Python scalar weight must not
    # widen the computation (nor change dweight's bits).
    w1 = None if w is None else _native(np.ascontiguousarray(w.astype(dtype, copy=False))
                                        .reshape(d))
    dx2, sw, sb = _core._backward(_as_rows(dya, plan), _as_rows(xa, plan), w1, eps, m, sums)
    dx2 = dx2.astype(dtype, copy=False)
    moved = dx2.reshape(plan.lead_shape + plan.norm_shape)
    dx = moved.transpose(tuple(int(i) for i in np.argsort(plan.perm)))
    if not (xa.flags.c_contiguous and plan.perm == tuple(range(xa.ndim))):
        dx = _like(xa, dx)  # dx in x's memory order, like the forward's y
    acc_w = None if sw is None else ExactSum(plan.norm_shape, sw)
    acc_b = None if sb is None else ExactSum(plan.norm_shape, sb)
    return dx, acc_w, acc_b, plan


_LAYER_FAST_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def _layer_backward_rows(dy: object, x: NDArray[Any], weight: Optional[NDArray[Any]],
                         eps: float, mean: Optional[NDArray[Any]]
                         ) -> Optional[Tuple[NDArray[Any], ExactSum, ExactSum]]:
    """The LayerNorm layer's backward over the last axis, straight to the
    kernels: for what the layer saved itself (``x`` a C-contiguous copy, the
    forward's mean, a copy of the gain, a validated eps) and a ``dy`` of
    x's own shape, dtype and C layout. The same call with the same operands
    as :func:`_backward_parts` makes, so the same bits, without its planning
    (60 us of a (1, 768) layer backward's 90 here). None for anything else:
    the general path then validates and explains."""
    if (type(dy) is not np.ndarray or dy.dtype != x.dtype or dy.shape != x.shape
            or x.ndim == 0 or x.dtype not in _LAYER_FAST_DTYPES
            or not (dy.flags.c_contiguous and x.flags.c_contiguous)):
        return None
    d = x.shape[-1]
    if d == 0 or (weight is not None and (weight.dtype != x.dtype or weight.shape != (d,))):
        return None
    if mean is not None and not (type(mean) is np.ndarray and mean.dtype.isnative
                                 and mean.size * d == x.size):
        return None
    m = None if mean is None else mean.reshape(-1)
    dx2, sw, sb = _core._backward(dy.reshape(-1, d), x.reshape(-1, d), weight, eps, m, True)
    return dx2.reshape(x.shape), ExactSum((d,), sw), ExactSum((d,), sb)


def _like(x: NDArray[Any], values: NDArray[Any]) -> NDArray[Any]:
    """``values`` copied into an array with x's memory order."""
    out = np.empty_like(x, dtype=values.dtype)
    np.copyto(out, values)
    return out


def layer_norm_backward(
    dy: ArrayLike,
    x: ArrayLike,
    weight: Optional[ArrayLike] = None,
    eps: EpsLike = 1e-5,
    *,
    axis: AxisLike = -1,
    mean: Optional[ArrayLike] = None,
    var: Optional[ArrayLike] = None,
) -> LayerNormGrads:
    """The gradients of :func:`layer_norm` with respect to its input and
    its parameters.

    With ``xhat = (x - mean) / sqrt(var + eps)`` and ``g = dy * weight``,
    every record gets ::

        dx = (g - mean(g) - xhat * mean(g * xhat)) / sqrt(var + eps)

    and the parameter gradients are sums over records::

        dweight = sum(dy * xhat)        dbias = sum(dy)

    The per-record sums follow the forward's reduction order with float64
    totals; ``dweight`` and ``dbias`` are exact sums, rounded once, so they
    are bit-identical for any thread count, instruction set, memory layout
    and order of the records.

    Parameters
    ----------
    dy : array_like
        The gradient of the loss with respect to ``layer_norm``'s output,
        shaped like ``x``.
    x : array_like
        The forward's input.
    weight : array_like, optional
        The forward's gain (``None``: no gain), shaped as for
        :func:`layer_norm`. Its bias does not enter the backward.
    eps : float, optional
        The forward's eps (finite, ``>= 0``). Default ``1e-5``.
    axis : int or tuple of ints, keyword-only, optional
        The forward's normalized axes. Default -1.
    mean, var : array_like, keyword-only, optional
        The statistics ``layer_norm(..., return_stats=True)`` returned.
        ``mean`` never changes the result: the backward refines the
        statistics in the pass it makes over ``x`` anyway (float32
        statistics alone are not accurate enough at large offsets), around
        a shift of its own for records of more than 64 features, and
        around the forward's mean for the others and for records whose
        shift is poor; there, giving ``mean`` saves the pass that
        recomputes it. ``var`` is checked and not needed. Either may keep
        the normalized axes as 1s.

    Returns
    -------
    LayerNormGrads
        ``(dx, dweight, dbias)``: ``dx`` shaped like ``x``, of the dtype of
        the forward's output; ``dweight`` and ``dbias`` shaped like the
        normalized axes, float32 for float16/float32 records and float64
        for float64 ones. A layer without gain or bias ignores the one it
        lacks.

    Raises
    ------
    TypeError, ValueError
        As :func:`layer_norm` for ``x``, ``weight``, ``eps`` and ``axis``;
        ``dy`` of another shape than ``x``; ``mean`` or ``var`` of the wrong
        shape.

    See Also
    --------
    layer_norm_backward_ufunc : ``dx`` per record as a generalized ufunc.
    LayerNorm : a layer object keeping what its backward needs.

    Examples
    --------
    >>> import numpy as np, layernorm_c as lnc
    >>> x = np.array([[1.0, 2.0, 3.0, 4.0]])
    >>> g = lnc.layer_norm_backward(np.ones_like(x), x, eps=0.0)
    >>> bool(np.abs(g.dx).max() < 1e-15), g.dbias
    (True, array([1., 1., 1., 1.]))
    """
    if type(axis) is int and axis == -1 and (var is None or _plain_stat(var, x)):
        # The common case, done in C with the sums rounded there, or
        # NotImplemented when anything needs the general path below. A var
        # is only checked; one that passes the cheap test here is all right
        # (anything else goes the general way, which checks it).
        res = _core._fast_backward(dy, x, weight, eps, mean, False)
        if res is not NotImplemented:
            return LayerNormGrads(*res)
    if _lazy.kind(dy, x, weight, mean, var) is not None:  # dask or xarray: a lazy graph
        return _lazy.layer_norm_backward(dy, x, weight, eps, axis, mean, var)  # type: ignore[no-any-return]
    dx, acc_w, acc_b, plan = _backward_parts(dy, x, weight, eps, axis, mean, var)
    gdt = _grad_dtype(dx.dtype)
    assert acc_w is not None and acc_b is not None
    return LayerNormGrads(dx, acc_w.value(gdt), acc_b.value(gdt))
