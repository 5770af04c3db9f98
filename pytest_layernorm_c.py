"""The pytest plugin of layernorm_c.testing (documented as
``layernorm_c.testing.plugin``): the ``layer_norm_check`` and
``layer_norm_audit`` fixtures and the ``layer_norm_checks`` marker, and
their backward counterparts ``layer_norm_backward_check``,
``layer_norm_backward_audit`` and ``layer_norm_backward_checks``.

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
BACKWARD_FIXTURE = "layer_norm_backward_check"
BACKWARD_MARKER = "layer_norm_backward_checks"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*names, exclude=()): the LayerNorm checks the {FIXTURE} fixture "
        "runs (default: all of layernorm_c.testing.CHECKS)",
    )
    config.addinivalue_line(
        "markers",
        f"{BACKWARD_MARKER}(*names, exclude=()): the LayerNorm backward checks the "
        f"{BACKWARD_FIXTURE} fixture runs (default: all of "
        "layernorm_c.testing.BACKWARD_CHECKS)",
    )


def _all_checks(backward: bool) -> List[str]:
    from layernorm_c.testing import BACKWARD_CHECKS, CHECKS

    return list(BACKWARD_CHECKS if backward else CHECKS)


def _selected_checks(marker: Optional[pytest.Mark], backward: bool = False) -> List[str]:
    known = _all_checks(backward)
    if marker is None:
        return known
    chosen = list(marker.args) or known
    exclude = tuple(marker.kwargs.get("exclude", ()))
    unknown = [n for n in chosen + list(exclude) if n not in known]
    if unknown:
        # A CollectError shows as its message, without a traceback.
        raise pytest.Collector.CollectError(
            f"@pytest.mark.{BACKWARD_MARKER if backward else MARKER}: unknown checks "
            f"{unknown}; expected names from {tuple(known)}")
    return [n for n in chosen if n not in exclude]


def _parametrized_by_user(metafunc: pytest.Metafunc, fixture: str = FIXTURE) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if fixture in names:
            return True
    return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One item per check for every test that requests ``layer_norm_check``
    (or ``layer_norm_backward_check``: one per backward check)."""
    for fixture, marker, backward in ((FIXTURE, MARKER, False),
                                      (BACKWARD_FIXTURE, BACKWARD_MARKER, True)):
        if fixture in metafunc.fixturenames and not _parametrized_by_user(metafunc, fixture):
            names = _selected_checks(metafunc.definition.get_closest_marker(marker), backward)
            metafunc.parametrize(fixture, names, ids=names, indirect=True)


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
def layer_norm_backward_audit() -> Callable[..., AuditReport]:
    """``audit(fn, **options)``: run every backward check on the backward
    ``fn``; fail the test with the diagnosis if any check fails, else return
    the report."""
    from layernorm_c.testing import check_layer_norm_backward

    def audit(fn: Any, **options: Any) -> AuditReport:
        __tracebackhide__ = True
        try:
            return check_layer_norm_backward(fn, **options)
        except AssertionError as exc:
            pytest.fail(str(exc), pytrace=False)

    return audit


def _one_check(request: pytest.FixtureRequest, fixture: str,
               backward: bool) -> Callable[..., CheckResult]:
    from layernorm_c.testing import LayerNormAuditWarning, LayerNormAudit, LayerNormBackwardAudit

    name = getattr(request, "param", None)
    if name is None:
        raise pytest.UsageError(f"the {fixture} fixture is parametrized over the checks by the "
                                "layernorm_c plugin; parametrize it indirectly with check names")
    kind = LayerNormBackwardAudit if backward else LayerNormAudit

    def check(fn: Any, **options: Any) -> CheckResult:
        __tracebackhide__ = True
        audit = kind(fn, **options)
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


@pytest.fixture
def layer_norm_check(request: pytest.FixtureRequest) -> Callable[..., CheckResult]:
    """``check(fn, **options)``: run this item's check (the fixture is
    parametrized over the checks) on ``fn``; fail, skip or warn with its
    diagnosis, return the :class:`~layernorm_c.testing.CheckResult`."""
    return _one_check(request, FIXTURE, backward=False)


@pytest.fixture
def layer_norm_backward_check(request: pytest.FixtureRequest) -> Callable[..., CheckResult]:
    """``check(fn, **options)``: run this item's backward check (the fixture
    is parametrized over the backward checks) on the backward ``fn``; fail,
    skip or warn with its diagnosis, return the
    :class:`~layernorm_c.testing.CheckResult`."""
    return _one_check(request, BACKWARD_FIXTURE, backward=True)
