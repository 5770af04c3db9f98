"""``AuditReport.plot()``: the measured error of the implementation under
audit against a common offset and against d, beside layernorm_c and the
float64 reference.

Every error is measured against the *exact* LayerNorm of the very values
passed (computed with 40 significant digits by :mod:`decimal` and rounded
once to float64), so the three lines share one yardstick: the float64
reference's own error shows what float64 rounding costs, not a zero from
comparing the reference with itself. Gain 1 and bias 0 throughout: the plot
is about the normalization.

matplotlib is imported only here, and only when a plot is asked for.
"""
from __future__ import annotations

import decimal
import importlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, cast

import numpy as np
import numpy.typing as npt

from .._reference import reference_layer_norm
from ._numerics import Tolerance
from ._probe import ImplementationError, Probe

if TYPE_CHECKING:
    from matplotlib.axes import Axes  # type: ignore[import-not-found, unused-ignore]
    from matplotlib.figure import Figure  # type: ignore[import-not-found, unused-ignore]

    from ._audit import LayerNormAudit

__all__ = ["Sweep", "measure", "plot_report", "plot_many", "line_labels", "exact_layer_norm", "OFFSETS",
           "SIZES"]

#: The common offsets of the first panel (records N(offset, spread)).
OFFSETS: Tuple[float, ...] = (1e0, 1e1, 1e2, 1e3, 1e4)
#: The feature sizes of the second panel.
SIZES: Tuple[int, ...] = (4, 16, 64, 256, 1024, 4096)
#: d of the offset sweep (the cancellation check's), unless the
#: implementation fixes it.
OFFSET_SWEEP_D = 64
#: The common offset of the d sweep: records N(10, 1), a mild offset.
SIZE_SWEEP_OFFSET = 10.0
#: Records per point.
ROWS = 16
#: Significant digits of the exact computation.
DIGITS = 40


def exact_layer_norm(x: npt.ArrayLike, eps: float) -> npt.NDArray[np.float64]:
    """LayerNorm over the last axis (gain 1, bias 0) of exactly the values
    in ``x``, computed with :data:`DIGITS` significant digits and rounded
    once to float64.

    Every float converts to a Decimal exactly; the mean, the centred
    values, the population variance and the reciprocal square root are
    each rounded to 40 digits. Even after a common offset of 1e4 cancels
    four of them, the value is good to some 35 digits before its one
    rounding to float64 (about 16): the true LayerNorm, rounded.
    """
    rows = np.asarray(x, np.float64)
    flat = rows.reshape(-1, rows.shape[-1])
    out = np.empty(flat.shape, np.float64)
    with decimal.localcontext() as ctx:
        ctx.prec = DIGITS
        e = decimal.Decimal(eps)
        for i, row in enumerate(flat.tolist()):
            values = [decimal.Decimal(v) for v in row]
            d = len(values)
            mean = sum(values, decimal.Decimal(0)) / d
            centred = [v - mean for v in values]
            var = sum((c * c for c in centred), decimal.Decimal(0)) / d
            inv = 1 / (var + e).sqrt()
            out[i] = [float(c * inv) for c in centred]
    return out.reshape(rows.shape)


@dataclass(frozen=True)
class Sweep:
    """Measured errors along one axis (offsets or sizes).

    Attributes
    ----------
    x : tuple of float
        The offsets or the feature sizes.
    errors : dict of str to tuple of float
        For each line's label, the max error in tolerance units at each x
        (``inf`` where the output was not finite, ``nan`` where the
        implementation raised).
    """

    x: Tuple[float, ...]
    errors: Dict[str, Tuple[float, ...]]


#: One line of the plot: its label, and what it computes for records in the
#: audit dtype (returned in float64).
_Line = Tuple[str, Callable[[npt.NDArray[Any]], npt.NDArray[np.float64]]]


def line_labels(audit: LayerNormAudit) -> Tuple[str, str, str]:
    """The legend labels of the three lines: the implementation under audit,
    layernorm_c, the float64 reference."""
    dtype = audit.dtype.name
    return (f"{audit.impl.name} ({dtype}, under audit)",
            f"layernorm_c.layer_norm ({dtype})",
            "reference_layer_norm (float64, the checks' yardstick)")


def _lines(audit: LayerNormAudit, probe: Probe) -> List[_Line]:
    import layernorm_c

    eps = probe.eps

    def impl(x: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
        return probe.rows(x, *probe.identity_params(x.shape[-1]))

    def ours(x: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
        return np.asarray(layernorm_c.layer_norm(x, eps=eps), np.float64)

    def reference(x: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
        return reference_layer_norm(x, eps=eps).y

    return list(zip(line_labels(audit), (impl, ours, reference)))


#: Exact outputs already computed, by (input bytes, dtype, shape, eps): the
#: audits of a comparison share their inputs.
ExactCache = Dict[Tuple[bytes, str, Tuple[int, ...], float], npt.NDArray[np.float64]]


def _exact(x: npt.NDArray[Any], eps: float, cache: Optional[ExactCache]) -> npt.NDArray[np.float64]:
    if cache is None:
        return exact_layer_norm(x, eps)
    key = (x.tobytes(), x.dtype.name, tuple(x.shape), float(eps))
    if key not in cache:
        cache[key] = exact_layer_norm(x, eps)
    return cache[key]


def _sweep(audit: LayerNormAudit, points: Sequence[Tuple[float, npt.NDArray[Any]]],
           cache: Optional[ExactCache] = None) -> Sweep:
    probe = audit._probe()
    lines = _lines(audit, probe)
    errors: Dict[str, List[float]] = {label: [] for label, _ in lines}
    for _, x in points:
        exact = _exact(x, probe.eps, cache)
        for label, normalize in lines:
            try:
                got = normalize(x)
            except ImplementationError:
                errors[label].append(math.nan)
                continue
            errors[label].append(probe.tol.worst(got, exact))
    return Sweep(tuple(float(p) for p, _ in points),
                 {label: tuple(e) for label, e in errors.items()})


def measure(audit: LayerNormAudit, cache: Optional[ExactCache] = None) -> Tuple[Sweep, Sweep]:
    """Measure the errors behind :meth:`AuditReport.plot`: against the
    common offset (at d = 64, or the implementation's d), then against d
    (at offset 10). ``cache`` keeps the exact outputs for other audits of
    the same inputs."""
    probe = audit._probe()
    rng = probe.rng("plot")
    d = probe.d(OFFSET_SWEEP_D)
    by_offset = []
    for offset in OFFSETS:
        # As in the cancellation check: the spread stays several ulps of
        # the offset wide (1 except for float16), so the records keep a
        # variance in any dtype.
        spread = max(1.0, 4 * float(np.spacing(probe.dtype.type(offset))))
        by_offset.append((offset, probe.cast(offset + spread * _standard_rows(rng, d))))
    sizes = SIZES if audit.impl.d is None else (audit.impl.d,)
    by_size = [(float(n), probe.cast(SIZE_SWEEP_OFFSET + _standard_rows(rng, n))) for n in sizes]
    return _sweep(audit, by_offset, cache), _sweep(audit, by_size, cache)


def _standard_rows(rng: np.random.Generator, d: int) -> npt.NDArray[np.float64]:
    """:data:`ROWS` records of mean 0 and population variance 1."""
    z = rng.standard_normal((ROWS, d))
    z -= z.mean(axis=-1, keepdims=True)
    z /= np.sqrt((z * z).mean(axis=-1, keepdims=True))
    return z


def _pyplot() -> Any:
    # Imported by name, like torch and jax: an optional package, outside
    # type checking where it is not installed.
    try:
        plt = importlib.import_module("matplotlib.pyplot")
    except ImportError as exc:
        raise ImportError("AuditReport.plot() needs matplotlib, which is not installed: "
                          "pip install matplotlib") from exc
    return plt


#: Line styles: the implementation stands out, layernorm_c and the
#: reference are the comparison.
_STYLES: Tuple[Dict[str, Any], ...] = (
    {"color": "#cf222e", "marker": "o", "linewidth": 2.0, "zorder": 3},
    {"color": "#0969da", "marker": "s", "linewidth": 1.5, "zorder": 2},
    {"color": "#6e7781", "marker": "^", "linewidth": 1.2, "linestyle": ":", "zorder": 1},
)


def plot_report(audit: LayerNormAudit, title: str,
                axes: Optional[Sequence[Axes]] = None) -> Figure:
    """Measure and draw the two panels (see :meth:`AuditReport.plot`)."""
    plt = _pyplot()
    if axes is not None and len(axes) != 2:
        raise ValueError(f"axes: expected two matplotlib Axes (offset, d), got {len(axes)}")
    by_offset, by_size = measure(audit)
    if axes is None:
        figure = plt.figure(figsize=(11.0, 4.8), layout="constrained")
        # Not kept open by pyplot: a notebook then shows the returned figure
        # once (as the cell's result), not a second time when the cell ends.
        plt.close(figure)
        ax_offset, ax_size = figure.subplots(1, 2)
    else:
        ax_offset, ax_size = axes
        figure = ax_offset.figure
    tol = audit.tolerance
    # The exact value is rounded to float64: an error below about one
    # float64 ulp of the output cannot be resolved, and is drawn there (a
    # log scale has no zero).
    floor = float(np.finfo(np.float64).eps) / max(tol.atol + tol.rtol, 1e-300)
    d = audit.impl.d if audit.impl.d is not None else OFFSET_SWEEP_D
    _panel(ax_offset, by_offset, tol, floor, xlabel="common offset of the records",
           title=f"error against a common offset (d={d})")
    _panel(ax_size, by_size, tol, floor, xlabel="d (features per record)",
           title=f"error against d (records N({SIZE_SWEEP_OFFSET:g}, 1))")
    ax_size.set_xscale("log", base=2)
    ax_size.set_xticks(by_size.x, [f"{n:g}" for n in by_size.x])
    ax_size.minorticks_off()
    # One legend for both panels (the same lines, and any non-finite marks).
    handles: Dict[str, Any] = {}
    for ax in (ax_offset, ax_size):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if axes is None:
        figure.suptitle(f"{title}\nmax error against the exact LayerNorm of the same inputs "
                        "(gain 1, bias 0)", fontsize="medium")
        figure.legend(list(handles.values()), list(handles), loc="outside lower center",
                      ncols=2, fontsize="small", frameon=False)
    else:
        ax_offset.legend(list(handles.values()), list(handles), fontsize="small")
    return cast("Figure", figure)


def _panel(ax: Axes, sweep: Sweep, tol: Tolerance, floor: float, *, xlabel: str,
           title: str) -> None:
    x = np.asarray(sweep.x)
    for style, (label, errors) in zip(_STYLES, sweep.errors.items()):
        e = np.asarray(errors)
        ax.plot(x, np.where(np.isfinite(e), np.maximum(e, floor), np.nan), label=label, **style)
        bad = np.isinf(e)
        if bad.any():
            # Non-finite outputs: a cross at the top edge of the panel.
            ax.plot(x[bad], np.full(int(bad.sum()), 0.97), linestyle="none", marker="X",
                    markersize=9, color=style["color"], transform=ax.get_xaxis_transform(),
                    clip_on=False, label="non-finite output")
    ax.axhline(1.0, color="#9a6700", linestyle="--", linewidth=1.0, label=f"tolerance ({tol})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("max error, in units of the tolerance")
    ax.set_title(title, fontsize="medium")
    ax.grid(True, which="major", alpha=0.3)


#: Colours of a comparison's lines, one per implementation (cycled).
_MANY_COLOURS: Tuple[str, ...] = ("#cf222e", "#0969da", "#1a7f37", "#8250df", "#bf8700",
                                  "#e16f24", "#1b7c83", "#bf3989", "#57606a", "#953800")
_MANY_MARKERS: Tuple[str, ...] = ("o", "s", "D", "v", "^", "P", "X", "<", ">", "h")


def plot_many(audits: Dict[str, Any], axes: Optional[Sequence[Axes]] = None) -> Figure:
    """The two panels of :func:`plot_report` with one line per LayerNorm
    forward audit in ``audits`` (by name; others are left out and named in
    the title), plus layernorm_c and the float64 reference as measured for
    the first."""
    from ._audit import LayerNormAudit

    plt = _pyplot()
    if axes is not None and len(axes) != 2:
        raise ValueError(f"axes: expected two matplotlib Axes (offset, d), got {len(axes)}")
    usable = {n: a for n, a in audits.items() if isinstance(a, LayerNormAudit)}
    left_out = [n for n in audits if n not in usable]
    if not usable:
        raise ValueError("plot: no column is a LayerNorm forward audit with its implementation "
                         f"(left out: {left_out}); only those can be plotted")
    cache: ExactCache = {}
    measured = {n: measure(a, cache) for n, a in usable.items()}
    if axes is None:
        figure = plt.figure(figsize=(12.0, 5.6), layout="constrained")
        plt.close(figure)
        ax_offset, ax_size = figure.subplots(1, 2)
    else:
        ax_offset, ax_size = axes
        figure = ax_offset.figure
    first = next(iter(usable))
    first_labels = line_labels(usable[first])
    floor = min(float(np.finfo(np.float64).eps) / max(a.tolerance.atol + a.tolerance.rtol, 1e-300)
                for a in usable.values())
    for ax, which in ((ax_offset, 0), (ax_size, 1)):
        for i, (name, sweeps) in enumerate(measured.items()):
            sweep = sweeps[which]
            label = f"{name} ({usable[name].dtype.name})"
            errors = sweep.errors[line_labels(usable[name])[0]]
            style = {"color": _MANY_COLOURS[i % len(_MANY_COLOURS)],
                     "marker": _MANY_MARKERS[i % len(_MANY_MARKERS)], "linewidth": 1.6,
                     "zorder": 3}
            _draw(ax, sweep.x, errors, label, style, floor)
        for j, style in ((1, _STYLES[1]), (2, _STYLES[2])):
            sweep = measured[first][which]
            plain = {k: v for k, v in style.items() if k != "color"}
            _draw(ax, sweep.x, sweep.errors[first_labels[j]], first_labels[j],
                  {**plain, "color": "#000000" if j == 1 else "#6e7781", "zorder": 2}, floor)
        ax.axhline(1.0, color="#9a6700", linestyle="--", linewidth=1.0,
                   label="tolerance of each one's dtype")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylabel("max error, in units of its tolerance")
        ax.grid(True, which="major", alpha=0.3)
    ax_offset.set_xlabel("common offset of the records")
    ax_offset.set_title(f"error against a common offset (d={OFFSET_SWEEP_D}, or the fixed d)",
                        fontsize="medium")
    ax_size.set_xlabel("d (features per record)")
    ax_size.set_title(f"error against d (records N({SIZE_SWEEP_OFFSET:g}, 1))", fontsize="medium")
    ax_size.set_xscale("log", base=2)
    ax_size.set_xticks(list(SIZES), [f"{n:g}" for n in SIZES])
    ax_size.minorticks_off()
    handles: Dict[str, Any] = {}
    for ax in (ax_offset, ax_size):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    title = "LayerNorm implementations side by side: max error against the exact LayerNorm"
    if left_out:
        title += f"\n(not plotted: {', '.join(left_out)})"
    if axes is None:
        figure.suptitle(title, fontsize="medium")
        figure.legend(list(handles.values()), list(handles), loc="outside lower center",
                      ncols=3, fontsize="small", frameon=False)
    else:
        ax_offset.legend(list(handles.values()), list(handles), fontsize="small")
    return cast("Figure", figure)


def _draw(ax: Axes, xs: Sequence[float], errors: Sequence[float], label: str,
          style: Dict[str, Any], floor: float) -> None:
    """One line of errors (non-finite outputs: a cross at the top edge)."""
    x = np.asarray(xs)
    e = np.asarray(errors)
    ax.plot(x, np.where(np.isfinite(e), np.maximum(e, floor), np.nan), label=label, **style)
    bad = np.isinf(e)
    if bad.any():
        ax.plot(x[bad], np.full(int(bad.sum()), 0.97), linestyle="none", marker="X",
                markersize=9, color=style["color"], transform=ax.get_xaxis_transform(),
                clip_on=False)
