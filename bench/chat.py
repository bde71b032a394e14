#!/usr/bin/env python3
"""Stateful chat benchmark: a replay of N concurrent chats x T turns with a
growing history through /v1/chat/completions, run twice on the same stack:
reuse on (the parent-token-v1 headers exactly as Open WebUI sends them, so a
follow-up turn feeds only its new tokens into the parked state) and reuse off
(no headers: every turn recomputes the whole prompt, as a stateless server
does).

A real controller + one CPU worker on loopback (tests/integration/wkvm_harness.py),
a demo-sized random-weight model (wkvm-mkmodel defaults: L4 C256 N64 F1024
V4096 bf16) whose seed is chosen so that its greedy reply to the first turn
starts with a space and round-trips through the chat template (a random
model's reply that does not is rejected with template_prefix_mismatch and
recomputed; the hit counters say how many turns really continued).

Each chat: turn 0 is a user message of ~--first-tokens tokens of text; every
later turn adds the previous reply (stripped, as Open WebUI stores it) and a
~--user-tokens user message. Replies are --reply-tokens tokens exactly
(max_tokens + ignore_eos, temperature 0), streamed with include_usage.
Reported per mode: total wall, output tok/s, TTFT p50/p95 per turn index
(client side: request sent -> first chunk with content), prompt and cached
tokens from usage, and from /metrics deltas the parent-token-v1 hits, misses
and rejections by reason; then the ratio reuse-off / reuse-on. A sweep reruns
both modes at longer first turns (--sweep, with --sweep-chats x
--sweep-turns) to show how the ratio grows with the history.

Stdlib only (the optional --plot needs matplotlib; without it an ASCII chart
is printed). See bench/README.md ("Stateful chat: chat.py").

    /usr/bin/python3 bench/chat.py --build build --out /tmp/chat.json
"""
import argparse
import http.client
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import machine, percentile  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("WKVM_BUILD_DIR", os.path.join(SRC, "build")),
                    help="build dir holding controld/ and workerd/ (default $WKVM_BUILD_DIR or ./build)")
    ap.add_argument("--model", help="model dir (default: a demo-sized random model, seed chosen "
                    "so replies round-trip through the template)")
    ap.add_argument("--chats", type=int, default=8, help="concurrent chats (default 8)")
    ap.add_argument("--turns", type=int, default=6, help="turns per chat (default 6)")
    ap.add_argument("--first-tokens", type=int, default=1000,
                    help="tokens of the first user message (default 1000)")
    ap.add_argument("--user-tokens", type=int, default=32,
                    help="tokens of each later user message (default 32)")
    ap.add_argument("--reply-tokens", type=int, default=32,
                    help="tokens of each reply: max_tokens with ignore_eos (default 32)")
    ap.add_argument("--sweep", default="4000,16000",
                    help="first-turn lengths for the ratio sweep, comma list; the main run's "
                    "length is included (default 4000,16000; '' = none)")
    ap.add_argument("--sweep-chats", type=int, default=4, help="chats in sweep runs (default 4)")
    ap.add_argument("--sweep-turns", type=int, default=4, help="turns in sweep runs (default 4)")
    ap.add_argument("--threads", type=int, default=0, help="worker CPU threads (0 = all cores)")
    ap.add_argument("--slots", type=int, default=0,
                    help="worker slots (default 3 per chat of the whole run + 2: a parked "
                    "session, its pre-reply snapshot and a running turn each, so no eviction)")
    ap.add_argument("--seed", type=int, default=1, help="text PRNG seed (default 1)")
    ap.add_argument("--ctl-arg", action="append", default=[], metavar="ARG",
                    help="extra controller argument, repeatable")
    ap.add_argument("--out", help="write JSON results here")
    ap.add_argument("--plot", help="write a PNG of TTFT per turn index (needs matplotlib)")
    ap.add_argument("--plot-from", metavar="JSON",
                    help="only draw --plot from a JSON written by an earlier run, then exit")
    ap.add_argument("--keep-logs", action="store_true", help="keep the temp dir")
    return ap.parse_args()


ARGS = parse_args()
os.environ["WKVM_BUILD_DIR"] = os.path.abspath(ARGS.build)
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
import wkvm_harness  # noqa: E402
from wkvm_harness import MKMODEL, Stack  # noqa: E402

INFER = os.path.join(wkvm_harness.BUILD, "workerd", "wkvm-infer")

WORDS = ("state slot model token worker request session chat turn reply history prompt "
         "memory layer head value key decay kernel batch step cache store blob disk "
         "the a of and to in is was for on that with as it by at from this be are or "
         "an which one all were when we there can been has more if no out so said what "
         "up its about into than them only other new some could time these two may then "
         "first any my now such like our over man me even most made after also did many "
         "before must through back years where much your way well down should because "
         "each just those people how too little good very make world still own see men "
         "work long get here between both life being under never day same another know "
         "while last might us great old year off come since against go came right used "
         "take three river mountain garden letter window table market engine signal").split()


def infer(model, *args, stdin=None):
    return subprocess.run([INFER, "--model", model, "--threads", "0", *args], input=stdin,
                          capture_output=True, text=True, timeout=300, check=True).stdout


def encode_len(model, text):
    return len(infer(model, "--encode", stdin=text).split())


def sentence(rng, n_words):
    w = [rng.choice(WORDS) for _ in range(n_words)]
    w[0] = w[0].capitalize()
    return " ".join(w) + "."


class TextMaker:
    """Deterministic English-like text of about N tokens for a model's tokenizer."""

    def __init__(self, model):
        self.model = model
        probe = " ".join(sentence(random.Random(99), 12) for _ in range(40))
        self.tok_per_char = encode_len(model, probe) / len(probe)

    def make(self, rng, n_tokens):
        chars = int(n_tokens / self.tok_per_char)
        parts, size = [], 0
        while size < chars:
            s = sentence(rng, rng.randint(6, 16))
            parts.append(s)
            size += len(s) + 1
        text = " ".join(parts)
        return text[:chars].rstrip() or "Hello"


def render(msgs):
    """The RWKV World chat template for one-line messages (as test_sessions.py)."""
    out = ""
    for m in msgs:
        out += {"system": "System", "user": "User", "assistant": "Assistant"}[m["role"]]
        out += ": " + m["content"].strip() + "\n\n"
    return out + "Assistant:"


def clean_reply(reply):
    """Whether a reply can round-trip through the template: 'Assistant: ' + strip(reply)."""
    body = reply[1:]
    return (reply.startswith(" ") and body != "" and body == body.strip() and "\n\n" not in body
            and "\r" not in body and "\x00" not in body and "\ufffd" not in reply)


def pick_model(tmpdir, first_text):
    """A demo-shaped random model whose greedy reply to the first turn is clean."""
    tried = []
    for seed in range(1, 60):
        d = os.path.join(tmpdir, f"demo-seed{seed}")
        subprocess.run([MKMODEL, "--out", d, "--seed", str(seed)], check=True,
                       capture_output=True, timeout=120)
        ids = infer(d, "--encode", stdin=render([{"role": "user", "content": first_text}]))
        ids = ids.split()
        gen = infer(d, "--tokens", ",".join(ids), "--generate", str(ARGS.reply_tokens)).split()
        p = subprocess.run([INFER, "--model", d, "--decode"], input=" ".join(gen).encode(),
                           capture_output=True, timeout=60, check=True)
        text = p.stdout.decode("utf-8", "replace")
        tried.append(seed)
        if clean_reply(text):
            return d, seed, tried
        shutil.rmtree(d, ignore_errors=True)
    raise SystemExit("chat.py: no model seed in 1..59 gives a clean first reply")


def scrape_labeled(stack):
    r = stack.get("/metrics", timeout=30)
    out = {}
    for line in r.body.decode().splitlines():
        if not line or line[0] == "#" or 'le="' in line:
            continue
        try:
            key, val = line.rsplit(" ", 1)
            out[key] = float(val)
        except ValueError:
            continue
    return out


def delta_metrics(before, after):
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    out = {
        "hits": d.get("wkvm_parent_bound_continuation_hits_total", 0.0),
        "misses": d.get("wkvm_parent_bound_continuation_misses_total", 0.0),
        "exact_prefix_hits": d.get("wkvm_chat_exact_prefix_reuse_hits_total", 0.0),
        "prefix_tokens_reused": d.get("wkvm_prefix_tokens_reused_total", 0.0),
        "prompt_tokens": d.get("wkvm_prompt_tokens_total", 0.0),
        "generation_tokens": d.get("wkvm_generation_tokens_total", 0.0),
        "step_seconds": d.get("wkvm_step_seconds_sum", 0.0),
        "steps": d.get("wkvm_step_seconds_count", 0.0),
        "rejections": {},
        "sessions_hot_end": after.get('wkvm_sessions{tier="hot"}'),
        "sessions_cold_end": after.get('wkvm_sessions{tier="cold"}'),
    }
    for k, v in d.items():
        m = re.match(r'wkvm_parent_bound_continuation_rejections_total\{reason="([^"]+)"\}', k)
        if m and v:
            out["rejections"][m.group(1)] = v
    out["rejections_total"] = sum(out["rejections"].values())
    return out


class ChatRun(threading.Thread):
    """One chat: T turns back to back, streaming, history grows."""

    def __init__(self, port, model_id, idx, tag, reuse, texts, start_evt):
        super().__init__(daemon=True)
        self.port, self.model_id, self.idx, self.reuse = port, model_id, idx, reuse
        self.chat_id = f"{tag}-chat-{idx}"
        self.texts = texts
        self.start_evt = start_evt
        self.msgs = []
        self.last_assistant = ""
        self.records = []
        self.error = None

    def headers(self, aid, uid, parent):
        # Exactly test_sessions.py's Chat.headers().
        return {"X-OpenWebUI-User-Id": "u1", "X-OpenWebUI-Chat-Id": self.chat_id,
                "X-WKVM-Stateful-Chat": "parent-token-v1", "X-WKVM-Assistant-Message-ID": aid,
                "X-WKVM-User-Message-ID": uid, "X-WKVM-Parent-Message-ID": parent}

    def turn(self, k, text):
        aid, uid = f"{self.chat_id}-a{k + 1}", f"{self.chat_id}-u{k + 1}"
        msgs = self.msgs + [{"role": "user", "content": text}]
        body = {"model": self.model_id, "messages": msgs, "max_tokens": ARGS.reply_tokens,
                "ignore_eos": True, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        hdrs = {"Content-Type": "application/json"}
        if self.reuse:
            hdrs.update(self.headers(aid, uid, self.last_assistant))
        rec = {"turn": k, "ok": False}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            t0 = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                         headers=hdrs)
            r = conn.getresponse()
            if r.status != 200:
                raise RuntimeError(f"{self.chat_id} turn {k}: HTTP {r.status}: {r.read()[:300]!r}")
            reply, first, usage, done = [], None, None, False
            while True:
                line = r.readline()
                if not line:
                    break
                if not line.startswith(b"data: "):
                    continue
                p = line[6:].strip()
                if p == b"[DONE]":
                    done = True
                    break
                ev = json.loads(p)
                if "error" in ev:
                    raise RuntimeError(f"stream error: {ev['error']}")
                if ev.get("usage"):
                    usage = ev["usage"]
                for ch in ev.get("choices") or []:
                    c = (ch.get("delta") or {}).get("content")
                    if c:
                        if first is None:
                            first = time.perf_counter()
                        reply.append(c)
            t1 = time.perf_counter()
            if not done or usage is None:
                raise RuntimeError("stream ended without usage/[DONE]")
            text_out = "".join(reply)
            rec.update(ok=True, t_send=t0, ttft=(first or t1) - t0, latency=t1 - t0,
                       prompt_tokens=usage["prompt_tokens"],
                       cached_tokens=(usage.get("prompt_tokens_details") or {}).get(
                           "cached_tokens", 0),
                       completion_tokens=usage["completion_tokens"], reply=text_out,
                       clean=clean_reply(text_out))
            self.msgs = msgs + [{"role": "assistant", "content": text_out.strip()}]
            self.last_assistant = aid
        finally:
            conn.close()
            self.records.append(rec)

    def run(self):
        self.start_evt.wait()
        try:
            for k, text in enumerate(self.texts):
                self.turn(k, text)
        except Exception as e:  # noqa: BLE001 - reported
            self.error = str(e)


def replay(stack, model_id, tag, reuse, texts):
    before = scrape_labeled(stack)
    start = threading.Event()
    runs = [ChatRun(stack.port, model_id, i, tag, reuse, texts[i], start)
            for i in range(len(texts))]
    for r in runs:
        r.start()
    t0 = time.perf_counter()
    start.set()
    for r in runs:
        r.join()
    wall = time.perf_counter() - t0
    after = scrape_labeled(stack)
    errors = [r.error for r in runs if r.error]
    recs = [x for r in runs for x in r.records if x["ok"]]
    n_turns = max(len(t) for t in texts)
    per_turn = []
    for k in range(n_turns):
        ks = [x for x in recs if x["turn"] == k]
        tt = [x["ttft"] for x in ks]
        per_turn.append({
            "turn": k, "n": len(ks),
            "ttft_p50_ms": None if not tt else percentile(tt, 50) * 1e3,
            "ttft_p95_ms": None if not tt else percentile(tt, 95) * 1e3,
            "prompt_tokens_mean": None if not ks else sum(x["prompt_tokens"] for x in ks) / len(ks),
            "cached_tokens_mean": None if not ks else sum(x["cached_tokens"] for x in ks) / len(ks),
            "continued": sum(1 for x in ks if x["cached_tokens"] > 0)})
    out_tok = sum(x["completion_tokens"] for x in recs)
    m = delta_metrics(before, after)
    follow = [x for x in recs if x["turn"] > 0]
    return {
        "mode": "reuse on" if reuse else "reuse off", "chats": len(texts), "turns": n_turns,
        "wall_s": wall, "requests_ok": len(recs), "errors": errors[:5],
        "output_tokens": out_tok, "output_tok_s": out_tok / wall if wall > 0 else None,
        "prompt_tokens_sum": sum(x["prompt_tokens"] for x in recs),
        "cached_tokens_sum": sum(x["cached_tokens"] for x in recs),
        "computed_prompt_tokens": sum(x["prompt_tokens"] - x["cached_tokens"] for x in recs),
        "first_turn_prompt_tokens_mean": per_turn[0]["prompt_tokens_mean"],
        "followups": len(follow), "followups_continued": sum(1 for x in follow
                                                            if x["cached_tokens"] > 0),
        "clean_replies": sum(1 for x in recs if x["clean"]),
        "ttft_followup_p50_ms": percentile([x["ttft"] for x in follow], 50) * 1e3
        if follow else None,
        "max_latency_s": max((x["latency"] for x in recs), default=None),
        "stalled_turns_over_5s": [(x["turn"], round(x["latency"], 2)) for x in recs
                                  if x["latency"] > 5.0 and x["ttft"] > 5.0],
        "per_turn": per_turn, "metrics": m, "loadavg_end": list(os.getloadavg()),
        "replies": [[x["reply"] for x in r.records if x["ok"]] for r in runs],
        "requests": [{"chat": r.idx, "turn": x["turn"], "t_send_s": round(x["t_send"] - t0, 4),
                      "ttft_ms": round(x["ttft"] * 1e3, 2),
                      "latency_ms": round(x["latency"] * 1e3, 2),
                      "prompt_tokens": x["prompt_tokens"], "cached_tokens": x["cached_tokens"],
                      "clean_reply": x["clean"]} for r in runs for x in r.records if x["ok"]],
    }


def make_texts(tm, n_chats, n_turns, first_tokens, seed):
    texts = []
    for i in range(n_chats):
        rng = random.Random(seed * 7919 + i)
        t = [tm.make(rng, first_tokens)]
        for k in range(1, n_turns):
            t.append(tm.make(rng, ARGS.user_tokens))
        texts.append(t)
    return texts


def fmt(x, nd=1):
    return "-" if x is None else f"{x:,.{nd}f}"


def main_table(on, off):
    rows = ["| turn | prompt tok (mean) | reused tok, on (mean) | TTFT p50 on ms | TTFT p50 off ms "
            "| TTFT p95 on ms | TTFT p95 off ms | p50 off/on |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for a, b in zip(on["per_turn"], off["per_turn"]):
        ratio = (b["ttft_p50_ms"] / a["ttft_p50_ms"]) if a["ttft_p50_ms"] and b["ttft_p50_ms"] \
            else None
        rows.append(f"| {a['turn']} | {fmt(b['prompt_tokens_mean'], 0)} | "
                    f"{fmt(a['cached_tokens_mean'], 0)} | {fmt(a['ttft_p50_ms'])} | "
                    f"{fmt(b['ttft_p50_ms'])} | {fmt(a['ttft_p95_ms'])} | {fmt(b['ttft_p95_ms'])} "
                    f"| {fmt(ratio, 2)} |")
    return "\n".join(rows)


def summary_table(pairs):
    rows = ["| first turn tok | chats x turns | mode | wall s | out tok/s | computed prompt tok | "
            "follow-ups continued | hits | rejections | clean replies | TTFT p50 follow-ups ms | "
            "wall off/on | TTFT follow-ups off/on | load avg |",
            "|---:|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for p in pairs:
        on, off = p["on"], p["off"]
        for r in (on, off):
            rej = ", ".join(f"{k} {int(v)}" for k, v in sorted(r["metrics"]["rejections"].items())) \
                or "0"
            ratio = fmt(off["wall_s"] / on["wall_s"], 2) if r is on else ""
            tratio = fmt(p["ttft_followup_ratio_off_on"], 1) if r is on else ""
            rows.append(f"| {fmt(r['first_turn_prompt_tokens_mean'], 0)} | {r['chats']} x "
                        f"{r['turns']} | {r['mode']} | {fmt(r['wall_s'], 2)} | "
                        f"{fmt(r['output_tok_s'])} | {r['computed_prompt_tokens']:,} | "
                        f"{r['followups_continued']}/{r['followups']} | "
                        f"{int(r['metrics']['hits'])} | {rej} | "
                        f"{r['clean_replies']}/{r['requests_ok']} | "
                        f"{fmt(r['ttft_followup_p50_ms'])} | {ratio} | {tratio} | "
                        f"{r['loadavg_end'][0]:.1f} |")
    return "\n".join(rows)


def ascii_chart(on, off, width=50):
    vals = [x["ttft_p50_ms"] or 0 for x in on["per_turn"] + off["per_turn"]]
    top = max(vals) or 1.0
    lines = ["TTFT p50 per turn index (ms); # = reuse on, . = reuse off"]
    for a, b in zip(on["per_turn"], off["per_turn"]):
        na = int(round((a["ttft_p50_ms"] or 0) / top * width))
        nb = int(round((b["ttft_p50_ms"] or 0) / top * width))
        lines.append(f"turn {a['turn']:>2} on  |{'#' * na:<{width}}| {fmt(a['ttft_p50_ms'])}")
        lines.append(f"        off |{'.' * nb:<{width}}| {fmt(b['ttft_p50_ms'])}")
    return "\n".join(lines)


def plot(result, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot: matplotlib is not importable by this Python; run again with "
              f"--plot-from JSON under a Python that has it. ASCII instead:\n", file=sys.stderr)
        print(ascii_chart(result["main"]["on"], result["main"]["off"]))
        return False
    on, off = result["main"]["on"], result["main"]["off"]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for r, style, lab in ((off, "o--", "reuse off (full prompt each turn)"),
                          (on, "s-", "reuse on (parent-token-v1)")):
        xs = [x["turn"] for x in r["per_turn"]]
        p50 = [x["ttft_p50_ms"] for x in r["per_turn"]]
        p95 = [x["ttft_p95_ms"] for x in r["per_turn"]]
        line, = ax.plot(xs, p50, style, label=lab + " p50")
        ax.fill_between(xs, p50, p95, color=line.get_color(), alpha=0.15)
    ax.set_xlabel("turn index (0 = first turn)")
    ax.set_ylabel("TTFT ms (line p50, band to p95)")
    m = result["machine"]
    ax.set_title(f"wkvm chat replay: {on['chats']} chats x {on['turns']} turns, first turn "
                 f"~{on['first_turn_prompt_tokens_mean']:.0f} tok\n{m['cpu']}, {m['cores']} cores, "
                 f"load {m['loadavg_start'][0]:.1f}", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}")
    return True


def main():
    if ARGS.plot_from:
        with open(ARGS.plot_from) as f:
            res = json.load(f)
        if not ARGS.plot:
            sys.exit("chat.py: --plot-from needs --plot PNG")
        return 0 if plot(res, ARGS.plot) else 1
    for exe in (wkvm_harness.CONTROLD, wkvm_harness.WORKERD, MKMODEL, INFER):
        if not os.access(exe, os.X_OK):
            sys.exit(f"chat.py: {exe} not built (ninja -C {ARGS.build})")
    t_start = time.time()
    mach = machine()
    tmpdir = tempfile.mkdtemp(prefix="wkvm-bench-chat-")
    result = {"machine": mach}
    stack = None
    try:
        model, seed, tried = ARGS.model, None, []
        if model is None:
            probe_model = os.path.join(tmpdir, "probe")
            subprocess.run([MKMODEL, "--out", probe_model], check=True, capture_output=True,
                           timeout=120)
            tm = TextMaker(probe_model)
            first = make_texts(tm, 1, 1, ARGS.first_tokens, ARGS.seed)[0][0]
            model, seed, tried = pick_model(tmpdir, first)
        model = os.path.abspath(model)
        tm = TextMaker(model)
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
        sweep = [int(x) for x in ARGS.sweep.split(",") if x.strip()]
        n_sweep = len(set([ARGS.first_tokens] + sweep)) if sweep else 0
        slots = ARGS.slots or 3 * (ARGS.chats + n_sweep * ARGS.sweep_chats) + 2
        data = os.path.join(tmpdir, "data")
        os.makedirs(data)
        stack = Stack(model=model, slots=slots, data=data,
                      extra_ctl=["--http-threads", str(max(32, 4 * ARGS.chats + 16)),
                                 "--heartbeat-ms", "1000", "--log-level", "info"] + ARGS.ctl_arg)
        result["config"] = {
            "model": ARGS.model or f"wkvm-mkmodel defaults (L4 C256 N64 F1024 V4096 bf16) "
                                   f"--seed {seed} (random weights)",
            "model_seeds_tried": tried,
            "model_config": {k: cfg.get(k) for k in ("num_hidden_layers", "hidden_size",
                                                     "head_dim", "intermediate_size",
                                                     "vocab_size", "torch_dtype")},
            "chats": ARGS.chats, "turns": ARGS.turns, "first_tokens": ARGS.first_tokens,
            "user_tokens": ARGS.user_tokens, "reply_tokens": ARGS.reply_tokens,
            "sweep": sweep, "sweep_chats": ARGS.sweep_chats, "sweep_turns": ARGS.sweep_turns,
            "slots": slots, "threads": ARGS.threads, "controller_args": ARGS.ctl_arg,
            "command": " ".join(["/usr/bin/python3" if sys.executable == "/usr/bin/python3"
                                 else sys.executable] + sys.argv)}
        stack.start_controller()
        stack.start_worker("w0", extra=["--threads", str(ARGS.threads)])
        stack.wait(lambda: stack.get("/ready").status == 200, "ready", timeout=600)
        model_id = stack.get("/v1/models").json()["data"][0]["id"]
        print(f"# wkvm chat bench: {mach['cpu']}, {mach['cores']} cores, load "
              f"{mach['loadavg_start'][0]:.2f}; model seed {seed}; {ARGS.chats} chats x "
              f"{ARGS.turns} turns, first turn ~{ARGS.first_tokens} tok, user {ARGS.user_tokens}"
              f" tok, reply {ARGS.reply_tokens} tok", flush=True)
        # Warm-up (not timed): one short chat request.
        r = stack.post("/v1/chat/completions", body={
            "model": model_id, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2, "ignore_eos": True}, timeout=120)
        if r.status != 200:
            raise RuntimeError(f"warm-up failed: {r.status} {r.body[:300]!r}")

        def pair(tag, n_chats, n_turns, first_tokens):
            texts = make_texts(tm, n_chats, n_turns, first_tokens, ARGS.seed)
            on = replay(stack, model_id, f"{tag}-on", True, texts)
            off = replay(stack, model_id, f"{tag}-off", False, texts)
            same = sum(1 for a, b in zip(on["replies"], off["replies"])
                       for x, y in zip(a, b) if x == y)
            total = sum(min(len(a), len(b)) for a, b in zip(on["replies"], off["replies"]))
            for r_ in (on, off):
                if r_["errors"]:
                    raise RuntimeError(f"{tag} {r_['mode']}: {r_['errors']}")
            p = {"first_tokens_target": first_tokens, "on": on, "off": off,
                 "replies_identical": f"{same}/{total}",
                 "wall_ratio_off_on": off["wall_s"] / on["wall_s"],
                 "ttft_followup_ratio_off_on":
                 (off["ttft_followup_p50_ms"] / on["ttft_followup_p50_ms"])
                 if on["ttft_followup_p50_ms"] else None}
            print(f"  {tag}: first turn ~{on['first_turn_prompt_tokens_mean']:.0f} tok, "
                  f"{n_chats}x{n_turns}: on {on['wall_s']:.2f} s, off {off['wall_s']:.2f} s "
                  f"(x{p['wall_ratio_off_on']:.2f}); hits {int(on['metrics']['hits'])}, "
                  f"rejections {on['metrics']['rejections'] or 0}, replies identical "
                  f"{p['replies_identical']}; load {os.getloadavg()[0]:.1f}", flush=True)
            for r_ in (on, off):
                if r_["stalled_turns_over_5s"]:
                    print(f"  WARNING {tag} {r_['mode']}: turns whose first token took over 5 s "
                          f"(turn, seconds): {r_['stalled_turns_over_5s']}", flush=True)
            return p

        result["main"] = pair("main", ARGS.chats, ARGS.turns, ARGS.first_tokens)
        result["sweep"] = []
        for n in (sorted(set([ARGS.first_tokens] + sweep)) if sweep else []):
            result["sweep"].append(pair(f"sweep{n}", ARGS.sweep_chats, ARGS.sweep_turns, n))
        for p in stack.procs:
            if p.poll() is not None:
                raise RuntimeError(f"a daemon exited during the run (rc {p.returncode})")
        with open(os.path.join(data, "controld.log"), "rb") as f:
            lines = f.read().decode(errors="replace").splitlines()
        result["controller_warnings"] = [ln for ln in lines if " warn " in ln or " error " in ln][:20]
    except BaseException:
        if stack is not None:
            print(stack.tail(), file=sys.stderr)
        raise
    finally:
        if stack is not None:
            stack.stop()
        if ARGS.keep_logs:
            print(f"kept {tmpdir}", file=sys.stderr)
        else:
            shutil.rmtree(tmpdir, ignore_errors=True)
    result["loadavg_end"] = list(os.getloadavg())
    result["wall_s"] = time.time() - t_start
    on, off = result["main"]["on"], result["main"]["off"]
    print(f"\nMain run: {on['chats']} chats x {on['turns']} turns (TTFT per turn index):\n")
    print(main_table(on, off))
    print("\nTotals, and the ratio against the first turn's length:\n")
    print(summary_table([result["main"]] + result["sweep"]))
    print()
    print(ascii_chart(on, off))
    print(f"\nload average: start {mach['loadavg_start'][0]:.2f}, end "
          f"{result['loadavg_end'][0]:.2f}; wall {result['wall_s']:.0f} s")
    if ARGS.out:
        with open(ARGS.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        print(f"\nwrote {ARGS.out}")
    if ARGS.plot:
        plot(result, ARGS.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
