"""A gallery of RMSNorm backward passes in NumPy, each broken in one way.

They are what ``layernorm_c.testing.RMSNormBackwardAudit`` must catch and
name. All take ``(dy, x, weight, eps)`` and return ``(dx, dweight)``,
computed in float64 apart from their defect and rounded to x's dtype.
"""
import numpy as np


def _parts(dy, x, weight, eps, plus_one=False, eps_outside=False):
    x64 = np.asarray(x, np.float64)
    dy64 = np.asarray(dy, np.float64)
    ms = (x64 * x64).mean(axis=-1, keepdims=True)
    rstd = 1.0 / (np.sqrt(ms) + eps) if eps_outside else 1.0 / np.sqrt(ms + eps)
    xhat = x64 * rstd
    g = dy64
    if weight is not None:
        w = np.asarray(weight, np.float64)
        g = dy64 * (1.0 + w if plus_one else w)
    return dy64, xhat, rstd, g


def _out(x, dx, dweight):
    x = np.asarray(x)
    d = x.shape[-1]
    return dx.astype(x.dtype), dweight.reshape(-1, d).sum(axis=0).astype(x.dtype)


def correct(dy, x, weight, eps):
    """The textbook RMSNorm backward."""
    dy64, xhat, rstd, g = _parts(dy, x, weight, eps)
    dx = rstd * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return _out(x, dx, dy64 * xhat)


def gemma(dy, x, weight, eps):
    """Correct for convention='1+weight'."""
    dy64, xhat, rstd, g = _parts(dy, x, weight, eps, plus_one=True)
    dx = rstd * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return _out(x, dx, dy64 * xhat)


def mean_path_included(dy, x, weight, eps):
    """LayerNorm's backward formula: subtracts mean(g) too."""
    dy64, xhat, rstd, g = _parts(dy, x, weight, eps)
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return _out(x, dx, dy64 * xhat)


def eps_outside_sqrt(dy, x, weight, eps):
    """rstd = 1 / (sqrt(mean(x^2)) + eps) in the backward."""
    dy64, xhat, rstd, g = _parts(dy, x, weight, eps, eps_outside=True)
    dx = rstd * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return _out(x, dx, dy64 * xhat)


def rms_constant(dy, x, weight, eps):
    """Treats the root mean square as a constant: dx = rstd * g."""
    dy64, xhat, rstd, g = _parts(dy, x, weight, eps)
    return _out(x, rstd * g, dy64 * xhat)


def plus_one_scale(dy, x, weight, eps):
    """Computes g with 1 + weight (Gemma's) where the forward scales by weight."""
    dy64, xhat, rstd, g = _parts(dy, x, weight, eps, plus_one=True)
    dx = rstd * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return _out(x, dx, dy64 * xhat)


def dweight_negated(dy, x, weight, eps):
    """dweight = -sum(dy * xhat)."""
    dy64, xhat, rstd, g = _parts(dy, x, weight, eps)
    dx = rstd * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return _out(x, dx, -dy64 * xhat)
