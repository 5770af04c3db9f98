"""The output cache (set_output_cache): a large output's memory, once the
array is freed, is written again by the next call that needs an output of
exactly that size. These tests check that the reused memory gives the same
results as fresh memory, that the cache keeps to its limit, and that the
arrays it backs behave like any other NumPy array."""
import json
import os
import pickle
import textwrap
import threading

import numpy as np
import pytest

import layernorm_c as lnc
from subprocess_support import run_python

MiB = 1 << 20
#: The smallest output the cache keeps (csrc/ln_cache.h, LN_CACHE_MIN_BYTES).
MIN_BYTES = 32 * MiB


def handler_name(a):
    """The name of the NumPy memory handler of the array that owns a's data
    (a itself, or the base a view was taken of)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    mod = getattr(np, "_core", None) or np.core
    return mod.multiarray.get_handler_name(a)


@pytest.fixture
def cache():
    """An empty cache with the default limit for the test, the setting put
    back afterwards."""
    limit = lnc.set_output_cache(0)
    lnc.set_output_cache(max(limit, 1 << 30))
    yield
    lnc.set_output_cache(0)
    lnc.set_output_cache(limit)


def rows(dtype, nbytes=MIN_BYTES, d=4096, seed=0):
    dt = np.dtype(dtype)
    n = nbytes // (d * dt.itemsize)
    return np.random.default_rng(seed).standard_normal((n, d)).astype(dt)


OPS = {
    "layer_norm": lambda x: lnc.layer_norm(x, np.full(x.shape[-1], 1.5, x.dtype),
                                           np.full(x.shape[-1], 0.25, x.dtype)),
    "rms_norm": lambda x: lnc.rms_norm(x, np.full(x.shape[-1], 1.5, x.dtype)),
    "layer_norm_backward": lambda x: lnc.layer_norm_backward(x[::-1], x).dx,
    "rms_norm_backward": lambda x: lnc.rms_norm_backward(x[::-1], x).dx,
}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_a_freed_output_is_written_again_with_the_same_result(cache, op, dtype):
    x = rows(dtype)
    y = OPS[op](x)
    assert handler_name(y) == "layernorm_c_outputs"
    expected, where = y.copy(), y.ctypes.data
    y[...] = np.nan  # what the next call finds in the block
    del y
    assert lnc.get_output_cache().blocks == 1
    y = OPS[op](x)
    assert y.ctypes.data == where, "the kept block was not reused"
    assert lnc.get_output_cache().blocks == 0
    np.testing.assert_array_equal(y, expected)
    lnc.set_output_cache(0)  # the same bits from fresh memory
    np.testing.assert_array_equal(OPS[op](x), expected)


def test_small_outputs_and_out_are_left_to_numpy(cache):
    x = rows("float32", MIN_BYTES // 2)
    y = lnc.layer_norm(x)
    assert handler_name(y) != "layernorm_c_outputs"
    out = np.empty((2 * x.shape[0], x.shape[1]), np.float32)
    lnc.layer_norm(np.concatenate([x, x]), out=out)
    assert handler_name(out) != "layernorm_c_outputs"
    del y, out
    assert lnc.get_output_cache() == (lnc.get_output_cache().limit, 0, 0)


def test_only_an_output_of_the_same_size_takes_a_kept_block(cache):
    small, large = rows("float32"), rows("float32", MIN_BYTES + 4096 * 4)
    y = lnc.layer_norm(small)
    del y
    y = lnc.layer_norm(large)
    assert lnc.get_output_cache().blocks == 1  # the smaller block is still kept
    np.testing.assert_array_equal(y[-1], lnc.layer_norm(large[-1]))


def test_the_cache_keeps_to_its_limit_and_four_blocks(cache):
    xs = [rows("float32", MIN_BYTES + k * 4096 * 4) for k in range(5)]
    ys = [lnc.layer_norm(x) for x in xs]
    del ys
    info = lnc.get_output_cache()
    assert info.blocks == 4 and MIN_BYTES * 4 < info.held <= info.limit
    lnc.set_output_cache(0)
    lnc.set_output_cache(int(2.5 * MIN_BYTES))  # room for two blocks
    ys = [lnc.layer_norm(x) for x in xs[:3]]
    for k in range(3):  # freed in this order: the oldest block is ys[0]'s
        ys[k] = None
    info = lnc.get_output_cache()
    assert info.blocks == 2 and info.held <= info.limit
    y0 = lnc.layer_norm(xs[0])  # its block was given back: a fresh one
    assert lnc.get_output_cache().blocks == 2
    y2 = lnc.layer_norm(xs[2])
    assert lnc.get_output_cache().blocks == 1
    y1 = lnc.layer_norm(xs[1])
    assert lnc.get_output_cache() == (info.limit, 0, 0)
    del y0, y1, y2


def test_a_block_larger_than_the_limit_is_not_kept(cache):
    lnc.set_output_cache(MIN_BYTES // 2)
    y = lnc.layer_norm(rows("float32"))
    del y
    assert lnc.get_output_cache() == (MIN_BYTES // 2, 0, 0)


def test_turning_the_cache_off_gives_its_memory_back(cache):
    y = lnc.layer_norm(rows("float32"))
    del y
    assert lnc.get_output_cache().held > MIN_BYTES
    previous = lnc.set_output_cache(0)
    assert previous >= 1 << 30
    assert lnc.get_output_cache() == (0, 0, 0)
    y = lnc.layer_norm(rows("float32"))
    assert handler_name(y) != "layernorm_c_outputs"


def test_outputs_in_kept_memory_are_ordinary_arrays(cache):
    x = rows("float32")
    y = lnc.layer_norm(x)
    del y
    y = lnc.layer_norm(x)
    assert y.flags.owndata and y.flags.writeable and y.flags.c_contiguous
    back = pickle.loads(pickle.dumps(y, protocol=5))
    np.testing.assert_array_equal(back, y)
    view = y[1:3]
    first = y[1].copy()
    del y  # the view keeps the memory: nothing is given back yet
    assert lnc.get_output_cache().blocks == 0
    assert not np.shares_memory(lnc.layer_norm(x), view)
    np.testing.assert_array_equal(view[0], first)
    del view
    assert lnc.get_output_cache().blocks >= 1


@pytest.mark.parametrize("rows_after", [3, 5000])
def test_a_resized_output_keeps_its_data(cache, rows_after):
    x = rows("float32")
    y = lnc.layer_norm(x)
    head = y[:3].copy()
    y.resize((rows_after, x.shape[1]), refcheck=False)
    np.testing.assert_array_equal(y[:3], head)
    y[-1] = 1.0
    del y  # a block resized below the cache's minimum is freed, one above kept
    assert lnc.get_output_cache().blocks == (rows_after * x.shape[1] * 4 >= MIN_BYTES)


def test_threads_freeing_and_taking_blocks_get_their_own_results(cache):
    xs = [rows("float32", seed=s) for s in range(3)]
    expected = [lnc.layer_norm(x)[::997].copy() for x in xs]
    errors = []

    def work(k):
        try:
            for i in range(6):
                j = (k + i) % 3
                y = lnc.layer_norm(xs[j])
                if not np.array_equal(y[::997], expected[j]):
                    errors.append((k, i))
                del y
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    info = lnc.get_output_cache()
    assert info.blocks <= 4 and info.held <= info.limit


def test_the_largest_limit_reads_back_as_set():
    before = lnc.set_output_cache(2**64 - 1)
    try:
        assert lnc.get_output_cache().limit == 2**64 - 1
    finally:
        lnc.set_output_cache(before)


@pytest.mark.parametrize("bad,exc", [(-1, ValueError), (2**64, ValueError),
                                     (1.5, TypeError), (True, TypeError), ("1", TypeError)])
def test_set_output_cache_rejects_bad_limits(bad, exc):
    before = lnc.get_output_cache().limit
    with pytest.raises(exc, match="max_bytes"):
        lnc.set_output_cache(bad)
    assert lnc.get_output_cache().limit == before


def _limit_in_a_child(value):
    """The limit a fresh interpreter starts with (LAYERNORM_C_OUTPUT_CACHE
    set to value, unless None), and its stderr."""
    env = {k: v for k, v in os.environ.items() if k != "LAYERNORM_C_OUTPUT_CACHE"}
    if value is not None:
        env["LAYERNORM_C_OUTPUT_CACHE"] = value
    code = ("import warnings; warnings.simplefilter('always');"
            "import layernorm_c as lnc; print(lnc.get_output_cache().limit)")
    proc = run_python(["-c", code], env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[0]), proc.stderr


def test_the_default_limit_is_a_gib_or_a_sixteenth_of_memory():
    limit, _ = _limit_in_a_child(None)
    pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGESIZE")
    assert limit == min(1 << 30, pages // 16 * page)


@pytest.mark.parametrize("value,limit", [("0", 0), ("123456789", 123456789), ("-5", None),
                                         ("lots", None)])
def test_the_environment_sets_the_limit(value, limit):
    got, stderr = _limit_in_a_child(value)
    assert ("LAYERNORM_C_OUTPUT_CACHE ignored" in stderr) == (limit is None)
    assert got == (limit if limit is not None else _limit_in_a_child(None)[0])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"),
                    reason="needs Linux procfs (VmSize) and RLIMIT_AS")
@pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", "")
                    or os.environ.get("LAYERNORM_C_SANITIZED") == "1",
                    reason="ASan's allocator aborts at the address-space limit instead of "
                           "returning NULL")
def test_kept_blocks_are_given_back_when_memory_runs_out():
    """A new output that malloc cannot give makes the cache free what it
    keeps, and the allocation is tried again: the kept memory never turns
    into a MemoryError."""
    script = textwrap.dedent(r"""
        import json, resource
        import numpy as np, layernorm_c as lnc
        MiB = 1 << 20
        kept = np.ones((64 * MiB // 16384, 4096), np.float32)
        x = np.ones((48 * MiB // 16384, 4096), np.float32); x[:, ::2] = -1
        del kept
        y = lnc.layer_norm(np.ones((64 * MiB // 16384, 4096), np.float32))
        del y
        before = lnc.get_output_cache().blocks
        def vm():
            for line in open('/proc/self/status'):
                if line.startswith('VmSize'):
                    return int(line.split()[1]) * 1024
        lim = vm() + 40 * MiB  # room for 40 MiB: the 48 MiB output needs the kept 64
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        try:
            y = lnc.layer_norm(x)
            # (no large temporary: there is no room for one)
            ok = (-1.0001 < y.min() < -0.9999 and 0.9999 < y.max() < 1.0001
                  and np.array_equal(np.sign(y[:, :64]), x[:, :64]))
            res = "right" if ok else "wrong"
        except MemoryError:
            res = "MemoryError"
        print(json.dumps([before, res, lnc.get_output_cache().blocks]))
    """)
    proc = run_python(["-c", script], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [1, "right", 0]
