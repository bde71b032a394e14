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
    # (the smallest of these biases on </think> that still ends the reasoning in time; no
    # control token but </think> itself in the reasoning: the grammar keeps them out of free
    # text, and "\n</parameter>\n"'s bias would otherwise fill it)
    for b in (3, 5, 7):
        bias = dict(BIAS, **{str(END_THINK): b})
        r = client.chat.completions.create(**body(
            seed=3, temperature=1.0, logit_bias=bias, max_tokens=300,
            extra_body={"chat_template_kwargs": {"enable_thinking": True},
                        "return_token_ids": True}))
        if r.choices[0].finish_reason == "tool_calls":
            break
    check_calls(r.choices[0])
    ids = r.choices[0].model_extra["token_ids"]
    k = ids.index(END_THINK)
    assert not set(ids[:k]) & set(ADDED), ids[:k]
    rc = (r.choices[0].message.model_extra or {}).get("reasoning_content")
    print(f"  reasoning before the call: {len(rc or '')} bytes ({k} tokens, </think> bias {b})",
          flush=True)


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


# The other formats' round trips (issue #29): the same random weights with the
# real template of Nemotron Nano v2 (<TOOLCALL>[...] JSON, thinking on by
# default), Nemotron-3-Nano (the XML format, its own rendering of history) and
# Granite 4.0 (Hermes JSON in <tool_call>), each with the template's markers as
# added tokens (ADDED: special ones first) and its eos. A forced call
# (tool_choice "required"), the stream reassembled equal to it, the agent's
# follow-up (the SDK's assistant message and a role "tool" result) rendered as
# Python jinja2 renders it, answered, its reused prompt tokens printed and
# checked against the checkpoints the previous request left.
FORMATS = [
    {"name": "nemotron-nano-v2", "template": "NVIDIA-Nemotron-Nano-v2.jinja", "fmt": "nemotron",
     "added": ["<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<think>", "</think>",
               "<TOOLCALL>", "</TOOLCALL>"], "n_special": 3, "eos": "<SPECIAL_12>",
     "kwargs": {}, "thinks": True, "object_args": False},
    {"name": "nemotron-3-nano", "template": "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
     "fmt": "xml", "added": ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
                             "</tool_call>", "\n</parameter>\n"], "n_special": 2,
     "eos": "<|im_end|>", "kwargs": {"enable_thinking": False}, "thinks": False,
     "object_args": True},
    {"name": "granite-4.0", "template": "ibm-granite-granite-4.0.jinja", "fmt": "granite",
     "added": ["<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<tool_call>",
               "</tool_call>"], "n_special": 3, "eos": "<|end_of_text|>", "kwargs": {},
     "thinks": False, "object_args": False},
]

ROUND_TRIP_SCRIPT = r'''
import json
import subprocess
import sys
import time
import traceback

import openai

URL, MID, MODEL, CONF, JINJA_PY, REF, TEMPLATE = sys.argv[1:8]
CONF = json.loads(CONF)
client = openai.OpenAI(base_url=URL + "/v1", api_key="none", max_retries=0, timeout=120)
tj = json.load(open(MODEL + "/tokenizer.json", encoding="utf-8"))
ADDED = {t["id"]: t["content"] for t in tj["added_tokens"]}
TOK = {c: i for i, c in ADDED.items()}
VOCAB = tj["model"]["vocab"]


def b2u():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


U2B = b2u()
PIECE = {i: bytes(U2B[ch] for ch in p) for p, i in VOCAB.items() if i not in ADDED}


def decode(ids):
    return b"".join(ADDED[i].encode() if i in ADDED else PIECE[i] for i in ids).decode(
        "utf-8", errors="replace")


def extra(obj, name):
    return (obj.model_extra or {}).get(name)


# ends strings, objects and the list of calls in a few tokens (the odds, never what is allowed)
BIAS = {str(TOK[CONF["eos"]]): 9, str(VOCAB['"']): 6, str(VOCAB["}"]): 6}
for marker, b in (("</think>", 8), ("\n</parameter>\n", 9), ("</tool_call>", 6),
                  ("</TOOLCALL>", 6)):
    if marker in TOK:
        BIAS[str(TOK[marker])] = b
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"], "additionalProperties": False}}}]
MSGS = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather in Paris?"}]
shared = {}


def body(**kw):
    b = dict(model=MID, messages=MSGS, tools=TOOLS, tool_choice="required", max_tokens=160,
             temperature=0.8, seed=4, logit_bias=BIAS,
             extra_body={"chat_template_kwargs": CONF["kwargs"], "return_token_ids": True})
    b.update(kw)
    return b


def jinja2_render(messages, tools, gen=True):
    """Python jinja2's rendering (transformers' environment), or None without the venv."""
    if not JINJA_PY:
        return None
    ctx = dict({"messages": messages, "tools": tools, "documents": None,
                "add_generation_prompt": gen, "eos_token": CONF["eos"]}, **CONF["kwargs"])
    script = ("import json, sys\nsys.path.insert(0, sys.argv[1])\nimport jinja_corpus\n"
              "src = open(sys.argv[2], encoding='utf-8').read()\n"
              "print(json.dumps(jinja_corpus.render_jinja2(src, json.load(sys.stdin))))")
    r = subprocess.run([JINJA_PY, "-c", script, REF, TEMPLATE], input=json.dumps([ctx]),
                       capture_output=True, text=True, timeout=60, check=True)
    out = json.loads(r.stdout)[0]
    assert out[0] == "ok", out
    return out[1]


def forced_call():
    r = client.chat.completions.create(**body())
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", (c.finish_reason, c.message)
    calls = c.message.tool_calls
    assert calls and all(t.function.name == "get_weather" for t in calls), c.message
    for t in calls:
        args = json.loads(t.function.arguments)
        assert isinstance(args.get("city"), str) and set(args) <= {"city", "days"}, args
        assert isinstance(args.get("days", 0), int), args
    want = jinja2_render(MSGS, TOOLS)
    if want is not None:
        assert decode(extra(r, "prompt_token_ids")) == want, "prompt differs from jinja2's"
    rc = extra(c.message, "reasoning_content")
    # (a thinking template's prompt opens <think>: the grammar lets the model close it first,
    # and the marker is in neither the reasoning nor the content)
    assert not CONF["thinks"] or TOK["</think>"] in extra(c, "token_ids"), c
    got, finish, reasoning = {}, None, ""
    for ch in client.chat.completions.create(stream=True, **body()):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        finish = ch.choices[0].finish_reason or finish
        reasoning += extra(d, "reasoning_content") or ""
        assert not d.content, d
        for t in d.tool_calls or []:
            e = got.setdefault(t.index, {"id": t.id, "name": t.function.name, "arguments": ""})
            e["arguments"] += t.function.arguments or ""
    assert finish == "tool_calls", finish
    assert [(e["name"], e["arguments"]) for _, e in sorted(got.items())] == \
        [(t.function.name, t.function.arguments) for t in calls], (got, calls)
    assert reasoning == (rc or ""), (reasoning, rc)
    shared["reply"] = r
    print(f"  {CONF['name']}: {len(calls)} call(s) "
          f"{[(t.function.name, t.function.arguments) for t in calls]}, reasoning "
          f"{len(rc or '')} bytes, {len(extra(c, 'token_ids'))} tokens"[:300], flush=True)


def tool_round_trip():
    r = shared.get("reply")
    assert r is not None, "forced_call did not run"
    m = r.choices[0].message
    hist = MSGS + [{"role": "assistant", "content": m.content, "tool_calls": [
        {"id": t.id, "type": "function",
         "function": {"name": t.function.name, "arguments": t.function.arguments}}
        for t in m.tool_calls]}]
    hist += [{"role": "tool", "tool_call_id": t.id, "content": f"18 C in call {k}"}
             for k, t in enumerate(m.tool_calls)]
    fb = dict(model=MID, messages=hist, tools=TOOLS, max_tokens=6, temperature=0,
              extra_body={"chat_template_kwargs": CONF["kwargs"], "return_token_ids": True})
    a = client.chat.completions.create(**fb)
    ids = extra(a, "prompt_token_ids")
    text = decode(ids)
    assert "18 C in call 0" in text, text
    sent = json.loads(json.dumps(hist))
    if CONF["object_args"]:  # (the template iterates arguments|items: vLLM's rule)
        for t in sent[2]["tool_calls"]:
            t["function"]["arguments"] = json.loads(t["function"]["arguments"])
    want = jinja2_render(sent, TOOLS)
    if want is not None:
        assert text == want, (text, want)
    assert a.choices[0].finish_reason in ("stop", "length", "tool_calls"), a.choices[0]
    # the checkpoints the call request left: after each eos token of its prompt, where its
    # history ends before the generation prompt (the token boundary at or before it), before
    # its last token, at the end of its reply; the longest that prefixes this prompt is resumed
    prev = extra(r, "prompt_token_ids")
    reply = extra(r.choices[0], "token_ids")
    eos = TOK[CONF["eos"]]
    marks = [i + 1 for i, t in enumerate(prev) if t == eos] + [len(prev) - 1]
    marks.append(len(prev) + len(reply))
    hist = jinja2_render(MSGS, TOOLS, gen=False)
    if hist is not None:
        acc, target = 0, len(hist.encode())
        for i, t in enumerate(prev):
            acc += len(ADDED[t].encode() if t in ADDED else PIECE[t])
            if acc > target:
                marks.append(i)
                break
    full = prev + reply
    want_cached = max([k for k in marks if ids[:k] == full[:k]] or [0])
    lcp = next((i for i, (x, y) in enumerate(zip(ids, full)) if x != y), min(len(ids), len(full)))
    cached = a.usage.prompt_tokens_details.cached_tokens
    print(f"  {CONF['name']}: tool follow-up reused {cached} of {a.usage.prompt_tokens} prompt "
          f"tokens ({100 * cached / a.usage.prompt_tokens:.0f}%; shares {lcp} with the previous "
          f"prompt {len(prev)} + reply {len(reply)})", flush=True)
    assert want_cached <= cached <= lcp, (cached, want_cached, lcp)
    b = client.chat.completions.create(**dict(fb, extra_body=dict(fb["extra_body"], cache=False)))
    assert b.usage.prompt_tokens_details.cached_tokens == 0, b.usage
    assert extra(a.choices[0], "token_ids") == extra(b.choices[0], "token_ids"), (a, b)


for t in (forced_call, tool_round_trip):
    try:
        t0 = time.monotonic()
        t()
        print(f"PASS {CONF['name']} {t.__name__} ({time.monotonic() - t0:.1f} s)", flush=True)
    except Exception as e:  # noqa: BLE001
        detail = "".join(traceback.format_exception_only(type(e), e)).strip()
        print(f"FAIL {CONF['name']} {t.__name__}: {detail[:2000]}", flush=True)
'''


def make_weights(d):
    subprocess.run([ttc.SYSTEM_PYTHON, os.path.join(ttc.REF, "gen_qwen35.py"), "--out", d,
                    "--seed", "23", "--layers", "2", "--interval", "2", "--vocab", "512"],
                   check=True, capture_output=True, timeout=120)


def write_tokenizer(d, added, n_special, eos):
    """A raw-byte BPE of 512 - len(added) pieces, then added (the first n_special special)."""
    sys.path.insert(0, ttc.REF)
    import bpe_json
    base = 512 - len(added)
    tj = bpe_json.tokenizer_json(base)
    for i, c in enumerate(added):
        tj["model"]["vocab"][c] = base + i
        tj["added_tokens"].append({"id": base + i, "content": c, "single_word": False,
                                   "lstrip": False, "rstrip": False, "normalized": False,
                                   "special": i < n_special})
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": eos, "pad_token": "<|endoftext|>"}, f)


def make_model(d):
    make_weights(d)
    write_tokenizer(d, ADDED, 2, "<|im_end|>")


def format_model(weights, d, conf):
    """A directory of weights' files (linked) with conf's tokenizer."""
    os.makedirs(d)
    for f in os.listdir(weights):
        if not f.startswith("tokenizer"):
            os.symlink(os.path.join(weights, f), os.path.join(d, f))
    write_tokenizer(d, conf["added"], conf["n_special"], conf["eos"])


def run_client(s, venv, args):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PYTHON"))}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    r = subprocess.run([venv_python(venv)] + args, capture_output=True, text=True, timeout=300,
                       env=env)
    lines = r.stdout.splitlines()
    if r.returncode != 0:
        lines.append(f"FAIL client script: exit {r.returncode}\n{r.stderr[-3000:]}")
    if any(x.startswith("FAIL") for x in lines):
        lines.append(s.tail())
    return lines


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
            lines = run_client(s, venv, [script, s.url, MID, model])
        rt_script = os.path.join(tmp, "round_trip.py")
        with open(rt_script, "w") as f:
            f.write(ROUND_TRIP_SCRIPT)
        jinja_py = os.path.join(jinja_corpus.VENV, "bin", "python")
        jinja_py = jinja_py if os.path.exists(jinja_py) else ""
        if not jinja_py:
            lines.append("note: no jinja2 venv (the jinja_corpus test makes it): prompts "
                         "not compared with Python jinja2's")
        for conf in FORMATS:
            tpl = os.path.join(corpus, conf["template"])
            if not os.path.exists(tpl):
                lines.append(f"FAIL {conf['name']}: no {tpl} in the template corpus")
                continue
            d = os.path.join(tmp, conf["name"])
            format_model(model, d, conf)
            with Stack(model=d, slots=2, extra_ctl=["--chat-template", tpl]) as s:
                s.start_controller()
                s.start_worker("w0")
                s.wait(lambda: s.get("/ready").status == 200, "ready")
                lines += run_client(s, venv, [rt_script, s.url, conf["name"], d, json.dumps(conf),
                                              jinja_py, ttc.REF, tpl])
        for line in lines:
            print(line, flush=True)
            passed += line.startswith("PASS ")
            failed += line.startswith("FAIL ")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
