"""A gallery of LayerNorm implementations in NumPy, each broken in one way.

They are what the validation battery (``layernorm_c.testing``) must catch and
name. All take ``(x, weight, bias, eps)`` and return an array of x's dtype.
Apart from their one defect they compute in float64 (float32 where the
defect needs it), so the other checks see a correct LayerNorm.
"""
import numpy as np


def _affine(y, weight, bias):
    if weight is not None:
        y = y * np.asarray(weight, np.float64)
    if bias is not None:
        y = y + np.asarray(bias, np.float64)
    return y


def _layer_norm64(x, weight, bias, eps, axis=-1, ddof=0):
    """A float64 LayerNorm with statistics over ``axis`` (the defects below
    pick the wrong one or the wrong ddof)."""
    x64 = np.asarray(x, np.float64)
    mean = x64.mean(axis=axis, keepdims=True)
    var = x64.var(axis=axis, ddof=ddof, keepdims=True)
    return _affine((x64 - mean) / np.sqrt(var + eps), weight, bias)


def _stats64(x):
    x64 = np.asarray(x, np.float64)
    mean = x64.mean(axis=-1, keepdims=True)
    return x64, mean, ((x64 - mean) ** 2).mean(axis=-1, keepdims=True)


def numpy_float32(x, weight, bias, eps):
    """Correct: a hand-rolled prototype in float32 (float64 for float64
    input), two-pass variance."""
    x = np.asarray(x)
    work = np.float64 if x.dtype == np.float64 else np.float32
    xw = x.astype(work)
    mean = xw.mean(axis=-1, keepdims=True)
    centered = xw - mean
    var = (centered * centered).mean(axis=-1, keepdims=True)
    y = centered / np.sqrt(var + work(eps))
    if weight is not None:
        y = y * np.asarray(weight, work)
    if bias is not None:
        y = y + np.asarray(bias, work)
    return y.astype(x.dtype)


def sample_variance(x, weight, bias, eps):
    """Divides the variance by d - 1 (``np.var(ddof=1)``)."""
    return _layer_norm64(x, weight, bias, eps, ddof=1).astype(np.asarray(x).dtype)


def batch_statistics(x, weight, bias, eps):
    """Batch-norm style: statistics down the batch axis (axis 0)."""
    return _layer_norm64(x, weight, bias, eps, axis=0).astype(np.asarray(x).dtype)


def position_coupling(x, weight, bias, eps):
    """Statistics over the last two axes, (T, d): every position of a
    sequence shares them."""
    x = np.asarray(x)
    axes = (-2, -1) if x.ndim >= 2 else -1
    return _layer_norm64(x, weight, bias, eps, axis=axes).astype(x.dtype)


class RunningStatistics:
    """Keeps a running variance across calls (momentum 0.1) and blends it
    into every record's own variance, like a training-mode normalization
    layer."""

    def __init__(self):
        self.running_var = None

    def __call__(self, x, weight, bias, eps):
        x64, mean, var = _stats64(x)
        used = var if self.running_var is None else 0.9 * var + 0.1 * self.running_var
        self.running_var = float(var.mean())
        return _affine((x64 - mean) / np.sqrt(used + eps), weight, bias).astype(x.dtype)


def eps_on_std(x, weight, bias, eps):
    """Adds eps to the standard deviation: (x - mean) / (std + eps)."""
    x64, mean, var = _stats64(x)
    return _affine((x64 - mean) / (np.sqrt(var) + eps), weight, bias).astype(x.dtype)


def eps_ignored(x, weight, bias, eps):
    """Never uses eps."""
    x64, mean, var = _stats64(x)
    return _affine((x64 - mean) / np.sqrt(var), weight, bias).astype(x.dtype)


def eps_twice(x, weight, bias, eps):
    """Adds eps to the variance, then again inside the reciprocal square root."""
    x64, mean, var = _stats64(x)
    var = var + eps
    return _affine((x64 - mean) / np.sqrt(var + eps), weight, bias).astype(x.dtype)


def gain_before_normalization(x, weight, bias, eps):
    """Scales the input by the gain, then normalizes (which undoes it)."""
    x = np.asarray(x)
    scaled = np.asarray(x, np.float64) * np.asarray(weight, np.float64)
    return _layer_norm64(scaled, None, bias, eps).astype(x.dtype)


def bias_missing(x, weight, bias, eps):
    """Applies the gain and forgets the bias."""
    return _layer_norm64(x, weight, None, eps).astype(np.asarray(x).dtype)


def params_wrong_axis(x, weight, bias, eps):
    """Broadcasts weight and bias over records (``weight[:, None]``), as in a
    channels-first layout; only runs when there are d records."""
    x = np.asarray(x)
    y = _layer_norm64(x, None, None, eps)
    w = np.asarray(weight, np.float64)[:, None]
    b = np.asarray(bias, np.float64)[:, None]
    return (y * w + b).astype(x.dtype)


def scalar_gain(x, weight, bias, eps):
    """One scalar gain (the mean of weight) for every feature."""
    x = np.asarray(x)
    y = _layer_norm64(x, None, bias, eps)
    b = 0.0 if bias is None else np.asarray(bias, np.float64)
    return ((y - b) * np.mean(weight) + b).astype(x.dtype)


def one_pass_float32(x, weight, bias, eps):
    """Variance as E[x^2] - E[x]^2 in float32."""
    x = np.asarray(x)
    x32 = x.astype(np.float32)
    mean = x32.mean(axis=-1, keepdims=True)
    var = (x32 * x32).mean(axis=-1, keepdims=True) - mean * mean
    y = (x32 - mean) / np.sqrt(var + np.float32(eps))
    return _affine(y, weight, bias).astype(x.dtype)


def float16_native(x, weight, bias, eps):
    """Like ``numpy_float32`` but computes in the input dtype, so float16
    sums and squares overflow above 65504."""
    x = np.asarray(x)
    mean = np.sum(x, axis=-1, keepdims=True, dtype=x.dtype) / x.dtype.type(x.shape[-1])
    centered = x - mean
    var = np.sum(centered * centered, axis=-1, keepdims=True, dtype=x.dtype) / x.shape[-1]
    y = centered / np.sqrt(var + x.dtype.type(eps))
    if weight is not None:
        y = y * np.asarray(weight, x.dtype)
    if bias is not None:
        y = y + np.asarray(bias, x.dtype)
    return y.astype(x.dtype)


def batch_max_scaling(x, weight, bias, eps):
    """Divides the whole batch by a power of two from its largest magnitude
    (exact, to keep squares small): a NaN or Inf anywhere poisons every
    record."""
    x = np.asarray(x)
    x64 = np.asarray(x, np.float64)
    scale = 2.0 ** np.ceil(np.log2(np.max(np.abs(x64)) + 1.0))
    return _layer_norm64(x64 / scale, weight, bias, eps / scale ** 2).astype(x.dtype)


def order_depends_on_batch(x, weight, bias, eps):
    """Correct in float32, but sums sequentially for an odd number of records
    and pairwise for an even number: not bit-for-bit batch-invariant."""
    x = np.asarray(x)
    x32 = x.astype(np.float32)
    d = x32.shape[-1]
    odd = (x32.size // d) % 2 == 1

    def total(a):
        return np.cumsum(a, axis=-1)[..., -1:] if odd else a.sum(axis=-1, keepdims=True)

    mean = total(x32) / np.float32(d)
    centered = x32 - mean
    var = total(centered * centered) / np.float32(d)
    y = centered / np.sqrt(var + np.float32(eps))
    if weight is not None:
        y = y * np.asarray(weight, np.float32)
    if bias is not None:
        y = y + np.asarray(bias, np.float32)
    return y.astype(x.dtype)


def _running_sum(a):
    """The sum over the last axis as one running sum, element after element
    (a plain loop's order, in a's dtype)."""
    return np.cumsum(a, axis=-1)[..., -1:]


def sequential_float32(x, weight, bias, eps):
    """Two passes in float32, each sum a single running sum (a naive loop):
    correct at small d, but the sums' rounding error grows with d."""
    x = np.asarray(x)
    x32 = x.astype(np.float32)
    d = x32.shape[-1]
    mean = _running_sum(x32) / np.float32(d)
    centered = x32 - mean
    var = _running_sum(centered * centered) / np.float32(d)
    y = centered / np.sqrt(var + np.float32(eps))
    return _affine(y, weight, bias).astype(x.dtype)


#: The eps ``builtin_eps`` uses whatever it is told.
BUILTIN_EPS = 1e-3


def builtin_eps(x, weight, bias):
    """Takes no eps and uses its own, 1e-3: audited with the default 1e-5
    (``signature="x, weight, bias"``), it uses another eps than declared."""
    x64, mean, var = _stats64(x)
    return _affine((x64 - mean) / np.sqrt(var + BUILTIN_EPS), weight,
                   bias).astype(np.asarray(x).dtype)


def float32_eps(x, weight, bias, eps):
    """Correct in float64, but eps is rounded to float32 first, as an ONNX
    model stores it (a float attribute): eps=1e-5 is 9.99999974737875e-06,
    which float64 outputs show."""
    return _layer_norm64(x, weight, bias, float(np.float32(eps))).astype(np.asarray(x).dtype)
