#!/usr/bin/env bash
# smoke.sh: wkvm-bench-cpu runs end to end and prints its tables (the test
# `bench_smoke`). A tiny model and tiny windows: no figure is judged, only
# that every mode runs, prints its rows and refuses bad flags with exit 2.
# Usage: bench/smoke.sh WKVM_BENCH_CPU WKVM_MKMODEL
set -euo pipefail
bench="$1"
mkmodel="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
check() { # name, then a command that must succeed
    local name="$1"
    shift
    if "$@"; then
        pass=$((pass + 1))
    else
        echo "FAIL: $name"
        fail=$((fail + 1))
    fi
}

"$mkmodel" --out "$tmp/m" --layers 2 --embd 128 --head-size 64 --vocab 512 --seed 1 >/dev/null
"$bench" --model "$tmp/m" --batches 1,2 --prefill 8 --rounds 1 --seconds 0.05 --bw-mib 16 \
    --sgemm-n 256 --quantize q8_0 >"$tmp/rounds.md" 2>"$tmp/rounds.err"
check "decode batch 1 row" grep -qE '^\| decode batch 1 \| [0-9.]+ \|' "$tmp/rounds.md"
check "decode batch 2 row" grep -qE '^\| decode batch 2 \| [0-9.]+ \|' "$tmp/rounds.md"
check "prefill row" grep -qE '^\| prefill 8 tokens \| [0-9.]+ \|' "$tmp/rounds.md"
check "Q8_0 weights" grep -q 'weights=Q8_0' "$tmp/rounds.md"

"$bench" --model "$tmp/m" --pair q8_0 --pairs 3 --seconds 0.05 --threads 2 >"$tmp/pair.md" \
    2>"$tmp/pair.err"
check "pair row" grep -qE '^\| 2 threads \| [0-9.]+ \| [0-9.]+ \| [0-9.]+x \| [0-9.]+x \| [0-9.]+x \|$' \
    "$tmp/pair.md"
check "three pairs" test "$(grep -c '^wkvm-bench-cpu: pair [0-9]/3:' "$tmp/pair.err")" = 3
check "both backends" grep -qE 'weights=BF16 .*\| .*weights=Q8_0' "$tmp/pair.md"

"$bench" --model "$tmp/m" --ctx 20,40 --prefill 8 --rounds 1 --threads 2 >"$tmp/ctx.md" \
    2>"$tmp/ctx.err"
check "ctx 20 row" grep -qE '^\| 20 \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$' "$tmp/ctx.md"
check "ctx 40 row" grep -qE '^\| 40 \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$' "$tmp/ctx.md"

refused() { # the command exits 2 and says why on stderr
    local rc=0
    "$@" >/dev/null 2>"$tmp/refused.err" || rc=$?
    [ "$rc" = 2 ] && [ -s "$tmp/refused.err" ]
}
check "--pair q4_0 refused" refused "$bench" --model "$tmp/m" --pair q4_0
check "--pairs 0 refused" refused "$bench" --model "$tmp/m" --pair q8_0 --pairs 0
check "--seconds 0 refused" refused "$bench" --model "$tmp/m" --seconds 0

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
