"""``python -m layernorm_c normalize IN OUT``: normalize an array file larger
than memory, in chunks of records.

IN and OUT are ``.npy`` files or zarr stores (zarr optional). The records
are streamed: a chunk of whole records is read with plain file reads at
its offset, normalized by the in-memory function and written at its
offset, so memory stays bounded by the chunk size whatever the input size
(no memory map whose pages would pile up in the resident set). Every record
gets the bits ``layer_norm`` gives it on the whole array (a record's
result never depends on its batch).

Nothing is lost: IN is only read; OUT is written to a temporary path beside
it and renamed into place when complete, so an interrupted run leaves no
OUT. With ``--workers N`` (a local dask.distributed cluster of N processes)
or ``--scheduler ADDR`` (an existing cluster, whose workers must see IN and
OUT at the same paths) the chunks are dask tasks.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import math
import os
import shutil
import signal
import sys
import time
import uuid
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, TextIO, Tuple

import numpy as np
from numpy.typing import NDArray

from ._rms import Convention

__all__ = ["main"]

# NumPy's .npy header helpers (typed since NumPy 2, untyped in 1.x: Any keeps
# mypy --strict clean on both)
_npy_format: Any = np.lib.format


class CLIError(Exception):
    """A clear, user-facing error: printed without a traceback."""


# ---- arrays on disk ---------------------------------------------------------

def _is_zarr_path(path: str) -> bool:
    p = path.rstrip("/\\")
    return p.endswith(".zarr") or (os.path.isdir(p) and any(
        os.path.exists(os.path.join(p, meta)) for meta in ("zarr.json", ".zarray")))


def _zarr() -> Any:
    # Imported by name: zarr 2 has no type information, zarr 3 has, and
    # mypy --strict must pass with either.
    try:
        zarr = importlib.import_module("zarr")
    except ImportError:
        raise CLIError("zarr stores need the zarr package: pip install zarr "
                       "(or layernorm_c[zarr])") from None
    return zarr


class Source(NamedTuple):
    """An input array: its shape and dtype, and how to read a slab."""

    path: str
    shape: Tuple[int, ...]
    dtype: np.dtype[Any]
    offset: int  # .npy: the data's byte offset; zarr: -1
    chunk0: int  # zarr: the store's chunk length along axis 0; .npy: 1


def _open_source(path: str) -> Source:
    if not os.path.exists(path):
        raise CLIError(f"IN: no such file or store: {path}")
    if _is_zarr_path(path):
        z = _zarr().open_array(path, mode="r")
        return Source(path, tuple(z.shape), np.dtype(z.dtype), -1, int(z.chunks[0]))
    if os.path.isdir(path):
        raise CLIError(f"IN: {path} is a directory but not a zarr store")
    try:
        with open(path, "rb") as f:
            version = _npy_format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = _npy_format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = _npy_format.read_array_header_2_0(f)
            offset = f.tell()
    except ValueError as exc:
        raise CLIError(f"IN: {path} is not a .npy file or a zarr store ({exc})") from None
    if fortran:
        raise CLIError(f"IN: {path} is stored in Fortran order, which cannot be streamed by "
                       f"records; save it in C order (np.save(path, np.ascontiguousarray(a)))")
    if dtype.hasobject:
        raise CLIError(f"IN: {path} holds Python objects (dtype {dtype}), not numbers")
    need = offset + math.prod(shape) * dtype.itemsize
    if os.path.getsize(path) < need:
        raise CLIError(f"IN: {path} is truncated: {os.path.getsize(path)} bytes, the header "
                       f"says {need}")
    return Source(path, tuple(shape), dtype, offset, 1)


def _read_slab(src: Source, start: int, stop: int) -> NDArray[Any]:
    """Rows [start, stop) of axis 0, read plainly (no memory map)."""
    if src.offset < 0:
        return np.asarray(_zarr().open_array(src.path, mode="r")[start:stop])
    shape = (stop - start,) + src.shape[1:]
    out = np.empty(shape, src.dtype)
    row = math.prod(src.shape[1:]) * src.dtype.itemsize
    view = out.reshape(-1).view(np.uint8).data
    with open(src.path, "rb", buffering=0) as f:
        f.seek(src.offset + start * row)
        done = 0
        while done < len(view):
            n = f.readinto(view[done:])
            if not n:
                raise CLIError(f"IN: {src.path} ended early (changed while being read?)")
            done += n
    return out


class Target(NamedTuple):
    """The output being written (at a temporary path until complete)."""

    path: str  # the temporary path
    zarr: bool
    offset: int  # .npy: the data's byte offset
    row: int  # bytes per row of axis 0


def _create_target(tmp: str, zarr_out: bool, shape: Tuple[int, ...], dtype: np.dtype[Any],
                   rows: int) -> Target:
    row = math.prod(shape[1:]) * dtype.itemsize
    if zarr_out:
        _zarr().open_array(tmp, mode="w", shape=shape, dtype=dtype,
                           chunks=(rows,) + shape[1:])
        return Target(tmp, True, 0, row)
    header = {"descr": _npy_format.dtype_to_descr(dtype), "fortran_order": False,
              "shape": shape}
    with open(tmp, "xb") as f:
        try:
            _npy_format.write_array_header_1_0(f, header)
        except ValueError:  # a header too long for version 1.0
            f.seek(0)
            f.truncate()
            _npy_format.write_array_header_2_0(f, header)
        offset = f.tell()
    return Target(tmp, False, offset, row)


def _write_slab(dst: Target, start: int, y: NDArray[Any]) -> None:
    if dst.zarr:
        z = _zarr().open_array(dst.path, mode="r+")
        z[start:start + y.shape[0]] = y
        return
    data = np.ascontiguousarray(y).reshape(-1).view(np.uint8).data
    with open(dst.path, "r+b", buffering=0) as f:
        f.seek(dst.offset + start * dst.row)
        done = 0
        while done < len(data):
            done += f.write(data[done:])


# ---- the job ----------------------------------------------------------------

class Job(NamedTuple):
    """Everything a chunk task needs (picklable, for dask workers)."""

    src: Source
    dst: Target
    op: str
    weight: Optional[NDArray[Any]]
    bias: Optional[NDArray[Any]]
    eps: float
    axes: Tuple[int, ...]
    dtype: Optional[np.dtype[Any]]
    convention: Convention


def _normalize(job: Job, x: NDArray[Any]) -> NDArray[Any]:
    import layernorm_c as lnc

    if job.dtype is not None:
        x = x.astype(job.dtype, copy=False)
    if job.op == "layer_norm":
        return lnc.layer_norm(x, job.weight, job.bias, job.eps, axis=job.axes)
    return lnc.rms_norm(x, job.weight, job.eps, axis=job.axes, convention=job.convention)


def run_chunk(job: Job, start: int, stop: int, threads: int = 0) -> int:
    """Read, normalize and write rows [start, stop) of axis 0; returns the
    number of records done. ``threads``: a kernel-thread limit for this
    call (0: none; dask tasks use 1)."""
    from . import _core

    previous = _core._set_thread_limit(threads)
    try:
        x = _read_slab(job.src, start, stop)
        y = _normalize(job, x)
        _write_slab(job.dst, start, y)
    finally:
        _core._set_thread_limit(previous)
    return _records(job, stop - start)


def _records(job: Job, rows: int) -> int:
    per_row = math.prod(n for i, n in enumerate(job.src.shape) if i not in job.axes and i > 0)
    return rows * per_row


def _chunks(n: int, rows: int, align: int) -> List[Tuple[int, int]]:
    if align > 1:
        rows = max(align, rows // align * align)  # whole zarr chunks per read
    return [(s, min(n, s + rows)) for s in range(0, n, rows)]


# ---- progress -----------------------------------------------------------------

class Progress:
    """Records done, throughput and ETA on one line of a terminal; silent
    when the stream is not a terminal or when quiet."""

    def __init__(self, total: int, nbytes: int, stream: TextIO, quiet: bool):
        self.total, self.nbytes, self.stream = total, nbytes, stream
        self.enabled = not quiet and hasattr(stream, "isatty") and stream.isatty()
        self.done = 0
        self.t0 = time.perf_counter()
        self.last = 0.0

    def update(self, records: int) -> None:
        self.done += records
        now = time.perf_counter()
        if self.enabled and (now - self.last > 0.2 or self.done >= self.total):
            self.last = now
            self.stream.write("\r" + self.line(now - self.t0))
            self.stream.flush()

    def line(self, elapsed: float) -> str:
        frac = self.done / self.total if self.total else 1.0
        rate = self.done / elapsed if elapsed > 0 else 0.0
        mbs = frac * self.nbytes / elapsed / 1e6 if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        width = 24
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        eta_s = "--:--" if math.isnan(eta) else time.strftime("%H:%M:%S", time.gmtime(eta))
        return (f"[{bar}] {self.done:,}/{self.total:,} records {frac:6.1%}  "
                f"{rate:,.0f} rec/s {mbs:,.0f} MB/s  ETA {eta_s}")

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


# ---- arguments ----------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m layernorm_c normalize",
        description="Normalize every record of an array file (.npy or zarr) that may be "
                    "larger than memory, streaming in chunks of records. The result is "
                    "bit-identical to layer_norm (or rms_norm) on the whole array.")
    p.add_argument("input", metavar="IN", help="a .npy file or a zarr store")
    p.add_argument("output", metavar="OUT", help="a .npy file or a zarr store (.zarr) to create")
    p.add_argument("--op", choices=("layer_norm", "rms_norm"), default="layer_norm")
    p.add_argument("--axis", default="-1",
                   help="the normalized axis or axes, comma-separated (default -1); axis 0 "
                        "is the one streamed and cannot be normalized")
    p.add_argument("--weight", metavar="W.npy", help="the gain (default: none)")
    p.add_argument("--bias", metavar="B.npy", help="the bias, layer_norm only (default: none)")
    p.add_argument("--eps", type=float, default=None,
                   help="default 1e-5 (layer_norm) or 1e-6 (rms_norm)")
    p.add_argument("--convention", choices=("weight", "1+weight"), default="weight",
                   help="rms_norm's scale: weight (LLaMA) or 1+weight (Gemma)")
    p.add_argument("--dtype", choices=("float16", "float32", "float64"), default=None,
                   help="convert the records to this dtype first (default: as stored)")
    p.add_argument("--chunk-mb", type=float, default=64.0,
                   help="input megabytes per chunk (default 64); memory is a few chunks")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, default=None, metavar="N",
                       help="run the chunks on a local dask.distributed cluster of N processes")
    where.add_argument("--scheduler", default=None, metavar="ADDR",
                       help="run the chunks on this dask.distributed scheduler (its workers "
                            "must see IN and OUT at the same paths)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _load_param(path: Optional[str], name: str) -> Optional[NDArray[Any]]:
    if path is None:
        return None
    if not os.path.exists(path):
        raise CLIError(f"--{name}: no such file: {path}")
    try:
        arr: NDArray[Any] = np.load(path, allow_pickle=False)
        return arr
    except (ValueError, OSError) as exc:
        raise CLIError(f"--{name}: {path} is not a .npy file ({exc})") from None


def _parse_axes(text: str, ndim: int) -> Tuple[int, ...]:
    from ._api import _normalize_axes

    try:
        axes = [int(a) for a in text.split(",") if a.strip()]
    except ValueError:
        raise CLIError(f"--axis: expected integers separated by commas, got {text!r}") from None
    try:
        norm = _normalize_axes(tuple(axes), ndim)
    except (TypeError, ValueError) as exc:
        raise CLIError(f"--axis: {exc}") from None
    if 0 in norm:
        raise CLIError(f"--axis: axis 0 (of {ndim}) is streamed in chunks and cannot be "
                       f"normalized; store the array with the records along axis 0")
    return norm


def _check_params(job: Job, args: argparse.Namespace) -> np.dtype[Any]:
    """Validate weight/bias against IN's shape with the library's own rules
    (no data read), and return the output dtype."""
    from ._api import _as_param, _as_real_array, _result_dtype

    dt = job.dtype or job.src.dtype
    ph = _as_real_array(np.broadcast_to(np.zeros((), dt if dt.kind == "f" else np.float64),
                                        job.src.shape), "IN")
    params = []
    for name, p in (("weight", job.weight), ("bias", job.bias)):
        if p is None:
            continue
        try:
            params.append((p, _as_param(p, name, job.src.shape, job.axes)))
        except (TypeError, ValueError) as exc:
            raise CLIError(f"--{name} ({getattr(args, name)}): {exc}") from None
    return _result_dtype(ph, params)


def _temp_path(out: str) -> str:
    head, tail = os.path.split(os.path.abspath(out.rstrip("/\\")))
    return os.path.join(head, f".{tail}.partial-{uuid.uuid4().hex[:8]}")


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)


def _move_into_place(tmp: str, out: str, overwrite: bool) -> None:
    if os.path.isdir(out):  # a zarr store: os.replace cannot replace a directory
        trash = _temp_path(out) + ".old"
        os.replace(out, trash)
        os.replace(tmp, out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, out)


def _disk_error(exc: OSError, out: str, need: int) -> CLIError:
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return CLIError(f"OUT: no space left on the device of {out} (the output needs "
                        f"{need / 1e6:,.0f} MB); nothing was written")
    return CLIError(f"OUT: could not write {out}: {exc}; nothing was written")


# ---- running -------------------------------------------------------------------

def _run_local(job: Job, chunks: Sequence[Tuple[int, int]], progress: Progress) -> None:
    for start, stop in chunks:
        progress.update(run_chunk(job, start, stop))


def _run_dask(job: Job, chunks: Sequence[Tuple[int, int]], progress: Progress,
              workers: Optional[int], address: Optional[str]) -> None:
    try:
        distributed: Any = importlib.import_module("distributed")
    except ImportError:
        raise CLIError("--workers/--scheduler need dask.distributed: pip install "
                       "'layernorm_c[dask]'") from None
    from ._lazy import task_threads

    threads = task_threads()
    cluster = None
    try:
        if address is None:
            cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1,
                                               processes=True, dashboard_address=None)
            client = distributed.Client(cluster)
        else:
            client = distributed.Client(address)
        with client:
            futures = [client.submit(run_chunk, job, s, e, threads, pure=False)
                       for s, e in chunks]
            try:
                for fut in distributed.as_completed(futures):
                    progress.update(fut.result())
            except BaseException:
                client.cancel(futures)  # no task writes after the temporary is removed
                raise
    finally:
        if cluster is not None:
            cluster.close()


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def normalize(args: argparse.Namespace, stream: TextIO) -> None:
    src = _open_source(args.input)
    out = args.output
    if os.path.abspath(out.rstrip("/\\")) == os.path.abspath(args.input.rstrip("/\\")):
        raise CLIError("OUT: must differ from IN (the input is never modified)")
    if os.path.exists(out) and not args.overwrite:
        raise CLIError(f"OUT: {out} exists; pass --overwrite to replace it")
    if len(src.shape) < 2:
        raise CLIError(f"IN: expected at least 2 dimensions (records along axis 0), got "
                       f"shape {src.shape}")
    if args.op == "rms_norm" and args.bias is not None:
        raise CLIError("--bias: rms_norm has no bias")
    if args.chunk_mb <= 0 or not math.isfinite(args.chunk_mb):
        raise CLIError(f"--chunk-mb: expected a positive number, got {args.chunk_mb}")
    if args.workers is not None and args.workers < 1:
        raise CLIError(f"--workers: expected at least 1, got {args.workers}")
    axes = _parse_axes(args.axis, len(src.shape))
    eps = args.eps if args.eps is not None else (1e-5 if args.op == "layer_norm" else 1e-6)
    from ._api import _check_eps
    try:
        eps = _check_eps(eps)
    except (TypeError, ValueError) as exc:
        raise CLIError(f"--eps: {exc}") from None
    job = Job(src, Target("", False, 0, 0), args.op, _load_param(args.weight, "weight"),
              _load_param(args.bias, "bias"), eps, axes,
              None if args.dtype is None else np.dtype(args.dtype), args.convention)
    dtype = _check_params(job, args)

    row_in = math.prod(src.shape[1:]) * src.dtype.itemsize
    rows = max(1, int(args.chunk_mb * 2 ** 20) // max(1, row_in))
    chunks = _chunks(src.shape[0], rows, src.chunk0)
    zarr_out = _is_zarr_path(out)
    need = math.prod(src.shape) * dtype.itemsize
    parent = os.path.dirname(os.path.abspath(out.rstrip("/\\")))
    if not os.path.isdir(parent):
        raise CLIError(f"OUT: no such directory: {parent}")
    if not zarr_out and shutil.disk_usage(parent).free < need:
        raise CLIError(f"OUT: not enough space on the device of {out}: the output needs "
                       f"{need / 1e6:,.0f} MB, {shutil.disk_usage(parent).free / 1e6:,.0f} MB "
                       f"free")

    tmp = _temp_path(out)
    old = signal.signal(signal.SIGTERM, _terminate)
    progress = Progress(_records(job, src.shape[0]), need, stream, args.quiet)
    try:
        try:
            job = job._replace(dst=_create_target(tmp, zarr_out, src.shape, dtype,
                                                  chunks[0][1] - chunks[0][0]))
            if not zarr_out:
                with open(tmp, "r+b") as f:  # the full size now: the chunks write in place
                    f.truncate(job.dst.offset + need)
            if args.workers is None and args.scheduler is None:
                _run_local(job, chunks, progress)
            else:
                _run_dask(job, chunks, progress, args.workers, args.scheduler)
            progress.close()
            if not zarr_out:
                with open(tmp, "r+b") as f:  # on disk before it takes OUT's name
                    os.fsync(f.fileno())
            _move_into_place(tmp, out, args.overwrite)
        except OSError as exc:
            raise _disk_error(exc, out, need) from None
    except BaseException:
        progress.close()
        _remove(tmp)
        raise
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv: Optional[Sequence[str]] = None, stream: Optional[TextIO] = None) -> int:
    """The ``normalize`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    stream = sys.stderr if stream is None else stream
    t0 = time.perf_counter()
    try:
        normalize(args, stream)
    except CLIError as exc:
        print(f"normalize: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("normalize: interrupted; no output written", file=sys.stderr)
        return 130
    if not args.quiet:
        print(f"normalize: wrote {args.output} in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
    return 0
