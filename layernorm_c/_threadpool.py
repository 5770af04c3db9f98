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
import importlib.abc
import sys
from types import ModuleType
from typing import Any, Optional, Sequence

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


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Registers the controller once threadpoolctl has been imported."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[ModuleType] = None) -> Any:
        if fullname != "threadpoolctl":
            return None
        _remove_hook()
        spec = None
        for finder in list(sys.meta_path):  # the finders that would have found it
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_register(module: ModuleType) -> None:
            exec_module(module)
            register_threadpoolctl()

        loader.exec_module = exec_and_register
        return spec


_hook: Optional[_RegisterOnImport] = None


def _remove_hook() -> None:
    global _hook
    if _hook is not None:
        try:
            sys.meta_path.remove(_hook)
        except ValueError:
            pass
        _hook = None


def _install() -> None:
    """At import of layernorm_c: register now, or when threadpoolctl comes."""
    global _hook
    if "threadpoolctl" in sys.modules:
        register_threadpoolctl()
    elif _hook is None:
        _hook = _RegisterOnImport()
        sys.meta_path.insert(0, _hook)
