#!/usr/bin/env bash
# tools/fuzz_kernels.sh - build the libFuzzer target of the C kernels and run it.
#
#   tools/fuzz_kernels.sh            # 60 s (the CI-sized run)
#   tools/fuzz_kernels.sh 600        # 10 minutes
#   CORPUS=fuzz/build/corpus tools/fuzz_kernels.sh 3600   # keep the corpus
#   FUZZ_SAN=thread tools/fuzz_kernels.sh 120   # ThreadSanitizer on the kernels
#
# Fails (non-zero exit) on any ASan/UBSan report, any output that differs
# between the scalar kernels and another ISA (bit for bit, NaN payloads
# included unless LN_FUZZ_NAN_LOOSE=1), any input the kernels modified, any
# write outside the output items, or a timeout; the crashing
# input is saved next to the binary (crash-*), to replay with
#   fuzz/build/fuzz_kernels CRASH_FILE
# (fuzz/known/ holds inputs that once showed a difference: regression inputs).
# Needs clang + libFuzzer: apt-get install -y clang libclang-rt-14-dev
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SECONDS_BUDGET="${1:-60}"
export OUT="${OUT:-$ROOT/fuzz/build}"
"$ROOT/fuzz/build.sh"
if [ -z "${CORPUS:-}" ]; then
    CORPUS="$(mktemp -d -t layernorm_c_corpus.XXXXXX)"
    trap 'rm -rf "$CORPUS"' EXIT
fi
mkdir -p "$CORPUS"
# A few seeds, one per job kind (row, batch, half), so that every kind is
# reached at once; libFuzzer mutates from there.
printf '\x00\x07\x21\x00\x00\x01\x02\x03\x04\x00' > "$CORPUS/seed-row-f32"
printf '\x00\x5f\x40\x01\x01\x00\x00\x00\x00\x00\x01\x02\x03' > "$CORPUS/seed-row-f64"
printf '\x02\x1c\x01\x21\x00\x03\x02\x05\x03\x04\x05\x00\x01\x00\x01' > "$CORPUS/seed-batch"
printf '\x04\x10\x03\x00\x7c\x01\x7c\x00\x7e\xff\xff' > "$CORPUS/seed-half"
# a batch above the threading threshold (flags 0x3d, magic 0x5a 0xc3), 4 threads
printf '\x02\x3d\x5a\xc3\x01\x20\x00\x03\x03' > "$CORPUS/seed-batch-threads"
# LN_FUZZ_NAN_LOOSE=1 accepts NaNs whose payload/sign differ between ISAs
# (see docs/reliability.rst: a known difference); unset, they fail.
echo "fuzz_kernels.sh: fuzzing for ${SECONDS_BUDGET}s, corpus $CORPUS," \
     "NaN payloads: $([ "${LN_FUZZ_NAN_LOOSE:-0}" != 0 ] && echo 'any NaN accepted' || echo 'must match')"
BIN="$OUT/fuzz_kernels"
if [ "${FUZZ_SAN:-address}" = thread ]; then
    BIN="$OUT/fuzz_kernels_tsan"
    export TSAN_OPTIONS="halt_on_error=1${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
fi
"$BIN" -max_total_time="$SECONDS_BUDGET" -timeout=60 -rss_limit_mb=4096 -max_len=4096 \
    -print_final_stats=1 -artifact_prefix="$OUT/" "$CORPUS" 2> "$OUT/fuzz.log" || {
    tail -n 60 "$OUT/fuzz.log"
    echo "fuzz_kernels.sh: FAILED (crash input saved under $OUT/)"
    exit 1
}
grep -E "^(Done|stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb)" "$OUT/fuzz.log" || true
echo "fuzz_kernels.sh: OK (0 findings)"
