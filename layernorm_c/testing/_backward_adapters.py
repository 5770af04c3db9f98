"""Adapters for the backward battery: bring any LayerNorm backward to one
calling convention, ``call(dy, x, weight, bias, eps) -> (dx, dweight, dbias)``
on NumPy arrays.

The implementation may be a backward function (NumPy, PyTorch or JAX
arrays), a forward that the framework differentiates (a ``torch.nn.Module``,
``F.layer_norm`` or a function of tensors through autograd; a JAX function
through ``jax.vjp``), or layernorm_c's own :func:`~layernorm_c.layer_norm_backward`
and :class:`~layernorm_c.LayerNorm` layer.
"""
from __future__ import annotations

import contextlib
import copy
import importlib
import sys
from dataclasses import dataclass, replace
from typing import (Any, Callable, ContextManager, Dict, Final, Iterator, List, NamedTuple,
                    Optional, Sequence, Tuple, Union)

import numpy as np
import numpy.typing as npt

from ._adapters import Framework, FRAMEWORKS, OutputError, _converted, _name_of, _numpy_out
from ._adapters import _is_torch_layer_norm, _is_torch_rms_norm, _torch_in, _torch_out

__all__ = ["BackwardImplementation", "adapt_backward", "DEFAULT_BACKWARD_SIGNATURE",
           "BackwardLike", "Grads", "ThreadControl"]

#: The default calling convention of a backward:
#: ``fn(dy, x, weight, bias, eps) -> (dx, dweight, dbias)``.
DEFAULT_BACKWARD_SIGNATURE: Final = "dy, x, weight, bias, eps -> dx, dweight, dbias"
_INPUTS = ("dy", "x", "weight", "bias", "eps")
_OUTPUTS = ("dx", "dweight", "dbias")


class Grads(NamedTuple):
    """What a backward returned, as NumPy arrays (``None``: not returned)."""

    dx: npt.NDArray[Any]
    dweight: Optional[npt.NDArray[Any]]
    dbias: Optional[npt.NDArray[Any]]


@dataclass(frozen=True)
class ThreadControl:
    """How to run an implementation with a given number of threads.

    Attributes
    ----------
    name : str
        What sets the count, for the report (``"torch.set_num_threads"``).
    counts : tuple of int
        The thread counts to compare.
    using : callable
        ``using(n)``: a context manager within which calls use ``n`` threads.
    min_bytes : int
        The input size (of x) from which the implementation uses threads.
    """

    name: str
    counts: Tuple[int, ...]
    using: Callable[[int], ContextManager[None]]
    min_bytes: int = 0


@dataclass(frozen=True)
class BackwardImplementation:
    """A LayerNorm backward under audit, brought to
    ``call(dy, x, weight, bias, eps) -> Grads``.

    Build one with :func:`~layernorm_c.testing.adapt` (``backward=True``),
    :func:`~layernorm_c.testing.from_torch` or
    :func:`~layernorm_c.testing.from_jax` rather than directly.

    Attributes
    ----------
    call : callable
        ``call(dy, x, weight, bias, eps)`` with NumPy ``dy`` and ``x`` (and
        ``weight``, ``bias`` of shape ``(d,)`` or None, ``eps`` a float);
        returns :class:`Grads` of NumPy arrays (``dweight``/``dbias`` None
        when not returned).
    name : str
        How reports name the implementation.
    takes_weight, takes_bias, takes_eps : bool
        Which arguments the implementation accepts.
    returns_dweight, returns_dbias : bool
        Which parameter gradients it returns.
    eps : float or None
        The eps the implementation uses itself, when it takes none.
    d : int or None
        The only feature size it supports, if fixed.
    leading_shape : tuple of int or None
        The only leading shape it supports, if fixed.
    framework : str
        ``'numpy'``, ``'torch'`` or ``'jax'``.
    autodiff : str or None
        How the gradients are obtained when the implementation is a forward
        (``'torch autograd'``, ``'jax.vjp'``); None for a backward function.
    threads : ThreadControl or None
        How to change the implementation's thread count, where known.
    """

    call: Callable[..., Grads]
    name: str
    takes_weight: bool = True
    takes_bias: bool = True
    takes_eps: bool = True
    returns_dweight: bool = True
    returns_dbias: bool = True
    eps: Optional[float] = None
    d: Optional[int] = None
    leading_shape: Optional[Tuple[int, ...]] = None
    framework: str = "numpy"
    autodiff: Optional[str] = None
    threads: Optional[ThreadControl] = None

    def restricted(self, d: Optional[int] = None,
                   leading_shape: Optional[Sequence[int]] = None) -> BackwardImplementation:
        """A copy that also declares a fixed ``d`` and/or leading shape."""
        changes: Dict[str, Any] = {}
        if d is not None:
            if self.d is not None and self.d != d:
                raise ValueError(f"d: {self.name} only supports d={self.d}, got d={d}")
            changes["d"] = int(d)
        if leading_shape is not None:
            changes["leading_shape"] = tuple(int(n) for n in leading_shape)
        return replace(self, **changes) if changes else self


#: What the backward audit accepts: a backward callable, a forward the
#: framework can differentiate (torch module, ``F.layer_norm``, a function
#: with a signature without ``dy``), or a :class:`BackwardImplementation`.
BackwardLike = Union[Callable[..., Any], BackwardImplementation]


class _Signature(NamedTuple):
    positional: Tuple[str, ...]
    keyword: Tuple[str, ...]
    outputs: Tuple[str, ...]

    @property
    def names(self) -> Tuple[str, ...]:
        return self.positional + self.keyword

    @property
    def forward(self) -> bool:
        """A signature without ``dy``: the function is a forward."""
        return "dy" not in self.names


def _parse_signature(signature: str) -> _Signature:
    """``"dy, x, weight, *, eps -> dx, dweight"``; a signature without ``dy``
    (``"x, weight, bias, eps"``) describes a forward, and has no outputs."""
    if not isinstance(signature, str):
        raise TypeError(f"signature: expected a str such as {DEFAULT_BACKWARD_SIGNATURE!r}, "
                        f"got {type(signature).__name__}")
    inputs, arrow, outputs = signature.partition("->")
    positional: List[str] = []
    keyword: List[str] = []
    target = positional
    for token in (t.strip() for t in inputs.split(",")):
        if token == "*":
            target = keyword
            continue
        if token not in _INPUTS:
            raise ValueError(f"signature: unknown argument {token!r} in {signature!r}; "
                             f"expected names among {_INPUTS} (and '*' before keywords)")
        target.append(token)
    names = positional + keyword
    if len(set(names)) != len(names):
        raise ValueError(f"signature: repeated argument in {signature!r}")
    if "x" not in positional:
        raise ValueError(f"signature: expected 'x' as a positional argument, got {signature!r}")
    forward = "dy" not in names
    if forward:
        if arrow:
            raise ValueError(f"signature: {signature!r} has no 'dy', so it describes a forward "
                             "(differentiated by the framework), whose outputs are implied; "
                             "drop the '-> ...'")
        out = ("dx",) + (("dweight",) if "weight" in names else ()) \
            + (("dbias",) if "bias" in names else ())
    elif arrow:
        out = tuple(t.strip() for t in outputs.split(","))
        unknown = [t for t in out if t not in _OUTPUTS]
        if unknown or len(set(out)) != len(out) or "dx" not in out:
            raise ValueError(f"signature: expected outputs among {_OUTPUTS}, dx included, each "
                             f"once, after '->'; got {signature!r}")
    else:
        out = _OUTPUTS
    return _Signature(tuple(positional), tuple(keyword), out)


def _grads(result: Any, outputs: Tuple[str, ...],
           convert: Callable[[Any], npt.NDArray[Any]]) -> Grads:
    """What the implementation returned, by the names of ``outputs``."""
    if len(outputs) == 1 and not isinstance(result, (tuple, list)):
        values: Sequence[Any] = (result,)
    elif isinstance(result, (tuple, list)):
        values = result
    elif isinstance(result, dict):
        values = [result.get(k) for k in outputs]
    else:
        raise OutputError(f"returned a {type(result).__name__}; expected a tuple "
                          f"({', '.join(outputs)})")
    if len(values) != len(outputs):
        raise OutputError(f"returned {len(values)} values; expected {len(outputs)} "
                          f"({', '.join(outputs)}): say which with the signature's "
                          "'-> dx, dweight, dbias' part")
    by_name: Dict[str, Optional[npt.NDArray[Any]]] = {"dweight": None, "dbias": None}
    for name, value in zip(outputs, values):
        if value is None:
            raise OutputError(f"returned None for {name}")
        by_name[name] = _converted(value, convert)
    dx = by_name["dx"]
    assert dx is not None
    return Grads(dx, by_name["dweight"], by_name["dbias"])


def _numpy_in(a: npt.NDArray[Any]) -> Any:
    return a


def _backward_function(fn: Callable[..., Any], sig: _Signature,
                       convert_in: Callable[[npt.NDArray[Any]], Any],
                       convert_out: Callable[[Any], npt.NDArray[Any]]) -> Callable[..., Grads]:
    def call(dy: npt.NDArray[Any], x: npt.NDArray[Any], weight: Optional[npt.NDArray[Any]],
             bias: Optional[npt.NDArray[Any]], eps: float) -> Grads:
        arrays = {"dy": dy, "x": x, "weight": weight, "bias": bias}
        values: Dict[str, Any] = {k: (None if v is None else convert_in(v))
                                  for k, v in arrays.items()}
        values["eps"] = eps
        args = [values[n] for n in sig.positional]
        kwargs = {n: values[n] for n in sig.keyword}
        return _grads(fn(*args, **kwargs), sig.outputs, convert_out)

    return call


def _implementation(call: Callable[..., Grads], name: str, sig: _Signature, framework: str,
                    **extra: Any) -> BackwardImplementation:
    names = sig.names
    return BackwardImplementation(call, name, "weight" in names, "bias" in names,
                                  "eps" in names, "dweight" in sig.outputs,
                                  "dbias" in sig.outputs, framework=framework, **extra)


# -- layernorm_c's own --------------------------------------------------------

def _layernorm_c_threads() -> ThreadControl:
    import layernorm_c

    @contextlib.contextmanager
    def using(n: int) -> Iterator[None]:
        before = layernorm_c.get_num_threads()
        layernorm_c.set_num_threads(n)
        try:
            yield
        finally:
            layernorm_c.set_num_threads(before)

    return ThreadControl("layernorm_c.set_num_threads", (1, 2, 4), using,
                         layernorm_c.thread_threshold())


def _known_layernorm_c(fn: Any) -> Optional[BackwardImplementation]:
    """layernorm_c.layer_norm_backward, reference_layer_norm_backward and a
    LayerNorm layer, whose conventions are known; None for anything else."""
    lnc = sys.modules.get("layernorm_c")
    if lnc is None:
        return None
    if fn is lnc.layer_norm or fn is lnc.reference_layer_norm:
        raise TypeError(f"fn: {_name_of(fn)} is a forward; audit its backward "
                        f"({fn.__name__}_backward) or a layernorm_c.LayerNorm layer")
    if fn is lnc.layer_norm_backward or fn is lnc.reference_layer_norm_backward:
        sig = _parse_signature("dy, x, weight, eps")
        threads = _layernorm_c_threads() if fn is lnc.layer_norm_backward else None
        return _implementation(_backward_function(fn, sig, _numpy_in, _numpy_out),
                               f"layernorm_c.{fn.__name__}", sig, "numpy", threads=threads)
    if isinstance(fn, lnc.LayerNorm):
        return _layernorm_c_layer(lnc, fn)
    return None


def _layernorm_c_layer(lnc: Any, layer: Any) -> BackwardImplementation:
    """A LayerNorm layer: each call makes a fresh layer like it in the audit
    dtype with the check's parameters, runs its forward and its backward,
    and returns dx and the gradients accumulated from zero."""
    if len(layer.normalized_shape) != 1:
        raise ValueError(f"layer: only LayerNorm over the last axis can be audited; it has "
                         f"normalized_shape {layer.normalized_shape}")
    takes_weight = layer.weight is not None
    takes_bias = layer.bias is not None

    def call(dy: npt.NDArray[Any], x: npt.NDArray[Any], w: Optional[npt.NDArray[Any]],
             b: Optional[npt.NDArray[Any]], _eps: float) -> Grads:
        fresh = lnc.LayerNorm(layer.normalized_shape, layer.eps, gain=takes_weight,
                              bias=takes_bias, dtype=x.dtype)
        fresh.load_state_dict({k: v for k, v in (("weight", w), ("bias", b))
                               if v is not None})
        fresh(x)
        dx = fresh.backward(dy)
        return Grads(np.asarray(dx), fresh.grad_weight, fresh.grad_bias)

    return BackwardImplementation(call, "layernorm_c.LayerNorm", takes_weight, takes_bias,
                                  False, takes_weight, takes_bias, float(layer.eps),
                                  layer.normalized_shape[0], framework="numpy",
                                  threads=_layernorm_c_threads())


# -- PyTorch --------------------------------------------------------------------

def _torch_threads(torch: Any) -> ThreadControl:
    @contextlib.contextmanager
    def using(n: int) -> Iterator[None]:
        before = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    return ThreadControl("torch.set_num_threads", (1, max(2, torch.get_num_threads())), using)


def _torch_vjp(torch: Any, forward: Callable[..., Any], dy: npt.NDArray[Any],
               inputs: Sequence[Any]) -> List[npt.NDArray[Any]]:
    """Autograd: the gradients of ``forward(*inputs)`` against ``dy`` with
    respect to every input (zeros for an input the output does not use)."""
    leaves = [t.detach().requires_grad_(True) for t in inputs]
    with torch.enable_grad():
        y = forward(*leaves)
        if not isinstance(y, torch.Tensor):
            raise OutputError(f"returned a {type(y).__name__}, not a tensor to differentiate")
        if not y.requires_grad:
            grads: Sequence[Any] = [None] * len(leaves)
        else:
            grads = torch.autograd.grad(y, leaves, _torch_in(dy).to(y.dtype),
                                        allow_unused=True)
    return [_converted(torch.zeros_like(t) if g is None else g, _torch_out)
            for t, g in zip(leaves, grads)]


def _torch_autograd(torch: Any, forward: Callable[..., Any], sig: _Signature
                    ) -> Callable[..., Grads]:
    """A forward ``forward(x, weight, bias, eps)`` (as the signature says)
    differentiated by autograd."""
    def call(dy: npt.NDArray[Any], x: npt.NDArray[Any], weight: Optional[npt.NDArray[Any]],
             bias: Optional[npt.NDArray[Any]], eps: float) -> Grads:
        given = [(k, v) for k, v in (("x", x), ("weight", weight), ("bias", bias))
                 if v is not None]

        def f(*tensors: Any) -> Any:
            values: Dict[str, Any] = {"x": None, "weight": None, "bias": None, "eps": eps}
            values.update({k: t for (k, _), t in zip(given, tensors)})
            return forward(*[values[n] for n in sig.positional],
                           **{n: values[n] for n in sig.keyword})

        grads = dict(zip([k for k, _ in given],
                         _torch_vjp(torch, f, dy, [_torch_in(v) for _, v in given])))
        return Grads(grads["x"], grads.get("weight"), grads.get("bias"))

    return call


def _torch_module(torch: Any, module: Any) -> BackwardImplementation:
    """Autograd through a copy of ``module``, its ``weight`` and ``bias``
    overwritten with each check's parameters, its own eps."""
    module = copy.deepcopy(module)
    weight: Any = getattr(module, "weight", None)
    bias: Any = getattr(module, "bias", None)
    takes_weight = isinstance(weight, torch.Tensor)
    takes_bias = isinstance(bias, torch.Tensor)
    normalized_shape: Any = getattr(module, "normalized_shape", None)
    if normalized_shape is not None and len(normalized_shape) != 1:
        raise ValueError(f"module: only LayerNorm over the last axis can be audited; "
                         f"{type(module).__name__} has normalized_shape {tuple(normalized_shape)}")
    d = (normalized_shape[0] if normalized_shape is not None
         else weight.shape[-1] if takes_weight else None)
    eps: Any = getattr(module, "eps", None)
    # An eps of None (nn.RMSNorm's default, which changes with the dtype) is
    # set on the audited copy, call by call, as the forward's adapter does.
    eps_settable = hasattr(module, "eps") and eps is None

    def call(dy: npt.NDArray[Any], x: npt.NDArray[Any], w: Optional[npt.NDArray[Any]],
             b: Optional[npt.NDArray[Any]], eps_: float) -> Grads:
        tx = _torch_in(x)
        module.to(tx.dtype)
        if eps_settable:
            module.eps = eps_
        with torch.no_grad():
            if w is not None:
                module.weight.copy_(_torch_in(w))
            if b is not None:
                module.bias.copy_(_torch_in(b))
        params = [p for p, taken in ((module.weight if takes_weight else None, takes_weight),
                                     (module.bias if takes_bias else None, takes_bias)) if taken]
        with torch.enable_grad():
            leaf = tx.detach().requires_grad_(True)
            y = module(leaf)
            grads = torch.autograd.grad(y, [leaf] + params, _torch_in(dy).to(y.dtype),
                                        allow_unused=True)
        out = [_converted(torch.zeros_like(t) if g is None else g, _torch_out)
               for t, g in zip([leaf] + params, grads)]
        dw = out[1] if takes_weight else None
        db = out[-1] if takes_bias else None
        return Grads(out[0], dw, db)

    name = type(module).__name__ + (" (eps None, set by the audit)" if eps_settable else "")
    return BackwardImplementation(call, name, takes_weight, takes_bias, eps_settable,
                                  takes_weight, takes_bias, None if eps is None else float(eps),
                                  d, framework="torch", autodiff="torch autograd",
                                  threads=_torch_threads(torch))


def _adapt_torch(fn: Callable[..., Any], signature: Optional[str]) -> BackwardImplementation:
    torch = importlib.import_module("torch")
    threads = _torch_threads(torch)
    if isinstance(fn, torch.nn.Module):
        return _torch_module(torch, fn)
    if _is_torch_layer_norm(torch, fn):
        def layer_norm(x: Any, weight: Any, bias: Any, eps: float) -> Any:
            return fn(x, x.shape[-1:], weight, bias, eps)

        sig = _parse_signature("x, weight, bias, eps")
        return _implementation(_torch_autograd(torch, layer_norm, sig),
                               f"torch.nn.functional.{fn.__name__}", sig, "torch",
                               autodiff="torch autograd", threads=threads)
    if _is_torch_rms_norm(torch, fn):
        def rms_norm(x: Any, weight: Any, eps: float) -> Any:
            return fn(x, x.shape[-1:], weight, eps)

        sig = _parse_signature("x, weight, eps")
        return _implementation(_torch_autograd(torch, rms_norm, sig),
                               f"torch.nn.functional.{fn.__name__}", sig, "torch",
                               autodiff="torch autograd", threads=threads)
    sig = _parse_signature(signature or DEFAULT_BACKWARD_SIGNATURE)
    if sig.forward:
        return _implementation(_torch_autograd(torch, fn, sig), _name_of(fn), sig, "torch",
                               autodiff="torch autograd", threads=threads)
    return _implementation(_backward_function(fn, sig, _torch_in, _torch_out),
                           _name_of(fn), sig, "torch", threads=threads)


# -- JAX ----------------------------------------------------------------------

def _jax_vjp(fn: Callable[..., Any], sig: _Signature) -> Callable[..., Grads]:
    """A forward ``fn(x, weight, bias, eps)`` (as the signature says)
    differentiated by ``jax.vjp``.

    The forward and its pullback run under one ``jax.jit`` (eps traced, so a
    new eps does not compile again), unless ``fn`` cannot be traced (Python
    control flow on values): then op by op.
    """
    jax = importlib.import_module("jax")
    jnp = importlib.import_module("jax.numpy")
    compiled: Dict[Tuple[str, ...], Any] = {}
    untraceable: List[bool] = []

    def grads_of(names: Tuple[str, ...]) -> Callable[..., Any]:
        def grads(dy: Any, eps: Any, *arrays: Any) -> Any:
            def f(*primals: Any) -> Any:
                values: Dict[str, Any] = {"x": None, "weight": None, "bias": None, "eps": eps}
                values.update(zip(names, primals))
                return fn(*[values[n] for n in sig.positional],
                          **{n: values[n] for n in sig.keyword})

            y, vjp = jax.vjp(f, *arrays)
            return vjp(dy.astype(y.dtype))

        return grads

    def call(dy: npt.NDArray[Any], x: npt.NDArray[Any], weight: Optional[npt.NDArray[Any]],
             bias: Optional[npt.NDArray[Any]], eps: float) -> Grads:
        given = [(k, v) for k, v in (("x", x), ("weight", weight), ("bias", bias))
                 if v is not None]
        names = tuple(k for k, _ in given)
        args = [jnp.asarray(dy), eps] + [jnp.asarray(v) for _, v in given]
        plain = grads_of(names)
        if untraceable:
            result = plain(*args)
        else:
            jitted = compiled.setdefault(names, jax.jit(plain))
            try:
                result = jitted(*args)
            except Exception:
                # Not traceable under jit (or failing anyway: then the plain
                # call raises the implementation's own error).
                result = plain(*args)
                untraceable.append(True)
        out = {k: _converted(g, np.asarray) for k, g in zip(names, result)}
        return Grads(out["x"], out.get("weight"), out.get("bias"))

    return call


def _adapt_jax(fn: Callable[..., Any], signature: Optional[str]) -> BackwardImplementation:
    sig = _parse_signature(signature or DEFAULT_BACKWARD_SIGNATURE)
    if sig.forward:
        return _implementation(_jax_vjp(fn, sig), _name_of(fn), sig, "jax", autodiff="jax.vjp")
    jnp = importlib.import_module("jax.numpy")
    return _implementation(_backward_function(fn, sig, jnp.asarray, _numpy_out),
                           _name_of(fn), sig, "jax")


# -- dispatch -------------------------------------------------------------------

def adapt_backward(fn: BackwardLike, signature: Optional[str] = None,
                   framework: Framework = "auto", *, name: Optional[str] = None,
                   d: Optional[int] = None,
                   leading_shape: Optional[Sequence[int]] = None) -> BackwardImplementation:
    """Wrap a LayerNorm backward (or a forward its framework differentiates)
    for the backward checks; see :func:`layernorm_c.testing.adapt` with
    ``backward=True``, which calls this."""
    from ._adapters import Implementation, _framework_of

    if isinstance(fn, BackwardImplementation):
        return fn.restricted(d, leading_shape)
    if isinstance(fn, Implementation):
        raise TypeError(f"fn: {fn.name} is adapted as a forward; pass the function or module "
                        "itself, or adapt it with backward=True")
    from ._frameworks import adapt_builtin_backward

    builtin = adapt_builtin_backward(fn)
    if builtin is not None:
        return (builtin if name is None else replace(builtin, name=name)).restricted(
            d, leading_shape)
    if not callable(fn):
        raise TypeError(f"fn: expected a callable LayerNorm backward, got {type(fn).__name__}")
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework: expected one of {FRAMEWORKS}, got {framework!r}")
    known = _known_layernorm_c(fn) if framework in ("auto", "numpy") else None
    if known is not None:
        impl = known
    else:
        if framework == "auto":
            framework = _framework_of(fn)
        if framework == "torch":
            impl = _adapt_torch(fn, signature)
        elif framework == "jax":
            impl = _adapt_jax(fn, signature)
        else:
            sig = _parse_signature(signature or DEFAULT_BACKWARD_SIGNATURE)
            if sig.forward:
                raise ValueError(f"signature: {signature!r} has no 'dy', so {_name_of(fn)} would "
                                 "be a forward to differentiate, which NumPy cannot do: give a "
                                 "backward fn(dy, x, ...), or framework='torch' or 'jax' for a "
                                 "forward written with those")
            impl = _implementation(_backward_function(fn, sig, _numpy_in, _numpy_out),
                                   _name_of(fn), sig, "numpy")
    if name is not None:
        impl = replace(impl, name=name)
    return impl.restricted(d, leading_shape)
