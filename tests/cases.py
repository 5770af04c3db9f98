"""What the tests share, written once: dtypes, the kernels' lane and block
sizes and the record lengths they make interesting, the tests' tolerances,
and the memory layouts arrays are tried in.

Imported as plain ``import cases`` (pytest's pythonpath includes tests/) by
tests/core_strategies.py, tests/fuzz_support.py and the tests. The worked
examples and the core's float dtypes come from the package
(layernorm_c/_cases.py), where ``python -m layernorm_c``, the audit's
hand_rows check and the benchmark read them too.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import numpy as np

from layernorm_c import _core
from layernorm_c._cases import FLOAT_DTYPES, WORKED_EXAMPLES, WorkedExample

__all__ = ["FLOAT_DTYPES", "F16", "F32", "F64", "SWAPPED_FLOAT_DTYPES", "WORKED_EXAMPLES",
           "WorkedExample", "LANES", "BLOCK", "VECTOR_WIDTHS", "around", "BOUNDARY_D",
           "SMALL_D", "Y_TOL", "STATS_TOL", "MOMENTS_TOL", "LAYOUTS", "WRITABLE_LAYOUTS",
           "FUZZ_LAYOUTS", "with_layout", "layout_1d", "byteswapped", "native"]

# ---------------------------------------------------------------- dtypes

F16, F32, F64 = FLOAT_DTYPES
#: The same dtypes in the other byte order ('>f2', '>f4', '>f8' on a
#: little-endian machine): computed like the native ones, to the bit.
SWAPPED_FLOAT_DTYPES: Tuple[np.dtype, ...] = tuple(dt.newbyteorder() for dt in FLOAT_DTYPES)

# ---------------------------------------------------------------- lanes and blocks

#: The reproducibility contract's lane count and block size
#: (csrc/ln_contract.h, LN_LANES and LN_BLOCK) as the core reports them:
#: element i of a record goes to lane i % LANES; float32 lanes are added
#: into float64 lanes every BLOCK elements, BLOCK // LANES per lane.
LANES: int = _core.LANES
BLOCK: int = _core.BLOCK
#: Float lanes of the vector registers (AVX2: 8, AVX-512: 16): the apply
#: loops and the float16 conversions have tails of these lengths.
VECTOR_WIDTHS = (8, 16)


def around(*sizes: int) -> Tuple[int, ...]:
    """Each size with its neighbours, one less and one more (the positive
    ones), sorted."""
    return tuple(sorted({n + k for n in sizes for k in (-1, 0, 1) if n + k > 0}))


#: Record lengths at and next to the kernels' boundaries: the vector widths,
#: one, two and four lane rows, one block, sixteen blocks.
BOUNDARY_D = around(*VECTOR_WIDTHS, LANES, 2 * LANES, 4 * LANES, BLOCK, 16 * BLOCK)
#: Record lengths worth trying one by one: every tail of a lane row, up to
#: two lane rows past the first block.
SMALL_D = BLOCK + 2 * LANES

# ---------------------------------------------------------------- tolerances
# layernorm_c's accuracy contract, which the tests hold it to. It is not
# layernorm_c.testing.TOLERANCES: the audit judges *other* implementations
# and tolerates what a reasonable one loses (float16 within 4e-3; NumPy's
# formula run in float16 uses about a third of that on the benchmark's
# inputs, which the benchmark checks with the audit's table); the tests
# hold layernorm_c to its own, tighter contract (float16 computed in
# float32 and rounded once: 2e-3).
# For every dtype the contract is at least as tight as the audit, so
# layernorm_c passes its own audit (tests/test_cases.py checks both).

#: Per result dtype: an output element may be off from the float64
#: reference by Y_TOL * (1 + its magnitude), plus the terms for the
#: conditioning of its record (see core_strategies.assert_matches_reference
#: and the fuzz oracle, fuzz_support.error_bound).
Y_TOL = {F16: 2e-3, F32: 1e-5, F64: 1e-12}
#: Relative tolerance for the statistics (float32 for float16/float32 input).
STATS_TOL = {F16: 1e-6, F32: 1e-6, F64: 1e-12}
#: How far the mean and the mean square of a well-conditioned eps=0 output
#: record may be from 0 and 1. float16 needs more than Y_TOL: every output
#: is rounded to 11 bits before it is squared and summed.
MOMENTS_TOL = {F16: 5e-3, F32: 1e-5, F64: 1e-12}

# ---------------------------------------------------------------- layouts
# Each layout returns the values of an array (any shape of at least one
# dimension, any dtype) in a new buffer with another memory layout, or
# raises TypeError/ValueError where the dtype cannot have it (an object
# array at an odd address). The random ones (reversed, strided, transposed)
# take their choices from ``rng``, or a fixed choice without one.

Layout = Callable[[np.ndarray, Optional[np.random.Generator]], np.ndarray]


def _into(buf: np.ndarray, index, a: np.ndarray) -> np.ndarray:
    view = buf[index]
    view[...] = a
    return view


def _c(a, rng=None):
    return np.array(a, order="C", copy=True)


def _fortran(a, rng=None):
    return np.array(a, order="F", copy=True)


def _odd_offset(a, rng=None):
    """Contiguous, but starting one element into a larger buffer."""
    return _into(np.zeros(a.size + 1, a.dtype), slice(1, None), a.reshape(-1)).reshape(a.shape)


def _padded_rows(a, rng=None):
    """Rows of a wider buffer, starting at odd element offsets."""
    d = a.shape[-1]
    return _into(np.zeros(a.shape[:-1] + (d + 3,), a.dtype), (..., slice(1, d + 1)), a)


def _misaligned(a, rng=None):
    """At an odd byte address: not aligned even to the item size."""
    raw = np.zeros(a.nbytes + 1, np.uint8)
    view = raw[1:].view(a.dtype).reshape(a.shape)
    view[...] = a
    return view


def _col_strided(a, rng=None):
    """Every second element of each row of a buffer twice as wide."""
    d = a.shape[-1]
    return _into(np.zeros(a.shape[:-1] + (2 * d,), a.dtype), (..., slice(None, None, 2)), a)


def _row_strided(a, rng=None):
    """Every second row (along the first axis) of a buffer twice as long."""
    return _into(np.zeros((2 * a.shape[0],) + a.shape[1:], a.dtype), slice(None, None, 2), a)


def _strided(a, rng=None):
    """Every step-th element along every axis (step 2, or 2-3 drawn)."""
    step = 2 if rng is None else int(rng.integers(2, 4))
    buf = np.zeros(tuple(n * step for n in a.shape), a.dtype)
    return _into(buf, tuple(slice(None, None, step) for _ in a.shape), a)


def _flipped(a, axes):
    return np.flip(np.array(np.flip(a, axes), order="C", copy=True), axes)


def _rows_reversed(a, rng=None):
    """Negative stride along the first axis."""
    return _flipped(a, (0,))


def _cols_reversed(a, rng=None):
    """Negative stride along the last axis."""
    return _flipped(a, (a.ndim - 1,))


def _reversed(a, rng=None):
    """Negative strides along every axis (or along a drawn set of axes)."""
    axes = tuple(range(a.ndim)) if rng is None else \
        tuple(i for i in range(a.ndim) if rng.integers(0, 2)) or (a.ndim - 1,)
    return _flipped(a, axes)


def _transposed(a, rng=None):
    """Axes in memory in another order: reversed (Fortran-like), or a drawn
    permutation."""
    perm = np.arange(a.ndim)[::-1] if rng is None else rng.permutation(a.ndim)
    return np.transpose(np.array(np.transpose(a, perm), order="C", copy=True), np.argsort(perm))


def byteswapped(a: np.ndarray) -> np.ndarray:
    """The same values in the other byte order ('>f4' on little-endian
    machines). A dtype without a byte order (bool, int8, ...) raises
    TypeError."""
    if a.dtype.byteorder == "|" or a.dtype.kind in "OVT":
        raise TypeError(f"{a.dtype} has no byte order")
    return a.astype(a.dtype.newbyteorder())


def _byteswapped(a, rng=None):
    return byteswapped(a)


def _readonly(a, rng=None):
    """A C-contiguous copy that cannot be written."""
    b = np.array(a, order="C", copy=True)
    b.flags.writeable = False
    return b


#: Every memory layout the tests try, by name.
LAYOUTS: Dict[str, Layout] = {
    "C": _c,
    "fortran": _fortran,
    "odd_offset": _odd_offset,
    "padded_rows": _padded_rows,
    "misaligned": _misaligned,
    "col_strided": _col_strided,
    "row_strided": _row_strided,
    "strided": _strided,
    "rows_reversed": _rows_reversed,
    "cols_reversed": _cols_reversed,
    "reversed": _reversed,
    "transposed": _transposed,
    "byteswapped": _byteswapped,
    "readonly": _readonly,
}
#: The layouts an output (out=) can have.
WRITABLE_LAYOUTS = tuple(name for name in LAYOUTS if name != "readonly")
#: What the fuzz draws from: every layout, the plain C one more often.
FUZZ_LAYOUTS = ("C", "C") + tuple(LAYOUTS)


def with_layout(a: np.ndarray, name: str, rng: Optional[np.random.Generator] = None
                ) -> np.ndarray:
    """``a`` in layout ``name``; ``a`` itself where it has no dimension or
    its dtype cannot have that layout."""
    if a.ndim == 0:
        return a
    try:
        return LAYOUTS[name](a, rng)
    except (TypeError, ValueError):
        return a


def layout_1d(name: str, p: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """The layout applied to a 1-d parameter (weight or bias) as to a row of
    a batch (None stays None)."""
    return None if p is None else LAYOUTS[name](p[None, :], None)[0]


def native(a: np.ndarray) -> np.ndarray:
    """``a`` in the machine's byte order (the same values; ``a`` itself if
    it is already), to compare bits with a result of a native call."""
    a = np.asarray(a)
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))

