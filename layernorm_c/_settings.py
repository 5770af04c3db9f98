"""Kernel settings: instruction-set level and thread count.

Both start from the environment when layernorm_c is imported:
``LAYERNORM_C_ISA`` (``scalar``, ``portable``, ``avx2`` or ``avx512``;
default: the widest the CPU supports) and ``LAYERNORM_C_NUM_THREADS`` (default: the CPUs this
process may run on). Results are bit-identical whatever either is set to.
"""
from __future__ import annotations

import os
import warnings
from typing import Tuple

from . import _core

__all__ = ["get_isa", "set_isa", "supported_isas", "get_num_threads", "set_num_threads",
           "thread_threshold", "MAX_THREADS"]


#: The largest thread count :func:`set_num_threads` accepts.
MAX_THREADS: int = _core.MAX_THREADS


def get_isa() -> str:
    """The instruction-set level the kernels use.

    One of ``'scalar'`` (the plain-C reference of the reduction order),
    ``'portable'`` (compiler-vectorized C: the default off x86), ``'avx2'``
    and ``'avx512'``. Every level gives the same bits.
    """
    return _core.get_isa()


def set_isa(name: str) -> None:
    """Force the kernels' instruction-set level.

    Parameters
    ----------
    name : {'scalar', 'portable', 'avx2', 'avx512'}
        A level from :func:`supported_isas`.

    Raises
    ------
    TypeError
        ``name`` is not a str.
    ValueError
        An unknown name, or a level this CPU or build cannot run.
    """
    if not isinstance(name, str):
        raise TypeError(f"name: expected a str, got {type(name).__name__}")
    _core.set_isa(name)


def supported_isas() -> Tuple[str, ...]:
    """The instruction-set levels this CPU and build can run, narrowest first."""
    return _core.supported_isas()


def get_num_threads() -> int:
    """The most threads one call may use (small calls always use one)."""
    return _core.get_num_threads()


def set_num_threads(n: int) -> None:
    """Let one call split its records over up to ``n`` threads.

    A record is always reduced by a single thread, so results do not depend
    on ``n``. Calls with less than :func:`thread_threshold` bytes of input
    run on the calling thread.

    Parameters
    ----------
    n : int
        From 1 to :data:`MAX_THREADS` (256).

    Raises
    ------
    TypeError
        ``n`` is not an int.
    ValueError
        ``n`` is outside 1 to :data:`MAX_THREADS`.
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n: expected an int, got {type(n).__name__}")
    _core.set_num_threads(n)


def thread_threshold() -> int:
    """Input size in bytes below which a call never starts threads."""
    return _core.thread_threshold()


def _usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _init_from_environment() -> None:
    isa = os.environ.get("LAYERNORM_C_ISA", "").strip().lower()
    if isa:
        try:
            _core.set_isa(isa)
        except ValueError as exc:
            warnings.warn(f"LAYERNORM_C_ISA ignored: {exc}", RuntimeWarning, stacklevel=3)
    threads = os.environ.get("LAYERNORM_C_NUM_THREADS", "").strip()
    n = _usable_cpus()
    if threads:
        try:
            n = int(threads)
            _core.set_num_threads(n)
            return
        except ValueError as exc:
            warnings.warn(f"LAYERNORM_C_NUM_THREADS ignored: {exc}", RuntimeWarning, stacklevel=3)
            n = _usable_cpus()
    _core.set_num_threads(min(n, MAX_THREADS))


_init_from_environment()
