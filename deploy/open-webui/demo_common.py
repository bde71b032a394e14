"""Constants shared by the Open WebUI demo helper's scripts (smoke.py runs in
the Open WebUI venv, pick_demo_model.py with the system python3)."""

# The conversation smoke.py drives through Open WebUI. The chat-control
# parameters are what a user sets in Open WebUI's "Chat Controls > Advanced
# Params": greedy decoding and a bounded reply, so the run is deterministic.
TURNS = [
    "Hello! What is a state slot?",
    "And how does a chat continue from one?",
]
PARAMS = {"temperature": 0, "max_tokens": 48}

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
