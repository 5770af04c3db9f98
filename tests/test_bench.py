"""The benchmark script runs and writes its tables and plot.

These tests run ``benchmarks/bench.py --quick`` in-process (imported from
its file path) into a temporary directory. They check what was produced,
never how fast anything was.
"""
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import layernorm_c as lnc
from cases import WORKED_EXAMPLES

BENCH_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py"
IMPLEMENTATIONS = ("copy", "layernorm_c", "layernorm_c out=", "NumPy", "torch")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("layernorm_c_bench", BENCH_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _torch_available():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _run_quick(bench, out_dir, *extra):
    threads_before = bench.lnc.get_num_threads()
    assert bench.main(["--quick", "--out-dir", str(out_dir), *extra]) == 0
    assert bench.lnc.get_num_threads() == threads_before, "thread setting not restored"
    return json.loads((out_dir / "results.json").read_text(encoding="utf-8"))


def _table_lines(md_text):
    """The rows of the main markdown table (shape cells start with '(')."""
    return [line for line in md_text.splitlines() if line.startswith("| (")]


def _check_outputs(bench, out_dir, data):
    md = (out_dir / "results.md").read_text(encoding="utf-8")
    rst = (out_dir / "bench_table.inc").read_text(encoding="utf-8")
    png = (out_dir / "bench.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000

    header = "| " + " | ".join(bench.TABLE_HEADER) + " |"
    assert header in md
    for text in (md, rst):
        for label in IMPLEMENTATIONS:
            assert label in text
        for shape in bench.QUICK_SHAPES:
            assert bench.fmt_shape(shape) in text
        for dtype in bench.DTYPES:
            assert dtype in text
        assert "Small-call latency" in text and "Peak extra memory" in text
        assert bench.lnc.get_isa() in text

    threads = bench.parse_threads("1,all")
    expected = len(bench.QUICK_SHAPES) * len(bench.DTYPES) * len(threads)
    assert len(data["cases"]) == expected
    assert len(_table_lines(md)) == expected
    assert rst.count("   * - (") == expected
    for case in data["cases"]:
        for name in ("copy", "lnc", "lnc_out", "numpy"):
            assert case["seconds"][name] > 0, (case, name)
    assert data["latency"]["us"]["lnc"] > 0
    assert data["memory"]["rows"]["lnc"]["traced"] is not None
    return md


def _rst_is_valid(text):
    docutils_core = pytest.importorskip("docutils.core")
    # halt_level 2: any docutils warning (a malformed table) raises.
    docutils_core.publish_doctree(text, settings_overrides={"halt_level": 2,
                                                            "report_level": 2})


def test_quick_run_writes_tables_and_plot(bench, tmp_path):
    data = _run_quick(bench, tmp_path)
    md = _check_outputs(bench, tmp_path, data)
    _rst_is_valid((tmp_path / "bench_table.inc").read_text(encoding="utf-8"))
    torch_times = [c["seconds"]["torch"] for c in data["cases"]]
    if _torch_available():
        assert data["machine"]["torch"] != "not installed"
        # float32 always has a CPU kernel; float16 may be n/a, with a reason.
        assert all(c["seconds"]["torch"] for c in data["cases"] if c["dtype"] == "float32")
        for c in data["cases"]:
            assert c["seconds"]["torch"] or c["notes"].get("torch")
    else:
        assert torch_times == [None] * len(torch_times)
        assert "torch not installed" in md


def test_quick_run_without_torch_reports_na(bench, tmp_path):
    data = _run_quick(bench, tmp_path, "--no-torch")
    md = _check_outputs(bench, tmp_path, data)
    assert data["machine"]["torch"] == "not installed"
    assert all(c["seconds"]["torch"] is None for c in data["cases"])
    torch_column = bench.TABLE_HEADER.index("torch")
    for line in _table_lines(md):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[torch_column] == "n/a"
        assert cells[bench.TABLE_HEADER.index("× torch")] == "n/a"
    assert data["latency"]["us"]["torch"] is None
    assert data["memory"]["rows"]["torch"] == {"traced": None, "rss": None}


def test_numpy_reference_formula(bench):
    x = np.array([example.row for example in WORKED_EXAMPLES])
    y = bench.numpy_layer_norm(x, np.ones(4), np.zeros(4), eps=0.0)
    np.testing.assert_allclose(y, lnc.reference_layer_norm(x, eps=0.0).y, rtol=1e-15, atol=0)
    for got, example in zip(y, WORKED_EXAMPLES):
        np.testing.assert_allclose(got, example.y, rtol=0, atol=0.5 * 10.0 ** -example.decimals)
    assert bench.numpy_layer_norm(x.astype(np.float32), np.ones(4, np.float32),
                                  np.zeros(4, np.float32)).dtype == np.float32


def test_benchmark_refuses_an_implementation_that_disagrees(bench):
    x, w, b = bench.make_inputs((8, 32), "float32")
    good = bench.lnc.layer_norm(x, w, b, bench.EPS)
    bench.check_agreement("layernorm_c", good, x, w, b, "float32")
    with pytest.raises(RuntimeError, match="disagrees"):
        bench.check_agreement("wrong", good + 1e-2, x, w, b, "float32")


def test_timing_helpers_count_calls(bench):
    calls = []
    loops = bench.calibrate(lambda: calls.append(1), min_time=1e-4)
    assert loops >= 1 and len(calls) >= loops
    medians = bench.measure({"a": lambda: None, "b": lambda: None}, repeats=3, min_time=1e-5)
    assert set(medians) == {"a", "b"} and all(t >= 0 for t in medians.values())


def test_command_line_parsers(bench):
    assert bench.parse_shapes("64x768,1000000x16") == [(64, 768), (1_000_000, 16)]
    assert bench.parse_threads("1,1,2") == [1, 2]
    assert bench.parse_threads("all") == [bench.usable_cpus()]
    cfg = bench.make_config(bench.parse_args(["--quick", "--dtypes", "float16"]))
    assert cfg.dtypes == ["float16"] and cfg.shapes == bench.QUICK_SHAPES and cfg.quick
    assert cfg.mode == "custom"
    assert bench.make_config(bench.parse_args(["--quick"])).mode == "quick"
    assert bench.make_config(bench.parse_args([])).mode == "full"


def test_quick_mode_never_writes_into_the_repository(bench):
    paths = bench.output_paths(bench.parse_args(["--quick"]))
    for path in paths.values():
        assert bench.REPO not in path.resolve().parents
    shutil.rmtree(paths["md"].parent)  # the fresh, empty temp dir
    full = bench.output_paths(bench.parse_args([]))
    assert full["rst"] == bench.REPO / "docs" / "bench_table.inc"
    assert full["png"] == bench.REPO / "docs" / "_static" / "bench.png"
