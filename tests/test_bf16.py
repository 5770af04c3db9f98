"""bfloat16 through ml_dtypes: the loops registered once ml_dtypes is
imported (before or after layernorm_c), computed in
float32 with float64 totals and rounded once (to nearest even), never
overflowing, reproducible; mixed with float32 parameters; the backward
passes, RMSNorm and the layers; and nothing changes without ml_dtypes."""
import numpy as np
import pytest

import layernorm_c as lnc
from cases import BLOCK, F16, F32, F64, LANES, LAYOUTS
from core_strategies import assert_same_bits
from subprocess_support import run_python

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)


def _batch(n=300, d=200, seed=0, offset=3.0):
    rng = np.random.default_rng(seed)
    x = (offset + 2 * rng.standard_normal((n, d))).astype(BF16)
    dy = rng.standard_normal((n, d)).astype(BF16)
    w = rng.uniform(0.5, 2, d).astype(BF16)
    b = rng.standard_normal(d).astype(BF16)
    return x, dy, w, b


def _f32(*arrays):
    return [None if a is None else a.astype(F32) for a in arrays]


def test_the_loops_are_registered():
    x, _, w, b = _batch(4, 8)
    for uf, args in ((lnc.layer_norm_ufunc, (x, w, b, 1e-5)), (lnc.rms_norm_ufunc, (x, w, 1e-6)),
                     (lnc.layer_norm_backward_ufunc, (x, x, w, 1e-5)),
                     (lnc.rms_norm_backward_ufunc, (x, x, w, 1e-6))):
        assert uf(*args).dtype == BF16, uf.__name__


@pytest.mark.parametrize("op,params", [("layer_norm", "none"), ("layer_norm", "w"),
                                       ("layer_norm", "wb"), ("rms_norm", "none"),
                                       ("rms_norm", "w")])
def test_computed_in_float32_and_rounded_once(op, params):
    """The bfloat16 result is the float32 computation of the same values
    rounded once to nearest even: bit for bit what lnc computes from the
    widened values, cast by ml_dtypes."""
    x, _, w, b = _batch()
    w = None if params == "none" else w
    b = None if params != "wb" else b
    if op == "layer_norm":
        got = lnc.layer_norm(x, w, b, return_stats=True)
        want = lnc.layer_norm(*_f32(x, w, b), return_stats=True)
        stats = ("mean", "var")
    else:
        got = lnc.rms_norm(x, w, return_stats=True)
        want = lnc.rms_norm(*_f32(x, w), return_stats=True)
        stats = ("ms",)
    assert got.y.dtype == BF16
    assert_same_bits(got.y, want.y.astype(BF16), "y")
    for name in stats:
        assert getattr(got, name).dtype == F32
        assert_same_bits(getattr(got, name), getattr(want, name), name)


def test_worked_examples():
    for ex in lnc._cases.WORKED_EXAMPLES:
        y = lnc.layer_norm(np.array(ex.row, BF16), eps=0.0)
        np.testing.assert_allclose(y.astype(F64), ex.y, rtol=2.0 ** -8, atol=1e-4)


def test_accuracy_against_the_float64_reference():
    """Rounded once: within bfloat16's unit roundoff (2^-8 relative, 8 bits
    of precision) of the float64 reference, plus float32's share."""
    x, _, w, b = _batch(offset=100.0)
    for y, ref in ((lnc.layer_norm(x, w, b), lnc.reference_layer_norm(x, w, b).y),
                   (lnc.rms_norm(x, w), lnc.reference_rms_norm(x, w).y)):
        err = np.abs(y.astype(F64) - ref)
        assert np.all(err <= 2.0 ** -8 * np.abs(ref) + 1e-5 * (1 + np.abs(ref).max()))


@pytest.mark.parametrize("value", [1e38, 3e38, 1e-38, 1e-39])
def test_never_overflows(value):
    """bfloat16 has float32's range: squares of its large values overflow
    float32, and the kernels rescale such records."""
    rng = np.random.default_rng(1)
    x = (value * rng.uniform(0.1, 1.0, (3, 64))).astype(BF16)
    y = lnc.layer_norm(x, eps=0.0)
    ref = lnc.reference_layer_norm(x, eps=0.0).y
    assert np.isfinite(y.astype(F32)).all()
    np.testing.assert_allclose(y.astype(F64), ref, atol=2.0 ** -8 * (1 + np.abs(ref).max()))
    r = lnc.rms_norm(x, eps=0.0)
    assert np.isfinite(r.astype(F32)).all()
    np.testing.assert_allclose(r.astype(F64), lnc.reference_rms_norm(x, eps=0.0).y,
                               rtol=2.0 ** -8)


def test_non_finite_values_stay_in_their_record():
    x, _, w, b = _batch(6, 40)
    clean = lnc.layer_norm(x, w, b)
    x[2, 3] = np.inf
    x[4, 0] = np.nan
    y = lnc.layer_norm(x, w, b)
    assert np.isnan(y[[2, 4]].astype(F32)).all()
    keep = [0, 1, 3, 5]
    assert_same_bits(y[keep], clean[keep])


def test_nan_records_of_the_backward_and_of_constant_records(restore_settings):
    """The records the kernels write as all-NaN without computing them (a
    constant record with eps = 0; a backward record whose x holds a NaN)
    are the float32 result rounded, on every level, and stay in their
    record."""
    x, dy, w, b = _batch(8, 40)
    x[3] = x[3, 0]       # constant: var + eps == 0
    xb = x.copy()
    xb[5, 7] = np.nan    # the backward's NaN record
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        y = lnc.layer_norm(x, w, b, eps=0.0)
        assert_same_bits(y, lnc.layer_norm(*_f32(x, w, b), eps=0.0).astype(BF16), isa)
        assert np.isnan(y[3].astype(F32)).all() and not np.isnan(np.delete(y, 3, 0).astype(F32)).any()
        g = lnc.layer_norm_backward(dy, xb, w)
        want = lnc.layer_norm_backward(*_f32(dy, xb, w))
        assert_same_bits(g.dx, want.dx.astype(BF16), f"dx {isa}")
        assert np.isnan(g.dx[5].astype(F32)).all()
        assert not np.isnan(np.delete(g.dx, 5, 0).astype(F32)).any()


def test_mixed_with_float32_parameters():
    x, dy, w, b = _batch()
    y = lnc.layer_norm(x, w.astype(F32), b)
    assert y.dtype == F32
    assert_same_bits(y, lnc.layer_norm(*_f32(x, w, b)))
    g = lnc.layer_norm_backward(dy, x, w.astype(F32))
    assert g.dx.dtype == F32
    assert_same_bits(g.dx, lnc.layer_norm_backward(*_f32(dy, x, w)).dx)
    assert lnc.rms_norm(x, w.astype(F64)).dtype == F64


def test_with_float16_promotes_to_float32():
    """NumPy has no common type of float16 and bfloat16; like PyTorch,
    layernorm_c computes such a call in float32 (each converts exactly)."""
    x, _, w, _ = _batch(10, 16)
    y = lnc.layer_norm(x, w.astype(F16))
    assert y.dtype == F32
    assert_same_bits(y, lnc.layer_norm(x.astype(F32), w.astype(F16).astype(F32)))
    y16 = lnc.rms_norm(x.astype(F16), w)
    assert y16.dtype == F32


def test_reproducible_across_levels_threads_and_layouts(restore_settings):
    x, dy, w, b = _batch(1500, 96)
    want = None
    for isa in lnc.supported_isas():
        for threads in (1, 2):
            lnc.set_isa(isa)
            lnc.set_num_threads(threads)
            got = (lnc.layer_norm(x, w, b), lnc.rms_norm(x, w),
                   lnc.layer_norm_backward(dy, x, w), lnc.rms_norm_backward(dy, x, w))
            if want is None:
                want = got
                continue
            assert_same_bits(got[0], want[0], f"layer_norm ({isa}, {threads})")
            assert_same_bits(got[1], want[1], f"rms_norm ({isa}, {threads})")
            for name in ("dx", "dweight", "dbias"):
                assert_same_bits(getattr(got[2], name), getattr(want[2], name), name)
            assert_same_bits(got[3].dx, want[3].dx, "rms dx")
    for layout in ("fortran", "odd_offset", "misaligned", "col_strided", "reversed",
                   "transposed", "readonly"):
        xl = LAYOUTS[layout](x)
        assert_same_bits(np.ascontiguousarray(lnc.layer_norm(xl, w, b)), want[0], layout)
        assert_same_bits(np.ascontiguousarray(lnc.rms_norm(xl, w)), want[1], layout)


def test_every_level_matches_scalar_on_the_forward_tails(restore_settings):
    """Every record width up to four lane rows, and around the statistics'
    blocks: the levels' own loops (the x86 levels' 256-bit statistics read
    bfloat16 lanes in another register layout than the natural one, and
    partial lane rows at the end) give the scalar level's bits, for the
    one-pass statistics of long records and their two-pass fallback (a
    large offset)."""
    rng = np.random.default_rng(21)
    widths = list(range(1, 4 * LANES + 3)) + [BLOCK - 1, BLOCK + 7, 2 * BLOCK + LANES + 5]
    for d in widths:
        for offset in (0.0, 300.0):
            x = (offset + rng.standard_normal((3, d))).astype(BF16)
            w = rng.uniform(0.5, 2, d).astype(BF16)
            b = rng.standard_normal(d).astype(BF16)
            lnc.set_isa("scalar")
            want = (lnc.layer_norm(x, w, b, return_stats=True), lnc.rms_norm(x, w, return_stats=True))
            for isa in lnc.supported_isas()[1:]:
                lnc.set_isa(isa)
                got = (lnc.layer_norm(x, w, b, return_stats=True), lnc.rms_norm(x, w, return_stats=True))
                for g, e, name in zip(got[0] + got[1], want[0] + want[1],
                                      ("y", "mean", "var", "rms y", "ms")):
                    assert_same_bits(g, e, f"{name} ({isa}, d={d}, offset {offset})")


def test_rounding_of_subnormal_infinite_and_nan_outputs_on_every_level(restore_settings):
    """Outputs that are subnormal floats, infinities and NaNs round as
    ml_dtypes rounds the float32 result, on every level: the AVX-512
    level's conversion instruction flushes subnormal floats to zero, so
    its vectors holding one must take the integer rounding, while vectors
    of normal values, infinities and NaNs beside them need not."""
    rng = np.random.default_rng(7)
    n, d = 64, 96
    x = rng.standard_normal((n, d)).astype(BF16)
    x[5, 3] = np.nan  # a NaN record
    mag = np.concatenate([10.0 ** rng.uniform(-40, -38, 32),  # subnormal y
                          10.0 ** rng.uniform(-37, 2, 32),
                          10.0 ** rng.uniform(37, 38.5, 32)])  # y overflows
    w = (mag * rng.choice([-1.0, 1.0], d)).astype(BF16)
    b = np.zeros(d, BF16)
    b[40] = np.inf
    want = lnc.layer_norm(*_f32(x, w, b), eps=1e-3)
    yf = want.astype(F32)
    assert (np.abs(yf[np.isfinite(yf)]) < np.finfo(F32).tiny).sum() > 20 * n
    assert np.isinf(yf).any() and np.isnan(yf).any()
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        got = lnc.layer_norm(x, w, b, eps=1e-3)
        assert_same_bits(got, want.astype(BF16), isa)
        rms = lnc.rms_norm(x, w, eps=1e-3)
        assert_same_bits(rms, lnc.rms_norm(*_f32(x, w), eps=1e-3).astype(BF16), f"rms {isa}")


@pytest.mark.parametrize("d", [8, 16, 32, 64])
def test_subnormal_outputs_of_short_records_on_every_level(restore_settings, d):
    """The short records' loops store bfloat16 outputs eight or sixteen
    at a time; a vector holding a subnormal float must still round as
    ml_dtypes does (not flushed to zero by the conversion instruction)."""
    rng = np.random.default_rng(d)
    x = rng.standard_normal((512, d)).astype(BF16)
    w = (10.0 ** rng.uniform(-40, -37, d) * rng.choice([-1.0, 1.0], d)).astype(BF16)
    b = np.zeros(d, BF16)
    want = lnc.layer_norm(*_f32(x, w, b)).astype(BF16)
    assert (np.abs(want.astype(F32)) < np.finfo(F32).tiny).sum() > x.size // 4
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        assert_same_bits(lnc.layer_norm(x, w, b), want, f"{isa}, d={d}")


def test_a_record_alone_or_in_a_batch():
    x, _, w, b = _batch(50, 130)
    full = lnc.layer_norm(x, w, b)
    for i in (0, 31, 49):
        assert_same_bits(lnc.layer_norm(x[i], w, b), full[i], f"record {i}")


def test_backward_passes():
    x, dy, w, _ = _batch(64, 48)
    g = lnc.layer_norm_backward(dy, x, w)
    want = lnc.layer_norm_backward(*_f32(dy, x, w))
    assert g.dx.dtype == BF16 and g.dweight.dtype == F32
    assert_same_bits(g.dx, want.dx.astype(BF16), "dx")
    assert_same_bits(g.dweight, want.dweight, "dweight")
    assert_same_bits(g.dbias, want.dbias, "dbias")
    r = lnc.rms_norm_backward(dy, x, w, convention="1+weight")
    rw = lnc.rms_norm_backward(*_f32(dy, x, w), convention="1+weight")
    assert_same_bits(r.dx, rw.dx.astype(BF16), "rms dx")
    assert_same_bits(r.dweight, rw.dweight, "rms dweight")


def test_gemma_scale_in_float32():
    x, _, w, _ = _batch(20, 32)
    w = (w.astype(F32) - 1).astype(BF16)
    want = lnc.rms_norm(x.astype(F32), w.astype(F32) + np.float32(1)).astype(BF16)
    assert_same_bits(lnc.rms_norm(x, w, convention="1+weight"), want)


def test_layers_in_bfloat16():
    x, dy, _, _ = _batch(16, 8)
    for layer in (lnc.LayerNorm(8, dtype=BF16), lnc.RMSNorm(8, dtype=BF16)):
        assert layer.weight.dtype == BF16
        y = layer(x)
        assert y.dtype == BF16
        layer.backward(dy)
        assert layer.grad_weight.dtype == BF16


def test_out_and_errors():
    x, _, w, b = _batch(4, 8)
    out = np.empty(x.shape, BF16)
    assert lnc.layer_norm(x, w, b, out=out) is out
    with pytest.raises(TypeError, match=r"^out: expected dtype bfloat16 \(the result dtype\), "
                                         r"got float16"):
        lnc.layer_norm(x, out=np.empty(x.shape, F16))
    with pytest.raises(TypeError, match=r"^out: expected dtype float32"):
        lnc.layer_norm(x.astype(F32), out=np.empty(x.shape, BF16))


def test_inputs_are_not_modified():
    x, dy, w, b = _batch(20, 30)
    copies = [a.copy() for a in (x, dy, w, b)]
    lnc.layer_norm(x, w, b)
    lnc.rms_norm_backward(dy, x, w)
    for a, c in zip((x, dy, w, b), copies):
        assert_same_bits(a, c)


def _child_output(code):
    """What a fresh interpreter running code prints (it must succeed)."""
    proc = run_python(["-c", code])
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("first", ["layernorm_c", "ml_dtypes"])
def test_the_loops_come_with_ml_dtypes_imported_before_or_after(first):
    """import layernorm_c does not import ml_dtypes (1.2 s here); the
    gufuncs take bfloat16 as soon as ml_dtypes is imported, in either
    order, and registering twice does nothing."""
    second = "ml_dtypes" if first == "layernorm_c" else "layernorm_c"
    code = (
        f"import sys, numpy as np\n"
        f"import {first}\n"
        f"print('ml_dtypes' in sys.modules)\n"
        f"import {second}\n"
        "import layernorm_c as lnc, ml_dtypes\n"
        "from layernorm_c import _bf16\n"
        "x = np.array([[1, 2, 3, 4]], np.float32).astype(ml_dtypes.bfloat16)\n"
        "y = lnc.layer_norm_ufunc(x, np.ones(4, x.dtype), np.zeros(4, x.dtype), 0.0)\n"
        "assert _bf16.register() == x.dtype\n"
        "print(y.dtype, y.astype(np.float32)[0].tolist())\n"
    )
    imported, result = _child_output(code).splitlines()
    assert imported == str(first == "ml_dtypes")
    assert result == "bfloat16 [-1.34375, -0.447265625, 0.447265625, 1.34375]"


def test_without_ml_dtypes_nothing_changes():
    """With ml_dtypes unimportable, layernorm_c imports, registers nothing
    and computes as before."""
    code = (
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "import numpy as np, layernorm_c as lnc\n"
        "from layernorm_c import _bf16\n"
        "assert _bf16.BFLOAT16 is None\n"
        "assert len(lnc.layer_norm_ufunc.types) == 3, lnc.layer_norm_ufunc.types\n"
        "print(lnc.layer_norm(np.array([1.0, 2.0, 3.0, 4.0]), eps=0.0)[0])\n"
    )
    assert _child_output(code) == "-1.3416407864998738"
