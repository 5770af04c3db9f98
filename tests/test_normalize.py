"""``python -m layernorm_c normalize``: streamed, bit-identical to the
in-memory call, nothing lost (input untouched, no partial output), clear
errors."""
import errno
import hashlib
import io
import os
import signal
import subprocess
import time

import numpy as np
import pytest

import layernorm_c as lnc
from layernorm_c import _normalize
from subprocess_support import PYTHON, child_env, run_python

RNG = np.random.default_rng(99)
X = (RNG.standard_normal((700, 5, 48)) * 4 + 300).astype(np.float32)
W = RNG.standard_normal(48).astype(np.float32)
B = RNG.standard_normal(48).astype(np.float32)


@pytest.fixture
def files(tmp_path):
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "w.npy", W)
    np.save(tmp_path / "b.npy", B)
    return tmp_path


def _run(*args, stream=None):
    return _normalize.main([str(a) for a in args], stream=stream or io.StringIO())


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_bit_identical_to_layer_norm_in_small_chunks(files):
    before = _digest(files / "x.npy")
    assert _run(files / "x.npy", files / "y.npy", "--weight", files / "w.npy", "--bias",
                files / "b.npy", "--chunk-mb", "0.1", "--quiet") == 0  # 15 chunks
    y = np.load(files / "y.npy")
    assert y.tobytes() == lnc.layer_norm(X, W, B).tobytes()
    assert _digest(files / "x.npy") == before  # the input is untouched
    assert [p.name for p in files.iterdir() if "partial" in p.name] == []


def test_rms_norm_several_axes_and_dtype(files):
    assert _run(files / "x.npy", files / "y.npy", "--op", "rms_norm", "--axis", "1,2",
                "--dtype", "float16", "--eps", "1e-3", "--chunk-mb", "0.05", "--quiet") == 0
    want = lnc.rms_norm(X.astype(np.float16), eps=1e-3, axis=(1, 2))
    got = np.load(files / "y.npy")
    assert got.dtype == np.float16 and got.tobytes() == want.tobytes()


def test_chunk_size_never_shows(files):
    for mb in ("0.01", "1", "100"):
        assert _run(files / "x.npy", files / f"y{mb}.npy", "--chunk-mb", mb, "--quiet") == 0
    assert len({_digest(files / f"y{mb}.npy") for mb in ("0.01", "1", "100")}) == 1


def test_zarr_in_and_out(files):
    zarr = pytest.importorskip("zarr")
    z = zarr.open_array(str(files / "x.zarr"), mode="w", shape=X.shape, chunks=(64, 5, 48),
                        dtype=X.dtype)
    z[:] = X
    assert _run(files / "x.zarr", files / "y.zarr", "--weight", files / "w.npy",
                "--chunk-mb", "0.2", "--quiet") == 0
    got = np.asarray(zarr.open_array(str(files / "y.zarr"), mode="r")[:])
    assert got.tobytes() == lnc.layer_norm(X, W).tobytes()
    assert _run(files / "y.zarr", files / "y.npy", "--quiet") == 0  # zarr -> .npy
    assert np.load(files / "y.npy").tobytes() == lnc.layer_norm(lnc.layer_norm(X, W)).tobytes()


def test_workers(files):
    pytest.importorskip("distributed")
    assert _run(files / "x.npy", files / "y.npy", "--workers", "2", "--chunk-mb", "0.2",
                "--weight", files / "w.npy", "--quiet") == 0
    assert np.load(files / "y.npy").tobytes() == lnc.layer_norm(X, W).tobytes()


def test_errors(files, capsys):
    cases = [
        ((files / "none.npy", files / "y.npy"), "IN: no such file"),
        ((files / "x.npy", files / "x.npy"), "OUT: must differ from IN"),
        ((files / "x.npy", files / "y.npy", "--weight", files / "b.npy", "--axis", "1"),
         "--weight"),
        ((files / "x.npy", files / "y.npy", "--weight", files / "missing.npy"),
         "--weight: no such file"),
        ((files / "x.npy", files / "y.npy", "--axis", "0"), "axis 0"),
        ((files / "x.npy", files / "y.npy", "--axis", "7"), "--axis"),
        ((files / "x.npy", files / "y.npy", "--eps", "-1"), "--eps"),
        ((files / "x.npy", files / "y.npy", "--op", "rms_norm", "--bias", files / "b.npy"),
         "rms_norm has no bias"),
        ((files / "x.npy", files / "nodir" / "y.npy"), "OUT: no such directory"),
    ]
    (files / "bad.npy").write_bytes(b"not an array")
    cases.append(((files / "bad.npy", files / "y.npy"), "not a .npy file"))
    for args, words in cases:
        assert _run(*args) == 1, args
        err = capsys.readouterr().err
        assert words in err, (args, err)
    assert not (files / "y.npy").exists()
    # wrong weight shape: the message gives the expected and given shapes
    np.save(files / "w5.npy", W[:5])
    assert _run(files / "x.npy", files / "y.npy", "--weight", files / "w5.npy") == 1
    err = capsys.readouterr().err
    assert "expected shape (48,)" in err and "(5,)" in err


def test_existing_output_needs_overwrite(files, capsys):
    (files / "y.npy").write_bytes(b"keep me")
    assert _run(files / "x.npy", files / "y.npy") == 1
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert (files / "y.npy").read_bytes() == b"keep me"
    assert _run(files / "x.npy", files / "y.npy", "--overwrite", "--quiet") == 0
    assert np.load(files / "y.npy").tobytes() == lnc.layer_norm(X).tobytes()


def test_full_disk_leaves_nothing(files, capsys, monkeypatch):
    calls = []
    real = _normalize._write_slab

    def failing(dst, start, y):
        calls.append(start)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(dst, start, y)

    monkeypatch.setattr(_normalize, "_write_slab", failing)
    assert _run(files / "x.npy", files / "y.npy", "--chunk-mb", "0.1") == 1
    err = capsys.readouterr().err
    assert "no space left" in err and "nothing was written" in err
    assert len(calls) == 3
    assert sorted(p.name for p in files.iterdir()) == ["b.npy", "w.npy", "x.npy"]


def test_not_enough_space_is_said_before_starting(files, capsys, monkeypatch):
    monkeypatch.setattr(_normalize.shutil, "disk_usage",
                        lambda p: type("U", (), {"free": 1000})())
    assert _run(files / "x.npy", files / "y.npy") == 1
    assert "not enough space" in capsys.readouterr().err
    assert not (files / "y.npy").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_interrupted_run_leaves_no_output(tmp_path, sig):
    """The run is slowed down (each chunk waits) and stopped halfway."""
    np.save(tmp_path / "x.npy", X)
    # The child gets Python's own SIGINT handler, as in a terminal: started
    # with SIGINT ignored (the suite under nohup or as a background job),
    # Python keeps ignoring it and the run would rightly go on to the end.
    code = f"""if 1:
        import signal, sys, time
        from layernorm_c import _normalize
        signal.signal(signal.SIGINT, signal.default_int_handler)
        real = _normalize._write_slab
        def slow(dst, start, y):
            real(dst, start, y)
            print('chunk', flush=True)
            time.sleep(0.2)
        _normalize._write_slab = slow
        sys.exit(_normalize.main([{str(tmp_path / 'x.npy')!r}, {str(tmp_path / 'y.npy')!r},
                                  '--chunk-mb', '0.05', '--quiet']))
    """
    proc = subprocess.Popen(PYTHON + ["-c", code], env=child_env(), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(3):
        assert proc.stdout.readline().startswith("chunk")
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert not (tmp_path / "y.npy").exists()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "x.npy"]
    if sig == signal.SIGKILL:  # nothing can clean up after a kill -9: a marked temporary
        assert all(".partial-" in name for name in leftovers)
    else:
        assert leftovers == []


def test_progress_line():
    p = _normalize.Progress(1000, 10_000_000, io.StringIO(), quiet=False)
    p.done = 250
    line = p.line(2.0)
    assert "250/1,000 records" in line and "25.0%" in line and "125 rec/s" in line
    assert "ETA 00:00:06" in line


def test_progress_only_on_a_terminal(files):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    assert _run(files / "x.npy", files / "y.npy", "--chunk-mb", "0.1", stream=tty) == 0
    assert "records" in tty.getvalue() and "ETA" in tty.getvalue()
    quiet = Tty()
    assert _run(files / "x.npy", files / "y2.npy", "--quiet", stream=quiet) == 0
    assert quiet.getvalue() == ""
    pipe = io.StringIO()  # not a terminal
    assert _run(files / "x.npy", files / "y3.npy", stream=pipe) == 0
    assert pipe.getvalue() == ""


def test_module_command(files):
    proc = run_python(["-m", "layernorm_c", "normalize", str(files / "x.npy"),
                       str(files / "y.npy"), "--quiet"])
    assert proc.returncode == 0, proc.stderr
    assert np.load(files / "y.npy").tobytes() == lnc.layer_norm(X).tobytes()
    proc = run_python(["-m", "layernorm_c", "normalize", "--help"])
    assert proc.returncode == 0 and "--chunk-mb" in proc.stdout
