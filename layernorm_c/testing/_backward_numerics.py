"""Numerical helpers of the backward checks: tolerances for dx and the
parameter gradients, the float64 models of backward defects, and the
decomposition of a measured dx into the three terms of the formula.

Every model of dx has the form, per record (``g = dy * weight``,
``c = x - mean(x)``, ``r`` the reciprocal standard deviation)::

    dx = sign * (r * (g - a * mean(g)) - b * r**3 * c * mean(g * c))

with ``a = b = sign = 1`` and ``r = 1 / sqrt(var + eps)`` for the correct
backward. Regressing a measured dx on ``g``, ``1`` and ``c`` record by record
therefore gives ``sign * r``, ``a`` and ``b`` directly (:func:`decompose_dx`),
and the checks read the defect from these coefficients.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import numpy.typing as npt

from ._numerics import TOLERANCES, Tolerance

__all__ = ["BackwardTolerance", "backward_tolerance", "Terms", "record_terms",
           "model_dx", "Decomposition", "decompose_dx"]

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class BackwardTolerance:
    """The allowed error of a backward's outputs, in units of their natural
    scale.

    ``dx`` is compared record by record in units of ``rstd * rms(g)``, the
    size of the terms it is computed from (``g = dy * weight``): a correct
    backward loses a few ulps of *that*, however small dx itself comes out
    after the cancellation of its terms. ``dweight`` and ``dbias`` are
    compared feature by feature in units of the sum of the magnitudes of
    their terms (``sum |dy * xhat|``, ``sum |dy|``).
    """

    dx: Tolerance
    params: Tolerance

    def dx_units(self, got: npt.ArrayLike, want: npt.ArrayLike,
                 scale: npt.ArrayLike) -> F64:
        """Elementwise error of dx in tolerance units; ``scale`` per record
        (shape ``(..., 1)``)."""
        s = np.asarray(scale, np.float64)
        with np.errstate(all="ignore"):
            return self.dx.units(np.asarray(got, np.float64) / s,
                                 np.asarray(want, np.float64) / s)

    def param_units(self, got: npt.ArrayLike, want: npt.ArrayLike,
                    magnitude: npt.ArrayLike) -> F64:
        """Error of a parameter gradient in tolerance units; ``magnitude``
        per feature (the sum of its terms' magnitudes)."""
        m = np.asarray(magnitude, np.float64)
        # A feature whose terms are all 0 is measured at the others' scale.
        typical = float(np.mean(m)) if m.size and np.mean(m) > 0 else 1.0
        m = np.where(m > 0, m, typical)
        with np.errstate(all="ignore"):
            return self.params.units(np.asarray(got, np.float64) / m,
                                     np.asarray(want, np.float64) / m)


def backward_tolerance(dtype: npt.DTypeLike, d: int, tol: Optional[Tolerance] = None
                       ) -> BackwardTolerance:
    """The tolerance for a backward in ``dtype`` at ``d`` features.

    The forward's tolerance of the dtype (or ``tol``, a user's override),
    widened by ``sqrt(d / 256)`` above 256 features for dx, whose terms are
    sums over the record, as a float32 accumulation's error grows with
    them. A user's override is taken as given.
    """
    if tol is not None:
        return BackwardTolerance(tol, tol)
    base = TOLERANCES[np.dtype(dtype)]
    grow = max(1.0, math.sqrt(d / 256))
    return BackwardTolerance(Tolerance(base.rtol * grow, base.atol * grow), base)


@dataclass(frozen=True)
class Terms:
    """A stack of records ``(n, d)`` in float64 and what the backward's
    formula is made of, per record (shapes ``(n, d)`` or ``(n, 1)``)."""

    g: F64
    """``dy * weight``."""
    c: F64
    """``x - mean(x)``."""
    var: F64
    """The population variance of x."""
    rstd: F64
    """``1 / sqrt(var + eps)``."""
    scale: F64
    """``rstd * rms(g)``: the size of dx's terms, the unit of its error."""

    @property
    def xhat(self) -> F64:
        out: F64 = self.c * self.rstd
        return out


def record_terms(dy: npt.ArrayLike, x: npt.ArrayLike, weight: Optional[npt.ArrayLike],
                 eps: float, *, centered: bool = True, plus_one: bool = False) -> Terms:
    """:class:`Terms` of exactly the values passed (plain float64: the
    checks' records are well scaled).

    For an RMSNorm (``centered=False``) ``c`` is x itself and ``var`` the
    mean square; ``plus_one`` scales ``g`` by ``1 + weight``. dx's models
    and decomposition then read the same: RMSNorm's dx is LayerNorm's with
    no mean path (``mean_path=0``)."""
    x64 = np.asarray(x, np.float64)
    g = np.asarray(dy, np.float64)
    if weight is not None:
        w = np.asarray(weight, np.float64)
        g = g * (1.0 + w if plus_one else w)
    c = x64 - x64.mean(axis=-1, keepdims=True) if centered else x64
    var = (c * c).mean(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        rstd = 1.0 / np.sqrt(var + eps)
    rms = np.sqrt((g * g).mean(axis=-1, keepdims=True))
    scale = rstd * np.where(rms > 0, rms, 1.0)
    return Terms(g, c, var, rstd, scale)


def model_dx(t: Terms, *, rstd: Optional[npt.ArrayLike] = None, mean_path: float = 1.0,
             var_path: float = 1.0, sign: float = 1.0) -> F64:
    """dx of a (possibly defective) backward in float64.

    Parameters
    ----------
    t : Terms
        The records.
    rstd : array_like, optional
        The reciprocal standard deviation the backward uses, per record
        (default ``t.rstd``, the correct one).
    mean_path, var_path : float
        The factors of the terms through the mean (``-mean(g)``) and through
        the variance (``-xhat * mean(g * xhat)``): 1 correct, 0 missing
        (the statistic treated as a constant), -1 a sign error.
    sign : float
        -1 flips dx.
    """
    r = t.rstd if rstd is None else np.asarray(rstd, np.float64)
    xhat = t.c * r
    out: F64 = sign * r * (t.g - mean_path * t.g.mean(axis=-1, keepdims=True)
                           - var_path * xhat * (t.g * xhat).mean(axis=-1, keepdims=True))
    return out


@dataclass(frozen=True)
class Decomposition:
    """A measured dx regressed on ``g``, ``1`` and ``c`` record by record.

    Attributes (per record, shape ``(n,)``)
    ----------
    sign_rstd : ndarray
        The coefficient of ``g``: ``sign * r``.
    mean_path : ndarray
        ``a``: the factor of the term through the mean (1 correct).
    var_path : ndarray
        ``b``: the factor of the term through the variance (1 correct).
    residual : ndarray
        What the three terms leave unexplained, in units of the record's
        scale (max over the record).
    """

    sign_rstd: F64
    mean_path: F64
    var_path: F64
    residual: F64

    @property
    def rstd(self) -> F64:
        """The reciprocal standard deviation the backward used (``|sign * r|``)."""
        out: F64 = np.abs(self.sign_rstd)
        return out


def decompose_dx(dx: npt.ArrayLike, t: Terms) -> Decomposition:
    """Regress each record of ``dx`` on ``g``, ``1`` and ``c`` (least
    squares in float64).

    The records must make the three regressors independent and give
    ``mean(g)`` and ``mean(g * c)`` a size comparable to ``g`` (the checks
    build ``g`` so), or the path factors are ill-determined.
    """
    dx64 = np.asarray(dx, np.float64).reshape(t.g.shape)
    n, d = t.g.shape[0], t.g.shape[1]
    coef = np.full((n, 3), np.nan)
    residual = np.full(n, np.inf)
    for i in range(n):
        if not np.isfinite(dx64[i]).all():
            continue
        design = np.stack([t.g[i], np.ones(d), t.c[i]], axis=1)
        solution, *_ = np.linalg.lstsq(design, dx64[i], rcond=None)
        coef[i] = solution
        fitted = design @ solution
        residual[i] = float(np.max(np.abs(dx64[i] - fitted))) / float(t.scale[i, 0])
    alpha, beta, gamma = coef[:, 0], coef[:, 1], coef[:, 2]
    mean_g = t.g.mean(axis=-1)
    mean_gc = (t.g * t.c).mean(axis=-1)
    with np.errstate(all="ignore"):
        a = -beta / (alpha * mean_g)
        b = -gamma / (alpha * alpha * alpha * mean_gc)
    return Decomposition(alpha, a, b, residual)
