"""An RMSNorm as it is often first written for a LLaMA-style NumPy model,
and the same one fixed: docs/validating.rst audits both ("Validating an
RMSNorm"). ``python -m layernorm_c audit --op rms_norm
examples/my_rms_norm.py:rms_norm`` prints the report of the first."""
import numpy as np


def rms_norm(x, weight, eps):
    """x / rms(x) * weight, computed in x's dtype, eps added to the rms."""
    rms = np.sqrt(np.mean(x * x, axis=-1, keepdims=True))
    return x / (rms + eps) * weight


def rms_norm_fixed(x, weight, eps):
    """The same in float32 (float64 for float64 input), eps inside the
    square root, rounded once to x's dtype."""
    work = np.float64 if x.dtype == np.float64 else np.float32
    h = x.astype(work)
    y = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + work(eps))
    return (y * weight.astype(work)).astype(x.dtype)
