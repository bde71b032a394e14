"""Live migration between two CPU workers: a running stream moves mid-way and
the client receives exactly the tokens of an unmigrated run; drain empties
a worker (and reports progress while it runs); bad targets are refused
clearly. CPU workers always use the NNG transport, and say why."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import BUILD, MKMODEL, Stack, run_tests  # noqa: E402

WKVMCTL = os.path.join(BUILD, "tools", "wkvmctl")

TMP = tempfile.TemporaryDirectory(prefix="wkvm-migrate-")
MODEL = os.path.join(TMP.name, "tiny")
subprocess.run([MKMODEL, "--out", MODEL, "--layers", "2", "--embd", "64", "--head-size", "16",
                "--ffn", "128", "--vocab", "512", "--seed", "5"], check=True,
               capture_output=True, timeout=60)
N = 4000  # long enough that the server blocks on the unread socket mid-stream


def up(s):
    s.start_controller()
    s.start_worker("w0")
    s.start_worker("w1")
    s.wait(lambda: s.get("/ready").status == 200, "ready")


def body(**samp):
    b = {"model": "tiny", "prompt": [7, 8, 9, 10], "max_tokens": N, "ignore_eos": True,
         "return_token_ids": True}
    b.update(samp)
    return b


def open_stream(s, b):
    req = urllib.request.Request(s.url + "/v1/completions", method="POST",
                                 data=json.dumps(dict(b, stream=True)).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=120)


def read_ids(stream):
    ids = []
    for line in stream:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        assert "error" not in ev, ev
        ids += ev["choices"][0].get("token_ids", [])
    return ids


def running_slot(s):
    for sl in s.get("/admin/slots").json()["slots"]:
        if sl["state"] == "running":
            return sl
    return None


def wait_mid_stream(s, prompt_len=4):
    """Waits for the condition the migrations below need: a request running
    mid-stream (it has generated tokens and has not finished); returns its slot."""
    found = {}

    def mid():
        sl = running_slot(s)
        if sl is not None and prompt_len < sl["tokens"] < prompt_len + N:
            found["slot"] = sl
            return True
        return False
    s.wait(mid, "a request running mid-stream", timeout=120)
    return found["slot"]


def test_migrate_running_stream():
    with Stack(model=MODEL, slots=2, workers_expected=2) as s:
        up(s)
        for samp in (dict(temperature=0), dict(temperature=0.9, top_p=0.9, seed=77)):
            want = s.post("/v1/completions", body=body(**samp)).json()["choices"][0]["token_ids"]
            assert len(want) == N
            st = open_stream(s, body(**samp))
            head = [st.readline() for _ in range(4)]
            assert all(h.startswith(b"data: ") or h == b"\n" for h in head), head
            # the client reads no further: the server fills the socket and waits
            # for the reader, so the stream stays mid-way until it is read
            sl = wait_mid_stream(s)
            src = sl["worker"]
            dst = "w1" if src == "w0" else "w0"
            r = s.post(f"/admin/slots/{sl['id']}/migrate", body={"to": dst})
            assert r.status == 200, r.body
            rep = r.json()
            assert rep["result"] == "committed" and rep["to"].startswith(dst + ":"), rep
            assert rep["transport"] == "nng" and rep["bytes"] > 0, rep
            assert rep["transport_reason"] == "cpu workers", rep
            assert "nccl_fallback" not in rep, rep
            after = running_slot(s)
            assert after is not None and after["worker"] == dst, after
            ids = []
            for h in head:
                h = h.strip()
                if h.startswith(b"data: ") and h != b"data: [DONE]":
                    ids += json.loads(h[6:])["choices"][0].get("token_ids", [])
            ids += read_ids(st)
            assert ids == want, (samp, len(ids), len(want))
        m = s.get("/metrics").body.decode()
        assert 'wkvm_migrations_total{result="committed",transport="nng"} 2' in m, m[-2000:]


def test_bad_targets_and_parked_and_drain():
    # --drain-wait-ms: how long a request only draining workers could run waits for an
    # undrain before its 503 (checked below)
    with Stack(model=MODEL, slots=2, workers_expected=2, extra_ctl=["--drain-wait-ms", "700"]) as s:
        up(s)
        st = open_stream(s, body(temperature=0))
        st.readline()
        s.wait(lambda: running_slot(s) is not None, "a running slot")
        sl = running_slot(s)
        r = s.post(f"/admin/slots/{sl['id']}/migrate", body={"to": "nope"})
        # no such destination: a 404 like a missing slot, and no migration was attempted
        assert r.status == 404 and r.json()["error"]["param"] == "to", r.body
        assert "wkvm_migrations_total{" not in s.get("/metrics").body.decode()
        r = s.post(f"/admin/slots/{sl['id']}/migrate", body={"to": sl["worker"]})
        assert r.status == 400, r.body
        r = s.post("/admin/slots/bogus/migrate", body={"to": "w1"})
        assert r.status == 400
        r = s.post("/admin/slots/w0:99/migrate", body={"to": "w1"})
        assert r.status == 404
        st.close()
        s.wait(lambda: running_slot(s) is None, "stream cancelled")
        # Parked states move too, and keep continuing exactly.
        s.post("/v1/states", body={"name": "p", "prompt_ids": [3, 4, 5]})
        parked = [x for x in s.get("/admin/slots").json()["slots"] if x["state"] == "parked"]
        assert len(parked) == 1, parked
        want = s.post("/v1/states/p@1/generate", body={"max_tokens": 8, "temperature": 0,
                                                       "return_token_ids": True}).json()
        other = "w1" if parked[0]["worker"] == "w0" else "w0"
        r = s.post(f"/admin/slots/{parked[0]['id']}/migrate", body={"to": other})
        assert r.status == 200 and r.json()["kind"] == "parked", r.body
        got = s.post("/v1/states/p@1/generate", body={"max_tokens": 8, "temperature": 0,
                                                      "return_token_ids": True}).json()
        assert got["choices"][0]["token_ids"] == want["choices"][0]["token_ids"]
        # Drain the worker holding the parked state and a running stream.
        holder = [x for x in s.get("/admin/slots").json()["slots"] if x["state"] == "parked"]
        victim = holder[0]["worker"]
        full = s.post("/v1/completions", body=body(temperature=0)).json()["choices"][0]["token_ids"]
        st = open_stream(s, body(temperature=0))
        first = st.readline().strip()
        head = json.loads(first[6:])["choices"][0].get("token_ids", [])
        wait_mid_stream(s)
        r = s.post(f"/admin/workers/{victim}/drain")
        assert r.status == 200 and r.json()["remaining"] == 0, r.body
        assert not [x for x in s.get("/admin/slots").json()["slots"] if x["worker"] == victim]
        assert head + read_ids(st) == full
        # New work avoids the drained worker; undrain brings it back.
        got = s.post("/v1/states/p@1/generate", body={"max_tokens": 8, "temperature": 0,
                                                      "return_token_ids": True}).json()
        assert got["choices"][0]["token_ids"] == want["choices"][0]["token_ids"]
        # The drain is visible: worker state, /ready, a metric, a log line.
        spare = "w1" if victim == "w0" else "w0"
        ws = {w["id"]: w for w in s.workers_list()}
        assert ws[victim]["state"] == "draining" and ws[victim]["draining"], ws[victim]
        assert ws[spare]["state"] == "ready" and not ws[spare]["draining"], ws[spare]
        r = s.get("/ready")
        assert r.status == 200 and r.json()["draining"] == [victim], r.body
        assert f'wkvm_worker_draining{{worker="{victim}"}} 1' in s.get("/metrics").body.decode()
        with open(os.path.join(s.data, "controld.log")) as f:
            assert f"drain worker={victim}" in f.read()
        # Every worker draining: /ready says so, and a new request gets a 503 with the
        # reason after a short wait (not the request deadline). p's slot cannot move.
        assert s.post("/v1/states", body={"name": "q", "prompt_ids": [4, 5, 6]}).status == 201
        r = s.post(f"/admin/workers/{spare}/drain")  # q's slot has nowhere to go
        assert r.status == 409 and r.json()["remaining"] >= 1, r.body
        assert s.get(f"/admin/workers/{spare}/drain").json()["state"] == "incomplete"
        r = s.get("/ready")
        assert r.status == 503 and "draining" in r.json()["reason"], r.body
        t0 = time.time()
        r = s.post("/v1/completions", body=body(temperature=0), timeout=60)
        assert r.status == 503 and "draining" in r.json()["error"]["message"], r.body
        # 0.7 s as set, not the 2 s default (0.74 s measured)
        assert 0.7 <= time.time() - t0 < 1.9, time.time() - t0
        for w in (spare, victim):
            assert s.post(f"/admin/workers/{w}/drain", body={"undrain": True}).status == 200
        g = s.get(f"/admin/workers/{spare}/drain").json()
        assert g["state"] == "undrained" and not g["draining"], g
        assert s.get("/ready").status == 200
        assert s.post("/v1/completions", body=body(temperature=0, max_tokens=2)).status == 200


def test_destination_dies_during_transfer():
    """The destination stops answering mid-transfer and then dies: the
    migration aborts after --slot-io-timeout-ms and the request finishes on
    the source with exactly the tokens of an unmigrated run."""
    with Stack(model=MODEL, slots=2, workers_expected=2,
               extra_ctl=["--slot-io-timeout-ms", "1000"]) as s:
        up(s)
        want = s.post("/v1/completions", body=body(temperature=0)).json()["choices"][0]["token_ids"]
        st = open_stream(s, body(temperature=0))
        first = st.readline().strip()
        head = json.loads(first[6:])["choices"][0].get("token_ids", [])
        sl = wait_mid_stream(s)
        dst = "w1" if sl["worker"] == "w0" else "w0"
        s.workers[dst].send_signal(signal.SIGSTOP)
        t0 = time.time()
        r = s.post(f"/admin/slots/{sl['id']}/migrate", body={"to": dst})
        took = time.time() - t0
        assert r.status in (503, 504), (r.status, r.body)
        assert r.json()["migration"]["result"] == "aborted", r.body
        # a hang guard: the abort itself (result "aborted") is the check
        assert took < 60, took
        s.kill_worker(dst)  # SIGKILL a stopped process: it dies at once
        # still on the source, or (a loaded machine, the socket buffers took the rest) finished
        # there: the tokens below are the check that it went on where it was
        rs = running_slot(s)
        assert rs is None or rs["worker"] == sl["worker"], rs
        assert head + read_ids(st) == want
        m = s.get("/metrics").body.decode()
        assert 'wkvm_migrations_total{result="aborted",transport="nng"} 1' in m


def parked_on(s):
    by = {}
    for x in s.get("/admin/slots").json()["slots"]:
        if x["state"] == "parked":
            by.setdefault(x["worker"], []).append(x)
    return by


def test_drain_progress():
    """GET /admin/workers/{id}/drain follows a drain of several parked
    sessions while the POST works: done only goes up, and reaches total at the end;
    wkvmctl drain prints progress lines from it (on stderr)."""
    with Stack(model=MODEL, slots=8, workers_expected=2) as s:
        up(s)
        assert s.get("/admin/workers/w0/drain").json()["state"] == "none"
        assert s.get("/admin/workers/nope/drain").status == 404
        for i in range(6):  # parked chat sessions (dirty entries stay hot)
            h = {"X-OpenWebUI-User-Id": "u1", "X-OpenWebUI-Chat-Id": f"c{i}",
                 "X-WKVM-Stateful-Chat": "parent-token-v1",
                 "X-WKVM-Assistant-Message-ID": f"c{i}-a1",
                 "X-WKVM-User-Message-ID": f"c{i}-u1", "X-WKVM-Parent-Message-ID": ""}
            r = s.post("/v1/chat/completions", headers=h,
                       body={"model": "tiny", "max_tokens": 4, "temperature": 0,
                             "messages": [{"role": "user", "content": f"hello {i}"}]})
            assert r.status == 200, r.body
        by = parked_on(s)
        victim = max(by, key=lambda w: len(by[w]))
        n = len(by[victim])
        assert n >= 3, by
        samples, result = [], {}

        def drain():
            result["r"] = s.post(f"/admin/workers/{victim}/drain")

        t = threading.Thread(target=drain)
        t.start()
        while t.is_alive():
            g = s.get(f"/admin/workers/{victim}/drain")
            if g.status == 200:
                samples.append(g.json())
            time.sleep(0.002)
        t.join()
        r = result["r"]
        assert r.status == 200 and r.json()["remaining"] == 0 and r.json()["done"] == n, r.body
        fin = s.get(f"/admin/workers/{victim}/drain").json()
        assert fin["state"] == "done" and fin["done"] == fin["total"] == n, fin
        assert fin["failed"] == 0 and fin["current"] is None and fin["draining"], fin
        running = [x for x in samples if x["state"] == "running"]
        dones = [x["done"] for x in running] + [fin["done"]]
        assert dones == sorted(dones), dones
        assert all(x["total"] == n and 0 <= x["done"] <= n for x in running), running
        for m in r.json()["migrations"]:
            assert m["transport"] == "nng" and m["transport_reason"] == "cpu workers", m
        # A second drain while one runs would be refused; this one is over: undrain.
        assert s.post(f"/admin/workers/{victim}/drain", body={"undrain": True}).status == 200
        # wkvmctl drain polls the same route and prints progress lines.
        other = "w1" if victim == "w0" else "w0"
        by = parked_on(s)
        k = len(by.get(other, []))
        assert k >= n, by  # the victim's states moved here
        p = subprocess.run([WKVMCTL, "--url", s.url, "drain", other], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, (p.stdout, p.stderr)
        assert f"draining {other}: {k}/{k} migrated, 0 failed" in p.stderr, p.stderr
        assert "draining" not in p.stdout, p.stdout  # progress on stderr, results on stdout
        assert f"drained {other}: {k} migrated, 0 failed, 0 remaining" in p.stdout, p.stdout
        assert "nng" in p.stdout, p.stdout


def test_worker_of_another_fingerprint_refused():
    """A worker whose model fingerprint differs from the ready one's (the same
    weights quantized to Q8_0 at load) is refused, failed with the reason:
    states, checkpoints and migrations would otherwise move between them. The
    first keeps serving."""
    with Stack(model=MODEL, slots=2, workers_expected=1) as s:
        s.start_controller()
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready")
        s.start_worker("w1", extra=["--quantize", "q8_0"])

        def w1():
            for w in s.get("/admin/workers").json()["workers"]:
                if w["id"] == "w1":
                    return w
            return None
        s.wait(lambda: w1() is not None and w1()["state"] == "failed", "w1 refused", timeout=60)
        assert "fingerprint" in w1()["detail"], w1()
        r = s.post("/v1/completions", body=body(temperature=0, max_tokens=4))
        assert r.status == 200, r.body
        assert [w["id"] for w in s.get("/admin/workers").json()["workers"]
                if w["state"] == "ready"] == ["w0"]


if __name__ == "__main__":
    rc = run_tests([test_migrate_running_stream, test_bad_targets_and_parked_and_drain,
                    test_destination_dies_during_transfer, test_drain_progress,
                    test_worker_of_another_fingerprint_refused])
    TMP.cleanup()
    sys.exit(rc)
