"""A plain NumPy LayerNorm in float64: the oracle the C core is tested against.

It follows the textbook definition step by step (two-pass centered variance,
population variance, eps inside the square root) and favours clarity over
speed, like bottleneck's ``bn.slow`` functions.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence, Tuple, Union

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
    given: Sequence[int] = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    axes = tuple(sorted(int(a) % x.ndim for a in given))
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
        else:
            y = centered / denom
        mean = mean / scale
        var = var / scale / scale
    param_shape = [1] * x.ndim
    for a in axes:
        param_shape[a] = x.shape[a]
    if weight is not None:
        y = y * np.asarray(weight, dtype=np.float64).reshape(param_shape)
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64).reshape(param_shape)
    return ReferenceResult(y, np.squeeze(mean, axes), np.squeeze(var, axes))


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
