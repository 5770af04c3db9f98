"""The backward audit: run the backward checks on one implementation and
gather a report (the same :class:`~._report.AuditReport` as the forward's)."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, Final, Iterable, List, Mapping, Optional, Sequence

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from typing_extensions import Unpack

from ._adapters import Framework
from ._audit import Audit, RMSAudit, RMSAuditOptions, raise_on_failure
from ._backward_adapters import (BackwardImplementation, BackwardLike, Grads, _layernorm_c_threads,
                                 adapt_backward)
from ._backward_checks import BACKWARD_REGISTRY, BackwardCheck, run_backward_check
from ._backward_numerics import BackwardTolerance, backward_tolerance
from ._backward_probe import BackwardProbe
from ._rms_backward_checks import RMS_BACKWARD_REGISTRY
from ._numerics import Mode
from ._ops import LAYER_NORM, Convention
from ._report import AuditReport, CheckResult

__all__ = ["LayerNormBackwardAudit", "check_layer_norm_backward", "RMSNormBackwardAudit",
           "check_rms_norm_backward", "DEFAULT_RMS_BACKWARD_SIGNATURE"]


class LayerNormBackwardAudit(Audit):
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
    dtype : {'float32', 'float64', 'float16', 'bfloat16'}, optional
        The dtype of every input (the float16 overflow check always uses
        float16). ``'bfloat16'`` needs ml_dtypes. Default ``'float32'``.
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
    mode : {'default', 'quick', 'thorough'}, optional
        How much is measured (the large-d check's sweep), as for
        :class:`~layernorm_c.testing.LayerNormAudit`.

    Examples
    --------
    >>> import layernorm_c
    >>> from layernorm_c.testing import LayerNormBackwardAudit
    >>> report = LayerNormBackwardAudit(layernorm_c.layer_norm_backward).run()
    >>> report.ok
    True
    """

    impl: BackwardImplementation
    kind = "backward audit"
    registry: ClassVar[Mapping[str, BackwardCheck]] = BACKWARD_REGISTRY

    def __init__(self, fn: BackwardLike, *, signature: Optional[str] = None,
                 framework: Framework = "auto", dtype: npt.DTypeLike = "float32",
                 eps: Optional[float] = None, d: Optional[int] = None,
                 leading_shape: Optional[Sequence[int]] = None, rtol: Optional[float] = None,
                 atol: Optional[float] = None, seed: int = 0,
                 strict_batch_invariance: bool = False, name: Optional[str] = None,
                 mode: Mode = "default") -> None:
        self.impl: BackwardImplementation = adapt_backward(
            fn, signature, framework, name=name, d=d, leading_shape=leading_shape)
        self._setup(LAYER_NORM, dtype, eps, 1e-5, rtol, atol, seed, strict_batch_invariance,
                    mode)

    @property
    def tolerance(self) -> BackwardTolerance:
        """The tolerance at the default d of the checks (64): for dx, and for
        the parameter gradients."""
        return backward_tolerance(self.dtype, 64, self.override)

    def _title_parts(self) -> List[str]:
        return [] if self.impl.autodiff is None else [self.impl.autodiff]

    def _run_check(self, name: str) -> CheckResult:
        return run_backward_check(name, self._probe(), self.registry)

    def _probe(self) -> BackwardProbe:
        return BackwardProbe(self.impl, self.dtype, self.eps, self.override, self.seed,
                             self.strict_batch_invariance, self.op, self.mode)


def check_layer_norm_backward(fn: BackwardLike, *, checks: Optional[Iterable[str]] = None,
                              signature: Optional[str] = None, framework: Framework = "auto",
                              dtype: npt.DTypeLike = "float32", eps: Optional[float] = None,
                              d: Optional[int] = None,
                              leading_shape: Optional[Sequence[int]] = None,
                              rtol: Optional[float] = None, atol: Optional[float] = None,
                              seed: int = 0, strict_batch_invariance: bool = False,
                              name: Optional[str] = None,
                              mode: Mode = "default") -> AuditReport:
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
    rtol, atol, seed, strict_batch_invariance, name, mode : optional
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
        strict_batch_invariance=strict_batch_invariance, name=name, mode=mode).run(checks)
    return raise_on_failure(report, stacklevel=3)


class RMSNormBackwardAudit(RMSAudit, LayerNormBackwardAudit):
    """The validation battery for one RMSNorm backward.

    Parameters
    ----------
    fn : callable or BackwardImplementation
        The backward under audit, by default called as
        ``fn(dy, x, weight, eps)`` on NumPy arrays, returning
        ``(dx, dweight)``; or a forward that its framework differentiates (a
        ``torch.nn.RMSNorm``, ``F.rms_norm``, a torch or JAX function whose
        ``signature`` has no ``dy``, e.g. ``"x, weight, eps"``).
        ``layernorm_c.rms_norm_backward`` and
        ``layernorm_c.reference_rms_norm_backward`` are recognized (called
        with the audit's convention), and so is a ``layernorm_c.RMSNorm``
        layer.
    convention : {'weight', '1+weight'}, optional
        How the forward's weight scales (``'1+weight'``: Gemma). Default
        ``'weight'``.
    signature, framework, dtype, d, leading_shape, rtol, atol, seed : optional
        As for :class:`LayerNormBackwardAudit` (default signature
        ``"dy, x, weight, eps -> dx, dweight"``).
    eps : float, optional
        The forward's eps. Default ``1e-6``.
    strict_batch_invariance, name, mode : optional
        As for :class:`LayerNormBackwardAudit`.

    Examples
    --------
    >>> import layernorm_c
    >>> from layernorm_c.testing import RMSNormBackwardAudit
    >>> RMSNormBackwardAudit(layernorm_c.rms_norm_backward).run().ok
    True
    """

    registry: ClassVar[Mapping[str, BackwardCheck]] = RMS_BACKWARD_REGISTRY

    def _adapt(self, fn: BackwardLike, signature: Optional[str], framework: Framework,
               name: Optional[str], d: Optional[int],
               leading_shape: Optional[Sequence[int]]) -> None:
        self.impl = adapt_rms_backward(fn, signature, framework, name, d, leading_shape,
                                       self.convention)



def check_rms_norm_backward(fn: BackwardLike, *, checks: Optional[Iterable[str]] = None,
                            **options: Unpack[RMSAuditOptions]) -> AuditReport:
    """Audit the RMSNorm backward ``fn`` (``fn(dy, x, weight, eps) -> (dx,
    dweight)`` by default) with the options of :class:`RMSNormBackwardAudit`
    and ``checks`` from :data:`~layernorm_c.testing.RMS_BACKWARD_CHECKS`
    (default all); return the report, or raise AssertionError with each
    failure's diagnosis, as :func:`check_layer_norm_backward` does.

    Examples
    --------
    >>> import layernorm_c
    >>> from layernorm_c.testing import check_rms_norm_backward
    >>> check_rms_norm_backward(layernorm_c.rms_norm_backward, dtype="float64").ok
    True
    """
    return raise_on_failure(RMSNormBackwardAudit(fn, **options).run(checks), stacklevel=3)


#: The default calling convention of an RMSNorm backward.
DEFAULT_RMS_BACKWARD_SIGNATURE: Final = "dy, x, weight, eps -> dx, dweight"


def adapt_rms_backward(fn: BackwardLike, signature: Optional[str], framework: Framework,
                       name: Optional[str], d: Optional[int],
                       leading_shape: Optional[Sequence[int]],
                       convention: Convention) -> BackwardImplementation:
    """:func:`~._backward_adapters.adapt_backward` with RMSNorm's default
    signature (a forward without ``dy`` defaults to ``x, weight, eps``);
    layernorm_c's RMSNorm backward, reference and layer, called with the
    audit's convention. An RMSNorm has no bias."""
    import layernorm_c as lnc

    if fn is lnc.rms_norm or fn is lnc.reference_rms_norm:
        raise TypeError(f"fn: layernorm_c.{getattr(fn, '__name__', fn)} is a forward; audit "
                        "its backward (rms_norm_backward, reference_rms_norm_backward) or a "
                        "layernorm_c.RMSNorm layer")
    if fn is lnc.rms_norm_backward or fn is lnc.reference_rms_norm_backward:
        known = fn

        def call(dy: Any, x: Any, weight: Any, eps: float) -> Any:
            g = known(dy, x, weight, eps, convention=convention)
            return g.dx, g.dweight

        impl = adapt_backward(call, "dy, x, weight, eps -> dx, dweight", "numpy",
                              name=name or f"layernorm_c.{known.__name__}", d=d,
                              leading_shape=leading_shape)
        if fn is lnc.rms_norm_backward:
            impl = replace(impl, threads=_layernorm_c_threads())
        return impl
    if isinstance(fn, lnc.RMSNorm):
        impl = _layernorm_c_rms_layer(lnc, fn)
        impl = replace(impl, name=name) if name else impl
        return impl.restricted(d, leading_shape)
    if signature is None and not isinstance(fn, BackwardImplementation):
        signature = DEFAULT_RMS_BACKWARD_SIGNATURE
    impl = adapt_backward(fn, signature, framework, name=name, d=d, leading_shape=leading_shape)
    if impl.takes_bias or impl.returns_dbias:
        raise ValueError(f"signature: an RMSNorm has no bias, but {impl.name} is declared with "
                         "one; give a signature without 'bias' and 'dbias'")
    return impl


def _layernorm_c_rms_layer(lnc: Any, layer: Any) -> BackwardImplementation:
    """A layernorm_c.RMSNorm layer: a fresh layer like it per call, its
    forward and backward; dx and the weight's gradient from zero."""
    takes_weight = layer.weight is not None

    def call(dy: npt.NDArray[Any], x: npt.NDArray[Any], w: Optional[npt.NDArray[Any]],
             _b: Optional[npt.NDArray[Any]], _eps: float) -> Grads:
        fresh = lnc.RMSNorm(layer.normalized_shape, layer.eps, gain=takes_weight,
                            dtype=x.dtype, convention=layer._rms_convention())
        if w is not None:
            fresh.load_state_dict({"weight": w})
        fresh(x)
        dx = fresh.backward(dy)
        return Grads(np.asarray(dx), fresh.grad_weight, None)

    return BackwardImplementation(call, "layernorm_c.RMSNorm", takes_weight, False, False,
                                  takes_weight, False, float(layer.eps),
                                  layer.normalized_shape[0], framework="numpy",
                                  threads=_layernorm_c_threads())
