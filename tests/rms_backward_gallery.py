"""A gallery of RMSNorm backward passes in NumPy, each broken in one way.

They are what ``layernorm_c.testing.RMSNormBackwardAudit`` must catch and
name. All take ``(dy, x, weight, eps)`` and return ``(dx, dweight)``,
computed in float64 apart from their defect and rounded to x's dtype.
"""
import numpy as np


def _backward(dy, x, weight, eps, *, plus_one=False, eps_outside=False, mean_path=0.0,
              var_path=1.0, dweight_sign=1.0):
    """The RMSNorm backward with the defects asked for: ``plus_one`` scales
    by 1 + weight, ``eps_outside`` puts eps on the root mean square,
    ``mean_path`` 1 adds LayerNorm's term through the mean, ``var_path`` 0
    drops the term through the mean square, ``dweight_sign`` -1 negates
    dweight."""
    x = np.asarray(x)
    x64 = x.astype(np.float64)
    dy64 = np.asarray(dy, np.float64)
    ms = (x64 * x64).mean(axis=-1, keepdims=True)
    rstd = 1.0 / (np.sqrt(ms) + eps) if eps_outside else 1.0 / np.sqrt(ms + eps)
    xhat = x64 * rstd
    g = dy64
    if weight is not None:
        w = np.asarray(weight, np.float64)
        g = dy64 * (1.0 + w if plus_one else w)
    dx = rstd * (g - mean_path * g.mean(axis=-1, keepdims=True)
                 - var_path * xhat * (g * xhat).mean(axis=-1, keepdims=True))
    dweight = dweight_sign * (dy64 * xhat).reshape(-1, x.shape[-1]).sum(axis=0)
    return dx.astype(x.dtype), dweight.astype(x.dtype)


def correct(dy, x, weight, eps):
    """The textbook RMSNorm backward."""
    return _backward(dy, x, weight, eps)


def gemma(dy, x, weight, eps):
    """Correct for convention='1+weight'."""
    return _backward(dy, x, weight, eps, plus_one=True)


def mean_path_included(dy, x, weight, eps):
    """LayerNorm's backward formula: subtracts mean(g) too."""
    return _backward(dy, x, weight, eps, mean_path=1.0)


def eps_outside_sqrt(dy, x, weight, eps):
    """rstd = 1 / (sqrt(mean(x^2)) + eps) in the backward."""
    return _backward(dy, x, weight, eps, eps_outside=True)


def rms_constant(dy, x, weight, eps):
    """Treats the root mean square as a constant: dx = rstd * g."""
    return _backward(dy, x, weight, eps, var_path=0.0)


def plus_one_scale(dy, x, weight, eps):
    """Computes g with 1 + weight (Gemma's) where the forward scales by weight."""
    return _backward(dy, x, weight, eps, plus_one=True)


def dweight_negated(dy, x, weight, eps):
    """dweight = -sum(dy * xhat)."""
    return _backward(dy, x, weight, eps, dweight_sign=-1.0)


def sequential_float32(dy, x, weight, eps):
    """In float32, the sums over the record (the mean square and
    mean(g * xhat)) running sums, a naive loop's: dx's error grows with d."""
    x = np.asarray(x)
    x32, dy32 = x.astype(np.float32), np.asarray(dy).astype(np.float32)
    d = np.float32(x32.shape[-1])

    def mean(a):
        return np.cumsum(a, axis=-1)[..., -1:] / d

    rstd = np.float32(1) / np.sqrt(mean(x32 * x32) + np.float32(eps))
    xhat = x32 * rstd
    g = dy32 if weight is None else dy32 * np.asarray(weight, np.float32)
    dx = rstd * (g - xhat * mean(g * xhat))
    dweight = (dy32 * xhat).reshape(-1, x.shape[-1]).sum(axis=0)
    return dx.astype(x.dtype), dweight.astype(x.dtype)
