"""The probe: how a check calls the implementation under audit.

It casts inputs to the audit dtype, passes only the arguments the
implementation takes, respects a fixed feature size or leading shape, turns
the implementation's exceptions into :class:`ImplementationError`, and
computes the float64 reference on exactly the values passed.
"""
from __future__ import annotations

import math
import warnings
import zlib
from typing import Any, Generic, Optional, Protocol, Tuple, TypeVar

import numpy as np
import numpy.typing as npt

from ._adapters import Implementation, OutputError
from ._numerics import MODES, Mode, Tolerance
from ._ops import LAYER_NORM, Op, is_float

__all__ = ["Probe", "ProbeBase", "ImplementationError", "Param", "Params", "Declared"]

#: A gain or bias as passed to the implementation: None when not taken.
Param = Optional[npt.NDArray[Any]]
Params = Tuple[Param, Param]


class ImplementationError(Exception):
    """The implementation under audit raised, or returned something that is
    not an array shaped like its input.

    ``figure`` says which, in a few words, for the report.
    """

    def __init__(self, message: str, figure: str):
        super().__init__(message)
        self.figure = figure


def _first_line(exc: Exception, limit: int = 200) -> str:
    """An exception's message, cut to its first line and ``limit`` characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _describe(a: Param) -> str:
    return "None" if a is None else f"{a.dtype} {a.shape}"


class Declared(Protocol):
    """What an adapted implementation (forward or backward) declares about
    itself, which every probe reads."""

    @property
    def name(self) -> str: ...
    @property
    def takes_weight(self) -> bool: ...
    @property
    def takes_bias(self) -> bool: ...
    @property
    def takes_eps(self) -> bool: ...
    @property
    def eps(self) -> Optional[float]: ...
    @property
    def d(self) -> Optional[int]: ...
    @property
    def leading_shape(self) -> Optional[Tuple[int, ...]]: ...


I = TypeVar("I", bound=Declared)


class ProbeBase(Generic[I]):
    """What the forward's and the backward's probes share: random streams,
    the shapes to use, and the inputs cast to the audit dtype.

    Parameters
    ----------
    impl : Implementation or BackwardImplementation
    dtype : numpy dtype
        The audit dtype: every input is cast to it.
    eps : float
        The eps passed (or, for an implementation that takes none, the eps
        it uses).
    seed : int
        Seed of the random inputs (each check draws its own stream).
    strict_batch_invariance : bool
        Whether a result that changes bits with the batch around it fails
        (default: a warning).
    op : Op
        What is audited (LayerNorm, or RMSNorm with its weight convention):
        its reference and its words.
    mode : {'quick', 'default', 'thorough'}
        How much the checks that can measure more (the large-d sweep) do.
    """

    def __init__(self, impl: I, dtype: npt.DTypeLike, eps: float, seed: int = 0,
                 strict_batch_invariance: bool = False, op: Op = LAYER_NORM,
                 mode: Mode = "default"):
        self.impl = impl
        self.dtype: np.dtype[Any] = np.dtype(dtype)
        self.eps = float(eps)
        self.seed = seed
        self.strict_batch_invariance = strict_batch_invariance
        self.op = op
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
        self.mode: Mode = mode

    # -- shapes -----------------------------------------------------------
    def rng(self, stream: str) -> np.random.Generator:
        """A random generator for one check, independent of the others."""
        return np.random.default_rng([self.seed, zlib.crc32(stream.encode())])

    def d(self, preferred: int) -> int:
        """The feature size to use: the implementation's fixed one, if any."""
        return self.impl.d if self.impl.d is not None else preferred

    def lead(self, preferred: Tuple[int, ...]) -> Tuple[int, ...]:
        """The leading shape to use: the implementation's fixed one, if any."""
        fixed = self.impl.leading_shape
        return fixed if fixed is not None else tuple(preferred)

    def fixed_leading_shape(self) -> Tuple[int, ...]:
        """The implementation's fixed leading shape (only call when
        :attr:`fixed_lead`)."""
        fixed = self.impl.leading_shape
        if fixed is None:
            raise AssertionError("internal: no fixed leading shape")
        return fixed

    @property
    def fixed_lead(self) -> bool:
        return self.impl.leading_shape is not None

    # -- inputs -----------------------------------------------------------
    def cast(self, a: npt.ArrayLike, dtype: Optional[npt.DTypeLike] = None) -> npt.NDArray[Any]:
        """``a`` in the audit dtype (or ``dtype``), as a new C-contiguous array."""
        return np.array(a, dtype=self.dtype if dtype is None else dtype)

    def params(self, weight: Optional[npt.ArrayLike] = None, bias: Optional[npt.ArrayLike] = None,
               dtype: Optional[npt.DTypeLike] = None) -> Params:
        """``(weight, bias)`` cast, each None if the implementation does not
        take it."""
        w = self.cast(weight, dtype) if weight is not None and self.impl.takes_weight else None
        b = self.cast(bias, dtype) if bias is not None and self.impl.takes_bias else None
        return w, b

    def random_params(self, rng: np.random.Generator, d: int
                      ) -> Tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """A weight whose scale (``weight``, or ``1 + weight``) has either
        sign away from 0, and a bias of order 1 (float64, not yet cast)."""
        scale = rng.uniform(0.5, 2.0, d) * rng.choice([-1.0, 1.0], d)
        bias = rng.normal(0.0, 1.0, d)
        return (scale - 1.0 if self.op.plus_one else scale), bias

    def identity_params(self, d: int, dtype: Optional[npt.DTypeLike] = None) -> Params:
        """Scale 1 (a gain of 1, or of 0 for ``1 + weight``) and bias 0, for
        the arguments the implementation takes."""
        return self.params(self.op.neutral_weight(d), np.zeros(d), dtype)

    def _shape_hint(self) -> str:
        if self.impl.d is None and self.impl.leading_shape is None:
            return (". If it only supports one feature size or leading shape, "
                    "declare it (d=..., leading_shape=...)")
        return ""


class Probe(ProbeBase[Implementation]):
    """Calls one implementation the way the checks need.

    Parameters
    ----------
    impl : Implementation
    dtype : numpy dtype
        The audit dtype: every input is cast to it.
    eps : float
        The eps passed (or, for an implementation that takes none, the eps
        it uses).
    tol : Tolerance
        Allowed error for outputs of the audit dtype.
    seed : int
        Seed of the random inputs (each check draws its own stream).
    strict_batch_invariance : bool
        Whether a result that changes bits with the batch around it fails
        (default: a warning).
    """

    def __init__(self, impl: Implementation, dtype: npt.DTypeLike, eps: float, tol: Tolerance,
                 seed: int = 0, strict_batch_invariance: bool = False, op: Op = LAYER_NORM,
                 mode: Mode = "default"):
        super().__init__(impl, dtype, eps, seed, strict_batch_invariance, op, mode)
        self.tol = tol

    # -- calls ------------------------------------------------------------
    def call_raw(self, x: npt.NDArray[Any], weight: Param = None, bias: Param = None,
                 eps: Optional[float] = None, *, copy: bool = True) -> npt.NDArray[Any]:
        """The implementation's output as returned (its own dtype).

        Parameters
        ----------
        x, weight, bias : ndarray or None
            Already cast; ``weight``/``bias`` already None where not taken.
        eps : float, optional
            Default: the audit eps. Only an implementation that takes eps
            may be given another.
        copy : bool
            Pass copies, so an implementation that writes into its inputs
            cannot spoil the reference computed from them.

        Raises
        ------
        ImplementationError
        """
        eps = self.eps if eps is None else float(eps)
        if not self.impl.takes_eps and eps != self.eps:
            raise AssertionError("internal: eps varied for an implementation that takes none")
        args = [None if a is None else (a.copy() if copy else a) for a in (x, weight, bias)]
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                # The battery feeds NaN, Inf and 65504 on purpose: the
                # implementation's own RuntimeWarnings are expected noise.
                warnings.simplefilter("ignore")
                y = np.asarray(self.impl.call(*args, eps))
        except OutputError as exc:
            raise ImplementationError(f"{self.impl.name} {_first_line(exc)}",
                                      "returned no array") from exc
        except Exception as exc:
            raise ImplementationError(
                f"{self.impl.name} raised {type(exc).__name__}: {_first_line(exc)} (called with "
                f"x {_describe(x)}, weight {_describe(weight)}, bias {_describe(bias)}, "
                f"eps={eps:g}){self._shape_hint()}",
                f"raised {type(exc).__name__}",
            ) from exc
        if y.shape != x.shape:
            raise ImplementationError(
                f"{self.impl.name} returned shape {y.shape} for x of shape {x.shape}: "
                f"the output must have the input's shape{self._shape_hint()}",
                f"returned shape {y.shape}",
            )
        if y.dtype.kind not in "iu" and not is_float(y.dtype):
            raise ImplementationError(
                f"{self.impl.name} returned dtype {y.dtype}; expected real numbers",
                f"returned {y.dtype}")
        return y

    def call(self, x: npt.NDArray[Any], weight: Param = None, bias: Param = None,
             eps: Optional[float] = None) -> npt.NDArray[np.float64]:
        """The implementation's output in float64."""
        return self.call_raw(x, weight, bias, eps).astype(np.float64)

    def rows(self, rows: npt.ArrayLike, weight: Param = None, bias: Param = None,
             eps: Optional[float] = None,
             dtype: Optional[npt.DTypeLike] = None) -> npt.NDArray[np.float64]:
        """Normalize a stack of records ``(n, d)``; returns float64 ``(n, d)``.

        Called as one ``(n, d)`` array, or, for an implementation with a
        fixed leading shape, in batches of that shape padded with filler
        records. ``rows`` is cast to ``dtype`` (default: the audit dtype).
        """
        stack = self.cast(rows, dtype)
        if not self.fixed_lead:
            return self.call(stack, weight, bias, eps)
        lead = self.fixed_leading_shape()
        capacity = math.prod(lead)
        filler = self.cast(self.rng("filler").standard_normal((capacity, stack.shape[1])),
                           stack.dtype)
        out = []
        for start in range(0, len(stack), capacity):
            chunk = stack[start:start + capacity]
            batch = np.concatenate([chunk, filler[len(chunk):]]).reshape(lead + stack.shape[1:])
            out.append(self.call(batch, weight, bias, eps).reshape(capacity, -1)[:len(chunk)])
        return np.concatenate(out)

    def reference(self, x: npt.ArrayLike, weight: Optional[npt.ArrayLike] = None,
                  bias: Optional[npt.ArrayLike] = None,
                  eps: Optional[float] = None) -> npt.NDArray[np.float64]:
        """The op's float64 reference (:func:`layernorm_c.reference_layer_norm`
        or :func:`layernorm_c.reference_rms_norm`) of exactly these inputs."""
        return self.op.reference(x, weight, bias, self.eps if eps is None else eps)
