"""The backward audit: run the backward checks on one implementation and
gather a report (the same :class:`~._report.AuditReport` as the forward's)."""
from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import numpy as np
import numpy.typing as npt

from ._adapters import Framework
from ._audit import raise_on_failure, resolve_eps, selected_checks
from ._backward_adapters import BackwardImplementation, BackwardLike, adapt_backward
from ._backward_checks import BACKWARD_CHECKS, run_backward_check
from ._backward_numerics import BackwardTolerance, backward_tolerance
from ._backward_probe import BackwardProbe
from ._numerics import Tolerance, tolerance_for
from ._ops import LAYER_NORM, Op, audit_dtype
from ._report import AuditReport

__all__ = ["LayerNormBackwardAudit", "check_layer_norm_backward"]


class LayerNormBackwardAudit:
    """The validation battery for one LayerNorm backward.

    Parameters
    ----------
    fn : callable or BackwardImplementation
        The backward under audit, by default called as
        ``fn(dy, x, weight, bias, eps)`` on NumPy arrays, returning
        ``(dx, dweight, dbias)``; or a forward that its framework
        differentiates (a ``torch.nn.Module``, ``F.layer_norm``, a torch or
        JAX function whose ``signature`` has no ``dy``).
        ``layernorm_c.layer_norm_backward``,
        ``layernorm_c.reference_layer_norm_backward`` and a
        ``layernorm_c.LayerNorm`` layer are recognized. See
        :func:`~layernorm_c.testing.adapt` with ``backward=True``.
    signature : str, optional
        The calling convention, e.g. ``"dy, x, weight, eps -> dx, dweight"``
        (a backward returning no dbias) or ``"x, weight, bias, eps"`` (a
        forward, for ``framework='torch'`` or ``'jax'``).
    framework : {'auto', 'numpy', 'torch', 'jax'}, optional
        See :func:`~layernorm_c.testing.adapt`. Default ``'auto'``.
    dtype : {'float32', 'float64', 'float16'}, optional
        The dtype of every input (the float16 overflow check always uses
        float16). Default ``'float32'``.
    eps : float, optional
        The eps passed to ``fn`` (the forward's); for an implementation
        that takes none, the eps it uses. Default ``1e-5``.
    d : int, optional
        The only feature size ``fn`` supports.
    leading_shape : tuple of int, optional
        The only leading shape ``x.shape[:-1]`` ``fn`` supports.
    rtol, atol : float, optional
        Override the tolerance. By default the forward's by dtype (float16
        4e-3, float32 1e-5, float64 1e-12), applied to dx in units of each
        record's ``rstd * rms(dy * weight)`` (widened by ``sqrt(d / 256)``
        above 256 features) and to the parameter gradients in units of the
        sum of their terms' magnitudes.
    seed : int, optional
        Seed of the random inputs. Default 0.
    strict_batch_invariance : bool, optional
        Fail, rather than warn, when dx changes bits with the batch around a
        record, or the parameter gradients with the record order, layout or
        thread count. Default False.
    name : str, optional
        How the report names ``fn``.

    Examples
    --------
    >>> import layernorm_c
    >>> from layernorm_c.testing import LayerNormBackwardAudit
    >>> report = LayerNormBackwardAudit(layernorm_c.layer_norm_backward).run()
    >>> report.ok
    True
    """

    def __init__(self, fn: BackwardLike, *, signature: Optional[str] = None,
                 framework: Framework = "auto", dtype: npt.DTypeLike = "float32",
                 eps: Optional[float] = None, d: Optional[int] = None,
                 leading_shape: Optional[Sequence[int]] = None, rtol: Optional[float] = None,
                 atol: Optional[float] = None, seed: int = 0,
                 strict_batch_invariance: bool = False, name: Optional[str] = None) -> None:
        self.impl: BackwardImplementation = adapt_backward(
            fn, signature, framework, name=name, d=d, leading_shape=leading_shape)
        self._setup(LAYER_NORM, dtype, eps, 1e-5, rtol, atol, seed, strict_batch_invariance)

    def _setup(self, op: Op, dtype: npt.DTypeLike, eps: Optional[float], default_eps: float,
               rtol: Optional[float], atol: Optional[float], seed: int,
               strict_batch_invariance: bool) -> None:
        self.op = op
        self.dtype: np.dtype[Any] = audit_dtype(dtype)
        self.eps = resolve_eps(self.impl, eps, default_eps)
        self.override: Optional[Tolerance] = None
        if rtol is not None or atol is not None:
            self.override = tolerance_for(self.dtype, rtol, atol)
        self.seed = int(seed)
        self.strict_batch_invariance = bool(strict_batch_invariance)

    @property
    def tolerance(self) -> BackwardTolerance:
        """The tolerance at the default d of the checks (64): for dx, and for
        the parameter gradients."""
        return backward_tolerance(self.dtype, 64, self.override)

    @property
    def title(self) -> str:
        """What is audited and how, as the report's first line."""
        parts = [str(self.dtype), f"eps={self.eps:g}"]
        if self.impl.autodiff is not None:
            parts.append(self.impl.autodiff)
        if self.impl.d is not None:
            parts.append(f"d={self.impl.d}")
        if self.impl.leading_shape is not None:
            parts.append(f"leading shape {self.impl.leading_shape}")
        return f"LayerNorm backward audit of {self.impl.name} ({', '.join(parts)})"

    def run(self, checks: Optional[Iterable[str]] = None) -> AuditReport:
        """Run the checks.

        Parameters
        ----------
        checks : iterable of str, optional
            Names from :data:`~layernorm_c.testing.BACKWARD_CHECKS` to run,
            in that order; default all.

        Returns
        -------
        AuditReport

        Raises
        ------
        ValueError
            An unknown check name.
        """
        names = selected_checks(checks, BACKWARD_CHECKS)
        results = [run_backward_check(n, self._probe()) for n in names]
        return AuditReport(self.title, results, self)

    def _probe(self) -> BackwardProbe:
        return BackwardProbe(self.impl, self.dtype, self.eps, self.override, self.seed,
                             self.strict_batch_invariance)


def check_layer_norm_backward(fn: BackwardLike, *, checks: Optional[Iterable[str]] = None,
                              signature: Optional[str] = None, framework: Framework = "auto",
                              dtype: npt.DTypeLike = "float32", eps: Optional[float] = None,
                              d: Optional[int] = None,
                              leading_shape: Optional[Sequence[int]] = None,
                              rtol: Optional[float] = None, atol: Optional[float] = None,
                              seed: int = 0, strict_batch_invariance: bool = False,
                              name: Optional[str] = None) -> AuditReport:
    """Audit the backward ``fn`` and raise if any check fails.

    Parameters
    ----------
    fn : callable or BackwardImplementation
        The backward under audit, ``fn(dy, x, weight, bias, eps) -> (dx,
        dweight, dbias)`` by default; see :class:`LayerNormBackwardAudit`.
    checks : iterable of str, optional
        Names from :data:`~layernorm_c.testing.BACKWARD_CHECKS`; default all.
    signature, framework, dtype, eps, d, leading_shape : optional
        As for :class:`LayerNormBackwardAudit`.
    rtol, atol, seed, strict_batch_invariance, name : optional
        As for :class:`LayerNormBackwardAudit`.

    Returns
    -------
    AuditReport
        When no check failed. Each warning is also issued as a
        :class:`~layernorm_c.testing.LayerNormAuditWarning`.

    Raises
    ------
    AssertionError
        Some check failed; the message names each failure with its
        diagnosis, then prints the whole report.

    Examples
    --------
    >>> import layernorm_c
    >>> from layernorm_c.testing import check_layer_norm_backward
    >>> check_layer_norm_backward(layernorm_c.layer_norm_backward, dtype="float64").ok
    True
    """
    report = LayerNormBackwardAudit(
        fn, signature=signature, framework=framework, dtype=dtype, eps=eps, d=d,
        leading_shape=leading_shape, rtol=rtol, atol=atol, seed=seed,
        strict_batch_invariance=strict_batch_invariance, name=name).run(checks)
    return raise_on_failure(report, stacklevel=3)
