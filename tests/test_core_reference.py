"""layer_norm against the float64 NumPy reference: property tests, the worked
examples (layernorm_c/_cases.py), invariants, and the dtype rules. The
property tests also call layer_norm with x, weight and bias byte-swapped
('>f2', '>f4', '>f8'), which must give exactly the bits of the native call."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import layernorm_c as lnc
from cases import F16, F32, F64, FLOAT_DTYPES, MOMENTS_TOL, WORKED_EXAMPLES
from core_strategies import (assert_byte_order_ignored, assert_matches_reference,
                             assert_same_bits, assert_same_result, finite_values, problems,
                             result_dtype, stats_dtype)


# ------------------------------------------------------------ property tests

@given(problems())
def test_matches_reference(p):
    res = lnc.layer_norm(p.x, p.weight, p.bias, p.eps, axis=p.axis, return_stats=True)
    assert_matches_reference(res, p.x, p.weight, p.bias, p.eps, p.axis)
    # Without return_stats: the very same y.
    y = lnc.layer_norm(p.x, p.weight, p.bias, p.eps, axis=p.axis)
    assert_same_bits(y, res.y, "y without return_stats")
    assert_byte_order_ignored(res, p.x, p.weight, p.bias, p.eps, p.axis)


@pytest.mark.parametrize("which", ["none", "w", "b", "wb"])
@given(data=st.data())
def test_all_weight_bias_combinations_on_btd(which, data):
    """(B, T, d) input, every combination of weight and bias present/absent."""
    dtype = data.draw(st.sampled_from(FLOAT_DTYPES), "dtype")
    shape = data.draw(hnp.array_shapes(min_dims=3, max_dims=3, max_side=40)
                      .filter(lambda s: s[0] * s[1] * s[2] <= 600), "shape")
    x = data.draw(hnp.arrays(dtype, shape, elements=finite_values(dtype)), "x")
    params = hnp.arrays(dtype, shape[-1:], elements=finite_values(dtype, 8.0))
    w = data.draw(params, "weight") if "w" in which else None
    b = data.draw(params, "bias") if "b" in which else None
    res = lnc.layer_norm(x, w, b, return_stats=True)
    assert res.mean.shape == res.var.shape == shape[:2]
    assert_matches_reference(res, x, w, b)
    assert_byte_order_ignored(res, x, w, b)


@pytest.mark.parametrize("axis", [0, 1, (0, 2), (2, 0), (-1, -2), (0, 1, 2)])
def test_non_last_and_tuple_axes_equal_moving_axes_last(axis):
    """Normalizing over axis/axes is the same as moving them last, flattening
    them into one, and normalizing the last axis (bit for bit)."""
    rng = np.random.default_rng(1)
    x = rng.normal(3.0, 2.0, (4, 5, 6))
    axes = tuple(sorted(a % 3 for a in ((axis,) if np.ndim(axis) == 0 else axis)))
    norm_shape = tuple(x.shape[a] for a in axes)
    w, b = rng.normal(size=norm_shape), rng.normal(size=norm_shape)
    lead = tuple(a for a in range(3) if a not in axes)
    flat = np.moveaxis(x, axes, range(3 - len(axes), 3)).reshape(
        tuple(x.shape[a] for a in lead) + (-1,))

    res = lnc.layer_norm(x, w, b, axis=axis, return_stats=True)
    want = lnc.layer_norm(flat, w.ravel(), b.ravel(), return_stats=True)
    y_back = np.moveaxis(res.y, axes, range(3 - len(axes), 3)).reshape(flat.shape)
    assert_same_bits(y_back, want.y)
    assert_same_bits(res.mean.ravel(), want.mean.ravel())
    assert_same_bits(res.var.ravel(), want.var.ravel())
    assert_matches_reference(res, x, w, b, axis=axis)


def test_statistics_are_per_record_in_btd():
    """Every (b, t) gets its own mean and variance; nothing crosses records."""
    rng = np.random.default_rng(2)
    scales = 10.0 ** rng.integers(-2, 3, size=(3, 4, 1))
    offsets = rng.normal(0, 100, size=(3, 4, 1))
    x = offsets + scales * rng.standard_normal((3, 4, 16))
    res = lnc.layer_norm(x, return_stats=True)
    np.testing.assert_allclose(res.mean, x.mean(-1), rtol=1e-13, atol=1e-12)
    np.testing.assert_allclose(res.var, x.var(-1), rtol=1e-12)
    for b in range(3):
        for t in range(4):
            assert_same_result((res.y[b, t], res.mean[b, t], res.var[b, t]),
                               lnc.layer_norm(x[b, t], return_stats=True), f"record {b, t}")


# ------------------------------------------------------------ worked examples

def _worked_example_atol(example, dtype):
    """How far layer_norm's output may be from the hand values: half a unit
    of their last decimal (their own rounding), half an ulp of the result
    dtype (the output's rounding) and four ulps of the dtype it is computed
    in (float32 for float16)."""
    hand = np.abs(np.array(example.y))
    dtype = result_dtype(np.zeros(0, dtype))
    compute = F32 if dtype == F16 else dtype
    ulp = lambda dt: np.spacing(hand.astype(dt)).astype(np.float64)  # noqa: E731
    return 0.5 * 10.0 ** -example.decimals + ulp(dtype) / 2 + 4 * ulp(compute)


@pytest.mark.parametrize("eps", [0.0, 1e-5])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + (np.dtype(np.int64),), ids=str)
@pytest.mark.parametrize("example", WORKED_EXAMPLES, ids=lambda e: str(list(e.row)))
def test_worked_examples(example, dtype, eps):
    """The hand values: mean and (population) variance exactly, y to the
    given decimals at eps 0; eps scales y by sqrt(var / (var + eps))."""
    x = np.array([example.row], dtype)
    y, mean, var = lnc.layer_norm(x, eps=eps, return_stats=True)
    want = np.array(example.y) * np.sqrt(example.var / (example.var + eps))
    np.testing.assert_array_less(np.abs(y[0] - want), _worked_example_atol(example, dtype))
    assert mean.tolist() == [example.mean]
    # Population variance (divide by d), not the sample variance.
    assert var.tolist() == [example.var]


def test_worked_examples_are_the_float64_reference():
    """The hand values are the reference's, to their decimals; the exact
    mean and variance too."""
    for example in WORKED_EXAMPLES:
        ref = lnc.reference_layer_norm(np.array(example.row), eps=0.0)
        assert (float(ref.mean), float(ref.var)) == (example.mean, example.var)
        assert np.all(np.abs(ref.y - example.y) <= 0.5 * 10.0 ** -example.decimals)


def test_population_variance_not_sample_variance():
    example = WORKED_EXAMPLES[0]
    x = np.array(example.row)
    y, _, var = lnc.layer_norm(x, eps=0.0, return_stats=True)
    assert var == example.var
    d = len(x)
    sample_var = example.var * d / (d - 1)
    assert y[-1] == pytest.approx((x[-1] - example.mean) / np.sqrt(example.var), rel=1e-15)
    assert abs(y[-1] - (x[-1] - example.mean) / np.sqrt(sample_var)) > 0.1


_WORKED_ROWS = [example.row for example in WORKED_EXAMPLES]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_gain_only_scales_its_own_coordinate(dtype):
    x = np.array(_WORKED_ROWS, dtype)
    w = np.array([2, 1, 1, 1], dtype)
    plain = lnc.layer_norm(x)
    gained = lnc.layer_norm(x, w)
    assert_same_bits(gained[:, 0], (2 * plain[:, 0]).astype(dtype))
    assert_same_bits(gained[:, 1:], plain[:, 1:])


@pytest.mark.parametrize("dtype", [F32, F64])
def test_bias_only_shifts(dtype):
    """bias without weight: y = xhat + b, computed the same way."""
    x = np.array(_WORKED_ROWS, dtype)
    b = np.array([0.5, -1, 0, 3], dtype)
    assert_same_bits(lnc.layer_norm(x, bias=b), lnc.layer_norm(x) + b)


# ------------------------------------------------------------ invariants

@st.composite
def _non_constant_rows(draw):
    """Rows offset + scale * z with z in [-1, 1] reaching both ends, so that
    every row is clearly non-constant and eps = 0 is well-conditioned."""
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    n, d = draw(hnp.array_shapes(min_dims=2, max_dims=2, min_side=2, max_side=70))
    z = draw(hnp.arrays(np.float64, (n, d), elements=st.floats(-1, 1)))
    z[:, 0], z[:, 1] = -1.0, 1.0
    offset = draw(hnp.arrays(np.float64, (n, 1), elements=st.floats(-1e3, 1e3)))
    scale = (1 + np.abs(offset)) * 10.0 ** draw(
        hnp.arrays(np.float64, (n, 1), elements=st.floats(-1, 1)))
    return (offset + scale * z).astype(dtype)


@given(_non_constant_rows())
def test_eps0_rows_have_mean_0_and_mean_square_1(x):
    res = lnc.layer_norm(x, eps=0.0, return_stats=True)
    y = res.y.astype(np.float64)
    tol = MOMENTS_TOL[x.dtype]
    np.testing.assert_allclose(y.mean(axis=1), 0.0, atol=tol)
    np.testing.assert_allclose((y * y).mean(axis=1), 1.0, atol=tol)
    assert_byte_order_ignored(res, x, eps=0.0)


# ------------------------------------------------------------ dtype rules

_PARAM_DTYPES = [None, np.bool_, np.int32, np.float16, np.float32, np.float64]


@pytest.mark.parametrize("x_dtype", [np.bool_, np.int8, np.uint16, np.int32, np.int64,
                                     np.float16, np.float32, np.float64])
def test_result_and_stats_dtypes_follow_promotion(x_dtype):
    rng = np.random.default_rng(3)
    x = (rng.integers(0, 2, (3, 5)) if x_dtype is np.bool_
         else rng.integers(-20, 20, (3, 5))).astype(x_dtype)
    for w_dtype in _PARAM_DTYPES:
        for b_dtype in _PARAM_DTYPES:
            w = None if w_dtype is None else np.arange(1, 6).astype(w_dtype)
            b = None if b_dtype is None else np.arange(5).astype(b_dtype)
            want = result_dtype(x, w, b)
            y, mean, var = lnc.layer_norm(x, w, b, return_stats=True)
            assert y.dtype == want, (x_dtype, w_dtype, b_dtype)
            assert mean.dtype == var.dtype == stats_dtype(want)
            # Computed in the result dtype from exactly converted inputs.
            conv = [None if a is None else a.astype(want) for a in (x, w, b)]
            assert_same_result((y, mean, var), lnc.layer_norm(*conv, return_stats=True))


def test_integer_promotion_examples():
    assert lnc.layer_norm(np.arange(4, dtype=np.int8)).dtype == F64
    assert lnc.layer_norm(np.arange(4, dtype=np.float32), np.ones(4, np.int64)).dtype == F64
    assert lnc.layer_norm(np.arange(4, dtype=np.float16), np.ones(4, np.float32)).dtype == F32
    assert lnc.layer_norm([1, 2, 3, 4]).dtype == F64
    assert lnc.layer_norm([True, False]).dtype == F64


@given(problems(dtypes=(F16,), mixed_dtypes=False))
def test_float16_is_float32_math_rounded_once(p):
    """float16 runs in float32: its result is the float32 result of the
    (exactly) widened inputs, rounded once to float16; stats identical."""
    res16 = lnc.layer_norm(p.x, p.weight, p.bias, p.eps, axis=p.axis, return_stats=True)
    wide = [None if a is None else a.astype(np.float32) for a in (p.x, p.weight, p.bias)]
    res32 = lnc.layer_norm(*wide, p.eps, axis=p.axis, return_stats=True)
    assert_same_bits(res16.y, res32.y.astype(np.float16), "y")
    assert_same_bits(res16.mean, res32.mean, "mean")
    assert_same_bits(res16.var, res32.var, "var")
    assert_byte_order_ignored(res16, p.x, p.weight, p.bias, p.eps, p.axis)


def test_reference_is_right_beyond_the_square_range():
    """The oracle itself must not overflow or underflow: records near the
    float64 limits give what their power-of-two rescaling gives."""
    np.testing.assert_array_equal(lnc.reference_layer_norm([1.79e308, 1.79e308]).y, [0, 0])
    np.testing.assert_allclose(lnc.reference_layer_norm([3e-323, 1e-323], eps=0.0).y, [1, -1])
    big = lnc.reference_layer_norm([1.79e308, -1.79e308, 0.0])
    np.testing.assert_allclose(big.y, [np.sqrt(1.5), -np.sqrt(1.5), 0.0], rtol=1e-15)
    assert big.var == np.inf and big.mean == 0.0
