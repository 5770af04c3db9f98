"""The LayerNorm backward pass: against a float64 reference, its
invariants, finite differences, torch and JAX; bit-for-bit reproducibility
of dx and of the exact parameter-gradient sums; errors; the gufunc."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import layernorm_c as lnc
from cases import BLOCK, F16, F32, F64, FLOAT_DTYPES, LANES, LAYOUTS
from core_strategies import assert_same_bits


def ref_backward(dy, x, w=None, eps=1e-5, axis=-1):
    """The textbook backward in float64 (mean and var as constants of the
    chain rule, written out)."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    axes = (axis,) if np.ndim(axis) == 0 else tuple(axis)
    axes = tuple(sorted(a % x.ndim for a in axes))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    r = 1.0 / np.sqrt(var + eps)
    xh = (x - mu) * r
    shape = [x.shape[i] if i in axes else 1 for i in range(x.ndim)]
    g = dy if w is None else dy * np.asarray(w, np.float64).reshape(shape)
    dx = r * (g - g.mean(axis=axes, keepdims=True) - xh * (g * xh).mean(axis=axes, keepdims=True))
    lead = tuple(i for i in range(x.ndim) if i not in axes)
    return dx, (dy * xh).sum(axis=lead), dy.sum(axis=lead)


TOL = {F16: 4e-3, F32: 1e-5, F64: 1e-11}


@st.composite
def backward_problems(draw):
    dtype = np.dtype(draw(st.sampled_from(FLOAT_DTYPES)))
    n = draw(st.integers(1, 6))
    d = draw(st.integers(1, 300))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    offset = draw(st.sampled_from([0.0, 1.0, -50.0, 1e3]))
    scale = draw(st.sampled_from([1.0, 1e-2, 30.0]))
    if dtype == F16:
        offset, scale = min(offset, 50.0), min(scale, 4.0)
    x = (offset + scale * rng.standard_normal((n, d))).astype(dtype)
    dy = rng.standard_normal((n, d)).astype(dtype)
    w = draw(st.sampled_from([None, "w"]))
    w = None if w is None else rng.uniform(-2, 2, d).astype(dtype)
    eps = draw(st.sampled_from([1e-5, 1e-3, 0.5]))
    return x, dy, w, eps


@given(backward_problems())
def test_matches_the_float64_reference(p):
    x, dy, w, eps = p
    g = lnc.layer_norm_backward(dy, x, w, eps)
    dx, dw, db = ref_backward(dy, x, w, eps)
    t = TOL[x.dtype]
    scale = max(1.0, float(np.abs(dx).max()))
    assert g.dx.dtype == x.dtype and g.dx.shape == x.shape
    assert g.dweight.dtype == (F64 if x.dtype == F64 else F32)
    np.testing.assert_allclose(g.dx, dx, rtol=0, atol=t * scale * 4)
    np.testing.assert_allclose(g.dweight, dw, rtol=t, atol=t * (1 + np.abs(dw).max()))
    # dbias = sum(dy) exactly, rounded once
    np.testing.assert_allclose(g.dbias, db, rtol=1e-6 if x.dtype != F64 else 1e-14, atol=1e-6)


@pytest.mark.parametrize("offset", [0.0, 1e2, 1e3, 1e4])
@pytest.mark.parametrize("d", [7, 768, 4096, 65536])
def test_float32_dx_accurate_at_large_offsets(offset, d):
    """The issue's target: float32 dx within 1e-5 of max|dx| for rows
    N(offset, 1), offsets up to 1e4, d up to 65536."""
    rng = np.random.default_rng(d)
    n = max(1, 4096 // d)
    x = (offset + rng.standard_normal((n, d))).astype(np.float32)
    dy = rng.standard_normal((n, d)).astype(np.float32)
    w = rng.uniform(0.5, 2, d).astype(np.float32)
    g = lnc.layer_norm_backward(dy, x, w)
    dx, dw, _ = ref_backward(dy, x, w)
    assert np.abs(g.dx - dx).max() <= 1e-5 * np.abs(dx).max()
    assert np.abs(g.dweight - dw).max() <= 1e-5 * np.abs(dw).max()


def test_float64_accuracy():
    rng = np.random.default_rng(5)
    x = 1e4 + rng.standard_normal((64, 1000))
    dy = rng.standard_normal(x.shape)
    g = lnc.layer_norm_backward(dy, x)
    dx, dw, db = ref_backward(dy, x)
    assert np.abs(g.dx - dx).max() <= 1e-11 * np.abs(dx).max()
    assert np.abs(g.dweight - dw).max() <= 1e-11 * np.abs(dw).max()


@given(backward_problems())
def test_invariants(p):
    """sum(dx) = 0 for every record; sum(dx * xhat) = rstd * sum(g * xhat) *
    eps / (var + eps) (0 with eps = 0)."""
    x, dy, w, eps = p
    x = x.astype(np.float64)
    dy = dy.astype(np.float64)
    g = lnc.layer_norm_backward(dy, x, w, eps)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    r = 1 / np.sqrt(var + eps)
    xh = (x - mu) * r
    gg = dy if w is None else dy * w.astype(np.float64)
    scale = np.abs(gg).sum(-1) * r[:, 0] + 1e-300
    assert np.all(np.abs(g.dx.sum(-1)) <= 1e-10 * scale * math.sqrt(x.shape[-1]) + 1e-300)
    want = r[:, 0] * (gg * xh).sum(-1) * eps / (var[:, 0] + eps)
    got = (g.dx * xh).sum(-1)
    assert np.all(np.abs(got - want) <= 1e-9 * scale * math.sqrt(x.shape[-1]))


@pytest.mark.parametrize("eps", [0.0, 1e-5])
def test_eps_zero_invariant_with_unit_gain(eps):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 33))
    dy = rng.standard_normal((8, 33))
    g = lnc.layer_norm_backward(dy, x, np.ones(33), eps)
    xh = lnc.reference_layer_norm(x, eps=eps).y
    if eps == 0.0:
        np.testing.assert_allclose((g.dx * xh).sum(-1), 0, atol=1e-12)
    np.testing.assert_allclose(g.dx.sum(-1), 0, atol=1e-12)


def test_matches_central_finite_differences():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 9)) * 2 + 1
    w = rng.uniform(0.5, 2, 9)
    b = rng.standard_normal(9)
    dy = rng.standard_normal(x.shape)

    def loss(x_, w_, b_):
        return float((lnc.layer_norm(x_, w_, b_, 1e-3) * dy).sum())

    g = lnc.layer_norm_backward(dy, x, w, 1e-3)
    h = 1e-6
    for name, arr, got in (("x", x, g.dx), ("w", w, g.dweight), ("b", b, g.dbias)):
        num = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            up, dn = arr.copy(), arr.copy()
            up[i] += h
            dn[i] -= h
            args = {"x": (x, w, b), "w": (x, w, b), "b": (x, w, b)}[name]
            a_up = [up if nm == name else v for nm, v in zip("xwb", args)]
            a_dn = [dn if nm == name else v for nm, v in zip("xwb", args)]
            num[i] = (loss(*a_up) - loss(*a_dn)) / (2 * h)
        np.testing.assert_allclose(got, num, rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_torch_autograd(dtype):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 5, 48)) * 3 + 2).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    w = rng.uniform(0.5, 2, 48).astype(dtype)
    b = rng.standard_normal(48).astype(dtype)
    xt = torch.from_numpy(x.copy()).requires_grad_()
    wt = torch.from_numpy(w.copy()).requires_grad_()
    bt = torch.from_numpy(b.copy()).requires_grad_()
    torch.nn.functional.layer_norm(xt, (48,), wt, bt, 1e-5).backward(torch.from_numpy(dy))
    g = lnc.layer_norm_backward(dy, x, w)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(g.dx, xt.grad.numpy(), atol=tol * 10)
    np.testing.assert_allclose(g.dweight, wt.grad.numpy(), atol=tol * 100)
    np.testing.assert_allclose(g.dbias, bt.grad.numpy(), atol=tol * 100)


def test_matches_jax_vjp(jax_x64):
    jax = jax_x64
    jnp = pytest.importorskip("jax.numpy")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 40)) * 2 + 1
    dy = rng.standard_normal(x.shape)
    w = rng.uniform(0.5, 2, 40)

    def f(x_, w_):
        mu = x_.mean(-1, keepdims=True)
        var = ((x_ - mu) ** 2).mean(-1, keepdims=True)
        return (x_ - mu) / jnp.sqrt(var + 1e-5) * w_

    _, vjp = jax.vjp(f, jnp.asarray(x), jnp.asarray(w))
    dx, dw = vjp(jnp.asarray(dy))
    g = lnc.layer_norm_backward(dy, x, w)
    np.testing.assert_allclose(g.dx, np.asarray(dx), atol=1e-12)
    np.testing.assert_allclose(g.dweight, np.asarray(dw), atol=1e-11)


# ------------------------------------------------------------ reproducibility

def _batch(dtype, n=2048, d=256, seed=7):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, d)) * 2 + 5).astype(dtype)
    dy = rng.standard_normal((n, d)).astype(dtype)
    w = rng.uniform(0.5, 2, d).astype(dtype)
    return x, dy, w


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_bit_identical_across_levels_and_threads(dtype, restore_settings):
    x, dy, w = _batch(dtype)
    want = None
    for isa in lnc.supported_isas():
        for threads in (1, 2, 3):
            lnc.set_isa(isa)
            lnc.set_num_threads(threads)
            g = lnc.layer_norm_backward(dy, x, w)
            if want is None:
                want = g
                continue
            for name, a, b in zip(g._fields, g, want):
                assert_same_bits(a, b, f"{name} ({isa}, {threads} threads)")


def _backward_dtypes():
    """float16/32/64, and bfloat16 when ml_dtypes is installed."""
    try:
        import ml_dtypes
    except ImportError:
        return list(FLOAT_DTYPES)
    return list(FLOAT_DTYPES) + [np.dtype(ml_dtypes.bfloat16)]


def _assert_levels_match_scalar(dy, x, w, what):
    """Every level gives the scalar level's bits for dx, dweight and dbias
    of LayerNorm (with and without the forward's mean) and of RMSNorm."""
    mean = lnc.layer_norm(x, w, return_stats=True).mean

    def calls():
        return {"ln": lnc.layer_norm_backward(dy, x, w),
                "ln, mean given": lnc.layer_norm_backward(dy, x, w, mean=mean),
                "rms": lnc.rms_norm_backward(dy, x, w)}

    lnc.set_isa("scalar")
    want = calls()
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        for op, g in calls().items():
            for name, u, v in zip(g._fields, g, want[op]):
                assert_same_bits(u, v, f"{name} of {op} ({isa}, {what})")


BACKWARD_WIDTHS = (list(range(33, 4 * LANES + 3)) +
                   [BLOCK - 1, BLOCK, BLOCK + 1, BLOCK + 17, 2 * BLOCK - 9, 3 * BLOCK,
                    4 * BLOCK + 23, 16 * BLOCK + 3])


def test_every_isa_matches_scalar_on_the_backwards_tails(restore_settings):
    """The backward's sums and dx at every tail of the lane rows and of
    the per-part registers (d past the short groups, up to four lane
    rows), and across block ends: every level gives the scalar level's
    bits for dx, dweight and dbias, of LayerNorm (with and without the
    forward's mean) and of RMSNorm, in every dtype."""
    rng = np.random.default_rng(29)
    for dtype in _backward_dtypes():
        for d in BACKWARD_WIDTHS:
            x = (rng.standard_normal((3, d)) * 2 + 5).astype(dtype)
            dy = rng.standard_normal((3, d)).astype(dtype)
            w = rng.uniform(0.5, 2, d).astype(dtype)
            _assert_levels_match_scalar(dy, x, w, f"{dtype}, d={d}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_parameter_gradients_do_not_depend_on_record_order(dtype):
    """The moonshot: permute the records (rows of x and dy together):
    dweight and dbias keep their bits; each record's dx moves with it."""
    x, dy, w = _batch(dtype, n=777, d=100)
    want = lnc.layer_norm_backward(dy, x, w)
    for seed in range(3):
        p = np.random.default_rng(seed).permutation(len(x))
        g = lnc.layer_norm_backward(dy[p], x[p], w)
        assert_same_bits(g.dweight, want.dweight, "dweight")
        assert_same_bits(g.dbias, want.dbias, "dbias")
        assert_same_bits(g.dx, want.dx[p], "dx")


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_bit_identical_in_every_layout(layout):
    x, dy, w = _batch(np.float32, n=64, d=96)
    want = lnc.layer_norm_backward(dy, x, w)
    g = lnc.layer_norm_backward(LAYOUTS[layout](dy), LAYOUTS[layout](x), w)
    for name, a, b in zip(g._fields, g, want):
        assert_same_bits(np.ascontiguousarray(a), b, f"{name} ({layout})")


def test_a_record_alone_or_in_a_batch():
    x, dy, w = _batch(np.float32, n=50, d=130)
    full = lnc.layer_norm_backward(dy, x, w)
    for i in (0, 17, 49):
        one = lnc.layer_norm_backward(dy[i:i + 1], x[i:i + 1], w)
        assert_same_bits(one.dx[0], full.dx[i], f"dx[{i}]")


def test_chunks_merge_exactly():
    """Sums of parts (any split, any order) are the whole's sum, bit for bit."""
    x, dy, w = _batch(np.float64, n=300, d=40)
    whole = lnc.layer_norm_backward(dy, x, w)
    from layernorm_c._backward import _backward_parts
    parts = [slice(0, 7), slice(150, 300), slice(7, 150)]
    sw = sb = None
    for s in parts:
        _, a, b, _ = _backward_parts(dy[s], x[s], w, 1e-5, -1, None, None)
        sw = a if sw is None else sw + a
        sb = b if sb is None else b + sb
    assert_same_bits(sw.value(np.float64), whole.dweight, "dweight")
    assert_same_bits(sb.value(np.float64), whole.dbias, "dbias")


@pytest.mark.parametrize("d", [8, 40, 700])
def test_states_are_the_same_words_however_the_records_are_split(d):
    """The exported state (each level's exact total) does not depend on
    whether the sums were spilled: a call of more records than a spill
    takes (2048) and merged states of parts of it give the same words."""
    x, dy, w = _batch(np.float32, n=2100, d=d)
    from layernorm_c._backward import _backward_parts
    _, whole_w, whole_b, _ = _backward_parts(dy, x, w, 1e-5, -1, None, None)
    for cuts in ([1, 2048], [5, 2053], [1000, 1001, 2099]):
        sw = sb = None
        for lo, hi in zip([0] + cuts, cuts + [len(x)]):
            _, a, b, _ = _backward_parts(dy[lo:hi], x[lo:hi], w, 1e-5, -1, None, None)
            sw = a if sw is None else sw + a
            sb = b if sb is None else sb + b
        assert sw.state.tobytes() == whole_w.state.tobytes(), cuts
        assert sb.state.tobytes() == whole_b.state.tobytes(), cuts


@pytest.mark.parametrize("scale", [1.0, 3e4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=str)
def test_sums_round_the_same_read_directly_or_from_their_state(dtype, scale):
    """A call of a few records rounds its sums straight from the level sums
    (never spilled); the same sums read back from their exported state go
    through the 128-bit totals. Both give the same bits, with terms on two
    levels and (scale 3e4: |dy * xhat| above 2^13) on three."""
    from layernorm_c._backward import _backward_parts
    for n in (1, 3, 40):
        x, dy, w = _batch(dtype, n=n, d=300)
        dy = (dy * dtype(scale)).astype(dtype)
        g = lnc.layer_norm_backward(dy, x, w)
        _, sw, sb, _ = _backward_parts(dy, x, w, 1e-5, -1, None, None)
        assert_same_bits(g.dweight, sw.value(g.dweight.dtype), f"dweight, {n} records")
        assert_same_bits(g.dbias, sb.value(g.dbias.dtype), f"dbias, {n} records")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_given_mean_gives_the_same_bits(dtype):
    x, dy, w = _batch(dtype, n=40, d=300)
    x = x + np.asarray(1e3 if dtype != F16 else 10, dtype)
    fwd = lnc.layer_norm(x, w, return_stats=True)
    a = lnc.layer_norm_backward(dy, x, w)
    b = lnc.layer_norm_backward(dy, x, w, mean=fwd.mean, var=fwd.var)
    c = lnc.layer_norm_backward(dy, x, w, mean=fwd.mean[:, None])
    for g in (b, c):
        for name, u, v in zip(g._fields, g, a):
            assert_same_bits(u, v, name)


def _records_near_the_fallbacks(dtype, d=96, seed=3):
    """Records whose forward keeps its statistics and records whose
    forward recomputes them (item 8 of the contract), on both sides of
    each range limit, with and without cancellation around the mean."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(d)
    if dtype == F64:
        scales = [2.0 ** e for e in (-484, -481, -479, -476, -470, 500, 508, 511, 512)]
        scales += [1e150, 1e153, 1e154]  # squares near and past the double range
    else:
        scales = [10.0 ** e for e in np.arange(-16.5, -13, 0.25)]
        scales += [10.0 ** e for e in np.arange(13.5, 16.5, 0.25)]
    rows = [z * s for s in scales]
    rows += [o + z * s for o in (1.0, 1e4, -3e5) for s in (1e-9, 1e-6, 1e-4, 1e-2)]
    return np.array(rows).astype(dtype)


@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
def test_omitted_mean_is_the_forwards_near_its_fallbacks(dtype, restore_settings):
    """Without `mean` the backward takes the forward's mean from its first
    pass when its own sums show the forward's variance safely in range, and
    computes the forward's statistics in full otherwise: either way the
    bits of passing the forward's mean."""
    x = _records_near_the_fallbacks(dtype)
    rng = np.random.default_rng(4)
    dy = rng.standard_normal(x.shape).astype(dtype)
    w = rng.uniform(0.5, 2, x.shape[1]).astype(dtype)
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        fwd = lnc.layer_norm(x, w, return_stats=True)
        a = lnc.layer_norm_backward(dy, x, w)
        b = lnc.layer_norm_backward(dy, x, w, mean=fwd.mean)
        for name, u, v in zip(b._fields, b, a):
            assert_same_bits(u, v, f"{name} ({isa})")


def _records_around_the_square_shift(dtype, d, seed=11):
    """Records of N(1e4, 1) (1e2 in float16) whose first eight values, the
    square shift's span, are moved by k standard deviations: near the
    mean the backward keeps its one pass around the shift, far from it
    (beyond about sqrt(d / 8)) the shift fails and the pass is taken again
    around the forward's mean; a lone outlier at x[0] and one past the
    span too."""
    rng = np.random.default_rng(seed)
    offset = 1e2 if dtype == F16 else 1e4
    rows = []
    for k in (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 12.0, 50.0, 300.0):
        for sign in (1, -1):
            z = offset + rng.standard_normal(d)
            z[:8] += sign * k
            rows.append(z)
    z = offset + rng.standard_normal(d)
    z[0] += 40.0
    rows.append(z)
    z = offset + rng.standard_normal(d)
    z[d // 2] += 40.0
    rows.append(z)
    return np.array(rows).astype(dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("d", [65, 768, 4 * BLOCK + 23])
def test_square_shift_kept_or_not_same_bits_and_accurate(dtype, d, restore_settings):
    """Records of more than 64 features take their backward's pass around
    the square shift when it lies within a standard deviation of the
    mean, else around the forward's mean (item 10 of the contract): on
    both sides of that test, every level gives the scalar level's bits,
    a given mean changes none, and dx and dweight stay within the
    float64 reference's tolerance (a shift kept far from the mean would
    cancel most digits of the variance)."""
    x = _records_around_the_square_shift(dtype, d)
    rng = np.random.default_rng(d)
    dy = rng.standard_normal(x.shape).astype(dtype)
    w = rng.uniform(0.5, 2, d).astype(dtype)
    mean = lnc.layer_norm(x, w, return_stats=True).mean
    lnc.set_isa("scalar")
    want = lnc.layer_norm_backward(dy, x, w)
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        for given in (None, mean):
            g = lnc.layer_norm_backward(dy, x, w, mean=given)
            for name, u, v in zip(g._fields, g, want):
                assert_same_bits(u, v, f"{name} ({isa}, mean given: {given is not None})")
    dx, dw, _ = ref_backward(dy, x, w)
    t = TOL[dtype]
    err = np.abs(want.dx - dx).max(axis=1) / np.abs(dx).max(axis=1)
    assert err.max() <= t, f"dx error {err.max():.3g} of max|dx| (record {err.argmax()})"
    assert np.abs(want.dweight - dw).max() <= t * np.abs(dw).max()


# float32 dx of records whose square shift is far from the mean: within
# this of max|dx| (about 1e-7 measured), where a pass kept around such a
# shift loses digits to the variance's cancellation (1.2e-5 at d = 65536).
FAR_SHIFT_TOL = 1e-6


@pytest.mark.parametrize("d", [8192, 65536])
def test_float32_far_square_shift_keeps_full_accuracy(d):
    """The square shift's eight values far from a tight record's mean
    (md^2 up to d/8 times the variance): the backward takes its pass
    around the forward's mean instead, and stays as accurate as for any
    other record."""
    rng = np.random.default_rng(d)
    x = 1e4 + rng.standard_normal((6, d))
    x[:, :8] += np.array([3.0, 30.0, 300.0, 3000.0, -3000.0, 9000.0])[:, None]
    x = x.astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    w = rng.uniform(0.5, 2, d).astype(np.float32)
    g = lnc.layer_norm_backward(dy, x, w)
    dx, dw, _ = ref_backward(dy, x, w)
    err = np.abs(g.dx - dx).max(axis=1) / np.abs(dx).max(axis=1)
    assert err.max() <= FAR_SHIFT_TOL, f"dx error {err.max():.3g} of max|dx| (record {err.argmax()})"
    assert np.abs(g.dweight - dw).max() <= FAR_SHIFT_TOL * np.abs(dw).max()


SHORT_CASES = [(F32, 1), (F32, 5), (F32, 8), (F32, 16), (F32, 27), (F32, 32), (F32, 47),
               (F32, 64), (F64, 3), (F64, 8), (F64, 16), (F16, 16), (F16, 64)]


@pytest.mark.parametrize("dtype,d", SHORT_CASES, ids=str)
def test_short_records_in_groups_are_the_record_paths_bits(dtype, d, restore_settings):
    """Records of up to 32 features (16 in float64; 64 where the level
    has its own loops for them) are done 16 at a time, and the records of a group whose decisions are not the
    plain ones (near the fallbacks of the statistics, a NaN, a constant
    record, terms on the top level or on the scalar deposit path) go
    through the record path. Every bit is the record path's: dx, dweight
    and dbias of the scalar level (which does every record alone), and
    each record's dx alone (a call of one record takes the record path);
    LayerNorm with and without the forward's mean, and RMSNorm; 2100
    records, across a spill of the level sums."""
    rng = np.random.default_rng(d)
    x = (rng.standard_normal((2100, d)) * 2 + 3).astype(dtype)
    if dtype != F16:  # float16 cannot hold records near float32's limits
        near = _records_near_the_fallbacks(dtype, d=d)
        x[rng.choice(len(x), len(near), replace=False)] = near
    x[7, 0] = np.nan
    x[40] = 2
    dy = rng.standard_normal(x.shape).astype(dtype)
    dy[61] *= 1e4  # terms of 2^13 and more: the group deposits three levels
    if dtype != F16:
        dy[90, 0] = 1e30  # a term of 2^64 or more: the scalar deposit path
    w = rng.uniform(0.5, 2, d).astype(dtype)
    mean = lnc.layer_norm(x, w, return_stats=True).mean

    def calls(a, b):
        return {"ln": lnc.layer_norm_backward(a, b, w),
                "ln, mean given": lnc.layer_norm_backward(a, b, w, mean=mean[:len(b)]),
                "rms": lnc.rms_norm_backward(a, b, w)}

    lnc.set_isa("scalar")
    ref = calls(dy, x)
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        got = calls(dy, x)
        for op, g in got.items():
            for name, u, v in zip(g._fields, g, ref[op]):
                assert_same_bits(u, v, f"{name} of {op} ({isa})")
        for i in (0, 7, 40, 61, 90, 2099):
            one = lnc.layer_norm_backward(dy[i:i + 1], x[i:i + 1], w)
            assert_same_bits(one.dx[0], got["ln"].dx[i], f"dx[{i}] alone ({isa})")


# ------------------------------------------------------------ exact sums

def test_exact_sum_is_the_correctly_rounded_sum():
    from fractions import Fraction
    rng = np.random.default_rng(9)
    terms = rng.standard_normal((1000, 3)) * 10.0 ** rng.integers(-8, 8, (1000, 1))
    dy = terms
    x = np.zeros_like(terms)
    x[:, 0] = 1  # any x: dbias is sum(dy) whatever it is
    g = lnc.layer_norm_backward(dy, x + np.arange(3), eps=1.0)
    for j in range(3):
        exact = sum(Fraction(float(t)) for t in dy[:, j])
        assert g.dbias[j] == float(exact)


def test_wide_records_finished_in_groups_keep_the_exact_sums(restore_settings):
    """Records of more than 512 features are finished eight at a time, a
    column chunk of each in turn, and their deposits counted together:
    the sums stay exact across a spill of the level sums (every 2048
    records) even when a record outside the vector loop (a NaN record,
    deposited one term at a time) shifts where the spill falls in a
    group; and the rows' order changes no bit."""
    from fractions import Fraction
    rng = np.random.default_rng(21)
    n, d = 2100, 520
    x = rng.standard_normal((n, d)).astype(F32)
    dy = rng.standard_normal((n, d)).astype(F32)
    x[5, 7] = np.nan  # dx and the dweight terms NaN; its dy still deposited
    g = lnc.layer_norm_backward(dy, x)
    assert np.isnan(g.dweight).all() and np.isnan(g.dx[5]).all()
    for j in (0, 300, 511, 512, 519):  # float32 sums: rounded once, to 24 bits
        exact = sum(Fraction(float(t)) for t in dy[:, j])
        assert float(g.dbias[j]) == _round_to_bits(exact, 24), j
    perm = rng.permutation(n)
    for threads in (1, 2):
        lnc.set_num_threads(threads)
        h = lnc.layer_norm_backward(dy[perm], x[perm])
        assert_same_bits(h.dbias, g.dbias, f"dbias, rows permuted, {threads} threads")
        assert_same_bits(h.dx, g.dx[perm], f"dx, {threads} threads")
    clean = np.delete(np.arange(n), 5)
    k = lnc.layer_norm_backward(dy[clean], x[clean])
    h = lnc.layer_norm_backward(dy[clean][::-1], x[clean][::-1])
    assert_same_bits(h.dweight, k.dweight, "dweight, rows reversed")


def _assert_groups_match_scalar(n, d, seed, constant=False):
    """The LayerNorm backward of n float32 records of d features, with a
    record whose terms need three levels (so its group's do), a NaN record
    (the record path, outside its group) and optionally a constant one:
    dx, dweight and dbias are the scalar level's bits at every level and
    thread count, and permuting the rows moves dx with them and changes no
    bit of the sums."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, d)) * 2 + 1).astype(F32)
    dy = rng.standard_normal((n, d)).astype(F32)
    dy[9] *= 1e5  # terms of 2^13 and more: its group deposits three levels
    x[13, 5] = np.nan
    if constant:
        x[20] = 3.0  # xhat 0
    w = rng.uniform(0.5, 2, d).astype(F32)
    lnc.set_isa("scalar")
    want = lnc.layer_norm_backward(dy, x, w)
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        for threads in (1, 2):
            lnc.set_num_threads(threads)
            g = lnc.layer_norm_backward(dy, x, w)
            for name, u, v in zip(g._fields, g, want):
                assert_same_bits(u, v, f"{name} ({isa}, {threads} threads)")
    perm = rng.permutation(n)
    h = lnc.layer_norm_backward(dy[perm], x[perm], w)
    assert_same_bits(h.dx, want.dx[perm], "dx, rows permuted")
    assert_same_bits(h.dbias, want.dbias, "dbias, rows permuted")
    assert_same_bits(h.dweight, want.dweight, "dweight, rows permuted")


def test_streamed_groups_deposit_their_terms_together(restore_settings):
    """A LayerNorm backward whose dx (8 MiB or more) is streamed: the
    AVX2 level sums the terms of each group of eight records together,
    chunk by chunk, on three levels when one record of the group needs
    them; features past the last whole register (d = 1030)."""
    _assert_groups_match_scalar(2100, 1030, 41)  # 8.7 MB of float32 dx


@pytest.mark.parametrize("d", [65, 70, 257, 520, 1030], ids=lambda d: f"d={d}")
def test_groups_in_the_caches_write_dx_and_deposit_together(d, restore_settings):
    """A LayerNorm backward in the caches (dx not streamed): the AVX2
    level writes dx and sums the terms of each group of eight records in
    one loop, chunk by chunk; a constant record too, and a last group of
    five."""
    _assert_groups_match_scalar(37, d, 43, constant=True)


@pytest.mark.parametrize("dtype, n", [(F32, 264), (F16, 528)], ids=str)
def test_small_threaded_call_merges_its_workers_sums(dtype, n, restore_settings):
    """A backward call just above thread_threshold() runs on two threads,
    whose sums, never spilled, are merged by adding their level sums: a
    record of three levels in one worker's part only, and float16's dbias
    off the lowest level (no NaN record: its scalar deposits spill, and the
    merge adds 128-bit totals instead); every bit as one thread's and the
    scalar level's, and dbias the exact sum rounded once."""
    from fractions import Fraction
    d = 768
    rng = np.random.default_rng(61)
    x = (rng.standard_normal((n, d)) * 2 + 1).astype(dtype)
    dy = rng.standard_normal((n, d)).astype(dtype)
    dy[3] *= 1e4 if dtype == F16 else 1e5  # terms of 2^13 and more: three levels
    w = rng.uniform(0.5, 2, d).astype(dtype)
    assert x.nbytes >= lnc.thread_threshold()
    lnc.set_isa("scalar")
    lnc.set_num_threads(1)
    want = lnc.layer_norm_backward(dy, x, w)
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        for threads in (1, 2, 3):
            lnc.set_num_threads(threads)
            # a worker that wakes late takes no chunk (and merges nothing):
            # several calls, so that some have two workers' sums to merge
            for _ in range(1 if threads == 1 else 12):
                g = lnc.layer_norm_backward(dy, x, w)
                for name, u, v in zip(g._fields, g, want):
                    assert_same_bits(u, v, f"{name} ({isa}, {threads} threads)")
    bits = np.finfo(want.dbias.dtype).nmant + 1  # float16's sums come as float32
    for j in (0, 7, 500, 767):
        exact = sum(Fraction(float(t)) for t in dy[:, j])
        assert float(want.dbias[j]) == _round_to_bits(exact, bits), j


def _round_to_bits(v, bits):
    """A Fraction rounded once to nearest even to `bits` significant bits."""
    from fractions import Fraction
    if v == 0:
        return 0.0
    m = abs(v)
    e = m.numerator.bit_length() - m.denominator.bit_length()
    if Fraction(2) ** e > m:
        e -= 1  # now 2^e <= m < 2^(e+1)
    unit = Fraction(2) ** (e - bits + 1)
    q, r = divmod(m, unit)
    if r > unit / 2 or (r == unit / 2 and q % 2):
        q += 1
    return float(q * unit) * (1 if v > 0 else -1)


@pytest.mark.parametrize("d", [16, 40, 520], ids=lambda d: f"d={d}")
def test_float16_dbias_is_exact_across_levels_spills_and_isas(d, restore_settings):
    """float16 rows deposit dbias's terms (dy, a multiple of 2^-24) without
    the lowest level of the exact sums, whose remainders would all be 0
    (the record path, d = 40, and the column-chunked groups, d = 520; the
    short groups, d = 16, deposit every level, and their records left to
    the record path share the sums): the sums are still the exact sums
    rounded once, with terms of 2^13 and more (three levels) and the
    smallest subnormals, across the spills of the level sums (every 2048
    records), on every level; dweight keeps its bits as well."""
    from fractions import Fraction
    rng = np.random.default_rng(d)
    n = 4500
    x = rng.standard_normal((n, d)).astype(F16)
    dy = (rng.standard_normal((n, d)) * 10.0 ** rng.integers(-6, 4, (n, 1))).astype(F16)
    dy[3] = np.float16(6e-8)       # 2^-24, the smallest subnormal
    dy[10, : d // 2] = 60000.0     # terms on all three levels
    dy[11, : d // 2] = -59000.0
    from layernorm_c._backward import _backward_parts
    cols = (0, d // 2 - 1, d // 2, d - 1)
    exact = [sum(Fraction(float(t)) for t in dy[:, j].astype(np.float64)) for j in cols]
    want = None
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        g = lnc.layer_norm_backward(dy, x)
        # the sums' exact state, read to 53 bits: float32 results would
        # hide an error on the lowest level (its grid is 2^-86)
        _, acc_w, acc_b, _ = _backward_parts(dy, x, None, 1e-5, -1, None, None)
        b64 = acc_b.value(np.float64)
        for j, e in zip(cols, exact):
            assert b64[j] == _round_to_bits(e, 53), (isa, j)
            assert float(g.dbias[j]) == _round_to_bits(e, 24), (isa, j)
        if want is None:
            want = (g, acc_w.value(np.float64), b64)
        assert_same_bits(g.dweight, want[0].dweight, f"dweight ({isa})")
        assert_same_bits(g.dbias, want[0].dbias, f"dbias ({isa})")
        assert_same_bits(acc_w.value(np.float64), want[1], f"dweight to 53 bits ({isa})")
        assert_same_bits(b64, want[2], f"dbias to 53 bits ({isa})")


@pytest.mark.parametrize("d", [16, 40], ids=lambda d: f"d={d}")
def test_float16_dbias_spills_before_its_level_sums_overflow(d, restore_settings):
    """float16's dbias counts the level above the lowest alone, so that
    level's count decides its spills: 17000 terms of 8000 (just below the
    three-level bound, 2^49 units of level 1 each) overflow 63 bits
    without a spill every 2048 records."""
    from layernorm_c._backward import _backward_parts
    n = 17000
    x = np.random.default_rng(1).standard_normal((n, d)).astype(F16)
    dy = np.full((n, d), 0.5, F16)
    dy[:, 0] = 8000.0
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        _, _, acc_b, _ = _backward_parts(dy, x, None, 1e-5, -1, None, None)
        b64 = acc_b.value(np.float64)
        assert b64[0] == 8000.0 * n and b64[1] == 0.5 * n, isa


def test_exact_sums_read_a_state_at_any_address():
    """A state unpickled into a buffer at an odd offset (dask's workers
    hand such arrays over) is read word by word: the same sums, and no
    misaligned load (the sanitizer run's UBSan reported one once)."""
    from layernorm_c._backward import _backward_parts
    rng = np.random.default_rng(11)
    x = rng.standard_normal((37, 24)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    _, acc_w, acc_b, _ = _backward_parts(dy, x, np.ones(24, np.float32), 1e-5, -1, None,
                                         None)
    for acc in (acc_w, acc_b):
        raw = acc.state.tobytes()
        for offset in (1, 3, 4):
            buf = bytearray(offset) + raw
            odd = np.frombuffer(bytes(buf), np.uint64, offset=offset).reshape(acc.state.shape)
            assert not odd.flags.aligned
            moved = lnc.ExactSum(acc.shape, odd)
            assert moved.state.tobytes() == raw
            for dtype in (np.float32, np.float64):
                assert moved.value(dtype).tobytes() == acc.value(dtype).tobytes()
            both = (moved + moved).value()
            assert both.tobytes() == (acc + acc).value().tobytes()


def test_exact_sums_state_rounds_once_to_double_and_to_float():
    """The final rounding of the exact sums, on states made directly: level
    totals T0, T1, T2 (the sum is (T0 2^100 + T1 2^50 + T2) 2^-86) of every
    size the rounding paths see (T1 below and above 2^52, T2 above 2^50,
    T0 nonzero), with ties and near ties, both to double (53 bits) and to
    float (24)."""
    from fractions import Fraction
    from layernorm_c import _core
    rng = np.random.default_rng(4)
    rows = []
    for _ in range(3000):
        t0 = int(rng.choice([0, 0, 0, int(rng.integers(-2**20, 2**20))]))
        t1 = int(rng.integers(-2**62, 2**62)) >> int(rng.integers(0, 62))
        t2 = int(rng.integers(-2**62, 2**62)) >> int(rng.integers(0, 62))
        if rng.random() < 0.3:  # a tie at 24 or 53 bits: k, a one, then zeros
            p = int(rng.choice([24, 53]))
            k = int(rng.integers(2**(p - 1), 2**p))
            v = (2 * k + 1) << int(rng.integers(0, 60))
            v = -v if rng.random() < 0.5 else v
            t0, t1, t2 = 0, v >> 50, v & (2**50 - 1)
        elif rng.random() < 0.3:
            # near a tie at 24 bits: off it by less than a double's last
            # place, so that A + B rounded to double lands on the tie
            k = int(rng.integers(2**23, 2**24))
            s = int(rng.integers(30, 48))
            off = int(rng.integers(1, 2**(s - 29))) * int(rng.choice([-1, 1]))
            v = ((2 * k + 1) << s) + off
            v = -v if rng.random() < 0.5 else v
            t0, t1, t2 = 0, v >> 50, v & (2**50 - 1)
        rows.append((t0, t1, t2))
    # the ends of the 64-bit level totals, with small and large T1
    for t1 in (0, 1, -1, 2**51 - 1, -(2**51) + 1, 2**52, -(2**52)):
        for t2 in (-(2**63), -(2**63) + 1, 2**63 - 1, -(2**50), 2**50 - 1):
            rows.append((0, t1, t2))
    state = np.zeros((len(rows), 8), np.uint64)
    for i, ts in enumerate(rows):
        for l, t in enumerate(ts):
            state[i, 2 * l] = t & (2**64 - 1)
            state[i, 2 * l + 1] = (t >> 64) & (2**64 - 1)
    for bits, single in ((53, False), (24, True)):
        got = _core._acc_value(state, single)
        for i, (t0, t1, t2) in enumerate(rows):
            exact = Fraction(t0 * 2**100 + t1 * 2**50 + t2, 2**86)
            assert got[i] == _round_to_bits(exact, bits), (bits, t0, t1, t2, got[i])


def test_exact_sum_non_finite_terms():
    x = np.random.default_rng(0).standard_normal((5, 4))
    dy = np.ones_like(x)
    dy[2, 1] = np.inf
    dy[3, 2] = np.nan
    dy[0, 3], dy[1, 3] = np.inf, -np.inf
    g = lnc.layer_norm_backward(dy, x)
    assert g.dbias[0] == 5.0 and g.dbias[1] == np.inf
    assert np.isnan(g.dbias[2]) and np.isnan(g.dbias[3])
    # a non-finite dy makes its record's dx NaN (canonical)
    assert np.isnan(g.dx[2]).all() and np.isfinite(g.dx[4]).all()


def test_exact_sum_huge_terms():
    x = np.array([[0.0, 1.0], [0.0, 1.0]])
    dy = np.array([[1e30, 1.0], [-1e30, 2.0]])
    g = lnc.layer_norm_backward(dy, x)
    assert g.dbias[0] == 0.0 and g.dbias[1] == 3.0


@pytest.mark.parametrize("d", [768, 16385, 65536])
def test_sums_kept_between_calls_start_clean(d):
    """The module keeps a call's sums for the next call of the same d and
    clears only what a call used: after calls with NaN, infinite and huge
    terms, terms on the top level and the plain float64 baseline, a clean
    call gives the bits it gave before them."""
    from layernorm_c import _core
    rng = np.random.default_rng(d)
    x = rng.standard_normal((3, d)).astype(np.float32)
    dy = rng.standard_normal((3, d)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)

    def clean():
        return [*lnc.layer_norm_backward(dy, x, w), *lnc.rms_norm_backward(dy, x, w)]

    def same(got, want):
        for k, (g, e) in enumerate(zip(got, want)):
            assert_same_bits(g, e, what=f"result {k}")

    before = clean()
    dirty = []
    for value in (np.nan, np.inf, -np.inf, 1e30, 3e4):  # 3e4 * xhat: the top level
        bad = dy.copy()
        bad[1, ::7] = value
        dirty.append(bad)
    bad = dy.copy()
    bad[1, ::7], bad[2, ::7] = 2e19, -2e19  # huge sums of 0: what they held shows
    dirty.append(bad)
    def run(bad):
        return [*lnc.layer_norm_backward(bad, x, w), *lnc.rms_norm_backward(bad, x, w)]

    first = []
    for bad in dirty:
        first.append(run(bad))
        same(clean(), before)
    _core._backward(dy * 1e6, x, w, 1e-5, None, 2)  # plain sums, in the huge sums' place
    for bad, want in reversed(list(zip(dirty, first))):  # the huge sums first
        same(run(bad), want)
        same(clean(), before)

# ------------------------------------------------------------ errors, ufunc

def test_errors_name_the_argument():
    x = np.zeros((2, 4))
    with pytest.raises(ValueError, match=r"^dy: expected shape \(2, 4\) \(the shape of x\)"):
        lnc.layer_norm_backward(np.zeros((2, 3)), x)
    with pytest.raises(ValueError, match=r"^mean: expected shape \(2,\)"):
        lnc.layer_norm_backward(x, x, mean=np.zeros(3))
    with pytest.raises(ValueError, match=r"^var: expected shape \(2,\)"):
        lnc.layer_norm_backward(x, x, var=np.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"^weight: expected shape \(4,\)"):
        lnc.layer_norm_backward(x, x, np.ones(3))
    with pytest.raises(ValueError, match=r"^eps: expected a finite number >= 0"):
        lnc.layer_norm_backward(x, x, eps=-1.0)
    with pytest.raises(TypeError, match=r"^dy: expected a real array"):
        lnc.layer_norm_backward(x.astype(complex), x)
    with pytest.raises(TypeError, match=r"^x: expected array_like, got None"):
        lnc.layer_norm_backward(x, None)


def test_inputs_are_not_modified():
    x, dy, w = _batch(np.float32, n=20, d=50)
    copies = [a.copy() for a in (x, dy, w)]
    lnc.layer_norm_backward(dy, x, w)
    for a, c in zip((x, dy, w), copies):
        assert_same_bits(a, c)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_ufunc_gives_dx(dtype):
    x, dy, w = _batch(dtype, n=30, d=70)
    want = lnc.layer_norm_backward(dy, x, w).dx
    got = lnc.layer_norm_backward_ufunc(dy, x, w, 1e-5)
    assert_same_bits(got, want)
    assert_same_bits(lnc.layer_norm_backward_ufunc(dy.T, x.T, w, 1e-5, axes=[0, 0, 0, (), 0]),
                     want.T)


@pytest.mark.parametrize("d", [8, 12, 16, 32, 70], ids=lambda d: f"d={d}")
@pytest.mark.parametrize("ufunc", ["layer_norm_backward_ufunc", "rms_norm_backward_ufunc"])
def test_ufunc_writing_dx_over_its_inputs(ufunc, d, restore_settings):
    """dx written over dy or over x, whole or through an overlapping view
    one row along: the result of copies, at every level (the short
    records' loops read a record's rows in place while writing dx)."""
    fn = getattr(lnc, ufunc)
    x, dy, w = _batch(F32, n=37, d=d)
    want = fn(dy.copy(), x.copy(), w, 1e-5)
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        for target in ("dy", "x"):
            a, b = dy.copy(), x.copy()
            out = a if target == "dy" else b
            fn(a, b, w, 1e-5, out=out)
            assert_same_bits(out, want, f"dx over {target} ({isa})")
            src = dy if target == "dy" else x
            buf = np.concatenate([np.zeros_like(src[:1]), src])  # buf[1:] is src
            a, b = (buf[1:], x.copy()) if target == "dy" else (dy.copy(), buf[1:])
            fn(a, b, w, 1e-5, out=buf[:-1])
            assert_same_bits(buf[:-1], want, f"dx over {target}, one row along ({isa})")


@pytest.mark.parametrize("dtype", _backward_dtypes(), ids=str)
def test_every_short_width_matches_scalar(dtype, restore_settings):
    """Every record width the short groups take (d up to 32, and up to 64
    where the level has its own loops for them), in groups of 16 and a
    tail of 5: every level gives the scalar level's bits for dx, dweight
    and dbias of LayerNorm (with and without the forward's mean) and of
    RMSNorm (float32 rows of 8, 16, 32 and 64 features are read in place,
    the others through float copies)."""
    rng = np.random.default_rng(31)
    for d in range(1, 2 * LANES + 2):
        x = (rng.standard_normal((37, d)) * 2 + 5).astype(dtype)
        dy = rng.standard_normal((37, d)).astype(dtype)
        w = rng.uniform(0.5, 2, d).astype(dtype)
        _assert_levels_match_scalar(dy, x, w, f"{dtype}, d={d}")


@pytest.mark.parametrize("axis", [0, 1, (1, 2), (0, 2)])
def test_axes(axis):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 4, 5))
    dy = rng.standard_normal(x.shape)
    axes = (axis,) if np.ndim(axis) == 0 else axis
    w = rng.uniform(0.5, 2, tuple(x.shape[a] for a in axes))
    g = lnc.layer_norm_backward(dy, x, w, axis=axis)
    dx, dw, db = ref_backward(dy, x, w, axis=axis)
    np.testing.assert_allclose(g.dx, dx, atol=1e-12)
    np.testing.assert_allclose(g.dweight, dw, atol=1e-12)
    np.testing.assert_allclose(g.dbias, db, atol=1e-12)


def test_mixed_dtypes_promote():
    x, dy, w = _batch(np.float32, n=10, d=20)
    g = lnc.layer_norm_backward(dy, x, w.astype(np.float64))
    assert g.dx.dtype == np.float64 and g.dweight.dtype == np.float64
    want = lnc.layer_norm_backward(dy.astype(np.float64), x.astype(np.float64),
                                   w.astype(np.float64))
    assert_same_bits(g.dx, want.dx)


@pytest.mark.parametrize("d", [16, 100, 768], ids=lambda d: f"d={d}")
def test_the_benchmarks_plain_baseline_sums_what_the_exact_sums_do(d, restore_settings):
    """The private baseline of the benchmark's sums-cost table (plain
    float64 sums in record order, _core._backward(..., sums=2)) sums the
    same terms as the exact sums at every level: dweight and dbias of
    LayerNorm, and RMSNorm's dweight (its lane loops had left it at 0)."""
    from layernorm_c import _core
    rng = np.random.default_rng(47)
    x = (rng.standard_normal((64, d)) + 2).astype(F32)
    dy = rng.standard_normal((64, d)).astype(F32)
    w = rng.uniform(0.5, 2, d).astype(F32)
    want = {False: lnc.layer_norm_backward(dy, x, w), True: lnc.rms_norm_backward(dy, x, w)}

    def plain(state):  # the last word of a feature's state: its plain sum
        return np.asarray(state).reshape(d, -1)[:, -1].view(np.float64)

    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        for rms, g in want.items():
            eps = 1e-6 if rms else 1e-5
            dx, sw, sb = _core._backward(dy, x, w, eps, None, 2, rms)
            what = f"{'rms' if rms else 'ln'} ({isa})"
            assert_same_bits(dx, g.dx, f"dx of {what}")
            np.testing.assert_allclose(plain(sw), g.dweight, rtol=0, atol=1e-6 * 64, err_msg=what)
            if not rms:
                np.testing.assert_allclose(plain(sb), g.dbias, rtol=0, atol=1e-6 * 64,
                                           err_msg=what)
