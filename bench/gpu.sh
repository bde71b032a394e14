#!/usr/bin/env bash
# bench/gpu.sh: everything a GPU machine can tell about the CUDA backend, in
# one command and one JSON document. On a machine with an NVIDIA GPU and the
# CUDA toolkit it
#   1. installs the build dependencies (deploy/install-deps --minimal),
#   2. builds with -Dcuda=enabled (build dir $WKVM_GPU_BUILD, default build-gpu),
#   3. prints nvidia-smi and the driver version,
#   4. runs the whole gpu suite (meson test --suite gpu --print-errorlogs),
#   5. benchmarks decode tok/s at batch 1, 8, 32, 64, 128, 256 and prefill
#      tok/s (512 and 4096 tokens) on 0.1B- and 1.5B-shaped random RWKV-7
#      models, a Mamba2 (130M-shaped) and a Gated DeltaNet (0.1B-shaped) one,
#      and decode at batch 1, 8, 64 plus the same prefills on two small
#      hybrids: a Qwen3.5-shaped one (Qwen3.5-0.8B's widths, 8 layers, 2 of
#      them gated attention, 32k vocab) and a Nemotron-H-shaped one (Mamba2,
#      one attention layer and 32 sigmoid-routed experts, 10 layers), each
#      decode figure against the measured copy-bandwidth roof
#      (bench/wkvm-bench-gpu.c),
# and prints one JSON document on stdout (progress and logs go to stderr;
# $WKVM_GPU_OUT, when set, gets the JSON and the logs too). Every part has
# its own time limit and a failing part never hides the next one: a failed
# test still leaves the benchmark, and the JSON says what failed. Exit
# status: 0 when every part passed, 1 otherwise.
#
# Without a device (no /dev/nvidia* node or nvidia-smi finds none) it still
# builds, says "no device" and exits 0; with an up-to-date build dir that
# takes seconds. Meant to finish in under 8 minutes on an H200 (the models
# are written once into $WKVM_GPU_MODELS, default /tmp/wkvm-gpu-models).
#
# Usage: bench/gpu.sh [--quick]   (--quick: the 0.1B model only, batches 1,8,64)
#
# Built elsewhere (a machine with only the CUDA toolkit and Python, no
# package sources): bench/gpu-pack.sh builds here and packs the binaries,
# their libraries and the introspected test list; there, WKVM_GPU_PREBUILT=1
# skips steps 1 and 2 and runs the suite through bench/gpu_suite.py, and
# WKVM_GPU_PYTHON names the interpreter with numpy (default /usr/bin/python3).
set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${WKVM_GPU_BUILD:-$SRC/build-gpu}
MODELS=${WKVM_GPU_MODELS:-/tmp/wkvm-gpu-models}
OUT=${WKVM_GPU_OUT:-}
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1
PY=${WKVM_GPU_PYTHON:-/usr/bin/python3}
PREBUILT=${WKVM_GPU_PREBUILT:-0}
T0=$(date +%s)

log() { echo "gpu.sh [$(( $(date +%s) - T0 ))s] $*" >&2; }
failed=()
fail() { failed+=("$1"); log "FAILED: $1"; }
json_str() { "$PY" -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()))'; }

if [ -n "$OUT" ]; then mkdir -p "$OUT"; fi
LOGS=$(mktemp -d /tmp/wkvm-gpu-logs.XXXXXX)

build_ok=false
t=$(date +%s)
if [ "$PREBUILT" = 1 ]; then
    log "prebuilt ($BUILD): no dependencies, no build"
    if [ -x "$BUILD/bench/wkvm-bench-gpu" ]; then build_ok=true; else fail "prebuilt build dir"; fi
else
    # 1. dependencies
    log "dependencies"
    if ! "$SRC/deploy/install-deps" --minimal >"$LOGS/deps.log" 2>&1; then
        fail "install-deps"
        tail -20 "$LOGS/deps.log" >&2
    fi

    # 2. build
    log "build ($BUILD)"
    if [ -f "$BUILD/build.ninja" ]; then
        meson configure "$BUILD" -Dcuda=enabled >"$LOGS/build.log" 2>&1
    else
        meson setup "$BUILD" "$SRC" -Dcuda=enabled -Dbuildtype=release >"$LOGS/build.log" 2>&1
    fi
    if timeout 600 meson compile -C "$BUILD" >>"$LOGS/build.log" 2>&1; then
        build_ok=true
    else
        fail "build"
        tail -30 "$LOGS/build.log" >&2
    fi
fi
build_s=$(( $(date +%s) - t ))

# 3. is there a device?
have_dev=false
if ls /dev/nvidia* >/dev/null 2>&1 && command -v nvidia-smi >/dev/null 2>&1 &&
    nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    have_dev=true
fi
if ! $have_dev; then
    log "no device (no /dev/nvidia* node, or nvidia-smi lists no GPU): build only"
    echo "{\"device\": null, \"note\": \"no device\", \"build_ok\": $build_ok, \"build_s\": $build_s}"
    $build_ok && exit 0
    exit 1
fi
smi=$(nvidia-smi 2>&1)
echo "$smi" >&2
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
gpus=$(nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>/dev/null)
log "driver $driver"

# 4. the gpu suite
suite_rc=-1
suite_s=0
if $build_ok; then
    log "gpu suite"
    t=$(date +%s)
    if [ "$PREBUILT" = 1 ]; then
        "$PY" "$SRC/bench/gpu_suite.py" "$BUILD/gpu-tests.json" "$LOGS" --jobs 8 \
            --budget "${WKVM_GPU_SUITE_S:-330}" --python "$PY" >"$LOGS/gpu-suite.log" 2>&1
    else
        timeout 330 meson test -C "$BUILD" --suite gpu --print-errorlogs --num-processes 4 \
            >"$LOGS/gpu-suite.log" 2>&1
    fi
    suite_rc=$?
    suite_s=$(( $(date +%s) - t ))
    tail -40 "$LOGS/gpu-suite.log" >&2
    [ $suite_rc -eq 0 ] || fail "gpu suite (rc $suite_rc)"
    # a skip on a device is a failure too: the suite must run whole here
    # (but nccl_pair, which needs two devices, on a machine with one)
    n_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    skipped=$(grep -E '^ *[0-9]+/[0-9]+ .* SKIP |^gpu_suite: .* SKIP ' "$LOGS/gpu-suite.log" |
        { if [ "$n_gpus" -lt 2 ]; then grep -v ' nccl_pair '; else cat; fi; } | wc -l)
    [ "$skipped" -eq 0 ] || fail "gpu suite skipped $skipped tests on a device"
fi
suite_json=$("$PY" - "$BUILD/meson-logs/testlog.json" "$LOGS/gpu-suite.jsonl" "$PREBUILT" <<'EOF'
import json, sys
out = []
if sys.argv[3] == "1":
    try:
        out = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
    except OSError:
        pass
    print(json.dumps(out))
    sys.exit(0)
try:
    for line in open(sys.argv[1]):
        t = json.loads(line)
        if ":gpu / " in t["name"]:
            out.append({"name": t["name"].split(" / ", 1)[1], "result": t["result"],
                        "seconds": round(t.get("duration", 0), 1),
                        "tail": t.get("stdout", "").strip().splitlines()[-3:]})
except OSError:
    pass
print(json.dumps(out))
EOF
)

# 5. models and benchmarks
bench_json="[]"
if $build_ok; then
    mkdir -p "$MODELS"
    mk() { # NAME ARGS...: an RWKV-7 model from wkvm-mkmodel, once
        local d=$MODELS/$1; shift
        [ -f "$d/config.json" ] || "$BUILD/tools/wkvm-mkmodel" --out "$d" --force "$@" \
            >>"$LOGS/models.log" 2>&1 || { fail "model $(basename "$d")"; return 1; }
    }
    gen() { # NAME MODULE KWARGS: a Mamba2 / GDN model from tests/reference, once
        local d=$MODELS/$1
        [ -f "$d/config.json" ] || "$PY" -c "
import sys; sys.path.insert(0, '$SRC/tests/reference')
import $2 as g
g.write_model('$d', g.default_cfg($3))" >>"$LOGS/models.log" 2>&1 ||
            { fail "model $1"; return 1; }
    }
    log "models ($MODELS)"
    mk rwkv7-0.1b --layers 12 --embd 768 --head-size 64 --ffn 3072 --vocab 65536 --dtype bf16
    if [ $QUICK -eq 0 ]; then
        mk rwkv7-1.5b --layers 24 --embd 2048 --head-size 64 --ffn 8192 --vocab 65536 \
            --dtype bf16
        gen mamba2-130m gen_mamba2 "layers=24, d_model=768, d_state=128, headdim=64, vocab=50280, dtype='bf16', seed=11"
        gen gdn-0.1b gen_gdn "layers=12, hidden=768, heads=6, head_dim=128, expand_v=2.0, ffn=2048, vocab=32000, dtype='bf16', seed=12"
        # hybrids: Qwen3.5-0.8B's widths (GDN 16 key / 16 value heads of 128, gated attention
        # 8 heads / 2 KV heads of 256, rotary 64 of 256) over 8 layers; a Nemotron-H /
        # Nemotron 3 Nano-like stack (Mamba2 32 heads of 64, 8 groups, state 128; 32
        # experts, top 4, a shared expert) over 10 layers
        gen qwen35-hybrid gen_qwen35 "layers=8, interval=4, hidden=1024, ffn=3584, vocab=32000, heads=8, kv_heads=2, head_dim=256, lin_k_heads=16, lin_v_heads=16, lin_k_dim=128, lin_v_dim=128, dtype='bf16', seed=13"
        gen nemotron-h-hybrid gen_nemotron_h "pattern='MEMEM*MEME', hidden=1024, vocab=32000, heads=8, kv_heads=2, head_dim=128, ffn=2048, m2_heads=32, m2_head_dim=64, groups=8, state=128, experts=32, top_k=4, moe_ffn=512, shared_ffn=1024, n_group=1, topk_group=1, dtype='bf16', seed=14"
        names="rwkv7-0.1b rwkv7-1.5b mamba2-130m gdn-0.1b qwen35-hybrid nemotron-h-hybrid"
        batches=1,8,32,64,128,256
    else
        names="rwkv7-0.1b"
        batches=1,8,64
    fi
    : >"$LOGS/bench.jsonl"
    for n in $names; do
        [ -f "$MODELS/$n/config.json" ] || continue
        log "bench $n"
        nb=$batches
        case $n in *-hybrid) nb=1,8,64 ;; esac
        if timeout 150 "$BUILD/bench/wkvm-bench-gpu" --model "$MODELS/$n" --label "$n" \
            --batches "$nb" --prefill 512,4096 --seconds 0.5 --rounds 2 \
            >"$LOGS/bench-$n.json" 2>"$LOGS/bench-$n.err"; then
            "$PY" -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))))' \
                "$LOGS/bench-$n.json" >>"$LOGS/bench.jsonl" || fail "bench $n (bad JSON)"
        else
            fail "bench $n"
            tail -5 "$LOGS/bench-$n.err" >&2
        fi
    done
    bench_json=$("$PY" -c 'import json,sys; print(json.dumps([json.loads(l) for l in open(sys.argv[1]) if l.strip()]))' "$LOGS/bench.jsonl")
fi

# one JSON document
failed_json=$(printf '%s\n' "${failed[@]+"${failed[@]}"}" | "$PY" -c 'import json,sys; print(json.dumps([l.strip() for l in sys.stdin if l.strip()]))')
doc=$(cat <<EOF
{"device": $(echo "$gpus" | json_str), "driver": $(echo "$driver" | json_str),
 "nvidia_smi": $(echo "$smi" | json_str),
 "commit": $(git -C "$SRC" rev-parse --short HEAD 2>/dev/null | json_str),
 "build_ok": $build_ok, "build_s": $build_s,
 "gpu_suite": {"rc": $suite_rc, "seconds": $suite_s, "tests": $suite_json},
 "bench": $bench_json,
 "failed": $failed_json, "total_s": $(( $(date +%s) - T0 ))}
EOF
)
echo "$doc" | "$PY" -m json.tool
if [ -n "$OUT" ]; then
    echo "$doc" >"$OUT/gpu.json"
    cp "$LOGS"/* "$OUT"/ 2>/dev/null
fi
[ ${#failed[@]} -eq 0 ]
