"""A LayerNorm layer for NumPy models: parameters, a forward that keeps
what its backward needs, and exact gradient accumulation."""
from __future__ import annotations

import math
from typing import Any, Dict, Literal, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from ._api import layer_norm
from ._backward import ExactSum, _backward_parts

__all__ = ["LayerNorm"]

Convention = Literal["gain+bias", "gain-only", "bias-only", "none"]


class LayerNorm:
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

    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: float = 1e-5, *,
                 gain: bool = True, bias: bool = True, dtype: DTypeLike = np.float32):
        shape = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) \
            else tuple(normalized_shape)
        if not shape or any(not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1
                            for n in shape):
            raise ValueError(f"normalized_shape: expected a positive int or a tuple of "
                             f"positive ints, got {normalized_shape!r}")
        self.normalized_shape: Tuple[int, ...] = tuple(int(n) for n in shape)
        self.eps = float(eps)
        if not math.isfinite(self.eps) or self.eps < 0:
            raise ValueError(f"eps: expected a finite number >= 0, got {eps!r}")
        self.dtype = np.dtype(dtype)
        if self.dtype.kind != "f" or self.dtype.itemsize > 8:
            raise TypeError(f"dtype: expected float16, float32 or float64, got {self.dtype}")
        self.weight: Optional[NDArray[Any]] = (np.ones(self.normalized_shape, self.dtype)
                                               if gain else None)
        self.bias: Optional[NDArray[Any]] = (np.zeros(self.normalized_shape, self.dtype)
                                             if bias else None)
        self.grad_weight: Optional[NDArray[Any]] = None
        self.grad_bias: Optional[NDArray[Any]] = None
        self._sum_w: Optional[ExactSum] = None
        self._sum_b: Optional[ExactSum] = None
        self._saved: Optional[Tuple[NDArray[Any], NDArray[Any]]] = None
        self.zero_grad()

    # -- description ------------------------------------------------------

    @property
    def num_parameters(self) -> int:
        d = math.prod(self.normalized_shape)
        return d * ((self.weight is not None) + (self.bias is not None))

    @property
    def convention(self) -> Convention:
        if self.weight is not None and self.bias is not None:
            return "gain+bias"
        if self.weight is not None:
            return "gain-only"
        if self.bias is not None:
            return "bias-only"
        return "none"

    @property
    def axis(self) -> Tuple[int, ...]:
        """The normalized axes, counted from the end."""
        return tuple(range(-len(self.normalized_shape), 0))

    def __repr__(self) -> str:
        return (f"LayerNorm({self.normalized_shape}, eps={self.eps:g}, "
                f"convention={self.convention!r}, dtype={self.dtype})")

    # -- forward and backward ---------------------------------------------

    def _check_input(self, x: NDArray[Any]) -> None:
        k = len(self.normalized_shape)
        if x.ndim < k or tuple(x.shape[-k:]) != self.normalized_shape:
            raise ValueError(f"x: expected trailing axes {self.normalized_shape} "
                             f"(normalized_shape), got shape {x.shape}")

    def __call__(self, x: ArrayLike) -> NDArray[Any]:
        """The forward: normalize ``x``, keeping ``x`` and its means for
        :meth:`backward`."""
        xa = np.asarray(x)
        self._check_input(xa)
        res = layer_norm(xa, self.weight, self.bias, self.eps, axis=self.axis,
                         return_stats=True)
        self._saved = (xa, res.mean)
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
        if self._saved is None:
            raise RuntimeError("backward: call the layer (its forward) first")
        x, mean = self._saved
        dx, sw, sb, _ = _backward_parts(dy, x, self.weight, self.eps, self.axis, mean, None)
        assert sw is not None and sb is not None
        if self.weight is not None:
            self._sum_w = sw if self._sum_w is None else self._sum_w + sw
            self.grad_weight = self._sum_w.value(self.dtype)
        if self.bias is not None:
            self._sum_b = sb if self._sum_b is None else self._sum_b + sb
            self.grad_bias = self._sum_b.value(self.dtype)
        return dx

    def zero_grad(self) -> None:
        """Reset the accumulated gradients to zero."""
        self._sum_w = self._sum_b = None
        self.grad_weight = None if self.weight is None else np.zeros_like(self.weight)
        self.grad_bias = None if self.bias is None else np.zeros_like(self.bias)

    def parameters(self) -> Dict[str, NDArray[Any]]:
        """The parameters by PyTorch's names (``weight``, ``bias``)."""
        return {k: v for k, v in (("weight", self.weight), ("bias", self.bias))
                if v is not None}

    def gradients(self) -> Dict[str, NDArray[Any]]:
        """The accumulated gradients, by the parameters' names."""
        return {k: v for k, v in (("weight", self.grad_weight), ("bias", self.grad_bias))
                if v is not None}

    # -- state ---------------------------------------------------------------

    def state_dict(self) -> Dict[str, NDArray[Any]]:
        """Copies of the parameters under PyTorch's keys (``weight``,
        ``bias``), as ``torch.nn.LayerNorm.state_dict()`` has them."""
        return {k: v.copy() for k, v in self.parameters().items()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Load parameters from :meth:`state_dict` or from
        ``torch.nn.LayerNorm.state_dict()`` (tensors are converted with
        NumPy; torch itself is never imported here).

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
            arr = np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach")
                             else value)
            if arr.shape != self.normalized_shape:
                raise ValueError(f"state[{name!r}]: expected shape {self.normalized_shape}, "
                                 f"got {arr.shape}")
            setattr(self, name, arr.astype(self.dtype, copy=True))
