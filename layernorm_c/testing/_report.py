"""The results of an audit: one :class:`CheckResult` per check, gathered in
an :class:`AuditReport` that prints as an aligned table."""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any, Dict, Final, Iterator, List, Literal, Sequence, Tuple

__all__ = ["CheckResult", "AuditReport", "Status", "PASS", "FAIL", "WARN", "SKIP"]

#: A check's outcome.
Status = Literal["pass", "fail", "warn", "skip"]
PASS: Final = "pass"
FAIL: Final = "fail"
WARN: Final = "warn"
SKIP: Final = "skip"
STATUSES: Final[Tuple[Status, ...]] = (PASS, FAIL, WARN, SKIP)


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check.

    Attributes
    ----------
    name : str
        The check's name, one of :data:`layernorm_c.testing.CHECKS`.
    status : {'pass', 'fail', 'warn', 'skip'}
        ``'warn'`` marks a property many valid kernels lack (bit-for-bit
        batch invariance); ``'skip'`` a check that does not apply.
    figure : str
        What was measured, in a few words (max error, ulps, ratio...).
    diagnosis : str
        What the measurement means: on failure, the defect it points to and
        what to change.
    values : dict
        The measured numbers behind ``figure``, for programmatic use.
    """

    name: str
    status: Status
    figure: str
    diagnosis: str
    values: Dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status: expected one of {STATUSES}, got {self.status!r}")

    def __str__(self) -> str:
        return f"{self.name}: {self.status} ({self.figure}): {self.diagnosis}"


class AuditReport:
    """Every check's result for one implementation.

    Iterating yields the :class:`CheckResult` objects in run order;
    ``report[name]`` looks one up by check name; ``str(report)`` renders a
    table.

    Attributes
    ----------
    title : str
        What was audited and how (implementation, dtype, eps, d).
    results : list of CheckResult
    """

    def __init__(self, title: str, results: Sequence[CheckResult]):
        self.title = title
        self.results: List[CheckResult] = list(results)

    def _with(self, status: Status) -> List[CheckResult]:
        return [r for r in self.results if r.status == status]

    @property
    def ok(self) -> bool:
        """True when no check failed (warnings and skips allowed)."""
        return not self.failures

    @property
    def failures(self) -> List[CheckResult]:
        """The failed checks."""
        return self._with(FAIL)

    @property
    def warnings(self) -> List[CheckResult]:
        """The checks that passed with a warning."""
        return self._with(WARN)

    @property
    def skipped(self) -> List[CheckResult]:
        """The checks that did not apply."""
        return self._with(SKIP)

    def __iter__(self) -> Iterator[CheckResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, name: str) -> CheckResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no check named {name!r} in this report; "
                       f"it has {[r.name for r in self.results]}")

    def summary(self) -> str:
        """One line: how many checks passed, failed, warned, were skipped."""
        counts = {s: len(self._with(s)) for s in STATUSES}
        noun = "check" if len(self.results) == 1 else "checks"
        return (f"{len(self.results)} {noun}: {counts[PASS]} passed, "
                f"{counts[FAIL]} failed, {counts[WARN]} warned, {counts[SKIP]} skipped")

    def __str__(self) -> str:
        return render_table(self.title, self.results, self.summary())

    def __repr__(self) -> str:
        return f"<AuditReport {self.title!r}: {self.summary()}>"


def render_table(title: str, results: Sequence[CheckResult], footer: str,
                 width: int = 120) -> str:
    """Aligned columns check / status / figure / diagnosis; the diagnosis
    wraps into its own column."""
    header = ("check", "status", "figure", "diagnosis")
    w_name = max([len(header[0])] + [len(r.name) for r in results])
    w_status = max(len(header[1]), 6)
    w_fig = max([len(header[2])] + [len(r.figure) for r in results])
    indent = w_name + w_status + w_fig + 6
    w_diag = max(50, width - indent)

    def row(cells: Sequence[str]) -> str:
        return (f"{cells[0]:<{w_name}}  {cells[1]:<{w_status}}  "
                f"{cells[2]:<{w_fig}}  {cells[3]}").rstrip()

    lines = [title, row(header), row(["-" * w_name, "-" * w_status, "-" * w_fig, "-" * 9])]
    for r in results:
        wrapped = textwrap.wrap(r.diagnosis, w_diag) or [""]
        lines.append(row([r.name, r.status.upper() if r.status == FAIL else r.status,
                          r.figure, wrapped[0]]))
        lines.extend(" " * indent + more for more in wrapped[1:])
    lines.append(footer)
    return "\n".join(lines)
