"""Strategies and oracles shared by the API fuzz tests (tests/test_fuzz_*.py),
tools/fuzz_api.py and the stress tests.

Imported as plain ``import fuzz_support`` (pytest's pythonpath includes tests/).

The oracle in here is the contract of the API, written once:

* ``layer_norm`` returns a correct result or raises ``TypeError`` /
  ``ValueError``, and for inputs that the documentation calls valid it must
  return. Correct means: the documented shape and dtype, ``out`` returned
  when given, values within a per-dtype error bound of the float64 oracle
  :func:`layernorm_c.reference_layer_norm`, the caller's inputs unchanged.
* ``layer_norm_ufunc`` (the raw gufunc) follows NumPy's rules for
  broadcasting, casting and ``out``; an invalid eps (negative, NaN, inf)
  gives NaN records and a ``RuntimeWarning`` instead of an exception.

Error bound per element (float64 arithmetic), for a record with reference
mean ``m``, variance ``v``, ``rstd = 1/sqrt(v + eps)``, ``z = (x - m) * rstd``::

    T[dtype] * (1 + |z*w| + |b|)                 rounding of the output pass
    + e_mean * rstd * |w|                         error of the mean
    + |z*w| * e_var / (2 (v + eps))               error of the variance

``T`` is the tests' tolerance table, ``cases.Y_TOL`` (float16 2e-3,
float32 1e-5, float64 1e-12). ``e_mean`` bounds the error of a summed mean,
from the kernels' ``LANES`` and ``BLOCK`` (``cases``, as ``_core`` reports
them): for float64 ``(d/LANES + log2(LANES) + 3) * 2**-52 * max|x|`` (each
of the LANES double lanes sums d/LANES terms, then a pairwise tree of depth
log2(LANES) and the final roundings); for float32 and float16, computed in
float32, ``(BLOCK/LANES)**2 * 2**-24 * max|x - x[0]| + 2**-46 |m|`` (float
lanes of BLOCK/LANES terms after a shift by the first element, and the
two-float split of the mean), plus the float64 term for the lanes' totals.
A record whose variance error could exceed 1% of ``v + eps``
(or whose mean error exceeds 0.5% of ``sqrt(v + eps)``) is ill-conditioned
(its result is rounding noise in any implementation) and not checked.
Where the float64 oracle itself under- or overflows on finite float64
data, the record is recomputed by the oracle scaled by a power of two
(``rescue_reference``). An element with an infinite or NaN weight or bias
must be non-finite, NaN or +-inf (``z * inf`` with ``z`` zero or not).

The memory layouts the arrays are drawn in are ``cases.LAYOUTS``, shared
with the tests of the C core.
"""
from __future__ import annotations

import decimal
import fractions
import math
import numbers
import os
from typing import Any, NamedTuple, Optional, Tuple

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import layernorm_c as lnc
from cases import (BLOCK, BOUNDARY_D, F32, F64, FLOAT_DTYPES, FUZZ_LAYOUTS, LANES, STATS_TOL,
                   Y_TOL, with_layout)
from layernorm_c import _bf16

#: ml_dtypes.bfloat16's dtype when layernorm_c registered its loops for it
#: (ml_dtypes installed), else None: the strategies then never draw it.
BF16: Optional[np.dtype] = _bf16.BFLOAT16
#: A bfloat16 result is off from the exact value by at most half a unit in
#: its 8th bit, relative (its unit roundoff).
BF16_UNIT = 2.0**-8

AxisError = getattr(getattr(np, "exceptions", np), "AxisError")

_CASTINGS = ("no", "equiv", "safe", "same_kind", "unsafe")


def resolve_loop(ufunc, dtypes, casting="same_kind", signature=None) -> tuple:
    """The dtypes of the loop NumPy runs for operands of ``dtypes`` (``None``
    for an output to be found): ``ufunc.resolve_dtypes`` where NumPy has it
    (1.24+). On older NumPy, the search NumPy 1.x does for a ufunc of
    legacy loops like ``layer_norm_ufunc``: the first loop of ``ufunc.types``
    that the inputs cast to (with ``casting``, but never more than
    ``'safe'``), whose outputs cast to the given output dtypes with
    ``casting``, and that agrees with the dtypes fixed in ``signature``.
    TypeError if no loop fits. (tests/test_fuzz_api.py checks the two agree,
    and that the search predicts the calls' result dtypes.)"""
    if hasattr(ufunc, "resolve_dtypes"):
        extra = {} if signature is None else {"signature": signature}
        return ufunc.resolve_dtypes(dtypes, casting=casting, **extra)
    return legacy_resolve_loop(ufunc, dtypes, casting, signature)


def legacy_resolve_loop(ufunc, dtypes, casting="same_kind", signature=None) -> tuple:
    """:func:`resolve_loop` on NumPy without ``ufunc.resolve_dtypes``."""
    nin = ufunc.nin
    input_casting = _CASTINGS[min(_CASTINGS.index(casting), _CASTINGS.index("safe"))]
    for types in ufunc.types:
        loop = tuple(np.dtype(c) for c in types.replace("->", ""))
        if signature is not None and any(
                s is not None and np.dtype(s) != t for s, t in zip(signature, loop)):
            continue
        if all(np.can_cast(d, t, input_casting) for d, t in zip(dtypes[:nin], loop)) and \
                all(d is None or np.can_cast(t, d, casting)
                    for d, t in zip(dtypes[nin:], loop[nin:])):
            return loop
    raise TypeError(f"{ufunc.__name__}: no loop for {dtypes} with casting={casting!r}, "
                    f"signature={signature}")


#: True for the long, randomized run (LAYERNORM_C_FUZZ=1).
FUZZ = os.environ.get("LAYERNORM_C_FUZZ", "") not in ("", "0")

#: Largest last-axis length drawn; the long run reaches "very large d".
MAX_D = 1 << 22 if FUZZ else 1 << 16
#: Largest number of elements of one generated array.
MAX_SIZE = 1 << 22 if FUZZ else 1 << 17


# --------------------------------------------------------------------- dtypes

def weighted(*pairs):
    """One of several strategies (or plain values), picked with the given
    integer weights; shrinks towards the first."""
    pairs = [(w, s if isinstance(s, st.SearchStrategy) else st.just(s)) for w, s in pairs]
    total = sum(w for w, _ in pairs)

    def pick(i):
        for w, s in pairs:
            if i < w:
                return s
            i -= w
        raise AssertionError

    return st.integers(0, total - 1).flatmap(pick)


def _string_dtype():
    StringDType = getattr(getattr(np, "dtypes", None), "StringDType", None)
    return st.just(StringDType()) if StringDType is not None else st.just(np.dtype("U3"))


float_dtypes = hnp.floating_dtypes(endianness="?", sizes=(16, 32, 64))
#: The float dtypes the kernels compute, and bfloat16 when it is registered.
kernel_dtypes = weighted((6, float_dtypes), (1 if BF16 is not None else 0, st.just(BF16)))
real_dtypes = weighted(
    (12, float_dtypes),
    (2 if BF16 is not None else 0, st.just(BF16)),
    (2, hnp.integer_dtypes(endianness="?")),
    (2, hnp.unsigned_integer_dtypes(endianness="?")),
    (1, hnp.boolean_dtypes()),
)
#: Every kind of NumPy dtype, valid ones far more often.
any_dtype = weighted(
    (30, real_dtypes),
    (1, st.just(np.dtype(np.longdouble))),
    (1, hnp.complex_number_dtypes(endianness="?")),
    (1, hnp.datetime64_dtypes(endianness="?")),
    (1, hnp.timedelta64_dtypes(endianness="?")),
    (1, hnp.byte_string_dtypes(endianness="?", min_len=1, max_len=4)),
    (1, hnp.unicode_string_dtypes(endianness="?", min_len=1, max_len=4)),
    (1, hnp.array_dtypes(subtype_strategy=hnp.scalar_dtypes(), max_size=3)),
    (1, st.just(np.dtype(object))),
    (1, st.sampled_from([np.dtype("V4"), np.dtype("V8")])),
    (1, _string_dtype()),
)


def is_bf16(dt) -> bool:
    """True for ml_dtypes.bfloat16 (registered with layernorm_c)."""
    return BF16 is not None and dt is not None and np.dtype(dt) == BF16


def is_float(dt) -> bool:
    """A dtype the kernels compute: float16/32/64, bfloat16 when registered."""
    return dt is not None and ((dt.kind == "f" and dt.itemsize <= 8) or is_bf16(dt))


def is_real(dt: np.dtype) -> bool:
    """A dtype layer_norm accepts: bool, integers, float16/32/64, bfloat16
    (when registered)."""
    return dt.kind in "biu" or is_float(dt)


def finfo(dt: np.dtype):
    """np.finfo, or ml_dtypes' for bfloat16."""
    if is_bf16(dt):
        import ml_dtypes
        return ml_dtypes.finfo(dt)
    return np.finfo(dt)


def compute_dtype(*dts) -> np.dtype:
    """layer_norm's documented result dtype (integers and bool as float64;
    bfloat16 alone stays bfloat16, with other floats it is float32)."""
    dts = [F64 if dt.kind in "biu" else dt.newbyteorder("=") for dt in dts if dt is not None]
    if any(is_bf16(dt) for dt in dts):
        others = [dt for dt in dts if not is_bf16(dt)]
        return np.result_type(F32, *others) if others else BF16
    return np.result_type(*dts)


def widen_bf16(a):
    """A bfloat16 array as float32 (exact); anything else as it is."""
    if isinstance(a, np.ndarray) and is_bf16(a.dtype):
        return a.astype(F32)
    return a


def same_bits(a, b) -> bool:
    """Same shape, dtype and bits (native byte order)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype.newbyteorder("=") != b.dtype.newbyteorder("="):
        return False
    a = a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))
    b = b if b.dtype.isnative else b.astype(b.dtype.newbyteorder("="))
    u = f"u{a.dtype.itemsize}"
    return np.array_equal(np.ascontiguousarray(a).view(u), np.ascontiguousarray(b).view(u))


# --------------------------------------------------------------------- values

def _special_values(dt: np.dtype):
    fi = finfo(dt)
    return [0.0, -0.0, math.nan, math.inf, -math.inf, float(fi.max), -float(fi.max),
            float(fi.smallest_subnormal), -float(fi.smallest_subnormal),
            float(fi.smallest_normal), 1.0, -1.0]


@st.composite
def float_values(draw, shape, dt: np.dtype):
    """A float64 array of values for a float dtype: ordinary data, data on a
    large common offset, tiny (subnormal) data, data with specials."""
    size = int(np.prod(shape, dtype=np.int64))
    kind = draw(st.sampled_from(["normal", "normal", "offset", "scaled", "specials",
                                 "tiny", "integers", "hyp"]))
    if kind == "hyp" and size <= 32:
        width = 8 * dt.itemsize
        return draw(hnp.arrays(F64, shape, elements=st.floats(width=width)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    fi = finfo(dt)
    with np.errstate(all="ignore"):
        if kind in ("normal", "hyp"):
            a = rng.standard_normal(size)
        elif kind == "offset":
            off = draw(st.sampled_from([1e3, -1e4, 3e5, 1e7, 1e15]))
            a = off + rng.standard_normal(size) * draw(st.sampled_from([1e-3, 1.0, 10.0]))
        elif kind == "scaled":
            a = rng.standard_normal(size) * 10.0 ** draw(st.integers(-40, 40))
        elif kind == "tiny":
            a = rng.integers(-8, 9, size) * float(fi.smallest_subnormal)
        elif kind == "integers":
            a = rng.integers(-3, 4, size).astype(F64)
        else:
            a = rng.standard_normal(size)
            n = draw(st.integers(1, 4))
            specials = _special_values(dt)
            for _ in range(n):
                if size:
                    a[rng.integers(0, size)] = specials[rng.integers(0, len(specials))]
    return a.reshape(shape)


@st.composite
def values_of(draw, shape, dt: np.dtype) -> np.ndarray:
    """A C-contiguous array of `shape` and `dt` (any dtype, any byte order)."""
    native = dt.newbyteorder("=") if dt.byteorder not in "|=" else dt
    if is_float(dt):
        with np.errstate(all="ignore"):
            a = draw(float_values(shape, native)).astype(dt)
        return a
    size = int(np.prod(shape, dtype=np.int64))
    if dt.kind in "biu" or size > 64:
        if dt.kind in "biu":
            rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
            info = np.iinfo(dt) if dt.kind != "b" else None
            if info is None:
                return rng.integers(0, 2, shape).astype(dt)
            lo, hi = (max(info.min, -100), min(info.max, 100)) if draw(st.booleans()) \
                else (info.min, info.max)
            return rng.integers(lo, hi, shape, endpoint=True, dtype=native).astype(dt)
        return np.zeros(shape, dt)
    if dt.kind == "O":
        elems = st.one_of(st.floats(), st.integers(), st.none(), st.text(max_size=2),
                          st.just([1.0, 2.0]))
        return draw(hnp.arrays(dt, shape, elements=elems))
    if dt.kind == "T" or dt.kind == "V" and dt.names is None:
        return np.zeros(shape, dt)
    try:
        return draw(hnp.arrays(dt, shape))
    except Exception:  # a dtype hypothesis cannot fill: zeros will do
        return np.zeros(shape, dt)


# --------------------------------------------------------------------- layouts

@st.composite
def arrays_in_layouts(draw, shape, dt, layouts=FUZZ_LAYOUTS):
    """An array of any dtype in up to two layouts of ``layouts`` (names of
    ``cases.LAYOUTS``) one over the other, or a zero-stride broadcast view."""
    shape = tuple(shape)
    if shape and draw(st.integers(0, 9)) == 0:
        # Broadcast: stride 0 along some axes (read-only, shares memory).
        bshape = tuple(1 if draw(st.booleans()) else n for n in shape)
        base = draw(values_of(bshape, dt))
        return np.broadcast_to(base, shape)
    a = draw(values_of(shape, dt))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    for _ in range(draw(st.integers(0, 2))):
        a = with_layout(a, draw(st.sampled_from(layouts)), rng)
    return a


# --------------------------------------------------------------------- shapes

@st.composite
def shapes(draw, max_ndim=4):
    """Shapes with 0-length axes, odd lengths, SIMD-boundary and large d."""
    ndim = draw(weighted((1, st.just(0)), (6, st.integers(1, max_ndim))))
    if ndim == 0:
        return ()
    lead = draw(st.lists(weighted((1, 0), (10, st.integers(1, 5))),
                         min_size=ndim - 1, max_size=ndim - 1))
    d = draw(weighted(
        (8, st.integers(0, 40)),
        (3, st.sampled_from(BOUNDARY_D + (1000,))),
        (1, st.integers(1000, MAX_D)),
    ))
    lead_size = int(np.prod(lead, dtype=np.int64)) if lead else 1
    if lead_size * d > MAX_SIZE:
        d = max(1, MAX_SIZE // max(lead_size, 1))
    return tuple(lead) + (d,)


# --------------------------------------------------------------------- scalars

def valid_eps():
    """eps values layer_norm must accept: finite, >= 0, of several types."""
    values = st.one_of(
        st.floats(0.0, 1e-2), st.sampled_from([0.0, -0.0, 1e-5, 1e-12, 5e-324,
                                               2.2250738585072014e-308, 1.0, 1e300,
                                               1.7976931348623157e308]),
    )
    return weighted((6, values), (1, st.integers(0, 3)),
                    (1, st.tuples(st.sampled_from([dt.type for dt in FLOAT_DTYPES]),
                                  values).map(lambda t: _np_scalar(*t))
                    .filter(lambda v: math.isfinite(v))),
                    (1, values.map(np.array)))


def eps_values():
    """Every kind of eps: valid, invalid values, and wrong types."""
    valid = valid_eps()
    invalid = st.sampled_from([-1e-5, -5e-324, -math.inf, math.inf, math.nan, -1.0])
    as_np = st.sampled_from([dt.type for dt in FLOAT_DTYPES] + [np.longdouble])
    return weighted(
        (10, valid),
        (3, invalid),
        (2, st.floats()),
        (2, st.tuples(as_np, st.one_of(valid, invalid)).map(lambda t: _np_scalar(*t))),
        (1, st.integers(-3, 3)),
        (1, st.sampled_from([10**400, -10**400, 2**1023, 2**1024])),
        (1, st.booleans()),
        (1, st.sampled_from([None, "1e-5", b"1", 1e-5j, [1e-5], (), {}])),
        (1, st.sampled_from([fractions.Fraction(1, 3), fractions.Fraction(10**400),
                             decimal.Decimal("1e-5")])),
        (1, st.sampled_from([np.array(1e-5), np.array([1e-5]), np.array(1e-5, np.float32),
                             np.array(-1.0), np.array(np.nan), np.array("x"),
                             np.array(1e-5, dtype=object), np.int64(2), np.uint8(0),
                             np.bool_(True), np.complex64(1e-5), np.datetime64(1, "s")])),
    )


def _np_scalar(t, v):
    with np.errstate(all="ignore"):
        return t(v)


def eps_is_valid(eps) -> Optional[bool]:
    """The documented eps contract of layer_norm: a real number (not bool),
    finite and >= 0; a 0-d array holding one counts as that number."""
    if isinstance(eps, np.ndarray) and eps.ndim == 0:
        eps = eps[()]
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real):
        return False
    try:
        value = float(eps)
    except (OverflowError, ValueError, TypeError):
        return False
    return math.isfinite(value) and value >= 0


# --------------------------------------------------------------------- oracle

class Bound(NamedTuple):
    ok: np.ndarray       # elements whose value is checked
    tol: np.ndarray      # their tolerance
    ref: np.ndarray      # reference y (float64)
    nan_ok: np.ndarray   # elements where a NaN result is acceptable
    skip: np.ndarray     # elements of ill-conditioned records
    wild: np.ndarray     # elements with an infinite or NaN weight or bias


def rescue_reference(X, W, B, E, ref_mean, ref_var, ref_y):
    """Redo the oracle, scaled by a power of two, on float64 records where
    its own float64 arithmetic under- or overflows: squared deviations of
    subnormal data (var 0 for [3e-323, 1e-323], true y +-1) or sums near
    +-1.8e308 (inf for [1.8e308, 1.8e308], true y 0). y is unchanged when x
    is scaled by 2**k and eps by 4**k; mean and var scale back exactly.
    X, W, B are (rows, d) float64 (W, B may be None), E per row; the ref_*
    arrays are updated in place."""
    rows, d = X.shape
    with np.errstate(all="ignore"):
        finite_in = np.isfinite(X).all(axis=1)
        s = ref_var + E
        suspect = finite_in & (~np.isfinite(ref_mean) | ~np.isfinite(ref_var)
                               | (s < 2.0**-900) | (ref_var > 2.0**900))
        for r in np.flatnonzero(suspect):
            x = X[r]
            spread = np.max(np.abs(x - x[0]))
            if not np.isfinite(spread):
                spread = np.max(np.abs(x))
            if spread == 0:
                continue  # constant record: the oracle is exact already
            k = -int(np.frexp(spread)[1])  # spread * 2**k in [0.5, 1)
            w = None if W is None else np.broadcast_to(W, X.shape)[r]
            b = None if B is None else np.broadcast_to(B, X.shape)[r]
            e = float(np.broadcast_to(E, (rows,))[r])
            ref = lnc.reference_layer_norm(np.ldexp(x, k), w, b, np.ldexp(e, 2 * k))
            ref_mean[r] = np.ldexp(float(ref.mean), -k)
            ref_var[r] = np.ldexp(float(ref.var), -2 * k)
            ref_y[r] = ref.y


def _unit(dt: np.dtype) -> float:
    return float(np.finfo(dt).eps) / 2


def f64_sum_units(d) -> float:
    """Error bound of a mean summed in float64 lanes, in units of max|x|:
    each of the LANES lanes adds d/LANES terms, then a pairwise tree of
    depth log2(LANES) combines them, then the division by d and the shift
    back (3 roundings, with the lanes' uneven lengths)."""
    return (d / LANES + math.log2(LANES) + 3) * 2.0**-52


#: Error bound of a float32 lane run, in units of its largest term: a lane
#: adds BLOCK/LANES terms in float32 before its total goes into float64,
#: and k additions of partial sums below k times the largest term err by
#: less than k * k units.
F32_RUN_UNITS = (BLOCK // LANES) ** 2 * 2.0**-24


def error_bound(X, W, B, eps, ref_mean, ref_var, cdt: np.dtype, odt: np.dtype,
                ref_y) -> Bound:
    """Per-element tolerance for a (rows, d) problem. X, W, B, eps (per row)
    in float64; ref_* from the float64 oracle, shaped (rows,) / (rows, d)."""
    rows, d = X.shape
    cdt, odt = cdt.newbyteorder("="), odt.newbyteorder("=")
    W1 = np.broadcast_to(np.ones(d) if W is None else W, (rows, d))
    B0 = np.broadcast_to(np.zeros(d) if B is None else B, (rows, d))
    with np.errstate(all="ignore"):
        s = ref_var + eps
        rstd = 1.0 / np.sqrt(s)
        absx = np.where(np.isfinite(X), np.abs(X), 0.0)
        maxabs = absx.max(axis=1, initial=0.0)
        if cdt == F64:
            e_mean = f64_sum_units(d) * maxabs
            u_var = f64_sum_units(d)
        else:
            spread = np.abs(X - X[:, :1])
            spread = np.where(np.isfinite(spread), spread, 0.0).max(axis=1, initial=0.0)
            e_mean = F32_RUN_UNITS * spread + 2.0**-46 * np.abs(ref_mean) \
                + f64_sum_units(d) * maxabs
            u_var = F32_RUN_UNITS
        e_var = u_var * ref_var + 2 * e_mean * np.sqrt(ref_var) + e_mean**2
        finite_rec = np.isfinite(ref_mean) & np.isfinite(ref_var)
        # (the second test also holds where e_var underflows to 0: tiny data)
        ill = finite_rec & ~((e_var <= 0.01 * s) & (e_mean <= 0.005 * np.sqrt(s)))
        # The float64 oracle itself overflows on finite float64 records near
        # +-1.8e308 (its sum is inf); the kernels may do better (a constant
        # record of 1.8e308 is 0). Not checkable here: skip such records.
        finite_in = np.isfinite(X).all(axis=1) & np.isfinite(W1).all(axis=1) \
            & np.isfinite(B0).all(axis=1)
        ill |= finite_in & ~finite_rec
        z = (X - ref_mean[:, None]) * rstd[:, None]
        zw = np.abs(z * W1)
        T = max(Y_TOL[cdt if cdt in Y_TOL else F64],
                Y_TOL[odt] if odt in Y_TOL else BF16_UNIT if is_bf16(odt) else 0)
        tol = T * (1 + zw + np.abs(B0)) \
            + (e_mean * rstd)[:, None] * np.abs(W1) \
            + zw * (e_var / (2 * s))[:, None]
        fin_o = float(finfo(odt).max) if is_float(odt) else np.inf
        fin_c = float(np.finfo(cdt).max)
        big = (np.abs(ref_y) > 0.5 * fin_o) | (zw > 0.5 * fin_c) | (np.abs(B0) > 0.5 * fin_c)
    finite_ref = np.isfinite(ref_y)
    ok = finite_ref & ~big & ~ill[:, None]
    nan_ok = ~finite_ref | big | ill[:, None] | ~np.isfinite(W1) | ~np.isfinite(B0)
    skip = np.broadcast_to(ill[:, None], ref_y.shape)
    wild = ~np.isfinite(W1) | ~np.isfinite(B0)
    return Bound(ok, np.nan_to_num(tol, nan=np.inf, posinf=np.inf), ref_y, nan_ok, skip, wild)


def assert_y_close(y, bound: Bound, what: str) -> None:
    y = np.asarray(y, dtype=np.float64)
    ref = bound.ref
    # NaN in the reference (a NaN/inf record, a NaN parameter) stays NaN.
    # (Not in an ill-conditioned record: there the reference's 0/0 may be
    # the kernel's rounding noise, and the other way round.)
    bad_nan = np.isnan(ref) & ~np.isnan(y) & ~bound.skip & ~bound.wild
    # An infinite reference stays infinite.
    bad_inf = np.isinf(ref) & ~(np.isnan(y) | (y == ref)) & ~bound.skip & ~bound.wild
    # An infinite or NaN weight/bias gives a non-finite element, NaN or
    # +-inf: z * inf is NaN for z == 0 and +-inf otherwise, and z, the
    # centered value, may be rounding noise (0 or +-1 ulp) in a record of
    # equal values, in the reference as in the kernels.
    bad_inf |= bound.wild & np.isfinite(y) & ~bound.skip
    with np.errstate(all="ignore"):
        err = np.abs(y - ref)
    bad_val = bound.ok & ~(err <= bound.tol)
    bad_new_nan = np.isnan(y) & ~bound.nan_ok
    bad = bad_nan | bad_inf | bad_val | bad_new_nan
    if bad.any():
        idx = tuple(np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} element(s) wrong; first at {idx}: got {y[idx]!r}, "
            f"reference {ref[idx]!r}, tolerance {bound.tol[idx]!r} "
            f"(nan:{bad_nan.sum()} inf:{bad_inf.sum()} value:{bad_val.sum()} "
            f"new-nan:{bad_new_nan.sum()})")


def assert_stats_close(mean, var, ref_mean, ref_var, cdt, sdt, d, X, what):
    mean = np.asarray(mean, np.float64)
    var = np.asarray(var, np.float64)
    fmax = float(np.finfo(sdt).max)
    with np.errstate(all="ignore"):
        absx = np.where(np.isfinite(X), np.abs(X), 0.0).max(axis=1, initial=0.0)
        u = f64_sum_units(d)
        if cdt != F64:
            u = max(u, F32_RUN_UNITS)
        rt = STATS_TOL[cdt]
        tiny = float(np.finfo(sdt).smallest_subnormal)
        mtol = u * absx + rt * np.abs(ref_mean) + tiny
        vtol = 4 * u * np.abs(ref_var) + 2 * (u * absx) * np.sqrt(np.abs(ref_var)) \
            + (u * absx) ** 2 + rt * np.abs(ref_var) + tiny
        for name, got, ref, tol in (("mean", mean, ref_mean, mtol), ("var", var, ref_var, vtol)):
            nan_bad = np.isnan(ref) & ~np.isnan(got)
            over = np.abs(ref) > 0.5 * fmax
            inrange = np.isfinite(ref) & ~over
            val_bad = inrange & ~(np.abs(got - ref) <= tol)
            bad = nan_bad | val_bad
            if bad.any():
                i = int(np.argwhere(bad)[0][0])
                raise AssertionError(f"{what}: {name}[{i}] = {got[i]!r}, reference "
                                     f"{ref[i]!r}, tolerance {tol[i]!r}")


# --------------------------------------------------------------------- snapshots

def snapshot(a) -> Optional[Tuple[Any, bytes]]:
    """Bytes of an ndarray's elements, to prove a call did not modify it."""
    if isinstance(a, np.ndarray):
        return (a, a.tobytes())
    return None


def assert_unchanged(snap, name, out=None) -> None:
    if snap is None:
        return
    a, before = snap
    if out is not None and isinstance(out, np.ndarray) and np.may_share_memory(a, out):
        return  # overlapping out= may legitimately write there
    if a.tobytes() != before:
        raise AssertionError(f"{name} was modified by the call")


# --------------------------------------------------------------------- crash trace

_TRACE_PATH = os.environ.get("LAYERNORM_C_FUZZ_TRACE", "")
_TRACE_FD = None


def describe(v) -> str:
    """A one-line description of an argument, enough to rebuild it."""
    if isinstance(v, np.ndarray):
        flags = "".join(c for c, f in (("C", v.flags.c_contiguous), ("F", v.flags.f_contiguous),
                                       ("A", v.flags.aligned), ("W", v.flags.writeable)) if f)
        head = f"{type(v).__name__}(dtype={v.dtype.str!r} shape={v.shape} strides={v.strides} " \
               f"flags={flags} addr%64={v.__array_interface__['data'][0] % 64}"
        if v.size <= 16 and v.dtype.kind != "O":
            head += f" values={v.tolist()!r}"
        return head + ")"
    text = repr(v)
    return text if len(text) < 200 else text[:200] + "..."


def trace(kind: str, **args) -> None:
    """With LAYERNORM_C_FUZZ_TRACE=path, write the call about to be made to
    path (overwritten each call): after a hard crash it names the culprit."""
    global _TRACE_FD
    if not _TRACE_PATH:
        return
    if _TRACE_FD is None:
        _TRACE_FD = os.open(_TRACE_PATH, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    line = kind + "(" + ", ".join(f"{k}={describe(v)}" for k, v in args.items()) + ")\n"
    os.ftruncate(_TRACE_FD, 0)
    os.pwrite(_TRACE_FD, line.encode(), 0)
