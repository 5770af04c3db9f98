"""Timing (medians of interleaved repeats), CPU pinning and the load average."""
from __future__ import annotations

import gc
import os
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

Call = Callable[[], object]


def time_loops(fn: Call, loops: int) -> float:
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


def calibrate(fn: Call, min_time: float) -> Tuple[int, float]:
    """The number of calls whose total time reaches ``min_time``, and the
    seconds per call of that last round (a measurement like any other)."""
    loops = 1
    while True:
        t = time_loops(fn, loops)
        if t >= min_time:
            return loops, t / loops
        # Aim 20% past min_time, growing at least 2x and at most 100x.
        guess = int(loops * 1.2 * min_time / max(t, 1e-9)) + 1
        loops = min(max(guess, 2 * loops), 100 * loops)


def measure(impls: Dict[str, Call], repeats: int, min_time: float,
            slow: Optional[float] = None, slow_repeats: int = 3) -> Dict[str, float]:
    """Median seconds per call of each implementation over ``repeats``
    measurements.

    The first measurement is the last round of the calibration; the others
    are interleaved: each round times every implementation once, in turn,
    and the order rotates from one round to the next, so a slow drift of the
    machine (other processes, clocks, caches) touches all of them alike and
    none is always timed right after the same neighbour. An implementation
    whose calls take ``slow`` seconds or more is measured ``slow_repeats``
    times only.
    """
    names = list(impls)
    loops: Dict[str, int] = {}
    samples: Dict[str, List[float]] = {}
    for name in names:
        loops[name], first = calibrate(impls[name], min_time)
        samples[name] = [first]
    quota = {name: min(repeats, slow_repeats) if slow and samples[name][0] >= slow
             else repeats for name in names}
    for r in range(max(0, repeats - 1)):
        k = r % len(names) if names else 0
        for name in names[k:] + names[:k]:
            if len(samples[name]) < quota[name]:
                samples[name].append(time_loops(impls[name], loops[name]) / loops[name])
    return {name: statistics.median(s) for name, s in samples.items()}


# ---------------------------------------------------------------- CPU pinning

def usable_cpus() -> List[int]:
    """The CPUs this process may run on, in order."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _thread_ids() -> List[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def pin(cpus: Sequence[int]) -> bool:
    """Restrict every thread of this process (the worker pools of
    layernorm_c, torch, onnxruntime, OpenVINO and XLA included) to ``cpus``.

    ``os.sched_setaffinity(0, ...)`` alone would move only the calling
    thread; threads started later inherit the calling thread's mask. False
    where affinity cannot be set (not Linux)."""
    if not hasattr(os, "sched_setaffinity"):
        return False
    mask = set(cpus)
    ok = True
    for tid in _thread_ids():
        try:
            os.sched_setaffinity(tid, mask)
        except OSError:  # a thread that just ended
            ok = ok and tid != 0
    os.sched_setaffinity(0, mask)
    return ok


def loadavg() -> Optional[List[float]]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None
