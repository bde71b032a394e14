"""Security integration tests: the key file's permissions, both ways of sending
a key, and a clear 4xx for every limit a client controls (body, headers,
messages, content per message, prompt tokens, max_tokens, stop strings,
states per user, concurrent requests per user). Real processes on loopback."""
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import CONTROLD, MKMODEL, Stack, free_port, run_tests  # noqa: E402
from wkvm_harness import http as hreq  # noqa: E402

TMP = tempfile.TemporaryDirectory(prefix="wkvm-security-")
MODEL = os.path.join(TMP.name, "tiny")
subprocess.run([MKMODEL, "--out", MODEL, "--layers", "2", "--embd", "64", "--head-size", "16",
                "--ffn", "128", "--vocab", "512", "--seed", "7"], check=True,
               capture_output=True, timeout=60)
MID = "tiny"
ALICE = {"Authorization": "Bearer sk-alice-000000001"}
BOB = {"x-api-key": "sk-bob-00000000002"}
OPS = {"Authorization": "Bearer sk-ops-00000000003"}


def keyfile(mode=0o600):
    path = os.path.join(tempfile.mkdtemp(dir=TMP.name), "keys")
    with open(path, "w") as f:
        f.write("sk-alice-000000001 alice\nsk-bob-00000000002 bob\nsk-ops-00000000003 ops admin\n")
    os.chmod(path, mode)
    return path


def error_of(r, status, code=None, param=None):
    assert r.status == status, (r.status, r.body)
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    if code is not None:
        assert e["code"] == code, e
    if param is not None:
        assert e["param"] == param, e
    return e


def test_key_file_permissions():
    for mode in (0o644, 0o640, 0o604):
        keys = keyfile(mode)
        p = subprocess.run([CONTROLD, "--port", str(free_port()), "--data-dir",
                            os.path.dirname(keys), "--api-keys", keys],
                           capture_output=True, text=True, timeout=20)
        assert p.returncode == 2, (oct(mode), p.returncode, p.stderr)
        assert "chmod 600" in p.stderr and keys in p.stderr, p.stderr
        assert "sk-" not in p.stderr  # never key material


def test_both_key_headers():
    with Stack(extra_ctl=["--api-keys", keyfile()]) as s:
        s.start_controller()
        assert s.get("/health").status == 200
        # Without a model only the admin routes exist: 401 = no key, 403 = a user key.
        error_of(s.get("/admin/workers"), 401, "invalid_api_key")
        error_of(s.get("/admin/workers", headers=ALICE), 403, "forbidden")
        error_of(s.get("/admin/workers", headers=BOB), 403, "forbidden")  # x-api-key
        error_of(s.get("/admin/workers", headers={"X-Api-Key": "sk-alice-000000001"}), 403)
        error_of(s.get("/admin/workers", headers={"x-api-key": "sk-nobody-00000000"}), 401)
        assert s.get("/admin/workers", headers={"x-api-key": "sk-ops-00000000003"}).status == 200
        assert s.get("/admin/workers", headers=OPS).status == 200
        # A wrong bearer key does not hide a valid x-api-key, nor the reverse.
        assert s.get("/admin/workers", headers={"Authorization": "Bearer sk-nobody-0000000",
                                                "x-api-key": "sk-ops-00000000003"}).status == 200


def raw_request(port, data):
    with socket.create_connection(("127.0.0.1", port), timeout=20) as c:
        c.sendall(data)
        out = b""
        while True:
            b = c.recv(65536)
            if not b:
                break
            out += b
    head, _, body = out.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def test_request_limits():
    extra = ["--api-keys", keyfile(), "--max-body", "8192", "--max-header-bytes", "4096",
             "--max-messages", "3", "--max-message-bytes", "100", "--max-stop-bytes", "8",
             "--max-prompt-tokens", "200", "--max-tokens-limit", "100"]
    with Stack(model=MODEL, slots=2, extra_ctl=extra) as s:
        s.start_controller()
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready")

        def chat(**kw):
            body = {"model": MID, "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2}
            body.update(kw)
            return s.post("/v1/chat/completions", body=body, headers=ALICE)
        assert chat().status == 200
        m = {"role": "user", "content": "x"}
        error_of(chat(messages=[m] * 4), 413, "too_large", "messages")
        assert chat(messages=[m] * 3).status == 200
        error_of(chat(messages=[m, {"role": "user", "content": "y" * 101}]), 413, "too_large",
                 "messages[1].content")
        parts = [{"type": "text", "text": "z" * 60}, {"type": "text", "text": "z" * 41}]
        error_of(chat(messages=[{"role": "user", "content": parts}]), 413, "too_large",
                 "messages[0].content")
        assert chat(messages=[{"role": "user", "content": "y" * 100}]).status == 200
        error_of(chat(stop=["123456789"]), 400, "invalid_request", "stop")
        assert chat(stop=["12345678"]).status == 200
        error_of(chat(stop=["a", "b", "c", "d", "e"]), 400, "invalid_request", "stop")
        error_of(chat(max_tokens=101), 400, "invalid_request", "max_tokens")
        r = s.post("/v1/completions", body={"model": MID, "prompt": list(range(1, 202)),
                                            "max_tokens": 1}, headers=ALICE)
        error_of(r, 413, "too_large", "prompt")
        r = s.post("/v1/completions", body={"model": MID, "prompt": "word " * 300,
                                            "max_tokens": 1}, headers=ALICE)
        error_of(r, 413, "too_large")
        error_of(chat(messages=[{"role": "user", "content": "q" * 9000}]), 413, "too_large")
        # A quote of client input cut inside a character: still a 400 with a JSON body
        # (it was a 500 "{}"; found by fuzz_chat_body).
        error_of(chat(messages=[{"role": "\u00e9" * 300, "content": "x"}]), 400,
                 "invalid_request", "messages[0].role")
        # Request line + headers over --max-header-bytes: a JSON 4xx, connection closed.
        status, body = raw_request(s.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
                                   b"Authorization: Bearer sk-alice-000000001\r\nX-Pad: "
                                   + b"p" * 5000 + b"\r\n\r\n")
        assert 400 <= status < 500, status
        assert "4096" in json.loads(body)["error"]["message"], body
        status, _ = raw_request(s.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: "
                                b"close\r\nAuthorization: Bearer sk-alice-000000001\r\nX-Pad: "
                                + b"p" * 3000 + b"\r\n\r\n")
        assert status == 200
        # A body that claims to be larger than --max-body is refused before it is read.
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=20)
        c.putrequest("POST", "/v1/chat/completions")
        for k, v in dict(ALICE, **{"Content-Type": "application/json",
                                   "Content-Length": "100000000"}).items():
            c.putheader(k, v)
        c.endheaders()
        r = c.getresponse()
        assert r.status == 413, r.status
        c.close()
        assert s.get("/health").status == 200
        # Expect: 100-continue (curl's default over 1 MB) is answered at once, not after the
        # client's ~1 s wait; a body refused by its length gets the 413 instead.
        body = json.dumps({"model": MID, "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 2}).encode()
        for length, want in ((len(body), b"HTTP/1.1 100 Continue"), (100000000, b"HTTP/1.1 413")):
            with socket.create_connection(("127.0.0.1", s.port), timeout=20) as c:
                c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close"
                          b"\r\nAuthorization: Bearer sk-alice-000000001\r\nContent-Type: "
                          b"application/json\r\nExpect: 100-continue\r\nContent-Length: "
                          + str(length).encode() + b"\r\n\r\n")
                c.settimeout(0.5)
                t0 = time.monotonic()
                first = c.recv(4096)
                assert first.startswith(want), (first, time.monotonic() - t0)
                if length == len(body):
                    c.settimeout(20)
                    c.sendall(body)
                    rest = b""
                    while (b := c.recv(65536)):
                        rest += b
                    assert rest.startswith(b"HTTP/1.1 200"), rest[:200]


def test_user_quotas():
    extra = ["--api-keys", keyfile(), "--max-states-per-user", "3",
             "--max-concurrent-per-user", "2"]
    with Stack(model=MODEL, slots=6, extra_ctl=extra) as s:
        s.start_controller()
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready")

        def create(name, hdrs):
            return s.post("/v1/states", body={"model": MID, "name": name,
                                              "prompt_ids": [1, 2, 3]}, headers=hdrs)
        # States per user: three versions, then 429 quota_exceeded on every way to add one.
        for i in range(2):
            assert create(f"s{i}", ALICE).status == 201
        r = s.post("/v1/states", body={"model": MID, "name": "s2", "messages": [
            {"role": "user", "content": "hello"}]}, headers=ALICE)  # (this path leaked once)
        assert r.status == 201, r.body
        e = error_of(create("s3", ALICE), 429, "quota_exceeded")
        assert e["type"] == "rate_limit_error" and "3" in e["message"], e
        error_of(s.post("/v1/states/s0@1/fork", body={"name": "f"}, headers=ALICE), 429,
                 "quota_exceeded")
        error_of(s.post("/v1/states/s0@1/snapshot", headers=ALICE), 429, "quota_exceeded")
        error_of(s.post("/v1/states/s0@1/generate", body={"max_tokens": 1, "save_as": "g"},
                        headers=ALICE), 429, "quota_exceeded")
        exported = hreq("GET", s.url + "/v1/states/s0@1/export", headers=ALICE)
        assert exported.status == 200
        error_of(s.post("/v1/states/import?name=imp", body=exported.body, headers=ALICE), 429,
                 "quota_exceeded")
        # Generating without saving is not limited by the state quota.
        assert s.post("/v1/states/s0@1/generate", body={"max_tokens": 1},
                      headers=ALICE).status == 200
        # Another user has a quota of their own; a delete makes room again.
        assert create("s0", BOB).status == 201
        assert hreq("DELETE", s.url + "/v1/states/s2@1", headers=ALICE).status == 200
        assert create("s3", ALICE).status == 201
        # Concurrent generation requests per user.
        streams = []
        for i in range(2):
            c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
            c.request("POST", "/v1/completions", body=json.dumps({
                "model": MID, "prompt": [i + 1], "max_tokens": 60000, "ignore_eos": True,
                "stream": True}), headers=dict(ALICE, **{"Content-Type": "application/json"}))
            c.wkvm_sock = c.sock
            r = c.getresponse()
            assert r.status == 200 and r.readline().startswith(b"data: ")
            streams.append((c, r))
        body = {"model": MID, "prompt": "a", "max_tokens": 1}
        e = error_of(s.post("/v1/completions", body=body, headers=ALICE), 429, "quota_exceeded")
        assert "concurrent" in e["message"], e
        error_of(s.post("/v1/chat/completions", body={
            "model": MID, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
            headers=ALICE), 429, "quota_exceeded")
        error_of(s.post("/v1/states/s0@1/generate", body={"max_tokens": 1}, headers=ALICE),
                 429, "quota_exceeded")
        # Other routes and other users are not affected.
        assert s.get("/v1/states", headers=ALICE).status == 200
        assert s.post("/v1/completions", body=body, headers=BOB).status == 200
        for c, r in streams:
            c.wkvm_sock.shutdown(socket.SHUT_RDWR)
            c.wkvm_sock.close()
            r.close()
        t0 = time.time()
        while s.post("/v1/completions", body=body, headers=ALICE).status == 429:
            # a hang guard, not a speed test: without the disconnects being
            # noticed the units stay taken for the 60000 tokens
            assert time.time() - t0 < 60, "units not given back after the disconnects"
            time.sleep(0.05)
        m = s.get("/metrics", headers=OPS).body.decode()
        # the units came back because the disconnects were noticed (not because
        # the streams ran out): both ended as cancelled
        assert 'wkvm_requests_total{route="/v1/completions",status="cancelled"} 2' in m, \
            [x for x in m.splitlines() if "requests_total" in x]
        assert 'wkvm_quota_refusals_total{limit="states"} 5' in m, m
        conc = [float(x.rsplit(" ", 1)[1]) for x in m.splitlines()
                if x.startswith('wkvm_quota_refusals_total{limit="concurrent"}')]
        assert conc and conc[0] >= 3, conc  # 3, plus any 429 of the wait loop above


def test_client_paths_never_reach_the_filesystem():
    with Stack(model=MODEL, slots=2, extra_ctl=["--api-keys", keyfile()]) as s:
        s.start_controller()
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready")
        before = sorted(os.listdir(s.data))
        for name in ("../x", "a/b", "/etc/passwd", "x" * 300, "a b", "a\nb"):
            r = s.post("/v1/states", body={"model": MID, "name": name, "prompt_ids": [1, 2]},
                       headers=ALICE)
            error_of(r, 400, param="name")
        # Dots are fine in a name: names are LMDB keys, blobs are named by their hash.
        for name in ("..", ".hidden"):
            r = s.post("/v1/states", body={"model": MID, "name": name, "prompt_ids": [1, 2]},
                       headers=ALICE)
            assert r.status == 201, r.body
        assert sorted(os.listdir(s.data)) == before
        for f in os.listdir(os.path.join(s.data, "blobs")):
            assert len(f) == 64 and all(c in "0123456789abcdef" for c in f), f
        for path in ("/v1/states/..%2f..%2fetc%2fpasswd", "/v1/states/../../etc/passwd",
                     "/v1/states/%2e%2e/export"):
            r = s.get(path, headers=ALICE)
            assert r.status in (400, 404), (path, r.status)
        r = s.post("/v1/states/import?name=../../evil", body=b"\0" * 64, headers=ALICE)
        error_of(r, 400, param="name")
        assert not any("evil" in f for f in os.listdir(s.data))


if __name__ == "__main__":
    rc = run_tests([
        test_key_file_permissions,
        test_both_key_headers,
        test_request_limits,
        test_user_quotas,
        test_client_paths_never_reach_the_filesystem,
    ])
    TMP.cleanup()
    sys.exit(rc)
