"""Tool calls through the official OpenAI SDK on a model carrying Qwen3.5's template.

A random-weight Qwen3.5 (tests/reference/gen_qwen35.py --vocab 512) whose
tokenizer.json has raw-byte BPE pieces and seven added tokens (ids 505..511):
<|im_start|>, <|im_end|>, <think>, </think>, CALL, BAD and CALL2, where CALL
is the whole text of one call in Qwen3.5's XML format (get_weather, city
"Paris", days 3), BAD the same call missing its </parameter> and CALL2 a call
with a boolean (metric true). The model is
llama.cpp's Qwen3.5-4B.jinja (--chat-template; the corpus of
deploy/install-gguf-converter, which the jinja_corpus test also needs: the
test skips when it is absent). logit_bias on CALL (or BAD) and on <|im_end|>,
with the penalties, makes the model emit exactly [CALL, <|im_end|>]: a reply
the template would render for a call. Checks, with the SDK venv of
test_openai_client.py:
  - the reply parsed into message.tool_calls (id call_..., get_weather,
    arguments {"city": "Paris", "days": 3} typed by the schema), content
    null, finish_reason "tool_calls"; streamed: delta.tool_calls
    reassembled equal to the blocking message;
  - the agent's follow-up (the assistant tool_calls as the SDK returned
    them, arguments a JSON string, and the role "tool" result) rendered as
    Python jinja2 renders it with the arguments as an object (when the
    jinja_corpus venv is there), answered, resuming the checkpoint at the
    end of the previous reply (the template re-renders it byte for byte),
    the reused fraction printed, and equal to a recompute; a call the template
    renders back differently (true -> True) resumes the pre-reply checkpoint;
  - a malformed call (BAD) comes back as plain content; tool_choice "none"
    keeps the call text as content; bad tools are 400s ("required" and a
    named function: test_tool_constrained.py);
  - Open WebUI 0.12.4's native function calling shape (its builtin tools, no
    tool_choice, streamed, usage included) is answered.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import BUILD, Stack  # noqa: E402
from test_openai_client import ensure_venv, venv_python  # noqa: E402

REF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference")
SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
MID = "tiny-qwen35-tools"
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
BAD = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>"
# a call the template renders back differently (Python's True for the model's true)
CALL2 = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
         "<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>")
ADDED = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", CALL, BAD, CALL2]  # ids 505..511
BASE = 512 - len(ADDED)

CLIENT_SCRIPT = r'''
import json
import subprocess
import sys
import time
import traceback

import openai

URL, MID, MODEL, JINJA_PY, REF, TEMPLATE = sys.argv[1:7]
client = openai.OpenAI(base_url=URL + "/v1", api_key="none", max_retries=0, timeout=120)
tj = json.load(open(MODEL + "/tokenizer.json", encoding="utf-8"))
ADDED = {t["id"]: t["content"] for t in tj["added_tokens"]}
IM_END = [i for i, c in ADDED.items() if c == "<|im_end|>"][0]
CALL = [i for i, c in ADDED.items() if c.startswith("<tool_call>") and "days" in c][0]
BAD = [i for i, c in ADDED.items() if c.startswith("<tool_call>") and "</parameter>" not in c][0]
CALL2 = [i for i, c in ADDED.items() if c.startswith("<tool_call>") and "metric" in c][0]


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
PIECE = {i: bytes(U2B[ch] for ch in p) for p, i in tj["model"]["vocab"].items() if i not in ADDED}


def decode(ids):
    return b"".join(ADDED[i].encode() if i in ADDED else PIECE[i] for i in ids).decode(
        "utf-8", errors="replace")


def extra(obj, name):
    return (obj.model_extra or {}).get(name)


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
        "required": ["city"]}}}]
MSGS = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather in Paris?"}]
KW = {"enable_thinking": False}
shared = {}


def jinja2_render(messages, tools):
    """Python jinja2's rendering (transformers' environment), or None without the venv."""
    if not JINJA_PY:
        return None
    ctx = {"messages": messages, "tools": tools, "documents": None, "add_generation_prompt": True,
           "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "enable_thinking": False}
    script = ("import json, sys\nsys.path.insert(0, sys.argv[1])\nimport jinja_corpus\n"
              "src = open(sys.argv[2], encoding='utf-8').read()\n"
              "print(json.dumps(jinja_corpus.render_jinja2(src, json.load(sys.stdin))))")
    r = subprocess.run([JINJA_PY, "-c", script, REF, TEMPLATE], input=json.dumps([ctx]),
                       capture_output=True, text=True, timeout=60, check=True)
    out = json.loads(r.stdout)[0]
    assert out[0] == "ok", out
    return out[1]


def call_request(token, **kw):
    body = dict(model=MID, messages=MSGS, tools=TOOLS, max_tokens=4, temperature=0,
                frequency_penalty=2, presence_penalty=2,
                extra_body={"return_token_ids": True, "chat_template_kwargs": KW})
    body.update(kw)
    return body


def emit(token, **kw):
    """The smallest lead of token's bias over <|im_end|>'s that makes the reply [token, eos]."""
    for tenth in range(0, 120, 5):
        bias = {str(token): 100, str(IM_END): 100 - tenth / 10}
        r = client.chat.completions.create(**call_request(token, logit_bias=bias, **kw))
        ids = extra(r.choices[0], "token_ids")
        if ids[:1] == [token] and r.choices[0].finish_reason in ("stop", "tool_calls") and \
                token not in ids[1:]:
            return r, bias
    raise AssertionError("no bias made the model emit the token then stop")


def call_parsed():
    r, bias = emit(CALL)
    shared["bias"] = bias
    c = r.choices[0]
    m = c.message
    assert c.finish_reason == "tool_calls", c
    assert m.content is None, m
    assert len(m.tool_calls) == 1, m
    tc = m.tool_calls[0]
    assert tc.type == "function" and tc.id.startswith("call_") and len(tc.id) > 10, tc
    assert tc.function.name == "get_weather", tc
    assert json.loads(tc.function.arguments) == {"city": "Paris", "days": 3}, tc
    assert tc.function.arguments == '{"city": "Paris", "days": 3}', tc
    want = jinja2_render(MSGS, TOOLS)
    if want is not None:
        assert decode(extra(r, "prompt_token_ids")) == want, "prompt differs from jinja2's"
    shared["reply"] = r
    # streamed: delta.tool_calls with index, id and name first, then the arguments
    chunks = list(client.chat.completions.create(stream=True,
                                                 **call_request(CALL, logit_bias=bias)))
    calls, content, finish = {}, "", None
    for ch in chunks:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        finish = ch.choices[0].finish_reason or finish
        for t in d.tool_calls or []:
            if t.index not in calls:
                assert t.id and t.function.name and t.type == "function", t
                calls[t.index] = {"id": t.id, "name": t.function.name, "arguments": ""}
            else:
                assert t.id is None and t.function.name is None, t
            calls[t.index]["arguments"] += t.function.arguments or ""
    assert finish == "tool_calls" and content == "", (finish, content)
    assert [(c["name"], c["arguments"]) for c in calls.values()] == \
        [(t.function.name, t.function.arguments) for t in m.tool_calls], (calls, m)
    assert calls[0]["id"].startswith("call_"), calls
    # the SDK's own accumulation of a stream gives the blocking message
    helper = getattr(client.chat.completions, "stream", None) or \
        client.beta.chat.completions.stream
    with helper(**call_request(CALL, logit_bias=bias)) as st:
        final = st.get_final_completion()
    fm = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls" and not fm.content, final
    assert [(t.function.name, t.function.arguments) for t in fm.tool_calls] == \
        [(t.function.name, t.function.arguments) for t in m.tool_calls], (fm, m)
    print(f"call parsed (bias lead {100 - bias[str(IM_END)]:.1f}), blocking equal to the stream",
          flush=True)


def tool_follow_up():
    r = shared.get("reply")
    assert r is not None, "call_parsed did not run"
    m = r.choices[0].message
    tc = m.tool_calls[0]
    hist = MSGS + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": tc.id, "type": "function",
         "function": {"name": tc.function.name, "arguments": tc.function.arguments}}]},
        {"role": "tool", "tool_call_id": tc.id, "content": "18 C and sunny"}]
    body = dict(model=MID, messages=hist, tools=TOOLS, max_tokens=6, temperature=0,
                extra_body={"return_token_ids": True, "chat_template_kwargs": KW})
    a = client.chat.completions.create(**body)
    ids = extra(a, "prompt_token_ids")
    text = decode(ids)
    assert "<tool_response>\n18 C and sunny\n</tool_response>" in text, text
    # the arguments string reaches the template as the object it holds (vLLM's rule)
    as_obj = json.loads(json.dumps(hist))
    as_obj[2]["tool_calls"][0]["function"]["arguments"] = json.loads(tc.function.arguments)
    want = jinja2_render(as_obj, TOOLS)
    if want is not None:
        assert text == want, (text, want)
    first = extra(r, "prompt_token_ids") + extra(r.choices[0], "token_ids")
    assert ids[:len(first)] == first, "the follow-up does not extend the previous reply's tokens"
    cached = a.usage.prompt_tokens_details.cached_tokens
    n_prev = len(extra(r, "prompt_token_ids"))
    assert cached > n_prev, (cached, n_prev, a.usage)
    print(f"tool follow-up reused {cached} of {a.usage.prompt_tokens} prompt tokens "
          f"({100 * cached / a.usage.prompt_tokens:.0f}%; the previous prompt was {n_prev}, "
          f"its reply {len(first) - n_prev})", flush=True)
    b = client.chat.completions.create(**dict(body, extra_body=dict(body["extra_body"],
                                                                    cache=False)))
    assert b.usage.prompt_tokens_details.cached_tokens == 0, b.usage
    assert extra(a.choices[0], "token_ids") == extra(b.choices[0], "token_ids"), (a, b)
    assert a.choices[0].message == b.choices[0].message, (a.choices[0], b.choices[0])


def rerendered_differently():
    """The template prints the boolean back as True: the follow-up resumes before the reply."""
    r, _ = emit(CALL2)
    tc = r.choices[0].message.tool_calls[0]
    assert json.loads(tc.function.arguments) == {"city": "Rome", "metric": True}, tc
    hist = MSGS + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": tc.id, "type": "function",
         "function": {"name": tc.function.name, "arguments": tc.function.arguments}}]},
        {"role": "tool", "tool_call_id": tc.id, "content": "21 C"}]
    a = client.chat.completions.create(model=MID, messages=hist, tools=TOOLS, max_tokens=4,
                                       temperature=0, extra_body={"return_token_ids": True,
                                                                  "chat_template_kwargs": KW})
    text = decode(extra(a, "prompt_token_ids"))
    assert "<parameter=metric>\nTrue\n</parameter>" in text, text
    n_prev = len(extra(r, "prompt_token_ids"))
    cached = a.usage.prompt_tokens_details.cached_tokens
    assert n_prev - 1 <= cached <= n_prev, (cached, n_prev)
    print(f"re-rendered differently: follow-up reused {cached} of {a.usage.prompt_tokens} prompt "
          f"tokens (the previous prompt was {n_prev})", flush=True)


def malformed_is_content():
    r, _ = emit(BAD)
    c = r.choices[0]
    assert c.finish_reason == "stop" and not c.message.tool_calls, c
    assert c.message.content == ADDED[BAD], c.message


def tool_choice_none_and_forced():
    bias = shared["bias"]
    r = client.chat.completions.create(**call_request(CALL, logit_bias=bias, tool_choice="none"))
    c = r.choices[0]
    assert c.finish_reason == "stop" and not c.message.tool_calls, c
    assert c.message.content == ADDED[CALL], c.message
    # ("required" and a named function are constrained decoding: test_tool_constrained.py)
    for tools, param in (([{"type": "function", "function": {"name": "a b"}}],
                          "tools[0].function.name"),
                         ([{"type": "retrieval"}], "tools[0]"),
                         (TOOLS + TOOLS, "tools")):
        try:
            client.chat.completions.create(**call_request(CALL, tools=tools))
        except openai.BadRequestError as e:
            assert e.body["param"] == param, (e.body, param)
        else:
            raise AssertionError(f"tools {tools} accepted")
    try:
        client.chat.completions.create(model=MID, max_tokens=2, messages=MSGS + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "not json"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "x"}])
    except openai.BadRequestError as e:
        assert e.body["param"] == "messages[2].tool_calls[0].function.arguments", e.body
    else:
        raise AssertionError("arguments that are not JSON accepted")


def legacy_functions():
    """The deprecated functions / function_call fields: tools underneath, answered the old way."""
    bias = shared["bias"]
    fns = [t["function"] for t in TOOLS]
    # (the SDK still takes them; extra_body keeps this independent of its typing)
    req = call_request(CALL, logit_bias=bias)
    req["extra_body"] = dict(req["extra_body"], functions=fns)
    del req["tools"]
    r = client.chat.completions.create(**req)
    c = r.choices[0]
    assert c.finish_reason == "function_call", c
    assert not c.message.tool_calls and c.message.content is None, c.message
    fc = c.message.function_call
    assert fc.name == "get_weather" and json.loads(fc.arguments) == {"city": "Paris", "days": 3}, fc
    got, finish = {"name": None, "arguments": ""}, None
    for ch in client.chat.completions.create(stream=True, **req):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        finish = ch.choices[0].finish_reason or finish
        assert not d.tool_calls, d
        if d.function_call is not None:
            got["name"] = got["name"] or d.function_call.name
            got["arguments"] += d.function_call.arguments or ""
    assert finish == "function_call" and got == {"name": fc.name, "arguments": fc.arguments}, \
        (finish, got, fc)
    # function_call {"name"} forces that function (constrained, as tool_choice names one; spelled
    # out byte by byte: CALL is an added token, which the grammar keeps out of argument values)
    get_time = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}
    forced = dict(req, max_tokens=64, extra_body=dict(req["extra_body"], functions=fns + [get_time],
                                                      function_call={"name": "get_time"}))
    f = client.chat.completions.create(**forced)
    assert f.choices[0].finish_reason == "function_call", f.choices[0]
    assert f.choices[0].message.function_call.name == "get_time", f.choices[0]
    assert f.choices[0].message.function_call.arguments == "{}", f.choices[0]
    # the history the legacy API sends back: the assistant's function_call, a role "function"
    # result: rendered as the tools API's assistant tool_calls and role "tool" result are
    hist = MSGS + [{"role": "assistant", "content": None,
                    "function_call": {"name": fc.name, "arguments": fc.arguments}},
                   {"role": "function", "name": "get_weather", "content": "18 C and sunny"}]
    a = client.chat.completions.create(model=MID, messages=hist, max_tokens=4, temperature=0,
                                       extra_body={"return_token_ids": True, "functions": fns,
                                                   "chat_template_kwargs": KW})
    text = decode(extra(a, "prompt_token_ids"))
    assert "<tool_response>\n18 C and sunny\n</tool_response>" in text, text
    as_tools = MSGS + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_legacy_2", "type": "function",
         "function": {"name": fc.name, "arguments": json.loads(fc.arguments)}}]},
        {"role": "tool", "tool_call_id": "call_legacy_2", "name": "get_weather",
         "content": "18 C and sunny"}]
    want = jinja2_render(as_tools, TOOLS)
    if want is not None:
        assert text == want, (text, want)
    for extra_body, param in (({"functions": fns, "tools": TOOLS}, "functions"),
                              ({"functions": fns, "function_call": "required"}, "function_call"),
                              ({"functions": "x"}, "functions")):
        try:
            client.chat.completions.create(model=MID, messages=MSGS, max_tokens=2,
                                           extra_body=extra_body)
        except openai.BadRequestError as e:
            assert e.body["param"] == param, (e.body, param)
        else:
            raise AssertionError(f"{extra_body} accepted")


# Open WebUI 0.12.4's builtin tools, as native function calling sends them (no tool_choice)
BUILTIN = ["get_current_timestamp", "calculate_timestamp", "ask_user", "list_chat_files",
           "query_chat_files", "grep_chat_files", "view_file", "kb_exec", "query_knowledge_files",
           "view_note", "query_knowledge_bases", "search_knowledge_bases", "view_knowledge_file",
           "search_chats", "view_chat", "delegate_task", "timer", "search_web", "fetch_url",
           "generate_image", "edit_image", "execute_code", "search_notes", "write_note",
           "replace_note_content", "view_skill", "read_skill_file", "grep_skill_files"]


def open_webui_native():
    # (the first 4 of the 28: all 28 make a ~4000-token prompt, 17 s of CPU prefill;
    # test_openwebui_shape.py sends all 28 to a World model, validated the same way)
    tools = [{"type": "function", "function": {
        "name": n, "description": f"{n} (Open WebUI builtin)",
        "parameters": {"type": "object", "properties": {}, "required": []}}} for n in BUILTIN[:4]]
    chunks = list(client.chat.completions.create(
        model=MID, stream=True, messages=[{"role": "user", "content": "Hello there"}],
        tools=tools, max_tokens=8, temperature=0, stream_options={"include_usage": True}))
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1]
    assert finish in ("stop", "length", "tool_calls"), finish
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    calls = [t for ch in chunks if ch.choices for t in ch.choices[0].delta.tool_calls or []]
    assert finish != "tool_calls" or calls, (finish, text)
    assert chunks[-1].usage.prompt_tokens > 300, chunks[-1].usage  # (the tools are rendered)
    # its next request after running a call: the assistant turn as it accumulated the stream
    # (content "", the deltas' index kept) and the tool result with the function's name
    hist = [{"role": "user", "content": "Hello there"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"index": 0, "id": "call_x", "type": "function",
                 "function": {"name": "get_current_timestamp", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_x", "name": "get_current_timestamp",
             "content": "{\"timestamp\": 1764770000}"}]
    r = client.chat.completions.create(model=MID, messages=hist, tools=tools, max_tokens=4,
                                       temperature=0, extra_body={"return_token_ids": True})
    text = decode(extra(r, "prompt_token_ids"))
    assert "<function=get_current_timestamp>\n</function>" in text, text
    assert "<tool_response>\n{\"timestamp\": 1764770000}\n</tool_response>" in text, text


for t in (call_parsed, tool_follow_up, rerendered_differently, malformed_is_content,
          tool_choice_none_and_forced, legacy_functions, open_webui_native):
    try:
        t0 = time.monotonic()
        t()
        print(f"PASS {t.__name__} ({time.monotonic() - t0:.1f} s)", flush=True)
    except Exception as e:  # noqa: BLE001
        detail = "".join(traceback.format_exception_only(type(e), e)).strip()
        print(f"FAIL {t.__name__}: {detail[:2000]}", flush=True)
'''


def make_model(d):
    subprocess.run([SYSTEM_PYTHON, os.path.join(REF, "gen_qwen35.py"), "--out", d, "--seed", "21",
                    "--layers", "4", "--interval", "2", "--vocab", "512"],
                   check=True, capture_output=True, timeout=120)
    sys.path.insert(0, REF)
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
    for exe in ("controld/wkvm-controld", "workerd/wkvm-workerd"):
        if not os.access(os.path.join(BUILD, exe), os.X_OK):
            print(f"FAIL setup: {exe} is not built in {BUILD}")
            return 1
    sys.path.insert(0, REF)
    import jinja_corpus
    corpus = os.environ.get("WKVM_JINJA_CORPUS") or next(iter(sorted(glob.glob(os.path.join(
        jinja_corpus.CACHE, "llama.cpp-convert-*", "models", "templates")), reverse=True)), None)
    template = os.path.join(corpus, "Qwen3.5-4B.jinja") if corpus else ""
    if not os.path.exists(template):
        print("SKIP: no Qwen3.5-4B.jinja (deploy/install-gguf-converter keeps llama.cpp's "
              "templates; the jinja_corpus test needs them too)")
        return 77
    jinja_py = os.path.join(jinja_corpus.VENV, "bin", "python")
    jinja_py = jinja_py if os.path.exists(jinja_py) else ""
    venv = ensure_venv()
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="wkvm-tools-") as tmp:
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
            r = subprocess.run([venv_python(venv), script, s.url, MID, model, jinja_py, REF,
                                template], capture_output=True, text=True, timeout=300, env=env)
            lines = r.stdout.splitlines()
            if not jinja_py:
                lines.append("note: no jinja2 venv (the jinja_corpus test makes it): prompts "
                             "not compared with Python jinja2's")
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
