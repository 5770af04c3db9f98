"""Building the Sphinx documentation from the tests (test_docs.py and
test_docs_browser.py share this)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def sphinx_build(builder: str, out: Path) -> subprocess.CompletedProcess:
    """Run Sphinx in a fresh interpreter, warnings as errors.

    The working directory is the output's parent (a temporary folder), not
    the repository root: ``python -m`` puts the working directory first on
    sys.path, and there the source folder ``layernorm_c/`` (no compiled
    ``_core`` in a regular install) would shadow the installed package.
    (docs/conf.py guards against that too.)
    """
    pytest.importorskip("sphinx")
    pytest.importorskip("numpydoc")
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q",
         "-b", builder, str(DOCS), str(out)],
        cwd=str(out.parent),
        capture_output=True,
        text=True,
        timeout=600,
    )


def built_pages(html: Path) -> list[Path]:
    """Every HTML page of a build (not the copied sources and assets)."""
    return sorted(p for p in html.rglob("*.html")
                  if not p.relative_to(html).parts[0].startswith("_"))
