"""Shared pytest configuration: hypothesis profiles and kernel-settings fixtures.

Hypothesis profiles (choose with the environment variable HYPOTHESIS_PROFILE):

* ``ci`` (default): derandomized, so every run tries the same examples and a
  failure is reproducible; no deadline (the machine may be shared).
* ``explore``: random examples and many more of them, for hunting bugs
  locally: ``HYPOTHESIS_PROFILE=explore python -m pytest tests``.
"""
import os

import pytest
from hypothesis import settings

import layernorm_c as lnc

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


@pytest.fixture(params=lnc.supported_isas())
def isa(request, restore_settings):
    """Run the test once per instruction-set level this CPU supports."""
    lnc.set_isa(request.param)
    return request.param
