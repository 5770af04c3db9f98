"""layernorm_c.testing in a notebook: the HTML display of reports and
results."""
from html.parser import HTMLParser

import pytest

import ln_gallery
from layernorm_c.testing import AuditReport, CheckResult, LayerNormAudit
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
