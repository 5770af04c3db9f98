"""A gallery of LayerNorm backward passes in NumPy, each broken in one way.

They are what the backward battery (``layernorm_c.testing``'s
``LayerNormBackwardAudit``) must catch and name. All take
``(dy, x, weight, bias, eps)`` and return ``(dx, dweight, dbias)``, dx in
x's dtype and the parameter gradients in float64. Apart from their one
defect they compute in float64 (float32 or float16 where the defect needs
it), and sum the parameter gradients exactly (so their bits do not depend
on the order of the records), so the other checks see a correct backward.
"""
import math

import numpy as np


def _sum(terms):
    """The sum over the records (all axes but the last) of each feature's
    terms, exact and rounded once: independent of the records' order."""
    flat = np.asarray(terms, np.float64).reshape(-1, np.shape(terms)[-1])
    if len(flat) <= 2:
        return flat.sum(axis=0)  # a sum of two is rounded once: exact and fast at large d
    return np.array([math.fsum(column) for column in flat.T.tolist()])


def _textbook(dy, x, weight, eps, *, mean_path=1.0, var_path=1.0, sign=1.0, ddof=0,
              means_over=-1):
    """The textbook backward in float64, with the knobs the defects turn:
    the factors of the mean and variance paths, dx's sign, the variance's
    ddof, and the axes of mean(g) and mean(g * xhat) (-1: the record's)."""
    x64 = np.asarray(x, np.float64)
    dy64 = np.asarray(dy, np.float64)
    d = x64.shape[-1]
    mean = x64.mean(axis=-1, keepdims=True)
    c = x64 - mean
    var = (c * c).sum(axis=-1, keepdims=True) / (d - ddof)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = c * rstd
    g = dy64 if weight is None else dy64 * np.asarray(weight, np.float64)
    mean_g = g.mean(axis=means_over, keepdims=True)
    mean_gx = (g * xhat).mean(axis=means_over, keepdims=True)
    dx = sign * rstd * (g - mean_path * mean_g - var_path * xhat * mean_gx)
    return dx.astype(np.asarray(x).dtype), _sum(dy64 * xhat), _sum(dy64)


def numpy_float32(dy, x, weight, bias, eps):
    """Correct: a hand-written backward in float32 (float64 for float64
    input), statistics recomputed in two passes; the parameter gradients
    summed exactly and rounded to the working dtype."""
    x = np.asarray(x)
    work = np.float64 if x.dtype == np.float64 else np.float32
    xw, dyw = x.astype(work), np.asarray(dy).astype(work)
    mean = xw.mean(axis=-1, keepdims=True)
    c = xw - mean
    rstd = 1 / np.sqrt((c * c).mean(axis=-1, keepdims=True) + work(eps))
    xhat = c * rstd
    g = dyw if weight is None else dyw * np.asarray(weight, work)
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx.astype(x.dtype), _sum(dyw * xhat).astype(work), _sum(dyw).astype(work)


def statistics_constant(dy, x, weight, bias, eps):
    """Treats the mean and the variance as constants: dx = rstd * g."""
    return _textbook(dy, x, weight, eps, mean_path=0.0, var_path=0.0)


def mean_path_missing(dy, x, weight, bias, eps):
    """No gradient through the mean: drops -rstd * mean(g)."""
    return _textbook(dy, x, weight, eps, mean_path=0.0)


def variance_path_missing(dy, x, weight, bias, eps):
    """No gradient through the variance: drops -rstd * xhat * mean(g * xhat)."""
    return _textbook(dy, x, weight, eps, var_path=0.0)


def sample_variance(dy, x, weight, bias, eps):
    """Recomputes the statistics with the sample variance (ddof=1)."""
    return _textbook(dy, x, weight, eps, ddof=1)


def eps_hard_coded(dy, x, weight, bias, eps):
    """Ignores the eps it is given and uses 1e-5 (a default argument)."""
    return _textbook(dy, x, weight, 1e-5)


def eps_ignored(dy, x, weight, bias, eps):
    """Leaves eps out of the backward's rstd."""
    return _textbook(dy, x, weight, 0.0)


def eps_twice(dy, x, weight, bias, eps):
    """Adds eps to a variance that already has it."""
    return _textbook(dy, x, weight, 2 * eps)


def eps_on_std(dy, x, weight, bias, eps):
    """rstd = 1 / (std + eps) in the backward."""
    x64, dy64 = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    c = x64 - x64.mean(axis=-1, keepdims=True)
    rstd = 1.0 / (np.sqrt((c * c).mean(axis=-1, keepdims=True)) + eps)
    xhat = c * rstd
    g = dy64 * np.asarray(weight, np.float64)
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx.astype(np.asarray(x).dtype), _sum(dy64 * xhat), _sum(dy64)


def sign_error(dy, x, weight, bias, eps):
    """Returns the negative of dx."""
    return _textbook(dy, x, weight, eps, sign=-1.0)


def variance_term_sign(dy, x, weight, bias, eps):
    """Adds the variance term instead of subtracting it."""
    return _textbook(dy, x, weight, eps, var_path=-1.0)


def parameter_gradients_negated(dy, x, weight, bias, eps):
    """dweight = -sum(dy * xhat), dbias = -sum(dy)."""
    dx, dweight, dbias = _textbook(dy, x, weight, eps)
    return dx, -dweight, -dbias


def dweight_from_output(dy, x, weight, bias, eps):
    """dweight = sum(dy * y), the forward's output, instead of sum(dy * xhat)."""
    dx, _, dbias = _textbook(dy, x, weight, eps)
    x64 = np.asarray(x, np.float64)
    mean = x64.mean(axis=-1, keepdims=True)
    xhat = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    y = xhat * np.asarray(weight, np.float64) + np.asarray(bias, np.float64)
    return dx, _sum(np.asarray(dy, np.float64) * y), dbias


def sums_over_batch_only(dy, x, weight, bias, eps):
    """Sums dweight and dbias over axis 0 only: right for (n, d) input, over
    the batch but not the positions for (B, T, d)."""
    dx, _, _ = _textbook(dy, x, weight, eps)
    x64 = np.asarray(x, np.float64)
    mean = x64.mean(axis=-1, keepdims=True)
    xhat = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    dy64 = np.asarray(dy, np.float64)
    return dx, (dy64 * xhat).sum(axis=0), dy64.sum(axis=0)


def sums_averaged(dy, x, weight, bias, eps):
    """Averages dweight and dbias over the records instead of summing."""
    dx, dweight, dbias = _textbook(dy, x, weight, eps)
    n = np.asarray(x).size // np.asarray(x).shape[-1]
    return dx, dweight / n, dbias / n


def batch_coupled(dy, x, weight, bias, eps):
    """Takes mean(g) and mean(g * xhat) over the whole batch, not per record."""
    x = np.asarray(x)
    return _textbook(dy, x, weight, eps, means_over=tuple(range(x.ndim)))


def order_dependent_sums(dy, x, weight, bias, eps):
    """Correct, but accumulates dweight and dbias in float32 record after
    record: their bits depend on the order of the records."""
    dx, _, _ = _textbook(dy, x, weight, eps)
    x64 = np.asarray(x, np.float64)
    d = x64.shape[-1]
    mean = x64.mean(axis=-1, keepdims=True)
    xhat = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    terms_w = (np.asarray(dy, np.float64) * xhat).astype(np.float32).reshape(-1, d)
    terms_b = np.asarray(dy, np.float32).reshape(-1, d)
    dweight, dbias = np.zeros(d, np.float32), np.zeros(d, np.float32)
    for tw, tb in zip(terms_w, terms_b):
        dweight += tw
        dbias += tb
    return dx, dweight, dbias


def _mean32(a):
    """A float32 mean whose sum does not grow with d (float64 totals, on
    every NumPy: 1.x sums some axes sequentially), so that the defect
    below is the only one."""
    return a.mean(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)


def one_pass_float32(dy, x, weight, bias, eps):
    """Recomputes the variance as E[x^2] - E[x]^2 in float32."""
    x = np.asarray(x)
    x32, dy32 = x.astype(np.float32), np.asarray(dy).astype(np.float32)
    mean = _mean32(x32)
    var = _mean32(x32 * x32) - mean * mean
    rstd = 1 / np.sqrt(var + np.float32(eps))
    xhat = (x32 - mean) * rstd
    g = dy32 * np.asarray(weight, np.float32)
    dx = rstd * (g - _mean32(g) - xhat * _mean32(g * xhat))
    return dx.astype(x.dtype), _sum(dy32 * xhat), _sum(dy32)


def float16_native(dy, x, weight, bias, eps):
    """Computes in the input dtype: float16 squares and sums overflow."""
    x, dy = np.asarray(x), np.asarray(dy)
    t = x.dtype.type
    d = x.shape[-1]
    mean = np.sum(x, axis=-1, keepdims=True, dtype=x.dtype) / t(d)
    c = x - mean
    var = np.sum(c * c, axis=-1, keepdims=True, dtype=x.dtype) / t(d)
    rstd = t(1) / np.sqrt(var + t(eps))
    xhat = c * rstd
    g = dy * np.asarray(weight, x.dtype)
    dx = rstd * (g - np.mean(g, axis=-1, keepdims=True, dtype=x.dtype)
                 - xhat * np.mean(g * xhat, axis=-1, keepdims=True, dtype=x.dtype))
    return dx.astype(x.dtype), _sum(dy * xhat), _sum(dy)


def batch_max_scaling(dy, x, weight, bias, eps):
    """Scales the whole batch by a power of two from its largest magnitude
    before the statistics (to keep squares small): a NaN or Inf anywhere
    poisons every record's dx."""
    x64 = np.asarray(x, np.float64)
    scale = 2.0 ** np.ceil(np.log2(np.max(np.abs(x64)) + 1.0))
    dx, dweight, dbias = _textbook(dy, x64 / scale, weight, eps / scale ** 2)
    return (dx / scale).astype(np.asarray(x).dtype), dweight, dbias


class AccumulatingGradients:
    """Adds each call's parameter gradients into running sums it never
    resets (a layer's .grad, never zeroed), one per feature size, and
    returns the sums."""

    def __init__(self):
        self.sums = {}

    def __call__(self, dy, x, weight, bias, eps):
        dx, dweight, dbias = _textbook(dy, x, weight, eps)
        d = dweight.shape[0]
        sw, sb = self.sums.get(d, (0.0, 0.0))
        self.sums[d] = (sw + dweight, sb + dbias)
        return dx, self.sums[d][0].copy(), self.sums[d][1].copy()


def sequential_float32(dy, x, weight, bias, eps):
    """In float32, every sum over the record (the statistics, mean(g),
    mean(g * xhat)) one running sum, a naive loop's: correct at small d,
    but dx's error grows with d."""
    x = np.asarray(x)
    x32, dy32 = x.astype(np.float32), np.asarray(dy).astype(np.float32)
    d = np.float32(x32.shape[-1])

    def mean(a):
        return np.cumsum(a, axis=-1)[..., -1:] / d

    c = x32 - mean(x32)
    rstd = np.float32(1) / np.sqrt(mean(c * c) + np.float32(eps))
    xhat = c * rstd
    g = dy32 if weight is None else dy32 * np.asarray(weight, np.float32)
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    return dx.astype(x.dtype), _sum(dy32 * xhat).astype(np.float32), _sum(dy32).astype(np.float32)


def float32_eps(dy, x, weight, bias, eps):
    """The textbook backward, with eps rounded to float32 first (as an ONNX
    attribute stores it)."""
    return _textbook(dy, x, weight, float(np.float32(eps)))
