"""``python -m layernorm_c``: the main job.

Computes the worked examples with the C core beside the hand values, shows a
record normalized alone and inside a batch of 100 comparing bit for bit, and
prints a short speed comparison against the NumPy reference.

``python -m layernorm_c audit module:function`` validates another LayerNorm
implementation (see ``layernorm_c.testing``); ``python -m layernorm_c
normalize IN OUT`` normalizes a .npy file or zarr store larger than memory
(see ``docs/out-of-core.rst``).
"""
from __future__ import annotations

import sys
import timeit
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np

import layernorm_c as lnc
from layernorm_c._cases import WORKED_EXAMPLES


def _fmt(values: Iterable[float]) -> str:
    return "[" + ", ".join(f"{v:+.6f}" for v in values) + "]"


def show_worked_examples() -> bool:
    print("Worked examples (eps = 0, no gain or bias), C core beside the hand values")
    ok = True
    for example in WORKED_EXAMPLES:
        row, mean, var, hand = example
        y, m, v = lnc.layer_norm(np.array([row]), eps=0.0, return_stats=True)
        match = (np.allclose(y[0], hand, rtol=0.0, atol=10.0 ** -example.decimals)
                 and m[0] == mean and v[0] == var)
        ok = ok and bool(match)
        print(f"  row {list(row)}")
        print(f"    mean {m[0]:.6f} (hand {mean})   variance {v[0]:.6f} (hand {var})")
        print(f"    y    {_fmt(y[0])}")
        print(f"    hand {_fmt(hand)}   {'agree' if match else 'DISAGREE'}")
    return ok


def show_batch_independence(d: int = 768, batch: int = 100, position: int = 37) -> bool:
    print(f"\nBatch independence: one float32 record of d={d}, alone and at position "
          f"{position} of a batch of {batch}")
    rng = np.random.default_rng(0)
    record = (rng.standard_normal(d) * 3 + 50).astype(np.float32)
    others = (rng.standard_normal((batch, d)) * 1e3).astype(np.float32)
    others[position] = record
    weight = rng.standard_normal(d).astype(np.float32)
    bias = rng.standard_normal(d).astype(np.float32)

    alone = lnc.layer_norm(record[None, :], weight, bias, return_stats=True)
    inside = lnc.layer_norm(others, weight, bias, return_stats=True)
    same = (alone.y[0].tobytes() == inside.y[position].tobytes()
            and alone.mean[0] == inside.mean[position]
            and alone.var[0] == inside.var[position])
    print(f"  alone : mean {alone.mean[0]:.7f}  var {alone.var[0]:.7f}  y[:3] {alone.y[0, :3]}")
    print(f"  inside: mean {inside.mean[position]:.7f}  var {inside.var[position]:.7f}  "
          f"y[:3] {inside.y[position, :3]}")
    print(f"  bit-for-bit identical (output and statistics): {'yes' if same else 'NO'}")
    return bool(same)


def _numpy_layer_norm(x: Any, weight: Any, bias: Any, eps: float = 1e-5) -> Any:
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=-1, keepdims=True)
    return centered / np.sqrt(var + eps) * weight + bias


def _best_time(fn: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number


def show_speed() -> None:
    print(f"\nSpeed against the NumPy reference (float32, best of 5, "
          f"isa={lnc.get_isa()}, threads={lnc.get_num_threads()})")
    rng = np.random.default_rng(1)
    print(f"  {'shape':>14}  {'layernorm_c':>12}  {'NumPy':>12}  {'speed-up':>8}")
    for shape, number in [((8, 768), 2000), ((4096, 768), 20)]:
        x = rng.standard_normal(shape).astype(np.float32)
        w = rng.standard_normal(shape[-1]).astype(np.float32)
        b = rng.standard_normal(shape[-1]).astype(np.float32)
        t_c = _best_time(lambda: lnc.layer_norm(x, w, b), number)
        t_np = _best_time(lambda: _numpy_layer_norm(x, w, b), number)
        print(f"  {str(shape):>14}  {t_c * 1e6:9.1f} us  {t_np * 1e6:9.1f} us  "
              f"{t_np / t_c:7.1f}x")
    print("  (full benchmark with PyTorch and the memory-copy floor: python benchmarks/bench.py)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "audit":
        from .testing._cli import main as audit_main

        return audit_main(argv[1:])
    if argv and argv[0] == "normalize":
        from ._normalize import main as normalize_main

        return normalize_main(argv[1:])
    if argv:
        print("usage: python -m layernorm_c [audit module:function ... | normalize IN OUT ...]",
              file=sys.stderr)
        return 2
    ok = show_worked_examples()
    ok = show_batch_independence() and ok
    show_speed()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
