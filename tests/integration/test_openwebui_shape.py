"""Open WebUI 0.10.x, as wkvm sees it: every request below is byte-for-byte
the shape Open WebUI 0.10.2 sends to an OpenAI connection configured the way
deploy/open-webui/demo.sh configures it, so CI covers the integration without
installing Open WebUI (deploy/open-webui/demo.sh smoke drives the real one).

Where the shape comes from (open-webui 0.10.2 from PyPI, open_webui/...):
- routers/openai.py, generate_chat_completion(): POSTs {url}/chat/completions
  with json.dumps(payload); payload is the chat form after
  utils/middleware.py process_chat_payload() and apply_params_to_form_data():
  "stream" and "model" first (the browser's order, Chat.svelte
  sendMessageSocket()), then the chat-control params as top-level fields
  (temperature, max_tokens, ...; none unless the user or the model sets
  them), then "messages" (loaded from its database: the stored user texts and
  the assistant replies as persisted, i.e. stripped). "stream_options":
  {"include_usage": true} is added only when the model's "usage" capability
  is ticked. Everything else the browser sent (params, features, variables,
  session_id, chat_id, id, parent_id, user_message, background_tasks, ...)
  is popped before the upstream call.
- routers/openai.py, get_headers_and_cookies(): Content-Type; with
  ENABLE_FORWARD_USER_INFO_HEADERS=true, utils/headers.py
  include_user_info_headers(): X-OpenWebUI-User-Name (urllib quote(name.strip(),
  safe=' ')), X-OpenWebUI-User-Id, X-OpenWebUI-User-Email (stripped),
  X-OpenWebUI-User-Role, then X-OpenWebUI-Chat-Id when the request has a chat
  id; "Authorization: Bearer <key>" (key "none" here); then the connection's
  OPENAI_API_CONFIGS["0"]["headers"] after utils/headers.py
  get_custom_headers() substituted {{MESSAGE_ID}} (metadata message_id: the
  new assistant message), {{USER_MESSAGE_ID}} (metadata user_message_id) and
  {{USER_MESSAGE_PARENT_ID}} (user_message.parentId: the previous assistant
  message, "" on turn 1); a missing variable becomes "".
- aiohttp adds Accept: */*, Accept-Encoding: gzip, deflate, br and its
  User-Agent.
- Background tasks (utils/middleware.py background_tasks_handler(),
  routers/tasks.py generate_title()/generate_chat_tags()/generate_follow_ups())
  reuse the chat's request metadata but not the assistant message id, so
  they reach wkvm with the contract header, the chat and user-message ids and
  an EMPTY X-WKVM-Assistant-Message-ID, non-streaming: title {"model",
  "messages", "stream": false, "max_tokens": 1000} (sent concurrently with
  turn 1), tags and follow-ups {"model", "messages", "stream": false}. wkvm
  answers them 400 (the contract requires the assistant id) without touching
  the session; demo.sh turns them off.
- GET {url}/models is sent with the same headers and empty ids.
All of this was checked against a capture of a live Open WebUI 0.10.2.

The replies of a random-weight model are arbitrary; like test_sessions.py,
each user text is chosen (by a stateless preview) so that the greedy reply
looks like a trained model's (leading space, no outer whitespace, valid
UTF-8), which is what lets the next turn continue token-exactly.
"""
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from urllib.parse import quote, urlsplit

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import MKMODEL, WORKERD, BUILD, Stack, free_port, run_tests  # noqa: E402

TMP = tempfile.TemporaryDirectory(prefix="wkvm-owui-")
INFER = os.path.join(BUILD, "workerd", "wkvm-infer")
PARAMS = {"temperature": 0, "max_tokens": 16}  # "Chat Controls > Advanced Params"


def infer(model, *args, stdin=None):
    return subprocess.run([INFER, "--model", model, "--threads", "1", *args], input=stdin,
                          capture_output=True, text=True, timeout=60, check=True).stdout


def pick_model():
    """A tiny random model whose first reply token starts with a space, as a
    trained chat model's does (see test_sessions.pick_model)."""
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
MODEL_ID = "tiny"


class OpenWebUI:
    """One Open WebUI 0.10.2 user talking to one wkvm connection."""

    def __init__(self, s, name="Zoë Müller", email=" zoe@example.org ", role="user", key="none"):
        self.s = s
        self.user_id = str(uuid.uuid4())
        self.name, self.email, self.role, self.key = name, email, role, key

    def headers(self, chat_id=None, message_id="", user_message_id="", parent_id=""):
        # get_headers_and_cookies(): order as Open WebUI builds the dict.
        h = [("Content-Type", "application/json"),
             ("X-OpenWebUI-User-Name", quote(self.name.strip(), safe=" ")),
             ("X-OpenWebUI-User-Id", self.user_id),
             ("X-OpenWebUI-User-Email", self.email.strip()),
             ("X-OpenWebUI-User-Role", self.role)]
        if chat_id:
            h.append(("X-OpenWebUI-Chat-Id", chat_id))
        h.append(("Authorization", f"Bearer {self.key}"))
        # OPENAI_API_CONFIGS["0"]["headers"] after get_custom_headers().
        h += [("X-WKVM-Stateful-Chat", "parent-token-v1"),
              ("X-WKVM-Assistant-Message-ID", message_id),
              ("X-WKVM-User-Message-ID", user_message_id),
              ("X-WKVM-Parent-Message-ID", parent_id)]
        # aiohttp's own.
        h += [("Accept", "*/*"), ("Accept-Encoding", "gzip, deflate, br"),
              ("User-Agent", "Python/3.11 aiohttp/3.13.5")]
        return h

    def request(self, method, path, headers, body=None):
        u = urlsplit(self.s.url)
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
        c.putrequest(method, "/v1" + path, skip_accept_encoding=True)
        data = json.dumps(body).encode() if body is not None else None  # json.dumps(payload)
        for k, v in headers:
            c.putheader(k, v.encode("utf-8"))
        if data is not None:
            c.putheader("Content-Length", str(len(data)))
        c.endheaders(data)
        r = c.getresponse()
        raw = r.read()
        if r.getheader("Content-Encoding") in ("gzip", "deflate"):
            raw = zlib.decompress(raw, 47)
        c.close()
        return r.status, r.getheader("Content-Type") or "", raw

    def models(self):
        return self.request("GET", "/models", self.headers())


class Chat:
    """A chat as Open WebUI keeps it: a message tree in its database; what it
    sends upstream is the branch up to the new user message."""

    def __init__(self, ui):
        self.ui = ui
        self.id = str(uuid.uuid4())  # main.py chat_completion(): uuid4() for a new chat
        self.branch = []             # [(user_id, user_text, assistant_id, reply_stripped)]

    def messages(self, branch, text):
        msgs = []
        for _, utext, _, reply in branch:
            msgs += [{"role": "user", "content": utext}, {"role": "assistant", "content": reply}]
        return msgs + [{"role": "user", "content": text}]

    def body(self, msgs, extra=None):
        b = {"stream": True, "model": MODEL_ID}
        b.update(PARAMS)
        b.update(extra or {})
        b["messages"] = msgs
        return b

    def send(self, text, branch=None, user_id=None, extra=None):
        """One turn: a new assistant message under a (new or given) user
        message whose parent is the last assistant message of branch."""
        branch = self.branch if branch is None else branch
        aid = str(uuid.uuid4())
        uid = user_id or str(uuid.uuid4())
        parent = branch[-1][2] if branch else ""
        for attempt in range(3):
            st, ctype, raw = self.ui.request(
                "POST", "/chat/completions", self.ui.headers(self.id, aid, uid, parent),
                self.body(self.messages(branch, text), extra))
            # wkvm releases a chat's session lock only after the previous
            # turn's last bytes were sent (ctl_chat_end() runs after
            # ctl_oa_generate() returns), so a client as fast as this one can
            # get 409 session_busy for the next turn (about 1 in 60). A person
            # typing in Open WebUI never does; retry rather than flake, and
            # say so. Remove once the lock is released before the reply ends.
            if st == 409 and b"session_busy" in raw and attempt < 2:
                print("note: 409 session_busy right after the previous turn; retrying",
                      flush=True)
                time.sleep(0.05 * (attempt + 1))
                continue
            break
        assert st == 200, (st, raw[:500])
        assert ctype.startswith("text/event-stream"), ctype
        reply, finish, usage = parse_sse(raw)
        assert finish in ("stop", "length"), (finish, raw[-300:])
        # middleware.py streaming handler: the last output_text is .strip()ped.
        self.branch = branch + [(uid, text, aid, reply.strip())]
        return reply, usage

    def task(self, prompt, max_tokens=None, user_id=None, parent=""):
        """A background-task request (title/tags/follow-ups) as it reaches wkvm."""
        body = {"model": MODEL_ID, "messages": [{"role": "user", "content": prompt}],
                "stream": False}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        uid = user_id or (self.branch[-1][0] if self.branch else "")
        return self.ui.request("POST", "/chat/completions",
                               self.ui.headers(self.id, "", uid, parent), body)


def parse_sse(raw):
    """What Open WebUI's stream consumer reads: data: lines until [DONE]."""
    text, finish, usage, done = "", None, None, False
    for line in raw.decode("utf-8").split("\n"):
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            continue
        j = json.loads(data)
        assert "error" not in j, j
        if j.get("usage"):
            usage = j["usage"]
        for ch in j.get("choices", []):
            text += (ch.get("delta") or {}).get("content") or ""
            finish = ch.get("finish_reason") or finish
    assert done, raw[-300:]
    return text, finish, usage


def clean(reply):
    body = reply[1:]
    return (reply.startswith(" ") and body != "" and body == body.strip()
            and not any(c in reply for c in "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\ufffd"))


def pick_text(s, chat, prefix, branch=None):
    """A user text whose greedy reply (previewed statelessly: no chat id, so no
    session is touched) round-trips through Open WebUI and the template."""
    branch = chat.branch if branch is None else branch
    for k in range(80):
        text = f"{prefix} {k}"
        r = s.post("/v1/chat/completions", body={"model": MODEL_ID, **PARAMS,
                                                  "messages": chat.messages(branch, text)})
        assert r.status == 200, r.body
        if clean(r.json()["choices"][0]["message"]["content"]):
            return text
    raise AssertionError("no clean reply found")


def counters(s):
    text = s.get("/metrics").body.decode()
    out = {}
    for m in re.finditer(r"^(wkvm_parent_bound_\w+)(\{[^}]*\})? ([0-9.e+]+)$", text, re.M):
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def hits(c):
    return c.get("wkvm_parent_bound_continuation_hits_total", 0)


def decided(c):
    """Follow-ups that got a decision: a hit, a regenerate hit (the state kept
    from before the last reply), a miss or a rejection of any reason."""
    return sum(v for k, v in c.items() if k.startswith((
        "wkvm_parent_bound_continuation_hits_total", "wkvm_parent_bound_regenerate_hits_total",
        "wkvm_parent_bound_continuation_misses_total",
        "wkvm_parent_bound_continuation_rejections_total")))


def up(s):
    s.start_controller()
    s.start_worker("w0")
    s.wait(lambda: s.get("/ready").status == 200, "ready")


TITLE = ("### Task:\nGenerate a concise, 3-5 word title with an emoji summarizing the chat "
         "history.\n### Chat History:\n<chat_history>\nUSER: {u}\nASSISTANT: \n</chat_history>")
TAGS = ("### Task:\nGenerate 1-3 broad tags categorizing the main themes of the chat history, "
        "along with 1-3 more specific subtopic tags.\n### Chat History:\n<chat_history>\n"
        "USER: {u}\nASSISTANT: \n</chat_history>")
FOLLOW = ("### Task:\nSuggest 3-5 relevant follow-up questions or prompts that the user might "
          "naturally ask next in this conversation as a **user**.\n### Chat History:\n"
          "<chat_history>\nUSER: {u}\nASSISTANT: {a}\n</chat_history>")


def test_models_with_open_webui_headers():
    """Open WebUI lists models with the connection's headers and empty ids."""
    with Stack(model=MODEL, slots=4) as s:
        up(s)
        st, _, raw = OpenWebUI(s).models()
        assert st == 200, raw
        assert [m["id"] for m in json.loads(raw)["data"]] == [MODEL_ID], raw


def test_three_turns_regenerate_edit_and_tasks():
    with Stack(model=MODEL, slots=4) as s:
        up(s)
        ui = OpenWebUI(s)
        chat = Chat(ui)
        # Turn 1, with the title task running concurrently as Open WebUI does
        # for a new chat (main.py: run_initial_title_generation()).
        t1 = pick_text(s, chat, "Hello there")
        uid1 = str(uuid.uuid4())
        title = {}
        th = threading.Thread(target=lambda: title.setdefault(
            "r", chat.task(TITLE.format(u=t1), max_tokens=1000, user_id=uid1)))
        th.start()
        c0 = counters(s)
        chat.send(t1, user_id=uid1)
        th.join(timeout=120)
        st, ctype, raw = title["r"]
        # The task carries the contract without an assistant id: refused
        # before any session is touched, or (with a task-aware wkvm) answered.
        assert st in (200, 400), (st, raw[:300])
        if st == 400:
            assert ctype.startswith("application/json") and "error" in json.loads(raw), raw
        # Tags and follow-ups after turn 1 (non-streaming, no assistant id).
        for prompt in (TAGS.format(u=t1), FOLLOW.format(u=t1, a="")):
            st, _, raw = chat.task(prompt)
            assert st in (200, 400), (st, raw[:300])
        assert hits(counters(s)) == hits(c0)  # a first turn is never a hit
        # Turns 2 and 3 continue the parked state; a follow-up task after each.
        for n, prefix in ((2, "Tell me more"), (3, "And then")):
            text = pick_text(s, chat, prefix)
            before = counters(s)
            extra = {"stream_options": {"include_usage": True}} if n == 3 else None
            reply, usage = chat.send(text, extra=extra)
            after = counters(s)
            assert hits(after) == hits(before) + 1, (n, before, after)
            if n == 3:  # the "usage" capability: a usage chunk before [DONE]
                assert usage and usage["prompt_tokens_details"]["cached_tokens"] > 0, usage
            st, _, raw = chat.task(FOLLOW.format(u=text, a=reply.strip()),
                                   parent=chat.branch[-2][2])
            assert st in (200, 400), (st, raw[:300])
        # Regenerate the last reply: same user message (id and parent), a new
        # assistant id. Answered; decided by the rules (a restart from the
        # prompt, or a hit where wkvm reuses the parent snapshot).
        last_uid, last_text = chat.branch[-1][0], chat.branch[-1][1]
        parent_branch = chat.branch[:-1]
        before = counters(s)
        reply, _ = chat.send(last_text, branch=parent_branch, user_id=last_uid)
        assert reply.strip(), "regenerate got an empty reply"
        assert decided(counters(s)) == decided(before) + 1, (before, counters(s))
        # Edit the last user message: a new user message (new id) under the
        # same parent, a new assistant id.
        edited = pick_text(s, chat, "Edited question", branch=parent_branch)
        before = counters(s)
        reply, _ = chat.send(edited, branch=parent_branch)
        assert reply.strip(), "edit got an empty reply"
        assert decided(counters(s)) == decided(before) + 1, (before, counters(s))
        # The conversation goes on from the edited branch: a hit again.
        text = pick_text(s, chat, "After the edit")
        before = counters(s)
        chat.send(text)
        assert hits(counters(s)) == hits(before) + 1, (before, counters(s))
        # Two Open WebUI users with the same chat id never share a session.
        other = Chat(OpenWebUI(s, name="Ada", email="ada@example.org"))
        other.id = chat.id
        t = pick_text(s, other, "Hi, I am Ada")
        other.send(t)
        t = pick_text(s, other, "Go on")
        before = counters(s)
        other.send(t)
        assert hits(counters(s)) == hits(before) + 1, (before, counters(s))


def test_remote_worker_over_tcp():
    """A worker on "another host": the controller listens on
    --worker-url tcp://127.0.0.1:PORT, the worker dials --controller with
    the same URL and its own data dir; a chat completion is served by it."""
    url = f"tcp://127.0.0.1:{free_port()}"
    with Stack(model=MODEL, slots=4, extra_ctl=["--worker-url", url]) as s:
        s.start_controller()
        wdata = tempfile.mkdtemp(prefix="wkvm-remote-", dir=TMP.name)
        log = open(os.path.join(wdata, "worker.log"), "ab")
        s.logs.append(log.name)
        p = subprocess.Popen([WORKERD, "--controller", url, "--data-dir", wdata, "--id", "remote0",
                              "--backend", "cpu", "--threads", "1"],
                             stdout=log, stderr=subprocess.STDOUT)
        s.procs.append(p)  # Stack.stop() ends it
        s.wait(lambda: s.get("/ready").status == 200, "ready with the tcp worker")
        ws = s.workers_list()
        assert [w["id"] for w in ws] == ["remote0"], ws
        assert not os.path.exists(os.path.join(s.data, "controller.ipc"))
        ui = OpenWebUI(s)
        chat = Chat(ui)
        chat.send(pick_text(s, chat, "Hello over tcp"))
        text = pick_text(s, chat, "More over tcp")
        before = counters(s)
        reply, _ = chat.send(text)
        assert reply.strip()
        assert hits(counters(s)) == hits(before) + 1


def test_compose_matches_demo():
    """deploy/open-webui/compose.yaml sets what demo.sh start sets."""
    src = os.environ.get("WKVM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "../.."))
    env = {k: v for k, v in os.environ.items()
           if k not in ("WKVM_PORT", "WEBUI_PORT", "WKVM_MODEL_DIR", "WKVM_DATA")}
    out = subprocess.run(["bash", os.path.join(src, "deploy/open-webui/demo.sh"), "env", "--data",
                          os.path.join(TMP.name, "demo-env")], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    demo = dict(line.split("=", 1) for line in out.splitlines())
    headers = json.loads(demo["OPENAI_API_CONFIGS"])["0"]["headers"]
    assert headers == {"X-WKVM-Stateful-Chat": "parent-token-v1",
                       "X-WKVM-Assistant-Message-ID": "{{MESSAGE_ID}}",
                       "X-WKVM-User-Message-ID": "{{USER_MESSAGE_ID}}",
                       "X-WKVM-Parent-Message-ID": "{{USER_MESSAGE_PARENT_ID}}"}, headers
    try:
        import yaml
    except ImportError:
        print("test_compose_matches_demo: no PyYAML (python3-yaml), compose.yaml not compared")
        return
    with open(os.path.join(src, "deploy/open-webui/compose.yaml")) as f:
        svc = yaml.safe_load(f)["services"]["open-webui"]
    assert svc["network_mode"] == "host", svc
    comp = svc["environment"]
    assert comp["HOST"] == "127.0.0.1" and comp["PORT"] == "3000", comp
    local = {"DATA_DIR", "WEBUI_SECRET_KEY", "HF_HOME"}  # paths/secrets of the venv install
    for k, v in demo.items():
        if k not in local:
            assert comp.get(k) == v, (k, v, comp.get(k))
    extra = set(comp) - set(demo) - {"HOST", "PORT"}
    assert not extra, extra


if __name__ == "__main__":
    rc = run_tests([test_compose_matches_demo, test_models_with_open_webui_headers,
                    test_three_turns_regenerate_edit_and_tasks,
                    test_remote_worker_over_tcp])
    TMP.cleanup()
    sys.exit(rc)
