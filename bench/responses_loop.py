#!/usr/bin/env python3
"""An agent-like loop against one wkvm stack: TURNS turns, each adding a
~TOOL-byte "tool output" as a new user item, as

  responses  POST /v1/responses with previous_response_id (only the new item sent)
  chat       POST /v1/chat/completions resending the whole conversation
             (wkvm's automatic reuse finds the previous reply's exact tokens)
  chat-nc    the same with "cache": false (a full recompute every turn: what
             an engine without state reuse pays)

Streams every request and reports, per turn, the request bytes sent, the
prompt tokens computed (input - cached) and the time to the first text
event (TTFT). Random-weight model written by wkvm-mkmodel (raw byte tokens:
1 token per byte of input). Usage:

  bench/responses_loop.py [--turns 20] [--tool 300] [--layers 6] [--embd 512]
                          [--threads 1] [--build build]

The comparison with llama.cpp's llama-server is not here yet.
"""
import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))


def sse(url, body):
    """POSTs body, reads the SSE stream; returns (ttft_s, total_s, last event data, bytes)."""
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft = None
    last = None
    usage = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            t = ev.get("type", "")
            if ttft is None and (t == "response.output_text.delta" or
                                 (ev.get("choices") and
                                  (ev["choices"][0].get("delta") or {}).get("content"))):
                ttft = time.perf_counter() - t0
            if t in ("response.completed", "response.incomplete"):
                last = ev["response"]
                usage = last["usage"]
            elif ev.get("usage"):
                usage = ev["usage"]
            elif ev.get("choices"):
                last = last or {"text": ""}
                last["text"] = last.get("text", "") + \
                    ((ev["choices"][0].get("delta") or {}).get("content") or "")
    return ttft, time.perf_counter() - t0, last, usage, len(data)


def tool_output(turn, n):
    s = f"tool result {turn}: " + "".join(chr(97 + (turn * 7 + i) % 26) for i in range(n))
    return s[:n]


def run_responses(url, mid, turns, tool, maxt):
    rows, prev = [], None
    for t in range(turns):
        body = {"model": mid, "input": tool_output(t, tool), "max_output_tokens": maxt,
                "temperature": 0, "stream": True, "instructions": "You are an agent."}
        if prev:
            body["previous_response_id"] = prev
        ttft, total, resp, u, nbytes = sse(url + "/v1/responses", body)
        prev = resp["id"]
        computed = u["input_tokens"] - u["input_tokens_details"]["cached_tokens"]
        rows.append((t + 1, nbytes, u["input_tokens"], computed, ttft, total))
    return rows


def run_chat(url, mid, turns, tool, maxt, cache):
    rows, msgs = [], [{"role": "system", "content": "You are an agent."}]
    for t in range(turns):
        msgs.append({"role": "user", "content": tool_output(t, tool)})
        body = {"model": mid, "messages": msgs, "max_tokens": maxt, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}, "cache": cache}
        ttft, total, last, u, nbytes = sse(url + "/v1/chat/completions", body)
        msgs.append({"role": "assistant", "content": last["text"]})
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        rows.append((t + 1, nbytes, u["prompt_tokens"], u["prompt_tokens"] - cached, ttft, total))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--tool", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--embd", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--build", default=None)
    ap.add_argument("--json", default=None, help="write the rows here")
    a = ap.parse_args()
    if a.build:
        os.environ["WKVM_BUILD_DIR"] = os.path.abspath(a.build)
    import wkvm_harness as h  # noqa: E402 (reads WKVM_BUILD_DIR)
    import subprocess
    out = {}
    with tempfile.TemporaryDirectory(prefix="wkvm-resp-bench-") as tmp:
        model = os.path.join(tmp, "m")
        subprocess.run([h.MKMODEL, "--out", model, "--layers", str(a.layers), "--embd",
                        str(a.embd), "--head-size", "64", "--ffn", str(a.embd * 7 // 2),
                        "--vocab", "512", "--seed", "3"], check=True, capture_output=True)
        with h.Stack(model=model, slots=4) as s:
            s.start_controller()
            s.start_worker("w0", extra=["--threads", str(a.threads)])
            s.wait(lambda: s.get("/ready").status == 200, "ready", timeout=300)
            for name, fn in (("responses", lambda: run_responses(s.url, "m", a.turns, a.tool,
                                                                   a.max_tokens)),
                             ("chat", lambda: run_chat(s.url, "m", a.turns, a.tool, a.max_tokens,
                                                       True)),
                             ("chat-nc", lambda: run_chat(s.url, "m", a.turns, a.tool,
                                                          a.max_tokens, False))):
                # each mode starts with an empty checkpoint cache (the modes render the same
                # conversation, so one would otherwise reuse another's checkpoints)
                s.post("/admin/cache/clear")
                t0 = time.perf_counter()
                rows = fn()
                wall = time.perf_counter() - t0
                out[name] = {"rows": rows, "wall_s": wall}
                print(f"== {name}: wall {wall:.2f}s")
                print("turn  bytes_sent  input_tokens  computed  ttft_ms  total_ms")
                for t, nb, it, comp, ttft, total in rows:
                    print(f"{t:4d}  {nb:10d}  {it:12d}  {comp:8d}  {ttft * 1e3:7.1f}  "
                          f"{total * 1e3:8.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
