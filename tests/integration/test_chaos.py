#!/usr/bin/env python3
"""Chaos under load: streaming clients while the stack is hurt in a loop.

N client threads (default 16; bench/chaos.py runs 50) each run, at random:
streaming multi-turn chats (half with Open WebUI's parent-token-v1 headers,
half as a plain OpenAI client), and state operations (create, fork, export,
greedy generate). Meanwhile, every round injects, one after the other:
  - SIGKILL of worker w0 (restarted after a second),
  - SIGKILL of the controller (restarted),
  - SIGSTOP of worker w1 past the request deadline (then SIGCONT),
  - a full data disk: the controller's data dir is a small tmpfs (root only;
    skipped by name otherwise), filled to the last byte for a few seconds.
Judged:
  - every answer is a documented success or a documented error, and a 5xx
    only while a fault is open or just after (its cause); a dropped
    connection only when the controller was killed under it; no request
    outlives its client deadline (a hang);
  - after every fault, every acknowledged state is still there with its
    tokens, and greedy continuations recorded before are bit-identical;
  - every chat turn that was answered is checked against a recompute with
    "cache": false (the reply must be the same bytes), so a resumed or
    restarted session is never wrong;
  - after the rounds, on a quiet stack: follow-up turns reuse their state
    again (cached_tokens), no request is left running, and the workers' used
    slots equal what the controller lists (no leak).
Prints one JSON line of figures (rounds, faults, requests, errors by kind,
states verified...) and "N passed, N failed".

Usage: test_chaos.py [--clients N] [--rounds R] [--json FILE]
"""
import argparse
import collections
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wkvm_harness import MKMODEL, Stack, http as http_request  # noqa: E402

MID = "tiny"
DEADLINE = 90.0  # seconds: a client request that takes longer is a hang
GRACE = 15.0     # seconds after a fault during which a 5xx is still its doing
REQUEST_S = 4.0  # the controller's --request-timeout-ms, in seconds
# Saturation (50 clients on 16 slots) may answer these without a fault, but
# only once the request waited its documented time: a state operation waits
# --slot-wait-ms (capped at the request deadline) for a slot, a queued chat
# its request deadline.
SATURATION = {(503, "no_capacity"): REQUEST_S, (504, "timeout"): REQUEST_S}
DOCUMENTED = {
    400: {"invalid_request", "unsupported"},
    404: {"not_found"},
    409: {"busy", "invalid_state", "already_exists"},
    429: {"queue_full", "quota_exceeded"},
    503: {"unavailable", "no_capacity"},
    504: {"timeout"},
}


class Figures:
    def __init__(self):
        self.mu = threading.Lock()
        self.c = collections.Counter()
        self.errors = collections.Counter()
        self.faults = collections.Counter()
        self.bad = []
        self.notes = []  # the 4xx answers, for the record

    def add(self, key, n=1):
        with self.mu:
            self.c[key] += n

    def error(self, kind):
        with self.mu:
            self.errors[kind] += 1

    def fail(self, msg):
        with self.mu:
            self.bad.append(msg)

    def note(self, msg):
        with self.mu:
            self.notes.append(msg)


class Faults:
    """When each fault was open: a 5xx or a dropped connection must fall in one."""

    def __init__(self):
        self.mu = threading.Lock()
        self.windows = []  # [kind, start, end or None]
        self.ctl_kills = 0

    def open(self, kind):
        with self.mu:
            w = [kind, time.time(), None]
            self.windows.append(w)
            if kind == "controller_kill":
                self.ctl_kills += 1
            return w

    def close(self, w):
        with self.mu:
            w[2] = time.time()

    def explains(self, t0, t1):
        with self.mu:
            return any(s <= t1 + 0.1 and (e is None or e + GRACE >= t0)
                       for _, s, e in self.windows)


class Client:
    """One thread's HTTP calls, each judged."""

    def __init__(self, port, figs, faults):
        self.port, self.figs, self.faults = port, figs, faults

    def call(self, method, path, body=None, headers=None, stream=False, ok=(200,)):
        """(status, parsed body or SSE events) or None when the request was lost
        to a controller kill. Judges the answer; returns None on an error too."""
        self.figs.add("requests")
        t0 = time.time()
        kills = self.faults.ctl_kills
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=DEADLINE)
        hdrs = {"Content-Type": "application/json"}
        hdrs.update(headers or {})
        try:
            c.request(method, path, body=json.dumps(body) if body is not None else None,
                      headers=hdrs)
            r = c.getresponse()
            raw = r.read() if not stream or r.status != 200 else None
            events = None
            if stream and r.status == 200:
                events, done = [], False
                for line in r:
                    line = line.rstrip(b"\n")
                    if line.startswith(b"data: "):
                        if line == b"data: [DONE]":
                            done = True
                            break
                        events.append(json.loads(line[6:]))
                if not done:  # the stream ended without [DONE]: the connection dropped
                    raise ConnectionError("the stream ended without [DONE]")
            status = r.status
        except TimeoutError:
            self.figs.fail("hang: %s %s took over %.0f s" % (method, path, DEADLINE))
            return None
        except (OSError, http.client.HTTPException, ValueError) as e:
            if self.faults.ctl_kills != kills or self.faults.explains(t0, time.time()):
                self.figs.add("lost_to_a_kill")
                return None
            self.figs.fail("%s %s: connection failed with no fault: %r" % (method, path, e))
            return None
        finally:
            c.close()
        t1 = time.time()
        if status in ok:
            if stream and events is not None:
                errs = [ev["error"] for ev in events if "error" in ev]
                if errs:  # an error event mid-stream: judged like the answer it stands for
                    st = [k for k, v in DOCUMENTED.items() if errs[0].get("code") in v]
                    return self.judge_error(method, path, st[0] if st else 500, errs[0], t0, t1)
                self.figs.add("ok")
                return status, events
            self.figs.add("ok")
            try:
                return status, json.loads(raw) if raw else None
            except ValueError:
                return status, raw  # export: bytes
        try:
            err = json.loads(raw)["error"]
        except (ValueError, KeyError, TypeError):
            self.figs.fail("%s %s: %d without an OpenAI error body: %r"
                           % (method, path, status, raw[:200]))
            return None
        return self.judge_error(method, path, status, err, t0, t1)

    def judge_error(self, method, path, status, err, t0, t1):
        code = err.get("code")
        self.figs.error("%d %s" % (status, code))
        if status < 500:
            self.figs.note("%d %s on %s %s: %s" % (status, code, method, path, err.get("message")))
        if status not in DOCUMENTED or code not in DOCUMENTED[status] or not err.get("message"):
            self.figs.fail("%s %s: undocumented error %d %r" % (method, path, status, err))
        elif (status, code) in SATURATION and t1 - t0 >= 0.95 * SATURATION[(status, code)]:
            self.figs.add("saturation_%d_%s" % (status, code))
        elif status >= 500 and not self.faults.explains(t0, t1):
            self.figs.fail("%s %s: %d %s with no fault to cause it: %s"
                           % (method, path, status, code, err.get("message")))
        return None


def reply_of(events):
    """Content, generated ids, prompt ids (the tokens the state held before
    the reply: the return_token_ids extension) and usage of a streamed chat."""
    text, ids, prompt, usage = "", [], None, None
    for ev in events:
        for ch in ev.get("choices", []):
            text += (ch.get("delta") or {}).get("content") or ""
            ids += ch.get("token_ids") or []
        prompt = ev.get("prompt_token_ids", prompt)
        usage = ev.get("usage") or usage
    return text, ids, prompt, usage


def turn_mismatch(ids, usage, want):
    """Why a streamed chat reply (ids: its chunks' token_ids, usage: its usage chunk) is
    not what its prompt gives from scratch (want: the recompute's ids), or None. A reply
    without ids is a mismatch: comparing two empty lists verified nothing."""
    n = (usage or {}).get("completion_tokens")
    if not ids or n != len(ids):
        return "the stream carried %d token ids for %s completion tokens" % (len(ids), n)
    if want[:len(ids)] != ids:
        return "reply ids %s, the same prompt from scratch gives %s" % (ids, want)
    return None


def turn_mismatch_selftest():
    """The check fails on a deliberately wrong reply (and on one without ids)."""
    u = {"completion_tokens": 3}
    assert turn_mismatch([5, 6, 7], u, [5, 6, 7]) is None
    assert turn_mismatch([5, 6, 8], u, [5, 6, 7]) is not None
    assert turn_mismatch([], u, [5, 6, 7]) is not None
    assert turn_mismatch([], None, []) is not None
    assert turn_mismatch([5, 6], u, [5, 6, 7]) is not None


def chat_body(messages):
    return {"model": MID, "messages": messages, "max_tokens": 6, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}


class World:
    """What the clients were told: the truth the audits check."""

    def __init__(self):
        self.mu = threading.Lock()
        self.states = {}      # id -> token ids it was created with
        self.greedy = {}      # id -> greedy continuation recorded
        self.deleted = set()


def client_main(idx, port, figs, faults, world, stop, seed):
    rng = random.Random(seed)
    cl = Client(port, figs, faults)
    owui = idx % 2 == 0
    chat = None
    while not stop.is_set():
        op = rng.random()
        if op < 0.55:  # a chat turn
            if chat is None or chat["turns"] >= 4:
                chat = {"id": "c%d-%d" % (idx, rng.randrange(10**9)), "turns": 0,
                        "messages": [{"role": "system", "content": "You are chaos %d." % idx}],
                        "parent": ""}
            chat["messages"].append({"role": "user",
                                     "content": "turn %d %s" % (chat["turns"],
                                                                rng.choice(["a", "bb", "c c"]))})
            hdrs = {}
            if owui:
                aid = "%s-a%d" % (chat["id"], chat["turns"])
                hdrs = {"X-OpenWebUI-User-Id": "u%d" % idx, "X-OpenWebUI-Chat-Id": chat["id"],
                        "X-WKVM-Stateful-Chat": "parent-token-v1",
                        "X-WKVM-Assistant-Message-ID": aid,
                        "X-WKVM-User-Message-ID": "%s-u%d" % (chat["id"], chat["turns"]),
                        "X-WKVM-Parent-Message-ID": chat["parent"]}
            res = cl.call("POST", "/v1/chat/completions", chat_body(chat["messages"]),
                          headers=hdrs, stream=True)
            if res is None:
                chat = None  # start over: the turn's fate is unknown
                continue
            text, ids, prompt, usage = reply_of(res[1])
            if chat["turns"] > 0:
                figs.add("followups")
                if usage and (usage.get("prompt_tokens_details") or {}).get("cached_tokens"):
                    figs.add("followups_reused")
            # the reply must be what the same tokens give computed from scratch, whether
            # the turn resumed a parked slot, a checkpoint, or nothing (after a fault)
            ref = cl.call("POST", "/v1/completions",
                          {"model": MID, "prompt": prompt, "max_tokens": len(ids) or 1,
                           "temperature": 0, "cache": False, "return_token_ids": True})
            if ref is not None:
                why = turn_mismatch(ids, usage, ref[1]["choices"][0]["token_ids"])
                if why is not None:
                    figs.fail("chat %s turn %d (%d prompt tokens): %s"
                              % (chat["id"], chat["turns"], len(prompt or []), why))
                else:
                    figs.add("turns_verified")
            chat["messages"].append({"role": "assistant", "content": text})
            chat["parent"] = hdrs.get("X-WKVM-Assistant-Message-ID", "")
            chat["turns"] += 1
        elif op < 0.75:  # create a state
            toks = [rng.randrange(1, 500) for _ in range(rng.randrange(2, 20))]
            res = cl.call("POST", "/v1/states",
                          {"model": MID, "name": "s%d-%d" % (idx, rng.randrange(10**9)),
                           "prompt_ids": toks}, ok=(201,))
            if res is not None:
                with world.mu:
                    world.states[res[1]["id"]] = toks
        else:
            with world.mu:
                live = sorted(set(world.states) - world.deleted)
            if not live:
                continue
            sid = rng.choice(live)
            if op < 0.85:
                res = cl.call("POST", "/v1/states/%s/fork" % sid,
                              {"name": "f%d-%d" % (idx, rng.randrange(10**9))}, ok=(201,))
                if res is not None:
                    b = res[1]
                    with world.mu:
                        for st in (b["data"] if "data" in b else [b]):
                            world.states[st["id"]] = world.states[sid]
            elif op < 0.92:
                cl.call("GET", "/v1/states/%s/export" % sid)
            else:
                res = cl.call("POST", "/v1/states/%s/generate" % sid,
                              {"prompt_ids": [9, 8], "max_tokens": 4, "temperature": 0,
                               "ignore_eos": True, "return_token_ids": True})
                if res is not None:
                    ids = res[1]["choices"][0]["token_ids"]
                    with world.mu:
                        prev = world.greedy.setdefault(sid, ids)
                    if prev != ids:
                        figs.fail("state %s: greedy continuation %s, before %s" % (sid, ids, prev))


class ChaosStack(Stack):
    """Logs outside the data dir (which may be a tmpfs the test fills)."""

    def __init__(self, logdir, **kw):
        self.logdir = logdir
        super().__init__(**kw)

    def _log(self, name):
        path = os.path.join(self.logdir, "%s.log" % name)
        self.logs.append(path)
        return open(path, "ab")


def audit(s, world, figs, what):
    """Every acknowledged state is there with its tokens; recorded greedy
    continuations are bit-identical."""
    with world.mu:
        states = dict(world.states)
        greedy = dict(world.greedy)
    for sid, toks in states.items():
        r = s.get("/v1/states/%s" % sid)
        if r.status != 200:
            figs.fail("%s: acknowledged state %s: %d %r" % (what, sid, r.status, r.body[:200]))
            continue
        if r.json().get("token_ids") != toks:
            figs.fail("%s: state %s holds other tokens" % (what, sid))
            continue
        figs.add("states_verified")
    for sid, ids in list(greedy.items())[:8]:
        r = s.post("/v1/states/%s/generate" % sid,
                   body={"prompt_ids": [9, 8], "max_tokens": 4, "temperature": 0,
                         "ignore_eos": True, "return_token_ids": True}, timeout=DEADLINE)
        if r.status != 200 or r.json()["choices"][0]["token_ids"] != ids:
            figs.fail("%s: state %s continues differently: %d %r"
                      % (what, sid, r.status, r.body[:200]))
        else:
            figs.add("continuations_verified")


def mount_tmpfs(path, size_mb):
    if os.geteuid() != 0:
        return "needs root to mount a tmpfs"
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dm" % size_mb, "tmpfs", path],
                       capture_output=True, text=True)
    return None if p.returncode == 0 else "mount tmpfs: %s" % p.stderr.strip()


def fill(path):
    """Fills the filesystem of path to the last byte; returns the filler's name."""
    name = os.path.join(path, "filler")
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            block = b"\0" * size
            try:
                while True:
                    os.write(fd, block)
            except OSError:
                pass
    finally:
        os.close(fd)
    return name


def run(clients, rounds, seed=2026):
    root = tempfile.mkdtemp(prefix="wkvm-chaos-")
    data, logs = os.path.join(root, "data"), os.path.join(root, "logs")
    os.makedirs(data)
    os.makedirs(logs)
    # room for what the clients keep (parked sessions, states, checkpoints):
    # 64 MB was full of 50 clients' spilled sessions after 40 minutes
    no_disk = mount_tmpfs(data, max(64, 8 * clients))
    model = os.path.join(root, "tiny")
    subprocess.run([MKMODEL, "--out", model, "--layers", "2", "--embd", "64", "--head-size", "16",
                    "--ffn", "128", "--vocab", "512", "--seed", "11"], check=True,
                   capture_output=True, timeout=60)
    figs, faults, world = Figures(), Faults(), World()
    t_start = time.time()
    rng = random.Random(seed)
    s = ChaosStack(logs, model=model, slots=8, workers_expected=2, data=data,
                   extra_ctl=["--request-timeout-ms", str(int(REQUEST_S * 1000)), "--served-model-name", MID,
                              "--checkpoint-write-through", "true"])
    try:
        s.start_controller()
        s.start_worker("w0")
        s.start_worker("w1")
        s.wait(lambda: s.get("/ready").status == 200, "ready", timeout=120)
        stop = threading.Event()
        threads = [threading.Thread(target=client_main,
                                    args=(i, s.port, figs, faults, world, stop, seed + i),
                                    daemon=True) for i in range(clients)]
        for t in threads:
            t.start()

        def ready_again(what):
            s.wait(lambda: s.get("/ready").status == 200, what, timeout=120)

        for rnd in range(rounds):
            time.sleep(rng.uniform(2, 4))
            w = faults.open("worker_kill")
            s.kill_worker("w0")
            figs.faults["worker_kill"] += 1
            time.sleep(1)
            s.start_worker("w0")
            ready_again("w0 back")
            faults.close(w)
            audit(s, world, figs, "round %d after the worker kill" % rnd)

            time.sleep(rng.uniform(2, 4))
            w = faults.open("controller_kill")
            s.kill_controller()
            figs.faults["controller_kill"] += 1
            s.start_controller()
            ready_again("controller back")
            faults.close(w)
            audit(s, world, figs, "round %d after the controller kill" % rnd)

            time.sleep(rng.uniform(2, 4))
            w = faults.open("worker_stop")
            s.workers["w1"].send_signal(signal.SIGSTOP)
            figs.faults["worker_stop"] += 1
            time.sleep(6)  # past the 4 s request deadline
            s.workers["w1"].send_signal(signal.SIGCONT)
            ready_again("w1 answering again")
            faults.close(w)
            audit(s, world, figs, "round %d after the stop" % rnd)

            if no_disk is None:
                time.sleep(rng.uniform(2, 4))
                w = faults.open("disk_full")
                filler = fill(data)
                figs.faults["disk_full"] += 1
                time.sleep(3)
                os.unlink(filler)
                faults.close(w)
                audit(s, world, figs, "round %d after the full disk" % rnd)
            figs.add("rounds")

        stop.set()
        for t in threads:
            t.join(timeout=DEADLINE + 30)
            if t.is_alive():
                figs.fail("a client thread is still in a request long past its deadline")
        # quiet: reuse resumes, nothing runs, no slot leaks
        time.sleep(GRACE)
        cl = Client(s.port, figs, faults)
        msgs = [{"role": "user", "content": "calm"}]
        for turn in range(3):
            res = cl.call("POST", "/v1/chat/completions", chat_body(msgs), stream=True)
            if res is None:
                figs.fail("a quiet chat turn failed")
                break
            text, _, _, usage = reply_of(res[1])
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            if turn > 0 and not cached:
                figs.fail("quiet follow-up %d reused nothing: %r" % (turn, usage))
            msgs += [{"role": "assistant", "content": text},
                     {"role": "user", "content": "again %d" % turn}]
        audit(s, world, figs, "the end")

        # every state goes: each delete answered 200 and the state then gone
        # (this also gives the data tmpfs back for the check below)
        with world.mu:
            sids = list(world.states)
        for sid in sids:
            r = http_request("DELETE", s.url + "/v1/states/%s" % sid)
            if r.status != 200 or s.get("/v1/states/%s" % sid).status != 404:
                figs.fail("deleting acknowledged state %s: %d %r" % (sid, r.status, r.body[:200]))
            else:
                figs.add("states_deleted")

        # a session outlives its worker (--checkpoint-write-through): its reply
        # checkpoint reaches the disk, every worker dies, the next turn resumes it
        def disk_entries():
            return s.get("/admin/cache").json()["tiers"]["disk"]["entries"]
        before = disk_entries()
        msgs = [{"role": "user", "content": "survive the workers"}]
        res = cl.call("POST", "/v1/chat/completions", chat_body(msgs), stream=True)
        if res is None:
            figs.fail("the survival chat's first turn failed")
        else:
            text, ids, prompt, _ = reply_of(res[1])
            try:
                s.wait(lambda: disk_entries() > before, "the reply checkpoint on disk")
            except AssertionError:
                figs.fail("the survival chat's reply checkpoint never reached the disk "
                          "(/admin/cache: %r)" % s.get("/admin/cache").body[:400])
            w = faults.open("worker_kill")
            for wid in ("w0", "w1"):
                s.kill_worker(wid)
            for wid in ("w0", "w1"):
                s.start_worker(wid)
            s.wait(lambda: s.get("/ready").status == 200, "workers back", timeout=120)
            faults.close(w)
            msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "and?"}]
            res = cl.call("POST", "/v1/chat/completions", chat_body(msgs), stream=True)
            if res is None:
                figs.fail("the survival chat's second turn failed")
            else:
                _, _, _, usage = reply_of(res[1])
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                if cached < len(prompt) + len(ids):
                    figs.fail("after every worker died, the next turn reused %d tokens, "
                              "not the %d its disk checkpoint holds" %
                              (cached, len(prompt) + len(ids)))
                else:
                    figs.add("sessions_survived_worker_death")

        def settled():
            slots = s.get("/admin/slots").json()["slots"]
            if any(x["state"] == "running" for x in slots):
                return False
            per = collections.Counter(x["worker"] for x in slots)
            return all(w["slots_used"] == per.get(w["id"], 0) for w in s.workers_list())
        try:
            s.wait(settled, "no running slot, used slots == listed slots", timeout=60)
        except AssertionError as e:
            figs.fail("slot leak: %s" % str(e)[:600])
    finally:
        s.stop()
        if no_disk is None:
            subprocess.run(["umount", "-l", data], capture_output=True)
        tail = s.tail() if figs.bad else ""
        shutil.rmtree(root, ignore_errors=True)

    out = {"clients": clients, "rounds": figs.c["rounds"], "seconds": round(time.time() - t_start),
           "faults": dict(figs.faults), "requests": figs.c["requests"], "ok": figs.c["ok"],
           "errors": dict(figs.errors), "lost_to_a_kill": figs.c["lost_to_a_kill"],
           "states_verified": figs.c["states_verified"],
           "continuations_verified": figs.c["continuations_verified"],
           "chat_turns_verified": figs.c["turns_verified"],
           "followups": figs.c["followups"], "followups_reused": figs.c["followups_reused"],
           "states_deleted": figs.c["states_deleted"],
           "saturation_after_waiting": {k[len("saturation_"):]: v for k, v in figs.c.items()
                                        if k.startswith("saturation_")},
           "sessions_survived_worker_death": figs.c["sessions_survived_worker_death"],
           "disk_fault": "run" if no_disk is None else "skipped: " + no_disk,
           "problems": len(figs.bad)}
    return out, figs.bad, tail, figs.notes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args()
    turn_mismatch_selftest()
    out, bad, tail, notes = run(a.clients, a.rounds)
    for n in notes[:20]:
        print("note: " + n)
    print(json.dumps(out), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    kinds = collections.Counter(re.sub(r"[0-9a-f]{8,}|[0-9]+(\.[0-9]+)?", "N", b)[:100]
                                for b in bad)
    for k, n in kinds.most_common():
        print("problems of a kind: %6d  %s" % (n, k))
    for b in bad[:20]:
        print("FAIL " + b)
    if bad and tail:
        print(tail[-4000:])
    if out["disk_fault"] != "run":
        print("disk-full fault " + out["disk_fault"])
    print("%d passed, %d failed" % (0 if bad else 1, 1 if bad else 0))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
