"""layernorm_c.testing's API: reports, check_layer_norm, adapters and
calling conventions, and the numerical helpers the checks stand on."""
import warnings

import numpy as np
import pytest

import layernorm_c
import ln_gallery
from layernorm_c.testing import (
    CHECKS,
    AuditReport,
    CheckResult,
    LayerNormAudit,
    LayerNormAuditWarning,
    adapt,
    check_layer_norm,
    describe_checks,
    layer_norm_checks,
)
from layernorm_c.testing._numerics import Tolerance, model_layer_norm, ulp_distance
from layernorm_c.testing._report import render_table


def _report(*statuses):
    return AuditReport("audit of f", [
        CheckResult(f"check{i}", s, f"figure {i}", f"diagnosis {i}") for i, s in enumerate(statuses)
    ])


# -- the report ----------------------------------------------------------------

def test_report_sorts_results_by_status():
    report = _report("pass", "fail", "warn", "skip", "fail")
    assert not report.ok
    assert [r.name for r in report.failures] == ["check1", "check4"]
    assert [r.name for r in report.warnings] == ["check2"]
    assert [r.name for r in report.skipped] == ["check3"]
    assert [r.name for r in report] == [f"check{i}" for i in range(5)]
    assert len(report) == 5
    assert report["check2"].status == "warn"
    with pytest.raises(KeyError, match="no check named 'nope'"):
        report["nope"]
    assert report.summary() == "5 checks: 1 passed, 2 failed, 1 warned, 1 skipped"


def test_report_with_warnings_only_is_ok():
    assert _report("pass", "warn", "skip").ok


def test_check_result_rejects_unknown_status():
    with pytest.raises(ValueError, match="status"):
        CheckResult("x", "passed", "", "")


def test_table_is_aligned_and_wraps_the_diagnosis():
    results = [CheckResult("short", "pass", "1", "fine"),
               CheckResult("a_longer_name", "fail", "figure two", "word " * 40)]
    lines = render_table("title", results, "footer", width=100).splitlines()
    assert lines[0] == "title" and lines[-1] == "footer"
    header, rule, first, second = lines[1:5]
    # Every column starts at the same offset on every row.
    for column in ("status", "figure", "diagnosis"):
        start = header.index(column)
        assert rule[start - 2:start] == "  " and rule[start] == "-"
    assert first.index("pass") == header.index("status")
    assert second.index("FAIL") == header.index("status")  # failures stand out
    assert second.index("figure two") == header.index("figure")
    continuation = lines[5]
    assert continuation.startswith(" " * header.index("diagnosis") + "word")
    assert all(len(line) <= 100 for line in lines[1:-1])


def test_str_of_a_real_report_lists_every_check():
    text = str(LayerNormAudit(layernorm_c.layer_norm).run())
    assert text.startswith("LayerNorm audit of layernorm_c._api.layer_norm (float32, eps=1e-05)")
    for name in CHECKS:
        assert f"\n{name} " in text
    assert text.endswith(f"{len(CHECKS)} checks: {len(CHECKS)} passed, 0 failed, 0 warned, "
                         "0 skipped")


# -- check_layer_norm ------------------------------------------------------------

def test_check_layer_norm_returns_the_report_when_all_pass():
    report = check_layer_norm(layernorm_c.layer_norm, dtype="float64")
    assert isinstance(report, AuditReport) and report.ok


def test_check_layer_norm_raises_with_the_diagnosis():
    with pytest.raises(AssertionError) as info:
        check_layer_norm(ln_gallery.eps_twice)
    message = str(info.value)
    assert message.startswith("LayerNorm audit of ")
    assert "2 of 14 checks failed" in message
    assert "- eps (" in message and "eps applied twice" in message
    assert "\ncheck " in message  # followed by the whole table


def test_check_layer_norm_warns_for_warnings():
    with pytest.warns(LayerNormAuditWarning, match="not batch-invariant"):
        report = check_layer_norm(ln_gallery.order_depends_on_batch)
    assert report.ok


def test_check_layer_norm_takes_every_option_of_the_audit():
    # check_layer_norm spells out LayerNormAudit's keywords (for type
    # checkers and editors): the two lists must not drift apart.
    import inspect

    audit = inspect.signature(LayerNormAudit).parameters
    check = inspect.signature(check_layer_norm).parameters
    assert [n for n in check if n != "checks"] == list(audit)
    for name, parameter in audit.items():
        assert check[name].default == parameter.default, name
        assert check[name].kind == parameter.kind, name


def test_run_a_subset_of_checks_in_the_given_order():
    report = LayerNormAudit(layernorm_c.layer_norm).run(["state", "eps"])
    assert [r.name for r in report] == ["state", "eps"]
    with pytest.raises(ValueError, match="unknown"):
        LayerNormAudit(layernorm_c.layer_norm).run(["epsilon"])


def test_describe_and_select_checks():
    assert describe_checks().splitlines()[0].startswith("contract ")
    assert len(describe_checks().splitlines()) == len(CHECKS)
    assert layer_norm_checks() == list(CHECKS)
    assert "float16_overflow" not in layer_norm_checks(exclude=["float16_overflow"])
    with pytest.raises(ValueError, match="unknown"):
        layer_norm_checks(exclude=["float16"])


# -- calling conventions -----------------------------------------------------------

def _ours(x, weight=None, bias=None, eps=1e-5):
    return layernorm_c.layer_norm(x, weight, bias, eps)


@pytest.mark.parametrize("signature, fn, skipped", [
    ("x", lambda x: _ours(x), ["affine"]),  # eps=1e-5 built in
    ("x, eps", lambda x, eps: _ours(x, eps=eps), ["affine"]),
    ("x, weight, eps", lambda x, w, eps: _ours(x, w, eps=eps), []),
    ("x, bias, eps", lambda x, b, eps: _ours(x, bias=b, eps=eps), []),
    ("x, *, weight, bias, eps", lambda x, *, weight, bias, eps: _ours(x, weight, bias, eps), []),
    ("x, eps, weight, bias", lambda x, eps, w, b: _ours(x, w, b, eps), []),
])
def test_signatures(signature, fn, skipped):
    report = LayerNormAudit(fn, signature=signature).run()
    assert report.ok, str(report)
    assert [r.name for r in report.skipped] == skipped


def test_fixed_eps_is_probed_when_it_is_not_zero():
    report = LayerNormAudit(lambda x: _ours(x, eps=0.1), signature="x", eps=0.1).run(["eps"])
    assert report["eps"].status == "pass"
    assert "eps = 0.1" in report["eps"].diagnosis
    # Declaring the wrong eps shows up as a failure of the eps check.
    wrong = LayerNormAudit(lambda x: _ours(x, eps=0.1), signature="x", eps=1e-5).run(["eps"])
    assert wrong["eps"].status == "fail"


@pytest.mark.parametrize("signature, message", [
    ("weight, bias", "'x' as a positional"),
    ("x, gamma", "unknown argument 'gamma'"),
    ("x, eps, eps", "repeated"),
    ("*, x", "'x' as a positional"),
])
def test_bad_signatures(signature, message):
    with pytest.raises(ValueError, match=message):
        adapt(_ours, signature)


def test_bad_options():
    with pytest.raises(ValueError, match="framework"):
        adapt(_ours, framework="tensorflow")
    with pytest.raises(TypeError, match="callable"):
        LayerNormAudit(42)
    with pytest.raises(ValueError, match="dtype"):
        LayerNormAudit(_ours, dtype="int32")
    with pytest.raises(ValueError, match="eps"):
        LayerNormAudit(_ours, eps=-1.0)


def test_fixed_size_and_leading_shape():
    calls = []

    def only_8_by_32(x, weight, bias, eps):
        calls.append(x.shape)
        assert x.shape == (8, 32), "only (8, 32)"
        return _ours(x, weight, bias, eps)

    report = LayerNormAudit(only_8_by_32, d=32, leading_shape=(8,)).run()
    assert report.ok, str(report)
    assert set(calls) == {(8, 32)}
    assert report.title.endswith("(float32, eps=1e-05, d=32, leading shape (8,))")
    # The hand rows are repeated to fill d = 32.
    assert "[-1.341641, -0.447214, 0.447214, 1.341641, ...]" in report["hand_rows"].diagnosis


def test_a_fixed_size_that_cannot_hold_the_hand_rows_skips_them():
    report = LayerNormAudit(_ours, d=6).run(["hand_rows"])
    assert report["hand_rows"].status == "skip"


def test_single_record_leading_shape_skips_coupling():
    report = LayerNormAudit(_ours, leading_shape=(1,)).run()
    assert report.ok, str(report)
    assert {r.name for r in report.skipped} == {"coupling", "nonfinite"}


def test_an_undeclared_restriction_fails_with_a_hint():
    def only_d_32(x, weight, bias, eps):
        if x.shape[-1] != 32:
            raise ValueError("d must be 32")
        return _ours(x, weight, bias, eps)

    result = LayerNormAudit(only_d_32).run(["reference"])["reference"]
    assert result.status == "fail"
    assert result.figure == "raised ValueError"
    assert "d must be 32" in result.diagnosis and "declare it (d=..." in result.diagnosis
    assert LayerNormAudit(only_d_32, d=32).run().ok


def test_wrong_output_shape_is_reported():
    result = LayerNormAudit(lambda x, w, b, e: _ours(x, w, b, e)[..., :-1]).run(["contract"])
    assert result["contract"].status == "fail"
    assert "returned shape" in result["contract"].diagnosis


def test_modifying_the_input_fails_the_contract():
    def in_place(x, weight, bias, eps):
        return layernorm_c.layer_norm(x, weight, bias, eps, out=x)

    result = LayerNormAudit(in_place).run(["contract", "reference"])
    assert result["contract"].status == "fail"
    assert "modifies its input x in place" in result["contract"].diagnosis
    assert result["reference"].status == "pass"  # the checks pass copies


def test_narrower_output_dtype_warns():
    result = LayerNormAudit(lambda x, w, b, e: _ours(x, w, b, e).astype(np.float32),
                            dtype="float64").run(["contract"])["contract"]
    assert result.status == "warn"
    assert "returns float32 for float64 input" in result.diagnosis


def test_array_likes_are_read_with_asarray():
    def as_lists(x, weight, bias, eps):
        return _ours(x, weight, bias, eps).tolist()

    report = LayerNormAudit(as_lists, dtype="float64").run(["hand_rows", "reference"])
    assert report.ok, str(report)


def test_no_float16_support_skips_the_overflow_check():
    def no_float16(x, weight, bias, eps):
        if x.dtype == np.float16:
            raise TypeError("float16 is not supported")
        return _ours(x, weight, bias, eps)

    result = LayerNormAudit(no_float16).run(["float16_overflow"])["float16_overflow"]
    assert result.status == "skip"
    assert "does not accept float16" in result.diagnosis


def test_tolerance_override():
    loose = LayerNormAudit(ln_gallery.eps_on_std, rtol=1e-2, atol=1e-2).run(["reference"])
    assert loose.ok
    assert LayerNormAudit(ln_gallery.eps_on_std).run(["reference"])["reference"].status == "fail"


def test_same_seed_same_report():
    one = LayerNormAudit(ln_gallery.sample_variance, seed=3).run()
    two = LayerNormAudit(ln_gallery.sample_variance, seed=3).run()
    assert str(one) == str(two)


def test_torch_function_of_tensors():
    torch = pytest.importorskip("torch")

    def torch_layer_norm(x, weight, bias, eps):
        assert isinstance(x, torch.Tensor)
        return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps)

    report = LayerNormAudit(torch_layer_norm, framework="torch").run(["reference", "eps"])
    assert report.ok, str(report)


def test_torch_module_eps_is_its_own():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="uses its own eps=1e-05"):
        LayerNormAudit(torch.nn.LayerNorm(8), eps=0.1)
    module = torch.nn.LayerNorm(8)
    LayerNormAudit(module).run(["affine"])
    assert torch.equal(module.weight, torch.ones(8))  # audited through a copy


# -- numerical helpers ---------------------------------------------------------------

def test_ulp_distance():
    one = np.float32(1.0)
    assert ulp_distance(one, np.nextafter(one, np.float32(2))) == 1
    assert ulp_distance(np.float32(-0.0), np.float32(0.0)) == 0
    assert ulp_distance(np.float32(-np.finfo(np.float32).tiny), np.float32(0)) == 2 ** 23
    assert ulp_distance(np.float16(1), np.float16(2)) == 2 ** 10
    assert ulp_distance(np.float64(np.nan), np.float64(np.nan)) == 0
    assert ulp_distance(np.float64(np.nan), np.float64(1)) == np.inf


def test_tolerance_units():
    tol = Tolerance(rtol=0.1, atol=0.1)
    assert tol.units(np.array([1.2]), np.array([1.0]))[0] == pytest.approx(1.0)
    assert tol.units(np.array([np.nan]), np.array([1.0]))[0] == np.inf
    assert tol.units(np.array([np.inf]), np.array([np.inf]))[0] == 0


def test_models_agree_with_the_reference_and_differ_from_each_other():
    x = np.random.default_rng(0).standard_normal((3, 8)) * 0.01
    w, b = np.arange(8.0), np.ones(8)
    reference = layernorm_c.reference_layer_norm(x, w, b, 1e-4).y
    np.testing.assert_allclose(model_layer_norm(x, w, b, 1e-4), reference, rtol=1e-13)
    variants = [model_layer_norm(x, eps=1e-4, ddof=ddof, eps_mode=mode)
                for ddof in (0, 1) for mode in ("variance", "std", "ignored", "twice")]
    for i, a in enumerate(variants):
        for c in variants[i + 1:]:
            assert not np.allclose(a, c, rtol=1e-3)


def test_implementation_warnings_are_not_shown():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LayerNormAudit(ln_gallery.one_pass_float32).run(["cancellation"])
