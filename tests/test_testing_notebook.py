"""layernorm_c.testing in a notebook: the HTML display of reports and
results, and report.plot() (matplotlib, Agg backend)."""
import decimal
import pickle
import sys
from html.parser import HTMLParser

import numpy as np
import pytest

import layernorm_c
import ln_gallery
from layernorm_c.testing import AuditReport, CheckResult, LayerNormAudit
from layernorm_c.testing._plot import OFFSETS, SIZES, exact_layer_norm, line_labels
from layernorm_c.testing._report import STATUS_COLOURS

# -- a small DOM from the stdlib parser ---------------------------------------------


class Node:
    def __init__(self, tag, attrs, parent=None):
        self.tag, self.attrs, self.parent = tag, dict(attrs), parent
        self.children, self.parts = [], []

    def text(self):
        """All text inside, as a browser would show it (entities decoded)."""
        return "".join(p if isinstance(p, str) else p.text() for p in self.parts)

    def find_all(self, tag):
        found = []
        for child in self.children:
            if child.tag == tag:
                found.append(child)
            found.extend(child.find_all(tag))
        return found

    def style(self):
        """The inline style as a dict of property -> value."""
        items = (d.split(":", 1) for d in self.attrs.get("style", "").split(";") if ":" in d)
        return {k.strip(): v.strip() for k, v in items}


class _Builder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = self.current = Node("#root", [])
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        node = Node(tag, attrs, self.current)
        self.current.children.append(node)
        self.current.parts.append(node)
        self.current = node

    def handle_endtag(self, tag):
        assert self.current.tag == tag, f"</{tag}> closes <{self.current.tag}>"
        self.current = self.current.parent

    def handle_data(self, data):
        self.current.parts.append(data)


def parse(markup):
    builder = _Builder()
    builder.feed(markup)
    builder.close()
    assert builder.current is builder.root, "unclosed tags"
    return builder.root, builder.tags


# -- HTML ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def failing_report():
    return LayerNormAudit(ln_gallery.sample_variance).run()


def test_report_html_is_a_table_with_a_row_per_check(failing_report):
    root, _ = parse(failing_report._repr_html_())
    text = root.text()
    assert text.startswith(failing_report.title)
    assert text.endswith(failing_report.summary())
    (table,) = root.find_all("table")
    header = [th.text() for th in table.find_all("th")]
    assert header == ["check", "status", "figure", "diagnosis"]
    (body,) = table.find_all("tbody")
    rows = body.find_all("tr")
    assert len(rows) == len(failing_report)
    for row, result in zip(rows, failing_report):
        cells = [td.text() for td in row.find_all("td")]
        label = "FAIL" if result.status == "fail" else result.status
        assert cells == [result.name, label, result.figure, result.diagnosis]
        assert row.attrs["data-status"] == result.status


def test_status_badges_have_a_colour_per_status():
    statuses = ["pass", "fail", "warn", "skip"]
    report = AuditReport("t", [CheckResult(f"c{i}", s, "f", "d") for i, s in enumerate(statuses)])
    root, _ = parse(report._repr_html_())
    badges = [span for span in root.find_all("span") if "data-status" in span.attrs]
    assert [b.attrs["data-status"] for b in badges] == statuses
    assert [b.text() for b in badges] == ["pass", "FAIL", "warn", "skip"]  # not colour alone
    colours = [b.style()["background"] for b in badges]
    assert colours == [STATUS_COLOURS[s] for s in statuses]
    assert len(set(colours)) == 4
    # White text on a solid badge: readable on a light or a dark page.
    assert all(b.style()["color"] == "#ffffff" for b in badges)
    # A failed or warned row is also tinted; the others inherit the page.
    rows = root.find_all("tbody")[0].find_all("tr")
    tinted = ["background" in row.style() for row in rows]
    assert tinted == [False, True, True, False]


def test_html_escapes_every_text():
    evil = CheckResult("<b>name</b>", "fail", "x < 1 & y > 2",
                       "<script>alert('diagnosis')</script> \"quoted\"")
    report = AuditReport("audit of <img src=x onerror=alert(1)>", [evil])
    for markup in (report._repr_html_(), evil._repr_html_()):
        root, tags = parse(markup)
        assert not {"script", "img", "b"} & set(tags)
        assert "&lt;script&gt;" in markup
        text = root.text()
        for raw in (evil.name, evil.figure, evil.diagnosis):
            assert raw in text  # shown as written
    assert "<img src=x onerror=alert(1)>" in parse(report._repr_html_())[0].text()


def test_html_is_self_contained_and_wraps_the_diagnosis(failing_report):
    markup = failing_report._repr_html_()
    _, tags = parse(markup)
    assert not {"script", "style", "link", "iframe"} & set(tags)
    assert "url(" not in markup and "http" not in markup
    root, _ = parse(markup)
    for row in root.find_all("tbody")[0].find_all("tr"):
        diagnosis = row.find_all("td")[3].style()
        assert diagnosis["white-space"] == "normal"
        assert diagnosis["overflow-wrap"] == "anywhere"
        assert diagnosis["text-align"] == "left"
    assert "overflow: hidden" not in markup and "text-overflow" not in markup
    # The text colour comes from the notebook's theme.
    assert root.children[0].style()["color"] == "inherit"


def test_failing_check_html_shows_name_status_figure_and_diagnosis(failing_report):
    result = failing_report["variance"]
    assert result.status == "fail"
    root, _ = parse(result._repr_html_())
    (card,) = root.children
    assert card.attrs["data-status"] == "fail"
    assert card.style()["border-left"].endswith(STATUS_COLOURS["fail"])
    head, diagnosis = card.children
    code, badge, figure = head.children
    assert code.tag == "code" and code.text() == "variance"
    assert badge.text() == "FAIL" and badge.style()["background"] == STATUS_COLOURS["fail"]
    assert figure.text() == result.figure
    assert diagnosis.text() == result.diagnosis
    assert diagnosis.style()["white-space"] == "normal"


# -- report.plot() ------------------------------------------------------------------


@pytest.fixture(scope="module")
def plt():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


@pytest.fixture(scope="module")
def cancelling(plt):
    """E[x^2] - E[x]^2 in float32: its report and plot."""
    report = LayerNormAudit(ln_gallery.one_pass_float32).run(["cancellation"])
    return report, report.plot()


def _lines(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def test_plot_has_two_log_panels_with_the_three_lines(cancelling, plt):
    from matplotlib.figure import Figure

    report, figure = cancelling
    assert isinstance(figure, Figure)
    assert len(figure.axes) == 2
    impl, ours, reference = line_labels(report.audit)
    assert impl.startswith("ln_gallery.one_pass_float32 (float32")
    assert ours.startswith("layernorm_c.layer_norm (float32)")
    assert reference.startswith("reference_layer_norm (float64")
    for ax, xs in zip(figure.axes, (OFFSETS, SIZES)):
        lines = _lines(ax)
        assert {impl, ours, reference, "tolerance (rtol=1e-05, atol=1e-05)"} <= set(lines)
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        assert "tolerance" in ax.get_ylabel()
        for label in (impl, ours, reference):
            x, y = lines[label].get_data()
            assert list(x) == list(xs)
            assert np.isfinite(y).all() and (y > 0).all(), (label, y)
    # The figure is not left open in pyplot (a notebook shows it once).
    assert not any(plt.figure(n) is figure for n in plt.get_fignums())


def test_plot_shows_the_cancellation_at_large_offsets(cancelling):
    report, figure = cancelling
    impl, ours, reference = line_labels(report.audit)
    lines = _lines(figure.axes[0])
    offsets = np.asarray(lines[impl].get_xdata())
    broken = np.asarray(lines[impl].get_ydata())
    good = np.asarray(lines[ours].get_ydata())
    yardstick = np.asarray(lines[reference].get_ydata())
    large = offsets >= 1e3
    # E[x^2] - E[x]^2 is far beyond tolerance at large offsets, layernorm_c
    # is within it everywhere and the float64 reference far below it.
    assert (broken[large] > 100 * good[large]).all() and (broken[large] > 1).all()
    assert (good < 1).all()
    assert (yardstick < 1e-6 * good).all()
    # At offset 1 both are fine: the difference is the offset's doing.
    assert broken[0] < 1


def test_plot_marks_non_finite_outputs(plt):
    report = LayerNormAudit(ln_gallery.float16_native, dtype="float16").run(["float16_overflow"])
    figure = report.plot()
    marks = _lines(figure.axes[0])["non-finite output"]
    assert list(marks.get_xdata()) == [1e4]  # float16 sums overflow there


def test_plot_into_given_axes(plt):
    report = LayerNormAudit(layernorm_c.layer_norm, dtype="float64").run(["state"])
    figure, axes = plt.subplots(1, 2)
    try:
        assert report.plot(axes) is figure
        assert all(len(ax.get_lines()) == 4 for ax in axes)
        with pytest.raises(ValueError, match="two matplotlib Axes"):
            report.plot(axes[:1])
    finally:
        plt.close(figure)


def test_plot_needs_an_implementation():
    with pytest.raises(ValueError, match="no implementation to measure"):
        AuditReport("by hand", [CheckResult("c", "pass", "", "")]).plot()


def test_a_report_still_pickles_without_its_implementation():
    report = LayerNormAudit(lambda x, w, b, eps: layernorm_c.layer_norm(x, w, b, eps)).run()
    assert report.audit is not None
    again = pickle.loads(pickle.dumps(report))  # the lambda itself would not pickle
    assert str(again) == str(report) and again.results == report.results
    assert again.audit is None


def test_plot_without_matplotlib_says_how_to_install_it(monkeypatch):
    report = LayerNormAudit(layernorm_c.layer_norm).run(["state"])
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    with pytest.raises(ImportError, match="pip install matplotlib"):
        report.plot()


def test_exact_layer_norm_is_exact():
    # [1, 2, 3, 4] at eps 0: (x - 2.5) / sqrt(1.25), i.e. +-3/sqrt(5) and
    # +-1/sqrt(5), correctly rounded.
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        third, first = (float(decimal.Decimal(k) / decimal.Decimal(5).sqrt()) for k in (3, 1))
    y = exact_layer_norm([[1.0, 2.0, 3.0, 4.0]], 0.0)[0]
    assert list(y) == [-third, -first, first, third]
    # A common offset changes nothing in exact arithmetic (the shifted values
    # are exact here), unlike in float64.
    x = np.round(np.random.default_rng(1).standard_normal((4, 64)) * 2 ** 20) / 2 ** 20
    shifted = x + 2.0 ** 20
    assert np.array_equal(shifted - 2.0 ** 20, x)
    assert np.array_equal(exact_layer_norm(shifted, 1e-5), exact_layer_norm(x, 1e-5))
    reference = layernorm_c.reference_layer_norm(shifted).y
    assert not np.array_equal(reference, exact_layer_norm(x, 1e-5))
    np.testing.assert_allclose(reference, exact_layer_norm(x, 1e-5), rtol=0, atol=1e-9)
