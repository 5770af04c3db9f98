"""Numerical quality: accuracy with large offsets, float16 range and eps,
constant rows, and NaN/Inf staying inside their own record."""
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import layernorm_c as lnc
from cases import BLOCK, F16, F32, F64, FLOAT_DTYPES, LANES, SMALL_D, STATS_TOL, Y_TOL
from core_strategies import (WB_COMBOS, assert_same_bits, assert_same_result, finite_values,
                             kernel_settings, random_params)


# ------------------------------------------------------------ float32 offsets

@pytest.mark.parametrize("offset", [0.0, 1.0, 1e2, 1e3, 1e4, -1e4])
@pytest.mark.parametrize("d", [2, 3, LANES - 1, LANES + 1, 768, 16 * BLOCK + 1, 65536])
def test_float32_accurate_with_large_offset(offset, d):
    """Rows N(offset, 1) in float32: the output stays within Y_TOL (1e-5) of
    the float64 reference of the same float32 input (a float32 mean, or
    E[x^2] - E[x]^2, would be off by far more at offset 1e4)."""
    rng = np.random.default_rng(d)
    x = (offset + rng.standard_normal((4 if d < 65536 else 2, d))).astype(np.float32)
    y, mean, var = lnc.layer_norm(x, return_stats=True)
    ref = lnc.reference_layer_norm(x)
    assert np.max(np.abs(y - ref.y)) <= Y_TOL[F32]
    # Statistics (float32): the mean to its float32 rounding plus STATS_TOL
    # (1e-6) of the spread, the variance to STATS_TOL relative.
    std = np.sqrt(ref.var)
    mean_tol = np.spacing(np.abs(ref.mean).astype(np.float32)) + STATS_TOL[F32] * std
    assert np.all(np.abs(mean - ref.mean) <= mean_tol)
    assert np.all(np.abs(var - ref.var) <= STATS_TOL[F32] * ref.var)


@pytest.mark.parametrize("lead", [1.0, 3.0, 1e3])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_one_pass_statistics_fall_back_when_the_shift_is_far_from_the_mean(
        lead, dtype, restore_settings):
    """Records of more than 64 features sum their squares around the mean of
    their first 8 values in the mean's own pass, kept only when that shift
    lies within a standard deviation of the mean (ln_contract.h, item 5).
    First values far above the rest (lead 1e3: the shift some 90 standard
    deviations out, where the one-pass variance would lose about 13 bits)
    must take the centered second pass, and shifts about one standard
    deviation out (lead 1, 3) either path: every level gives the scalar
    level's bits, within STATS_TOL of the float64 reference."""
    rng = np.random.default_rng(int(lead))
    d = 65536
    x = rng.standard_normal((3, d))
    x[:, :8] += lead
    x[1, :8] -= 2 * lead  # the shift below the mean as well
    x = x.astype(dtype)
    ref = lnc.reference_layer_norm(x)
    lnc.set_isa("scalar")
    want = lnc.layer_norm(x, return_stats=True)
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        got = lnc.layer_norm(x, return_stats=True)
        assert_same_result(got, want, isa)
    y, mean, var = want
    assert np.max(np.abs(y - ref.y)) <= Y_TOL[dtype]
    assert np.all(np.abs(var - ref.var) <= STATS_TOL[dtype] * ref.var)


# ------------------------------------------------------------ float64 accuracy

def _exact_layer_norm(row, eps):
    """Mean and variance exactly (rationals), y to a few ulps."""
    vals = [Fraction(v) for v in row.tolist()]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / len(vals)
    rstd = 1.0 / math.sqrt(float(var + Fraction(eps)))
    return np.array([float(v - mean) * rstd for v in vals]), float(mean), float(var)


@pytest.mark.parametrize("offset", [0.0, 10.0, 1e3, 1e4])
@pytest.mark.parametrize("d", [1, 5, LANES + 1, 1000, 16 * BLOCK + 1])
def test_float64_relative_error_against_exact_arithmetic(offset, d):
    """float64 output within Y_TOL (1e-12) relative of the exact result (the mean's
    own rounding, relative to the offset, dominates beyond offset/std 1e3)."""
    rng = np.random.default_rng(d + 7)
    x = offset + rng.standard_normal((2, d))
    y, mean, var = lnc.layer_norm(x, eps=1e-5, return_stats=True)
    tol = Y_TOL[F64] * max(1.0, abs(offset) / 1e3)
    for i in range(len(x)):
        ey, emean, evar = _exact_layer_norm(x[i], 1e-5)
        assert np.max(np.abs(y[i] - ey) / (1 + np.abs(ey))) <= tol
        assert abs(mean[i] - emean) <= 1e-14 * np.max(np.abs(x[i]))
        assert abs(var[i] - evar) <= 1e-13 * evar


def test_float64_mean_of_long_records_is_shifted_near_the_mean():
    """Records of more than 64 features shift their first pass by the mean
    of their first 8 values (ln_contract.h, item 4), so the mean's rounding
    is relative to |shift - mean|, about a third of a standard deviation,
    not to |x[0] - mean|: on these 400 standard normal float64 records of
    768 features its median error is 1.4e-17, its largest 1.7e-16; the
    shift x[0] had given 3.2e-17 and 4.5e-16."""
    rng = np.random.default_rng(768)
    x = rng.standard_normal((400, 768))
    mean = lnc.layer_norm(x, return_stats=True).mean
    exact = np.array([float(sum(Fraction(v) for v in row.tolist()) / len(row)) for row in x])
    err = np.abs(mean - exact)
    assert np.median(err) <= 2e-17
    assert np.max(err) <= 2e-16


# ------------------------------------------------------------ float16

@pytest.mark.parametrize("d", [2, 4, LANES + 1, 1000])
def test_float16_extremes_never_overflow(d):
    rows = np.zeros((3, d), np.float16)
    rows[0, :2] = [65504, -65504]                 # mean 0, huge variance
    rows[1, :] = 65504
    rows[1, -1] = -65504                          # mean near the top of the range
    rows[2, :] = np.linspace(-65504, 65504, d)    # the whole range
    w = np.full(d, 1.5, np.float16)
    b = np.full(d, -0.25, np.float16)
    for params in [(None, None), (w, b)]:
        res = lnc.layer_norm(rows, *params, return_stats=True)
        assert np.all(np.isfinite(res.y)) and np.all(np.isfinite(res.mean))
        assert np.all(np.isfinite(res.var))
        ref = lnc.reference_layer_norm(rows, *params)
        assert np.all(np.abs(res.y - ref.y) <= Y_TOL[F16] * (1 + np.abs(ref.y)))
    y0 = lnc.layer_norm(rows[0, :2])
    assert y0.tolist() == [1.0, -1.0]


def test_float16_random_full_range_is_finite_and_accurate():
    rng = np.random.default_rng(16)
    x = rng.uniform(-65504, 65504, (50, 77)).astype(np.float16)
    y = lnc.layer_norm(x)
    assert np.all(np.isfinite(y))
    ref = lnc.reference_layer_norm(x).y
    assert np.all(np.abs(y - ref) <= Y_TOL[F16] * (1 + np.abs(ref)))


@pytest.mark.parametrize("call", ["layer_norm", "ufunc"])
def test_float16_eps_is_not_rounded_to_float16(call):
    """var = 2**-22 ~ 2.4e-7 here, so eps = 1e-8 moves y by 2%; rounded to
    float16, eps would be 0 (y = +-1) or 2**-24 ~ 6e-8 (y = +-0.894)."""
    x = np.array([1, 1 + 2 ** -10] * 4, np.float16)
    if call == "layer_norm":
        y, _, var = lnc.layer_norm(x, eps=1e-8, return_stats=True)
        assert var == 2.0 ** -22
    else:
        one, zero = np.ones(8, np.float16), np.zeros(8, np.float16)
        y = lnc.layer_norm_ufunc(x, one, zero, 1e-8)
    assert y.dtype == F16
    want = lnc.reference_layer_norm(x, eps=1e-8).y          # +-0.9796
    tol = Y_TOL[F16] * (1 + np.abs(want))
    assert np.all(np.abs(y - want) <= tol)
    for rounded_eps in {float(np.float16(1e-8)), 2.0 ** -24}:
        other = lnc.reference_layer_norm(x, eps=rounded_eps).y
        assert np.all(np.abs(other - want) > 2 * tol), "test case not discriminating"


# ------------------------------------------------------------ constant rows

@given(dtype=st.sampled_from(FLOAT_DTYPES), d=st.integers(1, SMALL_D), data=st.data())
def test_constant_rows_give_the_bias(dtype, d, data):
    c = data.draw(finite_values(dtype, 1e4 if dtype == F16 else 1e6), "c")
    rng = np.random.default_rng(d)
    w, b = random_params(rng, dtype, d, "wb")
    x = np.full((2, d), c, dtype)
    y, mean, var = lnc.layer_norm(x, w, b, return_stats=True)
    no_bias = lnc.layer_norm(x, w)
    if dtype == F64:
        # The float64 mean of d equal values may be off by an ulp of c.
        np.testing.assert_allclose(y, np.broadcast_to(b, y.shape), rtol=0, atol=1e-3)
        np.testing.assert_allclose(no_bias, 0.0, atol=1e-3)
    else:
        # float16/float32 are summed exactly in float64: exactly the bias.
        assert_same_bits(y, np.broadcast_to(b, y.shape))
        assert np.all(no_bias == 0)
        assert np.all(mean == np.float32(c)) and np.all(var == 0)


@pytest.mark.parametrize("d", [1, 3, 7, 100])
def test_float64_constant_rows_of_exact_values_give_exactly_the_bias(d):
    """When the sum is exact (small integers), float64 is exact too."""
    x = np.full((3, d), 7.0)
    b = np.linspace(-1, 1, d)
    assert_same_bits(lnc.layer_norm(x, np.full(d, 3.0), b), np.broadcast_to(b, x.shape))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_constant_rows_with_tiny_positive_eps_give_the_bias(dtype):
    """eps = 1e-300 is valid (finite, > 0): y = 0 / sqrt(0 + eps) * w + b = b.
    1/sqrt(eps) exceeds the float32 range, which must not turn 0 into NaN."""
    x = np.full((2, 4), 3.0, dtype)
    b = np.array([0.5, -1, 2, 0], dtype)
    with np.errstate(all="ignore"):
        y = lnc.layer_norm(x, np.ones(4, dtype), b, eps=1e-300)
        y0 = lnc.layer_norm(x, eps=1e-300)
    np.testing.assert_array_equal(y, np.broadcast_to(b, x.shape))
    np.testing.assert_array_equal(y0, 0.0)


def test_float32_tiny_variance_with_eps_0_is_normalized():
    """Subnormal float32 spread, eps = 0: var ~ 2.5e-79, y must still be
    [-1, 1] (the reference gives exactly that), not 1/sqrt(var) overflowing."""
    x = np.array([0, 1e-39], np.float32)
    np.testing.assert_array_equal(lnc.reference_layer_norm(x, eps=0.0).y, [-1, 1])
    with np.errstate(all="ignore"):
        y = lnc.layer_norm(x, eps=0.0)
    np.testing.assert_allclose(y, [-1, 1], rtol=1e-6)


def test_float32_inputs_near_the_top_of_the_range_give_finite_output():
    """Finite float32 inputs have a finite normalized output
    (|y| <= sqrt(d - 1)); x - mean must not overflow in float32."""
    x = np.array([3e38, -3e38, -3e38], np.float32)
    want = lnc.reference_layer_norm(x).y                 # [1.414, -0.707, -0.707]
    with np.errstate(all="ignore"):
        y = lnc.layer_norm(x)
    assert np.all(np.isfinite(y)), f"got {y}"
    np.testing.assert_allclose(y, want, atol=Y_TOL[F32])


# ------------------------------------------------------------ NaN / Inf

@given(dtype=st.sampled_from(FLOAT_DTYPES), d=st.integers(1, 100), n=st.integers(2, 8),
       wb=st.sampled_from(WB_COMBOS), data=st.data())
def test_nan_and_inf_stay_inside_their_record(dtype, d, n, wb, data):
    rng = np.random.default_rng(d * 31 + n)
    x = (rng.standard_normal((n, d)) * 3).astype(dtype)
    w, b = random_params(rng, dtype, d, wb)
    bad_rows = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n - 1), "rows")
    for r in bad_rows:
        pos = data.draw(st.lists(st.integers(0, d - 1), min_size=1, max_size=3), "positions")
        x[r, pos] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]), "value")
    for isa in lnc.supported_isas():
        with kernel_settings(isa=isa), np.errstate(invalid="ignore"):
            res = lnc.layer_norm(x, w, b, return_stats=True)
            alone = {r: lnc.layer_norm(x[r], w, b, return_stats=True)
                     for r in range(n) if r not in bad_rows}
        for r in range(n):
            if r in bad_rows:
                assert np.all(np.isnan(res.y[r])), f"record {r} must be all NaN"
                assert np.isnan(res.var[r]) and not np.isfinite(res.mean[r])
            else:
                assert np.all(np.isfinite(res.y[r]))
                assert_same_result((res.y[r], res.mean[r], res.var[r]), alone[r],
                                   f"{isa}: record {r}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("row", [[np.inf, np.inf], [np.inf, -np.inf], [np.nan],
                                 [1.0, np.nan, 2.0]])
def test_non_finite_records_are_all_nan(dtype, row):
    with np.errstate(invalid="ignore"):
        y = lnc.layer_norm(np.array(row, dtype), np.ones(len(row), dtype),
                           np.zeros(len(row), dtype))
    assert np.all(np.isnan(y))


# ------------------------------------------------- float64 beyond the square range

@pytest.mark.parametrize("scale_exp", [520, 700, 1000, -600, -1000, -1060])
def test_float64_records_whose_squares_leave_the_double_range(scale_exp):
    """|x| around 2^scale_exp: (x - mean)^2 overflows (or underflows) in
    double, yet the record is well defined. With eps = 0, LayerNorm is
    invariant to scaling x by a power of two, so the answer is the reference
    on the rescaled record. A finite, nonzero record must never come back as
    zeros, infinities or NaN."""
    rng = np.random.default_rng(scale_exp & 0xFFFF)
    base = rng.standard_normal((3, 17))
    x = np.ldexp(base, scale_exp)
    assert np.all(np.isfinite(x)) and np.all(x != 0)
    want = lnc.reference_layer_norm(np.ldexp(x, -scale_exp), eps=0.0).y
    for isa in lnc.supported_isas():
        with kernel_settings(isa=isa):
            y = lnc.layer_norm(x, eps=0.0)
        np.testing.assert_allclose(y, want, rtol=Y_TOL[F64], atol=Y_TOL[F64], err_msg=isa)


def test_float64_statistics_of_huge_records_are_exact_where_representable():
    """mean and var come back in float64: var is inf only when the true
    variance exceeds the double range."""
    res = lnc.layer_norm(np.array([1e154, -1e154, 0.0, 0.0]), return_stats=True)
    assert res.mean == 0.0 and res.var == pytest.approx(5e307, rel=1e-15)
    res = lnc.layer_norm(np.array([1e300, -1e300]), return_stats=True)
    assert res.var == np.inf and res.mean == 0.0
    np.testing.assert_allclose(res.y, [1.0, -1.0], rtol=1e-15)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("value", [0.0, 5.0, -3.25e-300, 1e300])
def test_constant_record_with_eps_zero_is_the_canonical_nan(dtype, value):
    """0/0: every output NaN, written as the one canonical quiet NaN (the
    NaN that 0 * inf makes is negative on x86, positive on aarch64), on
    every level, whatever the scale of the record."""
    with np.errstate(over="ignore", under="ignore"):  # the cast is the probe
        x = np.full((3, 40), value).astype(dtype)
    if not np.isfinite(x).all() or (value != 0 and (x == 0).all()):
        pytest.skip("value not representable in this dtype")
    canonical = np.array(np.nan, dtype).view(f"u{np.dtype(dtype).itemsize}")
    for isa in lnc.supported_isas():
        with kernel_settings(isa=isa):
            y = lnc.layer_norm(x, np.full(40, 2.0, dtype), np.ones(40, dtype), eps=0.0)
        bits = y.view(f"u{np.dtype(dtype).itemsize}")
        assert np.all(bits == canonical), (isa, hex(int(bits.ravel()[0])))


def test_gain_times_xhat_overflowing_but_not_the_sum():
    """gain and bias near the float64 maximum: xhat * gain overflows where
    xhat * gain + bias does not. The kernels fuse the multiply-add and get
    the finite value; the reference gets it too (regression: it computed
    the product first and returned -inf, which the API fuzzer flagged)."""
    x = np.array([1.0, 2.0, 3.0, 4.0])
    w = np.full(4, 1.7e308)
    for b in (w, -w):
        ref = lnc.reference_layer_norm(x, w, b).y
        y = lnc.layer_norm(x, w, b)
        assert np.isfinite(ref).sum() == 2
        np.testing.assert_array_equal(np.isfinite(y), np.isfinite(ref))
        fin = np.isfinite(ref)
        np.testing.assert_allclose(y[fin], ref[fin], rtol=1e-15)


@pytest.mark.parametrize("scale", [1e-160, 1e-200, 1e-300, 1e-310])
def test_tiny_float64_records_are_exactly_standardized(scale):
    """A float64 record of magnitude 1e-160 and below: its variance
    underflows in double (its squares do), so it is computed at its
    power-of-two scale, and y is as accurate as for ordinary values.
    (Regression: the output used the underflowed variance, 7e-5 off.)"""
    x = np.array([[1.0, 2.0, 4.0], [3.0, -1.0, 0.5]]) * scale
    want = lnc.reference_layer_norm(x / scale, eps=0.0).y
    for isa in lnc.supported_isas():
        with kernel_settings(isa=isa):
            np.testing.assert_allclose(lnc.layer_norm(x, eps=0.0), want, rtol=1e-14, atol=0,
                                       err_msg=isa)
            np.testing.assert_allclose(lnc.rms_norm(x, eps=0.0),
                                       lnc.reference_rms_norm(x / scale, eps=0.0).y,
                                       rtol=1e-14, err_msg=isa)


def test_tiny_float64_records_with_eps_in_the_backward():
    """eps dominates a tiny record's variance: eps times the record's scale
    squared would overflow, and the backward keeps the record unscaled.
    (Regression: dx was NaN.)"""
    x = np.array([[1.0, 2.0, 4.0]]) * 1e-160
    dy = np.array([[1.0, 0.0, 0.0]])
    g = lnc.layer_norm_backward(dy, x, None, 1e-6)
    np.testing.assert_allclose(g.dx, [[2000 / 3, -1000 / 3, -1000 / 3]], rtol=1e-12)
    ref = lnc.reference_layer_norm_backward(dy, x, None, 1e-6)
    np.testing.assert_allclose(g.dx, ref.dx, rtol=1e-12)
    np.testing.assert_allclose(lnc.layer_norm(x, eps=1e-6),
                               lnc.reference_layer_norm(x, eps=1e-6).y, rtol=1e-12)
    r = lnc.rms_norm_backward(dy, x, None, 1e-6)
    np.testing.assert_allclose(r.dx, lnc.reference_rms_norm_backward(dy, x, None, 1e-6).dx,
                               rtol=1e-12, atol=1e-300)


# ============================================== huge eps and overflowing terms

def test_float32_huge_eps_is_as_accurate_as_any_eps():
    """eps = 1e90 beside a float32 record: 1/std = 1e-45 is subnormal in
    float, so the record is computed in double (regression: float lanes
    used the subnormal 1/std, 40% off though y itself is a normal float)."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 768)) * 1e15).astype(np.float32)
    for eps in (1e70, 1e80, 1e90):
        want = lnc.reference_layer_norm(x, eps=eps).y.astype(np.float32)
        for isa in lnc.supported_isas():
            with kernel_settings(isa=isa):
                y = lnc.layer_norm(x, eps=eps)
                dx = lnc.layer_norm_backward(np.ones_like(x), x, None, eps).dx
            np.testing.assert_allclose(y, want, rtol=0, atol=1e-6 * np.abs(want).max(),
                                       err_msg=f"{isa} {eps}")
            assert np.isfinite(dx).all(), (isa, eps)


def test_float64_eps_near_the_maximum_keeps_the_record():
    """var + eps overflows double: 1/sqrt(var + eps) is computed at a
    quarter (exactly), not as 1/sqrt(inf) = 0, which made dx zero (and NaN
    where a term overflowed). LayerNorm is scale-free, so the reference is
    the record at 2^-600 with eps at 2^-1200."""
    x = np.array([[0.0, 1e154, 3.0, 4.0], [1e154, -1e154, 2.0, 5.0]])
    dy = np.array([[1.0, -2.0, 0.5, 3.0], [0.25, 1.0, -1.0, 2.0]])
    eps, s = 1.7e308, 2.0**-600
    want_y = lnc.reference_layer_norm(x * s, eps=eps * s * s).y
    want_dx = lnc.reference_layer_norm_backward(dy, x * s, None, eps * s * s).dx * s
    for isa in lnc.supported_isas():
        with kernel_settings(isa=isa):
            np.testing.assert_allclose(lnc.layer_norm(x, eps=eps), want_y, rtol=0,
                                       atol=1e-14 * np.abs(want_y).max(), err_msg=isa)
            dx = lnc.layer_norm_backward(dy, x, None, eps).dx
            np.testing.assert_allclose(dx, want_dx, rtol=0, atol=1e-14 * np.abs(want_dx).max(),
                                       err_msg=isa)


@pytest.mark.parametrize("x, dy", [
    ([1e15, -1e15, 3e15, -3e15], [3e38, -3e38, -3e38, -3e38]),  # g - mean(g), g * t
    ([1e20, -1e20, 0.0, 3e19], [1.0, 2.0, 3.0, 4.0]),  # t * t
], ids=["terms", "squares"])
def test_float32_backward_overflowing_float_is_computed_in_double(x, dy):
    """float32 records whose backward overflows float in a sum or a term
    though dx is an ordinary value (the forward of the same x is fine):
    computed in double (regression: dx was NaN)."""
    x = np.array([x], np.float32)
    dy = np.array([dy], np.float32)
    want = lnc.reference_layer_norm_backward(dy, x, None, 0.0).dx
    want_rms = lnc.reference_rms_norm_backward(dy, x, None, 0.0).dx
    assert np.isfinite(want).all() and np.abs(want).max() < 1e30
    for isa in lnc.supported_isas():
        with kernel_settings(isa=isa):
            got = lnc.layer_norm_backward(dy, x, None, 0.0).dx
            rms = lnc.rms_norm_backward(dy, x, None, 0.0).dx
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max(),
                                   err_msg=isa)
        np.testing.assert_allclose(rms, want_rms, rtol=0, atol=1e-6 * np.abs(want_rms).max(),
                                   err_msg=isa)


def test_backward_coefficients_overflowing_double_give_the_canonical_nan():
    """A float64 record whose backward coefficient overflows double (a given
    mean far from the record's, huge gains, eps near the maximum): dx is NaN,
    and the one canonical quiet NaN on every level (regression: the sign of
    0 * inf, found by the kernel fuzzer, was the machine's)."""
    x = np.array([[-87.0, 3.4028234663852886e38, -8, -30, -66, 1e154, 75, 118]])
    w = np.array([-1e200, 8.8e129, 6.2e165, -8.8e112, -1.4e115, 5.4e-189, -4.3e188,
                  -1.8e-6])
    dy = np.full((1, 8), 1e6)
    mean = np.array([-2.0])
    for isa in lnc.supported_isas():
        with kernel_settings(isa=isa):
            dx = lnc.layer_norm_backward(dy, x, w, 1.7976931348623157e308, mean=mean).dx
        bits = dx.view(np.uint64)
        assert np.all(bits == 0x7FF8000000000000), (isa, [hex(int(b)) for b in bits.ravel()])


# Constant records take the float lanes (and no scaled pass for float64):
# their centered values are exact zeros. Long records, padding-like rows.
@pytest.mark.parametrize("d", [LANES + 1, 768, 2 * BLOCK + 3])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_long_constant_rows_give_exactly_the_bias_at_every_isa(dtype, d, restore_settings):
    rng = np.random.default_rng(d)
    x = np.zeros((6, d), dtype)
    x[1] = -0.0
    x[2, ::2] = -0.0  # +0 and -0 are one value
    x[3] = 3.25
    x[4] = -1e-30 if dtype != F16 else -1e-7  # tiny, constant: no underflow matters
    x[5] = rng.standard_normal(d)  # an ordinary record among them
    w, b = random_params(rng, dtype, d, "wb")
    got = {}
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        y, mean, var = lnc.layer_norm(x, w, b, return_stats=True)
        assert_same_bits(y[:5], np.broadcast_to(b, (5, d)))
        assert np.all(var[:5] == 0) and np.all(mean[:5] == x[:5, 0].astype(mean.dtype))
        assert np.all(lnc.layer_norm(x[:5], w) == 0)
        assert np.all(lnc.rms_norm(x[:3], w) == 0)
        got[isa] = (y, lnc.rms_norm(x, w))
    for isa in got:
        assert_same_bits(got[isa][0], got["scalar"][0], f"{isa} vs scalar")
        assert_same_bits(got[isa][1], got["scalar"][1], f"{isa} vs scalar")


@pytest.mark.parametrize("d", [LANES + 1, 768])
@pytest.mark.parametrize("dtype,scale", [(F32, 1e-30), (F64, 1e-200)])
def test_long_tiny_spread_whose_squares_underflow_is_not_constant(dtype, scale, d):
    """Squares of a spread this small underflow in the compute type (a
    variance of 0 there): the record is no constant one, and eps = 0 still
    normalizes it (the worked example [1, 2, 3, 4], tiled)."""
    x = (np.resize(np.array([1.0, 2.0, 3.0, 4.0]), d) * scale).astype(dtype)[None]
    with np.errstate(all="ignore"):
        y = lnc.layer_norm(x, eps=0.0)
    np.testing.assert_allclose(y, lnc.reference_layer_norm(x, eps=0.0).y, rtol=1e-5, atol=1e-6)
    assert np.max(np.abs(y)) > 1.3


@pytest.mark.parametrize("d", [LANES + 1, 768])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_backward_of_constant_rows_matches_the_reference_at_every_isa(dtype, d, restore_settings):
    """Constant records (variance 0: out of the float lanes' range) in the
    backward: dx = (g - mean g) / sqrt(eps), their dweight terms 0; the same
    bits at every ISA level, and with the forward's mean given. Among them
    zeros of both signs, and a constant record but for a NaN at its end
    (no constant record: all NaN)."""
    rng = np.random.default_rng(d)
    x = np.zeros((6, d), dtype)
    x[1] = 2.5
    x[2] = rng.standard_normal(d)
    x[3] = np.where(rng.random(d) < 0.5, -0.0, 0.0)
    x[4] = 2.5
    x[4, -1] = np.nan
    dy = rng.standard_normal((6, d)).astype(dtype)
    w = rng.uniform(0.5, 1.5, d).astype(dtype)
    ref = lnc.reference_layer_norm_backward(dy, x, w, eps=1e-5)
    assert np.isnan(ref.dx[4]).all() and not np.isnan(ref.dx[[0, 1, 2, 3, 5]]).any()
    got = {}
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        g = lnc.layer_norm_backward(dy, x, w, eps=1e-5)
        mean = lnc.layer_norm(x, w, return_stats=True).mean
        assert_same_bits(lnc.layer_norm_backward(dy, x, w, eps=1e-5, mean=mean).dx, g.dx)
        got[isa] = g
    tol = {F16: 2e-2, F32: 1e-4, F64: 1e-10}[np.dtype(dtype)]
    scale = np.nanmax(np.abs(ref.dx))
    np.testing.assert_allclose(got["scalar"].dx, ref.dx, rtol=0, atol=tol * scale)
    np.testing.assert_allclose(got["scalar"].dbias, ref.dbias, rtol=0,
                               atol=tol * np.max(np.abs(ref.dbias)))
    for isa, g in got.items():
        for a, b in zip(g, got["scalar"]):
            assert_same_bits(a, b, f"{isa} vs scalar")
