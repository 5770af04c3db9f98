"""Exercise every entry point of layernorm_c many times, for leak checkers.

Run by tools/sanitize.sh under LeakSanitizer and by tools/valgrind.sh under
memcheck. Every success path and every error path of layer_norm and
rms_norm, the C fast paths (_core._fast, _core._fast_rms), the raw and
private gufuncs, both backward passes, both layers and the settings
functions, in float16/32/64 and (ml_dtypes installed) bfloat16, is called
REPEAT times, so that a per-call leak shows up as a leak of
REPEAT (or more) objects. Prints one line per group and the call count.

    python tools/leakcheck.py [REPEAT]
"""
from __future__ import annotations

import sys
import warnings

import numpy as np

import layernorm_c as lnc
from layernorm_c import _bf16, _core

#: The dtypes the kernels compute; bfloat16 when ml_dtypes is installed.
DTYPES = (np.float16, np.float32, np.float64) + \
    ((_bf16.BFLOAT16,) if _bf16.BFLOAT16 is not None else ())

REPEAT = int(sys.argv[1]) if len(sys.argv) > 1 else 20
CALLS = 0


def fast(x, w, b, eps, rs, out=None):
    """The C fast path, called directly: _fast(x, weight, bias, eps, out, return_stats)."""
    return _core._fast(x, w, b, eps, out, rs)


def expect_error(fn, *args, **kwargs):
    global CALLS
    CALLS += 1
    try:
        fn(*args, **kwargs)
    except (TypeError, ValueError):
        return
    raise AssertionError(f"expected TypeError/ValueError from {fn.__name__}{args!r}")


def ok(fn, *args, **kwargs):
    global CALLS
    CALLS += 1
    return fn(*args, **kwargs)


def success_paths(isa: str) -> None:
    rng = np.random.default_rng(0)
    for dt in DTYPES:
        for d in (1, 7, 33, 100):
            x = rng.standard_normal((3, d)).astype(dt)
            w = rng.standard_normal(d).astype(dt)
            b = rng.standard_normal(d).astype(dt)
            ok(lnc.layer_norm, x)                          # fast path, no params
            ok(lnc.layer_norm, x, w, b)                    # fast path, both
            ok(lnc.layer_norm, x, w, None, return_stats=True)
            ok(lnc.layer_norm, x, None, b, 0.0, return_stats=True)
            ok(fast, x, w, b, 1e-5, True)
            ok(fast, x, None, None, 1e-5, False)
            ok(fast, x, w, None, 1e-5, False, np.empty_like(x))
            ok(lnc.layer_norm, x[:, ::-1], w[::-1], b)     # general path, strided
            ok(lnc.layer_norm, x.T.copy(), axis=0)         # axis
            ok(lnc.layer_norm, x, axis=(0, 1), return_stats=True)
            ok(lnc.layer_norm, x, out=np.empty_like(x))
            xc = x.copy()
            ok(lnc.layer_norm, xc, w, b, out=xc)           # in place
            if np.dtype(dt).kind == "f":  # (bfloat16 has no byte-swapped form)
                ok(lnc.layer_norm, x.astype(x.dtype.newbyteorder()), w, b)
            ok(lnc.layer_norm, np.broadcast_to(x[:1], (4, d)), np.broadcast_to(w[:1], (d,)))
            unaligned = np.frombuffer(b"\0" + x.tobytes(), dtype=dt, offset=1).reshape(x.shape)
            ok(lnc.layer_norm, unaligned, w, b)
            ok(lnc.layer_norm_ufunc, x, w, b, 1e-5)
            ok(lnc.layer_norm_ufunc, x, w, b, np.full(3, 1e-5), out=np.empty_like(x))
            ok(_core._ln_wb, x, w, b, 1e-5)
            ok(_core._ln_w, x, w, 1e-5)
            ok(_core._ln_b, x, b, 1e-5)
            ok(_core._ln_none, x, 1e-5)
            ok(lnc.layer_norm, np.zeros((0, d), dt))
            rms_paths(x, w, dt, d)
    backward_paths(rng)
    rms_backward_paths(rng)
    ok(lnc.layer_norm, np.arange(12).reshape(3, 4))       # integer input
    ok(lnc.layer_norm, [[1.0, 2.0], [3.0, 5.0]])          # list input
    ok(lnc.layer_norm, np.zeros((2, 3), np.float32), np.ones(3), None)  # promotion


def backward_paths(rng) -> None:
    """layer_norm_backward, its gufunc, the exact sums and the layer."""
    for dt in DTYPES:
        for d in (1, 9, 40):
            x = rng.standard_normal((3, d)).astype(dt)
            dy = rng.standard_normal((3, d)).astype(dt)
            w = rng.standard_normal(d).astype(dt)
            ok(lnc.layer_norm_backward, dy, x, w)
            ok(lnc.layer_norm_backward, dy, x)
            ok(lnc.layer_norm_backward, dy[:, ::-1], x[:, ::-1], w, axis=-1)
            ok(lnc.layer_norm_backward, dy, x, w, mean=lnc.layer_norm(x, return_stats=True).mean)
            ok(lnc.layer_norm_backward, dy.T, x.T, axis=0)
            ok(lnc.layer_norm_backward_ufunc, dy, x, w, 1e-5)
            ok(_core._backward, dy, x, w, 1e-5, None, False)
            ok(_core._backward, dy, x, None, 1e-5, None, 2)
            dy2 = dy.copy()
            dy2[0, 0] = np.nan
            ok(lnc.layer_norm_backward, dy2, x, w)          # the scalar deposit path
            layer = lnc.LayerNorm(d, dtype=dt)
            ok(layer, x)
            ok(layer.backward, dy)
            ok(layer.zero_grad)
            ok(layer.load_state_dict, layer.state_dict())
    a = ok(lambda: lnc.layer_norm_backward(np.ones((2, 3)), np.eye(2, 3)))
    s = lnc.ExactSum((3,))
    ok(lambda: (s + s).value(np.float32))
    assert a.dbias.shape == (3,)


def rms_paths(x, w, dt, d) -> None:
    """rms_norm: the fast path, the general path, Gemma's convention, the
    gufuncs (public and private), out= and in place."""
    ok(lnc.rms_norm, x)                                # fast path, no weight
    ok(lnc.rms_norm, x, w, return_stats=True)          # fast path, weight
    ok(lnc.rms_norm, x, w, 0.0, convention="1+weight")  # the scale in the compute type
    ok(_core._fast_rms, x, w, 1e-6, None, True)
    ok(_core._fast_rms, x, None, 1e-6, np.empty_like(x), False)
    ok(lnc.rms_norm, x[:, ::-1], w[::-1], return_stats=True)   # general path, strided
    ok(lnc.rms_norm, x[:, ::-1], w, convention="1+weight")
    ok(lnc.rms_norm, x.T.copy(), w, axis=0)
    ok(lnc.rms_norm, x, axis=(0, 1), return_stats=True)
    ok(lnc.rms_norm, x, w, out=np.empty_like(x))
    xc = x.copy()
    ok(lnc.rms_norm, xc, w, out=xc)                    # in place
    buf = np.empty_like(x)
    buf[0] = w
    ok(lnc.rms_norm, x, buf[0], out=buf)               # out holds the weight
    ok(lnc.rms_norm, np.broadcast_to(x[:1], (4, d)), np.broadcast_to(w[:1], (d,)))
    unaligned = np.frombuffer(b"\0" + x.tobytes(), dtype=dt, offset=1).reshape(x.shape)
    ok(lnc.rms_norm, unaligned, w)
    ok(lnc.rms_norm_ufunc, x, w, 1e-6)
    ok(lnc.rms_norm_ufunc, x, w, np.full(3, 1e-6), out=np.empty_like(x))
    ok(_core._rms_w, x, w, 1e-6)
    ok(_core._rms_none, x, 1e-6)
    ok(lnc.rms_norm, np.zeros((0, d), dt))


def rms_backward_paths(rng) -> None:
    """rms_norm_backward, its gufunc, the rms flag of _backward and the layer."""
    for dt in DTYPES:
        for d in (1, 9, 40):
            x = rng.standard_normal((3, d)).astype(dt)
            dy = rng.standard_normal((3, d)).astype(dt)
            w = rng.standard_normal(d).astype(dt)
            ok(lnc.rms_norm_backward, dy, x, w)
            ok(lnc.rms_norm_backward, dy, x)
            ok(lnc.rms_norm_backward, dy, x, w, convention="1+weight")
            ok(lnc.rms_norm_backward, dy[:, ::-1], x[:, ::-1], w)
            ok(lnc.rms_norm_backward, dy, x, w, ms=lnc.rms_norm(x, w, return_stats=True).ms)
            ok(lnc.rms_norm_backward, dy.T, x.T, axis=0)
            ok(lnc.rms_norm_backward_ufunc, dy, x, w, 1e-6)
            ok(_core._backward, dy, x, w, 1e-6, None, True, True)
            ok(_core._backward, dy, x, None, 1e-6, None, False, True)
            dy2 = dy.copy()
            dy2[0, 0] = np.nan
            ok(lnc.rms_norm_backward, dy2, x, w)            # the scalar deposit path
            for convention in ("weight", "1+weight"):
                layer = lnc.RMSNorm(d, dtype=dt, convention=convention)
                ok(layer, x)
                ok(layer.backward, dy)
                ok(layer.zero_grad)
                ok(layer.load_state_dict, layer.state_dict())
            ok(lambda: lnc.RMSNorm(d, gain=False, dtype=dt)(x))


def error_paths() -> None:
    x = np.ones((2, 3))
    expect_error(lnc.layer_norm, np.ones((2, 3), complex))
    expect_error(lnc.layer_norm, np.array(["a", "b"]))
    expect_error(lnc.layer_norm, np.array([1.0, 2.0], dtype=object))
    expect_error(lnc.layer_norm, np.zeros(3, dtype="f4,f4"))
    expect_error(lnc.layer_norm, 1.0)
    expect_error(lnc.layer_norm, np.zeros((2, 0)))
    expect_error(lnc.layer_norm, x, np.ones(4))
    expect_error(lnc.layer_norm, x, None, np.ones((3, 1)))
    expect_error(lnc.layer_norm, x, np.ones(3, complex))
    expect_error(lnc.layer_norm, x, eps=-1.0)
    expect_error(lnc.layer_norm, x, eps=float("nan"))
    expect_error(lnc.layer_norm, x, eps=float("inf"))
    expect_error(lnc.layer_norm, x, eps="1e-5")
    expect_error(lnc.layer_norm, x, eps=None)
    expect_error(lnc.layer_norm, x, axis=2)
    expect_error(lnc.layer_norm, x, axis=(0, 0))
    expect_error(lnc.layer_norm, x, axis=1.0)
    expect_error(lnc.layer_norm, x, out=np.empty((3, 2)))
    expect_error(lnc.layer_norm, x, out=np.empty((2, 3), np.float32))
    expect_error(lnc.layer_norm, x, out=np.empty((2, 3), int))
    expect_error(lnc.layer_norm, x, out=[0.0] * 6)
    expect_error(lnc.layer_norm, x, out=np.broadcast_to(0.0, (2, 3)))
    expect_error(lnc.layer_norm_ufunc, x, np.ones(4), np.zeros(3), 1e-5)
    expect_error(lnc.layer_norm_ufunc, np.ones(3, complex), np.ones(3), np.zeros(3), 1e-5)
    expect_error(lnc.layer_norm_ufunc, x, np.ones(3), np.zeros(3), 1e-5, out=np.empty(3))
    expect_error(lnc.layer_norm_ufunc, x, np.ones(3), np.zeros(3), 1e-5,
                 out=np.empty((2, 3), int))
    expect_error(lnc.layer_norm_backward, np.ones((2, 4)), x)
    expect_error(lnc.layer_norm_backward, x, x, mean=np.zeros(3))
    expect_error(lnc.layer_norm_backward, x, x, np.ones(4))
    expect_error(lnc.layer_norm_backward, x, x, eps=-1.0)
    expect_error(_core._backward, x, x, None, 1e-5, None)            # wrong arity
    expect_error(_core._backward, x, np.ones((2, 4)), None, 1e-5, None, True)
    expect_error(_core._acc_merge, np.zeros((3, 8), np.uint64), np.zeros((4, 8), np.uint64))
    expect_error(_core._acc_value, np.zeros((3, 7), np.uint64), False)
    expect_error(lnc.rms_norm, np.ones((2, 3), complex))
    expect_error(lnc.rms_norm, np.zeros((2, 0)))
    expect_error(lnc.rms_norm, 1.0)
    expect_error(lnc.rms_norm, x, np.ones(4))
    expect_error(lnc.rms_norm, x, eps=-1.0)
    expect_error(lnc.rms_norm, x, eps="1e-6")
    expect_error(lnc.rms_norm, x, axis=2)
    expect_error(lnc.rms_norm, x, out=np.empty((3, 2)))
    expect_error(lnc.rms_norm, x, out=np.empty((2, 3), np.float32))
    expect_error(lnc.rms_norm, x, return_stats=1)
    expect_error(lnc.rms_norm, x, convention="gemma")
    expect_error(lnc.rms_norm_ufunc, x, np.ones(4), 1e-6)
    expect_error(lnc.rms_norm_ufunc, np.ones(3, complex), np.ones(3), 1e-6)
    expect_error(lnc.rms_norm_backward, np.ones((2, 4)), x)
    expect_error(lnc.rms_norm_backward, x, x, ms=np.zeros(3))
    expect_error(lnc.rms_norm_backward, x, x, np.ones(4))
    expect_error(lnc.rms_norm_backward, x, x, convention=None)
    expect_error(lnc.rms_norm_backward_ufunc, x, np.ones((2, 4)), np.ones(3), 1e-6)
    expect_error(_core._backward, x, np.ones((2, 4)), None, 1e-6, None, True, True)
    expect_error(lnc.RMSNorm, 0)
    expect_error(lnc.RMSNorm, 3, convention="gemma")
    expect_error(lnc.RMSNorm(3), np.ones((2, 4)))
    expect_error(lnc.RMSNorm(3).load_state_dict, {"weight": np.ones(4)})
    if _bf16.BFLOAT16 is not None:
        bf = np.ones((2, 3), _bf16.BFLOAT16)
        expect_error(lnc.rms_norm, bf, out=np.empty((2, 3), np.float16))
        expect_error(lnc.layer_norm, bf, out=np.empty((2, 3), np.float16))
        expect_error(lnc.rms_norm, bf.view(np.dtype("V2").newbyteorder(">")))
    expect_error(lnc.LayerNorm, 0)
    expect_error(lnc.LayerNorm(3).load_state_dict, {"weight": np.ones(4), "bias": np.ones(3)})
    expect_error(lnc.set_isa, "nope")
    expect_error(lnc.set_isa, 3)
    expect_error(_core.set_isa, 3)
    expect_error(lnc.set_num_threads, 0)
    expect_error(_core.set_num_threads, 2000)
    expect_error(_core.set_num_threads, "2")


def fast_odd_arguments() -> None:
    """_fast must answer NotImplemented (or raise) without leaking."""
    x = np.ones((2, 3))
    global CALLS
    for args in [(), (x,), (x, None, None, 1e-5), (x, None, None, 1e-5, False, 1, 2)]:
        CALLS += 1
        assert _core._fast(*args) is NotImplemented, args   # wrong arity
    for args in [(), (x,), (x, None, 1e-6, None), (x, None, 1e-6, None, False, True, 1)]:
        CALLS += 1
        assert _core._fast_rms(*args) is NotImplemented, args
    for args in [(x, None, -1.0, None, False), (x, np.ones(4), 1e-6, None, False),
                 (x.T, None, 1e-6, None, False), ([1.0, 2.0], None, 1e-6, None, False),
                 (x, None, 1e-6, np.empty((3, 2)), False), (x, None, 1e-6, None, 1),
                 (x, None, 1e-6, None, False, True),
                 (x, np.ones(3, np.float32), 1e-6, None, False, True)]:
        CALLS += 1
        try:
            r = _core._fast_rms(*args)
        except (TypeError, ValueError):
            continue
        assert r is NotImplemented, args
    for args in [(x, None, None, -1.0, False), (x, None, None, 1, False),
                 (x, np.ones(4), None, 1e-5, False), (x, None, np.ones(3, complex), 1e-5, False),
                 (x.T, None, None, 1e-5, False), (np.ones((2, 0)), None, None, 1e-5, False),
                 ([1.0, 2.0], None, None, 1e-5, False), (np.float64(1.0), None, None, 1e-5, False)]:
        CALLS += 1
        try:
            r = fast(*args)
        except (TypeError, ValueError):
            continue
        assert r is NotImplemented, args


def invalid_eps_ufunc() -> None:
    x = np.ones((2, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for eps in (-1.0, float("nan"), float("inf")):
            ok(lnc.layer_norm_ufunc, x, np.ones(3), np.zeros(3), eps)
            ok(_core._ln_none, x, eps)
            ok(lnc.rms_norm_ufunc, x, np.ones(3), eps)
            ok(lnc.rms_norm_backward_ufunc, x, x, np.ones(3), eps)
            ok(_core._rms_w, x, np.ones(3), eps)
            ok(_core._rms_none, x, eps)


def threads_and_settings() -> None:
    old_isa, old_n = lnc.get_isa(), lnc.get_num_threads()
    try:
        lnc.set_num_threads(2)
        big = np.random.default_rng(1).standard_normal((64, 16384)).astype(np.float32)
        assert big.nbytes > lnc.thread_threshold()
        ok(lnc.layer_norm, big)                      # threaded, direct rows
        ok(lnc.layer_norm, big[:, ::-1])             # threaded, staged rows
        ok(lnc.layer_norm, big.astype(np.float16))   # threaded, float16 staging
        ok(lnc.rms_norm, big)                        # RMSNorm threaded, direct rows
        ok(lnc.rms_norm, big[:, ::-1], big[0])       # threaded, staged rows
        ok(lnc.rms_norm_backward, big, big)          # threaded backward, exact sums
        if _bf16.BFLOAT16 is not None:
            ok(lnc.rms_norm, big.astype(_bf16.BFLOAT16))
            ok(lnc.layer_norm, big.astype(_bf16.BFLOAT16))
        ok(lnc.supported_isas)
        ok(lnc.get_isa)
        ok(lnc.thread_threshold)
    finally:
        lnc.set_isa(old_isa)
        lnc.set_num_threads(old_n)


def main() -> int:
    for _ in range(REPEAT):
        for isa in lnc.supported_isas():
            lnc.set_isa(isa)
            success_paths(isa)
        error_paths()
        fast_odd_arguments()
        invalid_eps_ufunc()
        threads_and_settings()
    print(f"leakcheck: {CALLS} calls ({REPEAT} rounds, ISAs {', '.join(lnc.supported_isas())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
