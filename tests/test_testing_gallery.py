"""The validation battery against known implementations: every broken one in
ln_gallery is caught by the right check with the right diagnosis, and the
correct ones pass."""
import numpy as np
import pytest

import layernorm_c
import ln_gallery
from layernorm_c.testing import CHECKS, LayerNormAudit, from_torch
from layernorm_c.testing._report import contradictions

#: Checks that only report a symptom (wrong numbers) without naming a cause;
#: any defect may fail them.
SYMPTOMS = {"hand_rows", "reference", "invariants"}

# (implementation, the check that must name it, words the diagnosis must
# contain, whether every other failing check is a mere symptom)
GALLERY = [
    (ln_gallery.sample_variance, "variance", ["sample variance", "d - 1"], True),
    (ln_gallery.batch_statistics, "coupling",
     ["batch coupling", "batch-norm", "the same position in other batch items"], False),
    (ln_gallery.position_coupling, "coupling",
     ["position coupling", "other positions of the same batch item"], False),
    (ln_gallery.RunningStatistics, "state", ["running statistics", "after 3 other calls"], False),
    (ln_gallery.eps_on_std, "eps", ["eps added to the standard deviation",
                                    "(x - mean) / (sqrt(var) + eps)"], True),
    (ln_gallery.eps_ignored, "eps", ["eps ignored", "(x - mean) / sqrt(var);"], True),
    (ln_gallery.eps_twice, "eps", ["eps applied twice", "sqrt(var + 2*eps)"], True),
    (ln_gallery.gain_before_normalization, "affine", ["gain applied before normalization"], True),
    (ln_gallery.bias_missing, "affine", ["bias missing"], True),
    (ln_gallery.params_wrong_axis, "affine", ["parameters broadcast on the wrong axis"], False),
    (ln_gallery.scalar_gain, "affine",
     ["gain not per-feature", "scalar gain", "setting the first gain to 2"], True),
    (ln_gallery.one_pass_float32, "cancellation", ["E[x^2] - E[x]^2"], True),
    (ln_gallery.float16_native, "float16_overflow", ["float16 overflow", "65504"], True),
    (ln_gallery.batch_max_scaling, "nonfinite", ["NaN/Inf leaks", "a NaN in record"], True),
    (ln_gallery.sequential_float32, "large_d",
     ["the error grows with d", "max output error by d: 2^10", "2^20",
      "accumulated in one running sum (sequentially)"], True),
]

# Defects that need an option to show: (implementation, options, check, words).
WITH_OPTIONS = [
    (ln_gallery.builtin_eps, {"signature": "x, weight, bias"}, "eps",
     ["another eps than declared", "the outputs fit eps = 0.001", "not the declared eps=1e-05",
      "audit with eps=0.001"]),
    (ln_gallery.float32_eps, {"dtype": "float64"}, "eps",
     ["eps rounded to float32", "9.999999747378752e-06 for eps=1e-05",
      "Declare the eps it uses (eps=9.999999747378752e-06)"]),
]


def _make(impl):
    """A fresh instance for stateful implementations (classes)."""
    return impl() if isinstance(impl, type) else impl


@pytest.mark.parametrize("impl, check, words, exclusive", GALLERY,
                         ids=[g[0].__name__ for g in GALLERY])
def test_gallery_defect_is_named(impl, check, words, exclusive):
    report = LayerNormAudit(_make(impl)).run()
    result = report[check]
    assert result.status == "fail", str(report)
    for word in words:
        assert word in result.diagnosis, result.diagnosis
    assert not report.ok
    assert result in report.failures
    if exclusive:
        # No other check blames a different defect.
        others = {r.name for r in report.failures} - {check}
        assert others <= SYMPTOMS, str(report)
    # The whole report is consistent: no two checks contradict each other.
    assert contradictions(report.results) == {}, str(report)


@pytest.mark.parametrize("impl, options, check, words", WITH_OPTIONS,
                         ids=[g[0].__name__ for g in WITH_OPTIONS])
def test_gallery_defect_with_options_is_named(impl, options, check, words):
    report = LayerNormAudit(impl, **options).run()
    result = report[check]
    assert result.status == "fail", str(report)
    for word in words:
        assert word in result.diagnosis, result.diagnosis
    # Another eps than declared is named once, by the eps check: no false
    # float16 statistics, no unexplained variance.
    assert {r.name for r in report.failures} - {check} <= SYMPTOMS, str(report)
    assert "matches no" not in str(report)
    assert contradictions(report.results) == {}, str(report)


def test_sample_variance_figure_is_the_ratio():
    result = LayerNormAudit(ln_gallery.sample_variance).run(["variance"])["variance"]
    assert result.values["ratio"] == pytest.approx(np.sqrt(7 / 8), abs=1e-4)
    assert "0.9354" in result.figure


def test_coupling_names_the_records_that_moved():
    result = LayerNormAudit(ln_gallery.batch_statistics).run(["coupling"])["coupling"]
    # Record (2, 3) of a (4, 6) batch was changed: its position in the
    # other batch items moved.
    assert result.values["moved"] == [(0, 3), (1, 3), (3, 3)]
    assert "(0, 3), (1, 3), (3, 3)" in result.diagnosis
    assert "alone" in result.diagnosis


def test_cancellation_reports_each_offset():
    result = LayerNormAudit(ln_gallery.one_pass_float32).run(["cancellation"])["cancellation"]
    errors = result.values["errors"]
    assert list(errors) == [1e2, 1e3, 1e4]
    assert errors[1e2] < errors[1e3]  # grows with the offset
    assert "1e2/1e3/1e4" in result.figure


def test_cancellation_in_float64_is_caught_too():
    def one_pass(x, weight, bias, eps):
        mean = x.mean(axis=-1, keepdims=True)
        var = (x * x).mean(axis=-1, keepdims=True) - mean * mean
        return (x - mean) / np.sqrt(var + eps) * weight + bias

    result = LayerNormAudit(one_pass, dtype="float64").run(["cancellation"])["cancellation"]
    assert result.status == "fail"
    assert "E[x^2] - E[x]^2" in result.diagnosis


def test_order_dependent_sum_is_a_warning_not_a_failure():
    report = LayerNormAudit(ln_gallery.order_depends_on_batch).run()
    assert report.ok, str(report)
    (warning,) = report.warnings
    assert warning.name == "batch_invariance"
    assert "not batch-invariant: max difference" in warning.diagnosis
    assert warning.values["ulp"] > 0
    assert f"{warning.values['ulp']:.0f} ulp" in warning.figure


def test_strict_batch_invariance_fails():
    audit = LayerNormAudit(ln_gallery.order_depends_on_batch, strict_batch_invariance=True)
    assert audit.run(["batch_invariance"])["batch_invariance"].status == "fail"


def test_stateful_implementation_is_not_misdiagnosed_as_coupled():
    report = LayerNormAudit(ln_gallery.RunningStatistics()).run()
    for name in ("coupling", "nonfinite", "batch_invariance", "cancellation"):
        assert report[name].status == "skip"
        assert "state check" in report[name].diagnosis


def test_rmsnorm_is_named_not_centred():
    def rms_norm(x, weight, bias, eps):
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * weight + bias

    report = LayerNormAudit(rms_norm).run(["invariants", "cancellation"])
    assert "not centred" in report["invariants"].diagnosis
    assert "not shift-invariant" in report["cancellation"].diagnosis


# -- correct implementations -------------------------------------------------

def _reference(x, weight, bias, eps):
    return layernorm_c.reference_layer_norm(x, weight, bias, eps).y


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_layernorm_c_passes_everything(dtype):
    report = LayerNormAudit(layernorm_c.layer_norm, dtype=dtype).run()
    assert report.ok, str(report)
    assert [r.status for r in report] == ["pass"] * len(CHECKS), str(report)


@pytest.mark.parametrize("impl", [_reference, ln_gallery.numpy_float32])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_numpy_implementations_pass(impl, dtype):
    report = LayerNormAudit(impl, dtype=dtype).run()
    assert report.ok, str(report)
    assert not report.failures and not report.skipped


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_torch_functional_layer_norm_passes(dtype):
    torch = pytest.importorskip("torch")
    report = LayerNormAudit(from_torch(torch.nn.functional.layer_norm), dtype=dtype).run()
    assert report.ok, str(report)
    assert report.failures == []


def test_torch_module_passes_with_its_own_eps_and_size():
    torch = pytest.importorskip("torch")
    audit = LayerNormAudit(torch.nn.LayerNorm(24, eps=1e-6))  # auto-detected as torch
    assert (audit.eps, audit.impl.d) == (1e-6, 24)
    report = audit.run()
    assert report.ok, str(report)
    assert report.title.endswith("(float32, eps=1e-06, d=24)")


def test_torch_module_without_affine_skips_the_affine_check():
    torch = pytest.importorskip("torch")
    report = LayerNormAudit(torch.nn.LayerNorm(16, elementwise_affine=False),
                            dtype="float64").run()
    assert report.ok, str(report)
    # (A module has its own d: the large-d check, which varies d, is skipped too.)
    assert [r.name for r in report.skipped] == ["affine", "large_d"]


def test_torch_module_with_a_defect_is_caught():
    torch = pytest.importorskip("torch")

    class SampleVarianceNorm(torch.nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(d))
            self.bias = torch.nn.Parameter(torch.zeros(d))
            self.eps = 1e-5

        def forward(self, x):
            mean = x.mean(-1, keepdim=True)
            var = x.var(-1, keepdim=True)  # unbiased by default: d - 1
            return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias

    report = LayerNormAudit(SampleVarianceNorm(8)).run(["variance", "affine"])
    assert report["variance"].status == "fail"
    assert "sample variance" in report["variance"].diagnosis
    assert report["affine"].status == "pass"


def test_jax_function_passes():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    from layernorm_c.testing import from_jax

    @jax.jit
    def layer_norm(x, weight, bias, eps):
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + eps) * weight + bias

    checks = ["contract", "hand_rows", "reference", "variance", "eps", "affine"]
    assert LayerNormAudit(layer_norm).impl.framework == "jax"  # a jitted function
    report = LayerNormAudit(from_jax(layer_norm)).run(checks)
    assert report.ok, str(report)
