"""The results of an audit: one :class:`CheckResult` per check, gathered in
an :class:`AuditReport` that prints as an aligned table and displays as an
HTML table in a notebook."""
from __future__ import annotations

import html
import textwrap
from dataclasses import dataclass, field, replace
from typing import (TYPE_CHECKING, Any, Dict, Final, Iterator, List, Literal, Optional, Sequence,
                    Tuple)

if TYPE_CHECKING:
    from matplotlib.axes import Axes  # type: ignore[import-not-found, unused-ignore]
    from matplotlib.figure import Figure  # type: ignore[import-not-found, unused-ignore]

    from ._audit import Audit

__all__ = ["CheckResult", "AuditReport", "Status", "PASS", "FAIL", "WARN", "SKIP", "link_causes",
           "claims", "contradictions"]

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
        The measured numbers behind ``figure``, for programmatic use. Two
        keys say what the diagnosis concludes: ``"claims"``, what the check
        found of the implementation (e.g. ``{"denominator": "d"}``), which
        no other check of the report contradicts, and ``"symptom"``, true
        for a failure that reports wrong numbers without naming a cause.
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

    def _repr_html_(self) -> str:
        """The check as a notebook shows it: name, status badge, figure,
        then the diagnosis."""
        return render_result_html(self)


class AuditReport:
    """Every check's result for one implementation.

    Iterating yields the :class:`CheckResult` objects in run order;
    ``report[name]`` looks one up by check name; ``str(report)`` renders a
    table, and a notebook displays the report as an HTML table.

    Attributes
    ----------
    title : str
        What was audited and how (implementation, dtype, eps, d).
    results : list of CheckResult
    audit : LayerNormAudit, RMSNormAudit, LayerNormBackwardAudit, RMSNormBackwardAudit or None
        The audit that made the report (the implementation and the options),
        which :meth:`plot` measures again; None for a report built by hand,
        and for an unpickled one (a report pickles without it, as an
        implementation seldom pickles).
    """

    def __init__(self, title: str, results: Sequence[CheckResult],
                 audit: Optional[Audit] = None) -> None:
        self.title = title
        self.results: List[CheckResult] = list(results)
        self.audit = audit

    def __getstate__(self) -> Dict[str, Any]:
        return {"title": self.title, "results": self.results, "audit": None}

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

    def _repr_html_(self) -> str:
        """The table as a notebook shows it: title, one row per check with a
        status badge, the summary line."""
        return render_html(self.title, self.results, self.summary())

    def plot(self, axes: Optional[Sequence[Axes]] = None) -> Figure:
        """Plot the implementation's measured error against a common offset
        and against d, beside ``layernorm_c.layer_norm`` and the float64
        reference.

        The implementation is called again (gain 1, bias 0, the audit's
        dtype and eps) on records with a common offset of 1 to 1e4 (d = 64,
        or the fixed d), and on records N(10, 1) with d = 4 to 4096. Each
        line is the max error over 16 records in units of the audit's
        tolerance (1 is the limit), against the *exact* LayerNorm of the same
        inputs (40 significant digits, rounded to float64): the
        ``reference_layer_norm`` line is what the checks' float64 yardstick
        itself is off by. Errors below float64 resolution are drawn at it; a
        non-finite output is a cross at the top of the panel; where the
        implementation raised, its line has a gap. Needs matplotlib 3.7 or
        later.

        Parameters
        ----------
        axes : pair of matplotlib Axes, optional
            Where to draw the offset and the d panels. Default: a new
            figure, not registered with pyplot (a notebook shows the
            returned figure once; elsewhere call ``figure.savefig``).

        Returns
        -------
        matplotlib.figure.Figure

        Raises
        ------
        ImportError
            matplotlib is not installed.
        ValueError
            The report was not made by :meth:`LayerNormAudit.run` (or was
            unpickled), so there is no implementation to measure; it is a
            backward audit's; or ``axes`` is not a pair.
        """
        if self.audit is None:
            raise ValueError("plot: this report has no implementation to measure; plot a "
                             "report from LayerNormAudit(...).run() or check_layer_norm()")
        from ._audit import LayerNormAudit
        from ._plot import plot_report

        if not isinstance(self.audit, LayerNormAudit):
            which = ("an RMSNorm audit's" if getattr(self.audit, "op", None) is not None
                     and self.audit.op.key == "rms_norm" else "a backward audit's")
            raise ValueError("plot: only a LayerNorm forward audit's report can be plotted (the "
                             "plot measures the forward's error against an offset and d, beside "
                             f"layernorm_c.layer_norm); this is {which}")

        return plot_report(self.audit, self.title, axes)


def link_causes(results: Sequence[CheckResult], complete: bool = True) -> List[CheckResult]:
    """The results, each symptom (a failure that reports wrong numbers
    without naming a cause: ``values["symptom"]``) ending with which checks
    do name a cause, by name; or, when none does, saying so (``complete``:
    the whole battery ran; else other checks may)."""
    causes = [r.name for r in results
              if r.status == FAIL and not r.values.get("symptom") and r.values.get("named", True)]
    out: List[CheckResult] = []
    for r in results:
        if r.status != FAIL or not r.values.get("symptom"):
            out.append(r)
            continue
        if causes:
            which = causes[0] if len(causes) == 1 else ", ".join(causes[:-1]) + " and " + causes[-1]
            plural = "check names" if len(causes) == 1 else "checks name"
            words = f"The {which} {plural} the likely cause"
        elif complete:
            words = "No check of the battery names a cause"
        else:
            words = "The other checks of the battery may name the cause"
        out.append(replace(r, diagnosis=f"{r.diagnosis.rstrip('.')}. {words}"))
    return out


def claims(results: Sequence[CheckResult]) -> Dict[str, Dict[Any, List[str]]]:
    """What the checks conclude of the implementation, by property: for
    each property (``"denominator"``, ``"eps"``...), each value some check
    claims and the checks claiming it."""
    found: Dict[str, Dict[Any, List[str]]] = {}
    for r in results:
        for prop, value in r.values.get("claims", {}).items():
            found.setdefault(prop, {}).setdefault(value, []).append(r.name)
    return found


def contradictions(results: Sequence[CheckResult]) -> Dict[str, Dict[Any, List[str]]]:
    """The properties two checks of ``results`` disagree on (none, for a
    consistent report)."""
    return {prop: values for prop, values in claims(results).items() if len(values) > 1}


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


# -- HTML (notebooks) -----------------------------------------------------------
# Self-contained: inline styles only, no CSS classes to rely on, no scripts.
# Text inherits the notebook's colour (light or dark theme); a status is a
# badge with its name written in white on a solid colour, readable on either
# background and not told by colour alone. Every piece of text is escaped.

#: Badge background per status (white text on each is above 4.5:1 contrast).
STATUS_COLOURS: Final[Dict[Status, str]] = {
    PASS: "#1a7f37",
    FAIL: "#cf222e",
    WARN: "#9a6700",
    SKIP: "#6e7781",
}
#: A faint tint of the row for the statuses that need attention; translucent,
#: so it works over a light or a dark background.
_ROW_TINTS: Final[Dict[Status, str]] = {
    FAIL: "rgba(207, 34, 46, 0.10)",
    WARN: "rgba(154, 103, 0, 0.10)",
}
_RULE = "1px solid rgba(127, 127, 127, 0.35)"
# Notebook front ends style tables (right-aligned cells, borders, a fixed
# text colour); every cell says what it needs itself.
_CELL = "text-align: left; vertical-align: top; padding: 0.3em 0.6em; border: none;"
_BODY_CELL = f"{_CELL} border-top: {_RULE};"


def _escape(text: object) -> str:
    return html.escape(str(text), quote=True)


def status_label(status: Status) -> str:
    """How a status is written: failures in capitals, as in the text table."""
    return status.upper() if status == FAIL else status


def status_badge(status: Status) -> str:
    """A status as an HTML badge: its name in white on its colour."""
    return (f'<span data-status="{_escape(status)}" style="display: inline-block; '
            f"background: {STATUS_COLOURS[status]}; color: #ffffff; font-weight: 600; "
            "font-size: 0.85em; line-height: 1.4; padding: 0 0.5em; border-radius: 0.6em; "
            f'white-space: nowrap;">{_escape(status_label(status))}</span>')


def _row_html(r: CheckResult) -> str:
    tint = _ROW_TINTS.get(r.status)
    row_style = f' style="background: {tint};"' if tint else ""
    return (f'<tr data-status="{_escape(r.status)}"{row_style}>'
            f'<td style="{_BODY_CELL} white-space: nowrap;"><code>{_escape(r.name)}</code></td>'
            f'<td style="{_BODY_CELL} white-space: nowrap;">{status_badge(r.status)}</td>'
            f'<td style="{_BODY_CELL} white-space: normal; min-width: 8em;">'
            f"{_escape(r.figure)}</td>"
            f'<td style="{_BODY_CELL} white-space: normal; overflow-wrap: anywhere; '
            f'min-width: 16em;">{_escape(r.diagnosis)}</td></tr>')


def render_html(title: str, results: Sequence[CheckResult], footer: str) -> str:
    """The report as an HTML table: title, a header row, a row per check
    (check, status badge, figure, diagnosis; the diagnosis wraps), footer."""
    head = "".join(f'<th style="{_CELL} font-weight: 600;">{h}</th>'
                   for h in ("check", "status", "figure", "diagnosis"))
    rows = "".join(_row_html(r) for r in results)
    return ('<div class="layernorm-c-audit" style="color: inherit; max-width: 100%; '
            'overflow-x: auto;">'
            f'<div style="font-weight: 600; margin: 0 0 0.4em 0;">{_escape(title)}</div>'
            '<table style="width: 100%; table-layout: auto; border-collapse: collapse; '
            'margin: 0; color: inherit; font-size: inherit;">'
            f"<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
            f'<div style="margin: 0.4em 0 0 0; border-top: {_RULE}; padding-top: 0.3em;">'
            f"{_escape(footer)}</div></div>")


def render_result_html(r: CheckResult) -> str:
    """One check in HTML: name, status badge and figure on a line, then the
    diagnosis, wrapped."""
    tint = _ROW_TINTS.get(r.status)
    background = f" background: {tint};" if tint else ""
    return (f'<div class="layernorm-c-check" data-status="{_escape(r.status)}" '
            f'style="color: inherit; max-width: 100%; padding: 0.4em 0.6em; '
            f'border-left: 4px solid {STATUS_COLOURS[r.status]};{background}">'
            f'<div><code>{_escape(r.name)}</code> {status_badge(r.status)} '
            f'<span style="margin-left: 0.4em;">{_escape(r.figure)}</span></div>'
            f'<div style="margin-top: 0.3em; white-space: normal; overflow-wrap: anywhere;">'
            f"{_escape(r.diagnosis)}</div></div>")
