"""parent-token-v1 sessions through HTTP, the way Open WebUI drives them:
follow-ups continue the parked state (only the delta is computed, the reply
equals a fresh run), every rejection reason restarts safely and is counted,
sessions survive slot pressure and a controller restart."""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
import bpe_json  # noqa: E402
from wkvm_harness import BUILD, MKMODEL, Stack, run_tests  # noqa: E402

TMP = tempfile.TemporaryDirectory(prefix="wkvm-sessions-")
INFER = os.path.join(BUILD, "tools", "wkvm-infer")


def infer(model, *args, stdin=None):
    return subprocess.run([INFER, "--model", model, "--threads", "1", *args], input=stdin,
                          capture_output=True, text=True, timeout=60, check=True).stdout


def pick_model():
    """A random-weight model whose first reply token starts with a space, as a
    trained chat model's does: the template renders "Assistant: " + reply, so
    only such replies can be continued token-exactly."""
    for seed in range(11, 80):
        d = os.path.join(TMP.name, f"tiny{seed}")
        subprocess.run([MKMODEL, "--out", d, "--layers", "2", "--embd", "64", "--head-size",
                        "16", "--ffn", "128", "--vocab", "512", "--seed", str(seed)],
                       check=True, capture_output=True, timeout=60)
        ids = infer(d, "--encode", stdin="User: hi\n\nAssistant:").split()
        first = infer(d, "--tokens", ",".join(ids), "--generate", "1").split()
        text = infer(d, "--decode", stdin=" ".join(first))
        if text.startswith(" ") and text.strip():
            final = os.path.join(TMP.name, "tiny")
            os.rename(d, final)
            return final
    raise SystemExit("no suitable model seed")


MODEL = pick_model()


def up(s):
    s.start_controller()
    s.start_worker("w0")
    s.wait(lambda: s.get("/ready").status == 200, "ready")


class Chat:
    """One Open WebUI chat: message ids and the visible history."""

    def __init__(self, s, chat_id, user="u1", api_headers=None):
        self.s, self.chat_id, self.user = s, chat_id, user
        self.msgs = []
        self.n = 0
        self.last_assistant = ""
        self.api = api_headers or {}

    def headers(self, aid, uid, parent):
        h = {"X-OpenWebUI-User-Id": self.user, "X-OpenWebUI-Chat-Id": self.chat_id,
             "X-WKVM-Stateful-Chat": "parent-token-v1", "X-WKVM-Assistant-Message-ID": aid,
             "X-WKVM-User-Message-ID": uid, "X-WKVM-Parent-Message-ID": parent}
        h.update(self.api)
        return h

    def turn(self, text, parent=None, aid=None, uid=None, msgs=None, stream=False,
             max_tokens=16):
        self.n += 1
        aid = aid or f"{self.chat_id}-a{self.n}"
        uid = uid or f"{self.chat_id}-u{self.n}"
        parent = self.last_assistant if parent is None else parent
        msgs = (self.msgs + [{"role": "user", "content": text}]) if msgs is None else msgs
        body = {"model": "tiny", "messages": msgs, "max_tokens": max_tokens, "temperature": 0,
                "return_token_ids": True}
        r = self.s.post("/v1/chat/completions", body=body, headers=self.headers(aid, uid, parent))
        assert r.status == 200, r.body
        j = r.json()
        reply = j["choices"][0]["message"]["content"]
        # Open WebUI persists the stripped reply.
        self.msgs = msgs + [{"role": "assistant", "content": reply.strip()}]
        self.last_assistant = aid
        return j


def clean_text(s, msgs, prefix):
    """A user text whose greedy reply (run statelessly first) can round-trip
    through the template: it starts with a space (the template renders
    "Assistant: " before it) and carries no outer whitespace that Open WebUI
    would strip. Random-weight models need the search; real ones rarely do."""
    for k in range(60):
        text = f"{prefix} {k}"
        reply, _ = fresh_reply(s, msgs + [{"role": "user", "content": text}])
        body = reply[1:]
        if reply.startswith(" ") and body and body == body.strip() and "\n" not in reply:
            return text
    raise AssertionError("no clean reply found")


def metric(s, name, labels=""):
    text = s.get("/metrics").body.decode()
    m = re.search(re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") +
                  r" ([0-9.e+]+)", text)
    return float(m.group(1)) if m else 0.0


def fresh_reply(s, msgs, max_tokens=16):
    r = s.post("/v1/chat/completions", body={"model": "tiny", "messages": msgs,
                                              "max_tokens": max_tokens, "temperature": 0})
    return r.json()["choices"][0]["message"]["content"], r.json()["usage"]


def encode(text):
    out = infer(MODEL, "--encode", stdin=text).split()
    return [int(x) for x in out]


def decode(ids):
    p = subprocess.run([INFER, "--model", MODEL, "--decode"],
                       input=" ".join(map(str, ids)).encode(),
                       capture_output=True, timeout=60, check=True)
    return p.stdout.decode("utf-8", "replace")


def render(msgs):
    """The RWKV World chat template for simple one-line messages."""
    out = ""
    for m in msgs:
        out += {"system": "System", "user": "User", "assistant": "Assistant"}[m["role"]]
        out += ": " + m["content"].strip() + "\n\n"
    return out + "Assistant:"


def test_hits_and_delta():
    """Follow-ups feed only the template delta after the retained tokens (kept
    exactly as generated), and the reply equals a fresh run on exactly
    retained + delta."""
    with Stack(model=MODEL, slots=4) as s:
        up(s)
        c = Chat(s, "chat-1")
        first = clean_text(s, [], "Hello there")
        msgs = [{"role": "user", "content": first}]
        j1 = c.turn(first)
        assert j1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        retained = encode(render(msgs)) + j1["choices"][0]["token_ids"]
        retained_text = render(msgs) + decode(j1["choices"][0]["token_ids"])
        for k in range(3):
            text = clean_text(s, c.msgs, f"And more {k}")
            rendered = render(c.msgs + [{"role": "user", "content": text}])
            assert rendered.startswith(retained_text), (rendered, retained_text)
            delta = encode(rendered[len(retained_text):])
            fresh = s.post("/v1/completions", body={
                "model": "tiny", "prompt": retained + delta, "max_tokens": 16, "temperature": 0,
                "stop": ["\n\n"], "return_token_ids": True}).json()
            j = c.turn(text)
            assert metric(s, "wkvm_parent_bound_continuation_hits_total") == k + 1
            u = j["usage"]
            assert u["prompt_tokens"] == len(retained) + len(delta), \
                (u, len(retained), len(delta), repr(rendered), repr(retained_text))
            assert u["prompt_tokens_details"]["cached_tokens"] == len(retained), (u, len(retained), j1["usage"], retained)
            assert j["choices"][0]["token_ids"] == fresh["choices"][0]["token_ids"]
            assert j["choices"][0]["message"]["content"] == fresh["choices"][0]["text"]
            gen = j["choices"][0]["token_ids"]
            retained = retained + delta + gen
            retained_text = rendered + decode(gen)
        assert metric(s, "wkvm_prefix_tokens_reused_total") > 0


def test_rejections_restart_fresh():
    cases = [
        ("parent_message_mismatch", lambda c: c.turn("x", parent="bogus-parent")),
        ("prior_assistant_mismatch",
         lambda c: c.turn("x", msgs=c.msgs[:-1] + [{"role": "assistant", "content": "edited"},
                                                   {"role": "user", "content": "x"}])),
        ("prior_history_mismatch",
         lambda c: c.turn("x", msgs=[{"role": "user", "content": "changed first"}] +
                          c.msgs[1:] + [{"role": "user", "content": "x"}])),
        ("assistant_message_reused", lambda c: c.turn("x", aid=c.last_assistant)),
        ("user_message_reused", lambda c: c.turn("x", uid=f"{c.chat_id}-u1")),
    ]
    with Stack(model=MODEL, slots=4) as s:
        up(s)
        for i, (reason, provoke) in enumerate(cases):
            c = Chat(s, f"rej-{i}")
            c.turn("Hello there")
            before = metric(s, "wkvm_parent_bound_continuation_rejections_total",
                            f'reason="{reason}"')
            j = provoke(c)  # still answered: the contract falls back to the prefix index
            cached = j["usage"]["prompt_tokens_details"]["cached_tokens"]
            if reason == "prior_history_mismatch":
                assert cached == 0, (reason, j)  # the first message changed: nothing prefixes it
            else:
                assert cached > 0, (reason, j)  # a checkpoint of the unchanged history
            after = metric(s, "wkvm_parent_bound_continuation_rejections_total",
                           f'reason="{reason}"')
            assert after == before + 1, reason
        # A follow-up with no session at all is a miss.
        c = Chat(s, "never-seen")
        c.msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
        m0 = metric(s, "wkvm_parent_bound_continuation_misses_total")
        c.turn("c", parent="some-old-assistant")
        assert metric(s, "wkvm_parent_bound_continuation_misses_total") == m0 + 1
        # Bad headers are a 400.
        r = s.post("/v1/chat/completions", body={"model": "tiny", "messages": [
            {"role": "user", "content": "x"}]}, headers={"X-WKVM-Stateful-Chat": "parent-token-v1"})
        assert r.status == 400, r.body
        r = s.post("/v1/chat/completions", body={"model": "tiny", "messages": [
            {"role": "user", "content": "x"}]}, headers={"X-WKVM-Assistant-Message-ID": "a"})
        assert r.status == 400, r.body
        r = s.post("/v1/chat/completions", body={"model": "tiny", "messages": [
            {"role": "user", "content": "x"}]}, headers={
            "X-WKVM-Stateful-Chat": "parent-token-v1", "X-OpenWebUI-User-Id": "u",
            "X-OpenWebUI-Chat-Id": "c" * 600, "X-WKVM-Assistant-Message-ID": "a",
            "X-WKVM-User-Message-ID": "m"})
        assert r.status == 400, r.body


def test_users_pressure_restart_and_busy():
    with Stack(model=MODEL, slots=2) as s:
        up(s)
        # Same chat id under two users: two sessions, each hits its own.
        a, b = Chat(s, "shared", user="alice"), Chat(s, "shared", user="bob")
        a.turn(clean_text(s, [], "I am alice"))
        b.turn(clean_text(s, [], "I am bob"))
        h0 = metric(s, "wkvm_parent_bound_continuation_hits_total")
        a.turn(clean_text(s, a.msgs, "who am I"))
        b.turn(clean_text(s, b.msgs, "who am I"))
        assert metric(s, "wkvm_parent_bound_continuation_hits_total") == h0 + 2
        # More chats than slots: parked sessions spill to disk and still hit.
        chats = [Chat(s, f"many-{i}") for i in range(5)]
        for c in chats:
            c.turn(clean_text(s, [], f"start {c.chat_id}"))
        nexts = [clean_text(s, c.msgs, "next") for c in chats]
        h1 = metric(s, "wkvm_parent_bound_continuation_hits_total")
        for c, text in zip(chats, nexts):
            c.turn(text)
        assert metric(s, "wkvm_parent_bound_continuation_hits_total") == h1 + 5
        assert metric(s, "wkvm_sessions", 'tier="cold"') >= 1
        # A controller restart (SIGTERM: sessions are flushed) between turns: still hits.
        s.kill_controller(signal.SIGTERM)
        s.start_controller()
        s.wait(lambda: s.get("/ready").status == 200, "ready after restart")
        afters = [clean_text(s, c.msgs, "after restart") for c in chats[:3]]
        h2 = metric(s, "wkvm_parent_bound_continuation_hits_total")
        for c, text in zip(chats[:3], afters):
            c.turn(text)
        assert metric(s, "wkvm_parent_bound_continuation_hits_total") == h2 + 3
        # One turn per session at a time: an overlapping turn gets 409 session_busy.
        # The long turn streams; once its first token has arrived it holds the
        # session (a condition, not a sleep), and it holds it to its last token.
        c = chats[0]
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
        hdrs = dict(c.headers("busy-a", "busy-u", c.last_assistant),
                    **{"Content-Type": "application/json"})
        conn.request("POST", "/v1/chat/completions", body=json.dumps({
            "model": "tiny", "messages": c.msgs + [{"role": "user", "content": "long"}],
            "max_tokens": 4000, "ignore_eos": True, "temperature": 0, "stream": True}),
            headers=hdrs)
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        events = []
        for line in resp:
            line = line.decode().rstrip("\n")
            if line.startswith("data: "):
                events.append(line[6:])
                if json.loads(line[6:])["choices"][0]["delta"].get("content"):
                    break  # generating: the session is held
        r = s.post("/v1/chat/completions", body={
            "model": "tiny", "messages": c.msgs + [{"role": "user", "content": "again"}],
            "max_tokens": 4}, headers=c.headers("busy-a2", "busy-u2", c.last_assistant))
        for line in resp:
            line = line.decode().rstrip("\n")
            if line.startswith("data: "):
                events.append(line[6:])
                if line == "data: [DONE]":
                    break
        conn.close()
        assert r.status == 409 and r.json()["error"]["param"] == "session_busy", r.body
        # the long turn was not disturbed: it ran to its length, no error event
        assert events[-1] == "[DONE]", events[-3:]
        finals = [json.loads(e)["choices"][0].get("finish_reason") for e in events[:-1]
                  if "choices" in json.loads(e) and json.loads(e)["choices"]]
        assert "length" in finals, events[-3:]
        assert not any("error" in json.loads(e) for e in events[:-1]), events[-3:]


def session_counters(s):
    """Every parent-token-v1 counter and the sessions gauge, as one dict."""
    text = s.get("/metrics").body.decode()
    return {ln.rsplit(" ", 1)[0]: ln.rsplit(" ", 1)[1] for ln in text.splitlines()
            if ln.startswith(("wkvm_parent_bound_", "wkvm_sessions"))}


def test_task_header_bypasses_the_session():
    """X-WKVM-Task (docs/OPEN_WEBUI.md): Open WebUI sends it with the task's
    name on background requests (title, tags, follow-ups: the chat headers with
    an empty assistant id, which the contract refuses) and empty on chat turns.
    A non-empty value is served statelessly, without reading or touching the
    session; an empty or blank one leaves the contract in force."""
    with Stack(model=MODEL, slots=4) as s:
        up(s)
        c = Chat(s, "tasks", api_headers={"X-WKVM-Task": ""})  # as on every turn
        c.turn(clean_text(s, [], "Hello there"))
        uid = f"{c.chat_id}-u{c.n}"
        task_msgs = [{"role": "user", "content": "### Task:\nGenerate a concise title for: "
                      + c.msgs[0]["content"]}]
        body = {"model": "tiny", "messages": task_msgs, "max_tokens": 8, "temperature": 0}
        want, _ = fresh_reply(s, task_msgs, 8)
        plain = {k: v for k, v in c.headers("", uid, "").items() if k != "X-WKVM-Task"}
        nxt = clean_text(s, c.msgs, "next")
        before = session_counters(s)
        # The control: without the header, or with an empty or blank one, the
        # contract refuses a request with no assistant message id.
        for extra in ({}, {"X-WKVM-Task": ""}, {"X-WKVM-Task": " \t"}):
            r = s.post("/v1/chat/completions", body=body, headers=dict(plain, **extra))
            assert r.status == 400, (extra, r.status, r.body)
            assert r.json()["error"]["type"] == "invalid_request_error", r.body
        # With the task's name it is served, like a request without chat headers.
        for task in ("title_generation", "tags_generation", "follow_up_generation"):
            r = s.post("/v1/chat/completions", body=body,
                       headers=dict(plain, **{"X-WKVM-Task": task}))
            assert r.status == 200, (task, r.status, r.body)
            got = r.json()["choices"][0]["message"]["content"]
            assert got == want, (task, got, want)
        # The session was neither read nor touched: no counter moved ...
        assert session_counters(s) == before, (before, session_counters(s))
        # ... and the chat goes on from its parked state.
        c.turn(nxt)
        after = session_counters(s)
        hits = "wkvm_parent_bound_continuation_hits_total"
        assert float(after[hits]) == float(before[hits]) + 1, (before, after)


def test_exact_prefix_reuse():
    with Stack(model=MODEL, slots=2) as s:
        up(s)
        h = {"X-OpenWebUI-Chat-Id": "plain-chat", "X-OpenWebUI-User-Id": "u"}
        msgs = [{"role": "user", "content": clean_text(s, [], "Tell me about the sea")}]
        r = s.post("/v1/chat/completions", body={"model": "tiny", "messages": msgs,
                                                  "max_tokens": 12, "temperature": 0}, headers=h)
        reply = r.json()["choices"][0]["message"]["content"]
        msgs += [{"role": "assistant", "content": reply.strip()},
                 {"role": "user", "content": "More."}]
        r = s.post("/v1/chat/completions", body={"model": "tiny", "messages": msgs,
                                                  "max_tokens": 12, "temperature": 0}, headers=h)
        assert r.status == 200
        assert metric(s, "wkvm_chat_exact_prefix_reuse_hits_total") == 1
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_idle_sessions_move_to_disk():
    with Stack(model=MODEL, slots=4, extra_ctl=["--session-idle-ms", "300"]) as s:
        up(s)
        c = Chat(s, "idle")
        c.turn(clean_text(s, [], "Hello there"))
        nxt = clean_text(s, c.msgs, "later")
        s.wait(lambda: metric(s, "wkvm_sessions", 'tier="cold"') >= 1 and
               metric(s, "wkvm_sessions", 'tier="hot"') == 0, "idle session spilled")
        # Spilled means moved to disk, not forgotten: the next turn still continues.
        h = metric(s, "wkvm_parent_bound_continuation_hits_total")
        c.turn(nxt)
        assert metric(s, "wkvm_parent_bound_continuation_hits_total") == h + 1


SPM_VOCAB = 512


def spm_piece_bytes():
    """id -> bytes of the test Llama tokenizer's pieces ("\u2581" a space, "<0xXX>" that byte)."""
    vocab, _ = bpe_json.spm_build(SPM_VOCAB)
    out = {}
    for k, i in vocab.items():
        if len(k) == 6 and k.startswith("<0x") and k.endswith(">"):
            out[i] = bytes([int(k[3:5], 16)])
        else:
            out[i] = k.replace(bpe_json.SPM_MS, " ").encode("utf-8")
    out[2] = b""  # </s>: end-of-text, never rendered by the template
    return out


def pick_spm_model():
    """The demo RWKV model with a Llama-2 style (hf-spm) tokenizer.json instead
    of its World vocab, and a seed whose first reply token starts with "\u2581"
    (the template renders "Assistant: " + reply)."""
    pieces = spm_piece_bytes()
    for seed in range(11, 80):
        d = os.path.join(TMP.name, f"spm{seed}", "tiny")
        subprocess.run([MKMODEL, "--out", d, "--layers", "2", "--embd", "64", "--head-size",
                        "16", "--ffn", "128", "--vocab", str(SPM_VOCAB), "--seed", str(seed)],
                       check=True, capture_output=True, timeout=60)
        os.remove(os.path.join(d, "rwkv_vocab_v20230424.txt"))
        bpe_json.write_spm_tokenizer_json(os.path.join(d, "tokenizer.json"), SPM_VOCAB)
        text = "User: hi\n\nAssistant:"
        ids = [int(x) for x in infer(d, "--encode", stdin=text).split()]
        # the C encoder agrees with the reference one (Prepend + Replace + BPE)
        assert ids == bpe_json.spm_encode(SPM_VOCAB, text), ids
        first = infer(d, "--tokens", ",".join(map(str, ids)), "--generate", "1").split()
        if pieces[int(first[0])].startswith(b" ") and pieces[int(first[0])].strip():
            return d, pieces
    raise SystemExit("no suitable hf-spm model seed")


def test_spm_continuation():
    """hf-spm (Llama-2 tokenizer.json): the space the encoder prepends is not
    text, so a follow-up whose rendered prompt extends the previous turn's
    text continues the parked state; the delta is encoded as a continuation
    (no "\u2581" in front) and the reply equals a stateless run on exactly
    retained + delta."""
    model, pieces = pick_spm_model()
    mt = 6  # short replies: a random model often samples raw bytes

    def text_of(ids):
        return b"".join(pieces[i] for i in ids).decode("utf-8")

    def clean(s, msgs, prefix):
        for k in range(80):
            text = f"{prefix} {k}"
            reply, _ = fresh_reply(s, msgs + [{"role": "user", "content": text}], mt)
            body = reply[1:]
            if reply.startswith(" ") and body and body == body.strip() and \
                    not any(c in reply for c in "\n\r\x00\ufffd"):
                return text
        raise AssertionError("no clean reply found")

    with Stack(model=model, slots=4) as s:
        up(s)
        c = Chat(s, "spm-chat")
        first = clean(s, [], "Hello there")
        msgs = [{"role": "user", "content": first}]
        j1 = c.turn(first, max_tokens=mt)
        gen = j1["choices"][0]["token_ids"]
        retained = bpe_json.spm_encode(SPM_VOCAB, render(msgs)) + gen
        retained_text = render(msgs) + text_of(gen)
        for k in range(2):
            text = clean(s, c.msgs, f"And more {k}")
            rendered = render(c.msgs + [{"role": "user", "content": text}])
            assert rendered.startswith(retained_text), (rendered, retained_text)
            delta = bpe_json.spm_encode(SPM_VOCAB, rendered[len(retained_text):], prepend=False)
            fresh = s.post("/v1/completions", body={
                "model": "tiny", "prompt": retained + delta, "max_tokens": mt,
                "temperature": 0, "stop": ["\n\n"], "return_token_ids": True}).json()
            j = c.turn(text, max_tokens=mt)
            assert metric(s, "wkvm_parent_bound_continuation_hits_total") == k + 1, \
                s.get("/metrics").body.decode()
            reused = len([i for i in retained if i != 2])  # </s> is hidden, not a prompt token
            u = j["usage"]
            assert u["prompt_tokens"] == reused + len(delta), (u, reused, len(delta))
            assert u["prompt_tokens_details"]["cached_tokens"] == reused, (u, reused)
            assert j["choices"][0]["token_ids"] == fresh["choices"][0]["token_ids"]
            assert j["choices"][0]["message"]["content"] == fresh["choices"][0]["text"]
            gen = j["choices"][0]["token_ids"]
            retained = retained + delta + gen
            retained_text = rendered + text_of(gen)
        assert metric(s, "wkvm_parent_bound_continuation_rejections_total",
                      'reason="template_prefix_mismatch"') == 0


if __name__ == "__main__":
    rc = run_tests([test_hits_and_delta, test_rejections_restart_fresh,
                    test_users_pressure_restart_and_busy, test_task_header_bypasses_the_session,
                    test_exact_prefix_reuse,
                    test_idle_sessions_move_to_disk, test_spm_continuation])
    TMP.cleanup()
    sys.exit(rc)
