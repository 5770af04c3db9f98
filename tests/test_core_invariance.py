"""Bit-for-bit reproducibility: a record's output and statistics depend on
its d values (and weight, bias, eps) alone -- not on its batch, position,
alignment, strides, memory order, thread count or instruction set."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import layernorm_c as lnc
from cases import (F16, F32, F64, FLOAT_DTYPES, LANES, LAYOUTS, WRITABLE_LAYOUTS, layout_1d,
                   native)
from core_strategies import (WB_COMBOS, assert_same_bits, assert_same_result, feature_counts,
                             kernel_settings, random_params, random_records)

BATCH = 100
OUT_LAYOUTS = [None] + list(WRITABLE_LAYOUTS)


def _record_of(res, pos, to_rows):
    return tuple(to_rows(a)[pos] for a in res)


@given(dtype=st.sampled_from(FLOAT_DTYPES), d=feature_counts,
       pos=st.integers(0, BATCH - 1), wb=st.sampled_from(WB_COMBOS),
       out_shift=st.integers(0, len(OUT_LAYOUTS) - 1), seed=st.integers(0, 2**32 - 1))
def test_record_is_bit_identical_alone_and_in_any_batch_layout_and_isa(
        dtype, d, pos, wb, out_shift, seed):
    """Every x layout (paired with an out= layout, or none) under every ISA
    gives the record's bits computed alone under the scalar ISA; weight and
    bias in the same layout as x (byte-swapped x with byte-swapped weight
    and bias: '>f2', '>f4', '>f8')."""
    rng = np.random.default_rng(seed)
    batch = random_records(rng, dtype, BATCH, d)
    w, b = random_params(rng, dtype, d, wb)
    record = batch[pos].copy()
    with kernel_settings(isa="scalar"):
        want = lnc.layer_norm(record, w, b, return_stats=True)

    for isa in lnc.supported_isas():
        with kernel_settings(isa=isa):
            assert_same_result(lnc.layer_norm(record, w, b, return_stats=True), want,
                               f"{isa}: record alone")
            for i, (name, layout) in enumerate(LAYOUTS.items()):
                x = layout(batch)
                out_layout = OUT_LAYOUTS[(i + out_shift) % len(OUT_LAYOUTS)]
                out = None if out_layout is None else LAYOUTS[out_layout](np.zeros_like(batch))
                res = lnc.layer_norm(x, layout_1d(name, w), layout_1d(name, b), out=out,
                                     return_stats=True)
                if out is not None:
                    assert res.y is out
                got = (native(res.y[pos]), res.mean[pos], res.var[pos])
                assert_same_result(got, want, f"{isa}, x layout {name}, out {out_layout}")


@given(dtype=st.sampled_from(FLOAT_DTYPES), d=feature_counts,
       pos=st.integers(0, BATCH - 1), seed=st.integers(0, 2**32 - 1))
def test_record_is_bit_identical_in_3d_and_along_other_axes(dtype, d, pos, seed):
    """The same record inside (4, 25, d), along axis 0 of a (d, 100) array,
    and split over two axes (joint tuple axis) of a (100, d, 1) array."""
    rng = np.random.default_rng(seed)
    batch = random_records(rng, dtype, BATCH, d)
    w, b = random_params(rng, dtype, d, "wb")
    want = lnc.layer_norm(batch[pos].copy(), w, b, return_stats=True)

    res = lnc.layer_norm(batch.reshape(4, 25, d), w, b, return_stats=True)
    assert_same_result(_record_of(res, pos, lambda a: a.reshape(BATCH, *a.shape[2:])),
                       want, "(4, 25, d)")

    res = lnc.layer_norm(np.ascontiguousarray(batch.T), w, b, axis=0, return_stats=True)
    assert_same_result((res.y.T[pos], res.mean[pos], res.var[pos]), want, "axis=0")

    res = lnc.layer_norm(batch[:, :, None], w[:, None], b[:, None], axis=(1, 2),
                         return_stats=True)
    assert_same_result((res.y[pos, :, 0], res.mean[pos], res.var[pos]), want, "axis=(1, 2)")


@given(dtype=st.sampled_from(FLOAT_DTYPES), d=st.integers(1, 300), seed=st.integers(0, 2**32 - 1))
def test_reversed_feature_axis_is_the_reversed_record(dtype, d, seed):
    """x[:, ::-1] holds other records (the reversed ones): each row's result
    is that of the reversed record computed alone."""
    rng = np.random.default_rng(seed)
    batch = random_records(rng, dtype, 8, d)
    res = lnc.layer_norm(batch[:, ::-1], return_stats=True)
    for r in range(8):
        alone = lnc.layer_norm(batch[r, ::-1].copy(), return_stats=True)
        assert_same_result((res.y[r], res.mean[r], res.var[r]), alone, f"row {r}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_thread_count_does_not_change_bits(isa, dtype):
    """A batch above thread_threshold(), split over 1, 2 or 3 threads."""
    d = 1000
    n = 3 * lnc.thread_threshold() // (d * dtype.itemsize) + 7
    rng = np.random.default_rng(5)
    batch = random_records(rng, dtype, n, d)
    w, b = random_params(rng, dtype, d, "wb")
    assert batch.nbytes > lnc.thread_threshold()

    lnc.set_num_threads(1)
    want = lnc.layer_norm(batch, w, b, return_stats=True)
    for threads in (2, 3):
        lnc.set_num_threads(threads)
        assert_same_result(lnc.layer_norm(batch, w, b, return_stats=True), want,
                           f"{threads} threads")
        # Column-strided and byte-swapped input too (every record staged
        # by its thread).
        for name in ("col_strided", "byteswapped"):
            assert_same_result(lnc.layer_norm(LAYOUTS[name](batch), layout_1d(name, w),
                                              layout_1d(name, b), return_stats=True),
                               want, f"{threads} threads, {name}")
    # Records at every split point equal the record alone.
    for r in sorted({0, n // 3 - 1, n // 3, n // 2 - 1, n // 2, n - 1}):
        alone = lnc.layer_norm(batch[r].copy(), w, b, return_stats=True)
        assert_same_result((want.y[r], want.mean[r], want.var[r]), alone, f"record {r}")


@pytest.fixture(scope="module")
def large_batches():
    """Batches large enough for every big-data path: threads, and streaming
    stores of outputs over 8 MiB (float32/float64, into an existing out=;
    new outputs of 32 MiB or more, and float16 rows under 8 KiB, are never
    streamed); rows of odd length, so records start at every alignment."""
    rng = np.random.default_rng(13)
    d = 1027
    size = {F16: 8 << 20, F32: 34 << 20, F64: 34 << 20}
    return {dt: random_records(rng, dt, size[dt] // (d * dt.itemsize) + 1, d)
            for dt in FLOAT_DTYPES}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_large_batches_same_bits_alone_in_place_and_threaded(isa, dtype, large_batches):
    batch = large_batches[dtype]
    n, d = batch.shape
    w, b = random_params(np.random.default_rng(14), dtype, d, "wb")
    res = lnc.layer_norm(batch, w, b, return_stats=True)
    for r in (0, 1, 7, n // 2, n - 2, n - 1):
        alone = lnc.layer_norm(batch[r].copy(), w, b, return_stats=True)
        assert_same_result((res.y[r], res.mean[r], res.var[r]), alone, f"record {r}")
    inplace = batch.copy()
    lnc.layer_norm(inplace, w, b, out=inplace)
    assert_same_bits(inplace, res.y, "in place")
    lnc.layer_norm(batch, w, b, out=inplace)  # streamed into an existing array
    assert_same_bits(inplace, res.y, "out=")
    del inplace
    lnc.set_num_threads(1)
    assert_same_bits(lnc.layer_norm(batch, w, b), res.y, "one thread")


def test_every_isa_matches_scalar_on_all_tails(restore_settings):
    """All d up to four lane rows and then some (every tail length of the
    lane rows, of the 8/16-wide apply loops and of the float16 conversions)
    in every dtype."""
    rng = np.random.default_rng(11)
    for dtype in FLOAT_DTYPES:
        for d in range(1, 4 * LANES + 3):
            x = random_records(rng, dtype, 3, d)
            w, b = random_params(rng, dtype, d, "wb")
            lnc.set_isa("scalar")
            want = lnc.layer_norm(x, w, b, return_stats=True)
            for isa in lnc.supported_isas():
                lnc.set_isa(isa)
                assert_same_result(lnc.layer_norm(x, w, b, return_stats=True), want,
                                   f"{isa}, {dtype}, d={d}")


def test_short_records_match_scalar_at_every_position_of_a_group(restore_settings):
    """Short records (d up to two lane rows) are computed 16 at a time,
    transposed: every position of a group (and of a partial last group), in
    every dtype, for LayerNorm and RMSNorm, gives the scalar level's bits.
    (Regression: GCC 12's basic-block vectorizer dropped the `- lo` of the
    centered values for some positions of a group in one formulation.)"""
    rng = np.random.default_rng(13)
    for dtype in FLOAT_DTYPES:
        for d in range(1, 2 * LANES + 3):
            x = random_records(rng, dtype, 37, d)
            w, b = random_params(rng, dtype, d, "wb")
            lnc.set_isa("scalar")
            want = (lnc.layer_norm(x, w, b, return_stats=True),
                    lnc.rms_norm(x, w, return_stats=True))
            for isa in lnc.supported_isas():
                lnc.set_isa(isa)
                got = (lnc.layer_norm(x, w, b, return_stats=True),
                       lnc.rms_norm(x, w, return_stats=True))
                assert_same_result(got[0], want[0], f"{isa}, {dtype}, d={d}")
                assert_same_result(got[1], want[1], f"{isa}, {dtype}, d={d}, rms_norm")


def _short_group_dtypes():
    try:
        import ml_dtypes
    except ImportError:
        return [F32, F16]
    return [F32, F16, np.dtype(ml_dtypes.bfloat16)]


@pytest.mark.parametrize("dtype", _short_group_dtypes(), ids=str)
@pytest.mark.parametrize("which", WB_COMBOS)
def test_special_records_inside_short_groups_match_scalar(which, dtype, restore_settings):
    """Records a group cannot finish (NaN, infinity, variances beyond the
    float lanes' range, constant records with eps 0) sit among plain ones:
    the group leaves them to the record path and writes the others, in
    place or into a new array, forward or reversed, with the scalar
    level's bits at every instruction-set level, gain and bias or not
    (float16 and bfloat16 when installed too: there the extreme scales
    overflow or vanish, other special records). d = 8 and 16 are float32
    records the AVX2 level reads in place, one affine case each."""
    rng = np.random.default_rng(17)
    for d in (8, 16, 17, 24, 31, 32, 33, 48, 63, 64):
        x = (rng.standard_normal((37, d)) * rng.uniform(0.1, 10, (37, 1))
             + rng.uniform(-1e3, 1e3, (37, 1)))
        x[3] = np.nan
        x[7, d - 1] = np.inf
        x[10] = 1e20 * rng.standard_normal(d)
        x[11] = 5.0
        x[20] = 1e-25 * rng.standard_normal(d)
        x[21] = -0.0
        with np.errstate(over="ignore"):
            x = x.astype(dtype)
        w, b = random_params(rng, dtype, d, which)
        for eps in (1e-5, 0.0):
            with np.errstate(all="ignore"):
                lnc.set_isa("scalar")
                want = (lnc.layer_norm(x, w, b, eps=eps, return_stats=True),
                        lnc.rms_norm(x, w, eps=eps, return_stats=True))
                for isa in lnc.supported_isas():
                    lnc.set_isa(isa)
                    where = f"{isa}, d={d}, eps={eps}"
                    assert_same_result(lnc.layer_norm(x, w, b, eps=eps, return_stats=True),
                                       want[0], where)
                    assert_same_result(lnc.rms_norm(x, w, eps=eps, return_stats=True), want[1],
                                       where + ", rms_norm")
                    assert_same_bits(lnc.layer_norm(x[::-1], w, b, eps=eps)[::-1], want[0].y,
                                     where + ", reversed")
                    inplace = x.copy()
                    lnc.layer_norm(inplace, w, b, eps=eps, out=inplace)
                    assert_same_bits(inplace, want[0].y, where + ", in place")


def _check_into_shifted_outs(write, want, threads=(None,)):
    """write(out) into an existing out= at three alignments (0, 1 and 5
    items into a buffer), on every ISA and each thread count of threads
    (None: as set): the bits of want. Returns the last out."""
    n, d = want.shape
    buf = np.empty(n * d + 7, want.dtype)
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        for t in threads:
            if t is not None:
                lnc.set_num_threads(t)
            for shift in (0, 1, 5):
                out = buf[shift:shift + n * d].reshape(n, d)
                out.fill(np.nan)
                write(out)
                assert_same_bits(out, want, f"{isa}, {t} threads, out shifted by {shift}")
    return out


def _check_layer_norm_into_shifted_outs(x, w, b):
    """layer_norm(x, w, b) into shifted outs: the bits of a new array."""
    return _check_into_shifted_outs(lambda out: lnc.layer_norm(x, w, b, out=out),
                                    lnc.layer_norm(x, w, b))


@pytest.mark.parametrize("dtype,d", [(F32, 16), (F32, 33), (F32, 64), (F16, 16), (F16, 64),
                                     (F64, 16)], ids=str)
def test_short_records_streamed_into_a_large_out(dtype, d, restore_settings):
    """Short float32/float64 records of 128 bytes or more written into an
    existing out= of 8 MiB or more go out a group at a time with streaming
    stores from the first 64-byte boundary on (shorter ones, and float16
    ones, with plain stores: float32 and float16 d = 16 straight from the
    group's loop, float16 converted in registers): the same bits as the plain stores of a new array, at any
    alignment of out (the head and tail of each group stored plainly). A
    NaN record (left to the record path: its group is not written whole)
    and a record of zeros (kept by its group) sit among them."""
    rng = np.random.default_rng(31)
    n = (34 << 20) // (d * dtype.itemsize) + 5
    x = (rng.standard_normal((n, d)) * 3 + 1).astype(dtype)
    x[40, 3] = np.nan
    x[n - 20] = 0.0
    w, b = (rng.uniform(0.5, 2, d).astype(dtype), rng.standard_normal(d).astype(dtype))
    out = _check_layer_norm_into_shifted_outs(x, w, b)
    rms = lnc.rms_norm(x, w)
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        out.fill(np.nan)
        lnc.rms_norm(x, w, out=out)
        assert_same_bits(out, rms, f"{isa} rms")


@pytest.mark.parametrize("dtype", [dt for dt in _short_group_dtypes() if dt.itemsize == 2],
                         ids=str)
def test_long_half_records_streamed_into_a_large_out(dtype, restore_settings):
    """float16 and bfloat16 records of 8 KiB or more written into an
    existing out= of 8 MiB or more are streamed (float16 converted straight
    into the non-temporal stores): the same bits as a new array's plain
    stores, at any alignment of out (each row's unaligned head and its tail
    stored plainly)."""
    rng = np.random.default_rng(32)
    d = 4099
    n = (8 << 20) // (d * dtype.itemsize) + 3
    x = (rng.standard_normal((n, d)) * 3 + 1).astype(dtype)
    w, b = (rng.uniform(0.5, 2, d).astype(dtype), rng.standard_normal(d).astype(dtype))
    _check_layer_norm_into_shifted_outs(x, w, b)


@pytest.mark.parametrize("dtype,d", [(F32, 771), (F64, 385)], ids=str)
def test_paired_records_of_a_large_call_same_bits(dtype, d, restore_settings):
    """Records of 1 to 4 KiB are done in pairs; in a call with an output of
    8 MiB or more each lane row asks for the next pair's lines while it is
    written, streamed into an existing out= or stored plainly into a new
    array of 32 MiB or more: every record has the bits of the same records
    computed a few at a time (a small call), at any alignment of out, on
    every ISA, for LayerNorm and RMSNorm."""
    rng = np.random.default_rng(34)
    n = (34 << 20) // (d * dtype.itemsize) + 3
    x = (rng.standard_normal((n, d)) * 3 + 1).astype(dtype)
    w, b = (rng.uniform(0.5, 2, d).astype(dtype), rng.standard_normal(d).astype(dtype))
    want = np.concatenate([lnc.layer_norm(x[k:k + 512], w, b) for k in range(0, n, 512)])
    want_rms = np.concatenate([lnc.rms_norm(x[k:k + 512], w) for k in range(0, n, 512)])
    _check_into_shifted_outs(lambda out: lnc.layer_norm(x, w, b, out=out), want)
    _check_into_shifted_outs(lambda out: lnc.rms_norm(x, w, out=out), want_rms)
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        assert_same_bits(lnc.layer_norm(x, w, b), want, f"{isa}, a new array")
        assert_same_bits(lnc.rms_norm(x, w), want_rms, f"{isa}, a new array, rms")


@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
def test_new_outputs_of_8_to_32_mib_streamed_same_bits(dtype, restore_settings):
    """A new output of 8 MiB up to 32 MiB is written with streaming stores
    (larger new ones come from fresh pages and are stored plainly): every
    record has the bits of the same records computed a few at a time
    (outputs too small to stream), on every ISA, one thread and two."""
    rng = np.random.default_rng(33)
    d = 1027
    n = (9 << 20) // (d * dtype.itemsize)
    x = (rng.standard_normal((n, d)) * 3 + 1).astype(dtype)
    w, b = (rng.uniform(0.5, 2, d).astype(dtype), rng.standard_normal(d).astype(dtype))
    lnc.set_isa("scalar")
    want = np.concatenate([lnc.layer_norm(x[k:k + 512], w, b) for k in range(0, n, 512)])
    want_rms = np.concatenate([lnc.rms_norm(x[k:k + 512], w) for k in range(0, n, 512)])
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        for threads in (1, 2):
            lnc.set_num_threads(threads)
            assert_same_bits(lnc.layer_norm(x, w, b), want, f"{isa}, {threads} threads")
            assert_same_bits(lnc.rms_norm(x, w), want_rms, f"{isa}, {threads} threads, rms")


@pytest.mark.parametrize("dtype,d", [(F32, 1027), (F64, 1027), (F16, 4099)], ids=str)
def test_backward_dx_streamed_by_the_gufunc_same_bits(dtype, d, restore_settings):
    """The backward gufunc (dx alone, no parameter gradients) writes an
    output of 8 MiB or more with streaming stores, each record from its
    first 64-byte aligned element on (the head before it and the tail
    after the last whole lane row stored plainly): every record has the
    bits of the same records computed a few at a time under the scalar
    ISA, at three alignments of out=, on every ISA, one thread and two."""
    rng = np.random.default_rng(34)
    n = (9 << 20) // (d * dtype.itemsize) + 3
    x = (rng.standard_normal((n, d)) * 3 + 1).astype(dtype)
    dy = rng.standard_normal((n, d)).astype(dtype)
    w = rng.uniform(0.5, 2, d).astype(dtype)
    ufunc = lnc.layer_norm_backward_ufunc
    lnc.set_isa("scalar")
    want = np.concatenate([ufunc(dy[k:k + 64], x[k:k + 64], w, 1e-5) for k in range(0, n, 64)])
    _check_into_shifted_outs(lambda out: ufunc(dy, x, w, 1e-5, out=out), want, threads=(1, 2))


@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
def test_backward_with_gradients_streamed_same_bits(dtype, restore_settings):
    """A backward call with parameter gradients whose new dx is 8 MiB up to
    32 MiB streams dx (each record from its first 64-byte aligned element:
    d = 1027 puts the records at every alignment) and deposits the terms in
    a loop of its own: dx, dweight and dbias (RMSNorm's dx and dweight)
    have the bits of the scalar ISA, which stores plainly, on every ISA,
    one thread and two."""
    rng = np.random.default_rng(35)
    d = 1027
    n = (9 << 20) // (d * dtype.itemsize)
    x = (rng.standard_normal((n, d)) * 3 + 1).astype(dtype)
    dy = rng.standard_normal((n, d)).astype(dtype)
    w = rng.uniform(0.5, 2, d).astype(dtype)
    lnc.set_isa("scalar")
    want = lnc.layer_norm_backward(dy, x, w)
    want_rms = lnc.rms_norm_backward(dy, x, w)
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        for threads in (1, 2):
            lnc.set_num_threads(threads)
            got = lnc.layer_norm_backward(dy, x, w)
            for name, a, b in zip(("dx", "dweight", "dbias"), got, want):
                assert_same_bits(a, b, f"{isa}, {threads} threads, {name}")
            got = lnc.rms_norm_backward(dy, x, w)
            for name, a, b in zip(("dx", "dweight"), got, want_rms):
                assert_same_bits(a, b, f"{isa}, {threads} threads, rms {name}")


@pytest.mark.parametrize("dtype,d,n", [(F32, 1024, 37), (F32, 4096, 19), (F16, 2048, 37),
                                       (F32, 4096, (9 << 20) // (4096 * 4) + 3)], ids=str)
def test_backward_rows_4kib_apart_same_bits(dtype, d, n, restore_settings):
    """Rows a multiple of 4 KiB apart take the x86 levels' group loop
    sixteen features a step (records in the caches and, with n giving 9
    MiB, streamed ones), where other widths take eight: dx, dweight and
    dbias (RMSNorm's dx and dweight) have the scalar ISA's bits, on every
    ISA and thread count, also one record further on (other alignments)
    and with terms of all three levels of the exact sums."""
    rng = np.random.default_rng(36)
    x = (rng.standard_normal((n + 1, d)) * 3 + 1).astype(dtype)
    dy = rng.standard_normal((n + 1, d)).astype(dtype)
    dy[::3] *= 3e3 if dtype == F32 else 100  # terms of 2^13 and more: the top level
    w = rng.uniform(0.5, 2, d).astype(dtype)
    cases = [(dy[:n], x[:n]), (dy[1:], x[1:])]
    lnc.set_isa("scalar")
    want = [(lnc.layer_norm_backward(g, a, w), lnc.rms_norm_backward(g, a, w))
            for g, a in cases]
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        for threads in (1, 2):
            lnc.set_num_threads(threads)
            for (g, a), (ln, rms) in zip(cases, want):
                for name, got, exp in zip(("dx", "dweight", "dbias"),
                                          lnc.layer_norm_backward(g, a, w), ln):
                    assert_same_bits(got, exp, f"{isa}, {threads} threads, {name}")
                for name, got, exp in zip(("dx", "dweight"), lnc.rms_norm_backward(g, a, w), rms):
                    assert_same_bits(got, exp, f"{isa}, {threads} threads, rms {name}")


def test_isa_settings_round_trip(restore_settings):
    assert "scalar" in lnc.supported_isas()
    assert lnc.get_isa() in lnc.supported_isas()
    for isa in lnc.supported_isas():
        lnc.set_isa(isa)
        assert lnc.get_isa() == isa
    lnc.set_num_threads(3)
    assert lnc.get_num_threads() == 3


def test_results_do_not_depend_on_earlier_calls():
    """Nothing carries over between calls: the same input again, after other
    calls with other shapes and dtypes, gives the same bits."""
    rng = np.random.default_rng(12)
    x = random_records(rng, np.float32, 5, 77)
    first = lnc.layer_norm(x, return_stats=True)
    for dtype in FLOAT_DTYPES:
        lnc.layer_norm(random_records(rng, dtype, 9, 130), return_stats=True)
    assert_same_result(lnc.layer_norm(x, return_stats=True), first)
    assert_same_bits(lnc.layer_norm(x), first.y)


@pytest.mark.parametrize("d", [8, 24, 64, 130], ids=lambda d: f"d={d}")
def test_each_record_gets_its_own_eps(d):
    """A per-record eps (a gufunc broadcast of an (n,) array) reaches each
    record, in groups of short records as in long ones: record k's result
    is that of record k alone with eps[k]. (A broadcast scalar eps is read
    once per call; an array is read record by record.)"""
    rng = np.random.default_rng(d)
    n = 37
    x = (rng.standard_normal((n, d)) * 1e-3).astype(F32)
    w, b = rng.uniform(0.5, 2, d).astype(F32), rng.standard_normal(d).astype(F32)
    eps = rng.uniform(0, 1e-5, n)
    got = lnc.layer_norm_ufunc(x, w, b, eps)
    for k in range(n):
        assert_same_bits(got[k], lnc.layer_norm(x[k], w, b, eps=eps[k]), f"record {k}")
    assert not np.array_equal(got[0], lnc.layer_norm(x[0], w, b, eps=eps[1]))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 15, 16, 17, 50])
def test_fortran_order_tiles_give_the_bits_of_c_order(dtype, n):
    """Fortran-ordered records are staged a tile of 16 at a time: every
    tile size (a partial last one too), the statistics, eps per record,
    in place (out=x), the backward and RMSNorm give C order's bits."""
    rng = np.random.default_rng(n)
    d = 40
    x = (3 + rng.standard_normal((n, d))).astype(dtype)
    dy = rng.standard_normal((n, d)).astype(dtype)
    w = rng.uniform(0.5, 2, d).astype(dtype)
    b = rng.standard_normal(d).astype(dtype)
    eps = rng.uniform(0, 1e-3, (n, 1))
    xf, dyf = np.asfortranarray(x), np.asfortranarray(dy)
    want = lnc.layer_norm(x, w, b, return_stats=True)
    got = lnc.layer_norm(xf, w, b, return_stats=True)
    for name, u, v in zip(want._fields, got, want):
        assert_same_bits(np.ascontiguousarray(u), v, name)
    per_record = lnc.layer_norm_ufunc(x, w, b, eps[:, 0])
    assert_same_bits(lnc.layer_norm_ufunc(xf, w, b, eps[:, 0]), per_record, "eps per record")
    inplace = xf.copy(order="F")
    lnc.layer_norm(inplace, w, b, out=inplace)
    assert_same_bits(np.ascontiguousarray(inplace), want.y, "out=x")
    assert_same_bits(lnc.rms_norm(xf, w), lnc.rms_norm(x, w), "rms_norm")
    g, gf = lnc.layer_norm_backward(dy, x, w), lnc.layer_norm_backward(dyf, xf, w)
    for name, u, v in zip(g._fields, gf, g):
        assert_same_bits(np.ascontiguousarray(u), v, f"backward {name}")
