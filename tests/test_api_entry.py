"""layer_norm and rms_norm are C entry points (``_core._entry``) in front of
their Python implementations: the common call runs in C, every other call
reaches the implementation as made. Whichever way a call goes, the result
is the implementation's, bit for bit, and the entry looks like the
function it stands for (name, docstring, signature, pickling, binding)."""
import inspect
import pickle

import numpy as np
import pytest

import layernorm_c as lnc
from core_strategies import assert_same_bits
from layernorm_c import _core

ENTRIES = {"layer_norm": lnc.layer_norm, "rms_norm": lnc.rms_norm}
RESULTS = {"layer_norm": lnc.LayerNormResult, "rms_norm": lnc.RMSNormResult}


def impl(name):
    """The Python implementation behind an entry."""
    return ENTRIES[name].__wrapped__


@pytest.mark.parametrize("name", ENTRIES)
def test_entry_knows_the_python_signature(name):
    """The C parameter table is the signature's, names and order: a
    parameter added in Python only would silently take the slow path, one
    renamed would mis-assign a keyword."""
    params = tuple(inspect.signature(impl(name)).parameters)
    assert _core._entry_params(name) == params
    kinds = [p.kind for p in inspect.signature(impl(name)).parameters.values()]
    n_pos = kinds.count(inspect.Parameter.POSITIONAL_OR_KEYWORD)
    assert kinds == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * n_pos + \
        [inspect.Parameter.KEYWORD_ONLY] * (len(kinds) - n_pos)


@pytest.mark.parametrize("name", ENTRIES)
def test_entry_looks_like_its_function(name):
    f = ENTRIES[name]
    assert f.__name__ == name and f.__qualname__ == name
    assert f.__module__ == impl(name).__module__
    assert f.__doc__ == impl(name).__doc__ and "Parameters" in f.__doc__
    assert inspect.signature(f) == inspect.signature(impl(name))
    assert pickle.loads(pickle.dumps(f)) is f

    class Holder:
        method = f  # bound as a function is: the instance comes first

    with pytest.raises(TypeError, match="x"):
        Holder().method()  # the holder is x: not an array of floats


X = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)
W = np.linspace(0.5, 1.5, 7, dtype=np.float32)
B = np.linspace(-0.2, 0.2, 7, dtype=np.float32)


def ln_calls(out):
    """layer_norm calls, fast and not: (args, kwargs)."""
    return [((X,), {}), ((X, W), {}), ((X, W, B), {}), ((X, W, B, 1e-3), {}),
            ((X,), {"weight": W, "bias": B, "eps": 0.0}), ((X, None, B), {"eps": 1e-2}),
            ((X, W, B), {"axis": -1}), ((X, W, B), {"axis": 1}), ((X, W, B), {"axis": (-1,)}),
            ((X, W, B), {"out": out}), ((X, W, B), {"return_stats": True}),
            ((X, W, B), {"return_stats": True, "out": out}), ((X, W, B), {"eps": 1}),
            ((X.T, W[:3], B[:3]), {}), ((X.tolist(), W, B), {}), ((X.astype(np.float64), W), {}),
            ((X, W.astype(np.float16), B), {}), ((X, 2.0, 0.5), {}),
            ((X, W), {"bias": B})]


def rms_calls(out):
    return [((X,), {}), ((X, W), {}), ((X, W, 1e-3), {}), ((X,), {"weight": W, "eps": 0.0}),
            ((X, W), {"axis": -1}), ((X, W), {"axis": 1}), ((X, W), {"out": out}),
            ((X, W), {"return_stats": True}), ((X, W), {"convention": "weight"}),
            ((X, W), {"convention": "1+weight"}), ((X, W), {"convention": "1+weight",
                                                            "return_stats": True}),
            ((X.T, W[:3]), {}), ((X.tolist(), W), {}), ((X, W.astype(np.float64)), {})]


CALLS = {"layer_norm": ln_calls, "rms_norm": rms_calls}
AXIS_ERROR = getattr(np, "exceptions", np).AxisError  # np.AxisError before NumPy 1.25


def same_result(a, b):
    assert type(a) is type(b)
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            assert_same_bits(u, v)
    else:
        assert_same_bits(a, b)


@pytest.mark.parametrize("name", ENTRIES)
def test_every_call_gives_the_implementations_result(name):
    """Fast or handed on, each call returns what the Python function returns:
    the same type (the named tuple with the statistics) and bits; out= is
    the array returned."""
    out_e, out_i = np.empty_like(X), np.empty_like(X)
    for (args, kw), (args_i, kw_i) in zip(CALLS[name](out_e), CALLS[name](out_i)):
        got, want = ENTRIES[name](*args, **kw), impl(name)(*args_i, **kw_i)
        same_result(got, want)
        if "out" in kw:
            assert (got[0] if isinstance(got, tuple) else got) is out_e
            assert_same_bits(out_e, out_i)
    r = ENTRIES[name](X, W, return_stats=True)
    assert type(r) is RESULTS[name] and r.y.dtype == X.dtype


@pytest.mark.parametrize("name", ENTRIES)
@pytest.mark.parametrize("args, kw, error, words", [
    ((), {}, TypeError, "missing 1 required positional argument: 'x'"),
    ((X, None, None, 1e-5, None), {}, TypeError, "positional arguments but 5"),
    ((X,), {"bogus": 1}, TypeError, "unexpected keyword argument 'bogus'"),
    ((X,), {"x": X}, TypeError, "multiple values for argument 'x'"),
    ((X, W), {"weight": W}, TypeError, "multiple values for argument 'weight'"),
    ((X,), {"eps": -1.0}, ValueError, "eps"),
    ((X,), {"eps": float("nan")}, ValueError, "eps"),
    ((X,), {"return_stats": 1}, TypeError, "return_stats"),
    ((X,), {"axis": 5}, AXIS_ERROR, "axis: 5 is out of bounds"),
    ((X,), {"axis": 2 ** 70}, AXIS_ERROR, "out of bounds"),  # no long: once a SystemError
    ((X,), {"out": np.empty((3, 6), np.float32)}, ValueError, "out"),
])
def test_bad_calls_raise_as_the_implementation_does(name, args, kw, error, words):
    """A call the entry cannot take (here, wrong ones) reaches the Python
    function, which raises exactly what it raises when called directly."""
    if name == "rms_norm" and len(args) == 5:
        args = args[:4]  # 4 positional arguments are one too many for rms_norm
        words = "positional arguments but 4"
    with pytest.raises(error, match=words) as got:
        ENTRIES[name](*args, **kw)
    with pytest.raises(error) as want:
        impl(name)(*args, **kw)
    assert type(got.value) is type(want.value) and str(got.value) == str(want.value)


def spy_entry(name, eps=None):
    """An entry made, as the package makes its own, in front of a spy: a
    function of the same signature and defaults (eps replaced if given)
    that counts the calls reaching it and hands them to the Python
    function. The calls the entry takes in C never reach it."""
    real, calls = impl(name), []
    if name == "layer_norm":
        def spy(x, weight=None, bias=None, eps=1e-5, *, axis=-1, out=None, return_stats=False):
            calls.append(1)
            return real(x, weight, bias, eps, axis=axis, out=out, return_stats=return_stats)
    else:
        def spy(x, weight=None, eps=1e-6, *, axis=-1, out=None, return_stats=False,
                convention="weight"):
            calls.append(1)
            return real(x, weight, eps, axis=axis, out=out, return_stats=return_stats,
                        convention=convention)
    spy.__defaults__ = real.__defaults__[:-1] + ((eps,) if eps is not None else
                                                 real.__defaults__[-1:])
    return _core._entry(spy, name, RESULTS[name]), calls


def runtime(word):
    """An equal str that is not the interned keyword (built at run time)."""
    return "".join(list(word))


@pytest.mark.parametrize("name", ENTRIES)
def test_which_calls_the_entry_takes_in_c(name):
    """The common calls (by position or keyword, x included, keywords that
    are not the interned strings, return_stats either way, axis=-1) never
    reach the Python function; the others all do. Either way the result is
    the Python function's."""
    entry, calls = spy_entry(name)
    out = np.empty_like(X)
    extra = {} if name == "layer_norm" else {"convention": "weight"}
    taken = [((X,), {}), ((X, W), {}), ((), {"x": X, "weight": W}), ((X, W), {"eps": 1e-3}),
             ((X, W), {"out": out}), ((X, W), {"return_stats": True}),
             ((X, W), {"return_stats": False, "axis": -1}),
             ((X, W), {runtime("return_stats"): True, runtime("eps"): 0.0}), ((X, W), extra)]
    handed_on = [((X, W), {"axis": 1}), ((X, W), {"axis": (-1,)}), ((X.tolist(), W), {}),
                 ((X[:, ::-1], W), {}), ((X, W), {"eps": 1}), ((X, W), {"axis": 2 ** 70}),
                 ((X, W), {"return_stats": 1})]
    if name == "rms_norm":
        handed_on.append(((X, W), {"convention": "1+weight"}))
    for i, (args, kw) in enumerate(taken + handed_on):
        del calls[:]
        try:
            want = impl(name)(*args, **kw)
        except Exception as exc:
            with pytest.raises(type(exc)):
                entry(*args, **kw)
        else:
            same_result(entry(*args, **kw), want)
        assert len(calls) == (0 if i < len(taken) else 1), (i, kw)


def test_fast_path_uses_the_functions_default_eps():
    """The default eps the C path uses is the Python function's own, read
    when the entry is made: an entry over a function whose default is 0.5
    normalizes with 0.5, in C."""
    for name in ENTRIES:
        entry, calls = spy_entry(name, eps=0.5)
        same_result(entry(X, W), impl(name)(X, W, eps=0.5))
        assert not calls
        assert not np.array_equal(entry(X, W), ENTRIES[name](X, W))
    assert_same_bits(lnc.layer_norm(X), lnc.layer_norm(X, eps=1e-5))
    assert_same_bits(lnc.rms_norm(X), lnc.rms_norm(X, eps=1e-6))


def test_entry_is_weakly_referenceable():
    """As a function is (caches keyed by weak references to functions)."""
    import weakref
    assert weakref.ref(lnc.layer_norm)() is lnc.layer_norm


def test_make_entry_rejects_bad_arguments():
    with pytest.raises(TypeError):
        _core._entry(len, "layer_norm", lnc.LayerNormResult)
    with pytest.raises(TypeError):
        _core._entry(impl("layer_norm"), "layer_norm", dict)
    with pytest.raises(ValueError):
        _core._entry(impl("layer_norm"), "batch_norm", lnc.LayerNormResult)
    with pytest.raises(ValueError):
        _core._entry_params("batch_norm")
    with pytest.raises(TypeError):
        _core._entry_params(b"layer_norm")  # once read as a str: a crash
