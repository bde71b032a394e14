"""Constrained tool calls through the official OpenAI SDK (issue #29 item 3).

A random-weight Qwen3.5 (tests/reference/gen_qwen35.py --vocab 512, raw-byte
BPE pieces) with llama.cpp's Qwen3.5-4B.jinja, so the model has no idea what a
tool call is: with tool_choice "required" or a named function, every reply
must still be a call to an offered function whose arguments are valid for
the declared schema, only because the controller masks what the worker may
sample (wk_grammar). Added tokens: <|im_start|>, <|im_end|>, <think>,
</think> and "\\n</parameter>\\n", whose logit_bias (with '"''s and
<|im_end|>'s) lets raw and JSON strings and the list of calls end in a few
tokens instead of the thousands a random model would need; the bias changes
the odds, never what is allowed. Checks:
  - "required" across seeds and temperatures (greedy included): finish_reason
    "tool_calls", every call to an offered function, its arguments valid for
    the schema (a small JSON-schema check in the client: types, enum,
    required, no undeclared property, items, nested objects);
  - a named function with parallel_tool_calls false: exactly one call, to it;
  - streamed: the delta.tool_calls reassemble to the blocking message;
  - enable_thinking: free reasoning up to </think>, then the call;
  - a schema construct the grammar does not enforce ("pattern") is a 400
    naming it, param "tools"; "const" (Open WebUI 0.12.4's create_skill) is
    enforced as an enum of its one value;
  - an unconstrained request batched with constrained ones samples the same
    tokens as alone (masks go only to constrained rows).
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import Stack  # noqa: E402
from test_openai_client import ensure_venv, venv_python  # noqa: E402
import test_tool_calls as ttc  # noqa: E402

MID = "tiny-qwen35-constrained"
ADDED = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "\n</parameter>\n"]  # ids 507..511
BASE = 512 - len(ADDED)

CLIENT_SCRIPT = r'''
import json
import sys
import threading
import time
import traceback

import openai

URL, MID, MODEL = sys.argv[1:4]
client = openai.OpenAI(base_url=URL + "/v1", api_key="none", max_retries=0, timeout=120)
tj = json.load(open(MODEL + "/tokenizer.json", encoding="utf-8"))
ADDED = {t["id"]: t["content"] for t in tj["added_tokens"]}
END_PARAM = [i for i, c in ADDED.items() if c == "\n</parameter>\n"][0]
END_THINK = [i for i, c in ADDED.items() if c == "</think>"][0]
IM_END = [i for i, c in ADDED.items() if c == "<|im_end|>"][0]
QUOTE = tj["model"]["vocab"]['"']
# (end of text is allowed only once a call is complete: its bias ends the list of calls)
BIAS = {str(END_PARAM): 9, str(QUOTE): 6, str(IM_END): 9}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "days": {"type": "integer"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "detailed": {"type": "boolean"}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer"},
            "score": {"type": ["number", "null"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "filters": {"type": "object", "properties": {
                "lang": {"enum": ["en", "fr"]}, "year": {"type": "integer"}},
                "required": ["lang"]}},
            "required": ["query", "filters"]}}},
]
BY_NAME = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MSGS = [{"role": "user", "content": "What is the weather in Paris? Search if needed."}]


def valid(v, s, path="$"):
    """Raises when v is not valid for schema s (the subset the tools use)."""
    if "enum" in s:
        assert v in s["enum"], (path, v, s["enum"])
    types = s.get("type")
    types = [types] if isinstance(types, str) else types or []
    ok = {"string": lambda x: isinstance(x, str),
          "integer": lambda x: isinstance(x, int) and not isinstance(x, bool),
          "number": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
          "boolean": lambda x: isinstance(x, bool),
          "null": lambda x: x is None,
          "object": lambda x: isinstance(x, dict),
          "array": lambda x: isinstance(x, list)}
    assert not types or any(ok[t](v) for t in types), (path, v, types)
    if isinstance(v, dict):
        props = s.get("properties", {})
        for k in v:
            assert k in props, (path, "undeclared property", k)
            valid(v[k], props[k], f"{path}.{k}")
        for k in s.get("required", []):
            assert k in v, (path, "missing required", k)
    if isinstance(v, list):
        for i, x in enumerate(v):
            valid(x, s["items"], f"{path}[{i}]")


def check_calls(c, names=None, one=False):
    assert c.finish_reason == "tool_calls", (c.finish_reason, c.message)
    calls = c.message.tool_calls
    assert calls and (not one or len(calls) == 1), c.message
    for tc in calls:
        assert tc.function.name in (names or BY_NAME), tc
        args = json.loads(tc.function.arguments)
        valid(args, BY_NAME[tc.function.name])
    return calls


def body(**kw):
    b = dict(model=MID, messages=MSGS, tools=TOOLS, tool_choice="required", max_tokens=700,
             logit_bias=BIAS, extra_body={"chat_template_kwargs": {"enable_thinking": False},
                                          "return_token_ids": True})
    b.update(kw)
    return b


def required_seeds():
    n_calls = 0
    names = set()
    for seed, temp in ((1, 0.0), (2, 0.7), (3, 1.3), (4, 1.0), (5, 2.0)):
        r = client.chat.completions.create(**body(seed=seed, temperature=temp))
        calls = check_calls(r.choices[0])
        n_calls += len(calls)
        names |= {tc.function.name for tc in calls}
        print(f"  seed {seed} T={temp}: {len(calls)} call(s) "
              f"{[(tc.function.name, tc.function.arguments) for tc in calls]}"[:400], flush=True)
    print(f"{n_calls} calls over 5 replies, functions {sorted(names)}", flush=True)


def named_single():
    for seed in (7, 8):
        r = client.chat.completions.create(**body(
            seed=seed, temperature=1.0, parallel_tool_calls=False,
            tool_choice={"type": "function", "function": {"name": "search"}}))
        check_calls(r.choices[0], names={"search"}, one=True)


def streamed_equal():
    kw = dict(seed=11, temperature=0.9)
    whole = client.chat.completions.create(**body(**kw))
    calls = check_calls(whole.choices[0])
    got, finish = {}, None
    for ch in client.chat.completions.create(stream=True, **body(**kw)):
        if not ch.choices:
            continue
        finish = ch.choices[0].finish_reason or finish
        for t in ch.choices[0].delta.tool_calls or []:
            e = got.setdefault(t.index, {"name": t.function.name, "arguments": ""})
            e["arguments"] += t.function.arguments or ""
    assert finish == "tool_calls", finish
    assert [(e["name"], e["arguments"]) for _, e in sorted(got.items())] == \
        [(tc.function.name, tc.function.arguments) for tc in calls], (got, calls)


def thinking_first():
    bias = dict(BIAS, **{str(END_THINK): 7})
    r = client.chat.completions.create(**body(
        seed=3, temperature=1.0, logit_bias=bias,
        extra_body={"chat_template_kwargs": {"enable_thinking": True}}))
    check_calls(r.choices[0])
    rc = (r.choices[0].message.model_extra or {}).get("reasoning_content")
    print(f"  reasoning before the call: {len(rc or '')} bytes", flush=True)


def unsupported_schema():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}}}}]
    try:
        client.chat.completions.create(**body(tools=tools))
    except openai.BadRequestError as e:
        assert e.body["param"] == "tools", e.body
        assert "'pattern'" in e.body["message"] and "properties.a" in e.body["message"], e.body
    else:
        raise AssertionError("a schema with pattern was accepted")


def const_schema():
    """const is an enum of its one value: Open WebUI 0.12.4's builtin create_skill has
    files[].encoding {"const": "base64", "type": "string"} (once a 400 for every forced call
    over Open WebUI's tools)."""
    enc = {"const": "base64", "type": "string"}
    tools = TOOLS + [{"type": "function", "function": {"name": "set_encoding", "parameters": {
        "type": "object", "properties": {"encoding": enc, "files": {
            "type": "array", "items": {"type": "object", "properties": {"encoding": enc},
                                       "required": ["encoding"], "additionalProperties": False}}},
        "required": ["encoding"]}}}]
    for seed in (9, 10):
        r = client.chat.completions.create(**body(
            tools=tools, seed=seed, temperature=1.0, parallel_tool_calls=False,
            tool_choice={"type": "function", "function": {"name": "set_encoding"}}))
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", (c.finish_reason, c.message)
        args = json.loads(c.message.tool_calls[0].function.arguments)
        assert args["encoding"] == "base64" and set(args) <= {"encoding", "files"}, args
        assert all(f == {"encoding": "base64"} for f in args.get("files", [])), args
        print(f"  seed {seed}: set_encoding({json.dumps(args)})"[:300], flush=True)


def unconstrained_unchanged():
    free = dict(model=MID, messages=[{"role": "user", "content": "Tell me a story."}],
                max_tokens=24, temperature=0.9, seed=5,
                extra_body={"chat_template_kwargs": {"enable_thinking": False},
                            "return_token_ids": True, "cache": False})
    alone = client.chat.completions.create(**free)
    ids_alone = alone.choices[0].model_extra["token_ids"]
    out = {}

    def run(key, b):
        out[key] = client.chat.completions.create(**b)
    th = [threading.Thread(target=run, args=(f"c{i}", body(seed=20 + i, temperature=1.0)))
          for i in range(2)]
    th.append(threading.Thread(target=run, args=("free", free)))
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert out["free"].choices[0].model_extra["token_ids"] == ids_alone, "batched differs"
    for i in range(2):
        check_calls(out[f"c{i}"].choices[0])


for t in (required_seeds, named_single, streamed_equal, thinking_first, unsupported_schema,
          const_schema, unconstrained_unchanged):
    try:
        t0 = time.monotonic()
        t()
        print(f"PASS {t.__name__} ({time.monotonic() - t0:.1f} s)", flush=True)
    except Exception as e:  # noqa: BLE001
        detail = "".join(traceback.format_exception_only(type(e), e)).strip()
        print(f"FAIL {t.__name__}: {detail[:2000]}", flush=True)
'''


def make_model(d):
    subprocess.run([ttc.SYSTEM_PYTHON, os.path.join(ttc.REF, "gen_qwen35.py"), "--out", d,
                    "--seed", "23", "--layers", "2", "--interval", "2", "--vocab", "512"],
                   check=True, capture_output=True, timeout=120)
    sys.path.insert(0, ttc.REF)
    import bpe_json
    tj = bpe_json.tokenizer_json(BASE)
    for i, c in enumerate(ADDED):
        tj["model"]["vocab"][c] = BASE + i
        tj["added_tokens"].append({"id": BASE + i, "content": c, "single_word": False,
                                   "lstrip": False, "rstrip": False, "normalized": False,
                                   "special": i < 2})
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f)


def main():
    sys.path.insert(0, ttc.REF)
    import glob
    import jinja_corpus
    corpus = os.environ.get("WKVM_JINJA_CORPUS") or next(iter(sorted(glob.glob(os.path.join(
        jinja_corpus.CACHE, "llama.cpp-convert-*", "models", "templates")), reverse=True)), None)
    template = os.path.join(corpus, "Qwen3.5-4B.jinja") if corpus else ""
    if not os.path.exists(template):
        print("SKIP: no Qwen3.5-4B.jinja (deploy/install-gguf-converter keeps llama.cpp's templates)")
        return 77
    venv = ensure_venv()
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="wkvm-constrained-") as tmp:
        model = os.path.join(tmp, MID)
        make_model(model)
        script = os.path.join(tmp, "client.py")
        with open(script, "w") as f:
            f.write(CLIENT_SCRIPT)
        with Stack(model=model, slots=4, extra_ctl=["--chat-template", template]) as s:
            s.start_controller()
            s.start_worker("w0")
            s.wait(lambda: s.get("/ready").status == 200, "ready")
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("OPENAI_", "PYTHON"))}
            env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
            r = subprocess.run([venv_python(venv), script, s.url, MID, model],
                               capture_output=True, text=True, timeout=300, env=env)
            lines = r.stdout.splitlines()
            if r.returncode != 0:
                lines.append(f"FAIL client script: exit {r.returncode}\n{r.stderr[-3000:]}")
            if any(x.startswith("FAIL") for x in lines):
                lines.append(s.tail())
        for line in lines:
            print(line, flush=True)
            passed += line.startswith("PASS ")
            failed += line.startswith("FAIL ")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
