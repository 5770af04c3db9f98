"""The documentation builds cleanly, its examples are true, and the README's
commands and example are the real ones."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

from docs_support import DOCS, ROOT, built_pages, sphinx_build

README = ROOT / "README.md"

MAIN_COMMAND = "pip install -e . && python -m layernorm_c"
TEST_COMMAND = 'pip install -e ".[test]" && python -m pytest'


def test_docs_build_without_warnings(tmp_path):
    out = tmp_path / "html"
    proc = sphinx_build("html", out)
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
    _assert_everything_is_local(out)


class _Assets(HTMLParser):
    """The scripts, stylesheets, images and frames a page loads."""

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("script", "img", "iframe", "source") and attrs.get("src"):
            self.urls.append(attrs["src"])
        elif tag == "link" and attrs.get("href") and (
                {"stylesheet", "preload", "icon", "modulepreload"}
                & set((attrs.get("rel") or "").split())):
            self.urls.append(attrs["href"])


def _assert_everything_is_local(out: Path) -> None:
    """No page loads anything from the network (a CDN MathJax shows raw TeX
    offline), and the local MathJax the math pages load is in the build."""
    math_pages = 0
    for page in built_pages(out):
        parser = _Assets()
        parser.feed(page.read_text(encoding="utf-8"))
        remote = [u for u in parser.urls if re.match(r"([a-z][a-z0-9+.-]*:)?//", u, re.I)]
        assert not remote, f"{page.name} loads from the network: {remote}"
        mathjax = [u for u in parser.urls if "mathjax" in u.lower()]
        for url in mathjax:
            assert (page.parent / url.split("?")[0]).is_file(), (page.name, url)
        math_pages += bool(mathjax)
    assert math_pages >= 2, "the math pages load no MathJax"


def test_docs_conf_imports_the_installed_package(tmp_path):
    """conf.py run from the repository root, where the source folder comes
    first on sys.path (it has no compiled _core after a regular install),
    still imports the layernorm_c a neutral folder sees, core included."""
    where = "import os, layernorm_c, layernorm_c._core; print(os.path.dirname(layernorm_c.__file__))"
    neutral = subprocess.run([sys.executable, "-c", where], cwd=str(tmp_path),
                             capture_output=True, text=True, timeout=120)
    assert neutral.returncode == 0, neutral.stderr
    from_root = subprocess.run(
        [sys.executable, "-c",
         f"import runpy; runpy.run_path({str(DOCS / 'conf.py')!r}); {where}"],
        cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    assert from_root.returncode == 0, from_root.stderr
    assert os.path.samefile(from_root.stdout.strip(), neutral.stdout.strip()), (
        from_root.stdout, neutral.stdout)


def test_docs_examples_are_true(tmp_path):
    """Every >>> example in the docs (and in the docstrings autodoc pulls in)
    gives the output shown."""
    out = tmp_path / "doctest"
    proc = sphinx_build("doctest", out)
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
