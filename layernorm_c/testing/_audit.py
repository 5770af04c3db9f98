"""The audit: run the checks on one implementation and gather a report."""
from __future__ import annotations

import math
import warnings
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import numpy.typing as npt

from ._adapters import Framework, LayerNormLike, adapt
from ._checks import CHECKS, run_check
from ._numerics import TOLERANCES, Tolerance
from ._probe import Probe
from ._report import AuditReport

__all__ = ["LayerNormAudit", "check_layer_norm", "LayerNormAuditWarning"]


class LayerNormAuditWarning(UserWarning):
    """Issued by :func:`check_layer_norm` for each check that warned."""


class LayerNormAudit:
    """The validation battery for one LayerNorm implementation.

    Parameters
    ----------
    fn : callable or Implementation
        The LayerNorm under audit, by default called as
        ``fn(x, weight, bias, eps)`` on NumPy arrays and read back with
        ``np.asarray``. See ``signature`` and ``framework`` for others, or
        pass an adapter from :func:`adapt`, :func:`from_torch`,
        :func:`from_jax`.
    signature : str, optional
        The calling convention, e.g. ``"x, weight, eps"``: see :func:`adapt`.
    framework : {'auto', 'numpy', 'torch', 'jax'}, optional
        See :func:`adapt`. Default ``'auto'``.
    dtype : {'float32', 'float64', 'float16'}, optional
        The dtype of every input (the float16 overflow check always uses
        float16). Default ``'float32'``.
    eps : float, optional
        The eps passed to ``fn``; for an implementation that takes none, the
        eps it uses. Default ``1e-5`` (a torch module's own ``eps``).
    d : int, optional
        The only feature size ``fn`` supports (default: the checks pick
        sizes from 4 to 64).
    leading_shape : tuple of int, optional
        The only leading shape ``x.shape[:-1]`` ``fn`` supports (default: the
        checks use shapes such as ``(4, 6)`` and ``(10, 10)``).
    rtol, atol : float, optional
        Override the tolerance for outputs of order 1 (defaults by dtype:
        float16 4e-3, float32 1e-5, float64 1e-12).
    seed : int, optional
        Seed of the random inputs. Default 0.
    strict_batch_invariance : bool, optional
        Fail, rather than warn, when a record's bits change with the batch
        around it. Default False.
    name : str, optional
        How the report names ``fn``.

    Examples
    --------
    >>> import layernorm_c
    >>> from layernorm_c.testing import LayerNormAudit
    >>> report = LayerNormAudit(layernorm_c.layer_norm).run()
    >>> report.ok
    True
    """

    def __init__(self, fn: LayerNormLike, *, signature: Optional[str] = None,
                 framework: Framework = "auto", dtype: npt.DTypeLike = "float32",
                 eps: Optional[float] = None, d: Optional[int] = None,
                 leading_shape: Optional[Sequence[int]] = None, rtol: Optional[float] = None,
                 atol: Optional[float] = None, seed: int = 0,
                 strict_batch_invariance: bool = False, name: Optional[str] = None) -> None:
        self.impl = adapt(fn, signature, framework, name=name, d=d, leading_shape=leading_shape)
        self.dtype: np.dtype[Any] = np.dtype(dtype)
        if self.dtype not in TOLERANCES:
            raise ValueError(f"dtype: expected float16, float32 or float64, got {self.dtype}")
        self.eps = self._resolve_eps(eps)
        default = TOLERANCES[self.dtype]
        self.tolerance = Tolerance(default.rtol if rtol is None else float(rtol),
                                   default.atol if atol is None else float(atol))
        self.seed = int(seed)
        self.strict_batch_invariance = bool(strict_batch_invariance)

    def _resolve_eps(self, eps: Optional[float]) -> float:
        own = self.impl.eps
        if eps is None:
            eps = 1e-5 if own is None else own
        elif own is not None and float(eps) != own:
            raise ValueError(f"eps: {self.impl.name} uses its own eps={own:g}, got eps={eps!r}")
        eps = float(eps)
        if not math.isfinite(eps) or eps < 0:
            raise ValueError(f"eps: expected a finite number >= 0, got {eps!r}")
        return eps

    @property
    def title(self) -> str:
        """What is audited and how, as the report's first line."""
        parts = [str(self.dtype), f"eps={self.eps:g}"]
        if self.impl.d is not None:
            parts.append(f"d={self.impl.d}")
        if self.impl.leading_shape is not None:
            parts.append(f"leading shape {self.impl.leading_shape}")
        return f"LayerNorm audit of {self.impl.name} ({', '.join(parts)})"

    def run(self, checks: Optional[Iterable[str]] = None) -> AuditReport:
        """Run the checks.

        Parameters
        ----------
        checks : iterable of str, optional
            Names from :data:`CHECKS` to run, in that order; default all.

        Returns
        -------
        AuditReport

        Raises
        ------
        ValueError
            An unknown check name.
        """
        names = CHECKS if checks is None else tuple(checks)
        unknown = [n for n in names if n not in CHECKS]
        if unknown:
            raise ValueError(f"checks: unknown {unknown}; expected names from {CHECKS}")
        # One probe per check, so each check sees fresh random streams and a
        # check's outcome does not depend on which others ran.
        results = [run_check(n, self._probe()) for n in names]
        return AuditReport(self.title, results, self)

    def _probe(self) -> Probe:
        return Probe(self.impl, self.dtype, self.eps, self.tolerance, self.seed,
                     self.strict_batch_invariance)


def check_layer_norm(fn: LayerNormLike, *, checks: Optional[Iterable[str]] = None,
                     signature: Optional[str] = None, framework: Framework = "auto",
                     dtype: npt.DTypeLike = "float32", eps: Optional[float] = None,
                     d: Optional[int] = None, leading_shape: Optional[Sequence[int]] = None,
                     rtol: Optional[float] = None, atol: Optional[float] = None, seed: int = 0,
                     strict_batch_invariance: bool = False,
                     name: Optional[str] = None) -> AuditReport:
    """Audit ``fn`` and raise if any check fails.

    Parameters
    ----------
    fn : callable or Implementation
        The LayerNorm under audit; see :class:`LayerNormAudit`.
    checks : iterable of str, optional
        Names from :data:`CHECKS`; default all.
    signature, framework, dtype, eps, d, leading_shape : optional
        As for :class:`LayerNormAudit`.
    rtol, atol, seed, strict_batch_invariance, name : optional
        As for :class:`LayerNormAudit`.

    Returns
    -------
    AuditReport
        When no check failed. Each warning is also issued as a
        :class:`LayerNormAuditWarning`.

    Raises
    ------
    AssertionError
        Some check failed; the message names each failure with its
        diagnosis, then prints the whole report.

    Examples
    --------
    >>> import layernorm_c
    >>> from layernorm_c.testing import check_layer_norm
    >>> check_layer_norm(layernorm_c.layer_norm, dtype="float64").ok
    True
    """
    report = LayerNormAudit(fn, signature=signature, framework=framework, dtype=dtype, eps=eps,
                            d=d, leading_shape=leading_shape, rtol=rtol, atol=atol, seed=seed,
                            strict_batch_invariance=strict_batch_invariance,
                            name=name).run(checks)
    for result in report.warnings:
        warnings.warn(f"{report.title}: {result}", LayerNormAuditWarning, stacklevel=2)
    if not report.ok:
        raise AssertionError(failure_message(report))
    return report


def failure_message(report: AuditReport) -> str:
    """The failures with their diagnoses, then the whole report."""
    lines = [f"{report.title}: {len(report.failures)} of {len(report)} checks failed"]
    lines += [f"- {r.name} ({r.figure}): {r.diagnosis}" for r in report.failures]
    return "\n".join(lines) + "\n\n" + str(report)
