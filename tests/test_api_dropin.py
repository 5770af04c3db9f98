"""layer_norm as a drop-in for the hand-written NumPy helper of transformer
prototypes: parameters broadcast like NumPy broadcasts them, dtypes promote
like ``g * xhat + b`` promotes them, and the output keeps x's memory order."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import layernorm_c as lnc
from cases import F64, FLOAT_DTYPES, Y_TOL
from core_strategies import assert_same_bits


def numpy_layer_norm(x, g, b, eps=1e-5, axis=-1):
    """The helper found in NumPy GPT-2 prototypes (keepdims statistics)."""
    mean = np.mean(x, axis=axis, keepdims=True)
    var = np.var(x, axis=axis, keepdims=True)
    return g * (x - mean) / np.sqrt(var + eps) + b


X = np.random.default_rng(0).standard_normal((3, 5, 8))


@pytest.mark.parametrize("shape", [(), (1,), (8,), (1, 8), (1, 1, 8), (1, 1, 1)])
def test_parameters_broadcast_like_numpy(shape):
    rng = np.random.default_rng(1)
    g = rng.uniform(0.5, 2, shape) if shape else 1.7
    b = rng.uniform(-1, 1, shape) if shape else -0.25
    got = lnc.layer_norm(X, g, b)
    np.testing.assert_allclose(got, numpy_layer_norm(X, g, b), rtol=Y_TOL[F64],
                               atol=Y_TOL[F64])
    # ... and bit for bit what the explicit (d,)-shaped parameters give
    full_g = np.broadcast_to(np.asarray(g, np.float64).reshape(-1)[-1:] if np.ndim(g) and
                             np.shape(g)[-1] == 1 else np.asarray(g).reshape(-1)[-8:], (8,))
    full_b = np.broadcast_to(np.asarray(b, np.float64).reshape(-1)[-1:] if np.ndim(b) and
                             np.shape(b)[-1] == 1 else np.asarray(b).reshape(-1)[-8:], (8,))
    assert_same_bits(got, lnc.layer_norm(X, np.ascontiguousarray(full_g),
                                         np.ascontiguousarray(full_b)))


def test_keepdims_parameters_for_a_middle_axis():
    x = np.moveaxis(X, -1, 1)             # (3, 8, 5), normalized over axis 1
    g = np.linspace(0.5, 1.5, 8).reshape(1, 8, 1)
    b = np.linspace(-1, 1, 8).reshape(1, 8, 1)
    got = lnc.layer_norm(x, g, b, axis=1)
    np.testing.assert_allclose(got, numpy_layer_norm(x, g, b, axis=1), rtol=Y_TOL[F64],
                               atol=Y_TOL[F64])
    assert_same_bits(got, lnc.layer_norm(x, g.ravel(), b.ravel(), axis=1))


@pytest.mark.parametrize("shape", [(2, 8), (5, 8), (3, 5, 8), (8, 1), (1, 5, 8)])
def test_per_record_parameter_shapes_are_refused(shape):
    """A shape that would broadcast over records (or change the output's
    shape) is not a per-feature parameter."""
    with pytest.raises(ValueError, match=r"^weight: expected shape \(8,\)"):
        lnc.layer_norm(X, np.ones(shape))


@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=str)
def test_python_scalar_parameters_are_weak(x_dtype):
    """g * xhat + b with Python scalars keeps x's dtype (NumPy 2 rules)."""
    x = X.astype(x_dtype)
    assert lnc.layer_norm(x, 2.0, 1).dtype == x_dtype
    assert lnc.layer_norm(x, np.float64(2.0)).dtype == np.result_type(x_dtype, np.float64)


@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("p_dtype", FLOAT_DTYPES, ids=str)
def test_mixed_dtypes_promote_and_equal_the_widened_call(x_dtype, p_dtype):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((64, 48)) * 3 + 2).astype(x_dtype)
    w = rng.uniform(0.5, 2, 48).astype(p_dtype)
    b = rng.uniform(-1, 1, 48).astype(p_dtype)
    dtype = np.result_type(x_dtype, p_dtype)
    got = lnc.layer_norm(x, w, b, return_stats=True)
    assert got.y.dtype == dtype
    want = lnc.layer_norm(x.astype(dtype), w.astype(dtype), b.astype(dtype), return_stats=True)
    for g, wnt, name in zip(got, want, ("y", "mean", "var")):
        assert_same_bits(g, wnt, name)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_output_keeps_fortran_order(dtype):
    x = np.asfortranarray(X.reshape(15, 8).astype(dtype))
    y = lnc.layer_norm(x, np.ones(8, dtype), np.zeros(8, dtype))
    assert y.flags.f_contiguous and not y.flags.c_contiguous
    assert_same_bits(y, lnc.layer_norm(np.ascontiguousarray(x), np.ones(8, dtype),
                                       np.zeros(8, dtype)))


@given(st.permutations(range(3)), st.sampled_from([0, 1, 2, -1]))
def test_output_keeps_any_axis_order(perm, axis):
    """Like np.empty_like: a transposed x gives a y with the same strides
    order, whichever axis is normalized."""
    x = np.ascontiguousarray(X).transpose(perm)
    y = lnc.layer_norm(x, axis=axis)
    assert np.argsort(y.strides).tolist() == np.argsort(x.strides).tolist()
    want = lnc.layer_norm(np.ascontiguousarray(x), axis=axis)
    assert_same_bits(y, want)


@pytest.mark.parametrize("name", ["dask.array", "xarray"])
def test_a_lazy_library_still_being_imported_is_not_consulted(name, monkeypatch):
    """A dask worker may run a task while another of its threads is still
    importing dask.array (or xarray): the module is in sys.modules without
    its classes yet. NumPy arguments are then simply not lazy ones.
    (Regression: AttributeError "partially initialized module 'dask.array'
    has no attribute 'Array'" in a LocalCluster of processes.)"""
    import sys
    import types

    monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    x = np.arange(8.0).reshape(2, 4)
    y = lnc.layer_norm(x, axis=(1,))  # a tuple axis: the general path, which asks
    monkeypatch.undo()
    assert_same_bits(y, lnc.layer_norm(x))
