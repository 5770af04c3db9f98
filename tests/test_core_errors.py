"""Edge cases and every kind of bad input: clear TypeError/ValueError naming
the argument, what was expected and what was given; nothing written."""
import fractions
import re

import numpy as np
import pytest

import layernorm_c as lnc
from cases import F64, Y_TOL

AxisError = getattr(getattr(np, "exceptions", np), "AxisError")  # NumPy < 1.25: np.AxisError

X = np.arange(12, dtype=np.float64).reshape(3, 4)

UNSUPPORTED = [
    (np.array([1 + 2j, 3j], np.complex64), "complex64"),
    (np.array([1 + 2j, 3j], np.complex128), "complex128"),
    (np.array([1.0, 2.0], dtype=object), "object"),
    (np.array(["a", "b"]), "<U1"),
    (np.array([b"a", b"b"]), "|S1"),
    (np.array(["2020-01-01", "2021-01-01"], "datetime64[D]"), "datetime64"),
    (np.array([1, 2], "timedelta64[s]"), "timedelta64"),
    (np.zeros(2, [("a", "f8"), ("b", "f8")]), r"\[\('a'"),
]
if np.dtype(np.longdouble).itemsize > 8:
    UNSUPPORTED.append((np.array([1.0, 2.0], np.longdouble), "float128"))
UNSUPPORTED_IDS = [str(a.dtype) for a, _ in UNSUPPORTED]


# ------------------------------------------------------------ x

def test_0d_input():
    for x in (np.float64(3.0), np.array(3.0), 3.0):
        with pytest.raises(ValueError, match=r"^x: expected an array with at least 1 "
                                             r"dimension, got a 0-d array"):
            lnc.layer_norm(x)


@pytest.mark.parametrize("shape, axis", [((3, 0), -1), ((0,), -1), ((0, 4), 0),
                                         ((2, 3, 0), (1, 2))])
def test_normalized_length_zero(shape, axis):
    with pytest.raises(ValueError, match=r"^x: expected normalized axes of nonzero "
                                         r"length, got shape \(.*\) normalized over axis"):
        lnc.layer_norm(np.zeros(shape), axis=axis)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32"])
@pytest.mark.parametrize("shape", [(0, 5), (2, 0, 5)])
def test_empty_batch_gives_empty_result(dtype, shape):
    x = np.zeros(shape, dtype)
    w = np.ones(5, dtype)
    y, mean, var = lnc.layer_norm(x, w, w, return_stats=True)
    want = np.float64 if dtype == "int32" else dtype
    assert y.shape == shape and y.dtype == want
    assert mean.shape == var.shape == shape[:-1]
    assert mean.dtype == (np.float32 if dtype == "float16" else want)
    assert lnc.layer_norm(x).shape == shape


@pytest.mark.parametrize("bad, dtype", UNSUPPORTED, ids=UNSUPPORTED_IDS)
def test_unsupported_x_dtype(bad, dtype):
    with pytest.raises(TypeError, match=rf"^x: expected a real array: float16, float32 or "
                                        rf"float64 .*got dtype {dtype}"):
        lnc.layer_norm(bad)


def test_unconvertible_x():
    with pytest.raises((ValueError, TypeError), match=r"^x: expected"):
        lnc.layer_norm([[1.0, 2.0], [3.0]])


def test_x_none():
    with pytest.raises(TypeError, match=r"^x: expected array_like, got None$"):
        lnc.layer_norm(None)


class _PickyError(TypeError):
    """Like JAX's TracerArrayConversionError: its constructor takes another
    argument than a message, so ``type(exc)(message)`` cannot rebuild it."""

    def __init__(self, tracer):
        super().__init__(f"cannot convert {tracer.name} to a NumPy array")


class _Tracer:
    name = "Traced<ShapedArray(float32[4])>"

    def __array__(self, dtype=None, copy=None):
        raise _PickyError(self)


class _BadValues:
    def __array__(self, dtype=None, copy=None):
        raise ValueError("no values here")


def test_conversion_errors_are_our_own_with_the_cause_chained():
    with pytest.raises(TypeError, match=r"^x: expected array_like, got _Tracer that could "
                                        r"not be converted to a NumPy array \(_PickyError: "
                                        r"cannot convert Traced") as info:
        lnc.layer_norm(_Tracer())
    assert type(info.value) is TypeError
    assert isinstance(info.value.__cause__, _PickyError)
    with pytest.raises(ValueError, match=r"^weight: expected array_like.*no values here") as info:
        lnc.layer_norm(X, _BadValues())
    assert type(info.value) is ValueError


@pytest.mark.parametrize("name", ["x", "weight", "bias"])
def test_masked_arrays_are_refused_with_a_way_forward(name):
    m = np.ma.masked_array(np.ones(4), mask=[0, 1, 0, 0])
    args = {"x": X, "weight": None, "bias": None}
    args[name] = m if name != "x" else np.ma.masked_array(X, mask=X > 5)
    with pytest.raises(TypeError, match=rf"^{name}: masked arrays are not supported.*"
                                        rf"np\.ma\.filled\({name}.*{name}\.data"):
        lnc.layer_norm(args["x"], args["weight"], args["bias"])


def test_masked_out_is_refused():
    out = np.ma.masked_array(np.zeros_like(X))
    with pytest.raises(TypeError, match=r"^out: expected a numpy.ndarray, got a masked array"):
        lnc.layer_norm(X, out=out)


@pytest.mark.parametrize("flag", ["no", 1, 0, None, 1.0, np.array([True])])
def test_return_stats_must_be_a_bool(flag):
    with pytest.raises(TypeError, match=r"^return_stats: expected a bool, got"):
        lnc.layer_norm(X, return_stats=flag)


def test_return_stats_accepts_numpy_bools():
    assert isinstance(lnc.layer_norm(X, return_stats=np.True_), lnc.LayerNormResult)
    assert isinstance(lnc.layer_norm(X, return_stats=np.False_), np.ndarray)


# ------------------------------------------------------------ weight, bias

@pytest.mark.parametrize("name", ["weight", "bias"])
@pytest.mark.parametrize("bad, dtype", UNSUPPORTED, ids=UNSUPPORTED_IDS)
def test_unsupported_param_dtype(name, bad, dtype):
    x = np.zeros((3, 2))
    with pytest.raises(TypeError, match=rf"^{name}: expected a real array.*got dtype {dtype}"):
        lnc.layer_norm(x, **{name: bad})


@pytest.mark.parametrize("name", ["weight", "bias"])
@pytest.mark.parametrize("shape", [(5,), (3,), (4, 1), (2, 4), (1, 3), (3, 4)])
def test_param_wrong_shape(name, shape):
    msg = (f"{name}: expected shape (4,) (the normalized axes of x) or a shape that "
           f"broadcasts to it, got shape {shape}")
    with pytest.raises(ValueError, match="^" + re.escape(msg)):
        lnc.layer_norm(X, **{name: np.ones(shape)})


@pytest.mark.parametrize("name", ["weight", "bias"])
def test_param_shape_follows_axis(name):
    x = np.zeros((2, 3, 4))
    lnc.layer_norm(x, **{name: np.ones((2, 4))}, axis=(0, 2))   # fine
    with pytest.raises(ValueError, match=rf"^{name}: expected shape \(2, 4\).*got shape \(8,\)"):
        lnc.layer_norm(x, **{name: np.ones(8)}, axis=(0, 2))
    with pytest.raises(ValueError, match=rf"^{name}: expected shape \(3,\).*got shape \(4,\)"):
        lnc.layer_norm(x, **{name: np.ones(4)}, axis=1)


# ------------------------------------------------------------ eps

@pytest.mark.parametrize("eps", [-1e-5, -0.5, float("nan"), float("inf"), float("-inf"),
                                 np.float32(-1), np.float64("nan"), np.array(-1.0)])
def test_eps_out_of_range(eps):
    with pytest.raises(ValueError, match=r"^eps: expected a finite number >= 0, got"):
        lnc.layer_norm(X, eps=eps)


@pytest.mark.parametrize("eps", [1e-5j, 1 + 0j, "1e-5", None, [1e-5], np.array([1e-5]),
                                 np.complex64(1), object()])
def test_eps_not_a_real_number(eps):
    with pytest.raises(TypeError, match=r"^eps: expected a real number, got"):
        lnc.layer_norm(X, eps=eps)


def test_eps_too_large_for_a_float_is_a_clear_value_error():
    """A Python int beyond the float range is not a finite float64 eps: it
    must be reported as a bad eps, like inf, not as an OverflowError from
    inside the wrapper without the argument's name, and in a short message
    (not 400 digits)."""
    with pytest.raises(ValueError, match=r"^eps: expected a finite number >= 0, got "
                                         r"1000.*\(401 characters\)$") as info:
        lnc.layer_norm(X, eps=10 ** 400)
    assert len(str(info.value)) < 120


@pytest.mark.parametrize("eps", [0, 0.0, 1, np.float16(0.001), np.float32(1e-5),
                                 np.int64(0), np.array(1e-3), fractions.Fraction(1, 1000)])
def test_eps_accepted_forms(eps):
    want = lnc.reference_layer_norm(X, eps=float(eps)).y
    np.testing.assert_allclose(lnc.layer_norm(X, eps=eps), want, rtol=Y_TOL[F64],
                               atol=Y_TOL[F64])


# ------------------------------------------------------------ out

def test_out_wrong_shape():
    for shape in [(4, 3), (3, 5), (12,), (1, 3, 4)]:
        with pytest.raises(ValueError, match=rf"^out: expected shape \(3, 4\) \(the shape "
                                             rf"of x\), got \({shape[0]},"):
            lnc.layer_norm(X, out=np.empty(shape))


@pytest.mark.parametrize("x_dtype, out_dtype", [
    ("float64", "float32"), ("float32", "float64"), ("float16", "float32"),
    ("float32", "float16"), ("float64", "int64"), ("float32", "int32"),
    ("float64", "complex128"), ("int32", "float32"), ("float64", "object")])
def test_out_wrong_dtype(x_dtype, out_dtype):
    want = "float64" if x_dtype == "int32" else x_dtype
    with pytest.raises(TypeError, match=rf"^out: expected dtype {want} \(the result dtype\), "
                                        rf"got {out_dtype}"):
        lnc.layer_norm(X.astype(x_dtype), out=np.empty(X.shape, out_dtype))


def test_out_read_only():
    out = np.empty_like(X)
    out.flags.writeable = False
    with pytest.raises(ValueError, match=r"^out: expected a writeable array, got a read-only"):
        lnc.layer_norm(X, out=out)


@pytest.mark.parametrize("out", [[[0.0] * 4] * 3, (1.0,), 3.0, np.float64(0.0)])
def test_out_not_an_ndarray(out):
    with pytest.raises(TypeError, match=r"^out: expected a numpy.ndarray, got"):
        lnc.layer_norm(X, out=out)


def test_failed_call_writes_nothing_to_out():
    out = np.full_like(X, 7.0)
    for kwargs in [dict(eps=-1.0), dict(weight=np.ones(5)), dict(bias=np.ones(2)),
                   dict(axis=5), dict(eps="x")]:
        with pytest.raises((TypeError, ValueError)):
            lnc.layer_norm(X, out=out, **kwargs)
        assert np.all(out == 7.0)


# ------------------------------------------------------------ axis

@pytest.mark.parametrize("axis", [2, -3, (0, 2), (5,)])
def test_axis_out_of_range(axis):
    with pytest.raises(AxisError, match=r"^axis: -?\d+ is out of bounds for x "
                                                      r"with 2 dimension\(s\)"):
        lnc.layer_norm(X, axis=axis)
    with pytest.raises(ValueError):      # AxisError is a ValueError
        lnc.layer_norm(X, axis=axis)


@pytest.mark.parametrize("axis", [(1, 1), (0, -2), (1, -1, 0)])
def test_repeated_axis(axis):
    with pytest.raises(ValueError, match=r"^axis: repeated axis in"):
        lnc.layer_norm(X, axis=axis)


def test_empty_axis_tuple():
    with pytest.raises(ValueError, match=r"^axis: expected at least one axis to normalize "
                                         r"over, got \(\)"):
        lnc.layer_norm(X, axis=())


@pytest.mark.parametrize("axis", [1.0, "1", None, True, (0, 1.5), (True,)])
def test_axis_wrong_type(axis):
    with pytest.raises(TypeError, match=r"^axis: expected an int or a tuple of ints, got"):
        lnc.layer_norm(X, axis=axis)


def test_axis_accepted_forms():
    want = lnc.layer_norm(X.T.copy(), axis=-1).T
    for axis in (0, -2, np.int64(0), [0], (0,), (-2,)):
        np.testing.assert_array_equal(lnc.layer_norm(X, axis=axis), want)


# ------------------------------------------------------------ settings

def test_set_isa_rejects_unknown_names(restore_settings):
    with pytest.raises(ValueError, match=r"^isa: expected one of 'scalar', 'portable', "
                                         r"'avx2', 'avx512', got 'sse9'"):
        lnc.set_isa("sse9")
    with pytest.raises(TypeError, match=r"^name: expected a str, got int"):
        lnc.set_isa(2)
    assert lnc.get_isa() in lnc.supported_isas()


@pytest.mark.parametrize("n, exc", [(0, ValueError), (-1, ValueError),
                                    (lnc.MAX_THREADS + 1, ValueError), (1025, ValueError),
                                    (1.5, TypeError), ("2", TypeError), (True, TypeError)])
def test_set_num_threads_rejects_bad_counts(restore_settings, n, exc):
    before = lnc.get_num_threads()
    with pytest.raises(exc, match=r"^n: expected"):
        lnc.set_num_threads(n)
    assert lnc.get_num_threads() == before


def test_the_documented_thread_range_is_the_real_one(restore_settings):
    """1..MAX_THREADS is accepted and kept as given (not silently capped)."""
    assert lnc.MAX_THREADS == 256
    lnc.set_num_threads(lnc.MAX_THREADS)
    assert lnc.get_num_threads() == lnc.MAX_THREADS
    with pytest.raises(ValueError, match=rf"^n: expected a thread count from 1 to "
                                         rf"{lnc.MAX_THREADS}, got {lnc.MAX_THREADS + 1}"):
        lnc.set_num_threads(lnc.MAX_THREADS + 1)
