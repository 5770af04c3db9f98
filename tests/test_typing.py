"""The public API type-checks under ``mypy --strict`` as users call it, and
the package itself is strict-clean."""
import sys
from pathlib import Path

import pytest

from subprocess_support import PACKAGE_DIR, run_python

SCRIPT = Path(__file__).with_name("typing_user_script.py")

pytest.importorskip("mypy")


def _mypy(*args: str) -> "tuple[int, str]":
    # mypy runs from a temporary folder: it must analyse the package under
    # test (installed or in place), which run_python puts on the path.
    proc = run_python(["-m", "mypy", "--strict", "--no-incremental",
                       "--python-version", f"{sys.version_info[0]}.{sys.version_info[1]}",
                       *args], timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def test_user_script_type_checks_strictly():
    code, out = _mypy(str(SCRIPT))
    assert code == 0, out
    assert "Success: no issues found" in out, out


def test_mypy_catches_a_wrong_call(tmp_path):
    """The test can fail: a call the annotations forbid is an error."""
    bad = tmp_path / "bad.py"
    bad.write_text("import layernorm_c as lnc\n"
                   "y = lnc.layer_norm([1.0, 2.0], return_stats=True)\n"
                   "y.shape\n"                      # a LayerNormResult has no shape
                   "lnc.layer_norm([1.0], axis='last')\n")
    code, out = _mypy(str(bad))
    assert code == 1, out
    assert 'has no attribute "shape"' in out and "axis" in out, out


def test_package_is_strict_clean(tmp_path):
    code, out = _mypy("-p", "layernorm_c")
    assert code == 0, out
    plugin = PACKAGE_DIR.parent / "pytest_layernorm_c.py"
    if plugin.exists():  # the plugin's top-level module, beside the package
        # checked as a copy: mypy refuses files inside site-packages
        copy = tmp_path / plugin.name
        copy.write_text(plugin.read_text())
        code, out = _mypy(str(copy))
        assert code == 0, out


def test_user_script_runs(capsys):
    """The script is real code: it runs and its assertions hold."""
    ns = {"__name__": "__typing_user_script__"}
    exec(compile(SCRIPT.read_text(), str(SCRIPT), "exec"), ns)
    ns["main"]()
    assert "hand_rows" in capsys.readouterr().out


def test_package_dir_is_the_one_under_test():
    import layernorm_c
    assert Path(layernorm_c.__file__).parent == PACKAGE_DIR
