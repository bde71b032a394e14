#!/usr/bin/env python3
"""Durable states benchmark: what the Durable State API costs on a 0.1B-shaped
model's state, each figure next to a plain memcpy of the same bytes measured
in the same run.

A real controller + one CPU worker on loopback (tests/integration/wkvm_harness.py),
a random-weight model with the shape of RWKV-7 0.1B (L12 C768 H12 N64 F3072
V65536 bf16, written once by wkvm-mkmodel): one state is
L * (2C + H*N*N) * 4 = 2,433,024 bytes (2.32 MiB). Measured, sequentially,
one request at a time:

- resume latency, p50/p99: POST /v1/states/{id}/generate with max_tokens 1
  from a hot state (the worker copies the cached slot into a scratch slot and
  runs one token), from a cold state whose blob is in the page cache, and
  from a cold state whose blob was evicted from the page cache first
  (`sync; echo 3 > /proc/sys/vm/drop_caches` when allowed, else
  posix_fadvise(DONTNEED) on the blob file); the same one-token step without
  a state (/v1/completions, 1-token prompt) is the baseline to subtract;
- POST .../hibernate and POST .../resume (blob -> slot, no token);
- fork (count 1 and 16) and snapshot;
- export and import throughput (MB/s of state file); import of a file whose
  blob the store already holds (verify only) and of a new one (blob write +
  fsync);
- density: blob bytes per state on disk (and LMDB bytes per record) against
  the state bytes; hot slots per GiB of worker RSS, from two standalone
  workers started with --slots 1 and --slots 65 (the RSS slope per slot);
- the reference: a memcpy of state_bytes in this Python process (memoryview
  slice assignment), once with the source in cache (the same buffers each
  time) and once from DRAM (cycling over 256 MiB of sources).

Stdlib only. See bench/README.md ("Durable states: states.py").

    /usr/bin/python3 bench/states.py --build build --out /tmp/states.json
"""
import argparse
import http.client
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import hashlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import machine, percentile  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)

SHAPE_01B = ["--layers", "12", "--embd", "768", "--head-size", "64", "--ffn", "3072",
             "--vocab", "65536", "--dtype", "bf16"]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("WKVM_BUILD_DIR", os.path.join(SRC, "build")),
                    help="build dir holding controld/ and workerd/ (default $WKVM_BUILD_DIR or ./build)")
    ap.add_argument("--model", help="model dir (default: a random RWKV-7 0.1B-shaped model, "
                    "L12 C768 H12 N64 F3072 V65536 bf16, written by wkvm-mkmodel into the temp dir)")
    ap.add_argument("--small-model", action="store_true",
                    help="same L/C/H/N (same state size) but F64 V4096: faster to write and load")
    ap.add_argument("--threads", type=int, default=0, help="worker CPU threads (0 = all cores)")
    ap.add_argument("--slots", type=int, default=8, help="worker slots (default 8)")
    ap.add_argument("--samples", type=int, default=30, help="samples per operation (default 30)")
    ap.add_argument("--cold-samples", type=int, default=15,
                    help="samples of the page-cache-evicted cold resume (default 15)")
    ap.add_argument("--cold-drop", choices=("auto", "drop_caches", "fadvise", "none"),
                    default="auto", help="how to evict the blob before a cold resume: "
                    "drop_caches (sync; echo 3 > /proc/sys/vm/drop_caches), fadvise "
                    "(posix_fadvise DONTNEED on the blob file), auto = drop_caches when "
                    "writable else fadvise (default)")
    ap.add_argument("--prompt-tokens", type=int, default=64, help="tokens of the state (64)")
    ap.add_argument("--density-states", type=int, default=32,
                    help="distinct states created for the disk density figure (32)")
    ap.add_argument("--no-rss", action="store_true", help="skip the standalone-worker RSS slope")
    ap.add_argument("--out", help="write JSON results here")
    ap.add_argument("--keep-logs", action="store_true", help="keep the temp dir")
    return ap.parse_args()


ARGS = parse_args()
os.environ["WKVM_BUILD_DIR"] = os.path.abspath(ARGS.build)
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
import wkvm_harness  # noqa: E402
from wkvm_harness import MKMODEL, Stack  # noqa: E402

MiB = 1024 * 1024


class Conn:
    """A keep-alive HTTP/1.1 connection; reconnects when the server closes it."""

    def __init__(self, port):
        self.port = port
        self.c = None

    def req(self, method, path, body=None, ctype="application/json", timeout=300):
        data = body if isinstance(body, (bytes, bytearray)) or body is None else \
            json.dumps(body).encode()
        for attempt in (0, 1):
            if self.c is None:
                self.c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
            try:
                hdrs = {"Content-Type": ctype} if data is not None else {}
                self.c.request(method, path, body=data, headers=hdrs)
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

    def timed(self, method, path, body=None, expect=(200, 201), **kw):
        t0 = time.perf_counter()
        st, out = self.req(method, path, body, **kw)
        dt = time.perf_counter() - t0
        if st not in expect:
            raise RuntimeError(f"{method} {path}: HTTP {st}: {out[:300]!r}")
        return dt, out


def scrape(stack):
    r = stack.get("/metrics", timeout=30)
    out = {}
    for line in r.body.decode().splitlines():
        if not line or line[0] == "#":
            continue
        try:
            key, val = line.rsplit(" ", 1)
            v = float(val)
        except ValueError:
            continue
        if 'le="' in key:
            continue
        out[key] = v
    return out


def memcpy_ref(n):
    """Median seconds of an n-byte memcpy: source in cache, and from DRAM."""
    src = bytearray(b"\x5a") * n
    dst = bytearray(n)
    ms, md = memoryview(src), memoryview(dst)
    for _ in range(10):
        md[:] = ms
    hot = []
    for _ in range(300):
        t = time.perf_counter()
        md[:] = ms
        hot.append(time.perf_counter() - t)
    k = max(2, (256 * MiB) // n)
    pool = [bytearray(b"\x33") * n for _ in range(k)]
    views = [memoryview(p) for p in pool]
    dram = []
    for i in range(max(200, 2 * k)):
        v = views[i % k]
        t = time.perf_counter()
        md[:] = v
        dram.append(time.perf_counter() - t)
    del pool, views
    return {"bytes": n, "cached_s": percentile(hot, 50), "dram_s": percentile(dram, 50),
            "cached_p99_s": percentile(hot, 99), "dram_p99_s": percentile(dram, 99)}


def drop_page_cache(mode, path):
    if mode == "drop_caches":
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    elif mode == "fadvise":
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def pick_drop_mode(probe_file):
    if ARGS.cold_drop != "auto":
        try:
            drop_page_cache(ARGS.cold_drop, probe_file)
            return ARGS.cold_drop, None
        except OSError as e:
            return "none", f"{ARGS.cold_drop} refused: {e}"
    try:
        drop_page_cache("drop_caches", probe_file)
        return "drop_caches", None
    except OSError as e:
        why = f"drop_caches refused: {e}"
    try:
        drop_page_cache("fadvise", probe_file)
        return "fadvise", why
    except OSError as e:
        return "none", why + f"; fadvise refused: {e}"


def admin_states(stack):
    """Every state (all owners), following the list's next cursor."""
    out, cursor = [], ""
    while True:
        j = stack.get("/admin/states?limit=1000" + (f"&after={cursor}" if cursor else "")).json()
        out += j["data"]
        cursor = j.get("next") or ""
        if not cursor:
            return out


def rss_slope(model, tmpdir):
    """Standalone workers (no controller) with --slots 1 and 65: RSS after load."""
    out = {}
    for slots in (1, 65):
        d = os.path.join(tmpdir, f"rss{slots}")
        os.makedirs(d, exist_ok=True)
        log = os.path.join(d, "worker.log")
        with open(log, "wb") as lf:
            p = subprocess.Popen([wkvm_harness.WORKERD, "--data-dir", d, "--id", f"rss{slots}",
                                  "--backend", "cpu", "--threads", "1", "--model", model,
                                  "--slots", str(slots), "--controller",
                                  f"ipc://{d}/nobody.ipc"], stdout=lf, stderr=subprocess.STDOUT)
        try:
            t0 = time.time()
            while time.time() - t0 < 300:
                with open(log, "rb") as f:
                    if b"model loaded" in f.read():
                        break
                if p.poll() is not None:
                    raise RuntimeError(f"standalone worker exited rc {p.returncode}")
                time.sleep(0.1)
            time.sleep(0.5)
            with open(f"/proc/{p.pid}/status") as f:
                st = {ln.split(":")[0]: ln.split(":")[1].strip() for ln in f if ":" in ln}
            out[slots] = int(st["VmRSS"].split()[0]) * 1024
        finally:
            p.terminate()
            p.wait(timeout=20)
    return out


def statefile_variant(blob, k):
    """The export file with state byte 0 of tensor data changed (k) and the checksum redone."""
    data_offset = struct.unpack_from("<Q", blob, 24)[0]
    b = bytearray(blob)
    struct.pack_into("<I", b, data_offset, 0x3f800000 + k)  # att_shift[0] of layer 0
    b[-32:] = hashlib.sha256(bytes(b[:-32])).digest()
    return bytes(b)


def stat_row(name, secs, nbytes, ref, note=""):
    p50, p99 = percentile(secs, 50), percentile(secs, 99)
    return {"op": name, "n": len(secs), "p50_ms": p50 * 1e3, "p99_ms": p99 * 1e3,
            "mean_ms": sum(secs) / len(secs) * 1e3,
            "mb_s": (nbytes / p50 / 1e6) if nbytes else None,
            "x_memcpy_dram": p50 / ref["dram_s"], "x_memcpy_cached": p50 / ref["cached_s"],
            "note": note, "loadavg": list(os.getloadavg())}


def fmt(x, nd=2):
    return "-" if x is None else f"{x:,.{nd}f}"


def table(rows, ref):
    out = ["| operation | n | p50 ms | p99 ms | MB/s (p50) | x memcpy (DRAM) | "
           "x memcpy (cached) | load avg | note |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    out.append(f"| memcpy {ref['bytes']:,} B, source from DRAM | {ref.get('n', 200)} | "
               f"{fmt(ref['dram_s'] * 1e3, 3)} | {fmt(ref['dram_p99_s'] * 1e3, 3)} | "
               f"{fmt(ref['bytes'] / ref['dram_s'] / 1e6, 0)} | 1 | - | - | reference |")
    out.append(f"| memcpy {ref['bytes']:,} B, source in cache | 300 | "
               f"{fmt(ref['cached_s'] * 1e3, 3)} | {fmt(ref['cached_p99_s'] * 1e3, 3)} | "
               f"{fmt(ref['bytes'] / ref['cached_s'] / 1e6, 0)} | - | 1 | - | reference |")
    for r in rows:
        out.append(f"| {r['op']} | {r['n']} | {fmt(r['p50_ms'])} | {fmt(r['p99_ms'])} | "
                   f"{fmt(r['mb_s'], 0)} | {fmt(r['x_memcpy_dram'], 0)} | "
                   f"{fmt(r['x_memcpy_cached'], 0)} | {r['loadavg'][0]:.1f} | {r['note']} |")
    return "\n".join(out)


def main():
    for exe in (wkvm_harness.CONTROLD, wkvm_harness.WORKERD, MKMODEL):
        if not os.access(exe, os.X_OK):
            sys.exit(f"states.py: {exe} not built (ninja -C {ARGS.build})")
    t_start = time.time()
    tmpdir = tempfile.mkdtemp(prefix="wkvm-bench-states-")
    mach = machine()
    model = ARGS.model
    shape = SHAPE_01B if not ARGS.small_model else \
        ["--layers", "12", "--embd", "768", "--head-size", "64", "--ffn", "64", "--vocab", "4096",
         "--dtype", "bf16"]
    if model is None:
        model = os.path.join(tmpdir, "rwkv7-0.1b-shape")
        t0 = time.time()
        subprocess.run([MKMODEL, "--out", model, *shape], check=True, capture_output=True,
                       timeout=600)
        print(f"# wrote {model} ({' '.join(shape)}) in {time.time() - t0:.1f} s", flush=True)
    model = os.path.abspath(model)
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    data = os.path.join(tmpdir, "data")
    os.makedirs(data)
    stack = Stack(model=model, slots=ARGS.slots, data=data,
                  extra_ctl=["--log-level", "info", "--heartbeat-ms", "1000",
                             "--max-states-per-user", "0"])
    result = {"machine": mach, "config": {
        "model": ARGS.model or ("wkvm-mkmodel " + " ".join(shape) + " (random weights)"),
        "model_config": {k: cfg.get(k) for k in ("num_hidden_layers", "hidden_size", "head_dim",
                                                 "num_heads", "intermediate_size", "vocab_size",
                                                 "torch_dtype")},
        "slots": ARGS.slots, "threads": ARGS.threads, "samples": ARGS.samples,
        "cold_samples": ARGS.cold_samples, "prompt_tokens": ARGS.prompt_tokens,
        
        "command": " ".join(["/usr/bin/python3" if sys.executable == "/usr/bin/python3"
                             else sys.executable] + sys.argv)}}
    rows = []
    try:
        stack.start_controller()
        # The worker's warm tier holds exactly one state, so that hibernating
        # "coldst" then "warmst" leaves one of each (the second put evicts the first).
        cfg = json.load(open(os.path.join(model, "config.json")))
        L, C, N = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["head_dim"]
        sb_expect = L * (2 * C + (C // N) * N * N) * 4
        stack.start_worker("w0", extra=["--threads", str(ARGS.threads),
                                        "--host-cache-bytes", str(sb_expect)])
        stack.wait(lambda: stack.get("/ready").status == 200, "ready", timeout=600)
        w = stack.get("/admin/workers").json()["workers"][0]
        sb = int(w["model"]["state_bytes"])
        model_id = stack.get("/v1/models").json()["data"][0]["id"]
        result["state_bytes"] = sb
        print(f"# wkvm states bench: {mach['cpu']}, {mach['cores']} cores, load "
              f"{mach['loadavg_start'][0]:.2f}; state {sb:,} B ({sb / MiB:.2f} MiB)", flush=True)
        ref = memcpy_ref(sb)
        result["memcpy"] = ref
        blob = bytes(bytearray(b"\x5a") * sb)
        sha = []
        for _ in range(30):
            t0 = time.perf_counter()
            hashlib.sha256(blob).digest()
            sha.append(time.perf_counter() - t0)
        del blob
        print(f"  memcpy {sb:,} B: {ref['dram_s'] * 1e3:.3f} ms from DRAM, "
              f"{ref['cached_s'] * 1e3:.3f} ms cached", flush=True)
        c = Conn(stack.port)
        rng = random.Random(7)
        vocab = int(cfg.get("vocab_size", 65536))
        prompt = [rng.randrange(300, vocab) for _ in range(ARGS.prompt_tokens)]
        N = ARGS.samples

        # Create the state (prefill + slot read + blob write).
        creates = []
        for i in range(N):
            dt, out = c.timed("POST", "/v1/states", {"model": model_id, "name": f"c{i}",
                                                     "prompt_ids": [300 + i] + prompt[1:]})
            creates.append(dt)
        dt, out = c.timed("POST", "/v1/states", {"model": model_id, "name": "base",
                                                 "prompt_ids": prompt})
        base = json.loads(out)
        assert base["tier"] == "hot", base
        rows.append(stat_row("SHA-256 of the state bytes (hashlib, this process)", sha, sb, ref,
                             "the store verifies every blob read with it"))
        rows.append(stat_row(f"create ({ARGS.prompt_tokens}-token prefill + read + blob write)",
                             creates, 0, ref, "for scale"))

        # Interleaved, so that the machine's load drifts over all of them alike:
        # baseline (one token, no state), hot resume, cold resume (blob in page cache).
        # "base" stays hot; "coldst" (other bytes) is hibernated and stays cold: a
        # generate from a cold state reads the blob into the scratch slot and does
        # not re-cache it.
        dt, out = c.timed("POST", "/v1/states", {"model": model_id, "name": "coldst",
                                                 "prompt_ids": [299] + prompt[1:]})
        c.timed("POST", "/v1/states/coldst@1/hibernate")
        c.timed("POST", "/v1/states", {"model": model_id, "name": "warmst",
                                       "prompt_ids": [298] + prompt[1:]})
        c.timed("POST", "/v1/states/warmst@1/hibernate")
        gen_body = {"max_tokens": 1, "temperature": 0, "return_token_ids": True}
        _, out = c.timed("POST", "/v1/states/base@1/generate", gen_body)
        first_tok = json.loads(out)["choices"][0]["token_ids"]
        _, out = c.timed("POST", "/v1/states/coldst@1/generate", gen_body)
        cold_tok = json.loads(out)["choices"][0]["token_ids"]
        _, out = c.timed("POST", "/v1/states/warmst@1/generate", gen_body)
        warm_tok = json.loads(out)["choices"][0]["token_ids"]
        plain, hot, cold, warm = [], [], [], []
        m0 = scrape(stack)
        for i in range(N):
            dt, _ = c.timed("POST", "/v1/completions", {"model": model_id, "prompt": [prompt[-1]],
                                                        "max_tokens": 1, "temperature": 0})
            plain.append(dt)
            dt, out = c.timed("POST", "/v1/states/base@1/generate", gen_body)
            assert json.loads(out)["choices"][0]["token_ids"] == first_tok
            hot.append(dt)
            dt, out = c.timed("POST", "/v1/states/coldst@1/generate", gen_body)
            assert json.loads(out)["choices"][0]["token_ids"] == cold_tok
            cold.append(dt)
            dt, out = c.timed("POST", "/v1/states/warmst@1/generate", gen_body)
            assert json.loads(out)["choices"][0]["token_ids"] == warm_tok
            warm.append(dt)
        m1 = scrape(stack)
        for ref_id, tier in (("base@1", "hot"), ("coldst@1", "cold"), ("warmst@1", "warm")):
            st = json.loads(c.req("GET", f"/v1/states/{ref_id}")[1])
            assert st["tier"] == tier, st
        rows.append(stat_row("1-token completion, no state (baseline)", plain, 0, ref,
                             "fresh slot + 1 token"))
        rows.append(stat_row("resume hot: generate max_tokens 1", hot, sb, ref,
                             "slot copy + 1 token"))
        rows.append(stat_row("resume warm (worker host memory): generate max_tokens 1", warm, sb,
                             ref, "HOST_GET copy in the worker + 1 token"))
        rows.append(stat_row("resume cold, blob in page cache: generate max_tokens 1", cold, sb,
                             ref, "blob read + SHA-256 + SlotWrite + 1 token"))
        result["step_seconds_per_request"] = (m1.get("wkvm_step_seconds_sum", 0) -
                                              m0.get("wkvm_step_seconds_sum", 0)) / (4 * N)

        # cold, evicted from the page cache first (paired with a page-cached one)
        blobs = os.path.join(data, "blobs")
        blob_of = {x["id"]: x["blob"] for x in admin_states(stack)}
        blob_path = os.path.join(blobs, blob_of["coldst@1"])
        mode, why = pick_drop_mode(blob_path)
        result["cold_drop"] = {"mode": mode, "note": why}
        print(f"  cold eviction: {mode}" + (f" ({why})" if why else ""), flush=True)
        if mode != "none":
            cold2, drop_s = [], []
            for i in range(ARGS.cold_samples):
                t0 = time.perf_counter()
                drop_page_cache(mode, blob_path)
                drop_s.append(time.perf_counter() - t0)
                time.sleep(0.05)
                dt, out = c.timed("POST", "/v1/states/coldst@1/generate", gen_body)
                assert json.loads(out)["choices"][0]["token_ids"] == cold_tok
                cold2.append(dt)
            rows.append(stat_row(f"resume cold, page cache dropped ({mode}): generate max_tokens 1",
                                 cold2, sb, ref, "disk read + SHA-256 + SlotWrite + 1 token"))
            result["cold_drop"]["drop_p50_s"] = percentile(drop_s, 50)

        # hibernate / resume pairs (slot -> warm copy in the worker -> slot, no token)
        hib, res = [], []
        for i in range(N):
            dt, out = c.timed("POST", "/v1/states/base@1/hibernate")
            assert json.loads(out)["tier"] == "warm"
            hib.append(dt)
            dt, out = c.timed("POST", "/v1/states/base@1/resume")
            assert json.loads(out)["tier"] == "hot"
            res.append(dt)
        rows.append(stat_row("hibernate (slot -> worker host memory; bytes already on disk)", hib,
                             sb, ref, "HOST_PUT copy in the worker, slot freed"))
        rows.append(stat_row("resume from warm, no token (host memory -> slot)", res, sb, ref,
                             "HOST_GET copy in the worker"))

        # fork and snapshot (metadata only: the child shares the blob), interleaved
        f1, f16, snap = [], [], []
        for i in range(N):
            dt, _ = c.timed("POST", "/v1/states/base@1/fork", {"name": f"f{i}", "count": 1})
            f1.append(dt)
            dt, _ = c.timed("POST", "/v1/states/base@1/snapshot")
            snap.append(dt)
            if i % 3 == 0:
                dt, out = c.timed("POST", "/v1/states/base@1/fork",
                                  {"name": f"g{i}", "count": 16})
                assert len(json.loads(out)["data"]) == 16
                f16.append(dt)
        rows.append(stat_row("fork count 1", f1, sb, ref, "1 record (LMDB commit), blob shared"))
        rows.append(stat_row("fork count 16", f16, 16 * sb, ref,
                             "16 records, one commit each; MB/s as if copied"))
        rows.append(stat_row("snapshot", snap, sb, ref, "1 record (LMDB commit), blob shared"))

        # export / import
        exp = []
        for i in range(N):
            dt, file_bytes = c.timed("GET", "/v1/states/base@1/export")
            exp.append(dt)
        fb = len(file_bytes)
        result["state_file_bytes"] = fb
        rows.append(stat_row("export (GET .../export)", exp, fb, ref,
                             f"file {fb:,} B: blob read + SHA-256 x2"))
        imp_same, imp_new = [], []
        variants = [statefile_variant(file_bytes, i + 1) for i in range(N)]
        for i in range(N):
            dt, _ = c.timed("POST", f"/v1/states/import?name=same{i}", file_bytes,
                            ctype="application/octet-stream")
            imp_same.append(dt)
            dt, out = c.timed("POST", f"/v1/states/import?name=new{i}", variants[i],
                              ctype="application/octet-stream")
            imp_new.append(dt)
        rows.append(stat_row("import, blob already stored", imp_same, fb, ref,
                             "parse + SHA-256 + verify existing blob"))
        rows.append(stat_row("import, new blob", imp_new, fb, ref,
                             "parse + SHA-256 + blob write + fsync"))

        # density: distinct blobs on disk
        admin = admin_states(stack)
        n_states = len(admin)
        distinct = {x["blob"] for x in admin}
        apparent = alloc = 0
        for name in os.listdir(blobs):
            stt = os.stat(os.path.join(blobs, name))
            apparent += stt.st_size
            alloc += stt.st_blocks * 512
        lmdb = 0
        for root, _, files in os.walk(data):
            for fn in files:
                if fn.endswith(".mdb"):
                    stt = os.stat(os.path.join(root, fn))
                    lmdb += stt.st_blocks * 512
        nblob = len(os.listdir(blobs))
        dens = {"states": n_states, "distinct_blobs": len(distinct), "blob_files": nblob,
                "blob_apparent_bytes": apparent, "blob_alloc_bytes": alloc,
                "lmdb_alloc_bytes": lmdb,
                "blob_bytes_per_blob": alloc / nblob if nblob else None,
                "state_bytes": sb,
                "cold_states_per_gib_distinct": (1 << 30) / (alloc / nblob) if nblob else None,
                "cold_states_per_gib_all": (1 << 30) / ((alloc + lmdb) / n_states)
                if n_states else None}
        m = scrape(stack)
        dens["controller_rss_bytes"] = None
        try:
            with open(f"/proc/{stack.ctl.pid}/status") as f:
                for ln in f:
                    if ln.startswith("VmRSS:"):
                        dens["controller_rss_bytes"] = int(ln.split()[1]) * 1024
            wp = stack.workers["w0"].pid
            with open(f"/proc/{wp}/status") as f:
                for ln in f:
                    if ln.startswith("VmRSS:"):
                        dens["worker_rss_bytes"] = int(ln.split()[1]) * 1024
        except OSError:
            pass
        dens["states_hot_gauge"] = m.get("wkvm_states_hot")
        result["density"] = dens
        for p in stack.procs:
            if p.poll() is not None:
                raise RuntimeError(f"a daemon exited during the run (rc {p.returncode})")
    except BaseException:
        print(stack.tail(), file=sys.stderr)
        raise
    finally:
        stack.stop()
    try:
        if not ARGS.no_rss:
            rss = rss_slope(model, tmpdir)
            per_slot = (rss[65] - rss[1]) / 64
            result["density"].update({
                "worker_rss_slots1": rss[1], "worker_rss_slots65": rss[65],
                "worker_rss_per_slot": per_slot,
                "hot_slots_per_gib_marginal": (1 << 30) / per_slot if per_slot > 0 else None,
                "hot_slots_per_gib_state_bytes": (1 << 30) / sb})
    finally:
        if ARGS.keep_logs:
            print(f"kept {tmpdir}", file=sys.stderr)
        else:
            shutil.rmtree(tmpdir, ignore_errors=True)
    result["rows"] = rows
    result["loadavg_end"] = list(os.getloadavg())
    result["wall_s"] = time.time() - t_start
    print()
    print(table(rows, ref))
    d = result["density"]
    print()
    print("| density | value |")
    print("|---|---:|")
    print(f"| state bytes | {sb:,} |")
    print(f"| states stored (distinct blobs / files) | {d['states']} ({d['distinct_blobs']} / "
          f"{d['blob_files']}) |")
    print(f"| disk bytes per blob (allocated) | {d['blob_bytes_per_blob']:,.0f} "
          f"({d['blob_bytes_per_blob'] / sb:.4f} x state) |")
    print(f"| LMDB bytes (allocated, all records) | {d['lmdb_alloc_bytes']:,} |")
    print(f"| cold states per GiB of disk (distinct bytes) | "
          f"{d['cold_states_per_gib_distinct']:,.1f} |")
    print(f"| cold states per GiB, all states incl. shared forks + LMDB | "
          f"{d['cold_states_per_gib_all']:,.1f} |")
    if "worker_rss_per_slot" in d:
        print(f"| worker RSS, --slots 1 / 65 | {d['worker_rss_slots1'] / MiB:,.1f} MiB / "
              f"{d['worker_rss_slots65'] / MiB:,.1f} MiB |")
        print(f"| worker RSS per extra slot | {d['worker_rss_per_slot']:,.0f} B "
              f"({d['worker_rss_per_slot'] / sb:.3f} x state) |")
        print(f"| hot slots per GiB of worker RSS (marginal) | "
              f"{d['hot_slots_per_gib_marginal']:,.1f} |")
    print(f"\nload average: start {mach['loadavg_start'][0]:.2f}, end "
          f"{result['loadavg_end'][0]:.2f}; wall {result['wall_s']:.0f} s; cold eviction "
          f"{result['cold_drop']['mode']}")
    if ARGS.out:
        with open(ARGS.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        print(f"\nwrote {ARGS.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
