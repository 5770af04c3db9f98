"""The backward battery (LayerNormBackwardAudit): every broken backward in
ln_backward_gallery is caught by the right check with the right diagnosis;
layernorm_c, the float64 reference and torch autograd pass; the adapters,
options, the reference backward, the CLI and the pytest plugin."""
import math
import textwrap
import warnings

import numpy as np
import pytest

import layernorm_c
import ln_backward_gallery as gallery
from layernorm_c.testing import (
    BACKWARD_CHECKS,
    AuditReport,
    LayerNormAuditWarning,
    LayerNormBackwardAudit,
    adapt,
    check_layer_norm_backward,
    describe_backward_checks,
    from_jax,
    from_torch,
    layer_norm_backward_checks,
)
from layernorm_c.testing._backward_numerics import decompose_dx, model_dx, record_terms
from layernorm_c.testing._report import contradictions
from layernorm_c.testing._cli import main

#: Checks that report a symptom (wrong numbers) without naming a cause.
SYMPTOMS = {"hand_rows", "reference"}

# (implementation, the check that must name it, words its diagnosis must
# contain, whether every other failing check is a mere symptom)
GALLERY = [
    (gallery.statistics_constant, "paths",
     ["statistics treated as constants", "no gradient through the mean and the variance"],
     True),
    (gallery.mean_path_missing, "paths", ["only the mean path missing", "-rstd * mean(g)"],
     True),
    (gallery.variance_path_missing, "paths",
     ["only the variance path missing", "-rstd * xhat * mean(g * xhat)"], True),
    (gallery.sample_variance, "variance", ["sample variance in the backward", "d - 1"], True),
    (gallery.eps_hard_coded, "eps",
     ["eps different from the forward's", "does not use the eps it is given",
      "eps = 1e-05 whatever the forward's"], True),
    (gallery.eps_ignored, "eps", ["eps different from the forward's", "eps ignored"], True),
    (gallery.eps_twice, "eps", ["eps different from the forward's", "eps applied twice"], True),
    (gallery.eps_on_std, "eps",
     ["eps different from the forward's", "eps added to the standard deviation",
      "1 / (sqrt(var) + eps) with the forward's eps"], True),
    (gallery.sums_over_batch_only, "param_sums",
     ["summed over the wrong axes", "over the batch (axis 0) but not the positions",
      "shape (5, 16) for x of shape (3, 5, 16)"], True),
    (gallery.sums_averaged, "param_sums", ["averaged instead of summed"], True),
    (gallery.sign_error, "paths", ["sign error", "negative of the gradient"], True),
    (gallery.variance_term_sign, "paths", ["sign error in the variance term"], True),
    (gallery.parameter_gradients_negated, "param_grads",
     ["sign error in the parameter gradients"], True),
    (gallery.dweight_from_output, "param_grads", ["dweight sums dy * y"], True),
    (gallery.batch_coupled, "coupling",
     ["dx coupled across records", "statistics across the whole batch"], False),
    (gallery.one_pass_float32, "cancellation",
     ["cancellation at large offsets", "E[x^2] - E[x]^2"], True),
    (gallery.float16_native, "float16_overflow", ["float16 overflow", "65504"], True),
    (gallery.batch_max_scaling, "nonfinite", ["NaN/Inf leaks into other records' dx"], True),
    (gallery.AccumulatingGradients, "state", ["parameter gradients accumulate across calls"],
     True),
    (gallery.sequential_float32, "large_d",
     ["the error grows with d", "max dx error by d: 2^10",
      "dx's sums (mean(g) and mean(g * xhat)) or the statistics are accumulated in one "
      "running sum"], True),
]


def _make(impl):
    return impl() if isinstance(impl, type) else impl


@pytest.mark.parametrize("impl, check, words, exclusive", GALLERY,
                         ids=[g[0].__name__ for g in GALLERY])
def test_gallery_defect_is_named(impl, check, words, exclusive):
    report = LayerNormBackwardAudit(_make(impl)).run()
    result = report[check]
    assert result.status == "fail", str(report)
    for word in words:
        assert word in result.diagnosis, result.diagnosis
    assert not report.ok
    if exclusive:
        # No other check blames a different defect (a check that cannot
        # measure skips instead).
        others = {r.name for r in report.failures} - {check}
        assert others <= SYMPTOMS, str(report)
        assert not report.warnings, str(report)
    assert contradictions(report.results) == {}, str(report)


def test_float32_rounded_eps_is_named_in_float64():
    report = LayerNormBackwardAudit(gallery.float32_eps, dtype="float64").run()
    result = report["eps"]
    assert result.status == "fail", str(report)
    for word in ("eps rounded to float32 in the backward", "9.999999747378752e-06 for eps=1e-05",
                 "eps in use 9.9999997e-06"):
        assert word in result.diagnosis + result.figure, str(report)
    assert {r.name for r in report.failures} - {"eps"} <= SYMPTOMS, str(report)


@pytest.mark.parametrize("dtype", ["float64", "float16"])
@pytest.mark.parametrize("impl, check, words", [
    (gallery.statistics_constant, "paths", ["statistics treated as constants"]),
    (gallery.mean_path_missing, "paths", ["only the mean path missing"]),
    (gallery.variance_path_missing, "paths", ["only the variance path missing"]),
    (gallery.sample_variance, "variance", ["sample variance in the backward"]),
    (gallery.eps_hard_coded, "eps", ["eps = 1e-05 whatever the forward's"]),
    (gallery.sign_error, "paths", ["negative of the gradient"]),
    (gallery.sums_over_batch_only, "param_sums", ["over the batch (axis 0) but not"]),
], ids=lambda v: getattr(v, "__name__", None))
def test_diagnoses_hold_in_other_dtypes(impl, check, words, dtype):
    result = LayerNormBackwardAudit(impl, dtype=dtype).run([check])[check]
    assert result.status == "fail", str(result)
    for word in words:
        assert word in result.diagnosis, result.diagnosis


@pytest.mark.parametrize("d", [4, 768])
def test_diagnoses_hold_at_other_sizes(d):
    audit = {n: LayerNormBackwardAudit(f, d=d).run([c])[c] for n, f, c in [
        ("constant", gallery.statistics_constant, "paths"),
        ("sample", gallery.sample_variance, "variance"),
        ("eps", gallery.eps_hard_coded, "eps"),
        ("correct", gallery.numpy_float32, "paths")]}
    assert "statistics treated as constants" in audit["constant"].diagnosis
    assert "sample variance" in audit["sample"].diagnosis
    assert f"d={d}" in audit["sample"].diagnosis
    assert "eps = 1e-05" in audit["eps"].diagnosis
    assert audit["correct"].status == "pass"


def test_figures_carry_the_measurements():
    report = LayerNormBackwardAudit(gallery.mean_path_missing).run(["paths"])
    paths = report["paths"]
    assert paths.figure == "mean path x0.00, variance path x1.00, sign +1"
    assert paths.values["mean_path"] == 0.0 and paths.values["var_path"] == 1.0
    sample = LayerNormBackwardAudit(gallery.sample_variance).run(["variance"])["variance"]
    assert sample.values["ratio"] == pytest.approx(math.sqrt(7 / 8), abs=1e-4)
    assert "0.9354" in sample.figure
    eps = LayerNormBackwardAudit(gallery.eps_hard_coded).run(["eps"])["eps"]
    assert eps.values["eps"] == [1e-5, 0.1, 1.0]
    assert eps.values["estimates"] == pytest.approx([1e-5] * 3, rel=1e-3)


def test_order_dependent_sums_are_a_warning_in_ulp():
    report = LayerNormBackwardAudit(gallery.order_dependent_sums).run()
    assert report.ok, str(report)
    (warning,) = report.warnings
    assert warning.name == "param_invariance"
    assert "depend on the thread count or record order" in warning.diagnosis
    assert "with the records permuted" in warning.diagnosis
    assert warning.values["ulp"] > 0 and f"{warning.values['ulp']:.0f} ulp" in warning.figure
    strict = LayerNormBackwardAudit(gallery.order_dependent_sums, strict_batch_invariance=True)
    assert strict.run(["param_invariance"])["param_invariance"].status == "fail"


def test_dx_bits_that_change_with_the_batch_are_a_warning():
    def batch_dependent(dy, x, weight, bias, eps):
        # Correct, but dx in float32 rounds differently for an odd number
        # of records (sequential vs pairwise sums).
        dx, dw, db = gallery.numpy_float32(dy, x, weight, bias, eps)
        x32 = np.asarray(x, np.float32)
        if (x32.size // x32.shape[-1]) % 2:
            dx = (dx.astype(np.float64) * (1 + 2 ** -22)).astype(np.float32)
        return dx, dw, db

    result = LayerNormBackwardAudit(batch_dependent).run(["coupling"])["coupling"]
    assert result.status == "warn", str(result)
    assert "dx not batch-invariant" in result.diagnosis
    strict = LayerNormBackwardAudit(batch_dependent, strict_batch_invariance=True)
    assert strict.run(["coupling"])["coupling"].status == "fail"


def test_a_stateful_backward_is_not_misdiagnosed():
    report = LayerNormBackwardAudit(gallery.AccumulatingGradients()).run()
    for name in ("param_grads", "param_sums", "cancellation", "param_invariance"):
        assert report[name].status == "skip", str(report)
        assert "state check" in report[name].diagnosis


def test_wrong_shaped_parameter_gradients_leave_the_dx_checks_alone():
    report = LayerNormBackwardAudit(gallery.sums_over_batch_only).run()
    for name in ("coupling", "nonfinite", "state", "paths"):
        assert report[name].status == "pass", str(report)
    assert report["param_invariance"].status == "skip"
    assert "param_sums" in report["reference"].diagnosis


def test_fixed_leading_shape_still_names_the_summed_axes():
    result = LayerNormBackwardAudit(gallery.sums_over_batch_only, d=32,
                                    leading_shape=(4, 8)).run(["param_sums"])["param_sums"]
    assert "over the batch (axis 0) but not the positions" in result.diagnosis
    assert "shape (8, 32) for x of shape (4, 8, 32)" in result.diagnosis


# -- correct implementations ---------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("impl", [layernorm_c.layer_norm_backward,
                                  layernorm_c.reference_layer_norm_backward,
                                  layernorm_c.LayerNorm(32)],
                         ids=["layer_norm_backward", "reference", "LayerNorm_layer"])
def test_layernorm_c_and_the_reference_pass_everything(impl, dtype):
    checks = list(BACKWARD_CHECKS)
    report = LayerNormBackwardAudit(impl, dtype=dtype).run(checks)
    expected = {name: "pass" for name in checks}
    if isinstance(impl, layernorm_c.LayerNorm):
        expected["large_d"] = "skip"  # a layer has its own d
    assert {r.name: r.status for r in report} == expected, str(report)


def test_numpy_float32_backward_passes():
    for dtype in ("float32", "float64"):
        report = LayerNormBackwardAudit(gallery.numpy_float32, dtype=dtype).run()
        assert [r.status for r in report] == ["pass"] * len(BACKWARD_CHECKS), str(report)


def test_default_battery_is_light():
    """The default battery's work, counted rather than timed (no timing in
    a unit test): about 75 calls and 3 million elements of dy today, for
    well under a second of layernorm_c; the bounds leave room to grow."""
    calls, elements = [], []

    def counted(dy, x, weight, bias, eps):
        calls.append(1)
        elements.append(np.size(dy))
        g = layernorm_c.layer_norm_backward(dy, x, weight, eps)
        return g.dx, g.dweight, g.dbias

    report = LayerNormBackwardAudit(counted).run()
    assert {r.status for r in report} == {"pass"}, str(report)
    assert len(calls) <= 150 and sum(elements) <= 6_000_000, (len(calls), sum(elements))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_torch_autograd_passes(dtype):
    torch = pytest.importorskip("torch")
    report = LayerNormBackwardAudit(torch.nn.functional.layer_norm, dtype=dtype).run()
    # torch's CPU backward sums dy * weight * x (x not centred) in running
    # vector sums: in float32 and float64 dx's error grows with d (from a
    # few units of roundoff at d = 2^10 to hundreds at 2^20, as
    # docs/validating.rst reports). That is a finding, named as such; every
    # other check passes.
    assert {r.name for r in report.failures} <= {"large_d"}, str(report)
    if not report.ok:
        assert "the error grows with d" in report["large_d"].diagnosis
    assert report.title.endswith(f"({dtype}, eps=1e-05, torch autograd)")
    # torch sums the parameter gradients in an order that depends on the
    # layout and the thread count: the one legitimate warning.
    assert {r.name for r in report.warnings} <= {"param_invariance"}, str(report)
    assert not report.skipped


def test_torch_module_with_its_own_eps_and_size():
    torch = pytest.importorskip("torch")
    module = torch.nn.LayerNorm(24, eps=1e-6)
    audit = LayerNormBackwardAudit(module)
    assert (audit.eps, audit.impl.d, audit.impl.autodiff) == (1e-6, 24, "torch autograd")
    report = audit.run()
    assert report.ok, str(report)
    assert torch.equal(module.weight, torch.ones(24)) and module.weight.grad is None
    no_affine = LayerNormBackwardAudit(torch.nn.LayerNorm(16, elementwise_affine=False)).run()
    assert no_affine.ok, str(no_affine)
    assert {r.name for r in no_affine.skipped} == {"param_grads", "param_sums",
                                                   "param_invariance", "large_d"}


def test_torch_modules_with_defects_are_named():
    torch = pytest.importorskip("torch")

    class Norm(torch.nn.Module):
        def __init__(self, d, detach=False, unbiased=False):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(d))
            self.bias = torch.nn.Parameter(torch.zeros(d))
            self.eps, self.detach, self.unbiased = 1e-5, detach, unbiased

        def forward(self, x):
            mean = x.mean(-1, keepdim=True)
            var = x.var(-1, keepdim=True, unbiased=self.unbiased)
            if self.detach:
                mean, var = mean.detach(), var.detach()
            return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias

    detached = LayerNormBackwardAudit(Norm(16, detach=True)).run(["paths", "variance"])
    assert "statistics treated as constants" in detached["paths"].diagnosis
    assert detached["variance"].status == "pass"
    unbiased = LayerNormBackwardAudit(Norm(16, unbiased=True)).run(["paths", "variance"])
    # Autograd through var(unbiased=True): the variance check names it, and
    # the paths check sees the sample variance's own variance path.
    assert "sample variance in the backward" in unbiased["variance"].diagnosis
    assert unbiased["paths"].status == "pass"
    assert "see the variance check" in unbiased["paths"].diagnosis


def test_torch_forward_function_and_backward_function():
    torch = pytest.importorskip("torch")

    def forward(x, weight, bias, eps):
        assert isinstance(x, torch.Tensor)
        return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps)

    impl = from_torch(forward, "x, weight, bias, eps", backward=True)
    assert impl.autodiff == "torch autograd" and impl.threads is not None
    checks = ["reference", "paths", "param_sums"]
    assert LayerNormBackwardAudit(impl).run(checks).ok

    def backward(dy, x, weight, eps):
        assert isinstance(dy, torch.Tensor)
        g = layernorm_c.layer_norm_backward(dy.numpy(), x.numpy(), weight.numpy(), eps)
        return torch.from_numpy(g.dx), torch.from_numpy(g.dweight), torch.from_numpy(g.dbias)

    report = LayerNormBackwardAudit(backward, framework="torch",
                                    signature="dy, x, weight, eps").run(checks)
    assert report.ok, str(report)


def test_jax_vjp_passes_and_a_stop_gradient_is_named():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")

    def layer_norm(x, weight, bias, eps, stop=False):
        mean = x.mean(axis=-1, keepdims=True)
        if stop:
            mean = jax.lax.stop_gradient(mean)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + eps) * weight + bias

    checks = ["reference", "paths", "variance", "eps", "param_grads", "param_sums"]
    good = LayerNormBackwardAudit(jax.jit(layer_norm), signature="x, weight, bias, eps")
    assert good.impl.framework == "jax" and good.impl.autodiff == "jax.vjp"
    report = good.run(checks)
    assert report.ok, str(report)

    def stopped(x, weight, bias, eps):
        return layer_norm(x, weight, bias, eps, stop=True)

    bad = LayerNormBackwardAudit(from_jax(stopped, "x, weight, bias, eps", backward=True))
    assert "only the mean path missing" in bad.run(["paths"])["paths"].diagnosis


# -- calling conventions and options ----------------------------------------------------

def _ours(dy, x, weight=None, eps=1e-5):
    return layernorm_c.layer_norm_backward(dy, x, weight, eps)


@pytest.mark.parametrize("signature, fn, skipped", [
    ("dy, x, eps", lambda dy, x, eps: _ours(dy, x, eps=eps), []),
    ("dy, x, weight, eps -> dx, dweight",
     lambda dy, x, w, eps: _ours(dy, x, w, eps)[:2], []),
    ("dy, x, weight, eps -> dx", lambda dy, x, w, eps: _ours(dy, x, w, eps).dx,
     ["param_grads", "param_sums", "param_invariance"]),
    ("x, dy, *, weight, eps -> dbias, dweight, dx",
     lambda x, dy, *, weight, eps: _ours(dy, x, weight, eps)[::-1], []),
    ("dy, x", lambda dy, x: _ours(dy, x), []),
])
def test_signatures(signature, fn, skipped):
    report = LayerNormBackwardAudit(fn, signature=signature).run()
    assert report.ok, str(report)
    assert [r.name for r in report.skipped] == skipped


@pytest.mark.parametrize("signature, message", [
    ("dy, x, gamma", "unknown argument 'gamma'"),
    ("dy, x -> dx, grad", "expected outputs"),
    ("dy, x -> dweight", "dx included"),
    ("x, weight, eps -> dx", "describes a forward"),
    ("dy, weight", "'x' as a positional"),
])
def test_bad_signatures(signature, message):
    with pytest.raises(ValueError, match=message):
        adapt(_ours, signature, backward=True)


def test_a_numpy_forward_cannot_be_differentiated():
    with pytest.raises(ValueError, match="NumPy cannot do"):
        LayerNormBackwardAudit(lambda x, w, b, eps: x, signature="x, weight, bias, eps")
    with pytest.raises(TypeError, match="is a forward"):
        LayerNormBackwardAudit(layernorm_c.layer_norm)
    with pytest.raises(TypeError, match="adapted as a forward"):
        LayerNormBackwardAudit(adapt(layernorm_c.layer_norm))


def test_wrong_number_of_outputs_is_reported():
    result = LayerNormBackwardAudit(lambda dy, x, w, b, eps: _ours(dy, x, w, eps)[:2]).run(
        ["contract"])["contract"]
    assert result.status == "fail"
    assert "returned 2 values; expected 3 (dx, dweight, dbias)" in result.diagnosis


def test_modifying_an_input_fails_the_contract():
    def in_place(dy, x, weight, bias, eps):
        g = _ours(dy, x, weight, eps)
        dy *= 2
        return g

    result = LayerNormBackwardAudit(in_place).run(["contract"])["contract"]
    assert result.status == "fail" and "modifies its input dy in place" in result.diagnosis


def test_an_undeclared_restriction_fails_with_a_hint():
    def only_d_32(dy, x, weight, bias, eps):
        if x.shape[-1] != 32:
            raise ValueError("d must be 32")
        return _ours(dy, x, weight, eps)

    result = LayerNormBackwardAudit(only_d_32).run(["reference"])["reference"]
    assert result.figure == "raised ValueError"
    assert "d must be 32" in result.diagnosis and "declare it (d=..." in result.diagnosis
    report = LayerNormBackwardAudit(only_d_32, d=32).run()
    assert report.ok, str(report)


def test_fixed_size_and_leading_shape():
    calls = []

    def only_8_by_32(dy, x, weight, bias, eps):
        calls.append(x.shape)
        assert x.shape == (8, 32), "only (8, 32)"
        return _ours(dy, x, weight, eps)

    report = LayerNormBackwardAudit(only_8_by_32, d=32, leading_shape=(8,)).run()
    assert report.ok, str(report)
    assert set(calls) == {(8, 32)}
    assert report.title.endswith("(float32, eps=1e-05, d=32, leading shape (8,))")


def test_eps_options():
    fixed = LayerNormBackwardAudit(lambda dy, x: _ours(dy, x, eps=0.1), signature="dy, x",
                                   eps=0.1)
    assert fixed.run(["eps"])["eps"].status == "pass"
    wrong = LayerNormBackwardAudit(lambda dy, x: _ours(dy, x, eps=0.1), signature="dy, x")
    assert "eps different from the forward's" in wrong.run(["eps"])["eps"].diagnosis
    with pytest.raises(ValueError, match="eps"):
        LayerNormBackwardAudit(_ours, eps=-1.0)
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="uses its own eps=1e-05"):
        LayerNormBackwardAudit(torch.nn.LayerNorm(8), eps=0.1)


def test_tolerance_override_and_seed():
    loose = LayerNormBackwardAudit(gallery.eps_ignored, rtol=1e-3, atol=1e-3)
    assert loose.run(["reference"]).ok
    one = LayerNormBackwardAudit(gallery.sample_variance, seed=3).run()
    two = LayerNormBackwardAudit(gallery.sample_variance, seed=3).run()
    assert str(one) == str(two)


def test_check_layer_norm_backward_raises_warns_and_returns():
    with pytest.raises(AssertionError) as info:
        check_layer_norm_backward(gallery.mean_path_missing)
    message = str(info.value)
    assert message.startswith("LayerNorm backward audit of ")
    assert f"3 of {len(BACKWARD_CHECKS)} checks failed" in message
    assert "- paths (" in message and "only the mean path missing" in message
    with pytest.warns(LayerNormAuditWarning, match="record order"):
        report = check_layer_norm_backward(gallery.order_dependent_sums)
    assert isinstance(report, AuditReport) and report.ok
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_layer_norm_backward(layernorm_c.layer_norm_backward, dtype="float64").ok


def test_check_layer_norm_backward_takes_every_option_of_the_audit():
    import inspect

    audit = inspect.signature(LayerNormBackwardAudit).parameters
    check = inspect.signature(check_layer_norm_backward).parameters
    assert [n for n in check if n != "checks"] == list(audit)
    for name, parameter in audit.items():
        assert check[name].default == parameter.default, name


def test_describe_and_select_checks():
    lines = describe_backward_checks().splitlines()
    assert [line.split()[0] for line in lines] == list(BACKWARD_CHECKS)
    assert "param_sums" not in layer_norm_backward_checks(exclude=["param_sums"])
    with pytest.raises(ValueError, match="unknown"):
        layer_norm_backward_checks(exclude=["sums"])
    with pytest.raises(ValueError, match="unknown"):
        LayerNormBackwardAudit(_ours).run(["sums"])


def test_backward_report_renders_and_refuses_to_plot():
    report = LayerNormBackwardAudit(gallery.sign_error).run(["paths", "state"])
    assert "data-status=\"fail\"" in report._repr_html_()
    assert "sign error" in report["paths"]._repr_html_()
    with pytest.raises(ValueError, match="only a LayerNorm forward audit"):
        report.plot()


# -- the numerics ----------------------------------------------------------------------

def test_reference_backward_matches_finite_differences():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 7)) * 2 + 1
    dy = rng.standard_normal((3, 7))
    w = rng.uniform(0.5, 2, 7)
    eps = 1e-3
    got = layernorm_c.reference_layer_norm_backward(dy, x, w, eps)

    def loss(xv, wv, bv):
        return float(np.sum(dy * layernorm_c.reference_layer_norm(xv, wv, bv, eps).y))

    h = 1e-6
    b = np.zeros(7)
    for i, j in [(0, 0), (1, 3), (2, 6)]:
        e = np.zeros_like(x)
        e[i, j] = h
        numeric = (loss(x + e, w, b) - loss(x - e, w, b)) / (2 * h)
        assert got.dx[i, j] == pytest.approx(numeric, rel=1e-6, abs=1e-8)
    for j in (0, 4):
        e = np.zeros(7)
        e[j] = h
        assert got.dweight[j] == pytest.approx((loss(x, w + e, b) - loss(x, w - e, b)) / (2 * h),
                                               rel=1e-6)
        assert got.dbias[j] == pytest.approx((loss(x, w, b + e) - loss(x, w, b - e)) / (2 * h),
                                             rel=1e-6)


def test_reference_backward_agrees_with_layernorm_c_and_scales():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 5, 16)) * 3 + 2
    dy = rng.standard_normal(x.shape)
    w = rng.standard_normal((5, 16))
    ref = layernorm_c.reference_layer_norm_backward(dy, x, w, 1e-5, axis=(1, 2))
    ours = layernorm_c.layer_norm_backward(dy, x, w, 1e-5, axis=(1, 2))
    np.testing.assert_allclose(ref.dx, ours.dx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ref.dweight, ours.dweight, rtol=1e-12, atol=1e-12)
    assert ref.dweight.shape == (5, 16) and ref.dbias.shape == (5, 16)
    # Records near the float64 limits: scaled, nothing overflows.
    huge = layernorm_c.reference_layer_norm_backward(dy[0], x[0] * 1e300, None, 0.0)
    tiny = layernorm_c.reference_layer_norm_backward(dy[0], x[0], None, 0.0)
    np.testing.assert_allclose(huge.dx * 1e300, tiny.dx, rtol=1e-12)
    # The parameter gradients do not depend on the records' order.
    perm = rng.permutation(20)
    flat = layernorm_c.reference_layer_norm_backward(dy.reshape(20, 16), x.reshape(20, 16))
    shuffled = layernorm_c.reference_layer_norm_backward(dy.reshape(20, 16)[perm],
                                                        x.reshape(20, 16)[perm])
    assert flat.dweight.tobytes() == shuffled.dweight.tobytes()
    assert flat.dbias.tobytes() == shuffled.dbias.tobytes()


def test_reference_backward_worked_example_and_constant_records():
    g = layernorm_c.reference_layer_norm_backward([[1.0, 0, 0, 0]], [[1.0, 2, 3, 4]], eps=0.0)
    np.testing.assert_allclose(g.dx[0] * math.sqrt(1.25), [0.3, -0.4, -0.1, 0.2], atol=1e-15)
    # A constant record: xhat = 0, rstd = 1 / sqrt(eps), even where the
    # scaled eps underflows.
    const = layernorm_c.reference_layer_norm_backward([[1.0, 2.0, 3.0, 6.0]], [[1e300] * 4],
                                                      eps=1e-5)
    np.testing.assert_allclose(const.dx[0], (np.array([1, 2, 3, 6]) - 3) / math.sqrt(1e-5))
    assert np.isnan(layernorm_c.reference_layer_norm_backward([[1.0] * 4], [[2.0] * 4],
                                                              eps=0.0).dx).all()
    with pytest.raises(ValueError, match="dy"):
        layernorm_c.reference_layer_norm_backward(np.ones(3), np.ones(4))


def test_decomposition_reads_the_models_back():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 16))
    g = rng.standard_normal((6, 16)) + 0.8 + 0.8 * (x - x.mean(-1, keepdims=True))
    t = record_terms(g, x, None, 1e-5)
    for a, b, s in [(1, 1, 1), (0, 0, 1), (0, 1, 1), (1, 0, 1), (1, -1, 1), (1, 1, -1)]:
        dec = decompose_dx(model_dx(t, mean_path=a, var_path=b, sign=s), t)
        np.testing.assert_allclose(dec.mean_path, a, atol=1e-9)
        np.testing.assert_allclose(dec.var_path, b, atol=1e-9)
        np.testing.assert_allclose(dec.sign_rstd, s * t.rstd[:, 0], rtol=1e-12)
        assert dec.residual.max() < 1e-12


# -- command line and plugin -------------------------------------------------------------

@pytest.fixture
def _restore_sys_path(monkeypatch):
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))


def test_cli_backward(capsys, _restore_sys_path):
    assert main(["--backward", "layernorm_c:layer_norm_backward", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("LayerNorm backward audit of layernorm_c:layer_norm_backward "
                          "(float64, eps=1e-05)\n")
    assert f"{len(BACKWARD_CHECKS)} checks: {len(BACKWARD_CHECKS)} passed" in out
    assert main(["--backward", "ln_backward_gallery:variance_path_missing",
                 "--checks", "paths"]) == 1
    assert "only the variance path missing" in capsys.readouterr().out
    assert main(["--backward", "--list-checks"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == list(BACKWARD_CHECKS)
    assert main(["--backward", "layernorm_c:layer_norm_backward", "--checks", "affine"]) == 2
    assert "unknown backward checks ['affine']" in capsys.readouterr().err
    assert main(["layernorm_c:layer_norm", "--checks", "paths"]) == 2
    assert "unknown checks ['paths']" in capsys.readouterr().err
    assert main(["--backward", "layernorm_c:layer_norm"]) == 2
    assert "is a forward" in capsys.readouterr().err


def test_cli_backward_torch_module_file(tmp_path, capsys, _restore_sys_path):
    pytest.importorskip("torch")
    source = tmp_path / "my_model.py"
    source.write_text(textwrap.dedent("""
        import torch

        norm = torch.nn.LayerNorm(32, eps=1e-6)
    """))
    assert main(["--backward", f"{source}:norm", "--checks", "paths,eps,param_sums"]) == 0
    out = capsys.readouterr().out
    assert "(float32, eps=1e-06, torch autograd, d=32)" in out


pytest_plugins = ["pytester"]

_PLUGIN_TESTS = '''
import numpy as np
import pytest
import layernorm_c


def ours(dy, x, weight, bias, eps):
    return layernorm_c.layer_norm_backward(dy, x, weight, eps)


def no_var_path(dy, x, weight, bias, eps):
    x64 = x.astype(np.float64)
    c = x64 - x64.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt((c * c).mean(-1, keepdims=True) + eps)
    g = dy * weight
    dx = rstd * (g - g.mean(-1, keepdims=True))
    d = x.shape[-1]
    return (dx.astype(x.dtype), (dy * c * rstd).reshape(-1, d).sum(0),
            dy.reshape(-1, d).sum(0))


def test_ours(layer_norm_backward_check):
    layer_norm_backward_check(ours)


@pytest.mark.layer_norm_backward_checks("paths", "variance")
def test_broken(layer_norm_backward_check):
    layer_norm_backward_check(no_var_path)


def test_whole(layer_norm_backward_audit):
    assert layer_norm_backward_audit(ours, dtype="float64").ok


def test_whole_broken(layer_norm_backward_audit):
    layer_norm_backward_audit(no_var_path)
'''


def test_plugin_backward_fixtures(pytester):
    pytester.makepyfile(test_mine=_PLUGIN_TESTS)
    result = pytester.runpytest("-p", "layernorm_c.testing.plugin", "-v", "-rf")
    # (test_whole_broken also warns: its float64 sums depend on the record order.)
    result.assert_outcomes(passed=len(BACKWARD_CHECKS) + 1 + 1, failed=2, warnings=1)
    result.stdout.fnmatch_lines([
        "*test_ours?param_sums? PASSED*",
        "*test_broken?variance? PASSED*",
        "FAILED test_mine.py::test_broken?paths? - Failed: only the variance*",
        "FAILED test_mine.py::test_whole_broken - Failed: LayerNorm backward audit of *",
    ])
