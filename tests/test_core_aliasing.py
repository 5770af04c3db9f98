"""``out=`` sharing memory with any input: the result must be exactly the one
computed from copies of the inputs, on the C fast path, the general path and
the raw gufunc alike.

Every operand is a view into one shared buffer, at its own offset and with
its own strides, so hypothesis explores in-place calls, partial overlaps,
parameters that are rows (or pieces of rows) of ``out``, and views at odd
offsets.
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st
from numpy.lib.stride_tricks import as_strided

import layernorm_c as lnc
from cases import FLOAT_DTYPES
from core_strategies import assert_same_bits


def _view(buf: np.ndarray, offset: int, shape, strides_items) -> np.ndarray:
    """A writeable view of ``buf`` starting ``offset`` items in, with strides
    given in items (non-negative, the view stays inside ``buf``)."""
    isz = buf.itemsize
    strides = tuple(s * isz for s in strides_items)
    return as_strided(buf[offset:], shape=shape, strides=strides, writeable=True)


def _extent(shape, strides_items) -> int:
    """Items spanned by a view (last item + 1)."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides_items))


@st.composite
def aliased_calls(draw):
    dtype = np.dtype(draw(st.sampled_from(FLOAT_DTYPES)))
    n = draw(st.integers(1, 6))
    d = draw(st.integers(1, 40))
    # x and out: C-contiguous (the fast path) or with a padded row stride or
    # a column stride (the general path).
    # (C-contiguous twice as often: the fast path takes only that.)
    layouts = st.sampled_from(["C", "C", "padded", "col2"])

    def strides_for(layout):
        if layout == "C":
            return (d, 1)
        if layout == "padded":
            return (d + draw(st.integers(1, 5)), 1)
        return (2 * d, 2)

    x_strides = strides_for(draw(layouts))
    o_strides = strides_for(draw(layouts))
    x_span = _extent((n, d), x_strides)
    o_span = _extent((n, d), o_strides)
    span = max(x_span, o_span) + 4 * d + 8
    x_off = draw(st.integers(0, span - x_span))
    # out: exactly on x, shifted by a few items (partial overlap), or anywhere.
    o_where = draw(st.sampled_from(["on_x", "near_x", "anywhere"]))
    if o_where == "on_x" and o_strides == x_strides:
        o_off = x_off
    elif o_where == "near_x":
        o_off = min(max(x_off + draw(st.integers(-3 * d, 3 * d)), 0), span - o_span)
    else:
        o_off = draw(st.integers(0, span - o_span))

    def param():
        kind = draw(st.sampled_from(["none", "separate", "row_of_out", "row_of_out",
                                     "in_buffer"]))
        if kind == "none":
            return None
        if kind == "separate":
            return ("separate", 0, 1)
        if kind == "row_of_out":
            r = draw(st.integers(0, n - 1))
            return ("shared", o_off + r * o_strides[0], o_strides[1])
        step = draw(st.integers(1, 2))
        return ("shared", draw(st.integers(0, span - _extent((d,), (step,)))), step)

    w, b = param(), param()
    seed = draw(st.integers(0, 2**32 - 1))
    return dtype, n, d, span, (x_off, x_strides), (o_off, o_strides), w, b, seed


def _build(case):
    dtype, n, d, span, (x_off, x_strides), (o_off, o_strides), w_spec, b_spec, seed = case
    rng = np.random.default_rng(seed)
    buf = (rng.standard_normal(span) * 3 + 1).astype(dtype)
    x = _view(buf, x_off, (n, d), x_strides)
    out = _view(buf, o_off, (n, d), o_strides)

    def param(spec):
        if spec is None:
            return None
        kind, off, step = spec
        if kind == "separate":
            return (rng.uniform(-2, 2, d)).astype(dtype)
        return _view(buf, off, (d,), (step,))

    return x, param(w_spec), param(b_spec), out


@given(aliased_calls())
def test_out_overlapping_inputs_gives_the_result_of_copies(case):
    x, w, b, out = _build(case)
    want = lnc.layer_norm(x.copy(), None if w is None else w.copy(),
                          None if b is None else b.copy(), eps=1e-5)
    got = lnc.layer_norm(x, w, b, eps=1e-5, out=out)
    assert got is out
    assert_same_bits(np.array(got), want, "y")


@given(aliased_calls())
def test_raw_gufunc_with_overlapping_out(case):
    x, w, b, out = _build(case)
    dtype = x.dtype
    ones, zeros = np.ones(x.shape[1], dtype), np.zeros(x.shape[1], dtype)
    w = ones if w is None else w
    b = zeros if b is None else b
    want = lnc.layer_norm_ufunc(x.copy(), w.copy(), b.copy(), 1e-5)
    lnc.layer_norm_ufunc(x, w, b, 1e-5, out=out)
    assert_same_bits(np.array(out), want, "y")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_issue_examples(dtype):
    """The two calls of the bug report: a bias that is a row of the in-place
    output, and a weight that is the first row of out."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 16)).astype(dtype)
    want = lnc.layer_norm(x.copy(), None, x[3].copy())
    xx = x.copy()
    assert_same_bits(lnc.layer_norm(xx, None, xx[3], out=xx), want, "bias = out[3]")

    wbuf = rng.standard_normal((8, 16)).astype(dtype)
    want = lnc.layer_norm(x, wbuf[0].copy())
    assert_same_bits(lnc.layer_norm(x, wbuf[0], out=wbuf), want, "weight = out[0]")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_large_in_place_call_with_aliased_bias_on_threads(dtype, restore_settings):
    """Big enough for the worker threads: the rows other threads write must
    not feed a parameter either."""
    lnc.set_num_threads(2)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4096, 256)).astype(dtype)
    want = lnc.layer_norm(x.copy(), x[100].copy(), x[4000].copy())
    assert_same_bits(lnc.layer_norm(x, x[100], x[4000], out=x), want, "in place")
