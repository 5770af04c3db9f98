"""The implementations of docs/in-the-wild.rst, and the script writing its
tables.

Each object below is what a user of that framework would write: the
framework's own LayerNorm (or RMSNorm) with its defaults. The audit reads
eps, the axis, the dtype and the gain and bias from the object.

Reproduce one table from the repository root::

    python -m layernorm_c audit docs/in_the_wild.py:LAYER_NORMS
    python -m layernorm_c audit docs/in_the_wild.py:RMS_NORMS

(keras runs on the backend KERAS_BACKEND names, jax by default here; the
keras-on-torch column is ``KERAS_BACKEND=torch python -m layernorm_c audit
docs/in_the_wild.py:KERAS``.)

Regenerate the page's tables (docs/in_the_wild_results.inc) with::

    python docs/in_the_wild.py

which also runs the keras columns on the torch backend in a child process,
and records the versions and the time each audit took.
"""
from __future__ import annotations

import os
import pickle
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Dict

os.environ.setdefault("KERAS_BACKEND", "jax")

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "in_the_wild_results.inc"
#: The feature size of the modules that fix one (nnx, equinox).
D = 64


def onnx_layer_norm_model(op: str = "LayerNormalization", opset: int = 17,
                          epsilon: float = 1e-5) -> Any:
    """A model of one normalization node, float32, as ``torch.onnx.export``
    writes ``nn.LayerNorm`` at opset 17 (``RMSNormalization``: opset 23)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import numpy as np

    names = ["X", "scale"] + (["bias"] if op == "LayerNormalization" else [])
    inits = [numpy_helper.from_array(np.ones(D, np.float32), "scale")]
    if op == "LayerNormalization":
        inits.append(numpy_helper.from_array(np.zeros(D, np.float32), "bias"))
    node = helper.make_node(op, names, ["Y"], name="norm", axis=-1, epsilon=epsilon)
    graph = helper.make_graph([node], "norm", [helper.make_tensor_value_info(
        "X", TensorProto.FLOAT, ["batch", "tokens", D])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", "tokens", D])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def layer_norms() -> Dict[str, Any]:
    """The LayerNorms, by column name."""
    import equinox as eqx
    import jax
    import keras
    import torch
    from flax import linen, nnx
    from onnx.reference import ReferenceEvaluator

    import layernorm_c

    model = onnx_layer_norm_model()
    return {
        "torch F.layer_norm": torch.nn.functional.layer_norm,
        "onnxruntime": model,
        "onnx reference": ReferenceEvaluator(model),
        "flax linen": linen.LayerNorm(),
        "flax nnx": nnx.LayerNorm(D, rngs=nnx.Rngs(0)),
        f"keras ({keras.backend.backend()})": keras.layers.LayerNormalization(),
        "equinox": eqx.nn.LayerNorm(D),
        "jax.nn.standardize": jax.nn.standardize,
        "layernorm_c": layernorm_c.layer_norm,
    }


def rms_norms() -> Dict[str, Any]:
    """The RMSNorms, by column name."""
    import equinox as eqx
    import keras
    import torch
    from flax import linen, nnx
    from onnx.reference import ReferenceEvaluator

    import layernorm_c

    model = onnx_layer_norm_model("RMSNormalization", 23, 1e-6)
    return {
        "torch F.rms_norm": torch.nn.functional.rms_norm,
        "onnxruntime": model,
        "onnx reference": ReferenceEvaluator(model),
        "flax linen": linen.RMSNorm(),
        "flax nnx": nnx.RMSNorm(D, rngs=nnx.Rngs(0)),
        f"keras ({keras.backend.backend()})": keras.layers.RMSNormalization(),
        "equinox": eqx.nn.RMSNorm(D),
        "layernorm_c": layernorm_c.rms_norm,
    }


def keras_layers() -> Dict[str, Any]:
    """keras alone (for the run on another backend)."""
    import keras

    backend = keras.backend.backend()
    return {f"keras ({backend})": keras.layers.LayerNormalization(),
            f"keras RMS ({backend})": keras.layers.RMSNormalization()}


def __getattr__(name: str) -> Any:
    # The command line's targets: built when asked for, so importing this
    # file imports no framework.
    if name == "LAYER_NORMS":
        return layer_norms()
    if name == "RMS_NORMS":
        return rms_norms()
    if name == "KERAS":
        return keras_layers()
    raise AttributeError(name)


VERSIONS = ("numpy", "torch", "jax", "flax", "keras", "equinox", "onnx", "onnxruntime")


def _versions() -> str:
    import layernorm_c

    found = []
    for package in VERSIONS:
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"{package} (not installed)")
    return (f"layernorm_c {layernorm_c.__version__}, " + ", ".join(found)
            + f"; Python {platform.python_version()}, {platform.machine()}")


def _keras_on_torch() -> Dict[str, Any]:
    """The keras reports on the torch backend, from a child process (a
    process has one keras backend)."""
    code = ("import os, pickle, sys; sys.path.insert(0, %r); import in_the_wild as w; "
            "from layernorm_c.testing import compare; "
            "t = compare(w.keras_layers()); "
            "sys.stdout.buffer.write(pickle.dumps((t.reports, t.seconds)))" % str(HERE))
    env = dict(os.environ, KERAS_BACKEND="torch")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          check=True)
    reports, seconds = pickle.loads(done.stdout)
    return {"reports": reports, "seconds": seconds}


#: The feature sizes of the error-against-d table (two records each).
LARGE_D = (2 ** 10, 2 ** 12, 2 ** 14, 2 ** 16, 2 ** 18, 2 ** 20)


def error_against_d() -> str:
    """The float32 output error of a few LayerNorms at large d: records
    N(10, 1), gain 1, bias 0, against the float64 reference of the same
    float32 inputs (max absolute error over two records)."""
    import numpy as np
    import torch
    from onnx.reference import ReferenceEvaluator

    import layernorm_c
    from layernorm_c.testing import adapt

    model = onnx_layer_norm_model()
    impls = {"onnxruntime": adapt(model), "onnx reference": adapt(ReferenceEvaluator(model)),
             "torch F.layer_norm": adapt(torch.nn.functional.layer_norm),
             "layernorm_c": adapt(layernorm_c.layer_norm)}
    eps = impls["onnxruntime"].eps
    assert eps is not None
    rng = np.random.default_rng(0)
    rows = []
    for d in LARGE_D:
        x = (10.0 + rng.standard_normal((2, d))).astype(np.float32)
        ones, zeros = np.ones(d, np.float32), np.zeros(d, np.float32)
        want = layernorm_c.reference_layer_norm(x, eps=eps).y
        errors = [float(np.abs(np.asarray(i.call(x, ones, zeros, eps), np.float64) - want).max())
                  for i in impls.values()]
        rows.append(f"2^{int(np.log2(d)):<3}  " + "  ".join(f"{e:>18.2g}" for e in errors))
    head = "d      " + "  ".join(f"{n:>18}" for n in impls)
    return "\n".join([head, "-" * len(head)] + rows)


def _block(title: str, text: str) -> str:
    body = "\n".join("   " + line if line else "" for line in text.splitlines())
    return f"{title}\n\n.. code-block:: text\n\n{body}\n"


def main() -> int:
    from layernorm_c.testing import ComparisonReport, compare

    torch_side = _keras_on_torch()
    ln = compare(layer_norms())
    rms = compare(rms_norms())
    ln_reports = dict(ln.reports)
    rms_reports = dict(rms.reports)
    ln_seconds: Dict[str, Any] = dict(ln.seconds)
    rms_seconds: Dict[str, Any] = dict(rms.seconds)
    for name, report in torch_side["reports"].items():
        target = rms_reports if "RMS" in name else ln_reports
        seconds = rms_seconds if "RMS" in name else ln_seconds
        label = name.replace("keras RMS", "keras")
        target[label] = report
        seconds[label] = torch_side["seconds"][name]
    ln_all = ComparisonReport(ln_reports, ln_seconds)
    rms_all = ComparisonReport(rms_reports, rms_seconds)
    text = [".. Written by docs/in_the_wild.py: do not edit by hand.", "",
            f"Measured with {_versions()}.", "",
            _block("LayerNorm, float32 (each object's own dtype and eps):", ln_all.render(100)),
            _block("RMSNorm, float32 (each object's own dtype and eps):", rms_all.render(100)),
            _block("float32 output error against d (records N(10, 1), eps = the ONNX node's "
                   "float32 1e-5 for all):", error_against_d())]
    OUTPUT.write_text("\n".join(text))
    print(f"wrote {OUTPUT}")
    print(ln_all)
    print(rms_all)
    print(error_against_d())
    return 0


if __name__ == "__main__":
    sys.exit(main())
