"""Foundation integration test: the real controller and worker processes find
each other over NNG, report over HTTP, survive each other's restarts, and
refuse bad input with OpenAI-style errors."""
import os
import re
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import CONTROLD, MKMODEL, Stack, free_port, http, run_tests  # noqa: E402


def test_register_leave_return():
    with Stack() as s:
        s.start_controller()
        r = s.get("/ready")
        assert r.status == 503, r.status
        body = r.json()
        assert body["status"] == "not_ready" and "no worker" in body["reason"], body
        assert s.workers_list() == []
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready")
        ws = s.workers_list()
        assert len(ws) == 1, ws
        w = ws[0]
        for k in ("id", "backend", "device", "slots_total", "slots_used", "state"):
            assert k in w, (k, w)
        assert w["id"] == "w0" and w["backend"] == "cpu" and w["state"] == "ready", w
        # The worker dies: it leaves the registry and /ready says why.
        s.kill_worker("w0")
        s.wait(lambda: s.workers_list() == [], "worker to leave")
        assert s.get("/ready").status == 503
        # It comes back.
        s.start_worker("w0")
        s.wait(lambda: [w["id"] for w in s.workers_list()] == ["w0"], "worker to return")
        s.wait(lambda: s.get("/ready").status == 200, "ready again")


def test_controller_restart():
    with Stack() as s:
        s.start_controller()
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready")
        s.kill_controller()
        s.start_controller()
        # The worker reconnects and says Hello again on its own.
        s.wait(lambda: [w["id"] for w in s.workers_list()] == ["w0"], "worker to reconnect")
        s.wait(lambda: s.get("/ready").status == 200, "ready after restart")
        assert s.workers["w0"].poll() is None


def test_two_workers_and_duplicate_id():
    with Stack(workers_expected=2) as s:
        s.start_controller()
        s.start_worker("w0")
        s.wait(lambda: len(s.workers_list()) == 1, "one worker")
        assert s.get("/ready").status == 503  # two expected
        s.start_worker("w1")
        s.wait(lambda: s.get("/ready").status == 200, "two ready")
        # A second process claiming id w1 is refused and exits; w1 stays.
        dup = s.start_worker("w1")
        dup.wait(timeout=30)
        assert dup.returncode == 1, dup.returncode
        ids = sorted(w["id"] for w in s.workers_list())
        assert ids == ["w0", "w1"], ids


def test_metrics_and_errors():
    with Stack() as s:
        s.start_controller()
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready")
        m = s.get("/metrics")
        assert m.status == 200 and m.headers["Content-Type"].startswith("text/plain")
        text = m.body.decode()
        assert 'wkvm_workers{state="ready"} 1' in text, text[:2000]
        assert 'wkvm_worker_up{worker="w0"} 1' in text
        assert "# TYPE wkvm_http_request_duration_seconds histogram" in text
        assert 'wkvm_http_requests_total{route="/ready",method="GET",code="200"}' in text
        r = s.get("/no/such/route")
        assert r.status == 404 and r.json()["error"]["type"] == "invalid_request_error"
        r = s.post("/health", body={})
        assert r.status == 405 and "error" in r.json()


def test_api_keys_and_bind_rules():
    with tempfile.TemporaryDirectory() as d:
        # Non-loopback without keys: refuses to start, clearly.
        p = subprocess.run([CONTROLD, "--host", "0.0.0.0", "--port", str(free_port()),
                            "--data-dir", d], capture_output=True, text=True, timeout=20)
        assert p.returncode == 2 and "api-keys" in p.stderr, (p.returncode, p.stderr)
        keys = os.path.join(d, "keys")
        with open(keys, "w") as f:
            f.write("# key user [admin]\nsk-user-0123456789 alice\nsk-admin-0123456789 ops admin\n")
        os.chmod(keys, 0o600)  # the controller refuses a key file others may read
        with Stack(extra_ctl=["--api-keys", keys], data=d) as s:
            s.start_controller()
            assert s.get("/health").status == 200  # public
            assert s.get("/admin/workers").status == 401
            r = s.get("/admin/workers", headers={"Authorization": "Bearer sk-user-0123456789"})
            assert r.status == 403 and r.json()["error"]["type"] == "permission_error"
            r = s.get("/admin/workers", headers={"Authorization": "Bearer wrong-key-123"})
            assert r.status == 401
            r = s.get("/admin/workers", headers={"Authorization": "Bearer sk-admin-0123456789"})
            assert r.status == 200 and r.json() == {"workers": []}
        bad = os.path.join(d, "badkeys")
        with open(bad, "w") as f:
            f.write("short alice\n")
        os.chmod(bad, 0o600)
        p = subprocess.run([CONTROLD, "--port", str(free_port()), "--data-dir", d,
                            "--api-keys", bad], capture_output=True, text=True, timeout=20)
        assert p.returncode == 2 and "line 1" in p.stderr, p.stderr


def test_bad_flags():
    p = subprocess.run([CONTROLD, "--port", "99999"], capture_output=True, text=True, timeout=20)
    assert p.returncode == 2 and "out of range" in p.stderr, p.stderr
    p = subprocess.run([CONTROLD, "--help"], capture_output=True, text=True, timeout=20)
    assert p.returncode == 0 and "--link-url" in p.stdout and "(also --worker-url)" in p.stdout


def test_model_load_through_controller():
    """The controller tells a fresh worker to load its model; the worker reports it."""
    with tempfile.TemporaryDirectory() as d:
        model = os.path.join(d, "m")
        subprocess.run([MKMODEL, "--out", model, "--layers", "2", "--embd", "64",
                        "--head-size", "16", "--ffn", "128", "--vocab", "512"], check=True,
                       capture_output=True, timeout=60)
        with Stack(model=model, slots=3) as s:
            s.start_controller()
            s.start_worker("w0")
            s.wait(lambda: s.get("/ready").status == 200, "model loaded")
            w = s.workers_list()[0]
            assert w["slots_total"] == 3 and w["model"]["name"] == "m", w
            assert len(w["model"]["fingerprint"]) == 64
            # Loading reports its progress in the worker's log (and in /ready meanwhile).
            with open(os.path.join(s.data, "worker-w0.log")) as f:
                log = f.read()
            # reading is 0..90%, packing 95%, then 100% loaded: never backwards
            assert 'model load progress=90% phase="reading weights"' in log, log[-2000:]
            assert 'model load progress=95% phase="packing weights"' in log, log[-2000:]
            assert 'model load progress=100% phase="loaded"' in log, log[-2000:]
            pcts = [int(x) for x in re.findall(r"model load progress=(\d+)%", log)]
            assert pcts == sorted(pcts), pcts
            want = s.post("/v1/completions", body={"model": "m", "prompt": [1, 2, 3],
                                                   "max_tokens": 4, "temperature": 0,
                                                   "return_token_ids": True}).json()
        # --model FILE: the checkpoint file itself (config and vocab beside it), named after it
        with Stack(model=os.path.join(model, "model.safetensors"), slots=2) as s:
            s.start_controller()
            s.start_worker("w0")
            s.wait(lambda: s.get("/ready").status == 200, "model file loaded")
            assert [m["id"] for m in s.get("/v1/models").json()["data"]] == ["model"]
            assert s.workers_list()[0]["model"]["fingerprint"] == w["model"]["fingerprint"]
            got = s.post("/v1/completions", body={"model": "model", "prompt": [1, 2, 3],
                                                  "max_tokens": 4, "temperature": 0,
                                                  "return_token_ids": True}).json()
            assert got["choices"][0]["token_ids"] == want["choices"][0]["token_ids"], (got, want)
        # A broken model: the worker reports the failure, /ready says why.
        os.remove(os.path.join(model, "model.safetensors"))
        with Stack(model=model) as s:
            s.start_controller()
            s.start_worker("w0")
            s.wait(lambda: s.workers_list()[0]["state"] == "failed", "load failure")
            r = s.get("/ready")
            assert r.status == 503 and "model load failed" in r.json()["reason"], r.json()


if __name__ == "__main__":
    sys.exit(run_tests([
        test_register_leave_return,
        test_controller_restart,
        test_two_workers_and_duplicate_id,
        test_metrics_and_errors,
        test_api_keys_and_bind_rules,
        test_bad_flags,
        test_model_load_through_controller,
    ]))
