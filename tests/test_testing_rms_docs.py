"""docs/validating.rst ("Validating an RMSNorm") quotes a real report and
real command-line output of the RMSNorm battery on examples/my_rms_norm.py;
they are kept, line for line, in docs/rms_audit_report.txt and
docs/rms_audit_cli.txt, and these tests make them again and compare.

After a deliberate change to the battery's words or figures, write them
anew with ``python tests/test_testing_rms_docs.py``.
"""
import contextlib
import importlib.util
import io
import os
import sys
from pathlib import Path

import pytest

import layernorm_c

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "my_rms_norm.py"
REPORT = ROOT / "docs" / "rms_audit_report.txt"
CLI = ROOT / "docs" / "rms_audit_cli.txt"

#: The command lines the docs show, as typed from the repository's root.
COMMANDS = (
    "--op rms_norm examples/my_rms_norm.py:rms_norm --checks eps,float16_overflow,accumulation",
    "--op rms_norm --dtype bfloat16 examples/my_rms_norm.py:rms_norm_fixed",
)


def _example():
    spec = importlib.util.spec_from_file_location("my_rms_norm", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def report_text() -> str:
    from layernorm_c.testing import RMSNormAudit

    report = RMSNormAudit(_example().rms_norm, name="my_rms_norm.rms_norm").run()
    return str(report) + "\n"


def cli_text() -> str:
    from layernorm_c.testing._cli import main

    out = []
    before = os.getcwd()
    os.chdir(ROOT)
    try:
        for command in COMMANDS:
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                code = main(command.split())
            out.append(f"$ python -m layernorm_c audit {command}\n{buffer.getvalue()}"
                       f"$ echo $?\n{code}\n")
    finally:
        os.chdir(before)
    return "".join(out)


def test_report_in_the_docs_is_real():
    assert REPORT.read_text(encoding="utf-8") == report_text()


@pytest.mark.skipif(layernorm_c._bf16.BFLOAT16 is None,
                    reason="the second command audits in bfloat16 (ml_dtypes)")
def test_cli_output_in_the_docs_is_real():
    assert CLI.read_text(encoding="utf-8") == cli_text()


def test_the_docs_include_them():
    page = (ROOT / "docs" / "validating.rst").read_text(encoding="utf-8")
    assert ".. literalinclude:: rms_audit_report.txt" in page
    assert ".. literalinclude:: rms_audit_cli.txt" in page
    assert ".. literalinclude:: ../examples/my_rms_norm.py" in page


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    REPORT.write_text(report_text(), encoding="utf-8")
    CLI.write_text(cli_text(), encoding="utf-8")
    print(f"wrote {REPORT} and {CLI}")
