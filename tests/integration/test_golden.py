"""Golden files for the HTTP JSON shapes, with the HTTP status of every
answer asserted. Only values that really vary are masked: hex in ids
(chatcmpl-<hex>), timestamps (checked to be now-ish), host facts and clocks
(pid, hostname, device, memory, uptimes, durations), and the model's output
(generated text and ids, logprobs: float rounding differs across CPUs and ISAs,
so only their count is kept). Everything else stays in the files: error types,
codes, params and messages, object kinds, finish_reason, usage, names, state
ids, versions, fingerprints and digests, the role chunk's empty content. A diff
in tests/fixtures/golden/ is a change of the API. Regenerate with
WKVM_GOLDEN_REGEN=1 and review the diff."""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import MKMODEL, Stack, http, run_tests  # noqa: E402

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "fixtures", "golden")
REGEN = os.environ.get("WKVM_GOLDEN_REGEN") == "1"
HOST = {"pid", "hostname", "device", "device_mem_bytes", "connected", "seconds"}
GENERATED = {"content", "text"}  # model output (never an error's message)
HEX = re.compile(r"[0-9a-f]{16,}")


def mask(v, key=None):
    if isinstance(v, dict):
        return {k: mask(x, k) for k, x in sorted(v.items())}
    if isinstance(v, list):
        if key == "token_ids":  # generated ids: their number is stable, not their values
            assert all(isinstance(x, int) for x in v), v
            return f"<{len(v)} ints>"
        if key in ("tokens", "text_offset", "token_logprobs"):  # completions logprobs
            return f"<{len(v)} {type(v[0]).__name__ if v else 'item'}s>"
        if key == "top_logprobs" and all(isinstance(x, dict) and "logprob" not in x for x in v):
            # completions: per token a map of token text -> logprob
            assert all(1 <= len(x) and all(isinstance(f, float) for f in x.values()) for x in v), v
            return f"<{len(v)} maps>"
        if key == "bytes":  # a generated token's bytes
            assert all(isinstance(x, int) and 0 <= x < 256 for x in v), v
            return "<bytes>"
        return [mask(x) for x in v]
    if key == "created":
        assert isinstance(v, int) and abs(v - time.time()) < 86400, ("created", v)
        return "<timestamp>"
    if key in HOST:
        return f"<{type(v).__name__}>"
    if key == "id" and isinstance(v, str):
        return HEX.sub("<hex>", v)
    if key in GENERATED and isinstance(v, str):
        return "<text>" if v else v
    if key == "token" and isinstance(v, str):
        return "<token>"
    if isinstance(v, float):
        return "<float>"
    return v


def check(name, r, status):
    """r: a harness Response; its status must be status and its JSON the golden one."""
    assert r.status == status, f"{name}: HTTP {r.status}, expected {status}: {r.body[:300]!r}"
    check_value(name, r.json())


def check_value(name, value):
    path = os.path.join(GOLDEN, name + ".json")
    text = json.dumps(mask(value), indent=2, sort_keys=True) + "\n"
    if REGEN or not os.path.exists(path):
        if not REGEN:
            raise AssertionError(f"golden file {path} is missing (run with WKVM_GOLDEN_REGEN=1)")
        with open(path, "w") as f:
            f.write(text)
        return
    with open(path) as f:
        want = f.read()
    assert text == want, f"{name}: shape changed\n--- want\n{want}\n--- got\n{text}"


def test_shapes():
    with tempfile.TemporaryDirectory() as d:
        model = os.path.join(d, "tiny")
        subprocess.run([MKMODEL, "--out", model, "--layers", "2", "--embd", "64",
                        "--head-size", "16", "--ffn", "128", "--vocab", "512"], check=True,
                       capture_output=True, timeout=60)
        with Stack(model=model, slots=2, extra_ctl=["--max-body", "2048"]) as s:
            s.start_controller()
            check("ready_503", s.get("/ready"), 503)
            s.start_worker("w0")
            s.wait(lambda: s.get("/ready").status == 200, "ready")
            check("ready_200", s.get("/ready"), 200)
            check("health", s.get("/health"), 200)
            check("admin_workers", s.get("/admin/workers"), 200)
            check("models", s.get("/v1/models"), 200)
            chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 4, "temperature": 0}
            check("chat_completion", s.post("/v1/chat/completions", body=chat), 200)
            check("chat_completion_logprobs", s.post("/v1/chat/completions", body=dict(
                chat, logprobs=True, top_logprobs=2)), 200)
            r = http("POST", s.url + "/v1/chat/completions", body=dict(
                chat, stream=True, stream_options={"include_usage": True}))
            assert r.status == 200, r.body
            events = [e[6:] for e in r.body.decode().split("\n\n") if e.startswith("data: ")]
            chunks = [json.loads(e) for e in events if e != "[DONE]"]
            # one completion: every chunk carries the same id and time
            assert len({c["id"] for c in chunks}) == 1, [c["id"] for c in chunks]
            assert len({c["created"] for c in chunks}) == 1, [c["created"] for c in chunks]
            check_value("chat_completion_stream",
                        [e if e == "[DONE]" else json.loads(e) for e in events])
            check("completion", s.post("/v1/completions", body={
                "model": "tiny", "prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0,
                "return_token_ids": True}), 200)
            check("error_400_field", s.post("/v1/chat/completions", body=dict(
                chat, n=3)), 400)
            check("error_400_unknown_field", s.post("/v1/chat/completions", body=dict(
                chat, foo=1)), 400)
            check("completion_logprobs", s.post("/v1/completions", body={
                "model": "tiny", "prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0,
                "logprobs": 2}), 200)
            check("error_400_prompt_batch", s.post("/v1/completions", body={
                "model": "tiny", "prompt": ["a", "b"], "max_tokens": 3}), 400)
            check("model_get", s.get("/v1/models/tiny"), 200)
            check("error_404_model_get", s.get("/v1/models/nope"), 404)
            check("error_404_model", s.post("/v1/chat/completions", body=dict(
                chat, model="nope")), 404)
            check("error_413", s.post("/v1/chat/completions", body=dict(
                chat, messages=[{"role": "user", "content": "x" * 4000}])), 413)
            check("error_404_route", s.get("/v1/nothing"), 404)
            check("state_created", s.post("/v1/states", body={
                "name": "g", "prompt_ids": [1, 2, 3]}), 201)
            check("state_get", s.get("/v1/states/g@1"), 200)
            check("state_list", s.get("/v1/states"), 200)
            check("state_generate_save", s.post("/v1/states/g@1/generate", body={
                "max_tokens": 2, "temperature": 0, "save_as": "g2"}), 200)
            check("admin_slots", s.get("/admin/slots"), 200)


if __name__ == "__main__":
    sys.exit(run_tests([test_shapes]))
