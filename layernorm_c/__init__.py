"""layernorm_c: Layer Normalization over NumPy arrays, with a C core.

>>> import numpy as np, layernorm_c as lnc
>>> y = lnc.layer_norm(np.random.rand(8, 768).astype(np.float32))

Conventions: population variance (divided by d), eps inside the square
root, optional gain (``weight``) and bias of the normalized shape (2d
parameters with both; either may be absent). RMSNorm (``rms_norm``)
scales by ``weight`` (LLaMA, T5) or, named, by ``1 + weight`` (Gemma).
"""
from . import _bf16
from ._api import LayerNormResult, layer_norm, layer_norm_ufunc
from ._backward import ExactSum, LayerNormGrads, layer_norm_backward, layer_norm_backward_ufunc
from ._layer import LayerNorm, RMSNorm
from ._reference import (
    ReferenceGrads,
    ReferenceResult,
    ReferenceRMSGrads,
    ReferenceRMSResult,
    reference_layer_norm,
    reference_layer_norm_backward,
    reference_rms_norm,
    reference_rms_norm_backward,
)
from ._rms import (
    RMSNormGrads,
    RMSNormResult,
    rms_norm,
    rms_norm_backward,
    rms_norm_backward_ufunc,
    rms_norm_ufunc,
)
from ._threadpool import register_threadpoolctl
from ._settings import (
    MAX_THREADS,
    OutputCache,
    get_isa,
    get_num_threads,
    get_output_cache,
    set_isa,
    set_num_threads,
    set_output_cache,
    supported_isas,
    thread_threshold,
)

__version__ = "0.1.0"

# bfloat16 (ml_dtypes.bfloat16): the core's loops for its type number,
# registered once ml_dtypes is imported (now, or whenever it is).
_bf16.install()

# threadpoolctl sees the kernel threads (now, or once it is imported).
from . import _threadpool  # noqa: E402

_threadpool._install()

__all__ = [
    "layer_norm",
    "layer_norm_ufunc",
    "LayerNormResult",
    "layer_norm_backward",
    "layer_norm_backward_ufunc",
    "LayerNormGrads",
    "ExactSum",
    "LayerNorm",
    "rms_norm",
    "rms_norm_ufunc",
    "RMSNormResult",
    "rms_norm_backward",
    "rms_norm_backward_ufunc",
    "RMSNormGrads",
    "RMSNorm",
    "reference_layer_norm",
    "ReferenceResult",
    "reference_layer_norm_backward",
    "ReferenceGrads",
    "reference_rms_norm",
    "ReferenceRMSResult",
    "reference_rms_norm_backward",
    "ReferenceRMSGrads",
    "get_isa",
    "set_isa",
    "supported_isas",
    "get_num_threads",
    "set_num_threads",
    "thread_threshold",
    "MAX_THREADS",
    "set_output_cache",
    "get_output_cache",
    "OutputCache",
    "register_threadpoolctl",
    "__version__",
]
