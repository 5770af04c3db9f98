#!/usr/bin/env bash
# fuzz/build.sh - build the libFuzzer target for the C kernels.
#
# Links fuzz/fuzz_kernels.c with every csrc/ln_*.c (never _coremodule.c:
# no Python) under -fsanitize=fuzzer,address,undefined, with the flags that
# the reproducibility contract needs (-ffp-contract=off, no fast-math).
# Output: fuzz/build/fuzz_kernels (override the folder with OUT=...).
#
#   fuzz/build.sh && fuzz/build/fuzz_kernels -max_total_time=300 fuzz/build/corpus
#
# FUZZ_SAN=thread builds fuzz/build/fuzz_kernels_tsan instead: the kernels
# under ThreadSanitizer (the batch thread pool), without libFuzzer's
# coverage counters in them (their racy increments would be reported).
#
# Needs clang with the libFuzzer runtime (Debian: apt-get install clang
# libclang-rt-14-dev, or whatever version `apt-cache policy clang` offers).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-$ROOT/fuzz/build}"
CC="${CC:-}"
if [ -z "$CC" ]; then
    for c in clang clang-19 clang-18 clang-17 clang-16 clang-15 clang-14; do
        if command -v "$c" > /dev/null; then CC="$c"; break; fi
    done
fi
[ -n "$CC" ] || { echo "fuzz/build.sh: clang not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 1; }
mkdir -p "$OUT/corpus"
SOURCES=()
for f in "$ROOT"/csrc/ln_*.c; do SOURCES+=("$f"); done
# -O2 like a release build (the contract must hold there), -g for reports;
# FUZZ_OPT replaces both (CI: OSS-Fuzz's "-O1 -gline-tables-only", less to compile).
COMMON=(${FUZZ_OPT:--O2 -g} -std=c11 -ffp-contract=off -fno-fast-math -fno-math-errno -fno-omit-frame-pointer
        -Wall -Wextra -Wno-unused-parameter -Wmissing-field-initializers -I"$ROOT/csrc")
if [ "${FUZZ_SAN:-address}" = thread ]; then
    OBJ="$OUT/tsan-obj"
    mkdir -p "$OBJ"
    OBJS=()
    for f in "${SOURCES[@]}"; do
        o="$OBJ/$(basename "$f" .c).o"
        "$CC" "${COMMON[@]}" -fsanitize=thread -c "$f" -o "$o"
        OBJS+=("$o")
    done
    "$CC" "${COMMON[@]}" -fsanitize=fuzzer,thread "$ROOT/fuzz/fuzz_kernels.c" "${OBJS[@]}" \
        -o "$OUT/fuzz_kernels_tsan" -pthread -lm
    echo "fuzz/build.sh: built $OUT/fuzz_kernels_tsan (ThreadSanitizer) with $("$CC" --version | head -1)"
    exit 0
fi
# The kernels get coverage counters but no comparison tracing: their integer
# compares are loop bounds, once per element, that would slow every run
# severalfold and tell the fuzzer nothing the harness's decoding does not.
SAN=(-fsanitize=address,undefined -fno-sanitize-recover=all)
OBJ="$OUT/asan-obj"
mkdir -p "$OBJ"
OBJS=()
for f in "${SOURCES[@]}"; do
    o="$OBJ/$(basename "$f" .c).o"
    "$CC" "${COMMON[@]}" "${SAN[@]}" -fsanitize=fuzzer-no-link -fno-sanitize-coverage=trace-cmp \
        -c "$f" -o "$o" &
    OBJS+=("$o")
done
wait_all() { local rc=0; for p in $(jobs -p); do wait "$p" || rc=1; done; return $rc; }
wait_all || { echo "fuzz/build.sh: compiling the kernels failed" >&2; exit 1; }
"$CC" "${COMMON[@]}" "${SAN[@]}" -fsanitize=fuzzer "$ROOT/fuzz/fuzz_kernels.c" "${OBJS[@]}" \
    -o "$OUT/fuzz_kernels" -pthread -lm
echo "fuzz/build.sh: built $OUT/fuzz_kernels with $("$CC" --version | head -1)"
