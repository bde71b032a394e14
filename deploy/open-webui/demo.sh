#!/usr/bin/env bash
# Open WebUI in front of wkvm, on loopback, offline, with parent-token-v1
# stateful chat configured. See docs/OPEN_WEBUI.md.
#
#   deploy/open-webui/demo.sh install   venv + Open WebUI from PyPI, build wkvm, demo model
#   deploy/open-webui/demo.sh doctor    check everything start needs (and which Open WebUI
#                                       version the venv holds), fail early and clearly
#   deploy/open-webui/demo.sh start     wkvm on 127.0.0.1:8000, Open WebUI on 127.0.0.1:3000
#   deploy/open-webui/demo.sh smoke     a real three-turn chat and a "Try Again" through Open
#                                       WebUI's API; checks streaming, persistence and that
#                                       wkvm reused state for turns 2, 3 and the regenerate
#                                       (with a templated model: a chat with a tool offered,
#                                       native function calling, the call's round trip)
#   deploy/open-webui/demo.sh browser-smoke
#                                       the same in a real browser (Debian's chromium driven
#                                       by playwright), with screenshots; not for CI
#   deploy/open-webui/demo.sh stop      stop both; nothing is left running
#   deploy/open-webui/demo.sh status    what runs, health of both
#   deploy/open-webui/demo.sh logs [-f] wkvm's and Open WebUI's logs
#   deploy/open-webui/demo.sh env       the environment Open WebUI runs with (secret redacted)
#
# Options (any verb): --data DIR  --wkvm-port N  --webui-port N
# Environment:
#   WKVM_DATA            helper data dir (default ~/.local/share/wkvm-openwebui)
#   WKVM_MODEL_DIR       model to serve (default: the helper's random-weight demo model)
#   WKVM_PORT            wkvm's HTTP port (default 8000)
#   WEBUI_PORT           Open WebUI's port (default 3000)
#   OPEN_WEBUI_VERSION   Open WebUI version for install: 0.10.2 (the default for a new venv),
#                        0.12.4, or latest (the newest on PyPI); an existing venv keeps its
#                        version unless this is set (a downgrade is refused without
#                        OPEN_WEBUI_DOWNGRADE=1)
#   PYTHON               interpreter for the venv (default: python3.12, python3.11 or python3, 3.11/3.12)
#   WKVM_BUILD_DIR       wkvm build dir (default ./build; passed to deploy/wkvm)
#   WKVM_OWUI_VENV       use this existing Open WebUI venv instead of DATA/venv
#   CHROMIUM             browser-smoke's browser (default: chromium from PATH)
#   WKVM_FUNCTION_CALLING  native or legacy (default: native, Open WebUI's own
#                        default, for a model with its own chat template;
#                        legacy for the others)
#   SMOKE_CHAT           reuse, tools or both: what smoke and browser-smoke run
#                        (default: tools with native function calling, else
#                        reuse; docs/OPEN_WEBUI.md, "Tools and native function
#                        calling")
#
# Layout of DATA: venv/ (Open WebUI), wkvm/ (wkvm's data dir: store, blobs,
# logs, pids, via deploy/wkvm --data), models/wkvm-demo/ (demo model),
# open-webui/ (Open WebUI's DATA_DIR: webui.db, uploads, cache),
# secret_key (WEBUI_SECRET_KEY, 0600), open-webui.env (the environment
# Open WebUI runs with, 0600), run/, logs/, smoke-admin.json (0600).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
LAUNCHER=$SRC/deploy/wkvm
# The versions this kit is checked against (docs/OPEN_WEBUI.md): the pinned
# default and the newest release at the time of writing.
OWUI_PINNED=0.10.2
OWUI_TESTED="0.10.2 0.12.4"
OWUI_VERSION=${OPEN_WEBUI_VERSION:-}

die() { echo "demo: $*" >&2; exit 1; }
say() { echo "demo: $*"; }

VERB=${1:-}
[ $# -gt 0 ] && shift
DATA=${WKVM_DATA:-${HOME:-/root}/.local/share/wkvm-openwebui}
WKVM_PORT=${WKVM_PORT:-8000}
WEBUI_PORT=${WEBUI_PORT:-3000}
FOLLOW=""
while [ $# -gt 0 ]; do
    case $1 in
        --data) DATA=$2; shift 2 ;;
        --wkvm-port) WKVM_PORT=$2; shift 2 ;;
        --webui-port) WEBUI_PORT=$2; shift 2 ;;
        -f|--follow) FOLLOW=1; shift ;;
        *) die "unknown option $1 (see the top of $0)" ;;
    esac
done
[[ $WKVM_PORT =~ ^[0-9]+$ ]] || die "--wkvm-port must be a number"
[[ $WEBUI_PORT =~ ^[0-9]+$ ]] || die "--webui-port must be a number"
mkdir -p "$DATA"
DATA=$(cd "$DATA" && pwd)
VENV=${WKVM_OWUI_VENV:-$DATA/venv}
WKDATA=$DATA/wkvm
OWDATA=$DATA/open-webui
RUN=$DATA/run
LOGS=$DATA/logs
OWPID=$RUN/open-webui.pid
BUILD=${WKVM_BUILD_DIR:-$SRC/build}
export WKVM_BUILD_DIR=$BUILD
WKVM_URL=http://127.0.0.1:$WKVM_PORT
WEBUI_URL=http://127.0.0.1:$WEBUI_PORT

# The model: WKVM_MODEL_DIR, else the helper's demo model (see pick_demo_model.py).
if [ -n "${WKVM_MODEL_DIR:-}" ]; then MODEL=$WKVM_MODEL_DIR; DEMO_MODEL=""; else
    MODEL=$DATA/models/wkvm-demo; DEMO_MODEL=1; fi

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
http_ok() { curl -fsS --max-time 5 -o /dev/null "$1" 2>/dev/null; }

# pick_python: prints an interpreter that is 3.11 or 3.12 (Open WebUI 0.10
# needs >=3.11,<3.13), or nothing.
py_ok() { "$1" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 13) else 1)' 2>/dev/null; }
pick_python() {
    local c
    for c in ${PYTHON:-} python3.12 python3.11 python3 /usr/bin/python3; do
        command -v "$c" >/dev/null 2>&1 && py_ok "$c" && { command -v "$c"; return; }
    done
}

# port_free PORT: true when nothing listens on 127.0.0.1:PORT.
port_free() {
    python3 - "$1" <<'EOF'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
EOF
}

# ---------------------------------------------------------------- install
ensure_wkvm_build() {
    "$SRC/deploy/install-deps" --check >/dev/null 2>&1 || "$SRC/deploy/install-deps"
    if [ ! -f "$BUILD/build.ninja" ]; then
        meson setup "$BUILD" "$SRC" >/dev/null || die "meson setup failed for $BUILD"
    fi
    ninja -C "$BUILD" >/dev/null || { ninja -C "$BUILD" 2>&1 | tail -30; die "wkvm build failed in $BUILD"; }
}

ensure_demo_model() {
    [ -n "$DEMO_MODEL" ] || return 0
    [ -f "$MODEL/config.json" ] && return 0
    say "generating the demo model (random weights) in $MODEL"
    mkdir -p "$(dirname "$MODEL")"
    local seed
    seed=$(python3 "$HERE/pick_demo_model.py" --build "$BUILD" --out "$MODEL") ||
        die "could not generate the demo model"
    say "demo model: wkvm-mkmodel --seed $seed (first seed whose greedy replies to the smoke chat are clean; see pick_demo_model.py)"
}

# venv_version [VENV]: the open-webui version installed in the venv, or nothing.
venv_version() {
    local v=${1:-$VENV}
    [ -x "$v/bin/python" ] || return 0
    "$v/bin/python" -c 'import importlib.metadata as m; print(m.version("open-webui"))' 2>/dev/null || true
}

# ver_lt A B: true when version A sorts before version B.
ver_lt() { [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$1" ]; }

# tested V: true when this kit was checked against Open WebUI V.
tested() { case " $OWUI_TESTED " in *" $1 "*) return 0 ;; esac; return 1; }

# index_versions PY: open-webui's versions on the package index, newest first.
index_versions() {
    "$1" -m pip index versions open-webui 2>/dev/null | sed -n 's/^Available versions: //p' |
        tr -d ' ' | tr ',' '\n'
}

cmd_install() {
    local py
    py=$(pick_python)
    [ -n "$py" ] || die "no Python 3.11 or 3.12 found (Open WebUI needs >=3.11,<3.13); on Debian 12: deploy/install-deps (python3 is 3.11)"
    mkdir -p "$LOGS"
    if [ ! -x "$VENV/bin/python" ]; then
        say "creating the venv $VENV with $py ($("$py" --version 2>&1))"
        "$py" -m venv "$VENV" || die "python -m venv failed: on Debian install python3-venv (deploy/install-deps does)"
    fi
    py_ok "$VENV/bin/python" || die "$VENV uses $("$VENV/bin/python" --version 2>&1); Open WebUI needs 3.11 or 3.12: remove $VENV and run install again"
    local have want versions
    have=$(venv_version)
    want=$OWUI_VERSION
    if [ -z "$want" ]; then
        # No version asked for: an existing install is kept as it is (never
        # replaced, never downgraded); a new venv gets the pinned one.
        if [ -n "$have" ]; then
            want=$have
            tested "$have" || say "note: Open WebUI $have in $VENV is not a version this kit was checked against ($OWUI_TESTED); kept (set OPEN_WEBUI_VERSION to change it)"
        else
            want=$OWUI_PINNED
        fi
    fi
    if [ "$want" = latest ]; then
        want=$(index_versions "$VENV/bin/python" | head -1)
        [ -n "$want" ] || die "could not read open-webui's versions from the package index ('$VENV/bin/pip index versions open-webui' failed)"
        say "newest Open WebUI on the package index: $want"
    fi
    if [ "$have" = "$want" ]; then
        say "Open WebUI $have already installed in $VENV"
    else
        if [ -n "$have" ] && ver_lt "$want" "$have" && [ "${OPEN_WEBUI_DOWNGRADE:-}" != 1 ]; then
            die "$VENV holds Open WebUI $have, newer than the requested $want; not downgrading it (its database migrations only run forward): use another venv (WKVM_OWUI_VENV, --data), or set OPEN_WEBUI_DOWNGRADE=1"
        fi
        say "checking the package index for open-webui==$want"
        versions=$(index_versions "$VENV/bin/python") || true
        if [ -n "$versions" ] && ! grep -qx -- "$want" <<<"$versions"; then
            die "open-webui $want is not on the package index (newest: $(head -5 <<<"$versions" | tr '\n' ' ')...); set OPEN_WEBUI_VERSION"
        fi
        tested "$want" || say "note: Open WebUI $want is not a version this kit was checked against ($OWUI_TESTED); run '$0 smoke' after start"
        if [ -n "$have" ]; then say "replacing Open WebUI $have with $want in $VENV"; fi
        say "installing open-webui==$want into $VENV (several GB: torch and friends; log: $LOGS/install.log)"
        if ! "$VENV/bin/pip" install --progress-bar off "open-webui==$want" >"$LOGS/install.log" 2>&1; then
            tail -n 25 "$LOGS/install.log" >&2
            die "pip could not install open-webui==$want (full log: $LOGS/install.log)"
        fi
        have=$(venv_version)
        say "installed Open WebUI $have"
    fi
    say "building wkvm in $BUILD"
    ensure_wkvm_build
    ensure_demo_model
    say "install done: Open WebUI $have ($VENV), wkvm ($BUILD), model $MODEL"
}

# ---------------------------------------------------------------- doctor
DOC_FAIL=0
ok() { printf '  ok    %s\n' "$*"; }
warn() { printf '  warn  %s\n' "$*"; }
info() { printf '  info  %s\n' "$*"; }
bad() { printf '  FAIL  %s\n' "$*"; DOC_FAIL=1; }

check_model_dir() {
    local m=$1
    if [ -f "$m" ] && [ "${m%.gguf}" != "$m" ]; then
        ok "GGUF model $m (function calling: $(function_calling))"; return
    fi
    if [ ! -d "$m" ]; then bad "model dir $m does not exist"; return; fi
    if [ ! -r "$m" ] || [ ! -x "$m" ]; then bad "model dir $m is not readable"; return; fi
    if [ -r "$m/tokenizer.json" ] && [ -r "$m/config.json" ]; then
        # A Hugging Face checkpoint with its own tokenizer (Qwen3.5, Nemotron-H,
        # Granite 4, RWKV-7 with tokenizer.json): wkvm reads its template.
        ok "Hugging Face checkpoint with config.json and tokenizer.json in $m (function calling: $(function_calling))"
        return
    fi
    local vocab=$m/rwkv_vocab_v20230424.txt tensors
    if [ -r "$vocab" ]; then ok "vocab $vocab"; else bad "no readable rwkv_vocab_v20230424.txt in $m"; fi
    tensors=$(find "$m" -maxdepth 1 \( -name '*.safetensors' -o -name '*.pth' -o -name 'model.safetensors.index.json' \) -readable | head -1)
    if [ -z "$tensors" ]; then bad "no readable *.safetensors / *.pth / model.safetensors.index.json in $m"; fi
    if [ -f "$m/model.safetensors" ] || [ -f "$m/model.safetensors.index.json" ]; then
        if [ -r "$m/config.json" ]; then ok "Hugging Face rwkv7 checkpoint with config.json in $m"
        else bad "$m has a Hugging Face checkpoint but no readable config.json"; fi
    elif [ -n "$tensors" ]; then
        ok "BlinkDL checkpoint $(basename "$tensors") in $m"
    fi
}

cmd_doctor() {
    echo "demo doctor (data $DATA, wkvm $WKVM_URL, Open WebUI $WEBUI_URL)"
    local py
    py=$(pick_python)
    if [ -n "$py" ]; then ok "python $("$py" --version 2>&1 | cut -d' ' -f2) ($py)"
    else bad "no Python 3.11/3.12 (Open WebUI needs >=3.11,<3.13): deploy/install-deps"; fi
    if command -v curl >/dev/null; then ok "curl"; else bad "curl missing: deploy/install-deps"; fi
    if [ -x "$VENV/bin/python" ]; then
        local v
        v=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("open-webui"))' 2>/dev/null || true)
        if ! py_ok "$VENV/bin/python"; then bad "venv $VENV uses $("$VENV/bin/python" --version 2>&1), not 3.11/3.12"
        elif [ -z "$v" ]; then bad "Open WebUI is not installed in $VENV: run '$0 install'"
        elif [ ! -x "$VENV/bin/open-webui" ]; then bad "$VENV/bin/open-webui missing: run '$0 install'"
        elif [ -n "$OWUI_VERSION" ] && [ "$OWUI_VERSION" != latest ] && [ "$v" != "$OWUI_VERSION" ]; then
            if ver_lt "$OWUI_VERSION" "$v"; then
                bad "Open WebUI $v in $VENV, but OPEN_WEBUI_VERSION=$OWUI_VERSION (older: install does not downgrade a venv; unset it to use $v, or use another venv)"
            else
                bad "Open WebUI $v in $VENV, but OPEN_WEBUI_VERSION=$OWUI_VERSION: run '$0 install' (or unset it to use $v)"
            fi
        elif tested "$v"; then ok "Open WebUI $v ($VENV; checked versions: $OWUI_TESTED)"
        else warn "Open WebUI $v in $VENV is not a version this kit was checked against ($OWUI_TESTED); '$0 smoke' tells whether it works"; fi
    else
        bad "no venv at $VENV: run '$0 install'"
    fi
    local b missing=""
    for b in controld/wkvm-controld workerd/wkvm-workerd tools/wkvm-mkmodel tools/wkvm-infer; do
        [ -x "$BUILD/$b" ] || missing="$missing $b"
    done
    if [ -z "$missing" ]; then ok "wkvm binaries in $BUILD"
    else bad "wkvm binaries missing in $BUILD:$missing (run '$0 install' or ninja -C $BUILD)"; fi
    if [ -x "$LAUNCHER" ]; then ok "launcher $LAUNCHER"; else bad "launcher $LAUNCHER missing"; fi
    local p name pidf
    for p in "$WKVM_PORT:wkvm:$WKDATA/run/controld.pid" "$WEBUI_PORT:Open WebUI:$OWPID"; do
        name=${p#*:}; pidf=${name#*:}; name=${name%%:*}; p=${p%%:*}
        if port_free "$p"; then ok "port 127.0.0.1:$p free ($name)"
        elif alive "$pidf"; then info "port $p is in use by this helper's running $name (pid $(cat "$pidf"))"
        else bad "port 127.0.0.1:$p ($name) is in use by another program: stop it or pass --$( [ "$name" = wkvm ] && echo wkvm || echo webui)-port"; fi
    done
    local avail
    avail=$(df -Pk "$DATA" | awk 'NR==2 {print int($4/1024)}')
    if [ "$avail" -lt 1024 ]; then bad "only ${avail} MiB free in $DATA (need 1 GiB to run)"
    elif [ ! -x "$VENV/bin/open-webui" ] && [ "$avail" -lt 12288 ]; then
        warn "${avail} MiB free in $DATA; installing Open WebUI needs about 10 GiB"
    else ok "${avail} MiB free in $DATA"; fi
    if [ -n "$DEMO_MODEL" ] && [ ! -f "$MODEL/config.json" ]; then
        info "demo model $MODEL will be generated by install/start (random weights)"
    else
        check_model_dir "$MODEL"
    fi
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        info "GPU: $(nvidia-smi -L | head -1) (wkvm serves on the CPU unless started with --backend cuda: auto means cpu until the CUDA backend has passed its gpu suite on a device)"
    else
        info "no NVIDIA GPU visible: wkvm runs on the CPU backend"
    fi
    if [ $DOC_FAIL -ne 0 ]; then echo "demo doctor: problems found (above)"; return 1; fi
    echo "demo doctor: all good"
}

# ---------------------------------------------------------------- start
secret_key() {
    local f=$DATA/secret_key
    if [ ! -s "$f" ]; then
        (umask 077; head -c 48 /dev/urandom | base64 | tr -d '\n/+=' >"$f")
    fi
    chmod 600 "$f"
    cat "$f"
}

# model_has_template: true when the served model carries its own chat
# template (chat_template.jinja, a chat_template in tokenizer_config.json,
# or a GGUF, whose tokenizer.chat_template wkvm reads): wkvm then renders
# tools into the prompt and parses the model's calls (docs/TEMPLATES.md).
model_has_template() {
    [ -n "$DEMO_MODEL" ] && return 1
    [ -f "$MODEL/chat_template.jinja" ] && return 0
    [ -f "$MODEL/tokenizer_config.json" ] && grep -q '"chat_template"' "$MODEL/tokenizer_config.json" && return 0
    [ -f "$MODEL" ] && [ "${MODEL%.gguf}" != "$MODEL" ] && return 0
    return 1
}

# function_calling: Open WebUI's function calling mode for the model:
# WKVM_FUNCTION_CALLING (native or legacy), else native (Open WebUI's own
# default) for a model with its own template and legacy for one without
# (a World-template model never calls a tool; docs/OPEN_WEBUI.md).
function_calling() {
    case ${WKVM_FUNCTION_CALLING:-} in
        native|legacy) echo "$WKVM_FUNCTION_CALLING"; return ;;
        "") ;;
        *) die "WKVM_FUNCTION_CALLING must be native or legacy" ;;
    esac
    if model_has_template; then echo native; else echo legacy; fi
}

# owui_env [redact]: prints the environment Open WebUI runs with, one
# KEY=VALUE a line (with "redact", the secret key is not read or created).
# compose.yaml sets the same variables (tests/integration/test_openwebui_shape.py
# checks that the two agree).
owui_env() {
    local headers configs key params
    if [ "${1:-}" = redact ]; then key='<redacted>'; else key=$(secret_key); fi
    # Per-connection headers (OPENAI_API_CONFIGS["0"].headers): Open WebUI
    # 0.10.2 substitutes {{MESSAGE_ID}}, {{USER_MESSAGE_ID}} and
    # {{USER_MESSAGE_PARENT_ID}} in their values (utils/headers.py,
    # get_custom_headers()) on every request to this connection.
    headers='{"X-WKVM-Stateful-Chat":"parent-token-v1","X-WKVM-Assistant-Message-ID":"{{MESSAGE_ID}}","X-WKVM-User-Message-ID":"{{USER_MESSAGE_ID}}","X-WKVM-Parent-Message-ID":"{{USER_MESSAGE_PARENT_ID}}"}'
    configs="{\"0\":{\"enable\":true,\"connection_type\":\"external\",\"headers\":$headers}}"
    # Native function calling is Open WebUI's default: only set legacy.
    if [ "$(function_calling)" = legacy ]; then
        params='{"function_calling":"legacy","reasoning_tags":false}'
    else
        params='{"reasoning_tags":false}'
    fi
    cat <<EOF
DATA_DIR=$OWDATA
WEBUI_SECRET_KEY=$key
WEBUI_URL=$WEBUI_URL
CORS_ALLOW_ORIGIN=$WEBUI_URL
OFFLINE_MODE=true
HF_HUB_OFFLINE=1
TRANSFORMERS_OFFLINE=1
HF_HOME=$OWDATA/cache/huggingface
ENABLE_VERSION_UPDATE_CHECK=false
ANONYMIZED_TELEMETRY=false
DO_NOT_TRACK=true
SCARF_NO_ANALYTICS=true
USER_AGENT=open-webui-wkvm-demo
ENABLE_PERSISTENT_CONFIG=false
ENABLE_OLLAMA_API=false
ENABLE_OPENAI_API=true
OPENAI_API_BASE_URLS=$WKVM_URL/v1
OPENAI_API_KEYS=none
OPENAI_API_CONFIGS=$configs
ENABLE_FORWARD_USER_INFO_HEADERS=true
DEFAULT_MODEL_PARAMS=$params
RAG_EMBEDDING_ENGINE=openai
RAG_EMBEDDING_MODEL_AUTO_UPDATE=false
RAG_RERANKING_MODEL_AUTO_UPDATE=false
ENABLE_TITLE_GENERATION=false
ENABLE_TAGS_GENERATION=false
ENABLE_FOLLOW_UP_GENERATION=false
ENABLE_AUTOCOMPLETE_GENERATION=false
ENABLE_SEARCH_QUERY_GENERATION=false
ENABLE_RETRIEVAL_QUERY_GENERATION=false
ENABLE_CONTEXT_COMPACTION=false
ENABLE_MEMORIES=false
ENABLE_EVALUATION_ARENA_MODELS=false
ENABLE_WEB_SEARCH=false
ENABLE_IMAGE_GENERATION=false
ENABLE_CODE_INTERPRETER=false
EOF
}

wkvm_running() { alive "$WKDATA/run/controld.pid"; }
owui_running() { alive "$OWPID"; }

cmd_start() {
    if owui_running && wkvm_running && http_ok "$WEBUI_URL/health" && http_ok "$WKVM_URL/ready"; then
        say "already running: Open WebUI $WEBUI_URL, wkvm $WKVM_URL"
        return 0
    fi
    [ -x "$VENV/bin/open-webui" ] || die "Open WebUI is not installed: run '$0 install' first"
    [ -x "$BUILD/controld/wkvm-controld" ] || ensure_wkvm_build
    ensure_demo_model
    cmd_doctor >"$DATA/doctor.txt" 2>&1 || { cat "$DATA/doctor.txt" >&2; die "doctor found problems (above)"; }
    mkdir -p "$RUN" "$LOGS" "$OWDATA" "$WKDATA"
    if ! wkvm_running; then
        say "starting wkvm on $WKVM_URL (deploy/wkvm up --data $WKDATA)"
        "$LAUNCHER" up --data "$WKDATA" --port "$WKVM_PORT" --host 127.0.0.1 --model "$MODEL" |
            sed 's/^/  /' || die "wkvm did not start ('$0 logs')"
    fi
    http_ok "$WKVM_URL/ready" || die "wkvm at $WKVM_URL is not ready"
    local model_id
    model_id=$(curl -fsS "$WKVM_URL/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
    say "wkvm ready, model '$model_id'"
    if ! owui_running; then
        local envf=$DATA/open-webui.env envv=()
        (umask 077; owui_env >"$envf")
        chmod 600 "$envf"
        mapfile -t envv <"$envf"
        say "starting Open WebUI on $WEBUI_URL (env: $envf, log: $LOGS/open-webui.log)"
        # A clean environment: nothing from the caller's (an OPENAI_API_KEY,
        # a stray DATA_DIR) leaks into Open WebUI. setsid: its own session
        # and process group, so stop can end it and anything it spawned, by
        # its id. The inner shell writes its own pid and execs the server,
        # so the pid file holds the server's pid even when setsid forks.
        rm -f "$OWPID"
        # shellcheck disable=SC2016 # $$, $0 and $@ are the inner shell's
        (cd "$OWDATA" && exec setsid bash -c 'echo $$ >"$0"; exec "$@"' "$OWPID" \
            env -i HOME="$OWDATA" PATH="$VENV/bin:/usr/bin:/bin" LANG=C.UTF-8 \
            "${envv[@]}" "$VENV/bin/open-webui" serve --host 127.0.0.1 --port "$WEBUI_PORT" \
            >>"$LOGS/open-webui.log" 2>&1 </dev/null) &
        local _
        for _ in $(seq 1 50); do [ -s "$OWPID" ] && break; sleep 0.1; done
        [ -s "$OWPID" ] || die "Open WebUI did not start (log: $LOGS/open-webui.log)"
    fi
    local deadline=$((SECONDS + ${WEBUI_START_TIMEOUT:-600}))
    until http_ok "$WEBUI_URL/health"; do
        if ! owui_running; then
            tail -n 30 "$LOGS/open-webui.log" >&2 || true
            rm -f "$OWPID"
            die "Open WebUI exited during start-up (log: $LOGS/open-webui.log; wkvm is still up: '$0 stop' stops it)"
        fi
        [ $SECONDS -lt $deadline ] || die "Open WebUI did not answer $WEBUI_URL/health in time (log: $LOGS/open-webui.log; '$0 stop' stops both)"
        sleep 1
    done
    say "ready: open $WEBUI_URL (Open WebUI, first sign-up becomes admin) -> wkvm $WKVM_URL/v1"
    echo "$WEBUI_URL"
}

# ---------------------------------------------------------------- smoke
cmd_smoke() {
    http_ok "$WKVM_URL/ready" || die "wkvm is not ready at $WKVM_URL: run '$0 start'"
    http_ok "$WEBUI_URL/health" || die "Open WebUI is not up at $WEBUI_URL: run '$0 start'"
    "$VENV/bin/python" "$HERE/smoke.py" --webui "$WEBUI_URL" --wkvm "$WKVM_URL" \
        --creds "$DATA/smoke-admin.json" --chat "$(smoke_chat)"
}

# smoke_chat: which chat the smokes run: SMOKE_CHAT (reuse, tools or both),
# else the tool chat for a model with native function calling (a model
# with its own template, which thinks and calls tools) and the reuse chat
# for the others (the World demo model).
smoke_chat() {
    case ${SMOKE_CHAT:-} in
        reuse|tools|both) echo "$SMOKE_CHAT"; return ;;
        "") ;;
        *) die "SMOKE_CHAT must be reuse, tools or both" ;;
    esac
    if [ "$(function_calling)" = native ]; then echo tools; else echo reuse; fi
}

# ---------------------------------------------------------------- browser-smoke
# A real browser: Debian's chromium driven by the playwright package in the
# Open WebUI venv (installed here on first use; its browser download is
# never used: executable_path points at chromium). Screenshots go to
# DATA/browser-smoke/. Not part of CI (see docs/OPEN_WEBUI.md).
cmd_browser_smoke() {
    http_ok "$WKVM_URL/ready" || die "wkvm is not ready at $WKVM_URL: run '$0 start'"
    http_ok "$WEBUI_URL/health" || die "Open WebUI is not up at $WEBUI_URL: run '$0 start'"
    local chrome=${CHROMIUM:-}
    [ -n "$chrome" ] || chrome=$(command -v chromium || command -v chromium-browser || true)
    [ -n "$chrome" ] && [ -x "$chrome" ] ||
        die "no chromium found: on Debian 'apt-get install chromium' (or set CHROMIUM=/path/to/chromium)"
    if ! "$VENV/bin/python" -c 'import playwright.sync_api' 2>/dev/null; then
        mkdir -p "$LOGS"
        say "installing the playwright package into $VENV (no browser download; log: $LOGS/install.log)"
        PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 "$VENV/bin/pip" install --progress-bar off playwright \
            >>"$LOGS/install.log" 2>&1 || { tail -n 20 "$LOGS/install.log" >&2; die "pip could not install playwright"; }
    fi
    mkdir -p "$DATA/browser-smoke"
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 "$VENV/bin/python" "$HERE/browser_smoke.py" \
        --webui "$WEBUI_URL" --wkvm "$WKVM_URL" --creds "$DATA/smoke-admin.json" \
        --chromium "$chrome" --out "$DATA/browser-smoke" --chat "$(smoke_chat)"
}

# ---------------------------------------------------------------- stop/status/logs
stop_owui() {
    [ -f "$OWPID" ] || return 0
    local pid _
    pid=$(cat "$OWPID")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            say "Open WebUI (pid $pid) did not stop in 20 s, sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    # Anything left in its process group (setsid made pgid = pid).
    if pgrep -g "$pid" >/dev/null 2>&1; then kill -KILL -- "-$pid" 2>/dev/null || true; fi
    rm -f "$OWPID"
    say "Open WebUI stopped"
}

cmd_stop() {
    stop_owui
    if [ -d "$WKDATA/run" ]; then "$LAUNCHER" down --data "$WKDATA" | sed 's/^/  /'; fi
    local left=""
    alive "$WKDATA/run/controld.pid" && left="$left wkvm-controld"
    for f in "$WKDATA"/run/worker-*.pid; do [ -e "$f" ] && alive "$f" && left="$left $(basename "$f" .pid)"; done
    [ -z "$left" ] || die "still running:$left"
    say "stopped (data kept in $DATA)"
}

cmd_status() {
    local rc=0
    if owui_running; then
        echo "open-webui: running (pid $(cat "$OWPID")), $WEBUI_URL/health: $(curl -fsS --max-time 5 "$WEBUI_URL/health" 2>/dev/null || echo 'no answer')"
    else
        echo "open-webui: not running"; rc=3
    fi
    "$LAUNCHER" status --data "$WKDATA" || rc=$?
    return $rc
}

cmd_logs() {
    local files=()
    [ -f "$LOGS/open-webui.log" ] && files+=("$LOGS/open-webui.log")
    for f in "$WKDATA"/logs/*.log; do [ -e "$f" ] && files+=("$f"); done
    [ ${#files[@]} -gt 0 ] || die "no logs yet in $LOGS or $WKDATA/logs"
    if [ -n "$FOLLOW" ]; then tail -n 50 -F "${files[@]}"; else tail -n 50 "${files[@]}"; fi
}

case $VERB in
    install) cmd_install ;;
    doctor) cmd_doctor ;;
    start) cmd_start ;;
    smoke) cmd_smoke ;;
    browser-smoke) cmd_browser_smoke ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    logs) cmd_logs ;;
    env) owui_env redact ;;
    *) echo "usage: deploy/open-webui/demo.sh install|doctor|start|smoke|browser-smoke|stop|status|logs|env [--data DIR] [--wkvm-port N] [--webui-port N]" >&2; exit 2 ;;
esac
