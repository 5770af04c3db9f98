"""Sphinx configuration for the layernorm_c documentation.

Build from the repository root, warnings as errors:

    python -m sphinx -W -b html docs docs/_build/html

The API pages are generated from the package's numpydoc docstrings, so
layernorm_c must be importable with its compiled C core: either installed
(``pip install -e .`` or a regular install) or built in place (``python
setup.py build_ext --inplace``). The examples in these pages are checked with
``python -m sphinx -b doctest docs docs/_build/doctest``.
"""
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
html_theme = "alabaster"
html_static_path = []
html_title = f"layernorm_c {release}"
html_theme_options = {
    "description": "LayerNorm over NumPy arrays, with a C core",
    "fixed_sidebar": True,
}
