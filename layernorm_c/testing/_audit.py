"""The audit: run the checks on one implementation and gather a report."""
from __future__ import annotations

import math
import warnings
from typing import Any, ClassVar, Iterable, List, Mapping, Optional, Sequence, Tuple, TypedDict

import numpy as np
import numpy.typing as npt

from ._adapters import Framework, Implementation, LayerNormLike, adapt
from ._checks import REGISTRY, Check, run_check
from ._numerics import MODES, Mode, Tolerance, tolerance_for
from ._ops import LAYER_NORM, Convention, Op, audit_dtype, rms_norm_op
from ._probe import Declared, Probe
from ._report import AuditReport, CheckResult, link_causes

__all__ = ["Audit", "ForwardAudit", "RMSAudit", "AuditOptions", "RMSAuditOptions", "LayerNormAudit", "check_layer_norm", "LayerNormAuditWarning"]


class LayerNormAuditWarning(UserWarning):
    """Issued by :func:`check_layer_norm` for each check that warned."""


class Audit:
    """What every battery's audit shares (forward and backward, LayerNorm
    and RMSNorm): the options resolved, one fresh probe per check, the
    report. A subclass says which checks (:meth:`_registry`) and how one
    runs (:meth:`_run_check`)."""

    impl: Declared
    op: Op
    kind: str = "audit"
    #: The battery's checks by name, in the order they run.
    registry: ClassVar[Mapping[str, Any]]

    def _setup(self, op: Op, dtype: Optional[npt.DTypeLike], eps: Optional[float], default_eps: float,
               rtol: Optional[float], atol: Optional[float], seed: int,
               strict_batch_invariance: bool, mode: Mode = "default") -> None:
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
        #: How much the checks measure: 'quick', 'default' or 'thorough'.
        self.mode: Mode = mode
        self.op = op
        own_dtype = getattr(self.impl, "dtype", None)
        #: Whether the dtype is the object's own (none was given).
        self.own_dtype = dtype is None and own_dtype is not None
        self.dtype: np.dtype[Any] = audit_dtype(
            dtype if dtype is not None else own_dtype or "float32")
        self.eps = resolve_eps(self.impl, eps, default_eps)
        #: The user's tolerance, or None for the defaults by dtype.
        self.override: Optional[Tolerance] = (None if rtol is None and atol is None else
                                              tolerance_for(self.dtype, rtol, atol))
        self.seed = int(seed)
        self.strict_batch_invariance = bool(strict_batch_invariance)

    def _title_parts(self) -> List[str]:
        return []

    @property
    def title(self) -> str:
        """What is audited and how, as the report's first line."""
        parts = [str(self.dtype) + (" (its own)" if getattr(self, "own_dtype", False) else ""),
                 f"eps={eps_text(self.eps)}"] + self._title_parts()
        if self.impl.d is not None:
            parts.append(f"d={self.impl.d}")
        if self.impl.leading_shape is not None:
            parts.append(f"leading shape {self.impl.leading_shape}")
        if self.op.plus_one:
            parts.append("scale 1 + weight")
        if self.mode != "default":
            parts.append(self.mode)
        title = f"{self.op.name} {self.kind} of {self.impl.name} ({', '.join(parts)})"
        details = getattr(self.impl, "details", None)
        if details:
            title += f"; read from the object: {details}"
        return title

    def run(self, checks: Optional[Iterable[str]] = None) -> AuditReport:
        """Run the checks.

        Parameters
        ----------
        checks : iterable of str, optional
            Names from the battery's checks (:data:`CHECKS`,
            :data:`RMS_CHECKS`, :data:`BACKWARD_CHECKS` or
            :data:`RMS_BACKWARD_CHECKS`) to run, in that order; default all.

        Returns
        -------
        AuditReport

        Raises
        ------
        ValueError
            An unknown check name.
        """
        names = selected_checks(checks, tuple(self.registry))
        # One probe per check, so each check sees fresh random streams and a
        # check's outcome does not depend on which others ran.
        results = [self._run_check(n) for n in names]
        complete = set(names) == set(self.registry)
        return AuditReport(self.title, link_causes(results, complete), self)

    def _run_check(self, name: str) -> CheckResult:
        raise NotImplementedError


class ForwardAudit(Audit):
    """What the forward batteries share (see :class:`LayerNormAudit` and
    :class:`RMSNormAudit`)."""

    impl: Implementation

    @property
    def tolerance(self) -> Tolerance:
        """The tolerance for outputs of order 1."""
        return self.override or tolerance_for(self.dtype)

    registry: ClassVar[Mapping[str, Check]] = REGISTRY

    def _run_check(self, name: str) -> CheckResult:
        return run_check(name, self._probe(), self.registry)

    def _probe(self) -> Probe:
        return Probe(self.impl, self.dtype, self.eps, self.tolerance, self.seed,
                     self.strict_batch_invariance, self.op, self.mode)


class AuditOptions(TypedDict, total=False):
    """The options every audit takes (``**options`` of the ``check_*``
    functions)."""

    signature: Optional[str]
    framework: Framework
    dtype: npt.DTypeLike
    eps: Optional[float]
    d: Optional[int]
    leading_shape: Optional[Sequence[int]]
    rtol: Optional[float]
    atol: Optional[float]
    seed: int
    strict_batch_invariance: bool
    name: Optional[str]
    mode: Mode


class RMSAuditOptions(AuditOptions, total=False):
    """An RMSNorm audit's options: those of every audit and the weight's
    ``convention``."""

    convention: Convention


class RMSAudit(Audit):
    """What the RMSNorm audits (forward and backward) share: their options,
    the weight convention and eps 1e-6 by default. A subclass adapts ``fn``
    (:meth:`_adapt`)."""

    def __init__(self, fn: Any, *, convention: Convention = "weight",
                 signature: Optional[str] = None, framework: Framework = "auto",
                 dtype: Optional[npt.DTypeLike] = None, eps: Optional[float] = None,
                 d: Optional[int] = None, leading_shape: Optional[Sequence[int]] = None,
                 rtol: Optional[float] = None, atol: Optional[float] = None, seed: int = 0,
                 strict_batch_invariance: bool = False, name: Optional[str] = None,
                 mode: Mode = "default") -> None:
        op = rms_norm_op(convention)
        self.convention: Convention = op.convention
        self._adapt(fn, signature, framework, name, d, leading_shape)
        self._setup(op, dtype, eps, 1e-6, rtol, atol, seed, strict_batch_invariance, mode)

    def _adapt(self, fn: Any, signature: Optional[str], framework: Framework,
               name: Optional[str], d: Optional[int],
               leading_shape: Optional[Sequence[int]]) -> None:
        """Set ``self.impl`` (``self.convention`` is known)."""
        raise NotImplementedError


class LayerNormAudit(ForwardAudit):
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
    dtype : {'float32', 'float64', 'float16', 'bfloat16'}, optional
        The dtype of every input (the float16 overflow check always uses
        float16). ``'bfloat16'`` needs ml_dtypes. Default: the object's own
        (an ONNX node's, a keras layer's compute dtype, a flax module's
        ``dtype``: see :attr:`Implementation.dtype`), else ``'float32'``.
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
        float16 4e-3, float32 1e-5, float64 1e-12, bfloat16 2^-5).
    seed : int, optional
        Seed of the random inputs. Default 0.
    strict_batch_invariance : bool, optional
        Fail, rather than warn, when a record's bits change with the batch
        around it. Default False.
    name : str, optional
        How the report names ``fn``.
    mode : {'default', 'quick', 'thorough'}, optional
        How much is measured: ``'quick'`` runs the large-d check on fewer
        sizes (under 2 s in all for a fast implementation), ``'thorough'``
        up to d = 2^22 with more records (minutes for a slow one). Default
        ``'default'``: up to d = 2^20, under 10 s for a fast implementation.

    Examples
    --------
    >>> import layernorm_c
    >>> from layernorm_c.testing import LayerNormAudit
    >>> report = LayerNormAudit(layernorm_c.layer_norm).run()
    >>> report.ok
    True
    """

    def __init__(self, fn: LayerNormLike, *, signature: Optional[str] = None,
                 framework: Framework = "auto", dtype: Optional[npt.DTypeLike] = None,
                 eps: Optional[float] = None, d: Optional[int] = None,
                 leading_shape: Optional[Sequence[int]] = None, rtol: Optional[float] = None,
                 atol: Optional[float] = None, seed: int = 0,
                 strict_batch_invariance: bool = False, name: Optional[str] = None,
                 mode: Mode = "default") -> None:
        self.impl = adapt(fn, signature, framework, name=name, d=d, leading_shape=leading_shape)
        check_op(self.impl, LAYER_NORM)
        self._setup(LAYER_NORM, dtype, eps, 1e-5, rtol, atol, seed, strict_batch_invariance,
                    mode)


def check_layer_norm(fn: LayerNormLike, *, checks: Optional[Iterable[str]] = None,
                     signature: Optional[str] = None, framework: Framework = "auto",
                     dtype: Optional[npt.DTypeLike] = None, eps: Optional[float] = None,
                     d: Optional[int] = None, leading_shape: Optional[Sequence[int]] = None,
                     rtol: Optional[float] = None, atol: Optional[float] = None, seed: int = 0,
                     strict_batch_invariance: bool = False,
                     name: Optional[str] = None, mode: Mode = "default") -> AuditReport:
    """Audit ``fn`` and raise if any check fails.

    Parameters
    ----------
    fn : callable or Implementation
        The LayerNorm under audit; see :class:`LayerNormAudit`.
    checks : iterable of str, optional
        Names from :data:`CHECKS`; default all.
    signature, framework, dtype, eps, d, leading_shape : optional
        As for :class:`LayerNormAudit`.
    rtol, atol, seed, strict_batch_invariance, name, mode : optional
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
                            name=name, mode=mode).run(checks)
    return raise_on_failure(report, stacklevel=3)


def raise_on_failure(report: AuditReport, stacklevel: int = 2) -> AuditReport:
    """Issue each warning of ``report`` as a :class:`LayerNormAuditWarning`
    (``stacklevel`` counted from the caller) and raise AssertionError with
    :func:`failure_message` if a check failed."""
    for result in report.warnings:
        warnings.warn(f"{report.title}: {result}", LayerNormAuditWarning,
                      stacklevel=stacklevel)
    if not report.ok:
        raise AssertionError(failure_message(report))
    return report


def selected_checks(checks: Optional[Iterable[str]], known: Tuple[str, ...]) -> Tuple[str, ...]:
    """The checks to run: ``checks`` (default all of ``known``), validated."""
    names = known if checks is None else tuple(checks)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"checks: unknown {unknown}; expected names from {known}")
    return names


def resolve_eps(impl: Declared, eps: Optional[float], default: float) -> float:
    """The audit's eps: ``eps``, or the implementation's own, or ``default``.

    Raises
    ------
    ValueError
        ``eps`` contradicts the implementation's own, or is not finite and
        >= 0.
    """
    own = impl.eps
    if eps is None:
        eps = default if own is None else own
    elif own is not None and float(eps) != own:
        raise ValueError(f"eps: {impl.name} uses its own eps={own:g}, got eps={eps!r}")
    eps = float(eps)
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps: expected a finite number >= 0, got {eps!r}")
    return eps



def eps_text(eps: float) -> str:
    """eps with as many digits as it takes to tell it from its neighbours
    (``1e-05``, but ``9.99999974737875e-06`` for float32's 1e-5)."""
    short = f"{eps:g}"
    return short if float(short) == eps else repr(eps)


def check_op(impl: Declared, op: Op) -> None:
    """Raise when the object says it computes another op than ``op``.

    Raises
    ------
    ValueError
    """
    own = getattr(impl, "op", None)
    if own is None or own == op.key:
        return
    if own == "rms_norm":
        raise ValueError(f"fn: {impl.name} is an RMSNorm; audit it with RMSNormAudit "
                         "(check_rms_norm, or --op rms_norm on the command line)")
    raise ValueError(f"fn: {impl.name} is a LayerNorm; audit it with LayerNormAudit "
                     "(check_layer_norm, or --op layer_norm on the command line)")


def failure_message(report: AuditReport) -> str:
    """The failures with their diagnoses, then the whole report."""
    lines = [f"{report.title}: {len(report.failures)} of {len(report)} checks failed"]
    lines += [f"- {r.name} ({r.figure}): {r.diagnosis}" for r in report.failures]
    return "\n".join(lines) + "\n\n" + str(report)
