"""What the benchmark times: the ops, their inputs, the implementations of
each op (layernorm_c, the memory floors, the optional peers) and the check
of every result against the float64 reference before it is timed.

Each implementation is built as an :class:`Impl`: a zero-argument ``call``
(the timed call, with its inputs bound) and ``outputs``, which turns what
the call returned into NumPy arrays for the check. A builder raises
:class:`NotAvailable` when an implementation cannot run a case (a peer not
installed, a dtype it has no kernel for, an op it lacks); the reason is
reported under the tables.
"""
from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import layernorm_c as lnc
from layernorm_c.testing import TOLERANCES
from layernorm_c.testing._backward_numerics import backward_tolerance, record_terms

SEED = 20240601
#: Rows of each result compared with the float64 reference (the parameter
#: gradients of the backward ops are compared over all records).
CHECK_ROWS = 64


class NotAvailable(Exception):
    """An implementation cannot run this case; the message says why."""


# ---------------------------------------------------------------- ops and dtypes

@dataclass(frozen=True)
class Op:
    name: str
    centered: bool       # LayerNorm (mean subtracted) or RMSNorm
    backward: bool
    eps: float
    peers: Tuple[str, ...]  # the peers that implement it

    @property
    def grads(self) -> Tuple[str, ...]:
        """The parameter gradients the backward returns."""
        return ("dweight", "dbias") if self.centered else ("dweight",)


OPS: Dict[str, Op] = {
    "layer_norm": Op("layer_norm", True, False, 1e-5,
                     ("torch", "onnxruntime", "openvino", "jax", "numpy")),
    "layer_norm_backward": Op("layer_norm_backward", True, True, 1e-5,
                              ("torch", "jax", "numpy")),
    "rms_norm": Op("rms_norm", False, False, 1e-6,
                   ("torch", "onnxruntime", "openvino", "jax", "numpy")),
    "rms_norm_backward": Op("rms_norm_backward", False, True, 1e-6,
                            ("torch", "jax", "numpy")),
}

PEERS: Tuple[str, ...] = ("torch", "onnxruntime", "openvino", "jax", "numpy")
#: Every implementation key, in table order, with its display label.
LABELS: Dict[str, str] = {
    "floor": "floor",
    "floor_alloc": "alloc floor",
    "lnc": "layernorm_c",
    "lnc_out": "layernorm_c out=",
    "torch": "torch",
    "onnxruntime": "onnxruntime",
    "openvino": "OpenVINO",
    "jax": "JAX jit",
    "numpy": "NumPy",
}
DTYPES: Tuple[str, ...] = ("float32", "float16", "float64", "bfloat16")


def bfloat16() -> Optional[type]:
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes.bfloat16


def np_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a dtype name (bfloat16 through ml_dtypes)."""
    if name == "bfloat16":
        bf16 = bfloat16()
        if bf16 is None:
            raise NotAvailable("ml_dtypes not installed")
        return np.dtype(bf16)
    return np.dtype(name)


def impl_keys(op: Op, peers: Sequence[str]) -> List[str]:
    """The implementations of ``op`` in table order: floors, layernorm_c
    (and its ``out=`` form for a forward op), then the selected peers."""
    keys = ["floor", "floor_alloc", "lnc"] + ([] if op.backward else ["lnc_out"])
    return keys + [p for p in PEERS if p in peers and p in op.peers]


# ---------------------------------------------------------------- inputs

@dataclass
class Inputs:
    """x and dy ~ N(0, 1); weight ~ 1 + N(0, 0.1^2) and bias ~ N(0, 0.1^2),
    of shape (d,), the same for every shape with that d."""

    x: np.ndarray
    dy: np.ndarray
    w: np.ndarray
    b: np.ndarray

    @property
    def dtype(self) -> np.dtype:
        return self.x.dtype

    @property
    def d(self) -> int:
        return self.x.shape[-1]


def float32_data(shape: Tuple[int, int], seed: int = SEED) -> Tuple[np.ndarray, np.ndarray]:
    """x and dy in float32, the master copy every dtype is cast from."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape, dtype=np.float32),
            rng.standard_normal(shape, dtype=np.float32))


def make_inputs(x32: np.ndarray, dy32: np.ndarray, dtype: str) -> Inputs:
    dt = np_dtype(dtype)
    d = x32.shape[-1]
    rng = np.random.default_rng(SEED + d)
    w = (1.0 + 0.1 * rng.standard_normal(d)).astype(dt)
    b = (0.1 * rng.standard_normal(d)).astype(dt)
    return Inputs(x32.astype(dt, copy=False), dy32.astype(dt, copy=False), w, b)


# ---------------------------------------------------------------- the reference

@dataclass
class Reference:
    """float64 results of an op: the first rows of y (forward) or of dx
    (backward, with its per-record scale), and the parameter gradients over
    all records with the sum of their terms' magnitudes."""

    rows: int
    y: Optional[np.ndarray] = None
    dx: Optional[np.ndarray] = None
    dx_scale: Optional[np.ndarray] = None
    params: List[Tuple[np.ndarray, np.ndarray]] = field(default_factory=list)


def _chunks(n_rows: int, d: int, elements: int = 1 << 21):
    step = max(1, elements // max(d, 1))
    for start in range(0, n_rows, step):
        yield slice(start, min(n_rows, start + step))


def reference(op: Op, inp: Inputs) -> Reference:
    """The float64 reference of ``op`` on ``inp`` (layernorm_c's float64
    NumPy oracles; the parameter gradients summed chunk by chunk)."""
    x = inp.x.reshape(-1, inp.d)
    n = min(CHECK_ROWS, x.shape[0])
    w, b, eps = inp.w, inp.b, op.eps
    if not op.backward:
        if op.centered:
            y = lnc.reference_layer_norm(x[:n], w, b, eps).y
        else:
            y = lnc.reference_rms_norm(x[:n], w, eps).y
        return Reference(n, y=y)
    dy = inp.dy.reshape(-1, inp.d)
    if op.centered:
        dx = lnc.reference_layer_norm_backward(dy[:n], x[:n], w, eps).dx
    else:
        dx = lnc.reference_rms_norm_backward(dy[:n], x[:n], w, eps).dx
    scale = record_terms(dy[:n], x[:n], w, eps, centered=op.centered).scale
    sums = np.zeros((4, inp.d))  # dweight, |terms|, dbias, |terms|
    for s in _chunks(x.shape[0], inp.d):
        t = record_terms(dy[s], x[s], w, eps, centered=op.centered)
        dy64 = np.asarray(dy[s], np.float64)
        terms = dy64 * t.xhat
        sums[0] += terms.sum(axis=0)
        sums[1] += np.abs(terms).sum(axis=0)
        sums[2] += dy64.sum(axis=0)
        sums[3] += np.abs(dy64).sum(axis=0)
    params = [(sums[0], sums[1])] + ([(sums[2], sums[3])] if op.centered else [])
    return Reference(n, dx=dx, dx_scale=scale, params=params)


def check(op: Op, ref: Reference, got: Sequence[np.ndarray], inp: Inputs) -> float:
    """The largest error of ``got`` in units of the audit's tolerance for the
    dtype (1 is the limit): :data:`layernorm_c.testing.TOLERANCES` for a
    forward op, its backward tolerances (dx per record in units of its
    terms, the parameter gradients per feature) for a backward op."""
    expected = 1 + (len(op.grads) if op.backward else 0)
    if len(got) != expected:
        raise ValueError(f"expected {expected} outputs, got {len(got)}")
    first = np.asarray(got[0])
    if first.shape != inp.x.shape:
        raise ValueError(f"output shape {first.shape}, expected {inp.x.shape}")
    rows = first.reshape(-1, inp.d)[:ref.rows]
    if not op.backward:
        return TOLERANCES[inp.dtype].worst(rows, ref.y)
    tol = backward_tolerance(inp.dtype, inp.d)
    worst = float(np.max(tol.dx_units(rows, ref.dx, ref.dx_scale)))
    for g, (want, magnitude) in zip(got[1:], ref.params):
        g = np.asarray(g).reshape(-1)
        if g.shape != want.shape:
            raise ValueError(f"parameter gradient of shape {g.shape}, expected {want.shape}")
        worst = max(worst, float(np.max(tol.param_units(g, want, magnitude))))
    return worst


# ---------------------------------------------------------------- implementations

@dataclass
class Impl:
    call: Callable[[], Any]
    outputs: Callable[[Any], Tuple[np.ndarray, ...]] = lambda r: (r,)
    #: Runs on one thread whatever the thread setting (timed once per case
    #: and reused in the other thread rows).
    single_threaded: bool = False
    #: ``(call, fraction)``: the same computation on ``fraction`` of the
    #: rows, to estimate a slow call's time before making it.
    probe: Optional[Tuple[Callable[[], Any], float]] = None


def build(key: str, op: Op, inp: Inputs, threads: int, peers: "Peers") -> Impl:
    """The implementation ``key`` of ``op`` on ``inp`` at ``threads``."""
    if key in ("floor", "floor_alloc"):
        return _floor(key, op, inp)
    if key in ("lnc", "lnc_out"):
        return _lnc(key, op, inp)
    if key == "numpy":
        return _numpy(op, inp)
    module = peers.get(key)  # raises NotAvailable when missing
    return _PEER_BUILDERS[key](module, op, inp, threads, peers)


def same_page_offset(x: np.ndarray) -> np.ndarray:
    """An uninitialized C-ordered array like ``x`` that starts at x's own
    offset within a 4 KiB page, as two fresh large allocations do.

    ``np.copyto`` is glibc's memmove, and on AMD Zen 3 (measured here:
    float32 (64, 768), 5.7-8.7 us at every other offset) it takes 100-140 us
    when the destination starts 16 bytes past the source modulo 4 KiB,
    which is where malloc puts an array allocated right after another of a
    whole number of pages: ``np.empty_like(x)`` could turn the floor into a
    tenth of the machine's speed, and every ratio over it with it."""
    buf = np.empty(x.nbytes + 4096, np.uint8)
    start = (x.ctypes.data - buf.ctypes.data) % 4096
    return buf[start:start + x.nbytes].view(x.dtype).reshape(x.shape)


def _floor(key: str, op: Op, inp: Inputs) -> Impl:
    """Forward: ``np.copyto(out, x)`` / ``x.copy()``. Backward: read x and dy,
    write dx: an integer add of their bit patterns (pure traffic, the same
    speed for every dtype), into a preallocated array / a new one."""
    x = inp.x
    if not op.backward:
        out = same_page_offset(x)
        return Impl(lambda: np.copyto(out, x)) if key == "floor" else Impl(x.copy)
    bits = np.dtype(f"u{x.dtype.itemsize}")
    xi, dyi = x.view(bits), inp.dy.view(bits)
    if key == "floor":
        dxi = np.empty_like(xi)
        return Impl(lambda: np.add(xi, dyi, out=dxi))
    return Impl(lambda: np.add(xi, dyi))


def _lnc(key: str, op: Op, inp: Inputs) -> Impl:
    x, dy, w, b, eps = inp.x, inp.dy, inp.w, inp.b, op.eps
    if op.backward:
        fn = lnc.layer_norm_backward if op.centered else lnc.rms_norm_backward
        return Impl(lambda: fn(dy, x, w, eps), tuple)
    args = (x, w, b, eps) if op.centered else (x, w, eps)
    fn = lnc.layer_norm if op.centered else lnc.rms_norm
    if key == "lnc":
        return Impl(lambda: fn(*args))
    out = np.empty_like(x)
    return Impl(lambda: fn(*args, out=out))


# NumPy: the formulas as a NumPy user writes them, in the input dtype.

def numpy_layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    var = np.mean(np.square(xc), axis=-1, keepdims=True)
    return xc / np.sqrt(var + eps) * w + b


def numpy_rms_norm(x, w, eps=1e-6):
    ms = np.mean(np.square(x), axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps) * w


def numpy_layer_norm_backward(dy, x, w, eps=1e-5):
    xc = x - x.mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt(np.mean(np.square(xc), axis=-1, keepdims=True) + eps)
    xhat = xc * rstd
    g = dy * w
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dx, np.sum(dy * xhat, axis=0), np.sum(dy, axis=0)


def numpy_rms_norm_backward(dy, x, w, eps=1e-6):
    rstd = 1 / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)
    xhat = x * rstd
    g = dy * w
    dx = rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dx, np.sum(dy * xhat, axis=0)


def _numpy(op: Op, inp: Inputs) -> Impl:
    if op.backward:
        fn = numpy_layer_norm_backward if op.centered else numpy_rms_norm_backward
    else:
        fn = numpy_layer_norm if op.centered else numpy_rms_norm

    def bind(rows):
        x, dy = inp.x[:rows], inp.dy[:rows]
        params = (inp.w, inp.b) if op.centered and not op.backward else (inp.w,)
        args = ((dy, x) if op.backward else (x,)) + params + (op.eps,)
        return lambda: fn(*args)

    n = inp.x.shape[0]
    part = max(1, n // 16)
    return Impl(bind(n), tuple if op.backward else (lambda r: (r,)), single_threaded=True,
                probe=(bind(part), part / n))


# torch: F.layer_norm / F.rms_norm on tensors sharing the arrays' memory;
# the backward is autograd's, through a graph built once (retain_graph).

def _to_torch(torch, a: np.ndarray):
    if a.dtype == bfloat16():
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _from_torch(torch, t) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(bfloat16())
    return t.numpy()


def _torch(torch, op: Op, inp: Inputs, threads: int, peers: "Peers") -> Impl:
    F = torch.nn.functional
    shape, eps = (inp.d,), op.eps
    xt, wt, bt, dyt = (_to_torch(torch, a) for a in (inp.x, inp.w, inp.b, inp.dy))
    to_np = partial(_from_torch, torch)
    if not op.backward:
        if op.centered:
            return Impl(lambda: F.layer_norm(xt, shape, wt, bt, eps), lambda y: (to_np(y),))
        return Impl(lambda: F.rms_norm(xt, shape, wt, eps), lambda y: (to_np(y),))
    leaves = [xt.requires_grad_(), wt.clone().requires_grad_()]
    if op.centered:
        leaves.append(bt.clone().requires_grad_())
        y = F.layer_norm(leaves[0], shape, leaves[1], leaves[2], eps)
    else:
        y = F.rms_norm(leaves[0], shape, leaves[1], eps)
    grad = torch.autograd.grad
    return Impl(lambda: grad(y, leaves, dyt, retain_graph=True),
                lambda g: tuple(to_np(t) for t in g))


# onnxruntime: a model of one LayerNormalization node (opset 17) or one
# RMSNormalization node (opset 23), CPU provider, sequential execution.

def _onnx_model(onnx, op: Op, inp: Inputs) -> bytes:
    helper, TensorProto = onnx.helper, onnx.TensorProto
    d = inp.d
    if inp.dtype == bfloat16():
        elem = TensorProto.BFLOAT16

        def tensor(name, a):
            return helper.make_tensor(name, elem, [d], a.view(np.uint16).tobytes(), raw=True)
    else:
        elem = helper.np_dtype_to_tensor_dtype(inp.dtype)

        def tensor(name, a):
            return onnx.numpy_helper.from_array(a, name)
    x = helper.make_tensor_value_info("X", elem, ["N", d])
    y = helper.make_tensor_value_info("Y", elem, ["N", d])
    if op.centered:
        node = helper.make_node("LayerNormalization", ["X", "W", "B"], ["Y"],
                                axis=-1, epsilon=op.eps)
        inits, opset = [tensor("W", inp.w), tensor("B", inp.b)], 17
    else:
        node = helper.make_node("RMSNormalization", ["X", "W"], ["Y"], axis=-1, epsilon=op.eps)
        inits, opset = [tensor("W", inp.w)], 23
    graph = helper.make_graph([node], op.name, [x], [y], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model.SerializeToString()


def _ortvalue_bfloat16(value) -> np.ndarray:
    """An OrtValue of bfloat16 as a NumPy array (a copy), through its data
    pointer: onnxruntime's Python API has no NumPy type for bfloat16."""
    shape = tuple(value.shape())
    n = int(np.prod(shape))
    raw = (ctypes.c_uint16 * n).from_address(value.data_ptr())
    return np.frombuffer(raw, np.uint16).reshape(shape).copy().view(bfloat16())


def _onnxruntime(mods, op: Op, inp: Inputs, threads: int, peers: "Peers") -> Impl:
    onnx, ort = mods
    key = (op.name, inp.d, inp.dtype.str, inp.dtype.name, threads)
    sess = peers.cache.get(("ort",) + key)
    if sess is None:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        try:
            sess = ort.InferenceSession(_onnx_model(onnx, op, inp), opts,
                                        providers=["CPUExecutionProvider"])
        except Exception as exc:
            what = "LayerNormalization (opset 17)" if op.centered else "RMSNormalization (opset 23)"
            raise NotAvailable(f"no {what} for {inp.dtype.name}: {_first_line(exc)}") from exc
        peers.cache[("ort",) + key] = sess
    x = inp.x
    if x.dtype == bfloat16():
        xv = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            x.view(np.uint16), onnx.TensorProto.BFLOAT16)
        return Impl(lambda: sess.run_with_ort_values(["Y"], {"X": xv}),
                    lambda r: (_ortvalue_bfloat16(r[0]),))
    feeds = {"X": x}
    return Impl(lambda: sess.run(["Y"], feeds), lambda r: (r[0],))


# OpenVINO: the MVN + Multiply + Add pattern (LayerNorm) or the
# x / sqrt(mean(x^2) + eps) * w pattern (RMSNorm), compiled for the CPU
# plugin with the case's thread count and float32 inference precision.

def _openvino(mods, op: Op, inp: Inputs, threads: int, peers: "Peers") -> Impl:
    ov, ops, core = mods
    bf16 = inp.dtype == bfloat16()
    types = {"float32": ov.Type.f32, "float16": ov.Type.f16, "float64": ov.Type.f64}
    et = ov.Type.bf16 if bf16 else types[inp.dtype.name]

    def const(a):
        a = np.asarray(a, np.float32 if bf16 else inp.dtype)
        return ops.constant(a, dtype=et)

    x = inp.x
    p = ops.parameter(list(x.shape), et, name="x")
    axes = ops.constant(np.array([-1], np.int64))
    if op.centered:
        mvn = ops.mvn(p, axes, True, op.eps, "inside_sqrt")
        y = ops.add(ops.multiply(mvn, const(inp.w)), const(inp.b))
    else:
        ms = ops.reduce_mean(ops.power(p, const(2.0)), axes, True)
        y = ops.multiply(ops.divide(p, ops.sqrt(ops.add(ms, const(op.eps)))), const(inp.w))
    config = {
        "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
        # Without it the CPU plugin runs float32 models in bfloat16 on CPUs
        # with AVX512-BF16 or AMX.
        "INFERENCE_PRECISION_HINT": "f32",
        # The benchmark pins the process; the plugin must not re-pin.
        "ENABLE_CPU_PINNING": False,
    }
    try:
        compiled = core.compile_model(ov.Model([y], [p], op.name), "CPU", config)
    except Exception as exc:
        raise NotAvailable(f"compile failed for {inp.dtype.name}: {_first_line(exc)}") from exc
    request = compiled.create_infer_request()
    if bf16:
        tensor = ov.Tensor(x.view(np.int16), ov.Shape(list(x.shape)), ov.Type.bf16)

        def to_np(r):
            return (np.asarray(r[0]).view(np.uint16).view(bfloat16()),)
    else:
        tensor = ov.Tensor(x, shared_memory=True)

        def to_np(r):
            return (np.asarray(r[0]),)
    feeds = {0: tensor}
    # share_outputs=False (the default): the result is copied into a new
    # array, as an allocating call returns one.
    return Impl(lambda: request.infer(feeds, share_inputs=True), to_np)


# JAX: a hand-written LayerNorm / RMSNorm (statistics in float32 for 16-bit
# inputs, as flax computes them) under jax.jit; the backward is jax.vjp of
# it under jit, which recomputes the forward inside the compiled function.

def _jax_layer_norm(jnp, lax, eps, x, w, b):
    ct = jnp.promote_types(x.dtype, jnp.float32)
    xf = x.astype(ct)
    xc = xf - jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(xc * xc, axis=-1, keepdims=True)
    return (xc * lax.rsqrt(var + eps) * w.astype(ct) + b.astype(ct)).astype(x.dtype)


def _jax_rms_norm(jnp, lax, eps, x, w):
    ct = jnp.promote_types(x.dtype, jnp.float32)
    xf = x.astype(ct)
    ms = jnp.mean(xf * xf, axis=-1, keepdims=True)
    return (xf * lax.rsqrt(ms + eps) * w.astype(ct)).astype(x.dtype)


def _jax_function(jax, op: Op):
    jnp, lax = jax.numpy, jax.lax
    fwd = partial(_jax_layer_norm if op.centered else _jax_rms_norm, jnp, lax, op.eps)
    if not op.backward:
        return jax.jit(fwd)

    def backward(dy, *primals):
        return jax.vjp(fwd, *primals)[1](dy)
    return jax.jit(backward)


def _jax(mods, op: Op, inp: Inputs, threads: int, peers: "Peers") -> Impl:
    jax, single = mods
    fn = peers.cache.get(("jax", op.name))
    if fn is None:
        fn = peers.cache[("jax", op.name)] = _jax_function(jax, op)
    params = (inp.w, inp.b) if op.centered else (inp.w,)
    args = [jax.device_put(a) for a in
            ((inp.dy, inp.x) + params if op.backward else (inp.x,) + params)]
    block = jax.block_until_ready
    return Impl(lambda: block(fn(*args)),
                lambda r: tuple(np.asarray(a) for a in (r if op.backward else (r,))),
                single_threaded=single)


_PEER_BUILDERS = {"torch": _torch, "onnxruntime": _onnxruntime, "openvino": _openvino,
                  "jax": _jax}


def _first_line(exc: BaseException, limit: int = 160) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return (text.splitlines() or [text])[0][:limit]


# ---------------------------------------------------------------- the peers' modules

#: XLA on one thread: set before jax starts its CPU backend.
JAX_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


class Peers:
    """The selected peers' modules, imported lazily on first use; a peer
    that is not installed (or fails to start) is remembered with the
    reason, and every case reports it as n/a."""

    def __init__(self, selected: Sequence[str]):
        self.selected = [p for p in PEERS if p in selected]
        self.cache: Dict[Tuple, Any] = {}
        self.versions: Dict[str, str] = {}
        self.missing: Dict[str, str] = {}
        self._modules: Dict[str, Any] = {}
        self._undo: List[Callable[[], None]] = []

    def get(self, name: str):
        if name in self.missing:
            raise NotAvailable(self.missing[name])
        if name not in self._modules:
            try:
                self._modules[name] = getattr(self, f"_load_{name}")()
            except NotAvailable as exc:
                self.missing[name] = str(exc)
                raise
            except Exception as exc:  # a broken install
                self.missing[name] = f"failed to load: {_first_line(exc)}"
                raise NotAvailable(self.missing[name]) from exc
        return self._modules[name]

    def load_all(self) -> None:
        """Import every selected peer now (before the timed runs), so that
        versions are known and import costs stay out of the cases."""
        for name in self.selected:
            if name != "numpy":
                try:
                    self.get(name)
                except NotAvailable:
                    pass
        self.versions["numpy"] = np.__version__

    @property
    def torch(self):
        return self._modules.get("torch")

    def close(self) -> None:
        """Undo global settings made while loading (JAX's x64 mode)."""
        self.cache.clear()
        while self._undo:
            self._undo.pop()()

    @staticmethod
    def _require(module: str):
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            raise NotAvailable(f"{module} not installed") from exc

    def _load_torch(self):
        torch = self._require("torch")
        self.versions["torch"] = torch.__version__
        return torch

    def _load_onnxruntime(self):
        onnx = self._require("onnx")
        ort = self._require("onnxruntime")
        if "CPUExecutionProvider" not in ort.get_available_providers():
            raise NotAvailable("onnxruntime has no CPUExecutionProvider")
        self.versions["onnxruntime"] = f"{ort.__version__} (onnx {onnx.__version__})"
        return onnx, ort

    def _load_openvino(self):
        # Importing openvino sends a usage event to Google Analytics (from a
        # forked process, through openvino_telemetry) unless the user opted
        # out; it falls back to a silent stub when openvino_telemetry cannot
        # be imported, so block that import while openvino loads.
        blocked = "openvino_telemetry" not in sys.modules and "openvino" not in sys.modules
        if blocked:
            sys.modules["openvino_telemetry"] = None  # type: ignore[assignment]
        try:
            ov = self._require("openvino")
        finally:
            if blocked:
                sys.modules.pop("openvino_telemetry", None)
        ops = self._require("openvino.opset13")
        core = ov.Core()
        if "CPU" not in core.available_devices:
            raise NotAvailable("OpenVINO has no CPU plugin")
        self.versions["openvino"] = ov.__version__
        return ov, ops, core

    def _load_jax(self):
        imported = sys.modules.get("jax", False)
        if imported is None or (not imported and importlib.util.find_spec("jax") is None):
            raise NotAvailable("jax not installed")  # (None: an import was blocked)
        single = False
        note = ""
        saved = os.environ.get("XLA_FLAGS")
        if imported:
            note = "jax was imported before the benchmark: its thread flags could not be set"
        else:
            flags = f"{saved or ''} {JAX_XLA_FLAGS}".strip()
            # An XLA that does not know a flag aborts the process: try the
            # flags in a child first.
            if _jax_starts_with(flags):
                os.environ["XLA_FLAGS"] = flags
                single = True
            else:
                note = f"XLA rejected XLA_FLAGS={flags!r}: default threads"
        try:
            jax = importlib.import_module("jax")
            jax.devices("cpu")  # starts the backend while the flags are set
        finally:
            if saved is None:
                os.environ.pop("XLA_FLAGS", None)
            else:
                os.environ["XLA_FLAGS"] = saved
        previous = bool(jax.config.jax_enable_x64)
        jax.config.update("jax_enable_x64", True)  # float64 arrays stay float64
        self._undo.append(lambda: jax.config.update("jax_enable_x64", previous))
        self.versions["jax"] = f"{jax.__version__}" + (
            " (one thread: XLA_FLAGS)" if single else f" ({note})")
        return jax, single


def _jax_starts_with(flags: str) -> bool:
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    try:
        proc = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"],
                              env=env, capture_output=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0
