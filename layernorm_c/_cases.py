"""Facts shared by ``python -m layernorm_c``, the audit battery
(``layernorm_c.testing``), the test suite and the benchmark, written once:
the float dtypes the C core computes, and the worked examples.

Private: the names here are not part of the public API. The tolerances are
not here: the audit's (for any implementation) are
``layernorm_c.testing.TOLERANCES``; the test suite's (for layernorm_c's
own, tighter contract) are in tests/cases.py, which says why they differ.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Tuple

import numpy as np

__all__ = ["FLOAT_DTYPES", "WorkedExample", "WORKED_EXAMPLES", "RMSWorkedExample",
           "RMS_WORKED_EXAMPLES"]

#: The dtypes the C core computes natively, one kernel loop each (float16
#: internally in float32). Other real dtypes (integers, bool) are computed
#: in float64.
FLOAT_DTYPES: Tuple[np.dtype[Any], ...] = (
    np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


class WorkedExample(NamedTuple):
    """A record with its hand-computed statistics and output (eps 0, no
    gain or bias), as the project's seeds give them."""

    row: Tuple[float, ...]
    mean: float
    var: float  # population variance (divided by d)
    y: Tuple[float, ...]  # rounded to ``decimals`` places

    @property
    def decimals(self) -> int:
        """The decimal places ``y`` is given to: each value is within half a
        unit of that place of the exact output."""
        return max(len(repr(v).partition(".")[2]) for v in self.y)


#: The worked examples: [1, 2, 3, 4] and [10, 12, 8, 14]. Their means and
#: variances are exact in binary floating point.
WORKED_EXAMPLES: Tuple[WorkedExample, ...] = (
    WorkedExample((1.0, 2.0, 3.0, 4.0), 2.5, 1.25,
                  (-1.341641, -0.447214, 0.447214, 1.341641)),
    WorkedExample((10.0, 12.0, 8.0, 14.0), 11.0, 5.0,
                  (-0.4472, 0.4472, -1.3416, 1.3416)),
)


class RMSWorkedExample(NamedTuple):
    """A record with its hand-computed mean square and RMSNorm output (eps
    0, no weight)."""

    row: Tuple[float, ...]
    ms: float  # mean(x^2)
    y: Tuple[float, ...]  # x / sqrt(ms), rounded to ``decimals`` places

    @property
    def decimals(self) -> int:
        """The decimal places ``y`` is given to."""
        return max(len(repr(v).partition(".")[2]) for v in self.y)


#: RMSNorm's worked examples: [3, 4] (mean square 12.5, rms 3.5355...) and
#: [1, 2, 3, 4] (mean square 7.5). Their mean squares are exact.
RMS_WORKED_EXAMPLES: Tuple[RMSWorkedExample, ...] = (
    RMSWorkedExample((3.0, 4.0), 12.5, (0.848528, 1.131371)),
    RMSWorkedExample((1.0, 2.0, 3.0, 4.0), 7.5, (0.365148, 0.730297, 1.095445, 1.460593)),
)
