#!/usr/bin/env python3
"""Serving benchmark: a real controller + CPU workers on loopback, closed-loop
streaming clients at several concurrency levels.

For each level, N client threads loop over streaming /v1/completions requests
(token-id prompt, ignore_eos, fixed max_tokens) for a fixed time (or a fixed
number of requests each) and the driver reports:

- output tok/s over the level's window,
- p50/p99 time to first token (client side: request sent -> first SSE data
  chunk carrying a token),
- p50/p99 inter-token latency (gaps between consecutive token chunks),
- the step loop's overhead from /metrics deltas: 1 - sum(wkvm_step_backend_seconds)
  / sum(wkvm_step_seconds), i.e. the share of a step RPC's controller-side wall
  time that is not spent in the worker's backend (RPC, encode/decode, sampling
  bookkeeping outside the backend timer).

Stdlib only. See bench/README.md ("Serving: serve.py").

    python3 bench/serve.py --build build --out /tmp/serve.json
"""
import argparse
import http.client
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("WKVM_BUILD_DIR", os.path.join(SRC, "build")),
                    help="build dir holding controld/ and workerd/ "
                    "(default $WKVM_BUILD_DIR or ./build)")
    ap.add_argument("--model", help="model dir (default: a demo model from wkvm-mkmodel defaults, "
                    "L4 C256 N64 F1024 V4096 bf16, random weights)")
    ap.add_argument("--workers", type=int, default=1, help="workers (default 1)")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads per worker (default 0 = the worker's default, all cores)")
    ap.add_argument("--backend", default="cpu", help="worker backend (default cpu)")
    ap.add_argument("--slots", type=int, default=0,
                    help="slots per worker (default: enough for the highest level)")
    ap.add_argument("--levels", default="1,4,16,64", help="client counts (default 1,4,16,64)")
    ap.add_argument("--duration", type=float, default=25.0,
                    help="seconds per level; clients start no request after it (default 25)")
    ap.add_argument("--requests", type=int, default=0,
                    help="instead of --duration: requests per client per level")
    ap.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (64)")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="prompt length in tokens (128)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sampling temperature (default 0 = greedy)")
    ap.add_argument("--seed", type=int, default=1, help="prompt PRNG seed")
    ap.add_argument("--ctl-arg", action="append", default=[], metavar="ARG",
                    help="extra controller argument, repeatable (--ctl-arg=--step-tokens "
                    "--ctl-arg=128)")
    ap.add_argument("--out", help="write JSON results here")
    ap.add_argument("--keep-logs", action="store_true",
                    help="keep the temp dir (model, daemon logs) and print where it is")
    return ap.parse_args()


ARGS = parse_args()
os.environ["WKVM_BUILD_DIR"] = os.path.abspath(ARGS.build)
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
import wkvm_harness  # noqa: E402
from wkvm_harness import MKMODEL, Stack  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import machine, percentile  # noqa: E402


def scrape(stack):
    """Sums every series of each metric name: {'name': value} (labels dropped)."""
    r = stack.get("/metrics", timeout=30)
    if r.status != 200:
        raise RuntimeError(f"/metrics answered {r.status}")
    out = {}
    for line in r.body.decode().splitlines():
        if not line or line[0] == "#":
            continue
        try:
            key, val = line.rsplit(" ", 1)
            v = float(val)
        except ValueError:
            continue
        name = key.split("{", 1)[0]
        if "{" in key and 'le="' in key:
            continue  # histogram buckets are not used
        out[name] = out.get(name, 0.0) + v
    return out


class Client(threading.Thread):
    """One closed-loop client: streams completions back to back."""

    def __init__(self, idx, port, model_id, vocab, start_evt, deadline, n_requests):
        super().__init__(daemon=True)
        self.port = port
        self.model_id = model_id
        self.rng = random.Random(ARGS.seed * 100003 + idx)
        self.vocab = vocab
        self.start_evt = start_evt
        self.deadline = deadline
        self.n_requests = n_requests
        self.records = []  # per request: dict(t_send, ttft, chunks=[(t, ntok)], ok, err)
        self.errors = []

    def one(self):
        prompt = [self.rng.randrange(1, self.vocab) for _ in range(ARGS.prompt_tokens)]
        body = json.dumps({"model": self.model_id, "prompt": prompt,
                           "max_tokens": ARGS.max_tokens, "ignore_eos": True, "stream": True,
                           "temperature": ARGS.temperature,
                           "return_token_ids": True}).encode()
        rec = {"chunks": [], "ok": False}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        try:
            t_send = time.perf_counter()
            rec["t_send"] = t_send
            conn.request("POST", "/v1/completions", body=body,
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
            done = False
            while True:
                line = resp.readline()
                if not line:
                    break
                t = time.perf_counter()
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                ev = json.loads(payload)
                if "error" in ev:
                    raise RuntimeError(f"stream error: {ev['error'].get('message')}")
                ch = ev.get("choices") or []
                n = len(ch[0].get("token_ids") or []) if ch else 0
                if n:
                    rec["chunks"].append((t, n))
            if not done:
                raise RuntimeError("stream ended without [DONE]")
            ntok = sum(n for _, n in rec["chunks"])
            if ntok != ARGS.max_tokens:
                raise RuntimeError(f"got {ntok} tokens, wanted {ARGS.max_tokens}")
            rec["ok"] = True
        except Exception as e:  # noqa: BLE001 - every failure is reported
            rec["err"] = str(e)
            self.errors.append(str(e))
        finally:
            conn.close()
        self.records.append(rec)

    def run(self):
        self.start_evt.wait()
        if self.n_requests:
            for _ in range(self.n_requests):
                self.one()
        else:
            while time.perf_counter() < self.deadline:
                self.one()


def run_level(stack, model_id, vocab, conc):
    before = scrape(stack)
    start = threading.Event()
    # deadline is set once all threads exist so thread creation is not timed
    clients = [Client(i, stack.port, model_id, vocab, start, 0.0, ARGS.requests)
               for i in range(conc)]
    for c in clients:
        c.start()
    t0 = time.perf_counter()
    for c in clients:
        c.deadline = t0 + ARGS.duration
    start.set()
    for c in clients:
        c.join()
    t_end = time.perf_counter()
    after = scrape(stack)

    recs = [r for c in clients for r in c.records]
    ok = [r for r in recs if r["ok"]]
    errors = [e for c in clients for e in c.errors]
    ttft = [r["chunks"][0][0] - r["t_send"] for r in ok]
    itl, multi = [], 0
    for r in ok:
        for (ta, _), (tb, nb) in zip(r["chunks"], r["chunks"][1:]):
            itl.append(tb - ta)
            multi += nb > 1
    # Throughput: with --duration, tokens that arrived inside [t0, t0 + duration]
    # (the drain after it runs at falling concurrency); with --requests, all of them.
    if ARGS.requests:
        window = t_end - t0
        ntok = sum(n for r in recs for _, n in r["chunks"])
    else:
        window = ARGS.duration
        ntok = sum(n for r in recs for t, n in r["chunks"] if t <= t0 + ARGS.duration)

    def d(name):
        return after.get(name, 0.0) - before.get(name, 0.0)
    step_sum, back_sum = d("wkvm_step_seconds_sum"), d("wkvm_step_backend_seconds_sum")
    steps = d("wkvm_step_seconds_count")
    gen = d("wkvm_generation_tokens_total")
    ms = lambda x: None if x is None else round(x * 1000.0, 2)  # noqa: E731
    return {
        "concurrency": conc,
        "requests_ok": len(ok),
        "requests_failed": len(errors),
        "errors": sorted(set(errors))[:5],
        "window_s": round(window, 3),
        "wall_s": round(t_end - t0, 3),
        "output_tokens": int(ntok),
        "output_tok_s": round(ntok / window, 1) if window > 0 else None,
        "ttft_p50_ms": ms(percentile(ttft, 50)),
        "ttft_p99_ms": ms(percentile(ttft, 99)),
        "itl_p50_ms": ms(percentile(itl, 50)),
        "itl_p99_ms": ms(percentile(itl, 99)),
        "itl_multi_token_chunks": multi,
        "steps": int(steps),
        "generated_tokens_server": int(gen),
        "step_seconds_sum": round(step_sum, 4),
        "step_backend_seconds_sum": round(back_sum, 4),
        "gen_tokens_per_step": round(gen / steps, 2) if steps else None,
        "loadavg_end": list(os.getloadavg()),
        "mean_step_ms": round(step_sum / steps * 1000.0, 3) if steps else None,
        "mean_backend_ms": round(back_sum / steps * 1000.0, 3) if steps else None,
        "overhead_fraction": round(1.0 - back_sum / step_sum, 4) if step_sum > 0 else None,
        "server_ttft_mean_ms": ms(d("wkvm_time_to_first_token_seconds_sum") /
                                 d("wkvm_time_to_first_token_seconds_count"))
        if d("wkvm_time_to_first_token_seconds_count") else None,
        "server_tpot_mean_ms": ms(d("wkvm_time_per_output_token_seconds_sum") /
                                 d("wkvm_time_per_output_token_seconds_count"))
        if d("wkvm_time_per_output_token_seconds_count") else None,
    }


def fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def table(levels):
    rows = ["| clients | requests | out tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | "
            "ITL p99 ms | steps | tok/step | mean step ms | mean backend ms | step overhead |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for lv in levels:
        req = f"{lv['requests_ok']}" + (f" ({lv['requests_failed']} failed)"
                                         if lv["requests_failed"] else "")
        ov = lv["overhead_fraction"]
        rows.append(f"| {lv['concurrency']} | {req} | {fmt(lv['output_tok_s'])} | "
                    f"{fmt(lv['ttft_p50_ms'])} | {fmt(lv['ttft_p99_ms'])} | "
                    f"{fmt(lv['itl_p50_ms'])} | {fmt(lv['itl_p99_ms'])} | {lv['steps']} | "
                    f"{fmt(lv['gen_tokens_per_step'])} | {fmt(lv['mean_step_ms'], 2)} | "
                    f"{fmt(lv['mean_backend_ms'], 2)} | "
                    f"{'-' if ov is None else f'{ov * 100:.1f}%'} |")
    return "\n".join(rows)


def main():
    levels = [int(x) for x in ARGS.levels.split(",") if x.strip()]
    if not levels or min(levels) < 1 or ARGS.workers < 1:
        sys.exit("serve.py: --levels and --workers must be positive")
    for exe in (wkvm_harness.CONTROLD, wkvm_harness.WORKERD):
        if not os.access(exe, os.X_OK):
            sys.exit(f"serve.py: {exe} not built (ninja -C {ARGS.build})")
    tmpdir = tempfile.mkdtemp(prefix="wkvm-bench-serve-")
    model = ARGS.model
    if model is None:
        model = os.path.join(tmpdir, "wkvm-demo")
        subprocess.run([MKMODEL, "--out", model], check=True, capture_output=True, timeout=120)
    model = os.path.abspath(model)
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    vocab = int(cfg.get("vocab_size", 65536))
    slots = ARGS.slots or max(1, -(-max(levels) // ARGS.workers))
    http_threads = max(32, max(levels) + 16)
    data = os.path.join(tmpdir, "data")
    os.makedirs(data)
    stack = Stack(model=model, workers_expected=ARGS.workers, slots=slots, data=data,
                  extra_ctl=["--http-threads", str(http_threads), "--heartbeat-ms", "1000",
                             "--log-level", "warn"] + ARGS.ctl_arg)
    result = {"machine": machine(), "config": {
        "model": ARGS.model or "wkvm-mkmodel defaults (L4 C256 N64 F1024 V4096 bf16, random)",
        "model_config": {k: cfg.get(k) for k in ("num_hidden_layers", "hidden_size", "head_dim",
                                                 "intermediate_size", "vocab_size", "torch_dtype")},
        "workers": ARGS.workers, "threads_per_worker": ARGS.threads, "backend": ARGS.backend,
        "slots_per_worker": slots, "levels": levels, "duration_s": ARGS.duration,
        "requests_per_client": ARGS.requests, "max_tokens": ARGS.max_tokens,
        "temperature": ARGS.temperature, "prompt_tokens": ARGS.prompt_tokens,
        "controller_args": ARGS.ctl_arg, "command": " ".join([sys.executable] + sys.argv)}}
    try:
        stack.start_controller()
        for i in range(ARGS.workers):
            stack.start_worker(f"w{i}", extra=["--threads", str(ARGS.threads),
                                               "--backend", ARGS.backend])
        stack.wait(lambda: stack.get("/ready").status == 200, "ready", timeout=600)
        model_id = stack.get("/v1/models").json()["data"][0]["id"]
        # Warm-up: one short request so lazy initialisation is not timed.
        r = stack.post("/v1/completions", body={"model": model_id, "prompt": [1, 2, 3],
                                                "max_tokens": 4, "ignore_eos": True},
                       timeout=120)
        if r.status != 200:
            raise RuntimeError(f"warm-up request failed: {r.status} {r.body[:300]!r}")
        mach = result["machine"]
        print(f"# wkvm serve bench: {mach['cpu']}, {mach['cores']} cores; "
              f"{ARGS.workers} worker(s), {slots} slots each, prompt {ARGS.prompt_tokens} tok, "
              f"max_tokens {ARGS.max_tokens}", flush=True)
        out_levels = []
        for conc in levels:
            lv = run_level(stack, model_id, vocab, conc)
            out_levels.append(lv)
            print(f"  clients={conc}: {lv['output_tok_s']} tok/s, ttft p50 {lv['ttft_p50_ms']} ms, "
                  f"itl p50 {lv['itl_p50_ms']} ms, overhead {lv['overhead_fraction']}"
                  + (f", {lv['requests_failed']} failed: {lv['errors']}"
                     if lv["requests_failed"] else ""), flush=True)
        result["levels"] = out_levels
        for p in stack.procs:
            if p.poll() is not None:
                raise RuntimeError(f"a daemon exited during the run (rc {p.returncode})")
    except BaseException:
        print(stack.tail(), file=sys.stderr)
        raise
    finally:
        stack.stop()
        if ARGS.keep_logs:
            print(f"logs kept in {data}", file=sys.stderr)
        else:
            shutil.rmtree(tmpdir, ignore_errors=True)
    print()
    print(table(result["levels"]))
    if ARGS.out:
        with open(ARGS.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        print(f"\nwrote {ARGS.out}")
    failed = sum(lv["requests_failed"] for lv in result["levels"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
