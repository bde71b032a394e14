#!/usr/bin/env python3
"""End-to-end smoke test of Open WebUI in front of wkvm, driven the way the
browser drives Open WebUI 0.10.x (src/lib/components/chat/Chat.svelte,
sendMessageSocket()):

  1. sign up the first user (it becomes admin) or sign in again,
  2. list models (GET /api/models) and pick wkvm's,
  3. open the socket.io connection (/ws/socket.io, auth token, user-join),
  4. turn 1: POST /api/chat/completions with session_id, the assistant
     message id, parent_id null and the user message object; Open WebUI
     creates the chat, runs the completion as a background task against
     wkvm (streaming) and pushes `events` (chat:completion deltas) over the
     socket,
  5. turn 2: same with chat_id and parent_id = turn 1's assistant id,
  6. read the chat back (GET /api/v1/chats/ID) and check the persisted
     messages, and read wkvm's /metrics.

Passes (exit 0) only when both replies streamed (several chat:completion
events before done), both persisted replies are non-empty, the message tree
is u1 -> a1 -> u2 -> a2, and wkvm counted turn 2 as a parent-bound
continuation hit (wkvm_parent_bound_continuation_hits_total grew by >= 1).

Runs with the Open WebUI venv's python (aiohttp and python-socketio come with
Open WebUI). Usage:
  smoke.py --webui http://127.0.0.1:3000 --wkvm http://127.0.0.1:8000 --creds FILE
"""
import argparse
import asyncio
import json
import os
import re
import secrets
import sys
import time
import uuid

import aiohttp
import socketio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from demo_common import PARAMS, TURNS  # noqa: E402

TIMEOUT = 300  # seconds for one turn (the demo model on a CPU answers in about one)


def log(msg):
    print(f"smoke: {msg}", flush=True)


def metrics(text):
    """The parent-token-v1 counters from wkvm's Prometheus text."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(wkvm_(?:parent_bound_\w+|chat_exact_prefix_reuse_hits_total|"
                     r"prefix_tokens_reused_total))(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


class Smoke:
    def __init__(self, a):
        self.a = a
        self.http = None
        self.token = None
        self.events = {}   # message id -> list of event payloads (data)
        self.done = {}     # message id -> asyncio.Event
        self.sio = socketio.AsyncClient(reconnection=False)
        self.sio.on("events", self.on_event)

    async def on_event(self, payload):
        mid = payload.get("message_id")
        data = payload.get("data") or {}
        self.events.setdefault(mid, []).append(data)
        typ = data.get("type")
        inner = data.get("data") or {}
        if typ == "chat:completion" and isinstance(inner, dict) and (inner.get("done") or inner.get("error")):
            self.done.setdefault(mid, asyncio.Event()).set()
        if typ in ("chat:message:error", "chat:tasks:cancel"):
            self.done.setdefault(mid, asyncio.Event()).set()

    def hdrs(self):
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def req(self, method, path, body=None, base=None, expect=200):
        url = (base or self.a.webui) + path
        async with self.http.request(method, url, json=body, headers=self.hdrs()) as r:
            text = await r.text()
            if expect is not None and r.status != expect:
                raise SystemExit(f"smoke: FAIL {method} {path}: HTTP {r.status}: {text[:500]}")
            try:
                return json.loads(text)
            except ValueError:
                return text

    async def login(self):
        creds = None
        if os.path.exists(self.a.creds):
            with open(self.a.creds) as f:
                creds = json.load(f)
            async with self.http.post(self.a.webui + "/api/v1/auths/signin",
                                      json={"email": creds["email"], "password": creds["password"]}) as r:
                if r.status == 200:
                    self.token = (await r.json())["token"]
                    log(f"signed in as {creds['email']}")
                    return
                log(f"sign-in with saved credentials failed (HTTP {r.status}); signing up")
        creds = {"name": "wkvm admin", "email": "admin@wkvm.localhost",
                 "password": secrets.token_urlsafe(18)}
        async with self.http.post(self.a.webui + "/api/v1/auths/signup", json=creds) as r:
            text = await r.text()
            if r.status != 200:
                raise SystemExit(f"smoke: FAIL sign-up: HTTP {r.status}: {text[:300]} (an admin "
                                 f"exists already and {self.a.creds} does not hold its password: "
                                 f"run `demo.sh stop`, remove the data dir's open-webui/ and start again)")
            j = json.loads(text)
        fd = os.open(self.a.creds, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(creds, f)
        self.token = j["token"]
        log(f"signed up the first user {creds['email']} (role {j.get('role')}); "
            f"credentials in {self.a.creds}")
        if j.get("role") != "admin":
            raise SystemExit("smoke: FAIL the first user is not admin")

    async def turn(self, model, chat_id, parent_id, text, history):
        uid, aid = str(uuid.uuid4()), str(uuid.uuid4())
        user_message = {"id": uid, "parentId": parent_id, "childrenIds": [aid], "role": "user",
                        "content": text, "timestamp": int(time.time()), "models": [model["id"]]}
        body = {
            "stream": True,
            "model": model["id"],
            "params": dict(PARAMS),
            "tool_servers": [],
            "features": {"voice": False, "image_generation": False, "code_interpreter": False,
                         "web_search": False},
            "variables": {"{{USER_NAME}}": "wkvm admin", "{{USER_LOCATION}}": "Unknown",
                          "{{CURRENT_DATETIME}}": time.strftime("%Y-%m-%d %H:%M:%S"),
                          "{{CURRENT_TIMEZONE}}": "UTC", "{{USER_LANGUAGE}}": "en-US"},
            "model_item": model,
            "session_id": self.sio.get_sid(namespace="/"),
            "id": aid,
            "parent_id": parent_id,
            "user_message": user_message,
            # What the browser asks for by default; the server-side config
            # (ENABLE_TITLE/TAGS/FOLLOW_UP_GENERATION=false) turns them off.
            "background_tasks": ({"title_generation": True, "tags_generation": True}
                                 if chat_id is None else {}) | {"follow_up_generation": True},
        }
        if chat_id is not None:
            body["chat_id"] = chat_id
        self.done[aid] = asyncio.Event()
        t0 = time.time()
        res = await self.req("POST", "/api/chat/completions", body)
        if not isinstance(res, dict) or not res.get("status") or not res.get("chat_id"):
            raise SystemExit(f"smoke: FAIL chat completion was not accepted: {res}")
        chat_id = res["chat_id"]
        try:
            await asyncio.wait_for(self.done[aid].wait(), TIMEOUT)
        except asyncio.TimeoutError:
            raise SystemExit(f"smoke: FAIL no completion for message {aid} in {TIMEOUT}s")
        evs = [e for e in self.events.get(aid, []) if e.get("type") == "chat:completion"]
        errs = [e for e in self.events.get(aid, [])
                if e.get("type") == "chat:message:error" or (e.get("data") or {}).get("error")]
        if errs:
            raise SystemExit(f"smoke: FAIL Open WebUI reported an error: {errs[0]}")
        deltas = [e for e in evs if not (e.get("data") or {}).get("done")]
        # Read the chat back as the browser does when it reopens it.
        chat = (await self.req("GET", f"/api/v1/chats/{chat_id}"))["chat"]
        msgs = chat["history"]["messages"]
        a = msgs.get(aid) or {}
        reply = a.get("content") or ""
        if not reply and a.get("output"):
            reply = "\n".join(p.get("text", "") for item in a["output"] if item.get("type") == "message"
                              for p in item.get("content", []) if p.get("type") == "output_text")
        log(f"turn {len(history) // 2 + 1}: {len(deltas)} streamed chat:completion events, "
            f"{time.time() - t0:.1f}s, done={a.get('done')}")
        log(f"  user      {text!r}")
        log(f"  assistant {reply!r}")
        if len(deltas) < 2:
            raise SystemExit(f"smoke: FAIL the reply did not stream ({len(deltas)} delta events)")
        if not a.get("done") or not reply.strip():
            raise SystemExit(f"smoke: FAIL the persisted reply is empty or not done: {a}")
        if msgs.get(uid, {}).get("parentId") != parent_id or a.get("parentId") != uid:
            raise SystemExit("smoke: FAIL the persisted message tree is not user -> assistant")
        history += [user_message, a]
        return chat_id, aid

    async def run(self):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as http:
            self.http = http
            cfg = await self.req("GET", "/api/config")
            log(f"Open WebUI {cfg.get('version')} at {self.a.webui}")
            wk_models = (await self.req("GET", "/v1/models", base=self.a.wkvm))["data"]
            want = wk_models[0]["id"]
            await self.login()
            models = (await self.req("GET", "/api/models"))["data"]
            model = next((m for m in models if m["id"] == want), None)
            if model is None:
                raise SystemExit(f"smoke: FAIL Open WebUI does not list wkvm's model {want!r} "
                                 f"(it lists {[m['id'] for m in models]}); check OPENAI_API_BASE_URLS")
            log(f"model {want!r} listed by Open WebUI (owned_by {model.get('owned_by')})")
            await self.sio.connect(self.a.webui, socketio_path="/ws/socket.io",
                                   transports=["websocket"], auth={"token": self.token})
            try:
                await self.sio.emit("user-join", {"auth": {"token": self.token}})
                await self.chat(model)
            finally:
                await self.sio.disconnect()

    async def chat(self, model):
        """Turns 1 and 2, then the verdict from wkvm's counters."""
        before = metrics(await self.req("GET", "/metrics", base=self.a.wkvm))
        history = []
        chat_id, a1 = await self.turn(model, None, None, TURNS[0], history)
        log(f"chat {chat_id} created by Open WebUI")
        mid = metrics(await self.req("GET", "/metrics", base=self.a.wkvm))
        await self.turn(model, chat_id, a1, TURNS[1], history)
        after = metrics(await self.req("GET", "/metrics", base=self.a.wkvm))
        diff = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        log(f"wkvm counters during the smoke: {json.dumps(diff, sort_keys=True)}")
        hits1 = mid.get("wkvm_parent_bound_continuation_hits_total", 0) - \
            before.get("wkvm_parent_bound_continuation_hits_total", 0)
        hits2 = after.get("wkvm_parent_bound_continuation_hits_total", 0) - \
            mid.get("wkvm_parent_bound_continuation_hits_total", 0)
        total = after.get("wkvm_parent_bound_continuation_hits_total", 0)
        if hits2 < 1:
            rej = {k: v for k, v in diff.items() if "rejections" in k or "misses" in k}
            raise SystemExit(f"smoke: FAIL turn 2 was not a parent-bound continuation hit "
                             f"(misses/rejections: {rej}); see docs/OPEN_WEBUI.md, troubleshooting")
        log(f"turn 1 hits {hits1:g} (a first turn is never a hit), turn 2 hits {hits2:g}; "
            f"wkvm_parent_bound_continuation_hits_total = {total:g}")
        log("PASS")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--webui", required=True)
    ap.add_argument("--wkvm", required=True)
    ap.add_argument("--creds", required=True)
    a = ap.parse_args()
    asyncio.run(Smoke(a).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
