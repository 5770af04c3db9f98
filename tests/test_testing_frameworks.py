"""The built-in adapters, each against the real library when it is installed
(skipped when it is not): ONNX models run by onnxruntime and by onnx's
reference evaluator, flax linen and nnx, keras (jax backend in this process,
torch backend in a child), equinox, jax.nn.standardize."""
import functools
import json
import os
import sys

import numpy as np
import pytest

from layernorm_c.testing import (LayerNormAudit, LayerNormBackwardAudit, RMSNormAudit,
                                 RMSNormBackwardAudit, adapt, from_onnx)
from layernorm_c.testing._cli import main
from subprocess_support import run_python

if "keras" not in sys.modules:
    # keras picks its backend when first imported; jax is the one installed
    # beside torch here (the torch backend runs in a child process below).
    os.environ.setdefault("KERAS_BACKEND", "jax")


def _failed(report):
    return {r.name for r in report.failures}


# -- ONNX ----------------------------------------------------------------------

def _onnx_model(nodes, x_shape, opset=17, x_type=None, extra_inits=()):
    """A model whose input X feeds the given nodes (made by ``nodes(helper)``),
    with a scale (and bias) initializer of the last axis' size."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    x_type = TensorProto.FLOAT if x_type is None else x_type
    np_type = helper.tensor_dtype_to_np_dtype(x_type)
    d = x_shape[-1] if x_shape is not None else 8
    inits = [numpy_helper.from_array(np.ones(d, np_type), "s"),
             numpy_helper.from_array(np.zeros(d, np_type), "b")] + list(extra_inits)
    made = nodes(helper)
    graph = helper.make_graph(made, "test", [helper.make_tensor_value_info("X", x_type, x_shape)],
                              [helper.make_tensor_value_info(made[-1].output[0], x_type, x_shape)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if x_shape is not None:
        onnx.checker.check_model(model)
    return model


def _ln(helper, name, x, y, **attributes):
    return helper.make_node("LayerNormalization", [x, "s", "b"], [y], name=name, **attributes)


@pytest.fixture
def two_kinds():
    """Two alike LayerNorm nodes, one with another epsilon, one RMSNorm."""
    return _onnx_model(lambda h: [
        _ln(h, "ln_1", "X", "h1", epsilon=1e-5),
        _ln(h, "ln_2", "h1", "h2", epsilon=1e-5),
        _ln(h, "ln_eps", "h2", "h3", epsilon=1e-3),
        h.make_node("RMSNormalization", ["h3", "s"], ["Y"], name="rms", epsilon=1e-6),
    ], ["b", "t", 16], opset=23)


def test_onnx_nodes_are_grouped_with_their_own_attributes(two_kinds):
    pytest.importorskip("onnxruntime")
    impls = from_onnx(two_kinds)
    assert [i.name for i in impls] == [
        "onnxruntime LayerNormalization ln_1 (+1 alike)",
        "onnxruntime LayerNormalization ln_eps",
        "onnxruntime RMSNormalization rms"]
    first, other_eps, rms = impls
    # epsilon is a float32 attribute: the value really used, not 1e-5
    assert first.eps == float(np.float32(1e-5)) != 1e-5
    assert other_eps.eps == float(np.float32(1e-3))
    assert [i.op for i in impls] == ["layer_norm", "layer_norm", "rms_norm"]
    assert first.takes_bias and not rms.takes_bias and not first.takes_eps
    assert first.dtype == "float32" and "nodes ln_1, ln_2" in first.details
    with pytest.raises(ValueError, match="3 distinct normalization nodes.*compare"):
        LayerNormAudit(two_kinds)


def test_onnxruntime_layer_norm_and_rms_norm_nodes_pass(two_kinds):
    pytest.importorskip("onnxruntime")
    impls = from_onnx(two_kinds)
    report = LayerNormAudit(impls[0]).run()
    # onnxruntime's float32 LayerNormalization accumulates its sums in running
    # sums: its error grows with d (1.32: 147 units of roundoff at d = 2^20),
    # which the large-d check names; every other check passes.
    assert {r.name for r in report.failures} <= {"large_d"} and not report.warnings, str(report)
    if not report.ok:
        assert "the error grows with d" in report["large_d"].diagnosis
    assert "float32 (its own), eps=9.99999974737875" in report.title
    assert "the node's float32 attribute" in report.title
    rms = RMSNormAudit(impls[2]).run()
    # (Its RMSNormalization too: error ~ d^0.7, 5e-05 at d = 2^20.)
    assert {r.name for r in rms.failures} <= {"large_d"}, str(rms)
    with pytest.raises(ValueError, match="is an RMSNorm; audit it with RMSNormAudit"):
        LayerNormAudit(impls[2])
    with pytest.raises(ValueError, match="uses its own eps"):
        LayerNormAudit(impls[0], eps=1e-5)


def test_onnx_model_file_session_and_reference_evaluator(tmp_path):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx.reference import ReferenceEvaluator

    model = _onnx_model(lambda h: [_ln(h, "norm", "X", "Y")], ["b", 8])
    path = tmp_path / "norm.onnx"
    onnx.save(model, str(path))
    checks = ["reference", "eps", "cancellation", "float16_overflow"]
    for obj in (str(path), path, ort.InferenceSession(str(path),
                                                      providers=["CPUExecutionProvider"])):
        report = LayerNormAudit(obj).run(checks)
        assert report.ok and report.title.startswith("LayerNorm audit of onnxruntime"), report
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert LayerNormAudit(session).impl.name == "onnxruntime LayerNormalization norm"
    # onnx's reference evaluator runs the same node in NumPy.
    reference = LayerNormAudit(ReferenceEvaluator(model)).run(["reference", "eps", "affine"])
    assert reference.ok and reference.title.startswith("LayerNorm audit of reference "), reference
    assert from_onnx(model, "reference")[0].name.startswith("reference ")


def test_onnx_float16_node_is_audited_in_float16():
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto

    model = _onnx_model(lambda h: [_ln(h, "half", "X", "Y")], ["b", 32],
                        x_type=TensorProto.FLOAT16)
    audit = LayerNormAudit(model)
    assert audit.dtype == np.float16 and "float16 (its own)" in audit.title
    report = audit.run(["contract", "reference", "float16_overflow"])
    assert report.ok, str(report)
    assert report["contract"].figure.startswith("float16[")


def test_onnx_axes_other_than_minus_one():
    pytest.importorskip("onnxruntime")
    # axis=2 of a rank-3 input is its last axis; the audit's records are
    # reshaped to rank 3 for it.
    last = from_onnx(_onnx_model(lambda h: [_ln(h, "ln", "X", "Y", axis=2)], ["b", "t", 8]))[0]
    assert "axis 2 of a rank-3 input" in last.details
    assert LayerNormAudit(last).run(["reference", "coupling", "eps"]).ok
    # axis=-2 normalizes the last two axes (4 x 8): one record of d = 32.
    from onnx import numpy_helper

    two = _onnx_model(lambda h: [h.make_node("LayerNormalization", ["X", "s2", "b2"], ["Y"],
                                             name="ln2", axis=-2)], ["b", 4, 8],
                      extra_inits=[numpy_helper.from_array(np.ones((4, 8), np.float32), "s2"),
                                   numpy_helper.from_array(np.zeros((4, 8), np.float32), "b2")])
    impl = from_onnx(two)[0]
    assert impl.d == 32 and "normalized shape (4, 8)" in impl.details
    report = LayerNormAudit(impl).run(["reference", "affine", "variance"])
    assert report.ok, str(report)


def test_onnx_errors():
    pytest.importorskip("onnxruntime")
    no_norm = _onnx_model(lambda h: [h.make_node("Relu", ["X"], ["Y"])], ["b", 8])
    with pytest.raises(ValueError, match="no LayerNormalization or RMSNormalization node"):
        from_onnx(no_norm)
    with pytest.raises(ValueError, match="runtime: expected one of"):
        from_onnx(no_norm, "tensorrt")
    with pytest.raises(ValueError, match="no such ONNX file"):
        adapt("missing.onnx")
    unranked = _onnx_model(lambda h: [_ln(h, "ln", "X", "Y", axis=1)], None)
    with pytest.raises(ValueError, match="axis=1 and the model does not say the rank"):
        from_onnx(unranked)


def test_cli_audits_an_onnx_file(tmp_path, two_kinds, capsys):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    one = tmp_path / "one.onnx"
    onnx.save(_onnx_model(lambda h: [_ln(h, "norm", "X", "Y")], ["b", 8]), str(one))
    code = main([str(one)])
    out = capsys.readouterr().out
    # Every check passes but large_d, which names onnxruntime's float32 error
    # growing with d (see test_onnxruntime_layer_norm_and_rms_norm_nodes_pass).
    failed = [line.split()[0] for line in out.splitlines() if "  FAIL  " in line]
    assert failed == ([] if code == 0 else ["large_d"]), out
    assert out.startswith("LayerNorm audit of onnxruntime LayerNormalization norm (float32 (its "
                          "own), eps=9.99999974737875")
    assert main([str(one), "--onnx-runtime", "reference", "--checks", "reference"]) == 0
    assert "LayerNorm audit of reference LayerNormalization" in capsys.readouterr().out
    many = tmp_path / "many.onnx"
    onnx.save(two_kinds, str(many))
    assert main([str(many), "--checks", "reference,eps,scale"]) == 0
    out = capsys.readouterr().out
    assert f"{many}: ln_1 (+1 alike)" in out and f"{many}: rms" in out
    assert "3 implementations: no check failed" in out


def test_cli_audits_a_model_file_end_to_end(tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    path = tmp_path / "m.onnx"
    onnx.save(_onnx_model(lambda h: [_ln(h, "norm", "X", "Y")], ["b", 8]), str(path))
    done = run_python(["-m", "layernorm_c", "audit", str(path), "--checks", "reference,eps"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 checks: 2 passed" in done.stdout


# -- flax ----------------------------------------------------------------------

def test_flax_layer_norms_fail_the_cancellation_check_with_fast_variance():
    pytest.importorskip("flax")
    from flax import linen, nnx

    # The whole battery once (no false alarm), a few checks for the others.
    checks = ["cancellation", "reference", "eps", "affine"]
    for module, run in ((linen.LayerNorm(), None),
                        (nnx.LayerNorm(32, rngs=nnx.Rngs(0)), checks)):
        report = LayerNormAudit(module).run(run)
        assert _failed(report) == {"cancellation"}, str(report)
        assert "E[x^2] - E[x]^2" in report["cancellation"].diagnosis
        assert "use fast variance True" in report.title and "epsilon 1e-06" in report.title
    for module in (linen.LayerNorm(use_fast_variance=False),
                   nnx.LayerNorm(32, use_fast_variance=False, rngs=nnx.Rngs(0))):
        report = LayerNormAudit(module).run(checks)
        assert report.ok, str(report)


def test_flax_module_settings_are_read():
    pytest.importorskip("flax")
    from flax import linen, nnx

    impl = adapt(linen.LayerNorm(epsilon=1e-3, use_bias=False))
    assert (impl.eps, impl.takes_weight, impl.takes_bias, impl.op) == (1e-3, True, False,
                                                                        "layer_norm")
    assert adapt(nnx.LayerNorm(16, rngs=nnx.Rngs(0))).d == 16
    with pytest.raises(ValueError, match="normalizes over axes"):
        adapt(linen.LayerNorm(reduction_axes=(-2, -1)))
    with pytest.raises(ValueError, match="is an RMSNorm"):
        LayerNormAudit(linen.RMSNorm())
    with pytest.raises(ValueError, match="is a LayerNorm"):
        RMSNormAudit(linen.LayerNorm())


def test_flax_backward_through_jax_vjp():
    pytest.importorskip("flax")
    from flax import linen, nnx

    checks = ["reference", "param_grads", "eps"]
    for module in (linen.LayerNorm(use_fast_variance=False),
                   nnx.LayerNorm(32, use_fast_variance=False, rngs=nnx.Rngs(0))):
        report = LayerNormBackwardAudit(module).run(checks)
        assert report.ok and "jax.vjp" in report.title, str(report)
    rms = RMSNormBackwardAudit(linen.RMSNorm()).run(["reference", "eps"])
    assert rms.ok, str(rms)


# -- equinox -------------------------------------------------------------------

def test_equinox_norms_pass():
    eqx = pytest.importorskip("equinox")
    module = eqx.nn.LayerNorm(48)
    report = LayerNormAudit(module).run()
    assert report.ok, str(report)
    # its weight's dtype: float32, or float64 once jax_enable_x64 is set
    own = np.dtype(module.weight.dtype).name
    assert f"({own} (its own), eps=1e-05, d=48)" in report.title
    rms = RMSNormAudit(eqx.nn.RMSNorm(48)).run()
    assert rms.ok, str(rms)
    assert "its bias held at 0" in rms.title
    no_params = adapt(eqx.nn.LayerNorm(8, use_weight=False, use_bias=False))
    assert not no_params.takes_weight and not no_params.takes_bias
    with pytest.raises(ValueError, match=r"record of shape \(4, 8\)"):
        adapt(eqx.nn.LayerNorm((4, 8)))
    back = LayerNormBackwardAudit(eqx.nn.LayerNorm(32)).run(["reference", "param_grads"])
    assert back.ok and "jax.vjp" in back.title, str(back)


# -- jax.nn.standardize -----------------------------------------------------------

def test_jax_standardize_fast_and_stable():
    jax = pytest.importorskip("jax")
    report = LayerNormAudit(jax.nn.standardize).run()
    assert {"cancellation", "float16_overflow"} <= _failed(report), str(report)
    assert report["affine"].status == "skip" and "algorithm fast" in report.title
    stable = functools.partial(jax.nn.standardize, algorithm="stable")
    report = LayerNormAudit(stable).run(["cancellation", "eps", "reference"])
    assert report.ok, str(report)
    fixed = adapt(functools.partial(jax.nn.standardize, epsilon=1e-3))
    assert fixed.eps == 1e-3 and not fixed.takes_eps


# -- keras ---------------------------------------------------------------------

def _keras():
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "jax":
        pytest.skip(f"keras runs on {keras.backend.backend()} in this process")
    return keras


def test_keras_layers_pass_on_jax():
    keras = _keras()
    report = LayerNormAudit(keras.layers.LayerNormalization()).run()
    assert report.ok, str(report)
    assert "eps=0.001" in report.title and "backend jax" in report.title
    rms = RMSNormAudit(keras.layers.RMSNormalization()).run()
    assert rms.ok, str(rms)
    with pytest.warns(UserWarning, match="rms_scaling"):
        scaled = keras.layers.LayerNormalization(rms_scaling=True)
    scaled = adapt(scaled)
    assert scaled.op == "rms_norm" and not scaled.takes_bias


def test_keras_built_layer_is_left_alone():
    keras = _keras()
    layer = keras.layers.LayerNormalization(epsilon=1e-5, center=False)
    layer.build((None, 24))
    weights = lambda: [keras.ops.convert_to_numpy(w.value) for w in layer.weights]  # noqa: E731
    before = weights()
    impl = adapt(layer)
    assert impl.d == 24 and impl.takes_weight and not impl.takes_bias
    assert LayerNormAudit(impl).run(["reference", "affine"]).ok
    assert all(np.array_equal(a, b) for a, b in zip(before, weights()))


_KERAS_TORCH = """
import json, os
os.environ["KERAS_BACKEND"] = "torch"
import keras
from layernorm_c.testing import LayerNormAudit, RMSNormAudit
ln = LayerNormAudit(keras.layers.LayerNormalization()).run()
rms = RMSNormAudit(keras.layers.RMSNormalization()).run()
print(json.dumps({"backend": keras.backend.backend(), "framework": ln.audit.impl.framework,
                  "ln": [[r.name, r.status] for r in ln],
                  "rms": [[r.name, r.status] for r in rms], "title": ln.title}))
"""


def test_keras_layers_on_torch_backend():
    pytest.importorskip("keras")
    pytest.importorskip("torch")
    done = run_python(["-c", _KERAS_TORCH], timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["backend"] == "torch" and out["framework"] == "torch"
    assert all(status in ("pass", "warn") for _, status in out["ln"] + out["rms"]), out
    assert "backend torch" in out["title"]
