#!/usr/bin/env python
"""GPT-2 forward pass in pure NumPy, with layernorm_c as a drop-in layer norm.

The model code below is written the way small NumPy prototypes of GPT-2 are
(gelu, softmax, a ``layer_norm(x, g, b, eps=1e-5)`` helper built on
``np.mean``/``np.var`` with keepdims, linear layers, causal multi-head
attention, pre-LN transformer blocks, a final ``ln_f`` and logits
``x @ wte.T``), with one difference: the layer norm is a parameter of the
forward pass, so the NumPy helper and its layernorm_c replacement run the
same model side by side.

The replacement keeps the helper's signature; only its body changes::

    def layer_norm(x, g, b, eps=1e-5):
        return lnc.layer_norm(x, g, b, eps)

No checkpoint is downloaded: the weights have GPT-2 small's shapes and are
drawn, seeded, with GPT-2's initialisation recipe (see :func:`init_params`),
in float32 as checkpoints are usually loaded.

    python examples/gpt2_numpy.py            # one forward of each, differences
    python examples/gpt2_numpy.py --small    # the same on a 2-layer toy model
    python examples/gpt2_numpy.py --bench    # the timings of docs/gpt2.rst

``--bench`` runs every (batch, tokens) case in each activation dtype, with
both layer norms round-robin in one process, and prints the tables of
docs/gpt2.rst (``--rst FILE`` also writes them as reStructuredText). Timings
depend on the machine and on BLAS threads: docs/gpt2.rst was measured with
``OPENBLAS_NUM_THREADS=1 taskset -c 1``.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import math
import os
import platform
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import layernorm_c as lnc

# --------------------------------------------------------------------- model
# The building blocks of a NumPy GPT-2 prototype.


def gelu(x):
    """GPT-2's tanh approximation of GELU, with ``x ** 3`` as the prototypes
    write it (NumPy evaluates it with ``pow``, far slower than ``x * x * x``:
    see docs/gpt2.rst)."""
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
    return 0.5 * x * (1.0 + np.tanh(inner))


def softmax(x):
    """Softmax over the last axis, shifted by the row maximum."""
    z = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return z / np.sum(z, axis=-1, keepdims=True)


def numpy_layer_norm(x, g, b, eps=1e-5):
    """The prototypes' helper: mean and population variance of the last
    axis (keepdims), eps inside the square root, then gain and bias."""
    mean = np.mean(x, axis=-1, keepdims=True)
    var = np.var(x, axis=-1, keepdims=True)
    return g * (x - mean) / np.sqrt(var + eps) + b


def lnc_layer_norm(x, g, b, eps=1e-5):
    """The drop-in: the helper's signature, layernorm_c's C kernel."""
    return lnc.layer_norm(x, g, b, eps)


def linear(x, w, b):
    """GPT-2 stores its projections as (in, out): x @ w + b."""
    return x @ w + b


def mlp(x, c_fc, c_proj):
    return linear(gelu(linear(x, **c_fc)), **c_proj)


def split_heads(t, n_head):
    """(B, T, C) -> (B, n_head, T, C // n_head)."""
    batch, tokens, width = t.shape
    return t.reshape(batch, tokens, n_head, width // n_head).transpose(0, 2, 1, 3)


def merge_heads(t):
    """(B, n_head, T, head) -> (B, T, n_head * head)."""
    batch, heads, tokens, size = t.shape
    return t.transpose(0, 2, 1, 3).reshape(batch, tokens, heads * size)


def attention(x, c_attn, c_proj, n_head, promote):
    """Causal multi-head self-attention.

    ``promote=False`` keeps the scores in x's dtype: a Python-float scale
    and a mask of x's dtype. ``promote=True`` writes them as prototypes
    commonly do, ``q @ k.T / np.sqrt(head)`` plus ``(1 - np.tri(T)) *
    -1e10``: a NumPy float64 scalar and a float64 mask, which (NumPy 2
    promotion rules for the scalar, any NumPy for the mask) turn float32
    scores float64, and with them the attention output and, from the first
    residual add on, the whole residual stream.
    """
    tokens = x.shape[1]
    q, k, v = np.split(linear(x, **c_attn), 3, axis=-1)
    q, k, v = (split_heads(t, n_head) for t in (q, k, v))
    head = q.shape[-1]
    if promote:
        scale = np.sqrt(head)
        mask = (1 - np.tri(tokens)) * -1e10
    else:
        scale = math.sqrt(head)
        mask = (1 - np.tri(tokens, dtype=x.dtype)) * -1e10
    weights = softmax(q @ k.transpose(0, 1, 3, 2) / scale + mask)
    return linear(merge_heads(weights @ v), **c_proj)


def block(x, ln_1, attn, ln_2, mlp_params, n_head, layer_norm, promote):
    """A pre-LN transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""
    x = x + attention(layer_norm(x, **ln_1), **attn, n_head=n_head, promote=promote)
    x = x + mlp(layer_norm(x, **ln_2), **mlp_params)
    return x


def gpt2_forward(ids, params, n_head, layer_norm=numpy_layer_norm, promote=False):
    """Logits (B, T, vocab) for token ids (B, T).

    ``layer_norm`` is called as ``layer_norm(x, g=..., b=...)``, 2 times per
    block and once for ``ln_f``. ``promote``: see :func:`attention`.
    """
    tokens = ids.shape[-1]
    x = params["wte"][ids] + params["wpe"][:tokens]
    for blk in params["blocks"]:
        x = block(x, blk["ln_1"], blk["attn"], blk["ln_2"], blk["mlp"],
                  n_head, layer_norm, promote)
    return layer_norm(x, **params["ln_f"]) @ params["wte"].T


# ------------------------------------------------------------------- weights


@dataclass(frozen=True)
class Config:
    n_layer: int
    n_head: int
    n_embd: int
    n_ctx: int
    n_vocab: int


GPT2_SMALL = Config(n_layer=12, n_head=12, n_embd=768, n_ctx=1024, n_vocab=50257)
SMALL = Config(n_layer=2, n_head=4, n_embd=128, n_ctx=64, n_vocab=1000)


def init_params(cfg: Config, seed: int = 0, dtype=np.float32) -> dict:
    """Seeded weights of ``cfg``'s shapes, by GPT-2's recipe.

    Every matrix and both embeddings are normal with std 0.02, the two
    residual projections (attention and MLP ``c_proj``) scaled by
    ``1 / sqrt(2 * n_layer)``, linear biases 0. LayerNorm gains would start
    at 1 and biases at 0; here they are perturbed (gain ``1 + 0.1 N(0, 1)``,
    bias ``0.05 N(0, 1)``) so that the LN parameters take part in the
    result. Drawn in float32 and returned in ``dtype``.
    """
    rng = np.random.default_rng(seed)
    width = cfg.n_embd
    proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)

    def normal(shape, std=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(
            dtype, copy=False)

    def zeros(n):
        return np.zeros(n, dtype)

    def ln():
        return {"g": (1 + normal(width, 0.1)).astype(dtype), "b": normal(width, 0.05)}

    def dense(n_in, n_out, std=0.02):
        return {"w": normal((n_in, n_out), std), "b": zeros(n_out)}

    blocks = []
    for _ in range(cfg.n_layer):
        blocks.append({
            "ln_1": ln(),
            "attn": {"c_attn": dense(width, 3 * width),
                     "c_proj": dense(width, width, proj_std)},
            "ln_2": ln(),
            "mlp": {"c_fc": dense(width, 4 * width),
                    "c_proj": dense(4 * width, width, proj_std)},
        })
    return {"wte": normal((cfg.n_vocab, width)), "wpe": normal((cfg.n_ctx, width)),
            "blocks": blocks, "ln_f": ln()}


def cast_params(params, dtype):
    """The same weights in another dtype (float32 -> float64 is exact)."""
    if isinstance(params, dict):
        return {k: cast_params(v, dtype) for k, v in params.items()}
    if isinstance(params, list):
        return [cast_params(v, dtype) for v in params]
    return params.astype(dtype)


def token_ids(cfg: Config, batch: int, tokens: int, seed: int = 1) -> np.ndarray:
    """Seeded random token ids of shape (batch, tokens)."""
    if tokens > cfg.n_ctx:
        raise ValueError(f"tokens: at most n_ctx = {cfg.n_ctx}, got {tokens}")
    return np.random.default_rng(seed).integers(0, cfg.n_vocab, (batch, tokens))


# -------------------------------------------------------------- measurement


#: The clocks every timing reads: the CPU time of this process (all its
#: threads; it leaves out the time other processes of a shared machine take
#: the core away) and the wall clock.
CLOCKS: Dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}


CLOCK_NAMES = {"cpu": "CPU time of the process", "wall": "wall-clock time"}
CLOCK_SHORT = {"cpu": "CPU", "wall": "wall"}


def _now() -> Dict[str, float]:
    return {name: clock() for name, clock in CLOCKS.items()}


def _since(start: Dict[str, float]) -> Dict[str, float]:
    """Seconds since ``_now()`` on each clock, read in the reverse order, so
    the readings nest and the wall clock's interval holds no other reading."""
    end = {name: CLOCKS[name]() for name in reversed(CLOCKS)}
    return {name: end[name] - start[name] for name in CLOCKS}


class TimedLayerNorm:
    """Wraps a layer norm; adds up the time of its calls on each clock
    (``seconds["cpu"]``, ``seconds["wall"]``), counts them and the (x, g)
    dtypes they were made with."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.reset()

    def reset(self):
        self.seconds = dict.fromkeys(CLOCKS, 0.0)
        self.calls = 0
        self.dtypes: Counter = Counter()

    def __call__(self, x, g, b, eps=1e-5):
        start = _now()
        y = self.fn(x, g, b, eps)
        for name, spent in _since(start).items():
            self.seconds[name] += spent
        self.calls += 1
        self.dtypes[(np.dtype(x.dtype).name, np.dtype(g.dtype).name)] += 1
        return y


def _exact_layer_norm(x, g, b, eps, dtype):
    """The helper's formula in a wider ``dtype`` (float64 for float32
    results, long double for float64 results)."""
    return numpy_layer_norm(x.astype(dtype), g.astype(dtype), b.astype(dtype), eps)


class LayerNormProbe:
    """A layer norm that, on every call, also runs both implementations on
    the same input and compares them with a wider evaluation of the formula;
    it returns layernorm_c's result. Untimed: for accuracy only."""

    def __init__(self):
        #: {"x float32, g float32": {"NumPy": {...}, "lnc": {...}}, ...}
        self.stats: Dict[str, Dict[str, dict]] = {}

    def __call__(self, x, g, b, eps=1e-5):
        got = {"NumPy": numpy_layer_norm(x, g, b, eps), "lnc": lnc_layer_norm(x, g, b, eps)}
        out_dtype = got["lnc"].dtype
        wide = np.float64 if out_dtype.itemsize < 8 else np.longdouble
        exact = _exact_layer_norm(x, g, b, eps, wide)
        rounded = exact.astype(out_dtype)
        key = f"x {np.dtype(x.dtype).name}, g {np.dtype(g.dtype).name}"
        for name, y in got.items():
            assert y.dtype == out_dtype, (name, y.dtype, out_dtype)
            s = self.stats.setdefault(key, {}).setdefault(
                name, {"calls": 0, "n": 0, "max_abs": 0.0, "rounded": 0, "abs_sum": 0.0})
            err = np.abs(y.astype(wide) - exact)
            s["calls"] += 1
            s["n"] += y.size
            s["max_abs"] = max(s["max_abs"], float(err.max()))
            s["abs_sum"] += float(err.sum())
            s["rounded"] += int(np.count_nonzero(y == rounded))
        return got["lnc"]


def differences(a: np.ndarray, b: np.ndarray) -> Tuple[float, float]:
    """Max |a - b| (computed in float64) and that divided by max |b|."""
    diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
    return diff, diff / float(np.max(np.abs(b)))


#: The activation dtypes measured: (label, params dtype, promote).
MODES = {
    "float32": (np.float32, False),
    "mixed": (np.float32, True),
    "float64": (np.float64, False),
}
MODE_NOTES = {
    "float32": "float32 weights, activations kept float32",
    "mixed": "float32 weights, float64 activations (the prototypes' np.sqrt "
             "scale and float64 mask promote the residual stream)",
    "float64": "weights cast to float64; its NumPy-LN forward is the reference",
}


@dataclass
class CaseResult:
    batch: int
    tokens: int
    mode: str
    repeats: int
    # {clock: {"NumPy" or "lnc": [seconds per forward, one per repeat]}}
    forward_runs: Dict[str, Dict[str, List[float]]]
    # the same for the time spent in the LN calls of each forward
    ln_runs: Dict[str, Dict[str, List[float]]]
    ln_calls: int
    ln_dtypes: Dict[str, int]
    diff_lnc_numpy: Tuple[float, float]
    diff_vs_ref: Dict[str, Optional[Tuple[float, float]]]
    finite: bool

    @property
    def label(self) -> str:
        return f"{self.batch} × {self.tokens}"

    def forward(self, clock: str = "cpu") -> Dict[str, float]:
        """Median seconds per forward."""
        return {k: statistics.median(v) for k, v in self.forward_runs[clock].items()}

    def ln(self, clock: str = "cpu") -> Dict[str, float]:
        """Median seconds spent in the LN calls of one forward."""
        return {k: statistics.median(v) for k, v in self.ln_runs[clock].items()}

    @staticmethod
    def _paired(runs: Dict[str, List[float]]) -> float:
        """Median over the repeats of NumPy time / lnc time, each ratio
        taken within one round (the two forwards ran back to back)."""
        return statistics.median(a / b for a, b in zip(runs["NumPy"], runs["lnc"]))

    def forward_speedup(self, clock: str = "cpu") -> float:
        return self._paired(self.forward_runs[clock])

    def ln_speedup(self, clock: str = "cpu") -> float:
        return self._paired(self.ln_runs[clock])

    def ln_saving(self, clock: str = "cpu") -> float:
        """The LN time saved, as a fraction of the NumPy-LN forward: the
        whole-forward gain the LN speed-up alone accounts for."""
        ln, forward = self.ln(clock), self.forward(clock)
        return (ln["NumPy"] - ln["lnc"]) / forward["NumPy"]


def _timed_forwards(ids, params, n_head, promote, repeats):
    """Warm-up forwards (their logits are returned), then ``repeats``
    round-robin rounds, alternating which layer norm goes first: the time
    of every forward and of the LN calls inside it, on each clock."""
    impls = {"NumPy": TimedLayerNorm(numpy_layer_norm), "lnc": TimedLayerNorm(lnc_layer_norm)}
    logits = {name: gpt2_forward(ids, params, n_head, ln, promote) for name, ln in impls.items()}
    dtypes = dict(impls["lnc"].dtypes)
    calls = impls["lnc"].calls
    forward = {clock: {name: [] for name in impls} for clock in CLOCKS}
    inside = {clock: {name: [] for name in impls} for clock in CLOCKS}
    order = list(impls)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(repeats):
            for name in (order if r % 2 == 0 else order[::-1]):
                ln = impls[name]
                ln.reset()
                start = _now()
                gpt2_forward(ids, params, n_head, ln, promote)
                for clock, spent in _since(start).items():
                    forward[clock][name].append(spent)
                    inside[clock][name].append(ln.seconds[clock])
            gc.collect()
    finally:
        if gc_was_enabled:
            gc.enable()
    return logits, forward, inside, calls, dtypes


def run_case(cfg, params32, params64, batch, tokens, modes, repeats, reference=None):
    """Every mode for one (batch, tokens) input. The float64 mode's NumPy
    logits are the reference of the others (computed if that mode is not
    run)."""
    ids = token_ids(cfg, batch, tokens)
    results = []
    ordered = sorted(modes, key=lambda m: m != "float64")  # reference first
    if "float64" not in modes:
        reference = gpt2_forward(ids, params64, cfg.n_head, numpy_layer_norm)
    for mode in ordered:
        dtype, promote = MODES[mode]
        params = params64 if dtype == np.float64 else params32
        logits, fwd, ln, calls, dtypes = _timed_forwards(ids, params, cfg.n_head, promote,
                                                         repeats)
        if mode == "float64":
            reference = logits["NumPy"]
            vs_ref = {"NumPy": None, "lnc": differences(logits["lnc"], reference)}
        else:
            vs_ref = {name: differences(y, reference) for name, y in logits.items()}
        results.append(CaseResult(
            batch, tokens, mode, repeats, fwd, ln, calls,
            {f"x {x}, g {g}": n for (x, g), n in dtypes.items()},
            differences(logits["lnc"], logits["NumPy"]), vs_ref,
            all(bool(np.isfinite(y).all()) for y in logits.values())))
        del logits
    order = {m: i for i, m in enumerate(modes)}
    return sorted(results, key=lambda r: order[r.mode])


def probe_layer_norms(cfg, params32, params64, batch, tokens, modes):
    """Per-call accuracy of both layer norms inside one forward per mode."""
    ids = token_ids(cfg, batch, tokens)
    probe = LayerNormProbe()
    for mode in modes:
        dtype, promote = MODES[mode]
        gpt2_forward(ids, params64 if dtype == np.float64 else params32, cfg.n_head,
                     probe, promote)
    return probe.stats


# ------------------------------------------------------------------ report


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_lines() -> List[str]:
    usable: Optional[int]
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on macOS and Windows
        usable = os.cpu_count()
    blas = {k: os.environ[k] for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                         "MKL_NUM_THREADS") if k in os.environ}
    try:
        load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        load = "n/a"
    return [
        f"Date (UTC): {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}",
        f"CPU: {cpu_model()}, {usable} usable of {os.cpu_count()} logical CPUs; "
        f"layernorm_c ISA {lnc.get_isa()}, {lnc.get_num_threads()} thread(s)",
        f"Python {platform.python_version()}, NumPy {np.__version__}, "
        f"layernorm_c {lnc.__version__}; {platform.platform()}",
        "BLAS thread settings: " + (", ".join(f"{k}={v}" for k, v in blas.items())
                                    or "none (BLAS default)"),
        f"Load average (1, 5, 15 min) at start: {load}",
    ]


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 1 else f"{ms:.2f} ms"


def _sec(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else _ms(seconds)


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %"


def _diff(d: Optional[Tuple[float, float]]) -> str:
    if d is None:
        return "0 (is the ref.)"
    return f"{d[0]:.1e} ({d[1]:.0e})"


def tables(results: Sequence[CaseResult], probes: Dict[str, Dict[str, dict]],
           clock: str = "cpu") -> List[Tuple[str, List[str], List[List[str]]]]:
    """(title, header, rows) of each table; times on ``clock``, plus the
    whole-forward speed-up on the other clock."""
    other = next(c for c in CLOCKS if c != clock)
    ln_rows, fwd_rows, acc_rows, probe_rows = [], [], [], []
    for r in results:
        ln, fwd = r.ln(clock), r.forward(clock)
        ln_rows.append([r.label, r.mode,
                        f"{_ms(ln['NumPy'])} ({_pct(ln['NumPy'], fwd['NumPy'])})",
                        f"{_ms(ln['lnc'])} ({_pct(ln['lnc'], fwd['lnc'])})",
                        f"{r.ln_speedup(clock):.1f}"])
        fwd_rows.append([r.label, r.mode, _sec(fwd["NumPy"]), _sec(fwd["lnc"]),
                         f"{r.forward_speedup(clock):.3f}",
                         f"{r.forward_speedup(other):.3f}",
                         f"{100 * r.ln_saving(clock):.1f} %"])
        acc_rows.append([r.label, r.mode, _diff(r.diff_lnc_numpy),
                         _diff(r.diff_vs_ref["NumPy"]), _diff(r.diff_vs_ref["lnc"])])
    for key, stats in probes.items():
        np_s, lnc_s = stats["NumPy"], stats["lnc"]
        errors = lambda s: f"{s['max_abs']:.1e}, {s['abs_sum'] / s['n']:.1e}"  # noqa: E731
        exact = lambda s: f"{100 * s['rounded'] / s['n']:.0f} %"  # noqa: E731
        probe_rows.append([key, str(np_s["calls"]), errors(np_s), errors(lnc_s),
                           f"{exact(np_s)} / {exact(lnc_s)}"])
    return [
        ("Layer-norm time per forward, share of the forward",
         ["input", "activations", "NumPy LN", "lnc LN", "speed-up"], ln_rows),
        ("Whole forward pass",
         ["input", "activations", "with NumPy LN", "with lnc LN",
          f"speed-up, {CLOCK_SHORT[clock]}", f"speed-up, {CLOCK_SHORT[other]}",
          "LN saving"], fwd_rows),
        ("Logits: max abs difference (relative)",
         ["input", "activations", "lnc vs NumPy", "NumPy vs ref.", "lnc vs ref."], acc_rows),
        ("Layer-norm calls: max, mean abs error",
         ["inputs", "calls", "NumPy LN", "lnc LN", "exact: NumPy / lnc"], probe_rows),
    ]


def format_text(tabs) -> str:
    out = []
    for title, header, rows in tabs:
        widths = [max(len(c) for c in col) for col in zip(header, *rows)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa
        out += [title, line(header), line(["-" * w for w in widths])]
        out += [line(r) for r in rows] + [""]
    return "\n".join(out)


def format_rst(tabs, head: Sequence[str]) -> str:
    out = [".. Generated by examples/gpt2_numpy.py --bench --rst; do not edit by hand.", ""]
    out += [f"- {line}" for line in head] + [""]
    for title, header, rows in tabs:
        out += [f".. list-table:: {title}", "   :header-rows: 1", "   :class: figures", ""]
        for cells in [header] + rows:
            out.append(f"   * - {cells[0]}")
            out += [f"     - {c}" for c in cells[1:]]
        out.append("")
    return "\n".join(out)




def bench(cfg, cases, modes, repeats, probe_case, rst_path=None, clock="cpu"
          ) -> List[CaseResult]:
    head = machine_lines()
    head.append(f"Model: n_layer {cfg.n_layer}, n_head {cfg.n_head}, n_embd {cfg.n_embd}, "
                f"vocab {cfg.n_vocab}; {2 * cfg.n_layer + 1} layer-norm calls per forward; "
                f"{repeats} round-robin repeats after a warm-up forward of each; times "
                f"are {CLOCK_NAMES[clock]}")
    print("\n".join(head), flush=True)
    params32 = init_params(cfg)
    params64 = cast_params(params32, np.float64)
    results = []
    for batch, tokens in cases:
        case = run_case(cfg, params32, params64, batch, tokens, modes, repeats)
        for r in case:
            times = "; ".join(
                f"{c}: forward {_sec(r.forward(c)['NumPy'])} / {_sec(r.forward(c)['lnc'])}, "
                f"LN {_ms(r.ln(c)['NumPy'])} / {_ms(r.ln(c)['lnc'])}" for c in CLOCKS)
            print(f"  {r.label} {r.mode} (NumPy / lnc) {times}; LN calls {r.ln_dtypes}",
                  flush=True)
        results += case
    bad = [f"{r.label} {r.mode}" for r in results if not r.finite]
    if bad:
        print(f"WARNING: non-finite logits in {bad}", flush=True)
    probes = probe_layer_norms(cfg, params32, params64, probe_case[0], probe_case[1],
                               modes)
    try:
        load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
        head[-2] += f"; at end: {load}"
    except OSError:
        pass
    head.append(f"Per-call accuracy: one forward of {probe_case[0]} × {probe_case[1]} tokens "
                "per mode; exact = the result is the formula's value rounded to the "
                "output dtype")
    tabs = tables(results, probes, clock)
    print()
    print(format_text(tabs))
    if rst_path:
        with open(rst_path, "w", encoding="utf-8") as f:
            f.write(format_rst(tabs, head))
        print(f"wrote {rst_path}")
    return results


def demo(cfg, batch, tokens) -> int:
    """One forward with each layer norm (after an untimed one), and how far
    apart their logits are."""
    params = init_params(cfg)
    ids = token_ids(cfg, batch, tokens)
    impls = {"NumPy": TimedLayerNorm(numpy_layer_norm), "lnc": TimedLayerNorm(lnc_layer_norm)}
    logits = {}
    for name, ln in impls.items():
        gpt2_forward(ids, params, cfg.n_head, ln)
        ln.reset()
        start = time.perf_counter()
        logits[name] = gpt2_forward(ids, params, cfg.n_head, ln)
        total = time.perf_counter() - start
        print(f"{name:>5} LN: forward {_sec(total)}, {ln.calls} LN calls "
              f"{_ms(ln.seconds['wall'])} (wall clock)")
    ref = gpt2_forward(ids, cast_params(params, np.float64), cfg.n_head)
    print(f"logits {logits['lnc'].shape} {logits['lnc'].dtype}; "
          "max abs difference (relative):")
    print(f"  lnc vs NumPy: {_diff(differences(logits['lnc'], logits['NumPy']))}")
    for name in impls:
        print(f"  {name} vs float64: {_diff(differences(logits[name], ref))}")
    return 0


def _parse_cases(text: str) -> List[Tuple[int, int]]:
    cases = []
    for item in text.split(","):
        batch, _, tokens = item.strip().partition("x")
        cases.append((int(batch), int(tokens)))
    return cases


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true",
                        help="a 2-layer, 128-wide model with a 1000-token vocabulary")
    parser.add_argument("--bench", action="store_true",
                        help="time both layer norms and print the tables of docs/gpt2.rst")
    parser.add_argument("--cases", help="BATCHxTOKENS,... (default 1x128,8x128; "
                                        "with --small 1x16,2x64)")
    parser.add_argument("--modes", default="float32,mixed,float64",
                        help="activation dtypes, of " + ", ".join(MODES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rst", help="with --bench: also write the tables to this file")
    parser.add_argument("--clock", choices=list(CLOCKS), default="cpu",
                        help="the clock of the tables (default: the CPU time of the "
                             "process, robust to other processes on a shared machine)")
    args = parser.parse_args(argv)
    cfg = SMALL if args.small else GPT2_SMALL
    cases = _parse_cases(args.cases) if args.cases else (
        [(1, 16), (2, 64)] if args.small else [(1, 128), (8, 128)])
    modes = [m.strip() for m in args.modes.split(",")]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; expected some of {list(MODES)}")
    if any(t > cfg.n_ctx for _, t in cases):
        parser.error(f"--cases: at most {cfg.n_ctx} tokens for this model")
    if not args.bench:
        return demo(cfg, *cases[0])
    bench(cfg, cases, modes, max(1, args.repeats), cases[0], args.rst, args.clock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
