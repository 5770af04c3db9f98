"""docs/adding-an-op.rst stays in step with the code: every source path it
mentions exists, and every name it quotes as ``code`` occurs in the sources.

The excerpts themselves are ``literalinclude`` directives, which the
warnings-as-errors build of tests/test_docs.py fails on when their markers
are gone; this checks the prose around them.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List

from docs_support import DOCS, ROOT

PAGE = DOCS / "adding-an-op.rst"

#: Folders whose paths the page may mention, and where quoted names are looked up.
SOURCE_DIRS = ("csrc", "layernorm_c", "tests", "tools", "fuzz")
PATH_RE = re.compile(r"(?<![\w./-])(?:\.\./)?((?:csrc|layernorm_c|tests|tools|fuzz|docs)/[\w./-]*\w)")
#: A bare file name in a literal (``ln_ops.h``, ``_api.py``).
FILE_RE = re.compile(r"^[\w-]+\.(?:h|c|py|pyi|sh|rst)$")
#: A literal that names code: identifiers joined by ``.`` or ``->``, with an
#: optional argument list of identifiers (``LN_OPS(rms_norm)``).
NAME_RE = re.compile(r"^[A-Za-z_]\w*(?:(?:\.|->)[A-Za-z_]\w*)*(?:\((?:[A-Za-z_]\w*)?\))?$")
IDENT_RE = re.compile(r"[A-Za-z_]\w*")
#: The names the kernel template gives an instance's functions (ln_level.h:
#: ``#define LN_FN(f) f##_f32`` and so on).
INSTANCE_SUFFIX = re.compile(r"^(\w+?)(_(?:f16|bf16|f32|f64)(?:_wide)?)$")
#: Template macros whose argument is a function name, not a whole identifier.
TEMPLATE_MACROS = ("LN_FN", "LN_OPS", "LN_CORE", "LN_WIDE")


def _sources() -> Dict[str, str]:
    """Every source file's text, by path relative to the repository root
    (this file left out: it names things that do not exist on purpose)."""
    out = {}
    for top in SOURCE_DIRS:
        for p in sorted((ROOT / top).rglob("*")):
            if p.is_file() and p.suffix in (".c", ".h", ".py", ".pyi", ".sh") and \
                    p.resolve() != Path(__file__).resolve():
                out[p.relative_to(ROOT).as_posix()] = p.read_text(encoding="utf-8")
    return out


def _literals(text: str) -> List[str]:
    """The inline literals (``...``) of reStructuredText, joined across lines."""
    return [" ".join(m.split()) for m in re.findall(r"``(.+?)``", text, re.S)]


def _words(text: str) -> set:
    return set(re.findall(r"\w+", text))


def problems(text: str, sources: Dict[str, str]) -> List[str]:
    """What the page names that the code does not have."""
    found = []
    c_text = "\n".join(t for p, t in sources.items() if p.startswith("csrc/"))
    c_words = _words(c_text)
    all_words = _words("\n".join(sources.values()))
    suffixes = set(re.findall(r"#define LN_FN\(f\) f##(\w+)", c_text))
    macro_args = set(re.findall(r"\b(?:%s)\((\w+)\)" % "|".join(TEMPLATE_MACROS), c_text))
    files = {Path(p).name for p in sources} | {p.name for p in DOCS.glob("*.rst")}

    for path in sorted(set(PATH_RE.findall(text))):
        path = path.split("::")[0]
        if path.startswith("docs/_build"):
            continue  # the build's output (the page's build command)
        if not (ROOT / path).exists():
            found.append(f"path {path} does not exist")
    for lit in _literals(text):
        if FILE_RE.match(lit):
            if lit not in files:
                found.append(f"file ``{lit}`` is in none of {', '.join(SOURCE_DIRS)}, docs")
            continue
        if not NAME_RE.match(lit):
            continue  # a formula, a command, a call with arguments
        for name in IDENT_RE.findall(lit):
            is_c = name.startswith(("ln_", "LN_")) or "(" in lit or "->" in lit
            words = c_words if is_c else all_words
            if name in words:
                continue
            m = INSTANCE_SUFFIX.match(name)
            if m and m.group(1) in macro_args and m.group(2) in suffixes:
                continue  # an instance's name, e.g. stats_rms_f32 from LN_FN(stats_rms)
            where = "csrc/" if is_c else "the sources"
            found.append(f"``{lit}``: {name} does not occur in {where}")
    return found


def test_page_is_in_the_toctree():
    index = (DOCS / "index.rst").read_text(encoding="utf-8")
    assert re.search(r"^\s+adding-an-op\s*$", index, re.M), "docs/index.rst: no adding-an-op"


def test_every_path_and_name_on_the_page_exists():
    found = problems(PAGE.read_text(encoding="utf-8"), _sources())
    assert not found, "docs/adding-an-op.rst is out of step with the code:\n" + "\n".join(found)


def test_the_check_catches_stale_names():
    """The check can fail: a removed file, a renamed C function, a
    template name without its function, and a Python name that is gone."""
    sources = _sources()
    page = ("See ``csrc/ln_gone.h`` and csrc/ln_nope.c, ``ln_gone.h``, "
            "``ln_batch_gone``, ``LN_OPS(no_such_kernel)``, "
            "``no_such_kernel_f32``, ``rms_norm_f99``, ``_no_such_helper``; "
            "but ``rms_norm_f32``, ``stats_rms_f32_wide``, ``LN_OPS(rms_norm)``, "
            "``st->var``, ``1 + weight`` and ``python -m pytest`` are fine.")
    found = problems(page, sources)
    for bad in ("csrc/ln_gone.h", "csrc/ln_nope.c", "``ln_gone.h``", "ln_batch_gone",
                "LN_OPS(no_such_kernel)", "no_such_kernel_f32", "rms_norm_f99",
                "_no_such_helper"):
        assert any(bad in f for f in found), (bad, found)
    assert len(found) == 8, found


#: What calls RMSNorm, in Python or C.
CALLS_RMS = re.compile(r"rms_norm|RMSNorm|_rms_(?:w|none)\b|_fast_rms|LN_OP_RMS_NORM")
#: What draws bfloat16.
DRAWS_BF16 = re.compile(r"BFLOAT16|BF16|bfloat16")


def _hardening_section(text: str) -> str:
    m = re.search(r"Then the hardening runs(.+?)9\. Checklist", text, re.S)
    assert m, "the hardening part of step 8 is gone: update this test"
    return m.group(1)


def test_every_hardening_file_the_page_lists_calls_rmsnorm():
    """Step 8 lists the hardening files an op must be added to, and its
    note says RMSNorm is in every one of them (and in the files the note
    names): true for each, and the check can fail."""
    text = " ".join(PAGE.read_text(encoding="utf-8").split())
    section = _hardening_section(text)
    listed = sorted(set(re.findall(r"``((?:tests|tools|fuzz)/[\w/.]+)``", section)))
    assert len(listed) >= 8, listed
    for path in listed:
        source = (ROOT / path).read_text(encoding="utf-8")
        if path.endswith(".sh"):  # a runner: it runs tools/leakcheck.py (and pytest)
            assert "tools/leakcheck.py" in source, path
            continue
        if path.endswith(".txt"):  # a list of test files: RMSNorm's is in it
            assert "tests/test_rms.py" in source.splitlines(), path
            continue
        assert CALLS_RMS.search(source), (
            f"{path} does not call RMSNorm: docs/adding-an-op.rst says every hardening "
            f"file does")
    assert not CALLS_RMS.search("layer_norm(x, w, b); layer_norm_backward(dy, x)")


def test_the_note_on_bfloat16_is_true():
    """The note names the hardening files that draw bfloat16: each does."""
    text = " ".join(PAGE.read_text(encoding="utf-8").split())
    m = re.search(r"draw bfloat16 too when ml_dtypes is installed: (.+?)\. The fuzzer", text)
    assert m, "the note on bfloat16 in the hardening files is gone: update this test"
    listed = re.findall(r"``([\w/.]+)``", m.group(1))
    assert len(listed) >= 5, listed
    for path in listed:
        source = (ROOT / path).read_text(encoding="utf-8")
        assert DRAWS_BF16.search(source), f"{path} does not draw bfloat16, as the note says"
