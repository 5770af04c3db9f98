"""Numerical helpers of the checks: tolerances, ulp distances, and the
float64 models of common LayerNorm defects an output is fitted against."""
from __future__ import annotations

from dataclasses import dataclass
import math
from typing import (Any, Dict, Final, Generic, Hashable, List, Literal, Mapping, Optional,
                    Sequence, Tuple, TypeVar)

import numpy as np
import numpy.typing as npt

from ._ops import bfloat16, is_float

__all__ = ["Tolerance", "TOLERANCES", "ulp_distance", "model_layer_norm", "EPS_MODES",
           "model_rms_norm", "RMS_EPS_MODES", "fit", "Fit", "tolerance_for", "distinct",
           "fmt_value", "nonfinite_words", "growth_exponent", "fmt_growth", "fmt_pow2",
           "eps_roundings", "Mode", "MODES"]


@dataclass(frozen=True)
class Tolerance:
    """Elementwise ``|got - expected| <= atol + rtol * |expected|``."""

    rtol: float
    atol: float

    def units(self, got: npt.ArrayLike, expected: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """The error in multiples of the allowed error (inf where ``got`` is
        not finite and ``expected`` is, 0 where both are the same non-finite
        value)."""
        g = np.asarray(got, np.float64)
        e = np.asarray(expected, np.float64)
        with np.errstate(all="ignore"):
            err = np.abs(g - e) / (self.atol + self.rtol * np.abs(e))
        same = (g == e) | (np.isnan(g) & np.isnan(e))
        return np.where(same, 0.0, np.where(np.isnan(err), np.inf, err)).astype(np.float64)

    def worst(self, got: npt.ArrayLike, expected: npt.ArrayLike) -> float:
        """The largest error in tolerance units (1 is the limit)."""
        u = self.units(got, expected)
        return float(u.max()) if u.size else 0.0

    def __str__(self) -> str:
        return f"rtol={self.rtol:g}, atol={self.atol:g}"


#: Default tolerances by output dtype, for outputs of order 1. float16 allows
#: a few of its ulps (4e-3, about 8 units of its roundoff 2^-11); float32
#: allows what a float32 kernel with float32 accumulation loses; float64
#: allows rounding, not a float32 detour. bfloat16 (when ml_dtypes is
#: installed) allows as many units of its roundoff 2^-8 as float16 does of
#: its own: 8 * 2^-8 = 2^-5.
TOLERANCES: Dict[np.dtype[Any], Tolerance] = {
    np.dtype(np.float16): Tolerance(rtol=4e-3, atol=4e-3),
    np.dtype(np.float32): Tolerance(rtol=1e-5, atol=1e-5),
    np.dtype(np.float64): Tolerance(rtol=1e-12, atol=1e-12),
}
if bfloat16() is not None:
    TOLERANCES[np.dtype(bfloat16())] = Tolerance(rtol=2.0 ** -5, atol=2.0 ** -5)


def tolerance_for(dtype: np.dtype[Any], rtol: Optional[float] = None,
                  atol: Optional[float] = None) -> Tolerance:
    """The default tolerance of ``dtype``, with ``rtol``/``atol`` overriding
    it where given."""
    default = TOLERANCES[dtype]
    return Tolerance(default.rtol if rtol is None else float(rtol),
                     default.atol if atol is None else float(atol))


def ulp_distance(a: npt.ArrayLike, b: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """How many representable numbers apart ``a`` and ``b`` are,
    elementwise (0 for bit-identical values, and for two NaNs).

    ``a`` and ``b`` must have the same floating dtype; a NaN against a
    number counts as the largest distance.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    if a.dtype != b.dtype or not is_float(a.dtype):
        a, b = a.astype(np.float64), b.astype(np.float64)
    bits = np.dtype(f"int{8 * a.dtype.itemsize}")

    def ordered(v: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
        # Sign-magnitude to a monotone integer line, in int64 (no overflow
        # for the widths used here; float64 magnitudes fit in 63 bits).
        i = v.view(bits).astype(np.int64)
        magnitude = i & np.int64(np.iinfo(bits).max)
        return np.where(i < 0, -magnitude, magnitude)

    dist = np.abs(ordered(a) - ordered(b)).astype(np.float64)
    nan_a, nan_b = np.isnan(a.astype(np.float64)), np.isnan(b.astype(np.float64))
    dist = np.where(nan_a & nan_b, 0.0, dist)
    return np.where(nan_a ^ nan_b, np.inf, dist).astype(np.float64)


#: How eps enters the denominator, by name.
EPS_MODES = ("variance", "std", "ignored", "twice")


def model_layer_norm(x: npt.ArrayLike, weight: Optional[npt.ArrayLike] = None,
                     bias: Optional[npt.ArrayLike] = None, eps: float = 1e-5, *, ddof: int = 0,
                     eps_mode: str = "variance") -> npt.NDArray[np.float64]:
    """LayerNorm over the last axis in float64, with a chosen (possibly
    defective) convention for the variance and for eps.

    Parameters
    ----------
    x : array_like
        Input records, last axis normalized.
    weight, bias : array_like, optional
        Gain and bias of shape ``(d,)``.
    eps : float
    ddof : {0, 1}
        0 divides the variance by d (correct); 1 by d - 1 (sample
        variance).
    eps_mode : {'variance', 'std', 'ignored', 'twice'}
        ``sqrt(var + eps)`` (correct), ``sqrt(var) + eps``, ``sqrt(var)``,
        ``sqrt(var + 2 eps)``.

    Returns
    -------
    ndarray of float64
    """
    x64 = np.asarray(x, np.float64)
    centered = x64 - x64.mean(axis=-1, keepdims=True)
    d = x64.shape[-1]
    with np.errstate(all="ignore"):
        var = (centered * centered).sum(axis=-1, keepdims=True) / (d - ddof)
        denominator = {
            "variance": lambda: np.sqrt(var + eps),
            "std": lambda: np.sqrt(var) + eps,
            "ignored": lambda: np.sqrt(var),
            "twice": lambda: np.sqrt(var + 2 * eps),
        }[eps_mode]()
        y: npt.NDArray[np.float64] = centered / denominator
    if weight is not None:
        y = y * np.asarray(weight, np.float64)
    if bias is not None:
        y = y + np.asarray(bias, np.float64)
    return y


#: How eps enters an RMSNorm's denominator: ``sqrt(ms + eps)`` (correct),
#: ``sqrt(ms) + eps`` (outside the square root), ``sqrt(ms)``,
#: ``sqrt(ms + 2 eps)``.
RMS_EPS_MODES = ("inside", "outside", "ignored", "twice")


def model_rms_norm(x: npt.ArrayLike, eps: float = 1e-6, *, centered: bool = False,
                   ddof: int = 0, root: bool = True,
                   eps_mode: str = "inside") -> npt.NDArray[np.float64]:
    """RMSNorm over the last axis in float64 (scale 1), with a chosen
    (possibly defective) convention.

    Parameters
    ----------
    x : array_like
    eps : float
    centered : bool
        Subtract each record's mean first (a LayerNorm).
    ddof : {0, 1}
        Divide the sum of squares by d (correct) or d - 1.
    root : bool
        Divide by the root of the mean square (correct) or by the mean
        square itself (square root missing; then ``'outside'`` is
        ``'inside'``).
    eps_mode : {'inside', 'outside', 'ignored', 'twice'}
        See :data:`RMS_EPS_MODES`.

    Returns
    -------
    ndarray of float64
    """
    x64 = np.asarray(x, np.float64)
    c = x64 - x64.mean(axis=-1, keepdims=True) if centered else x64
    d = x64.shape[-1]
    with np.errstate(all="ignore"):
        ms = (c * c).sum(axis=-1, keepdims=True) / (d - ddof)
        total = {"inside": ms + eps, "outside": ms, "ignored": ms, "twice": ms + 2 * eps}[eps_mode]
        denominator = np.sqrt(total) if root else total
        if eps_mode == "outside":
            denominator = denominator + eps
        y: npt.NDArray[np.float64] = c / denominator
    return y


#: The key of a candidate model.
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Fit(Generic[K]):
    """Which candidate model explains an output best.

    Attributes
    ----------
    best : str
        The key of the best-fitting model.
    scores : dict
        Each model's worst error in tolerance units (<= 1 fits).
    """

    best: K
    scores: Dict[K, float]

    def fits(self, key: Optional[K] = None) -> bool:
        """Whether model ``key`` (default: the best) is within tolerance."""
        return self.scores[self.best if key is None else key] <= 1.0


def fit(outputs: Sequence[npt.NDArray[Any]],
        models: Mapping[K, Sequence[npt.NDArray[Any]]], tol: Tolerance) -> Fit[K]:
    """Score every candidate model against the measured outputs.

    Parameters
    ----------
    outputs : list of ndarray
        What the implementation returned, one array per probe.
    models : dict of str to list of ndarray
        For each candidate, what it predicts for each probe.
    tol : Tolerance

    Returns
    -------
    Fit
        Ties go to the first model listed, so list the correct one first.
    """
    scores = {
        key: max(tol.worst(got, want) for got, want in zip(outputs, predictions))
        for key, predictions in models.items()
    }
    best = min(scores, key=lambda k: scores[k])
    return Fit(best, scores)


# -- how a battery runs ----------------------------------------------------------

#: How much an audit measures: ``'quick'`` (a smaller large-d sweep, for a
#: pre-commit hook), ``'default'``, ``'thorough'`` (the large-d sweep to
#: 2^22 with more records; minutes on a slow implementation).
Mode = Literal["quick", "default", "thorough"]
MODES: Final[Tuple[Mode, ...]] = ("quick", "default", "thorough")


# -- words for numbers ----------------------------------------------------------

def fmt_value(v: float, digits: int = 7) -> str:
    """A number as a report writes it: ``digits`` significant digits, NaN
    and infinities by name."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.{digits}g}"


def distinct(a: float, b: float, digits: int = 7) -> Tuple[str, str]:
    """``a`` and ``b`` with at least ``digits`` significant digits, and as
    many more as it takes for the two to read differently (up to the 17
    that tell any two float64 apart): a report never says "gives
    -0.1208348 instead of -0.1208348"."""
    a, b = float(a), float(b)
    for n in range(digits, 18):
        sa, sb = fmt_value(a, n), fmt_value(b, n)
        if sa != sb or a == b or (math.isnan(a) and math.isnan(b)):
            return sa, sb
    return repr(a), repr(b)


def nonfinite_words(got: npt.ArrayLike, want: npt.ArrayLike,
                    want_name: str = "the reference") -> Optional[str]:
    """What a comparison with a NaN or an infinity on one side is, in words
    ("returns NaN where the reference is finite"), or None when every
    element is finite on both sides or non-finite alike."""
    g = np.asarray(got, np.float64)
    w = np.asarray(want, np.float64)
    parts: List[str] = []
    checks = (
        (np.isnan(g) & np.isfinite(w), f"returns NaN where {want_name} is finite"),
        (np.isinf(g) & np.isfinite(w), f"returns an infinity where {want_name} is finite"),
        (np.isfinite(g) & np.isnan(w), f"returns a finite value where {want_name} is NaN"),
        (np.isfinite(g) & np.isinf(w), f"returns a finite value where {want_name} is "
                                       "infinite"),
        (np.isnan(g) & np.isinf(w), f"returns NaN where {want_name} is infinite"),
        (np.isinf(g) & np.isnan(w), f"returns an infinity where {want_name} is NaN"),
        (np.isinf(g) & np.isinf(w) & (np.sign(g) != np.sign(w)),
         f"returns an infinity of the other sign than {want_name}'s"),
    )
    for mask, words in checks:
        count = int(np.count_nonzero(mask))
        if count:
            parts.append(f"{words} ({count} of {g.size} values)")
    return "; ".join(parts) if parts else None


def fmt_pow2(d: int) -> str:
    """``2^k`` for a power of two, else the number."""
    k = int(d).bit_length() - 1
    return f"2^{k}" if d > 0 and 1 << k == d else str(d)


def growth_exponent(sizes: Sequence[int], errors: Sequence[float],
                    floor: float = 0.0) -> float:
    """The slope ``k`` of ``log(error)`` against ``log(d)`` (least squares):
    the error grows as ``d^k``. Errors at or below ``floor`` count as
    ``floor`` (a measurement at rounding level carries no slope); 0 for
    fewer than two usable points; inf when an error is not finite."""
    pairs = [(math.log(d), math.log(max(e, floor))) for d, e in zip(sizes, errors)
             if max(e, floor) > 0]
    if any(not math.isfinite(e) for e in errors):
        return math.inf
    if len(pairs) < 2:
        return 0.0
    xs = np.array([p[0] for p in pairs])
    ys = np.array([p[1] for p in pairs])
    xs = xs - xs.mean()
    return float(np.sum(xs * (ys - ys.mean())) / np.sum(xs * xs))


def fmt_growth(k: float) -> str:
    """How an error grows with d, in words, from :func:`growth_exponent`."""
    if not math.isfinite(k):
        return "not finite at the largest d"
    if k < 0.15:
        return "no growth beyond log d"
    return f"error ~ d^{k:.2f}"


def eps_roundings(eps: float) -> Dict[str, float]:
    """``eps`` as it becomes when stored in a narrower type (float32,
    float16, bfloat16 where ml_dtypes is installed), for the roundings that
    change it, by the type's name."""
    out: Dict[str, float] = {}
    kinds: List[Tuple[str, Any]] = [("float32", np.float32), ("float16", np.float16)]
    bf16 = bfloat16()
    if bf16 is not None:
        kinds.append(("bfloat16", bf16))
    for name, kind in kinds:
        with np.errstate(all="ignore"):
            rounded = float(np.asarray(eps, np.float64).astype(kind).astype(np.float64))
        if rounded != eps and math.isfinite(rounded):
            out[name] = rounded
    return out
