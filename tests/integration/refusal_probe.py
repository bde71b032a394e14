"""Refusal probe: sends bad bodies to the state, migrate, drain and Responses
routes of a running stack and prints every answer's status and body, one
JSON line each, so a refactor of the body parsers can be diffed against the
tree before it (not a test: no expectations of its own).

  python3 tests/integration/refusal_probe.py > before.jsonl   # on the old build
  WKVM_BUILD_DIR=... python3 tests/integration/refusal_probe.py > after.jsonl
  diff before.jsonl after.jsonl

Random-weight model, one CPU worker; a few seconds.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import MKMODEL, Stack, http  # noqa: E402

GENERIC = [b"", b"not json", b"[]", b"null", b"{", b"\"x\"", b"12", b"{\"a\":1}x",
           b"{\"a\":\xff}", b"{}"]

CREATE = [
    {"name": "s"}, {"prompt": "hi"}, {"name": 3, "prompt": "hi"}, {"name": "", "prompt": "hi"},
    {"name": "a/b", "prompt": "hi"}, {"name": "x" * 300, "prompt": "hi"},
    {"name": "s", "model": "nope", "prompt": "hi"}, {"name": "s", "model": 5, "prompt": "hi"},
    {"name": "s", "prompt": "hi", "prompt_ids": [1]},
    {"name": "s", "prompt": "hi", "messages": [{"role": "user", "content": "x"}]},
    {"name": "s", "prompt_ids": [1, 99999]}, {"name": "s", "prompt_ids": "x"},
    {"name": "s", "prompt_ids": []}, {"name": "s", "prompt": ""}, {"name": "s", "prompt": 7},
    {"name": "s", "prompt_ids": [1.5]}, {"name": "s", "prompt_ids": [-1]},
    {"name": "s", "messages": []}, {"name": "s", "messages": "x"},
    {"name": "s", "messages": [{"role": "bad", "content": "x"}]},
    {"name": "s", "messages": [{"content": "x"}]}, {"name": "s", "messages": [3]},
    {"name": "s", "messages": [{"role": "user", "content": 5}]},
    {"name": "s", "prompt": None, "prompt_ids": None, "messages": None},
]

GENERATE = [
    {"save_as": 3}, {"save_as": ""}, {"save_as": "a/b"}, {"prompt": "x", "prompt_ids": [1]},
    {"prompt_ids": [99999]}, {"prompt_ids": "x"}, {"messages": 4}, {"temperature": "hot"},
    {"temperature": 9}, {"top_p": 2}, {"max_tokens": -1}, {"max_tokens": "x"},
    {"max_tokens": 10 ** 9}, {"stream": "yes"}, {"stop": 5}, {"stop": ["a"] * 9},
    {"logit_bias": {"x": 1}}, {"logit_bias": {"99999": 1}}, {"logit_bias": 4}, {"n": 2},
    {"model": "nope"}, {"model": 4}, {"seed": "x"}, {"logprobs": "x"}, {"top_logprobs": 50},
    {"frequency_penalty": 5}, {"presence_penalty": "x"}, {"response_format": {"type": "x"}},
    {"tools": 3}, {"best_of": 3}, {"echo": True}, {"suffix": "x"},
    {"stream_options": {"include_usage": True}}, {"ignore_eos": 3},
]

FORK = [{}, {"name": 3}, {"name": ""}, {"name": "a/b"}, {"name": "f", "count": 0},
        {"name": "f", "count": 65}, {"name": "f", "count": "x"}, {"name": "f", "count": 1.5},
        {"count": 2}]

MIGRATE = [{}, {"to": 3}, {"to": ""}, {"to": "x" * 80}, {"to": "nope"}, {"to": None},
           {"to": ["w0"]}]

DRAIN = [{"undrain": 3}, {"undrain": "yes"}, {"undrain": None}, {"x": 1, "undrain": 1}]

RESP = [
    {}, {"input": "hi"}, {"model": "nope", "input": "hi"}, {"model": 3, "input": "hi"},
    {"model": "tiny"}, {"model": "tiny", "input": 3}, {"model": "tiny", "input": []},
    {"model": "tiny", "input": [3]}, {"model": "tiny", "input": [{"type": "bogus"}]},
    {"model": "tiny", "input": [{"role": "bad", "content": "x"}]},
    {"model": "tiny", "input": [{"role": "user", "content": 5}]},
    {"model": "tiny", "input": [{"role": "user", "content": [{"type": "input_image"}]}]},
    {"model": "tiny", "input": [{"type": "function_call", "call_id": "c", "name": "f",
                                 "arguments": "{}"}]},
    {"model": "tiny", "input": [{"type": "function_call_output", "call_id": "c",
                                 "output": "x"}]},
    {"model": "tiny", "input": [{"type": "reasoning", "summary": 3}]},
    {"model": "tiny", "input": "hi", "temperature": 5}, {"model": "tiny", "input": "hi", "top_p": 3},
    {"model": "tiny", "input": "hi", "max_output_tokens": 0},
    {"model": "tiny", "input": "hi", "max_output_tokens": 10 ** 9},
    {"model": "tiny", "input": "hi", "stream": 3}, {"model": "tiny", "input": "hi", "store": 3},
    {"model": "tiny", "input": "hi", "previous_response_id": "resp_nope"},
    {"model": "tiny", "input": "hi", "previous_response_id": 5},
    {"model": "tiny", "input": "hi", "instructions": 5},
    {"model": "tiny", "input": "hi", "metadata": {"k": 5}},
    {"model": "tiny", "input": "hi", "logit_bias": {"99999": 1}},
    {"model": "tiny", "input": "hi", "logit_bias": {"x": 1}},
    {"model": "tiny", "input": "hi", "tools": 3},
    {"model": "tiny", "input": "hi", "tools": [{"type": "function", "name": "f"}],
     "tool_choice": "required"},
    {"model": "tiny", "input": "hi", "tools": [{"type": "web_search"}]},
    {"model": "tiny", "input": "hi", "tool_choice": "bogus"},
    {"model": "tiny", "input": "hi", "reasoning": {"effort": "x"}},
    {"model": "tiny", "input": "hi", "text": {"format": {"type": "json_schema"}}},
    {"model": "tiny", "input": "hi", "background": True},
    {"model": "tiny", "input": "hi", "background": True, "store": False},
    {"model": "tiny", "input": "hi", "seed": "x"}, {"model": "tiny", "input": "hi", "n": 2},
    {"model": "tiny", "input": "hi", "truncation": "auto"},
    {"model": "tiny", "input": "hi", "include": ["x"]},
    {"model": "tiny", "input": "x" * 70000, "max_output_tokens": 1},
]


FN = [{"type": "function", "name": "get_weather", "description": "w",
       "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                      "required": ["city"]}}]
# With a model's own template (Qwen3.5-4B.jinja: hermes-style calls, think markers).
RESP_TPL = [
    {"model": "tiny", "input": "hi", "tools": FN, "tool_choice": "required"},
    {"model": "tiny", "input": "hi", "tools": FN,
     "tool_choice": {"type": "function", "name": "nope"}},
    {"model": "tiny", "input": "hi", "tools": FN,
     "tool_choice": {"type": "function", "name": "get_weather"}, "logit_bias": {"99999": 1}},
    {"model": "tiny", "input": "hi", "tool_choice": "required"},
    {"model": "tiny", "input": [{"role": "user", "content": "x"}] * 5000},
    {"model": "tiny", "input": [{"type": "function_call_output", "call_id": "c",
                                 "output": "x"}], "logit_bias": {"99999": 1}},
    {"model": "tiny", "input": [{"type": "function_call", "call_id": "c", "name": "f",
                                 "arguments": "{}"}], "tools": FN, "tool_choice": "required",
     "parallel_tool_calls": False, "logit_bias": {"99999": 1}},
    {"model": "tiny", "input": [{"type": "reasoning", "summary": [],
                                 "content": [{"type": "reasoning_text", "text": "t"}]},
                                {"role": "assistant", "content": "a"}, {"role": "user",
                                                                        "content": "b"}],
     "reasoning": {"effort": "none"}, "logit_bias": {"99999": 1}},
    {"model": "tiny", "input": "x" * 70000, "max_output_tokens": 1},
    {"model": "tiny", "input": "hi", "tools": FN,
     "tool_choice": {"type": "allowed_tools", "mode": "required",
                     "tools": [{"type": "function", "name": "get_weather"}]},
     "logit_bias": {"99999": 1}},
]


def enc(b):
    return b if isinstance(b, bytes) else json.dumps(b).encode()


def probe(s, route, bodies):
    for b in GENERIC + bodies:
        r = http("POST", s.url + route, body=enc(b))
        try:
            shown = json.loads(r.body)
        except ValueError:
            shown = r.body.decode(errors="replace")
        if 200 <= r.status < 300:
            shown = "(success: ids and times vary)"
        print(json.dumps({"route": route, "body": enc(b).decode(errors="replace")[:200],
                          "status": r.status, "answer": shown}, sort_keys=True))


def main():
    tmp = tempfile.TemporaryDirectory(prefix="wkvm-probe-")
    model = os.path.join(tmp.name, "tiny")
    subprocess.run([MKMODEL, "--out", model, "--layers", "2", "--embd", "64", "--head-size", "16",
                    "--ffn", "128", "--vocab", "512", "--seed", "7"], check=True,
                   capture_output=True, timeout=60)
    with Stack(model=model, slots=3, workers_expected=1) as s:
        s.start_controller()
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready")
        r = s.post("/v1/states", body={"name": "p", "prompt_ids": [3, 4, 5]})
        assert r.status == 201, r.body
        probe(s, "/v1/states", CREATE)
        probe(s, "/v1/states/p@1/generate", GENERATE)
        probe(s, "/v1/states/nope@1/generate", [{"save_as": 3}])
        probe(s, "/v1/states/p@1/fork", FORK)
        probe(s, "/v1/states/p@1/snapshot", [{"name": 3}])
        slots = [x for x in s.get("/admin/slots").json()["slots"] if x["state"] == "parked"]
        assert slots, s.get("/admin/slots").body
        probe(s, f"/admin/slots/{slots[0]['id']}/migrate", MIGRATE)
        probe(s, "/admin/workers/nope/drain", DRAIN)
        probe(s, "/v1/responses", RESP)
    import glob
    tpl = sorted(glob.glob(os.path.expanduser(
        "~/.cache/wkvm/llama.cpp-convert-*/models/templates/Qwen3.5-4B.jinja")))
    if not tpl:
        print("SKIP templated: no Qwen3.5-4B.jinja", file=sys.stderr)
        return
    with Stack(model=model, slots=3, extra_ctl=["--chat-template", tpl[-1]]) as s:
        s.start_controller()
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready")
        probe(s, "/v1/responses", RESP_TPL)


if __name__ == "__main__":
    main()
