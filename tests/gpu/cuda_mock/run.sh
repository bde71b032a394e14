#!/usr/bin/env bash
# tests/gpu/cuda_mock/run.sh BUILD_DIR: runs the gpu suite's cuda_families
# (tests/gpu/run_cuda_families.py: every family's models against the CPU
# backend) and cuda_step (RWKV-7's synthetic models: test_cuda_step.c) on a
# machine without a GPU, by linking test_cuda_families and test_cuda_step with
# host-memory stand-ins for the CUDA runtime, cuBLAS and NCCL (cuda_mock.c)
# and C emulations of the kernels/k.h launchers (k_mock.c) instead of
# libcudart / libcublas / libnccl / libwkkernels.
#
# What it checks: the CUDA backend's host code (be_cuda*.c: buffer sizes,
# slot and KV offsets, strides, launch arguments, the order of the stages,
# the host-side expert routing) agrees with the CPU backend. What it does
# not: the CUDA kernels themselves (k_*.cu never run here; k_mock.c is a
# second reading of what each computes), cuBLAS, streams, timing. Runs as
# the meson test cuda_mock (integration suite) in every -Dcuda=enabled build,
# so CI checks it without a device.
# BUILD_DIR must be a -Dcuda=enabled build (ninja already run).
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
B=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
OUT=$(mktemp -d /tmp/wkvm-cuda-mock.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
cc=${CC:-cc}
$cc -O2 -std=gnu11 -Wall -Wextra -Werror -I "$SRC/kernels" -I "$CUDA_INC" \
    -c "$SRC/tests/gpu/cuda_mock/cuda_mock.c" -o "$OUT/cuda_mock.o"
$cc -O2 -std=gnu11 -Wall -Wextra -Werror -I "$SRC/kernels" \
    -c "$SRC/tests/gpu/cuda_mock/k_mock.c" -o "$OUT/k_mock.o"
for t in test_cuda_families test_cuda_step; do
    $cc -o "$OUT/$t" "$B/tests/gpu/$t.p/$t.c.o" \
        -Wl,--start-group "$B/workerd/libwkworker.a" "$B/workerd/libwkcpukern.a" \
        "$B/common/libwkckpt.a" "$B/common/libwktext.a" "$B/common/libwktensor.a" \
        "$B/common/libwkutil.a" "$OUT/cuda_mock.o" "$OUT/k_mock.o" -Wl,--end-group \
        -pthread -lm -lcrypto -ljansson -lpcre2-8
done
rc=0
/usr/bin/python3 "$SRC/tests/gpu/run_cuda_families.py" "$OUT/test_cuda_families" || rc=1
"$OUT/test_cuda_step" || rc=1
exit $rc
