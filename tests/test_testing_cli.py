"""The command line ``python -m layernorm_c audit module:function``, through
``layernorm_c.testing._cli.main`` and end to end in a subprocess."""
import sys
import textwrap

import pytest

from layernorm_c.testing import CHECKS
from layernorm_c.testing._cli import main
from subprocess_support import run_python


@pytest.fixture(autouse=True)
def _restore_sys_path(monkeypatch):
    """main() puts the working directory on sys.path, as ``python -m`` would,
    to import the target: keep that from leaking into later tests (from a
    source tree it would bring the tree's layernorm_c.egg-info back)."""
    monkeypatch.setattr(sys, "path", list(sys.path))


def test_correct_implementation_exits_0_and_prints_the_table(capsys):
    assert main(["layernorm_c:layer_norm", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("LayerNorm audit of layernorm_c:layer_norm (float64, eps=1e-05)\n")
    assert f"{len(CHECKS)} checks: {len(CHECKS)} passed, 0 failed" in out


def test_broken_implementation_exits_1_with_the_diagnosis(capsys):
    assert main(["ln_gallery:eps_on_std"]) == 1
    out = capsys.readouterr().out
    assert "\neps " in out and "FAIL" in out
    assert "eps added to the standard deviation" in out


def test_options_reach_the_audit(capsys):
    argv = ["ln_gallery:order_depends_on_batch", "--checks", "batch_invariance,eps",
            "--eps", "0.01", "--d", "32", "--seed", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "(float32, eps=0.01, d=32)" in out
    assert "\nbatch_invariance  warn" in out
    assert "eps = 0.01, 0.1, 1" in out
    assert main(argv + ["--strict-batch-invariance"]) == 1


def test_signature_leading_shape_and_a_file_target(tmp_path, capsys):
    source = tmp_path / "my_norm.py"
    source.write_text(textwrap.dedent("""
        import layernorm_c

        def norm(x, eps):
            assert x.shape[:-1] == (4, 8), x.shape
            return layernorm_c.layer_norm(x, eps=eps)
    """))
    argv = [f"{source}:norm", "--signature", "x, eps", "--leading-shape", "4,8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "leading shape (4, 8)" in out
    assert "\naffine            skip" in out


def test_torch_functional_target(capsys):
    pytest.importorskip("torch")
    assert main(["torch.nn.functional:layer_norm", "--checks", "reference,eps"]) == 0
    assert "2 checks: 2 passed" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["nope_module:f"], "cannot import 'nope_module'"),
    (["layernorm_c:no_such_function"], "has no attribute 'no_such_function'"),
    (["layernorm_c.layer_norm"], "expected package.module:function"),
    (["layernorm_c:layer_norm", "--signature", "x, gamma"], "unknown argument 'gamma'"),
    (["layernorm_c:layer_norm", "--checks", "epsilon"], "unknown checks"),
    (["layernorm_c:layer_norm", "--dtype", "int8"], "invalid choice"),
    (["layernorm_c:layer_norm", "--leading-shape", "4,a"], "expected integers"),
    ([], "a target package.module:function is required"),
])
def test_usage_errors_exit_2(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_list_checks(capsys):
    assert main(["--list-checks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(CHECKS)


def test_end_to_end_in_a_subprocess():
    command = ["-m", "layernorm_c", "audit"]
    ok = run_python(command + ["layernorm_c:layer_norm", "--checks", "hand_rows"], timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "hand_rows  pass" in ok.stdout
    bad = run_python(command + ["layernorm_c:reference_layer_norm", "--checks", "contract"],
                     timeout=120)
    # reference_layer_norm returns a named tuple (y, mean, var), not an array.
    assert bad.returncode == 1
    assert "returned a ReferenceResult, which is not an array" in bad.stdout


def test_rms_norm_op(capsys):
    from layernorm_c.testing import RMS_BACKWARD_CHECKS, RMS_CHECKS

    assert main(["--op", "rms_norm", "--list-checks"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == list(RMS_CHECKS)
    assert main(["--op", "rms_norm", "--backward", "--list-checks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(RMS_BACKWARD_CHECKS)
    assert main(["--op", "rms_norm", "layernorm_c:rms_norm", "--checks", "eps,scale"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("RMSNorm audit of layernorm_c:rms_norm (float32, eps=1e-06)")
    assert main(["--op", "rms_norm", "--convention", "1+weight", "--dtype", "float16",
                 "layernorm_c:rms_norm", "--checks", "scale"]) == 0
    out = capsys.readouterr().out
    assert "scale 1 + weight" in out and "scale   pass" in out.replace("scale  pass", "scale   pass")
    assert main(["--op", "rms_norm", "--backward", "layernorm_c:rms_norm_backward",
                 "--checks", "paths"]) == 0
    assert "RMSNorm backward audit" in capsys.readouterr().out
    # The checks are the op's: cancellation is LayerNorm's.
    assert main(["--op", "rms_norm", "layernorm_c:rms_norm", "--checks", "cancellation"]) == 2
    assert "unknown RMSNorm checks ['cancellation']" in capsys.readouterr().err
    assert main(["--convention", "1+weight", "layernorm_c:layer_norm"]) == 2
    assert "--convention goes with --op rms_norm" in capsys.readouterr().err
    # A LayerNorm audited as an RMSNorm: its mean is subtracted.
    assert main(["--op", "rms_norm", "--signature", "x, weight, *, eps",
                 "layernorm_c:layer_norm", "--checks", "centering"]) == 1
    assert "that is a LayerNorm" in capsys.readouterr().out
