"""The pytest plugin of layernorm_c.testing (documented as
``layernorm_c.testing.plugin``): the ``layer_norm_check`` and
``layer_norm_audit`` fixtures and the ``layer_norm_checks`` marker.

The ``pytest11`` entry point loads this module in every pytest run of an
environment where layernorm_c is installed, so it is a top-level module
that imports only pytest and the standard library: importing anything
inside the ``layernorm_c`` package would import NumPy and the C core
first. layernorm_c is imported when a test requests one of the fixtures,
never before.

The entry point is named ``layernorm_c.testing.plugin``, the module users
name with ``-p``: pytest then finds the plugin registered under that name
and does not load it a second time, and ``-p no:layernorm_c.testing.plugin``
turns it off. Usage: see :mod:`layernorm_c.testing.plugin`.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Callable, List, Optional

import pytest

if TYPE_CHECKING:
    from layernorm_c.testing import AuditReport, CheckResult

FIXTURE = "layer_norm_check"
MARKER = "layer_norm_checks"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*names, exclude=()): the LayerNorm checks the {FIXTURE} fixture "
        "runs (default: all of layernorm_c.testing.CHECKS)",
    )


def _selected_checks(marker: Optional[pytest.Mark]) -> List[str]:
    from layernorm_c.testing import CHECKS

    if marker is None:
        return list(CHECKS)
    chosen = list(marker.args) or list(CHECKS)
    exclude = tuple(marker.kwargs.get("exclude", ()))
    unknown = [n for n in chosen + list(exclude) if n not in CHECKS]
    if unknown:
        # A CollectError shows as its message, without a traceback.
        raise pytest.Collector.CollectError(
            f"@pytest.mark.{MARKER}: unknown checks {unknown}; expected names from {CHECKS}")
    return [n for n in chosen if n not in exclude]


def _parametrized_by_user(metafunc: pytest.Metafunc) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if FIXTURE in names:
            return True
    return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One item per check for every test that requests ``layer_norm_check``."""
    if FIXTURE in metafunc.fixturenames and not _parametrized_by_user(metafunc):
        names = _selected_checks(metafunc.definition.get_closest_marker(MARKER))
        metafunc.parametrize(FIXTURE, names, ids=names, indirect=True)


@pytest.fixture
def layer_norm_audit() -> Callable[..., AuditReport]:
    """``audit(fn, **options)``: run every check on ``fn``; fail the test
    with the diagnosis if any check fails, else return the report."""
    from layernorm_c.testing import check_layer_norm

    def audit(fn: Any, **options: Any) -> AuditReport:
        __tracebackhide__ = True
        try:
            return check_layer_norm(fn, **options)
        except AssertionError as exc:
            pytest.fail(str(exc), pytrace=False)

    return audit


@pytest.fixture
def layer_norm_check(request: pytest.FixtureRequest) -> Callable[..., CheckResult]:
    """``check(fn, **options)``: run this item's check (the fixture is
    parametrized over the checks) on ``fn``; fail, skip or warn with its
    diagnosis, return the :class:`~layernorm_c.testing.CheckResult`."""
    from layernorm_c.testing import LayerNormAudit, LayerNormAuditWarning

    name = getattr(request, "param", None)
    if name is None:
        raise pytest.UsageError(f"the {FIXTURE} fixture is parametrized over the checks by the "
                                "layernorm_c plugin; parametrize it indirectly with check names")

    def check(fn: Any, **options: Any) -> CheckResult:
        __tracebackhide__ = True
        audit = LayerNormAudit(fn, **options)
        result = audit.run([name]).results[0]
        message = f"{result.diagnosis}\n[{audit.title}; {result.name}: {result.figure}]"
        if result.status == "fail":
            pytest.fail(message, pytrace=False)
        if result.status == "skip":
            pytest.skip(message)
        if result.status == "warn":
            warnings.warn(message, LayerNormAuditWarning, stacklevel=2)
        return result

    check.name = name  # type: ignore[attr-defined]
    return check
