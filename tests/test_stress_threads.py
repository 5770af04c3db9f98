"""Many Python threads at once; the GIL is released during long calls.

* Threads share read-only inputs (x, weight, bias) and each writes its own
  outputs, through every entry point of layer_norm and rms_norm (fast path,
  out=, general path, Gemma's convention, raw gufuncs, both backward
  passes), in every float dtype (bfloat16 too with ml_dtypes), while another thread keeps allocating, resizing and freeing
  arrays and yet another flips the thread count and instruction-set level.
  Every result must be bit-identical to the one computed alone beforehand
  (the reproducibility contract holds for any ISA and thread count), and
  the shared inputs must be unchanged at the end.
* A long call must let other Python threads run: a ticker thread must make
  progress while one thread is inside a large layer_norm or rms_norm call
  (fast path, general path, raw gufunc, backward, float16 and bfloat16). If the call held the GIL, the ticker could
  not move at all.

Light versions run in the normal suite; LAYERNORM_C_STRESS=1 runs the heavy
ones (more threads, more rounds, larger arrays).
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import layernorm_c as lnc
from cases import FLOAT_DTYPES
from layernorm_c import _bf16

#: float16/32/64, and bfloat16 when ml_dtypes is installed.
DTYPES = FLOAT_DTYPES + ((_bf16.BFLOAT16,) if _bf16.BFLOAT16 is not None else ())

HEAVY = os.environ.get("LAYERNORM_C_STRESS", "") not in ("", "0")
N_THREADS = 16 if HEAVY else 6
ROUNDS = 200 if HEAVY else 12


def _inputs(dt, rows, d, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, d)) * 3 + 1).astype(dt)
    w = rng.standard_normal(d).astype(dt)
    b = rng.standard_normal(d).astype(dt)
    for a in (x, w, b):
        a.flags.writeable = False  # shared read-only inputs
    return x, w, b


def _jobs(x, w, b):
    """name -> callable(out_buffer) covering every entry point."""
    xs = x[:, ::-1]
    wr = w[::-1]
    return {
        "fast": lambda out: lnc.layer_norm(x, w, b),
        "fast-stats": lambda out: lnc.layer_norm(x, w, None, return_stats=True),
        "out=": lambda out: lnc.layer_norm(x, w, b, out=out),
        "strided": lambda out: lnc.layer_norm(xs, wr, b),
        "axes": lambda out: lnc.layer_norm(x, axis=(0, 1)),
        "gufunc": lambda out: lnc.layer_norm_ufunc(x, w, b, 1e-5),
        "gufunc-out": lambda out: lnc.layer_norm_ufunc(x, w, b, 1e-5, out=out),
        "backward": lambda out: lnc.layer_norm_backward(b * x[::-1], x, w),
        "rms-fast": lambda out: lnc.rms_norm(x, w),
        "rms-fast-stats": lambda out: lnc.rms_norm(x, None, return_stats=True),
        "rms-out=": lambda out: lnc.rms_norm(x, w, out=out),
        "rms-strided": lambda out: lnc.rms_norm(xs, wr, return_stats=True),
        "rms-axes": lambda out: lnc.rms_norm(x, axis=(0, 1)),
        "rms-gemma": lambda out: lnc.rms_norm(x, w, convention="1+weight"),
        "rms-gemma-strided": lambda out: lnc.rms_norm(xs, w, convention="1+weight"),
        "rms-gufunc": lambda out: lnc.rms_norm_ufunc(x, w, 1e-6),
        "rms-gufunc-out": lambda out: lnc.rms_norm_ufunc(x, w, 1e-6, out=out),
        "rms-backward": lambda out: lnc.rms_norm_backward(b * x[::-1], x, w),
        "rms-backward-strided": lambda out: lnc.rms_norm_backward(xs, xs, wr,
                                                                  convention="1+weight"),
        "rms-backward-gufunc": lambda out: lnc.rms_norm_backward_ufunc(x[::-1], x, w, 1e-6),
    }


def _as_bytes(res):
    if isinstance(res, tuple):
        return tuple(np.ascontiguousarray(r).tobytes() for r in res)
    return np.ascontiguousarray(res).tobytes()


def _churn(stop, errors):
    """Allocate, resize and free arrays of varying sizes, as other code in
    the same process would, so freed memory is reused under the kernels."""
    rng = np.random.default_rng(1)
    keep = []
    try:
        while not stop.is_set():
            n = int(rng.integers(1, 1 << 16))
            a = np.empty(n, np.float32)
            a.fill(np.nan)
            a.resize(int(rng.integers(1, 1 << 16)), refcheck=False)
            keep.append(a)
            if len(keep) > 32:
                del keep[: int(rng.integers(1, 32))]
    except BaseException as exc:  # report in the main thread
        errors.append(exc)


def _flip_settings(stop, errors):
    """Change the thread count and the ISA while calls are running; results
    may not depend on either."""
    isas = lnc.supported_isas()
    i = 0
    try:
        while not stop.is_set():
            lnc.set_num_threads(1 + i % 4)
            lnc.set_isa(isas[i % len(isas)])
            i += 1
            time.sleep(0.0005)
    except BaseException as exc:
        errors.append(exc)


@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_threads_share_inputs_bit_identical(dt, restore_settings):
    # Large enough for the kernels' own worker threads to start in some
    # calls (above lnc.thread_threshold()) when the flipper allows them.
    rows, d = (64, 20000) if HEAVY else (16, 2500)
    x, w, b = _inputs(dt, rows, d)
    before = [a.tobytes() for a in (x, w, b)]
    jobs = _jobs(x, w, b)
    lnc.set_num_threads(1)
    expected = {name: _as_bytes(fn(np.empty_like(x))) for name, fn in jobs.items()}

    stop = threading.Event()
    errors = []
    mismatches = []
    names = sorted(jobs)

    def worker(k):
        out = np.empty_like(x)  # this thread's own output
        try:
            for r in range(ROUNDS):
                name = names[(k + r) % len(names)]
                got = _as_bytes(jobs[name](out))
                if got != expected[name]:
                    mismatches.append((k, r, name))
        except BaseException as exc:
            errors.append(exc)

    helpers = [threading.Thread(target=_churn, args=(stop, errors)),
               threading.Thread(target=_flip_settings, args=(stop, errors))]
    workers = [threading.Thread(target=worker, args=(k,)) for k in range(N_THREADS)]
    for t in helpers + workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    for t in helpers:
        t.join()
    if errors:
        raise errors[0]
    assert not mismatches, f"results differ from the single-threaded ones: {mismatches[:5]}"
    assert [a.tobytes() for a in (x, w, b)] == before, "shared inputs were modified"


def test_threads_with_invalid_eps_warnings():
    """Many threads hitting the gufunc's invalid-eps path (FP flag per
    thread): every record NaN, never a crash or an exception."""
    x, w, b = _inputs(np.float32, 8, 300)
    errors = []

    def worker():
        try:
            with np.errstate(invalid="ignore"):  # per thread, unlike warnings filters
                for _ in range(ROUNDS):
                    y = lnc.layer_norm_ufunc(x, w, b, -1.0)
                    assert np.isnan(y).all()
                    y = lnc.rms_norm_ufunc(x, w, np.nan)
                    assert np.isnan(y).all()
        except BaseException as exc:
            errors.append(exc)

    ts = [threading.Thread(target=worker) for _ in range(N_THREADS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


# ------------------------------------------------------------------- the GIL

class Ticker:
    """A Python thread that loops as fast as it can and remembers the
    longest pause between two of its steps: it can only step while no other
    thread holds the GIL."""

    def __init__(self):
        self.max_gap = 0.0
        self.steps = 0
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        clock = time.perf_counter
        last = clock()
        while not self._stop:
            now = clock()
            if now - last > self.max_gap:
                self.max_gap = now - last
            last = now
            self.steps += 1

    def __enter__(self):
        self._t.start()
        while self.steps == 0:
            time.sleep(0.001)
        return self

    def __exit__(self, *exc):
        self._stop = True
        self._t.join()


def longest_pause_ratio(fn, attempts=5):
    """Best (smallest), over a few calls of fn, of the ticker's longest
    pause during the call divided by the call's duration. About 1 for a call
    that holds the GIL throughout (every attempt); small for one that
    releases it (the ticker only waits while the caller runs Python code
    around the C call). Best-of-several absorbs a busy machine."""
    best = float("inf")
    with Ticker() as t:
        for _ in range(attempts):
            t.max_gap = 0.0
            t0 = time.perf_counter()
            fn()
            duration = time.perf_counter() - t0
            best = min(best, t.max_gap / duration)
            if best < 0.2:
                break
    return best


# Elements per call: a call of some tens of milliseconds on one thread
# (the ticker's pauses without the GIL are a few ms at most).
GIL_N = (1 << 28) if HEAVY else (1 << 25)


@pytest.fixture(scope="module")
def big_x():
    d = 4096
    x = np.ones((GIL_N // d, d), np.float32)
    x[:, ::2] = -1.0
    return x


def test_gil_detector_sees_a_call_that_holds_the_gil(big_x):
    """Control: ndarray.tobytes() copies with the GIL held; the detector
    must report it (else the test below could never fail)."""
    assert longest_pause_ratio(big_x.tobytes, attempts=2) > 0.5


GIL_ENTRIES = ["fast", "general", "gufunc", "float16", "rms-fast", "rms-general", "rms-gufunc",
               "rms-backward", "bfloat16", "rms-bfloat16"]


@pytest.mark.parametrize("entry", GIL_ENTRIES)
def test_long_call_releases_gil(entry, big_x, restore_settings):
    lnc.set_num_threads(1)
    x = big_x
    d = x.shape[1]
    if entry == "fast":
        fn = lambda: lnc.layer_norm(x)  # noqa: E731
    elif entry == "general":
        xs = x[:, ::-1]
        fn = lambda: lnc.layer_norm(xs)  # noqa: E731
    elif entry == "gufunc":
        w, b = np.ones(d, np.float32), np.zeros(d, np.float32)
        fn = lambda: lnc.layer_norm_ufunc(x, w, b, 1e-5)  # noqa: E731
    elif entry == "float16":
        xh = x.astype(np.float16)
        fn = lambda: lnc.layer_norm(xh)  # noqa: E731
    elif entry == "rms-fast":
        fn = lambda: lnc.rms_norm(x)  # noqa: E731
    elif entry == "rms-general":
        xs = x[:, ::-1]
        fn = lambda: lnc.rms_norm(xs, np.ones(d, np.float32), convention="1+weight")  # noqa: E731
    elif entry == "rms-gufunc":
        w = np.ones(d, np.float32)
        fn = lambda: lnc.rms_norm_ufunc(x, w, 1e-6)  # noqa: E731
    elif entry == "rms-backward":
        half = x[: x.shape[0] // 2]  # two passes over the records: half of them
        fn = lambda: lnc.rms_norm_backward(half, half)  # noqa: E731
    else:
        if _bf16.BFLOAT16 is None:
            pytest.skip("ml_dtypes is not installed")
        xb = x.astype(_bf16.BFLOAT16)
        fn = (lambda: lnc.layer_norm(xb)) if entry == "bfloat16" else (  # noqa: E731
            lambda: lnc.rms_norm(xb))
    ratio = longest_pause_ratio(fn)
    assert ratio < 0.5, (
        f"another Python thread was stopped for {ratio:.0%} of a large {entry} call: "
        f"the call seems to hold the GIL")
