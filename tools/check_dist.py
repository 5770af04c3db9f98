"""Check a built sdist and wheel of layernorm_c before they are used.

    python tools/check_dist.py dist/layernorm_c-*.tar.gz dist/layernorm_c-*.whl
    python tools/check_dist.py --numpy-floor dist/layernorm_c-*.whl   # prints e.g. 1.23

The sdist must hold the LICENSE and the whole source tree: every file git
tracks (when run in a git checkout), or else at least what the test suite
needs. The wheel must carry the LICENSE in its .dist-info, the SPDX license
expression, the pytest plugin module and its entry point, and, on Linux, an
extension without debug sections when built with LAYERNORM_C_RELEASE=1
(``--release``). ``--numpy-floor`` prints the X.Y of the wheel's
``numpy>=X.Y`` requirement, the oldest NumPy it may be installed with.
Exit status 1 with the problems listed if any check fails.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Needed by the test suite, whatever git says (tests, their helpers, the
#: docs they build, the benchmark and the example they run, the CI script
#: they read).
NEEDED = ["LICENSE", "README.md", "pyproject.toml", "setup.py", "MANIFEST.in",
          "pytest_layernorm_c.py", ".ci/run", "tests/conftest.py",
          "tests/subprocess_support.py", "tests/cases.py", "tests/fuzz_support.py",
          "docs/conf.py", "docs/index.rst", "docs/_static/bench.png", "benchmarks/bench.py",
          "examples/gpt2_numpy.py"]


def tracked_files() -> list[str] | None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return None
    proc = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    return [f for f in proc.stdout.splitlines() if f != ".gitignore" and (ROOT / f).exists()]


def check_sdist(path: Path) -> list[str]:
    with tarfile.open(path) as tar:
        names = [m.name for m in tar.getmembers() if m.isfile()]
        prefix = names[0].split("/")[0] + "/"
        files = {n[len(prefix):] for n in names if n.startswith(prefix)}
        license_text = tar.extractfile(prefix + "LICENSE").read() if "LICENSE" in files else b""
    problems = []
    tracked = tracked_files()
    for f in sorted(set(NEEDED) | set(tracked or [])):
        if f not in files:
            problems.append(f"sdist: {f} missing")
    if license_text != (ROOT / "LICENSE").read_bytes():
        problems.append("sdist: LICENSE differs from the repository's")
    bad = sorted(f for f in files if re.search(r"(\.so|\.pyd|\.o|\.pyc)$|__pycache__", f))
    if bad:
        problems.append(f"sdist: build products {bad}")
    print(f"check_dist: sdist {path.name}: {len(files)} files, checked against "
          + (f"the {len(tracked)} files git tracks" if tracked else "the files the tests need")
          + (": OK" if not problems else f": {len(problems)} problem(s)"))
    return problems


def _metadata(whl: zipfile.ZipFile) -> tuple[str, str]:
    info = next(n.split("/")[0] for n in whl.namelist() if n.split("/")[0].endswith(".dist-info"))
    return info, whl.read(f"{info}/METADATA").decode()


def numpy_floor(path: Path) -> str:
    with zipfile.ZipFile(path) as whl:
        _, meta = _metadata(whl)
    m = re.search(r"^Requires-Dist: numpy\s*>=\s*(\d+\.\d+)", meta, re.M)
    if not m:
        sys.exit(f"check_dist: no numpy>=X.Y requirement in {path.name}")
    return m.group(1)


def check_wheel(path: Path, release: bool) -> list[str]:
    problems = []
    with zipfile.ZipFile(path) as whl:
        names = whl.namelist()
        info, meta = _metadata(whl)
        license_file = f"{info}/licenses/LICENSE"
        if license_file not in names or whl.read(license_file) != (ROOT / "LICENSE").read_bytes():
            problems.append(f"wheel: {license_file} missing or not the repository's")
        if not re.search(r"^License-Expression: MIT$", meta, re.M):
            problems.append("wheel: METADATA has no 'License-Expression: MIT'")
        entry_points = whl.read(f"{info}/entry_points.txt").decode()
        if "layernorm_c.testing.plugin = pytest_layernorm_c" not in entry_points:
            problems.append("wheel: the pytest11 entry point is not "
                            "'layernorm_c.testing.plugin = pytest_layernorm_c'")
        if "pytest_layernorm_c.py" not in names:
            problems.append("wheel: pytest_layernorm_c.py missing")
        cores = [n for n in names if re.match(r"layernorm_c/_core\..*(so|pyd)$", n)]
        if len(cores) != 1:
            problems.append(f"wheel: expected one compiled layernorm_c/_core, found {cores}")
        elif release and cores[0].endswith(".so") and sys.platform.startswith("linux"):
            with tempfile.TemporaryDirectory() as tmp:
                so = Path(whl.extract(cores[0], tmp))
                sections = subprocess.run(["readelf", "-S", "-W", str(so)], capture_output=True,
                                          text=True, check=True).stdout
            debug = sorted(set(re.findall(r"\.debug_\w+", sections)))
            if debug:
                problems.append(f"wheel: release build has debug sections {debug}")
    print(f"check_dist: wheel {path.name}: license, metadata, plugin"
          + (", no debug sections" if release else "")
          + (": OK" if not problems else f": {len(problems)} problem(s)"))
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="an sdist (.tar.gz) and/or a wheel")
    parser.add_argument("--release", action="store_true",
                        help="the wheel was built with LAYERNORM_C_RELEASE=1")
    parser.add_argument("--numpy-floor", action="store_true",
                        help="print the oldest NumPy X.Y the wheel allows, check nothing")
    args = parser.parse_args(argv)
    if args.numpy_floor:
        print(numpy_floor(next(f for f in args.files if f.suffix == ".whl")))
        return 0
    problems = []
    for f in args.files:
        problems += check_sdist(f) if f.name.endswith(".tar.gz") else check_wheel(f, args.release)
    for p in problems:
        print(f"check_dist: FAILED: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
