#!/usr/bin/env python3
"""Live migration benchmark: latency of POST /admin/slots/{worker}:{slot}/migrate
over the NNG path against the state size, each figure next to a plain memcpy
of the same bytes measured in the same run, and the pause a streaming client
sees when its running request moves.

For each state size, a real controller + two CPU workers on loopback
(tests/integration/wkvm_harness.py) serve a random-weight RWKV-7 model whose
state has that size. state_bytes = L * (2C + H*N*N) * 4 with H = C/N; with one
head (N = C) the weights stay small (F64, V4096):

    L1 C768  N768   ->  2,365,440 B  (2.26 MiB)
    L1 C1792 N1792  -> 12,859,392 B (12.26 MiB)
    L2 C2048 N2048  -> 33,587,200 B (32.03 MiB)

Measured per size:

- parked state: one state (POST /v1/states) moved back and forth between the
  workers --round-trips times (two migrations each): client wall time of the
  migrate request p50/p99, the server's own transfer and total seconds from
  the response, MB/s, and the multiple of a memcpy of the same size (from
  DRAM, in this Python process); after the moves the state must still
  continue exactly as before (checked);
- running stream: one streaming /v1/completions (ignore_eos) is migrated
  once mid-stream; the client's largest inter-token gap (the pause) and the
  gap around the migration vs the median gap; the tokens must equal an
  unmigrated run (checked).

Stdlib only. See bench/README.md ("Live migration: migrate.py").

    /usr/bin/python3 bench/migrate.py --build build --out /tmp/migrate.json
"""
import argparse
import hashlib
import http.client
import json
import os
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
MiB = 1024 * 1024

SHAPES = {  # name: (layers, embd = head size)
    "2.3MiB": (1, 768),
    "12.4MiB": (1, 1792),
    "33MiB": (2, 2048),
}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("WKVM_BUILD_DIR", os.path.join(SRC, "build")),
                    help="build dir holding controld/ and workerd/ (default $WKVM_BUILD_DIR or ./build)")
    ap.add_argument("--sizes", default=",".join(SHAPES),
                    help="comma list of " + ", ".join(f"{k} (L{v[0]} C=N={v[1]})"
                                                      for k, v in SHAPES.items())
                    + ", or LxC entries like 1x1024 (default: all three)")
    ap.add_argument("--round-trips", type=int, default=20,
                    help="parked round trips per size (two migrations each, default 20)")
    ap.add_argument("--stream-tokens", type=int, default=600,
                    help="max_tokens of the migrated stream (default 600)")
    ap.add_argument("--migrate-after", type=int, default=200,
                    help="tokens received before the stream is migrated (default 200)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per worker (default 1)")
    ap.add_argument("--out", help="write JSON results here")
    ap.add_argument("--keep-logs", action="store_true", help="keep the temp dir")
    return ap.parse_args()


ARGS = parse_args()
os.environ["WKVM_BUILD_DIR"] = os.path.abspath(ARGS.build)
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
import wkvm_harness  # noqa: E402
from wkvm_harness import MKMODEL, Stack  # noqa: E402


def memcpy_dram(n):
    """Median seconds of an n-byte memcpy with the source out of cache (cycling
    over >= 256 MiB of sources), and with the same source each time (cached)."""
    dst = bytearray(n)
    md = memoryview(dst)
    k = max(2, (256 * MiB) // n)
    pool = [bytearray(b"\x33") * n for _ in range(k)]
    views = [memoryview(p) for p in pool]
    reps = max(60, 2 * k) if n < 8 * MiB else max(40, 2 * k)
    dram = []
    for i in range(reps):
        v = views[i % k]
        t = time.perf_counter()
        md[:] = v
        dram.append(time.perf_counter() - t)
    hot = []
    for _ in range(50):
        t = time.perf_counter()
        md[:] = views[0]
        hot.append(time.perf_counter() - t)
    sha = []
    for _ in range(10):
        t = time.perf_counter()
        hashlib.sha256(views[1]).digest()
        sha.append(time.perf_counter() - t)
    return {"bytes": n, "dram_s": percentile(dram, 50), "cached_s": percentile(hot, 50),
            "sha256_s": percentile(sha, 50)}


def parse_size(tok):
    if tok in SHAPES:
        return tok, SHAPES[tok]
    lyr, emb = tok.lower().split("x")
    return tok, (int(lyr), int(emb))


class Conn:
    """A keep-alive HTTP/1.1 connection; reconnects when the server closes it."""

    def __init__(self, port):
        self.port = port
        self.c = None

    def req(self, method, path, body=None, timeout=300):
        data = None if body is None else json.dumps(body).encode()
        for attempt in (0, 1):
            if self.c is None:
                self.c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
            try:
                self.c.request(method, path, body=data,
                               headers={"Content-Type": "application/json"} if data else {})
                r = self.c.getresponse()
                out = r.read()
                if (r.getheader("Connection") or "").lower() == "close":
                    self.c.close()
                    self.c = None
                return r.status, out
            except (http.client.HTTPException, ConnectionError, BrokenPipeError):
                self.c.close()
                self.c = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


def slots(conn):
    st, out = conn.req("GET", "/admin/slots")
    return json.loads(out)["slots"]


def stream_once(port, body, on_token=None):
    """Streams a completion; returns [(t, [ids])] for chunks carrying tokens."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)).encode(),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"stream: HTTP {r.status} {r.read()[:300]!r}")
    chunks = []
    n = 0
    while True:
        line = r.readline()
        if not line:
            break
        t = time.perf_counter()
        if not line.startswith(b"data: "):
            continue
        p = line[6:].strip()
        if p == b"[DONE]":
            break
        ev = json.loads(p)
        if "error" in ev:
            raise RuntimeError(f"stream error: {ev['error']}")
        ids = (ev.get("choices") or [{}])[0].get("token_ids") or []
        if ids:
            chunks.append((t, ids))
            n += len(ids)
            if on_token:
                on_token(n)
    conn.close()
    return chunks


def bench_size(label, layers, embd, tmpdir, mach):
    model = os.path.join(tmpdir, f"m-{layers}x{embd}")
    subprocess.run([MKMODEL, "--out", model, "--layers", str(layers), "--embd", str(embd),
                    "--head-size", str(embd), "--ffn", "64", "--vocab", "4096", "--dtype", "bf16"],
                   check=True, capture_output=True, timeout=600)
    data = os.path.join(tmpdir, f"data-{layers}x{embd}")
    os.makedirs(data)
    stack = Stack(model=model, workers_expected=2, slots=4, data=data,
                  extra_ctl=["--log-level", "info", "--heartbeat-ms", "1000"])
    out = {"label": label, "shape": f"L{layers} C{embd} H1 N{embd}", "loadavg_start":
           list(os.getloadavg())}
    try:
        stack.start_controller()
        stack.start_worker("w0", extra=["--threads", str(ARGS.threads)])
        stack.start_worker("w1", extra=["--threads", str(ARGS.threads)])
        stack.wait(lambda: stack.get("/ready").status == 200, "ready", timeout=600)
        ws = stack.get("/admin/workers").json()["workers"]
        sb = int(ws[0]["model"]["state_bytes"])
        assert sb == layers * (2 * embd + embd * embd) * 4, (sb, layers, embd)
        out["state_bytes"] = sb
        mid = stack.get("/v1/models").json()["data"][0]["id"]
        ref = memcpy_dram(sb)
        out["memcpy"] = ref
        c = Conn(stack.port)

        # Parked state: back and forth.
        st, body = c.req("POST", "/v1/states", {"model": mid, "name": "p",
                                                "prompt_ids": list(range(20, 52))})
        assert st == 201, body
        gen = {"max_tokens": 8, "temperature": 0, "return_token_ids": True}
        st, body = c.req("POST", "/v1/states/p@1/generate", gen)
        want = json.loads(body)["choices"][0]["token_ids"]
        parked = [s for s in slots(c) if s["state"] == "parked"]
        assert len(parked) == 1, parked
        cur = parked[0]
        wall, srv_total, srv_transfer = [], [], []
        for i in range(2 * ARGS.round_trips):
            dst = "w1" if cur["worker"] == "w0" else "w0"
            t0 = time.perf_counter()
            st, body = c.req("POST", f"/admin/slots/{cur['id']}/migrate", {"to": dst})
            dt = time.perf_counter() - t0
            rep = json.loads(body)
            if st != 200 or rep.get("result") != "committed":
                raise RuntimeError(f"migration {i}: HTTP {st} {rep}")
            assert rep["bytes"] == sb and rep["transport"] == "nng", rep
            wall.append(dt)
            srv_total.append(rep["seconds"]["total"])
            srv_transfer.append(rep["seconds"]["transfer"])
            w_, s_ = rep["to"].rsplit(":", 1)
            cur = {"id": rep["to"], "worker": w_}
        st, body = c.req("POST", "/v1/states/p@1/generate", gen)
        got = json.loads(body)["choices"][0]["token_ids"]
        assert got == want, ("state changed by migration", got, want)
        p50 = percentile(wall, 50)
        out["parked"] = {
            "n": len(wall), "wall_p50_ms": p50 * 1e3, "wall_p99_ms": percentile(wall, 99) * 1e3,
            "server_total_p50_ms": percentile(srv_total, 50) * 1e3,
            "server_transfer_p50_ms": percentile(srv_transfer, 50) * 1e3,
            "mb_s": sb / p50 / 1e6, "x_memcpy_dram": p50 / ref["dram_s"],
            "x_memcpy_cached": p50 / ref["cached_s"], "continues_exactly": True,
            "loadavg": list(os.getloadavg())}

        # Running stream, migrated once.
        sbody = {"model": mid, "prompt": [7, 8, 9, 10], "max_tokens": ARGS.stream_tokens,
                 "ignore_eos": True, "temperature": 0, "return_token_ids": True}
        st, body = c.req("POST", "/v1/completions", sbody)
        ref_ids = json.loads(body)["choices"][0]["token_ids"]
        trigger = threading.Event()
        mig = {}

        def on_token(n):
            if n >= ARGS.migrate_after and not trigger.is_set():
                trigger.set()

        def migrator():
            if not trigger.wait(120):
                mig["error"] = "stream never reached --migrate-after tokens"
                return
            mc = Conn(stack.port)
            run = [s for s in slots(mc) if s["state"] == "running"]
            if not run:
                mig["error"] = "no running slot"
                return
            src = run[0]
            dst = "w1" if src["worker"] == "w0" else "w0"
            mig["t0"] = time.perf_counter()
            st2, b2 = mc.req("POST", f"/admin/slots/{src['id']}/migrate", {"to": dst})
            mig["t1"] = time.perf_counter()
            mig["status"] = st2
            mig["reply"] = json.loads(b2)

        th = threading.Thread(target=migrator, daemon=True)
        th.start()
        chunks = stream_once(stack.port, sbody, on_token)
        th.join(timeout=300)
        ids = [i for _, x in chunks for i in x]
        if "error" in mig or mig.get("status") != 200 or \
                mig["reply"].get("result") != "committed":
            raise RuntimeError(f"stream migration failed: {mig}")
        assert ids == ref_ids, "migrated stream differs from the unmigrated run"
        times = [t for t, _ in chunks]
        gaps = [(b - a, a, b) for a, b in zip(times, times[1:])]
        biggest = max(gaps)
        # The gap that contains the end of the migrate request (the stream resumes after it).
        around = [g for g in gaps if g[1] <= mig["t1"] and g[2] >= mig["t0"]]
        around_gap = max(around)[0] if around else None
        med = percentile([g[0] for g in gaps], 50)
        rep = mig["reply"]
        out["stream"] = {
            "tokens": len(ids), "chunks": len(chunks), "migrated_after_tokens":
            sum(len(x) for t, x in chunks if t <= mig["t0"]),
            "median_gap_ms": med * 1e3, "p99_gap_ms": percentile([g[0] for g in gaps], 99) * 1e3,
            "largest_gap_ms": biggest[0] * 1e3,
            "largest_gap_is_the_migration": biggest[2] >= mig["t0"] and biggest[1] <= mig["t1"],
            "gap_at_migration_ms": None if around_gap is None else around_gap * 1e3,
            "migrate_request_ms": (mig["t1"] - mig["t0"]) * 1e3,
            "server_total_ms": rep["seconds"]["total"] * 1e3,
            "server_transfer_ms": rep["seconds"]["transfer"] * 1e3,
            "pause_x_median_gap": (around_gap / med) if around_gap and med else None,
            "identical_to_unmigrated": True, "loadavg": list(os.getloadavg())}
        for p in stack.procs:
            if p.poll() is not None:
                raise RuntimeError(f"a daemon exited during the run (rc {p.returncode})")
        with open(os.path.join(data, "controld.log"), "rb") as f:
            out["controller_log_migrations"] = [
                ln.decode(errors="replace").strip() for ln in f
                if b"migration " in ln][-3:]
    except BaseException:
        print(stack.tail(), file=sys.stderr)
        raise
    finally:
        stack.stop()
    return out


def fmt(x, nd=2):
    return "-" if x is None else f"{x:,.{nd}f}"


def tables(sizes):
    a = ["| state | shape | bytes | migrations | p50 ms | p99 ms | server total p50 ms | "
         "server transfer p50 ms | MB/s (p50) | memcpy DRAM ms | SHA-256 ms | x memcpy (DRAM) | "
         "x memcpy (cached) | load avg |",
         "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in sizes:
        p = s["parked"]
        a.append(f"| {s['label']} | {s['shape']} | {s['state_bytes']:,} | {p['n']} | "
                 f"{fmt(p['wall_p50_ms'])} | {fmt(p['wall_p99_ms'])} | "
                 f"{fmt(p['server_total_p50_ms'])} | {fmt(p['server_transfer_p50_ms'])} | "
                 f"{fmt(p['mb_s'], 0)} | {fmt(s['memcpy']['dram_s'] * 1e3, 3)} | "
                 f"{fmt(s['memcpy']['sha256_s'] * 1e3, 2)} | "
                 f"{fmt(p['x_memcpy_dram'], 0)} | {fmt(p['x_memcpy_cached'], 0)} | "
                 f"{p['loadavg'][0]:.1f} |")
    b = ["| state | tokens | migrated after | median gap ms | p99 gap ms | gap at migration ms | "
         "largest gap ms | largest = migration | migrate request ms | pause / median gap | "
         "load avg |",
         "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for s in sizes:
        r = s["stream"]
        b.append(f"| {s['label']} | {r['tokens']} | {r['migrated_after_tokens']} | "
                 f"{fmt(r['median_gap_ms'])} | {fmt(r['p99_gap_ms'])} | "
                 f"{fmt(r['gap_at_migration_ms'])} | {fmt(r['largest_gap_ms'])} | "
                 f"{'yes' if r['largest_gap_is_the_migration'] else 'no'} | "
                 f"{fmt(r['migrate_request_ms'])} | {fmt(r['pause_x_median_gap'], 1)} | "
                 f"{r['loadavg'][0]:.1f} |")
    return "\n".join(a), "\n".join(b)


def main():
    for exe in (wkvm_harness.CONTROLD, wkvm_harness.WORKERD, MKMODEL):
        if not os.access(exe, os.X_OK):
            sys.exit(f"migrate.py: {exe} not built (ninja -C {ARGS.build})")
    t_start = time.time()
    mach = machine()
    print(f"# wkvm migrate bench: {mach['cpu']}, {mach['cores']} cores, load "
          f"{mach['loadavg_start'][0]:.2f}; two CPU workers ({ARGS.threads} thread(s) each), "
          f"NNG transport", flush=True)
    tmpdir = tempfile.mkdtemp(prefix="wkvm-bench-migrate-")
    sizes = []
    try:
        for tok in [x.strip() for x in ARGS.sizes.split(",") if x.strip()]:
            label, (layers, embd) = parse_size(tok)
            r = bench_size(label, layers, embd, tmpdir, mach)
            sizes.append(r)
            p, s = r["parked"], r["stream"]
            print(f"  {label} ({r['state_bytes']:,} B): parked p50 {p['wall_p50_ms']:.2f} ms "
                  f"({p['mb_s']:.0f} MB/s, {p['x_memcpy_dram']:.0f}x memcpy); stream pause "
                  f"{fmt(s['gap_at_migration_ms'])} ms vs median gap {s['median_gap_ms']:.2f} ms",
                  flush=True)
    finally:
        if ARGS.keep_logs:
            print(f"kept {tmpdir}", file=sys.stderr)
        else:
            shutil.rmtree(tmpdir, ignore_errors=True)
    result = {"machine": mach, "config": {
        "round_trips": ARGS.round_trips, "stream_tokens": ARGS.stream_tokens,
        "migrate_after": ARGS.migrate_after, "threads_per_worker": ARGS.threads, "workers": 2,
        "model": "wkvm-mkmodel --layers L --embd C --head-size C --ffn 64 --vocab 4096 "
                 "--dtype bf16 (random weights)",
        "command": " ".join(["/usr/bin/python3" if sys.executable == "/usr/bin/python3"
                             else sys.executable] + sys.argv)},
        "sizes": sizes, "loadavg_end": list(os.getloadavg()), "wall_s": time.time() - t_start}
    a, b = tables(sizes)
    print("\nParked state, migrated between the two workers (one-way moves):\n")
    print(a)
    print("\nRunning stream, migrated once (client-side inter-token gaps):\n")
    print(b)
    print(f"\nload average: start {mach['loadavg_start'][0]:.2f}, end "
          f"{result['loadavg_end'][0]:.2f}; wall {result['wall_s']:.0f} s")
    if ARGS.out:
        with open(ARGS.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        print(f"\nwrote {ARGS.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
