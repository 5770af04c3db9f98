"""The checks of the backward battery, one function per defect.

Each check builds its own inputs ``(dy, x, weight, bias)``, calls the
backward through a :class:`~._backward_probe.BackwardProbe`, measures, and
returns a :class:`~._report.CheckResult` whose diagnosis names the defect.

Most defects of dx are read from one measurement: a correct dx, and each
defect's, is per record a combination ``sign * r * g + beta + gamma * c`` of
``g = dy * weight``, a constant and ``c = x - mean(x)`` (see
:mod:`._backward_numerics`). Regressing the measured dx on those three gives
the reciprocal standard deviation the backward used (its variance
convention and its eps) and the factors of the terms through the mean and
through the variance (a statistic treated as a constant, a sign error). Each
check then fits float64 models of the defects it names, built on what the
others measure, so one defect does not blur another's diagnosis, and names
the best fit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import NDArray

from .._cases import WORKED_EXAMPLES
from ._backward_adapters import Grads
from ._backward_numerics import (BackwardTolerance, Decomposition, Terms, decompose_dx,
                                 model_dx)
from ._backward_probe import BackwardProbe
from ._checks import (COUPLING_DEFECTS, OFFSETS, _coupling_kind, _fmt_index, _fmt_indices,
                      _fmt_row, _fmt_rows_pair, _gives, _growth_per_decade, _identical,
                      _no_eps, _standard_rows, eps_probes, large_d_records,
                      large_d_records_per_size, large_d_sizes, large_d_verdict)
from ._numerics import K, Fit, distinct, eps_roundings, fit, nonfinite_words, ulp_distance
from ._ops import is_float, unit_roundoff
from ._probe import ImplementationError, Param
from ._report import FAIL, PASS, SKIP, WARN, CheckResult

__all__ = ["BackwardCheck", "BACKWARD_CHECKS", "BACKWARD_REGISTRY", "run_backward_check"]


@dataclass(frozen=True)
class BackwardCheck:
    """One backward check: its name, what it verifies, the function running it."""

    name: str
    title: str
    run: Callable[[BackwardProbe], CheckResult]


BACKWARD_REGISTRY: Dict[str, BackwardCheck] = {}

CheckFunction = Callable[[BackwardProbe], CheckResult]


def _check(name: str, title: str, registry: Optional[Dict[str, BackwardCheck]] = None
           ) -> Callable[[CheckFunction], CheckFunction]:
    """Register a backward check in ``registry`` (default LayerNorm's)."""
    def register(run: CheckFunction) -> CheckFunction:
        (BACKWARD_REGISTRY if registry is None else registry)[name] = BackwardCheck(name, title,
                                                                                    run)
        return run
    return register


def run_backward_check(name: str, probe: BackwardProbe,
                       registry: Optional[Mapping[str, BackwardCheck]] = None) -> CheckResult:
    """Run one backward check of ``registry`` (default LayerNorm's); an
    implementation that raises or returns a wrong shape fails it with that
    message."""
    try:
        return (BACKWARD_REGISTRY if registry is None else registry)[name].run(probe)
    except ImplementationError as exc:
        return CheckResult(name, FAIL, exc.figure, str(exc))


# -- small helpers ------------------------------------------------------------

def _no_fit(what: str, result: Fit[Any]) -> str:
    return (f"matches no {what} (the closest is off by {result.scores[result.best]:.3g} x "
            "tol); another failed check may name a defect that hides this one")


def _unrepeatable(name: str, what: str = "dx") -> CheckResult:
    return CheckResult(name, SKIP, "not repeatable",
                       f"the same input gives a different {what} from call to call (see the "
                       "state check), so this cannot be measured")


def _repeats_params(p: BackwardProbe, first: Grads, again: Grads, d: int) -> bool:
    """Whether two calls on the same input gave the same parameter
    gradients, to within tolerance (bits may differ: that is the
    param_invariance check's business)."""
    tol = p.tol(d)
    for a, b in ((first.dweight, again.dweight), (first.dbias, again.dbias)):
        if a is None or b is None:
            continue
        if a.shape != b.shape:
            return False
        m = np.abs(a.astype(np.float64)) + np.abs(b.astype(np.float64))
        if m.ndim != 1:
            m = m.reshape(-1, d).max(axis=0)
        if _max(tol.param_units(b.astype(np.float64).reshape(-1, d),
                                a.astype(np.float64).reshape(-1, d), m)) > 1:
            return False
    return True


def _needs_param(p: BackwardProbe, name: str, which: str = "dweight or dbias") -> CheckResult:
    return CheckResult(name, SKIP, "no parameter gradients",
                       f"{p.impl.name} returns no {which}")


def _designed_dy(p: BackwardProbe, rng: np.random.Generator, x: NDArray[Any],
                 weight: Param) -> NDArray[Any]:
    """dy for records ``x`` (cast, ``(n, d)``) such that ``g = dy * weight``
    has a large mean and a large correlation with ``x - mean(x)`` in every
    record: the terms of dx through the mean and through the variance are
    then as large as the one through ``g``, and each defect shows."""
    x64 = x.astype(np.float64)
    c = x64 - x64.mean(axis=-1, keepdims=True)
    rms = np.sqrt((c * c).mean(axis=-1, keepdims=True))
    cn = c / np.where(rms > 0, rms, 1.0)
    n = x.shape[0]
    k1 = rng.choice([-1.0, 1.0], (n, 1)) * rng.uniform(0.6, 1.0, (n, 1))
    k2 = rng.choice([-1.0, 1.0], (n, 1)) * rng.uniform(0.6, 1.0, (n, 1))
    g = rng.standard_normal(x.shape) + k1 + k2 * cn
    w64 = 1.0 if weight is None else p.op.scale(weight.astype(np.float64))
    return p.cast(g / w64)


def _worst_at(units: NDArray[Any]) -> Tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(units)), units.shape))


def _max(a: NDArray[Any]) -> float:
    if not a.size:
        return 0.0
    return float(np.nan_to_num(np.asarray(a, np.float64), nan=np.inf).max())


def _dx_units(tol: BackwardTolerance, got: NDArray[Any], want: NDArray[Any], t: Terms) -> NDArray[Any]:
    return tol.dx_units(got.reshape(t.g.shape), want.reshape(t.g.shape), t.scale)


def _dweight_sizes(dy: NDArray[Any], xhat: NDArray[Any]) -> NDArray[Any]:
    """The size of each record's term of dweight: ``|dy| * max(1, |xhat|)``
    (xhat is computed to a few ulps of the record's scale, 1, not of its
    own value, which may be near 0)."""
    out: NDArray[Any] = np.abs(np.asarray(dy, np.float64)) * np.maximum(1.0, np.abs(xhat))
    return out


def _param_magnitudes(dy: NDArray[Any], xhat: NDArray[Any]) -> Tuple[NDArray[Any], NDArray[Any]]:
    """Per feature, the sums over the records of the sizes of dweight's and
    dbias's terms (see :func:`_dweight_sizes`)."""
    d = dy.shape[-1]
    dy64 = np.asarray(dy, np.float64).reshape(-1, d)
    return (_dweight_sizes(dy64, xhat.reshape(-1, d)).sum(axis=0), np.abs(dy64).sum(axis=0))


def _grads_identical(a: Grads, b: Grads, dx_only: bool = True) -> bool:
    if not _identical(a.dx, b.dx):
        return False
    if dx_only:
        return True
    return all(u is None or v is None or _identical(u, v)
               for u, v in ((a.dweight, b.dweight), (a.dbias, b.dbias)))


def _max_ulps(a: Optional[NDArray[Any]], b: Optional[NDArray[Any]]) -> float:
    if a is None or b is None:
        return 0.0
    return float(ulp_distance(a, b).max()) if a.size else 0.0


# -- the checks ----------------------------------------------------------------

@_check("contract", "dx shaped like x in x's dtype, dweight and dbias shaped (d,); inputs "
                    "left unchanged")
def check_contract(p: BackwardProbe) -> CheckResult:
    d = p.d(16)
    lead = p.lead((6,))
    rng = p.rng("contract")
    x = p.cast(rng.standard_normal(lead + (d,)) * 2 + 1)
    dy = p.cast(rng.standard_normal(lead + (d,)))
    w, b = p.params(*p.random_params(rng, d))
    inputs = {"dy": dy, "x": x, "weight": w, "bias": b}
    before = {k: v.copy() for k, v in inputs.items() if v is not None}
    got = p.call_raw(dy, x, w, b, copy=False)
    params = [f"{n} {a.dtype}{list(a.shape)}" for n, a in (("dweight", got.dweight),
                                                          ("dbias", got.dbias))
              if a is not None]
    figure = f"dx {got.dx.dtype}{list(got.dx.shape)}" + "".join(f", {s}" for s in params)
    modified = [k for k, v in before.items()
                if not np.array_equal(v, np.asarray(inputs[k]), equal_nan=True)]
    if modified:
        return CheckResult("contract", FAIL, figure,
                           f"modifies its input {' and '.join(modified)} in place; a backward "
                           "must leave its arguments unchanged (write to new arrays)")
    outputs = {"dx": got.dx, "dweight": got.dweight, "dbias": got.dbias}
    bad = [k for k, v in outputs.items() if v is not None and not np.isfinite(v).all()]
    if bad:
        return CheckResult("contract", FAIL, figure,
                           f"non-finite {' and '.join(bad)} for finite, well-scaled input")
    kinds = [k for k, v in outputs.items() if v is not None and not is_float(v.dtype)]
    if kinds:
        return CheckResult("contract", FAIL, figure,
                           f"{' and '.join(kinds)} not floating point: gradients are real "
                           "numbers")
    missing = [k for k, ret in (("dweight", p.impl.returns_dweight),
                                ("dbias", p.impl.returns_dbias))
               if not ret and (k == "dweight" or p.op.key == "layer_norm")]
    note = (f"; returns no {' or '.join(missing)}, whose checks are skipped" if missing else "")
    if got.dx.dtype.itemsize < x.dtype.itemsize:
        return CheckResult("contract", WARN, figure,
                           f"returns dx in {got.dx.dtype} for {x.dtype} input: precision is lost "
                           "on the way out (for JAX, enable jax_enable_x64)" + note)
    narrow = [k for k in ("dweight", "dbias") if outputs[k] is not None
              and outputs[k].dtype.itemsize < x.dtype.itemsize]  # type: ignore[union-attr]
    if narrow:
        return CheckResult("contract", WARN, figure,
                           f"returns {' and '.join(narrow)} narrower than the {x.dtype} input: "
                           "precision is lost on the way out" + note)
    if got.dx.dtype != x.dtype:
        return CheckResult("contract", PASS, figure,
                           f"returns dx in the wider {got.dx.dtype} for {x.dtype} input; "
                           "inputs unchanged" + note)
    return CheckResult("contract", PASS, figure,
                       "dx has the input's shape and dtype, the parameter gradients the "
                       "parameters' shape; inputs unchanged" + note)


#: The backward's worked examples: the forward's records (layernorm_c/_cases.py)
#: with dy picking one feature; dx at eps 0 is rstd times a short decimal.
#: x, dy, rstd, dx / rstd, dweight (= dy * xhat), dbias (= dy).
HAND_BACKWARD = (
    (WORKED_EXAMPLES[0].row, (1.0, 0.0, 0.0, 0.0), 1 / math.sqrt(1.25),
     (0.3, -0.4, -0.1, 0.2), (-1.341641, 0.0, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0)),
    (WORKED_EXAMPLES[1].row, (0.0, 0.0, 0.0, 1.0), 1 / math.sqrt(5.0),
     (-0.1, -0.4, 0.2, 0.3), (0.0, 0.0, 0.0, 1.341641), (0.0, 0.0, 0.0, 1.0)),
)


@_check("hand_rows", "the worked examples [1, 2, 3, 4] and [10, 12, 8, 14], dy picking one "
                     "feature")
def check_hand_rows(p: BackwardProbe) -> CheckResult:
    d = p.d(4)
    if d % 4:
        return CheckResult("hand_rows", SKIP, f"d={d}",
                           f"the worked examples have 4 features; the fixed d={d} is not a "
                           "multiple of 4 to repeat them")
    eps = 0.0 if p.impl.takes_eps else p.eps
    x = p.cast([np.tile(row, d // 4) for row, *_ in HAND_BACKWARD])
    dy = p.cast([np.tile(g, d // 4) for _, g, *_ in HAND_BACKWARD])
    w, b = p.identity_params(d)
    got = p.rows(dy, x, w, b, eps=eps)
    want = p.reference(dy, x, eps=eps)
    tol = p.tol(d)
    t = p.terms(dy, x, eps=eps)
    units = _dx_units(tol, got.dx, want.dx, t).max(axis=-1)
    mw, mb = _param_magnitudes(dy, t.xhat)
    wrong = []
    for i in np.flatnonzero(units > 1):
        row, g, rstd, scaled, *_ = HAND_BACKWARD[i]
        shown_got, shown_want = _fmt_rows_pair(got.dx[i].tolist(), want.dx[i].tolist())
        wrong.append(f"x = {_fmt_list(row)}, dy = {_fmt_list(g)} gave dx = "
                     f"{shown_got} instead of {rstd:.6f} * "
                     f"{_fmt_list(scaled)} = {shown_want}")
    for name, value, ref, m in (("dweight", got.dweight, want.dweight, mw),
                                ("dbias", got.dbias, want.dbias, mb)):
        if value is not None and _max(tol.param_units(value, ref, m)) > 1:
            shown_got, shown_ref = _fmt_rows_pair((value + 0.0).tolist(), (ref + 0.0).tolist())
            wrong.append(f"{name} {shown_got} instead of {shown_ref}")
    figure = f"max dx error {_max(np.abs(got.dx - want.dx)):.2g}"
    if wrong:
        return CheckResult("hand_rows", FAIL, figure,
                           f"wrong on the worked examples at eps={eps:g}: {'; '.join(wrong)}",
                           {"symptom": True})
    return CheckResult("hand_rows", PASS, figure,
                       "x = [1, 2, 3, 4], dy = [1, 0, 0, 0] -> dx = "
                       f"{_fmt_row(got.dx[0].tolist())} "
                       f"(0.894427 * [0.3, -0.4, -0.1, 0.2]) at eps={eps:g}, and the "
                       "parameter gradients dy * xhat and dy")


def _and(names: Sequence[str]) -> str:
    """``a, b and c``."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _fmt_list(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


@_check("reference", "agreement with reference_layer_norm_backward (float64) on random data")
def check_reference(p: BackwardProbe) -> CheckResult:
    d, lead = p.d(64), p.lead((4, 6))
    rng = p.rng("reference")
    scale = np.exp(rng.uniform(np.log(0.5), np.log(5.0), lead + (1,)))
    offset = rng.uniform(-2.0, 2.0, lead + (1,)) * scale
    x = p.cast(rng.standard_normal(lead + (d,)) * scale + offset)
    dy = p.cast(rng.standard_normal(lead + (d,)))
    w, b = p.params(*p.random_params(rng, d))
    got = p.call(dy, x, w, b)
    want = p.reference(dy, x, w)
    tol = p.tol(d)
    t = p.terms(dy.reshape(-1, d), x.reshape(-1, d), w)
    dx_units = _dx_units(tol, got.dx, want.dx, t).reshape(x.shape)
    mw, mb = _param_magnitudes(dy, t.xhat)
    parts = {"dx": _max(dx_units)}
    for name, value, ref, m in (("dweight", got.dweight, want.dweight, mw),
                                ("dbias", got.dbias, want.dbias, mb)):
        if value is not None:
            parts[name] = _max(tol.param_units(value, ref, m))
    figure = "max error " + ", ".join(f"{k} {v:.2g}" for k, v in parts.items()) + " x tol"
    worst = max(parts, key=lambda k: parts[k])
    values = {"units": parts}
    if parts[worst] > 1:
        if worst == "dx":
            at = _worst_at(dx_units)
            where = (f"dx at record {_fmt_index(at[:-1])}, feature {at[-1]} "
                     f"{_gives(got.dx[at], want.dx[at])}")
        else:
            value = got.dweight if worst == "dweight" else got.dbias
            ref = want.dweight if worst == "dweight" else want.dbias
            assert value is not None
            j = int(np.argmax(np.abs(value - ref)))
            where = f"{worst}[{j}] {_gives(value[j], ref[j])}"
        return CheckResult("reference", FAIL, figure,
                           f"differs from {p.op.reference_name}_backward (float64) beyond "
                           f"{tol.dx} ({worst} worst): {where}", {**values, "symptom": True})
    return CheckResult("reference", PASS, figure,
                       f"{_and(list(parts))} within tolerance of {p.op.reference_name}_backward "
                       f"(float64) on {math.prod(lead)} random records, random weight",
                       values)


#: The structural models of dx: (mean path, variance path, sign) -> key.
PATH_MODELS: Dict[str, Tuple[float, float, float]] = {
    "correct": (1.0, 1.0, 1.0),
    "constant": (0.0, 0.0, 1.0),
    "no_mean": (0.0, 1.0, 1.0),
    "no_var": (1.0, 0.0, 1.0),
    "sign": (1.0, 1.0, -1.0),
    "mean_sign": (-1.0, 1.0, 1.0),
    "var_sign": (1.0, -1.0, 1.0),
}
#: What each structural defect is, as a report says it.
PATH_DEFECTS = {
    "constant": "statistics treated as constants: dx = rstd * dy * weight, with no gradient "
                "through the mean and the variance (detached, e.g. .detach(), torch.no_grad() "
                "or jax.lax.stop_gradient around them, or a hand-written backward that stops "
                "at the chain rule's first term)",
    "no_mean": "only the mean path missing: dx lacks the term -rstd * mean(g) (g = dy * "
               "weight), so no gradient flows through the mean (the mean is treated as a "
               "constant); the variance path is there",
    "no_var": "only the variance path missing: dx lacks the term -rstd * xhat * mean(g * xhat) "
              "(g = dy * weight), so no gradient flows through the variance (the variance "
              "or rstd is treated as a constant); the mean path is there",
    "sign": "sign error: dx is the negative of the gradient (dy negated, or x - mean written "
            "mean - x in the backward's rstd * g term)",
    "mean_sign": "sign error in the mean term: dx = rstd * (g + mean(g) - xhat * mean(g * "
                 "xhat)) instead of g - mean(g)",
    "var_sign": "sign error in the variance term: dx = rstd * (g - mean(g) + xhat * mean(g * "
                "xhat)) instead of - xhat * mean(g * xhat)",
}
FORMULA = "rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * weight"


def _designed_records(p: BackwardProbe, stream: str, n: int, d: int,
                      variances: Optional[NDArray[Any]] = None
                      ) -> Tuple[NDArray[Any], NDArray[Any], Param, Param, np.random.Generator]:
    """Records with their own offsets (and the given variances, default
    about 1), random parameters, and dy from :func:`_designed_dy`."""
    rng = p.rng(stream)
    if variances is None:
        scale = min(max(1.0, 1e3 * math.sqrt(p.eps)), 1e3)
        spread = np.full((n, 1), scale)
    else:
        spread = np.sqrt(np.asarray(variances, np.float64)).reshape(n, 1)
    x = p.cast(_standard_rows(rng, n, d) * spread + rng.uniform(-2, 2, (n, 1)) * spread)
    w, b = p.params(*p.random_params(rng, d))
    dy = _designed_dy(p, rng, x, w)
    return dy, x, w, b, rng


@_check("paths", "dx has the terms through the mean and the variance, with the right signs")
def check_paths(p: BackwardProbe) -> CheckResult:
    read = read_paths(p)
    if isinstance(read, CheckResult):
        return read
    d, got, t, dec = read
    tol = p.tol(d)
    r_eff = dec.rstd[:, None]
    models = {k: [model_dx(t, rstd=r_eff, mean_path=a, var_path=v, sign=s)]
              for k, (a, v, s) in PATH_MODELS.items()}
    # The variance path of the sample variance's exact gradient (autograd
    # through var(ddof=1)) has d/(d-1) of the population's: the variance
    # check names that; here it counts as present.
    models["sample_path"] = [model_dx(t, rstd=r_eff, var_path=d / (d - 1))]
    result = fit_dx(got.dx, models, tol, t)
    # (Rounded, then + 0.0: no "-0.00" in the figure.)
    a, v, s = (round(float(np.median(dec.mean_path)), 2) + 0.0,
               round(float(np.median(dec.var_path)), 2) + 0.0,
               float(np.median(np.sign(dec.sign_rstd))))
    figure = f"mean path x{a:.2f}, variance path x{v:.2f}, sign {s:+.0f}"
    values = {"mean_path": a, "var_path": v, "sign": s,
              "scores": dict(result.scores)}
    if result.fits("correct") or result.fits("sample_path"):
        note = (" (the variance path of the sample variance, d/(d - 1) of it: see the variance "
                "check)" if result.best == "sample_path" else "")
        return CheckResult("paths", PASS, figure,
                           f"dx = {FORMULA}: the gradient flows through the mean and the "
                           f"variance{note}", values)
    return path_defect(result, PATH_DEFECTS, FORMULA, "the mean and the variance", figure,
                       values)


def read_paths(p: BackwardProbe) -> Union[CheckResult, Tuple[int, Grads, Terms, Decomposition]]:
    """The paths checks' measurement: dx of designed records, their terms and
    dx's decomposition (or why the check cannot go on)."""
    d = p.d(16)
    if d < 4:
        return CheckResult("paths", SKIP, f"d={d}",
                           "needs at least 4 features to tell the three terms of dx apart")
    dy, x, w, b, _ = _designed_records(p, "paths", 16, d)
    got = p.rows(dy, x, w, b)
    if not np.isfinite(got.dx).all():
        return CheckResult("paths", FAIL, "non-finite dx", "non-finite dx for plain records")
    t = p.terms(dy, x, w)
    return d, got, t, decompose_dx(got.dx, t)


def path_defect(result: Fit[str], defects: Mapping[str, str], formula: str, terms: str,
                figure: str, values: Dict[str, Any]) -> CheckResult:
    """The failed paths check: the one defect whose model fits, or why none
    can be named (``terms``: what dx's terms go through, for the report)."""
    fitting = sorted({k for k in defects if result.fits(k)})
    if len(fitting) == 1:
        return CheckResult("paths", FAIL, figure, f"{defects[fitting[0]]}; dx must be {formula}",
                           values)
    if fitting:
        return CheckResult("paths", FAIL, figure,
                           "dx is wrong, and the tolerance is too loose to tell which defect: it "
                           f"fits {' and '.join(fitting)}; dx must be {formula}", values)
    return CheckResult("paths", FAIL, figure,
                       "dx " + _no_fit(f"combination of the terms through g, {terms}", result),
                       values)


def fit_dx(got: NDArray[Any], models: Mapping[K, List[NDArray[Any]]], tol: BackwardTolerance,
           t: Terms) -> Fit[K]:
    """:func:`~._numerics.fit` of dx in units of each record's scale."""
    s = t.scale
    return fit([got / s], {k: [m / s for m in v] for k, v in models.items()}, tol.dx)


@dataclass(frozen=True)
class RstdFit:
    """The reciprocal standard deviations a backward used, fitted to a
    variance convention (slope of ``1 / rstd**2`` against the variance) and
    an eps placement."""

    ddof: int
    mode: str
    eps: float
    units: float


def _fit_rstd(var: NDArray[Any], rstd: NDArray[Any], slope: float, mode: str,
              rel: float, eps: Optional[float] = None) -> Tuple[float, float]:
    """Estimate eps (unless given) for ``1/rstd**2 = slope * var + eps``
    (``mode='variance'``) or ``1/rstd = sqrt(slope * var) + eps``
    (``'std'``); returns (eps, worst relative error of rstd in units of
    ``rel``)."""
    if mode == "variance":
        q, base = 1.0 / (rstd * rstd), slope * var
    else:
        q, base = 1.0 / rstd, np.sqrt(slope * var)
    if eps is None:
        weights = 1.0 / (q * q)
        eps = float(np.sum(weights * (q - base)) / np.sum(weights))
    with np.errstate(all="ignore"):
        pred = 1.0 / np.sqrt(base + eps) if mode == "variance" else 1.0 / (base + eps)
        units = np.abs(pred / rstd - 1.0) / rel
    return eps, _max(units)


def _measured_rstd(p: BackwardProbe, stream: str, d: int, variances: NDArray[Any],
                   eps: float) -> Tuple[NDArray[Any], NDArray[Any], NDArray[Any], BackwardTolerance]:
    """The rstd the backward uses for records of the given variances (read
    from its dx), beside the records' true variances; and the residual of
    the decomposition in tolerance units."""
    v = np.asarray(variances, np.float64)
    dy, x, w, b, _ = _designed_records(p, stream, len(v), d, v)
    got = p.rows(dy, x, w, b, eps=eps)
    t = p.terms(dy, x, w, eps=eps)
    dec = decompose_dx(got.dx, t)
    tol = p.tol(d)
    return t.var[:, 0], dec.rstd, dec.residual / (tol.dx.atol + tol.dx.rtol), tol


@_check("variance", "the backward uses the population variance (divides by d, not d - 1)")
def check_variance(p: BackwardProbe) -> CheckResult:
    d = p.d(8)
    if d < 4:
        return CheckResult("variance", SKIP, f"d={d}", "needs at least 4 features")
    base = p.eps if p.eps > 0 else 1e-4
    ratios = np.repeat([1.0, 10.0, 1e2, 1e3, 1e4], 3)
    var, rstd, residual, tol = _measured_rstd(p, "variance", d, base * ratios, p.eps)
    rel = tol.dx.rtol + tol.dx.atol
    sample = d / (d - 1)
    # Where eps goes is the eps check's business: each convention is fitted
    # with eps inside the square root or on the standard deviation.
    fits = {ddof: min((_fit_rstd(var, rstd, slope, mode, rel) for mode in ("variance", "std")),
                      key=lambda f: f[1])
            for ddof, slope in ((0, 1.0), (1, sample))}
    # The figure: rstd against the reference's at the largest variance
    # (where eps hardly matters), as the forward's variance check shows
    # output / reference.
    top = int(np.argmax(var))
    ratio = float(rstd[top] * math.sqrt(var[top] + p.eps))
    expected = math.sqrt((d - 1) / d)
    figure = f"rstd/reference {ratio:.4f} (d - 1 gives {expected:.4f})"
    values = {"ratio": ratio, "sample_ratio": expected,
              "units": {ddof: u for ddof, (_, u) in fits.items()}}
    if not np.isfinite(rstd).all() or _max(residual) > 1e3:
        return CheckResult("variance", FAIL, figure,
                           "the rstd the backward uses cannot be read from dx, which is not a "
                           "combination of g, 1 and x - mean in each record; another failed "
                           "check (paths, coupling) names the defect", values)
    population, sample_fit = fits[0][1] <= 1, fits[1][1] <= 1
    if population and sample_fit:
        return CheckResult("variance", SKIP, figure,
                           f"the population and the sample variance cannot be told apart at "
                           f"d={d} in {p.dtype}", values)
    if population:
        return CheckResult("variance", PASS, figure,
                           "population variance (divides by d) in the backward's rstd", values)
    if sample_fit:
        return CheckResult("variance", FAIL, figure,
                           f"sample variance in the backward: its rstd is sqrt((d - 1)/d) = "
                           f"{expected:.4f} times the forward's at d={d}, as if the variance "
                           "were divided by d - 1 instead of d (np.var(ddof=1), torch.var's "
                           "unbiased default) when the backward recomputes the statistics; use "
                           "the population variance, as the forward does", values)
    return CheckResult("variance", FAIL, figure,
                       f"the backward's rstd is {ratio:.4f} times the reference's and fits "
                       f"neither the population variance nor the sample variance ({expected:.4f}) "
                       f"with any eps (off by {min(u for _, u in fits.values()):.3g} x tol); "
                       "another failed check may name a defect that hides this one", values)


#: Round values of eps a backward may hard-code.
COMMON_EPS = (1e-12, 1e-8, 1e-6, 1e-5, 1e-3)


@_check("eps", "the backward uses the forward's eps, inside the square root")
def check_eps(p: BackwardProbe) -> CheckResult:
    eps_values = eps_probes(p)
    if not eps_values:
        return _no_eps()
    d = p.d(16)
    if d < 4:
        return CheckResult("eps", SKIP, f"d={d}", "needs at least 4 features")
    # Records whose variance is 0.01 to 10 times eps (where eps decides
    # rstd), and 1000 times (which pins the variance's slope).
    ratios = np.repeat([0.01, 0.1, 1.0, 10.0, 1e3], 2)
    measured = [_measured_rstd(p, f"eps {e!r}", d, e * ratios, e) for e in eps_values]
    tol = measured[0][3]
    rel = tol.dx.rtol + tol.dx.atol
    if any(not np.isfinite(r).all() or _max(res) > 1e3 for _, r, res, _ in measured):
        return CheckResult("eps", FAIL, "rstd unreadable",
                           "the rstd the backward uses cannot be read from dx, which is not a "
                           "combination of g, 1 and x - mean in each record; another failed "
                           "check (paths, coupling) names the defect")
    # The variance convention is the variance check's business: take the
    # slope that fits best.
    candidates = {}
    for ddof, slope in ((0, 1.0), (1, d / (d - 1))):
        for mode in ("variance", "std"):
            ests = [_fit_rstd(v, r, slope, mode, rel) for v, r, _, _ in measured]
            candidates[(ddof, mode)] = ([e for e, _ in ests], max(u for _, u in ests))
    slope_ddof, best_mode = min(candidates, key=lambda k: candidates[k][1])
    slope = 1.0 if slope_ddof == 0 else d / (d - 1)
    sample = " (with the sample variance: see the variance check)" if slope_ddof else ""

    def fits_with(values: Sequence[float], mode: str = "variance") -> bool:
        return all(_fit_rstd(v, r, slope, mode, rel, e)[1] <= 1
                   for (v, r, _, _), e in zip(measured, values))

    estimates = candidates[(slope_ddof, "variance")][0]
    shown = ", ".join(f"{e:g}" for e in eps_values)
    in_use = candidates[(slope_ddof, best_mode)][0]
    # (The digits that tell the eps in use from the forward's only where
    # they differ beyond what the measurement resolves.)
    agrees = fits_with(eps_values) if best_mode == "variance" else False
    figure = ("eps in use " + ", ".join(f"{e:.3g}" if agrees else distinct(e, g, 3)[0]
                                        for e, g in zip(in_use, eps_values))
              + (" (on the std)" if best_mode == "std" else "") + f" for eps {shown}")
    values: Dict[str, Any] = {"eps": eps_values, "estimates": in_use, "placement": best_mode}
    # An RMSNorm's statistic is the mean square, whose root has eps outside.
    v, stat, std_words = (("var", "variance", "eps added to the standard deviation")
                          if p.op.key == "layer_norm" else
                          ("mean(x^2)", "mean square", "eps outside the square root"))
    claims: Dict[str, Any] = {"denominator": "d-1"} if slope_ddof else {}
    if fits_with(eps_values):
        return CheckResult("eps", PASS, figure,
                           f"the backward's rstd is 1 / sqrt({v} + eps) with the forward's eps "
                           f"= {shown}{sample}",
                           {**values, "claims": {**claims, "eps": "as declared"}})
    values["claims"] = {**claims, "eps": "other"}
    lead = "eps different from the forward's: "
    where = f"on records with {stat} 0.01 to 10 times eps (eps = {shown}) "
    rounded = _rounded_eps(eps_values, fits_with)
    if rounded is not None:
        name, pairs = rounded
        why = (f"eps rounded to {name} in the backward: it uses {pairs} (an eps stored as a "
               f"{name} number), which {p.dtype} gradients show")
    elif fits_with([0.0] * len(eps_values)):
        why = f"eps ignored in the backward: its rstd is 1 / sqrt({v}), as if eps were 0"
    elif fits_with([2 * e for e in eps_values]):
        why = f"eps applied twice in the backward: its rstd is 1 / sqrt({v} + 2*eps)"
    else:
        constant = float(np.median(estimates))
        nearest = min(COMMON_EPS, key=lambda c: abs(math.log(c / constant))
                      if constant > 0 else math.inf)
        ratio = float(np.median([e / g for e, g in zip(estimates, eps_values)]))
        std_values, std_units = candidates[(slope_ddof, "std")]
        if best_mode == "std" and std_units <= 1:
            on = ("the forward's eps" if fits_with(eps_values, "std") else
                  "eps = " + ", ".join(f"{e:.3g}" for e in std_values))
            why = (f"{std_words} in the backward: its rstd is "
                   f"1 / (sqrt({v}) + eps) with {on}, instead of 1 / sqrt({v} + eps)")
        elif len(eps_values) > 1 and fits_with([nearest] * len(eps_values)):
            why = (f"the backward does not use the eps it is given: it uses eps = {nearest:g} "
                   "whatever the forward's (a hard-coded or default eps)")
        elif len(eps_values) > 1 and fits_with([constant] * len(eps_values)):
            why = (f"the backward does not use the eps it is given: it uses eps = "
                   f"{distinct(constant, nearest, 3)[0]} whatever the forward's")
        elif fits_with([ratio * e for e in eps_values]):
            why = f"the backward uses {ratio:.3g} times the forward's eps"
        elif fits_with(estimates):
            why = "the backward uses eps = " + ", ".join(f"{e:.3g}" for e in estimates)
        else:
            return CheckResult("eps", FAIL, figure,
                               where + f"the backward's rstd fits 1 / sqrt({v} + eps) with no "
                               f"eps (nor 1 / (sqrt({v}) + eps)); another failed check may name "
                               "a defect that hides this one", values)
    return CheckResult("eps", FAIL, figure,
                       f"{lead}{why}{sample}; {where}it must be 1 / sqrt({v} + eps) with the "
                       "forward's eps", values)


def _rounded_eps(eps_values: Sequence[float], fits_with: Callable[[Sequence[float]], bool]
                 ) -> Optional[Tuple[str, str]]:
    """The narrower type the eps in use is the forward's eps rounded to,
    with what each eps became, when that explains the backward's rstd."""
    from ._audit import eps_text as fmt_eps

    for name in ("float32", "float16", "bfloat16"):
        rounded = [eps_roundings(e).get(name, e) for e in eps_values]
        if rounded != list(eps_values) and fits_with(rounded):
            return name, ", ".join(f"{fmt_eps(r)} for eps={fmt_eps(e)}"
                                   for r, e in zip(rounded, eps_values) if r != e)
    return None


#: Per-record models of the parameter gradients: what the term of each
#: record is, given dy, x, the backward's own xhat, weight and bias.
DWEIGHT_MODELS = {
    "correct": "dy * xhat",
    "sign": "-dy * xhat",
    "output": "dy * y (the forward's output, gain and bias applied)",
    "input": "dy * x (the raw input)",
    "swapped": "dy (dbias's)",
}
DBIAS_MODELS = {
    "correct": "dy",
    "sign": "-dy",
    "weighted": "dy * weight",
    "swapped": "dy * xhat (dweight's)",
}


@_check("param_grads", "each record adds dy * xhat to dweight and dy to dbias (right sign)")
def check_param_grads(p: BackwardProbe) -> CheckResult:
    if not (p.impl.returns_dweight or p.impl.returns_dbias):
        return _needs_param(p, "param_grads")
    d = p.d(16)
    dy, x, w, b, _ = _designed_records(p, "param_grads", 4, d)
    tol = p.tol(d)
    t = p.terms(dy, x, w)
    singles = [p.rows(dy[i:i + 1], x[i:i + 1], w, b) for i in range(len(x))]
    if not _repeats_params(p, singles[0], p.rows(dy[:1], x[:1], w, b), d):
        return _unrepeatable("param_grads", "dweight or dbias")
    dx = np.concatenate([s.dx for s in singles])
    dec = decompose_dx(dx, t)
    # The backward's own xhat (its rstd, read from its dx), so that a
    # variance or eps defect (the variance and eps checks') does not show
    # here; the reference's xhat is accepted too.
    own = np.isfinite(dec.rstd).all() and _max(dec.residual) < 1e3 * (tol.dx.atol + tol.dx.rtol)
    xhat_own = t.c * (dec.rstd[:, None] if own else t.rstd)
    dy64 = dy.astype(np.float64)
    w64 = np.ones(d) if w is None else w.astype(np.float64)
    b64 = np.zeros(d) if b is None else b.astype(np.float64)
    x64 = x.astype(np.float64)
    terms_w = {
        "correct": [dy64 * xhat_own],
        "sign": [-dy64 * xhat_own],
        "output": [dy64 * (xhat_own * w64 + b64)],
        "input": [dy64 * x64],
        "swapped": [dy64],
    }
    terms_b = {"correct": [dy64], "sign": [-dy64], "weighted": [dy64 * w64],
               "swapped": [dy64 * xhat_own]}
    findings: Dict[str, str] = {}
    figures: List[str] = []
    values: Dict[str, Any] = {}
    for name, models, descriptions in (("dweight", terms_w, DWEIGHT_MODELS),
                                       ("dbias", terms_b, DBIAS_MODELS)):
        returned = [getattr(s, name) for s in singles]
        if any(r is None for r in returned):
            continue
        got = np.stack(returned)
        magnitude = _dweight_sizes(dy64, xhat_own) if name == "dweight" else np.abs(dy64)
        scores = {k: max(_max(tol.param_units(got[i], m[0][i], magnitude[i]))
                         for i in range(len(got))) for k, m in models.items()}
        if name == "dweight":
            scores["reference"] = max(_max(tol.param_units(got[i], dy64[i] * t.xhat[i],
                                                           magnitude[i]))
                                      for i in range(len(got)))
        correct = models["correct"][0]
        with np.errstate(all="ignore"):
            ratio = float(np.sum(got * correct) / np.sum(correct * correct))
        figures.append(f"{name}/({descriptions['correct']}) {ratio:.3g}")
        values[name] = {"ratio": ratio, "scores": scores}
        if scores["correct"] <= 1 or scores.get("reference", math.inf) <= 1:
            continue
        best = min(scores, key=lambda k: scores[k])
        if scores[best] <= 1:
            findings[name] = best
        else:
            findings[name] = "none"
    figure = ", ".join(figures)
    if not findings:
        return CheckResult("param_grads", PASS, figure,
                           "every record adds dy * xhat to dweight"
                           + (" and dy to dbias" if p.impl.returns_dbias else ""), values)
    if findings.get("dweight") == "swapped" and findings.get("dbias") == "swapped":
        return CheckResult("param_grads", FAIL, figure,
                           "dweight and dbias swapped: dweight = sum(dy) and dbias = "
                           "sum(dy * xhat); dweight must be sum(dy * xhat), dbias sum(dy)",
                           values)
    if findings.get("dweight") == "sign" and findings.get("dbias") == "sign":
        return CheckResult("param_grads", FAIL, figure,
                           "sign error in the parameter gradients: dweight = -sum(dy * xhat) "
                           "and dbias = -sum(dy) (dy negated?); they must be sum(dy * xhat) and "
                           "sum(dy)", values)
    said = []
    for name, key in findings.items():
        descriptions = DWEIGHT_MODELS if name == "dweight" else DBIAS_MODELS
        if key == "none":
            said.append(f"{name} matches no known per-record term (neither "
                        f"{descriptions['correct']} nor a known defect)")
        elif key == "sign":
            said.append(f"sign error in {name}: each record adds -{descriptions['correct']}")
        else:
            said.append(f"{name} sums {descriptions[key]} instead of {descriptions['correct']}")
    return CheckResult("param_grads", FAIL, figure,
                       "; ".join(said) + " (measured on single records)", values)


#: How the parameter gradients may be reduced over the records, by the
#: shape of the result: key -> (description, reducer of the (B, T, d)
#: per-record terms).
SUM_DEFECTS = {
    "batch": "summed over the wrong axes: over the batch (axis 0) but not the positions "
             "(axis 1)",
    "positions": "summed over the wrong axes: over the positions (axis 1) but not the batch "
                 "(axis 0)",
    "none": "not summed over the records at all: one gradient per record",
    "mean": "averaged instead of summed over the records",
    "last_item": "only the last batch item's records: the sum over the batch is overwritten, "
                 "not accumulated (= instead of +=)",
    "last_record": "only the last record: the sum over the records is overwritten, not "
                   "accumulated (= instead of +=)",
}


def _reductions(terms: NDArray[Any]) -> Dict[str, NDArray[Any]]:
    """The candidate reductions of per-record terms (lead + (d,))."""
    lead = terms.shape[:-1]
    d = terms.shape[-1]
    flat = terms.reshape(-1, d)
    out = {"correct": flat.sum(axis=0), "mean": flat.mean(axis=0), "none": terms,
           "last_record": flat[-1]}
    if len(lead) == 2:
        out["batch"] = terms.sum(axis=0)
        out["positions"] = terms.sum(axis=1)
        out["last_item"] = terms[-1].sum(axis=0)
        del out["last_record"]
    return out


@_check("param_sums", "dweight and dbias summed over every record (all leading axes)")
def check_param_sums(p: BackwardProbe) -> CheckResult:
    if not (p.impl.returns_dweight or p.impl.returns_dbias):
        return _needs_param(p, "param_sums")
    lead, d = p.lead((3, 5)), p.d(16)
    n = math.prod(lead)
    if n < 2:
        return CheckResult("param_sums", SKIP, f"leading shape {lead}",
                           "the fixed leading shape holds a single record")
    rng = p.rng("param_sums")
    x = p.cast(rng.standard_normal(lead + (d,)) * 2 + rng.uniform(-2, 2, lead + (1,)))
    dy = p.cast(rng.standard_normal(lead + (d,)) + 0.5)
    w, b = p.params(*p.random_params(rng, d))
    flat_x, flat_dy = x.reshape(n, d), dy.reshape(n, d)
    # Each record's own contribution, through the implementation itself (a
    # record alone), so only the summation is measured here.
    singles = [p.rows(flat_dy[i:i + 1], flat_x[i:i + 1], w, b, any_param_shape=True)
               for i in range(n)]
    got = p.call(dy, x, w, b, any_param_shape=True)
    if not _repeats_params(p, got, p.call(dy, x, w, b, any_param_shape=True), d):
        return _unrepeatable("param_sums", "dweight or dbias")
    tol = p.tol(d)
    t = p.terms(flat_dy, flat_x, w)
    term_sizes = {"dweight": _dweight_sizes(flat_dy, t.xhat).reshape(lead + (d,)),
                  "dbias": np.abs(dy.astype(np.float64))}
    figures: List[str] = []
    said: List[Tuple[str, str]] = []  # (what is wrong, about which gradients)
    values: Dict[str, Any] = {}
    for name in ("dweight", "dbias"):
        value = getattr(got, name)
        parts = [getattr(s, name) for s in singles]
        if value is None or any(q is None for q in parts):
            continue
        terms = np.stack(parts).reshape(lead + (d,))
        models = {k: v for k, v in _reductions(terms).items() if v.shape == value.shape}
        sizes = _reductions(term_sizes[name])
        scores = {k: _max(tol.param_units(value, m, sizes[k])) for k, m in models.items()}
        values[name] = {"shape": value.shape, "scores": scores}
        if value.shape == (d,):
            with np.errstate(all="ignore"):
                ratio = float(np.sum(value * models["correct"])
                              / np.sum(models["correct"] ** 2))
            figures.append(f"{name}/sum {ratio:.3g}")
        else:
            figures.append(f"{name} shape {value.shape}")
        if scores.get("correct", math.inf) <= 1:
            continue
        if not scores:
            said.append((f"has shape {value.shape} for x of shape {x.shape}: a parameter "
                         f"gradient is shaped like the parameter, ({d},)", name))
            continue
        best = min(scores, key=lambda k: scores[k])
        if scores[best] > 1:
            said.append((f"is not a sum of the records' own gradients (the closest, {best}, is "
                         f"off by {scores[best]:.3g} x tol)", name))
            continue
        said.append((SUM_DEFECTS[best] + (
            f" (shape {value.shape} for x of shape {x.shape})" if value.shape != (d,) else
            f" ({ratio:.3g} times the sum over the {n} records)" if best == "mean" else ""),
            name))
    figure = ", ".join(figures) or "no parameter gradients"
    if not said:
        return CheckResult("param_sums", PASS, figure,
                           f"the sums over all {n} records of each record's own gradients "
                           f"(x of shape {x.shape})", values)
    # The same finding for both gradients is said once.
    merged: Dict[str, List[str]] = {}
    for what, name in said:
        merged.setdefault(what, []).append(name)
    text = "; ".join(f"{' and '.join(names)} {what}" for what, names in merged.items())
    fix = ("; sum over every axis but the last (e.g. reshape(-1, d).sum(axis=0))"
           if any("axes" in w or "not summed" in w for w in merged) else "")
    return CheckResult("param_sums", FAIL, figure, text + fix, values)


@_check("coupling", "dx of each record independent of the other records (bits: warning)")
def check_coupling(p: BackwardProbe) -> CheckResult:
    lead = p.lead((4, 6))
    n = math.prod(lead)
    if n < 2:
        return CheckResult("coupling", SKIP, f"leading shape {lead}",
                           "the fixed leading shape holds a single record")
    d = p.d(16)
    rng = p.rng("coupling")
    x = p.cast(rng.standard_normal(lead + (d,)))
    dy = p.cast(rng.standard_normal(lead + (d,)))
    w, b = p.params(*p.random_params(rng, d))
    at = tuple(k // 2 for k in lead)
    changed_x, changed_dy = x.copy(), dy.copy()
    changed_x[at] = p.cast(x[at] * 10 + 5)
    changed_dy[at] = p.cast(dy[at] * 3 - 1)
    tol = p.tol(d)
    # Only dx is read here: parameter gradients of any shape are accepted.
    base = p.call_raw(dy, x, w, b, any_param_shape=True)
    moved_grads = p.call(changed_dy, changed_x, w, b, any_param_shape=True)
    t = p.terms(dy.reshape(-1, d), x.reshape(-1, d), w)
    moved_by = tol.dx_units(moved_grads.dx.reshape(-1, d), base.dx.reshape(-1, d).astype(
        np.float64), t.scale).max(axis=-1).reshape(lead)
    if not _grads_identical(base, p.call_raw(dy, x, w, b, any_param_shape=True)):
        return _unrepeatable("coupling")
    moved_by[at] = 0
    moved = [tuple(int(i) for i in m) for m in np.argwhere(moved_by > 1)]
    figure = f"{len(moved)}/{n - 1} records moved"
    values: Dict[str, Any] = {"moved": moved}
    # The same records alone and in other batches: values, then bits.
    records = p.cast(rng.standard_normal((3, d)) * 3 + 1)
    record_dy = p.cast(rng.standard_normal((3, d)))
    if p.fixed_lead:
        spots = [tuple(int(i) for i in np.unravel_index(k, lead))
                 for k in sorted({0, n // 2, n - 1})]
        layouts = [(f"at {_fmt_index(s)} of {lead}", lead, s) for s in spots]
    else:
        layouts = [("alone", (1, 1), (0, 0)), ("in a batch of 100", (10, 10), (3, 7)),
                   ("first of a batch of 7", (1, 7), (0, 0))]
    outputs = []
    for _, shape, spot in layouts:
        row = []
        for record, g in zip(records, record_dy):
            bx = p.cast(rng.standard_normal(shape + (d,)))
            bdy = p.cast(rng.standard_normal(shape + (d,)))
            bx[spot], bdy[spot] = record, g
            row.append(p.call_raw(bdy, bx, w, b, any_param_shape=True).dx[spot])
        outputs.append(np.stack(row))
    rt = p.terms(record_dy, records, w)
    value_units = [_max(tol.dx_units(o.astype(np.float64), outputs[0].astype(np.float64),
                                     rt.scale)) for o in outputs]
    ulps = [_max(ulp_distance(outputs[0], o)) for o in outputs]
    worst = int(np.argmax(ulps))
    bad = int(np.argmax(value_units))
    # Beyond tolerance, ulps say nothing useful: the difference in units of
    # tolerance, or in words where one side is not finite.
    nonfinite = nonfinite_words(outputs[bad], outputs[0], f"the record's dx {layouts[0][0]}")
    if value_units[bad] > 1 and nonfinite is not None:
        figure += f"; non-finite dx {layouts[bad][0]}"
    elif value_units[bad] > 1:
        figure += f"; {layouts[0][0]} vs {layouts[bad][0]}: {value_units[bad]:.2g} x tol"
    else:
        figure += f"; {layouts[0][0]} vs {layouts[worst][0] if ulps[worst] else 'others'}: " \
                  f"{ulps[worst]:.0f} ulp"
    values.update({"ulp": ulps[worst], "layout_units": max(value_units)})
    if moved:
        kind = _coupling_kind(len(lead), moved, at)
        where = {"batch": " (the same position in other batch items)",
                 "positions": " (other positions of the same batch item)"}.get(kind, "")
        return CheckResult("coupling", FAIL, figure,
                           f"dx coupled across records: {COUPLING_DEFECTS[kind]} in the "
                           f"backward: changing x and dy of record {_fmt_index(at)} moved the dx "
                           f"of {len(moved)} other record(s){where}: {_fmt_indices(moved)}. "
                           "Each record's dx must use only that record's mean(g) and "
                           "mean(g * xhat)", values)
    if value_units[bad] > 1:
        how = (f"{layouts[bad][0]}, the backward {nonfinite}" if nonfinite is not None else
               f"a record's dx differs {layouts[0][0]} and {layouts[bad][0]} by "
               f"{value_units[bad]:.3g} x tol")
        return CheckResult("coupling", FAIL, figure,
                           f"dx coupled across records: {how}; each record's dx must depend on "
                           "that record alone", values)
    if ulps[worst] > 0:
        return CheckResult("coupling", FAIL if p.strict_batch_invariance else WARN, figure,
                           f"dx not batch-invariant: max difference {ulps[worst]:.0f} ulp between "
                           f"a record {layouts[0][0]} and {layouts[worst][0]}, within tolerance: "
                           "the reduction order depends on the batch; many valid kernels are "
                           "like this, but gradients are then not reproducible across batch "
                           "sizes", values)
    return CheckResult("coupling", PASS, figure,
                       f"changing record {_fmt_index(at)} moved no other record's dx; a record's "
                       "dx has the same bits " + ", ".join(name for name, *_ in layouts), values)


@_check("state", "no state across calls (e.g. parameter gradients accumulated, never zeroed)")
def check_state(p: BackwardProbe) -> CheckResult:
    d, lead = p.d(16), p.lead((2, 3))
    rng = p.rng("state")
    x = p.cast(rng.standard_normal(lead + (d,)))
    dy = p.cast(rng.standard_normal(lead + (d,)))
    w, b = p.params(*p.random_params(rng, d))
    # Parameter gradients of the wrong shape are the param_sums check's
    # business: here they are compared only if shaped (d,).
    # A call with dy = 0 first: its parameter gradients are 0, unless the
    # implementation returns sums kept from earlier calls.
    zero = p.call_raw(p.cast(np.zeros_like(dy)), x, w, b, any_param_shape=True)
    first = p.call_raw(dy, x, w, b, any_param_shape=True)
    calls = [first]
    for scale, offset in [(100.0, 50.0), (0.01, -3.0), (1.0, 1000.0)]:
        calls.append(p.call_raw(p.cast(rng.standard_normal(lead + (d,))),
                                p.cast(rng.standard_normal(lead + (d,)) * scale + offset), w, b,
                                any_param_shape=True))
    again = p.call_raw(dy, x, w, b, any_param_shape=True)
    tol = p.tol(d)
    t = p.terms(dy.reshape(-1, d), x.reshape(-1, d), w)
    mw, mb = _param_magnitudes(dy, t.xhat)
    dx_units = _max(tol.dx_units(again.dx.reshape(-1, d).astype(np.float64),
                                 first.dx.reshape(-1, d).astype(np.float64), t.scale))
    param_units = {}
    for name, m in (("dweight", mw), ("dbias", mb)):
        a, f = getattr(again, name), getattr(first, name)
        if a is not None and f is not None and a.shape == f.shape == (d,):
            param_units[name] = _max(tol.param_units(a.astype(np.float64),
                                                     f.astype(np.float64), m))
    ulps = max([_max(ulp_distance(first.dx, again.dx))]
               + [_max_ulps(getattr(first, k), getattr(again, k)) for k in param_units])
    change = max([dx_units] + list(param_units.values()))
    figure = (f"max change {change:.2g} x tol" + (f" ({ulps:.0f} ulp)" if change <= 1 else "")
              if math.isfinite(change) else "non-finite after other calls")
    values = {"dx_units": dx_units, "param_units": param_units, "ulp": ulps}
    accumulated = [name for name, u in param_units.items() if u > 1
                   and _accumulates(getattr(again, name), getattr(calls[-1], name),
                                    getattr(first, name), getattr(zero, name), tol,
                                    mw if name == "dweight" else mb)]
    if accumulated:
        return CheckResult("state", FAIL, figure,
                           f"parameter gradients accumulate across calls: the same input gave "
                           f"{' and '.join(accumulated)} equal to the previous call's plus this "
                           "call's own, after 3 other calls; each backward must return its own "
                           "gradients (zero the accumulators, or sum into fresh arrays)", values)
    if dx_units > 1 or any(u > 1 for u in param_units.values()):
        which = ["dx"] * (dx_units > 1) + [k for k, u in param_units.items() if u > 1]
        return CheckResult("state", FAIL, figure,
                           f"state across calls: the same input gave a different "
                           f"{' and '.join(which)} after 3 other calls; the gradients must "
                           "depend only on the call's own inputs (statistics or gradients "
                           "kept from earlier calls?)", values)
    if ulps > 0:
        return CheckResult("state", WARN, figure,
                           f"not deterministic: the same input gave gradients {ulps:.0f} ulp "
                           "apart across calls", values)
    return CheckResult("state", PASS, figure,
                       "the same input gives bit-identical gradients after 3 other calls", values)


def _accumulates(again: NDArray[Any], previous: NDArray[Any], first: NDArray[Any],
                 zero: NDArray[Any], tol: BackwardTolerance, magnitude: NDArray[Any]) -> bool:
    """Whether ``again`` is the previous call's result plus this input's own
    gradient, ``first`` minus what the call with dy = 0 before it returned
    (a running sum, never reset)."""
    own = first.astype(np.float64) - zero.astype(np.float64)
    total = previous.astype(np.float64) + own
    scale = magnitude + np.abs(previous.astype(np.float64))
    return _max(tol.param_units(again.astype(np.float64), total, scale)) <= 1


@_check("cancellation", "accuracy with a large common offset (no E[x^2] - E[x]^2 in the "
                        "backward)")
def check_cancellation(p: BackwardProbe) -> CheckResult:
    d = p.d(64)
    rng = p.rng("cancellation")
    z = _standard_rows(rng, 8, d)
    dy = p.cast(rng.standard_normal((8, d)))
    unit = unit_roundoff(p.dtype)
    w, b = p.identity_params(d)
    tol = p.tol(d)
    errors: List[float] = []
    excess: List[float] = []
    first: Optional[Tuple[NDArray[Any], Grads]] = None
    for offset in OFFSETS:
        spread = max(1.0, 4 * float(np.spacing(p.dtype.type(offset))))
        shifted = p.cast(offset + spread * z)
        centred = p.cast(shifted.astype(np.float64) - offset)  # exact (Sterbenz)
        got_c = p.rows(dy, centred, w, b)
        got_s = p.rows(dy, shifted, w, b)
        first = first or (centred, got_c)
        t = p.terms(dy, centred)
        # dx and dweight in units of their natural scale (dbias does not
        # depend on x).
        with np.errstate(all="ignore"):
            e_dx = np.abs(got_s.dx - got_c.dx) / t.scale
        mw, _ = _param_magnitudes(dy, t.xhat)
        parts = [_max(e_dx)]
        allowed_dx = (tol.dx.atol + tol.dx.rtol * np.abs(got_c.dx) / t.scale
                      + 4 * math.sqrt(d) * unit * offset / spread)
        ratios = [_max(e_dx / allowed_dx)]
        if got_s.dweight is not None and got_c.dweight is not None:
            with np.errstate(all="ignore"):
                e_w = np.abs(got_s.dweight - got_c.dweight) / mw
            parts.append(_max(e_w))
            allowed_w = (tol.params.atol + tol.params.rtol * np.abs(got_c.dweight) / mw
                         + 4 * math.sqrt(d) * unit * offset / spread)
            ratios.append(_max(e_w / allowed_w))
        errors.append(max(parts))
        excess.append(max(ratios))
    assert first is not None
    again = p.rows(dy, first[0], w, b)
    if not _identical(again.dx, first[1].dx) or not _repeats_params(p, first[1], again, d):
        return _unrepeatable("cancellation", "dx or dweight")
    figure = "error " + " / ".join(f"{e:.1g}" for e in errors) + " at offsets 1e2/1e3/1e4"
    values = {"errors": dict(zip(OFFSETS, errors))}
    if max(excess) <= 1:
        return CheckResult("cancellation", PASS, figure,
                           "no cancellation: dx and dweight accurate with a common offset up to "
                           "1e4", values)
    growth = _growth_per_decade(errors)
    nonfinite = [f"1e{math.log10(o):.0f}" for o, e in zip(OFFSETS, errors)
                 if not math.isfinite(e)]
    if not nonfinite and growth < 0.5:
        return CheckResult("cancellation", FAIL, figure,
                           "not shift-invariant: adding a common offset to x changes the "
                           f"gradients by {errors[0]:.3g} (in units of their scale) already at "
                           "offset 1e2, and not more at larger offsets; the backward does not "
                           "(entirely) subtract the record's mean", values)
    if nonfinite or growth >= 1.5:
        how = (f"the gradients are not finite at offset {', '.join(nonfinite)} (a negative "
               "variance)" if nonfinite else
               f"the error grows about x{10 ** growth:.0f} per decade of offset, with its square")
        return CheckResult("cancellation", FAIL, figure,
                           f"cancellation at large offsets: E[x^2] - E[x]^2 in the backward's "
                           f"statistics: {how}. Recompute the variance as the mean of "
                           "(x - mean)^2 (two passes) or with Welford's algorithm, or use the "
                           "forward's saved statistics", values)
    return CheckResult("cancellation", FAIL, figure,
                       "cancellation at large offsets: precision lost with a common offset, "
                       "the error growing in proportion to it, more than rounding the mean in "
                       f"{p.dtype} explains; accumulate the backward's statistics in a wider "
                       "type", values)


#: The large-d check's floor for dx, per unit of log2(d) (see
#: :data:`~._checks.LARGE_D_FLOOR`): dx is made of several sums and products
#: of them, each a pairwise sum's few units of roundoff per doubling.
LARGE_D_BACKWARD_FLOOR = 4.0


@_check("large_d", "records of 2^10 to 2^20 features: dx's error does not grow with d")
def check_large_d(p: BackwardProbe) -> CheckResult:
    sizes = large_d_sizes(p)
    if isinstance(sizes, CheckResult):
        return sizes
    rng = p.rng("large_d")
    unit = unit_roundoff(p.dtype)
    n = large_d_records_per_size(p)
    errors: List[float] = []
    units: List[float] = []
    for d in sizes:
        x = p.cast(large_d_records(rng, n, d))
        w, b = p.identity_params(d)
        dy = _designed_dy(p, rng, x, w)
        got = p.rows(dy, x, w, b)
        err, worst = 0.0, 0.0
        for i in range(n):
            # Record by record, dx alone (the reference's exact parameter
            # sums are slow at 2^20 features): the float64 formula.
            t = p.terms(dy[i:i + 1], x[i:i + 1])
            want = model_dx(t, mean_path=1.0 if p.op.key == "layer_norm" else 0.0)[0]
            with np.errstate(all="ignore"):
                u = np.abs(got.dx[i] - want) / (unit * float(t.scale[0, 0]))
            worst = max(worst, _max(u))
            err = max(err, _max(np.abs(got.dx[i] - want)))
        errors.append(err)
        units.append(worst)
    sums = ("dx's sums (mean(g) and mean(g * xhat)) or the statistics are"
            if p.op.key == "layer_norm" else "dx's sum mean(g * xhat) or the mean square is")
    return large_d_verdict("large_d", p, sizes, errors, units, "dx", sums,
                           floor=LARGE_D_BACKWARD_FLOOR)


@_check("float16_overflow", "float16 inputs up to 65504 give finite, accurate gradients")
def check_float16_overflow(p: BackwardProbe) -> CheckResult:
    d = p.d(16)
    rng = p.rng("float16_overflow")
    top = float(np.finfo(np.float16).max)  # 65504
    large = {
        "alternating +-65504": np.resize([top, -top], d),
        "all in [60000, 65504]": rng.uniform(60000.0, top, d),
        "one 65504 among zeros": np.eye(1, d)[0] * top,
        "values 300 to 1000": rng.uniform(300.0, 1000.0, d) * rng.choice([-1.0, 1.0], d),
    }
    names = list(large)
    f16 = np.float16
    x = p.cast(list(large.values()) + [rng.standard_normal(d)], f16)
    # dy of 16: large enough that dx = rstd * g stays a normal float16 for
    # a spread of 65504, small enough that no true sum overflows.
    dy = p.cast(rng.standard_normal((len(x), d)) * 16, f16)
    w, b = p.identity_params(d, f16)
    # At eps 0 (where the implementation takes eps) dx scales exactly with
    # the records.
    eps = 0.0 if p.impl.takes_eps else p.eps
    try:
        got = p.rows(dy, x, w, b, eps=eps, dtype=f16)
    except ImplementationError as exc:
        if not exc.figure.startswith("raised"):
            raise
        return CheckResult("float16_overflow", SKIP, "no float16",
                           f"does not accept float16 input: {exc}")
    if not _identical(p.rows(dy, x, w, b, eps=eps, dtype=f16).dx, got.dx):
        return _unrepeatable("float16_overflow")
    # The same records scaled down by powers of two to a largest magnitude
    # of 4 (65504 -> 4): dx scales up by as much, xhat (so dweight) and
    # dbias do not change; whatever differs, beyond what the reference says
    # eps changes, is the cost of large values.
    _, e = np.frexp(np.abs(x.astype(np.float64)).max(axis=-1, keepdims=True))
    factor = np.ldexp(1.0, 3 - e)
    small = p.cast(x * factor, f16)
    got_small = p.rows(dy, small, w, b, eps=eps, dtype=f16)
    tol = p.tol(d, f16) if p.override is None else p.tol(d)
    want, want_small = p.reference(dy, x, eps=eps), p.reference(dy, small, eps=eps)
    t = p.terms(dy, x, eps=eps)
    expected_dx = got_small.dx * factor + (want.dx - want_small.dx * factor)
    dx_units = tol.dx_units(got.dx, expected_dx, t.scale).max(axis=-1)[:-1]
    nonfinite = [names[i] for i in np.flatnonzero(~np.isfinite(got.dx[:-1]).all(axis=-1))]
    params = []
    for name in ("dweight", "dbias"):
        v = getattr(got, name)
        if v is not None and not np.isfinite(v).all():
            params.append(name)
    figure = (f"{len(nonfinite)}/{len(names)} large records non-finite" if nonfinite
              else f"max dx error {_max(dx_units):.2g} x tol")
    if not np.isfinite(got.dx[-1]).all():
        return CheckResult("float16_overflow", FAIL, figure,
                           "non-finite dx even for a plain float16 record")
    advice = ("the backward computes its statistics or sums in float16, where x^2 overflows "
              "for |x| above 256 and sums above 65504; compute them in float32")
    if nonfinite or params:
        what = (f"records with values up to 65504 gave a non-finite dx ({'; '.join(nonfinite)})"
                if nonfinite else f"non-finite {' and '.join(params)}")
        return CheckResult("float16_overflow", FAIL, figure,
                           f"float16 overflow: {what}: {advice}")
    if _max(dx_units) > 1:
        worst = names[int(np.argmax(dx_units))]
        return CheckResult("float16_overflow", FAIL, figure,
                           "float16 overflow: records with values up to 65504 give a dx that "
                           "differs from the same records scaled down to 4 (worst: "
                           f"{worst}, {_max(dx_units):.3g} x tol): {advice}")
    return CheckResult("float16_overflow", PASS, figure,
                       "float16 records with values up to +-65504 give finite gradients, the "
                       "same as the records scaled down")


@_check("nonfinite", "a NaN or Inf in one record leaves the other records' dx unchanged")
def check_nonfinite(p: BackwardProbe) -> CheckResult:
    lead = p.lead((4, 6))
    n = math.prod(lead)
    if n < 2:
        return CheckResult("nonfinite", SKIP, f"leading shape {lead}",
                           "the fixed leading shape holds a single record")
    d = p.d(16)
    rng = p.rng("nonfinite")
    x = p.cast(rng.standard_normal(lead + (d,)))
    dy = p.cast(rng.standard_normal(lead + (d,)))
    w, b = p.params(*p.random_params(rng, d))
    clean = p.call_raw(dy, x, w, b, any_param_shape=True)  # only dx is read
    tol = p.tol(d)
    t = p.terms(dy.reshape(-1, d), x.reshape(-1, d), w)
    spots = [tuple(int(i) for i in np.unravel_index(k, lead)) for k in (n // 3, (2 * n) // 3)]
    if spots[0] == spots[1]:
        spots[1] = tuple(int(i) for i in np.unravel_index(n - 1, lead))
    leaks, worst = [], 0
    for label, where, value, at in (("a NaN in x", "x", np.nan, spots[0]),
                                    ("+Inf in x", "x", np.inf, spots[1]),
                                    ("a NaN in dy", "dy", np.nan, spots[1])):
        px, pdy = x.copy(), dy.copy()
        (px if where == "x" else pdy)[at + (d // 2,)] = value
        got = p.call(pdy, px, w, b, any_param_shape=True)
        bad = (tol.dx_units(got.dx.reshape(-1, d), clean.dx.reshape(-1, d).astype(np.float64),
                            t.scale).max(axis=-1) > 1).reshape(lead)
        bad[at] = False
        hit = [tuple(int(i) for i in m) for m in np.argwhere(bad)]
        worst = max(worst, len(hit))
        if hit:
            leaks.append(f"{label} of record {_fmt_index(at)} changed the dx of {len(hit)} other "
                         f"record(s) (e.g. {_fmt_indices(hit, 3)})")
    if not _grads_identical(clean, p.call_raw(dy, x, w, b, any_param_shape=True)):
        return _unrepeatable("nonfinite")
    figure = f"{worst}/{n - 1} clean records affected"
    if leaks:
        return CheckResult("nonfinite", FAIL, figure,
                           f"NaN/Inf leaks into other records' dx: {'; '.join(leaks)}. A "
                           "statistic is shared across records (a batch-wide max, sum or mean); "
                           "a NaN or Inf must stay inside its own record's dx (the parameter "
                           "gradients, sums over all records, do become NaN)")
    return CheckResult("nonfinite", PASS, figure,
                       "a NaN or +Inf in one record's x or dy leaves every other record's dx "
                       "unchanged")


@_check("param_invariance", "dweight and dbias bit for bit the same for any record order, "
                            "batch layout and thread count (warning by default)")
def check_param_invariance(p: BackwardProbe) -> CheckResult:
    if not (p.impl.returns_dweight or p.impl.returns_dbias):
        return _needs_param(p, "param_invariance")
    d = p.d(64)
    rng = p.rng("param_invariance")
    lead = p.lead((512,))
    n = math.prod(lead)
    x = p.cast(rng.standard_normal((n, d)) * 3 + 1)
    dy = p.cast(rng.standard_normal((n, d)))
    w, b = p.params(*p.random_params(rng, d))

    def run(order: NDArray[Any], shape: Tuple[int, ...]) -> Grads:
        return p.call_raw(dy[order].reshape(shape + (d,)), x[order].reshape(shape + (d,)), w, b,
                          any_param_shape=True)

    natural = np.arange(n)
    base = run(natural, lead)
    shapes = [a.shape for a in (base.dweight, base.dbias) if a is not None]
    if any(s != (d,) for s in shapes):
        return CheckResult("param_invariance", SKIP, "parameter gradients shaped "
                           + " and ".join(str(s) for s in shapes),
                           f"the parameter gradients are not shaped ({d},) (see the param_sums "
                           "check), so their bits cannot be compared across layouts")
    # (what changed, how to call, what to compare with)
    variants: List[Tuple[str, Callable[[], Grads], Grads]] = [
        ("called again", lambda: run(natural, lead), base),
        ("with the records permuted", lambda: run(rng.permutation(n), lead), base),
        ("with the records reversed", lambda: run(natural[::-1], lead), base),
    ]
    if not p.fixed_lead:
        variants.append(("as a (8, 64) batch", lambda: run(natural, (8, 64)), base))
    threads = p.impl.threads
    if threads is not None:
        # Enough records for the implementation to use its threads.
        big = max(n, -(-threads.min_bytes // (d * p.dtype.itemsize)) + 1)
        big_lead = lead if p.fixed_lead else (big,)
        big_x = p.cast(rng.standard_normal(big_lead + (d,)) * 3 + 1)
        big_dy = p.cast(rng.standard_normal(big_lead + (d,)))

        def with_threads(count: int) -> Grads:
            assert threads is not None
            with threads.using(count):
                return p.call_raw(big_dy, big_x, w, b, any_param_shape=True)

        first_count = with_threads(threads.counts[0])
        for count in threads.counts[1:]:
            def other_count(count: int = count) -> Grads:
                return with_threads(count)
            variants.append((f"with {count} threads instead of {threads.counts[0]} "
                             f"({threads.name})", other_count, first_count))
    t = p.terms(dy, x, w)
    mw, mb = _param_magnitudes(dy, t.xhat)
    tol = p.tol(d)
    found: List[Tuple[str, float, float]] = []
    for label, call, reference in variants:
        other = call()
        if [a.shape for a in (other.dweight, other.dbias) if a is not None] != shapes:
            return CheckResult("param_invariance", SKIP, "parameter gradients reshaped",
                               f"the parameter gradients change shape {label} (see the "
                               "param_sums check), so their bits cannot be compared")
        ulps = max(_max_ulps(reference.dweight, other.dweight),
                   _max_ulps(reference.dbias, other.dbias))
        # (The thread runs' magnitudes are larger; in units of these, a
        # difference there is only overstated.)
        units = max([_max(tol.param_units(o.astype(np.float64), g.astype(np.float64), m))
                     for g, o, m in ((reference.dweight, other.dweight, mw),
                                     (reference.dbias, other.dbias, mb))
                     if g is not None and o is not None] or [0.0])
        found.append((label, ulps, units))
    worst = max(found, key=lambda f: f[1])
    figure = f"max difference {worst[1]:.0f} ulp"
    values = {"ulp": worst[1], "by": {label: u for label, u, _ in found}}
    tried = ", ".join(label for label, *_ in found[1:])
    if worst[1] == 0:
        return CheckResult("param_invariance", PASS, figure,
                           f"bit-identical parameter gradients {tried}", values)
    if found[0][2] > 1:
        return _unrepeatable("param_invariance", "dweight or dbias")
    if found[0][1] > 0:
        return CheckResult("param_invariance", FAIL if p.strict_batch_invariance else WARN,
                           figure,
                           f"parameter gradients not deterministic: the same call gave dweight/"
                           f"dbias {found[0][1]:.0f} ulp apart (atomic or unordered "
                           "accumulation?)", values)
    beyond = [label for label, _, u in found if u > 1]
    if beyond:
        units = max(u for _, _, u in found)
        figure = (f"max difference {units:.2g} x tol" if math.isfinite(units) else
                  "non-finite parameter gradients")
        return CheckResult("param_invariance", FAIL, figure,
                           f"parameter gradients change beyond tolerance {beyond[0]}: the sums "
                           "depend on the record order, not only in their rounding", values)
    changed = [f"{label} ({u:.0f} ulp)" for label, u, _ in found if u > 0]
    return CheckResult("param_invariance", FAIL if p.strict_batch_invariance else WARN, figure,
                       "parameter gradients depend on the thread count or record order: "
                       f"dweight/dbias change bits {'; '.join(changed)}, within tolerance: the "
                       "sums over the records are accumulated in an order that depends on the "
                       "layout or the threads; many valid kernels are like this, but training "
                       "is then not bit-reproducible", values)


#: The names of all backward checks, in the order they run.
BACKWARD_CHECKS: Tuple[str, ...] = tuple(BACKWARD_REGISTRY)
