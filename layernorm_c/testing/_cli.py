"""Command line: ``python -m layernorm_c audit [--op rms_norm] [--backward] TARGET
[TARGET ...] [options]``.

Runs the validation battery on an importable LayerNorm (with ``--op
rms_norm``, an RMSNorm; with ``--backward``, the backward battery on a
backward), or on an ONNX model (``model.onnx``: each normalization node), and
prints the report; with several targets (or a model with several kinds of
node, or a target that is a dict of implementations), one table of them side
by side. The exit code is 0 when every check passed (warnings allowed), 1
when one failed, 2 for a usage error (bad option, target not found).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ._adapters import DEFAULT_SIGNATURE, FRAMEWORKS
from ._backward_adapters import DEFAULT_BACKWARD_SIGNATURE
from ._ops import CONVENTIONS, OPS

__all__ = ["main", "build_parser", "load_target"]

PROG = "python -m layernorm_c audit"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``audit`` command."""
    from . import (describe_backward_checks, describe_checks, describe_rms_backward_checks,
                   describe_rms_checks)

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Validate a LayerNorm implementation: run every check of "
                    "layernorm_c.testing and print what is wrong, if anything. With "
                    "--op rms_norm, validate an RMSNorm; with --backward, a backward pass.",
        epilog="checks:\n" + describe_checks()
               + "\n\nbackward checks (--backward):\n" + describe_backward_checks()
               + "\n\nRMSNorm checks (--op rms_norm):\n" + describe_rms_checks()
               + "\n\nRMSNorm backward checks (--op rms_norm --backward):\n"
               + describe_rms_backward_checks(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("targets", nargs="*", metavar="target",
                        help="the implementation, as package.module:function (or "
                             "path/to/file.py:function); attributes may be dotted, e.g. "
                             "mymodel:net.norm for a torch module; a flax, keras or equinox "
                             "layer is recognised, and so is a path to an ONNX model "
                             "(model.onnx: every LayerNormalization and RMSNormalization "
                             "node). Several targets, or one naming a dict of "
                             "implementations, are audited side by side in one table")
    parser.add_argument("--op", choices=OPS, default=None,
                        help="what the target computes: layer_norm or rms_norm (by default "
                             "fn(x, weight, eps)); default: what a recognised object says "
                             "(an RMSNorm layer, an ONNX RMSNormalization node), else "
                             "layer_norm")
    parser.add_argument("--onnx-runtime", choices=("onnxruntime", "reference"), default=None,
                        help="what runs an ONNX model's nodes: onnxruntime (default) or "
                             "onnx's reference evaluator")
    parser.add_argument("--convention", choices=CONVENTIONS, default="weight",
                        help="with --op rms_norm: how the weight scales, weight (LLaMA, T5; "
                             "default) or 1+weight (Gemma)")
    parser.add_argument("--backward", action="store_true",
                        help="audit a backward: by default fn(dy, x, weight, bias, eps) -> "
                             "(dx, dweight, dbias); a torch module or F.layer_norm is "
                             "differentiated by autograd, and so is a torch or JAX forward "
                             "given a --signature without dy")
    parser.add_argument("--signature", default=None,
                        help=f"how the function takes its arguments (default "
                             f"'{DEFAULT_SIGNATURE}'), e.g. 'x', 'x, eps', 'x, weight, eps', "
                             "'x, *, weight, bias, eps'; with --backward (default "
                             f"'{DEFAULT_BACKWARD_SIGNATURE}'), e.g. "
                             "'dy, x, weight, eps -> dx, dweight', or a forward such as "
                             "'x, weight, bias, eps' for --framework torch or jax; with --op "
                             "rms_norm the defaults are 'x, weight, eps' and "
                             "'dy, x, weight, eps -> dx, dweight'")
    parser.add_argument("--framework", choices=FRAMEWORKS, default="auto",
                        help="what the function takes and returns (default: auto)")
    parser.add_argument("--dtype", choices=("float32", "float64", "float16", "bfloat16"),
                        default=None,
                        help="input dtype (default: a recognised object's own, e.g. an ONNX "
                             "node's, else float32; bfloat16 needs ml_dtypes)")
    parser.add_argument("--eps", type=float, default=None,
                        help="eps passed to the function, or the one it uses if it takes "
                             "none (default 1e-5, 1e-6 with --op rms_norm)")
    parser.add_argument("--d", type=int, default=None,
                        help="the only feature size the implementation supports")
    parser.add_argument("--leading-shape", type=_shape, default=None, metavar="N[,N...]",
                        help="the only leading shape x.shape[:-1] it supports, e.g. 8,128")
    parser.add_argument("--checks", type=_names, default=None, metavar="NAME[,NAME...]",
                        help="run only these checks")
    parser.add_argument("--rtol", type=float, default=None, help="override the tolerance")
    parser.add_argument("--atol", type=float, default=None, help="override the tolerance")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument("--strict-batch-invariance", action="store_true",
                        help="fail, not warn, when a record's bits depend on its batch (with "
                             "--backward: also the parameter gradients' bits on the record "
                             "order, layout or thread count)")
    depth = parser.add_mutually_exclusive_group()
    depth.add_argument("--quick", dest="mode", action="store_const", const="quick",
                       default="default",
                       help="measure less: the large-d check on fewer sizes (about a second "
                            "on a fast implementation)")
    depth.add_argument("--thorough", dest="mode", action="store_const", const="thorough",
                       help="measure more: the large-d check at every power of two to 2^22 "
                            "with more records (may take minutes)")
    parser.add_argument("--list-checks", action="store_true",
                        help="list the checks and exit")
    return parser


def _shape(text: str) -> Tuple[int, ...]:
    try:
        shape = tuple(int(n) for n in text.replace("x", ",").split(",") if n.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers such as 8,128, got {text!r}")
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers such as 8,128, got {text!r}")
    return shape


def _names(text: str) -> List[str]:
    # Checked against the forward's or the backward's checks once --backward
    # is known (see _unknown_checks).
    return [n.strip() for n in text.split(",") if n.strip()]


def battery(op: str, backward: bool) -> Tuple[str, Tuple[str, ...], Any]:
    """What the command runs: the battery's name in messages, its check names
    and its audit class."""
    from . import (BACKWARD_CHECKS, CHECKS, RMS_BACKWARD_CHECKS, RMS_CHECKS,
                   LayerNormAudit, LayerNormBackwardAudit, RMSNormAudit, RMSNormBackwardAudit)

    if op == "rms_norm":
        if backward:
            return "RMSNorm backward checks", RMS_BACKWARD_CHECKS, RMSNormBackwardAudit
        return "RMSNorm checks", RMS_CHECKS, RMSNormAudit
    if backward:
        return "backward checks", BACKWARD_CHECKS, LayerNormBackwardAudit
    return "checks", CHECKS, LayerNormAudit


def describe(op: str, backward: bool) -> str:
    """``--list-checks``: the battery's checks, one per line."""
    from . import (describe_backward_checks, describe_checks, describe_rms_backward_checks,
                   describe_rms_checks)

    if op == "rms_norm":
        return describe_rms_backward_checks() if backward else describe_rms_checks()
    return describe_backward_checks() if backward else describe_checks()


def _unknown_checks(names: Optional[Sequence[str]], op: str, backward: bool) -> Optional[str]:
    """The usage error for check names not in the battery, or None."""
    which, known, _ = battery(op, backward)
    unknown = [n for n in names or () if n not in known]
    if not unknown:
        return None
    return (f"argument --checks: unknown {which} {unknown}; expected names from "
            f"{', '.join(known)}")


def _unknown_in_any(names: Optional[Sequence[str]], backward: bool) -> Optional[str]:
    """The usage error for check names in neither op's battery (worded as
    for LayerNorm's), or None: without --op, each target runs its own
    battery, and a check in either one is known."""
    known = set(battery("layer_norm", backward)[1]) | set(battery("rms_norm", backward)[1])
    if all(n in known for n in names or ()):
        return None
    return _unknown_checks([n for n in names or () if n not in known], "layer_norm", backward)


def load_target(spec: str) -> Any:
    """Import ``package.module:attr.attr`` (or ``file.py:attr``); a path to
    an ``.onnx`` file is returned as it is (the adapters read it).

    Parameters
    ----------
    spec : str

    Returns
    -------
    object

    Raises
    ------
    ValueError
        ``spec`` is malformed, or the module or attribute cannot be found.
    """
    if spec.lower().endswith(".onnx"):
        if not os.path.isfile(spec):
            raise ValueError(f"no such ONNX file: {spec!r}")
        return spec
    module_name, sep, attrs = spec.partition(":")
    if not sep or not module_name or not attrs:
        raise ValueError(f"expected package.module:function or a path to a .onnx file, "
                         f"got {spec!r}")
    if module_name.endswith(".py"):
        module = _import_file(Path(module_name))
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())  # as `python -m` would
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"cannot import {module_name!r}: {exc}") from exc
    obj = module
    for attr in attrs.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise ValueError(f"{module_name!r} has no attribute {attrs!r}") from None
    return obj


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise ValueError(f"no such file: {str(path)!r}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``audit`` command.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments after ``audit``; default ``sys.argv[1:]``.

    Returns
    -------
    int
        0 when no check failed, 1 when one did, 2 for a usage error.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else 2
    if args.list_checks:
        print(describe(args.op or "layer_norm", args.backward))
        return 0
    unknown = (_unknown_checks(args.checks, args.op, args.backward) if args.op is not None
               else _unknown_in_any(args.checks, args.backward))
    if unknown is not None:
        parser.print_usage(sys.stderr)
        print(f"{PROG}: error: {unknown}", file=sys.stderr)
        return 2
    if not args.targets:
        parser.print_usage(sys.stderr)
        print(f"{PROG}: error: a target package.module:function is required (or a path to model.onnx)",
              file=sys.stderr)
        return 2
    if args.convention != "weight" and args.op == "layer_norm":
        parser.print_usage(sys.stderr)
        print(f"{PROG}: error: --convention goes with --op rms_norm", file=sys.stderr)
        return 2
    try:
        columns = _columns(args.targets, args.onnx_runtime)
        if len(columns) == 1:
            label, fn = columns[0]
            audit = _single_audit(fn, label, args)
        else:
            audit = None
    except (ValueError, TypeError, ImportError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if audit is not None:
        report = audit.run(args.checks)
        print(report)
        return 0 if report.ok else 1
    from ._compare import compare

    try:
        table = compare(dict(columns), checks=args.checks, op=args.op, backward=args.backward,
                        dtype=args.dtype, eps=args.eps, signature=args.signature,
                        framework=args.framework, d=args.d, leading_shape=args.leading_shape,
                        rtol=args.rtol, atol=args.atol, seed=args.seed,
                        strict_batch_invariance=args.strict_batch_invariance,
                        convention=args.convention, mode=args.mode)
    except (ValueError, TypeError, ImportError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(table)
    return 0 if table.ok else 1


def _columns(targets: Sequence[str], onnx_runtime: Optional[str]) -> List[Tuple[str, Any]]:
    """``(name, implementation)`` for each target: an ONNX model gives one
    per distinct normalization node, a dict one per item."""
    from ._frameworks import builtin_kind, from_onnx, node_label

    columns: List[Tuple[str, Any]] = []
    for spec in targets:
        obj = load_target(spec)
        if isinstance(obj, dict):
            columns.extend((str(k), v) for k, v in obj.items())
        elif builtin_kind(obj) == "onnx":
            impls = from_onnx(obj, onnx_runtime)
            if len(impls) == 1:
                columns.append((spec, impls[0]))
            else:
                columns.extend((f"{spec}: {node_label(impl)}", impl) for impl in impls)
        else:
            columns.append((spec, obj))
    names = [n for n, _ in columns]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"the same target twice: {repeated}")
    return columns


def _single_audit(fn: Any, label: str, args: argparse.Namespace) -> Any:
    """The audit of one target, in the battery its op and --backward say."""
    from ._compare import _op_of

    op = _op_of(fn, args.op)
    if args.convention != "weight" and op != "rms_norm":
        raise ValueError("--convention goes with --op rms_norm")
    options: Dict[str, Any] = {"convention": args.convention} if op == "rms_norm" else {}
    _, _, kind = battery(op, args.backward)
    unknown = _unknown_checks(args.checks, op, args.backward)
    if unknown is not None:
        raise ValueError(unknown)
    return kind(fn, signature=args.signature, framework=args.framework,
                dtype=args.dtype, eps=args.eps, d=args.d,
                leading_shape=args.leading_shape, rtol=args.rtol,
                atol=args.atol, seed=args.seed,
                strict_batch_invariance=args.strict_batch_invariance,
                name=None if _keeps_name(fn) else label, mode=args.mode, **options)


def _keeps_name(fn: Any) -> bool:
    """Whether the implementation's own name says more than the target's
    (an ONNX node's, which names the node and the runtime)."""
    from ._adapters import Implementation

    return isinstance(fn, Implementation) and fn.op is not None


if __name__ == "__main__":
    sys.exit(main())
