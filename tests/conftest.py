"""Shared pytest configuration: hypothesis profiles and kernel-settings fixtures.

Hypothesis profiles (choose with the environment variable HYPOTHESIS_PROFILE):

* ``ci`` (default): derandomized, so every run tries the same examples and a
  failure is reproducible; no deadline (the machine may be shared).
* ``explore``: random examples and many more of them, for hunting bugs
  locally: ``HYPOTHESIS_PROFILE=explore python -m pytest tests``.
"""
import importlib.machinery
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings


def _unshadow_installed_package():
    """``python -m pytest`` puts the working directory first on sys.path. In
    a source tree without an in-place build (an unpacked sdist, a checkout
    installed with ``pip install .``) the ``layernorm_c/`` folder has no
    compiled _core and would shadow the installed package: take the tree
    off sys.path so that the tests import what is installed. A tree built
    in place (``pip install -e``, ``setup.py build_ext --inplace``) stays."""
    root = Path(__file__).resolve().parents[1]
    if any((root / "layernorm_c" / ("_core" + suffix)).exists()
           for suffix in importlib.machinery.EXTENSION_SUFFIXES):
        return
    sys.path[:] = [p for p in sys.path if Path(p or os.curdir).resolve() != root]


_unshadow_installed_package()

import layernorm_c as lnc  # noqa: E402  (after the sys.path fix above)

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=60,
                          print_blob=True)
settings.register_profile("explore", derandomize=False, deadline=None,
                          max_examples=1000, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def restore_settings():
    """Give the test a free hand with set_isa/set_num_threads and put both
    back afterwards, so no test leaks its settings into another."""
    isa, threads = lnc.get_isa(), lnc.get_num_threads()
    yield
    lnc.set_isa(isa)
    lnc.set_num_threads(threads)


@pytest.fixture
def jax_x64():
    """JAX with 64-bit types for the test, put back as it was afterwards:
    jax_enable_x64 is process-wide, and a test that left it on changed the
    dtypes every later JAX test saw. Skips without JAX."""
    jax = pytest.importorskip("jax")
    before = bool(jax.config.jax_enable_x64)
    jax.config.update("jax_enable_x64", True)
    yield jax
    jax.config.update("jax_enable_x64", before)


@pytest.fixture(params=lnc.supported_isas())
def isa(request, restore_settings):
    """Run the test once per instruction-set level this CPU supports."""
    lnc.set_isa(request.param)
    return request.param


def pytest_report_header(config):
    """Which layernorm_c and NumPy the tests run against."""
    import numpy as np

    return [f"layernorm_c {lnc.__version__} from {Path(lnc.__file__).parent}, "
            f"NumPy {np.__version__}, ISAs {', '.join(lnc.supported_isas())}"]
