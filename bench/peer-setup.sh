#!/usr/bin/env bash
# Sets up the peer a user would pick instead of wkvm, for bench/chat.py --modes ...,llama:
# llama.cpp's llama-server built CPU-only from the source that the PyPI sdist of
# llama-cpp-python carries (vendor/llama.cpp), and a Python venv with what its
# convert_hf_to_gguf.py needs (transformers; torch and numpy from Debian) plus the
# PyPI `rwkv` package, whose rwkv_vocab_v20230424.txt is the real RWKV World vocab.
# Idempotent; everything lands in DIR (default build/peer):
#   DIR/llama.cpp/                   the source (its git commit is in DIR/llama.cpp.commit)
#   DIR/llama.cpp/build/bin/llama-server, llama-bench, llama-batched-bench (bench_cpu.sh --peer)
#   DIR/venv/                        python for the converter
#   DIR/rwkv_vocab_v20230424.txt     the real World vocab
# Usage: bench/peer-setup.sh [DIR]   (needs cmake and a C++ compiler: apt-get install cmake g++;
# when they are missing and this runs as root, it installs them with apt-get)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$src/build/peer}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get install -y -q cmake g++ >/dev/null
    fi
fi
command -v cmake >/dev/null || { echo "peer-setup: cmake not found (apt-get install cmake)" >&2; exit 1; }

if [ ! -x "$dir/venv/bin/python" ]; then
    /usr/bin/python3 -m venv --system-site-packages "$dir/venv"
fi
"$dir/venv/bin/python" -c "import transformers, rwkv" 2>/dev/null ||
    "$dir/venv/bin/pip" install -q "transformers>=4.40" rwkv sentencepiece

if [ ! -f "$dir/rwkv_vocab_v20230424.txt" ]; then
    vocab=$("$dir/venv/bin/python" -c \
        "import os, rwkv; print(os.path.join(os.path.dirname(rwkv.__file__), 'rwkv_vocab_v20230424.txt'))")
    cp "$vocab" "$dir/rwkv_vocab_v20230424.txt"
fi

if [ ! -f "$dir/llama.cpp/CMakeLists.txt" ]; then
    tmp=$(mktemp -d)
    "$dir/venv/bin/pip" download -q --no-deps --no-binary :all: llama-cpp-python -d "$tmp"
    tar xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
    rm -rf "$dir/llama.cpp"
    mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp "$dir/llama.cpp"
    basename "$tmp"/llama_cpp_python-*.tar.gz >"$dir/llama-cpp-python.sdist"
    (cd "$dir/llama.cpp" && git rev-parse HEAD 2>/dev/null || echo unknown) >"$dir/llama.cpp.commit"
    rm -rf "$tmp"
fi

bin=$dir/llama.cpp/build/bin
# AMX off where the CPU lists it (WKVM_PEER_AMX=1 keeps it): llama.cpp's native build dies
# with SIGILL in its AMX path on VMs that do not enable the AMX tile state (seen here on a
# Xeon VM with amx_tile, amx_int8, amx_bf16 in /proc/cpuinfo).
amx=()
if grep -qw amx_tile /proc/cpuinfo && [ "${WKVM_PEER_AMX:-0}" != 1 ]; then
    amx=(-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
         -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
fi
if [ ! -x "$bin/llama-server" ] || [ ! -x "$bin/llama-bench" ] ||
    [ ! -x "$bin/llama-batched-bench" ]; then
    # CPU only (no CUDA/Vulkan/BLAS), tuned for this CPU like wkvm's run-time ISA choice
    cmake -S "$dir/llama.cpp" -B "$dir/llama.cpp/build" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_SERVER=ON ${amx[@]+"${amx[@]}"} >/dev/null
    cmake --build "$dir/llama.cpp/build" --target llama-server llama-bench llama-batched-bench \
        -j"$(nproc)" >/dev/null
fi
echo "peer-setup: llama-server $(cat "$dir/llama.cpp.commit") in $dir"
