#!/usr/bin/env bash
# tools/fuzz_kernels.sh - build the libFuzzer target of the C kernels and run it.
#
#   tools/fuzz_kernels.sh            # 60 s (the CI-sized run)
#   tools/fuzz_kernels.sh 600        # 10 minutes
#   CORPUS=fuzz/build/corpus tools/fuzz_kernels.sh 3600   # keep the corpus
#   FUZZ_SAN=thread tools/fuzz_kernels.sh 120   # ThreadSanitizer on the kernels
#
# First replays the regression inputs of fuzz/known/, then fuzzes from a few
# seeds (and those inputs). Fails (non-zero exit) on any ASan/UBSan (or
# TSan) report, any output, statistic or return code that differs between
# the scalar level and another level or thread count (bit for bit, NaNs
# included), any input the kernels modified, any write outside the output
# items or item left unwritten, or a timeout; the crashing input is saved
# next to the binary (crash-*), to replay with
#   FUZZ_KERNELS_VERBOSE=1 fuzz/build/fuzz_kernels CRASH_FILE
# Needs clang + libFuzzer: apt-get install -y clang libclang-rt-14-dev
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SECONDS_BUDGET="${1:-60}"
export OUT="${OUT:-$ROOT/fuzz/build}"
"$ROOT/fuzz/build.sh"
BIN="$OUT/fuzz_kernels"
if [ "${FUZZ_SAN:-address}" = thread ]; then
    BIN="$OUT/fuzz_kernels_tsan"
    export TSAN_OPTIONS="halt_on_error=1${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
fi
KNOWN=()
for f in "$ROOT"/fuzz/known/*; do
    [ "$(basename "$f")" = README ] || KNOWN+=("$f")
done
if [ ${#KNOWN[@]} -gt 0 ]; then
    "$BIN" "${KNOWN[@]}" > "$OUT/known.log" 2>&1 || {
        tail -n 40 "$OUT/known.log"
        echo "fuzz_kernels.sh: FAILED on a regression input of fuzz/known/"
        exit 1
    }
    echo "fuzz_kernels.sh: ${#KNOWN[@]} regression input(s) of fuzz/known/ pass"
fi
if [ -z "${CORPUS:-}" ]; then
    CORPUS="$(mktemp -d -t layernorm_c_corpus.XXXXXX)"
    trap 'rm -rf "$CORPUS"' EXIT
fi
mkdir -p "$CORPUS"
# Seeds: a few job headers (the harness's generator fills the values), so
# that each kind of job is reached at once; libFuzzer mutates from there.
# Byte 0 even: a row job (flags: dtype in bits 0-1, weight 4, bias 8, in
# place 16, stream 32, 9-16 records 64, negative row strides 128; then the
# size class and d, the record count). Byte 0 odd: a batch (flags: dtype,
# weight 4, bias 8, mean/var 16, big 32 (+ 0x5a 0xc3), in place 64, another
# op 128; then the dtypes of x, weight, bias and the statistics, d,
# records, threads).
printf '\x00\x0e\x00\x21\x00' > "$CORPUS/seed-row-f32-d33"
printf '\x00\x1c\x00\x05\x00\x03' > "$CORPUS/seed-row-f16-inplace"
printf '\x00\x25\xc0\x00\x04\x01' > "$CORPUS/seed-row-bf16-stream-d1024"
printf '\x00\xcf\x80\x01\x01\x07\x00\x00\x00\x00\x00\x00\x00\x82\x0b\x50' > "$CORPUS/seed-row-f64-huge"
printf '\x01\x1e\x01\x03\x05\x00\x00\x05\x00\x06\x01' > "$CORPUS/seed-batch-f16-x-f32-job"
printf '\x01\x1f\x05\x01\x00\x01\x80\x2c\x01\x04\x00' > "$CORPUS/seed-batch-f32-x-f64-job"
printf '\x01\x1d\x00\x00\x00\x00\xc0\x10\x02\x03\x02' > "$CORPUS/seed-batch-bf16"
printf '\x01\x56\x00\x00\x00\x00\x00\x30\x00\x05\x00' > "$CORPUS/seed-batch-inplace"
printf '\x01\x3e\x5a\xc3\x00\x00\x00\x00\x00\x00\x00\x00\x03\x01\x00' > "$CORPUS/seed-batch-threads"
# flags bit 7: another op (next byte: 0 RMSNorm, 1 LayerNorm backward,
# 2 RMSNorm backward); a row job's record-count byte, bit 3: RMSNorm
printf '\x01\x97\x01\x00\x00\x00\x00\x00\x11\x00\x04\x00' > "$CORPUS/seed-batch-ln-backward"
printf '\x01\x86\x02\x01\x00\x00\x00\x80\x2c\x01\x03\x00' > "$CORPUS/seed-batch-rms-backward"
printf '\x01\x95\x00\x00\x00\x00\x00\x00\x07\x00\x02\x00' > "$CORPUS/seed-batch-rms"
printf '\x00\x06\x00\x21\x00\x0b' > "$CORPUS/seed-row-rms"
for f in "${KNOWN[@]}"; do cp "$f" "$CORPUS/known-$(basename "$f")"; done
echo "fuzz_kernels.sh: fuzzing for ${SECONDS_BUDGET}s, corpus $CORPUS"
"$BIN" -max_total_time="$SECONDS_BUDGET" -timeout=60 -rss_limit_mb=4096 -max_len=4096 \
    -print_final_stats=1 -artifact_prefix="$OUT/" "$CORPUS" 2> "$OUT/fuzz.log" || {
    tail -n 60 "$OUT/fuzz.log"
    echo "fuzz_kernels.sh: FAILED (crash input saved under $OUT/)"
    exit 1
}
grep -E "^(Done|stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb)" "$OUT/fuzz.log" || true
echo "fuzz_kernels.sh: OK (0 findings)"
