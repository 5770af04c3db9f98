"""Memory, references, inputs, in-place use, and concurrency."""
import concurrent.futures
import gc
import os
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import layernorm_c as lnc
from layernorm_c import _bf16
from cases import FLOAT_DTYPES, LAYOUTS, WRITABLE_LAYOUTS, layout_1d, native, with_layout
from core_strategies import (WB_COMBOS, assert_same_bits, assert_same_result, problems,
                             random_params, random_records)


# ------------------------------------------------------------ inputs

#: float16/32/64, bfloat16 when ml_dtypes is installed, and what is
#: computed in float64.
_INPUT_DTYPES = FLOAT_DTYPES + ((_bf16.BFLOAT16,) if _bf16.BFLOAT16 is not None else ()) + \
    (np.dtype(np.int32), np.dtype(np.bool_))


@given(x_dtype=st.sampled_from(_INPUT_DTYPES), p_dtype=st.sampled_from(_INPUT_DTYPES),
       d=st.integers(1, 70), wb=st.sampled_from(WB_COMBOS),
       layout=st.sampled_from(list(LAYOUTS)), seed=st.integers(0, 2**32 - 1))
def test_inputs_are_never_modified(x_dtype, p_dtype, d, wb, layout, seed):
    rng = np.random.default_rng(seed)
    x = with_layout(random_records(rng, np.float16, 6, d).astype(x_dtype), layout)
    w, b = (layout_1d(layout, p) for p in random_params(rng, np.float32, d, wb))
    w = None if w is None else w.astype(p_dtype)
    b = None if b is None else b.astype(p_dtype)
    before = [None if a is None else a.copy() for a in (x, w, b)]
    lnc.layer_norm(x, w, b, return_stats=True)
    lnc.layer_norm(x, axis=0)
    lnc.layer_norm(x, out=np.empty(x.shape, np.float64 if x.dtype.kind in "biu" else x.dtype))
    for a, saved in zip((x, w, b), before):
        if a is not None:
            assert_same_bits(a, saved, "input after the call")


def _float_out(x):
    """An out= for a call on x alone: its dtype, or float64 for integers."""
    return np.empty(x.shape, np.float64 if x.dtype.kind in "biu" else x.dtype)


@given(x_dtype=st.sampled_from(_INPUT_DTYPES), p_dtype=st.sampled_from(_INPUT_DTYPES),
       dy_dtype=st.sampled_from(_INPUT_DTYPES), d=st.integers(1, 70),
       gain=st.booleans(), layout=st.sampled_from(list(LAYOUTS)), seed=st.integers(0, 2**32 - 1))
def test_rms_inputs_are_never_modified(x_dtype, p_dtype, dy_dtype, d, gain, layout, seed):
    """Every RMSNorm entry point and the layer leave x, the weight, dy and
    the mean squares as they were, in every layout and dtype; and
    layer_norm_backward leaves dy, x and the weight alone too."""
    rng = np.random.default_rng(seed)
    x = with_layout(random_records(rng, np.float16, 6, d).astype(x_dtype), layout)
    dy = with_layout(random_records(rng, np.float16, 6, d).astype(dy_dtype), layout)
    w = rng.uniform(-2, 2, d).astype(p_dtype) if gain else None
    if w is not None and not (layout == "byteswapped" and w.dtype.kind not in "fiu"):
        w = layout_1d(layout, w)  # (bool and bfloat16 have no byte order)
    ms = lnc.rms_norm(x, w, return_stats=True).ms
    inputs = (x, w, dy, ms)
    before = [None if a is None else a.copy() for a in inputs]
    lnc.rms_norm(x, w, return_stats=True)
    lnc.rms_norm(x, w, convention="1+weight", return_stats=True)
    lnc.rms_norm(x, axis=0)
    lnc.rms_norm(x, out=_float_out(x))
    lnc.rms_norm_backward(dy, x, w, ms=ms)
    lnc.rms_norm_backward(dy, x, w, convention="1+weight")
    lnc.layer_norm_backward(dy, x, w)
    scale = np.ones(d, np.float32) if w is None else w
    lnc.rms_norm_ufunc(x, scale, 1e-6)
    lnc.rms_norm_backward_ufunc(dy, x, scale, 1e-6)
    if x.dtype.kind == "f" or (_bf16.BFLOAT16 is not None and x.dtype == _bf16.BFLOAT16):
        layer = lnc.RMSNorm(d, gain=gain, dtype=x.dtype)
        layer(x)
        layer.backward(dy)
    for a, saved, name in zip(inputs, before, ("x", "weight", "dy", "ms")):
        if a is not None:
            assert_same_bits(a, saved, f"{name} after the calls")


@given(problems())
def test_read_only_inputs_work(p):
    want = lnc.layer_norm(p.x, p.weight, p.bias, p.eps, axis=p.axis, return_stats=True)
    frozen = []
    for a in (p.x, p.weight, p.bias):
        if a is not None:
            a = a.copy()
            a.flags.writeable = False
        frozen.append(a)
    got = lnc.layer_norm(*frozen, p.eps, axis=p.axis, return_stats=True)
    assert_same_result(got, want)


@given(problems(mixed_dtypes=False))
def test_out_is_x_in_place(p):
    want = lnc.layer_norm(p.x, p.weight, p.bias, p.eps, axis=p.axis)
    x = p.x.copy()
    assert lnc.layer_norm(x, p.weight, p.bias, p.eps, axis=p.axis, out=x) is x
    assert_same_bits(x, want)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("layout", WRITABLE_LAYOUTS)
def test_out_is_x_in_place_for_any_layout(dtype, layout):
    rng = np.random.default_rng(4)
    batch = random_records(rng, dtype, 9, 45)
    w, b = random_params(rng, dtype, 45, "wb")
    want = lnc.layer_norm(batch, w, b)
    x = LAYOUTS[layout](batch)
    assert lnc.layer_norm(x, w, b, out=x) is x
    assert_same_bits(native(x), want)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("alias", ["rows_reversed", "cols_reversed", "transposed",
                                   "next_row", "previous_row", "half_row"])
def test_out_aliasing_x_in_another_order(dtype, alias):
    """out a view of x's own memory in another order or shifted: the result
    is still the out-of-place one (no record reads values already
    overwritten)."""
    rng = np.random.default_rng(5)
    buf = np.zeros((8, 12), dtype)
    x = {"rows_reversed": buf[:6, :6], "cols_reversed": buf[:6, :6],
         "transposed": buf[:6, :6], "next_row": buf[:6, :6],
         "previous_row": buf[1:7, :6], "half_row": buf[:6, :6]}[alias]
    out = {"rows_reversed": buf[:6, :6][::-1], "cols_reversed": buf[:6, :6][:, ::-1],
           "transposed": buf[:6, :6].T, "next_row": buf[1:7, :6],
           "previous_row": buf[:6, :6], "half_row": buf[:6, 3:9]}[alias]
    x[...] = random_records(rng, dtype, 6, 6)
    w, b = random_params(rng, dtype, 6, "wb")
    want = lnc.layer_norm(x.copy(), w, b)
    lnc.layer_norm(x, w, b, out=out)
    assert_same_bits(out, want)


# ------------------------------------------------------------ leaks

def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    except OSError:   # not Linux: peak RSS is the best we have
        import resource
        scale = 1 if sys.platform == "darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _exercise_every_path(x32, x16s, w, b, out, x64):
    """One round of successful and failing calls (all raise/handled)."""
    lnc.layer_norm(x32, w, b)
    lnc.layer_norm(x16s, return_stats=True)            # float16, strided: scratch rows
    lnc.layer_norm(x64, axis=(0, 1))
    lnc.layer_norm(x32, w, b, out=out)
    lnc.layer_norm_ufunc(x32, w, b, np.float64(1e-5))
    with np.errstate(invalid="ignore"):
        lnc.layer_norm_ufunc(x32, w, b, -1.0)          # NaN records
    for kwargs in (dict(eps=-1.0), dict(eps="a"), dict(weight=w[:-1]), dict(axis=7),
                   dict(out=out[:, :-1]), dict(out=out.astype(np.float64))):
        try:
            lnc.layer_norm(x32, **kwargs)
        except (TypeError, ValueError):
            pass
        else:
            raise AssertionError(f"{kwargs} should fail")
    try:
        lnc.layer_norm(x32.astype(np.complex64))
    except TypeError:
        pass


@pytest.mark.skipif(os.environ.get("LAYERNORM_C_SANITIZED") == "1",
                    reason="ASan keeps freed memory in quarantine; tools/sanitize.sh "
                           "checks leaks with LeakSanitizer instead")
def test_no_memory_growth_over_thousands_of_calls():
    rng = np.random.default_rng(6)
    d = 256
    x32 = rng.normal(size=(16, d)).astype(np.float32)
    x16s = np.zeros((16, 2 * d), np.float16)[:, ::2]
    x16s[...] = x32
    x64 = rng.normal(size=(8, 32))
    w, b = np.ones(d, np.float32), np.zeros(d, np.float32)
    out = np.empty_like(x32)
    args = (x32, x16s, w, b, out, x64)
    for _ in range(300):                                 # warm up caches and pools
        _exercise_every_path(*args)
    gc.collect()
    before = _rss_bytes()
    for _ in range(5000):
        _exercise_every_path(*args)
    gc.collect()
    growth = _rss_bytes() - before
    # A leak of one output (16 KB) or one scratch block (~4 KB) per round
    # would be 20-80 MB here.
    assert growth < 2 * 2**20, f"RSS grew by {growth / 2**20:.1f} MB over 5000 rounds"


def test_reference_counts_unchanged():
    x = np.random.default_rng(7).normal(size=(8, 8))
    w, b, out = np.ones(8), np.zeros(8), np.empty((8, 8))
    objs = (x, w, b, out)
    before = [sys.getrefcount(o) for o in objs]
    for _ in range(200):
        lnc.layer_norm(x, w, b)
        lnc.layer_norm(x, w, b, out=out, return_stats=True)
        lnc.layer_norm(x, w, b, axis=0)
        lnc.layer_norm_ufunc(x, w, b, 1e-5, out=out)
        for kwargs in (dict(eps=-1), dict(axis=3), dict(out=np.empty((1, 8)))):
            with pytest.raises((TypeError, ValueError)):
                lnc.layer_norm(x, w, b, **kwargs)
        with pytest.raises(ValueError):
            lnc.layer_norm(x, w[:-1], b, out=out)
        with pytest.raises(TypeError):
            lnc.layer_norm(x, w, b.astype(complex), out=out)
    gc.collect()
    assert [sys.getrefcount(o) for o in objs] == before


# ------------------------------------------------------------ threads

def test_many_python_threads_at_once():
    """8 workers calling layer_norm concurrently (small calls and calls big
    enough to start the kernel's own threads) get the single-thread bits."""
    rng = np.random.default_rng(8)
    jobs = []
    for i in range(24):
        dtype = FLOAT_DTYPES[i % 3]
        n, d = (700, 1000) if i % 8 == 0 else (int(rng.integers(1, 50)), int(rng.integers(1, 300)))
        x = random_records(rng, dtype, n, d)
        if i % 4 == 1:
            x = LAYOUTS["col_strided"](x)
        w, b = random_params(rng, dtype, d, WB_COMBOS[i % 4])
        jobs.append((x, w, b))
    want = [lnc.layer_norm(x, w, b, return_stats=True) for x, w, b in jobs]

    start = threading.Barrier(8)

    def run(i):
        if i < 8:
            start.wait()                     # make the first calls really overlap
        x, w, b = jobs[i % len(jobs)]
        return i % len(jobs), lnc.layer_norm(x, w, b, return_stats=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        for i, got in pool.map(run, range(3 * len(jobs))):
            assert_same_result(got, want[i], f"job {i}")


def test_gil_is_released_during_a_big_call():
    """While the kernel runs, another Python thread can run.

    The GIL switch interval is made huge, so a thread holding the GIL keeps
    it for the whole call unless the call releases it: then the counter
    cannot move between the two reads around the call. The call is tried a
    few times, so a descheduled helper thread cannot make the test flaky."""
    x = np.random.default_rng(9).normal(size=(4096, 4096)).astype(np.float32)  # 64 MB
    out = np.empty_like(x)
    counter = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            counter[0] += 1
            time.sleep(0.0002)           # releases the GIL between increments

    old = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    helper = threading.Thread(target=count)
    helper.start()
    progressed = []
    try:
        for _ in range(5):
            c0 = counter[0]
            lnc.layer_norm(x, out=out)
            progressed.append(counter[0] - c0)
            if progressed[-1] > 0:
                break
            time.sleep(0.01)             # let the helper get going
    finally:
        stop.set()
        sys.setswitchinterval(old)
        helper.join()
    assert progressed[-1] > 0, f"no progress in other threads during the calls: {progressed}"
