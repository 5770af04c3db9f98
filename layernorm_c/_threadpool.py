"""layernorm_c's worker pool as a threadpoolctl library.

threadpoolctl finds thread pools by walking the shared libraries loaded in
the process and matching their file names; third-party libraries add a
:class:`threadpoolctl.LibController` subclass with
:func:`threadpoolctl.register`. Ours matches the extension module
(``_core.*``) that exports ``layernorm_c_get_num_threads`` and calls the
two exported C functions through ctypes, as threadpoolctl does for OpenBLAS.
Then ``threadpool_info()`` lists layernorm_c and ``threadpool_limits(1)``
sets (and afterwards restores) its thread count.

Nothing here imports threadpoolctl when layernorm_c is imported: the
controller is registered when threadpoolctl is already imported, when it
gets imported later (a one-shot import hook), or by
:func:`register_threadpoolctl`.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from . import _on_import

__all__ = ["register_threadpoolctl"]

_registered = False


def _controller_class(threadpoolctl: ModuleType) -> type:
    from . import __version__

    class LayerNormCController(threadpoolctl.LibController):  # type: ignore[misc, name-defined]
        """The kernel threads of layernorm_c (``set_num_threads``)."""

        user_api = "layernorm_c"
        internal_api = "layernorm_c"
        filename_prefixes = ("_core",)
        check_symbols = ("layernorm_c_get_num_threads",)

        def get_num_threads(self) -> int:
            return int(self.dynlib.layernorm_c_get_num_threads())

        def set_num_threads(self, num_threads: int) -> None:
            self.dynlib.layernorm_c_set_num_threads(int(num_threads))

        def get_version(self) -> str:
            return __version__

    return LayerNormCController


def register_threadpoolctl() -> bool:
    """Make threadpoolctl see and govern layernorm_c's kernel threads.

    Registers a controller with :func:`threadpoolctl.register` (once), so
    that ``threadpoolctl.threadpool_info()`` lists ``layernorm_c`` with its
    thread count and ``threadpoolctl.threadpool_limits(n)`` limits it like
    OpenBLAS or OpenMP. layernorm_c does this by itself whenever
    threadpoolctl is imported (before or after layernorm_c); calling it
    again does nothing.

    Returns
    -------
    bool
        True if the controller is registered, False if threadpoolctl is not
        installed or too old to take third-party controllers (3.5+ does).
    """
    global _registered
    if _registered:
        return True
    try:
        threadpoolctl = importlib.import_module("threadpoolctl")
    except ImportError:
        return False
    if not hasattr(threadpoolctl, "register") or not hasattr(threadpoolctl, "LibController"):
        return False
    _registered = True  # before register(): its rescan must not come back here
    threadpoolctl.register(_controller_class(threadpoolctl))
    return True


def _install() -> None:
    """At import of layernorm_c: register now, or when threadpoolctl comes."""
    _on_import.when_imported("threadpoolctl", register_threadpoolctl)
