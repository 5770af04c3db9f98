#!/usr/bin/env bash
# tools/c_coverage.sh - which lines of csrc/ a pytest run executes (gcov).
#
# Builds the extension with --coverage (-O1, like the sanitizer build) in a
# throw-away copy of the repository, runs pytest there with the arguments
# given, and writes the executed lines of every csrc/ file as JSON
# ({"csrc/ln_batch.c": [12, 13, ...], ...}) to the output file. It is how
# the test subset that tools/sanitize.sh runs in CI was chosen: compare the
# whole suite's lines with the subset's (tools/c_coverage.py).
#
#   tools/c_coverage.sh OUT.json                     # the whole suite
#   tools/c_coverage.sh OUT.json --c-suite           # the files of tools/c_suite.txt
#   tools/c_coverage.sh OUT.json -- tests/test_x.py  # pytest arguments after --
#   python tools/c_coverage.py WHOLE.json SUBSET.json  # lines WHOLE runs and SUBSET does not
#
# Needs gcov (GCC's, 9 or newer for --json-format). PYTHON as in sanitize.sh.
# The docs conf.py test is left out, as in sanitize.sh (it cannot run in a
# copy of the tree, and runs no C code).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
# shellcheck source=tools/tree_copy.sh
. "$ROOT/tools/tree_copy.sh"
USAGE="usage: tools/c_coverage.sh OUT.json [--c-suite] [-- pytest args]"
[ $# -ge 1 ] || { echo "$USAGE" >&2; exit 2; }
OUTFILE="$(realpath -m "$1")"; shift
PYTEST_ARGS=()
if [ "${1:-}" = --c-suite ]; then
    mapfile -t PYTEST_ARGS < <(c_suite_files "$ROOT")
    shift
fi
if [ $# -gt 0 ]; then
    [ "$1" = -- ] || { echo "$USAGE" >&2; exit 2; }
    shift; PYTEST_ARGS+=("$@")
fi
command -v gcov > /dev/null || { echo "c_coverage.sh: gcov not installed" >&2; exit 1; }
WORK="$(mktemp -d -t layernorm_c_coverage.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
log() { echo "c_coverage.sh: $*"; }

copy_tree "$ROOT" "$WORK/src"
SRC="$WORK/src"
# Atomic counters: the kernels run on several threads.
log "building in $SRC with --coverage -O1"
( cd "$SRC" && CFLAGS="--coverage -fprofile-update=atomic" LDFLAGS="--coverage" LAYERNORM_C_OPT=-O1 \
    "$PYTHON" setup.py -q build_ext --inplace --build-temp "$WORK/build-temp" \
    > "$WORK/build.log" 2>&1 ) || { cat "$WORK/build.log"; exit 1; }
export PYTHONPATH="$SRC${PYTHONPATH:+:$PYTHONPATH}"
log "$(assert_imports_copy "$PYTHON" "$SRC")"
log "pytest ${PYTEST_ARGS[*]:-(the whole suite)}"
set +e
( cd "$SRC" && "$PYTHON" -m pytest -q -p no:cacheprovider \
    --deselect tests/test_docs.py::test_docs_conf_imports_the_installed_package \
    "${PYTEST_ARGS[@]}" ) > "$WORK/pytest.log" 2>&1
RC=$?
set -e
tail -n 3 "$WORK/pytest.log"
[ "$RC" = 0 ] || { log "pytest exit status $RC (coverage written anyway)"; }
# gcov's JSON (one .gcov.json.gz per object): a line counts as executed if
# any object that includes it ran it (a header's lines are in several).
mkdir -p "$WORK/gcov"
( cd "$WORK/gcov" && gcov --json-format --object-directory "$WORK/build-temp/csrc" \
    "$WORK"/build-temp/csrc/*.gcda > /dev/null 2>&1 )
"$PYTHON" - "$WORK/gcov" "$SRC" "$OUTFILE" <<'PYEOF'
import gzip, json, os, sys
from pathlib import Path
gcov_dir, src, out = Path(sys.argv[1]), os.path.realpath(sys.argv[2]), sys.argv[3]
lines = {}
for path in sorted(gcov_dir.glob("*.gcov.json.gz")):
    for f in json.load(gzip.open(path))["files"]:
        name = os.path.relpath(os.path.realpath(os.path.join(src, f["file"])), src)
        if not name.startswith("csrc/"):
            continue
        hit = lines.setdefault(name, set())
        hit.update(l["line_number"] for l in f["lines"] if l["count"] > 0)
if not lines:
    sys.exit("c_coverage.sh: gcov wrote no csrc/ lines")
json.dump({k: sorted(v) for k, v in lines.items()}, open(out, "w"), indent=0, sort_keys=True)
total = sum(len(v) for v in lines.values())
print(f"c_coverage.sh: {total} executed lines of csrc/ in {len(lines)} files -> {out}")
PYEOF
