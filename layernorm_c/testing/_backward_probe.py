"""The backward probe: how a backward check calls the implementation under
audit (see :mod:`._probe` for the forward's)."""
from __future__ import annotations

import math
import warnings
from typing import Any, List, Optional

import numpy as np
import numpy.typing as npt

from .._reference import ReferenceGrads, reference_layer_norm_backward
from ._adapters import OutputError
from ._backward_adapters import BackwardImplementation, Grads
from ._backward_numerics import BackwardTolerance, Terms, backward_tolerance, record_terms
from ._numerics import Mode, Tolerance
from ._ops import LAYER_NORM, Op, is_float
from ._probe import ImplementationError, Param, ProbeBase, _describe, _first_line

__all__ = ["BackwardProbe"]


def _as_float64(a: Optional[npt.NDArray[Any]]) -> Optional[npt.NDArray[np.float64]]:
    return None if a is None else a.astype(np.float64)


class BackwardProbe(ProbeBase[BackwardImplementation]):
    """Calls one backward implementation the way the backward checks need.

    Parameters
    ----------
    impl : BackwardImplementation
    dtype : numpy dtype
        The audit dtype: every input is cast to it.
    eps : float
        The eps passed (or the one the implementation uses).
    tol : Tolerance or None
        A user's override of the tolerance; None for the defaults by dtype
        and d (:func:`~._backward_numerics.backward_tolerance`).
    seed : int
    strict_batch_invariance : bool
        Whether bit differences (dx alone and in a batch; the parameter
        gradients under reordering) fail instead of warn.
    """

    def __init__(self, impl: BackwardImplementation, dtype: npt.DTypeLike, eps: float,
                 tol: Optional[Tolerance] = None, seed: int = 0,
                 strict_batch_invariance: bool = False, op: Op = LAYER_NORM,
                 mode: Mode = "default"):
        super().__init__(impl, dtype, eps, seed, strict_batch_invariance, op, mode)
        self.override = tol

    def tol(self, d: int, dtype: Optional[npt.DTypeLike] = None) -> BackwardTolerance:
        """The tolerance at ``d`` features (for outputs of ``dtype``,
        default the audit's)."""
        return backward_tolerance(self.dtype if dtype is None else dtype, d, self.override)

    # -- calls ------------------------------------------------------------
    def call_raw(self, dy: npt.NDArray[Any], x: npt.NDArray[Any], weight: Param = None,
                 bias: Param = None, eps: Optional[float] = None, *, copy: bool = True,
                 any_param_shape: bool = False) -> Grads:
        """The implementation's gradients as returned (their own dtypes).

        Parameters
        ----------
        dy, x, weight, bias : ndarray or None
            Already cast; ``weight``/``bias`` already None where not taken.
        eps : float, optional
            Default: the audit eps.
        copy : bool
            Pass copies, so an implementation writing into its inputs cannot
            spoil the reference computed from them.
        any_param_shape : bool
            Accept parameter gradients of any shape (the check of the
            summed axes reads them); by default they must be ``(d,)``.

        Raises
        ------
        ImplementationError
        """
        eps = self.eps if eps is None else float(eps)
        if not self.impl.takes_eps and eps != self.eps:
            raise AssertionError("internal: eps varied for an implementation that takes none")
        args = [None if a is None else (a.copy() if copy else a) for a in (dy, x, weight, bias)]
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                got = self.impl.call(*args, eps)
        except OutputError as exc:
            raise ImplementationError(f"{self.impl.name} {_first_line(exc)}",
                                      "returned no gradients") from exc
        except Exception as exc:
            raise ImplementationError(
                f"{self.impl.name} raised {type(exc).__name__}: {_first_line(exc)} (called with "
                f"dy {_describe(dy)}, x {_describe(x)}, weight {_describe(weight)}, bias "
                f"{_describe(bias)}, eps={eps:g}){self._shape_hint()}",
                f"raised {type(exc).__name__}",
            ) from exc
        dx = np.asarray(got.dx)
        if dx.shape != x.shape:
            raise ImplementationError(
                f"{self.impl.name} returned dx of shape {dx.shape} for x of shape {x.shape}: "
                f"dx must have the shape of x{self._shape_hint()}", f"dx shape {dx.shape}")
        grads = {"dweight": got.dweight if self.impl.returns_dweight else None,
                 "dbias": got.dbias if self.impl.returns_dbias else None}
        out = {}
        for name, value in grads.items():
            a = None if value is None else np.asarray(value)
            if a is not None and not any_param_shape and a.shape != x.shape[-1:]:
                raise ImplementationError(
                    f"{self.impl.name} returned {name} of shape {a.shape} for x of shape "
                    f"{x.shape}: a parameter gradient has the parameter's shape "
                    f"{x.shape[-1:]}, summed over every record (the param_sums check names "
                    "the axes it was summed over)", f"{name} shape {a.shape}")
            if a is not None and a.dtype.kind not in "iu" and not is_float(a.dtype):
                raise ImplementationError(f"{self.impl.name} returned {name} of dtype "
                                          f"{a.dtype}; expected real numbers",
                                          f"{name} {a.dtype}")
            out[name] = a
        if dx.dtype.kind not in "iu" and not is_float(dx.dtype):
            raise ImplementationError(f"{self.impl.name} returned dx of dtype {dx.dtype}; "
                                      "expected real numbers", f"dx {dx.dtype}")
        return Grads(dx, out["dweight"], out["dbias"])

    def call(self, dy: npt.NDArray[Any], x: npt.NDArray[Any], weight: Param = None,
             bias: Param = None, eps: Optional[float] = None, *,
             any_param_shape: bool = False) -> Grads:
        """The gradients in float64."""
        got = self.call_raw(dy, x, weight, bias, eps, any_param_shape=any_param_shape)
        return Grads(got.dx.astype(np.float64), _as_float64(got.dweight),
                     _as_float64(got.dbias))

    def rows(self, dy: npt.ArrayLike, x: npt.ArrayLike, weight: Param = None,
             bias: Param = None, eps: Optional[float] = None,
             dtype: Optional[npt.DTypeLike] = None, *, any_param_shape: bool = False) -> Grads:
        """The gradients of a stack of records ``(n, d)``, in float64.

        Called as one ``(n, d)`` call, or, for an implementation with a fixed
        leading shape, in batches of that shape padded with filler records
        whose ``dy`` is 0 (they add nothing to the parameter gradients),
        whose parameter gradients are added up here. ``dy`` and ``x`` are
        cast to ``dtype`` (default: the audit dtype). With
        ``any_param_shape``, parameter gradients of another shape than
        ``(d,)`` are summed over their leading axes (what the records
        contributed, however the implementation summed them).
        """
        dys, xs = self.cast(dy, dtype), self.cast(x, dtype)
        if not self.fixed_lead:
            return _flattened(self.call(dys, xs, weight, bias, eps,
                                        any_param_shape=any_param_shape))
        lead = self.fixed_leading_shape()
        capacity = math.prod(lead)
        d = xs.shape[1]
        filler = self.cast(self.rng("filler").standard_normal((capacity, d)), xs.dtype)
        zeros = np.zeros((capacity, d), xs.dtype)
        dx, dw, db = [], [], []
        for start in range(0, len(xs), capacity):
            n = len(xs[start:start + capacity])
            bx = np.concatenate([xs[start:start + n], filler[n:]]).reshape(lead + (d,))
            bdy = np.concatenate([dys[start:start + n], zeros[n:]]).reshape(lead + (d,))
            got = _flattened(self.call(bdy, bx, weight, bias, eps,
                                       any_param_shape=any_param_shape))
            dx.append(got.dx.reshape(capacity, d)[:n])
            dw.append(got.dweight)
            db.append(got.dbias)
        return Grads(np.concatenate(dx), _total(dw), _total(db))

    # -- the float64 yardsticks ------------------------------------------
    def reference(self, dy: npt.ArrayLike, x: npt.ArrayLike,
                  weight: Optional[npt.ArrayLike] = None,
                  eps: Optional[float] = None) -> ReferenceGrads:
        """The op's float64 reference backward
        (:func:`layernorm_c.reference_layer_norm_backward` or
        :func:`layernorm_c.reference_rms_norm_backward`) of exactly these
        inputs; an RMSNorm's ``dbias`` is the sum of dy (it has no bias, and
        nothing compares it)."""
        e = self.eps if eps is None else eps
        if self.op.key == "layer_norm":
            got: ReferenceGrads = reference_layer_norm_backward(dy, x, weight, e)
            return got
        rms = self.op.reference_backward(dy, x, weight, e)
        d = np.shape(x)[-1]
        return ReferenceGrads(rms.dx, rms.dweight,
                              np.asarray(dy, np.float64).reshape(-1, d).sum(axis=0))

    def terms(self, dy: npt.ArrayLike, x: npt.ArrayLike, weight: Optional[npt.ArrayLike] = None,
              eps: Optional[float] = None) -> Terms:
        """The records' :class:`~._backward_numerics.Terms` (exactly these
        inputs, float64)."""
        return record_terms(dy, x, weight, self.eps if eps is None else eps,
                            centered=self.op.key == "layer_norm", plus_one=self.op.plus_one)


def _flattened(g: Grads) -> Grads:
    """Parameter gradients summed over their leading axes, to ``(d,)``."""
    d = g.dx.shape[-1]
    return Grads(g.dx, *(a if a is None or a.shape == (d,) or a.size % d else
                         a.reshape(-1, d).sum(axis=0) for a in (g.dweight, g.dbias)))


def _total(parts: List[Optional[npt.NDArray[np.float64]]]) -> Optional[npt.NDArray[np.float64]]:
    if any(p is None for p in parts):
        return None
    total: npt.NDArray[np.float64] = np.sum([p for p in parts if p is not None], axis=0)
    return total
