"""Kernel settings: instruction-set level, thread count and output cache.

They start from the environment when layernorm_c is imported:
``LAYERNORM_C_ISA`` (``scalar``, ``portable``, ``avx2`` or ``avx512``;
default: the widest the CPU supports), ``LAYERNORM_C_NUM_THREADS`` (default: the CPUs this
process may run on) and ``LAYERNORM_C_OUTPUT_CACHE`` (bytes; default: 1 GiB, or a
sixteenth of the machine's memory if less). Results are bit-identical whatever they are
set to.
"""
from __future__ import annotations

import os
import warnings
from typing import NamedTuple, Tuple

from . import _core

__all__ = ["get_isa", "set_isa", "supported_isas", "get_num_threads", "set_num_threads",
           "thread_threshold", "MAX_THREADS", "set_output_cache", "get_output_cache",
           "OutputCache"]


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
    """Input size in bytes below which a call never starts threads.

    That is a backward call's threshold (768 KiB of ``x``), which does
    several times the forward's work per byte; a forward call starts
    threads from 2 MiB.
    """
    return _core.thread_threshold()


class OutputCache(NamedTuple):
    """What :func:`get_output_cache` reports."""

    #: The most bytes of freed outputs kept for reuse (0: none are kept).
    limit: int
    #: The bytes kept now.
    held: int
    #: The blocks kept now (at most 4).
    blocks: int


def set_output_cache(max_bytes: int) -> int:
    """Keep up to ``max_bytes`` of large freed outputs for the next calls.

    An output of 32 MiB or more that a call allocates (``layer_norm``,
    ``rms_norm`` and their backward passes without ``out=``, on a C-ordered
    array normalized over its last axis) comes from fresh pages, which the
    operating system zeroes as they are first written: for a float32
    (16384, 4096) output that costs about as much as the normalization.
    When such an array is freed, layernorm_c keeps its memory (at most 4
    blocks, ``max_bytes`` in all, the oldest given back first) and the
    next call that needs an output of exactly that size writes into it. A
    loop over batches of one shape then allocates nothing after its first
    call. The arrays are ordinary NumPy arrays that own their data; only
    the memory behind them outlives them.

    Parameters
    ----------
    max_bytes : int
        0 or more. 0 turns the cache off and gives back what it holds.

    Returns
    -------
    int
        The previous limit.

    Raises
    ------
    TypeError
        ``max_bytes`` is not an int.
    ValueError
        ``max_bytes`` is negative or not below 2**64.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise TypeError(f"max_bytes: expected an int, got {type(max_bytes).__name__}")
    if max_bytes < 0:
        raise ValueError(f"max_bytes: expected an int of 0 or more (bytes), got {max_bytes}")
    return int(_core.set_output_cache(max_bytes))


def get_output_cache() -> OutputCache:
    """The output cache's limit and what it holds now (see :func:`set_output_cache`)."""
    return OutputCache(*_core.output_cache())


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
    cache = os.environ.get("LAYERNORM_C_OUTPUT_CACHE", "").strip()
    if cache:
        try:
            set_output_cache(int(cache))
        except ValueError as exc:
            warnings.warn(f"LAYERNORM_C_OUTPUT_CACHE ignored: {exc}", RuntimeWarning,
                          stacklevel=3)
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
