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
    DEFAULT_RMS_BACKWARD_SIGNATURE,
    DEFAULT_RMS_SIGNATURE,
    DEFAULT_SIGNATURE,
    RMS_BACKWARD_CHECKS,
    RMS_CHECKS,
    RMSNormAudit,
    RMSNormBackwardAudit,
    check_rms_norm,
    check_rms_norm_backward,
    describe_rms_backward_checks,
    describe_rms_checks,
    rms_norm_backward_checks,
    rms_norm_checks,
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


def my_rms_norm(x: NDArray[Any], weight: Optional[NDArray[Any]], eps: float) -> NDArray[Any]:
    y: NDArray[Any] = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    return y if weight is None else y * weight


def rms_audit() -> None:
    report: AuditReport = check_rms_norm(my_rms_norm, checks=["hand_rows", "eps"],
                                         signature=DEFAULT_RMS_SIGNATURE)
    print(report.summary(), describe_rms_checks().count("\n") + 1 == len(RMS_CHECKS))
    gemma = RMSNormAudit(lnc.rms_norm, convention="1+weight", dtype="float64", eps=1e-6)
    print(gemma.run(rms_norm_checks(exclude=["accumulation"])[:3]).ok, gemma.convention)
    back: AuditReport = check_rms_norm_backward(lnc.rms_norm_backward, checks=["paths"])
    audit = RMSNormBackwardAudit(lnc.reference_rms_norm_backward,
                                 signature=DEFAULT_RMS_BACKWARD_SIGNATURE, dtype="float64")
    print(back.ok, audit.run(rms_norm_backward_checks(exclude=["param_invariance"])[:2]).ok,
          describe_rms_backward_checks().count("\n") + 1 == len(RMS_BACKWARD_CHECKS))
    grads: lnc.ReferenceRMSGrads = lnc.reference_rms_norm_backward(
        np.ones((1, 2)), np.array([[3.0, 4.0]]), None, 0.0, convention="weight")
    print(grads.dx.shape, grads.dweight.dtype)
    # rms_norm's overloads: an array, or the result with the mean square.
    x = np.array([[3.0, 4.0]], np.float32)
    y: NDArray[Any] = lnc.rms_norm(x, np.ones(2, np.float32), 1e-6, convention="1+weight")
    stats: lnc.RMSNormResult = lnc.rms_norm(x, return_stats=True)
    rms_grads: lnc.RMSNormGrads = lnc.rms_norm_backward(np.ones_like(x), x, ms=stats.ms)
    print(y.dtype, stats.ms.shape, rms_grads.dweight.shape)


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
    rms_audit()


if __name__ == "__main__":
    main()
