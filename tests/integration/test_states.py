"""Durable State API integration tests: every state operation continues
bit-identically to the uninterrupted run, nothing is lost across restarts,
users never see each other's states, and bad input is refused clearly."""
import glob
import http.client as http_client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import MKMODEL, Stack, http, run_tests  # noqa: E402

TMP = tempfile.TemporaryDirectory(prefix="wkvm-states-")


def mkmodel(name, seed):
    d = os.path.join(TMP.name, name)
    subprocess.run([MKMODEL, "--out", d, "--layers", "2", "--embd", "64", "--head-size", "16",
                    "--ffn", "128", "--vocab", "512", "--seed", str(seed)], check=True,
                   capture_output=True, timeout=60)
    return d


MODEL = mkmodel("tiny", 7)
OTHER = mkmodel("other", 8)
P = [5, 6, 7, 8, 9, 10, 11, 12, 300, 301, 17]
Q = [40, 41, 42]
SAMPLING = [dict(temperature=0), dict(temperature=0.8, top_p=0.95, seed=1234)]


def up(s, workers=1):
    s.start_controller()
    for i in range(workers):
        s.start_worker(f"w{i}")
    s.wait(lambda: s.get("/ready").status == 200, "ready")


def baseline(s, tokens, n=12, **samp):
    body = {"model": "tiny", "prompt": tokens, "max_tokens": n, "return_token_ids": True,
            "ignore_eos": True}
    body.update(samp)
    r = s.post("/v1/completions", body=body)
    assert r.status == 200, r.body
    return r.json()["choices"][0]["token_ids"]


def gen(s, ref, prompt_ids=None, n=12, save_as=None, **samp):
    body = {"max_tokens": n, "return_token_ids": True, "ignore_eos": True}
    if prompt_ids:
        body["prompt_ids"] = prompt_ids
    if save_as:
        body["save_as"] = save_as
    body.update(samp)
    r = s.post(f"/v1/states/{ref}/generate", body=body)
    assert r.status == 200, r.body
    return r.json()


def create(s, name, tokens, expect=201, **kw):
    r = s.post("/v1/states", body={"model": "tiny", "name": name, "prompt_ids": tokens}, **kw)
    assert r.status == expect, r.body
    return r.json()


def check_continuations(s, ref):
    for samp in SAMPLING:
        want = baseline(s, P + Q, **samp)
        got = gen(s, ref, Q, **samp)["choices"][0]["token_ids"]
        assert got == want, (ref, samp, got, want)


ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DOC_URL = "http://127.0.0.1:8000"


def doc_curl_lines():
    """(file, line) of every curl command against DOC_URL in the README's and the docs'
    ```sh blocks, as a newcomer would paste them."""
    out = []
    for rel in ["README.md"] + ["docs/" + f for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
                                if f.endswith(".md")]:
        block = False
        with open(os.path.join(ROOT, rel)) as f:
            for ln in f:
                if ln.startswith("```"):
                    block = ln.strip() in ("```sh", "```bash") and not block
                    continue
                if block and ln.startswith("curl ") and "127.0.0.1:8000" in ln:
                    out.append((rel, ln.rstrip("\n")))
    return out


def run_doc_commands(s):
    """The docs' curl commands run against a live stack (DOC_URL is the stack's URL): each
    exits 0 and answers no error; the README's claims about them hold."""
    lines = doc_curl_lines()
    assert any("'http://" in ln or " http://" in ln for _, ln in lines), lines
    bare = [(f, ln) for f, ln in lines
            if ln.count("127.0.0.1:8000") != ln.count("http://127.0.0.1:8000")]
    assert not bare, "curl examples without http:// (wkvmctl --url needs it): %s" % bare
    outs = []
    with tempfile.TemporaryDirectory() as cwd:
        for rel, ln in lines:
            cmd = ln.replace(DOC_URL, s.url)
            p = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], cwd=cwd,
                               capture_output=True, text=True, timeout=60)
            assert p.returncode == 0, (rel, ln, p.returncode, p.stdout[-500:], p.stderr[-500:])
            try:
                body = json.loads(p.stdout)
            except ValueError:
                body = None
            assert not (isinstance(body, dict) and "error" in body), (rel, ln, body)
            outs.append((ln, body))
    gens = [b for ln, b in outs if "intro@1/generate" in ln]
    assert len(gens) == 2 and gens[0]["choices"] == gens[1]["choices"], gens  # "twice"
    hib = [b for ln, b in outs if "/hibernate" in ln]
    assert hib and hib[0]["tier"] == "warm", hib  # "tier warm", as the README says


def test_create_generate_and_ops():
    with Stack(model=MODEL, slots=3) as s:
        up(s)
        st = create(s, "base", P)
        assert st["id"] == "base@1" and st["tokens"] == len(P) and st["tier"] == "hot", st
        check_continuations(s, "base@1")
        # The source is untouched by generation.
        check_continuations(s, "base@1")
        # Hibernate then resume.
        r = s.post("/v1/states/base@1/hibernate")
        assert r.status == 200 and r.json()["tier"] == "warm", r.body  # slot freed, copy in RAM
        check_continuations(s, "base@1")  # runs from the worker's host memory
        r = s.post("/v1/states/base@1/resume")
        assert r.status == 200 and r.json()["tier"] == "hot", r.body
        check_continuations(s, "base@1")
        # Fork: children continue identically; snapshot too.
        kids = s.post("/v1/states/base@1/fork", body={"name": "kid", "count": 3}).json()["data"]
        assert [k["id"] for k in kids] == ["kid@1", "kid@2", "kid@3"]
        assert all(k["parent"] == "base@1" and k["op"] == "fork" for k in kids)
        check_continuations(s, "kid@2")
        snap = s.post("/v1/states/base@1/snapshot")
        assert snap.status == 201 and snap.json()["id"] == "base@2", snap.body
        check_continuations(s, "base@2")
        # Generate with save_as, then continue from the saved state: equals one long run.
        g = gen(s, "base@1", Q, n=6, save_as="cont", temperature=0)
        saved = g["state"]
        assert saved["id"] == "cont@1" and saved["tokens"] == len(P) + len(Q) + 6, saved
        first = g["choices"][0]["token_ids"]
        more = gen(s, "cont@1", None, n=6, temperature=0)["choices"][0]["token_ids"]
        assert first + more == baseline(s, P + Q, n=12, temperature=0)
        # Export, then import: a new id, the same continuation.
        blob = http("GET", s.url + "/v1/states/base@1/export")
        assert blob.status == 200 and blob.body[:8] == b"WKVMSTAT", blob.body[:16]
        imp = http("POST", s.url + "/v1/states/import?name=again", body=blob.body)
        assert imp.status == 201 and imp.json()["id"] == "again@1", imp.body
        check_continuations(s, "again@1")
        # Versions and rollback.
        vs = s.get("/v1/states/base/versions").json()["data"]
        assert [v["id"] for v in vs] == ["base@1", "base@2"]
        rb = s.post("/v1/states/base@1/rollback")
        assert rb.status == 201 and rb.json()["id"] == "base@3" and rb.json()["op"] == "rollback"
        check_continuations(s, "base@3")
        # Many states, few slots: LRU eviction keeps everything reachable.
        for i in range(6):
            create(s, f"many{i}", P[: 3 + i])
        for i in range(6):
            want = baseline(s, P[: 3 + i] + Q, n=6, temperature=0)
            got = gen(s, f"many{i}@1", Q, n=6, temperature=0)["choices"][0]["token_ids"]
            assert got == want, i
        # Deleting a version keeps the counter: numbers are never reused.
        assert http("DELETE", s.url + "/v1/states/base@3").status == 200
        again = s.post("/v1/states/base@1/snapshot").json()
        assert again["id"] == "base@4", again
        assert s.get("/v1/states/base@3").status == 404
        run_doc_commands(s)
        # State operations and refused requests leave an info line each.
        assert s.get("/v1/states/nope@1").status == 404
        with open(os.path.join(s.data, "controld.log")) as f:
            log = f.read()
        for want in ("state created id=base@1", "state fork id=base@1", "state snapshot id=base@1",
                     "state hibernated id=base@1", "state resumed id=base@1",
                     "state saved id=cont@1", "state imported id=again@1",
                     "state rollback id=base@1", "state deleted id=base@3",
                     "refused GET /v1/states/nope@1 user=local status=404"):
            assert want in log, (want, log[-3000:])


def test_restarts():
    with Stack(model=MODEL, slots=3) as s:
        up(s)
        create(s, "keep", P)
        want = {json.dumps(x): baseline(s, P + Q, **x) for x in SAMPLING}
        # The controller dies hard and comes back: the state is there (cold) and identical.
        s.kill_controller()
        s.start_controller()
        s.wait(lambda: s.get("/ready").status == 200, "ready after controller restart")
        st = s.get("/v1/states/keep@1").json()
        assert st["tokens"] == len(P) and st["token_ids"] == P, st
        for x in SAMPLING:
            assert gen(s, "keep@1", Q, **x)["choices"][0]["token_ids"] == want[json.dumps(x)]
        # The worker dies after a hibernate and comes back: the warm copy died
        # with it, and the state runs from its blob.
        assert s.post("/v1/states/keep@1/resume").json()["tier"] == "hot"
        r = s.post("/v1/states/keep@1/hibernate")
        assert r.status == 200 and r.json()["tier"] == "warm", r.body
        s.kill_worker("w0")
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready after worker restart")
        assert s.get("/v1/states/keep@1").json()["tier"] == "cold"
        for x in SAMPLING:
            assert gen(s, "keep@1", Q, **x)["choices"][0]["token_ids"] == want[json.dumps(x)]
        # A hot state whose worker restarted falls back to its blob.
        assert s.post("/v1/states/keep@1/resume").json()["tier"] == "hot"
        s.kill_worker("w0")
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready after second worker restart")
        assert gen(s, "keep@1", Q, temperature=0)["choices"][0]["token_ids"] == \
            want[json.dumps(SAMPLING[0])]


def test_cold_without_host_cache():
    """A worker without a host cache hibernates states straight to disk."""
    with Stack(model=MODEL, slots=2) as s:
        s.start_controller()
        s.start_worker("w0", extra=["--host-cache-bytes", "0"])
        s.wait(lambda: s.get("/ready").status == 200, "ready")
        create(s, "c", P)
        r = s.post("/v1/states/c@1/hibernate")
        assert r.status == 200 and r.json()["tier"] == "cold", r.body
        check_continuations(s, "c@1")
        assert s.post("/v1/states/c@1/hibernate").json()["tier"] == "cold"
        assert s.post("/v1/states/c@1/resume").json()["tier"] == "hot"
        # read back from the disk, the slot holds all its tokens but the last
        parked = [x for x in s.get("/admin/slots").json()["slots"] if x["holds"] == "state"]
        assert [x["tokens"] for x in parked] == [len(P) - 1], parked


def test_bad_input_and_damage():
    data = tempfile.mkdtemp(dir=TMP.name)
    with Stack(model=MODEL, slots=2, data=data) as s:
        up(s)
        create(s, "x", P)
        assert s.get("/v1/states/nope@1").status == 404
        assert s.post("/v1/states/nope@1/generate", body={"max_tokens": 2}).status == 404
        r = s.post("/v1/states", body={"name": "bad name!", "prompt_ids": [1]})
        assert r.status == 400 and r.json()["error"]["param"] == "name", r.body
        r = s.post("/v1/states", body={"name": "y"})
        assert r.status == 400 and r.json()["error"]["param"] == "prompt"
        r = s.post("/v1/states", body={"name": "y", "prompt_ids": [1, 99999]})
        assert r.status == 400
        r = s.post("/v1/states/x@1/fork", body={"count": 2})
        assert r.status == 400 and r.json()["error"]["param"] == "name"
        r = s.post("/v1/states/x@1/frobnicate")
        assert r.status == 404
        r = http("PUT", s.url + "/v1/states/x@1/generate", body={})
        assert r.status == 405
        # Import refusals: truncated, corrupted, another model's file.
        good = http("GET", s.url + "/v1/states/x@1/export").body
        for bad, why in ((good[:100], "truncated"), (good[:-1], "truncated"),
                         (good[:60] + bytes([good[60] ^ 1]) + good[61:], "flipped"),
                         (b"hello", "junk")):
            r = http("POST", s.url + "/v1/states/import", body=bad)
            assert r.status == 400 and "state file" in r.json()["error"]["message"], (why, r.body)
    with Stack(model=OTHER, slots=2) as s2:
        up(s2)
        r = http("POST", s2.url + "/v1/states/import", body=good)
        assert r.status == 400 and "model" in r.json()["error"]["message"], r.body
    # A corrupted blob is detected on read: the state is reported damaged, nothing crashes.
    with Stack(model=MODEL, slots=2, data=data) as s:
        up(s)
        assert s.post("/v1/states/x@1/hibernate").status == 200
        blobs = glob.glob(os.path.join(data, "blobs", "*"))
        assert len(blobs) == 1, blobs
        with open(blobs[0], "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0xFF]))
        r = s.post("/v1/states/x@1/generate", body={"max_tokens": 2})
        assert r.status == 500 and r.json()["error"]["code"] == "corrupt_data", r.body
        assert s.get("/v1/states/x@1").json()["damaged"] is True
        assert s.get("/health").status == 200


def test_owner_isolation():
    keys = os.path.join(TMP.name, "keys")
    with open(keys, "w") as f:
        f.write("sk-alice-000000001 alice\nsk-bob-00000000002 bob\nsk-ops-00000000003 ops admin\n")
    os.chmod(keys, 0o600)  # the controller refuses a key file others may read
    alice = {"Authorization": "Bearer sk-alice-000000001"}
    bob = {"Authorization": "Bearer sk-bob-00000000002"}
    ops = {"Authorization": "Bearer sk-ops-00000000003"}
    with Stack(model=MODEL, slots=2, extra_ctl=["--api-keys", keys]) as s:
        up(s)
        assert s.get("/admin/workers", headers=ops).status == 200
        s.wait(lambda: s.get("/ready").status == 200, "ready")
        create(s, "mine", P, headers=alice)
        create(s, "mine", P[:4], headers=bob)  # same name, another user: independent
        assert s.get("/v1/states/mine@1", headers=alice).json()["tokens"] == len(P)
        assert s.get("/v1/states/mine@1", headers=bob).json()["tokens"] == 4
        assert s.get("/v1/states", headers=alice).json()["data"][0]["tokens"] == len(P)
        create(s, "secret", P, headers=alice)
        for path in ("/v1/states/secret@1", "/v1/states/secret@1/export"):
            assert s.get(path, headers=bob).status == 404
        assert s.post("/v1/states/secret@1/generate", body={"max_tokens": 1},
                      headers=bob).status == 404
        assert http("DELETE", s.url + "/v1/states/secret@1", headers=bob).status == 404
        assert s.get("/v1/states").status == 401
        everyone = s.get("/admin/states", headers=ops).json()["data"]
        assert sorted((x["owner"], x["id"]) for x in everyone) == \
            [("alice", "mine@1"), ("alice", "secret@1"), ("bob", "mine@1")]
        assert s.get("/admin/states", headers=alice).status == 403


def long_stream(s, n):
    """A streamed completion that keeps the stack's only slot busy: (connection, response)."""
    c = http_client.HTTPConnection("127.0.0.1", s.port, timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps(
        {"model": "tiny", "prompt": P, "max_tokens": n, "ignore_eos": True, "stream": True}),
        headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.status
    s.wait(lambda: s.workers_list()[0]["slots_used"] == 1, "the request runs")
    return c, r


def test_slot_wait():
    """A state operation waits for a running request's slot (as a chat waits in
    the queue) instead of failing at once; --slot-wait-ms 0 answers 503."""
    with Stack(model=MODEL, slots=1) as s:
        up(s)
        c, r = long_stream(s, 1500)
        t0 = time.time()
        created = create(s, "waited", P)  # 503 no_capacity before slot waiting existed
        assert created["tokens"] == len(P)
        body = r.read()  # the stream had ended: the create took its slot afterwards
        assert body.rstrip().endswith(b"data: [DONE]"), body[-200:]
        c.close()
        # /admin/slots says what a parked state's slot holds: every token but
        # the last, which the state's next generation feeds first
        parked = [x for x in s.get("/admin/slots").json()["slots"] if x["holds"] == "state"]
        assert [x["tokens"] for x in parked] == [len(P) - 1], parked
        # the same after the bytes come back from the store
        assert s.post("/v1/states/waited@1/hibernate").status == 200
        assert s.post("/v1/states/waited@1/resume").status == 200
        parked = [x for x in s.get("/admin/slots").json()["slots"] if x["holds"] == "state"]
        assert [x["tokens"] for x in parked] == [len(P) - 1], parked
        check_continuations(s, "waited@1")
        print("slot wait: create answered after %.2f s" % (time.time() - t0))
    with Stack(model=MODEL, slots=1, extra_ctl=["--slot-wait-ms", "0"]) as s:
        up(s)
        c, r = long_stream(s, 60000)
        r2 = s.post("/v1/states", body={"model": "tiny", "name": "x", "prompt_ids": P})
        r.close()  # the client goes: its request is cancelled
        c.close()
        assert r2.status == 503 and r2.json()["error"]["code"] == "no_capacity", r2.body
        assert s.get("/v1/states/x").status == 404
        # The cancelled request's slot is parked or free again: the name is still free.
        s.wait(lambda: s.post("/v1/states", body={"model": "tiny", "name": "x",
                                                  "prompt_ids": P}).status == 201, "a slot again")
        check_continuations(s, "x@1")
    # A graceful shutdown ends a slot wait at once and starts no new work,
    # even on the slot the shutdown frees (the stream it cancels).
    with Stack(model=MODEL, slots=1) as s:
        up(s)
        c, r = long_stream(s, 60000)
        got = {}

        def waiting_create():
            try:
                got["r"] = s.post("/v1/states", body={"model": "tiny", "name": "late",
                                                      "prompt_ids": P}, timeout=60).status
            except OSError as e:  # the connection closes with the server
                got["r"] = repr(e)
        th = threading.Thread(target=waiting_create)
        th.start()
        time.sleep(1.0)
        t0 = time.time()
        s.kill_controller(signal.SIGTERM)
        took = time.time() - t0
        th.join(timeout=60)
        r.close()
        c.close()
        assert took < 10, "shutdown took %.1f s with a state operation waiting" % took
        assert got.get("r") != 201, got
        s.start_controller()
        s.wait(lambda: s.get("/ready").status == 200, "ready after restart")
        assert s.get("/v1/states/late").status == 404, "a create was run during shutdown"


if __name__ == "__main__":
    rc = run_tests([test_create_generate_and_ops, test_restarts, test_cold_without_host_cache,
                    test_bad_input_and_damage, test_owner_isolation, test_slot_wait])
    TMP.cleanup()
    sys.exit(rc)
