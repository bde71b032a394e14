#!/usr/bin/env bash
# bench_families.sh: CPU backend throughput of every model family on shapes
# of real checkpoints, against this machine's roofs (wkvm-bench-cpu measures
# memory bandwidth and OpenBLAS sgemm peak in the same run).
#
# Models (random BF16 weights, generated once under $BUILD_DIR/bench-models):
#   rwkv7-0.1b   L12 C768 H12 N64 F3072 V65536 (wkvm-mkmodel; as bench_cpu.sh)
#   mamba2-130m  L24 d_model 768 d_state 128 headdim 64 expand 2 V50288, tied
#                (state-spaces/mamba2-130m's shape, mamba_ssm names)
#   gdn-340m     L21 hidden 1024 6 heads of 256 expand_v 2 F2816 V32000, tied
#                (flame's gated_deltanet_340M config)
# Each figure is the best of WKVM_BENCH_ROUNDS rounds (default 3).
#
# Usage: bench/bench_families.sh [BUILD_DIR]
set -euo pipefail

build="${1:-build}"
py=/usr/bin/python3
here="$(cd "$(dirname "$0")" && pwd)"
ref="$here/../tests/reference"
models="$build/bench-models"
bench="$build/bench/wkvm-bench-cpu"
mkmodel="$build/tools/wkvm-mkmodel"
for exe in "$bench" "$mkmodel"; do
    [ -x "$exe" ] || { echo "bench_families.sh: $exe not built (ninja -C $build)" >&2; exit 1; }
done
mkdir -p "$models"
if [ ! -f "$models/rwkv7-0.1b-bf16/model.safetensors" ]; then
    "$mkmodel" --out "$models/rwkv7-0.1b-bf16" --layers 12 --embd 768 --head-size 64 \
        --ffn 3072 --vocab 65536 --dtype bf16 --seed 1 >&2
fi
if [ ! -f "$models/mamba2-130m-bf16/config.json" ]; then
    "$py" "$ref/gen_mamba2.py" --out "$models/mamba2-130m-bf16" --convention ssm --dtype bf16 \
        --layers 24 --d-model 768 --d-state 128 --headdim 64 --expand 2 --vocab 50288 \
        --seed 7 >&2
fi
if [ ! -f "$models/gdn-340m-bf16/config.json" ]; then
    "$py" "$ref/gen_gdn.py" --out "$models/gdn-340m-bf16" --dtype bf16 --layers 21 \
        --hidden 1024 --heads 6 --head-dim 256 --expand-v 2 --ffn 2816 --vocab 32000 --tied \
        --seed 7 >&2
fi

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs," \
     "$(free -g | awk '/^Mem:/ {print $2}') GiB RAM, $(uname -r)"
echo "command: $0 $build"
for m in rwkv7-0.1b-bf16 mamba2-130m-bf16 gdn-340m-bf16; do
    echo
    echo "## $m"
    echo
    "$bench" --model "$models/$m" --batches 1,8 --prefill 512 \
        --rounds "${WKVM_BENCH_ROUNDS:-3}"
done
