"""The official OpenAI Python SDK against a real wkvm stack.

Creates (once, cached as $WKVM_BUILD_DIR/venv-openai) a venv with
`/usr/bin/python3 -m venv` and `pip install openai`, starts a controller and a
CPU worker with a tiny model, and runs CLIENT_SCRIPT inside the venv against it.
Exits 77 (skipped) when pip cannot reach a package index.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import BUILD, MKMODEL, Stack  # noqa: E402

SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
MID = "tiny"

# Runs inside the venv: argv[1] is the base URL, argv[2] the model id. Prints
# "PASS name" / "FAIL name: why" per check.
CLIENT_SCRIPT = r'''
import sys
import traceback

import openai

URL, MID = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=URL + "/v1", api_key="none", max_retries=0, timeout=120)
MSGS = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say something about state slots."}]
PROMPT = [5, 77, 300, 12, 1, 499, 256, 42, 9, 10]
shared = {}


def models_list():
    page = client.models.list()
    ids = [m.id for m in page.data]
    assert ids == [MID], ids
    assert page.data[0].object == "model" and page.data[0].owned_by == "wkvm", page.data[0]


def chat_blocking():
    r = client.chat.completions.create(model=MID, messages=MSGS, max_tokens=24, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-"), r
    assert r.model == MID, r.model
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant", c
    assert isinstance(c.message.content, str), c.message
    assert c.finish_reason in ("stop", "length"), c.finish_reason
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 24, u
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, u
    shared["chat"] = r


def chat_stream():
    want = shared.get("chat")
    assert want is not None, "chat_blocking did not run"
    stream = client.chat.completions.create(model=MID, messages=MSGS, max_tokens=24,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert len(chunks) >= 3, chunks
    assert all(ch.object == "chat.completion.chunk" for ch in chunks), chunks
    assert len({ch.id for ch in chunks}) == 1, [ch.id for ch in chunks]
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage is not None, usage
    assert usage.usage.prompt_tokens == want.usage.prompt_tokens, (usage.usage, want.usage)
    assert usage.usage.completion_tokens == want.usage.completion_tokens, (usage.usage, want.usage)
    assert usage.usage.total_tokens == want.usage.total_tokens, (usage.usage, want.usage)
    body = chunks[:-1]
    assert all(ch.usage is None for ch in body), [ch.usage for ch in body]
    text = "".join(ch.choices[0].delta.content or "" for ch in body)
    assert text == want.choices[0].message.content, (text, want.choices[0].message.content)
    finish = [ch.choices[0].finish_reason for ch in body]
    assert finish[-1] == want.choices[0].finish_reason, finish
    assert all(f is None for f in finish[:-1]), finish


def completions_token_ids():
    r = client.completions.create(model=MID, prompt=PROMPT, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    assert r.object == "text_completion" and r.model == MID, r
    c = r.choices[0]
    assert isinstance(c.text, str) and c.finish_reason == "length", c
    assert r.usage.prompt_tokens == len(PROMPT), r.usage
    assert r.usage.completion_tokens == 8, r.usage
    ids = (c.model_extra or {}).get("token_ids")
    assert isinstance(ids, list) and len(ids) == 8, c
    # Streaming the same request gives the same text.
    s = client.completions.create(model=MID, prompt=PROMPT, max_tokens=8, temperature=0,
                                  stream=True, extra_body={"ignore_eos": True})
    text = "".join(ch.choices[0].text for ch in s if ch.choices)
    assert text == c.text, (text, c.text)


def error_unknown_model():
    try:
        client.chat.completions.create(model="no-such-model", messages=MSGS, max_tokens=4)
    except openai.NotFoundError as e:
        assert e.status_code == 404, e
        err = e.body if isinstance(e.body, dict) else {}
        assert err.get("param") == "model", e.body
        return
    raise AssertionError("no NotFoundError for an unknown model")


def error_tools():
    """Tools offered (as Open WebUI 0.12 does with its built-in tools): a plain message;
    a required tool call: BadRequestError naming tool_choice."""
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    r = client.chat.completions.create(model=MID, messages=MSGS, max_tokens=4, tools=tools)
    assert r.choices[0].message.tool_calls in (None, []), r.choices[0].message
    assert isinstance(r.choices[0].message.content, str), r.choices[0].message
    try:
        client.chat.completions.create(model=MID, messages=MSGS, max_tokens=4, tools=tools,
                                       tool_choice="required")
    except openai.BadRequestError as e:
        assert e.status_code == 400, e
        err = e.body if isinstance(e.body, dict) else {}
        assert err.get("param") == "tool_choice", e.body
        return
    raise AssertionError("no BadRequestError for tool_choice required")


def chat_reuse_without_headers():
    """Follow-ups through the SDK, no extra headers, the whole history each time, the
    reply sent back exactly as received (raw bytes of a random model included): every
    follow-up reuses the previous reply's state, and a regenerate computes one token."""
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Tell me a long story about slots. " * 20}]
    prev_total = None
    for turn in range(4):
        r = client.chat.completions.create(model=MID, messages=msgs, max_tokens=12,
                                           temperature=0)
        u = r.usage
        cached = u.prompt_tokens_details.cached_tokens
        if prev_total is not None:
            # Everything the previous turn's state held (its prompt and every reply
            # token) is reused; only the new user message is computed.
            assert cached == prev_total, (turn, cached, prev_total, u)
            assert u.prompt_tokens - cached < 40, (turn, u)
        prev_total = u.prompt_tokens + u.completion_tokens
        again = client.chat.completions.create(model=MID, messages=msgs, max_tokens=12,
                                               temperature=0)
        assert again.choices[0].message.content == r.choices[0].message.content, turn
        assert again.usage.prompt_tokens_details.cached_tokens == u.prompt_tokens - 1, \
            (turn, again.usage)
        msgs = msgs + [{"role": "assistant", "content": r.choices[0].message.content},
                       {"role": "user", "content": f"and then {turn}?"}]


def bad_request(param, fn, *args, **kw):
    """fn(*args, **kw) must raise BadRequestError naming param; returns its message."""
    try:
        fn(*args, **kw)
    except openai.BadRequestError as e:
        err = e.body if isinstance(e.body, dict) else {}
        assert err.get("param") == param, (param, e.body)
        return err.get("message", "")
    raise AssertionError(f"no BadRequestError naming {param}")


def logit_bias():
    """logit_bias reaches the sampler: +100 forces a token at temperature 0, -100 bans one;
    out-of-vocab ids and values outside [-100, 100] are refused naming the field."""
    kw = dict(model=MID, prompt=PROMPT, max_tokens=4, temperature=0,
              extra_body={"ignore_eos": True, "return_token_ids": True})
    base = client.completions.create(**kw).choices[0].model_extra["token_ids"]
    force = next(t for t in (300, 301, 302, 303, 304) if t not in base)
    r = client.completions.create(**kw, logit_bias={str(force): 100})
    assert r.choices[0].model_extra["token_ids"] == [force] * 4, (base, r.choices[0])
    r = client.completions.create(**kw, logit_bias={str(base[0]): -100})
    assert r.choices[0].model_extra["token_ids"][0] != base[0], (base, r.choices[0])
    c = client.chat.completions.create(model=MID, messages=MSGS, max_tokens=3, temperature=0,
                                       logit_bias={str(force): 100},
                                       extra_body={"ignore_eos": True, "return_token_ids": True})
    assert c.choices[0].model_extra["token_ids"] == [force] * 3, c.choices[0]
    bad_request("logit_bias", client.completions.create, **kw, logit_bias={"100000": 5})
    bad_request("logit_bias", client.completions.create, **kw, logit_bias={"5": 101})
    bad_request("logit_bias", client.completions.create, **kw, logit_bias={"x": 1})


def parameters_honoured_or_refused():
    """What the SDK and Open WebUI send is accepted; best_of, n and unknown fields are 400s
    naming the field."""
    r = client.chat.completions.create(model=MID, messages=MSGS, max_tokens=2, seed=3, user="u1",
                                       stream=True, stream_options={"include_usage": True},
                                       top_p=0.9, presence_penalty=0.1, frequency_penalty=0.1,
                                       stop=["zz"], parallel_tool_calls=False)
    assert list(r)[-1].usage is not None
    bad_request("best_of", client.completions.create, model=MID, prompt="a", max_tokens=2,
                best_of=2)
    bad_request("n", client.completions.create, model=MID, prompt="a", max_tokens=2, n=2)
    msg = bad_request("foo_bar", client.chat.completions.create, model=MID, messages=MSGS,
                      max_tokens=2, extra_body={"foo_bar": 1})
    assert "unknown parameter" in msg, msg
    bad_request("store", client.chat.completions.create, model=MID, messages=MSGS, max_tokens=2,
                store=True)
    r = client.chat.completions.create(model=MID, messages=MSGS, max_tokens=2, store=False,
                                       metadata={"k": "v"}, service_tier="auto")
    assert r.choices[0].finish_reason in ("stop", "length"), r
    bad_request("reasoning_effort", client.chat.completions.create, model=MID, messages=MSGS,
                max_tokens=2, reasoning_effort="low")
    bad_request("tools", client.completions.create, model=MID, prompt="a", max_tokens=2,
                extra_body={"tools": []})


def completions_logprobs():
    """logprobs: N gives the completions shape (tokens, token_logprobs, top_logprobs,
    text_offset), blocking and streamed."""
    r = client.completions.create(model=MID, prompt=PROMPT, max_tokens=5, temperature=0,
                                  logprobs=2, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert lp is not None and len(lp.tokens) == 5, lp
    assert "".join(lp.tokens) == r.choices[0].text, (lp.tokens, r.choices[0].text)
    assert len(lp.token_logprobs) == 5 and all(x <= 0 for x in lp.token_logprobs), lp
    assert len(lp.top_logprobs) == 5, lp
    for tok, tl, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 3 and abs(top[tok] - tl) < 1e-6, (tok, tl, top)
    offs, acc = [], 0
    for tok in lp.tokens:
        offs.append(acc)
        acc += len(tok)
    assert lp.text_offset == offs, (lp.text_offset, offs)
    s = client.completions.create(model=MID, prompt=PROMPT, max_tokens=5, temperature=0,
                                  logprobs=2, stream=True, extra_body={"ignore_eos": True})
    toks, soffs = [], []
    for ch in s:
        if ch.choices and ch.choices[0].logprobs is not None:
            toks += ch.choices[0].logprobs.tokens
            soffs += ch.choices[0].logprobs.text_offset
    assert toks == lp.tokens and soffs == lp.text_offset, (toks, soffs, lp)


def models_retrieve():
    m = client.models.retrieve(MID)
    assert m.id == MID and m.object == "model" and m.owned_by == "wkvm", m
    try:
        client.models.retrieve("no-such-model")
    except openai.NotFoundError as e:
        err = e.body if isinstance(e.body, dict) else {}
        assert err.get("code") == "model_not_found" and err.get("type"), e.body
        return
    raise AssertionError("no NotFoundError for an unknown model id")


def prompt_batch_refused():
    msg = bad_request("prompt", client.completions.create, model=MID, prompt=["a", "b"],
                      max_tokens=2)
    assert "batch" in msg, msg
    r = client.completions.create(model=MID, prompt=["a"], max_tokens=2)
    assert len(r.choices) == 1, r


def nul_round_trip():
    """A reply holding NUL (forced: token 1 is the byte 0) resent as history is accepted
    and continues that reply's state."""
    msgs = [{"role": "user", "content": "nul\u0000in a question"}]
    r = client.chat.completions.create(model=MID, messages=msgs, max_tokens=3, temperature=0,
                                       logit_bias={"1": 100})
    reply = r.choices[0].message.content
    assert "\x00" in reply, repr(reply)
    msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "again"}]
    r2 = client.chat.completions.create(model=MID, messages=msgs, max_tokens=3, temperature=0)
    assert r2.usage.prompt_tokens_details.cached_tokens > 0, r2.usage


for t in (models_list, chat_blocking, chat_stream, completions_token_ids, error_unknown_model,
          error_tools, chat_reuse_without_headers, logit_bias, parameters_honoured_or_refused,
          completions_logprobs, models_retrieve, prompt_batch_refused, nul_round_trip):
    try:
        t()
        print(f"PASS {t.__name__}", flush=True)
    except Exception as e:  # noqa: BLE001
        detail = "".join(traceback.format_exception_only(type(e), e)).strip()
        print(f"FAIL {t.__name__}: {detail[:2000]}", flush=True)
'''

NETWORK_HINTS = ("NewConnectionError", "Temporary failure in name resolution",
                 "Name or service not known", "Network is unreachable", "Connection refused",
                 "ConnectTimeoutError", "ReadTimeoutError", "No matching distribution found",
                 "Could not find a version that satisfies", "ProxyError", "SSLError",
                 "connection broken", "Max retries exceeded")


def skip(why):
    print(f"SKIP openai_client: {why}")
    print("0 passed, 0 failed, 1 skipped")
    sys.exit(77)


def venv_python(venv):
    return os.path.join(venv, "bin", "python")


def venv_ok(venv):
    py = venv_python(venv)
    if not os.path.exists(py):
        return False
    r = subprocess.run([py, "-c", "import openai"], capture_output=True, timeout=120)
    return r.returncode == 0


def ensure_venv():
    """Returns the path of a venv holding openai, cached under the build dir."""
    cache_root = os.environ.get("WKVM_BUILD_DIR")
    if cache_root and os.path.isdir(cache_root):
        venv = os.path.join(os.path.abspath(cache_root), "venv-openai")
    else:
        venv = os.path.join(tempfile.gettempdir(), f"wkvm-venv-openai-{os.getuid()}")
    if venv_ok(venv):
        return venv
    # One builder at a time (tests using the SDK run in parallel): the others wait for its
    # venv instead of replacing it under a test that already uses it.
    import fcntl
    with open(venv + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if venv_ok(venv):
            return venv
        return build_venv(venv)


def build_venv(venv):
    """Builds the venv next to its final place and renames it there (under ensure_venv's lock)."""
    tmp = tempfile.mkdtemp(prefix="venv-openai.tmp-", dir=os.path.dirname(venv))
    try:
        r = subprocess.run([SYSTEM_PYTHON, "-m", "venv", tmp], capture_output=True, text=True,
                           timeout=300)
        if r.returncode != 0:
            raise AssertionError(f"{SYSTEM_PYTHON} -m venv failed (Debian needs python3-venv: "
                                 f"deploy/install-deps):\n{r.stdout}{r.stderr}")
        t0 = time.time()
        r = subprocess.run([venv_python(tmp), "-m", "pip", "install", "--disable-pip-version-check",
                            "--timeout", "30", "--retries", "2", "openai"],
                           capture_output=True, text=True, timeout=540)
        if r.returncode != 0:
            out = r.stdout + r.stderr
            if any(h.lower() in out.lower() for h in NETWORK_HINTS):
                skip("pip could not install openai (no package index reachable?):\n" + out[-1500:])
            raise AssertionError("pip install openai failed:\n" + out[-3000:])
        print(f"venv: installed openai in {time.time() - t0:.1f}s", flush=True)
        if os.path.exists(venv):
            shutil.rmtree(venv, ignore_errors=True)
        try:
            os.rename(tmp, venv)
        except OSError:
            if not venv_ok(venv):  # someone else's rename won only if theirs works
                raise
        else:
            tmp = None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if not venv_ok(venv):
        raise AssertionError(f"the venv at {venv} cannot import openai")
    return venv


def main():
    for exe in ("controld/wkvm-controld", "workerd/wkvm-workerd", "tools/wkvm-mkmodel"):
        if not os.access(os.path.join(BUILD, exe), os.X_OK):
            print(f"FAIL setup: {exe} is not built in {BUILD}")
            print("0 passed, 1 failed")
            return 1
    try:
        venv = ensure_venv()
    except AssertionError as e:
        print(f"FAIL venv: {e}")
        print("0 passed, 1 failed")
        return 1
    ver = subprocess.run([venv_python(venv), "-c", "import openai; print(openai.__version__)"],
                         capture_output=True, text=True, timeout=120).stdout.strip()
    print(f"openai SDK {ver} in {venv}", flush=True)
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="wkvm-openai-") as tmp:
        model = os.path.join(tmp, MID)
        subprocess.run([MKMODEL, "--out", model, "--layers", "2", "--embd", "64", "--head-size",
                        "16", "--ffn", "128", "--vocab", "512", "--seed", "7"], check=True,
                       capture_output=True, timeout=60)
        script = os.path.join(tmp, "client.py")
        with open(script, "w") as f:
            f.write(CLIENT_SCRIPT)
        with Stack(model=model, slots=4) as s:
            try:
                s.start_controller()
                s.start_worker("w0")
                s.wait(lambda: s.get("/ready").status == 200, "ready")
                env = {k: v for k, v in os.environ.items()
                       if not k.startswith(("OPENAI_", "PYTHON"))}
                env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
                r = subprocess.run([venv_python(venv), script, s.url, MID], capture_output=True,
                                   text=True, timeout=300, env=env)
            except Exception as e:  # noqa: BLE001
                print(f"FAIL stack: {e}")
                print(f"{passed} passed, {failed + 1} failed")
                return 1
            lines = r.stdout.splitlines()
            try:  # the operator's view of the same stack: the admin index, zero-valued series
                idx = s.get("/admin").json()["routes"]
                paths = {(x["method"], x["path"]): x["access"] for x in idx}
                assert paths[("GET", "/v1/models/{id}")] == "user", idx
                assert paths[("POST", "/admin/workers/{id}/drain")] == "admin", idx
                m = s.get("/metrics").body.decode()
                for want in ('wkvm_build_info{version="',
                             'wkvm_quota_refusals_total{limit="states"} 0',
                             'wkvm_state_cache_evictions_total{tier="disk"} 0',
                             'wkvm_parent_bound_continuation_rejections_total{reason="',
                             # one route label in every metric: the HTTP route
                             'wkvm_requests_total{route="/v1/chat/completions",status="ok"}',
                             'wkvm_http_requests_total{route="/v1/chat/completions",'):
                    assert want in m, want
                lines.append("PASS admin_index_and_metrics")
            except Exception as e:  # noqa: BLE001
                lines.append(f"FAIL admin_index_and_metrics: {e!r}"[:2000])
            for line in lines:
                print(line, flush=True)
                if line.startswith("PASS "):
                    passed += 1
                elif line.startswith("FAIL "):
                    failed += 1
            if r.returncode != 0 or passed + failed == 0:
                failed += 1
                print(f"FAIL client script: exit {r.returncode}\n{r.stderr[-3000:]}")
            if failed:
                print(s.tail())
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
