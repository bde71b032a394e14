#!/usr/bin/env python3
"""Stateful chat benchmark: N concurrent chats x T turns (the whole history sent
every turn) plus one regenerate per chat, streamed through /v1/chat/completions,
against wkvm in three modes and llama.cpp's llama-server on the same weights:

  headers    wkvm with the parent-token-v1 headers exactly as Open WebUI sends them
  plain      wkvm with no extra header at all (what the OpenAI SDK or curl send)
  recompute  wkvm with "cache": false on every request (a stateless server)
  llama      llama-server on the same checkpoint converted to GGUF bf16 with
             llama.cpp's own convert_hf_to_gguf.py, cache_prompt at its default

Each mode runs on a fresh stack (cold caches), one after another, and --rounds
repeats the whole set in alternating order (ABCD DCBA ...). Per run: total wall,
output tok/s, TTFT p50/p95 per turn index (client side: request sent -> first
content chunk), prompt and cached tokens from usage, follow-ups and regenerates
reused (cached tokens cover the previous turn's prompt: at least
prompt_tokens - reply - new message - 16 tokens of slack; a regenerate at least
prompt_tokens - 16), and for wkvm the reuse counters from /metrics.

Replies are --reply-tokens tokens exactly (max_tokens + ignore_eos, temperature 0).
The client sends each reply back the way its client would: Open WebUI stores it
stripped (headers mode), the SDK as received (plain, recompute, llama).

Default model: random bf16 weights in the RWKV-7 0.1B shape (L12 C768 F3072)
with the real World vocab (from the PyPI `rwkv` package, set up by
bench/peer-setup.sh); the llama mode needs bench/peer-setup.sh (llama-server +
converter). Stdlib only; --plot needs matplotlib.

    bench/peer-setup.sh build/peer
    /usr/bin/python3 bench/chat.py --build build --peer build/peer --out /tmp/chat.json

--gguf FILE runs both servers on one GGUF file instead (wkvm reads it alone, tokenizer
from its metadata), e.g. the Qwen3.5-shaped model of docs/PERFORMANCE.md:
    /usr/bin/python3 bench/chat.py --gguf q35.bf16.gguf --modes headers,plain,llama
"""
import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from benchlib import machine, percentile  # noqa: E402

MODES = ("headers", "plain", "recompute", "llama")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("WKVM_BUILD_DIR", os.path.join(SRC, "build")))
    ap.add_argument("--peer", default=os.path.join(SRC, "build", "peer"),
                    help="bench/peer-setup.sh's directory (llama-server, converter venv, vocab)")
    ap.add_argument("--model", help="HF rwkv7 model dir (default: random 0.1B shape, World vocab)")
    ap.add_argument("--gguf", help="one .gguf (with its tokenizer) that both wkvm and llama-server "
                    "load, e.g. a Qwen3.5-shaped model from bench/qwen35-gguf.py")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the modes, alternating order")
    ap.add_argument("--chats", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--first-tokens", type=int, default=2000)
    ap.add_argument("--user-tokens", type=int, default=32)
    ap.add_argument("--reply-tokens", type=int, default=32)
    ap.add_argument("--slots", type=int, default=4, help="wkvm slots / llama-server -np")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctl-arg", action="append", default=[], metavar="ARG",
                    help="extra wkvm-controld argument (repeat), e.g. --ctl-arg=--state-cache-bytes=1000000000")
    ap.add_argument("--worker-arg", action="append", default=[], metavar="ARG",
                    help="extra wkvm-workerd argument (repeat), e.g. --worker-arg=--host-cache-bytes=1000000000")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="write JSON results here")
    ap.add_argument("--plot", help="PNG of TTFT p50 per turn index per mode (needs matplotlib)")
    ap.add_argument("--plot-from", help="only plot this earlier --out file")
    return ap.parse_args()


ARGS = None
WORDS = ("state slot model token worker request session chat turn reply history prompt "
         "memory layer head value key decay kernel batch step cache store blob disk the a of "
         "and to in is was for on that with as it by at from this be are or an which one all "
         "were when we there can been has more if no out so said what up its about into than "
         "them only other new some could time these two may then first any my now such like "
         "our over man me even most made after also did many before must through back years "
         "where much your way well down should because each just those people how too little "
         "good very make world still own see men work long get here between both life being "
         "under never day same another know while last might us great old year off come since "
         "against go came right used take three river mountain garden letter window table").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def text_of(rng, n_tokens):
    """English-like text; about 4.5 characters a token in the World vocab."""
    out, size, chars = [], 0, int(n_tokens * 4.5)
    while size < chars:
        w = [rng.choice(WORDS) for _ in range(rng.randint(6, 16))]
        s = " ".join(w).capitalize() + "."
        out.append(s)
        size += len(s) + 1
    return " ".join(out)[:chars].rstrip()


def make_model(tmp):
    d = os.path.join(tmp, "rwkv7-0.1b-random")
    subprocess.run([os.path.join(ARGS.build, "tools", "wkvm-mkmodel"), "--out", d, "--layers",
                    "12", "--embd", "768", "--head-size", "64", "--ffn", "3072", "--vocab",
                    "65536", "--seed", str(ARGS.seed)], check=True, capture_output=True,
                   timeout=600)
    vocab = os.path.join(ARGS.peer, "rwkv_vocab_v20230424.txt")
    if os.path.exists(vocab):
        shutil.copy(vocab, os.path.join(d, "rwkv_vocab_v20230424.txt"))
    else:
        print(f"chat.py: {vocab} missing (bench/peer-setup.sh): using wkvm-mkmodel's vocab",
              file=sys.stderr)
    return d


def make_gguf(model, tmp):
    out = os.path.join(tmp, "model-bf16.gguf")
    py = os.path.join(ARGS.peer, "venv", "bin", "python")
    conv = os.path.join(ARGS.peer, "llama.cpp", "convert_hf_to_gguf.py")
    p = subprocess.run([py, os.path.join(HERE, "gguf-convert.py"), conv, model, "--outtype",
                        "bf16", "--outfile", out], capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"chat.py: convert_hf_to_gguf.py failed:\n{p.stderr[-3000:]}")
    return out


# --------------------------------------------------------------- servers ----

class Wkvm:
    def __init__(self, model, tmp):
        sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
        os.environ["WKVM_BUILD_DIR"] = os.path.abspath(ARGS.build)
        import wkvm_harness
        self.h = wkvm_harness
        self.data = tempfile.mkdtemp(prefix="chat-wkvm-", dir=tmp)
        self.s = wkvm_harness.Stack(model=model, slots=ARGS.slots, data=self.data,
                                   extra_ctl=ARGS.ctl_arg)

    def __enter__(self):
        self.s.start_controller()
        self.s.start_worker("w0", extra=["--threads", str(ARGS.threads)] + ARGS.worker_arg)
        self.s.wait(lambda: self.s.get("/ready").status == 200, "ready", timeout=600)
        self.port = self.s.port
        self.model_id = self.s.get("/v1/models").json()["data"][0]["id"]
        return self

    def metrics(self):
        out = {}
        for line in self.s.get("/metrics", timeout=30).body.decode().splitlines():
            if line and line[0] != "#" and 'le="' not in line:
                k, _, v = line.rpartition(" ")
                try:
                    out[k] = float(v)
                except ValueError:
                    pass
        return out

    def __exit__(self, *exc):
        self.s.stop()
        shutil.rmtree(self.data, ignore_errors=True)


class Llama:
    def __init__(self, gguf):
        self.gguf = gguf
        self.port = free_port()
        self.model_id = "model"
        self.proc = None

    def __enter__(self):
        ctx = ARGS.slots * (ARGS.first_tokens + ARGS.turns * (ARGS.user_tokens +
                                                              ARGS.reply_tokens) + 1024)
        srv = os.path.join(ARGS.peer, "llama.cpp", "build", "bin", "llama-server")
        self.log = open(os.path.join(tempfile.gettempdir(), f"llama-{self.port}.log"), "wb")
        self.proc = subprocess.Popen([srv, "-m", self.gguf, "--host", "127.0.0.1", "--port",
                                      str(self.port), "-t", str(ARGS.threads), "-tb",
                                      str(ARGS.threads), "-np", str(ARGS.slots), "-c", str(ctx),
                                      "--alias", self.model_id, "--no-webui"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        t0 = time.time()
        while time.time() - t0 < 600:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return self
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("llama-server exited; see " + self.log.name)
            time.sleep(0.5)
        raise RuntimeError("llama-server did not become healthy")

    def metrics(self):
        return {}

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


# ------------------------------------------------------------- workload ----

class ChatRun(threading.Thread):
    def __init__(self, srv, mode, idx, texts, start_evt):
        super().__init__(daemon=True)
        self.srv, self.mode, self.idx, self.texts, self.start_evt = srv, mode, idx, texts, start_evt
        self.chat_id = f"{mode}-chat-{idx}"
        self.msgs, self.last_assistant, self.records, self.error = [], "", [], None

    def post(self, k, msgs, aid, uid, parent, regen):
        body = {"model": self.srv.model_id, "messages": msgs, "max_tokens": ARGS.reply_tokens,
                "ignore_eos": True, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        if self.mode == "recompute":
            body["cache"] = False
        hdrs = {"Content-Type": "application/json"}
        if self.mode == "headers":
            hdrs.update({"X-OpenWebUI-User-Id": "u1", "X-OpenWebUI-Chat-Id": self.chat_id,
                         "X-WKVM-Stateful-Chat": "parent-token-v1",
                         "X-WKVM-Assistant-Message-ID": aid, "X-WKVM-User-Message-ID": uid,
                         "X-WKVM-Parent-Message-ID": parent})
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=1200)
        try:
            t0 = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                         headers=hdrs)
            r = conn.getresponse()
            if r.status != 200:
                raise RuntimeError(f"{self.chat_id} turn {k}: HTTP {r.status}: {r.read()[:300]!r}")
            reply, first, usage, timings = [], None, None, None
            while True:
                line = r.readline()
                if not line:
                    break
                if not line.startswith(b"data: "):
                    continue
                p = line[6:].strip()
                if p == b"[DONE]":
                    break
                ev = json.loads(p)
                if "error" in ev:
                    raise RuntimeError(f"stream error: {ev['error']}")
                usage = ev.get("usage") or usage
                timings = ev.get("timings") or timings
                for ch in ev.get("choices") or []:
                    c = (ch.get("delta") or {}).get("content")
                    if c:
                        first = first or time.perf_counter()
                        reply.append(c)
            t1 = time.perf_counter()
            if usage is None:
                raise RuntimeError("no usage in the stream")
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            if cached is None and timings is not None:
                cached = timings.get("cache_n", 0)
            rec = {"turn": k, "regen": regen, "ttft": (first or t1) - t0, "latency": t1 - t0,
                   "prompt_tokens": usage["prompt_tokens"], "cached_tokens": cached or 0,
                   "completion_tokens": usage["completion_tokens"], "t_send": t0}
            self.records.append(rec)
            return "".join(reply)
        finally:
            conn.close()

    def run(self):
        self.start_evt.wait()
        try:
            prev_msgs = None
            for k, text in enumerate(self.texts):
                aid, uid = f"{self.chat_id}-a{k + 1}", f"{self.chat_id}-u{k + 1}"
                msgs = self.msgs + [{"role": "user", "content": text}]
                parent = self.last_assistant
                reply = self.post(k, msgs, aid, uid, parent, False)
                prev_msgs = (msgs, uid, parent)
                keep = reply.replace("\x00", "").strip() if self.mode == "headers" else reply
                self.msgs = msgs + [{"role": "assistant", "content": keep}]
                self.last_assistant = aid
            # Regenerate the last reply: the same request, a new assistant id.
            msgs, uid, parent = prev_msgs
            self.post(len(self.texts) - 1, msgs, f"{self.chat_id}-r", uid, parent, True)
        except Exception as e:  # noqa: BLE001
            self.error = str(e)


def reused(x, prev_prompt):
    if x["regen"]:
        return x["cached_tokens"] >= x["prompt_tokens"] - 16
    return x["cached_tokens"] >= prev_prompt - 16


def replay(srv, mode, texts):
    before = srv.metrics()
    start = threading.Event()
    runs = [ChatRun(srv, mode, i, texts[i], start) for i in range(len(texts))]
    for r in runs:
        r.start()
    t0 = time.perf_counter()
    start.set()
    for r in runs:
        r.join()
    wall = time.perf_counter() - t0
    after = srv.metrics()
    errors = [r.error for r in runs if r.error]
    follow, regen = [], []
    for r in runs:
        turns = [x for x in r.records if not x["regen"]]
        for a, b in zip(turns, turns[1:]):
            b["reused"] = reused(b, a["prompt_tokens"])
            follow.append(b)
        for x in r.records:
            if x["regen"]:
                x["reused"] = reused(x, 0)
                regen.append(x)
    recs = [x for r in runs for x in r.records]
    per_turn = []
    for k in range(ARGS.turns):
        tt = [x["ttft"] for x in recs if x["turn"] == k and not x["regen"]]
        per_turn.append({"turn": k, "ttft_p50_ms": percentile(tt, 50) * 1e3 if tt else None,
                         "ttft_p95_ms": percentile(tt, 95) * 1e3 if tt else None})
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    out_tok = sum(x["completion_tokens"] for x in recs)
    return {
        "mode": mode, "wall_s": wall, "errors": errors[:5], "requests": len(recs),
        "output_tok_s": out_tok / wall if wall else None,
        "followups": len(follow), "followups_reused": sum(x["reused"] for x in follow),
        "regenerates": len(regen), "regenerates_reused": sum(x["reused"] for x in regen),
        "ttft_followup_p50_ms": percentile([x["ttft"] for x in follow], 50) * 1e3
        if follow else None,
        "ttft_followup_p95_ms": percentile([x["ttft"] for x in follow], 95) * 1e3
        if follow else None,
        "ttft_regen_p50_ms": percentile([x["ttft"] for x in regen], 50) * 1e3 if regen else None,
        "ttft_first_p50_ms": per_turn[0]["ttft_p50_ms"],
        "prompt_tokens": sum(x["prompt_tokens"] for x in recs),
        "cached_tokens": sum(x["cached_tokens"] for x in recs),
        "per_turn": per_turn,
        "wkvm_metrics": {k: v for k, v in d.items() if v and re.match(
            r"wkvm_(reuse_hits|reuse_misses|parent_bound|state_cache_evictions|checkpoints)", k)},
        "session_unavailable": d.get(
            'wkvm_parent_bound_continuation_rejections_total{reason="session_unavailable"}', 0),
    }


def fmt(x, nd=1):
    return "-" if x is None else f"{x:,.{nd}f}"


def table(runs):
    rows = ["| mode | wall s | out tok/s | follow-ups reused | regenerates reused | "
            "follow-up TTFT p50 ms | p95 ms | regenerate TTFT p50 ms | first-turn TTFT p50 ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        rows.append(f"| {r['mode']} | {fmt(r['wall_s'], 2)} | {fmt(r['output_tok_s'])} | "
                    f"{r['followups_reused']}/{r['followups']} | "
                    f"{r['regenerates_reused']}/{r['regenerates']} | "
                    f"{fmt(r['ttft_followup_p50_ms'])} | {fmt(r['ttft_followup_p95_ms'])} | "
                    f"{fmt(r['ttft_regen_p50_ms'])} | {fmt(r.get('ttft_first_p50_ms'))} |")
    return "\n".join(rows)


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in result["runs"]:
        if r.get("round", 0) != 0:
            continue
        xs = [p["turn"] for p in r["per_turn"] if p["ttft_p50_ms"]]
        ys = [p["ttft_p50_ms"] for p in r["per_turn"] if p["ttft_p50_ms"]]
        ax.plot(xs, ys, marker="o", label=r["mode"])
    ax.set_yscale("log")
    ax.set_xlabel("turn")
    ax.set_ylabel("TTFT p50 (ms, log)")
    cfg = result["config"]
    ax.set_title(f"{cfg['chats']} chats x {cfg['turns']} turns, {cfg['first_tokens']}-token first "
                 f"turn, {cfg['slots']} slots")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    global ARGS
    ARGS = parse_args()
    if ARGS.plot_from:
        with open(ARGS.plot_from) as f:
            plot(json.load(f), ARGS.plot)
        return
    modes = [m for m in ARGS.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"chat.py: unknown mode {m}")
    tmp = tempfile.mkdtemp(prefix="chat-bench-")
    try:
        if ARGS.gguf:
            model = gguf = os.path.abspath(ARGS.gguf)
        else:
            model = os.path.abspath(ARGS.model) if ARGS.model else make_model(tmp)
            gguf = make_gguf(model, tmp) if "llama" in modes else None
        rng = random.Random(ARGS.seed)
        texts = [[text_of(rng, ARGS.first_tokens)] +
                 [text_of(rng, ARGS.user_tokens) for _ in range(ARGS.turns - 1)]
                 for _ in range(ARGS.chats)]
        result = {"config": {k: getattr(ARGS, k) for k in (
            "chats", "turns", "first_tokens", "user_tokens", "reply_tokens", "slots", "threads",
            "rounds", "gguf")}, "machine": machine(), "runs": []}
        commit = os.path.join(ARGS.peer, "llama.cpp.commit")
        if os.path.exists(commit):
            result["llama_cpp_commit"] = open(commit).read().strip()
        for rnd in range(ARGS.rounds):
            order = modes if rnd % 2 == 0 else list(reversed(modes))
            for m in order:
                srv = Llama(gguf) if m == "llama" else Wkvm(model, tmp)
                with srv:
                    # warm-up request (page in the weights), not counted
                    w = ChatRun(srv, "plain", 999, ["warm up"], threading.Event())
                    w.start_evt.set()
                    w.run()
                    r = replay(srv, m, texts)
                r["round"] = rnd
                result["runs"].append(r)
                print(f"round {rnd} {m}: wall {r['wall_s']:.2f}s follow-ups reused "
                      f"{r['followups_reused']}/{r['followups']} regenerates "
                      f"{r['regenerates_reused']}/{r['regenerates']} follow-up TTFT p50 "
                      f"{fmt(r['ttft_followup_p50_ms'])} ms regenerate TTFT p50 "
                      f"{fmt(r['ttft_regen_p50_ms'])} ms first-turn TTFT p50 "
                      f"{fmt(r['ttft_first_p50_ms'])} ms errors {r['errors']}", flush=True)
                if ARGS.out:  # (after every run: an interrupted benchmark keeps what it has)
                    with open(ARGS.out, "w") as f:
                        json.dump(result, f, indent=1)
        print(table(result["runs"]))
        if ARGS.out:
            with open(ARGS.out, "w") as f:
                json.dump(result, f, indent=1)
        if ARGS.plot:
            plot(result, ARGS.plot)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
