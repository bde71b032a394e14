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


# The RWKV World chat template wkvm renders (common/wk_chat.c): one-line
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
