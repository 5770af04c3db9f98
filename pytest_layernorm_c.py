"""The pytest plugin of layernorm_c.testing (documented as
``layernorm_c.testing.plugin``): the ``layer_norm_check`` and
``layer_norm_audit`` fixtures and the ``layer_norm_checks`` marker, their
backward counterparts ``layer_norm_backward_check``,
``layer_norm_backward_audit`` and ``layer_norm_backward_checks``, and the
same four for RMSNorm (``rms_norm_check``, ``rms_norm_audit``,
``rms_norm_checks``; ``rms_norm_backward_check``,
``rms_norm_backward_audit``, ``rms_norm_backward_checks``).

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
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import pytest

if TYPE_CHECKING:
    from layernorm_c.testing import AuditReport, CheckResult

FIXTURE = "layer_norm_check"
MARKER = "layer_norm_checks"
BACKWARD_FIXTURE = "layer_norm_backward_check"
BACKWARD_MARKER = "layer_norm_backward_checks"
RMS_FIXTURE = "rms_norm_check"
RMS_MARKER = "rms_norm_checks"
RMS_BACKWARD_FIXTURE = "rms_norm_backward_check"
RMS_BACKWARD_MARKER = "rms_norm_backward_checks"

#: Each battery: its per-check fixture, its marker, the names in
#: layernorm_c.testing of its checks, audit class and check function, and
#: how the marker's help names it.
BATTERIES: Dict[str, Tuple[str, str, str, str, str]] = {
    FIXTURE: (MARKER, "CHECKS", "LayerNormAudit", "check_layer_norm", "LayerNorm"),
    BACKWARD_FIXTURE: (BACKWARD_MARKER, "BACKWARD_CHECKS", "LayerNormBackwardAudit",
                       "check_layer_norm_backward", "LayerNorm backward"),
    RMS_FIXTURE: (RMS_MARKER, "RMS_CHECKS", "RMSNormAudit", "check_rms_norm", "RMSNorm"),
    RMS_BACKWARD_FIXTURE: (RMS_BACKWARD_MARKER, "RMS_BACKWARD_CHECKS", "RMSNormBackwardAudit",
                           "check_rms_norm_backward", "RMSNorm backward"),
}


def pytest_configure(config: pytest.Config) -> None:
    for fixture, (marker, checks, _, _, what) in BATTERIES.items():
        config.addinivalue_line(
            "markers",
            f"{marker}(*names, exclude=()): the {what} checks the {fixture} fixture runs "
            f"(default: all of layernorm_c.testing.{checks})",
        )


def _testing() -> Any:
    import layernorm_c.testing

    return layernorm_c.testing


def _all_checks(fixture: str) -> List[str]:
    return list(getattr(_testing(), BATTERIES[fixture][1]))


def _selected_checks(marker: Optional[pytest.Mark], fixture: str = FIXTURE) -> List[str]:
    known = _all_checks(fixture)
    if marker is None:
        return known
    chosen = list(marker.args) or known
    exclude = tuple(marker.kwargs.get("exclude", ()))
    unknown = [n for n in chosen + list(exclude) if n not in known]
    if unknown:
        # A CollectError shows as its message, without a traceback.
        raise pytest.Collector.CollectError(
            f"@pytest.mark.{BATTERIES[fixture][0]}: unknown checks "
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
    """One item per check for every test that requests one of the per-check
    fixtures (``layer_norm_check``, ``rms_norm_check`` and their backward
    counterparts)."""
    for fixture, (marker, *_) in BATTERIES.items():
        if fixture in metafunc.fixturenames and not _parametrized_by_user(metafunc, fixture):
            names = _selected_checks(metafunc.definition.get_closest_marker(marker), fixture)
            metafunc.parametrize(fixture, names, ids=names, indirect=True)


def _audit_fixture(fixture: str) -> Callable[..., AuditReport]:
    run = getattr(_testing(), BATTERIES[fixture][3])

    def audit(fn: Any, **options: Any) -> AuditReport:
        __tracebackhide__ = True
        try:
            report: AuditReport = run(fn, **options)
            return report
        except AssertionError as exc:
            pytest.fail(str(exc), pytrace=False)

    return audit


@pytest.fixture
def layer_norm_audit() -> Callable[..., AuditReport]:
    """``audit(fn, **options)``: run every check on ``fn``; fail the test
    with the diagnosis if any check fails, else return the report."""
    return _audit_fixture(FIXTURE)


@pytest.fixture
def layer_norm_backward_audit() -> Callable[..., AuditReport]:
    """``audit(fn, **options)``: run every backward check on the backward
    ``fn``; fail the test with the diagnosis if any check fails, else return
    the report."""
    return _audit_fixture(BACKWARD_FIXTURE)


@pytest.fixture
def rms_norm_audit() -> Callable[..., AuditReport]:
    """``audit(fn, **options)``: run every RMSNorm check on ``fn`` (options
    of ``RMSNormAudit``, ``convention=`` among them); fail the test with the
    diagnosis if any check fails, else return the report."""
    return _audit_fixture(RMS_FIXTURE)


@pytest.fixture
def rms_norm_backward_audit() -> Callable[..., AuditReport]:
    """``audit(fn, **options)``: run every RMSNorm backward check on the
    backward ``fn``; fail the test with the diagnosis if any fails, else
    return the report."""
    return _audit_fixture(RMS_BACKWARD_FIXTURE)


def _one_check(request: pytest.FixtureRequest, fixture: str) -> Callable[..., CheckResult]:
    testing = _testing()
    name = getattr(request, "param", None)
    if name is None:
        raise pytest.UsageError(f"the {fixture} fixture is parametrized over the checks by the "
                                "layernorm_c plugin; parametrize it indirectly with check names")
    kind = getattr(testing, BATTERIES[fixture][2])

    def check(fn: Any, **options: Any) -> CheckResult:
        __tracebackhide__ = True
        audit = kind(fn, **options)
        result: CheckResult = audit.run([name]).results[0]
        message = f"{result.diagnosis}\n[{audit.title}; {result.name}: {result.figure}]"
        if result.status == "fail":
            pytest.fail(message, pytrace=False)
        if result.status == "skip":
            pytest.skip(message)
        if result.status == "warn":
            warnings.warn(message, testing.LayerNormAuditWarning, stacklevel=2)
        return result

    check.name = name  # type: ignore[attr-defined]
    return check


@pytest.fixture
def layer_norm_check(request: pytest.FixtureRequest) -> Callable[..., CheckResult]:
    """``check(fn, **options)``: run this item's check (the fixture is
    parametrized over the checks) on ``fn``; fail, skip or warn with its
    diagnosis, return the :class:`~layernorm_c.testing.CheckResult`."""
    return _one_check(request, FIXTURE)


@pytest.fixture
def layer_norm_backward_check(request: pytest.FixtureRequest) -> Callable[..., CheckResult]:
    """``check(fn, **options)``: run this item's backward check (the fixture
    is parametrized over the backward checks) on the backward ``fn``; fail,
    skip or warn with its diagnosis, return the
    :class:`~layernorm_c.testing.CheckResult`."""
    return _one_check(request, BACKWARD_FIXTURE)


@pytest.fixture
def rms_norm_check(request: pytest.FixtureRequest) -> Callable[..., CheckResult]:
    """``check(fn, **options)``: run this item's RMSNorm check (one item per
    :data:`~layernorm_c.testing.RMS_CHECKS`) on ``fn``; fail, skip or warn
    with its diagnosis, return the result."""
    return _one_check(request, RMS_FIXTURE)


@pytest.fixture
def rms_norm_backward_check(request: pytest.FixtureRequest) -> Callable[..., CheckResult]:
    """``check(fn, **options)``: run this item's RMSNorm backward check (one
    item per :data:`~layernorm_c.testing.RMS_BACKWARD_CHECKS`) on the
    backward ``fn``; fail, skip or warn with its diagnosis."""
    return _one_check(request, RMS_BACKWARD_FIXTURE)
