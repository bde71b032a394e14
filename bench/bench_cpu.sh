#!/usr/bin/env bash
# bench_cpu.sh: CPU backend throughput against this machine's roofs.
#
# Generates (once) a random 0.1B-shaped RWKV-7 model (L12 C768 H12 N64 F3072
# V65536, BF16, HF layout) with wkvm-mkmodel, then runs wkvm-bench-cpu, which
# measures memory bandwidth and OpenBLAS sgemm peak in the same run and
# prints decode tok/s at batch 1/8/32/64 and prefill tok/s at 512 tokens as
# fractions of their roofs (Markdown table on stdout).
#
# Then the same with the matrices quantized to Q8_0 at load (--quantize q8_0):
# the Q8_0 rows (WKVM_BENCH_Q8=0 skips them), and decode batch 1 of Q8_0
# against the stored BF16 weights in one process (--pair q8_0: both models
# open, WKVM_BENCH_PAIRS pairs of alternating windows, default 20; the median
# of the per-pair ratios), which is the Q8_0 / BF16 figure to quote on a
# shared machine, where best-of rounds in two processes swing by 15%.
#
# Peer mode (--peer DIR, DIR from bench/peer-setup.sh): wkvm Q8_0 and BF16
# against llama.cpp's llama-bench / llama-batched-bench on the same Q8_0 GGUF
# file (converted by llama.cpp's convert_hf_to_gguf.py), CPU, 2 threads,
# alternating rounds (bench/peer_cpu.py; WKVM_BENCH_ROUNDS rounds, default 3).
#
# Usage: bench/bench_cpu.sh [--peer DIR] [BUILD_DIR] [-- extra wkvm-bench-cpu flags]
#   BUILD_DIR  meson build directory (default: build)
#   WKVM_BENCH_ROUNDS     rounds; each figure is the best round (default 5)
#   WKVM_BENCH_BASE       peer mode: a baseline build directory whose wkvm Q8_0 runs in
#                         the same alternating rounds (e.g. the commit before a change)
#   WKVM_BENCH_MODEL_DIR  where the model is generated/reused
#                         (default: $BUILD_DIR/bench-models/rwkv7-0.1b-bf16)
set -euo pipefail

peer=""
if [ "${1:-}" = "--peer" ]; then
    peer="${2:?bench_cpu.sh: --peer needs the directory of bench/peer-setup.sh}"
    shift 2
fi
build="${1:-build}"
shift || true
if [ "${1:-}" = "--" ]; then
    shift
fi
mkmodel="$build/tools/wkvm-mkmodel"
bench="$build/bench/wkvm-bench-cpu"
for exe in "$mkmodel" "$bench"; do
    if [ ! -x "$exe" ]; then
        echo "bench_cpu.sh: $exe not built (ninja -C $build)" >&2
        exit 1
    fi
done

model="${WKVM_BENCH_MODEL_DIR:-$build/bench-models/rwkv7-0.1b-bf16}"
if [ ! -f "$model/model.safetensors" ]; then
    mkdir -p "$(dirname "$model")"
    "$mkmodel" --out "$model" --layers 12 --embd 768 --head-size 64 --ffn 3072 \
        --vocab 65536 --dtype bf16 --seed 1 >&2
fi

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs," \
     "$(free -g | awk '/^Mem:/ {print $2}') GiB RAM, $(uname -r)"
if [ -n "$peer" ]; then
    echo "command: $0 --peer $peer $build $*"
    echo
    exec python3 "$(dirname "$0")/peer_cpu.py" --build "$build" --peer "$peer" --model "$model" \
        --rounds "${WKVM_BENCH_ROUNDS:-3}" ${WKVM_BENCH_BASE:+--base-build "$WKVM_BENCH_BASE"}
fi
echo "command: $0 $build $*"
echo
"$bench" --model "$model" --batches 1,8,32,64 --prefill 512 --rounds "${WKVM_BENCH_ROUNDS:-5}" "$@"
if [ "${WKVM_BENCH_Q8:-1}" != 0 ]; then
    echo
    echo "Q8_0 (--quantize q8_0):"
    echo
    "$bench" --model "$model" --batches 1,8,32,64 --prefill 512 \
        --rounds "${WKVM_BENCH_ROUNDS:-5}" --quantize q8_0 "$@"
    echo
    echo "Q8_0 against BF16, decode batch 1, one process (--pair q8_0):"
    echo
    "$bench" --model "$model" --pair q8_0 --pairs "${WKVM_BENCH_PAIRS:-20}" "$@"
fi
