"""A gallery of RMSNorm implementations in NumPy, each broken in one way.

They are what the RMSNorm battery (``layernorm_c.testing.RMSNormAudit``)
must catch and name. All take ``(x, weight, eps)`` and return an array of
x's dtype. Apart from their one defect they compute in float64 (in the
input's dtype or float32 where the defect needs it), so the other checks
see a correct RMSNorm.
"""
import numpy as np


def _scaled(y, weight, plus_one=False):
    if weight is not None:
        w = np.asarray(weight, np.float64)
        y = y * (1.0 + w if plus_one else w)
    return y


def _ms(x64, axis=-1, ddof=0):
    d = np.prod([x64.shape[a] for a in np.atleast_1d(axis)])
    return (x64 * x64).sum(axis=axis, keepdims=True) / (d - ddof)


def numpy_float64(x, weight, eps):
    """Correct: the textbook RMSNorm in float64, rounded to x's dtype."""
    x = np.asarray(x)
    x64 = x.astype(np.float64)
    return _scaled(x64 / np.sqrt(_ms(x64) + eps), weight).astype(x.dtype)


def numpy_float32(x, weight, eps):
    """Correct: a prototype in float32 (float64 for float64 input)."""
    x = np.asarray(x)
    work = np.float64 if x.dtype == np.float64 else np.float32
    xw = x.astype(work)
    y = xw / np.sqrt((xw * xw).mean(axis=-1, keepdims=True) + work(eps))
    if weight is not None:
        y = y * np.asarray(weight, work)
    return y.astype(x.dtype)


def gemma_float64(x, weight, eps):
    """Correct for convention='1+weight': scales by 1 + weight."""
    x = np.asarray(x)
    x64 = x.astype(np.float64)
    return _scaled(x64 / np.sqrt(_ms(x64) + eps), weight, plus_one=True).astype(x.dtype)


def mean_subtracted(x, weight, eps):
    """Centres each record first: a LayerNorm without bias."""
    x = np.asarray(x)
    x64 = x.astype(np.float64)
    c = x64 - x64.mean(axis=-1, keepdims=True)
    return _scaled(c / np.sqrt(_ms(c) + eps), weight).astype(x.dtype)


def eps_outside_sqrt(x, weight, eps):
    """x / (sqrt(mean(x^2)) + eps)."""
    x = np.asarray(x)
    x64 = x.astype(np.float64)
    return _scaled(x64 / (np.sqrt(_ms(x64)) + eps), weight).astype(x.dtype)


def eps_ignored(x, weight, eps):
    """Never uses eps."""
    x = np.asarray(x)
    x64 = x.astype(np.float64)
    return _scaled(x64 / np.sqrt(_ms(x64)), weight).astype(x.dtype)


def sqrt_missing(x, weight, eps):
    """Divides by the mean square itself: x / (mean(x^2) + eps)."""
    x = np.asarray(x)
    x64 = x.astype(np.float64)
    return _scaled(x64 / (_ms(x64) + eps), weight).astype(x.dtype)


def divided_by_d_minus_1(x, weight, eps):
    """sum(x^2) / (d - 1), a sample-variance habit."""
    x = np.asarray(x)
    x64 = x.astype(np.float64)
    return _scaled(x64 / np.sqrt(_ms(x64, ddof=1) + eps), weight).astype(x.dtype)


def squares_in_float16(x, weight, eps):
    """Squares in the input's dtype (float16 overflows above 256), sums in
    float64."""
    x = np.asarray(x)
    squares = (x * x).astype(np.float64)
    ms = squares.mean(axis=-1, keepdims=True)
    return _scaled(x.astype(np.float64) / np.sqrt(ms + eps), weight).astype(x.dtype)


def accumulated_in_16_bits(x, weight, eps):
    """Squares in float32, but their running sum kept in the input's dtype
    when it is 16-bit (float16, bfloat16): a kernel whose accumulator has
    the storage type."""
    x = np.asarray(x)
    acc = x.dtype if x.dtype.itemsize == 2 else np.dtype(np.float64)
    squares = (x.astype(np.float32) ** 2).astype(acc)
    total = np.cumsum(squares, axis=-1, dtype=acc)[..., -1:].astype(np.float64)
    ms = total / x.shape[-1]
    return _scaled(x.astype(np.float64) / np.sqrt(ms + eps), weight).astype(x.dtype)


def plus_one_weight(x, weight, eps):
    """Scales by 1 + weight (Gemma) where weight is meant."""
    return gemma_float64(x, weight, eps)


def weight_missing(x, weight, eps):
    """Takes a weight and never applies it."""
    return numpy_float64(x, None, eps)


def batch_mean_square(x, weight, eps):
    """The mean square over the whole batch (all records), not per record."""
    x = np.asarray(x)
    x64 = x.astype(np.float64)
    axes = tuple(range(x64.ndim))
    return _scaled(x64 / np.sqrt(_ms(x64, axis=axes) + eps), weight).astype(x.dtype)


class RunningMeanSquare:
    """Blends a running mean square across calls (momentum 0.1) into every
    record's own."""

    def __init__(self):
        self.running = None

    def __call__(self, x, weight, eps):
        x = np.asarray(x)
        x64 = x.astype(np.float64)
        ms = _ms(x64)
        used = ms if self.running is None else 0.9 * ms + 0.1 * self.running
        self.running = float(ms.mean())
        return _scaled(x64 / np.sqrt(used + eps), weight).astype(x.dtype)


def batch_max_scaling(x, weight, eps):
    """Divides the whole batch by a power of two from its largest magnitude
    (to keep squares small): a NaN or Inf anywhere poisons every record."""
    x = np.asarray(x)
    x64 = x.astype(np.float64)
    scale = 2.0 ** np.ceil(np.log2(np.max(np.abs(x64)) + 1.0))
    return numpy_float64(x64 / scale, weight, eps / scale ** 2).astype(x.dtype)


def order_depends_on_batch(x, weight, eps):
    """Correct in float32, but sums sequentially for an odd number of
    records and pairwise for an even number: not bit-for-bit
    batch-invariant."""
    x = np.asarray(x)
    x32 = x.astype(np.float32)
    d = x32.shape[-1]
    odd = (x32.size // d) % 2 == 1
    squares = x32 * x32
    total = (np.cumsum(squares, axis=-1)[..., -1:] if odd
             else squares.sum(axis=-1, keepdims=True))
    y = x32 / np.sqrt(total / np.float32(d) + np.float32(eps))
    if weight is not None:
        y = y * np.asarray(weight, np.float32)
    return y.astype(x.dtype)


def sequential_float32(x, weight, eps):
    """In float32, the sum of squares one running sum (a naive loop):
    correct at small d, but its rounding error grows with d."""
    x = np.asarray(x)
    x32 = x.astype(np.float32)
    ms = np.cumsum(x32 * x32, axis=-1)[..., -1:] / np.float32(x32.shape[-1])
    y = x32 / np.sqrt(ms + np.float32(eps))
    if weight is not None:
        y = y * np.asarray(weight, np.float32)
    return y.astype(x.dtype)


#: The eps ``builtin_eps`` uses whatever it is told.
BUILTIN_EPS = 1e-5


def builtin_eps(x, weight):
    """Takes no eps and uses its own, 1e-5: audited with RMSNorm's default
    1e-6 (``signature="x, weight"``), it uses another eps than declared."""
    return numpy_float64(x, weight, BUILTIN_EPS)


def float32_eps(x, weight, eps):
    """Correct in float64, but eps rounded to float32 first (as an ONNX
    attribute stores it)."""
    return numpy_float64(x, weight, float(np.float32(eps)))
