#!/usr/bin/env bash
# bench_cpu.sh: CPU backend throughput against this machine's roofs.
#
# Generates (once) a random 0.1B-shaped RWKV-7 model (L12 C768 H12 N64 F3072
# V65536, BF16, HF layout) with wkvm-mkmodel, then runs wkvm-bench-cpu, which
# measures memory bandwidth and OpenBLAS sgemm peak in the same run and
# prints decode tok/s at batch 1/8/32/64 and prefill tok/s at 512 tokens as
# fractions of their roofs (Markdown table on stdout).
#
# Usage: bench/bench_cpu.sh [BUILD_DIR] [-- extra wkvm-bench-cpu flags]
#   BUILD_DIR  meson build directory (default: build)
#   WKVM_BENCH_ROUNDS     rounds; each figure is the best round (default 5)
#   WKVM_BENCH_MODEL_DIR  where the model is generated/reused
#                         (default: $BUILD_DIR/bench-models/rwkv7-0.1b-bf16)
set -euo pipefail

build="${1:-build}"
shift || true
if [ "${1:-}" = "--" ]; then
    shift
fi
mkmodel="$build/workerd/wkvm-mkmodel"
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
echo "command: $0 $build $*"
echo
exec "$bench" --model "$model" --batches 1,8,32,64 --prefill 512 --rounds "${WKVM_BENCH_ROUNDS:-5}" "$@"
