"""The C fast path of layer_norm_backward and rms_norm_backward (last axis,
C-contiguous arrays; the sums rounded in C) against their general path
(axis given as a tuple, which the fast path never takes): the same bits,
the same dtypes and shapes, and the same errors for what it declines."""
import numpy as np
import pytest

import layernorm_c as lnc
from layernorm_c import _backward, _core
from cases import F16, F32, F64, FLOAT_DTYPES
from core_strategies import assert_same_bits

SHAPES = [(7,), (5, 1), (3, 4, 33), (0, 8), (64, 768), (2, 1000)]


def _inputs(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 50).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    w = rng.uniform(0.5, 2.0, shape[-1]).astype(dtype)
    return dy, x, w


def _same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert u.dtype == v.dtype and u.shape == v.shape
        assert_same_bits(u, v)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("with_weight", [False, True])
def test_layer_norm_backward_fast_path_matches_general_path(shape, dtype, with_weight):
    dy, x, w = _inputs(shape, dtype)
    w = w if with_weight else None
    fast = _core._fast_backward(dy, x, w, 1e-5, None, False)
    assert fast is not NotImplemented
    _same(lnc.layer_norm_backward(dy, x, w), fast)
    _same(lnc.layer_norm_backward(dy, x, w, axis=(-1,)), fast)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_given_mean_fast_and_general_agree(dtype):
    dy, x, w = _inputs((6, 5, 40), dtype)
    r = lnc.layer_norm(x, w, return_stats=True)
    fast = lnc.layer_norm_backward(dy, x, w, mean=r.mean)
    _same(fast, lnc.layer_norm_backward(dy, x, w, axis=(-1,), mean=r.mean))
    _same(fast, lnc.layer_norm_backward(dy, x, w))


@pytest.mark.parametrize("keep", [False, True])
def test_given_mean_and_var_take_the_fast_path(keep, monkeypatch):
    # Both statistics as return_stats gives them (var only checked) must not
    # send the call down the general path: it cost 2.4x at (64, 768).
    dy, x, w = _inputs((6, 5, 40), F32)
    r = lnc.layer_norm(x, w, return_stats=True)
    mean, var = (r.mean[..., None], r.var[..., None]) if keep else (r.mean, r.var)
    expected = lnc.layer_norm_backward(dy, x, w)
    if not keep:  # the C entry takes the mean without its kept axis only
        def general(*args, **kwargs):
            raise AssertionError("the general path was taken")
        monkeypatch.setattr(_backward, "_backward_parts", general)
    _same(lnc.layer_norm_backward(dy, x, w, mean=mean, var=var), expected)
    monkeypatch.undo()
    for bad in (var[:2], var.astype(np.complex64), np.full(x.shape, 1.0, F32)):
        with pytest.raises((ValueError, TypeError), match="var"):
            lnc.layer_norm_backward(dy, x, w, mean=mean, var=bad)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_rms_norm_backward_fast_path_matches_general_path(shape, dtype):
    dy, x, w = _inputs(shape, dtype)
    fast = _core._fast_backward(dy, x, w, 1e-6, None, True)
    assert fast is not NotImplemented
    _same(lnc.rms_norm_backward(dy, x, w), fast)
    _same(lnc.rms_norm_backward(dy, x, w, axis=(-1,)), fast)
    ms = lnc.rms_norm(x, w, return_stats=True).ms
    _same(lnc.rms_norm_backward(dy, x, w, ms=ms), fast)


def test_mixed_dtypes_and_strided_weight():
    dy, x, w = _inputs((9, 48), F32)
    wide = np.repeat(w.astype(F64), 2)[::2]  # float64, strided
    got = lnc.layer_norm_backward(dy, x, wide)
    _same(got, lnc.layer_norm_backward(dy, x, wide, axis=(-1,)))
    assert got.dx.dtype == F64 and got.dweight.dtype == F64
    half = lnc.layer_norm_backward(dy.astype(F16), x, None)
    assert half.dx.dtype == F32 and half.dweight.dtype == F32
    _same(half, lnc.layer_norm_backward(dy.astype(F16), x, None, axis=(-1,)))


def test_declined_cases_go_to_the_general_path():
    dy, x, w = _inputs((4, 16), F32)
    decline = [
        (dy.T.copy().T, x, w, 1e-5, None, False),          # Fortran dy
        (dy, x[:, ::2], w[:8], 1e-5, None, False),         # strided x (shape mismatch too)
        (dy, x, w, 1e-5, np.zeros((4, 1), F32), False),    # mean keeping the axis
        (dy, x, w, np.float32(1e-5), None, False),         # eps not a Python float
        (dy, x, w, -1.0, None, False),                     # invalid eps
        (dy, x, w, float("nan"), None, False),
        (dy.astype(">f4"), x, w, 1e-5, None, False),       # byte-swapped
        (dy[:3], x, w, 1e-5, None, False),                 # shapes differ
        (dy, x, w, 1e-5, None, 1),                         # rms not a bool
    ]
    for args in decline:
        assert _core._fast_backward(*args) is NotImplemented


def test_errors_still_raise_through_the_general_path():
    dy, x, w = _inputs((4, 16), F32)
    with pytest.raises(ValueError, match="eps"):
        lnc.layer_norm_backward(dy, x, w, eps=-1.0)
    with pytest.raises(ValueError, match="dy"):
        lnc.layer_norm_backward(dy[:3], x, w)
    with pytest.raises(ValueError, match="mean"):
        lnc.layer_norm_backward(dy, x, w, mean=np.zeros(3, F32))
    with pytest.raises(ValueError, match="ms"):
        lnc.rms_norm_backward(dy, x, w, ms=np.zeros(3, F32))
    with pytest.raises(ValueError, match="weight"):
        lnc.rms_norm_backward(dy, x, w[:5])


def test_threads_give_the_same_bits(restore_settings):
    dy, x, w = _inputs((300, 64), F32)
    lnc.set_num_threads(1)
    one = lnc.layer_norm_backward(dy, x, w)
    lnc.set_num_threads(2)
    _same(one, lnc.layer_norm_backward(dy, x, w))


def _layer_pair(dtype, gain, bias, d):
    """Two LayerNorm layers with the same parameters (not all ones)."""
    layers = [lnc.LayerNorm(d, gain=gain, bias=bias, dtype=dtype) for _ in range(2)]
    rng = np.random.default_rng(3)
    w = rng.uniform(0.5, 2.0, d).astype(dtype)
    for layer in layers:
        if layer.weight is not None:
            layer.weight = w.copy()
    return layers


@pytest.mark.parametrize("shape", [(7,), (1, 768), (3, 4, 33), (0, 8), (64, 768)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("gain", [False, True])
def test_layer_backward_fast_route_matches_the_general_path(shape, dtype, gain, monkeypatch):
    # The layer's backward goes straight to the kernels for a dy like its
    # saved x (_layer_backward_rows); with that route turned off it takes
    # _backward_parts. The same dx and the same accumulated gradients, over
    # two micro-batches (the second merges into the first's sums).
    from layernorm_c import _layer
    dy, x, _ = _inputs(shape, dtype)
    dy2, x2, _ = _inputs(shape, dtype, seed=1)
    fast, general = _layer_pair(dtype, gain, True, shape[-1])
    taken = []

    def counted(*args):
        res = real(*args)
        taken.append(res is not None)
        return res

    real = _layer._layer_backward_rows
    results = []
    for layer, route in ((fast, counted), (general, lambda *a: None)):
        monkeypatch.setattr(_layer, "_layer_backward_rows", route)
        out = []
        for xi, dyi in ((x, dy), (x2, dy2)):
            layer(xi)
            out.append(layer.backward(dyi))
        results.append(out + [layer.grad_bias] + ([layer.grad_weight] if gain else []))
    assert taken == [True, True]
    _same(results[0], results[1])


def test_layer_backward_fast_route_declines_what_it_does_not_take():
    # dy of another dtype, layout, byte order or type, or a layer of two
    # normalized axes: the general path, which promotes, reorders, checks.
    from layernorm_c._backward import _layer_backward_rows
    dy, x, w = _inputs((4, 16), F32)
    assert _layer_backward_rows(dy, x, w, 1e-5, None) is not None
    for bad_dy in (dy.astype(F64), np.asfortranarray(dy), dy.astype(">f4"), dy.tolist(),
                   dy[:, :8], dy.reshape(2, 32)):
        assert _layer_backward_rows(bad_dy, x, w, 1e-5, None) is None
    assert _layer_backward_rows(dy, x, w.astype(F64), 1e-5, None) is None
    assert _layer_backward_rows(dy, x, w[:8], 1e-5, None) is None
    assert _layer_backward_rows(dy, x, w, 1e-5, np.zeros(3, F32)) is None
    layer = lnc.LayerNorm((4, 16))
    layer(x)
    g = lnc.layer_norm_backward(dy, x, layer.weight, axis=(-2, -1))
    assert_same_bits(layer.backward(dy), g.dx)
    # a float32 layer given float64 dy: promoted as layer_norm_backward does
    layer = lnc.LayerNorm(16)
    layer(x)
    dx = layer.backward(dy.astype(F64))
    assert dx.dtype == F64
    assert_same_bits(dx, lnc.layer_norm_backward(dy.astype(F64), x, layer.weight).dx)
