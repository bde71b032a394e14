#!/usr/bin/env bash
# bench/gpu-pack.sh: build the CUDA tree here and pack what bench/gpu.sh needs
# to run it on a GPU machine that cannot build it (no Debian package sources,
# no network: only the CUDA toolkit, its driver and a Python with numpy).
#
# Usage: bench/gpu-pack.sh [OUT_DIR]   (default .gpu, ignored by git)
#
# Writes OUT_DIR/pack.tar.xz holding build-gpu/ (every program of a release
# build with -Dcuda=enabled, SASS for -Dnvcc_arch, default 90: Hopper; no
# object files), build-gpu/gpu-tests.json (`meson introspect --tests`) and
# lib/ (the shared libraries those programs take from Debian, less glibc,
# libstdc++ and the CUDA libraries, which the GPU machine's toolkit brings).
# Unpack it in the source root on the GPU machine, where the source root
# must also be reachable at this source root's path (the test list names
# absolute paths: a symbolic link does it), then:
#
#   LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64 WKVM_GPU_PREBUILT=1 \
#       WKVM_GPU_PYTHON=python3 WKVM_GPU_BUILD=$PWD/build-gpu bench/gpu.sh
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$SRC/.gpu}
BUILD=$SRC/build-gpu
ARCH=${WKVM_NVCC_ARCH:-90}

LOG=$(mktemp /tmp/wkvm-gpu-pack.XXXXXX.log)
quiet() { # CMD...: its output to $LOG, shown when it fails
    "$@" >>"$LOG" 2>&1 || { tail -30 "$LOG" >&2; echo "gpu-pack.sh: failed: $*" >&2; exit 1; }
}
if [ -f "$BUILD/build.ninja" ]; then
    quiet meson configure "$BUILD" -Dcuda=enabled -Dbuildtype=release -Dnvcc_arch="$ARCH" \
        -Dfuzz=disabled
else
    quiet meson setup "$BUILD" "$SRC" -Dcuda=enabled -Dbuildtype=release -Dnvcc_arch="$ARCH" \
        -Dfuzz=disabled
fi
quiet ninja -C "$BUILD"
meson introspect --tests "$BUILD" >"$BUILD/gpu-tests.json"
rm -f "$LOG"

stage=$(mktemp -d /tmp/wkvm-gpu-pack.XXXXXX)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build-gpu" "$stage/lib"
cp "$BUILD/gpu-tests.json" "$stage/build-gpu/"
# every program of the build (executables outside meson's object dirs)
(cd "$BUILD" && find . -type f -perm -u+x ! -path '*.p/*' ! -path './meson-*' \
    ! -name '*.so' ! -name '*.a' -print0) |
while IFS= read -r -d '' f; do
    mkdir -p "$stage/build-gpu/$(dirname "$f")"
    cp "$BUILD/$f" "$stage/build-gpu/$f"
done
# their libraries, but the C library, the C++ runtime and CUDA's own
{ find "$stage/build-gpu" -type f -perm -u+x ! -name '*.json' -exec ldd {} + 2>/dev/null || true; } |
    awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    { grep -Ev '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/usr/local/cuda|libcud|libcublas|libnccl' || true; } |
    while read -r l; do cp -L "$l" "$stage/lib/"; done
mkdir -p "$OUT"
tar -C "$stage" -cJf "$OUT/pack.tar.xz" build-gpu lib
echo "$OUT/pack.tar.xz: $(du -h "$OUT/pack.tar.xz" | cut -f1)," \
    "$(find "$stage/build-gpu" -type f | wc -l) programs, $(ls "$stage/lib" | wc -l) libraries"
