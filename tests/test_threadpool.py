"""threadpoolctl sees and governs the kernel threads; importing layernorm_c
imports none of the optional engines."""
import json

import pytest

from subprocess_support import run_python


def _child(code):
    proc = run_python(["-c", code])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_imports_no_optional_engine():
    out = _child("import sys, json, layernorm_c\n"
                 "print(json.dumps([m for m in ('dask', 'dask.array', 'distributed', 'xarray',"
                 " 'zarr', 'threadpoolctl', 'ml_dtypes', 'jax', 'torch') if m in sys.modules]))")
    assert out == []


@pytest.mark.parametrize("first", ["layernorm_c", "threadpoolctl"])
def test_threadpool_info_and_limits(first):
    pytest.importorskip("threadpoolctl")
    second = "threadpoolctl" if first == "layernorm_c" else "layernorm_c"
    out = _child(f"""if 1:
        import json
        import {first}, {second}
        import layernorm_c as lnc, threadpoolctl as tp
        lnc.set_num_threads(3)
        info = [i for i in tp.threadpool_info() if i['user_api'] == 'layernorm_c']
        with tp.threadpool_limits(1):
            limited = lnc.get_num_threads()
        after = lnc.get_num_threads()
        with tp.threadpool_limits(limits=2, user_api='layernorm_c'):
            by_api = lnc.get_num_threads()
        print(json.dumps([info, limited, after, by_api, lnc.register_threadpoolctl()]))
    """)
    info, limited, after, by_api, registered = out
    assert len(info) == 1 and info[0]["num_threads"] == 3 and info[0]["version"]
    assert "_core" in info[0]["filepath"]
    assert (limited, after, by_api, registered) == (1, 3, 2, True)


def test_without_threadpoolctl_registration_says_so():
    out = _child("""if 1:
        import sys, json
        sys.modules['threadpoolctl'] = None  # as if not installed
        import layernorm_c as lnc
        print(json.dumps(lnc.register_threadpoolctl()))
    """)
    assert out is False
