#!/usr/bin/env python3
"""An agent-like loop: TURNS turns, each adding a ~TOOL-token "tool output" as a
new user item and generating MAX_TOKENS tokens at temperature 0, streamed, as

  responses  wkvm: POST /v1/responses with previous_response_id (only the new item sent)
  chat       wkvm: POST /v1/chat/completions resending the whole conversation
             (wkvm's automatic reuse finds the previous reply's checkpoint)
  chat-nc    wkvm: the same with "cache": false (a full recompute every turn:
             what an engine without state reuse pays)
  llama      llama.cpp's llama-server with its defaults (4 slots "auto" with a unified KV
             cache, its host-memory prompt cache): the whole conversation resent to its
             /v1/chat/completions, cache_prompt at its default (on)
  llama-npN  the same with -np N (N slots of the context each)

--convs N runs N such loops at once (a thread each, started --stagger s apart, so
their turns interleave: an agent server's load, where one conversation's state
does not stay in a slot until its next turn), each with its own tool outputs.
Reports per turn (the median over the conversations, and the largest TTFT) the
request bytes sent, the prompt tokens computed (input - cached; llama-server's
timings.prompt_n), the time to the first text event (TTFT) and the total, the
wall time, the load average and (wkvm modes) the worker's CPU seconds (utime +
stime, in all and per turn; other load moves it less than TTFT, but its pool's
spin-waits and shared caches still do) of each mode, and (--svg) a plot of
TTFT and bytes per turn written as SVG by hand (no plotting library needed).

The RWKV-7 comparison: wkvm-mkmodel --vocab-file rwkv_vocab_v20230424.txt writes
the HF layout that wkvm reads (--model) and llama.cpp's convert_hf_to_gguf.py
converts (bench/gguf-convert.py) for --gguf; a World-style Jinja template file
rendered by both keeps the prompts the same (docs/PERFORMANCE.md has it).

Default model: a random RWKV-7 written by wkvm-mkmodel (raw byte tokens, the
World template; wkvm modes only). For the peer comparison give the same
weights to both engines: --model DIR (a directory holding a GGUF that
llama.cpp's converter wrote, which wkvm reads) and --gguf that file, and a
chat template file both render (--chat-template: wkvm's --chat-template,
llama-server's --jinja --chat-template-file). Stdlib only.

  bench/responses_loop.py [--turns 20] [--tool 300] [--max-tokens 16] [--threads 1]
                          [--build build] [--model DIR --gguf F.gguf
                          --chat-template T.jinja --llama-server BIN]
                          [--convs 8] [--slots 4] [--max-wall S]
                          [--modes responses,chat,chat-nc,llama,llama-np4] [--json OUT] [--svg OUT]
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))


def sse(url, body):
    """POSTs body, reads the SSE stream; returns (ttft_s, total_s, last, usage, bytes, timings)."""
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft = None
    last = None
    usage = None
    timings = None
    with urllib.request.urlopen(req, timeout=1800) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            t = ev.get("type", "")
            if ttft is None and (t in ("response.output_text.delta",
                                       "response.reasoning_text.delta") or
                                 (ev.get("choices") and
                                  ((ev["choices"][0].get("delta") or {}).get("content") or
                                   (ev["choices"][0].get("delta") or {}).get(
                                       "reasoning_content")))):
                ttft = time.perf_counter() - t0
            timings = ev.get("timings") or timings
            if t in ("response.completed", "response.incomplete"):
                last = ev["response"]
                usage = last["usage"]
            elif ev.get("usage"):
                usage = ev["usage"]
            if ev.get("choices"):
                last = last or {"text": ""}
                last["text"] = last.get("text", "") + \
                    ((ev["choices"][0].get("delta") or {}).get("content") or "")
    total = time.perf_counter() - t0
    return ttft if ttft is not None else total, total, last, usage, len(data), timings


def tool_output(turn, n, conv=0):
    """~n bytes of text: lower-case 'words' (with a BPE vocab a few hundred tokens);
    conversation conv gets other words (no two conversations share a tool output)."""
    words, i = [], 0
    while sum(len(w) + 1 for w in words) < n:
        w = "".join(chr(97 + (turn * 7 + i * 3 + j * 5 + conv * (11 + j)) % 26)
                    for j in range(3 + ((i + conv) % 5)))
        words.append(w)
        i += 1
    head = f"tool result {turn}: " if conv == 0 else f"[conversation {conv}] tool result {turn}: "
    return (head + " ".join(words))[:n]


SYSTEM = "You are an agent."
DEADLINE = [None]  # perf_counter() after which no conversation starts another turn


def run_responses(url, mid, turns, tool, maxt, conv=0):
    rows, prev = [], None
    for t in range(turns):
        if DEADLINE[0] is not None and time.perf_counter() > DEADLINE[0]:
            break
        body = {"model": mid, "input": tool_output(t, tool, conv), "max_output_tokens": maxt,
                "temperature": 0, "stream": True, "instructions": SYSTEM}
        if prev:
            body["previous_response_id"] = prev
        ttft, total, resp, u, nbytes, _ = sse(url + "/v1/responses", body)
        prev = resp["id"]
        computed = u["input_tokens"] - u["input_tokens_details"]["cached_tokens"]
        rows.append((t + 1, nbytes, u["input_tokens"], computed, ttft, total))
    return rows


def run_chat(url, mid, turns, tool, maxt, cache, llama=False, conv=0):
    rows, msgs = [], [{"role": "system", "content": SYSTEM}]
    for t in range(turns):
        if DEADLINE[0] is not None and time.perf_counter() > DEADLINE[0]:
            break
        msgs.append({"role": "user", "content": tool_output(t, tool, conv)})
        body = {"model": mid, "messages": msgs, "max_tokens": maxt, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        if not llama:
            body["cache"] = cache
        ttft, total, last, u, nbytes, tm = sse(url + "/v1/chat/completions", body)
        msgs.append({"role": "assistant", "content": last["text"]})
        if llama and tm is not None and "prompt_n" in tm:
            computed = tm["prompt_n"]
        else:
            cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            computed = u["prompt_tokens"] - cached
        rows.append((t + 1, nbytes, u["prompt_tokens"], computed, ttft, total))
    return rows


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """llama-server on the GGUF and the chat template file (--jinja). np None: its
    defaults (slots "auto" = 4 with a unified KV cache, the model's training context,
    the host-memory prompt cache); np N: -np N with ctx tokens per slot."""

    def __init__(self, binary, gguf, template, threads, ctx, np=1):
        self.args = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", "0", "-t",
                     str(threads), "-tb", str(threads), "--alias", "model", "--no-webui"]
        if np is not None:
            self.args += ["-np", str(np), "-c", str(ctx * np)]
        if template:
            self.args += ["--jinja", "--chat-template-file", template]

    def __enter__(self):
        self.port = free_port()
        self.args[self.args.index("--port") + 1] = str(self.port)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log",
                                               delete=False)
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT)
        t0 = time.time()
        while time.time() - t0 < 600:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("llama-server exited; see " + self.log.name)
            time.sleep(0.5)
        raise RuntimeError("llama-server did not become healthy; see " + self.log.name)

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


COLORS = {"responses": "#1f77b4", "chat": "#2ca02c", "chat-nc": "#7f7f7f", "llama": "#d62728",
          "llama-np1": "#d62728", "llama-np4": "#ff7f0e"}
LABELS = {"responses": "wkvm /v1/responses + previous_response_id",
          "chat": "wkvm /v1/chat/completions (resent, reuse)",
          "chat-nc": "wkvm chat, cache off (full recompute)",
          "llama": "llama-server defaults, chat resent",
          "llama-np1": "llama-server -np 1, chat resent",
          "llama-np4": "llama-server -np 4, chat resent"}


def llama_np(mode):
    """'llama' -> None (llama-server's defaults); 'llama-npN' -> N."""
    return None if mode == "llama" else int(mode[len("llama-np"):])


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


MAX_WALL = [0.0]  # --max-wall


def checkpoint_counts(s):
    """wkvm_checkpoints_total by kind (boundary, prompt, reply, interval) from /metrics, and
    the scheduler's time-to-first-token sum and count (keys "ttft_sum", "ttft_count")."""
    r = s.get("/metrics")
    counts = {}
    if r.status != 200:
        return counts
    for ln in r.body.decode("utf-8", "replace").splitlines():
        if ln.startswith('wkvm_checkpoints_total{kind="'):
            kind = ln.split('"')[1]
            counts[kind] = counts.get(kind, 0) + float(ln.split()[-1])
        else:
            for metric, key in (("wkvm_time_to_first_token_seconds", "ttft"),
                                ("wkvm_step_seconds", "step"),
                                ("wkvm_step_backend_seconds", "backend")):
                for part in ("sum", "count"):
                    if ln.startswith(f"{metric}_{part} ") or ln.startswith(f"{metric}_{part}{{"):
                        counts[f"{key}_{part}"] = counts.get(f"{key}_{part}", 0) + \
                            float(ln.split()[-1])
    return counts


def cpu_seconds(pid):
    """utime + stime of process pid in seconds (/proc/PID/stat), None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def minor_faults(pid):
    """Minor page faults of process pid so far (/proc/PID/stat), None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[7])
    except (OSError, IndexError, ValueError):
        return None


def run_convs(convs, stagger, fn):
    """fn(conv) -> rows for conv in 0..convs-1, each in its own thread, started stagger
    seconds apart (the loops then interleave). Returns ([rows per conv], wall seconds)."""
    import threading
    res, errs = [None] * convs, []

    def one(c):
        try:
            res[c] = fn(c)
        except Exception as e:  # noqa: BLE001 (reported below)
            errs.append(f"conversation {c}: {e!r}")
    t0 = time.perf_counter()
    DEADLINE[0] = t0 + MAX_WALL[0] if MAX_WALL[0] else None
    th = []
    for c in range(convs):
        t = threading.Thread(target=one, args=(c,))
        t.start()
        th.append(t)
        time.sleep(stagger)
    for t in th:
        t.join()
    if errs:
        raise RuntimeError("; ".join(errs))
    return res, time.perf_counter() - t0


def merge_rows(per_conv):
    """Per turn: the median over conversations of each column (turn, bytes, input,
    computed, ttft, total), and the max TTFT as a 7th column."""
    rows = []
    for i in range(min(len(r) for r in per_conv)):
        col = [r[i] for r in per_conv]
        rows.append((i + 1,) + tuple(median([c[k] for c in col]) for k in range(1, 6)) +
                    (max(c[4] for c in col),))
    return rows


def svg_panel(out, x0, y0, w, h, title, ylabel, series, turns, log=False):
    """One line chart: series {mode: [(turn, value)]} in the box (x0, y0, w, h)."""
    import math
    vals = [v for pts in series.values() for _, v in pts if v > 0]
    top = max(vals) if vals else 1.0
    lo = min(vals) if vals else 1.0
    if log:
        lo_e, hi_e = math.floor(math.log10(lo)), math.ceil(math.log10(top))
        hi_e = max(hi_e, lo_e + 1)

        def fy(v):
            return y0 + h - (math.log10(max(v, 10 ** lo_e)) - lo_e) / (hi_e - lo_e) * h
        ticks = [10 ** e for e in range(lo_e, hi_e + 1)]
    else:
        step = 10 ** math.floor(math.log10(top)) if top > 0 else 1
        hi = math.ceil(top / step) * step

        def fy(v):
            return y0 + h - v / hi * h
        ticks = [i * step for i in range(int(hi / step) + 1)]

    def fx(t):
        return x0 + (t - 1) / max(turns - 1, 1) * w
    out.append(f'<text x="{x0 + w / 2}" y="{y0 - 10}" text-anchor="middle" '
               f'font-size="14">{title}</text>')
    out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#000"/>')
    for tv in ticks:
        y = fy(tv)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + w}" y2="{y:.1f}" stroke="#ddd"/>')
        lab = f"{tv:g}"
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end" '
                   f'font-size="11">{lab}</text>')
    for t in range(1, turns + 1):
        if t == 1 or t % 5 == 0:
            out.append(f'<text x="{fx(t):.1f}" y="{y0 + h + 16}" text-anchor="middle" '
                       f'font-size="11">{t}</text>')
    out.append(f'<text x="{x0 + w / 2}" y="{y0 + h + 34}" text-anchor="middle" '
               f'font-size="12">turn</text>')
    out.append(f'<text x="{x0 - 48}" y="{y0 + h / 2}" text-anchor="middle" font-size="12" '
               f'transform="rotate(-90 {x0 - 48} {y0 + h / 2})">{ylabel}</text>')
    for mode, pts in series.items():
        path = " ".join(f"{fx(t):.1f},{fy(v):.1f}" for t, v in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{COLORS.get(mode, "#000")}" '
                   f'stroke-width="2"/>')


def write_svg(path, out, title):
    """TTFT (log scale) and bytes sent per turn, each mode a line."""
    turns = max(len(v["rows"]) for v in out.values())
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="980" height="430" '
             'font-family="sans-serif">', '<rect width="980" height="430" fill="#fff"/>',
             f'<text x="490" y="22" text-anchor="middle" font-size="15">{title}</text>']
    ttft = {m: [(r[0], r[4] * 1e3) for r in v["rows"]] for m, v in out.items()}
    sent = {m: [(r[0], r[1] / 1024) for r in v["rows"]] for m, v in out.items()}
    svg_panel(parts, 80, 60, 380, 260, "time to first token (ms, log)", "ms", ttft, turns,
              log=True)
    svg_panel(parts, 570, 60, 380, 260, "request bytes sent (KiB)", "KiB", sent, turns)
    y = 380
    for i, m in enumerate(out):
        x = 80 + (i % 2) * 460
        yy = y + (i // 2) * 20
        parts.append(f'<line x1="{x}" y1="{yy}" x2="{x + 24}" y2="{yy}" '
                     f'stroke="{COLORS.get(m, "#000")}" stroke-width="3"/>')
        parts.append(f'<text x="{x + 30}" y="{yy + 4}" font-size="12">{LABELS.get(m, m)} '
                     f'(wall {out[m]["wall_s"]:.1f} s)</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--tool", type=int, default=300, help="bytes of each tool output")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--embd", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--build", default=None)
    ap.add_argument("--model", default=None, help="wkvm model dir (default: wkvm-mkmodel's)")
    ap.add_argument("--gguf", default=None, help="the same weights for llama-server")
    ap.add_argument("--chat-template", default=None, help="template file for both engines")
    ap.add_argument("--llama-server", default="/work/peer/llama.cpp/build/bin/llama-server")
    ap.add_argument("--modes", default=None,
                    help="comma list (default: responses,chat,chat-nc[,llama-np1 with --gguf]);"
                         " llama = llama-server's defaults, llama-npN = -np N")
    ap.add_argument("--convs", type=int, default=1,
                    help="concurrent conversations (threads), each its own agent loop")
    ap.add_argument("--stagger", type=float, default=0.25,
                    help="seconds between the conversations' starts")
    ap.add_argument("--slots", type=int, default=4, help="wkvm worker slots")
    ap.add_argument("--max-wall", type=float, default=0,
                    help="seconds per mode after which no conversation starts another turn "
                         "(0: none; the tables then end at the last turn all completed)")
    ap.add_argument("--ctl-arg", action="append", default=[], metavar="ARG",
                    help="extra wkvm-controld argument (repeat), e.g. --ctl-arg=--prefill-chunk=512")
    ap.add_argument("--worker-arg", action="append", default=[], metavar="ARG",
                    help="extra wkvm-workerd argument (repeat), e.g. --worker-arg=--cpu-matmul=bf16")
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--svg", default=None, help="write the plot here")
    a = ap.parse_args()
    MAX_WALL[0] = a.max_wall
    modes = (a.modes.split(",") if a.modes else
             ["responses", "chat", "chat-nc"] + (["llama-np1"] if a.gguf else []))
    if a.build:
        os.environ["WKVM_BUILD_DIR"] = os.path.abspath(a.build)
    import wkvm_harness as h  # noqa: E402 (reads WKVM_BUILD_DIR)
    out = {}

    def report(name, per_conv, wall, cpu=None, ckpts=None, faults=None):
        rows = merge_rows(per_conv)
        out[name] = {"rows": rows, "wall_s": wall, "convs": per_conv,
                     "loadavg_end": os.getloadavg()}
        cpu_note = ""
        if ckpts and ckpts.get("ttft_count"):
            # the scheduler's own TTFT (admission request to first token: after the request
            # was parsed, rendered, tokenized and planned; the resume's copy included)
            out[name]["server_ttft_mean_s"] = ckpts["ttft_sum"] / ckpts["ttft_count"]
            cpu_note += f", scheduler TTFT mean {ckpts['ttft_sum'] / ckpts['ttft_count'] * 1e3:.1f} ms"
        if ckpts and ckpts.get("step_count") and ckpts.get("backend_count"):
            # steps to the worker: their count, round trip and the backend's share of it
            turns = sum(len(c) for c in per_conv)
            out[name]["steps"] = ckpts["step_count"]
            out[name]["step_mean_s"] = ckpts["step_sum"] / ckpts["step_count"]
            out[name]["step_backend_mean_s"] = ckpts["backend_sum"] / ckpts["backend_count"]
            cpu_note += (f", {ckpts['step_count'] / max(turns, 1):.1f} steps/turn of "
                         f"{out[name]['step_mean_s'] * 1e3:.1f} ms (backend "
                         f"{out[name]['step_backend_mean_s'] * 1e3:.1f} ms)")
        ckpts = {k: v for k, v in (ckpts or {}).items()
                 if not k.startswith(("ttft_", "step_", "backend_"))}
        if ckpts:
            # checkpoints the controller took over the mode, by kind (each a state-image copy)
            out[name]["checkpoints"] = ckpts
            turns = sum(len(c) for c in per_conv)
            cpu_note += ", checkpoints " + " ".join(
                f"{k} {v:.0f}" for k, v in sorted(ckpts.items())) + \
                (f" ({sum(ckpts.values()) / turns:.1f}/turn)" if turns else "")
        if cpu is not None:
            # the worker's CPU seconds over the mode (load-insensitive, unlike TTFT)
            turns = sum(len(c) for c in per_conv)
            out[name]["worker_cpu_s"] = cpu
            out[name]["worker_cpu_s_per_turn"] = cpu / turns if turns else None
            cpu_note = (f", worker CPU {cpu:.2f}s"
                        + (f" ({cpu / turns * 1e3:.0f} ms/turn)" if turns else "") + cpu_note)
            if faults is not None and turns:
                # fresh pages the worker touched (a state-image copy into new memory faults
                # in every page of it)
                out[name]["worker_minor_faults_per_turn"] = faults / turns
                cpu_note += f", {faults / turns:.0f} minor page faults/turn"
        print(f"== {name}: wall {wall:.2f}s, {len(per_conv)} conversation(s), "
              f"load average {os.getloadavg()[0]:.1f}{cpu_note}", flush=True)
        print("turn  bytes_sent  input_tokens  computed  ttft_ms  total_ms  (medians)  "
              "ttft_max_ms")
        for t, nb, it, comp, ttft, total, tmax in rows:
            print(f"{t:4d}  {nb:10.0f}  {it:12.0f}  {comp:8.0f}  {ttft * 1e3:7.1f}  "
                  f"{total * 1e3:8.1f}  {tmax * 1e3:9.1f}", flush=True)

    with tempfile.TemporaryDirectory(prefix="wkvm-resp-bench-") as tmp:
        model, mid = a.model, os.path.basename(os.path.normpath(a.model or "m"))
        if model is None:
            model = os.path.join(tmp, "m")
            subprocess.run([h.MKMODEL, "--out", model, "--layers", str(a.layers), "--embd",
                            str(a.embd), "--head-size", "64", "--ffn", str(a.embd * 7 // 2),
                            "--vocab", "512", "--seed", "3"], check=True, capture_output=True)
        wk = [m for m in modes if not m.startswith("llama")]
        if wk:
            extra = (["--chat-template", a.chat_template] if a.chat_template else []) + a.ctl_arg
            with h.Stack(model=model, slots=a.slots, extra_ctl=extra) as s:
                s.start_controller()
                wpid = s.start_worker("w0", extra=["--threads", str(a.threads)] + a.worker_arg).pid
                s.wait(lambda: s.get("/ready").status == 200, "ready", timeout=600)
                for name in wk:
                    # each mode starts with an empty checkpoint cache (the modes render the
                    # same conversation, so one would otherwise reuse another's checkpoints)
                    s.post("/admin/cache/clear")
                    if name == "responses":
                        def fn(c):
                            return run_responses(s.url, mid, a.turns, a.tool, a.max_tokens, c)
                    else:
                        def fn(c, name=name):
                            return run_chat(s.url, mid, a.turns, a.tool, a.max_tokens,
                                            name == "chat", conv=c)
                    c0, k0, f0 = cpu_seconds(wpid), checkpoint_counts(s), minor_faults(wpid)
                    per_conv, wall = run_convs(a.convs, a.stagger, fn)
                    c1, k1, f1 = cpu_seconds(wpid), checkpoint_counts(s), minor_faults(wpid)
                    report(name, per_conv, wall,
                           c1 - c0 if c0 is not None and c1 is not None else None,
                           {k: k1[k] - k0.get(k, 0) for k in k1 if k1[k] - k0.get(k, 0) > 0},
                           f1 - f0 if f0 is not None and f1 is not None else None)
        for name in [m for m in modes if m.startswith("llama")]:
            ctx = 2048 + a.turns * (a.tool + a.max_tokens + 64)
            with LlamaServer(a.llama_server, a.gguf, a.chat_template, a.threads, ctx,
                             llama_np(name)) as ls:
                def fn(c):
                    return run_chat(ls.url, "model", a.turns, a.tool, a.max_tokens, True,
                                    llama=True, conv=c)
                report(name, *run_convs(a.convs, a.stagger, fn))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if a.svg:
        write_svg(a.svg, out, (f"{a.convs} concurrent agent loops: " if a.convs > 1 else
                               "agent loop: ") +
                  f"{a.turns} turns, each a ~{a.tool}-byte tool output "
                  f"+ {a.max_tokens} generated tokens" + (" (medians)" if a.convs > 1 else ""))


if __name__ == "__main__":
    main()
