"""RMSNorm, forward and backward: the worked examples, a float64 reference,
float16 and huge/tiny values without overflow, NaN and infinities in their
record, the Gemma convention, bit-for-bit reproducibility, errors, the
gufuncs, the layer, and agreement with torch."""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import layernorm_c as lnc
from cases import F16, F32, F64, FLOAT_DTYPES, LAYOUTS, Y_TOL, STATS_TOL, BOUNDARY_D
from core_strategies import assert_same_bits
from layernorm_c._cases import RMS_WORKED_EXAMPLES


def ref_backward(dy, x, w=None, eps=1e-6, axis=-1, plus_one=False):
    """RMSNorm's backward in float64, written out from the chain rule."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    axes = (axis,) if np.ndim(axis) == 0 else tuple(axis)
    axes = tuple(sorted(a % x.ndim for a in axes))
    r = 1.0 / np.sqrt((x * x).mean(axis=axes, keepdims=True) + eps)
    xh = x * r
    shape = [x.shape[i] if i in axes else 1 for i in range(x.ndim)]
    s = 1.0 if w is None else np.asarray(w, np.float64).reshape(shape) + (1.0 if plus_one else 0)
    g = dy * s
    dx = r * (g - xh * (g * xh).mean(axis=axes, keepdims=True))
    lead = tuple(i for i in range(x.ndim) if i not in axes)
    return dx, (dy * xh).sum(axis=lead)


def _batch(dtype, n=2048, d=256, seed=7, offset=0.5):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, d)) * 2 + offset).astype(dtype)
    dy = rng.standard_normal((n, d)).astype(dtype)
    w = rng.uniform(0.5, 2, d).astype(dtype)
    return x, dy, w


def _check_y(got, want, dtype):
    tol = Y_TOL[np.dtype(dtype)]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0,
                               atol=tol * (1 + np.abs(want).max()))


# ------------------------------------------------------------ the math

@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("example", RMS_WORKED_EXAMPLES, ids=lambda e: str(e.row))
def test_worked_examples(example, dtype):
    x = np.array(example.row, dtype)
    res = lnc.rms_norm(x, eps=0.0, return_stats=True)
    assert res.y.dtype == dtype and res.ms.dtype == (F64 if dtype == F64 else F32)
    assert float(res.ms) == example.ms  # exact: small integers squared and summed
    np.testing.assert_allclose(res.y.astype(np.float64), example.y,
                               atol=max(0.5 * 10.0 ** -example.decimals, Y_TOL[np.dtype(dtype)]))


@st.composite
def rms_problems(draw):
    dtype = np.dtype(draw(st.sampled_from(FLOAT_DTYPES)))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=2)))
    d = draw(st.sampled_from(BOUNDARY_D + (1, 2, 3, 700)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    offset = draw(st.sampled_from([0.0, 1.0, -50.0, 1e3]))
    scale = draw(st.sampled_from([1.0, 1e-3, 30.0]))
    if dtype == F16:
        offset, scale = max(min(offset, 50.0), -50.0), min(scale, 4.0)
    x = (offset + scale * rng.standard_normal(shape + (d,))).astype(dtype)
    w = None if draw(st.booleans()) else rng.uniform(-2, 2, d).astype(dtype)
    eps = draw(st.sampled_from([0.0, 1e-6, 1e-5, 0.5]))
    convention = draw(st.sampled_from(["weight", "1+weight"]))
    return x, w, eps, convention


@given(rms_problems())
def test_matches_the_float64_reference(p):
    x, w, eps, convention = p
    res = lnc.rms_norm(x, w, eps, return_stats=True, convention=convention)
    ref = lnc.reference_rms_norm(x, w, eps, convention=convention)
    assert res.y.shape == x.shape and res.y.dtype == x.dtype
    assert res.ms.shape == x.shape[:-1]
    _check_y(res.y, ref.y, x.dtype)
    np.testing.assert_allclose(res.ms, ref.ms, rtol=STATS_TOL[x.dtype])


@pytest.mark.parametrize("value", [300.0, 6e4, 65504.0])
def test_float16_squares_never_overflow(value):
    """x^2 of float16 values beyond 256 overflows float16: computed in float32."""
    x = np.full((2, 64), value, np.float16)
    x[1, ::2] = -x[1, ::2]
    res = lnc.rms_norm(x, eps=0.0, return_stats=True)
    assert_same_bits(res.y, np.where(x > 0, 1.0, -1.0).astype(np.float16))
    assert np.all(np.isclose(res.ms, float(np.float16(value)) ** 2, rtol=1e-6))


@pytest.mark.parametrize("dtype,value", [(F32, 1e30), (F32, 3e38), (F32, 1e-30), (F32, 1e-44),
                                         (F64, 1e200), (F64, 1.7e308), (F64, 1e-200),
                                         (F64, 5e-324)])
def test_huge_and_tiny_records(dtype, value):
    """The squares would overflow or underflow: the record is scaled by a
    power of two first, so y is as accurate as for ordinary values."""
    rng = np.random.default_rng(1)
    x = (rng.uniform(0.5, 1, (3, 100)) * value).astype(dtype)
    x[x == 0] = np.asarray(value, dtype)
    y = lnc.rms_norm(x, eps=0.0)
    ref = lnc.reference_rms_norm(x, eps=0.0)
    assert np.all(np.isfinite(y))
    _check_y(y, ref.y, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_stay_in_their_record(dtype, bad):
    x, _, w = _batch(dtype, n=6, d=40)
    clean = lnc.rms_norm(x, w)
    x[2, 7] = bad
    y = lnc.rms_norm(x, w)
    assert np.isnan(y[2]).all()
    assert_same_bits(np.delete(y, 2, axis=0), np.delete(clean, 2, axis=0))


def test_zero_record():
    y = lnc.rms_norm(np.zeros((2, 8)), eps=1e-6)
    assert_same_bits(y, np.zeros((2, 8)))
    assert np.isnan(lnc.rms_norm(np.zeros(8), eps=0.0)).all()


# ------------------------------------------------------------ conventions

@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_gemma_scale_is_one_plus_weight_rounded_once(dtype):
    """Gemma's 1 + weight is formed in the computation's type (float32 for
    float16), as its reference code does, and applied like a weight."""
    x, _, w = _batch(dtype, n=33, d=96)
    w = (w - 1).astype(dtype)
    ctype = F64 if dtype == F64 else F32
    want = lnc.rms_norm(x.astype(ctype), w.astype(ctype) + ctype.type(1)).astype(dtype)
    got = lnc.rms_norm(x, w, convention="1+weight")
    assert_same_bits(got, want)
    # the same through the general path (another axis)
    got_t = lnc.rms_norm(np.ascontiguousarray(x.T), w, axis=0, convention="1+weight")
    assert_same_bits(got_t.T, want)


def test_gemma_differs_from_weight():
    x = np.array([[3.0, 4.0]])
    w = np.array([0.5, 0.5])
    assert not np.allclose(lnc.rms_norm(x, w), lnc.rms_norm(x, w, convention="1+weight"))
    np.testing.assert_allclose(lnc.rms_norm(x, w, convention="1+weight"),
                               lnc.rms_norm(x, w + 1))


def test_unknown_convention_is_refused():
    with pytest.raises(ValueError, match=r"^convention: expected 'weight'.*got 'gemma'"):
        lnc.rms_norm(np.ones(4), convention="gemma")
    with pytest.raises(ValueError, match=r"^convention:"):
        lnc.rms_norm_backward(np.ones(4), np.ones(4), convention="1 + weight")
    with pytest.raises(ValueError, match=r"^convention:"):
        lnc.RMSNorm(4, convention="T5")


# ------------------------------------------------------------ reproducibility

@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_bit_identical_across_levels_and_threads(dtype, restore_settings):
    x, dy, w = _batch(dtype, n=1500)
    want = None
    for isa in lnc.supported_isas():
        for threads in (1, 2, 3):
            lnc.set_isa(isa)
            lnc.set_num_threads(threads)
            got = (lnc.rms_norm(x, w, return_stats=True), lnc.rms_norm_backward(dy, x, w))
            if want is None:
                want = got
                continue
            for a, b, name in ((got[0].y, want[0].y, "y"), (got[0].ms, want[0].ms, "ms"),
                               (got[1].dx, want[1].dx, "dx"),
                               (got[1].dweight, want[1].dweight, "dweight")):
                assert_same_bits(a, b, f"{name} ({isa}, {threads} threads)")


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_bit_identical_in_every_layout(layout):
    x, dy, w = _batch(np.float32, n=64, d=96)
    want = lnc.rms_norm(x, w, return_stats=True)
    got = lnc.rms_norm(LAYOUTS[layout](x), LAYOUTS[layout](w[None])[0], return_stats=True)
    assert_same_bits(np.ascontiguousarray(got.y), want.y, f"y ({layout})")
    assert_same_bits(got.ms, want.ms, f"ms ({layout})")
    gb = lnc.rms_norm_backward(LAYOUTS[layout](dy), LAYOUTS[layout](x), w)
    wb = lnc.rms_norm_backward(dy, x, w)
    assert_same_bits(np.ascontiguousarray(gb.dx), wb.dx, f"dx ({layout})")
    assert_same_bits(gb.dweight, wb.dweight, f"dweight ({layout})")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_a_record_alone_or_in_a_batch(dtype):
    x, dy, w = _batch(dtype, n=50, d=130)
    full = lnc.rms_norm(x, w)
    back = lnc.rms_norm_backward(dy, x, w)
    for i in (0, 17, 49):
        assert_same_bits(lnc.rms_norm(x[i], w), full[i], f"y[{i}]")
        assert_same_bits(lnc.rms_norm_backward(dy[i:i + 1], x[i:i + 1], w).dx[0], back.dx[i],
                         f"dx[{i}]")


def test_dweight_does_not_depend_on_record_order():
    x, dy, w = _batch(np.float32, n=777, d=100)
    want = lnc.rms_norm_backward(dy, x, w)
    for seed in range(3):
        p = np.random.default_rng(seed).permutation(len(x))
        g = lnc.rms_norm_backward(dy[p], x[p], w)
        assert_same_bits(g.dweight, want.dweight, "dweight")
        assert_same_bits(g.dx, want.dx[p], "dx")


def test_rms_norm_of_layer_norm_output_is_layer_norm():
    """A centered record's RMSNorm is its LayerNorm (the same statistics
    when the mean is 0): a cross-check of the two ops."""
    x = np.array([[-3.0, -1.0, 1.0, 3.0], [2.0, -2.0, 0.5, -0.5]])
    np.testing.assert_allclose(lnc.rms_norm(x, eps=1e-5), lnc.layer_norm(x, eps=1e-5),
                               rtol=0, atol=1e-15)


# ------------------------------------------------------------ the backward

@given(rms_problems(), st.integers(0, 2**32 - 1))
def test_backward_matches_the_float64_reference(p, seed):
    x, w, eps, convention = p
    if eps == 0.0:
        eps = 1e-6
    dy = np.random.default_rng(seed).standard_normal(x.shape).astype(x.dtype)
    g = lnc.rms_norm_backward(dy, x, w, eps, convention=convention)
    dx, dw = ref_backward(dy, x, w, eps, plus_one=convention == "1+weight")
    assert g.dx.dtype == x.dtype and g.dx.shape == x.shape
    assert g.dweight.dtype == (F64 if x.dtype == F64 else F32)
    t = {F16: 4e-3, F32: 1e-5, F64: 1e-11}[x.dtype]
    np.testing.assert_allclose(g.dx, dx, rtol=0, atol=4 * t * max(1.0, np.abs(dx).max()))
    np.testing.assert_allclose(g.dweight, dw, rtol=t, atol=t * (1 + np.abs(dw).max()))


def test_backward_matches_central_finite_differences():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 9)) * 2 + 1
    w = rng.uniform(0.5, 2, 9)
    dy = rng.standard_normal(x.shape)
    for convention in ("weight", "1+weight"):
        def loss(x_, w_):
            return float((lnc.rms_norm(x_, w_, 1e-3, convention=convention) * dy).sum())

        g = lnc.rms_norm_backward(dy, x, w, 1e-3, convention=convention)
        h = 1e-6
        for name, arr, got in (("x", x, g.dx), ("w", w, g.dweight)):
            num = np.zeros_like(arr)
            for i in np.ndindex(arr.shape):
                up, dn = arr.copy(), arr.copy()
                up[i] += h
                dn[i] -= h
                pair = ((up, w), (dn, w)) if name == "x" else ((x, up), (x, dn))
                num[i] = (loss(*pair[0]) - loss(*pair[1])) / (2 * h)
            np.testing.assert_allclose(got, num, rtol=1e-6, atol=1e-7,
                                       err_msg=f"{name} ({convention})")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_backward_non_finite_stays_in_its_record(dtype):
    x, dy, w = _batch(dtype, n=6, d=40)
    clean = lnc.rms_norm_backward(dy, x, w)
    x[3, 5] = np.inf
    g = lnc.rms_norm_backward(dy, x, w)
    assert np.isnan(g.dx[3]).all()
    assert_same_bits(np.delete(g.dx, 3, axis=0), np.delete(clean.dx, 3, axis=0))


def test_backward_float16_large_values():
    x = np.full((2, 32), 1000.0, np.float16)
    x[:, 0] = 2000.0
    dy = np.ones_like(x)
    g = lnc.rms_norm_backward(dy, x)
    dx, dw = ref_backward(dy, x)
    assert np.all(np.isfinite(g.dx))
    np.testing.assert_allclose(g.dx, dx, atol=1e-3 * np.abs(dx).max())


def test_backward_given_ms_is_checked_and_not_needed():
    x, dy, w = _batch(np.float32, n=10, d=20)
    ms = lnc.rms_norm(x, w, return_stats=True).ms
    assert_same_bits(lnc.rms_norm_backward(dy, x, w, ms=ms).dx, lnc.rms_norm_backward(dy, x, w).dx)
    with pytest.raises(ValueError, match=r"^ms: expected shape \(10,\)"):
        lnc.rms_norm_backward(dy, x, w, ms=ms[:5])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_ufuncs(dtype):
    x, dy, w = _batch(dtype, n=30, d=70)
    assert_same_bits(lnc.rms_norm_ufunc(x, w, 1e-6), lnc.rms_norm(x, w))
    want = lnc.rms_norm_backward(dy, x, w).dx
    assert_same_bits(lnc.rms_norm_backward_ufunc(dy, x, w, 1e-6), want)
    assert_same_bits(lnc.rms_norm_backward_ufunc(dy.T, x.T, w, 1e-6, axes=[0, 0, 0, (), 0]),
                     want.T)


@pytest.mark.parametrize("axis", [0, 1, (1, 2), (0, 2)])
def test_axes(axis):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 4, 5))
    dy = rng.standard_normal(x.shape)
    axes = (axis,) if np.ndim(axis) == 0 else axis
    w = rng.uniform(0.5, 2, tuple(x.shape[a] for a in axes))
    res = lnc.rms_norm(x, w, axis=axis, return_stats=True)
    ref = lnc.reference_rms_norm(x, w, axis=axis)
    np.testing.assert_allclose(res.y, ref.y, atol=1e-13)
    np.testing.assert_allclose(res.ms, ref.ms, rtol=1e-13)
    g = lnc.rms_norm_backward(dy, x, w, axis=axis)
    dx, dw = ref_backward(dy, x, w, axis=axis)
    np.testing.assert_allclose(g.dx, dx, atol=1e-12)
    np.testing.assert_allclose(g.dweight, dw, atol=1e-12)


# ------------------------------------------------------------ the API

def test_errors_name_the_argument():
    x = np.zeros((2, 4))
    with pytest.raises(ValueError, match=r"^weight: expected shape \(4,\)"):
        lnc.rms_norm(x, np.ones(3))
    with pytest.raises(ValueError, match=r"^eps: expected a finite number >= 0"):
        lnc.rms_norm(x, eps=float("nan"))
    with pytest.raises(TypeError, match=r"^x: expected a real array"):
        lnc.rms_norm(x.astype(complex))
    with pytest.raises(TypeError, match=r"^x: expected array_like, got None"):
        lnc.rms_norm(None)
    with pytest.raises(ValueError, match=r"^dy: expected shape \(2, 4\)"):
        lnc.rms_norm_backward(np.zeros((2, 3)), x)
    with pytest.raises(TypeError, match=r"^return_stats: expected a bool"):
        lnc.rms_norm(x, return_stats=1)


def test_inputs_are_not_modified():
    x, dy, w = _batch(np.float32, n=20, d=50)
    copies = [a.copy() for a in (x, dy, w)]
    lnc.rms_norm(x, w, convention="1+weight")
    lnc.rms_norm_backward(dy, x, w)
    for a, c in zip((x, dy, w), copies):
        assert_same_bits(a, c)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_out_may_be_x_or_weight(dtype):
    x, _, w = _batch(dtype, n=16, d=16)
    want = lnc.rms_norm(x, w)
    xx = x.copy()
    assert lnc.rms_norm(xx, w, out=xx) is xx
    assert_same_bits(xx, want)
    # out is the weight's memory: the weight is read before it is overwritten
    buf = np.empty((16, 16), dtype)
    buf[0] = w
    assert_same_bits(lnc.rms_norm(x, buf[0], out=buf), want)


def test_mixed_dtypes_promote():
    x, dy, w = _batch(np.float16, n=10, d=20)
    y = lnc.rms_norm(x, w.astype(np.float32))
    assert y.dtype == F32
    assert_same_bits(y, lnc.rms_norm(x.astype(F32), w.astype(F32)))
    g = lnc.rms_norm_backward(dy, x, w.astype(np.float64))
    assert g.dx.dtype == F64


def test_python_lists_and_integers():
    np.testing.assert_allclose(lnc.rms_norm([3, 4], eps=0.0), [0.848528137, 1.131370850])


# ------------------------------------------------------------ the layer

def test_layer_conventions_and_parameters():
    rn = lnc.RMSNorm(8)
    assert (rn.num_parameters, rn.convention) == (8, "weight")
    assert_same_bits(rn.weight, np.ones(8, np.float32))
    gm = lnc.RMSNorm(8, convention="1+weight")
    assert gm.convention == "1+weight"
    assert_same_bits(gm.weight, np.zeros(8, np.float32))
    none = lnc.RMSNorm((2, 4), gain=False)
    assert (none.num_parameters, none.convention, none.weight) == (0, "none", None)
    assert "RMSNorm((8,), eps=1e-06" in repr(rn)
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    assert_same_bits(rn(x), gm(x))  # weight 1 and 1 + 0: the same scale


def test_layer_accumulates_exactly_over_micro_batches():
    x, dy, _ = _batch(np.float32, n=64, d=16)
    full = lnc.RMSNorm(16)
    full(x)
    dx_full = full.backward(dy)
    parts = lnc.RMSNorm(16)
    for idx in np.array_split(np.random.default_rng(1).permutation(64), 5):
        parts(x[idx])
        assert_same_bits(parts.backward(dy[idx]), dx_full[idx])
    assert_same_bits(parts.grad_weight, full.grad_weight)
    full.zero_grad()
    assert_same_bits(full.grad_weight, np.zeros(16, np.float32))


def test_layer_keeps_copies_for_the_backward():
    """Changing x or the weight in place after the forward does not change
    the backward (PyTorch refuses such a backward; here it is simply not
    affected)."""
    for layer in (lnc.RMSNorm(4), lnc.LayerNorm(4)):
        x = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
        y = layer(x)
        fresh = type(layer)(4)
        fresh(x.copy())
        x[:] = 0
        layer.weight[:] = 5
        assert_same_bits(layer.backward(np.ones_like(y)), fresh.backward(np.ones_like(y)))
        assert_same_bits(layer.grad_weight, fresh.grad_weight)


def test_layer_errors():
    with pytest.raises(RuntimeError, match="forward"):
        lnc.RMSNorm(4).backward(np.ones((1, 4)))
    with pytest.raises(ValueError, match=r"^x: expected trailing axes \(4,\)"):
        lnc.RMSNorm(4)(np.ones((2, 5)))
    with pytest.raises(ValueError, match=r"^normalized_shape:"):
        lnc.RMSNorm(0)
    with pytest.raises(ValueError, match=r"^eps:"):
        lnc.RMSNorm(4, eps=-1.0)
    with pytest.raises(KeyError, match="bias"):
        lnc.RMSNorm(4).load_state_dict({"weight": np.ones(4), "bias": np.zeros(4)})


# ------------------------------------------------------------ torch

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_torch(dtype):
    torch = pytest.importorskip("torch")
    x, dy, w = _batch(dtype, n=40, d=48)
    xt = torch.from_numpy(x.copy()).requires_grad_()
    wt = torch.from_numpy(w.copy()).requires_grad_()
    yt = torch.nn.functional.rms_norm(xt, (48,), wt, 1e-6)
    yt.backward(torch.from_numpy(dy))
    tol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(lnc.rms_norm(x, w), yt.detach().numpy(), rtol=0, atol=tol * 10)
    g = lnc.rms_norm_backward(dy, x, w)
    np.testing.assert_allclose(g.dx, xt.grad.numpy(), atol=tol * 30)
    np.testing.assert_allclose(g.dweight, wt.grad.numpy(), atol=tol * 300)


def test_layer_state_dict_round_trips_through_torch():
    torch = pytest.importorskip("torch")
    t = torch.nn.RMSNorm(6, eps=1e-6)
    with torch.no_grad():
        t.weight.copy_(torch.linspace(0.5, 1.5, 6))
    rn = lnc.RMSNorm(6)
    rn.load_state_dict(t.state_dict())
    x = np.random.default_rng(3).standard_normal((5, 6)).astype(np.float32)
    np.testing.assert_allclose(rn(x), t(torch.from_numpy(x)).detach().numpy(), atol=1e-6)
    back = torch.nn.RMSNorm(6, eps=1e-6)
    back.load_state_dict({k: torch.from_numpy(v) for k, v in rn.state_dict().items()})
    assert torch.equal(back.weight, t.weight)


def test_gemma_float16_backward_overflows_to_inf_without_a_warning():
    """The "1+weight" backward computes float16 records through a float32
    dx and casts it; an overflow there is inf, silently, as the default
    convention's kernel writes it."""
    import warnings
    x = np.array([[1e-5, 0.0]], np.float16)
    dy = np.array([[0.0, 1.0]], np.float16)
    w = np.array([3.0, 3.0], np.float16)
    plain = lnc.rms_norm_backward(dy, x, w, eps=0.0).dx
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gemma = lnc.rms_norm_backward(dy, x, w - np.float16(1), eps=0.0, convention="1+weight").dx
    assert np.isinf(plain[0, 1]) and np.isinf(gemma[0, 1])
