"""The checks of the battery, one function per defect.

Each check builds its own inputs, calls the implementation through a
:class:`~layernorm_c.testing._probe.Probe`, measures, and returns a
:class:`~layernorm_c.testing._report.CheckResult` whose diagnosis names the
defect the measurement points to. Where several defects are plausible, the
output is fitted against float64 models of each (see ``_numerics.fit``) and
the best fit is named.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from numpy.typing import NDArray

from .._cases import WORKED_EXAMPLES
from ._numerics import EPS_MODES, TOLERANCES, Fit, fit, model_layer_norm, ulp_distance
from ._ops import is_float, unit_roundoff
from ._probe import ImplementationError, Param, Params, Probe, ProbeBase
from ._report import FAIL, PASS, SKIP, WARN, CheckResult

__all__ = ["Check", "CHECKS", "REGISTRY", "run_check"]


@dataclass(frozen=True)
class Check:
    """One check: its name, what it verifies, and the function running it."""

    name: str
    title: str
    run: Callable[[Probe], CheckResult]


REGISTRY: Dict[str, Check] = {}

CheckFunction = Callable[[Probe], CheckResult]


def _check(name: str, title: str, registry: Optional[Dict[str, Check]] = None
           ) -> Callable[[CheckFunction], CheckFunction]:
    """Register a check in ``registry`` (default the LayerNorm battery's)."""
    def register(run: CheckFunction) -> CheckFunction:
        (REGISTRY if registry is None else registry)[name] = Check(name, title, run)
        return run
    return register


def run_check(name: str, probe: Probe, registry: Optional[Mapping[str, Check]] = None
              ) -> CheckResult:
    """Run one check of ``registry`` (default the LayerNorm battery's); an
    implementation that raises or returns a wrong shape fails it with that
    message."""
    try:
        return (REGISTRY if registry is None else registry)[name].run(probe)
    except ImplementationError as exc:
        return CheckResult(name, FAIL, exc.figure, str(exc))


# -- small helpers ------------------------------------------------------------

def _no_fit(what: str, result: Fit[Any]) -> str:
    """Diagnosis when none of the candidate models fits."""
    return (f"the output matches no {what} (the closest is off by "
            f"{result.scores[result.best]:.3g} x tol); another failed check may name a "
            "defect that hides this one")


def _unrepeatable(name: str) -> CheckResult:
    return CheckResult(name, SKIP, "not repeatable",
                       "the same input gives different outputs from call to call (see the "
                       "state check), so this cannot be measured")


def _identical(a: NDArray[Any], b: NDArray[Any]) -> bool:
    """Bit for bit the same values (NaN equal to NaN)."""
    return a.dtype == b.dtype and bool(ulp_distance(a, b).max() == 0)


def _repeats(p: Probe, first: NDArray[Any], x: NDArray[Any], w: Param, b: Param) -> bool:
    """Whether calling again on ``x`` still gives ``first``."""
    return _identical(first, p.call_raw(x, w, b))


def _standard_rows(rng: np.random.Generator, n: int, d: int) -> NDArray[Any]:
    """``n`` random records of ``d`` features with mean exactly 0 and
    population variance exactly 1 (in float64, before any cast)."""
    z = rng.standard_normal((n, d))
    z -= z.mean(axis=-1, keepdims=True)
    std = np.sqrt((z * z).mean(axis=-1, keepdims=True))
    rows: NDArray[Any] = z / np.where(std > 0, std, 1.0)
    return rows


def _fmt_row(values: Sequence[float], n: int = 4, decimals: int = 6) -> str:
    shown = ", ".join(f"{v:.{decimals}f}" for v in values[:n])
    return f"[{shown}{', ...' if len(values) > n else ''}]"


def _fmt_numbers(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def _fmt_index(index: Sequence[int]) -> str:
    if len(index) == 1:
        return str(int(index[0]))
    return "(" + ", ".join(str(int(i)) for i in index) + ")"


def _fmt_indices(indices: Sequence[Tuple[int, ...]], n: int = 4) -> str:
    shown = ", ".join(_fmt_index(i) for i in indices[:n])
    return shown + (f" and {len(indices) - n} more" if len(indices) > n else "")


def _max_abs_error(got: NDArray[Any], want: NDArray[Any]) -> float:
    with np.errstate(all="ignore"):
        err = np.abs(got - want)
    return float(np.where(np.isnan(err), np.inf, err).max()) if err.size else 0.0


def _scale_ratio(got: NDArray[Any], want: NDArray[Any]) -> float:
    """The least-squares ``c`` in ``got ~ c * want``."""
    with np.errstate(all="ignore"):
        return float(np.sum(got * want) / np.sum(want * want))


def _record_errors(p: Probe, got: NDArray[Any], want: NDArray[Any]) -> NDArray[Any]:
    """Each record's worst error in tolerance units (shape ``got.shape[:-1]``)."""
    worst: NDArray[Any] = p.tol.units(got, want).max(axis=-1)
    return worst


# -- the checks ----------------------------------------------------------------

@_check("contract", "output shaped like x, in x's dtype; inputs left unchanged")
def check_contract(p: Probe) -> CheckResult:
    d, lead = p.d(16), p.lead((2, 3))
    rng = p.rng("contract")
    x = p.cast(rng.standard_normal(lead + (d,)) * 2 + 1)
    w, b = p.params(*p.random_params(rng, d))
    inputs = {"x": x, "weight": w, "bias": b}
    before = {k: v.copy() for k, v in inputs.items() if v is not None}
    y = p.call_raw(x, w, b, copy=False)
    figure = f"{x.dtype}{list(x.shape)} -> {y.dtype}{list(y.shape)}"
    modified = [k for k, v in before.items()
                if not np.array_equal(v, np.asarray(inputs[k]), equal_nan=True)]
    if modified:
        return CheckResult("contract", FAIL, figure,
                           f"modifies its input {' and '.join(modified)} in place; a "
                           f"{p.op.name} must leave its arguments unchanged (write to a new "
                           "array)")
    if not np.isfinite(y).all():
        return CheckResult("contract", FAIL, figure,
                           "non-finite output for finite, well-scaled input")
    if not is_float(y.dtype):
        return CheckResult("contract", FAIL, figure,
                           f"returns {y.dtype}: a {p.op.name} output is floating point")
    if y.dtype.itemsize < x.dtype.itemsize:
        return CheckResult("contract", WARN, figure,
                           f"returns {y.dtype} for {x.dtype} input: precision is lost on "
                           "the way out (for JAX, enable jax_enable_x64)")
    if y.dtype != x.dtype:
        return CheckResult("contract", PASS, figure,
                           f"returns the wider {y.dtype} for {x.dtype} input; inputs unchanged")
    return CheckResult("contract", PASS, figure,
                       "output has the input's shape and dtype; inputs unchanged")


#: The worked examples: record, mean, population variance, output at eps 0.
HAND_ROWS = WORKED_EXAMPLES


@_check("hand_rows", "the worked examples [1, 2, 3, 4] and [10, 12, 8, 14]")
def check_hand_rows(p: Probe) -> CheckResult:
    return hand_rows(p, [(ex.row, f"{_fmt_numbers(ex.row)} (mean {ex.mean:g}, variance "
                                  f"{ex.var:g})") for ex in HAND_ROWS])


def hand_rows(p: Probe, examples: Sequence[Tuple[Sequence[float], str]]) -> CheckResult:
    """The worked examples ``(record, how a report describes it)``, repeated
    to the feature size (a multiple of 4), at eps 0 where the implementation
    takes eps, scale 1."""
    d = p.d(4)
    if d % 4:
        sizes = " and ".join(str(n) for n in sorted({len(row) for row, _ in examples}))
        return CheckResult("hand_rows", SKIP, f"d={d}",
                           f"the worked examples have {sizes} features; the fixed d={d} is not "
                           "a multiple of 4 to repeat them")
    eps = 0.0 if p.impl.takes_eps else p.eps
    x = p.cast([np.tile(row, d // len(row)) for row, _ in examples])
    got = p.rows(x, *p.identity_params(d), eps=eps)
    want = p.reference(x, *p.identity_params(d), eps=eps)
    bad = np.flatnonzero(_record_errors(p, got, want) > 1)
    figure = f"max error {_max_abs_error(got, want):.2g}"
    if len(bad):
        # Enough decimals to show a difference the tolerance cares about.
        decimals = max(6, math.ceil(-math.log10(p.tol.atol)) + 1) if p.tol.atol > 0 else 6
        wrong = "; ".join(
            f"{examples[int(i)][1]} gave {_fmt_row(got[i], decimals=decimals)} instead of "
            f"{_fmt_row(want[i], decimals=decimals)}" for i in bad)
        return CheckResult("hand_rows", FAIL, figure,
                           f"wrong on the worked examples at eps={eps:g}: {wrong}. The checks "
                           "below name the likely cause")
    shown = " and ".join(f"{_fmt_numbers(row)} -> {_fmt_row(got[i])}"
                         for i, (row, _) in enumerate(examples))
    return CheckResult("hand_rows", PASS, figure, f"{shown} at eps={eps:g}")


@_check("reference", "agreement with reference_layer_norm (float64) on random data")
def check_reference(p: Probe) -> CheckResult:
    d, lead = p.d(64), p.lead((4, 6))
    rng = p.rng("reference")
    # Offsets stay within a few standard deviations: large ones are the
    # cancellation check's business.
    scale = np.exp(rng.uniform(np.log(0.5), np.log(5.0), lead + (1,)))
    offset = rng.uniform(-2.0, 2.0, lead + (1,)) * scale
    x = p.cast(rng.standard_normal(lead + (d,)) * scale + offset)
    w, b = p.params(*p.random_params(rng, d))
    got = p.call(x, w, b)
    want = p.reference(x, w, b)
    units = p.tol.units(got, want)
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(units)), units.shape))
    figure = f"max error {_max_abs_error(got, want):.2g} ({units.max():.2g} x tol)"
    if units.max() > 1:
        return CheckResult("reference", FAIL, figure,
                           f"differs from {p.op.reference_name} (float64) beyond {p.tol}: at "
                           f"record {_fmt_index(worst[:-1])}, feature {worst[-1]} it gives "
                           f"{got[worst]:.7g} instead of {want[worst]:.7g}. The checks below "
                           "name the likely cause", {"units": float(units.max())})
    return CheckResult("reference", PASS, figure,
                       f"within {p.tol} of {p.op.reference_name} (float64) on "
                       f"{math.prod(lead)} random records, random "
                       + ("weight and bias" if p.impl.takes_bias else "weight"),
                       {"units": float(units.max())})


@_check("invariants", "per-record output mean 0 and mean square 1 (gain 1, bias 0)")
def check_invariants(p: Probe) -> CheckResult:
    d = p.d(64)
    rng = p.rng("invariants")
    # A variance of at least 1e6 eps: the expected mean square is 1 to 1e-6.
    # Each record has its own mean, which must come out as 0.
    scale = min(max(1.0, 1e3 * math.sqrt(p.eps)), 1e3)
    x = p.cast((_standard_rows(rng, 32, d) + rng.uniform(-3, 3, (32, 1))) * scale)
    got = p.rows(x, *p.identity_params(d))
    want = p.reference(x)
    # If every element is within tolerance of the reference, the record's
    # mean and mean square are within these bounds of the reference's.
    e = p.tol.atol + p.tol.rtol * np.abs(want)
    mean_err = np.abs(got.mean(axis=-1) - want.mean(axis=-1))
    ms_got, ms_want = (got * got).mean(axis=-1), (want * want).mean(axis=-1)
    ms_err = np.abs(ms_got - ms_want)
    mean_bad = mean_err > e.mean(axis=-1)
    ms_bad = ms_err > (e * (2 * np.abs(want) + e)).mean(axis=-1)
    figure = (f"max |mean| {np.nanmax(np.abs(got.mean(axis=-1))):.1g}, "
              f"max |mean sq - 1| {np.nanmax(np.abs(ms_got - 1)):.1g}")
    if not np.isfinite(got).all():
        return CheckResult("invariants", FAIL, figure, "non-finite outputs for plain records")
    if mean_bad.any():
        i = int(np.argmax(mean_err))
        if mean_err[i] >= 0.01:
            return CheckResult("invariants", FAIL, figure,
                               f"records are not centred: output mean {got[i].mean():.3g} "
                               f"(expected 0) in record {i}: the record's own mean is not "
                               "subtracted from it (as in RMSNorm)")
        return CheckResult("invariants", FAIL, figure,
                           f"output means drift from 0 by up to {mean_err[i]:.3g} (record {i}), "
                           f"more than {p.tol} allows: the mean is computed or subtracted with "
                           f"less precision than {p.dtype} needs")
    if ms_bad.any():
        i = int(np.argmax(ms_err))
        ratio = ms_got[i] / ms_want[i]
        sample = " = (d - 1)/d, the sample variance's" if abs(ratio - (d - 1) / d) < 1e-3 else ""
        return CheckResult("invariants", FAIL, figure,
                           f"output mean square {ms_got[i]:.6g} instead of {ms_want[i]:.6g} in "
                           f"record {i}, a ratio of {ratio:.4f}{sample}: the variance or its "
                           "square root is wrong (see the variance and eps checks)")
    return CheckResult("invariants", PASS, figure,
                       "every record comes out with mean 0 and mean square 1")


def _convention_fit(p: Probe, xs: List[NDArray[Any]], outputs: List[NDArray[Any]],
                    eps_values: List[float]) -> Fit[Tuple[int, str]]:
    """Fit outputs (gain 1, bias 0) against every (variance denominator, eps
    placement) convention."""
    models = {
        (ddof, mode): [model_layer_norm(x, eps=e, ddof=ddof, eps_mode=mode)
                       for x, e in zip(xs, eps_values)]
        for ddof in (0, 1) for mode in EPS_MODES
    }
    return fit(outputs, models, p.tol)


@_check("variance", "population variance (divides by d, not d - 1)")
def check_variance(p: Probe) -> CheckResult:
    d = p.d(8)
    if d < 2:
        return CheckResult("variance", SKIP, f"d={d}", "needs at least 2 features")
    rng = p.rng("variance")
    scale = min(max(1.0, 1e3 * math.sqrt(p.eps)), 1e3)
    x = p.cast((_standard_rows(rng, 16, d) + rng.uniform(-3, 3, (16, 1))) * scale)
    got = p.rows(x, *p.identity_params(d))
    result = _convention_fit(p, [x], [got], [p.eps])
    ratio = _scale_ratio(got, p.reference(x))
    sample = math.sqrt((d - 1) / d)
    figure = f"output/reference {ratio:.4f} (d - 1 gives {sample:.4f})"
    values = {"ratio": ratio, "sample_ratio": sample}
    if any(result.fits((0, mode)) for mode in EPS_MODES):
        return CheckResult("variance", PASS, figure, "population variance (divides by d)", values)
    if result.fits():  # only a d - 1 model fits
        return CheckResult("variance", FAIL, figure,
                           f"sample variance: outputs are sqrt((d - 1)/d) = {sample:.4f} times "
                           f"the reference at d={d}, as if the variance were divided by d - 1 "
                           "instead of d (np.var(ddof=1), torch.var's unbiased default); use "
                           "the population variance", values)
    return CheckResult("variance", FAIL, figure,
                       f"outputs are {ratio:.4f} times the reference; "
                       + _no_fit("variance convention, population (1) or sample "
                                 f"({sample:.4f})", result), values)


def eps_probes(p: ProbeBase[Any]) -> List[float]:
    """The eps values an eps check probes: the audit's, 0.1 and 1 where the
    implementation takes eps, else its own; none when that is 0."""
    if p.impl.takes_eps:
        return sorted({e for e in (p.eps, 0.1, 1.0) if e > 0})
    return [p.eps] if p.eps > 0 else []


def eps_runs(p: Probe, eps_values: Sequence[float], params: Params
             ) -> Tuple[List[NDArray[Any]], List[NDArray[Any]], float]:
    """For each eps, records whose variance (mean square: their mean is 0)
    is 0.01, 0.1, 1 and 10 times eps, where the placements of eps differ by
    up to a factor of ten, and the outputs with ``params``; and the output
    over the reference of the record at eps itself (at the largest eps), as
    a figure."""
    d = p.d(16)
    rng = p.rng("eps")
    ratios = np.array([0.01, 0.1, 1.0, 10.0])
    xs, outputs = [], []
    for e in eps_values:
        x = p.cast(_standard_rows(rng, len(ratios), d) * np.sqrt(ratios * e)[:, None])
        xs.append(x)
        outputs.append(p.rows(x, *params, eps=e))
    ratio = _scale_ratio(outputs[-1][2], p.reference(xs[-1][2], *params, eps=eps_values[-1]))
    return xs, outputs, ratio


def _no_eps() -> CheckResult:
    return CheckResult("eps", SKIP, "eps=0",
                       "the implementation takes no eps and uses eps=0: nothing to probe")


#: How each eps placement reads in a report.
EPS_FORMULAS = {
    "variance": "(x - mean) / sqrt(var + eps)",
    "std": "(x - mean) / (sqrt(var) + eps)",
    "ignored": "(x - mean) / sqrt(var)",
    "twice": "(x - mean) / sqrt(var + 2*eps)",
}
EPS_DEFECTS = {
    "std": "eps added to the standard deviation instead of the variance",
    "ignored": "eps ignored",
    "twice": "eps applied twice",
}


@_check("eps", "eps added once, to the variance, inside the square root")
def check_eps(p: Probe) -> CheckResult:
    eps_values = eps_probes(p)
    if not eps_values:
        return _no_eps()
    xs, outputs, ratio = eps_runs(p, eps_values, p.identity_params(p.d(16)))
    result = _convention_fit(p, xs, outputs, eps_values)
    shown = ", ".join(f"{e:g}" for e in eps_values)
    figure = f"var = eps record x{ratio:.3f} of reference"
    values = {"scores": {f"{k[1]}, ddof={k[0]}": v for k, v in result.scores.items()}}
    if any(result.fits((ddof, "variance")) for ddof in (0, 1)):
        return CheckResult("eps", PASS, figure,
                           f"eps added to the variance: {EPS_FORMULAS['variance']} at eps = "
                           f"{shown}", values)
    ddof, mode = result.best
    sample = " (with the sample variance, see the variance check)" if ddof else ""
    if not result.fits():
        return CheckResult("eps", FAIL, figure,
                           f"on records with variance 0.01 to 10 times eps (eps = {shown}) "
                           + _no_fit("eps placement", result), values)
    return CheckResult("eps", FAIL, figure,
                       f"{EPS_DEFECTS[mode]}: on records with variance 0.01 to 10 times eps "
                       f"(eps = {shown}) the output fits {EPS_FORMULAS[mode]}{sample}; it must "
                       f"be {EPS_FORMULAS['variance']}", values)


#: Gain/bias conventions: description, which parameters the model needs.
AFFINE_MODELS = {
    "correct": ("weight * normalized + bias", ()),
    "gain_before": ("gain applied before normalization: normalize(x * weight) + bias, so "
                    "the normalization undoes the gain", ("weight",)),
    "bias_missing": ("bias missing: the output is weight * normalized, the bias is never "
                     "added", ("bias",)),
    "gain_missing": ("gain missing: the output is normalized + bias, the weight is never "
                     "applied", ("weight",)),
    "bias_before_gain": ("bias added before the gain: weight * (normalized + bias)",
                         ("weight", "bias")),
    "gain_first": ("gain not per-feature: weight[0] scales every feature", ("weight",)),
    "gain_mean": ("gain not per-feature: one scalar gain (the mean of weight) scales every "
                  "feature", ("weight",)),
    "wrong_axis": ("parameters broadcast on the wrong axis: weight[i] and bias[i] are applied "
                   "to record i instead of feature i", ()),
}


def _affine_predictions(p: Probe, x: NDArray[Any], w: Param, b: Param) -> Dict[str, NDArray[Any]]:
    """What each gain/bias convention predicts for parameters ``w``, ``b``
    (None: not taken), built on the implementation's own normalization (its
    output at gain 1, bias 0), so a defect elsewhere does not blur the fit."""
    d = x.shape[-1]
    identity = p.identity_params(d)
    w64 = np.ones(d) if w is None else w.astype(np.float64)
    b64 = np.zeros(d) if b is None else b.astype(np.float64)
    n = p.rows(x, *identity)
    predictions = {
        "correct": n * w64 + b64,
        "gain_before": p.rows(x * w64, *identity) + b64,
        "bias_missing": n * w64,
        "gain_missing": n + b64,
        "bias_before_gain": (n + b64) * w64,
        "gain_first": n * w64[0] + b64,
        "gain_mean": n * w64.mean() + b64,
    }
    if x.shape[0] == d:
        predictions["wrong_axis"] = n * w64[:, None] + b64[:, None]
    return predictions


@_check("affine", "per-feature gain and bias, applied after normalization")
def check_affine(p: Probe) -> CheckResult:
    takes = {"weight": p.impl.takes_weight, "bias": p.impl.takes_bias}
    if not any(takes.values()):
        return CheckResult("affine", SKIP, "no parameters",
                           "the implementation takes no weight or bias")
    d = p.d(8)
    rng = p.rng("affine")
    # d records of d features: parameters broadcast over records instead of
    # features then still run, and show.
    x = p.cast(_standard_rows(rng, d, d) * 2 + 1)
    first_gain = np.ones(d)
    first_gain[0] = 2.0
    probes = [p.params(first_gain, np.zeros(d)), p.params(*p.random_params(rng, d))]
    outputs = [p.rows(x, w, b) for w, b in probes]
    predictions = [_affine_predictions(p, x, w, b) for w, b in probes]
    keys = [k for k, (_, needs) in AFFINE_MODELS.items()
            if k in predictions[0] and all(takes[n] for n in needs)]
    result = fit(outputs, {k: [pr[k] for pr in predictions] for k in keys}, p.tol)

    if takes["weight"]:
        normalized = predictions[0]["gain_missing"]  # the first probe has bias 0
        first = _scale_ratio(outputs[0][:, 0], normalized[:, 0])
        others = _scale_ratio(outputs[0][:, 1:], normalized[:, 1:])
        figure = f"first gain 2: feature 0 x{first:.3g}, others x{others:.3g}"
    else:
        figure = f"max error {_max_abs_error(outputs[1], predictions[1]['correct']):.2g}"
    if result.fits("correct"):
        return CheckResult("affine", PASS, figure,
                           "per-feature gain and bias after normalization: "
                           + AFFINE_MODELS["correct"][0])
    if not result.fits():
        return CheckResult("affine", FAIL, figure, _no_fit("known gain/bias convention", result))
    description = AFFINE_MODELS[result.best][0]
    if result.best in ("gain_first", "gain_mean"):
        description += (f" (setting the first gain to 2 scaled feature 0 by {first:.3g} and "
                        f"the others by {others:.3g}; expected 2 and 1)")
    return CheckResult("affine", FAIL, figure,
                       f"{description}; expected {AFFINE_MODELS['correct'][0]}")


def _coupling_kind(lead_ndim: int, moved: Sequence[Tuple[int, ...]], at: Tuple[int, ...]) -> str:
    """Name the axes a change in record ``at`` travelled along."""
    if lead_ndim == 1:
        return "records"
    batch = any(m[0] != at[0] and m[1:] == at[1:] for m in moved)
    positions = any(m[0] == at[0] for m in moved)
    across = any(m[0] != at[0] and m[1:] != at[1:] for m in moved)
    if across or (batch and positions):
        return "all"
    return "batch" if batch else "positions"


COUPLING_DEFECTS = {
    "batch": "batch coupling (statistics across batch items, batch-norm style)",
    "positions": "position coupling (statistics across positions of a sequence, e.g. "
                 "normalizing over (T, d) instead of d)",
    "all": "statistics across the whole batch (all records, positions and batch items)",
    "records": "statistics across records",
}


@_check("coupling", "records independent: no statistic across positions or batch items")
def check_coupling(p: Probe) -> CheckResult:
    lead = p.lead((4, 6))
    n = math.prod(lead)
    if n < 2:
        return CheckResult("coupling", SKIP, f"leading shape {lead}",
                           "the fixed leading shape holds a single record")
    d = p.d(16)
    rng = p.rng("coupling")
    x = p.cast(rng.standard_normal(lead + (d,)))
    w, b = p.params(*p.random_params(rng, d))
    at = tuple(k // 2 for k in lead)
    changed = x.copy()
    changed[at] = p.cast(x[at] * 10 + 5)
    base = p.call_raw(x, w, b)
    moved_by = _record_errors(p, p.call(changed, w, b), base)
    if not _repeats(p, base, x, w, b):
        return _unrepeatable("coupling")
    moved_by[at] = 0
    moved = [tuple(int(i) for i in m) for m in np.argwhere(moved_by > 1)]
    figure = f"{len(moved)}/{n - 1} records moved"

    alone_note, alone_diff = "", 0.0
    if not p.fixed_lead:
        batch = p.cast(rng.standard_normal((10, 10, d)))
        inside = p.call(batch, w, b)[3, 7]
        alone = p.call(batch[3:4, 7:8], w, b)[0, 0]
        alone_diff = _max_abs_error(alone, inside)
        figure += f"; alone vs in 100: {alone_diff:.2g}"
        if p.tol.worst(alone, inside) > 1:
            alone_note = (f"record (3, 7) of a 10 x 10 batch gives {_fmt_row(inside)} inside "
                          f"the batch but {_fmt_row(alone)} alone (max difference "
                          f"{alone_diff:.3g})")
    values = {"moved": moved, "alone_difference": alone_diff}
    if moved:
        kind = _coupling_kind(len(lead), moved, at)
        where = {"batch": " (the same position in other batch items)",
                 "positions": " (other positions of the same batch item)"}.get(kind, "")
        return CheckResult("coupling", FAIL, figure,
                           f"{COUPLING_DEFECTS[kind]}: changing record {_fmt_index(at)} moved "
                           f"{len(moved)} other record(s){where}: {_fmt_indices(moved)}"
                           + (f"; {alone_note}" if alone_note else "")
                           + ". Each record must be normalized by its own statistics", values)
    if alone_note:
        return CheckResult("coupling", FAIL, figure,
                           f"a record's output depends on the batch around it: {alone_note}",
                           values)
    return CheckResult("coupling", PASS, figure,
                       f"changing record {_fmt_index(at)} moved no other record"
                       + ("" if p.fixed_lead else
                          "; a record gives the same output alone and in a batch of 100"),
                       values)


@_check("state", "no state across calls (running statistics)")
def check_state(p: Probe) -> CheckResult:
    d, lead = p.d(16), p.lead((2, 3))
    rng = p.rng("state")
    x = p.cast(rng.standard_normal(lead + (d,)))
    w, b = p.params(*p.random_params(rng, d))
    first = p.call_raw(x, w, b)
    others = [(100.0, 50.0), (0.01, -3.0), (1.0, 1000.0)]
    for scale, offset in others:
        p.call_raw(p.cast(rng.standard_normal(lead + (d,)) * scale + offset), w, b)
    again = p.call_raw(x, w, b)
    ulps = float(ulp_distance(first, again).max())
    change = _max_abs_error(again.astype(np.float64), first.astype(np.float64))
    figure = f"max change {change:.2g} ({ulps:.0f} ulp)"
    if p.tol.worst(again, first) > 1:
        return CheckResult("state", FAIL, figure,
                           f"running statistics / state across calls: the same input gave a "
                           f"different output after {len(others)} other calls (max change "
                           f"{change:.3g}); the output must depend only on the call's own "
                           "input, not on statistics kept from earlier calls")
    if ulps > 0:
        return CheckResult("state", WARN, figure,
                           f"not deterministic: the same input gave outputs {ulps:.0f} ulp "
                           "apart across calls")
    return CheckResult("state", PASS, figure,
                       f"the same input gives a bit-identical output after {len(others)} "
                       "other calls")


#: Common offsets of the cancellation check.
OFFSETS = (1e2, 1e3, 1e4)


@_check("cancellation", "accuracy with a large common offset (no E[x^2] - E[x]^2)")
def check_cancellation(p: Probe) -> CheckResult:
    d = p.d(64)
    rng = p.rng("cancellation")
    z = _standard_rows(rng, 8, d)
    unit = unit_roundoff(p.dtype)
    identity = p.identity_params(d)
    errors: List[float] = []
    excess: List[float] = []
    first: Optional[Tuple[NDArray[Any], NDArray[Any]]] = None
    for offset in OFFSETS:
        # The spread stays several ulps of the offset wide, so the records
        # keep a variance in any dtype.
        spread = max(1.0, 4 * float(np.spacing(p.dtype.type(offset))))
        shifted = p.cast(offset + spread * z)
        # The same records without the offset (exact: Sterbenz). LayerNorm
        # ignores a common offset, so any difference is what the offset
        # cost, whatever else the implementation gets wrong.
        centred = p.cast(shifted.astype(np.float64) - offset)
        got_centred = p.rows(centred, *identity)
        got_shifted = p.rows(shifted, *identity)
        first = first or (centred, got_centred)
        errors.append(_max_abs_error(got_shifted, got_centred))
        # Rounding the mean to the dtype unavoidably costs about
        # unit * offset / spread; allow a generous multiple of it.
        allowed = (p.tol.atol + p.tol.rtol * np.abs(p.reference(centred))
                   + 4 * math.sqrt(d) * unit * offset / spread)
        with np.errstate(all="ignore"):
            ratio = np.abs(got_shifted - got_centred) / allowed
        excess.append(float(np.nan_to_num(ratio, nan=np.inf).max()))
    assert first is not None
    if not _identical(p.rows(first[0], *identity), first[1]):
        return _unrepeatable("cancellation")
    figure = "error " + " / ".join(f"{e:.1g}" for e in errors) + " at offsets 1e2/1e3/1e4"
    values = {"errors": dict(zip(OFFSETS, errors))}
    if max(excess) <= 1:
        return CheckResult("cancellation", PASS, figure,
                           "no cancellation: accurate with a common offset up to 1e4", values)
    growth = _growth_per_decade(errors)
    nonfinite = [f"1e{math.log10(o):.0f}" for o, e in zip(OFFSETS, errors)
                 if not math.isfinite(e)]
    if not nonfinite and growth < 0.5:
        return CheckResult("cancellation", FAIL, figure,
                           "not shift-invariant: adding a common offset to every feature "
                           f"changes the output by {errors[0]:.3g} already at offset 1e2, and "
                           "not more at larger offsets; the record's mean is not (entirely) "
                           "subtracted (see the invariants check)", values)
    if nonfinite or growth >= 1.5:
        how = (f"the output is not finite at offset {', '.join(nonfinite)} (a negative "
               "variance)" if nonfinite else
               f"the error grows about x{10 ** growth:.0f} per decade of offset, with its square")
        return CheckResult("cancellation", FAIL, figure,
                           f"E[x^2] - E[x]^2 cancellation: {how}. Compute the variance as the "
                           "mean of (x - mean)^2 (two passes) or with Welford's algorithm",
                           values)
    return CheckResult("cancellation", FAIL, figure,
                       "precision lost with a large offset: the error grows in proportion to "
                       "the offset, more than rounding the mean in "
                       f"{p.dtype} explains; accumulate the mean and variance in a wider type",
                       values)


def _growth_per_decade(errors: Sequence[float]) -> float:
    """Slope of log10(error) against log10(offset) over the finite, nonzero
    errors (0 when fewer than two)."""
    pairs = [(math.log10(o), math.log10(e)) for o, e in zip(OFFSETS, errors)
             if math.isfinite(e) and e > 0]
    if len(pairs) < 2:
        return 0.0
    (o0, e0), (o1, e1) = pairs[0], pairs[-1]
    return (e1 - e0) / (o1 - o0)


@_check("float16_overflow", "float16 inputs up to 65504 give finite, accurate outputs")
def check_float16_overflow(p: Probe) -> CheckResult:
    return float16_overflow(p, _scaled_down)


#: What a float16 record with large values should give, from the
#: implementation itself: ``expected(p, x, weight)`` for the stack ``x``,
#: with a phrase saying what it is.
Expected = Callable[[Probe, NDArray[Any], Param], Tuple[NDArray[Any], str]]


def _scaled_down(p: Probe, x: NDArray[Any], weight: Param) -> Tuple[NDArray[Any], str]:
    """The same records scaled down by 2**13 (65504 -> 8), through the same
    implementation: LayerNorm does not care about scale, so whatever differs
    (beyond what the reference says eps changes) is the cost of large
    values, whatever else the implementation gets wrong."""
    small = p.cast(x * 2.0 ** -13, np.float16)
    got_small = p.rows(small, weight, p.identity_params(x.shape[-1], np.float16)[1],
                       dtype=np.float16)
    return (got_small + p.reference(x) - p.reference(small),
            "the same records scaled down by 2^13")


def float16_overflow(p: Probe, expected: Expected) -> CheckResult:
    """The float16 overflow check, comparing large records with what
    ``expected`` derives from the implementation."""
    d = p.d(16)
    rng = p.rng("float16_overflow")
    top = float(np.finfo(np.float16).max)  # 65504
    large = {
        "alternating +-65504": np.resize([top, -top], d),
        "all in [60000, 65504]": rng.uniform(60000.0, top, d),
        "one 65504 among zeros": np.eye(1, d)[0] * top,
        "-65504 with small values": np.where(np.arange(d) % 4 == 0, -top,
                                             rng.standard_normal(d)),
    }
    names = list(large)
    # The last record holds plain values, as a control.
    x = p.cast(list(large.values()) + [rng.standard_normal(d)], np.float16)
    identity = p.identity_params(d, np.float16)
    try:
        got = p.rows(x, *identity, dtype=np.float16)
    except ImplementationError as exc:
        return CheckResult("float16_overflow", SKIP, "no float16",
                           f"does not accept float16 input: {exc}")
    if not _identical(p.rows(x, *identity, dtype=np.float16), got):
        return _unrepeatable("float16_overflow")
    tol = p.tol if p.dtype == np.float16 else TOLERANCES[np.dtype(np.float16)]
    want = p.reference(x)
    like, what = expected(p, x, identity[0])
    scale_units = tol.units(got, like).max(axis=-1)[:-1]
    nonfinite = [names[i] for i in np.flatnonzero(~np.isfinite(got[:-1]).all(axis=-1))]
    figure = (f"{len(nonfinite)}/{len(names)} large records non-finite" if nonfinite
              else f"max error {_max_abs_error(got, want):.2g}")
    if not np.isfinite(got[-1]).all():
        return CheckResult("float16_overflow", FAIL, figure,
                           "non-finite outputs even for plain float16 records")
    advice = p.op.overflow_advice
    if nonfinite:
        return CheckResult("float16_overflow", FAIL, figure,
                           f"float16 overflow: records with values up to 65504 came out "
                           f"inf/nan ({'; '.join(nonfinite)}): {advice}")
    if scale_units.max() > 1:
        worst = names[int(np.argmax(scale_units))]
        return CheckResult("float16_overflow", FAIL, figure,
                           "float16 overflow: records with values up to 65504 come out "
                           f"differently from {what} (worst: "
                           f"{worst}, {scale_units.max():.3g} x tol): {advice}")
    if tol.worst(got, want) > 1:
        return CheckResult("float16_overflow", PASS, figure,
                           "finite outputs for float16 inputs up to +-65504, the same as for "
                           f"{what}; accuracy is the reference check's business")
    return CheckResult("float16_overflow", PASS, figure,
                       "float16 records with values up to +-65504 give finite outputs "
                       "within float16 tolerance")


@_check("nonfinite", "a NaN or Inf stays inside its own record")
def check_nonfinite(p: Probe) -> CheckResult:
    lead = p.lead((4, 6))
    n = math.prod(lead)
    if n < 2:
        return CheckResult("nonfinite", SKIP, f"leading shape {lead}",
                           "the fixed leading shape holds a single record")
    d = p.d(16)
    rng = p.rng("nonfinite")
    x = p.cast(rng.standard_normal(lead + (d,)))
    w, b = p.params(*p.random_params(rng, d))
    clean = p.call_raw(x, w, b)
    spots = [tuple(int(i) for i in np.unravel_index(k, lead)) for k in (n // 3, (2 * n) // 3)]
    if spots[0] == spots[1]:
        spots[1] = tuple(int(i) for i in np.unravel_index(n - 1, lead))
    leaks, worst = [], 0
    for label, value, at in (("a NaN", np.nan, spots[0]), ("+Inf", np.inf, spots[1]),
                             ("-Inf", -np.inf, spots[1])):
        poisoned = x.copy()
        poisoned[at + (d // 2,)] = value
        got = p.call(poisoned, w, b)
        bad = _record_errors(p, got, clean) > 1
        bad[at] = False
        hit = [tuple(int(i) for i in m) for m in np.argwhere(bad)]
        worst = max(worst, len(hit))
        if hit:
            became = "non-finite" if not np.isfinite(got[bad]).all() else "changed"
            leaks.append(f"{label} in record {_fmt_index(at)} made {len(hit)} other "
                         f"record(s) {became} (e.g. {_fmt_indices(hit, 3)})")
    if not _repeats(p, clean, x, w, b):
        return _unrepeatable("nonfinite")
    figure = f"{worst}/{n - 1} clean records affected"
    if leaks:
        return CheckResult("nonfinite", FAIL, figure,
                           f"NaN/Inf leaks into other records: {'; '.join(leaks)}. A statistic "
                           "is shared across records (a batch-wide max, sum or mean); a NaN "
                           "or Inf must stay inside its own record")
    return CheckResult("nonfinite", PASS, figure,
                       "a NaN or +-Inf in one record leaves every other record unchanged")


@_check("batch_invariance", "bit-for-bit the same alone or in any batch (warning by default)")
def check_batch_invariance(p: Probe) -> CheckResult:
    d = p.d(64)
    rng = p.rng("batch_invariance")
    # A few records, each placed in every layout among random neighbours:
    # rounding differences only show for some values.
    records = p.cast(rng.standard_normal((4, d)) * 3 + 1)
    w, b = p.params(*p.random_params(rng, d))
    if p.fixed_lead:
        lead = p.fixed_leading_shape()
        n = math.prod(lead)
        spots = [tuple(int(i) for i in np.unravel_index(k, lead))
                 for k in sorted({0, n // 2, n - 1})]
        layouts = [(f"at {_fmt_index(at)} of {lead}", lead, at) for at in spots]
    else:
        layouts = [("alone", (1, 1), (0, 0)), ("in a batch of 100", (10, 10), (3, 7)),
                   ("in a batch of 15", (3, 5), (2, 4)), ("first of a batch of 7", (1, 7), (0, 0))]
    # outputs[i][j]: record j in layout i.
    outputs: List[NDArray[Any]] = []
    for _, lead, at in layouts:
        row: List[NDArray[Any]] = []
        for record in records:
            x = p.cast(rng.standard_normal(lead + (d,)))
            x[at] = record
            y = p.call_raw(x, w, b)
            if not outputs and not row and not _repeats(p, y, x, w, b):
                return _unrepeatable("batch_invariance")
            row.append(y[at])
        outputs.append(np.stack(row))
    ulps = [float(ulp_distance(outputs[0], y).max()) for y in outputs]
    worst = int(np.argmax(ulps))
    figure = f"max difference {ulps[worst]:.0f} ulp"
    values = {"ulp": ulps[worst]}
    if ulps[worst] == 0:
        where = ", ".join(name for name, *_ in layouts)
        return CheckResult("batch_invariance", PASS, figure,
                           f"bit-identical: {len(records)} records give the same bits {where}",
                           values)
    beyond = p.tol.worst(outputs[worst], outputs[0]) > 1
    return CheckResult("batch_invariance", FAIL if p.strict_batch_invariance else WARN, figure,
                       f"not batch-invariant: max difference {ulps[worst]:.0f} ulp between "
                       f"a record {layouts[0][0]} and {layouts[worst][0]}"
                       + (" (beyond tolerance: see the coupling check)" if beyond else
                          ": the reduction order depends on the batch (size or position); "
                          "many valid kernels are like this, but results are then not "
                          "reproducible across batch sizes"), values)


#: The names of all checks, in the order they run.
CHECKS: Tuple[str, ...] = tuple(REGISTRY)
