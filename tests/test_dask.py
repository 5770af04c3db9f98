"""dask arrays through layer_norm, rms_norm and their backward functions:
lazy, and bit-identical to the in-memory call for every chunking and
scheduler, the parameter gradients included."""

import numpy as np
import pytest

import layernorm_c as lnc

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")


def _bits(a):
    return np.asarray(a).tobytes()


def _same(lazy, eager):
    assert len(lazy) == len(eager)
    for got, want in zip(lazy, eager):
        got = np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert _bits(got) == _bits(want)


RNG = np.random.default_rng(1234)
X = (RNG.standard_normal((240, 3, 40)) * 3 + 500).astype(np.float32)
DY = RNG.standard_normal(X.shape).astype(np.float32)
W = RNG.standard_normal(40).astype(np.float32)
B = RNG.standard_normal(40).astype(np.float32)

CHUNKS = [(240, 3, 40), (17, 3, 40), (1, 1, 40), (50, 2, 7), (99, 1, 13)]


@pytest.mark.parametrize("chunks", CHUNKS)
def test_layer_norm_is_lazy_and_bit_identical(chunks):
    xd = da.from_array(X, chunks=chunks)
    res = lnc.layer_norm(xd, W, B, return_stats=True)
    assert all(isinstance(a, da.Array) for a in res)  # lazy: see the next test
    assert res.y.chunks[2] == (40,) and res.mean.shape == (240, 3)
    _same(dask.compute(*res, scheduler="threads"), lnc.layer_norm(X, W, B, return_stats=True))


def test_nothing_is_computed_when_the_graph_is_built(monkeypatch):
    from layernorm_c import _lazy

    calls = []
    real = _lazy._forward_block
    monkeypatch.setattr(_lazy, "_forward_block", lambda *a: calls.append(1) or real(*a))
    y = lnc.layer_norm(da.from_array(X, chunks=(30, 3, 40)), W, B)
    assert calls == []
    y.compute(scheduler="sync")
    assert len(calls) == 8


@pytest.mark.parametrize("axis", [(0, 2), 1, (1, 2)])
def test_several_and_middle_axes(axis):
    xd = da.from_array(X, chunks=(37, 2, 11))
    _same(dask.compute(*lnc.layer_norm(xd, axis=axis, return_stats=True)),
          lnc.layer_norm(X, axis=axis, return_stats=True))


def test_parameters_as_dask_arrays_scalars_and_broadcast_shapes():
    xd = da.from_array(X, chunks=(60, 3, 20))
    got = lnc.layer_norm(xd, da.from_array(W, chunks=7), da.from_array(B[None, :]))
    assert _bits(got.compute()) == _bits(lnc.layer_norm(X, W, B[None, :]))
    got = lnc.layer_norm(xd, 2.0, np.float64(0.5))
    assert _bits(got.compute()) == _bits(lnc.layer_norm(X, 2.0, np.float64(0.5)))
    got = lnc.layer_norm(X, da.from_array(W))  # x in NumPy, weight lazy: lazy
    assert isinstance(got, da.Array) and _bits(got.compute()) == _bits(lnc.layer_norm(X, W))


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32])
def test_dtypes(dtype):
    x = (X[:50] * (1 if dtype != np.int32 else 10)).astype(dtype)
    xd = da.from_array(x, chunks=(7, 3, 40))
    res = lnc.layer_norm(xd, W, return_stats=True)
    assert res.y.dtype == lnc.layer_norm(x, W).dtype
    _same(dask.compute(*res), lnc.layer_norm(x, W, return_stats=True))


@pytest.mark.parametrize("chunks", CHUNKS)
def test_backward_including_parameter_gradients(chunks):
    xd = da.from_array(X, chunks=chunks)
    dyd = da.from_array(DY, chunks=(13, 3, 40))  # other chunks than x's
    g = lnc.layer_norm_backward(dyd, xd, W)
    assert all(isinstance(a, da.Array) for a in g)
    assert g.dweight.shape == (40,) and g.dweight.dtype == np.float32
    _same(dask.compute(*g), lnc.layer_norm_backward(DY, X, W))


def test_parameter_gradients_are_merged_exactly_not_summed():
    """The test can fail: summing the blocks' rounded sums (the obvious
    merge) gives other bits for this chunking."""
    chunks = (1, 1, 40)
    blocks = [lnc.layer_norm_backward(DY[i:i + 1, j:j + 1], X[i:i + 1, j:j + 1], W).dweight
              for i in range(X.shape[0]) for j in range(X.shape[1])]
    naive = np.sum(np.array(blocks, np.float64), axis=0).astype(np.float32)
    exact = lnc.layer_norm_backward(DY, X, W).dweight
    assert _bits(naive) != _bits(exact)
    got = lnc.layer_norm_backward(da.from_array(DY, chunks=chunks),
                                  da.from_array(X, chunks=chunks), W).dweight.compute()
    assert _bits(got) == _bits(exact)


def test_backward_with_mean_and_several_axes():
    res = lnc.layer_norm(X, W, return_stats=True, axis=(1, 2))
    w2 = np.broadcast_to(W, (3, 40))
    g = lnc.layer_norm_backward(da.from_array(DY, chunks=(31, 3, 40)),
                                da.from_array(X, chunks=(50, 1, 40)), w2, axis=(1, 2),
                                mean=da.from_array(res.mean, chunks=20), var=res.var)
    _same(dask.compute(*g), lnc.layer_norm_backward(DY, X, w2, axis=(1, 2), mean=res.mean))


@pytest.mark.parametrize("convention", ["weight", "1+weight"])
def test_rms_norm_forward_and_backward(convention):
    xd = da.from_array(X, chunks=(23, 2, 40))
    res = lnc.rms_norm(xd, W, return_stats=True, convention=convention)
    _same(dask.compute(*res), lnc.rms_norm(X, W, return_stats=True, convention=convention))
    g = lnc.rms_norm_backward(da.from_array(DY, chunks=(5, 3, 40)), xd, da.from_array(W),
                              convention=convention, ms=res.ms)
    _same(dask.compute(*g), lnc.rms_norm_backward(DY, X, W, convention=convention))


def test_processes_scheduler():
    xd = da.from_array(X, chunks=(61, 3, 40))
    dyd = da.from_array(DY, chunks=(40, 3, 40))
    got = dask.compute(*lnc.layer_norm(xd, W, B, return_stats=True),
                       *lnc.layer_norm_backward(dyd, xd, W), scheduler="processes",
                       num_workers=2)
    want = tuple(lnc.layer_norm(X, W, B, return_stats=True)) + tuple(
        lnc.layer_norm_backward(DY, X, W))
    _same(got, want)


def test_distributed_local_cluster_with_processes():
    distributed = pytest.importorskip("distributed")
    xd = da.from_array(X, chunks=(61, 3, 40))
    dyd = da.from_array(DY, chunks=(40, 3, 40))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        got = client.compute([*lnc.layer_norm(xd, W, B, return_stats=True),
                              *lnc.rms_norm(xd, W, return_stats=True),
                              *lnc.layer_norm_backward(dyd, xd, W)], sync=True)
        workers = client.run(lambda: __import__("os").getpid())
    assert len(set(workers.values())) == 2
    want = (tuple(lnc.layer_norm(X, W, B, return_stats=True))
            + tuple(lnc.rms_norm(X, W, return_stats=True))
            + tuple(lnc.layer_norm_backward(DY, X, W)))
    _same(got, want)


def test_errors_name_the_argument():
    xd = da.from_array(X, chunks=(60, 3, 40))
    with pytest.raises(ValueError, match="weight: expected shape"):
        lnc.layer_norm(xd, np.ones(39))
    with pytest.raises(ValueError, match="weight: expected shape"):
        lnc.layer_norm(xd, da.ones(39))
    with pytest.raises(TypeError, match="x: expected a real array"):
        lnc.layer_norm(xd.astype(np.complex64))
    with pytest.raises(TypeError, match="out: not supported with dask"):
        lnc.layer_norm(xd, out=np.empty_like(X))
    with pytest.raises(ValueError, match="eps"):
        lnc.layer_norm(xd, eps=-1.0)
    with pytest.raises(ValueError, match="dy: expected shape"):
        lnc.layer_norm_backward(xd[:10], xd)
    with pytest.raises(ValueError, match="mean: expected shape"):
        lnc.layer_norm_backward(xd, xd, mean=da.ones(7))
    with pytest.raises(ValueError, match="unknown chunk sizes"):
        lnc.layer_norm(xd[xd[:, 0, 0] > 500])
    with pytest.raises(ValueError, match="convention"):
        lnc.rms_norm(xd, convention="gemma")


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_tasks_run_the_kernels_on_one_thread_by_default(scheduler):
    """Inside a task the kernel pool stays asleep (it starts its threads on
    first need): the process has no more threads after a large dask
    computation, and gains them on the same call in memory."""
    from subprocess_support import run_python

    code = """if 1:
        import os, numpy as np, dask, dask.array as da, layernorm_c as lnc
        count = lambda: len(os.listdir('/proc/self/task'))
        lnc.set_num_threads(2)
        x = np.ones((8192, 1024), np.float32)
        before = count()
        lnc.layer_norm(da.from_array(x, chunks=(4096, 1024))).compute(scheduler=%r)
        inside = count()
        lnc.layer_norm(x)
        print(before, inside, count())
    """
    import os
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("needs /proc to count threads")
    proc = run_python(["-c", code % scheduler])
    assert proc.returncode == 0, proc.stderr
    before, inside, after = map(int, proc.stdout.split())
    # the threaded scheduler's own workers stay; the kernel pool's start later
    assert after > inside
    if scheduler == "sync":
        assert inside == before


def test_thread_limit_env_is_checked(monkeypatch):
    monkeypatch.setenv("LAYERNORM_C_DASK_THREADS", "zero")
    with pytest.raises(ValueError, match="LAYERNORM_C_DASK_THREADS"):
        lnc.layer_norm(da.from_array(X))
    monkeypatch.setenv("LAYERNORM_C_DASK_THREADS", "2")
    assert _bits(lnc.layer_norm(da.from_array(X, chunks=(80, 3, 40))).compute()) == _bits(
        lnc.layer_norm(X))


def test_thread_limit_is_per_thread():
    import threading

    from layernorm_c import _core

    assert _core._set_thread_limit(1) == 0
    seen = []
    t = threading.Thread(target=lambda: seen.append(_core._set_thread_limit(0)))
    t.start()
    t.join()
    assert seen == [0] and _core._set_thread_limit(0) == 1
    with pytest.raises(ValueError, match="thread limit"):
        _core._set_thread_limit(-1)


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=12)
@given(st.lists(st.integers(1, 60), min_size=1, max_size=12), st.integers(1, 3),
       st.sampled_from([np.float16, np.float32, np.float64]))
def test_any_record_chunking_gives_the_same_gradient_bits(sizes, split, dtype):
    """Records cut anywhere (the chunk sizes drawn, the rest one chunk) and
    the positions cut in `split` pieces: dx, dweight and dbias keep the
    in-memory bits."""
    x, dy = X.astype(dtype), DY.astype(dtype)
    rows = []
    left = x.shape[0]
    for s in sizes:
        if left == 0:
            break
        rows.append(min(s, left))
        left -= rows[-1]
    if left:
        rows.append(left)
    cols = [len(a) for a in np.array_split(np.arange(3), split)]
    xd = da.from_array(x, chunks=(tuple(rows), tuple(cols), 40))
    _same(dask.compute(*lnc.layer_norm_backward(dy, xd, W)), lnc.layer_norm_backward(dy, x, W))
