"""The benchmark script runs, checks what it times and writes its tables.

These tests run ``benchmarks/bench.py --quick`` in-process (imported from
its file path) into a temporary directory. They check what was produced,
that missing peers are skipped with a reason and that a wrong result is
never timed; never how fast anything was.
"""
import importlib.util
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import layernorm_c as lnc
from cases import WORKED_EXAMPLES

BENCH_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py"
PEER_MODULES = ("torch", "onnxruntime", "onnx", "openvino", "jax")


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


def _installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _run_quick(bench, out_dir, *extra):
    threads_before = bench.lnc.get_num_threads()
    affinity_before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    assert bench.main(["--quick", "--out-dir", str(out_dir), *extra]) == 0
    assert bench.lnc.get_num_threads() == threads_before, "thread setting not restored"
    if affinity_before is not None:
        assert os.sched_getaffinity(0) == affinity_before, "CPU affinity not restored"
    return json.loads((out_dir / "results.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def quick(bench, tmp_path_factory):
    """One --quick run with every op, dtype and peer: (out_dir, results)."""
    out = tmp_path_factory.mktemp("bench-quick")
    return out, _run_quick(bench, out)


def _table_lines(md_text):
    """The rows of the markdown tables (shape cells start with '(')."""
    return [line for line in md_text.splitlines() if line.startswith("| (")]


def _rst_is_valid(text):
    docutils_core = pytest.importorskip("docutils.core")
    # halt_level 2: any docutils warning (a malformed table) raises.
    docutils_core.publish_doctree(text, settings_overrides={"halt_level": 2,
                                                            "report_level": 2})


def _dtypes_run(bench):
    return [d for d in bench.DTYPES if d != "bfloat16" or _installed("ml_dtypes")]


def test_quick_run_writes_every_table_and_the_plot(bench, quick):
    out, data = quick
    md = (out / "results.md").read_text(encoding="utf-8")
    png = (out / "bench.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
    rst = {op: (out / ("bench_table.inc" if op == "layer_norm" else f"bench_{op}.inc"))
           .read_text(encoding="utf-8") for op in bench.OPS}
    for op, text in rst.items():
        _rst_is_valid(text)
        assert op in text and "not measured" not in text
    assert "Small-call latency" in rst["layer_norm"] and "Peak extra memory" in rst["layer_norm"]
    assert bench.lnc.get_isa() in rst["layer_norm"] and "quick run" in md

    dtypes, threads = _dtypes_run(bench), bench.parse_threads("1,all")
    per_op = len(bench.QUICK_SHAPES) * len(dtypes) * len(threads)
    assert len(data["cases"]) == per_op * len(bench.OPS)
    # Each case: one row in its op's ratio table and one in its medians
    # table; then the rows of the exact sums' table (in bench_table.inc too).
    # And the output cache's.
    extra_rows = len(data["sums_cost"]["rows"]) + len(data["output_cache"]["rows"])
    assert len(_table_lines(md)) == 2 * len(data["cases"]) + extra_rows
    for op, text in rst.items():
        assert text.count("   * - (") == per_op + (extra_rows if op == "layer_norm" else 0)
        for shape in bench.QUICK_SHAPES:
            assert bench.fmt_shape(shape) in text
        for dtype in dtypes:
            assert dtype in text
    for case in data["cases"]:
        op = bench.OPS[case["op"]]
        own = ["floor", "floor_alloc", "lnc"] + ([] if op.backward else ["lnc_out"])
        for key in own:
            assert case["seconds"][key] > 0, (case, key)
        for key in bench.PEERS:
            if key in op.peers:
                # A peer is timed, or the table says why not.
                assert case["seconds"][key] or case["notes"].get(key), (case, key)
            else:
                assert key not in case["seconds"]
        for key, worst in case["errors"].items():
            if case["seconds"].get(key):
                assert worst <= 1, (case, key)
    assert data["latency"]["us"]["lnc"] > 0 and data["latency"]["us"]["lnc_ufunc"] > 0
    assert data["memory"]["rows"]["lnc"]["traced"] is not None
    _check_sums_cost(bench, data["sums_cost"], md, rst["layer_norm"])
    _check_output_cache(bench, data["output_cache"], md, rst["layer_norm"], threads)


def _check_output_cache(bench, cache, md, rst, threads):
    """The output cache's table of a --quick run: a row per shape and thread
    count in results.md, bench_table.inc and results.json, each call timed
    with the cache on and off, and the setting put back afterwards."""
    title = ("Output cache: allocating layer_norm (float32) with freed outputs reused and "
             "with fresh pages")
    assert f"## {title}" in md and f".. list-table:: {title}" in rst
    assert [(r["shape"], r["threads"]) for r in cache["rows"]] == [
        (list(shape), n) for shape in bench.QUICK_CACHE_SHAPES for n in threads]
    for row in cache["rows"]:
        assert md.count(f"| {bench.fmt_shape(row['shape'])} | {row['threads']} | ") == 1, row
        for state in ("on", "off"):
            assert all(row["seconds"][state][k] > 0 for k in ("copy", "out", "alloc")), row
            assert math.isfinite(row["ratios"][f"{state}/copy"]), row
    assert bench.lnc.get_output_cache().limit > 0  # the session's setting is back


def _check_sums_cost(bench, sums_cost, md, rst):
    """The exact sums' table of a --quick run: every row in results.md, in
    bench_table.inc and in results.json, with positive times and finite
    ratios; the plain baseline timed for LayerNorm, or the table says why
    not (RMSNorm's)."""
    title = "Exact parameter-gradient sums: cost against plain float64 sums (float32, 1 thread)"
    assert f"## {title}" in md and f".. list-table:: {title}" in rst
    assert "| shape | op | dx only | plain sums | exact sums | exact/plain | exact/dx only |" in md
    expected = [(op, list(shape)) for op, shapes in
                (("layer_norm_backward", bench.QUICK_SUMS_COST_SHAPES),
                 ("rms_norm_backward", bench.QUICK_SUMS_COST_RMS_SHAPES)) for shape in shapes]
    assert [(r["op"], r["shape"]) for r in sums_cost["rows"]] == expected
    for row in sums_cost["rows"]:
        cells = f"| {bench.fmt_shape(row['shape'])} | {row['op']} | "
        assert cells in md and md.count(cells) == 1, row
        seconds, ratios = row["seconds"], row["ratios"]
        assert seconds["dx"] > 0 and seconds["exact"] > 0, row
        assert math.isfinite(ratios["exact/dx"]) and ratios["exact/dx"] > 0, row
        if row["op"] == "layer_norm_backward" or seconds["plain"] is not None:
            assert seconds["plain"] > 0 and math.isfinite(ratios["exact/plain"]), row
        else:
            assert ratios["exact/plain"] is None
            assert any(n.startswith(f"{row['op']} {bench.fmt_shape(row['shape'])}: plain sums "
                                    f"not timed") for n in sums_cost["notes"]), row
    # (64, 64): records the plain baseline takes one at a time; the note says so.
    assert any("(64, 64)" in n and "exact/dx only" in n for n in sums_cost["notes"])


@pytest.mark.parametrize("peer", ["torch", "onnxruntime", "openvino", "jax"])
def test_an_installed_peer_is_timed_in_float32(bench, quick, peer):
    if not _installed(peer) or (peer == "onnxruntime" and not _installed("onnx")):
        pytest.skip(f"{peer} not installed")
    _, data = quick
    assert data["machine"]["versions"][peer][0].isdigit()
    for case in data["cases"]:
        if case["dtype"] == "float32" and case["op"] == "layer_norm":
            assert case["seconds"][peer] > 0, case["notes"].get(peer)


def test_missing_peers_are_skipped_with_a_reason(bench, tmp_path, monkeypatch):
    for name in PEER_MODULES:  # an import of a None entry raises ImportError
        monkeypatch.setitem(sys.modules, name, None)
    data = _run_quick(bench, tmp_path, "--ops", "layer_norm,rms_norm_backward",
                      "--dtypes", "float32")
    md = (tmp_path / "results.md").read_text(encoding="utf-8")
    for peer in ("torch", "onnxruntime", "openvino", "jax"):
        assert "not installed" in data["machine"]["versions"][peer]
    for case in data["cases"]:
        assert case["seconds"]["numpy"] > 0
        for peer in bench.OPS[case["op"]].peers:
            if peer != "numpy":
                assert case["seconds"][peer] is None
                assert "not installed" in case["notes"][peer]
    assert "torch n/a (all cases): torch not installed" in md
    assert "onnxruntime n/a (all cases): onnx not installed" in md
    header = next(line for line in md.splitlines() if line.startswith("| shape"))
    col = [c.strip() for c in header.strip("|").split("|")].index("torch/lnc")
    for line in _table_lines(md)[:2]:
        assert [c.strip() for c in line.strip("|").split("|")][col] == "n/a"
    assert data["latency"]["us"]["torch"] is None
    assert data["memory"]["rows"]["torch"] == {"traced": None, "rss": None}


def test_loading_openvino_sends_no_telemetry():
    """Importing openvino sends a usage event through openvino_telemetry
    unless the user opted out: the benchmark loads it with the telemetry
    module blocked, so openvino falls back to its silent stub."""
    if not _installed("openvino"):
        pytest.skip("openvino not installed")
    from subprocess_support import run_python
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from benchlib import impls; "
            "impls.Peers(['openvino']).get('openvino'); "
            "import openvino.tools.ovc.telemetry_utils as t; "
            "print('openvino_telemetry' in sys.modules, t.tm.__name__)")
    proc = run_python(["-c", code, str(BENCH_PATH.parent)], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "openvino.tools.ovc.telemetry_stub"]


def test_a_selection_runs_only_what_was_asked(bench, tmp_path):
    data = _run_quick(bench, tmp_path, "--ops", "layer_norm_backward", "--dtypes", "float64",
                      "--shapes", "5x48", "--peers", "numpy", "--threads", "1",
                      "--no-memory", "--no-latency", "--no-sums-cost", "--no-output-cache")
    assert [(c["op"], c["shape"], c["dtype"], c["threads"]) for c in data["cases"]] == [
        ("layer_norm_backward", [5, 48], "float64", 1)]
    assert set(data["cases"][0]["seconds"]) == {"floor", "floor_alloc", "lnc", "numpy"}
    assert data["config"]["mode"] == "custom"
    assert "not measured in this run" in (tmp_path / "bench_rms_norm.inc").read_text("utf-8")
    assert data["memory"] is None and data["latency"] is None and data["sums_cost"] is None
    assert data["output_cache"] is None
    assert "Exact parameter-gradient sums" not in (tmp_path / "results.md").read_text("utf-8")


def _inputs(bench, op, shape=(8, 32), dtype="float32"):
    inp = bench.make_inputs(*bench.float32_data(shape), dtype)
    return inp, bench.reference(bench.OPS[op], inp)


def test_the_sums_cost_baseline_is_checked_before_it_is_timed(bench):
    """The exact sums' table times the plain baseline only where its dx is
    the dx-only call's and its sums are the exact ones up to rounding; the
    exact call's dx differing from dx alone stops the run."""
    op = bench.OPS["layer_norm_backward"]
    inp = bench.make_inputs(*bench.float32_data((300, 96)), "float32")
    got = {k: call() for k, call in bench.backward_calls(op, inp).items()}
    assert got["dx"][1] is None and got["dx"][2] is None
    assert bench.plain_problem(op, got) is None
    dweight = lnc.layer_norm_backward(inp.dy, inp.x, inp.w, op.eps).dweight
    np.testing.assert_allclose(bench.plain_sums(got["plain"][1]), dweight, rtol=1e-5)

    def changed(key, i, fn):
        result = list(got[key])
        result[i] = fn(result[i].copy())
        return dict(got, **{key: tuple(result)})

    def off_by(state):  # the plain dbias of the last feature, a little off
        state[-1, -1] = np.float64(bench.plain_sums(state)[-1] + 0.01).view(np.uint64)
        return state

    assert "dbias differs" in bench.plain_problem(op, changed("plain", 2, off_by))
    assert "(it is all zero)" in bench.plain_problem(op, changed("plain", 1, np.zeros_like))
    assert "dx differs" in bench.plain_problem(op, changed("plain", 0, np.negative))
    with pytest.raises(RuntimeError, match="dx with the exact sums"):
        bench.plain_problem(op, changed("exact", 0, np.negative))


def test_a_wrong_or_failing_peer_is_reported_not_timed(bench):
    op = bench.OPS["layer_norm"]
    inp, ref = _inputs(bench, "layer_norm")
    y = lnc.layer_norm(inp.x, inp.w, inp.b, op.eps)

    def broken():
        raise RuntimeError("no kernel\nsecond line")

    extra = {"torch": bench.Impl(lambda: y + 1e-2), "jax": bench.Impl(broken),
             "numpy": bench.Impl(lambda: y)}
    ready, notes, errors = bench.prepare(op, inp, ref, 1, ["lnc", "torch", "jax", "numpy"],
                                         bench.Peers([]), extra)
    assert set(ready) == {"lnc", "numpy"}
    assert notes["torch"].startswith("disagrees with the float64 reference")
    assert errors["torch"] > 1 and errors["lnc"] <= 1
    assert notes["jax"] == "failed: RuntimeError: no kernel"
    with pytest.raises(RuntimeError, match="layernorm_c"):
        bench.prepare(op, inp, ref, 1, ["lnc"], bench.Peers([]),
                      {"lnc": bench.Impl(lambda: y * 1.01)})


@pytest.mark.parametrize("op", ["layer_norm", "layer_norm_backward", "rms_norm",
                                "rms_norm_backward"])
def test_check_accepts_layernorm_c_and_rejects_a_perturbed_result(bench, op):
    spec = bench.OPS[op]
    inp, ref = _inputs(bench, op, shape=(300, 64))
    impl = bench.build("lnc", spec, inp, 1, bench.Peers([]))
    got = impl.outputs(impl.call())
    assert bench.check(spec, ref, got, inp) <= 1
    assert bench.check(spec, ref, (got[0] * 1.001,) + tuple(got[1:]), inp) > 1
    if spec.backward:  # the parameter gradients are checked too, over all records
        for i in range(1, len(got)):
            wrong = list(got)
            wrong[i] = got[i] + 1e-3 * np.abs(got[i]).max()
            assert bench.check(spec, ref, wrong, inp) > 1
    with pytest.raises(ValueError, match="shape"):
        bench.check(spec, ref, (got[0][:-1],) + tuple(got[1:]), inp)


def test_numpy_formulas_agree_with_the_float64_reference(bench):
    x = np.array([example.row for example in WORKED_EXAMPLES])
    y = bench._impls.numpy_layer_norm(x, np.ones(4), np.zeros(4), eps=0.0)
    np.testing.assert_allclose(y, lnc.reference_layer_norm(x, eps=0.0).y, rtol=1e-15, atol=0)
    for got, example in zip(y, WORKED_EXAMPLES):
        np.testing.assert_allclose(got, example.y, rtol=0, atol=0.5 * 10.0 ** -example.decimals)
    for op in bench.OPS:
        inp, ref = _inputs(bench, op, shape=(20, 48), dtype="float64")
        impl = bench._impls._numpy(bench.OPS[op], inp)
        assert bench.check(bench.OPS[op], ref, impl.outputs(impl.call()), inp) <= 1
        probe, fraction = impl.probe  # the same formula on the first rows
        assert impl.outputs(probe())[0].shape == (round(20 * fraction), 48)


def test_the_backward_floor_moves_the_backward_traffic(bench):
    op = bench.OPS["layer_norm_backward"]
    inp = bench.make_inputs(*bench.float32_data((4, 8)), "float16")
    floor = bench.build("floor_alloc", op, inp, 1, bench.Peers([]))
    dx = floor.call()  # an integer add of the bits: reads x and dy, writes dx
    assert dx.shape == inp.x.shape and dx.itemsize == inp.x.itemsize
    bits = inp.x.view(np.uint16).astype(np.uint32) + inp.dy.view(np.uint16)
    np.testing.assert_array_equal(dx, (bits & 0xFFFF).astype(np.uint16))


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_the_forward_floor_copies_into_an_array_at_x_page_offset(bench, dtype):
    # np.copyto into an array 16 bytes past x modulo 4 KiB ran 13x slower on
    # AMD Zen 3; the floor's output sits at x's own page offset instead.
    op = bench.OPS["layer_norm"]
    inp = bench.make_inputs(*bench.float32_data((64, 768)), dtype)
    floor = bench.build("floor", op, inp, 1, bench.Peers([]))
    floor.call()
    (out,) = [c.cell_contents for c in floor.call.__closure__
              if isinstance(c.cell_contents, np.ndarray) and c.cell_contents is not inp.x]
    assert out.ctypes.data % 4096 == inp.x.ctypes.data % 4096
    assert out.shape == inp.x.shape and out.dtype == inp.x.dtype and out.flags.c_contiguous
    np.testing.assert_array_equal(out, inp.x)
    assert not np.shares_memory(out, inp.x)


def test_a_slow_formula_is_not_timed(bench):
    op = bench.OPS["layer_norm"]
    inp, ref = _inputs(bench, "layer_norm", shape=(64, 256))
    _, notes, _ = bench.prepare(op, inp, ref, 1, ["numpy"], bench.Peers(["numpy"]),
                                max_call=1e-9)
    assert notes["numpy"].startswith("not timed: a call would take over")
    ready, notes, _ = bench.prepare(op, inp, ref, 1, ["numpy"], bench.Peers(["numpy"]),
                                    max_call=60.0)
    assert "numpy" in ready and not notes


def test_timing_helpers_count_calls(bench):
    calls = []
    loops, per_call = bench._timing.calibrate(lambda: calls.append(1), min_time=1e-4)
    assert loops >= 1 and len(calls) >= loops and per_call * loops >= 1e-4
    counts = {"a": 0, "b": 0, "slow": 0}

    def count(name, seconds=0.0):
        def call():
            counts[name] += 1
            if seconds:
                time.sleep(seconds)
        return call

    medians = bench.measure({"a": count("a"), "b": count("b"), "slow": count("slow", 0.02)},
                            repeats=5, min_time=1e-3, slow=0.01, slow_repeats=2)
    assert set(medians) == {"a", "b", "slow"} and all(t > 0 for t in medians.values())
    # One call per measurement for the slow one: 1 calibration + 1 more,
    # after its untimed call.
    assert counts["slow"] == 3 and counts["a"] > 5 and medians["slow"] >= 0.02


def test_steady_malloc_fixes_glibc_heap(bench):
    # In a child: the settings stay with the process that makes them.
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from benchlib.timing import steady_malloc; print(steady_malloc())")
    out = subprocess.run([sys.executable, "-c", code, str(BENCH_PATH.parent)], capture_output=True,
                         text=True, check=True).stdout.strip()
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert out == ("glibc malloc fixed: 1 arena, mmap threshold 32 MiB, "
                       "trim threshold 1024 MiB")
    else:
        assert out == "None"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_pin_moves_every_thread_of_the_process(bench):
    before = os.sched_getaffinity(0)
    started, stop = threading.Event(), threading.Event()
    tid = []

    def worker():
        tid.append(threading.get_native_id())
        started.set()
        stop.wait(10)

    t = threading.Thread(target=worker)
    t.start()
    started.wait(10)
    try:
        one = min(before)
        assert bench.pin([one])
        assert os.sched_getaffinity(tid[0]) == {one} and os.sched_getaffinity(0) == {one}
    finally:
        bench.pin(sorted(before))
        stop.set()
        t.join()
    assert os.sched_getaffinity(0) == before


def test_command_line_parsers(bench):
    assert bench.parse_shapes("64x768,1000000x16") == [(64, 768), (1_000_000, 16)]
    assert bench.parse_threads("1,1,2") == [1, 2]
    assert bench.parse_threads("all") == [len(bench.usable_cpus())]
    cfg = bench.make_config(bench.parse_args(["--quick", "--dtypes", "float16"]))
    assert cfg.dtypes == ["float16"] and cfg.shapes == bench.QUICK_SHAPES and cfg.quick
    assert cfg.mode == "custom"
    assert bench.make_config(bench.parse_args(["--quick"])).mode == "quick"
    full = bench.make_config(bench.parse_args([]))
    assert full.mode == "full" and list(full.ops) == list(bench.OPS)
    assert full.peers == list(bench.PEERS) and list(full.dtypes) == list(bench.DTYPES)
    assert (16384, 4096) in full.shapes and (1_000_000, 64) in full.shapes
    assert full.sums_cost_shapes == {"layer_norm_backward": bench.SUMS_COST_SHAPES,
                                     "rms_norm_backward": bench.SUMS_COST_RMS_SHAPES}
    assert (1_000_000, 16) in bench.SUMS_COST_SHAPES and (4096, 768) in bench.SUMS_COST_SHAPES
    assert full.cache_shapes == bench.CACHE_SHAPES and (16384, 4096) in full.cache_shapes
    assert "torch" not in bench.make_config(bench.parse_args(["--no-torch"])).peers
    assert bench.make_config(bench.parse_args(["--peers", "jax,numpy"])).peers == ["jax", "numpy"]
    for bad in (["--ops", "layer_nrm"], ["--dtypes", "int8"], ["--peers", "tensorflow"],
                ["--shapes", "64"], ["--shapes", "0x8"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_quick_mode_never_writes_into_the_repository(bench):
    paths = bench.output_paths(bench.parse_args(["--quick"]))
    for path in paths.values():
        assert bench.REPO not in path.resolve().parents
    shutil.rmtree(paths["md"].parent)  # the fresh, empty temp dir
    full = bench.output_paths(bench.parse_args([]))
    assert full["rst"] == bench.REPO / "docs" / "bench_table.inc"
    assert full["rst_rms_norm"] == bench.REPO / "docs" / "bench_rms_norm.inc"
    assert full["png"] == bench.REPO / "docs" / "_static" / "bench.png"


def test_mixed_dtype_benchmark_runs_and_reports_every_mix():
    """benchmarks/bench_mixed.py (issue 8's mixed-dtype figures): every
    mix gets a positive ratio; no timing is asserted."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_mixed.py"
    if not path.exists():
        pytest.skip("benchmarks/ is not here (an installed wheel)")
    spec = importlib.util.spec_from_file_location("bench_mixed", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lines = []
    ratios = mod.run([(3, 40)], repeats=1, min_time=0.0005, log=lines.append)
    assert len(ratios) == len(mod.MIXES) == len(lines)
    assert all(r > 0 for r in ratios.values())
