"""The shared test facts hold: the tolerance tables against each other, the
float dtypes against the core, the worked examples where the package uses
them, and each memory layout of tests/cases.py does what its name says."""
import numpy as np
import pytest

import layernorm_c as lnc
from cases import (BLOCK, BOUNDARY_D, FLOAT_DTYPES, LANES, LAYOUTS, MOMENTS_TOL, STATS_TOL,
                   SWAPPED_FLOAT_DTYPES, WORKED_EXAMPLES, WRITABLE_LAYOUTS, Y_TOL, layout_1d,
                   native, with_layout)
from layernorm_c import _core
from layernorm_c.testing import TOLERANCES


# ------------------------------------------------------------ dtypes and tolerances

def test_float_dtypes_are_the_core_loops():
    loops = {np.dtype(types[0]) for types in lnc.layer_norm_ufunc.types}
    assert loops == set(FLOAT_DTYPES)
    assert all(not dt.isnative for dt in SWAPPED_FLOAT_DTYPES)
    assert [dt.newbyteorder("=") for dt in SWAPPED_FLOAT_DTYPES] == list(FLOAT_DTYPES)


def test_the_contract_is_at_least_as_tight_as_the_audit():
    """The tests hold layernorm_c to tolerances no looser than those the
    audit grants any implementation, so it passes its own audit."""
    bf16 = lnc._bf16.BFLOAT16
    # The audit also takes bfloat16 when ml_dtypes is installed.
    assert set(TOLERANCES) == set(FLOAT_DTYPES) | ({bf16} if bf16 is not None else set())
    for table in (Y_TOL, STATS_TOL, MOMENTS_TOL):
        assert set(table) == set(FLOAT_DTYPES)
    for dt in FLOAT_DTYPES:
        assert Y_TOL[dt] <= min(TOLERANCES[dt].atol, TOLERANCES[dt].rtol), dt
        assert STATS_TOL[dt] <= Y_TOL[dt], dt
    if bf16 is not None:
        # tests/test_bf16.py holds bfloat16 outputs to 2**-8 (relative).
        assert 2.0 ** -8 <= min(TOLERANCES[bf16].atol, TOLERANCES[bf16].rtol)


def test_lane_and_block_sizes_come_from_the_core():
    assert (LANES, BLOCK) == (_core.LANES, _core.BLOCK)
    assert BLOCK % LANES == 0
    for n in (LANES, BLOCK):
        assert {n - 1, n, n + 1} <= set(BOUNDARY_D)


# ------------------------------------------------------------ worked examples

def test_main_and_the_audit_use_the_worked_examples(capsys):
    from layernorm_c import __main__
    from layernorm_c.testing import _checks

    assert _checks.HAND_ROWS is WORKED_EXAMPLES
    assert __main__.show_worked_examples()
    out = capsys.readouterr().out
    assert out.count("agree") == len(WORKED_EXAMPLES) and "DISAGREE" not in out
    for example in WORKED_EXAMPLES:
        assert f"row {list(example.row)}" in out


def test_worked_examples_are_given_to_their_decimals():
    assert [e.decimals for e in WORKED_EXAMPLES] == [6, 4]
    for example in WORKED_EXAMPLES:
        assert len(example.row) == len(example.y)


# ------------------------------------------------------------ layouts

def _batch(dtype=np.float32):
    return np.arange(1, 3 * 7 + 1, dtype=np.float64).reshape(3, 7).astype(dtype)


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("seeded", [False, True], ids=["fixed", "drawn"])
def test_every_layout_keeps_the_values_in_a_new_buffer(name, seeded):
    rng = np.random.default_rng(0) if seeded else None
    for a in (_batch(), _batch(np.float16), _batch(np.float64)[..., None].repeat(2, -1),
              np.arange(5.0)):
        got = LAYOUTS[name](a, rng)
        assert got.shape == a.shape and native(got).dtype == a.dtype
        assert np.array_equal(got, a), name
        assert not np.may_share_memory(got, a), name


def test_layouts_have_their_memory_layout():
    a = _batch(np.float64)
    item = a.itemsize
    got = {name: layout(a) for name, layout in LAYOUTS.items()}
    assert got["C"].flags.c_contiguous
    assert got["fortran"].flags.f_contiguous and not got["fortran"].flags.c_contiguous
    assert got["odd_offset"].flags.c_contiguous and got["odd_offset"].base.size == a.size + 1
    assert got["padded_rows"].strides == ((7 + 3) * item, item)
    assert not got["misaligned"].flags.aligned
    assert got["col_strided"].strides == (14 * item, 2 * item)
    assert got["row_strided"].strides == (14 * item, item)
    assert got["strided"].strides == (28 * item, 2 * item)
    assert got["rows_reversed"].strides == (-7 * item, item)
    assert got["cols_reversed"].strides == (7 * item, -item)
    assert got["reversed"].strides == (-7 * item, -item)
    assert got["transposed"].strides == (item, 3 * item)
    assert got["byteswapped"].dtype == a.dtype.newbyteorder()
    assert not got["readonly"].flags.writeable
    assert set(WRITABLE_LAYOUTS) == set(LAYOUTS) - {"readonly"}
    assert all(got[name].flags.writeable for name in WRITABLE_LAYOUTS)


def test_layouts_a_dtype_cannot_have_leave_the_array_alone():
    flags = np.array([True, False, True])
    assert with_layout(flags, "byteswapped") is flags
    objects = np.array([1.0, None], dtype=object)
    assert with_layout(objects, "misaligned") is objects
    scalar = np.array(1.0)
    assert with_layout(scalar, "fortran") is scalar


def test_a_parameter_gets_the_layout_of_a_row():
    w = np.arange(6.0)
    assert layout_1d("C", None) is None
    assert not layout_1d("misaligned", w).flags.aligned
    assert layout_1d("cols_reversed", w).strides == (-w.itemsize,)
    assert layout_1d("byteswapped", w).dtype == w.dtype.newbyteorder()
    for name in LAYOUTS:
        assert np.array_equal(layout_1d(name, w), w), name
