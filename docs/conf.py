"""Sphinx configuration for the layernorm_c documentation.

Build from the repository root, warnings as errors:

    python -m sphinx -W -b html docs docs/_build/html

The API pages are generated from the package's numpydoc docstrings, so
layernorm_c must be importable with its compiled C core: either installed
(``pip install -e .``) or built in place (``python setup.py build_ext
--inplace``). The examples in these pages are checked with
``python -m sphinx -b doctest docs docs/_build/doctest``.
"""
import importlib.machinery
import importlib.util
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

# `python -m sphinx` puts the working directory first on sys.path: from the
# repository root, a source tree without an in-place build (no compiled
# _core) would shadow the installed package, so take the tree off sys.path.
if not any(os.path.exists(os.path.join(ROOT, "layernorm_c", "_core" + suffix))
           for suffix in importlib.machinery.EXTENSION_SUFFIXES):
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != ROOT]

# Prefer an installed layernorm_c; fall back to the source tree (which has
# the compiled _core after `setup.py build_ext --inplace` or `pip install -e`).
if importlib.util.find_spec("layernorm_c") is None:
    sys.path.insert(0, ROOT)

import layernorm_c  # noqa: E402  (fail early and clearly if not built)

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
