"""Validate your own LayerNorm: a battery of checks that names what is wrong.

>>> from layernorm_c.testing import check_layer_norm, LayerNormAudit
>>> check_layer_norm(my_fn)                  # doctest: +SKIP
>>> report = LayerNormAudit(my_fn, dtype="float32", eps=1e-5).run()  # doctest: +SKIP
>>> print(report)                            # doctest: +SKIP

``my_fn(x, weight, bias, eps)`` by default; :func:`adapt`, :func:`from_torch`
and :func:`from_jax` (or the ``signature=`` and ``framework=`` options) cover
other conventions. :data:`CHECKS` names every check; the pytest plugin
(:mod:`layernorm_c.testing.plugin`) runs them as fixtures, and
``python -m layernorm_c audit module:function`` from the command line.

The backward pass has its own battery, :data:`BACKWARD_CHECKS`:

>>> from layernorm_c.testing import check_layer_norm_backward
>>> check_layer_norm_backward(my_backward)   # doctest: +SKIP

``my_backward(dy, x, weight, bias, eps) -> (dx, dweight, dbias)`` by default,
or a PyTorch or JAX forward differentiated by autograd or ``jax.vjp``; see
:class:`LayerNormBackwardAudit` (``python -m layernorm_c audit --backward
module:function`` from the command line).

RMSNorm has its battery too, :data:`RMS_CHECKS`:

>>> from layernorm_c.testing import check_rms_norm, RMSNormAudit
>>> check_rms_norm(my_rms_norm)              # doctest: +SKIP

``my_rms_norm(x, weight, eps)`` by default (``convention="1+weight"`` for
Gemma's scale); ``python -m layernorm_c audit --op rms_norm module:function``
from the command line.

Other frameworks' layers are recognised from the object alone (eps, axis,
dtype, gain and bias read from it): flax ``linen`` and ``nnx``, equinox and
keras LayerNorms and RMSNorms, ``jax.nn.standardize``, and ONNX models (every
normalization node, run by onnxruntime or onnx's reference evaluator; see
:func:`from_onnx`). :func:`compare` audits several side by side:

>>> from layernorm_c.testing import compare
>>> print(compare({"mine": my_fn, "flax": flax.linen.LayerNorm()}))  # doctest: +SKIP

``python -m layernorm_c audit model.onnx`` and ``python -m layernorm_c audit
A B C`` from the command line.
"""
from typing import Iterable, List, Mapping, Sequence

from ._adapters import DEFAULT_SIGNATURE, Implementation, adapt, from_jax, from_torch
from ._audit import LayerNormAudit, LayerNormAuditWarning, check_layer_norm
from ._backward_adapters import DEFAULT_BACKWARD_SIGNATURE, BackwardImplementation
from ._backward_audit import (DEFAULT_RMS_BACKWARD_SIGNATURE, LayerNormBackwardAudit,
                              RMSNormBackwardAudit, check_layer_norm_backward,
                              check_rms_norm_backward)
from ._backward_checks import BACKWARD_CHECKS, BACKWARD_REGISTRY
from ._checks import CHECKS, REGISTRY
from ._compare import ComparisonReport, compare
from ._frameworks import from_onnx
from ._numerics import TOLERANCES, Tolerance
from ._report import AuditReport, CheckResult
from ._rms_audit import DEFAULT_RMS_SIGNATURE, RMSNormAudit, check_rms_norm
from ._rms_backward_checks import RMS_BACKWARD_CHECKS, RMS_BACKWARD_REGISTRY
from ._rms_checks import RMS_CHECKS, RMS_REGISTRY

__all__ = [
    "check_layer_norm",
    "LayerNormAudit",
    "check_layer_norm_backward",
    "LayerNormBackwardAudit",
    "check_rms_norm",
    "RMSNormAudit",
    "check_rms_norm_backward",
    "RMSNormBackwardAudit",
    "AuditReport",
    "CheckResult",
    "compare",
    "ComparisonReport",
    "from_onnx",
    "CHECKS",
    "BACKWARD_CHECKS",
    "RMS_CHECKS",
    "RMS_BACKWARD_CHECKS",
    "describe_checks",
    "describe_backward_checks",
    "describe_rms_checks",
    "describe_rms_backward_checks",
    "layer_norm_checks",
    "layer_norm_backward_checks",
    "rms_norm_checks",
    "rms_norm_backward_checks",
    "adapt",
    "from_torch",
    "from_jax",
    "Implementation",
    "BackwardImplementation",
    "DEFAULT_SIGNATURE",
    "DEFAULT_BACKWARD_SIGNATURE",
    "DEFAULT_RMS_SIGNATURE",
    "DEFAULT_RMS_BACKWARD_SIGNATURE",
    "Tolerance",
    "TOLERANCES",
    "LayerNormAuditWarning",
]


def _describe(titles: Mapping[str, str]) -> str:
    width = max(len(n) for n in titles)
    return "\n".join(f"{n:<{width}}  {title}" for n, title in titles.items())


def describe_checks() -> str:
    """Every check's name and what it verifies, one per line."""
    return _describe({n: REGISTRY[n].title for n in CHECKS})


def describe_backward_checks() -> str:
    """Every backward check's name and what it verifies, one per line."""
    return _describe({n: BACKWARD_REGISTRY[n].title for n in BACKWARD_CHECKS})


def describe_rms_checks() -> str:
    """Every RMSNorm check's name and what it verifies, one per line."""
    return _describe({n: RMS_REGISTRY[n].title for n in RMS_CHECKS})


def describe_rms_backward_checks() -> str:
    """Every RMSNorm backward check's name and what it verifies, one per line."""
    return _describe({n: RMS_BACKWARD_REGISTRY[n].title for n in RMS_BACKWARD_CHECKS})


def _without(exclude: Iterable[str], known: Sequence[str]) -> List[str]:
    excluded = set(exclude)
    unknown = excluded - set(known)
    if unknown:
        raise ValueError(f"exclude: unknown checks {sorted(unknown)}; expected names from "
                         f"{tuple(known)}")
    return [n for n in known if n not in excluded]


def layer_norm_checks(exclude: Iterable[str] = ()) -> List[str]:
    """Check names for ``pytest.mark.parametrize``, minus ``exclude``.

    Parameters
    ----------
    exclude : iterable of str, optional
        Checks to leave out.

    Returns
    -------
    list of str

    Raises
    ------
    ValueError
        An unknown name in ``exclude``.

    Examples
    --------
    >>> import pytest
    >>> @pytest.mark.parametrize("check", layer_norm_checks(exclude=["float16_overflow"]))
    ... def test_mine(check):
    ...     check_layer_norm(my_fn, checks=[check])  # doctest: +SKIP
    """
    return _without(exclude, CHECKS)


def layer_norm_backward_checks(exclude: Iterable[str] = ()) -> List[str]:
    """Backward check names for ``pytest.mark.parametrize``, minus ``exclude``.

    Parameters
    ----------
    exclude : iterable of str, optional
        Checks to leave out.

    Returns
    -------
    list of str

    Raises
    ------
    ValueError
        An unknown name in ``exclude``.
    """
    return _without(exclude, BACKWARD_CHECKS)


def rms_norm_checks(exclude: Iterable[str] = ()) -> List[str]:
    """RMSNorm check names (:data:`RMS_CHECKS`) minus ``exclude``, as
    :func:`layer_norm_checks` gives LayerNorm's (ValueError for an unknown
    name)."""
    return _without(exclude, RMS_CHECKS)


def rms_norm_backward_checks(exclude: Iterable[str] = ()) -> List[str]:
    """RMSNorm backward check names (:data:`RMS_BACKWARD_CHECKS`) minus
    ``exclude``, as :func:`layer_norm_checks` gives LayerNorm's."""
    return _without(exclude, RMS_BACKWARD_CHECKS)
