"""Side by side: several implementations audited by the same battery, in one
table (checks as rows, implementations as columns)."""
from __future__ import annotations

import textwrap
import time
from typing import (TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Mapping, Optional,
                    Sequence, Tuple, Union)

import numpy.typing as npt

from ._report import FAIL, STATUSES, AuditReport, CheckResult, _escape
from ._report import STATUS_COLOURS, status_badge, status_label

if TYPE_CHECKING:
    from matplotlib.axes import Axes  # type: ignore[import-not-found, unused-ignore]
    from matplotlib.figure import Figure  # type: ignore[import-not-found, unused-ignore]

__all__ = ["compare", "ComparisonReport"]

#: The text table's width.
WIDTH = 100
#: A column's width in the text table (its figure wraps within it).
CELL = 20


class ComparisonReport:
    """Several audits side by side: checks as rows, implementations as
    columns.

    ``report[name]`` is one implementation's :class:`AuditReport`;
    iterating yields the names; ``str(report)`` is a table at most 100
    characters wide (the columns continue below when they do not fit), and
    a notebook shows it as an HTML table.

    Attributes
    ----------
    reports : dict of str to AuditReport
        Each implementation's report, by column name, in column order.
    seconds : dict of str to float
        How long each audit took (None for a report given ready-made).
    """

    def __init__(self, reports: Mapping[str, AuditReport],
                 seconds: Optional[Mapping[str, Optional[float]]] = None) -> None:
        if not reports:
            raise ValueError("reports: expected at least one report, got none")
        self.reports: Dict[str, AuditReport] = dict(reports)
        self.seconds: Dict[str, Optional[float]] = {n: (seconds or {}).get(n)
                                                    for n in self.reports}

    # -- access ---------------------------------------------------------------
    def __iter__(self) -> Iterator[str]:
        return iter(self.reports)

    def __len__(self) -> int:
        return len(self.reports)

    def __getitem__(self, name: str) -> AuditReport:
        try:
            return self.reports[name]
        except KeyError:
            raise KeyError(f"no implementation named {name!r}; the columns are "
                           f"{list(self.reports)}") from None

    @property
    def checks(self) -> List[str]:
        """The rows: every check any column ran, in the order they ran."""
        seen: Dict[str, None] = {}
        for report in self.reports.values():
            for r in report:
                seen.setdefault(r.name, None)
        return list(seen)

    @property
    def ok(self) -> bool:
        """True when no check of any implementation failed."""
        return all(r.ok for r in self.reports.values())

    @property
    def failures(self) -> Dict[str, List[CheckResult]]:
        """The failed checks of each implementation that has some."""
        return {n: r.failures for n, r in self.reports.items() if r.failures}

    def cell(self, name: str, check: str) -> Optional[CheckResult]:
        """One implementation's result of one check (None: not in its
        battery, or not run)."""
        for r in self.reports[name]:
            if r.name == check:
                return r
        return None

    def summary(self) -> str:
        """One line: how many implementations passed every check."""
        failed = [n for n, r in self.reports.items() if not r.ok]
        noun = "implementation" if len(self.reports) == 1 else "implementations"
        if not failed:
            return f"{len(self.reports)} {noun}: no check failed"
        return (f"{len(self.reports)} {noun}: {len(failed)} with failed checks "
                f"({', '.join(failed)})")

    def __repr__(self) -> str:
        return f"<ComparisonReport of {list(self.reports)}: {self.summary()}>"

    # -- text -----------------------------------------------------------------
    def __str__(self) -> str:
        return self.render(WIDTH)

    def render(self, width: int = WIDTH) -> str:
        """The table as text, at most ``width`` characters wide (at least
        40): the check names, then as many columns as fit; further columns
        continue in another block below. The audit titles (what each column
        is, with the settings read from it) and every failure's diagnosis
        follow the table."""
        width = max(int(width), 40)
        checks = self.checks
        w_name = max([len("check")] + [len(c) for c in checks])
        cell = max(12, min(CELL, width - w_name - 2))
        per_block = max(1, (width - w_name) // (cell + 2))
        names = list(self.reports)
        lines: List[str] = []
        for start in range(0, len(names), per_block):
            block = names[start:start + per_block]
            if start:
                lines.append("")
            lines.extend(self._block(block, checks, w_name, cell))
        lines.append("")
        lines.extend(textwrap.wrap(self.summary(), width, subsequent_indent="  "))
        lines.append("")
        lines.append("Columns:")
        for n in names:
            seconds = self.seconds.get(n)
            timing = "" if seconds is None else f" [{seconds:.1f} s]"
            lines.extend(textwrap.wrap(f"{n}: {self.reports[n].title}{timing}", width,
                                       initial_indent="- ", subsequent_indent="  "))
        if self.failures:
            lines.append("")
            lines.append("Failures:")
            for n, failed in self.failures.items():
                for r in failed:
                    lines.extend(textwrap.wrap(f"{n} / {r.name} ({r.figure}): {r.diagnosis}",
                                               width, initial_indent="- ",
                                               subsequent_indent="  "))
        warned: Dict[str, List[Tuple[str, CheckResult]]] = {}
        for n, report in self.reports.items():
            for r in report.warnings:
                warned.setdefault(r.name, []).append((n, r))
        if warned:
            lines.append("")
            lines.append("Warnings (the diagnosis of the first; the others' figures):")
            for check, results in warned.items():
                first = results[0][1]
                who = "; ".join(f"{n}: {r.figure}" for n, r in results)
                lines.extend(textwrap.wrap(f"{check} ({who}): {first.diagnosis}", width,
                                           initial_indent="- ", subsequent_indent="  "))
        return "\n".join(lines)

    def _block(self, names: Sequence[str], checks: Sequence[str], w_name: int,
               cell: int) -> List[str]:
        def row(first: str, cells: Sequence[str]) -> str:
            return (f"{first:<{w_name}}" + "".join(f"  {c:<{cell}}" for c in cells)).rstrip()

        def stacked(first: Sequence[str], columns: Sequence[Sequence[str]]) -> List[str]:
            height = max([len(first)] + [len(c) for c in columns])
            pad = [list(c) + [""] * (height - len(c)) for c in columns]
            head = list(first) + [""] * (height - len(first))
            return [row(head[i], [c[i] for c in pad]) for i in range(height)]

        out = stacked(["check"], [_wrap(n, cell) for n in names])
        out.append(row("-" * w_name, ["-" * cell for _ in names]))
        for check in checks:
            cells = []
            for n in names:
                r = self.cell(n, check)
                cells.append(_wrap("-" if r is None else f"{status_label(r.status)} {r.figure}",
                                   cell))
            out.extend(stacked([check], cells))
        out.append(row("-" * w_name, ["-" * cell for _ in names]))
        counts = []
        for n in names:
            report = self.reports[n]
            tally = [f"{len(report._with(s))} {status_label(s)}" for s in STATUSES
                     if report._with(s)]
            counts.append(_wrap(", ".join(tally), cell))
        out.extend(stacked(["verdict"], counts))
        return out

    # -- HTML -----------------------------------------------------------------
    def _repr_html_(self) -> str:
        """The table as a notebook shows it: a status badge and the figure in
        each cell (the diagnosis on hover), the columns' titles and the
        failures' diagnoses below."""
        cell_style = ("text-align: left; vertical-align: top; padding: 0.3em 0.6em; "
                      "border: none; border-top: 1px solid rgba(127, 127, 127, 0.35);")
        head = "".join(f'<th style="{cell_style} font-weight: 600;">{_escape(h)}</th>'
                       for h in ["check"] + list(self.reports))
        rows = []
        for check in self.checks:
            cells = [f'<td style="{cell_style} white-space: nowrap;"><code>{_escape(check)}'
                     "</code></td>"]
            for n in self.reports:
                r = self.cell(n, check)
                if r is None:
                    cells.append(f'<td style="{cell_style}">-</td>')
                    continue
                cells.append(f'<td data-status="{_escape(r.status)}" '
                             f'title="{_escape(r.diagnosis)}" style="{cell_style} '
                             f'min-width: 8em;">{status_badge(r.status)}<br>'
                             f'<span style="font-size: 0.9em;">{_escape(r.figure)}</span></td>')
            rows.append("<tr>" + "".join(cells) + "</tr>")
        notes = "".join(f"<li><b>{_escape(n)}</b>: {_escape(r.title)}</li>"
                        for n, r in self.reports.items())
        failures = "".join(
            f'<li><b>{_escape(n)}</b> / <code>{_escape(r.name)}</code> '
            f'<span style="color: {STATUS_COLOURS[FAIL]};">({_escape(r.figure)})</span>: '
            f"{_escape(r.diagnosis)}</li>"
            for n, failed in self.failures.items() for r in failed)
        return ('<div class="layernorm-c-comparison" style="color: inherit; max-width: 100%; '
                'overflow-x: auto;">'
                '<table style="border-collapse: collapse; margin: 0; color: inherit; '
                f'font-size: inherit;"><thead><tr>{head}</tr></thead>'
                f"<tbody>{''.join(rows)}</tbody></table>"
                f'<div style="margin: 0.4em 0;">{_escape(self.summary())}</div>'
                f'<ul style="margin: 0.2em 0;">{notes}</ul>'
                + (f'<div style="font-weight: 600;">Failures</div><ul>{failures}</ul>'
                   if failures else "")
                + "</div>")

    # -- plot -----------------------------------------------------------------
    def plot(self, axes: Optional[Sequence[Axes]] = None) -> Figure:
        """Every LayerNorm forward's error against a common offset and
        against d, in one figure (the panels of :meth:`AuditReport.plot`,
        one line per implementation, with ``layernorm_c.layer_norm`` and
        the float64 reference of the first).

        Each error is in units of that implementation's tolerance (its
        audit dtype's), so 1 is every line's limit. Columns that cannot be
        plotted (RMSNorm and backward audits, reports without their
        implementation) are left out and named in the figure's title.

        Parameters
        ----------
        axes : pair of matplotlib Axes, optional
            Where to draw the two panels; default a new figure.

        Returns
        -------
        matplotlib.figure.Figure

        Raises
        ------
        ImportError
            matplotlib is not installed.
        ValueError
            No column can be plotted, or ``axes`` is not a pair.
        """
        from ._plot import plot_many

        return plot_many({n: r.audit for n, r in self.reports.items()}, axes)


def _wrap(text: str, width: int) -> List[str]:
    """``text`` in lines of at most ``width`` characters (long words cut)."""
    return textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]


def _is_report(obj: Any) -> bool:
    return isinstance(obj, AuditReport)


def _columns(implementations: Union[Mapping[str, Any], Iterable[Any]]) -> List[Tuple[str, Any]]:
    """``(column name, target)`` pairs: an ONNX model with several distinct
    normalization nodes gives a column per node."""
    from ._adapters import Implementation, _name_of
    from ._frameworks import expand, node_label

    if isinstance(implementations, Mapping):
        items = [(str(k), v) for k, v in implementations.items()]
    else:
        items = []
        for obj in implementations:
            if isinstance(obj, Implementation):
                label = obj.name
            elif isinstance(obj, AuditReport):
                label = obj.title
            elif hasattr(obj, "registry") and hasattr(obj, "impl"):  # an audit
                label = str(obj.impl.name)
            else:
                label = _name_of(obj)
            items.append((label, obj))
    if not items:
        raise ValueError("implementations: expected at least one implementation, got none")
    columns: List[Tuple[str, Any]] = []
    for label, obj in items:
        from ._audit import Audit

        plain = _is_report(obj) or isinstance(obj, (Implementation, Audit))
        many = None if plain else expand(obj)
        if many is not None and len(many) > 1:
            for impl in many:
                columns.append((f"{label}: {node_label(impl)}", impl))
        elif many is not None:
            columns.append((label, many[0]))
        else:
            columns.append((label, obj))
    seen: Dict[str, int] = {}
    for label, _ in columns:
        seen[label] = seen.get(label, 0) + 1
    repeated = [label for label, n in seen.items() if n > 1]
    if repeated:
        raise ValueError(f"implementations: repeated names {repeated}; give each a name of "
                         "its own ({'name': fn, ...})")
    return columns


def _op_of(obj: Any, op: Optional[str]) -> str:
    """The battery for ``obj``: ``op`` if given, else the op the object says
    it computes, else LayerNorm."""
    if op is not None:
        return op
    import sys

    import layernorm_c as lnc

    from ._adapters import _is_torch_rms_norm
    from ._frameworks import builtin_op

    if obj is lnc.rms_norm or obj is lnc.reference_rms_norm or isinstance(obj, lnc.RMSNorm):
        return "rms_norm"
    torch = sys.modules.get("torch")
    if torch is not None and (_is_torch_rms_norm(torch, obj)
                              or isinstance(obj, getattr(torch.nn, "RMSNorm", ()))):
        return "rms_norm"
    return getattr(obj, "op", None) or builtin_op(obj) or "layer_norm"


def compare(implementations: Union[Mapping[str, Any], Iterable[Any]], *,
            checks: Optional[Iterable[str]] = None, op: Optional[str] = None,
            backward: bool = False, dtype: Optional[npt.DTypeLike] = None,
            eps: Optional[float] = None, signature: Optional[str] = None,
            framework: str = "auto", d: Optional[int] = None,
            leading_shape: Optional[Sequence[int]] = None, rtol: Optional[float] = None,
            atol: Optional[float] = None, seed: int = 0,
            strict_batch_invariance: bool = False, convention: str = "weight",
            mode: str = "default") -> ComparisonReport:
    """Audit several implementations with the same battery, side by side.

    Parameters
    ----------
    implementations : mapping of str to implementation, or iterable of implementations
        Each value anything the audits take (a function, a torch module, a
        framework's object recognised by :func:`adapt`, an
        :class:`Implementation`), an audit set up with options of its own
        (``RMSNormAudit(fn, convention="1+weight")``, run here), or an
        :class:`AuditReport` already made (shown as it is). The keys name the columns (an iterable: named
        after each implementation). An ONNX model with several distinct
        normalization nodes gives a column per node.
    checks : iterable of str, optional
        Only these checks (names of the batteries run; a check not in some
        column's battery is left out there).
    op : {'layer_norm', 'rms_norm'}, optional
        The battery. Default: for each implementation the op it says it
        computes (an RMSNorm module or layer, an ONNX RMSNormalization
        node, ``layernorm_c.rms_norm``, ``torch.nn.functional.rms_norm``),
        else LayerNorm's.
    backward : bool, optional
        The backward battery: each implementation is a backward, or a
        forward its framework differentiates (see :func:`adapt`).
    dtype : optional
        The audit dtype of every column; default each one's own (see
        :class:`LayerNormAudit`), else float32.
    eps : float, optional
        The eps passed to the implementations that take one; those with an
        eps of their own use it. Default each battery's (1e-5 LayerNorm,
        1e-6 RMSNorm).
    signature, framework, d, leading_shape, rtol, atol, seed, strict_batch_invariance : optional
        As for :class:`LayerNormAudit`, for every column (a signature only
        applies to plain functions).
    convention : {'weight', '1+weight'}, optional
        The RMSNorm weight convention, for RMSNorm columns.
    mode : {'default', 'quick', 'thorough'}, optional
        How much every column's audit measures (see :class:`LayerNormAudit`).

    Returns
    -------
    ComparisonReport

    Raises
    ------
    ValueError
        No implementation, a repeated name, an unknown check, op or option.

    Examples
    --------
    >>> import layernorm_c
    >>> from layernorm_c.testing import compare
    >>> table = compare({"layernorm_c": layernorm_c.layer_norm,
    ...                  "reference": layernorm_c.reference_layer_norm_y})  # doctest: +SKIP
    >>> print(table)                                                       # doctest: +SKIP
    """
    from ._audit import Audit, LayerNormAudit, selected_checks
    from ._backward_audit import LayerNormBackwardAudit, RMSNormBackwardAudit
    from ._ops import OPS
    from ._rms_audit import RMSNormAudit

    if op is not None and op not in OPS:
        raise ValueError(f"op: expected one of {OPS}, got {op!r}")
    wanted = None if checks is None else list(checks)
    if wanted is not None:
        from ._backward_checks import BACKWARD_REGISTRY
        from ._checks import REGISTRY
        from ._rms_backward_checks import RMS_BACKWARD_REGISTRY
        from ._rms_checks import RMS_REGISTRY

        known = (tuple(BACKWARD_REGISTRY) + tuple(RMS_BACKWARD_REGISTRY) if backward
                 else tuple(REGISTRY) + tuple(RMS_REGISTRY))
        selected_checks(wanted, known)  # raises for an unknown name
    reports: Dict[str, AuditReport] = {}
    seconds: Dict[str, Optional[float]] = {}
    for label, obj in _columns(implementations):
        if _is_report(obj):
            reports[label], seconds[label] = obj, None
            continue
        if isinstance(obj, Audit):  # an audit set up with options of its own
            start = time.perf_counter()
            names = None if wanted is None else [n for n in wanted if n in obj.registry]
            reports[label] = obj.run(names)
            seconds[label] = time.perf_counter() - start
            continue
        which = _op_of(obj, op)
        kind: Any
        options: Dict[str, Any] = {"signature": signature, "framework": framework,
                                   "dtype": dtype, "d": d, "leading_shape": leading_shape,
                                   "rtol": rtol, "atol": atol, "seed": seed,
                                   "strict_batch_invariance": strict_batch_invariance,
                                   "mode": mode}
        if which == "rms_norm":
            options["convention"] = convention
            kind = RMSNormBackwardAudit if backward else RMSNormAudit
        else:
            kind = LayerNormBackwardAudit if backward else LayerNormAudit
        start = time.perf_counter()
        audit = kind(obj, **options)
        if eps is not None and (audit.impl.takes_eps or audit.impl.eps is None):
            audit = kind(obj, eps=eps, **options)
        names = None if wanted is None else [n for n in wanted if n in audit.registry]
        reports[label] = audit.run(names)
        seconds[label] = time.perf_counter() - start
    return ComparisonReport(reports, seconds)

