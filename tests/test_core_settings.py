"""The kernel settings: instruction-set level and thread count, from the
environment at import time and from the setter functions."""
import os
import platform
import sys
from pathlib import Path

import numpy as np
import pytest

import layernorm_c as lnc
from subprocess_support import PACKAGE_DIR, run_python


def _import_and_report(env_vars):
    """Import layernorm_c in a fresh interpreter with env_vars set; return
    (isa, threads, stderr)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LAYERNORM_C_ISA", "LAYERNORM_C_NUM_THREADS")}
    env.update(env_vars)
    code = ("import warnings; warnings.simplefilter('always');"
            "import layernorm_c as lnc; print(lnc.get_isa(), lnc.get_num_threads());"
            "print(lnc.__file__)")
    proc = run_python(["-c", code], env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (isa, threads), where = proc.stdout.splitlines()[0].split(), proc.stdout.splitlines()[1]
    assert os.path.samefile(where, PACKAGE_DIR / "__init__.py"), (where, PACKAGE_DIR)
    return isa, int(threads), proc.stderr


_WHERE = "import layernorm_c._core as c, layernorm_c as l; print(l.__file__); print(c.__file__)"


@pytest.mark.parametrize("cwd", ["temporary", "repository root"])
def test_a_child_interpreter_imports_the_package_under_test(cwd):
    """The subprocess tests' children import this process's layernorm_c,
    also when started in the source tree (which, without an in-place build,
    would shadow the installed package if it came first on sys.path)."""
    if cwd == "repository root" and sys.version_info < (3, 11):
        pytest.skip("needs python -P (3.11+); the subprocess tests run in a temporary folder")
    root = Path(__file__).resolve().parents[1]
    proc = run_python(["-c", _WHERE], cwd=root if cwd == "repository root" else None,
                      timeout=120)
    assert proc.returncode == 0, proc.stderr
    package, core = proc.stdout.splitlines()
    assert os.path.samefile(package, PACKAGE_DIR / "__init__.py"), (package, PACKAGE_DIR)
    assert os.path.samefile(core, lnc._core.__file__), (core, lnc._core.__file__)


@pytest.mark.parametrize("isa", lnc.supported_isas())
def test_environment_forces_each_supported_isa(isa):
    got, _, stderr = _import_and_report({"LAYERNORM_C_ISA": isa})
    assert got == isa
    assert "Warning" not in stderr


def test_default_isa_is_the_widest_supported():
    got, _, _ = _import_and_report({})
    assert got == lnc.supported_isas()[-1]


def test_unknown_isa_in_environment_warns_and_keeps_the_default():
    got, _, stderr = _import_and_report({"LAYERNORM_C_ISA": "sse9"})
    assert got == lnc.supported_isas()[-1]
    assert "LAYERNORM_C_ISA ignored" in stderr and "sse9" in stderr


def test_environment_sets_the_thread_count():
    _, threads, _ = _import_and_report({"LAYERNORM_C_NUM_THREADS": "3"})
    assert threads == 3


@pytest.mark.parametrize("bad", ["zero", "0", "-2"])
def test_bad_thread_count_in_environment_warns(bad):
    _, threads, stderr = _import_and_report({"LAYERNORM_C_NUM_THREADS": bad})
    assert threads >= 1
    assert "LAYERNORM_C_NUM_THREADS ignored" in stderr


def test_supported_isas_start_with_scalar_and_name_known_levels():
    isas = lnc.supported_isas()
    assert isas[0] == "scalar"
    assert set(isas) <= {"scalar", "portable", "avx2", "avx512"}
    if platform.machine().lower() in ("x86_64", "amd64"):
        # x86: the portable level is built for AVX2's features, so it comes
        # with it; without AVX2 + FMA only the reference runs.
        assert ("portable" in isas) == ("avx2" in isas)
    else:
        # elsewhere the portable level is the default
        assert isas == ("scalar", "portable") and lnc.get_isa() == "portable"


def test_setters_round_trip(restore_settings):
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        assert lnc.get_isa() == isa
    lnc.set_num_threads(5)
    assert lnc.get_num_threads() == 5


def test_thread_threshold_keeps_small_calls_single_threaded():
    # A (1, 768) float32 call is far below the size at which threads start.
    assert lnc.thread_threshold() > np.zeros((1, 768), np.float32).nbytes


#: Run by a fresh interpreter: fork() is called where no other library's
#: threads run (the test process may have imported JAX, whose threads make
#: fork() warn, rightly, of a possible deadlock). Only layernorm_c's own pool
#: is running when it forks, which is what the test is about.
_FORK_CHILD = """
import os, sys
import numpy as np
import layernorm_c as lnc
lnc.set_num_threads(2)
rng = np.random.default_rng(7)
x = rng.standard_normal((2048, 1024)).astype(np.float32)
assert x.nbytes >= lnc.thread_threshold()
want = lnc.layer_norm(x)            # the parent's pool is now running
pid = os.fork()
if pid == 0:                        # the forked child
    ok = False
    try:
        ok = lnc.layer_norm(x).tobytes() == want.tobytes()
    finally:
        os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
code = os.waitstatus_to_exitcode(status)
print("forked child exit code", code)
print("modules", sorted(m for m in ("jax", "torch") if m in sys.modules))
sys.exit(code)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_worker_threads_work_in_a_forked_child():
    """The thread pool does not survive fork(); the child must start its
    own and give the same bits (multiprocessing's default on Linux)."""
    done = run_python(["-W", "error", "-c", _FORK_CHILD])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "forked child exit code 0" in done.stdout
    assert "modules []" in done.stdout, done.stdout  # no other library's threads


def test_concurrent_large_calls_share_the_pool_correctly(restore_settings):
    """Python threads calling at once with inputs above the threading
    threshold: one call gets the worker pool, the others run on their own
    thread. Every result must be the one computed alone."""
    import concurrent.futures

    lnc.set_num_threads(3)
    rng = np.random.default_rng(11)
    inputs = [rng.standard_normal((1024 + 64 * i, 768)).astype(np.float32) * (i + 1)
              for i in range(6)]
    assert all(x.nbytes >= lnc.thread_threshold() for x in inputs)
    want = [lnc.layer_norm(x).tobytes() for x in inputs]
    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as ex:
        for _ in range(3):
            got = list(ex.map(lambda x: lnc.layer_norm(x).tobytes(), inputs))
            assert got == want


def test_core_exports_only_its_entry_points():
    """The C core's own functions and tables stay private to the module
    (setup.py's -fvisibility=hidden): the shared library exports the module
    init and the two threadpoolctl functions, not names like ln_batch_run
    that another library in the process could share."""
    import ctypes

    from layernorm_c import _core

    lib = ctypes.CDLL(_core.__file__)
    for name in ("layernorm_c_get_num_threads", "layernorm_c_set_num_threads"):
        assert hasattr(lib, name), name
    for name in ("ln_batch_run", "ln_kernels_for", "ln_acc_merge", "ln_parallel_for",
                 "ln_kernels_avx2", "ln_cache_take"):
        assert not hasattr(lib, name), f"_core exports {name}"
