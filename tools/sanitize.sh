#!/usr/bin/env bash
# tools/sanitize.sh - build layernorm_c with AddressSanitizer + UndefinedBehaviorSanitizer
# in a throw-away copy of the repository and run the test suite against it.
#
# The normal in-place build is never touched: the repository (minus .git,
# build products and virtual environments) is copied to a temporary folder,
# the extension is compiled there with
#     -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g1 -O1
# and pytest runs in that copy, so `import layernorm_c` picks the sanitized
# build (checked before the tests start). libasan is preloaded into Python
# (it must come first in the library list); libubsan comes in as a
# dependency of the extension.
#
# Any ASan or UBSan report fails the run: reports are written to log files
# (a report that kills the process would otherwise be lost in pytest's
# output capture) and the script fails if any log exists afterwards.
# CPython's own allocations are not leak-checked during the test suite
# (detect_leaks=0); a separate leak pass (tools/leakcheck.py) runs with
# LeakSanitizer on and fails only on leaks allocated from layernorm_c's code.
#
# Usage:
#   tools/sanitize.sh                 # build + whole test suite + leak pass
#   tools/sanitize.sh --c-suite       # the test files of tools/c_suite.txt only
#                                     # (every line of csrc/ the whole suite runs; CI)
#   tools/sanitize.sh -- -k fuzz      # extra arguments after -- go to pytest
#   tools/sanitize.sh --selftest      # prove it catches a planted 1-element over-read
#                                     # (exit 0 only if ASan reports it)
#   tools/sanitize.sh --keep          # keep the temporary copy (path printed)
#
# Environment: PYTHON (default: python3 from PATH, e.g. the activated venv),
# LEAKCHECK_ROUNDS (rounds of tools/leakcheck.py in the leak pass, default
# 20; a leak of any call shows in one round, more rounds only grow it),
# LAYERNORM_C_SANITIZE_DIR (work in this folder, kept afterwards, instead of
# a fresh temporary one that is removed).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
KEEP=0
SELFTEST=0
C_SUITE=0
PYTEST_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --keep) KEEP=1 ;;
        --c-suite) C_SUITE=1 ;;
        --selftest) SELFTEST=1 ;;
        --) shift; PYTEST_ARGS=("$@"); break ;;
        *) echo "sanitize.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

# shellcheck source=tools/tree_copy.sh
. "$ROOT/tools/tree_copy.sh"

if [ "$C_SUITE" = 1 ]; then
    mapfile -t C_FILES < <(c_suite_files "$ROOT")
    PYTEST_ARGS=("${C_FILES[@]}" "${PYTEST_ARGS[@]}")
fi

if [ -n "${LAYERNORM_C_SANITIZE_DIR:-}" ]; then
    WORK="$LAYERNORM_C_SANITIZE_DIR"   # the caller's folder: never deleted
    KEEP=1
else
    WORK="$(mktemp -d -t layernorm_c_sanitize.XXXXXX)"
fi
cleanup() {
    if [ "$KEEP" = 1 ]; then echo "sanitize.sh: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

log() { echo "sanitize.sh: $*"; }
T0=$(date +%s)

# ---- 1. copy the sources ------------------------------------------------------
rm -rf "$WORK/src" "$WORK/build-temp" "$WORK/reports"   # nothing stale from a past run
copy_tree "$ROOT" "$WORK/src"
SRC="$WORK/src"

if [ "$SELFTEST" = 1 ]; then
    [ ${#PYTEST_ARGS[@]} -gt 0 ] || PYTEST_ARGS=(-x tests/test_fuzz_api.py::test_every_layout_against_reference)
    # Plant a bug the real code must never have: every level's record
    # statistics read one element past the end of the record (x[d]). A
    # correct harness must fail with an ASan heap-buffer-overflow report.
    "$PYTHON" - "$SRC/csrc/ln_record.h" <<'PYEOF'
import re, sys
p = sys.argv[1]
s = open(p).read()
m = re.search(r"static void LN_FN\(stats\)\(const LN_S \*x, size_t d, ln_stats \*st\)\s*\{", s)
assert m, "selftest: could not find LN_FN(stats)(const LN_S *x, size_t d, ln_stats *st) in ln_record.h"
plant = "\n    volatile double planted_oob = (double)LN_LOAD(x + d); (void)planted_oob; /* SELFTEST */"
s = s[:m.end()] + plant + s[m.end():]
open(p, "w").write(s)
PYEOF
    log "selftest: planted an over-read of x[d] in the copy's record statistics (every level)"
fi

# ---- 2. build with the sanitizers ------------------------------------------------
# At -O1 (setup.py's LAYERNORM_C_OPT) with line tables only (-g1, all a
# report's stack needs): instrumented at -O3 with -g, each kernel file took
# GCC 7 to 12 minutes, three quarters of the whole run; at -O1 -g1, 1.5.
SAN_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g1"
log "building in $SRC with $SAN_FLAGS"
(
    cd "$SRC"
    CFLAGS="$SAN_FLAGS" LDFLAGS="-fsanitize=address,undefined" LAYERNORM_C_OPT=-O1 \
        "$PYTHON" setup.py -q build_ext --inplace --build-temp "$WORK/build-temp" \
        > "$WORK/build.log" 2>&1
) || { cat "$WORK/build.log"; log "build FAILED"; exit 1; }

SO=$(ls "$SRC"/layernorm_c/_core*.so)
SYMS="$(nm -D "$SO")"   # (not piped into grep -q: SIGPIPE + pipefail)
case "$SYMS" in *__asan_report*) ;; *) log "FAILED: $SO is not instrumented by ASan"; exit 1 ;; esac
case "$SYMS" in *__ubsan_handle*) ;; *) log "FAILED: $SO is not instrumented by UBSan"; exit 1 ;; esac

LIBASAN="$(gcc -print-file-name=libasan.so)"
[ -e "$LIBASAN" ] || { log "FAILED: libasan not found ($LIBASAN)"; exit 1; }

# libstdc++ right after libasan: C++ extensions in the test environment
# (matplotlib, torch) throw exceptions, and ASan's __cxa_throw interceptor
# needs the real one loaded when ASan starts, else "CHECK failed:
# real___cxa_throw".
LIBSTDCXX="$(gcc -print-file-name=libstdc++.so)"
[ -e "$LIBSTDCXX" ] && LIBASAN="$LIBASAN:$(readlink -f "$LIBSTDCXX")"

LOGDIR="$WORK/reports"
mkdir -p "$LOGDIR"
# detect_leaks=0: CPython keeps many allocations alive until exit on purpose.
# halt_on_error/abort: the first report ends the process (and the run).
export LD_PRELOAD="$LIBASAN${LD_PRELOAD:+:$LD_PRELOAD}"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=0:strict_string_checks=1:log_path=$LOGDIR/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$LOGDIR/ubsan"
# Python objects allocated by malloc, so ASan sees their bounds too.
export PYTHONMALLOC=malloc
export PYTHONPATH="$SRC${PYTHONPATH:+:$PYTHONPATH}"
# No faulthandler: its signal stack would stand in ASan's way when printing
# the stack of a crash (the report stops after its first lines).
unset PYTHONFAULTHANDLER
# Tests that measure RSS can tell they run here (ASan's shadow memory and
# its quarantine of freed blocks make RSS meaningless) and skip.
export LAYERNORM_C_SANITIZED=1

# The tests must import the sanitized copy, not an installed/editable build.
echo "sanitize.sh: $(assert_imports_copy "$PYTHON" "$SRC")"

report_and_fail() {
    log "FAILED: $1"
    for f in "$LOGDIR"/*; do
        [ -e "$f" ] || continue
        echo "===== $f"; cat "$f"
    done
    exit 1
}

# ---- 3. the test suite ------------------------------------------------------------------
log "running the test suite under ASan+UBSan"
T1=$(date +%s)
set +e
# RSS-growth tests that do not skip under LAYERNORM_C_SANITIZED themselves
# (ASan quarantines ~256 MB of freed memory; leaks are the leak pass's job).
# Two docs tests that cannot run in this copy and touch no C code: the
# browser test (Chromium and chromedriver inherit LD_PRELOAD=libasan and die
# at start: "Shadow memory range interleaves with an existing memory
# mapping"), and the conf.py import test (conf.py drops the copy's root,
# which is on PYTHONPATH here, from sys.path and so finds the editable
# install of the original tree instead of the copy the test expects).
# The three typing tests that run mypy, which calls no C code (a minute
# under ASan).
DESELECT=(--deselect tests/test_core_resources.py::test_no_memory_growth_over_thousands_of_calls
          --deselect tests/test_typing.py::test_package_is_strict_clean
          --deselect tests/test_typing.py::test_user_script_type_checks_strictly
          --deselect tests/test_typing.py::test_mypy_catches_a_wrong_call
          --ignore=tests/test_docs_browser.py
          --deselect tests/test_docs.py::test_docs_conf_imports_the_installed_package)
# --capture=sys: what native code writes to fd 2 reaches the real stderr
# instead of a per-test capture file that dies with the process. GCC's
# UBSan, linked beside ASan, ignores log_path and always writes there, so
# stderr is also kept in a file and a "runtime error:" in it is a report.
( cd "$SRC" && "$PYTHON" -m pytest -q -p no:cacheprovider -p no:faulthandler --capture=sys \
    "${DESELECT[@]}" "${PYTEST_ARGS[@]}" ) 2> >(tee "$WORK/pytest.stderr" >&2)
RC=$?
set -e
sleep 1 # let tee finish
if grep -q "runtime error:" "$WORK/pytest.stderr" 2> /dev/null; then
    grep -B2 -A20 "runtime error:" "$WORK/pytest.stderr" > "$LOGDIR/ubsan.stderr"
fi
T2=$(date +%s)
log "test suite: exit $RC in $((T2 - T1)) s"
if [ "$SELFTEST" = 1 ]; then
    # Success here means the planted over-read was caught and reported: a
    # heap-buffer-overflow whose innermost frame is the planted line, in
    # LN_FN(stats) of ln_record.h (stats_f16, stats_f32, ... once inlined).
    FRAME="$(grep -ls "heap-buffer-overflow" "$LOGDIR"/asan* 2> /dev/null |
             xargs -r grep -h -m1 -oE "#0 0x[0-9a-f]+ in stats_[a-z0-9_]+ [^ ]*ln_record\.h:[0-9]+" |
             head -n 1 | sed 's/^#0 0x[0-9a-f]* in //')" || true
    if [ -n "$FRAME" ]; then
        grep -h -m1 -A3 "ERROR: AddressSanitizer" "$LOGDIR"/asan* || true
        log "selftest OK: ASan reported the planted heap-buffer-overflow in $FRAME"
        exit 0
    fi
    report_and_fail "selftest: the planted over-read was NOT reported"
fi
if compgen -G "$LOGDIR/*" > /dev/null; then
    report_and_fail "sanitizer report(s) during the test suite"
fi
[ "$RC" = 0 ] || report_and_fail "pytest exit status $RC"

# ---- 4. leak pass: LeakSanitizer on, only leaks from layernorm_c's code count --------------
log "leak pass (LeakSanitizer)"
set +e
( cd "$SRC" && ASAN_OPTIONS="detect_leaks=1:exitcode=23:halt_on_error=1:log_path=$LOGDIR/lsan" \
    "$PYTHON" "$SRC/tools/leakcheck.py" "${LEAKCHECK_ROUNDS:-20}" ) | tee "$WORK/leakcheck.out"
RC=${PIPESTATUS[0]}
set -e
# LeakSanitizer replaces the exit status by 23 whenever it finds leaks (and
# CPython always has some), so a leakcheck.py that failed would look like
# one that finished: it must have printed its closing count.
grep -q "^leakcheck: [0-9]* calls" "$WORK/leakcheck.out" ||
    report_and_fail "tools/leakcheck.py did not run to its end (exit status $RC)"
OURS=0
for f in "$LOGDIR"/lsan*; do
    [ -e "$f" ] || continue
    # A leak is ours if one of its allocation frames is in the extension.
    if "$PYTHON" "$SRC/tools/lsan_filter.py" "$f"; then
        rm -f "$f"        # CPython/NumPy interpreter-lifetime allocations only
    else
        OURS=1
    fi
done
if [ "$OURS" = 1 ] || compgen -G "$LOGDIR/[au]*san*" > /dev/null; then
    report_and_fail "leak(s) allocated by layernorm_c"
fi
[ "$RC" = 0 ] || [ "$RC" = 23 ] || report_and_fail "leak pass exit status $RC"
log "OK: 0 ASan/UBSan reports, 0 leaks from layernorm_c ($(( $(date +%s) - T0 )) s in all)"
