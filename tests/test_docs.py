"""The documentation builds cleanly, its examples are true, and the README's
commands and example are the real ones."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from subprocess_support import PACKAGE_DIR, run_python

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

MAIN_COMMAND = "pip install -e . && python -m layernorm_c"
TEST_COMMAND = 'pip install -e ".[test]" && python -m pytest'


def _sphinx(builder: str, out: Path) -> subprocess.CompletedProcess:
    """Run Sphinx in a fresh interpreter, warnings as errors."""
    pytest.importorskip("sphinx")
    pytest.importorskip("numpydoc")
    return run_python(["-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder, DOCS, out],
                      cwd=out.parent, timeout=600)


def test_docs_conf_imports_the_package_under_test_from_the_repository_root():
    """The README's docs command runs ``python -m sphinx`` from the repository
    root, which puts the root first on sys.path; conf.py must still import
    the layernorm_c the tests use (the installed one when the tree has no
    in-place build), not the source folder without its compiled _core."""
    code = ("import os, runpy, sys; sys.path.insert(0, os.getcwd());"  # as python -m does
            "runpy.run_path(os.path.join('docs', 'conf.py'));"
            "import layernorm_c._core; print(layernorm_c.__file__)")
    proc = run_python(["-c", code], cwd=ROOT, safe_path=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    where = proc.stdout.splitlines()[-1]
    assert os.path.samefile(where, PACKAGE_DIR / "__init__.py"), (where, PACKAGE_DIR)


def test_docs_build_without_warnings(tmp_path):
    out = tmp_path / "html"
    proc = _sphinx("html", out)
    assert proc.returncode == 0, (
        f"sphinx html build failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    )
    assert "WARNING" not in proc.stderr, proc.stderr
    api = (out / "api.html").read_text(encoding="utf-8")
    # The API page is generated from the docstrings, not left empty.
    for text in ("layer_norm", "LayerNormResult", "layer_norm_ufunc",
                 "reference_layer_norm", "set_num_threads",
                 "Added to the variance inside the square root"):
        assert text in api, f"{text!r} missing from the built api.html"


def test_docs_examples_are_true(tmp_path):
    """Every >>> example in the docs (and in the docstrings autodoc pulls in)
    gives the output shown."""
    out = tmp_path / "doctest"
    proc = _sphinx("doctest", out)
    report = out / "output.txt"
    detail = report.read_text(encoding="utf-8") if report.exists() else ""
    assert proc.returncode == 0, (
        f"sphinx doctest failed ({proc.returncode}):\n{detail}\n{proc.stdout}\n{proc.stderr}"
    )
    assert re.search(r"\b0 failures in tests", detail), detail


def _readme() -> str:
    return README.read_text(encoding="utf-8")


def _fenced_blocks(text: str, lang: str | None = None) -> list[str]:
    blocks = re.findall(r"^```([\w+-]*)[ \t]*\n(.*?)^```[ \t]*$", text, re.M | re.S)
    return [body for tag, body in blocks if lang is None or tag == lang]


def test_readme_commands_verbatim():
    blocks = _fenced_blocks(_readme())
    lines = {line.strip() for block in blocks for line in block.splitlines()}
    assert MAIN_COMMAND in lines, "README: the main-job command is missing"
    assert TEST_COMMAND in lines, "README: the test command is missing"


def test_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert TEST_COMMAND in ci.splitlines(), ".ci/run must run the README's test command"


def test_readme_python_example_runs(capsys):
    blocks = _fenced_blocks(_readme(), "python")
    assert blocks, "README has no ```python example"
    code = blocks[0]
    namespace: dict = {"__name__": "__readme__"}
    exec(compile(code, str(README), "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    # The outputs quoted in the example's comments are the real ones.
    quoted = [m.group(1).strip() for m in re.finditer(r"print\(.*\)\s*#\s*(.*)$", code, re.M)]
    assert quoted and len(quoted) == len(printed), (quoted, printed)
    for want, got in zip(quoted, printed):
        assert " ".join(got.split()) == " ".join(want.split()), (want, got)
