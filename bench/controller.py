#!/usr/bin/env python3
"""Controller CPU per streamed token (issue #33): a real controller and one CPU
worker on loopback, a tiny model so that the worker is not the bottleneck, N
clients streaming M tokens each through /v1/completions with ignore_eos.

For each level N (--streams, default 64,256) the driver reads the
controller's utime+stime from /proc/<pid>/stat before and after each round
(--rounds, 3) in which N streams start together and each receives M tokens
(--tokens, 256), and prints:

- us of controller CPU per streamed token (the issue's figure; target <= 10),
- tokens/s over the round (first request sent -> last stream closed),
- the controller CPU split by thread name (/proc/<pid>/task/*/schedstat;
  threads of one name summed, digits folded), the worker's CPU, and the load
  generator's own CPU (each client process reports os.times()),
- the same split as the controller reports it in /metrics
  (wkvm_controller_cpu_seconds_total{component}, its delta over the round),
- the load average before and after (the machine is shared: figures are noisy).

Tokens are counted from each stream's usage chunk (stream_options
include_usage), never assumed. The load generator is --procs processes (one
per core by default, at least 2), each running asyncio streams over raw
sockets (HTTP/1.1, Connection: close) that only count bytes and parse the last
event, so that it stays well below the controller's CPU; its CPU is printed
beside the controller's so that a reader can check.

--stub uses build/bench/wkvm-stub-worker instead of the CPU worker: the real
protocol over NNG, every step answered at once with a fixed token, so that
the controller alone is measured (the 1,024-stream level).

The slot count and --http-threads follow the largest level (one civetweb
thread holds each streaming connection, and --http-threads is at most 1024,
so 1,024 streams is the most this measures). --perf DIR also records
`perf record -g` of the controller during an extra run of the first level
(kept apart so that perf's overhead does not enter the figures) and writes
DIR/perf.data and DIR/perf-top.txt.

    python3 bench/controller.py --build build                      # 64 and 256 streams
    python3 bench/controller.py --streams 64 --tokens 256 --perf /tmp/ctlperf
    python3 bench/controller.py --stub --streams 1024 --rounds 2

Stdlib only. Exit status 0 when every stream got its M tokens.
"""
import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import benchlib  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
USAGE_RE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("WKVM_BUILD_DIR", os.path.join(SRC, "build")),
                    help="build dir holding controld/ and workerd/ (default $WKVM_BUILD_DIR "
                    "or ./build)")
    ap.add_argument("--streams", default="64,256", help="concurrent streams per level (64,256)")
    ap.add_argument("--tokens", type=int, default=256, help="tokens per stream (256)")
    ap.add_argument("--procs", type=int, default=max(2, os.cpu_count() or 2),
                    help="load generator processes (default: cores, at least 2)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="measured rounds per level; each is printed (3)")
    ap.add_argument("--worker-threads", type=int, default=1, help="CPU threads of the worker (1)")
    ap.add_argument("--ctl-arg", action="append", default=[],
                    help="an extra controller argument (repeatable), e.g. --ctl-arg=--sse-flush-ms=0")
    ap.add_argument("--stub", action="store_true",
                    help="use bench/wkvm-stub-worker (real protocol over NNG, answers every "
                    "step at once with a fixed token) instead of a CPU worker")
    ap.add_argument("--http-threads", type=int, default=0,
                    help="controller HTTP threads (default: largest level + 32, at most 1024)")
    ap.add_argument("--perf", metavar="DIR",
                    help="also profile the controller with perf record -g during an extra "
                    "run of the first level; writes DIR/perf.data, DIR/perf-top.txt")
    ap.add_argument("--out", help="write the JSON summary here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir and print it")
    ap.add_argument("--client", nargs=4, metavar=("PORT", "N", "TOKENS", "START"),
                    help=argparse.SUPPRESS)  # internal: one load generator process
    return ap.parse_args(argv)


# ---------------------------------------------------------------- load generator

async def client_stream(port, body, res):
    """One streaming request; adds its outcome to res (a dict of counters)."""
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        res["errors"] += 1
        return
    req = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
           f"Connection: close\r\n\r\n").encode() + body
    w.write(req)
    first = b""
    tail = b""
    nbytes = 0
    try:
        await w.drain()
        while True:
            chunk = await r.read(65536)
            if not chunk:
                break
            nbytes += len(chunk)
            if len(first) < 64:
                first += chunk
            tail = (tail + chunk)[-2048:]
    except OSError:
        res["errors"] += 1
        return
    finally:
        w.close()
    res["bytes"] += nbytes
    m = USAGE_RE.findall(tail)
    if not first.startswith(b"HTTP/1.1 200") or b"[DONE]" not in tail or not m:
        res["errors"] += 1
        if res["first_error"] is None:
            res["first_error"] = (first + b" ... " + tail[-300:]).decode(errors="replace")
        return
    res["ok"] += 1
    res["tokens"] += int(m[-1])


def client_main(port, n, tokens, start):
    """A load generator process: n streams at once from time start; prints JSON."""
    body = json.dumps({"model": "tiny", "prompt": "Hello there", "max_tokens": tokens,
                       "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    res = {"ok": 0, "errors": 0, "tokens": 0, "bytes": 0, "first_error": None}

    async def run():
        await asyncio.gather(*(client_stream(port, body, res) for _ in range(n)))

    delay = start - time.time()
    if delay > 0:
        time.sleep(delay)
    t0 = time.time()
    c0 = os.times()  # after interpreter start-up and the wait: only the streams count
    asyncio.run(run())
    res["t_end"] = time.time()
    res["t_start"] = t0
    t = os.times()
    res["cpu_s"] = t.user + t.system - c0.user - c0.system
    print(json.dumps(res), flush=True)


# ---------------------------------------------------------------- measurement

def proc_cpu(pid):
    """utime+stime of a process in seconds (its threads, living and exited)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_cpu(pid):
    """{thread name with digits folded: cpu seconds} over the living threads."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                s = f.read()
        except OSError:
            continue
        name = re.sub(r"\d+", "N", s[s.index("(") + 1:s.rindex(")")])
        fields = s.rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
        try:  # on-CPU ns: stat's ticks are truncated per thread (lossy over ~300 threads)
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                cpu = int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            pass
        out[name] = out.get(name, 0.0) + cpu
    return out


METRIC_RE = re.compile(r'^wkvm_controller_cpu_seconds_total\{component="(\w+)"\} (\S+)$', re.M)


def metric_cpu(port):
    """{component: seconds} from the controller's /metrics (empty when absent)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            c.sendall(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            data = b""
            while True:
                b = c.recv(65536)
                if not b:
                    break
                data += b
    except OSError:
        return {}
    return {k: float(v) for k, v in METRIC_RE.findall(data.decode(errors="replace"))}


def run_level(port, n, tokens, procs, ctl_pid, wrk_pid):
    """One round of n streams; returns its figures as a dict."""
    procs = max(1, min(procs, n))
    per = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    start = time.time() + 0.5 + 0.05 * procs  # every process started and waiting
    load0 = os.getloadavg()
    children = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--client",
                                  str(port), str(k), str(tokens), repr(start)],
                                 stdout=subprocess.PIPE) for k in per]
    while time.time() < start - 0.05:
        time.sleep(0.01)
    c0, w0, th0 = proc_cpu(ctl_pid), proc_cpu(wrk_pid), thread_cpu(ctl_pid)
    m0 = metric_cpu(port)
    results = []
    for c in children:
        out, _ = c.communicate(timeout=600)
        results.append(json.loads(out))
    c1, w1, th1 = proc_cpu(ctl_pid), proc_cpu(wrk_pid), thread_cpu(ctl_pid)
    m1 = metric_cpu(port)
    t_start = min(r["t_start"] for r in results)
    wall = max(r["t_end"] for r in results) - t_start
    toks = sum(r["tokens"] for r in results)
    ctl = c1 - c0
    threads = {k: round(th1.get(k, 0.0) - th0.get(k, 0.0), 3) for k in th1}
    threads = dict(sorted(((k, v) for k, v in threads.items() if v > 0),
                          key=lambda kv: -kv[1]))
    errs = [r["first_error"] for r in results if r["first_error"]]
    return {
        "streams": n, "tokens_per_stream": tokens, "streams_ok": sum(r["ok"] for r in results),
        "errors": sum(r["errors"] for r in results), "first_error": errs[0] if errs else None,
        "tokens": toks, "wall_s": round(wall, 3),
        "tokens_per_s": round(toks / wall, 1) if wall > 0 else None,
        "controller_cpu_s": round(ctl, 3),
        "controller_us_per_token": round(ctl * 1e6 / toks, 2) if toks else None,
        "controller_cores": round(ctl / wall, 2) if wall > 0 else None,
        "controller_threads_cpu_s": threads,
        "metric_cpu_s": {k: round(v - m0.get(k, 0.0), 3) for k, v in m1.items()},
        "worker_cpu_s": round(w1 - w0, 3),
        "loadgen_procs": len(per), "loadgen_cpu_s": round(sum(r["cpu_s"] for r in results), 3),
        "loadgen_us_per_token": (round(sum(r["cpu_s"] for r in results) * 1e6 / toks, 2)
                                 if toks else None),
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }


def print_level(r):
    print(f"streams={r['streams']:5d} tokens={r['tokens']:7d} ok={r['streams_ok']} "
          f"errors={r['errors']} wall={r['wall_s']:.2f}s tok/s={r['tokens_per_s']} "
          f"ctl_cpu={r['controller_cpu_s']:.2f}s ctl_us/token={r['controller_us_per_token']} "
          f"ctl_cores={r['controller_cores']} worker_cpu={r['worker_cpu_s']:.2f}s "
          f"loadgen_cpu={r['loadgen_cpu_s']:.2f}s ({r['loadgen_us_per_token']} us/token, "
          f"{r['loadgen_procs']} procs) load={r['loadavg_before'][0]}->{r['loadavg_after'][0]}",
          flush=True)
    top = list(r["controller_threads_cpu_s"].items())[:6]
    print("  controller threads: " + ", ".join(f"{k}={v:.2f}s" for k, v in top), flush=True)
    if r["metric_cpu_s"]:
        print("  wkvm_controller_cpu_seconds_total delta: " +
              ", ".join(f"{k}={v:.2f}s" for k, v in r["metric_cpu_s"].items()), flush=True)
    if r["first_error"]:
        print(f"  first error: {r['first_error'][:400]}", flush=True)


def perf_level(port, n, tokens, procs, ctl_pid, wrk_pid, outdir):
    """The level again under perf record -g; writes perf.data and perf-top.txt."""
    os.makedirs(outdir, exist_ok=True)
    data = os.path.join(outdir, "perf.data")
    perf = subprocess.Popen(["perf", "record", "-g", "-F", "999", "-p", str(ctl_pid), "-o", data],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    r = run_level(port, n, tokens, procs, ctl_pid, wrk_pid)
    perf.send_signal(signal.SIGINT)
    perf.wait(timeout=60)
    with open(os.path.join(outdir, "perf-top.txt"), "w") as f:
        for args in (["--no-children", "--sort", "sym"], ["--children", "--sort", "sym"]):
            rep = subprocess.run(["perf", "report", "-i", data, "--stdio", "-g", "none",
                                  "--percent-limit", "0.7"] + args,
                                 capture_output=True, text=True, timeout=300)
            f.write(f"### perf report {' '.join(args)}\n{rep.stdout}\n")
    return r


def main(argv=None):
    args = parse_args(argv)
    if args.client:
        port, n, tokens, start = args.client
        client_main(int(port), int(n), int(tokens), float(start))
        return 0
    os.environ["WKVM_BUILD_DIR"] = os.path.abspath(args.build)
    sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
    import wkvm_harness  # noqa: E402 - needs WKVM_BUILD_DIR set first
    levels = [int(x) for x in args.streams.split(",") if x]
    top = max(levels)
    http_threads = args.http_threads or min(1024, top + 32)
    if top > http_threads:
        print(f"{top} streams need more than --http-threads {http_threads} (one civetweb thread "
              "per streaming connection; the controller allows at most 1024)", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="wkvm-ctlbench-")
    model = os.path.join(tmp, "tiny")
    subprocess.run([wkvm_harness.MKMODEL, "--out", model, "--layers", "2", "--embd", "64",
                    "--head-size", "16", "--ffn", "128", "--vocab", "512", "--seed", "7"],
                   check=True, capture_output=True, timeout=120)
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    summary = {"machine": benchlib.machine(), "slots": top + 1, "http_threads": http_threads,
               "worker": "stub" if args.stub else "cpu", "levels": []}
    ok = True
    with wkvm_harness.Stack(model=model, slots=top + 1, data=data, extra_ctl=[
            "--http-threads", str(http_threads), "--max-rows", str(min(1024, max(256, top))),
            "--step-tokens", str(max(512, 2 * top)), "--log-level", "warn"] + args.ctl_arg) as s:
        s.start_controller()
        if args.stub:
            # the stub worker answers every step at once with one fixed token
            p = subprocess.Popen([os.path.join(args.build, "bench", "wkvm-stub-worker"),
                                  "--data-dir", data, "--id", "w0", "--layers", "2",
                                  "--embd", "64", "--head-size", "16", "--ffn", "128",
                                  "--vocab", "512"],
                                 stdout=s._log("worker-w0"), stderr=subprocess.STDOUT)
            s.procs.append(p)
            s.workers["w0"] = p
        else:
            s.start_worker("w0", extra=["--threads", str(args.worker_threads),
                                        "--log-level", "warn"])
        s.wait(lambda: s.get("/ready").status == 200, "ready")
        ctl_pid, wrk_pid = s.ctl.pid, s.workers["w0"].pid
        warm = run_level(s.port, min(top, 32), 16, args.procs, ctl_pid, wrk_pid)
        if warm["errors"]:
            print(f"warm-up failed: {warm['first_error']}", file=sys.stderr)
            return 1
        for n in levels:
            for _ in range(max(1, args.rounds)):
                r = run_level(s.port, n, args.tokens, args.procs, ctl_pid, wrk_pid)
                print_level(r)
                summary["levels"].append(r)
                ok = ok and r["errors"] == 0 and r["tokens"] == n * args.tokens
        if args.perf:
            if shutil.which("perf") is None:
                print("perf not found; no profile", file=sys.stderr)
            else:
                r = perf_level(s.port, levels[0], args.tokens, args.procs, ctl_pid, wrk_pid,
                               args.perf)
                r["under_perf"] = True
                print("under perf record -g (figures inflated by perf):")
                print_level(r)
                summary["perf"] = r
                print(f"profile: {args.perf}/perf.data, {args.perf}/perf-top.txt")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    if args.keep:
        print(f"kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
