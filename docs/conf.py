"""Sphinx configuration for the layernorm_c documentation.

Build from the repository root, warnings as errors:

    python -m sphinx -W -b html docs docs/_build/html

The API pages are generated from the package's numpydoc docstrings, so
layernorm_c must be importable with its compiled C core: either installed
(``pip install -e .`` or a regular install) or built in place (``python
setup.py build_ext --inplace``). The examples in these pages are checked with
``python -m sphinx -b doctest docs docs/_build/doctest``.

The site uses the PyData theme and MathJax from the sphinx-mathjax-offline
package (both in the ``test`` extra): it needs no network access to build or
to read. tests/test_docs_browser.py opens every page in headless Chromium to
check that nothing is cut off and that the math is typeset.
"""
import importlib.machinery
import importlib.util
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def _is_root(entry: str) -> bool:
    return os.path.abspath(entry or os.curdir) == ROOT


def _import_layernorm_c():
    """Import the installed layernorm_c, never a source folder shadowing it.

    ``python -m sphinx`` run from the repository root puts the root first on
    sys.path, and there the source folder ``layernorm_c/`` (no compiled
    ``_core`` after a regular, non-editable install) would shadow the
    installed package. So look for layernorm_c with the root left out; only
    when nothing else provides it, use the source tree (built in place with
    ``python setup.py build_ext --inplace``).
    """
    kept = [p for p in sys.path if not _is_root(p)]
    saved, sys.path[:] = sys.path[:], kept
    if importlib.util.find_spec("layernorm_c") is None:
        sys.path[:] = [ROOT] + kept
    try:
        import layernorm_c
    except ImportError as exc:
        sys.path[:] = saved
        raise ImportError(
            "the docs need layernorm_c with its compiled C core: "
            "pip install -e . (or python setup.py build_ext --inplace)") from exc
    return layernorm_c


layernorm_c = _import_layernorm_c()

# -- Project information -----------------------------------------------------
project = "layernorm_c"
author = "the layernorm_c developers"
copyright = "the layernorm_c developers"
version = layernorm_c.__version__
release = layernorm_c.__version__

# -- General configuration ---------------------------------------------------
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    # MathJax 3 shipped inside this PyPI package and copied into the build
    # (_static/mathjax/): formulas render with no network access, also from
    # a local build opened as a file. It sets mathjax_path itself.
    "sphinx-mathjax-offline",
    "sphinx.ext.doctest",
    "numpydoc",
]

# Plain reStructuredText only: no Markdown parser dependency. Markdown files
# in this folder (e.g. reports written by scripts) are not part of the site.
source_suffix = {".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
templates_path = []

nitpicky = False
default_role = "py:obj"

# autodoc: show signatures as written, members in source order.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"

# numpydoc: the class pages list their members explicitly.
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = False

# sphinx.ext.doctest: every page's examples run with these names available.
doctest_global_setup = """
import numpy as np
import layernorm_c as lnc
"""

# -- HTML output -------------------------------------------------------------
# The PyData theme, as NumPy and SciPy use: the text column follows the window
# (up to a comfortable line length), code blocks wider than it scroll inside
# their box, tables scroll inside a wrapper, and phones get a drawer menu.
html_theme = "pydata_sphinx_theme"
html_title = f"layernorm_c {release}"
html_static_path = ["_static"]
html_css_files = ["layernorm_c.css"]  # a few layout additions, see the file
# All pages are at the top level and listed in the header; the theme's left
# sidebar shows the pages *below* the current one, so it would stay empty:
# leave it out and give its room to the text column.
html_sidebars = {"**": []}
html_theme_options = {
    # The page titles are long: two of them in the header, the rest under
    # "More", keeps the header on one line down to the theme's 960px
    # breakpoint (below it the header becomes a drawer).
    "header_links_before_dropdown": 2,
    "navbar_align": "left",
    "navbar_persistent": ["search-button"],
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc", "sourcelink"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version", "theme-version"],
}
