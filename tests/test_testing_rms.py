"""The RMSNorm battery: every broken RMSNorm of rms_gallery is caught by the
right check with the right words (and no other check blames another
defect), the correct ones pass (layernorm_c's, the references, NumPy's,
torch's), in float32, float16 and bfloat16."""
import functools
import warnings

import numpy as np
import pytest

import layernorm_c
import rms_gallery as gallery
from layernorm_c.testing import (RMS_CHECKS, LayerNormAuditWarning, RMSNormAudit,
                                 check_rms_norm, describe_rms_checks, rms_norm_checks)
from layernorm_c.testing._report import contradictions

BF16 = layernorm_c._bf16.BFLOAT16
needs_bf16 = pytest.mark.skipif(BF16 is None, reason="ml_dtypes is not installed")

#: Checks that only report a symptom (wrong numbers) without naming a cause.
SYMPTOMS = {"hand_rows", "reference"}

# (implementation, the check that must name it, words its diagnosis must
# contain, other checks that may fail too (each for a true defect), or
# None when any may (the defect garbles every measurement))
GALLERY = [
    (gallery.mean_subtracted, "centering", ["mean subtracted", "that is a LayerNorm"], set()),
    (gallery.eps_outside_sqrt, "eps", ["eps outside the square root",
                                       "x / (sqrt(mean(x^2)) + eps)"], set()),
    (gallery.eps_ignored, "eps", ["eps ignored", "x / sqrt(mean(x^2))"], set()),
    (gallery.sqrt_missing, "root", ["square root missing", "x / (mean(x^2) + eps)"], set()),
    (gallery.divided_by_d_minus_1, "mean_square", ["divided by d - 1", "0.9354"], set()),
    (gallery.squares_in_float16, "float16_overflow", ["float16 overflow", "x^2",
                                                      "the same records in float32"], set()),
    # (In a 16-bit audit the accumulator's error also grows with d: large_d.)
    (gallery.accumulated_in_16_bits, "accumulation",
     ["statistics accumulated in float16", "grows with d"], {"float16_overflow", "large_d"}),
    (gallery.plus_one_weight, "scale", ["the 1 + weight convention mistaken for weight",
                                        "convention='1+weight'"], set()),
    (gallery.weight_missing, "scale", ["weight missing"], set()),
    (gallery.batch_mean_square, "coupling", ["statistics across the whole batch"], None),
    (gallery.RunningMeanSquare, "state", ["running statistics", "after 3 other calls"], None),
    (gallery.batch_max_scaling, "nonfinite", ["NaN/Inf leaks", "a NaN in record"], set()),
]


def _make(impl):
    return impl() if isinstance(impl, type) else impl


def _assert_named(report, check, words, others):
    result = report[check]
    assert result.status == "fail", str(report)
    for word in words:
        assert word in result.diagnosis, result.diagnosis
    if others is not None:
        failed = {r.name for r in report.failures} - {check} - SYMPTOMS
        assert failed <= others, str(report)
    assert contradictions(report.results) == {}, str(report)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("impl, check, words, others", GALLERY,
                         ids=[g[0].__name__ for g in GALLERY])
def test_gallery_defect_is_named(impl, check, words, others, dtype):
    _assert_named(RMSNormAudit(_make(impl), dtype=dtype).run(), check, words, others)


@needs_bf16
@pytest.mark.parametrize("impl, check, words, others", GALLERY,
                         ids=[g[0].__name__ for g in GALLERY])
def test_gallery_defect_is_named_in_bfloat16(impl, check, words, others):
    if impl is gallery.accumulated_in_16_bits:
        words = ["statistics accumulated in bfloat16", "roundoff 2^-8"]
    _assert_named(RMSNormAudit(_make(impl), dtype="bfloat16").run(), check, words, others)


# Defects shown in one audit: (implementation, options, check, words).
SINGLE = [
    # float32 sums lose nothing float16 outputs show: float32 only.
    (gallery.sequential_float32, {}, "large_d",
     ["the error grows with d", "the sum of squares is accumulated in one running sum"]),
    (gallery.builtin_eps, {"signature": "x, weight"}, "eps",
     ["another eps than declared", "the outputs fit eps = 1e-05",
      "not the declared eps=1e-06", "audit with eps=1e-05"]),
    (gallery.float32_eps, {"dtype": "float64"}, "eps",
     ["eps rounded to float32", "9.999999974752427e-07 for eps=1e-06"]),
]


@pytest.mark.parametrize("impl, options, check, words", SINGLE,
                         ids=[g[0].__name__ for g in SINGLE])
def test_gallery_defect_in_one_audit_is_named(impl, options, check, words):
    report = RMSNormAudit(impl, **options).run()
    _assert_named(report, check, words, set())
    assert "matches no" not in str(report)


def test_weight_convention_mistaken_the_other_way():
    report = RMSNormAudit(gallery.numpy_float64, convention="1+weight").run()
    _assert_named(report, "scale", ["the weight convention mistaken",
                                    "x_normed * weight (LLaMA, T5)",
                                    "convention='weight'"], set())
    assert "scale 1 + weight" in report.title


def test_at_d_768_the_main_diagnoses_hold():
    for impl, check in ((gallery.mean_subtracted, "centering"),
                        (gallery.eps_outside_sqrt, "eps"), (gallery.sqrt_missing, "root"),
                        (gallery.divided_by_d_minus_1, "mean_square")):
        report = RMSNormAudit(impl, d=768).run()
        assert report[check].status == "fail", str(report)
        assert {r.name for r in report.failures} - {check} <= SYMPTOMS, str(report)


def test_batch_variance_is_a_warning_in_ulp():
    report = RMSNormAudit(gallery.order_depends_on_batch).run()
    assert report.ok, str(report)
    result = report["batch_invariance"]
    assert result.status == "warn" and "ulp" in result.figure
    assert "not batch-invariant" in result.diagnosis
    strict = RMSNormAudit(gallery.order_depends_on_batch, strict_batch_invariance=True).run()
    assert strict["batch_invariance"].status == "fail"
    with pytest.warns(LayerNormAuditWarning, match="not batch-invariant"):
        check_rms_norm(gallery.order_depends_on_batch)


CORRECT = [
    (gallery.numpy_float64, "weight"),
    (gallery.numpy_float32, "weight"),
    (gallery.gemma_float64, "1+weight"),
    (layernorm_c.rms_norm, "weight"),
    (layernorm_c.rms_norm, "1+weight"),  # called with the audit's convention
    (functools.partial(layernorm_c.rms_norm, convention="1+weight"), "1+weight"),
    (layernorm_c.reference_rms_norm, "weight"),
    (layernorm_c.reference_rms_norm, "1+weight"),
]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"]
                         + (["bfloat16"] if BF16 is not None else []))
@pytest.mark.parametrize("impl, convention", CORRECT, ids=lambda v: getattr(v, "__name__", str(v)))
def test_correct_rms_norms_pass_every_check(impl, convention, dtype):
    report = RMSNormAudit(impl, convention=convention, dtype=dtype).run()
    assert [r.status for r in report] == ["pass"] * len(RMS_CHECKS), str(report)


def test_layernorm_c_rms_norm_passes_at_a_fixed_d_and_leading_shape():
    report = RMSNormAudit(layernorm_c.rms_norm, d=768, leading_shape=(4, 32)).run()
    assert report.ok and not report.warnings, str(report)


def test_the_layer_norm_battery_says_an_rms_norm_is_not_centred():
    from layernorm_c.testing import LayerNormAudit

    report = LayerNormAudit(layernorm_c.rms_norm, signature="x, weight, eps").run()
    assert "as in RMSNorm" in report["invariants"].diagnosis, str(report)


def test_torch_rms_norm_and_module_pass():
    torch = pytest.importorskip("torch")
    dtypes = ["float32", "float64", "float16"] + (["bfloat16"] if BF16 is not None else [])
    for fn in (torch.nn.functional.rms_norm, torch.nn.RMSNorm(64),
               torch.nn.RMSNorm(64, eps=1e-5)):
        for dtype in dtypes:
            report = RMSNormAudit(fn, dtype=dtype).run()
            assert report.ok and not report.warnings, str(report)
    module = RMSNormAudit(torch.nn.RMSNorm(64)).impl
    assert module.d == 64 and module.takes_eps and "eps None" in module.name
    assert RMSNormAudit(torch.nn.RMSNorm(64, eps=1e-5)).eps == 1e-5


def test_a_broken_torch_module_is_named():
    torch = pytest.importorskip("torch")

    class EpsOutside(torch.nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(d))
            self.eps = 1e-5

        def forward(self, x):
            # In float32, as LLaMA's RMSNorm computes (so float16 does not overflow).
            h = x.float()
            rms = h.pow(2).mean(-1, keepdim=True).sqrt()
            return (h / (rms + self.eps)).to(x.dtype) * self.weight

    report = RMSNormAudit(EpsOutside(32)).run()
    _assert_named(report, "eps", ["eps outside the square root"], set())


def test_check_rms_norm_raises_with_the_diagnosis():
    with pytest.raises(AssertionError, match="square root missing"):
        check_rms_norm(gallery.sqrt_missing)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_rms_norm(layernorm_c.rms_norm, dtype="float64").ok


def test_options_and_names():
    assert RMS_CHECKS[0] == "contract" and "accumulation" in RMS_CHECKS
    assert "cancellation" not in RMS_CHECKS and "centering" in RMS_CHECKS
    assert rms_norm_checks(exclude=["accumulation"]) == [n for n in RMS_CHECKS
                                                         if n != "accumulation"]
    with pytest.raises(ValueError, match="unknown checks"):
        rms_norm_checks(exclude=["variance"])
    assert describe_rms_checks().splitlines()[0].startswith("contract")
    assert RMSNormAudit(layernorm_c.rms_norm).eps == 1e-6
    with pytest.raises(ValueError, match="convention"):
        RMSNormAudit(layernorm_c.rms_norm, convention="gemma")
    with pytest.raises(ValueError, match="an RMSNorm takes no bias"):
        RMSNormAudit(layernorm_c.layer_norm, signature="x, weight, bias, eps")
    with pytest.raises(ValueError, match="unknown"):
        RMSNormAudit(layernorm_c.rms_norm).run(["cancellation"])
    def no_weight(x, eps):
        return gallery.numpy_float64(x, None, eps)

    only = RMSNormAudit(no_weight, signature="x, eps").run(["scale", "eps"])
    assert [r.status for r in only] == ["skip", "pass"]


def test_bfloat16_without_ml_dtypes_is_a_clear_error(monkeypatch):
    from layernorm_c.testing import LayerNormAudit, LayerNormBackwardAudit

    # as without ml_dtypes: nothing registered, and nothing to register
    monkeypatch.setattr(layernorm_c._bf16, "BFLOAT16", None)
    monkeypatch.setattr(layernorm_c._bf16, "register", lambda: None)
    for audit in (RMSNormAudit, LayerNormAudit):
        with pytest.raises(ValueError, match="bfloat16 needs ml_dtypes"):
            audit(gallery.numpy_float64, dtype="bfloat16")
    with pytest.raises(ValueError, match="bfloat16 needs ml_dtypes"):
        LayerNormBackwardAudit(layernorm_c.layer_norm_backward, dtype="bfloat16")
    with pytest.raises(ValueError, match="expected float16, float32, float64 or bfloat16"):
        RMSNormAudit(gallery.numpy_float64, dtype="int8")


@needs_bf16
def test_bfloat16_tolerance_comes_from_its_precision():
    from layernorm_c.testing import TOLERANCES, LayerNormAudit

    tol = TOLERANCES[BF16]
    f16 = TOLERANCES[np.dtype(np.float16)]
    # The same number of units of roundoff as float16's: 2^-8 against 2^-11.
    assert tol.rtol == tol.atol == 8 * 2.0 ** -8
    assert tol.rtol / 2.0 ** -8 == pytest.approx(f16.rtol / 2.0 ** -11, rel=0.03)
    assert RMSNormAudit(layernorm_c.rms_norm, dtype="bfloat16").tolerance == tol
    report = LayerNormAudit(layernorm_c.layer_norm, dtype="bfloat16").run()
    assert report.ok and "bfloat16" in report.title, str(report)
    from layernorm_c.testing import LayerNormBackwardAudit

    back = LayerNormBackwardAudit(layernorm_c.layer_norm_backward, dtype="bfloat16").run()
    assert back.ok and not back.warnings, str(back)
    # The backward's tolerance is the forward's of bfloat16 (widened with d for dx).
    assert LayerNormBackwardAudit(layernorm_c.layer_norm_backward,
                                  dtype="bfloat16").tolerance.params == tol


# -- the backward's float64 reference -------------------------------------------

@pytest.mark.parametrize("convention", ["weight", "1+weight"])
def test_reference_rms_norm_backward_is_the_gradient(convention):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 6)) * 2 + 0.5
    dy = rng.standard_normal((3, 6))
    w = rng.standard_normal(6)
    eps = 1e-3
    got = layernorm_c.reference_rms_norm_backward(dy, x, w, eps, convention=convention)

    def loss(xv, wv):
        return float(np.sum(dy * layernorm_c.reference_rms_norm(xv, wv, eps,
                                                                convention=convention).y))

    h = 1e-6
    for (i, j) in ((0, 0), (1, 3), (2, 5)):
        e = np.zeros_like(x)
        e[i, j] = h
        numeric = (loss(x + e, w) - loss(x - e, w)) / (2 * h)
        assert got.dx[i, j] == pytest.approx(numeric, rel=1e-6, abs=1e-8)
    for j in range(6):
        e = np.zeros(6)
        e[j] = h
        numeric = (loss(x, w + e) - loss(x, w - e)) / (2 * h)
        assert got.dweight[j] == pytest.approx(numeric, rel=1e-6, abs=1e-8)
    # As layernorm_c.rms_norm_backward computes it.
    mine = layernorm_c.rms_norm_backward(dy, x, w, eps, convention=convention)
    np.testing.assert_allclose(mine.dx, got.dx, rtol=1e-12, atol=1e-14)


def test_reference_rms_norm_of_a_tiny_record_is_x_over_sqrt_eps():
    # The record is scaled by 2**997 for its sums; eps scaled as much
    # overflows, and y must still be x / sqrt(eps), as layernorm_c computes.
    x = np.array([[1e-300, -2e-300, 3e-300]])
    want = x / np.sqrt(1e-6)
    np.testing.assert_allclose(layernorm_c.reference_rms_norm(x, None, 1e-6).y, want,
                               rtol=1e-12)
    np.testing.assert_allclose(layernorm_c.rms_norm(x, None, 1e-6), want, rtol=1e-12)


def test_reference_rms_norm_backward_sums_exactly_in_any_order():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((500, 4)) * np.array([1e-8, 1.0, 1e8, 1.0])
    dy = rng.standard_normal((500, 4))
    a = layernorm_c.reference_rms_norm_backward(dy, x).dweight
    order = rng.permutation(500)
    b = layernorm_c.reference_rms_norm_backward(dy[order], x[order]).dweight
    assert a.tobytes() == b.tobytes()
    tiny = layernorm_c.reference_rms_norm_backward(np.ones((1, 3)), np.full((1, 3), 1e-300),
                                                   None, 1e-6)
    np.testing.assert_allclose(tiny.dx, 1e3, rtol=1e-12)
    with pytest.raises(ValueError, match="convention"):
        layernorm_c.reference_rms_norm_backward(dy, x, convention="gemma")


# -- the backward battery on RMSNorm ----------------------------------------------

import rms_backward_gallery as bgallery  # noqa: E402
from layernorm_c.testing import (RMS_BACKWARD_CHECKS, RMSNormBackwardAudit,  # noqa: E402
                                 check_rms_norm_backward)

BACKWARD_GALLERY = [
    (bgallery.mean_path_included, "paths", ["mean path wrongly included", "-rstd * mean(g)"],
     set()),
    (bgallery.rms_constant, "paths", ["the root mean square treated as a constant"], set()),
    (bgallery.eps_outside_sqrt, "eps", ["eps outside the square root",
                                        "1 / (sqrt(mean(x^2)) + eps)"], set()),
    (bgallery.plus_one_scale, "scale", ["the wrong weight convention",
                                        "g = dy * (1 + weight)"], None),
    (bgallery.dweight_negated, "param_grads", ["sign error in dweight"], set()),
]


@pytest.mark.parametrize("dtype", ["float32", "float16"]
                         + (["bfloat16"] if BF16 is not None else []))
@pytest.mark.parametrize("impl, check, words, others", BACKWARD_GALLERY,
                         ids=[g[0].__name__ for g in BACKWARD_GALLERY])
def test_backward_gallery_defect_is_named(impl, check, words, others, dtype):
    _assert_named(RMSNormBackwardAudit(impl, dtype=dtype).run(), check, words, others)


def test_backward_sequential_sums_are_named_in_float32():
    report = RMSNormBackwardAudit(bgallery.sequential_float32).run()
    _assert_named(report, "large_d", ["the error grows with d", "max dx error by d",
                                      "dx's sum mean(g * xhat) or the mean square"], set())


def test_backward_convention_mistaken_the_other_way():
    report = RMSNormBackwardAudit(bgallery.correct, convention="1+weight").run()
    _assert_named(report, "scale", ["the wrong weight convention", "g = dy * weight where"],
                  None)
    assert RMSNormBackwardAudit(bgallery.gemma, convention="1+weight").run().ok


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"]
                         + (["bfloat16"] if BF16 is not None else []))
def test_correct_rms_backwards_pass(dtype):
    for fn, convention in ((bgallery.correct, "weight"), (bgallery.gemma, "1+weight"),
                           (layernorm_c.rms_norm_backward, "weight"),
                           (layernorm_c.rms_norm_backward, "1+weight"),
                           (layernorm_c.reference_rms_norm_backward, "weight"),
                           (layernorm_c.RMSNorm(16), "weight"),
                           (layernorm_c.RMSNorm(16, convention="1+weight"), "1+weight")):
        report = RMSNormBackwardAudit(fn, convention=convention, dtype=dtype).run()
        assert report.ok, str(report)
        assert len(report) == len(RMS_BACKWARD_CHECKS)
    assert check_rms_norm_backward(layernorm_c.rms_norm_backward).ok
    with pytest.raises(AssertionError, match="mean path wrongly included"):
        check_rms_norm_backward(bgallery.mean_path_included)


def test_torch_autograd_of_rms_norm_passes():
    torch = pytest.importorskip("torch")
    for fn in (torch.nn.functional.rms_norm, torch.nn.RMSNorm(16)):
        report = RMSNormBackwardAudit(fn).run()
        assert report.ok, str(report)
        assert "torch autograd" in report.title


def test_rms_backward_options():
    with pytest.raises(TypeError, match="is a forward"):
        RMSNormBackwardAudit(layernorm_c.rms_norm)
    with pytest.raises(ValueError, match="no bias"):
        RMSNormBackwardAudit(layernorm_c.layer_norm_backward,
                             signature="dy, x, weight, eps -> dx, dweight, dbias")
    assert RMSNormBackwardAudit(layernorm_c.rms_norm_backward).eps == 1e-6
    assert "cancellation" not in RMS_BACKWARD_CHECKS and "scale" in RMS_BACKWARD_CHECKS


# -- JAX and flax -----------------------------------------------------------------

def _jax_rms_norm(eps_outside=False):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def rms_norm(x, weight, eps):
        h = x.astype(jnp.float32)
        ms = jnp.mean(h * h, axis=-1, keepdims=True)
        y = h / (jnp.sqrt(ms) + eps) if eps_outside else h * jax.lax.rsqrt(ms + eps)
        return (y * weight).astype(x.dtype)

    return rms_norm


def test_jax_rms_norm_forward_and_vjp():
    from layernorm_c.testing import from_jax

    good, bad = _jax_rms_norm(), _jax_rms_norm(eps_outside=True)
    report = RMSNormAudit(from_jax(good, "x, weight, eps")).run()
    assert report.ok, str(report)
    _assert_named(RMSNormAudit(bad, framework="jax").run(), "eps",
                  ["eps outside the square root"], set())
    back = RMSNormBackwardAudit(good, signature="x, weight, eps", framework="jax").run()
    assert back.ok and "jax.vjp" in back.title, str(back)
    bad_back = RMSNormBackwardAudit(bad, signature="x, weight, eps", framework="jax").run()
    _assert_named(bad_back, "eps", ["eps outside the square root"], set())


def test_flax_rms_norm_modules_pass():
    pytest.importorskip("flax")
    from flax import linen, nnx

    for module in (linen.RMSNorm(), nnx.RMSNorm(64, rngs=nnx.Rngs(0))):
        report = RMSNormAudit(module).run()
        assert report.ok, str(report)
        assert report.title.startswith("RMSNorm audit of flax.")
    nnx_impl = RMSNormAudit(nnx.RMSNorm(32, epsilon=1e-5, rngs=nnx.Rngs(0))).impl
    assert nnx_impl.d == 32 and nnx_impl.eps == 1e-5 and not nnx_impl.takes_eps
    # A linen LayerNorm is audited by the LayerNorm battery with its scale and bias.
    from layernorm_c.testing import LayerNormAudit

    impl = LayerNormAudit(linen.LayerNorm()).impl
    assert impl.takes_weight and impl.takes_bias and impl.framework == "jax"


def test_an_rms_report_renders_and_refuses_to_plot():
    report = RMSNormAudit(gallery.sqrt_missing).run()
    html = report._repr_html_()
    assert 'data-status="fail"' in html and "square root missing" in html
    assert report.summary().startswith(f"{len(RMS_CHECKS)} checks:")
    pytest.importorskip("matplotlib")
    with pytest.raises(ValueError, match="an RMSNorm audit's"):
        report.plot()
