"""The raw generalized ufunc layer_norm_ufunc: (n),(n),(n),()->(n)."""
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import layernorm_c as lnc
from cases import F16, FLOAT_DTYPES
from core_strategies import assert_same_bits, finite_values, problems

uf = lnc.layer_norm_ufunc


def test_ufunc_identity():
    assert isinstance(uf, np.ufunc)
    assert uf.signature == "(n),(n),(n),()->(n)"
    assert (uf.nin, uf.nout) == (4, 1)
    assert {"eeed->e", "fffd->f", "dddd->d"} <= set(uf.types)


@given(problems(max_dims=3, mixed_dtypes=False))
def test_matches_layer_norm(p):
    """Same bits as layer_norm over the last axis with both parameters given."""
    d = p.x.shape[-1]
    w = np.linspace(-2, 2, d).astype(p.x.dtype)
    b = np.linspace(1, -1, d).astype(p.x.dtype)
    y = uf(p.x, w, b, p.eps)
    assert y.dtype == p.x.dtype
    assert_same_bits(y, lnc.layer_norm(p.x, w, b, p.eps))


@given(dtype=st.sampled_from(FLOAT_DTYPES),
       shapes=hnp.mutually_broadcastable_shapes(signature=uf.signature, max_dims=3,
                                                max_side=5),
       data=st.data())
def test_broadcasting_is_per_record_layer_norm(dtype, shapes, data):
    """Broadcast x, weight, bias and eps: each output record is layer_norm of
    its own x record with its own weight, bias and eps."""
    x_s, w_s, b_s, e_s = shapes.input_shapes
    x = data.draw(hnp.arrays(dtype, x_s, elements=finite_values(dtype)), "x")
    w = data.draw(hnp.arrays(dtype, w_s, elements=finite_values(dtype, 8.0)), "w")
    b = data.draw(hnp.arrays(dtype, b_s, elements=finite_values(dtype, 8.0)), "b")
    eps = data.draw(hnp.arrays(np.float64, e_s, elements=st.floats(1e-12, 1.0)), "eps")
    y = uf(x, w, b, eps)
    assert y.shape == shapes.result_shape and y.dtype == dtype

    lead = shapes.result_shape[:-1]
    n = shapes.result_shape[-1]
    xs, ws, bs = (np.broadcast_to(a, lead + (n,)) for a in (x, w, b))
    es = np.broadcast_to(eps, lead)
    for i in np.ndindex(*lead):
        assert_same_bits(y[i], lnc.layer_norm(xs[i], ws[i], bs[i], es[i]), f"record {i}")


def test_per_batch_weights():
    """(B, 1, d) weights: each batch item b uses its own gain."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 5, 16)).astype(np.float32)
    w = rng.normal(size=(3, 1, 16)).astype(np.float32)
    b = np.zeros(16, np.float32)
    y = uf(x, w, b, 1e-5)
    for i in range(3):
        assert_same_bits(y[i], lnc.layer_norm(x[i], w[i, 0], b))


def test_per_record_eps_array():
    x = np.tile(np.array([1.0, 2.0, 3.0, 4.0]), (3, 1))
    eps = np.array([0.0, 1e-5, 1.0])
    y = uf(x, np.ones(4), np.zeros(4), eps)
    for i, e in enumerate(eps):
        assert_same_bits(y[i], lnc.layer_norm(x[i], eps=e))
    assert not np.array_equal(y[0], y[2])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_invalid_eps_gives_nan_records_and_invalid_flag(dtype):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 8)).astype(dtype)
    one, zero = np.ones(8, dtype), np.zeros(8, dtype)
    eps = np.array([1e-5, -1.0, np.nan, np.inf, 1e-3])
    with pytest.warns(RuntimeWarning, match="invalid value"):
        y = uf(x, one, zero, eps)
    assert np.all(np.isnan(y[1:4]))
    for i in (0, 4):
        assert_same_bits(y[i], lnc.layer_norm(x[i], eps=eps[i]))
    with np.errstate(invalid="raise"), pytest.raises(FloatingPointError):
        uf(x, one, zero, -1.0)
    # A valid eps raises no warning at all.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        uf(x, one, zero, 1e-5)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_out_argument(dtype):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(4, 6)).astype(dtype)
    w, b = np.ones(6, dtype), np.zeros(6, dtype)
    want = uf(x, w, b, 1e-5)
    out = np.empty_like(x)
    assert uf(x, w, b, 1e-5, out=out) is out
    assert_same_bits(out, want)
    strided = np.zeros((4, 12), dtype)[:, ::2]
    uf(x, w, b, 1e-5, out=(strided,))
    assert_same_bits(strided, want)
    inplace = x.copy()
    uf(inplace, w, b, 1e-5, out=inplace)
    assert_same_bits(inplace, want)


def test_axes_argument():
    """axes=[(0,), (0,), (0,), (), (0,)]: records along axis 0."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(7, 5))
    w, b = rng.normal(size=7), rng.normal(size=7)
    y = uf(x, w, b, 1e-5, axes=[(0,), (0,), (0,), (), (0,)])
    assert y.shape == (7, 5)
    assert_same_bits(y, lnc.layer_norm(x, w, b, axis=0))
    assert_same_bits(y, uf(x.T, w, b, 1e-5).T)


def test_dtype_resolution():
    x16 = np.arange(4, dtype=np.float16)
    assert uf(x16, x16, x16, 1e-5).dtype == F16
    # Mixed or integer operands take the float64 loop.
    assert uf(x16, np.ones(4), np.zeros(4), 1e-5).dtype == np.float64
    assert uf(np.arange(4), np.ones(4, int), np.zeros(4, int), 0).dtype == np.float64


def test_core_dimension_mismatch_is_an_error():
    with pytest.raises(ValueError):
        uf(np.ones((2, 4)), np.ones(5), np.ones(4), 1e-5)
    with pytest.raises(ValueError):
        uf(np.ones((2, 4)), np.ones(4), np.ones(4), np.ones(4))   # eps must be per record


class Recorder:
    """Takes over any ufunc call it takes part in and records it."""

    def __init__(self):
        self.calls = []

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        self.calls.append((ufunc, method, inputs, kwargs))
        return "handled"


@pytest.mark.parametrize("position", range(4))
def test_array_ufunc_dispatch(position):
    rec = Recorder()
    args = [np.ones((2, 3)), np.ones(3), np.zeros(3), 1e-5]
    args[position] = rec
    assert uf(*args, axes=[(-1,), (-1,), (-1,), (), (-1,)]) == "handled"
    assert len(rec.calls) == 1
    ufunc, method, inputs, kwargs = rec.calls[0]
    assert ufunc is uf and method == "__call__"
    assert inputs[position] is rec and len(inputs) == 4
    assert kwargs == {"axes": [(-1,), (-1,), (-1,), (), (-1,)]}


def test_private_stats_gufuncs_on_empty_records():
    """Records of no features have no mean: the private gufuncs that return
    statistics give NaN for them (regression: they were left unwritten)."""
    from layernorm_c import _core
    for dtype in (np.float32, np.float64):
        x = np.zeros((3, 0), dtype)
        y, mean, var = _core._ln_none(x, 1e-5)
        assert y.shape == (3, 0)
        assert np.isnan(mean).all() and np.isnan(var).all()
        y, ms = _core._rms_none(x, 1e-5)
        assert np.isnan(ms).all()
