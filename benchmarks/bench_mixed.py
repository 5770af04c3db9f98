"""Mixed dtypes against the same-dtype call: layer_norm with float64 x and
float32 parameters (NumPy 2 promotion of a residual stream), the reverse,
and float16 x with float32 parameters, each timed side by side with the
same call on operands already in the result dtype (the work the mixed call
must match).

    python benchmarks/bench_mixed.py            # 1 thread, pinned to one core
    python benchmarks/bench_mixed.py --quick    # seconds, for the tests

Prints, per shape and mix, the median time of each call and the ratio
mixed / same-dtype (the issue's bound: 1.2). Timings are medians of
interleaved repeats; compare ratios from one run only.
"""
import argparse
import os
import statistics
import time

import numpy as np

import layernorm_c as lnc

MIXES = [  # (x dtype, parameter dtype): the result dtype is the wider
    ("float64", "float32"),
    ("float32", "float64"),
    ("float16", "float32"),
]


def _time(fn, min_time):
    n, t = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - t0
        if t >= min_time:
            return t / n
        n *= 2


def run(shapes, repeats, min_time, log=print):
    """The ratios, as {(shape, x dtype, parameter dtype): ratio}."""
    rng = np.random.default_rng(0)
    ratios = {}
    for shape in shapes:
        for xt, pt in MIXES:
            wide = np.result_type(xt, pt)
            x = rng.standard_normal(shape).astype(xt)
            w, b = (rng.uniform(0.5, 2, shape[-1]).astype(pt) for _ in range(2))
            xs, ws, bs = x.astype(wide), w.astype(wide), b.astype(wide)
            out = np.empty(shape, wide)
            mixed = lambda: lnc.layer_norm(x, w, b, out=out)
            same = lambda: lnc.layer_norm(xs, ws, bs, out=out)
            if xt == wide:  # only the parameters differ: the same x
                same = lambda: lnc.layer_norm(x, ws, bs, out=out)
            tm, ts = [], []
            for _ in range(repeats):  # interleaved
                tm.append(_time(mixed, min_time))
                ts.append(_time(same, min_time))
            m, s = statistics.median(tm), statistics.median(ts)
            ratios[(shape, xt, pt)] = m / s
            log(f"{str(shape):>12} x {xt:7} params {pt:7} -> {wide.name:7}  "
                f"mixed {m * 1e6:9.2f} us  same {s * 1e6:9.2f} us  ratio {m / s:.2f}")
    return ratios


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes, short repeats")
    args = ap.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    lnc.set_num_threads(1)
    if args.quick:
        run([(8, 64)], repeats=1, min_time=0.001)
    else:
        run([(8, 768), (64, 768), (4096, 768)], repeats=7, min_time=0.05)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
