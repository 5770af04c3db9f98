"""The checks of the RMSNorm backward battery.

Most are the LayerNorm backward battery's, reading the op from the probe:
its reference (:func:`layernorm_c.reference_rms_norm_backward`) and its
terms, where ``c`` is x itself and the statistic is the mean square. An
RMSNorm's dx is then a LayerNorm's with no term through the mean::

    dx = rstd * (g - xhat * mean(g * xhat)),   g = dy * scale

so the same decomposition reads it (the mean path's factor is 0 when
correct), and the paths check fits the models of RMSNorm's defects. The
scale check names a backward whose ``g`` uses the other weight convention.
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from ._backward_checks import (BACKWARD_REGISTRY, BackwardCheck, _check, _designed_records,
                               _no_fit, fit_dx, path_defect, read_paths)
from ._backward_numerics import model_dx, record_terms
from ._backward_probe import BackwardProbe
from ._report import FAIL, PASS, CheckResult
from ._rms_checks import no_weight

__all__ = ["RMS_BACKWARD_CHECKS", "RMS_BACKWARD_REGISTRY"]

RMS_BACKWARD_REGISTRY: Dict[str, BackwardCheck] = {}


def _shared(name: str, title: str = "") -> None:
    check = BACKWARD_REGISTRY[name]
    RMS_BACKWARD_REGISTRY[name] = BackwardCheck(name, title or check.title, check.run)


#: The structural models of RMSNorm's dx: (mean path, variance path, sign).
RMS_PATH_MODELS: Dict[str, Tuple[float, float, float]] = {
    "correct": (0.0, 1.0, 1.0),
    "mean_included": (1.0, 1.0, 1.0),
    "constant": (0.0, 0.0, 1.0),
    "sign": (0.0, 1.0, -1.0),
    "var_sign": (0.0, -1.0, 1.0),
}
RMS_PATH_DEFECTS = {
    "mean_included": "mean path wrongly included: dx has LayerNorm's term -rstd * mean(g) "
                     "(g = dy * scale), which an RMSNorm, whose forward subtracts no mean, "
                     "does not have",
    "constant": "the root mean square treated as a constant: dx = rstd * dy * scale, with no "
                "gradient through mean(x^2) (detached, or a hand-written backward that stops "
                "at the chain rule's first term)",
    "sign": "sign error: dx is the negative of the gradient",
    "var_sign": "sign error in the term through the mean square: dx = rstd * (g + xhat * "
                "mean(g * xhat))",
}
RMS_FORMULA = "rstd * (g - xhat * mean(g * xhat)) with g = dy * scale, xhat = x * rstd"

_shared("contract", "dx shaped like x in x's dtype, dweight shaped (d,); inputs left unchanged")
_shared("reference", "agreement with reference_rms_norm_backward (float64) on random data")


@_check("paths", "dx has the term through the mean square, with the right sign, and none "
                 "through a mean", RMS_BACKWARD_REGISTRY)
def check_paths(p: BackwardProbe) -> CheckResult:
    read = read_paths(p)
    if isinstance(read, CheckResult):
        return read
    d, got, t, dec = read
    r_eff = dec.rstd[:, None]
    models = {k: [model_dx(t, rstd=r_eff, mean_path=a, var_path=v, sign=s)]
              for k, (a, v, s) in RMS_PATH_MODELS.items()}
    result = fit_dx(got.dx, models, p.tol(d), t)
    a, v, s = (round(float(np.median(dec.mean_path)), 2) + 0.0,
               round(float(np.median(dec.var_path)), 2) + 0.0,
               float(np.median(np.sign(dec.sign_rstd))))
    figure = f"mean path x{a:.2f}, mean-square path x{v:.2f}, sign {s:+.0f}"
    values = {"mean_path": a, "var_path": v, "sign": s, "scores": dict(result.scores)}
    if result.fits("correct"):
        return CheckResult("paths", PASS, figure,
                           f"dx = {RMS_FORMULA}: the gradient flows through the mean square, "
                           "and through no mean", values)
    return path_defect(result, RMS_PATH_DEFECTS, RMS_FORMULA, "a mean and the mean square",
                       figure, values)


_shared("eps", "the backward uses the forward's eps, inside the square root")


@_check("scale", "dx scales dy by the weight of the audited convention (weight or "
                 "1 + weight)", RMS_BACKWARD_REGISTRY)
def check_scale(p: BackwardProbe) -> CheckResult:
    if not p.impl.takes_weight:
        return no_weight("scale")
    d = p.d(16)
    dy, x, w, b, _ = _designed_records(p, "scale", 8, d)
    got = p.rows(dy, x, w, b)
    assert w is not None
    other = not p.op.plus_one
    conventions = {
        "correct": p.terms(dy, x, w),
        "convention": record_terms(dy, x, w, p.eps, centered=False, plus_one=other),
        "missing": record_terms(dy, x, None, p.eps, centered=False),
    }
    t = conventions["correct"]
    # Each convention with each structure of dx (the paths check's
    # business), in units of the audited terms' scale: a defect of the paths
    # does not blur this one.
    models = {(k, path): [model_dx(terms, mean_path=a, var_path=v, sign=sg)]
              for k, terms in conventions.items()
              for path, (a, v, sg) in RMS_PATH_MODELS.items()}
    result = fit_dx(got.dx, models, p.tol(d), t)
    fitting = {k for k, path in result.scores if result.fits((k, path))}
    expected = "dy * (1 + weight)" if p.op.plus_one else "dy * weight"
    wrong = "dy * weight" if p.op.plus_one else "dy * (1 + weight)"
    figure = f"closest: {result.best[0]} ({result.scores[result.best]:.2g} x tol)"
    if "correct" in fitting:
        return CheckResult("scale", PASS, figure, f"dx is computed from g = {expected}")
    if fitting == {"convention"}:
        return CheckResult("scale", FAIL, figure,
                           f"the wrong weight convention in the backward: it computes "
                           f"g = {wrong} where the forward scales by {expected[5:]} "
                           f"(convention={p.op.convention!r}); dx must use g = {expected}")
    if fitting == {"missing"}:
        return CheckResult("scale", FAIL, figure,
                           f"weight missing from dx: the backward uses g = dy; it must be "
                           f"g = {expected}")
    if fitting:
        return CheckResult("scale", FAIL, figure,
                           "dx is wrong, and the tolerance is too loose to tell which weight "
                           f"convention it uses: it fits {' and '.join(sorted(fitting))}")
    return CheckResult("scale", FAIL, figure,
                       "dx " + _no_fit("weight convention", result))


_shared("param_grads", "each record adds dy * xhat to dweight (right sign)")
_shared("param_sums", "dweight summed over every record (all leading axes)")
_shared("coupling")
_shared("state")
_shared("float16_overflow")
_shared("large_d")
_shared("nonfinite")
_shared("param_invariance", "dweight bit for bit the same for any record order, batch layout "
                            "and thread count (warning by default)")

#: The names of the RMSNorm backward checks, in the order they run.
RMS_BACKWARD_CHECKS: Tuple[str, ...] = tuple(RMS_BACKWARD_REGISTRY)
