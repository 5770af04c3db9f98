"""The pytest plugin, run inside pytest with the pytester fixture; loading it
imports neither NumPy nor the C core (checked in fresh interpreters)."""
import json
import os
import textwrap

import pytest

from subprocess_support import run_python

pytest_plugins = ["pytester"]

PLUGIN = ["-p", "layernorm_c.testing.plugin"]

IMPLEMENTATIONS = '''
import numpy as np
import pytest
import layernorm_c


def ours(x, weight, bias, eps):
    return layernorm_c.layer_norm(x, weight, bias, eps)


def sample_variance(x, weight, bias, eps):
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=-1, keepdims=True)
    var = x64.var(axis=-1, ddof=1, keepdims=True)
    return ((x64 - mean) / np.sqrt(var + eps) * weight + bias).astype(x.dtype)


def order_depends_on_batch(x, weight, bias, eps):
    """Correct, but sums sequentially for an odd number of records."""
    dtype, x = x.dtype, x.astype(np.float32)
    d = x.shape[-1]
    odd = (x.size // d) % 2 == 1

    def total(a):
        return np.cumsum(a, axis=-1)[..., -1:] if odd else a.sum(axis=-1, keepdims=True)

    mean = total(x) / np.float32(d)
    var = total((x - mean) ** 2) / np.float32(d)
    return ((x - mean) / np.sqrt(var + np.float32(eps)) * weight + bias).astype(dtype)
'''


def _write(pytester, body):
    pytester.makepyfile(test_mine=IMPLEMENTATIONS + textwrap.dedent(body))


def test_one_item_per_check(pytester):
    from layernorm_c.testing import CHECKS

    _write(pytester, """
        def test_ours(layer_norm_check):
            layer_norm_check(ours)
    """)
    result = pytester.runpytest(*PLUGIN, "-v")
    result.assert_outcomes(passed=len(CHECKS))
    result.stdout.fnmatch_lines([f"*test_ours?{name}? PASSED*" for name in CHECKS])


def test_failing_items_carry_the_diagnosis(pytester):
    _write(pytester, """
        def test_broken(layer_norm_check):
            layer_norm_check(sample_variance)
    """)
    result = pytester.runpytest(*PLUGIN, "-rf")
    result.assert_outcomes(passed=10, failed=4)
    result.stdout.fnmatch_lines([
        "*_ test_broken?variance? _*",
        "sample variance: outputs are sqrt((d - 1)/d) = 0.9354 times the reference at d=8*",
        "?LayerNorm audit of test_mine.sample_variance (float32, eps=1e-05); "
        "variance: output/reference 0.9354 (d - 1 gives 0.9354)?",
        # The short summary leads with the diagnosis.
        "FAILED test_mine.py::test_broken?variance? - Failed: sample variance*",
    ])
    # pytrace=False: the diagnosis, not a traceback into the plugin.
    assert "pytest_layernorm_c" not in result.stdout.str()
    assert "plugin.py" not in result.stdout.str()


def test_audit_fixture_fails_once_with_the_whole_report(pytester):
    _write(pytester, """
        def test_broken(layer_norm_audit):
            layer_norm_audit(sample_variance)

        def test_ours(layer_norm_audit):
            report = layer_norm_audit(ours, dtype="float64")
            assert report.ok and len(report) == 14
    """)
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*4 of 14 checks failed",
        "- variance (*): sample variance*",
        "check * status * figure * diagnosis",
        "14 checks: 10 passed, 4 failed, 0 warned, 0 skipped",
    ])


def test_options_marker_and_warnings(pytester):
    _write(pytester, """
        @pytest.mark.layer_norm_checks("batch_invariance", "eps", "float16_overflow")
        def test_selected(layer_norm_check):
            layer_norm_check(order_depends_on_batch)

        @pytest.mark.layer_norm_checks(exclude=["float16_overflow"])
        def test_excluded(layer_norm_check):
            layer_norm_check(ours, dtype="float16")

        def test_no_float16(layer_norm_check):
            def float32_only(x, weight, bias, eps):
                assert x.dtype != np.float16, "no float16 here"
                return ours(x, weight, bias, eps)
            layer_norm_check(float32_only)
    """)
    result = pytester.runpytest(*PLUGIN, "-v", "-rs")
    result.assert_outcomes(passed=3 + 13 + 13, skipped=1, warnings=1)
    result.stdout.fnmatch_lines([
        "*test_selected?batch_invariance? PASSED*",
        "*LayerNormAuditWarning*not batch-invariant: max difference * ulp*",
        "SKIPPED * does not accept float16 input: *float32_only raised AssertionError: "
        "no float16 here (called with x float16 (5, 16)*",
    ])
    assert "test_excluded[float16_overflow]" not in result.stdout.str()


def test_user_parametrization_is_respected(pytester):
    _write(pytester, """
        @pytest.mark.parametrize("layer_norm_check", ["hand_rows"], indirect=True)
        def test_one(layer_norm_check):
            assert layer_norm_check(ours).status == "pass"
    """)
    pytester.runpytest(*PLUGIN).assert_outcomes(passed=1)


def test_parametrize_over_checks_without_the_fixture(pytester):
    _write(pytester, """
        from layernorm_c.testing import check_layer_norm, layer_norm_checks

        @pytest.mark.parametrize("check", layer_norm_checks(exclude=["float16_overflow"]))
        def test_mine(check):
            check_layer_norm(ours, checks=[check])
    """)
    pytester.runpytest().assert_outcomes(passed=13)


def test_unknown_check_in_marker_is_a_usage_error(pytester):
    _write(pytester, """
        @pytest.mark.layer_norm_checks("epsilon")
        def test_bad(layer_norm_check):
            pass
    """)
    result = pytester.runpytest(*PLUGIN)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*unknown checks ?'epsilon'?*"])
    assert "Traceback" not in result.stdout.str() and "_caller.py" not in result.stdout.str()


def test_installed_entry_point_is_named_after_the_documented_module():
    """If the pytest11 entry point is installed, it must carry the name of
    the module users give to ``-p`` (``layernorm_c.testing.plugin``), or
    ``-p layernorm_c.testing.plugin`` would register the plugin twice and
    stop pytest. It loads the top-level module pytest_layernorm_c."""
    namespace: dict = {}
    exec(_PYTEST11, namespace)
    ours = [ep for ep in namespace["PYTEST11"]
            if ep.value in ("pytest_layernorm_c", "layernorm_c.testing.plugin")]
    if not ours:
        pytest.skip("layernorm_c is not installed with its pytest11 entry point")
    # (A set: Python 3.9 lists a distribution again for each copy of its
    # metadata on sys.path; pytest loads an entry point name once.)
    assert {(ep.name, ep.value) for ep in ours} == {("layernorm_c.testing.plugin",
                                                     "pytest_layernorm_c")}


def test_documented_module_is_the_plugin():
    """``-p layernorm_c.testing.plugin`` (a source checkout without the entry
    point) registers the very hooks and fixtures the entry point loads."""
    import pytest_layernorm_c
    from layernorm_c.testing import plugin

    for name in plugin.__all__:
        assert getattr(plugin, name) is getattr(pytest_layernorm_c, name), name
    hooks = {n for n in dir(pytest_layernorm_c) if n.startswith("pytest_")}
    assert hooks <= set(plugin.__all__)


# The installed pytest11 entry points (entry_points(group=) is Python 3.10+).
_PYTEST11 = """
import importlib.metadata as md
_eps = md.entry_points()
PYTEST11 = _eps.select(group="pytest11") if hasattr(_eps, "select") else _eps.get("pytest11", [])
"""

# What a fresh interpreter has imported, as JSON on its last line of output.
_LOADED = ("import json, sys; print(json.dumps(sorted(m for m in sys.modules if m == 'numpy' "
           "or m.startswith(('numpy.', 'layernorm_c')))))")

_ENTRY_POINT_MODULE = _PYTEST11 + """
import importlib
eps = [ep for ep in PYTEST11 if ep.name == "layernorm_c.testing.plugin"]
module = eps[0].load() if eps else importlib.import_module("pytest_layernorm_c")
assert module.__name__ == "pytest_layernorm_c", module
"""

# The session loads our plugin alone: other packages' entry points (zarr's,
# jaxtyping's) import NumPy themselves, which says nothing of ours.
_SESSION = _PYTEST11 + """
import pytest
args = ["-q", "-p", "no:cacheprovider", "-p", "pytest_layernorm_c", "test_plain.py"]
rc = pytest.main(args)
assert rc == 0, rc
"""

_PLAIN_TESTS = """
import sys

def test_plugin_is_active(pytestconfig):
    assert any(line.startswith("layer_norm_checks(") for line in pytestconfig.getini("markers"))

def test_nothing_imported_yet():
    assert "numpy" not in sys.modules and "layernorm_c" not in sys.modules
"""


# The child sessions load plugins as a plain pytest run of the environment.
_SESSION_ENV = {k: v for k, v in os.environ.items()
                if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
_SESSION_ENV["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"


def test_loading_the_plugin_imports_neither_numpy_nor_the_core(tmp_path):
    """The entry point is loaded by every pytest run of the environment: it
    must not import NumPy or layernorm_c (whose __init__ imports both and the
    C core) until a test uses a fixture. Checked after importing the entry
    point's module, and after a pytest session with the plugin active whose
    tests use no fixture of it."""
    proc = run_python(["-c", _ENTRY_POINT_MODULE + _LOADED], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == []

    (tmp_path / "test_plain.py").write_text(_PLAIN_TESTS)
    proc = run_python(["-c", _SESSION + _LOADED], cwd=tmp_path, env=_SESSION_ENV, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout
    assert json.loads(proc.stdout.splitlines()[-1]) == []


def test_a_fixture_imports_layernorm_c_when_used(tmp_path):
    """The other side: a test that uses a fixture gets layernorm_c and its
    core (the check above would also pass for a plugin that never loaded)."""
    (tmp_path / "test_plain.py").write_text(textwrap.dedent("""
        import sys

        def test_uses_it(layer_norm_audit):
            assert "layernorm_c._core" in sys.modules
    """))
    proc = run_python(["-c", _SESSION + _LOADED], cwd=tmp_path, env=_SESSION_ENV, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    assert "layernorm_c._core" in json.loads(proc.stdout.splitlines()[-1])


RMS_IMPLEMENTATIONS = '''
import numpy as np
import layernorm_c


def ours(x, weight, eps):
    return layernorm_c.rms_norm(x, weight, eps)


def eps_outside(x, weight, eps):
    x64 = x.astype(np.float64)
    rms = np.sqrt((x64 * x64).mean(axis=-1, keepdims=True))
    return (x64 / (rms + eps) * weight).astype(x.dtype)
'''


def test_rms_norm_fixtures_and_marker(pytester):
    from layernorm_c.testing import RMS_BACKWARD_CHECKS, RMS_CHECKS

    pytester.makepyfile(test_rms=RMS_IMPLEMENTATIONS + textwrap.dedent("""
        import pytest

        def test_ours(rms_norm_check):
            rms_norm_check(ours)

        @pytest.mark.rms_norm_checks("eps", "scale")
        def test_broken(rms_norm_check):
            rms_norm_check(eps_outside)

        def test_whole(rms_norm_audit):
            rms_norm_audit(eps_outside)

        def test_gemma(rms_norm_audit):
            import functools
            rms_norm_audit(functools.partial(layernorm_c.rms_norm, convention="1+weight"),
                           convention="1+weight")

        @pytest.mark.rms_norm_backward_checks(exclude=["param_invariance"])
        def test_backward(rms_norm_backward_check):
            rms_norm_backward_check(layernorm_c.rms_norm_backward)

        def test_backward_whole(rms_norm_backward_audit):
            rms_norm_backward_audit(layernorm_c.rms_norm_backward)
    """))
    result = pytester.runpytest(*PLUGIN, "-v")
    result.assert_outcomes(passed=len(RMS_CHECKS) + 1 + 1 + len(RMS_BACKWARD_CHECKS) - 1 + 1,
                           failed=2)
    result.stdout.fnmatch_lines(["*test_broken?eps? FAILED*", "*test_broken?scale? PASSED*",
                                 "*eps outside the square root*"])
