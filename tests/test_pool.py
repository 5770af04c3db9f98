"""C-level tests with no Python in them. The worker pool (csrc/ln_pool.c) on
its own: tests/c/pool_test.c checks
ln_parallel_for with a probe task (every item exactly once, begins and ends
paired and serialized, statuses combined, failed begins, nested and
concurrent calls, more threads asked than allowed), compiled here with the
C compiler Python was built with, once plainly and once under
ThreadSanitizer where the compiler supports it. And tests/c/table_test.c:
the import-time check that finds a missing kernel-table entry."""
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "tests" / "c" / "pool_test.c", ROOT / "csrc" / "ln_pool.c"]


def _compiler():
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) or shutil.which("cc")


def _build(tmp_path, extra, sources=SOURCES):
    cc = _compiler()
    if cc is None or not all(p.exists() for p in sources):
        pytest.skip("no C compiler, or the C sources are not here (an installed wheel)")
    exe = tmp_path / sources[0].stem
    cmd = [cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'csrc'}",
           *map(str, sources), "-pthread", "-o", str(exe), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return exe, proc


def _run(exe):
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("ok: 0 failure(s)"), proc.stdout


def test_pool_on_its_own(tmp_path):
    exe, proc = _build(tmp_path, [])
    assert proc.returncode == 0, proc.stderr
    _run(exe)


def test_pool_under_thread_sanitizer(tmp_path):
    exe, proc = _build(tmp_path, ["-fsanitize=thread", "-g"])
    if proc.returncode != 0:
        pytest.skip(f"this compiler cannot build with ThreadSanitizer: {proc.stderr[-200:]}")
    _run(exe)


def test_a_missing_kernel_table_entry_is_found(tmp_path):
    exe, proc = _build(tmp_path, [], [ROOT / "tests" / "c" / "table_test.c"])
    assert proc.returncode == 0, proc.stderr
    _run(exe)
