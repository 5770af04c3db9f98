"""Plain NumPy LayerNorm and RMSNorm in float64, forward and backward: the oracles the
C core (and ``layernorm_c.testing``'s audits of other implementations) are
tested against.

They follow the textbook definitions step by step (two-pass centered
variance, population variance, eps inside the square root; the backward's
three-term formula for dx and plain sums over the records for the parameter
gradients) and favour clarity over speed, like bottleneck's ``bn.slow``
functions.
"""
from __future__ import annotations

import math
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

Axis = Union[int, Sequence[int]]


class ReferenceResult(NamedTuple):
    """What :func:`reference_layer_norm` returns, all in float64."""

    y: NDArray[np.float64]
    """The normalized output, shaped like ``x``."""
    mean: NDArray[np.float64]
    """Per-record mean, shaped like ``x`` without the normalized axes."""
    var: NDArray[np.float64]
    """Per-record population variance (divided by d, without eps)."""


def reference_layer_norm(
    x: ArrayLike,
    weight: Optional[ArrayLike] = None,
    bias: Optional[ArrayLike] = None,
    eps: float = 1e-5,
    axis: Axis = -1,
) -> ReferenceResult:
    """Layer normalization computed in float64 with NumPy.

    Parameters
    ----------
    x : array_like
        Input, at least 1-d. Converted to float64.
    weight, bias : array_like, optional
        Gain and bias, shaped like the normalized axes. ``None`` means a
        gain of 1 and a bias of 0.
    eps : float, optional
        Added to the variance inside the square root.
    axis : int or tuple of ints, optional
        The axis (or axes, jointly) to normalize over. Default -1.

    Returns
    -------
    ReferenceResult
        ``(y, mean, var)`` in float64; mean and var have the normalized
        axes removed. The variance is the population variance (divided by
        the number of features) and does not include eps.
    """
    x = np.asarray(x, dtype=np.float64)
    axes = _axes(axis, x.ndim)
    # Each record is scaled by a power of two (exact) that brings its
    # largest magnitude near 1, so that neither the sum nor the squares can
    # overflow or underflow; eps scales with the variance, so y is unchanged.
    scale = _record_scale(x, axes)
    with np.errstate(under="ignore", over="ignore"):
        xs = x * scale
        mean = xs.mean(axis=axes, keepdims=True)
        centered = xs - mean
        var = (centered * centered).mean(axis=axes, keepdims=True)
        denom = np.sqrt(var + eps * scale * scale)
        if eps > 0:
            # denom is 0 only for a constant record whose scaled eps
            # underflowed: its centered values are all 0, and so is y.
            y = np.divide(centered, denom, out=np.zeros_like(centered),
                          where=denom != 0)
            # denom is infinite only where the scaled eps overflowed (a
            # tiny record): its variance is negligible beside eps.
            y = np.where(np.isinf(denom), (centered / scale) / math.sqrt(eps), y)
        else:
            y = centered / denom
        mean = mean / scale
        var = var / scale / scale
    param_shape = [1] * x.ndim
    for a in axes:
        param_shape[a] = x.shape[a]
    w = None if weight is None else np.asarray(weight, dtype=np.float64).reshape(param_shape)
    b = None if bias is None else np.asarray(bias, dtype=np.float64).reshape(param_shape)
    return ReferenceResult(_affine(y, w, b), np.squeeze(mean, axes), np.squeeze(var, axes))


def _affine(y: NDArray[np.float64], w: Optional[NDArray[np.float64]],
            b: Optional[NDArray[np.float64]]) -> NDArray[np.float64]:
    """``y * w + b``. Where the product overflows but the sum would not
    (gain and bias near the float64 maximum, of opposite signs), it is
    recomputed a quarter of the size: ``4 * (y * (w / 4) + b / 4)``, whose
    terms cannot overflow when the result does not."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = y if w is None else y * w
        if b is None:
            return out
        out = out + b
        if w is not None:
            lost = ~np.isfinite(out) & np.isfinite(y) & np.isfinite(w) & np.isfinite(b)
            if lost.any():
                quarter = 4.0 * (y * (w / 4.0) + b / 4.0)
                out = np.where(lost, quarter, out)
    return out


class ReferenceRMSResult(NamedTuple):
    """What :func:`reference_rms_norm` returns, in float64."""

    y: NDArray[np.float64]
    """The normalized output, shaped like ``x``."""
    ms: NDArray[np.float64]
    """Per-record mean square (without eps)."""


def reference_rms_norm(
    x: ArrayLike,
    weight: Optional[ArrayLike] = None,
    eps: float = 1e-6,
    axis: Axis = -1,
    convention: str = "weight",
) -> ReferenceRMSResult:
    """RMS normalization computed in float64 with NumPy:
    ``y = x / sqrt(mean(x^2) + eps) * scale``, ``scale = weight`` or (the
    Gemma convention, ``convention="1+weight"``) ``1 + weight``.

    Parameters
    ----------
    x, weight, eps, axis
        As for :func:`reference_layer_norm` (``weight`` absent: a scale of
        1, whatever the convention).
    convention : {'weight', '1+weight'}, optional
        How the weight scales.

    Returns
    -------
    ReferenceRMSResult
        ``(y, ms)`` in float64, ``ms`` with the normalized axes removed.
    """
    if convention not in ("weight", "1+weight"):
        raise ValueError(f"convention: expected 'weight' or '1+weight', got {convention!r}")
    x = np.asarray(x, dtype=np.float64)
    given: Sequence[int] = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    axes = tuple(sorted(int(a) % x.ndim for a in given))
    scale = _record_scale(x, axes)  # exact powers of two: no overflow, no underflow
    with np.errstate(under="ignore", over="ignore"):
        xs = x * scale
        ms = (xs * xs).mean(axis=axes, keepdims=True)
        denom = np.sqrt(ms + eps * scale * scale)
        if eps > 0:  # a record of zeros whose scaled eps underflowed: y is 0
            y = np.divide(xs, denom, out=np.zeros_like(xs), where=denom != 0)
            # A tiny record whose scaled eps overflowed: its mean square is
            # negligible beside eps, and y = x / sqrt(eps) (not 0).
            y = np.where(np.isinf(denom), x / math.sqrt(eps), y)
        else:
            y = xs / denom
        ms = ms / scale / scale
    if weight is not None:
        param_shape = [x.shape[a] if a in axes else 1 for a in range(x.ndim)]
        w = np.asarray(weight, dtype=np.float64).reshape(param_shape)
        y = y * (1.0 + w if convention == "1+weight" else w)
    return ReferenceRMSResult(y, np.squeeze(ms, axes))


def _record_scale(x: NDArray[np.float64], axes: Tuple[int, ...]) -> NDArray[np.float64]:
    """2**-e per record, e the binary exponent of its largest magnitude
    (clipped to +-1000 so the scale itself stays finite); 1 for records of
    zeros or with a non-finite value."""
    with np.errstate(invalid="ignore"):
        m = np.max(np.abs(x), axis=axes, keepdims=True) if x.size else np.ones(
            [1 if i in axes else n for i, n in enumerate(x.shape)])
    ok = np.isfinite(m) & (m > 0)
    _, e = np.frexp(np.where(ok, m, 1.0))
    return np.where(ok, np.ldexp(1.0, -np.clip(e, -1000, 1000)), 1.0)


def _axes(axis: Axis, ndim: int) -> Tuple[int, ...]:
    given: Sequence[int] = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    return tuple(sorted(int(a) % ndim for a in given))


class ReferenceGrads(NamedTuple):
    """What :func:`reference_layer_norm_backward` returns, all in float64."""

    dx: NDArray[np.float64]
    """The gradient with respect to ``x``, shaped like ``x``."""
    dweight: NDArray[np.float64]
    """The sum over records of ``dy * xhat``, shaped like the normalized axes."""
    dbias: NDArray[np.float64]
    """The sum over records of ``dy``, shaped like the normalized axes."""


def reference_layer_norm_backward(
    dy: ArrayLike,
    x: ArrayLike,
    weight: Optional[ArrayLike] = None,
    eps: float = 1e-5,
    axis: Axis = -1,
) -> ReferenceGrads:
    """The gradients of layer normalization, computed in float64 with NumPy.

    With ``xhat = (x - mean) / sqrt(var + eps)`` (population variance) and
    ``g = dy * weight``, every record gets ::

        dx = (g - mean(g) - xhat * mean(g * xhat)) / sqrt(var + eps)

    and the parameter gradients are sums over the records::

        dweight = sum(dy * xhat)        dbias = sum(dy)

    Each product is rounded once to float64 and each sum is then computed
    exactly and rounded once (:func:`math.fsum`), so ``dweight`` and
    ``dbias`` do not depend on the order of the records.

    Parameters
    ----------
    dy : array_like
        The gradient of the loss with respect to the forward's output,
        shaped like ``x``. Converted to float64.
    x : array_like
        The forward's input. Converted to float64.
    weight : array_like, optional
        The forward's gain, shaped like the normalized axes; ``None`` means
        a gain of 1. The bias does not enter the backward.
    eps : float, optional
        The forward's eps, added to the variance inside the square root.
    axis : int or tuple of ints, optional
        The normalized axis (or axes, jointly). Default -1.

    Returns
    -------
    ReferenceGrads
        ``(dx, dweight, dbias)`` in float64: ``dx`` shaped like ``x``,
        ``dweight`` and ``dbias`` shaped like the normalized axes.

    Examples
    --------
    >>> import numpy as np, layernorm_c as lnc
    >>> g = lnc.reference_layer_norm_backward([[1.0, 0.0, 0.0, 0.0]],
    ...                                       [[1.0, 2.0, 3.0, 4.0]], eps=0.0)
    >>> np.round(g.dx / (1 / np.sqrt(1.25)), 12)
    array([[ 0.3, -0.4, -0.1,  0.2]])
    >>> g.dbias
    array([1., 0., 0., 0.])
    """
    x, dy, axes, param_shape = _backward_inputs(dy, x, axis)
    g = dy if weight is None else dy * np.asarray(weight, np.float64).reshape(param_shape)
    # As in the forward, each record of x is scaled by a power of two
    # (exact) that brings its largest magnitude near 1, and so is each
    # record of g: no sum or square can overflow or underflow. xhat is
    # unchanged; 1 / sqrt(var + eps) is scale / denom.
    scale = _record_scale(x, axes)
    g_scale = _record_scale(g, axes)
    with np.errstate(under="ignore", over="ignore", invalid="ignore", divide="ignore"):
        xs = x * scale
        centered = xs - xs.mean(axis=axes, keepdims=True)
        var = (centered * centered).mean(axis=axes, keepdims=True)
        denom = np.sqrt(var + eps * scale * scale)
        if eps > 0:
            # denom is 0 only for a constant record whose scaled eps
            # underflowed: its xhat is 0 and its rstd 1 / sqrt(eps). It is
            # infinite only where the scaled eps overflowed (a tiny
            # record): its variance is negligible beside eps.
            xhat = np.divide(centered, denom, out=np.zeros_like(centered),
                             where=denom != 0)
            rstd = np.divide(scale, denom, out=np.full_like(denom, 1.0 / math.sqrt(eps)),
                             where=denom != 0)
            big = np.isinf(denom)
            xhat = np.where(big, (centered / scale) / math.sqrt(eps), xhat)
            rstd = np.where(big, 1.0 / math.sqrt(eps), rstd)
        else:
            xhat = centered / denom
            rstd = scale / denom
        gs = g * g_scale
        mean_g = gs.mean(axis=axes, keepdims=True)
        mean_gx = (gs * xhat).mean(axis=axes, keepdims=True)
        dx = (gs - mean_g - xhat * mean_gx) * (rstd / g_scale)
    records = tuple(a for a in range(x.ndim) if a not in axes)
    norm_shape = tuple(x.shape[a] for a in axes)
    with np.errstate(invalid="ignore", over="ignore"):
        dweight = _exact_sum(dy * xhat, records, norm_shape)
    dbias = _exact_sum(dy, records, norm_shape)
    return ReferenceGrads(dx, dweight, dbias)


def _backward_inputs(dy: ArrayLike, x: ArrayLike, axis: Axis
                     ) -> Tuple[NDArray[np.float64], NDArray[np.float64], Tuple[int, ...], List[int]]:
    """A backward's x and dy in float64 (dy shaped like x), its normalized
    axes and the shape a parameter broadcasts with."""
    x64 = np.asarray(x, dtype=np.float64)
    dy64 = np.asarray(dy, dtype=np.float64)
    if dy64.shape != x64.shape:
        raise ValueError(f"dy: expected the shape of x {x64.shape}, got {dy64.shape}")
    axes = _axes(axis, x64.ndim)
    return x64, dy64, axes, [x64.shape[a] if a in axes else 1 for a in range(x64.ndim)]


def _exact_sum(terms: NDArray[np.float64], records: Tuple[int, ...],
               norm_shape: Tuple[int, ...]) -> NDArray[np.float64]:
    """Per feature, the sum over ``records`` of ``terms``, exact and rounded
    once (NaN and infinities propagate as in a plain sum; a finite sum too
    large for float64 is +-inf)."""
    d = math.prod(norm_shape)
    # Records first, features last: one column per feature.
    columns = np.moveaxis(terms, list(records), list(range(len(records)))).reshape(-1, d)
    if len(columns) <= 2:
        # One or two terms: their float64 sum is the exact sum rounded once
        # (and overflows to +-inf, propagates NaN, as the loop below does),
        # without a Python loop over (possibly 2^20) features.
        with np.errstate(over="ignore", invalid="ignore"):
            total: NDArray[np.float64] = columns.sum(axis=0).reshape(norm_shape)
        return total
    out: List[float] = []
    for column in columns.T:
        if not np.isfinite(column).all():
            out.append(float(np.sum(column)))
            continue
        try:
            out.append(math.fsum(column.tolist()))
        except OverflowError:
            out.append(math.copysign(math.inf, float(np.sum(column / 2.0))))
    return np.array(out, dtype=np.float64).reshape(norm_shape)


class ReferenceRMSGrads(NamedTuple):
    """What :func:`reference_rms_norm_backward` returns, in float64."""

    dx: NDArray[np.float64]
    """The gradient with respect to ``x``, shaped like ``x``."""
    dweight: NDArray[np.float64]
    """The sum over records of ``dy * xhat``, shaped like the normalized axes
    (the same for both conventions: d(1 + w)/dw = 1)."""


def reference_rms_norm_backward(
    dy: ArrayLike,
    x: ArrayLike,
    weight: Optional[ArrayLike] = None,
    eps: float = 1e-6,
    axis: Axis = -1,
    convention: str = "weight",
) -> ReferenceRMSGrads:
    """The gradients of RMS normalization, computed in float64 with NumPy.

    With ``rstd = 1 / sqrt(mean(x^2) + eps)``, ``xhat = x * rstd`` and
    ``g = dy * scale`` (``scale = weight``, or ``1 + weight`` for
    ``convention="1+weight"``), every record gets ::

        dx = rstd * (g - xhat * mean(g * xhat))

    and the weight's gradient is a sum over the records,
    ``dweight = sum(dy * xhat)``, the same for both conventions. Each
    product is rounded once to float64 and each sum is computed exactly and
    rounded once (:func:`math.fsum`), so ``dweight`` does not depend on the
    order of the records.

    Parameters
    ----------
    dy : array_like
        The gradient of the loss with respect to the forward's output,
        shaped like ``x``.
    x : array_like
        The forward's input.
    weight : array_like, optional
        The forward's weight, shaped like the normalized axes; ``None``
        means a scale of 1, whatever the convention.
    eps : float, optional
        The forward's eps, added to the mean square inside the square root.
    axis : int or tuple of ints, optional
        The normalized axis (or axes, jointly). Default -1.
    convention : {'weight', '1+weight'}, optional
        How the weight scales.

    Returns
    -------
    ReferenceRMSGrads
        ``(dx, dweight)`` in float64.

    Examples
    --------
    >>> import numpy as np, layernorm_c as lnc
    >>> g = lnc.reference_rms_norm_backward([[1.0, 0.0]], [[3.0, 4.0]], eps=0.0)
    >>> np.round(g.dx * np.sqrt(12.5) ** 3, 12)   # (ms - x0^2 / 2, -x0 x1 / 2)
    array([[ 8., -6.]])
    >>> g.dweight
    array([0.84852814, 0.        ])
    """
    if convention not in ("weight", "1+weight"):
        raise ValueError(f"convention: expected 'weight' or '1+weight', got {convention!r}")
    x, dy, axes, param_shape = _backward_inputs(dy, x, axis)
    g = dy
    if weight is not None:
        w = np.asarray(weight, np.float64).reshape(param_shape)
        g = dy * (1.0 + w if convention == "1+weight" else w)
    # Records of x and of g scaled by powers of two (exact), as in the
    # forward: no square or sum overflows or underflows.
    scale = _record_scale(x, axes)
    g_scale = _record_scale(g, axes)
    with np.errstate(under="ignore", over="ignore", invalid="ignore", divide="ignore"):
        xs = x * scale
        ms = (xs * xs).mean(axis=axes, keepdims=True)
        denom = np.sqrt(ms + eps * scale * scale)
        if eps > 0:
            # denom is infinite only where the scaled eps overflowed (a tiny
            # record): there the mean square is negligible beside eps.
            finite = np.isfinite(denom)
            xhat = np.where(finite, xs / np.where(finite, denom, 1.0), x / math.sqrt(eps))
            rstd = np.where(finite, scale / np.where(finite, denom, 1.0), 1.0 / math.sqrt(eps))
        else:
            xhat = xs / denom
            rstd = scale / denom
        gs = g * g_scale
        mean_gx = (gs * xhat).mean(axis=axes, keepdims=True)
        dx = (gs - xhat * mean_gx) * (rstd / g_scale)
    records = tuple(a for a in range(x.ndim) if a not in axes)
    norm_shape = tuple(x.shape[a] for a in axes)
    with np.errstate(invalid="ignore", over="ignore"):
        dweight = _exact_sum(dy * xhat, records, norm_shape)
    return ReferenceRMSGrads(dx, dweight)
