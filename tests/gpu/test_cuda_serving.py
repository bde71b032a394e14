"""The serving path on the CUDA backend: a controller and a worker with
--backend cuda (WKVM_TEST_BACKEND, default cuda here; the gpu suite), talking
HTTP as a client does, on a random RWKV-7 and a random Qwen3.5-layout hybrid
(Gated DeltaNet + gated attention over the device KV pool).

CUDA promises the CPU backend's results within a tolerance, not its bits
(tests/gpu/run_cuda_checks.py checks that), so nothing here compares with the
CPU. What it checks is what a user relies on: completions, streaming,
determinism of the same request, states that continue the same way every
time they are used (forks, a saved state, after the worker is killed and
restarted), and Responses turns that resume the previous response's state.
Without a device it skips (77) before starting anything; with
WKVM_TEST_BACKEND=cpu it runs the same checks on the CPU (how it was written
and is kept honest on machines without a GPU)."""
import http.client as http_client
import json
import os
import signal
import subprocess
import sys
import tempfile

os.environ.setdefault("WKVM_TEST_BACKEND", "cuda")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from wkvm_harness import MKMODEL, Stack, gen_qwen35, run_tests  # noqa: E402  (77 without a device)

TMP = tempfile.TemporaryDirectory(prefix="wkvm-cuda-serving-")


def mk_rwkv():
    d = os.path.join(TMP.name, "tiny")
    subprocess.run([MKMODEL, "--out", d, "--layers", "2", "--embd", "64", "--head-size", "16",
                    "--ffn", "128", "--vocab", "512", "--seed", "7"], check=True,
                   capture_output=True, timeout=60)
    return d


def mk_qwen35():
    return gen_qwen35(os.path.join(TMP.name, "tiny-qwen35"), 21)


P = [5, 6, 7, 8, 9, 10, 11, 12, 300, 301, 17]
Q = [40, 41, 42]


def up(s):
    s.start_controller()
    s.start_worker("w0")
    s.wait(lambda: s.get("/ready").status == 200, "ready")


def complete(s, mid, tokens, n=12, **samp):
    body = {"model": mid, "prompt": tokens, "max_tokens": n, "return_token_ids": True,
            "ignore_eos": True, "temperature": 0}
    body.update(samp)
    r = s.post("/v1/completions", body=body, timeout=120)
    assert r.status == 200, r.body
    ids = r.json()["choices"][0]["token_ids"]
    assert len(ids) == n and all(0 <= t < 512 for t in ids), ids
    return ids


def gen(s, ref, prompt_ids, n=12, save_as=None, **samp):
    body = {"max_tokens": n, "return_token_ids": True, "ignore_eos": True,
            "prompt_ids": prompt_ids, "temperature": 0}
    if save_as:
        body["save_as"] = save_as
    body.update(samp)
    r = s.post(f"/v1/states/{ref}/generate", body=body, timeout=120)
    assert r.status == 200, r.body
    return r.json()["choices"][0]["token_ids"]


def stream_chat(s, mid):
    """A streamed chat completion: every event parses, the stream ends with [DONE]."""
    c = http_client.HTTPConnection("127.0.0.1", s.port, timeout=120)
    c.request("POST", "/v1/chat/completions", body=json.dumps(
        {"model": mid, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8,
         "stream": True, "temperature": 0}), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    assert r.getheader("Content-Type").startswith("text/event-stream")
    events, done = 0, False
    for raw in r.read().decode(errors="replace").split("\n"):
        if not raw.startswith("data: "):
            continue
        if raw == "data: [DONE]":
            done = True
            continue
        json.loads(raw[6:])
        events += 1
    c.close()
    assert done and events >= 2, (events, done)


def test_rwkv7_completions_states_restart():
    model = mk_rwkv()
    with Stack(model=model, slots=4) as s:
        up(s)
        w = s.workers_list()[0]
        assert w["backend"] == os.environ["WKVM_TEST_BACKEND"], w
        a = complete(s, "tiny", P + Q)
        assert complete(s, "tiny", P + Q) == a  # the same request, the same tokens
        sampled = complete(s, "tiny", P, temperature=0.8, top_p=0.95, seed=1234)
        assert complete(s, "tiny", P, temperature=0.8, top_p=0.95, seed=1234) == sampled
        stream_chat(s, "tiny")
        r = s.post("/v1/states", body={"model": "tiny", "name": "base", "prompt_ids": P})
        assert r.status == 201, r.body
        first = gen(s, "base@1", Q)
        assert gen(s, "base@1", Q) == first  # a state is immutable: each use forks it
        saved = gen(s, "base@1", Q, save_as="next")
        assert saved == first
        more = gen(s, "next@1", [7, 8])
        assert gen(s, "next@1", [7, 8]) == more
        # the worker dies; the states continue the same way from the store
        s.kill_worker("w0", signal.SIGKILL)
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready after the worker's restart")
        assert gen(s, "base@1", Q) == first
        assert gen(s, "next@1", [7, 8]) == more


def responses_turn(s, mid, text, prev=None):
    body = {"model": mid, "input": text, "max_output_tokens": 8, "temperature": 0}
    if prev:
        body["previous_response_id"] = prev
    r = s.post("/v1/responses", body=body, timeout=120)
    assert r.status == 200, r.body
    j = r.json()
    assert j["status"] in ("completed", "incomplete"), j
    return j


def test_hybrid_responses_and_forks():
    model = mk_qwen35()
    mid = os.path.basename(model)
    with Stack(model=model, slots=4) as s:
        up(s)
        stream_chat(s, mid)
        t1 = responses_turn(s, mid, "Read text number one. " * 8)
        assert t1["usage"]["input_tokens_details"]["cached_tokens"] == 0, t1["usage"]
        t2 = responses_turn(s, mid, "go on", prev=t1["id"])
        cached = t2["usage"]["input_tokens_details"]["cached_tokens"]
        assert cached >= t1["usage"]["input_tokens"], (t1["usage"], t2["usage"])
        # a fork of the same previous response: the same state, the same reply
        t2b = responses_turn(s, mid, "go on", prev=t1["id"])
        assert [o.get("content") for o in t2b["output"]] == \
            [o.get("content") for o in t2["output"]], (t2["output"], t2b["output"])
        t3 = responses_turn(s, mid, "and then", prev=t2["id"])
        assert t3["usage"]["input_tokens_details"]["cached_tokens"] >= \
            t2["usage"]["input_tokens"], t3["usage"]


if __name__ == "__main__":
    rc = run_tests([test_rwkv7_completions_states_restart, test_hybrid_responses_and_forks])
    sys.exit(rc)
