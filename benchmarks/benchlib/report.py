"""The benchmark's tables (markdown and reStructuredText), JSON and plot."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .impls import LABELS, OPS, PEERS

FLOORS = {
    False: ("np.copyto(out, x)", "x.copy()"),
    True: ("np.add(x, dy, out=dx) on the bits", "np.add(x, dy) on the bits"),
}


@dataclass
class CaseResult:
    op: str
    shape: Tuple[int, ...]
    dtype: str
    threads: int
    times: Dict[str, Optional[float]]  # median seconds per call; None = n/a
    notes: Dict[str, str] = field(default_factory=dict)
    #: Each checked implementation's largest error, in tolerance units.
    errors: Dict[str, float] = field(default_factory=dict)
    loadavg: Optional[float] = None

    def ratio(self, num: str, den: str) -> Optional[float]:
        return ratio(self.times.get(num), self.times.get(den))


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """a / b; None where either is n/a (or b is not positive)."""
    return None if a is None or b is None or b <= 0 else a / b


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


def op_results(results: Sequence[CaseResult], op: str) -> List[CaseResult]:
    return [r for r in results if r.op == op]


def keys_of(results: Sequence[CaseResult]) -> List[str]:
    """Implementation keys present in ``results``, in table order."""
    seen = {k for r in results for k in r.times}
    return [k for k in LABELS if k in seen]


def peers_of(results: Sequence[CaseResult]) -> List[str]:
    return [k for k in keys_of(results) if k in PEERS]


def ratio_header(op: str, results: Sequence[CaseResult]) -> List[str]:
    head = ["shape", "dtype", "threads", "floor", "layernorm_c", "lnc/floor"]
    if not OPS[op].backward:
        head.append("out=/floor")
    head.append("lnc/alloc floor")
    return head + [f"{LABELS[p]}/lnc" for p in peers_of(results)]


def ratio_rows(op: str, results: Sequence[CaseResult]) -> List[List[str]]:
    peers = peers_of(results)
    rows = []
    for r in results:
        row = [fmt_shape(r.shape), r.dtype, str(r.threads), fmt_time(r.times.get("floor")),
               fmt_time(r.times.get("lnc")), fmt_ratio(r.ratio("lnc", "floor"))]
        if not OPS[op].backward:
            row.append(fmt_ratio(r.ratio("lnc_out", "floor")))
        row.append(fmt_ratio(r.ratio("lnc", "floor_alloc")))
        row += [fmt_ratio(r.ratio(p, "lnc")) for p in peers]
        rows.append(row)
    return rows


def time_header(results: Sequence[CaseResult]) -> List[str]:
    return ["shape", "dtype", "threads"] + [LABELS[k] for k in keys_of(results)]


def time_rows(results: Sequence[CaseResult]) -> List[List[str]]:
    keys = keys_of(results)
    return [[fmt_shape(r.shape), r.dtype, str(r.threads)]
            + [fmt_time(r.times.get(k)) for k in keys] for r in results]


DISAGREES = re.compile(r"(disagrees with the float64 reference: )([0-9.e+-]+|inf|nan)( times .*)")


def notes_lines(results: Sequence[CaseResult]) -> List[str]:
    """Why a cell is n/a, grouped: 'torch n/a (float16): reason'."""
    by_note: Dict[Tuple[str, str], set] = {}
    worst: Dict[Tuple[str, str], float] = {}
    for r in results:
        for key, note in r.notes.items():
            # A disagreement's figure varies by case: one line per peer,
            # with the largest figure.
            m = DISAGREES.match(note)
            if m:
                note = m.group(1) + "{}" + m.group(3)
                k = (key, note)
                worst[k] = max(worst.get(k, 0.0), float(m.group(2)))
            by_note.setdefault((key, note), set()).add((r.shape, r.dtype))
    shapes_of: Dict[str, set] = {}
    for r in results:
        shapes_of.setdefault(r.dtype, set()).add(r.shape)
    lines = []
    for (key, note), cases in by_note.items():
        parts = []
        for dtype in dict.fromkeys(r.dtype for r in results):
            shapes = {s for s, d in cases if d == dtype}
            if not shapes:
                continue
            if shapes == shapes_of[dtype]:
                parts.append(dtype)
            else:
                parts.append(f"{dtype} " + ", ".join(fmt_shape(s) for s in sorted(shapes)))
        every = {(r.shape, r.dtype) for r in results}
        where = "all cases" if cases == every else "; ".join(parts)
        if (key, note) in worst:
            note = note.format(f"up to {worst[(key, note)]:.3g}")
        lines.append(f"{LABELS.get(key, key)} n/a ({where}): {note}")
    return lines


def info_lines(info: dict, cfg) -> List[str]:
    versions = ", ".join(f"{LABELS.get(k, k)} {v}" for k, v in info["versions"].items())
    lines = []
    if cfg.mode != "full":
        lines.append(f"**A {cfg.mode} run, not the full benchmark: rerun "
                     "`python benchmarks/bench.py` for the figures.**")
    lines += [
        f"Date (UTC): {info['date']}; mode: {cfg.mode}, medians of {cfg.repeats} "
        f"interleaved measurements, each >= {cfg.min_time * 1e3:g} ms after an untimed call; "
        + (info.get("malloc") or "the C heap as the process left it"),
        f"CPU: {info['cpu']}; {info['usable_cpus']} usable of {info['logical_cpus']} logical "
        f"CPUs; pinned to CPU {info['pinned'][0]} (1 thread)"
        + (f", CPUs {info['pinned'][1]} (2 threads)" if len(info['pinned']) > 1 else "")
        + f"; layernorm_c ISA: {info['isa']} (supported: {', '.join(info['supported_isas'])})",
        f"Python {info['python']}, layernorm_c {info['layernorm_c']}, {versions}; "
        f"{info['platform']}",
        f"Load average (1, 5, 15 min) at start: {info['loadavg_start']}, "
        f"at end: {info.get('loadavg_end')}; the run took {info.get('run_seconds')} s",
    ]
    return lines + list(info.get("notes", []))


# ---------------------------------------------------------------- writers

def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def rst_table(header: Sequence[str], rows: Sequence[Sequence[str]], title: str) -> str:
    def entry(cells):
        return "\n".join(("   * - " if i == 0 else "     - ") + c for i, c in enumerate(cells))
    body = [entry(header)] + [entry(r) for r in rows]
    return f".. list-table:: {title}\n   :header-rows: 1\n\n" + "\n".join(body) + "\n"


def op_title(op: str) -> str:
    floor, alloc = FLOORS[OPS[op].backward]
    return f"{op}: median time per call and ratios (floor: {floor}; alloc floor: {alloc})"


MEMORY_HEADER = ["implementation", "extra (tracemalloc)", "extra (peak RSS)"]
LATENCY_HEADER = ["implementation", "µs per call"]
LATENCY_LABELS = dict(LABELS, lnc_ufunc="layernorm_c gufunc")
SUMS_COST_HEADER = ["shape", "op", "dx only", "plain sums", "exact sums", "exact/plain",
                    "exact/dx only"]


CACHE_HEADER = ["shape", "threads", "x.copy()", "out=", "allocating, cache on",
                "allocating, cache off", "on / x.copy()", "off / x.copy()"]


def cache_rows(cache: dict) -> List[List[str]]:
    """x.copy() and out= as timed beside the cache-on call (the cache-off
    call had its own x.copy(), which its ratio uses)."""
    rows = []
    for r in cache["rows"]:
        on, off, q = r["seconds"]["on"], r["seconds"]["off"], r["ratios"]
        rows.append([fmt_shape(r["shape"]), str(r["threads"]), fmt_time(on["copy"]),
                     fmt_time(on["out"]), fmt_time(on["alloc"]), fmt_time(off["alloc"]),
                     fmt_ratio(q["on/copy"]), fmt_ratio(q["off/copy"])])
    return rows


def cache_caption(cache: dict) -> str:
    return (f"Output cache: allocating layer_norm ({cache['dtype']}) with freed outputs "
            f"reused and with fresh pages")


def memory_rows(memory: dict) -> List[List[str]]:
    return [[LABELS[name], fmt_bytes(m["traced"]), fmt_bytes(m["rss"])]
            for name, m in memory["rows"].items()]


def latency_rows(latency: dict) -> List[List[str]]:
    return [[LATENCY_LABELS[name], "n/a" if us is None else f"{us:.2f}"]
            for name, us in latency["us"].items()]


def sums_cost_rows(sums_cost: dict) -> List[List[str]]:
    rows = []
    for r in sums_cost["rows"]:
        t, q = r["seconds"], r["ratios"]
        rows.append([fmt_shape(r["shape"]), r["op"], fmt_time(t["dx"]), fmt_time(t["plain"]),
                     fmt_time(t["exact"]), fmt_ratio(q["exact/plain"]),
                     fmt_ratio(q["exact/dx"])])
    return rows


def memory_caption(memory: dict) -> str:
    return (f"Peak extra memory of one layer_norm call on {fmt_shape(memory['shape'])} "
            f"{memory['dtype']}, beyond its {fmt_bytes(memory['out_nbytes'])} output")


def latency_caption(latency: dict) -> str:
    return (f"Small-call latency: layer_norm on {fmt_shape(latency['shape'])} "
            f"{latency['dtype']}, 1 thread")


def sums_cost_caption(sums_cost: dict) -> str:
    return (f"Exact parameter-gradient sums: cost against plain float64 sums "
            f"({sums_cost['dtype']}, {sums_cost['threads']} thread)")


def md_section(caption: str, header, rows, notes: Sequence[str] = ()) -> List[str]:
    """A '## caption' section of results.md: the table, then its notes."""
    return ([f"## {caption}", "", markdown_table(header, rows), ""]
            + [f"- {line}" for line in notes] + [""])


def rst_section(caption: str, header, rows, notes: Sequence[str] = ()) -> List[str]:
    """The same table in reStructuredText, its caption as the title."""
    return [rst_table(header, rows, caption)] + [f"- {line}" for line in notes] + [""]


def extra_sections(section, memory, latency, sums_cost, cache=None) -> List[str]:
    """The tables after the ops' (latency, memory, the exact sums' cost,
    the output cache), each measured one, built by ``section``
    (:func:`md_section` or :func:`rst_section`)."""
    parts: List[str] = []
    if latency:
        parts += section(latency_caption(latency), LATENCY_HEADER, latency_rows(latency),
                         latency.get("notes", []))
    if memory:
        parts += section(memory_caption(memory), MEMORY_HEADER, memory_rows(memory))
    if sums_cost:
        parts += section(sums_cost_caption(sums_cost), SUMS_COST_HEADER,
                         sums_cost_rows(sums_cost), sums_cost["notes"])
    if cache:
        parts += section(cache_caption(cache), CACHE_HEADER, cache_rows(cache),
                         ["on / x.copy() and off / x.copy() each divide by the x.copy() "
                          "timed beside that call; the cache's limit is its default "
                          "(lnc.set_output_cache)"])
    return parts


def write_markdown(path: Path, info, cfg, results, memory, latency, sums_cost=None,
                   cache=None) -> None:
    parts = ["# layernorm_c benchmark results", "",
             "Generated by `python benchmarks/bench.py`; see benchmarks/README.md and "
             "docs/benchmarks.rst.", ""]
    parts += [f"- {line}" for line in info_lines(info, cfg)] + [""]
    for op in cfg.ops:
        rs = op_results(results, op)
        parts += [f"## {op_title(op)}", ""]
        if not rs:
            parts += ["Not measured in this run.", ""]
            continue
        parts += [markdown_table(ratio_header(op, rs), ratio_rows(op, rs)), ""]
        parts += [f"- {line}" for line in notes_lines(rs)]
        parts += ["", f"### {op}: all medians", "",
                  markdown_table(time_header(rs), time_rows(rs)), ""]
    parts += extra_sections(md_section, memory, latency, sums_cost, cache)
    path.write_text("\n".join(parts).rstrip() + "\n", encoding="utf-8")


def rst_op_section(op: str, results: Sequence[CaseResult]) -> List[str]:
    rs = op_results(results, op)
    if not rs:
        return [f"*{op}: not measured in this run.*", ""]
    parts = [rst_table(ratio_header(op, rs), ratio_rows(op, rs), op_title(op))]
    return parts + [f"- {line}" for line in notes_lines(rs)] + [""]


def write_rst(paths: Dict[str, Path], info, cfg, results, memory, latency,
              sums_cost=None, cache=None) -> None:
    """``rst`` (docs/bench_table.inc): the machine, layer_norm, latency,
    memory and the exact sums' cost; ``rst_<op>`` (docs/bench_<op>.inc):
    each other op's table."""
    head = [".. Generated by benchmarks/bench.py; do not edit by hand.", ""]
    parts = head + [f"- {line}" for line in info_lines(info, cfg)] + [""]
    parts += rst_op_section("layer_norm", results)
    parts += extra_sections(rst_section, memory, latency, sums_cost, cache)
    paths["rst"].write_text("\n".join(parts).rstrip() + "\n", encoding="utf-8")
    for op in OPS:
        if op != "layer_norm":
            text = "\n".join(head + rst_op_section(op, results)).rstrip() + "\n"
            paths[f"rst_{op}"].write_text(text, encoding="utf-8")


def write_json(path: Path, info, cfg, results, memory, latency, sums_cost=None,
               cache=None) -> None:
    data = {
        "machine": info,
        "config": {"mode": cfg.mode, "repeats": cfg.repeats, "min_time": cfg.min_time,
                   "ops": list(cfg.ops), "dtypes": list(cfg.dtypes),
                   "shapes": [list(s) for s in cfg.shapes], "threads": list(cfg.threads),
                   "peers": list(cfg.peers)},
        "cases": [{"op": r.op, "shape": list(r.shape), "dtype": r.dtype, "threads": r.threads,
                   "seconds": r.times, "notes": r.notes, "errors": r.errors,
                   "loadavg_1min": r.loadavg} for r in results],
        "memory": memory,
        "latency": latency,
        "sums_cost": sums_cost,
        "output_cache": cache,
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
        ax.tick_params(axis="y", which="minor", labelsize=6)
    else:
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    if all(v is None for values in series.values() for v in values):
        ax.text(0.5, 0.5, "n/a", transform=ax.transAxes, ha="center", va="center")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=25, fontsize=7)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    if series:
        ax.legend(fontsize=6, ncol=2)


def plot(path: Path, results: Sequence[CaseResult]) -> None:
    """Per op, each peer's time over layernorm_c's (float32, or the first
    dtype run, 1 thread); layernorm_c over its floor per op; and the
    speed-up of 2 threads over 1."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r.shape for r in results))
    labels = [fmt_shape(s) for s in shapes]
    ops = [op for op in OPS if op_results(results, op)]
    dtypes = list(dict.fromkeys(r.dtype for r in results))
    dtype = "float32" if "float32" in dtypes else (dtypes[0] if dtypes else "float32")
    threads = sorted({r.threads for r in results})
    t1 = threads[0] if threads else 1
    by = {(r.op, r.shape, r.dtype, r.threads): r for r in results}

    def series(op, num, den, th, dt=dtype):
        return [by[(op, s, dt, th)].ratio(num, den) if (op, s, dt, th) in by else None
                for s in shapes]

    fig, axes = plt.subplots(3, 2, figsize=(12, 12))
    for ax, op in zip(axes.flat[:4], list(OPS)):
        rs = op_results(results, op)
        _bar_panel(ax, labels, {LABELS[p]: series(op, p, "lnc", t1) for p in peers_of(rs)},
                   "peer time / layernorm_c time",
                   f"{op}: speed-up of layernorm_c ({dtype}, {t1} thread) — higher is better")
    _bar_panel(axes[2, 0], labels, {op: series(op, "lnc", "floor", t1) for op in ops},
               "layernorm_c time / floor time",
               f"layernorm_c over its memory floor ({dtype}, {t1} thread) — lower is better")
    if len(threads) > 1:
        tn = threads[-1]
        speedup = {op: [None if a is None or b is None else a / b for a, b in
                        zip(_times(by, op, shapes, dtype, t1), _times(by, op, shapes, dtype, tn))]
                   for op in ops}
        _bar_panel(axes[2, 1], labels, speedup, f"1-thread time / {tn}-thread time",
                   f"layernorm_c with {tn} threads ({dtype}) — higher is better")
    else:
        _bar_panel(axes[2, 1], labels, {}, "", "one thread count only")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _times(by, op, shapes, dtype, threads):
    return [by[(op, s, dtype, threads)].times.get("lnc") if (op, s, dtype, threads) in by
            else None for s in shapes]
