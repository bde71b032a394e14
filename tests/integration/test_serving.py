"""Serving integration tests: the real controller and CPU workers with a tiny
model, talked to over HTTP like an OpenAI client would.

wkvm-infer runs the same CPU backend as the worker, so comparing the server
with it is a consistency check (scheduling, batching, chunked prefill and the
protocol change nothing), not a check of the model's numbers: those are the
reference tests' (tests/reference, against numpy and torch)."""
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import BUILD, MKMODEL, Stack, http, run_tests  # noqa: E402

INFER = os.path.join(BUILD, "tools", "wkvm-infer")
TMP = tempfile.TemporaryDirectory(prefix="wkvm-serving-")
MODEL = os.path.join(TMP.name, "tiny")
subprocess.run([MKMODEL, "--out", MODEL, "--layers", "2", "--embd", "64", "--head-size", "16",
                "--ffn", "128", "--vocab", "512", "--seed", "7"], check=True,
               capture_output=True, timeout=60)
MID = "tiny"


def stack(**kw):
    s = Stack(model=MODEL, **kw)
    s.start_controller()
    return s


def ready(s, n=1):
    for i in range(n):
        s.start_worker(f"w{i}")
    s.wait(lambda: s.get("/ready").status == 200, "ready")


def sse(url, body, timeout=60):
    """POSTs body with stream=true; returns the list of data payloads (str)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream"), r.headers
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e.strip()]
    out = []
    for e in events:
        assert e.startswith("data: "), repr(e)
        out.append(e[len("data: "):])
    return out


def infer_generate(tokens, n):
    """Greedy ids from wkvm-infer: the same backend without the server, a
    consistency oracle (not an independent one)."""
    p = subprocess.run([INFER, "--model", MODEL, "--tokens", ",".join(map(str, tokens)),
                        "--generate", str(n), "--threads", "1"], capture_output=True, text=True,
                       timeout=120, check=True)
    return [int(x) for x in p.stdout.split()]


def completion(s, prompt, n, **extra):
    body = {"model": MID, "prompt": prompt, "max_tokens": n, "temperature": 0,
            "return_token_ids": True, "ignore_eos": True}
    body.update(extra)
    r = s.post("/v1/completions", body=body)
    assert r.status == 200, r.body
    return r.json()


def test_models_and_shapes():
    with stack() as s:
        ready(s)
        m = s.get("/v1/models").json()
        assert m["object"] == "list" and m["data"][0]["id"] == MID
        assert m["data"][0]["object"] == "model" and m["data"][0]["owned_by"] == "wkvm"
        r = s.post("/v1/chat/completions", body={
            "model": MID, "messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": 3})
        assert r.status == 200, r.body
        b = r.json()
        assert b["object"] == "chat.completion" and b["id"].startswith("chatcmpl-")
        assert b["model"] == MID and isinstance(b["created"], int)
        c = b["choices"][0]
        assert c["index"] == 0 and c["message"]["role"] == "assistant"
        assert c["finish_reason"] in ("stop", "length")
        lp = c["logprobs"]["content"]
        assert len(lp) >= 1 and len(lp[0]["top_logprobs"]) == 3
        assert lp[0]["logprob"] <= 0 and isinstance(lp[0]["bytes"], list)
        u = b["usage"]
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        assert u["completion_tokens"] == len(lp)


def test_stream_equals_blocking_and_framing():
    with stack() as s:
        ready(s)
        body = {"model": MID, "messages": [{"role": "user", "content": "Say something"}],
                "max_tokens": 24, "temperature": 0}
        blocking = s.post("/v1/chat/completions", body=body).json()
        ev = sse(s.url + "/v1/chat/completions",
                 dict(body, stream=True, stream_options={"include_usage": True}))
        assert ev[-1] == "[DONE]"
        chunks = [json.loads(e) for e in ev[:-1]]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert len({c["id"] for c in chunks}) == 1
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        usage = chunks[-1]
        # The same prompt again: all but its last token come from the checkpoint the
        # blocking request left (an exact repeat computes one token).
        bu, su = blocking["usage"], usage["usage"]
        assert usage["choices"] == [], usage
        assert (su["prompt_tokens"], su["completion_tokens"]) == \
            (bu["prompt_tokens"], bu["completion_tokens"]), (su, bu)
        assert su["prompt_tokens_details"]["cached_tokens"] == bu["prompt_tokens"] - 1, (su, bu)
        final = chunks[-2]["choices"][0]
        assert final["finish_reason"] == blocking["choices"][0]["finish_reason"]
        assert final["delta"] == {}
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-2])
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])
        assert text == blocking["choices"][0]["message"]["content"], (text, blocking)
        # Completions stream the same text as blocking, too.
        cb = {"model": MID, "prompt": "The", "max_tokens": 10, "temperature": 0}
        b2 = s.post("/v1/completions", body=cb).json()
        ev2 = sse(s.url + "/v1/completions", dict(cb, stream=True))
        t2 = "".join(json.loads(e)["choices"][0]["text"] for e in ev2[:-1])
        assert t2 == b2["choices"][0]["text"]
        # On a loopback bind every stream is written by an event loop (#33), none
        # silently by its connection's thread.
        m = s.get("/metrics").body.decode()
        assert 'wkvm_http_streams_total{writer="loop"} 2' in m, \
            [x for x in m.splitlines() if "streams_total" in x]
        assert 'wkvm_http_streams_total{writer="thread"} 0' in m


def test_greedy_ids_consistent_with_wkvm_infer_same_backend():
    """Consistency with wkvm-infer (same backend): the server's greedy ids equal
    the stand-alone run's, for a short prompt and a long chunked one."""
    prompt = [5, 77, 300, 12, 1, 499, 256, 42]
    want = infer_generate(prompt, 20)
    with stack() as s:
        ready(s)
        got = completion(s, prompt, 20)["choices"][0]["token_ids"]
        assert got == want, (got, want)
        # A long prompt goes through several prefill chunks and steps.
        long_prompt = [(i * 37) % 511 + 1 for i in range(700)]
        want2 = infer_generate(long_prompt, 8)
        got2 = completion(s, long_prompt, 8)["choices"][0]["token_ids"]
        assert got2 == want2


def test_errors():
    with stack(extra_ctl=["--max-body", "4096"]) as s:
        ready(s)
        url = s.url + "/v1/chat/completions"
        ok_msgs = [{"role": "user", "content": "x"}]

        def err(body, status, param=None, raw=None, path="/v1/chat/completions"):
            r = http("POST", s.url + path, body=raw if raw is not None else body)
            assert r.status == status, (body, r.status, r.body)
            e = r.json()["error"]
            assert set(e) == {"message", "type", "param", "code"}, e
            if param is not None:
                assert e["param"] == param, (e, param)
            return e

        err(None, 400, raw=b"{not json")
        err(None, 400, raw=b"[1,2]")
        err({"messages": ok_msgs}, 400, "model")
        err({"model": "nope", "messages": ok_msgs}, 404, "model")
        err({"model": MID}, 400, "messages")
        err({"model": MID, "messages": []}, 400, "messages")
        # Tools offered with the choice left to the model: a plain answer (the model never
        # calls one); a call that is required, or a malformed field: a 400 naming it.
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        for choice in (None, "auto", "none"):
            body = {"model": MID, "messages": ok_msgs, "tools": [tool], "max_tokens": 2}
            if choice is not None:
                body["tool_choice"] = choice
            r = http("POST", s.url + "/v1/chat/completions", body=body)
            assert r.status == 200, (choice, r.body)
            msg = r.json()["choices"][0]["message"]
            assert "tool_calls" not in msg and isinstance(msg["content"], str), msg
        err({"model": MID, "messages": ok_msgs, "tools": [tool], "tool_choice": "required"}, 400,
            "tool_choice")
        err({"model": MID, "messages": ok_msgs, "tools": [tool],
             "tool_choice": {"type": "function", "function": {"name": "f"}}}, 400, "tool_choice")
        err({"model": MID, "messages": ok_msgs, "tools": {"type": "function"}}, 400, "tools")
        err({"model": MID, "messages": ok_msgs, "tools": [tool], "tool_choice": "maybe"}, 400,
            "tool_choice")
        err({"model": MID, "messages": ok_msgs, "function_call": {"name": "f"}}, 400,
            "function_call")
        err({"model": MID, "messages": ok_msgs, "parallel_tool_calls": "yes"}, 400,
            "parallel_tool_calls")
        err({"model": MID, "messages": ok_msgs, "n": 2}, 400, "n")
        err({"model": MID, "messages": ok_msgs, "temperature": 5}, 400, "temperature")
        err({"model": MID, "messages": ok_msgs, "max_tokens": 0}, 400, "max_tokens")
        err({"model": MID, "messages": ok_msgs, "response_format": {"type": "json_object"}},
            400, "response_format")
        err({"model": MID, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "messages[0].content")
        err({"model": MID, "messages": [{"role": "tool", "content": "x"}]}, 400,
            "messages[0].role")
        err({"model": MID, "messages": ok_msgs, "stop": [1]}, 400, "stop")
        err({"model": MID, "prompt": [1, 99999]}, 400, "prompt", path="/v1/completions")
        err({"model": MID, "prompt": ""}, 400, "prompt", path="/v1/completions")
        e = err({"model": MID, "messages": [{"role": "user", "content": "x" * 8000}]}, 413)
        assert e["type"] == "invalid_request_error"
        assert s.get("/health").status == 200
        del url


def test_no_worker_queue_full_timeout():
    with stack() as s:
        # A model but no worker: 503.
        r = s.post("/v1/completions", body={"model": MID, "prompt": "a", "max_tokens": 2})
        assert r.status == 503 and r.json()["error"]["code"] == "unavailable", r.body
    with stack(slots=1, extra_ctl=["--queue-max", "0", "--request-timeout-ms", "30000"]) as s:
        ready(s)
        # One long request holds the only slot; a second one finds the queue full.
        # A streaming request holds the only slot while the client reads slowly.
        req = urllib.request.Request(s.url + "/v1/completions", method="POST", data=json.dumps({
            "model": MID, "prompt": "a", "max_tokens": 65536, "ignore_eos": True,
            "temperature": 0, "stream": True}).encode(), headers={"Content-Type": "application/json"})
        stream = urllib.request.urlopen(req, timeout=60)
        assert stream.readline().startswith(b"data: ")
        assert s.workers_list()[0]["slots_used"] == 1
        r = s.post("/v1/completions", body={"model": MID, "prompt": "b", "max_tokens": 2})
        assert r.status == 429 and r.json()["error"]["type"] == "rate_limit_error", r.body
        # The client goes away: the slot is freed and the next request runs.
        stream.close()
        s.wait(lambda: s.workers_list()[0]["slots_used"] == 0, "slot freed after disconnect")
        r = s.post("/v1/completions", body={"model": MID, "prompt": "b", "max_tokens": 2})
        assert r.status == 200, r.body
    with stack(extra_ctl=["--request-timeout-ms", "300"]) as s:
        ready(s)
        r = s.post("/v1/completions", body={"model": MID, "prompt": "a", "max_tokens": 60000,
                                             "ignore_eos": True})
        assert r.status == 504, (r.status, r.body)


def test_concurrency_batch_invariance_and_seeds():
    prompts = [[(i * 13 + k * 7) % 500 + 1 for k in range(3 + i % 5)] for i in range(12)]
    with stack(slots=4) as s:
        ready(s)
        alone = [completion(s, p, 12)["choices"][0]["token_ids"] for p in prompts]
        seeded_alone = [completion(s, p, 12, temperature=0.9, top_p=0.9, seed=1000 + i)
                        ["choices"][0]["token_ids"] for i, p in enumerate(prompts)]
        out, seeded = [None] * 12, [None] * 12
        errors = []

        def client(i):
            try:
                out[i] = completion(s, prompts[i], 12)["choices"][0]["token_ids"]
                seeded[i] = completion(s, prompts[i], 12, temperature=0.9, top_p=0.9,
                                       seed=1000 + i)["choices"][0]["token_ids"]
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        ts = [threading.Thread(target=client, args=(i,)) for i in range(12)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=300)
        assert not errors, errors
        assert out == alone
        assert seeded == seeded_alone
        # Different seeds give a different stream somewhere.
        other = completion(s, prompts[0], 12, temperature=0.9, top_p=0.9, seed=1)
        assert other["choices"][0]["token_ids"] != seeded_alone[0]
        m = s.get("/metrics").body.decode()
        assert "wkvm_time_to_first_token_seconds_count" in m
        assert 'wkvm_requests_total{route="/v1/completions",status="ok"}' in m


def test_worker_killed_mid_generation():
    with stack(workers_expected=2, slots=2) as s:
        ready(s, 2)
        results = {}

        def gen(i):
            results[i] = s.post("/v1/completions", body={
                "model": MID, "prompt": [i + 1], "max_tokens": 3000, "ignore_eos": True,
                "temperature": 0}, timeout=300)
        ts = [threading.Thread(target=gen, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        s.wait(lambda: all(w["slots_used"] == 2 for w in s.workers_list()), "all slots busy")
        s.kill_worker("w1")
        for t in ts:
            t.join(timeout=300)
        codes = sorted(r.status for r in results.values())
        assert codes == [200, 200, 503, 503], [(r.status, r.body[:200]) for r in results.values()]
        for r in results.values():
            if r.status == 503:
                assert "left" in r.json()["error"]["message"]
        assert s.get("/health").status == 200
        # The worker rejoins and serves again.
        s.start_worker("w1")
        s.wait(lambda: s.get("/ready").status == 200, "ready again")
        assert completion(s, [3], 4)["usage"]["completion_tokens"] == 4


def test_slow_client_backpressure():
    """A client that stops reading: its job stops being stepped once it is behind
    (its socket full, then the tokens published and not taken), another request
    runs meanwhile, and once the client reads again it gets the whole reply in
    order: the same token ids as a blocking request."""
    n = 8000  # with 20 logprobs a chunk is ~700 bytes: more than the socket buffers hold
    with stack(slots=2) as s:
        ready(s)
        body = {"model": MID, "prompt": "a", "max_tokens": n, "ignore_eos": True,
                "temperature": 0, "return_token_ids": True, "logprobs": 20}
        want = s.post("/v1/completions", body=body).json()["choices"][0]["token_ids"]
        assert len(want) == n
        data = json.dumps(dict(body, stream=True)).encode()
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window
        c.connect(("127.0.0.1", s.port))
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
        raw = c.recv(1024)
        assert raw.startswith(b"HTTP/1.1 200"), raw

        def fed():
            sl = [x for x in s.get("/admin/slots").json()["slots"] if x["state"] == "running"]
            return sl[0]["tokens"] if sl else None
        # The client reads nothing more: the job stalls short of its n tokens.
        prev, t0 = None, time.time()
        while time.time() - t0 < 60:
            time.sleep(0.4)
            cur = fed()
            if cur is not None and cur == prev:
                break
            prev = cur
        assert prev is not None and cur == prev and cur < n, (prev, cur)
        # Meanwhile another request runs on the other slot.
        r = s.post("/v1/completions", body={"model": MID, "prompt": "b", "max_tokens": 8})
        assert r.status == 200, r.body
        # Reading again: the job resumes and the whole reply arrives, in order.
        c.settimeout(60)
        while True:
            b = c.recv(65536)
            if not b:
                break
            raw += b
        c.close()
        events = raw.split(b"\r\n\r\n", 1)[1].decode().split("\n\n")
        payloads = [e[len("data: "):] for e in events if e.strip()]
        assert payloads[-1] == "[DONE]", payloads[-3:]
        got = [t for p in payloads[:-1] for t in json.loads(p)["choices"][0].get("token_ids", [])]
        assert got == want, (len(got), len(want))
        print(f"stalled at {cur} of {n} tokens while the client did not read", flush=True)


if __name__ == "__main__":
    rc = run_tests([
        test_models_and_shapes,
        test_stream_equals_blocking_and_framing,
        test_greedy_ids_consistent_with_wkvm_infer_same_backend,
        test_errors,
        test_no_worker_queue_full_timeout,
        test_concurrency_batch_invariance_and_seeds,
        test_worker_killed_mid_generation,
        test_slow_client_backpressure,
    ])
    TMP.cleanup()
    sys.exit(rc)
