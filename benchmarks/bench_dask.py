"""Throughput of the out-of-core paths against the in-memory call.

On one float32 array of ``--gb`` gigabytes (records of ``--d`` features),
in one run, side by side:

* ``in-memory``: ``layer_norm`` on the whole array, already in memory
  (the reference: 1.00);
* ``normalize``: ``python -m layernorm_c normalize`` from a .npy file to a
  .npy file (in this process, so the file reads and writes count), with no
  workers, then ``--workers 1`` and ``--workers 2`` (their times include
  starting the local cluster, about a second);
* ``dask threads``: ``layer_norm`` of a dask array of the in-memory array,
  computed by the threaded scheduler into a NumPy array;
* ``dask 1 / 2 workers``: the same on a ``distributed.LocalCluster`` of 1
  and 2 processes (one thread each), the array read by the workers from the
  .npy file and the result stored into a .npy file (``da.store``).

Every time is the best of ``--repeat`` runs; the ratios are the in-memory
time over each path's time (1.00: as fast as in memory). The machine's
load, the disk and the page cache weigh heavily on the file paths: compare
ratios from one run only.

    python benchmarks/bench_dask.py --gb 0.25 --repeat 1     # a quick look
    python benchmarks/bench_dask.py --gb 4                    # the real run
"""
from __future__ import annotations

import argparse
import io
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import numpy as np

try:
    import layernorm_c as lnc
except ImportError:  # the in-place build of this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import layernorm_c as lnc


def _best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _make_input(path: Path, rows: int, d: int) -> None:
    """A .npy file written in slabs (never the whole array at once)."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": (rows, d)})
        rng = np.random.default_rng(0)
        step = max(1, (64 << 20) // (4 * d))
        for s in range(0, rows, step):
            n = min(step, rows - s)
            f.write((rng.standard_normal((n, d), np.float32) * 2 + 5).tobytes())


def _npy_reader(path: str, rows: int, d: int, chunk: int):
    """A dask array reading its blocks from the .npy file (in the workers)."""
    import dask.array as da
    from layernorm_c import _normalize

    src = _normalize._open_source(path)

    def block(block_info=None):
        (start, stop), _ = block_info[None]["array-location"]
        return _normalize._read_slab(src, start, stop)

    chunks = (tuple(min(chunk, rows - s) for s in range(0, rows, chunk)), (d,))
    return da.map_blocks(block, chunks=chunks, dtype=np.float32,
                         meta=np.empty((0, 0), np.float32))


class _NpyWriter:
    """A da.store target writing blocks into a pre-sized .npy file."""

    def __init__(self, path: str, rows: int, d: int):
        self.path, self.d = path, d
        with open(path, "wb") as f:
            np.lib.format.write_array_header_1_0(
                f, {"descr": "<f4", "fortran_order": False, "shape": (rows, d)})
            self.offset = f.tell()
            f.truncate(self.offset + rows * d * 4)

    def __setitem__(self, key, value):
        start = key[0].start or 0
        with open(self.path, "r+b") as f:
            f.seek(self.offset + start * self.d * 4)
            f.write(np.ascontiguousarray(value, np.float32).tobytes())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=1.0, help="input size in GB (default 1)")
    ap.add_argument("--d", type=int, default=1024, help="features per record (default 1024)")
    ap.add_argument("--chunk-mb", type=float, default=64.0, help="chunk size (default 64)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per path (default 3)")
    ap.add_argument("--dir", default=None, help="where the files go (default: a temporary "
                    "directory; needs 2x --gb free)")
    args = ap.parse_args()

    rows = int(args.gb * 2 ** 30) // (4 * args.d)
    nbytes = rows * args.d * 4
    chunk = max(1, int(args.chunk_mb * 2 ** 20) // (4 * args.d))
    where = Path(tempfile.mkdtemp(prefix="bench_dask_", dir=args.dir))
    if shutil.disk_usage(where).free < 2.2 * nbytes:
        print(f"not enough disk in {where} for 2 x {nbytes / 1e9:.1f} GB", file=sys.stderr)
        return 1
    results: Dict[str, float] = {}
    try:
        src = where / "x.npy"
        _make_input(src, rows, args.d)
        x = np.load(src)
        want = lnc.layer_norm(x)  # also a warm-up
        results["in-memory"] = _best(lambda: lnc.layer_norm(x), args.repeat)

        from layernorm_c import _normalize

        def run_normalize(*extra: str) -> None:
            out = where / "y.npy"
            code = _normalize.main([str(src), str(out), "--overwrite", "--quiet",
                                    "--chunk-mb", str(args.chunk_mb), *extra],
                                   stream=io.StringIO())
            assert code == 0

        results["normalize"] = _best(run_normalize, args.repeat)
        assert np.load(where / "y.npy").tobytes() == want.tobytes()
        try:
            import dask
            import dask.array as da
            import distributed
        except ImportError:
            print("dask/distributed not installed: only normalize is measured",
                  file=sys.stderr)
        else:
            for n in (1, 2):
                results[f"normalize --workers {n}"] = _best(
                    lambda: run_normalize("--workers", str(n)), args.repeat)
                assert np.load(where / "y.npy").tobytes() == want.tobytes()
            xd = da.from_array(x, chunks=(chunk, args.d))
            results["dask threads"] = _best(
                lambda: lnc.layer_norm(xd).compute(scheduler="threads"), args.repeat)
            for n in (1, 2):
                with distributed.LocalCluster(n_workers=n, threads_per_worker=1,
                                              processes=True, dashboard_address=None) as c, \
                        distributed.Client(c):
                    def run_cluster() -> None:
                        y = lnc.layer_norm(_npy_reader(str(src), rows, args.d, chunk))
                        da.store(y, _NpyWriter(str(where / "yd.npy"), rows, args.d),
                                 lock=False)
                    results[f"dask {n} worker{'s' * (n > 1)}"] = _best(run_cluster,
                                                                       args.repeat)
                assert np.load(where / "yd.npy").tobytes() == want.tobytes()
    finally:
        shutil.rmtree(where, ignore_errors=True)

    base = results["in-memory"]
    print(f"float32 ({rows:,}, {args.d}) = {nbytes / 1e9:.2f} GB, chunks of "
          f"{args.chunk_mb:g} MB, best of {args.repeat}; kernel threads "
          f"{lnc.get_num_threads()} ({lnc.get_isa()}), {os.cpu_count()} CPUs")
    print(f"  {'path':<24} {'time s':>8} {'GB/s':>7} {'in-memory / path':>17}")
    for name, t in results.items():
        print(f"  {name:<24} {t:8.2f} {nbytes / t / 1e9:7.2f} {base / t:17.2f}")
    print("  all results bit-identical to the in-memory call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
