"""The ops the batteries validate, LayerNorm and RMSNorm: what a check needs
to know of each (its name, its float64 reference, how its weight scales)
and the audit dtypes with what they need (bfloat16 through ml_dtypes).

A probe carries one :class:`Op`; the checks both batteries share read the
op's words and reference from it rather than naming LayerNorm.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal, Optional, Tuple

import numpy as np
import numpy.typing as npt

from .._reference import (reference_layer_norm, reference_layer_norm_backward,
                          reference_rms_norm, reference_rms_norm_backward)

__all__ = ["Op", "LAYER_NORM", "rms_norm_op", "OpName", "OPS", "Convention", "CONVENTIONS",
           "audit_dtype", "is_float", "bfloat16", "unit_roundoff"]

#: The ops, by the name the command line and the plugin use.
OpName = Literal["layer_norm", "rms_norm"]
OPS: Final[Tuple[OpName, ...]] = ("layer_norm", "rms_norm")
#: How an RMSNorm's weight scales: ``weight`` (LLaMA, T5) or ``1 + weight``
#: (Gemma).
Convention = Literal["weight", "1+weight"]
CONVENTIONS: Final[Tuple[Convention, ...]] = ("weight", "1+weight")

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Op:
    """One op under audit.

    Attributes
    ----------
    key : {'layer_norm', 'rms_norm'}
    name : str
        How reports name the op (``'LayerNorm'``, ``'RMSNorm'``).
    convention : {'weight', '1+weight'}
        How the weight scales (RMSNorm only; LayerNorm's is ``'weight'``).
    """

    key: OpName
    name: str
    convention: Convention = "weight"

    @property
    def reference_name(self) -> str:
        """The float64 reference the checks compare with."""
        return f"reference_{self.key}"

    @property
    def plus_one(self) -> bool:
        return self.convention == "1+weight"

    def scale(self, weight: npt.ArrayLike) -> F64:
        """The factor a weight multiplies the normalized record by."""
        w = np.asarray(weight, np.float64)
        out: F64 = 1.0 + w if self.plus_one else w
        return out

    def neutral_weight(self, d: int) -> F64:
        """The weight that scales by 1: ones, or zeros for ``1 + weight``."""
        return np.zeros(d) if self.plus_one else np.ones(d)

    def reference(self, x: npt.ArrayLike, weight: Optional[npt.ArrayLike],
                  bias: Optional[npt.ArrayLike], eps: float) -> F64:
        """The float64 reference output of exactly these inputs."""
        if self.key == "rms_norm":
            return reference_rms_norm(x, weight, eps, convention=self.convention).y
        return reference_layer_norm(x, weight, bias, eps).y

    def reference_backward(self, dy: npt.ArrayLike, x: npt.ArrayLike,
                           weight: Optional[npt.ArrayLike], eps: float) -> Any:
        """The float64 reference gradients (``dx, dweight, dbias``; an
        RMSNorm's dbias is None)."""
        if self.key == "rms_norm":
            return reference_rms_norm_backward(dy, x, weight, eps, convention=self.convention)
        return reference_layer_norm_backward(dy, x, weight, eps)

    @property
    def overflow_advice(self) -> str:
        """What a float16 overflow points to."""
        if self.key == "rms_norm":
            return ("x^2 is computed in float16, where it overflows for |x| above 256 (and "
                    "the sum of squares above 65504); square and sum in float32")
        return ("the statistics are computed in float16, where sums and squares overflow "
                "above 65504 (the square of anything above 256 does); compute them in float32")


LAYER_NORM: Final = Op("layer_norm", "LayerNorm")


def rms_norm_op(convention: str = "weight") -> Op:
    """The RMSNorm op with the given weight convention.

    Raises
    ------
    ValueError
        An unknown convention.
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"convention: expected 'weight' (LLaMA, T5) or '1+weight' (Gemma), "
                         f"got {convention!r}")
    return Op("rms_norm", "RMSNorm", "1+weight" if convention == "1+weight" else "weight")


def bfloat16() -> Optional[np.dtype[Any]]:
    """ml_dtypes' bfloat16 as layernorm_c registered it (importing
    ml_dtypes when installed: the harness tests bfloat16 too), or None."""
    from .. import _bf16

    return _bf16.register()


def audit_dtype(dtype: npt.DTypeLike) -> np.dtype[Any]:
    """The audit dtype: float16, float32, float64, or bfloat16 when
    ml_dtypes is installed.

    Raises
    ------
    ValueError
        Another dtype, or bfloat16 without ml_dtypes.
    """
    bf16 = bfloat16()
    if isinstance(dtype, str) and dtype == "bfloat16":
        if bf16 is None:
            raise ValueError("dtype: bfloat16 needs ml_dtypes, which is not installed "
                             "(pip install ml_dtypes, or \"layernorm_c[bf16]\")")
        return bf16
    try:
        dt: np.dtype[Any] = np.dtype(dtype)
    except TypeError as exc:
        raise ValueError(f"dtype: expected float16, float32, float64 or bfloat16, got "
                         f"{dtype!r}") from exc
    if dt in (np.float16, np.float32, np.float64) or (bf16 is not None and dt == bf16):
        return dt
    raise ValueError(f"dtype: expected float16, float32, float64 or bfloat16, got {dt}")


def is_float(dtype: np.dtype[Any]) -> bool:
    """A floating dtype, bfloat16 included (NumPy gives it kind 'V')."""
    bf16 = bfloat16()
    return dtype.kind == "f" or (bf16 is not None and dtype == bf16)


def unit_roundoff(dtype: npt.DTypeLike) -> float:
    """Half the spacing of the dtype at 1 (2^-8 for bfloat16)."""
    dt: np.dtype[Any] = np.dtype(dtype)
    bf16 = bfloat16()
    if bf16 is not None and dt == bf16:
        return 2.0 ** -8
    return float(np.finfo(dt).eps) / 2
