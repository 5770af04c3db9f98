#!/usr/bin/env python
"""Benchmark layernorm_c against NumPy, PyTorch (CPU) and a plain copy.

One command runs everything in one process, side by side::

    python benchmarks/bench.py            # full run; writes the repo's result files
    python benchmarks/bench.py --quick    # small shapes, few repeats; writes to a temp dir

Every case times, round-robin within each repeat, ``np.copyto(out, x)`` (the
memory floor), ``lnc.layer_norm(x, w, b)``, the same with ``out=``, a
vectorized NumPy LayerNorm in the input dtype and
``torch.nn.functional.layer_norm`` (when torch is installed). It reports
medians, time/copy ratios and speed-ups, the peak extra memory of one large
call and the per-call latency of a tiny call. See benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass, field
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
from layernorm_c._cases import FLOAT_DTYPES  # noqa: E402  (after the import fallback)
from layernorm_c.testing import TOLERANCES  # noqa: E402

EPS = 1e-5
SEED = 20240601

FULL_SHAPES: Tuple[Tuple[int, int], ...] = (
    (1, 768), (8, 768), (64, 768), (4096, 768),
    (32 * 128, 1024), (16384, 4096), (1_000_000, 16),
)
QUICK_SHAPES: Tuple[Tuple[int, int], ...] = ((1, 768), (64, 768), (256, 1024), (20_000, 16))
#: The core's float dtypes, float32 (the common case) first, then widest first.
DTYPES = tuple(dt.name for dt in sorted(FLOAT_DTYPES, key=lambda dt: (dt.name != "float32",
                                                                    -dt.itemsize)))

#: Implementations, in table order, with their display labels.
LABELS = {
    "copy": "copy",
    "lnc": "layernorm_c",
    "lnc_out": "layernorm_c out=",
    "numpy": "NumPy",
    "torch": "torch",
}
LATENCY_LABELS = dict(LABELS, lnc_ufunc="layernorm_c gufunc")
del LATENCY_LABELS["copy"]



@dataclass
class Config:
    shapes: Sequence[Tuple[int, int]]
    dtypes: Sequence[str]
    threads: Sequence[int]
    repeats: int
    min_time: float
    memory_shape: Tuple[int, int]
    latency_min_time: float
    use_torch: bool
    quick: bool
    mode: str  # "quick", "full" (the defaults) or "custom"


@dataclass
class CaseResult:
    shape: Tuple[int, int]
    dtype: str
    threads: int
    times: Dict[str, Optional[float]]  # median seconds per call; None = n/a
    notes: Dict[str, str] = field(default_factory=dict)

    def ratio(self, num: str, den: str) -> Optional[float]:
        a, b = self.times.get(num), self.times.get(den)
        return None if a is None or b is None else a / b


# ---------------------------------------------------------------- implementations

def numpy_layer_norm(x, w, b, eps=EPS):
    """LayerNorm as a NumPy user writes it, in the input dtype."""
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    var = np.mean(np.square(xc), axis=-1, keepdims=True)
    return xc / np.sqrt(var + eps) * w + b


def float64_layer_norm(x, w, b, eps=EPS):
    """The same formula in float64: the agreement check's reference."""
    return numpy_layer_norm(*(np.asarray(a, np.float64) for a in (x, w, b)), eps)


def load_torch(enabled: bool = True):
    """torch if it is installed (and wanted), else None."""
    if not enabled:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch


def make_inputs(shape, dtype: str, seed: int = SEED):
    """x ~ N(0, 1) of ``shape``; weight and bias of shape (d,)."""
    rng = np.random.default_rng(seed)
    d = shape[-1]
    x = rng.standard_normal(shape, dtype=np.float32).astype(dtype, copy=False)
    w = (1.0 + 0.1 * rng.standard_normal(d)).astype(dtype)
    b = (0.1 * rng.standard_normal(d)).astype(dtype)
    return x, w, b


def make_impls(x, w, b, torch=None) -> Dict[str, Callable[[], object]]:
    """Zero-argument callables, one per implementation, all on (x, w, b)."""
    out = np.empty_like(x)
    impls = {
        "copy": lambda: np.copyto(out, x),
        "lnc": lambda: lnc.layer_norm(x, w, b, EPS),
        "lnc_out": lambda: lnc.layer_norm(x, w, b, EPS, out=out),
        "numpy": lambda: numpy_layer_norm(x, w, b, EPS),
    }
    if torch is not None:
        impls["torch"] = _torch_impl(torch, x, w, b)
    return impls


def _torch_impl(torch, x, w, b):
    # from_numpy shares memory: no copy is timed.
    xt, wt, bt = (torch.from_numpy(a) for a in (x, w, b))
    shape, layer_norm = (x.shape[-1],), torch.nn.functional.layer_norm
    return lambda: layer_norm(xt, shape, wt, bt, EPS)


def set_threads(n: int, torch=None) -> None:
    lnc.set_num_threads(n)
    if torch is not None:
        torch.set_num_threads(n)


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# ---------------------------------------------------------------- timing

def time_loops(fn: Callable[[], object], loops: int) -> float:
    """Seconds for ``loops`` back-to-back calls, GC off (like timeit)."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        return time.perf_counter() - t0
    finally:
        if gc_was_enabled:
            gc.enable()


def calibrate(fn: Callable[[], object], min_time: float) -> int:
    """The number of calls whose total time reaches ``min_time``."""
    loops = 1
    while True:
        t = time_loops(fn, loops)
        if t >= min_time:
            return loops
        # Aim 20% past min_time, growing at least 2x and at most 100x.
        guess = int(loops * 1.2 * min_time / max(t, 1e-9)) + 1
        loops = min(max(guess, 2 * loops), 100 * loops)


def measure(impls: Dict[str, Callable[[], object]], repeats: int,
            min_time: float) -> Dict[str, float]:
    """Median seconds per call of each implementation.

    Each repeat times every implementation once, round-robin, so a slow
    drift of the machine (other processes, clocks) touches all of them alike.
    """
    loops = {name: calibrate(fn, min_time) for name, fn in impls.items()}
    samples: Dict[str, List[float]] = {name: [] for name in impls}
    for _ in range(repeats):
        for name, fn in impls.items():
            samples[name].append(time_loops(fn, loops[name]) / loops[name])
    return {name: statistics.median(s) for name, s in samples.items()}


# ---------------------------------------------------------------- cases

def check_agreement(name: str, y, x, w, b, dtype: str, rows: int = 64) -> None:
    """Raise if ``y`` (first rows) is not LayerNorm of ``x``: we must time
    implementations that compute the same thing."""
    ref = float64_layer_norm(x[:rows], w, b)
    got = np.asarray(y[:rows], dtype=np.float64)
    # The audit's tolerance (layernorm_c.testing.TOLERANCES): what it
    # accepts from any LayerNorm implementation in this dtype.
    tol = TOLERANCES[np.dtype(dtype)]
    worst = tol.worst(got, ref)
    if not worst <= 1:
        err = float(np.max(np.abs(got - ref)))
        raise RuntimeError(f"{name} disagrees with the float64 reference on "
                           f"{x.shape} {dtype}: max error {err:.3g}, {worst:.3g} times "
                           f"the tolerance ({tol})")


def usable_impls(impls, x, w, b, dtype: str, notes: Dict[str, str]):
    """Call each implementation once (a warm-up), check its result, and drop
    torch if it cannot run this case (noted as n/a)."""
    kept = {}
    for name, fn in impls.items():
        try:
            y = fn()
        except Exception as exc:  # torch may lack a kernel (e.g. float16)
            if name != "torch":
                raise
            notes[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:120]
            continue
        if name != "copy":
            check_agreement(LATENCY_LABELS.get(name, name), y, x, w, b, dtype)
        kept[name] = fn
    return kept


def run_case(shape, dtype, threads, cfg: Config, torch, numpy_cache) -> CaseResult:
    """Time one (shape, dtype, threads) case. NumPy is single-threaded, so
    it is timed once per (shape, dtype) and reused for other thread counts."""
    set_threads(threads, torch)
    x, w, b = make_inputs(shape, dtype)
    notes: Dict[str, str] = {}
    impls = usable_impls(make_impls(x, w, b, torch), x, w, b, dtype, notes)
    key = (tuple(shape), dtype)
    if key in numpy_cache:
        del impls["numpy"]
    times = measure(impls, cfg.repeats, cfg.min_time)
    numpy_cache.setdefault(key, times.get("numpy"))
    times["numpy"] = numpy_cache[key]
    if torch is None:
        notes.setdefault("torch", "torch not installed")
    times = {name: times.get(name) for name in LABELS}
    return CaseResult(tuple(shape), dtype, threads, times, notes)


def run_cases(cfg: Config, torch, log=print) -> List[CaseResult]:
    results: List[CaseResult] = []
    numpy_cache: Dict = {}
    for shape in cfg.shapes:
        for dtype in cfg.dtypes:
            for threads in cfg.threads:
                r = run_case(shape, dtype, threads, cfg, torch, numpy_cache)
                log(summary_line(r))
                results.append(r)
    return results


def summary_line(r: CaseResult) -> str:
    parts = [f"{fmt_shape(r.shape):>13} {r.dtype:>7} {r.threads}t"]
    parts += [f"{k}={fmt_time(t)}" for k, t in r.times.items()]
    parts.append(f"lnc/copy={fmt_ratio(r.ratio('lnc', 'copy'))}")
    parts.append(f"x_torch={fmt_ratio(r.ratio('torch', 'lnc'))}")
    return "  ".join(parts)


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


def rss_child(impl: str, shape, dtype: str) -> dict:
    """Runs in a fresh process: peak RSS growth of one call minus its output."""
    torch = load_torch(impl == "torch")
    if impl == "torch" and torch is None:
        return {"extra": None, "note": "torch not installed"}
    small = make_inputs((4, shape[-1]), dtype)
    make_impls(*small, torch)[impl]()  # warm-up: lazy init, thread pools
    x, w, b = make_inputs(shape, dtype)
    fn = make_impls(x, w, b, torch)[impl]
    gc.collect()
    _reset_peak_rss()
    before = _peak_rss()
    y = fn()
    grown = _peak_rss() - before
    return {"extra": grown - x.nbytes}  # the output (or copy target) is x.nbytes


def rss_extra(impl: str, shape, dtype: str) -> Optional[int]:
    """:func:`rss_child` in a subprocess; None if it failed."""
    spec = json.dumps({"impl": impl, "shape": list(shape), "dtype": dtype})
    # A fixed glibc mmap threshold: large buffers are always fresh pages, so
    # the RSS growth sees them even if the heap holds freed memory.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()),
                           "--rss-child", spec], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])["extra"]


def measure_memory(cfg: Config, torch) -> dict:
    shape, dtype = cfg.memory_shape, "float32"
    x, w, b = make_inputs(shape, dtype)
    impls = make_impls(x, w, b, torch)
    rows = {}
    for name in ("lnc", "numpy", "torch"):
        if name not in impls:
            rows[name] = {"traced": None, "rss": None}
            continue
        traced = None if name == "torch" else traced_extra(impls[name], x.nbytes)
        rows[name] = {"traced": traced, "rss": rss_extra(name, shape, dtype)}
    return {"shape": list(shape), "dtype": dtype, "out_nbytes": x.nbytes, "rows": rows}


# ---------------------------------------------------------------- latency

def measure_latency(cfg: Config, torch) -> dict:
    """Per-call time of a (1, 768) float32 call from Python, 1 thread."""
    shape, dtype = (1, 768), "float32"
    set_threads(1, torch)
    x, w, b = make_inputs(shape, dtype)
    impls = make_impls(x, w, b, torch)
    del impls["copy"]
    ufunc, eps = lnc.layer_norm_ufunc, np.float64(EPS)
    impls["lnc_ufunc"] = lambda: ufunc(x, w, b, eps)
    impls = usable_impls(impls, x, w, b, dtype, {})
    times = measure(impls, cfg.repeats, cfg.latency_min_time)
    us = {name: times[name] * 1e6 if name in times else None for name in LATENCY_LABELS}
    return {"shape": list(shape), "dtype": dtype, "us": us}


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


def machine_info(torch) -> dict:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__ if torch is not None else "not installed",
        "layernorm_c": lnc.__version__,
        "isa": lnc.get_isa(),
        "supported_isas": list(lnc.supported_isas()),
        "thread_threshold": lnc.thread_threshold(),
        "loadavg_start": _loadavg(),
    }


def _loadavg() -> Optional[List[float]]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


# ---------------------------------------------------------------- formatting

def fmt_shape(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def fmt_time(t: Optional[float]) -> str:
    if t is None:
        return "n/a"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t * 1e9:.3g} ns"


def fmt_ratio(r: Optional[float]) -> str:
    return "n/a" if r is None else f"{r:.2f}"


def fmt_bytes(nbytes: Optional[int]) -> str:
    if nbytes is None:
        return "n/a"
    if abs(nbytes) >= 2**20:
        return f"{nbytes / 2**20:.1f} MiB"
    return f"{nbytes / 2**10:.0f} KiB"


TABLE_HEADER = [
    "shape", "dtype", "threads", "copy", "layernorm_c", "lnc out=", "NumPy", "torch",
    "lnc/copy", "out=/copy", "torch/copy", "NumPy/copy", "× NumPy", "× torch",
]


def table_rows(results: Sequence[CaseResult]) -> List[List[str]]:
    rows = []
    for r in results:
        t = r.times
        rows.append([
            fmt_shape(r.shape), r.dtype, str(r.threads),
            fmt_time(t["copy"]), fmt_time(t["lnc"]), fmt_time(t["lnc_out"]),
            fmt_time(t["numpy"]), fmt_time(t["torch"]),
            fmt_ratio(r.ratio("lnc", "copy")), fmt_ratio(r.ratio("lnc_out", "copy")),
            fmt_ratio(r.ratio("torch", "copy")), fmt_ratio(r.ratio("numpy", "copy")),
            fmt_ratio(r.ratio("numpy", "lnc")), fmt_ratio(r.ratio("torch", "lnc")),
        ])
    return rows


MEMORY_HEADER = ["implementation", "extra (tracemalloc)", "extra (peak RSS)"]


def memory_rows(memory: dict) -> List[List[str]]:
    return [[LABELS[name], fmt_bytes(m["traced"]), fmt_bytes(m["rss"])]
            for name, m in memory["rows"].items()]


LATENCY_HEADER = ["implementation", "µs per call"]


def latency_rows(latency: dict) -> List[List[str]]:
    return [[LATENCY_LABELS[name], "n/a" if us is None else f"{us:.2f}"]
            for name, us in latency["us"].items()]


def notes_lines(results: Sequence[CaseResult]) -> List[str]:
    seen = {}
    for r in results:
        for name, note in r.notes.items():
            seen.setdefault((name, note), []).append(f"{fmt_shape(r.shape)} {r.dtype}")
    lines = []
    for (name, note), cases in seen.items():
        where = "all cases" if len(cases) == len(results) else ", ".join(sorted(set(cases)))
        lines.append(f"{LABELS[name]} n/a ({where}): {note}")
    return lines


def info_lines(info: dict, cfg: Config) -> List[str]:
    return [
        f"Date (UTC): {info['date']}; mode: {cfg.mode}, "
        f"{cfg.repeats} repeats, each >= {cfg.min_time * 1e3:g} ms",
        f"CPU: {info['cpu']}; {info['usable_cpus']} usable of {info['logical_cpus']} "
        f"logical CPUs; layernorm_c ISA: {info['isa']} (supported: "
        f"{', '.join(info['supported_isas'])})",
        f"Python {info['python']}, NumPy {info['numpy']}, torch {info['torch']}, "
        f"layernorm_c {info['layernorm_c']}; {info['platform']}",
        f"Load average (1, 5, 15 min) at start: {info['loadavg_start']}, "
        f"at end: {info.get('loadavg_end')}",
    ]


# ---------------------------------------------------------------- writers

def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def rst_table(header: Sequence[str], rows: Sequence[Sequence[str]], title: str) -> str:
    def entry(cells):
        return "\n".join(("   * - " if i == 0 else "     - ") + c
                         for i, c in enumerate(cells))
    body = [entry(header)] + [entry(r) for r in rows]
    return (f".. list-table:: {title}\n   :header-rows: 1\n\n" + "\n".join(body) + "\n")


def memory_caption(memory: dict) -> str:
    return (f"Peak extra memory of one call on {fmt_shape(memory['shape'])} "
            f"{memory['dtype']}, beyond its {fmt_bytes(memory['out_nbytes'])} output")


def latency_caption(latency: dict) -> str:
    return f"Small-call latency: {fmt_shape(latency['shape'])} {latency['dtype']}, 1 thread"


def write_markdown(path: Path, info, cfg, results, memory, latency) -> None:
    parts = ["# layernorm_c benchmark results", "",
             "Generated by `python benchmarks/bench.py`; see benchmarks/README.md.", ""]
    parts += [f"- {line}" for line in info_lines(info, cfg)] + [""]
    parts += ["## Time per call (median) and ratios", "",
              markdown_table(TABLE_HEADER, table_rows(results)), ""]
    parts += [f"- {line}" for line in notes_lines(results)]
    if memory:
        parts += ["", f"## {memory_caption(memory)}", "",
                  markdown_table(MEMORY_HEADER, memory_rows(memory))]
    if latency:
        parts += ["", f"## {latency_caption(latency)}", "",
                  markdown_table(LATENCY_HEADER, latency_rows(latency))]
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")


def write_rst(path: Path, info, cfg, results, memory, latency) -> None:
    parts = [".. Generated by benchmarks/bench.py; do not edit by hand.", ""]
    parts += [f"- {line}" for line in info_lines(info, cfg)] + [""]
    parts += [rst_table(TABLE_HEADER, table_rows(results), "Time per call (median) and ratios")]
    parts += [f"- {line}" for line in notes_lines(results)] + [""]
    if memory:
        parts += [rst_table(MEMORY_HEADER, memory_rows(memory), memory_caption(memory))]
    if latency:
        parts += [rst_table(LATENCY_HEADER, latency_rows(latency), latency_caption(latency))]
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")


def write_json(path: Path, info, cfg, results, memory, latency) -> None:
    data = {
        "machine": info,
        "config": {"mode": cfg.mode, "repeats": cfg.repeats, "min_time": cfg.min_time},
        "cases": [{"shape": list(r.shape), "dtype": r.dtype, "threads": r.threads,
                   "seconds": r.times, "notes": r.notes} for r in results],
        "memory": memory,
        "latency": latency,
    }
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- plot

def _bar_panel(ax, labels, series: Dict[str, List[Optional[float]]], ylabel: str, title: str):
    """Grouped bars, one group per label, log scale, a line at 1."""
    import matplotlib.ticker
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(labels))]
        ax.bar(xs, [np.nan if v is None else v for v in values], width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    low, high = ax.get_ylim()
    if high / low < 100:  # label minor ticks only when few decades show
        ax.yaxis.set_minor_formatter(plain)
        ax.tick_params(axis="y", which="minor", labelsize=7)
    else:
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    if all(v is None for values in series.values() for v in values):
        ax.text(0.5, 0.5, "n/a", transform=ax.transAxes, ha="center", va="center")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2)


def plot(path: Path, results: Sequence[CaseResult]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r.shape for r in results))
    labels = [fmt_shape(s) for s in shapes]
    by_key = {(r.shape, r.dtype, r.threads): r for r in results}
    combos = list(dict.fromkeys((r.dtype, r.threads) for r in results))
    base = combos[0] if ("float32", 1) not in combos else ("float32", 1)

    def series(num, den, dtype, threads):
        return [by_key[(s, dtype, threads)].ratio(num, den)
                if (s, dtype, threads) in by_key else None for s in shapes]

    fig, axes = plt.subplots(3, 1, figsize=(10, 11))
    _bar_panel(axes[0], labels,
               {LABELS[k]: series(k, "copy", *base) for k in ("lnc", "lnc_out", "torch", "numpy")},
               "time / copy time", f"Time relative to np.copyto ({base[0]}, {base[1]} thread)"
               " — lower is better")
    for ax, peer in ((axes[1], "torch"), (axes[2], "numpy")):
        _bar_panel(ax, labels,
                   {f"{d}, {t} thr": series(peer, "lnc", d, t) for d, t in combos},
                   f"{LABELS[peer]} time / layernorm_c time",
                   f"Speed-up of layernorm_c over {LABELS[peer]} — higher is better")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------- command line

def parse_shapes(text: str) -> List[Tuple[int, int]]:
    """'64x768,1000000x16' -> [(64, 768), (1000000, 16)]."""
    return [tuple(int(n) for n in item.lower().split("x")) for item in text.split(",") if item]


def parse_threads(text: str) -> List[int]:
    """'1,all' -> [1, usable CPUs], duplicates removed."""
    values = [usable_cpus() if t == "all" else int(t) for t in text.split(",") if t]
    return list(dict.fromkeys(values))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="small shapes and few repeats (seconds); writes to --out-dir or a temp dir")
    p.add_argument("--out-dir", type=Path,
                   help="write results.md, results.json, bench_table.inc and bench.png here "
                        "(default: benchmarks/ and docs/ of this repo; a temp dir with --quick)")
    p.add_argument("--shapes", type=parse_shapes, help="e.g. 64x768,16384x4096")
    p.add_argument("--dtypes", type=lambda s: s.split(","), help="e.g. float32,float16")
    p.add_argument("--threads", type=parse_threads, default=None,
                   help="thread counts, e.g. 1,all (default: 1,all)")
    p.add_argument("--repeats", type=int, help="timed repeats per case (default 7; quick 3)")
    p.add_argument("--min-time", type=float,
                   help="seconds each repeat lasts at least (default 0.02; quick 0.002)")
    p.add_argument("--no-torch", action="store_true", help="do not import torch (columns n/a)")
    p.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    p.add_argument("--rss-child", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def make_config(args: argparse.Namespace) -> Config:
    quick = args.quick
    custom = any(v is not None for v in (args.shapes, args.dtypes, args.threads,
                                         args.repeats, args.min_time))
    return Config(
        shapes=args.shapes or (QUICK_SHAPES if quick else FULL_SHAPES),
        dtypes=args.dtypes or DTYPES,
        threads=args.threads or parse_threads("1,all"),
        repeats=args.repeats or (3 if quick else 7),
        min_time=args.min_time or (0.002 if quick else 0.02),
        memory_shape=(512, 1024) if quick else (16384, 4096),
        latency_min_time=0.01 if quick else 0.2,
        use_torch=not args.no_torch,
        quick=quick,
        mode="custom" if custom else ("quick" if quick else "full"),
    )


def output_paths(args: argparse.Namespace) -> Dict[str, Path]:
    if args.out_dir is None and args.quick:
        args.out_dir = Path(tempfile.mkdtemp(prefix="lnc-bench-"))
    if args.out_dir is not None:
        d = Path(args.out_dir)
        paths = {"md": d / "results.md", "json": d / "results.json",
                 "rst": d / "bench_table.inc", "png": d / "bench.png"}
    else:
        paths = {"md": HERE / "results.md", "json": HERE / "results.json",
                 "rst": REPO / "docs" / "bench_table.inc",
                 "png": REPO / "docs" / "_static" / "bench.png"}
    for p in paths.values():
        p.parent.mkdir(parents=True, exist_ok=True)
    return paths


def run(cfg: Config, paths: Dict[str, Path], with_memory: bool = True, log=print) -> dict:
    """Run every measurement, write every output; restores thread settings."""
    torch = load_torch(cfg.use_torch)
    info = machine_info(torch)
    saved = (lnc.get_num_threads(), torch.get_num_threads() if torch else None)
    grad_off = torch.inference_mode() if torch is not None else contextlib.nullcontext()
    try:
        with grad_off:
            results = run_cases(cfg, torch, log)
            latency = measure_latency(cfg, torch)
            memory = measure_memory(cfg, torch) if with_memory else None
    finally:
        lnc.set_num_threads(saved[0])
        if torch is not None:
            torch.set_num_threads(saved[1])
    info["loadavg_end"] = _loadavg()
    for write, key in ((write_markdown, "md"), (write_rst, "rst"), (write_json, "json")):
        write(paths[key], info, cfg, results, memory, latency)
    plot(paths["png"], results)
    return {"info": info, "results": results, "memory": memory, "latency": latency}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rss_child:
        spec = json.loads(args.rss_child)
        print(json.dumps(rss_child(spec["impl"], tuple(spec["shape"]), spec["dtype"])))
        return 0
    cfg, paths = make_config(args), output_paths(args)
    out = run(cfg, paths, with_memory=not args.no_memory)
    print()
    print(paths["md"].read_text(encoding="utf-8"))
    print("Wrote: " + ", ".join(str(p) for p in paths.values()))
    return 0 if out["results"] else 1


if __name__ == "__main__":
    sys.exit(main())
