"""Golden files for the HTTP JSON shapes. Volatile values (ids, times,
digests, generated text, host facts) are masked, so a diff in
tests/fixtures/golden/ is a change of the API's shape. Regenerate with
WKVM_GOLDEN_REGEN=1 and review the diff."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import MKMODEL, Stack, http, run_tests  # noqa: E402

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "fixtures", "golden")
REGEN = os.environ.get("WKVM_GOLDEN_REGEN") == "1"
VOLATILE = {"id", "created", "fingerprint", "token_digest", "pid", "hostname", "device",
            "device_mem_bytes", "steps", "tokens_generated", "connected", "seconds"}
TEXT = {"content", "text", "message"}


def mask(v, key=None):
    if isinstance(v, dict):
        return {k: mask(x, k) for k, x in sorted(v.items())}
    if isinstance(v, list):
        if key in ("token_ids", "bytes", "top_logprobs") or (v and all(isinstance(x, int) for x in v)):
            return f"<list of {type(v[0]).__name__ if v else 'any'}>"
        return [mask(x) for x in v]
    if key in VOLATILE:
        return f"<{type(v).__name__}>"
    if key in TEXT and isinstance(v, str):
        return "<text>"
    if isinstance(v, float):
        return "<float>"
    if key in ("logprob", "token") and not isinstance(v, (dict, list)):
        return f"<{type(v).__name__}>"
    return v


def check(name, value):
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
            check("ready_503", s.get("/ready").json())
            s.start_worker("w0")
            s.wait(lambda: s.get("/ready").status == 200, "ready")
            check("ready_200", s.get("/ready").json())
            check("health", s.get("/health").json())
            check("admin_workers", s.get("/admin/workers").json())
            check("models", s.get("/v1/models").json())
            chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 4, "temperature": 0}
            check("chat_completion", s.post("/v1/chat/completions", body=chat).json())
            check("chat_completion_logprobs", s.post("/v1/chat/completions", body=dict(
                chat, logprobs=True, top_logprobs=2)).json())
            r = http("POST", s.url + "/v1/chat/completions", body=dict(
                chat, stream=True, stream_options={"include_usage": True}))
            events = [e[6:] for e in r.body.decode().split("\n\n") if e.startswith("data: ")]
            check("chat_completion_stream", [e if e == "[DONE]" else json.loads(e) for e in events])
            check("completion", s.post("/v1/completions", body={
                "model": "tiny", "prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0,
                "return_token_ids": True}).json())
            check("error_400_field", s.post("/v1/chat/completions", body=dict(
                chat, n=3)).json())
            check("error_404_model", s.post("/v1/chat/completions", body=dict(
                chat, model="nope")).json())
            check("error_413", s.post("/v1/chat/completions", body=dict(
                chat, messages=[{"role": "user", "content": "x" * 4000}])).json())
            check("error_404_route", s.get("/v1/nothing").json())
            st = s.post("/v1/states", body={"name": "g", "prompt_ids": [1, 2, 3]}).json()
            check("state_created", st)
            check("state_get", s.get("/v1/states/g@1").json())
            check("state_list", s.get("/v1/states").json())
            check("state_generate_save", s.post("/v1/states/g@1/generate", body={
                "max_tokens": 2, "temperature": 0, "save_as": "g2"}).json())
            check("admin_slots", s.get("/admin/slots").json())


if __name__ == "__main__":
    sys.exit(run_tests([test_shapes]))
