"""Adapters: bring any LayerNorm to the one calling convention the checks
use, ``call(x, weight, bias, eps)`` on NumPy arrays.

An implementation may take fewer arguments (no weight, no bias, no eps), take
them as keywords, live in PyTorch or JAX, or only support one feature size
or one leading shape; :class:`Implementation` records all of that so every
check can adapt its inputs.
"""
from __future__ import annotations

import copy
import importlib
import sys
from dataclasses import dataclass, replace
from typing import (TYPE_CHECKING, Any, Callable, Dict, Final, List, Literal, Optional, Sequence,
                    Tuple, Union, overload)

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from ._backward_adapters import BackwardImplementation, BackwardLike

__all__ = ["Implementation", "adapt", "from_torch", "from_jax", "DEFAULT_SIGNATURE",
           "FRAMEWORKS", "Framework", "LayerNormLike", "OutputError"]

#: The default calling convention: ``fn(x, weight, bias, eps)``.
DEFAULT_SIGNATURE: Final = "x, weight, bias, eps"
#: What an implementation takes and returns (``'auto'``: guess).
Framework = Literal["auto", "numpy", "torch", "jax"]
FRAMEWORKS: Final[Tuple[Framework, ...]] = ("auto", "numpy", "torch", "jax")
_ARGUMENTS = ("x", "weight", "bias", "eps")


class OutputError(TypeError):
    """The implementation returned something that is not an array."""


def _converted(y: Any, convert: Callable[[Any], npt.NDArray[Any]]) -> npt.NDArray[Any]:
    try:
        return convert(y)
    except Exception as exc:
        raise OutputError(f"returned a {type(y).__name__}, which is not an array "
                          f"({type(exc).__name__}: {exc})") from exc


@dataclass(frozen=True)
class Implementation:
    """A LayerNorm under audit, brought to ``call(x, weight, bias, eps)``.

    Build one with :func:`adapt`, :func:`from_torch` or :func:`from_jax`
    rather than directly.

    Attributes
    ----------
    call : callable
        ``call(x, weight, bias, eps)`` with NumPy ``x`` (and ``weight``,
        ``bias`` of shape ``(d,)`` or None, ``eps`` a float); returns the
        output as a NumPy array.
    name : str
        How reports name the implementation.
    takes_weight, takes_bias, takes_eps : bool
        Which arguments the implementation accepts. The checks pass ``None``
        for the ones it does not take, and skip what they cannot probe.
    eps : float or None
        The eps the implementation uses itself, when it takes none.
    d : int or None
        The only feature size (last axis) it supports, if fixed.
    leading_shape : tuple of int or None
        The only leading shape (``x.shape[:-1]``) it supports, if fixed.
    framework : str
        ``'numpy'``, ``'torch'`` or ``'jax'``: what it is called with.
    dtype : str or None
        The dtype the object computes in by its own settings (an ONNX
        node's input type, a keras layer's compute dtype, a flax module's
        ``dtype``): the audit's dtype unless it is given one. None: no dtype
        of its own.
    op : {'layer_norm', 'rms_norm'} or None
        What the object computes, when it says (a built-in adapter's
        ``RMSNorm`` or ``LayerNorm``); the audits refuse the other op.
    details : str or None
        The settings a built-in adapter read from the object (eps, axis,
        dtype, gain and bias), for the report's header.
    """

    call: Callable[..., npt.NDArray[Any]]
    name: str
    takes_weight: bool = True
    takes_bias: bool = True
    takes_eps: bool = True
    eps: Optional[float] = None
    d: Optional[int] = None
    leading_shape: Optional[Tuple[int, ...]] = None
    framework: str = "numpy"
    dtype: Optional[str] = None
    op: Optional[str] = None
    details: Optional[str] = None

    def restricted(self, d: Optional[int] = None,
                   leading_shape: Optional[Sequence[int]] = None) -> Implementation:
        """A copy that also declares a fixed ``d`` and/or leading shape."""
        changes: Dict[str, Any] = {}
        if d is not None:
            if self.d is not None and self.d != d:
                raise ValueError(f"d: {self.name} only supports d={self.d}, got d={d}")
            changes["d"] = int(d)
        if leading_shape is not None:
            changes["leading_shape"] = tuple(int(n) for n in leading_shape)
        return replace(self, **changes) if changes else self


#: What the audit accepts: a LayerNorm callable (a function, a torch module,
#: a jitted function...) or an :class:`Implementation` from :func:`adapt`.
LayerNormLike = Union[Callable[..., Any], Implementation]


def _parse_signature(signature: str) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """``"x, weight, *, eps"`` -> positional ``('x', 'weight')``, keyword
    ``('eps',)``."""
    if not isinstance(signature, str):
        raise TypeError(f"signature: expected a str such as {DEFAULT_SIGNATURE!r}, "
                        f"got {type(signature).__name__}")
    positional: List[str] = []
    keyword: List[str] = []
    target = positional
    for token in (t.strip() for t in signature.split(",")):
        if token == "*":
            target = keyword
            continue
        if token not in _ARGUMENTS:
            raise ValueError(f"signature: unknown argument {token!r} in {signature!r}; "
                             f"expected names among {_ARGUMENTS} (and '*' before keywords)")
        target.append(token)
    names = positional + keyword
    if len(set(names)) != len(names):
        raise ValueError(f"signature: repeated argument in {signature!r}")
    if "x" not in positional:
        raise ValueError(f"signature: expected 'x' as a positional argument, got {signature!r}")
    return tuple(positional), tuple(keyword)


def _numpy_out(y: Any) -> npt.NDArray[Any]:
    return np.asarray(y)


def _torch_out(y: Any) -> npt.NDArray[Any]:
    if hasattr(y, "detach"):
        y = y.detach().cpu()
        if str(y.dtype) == "torch.bfloat16":
            from ._ops import bfloat16

            bf16 = bfloat16()
            if bf16 is not None:  # the same bits
                torch = importlib.import_module("torch")
                return np.asarray(y.contiguous().view(torch.int16).numpy()).view(bf16)
            y = y.float()
        return np.asarray(y.numpy())
    return np.asarray(y)


def _name_of(fn: Any) -> str:
    name = (getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
            or type(fn).__name__)
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module and module not in ("__main__", "builtins") else name


def _framework_of(fn: Any) -> Literal["numpy", "torch", "jax"]:
    """Guess the framework of ``fn`` without importing any."""
    torch = sys.modules.get("torch")
    if torch is not None and (isinstance(fn, torch.nn.Module) or _is_torch_layer_norm(torch, fn)
                              or _is_torch_rms_norm(torch, fn)):
        return "torch"
    module = getattr(type(fn), "__module__", "") or ""
    if module.split(".")[0] in ("jax", "jaxlib", "flax"):
        return "jax"
    return "numpy"


def _is_torch_layer_norm(torch: Any, fn: Any) -> bool:
    """Whether ``fn`` is ``F.layer_norm`` (or ``torch.layer_norm``), whose
    second argument is the normalized shape."""
    return fn is torch.nn.functional.layer_norm or fn is torch.layer_norm


def _is_torch_rms_norm(torch: Any, fn: Any) -> bool:
    """Whether ``fn`` is ``F.rms_norm`` (or ``torch.rms_norm``):
    ``(x, normalized_shape, weight, eps)``."""
    functional = getattr(torch.nn.functional, "rms_norm", None)
    return fn is not None and (fn is functional or fn is getattr(torch, "rms_norm", None))


@overload
def adapt(fn: LayerNormLike, signature: Optional[str] = None, framework: Framework = "auto", *,
          name: Optional[str] = None, d: Optional[int] = None,
          leading_shape: Optional[Sequence[int]] = None,
          backward: Literal[False] = False) -> Implementation: ...


@overload
def adapt(fn: BackwardLike, signature: Optional[str] = None, framework: Framework = "auto", *,
          name: Optional[str] = None, d: Optional[int] = None,
          leading_shape: Optional[Sequence[int]] = None,
          backward: Literal[True]) -> BackwardImplementation: ...


def adapt(fn: Any, signature: Optional[str] = None, framework: Framework = "auto", *,
          name: Optional[str] = None, d: Optional[int] = None,
          leading_shape: Optional[Sequence[int]] = None,
          backward: bool = False) -> Union[Implementation, BackwardImplementation]:
    """Wrap a LayerNorm callable for the checks (``backward=True``: for the
    backward checks).

    Parameters
    ----------
    fn : callable, object or Implementation
        The LayerNorm under audit. An :class:`Implementation` is returned as
        is (with ``d`` and ``leading_shape`` applied). A built-in
        framework's object is recognised, its eps, axis, dtype, gain and
        bias read from it (see :attr:`Implementation.details`): a flax
        ``linen`` or ``nnx`` ``LayerNorm`` or ``RMSNorm``, an equinox
        ``nn.LayerNorm`` or ``nn.RMSNorm``, a keras ``LayerNormalization``
        or ``RMSNormalization`` (any backend), ``jax.nn.standardize``, or an
        ONNX model with one kind of normalization node (an
        ``onnx.ModelProto``, a path to a ``.onnx`` file, an
        ``onnxruntime.InferenceSession``, an
        ``onnx.reference.ReferenceEvaluator``; see :func:`from_onnx` for
        models with several).
    signature : str, optional
        How ``fn`` takes its arguments: the names ``x``, ``weight``,
        ``bias``, ``eps`` in order, comma separated; names after a ``*`` are
        passed as keywords. Default ``"x, weight, bias, eps"``. Examples:
        ``"x"`` (no parameters, eps built in), ``"x, eps"``,
        ``"x, weight, eps"`` (gain only), ``"x, *, weight, bias, eps"``.
        Ignored for a ``torch.nn.Module``, ``F.layer_norm`` and the
        built-in frameworks' objects, whose conventions are known.
    framework : {'auto', 'numpy', 'torch', 'jax'}, optional
        What ``fn`` takes and returns. ``'numpy'`` passes NumPy arrays and
        reads the result with ``np.asarray`` (anything array-like works);
        ``'torch'`` passes CPU tensors; ``'jax'`` passes ``jax.numpy``
        arrays. ``'auto'`` (default) picks torch for an ``nn.Module``,
        ``F.layer_norm`` or ``F.rms_norm``, jax for a jitted function or a
        flax module (``linen`` or ``nnx``: its ``scale`` and ``bias`` are set
        to each check's parameters, its ``epsilon`` used), numpy otherwise.
    name : str, optional
        How reports name ``fn``; default its qualified name.
    d : int, optional
        The only feature size ``fn`` supports.
    leading_shape : tuple of int, optional
        The only leading shape ``x.shape[:-1]`` ``fn`` supports.
    backward : bool, optional
        Adapt a LayerNorm *backward* for
        :class:`~layernorm_c.testing.LayerNormBackwardAudit`. ``fn`` is then
        either a backward function, by default called as
        ``fn(dy, x, weight, bias, eps)`` and returning
        ``(dx, dweight, dbias)`` (the signature
        ``"dy, x, weight, bias, eps -> dx, dweight, dbias"``; e.g.
        ``"dy, x, weight, eps -> dx, dweight"``), or a *forward* that the
        framework differentiates: a ``torch.nn.Module`` or ``F.layer_norm``
        (torch autograd), or any torch or JAX function whose signature has
        no ``dy`` (``"x, weight, bias, eps"``: torch autograd, ``jax.vjp``).
        ``layernorm_c.layer_norm_backward``,
        ``layernorm_c.reference_layer_norm_backward`` and a
        ``layernorm_c.LayerNorm`` layer are recognized. Default False.

    Returns
    -------
    Implementation or BackwardImplementation
        The latter with ``backward=True``.

    Raises
    ------
    ValueError
        An unknown framework or a malformed signature; an ONNX model with
        several distinct normalization nodes; a built-in object normalizing
        over other axes than the last.
    ImportError
        ``framework='torch'`` or ``'jax'`` without that package installed.
    """
    if backward:
        from ._backward_adapters import adapt_backward

        return adapt_backward(fn, signature, framework, name=name, d=d,
                              leading_shape=leading_shape)
    if isinstance(fn, Implementation):
        return fn.restricted(d, leading_shape)
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework: expected one of {FRAMEWORKS}, got {framework!r}")
    from ._frameworks import adapt_builtin

    builtin = adapt_builtin(fn)
    if builtin is not None:
        impl = builtin if name is None else replace(builtin, name=name)
        return impl.restricted(d, leading_shape)
    if not callable(fn):
        raise TypeError(f"fn: expected a callable LayerNorm (or a built-in framework's object: "
                        f"an ONNX model or its path, a flax, keras or equinox LayerNorm), got "
                        f"{type(fn).__name__}")
    if framework == "auto":
        framework = _framework_of(fn)
    if framework == "torch":
        impl = _adapt_torch(fn, signature)
    elif framework == "jax" and _flax_kind(fn) is not None:
        impl = _adapt_flax(fn)
    else:
        convert_in = _jax_converter() if framework == "jax" else _numpy_in
        impl = _adapt_function(fn, signature or DEFAULT_SIGNATURE, convert_in, _numpy_out)
    impl = replace(impl, framework=framework)
    if name is not None:
        impl = replace(impl, name=name)
    return impl.restricted(d, leading_shape)


def _numpy_in(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    return a


# torch and jax are imported by name (an ImportError names the missing
# package): they are optional, and their types stay out of type checking.

def _jax_converter() -> Callable[[npt.NDArray[Any]], Any]:
    jnp = importlib.import_module("jax.numpy")
    convert: Callable[[npt.NDArray[Any]], Any] = jnp.asarray
    return convert


def _flax_kind(fn: Any) -> Optional[str]:
    """``'linen'`` or ``'nnx'`` for a flax module, else None (flax is not
    imported unless it already is)."""
    flax = sys.modules.get("flax")
    if flax is None:
        return None
    linen = sys.modules.get("flax.linen")
    nnx = sys.modules.get("flax.nnx")
    if linen is not None and isinstance(fn, linen.Module):
        return "linen"
    if nnx is not None and isinstance(fn, nnx.Module):
        return "nnx"
    return None


def _adapt_flax(module: Any) -> Implementation:
    """A flax normalization module (linen or nnx: ``LayerNorm``,
    ``RMSNorm``...): its ``scale`` and ``bias`` (where it has them) replaced
    by each check's parameters, its own ``epsilon``. An nnx module is
    audited through a private copy and has a fixed feature size."""
    jnp = importlib.import_module("jax.numpy")
    kind = _flax_kind(module)
    eps = float(getattr(module, "epsilon", 1e-6))
    takes_weight = bool(getattr(module, "use_scale", True))
    takes_bias = bool(getattr(module, "use_bias", False))
    d: Optional[int] = None
    if kind == "nnx":
        module = copy.deepcopy(module)
        takes_weight = getattr(module, "scale", None) is not None
        takes_bias = getattr(module, "bias", None) is not None
        features = getattr(module, "num_features", None)
        d = None if features is None else int(features)

    # A linen module's apply is jitted (compiled once per shape and dtype).
    apply = (importlib.import_module("jax").jit(
        lambda params, x: module.apply({"params": params}, x)) if kind == "linen" else None)

    def call(x: npt.NDArray[Any], w: Optional[npt.NDArray[Any]], b: Optional[npt.NDArray[Any]],
             _eps: float) -> npt.NDArray[Any]:
        given = {k: jnp.asarray(v) for k, v in (("scale", w), ("bias", b)) if v is not None}
        if apply is None:
            for k, v in given.items():
                getattr(module, k).set_value(v)
            y = module(jnp.asarray(x))
        else:
            y = apply(given, jnp.asarray(x))
        return _converted(y, np.asarray)

    return Implementation(call, f"flax.{kind}.{type(module).__name__}", takes_weight, takes_bias,
                          False, eps, d, framework="jax")


def _adapt_function(fn: Callable[..., Any], signature: str,
                    convert_in: Callable[[npt.NDArray[Any]], Any],
                    convert_out: Callable[[Any], npt.NDArray[Any]]) -> Implementation:
    positional, keyword = _parse_signature(signature)
    names = positional + keyword

    def call(x: npt.NDArray[Any], weight: Optional[npt.NDArray[Any]],
             bias: Optional[npt.NDArray[Any]], eps: float) -> npt.NDArray[Any]:
        arrays = {"x": x, "weight": weight, "bias": bias}
        values: Dict[str, Any] = {k: (None if v is None else convert_in(v))
                                  for k, v in arrays.items()}
        values["eps"] = eps
        args = [values[n] for n in positional]
        kwargs = {n: values[n] for n in keyword}
        return _converted(fn(*args, **kwargs), convert_out)

    return Implementation(call, _name_of(fn), "weight" in names, "bias" in names, "eps" in names)


def _adapt_torch(fn: Callable[..., Any], signature: Optional[str]) -> Implementation:
    torch = importlib.import_module("torch")

    if isinstance(fn, torch.nn.Module):
        return _adapt_torch_module(torch, fn)
    if _is_torch_layer_norm(torch, fn):
        def layer_norm(x: Any, weight: Any, bias: Any, eps: float) -> Any:
            return fn(x, x.shape[-1:], weight, bias, eps)

        impl = _adapt_function(layer_norm, DEFAULT_SIGNATURE, _torch_in, _torch_out)
        return replace(impl, name=f"torch.nn.functional.{fn.__name__}")
    if _is_torch_rms_norm(torch, fn):
        def rms_norm(x: Any, weight: Any, eps: float) -> Any:
            return fn(x, x.shape[-1:], weight, eps)

        impl = _adapt_function(rms_norm, "x, weight, eps", _torch_in, _torch_out)
        return replace(impl, name=f"torch.nn.functional.{fn.__name__}")
    return _adapt_function(fn, signature or DEFAULT_SIGNATURE, _torch_in, _torch_out)


def _torch_in(a: npt.NDArray[Any]) -> Any:
    """A NumPy array as a CPU tensor; bfloat16 (ml_dtypes) by its bits."""
    torch = importlib.import_module("torch")
    if a.dtype.kind == "V" and a.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _adapt_torch_module(torch: Any, module: Any) -> Implementation:
    """Audit a copy of ``module``: its ``weight`` and ``bias`` (if any) are
    overwritten with each check's parameters, its own eps is used."""
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
    # An eps of None (nn.RMSNorm's default: torch.finfo(x.dtype).eps, which
    # changes with the dtype) is set on the audited copy, call by call.
    eps_settable = hasattr(module, "eps") and eps is None

    def call(x: npt.NDArray[Any], w: Optional[npt.NDArray[Any]], b: Optional[npt.NDArray[Any]],
             eps_: float) -> npt.NDArray[Any]:
        tx = _torch_in(x)
        with torch.no_grad():
            module.to(tx.dtype)
            if eps_settable:
                module.eps = eps_
            if w is not None:
                module.weight.copy_(_torch_in(w))
            if b is not None:
                module.bias.copy_(_torch_in(b))
            return _converted(module(tx), _torch_out)

    name = type(module).__name__ + (" (eps None, set by the audit)" if eps_settable else "")
    return Implementation(call, name, takes_weight, takes_bias, eps_settable,
                          None if eps is None else float(eps), d)


@overload
def from_torch(fn: Callable[..., Any], signature: Optional[str] = None, *,
               name: Optional[str] = None, d: Optional[int] = None,
               leading_shape: Optional[Sequence[int]] = None,
               backward: Literal[False] = False) -> Implementation: ...


@overload
def from_torch(fn: Callable[..., Any], signature: Optional[str] = None, *,
               name: Optional[str] = None, d: Optional[int] = None,
               leading_shape: Optional[Sequence[int]] = None,
               backward: Literal[True]) -> BackwardImplementation: ...


def from_torch(fn: Callable[..., Any], signature: Optional[str] = None, *,
               name: Optional[str] = None, d: Optional[int] = None,
               leading_shape: Optional[Sequence[int]] = None,
               backward: bool = False) -> Union[Implementation, BackwardImplementation]:
    """Adapt a PyTorch LayerNorm: an ``nn.Module``, ``F.layer_norm``, or a
    function of tensors.

    With ``backward=True``, for the backward checks: a module,
    ``F.layer_norm`` or a function whose signature has no ``dy`` (such as
    ``"x, weight, bias, eps"``) is differentiated by autograd
    (``torch.autograd.grad`` of its output against ``dy``, with respect to
    ``x``, the module's ``weight`` and ``bias``); a function whose
    signature has ``dy`` is a backward of tensors, called as it says.

    A module is audited through a private copy: its ``weight`` and ``bias``
    are overwritten with the checks' parameters, its ``eps`` is used and
    its feature size is fixed to ``normalized_shape``. ``F.layer_norm`` is
    called as ``F.layer_norm(x, x.shape[-1:], weight, bias, eps)``.

    Parameters
    ----------
    fn : torch.nn.Module or callable
        The implementation.
    signature : str, optional
        For a plain function: see :func:`adapt`.
    name, d, leading_shape, backward : optional
        See :func:`adapt`.

    Returns
    -------
    Implementation or BackwardImplementation
    """
    if backward:
        return adapt(fn, signature, "torch", name=name, d=d, leading_shape=leading_shape,
                     backward=True)
    return adapt(fn, signature, "torch", name=name, d=d, leading_shape=leading_shape)


@overload
def from_jax(fn: Callable[..., Any], signature: Optional[str] = None, *,
             name: Optional[str] = None, d: Optional[int] = None,
             leading_shape: Optional[Sequence[int]] = None,
             backward: Literal[False] = False) -> Implementation: ...


@overload
def from_jax(fn: Callable[..., Any], signature: Optional[str] = None, *,
             name: Optional[str] = None, d: Optional[int] = None,
             leading_shape: Optional[Sequence[int]] = None,
             backward: Literal[True]) -> BackwardImplementation: ...


def from_jax(fn: Callable[..., Any], signature: Optional[str] = None, *,
             name: Optional[str] = None, d: Optional[int] = None,
             leading_shape: Optional[Sequence[int]] = None,
             backward: bool = False) -> Union[Implementation, BackwardImplementation]:
    """Adapt a JAX LayerNorm: inputs are passed as ``jax.numpy`` arrays.

    With ``backward=True``, for the backward checks: a function whose
    signature has no ``dy`` (``"x, weight, bias, eps"``) is a forward,
    differentiated by ``jax.vjp`` against ``dy`` with respect to ``x``,
    ``weight`` and ``bias``; one whose signature has ``dy`` is a backward,
    called as it says.

    JAX computes in float32 unless ``jax_enable_x64`` is set; a float64
    audit of a JAX function without it reports the narrower output.

    Parameters
    ----------
    fn : callable
        The implementation (jitted or not).
    signature : str, optional
        See :func:`adapt`.
    name, d, leading_shape, backward : optional
        See :func:`adapt`.

    Returns
    -------
    Implementation or BackwardImplementation
    """
    if backward:
        return adapt(fn, signature, "jax", name=name, d=d, leading_shape=leading_shape,
                     backward=True)
    return adapt(fn, signature, "jax", name=name, d=d, leading_shape=leading_shape)
