"""bfloat16, when ml_dtypes is installed: its dtype, checked, and the C
core's loops registered for its type number, as soon as ml_dtypes is
imported (before or after layernorm_c). A bfloat16 array cannot exist
before that, so the loops are always there when one arrives, and
``import layernorm_c`` never imports ml_dtypes itself (1.2 s here).

Without ml_dtypes nothing here does anything, and nothing else changes.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Optional

import numpy as np

from . import _core, _on_import

__all__ = ["BFLOAT16", "install", "register"]

#: ``ml_dtypes.bfloat16``'s dtype once registered, else None.
BFLOAT16: Optional[np.dtype[Any]] = None

# float32 values and the bfloat16 bits round-to-nearest-even gives them:
# exact ones, and two halfway cases (ties to the even neighbour).
_PROBE = ((1.0, 0x3F80), (-2.5, 0xC020), (1.00390625, 0x3F80), (1.01171875, 0x3F82))


def register() -> Optional[np.dtype[Any]]:
    """Import ml_dtypes if it is installed, check that its bfloat16 is the
    top half of a binary32 rounded to nearest even, and register the
    core's bfloat16 loops. Returns the dtype, or None without ml_dtypes (or
    with one whose bfloat16 is not that)."""
    global BFLOAT16
    if BFLOAT16 is not None:
        return BFLOAT16
    try:
        if importlib.util.find_spec("ml_dtypes") is None:
            return None
    except (ImportError, ValueError):  # blocked (sys.modules entry None) or broken
        return None
    try:
        import ml_dtypes  # the optional bf16 extra

        dt: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
        bits = np.array([v for v, _ in _PROBE], np.float32).astype(dt).view(np.uint16)
    except Exception:  # a broken ml_dtypes install must not break layernorm_c
        return None
    if dt.itemsize != 2 or [int(b) for b in bits] != [b for _, b in _PROBE]:
        return None
    _core._register_bfloat16(dt)
    BFLOAT16 = dt
    return dt


def install() -> None:
    """At import of layernorm_c: register now if ml_dtypes is imported,
    else once it is."""
    _on_import.when_imported("ml_dtypes", register)
