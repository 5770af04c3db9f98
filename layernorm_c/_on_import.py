"""Run a function once an optional module has been imported, without
importing it: now if it already is, else from a one-shot import hook.

layernorm_c's optional integrations (threadpoolctl's controller, the
bfloat16 loops of ml_dtypes) must cost nothing at ``import layernorm_c``
when the user does not use them: ml_dtypes alone took 1.2 s to import here
(NumPy 2.4, ml_dtypes 0.7), and JAX installs it.
"""
from __future__ import annotations

import sys
import warnings
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Sequence

__all__ = ["when_imported"]

_waiting: Dict[str, Callable[[], Any]] = {}


class _Hook:
    """A meta path finder that finds nothing itself: it asks the finders
    after it for a waited-for module and runs the function once the
    module's code has run."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[ModuleType] = None) -> Any:
        call = _waiting.pop(fullname, None)
        if call is None:
            return None
        if not _waiting:
            _remove_hook()
        spec = None
        for finder in list(sys.meta_path):  # the finders that would have found it
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_call(module: ModuleType) -> None:
            exec_module(module)
            try:
                call()
            except Exception as exc:  # the user's import must not fail for it
                warnings.warn(f"layernorm_c: setting up for {fullname} failed: {exc!r}",
                              RuntimeWarning, stacklevel=2)

        spec.loader.exec_module = exec_and_call
        return spec


_hook: Optional[_Hook] = None


def _remove_hook() -> None:
    global _hook
    if _hook is not None:
        try:
            sys.meta_path.remove(_hook)
        except ValueError:
            pass
        _hook = None


def when_imported(name: str, call: Callable[[], Any]) -> None:
    """``call()`` now if module ``name`` is imported, else right after its
    first import (once; a second function for the same name replaces the
    first)."""
    global _hook
    if name in sys.modules:
        call()
        return
    _waiting[name] = call
    if _hook is None:
        _hook = _Hook()
        sys.meta_path.insert(0, _hook)
