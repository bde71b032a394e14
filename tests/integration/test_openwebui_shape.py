"""Open WebUI 0.10.2 and 0.12.4, as wkvm sees them: every request below is
byte-for-byte the shape those versions send to an OpenAI connection
configured the way deploy/open-webui/demo.sh configures it, so CI covers the
integration without installing Open WebUI (deploy/open-webui/demo.sh smoke
and browser-smoke drive the real ones).

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

What 0.12.4 (open-webui 0.12.4 from PyPI) does differently:
- utils/headers.py include_user_info_headers(): X-OpenWebUI-Auth-Type
  (request.state.auth_type: "jwt" for the browser's login token, "api_key"
  for an API key) right after Content-Type, before the user headers;
  parse_custom_headers() URL-quotes every custom header value after the
  template substitution (quote(value, safe=punctuation + ' \\t'): ASCII ids
  unchanged, non-ASCII percent-encoded).
- utils/json_codec.py JSONCodec.dumps(): orjson, compact (no spaces), UTF-8
  (no \\u escapes).
- The browser sends no "messages" for a saved chat (Chat.svelte: "persisted
  chats load from DB"); utils/middleware.py load_messages_from_db() rebuilds
  them, assistant replies from their stored output items
  (process_messages_with_output(): {"role", "content"} only), the last
  output_text stripped as in 0.10.2 and every stored string passed through
  utils/misc.py sanitize_text_for_db() (NUL and lone surrogates removed).
- Regenerate menu (ResponseMessage/RegenerateMenu.svelte): "Try Again" is a
  plain regenerate (same user message, new assistant id) in both versions;
  "Add Details", "More Concise" or a typed suggestion send
  regeneration_prompt, which process_chat_payload() appends as a user
  message: 0.10.2 after the user message being answered, 0.12.4 after that
  user message AND the reply being regenerated (regeneration_message_id).
- Title: with title generation off the chat is titled with the first user
  message (chat:title event, its data a plain string), not "New Chat".
- Socket events: the reply streams as response:completion events of type
  response.output_text.delta (0.10.2: chat:completion with the content so
  far); both end with chat:completion {"done": true, ...}.

The replies of a random-weight model are arbitrary; like test_sessions.py,
each user text is chosen (by a stateless preview) so that the greedy reply
looks like a trained model's (leading space, no outer whitespace, valid
UTF-8), which is what lets the next turn continue token-exactly.
"""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from string import punctuation
from urllib.parse import quote, urlsplit

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import MKMODEL, WORKERD, BUILD, Stack, free_port, run_tests  # noqa: E402

SRC = os.environ.get("WKVM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "../.."))
sys.path.insert(0, os.path.join(SRC, "deploy/open-webui"))
from demo_common import event_kind, is_delta  # noqa: E402

VERSIONS = ("0.10.2", "0.12.4")

TMP = tempfile.TemporaryDirectory(prefix="wkvm-owui-")
INFER = os.path.join(BUILD, "tools", "wkvm-infer")
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
    """One Open WebUI user (of the given version, signed in in the browser)
    talking to one wkvm connection."""

    def __init__(self, s, name="Zoë Müller", email=" zoe@example.org ", role="user", key="none",
                 version="0.10.2"):
        assert version in VERSIONS, version
        self.s = s
        self.user_id = str(uuid.uuid4())
        self.name, self.email, self.role, self.key = name, email, role, key
        self.version = version

    def custom(self, value):
        # 0.12.4 parse_custom_headers(): quoted after the substitution.
        return quote(value, safe=punctuation + " \t") if self.version == "0.12.4" else value

    def headers(self, chat_id=None, message_id="", user_message_id="", parent_id=""):
        # get_headers_and_cookies(): order as Open WebUI builds the dict.
        h = [("Content-Type", "application/json")]
        if self.version == "0.12.4":  # the browser's login token is a JWT
            h.append(("X-OpenWebUI-Auth-Type", "jwt"))
        h += [("X-OpenWebUI-User-Name", quote(self.name.strip(), safe=" ")),
             ("X-OpenWebUI-User-Id", self.user_id),
             ("X-OpenWebUI-User-Email", self.email.strip()),
             ("X-OpenWebUI-User-Role", self.role)]
        if chat_id:
            h.append(("X-OpenWebUI-Chat-Id", chat_id))
        h.append(("Authorization", f"Bearer {self.key}"))
        # OPENAI_API_CONFIGS["0"]["headers"] after get_custom_headers().
        h += [("X-WKVM-Stateful-Chat", self.custom("parent-token-v1")),
              ("X-WKVM-Assistant-Message-ID", self.custom(message_id)),
              ("X-WKVM-User-Message-ID", self.custom(user_message_id)),
              ("X-WKVM-Parent-Message-ID", self.custom(parent_id))]
        # aiohttp's own.
        h += [("Accept", "*/*"), ("Accept-Encoding", "gzip, deflate, br"),
              ("User-Agent", "Python/3.11 aiohttp/3.13.5")]
        return h

    def request(self, method, path, headers, body=None):
        u = urlsplit(self.s.url)
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
        c.putrequest(method, "/v1" + path, skip_accept_encoding=True)
        data = None
        if body is not None and self.version == "0.12.4":  # JSONCodec.dumps(): orjson
            data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        elif body is not None:  # json.dumps(payload)
            data = json.dumps(body).encode()
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

    def send(self, text, branch=None, user_id=None, extra=None, suggestion=None, old_reply=None):
        """One turn: a new assistant message under a (new or given) user
        message whose parent is the last assistant message of branch. With
        suggestion: the regenerate menu's "Add Details", "More Concise" or
        a typed change (regeneration_prompt) for the reply old_reply."""
        branch = self.branch if branch is None else branch
        aid = str(uuid.uuid4())
        uid = user_id or str(uuid.uuid4())
        parent = branch[-1][2] if branch else ""
        msgs = self.messages(branch, text)
        if suggestion is not None:
            if self.ui.version == "0.12.4":  # regeneration_message_id: the old reply first
                msgs.append({"role": "assistant", "content": old_reply})
            msgs.append({"role": "user", "content": suggestion})
        for attempt in range(3):
            st, ctype, raw = self.ui.request(
                "POST", "/chat/completions", self.ui.headers(self.id, aid, uid, parent),
                self.body(msgs, extra))
            # wkvm releases a chat's session lock only after the previous
            # turn's last bytes were sent (ctl_chat_end() runs after
            # ctl_openai_generate() returns), so a client as fast as this one can
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
    for m in re.finditer(r"^(wkvm_(?:parent_bound_\w+|reuse_hits_total|prefix_tokens_reused_total))"
                         r"(\{[^}]*\})? ([0-9.e+]+)$", text, re.M):
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def moved(before, after):
    """The decision and reuse counters that changed (prefix_tokens left out)."""
    return {k: v - before.get(k, 0) for k, v in after.items()
            if v != before.get(k, 0) and k != "wkvm_prefix_tokens_reused_total"}


def hits(c):
    return c.get("wkvm_parent_bound_continuation_hits_total", 0)


# An edit of the last user message, "Add Details"/"More Concise": the parent
# id is not the session's last reply and the user message is not the one it
# answered, so parent-token-v1 rejects the turn (parent_message_mismatch)
# and the prefix index resumes the longest checkpoint of the prompt.
EDIT = {'wkvm_parent_bound_continuation_rejections_total{reason="parent_message_mismatch"}': 1,
        'wkvm_reuse_hits_total{kind="checkpoint"}': 1}
SUGGESTION = {"0.10.2": EDIT, "0.12.4": EDIT}
# The turn after a suggestion: the parked state consumed the suggestion
# message, which Open WebUI does not store (its history is user message ->
# new reply), so the earlier history differs (prior_history_mismatch) and the
# index resumes the checkpoint before the regenerated reply.
AFTER_SUGGESTION = {"0.10.2": {
    'wkvm_parent_bound_continuation_rejections_total{reason="prior_history_mismatch"}': 1,
    'wkvm_reuse_hits_total{kind="checkpoint"}': 1}}
AFTER_SUGGESTION["0.12.4"] = AFTER_SUGGESTION["0.10.2"]
# What wkvm answers a background task that carries the contract without an
# assistant message id.
TASK_ERROR = {"type": "invalid_request_error", "code": "invalid_request",
              "message": "header X-WKVM-Assistant-Message-ID is required with "
                         "X-WKVM-Stateful-Chat: parent-token-v1"}


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
        for version in VERSIONS:
            st, _, raw = OpenWebUI(s, version=version).models()
            assert st == 200, (version, raw)
            assert [m["id"] for m in json.loads(raw)["data"]] == [MODEL_ID], raw


def test_try_again_and_next_turn_after_restart():
    """A graceful wkvm restart between turns (SIGTERM: parked sessions and
    warm checkpoints go to disk): Try Again on the last reply and the next
    turn still reuse, as Open WebUI 0.12.4 sends them."""
    with Stack(model=MODEL, slots=4) as s:
        up(s)
        chat = Chat(OpenWebUI(s, version="0.12.4"))
        chat.send(pick_text(s, chat, "Hello there"))
        chat.send(pick_text(s, chat, "Tell me more"))
        s.kill_controller(signal.SIGTERM)
        s.start_controller()
        s.wait(lambda: s.get("/ready").status == 200, "ready after the restart")
        uid, text = chat.branch[-1][0], chat.branch[-1][1]
        before = counters(s)
        reply, _ = chat.send(text, branch=chat.branch[:-1], user_id=uid)
        assert reply.strip()
        # the checkpoint before the prompt's last token, written at shutdown
        expect("Try Again after a restart", before, counters(s), REGENERATE_HIT)
        text = pick_text(s, chat, "And then")
        before = counters(s)
        chat.send(text)
        expect("the next turn", before, counters(s), HIT)


# Open WebUI 0.12.4's builtin tools (utils/tools.py get_builtin_tools()), as
# native function calling offers them when function_calling is not "legacy":
# 28 with the default features; no tool_choice is sent.
BUILTIN_TOOLS_0_12_4 = [
    "get_current_timestamp", "calculate_timestamp", "ask_user", "list_chat_files",
    "query_chat_files", "grep_chat_files", "view_file", "kb_exec", "query_knowledge_files",
    "view_note", "query_knowledge_bases", "search_knowledge_bases", "view_knowledge_file",
    "search_chats", "view_chat", "delegate_task", "timer", "search_web", "fetch_url",
    "generate_image", "edit_image", "execute_code", "search_notes", "write_note",
    "replace_note_content", "view_skill", "read_skill_file", "grep_skill_files"]


def test_native_tools_0_12_4():
    """Without DEFAULT_MODEL_PARAMS function_calling "legacy", 0.12.4 sends
    its builtin tools with every turn and no tool_choice: wkvm answers with a
    plain message (its models never call a tool) and the chat continues."""
    assert len(BUILTIN_TOOLS_0_12_4) == 28
    tools = [{"type": "function", "function": {
        "name": n, "description": f"{n} (Open WebUI builtin)",
        "parameters": {"type": "object", "properties": {}, "required": []}}}
        for n in BUILTIN_TOOLS_0_12_4]
    with Stack(model=MODEL, slots=4) as s:
        up(s)
        chat = Chat(OpenWebUI(s, version="0.12.4"))
        chat.send(pick_text(s, chat, "Hello there"), extra={"tools": tools})
        text = pick_text(s, chat, "Tell me more")
        before = counters(s)
        reply, _ = chat.send(text, extra={"tools": tools})
        assert reply.strip()
        expect("turn 2 with tools", before, counters(s), HIT)


# The socket events of one reply as Open WebUI pushes them to the browser
# (the `events` message's data), per version: utils/middleware.py, the
# streaming handler and background_tasks_handler().
EVENTS = {
    "0.10.2": [
        {"type": "chat:active", "data": {"active": True}},
        {"type": "chat:completion", "data": {"content": " Hel"}},
        {"type": "chat:completion", "data": {"content": " Hello"}},
        {"type": "chat:completion", "data": {"done": True, "content": "Hello", "title": ""}},
        {"type": "chat:title", "data": ""},
    ],
    "0.12.4": [
        {"type": "chat:active", "data": {"active": True, "folder_id": None}},
        {"type": "chat:title", "data": "Hello! What is a state slot?"},
        {"type": "response:completion", "data": {
            "type": "response.output_item.added", "output_index": 0,
            "item": {"type": "message", "id": "msg_1", "status": "in_progress",
                     "role": "assistant", "content": []}}},
        {"type": "response:completion", "data": {
            "type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
            "content_index": 0, "delta": " Hel"}},
        {"type": "response:completion", "data": {
            "type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
            "content_index": 0, "delta": "lo"}},
        {"type": "chat:completion", "data": {
            "done": True, "title": "Hello! What is a state slot?",
            "output": [{"type": "message", "id": "msg_1", "status": "completed",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "Hello"}]}]}},
        {"type": "chat:list", "data": {}},
    ],
}


def test_socket_event_kinds():
    """smoke.py's reading of both versions' events (demo_common): two deltas
    each, a plain-string chat:title is no completion, done is seen."""
    for version, evs in EVENTS.items():
        deltas = [e for e in evs if is_delta(*event_kind(e))]
        assert len(deltas) == 2, (version, deltas)
        done = [e for e in evs if event_kind(e)[0] == "chat:completion"
                and isinstance(event_kind(e)[1], dict) and event_kind(e)[1].get("done")]
        assert len(done) == 1, version
        titles = [event_kind(e)[1] for e in evs if event_kind(e)[0] == "chat:title"]
        assert titles and all(isinstance(t, str) for t in titles), version
    assert event_kind("not a dict") == (None, "not a dict")


HIT = {"wkvm_parent_bound_continuation_hits_total": 1,
       'wkvm_reuse_hits_total{kind="parent_bound"}': 1}
REGENERATE_HIT = {"wkvm_parent_bound_regenerate_hits_total": 1,
                  'wkvm_reuse_hits_total{kind="regenerate"}': 1}


def expect(step, before, after, want):
    got = moved(before, after)
    print(f"  {step}: {json.dumps(got, sort_keys=True)}", flush=True)
    assert got == want, (step, got, want)


def three_turns_regenerate_edit_and_tasks(version):
    with Stack(model=MODEL, slots=4) as s:
        up(s)
        ui = OpenWebUI(s, version=version)
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
        # The task carries the contract without an assistant id: refused
        # before any session is touched (demo.sh turns the tasks off;
        # X-WKVM-Task is the way to keep them, see test_background_task_header).
        task_refused(*title["r"])
        # Tags and follow-ups after turn 1 (non-streaming, no assistant id).
        for prompt in (TAGS.format(u=t1), FOLLOW.format(u=t1, a="")):
            task_refused(*chat.task(prompt))
        expect("turn 1", c0, counters(s), {})  # a first turn is never a hit
        # Turns 2 and 3 continue the parked state; a follow-up task after each.
        for n, prefix in ((2, "Tell me more"), (3, "And then")):
            text = pick_text(s, chat, prefix)
            before = counters(s)
            extra = {"stream_options": {"include_usage": True}} if n == 3 else None
            reply, usage = chat.send(text, extra=extra)
            expect(f"turn {n}", before, counters(s), HIT)
            if n == 3:  # the "usage" capability: a usage chunk before [DONE]
                assert usage and usage["prompt_tokens_details"]["cached_tokens"] > 0, usage
            task_refused(*chat.task(FOLLOW.format(u=text, a=reply.strip()),
                                    parent=chat.branch[-2][2]))
        # "Try Again": same user message (id and parent), a new assistant id.
        # The parent check fails against the latest reply; the state kept
        # from the end of the previous prompt answers it.
        last_uid, last_text = chat.branch[-1][0], chat.branch[-1][1]
        parent_branch = chat.branch[:-1]
        before = counters(s)
        reply, _ = chat.send(last_text, branch=parent_branch, user_id=last_uid)
        assert reply.strip(), "regenerate got an empty reply"
        expect("Try Again", before, counters(s), REGENERATE_HIT)
        # Edit the last user message: a new user message (new id) under the
        # same parent, a new assistant id: a parent mismatch, answered from
        # the checkpoint at the end of the previous reply.
        edited = pick_text(s, chat, "Edited question", branch=parent_branch)
        before = counters(s)
        reply, _ = chat.send(edited, branch=parent_branch)
        assert reply.strip(), "edit got an empty reply"
        expect("edit", before, counters(s), EDIT)
        # The conversation goes on from the edited branch: a hit again.
        text = pick_text(s, chat, "After the edit")
        before = counters(s)
        chat.send(text)
        expect("after the edit", before, counters(s), HIT)
        # Two Open WebUI users with the same chat id never share a session.
        other = Chat(OpenWebUI(s, name="Ada", email="ada@example.org", version=version))
        other.id = chat.id
        t = pick_text(s, other, "Hi, I am Ada")
        other.send(t)
        t = pick_text(s, other, "Go on")
        before = counters(s)
        other.send(t)
        expect("other user", before, counters(s), HIT)


def test_three_turns_regenerate_edit_and_tasks_0_10_2():
    three_turns_regenerate_edit_and_tasks("0.10.2")


def test_three_turns_regenerate_edit_and_tasks_0_12_4():
    three_turns_regenerate_edit_and_tasks("0.12.4")


def regenerate_menu(version):
    """The regenerate menu's "Add Details" and "More Concise" (and a typed
    suggestion: the same request), then the next turn."""
    with Stack(model=MODEL, slots=4) as s:
        up(s)
        chat = Chat(OpenWebUI(s, version=version))
        chat.send(pick_text(s, chat, "Hello there"))
        chat.send(pick_text(s, chat, "Tell me more"))
        for suggestion in ("Add Details", "More Concise"):
            uid, text, _, old = chat.branch[-1]
            before = counters(s)
            reply, usage = chat.send(text, branch=chat.branch[:-1], user_id=uid,
                                     suggestion=suggestion, old_reply=old,
                                     extra={"stream_options": {"include_usage": True}})
            assert reply.strip(), (suggestion, reply)
            fresh = usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
            print(f"  {suggestion}: prompt {usage['prompt_tokens']}, computed {fresh}", flush=True)
            if suggestion == "Add Details":
                # Only the suggestion is computed: 0.12.4 resumes the old
                # reply's end, 0.10.2 the end of the user message (a
                # boundary checkpoint the continued turn 2 left). (The
                # second suggestion revises a reply that was generated
                # after the first one: that reply is computed again.)
                tail = f"\n\nUser: {suggestion}\n\nAssistant:".encode()
                assert fresh <= len(tail), (suggestion, usage)
            expect(suggestion, before, counters(s), SUGGESTION[version])
        text = pick_text(s, chat, "And then")
        before = counters(s)
        chat.send(text)
        expect("after More Concise", before, counters(s), AFTER_SUGGESTION[version])


def test_regenerate_menu_0_10_2():
    regenerate_menu("0.10.2")


def test_regenerate_menu_0_12_4():
    regenerate_menu("0.12.4")


def task_refused(st, ctype, raw):
    assert st == 400, (st, raw[:300])
    assert ctype.startswith("application/json"), ctype
    err = json.loads(raw)["error"]
    print(f"  task: {err}", flush=True)
    assert TASK_ERROR.items() <= err.items(), err


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
    """deploy/open-webui/compose.yaml sets what demo.sh start sets; demo.sh keeps native
    function calling for a model with its own template."""
    src = SRC
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
    import yaml  # python3-yaml (deploy/install-deps)
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
    # A model with its own template keeps Open WebUI's default, native function
    # calling (the World demo model above gets legacy); WKVM_FUNCTION_CALLING overrides.
    assert json.loads(demo["DEFAULT_MODEL_PARAMS"]) == {"function_calling": "legacy",
                                                        "reasoning_tags": False}, demo
    tpl = os.path.join(TMP.name, "demo-env-templated")
    os.makedirs(tpl, exist_ok=True)
    with open(os.path.join(tpl, "chat_template.jinja"), "w") as f:
        f.write("{{ messages }}")
    for force, want in (("", {"reasoning_tags": False}),
                        ("legacy", {"function_calling": "legacy", "reasoning_tags": False})):
        out = subprocess.run(["bash", os.path.join(src, "deploy/open-webui/demo.sh"), "env",
                              "--data", os.path.join(TMP.name, "demo-env")],
                             env=dict(env, WKVM_MODEL_DIR=tpl, WKVM_FUNCTION_CALLING=force),
                             capture_output=True, text=True, timeout=60, check=True).stdout
        got = dict(line.split("=", 1) for line in out.splitlines())
        assert json.loads(got["DEFAULT_MODEL_PARAMS"]) == want, (force, got)


if __name__ == "__main__":
    rc = run_tests([test_compose_matches_demo, test_models_with_open_webui_headers,
                    test_three_turns_regenerate_edit_and_tasks_0_10_2,
                    test_three_turns_regenerate_edit_and_tasks_0_12_4,
                    test_regenerate_menu_0_10_2, test_regenerate_menu_0_12_4,
                    test_native_tools_0_12_4, test_socket_event_kinds,
                    test_try_again_and_next_turn_after_restart,
                    test_remote_worker_over_tcp])
    TMP.cleanup()
    sys.exit(rc)
