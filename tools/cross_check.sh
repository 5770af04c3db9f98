#!/usr/bin/env bash
# tools/cross_check.sh - the reproducibility contract across architectures:
# the C kernels (csrc/ln_*.c, no Python) and the driver tools/cross_check.c
# are built for x86-64 (natively) and for aarch64 (Debian's cross compiler),
# with GCC and, when it is installed, with clang (--target=aarch64-linux-gnu);
# the aarch64 builds run under qemu-aarch64. Each build runs a fixed corpus
# of batches (see cross_check.c) on every level it has (x86-64: scalar,
# portable, avx2, avx512; aarch64: scalar, portable = NEON) and writes every
# result to a file per level. Every file must equal the x86-64 GCC scalar
# level's byte for byte (cmp); on a difference the first differing case is
# printed in words, with its first differing outputs on both sides.
#
# It also checks that the aarch64 portable level is vectorized: the lane-form
# functions of ln_portable.o must hold NEON floating-point arithmetic
# (fmla/fadd/fmul/fsub on v registers), counted with objdump.
#
#   tools/cross_check.sh          # build, run, compare (about 30-60 s)
#   KEEP=1 tools/cross_check.sh   # keep the build and result folder
#   AARCH64_EXTRA_CFLAGS=-ffast-math tools/cross_check.sh   # a control: must fail
#
# Needs gcc, gcc-aarch64-linux-gnu and qemu-user (Debian:
# apt-get install gcc-aarch64-linux-gnu qemu-user); clang is optional.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
T0=$(date +%s)
log() { echo "cross_check.sh: $*"; }
need() {
    command -v "$1" > /dev/null || { log "$1 not found ($2)"; exit 1; }
}
need gcc "apt-get install gcc"
need aarch64-linux-gnu-gcc "apt-get install gcc-aarch64-linux-gnu"
need aarch64-linux-gnu-objdump "apt-get install binutils-aarch64-linux-gnu"
need qemu-aarch64 "apt-get install qemu-user"
SYSROOT=/usr/aarch64-linux-gnu
[ -d "$SYSROOT" ] || { log "$SYSROOT missing (apt-get install gcc-aarch64-linux-gnu)"; exit 1; }

OUT="$(mktemp -d -t layernorm_c_cross.XXXXXX)"
if [ "${KEEP:-0}" != 0 ]; then
    trap 'log "kept $OUT"' EXIT
else
    trap 'rm -rf "$OUT"' EXIT
fi

# The flags of the extension's build (setup.py), warnings as errors.
FLAGS=(-O3 -std=c11 -ffp-contract=off -fno-fast-math -fno-math-errno -Wall -Wextra -Wno-unused-parameter
       -Wmissing-field-initializers -Werror -I"$ROOT/csrc")
SOURCES=("$ROOT"/csrc/ln_*.c "$ROOT/tools/cross_check.c")

# name, then the compiler command
BUILDS=("x86_64-gcc|gcc" "aarch64-gcc|aarch64-linux-gnu-gcc")
if command -v clang > /dev/null; then
    BUILDS+=("x86_64-clang|clang" "aarch64-clang|clang --target=aarch64-linux-gnu")
else
    log "clang not found: GCC builds only"
fi

build() { # name, compiler words...
    local name="$1"; shift
    local extra=()
    # shellcheck disable=SC2206
    case "$name" in aarch64-*) extra=(${AARCH64_EXTRA_CFLAGS:-}) ;; esac
    mkdir -p "$OUT/$name/obj" "$OUT/$name/res"
    local objs=()
    for f in "${SOURCES[@]}"; do
        local o="$OUT/$name/obj/$(basename "$f" .c).o"
        "$@" "${FLAGS[@]}" "${extra[@]}" -c "$f" -o "$o" || return 1
        objs+=("$o")
    done
    "$@" "${extra[@]}" "${objs[@]}" -o "$OUT/$name/cross_check" -pthread -lm
}

run() { # name, driver arguments...
    local name="$1"; shift
    case "$name" in
        aarch64-*) qemu-aarch64 -L "$SYSROOT" "$OUT/$name/cross_check" "$@" ;;
        *) "$OUT/$name/cross_check" "$@" ;;
    esac
}

# ---- build (two at a time) and run ----------------------------------------------
PIDS=()
for b in "${BUILDS[@]}"; do
    name="${b%%|*}"
    # shellcheck disable=SC2086
    ( build "$name" ${b#*|} > "$OUT/$name.build.log" 2>&1 ) &
    PIDS+=($!)
done
FAILED=0
for i in "${!PIDS[@]}"; do
    if ! wait "${PIDS[$i]}"; then
        name="${BUILDS[$i]%%|*}"
        cat "$OUT/$name.build.log"
        log "FAILED: the $name build"
        FAILED=1
    fi
done
[ "$FAILED" = 0 ] || exit 1
T1=$(date +%s)
log "built ${#BUILDS[@]} drivers ($((T1 - T0)) s)"

runner() { # name: run the corpus, log its summary line
    local name="$1" t
    t=$(date +%s)
    run "$name" "$OUT/$name/res" "$name" > "$OUT/$name.run.log" 2>&1 ||
        { cat "$OUT/$name.run.log"; return 1; }
    echo "$(cat "$OUT/$name.run.log") ($(( $(date +%s) - t )) s)" > "$OUT/$name.run.log"
}
PIDS=()
for b in "${BUILDS[@]}"; do
    runner "${b%%|*}" &
    PIDS+=($!)
done
for i in "${!PIDS[@]}"; do
    wait "${PIDS[$i]}" || { log "FAILED: the ${BUILDS[$i]%%|*} run"; FAILED=1; }
done
[ "$FAILED" = 0 ] || exit 1
for b in "${BUILDS[@]}"; do log "$(cat "$OUT/${b%%|*}.run.log")"; done
T2=$(date +%s)

# ---- compare ---------------------------------------------------------------------------
# Every level file of every build against the x86-64 GCC scalar one; files
# that differ are grouped by content (which builds agree with which), and
# each group's first differing case is shown once.
REF="$OUT/x86_64-gcc/res/x86_64-gcc-scalar"
N_FILES=0
declare -A GROUP_OF FIRST_OF
KINDS=()
for b in "${BUILDS[@]}"; do
    name="${b%%|*}"
    for f in "$OUT/$name"/res/*.bin; do
        N_FILES=$((N_FILES + 1))
        sum="$(cksum < "$f" | cut -d' ' -f1,2)"
        label="$(basename "$f" .bin)"
        label="$name ${label#"$name"-}"
        if [ -z "${GROUP_OF[$sum]:-}" ]; then
            KINDS+=("$sum")
            FIRST_OF[$sum]="$f"
            GROUP_OF[$sum]="$label"
        else
            GROUP_OF[$sum]="${GROUP_OF[$sum]}, $label"
        fi
    done
done
N_FILES=$((N_FILES - 1)) # the reference itself
if [ ${#KINDS[@]} -gt 1 ]; then
    FAILED=1
    log "DIFFERENT: the ${#KINDS[@]} kinds of results, by which levels give them:"
    for g in "${KINDS[@]}"; do log "  ${GROUP_OF[$g]}"; done
    for g in "${KINDS[@]}"; do
        f="${FIRST_OF[$g]}"
        [ "$f" = "$REF.bin" ] && continue
        name="$(basename "$(dirname "$(dirname "$f")")")"
        level="$(basename "$f" .bin)"
        level="${level#"$name"-}"
        log "$name $level vs x86_64-gcc scalar: first difference at byte $(cmp "$REF.bin" "$f" |
            awk '{ sub(/,$/, "", $5); print $5 }')"
        # The first case whose hash differs, in words, and its first
        # differing outputs on both sides.
        read -r line n_diff < <(paste -d' ' <(cut -d' ' -f1 "$REF.sums") <(cut -d' ' -f1 "${f%.bin}.sums") |
            awk '$1 != $2 { n++; if (!first) first = NR } END { print first + 0, n + 0 }')
        if [ "$line" -gt 0 ]; then
            case_no=$((line - 1))
            log "  $n_diff of $(wc -l < "$REF.sums") cases differ; the first: $(sed -n "${line}p" "$REF.sums" | cut -d' ' -f2-)"
            "$OUT/x86_64-gcc/cross_check" --show "$case_no" scalar > "$OUT/show-ref.txt"
            run "$name" --show "$case_no" "$level" > "$OUT/show-$name-$level.txt"
            diff "$OUT/show-ref.txt" "$OUT/show-$name-$level.txt" > "$OUT/show.diff" || true
            grep '^[<>]' "$OUT/show.diff" | sed -n '1,12p' |
                sed "s/^</  x86_64-gcc scalar:/; s/^>/  $name $level:/"
        fi
    done
fi
DIFFERENT=$FAILED

# ---- NEON: is the aarch64 portable level vectorized? -----------------------------------
neon_report() { # name
    # NEON floating-point arithmetic per function of ln_portable.o; the
    # lane-form sums (sum_*, back_sums_*) must have some. Function names
    # are those GCC/clang keep after inlining (static, may change).
    local obj="$OUT/$1/obj/ln_portable.o"
    aarch64-linux-gnu-objdump -d --no-show-raw-insn "$obj" | awk -v build="$1" '
        /^[0-9a-f]+ <.*>:$/ { fn = $2; gsub(/[<>:]/, "", fn); next }
        /\t(fmla|fmls|fadd|fsub|fmul|fdiv)\tv[0-9]+\.[248][sd]/ { vec[fn]++; total++ }
        END {
            n = 0; sums = 0
            for (f in vec) {
                n++
                if (f ~ /^(sum_|back_sums_)/) sums += vec[f]
            }
            printf "%s portable: %d NEON floating-point instructions (fmla/fadd/fsub/fmul/fdiv on v registers) in %d functions, %d in the lane-form sums", build, total, n, sums
            split("sum_shifted_squares_f32 sum_shifted_f32 sum_squares_f32 sum_squares_f64 back_sums_f32 record_output_f32.isra.0", want, " ")
            for (i = 1; i <= 6; i++) if (want[i] in vec) printf ", %s %d", want[i], vec[want[i]]
            print ""
            exit sums > 0 ? 0 : 1
        }' || { log "FAILED: $1 ln_portable.o has no NEON arithmetic in its lane-form sums"; return 1; }
}
for b in "${BUILDS[@]}"; do
    name="${b%%|*}"
    case "$name" in
        aarch64-*)
            if rep="$(neon_report "$name")"; then log "$rep"; else log "$rep"; FAILED=1; fi ;;
    esac
done
[ "$DIFFERENT" = 0 ] || log "FAILED: results differ between levels or architectures"
[ "$FAILED" = 0 ] || exit 1
N_CASES="$("$OUT/x86_64-gcc/cross_check" --count)"
log "OK: $N_CASES cases, $N_FILES result files identical to the x86_64 GCC scalar level" \
    "(runs $((T2 - T1)) s, $(( $(date +%s) - T0 )) s in all)"
