"""Timing (medians of interleaved repeats), CPU pinning and the load average."""
from __future__ import annotations

import ctypes
import gc
import os
import platform
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
    none is always timed right after the same neighbour. Each measurement
    after the first starts with one untimed call: the calls of the one
    before may have given memory back to the system (NumPy's temporaries,
    an XLA buffer), and the first call after them pays the page faults of
    taking it again. Timed, that cost went to whoever came next: torch's
    float32 (4096, 768) backward after JAX and NumPy faulted 300 times a
    call on average and took 1.5-2x its time alone. An implementation
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
                impls[name]()  # untimed: memory the one before gave back taken again
                samples[name].append(time_loops(impls[name], loops[name]) / loops[name])
    return {name: statistics.median(s) for name, s in samples.items()}


# ---------------------------------------------------------------- the C heap

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
STEADY_MMAP_THRESHOLD = 32 << 20  # glibc's largest dynamic threshold on 64-bit
STEADY_TRIM_THRESHOLD = 1 << 30


def steady_malloc() -> Optional[str]:
    """Make glibc's heap keep what it is given back, whoever freed it, so
    that no implementation pays page faults for another's frees: one arena
    for every thread, blocks below 32 MiB from that heap and its top given
    back to the system only past 1 GiB; blocks of 32 MiB or more mapped
    afresh for every call, as they are by default (the allocating calls on
    arrays larger than L3 pay the same page faults as ``x.copy()``).

    By default each of these moves with the process's history. With JAX
    and the NumPy formula in the process, torch's float32 (4096, 768)
    backward faulted 200-1000 times a call (1.3-2x its time alone), and
    which library paid depended on the order of the calls. Call it before
    any thread starts (the peers' pools). Returns what was set, or None
    where the C library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_THRESHOLD, STEADY_MMAP_THRESHOLD),
                (_M_TRIM_THRESHOLD, STEADY_TRIM_THRESHOLD))
    if not all(mallopt(param, value) == 1 for param, value in settings):
        return None
    return (f"glibc malloc fixed: 1 arena, mmap threshold {STEADY_MMAP_THRESHOLD >> 20} MiB, "
            f"trim threshold {STEADY_TRIM_THRESHOLD >> 20} MiB")


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
