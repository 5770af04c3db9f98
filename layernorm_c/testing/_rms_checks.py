"""The checks of the RMSNorm battery.

The checks that do not depend on the op (contract, reference, coupling,
state, float16 overflow, NaN/Inf containment, batch invariance) are the
LayerNorm battery's, reading the op's reference and words from the probe.
The others are RMSNorm's own. The normalization is read as the LayerNorm
battery reads it: the output at a weight of ones is fitted against float64
models of every combination of the defects (mean subtracted, mean square
divided by d - 1, square root missing, eps placement, and the weight
convention mistaken, which scales the output at a weight of ones by 2 or
1/2), and a check names its own defect only when no model without it fits,
whatever the other dimensions; so one defect never makes another check
blame a second one.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from numpy.typing import NDArray

from .._cases import RMS_WORKED_EXAMPLES
from ._checks import (REGISTRY, Check, _check, _fmt_numbers, _identical, _no_fit, _scale_ratio,
                      _no_eps, _standard_rows, _unrepeatable, eps_in_use, eps_mismatch, eps_probes,
                      eps_runs, float16_overflow, fmt_in_use, hand_rows)
from ._numerics import RMS_EPS_MODES, TOLERANCES, Fit, fit, model_rms_norm
from ._ops import bfloat16, unit_roundoff
from ._probe import ImplementationError, Param, Params, Probe
from ._report import FAIL, PASS, SKIP, WARN, CheckResult

__all__ = ["RMS_CHECKS", "RMS_REGISTRY"]

RMS_REGISTRY: Dict[str, Check] = {}


def _shared(name: str, title: Optional[str] = None) -> None:
    """Take a LayerNorm check as it is (with its own title, or ``title``)."""
    check = REGISTRY[name]
    RMS_REGISTRY[name] = Check(name, check.title if title is None else title, check.run)


def _unit_params(p: Probe, d: int, dtype: Optional[Any] = None) -> Params:
    """A weight of ones: it scales by 1 (``weight``) or 2 (``1 + weight``),
    and by the other under the other convention; never by 0."""
    return p.params(np.ones(d), None, dtype)


def _unit_scales(p: Probe) -> Tuple[float, float]:
    """What a weight of ones scales by, under the audit's convention and
    under the other one (1.0 both when the implementation takes no weight)."""
    if not p.impl.takes_weight:
        return 1.0, 1.0
    return (2.0, 1.0) if p.op.plus_one else (1.0, 2.0)


# -- the normalization: one fit of every combination of defects ---------------

#: A model's key: (mean subtracted, ddof, square root, eps placement,
#: weight convention as audited).
NormKey = Tuple[bool, int, bool, str, bool]


def _norm_keys() -> List[NormKey]:
    keys: List[NormKey] = []
    for convention in (True, False):
        for centered in (False, True):
            for ddof in (0, 1):
                for root in (True, False):
                    for mode in RMS_EPS_MODES:
                        if root or mode != "outside":  # without a root, outside is inside
                            keys.append((centered, ddof, root, mode, convention))
    return keys


NORM_KEYS = _norm_keys()


def _norm_fit(p: Probe, xs: Sequence[NDArray[Any]], outputs: Sequence[NDArray[Any]],
              eps_values: Sequence[float]) -> Fit[NormKey]:
    """Fit outputs (at a weight of ones) against every model; the correct one
    is listed first, so it wins ties."""
    right, other = _unit_scales(p)
    models = {
        key: [model_rms_norm(x, e, centered=key[0], ddof=key[1], root=key[2], eps_mode=key[3])
              * (right if key[4] else other) for x, e in zip(xs, eps_values)]
        for key in NORM_KEYS
    }
    return fit(list(outputs), models, p.tol)


def _fmt_model(key: NormKey) -> str:
    centered, ddof, root, mode, _ = key
    top = "(x - mean)" if centered else "x"
    ms = "mean((x - mean)^2)" if centered else "mean(x^2)"
    if ddof:
        ms = ms.replace("mean(", "sum(", 1) + " / (d - 1)"
    inner = {"inside": f"{ms} + eps", "outside": ms, "ignored": ms, "twice": f"{ms} + 2*eps"}[mode]
    denominator = f"sqrt({inner})" if root else f"({inner})"
    if mode == "outside":
        denominator = f"({denominator} + eps)"
    return f"{top} / {denominator}"


CORRECT_FORMULA = "x / sqrt(mean(x^2) + eps)"


def _scaled_records(rng: np.random.Generator, n: int, d: int, eps: float,
                    offsets: bool = True) -> NDArray[Any]:
    """Records with a mean square of at least 1e6 eps (so eps hardly
    matters), each with its own scale and, by default, its own mean."""
    scale = min(max(1.0, 1e3 * math.sqrt(eps)), 1e3)
    z = _standard_rows(rng, n, d)
    if offsets:
        z = z + rng.uniform(-2.0, 2.0, (n, 1))
    rows: NDArray[Any] = z * scale * np.exp(rng.uniform(0.0, 1.0, (n, 1)))
    return rows


def _measure(p: Probe, stream: str, d: int, offsets: bool = True
             ) -> Tuple[NDArray[Any], NDArray[Any], Fit[NormKey]]:
    rng = p.rng(stream)
    x = p.cast(_scaled_records(rng, 16, d, p.eps, offsets))
    got = p.rows(x, *_unit_params(p, d))
    # The models use the eps in use: another eps than declared is the eps
    # check's business.
    return x, got, _norm_fit(p, [x], [got], [eps_in_use(p)])


#: What each normalization check's dimension of the models is, as a
#: report's claims name it (see :func:`~._report.contradictions`).
CLAIMS = {0: "mean_subtracted", 1: "denominator", 2: "root", 3: "eps_placement"}
CLAIM_VALUES = {1: {0: "d", 1: "d-1"}}


def _decide(name: str, result: Fit[NormKey], dim: int, correct: Any, figure: str,
            passed: str, named: Callable[[Any], str], nothing: str,
            values: Optional[Dict[str, Any]] = None, d: Optional[int] = None,
            dtype: Any = None) -> CheckResult:
    """A normalization check's result from the fit, by its own dimension of
    the models: passed where models with it correct fit and none with it
    wrong does, the defect ``named(value)`` where only models with one
    wrong value fit; skipped where both fit (the tolerance cannot tell them
    apart at this ``d`` and ``dtype``)."""
    values = {**(values or {}), "scores": _scores(result)}
    fitting = [k for k in result.scores if result.fits(k)]
    found = sorted({k[dim] for k in fitting}, key=str)

    def claim(value: Any) -> Dict[str, Any]:
        return {**values, "claims": {CLAIMS[dim]: CLAIM_VALUES.get(dim, {}).get(value, value)}}

    if correct in found and len(found) > 1:
        return CheckResult(name, SKIP, figure,
                           "the output fits both " + " and ".join(
                               named(v) for v in [correct] + [v for v in found if v != correct])
                           + (f": the tolerance cannot tell them apart at d={d} in {dtype}"
                              if d is not None else ": the tolerance cannot tell them apart"),
                           values)
    if correct in found:
        return CheckResult(name, PASS, figure, passed, claim(correct))
    if len(found) == 1:
        return CheckResult(name, FAIL, figure, named(found[0]), claim(found[0]))
    if found:
        return CheckResult(name, FAIL, figure,
                           "the output is wrong, and the tolerance is too loose to tell which "
                           f"defect it is: it fits {' and '.join(named(v) for v in found)}",
                           values)
    return CheckResult(name, FAIL, figure, nothing + _no_fit("model of these defects", result),
                       {**values, "named": False})


def _scores(result: Fit[NormKey]) -> Dict[str, float]:
    return {_fmt_model(k) + ("" if k[4] else " (other convention)"): v
            for k, v in result.scores.items()}


# -- the checks ----------------------------------------------------------------

_shared("contract")


@_check("hand_rows", "the worked examples [3, 4] and [1, 2, 3, 4]", RMS_REGISTRY)
def check_hand_rows(p: Probe) -> CheckResult:
    return hand_rows(p, [(ex.row, f"{_fmt_numbers(ex.row)} (mean square {ex.ms:g})")
                         for ex in RMS_WORKED_EXAMPLES])


_shared("reference", "agreement with reference_rms_norm (float64) on random data")


@_check("centering", "the record's mean is not subtracted (an RMSNorm, not a LayerNorm)",
        RMS_REGISTRY)
def check_centering(p: Probe) -> CheckResult:
    d = p.d(16)
    if d < 2:
        return CheckResult("centering", SKIP, f"d={d}", "needs at least 2 features")
    x, got, result = _measure(p, "centering", d)
    with np.errstate(all="ignore"):
        mean_out = float(np.max(np.abs(got.mean(axis=-1)))) / _unit_scales(p)[0]
    return _decide("centering", result, 0, False, f"max |output mean| {mean_out:.2g}",
                   "the records' means are kept: x is not centred before scaling",
                   lambda centered: ("mean subtracted: every record comes out with mean 0, as "
                                     "(x - mean) / sqrt(var + eps): that is a LayerNorm, not an "
                                     f"RMSNorm, which is {CORRECT_FORMULA} and keeps the mean"
                                     if centered else "mean kept"),
                   "the output is neither an RMSNorm nor a LayerNorm: ")


@_check("mean_square", "the mean square divides by d, not d - 1", RMS_REGISTRY)
def check_mean_square(p: Probe) -> CheckResult:
    d = p.d(8)
    if d < 2:
        return CheckResult("mean_square", SKIP, f"d={d}", "needs at least 2 features")
    x, got, result = _measure(p, "mean_square", d)
    ratio = _scale_ratio(got, p.reference(x, *_unit_params(p, d)))
    sample = math.sqrt((d - 1) / d)
    return _decide("mean_square", result, 1, 0,
                   f"output/reference {ratio:.4f} (d - 1 gives {sample:.4f})",
                   "mean square divides by d",
                   lambda ddof: (f"divided by d - 1: outputs are sqrt((d - 1)/d) = {sample:.4f} "
                                 f"times the reference at d={d}, as if the sum of squares were "
                                 "divided by d - 1 instead of d (a sample-variance habit); the "
                                 "mean square is sum(x^2) / d" if ddof else "divided by d"),
                   f"outputs are {ratio:.4f} times the reference (d - 1 gives {sample:.4f}); ",
                   {"ratio": ratio, "sample_ratio": sample}, d, p.dtype)


@_check("root", "divides by the square root of the mean square", RMS_REGISTRY)
def check_root(p: Probe) -> CheckResult:
    d = p.d(16)
    rng = p.rng("root")
    # Records whose mean squares span 1e-2 to 1e2 times a unit, all far above eps.
    base = min(max(1.0, 1e3 * math.sqrt(p.eps)), 1e3)
    spreads = base * np.sqrt(np.logspace(-2, 2, 8))[:, None]
    x = p.cast(_standard_rows(rng, 8, d) * spreads)
    got = p.rows(x, *_unit_params(p, d))
    result = _norm_fit(p, [x], [got], [eps_in_use(p)])
    want = p.reference(x, *_unit_params(p, d))
    low, high = _scale_ratio(got[0], want[0]), _scale_ratio(got[-1], want[-1])
    return _decide("root", result, 2, True,
                   f"output/reference x{low:.3g} at mean square 1e-2, x{high:.3g} at 1e2",
                   "the output does not depend on the record's scale: divided by the root of "
                   "the mean square",
                   lambda root: ("divided by the root mean square" if root else
                                 "square root missing: the output scales as 1 / x (it is "
                                 "x / (mean(x^2) + eps)); RMSNorm divides by the root mean "
                                 f"square, {CORRECT_FORMULA}"), "")


#: How each eps placement reads in a report.
RMS_EPS_DEFECTS = {
    "outside": "eps outside the square root: x / (sqrt(mean(x^2)) + eps)",
    "ignored": "eps ignored: x / sqrt(mean(x^2))",
    "twice": "eps applied twice: x / sqrt(mean(x^2) + 2*eps)",
}


@_check("eps", "eps added once to the mean square, inside the square root", RMS_REGISTRY)
def check_eps(p: Probe) -> CheckResult:
    eps_values = eps_probes(p)
    if not eps_values:
        return _no_eps()
    xs, outputs, ratio = eps_runs(p, eps_values, _unit_params(p, p.d(16)))
    result = _norm_fit(p, xs, outputs, eps_values)
    shown = ", ".join(f"{e:g}" for e in eps_values)
    where = f"on records with mean square 0.01 to 10 times eps (eps = {shown})"
    figure = f"ms = eps record x{ratio:.3f} of reference"
    if not any(result.fits(k) for k in result.scores):
        # None fits with the declared eps: the correct formula with another?
        def fits(in_use: List[float]) -> bool:
            other = _norm_fit(p, xs, outputs, in_use)
            return any(other.fits(k) for k in other.scores if k[3] == "inside" and k[2]
                       and k[4] and not k[0])

        mismatch = eps_mismatch(p, xs, outputs, eps_values, p.tol, fits, _unit_scales(p)[0])
        if mismatch is not None:
            words, estimates = mismatch
            return CheckResult("eps", FAIL, figure + "; eps in use " + ", ".join(
                fmt_in_use(e, g) for e, g in zip(estimates, eps_values)),
                f"{words} (read from records whose mean square is 0.01 to 10 times eps)",
                {"estimates": [e.value for e in estimates],
                 "claims": {"eps": "other", "eps_placement": "inside"}})
    return _decide("eps", result, 3, "inside", figure,
                   f"eps added to the mean square: {CORRECT_FORMULA} at eps = {shown}",
                   lambda mode: (f"{RMS_EPS_DEFECTS[mode]} {where}; it must be {CORRECT_FORMULA}"
                                 if mode in RMS_EPS_DEFECTS else "eps inside the square root"),
                   f"{where}: ")


#: The weight conventions and defects the scale check fits. ``{convention}``
#: is the audited one, ``{other}`` the other.
SCALE_DEFECTS = {
    "missing": "weight missing: the output is the same whatever the weight, which is never "
               "applied",
    "before": "weight applied before normalization: normalize(x * weight), so the "
              "normalization undoes most of it",
    "first": "weight not per-feature: weight[0] scales every feature",
    "scalar": "weight not per-feature: one scalar (the mean of the scale) scales every feature",
    "wrong_axis": "weight broadcast on the wrong axis: weight[i] is applied to record i "
                  "instead of feature i",
}
SCALE_FORMULAS = {"weight": "x_normed * weight", "1+weight": "x_normed * (1 + weight)"}


def no_weight(name: str) -> CheckResult:
    """A check of the weight, skipped: the implementation takes none."""
    return CheckResult(name, SKIP, "no weight", "the implementation takes no weight")


def _other_convention(p: Probe) -> str:
    return "weight" if p.op.plus_one else "1+weight"


def _convention_words(p: Probe) -> str:
    if p.op.plus_one:
        return ("the weight convention mistaken: the output is x_normed * weight (LLaMA, T5), "
                "where this audit expects x_normed * (1 + weight) (Gemma); if weight is meant, "
                "audit with convention='weight'")
    return ("the 1 + weight convention mistaken for weight: the output is "
            "x_normed * (1 + weight) (Gemma), where this audit expects x_normed * weight "
            "(LLaMA, T5); if 1 + weight is meant, audit with convention='1+weight'")


@_check("scale", "the weight scales each feature after normalization, in the audited "
                 "convention (weight or 1 + weight)", RMS_REGISTRY)
def check_scale(p: Probe) -> CheckResult:
    if not p.impl.takes_weight:
        return no_weight("scale")
    d = p.d(8)
    rng = p.rng("scale")
    # d records of d features: a weight broadcast over records still runs.
    x = p.cast(_scaled_records(rng, d, d, p.eps))
    first = np.ones(d)
    first[0] = 2.0
    # Weights whose scale, in the audited convention, is [2, 1, 1, ...] and random.
    weights = [first - 1.0 if p.op.plus_one else first, p.random_params(rng, d)[0]]
    outputs = [p.rows(x, *p.params(w)) for w in weights]
    ones = _unit_params(p, d)
    base = p.rows(x, *ones)
    right, alt = _unit_scales(p)
    other = _other_convention(p)

    def scale_of(w: NDArray[Any], convention: str) -> NDArray[Any]:
        s: NDArray[Any] = np.asarray(w, np.float64) + (1.0 if convention == "1+weight" else 0.0)
        return s

    normed = base / right
    predictions = []
    for w in weights:
        s = scale_of(w, p.op.convention)
        pred = {
            "correct": normed * s,
            "convention": base / alt * scale_of(w, other),
            "missing": base,
            "before": p.rows(x * s / right, *ones),
            "first": normed * s[0],
            "scalar": normed * s.mean(),
        }
        if x.shape[0] == d:
            pred["wrong_axis"] = normed * s[:, None]
        predictions.append(pred)
    result = fit(outputs, {k: [pr[k] for pr in predictions] for k in predictions[0]}, p.tol)
    first_ratio = _scale_ratio(outputs[0][:, 0], normed[:, 0])
    others = _scale_ratio(outputs[0][:, 1:], normed[:, 1:])
    figure = f"scale [2, 1, ...]: feature 0 x{first_ratio:.3g}, others x{others:.3g}"
    expected = SCALE_FORMULAS[p.op.convention]
    if result.fits("correct"):
        return CheckResult("scale", PASS, figure, f"per-feature scale after normalization: "
                                                  f"{expected}")
    fitting = [k for k in result.scores if result.fits(k)]
    if not fitting:
        return CheckResult("scale", FAIL, figure, _no_fit("known weight convention", result))
    if len(fitting) > 1:
        return CheckResult("scale", FAIL, figure,
                           "the output is wrong, and the tolerance is too loose to tell which "
                           f"weight defect it is: it fits {' and '.join(fitting)}")
    key = fitting[0]
    if key == "convention":
        return CheckResult("scale", FAIL, figure, _convention_words(p))
    words = SCALE_DEFECTS[key]
    if key in ("first", "scalar"):
        words += (f" (a scale of 2 on feature 0 scaled it by {first_ratio:.3g} and the others "
                  f"by {others:.3g}; expected 2 and 1)")
    return CheckResult("scale", FAIL, figure, f"{words}; expected {expected}")


_shared("coupling")
_shared("state")
def _in_float32(p: Probe, x: NDArray[Any], weight: Param) -> Tuple[NDArray[Any], str]:
    """The same records (exact in float32) through the same implementation
    in float32, where nothing overflows: whatever differs is the cost of
    computing in float16, whatever else the implementation gets wrong (the
    reference, for an implementation that only takes float16)."""
    try:
        return (p.rows(x.astype(np.float32), *p.identity_params(x.shape[-1], np.float32),
                       dtype=np.float32), "the same records in float32")
    except ImplementationError:
        return p.reference(x, weight), "reference_rms_norm"


@_check("float16_overflow", "float16 inputs up to 65504 give finite, accurate outputs (x^2 "
                            "overflows float16 above 256)", RMS_REGISTRY)
def check_float16_overflow(p: Probe) -> CheckResult:
    return float16_overflow(p, _in_float32)


#: Feature sizes of the accumulation check.
ACCUMULATION_D = (64, 512, 4096)


def _low_precision(p: Probe) -> np.dtype[Any]:
    """The dtype the accumulation check feeds: the audit's if it is 16-bit,
    else float16."""
    bf16 = bfloat16()
    if p.dtype == np.float16 or (bf16 is not None and p.dtype == bf16):
        return p.dtype
    return np.dtype(np.float16)


@_check("accumulation", "16-bit inputs: the mean square accumulated in float32, not in "
                        "float16 or bfloat16", RMS_REGISTRY)
def check_accumulation(p: Probe) -> CheckResult:
    low = _low_precision(p)
    unit = unit_roundoff(low)
    sizes = (p.impl.d,) if p.impl.d is not None else ACCUMULATION_D
    rng = p.rng("accumulation")
    tol = p.tol if p.dtype == low else TOLERANCES[low]
    errors: List[float] = []
    allowed: List[float] = []
    for d in sizes:
        # A mean square near 8 (sums of squares stay below 65504 to d=4096:
        # no overflow in float16, only rounding), records exact in `low`.
        rms = math.sqrt(min(8.0, 30000.0 / d))
        x = p.cast(p.cast(rng.standard_normal((8, d)) * rms, low).astype(np.float64), low)
        unit_w = _unit_params(p, d, low)
        try:
            got = p.rows(x, *unit_w, dtype=low)
        except ImplementationError as exc:
            if not exc.figure.startswith("raised"):
                raise
            return CheckResult("accumulation", SKIP, f"no {low}",
                               f"does not accept {low} input: {exc}")
        if d == sizes[0] and not _identical(p.rows(x, *unit_w, dtype=low), got):
            return _unrepeatable("accumulation")
        # The same records in float32, through the same implementation: a
        # defect of the formula shows in both; what differs is the cost of
        # computing in `low`.
        try:
            wide = p.rows(x.astype(np.float32), *_unit_params(p, d, np.float32),
                          dtype=np.float32)
        except ImplementationError:
            wide = p.reference(x, *_unit_params(p, d, np.float32))
        with np.errstate(all="ignore"):
            ratio = np.sum(got * wide, axis=-1) / np.sum(wide * wide, axis=-1)
            ms_error = np.abs(1.0 / (ratio * ratio) - 1.0)
        errors.append(float(np.nan_to_num(ms_error, nan=np.inf).max()))
        allowed.append(tol.rtol)
    shown = " / ".join(f"{e:.1g}" for e in errors)
    figure = (f"mean square off by {shown} at d = " + "/".join(str(d) for d in sizes))
    values = {"errors": dict(zip(sizes, errors)), "unit_roundoff": unit}
    worst = int(np.argmax(errors))
    where = f"{low} records of d={sizes[worst]}"
    if errors[worst] > 2 * tol.rtol or not math.isfinite(errors[worst]):
        grows = (len(errors) > 1 and errors[-1] > 2 * errors[0])
        return CheckResult("accumulation", FAIL, figure,
                           f"statistics accumulated in {low}: on {where} the mean square the "
                           f"output implies is off by {errors[worst]:.2g} relative "
                           f"({errors[worst] / unit:.0f} units of {low}'s roundoff "
                           f"2^{math.log2(unit):.0f})"
                           + (", and the error grows with d" if grows else "")
                           + f"; accumulate the sum of squares in float32 and round once", values)
    if errors[worst] > 8 * unit:
        return CheckResult("accumulation", WARN, figure,
                           f"statistics accumulated in {low}? On {where} the mean square the "
                           f"output implies is off by {errors[worst]:.2g} relative "
                           f"({errors[worst] / unit:.0f} units of {low}'s roundoff), within "
                           "tolerance but more than a float32 accumulation loses", values)
    return CheckResult("accumulation", PASS, figure,
                       f"the mean square of {low} records is accurate to "
                       f"{errors[worst] / unit:.2g} units of {low}'s roundoff up to "
                       f"d={max(sizes)}", values)


_shared("large_d")
_shared("nonfinite")
_shared("batch_invariance")

#: The names of the RMSNorm checks, in the order they run.
RMS_CHECKS: Tuple[str, ...] = tuple(RMS_REGISTRY)
