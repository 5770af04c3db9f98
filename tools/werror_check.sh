#!/usr/bin/env bash
# tools/werror_check.sh - csrc/ compiles without a single warning under GCC and
# clang: every csrc/*.c (_coremodule.c with the Python and NumPy headers of
# the active python3) with setup.py's flags (-O3: some warnings only show
# after inlining) plus -Wmissing-field-initializers, as errors (-Werror).
#
#   tools/werror_check.sh            # gcc and clang (clang skipped if missing)
#   CCS="gcc-12 clang-14" tools/werror_check.sh
#
# The user build (setup.py) never uses -Werror: a newer compiler's new
# warning must not break `pip install`. CI builds the extension with
# LAYERNORM_C_WERROR=1 (setup.py adds -Werror) and runs this script, and
# tools/cross_check.sh builds the kernels with -Werror for aarch64 too.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
T0=$(date +%s)
log() { echo "werror_check.sh: $*"; }
PY_INC="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
NP_INC="$("$PYTHON" -c 'import numpy; print(numpy.get_include())')"
WARN=(-std=c11 -ffp-contract=off -fno-fast-math -fno-math-errno -Wall -Wextra -Wno-unused-parameter
      -Wmissing-field-initializers -Werror)
CCS="${CCS:-gcc clang}"
OUT="$(mktemp -d -t layernorm_c_werror.XXXXXX)"
trap 'rm -rf "$OUT"' EXIT
n=0
status=0
for cc in $CCS; do
    if ! command -v "$cc" > /dev/null; then
        log "$cc not found: skipped"
        continue
    fi
    cc_status=0
    for opt in -O3; do
        pids=()
        files=()
        for f in "$ROOT"/csrc/*.c; do
            o="$OUT/$cc$opt-$(basename "$f" .c)"
            "$cc" "$opt" "${WARN[@]}" -fPIC -I"$ROOT/csrc" -I"$PY_INC" -I"$NP_INC" \
                -c "$f" -o "$o.o" > "$o.log" 2>&1 &
            pids+=($!)
            files+=("$f")
        done
        for i in "${!pids[@]}"; do
            n=$((n + 1))
            if ! wait "${pids[$i]}"; then
                log "FAILED: $cc $opt ${files[$i]#"$ROOT"/}"
                cat "$OUT/$cc$opt-$(basename "${files[$i]}" .c).log"
                cc_status=1
            fi
        done
    done
    [ "$cc_status" = 0 ] && log "$cc ($("$cc" --version | head -1)): clean"
    [ "$cc_status" = 0 ] || status=1
done
[ "$status" = 0 ] || { log "FAILED: warnings in csrc/"; exit 1; }
log "OK: $n compilations without a warning ($(( $(date +%s) - T0 )) s)"
