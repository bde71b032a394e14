#!/usr/bin/python3
"""Run the gpu suite from `meson introspect --tests` output, without meson.

bench/gpu.sh uses `meson test` where it built the tree itself. On a machine
that cannot build (no Debian packages, no network: a lent GPU machine with
only the CUDA toolkit and Python), bench/gpu-pack.sh builds here, saves the
introspected test list beside the binaries and carries both; this runs the
list's `gpu` suite there with each test's own command, environment and
timeout, several at once, and writes one JSON line per test as it ends, so a
run cut short still says what finished.

Usage: gpu_suite.py TESTS_JSON OUTDIR [--jobs N] [--budget SECONDS]
                    [--python EXE] [--only SUBSTR]

--python replaces the interpreter meson found at configure time (the
build machine's) with the one to use here. Tests meson may run in parallel
run --jobs at a time, then the others alone; each runs in a session of its
own, killed whole at its timeout (the daemons an integration test started
with it). A test the budget leaves no time for is recorded NOT RUN. Exit
status: 0 when every test passed or skipped for want of a second device
(nccl_pair), 1 otherwise (an empty list too).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tests_json")
    ap.add_argument("outdir")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--budget", type=float, default=330.0)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--only", default="")
    a = ap.parse_args()

    with open(a.tests_json) as f:
        tests = [t for t in json.load(f)
                 if any(s == "gpu" or s.endswith(":gpu") for s in t.get("suite", []))]
    if a.only:
        tests = [t for t in tests if a.only in t["name"]]
    # meson runs a test in the build dir unless it names another
    build_dir = os.path.dirname(os.path.abspath(a.tests_json))
    os.makedirs(a.outdir, exist_ok=True)
    t_end = time.monotonic() + a.budget
    lock = threading.Lock()
    results = []
    out_path = os.path.join(a.outdir, "gpu-suite.jsonl")
    open(out_path, "w").close()

    def record(r):
        with lock:
            results.append(r)
            with open(out_path, "a") as f:
                f.write(json.dumps(r) + "\n")
        print("gpu_suite: %-22s %-7s %6.1fs" % (r["name"], r["result"], r["seconds"]),
              file=sys.stderr, flush=True)

    def run_one(t):
        cmd = list(t["cmd"])
        if cmd and os.path.basename(cmd[0]).startswith("python"):
            cmd[0] = a.python
        env = dict(os.environ)
        env.update(t.get("env") or {})
        left = t_end - time.monotonic()
        if left <= 0:
            record({"name": t["name"], "result": "NOT RUN", "rc": None, "seconds": 0,
                    "tail": ["suite budget spent"]})
            return
        limit = min(float(t.get("timeout") or 300), left)
        log_path = os.path.join(a.outdir, "test-%s.log" % t["name"])
        t0 = time.monotonic()
        with open(log_path, "w") as log:
            try:
                # a session of its own: a timeout ends the daemons a test started too
                p = subprocess.Popen(cmd, cwd=t.get("workdir") or build_dir, env=env,
                                     stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
                try:
                    rc = p.wait(timeout=limit)
                    res = {0: "OK", 77: "SKIP"}.get(rc, "FAIL")
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                    rc, res = -1, "TIMEOUT"
            except OSError as e:
                log.write("cannot run: %s\n" % e)
                rc, res = -2, "FAIL"
        with open(log_path, errors="replace") as log:
            tail = log.read().strip().splitlines()[-3:]
        record({"name": t["name"], "result": res, "rc": rc,
                "seconds": round(time.monotonic() - t0, 1), "tail": tail})

    def worker(queue):
        while True:
            with lock:
                if not queue:
                    return
                t = queue.pop(0)
            run_one(t)

    # meson's is_parallel: those tests several at once, then the others one by one
    par = [t for t in tests if t.get("is_parallel", True)]
    threads = [threading.Thread(target=worker, args=(par,)) for _ in range(max(1, a.jobs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    worker([t for t in tests if not t.get("is_parallel", True)])
    ok = bool(results) and all(
        r["result"] == "OK" or (r["result"] == "SKIP" and r["name"] == "nccl_pair")
        for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
