"""xarray DataArrays: DataArray in, DataArray out (dims, coords, attrs and
name kept), axes named by dimension, dask-backed arrays kept lazy."""
import numpy as np
import pytest

import layernorm_c as lnc

xr = pytest.importorskip("xarray")

RNG = np.random.default_rng(7)
DATA = (RNG.standard_normal((6, 5, 16)) * 2 + 40).astype(np.float32)
DX = RNG.standard_normal(DATA.shape).astype(np.float32)
WV = RNG.standard_normal(5).astype(np.float32)


def _x():
    return xr.DataArray(DATA, dims=("batch", "feature", "time"),
                        coords={"batch": np.arange(6), "feature": list("abcde"),
                                "time": np.arange(16) * 0.5,
                                "site": ("batch", list("uvwxyz"))},
                        attrs={"units": "K", "source": "test"}, name="temperature")


def _bits(a):
    return np.asarray(a).tobytes()


def test_dataarray_in_dataarray_out():
    x = _x()
    w = xr.DataArray(WV, dims=("feature",))
    r = lnc.layer_norm(x, w, axis="feature", return_stats=True)
    want = lnc.layer_norm(DATA, WV, axis=1, return_stats=True)
    assert isinstance(r.y, xr.DataArray)
    assert r.y.dims == x.dims and r.y.attrs == x.attrs and r.y.name == "temperature"
    assert set(r.y.coords) == set(x.coords)
    assert r.mean.dims == ("batch", "time") and r.var.dims == ("batch", "time")
    assert set(r.mean.coords) == {"batch", "time", "site"}
    for got, exp in zip(r, want):
        assert _bits(got.values) == _bits(exp)


def test_axis_names_tuple_and_ints():
    x = _x()
    a = lnc.layer_norm(x, axis=("time", "feature"))
    b = lnc.layer_norm(x, axis=(1, 2))
    assert _bits(a.values) == _bits(b.values) == _bits(lnc.layer_norm(DATA, axis=(1, 2)))
    with pytest.raises(ValueError, match="axis: 'height' is not a dimension"):
        lnc.layer_norm(x, axis="height")


def test_weight_dims_are_matched_by_name():
    x = _x()
    w2 = RNG.standard_normal((16, 5)).astype(np.float32)
    w = xr.DataArray(w2, dims=("time", "feature"))  # the other order
    got = lnc.layer_norm(x, w, axis=("feature", "time"))
    assert _bits(got.values) == _bits(lnc.layer_norm(DATA, w2.T, axis=(1, 2)))
    with pytest.raises(ValueError, match="weight: expected dimensions among"):
        lnc.layer_norm(x, xr.DataArray(WV, dims=("batch2",)), axis="feature")


def test_dask_backed_dataarray_stays_lazy():
    da = pytest.importorskip("dask.array")
    x = _x().chunk({"batch": 2, "time": 5})
    r = lnc.rms_norm(x, axis="feature", return_stats=True)
    assert isinstance(r.y.data, da.Array) and isinstance(r.ms.data, da.Array)
    want = lnc.rms_norm(DATA, axis=1, return_stats=True)
    assert _bits(r.y.values) == _bits(want.y) and _bits(r.ms.values) == _bits(want.ms)


def test_backward():
    x = _x()
    dy = x.copy(data=DX).transpose("time", "batch", "feature")  # dims in another order
    w = xr.DataArray(WV, dims=("feature",))
    mean = lnc.layer_norm(x, axis="feature", return_stats=True).mean
    g = lnc.layer_norm_backward(dy, x, w, axis="feature", mean=mean)
    want = lnc.layer_norm_backward(DX, DATA, WV, axis=1)
    assert g.dx.dims == x.dims and g.dweight.dims == ("feature",)
    assert list(g.dweight.coords["feature"].values) == list("abcde")
    for got, exp in zip(g, want):
        assert _bits(got.values) == _bits(exp)
    r = lnc.rms_norm_backward(dy, x.chunk({"batch": 3}), w, axis="feature")
    assert _bits(r.dweight.values) == _bits(lnc.rms_norm_backward(DX, DATA, WV, axis=1).dweight)
