#!/usr/bin/env python3
"""Load and robustness run: many concurrent clients against few slots; every
request must end in success or in a deliberate refusal, and nothing leaks.

It starts a controller (with an API key file of --users users) and one CPU
worker on loopback in a temp data dir, on a tiny random model (wkvm-mkmodel
--layers 2 --embd 64 --head-size 16 --ffn 128 --vocab 512), then runs
--requests requests from --clients client threads (stdlib http.client) that
mix, per request at random:

- streaming and blocking, /v1/chat/completions and /v1/completions;
- short outputs (max_tokens 1..48) and a few "runaway" ones (--long-share,
  max_tokens 60000 with ignore_eos) that must end with a 504 after
  --request-timeout-ms;
- streaming clients that disconnect after a few events (--disconnect-share);
- keys sent as `Authorization: Bearer` or as `x-api-key`.

A client refused with 429 backs off 0.1-0.5 s before its next request (the
refused request counts as one of the --requests).

Accepted outcomes: 200 (a blocking JSON answer with a choice, or a stream that
ends with [DONE]), 429 (queue_full: the bounded wait queue; quota_exceeded:
--max-concurrent-per-user), 504 (timeout: a runaway request, or a wait for a
slot longer than the deadline; on a stream, one error event then [DONE]) and
the client's own disconnects. Anything else is a failure: a 5xx other than
504, a connection error, a malformed answer. Afterwards the worker's slots
must all be free again (slots_used 0 in /admin/workers), and the controller's
RSS is reported before (after a warm-up round) and after the run.

    python3 bench/load.py --build build                 # 2000 requests, 200 clients, 16 slots
    python3 bench/load.py --requests 200 --clients 40 --slots 4   # the CI size

Exit status 0 when every request ended as accepted and no slot leaked.
tests/integration/test_load.py runs the CI size through run_load().
"""
import argparse
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("WKVM_BUILD_DIR", os.path.join(SRC, "build")),
                    help="build dir holding controld/ and workerd/ (default $WKVM_BUILD_DIR "
                    "or ./build)")
    ap.add_argument("--requests", type=int, default=2000, help="requests in all (2000)")
    ap.add_argument("--clients", type=int, default=200, help="concurrent client threads (200)")
    ap.add_argument("--slots", type=int, default=16, help="worker slots (16)")
    ap.add_argument("--users", type=int, default=4, help="API users the clients spread over (4)")
    ap.add_argument("--http-threads", type=int, default=256,
                    help="controller HTTP threads (256: one per client)")
    ap.add_argument("--queue-max", type=int, default=128, help="controller wait queue (128)")
    ap.add_argument("--max-concurrent-per-user", type=int, default=40,
                    help="per-user generation limit (40)")
    ap.add_argument("--request-timeout-ms", type=int, default=10000,
                    help="controller request deadline (10000)")
    ap.add_argument("--long-share", type=float, default=0.01,
                    help="share of runaway requests that must time out (0.01)")
    ap.add_argument("--disconnect-share", type=float, default=0.1,
                    help="share of streams the client abandons early (0.1)")
    ap.add_argument("--warmup", type=int, default=100, help="requests before the RSS baseline (100)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="times the whole run repeats; RSS is read after each (2): a leak "
                    "grows with every round, allocator warm-up does not")
    ap.add_argument("--worker-threads", type=int, default=1, help="CPU threads of the worker (1)")
    ap.add_argument("--seed", type=int, default=1, help="client PRNG seed")
    ap.add_argument("--out", help="write the JSON summary here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir and print it")
    return ap.parse_args(argv)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Tally:
    """Outcome counters shared by the clients."""

    def __init__(self):
        self.mu = threading.Lock()
        self.counts = {}
        self.failures = []

    def add(self, outcome, detail=None):
        with self.mu:
            self.counts[outcome] = self.counts.get(outcome, 0) + 1
            if outcome.startswith("FAIL") and len(self.failures) < 50:
                self.failures.append(f"{outcome}: {detail}")


def one_request(port, key, rng, cfg, tally, model):
    chat = rng.random() < 0.5
    stream = rng.random() < 0.5
    long_run = rng.random() < cfg["long_share"]
    abandon = stream and not long_run and rng.random() < cfg["disconnect_share"]
    n = 60000 if long_run else rng.randrange(1, 49)
    body = {"model": model, "max_tokens": n, "stream": stream,
            "temperature": rng.choice([0, 0.7, 1.0]), "seed": rng.randrange(1 << 30)}
    if long_run or abandon:
        body["ignore_eos"] = True
    if chat:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": "w" * rng.randrange(1, 200)}]
    else:
        path = "/v1/completions"
        body["prompt"] = [rng.randrange(1, 511) for _ in range(rng.randrange(1, 64))]
    hdrs = {"Content-Type": "application/json"}
    if rng.random() < 0.5:
        hdrs["Authorization"] = f"Bearer {key}"
    else:
        hdrs["x-api-key"] = key
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    kind = ("long-" if long_run else "") + ("stream" if stream else "block")
    try:
        conn.request("POST", path, body=json.dumps(body), headers=hdrs)
        sock = conn.sock
        resp = conn.getresponse()
        if resp.status != 200:
            raw = resp.read()
            try:
                code = json.loads(raw)["error"]["code"]
            except (ValueError, KeyError, TypeError):
                tally.add("FAIL-malformed-error", f"{resp.status} {raw[:200]!r}")
                return
            if resp.status == 429 and code in ("queue_full", "quota_exceeded"):
                tally.add(f"429-{code}")
                time.sleep(rng.uniform(0.1, 0.5))  # a polite client backs off
            elif resp.status == 504 and code == "timeout":
                tally.add(f"504-{kind}")
            else:
                tally.add(f"FAIL-{resp.status}-{code}", raw[:200])
            return
        if not stream:
            b = json.loads(resp.read())
            if b.get("choices") and b["usage"]["completion_tokens"] >= 1:
                tally.add("200-" + kind)
            else:
                tally.add("FAIL-bad-body", str(b)[:200])
            return
        events = 0
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                tally.add("200-" + kind)
                return
            ev = json.loads(payload)
            if "error" in ev:
                code = ev["error"].get("code")
                if code == "timeout":
                    tally.add(f"504-{kind}")
                else:
                    tally.add(f"FAIL-stream-{code}", ev["error"].get("message"))
                return
            events += 1
            if abandon and events >= 3:
                sock.shutdown(socket.SHUT_RDWR)
                tally.add("disconnected")
                return
        tally.add("FAIL-stream-no-done", f"{events} events")
    except (OSError, http.client.HTTPException, ValueError) as e:
        tally.add("FAIL-" + type(e).__name__, str(e))
    finally:
        conn.close()


def run_round(port, keys, n_requests, n_clients, cfg, model, seed):
    tally = Tally()
    left = [n_requests]
    mu = threading.Lock()

    def client(idx):
        rng = random.Random(seed * 1000003 + idx)
        key = keys[idx % len(keys)]
        while True:
            with mu:
                if left[0] == 0:
                    return
                left[0] -= 1
            one_request(port, key, rng, cfg, tally, model)
    ts = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n_clients)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=900)
    return tally, time.time() - t0, sum(t.is_alive() for t in ts)


def run_load(args):
    """Runs one load test as args says; returns the summary dict (summary['ok'])."""
    os.environ["WKVM_BUILD_DIR"] = os.path.abspath(args.build)
    sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
    import wkvm_harness  # noqa: E402 - needs WKVM_BUILD_DIR set first
    tmp = tempfile.mkdtemp(prefix="wkvm-load-")
    model = os.path.join(tmp, "tiny")
    subprocess.run([wkvm_harness.MKMODEL, "--out", model, "--layers", "2", "--embd", "64",
                    "--head-size", "16", "--ffn", "128", "--vocab", "512", "--seed", "7"],
                   check=True, capture_output=True, timeout=120)
    keyfile = os.path.join(tmp, "keys")
    keys = [f"sk-load-user{i}-{random.Random(i).getrandbits(64):016x}" for i in range(args.users)]
    with open(keyfile, "w") as f:
        for i, k in enumerate(keys):
            f.write(f"{k} user{i}\n")
        f.write("sk-load-admin-00000001 ops admin\n")
    os.chmod(keyfile, 0o600)
    admin = {"Authorization": "Bearer sk-load-admin-00000001"}
    cfg = {"long_share": args.long_share, "disconnect_share": args.disconnect_share}
    summary = {"requests": args.requests, "clients": args.clients, "slots": args.slots,
               "users": args.users}
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    with wkvm_harness.Stack(model=model, slots=args.slots, data=data, extra_ctl=[
            "--api-keys", keyfile, "--http-threads", str(args.http_threads),
            "--queue-max", str(args.queue_max),
            "--max-concurrent-per-user", str(args.max_concurrent_per_user),
            "--request-timeout-ms", str(args.request_timeout_ms)]) as s:
        s.start_controller()
        s.start_worker("w0", extra=["--threads", str(args.worker_threads)])
        s.wait(lambda: s.get("/ready").status == 200, "ready")
        pid = s.ctl.pid
        summary["rss_kib_start"] = rss_kib(pid)
        if args.warmup:
            w, _, _ = run_round(s.port, keys, args.warmup, min(args.clients, args.warmup), cfg,
                                "tiny", args.seed + 1)
            summary["warmup_outcomes"] = w.counts
        s.wait(lambda: sum(x["slots_used"] for x in s.workers_list(headers=admin)) == 0,
               "slots free after warm-up", timeout=30)
        summary["rss_kib_before"] = rss_kib(pid)
        summary["rounds"] = []
        ok_rounds = True
        for rnd in range(max(1, args.rounds)):
            tally, secs, stuck = run_round(s.port, keys, args.requests, args.clients, cfg,
                                           "tiny", args.seed + 7 * rnd)
            t0 = time.time()
            leaked = None
            while time.time() - t0 < 30:
                used = sum(x["slots_used"] for x in s.workers_list(headers=admin))
                if used == 0:
                    leaked = 0
                    break
                leaked = used
                time.sleep(0.1)
            total = sum(tally.counts.values())
            fails = sum(v for k, v in tally.counts.items() if k.startswith("FAIL"))
            ok_rounds = (ok_rounds and fails == 0 and total == args.requests and stuck == 0
                         and leaked == 0)
            summary["rounds"].append({
                "seconds": round(secs, 1), "outcomes": dict(sorted(tally.counts.items())),
                "failures": tally.failures, "clients_stuck": stuck, "slots_used_after": leaked,
                "rss_kib_after": rss_kib(pid)})
        m = s.get("/metrics", headers=admin).body.decode()
        summary["server_5xx_lines"] = [
            line for line in m.splitlines() if line.startswith("wkvm_http_requests_total")
            and 'code="5' in line and 'code="504"' not in line and 'route="/ready"' not in line]
        summary["server_5xx"] = sum(
            float(line.rsplit(" ", 1)[1]) for line in m.splitlines()
            if line.startswith("wkvm_http_requests_total") and 'code="5' in line
            and 'code="504"' not in line and 'route="/ready"' not in line)
        summary["controller_alive"] = s.ctl.poll() is None
    summary["ok"] = ok_rounds and summary["server_5xx"] == 0 and summary["controller_alive"]
    if args.keep:
        summary["tmp"] = tmp
    else:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return summary


def main():
    args = parse_args()
    summary = run_load(args)
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
