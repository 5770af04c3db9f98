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
"""
from typing import Iterable, List

from ._adapters import DEFAULT_SIGNATURE, Implementation, adapt, from_jax, from_torch
from ._audit import LayerNormAudit, LayerNormAuditWarning, check_layer_norm
from ._checks import CHECKS, REGISTRY
from ._numerics import TOLERANCES, Tolerance
from ._report import AuditReport, CheckResult

__all__ = [
    "check_layer_norm",
    "LayerNormAudit",
    "AuditReport",
    "CheckResult",
    "CHECKS",
    "describe_checks",
    "layer_norm_checks",
    "adapt",
    "from_torch",
    "from_jax",
    "Implementation",
    "DEFAULT_SIGNATURE",
    "Tolerance",
    "TOLERANCES",
    "LayerNormAuditWarning",
]


def describe_checks() -> str:
    """Every check's name and what it verifies, one per line."""
    width = max(len(n) for n in CHECKS)
    return "\n".join(f"{n:<{width}}  {REGISTRY[n].title}" for n in CHECKS)


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
    excluded = set(exclude)
    unknown = excluded - set(CHECKS)
    if unknown:
        raise ValueError(f"exclude: unknown checks {sorted(unknown)}; expected names from {CHECKS}")
    return [n for n in CHECKS if n not in excluded]
