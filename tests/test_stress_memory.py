"""Large inputs: a call allocates its output and (almost) nothing else.

Each measurement runs in a fresh subprocess: it builds the input, resets
the kernel's peak-RSS counter (``/proc/self/clear_refs``), makes one call
and reads the peak (``VmHWM``) back, so the growth is what the call itself
needed. It must be about the output (plus small statistics and per-row
scratch), never a copy of the input; with ``out=`` it must be about zero.

Light sizes (64 MiB inputs) run in the normal suite; LAYERNORM_C_STRESS=1
runs inputs of several GiB (skipped when the machine lacks the memory).
Linux only (procfs). Skipped under AddressSanitizer, whose shadow memory
and quarantine change RSS.
"""
from __future__ import annotations

import json
import os
import textwrap

import pytest

from subprocess_support import run_python

HEAVY = os.environ.get("LAYERNORM_C_STRESS", "") not in ("", "0")
MiB = 1 << 20
GiB = 1 << 30

pytestmark = [
    pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"),
                       reason="needs Linux procfs (VmHWM, clear_refs)"),
    pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", "")
                       or os.environ.get("LAYERNORM_C_SANITIZED") == "1",
                       reason="ASan changes RSS (shadow memory, quarantine)"),
]

CHILD = textwrap.dedent(r"""
    import json, sys
    import numpy as np
    import layernorm_c as lnc

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise KeyError(key)

    case = json.loads(sys.argv[1])
    lnc.set_num_threads(case.get("threads", 1))
    dt = np.dtype(case["dtype"])
    shape = tuple(case["shape"])
    x = np.empty(shape, dt)
    x[...] = 1.0
    x.reshape(-1)[::2] = -1.0            # touch every page, two values per record
    layout = case["layout"]
    if layout == "transposed3d":          # (a, b, d) seen as (b, a, d): a view
        x = x.transpose(1, 0, 2)
    elif layout == "reversed":
        x = x[..., ::-1]
    out = None
    if case["out"] == "new":
        out = np.empty(x.shape, dt)
        out[...] = 0.0
    elif case["out"] == "inplace":
        out = x
    kwargs = {}
    if out is not None:
        kwargs["out"] = out
    if "axis" in case:
        kwargs["axis"] = tuple(case["axis"])
    lnc.layer_norm(x[(0,) * (x.ndim - 1)][:4].copy())  # import-time caches, warm-up
    rss0 = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                      # reset VmHWM to the current RSS
    if case["entry"] == "gufunc":
        d = x.shape[-1]
        y = lnc.layer_norm_ufunc(x, np.ones(d, dt), np.zeros(d, dt), 1e-5, **kwargs)
    else:
        y = lnc.layer_norm(x, return_stats=case.get("stats", False), **kwargs)
        if case.get("stats", False):
            y = y.y
    peak = status("VmHWM")
    ok = bool(np.isfinite(y.reshape(-1)[:1024]).all())
    print(json.dumps({"growth": peak - rss0, "x_bytes": x.nbytes, "y_bytes": y.nbytes,
                      "finite": ok}))
""")


def measure(case: dict) -> dict:
    proc = run_python(["-c", CHILD, json.dumps(case)], timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def mem_available() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


# (name, case, allowed growth beyond the output, counted in output sizes)
SIZE = 6 * GiB if HEAVY else 64 * MiB


def _cases():
    f32 = {"dtype": "float32"}
    n32 = SIZE // 4
    d = 4096
    rows = n32 // d
    return [
        ("fast path", dict(f32, shape=[rows, d], layout="c", out="none", entry="api")),
        ("fast path + stats", dict(f32, shape=[rows, d], layout="c", out="none", entry="api",
                                   stats=True)),
        ("fast path, 2 threads", dict(f32, shape=[rows, d], layout="c", out="none",
                                      entry="api", threads=2)),
        ("out=", dict(f32, shape=[rows, d], layout="c", out="new", entry="api")),
        ("in place (out=x)", dict(f32, shape=[rows, d], layout="c", out="inplace",
                                  entry="api")),
        ("float16", dict(dtype="float16", shape=[rows, d], layout="c", out="none",
                         entry="api")),
        ("reversed rows (general path)", dict(f32, shape=[rows, d], layout="reversed",
                                              out="none", entry="api")),
        ("gufunc", dict(f32, shape=[rows, d], layout="c", out="none", entry="gufunc")),
        ("one huge record", dict(f32, shape=[1, n32], layout="c", out="none", entry="api")),
        ("axis=(1, 2) trailing", dict(f32, shape=[rows // 64, 64, d], layout="c", out="none",
                                      entry="api", axis=[1, 2])),
    ]


@pytest.mark.parametrize("name,case", _cases(), ids=[c[0] for c in _cases()])
def test_peak_memory_is_the_output(name, case):
    need = SIZE * (1 if case["out"] == "inplace" else 2)  # input + output
    if need * 1.25 > mem_available():
        pytest.skip(f"needs about {need / GiB:.1f} GiB free")
    r = measure(case)
    assert r["finite"]
    y = 0 if case["out"] in ("new", "inplace") else r["y_bytes"]
    # Slack: per-row scratch (4 rows of d floats at most), the statistics,
    # allocator granularity. Far below a copy of the input.
    d = case["shape"][-1] if "axis" not in case else case["shape"][1] * case["shape"][2]
    slack = 16 * MiB + 8 * d * 4 + case["shape"][0] * 16
    assert r["growth"] <= y + slack, (
        f"{name}: peak RSS grew by {r['growth'] / MiB:.1f} MiB for an output of "
        f"{y / MiB:.1f} MiB (input {r['x_bytes'] / MiB:.1f} MiB)")
    print(f"{name}: growth {r['growth'] / MiB:.1f} MiB, output {y / MiB:.1f} MiB")


def test_memory_error_is_raised_not_nan(tmp_path):
    """When the kernels' scratch rows cannot be allocated, layer_norm raises
    MemoryError; it never returns NaNs as if they were results. Rows read in
    place need no scratch at all (a contiguous float16 record is converted
    in registers), so those calls still succeed under the same limit."""
    script = textwrap.dedent(r"""
        import resource, json, warnings
        import numpy as np, layernorm_c as lnc
        d = 1 << 23
        x = np.ones((1, d), np.float16); x[0, ::2] = -1
        w32 = np.ones(d, np.float32)
        w16, b16 = np.ones(d, np.float16), np.zeros(d, np.float16)
        out = np.empty_like(x)
        out32 = np.empty(x.shape, np.float32)
        def vm():
            for l in open('/proc/self/status'):
                if l.startswith('VmSize'):
                    return int(l.split()[1]) * 1024
        lim = vm() + (48 << 20)   # no room for 2 scratch rows (2 x 64 MiB)
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        res = {}
        for name, fn, y in [
                ("fast", lambda: lnc.layer_norm(x, out=out), out),
                ("axis", lambda: lnc.layer_norm(x, axis=(0, 1), out=out), out),
                ("strided", lambda: lnc.layer_norm(x[:, ::-1], out=out), out),
                ("mixed", lambda: lnc.layer_norm(x, w32, out=out32), out32),
                ("ufunc_strided", lambda: lnc.layer_norm_ufunc(x[:, ::-1], w16, b16, 0.0, out=out),
                 out)]:
            y[...] = np.nan
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    fn()
                    # (no large temporary: there is no room for one)
                    ok = bool(y.min() == -1 and y.max() == 1 and y[0, 0] == -1)
                    res[name] = "returned, right" if ok else "returned, wrong"
                except MemoryError:
                    res[name] = "MemoryError"
        print(json.dumps(res))
    """)
    proc = run_python(["-c", script], timeout=300)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res == {"fast": "returned, right", "axis": "returned, right",
                   "strided": "MemoryError", "mixed": "MemoryError",
                   "ufunc_strided": "MemoryError"}, res
