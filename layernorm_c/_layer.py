"""A LayerNorm layer for NumPy models: parameters, a forward that keeps
what its backward needs, and exact gradient accumulation."""
from __future__ import annotations

import math
from typing import Any, Dict, Literal, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from . import _api
from ._api import layer_norm
from ._backward import ExactSum, _backward_parts, _layer_backward_rows
from ._rms import _check_convention, _rms_backward_parts, rms_norm

__all__ = ["LayerNorm", "RMSNorm"]

Convention = Literal["gain+bias", "gain-only", "bias-only", "none"]
RMSConvention = Literal["weight", "1+weight", "none"]


def _normalized_shape(normalized_shape: Union[int, Sequence[int]]) -> Tuple[int, ...]:
    shape = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) \
        else tuple(normalized_shape)
    if not shape or any(not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1
                        for n in shape):
        raise ValueError(f"normalized_shape: expected a positive int or a tuple of "
                         f"positive ints, got {normalized_shape!r}")
    return tuple(int(n) for n in shape)


def _layer_dtype(dtype: DTypeLike) -> np.dtype[Any]:
    dt = np.dtype(dtype)
    if not _api._is_float_dtype(dt):
        raise TypeError(f"dtype: expected float16, bfloat16, float32 or float64, got {dt}")
    return dt


class _NormLayer:
    """What the LayerNorm and RMSNorm layers share: parameters by PyTorch's
    names, a forward that keeps what the backward needs (copies: changing
    ``x`` or a parameter in place after the forward does not change the
    backward), gradients accumulated exactly, and state dicts."""

    _names: Tuple[str, ...] = ()

    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: float,
                 dtype: DTypeLike):
        self.normalized_shape: Tuple[int, ...] = _normalized_shape(normalized_shape)
        self.eps = float(eps)
        if not math.isfinite(self.eps) or self.eps < 0:
            raise ValueError(f"eps: expected a finite number >= 0, got {eps!r}")
        self.dtype = _layer_dtype(dtype)
        self._sums: Dict[str, ExactSum] = {}
        self._saved: Optional[Tuple[Any, ...]] = None

    @property
    def axis(self) -> Tuple[int, ...]:
        """The normalized axes, counted from the end."""
        return tuple(range(-len(self.normalized_shape), 0))

    @property
    def _call_axis(self) -> Union[int, Tuple[int, ...]]:
        """The axes as the calls take them: -1 for one normalized axis (the
        same records as ``(-1,)``, through the functions' fast path: a (1,
        768) forward took 60 us of planning with the tuple)."""
        return -1 if len(self.normalized_shape) == 1 else self.axis

    def _check_input(self, x: NDArray[Any]) -> None:
        k = len(self.normalized_shape)
        if x.ndim < k or tuple(x.shape[-k:]) != self.normalized_shape:
            raise ValueError(f"x: expected trailing axes {self.normalized_shape} "
                             f"(normalized_shape), got shape {x.shape}")

    def _saved_input(self, x: ArrayLike) -> NDArray[Any]:
        """x as an array, checked, and a copy of it kept for the backward
        (with the parameters as they are now)."""
        xa = np.asarray(x)
        self._check_input(xa)
        return xa

    def _last_forward(self) -> Tuple[Any, ...]:
        if self._saved is None:
            raise RuntimeError("backward: call the layer (its forward) first")
        return self._saved

    def _accumulate(self, sums: Dict[str, Optional[ExactSum]]) -> None:
        for name, acc in sums.items():
            if getattr(self, name) is None or acc is None:
                continue
            total = self._sums.get(name)
            self._sums[name] = acc if total is None else total + acc
            setattr(self, "grad_" + name, self._sums[name].value(self.dtype))

    def zero_grad(self) -> None:
        """Reset the accumulated gradients to zero."""
        self._sums = {}
        for name in self._names:
            p = getattr(self, name)
            setattr(self, "grad_" + name, None if p is None else np.zeros_like(p))

    def parameters(self) -> Dict[str, NDArray[Any]]:
        """The parameters by PyTorch's names."""
        return {k: getattr(self, k) for k in self._names if getattr(self, k) is not None}

    def gradients(self) -> Dict[str, NDArray[Any]]:
        """The accumulated gradients, by the parameters' names."""
        return {k: getattr(self, "grad_" + k) for k in self._names
                if getattr(self, k) is not None}

    @property
    def num_parameters(self) -> int:
        return math.prod(self.normalized_shape) * len(self.parameters())

    def state_dict(self) -> Dict[str, NDArray[Any]]:
        """Copies of the parameters under PyTorch's keys, as NumPy arrays
        (PyTorch's ``load_state_dict`` takes tensors: convert them with
        ``{k: torch.from_numpy(v) for k, v in layer.state_dict().items()}``)."""
        return {k: v.copy() for k, v in self.parameters().items()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Load parameters from :meth:`state_dict` or from the PyTorch
        module's ``state_dict()`` (tensors are converted with NumPy; torch
        itself is never imported here).

        Raises
        ------
        KeyError
            A parameter of this layer is missing, or an unknown key is given.
        ValueError
            A parameter of the wrong shape.
        """
        own = self.parameters()
        unknown = sorted(set(state) - set(own))
        missing = sorted(set(own) - set(state))
        if unknown or missing:
            raise KeyError(f"state: expected keys {sorted(own)} ({self.convention}), "
                           f"missing {missing}, unexpected {unknown}")
        for name, value in state.items():
            if hasattr(value, "detach"):  # a torch tensor (bfloat16 ones through float32)
                t = value.detach().cpu()
                value = t.float().numpy() if str(t.dtype) == "torch.bfloat16" else t.numpy()
            arr = np.asarray(value)
            if arr.shape != self.normalized_shape:
                raise ValueError(f"state[{name!r}]: expected shape {self.normalized_shape}, "
                                 f"got {arr.shape}")
            setattr(self, name, arr.astype(self.dtype, copy=True))

    @property
    def convention(self) -> str:
        raise NotImplementedError


class LayerNorm(_NormLayer):
    """Layer normalization over the trailing ``normalized_shape`` axes, as a
    layer with parameters and a backward pass (llm.c's forward/backward
    pair, for NumPy).

    ``layer(x)`` normalizes and keeps ``x`` and its statistics;
    ``layer.backward(dy)`` returns ``dx`` and adds the parameter gradients
    into :attr:`grad_weight` and :attr:`grad_bias`. The gradients accumulate
    exactly over backward calls (micro-batches): their bits do not depend
    on how a batch was split or in which order the parts came.

    Parameters
    ----------
    normalized_shape : int or tuple of int
        The shape of the trailing axes normalized together (``d`` for
        ``(..., d)`` inputs).
    eps : float, optional
        Added to the variance inside the square root. Default ``1e-5``.
    gain, bias : bool, keyword-only, optional
        Whether the layer has a gain (``weight``, initialised to 1) and a
        bias (initialised to 0). Default both.
    dtype : dtype, keyword-only, optional
        The parameters' dtype. Default float32.

    Attributes
    ----------
    weight, bias : ndarray or None
        The parameters (``None`` where the layer has none).
    grad_weight, grad_bias : ndarray or None
        The accumulated gradients, of the parameters' dtype.
    num_parameters : int
        ``2 d`` with gain and bias, ``d`` with one, 0 with none.
    convention : {'gain+bias', 'gain-only', 'bias-only', 'none'}
        The parameter convention, named.

    Examples
    --------
    >>> import numpy as np, layernorm_c as lnc
    >>> ln = lnc.LayerNorm(4)
    >>> ln.num_parameters, ln.convention
    (8, 'gain+bias')
    >>> y = ln(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32))
    >>> dx = ln.backward(np.ones_like(y))
    >>> ln.grad_bias
    array([1., 1., 1., 1.], dtype=float32)
    """

    _names = ("weight", "bias")

    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: float = 1e-5, *,
                 gain: bool = True, bias: bool = True, dtype: DTypeLike = np.float32):
        super().__init__(normalized_shape, eps, dtype)
        self.weight: Optional[NDArray[Any]] = (np.ones(self.normalized_shape, self.dtype)
                                               if gain else None)
        self.bias: Optional[NDArray[Any]] = (np.zeros(self.normalized_shape, self.dtype)
                                             if bias else None)
        self.grad_weight: Optional[NDArray[Any]] = None
        self.grad_bias: Optional[NDArray[Any]] = None
        self.zero_grad()

    @property
    def convention(self) -> Convention:
        if self.weight is not None and self.bias is not None:
            return "gain+bias"
        if self.weight is not None:
            return "gain-only"
        if self.bias is not None:
            return "bias-only"
        return "none"

    def __repr__(self) -> str:
        return (f"LayerNorm({self.normalized_shape}, eps={self.eps:g}, "
                f"convention={self.convention!r}, dtype={self.dtype})")

    def __call__(self, x: ArrayLike) -> NDArray[Any]:
        """The forward: normalize ``x``, keeping a copy of ``x``, its means
        and the gain for :meth:`backward`."""
        xa = self._saved_input(x)
        res = layer_norm(xa, self.weight, self.bias, self.eps, axis=self._call_axis,
                         return_stats=True)
        w = None if self.weight is None else self.weight.copy()
        self._saved = (xa.copy(), res.mean, w)
        return res.y

    forward = __call__

    def backward(self, dy: ArrayLike) -> NDArray[Any]:
        """The backward of the last forward: returns ``dx`` and adds this
        batch's parameter gradients into :attr:`grad_weight` /
        :attr:`grad_bias` (exactly, see :class:`ExactSum`).

        Raises
        ------
        RuntimeError
            No forward since the layer was made.
        """
        x, mean, w = self._last_forward()
        fast = (_layer_backward_rows(dy, x, w, self.eps, mean)
                if len(self.normalized_shape) == 1 else None)
        sw: Optional[ExactSum]
        sb: Optional[ExactSum]
        if fast is not None:
            dx, sw, sb = fast
        else:
            dx, sw, sb, _ = _backward_parts(dy, x, w, self.eps, self.axis, mean, None)
        self._accumulate({"weight": sw, "bias": sb})
        return dx


class RMSNorm(_NormLayer):
    """RMS normalization over the trailing ``normalized_shape`` axes, as a
    layer with a weight and a backward pass.

    ``layer(x)`` normalizes and keeps a copy of ``x``; ``layer.backward(dy)``
    returns ``dx`` and adds the weight's gradient into :attr:`grad_weight`,
    exactly (bit-identical however a batch is split into micro-batches).

    Parameters
    ----------
    normalized_shape : int or tuple of int
        The shape of the trailing axes normalized together.
    eps : float, optional
        Added to the mean square inside the square root. Default ``1e-6``.
    gain : bool, keyword-only, optional
        Whether the layer has a weight. Default True.
    dtype : dtype, keyword-only, optional
        The weight's dtype. Default float32.
    convention : {'weight', '1+weight'}, keyword-only, optional
        ``'weight'`` (LLaMA, T5; the weight starts at 1) or ``'1+weight'``
        (Gemma; the weight starts at 0 and the scale is ``1 + weight``).

    Attributes
    ----------
    weight, grad_weight : ndarray or None
        The weight and its accumulated gradient (``None`` without gain).
    num_parameters : int
        ``d`` with a weight, 0 without.
    convention : {'weight', '1+weight', 'none'}
        The parameter convention, named.

    Examples
    --------
    >>> import numpy as np, layernorm_c as lnc
    >>> rn = lnc.RMSNorm(2)
    >>> rn.num_parameters, rn.convention
    (2, 'weight')
    >>> rn(np.array([[3.0, 4.0]], np.float32))
    array([[0.8485281, 1.1313708]], dtype=float32)
    """

    _names = ("weight",)

    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: float = 1e-6, *,
                 gain: bool = True, dtype: DTypeLike = np.float32,
                 convention: Literal["weight", "1+weight"] = "weight"):
        super().__init__(normalized_shape, eps, dtype)
        self._plus_one = _check_convention(convention)
        start = 0 if self._plus_one else 1
        self.weight: Optional[NDArray[Any]] = (np.full(self.normalized_shape, start, self.dtype)
                                               if gain else None)
        self.grad_weight: Optional[NDArray[Any]] = None
        self.zero_grad()

    @property
    def convention(self) -> RMSConvention:
        if self.weight is None:
            return "none"
        return "1+weight" if self._plus_one else "weight"

    def _rms_convention(self) -> Literal["weight", "1+weight"]:
        return "1+weight" if self._plus_one else "weight"

    def __repr__(self) -> str:
        return (f"RMSNorm({self.normalized_shape}, eps={self.eps:g}, "
                f"convention={self.convention!r}, dtype={self.dtype})")

    def __call__(self, x: ArrayLike) -> NDArray[Any]:
        """The forward: normalize ``x``, keeping a copy of ``x`` and of the
        weight for :meth:`backward`."""
        xa = self._saved_input(x)
        y = rms_norm(xa, self.weight, self.eps, axis=self._call_axis,
                     convention=self._rms_convention())
        w = None if self.weight is None else self.weight.copy()
        self._saved = (xa.copy(), w)
        return y

    forward = __call__

    def backward(self, dy: ArrayLike) -> NDArray[Any]:
        """The backward of the last forward: returns ``dx`` and adds this
        batch's weight gradient into :attr:`grad_weight` (exactly).

        Raises
        ------
        RuntimeError
            No forward since the layer was made.
        """
        x, w = self._last_forward()
        dx, sw, _ = _rms_backward_parts(dy, x, w, self.eps, self.axis, None,
                                        self._rms_convention())
        self._accumulate({"weight": sw})
        return dx
