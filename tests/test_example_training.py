"""examples/train_mlp.py (the example of docs/training.rst) runs and shows
what it claims: the loss goes down, the whole model's gradient check agrees
with finite differences, the LayerNorm gradients accumulated over
micro-batches are bit-identical to the full batch's, and the state_dict
goes to PyTorch and back. The gradient check is also shown to catch a wrong
backward, in the model's own layers and in LayerNorm's."""
from __future__ import annotations

import importlib.util
import io
import os
import re
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from subprocess_support import run_python

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_mlp.py"


@pytest.fixture(scope="module")
def quick_run() -> str:
    """The printed output of ``python examples/train_mlp.py --quick``."""
    proc = run_python([EXAMPLE, "--quick"], timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_loss_goes_down(quick_run):
    steps = [(int(s), float(loss)) for s, loss in
             re.findall(r"^  step +(\d+) +loss ([\d.]+) +accuracy", quick_run, re.M)]
    assert [s for s, _ in steps] == list(range(0, 301, 30)), quick_run
    losses = [loss for _, loss in steps]
    assert losses[0] > 1.0, quick_run  # about log(3) at the start
    assert losses[-1] < 0.5 * losses[0], quick_run
    assert losses[-1] < min(losses[:-1]), quick_run  # lowest at the end


def test_gradient_check_agrees_with_finite_differences(quick_run):
    rows = dict(re.findall(r"^  (\S+) .*relative error ([\d.e+-]+)$", quick_run, re.M))
    # every parameter of every layer, LayerNorm's included, and the input
    for name in ("0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias",
                 "4.weight", "4.bias", "6.weight", "6.bias", "input"):
        assert name in rows, f"{name} not checked:\n{quick_run}"
    assert max(float(v) for v in rows.values()) < 1e-6, quick_run
    worst = float(re.search(r"max relative error: ([\d.e+-]+)", quick_run).group(1))
    assert worst == max(float(v) for v in rows.values())


def test_micro_batch_accumulation_is_bit_identical(quick_run):
    verdicts = re.findall(r"bit-identical to the full batch's: (\w+)", quick_run)
    assert verdicts == ["yes"] * 4, quick_run
    assert "300 parts of 1, in reverse order" in quick_run


def test_pytorch_interop_or_a_clean_skip(quick_run):
    try:
        import torch  # noqa: F401
    except ImportError:
        assert "PyTorch: not installed, skipped" in quick_run
        return
    diff = float(re.search(r"logits differ by at most ([\d.e+-]+)", quick_run).group(1))
    assert diff < 1e-4, quick_run
    assert "loads back into lnc.LayerNorm, unchanged: yes" in quick_run, quick_run


@pytest.fixture
def example(monkeypatch):
    """The example as a module; its BLAS-thread settings go to a copy of
    the environment, not into this process's (and its children's)."""
    monkeypatch.setattr(os, "environ", dict(os.environ))
    spec = importlib.util.spec_from_file_location("train_mlp_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gradient_error(example) -> float:
    rng = np.random.default_rng(0)
    x, labels = example.spirals(10, 3, rng)
    model = example.MLP(2, 16, 3, rng)
    with redirect_stdout(io.StringIO()):
        return example.gradient_check(model, x[:8], labels[:8], rng)


def test_the_gradient_check_passes_the_right_backward(example):
    assert _gradient_error(example) < 1e-6


def test_the_gradient_check_catches_a_wrong_activation_backward(example, monkeypatch):
    monkeypatch.setattr(example.Tanh, "backward", lambda self, dy: dy * (1 - self.y))
    assert _gradient_error(example) > 1e-3


def test_the_gradient_check_catches_a_wrong_layer_norm_backward(example, monkeypatch):
    """dx of the LayerNorm off by 1% (its parameter gradients are right)."""
    right = example.lnc.LayerNorm.backward
    monkeypatch.setattr(example.lnc.LayerNorm, "backward",
                        lambda self, dy: 1.01 * right(self, dy))
    assert _gradient_error(example) > 1e-3


def test_the_gradient_check_catches_a_wrong_layer_norm_gain_gradient(example,
                                                                     monkeypatch):
    right = example.lnc.LayerNorm.backward

    def wrong(self, dy):
        dx = right(self, dy)
        self.grad_weight = self.grad_weight * 1.01
        return dx

    monkeypatch.setattr(example.lnc.LayerNorm, "backward", wrong)
    assert _gradient_error(example) > 1e-3


def _shape(text: str) -> list[str]:
    """The lines with every number masked and runs of spaces collapsed."""
    number = r"\d+(\.\d+)?(e[+-]?\d+)?"
    return [" ".join(re.sub(number, "#", line).split()) for line in text.splitlines()]


def test_the_docs_show_this_example_s_output(quick_run):
    """docs/training.rst quotes a full run (docs/train_mlp_output.txt,
    ``python examples/train_mlp.py > docs/train_mlp_output.txt``): line for
    line what the example prints today, but for the numbers (another
    machine, fewer steps). Without torch, up to the PyTorch part."""
    quoted = (EXAMPLE.parents[1] / "docs" / "train_mlp_output.txt").read_text(encoding="utf-8")
    want, got = _shape(quoted), _shape(quick_run)
    if "PyTorch: not installed, skipped" in quick_run:
        want = want[:next(i for i, line in enumerate(want) if line.startswith("PyTorch"))]
        got = got[:-1]
    assert got == want


def test_readme_training_snippet_runs(capsys):
    """The README's "Training" example runs, and prints what it says."""
    readme = (EXAMPLE.parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Training\n", 1)[1].split("\n## ", 1)[0]
    assert "examples/train_mlp.py" in section and "docs/training.rst" in section
    code = re.search(r"^```python\n(.*?)^```$", section, re.M | re.S).group(1)
    exec(compile(code, "README.md (Training)", "exec"), {"__name__": "__readme__"})
    printed = capsys.readouterr().out.splitlines()
    quoted = [m.group(1).strip() for m in re.finditer(r"print\(.*\)\s*#\s*(.*)$", code, re.M)]
    assert quoted and printed == quoted
