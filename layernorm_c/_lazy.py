"""dask arrays and xarray DataArrays: the four public functions, lazily.

``layer_norm``, ``rms_norm`` and their backward functions hand a dask array
(or an xarray DataArray) here. Nothing is computed: the result is a dask
graph whose tasks run the in-memory functions on blocks of whole records,
so every record gets the bits it gets in one NumPy call (a record's result
never depends on the batch it is computed in). The normalized axes are
rechunked into one chunk; the records may be chunked any way.

The parameter gradients (sums over records) are the one thing that crosses
blocks: each block returns the exact accumulator's state of its sums
(:class:`~layernorm_c.ExactSum`), the states merge exactly in a tree of
tasks, and the last task rounds once, so the chunking never shows in the
bits.

Threads: a task runs the kernels on at most ``LAYERNORM_C_DASK_THREADS``
threads (read when the graph is built; default 1), because dask already
runs one task per core: a task that also woke the kernel pool would
oversubscribe the cores.

This module imports neither dask nor xarray: it looks them up in
``sys.modules`` (an object cannot be a dask array unless dask is imported).
"""
from __future__ import annotations

import functools
import importlib
import math
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from numpy.typing import NDArray

from . import _core
from ._api import (
    _as_param,
    _as_real_array,
    _check_eps,
    _check_flag,
    _compute_dtype,
    _plan,
    _Plan,
    _result_dtype,
)

__all__: List[str] = []

_THREADS_ENV = "LAYERNORM_C_DASK_THREADS"
#: How many blocks' sums one task merges.
_SPLIT_EVERY = 16


def _dask() -> Any:
    """dask (imported as a plain module: typed as Any, and never needed
    unless a dask array was given)."""
    return importlib.import_module("dask")


def _da() -> Any:
    return importlib.import_module("dask.array")


def kind(*objs: object) -> Optional[str]:
    """``"xarray"`` if any argument is an xarray DataArray, ``"dask"`` if
    any is a dask array, else None."""
    # Only modules already imported are looked at, and a module another
    # thread is still importing (a dask worker unpickling its first task)
    # may lack the class yet: no argument can be one of its instances then.
    data_array = getattr(sys.modules.get("xarray"), "DataArray", None)
    if data_array is not None and any(isinstance(o, data_array) for o in objs):
        return "xarray"
    array = getattr(sys.modules.get("dask.array"), "Array", None)
    if array is not None and any(isinstance(o, array) for o in objs):
        return "dask"
    return None


def task_threads() -> int:
    """The kernel threads of one dask task (``LAYERNORM_C_DASK_THREADS``,
    default 1)."""
    text = os.environ.get(_THREADS_ENV, "").strip()
    if not text:
        return 1
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= _core.MAX_THREADS:
        raise ValueError(f"{_THREADS_ENV}: expected a thread count from 1 to "
                         f"{_core.MAX_THREADS}, got {text!r}")
    return n


# ---- blocks ---------------------------------------------------------------

def _in_task(fn: Callable[..., Any], threads: int, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with the kernels on at most ``threads``
    threads of the calling thread."""
    previous = _core._set_thread_limit(threads)
    try:
        return fn(*args, **kwargs)
    finally:
        _core._set_thread_limit(previous)


def _forward_block(op: str, axes: Tuple[int, ...], n_params: int, threads: int,
                   kwargs: Dict[str, Any], xb: NDArray[Any], *rest: Any) -> Tuple[Any, ...]:
    from ._api import layer_norm
    from ._rms import rms_norm

    params = list(rest[:n_params])
    if op == "layer_norm":
        return tuple(_in_task(layer_norm, threads, xb, *params, axis=axes, return_stats=True,
                              **kwargs))
    return tuple(_in_task(rms_norm, threads, xb, *params, axis=axes, return_stats=True,
                          **kwargs))


def _backward_block(op: str, axes: Tuple[int, ...], threads: int, kwargs: Dict[str, Any],
                    dyb: NDArray[Any], xb: NDArray[Any], w: Any, stat: Any) -> Tuple[Any, ...]:
    from ._backward import _backward_parts
    from ._rms import _rms_backward_parts

    if op == "layer_norm":
        dx, acc_w, acc_b, _ = _in_task(_backward_parts, threads, dyb, xb, w, kwargs["eps"],
                                       axes, stat, None)
        return dx, acc_w.state, acc_b.state
    dx, acc_w, _ = _in_task(_rms_backward_parts, threads, dyb, xb, w, kwargs["eps"], axes,
                            None, kwargs["convention"])
    return dx, acc_w.state, None


def _pick(block: Any, i: int) -> Any:
    """Output i of a block's tuple (blockwise hands contracted blocks as
    nested one-element lists: the normalized axes are one chunk)."""
    while isinstance(block, list):
        assert len(block) == 1
        block = block[0]
    return block[i]


def _merge(parts: List[Tuple[Any, ...]]) -> Tuple[Any, Any]:
    """The exact sums of several blocks' (dx, dweight, dbias) or merged
    (dweight, dbias) states together."""
    sw, sb = parts[0][-2:]
    for p in parts[1:]:
        w, b = p[-2:]
        sw = _core._acc_merge(sw, w)
        sb = None if sb is None else _core._acc_merge(sb, b)
    return sw, sb


def _rounded(states: Tuple[Any, Any], i: int, shape: Tuple[int, ...],
             dtype: np.dtype[Any]) -> NDArray[Any]:
    from ._backward import ExactSum

    return ExactSum(shape, states[i]).value(dtype)


# ---- dask -----------------------------------------------------------------

def _placeholder(a: Any) -> NDArray[Any]:
    """A zero-memory NumPy stand-in of a dask array's shape and dtype, for
    the in-memory validation (integers and bools as float64, as
    _as_real_array would convert them)."""
    if any(isinstance(n, float) and math.isnan(n) for n in a.shape):
        raise ValueError("expected a dask array of known shape, got one with unknown chunk "
                         "sizes; call .compute_chunk_sizes() on it first")
    dtype = np.dtype(np.float64) if a.dtype.kind in "biu" else a.dtype
    return np.broadcast_to(np.zeros((), dtype), a.shape)


def _check_x(x: Any, name: str, axis: object) -> Tuple[Any, _Plan]:
    da = _da()

    x = da.asarray(x)
    plan = _plan(_placeholder(x), axis)  # dtype, ndim, axes, nonzero length
    if x.dtype != plan.x.dtype:
        x = x.astype(plan.x.dtype)  # integers and bools in float64
    # the normalized axes in one chunk; the records as they are, unless
    # that chunk needs splitting them further ("auto")
    if any(len(x.chunks[a]) > 1 for a in plan.axes):
        spec = {i: (-1 if i in plan.axes else "auto") for i in range(x.ndim)}
        x = x.rechunk(spec)
    return x, plan


def _param(p: object, name: str, plan: _Plan) -> Tuple[object, Any]:
    """(what the dtype rules see, what the blocks get): None, a Python
    scalar as is, or a one-chunk dask array of the normalized shape."""
    dask, da = _dask(), _da()

    if p is None or type(p) in (bool, int, float):
        return p, p
    if isinstance(p, da.Array):
        ph = _placeholder(p)
        _as_param(ph, name, plan.x.shape, plan.axes)  # shape check
        shaped = dask.delayed(_param_value, pure=True)(p, name, plan.x.shape, plan.axes)
        arr = da.from_delayed(shaped, shape=plan.norm_shape, dtype=_as_real_array(ph, name).dtype)
        return ph, arr
    a = _as_param(p, name, plan.x.shape, plan.axes)
    assert a is not None
    return a, da.from_array(np.ascontiguousarray(a), chunks=-1)


def _param_value(p: NDArray[Any], name: str, shape: Tuple[int, ...],
                 axes: Tuple[int, ...]) -> NDArray[Any]:
    a = _as_param(p, name, shape, axes)
    assert a is not None
    return np.ascontiguousarray(a)


def _blocks(func: Callable[..., Any], plan: _Plan, x: Any,
            args: Sequence[Tuple[Any, Optional[Tuple[int, ...]]]]) -> Any:
    """One task per block of x: ``func(x_block, *arg_blocks)`` returning a
    tuple (an object-dtype dask array of them)."""
    da = _da()

    ind = tuple(range(x.ndim))
    flat: List[Any] = [x, ind]
    for a, index in args:
        flat += [a, index]
    return da.blockwise(func, ind, *flat, dtype=object, concatenate=True,
                        meta=np.empty((0,) * x.ndim, object))


def _output(tmp: Any, i: int, plan: _Plan, dtype: np.dtype[Any], per_record: bool) -> Any:
    """Output i of every block: shaped like x, or (per_record) like x
    without the normalized axes."""
    da = _da()

    ind = tuple(range(len(plan.x.shape)))
    out = ind if not per_record else tuple(k for k in ind if k not in plan.axes)
    return da.blockwise(_pick, out, tmp, ind, i, None, dtype=dtype, concatenate=False,
                        meta=np.empty((0,) * len(out), dtype))


def dask_forward(op: str, x: Any, params: Sequence[object], eps: Any, axis: Any,
                 out: Any, return_stats: Any, kwargs: Dict[str, Any]) -> Tuple[Any, ...]:
    """(y, stats...) as dask arrays; for ``layer_norm`` and ``rms_norm``."""
    if out is not None:
        raise TypeError("out: not supported with dask arrays (the result is a new, lazy dask "
                        "array; store it with dask.array.store or .to_zarr)")
    names = ("weight", "bias") if op == "layer_norm" else ("weight",)
    x, plan = _check_x(x, "x", axis)
    checked = [_param(p, n, plan) for p, n in zip(params, names)]
    eps = _check_eps(eps)
    _check_flag(return_stats, "return_stats")
    dtype = _result_dtype(plan.x, [(given, seen if isinstance(seen, np.ndarray) else None)
                                   for (seen, _), given in zip(checked, params)])
    stats_dtype = _compute_dtype(dtype)
    if op == "rms_norm":
        from ._rms import _check_convention
        _check_convention(kwargs["convention"])
    args: List[Tuple[Any, Optional[Tuple[int, ...]]]] = [
        (blk, None) if blk is None or isinstance(blk, (bool, int, float)) else (blk, plan.axes)
        for _, blk in checked]
    func = functools.partial(_forward_block, op, plan.axes, len(args), task_threads(),
                             dict(kwargs, eps=eps))
    tmp = _blocks(func, plan, x, args)
    y = _output(tmp, 0, plan, dtype, False)
    n_stats = 2 if op == "layer_norm" else 1
    stats = tuple(_output(tmp, 1 + k, plan, stats_dtype, True) for k in range(n_stats))
    return (y,) + stats


def _stat(s: Any, name: str, plan: _Plan, x: Any) -> Optional[Any]:
    """mean (or ms) for the blocks: a dask array shaped like x without the
    normalized axes."""
    da = _da()

    if s is None:
        return None
    from ._backward import _stat_arg

    s = da.asarray(s)
    _stat_arg(_placeholder(s), name, plan)  # shape check
    return s.reshape(plan.lead_shape) if s.shape != plan.lead_shape else s


def dask_backward(op: str, dy: Any, x: Any, weight: Any, eps: Any, axis: Any,
                  stat: Any, kwargs: Dict[str, Any]) -> Tuple[Any, ...]:
    """(dx, dweight[, dbias]) as dask arrays."""
    dask, da = _dask(), _da()

    x, plan = _check_x(x, "x", axis)
    dya = da.asarray(dy)
    ph = _as_real_array(_placeholder(dya), "dy")
    if dya.shape != x.shape:
        raise ValueError(f"dy: expected shape {x.shape} (the shape of x), got shape "
                         f"{dya.shape}")
    if dya.dtype != ph.dtype:
        dya = dya.astype(ph.dtype)
    seen, wblk = _param(weight, "weight", plan)
    eps = _check_eps(eps)
    if op == "rms_norm":
        from ._rms import _check_convention
        _check_convention(kwargs["convention"])
    dtype = _result_dtype(plan.x, [(dy, ph), (weight, seen if isinstance(seen, np.ndarray)
                                              else None)])
    gdt = _compute_dtype(dtype)
    dya = dya.rechunk(x.chunks)
    lead = tuple(k for k in range(x.ndim) if k not in plan.axes)
    args: List[Tuple[Any, Optional[Tuple[int, ...]]]] = [(dya, tuple(range(x.ndim)))]
    args.append((wblk, None) if wblk is None or isinstance(wblk, (bool, int, float))
                else (wblk, plan.axes))
    if op == "layer_norm":
        m = _stat(stat, "mean", plan, x)
    else:
        _stat(stat, "ms", plan, x)  # checked; the pass over x recomputes it
        m = None
    args.append((None, None) if m is None else (m, lead))
    func = functools.partial(_backward_block_xfirst, op, plan.axes, task_threads(),
                             dict(kwargs, eps=eps))
    tmp = _blocks(func, plan, x, args)
    dx = _output(tmp, 0, plan, dtype, False)

    # The sums: each block's exact states, merged in a tree, rounded once.
    grads = _sums_tree(tmp, plan.norm_shape, gdt, 2 if op == "layer_norm" else 1)
    return (dx,) + tuple(grads)


def _sums_tree(tmp: Any, shape: Tuple[int, ...], dtype: np.dtype[Any], n: int) -> List[Any]:
    """dweight (and dbias, n = 2) from the blocks' states: a tree of merge
    tasks, _SPLIT_EVERY states each, then one rounding task per sum. The
    graph is written directly (a delayed call per task would cost a
    millisecond each to build)."""
    dask, da = _dask(), _da()
    flatten = importlib.import_module("dask.core").flatten
    HighLevelGraph = importlib.import_module("dask.highlevelgraph").HighLevelGraph

    token = dask.base.tokenize(tmp.name, shape, dtype, n)
    merge = f"layernorm_c-merge-{token}"
    layer: Dict[Any, Any] = {}
    keys = list(flatten(tmp.__dask_keys__()))
    level = 0
    while True:
        groups = [keys[k:k + _SPLIT_EVERY] for k in range(0, len(keys), _SPLIT_EVERY)]
        keys = []
        for i, group in enumerate(groups):
            key = (merge, level, i)
            layer[key] = (_merge, list(group))
            keys.append(key)
        level += 1
        if len(keys) == 1:
            break
    out = []
    zeros = (0,) * len(shape)
    for i, what in enumerate(("dweight", "dbias")[:n]):
        name = f"layernorm_c-{what}-{token}"
        tasks = dict(layer)
        tasks[(name,) + zeros] = (_rounded, keys[0], i, shape, dtype)
        graph = HighLevelGraph.from_collections(name, tasks, dependencies=[tmp])
        out.append(da.Array(graph, name, chunks=tuple((k,) for k in shape), dtype=dtype,
                            meta=np.empty(zeros, dtype)))
    return out


def _backward_block_xfirst(op: str, axes: Tuple[int, ...], threads: int,
                           kwargs: Dict[str, Any], xb: NDArray[Any], dyb: NDArray[Any], w: Any,
                           stat: Any) -> Tuple[Any, ...]:
    return _backward_block(op, axes, threads, kwargs, dyb, xb, w, stat)


# ---- xarray ---------------------------------------------------------------

def _xr_axes(x: Any, axis: object) -> Tuple[int, ...]:
    """``axis`` as positions: dimension names (a str or a tuple of str) or
    ints."""
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    out: List[Any] = []
    for a in items:
        if isinstance(a, str):
            if a not in x.dims:
                raise ValueError(f"axis: {a!r} is not a dimension of x (dimensions "
                                 f"{tuple(x.dims)})")
            out.append(x.get_axis_num(a))
        else:
            out.append(a)
    return tuple(out) if isinstance(axis, (tuple, list)) else out[0]


def _xr_data(a: Any, name: str, dims: Tuple[Any, ...]) -> Any:
    """A DataArray argument's data with its dimensions in the order
    ``dims`` (the ones it lacks as length 1); anything else as is."""
    xr = sys.modules["xarray"]
    if not isinstance(a, xr.DataArray):
        return a
    extra = [d for d in a.dims if d not in dims]
    if extra:
        raise ValueError(f"{name}: expected dimensions among {tuple(dims)}, got a DataArray "
                         f"with dimensions {tuple(a.dims)}")
    missing = [d for d in dims if d not in a.dims]
    if missing:
        a = a.expand_dims(missing)
    return a.transpose(*dims).data


def _xr_like(x: Any, data: Any, dims: Tuple[Any, ...], name: Optional[str],
             attrs: bool) -> Any:
    """A DataArray of ``data`` on ``dims`` with x's coordinates that live
    on those dimensions."""
    xr = sys.modules["xarray"]
    coords = {k: v for k, v in x.coords.items() if set(v.dims) <= set(dims)}
    return xr.DataArray(data, dims=dims, coords=coords, name=name,
                        attrs=dict(x.attrs) if attrs else None)


def _xr_split(x: Any, axis: object) -> Tuple[Any, Tuple[int, ...], Tuple[Any, ...],
                                             Tuple[Any, ...]]:
    """(x's data, axes as ints, the normalized dims, the other dims)."""
    from ._api import _normalize_axes

    xr = sys.modules["xarray"]
    if not isinstance(x, xr.DataArray):
        raise TypeError(f"x: expected a DataArray when other arguments are DataArrays, got "
                        f"{type(x).__name__}")
    axes = _normalize_axes(_xr_axes(x, axis), x.ndim)
    norm = tuple(x.dims[a] for a in axes)
    lead = tuple(d for d in x.dims if d not in norm)
    return x.data, axes, norm, lead


# ---- the public functions' lazy paths -----------------------------------

def layer_norm(x: Any, weight: Any, bias: Any, eps: Any, axis: Any, out: Any,
               return_stats: Any) -> Any:
    from ._api import LayerNormResult
    from ._api import layer_norm as ln

    if kind(x, weight, bias) == "xarray":
        data, axes, norm, lead = _xr_split(x, axis)
        if out is not None:
            raise TypeError("out: not supported with xarray DataArrays")
        res = ln(data, _xr_data(weight, "weight", norm), _xr_data(bias, "bias", norm), eps,
                 axis=axes, return_stats=return_stats)
        if not return_stats:
            return _xr_like(x, res, tuple(x.dims), x.name, True)
        return LayerNormResult(_xr_like(x, res.y, tuple(x.dims), x.name, True),
                               _xr_like(x, res.mean, lead, "mean", False),
                               _xr_like(x, res.var, lead, "var", False))
    y, mean, var = dask_forward("layer_norm", x, (weight, bias), eps, axis, out, return_stats,
                                {})
    return LayerNormResult(y, mean, var) if return_stats else y


def rms_norm(x: Any, weight: Any, eps: Any, axis: Any, out: Any, return_stats: Any,
             convention: Any) -> Any:
    from ._rms import RMSNormResult
    from ._rms import rms_norm as rn

    if kind(x, weight) == "xarray":
        data, axes, norm, lead = _xr_split(x, axis)
        if out is not None:
            raise TypeError("out: not supported with xarray DataArrays")
        res = rn(data, _xr_data(weight, "weight", norm), eps, axis=axes,
                 return_stats=return_stats, convention=convention)
        if not return_stats:
            return _xr_like(x, res, tuple(x.dims), x.name, True)
        return RMSNormResult(_xr_like(x, res.y, tuple(x.dims), x.name, True),
                             _xr_like(x, res.ms, lead, "ms", False))
    y, ms = dask_forward("rms_norm", x, (weight,), eps, axis, out, return_stats,
                         {"convention": convention})
    return RMSNormResult(y, ms) if return_stats else y


def _xr_grads(x: Any, norm: Tuple[Any, ...], grads: Sequence[Any], names: Sequence[str]
              ) -> List[Any]:
    return [_xr_like(x, grads[0], tuple(x.dims), "dx", False)] + [
        _xr_like(x, g, norm, n, False) for g, n in zip(grads[1:], names)]


def layer_norm_backward(dy: Any, x: Any, weight: Any, eps: Any, axis: Any, mean: Any,
                        var: Any) -> Any:
    from ._backward import LayerNormGrads
    from ._backward import layer_norm_backward as lnb

    if kind(dy, x, weight, mean, var) == "xarray":
        data, axes, norm, lead = _xr_split(x, axis)
        g = lnb(_xr_data(dy, "dy", tuple(x.dims)), data, _xr_data(weight, "weight", norm), eps,
                axis=axes, mean=_xr_data(mean, "mean", lead), var=_xr_data(var, "var", lead))
        return LayerNormGrads(*_xr_grads(x, norm, g, ("dweight", "dbias")))
    if var is not None:
        from ._backward import _stat_arg
        da = _da()

        _, plan = _check_x(x, "x", axis)
        _stat_arg(_placeholder(da.asarray(var)), "var", plan)  # checked, as in memory
    return LayerNormGrads(*dask_backward("layer_norm", dy, x, weight, eps, axis, mean, {}))


def rms_norm_backward(dy: Any, x: Any, weight: Any, eps: Any, axis: Any, ms: Any,
                      convention: Any) -> Any:
    from ._rms import RMSNormGrads
    from ._rms import rms_norm_backward as rnb

    if kind(dy, x, weight, ms) == "xarray":
        data, axes, norm, lead = _xr_split(x, axis)
        g = rnb(_xr_data(dy, "dy", tuple(x.dims)), data, _xr_data(weight, "weight", norm), eps,
                axis=axes, ms=_xr_data(ms, "ms", lead),
                convention=convention)
        return RMSNormGrads(*_xr_grads(x, norm, g, ("dweight",)))
    return RMSNormGrads(*dask_backward("rms_norm", dy, x, weight, eps, axis, ms,
                                       {"convention": convention}))
