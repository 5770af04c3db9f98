#!/usr/bin/env bash
# tools/valgrind.sh - valgrind memcheck over every entry point and a small
# test subset. Exit status non-zero on any memcheck error or definite leak.
#
#   tools/valgrind.sh                  # leakcheck.py + the default pytest subset
#   tools/valgrind.sh tests/test_x.py  # other pytest arguments instead
#
# Runs against the build that `python -c "import layernorm_c"` finds from the
# repository root (the in-place or editable build). PYTHONMALLOC=malloc, so
# that every Python object is a malloc block memcheck can follow;
# tools/valgrind-python.supp holds the CPython/NumPy/glibc suppressions.
# Levels: valgrind 3.19 hides AVX-512 from the program (CPUID) but emulates
# AVX2, FMA and F16C, so ln_isa_supported() offers scalar, portable and avx2
# here, and leakcheck.py and the layout sweep run each of them (checked:
# lnc.supported_isas() == ('scalar', 'portable', 'avx2') under memcheck,
# results bit-identical). AVX-512 is covered natively by tools/sanitize.sh
# and the kernel fuzzer.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
command -v valgrind > /dev/null || { echo "valgrind.sh: valgrind not installed" >&2; exit 1; }
LOGDIR="$(mktemp -d -t layernorm_c_valgrind.XXXXXX)"
VG=(valgrind --tool=memcheck --error-exitcode=99 --leak-check=full
    --show-leak-kinds=definite --errors-for-leak-kinds=definite --num-callers=40
    --suppressions="$ROOT/tools/valgrind-python.supp" --log-file="$LOGDIR/vg.%p.log")
export PYTHONMALLOC=malloc
cd "$ROOT"
if [ $# -gt 0 ]; then
    PYTEST_ARGS=("$@")
else
    PYTEST_ARGS=(tests/test_stress_refcount.py "tests/test_fuzz_api.py::test_every_layout_against_reference")
fi
status=0
T0=$(date +%s)
echo "valgrind.sh: leakcheck.py (every entry point, success and error paths)"
"${VG[@]}" "$PYTHON" tools/leakcheck.py 2 || status=$?
echo "valgrind.sh: pytest ${PYTEST_ARGS[*]}"
"${VG[@]}" "$PYTHON" -m pytest -q -p no:cacheprovider "${PYTEST_ARGS[@]}" || status=$?
for f in "$LOGDIR"/vg.*.log; do
    grep -H "ERROR SUMMARY" "$f" || true
done
if [ "$status" != 0 ]; then
    for f in "$LOGDIR"/vg.*.log; do
        if ! grep -q "ERROR SUMMARY: 0 errors" "$f"; then echo "===== $f"; cat "$f"; fi
    done
    echo "valgrind.sh: FAILED (exit $status); logs in $LOGDIR"
    exit 1
fi
rm -rf "$LOGDIR"
echo "valgrind.sh: OK, 0 errors ($(( $(date +%s) - T0 )) s)"
