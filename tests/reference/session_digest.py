#!/usr/bin/env python3
"""Reference visible_parent_history_digest for parent-token-v1 (controld/session/ctl_session.h).

Prints one line per fixed conversation: "<name> <hex digest>". The digest is
SHA-256 of json.dumps(msgs, sort_keys=True, separators=(",", ":"),
ensure_ascii=False) encoded as UTF-8, where msgs is the turn's input messages
as [{"role", "content"}] with each content cleaned as the chat template
renders it, followed by {"role": "assistant", "content": visible(reply)}: the reply as a
client persists it, NUL removed (Open WebUI's sanitize_text_for_db) and
stripped.
tests/unit/test_ctl_session.c holds the same conversations and compares
ctl_session_history_digest() with these lines. Standard library only.
"""
import hashlib
import json
import re


def clean(text):
    """wk_chat_clean(): CRLF/CR -> LF, NUL dropped, runs of LF -> one, stripped."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    text = re.sub("\n\n+", "\n", text)
    return text.strip()


def digest(messages, reply):
    msgs = [{"role": m["role"], "content": clean(m["content"])} for m in messages]
    msgs.append({"role": "assistant", "content": reply.replace("\x00", "").strip()})
    blob = json.dumps(msgs, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


CASES = [
    ("basic", [{"role": "user", "content": "hi"}], " Hello\n"),
    (
        "unicode",
        [
            {"role": "system", "content": "You are\r\n\r\n\nhelpful.  "},
            {
                "role": "user",
                "content": "\u4f60\u597d \u201cq\u201d \"x\" \\ a/b\ttab \u00e9 \U0001F600"
                "\u2028end\x01",
            },
            {"role": "assistant", "content": "Prior\u00a0reply\n\n\nline"},
            {"role": "user", "content": "\u3000more\x00 <>&\u00a0"},
        ],
        "\u3000 R\u00e9\x00ponse <>&/ \u00a0\n",
    ),
    ("empty_reply", [{"role": "user", "content": "  "}], " \u2003 "),
]


def main():
    for name, messages, reply in CASES:
        print(name, digest(messages, reply))


if __name__ == "__main__":
    main()
