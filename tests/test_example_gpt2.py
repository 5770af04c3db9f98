"""examples/gpt2_numpy.py, the GPT-2 forward pass of docs/gpt2.rst, runs in
its --small configuration: layernorm_c is a drop-in for the prototype's
NumPy layer norm and gives the same logits within float32 rounding.

The example is imported from its file, found next to this tests folder (as
in a checkout or an unpacked sdist), so the test runs against whichever
layernorm_c is installed. Nothing here looks at how fast anything was.
"""
import importlib.util
import inspect
import sys
from pathlib import Path

import numpy as np
import pytest

import layernorm_c as lnc

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "gpt2_numpy.py"


@pytest.fixture(scope="module")
def gpt2():
    assert EXAMPLE.is_file(), f"{EXAMPLE} is missing (is examples/ in the sdist?)"
    spec = importlib.util.spec_from_file_location("layernorm_c_example_gpt2", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def small(gpt2):
    cfg = gpt2.SMALL
    params = gpt2.init_params(cfg, seed=0)
    return cfg, params, gpt2.token_ids(cfg, 2, cfg.n_ctx, seed=1)


def test_the_example_uses_this_layernorm_c(gpt2):
    assert gpt2.lnc is lnc


def test_lnc_layer_norm_is_a_drop_in(gpt2):
    """Same signature as the NumPy helper, the same call forms work, and
    the body is layernorm_c's kernel, not the NumPy formula."""
    helper, drop_in = gpt2.numpy_layer_norm, gpt2.lnc_layer_norm
    assert inspect.signature(drop_in) == inspect.signature(helper)
    assert list(inspect.signature(helper).parameters) == ["x", "g", "b", "eps"]
    assert inspect.signature(helper).parameters["eps"].default == 1e-5
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 32), dtype=np.float32) * 3 + 1
    g = (1 + 0.1 * rng.standard_normal(32)).astype(np.float32)
    b = (0.1 * rng.standard_normal(32)).astype(np.float32)
    want = helper(x, g, b)
    for y in (drop_in(x, g, b), drop_in(x, g=g, b=b), drop_in(x, g, b, eps=1e-5),
              drop_in(x, **{"g": g, "b": b})):
        assert y.dtype == want.dtype and y.shape == want.shape
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    # its results are layernorm_c's, bit for bit
    assert np.array_equal(drop_in(x, g, b), lnc.layer_norm(x, g, b, eps=1e-5))
    # lnc.layer_norm itself takes the helper's positional call
    assert np.array_equal(lnc.layer_norm(x, g, b, 1e-5), drop_in(x, g, b))
    # and follows the helper's promotion (float64 x, float32 parameters)
    assert drop_in(x.astype(np.float64), g, b).dtype == helper(x.astype(np.float64), g, b).dtype


def test_initialisation_follows_gpt2(gpt2, small):
    cfg, params, _ = small
    blk = params["blocks"][0]
    assert params["wte"].shape == (cfg.n_vocab, cfg.n_embd)
    assert params["wpe"].shape == (cfg.n_ctx, cfg.n_embd)
    assert len(params["blocks"]) == cfg.n_layer
    assert blk["attn"]["c_attn"]["w"].shape == (cfg.n_embd, 3 * cfg.n_embd)
    assert blk["mlp"]["c_proj"]["w"].shape == (4 * cfg.n_embd, cfg.n_embd)
    leaves = [params["wte"], blk["ln_1"]["g"], blk["mlp"]["c_fc"]["w"]]
    assert all(a.dtype == np.float32 for a in leaves)
    assert abs(np.std(blk["mlp"]["c_fc"]["w"]) - 0.02) < 0.002
    scaled = 0.02 / np.sqrt(2 * cfg.n_layer)
    assert abs(np.std(blk["mlp"]["c_proj"]["w"]) - scaled) < 0.1 * scaled
    # perturbed around gain 1 / bias 0, so the LN parameters matter
    g = blk["ln_2"]["g"]
    assert abs(np.mean(g) - 1) < 0.05 and 0.05 < np.std(g) < 0.2
    assert np.std(blk["ln_2"]["b"]) > 0.01
    again = gpt2.init_params(cfg, seed=0)
    assert np.array_equal(again["blocks"][1]["ln_1"]["b"], params["blocks"][1]["ln_1"]["b"])
    assert not np.array_equal(gpt2.init_params(cfg, seed=1)["wte"], params["wte"])


def _forward(gpt2, cfg, params, ids, ln, promote=False):
    timed = gpt2.TimedLayerNorm(ln)
    logits = gpt2.gpt2_forward(ids, params, cfg.n_head, timed, promote)
    assert timed.calls == 2 * cfg.n_layer + 1
    return logits, timed


def test_lnc_and_numpy_forwards_agree_in_float32(gpt2, small):
    cfg, params, ids = small
    ref = gpt2.gpt2_forward(ids, gpt2.cast_params(params, np.float64), cfg.n_head)
    got = {}
    for name, ln in (("NumPy", gpt2.numpy_layer_norm), ("lnc", gpt2.lnc_layer_norm)):
        logits, timed = _forward(gpt2, cfg, params, ids, ln)
        assert logits.shape == (*ids.shape, cfg.n_vocab) and logits.dtype == np.float32
        assert np.isfinite(logits).all()
        assert set(timed.dtypes) == {("float32", "float32")}, timed.dtypes
        got[name] = logits
    scale = np.max(np.abs(ref))
    assert scale > 0.1  # the logits are not trivially small
    # float32 rounding through 2 blocks: both are ~1e-6 of the logits' scale
    np.testing.assert_allclose(got["lnc"], got["NumPy"], rtol=0, atol=2e-5 * scale)
    for logits in got.values():
        np.testing.assert_allclose(logits, ref, rtol=0, atol=2e-5 * scale)
    assert not np.array_equal(got["lnc"], got["NumPy"])  # two implementations ran


def test_mixed_mode_promotes_the_residual_stream(gpt2, small):
    """The prototypes' np.sqrt scale and float64 mask turn the activations
    float64 after the first attention; the float32 parameters stay."""
    cfg, params, ids = small
    lnc_logits, timed = _forward(gpt2, cfg, params, ids, gpt2.lnc_layer_norm, promote=True)
    assert timed.dtypes[("float32", "float32")] == 1
    assert timed.dtypes[("float64", "float32")] == 2 * cfg.n_layer
    np_logits, _ = _forward(gpt2, cfg, params, ids, gpt2.numpy_layer_norm, promote=True)
    assert lnc_logits.dtype == np_logits.dtype == np.float64
    assert np.isfinite(lnc_logits).all()
    np.testing.assert_allclose(lnc_logits, np_logits, rtol=0,
                               atol=2e-5 * np.max(np.abs(np_logits)))


def test_bench_runs_in_the_small_config(gpt2, tmp_path, capsys):
    """--bench --small produces every table (values are not checked: they
    are timings and rounding differences)."""
    rst = tmp_path / "gpt2_results.inc"
    assert gpt2.main(["--small", "--bench", "--cases", "1x8,2x16", "--repeats", "1",
                      "--rst", str(rst)]) == 0
    out = capsys.readouterr().out
    text = rst.read_text(encoding="utf-8")
    for table in ("Layer-norm time per forward", "Whole forward pass", "Logits:",
                  "Layer-norm calls:"):
        assert table in out and table in text
    assert text.count(".. list-table::") == 4
    for mode in gpt2.MODES:
        assert f"     - {mode}" in text
    assert "x float64, g float32" in text  # the mixed mode's calls
    assert "NumPy " + np.__version__ in text and "layernorm_c " + lnc.__version__ in text


def test_demo_runs(gpt2, capsys):
    assert gpt2.main(["--small", "--cases", "1x8"]) == 0
    assert "lnc vs NumPy" in capsys.readouterr().out
