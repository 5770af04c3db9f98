"""The diagnoses of the batteries (issue 12): the large-d check and its
modes, the eps in use named, margins that account for d and the dtype,
figures that tell values apart, NaN and infinities in words, symptoms that
say which check names the cause, and reports whose checks never
contradict each other."""
import math
import re

import numpy as np
import pytest

import layernorm_c
import ln_gallery
from layernorm_c.testing import (LayerNormAudit, LayerNormBackwardAudit, RMSNormAudit,
                                 check_layer_norm, from_torch)
from layernorm_c.testing._checks import LARGE_D
from layernorm_c.testing._cli import main
from layernorm_c.testing._numerics import distinct, growth_exponent, nonfinite_words
from layernorm_c.testing._report import FAIL, PASS, CheckResult, contradictions, link_causes


def _reference(x, weight, bias, eps):
    return layernorm_c.reference_layer_norm(x, weight, bias, eps).y


# -- the large-d check ---------------------------------------------------------

@pytest.mark.parametrize("impl", [layernorm_c.layer_norm, _reference, ln_gallery.numpy_float32],
                         ids=["layernorm_c", "reference", "numpy_float32"])
def test_correct_implementations_pass_up_to_2_to_the_22(impl):
    result = LayerNormAudit(impl, mode="thorough").run(["large_d"])["large_d"]
    assert result.status == PASS, result
    assert max(result.values["errors"]) == 2 ** 22
    assert "the error does not grow with d" in result.diagnosis
    assert "2^22" in result.diagnosis


def test_torch_layer_norm_passes_up_to_2_to_the_22():
    torch = pytest.importorskip("torch")
    result = LayerNormAudit(from_torch(torch.nn.functional.layer_norm),
                            mode="thorough").run(["large_d"])["large_d"]
    assert result.status == PASS, result


@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_layernorm_c_passes_the_large_d_check_in_other_dtypes(dtype):
    result = LayerNormAudit(layernorm_c.layer_norm, dtype=dtype).run(["large_d"])["large_d"]
    assert result.status == PASS, result


def test_the_growth_with_d_is_tabled_and_fitted():
    result = LayerNormAudit(ln_gallery.sequential_float32).run(["large_d"])["large_d"]
    assert result.status == FAIL
    errors = result.values["errors"]
    assert list(errors) == list(LARGE_D["default"])
    assert errors[2 ** 20] > 30 * errors[2 ** 10]  # it does grow
    # A running sum's error grows about as sqrt(d) (random rounding) to d.
    assert 0.4 < result.values["exponent"] < 1.1
    assert f"error ~ d^{result.values['exponent']:.2f}" in result.diagnosis
    for d in errors:
        size = f"2^{int(math.log2(d))}"
        assert f"{size} {errors[d]:.2g}" in result.diagnosis
    # The measured layernorm_c stays within a few units of roundoff.
    ours = LayerNormAudit(layernorm_c.layer_norm).run(["large_d"])["large_d"]
    assert max(ours.values["units"].values()) < 8
    assert ours.values["exponent"] < 0.15
    assert "no growth beyond log d" in ours.diagnosis


def test_growth_exponent():
    sizes = [2 ** k for k in range(10, 21, 2)]
    assert growth_exponent(sizes, [3.0 * math.sqrt(d) for d in sizes]) == pytest.approx(0.5)
    assert growth_exponent(sizes, [2.0] * len(sizes)) == pytest.approx(0.0)
    # At rounding level (below the floor) there is no slope to read.
    assert growth_exponent(sizes, [0.1, 0.3, 0.2, 0.5, 0.1, 0.4], floor=1.0) == 0.0
    assert growth_exponent(sizes, [1.0, math.inf, 1, 1, 1, 1]) == math.inf


def test_an_error_that_grows_in_one_step_of_d_fails():
    def exact_then_float16(x, weight, bias, eps):
        # Correct to 2^16 features, then statistics summed in float16.
        if x.shape[-1] <= 2 ** 16:
            return layernorm_c.layer_norm(x, weight, bias, eps)
        return ln_gallery.float16_native(x.astype(np.float16), weight, bias, eps).astype(x.dtype)

    result = LayerNormAudit(exact_then_float16).run(["large_d"])["large_d"]
    assert result.status == FAIL
    assert "non-finite output at d = 2^18 (finite up to d=2^16" in result.diagnosis


def test_fixed_d_skips_and_a_huge_fixed_batch_skips():
    assert LayerNormAudit(layernorm_c.layer_norm, d=64).run(["large_d"])["large_d"].status \
        == "skip"
    skipped = LayerNormAudit(layernorm_c.layer_norm,
                             leading_shape=(64, 128)).run(["large_d"])["large_d"]
    assert skipped.status == "skip" and "too many records" in skipped.diagnosis
    # A smaller fixed batch runs the sizes it can fill.
    small = LayerNormAudit(layernorm_c.layer_norm, leading_shape=(2, 2)).run(["large_d"])
    assert small["large_d"].status == PASS


def test_rms_and_backward_batteries_have_the_large_d_check():
    rms = RMSNormAudit(layernorm_c.rms_norm).run(["large_d"])["large_d"]
    assert rms.status == PASS, rms
    backward = LayerNormBackwardAudit(layernorm_c.layer_norm_backward,
                                      mode="quick").run(["large_d"])["large_d"]
    assert backward.status == PASS, backward
    assert list(backward.values["errors"]) == list(LARGE_D["quick"])


# -- modes ---------------------------------------------------------------------

def test_modes_choose_the_sizes_and_show_in_the_title():
    for mode, sizes in LARGE_D.items():
        audit = LayerNormAudit(layernorm_c.layer_norm, mode=mode)
        assert (mode in audit.title) == (mode != "default")
        if mode != "thorough":
            result = audit.run(["large_d"])["large_d"]
            assert list(result.values["errors"]) == list(sizes)
    assert max(LARGE_D["thorough"]) == 2 ** 22 and max(LARGE_D["default"]) == 2 ** 20
    assert len(LARGE_D["quick"]) < len(LARGE_D["default"]) < len(LARGE_D["thorough"])


@pytest.mark.parametrize("audit, fn", [(LayerNormAudit, layernorm_c.layer_norm),
                                       (RMSNormAudit, layernorm_c.rms_norm),
                                       (LayerNormBackwardAudit, layernorm_c.layer_norm_backward)])
def test_unknown_mode_is_a_clear_error(audit, fn):
    with pytest.raises(ValueError, match=r"mode: expected one of \('quick', 'default', "
                                         r"'thorough'\), got 'fast'"):
        audit(fn, mode="fast")


def test_check_layer_norm_takes_the_mode():
    assert "quick" in check_layer_norm(layernorm_c.layer_norm, mode="quick").title


def test_cli_quick_and_thorough(capsys):
    assert main(["layernorm_c:layer_norm", "--quick", "--checks", "large_d"]) == 0
    out = capsys.readouterr().out
    assert "(float32, eps=1e-05, quick)" in out and "2^15" in out
    assert main(["layernorm_c:layer_norm", "--quick", "--thorough"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


# -- eps -------------------------------------------------------------------------

def test_a_hard_coded_eps_is_named_with_its_value():
    def hard_coded(x, weight, bias, eps):
        return ln_gallery.builtin_eps(x, weight, bias)

    result = LayerNormAudit(hard_coded).run(["eps"])["eps"]
    assert result.status == FAIL
    assert "the eps argument is ignored: the outputs fit eps = 0.001 whatever eps is passed" \
        in result.diagnosis
    assert result.values["claims"]["eps"] == "other"


def test_a_hidden_eps_is_found_when_eps_0_is_declared():
    result = LayerNormAudit(ln_gallery.builtin_eps, signature="x, weight, bias",
                            eps=0.0).run(["eps"])
    # eps = 0 and not an argument: nothing for the eps check to probe...
    assert result["eps"].status == "skip"
    # ... but with eps declared 1e-6 the built-in 1e-3 is read.
    named = LayerNormAudit(ln_gallery.builtin_eps, signature="x, weight, bias",
                           eps=1e-6).run(["eps"])["eps"]
    assert "the outputs fit eps = 0.001, not the declared eps=1e-06" in named.diagnosis


def test_another_eps_is_not_blamed_on_float16_or_the_variance():
    report = LayerNormAudit(ln_gallery.builtin_eps, signature="x, weight, bias").run()
    assert report["float16_overflow"].status == PASS, str(report)
    assert report["variance"].status == PASS, str(report)
    assert "statistics are computed in float16" not in str(report)
    assert "eps in use, 0.001, not the declared 1e-05" in report["invariants"].diagnosis


# -- margins ----------------------------------------------------------------------

def test_invariants_names_no_sample_variance_for_a_ratio_above_1():
    def scaled_up(x, weight, bias, eps):
        return _reference(x, weight, bias, eps) * 1.0002

    report = LayerNormAudit(scaled_up, d=4096).run(["invariants", "variance"])
    result = report["invariants"]
    assert result.status == FAIL
    assert "a ratio of 1.0004" in result.diagnosis
    assert "sample variance" not in result.diagnosis
    assert contradictions(report.results) == {}


def test_invariants_and_variance_agree_at_large_d():
    report = LayerNormAudit(ln_gallery.builtin_eps, signature="x, weight, bias",
                            d=2048).run(["invariants", "variance", "eps"])
    assert "sample variance" not in report["invariants"].diagnosis, str(report)
    assert report["variance"].status == PASS, str(report)
    assert contradictions(report.results) == {}
    # A true sample variance at the same d is named by both.
    sample = LayerNormAudit(ln_gallery.sample_variance, d=2048).run(["invariants", "variance"])
    assert "the sample variance's" in sample["invariants"].diagnosis, str(sample)
    assert sample["variance"].status == FAIL
    assert contradictions(sample.results) == {}


def test_variance_conventions_too_close_to_tell_apart_are_skipped():
    result = LayerNormAudit(layernorm_c.layer_norm, d=2 ** 16).run(["variance"])["variance"]
    assert result.status == "skip"
    assert "cannot be told apart at d=65536 in float32" in result.diagnosis
    rms = RMSNormAudit(layernorm_c.rms_norm, d=2 ** 16).run(["mean_square"])["mean_square"]
    assert rms.status == "skip" and "cannot tell them apart at d=65536" in rms.diagnosis


def test_contradictions_are_found():
    results = [CheckResult("invariants", FAIL, "", "", {"claims": {"denominator": "d-1"}}),
               CheckResult("variance", PASS, "", "", {"claims": {"denominator": "d"}}),
               CheckResult("eps", PASS, "", "", {"claims": {"eps": "as declared"}})]
    assert contradictions(results) == {"denominator": {"d-1": ["invariants"],
                                                       "d": ["variance"]}}
    assert contradictions(results[1:]) == {}


# -- figures and words -------------------------------------------------------------

def test_distinct_gives_the_digits_that_differ():
    assert distinct(-0.12083478912, -0.12083479123) == ("-0.120834789", "-0.120834791")
    assert distinct(1.5, 2.5) == ("1.5", "2.5")
    assert distinct(0.1, 0.1 + 2 ** -55)[0] != distinct(0.1, 0.1 + 2 ** -55)[1]
    assert distinct(math.nan, 1.0) == ("NaN", "1")


def test_a_reference_difference_prints_distinct_numbers():
    # The example: eps rounded to float32 in a float64 audit once
    # read "gives -0.1208348 instead of -0.1208348".
    report = LayerNormAudit(ln_gallery.float32_eps, dtype="float64").run(["reference"])
    diagnosis = report["reference"].diagnosis
    got, want = re.search(r"gives (\S+) instead of (\S+?)\.? ", diagnosis).groups()
    assert got != want and float(got) != float(want), diagnosis
    assert len(got.lstrip("-0.")) > 7, diagnosis  # more than the 7 digits that read alike


def test_nan_and_infinities_are_said_in_words():
    assert nonfinite_words([np.nan, 1.0], [0.5, 1.0]) == \
        "returns NaN where the reference is finite (1 of 2 values)"
    assert nonfinite_words([1.0, 2.0], [np.inf, 2.0]) == \
        "returns a finite value where the reference is infinite (1 of 2 values)"
    assert nonfinite_words([1.0], [1.0]) is None

    def nan_when_alone(x, weight, bias, eps):
        # Statistics over the batch axis with d - 1: NaN for a batch of one.
        x64 = np.asarray(x, np.float64)
        mean = x64.mean(axis=0, keepdims=True)
        var = x64.var(axis=0, ddof=1, keepdims=True)
        return ((x64 - mean) / np.sqrt(var + eps) * weight + bias).astype(x.dtype)

    report = LayerNormAudit(nan_when_alone, dtype="float64").run(["batch_invariance"])
    result = report["batch_invariance"]
    assert "ulp" not in result.figure and "ulp" not in result.diagnosis, result
    assert result.figure == "non-finite alone"
    assert "where the same record alone is NaN" in result.diagnosis

    def nan_in_one_record(x, weight, bias, eps):
        y = layernorm_c.layer_norm(x, weight, bias, eps)
        y.reshape(-1, y.shape[-1])[-1, 0] = np.nan
        return y

    reference = LayerNormAudit(nan_in_one_record).run(["reference"])["reference"]
    assert "it gives NaN where the reference is finite (" in reference.diagnosis
    assert reference.figure == "1 non-finite output"


def test_ulps_never_count_a_difference_beyond_tolerance():
    report = LayerNormAudit(ln_gallery.batch_statistics, dtype="float64").run(
        ["batch_invariance"])
    result = report["batch_invariance"]
    assert "ulp" not in result.figure and "beyond tolerance" in result.figure, result


def test_symptoms_name_the_checks_that_name_a_cause():
    report = LayerNormAudit(ln_gallery.eps_twice).run()
    assert "The checks below" not in str(report)
    assert report["reference"].diagnosis.endswith("The eps check names the likely cause")
    # No check names a cause: the symptom says so.
    def wobbly(x, weight, bias, eps):
        y = layernorm_c.layer_norm(x, weight, bias, eps)
        return y + np.float32(3e-4) * np.sin(np.arange(y.size)).reshape(y.shape).astype(y.dtype)

    odd = LayerNormAudit(wobbly).run(["reference", "variance", "eps"])
    assert odd["reference"].status == FAIL
    assert odd["reference"].diagnosis.endswith("The other checks of the battery may name the "
                                               "cause")
    assert "likely cause" not in str(odd)
    # link_causes on a whole battery with no cause named:
    lone = link_causes([CheckResult("reference", FAIL, "", "wrong", {"symptom": True})])
    assert lone[0].diagnosis == "wrong. No check of the battery names a cause"
