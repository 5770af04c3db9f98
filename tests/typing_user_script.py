"""A realistic user script touching every public name of layernorm_c and
layernorm_c.testing. tests/test_typing.py type-checks it with
``mypy --strict`` (no errors allowed) and also runs it: the annotations must
describe what the functions really take and return."""
from __future__ import annotations

from typing import Any, List, Optional

import numpy as np
from numpy.typing import NDArray

import layernorm_c as lnc
from layernorm_c.testing import (
    BACKWARD_CHECKS,
    CHECKS,
    DEFAULT_BACKWARD_SIGNATURE,
    DEFAULT_SIGNATURE,
    TOLERANCES,
    AuditReport,
    BackwardImplementation,
    CheckResult,
    Implementation,
    LayerNormAudit,
    LayerNormAuditWarning,
    LayerNormBackwardAudit,
    Tolerance,
    adapt,
    check_layer_norm,
    check_layer_norm_backward,
    describe_backward_checks,
    describe_checks,
    layer_norm_backward_checks,
    layer_norm_checks,
)


def my_layer_norm(x: NDArray[Any], weight: Optional[NDArray[Any]],
                  bias: Optional[NDArray[Any]], eps: float) -> NDArray[Any]:
    """The kind of prototype a user validates."""
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    y: NDArray[Any] = (x - mean) / np.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def forward(x: NDArray[np.float32], g: NDArray[np.float32], b: NDArray[np.float32]
            ) -> NDArray[Any]:
    y = lnc.layer_norm(x, g, b, eps=1e-5)
    shape: tuple[int, ...] = y.shape
    assert shape == x.shape
    return y


def statistics(x: NDArray[np.float64]) -> float:
    res = lnc.layer_norm(x, axis=(-2, -1), return_stats=True)
    mean: NDArray[Any] = res.mean
    var: NDArray[Any] = res.var
    y, _, _ = res
    assert y.shape == x.shape
    return float(mean.sum() + var.sum())


def settings() -> List[str]:
    levels = list(lnc.supported_isas())
    old_isa, old_threads = lnc.get_isa(), lnc.get_num_threads()
    lnc.set_isa(levels[-1])
    lnc.set_num_threads(min(2, lnc.MAX_THREADS))
    assert lnc.thread_threshold() > 0
    lnc.set_isa(old_isa)
    lnc.set_num_threads(old_threads)
    return levels


def my_backward(dy: NDArray[Any], x: NDArray[Any], weight: Optional[NDArray[Any]],
                bias: Optional[NDArray[Any]], eps: float
                ) -> "tuple[NDArray[Any], NDArray[Any], NDArray[Any]]":
    """A backward a user validates: layernorm_c's own, through the reference."""
    grads: lnc.ReferenceGrads = lnc.reference_layer_norm_backward(dy, x, weight, eps)
    return grads.dx.astype(x.dtype), grads.dweight, grads.dbias


def backward_audit() -> None:
    report: AuditReport = check_layer_norm_backward(my_backward, checks=["hand_rows", "paths"])
    print(report.summary(), describe_backward_checks().count("\n") + 1 == len(BACKWARD_CHECKS))
    audit = LayerNormBackwardAudit(my_backward, dtype="float64",
                                   signature=DEFAULT_BACKWARD_SIGNATURE)
    print(audit.run(layer_norm_backward_checks(exclude=["param_invariance"])[:3]).ok)
    impl: BackwardImplementation = adapt(my_backward, backward=True)
    print(impl.name, impl.returns_dweight)


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    g = np.ones(8, np.float32)
    b = np.zeros(8, np.float32)
    out = np.empty_like(x)
    y = forward(x, g, b)
    lnc.layer_norm(x, g, b, np.float32(1e-5), out=out)
    assert np.array_equal(y, out)
    raw: NDArray[Any] = lnc.layer_norm_ufunc(x, g, b, 1e-5)
    assert raw.shape == x.shape
    ref: lnc.ReferenceResult = lnc.reference_layer_norm(x, g, b, 1e-5)
    assert np.allclose(ref.y, y, atol=1e-5)
    result: lnc.LayerNormResult = lnc.layer_norm(x, return_stats=True)
    print(lnc.__version__, statistics(x.astype(np.float64)), settings(), result.var.dtype)

    report: AuditReport = check_layer_norm(lnc.layer_norm, dtype="float64", checks=["hand_rows"])
    first: CheckResult = report.results[0]
    print(first.name, first.status, report.ok, len(report.failures))
    audit = LayerNormAudit(my_layer_norm, dtype="float32", eps=1e-5, name="mine")
    mine = audit.run(["hand_rows", "eps"])
    print(mine.summary(), [r.diagnosis for r in mine.failures])
    impl: Implementation = adapt(my_layer_norm, DEFAULT_SIGNATURE)
    print(impl.name, describe_checks().count("\n") + 1 == len(CHECKS))
    tol: Tolerance = TOLERANCES[np.dtype(np.float32)]
    print(tol.rtol, layer_norm_checks(exclude=["float16_overflow"])[:2])
    print(issubclass(LayerNormAuditWarning, UserWarning))
    backward_audit()


if __name__ == "__main__":
    main()
