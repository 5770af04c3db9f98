"""Built-in adapters: the normalization layers of other frameworks,
recognised from the object alone.

Each adapter reads eps, the axis, the dtype and which of gain and bias the
object has from the object itself, and says so in :attr:`Implementation.details`
(the report's header repeats it). The object is never modified: modules are
audited through private copies, an ONNX node through a one-node model of
its own.

Recognised:

* flax ``linen`` and ``nnx`` ``LayerNorm`` and ``RMSNorm`` modules;
* equinox ``nn.LayerNorm`` and ``nn.RMSNorm``;
* keras ``LayerNormalization`` (``rms_scaling=True`` is an RMSNorm) and
  ``RMSNormalization`` layers, on whichever backend keras runs;
* ``jax.nn.standardize`` (and a ``functools.partial`` of it);
* ONNX: an ``onnxruntime.InferenceSession``, an ``onnx.ModelProto``, a path
  to a ``.onnx`` file, or an ``onnx.reference.ReferenceEvaluator``. Every
  ``LayerNormalization`` and ``RMSNormalization`` node (and onnxruntime's
  ``SimplifiedLayerNormalization``) is audited with its own attributes;
  nodes whose attributes and types are all the same share one audit.

No framework is imported unless the object comes from it.
"""
from __future__ import annotations

import copy
import functools
import importlib
import math
import os
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import numpy.typing as npt

from ._adapters import Implementation, _converted

if TYPE_CHECKING:
    from ._backward_adapters import BackwardImplementation

__all__ = ["adapt_builtin", "adapt_builtin_backward", "from_onnx", "builtin_kind",
           "expand", "builtin_op", "node_label", "ONNX_RUNTIMES", "OnnxNode",
           "one_node_model"]

Array = npt.NDArray[Any]
Call = Callable[[Array, Optional[Array], Optional[Array], float], Array]

#: The ONNX runtimes :func:`from_onnx` can run a node with.
ONNX_RUNTIMES: Tuple[str, ...] = ("onnxruntime", "reference")


def _root(obj: Any) -> str:
    """The top-level package an object's class comes from."""
    return (getattr(type(obj), "__module__", "") or "").split(".")[0]


def _is_onnx_path(obj: Any) -> bool:
    return isinstance(obj, (str, os.PathLike)) and os.fspath(obj).lower().endswith(".onnx")


def _is_standardize(obj: Any) -> bool:
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    target = obj.func if isinstance(obj, functools.partial) else obj
    return target is getattr(getattr(jax, "nn", None), "standardize", None)


def builtin_kind(obj: Any) -> Optional[str]:
    """Which built-in adapter takes ``obj``: ``'flax'``, ``'equinox'``,
    ``'keras'``, ``'standardize'``, ``'onnx'``, or None."""
    if _is_onnx_path(obj):
        return "onnx"
    root = _root(obj)
    if root == "onnxruntime" and hasattr(obj, "_model_bytes"):
        return "onnx"
    if root == "onnx" and (hasattr(obj, "graph") or hasattr(obj, "proto_")):
        return "onnx"
    if root == "flax" and _flax_norm(obj) is not None:
        return "flax"
    if root == "equinox" and type(obj).__name__ in ("LayerNorm", "RMSNorm"):
        return "equinox"
    if root == "keras" and type(obj).__name__ in ("LayerNormalization", "RMSNormalization"):
        return "keras"
    if _is_standardize(obj):
        return "standardize"
    return None


def builtin_op(obj: Any) -> Optional[str]:
    """``'layer_norm'`` or ``'rms_norm'``: what a recognised object
    computes (an ONNX model's nodes, when they all compute the same), else
    None."""
    kind = builtin_kind(obj)
    if kind == "flax":
        norm = _flax_norm(obj)
        return None if norm is None else norm[1]
    if kind == "equinox":
        return "layer_norm" if type(obj).__name__ == "LayerNorm" else "rms_norm"
    if kind == "keras":
        return _keras_op(obj)
    if kind == "standardize":
        return "layer_norm"
    if kind == "onnx":
        ops = {impl.op for impl in from_onnx(obj)}
        return ops.pop() if len(ops) == 1 else None
    return None


def adapt_builtin(obj: Any) -> Optional[Implementation]:
    """The :class:`Implementation` of a recognised object, or None.

    Raises
    ------
    ValueError
        The object is recognised but cannot be audited as one
        implementation (an ONNX model with several distinct normalization
        nodes: see :func:`expand`; a normalization over other axes than the
        last ones).
    """
    kind = builtin_kind(obj)
    if kind is None:
        return None
    if kind == "onnx":
        impls = from_onnx(obj)
        if len(impls) != 1:
            raise ValueError(
                f"fn: this ONNX model has {len(impls)} distinct normalization nodes "
                f"({'; '.join(i.name for i in impls)}); audit them side by side with "
                "layernorm_c.testing.compare({'model': model}), or pick one from "
                "layernorm_c.testing.from_onnx(model)")
        return impls[0]
    return _ADAPTERS[kind](obj)


def expand(obj: Any) -> Optional[List[Implementation]]:
    """Every implementation an object holds (one per distinct ONNX node),
    or None when it is not an ONNX model."""
    if builtin_kind(obj) == "onnx":
        return from_onnx(obj)
    return None


def _jax() -> Any:
    return importlib.import_module("jax")


def _jnp() -> Any:
    return importlib.import_module("jax.numpy")


def _settings(**items: Any) -> str:
    """``"eps 1e-06, axis -1, ..."`` for the report's header."""
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in items.items() if v is not None)


def _eps_text(eps: float) -> str:
    """eps with the digits it needs to be told from its neighbours."""
    short = f"{eps:g}"
    return short if float(short) == eps else repr(eps)


def _params_text(weight: bool, bias: bool, weight_name: str = "scale",
                 bias_name: str = "bias") -> str:
    have = [n for n, on in ((weight_name, weight), (bias_name, bias)) if on]
    return " and ".join(have) if have else "no gain, no bias"


def _last_axis_only(name: str, axes: Any) -> None:
    """Raise unless ``axes`` is the last axis (-1, or (-1,))."""
    values = tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)
    if values != (-1,):
        raise ValueError(f"fn: {name} normalizes over axes {axes!r}; the audit normalizes "
                         "over the last axis only (-1)")


# -- flax ------------------------------------------------------------------------

def _flax_norm(obj: Any) -> Optional[Tuple[str, str]]:
    """``(kind, op)`` of a flax LayerNorm or RMSNorm module (kind 'linen' or
    'nnx'), else None."""
    kind = type(obj).__module__.split(".")[1] if "." in type(obj).__module__ else ""
    name = type(obj).__name__
    op = {"LayerNorm": "layer_norm", "RMSNorm": "rms_norm"}.get(name)
    if op is None or kind not in ("linen", "nnx"):
        return None
    return kind, op


def _flax_forward(module: Any) -> Tuple[Callable[..., Any], Dict[str, Any]]:
    """A pure JAX ``f(x, scale, bias)`` computing ``module`` with those
    parameters (None: the module has none), and what the module declares."""
    norm = _flax_norm(module)
    assert norm is not None
    kind, op = norm
    name = f"flax.{kind}.{type(module).__name__}"
    _last_axis_only(name, getattr(module, "reduction_axes", -1))
    _last_axis_only(name, getattr(module, "feature_axes", -1))
    eps = float(module.epsilon)
    dtype = getattr(module, "dtype", None)
    fast = getattr(module, "use_fast_variance", None) if op == "layer_norm" else None
    if kind == "linen":
        takes_weight = bool(module.use_scale)
        takes_bias = bool(getattr(module, "use_bias", False))
        d = None

        def forward(x: Any, scale: Any, bias: Any) -> Any:
            params = {k: v for k, v in (("scale", scale), ("bias", bias)) if v is not None}
            return module.apply({"params": params}, x)
    else:
        nnx = importlib.import_module("flax.nnx")
        module = copy.deepcopy(module)
        takes_weight = getattr(module, "scale", None) is not None
        takes_bias = getattr(module, "bias", None) is not None
        d = int(module.num_features)
        graphdef, state = nnx.split(module)
        tree_util = importlib.import_module("jax.tree_util")
        leaves, treedef = tree_util.tree_flatten_with_path(state)
        # Which leaf of the module's state is its scale, which its bias.
        paths = [tree_util.keystr(path) for path, _ in leaves]
        slots = {k: next((i for i, p in enumerate(paths) if p.startswith(f"['{k}']")), None)
                 for k in ("scale", "bias")}

        def forward(x: Any, scale: Any, bias: Any) -> Any:
            # A module rebuilt from its state with these parameters, inside
            # the function: jit and vjp may then trace them.
            values = [v for _, v in leaves]
            for key, value in (("scale", scale), ("bias", bias)):
                slot = slots[key]
                if value is not None and slot is not None:
                    values[slot] = value
            return nnx.merge(graphdef, tree_util.tree_unflatten(treedef, values))(x)

    declared = {
        "name": name, "op": op, "eps": eps, "d": d, "takes_weight": takes_weight,
        "takes_bias": takes_bias, "dtype": None if dtype is None else np.dtype(dtype).name,
        "details": _settings(
            epsilon=_eps_text(eps), reduction_axes=-1,
            dtype=("follows the input" if dtype is None else np.dtype(dtype).name),
            params=_params_text(takes_weight, takes_bias),
            use_fast_variance=fast),
    }
    return forward, declared


def _jitted(forward: Callable[..., Any]) -> Call:
    """``call(x, w, b, eps)`` of a JAX ``forward(x, w, b)``, jitted (one
    compilation per shape and dtype)."""
    jnp = _jnp()
    compiled = _jax().jit(forward)

    def call(x: Array, w: Optional[Array], b: Optional[Array], _eps: float) -> Array:
        args = [None if a is None else jnp.asarray(a) for a in (x, w, b)]
        return _converted(compiled(*args), np.asarray)

    return call


def _adapt_flax(module: Any) -> Implementation:
    forward, declared = _flax_forward(module)
    return _implementation(_jitted(forward), declared, framework="jax")


def _implementation(call: Call, declared: Dict[str, Any], framework: str) -> Implementation:
    return Implementation(call, declared["name"], declared["takes_weight"],
                          declared["takes_bias"], False, declared["eps"], declared["d"],
                          framework=framework, dtype=declared["dtype"], op=declared["op"],
                          details=declared["details"])


# -- equinox ---------------------------------------------------------------------

def _equinox_forward(module: Any) -> Tuple[Callable[..., Any], Dict[str, Any]]:
    """``f(x, weight, bias)`` of an equinox LayerNorm or RMSNorm: the module
    (which takes one record) mapped over the records by ``jax.vmap``."""
    eqx = importlib.import_module("equinox")
    jax = _jax()
    name = f"equinox.nn.{type(module).__name__}"
    op = "layer_norm" if type(module).__name__ == "LayerNorm" else "rms_norm"
    shape = tuple(module.shape) if module.shape is not None else None
    if shape is None or len(shape) != 1:
        raise ValueError(f"fn: {name} normalizes a record of shape {shape}; the audit "
                         "normalizes one axis (a shape (d,))")
    d = int(shape[0])
    takes_weight = bool(module.use_weight)
    has_bias = bool(module.use_bias)
    # An RMSNorm's battery passes no bias: equinox's RMSNorm (which has one
    # by default) is audited with its bias held at 0.
    takes_bias = has_bias and op == "layer_norm"
    if has_bias and not takes_bias:
        module = eqx.tree_at(lambda m: m.bias, module, _jnp().zeros_like(module.bias))
    weight = module.weight if takes_weight else None
    dtype = None if weight is None else np.dtype(weight.dtype).name

    def forward(x: Any, w: Any, b: Any) -> Any:
        m = module
        if w is not None:
            m = eqx.tree_at(lambda t: t.weight, m, w)
        if b is not None:
            m = eqx.tree_at(lambda t: t.bias, m, b)
        rows = x.reshape((-1, d))
        return jax.vmap(m)(rows).reshape(x.shape)

    params = _params_text(takes_weight, takes_bias, "weight")
    if has_bias and not takes_bias:
        params += " (its bias held at 0: an RMSNorm takes none)"
    declared = {
        "name": name, "op": op, "eps": float(module.eps), "d": d,
        "takes_weight": takes_weight, "takes_bias": takes_bias, "dtype": dtype,
        "details": _settings(eps=_eps_text(float(module.eps)), shape=f"({d},)",
                             params=params, dtype=dtype),
    }
    return forward, declared


def _adapt_equinox(module: Any) -> Implementation:
    forward, declared = _equinox_forward(module)
    return _implementation(_jitted(forward), declared, framework="jax")


# -- keras -----------------------------------------------------------------------

def _keras_op(layer: Any) -> str:
    if type(layer).__name__ == "RMSNormalization" or getattr(layer, "rms_scaling", False):
        return "rms_norm"
    return "layer_norm"


def _keras_axis(name: str, axis: Any) -> int:
    axes = list(axis) if isinstance(axis, (list, tuple)) else [axis]
    if len(axes) != 1:
        raise ValueError(f"fn: {name} normalizes over axes {axis!r}; the audit normalizes "
                         "over one axis")
    return int(axes[0])


def _keras_layer(layer: Any) -> Tuple[Callable[[int], Any], Dict[str, Any]]:
    """``layer_for(d)``: the layer itself when built (its d is then fixed),
    else a private copy built for ``d``; and what the layer declares."""
    keras = importlib.import_module("keras")
    cls = type(layer)
    name = f"keras.layers.{cls.__name__}"
    op = _keras_op(layer)
    axis = _keras_axis(name, layer.axis)
    if op == "rms_norm" and cls.__name__ == "RMSNormalization":
        takes_weight, takes_bias = True, False
        weight_attr, bias_attr = "scale", None
    elif op == "rms_norm":  # LayerNormalization(rms_scaling=True): gamma only
        takes_weight, takes_bias = bool(layer.scale), False
        weight_attr, bias_attr = "gamma", None
    else:
        takes_weight, takes_bias = bool(layer.scale), bool(layer.center)
        weight_attr, bias_attr = "gamma", "beta"
    built: Dict[int, Any] = {}
    d: Optional[int] = None
    rank: Optional[int] = None
    if layer.built:
        # A private copy with the same weights: the user's layer is left alone.
        config = layer.get_config()
        clone = cls.from_config(config)
        shape = _keras_built_shape(layer, weight_attr)
        clone.build(shape)
        for mine, theirs in zip(clone.weights, layer.weights):
            # Through keras.ops: Variable.numpy() warns under NumPy 2.
            mine.assign(keras.ops.convert_to_numpy(theirs.value))
        d = int(shape[-1]) if shape[-1] is not None else None
        rank = len(shape)
        if d is not None:
            built[d] = clone
    config = layer.get_config()

    def layer_for(n: int) -> Any:
        if n not in built:
            if d is not None:
                raise ValueError(f"{name} is built for d={d}, not d={n}")
            fresh = cls.from_config(config)
            fresh.build(((1,) * (rank - 1) if rank else (None,)) + (n,))
            built[n] = fresh
        return built[n]

    if axis >= 0 and rank is None:
        # A non-negative axis is the last one for inputs of rank axis + 1.
        rank = axis + 1
    if rank is not None and axis not in (-1, rank - 1):
        raise ValueError(f"fn: {name} normalizes axis {axis} of inputs of rank {rank}; the "
                         "audit normalizes the last axis")
    eps = float(layer.epsilon)
    compute = str(layer.compute_dtype)
    declared = {
        "name": name, "op": op, "eps": eps, "d": d, "takes_weight": takes_weight,
        "takes_bias": takes_bias, "dtype": compute,
        "details": _settings(epsilon=_eps_text(eps), axis=axis,
                             dtype=f"{compute} (policy {layer.dtype_policy.name})",
                             params=_params_text(takes_weight, takes_bias, weight_attr,
                                                 bias_attr or "beta"),
                             backend=keras.backend.backend()),
        "rank": rank, "weight_attr": weight_attr, "bias_attr": bias_attr,
    }
    return layer_for, declared


def _keras_built_shape(layer: Any, weight_attr: str) -> Tuple[Optional[int], ...]:
    """The input shape a built layer was built for (at least its d)."""
    shape = getattr(layer, "_build_shapes_dict", None) or {}
    for value in shape.values():
        if value is not None:
            return tuple(value)
    weight = getattr(layer, weight_attr, None)
    if weight is None:
        raise ValueError(f"fn: cannot tell which d the built {type(layer).__name__} takes")
    return (None, int(weight.shape[-1]))


def _shaped(x: Array, rank: Optional[int], trailing: Optional[Tuple[int, ...]] = None) -> Array:
    """``x`` (records on its last axis) reshaped for an object that
    normalizes the ``trailing`` axes (default: the last one) of inputs of
    ``rank`` dimensions (default: any): the records gathered in one leading
    axis, ones before it."""
    shape = trailing if trailing is not None else x.shape[-1:]
    lead = x.shape[:-1]
    if rank is not None and rank - len(shape) != len(lead):
        n_lead = rank - len(shape)
        records = math.prod(lead)
        if n_lead == 0:
            if records != 1:
                raise ValueError(f"inputs of rank {rank} hold one record, got {records}")
            lead = ()
        else:
            lead = (1,) * (n_lead - 1) + (records,)
    return x.reshape(lead + tuple(shape))


def _adapt_keras(layer: Any) -> Implementation:
    keras = importlib.import_module("keras")
    layer_for, declared = _keras_layer(layer)
    rank = declared["rank"]
    backend = keras.backend.backend()
    attrs = (declared["weight_attr"], declared["bias_attr"])
    jitted: Dict[int, Any] = {}

    def stateless(target: Any) -> Any:
        """On the jax backend, the layer's ``stateless_call`` under
        ``jax.jit`` (op-by-op dispatch costs ~10 ms a call)."""
        jax = _jax()
        order = [v.path.rsplit("/", 1)[-1] for v in target.trainable_variables]

        def run(params: Dict[str, Any], x: Any) -> Any:
            trainable = [params.get(n, v.value) for n, v in zip(order, target.trainable_variables)]
            y, _ = target.stateless_call(trainable, [v.value for v in
                                                     target.non_trainable_variables], x)
            return y

        return jax.jit(run)

    def call(x: Array, w: Optional[Array], b: Optional[Array], _eps: float) -> Array:
        target = layer_for(x.shape[-1])
        given = {a: v for a, v in zip(attrs, (w, b)) if a is not None and v is not None}
        shaped = _shaped(x, rank)
        if backend == "jax":
            run = jitted.setdefault(id(target), stateless(target))
            params = {a: np.asarray(v, dtype=getattr(target, a).dtype) for a, v in given.items()}
            y = run(params, shaped)
        else:
            for attr, value in given.items():
                variable = getattr(target, attr)
                variable.assign(np.asarray(value, dtype=variable.dtype))
            y = target(shaped)
        return _converted(y, lambda t: np.asarray(keras.ops.convert_to_numpy(t)).reshape(x.shape))

    framework = backend if backend in ("jax", "torch") else "numpy"
    return _implementation(call, declared, framework=framework)


# -- jax.nn.standardize ------------------------------------------------------------

def _adapt_standardize(fn: Any) -> Implementation:
    keywords = dict(fn.keywords) if isinstance(fn, functools.partial) else {}
    if isinstance(fn, functools.partial) and fn.args:
        raise ValueError("fn: a functools.partial of jax.nn.standardize with positional "
                         "arguments; give them as keywords (axis=..., epsilon=...)")
    name = "jax.nn.standardize"
    _last_axis_only(name, keywords.get("axis", -1))
    for key in ("mean", "variance", "where"):
        if keywords.get(key) is not None:
            raise ValueError(f"fn: jax.nn.standardize with a fixed {key}= is not a LayerNorm")
    algorithm = keywords.get("algorithm", "fast (its default)")
    fixed_eps = keywords.get("epsilon")
    base = fn.func if isinstance(fn, functools.partial) else fn
    jax = _jax()
    jnp = _jnp()
    options = {k: v for k, v in keywords.items() if k in ("algorithm",)}
    compiled = jax.jit(lambda x, eps: base(x, axis=-1, epsilon=eps, **options))

    def call(x: Array, _w: Optional[Array], _b: Optional[Array], eps: float) -> Array:
        e = eps if fixed_eps is None else fixed_eps
        return _converted(compiled(jnp.asarray(x), e), np.asarray)

    details = _settings(axis=-1, algorithm=algorithm,
                        epsilon=(None if fixed_eps is None else _eps_text(float(fixed_eps))),
                        params="no gain, no bias")
    return Implementation(call, name, False, False, fixed_eps is None,
                          None if fixed_eps is None else float(fixed_eps), framework="jax",
                          op="layer_norm", details=details)


# -- ONNX ------------------------------------------------------------------------

#: The ONNX normalization ops: op type -> (op, the scale input's name, has a bias input).
_ONNX_OPS: Dict[str, str] = {
    "LayerNormalization": "layer_norm",
    "RMSNormalization": "rms_norm",
    "SimplifiedLayerNormalization": "rms_norm",  # onnxruntime's own RMSNorm
}


@dataclass(frozen=True)
class OnnxNode:
    """What a one-node model of a normalization node needs: everything that
    can change its result (the scale and bias values are the audit's).

    Attributes
    ----------
    op_type, domain : str
    attributes : tuple of (str, value)
        The node's attributes, verbatim.
    x_type, scale_type, bias_type : int
        ONNX element types (bias_type 0: no bias input).
    rank : int or None
        The rank of X, where the model says it and a non-negative axis
        needs it.
    trailing : tuple of int or None
        The normalized shape, when it spans more than one axis.
    opset : int
        The model's default-domain opset version.
    ir_version : int
    names : tuple of str
        The nodes of the model with exactly this configuration.
    """

    op_type: str
    domain: str
    attributes: Tuple[Tuple[str, Any], ...]
    x_type: int
    scale_type: int
    bias_type: int
    rank: Optional[int]
    trailing: Optional[Tuple[int, ...]]
    opset: int
    ir_version: int
    names: Tuple[str, ...] = ()

    def key(self) -> Tuple[Any, ...]:
        return (self.op_type, self.domain, self.attributes, self.x_type, self.scale_type,
                self.bias_type, self.rank, self.trailing, self.opset)

    @property
    def axis(self) -> int:
        return int(dict(self.attributes).get("axis", -1))

    @property
    def epsilon(self) -> float:
        """The epsilon attribute, or the op's default (both float32)."""
        given = dict(self.attributes).get("epsilon")
        if given is not None:
            return float(given)
        return float(np.float32(_schema_default(self.op_type, "epsilon", 1e-5)))


def _schema_default(op_type: str, attribute: str, fallback: float) -> float:
    """An attribute's default, from the op's schema where onnx has one."""
    try:
        value = _onnx().defs.get_schema(op_type).attributes[attribute].default_value
        return float(value.f)
    except Exception:  # an op onnx does not define (onnxruntime's own)
        return fallback


def _onnx() -> Any:
    return importlib.import_module("onnx")


def _load_model(obj: Any) -> Tuple[Any, str, Dict[str, Any]]:
    """``(ModelProto, runtime, session settings)`` of an ONNX object."""
    onnx = _onnx()
    if _is_onnx_path(obj):
        path = os.fspath(obj)
        if not os.path.isfile(path):
            raise ValueError(f"fn: no such ONNX file: {path!r}")
        return onnx.load(path), "onnxruntime", {}
    root = _root(obj)
    if root == "onnxruntime":
        settings = {"providers": obj.get_providers(),
                    "level": obj.get_session_options().graph_optimization_level}
        if obj._model_bytes is not None:
            return onnx.load_from_string(obj._model_bytes), "onnxruntime", settings
        if obj._model_path is not None:
            return onnx.load(obj._model_path), "onnxruntime", settings
        raise ValueError("fn: this InferenceSession keeps neither its model's path nor its "
                         "bytes; pass the model (a path or an onnx.ModelProto) instead")
    if hasattr(obj, "proto_"):  # onnx.reference.ReferenceEvaluator
        proto = obj.proto_
        if not hasattr(proto, "graph") or not hasattr(proto, "opset_import"):
            raise ValueError("fn: this ReferenceEvaluator was not built from a ModelProto")
        return proto, "reference", {}
    return obj, "onnxruntime", {}


def _value_types(model: Any) -> Dict[str, Any]:
    """Every named value's type (inputs, outputs, value_info after shape
    inference, initializers as tensor types)."""
    onnx = _onnx()
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference is a help, not a need
        inferred = model
    graph = inferred.graph
    types: Dict[str, Any] = {}
    for info in list(graph.input) + list(graph.output) + list(graph.value_info):
        if info.type.HasField("tensor_type"):
            t = info.type.tensor_type
            dims = ([dim.dim_value if dim.HasField("dim_value") else None for dim in t.shape.dim]
                    if t.HasField("shape") else None)
            types[info.name] = (t.elem_type, dims)
    for init in graph.initializer:
        types.setdefault(init.name, (init.data_type, list(init.dims)))
    return types


def _onnx_nodes(model: Any) -> List[OnnxNode]:
    """The normalization nodes of ``model``, grouped by configuration."""
    onnx = _onnx()
    helper = onnx.helper
    types = _value_types(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    groups: Dict[Tuple[Any, ...], OnnxNode] = {}
    graphs = [model.graph]
    for function in model.functions:  # nodes inside local functions count too
        graphs.append(function)
    counter = 0
    for graph in graphs:
        for node in graph.node:
            if node.op_type not in _ONNX_OPS or node.domain not in ("", "ai.onnx"):
                continue
            counter += 1
            name = node.name or f"{node.op_type}#{counter}"
            attributes = tuple(sorted((a.name, helper.get_attribute_value(a))
                                      for a in node.attribute))
            x_type, x_dims = types.get(node.input[0], (0, None))
            scale_type, scale_dims = types.get(node.input[1], (0, None))
            has_bias = len(node.input) > 2 and node.input[2] != ""
            bias_type = types.get(node.input[2], (0, None))[0] if has_bias else 0
            x_type = x_type or scale_type or onnx.TensorProto.FLOAT
            scale_type = scale_type or x_type
            if has_bias and not bias_type:
                bias_type = x_type
            axis = int(dict(attributes).get("axis", -1))
            rank = len(x_dims) if x_dims is not None else None
            if axis >= 0 and rank is None:
                raise ValueError(f"fn: node {name!r} ({node.op_type}) has axis={axis} and the "
                                 "model does not say the rank of its input, so which axes it "
                                 "normalizes is unknown")
            first = axis if axis >= 0 else (rank + axis if rank is not None else None)
            count = (rank - first) if (rank is not None and first is not None) else -axis
            trailing: Optional[Tuple[int, ...]] = None
            if count > 1:
                dims = (x_dims[-count:] if x_dims is not None else None) or scale_dims
                if dims is None or len(dims) != count or any(n is None or n < 1 for n in dims):
                    raise ValueError(f"fn: node {name!r} normalizes over {count} axes whose "
                                     "sizes the model does not give; the audit needs them")
                trailing = tuple(int(n) for n in dims)
            entry = OnnxNode(node.op_type, node.domain, attributes, int(x_type),
                             int(scale_type), int(bias_type), rank if axis >= 0 else None,
                             trailing, int(opset), int(model.ir_version))
            known = groups.setdefault(entry.key(), entry)
            groups[entry.key()] = replace(known, names=known.names + (name,))
    return list(groups.values())


def _np_dtype(elem_type: int) -> np.dtype[Any]:
    onnx = _onnx()
    if elem_type == onnx.TensorProto.BFLOAT16:
        from ._ops import bfloat16

        bf16 = bfloat16()
        if bf16 is None:
            raise ValueError("a bfloat16 node needs ml_dtypes, which is not installed")
        return bf16
    found: np.dtype[Any] = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    return found


def _elem_type(dtype: np.dtype[Any]) -> int:
    onnx = _onnx()
    if dtype.name == "bfloat16":
        return int(onnx.TensorProto.BFLOAT16)
    return int(onnx.helper.np_dtype_to_tensor_dtype(dtype))


def one_node_model(node: OnnxNode, x_dtype: np.dtype[Any], scale_dtype: np.dtype[Any],
                   bias_dtype: Optional[np.dtype[Any]]) -> Any:
    """A model of the node alone, its X, scale (and bias) as graph inputs of
    the given dtypes, its attributes as they are."""
    onnx = _onnx()
    helper = onnx.helper
    names = ["X", "Scale"] + (["B"] if node.bias_type else [])
    dtypes = [x_dtype, scale_dtype] + ([bias_dtype] if node.bias_type else [])
    x_shape: Optional[List[Any]] = None
    if node.rank is not None:
        x_shape = [f"n{i}" for i in range(node.rank)]
    shapes: List[Optional[List[Any]]] = [x_shape, None, None]
    inputs = [helper.make_tensor_value_info(n, _elem_type(np.dtype(t)), s)
              for n, t, s in zip(names, dtypes, shapes)]
    output = helper.make_tensor_value_info("Y", _elem_type(x_dtype), x_shape)
    made = helper.make_node(node.op_type, names, ["Y"], domain=node.domain or None,
                            **dict(node.attributes))
    graph = helper.make_graph([made], f"layernorm_c_audit_{node.op_type}", inputs, [output])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", node.opset)],
                             ir_version=node.ir_version)


def _onnx_runner(runtime: str, settings: Dict[str, Any]) -> Callable[[Any], Callable[..., Any]]:
    """``runner(model)`` -> ``run(feeds) -> Y`` on the chosen runtime."""
    if runtime == "onnxruntime":
        ort = importlib.import_module("onnxruntime")

        def ort_runner(model: Any) -> Callable[..., Any]:
            options = ort.SessionOptions()
            if "level" in settings:
                options.graph_optimization_level = settings["level"]
            session = ort.InferenceSession(model.SerializeToString(), options,
                                           providers=settings.get("providers",
                                                                  ["CPUExecutionProvider"]))
            return lambda feeds: session.run(["Y"], feeds)[0]

        return ort_runner
    reference = importlib.import_module("onnx.reference")

    def reference_runner(model: Any) -> Callable[..., Any]:
        evaluator = reference.ReferenceEvaluator(model)
        return lambda feeds: evaluator.run(["Y"], feeds)[0]

    return reference_runner


def node_label(impl: Implementation) -> str:
    """The node part of an ONNX implementation's name (``'ln_1 (+11
    alike)'``), for a column of its model."""
    parts = impl.name.split(" ", 2)
    return parts[2] if len(parts) == 3 and parts[1] in _ONNX_OPS else impl.name


def _onnx_implementation(node: OnnxNode, runtime: str, settings: Dict[str, Any]) -> Implementation:
    runner = _onnx_runner(runtime, settings)
    sessions: Dict[Tuple[str, ...], Callable[..., Any]] = {}
    op = _ONNX_OPS[node.op_type]
    takes_bias = bool(node.bias_type)
    trailing = node.trailing
    d = math.prod(trailing) if trailing is not None else None

    def call(x: Array, w: Optional[Array], b: Optional[Array], _eps: float) -> Array:
        if w is None:
            raise ValueError("an ONNX normalization node always takes a scale")
        key = (x.dtype.name, w.dtype.name, "" if b is None else b.dtype.name)
        if key not in sessions:
            # One model per dtype: the node's own, or (for the checks that
            # run in another dtype, float16's overflow) the same node typed so.
            sessions[key] = runner(one_node_model(node, x.dtype, w.dtype,
                                                  None if b is None else b.dtype))
        feeds = {"X": np.ascontiguousarray(_shaped(x, node.rank, trailing)),
                 "Scale": np.ascontiguousarray(w if trailing is None else w.reshape(trailing))}
        if takes_bias:
            bias = b if b is not None else np.zeros_like(w)
            feeds["B"] = np.ascontiguousarray(bias if trailing is None
                                              else bias.reshape(trailing))
        y = sessions[key](feeds)
        return _converted(y, lambda t: np.asarray(t).reshape(x.shape))

    shown = ", ".join(node.names[:4]) + (f" and {len(node.names) - 4} more"
                                         if len(node.names) > 4 else "")
    first = node.names[0] if node.names else node.op_type
    name = f"{runtime} {node.op_type} {first}"
    if len(node.names) > 1:
        name += f" (+{len(node.names) - 1} alike)"
    dtype = _np_dtype(node.x_type)
    stash = dict(node.attributes).get("stash_type")
    axis_text = str(node.axis) + (f" of a rank-{node.rank} input" if node.rank else "")
    if trailing is not None:
        axis_text += f" (normalized shape {trailing})"
    details = _settings(
        axis=axis_text,
        epsilon=(f"{node.epsilon!r} (the node's float32 attribute"
                 + (")" if "epsilon" in dict(node.attributes) else ", its default)")),
        stash_type=stash, dtype=dtype.name,
        params=("Scale and B" if takes_bias else "Scale, no B"),
        nodes=shown, opset=node.opset)
    return Implementation(call, name, True, takes_bias, False, node.epsilon, d,
                          framework="numpy", dtype=dtype.name, op=op, details=details)


def from_onnx(model: Any, runtime: Optional[str] = None) -> List[Implementation]:
    """Every normalization node of an ONNX model, ready to audit.

    Each ``LayerNormalization`` and ``RMSNormalization`` node (and
    onnxruntime's ``SimplifiedLayerNormalization``) becomes a model of its
    own, with the node's attributes (axis, epsilon, stash_type) as they are
    and its input types; its scale and bias become inputs, which the checks
    set. Nodes identical in all of that share one implementation (its name
    counts them). The dtype of each is the node's own; a check that runs
    another dtype (the float16 overflow check) runs the same node typed so.

    Parameters
    ----------
    model : onnx.ModelProto, str or path, onnxruntime.InferenceSession or onnx.reference.ReferenceEvaluator
        The model (or the file it is in, or a session or evaluator of it).
    runtime : {'onnxruntime', 'reference'}, optional
        What runs the nodes: onnxruntime (default for a model, a path or a
        session) or onnx's reference evaluator (default for a
        ``ReferenceEvaluator``). A session's providers and graph
        optimization level are kept.

    Returns
    -------
    list of Implementation
        One per distinct node, in the model's order.

    Raises
    ------
    ValueError
        No normalization node, an unknown runtime, a node over axes whose
        sizes the model does not give.
    ImportError
        onnx (or the runtime) is not installed.
    """
    if runtime is not None and runtime not in ONNX_RUNTIMES:
        raise ValueError(f"runtime: expected one of {ONNX_RUNTIMES}, got {runtime!r}")
    proto, default_runtime, settings = _load_model(model)
    if not hasattr(proto, "graph"):
        raise TypeError(f"model: expected an onnx.ModelProto, a path to a .onnx file, an "
                        f"onnxruntime.InferenceSession or an onnx.reference.ReferenceEvaluator, "
                        f"got {type(model).__name__}")
    runtime = runtime or default_runtime
    nodes = _onnx_nodes(proto)
    if runtime == "reference":
        nodes = [n for n in nodes if n.op_type != "SimplifiedLayerNormalization"]
    if not nodes:
        raise ValueError(f"model: no LayerNormalization or RMSNormalization node in the "
                         f"graph {proto.graph.name!r} (a LayerNorm exported as separate "
                         "ReduceMean, Sub, Pow... nodes is not one node, and cannot be "
                         "audited as one)")
    return [_onnx_implementation(n, runtime, settings) for n in nodes]


# -- backward: the JAX modules differentiated by jax.vjp ---------------------------

def adapt_builtin_backward(obj: Any) -> Optional[BackwardImplementation]:
    """A :class:`BackwardImplementation` of a flax or equinox module (its
    forward differentiated by ``jax.vjp``), or None for other objects."""
    kind = builtin_kind(obj)
    if kind not in ("flax", "equinox"):
        return None
    from ._backward_adapters import _adapt_jax

    forward, declared = (_flax_forward(obj) if kind == "flax" else _equinox_forward(obj))
    takes_weight, takes_bias = declared["takes_weight"], declared["takes_bias"]
    names = ["x"] + (["weight"] if takes_weight else []) + (["bias"] if takes_bias else [])

    def f(x: Any, weight: Any = None, bias: Any = None) -> Any:
        return forward(x, weight, bias)

    impl = _adapt_jax(f, ", ".join(names))
    return replace(impl, name=declared["name"], eps=declared["eps"], d=declared["d"])


_ADAPTERS: Dict[str, Callable[[Any], Implementation]] = {
    "flax": _adapt_flax,
    "equinox": _adapt_equinox,
    "keras": _adapt_keras,
    "standardize": _adapt_standardize,
}

