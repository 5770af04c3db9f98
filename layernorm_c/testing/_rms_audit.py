"""The RMSNorm audit: the RMSNorm checks on one implementation, gathered in
the same :class:`~._report.AuditReport` as LayerNorm's."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Final, Iterable, Mapping, Optional, Sequence

if TYPE_CHECKING:
    from typing_extensions import Unpack

from ._adapters import Framework, Implementation, LayerNormLike, adapt
from ._audit import ForwardAudit, RMSAudit, RMSAuditOptions, check_op, raise_on_failure
from ._checks import Check
from ._ops import Convention, rms_norm_op
from ._report import AuditReport
from ._rms_checks import RMS_REGISTRY

__all__ = ["RMSNormAudit", "check_rms_norm", "DEFAULT_RMS_SIGNATURE"]

#: The default calling convention of an RMSNorm: ``fn(x, weight, eps)``.
DEFAULT_RMS_SIGNATURE: Final = "x, weight, eps"


def adapt_rms(fn: LayerNormLike, signature: Optional[str], framework: Framework,
              name: Optional[str], d: Optional[int], leading_shape: Optional[Sequence[int]],
              convention: Convention = "weight") -> Implementation:
    """:func:`~._adapters.adapt` with RMSNorm's default signature; an
    RMSNorm takes no bias. ``layernorm_c.rms_norm`` and
    ``layernorm_c.reference_rms_norm`` are called with the audit's
    ``convention`` (the reference read for its ``y``)."""
    import layernorm_c as lnc

    if fn is lnc.rms_norm or fn is lnc.reference_rms_norm:
        known = fn

        def call(x: Any, weight: Any, eps: float) -> Any:
            out = known(x, weight, eps, convention=convention)
            return getattr(out, "y", out)  # the reference's result: its output

        name = name or f"layernorm_c.{known.__name__}"
        fn, signature = call, "x, weight, eps"
    impl = adapt(fn, signature or DEFAULT_RMS_SIGNATURE, framework, name=name, d=d,
                 leading_shape=leading_shape)
    check_op(impl, rms_norm_op(convention))
    if impl.takes_bias:
        raise ValueError(f"signature: an RMSNorm takes no bias, but {impl.name} is declared "
                         f"with one ({signature!r}); give a signature without 'bias'")
    return impl


class RMSNormAudit(RMSAudit, ForwardAudit):
    """The validation battery for one RMSNorm implementation.

    ``y = x / sqrt(mean(x^2) + eps) * weight`` over the last axis (or
    ``* (1 + weight)`` with ``convention="1+weight"``, Gemma's).

    Parameters
    ----------
    fn : callable or Implementation
        The RMSNorm under audit, by default called as ``fn(x, weight, eps)``
        on NumPy arrays. ``torch.nn.functional.rms_norm`` and a
        ``torch.nn.RMSNorm`` (or any module with a ``weight`` and an
        ``eps``), flax's ``linen.RMSNorm`` and ``nnx.RMSNorm``, equinox's
        ``nn.RMSNorm``, keras's ``RMSNormalization`` and an ONNX model's
        ``RMSNormalization`` node are recognized; see :func:`adapt` for other conventions.
    convention : {'weight', '1+weight'}, optional
        How the weight scales: ``'weight'`` (LLaMA, Qwen, T5; default) or
        ``'1+weight'`` (Gemma). The scale check names an implementation of
        the other convention.
    signature : str, optional
        The calling convention, e.g. ``"x, eps"`` or ``"x, *, weight, eps"``
        (default ``"x, weight, eps"``); an RMSNorm takes no bias.
    framework : {'auto', 'numpy', 'torch', 'jax'}, optional
        See :func:`adapt`. Default ``'auto'``.
    dtype : {'float32', 'float64', 'float16', 'bfloat16'}, optional
        The dtype of every input (the float16 overflow check always uses
        float16, the accumulation check float16 unless the audit is in
        bfloat16). ``'bfloat16'`` needs ml_dtypes. Default: the object's own
        (see :attr:`Implementation.dtype`), else ``'float32'``.
    eps : float, optional
        The eps passed to ``fn``; for an implementation that takes none, the
        eps it uses. Default ``1e-6`` (``layernorm_c.rms_norm``'s).
    d, leading_shape, rtol, atol, seed, strict_batch_invariance, name, mode : optional
        As for :class:`LayerNormAudit` (the tolerances by dtype are the
        same).

    Examples
    --------
    >>> import layernorm_c
    >>> from layernorm_c.testing import RMSNormAudit
    >>> RMSNormAudit(layernorm_c.rms_norm).run().ok
    True
    """

    impl: Implementation
    registry: ClassVar[Mapping[str, Check]] = RMS_REGISTRY

    def _adapt(self, fn: LayerNormLike, signature: Optional[str], framework: Framework,
               name: Optional[str], d: Optional[int],
               leading_shape: Optional[Sequence[int]]) -> None:
        self.impl = adapt_rms(fn, signature, framework, name, d, leading_shape, self.convention)



def check_rms_norm(fn: LayerNormLike, *, checks: Optional[Iterable[str]] = None,
                   **options: Unpack[RMSAuditOptions]) -> AuditReport:
    """Audit the RMSNorm ``fn`` and raise if any check fails.

    Parameters
    ----------
    fn : callable or Implementation
        The RMSNorm under audit, ``fn(x, weight, eps)`` by default; see
        :class:`RMSNormAudit`.
    checks : iterable of str, optional
        Names from :data:`RMS_CHECKS`; default all.
    **options
        Those of :class:`RMSNormAudit` (``convention``, ``signature``,
        ``dtype``, ``eps``...).

    Returns
    -------
    AuditReport
        As :func:`check_layer_norm`: when no check failed, each warning
        issued as a :class:`LayerNormAuditWarning`.

    Raises
    ------
    AssertionError
        Some check failed, with each failure's diagnosis and the report.

    Examples
    --------
    >>> import layernorm_c
    >>> from layernorm_c.testing import check_rms_norm
    >>> check_rms_norm(layernorm_c.rms_norm, dtype="float64").ok
    True
    """
    return raise_on_failure(RMSNormAudit(fn, **options).run(checks), stacklevel=3)
