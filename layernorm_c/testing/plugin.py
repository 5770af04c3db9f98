"""pytest plugin: validate a LayerNorm implementation from your tests.

Installed with layernorm_c (entry point ``pytest11``); without the entry
point, enable it with ``-p layernorm_c.testing.plugin`` or
``pytest_plugins = ["layernorm_c.testing.plugin"]`` in a conftest.py.

Two fixtures:

``layer_norm_audit``
    A function: ``layer_norm_audit(fn, **options)`` runs every check on
    ``fn`` and fails the test with the full diagnosis if any fails; it
    returns the :class:`~layernorm_c.testing.AuditReport` otherwise.

``layer_norm_check``
    One test item per check. A test that requests it is parametrized over
    :data:`~layernorm_c.testing.CHECKS` (ids ``test_mine[eps]``,
    ``test_mine[coupling]``, ...); ``layer_norm_check(fn, **options)`` runs
    that one check and fails, skips or warns accordingly. The marker
    ``@pytest.mark.layer_norm_checks(*names, exclude=())`` narrows the set.

``options`` are those of :class:`~layernorm_c.testing.LayerNormAudit`
(``signature``, ``framework``, ``dtype``, ``eps``, ``d``, ``leading_shape``,
...).

For an RMSNorm, ``rms_norm_audit`` and ``rms_norm_check`` (one item per
:data:`~layernorm_c.testing.RMS_CHECKS`, narrowed by
``@pytest.mark.rms_norm_checks(*names, exclude=())``) with the options of
:class:`~layernorm_c.testing.RMSNormAudit` (``convention=`` among them), and
``rms_norm_backward_audit`` and ``rms_norm_backward_check``
(``@pytest.mark.rms_norm_backward_checks``).

For a backward pass, the same two as ``layer_norm_backward_audit`` and
``layer_norm_backward_check`` (one item per
:data:`~layernorm_c.testing.BACKWARD_CHECKS`, narrowed by
``@pytest.mark.layer_norm_backward_checks(*names, exclude=())``), with the
options of :class:`~layernorm_c.testing.LayerNormBackwardAudit`.

The hooks and fixtures are defined in the top-level module
``pytest_layernorm_c``, which is what the entry point loads: it imports
neither NumPy nor layernorm_c until a fixture is used, so the plugin costs
nothing in the test suites of an environment that do not use it (importing
this module, inside the package, imports both).
"""
# pytest_layernorm_c is a top-level module, which a py.typed marker cannot
# cover (PEP 561); it is annotated and checked with the package's tests.
from pytest_layernorm_c import (  # type: ignore[import-untyped, unused-ignore]
    BACKWARD_FIXTURE,
    BACKWARD_MARKER,
    FIXTURE,
    MARKER,
    RMS_BACKWARD_FIXTURE,
    RMS_BACKWARD_MARKER,
    RMS_FIXTURE,
    RMS_MARKER,
    layer_norm_audit,
    layer_norm_backward_audit,
    layer_norm_backward_check,
    layer_norm_check,
    pytest_configure,
    pytest_generate_tests,
    rms_norm_audit,
    rms_norm_backward_audit,
    rms_norm_backward_check,
    rms_norm_check,
)

__all__ = ["FIXTURE", "MARKER", "BACKWARD_FIXTURE", "BACKWARD_MARKER", "RMS_FIXTURE",
           "RMS_MARKER", "RMS_BACKWARD_FIXTURE", "RMS_BACKWARD_MARKER", "layer_norm_audit",
           "layer_norm_check", "layer_norm_backward_audit", "layer_norm_backward_check",
           "rms_norm_audit", "rms_norm_check", "rms_norm_backward_audit",
           "rms_norm_backward_check", "pytest_configure", "pytest_generate_tests"]
