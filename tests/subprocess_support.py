"""Start a fresh Python interpreter that imports the layernorm_c this test
process imported (the installed package, an editable install, or an
in-place build such as tools/sanitize.sh's).

Imported as plain ``import subprocess_support`` (pytest's pythonpath
includes tests/).

Two things could make a child import another layernorm_c than its parent:

* ``python -c`` and ``python -m`` put the working directory first on
  ``sys.path``. A source tree without an in-place build (an unpacked sdist,
  a checkout installed with ``pip install .``) has a ``layernorm_c/``
  folder without the compiled ``_core``, which would shadow the installed
  package. The child runs in a temporary directory, and with ``-P`` (no
  such path entry at all) on Python >= 3.11.
* The parent may have found layernorm_c through a path the child does not
  inherit. The child's ``PYTHONPATH`` starts with the folder holding the
  parent's layernorm_c, unless that folder is a site directory (which the
  child has anyway, after the standard library).
"""
from __future__ import annotations

import os
import site
import subprocess
import sys
import tempfile
from pathlib import Path

import layernorm_c

#: The package directory this process imported.
PACKAGE_DIR = Path(layernorm_c.__file__).resolve().parent

#: The interpreter, with -P where it exists (Python >= 3.11).
PYTHON = [sys.executable] + (["-P"] if sys.version_info >= (3, 11) else [])


def _site_dirs() -> set:
    dirs = list(getattr(site, "getsitepackages", lambda: [])())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return {Path(d).resolve() for d in dirs}


def child_env(env: dict | None = None) -> dict:
    """``env`` (default: this process's environment) with PYTHONPATH leading
    to the parent's layernorm_c when a site directory does not."""
    env = dict(os.environ if env is None else env)
    where = PACKAGE_DIR.parent
    if where not in _site_dirs():
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([str(where)] + rest)
    return env


def run_python(args, *, env: dict | None = None, cwd=None, safe_path: bool = True,
               **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` of this interpreter with ``args`` (e.g. ``["-c",
    code]`` or ``["-m", "layernorm_c", ...]``), text output captured.

    It runs in a fresh temporary directory unless ``cwd`` is given, with
    ``-P`` unless ``safe_path`` is false, and the environment of
    :func:`child_env`.
    """
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    command = (PYTHON if safe_path else [sys.executable]) + [str(a) for a in args]
    if cwd is not None:
        return subprocess.run(command, cwd=str(cwd), env=child_env(env), **kwargs)
    with tempfile.TemporaryDirectory(prefix="layernorm_c_child_") as tmp:
        return subprocess.run(command, cwd=tmp, env=child_env(env), **kwargs)
