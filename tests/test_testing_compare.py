"""compare(): several implementations side by side, as text, HTML and one
plot, and ``python -m layernorm_c audit A B C``."""
import pickle
import sys
import textwrap

import pytest

import layernorm_c as lnc
import ln_gallery
from layernorm_c.testing import (CHECKS, RMS_CHECKS, ComparisonReport, LayerNormAudit,
                                 RMSNormAudit, compare)
from layernorm_c.testing._cli import main

CHECKS_SUBSET = ["reference", "variance", "eps", "affine", "cancellation"]


@pytest.fixture(scope="module")
def table():
    return compare({"layernorm_c": lnc.layer_norm,
                    "sample variance": ln_gallery.sample_variance,
                    "eps on std": ln_gallery.eps_on_std,
                    "rms (as an audit)": RMSNormAudit(lnc.rms_norm),
                    # a report made before (unpickled: without its audit)
                    "float64 run": pickle.loads(pickle.dumps(
                        LayerNormAudit(lnc.layer_norm, dtype="float64").run()))})


@pytest.fixture(autouse=True)
def _restore_sys_path(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))


def test_rows_columns_and_verdicts(table):
    assert isinstance(table, ComparisonReport) and not table.ok
    assert list(table) == ["layernorm_c", "sample variance", "eps on std", "rms (as an audit)",
                           "float64 run"]
    # Every check of both batteries is a row, LayerNorm's first.
    assert table.checks[:len(CHECKS)] == list(CHECKS)
    assert set(RMS_CHECKS) <= set(table.checks)
    assert table.cell("layernorm_c", "variance").status == "pass"
    assert table.cell("sample variance", "variance").status == "fail"
    assert table.cell("eps on std", "eps").status == "fail"
    assert table.cell("layernorm_c", "centering") is None  # not in its battery
    assert table["rms (as an audit)"].title.startswith("RMSNorm audit of layernorm_c.rms_norm")
    assert set(table.failures) == {"sample variance", "eps on std"}
    assert table.seconds["float64 run"] is None and table.seconds["layernorm_c"] > 0
    with pytest.raises(KeyError, match="the columns are"):
        table["torch"]


def test_text_table_fits_100_columns_and_names_every_failure(table):
    text = str(table)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[0].split()[:3] == ["check", "layernorm_c", "sample"]
    # five columns do not fit in 100 characters: the rest continue below
    assert sum(1 for line in lines if line.startswith("check ")) == 2
    variance = next(line for line in lines if line.startswith("variance "))
    assert "pass" in variance and "FAIL" in variance
    assert "5 implementations: 2 with failed checks (sample variance, eps on std)" in text
    failures = text[text.index("\nFailures:\n"):]
    assert "sample variance / variance" in failures and "d - 1" in failures
    assert "eps on std / eps" in failures
    assert "- float64 run: LayerNorm audit of layernorm_c._api.layer_norm (float64" in text
    narrow = table.render(60)
    assert max(len(line) for line in narrow.splitlines()) <= 60


def test_html_table(table):
    html = table._repr_html_()
    assert html.startswith('<div class="layernorm-c-comparison"')
    for name in table:
        assert f"<th" in html and name in html
    assert 'data-status="fail"' in html and 'data-status="pass"' in html
    assert "eps added to the standard deviation" in html
    assert "<script" not in html


def test_plot_draws_every_layer_norm_forward(table):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    figure = table.plot()
    offset, size = figure.axes[:2]
    labels = [line.get_label() for line in offset.get_lines()]
    for name in ("layernorm_c (float32)", "sample variance (float32)", "eps on std (float32)"):
        assert name in labels
    assert any(label.startswith("reference_layer_norm") for label in labels)
    # The RMSNorm audit and the unpickled report cannot be measured.
    assert "not plotted: rms (as an audit), float64 run" in figure._suptitle.get_text()
    assert [len(line.get_xdata()) for line in size.get_lines()][0] == 6
    with pytest.raises(ValueError, match="no column is a LayerNorm forward audit"):
        compare({"rms": RMSNormAudit(lnc.rms_norm)}, checks=["eps"]).plot()


def test_options_and_errors():
    small = compare([lnc.layer_norm, ln_gallery.eps_ignored], checks=["eps", "reference"])
    assert small.checks == ["eps", "reference"]
    assert list(small) == ["layernorm_c._api.layer_norm", "ln_gallery.eps_ignored"]
    assert small.cell("ln_gallery.eps_ignored", "eps").status == "fail"
    # eps reaches the implementations that take one
    assert "eps=0.001" in compare({"a": lnc.layer_norm}, checks=["eps"], eps=1e-3)["a"].title
    with pytest.raises(ValueError, match="unknown"):
        compare({"a": lnc.layer_norm}, checks=["epsilon"])
    with pytest.raises(ValueError, match="at least one"):
        compare({})
    with pytest.raises(ValueError, match="repeated names"):
        compare([lnc.layer_norm, lnc.layer_norm])
    with pytest.raises(ValueError, match="op: expected one of"):
        compare({"a": lnc.layer_norm}, op="batch_norm")


def test_backward_side_by_side():
    table = compare({"layernorm_c": lnc.layer_norm_backward,
                     "reference": lnc.reference_layer_norm_backward},
                    backward=True, checks=["reference", "param_grads"])
    assert table.ok and table.checks == ["reference", "param_grads"]
    assert table["layernorm_c"].title.startswith("LayerNorm backward audit")


def test_cli_with_several_targets(capsys):
    assert main(["layernorm_c:layer_norm", "ln_gallery:eps_on_std", "--checks",
                 ",".join(CHECKS_SUBSET)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("check ") and "layernorm_c:layer_norm" in out
    assert "2 implementations: 1 with failed checks (ln_gallery:eps_on_std)" in out
    assert main(["layernorm_c:layer_norm", "ln_gallery:numpy_float32", "--checks",
                 "reference,eps"]) == 0
    assert "no check failed" in capsys.readouterr().out
    assert main(["layernorm_c:layer_norm", "layernorm_c:layer_norm"]) == 2
    assert "the same target twice" in capsys.readouterr().err


def test_cli_target_naming_a_dict(tmp_path, capsys):
    path = tmp_path / "impls.py"
    path.write_text(textwrap.dedent("""
        import layernorm_c
        IMPLEMENTATIONS = {"ours": layernorm_c.layer_norm,
                           "ours again": layernorm_c.layer_norm}
    """))
    assert main([f"{path}:IMPLEMENTATIONS", "--checks", "eps"]) == 0
    out = capsys.readouterr().out
    assert "ours again" in out and "2 implementations: no check failed" in out
