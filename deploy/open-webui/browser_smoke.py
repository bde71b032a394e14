#!/usr/bin/env python3
"""Open WebUI in a real browser in front of wkvm: Debian's chromium, driven
by the playwright Python package (executable_path set: playwright's own
browser download is never used).

  1. open Open WebUI, click through its onboarding, sign up the first user
     (it becomes admin) or sign in with the smoke's saved credentials,
  2. pick wkvm's model in the model picker (above the chat in 0.10.x,
     inside the message box in 0.12.x),
  3. chat three turns with Open WebUI's default settings (no chat controls
     touched: temperature, max_tokens and the rest are wkvm's defaults),
  4. open the reply's regenerate menu and click "Try Again",
  5. after every step read the chat back through Open WebUI's API (with the
     browser's own login token) and wkvm's /metrics,
  6. save a screenshot after every step to --out.

With --chat tools (or both), a chat with the smoke tool switched on in the
message box's Integrations menu instead (or first): native function
calling, the call's round trip and answers, no error toast (every toast the
page shows is recorded); see docs/OPEN_WEBUI.md, "Tools and native function
calling".

Passes (exit 0) only when every reply was persisted non-empty, turns 2 and
3 were parent-bound continuation hits and the regenerate a regenerate hit
(wkvm_parent_bound_*_hits_total +1 each), and wkvm_reuse_hits_total grew by
one for each of the three. Run by `deploy/open-webui/demo.sh browser-smoke`
with the Open WebUI venv's python (playwright installed there). Usage:
  browser_smoke.py --webui URL --wkvm URL --creds FILE --chromium PATH --out DIR
                   [--chat reuse|tools|both]
"""
import argparse
import json
import os
import re
import secrets
import sys
import time
import urllib.request

from playwright.sync_api import TimeoutError as PwTimeout
from playwright.sync_api import sync_playwright

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from demo_common import (TOOL_FUNCTION, TOOL_RESULT, TOOL_TURNS, install_tool,  # noqa: E402
                         output_items)

TURN_TIMEOUT = 600  # seconds: a default reply is up to 1024 tokens on a CPU
TEXTS = ["Hello! What is a state slot?",
         "And how does a chat continue from one?",
         "Thanks. One more: what does a regenerate reuse?"]


# Every toast Open WebUI shows (svelte-sonner's li[data-sonner-toast], with
# data-type "error" for errors), recorded as it appears: toasts vanish after
# a few seconds, so the page keeps a list the smoke reads after each step.
TOAST_WATCH = """
window.__wkvmToasts = [];
const seen = new WeakSet();
const scan = () => document.querySelectorAll('[data-sonner-toast]').forEach((el) => {
  if (seen.has(el)) return;
  seen.add(el);
  window.__wkvmToasts.push({type: el.getAttribute('data-type') || '',
                            text: (el.innerText || '').slice(0, 300)});
});
new MutationObserver(scan).observe(document, {childList: true, subtree: true});
"""


def log(msg):
    print(f"browser-smoke: {msg}", flush=True)


def fail(msg):
    raise SystemExit(f"browser-smoke: FAIL {msg}")


def get(url, token=None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def metrics(wkvm):
    out = {}
    for line in get(wkvm + "/metrics").splitlines():
        m = re.match(r"^(wkvm_(?:parent_bound_\w+|reuse_\w+|prefix_tokens_reused_total))"
                     r"(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def total(c, name):
    return sum(v for k, v in c.items() if k == name or k.startswith(name + "{"))


class Browser:
    def __init__(self, a, page):
        self.a, self.page = a, page
        self.shots = []
        self.seen = set()  # assistant message ids already judged
        self.cid = None  # the chat this run created
        self.old_chats = set()  # the user's chats before it
        self.all_toasts = []  # every toast seen (type, text)

    def shot(self, name):
        path = os.path.join(self.a.out, f"{len(self.shots) + 1:02d}-{name}.png")
        self.page.screenshot(path=path, full_page=False)
        self.shots.append(path)
        log(f"  screenshot {path}")

    def click_if(self, locator, timeout=1500):
        try:
            locator.first.wait_for(state="visible", timeout=timeout)
        except PwTimeout:
            return False
        locator.first.click()
        return True

    def dismiss(self):
        """Modals Open WebUI shows a new user: the changelog ("Okay, Let's Go!")."""
        p = self.page
        self.click_if(p.get_by_role("button", name=re.compile(r"Okay, Let'?s Go", re.I)))

    def login(self):
        p, a = self.page, self.a
        p.goto(a.webui + "/auth", wait_until="domcontentloaded")
        p.wait_for_selector("#password, [aria-label='Get started']", timeout=120000)
        if self.click_if(p.locator("[aria-label='Get started']")):
            log("onboarding: clicked Get started")
        p.wait_for_selector("#password", timeout=60000)
        creds = None
        if os.path.exists(a.creds):
            with open(a.creds) as f:
                creds = json.load(f)
        signup = p.locator("#name").count() > 0
        if signup:
            if creds is None:
                creds = {"name": "wkvm admin", "email": "admin@wkvm.localhost",
                         "password": secrets.token_urlsafe(18)}
            p.fill("#name", creds["name"])
        elif creds is None:
            fail(f"Open WebUI has users already and {a.creds} holds no credentials")
        p.fill("#email", creds["email"])
        p.fill("#password", creds["password"])
        if p.locator("#confirm-password").count():
            p.fill("#confirm-password", creds["password"])
        self.shot("auth")
        p.locator("button[type=submit]").last.click()
        p.wait_for_selector("#chat-input", timeout=120000)
        if signup and not os.path.exists(a.creds):
            fd = os.open(a.creds, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(creds, f)
        log(f"{'signed up' if signup else 'signed in'} as {creds['email']}")
        self.dismiss()

    def token(self):
        return self.page.evaluate("() => localStorage.token")

    def pick_model(self, model):
        p = self.page
        button = p.locator("[id^='model-selector-'][id$='-button']").first
        button.wait_for(state="visible", timeout=60000)
        button.click()
        opt = p.locator(f"button[role=option][aria-label='Select {model} model']")
        if opt.count() == 0:
            opt = p.get_by_role("option", name=re.compile(re.escape(model)))
        opt.first.wait_for(state="visible", timeout=30000)
        self.shot("model-picker")
        opt.first.click()
        time.sleep(0.5)
        label = button.get_attribute("aria-label") or button.inner_text()
        log(f"model picker: {label!r}")
        if model not in label:
            fail(f"the model picker does not show {model!r} after picking it ({label!r})")

    def chat_ids(self, token):
        """The user's chats, most recently updated first."""
        return [c["id"] for c in json.loads(get(f"{self.a.webui}/api/v1/chats/?page=1", token))]

    def chat_id(self, token):
        """The chat this browser created: the newest one not there before."""
        if self.cid is None:
            m = re.search(r"/c/([0-9a-f-]{36})", self.page.url)
            if m and m.group(1) not in self.old_chats:
                self.cid = m.group(1)
            else:
                new = [c for c in self.chat_ids(token) if c not in self.old_chats]
                self.cid = new[0] if new else None
        return self.cid

    def wait_replies(self, n_assistant, token):
        """Until the chat holds n_assistant assistant messages, all done."""
        deadline = time.time() + TURN_TIMEOUT
        note = time.time() + 30
        state = "no chat yet"
        while time.time() < deadline:
            cid = self.chat_id(token)
            if cid:
                chat = json.loads(get(f"{self.a.webui}/api/v1/chats/{cid}", token))["chat"]
                msgs = chat["history"]["messages"]
                asst = [m for m in msgs.values() if m.get("role") == "assistant"]
                if len(asst) >= n_assistant and all(m.get("done") for m in asst):
                    return chat
                state = (f"chat {cid}: {len(asst)} replies, "
                         f"{sum(1 for m in asst if m.get('done'))} done")
            if time.time() > note:
                log(f"  waiting ({state}, page {self.page.url})")
                note = time.time() + 30
            time.sleep(1)
        fail(f"no {n_assistant} finished replies within {TURN_TIMEOUT}s")

    def newest(self, chat):
        """The assistant message this step added (not seen before)."""
        asst = [m for m in chat["history"]["messages"].values()
                if m.get("role") == "assistant" and m.get("id") not in self.seen]
        if len(asst) != 1:
            fail(f"expected one new reply, found {len(asst)}")
        self.seen.add(asst[0]["id"])
        return asst[0]

    def toasts(self):
        """The toasts shown since the last call (type, text)."""
        got = self.page.evaluate("() => { const t = window.__wkvmToasts || []; "
                                 "window.__wkvmToasts = []; return t; }")
        self.all_toasts.extend(got)
        return got

    def check_toasts(self, step):
        got = self.toasts()
        for t in got:
            log(f"  toast ({t['type'] or 'plain'}): {t['text']!r}")
        errors = [t for t in got if t["type"] == "error"]
        if errors:
            self.shot("error-toast")
            fail(f"{step}: Open WebUI showed an error toast: {errors[0]['text']!r}")

    def enable_tool(self, name):
        """The message box's Integrations menu > Tools > tick the tool."""
        p = self.page
        p.locator("#integration-menu-button").click()
        p.get_by_role("menuitem", name=re.compile(r"^\s*Tools")).first.click()
        item = p.get_by_role("menuitemcheckbox", name=re.compile(re.escape(name)))
        item.first.wait_for(state="visible", timeout=30000)
        if item.first.get_attribute("aria-checked") != "true":
            item.first.click()
        time.sleep(0.5)
        checked = item.first.get_attribute("aria-checked")
        self.shot("tools-menu")
        if checked != "true":
            fail(f"the tool {name!r} is not ticked in the Integrations menu "
                 f"(aria-checked {checked!r})")
        p.keyboard.press("Escape")
        time.sleep(0.5)
        log(f"tool {name!r} ticked in the Integrations menu")

    def send(self, text):
        p = self.page
        box = p.locator("#chat-input")
        box.click()
        p.keyboard.type(text)
        p.keyboard.press("Enter")


def item_summary(m):
    """A persisted 0.12.x reply's output items: (type, name or status)."""
    return [(i.get("type"), i.get("name") or i.get("status")) for i in m.get("output") or []]


class Done(Exception):
    """The steps asked for are done."""


def reply_text(m):
    text = m.get("content") or ""
    if not text and m.get("output"):
        text = "\n".join(c.get("text", "") for it in m["output"] if it.get("type") == "message"
                         for c in it.get("content", []) if c.get("type") == "output_text")
    return text


def tool_chat(b, a, model, token):
    """A new chat with the smoke tool ticked in the message box (native
    function calling, Open WebUI's default): turn 1 asks for the smoke
    clock, the call runs and the model answers; turn 2 asks something else.
    Returns the failures."""
    p = b.page
    did = install_tool(a.webui, token)
    log(f"tool chat: created through Open WebUI's API: {', '.join(did)}")
    p.goto(a.webui + "/", wait_until="domcontentloaded")
    p.wait_for_selector("#chat-input", timeout=120000)
    b.dismiss()
    b.pick_model(model)
    b.enable_tool("wkvm smoke clock")
    b.cid = None
    b.old_chats = set(b.chat_ids(token))
    fails = []
    for n, text in enumerate(TOOL_TURNS, 1):
        before = metrics(a.wkvm)
        log(f"tool turn {n}: {text!r}")
        t0 = time.time()
        b.send(text)
        chat = b.wait_replies(n, token)
        after = metrics(a.wkvm)
        d = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        last = b.newest(chat)
        items = output_items(last)
        log(f"  {time.time() - t0:.1f}s, output {item_summary(last)}")
        log(f"  reply {reply_text(last)[:120]!r}")
        log(f"  wkvm counters: {json.dumps(d, sort_keys=True)}")
        time.sleep(1)
        b.shot(f"tool-turn{n}")
        b.check_toasts(f"tool turn {n}")
        if last.get("error"):
            fails.append(f"tool turn {n}: the reply carries an error: {last['error']}")
        if not reply_text(last).strip():
            fails.append(f"tool turn {n}: no answer")
        calls = items.get("function_call", [])
        if n == 1:
            outs = items.get("function_call_output", [])
            res = "".join(x.get("text", "") for o in outs for x in o.get("output") or []
                          if isinstance(x, dict))
            if [c.get("name") for c in calls] != [TOOL_FUNCTION] or \
                    calls[0].get("status") != "completed":
                fails.append(f"tool turn 1: expected one completed call to {TOOL_FUNCTION}: "
                             f"{calls}")
            elif TOOL_RESULT not in res:
                fails.append(f"tool turn 1: the tool's result is not in the output: {outs}")
            else:
                log(f"  tool {TOOL_FUNCTION}({calls[0].get('arguments')}) -> {res!r}")
            shown = p.get_by_text(re.compile(re.escape(TOOL_FUNCTION))).count()
            log(f"  the page shows {shown} element(s) naming {TOOL_FUNCTION}")
            if not shown:
                fails.append(f"tool turn 1: the page does not show the call to {TOOL_FUNCTION}")
        elif calls:
            fails.append(f"tool turn {n}: unexpected call {calls}")
    return fails


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--webui", required=True)
    ap.add_argument("--wkvm", required=True)
    ap.add_argument("--creds", required=True)
    ap.add_argument("--chromium", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--headed", action="store_true")
    ap.add_argument("--chat", choices=("reuse", "tools", "both"), default="reuse",
                    help="reuse: three turns and Try Again (the default); tools: a chat with "
                    "a tool ticked, native function calling (Open WebUI 0.12+, a model with "
                    "its own template); both")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    version = json.loads(get(a.webui + "/api/config")).get("version")
    model = json.loads(get(a.wkvm + "/v1/models"))["data"][0]["id"]
    log(f"Open WebUI {version} at {a.webui}, wkvm model {model!r}, browser {a.chromium}")
    steps = []
    tool_fails = []
    with sync_playwright() as pw:
        br = pw.chromium.launch(executable_path=a.chromium, headless=not a.headed,
                                args=["--no-sandbox", "--disable-gpu"])
        ctx = br.new_context(viewport={"width": 1280, "height": 900})
        ctx.add_init_script(TOAST_WATCH)
        page = ctx.new_page()
        page.set_default_timeout(60000)
        b = Browser(a, page)
        try:
            b.login()
            token = b.token()
            page.goto(a.webui + "/", wait_until="domcontentloaded")
            page.wait_for_selector("#chat-input", timeout=120000)
            b.dismiss()
            b.check_toasts("sign-in")
            if a.chat in ("tools", "both"):
                tool_fails = tool_chat(b, a, model, token)
            if a.chat == "tools":
                raise Done()
            page.goto(a.webui + "/", wait_until="domcontentloaded")
            page.wait_for_selector("#chat-input", timeout=120000)
            b.pick_model(model)
            b.cid = None
            b.old_chats = set(b.chat_ids(token))
            for n, text in enumerate(TEXTS, 1):
                before = metrics(a.wkvm)
                log(f"turn {n}: {text!r}")
                t0 = time.time()
                b.send(text)
                chat = b.wait_replies(n, token)
                after = metrics(a.wkvm)
                d = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
                last = b.newest(chat)
                log(f"  {time.time() - t0:.1f}s, reply {reply_text(last)[:120]!r}")
                log(f"  wkvm counters: {json.dumps(d, sort_keys=True)}")
                steps.append((f"turn {n}", d, last))
                b.shot(f"turn{n}")
                b.check_toasts(f"turn {n}")
            log(f"chat title {chat.get('title')!r}")
            # "Try Again": the regenerate button of the last reply opens the
            # regenerate menu (Try Again / Add Details / More Concise).
            before = metrics(a.wkvm)
            # (0.10.x: the menu's trigger is a div, 0.12.x a button)
            page.locator("[aria-label='Regenerate']:visible").last.click()
            try_again = page.get_by_text("Try Again", exact=True)
            try_again.first.wait_for(state="visible", timeout=10000)
            b.shot("regenerate-menu")
            t0 = time.time()
            try_again.first.click()
            chat = b.wait_replies(len(TEXTS) + 1, token)
            after = metrics(a.wkvm)
            d = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
            last = b.newest(chat)
            if last.get("parentId") != steps[-1][2].get("parentId"):
                fail(f"the regenerated reply hangs under {last.get('parentId')}, not under "
                     f"turn 3's user message {steps[-1][2].get('parentId')}")
            log(f"Try Again: {time.time() - t0:.1f}s, reply {reply_text(last)[:120]!r}")
            log(f"  wkvm counters: {json.dumps(d, sort_keys=True)}")
            steps.append(("Try Again", d, last))
            time.sleep(1)
            b.shot("try-again")
            b.check_toasts("Try Again")
        except Done:
            pass
        except Exception:
            try:
                b.shot("failure")
            except Exception:
                pass
            raise
        finally:
            br.close()
    fails = list(tool_fails)
    log(f"toasts seen: {len(b.all_toasts)}, errors: "
        f"{sum(1 for t in b.all_toasts if t['type'] == 'error')}")
    if a.chat == "tools":
        if fails:
            fail("; ".join(fails))
        log(f"PASS (Open WebUI {version}, tool chat; screenshots in {a.out})")
        return 0
    for name, d, m in steps:
        if not reply_text(m).strip():
            fails.append(f"{name}: empty persisted reply")
    want = {"turn 2": "wkvm_parent_bound_continuation_hits_total",
            "turn 3": "wkvm_parent_bound_continuation_hits_total",
            "Try Again": "wkvm_parent_bound_regenerate_hits_total"}
    hits = {}
    for name, d, _ in steps:
        hits[name] = total(d, "wkvm_reuse_hits_total")
        if name in want and (d.get(want[name], 0) != 1 or hits[name] != 1):
            rej = {k: v for k, v in d.items() if "rejections" in k or "misses" in k}
            fails.append(f"{name}: {want[name]} +{d.get(want[name], 0):g}, wkvm_reuse_hits_total "
                         f"+{hits[name]:g} (misses/rejections {rej})")
    log("wkvm_reuse_hits_total per step: " + ", ".join(f"{k} +{v:g}" for k, v in hits.items()))
    if fails:
        fail("; ".join(fails))
    log(f"PASS (Open WebUI {version}; screenshots in {a.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
