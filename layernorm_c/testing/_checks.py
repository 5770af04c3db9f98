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
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import NDArray

from .._cases import WORKED_EXAMPLES
from ._numerics import (EPS_MODES, TOLERANCES, Fit, Tolerance, distinct, eps_roundings, fit,
                        fmt_growth, fmt_pow2, fmt_value, growth_exponent, model_layer_norm,
                        nonfinite_words, ulp_distance)
from ._ops import is_float, unit_roundoff
from ._probe import ImplementationError, Param, Params, Probe, ProbeBase
from ._report import FAIL, PASS, SKIP, WARN, CheckResult, Status

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


def _fmt_rows_pair(got: Sequence[float], want: Sequence[float], decimals: int = 6,
                   n: int = 4) -> Tuple[str, str]:
    """Two rows as a report shows them (their first ``n`` values), with as
    many decimals as it takes for them to read differently; if they differ
    only beyond what is shown, the first differing feature is named."""
    for k in range(decimals, 17):
        a, b = _fmt_row(got, n, k), _fmt_row(want, n, k)
        if a != b:
            return a, b
    a, b = _fmt_row(got, n, decimals), _fmt_row(want, n, decimals)
    diff = [j for j, (u, v) in enumerate(zip(got, want)) if u != v]
    if diff:
        j = diff[0]
        ga, wb = distinct(got[j], want[j])
        a, b = a + f" (feature {j}: {ga})", b + f" (feature {j}: {wb})"
    return a, b


def _gives(got: float, want: float, what: str = "the reference") -> str:
    """``gives X instead of Y``, with the digits that tell them apart, and
    in words where a side is not finite ("gives NaN where the reference is
    finite (0.25)")."""
    got, want = float(got), float(want)
    if math.isfinite(got) and math.isfinite(want):
        a, b = distinct(got, want)
        return f"gives {a} instead of {b}"
    g, w = fmt_value(got), fmt_value(want)
    if math.isfinite(want):
        return f"gives {g} where {what} is finite ({w})"
    if math.isfinite(got):
        return f"gives the finite {g} where {what} is {w}"
    return f"gives {g} where {what} is {w}"


def _error_figure(got: NDArray[Any], want: NDArray[Any]) -> str:
    """``max error X``, or how many outputs are not finite where the
    reference is."""
    bad = int(np.count_nonzero(~np.isfinite(got) & np.isfinite(want)))
    if bad:
        return f"{bad} non-finite output{'s' if bad > 1 else ''}"
    return f"max error {_max_abs_error(got, want):.2g}"


def _max_abs_error(got: NDArray[Any], want: NDArray[Any]) -> float:
    # In float64: outputs of two dtypes (bfloat16 and float16) may have no
    # common dtype (older ml_dtypes with NumPy 1.x).
    with np.errstate(all="ignore"):
        err = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
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
    figure = _error_figure(got, want)
    if len(bad):
        # Enough decimals to show a difference the tolerance cares about,
        # and more where the rows would still read the same.
        decimals = max(6, math.ceil(-math.log10(p.tol.atol)) + 1) if p.tol.atol > 0 else 6
        wrong = "; ".join(
            "{} gave {} instead of {}".format(examples[int(i)][1],
                                              *_fmt_rows_pair(got[i], want[i], decimals))
            for i in bad)
        return CheckResult("hand_rows", FAIL, figure,
                           f"wrong on the worked examples at eps={eps:g}: {wrong}",
                           {"symptom": True})
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
    figure = _error_figure(got, want)
    if np.isfinite(got).all():
        figure += f" ({units.max():.2g} x tol)"
    if units.max() > 1:
        return CheckResult("reference", FAIL, figure,
                           f"differs from {p.op.reference_name} (float64) beyond {p.tol}: at "
                           f"record {_fmt_index(worst[:-1])}, feature {worst[-1]} it "
                           f"{_gives(got[worst], want[worst])}",
                           {"units": float(units.max()), "symptom": True})
    return CheckResult("reference", PASS, figure,
                       f"within {p.tol} of {p.op.reference_name} (float64) on "
                       f"{math.prod(lead)} random records, random "
                       + ("weight and bias" if p.impl.takes_bias else "weight"),
                       {"units": float(units.max())})


# -- the eps in use -------------------------------------------------------------

#: Variances (an RMSNorm's mean squares) of the records that read the eps an
#: implementation uses, in units of eps: where eps decides the output, and
#: (10 eps) where the variance's own slope shows.
EPS_RATIOS = np.array([0.01, 0.1, 1.0, 10.0])
#: Round values of eps an implementation may have built in.
COMMON_EPS = (1e-12, 1e-10, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1)


@dataclass(frozen=True)
class EpsEstimate:
    """The eps an implementation's outputs say it uses, read from records
    whose variance is near eps: per record, ``1 / s**2 = slope * var + eps``
    where ``s`` is the output's scale over the centred record (for an
    RMSNorm, the record itself and its mean square).

    Attributes
    ----------
    value : float
        The eps in use.
    precision : float
        How far off ``value`` may be, from the tolerance of the outputs.
    slope : float
        1 (population variance) or d/(d - 1) (sample variance).
    """

    value: float
    precision: float
    slope: float

    def matches(self, eps: float) -> bool:
        """Whether ``eps`` is the eps in use, to the estimate's precision."""
        return abs(self.value - eps) <= self.precision


def estimate_eps(p: ProbeBase[Any], x: NDArray[Any], got: NDArray[Any], tol: Tolerance,
                 scale: float = 1.0) -> Optional[EpsEstimate]:
    """The eps in use from records ``x`` (``(n, d)``, variances spread
    around eps) and the outputs ``got`` at a weight scaling by ``scale``
    and no bias; None when no single eps, with the population or the sample
    variance and eps inside the square root, explains every record to
    within what the tolerance leaves uncertain."""
    x64 = np.asarray(x, np.float64)
    c = x64 - x64.mean(axis=-1, keepdims=True) if p.op.key == "layer_norm" else x64
    v = (c * c).mean(axis=-1)
    y = np.asarray(got, np.float64) / scale
    d = x64.shape[-1]
    with np.errstate(all="ignore"):
        s = (y * c).sum(axis=-1) / (c * c).sum(axis=-1)
        rms_y = np.sqrt((y * y).mean(axis=-1))
        q = 1.0 / (s * s)
        # An output scale off by tol.rtol + tol.atol / rms(y) at most, so
        # 1 / s**2 by twice that.
        dq = 2.0 * (tol.rtol + tol.atol / rms_y) * q
    if not (np.isfinite(q).all() and np.isfinite(dq).all() and (s > 0).all()):
        return None
    best: Optional[Tuple[float, EpsEstimate]] = None
    for slope in (1.0, d / (d - 1)) if d > 1 else (1.0,):
        e_k = q - slope * v
        w = 1.0 / (dq * dq)
        e = float(np.sum(w * e_k) / np.sum(w))
        spread = float(np.max(np.abs(e_k - e) / dq))
        if spread <= 1.0 and (best is None or spread < best[0]):
            best = (spread, EpsEstimate(e, float(dq.min()), slope))
    return None if best is None else best[1]


def eps_estimate(p: Probe, dtype: Optional[Any] = None) -> Optional[EpsEstimate]:
    """The eps the implementation uses at the audit's eps (in ``dtype``,
    default the audit's), when its outputs on records whose variance is
    near eps clearly say another than the audit's; else None."""
    dt = p.dtype if dtype is None else np.dtype(dtype)
    tol = p.tol if dt == p.dtype else TOLERANCES[dt]
    d = p.d(16)
    base = p.eps if p.eps > 0 else 1e-4
    x = p.cast(_standard_rows(p.rng("eps in use"), len(EPS_RATIOS), d)
               * np.sqrt(EPS_RATIOS * base)[:, None], dt)
    try:
        got = p.rows(x, *p.identity_params(d, dt), dtype=dt)
    except ImplementationError:
        return None
    est = estimate_eps(p, x, got, tol)
    if est is None or est.matches(p.eps):
        return None
    if est.matches(0.0):
        return EpsEstimate(0.0, est.precision, est.slope)
    return est if est.value > 0 else None


def eps_in_use(p: Probe, dtype: Optional[Any] = None) -> float:
    """The eps the implementation uses at the audit's eps (in ``dtype``,
    default the audit's): the audit's eps, unless its outputs on records
    whose variance is near eps clearly say another (:func:`eps_estimate`).
    The models of the checks other than the eps check are built with it,
    so an implementation using another eps than declared is named once, by
    the eps check, and not blamed for a wrong variance or float16
    statistics."""
    est = eps_estimate(p, dtype)
    return p.eps if est is None else est.value


def _named_eps(est: EpsEstimate) -> str:
    """An estimated eps as a report names it: a round value (or one rounded
    to float32) it matches, else the estimate to its precision."""
    for c in COMMON_EPS:
        if est.matches(c):
            return f"{c:g}"
        for name, r in eps_roundings(c).items():
            if est.matches(r):
                return f"{r!r} ({c:g} rounded to {name})"
    digits = max(3, min(17, math.ceil(math.log10(abs(est.value) / est.precision)) + 1)
                 if est.precision > 0 and est.value != 0 else 3)
    return f"{est.value:.{digits}g}"


def fmt_in_use(est: EpsEstimate, declared: float) -> str:
    """An estimated eps in a figure: the declared value where it matches,
    else with the digits its precision resolves (and those that tell it
    from the declared)."""
    if est.matches(declared):
        return f"{declared:g}"
    digits = 3
    if est.precision > 0 and est.value != 0:
        digits = max(3, min(17, math.ceil(math.log10(abs(est.value) / est.precision))))
    return distinct(est.value, declared, digits)[0]


def describe_eps_in_use(p: ProbeBase[Any], declared: Sequence[float],
                        estimates: Sequence[EpsEstimate]) -> str:
    """What the estimated eps in use (one per eps probed) says of the
    implementation, in words: eps rounded to a narrower type, an eps of its
    own (built in, or hard-coded whatever the argument), a multiple of the
    eps given, or the values themselves."""
    from ._audit import eps_text as fmt_eps

    for name in ("float32", "float16", "bfloat16"):
        rounded = [eps_roundings(e).get(name, e) for e in declared]
        if (any(r != e for r, e in zip(rounded, declared))
                and all(est.matches(r) for est, r in zip(estimates, rounded))
                and not all(est.matches(e) for est, e in zip(estimates, declared))):
            pairs = ", ".join(f"{fmt_eps(r)} for eps={fmt_eps(e)}"
                              for r, e in zip(rounded, declared) if r != e)
            stored = ("as ONNX stores a LayerNormalization's epsilon, a float attribute"
                      if name == "float32" else f"in {name}, which eps must never be")
            return (f"eps rounded to {name}: the implementation uses {pairs}: the eps is "
                    f"stored as a {name} number ({stored}), which {p.dtype} outputs show. "
                    f"Declare the eps it uses (eps={fmt_eps(rounded[0])}) to audit the rest")
    first = estimates[0]
    if len(estimates) > 1 and all(first.matches(e.value) or e.matches(first.value)
                                  for e in estimates[1:]):
        return (f"the eps argument is ignored: the outputs fit eps = {_named_eps(first)} "
                "whatever eps is passed (" + ", ".join(f"{e:g}" for e in declared)
                + "): a hard-coded eps; the implementation must use the eps it is given")
    if not p.impl.takes_eps:
        named = _named_eps(first)
        return (f"another eps than declared: the outputs fit eps = {named}, not the "
                f"declared eps={fmt_eps(declared[0])}: the implementation has an eps of its "
                f"own (built in, or set when it was made); audit with eps={named.split()[0]} "
                "to check the rest")
    ratio = first.value / declared[0] if declared[0] > 0 else math.nan
    if math.isfinite(ratio) and all(e.matches(ratio * g) for e, g in zip(estimates, declared)):
        return f"the implementation uses {ratio:.3g} times the eps it is given"
    return ("the implementation uses eps = " + ", ".join(_named_eps(e) for e in estimates)
            + " for eps = " + ", ".join(f"{e:g}" for e in declared))


def eps_mismatch(p: ProbeBase[Any], xs: Sequence[NDArray[Any]],
                 outputs: Sequence[NDArray[Any]], eps_values: Sequence[float], tol: Tolerance,
                 fits: Callable[[List[float]], bool], scale: float = 1.0
                 ) -> Optional[Tuple[str, List[EpsEstimate]]]:
    """When the outputs of the eps check's records say the implementation
    uses another eps than declared (the correct formula, as ``fits``
    confirms, with another eps): the words for it and the estimates; else
    None."""
    estimates = [estimate_eps(p, x, y, tol, scale) for x, y in zip(xs, outputs)]
    known = [e for e in estimates if e is not None]
    if len(known) != len(estimates) or not fits([e.value for e in known]):
        return None
    return describe_eps_in_use(p, eps_values, known), known


def _fmt_ratio(r: float) -> str:
    """A ratio near 1 with the decimals that show how far from 1 it is."""
    if not math.isfinite(r) or r == 1:
        return fmt_value(r)
    return f"{r:.{max(4, min(16, math.ceil(-math.log10(abs(r - 1))) + 2))}f}"


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
    mean_err = np.abs(got.mean(axis=-1) - want.mean(axis=-1))
    ms_got, ms_want = (got * got).mean(axis=-1), (want * want).mean(axis=-1)
    ms_err = np.abs(ms_got - ms_want)
    # If every element is within tolerance of the reference, the record's
    # mean and mean square are within these bounds of the reference's.
    mean_bound, ms_bound = _moment_bounds(p.tol, want)
    mean_bad = mean_err > mean_bound
    ms_bad = ms_err > ms_bound
    figure = (f"max |mean| {np.nanmax(np.abs(got.mean(axis=-1))):.1g}, "
              f"max |mean sq - 1| {np.nanmax(np.abs(ms_got - 1)):.1g}")
    if not np.isfinite(got).all():
        return CheckResult("invariants", FAIL, figure, "non-finite outputs for plain records",
                           {"symptom": True})
    if mean_bad.any():
        i = int(np.argmax(mean_err / mean_bound))
        if mean_err[i] >= 0.01:
            return CheckResult("invariants", FAIL, figure,
                               f"records are not centred: output mean {got[i].mean():.3g} "
                               f"(expected 0) in record {i}: the record's own mean is not "
                               "subtracted from it (as in RMSNorm)",
                               {"claims": {"mean_subtracted": False}})
        return CheckResult("invariants", FAIL, figure,
                           f"output means drift from 0 by up to {mean_err[i]:.3g} (record {i}), "
                           f"more than {p.tol} allows: the mean is computed or subtracted with "
                           f"less precision than {p.dtype} needs")
    if ms_bad.any():
        i = int(np.argmax(ms_err / ms_bound))
        ratio = ms_got[i] / ms_want[i]
        got_ms, want_ms = distinct(ms_got[i], ms_want[i], 6)
        head = (f"output mean square {got_ms} instead of {want_ms} in record {i}, a ratio of "
                f"{_fmt_ratio(ratio)}")
        why, claims = _mean_square_explained(p, x[i], ms_got[i])
        # (Either way the variance or the eps check names the cause.)
        if why is None:
            return CheckResult("invariants", FAIL, figure,
                               f"{head}: the variance or its square root is wrong (see the "
                               "variance and eps checks)", {"named": False})
        return CheckResult("invariants", FAIL, figure, f"{head}{why}",
                           {"claims": claims, "named": False})
    return CheckResult("invariants", PASS, figure,
                       "every record comes out with mean 0 and mean square 1")


def _moment_bounds(tol: Tolerance, want: NDArray[Any]) -> Tuple[NDArray[Any], NDArray[Any]]:
    """How far each record's mean and mean square may be from ``want``'s
    when every element is within ``tol`` of it."""
    e = tol.atol + tol.rtol * np.abs(want)
    return e.mean(axis=-1), (e * (2 * np.abs(want) + e)).mean(axis=-1)


def _mean_square_explained(p: Probe, x: NDArray[Any], ms: float
                           ) -> Tuple[Optional[str], Dict[str, Any]]:
    """What explains a record's wrong output mean square ``ms``, decided
    with the same bound (so with a margin of the dtype's precision at this
    d): the sample variance (a ratio of (d - 1)/d), or the eps in use
    (another than declared). (None, {}) when neither does."""
    estimate = eps_estimate(p)
    used = p.eps if estimate is None else estimate.value
    candidates = [(1, p.eps)] + ([(0, used), (1, used)] if used != p.eps else [])
    fitting = []
    for ddof, eps in candidates:
        model = model_layer_norm(x[None], eps=eps, ddof=ddof)
        _, bound = _moment_bounds(p.tol, model)
        if abs(ms - float((model * model).mean())) <= float(bound[0]):
            fitting.append((ddof, eps))
    if not fitting:
        return None, {}
    ddof, eps = fitting[0]
    words, claims = "", {}
    if ddof:
        words = " = (d - 1)/d, the sample variance's"
        claims["denominator"] = "d-1"
    if eps != p.eps:
        from ._audit import eps_text as fmt_eps

        named = fmt_eps(eps) if estimate is None else _named_eps(estimate)
        words += (f"{' with' if ddof else ':'} the eps in use, {named}, not the declared "
                  f"{fmt_eps(p.eps)} (see the eps check)")
        claims["eps"] = "other"
        return words, claims
    return words + ": the variance or its square root is wrong (see the variance and eps checks)", \
        claims


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
    # The models use the eps in use: another eps than declared is the eps
    # check's business.
    result = _convention_fit(p, [x], [got], [eps_in_use(p)])
    ratio = _scale_ratio(got, p.reference(x))
    sample = math.sqrt((d - 1) / d)
    decimals = max(4, math.ceil(-math.log10(1 - sample)) + 1)
    figure = f"output/reference {ratio:.{decimals}f} (d - 1 gives {sample:.{decimals}f})"
    values: Dict[str, Any] = {"ratio": ratio, "sample_ratio": sample}
    population = any(result.fits((0, mode)) for mode in EPS_MODES)
    sample_fits = any(result.fits((1, mode)) for mode in EPS_MODES)
    if population and sample_fits:
        return CheckResult("variance", SKIP, figure,
                           f"the population and the sample variance cannot be told apart at "
                           f"d={d} in {p.dtype}: their outputs differ by a factor "
                           f"{sample:.{decimals}f}, within the tolerance", values)
    if population:
        return CheckResult("variance", PASS, figure, "population variance (divides by d)",
                           {**values, "claims": {"denominator": "d"}})
    if sample_fits:
        return CheckResult("variance", FAIL, figure,
                           f"sample variance: outputs are sqrt((d - 1)/d) = {sample:.4f} times "
                           f"the reference at d={d}, as if the variance were divided by d - 1 "
                           "instead of d (np.var(ddof=1), torch.var's unbiased default); use "
                           "the population variance", {**values, "claims": {"denominator": "d-1"}})
    return CheckResult("variance", FAIL, figure,
                       f"outputs are {ratio:.4f} times the reference; "
                       + _no_fit("variance convention, population (1) or sample "
                                 f"({sample:.4f})", result), {**values, "named": False})


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
    values: Dict[str, Any] = {"scores": {f"{k[1]}, ddof={k[0]}": v
                                         for k, v in result.scores.items()}}
    where = f"on records with variance 0.01 to 10 times eps (eps = {shown})"
    if any(result.fits((ddof, "variance")) for ddof in (0, 1)):
        return CheckResult("eps", PASS, figure,
                           f"eps added to the variance: {EPS_FORMULAS['variance']} at eps = "
                           f"{shown}", {**values, "claims": {"eps": "as declared",
                                                             "eps_placement": "variance"}})
    ddof, mode = result.best
    sample = " (with the sample variance, see the variance check)" if ddof else ""
    claims: Dict[str, Any] = {"denominator": "d-1"} if ddof else {}
    if result.fits():
        return CheckResult("eps", FAIL, figure,
                           f"{EPS_DEFECTS[mode]}: {where} the output fits {EPS_FORMULAS[mode]}"
                           f"{sample}; it must be {EPS_FORMULAS['variance']}",
                           {**values, "claims": {**claims, "eps_placement": mode}})

    def fits(in_use: List[float]) -> bool:
        return any(_convention_fit(p, xs, outputs, in_use).fits((k, "variance")) for k in (0, 1))

    mismatch = eps_mismatch(p, xs, outputs, eps_values, p.tol, fits)
    if mismatch is not None:
        words, estimates = mismatch
        slope = " (with the sample variance, see the variance check)" if \
            estimates[0].slope != 1 else ""
        return CheckResult("eps", FAIL, figure + "; eps in use " + ", ".join(
            fmt_in_use(e, g) for e, g in zip(estimates, eps_values)),
            f"{words}{slope} (read from records whose variance is 0.01 to 10 times eps)",
            {**values, "estimates": [e.value for e in estimates],
                      "claims": {"eps": "other", "eps_placement": "variance",
                                 **({"denominator": "d-1"} if slope else {})}})
    return CheckResult("eps", FAIL, figure, f"{where} " + _no_fit("eps placement", result),
                       {**values, "named": False})


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
            shown_inside, shown_alone = _fmt_rows_pair(inside, alone)
            alone_note = (f"record (3, 7) of a 10 x 10 batch gives {shown_inside} inside "
                          f"the batch but {shown_alone} alone (max difference "
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
                           + ". Each record must be normalized by its own statistics",
                           {**values, "claims": {"records": "coupled"}})
    if alone_note:
        return CheckResult("coupling", FAIL, figure,
                           f"a record's output depends on the batch around it: {alone_note}",
                           {**values, "claims": {"records": "coupled"}})
    return CheckResult("coupling", PASS, figure,
                       f"changing record {_fmt_index(at)} moved no other record"
                       + ("" if p.fixed_lead else
                          "; a record gives the same output alone and in a batch of 100"),
                       {**values, "claims": {"records": "independent"}})


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
    beyond = p.tol.worst(again, first) > 1
    nonfinite = nonfinite_words(again, first, "the first call's output")
    figure = (f"max change {change:.2g}" + ("" if beyond else f" ({ulps:.0f} ulp)")
              if nonfinite is None else "non-finite after other calls")
    if beyond:
        how = (f"max change {change:.3g}" if nonfinite is None else
               f"called again, it {nonfinite}")
        return CheckResult("state", FAIL, figure,
                           f"running statistics / state across calls: the same input gave a "
                           f"different output after {len(others)} other calls ({how}); the "
                           "output must depend only on the call's own input, not on "
                           "statistics kept from earlier calls")
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
                           "no cancellation: accurate with a common offset up to 1e4",
                           {**values, "claims": {"shift_invariant": True}})
    growth = _growth_per_decade(errors)
    nonfinite = [f"1e{math.log10(o):.0f}" for o, e in zip(OFFSETS, errors)
                 if not math.isfinite(e)]
    if not nonfinite and growth < 0.5:
        return CheckResult("cancellation", FAIL, figure,
                           "not shift-invariant: adding a common offset to every feature "
                           f"changes the output by {errors[0]:.3g} already at offset 1e2, and "
                           "not more at larger offsets; the record's mean is not (entirely) "
                           "subtracted (see the invariants check)",
                           {**values, "claims": {"shift_invariant": False}})
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


#: Feature sizes of the large-d check, by mode.
LARGE_D: Dict[str, Tuple[int, ...]] = {
    "quick": (2 ** 10, 2 ** 12, 2 ** 15, 2 ** 20),
    "default": (2 ** 10, 2 ** 12, 2 ** 14, 2 ** 16, 2 ** 18, 2 ** 20),
    "thorough": tuple(2 ** k for k in range(10, 23)),
}
#: The error (in units of the dtype's roundoff, relative to 1 + |output|)
#: any d may reach, per unit of log2(d), whatever the smallest d's: the
#: error bound of a pairwise sum grows with log d, and a kernel summing
#: pairwise or in blocks stays within a few units up to 2^22.
LARGE_D_FLOOR = 2.0
#: How many times the error at the smallest sizes (d = 2^10) the error may
#: reach, growing with log d from there.
LARGE_D_GROWTH = 4.0
#: The most elements one call of the large-d check passes (an
#: implementation with a fixed leading shape is called with whole batches).
LARGE_D_MAX_ELEMENTS = 2 ** 23


def large_d_sizes(p: ProbeBase[Any], name: str = "large_d") -> Union[List[int], CheckResult]:
    """The large-d check's feature sizes for the probe's mode, or the skip
    when the implementation cannot take them (a fixed d; a fixed leading
    shape too large to fill at these sizes)."""
    if p.impl.d is not None:
        return CheckResult(name, SKIP, f"d={p.impl.d}",
                           f"the implementation takes only d={p.impl.d}; this check compares "
                           "the error at d = 2^10 to 2^20")
    capacity = math.prod(p.impl.leading_shape) if p.impl.leading_shape is not None else 1
    sizes = [d for d in LARGE_D[p.mode] if capacity * d <= LARGE_D_MAX_ELEMENTS]
    if len(sizes) < 3:
        return CheckResult(name, SKIP, f"leading shape {p.impl.leading_shape}",
                           f"the fixed leading shape {p.impl.leading_shape} holds too many "
                           "records to call at d = 2^10 to 2^20 ")
    return sizes


#: The records of the large-d check: (scale, offset), the first n of them.
LARGE_D_RECORDS = ((0.5, 2.0), (1.0, 0.0), (2.0, -3.0), (1e-2, 0.05))


def large_d_records(rng: np.random.Generator, n: int, d: int) -> NDArray[Any]:
    """``n`` records of ``d`` features, each exactly of mean 0 and variance
    1 (before the cast) then scaled and offset: an offset of a few
    standard deviations makes a sum of x grow with d as a sum of squares
    does."""
    scale = np.array([s for s, _ in LARGE_D_RECORDS[:n]])[:, None]
    offset = np.array([o for _, o in LARGE_D_RECORDS[:n]])[:, None]
    rows: NDArray[Any] = _standard_rows(rng, n, d) * scale + offset
    return rows


def large_d_records_per_size(p: ProbeBase[Any]) -> int:
    """How many records the large-d check takes at each size."""
    return {"quick": 1, "default": 2, "thorough": 4}[p.mode]


def large_d_verdict(name: str, p: ProbeBase[Any], sizes: Sequence[int], errors: Sequence[float],
                    units: Sequence[float], what: str, sums: str,
                    floor: float = LARGE_D_FLOOR) -> CheckResult:
    """The large-d check's result from the error at each size (``errors``,
    as measured; ``units``, in units of the dtype's roundoff, relative to
    the output's scale): a failure where the error grows beyond both
    ``floor`` units per unit of log2(d) and :data:`LARGE_D_GROWTH` times
    the smallest sizes' error, grown with log d (``what`` is the output's
    name, ``sums`` what a kernel sums)."""
    table = ", ".join(f"{fmt_pow2(d)} {e:.2g}" for d, e in zip(sizes, errors))
    k = growth_exponent(sizes, units, floor=1.0)
    base = max(units[:2])
    per_log = max(floor, LARGE_D_GROWTH * base / math.log2(sizes[0]))
    limits = [per_log * math.log2(d) for d in sizes]
    values: Dict[str, Any] = {"errors": dict(zip(sizes, errors)),
                              "units": dict(zip(sizes, units)), "exponent": k,
                              "limits": dict(zip(sizes, limits))}
    last, top = fmt_pow2(sizes[-1]), fmt_pow2(sizes[-1])
    dt = str(p.dtype)
    nonfinite = [d for d, u in zip(sizes, units) if not math.isfinite(u)]
    if nonfinite:
        first = nonfinite[0]
        figure = f"non-finite {what} from d={fmt_pow2(first)}"
        if first == sizes[0]:
            return CheckResult(name, FAIL, figure,
                               f"non-finite {what} for plain records of d={fmt_pow2(first)}",
                               {**values, "claims": {"growth": "grows"}})
        finite_to = fmt_pow2(sizes[sizes.index(first) - 1])
        return CheckResult(name, FAIL, figure,
                           f"non-finite {what} at d = {fmt_pow2(first)} (finite up to "
                           f"d={finite_to}, max error by d: {table}): a sum overflows or a "
                           f"count or index wraps at large d ({sums} accumulated in a 16-bit "
                           "type, or a 16-bit counter)", {**values, "claims": {"growth": "grows"}})
    figure = f"error {errors[0]:.1g} at d={fmt_pow2(sizes[0])} to {errors[-1]:.1g} at {last}"
    over = [i for i, (u, lim) in enumerate(zip(units, limits)) if u > lim]
    if over:
        worst = max(over, key=lambda j: units[j] / limits[j])
        unit = unit_roundoff(p.dtype)
        return CheckResult(name, FAIL, figure,
                           f"the error grows with d ({fmt_growth(k)}): max {what} error by d: "
                           f"{table}. At d={fmt_pow2(sizes[worst])} it is {units[worst]:.3g} "
                           f"units of {dt}'s roundoff (2^{math.log2(unit):.0f}), where its "
                           f"{base:.2g} units at the smallest sizes allow {limits[worst]:.3g} and "
                           f"a kernel summing pairwise or in blocks stays within a few units up "
                           f"to 2^22: {sums} accumulated in one running sum (sequentially), "
                           "whose rounding error grows with d; sum pairwise or in blocks (as "
                           "NumPy, PyTorch and layernorm_c do) or accumulate in a wider type",
                           {**values, "claims": {"growth": "grows"}})
    large = max(units) > floor * math.log2(sizes[-1])
    return CheckResult(name, PASS, figure,
                       f"the error does not grow with d beyond what summing costs "
                       f"({fmt_growth(k)}): max {what} error by d: {table}; at most "
                       f"{max(units):.2g} units of {dt}'s roundoff up to d={top}"
                       + ("; an error this large at every d is the other checks' business"
                          if large else ""),
                       {**values, "claims": {"growth": "none"}})


@_check("large_d", "records of 2^10 to 2^20 features: the error does not grow with d")
def check_large_d(p: Probe) -> CheckResult:
    sizes = large_d_sizes(p)
    if isinstance(sizes, CheckResult):
        return sizes
    rng = p.rng("large_d")
    used = eps_in_use(p)
    unit = unit_roundoff(p.dtype)
    n = large_d_records_per_size(p)
    errors: List[float] = []
    units: List[float] = []
    for d in sizes:
        x = p.cast(large_d_records(rng, n, d))
        got = p.rows(x, *p.identity_params(d))
        err = 0.0
        worst = 0.0
        for i in range(n):
            # Record by record: the float64 reference of 2^22 features is large.
            want = p.reference(x[i:i + 1], eps=used)[0]
            with np.errstate(all="ignore"):
                u = np.abs(got[i] - want) / (unit * (1.0 + np.abs(want)))
            worst = max(worst, float(np.nan_to_num(u, nan=np.inf).max()))
            err = max(err, _max_abs_error(got[i], want))
        errors.append(err)
        units.append(worst)
    sums = ("the record's sums (its mean and variance) are" if p.op.key == "layer_norm" else
            "the sum of squares is")
    return large_d_verdict("large_d", p, sizes, errors, units, "output", sums)


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
    # (With the eps the implementation uses in float16: another eps than
    # declared is the eps check's business, not a float16 overflow.)
    used = eps_in_use(p, np.float16)
    return (got_small + p.reference(x, eps=used) - p.reference(small, eps=used),
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
    values: Dict[str, Any] = {"ulp": ulps[worst]}
    if ulps[worst] == 0:
        where = ", ".join(name for name, *_ in layouts)
        return CheckResult("batch_invariance", PASS, figure,
                           f"bit-identical: {len(records)} records give the same bits {where}",
                           values)
    status: Status = FAIL if p.strict_batch_invariance else WARN
    beyond = [i for i, y in enumerate(outputs) if p.tol.worst(y, outputs[0]) > 1]
    if beyond:
        # Beyond tolerance, ulps say nothing useful (0 against 0.5 is
        # billions of them): the difference itself, or in words.
        i = beyond[0]
        nonfinite = nonfinite_words(outputs[i], outputs[0], f"the same record {layouts[0][0]}")
        if nonfinite is not None:
            where = layouts[0][0] if not np.isfinite(outputs[0]).all() else layouts[i][0]
            figure = f"non-finite {where}"
            how = f"{layouts[i][0]}, it {nonfinite}"
        else:
            diff = _max_abs_error(outputs[i], outputs[0])
            figure = f"max difference {diff:.2g} (beyond tolerance)"
            how = (f"a record's output {layouts[0][0]} and {layouts[i][0]} differs by up to "
                   f"{diff:.3g}")
        return CheckResult("batch_invariance", status, figure,
                           f"not batch-invariant, beyond tolerance: {how} (see the coupling "
                           "check)", {**values, "claims": {"records": "coupled"}})
    return CheckResult("batch_invariance", status, figure,
                       f"not batch-invariant: max difference {ulps[worst]:.0f} ulp between "
                       f"a record {layouts[0][0]} and {layouts[worst][0]}: the reduction order "
                       "depends on the batch (size or position); many valid kernels are like "
                       "this, but results are then not reproducible across batch sizes", values)


#: The names of all checks, in the order they run.
CHECKS: Tuple[str, ...] = tuple(REGISTRY)
