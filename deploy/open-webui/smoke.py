#!/usr/bin/env python3
"""End-to-end smoke test of Open WebUI in front of wkvm, driven the way the
browser drives Open WebUI (src/lib/components/chat/Chat.svelte,
sendMessageSocket(); 0.10.2 and 0.12.4 are checked, see OPEN_WEBUI.md):

  1. sign up the first user (it becomes admin) or sign in again,
  2. list models (GET /api/models) and pick wkvm's,
  3. open the socket.io connection (/ws/socket.io, auth token, user-join),
  4. turn 1: POST /api/chat/completions with session_id, the assistant
     message id, parent_id null and the user message object; Open WebUI
     creates the chat, runs the completion as a background task against
     wkvm (streaming) and pushes `events` over the socket: the reply's
     deltas as `chat:completion` events (0.10.x) or as `response:completion`
     events of type `response.output_text.delta` (0.12.x), then one
     `chat:completion` with done; 0.12.x also sends `chat:title` (its data
     a plain string: the title) and `chat:active`,
  5. turns 2 and 3: same with chat_id and parent_id = the previous
     assistant id (0.12.x sends no `messages`: it loads the history from its
     database),
  6. "Try Again" on turn 3: the same user message again (same id and
     parent), a new assistant id; then "More Concise" the same way with
     regeneration_prompt (the browser's history is not sent: Open WebUI
     loads it from its database in both versions),
  7. after each step: the chat read back (GET /api/v1/chats/ID) and wkvm's
     /metrics.

Passes (exit 0) only when every reply streamed (several delta events before
done), every persisted reply is non-empty and hangs under its user message,
turns 2 and 3 were parent-bound continuation hits
(wkvm_parent_bound_continuation_hits_total +1 each), the regenerate was a
regenerate hit (wkvm_parent_bound_regenerate_hits_total +1), and
wkvm_reuse_hits_total grew by one for each of the three; then "More Concise"
on turn 3 (regeneration_prompt; 0.12.x also regeneration_message_id) must be
a parent_message_mismatch answered from a checkpoint (kind="checkpoint").

With --chat tools (or both): a chat with an Open WebUI tool offered under
native function calling instead (or after): the call, Open WebUI running
it, the answer, no error event (tool_chat(); docs/OPEN_WEBUI.md, "Tools and
native function calling").

Runs with the Open WebUI venv's python (aiohttp and python-socketio come with
Open WebUI). Usage:
  smoke.py --webui http://127.0.0.1:3000 --wkvm http://127.0.0.1:8000 --creds FILE
           [--chat reuse|tools|both]
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
from demo_common import (PARAMS, TOOL_FUNCTION, TOOL_ID, TOOL_PARAMS,  # noqa: E402
                         TOOL_RESULT, TOOL_TURNS, TURN3, TURNS, event_kind, install_tool,
                         is_delta, output_items, version_tuple)

TIMEOUT = 300  # seconds for one turn (the demo model on a CPU answers in about one)


def log(msg):
    print(f"smoke: {msg}", flush=True)


def metrics(text):
    """wkvm's reuse counters from its Prometheus text, by full series name."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(wkvm_(?:parent_bound_\w+|chat_exact_prefix_reuse_hits_total|"
                     r"prefix_tokens_reused_total|reuse_\w+))(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def total(c, name):
    """A counter summed over its labels."""
    return sum(v for k, v in c.items() if k == name or k.startswith(name + "{"))


class Smoke:
    def __init__(self, a):
        self.a = a
        self.http = None
        self.token = None
        self.version = (0,)
        self.events = {}   # message id -> list of event data ({type, data})
        self.other = []    # events without a message id
        self.done = {}     # message id -> asyncio.Event
        self.title = None  # the last chat:title seen
        self.params = PARAMS  # the chat controls the smoke sets
        self.sio = socketio.AsyncClient(reconnection=False)
        self.sio.on("events", self.on_event)

    async def on_event(self, payload):
        if not isinstance(payload, dict):
            self.other.append(payload)
            return
        mid = payload.get("message_id")
        data = payload.get("data")
        typ, inner = event_kind(data)
        if mid is None:
            self.other.append(data)
        self.events.setdefault(mid, []).append(data)
        if typ == "chat:title" and isinstance(inner, str):
            self.title = inner
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

    def body(self, model, chat_id, user_message, aid, first, suggestion=None, old=None,
             tool_ids=()):
        """The browser's POST /api/chat/completions body (Chat.svelte,
        sendMessageSocket()) for a chat kept on the server."""
        new12 = self.version >= (0, 11)
        params = dict(self.params)
        if new12:
            params["model_controls"] = {}  # 0.12.x: $settings.params.model_controls ?? {}
        body = {
            "stream": True,
            "model": model["id"],
            "params": params,
            "tool_servers": [],
            "features": {"voice": False, "image_generation": False, "code_interpreter": False,
                         "web_search": False},
            "variables": {"{{USER_NAME}}": "wkvm admin", "{{USER_LOCATION}}": "Unknown",
                          "{{CURRENT_DATETIME}}": time.strftime("%Y-%m-%d %H:%M:%S"),
                          "{{CURRENT_TIMEZONE}}": "UTC", "{{USER_LANGUAGE}}": "en-US"},
            "model_item": model,
            "session_id": self.sio.get_sid(namespace="/"),
            "id": aid,
            "parent_id": user_message["parentId"],
            "user_message": user_message,
            # What the browser asks for by default; the server-side config
            # (ENABLE_TITLE/TAGS/FOLLOW_UP_GENERATION=false) turns them off.
            "background_tasks": ({"title_generation": True, "tags_generation": True}
                                 if first else {}) | {"follow_up_generation": True},
        }
        if new12:
            body["tool_ids"] = list(tool_ids)
        if chat_id is not None:
            body["chat_id"] = chat_id
        if suggestion is not None:  # the regenerate menu's Add Details / More Concise
            body["regeneration_prompt"] = suggestion
            if new12:  # 0.12.x: the reply to revise goes to the model too
                body["regeneration_message_id"] = old
        return body

    async def ask(self, model, chat_id, user_message, first=False, suggestion=None, old=None,
                  tool_ids=()):
        """One completion for user_message under a new assistant id; returns
        (chat id, assistant id, persisted reply, the chat read back)."""
        aid = str(uuid.uuid4())
        user_message["childrenIds"] = user_message.get("childrenIds", []) + [aid]
        self.done[aid] = asyncio.Event()
        t0 = time.time()
        res = await self.req("POST", "/api/chat/completions",
                             self.body(model, chat_id, user_message, aid, first, suggestion, old,
                                       tool_ids))
        if not isinstance(res, dict) or not res.get("status") or not res.get("chat_id"):
            raise SystemExit(f"smoke: FAIL chat completion was not accepted: {res}")
        chat_id = res["chat_id"]
        try:
            await asyncio.wait_for(self.done[aid].wait(), TIMEOUT)
        except asyncio.TimeoutError:
            raise SystemExit(f"smoke: FAIL no completion for message {aid} in {TIMEOUT}s")
        evs = self.events.get(aid, [])
        errs = []
        kinds = {}
        for e in evs:
            typ, inner = event_kind(e)
            kinds.setdefault(typ, 0)
            kinds[typ] += 1
            if typ == "chat:message:error" or (isinstance(inner, dict) and inner.get("error")):
                errs.append(e)
        if errs:
            raise SystemExit(f"smoke: FAIL Open WebUI reported an error: {errs[0]}")
        deltas = {}
        for e in evs:
            typ, inner = event_kind(e)
            if is_delta(typ, inner):
                deltas[typ] = deltas.get(typ, 0) + 1
        # Read the chat back as the browser does when it reopens it.
        chat = (await self.req("GET", f"/api/v1/chats/{chat_id}"))["chat"]
        msgs = chat["history"]["messages"]
        a = msgs.get(aid) or {}
        reply = a.get("content") or ""
        if not reply and a.get("output"):
            reply = "\n".join(p.get("text", "") for item in a["output"] if item.get("type") == "message"
                              for p in item.get("content", []) if p.get("type") == "output_text")
        log(f"  {sum(deltas.values())} delta events {deltas}, events {kinds}, "
            f"{time.time() - t0:.1f}s, done={a.get('done')}")
        log(f"  user      {user_message['content']!r}")
        log(f"  assistant {reply!r}")
        if sum(deltas.values()) < 2:
            raise SystemExit(f"smoke: FAIL the reply did not stream (delta events {deltas}, "
                             f"all events {kinds})")
        if not a.get("done") or not reply.strip():
            raise SystemExit(f"smoke: FAIL the persisted reply is empty or not done: {a}")
        if msgs.get(user_message["id"], {}).get("parentId") != user_message["parentId"] or \
                a.get("parentId") != user_message["id"]:
            raise SystemExit("smoke: FAIL the persisted message tree is not user -> assistant")
        return chat_id, aid, reply, chat

    async def run(self):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as http:
            self.http = http
            cfg = await self.req("GET", "/api/config")
            self.version = version_tuple(cfg.get("version"))
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
                if self.a.chat in ("reuse", "both"):
                    await self.chat(model)
                if self.a.chat in ("tools", "both"):
                    await self.tool_chat(model)
            finally:
                await self.sio.disconnect()

    async def tool_chat(self, model):
        """A chat with the smoke tool offered (tool_ids, native function
        calling: Open WebUI sends the tool, its builtin ones too, in `tools`):
        turn 1 asks for the smoke clock (the filter names the tool in
        tool_choice, wkvm constrains the model to call it), Open WebUI runs
        the tool and sends its result back in the same turn, the model
        answers; turn 2 is a plain question in the same chat, the tool still
        offered. Passes when each turn finished without an error event, turn
        1's persisted output is the call (completed), its result and a
        non-empty answer after it, and turn 2 has an answer and no call."""
        if self.version < (0, 12):
            raise SystemExit("smoke: FAIL the tool chat needs Open WebUI 0.12 or newer (the "
                             "filter's request hook runs on the tool loop's follow-ups)")
        did = await asyncio.to_thread(install_tool, self.a.webui, self.token)
        self.params = TOOL_PARAMS
        log(f"tool chat: created through Open WebUI's API: {', '.join(did)}")
        start = metrics(await self.req("GET", "/metrics", base=self.a.wkvm))
        u1 = self.user_message(model, None, TOOL_TURNS[0])
        chat_id, a1, d1, chat = await self.step("tool turn 1", model, None, u1, first=True,
                                                tool_ids=[TOOL_ID])
        msg = chat["history"]["messages"][a1]
        items = output_items(msg)
        calls, outs = items.get("function_call", []), items.get("function_call_output", [])
        summary = [(i.get("type"), i.get("name") or i.get("status")) for i in msg.get("output") or []]
        log(f"  output items: {summary}")
        fails = []
        if len(calls) != 1 or calls[0].get("name") != TOOL_FUNCTION:
            fails.append(f"turn 1: expected one call to {TOOL_FUNCTION}, got "
                         f"{[(c.get('name'), c.get('arguments')) for c in calls]}")
        elif calls[0].get("status") != "completed":
            fails.append(f"turn 1: the call's status is {calls[0].get('status')!r}")
        text = "".join(p.get("text", "") for o in outs for p in o.get("output") or []
                       if isinstance(p, dict))
        if len(outs) != 1 or TOOL_RESULT not in text:
            fails.append(f"turn 1: the tool's result is not in the output: {outs}")
        else:
            log(f"  tool {calls[0].get('name')}({calls[0].get('arguments')}) -> {text!r}")
        order = [i.get("type") for i in msg.get("output") or []]
        answer = [i for i in (msg.get("output") or [])[order.index("function_call_output") + 1:]
                  if i.get("type") == "message"] if "function_call_output" in order else []
        answer_text = "".join(p.get("text", "") for i in answer for p in i.get("content", []))
        if not answer_text.strip():
            fails.append(f"turn 1: no answer after the tool's result (output {order})")
        u2 = self.user_message(model, a1, TOOL_TURNS[1])
        _, a2, d2, chat = await self.step("tool turn 2", model, chat_id, u2, tool_ids=[TOOL_ID])
        items2 = output_items(chat["history"]["messages"][a2])
        if items2.get("function_call"):
            fails.append(f"turn 2: unexpected call {items2['function_call']}")
        end = metrics(await self.req("GET", "/metrics", base=self.a.wkvm))
        whole = {k: v - start.get(k, 0) for k, v in end.items() if v != start.get(k, 0)}
        log(f"wkvm counters during the tool chat: {json.dumps(whole, sort_keys=True)}")
        if fails:
            raise SystemExit("smoke: FAIL " + "; ".join(fails))
        log("tool chat PASS")

    def user_message(self, model, parent, text):
        return {"id": str(uuid.uuid4()), "parentId": parent, "childrenIds": [], "role": "user",
                "content": text, "timestamp": int(time.time()), "models": [model["id"]]}

    async def step(self, name, model, chat_id, um, first=False, suggestion=None, old=None,
                   tool_ids=()):
        before = metrics(await self.req("GET", "/metrics", base=self.a.wkvm))
        log(f"{name}:")
        chat_id, aid, reply, chat = await self.ask(model, chat_id, um, first, suggestion, old,
                                                   tool_ids)
        after = metrics(await self.req("GET", "/metrics", base=self.a.wkvm))
        diff = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        log(f"  wkvm counters: {json.dumps(diff, sort_keys=True)}")
        return chat_id, aid, diff, chat

    async def chat(self, model):
        """Turns 1-3 and Try Again on turn 3, each judged by wkvm's counters."""
        start = metrics(await self.req("GET", "/metrics", base=self.a.wkvm))
        u1 = self.user_message(model, None, TURNS[0])
        chat_id, a1, d1, chat = await self.step("turn 1", model, None, u1, first=True)
        log(f"chat {chat_id} created by Open WebUI, title {chat.get('title')!r}"
            + (f" (chat:title event {self.title!r})" if self.title is not None else ""))
        u2 = self.user_message(model, a1, TURNS[1])
        _, a2, d2, _ = await self.step("turn 2", model, chat_id, u2)
        u3 = self.user_message(model, a2, TURN3)
        _, a3, d3, _ = await self.step("turn 3", model, chat_id, u3)
        # "Try Again": regenerateResponse() sends the same user message (id,
        # parentId) with a new assistant id; Open WebUI answers it from the
        # history up to that user message.
        _, a3b, dr, chat = await self.step("Try Again on turn 3", model, chat_id, u3)
        # "More Concise": regenerateResponse(message, "More Concise"); Open
        # WebUI adds the suggestion as one more user message (0.12.x after
        # the reply being revised), wkvm resumes the longest checkpoint.
        _, a3c, dc, chat = await self.step("More Concise on turn 3", model, chat_id, u3,
                                           suggestion="More Concise", old=a3b)
        end = metrics(await self.req("GET", "/metrics", base=self.a.wkvm))
        msgs = chat["history"]["messages"]
        if sorted(msgs.get(u3["id"], {}).get("childrenIds", [])) != sorted([a3, a3b, a3c]):
            raise SystemExit(f"smoke: FAIL the regenerated reply is not a sibling of turn 3's: "
                             f"{msgs.get(u3['id'])}")
        fails = []
        reuse = {}
        for name, d, key in (("turn 2", d2, "wkvm_parent_bound_continuation_hits_total"),
                             ("turn 3", d3, "wkvm_parent_bound_continuation_hits_total"),
                             ("Try Again", dr, "wkvm_parent_bound_regenerate_hits_total")):
            reuse[name] = total(d, "wkvm_reuse_hits_total")
            if d.get(key, 0) != 1 or reuse[name] != 1:
                rej = {k: v for k, v in d.items() if "rejections" in k or "misses" in k}
                fails.append(f"{name}: {key} +{d.get(key, 0):g}, wkvm_reuse_hits_total "
                             f"+{reuse[name]:g} (misses/rejections: {rej})")
        mc = 'wkvm_parent_bound_continuation_rejections_total{reason="parent_message_mismatch"}'
        ck = 'wkvm_reuse_hits_total{kind="checkpoint"}'
        if dc.get(mc, 0) != 1 or dc.get(ck, 0) != 1:
            fails.append(f"More Concise: {mc} +{dc.get(mc, 0):g}, {ck} +{dc.get(ck, 0):g}")
        if total(d1, "wkvm_parent_bound_continuation_hits_total"):
            fails.append("turn 1 counted as a continuation hit")
        whole = {k: v - start.get(k, 0) for k, v in end.items() if v != start.get(k, 0)}
        log(f"wkvm counters during the smoke: {json.dumps(whole, sort_keys=True)}")
        log(f"hits: turn 2 {reuse['turn 2']:g}, turn 3 {reuse['turn 3']:g}, Try Again "
            f"{reuse['Try Again']:g} (wkvm_reuse_hits_total by kind: "
            f"{ {k[len('wkvm_reuse_hits_total'):]: v for k, v in whole.items() if k.startswith('wkvm_reuse_hits_total')} }); "
            f"tokens reused {whole.get('wkvm_prefix_tokens_reused_total', 0):g}")
        if fails:
            raise SystemExit("smoke: FAIL " + "; ".join(fails) +
                             "; see docs/OPEN_WEBUI.md, troubleshooting")
        log("PASS")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--webui", required=True)
    ap.add_argument("--wkvm", required=True)
    ap.add_argument("--creds", required=True)
    ap.add_argument("--chat", choices=("reuse", "tools", "both"), default="reuse",
                    help="reuse: the three-turn chat with Try Again and More Concise (the "
                    "default); tools: a chat with a tool offered, native function calling "
                    "(Open WebUI 0.12+, a model with its own template); both")
    a = ap.parse_args()
    asyncio.run(Smoke(a).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
