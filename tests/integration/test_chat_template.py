"""A model's own chat template and reasoning, through the official OpenAI SDK.

A random-weight Qwen3.5 (tests/reference/gen_qwen35.py --vocab 512) whose
tokenizer.json has raw-byte BPE pieces and the added tokens <|im_start|>,
<|im_end|>, <think>, </think> (ids 508..511), tokenizer_config.json names
<|im_end|> the eos token, and chat_template.jinja is a small Qwen3-style
template (enable_thinking, earlier turns' reasoning dropped). Checks, with the
SDK venv of test_openai_client.py:
  - the prompt token ids the server reports decode to wkvm-template's
    rendering of the same request, each added token one id;
  - chat_template_kwargs {"enable_thinking": false} reaches the template;
  - the template's eos token ends the generation (logit_bias on it);
  - the reply split at the think markers (logit_bias + penalties make the
    model close its thinking mid-reply): reasoning_content / content equal
    the decoded token ids either side of </think>, and a stream's
    delta.reasoning_content / delta.content reassemble to the blocking reply;
  - a follow-up resumes a checkpoint (cached_tokens > 0) and equals a
    recompute (cache: false), reported prompt ids included;
  - parent-token-v1 on a templated model with Open WebUI's headers and history
    (the reply's content, stripped): turn 2 continues every token of turn 1,
    its reasoning included, then the template's text after that turn, equal to
    recomputing those tokens; an edited reply is rejected and served by the
    prefix index;
  - tools, assistant tool_calls and role "tool" messages reach the template;
  - --chat-template FILE overrides the model's template; with llama.cpp's
    Qwen3.5-4B.jinja (the corpus of deploy/install-gguf-converter, when there)
    the prompt ids decode to Python jinja2's rendering (the corpus test's
    transformers environment), thinking on and off, and a follow-up reuses;
  - the same directory without a template keeps the World format and refuses
    chat_template_kwargs.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import BUILD, Stack, http  # noqa: E402
from test_openai_client import ensure_venv, skip, venv_python  # noqa: E402,F401

REF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference")
TEMPLATE_EXE = os.path.join(BUILD, "tools", "wkvm-template")
SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
MID = "tiny-qwen35"
ADDED = ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]  # ids 508..511

TEMPLATE = r"""{%- for message in messages -%}
{%- if message.role == "assistant" -%}
{%- set content = message.content -%}
{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1].lstrip('\n') -%}{%- endif -%}
{{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- else -%}{{- '<think>\n' -}}{%- endif -%}
{%- endif -%}
"""
OVERRIDE = "{%- for m in messages -%}{{ '<|im_start|>' + m.role + ':' + m.content + '<|im_end|>' }}" \
           "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_start|>assistant:' }}{%- endif -%}" \
           "{%- if reasoning_effort is defined -%}{{ '[' + reasoning_effort + ']' }}{%- endif -%}"

CLIENT_SCRIPT = r'''
import json
import subprocess
import sys
import traceback

import openai

URL, MID, MODEL, TEMPLATE_EXE = sys.argv[1:5]
client = openai.OpenAI(base_url=URL + "/v1", api_key="none", max_retries=0, timeout=120)
tj = json.load(open(MODEL + "/tokenizer.json", encoding="utf-8"))
ADDED = {t["id"]: t["content"] for t in tj["added_tokens"]}


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


def render(messages, kwargs=None):
    req = {"messages": messages}
    if kwargs is not None:
        req["chat_template_kwargs"] = kwargs
    r = subprocess.run([TEMPLATE_EXE, "--model", MODEL, "-"], input=json.dumps(req).encode(),
                       capture_output=True, timeout=60, check=True)
    return r.stdout.decode("utf-8")


def extra(obj, name):
    return (obj.model_extra or {}).get(name)


MSGS = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say something about state slots."}]
IM_START, IM_END, THINK, THINK_END = 508, 509, 510, 511
shared = {}


def check_prompt(r, messages, kwargs=None):
    ids = extra(r, "prompt_token_ids")
    want = render(messages, kwargs)
    assert decode(ids) == want, (decode(ids), want)
    assert ids.count(IM_START) == want.count("<|im_start|>") > 0, ids
    assert ids.count(THINK) == want.count("<think>"), ids
    assert r.usage.prompt_tokens == len(ids), (r.usage, len(ids))
    return want


def prompt_is_rendering():
    r = client.chat.completions.create(model=MID, messages=MSGS, max_tokens=8, temperature=0,
                                       extra_body={"return_token_ids": True})
    want = check_prompt(r, MSGS)
    assert want.endswith("<|im_start|>assistant\n<think>\n"), want
    # the prompt leaves the reply thinking: all of it is reasoning while no </think> comes
    m = r.choices[0].message
    ids = r.choices[0].token_ids if hasattr(r.choices[0], "token_ids") else \
        extra(r.choices[0], "token_ids")
    assert THINK_END not in ids, ids
    assert extra(m, "reasoning_content") == decode(ids) and m.content == "", m


def enable_thinking_false():
    kw = {"enable_thinking": False}
    r = client.chat.completions.create(model=MID, messages=MSGS, max_tokens=8, temperature=0,
                                       extra_body={"return_token_ids": True,
                                                   "chat_template_kwargs": kw})
    want = check_prompt(r, MSGS, kw)
    assert want.endswith("<think>\n\n</think>\n\n"), want
    m = r.choices[0].message
    ids = extra(r.choices[0], "token_ids")
    assert m.content == decode(ids) and extra(m, "reasoning_content") is None, m


def kwargs_checked():
    for kw, why in (([1], "must be an object"), ({"messages": []}, 'may not set "messages"')):
        try:
            client.chat.completions.create(model=MID, messages=MSGS, max_tokens=2,
                                           extra_body={"chat_template_kwargs": kw})
        except openai.BadRequestError as e:
            assert e.body["param"] == "chat_template_kwargs" and why in e.body["message"], e.body
        else:
            raise AssertionError(f"chat_template_kwargs {kw} accepted")


def eos_ends_generation():
    r = client.chat.completions.create(model=MID, messages=MSGS, max_tokens=8, temperature=0,
                                       logit_bias={str(IM_END): 100})
    c = r.choices[0]
    assert c.finish_reason == "stop" and c.message.content == "", c
    assert extra(c.message, "reasoning_content") is None, c.message


def think_request(bias):
    return dict(model=MID, messages=MSGS, max_tokens=10, temperature=0,
                logit_bias={str(THINK_END): bias}, frequency_penalty=2, presence_penalty=2,
                extra_body={"return_token_ids": True})


def reasoning_split():
    # The smallest bias on </think> that makes the model close its thinking after
    # some reasoning (the penalties keep it from repeating the marker).
    for tenth in range(0, 80, 5):
        r = client.chat.completions.create(**think_request(tenth / 10))
        ids = extra(r.choices[0], "token_ids")
        if THINK_END in ids[1:]:
            break
    else:
        raise AssertionError("no bias made the model close its thinking mid-reply")
    k = ids.index(THINK_END)
    shared["think_bias"] = tenth / 10
    m = r.choices[0].message
    assert extra(m, "reasoning_content") == decode(ids[:k]), (m, ids)
    assert m.content == decode(ids[k + 1:]), (m, ids)
    print(f"reasoning split at token {k} of {len(ids)} (bias {tenth / 10}): "
          f"{len(extra(m, 'reasoning_content'))} reasoning bytes, {len(m.content)} content bytes",
          flush=True)
    chunks = list(client.chat.completions.create(stream=True, **think_request(tenth / 10)))
    rs = "".join(extra(ch.choices[0].delta, "reasoning_content") or "" for ch in chunks
                 if ch.choices)
    cs = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert rs == extra(m, "reasoning_content") and cs == m.content, ((rs, cs), m)
    got = [i for ch in chunks if ch.choices for i in (extra(ch.choices[0], "token_ids") or [])]
    assert got == ids, (got, ids)
    shared["reply"] = m


def follow_up_reuses():
    m = shared.get("reply")
    assert m is not None, "reasoning_split did not run"
    # the client sends the reply back as content; the template drops its reasoning
    hist = MSGS + [{"role": "assistant", "content": m.content},
                   {"role": "user", "content": "And the KV pages?"}]
    a = client.chat.completions.create(model=MID, messages=hist, max_tokens=8, temperature=0,
                                       extra_body={"return_token_ids": True})
    check_prompt(a, hist)
    cached = a.usage.prompt_tokens_details.cached_tokens
    assert cached > 0, a.usage
    b = client.chat.completions.create(model=MID, messages=hist, max_tokens=8, temperature=0,
                                       extra_body={"return_token_ids": True, "cache": False})
    assert b.usage.prompt_tokens_details.cached_tokens == 0, b.usage
    assert extra(a, "prompt_token_ids") == extra(b, "prompt_token_ids")
    assert extra(a.choices[0], "token_ids") == extra(b.choices[0], "token_ids"), (a, b)
    assert a.choices[0].message == b.choices[0].message, (a.choices[0], b.choices[0])
    print(f"follow-up reused {cached} of {a.usage.prompt_tokens} prompt tokens", flush=True)


def metric(name, label=""):
    import urllib.request
    text = urllib.request.urlopen(URL + "/metrics", timeout=30).read().decode()
    for line in text.splitlines():
        if line.startswith(name + label + " ") or (not label and line.startswith(name + " ")):
            return float(line.split()[-1])
    return 0.0


def parent_token_v1():
    """The contract on a templated model, with Open WebUI's headers and history shape."""
    base = {"X-WKVM-Stateful-Chat": "parent-token-v1", "X-OpenWebUI-Chat-Id": "c1",
            "X-OpenWebUI-User-Id": "u"}

    def turn(msgs, user_id, asst_id, parent="", **kw):
        h = dict(base, **{"X-WKVM-User-Message-ID": user_id,
                          "X-WKVM-Assistant-Message-ID": asst_id,
                          "X-WKVM-Parent-Message-ID": parent})
        return client.chat.completions.create(
            model=MID, messages=msgs, max_tokens=10, temperature=0, extra_headers=h,
            frequency_penalty=2, presence_penalty=2,
            logit_bias={str(THINK_END): shared.get("think_bias", 1.0)},
            extra_body=dict({"return_token_ids": True}, **kw))
    hits0 = metric("wkvm_parent_bound_continuation_hits_total")
    a = turn(MSGS, "u1", "a1")
    check_prompt(a, MSGS)
    a_ids = extra(a, "prompt_token_ids") + extra(a.choices[0], "token_ids")
    m = a.choices[0].message
    # Open WebUI sends the reply back as its stored content, stripped, without the reasoning
    hist = MSGS + [{"role": "assistant", "content": m.content.strip()},
                   {"role": "user", "content": "more"}]
    b = turn(hist, "u2", "a2", "a1")
    assert metric("wkvm_parent_bound_continuation_hits_total") == hits0 + 1, "no contract hit"
    ids = extra(b, "prompt_token_ids")
    # the parked state: every token of turn 1 (its reasoning too, which the template drops),
    # then the template's text after that reply's turn
    assert ids[:len(a_ids)] == a_ids, (ids, a_ids)
    want = render(hist)
    tail = want[want.rindex("<|im_start|>user"):]
    rest = decode(ids[len(a_ids):])
    assert rest.endswith(tail) and rest[:-len(tail)] in ("", "<|im_end|>\n", "\n"), (rest, tail)
    cached = b.usage.prompt_tokens_details.cached_tokens
    assert cached == len(a_ids), (cached, len(a_ids))
    # equal to recomputing the same tokens without reuse
    c = client.completions.create(model=MID, prompt=ids, max_tokens=10, temperature=0,
                                  frequency_penalty=2, presence_penalty=2,
                                  logit_bias={str(THINK_END): shared.get("think_bias", 1.0)},
                                  extra_body={"return_token_ids": True, "cache": False})
    assert extra(c.choices[0], "token_ids") == extra(b.choices[0], "token_ids"), (b, c)
    print(f"parent-token-v1 on the template: turn 2 continued the {len(a_ids)} tokens of turn 1 "
          f"({len(extra(a.choices[0], 'token_ids'))} generated, reasoning "
          f"{len(extra(m, 'reasoning_content') or '')} bytes), prefilled {len(ids) - cached}",
          flush=True)
    # an edited reply: rejected, then served by the prefix index (the rendering exactly)
    rej0 = metric("wkvm_parent_bound_continuation_rejections_total",
                  '{reason="prior_assistant_mismatch"}')
    hist3 = hist + [{"role": "assistant", "content": "edited"},
                    {"role": "user", "content": "again"}]
    d = turn(hist3, "u3", "a3", "a2")
    check_prompt(d, hist3)
    assert metric("wkvm_parent_bound_continuation_rejections_total",
                  '{reason="prior_assistant_mismatch"}') == rej0 + 1


def tools_reach_template():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    r = client.chat.completions.create(model=MID, messages=MSGS, max_tokens=4, temperature=0,
                                       tools=tools, tool_choice="auto",
                                       extra_body={"return_token_ids": True})
    check_prompt(r, MSGS)  # (this template does not print tools)
    # assistant tool_calls and a tool result reach the template as sent (its format is
    # unknown to wkvm: the reply is content; test_tool_calls.py has Qwen3.5's)
    hist = MSGS + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "42"}]
    r = client.chat.completions.create(model=MID, max_tokens=4, temperature=0, messages=hist,
                                       tools=tools, extra_body={"return_token_ids": True})
    check_prompt(r, hist)
    assert not r.choices[0].message.tool_calls, r


for t in (prompt_is_rendering, enable_thinking_false, kwargs_checked, eos_ends_generation, reasoning_split,
          follow_up_reuses, parent_token_v1, tools_reach_template):
    try:
        t()
        print(f"PASS {t.__name__}", flush=True)
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
    tj = bpe_json.tokenizer_json(508)
    for i, c in enumerate(ADDED):
        tj["model"]["vocab"][c] = 508 + i
        tj["added_tokens"].append({"id": 508 + i, "content": c, "single_word": False,
                                   "lstrip": False, "rstrip": False, "normalized": False,
                                   "special": i < 2})
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f)
    with open(os.path.join(d, "chat_template.jinja"), "w") as f:
        f.write(TEMPLATE)


def override_check(model, tmp):
    """--chat-template FILE: the prompt is the override's rendering."""
    path = os.path.join(tmp, "override.jinja")
    with open(path, "w") as f:
        f.write(OVERRIDE)
    msgs = [{"role": "user", "content": "hi"}]
    want = subprocess.run([TEMPLATE_EXE, "--model", model, "--chat-template", path, "-"],
                          input=json.dumps({"messages": msgs}).encode(), capture_output=True,
                          timeout=60, check=True).stdout.decode()
    with Stack(model=model, slots=2, extra_ctl=["--chat-template", path]) as s:
        s.start_controller()
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready")
        r = http("POST", s.url + "/v1/chat/completions",
                 body={"model": MID, "messages": msgs, "max_tokens": 2, "temperature": 0,
                       "return_token_ids": True}, timeout=120)
        assert r.status == 200, r.body
        ids = r.json()["prompt_token_ids"]
        assert ids[0] == 508 and ids.count(508) == want.count("<|im_start|>") == 2, (ids, want)
        assert want == "<|im_start|>user:hi<|im_end|><|im_start|>assistant:", want
        # reasoning_effort reaches a template that reads it (chat_template_kwargs wins)
        dec = decoder(model)
        for extra, tail in (({"reasoning_effort": "high"}, "assistant:[high]"),
                            ({"reasoning_effort": "low",
                              "chat_template_kwargs": {"reasoning_effort": "medium"}},
                             "assistant:[medium]")):
            r = http("POST", s.url + "/v1/chat/completions",
                     body=dict({"model": MID, "messages": msgs, "max_tokens": 2,
                                "temperature": 0, "return_token_ids": True}, **extra),
                     timeout=120)
            assert r.status == 200, r.body
            got = dec(r.json()["prompt_token_ids"])
            assert got.endswith(tail), (got, tail)
        r = http("POST", s.url + "/v1/chat/completions",
                 body={"model": MID, "messages": msgs, "max_tokens": 2,
                       "reasoning_effort": "extreme"}, timeout=120)
        assert r.status == 400 and r.json()["error"]["param"] == "reasoning_effort", r.body


JINJA2_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import jinja_corpus
src = open(sys.argv[2], encoding="utf-8").read()
out = jinja_corpus.render_jinja2(src, json.load(sys.stdin))
print(json.dumps(out))
"""


def decoder(model):
    """ids -> text for the test tokenizer (added tokens by content, pieces by byte-level map)."""
    tj = json.load(open(os.path.join(model, "tokenizer.json"), encoding="utf-8"))
    added = {t["id"]: t["content"].encode() for t in tj["added_tokens"]}
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    u2b = {chr(c): b for b, c in zip(bs, cs)}
    piece = {i: bytes(u2b[ch] for ch in p) for p, i in tj["model"]["vocab"].items()
             if i not in added}
    return lambda ids: b"".join(added.get(i) or piece[i] for i in ids).decode(
        "utf-8", errors="replace")


def qwen35_real_check(model, tmp):
    """llama.cpp's Qwen3.5-4B template (--chat-template), prompts equal to jinja2's.

    Returns a note when the template corpus or the jinja2 venv is not there (skipped)."""
    # what the jinja_corpus test leaves (nothing is installed here: this test stays fast)
    sys.path.insert(0, REF)
    import glob
    import jinja_corpus
    py = os.path.join(jinja_corpus.VENV, "bin", "python")
    corpus = os.environ.get("WKVM_JINJA_CORPUS") or next(iter(sorted(glob.glob(os.path.join(
        jinja_corpus.CACHE, "llama.cpp-convert-*", "models", "templates")), reverse=True)), None)
    path = os.path.join(corpus, "Qwen3.5-4B.jinja") if corpus else None
    if not os.path.exists(py) or path is None or not os.path.exists(path):
        return "skipped: no jinja2 venv or template corpus yet (the jinja_corpus test makes them)"
    decode = decoder(model)
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

    def jinja2_render(messages, kwargs):
        ctx = dict({"messages": messages, "tools": None, "documents": None,
                    "add_generation_prompt": True}, **special, **kwargs)
        r = subprocess.run([py, "-c", JINJA2_SCRIPT, REF, path], input=json.dumps([ctx]),
                           capture_output=True, text=True, timeout=60, check=True)
        out = json.loads(r.stdout)[0]
        assert out[0] == "ok", out
        return out[1]

    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Say something about state slots."}]
    with Stack(model=model, slots=2, extra_ctl=["--chat-template", path]) as s:
        s.start_controller()
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready")

        def chat(messages, kwargs=None, headers=None, rendered=True, **extra):
            body = dict({"model": MID, "messages": messages, "max_tokens": 6, "temperature": 0,
                         "return_token_ids": True}, **extra)
            if kwargs is not None:
                body["chat_template_kwargs"] = kwargs
            r = http("POST", s.url + "/v1/chat/completions", body=body, headers=headers,
                     timeout=120)
            assert r.status == 200, r.body
            j = r.json()
            want = jinja2_render(messages, kwargs or {})
            if rendered:
                assert decode(j["prompt_token_ids"]) == want, (decode(j["prompt_token_ids"]), want)
            assert j["prompt_token_ids"].count(508) == want.count("<|im_start|>"), j
            return j

        def hits():
            text = s.get("/metrics").body.decode()
            return sum(float(x.split()[-1]) for x in text.splitlines()
                       if x.startswith("wkvm_parent_bound_continuation_hits_total "))

        a = chat(msgs)  # thinking on: the reply starts as reasoning
        m, ids = a["choices"][0]["message"], a["choices"][0]["token_ids"]
        assert 511 not in ids and m["reasoning_content"] == decode(ids) and m["content"] == "", a
        b = chat(msgs, {"enable_thinking": False})
        m, ids = b["choices"][0]["message"], b["choices"][0]["token_ids"]
        assert m["content"] == decode(ids) and "reasoning_content" not in m, b
        # a follow-up carrying the reply's reasoning as reasoning_content: Qwen3.5 renders it
        # in the last assistant turn only; the index resumes the end of the first user turn
        hist = msgs + [{"role": "assistant", "content": "Slots hold states.",
                        "reasoning_content": a["choices"][0]["message"]["reasoning_content"]},
                       {"role": "user", "content": "And pages?"}]
        c = chat(hist)
        cached = c["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 0, c["usage"]
        d = chat(hist, cache=False)
        assert d["choices"][0]["token_ids"] == c["choices"][0]["token_ids"], (c, d)
        # parent-token-v1 on this template (it renders the last assistant turn its own way):
        # turn 2 continues turn 1's tokens, the reasoning included
        for bias in (0.5, 1, 2, 3):  # (the first that makes some reasoning, then some content)
            h = {"X-WKVM-Stateful-Chat": "parent-token-v1", "X-OpenWebUI-Chat-Id": f"q{bias}",
                 "X-OpenWebUI-User-Id": "u", "X-WKVM-User-Message-ID": "u1",
                 "X-WKVM-Assistant-Message-ID": "a1"}
            e = chat(msgs, headers=h, max_tokens=8, logit_bias={"511": bias},
                     presence_penalty=2, frequency_penalty=2)
            em = e["choices"][0]["message"]
            if em.get("reasoning_content") and em["content"].strip():
                break
        h0 = hits()
        hist2 = msgs + [{"role": "assistant", "content": em["content"].strip()},
                        {"role": "user", "content": "more"}]
        f = chat(hist2, headers=dict(h, **{"X-WKVM-User-Message-ID": "u2",
                                           "X-WKVM-Assistant-Message-ID": "a2",
                                           "X-WKVM-Parent-Message-ID": "a1"}),
                 rendered=False, max_tokens=4)
        assert hits() == h0 + 1, ("no contract hit on Qwen3.5-4B.jinja", em, [
            x for x in s.get("/metrics").body.decode().splitlines()
            if x.startswith("wkvm_parent_bound") and not x.endswith(" 0")])
        turn1 = e["prompt_token_ids"] + e["choices"][0]["token_ids"]
        assert f["prompt_token_ids"][:len(turn1)] == turn1, (f, turn1)
        assert decode(f["prompt_token_ids"][len(turn1):]).endswith(
            "<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n<think>\n"), f
        return (f"Qwen3.5-4B.jinja: prompts equal jinja2's; follow-up reused {cached} of "
                f"{c['usage']['prompt_tokens']} prompt tokens; parent-token-v1 continued "
                f"{len(turn1)} tokens (reasoning {len(em.get('reasoning_content') or '')} bytes)")


def no_template_check(model, tmp):
    """The same model without a template: the World template, chat_template_kwargs and
    tool_calls refused."""
    import shutil
    plain = os.path.join(tmp, "plain")
    shutil.copytree(model, plain)
    os.remove(os.path.join(plain, "chat_template.jinja"))
    with Stack(model=plain, slots=2) as s:
        s.start_controller()
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready")
        body = {"model": "plain", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2, "temperature": 0, "return_token_ids": True}
        r = http("POST", s.url + "/v1/chat/completions", body=body, timeout=120)
        assert r.status == 200, r.body
        ids = r.json()["prompt_token_ids"]
        assert 508 not in ids and "reasoning_content" not in r.json()["choices"][0]["message"], r.body
        body["chat_template_kwargs"] = {"enable_thinking": False}
        r = http("POST", s.url + "/v1/chat/completions", body=body, timeout=120)
        assert r.status == 400 and r.json()["error"]["param"] == "chat_template_kwargs", r.body
        del body["chat_template_kwargs"]
        body["messages"] = body["messages"] + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
        r = http("POST", s.url + "/v1/chat/completions", body=body, timeout=120)
        assert r.status == 400 and r.json()["error"]["param"] == "messages[1].tool_calls", r.body
        assert "tool calls are not supported" in r.json()["error"]["message"], r.body


def main():
    for exe in ("controld/wkvm-controld", "workerd/wkvm-workerd", "tools/wkvm-template"):
        if not os.access(os.path.join(BUILD, exe), os.X_OK):
            print(f"FAIL setup: {exe} is not built in {BUILD}")
            print("0 passed, 1 failed")
            return 1
    venv = ensure_venv()
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="wkvm-tpl-") as tmp:
        model = os.path.join(tmp, MID)
        make_model(model)
        script = os.path.join(tmp, "client.py")
        with open(script, "w") as f:
            f.write(CLIENT_SCRIPT)
        with Stack(model=model, slots=4) as s:
            s.start_controller()
            s.start_worker("w0")
            s.wait(lambda: s.get("/ready").status == 200, "ready")
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("OPENAI_", "PYTHON"))}
            env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
            r = subprocess.run([venv_python(venv), script, s.url, MID, model, TEMPLATE_EXE],
                               capture_output=True, text=True, timeout=300, env=env)
            lines = r.stdout.splitlines()
            if r.returncode != 0:
                lines.append(f"FAIL client script: exit {r.returncode}\n{r.stderr[-3000:]}")
            if any(x.startswith("FAIL") for x in lines):
                lines.append(s.tail())
        try:
            override_check(model, tmp)
            lines.append("PASS chat_template_override")
        except Exception as e:  # noqa: BLE001
            lines.append(f"FAIL chat_template_override: {e!r}"[:2000])
        try:
            note = qwen35_real_check(model, tmp)
            lines.append(f"PASS qwen35_real_template: {note}")
        except Exception as e:  # noqa: BLE001
            lines.append(f"FAIL qwen35_real_template: {e!r}"[:3000])
        try:
            no_template_check(model, tmp)
            lines.append("PASS no_template_keeps_world_format")
        except Exception as e:  # noqa: BLE001
            lines.append(f"FAIL no_template_keeps_world_format: {e!r}"[:2000])
        for line in lines:
            print(line, flush=True)
            passed += line.startswith("PASS ")
            failed += line.startswith("FAIL ")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
