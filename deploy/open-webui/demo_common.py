"""Constants and helpers shared by the Open WebUI demo helper's scripts (smoke.py runs in
the Open WebUI venv, pick_demo_model.py with the system python3)."""
import re

# The conversation smoke.py drives through Open WebUI. The chat-control
# parameters are what a user sets in Open WebUI's "Chat Controls > Advanced
# Params": greedy decoding and a bounded reply, so the run is deterministic.
TURNS = [
    "Hello! What is a state slot?",
    "And how does a chat continue from one?",
]
# smoke.py's third turn (its reply is then regenerated with "Try Again");
# not part of the demo model's pick: reuse does not depend on reply bytes.
TURN3 = "Thanks. One more: what does a regenerate reuse?"
PARAMS = {"temperature": 0, "max_tokens": 48}

# Open WebUI's socket events (the `events` message's data: {"type", "data"}),
# as smoke.py reads them; tests/integration/test_openwebui_shape.py checks
# these against both versions' event sequences.
def version_tuple(v):
    return tuple(int(x) for x in re.findall(r"\d+", v or "0")[:3])


def event_kind(data):
    """(type, inner data) of one socket event's data; inner is whatever the
    event carries: a dict for completions, a plain string for chat:title."""
    if not isinstance(data, dict):
        return None, data
    return data.get("type"), data.get("data")


def is_delta(typ, inner):
    """A streamed piece of the reply: 0.10.x sends chat:completion with the
    content so far, 0.12.x response:completion with a Responses-API delta."""
    if not isinstance(inner, dict):
        return False
    if typ == "chat:completion":
        return not inner.get("done") and not inner.get("error") and (
            "content" in inner or "output" in inner or "choices" in inner)
    if typ == "response:completion":
        return str(inner.get("type", "")).endswith(".delta")
    return False


# The RWKV World chat template wkvm renders (common/text/wk_chat.c): one-line
# messages need no cleaning beyond strip().
ROLE = {"system": "System", "user": "User", "assistant": "Assistant"}


def render(msgs):
    out = ""
    for m in msgs:
        out += ROLE[m["role"]] + ": " + m["content"].strip() + "\n\n"
    return out + "Assistant:"


def clean_reply(text):
    """True when a reply round-trips through Open WebUI's persistence and the
    template exactly, as a trained chat model's replies do: it starts with one
    space (the template renders "Assistant: " + reply), has no other outer
    whitespace (Open WebUI stores reply.strip()), no line breaks (the
    template cleans blank-line runs), and is valid UTF-8 (checked by the
    caller's strict decode)."""
    body = text[1:]
    return (text.startswith(" ") and body != "" and body == body.strip()
            and not any(c in text for c in "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\ufffd"))


# ---------------------------------------------------------------- tools
# The tool chat (native function calling, Open WebUI's default in 0.12):
# an Open WebUI tool the smokes create through Open WebUI's API and offer
# in a chat, and a filter that stands in for a model deciding to call it.
TOOL_ID = "wkvm_smoke"
TOOL_FUNCTION = "wkvm_smoke_clock"
TOOL_RESULT = "The wkvm smoke clock shows 12:34."
# (a forced call to the smoke tool is about 63 tokens of this vocabulary's bytes)
TOOL_PARAMS = {"temperature": 0, "max_tokens": 128}
TOOL_TURNS = ["What time does the wkvm smoke clock show?",
              "Thanks! And what is a state slot?"]
TOOL_SOURCE = f'''"""
title: wkvm smoke clock
description: A fixed answer, so that wkvm's Open WebUI smoke can check a tool round trip.
"""


class Tools:
    def __init__(self):
        pass

    def {TOOL_FUNCTION}(self) -> str:
        """
        Read the wkvm smoke clock: call it when asked what the wkvm smoke clock shows.
        """
        return {TOOL_RESULT!r}
'''
FILTER_ID = "wkvm_smoke_tool_choice"
# A random-weight model never decides to call a tool. This filter's
# `request` hook (Open WebUI 0.11+ runs it on every upstream request of a
# turn, the tool loop's follow-ups included) asks for the smoke tool by
# name (tool_choice; wkvm enforces it by constrained decoding) when the
# last message is a user message that asks for the smoke clock, and
# removes that again from every other request (the follow-up carries the
# tool result and must be answered, not called again). In a chat that
# offers the smoke tool it also turns the template's thinking off
# (chat_template_kwargs enable_thinking false): a random-weight model
# never closes its <think> block, so it would never reach the call. Nothing
# else in the request is changed: the tools Open WebUI offers, its builtin
# ones included, stay as they are.
FILTER_SOURCE = f'''"""
title: wkvm smoke tool choice
description: Stands in for a model deciding to call the wkvm smoke clock (wkvm's Open WebUI smoke).
"""


class Filter:
    def __init__(self):
        pass

    def request(self, body: dict) -> dict:
        msgs = body.get("messages") or []
        last = msgs[-1] if msgs else {{}}
        names = [t.get("function", {{}}).get("name") for t in body.get("tools") or []]
        if {TOOL_FUNCTION!r} not in names:
            return body
        # a random-weight model never closes a <think> block: no thinking in this chat
        body["chat_template_kwargs"] = dict(body.get("chat_template_kwargs") or {{}},
                                            enable_thinking=False)
        if last.get("role") == "user" and "smoke clock" in str(last.get("content")):
            body["tool_choice"] = {{"type": "function", "function": {{"name": {TOOL_FUNCTION!r}}}}}
            body["parallel_tool_calls"] = False
        elif body.get("tool_choice") == {{"type": "function",
                                           "function": {{"name": {TOOL_FUNCTION!r}}}}}:
            body.pop("tool_choice", None)
            body.pop("parallel_tool_calls", None)
        return body
'''


def install_tool(webui, token):
    """Creates (or updates) the smoke tool and the tool-choice filter through
    Open WebUI's API (admin token) and makes the filter active and global.
    Returns a list of what it did."""
    import json
    import urllib.error
    import urllib.request

    def call(method, path, body=None):
        req = urllib.request.Request(webui + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    did = []
    tool = {"id": TOOL_ID, "name": "wkvm smoke clock", "content": TOOL_SOURCE,
            "meta": {"description": "wkvm's Open WebUI smoke: a fixed answer"}}
    st, _ = call("GET", f"/api/v1/tools/id/{TOOL_ID}")
    st, res = call("POST", f"/api/v1/tools/id/{TOOL_ID}/update" if st == 200
                   else "/api/v1/tools/create", tool)
    if st != 200:
        raise RuntimeError(f"could not create the tool {TOOL_ID}: HTTP {st}: {str(res)[:300]}")
    did.append(f"tool {TOOL_ID} ({TOOL_FUNCTION})")
    fn = {"id": FILTER_ID, "name": "wkvm smoke tool choice", "content": FILTER_SOURCE,
          "meta": {"description": "wkvm's Open WebUI smoke: asks for the smoke tool by name"}}
    st, _ = call("GET", f"/api/v1/functions/id/{FILTER_ID}")
    st, res = call("POST", f"/api/v1/functions/id/{FILTER_ID}/update" if st == 200
                   else "/api/v1/functions/create", fn)
    if st != 200:
        raise RuntimeError(f"could not create the filter {FILTER_ID}: HTTP {st}: {str(res)[:300]}")
    st, res = call("GET", f"/api/v1/functions/id/{FILTER_ID}")
    if not res.get("is_active"):
        call("POST", f"/api/v1/functions/id/{FILTER_ID}/toggle")
    if not res.get("is_global"):
        call("POST", f"/api/v1/functions/id/{FILTER_ID}/toggle/global")
    st, res = call("GET", f"/api/v1/functions/id/{FILTER_ID}")
    if not (res.get("is_active") and res.get("is_global")):
        raise RuntimeError(f"the filter {FILTER_ID} is not active and global: {res}")
    did.append(f"filter {FILTER_ID} (active, global)")
    return did


def output_items(message):
    """A persisted 0.12.x assistant message's output items by type."""
    out = {}
    for item in message.get("output") or []:
        out.setdefault(item.get("type"), []).append(item)
    return out
