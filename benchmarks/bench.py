#!/usr/bin/env python
"""Benchmark layernorm_c against its memory floor and the CPU peers.

One command runs everything in one process, side by side::

    python benchmarks/bench.py            # full run; writes the repo's result files
    python benchmarks/bench.py --quick    # seconds: tiny shapes, few repeats; a temp dir

Ops: layer_norm (allocating and ``out=``), layer_norm_backward, rms_norm
(both forms), rms_norm_backward. Dtypes: float32, float16, float64 and
bfloat16 (through ml_dtypes). Every case (op, shape, dtype, thread count)
is run with the process pinned to one core (1 thread) or two (2 threads),
and times, interleaved within each repeat, the memory floors (a copy of
the op's traffic, into a preallocated and into a fresh array), layernorm_c
and each peer that is installed: torch, onnxruntime, OpenVINO, JAX (jit)
and the NumPy formula. Every result is checked against the float64
reference before it is timed; a peer that disagrees, fails or is missing is
reported under the tables, not timed. A table of its own measures what
the backward's exact parameter-gradient sums cost against plain float64
sums (issue 10), another the allocating call with the output cache on and
off. See benchmarks/README.md and docs/benchmarks.rst.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _import_layernorm_c():
    """The installed layernorm_c, else the in-place build of this checkout."""
    try:
        import layernorm_c
    except ImportError:
        sys.path.insert(0, str(REPO))
        import layernorm_c
    return layernorm_c


lnc = _import_layernorm_c()
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
# The helpers, after the import fallback (they import layernorm_c).
from benchlib import impls as _impls  # noqa: E402
from benchlib import timing as _timing  # noqa: E402
from benchlib.impls import (DTYPES, LABELS, OPS, PEERS, Impl, Inputs, NotAvailable,  # noqa: E402
                            Peers, Reference, build, check, float32_data, impl_keys,
                            make_inputs, reference)
from benchlib.report import (CaseResult, fmt_ratio, fmt_shape, fmt_time,  # noqa: E402
                             plot, ratio, write_json, write_markdown, write_rst)
from benchlib.timing import (loadavg, measure, pin, steady_malloc, time_loops,  # noqa: E402
                             usable_cpus)

FULL_SHAPES: Tuple[Tuple[int, int], ...] = (
    (1, 768), (8, 768), (64, 768), (4096, 768), (4096, 1024), (16384, 4096),
    (1_000_000, 16), (1_000_000, 64),
)
QUICK_SHAPES: Tuple[Tuple[int, int], ...] = ((8, 768),)
#: The rows of the table of the exact parameter-gradient sums' cost
#: (float32, 1 thread): the LayerNorm backward's shapes and the RMSNorm
#: backward's, in a full run and with --quick.
SUMS_COST_SHAPES: Tuple[Tuple[int, int], ...] = (
    (64, 768), (4096, 768), (4096, 1024), (16384, 4096), (1_000_000, 16), (1_000_000, 64),
)
SUMS_COST_RMS_SHAPES: Tuple[Tuple[int, int], ...] = ((4096, 768),)
QUICK_SUMS_COST_SHAPES: Tuple[Tuple[int, int], ...] = ((64, 64), (256, 512))
QUICK_SUMS_COST_RMS_SHAPES: Tuple[Tuple[int, int], ...] = ((256, 512),)
#: The rows of the output cache's table (float32, allocating layer_norm;
#: the cache keeps outputs of 32 MiB or more): a full run and --quick.
CACHE_SHAPES: Tuple[Tuple[int, int], ...] = ((16384, 4096), (1_000_000, 64))
QUICK_CACHE_SHAPES: Tuple[Tuple[int, int], ...] = ((2048, 4096),)
#: layernorm_c's own implementations and the floors: a failure there stops
#: the run (a peer's failure is only reported).
OWN = ("floor", "floor_alloc", "lnc", "lnc_out", "lnc_ufunc")


@dataclass
class Config:
    ops: Sequence[str]
    shapes: Sequence[Tuple[int, int]]
    dtypes: Sequence[str]
    threads: Sequence[int]
    peers: Sequence[str]
    repeats: int
    min_time: float
    cpus: Sequence[int]  # the CPUs to pin to, first the 1-thread one
    memory_shape: Tuple[int, int]
    latency_min_time: float
    #: op name -> the shapes of its rows in the exact sums' table
    sums_cost_shapes: Dict[str, Sequence[Tuple[int, int]]]
    #: the shapes of the output cache's table
    cache_shapes: Sequence[Tuple[int, int]]
    max_call: float  # seconds: slower implementations (with a probe) are not timed
    quick: bool
    mode: str  # "quick", "full" (the defaults) or "custom"
    malloc: Optional[str] = None  # what steady_malloc() set (the command line sets it)


# ---------------------------------------------------------------- cases

def set_threads(n: int, cfg: Config, peers: Peers) -> None:
    """n threads for layernorm_c and torch, the process pinned to n CPUs."""
    pin(cfg.cpus[:n])
    lnc.set_num_threads(n)
    if peers.torch is not None:
        peers.torch.set_num_threads(n)


def forward_context(op, peers: Peers):
    """torch's inference mode for the forward ops (no autograd records)."""
    if peers.torch is None or op.backward:
        return contextlib.nullcontext()
    return peers.torch.inference_mode()


def too_slow(impl: Impl, max_call: float) -> Optional[str]:
    """Why ``impl`` is not timed, if its probe (the same call on a fraction of
    the rows) says a call would take longer than ``max_call`` seconds."""
    if impl.probe is None or not max_call:
        return None
    call, fraction = impl.probe
    call()
    estimate = time_loops(call, 1) / fraction
    if estimate <= max_call:
        return None
    return (f"not timed: a call would take over {max_call:g} s (--max-call; estimated "
            f"on 1/{round(1 / fraction)} of the rows)")


def prepare(op, inp: Inputs, ref: Reference, threads: int, keys: Sequence[str],
            peers: Peers, extra: Optional[Dict[str, Impl]] = None, max_call: float = 0.0):
    """Build, warm up and check each implementation: those that run and agree
    with the reference, the notes of those that do not, and the errors."""
    ready: Dict[str, Impl] = {}
    notes: Dict[str, str] = {}
    errors: Dict[str, float] = {}
    for key in keys:
        try:
            impl = extra[key] if extra and key in extra else build(key, op, inp, threads, peers)
            slow = too_slow(impl, max_call)
            if slow:
                raise NotAvailable(slow)
            result = impl.call()  # the warm-up call (lazy init, compilation)
            if not key.startswith("floor"):
                errors[key] = worst = check(op, ref, impl.outputs(result), inp)
                if not worst <= 1:
                    raise Disagrees(f"disagrees with the float64 reference: {worst:.3g} "
                                    f"times the tolerance")
            del result
        except NotAvailable as exc:
            if key in OWN:
                raise
            notes[key] = str(exc)
            continue
        except Exception as exc:
            if key in OWN:
                raise RuntimeError(f"{LABELS.get(key, key)} on {op.name} {inp.x.shape} "
                                   f"{inp.dtype.name}: {exc}") from exc
            notes[key] = str(exc) if isinstance(exc, Disagrees) else \
                f"failed: {_impls._first_line(exc)}"
            continue
        ready[key] = impl
    return ready, notes, errors


class Disagrees(Exception):
    """A result outside the tolerance of the float64 reference."""


def run_case(op, inp: Inputs, ref: Reference, threads: int, cfg: Config, peers: Peers,
             single: Dict[str, Tuple[float, float]]) -> CaseResult:
    """Time one case. ``single`` holds the single-threaded implementations
    (NumPy, JAX on one thread) timed in an earlier thread row of the same
    (op, shape, dtype): reused, not timed again."""
    set_threads(threads, cfg, peers)
    keys = [k for k in impl_keys(op, cfg.peers) if k not in single]
    with forward_context(op, peers):
        ready, notes, errors = prepare(op, inp, ref, threads, keys, peers,
                                       max_call=cfg.max_call)
        pin(cfg.cpus[:threads])  # threads the builders started
        times = measure({k: impl.call for k, impl in ready.items()}, cfg.repeats, cfg.min_time,
                        slow=cfg.max_call or None)
    for key, impl in ready.items():
        if impl.single_threaded:
            single[key] = (times[key], errors[key])
    for key, (t, err) in single.items():
        times.setdefault(key, t)
        errors.setdefault(key, err)
    del ready
    if inp.x.nbytes >= 1 << 26:  # let go of large peer buffers (torch graphs) now
        gc.collect()
    times = {k: times.get(k) for k in impl_keys(op, cfg.peers)}
    return CaseResult(op.name, tuple(inp.x.shape), inp.dtype.name, threads, times, notes,
                      errors, (loadavg() or [None])[0])


def run_cases(cfg: Config, peers: Peers, log=print) -> List[CaseResult]:
    """Every case; inputs made once per (shape, dtype), references once per
    (op, shape, dtype)."""
    results: List[CaseResult] = []
    for shape in cfg.shapes:
        x32, dy32 = float32_data(shape)
        for dtype in cfg.dtypes:
            try:
                inp = make_inputs(x32, dy32, dtype)
            except NotAvailable as exc:  # bfloat16 without ml_dtypes
                log(f"{dtype}: skipped ({exc})")
                continue
            for name in cfg.ops:
                op = OPS[name]
                ref = reference(op, inp)
                single: Dict[str, Tuple[float, float]] = {}
                for threads in cfg.threads:
                    r = run_case(op, inp, ref, threads, cfg, peers, single)
                    log(summary_line(r))
                    results.append(r)
            del inp
        del x32, dy32
    return results


def summary_line(r: CaseResult) -> str:
    parts = [f"{r.op:>19} {fmt_shape(r.shape):>13} {r.dtype:>8} {r.threads}t",
             f"floor={fmt_time(r.times.get('floor'))}", f"lnc={fmt_time(r.times.get('lnc'))}",
             f"lnc/floor={fmt_ratio(r.ratio('lnc', 'floor'))}"]
    parts += [f"{LABELS[p]}/lnc={fmt_ratio(r.ratio(p, 'lnc'))}" for p in PEERS if p in r.times]
    return "  ".join(parts)


# ---------------------------------------------------------------- latency

def measure_latency(cfg: Config, peers: Peers) -> dict:
    """Per-call time of layer_norm on (1, 768) float32 from Python, 1 thread:
    layernorm_c (also its out= form and the raw gufunc) and the peers."""
    op, shape = OPS["layer_norm"], (1, 768)
    set_threads(1, cfg, peers)
    inp = make_inputs(*float32_data(shape), "float32")
    ref = reference(op, inp)
    ufunc, eps = lnc.layer_norm_ufunc, np.float64(op.eps)
    x, w, b = inp.x, inp.w, inp.b
    extra = {"lnc_ufunc": Impl(lambda: ufunc(x, w, b, eps))}
    keys = ["lnc", "lnc_out", "lnc_ufunc"] + [k for k in impl_keys(op, cfg.peers)
                                              if k in PEERS]
    with forward_context(op, peers):
        ready, notes, _ = prepare(op, inp, ref, 1, keys, peers, extra)
        times = measure({k: i.call for k, i in ready.items()}, cfg.repeats,
                        cfg.latency_min_time)
    us = {k: times[k] * 1e6 if k in times else None for k in keys}
    return {"shape": list(shape), "dtype": "float32", "us": us,
            "notes": [f"{LABELS.get(k, k)} n/a: {n}" for k, n in notes.items()]}


# ---------------------------------------------------------------- cost of the exact sums

#: The ``sums`` argument of the core's private ``_backward`` for each
#: column: dx only, plain float64 sums in record order (the benchmark's
#: baseline: order-dependent, never used by the library) and the library's
#: exact sums.
SUMS_MODES = {"dx": False, "plain": 2, "exact": True}
#: Records of at most this many features go through the library's backward
#: a group of records at a time (the x86 levels) and through the plain
#: baseline one at a time: exact/plain there is not the sums' cost.
GROUPED_D = 64


def backward_calls(op, inp: Inputs) -> Dict[str, Callable[[], tuple]]:
    """The core's backward of ``op`` on ``inp`` with each of :data:`SUMS_MODES`.
    Each call returns ``(dx, dweight_state, dbias_state)``: no states for
    dx only, no dbias state for RMSNorm."""
    rms = not op.centered
    return {key: partial(lnc._core._backward, inp.dy, inp.x, inp.w, op.eps, None, sums, rms)
            for key, sums in SUMS_MODES.items()}


def plain_sums(state: np.ndarray) -> np.ndarray:
    """The plain baseline's sums from its state: each feature's last word,
    the float64 sum an exact state keeps aside for huge terms, where the
    baseline adds every term (its exact levels stay zero, so
    :class:`layernorm_c.ExactSum` would read zeros)."""
    return state[:, -1].view(np.float64)


def plain_problem(op, got: Dict[str, tuple]) -> Optional[str]:
    """Why the plain baseline does not compute what the exact call does (its
    dx is not dx only's bit for bit, or its sums are further than 1e-6 of
    the largest from the exact ones), or None. ``got``: each call's result.
    Raises if the exact call's dx is not dx only's: the library's own."""
    dx = got["dx"][0]
    if not np.array_equal(got["exact"][0], dx):
        raise RuntimeError(f"{op.name} {fmt_shape(dx.shape)}: dx with the exact sums differs "
                           f"from dx alone")
    if not np.array_equal(got["plain"][0], dx):
        return "its dx differs from dx alone"
    for i, grad in enumerate(op.grads, start=1):  # dweight, and dbias for LayerNorm
        exact = lnc.ExactSum((dx.shape[1],), got["exact"][i]).value(np.float64)
        plain = plain_sums(got["plain"][i])
        off = np.abs(plain - exact).max() / np.abs(exact).max()
        if not off <= 1e-6:
            zero = " (it is all zero)" if not plain.any() else ""
            return (f"its {grad} differs from the exact one by {off:.3g} of the largest exact "
                    f"value{zero}")
    return None


def sums_cost_row(op, shape: Tuple[int, int], cfg: Config) -> Tuple[dict, Optional[str]]:
    """One row of the table: the three calls on ``shape`` float32 with the
    gain, checked (:func:`plain_problem`) then timed side by side; and a
    note if the plain baseline was not timed."""
    inp = make_inputs(*float32_data(shape), "float32")
    calls = backward_calls(op, inp)
    problem = plain_problem(op, {k: call() for k, call in calls.items()})  # the warm-up calls
    if problem:
        del calls["plain"]
    times = measure(calls, cfg.repeats, cfg.min_time, slow=cfg.max_call or None)
    seconds = {k: times.get(k) for k in SUMS_MODES}
    ratios = {"exact/plain": ratio(seconds["exact"], seconds["plain"]),
              "exact/dx": ratio(seconds["exact"], seconds["dx"])}
    note = f"{op.name} {fmt_shape(shape)}: plain sums not timed: {problem}" if problem else None
    return {"op": op.name, "shape": list(shape), "seconds": seconds, "ratios": ratios}, note


def measure_sums_cost(cfg: Config, peers: Peers) -> dict:
    """What the backward's exact parameter-gradient sums cost (issue 10):
    float32, 1 thread, the core's backward with dx only, with plain float64
    sums in record order and with the exact sums."""
    set_threads(1, cfg, peers)
    rows, notes = [], []
    for name, shapes in cfg.sums_cost_shapes.items():
        for shape in shapes:
            row, note = sums_cost_row(OPS[name], shape, cfg)
            rows.append(row)
            notes += [note] if note else []
    short = [fmt_shape(r["shape"]) for r in rows if r["shape"][1] <= GROUPED_D]
    if short:
        notes.append(f"{', '.join(short)}: exact/plain is not the cost of the sums here: the "
                     f"plain baseline takes records of up to {GROUPED_D} features one at a time, "
                     f"the library's backward (x86 levels) a group of records at a time; read "
                     f"exact/dx only")
    return {"dtype": "float32", "threads": 1, "rows": rows, "notes": notes}


# ---------------------------------------------------------------- the output cache

def output_cache_row(shape: Tuple[int, int], threads: int, cfg: Config, peers: Peers) -> dict:
    """layer_norm's allocating call on ``shape`` float32 with the output
    cache on (the loop's freed outputs are written again) and off (every
    output in fresh pages), each timed side by side with ``x.copy()`` (the
    fresh array's floor) and the ``out=`` call; the results checked against
    ``out=``'s first, bit for bit."""
    set_threads(threads, cfg, peers)
    inp = make_inputs(*float32_data(shape), "float32")
    x, w, b, eps = inp.x, inp.w, inp.b, OPS["layer_norm"].eps
    out = np.empty_like(x)
    calls = {"copy": x.copy, "out": partial(lnc.layer_norm, x, w, b, eps, out=out),
             "alloc": partial(lnc.layer_norm, x, w, b, eps)}
    limit = lnc.get_output_cache().limit
    seconds = {}
    try:
        for state, bytes_kept in (("on", limit or 1 << 30), ("off", 0)):
            lnc.set_output_cache(bytes_kept)
            if not np.array_equal(calls["alloc"](), calls["out"]()):
                raise RuntimeError(f"layer_norm {fmt_shape(shape)}: the allocating call with "
                                   f"the cache {state} differs from out=")
            seconds[state] = measure(calls, cfg.repeats, cfg.min_time)
    finally:
        lnc.set_output_cache(limit)
    ratios = {f"{state}/copy": ratio(seconds[state]["alloc"], seconds[state]["copy"])
              for state in seconds}
    return {"shape": list(shape), "threads": threads, "seconds": seconds, "ratios": ratios}


def measure_output_cache(cfg: Config, peers: Peers) -> dict:
    """The allocating call with the output cache on and off (float32), at
    each thread count of the run."""
    rows = [output_cache_row(shape, n, cfg, peers) for shape in cfg.cache_shapes
            for n in cfg.threads]
    return {"dtype": "float32", "rows": rows}


# ---------------------------------------------------------------- memory

def traced_extra(fn: Callable[[], object], out_nbytes: int) -> Optional[int]:
    """tracemalloc peak during one call minus the output's size, in bytes.

    NumPy reports its array buffers to tracemalloc, so this sees every
    array layernorm_c and the NumPy formula allocate; torch's allocator is
    not traced (None is returned when nothing was seen)."""
    fn()
    gc.collect()
    tracemalloc.start()
    try:
        y = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del y
    return peak - out_nbytes if peak >= out_nbytes else None


def _reset_peak_rss() -> bool:
    """Reset this process's peak RSS (Linux >= 4.0); False if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    """Peak resident set size of this process, in bytes."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024


MEMORY_IMPLS = ("lnc", "numpy", "torch")


def _memory_impl(key: str, shape, peers: Peers) -> Tuple[Impl, Inputs]:
    inp = make_inputs(*float32_data(shape), "float32")
    return build(key, OPS["layer_norm"], inp, 1, peers), inp


def rss_child(key: str, shape) -> dict:
    """Runs in a fresh process: peak RSS growth of one call minus its output."""
    peers = Peers([key])
    try:
        _memory_impl(key, (4, shape[-1]), peers)[0].call()  # warm-up: lazy init, pools
        impl, inp = _memory_impl(key, shape, peers)
    except NotAvailable as exc:
        return {"extra": None, "note": str(exc)}
    gc.collect()
    _reset_peak_rss()
    before = _peak_rss()
    y = impl.call()
    grown = _peak_rss() - before
    del y
    return {"extra": grown - inp.x.nbytes}


def rss_extra(key: str, shape) -> Optional[int]:
    """:func:`rss_child` in a subprocess; None if it failed."""
    spec = json.dumps({"impl": key, "shape": list(shape)})
    # A fixed glibc mmap threshold: large buffers are always fresh pages, so
    # the RSS growth sees them even if the heap holds freed memory.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()),
                           "--rss-child", spec], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])["extra"]


def measure_memory(cfg: Config, peers: Peers) -> dict:
    shape = cfg.memory_shape
    rows = {}
    for key in MEMORY_IMPLS:
        if key != "lnc" and key not in cfg.peers:
            continue
        try:
            impl, inp = _memory_impl(key, shape, peers)
        except NotAvailable:
            rows[key] = {"traced": None, "rss": None}
            continue
        traced = None if key == "torch" else traced_extra(impl.call, inp.x.nbytes)
        del impl, inp
        # --quick: a fresh process for layernorm_c only (importing a peer
        # into a child costs seconds).
        rss = rss_extra(key, shape) if key == "lnc" or not cfg.quick else None
        rows[key] = {"traced": traced, "rss": rss}
    nbytes = int(np.prod(shape)) * 4
    return {"shape": list(shape), "dtype": "float32", "out_nbytes": nbytes, "rows": rows}


# ---------------------------------------------------------------- machine

def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(cfg: Config, peers: Peers) -> dict:
    versions = {}
    for p in peers.selected:
        versions[p] = peers.versions.get(p) or peers.missing.get(p, "n/a")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(usable_cpus()),
        "pinned": [",".join(str(c) for c in cfg.cpus[:n]) for n in cfg.threads],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "versions": versions,
        "torch": peers.versions.get("torch", "not installed"),
        "layernorm_c": lnc.__version__,
        "isa": lnc.get_isa(),
        "supported_isas": list(lnc.supported_isas()),
        "thread_threshold": lnc.thread_threshold(),
        "loadavg_start": loadavg(),
        "malloc": cfg.malloc,
    }


# ---------------------------------------------------------------- command line

def parse_shapes(text: str) -> List[Tuple[int, int]]:
    """'64x768,1000000x16' -> [(64, 768), (1000000, 16)]."""
    shapes = []
    for item in text.split(","):
        if item:
            try:
                shape = tuple(int(n) for n in item.lower().split("x"))
            except ValueError:
                raise argparse.ArgumentTypeError(f"shape {item!r}: expected ROWSxD, e.g. 64x768")
            if len(shape) != 2 or min(shape) < 1:
                raise argparse.ArgumentTypeError(f"shape {item!r}: expected ROWSxD, e.g. 64x768")
            shapes.append(shape)
    return shapes


def parse_threads(text: str) -> List[int]:
    """'1,all' -> [1, usable CPUs], duplicates removed."""
    values = [len(usable_cpus()) if t == "all" else int(t) for t in text.split(",") if t]
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"thread counts must be >= 1, got {text!r}")
    return list(dict.fromkeys(values))


def _choices(allowed: Sequence[str], what: str):
    def parse(text: str) -> List[str]:
        items = [t for t in text.split(",") if t]
        bad = [t for t in items if t not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(bad)}; expected some of {', '.join(allowed)}")
        return list(dict.fromkeys(items))
    return parse


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes, few short repeats (seconds); writes to --out-dir or a "
                        "temp dir")
    p.add_argument("--out-dir", type=Path,
                   help="write every output file here (default: benchmarks/ and docs/ of "
                        "this repo; a temp dir with --quick)")
    p.add_argument("--ops", type=_choices(tuple(OPS), "op"),
                   help=f"ops (default all: {','.join(OPS)})")
    p.add_argument("--shapes", type=parse_shapes, help="e.g. 64x768,16384x4096")
    p.add_argument("--dtypes", type=_choices(DTYPES, "dtype"),
                   help=f"dtypes (default all: {','.join(DTYPES)})")
    p.add_argument("--peers", type=_choices(PEERS, "peer"),
                   help=f"peers (default all: {','.join(PEERS)}; missing ones are n/a)")
    p.add_argument("--no-torch", action="store_true", help="leave torch out of the peers")
    p.add_argument("--threads", type=parse_threads, default=None,
                   help="thread counts, e.g. 1 or 1,2 (default: 1,all)")
    p.add_argument("--cpu", type=int, default=None,
                   help="the CPU 1-thread cases are pinned to (default: the first usable; "
                        "n-thread cases use it and the next usable ones)")
    p.add_argument("--repeats", type=int, help="timed repeats per case (default 5; quick 3)")
    p.add_argument("--min-time", type=float,
                   help="seconds each measurement lasts at least (default 0.02; quick 0.001)")
    p.add_argument("--max-call", type=float, default=0.5,
                   help="do not time the NumPy formula where a call would take longer than "
                        "this many seconds (estimated on 1/16 of the rows), and time other "
                        "implementations that slow 3 times only (default 0.5; 0: no limit)")
    p.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    p.add_argument("--no-latency", action="store_true", help="skip the (1, 768) latency table")
    p.add_argument("--no-sums-cost", action="store_true",
                   help="skip the table of the exact parameter-gradient sums' cost")
    p.add_argument("--no-output-cache", action="store_true",
                   help="skip the table of the allocating call with the output cache on and off")
    p.add_argument("--rss-child", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def make_config(args: argparse.Namespace) -> Config:
    quick = args.quick
    custom = any(v is not None for v in (args.ops, args.shapes, args.dtypes, args.peers,
                                         args.threads, args.repeats, args.min_time))
    custom = custom or args.no_torch
    cpus = usable_cpus()
    if args.cpu is not None:
        if args.cpu not in cpus:
            raise SystemExit(f"--cpu {args.cpu}: not a CPU this process may use ({cpus})")
        cpus = [args.cpu] + [c for c in cpus if c != args.cpu]
    threads = args.threads or parse_threads("1,all")
    if max(threads) > len(cpus):
        raise SystemExit(f"--threads {max(threads)}: only {len(cpus)} usable CPUs")
    peers = args.peers or list(PEERS)
    if args.no_torch:
        peers = [p for p in peers if p != "torch"]
    return Config(
        ops=args.ops or list(OPS),
        shapes=args.shapes or (QUICK_SHAPES if quick else FULL_SHAPES),
        dtypes=args.dtypes or list(DTYPES),
        threads=threads,
        peers=peers,
        repeats=args.repeats or (3 if quick else 5),
        min_time=args.min_time or (0.001 if quick else 0.02),
        cpus=cpus,
        memory_shape=(512, 1024) if quick else (16384, 4096),
        latency_min_time=0.005 if quick else 0.2,
        sums_cost_shapes={
            "layer_norm_backward": QUICK_SUMS_COST_SHAPES if quick else SUMS_COST_SHAPES,
            "rms_norm_backward": QUICK_SUMS_COST_RMS_SHAPES if quick else SUMS_COST_RMS_SHAPES,
        },
        cache_shapes=QUICK_CACHE_SHAPES if quick else CACHE_SHAPES,
        max_call=args.max_call,
        quick=quick,
        mode="custom" if custom else ("quick" if quick else "full"),
    )


def output_paths(args: argparse.Namespace) -> Dict[str, Path]:
    """results.md, results.json, bench_table.inc (layer_norm, latency,
    memory, the exact sums' cost), bench_<op>.inc per other op and bench.png."""
    if args.out_dir is None and args.quick:
        args.out_dir = Path(tempfile.mkdtemp(prefix="lnc-bench-"))
    if args.out_dir is not None:
        d = Path(args.out_dir)
        md, docs, static = d, d, d
    else:
        md, docs, static = HERE, REPO / "docs", REPO / "docs" / "_static"
    paths = {"md": md / "results.md", "json": md / "results.json",
             "rst": docs / "bench_table.inc", "png": static / "bench.png"}
    for op in OPS:
        if op != "layer_norm":
            paths[f"rst_{op}"] = docs / f"bench_{op}.inc"
    for p in paths.values():
        p.parent.mkdir(parents=True, exist_ok=True)
    return paths


def run(cfg: Config, paths: Dict[str, Path], with_memory: bool = True,
        with_latency: bool = True, with_sums_cost: bool = True, with_output_cache: bool = True,
        log=print) -> dict:
    """Run every measurement and write every output; restores the thread
    settings, the CPU affinity and JAX's x64 mode."""
    start = time.perf_counter()
    peers = Peers(cfg.peers)
    affinity = usable_cpus()
    saved_threads = lnc.get_num_threads()
    try:
        peers.load_all()
        torch = peers.torch
        saved_torch = torch.get_num_threads() if torch is not None else None
        info = machine_info(cfg, peers)
        if "bfloat16" in cfg.dtypes and _impls.bfloat16() is None:
            info["notes"] = ["bfloat16 not measured: ml_dtypes not installed"]
        try:
            results = run_cases(cfg, peers, log)
            latency = measure_latency(cfg, peers) if with_latency else None
            sums_cost = measure_sums_cost(cfg, peers) if with_sums_cost else None
            cache = measure_output_cache(cfg, peers) if with_output_cache else None
            pin(affinity)
            memory = measure_memory(cfg, peers) if with_memory else None
        finally:
            if torch is not None:
                torch.set_num_threads(saved_torch)
    finally:
        lnc.set_num_threads(saved_threads)
        pin(affinity)
        peers.close()
    info["loadavg_end"] = loadavg()
    info["run_seconds"] = round(time.perf_counter() - start, 1)
    write_markdown(paths["md"], info, cfg, results, memory, latency, sums_cost, cache)
    write_rst(paths, info, cfg, results, memory, latency, sums_cost, cache)
    write_json(paths["json"], info, cfg, results, memory, latency, sums_cost, cache)
    plot(paths["png"], results)
    return {"info": info, "results": results, "memory": memory, "latency": latency,
            "sums_cost": sums_cost, "output_cache": cache}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rss_child:
        spec = json.loads(args.rss_child)
        print(json.dumps(rss_child(spec["impl"], tuple(spec["shape"]))))
        return 0
    cfg, paths = make_config(args), output_paths(args)
    cfg.malloc = steady_malloc()  # before the peers start their threads
    out = run(cfg, paths, with_memory=not args.no_memory, with_latency=not args.no_latency,
              with_sums_cost=not args.no_sums_cost, with_output_cache=not args.no_output_cache)
    print()
    print(paths["md"].read_text(encoding="utf-8"))
    print("Wrote: " + ", ".join(str(p) for p in paths.values()))
    return 0 if out["results"] else 1


if __name__ == "__main__":
    sys.exit(main())
