"""Type stubs for the private C extension ``layernorm_c._core``.

Use the public wrappers in :mod:`layernorm_c` instead of this module.
"""
from typing import Any, Optional, Tuple

import numpy as np
from numpy.typing import NDArray

# The public gufunc, signature (n),(n),(n),()->(n): x, weight, bias, eps -> y.
layer_norm: np.ufunc

# Private gufuncs that also return per-record mean and variance, one per
# parameter convention.
_ln_wb: np.ufunc  # (n),(n),(n),()->(n),(),(): x, weight, bias, eps -> y, mean, var
_ln_w: np.ufunc  # (n),(n),()->(n),(),(): x, weight, eps -> y, mean, var
_ln_b: np.ufunc  # (n),(n),()->(n),(),(): x, bias, eps -> y, mean, var
_ln_none: np.ufunc  # (n),()->(n),(),(): x, eps -> y, mean, var

# layer_norm over the last axis for the common case (C-contiguous native
# float x, (d,) float parameters of any dtype or None, a valid float eps,
# out None or a matching C-contiguous array, a bool return_stats): y, or
# (y, mean, var) if return_stats; NotImplemented for anything else.
def _fast(x: Any, weight: Any, bias: Any, eps: Any, out: Any, return_stats: Any, /) -> Any: ...

# dx of the LayerNorm backward per record, (n),(n),(n),()->(n): dy, x, weight, eps -> dx.
layer_norm_backward: np.ufunc

# The backward of 2-d records: (dx, dweight_state, dbias_state); the states
# are exact sums (uint64 arrays (d, ACC_WORDS)) or None when sums is false.
# With rms true, RMSNorm's backward (weight: the applied scale; no bias
# state, mean ignored).
def _backward(dy: Any, x: Any, weight: Any, eps: float, mean: Any, sums: bool,
              rms: bool = ..., /) -> Tuple[
    NDArray[Any], Optional[NDArray[np.uint64]], Optional[NDArray[np.uint64]]]: ...

# The common case of both backward functions over the last axis: (dx,
# dweight, dbias), or (dx, dweight) with rms true, the sums rounded; or
# NotImplemented for anything the general path must handle.
def _fast_backward(dy: Any, x: Any, weight: Any, eps: Any, stat: Any, rms: bool, /) -> Any: ...

# RMSNorm: the public gufuncs, (n),(n),()->(n): x, scale, eps -> y and
# (n),(n),(n),()->(n): dy, x, scale, eps -> dx; private ones returning the
# per-record mean square.
rms_norm: np.ufunc
rms_norm_backward: np.ufunc
_rms_w: np.ufunc  # (n),(n),()->(n),(): x, scale, eps -> y, ms
_rms_none: np.ufunc  # (n),()->(n),(): x, eps -> y, ms

# rms_norm over the last axis for the common case, as _fast: y, or (y, ms).
# With scale true the weight is the applied scale in x's compute type and
# the result keeps x's dtype.
def _fast_rms(x: Any, weight: Any, eps: Any, out: Any, return_stats: Any,
              scale: bool = ..., /) -> Any: ...
# layer_norm or rms_norm (name) as a C callable in front of impl, its
# Python function: the common call in C (with the statistics: a `result`
# named tuple), every other call to impl.
def _entry(impl: Any, name: str, result: type, /) -> Any: ...
# The parameter names that entry knows, in the Python signature's order.
def _entry_params(name: str, /) -> Tuple[str, ...]: ...
# Register the bfloat16 loops of every gufunc for this dtype's type number
# (ml_dtypes.bfloat16), once.
def _register_bfloat16(dtype: np.dtype[Any], /) -> None: ...
# Two exact-sum states merged, exactly.
def _acc_merge(a: NDArray[np.uint64], b: NDArray[np.uint64], /) -> NDArray[np.uint64]: ...
# An exact-sum state rounded once (to float32 precision when float32 is true).
def _acc_value(state: NDArray[np.uint64], float32: bool, /) -> NDArray[np.float64]: ...
# The words of an exact-sum state per feature.
ACC_WORDS: int

# The largest thread count set_num_threads accepts.
MAX_THREADS: int
# The reduction order's constants (csrc/ln_contract.h): lanes and block size.
LANES: int
BLOCK: int

def get_isa() -> str: ...
def set_isa(name: str, /) -> None: ...
def supported_isas() -> Tuple[str, ...]: ...
def get_num_threads() -> int: ...
def set_num_threads(n: int, /) -> None: ...
def thread_threshold() -> int: ...
# Keep up to max_bytes of large freed outputs for reuse (0: none); returns the
# previous limit.
def set_output_cache(max_bytes: int, /) -> int: ...
# (limit, bytes kept, blocks kept)
def output_cache() -> Tuple[int, int, int]: ...
# At most n kernel threads for the calls made from the calling thread (0: no
# limit); returns the previous limit. The dask tasks set 1.
def _set_thread_limit(n: int, /) -> int: ...
