"""Automatic reuse (docs/OPERATIONS.md "Reuse"): checkpoints, the per-owner
prefix index and the parent-token-v1 path, against real processes.

The model has random weights and a World vocab whose ids 1..256 are raw single
bytes, so its replies are often invalid UTF-8 and carry control characters and
odd whitespace; nothing here depends on a reply being clean text. Every reuse
is checked two ways: the tokens the server says it held before the reply
(`prompt_token_ids`, with `return_token_ids`) start with everything the
previous turn's state consumed and only the rest was computed
(`cached_tokens`), and the greedy reply equals wkvm-infer run on those same
tokens from scratch (a consistency oracle: wkvm-infer runs the same CPU
backend, so this checks that resuming a checkpoint is bit-identical to
recomputing, not the model's numerics).
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import BUILD, MKMODEL, Stack, http, run_tests  # noqa: E402

INFER = os.path.join(BUILD, "tools", "wkvm-infer")
TMP = tempfile.TemporaryDirectory(prefix="wkvm-reuse-")
MID = "tiny"


def make_model():
    d = os.path.join(TMP.name, "tiny")
    subprocess.run([MKMODEL, "--out", d, "--layers", "2", "--embd", "64", "--head-size", "16",
                    "--ffn", "128", "--vocab", "512", "--seed", "5"],
                   check=True, capture_output=True, timeout=60)
    return d


MODEL = make_model()


def make_qwen35():
    """A Qwen3.5 layout (gated attention in layers 1 and 3 over the KV pool, GDN elsewhere)."""
    d = os.path.join(TMP.name, "tiny-qwen35")
    if os.path.exists(os.path.join(d, "config.json")):
        return d
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    ref = os.path.join(os.path.dirname(__file__), "..", "reference")
    subprocess.run([py, os.path.join(ref, "gen_qwen35.py"), "--out", d, "--seed", "21",
                    "--layers", "4", "--interval", "2", "--vocab", "512"],
                   check=True, capture_output=True, timeout=120)
    return d


def make_nemotron_h():
    """A Nemotron-H layout (Mamba2, attention over the KV pool, relu2 MLP, MoE)."""
    d = os.path.join(TMP.name, "tiny-nemotron_h")
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    ref = os.path.join(os.path.dirname(__file__), "..", "reference")
    subprocess.run([py, os.path.join(ref, "gen_nemotron_h.py"), "--out", d, "--seed", "22",
                    "--pattern", "M*M-ME", "--vocab", "512"],
                   check=True, capture_output=True, timeout=120)
    return d


def infer_greedy(tokens, n, model=None):
    out = subprocess.run([INFER, "--model", model or MODEL, "--threads", "1", "--tokens",
                          ",".join(map(str, tokens)), "--generate", str(n)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return [int(x) for x in out.split()]


def up(s, workers=1):
    s.start_controller()
    for i in range(workers):
        s.start_worker(f"w{i}")
    s.wait(lambda: s.get("/ready").status == 200, "ready")


def metric(s, name, labels=""):
    text = s.get("/metrics").body.decode()
    m = re.search(re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") +
                  r" ([0-9.e+]+)", text)
    return float(m.group(1)) if m else 0.0


def chat(s, msgs, headers=None, max_tokens=12, mid=MID, **extra):
    body = {"model": mid, "messages": msgs, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True}
    body.update(extra)
    r = s.post("/v1/chat/completions", body=body, headers=headers or {}, timeout=120)
    assert r.status == 200, r.body
    return r.json()


def parts(j):
    c = j["choices"][0]
    return (j["prompt_token_ids"], c["token_ids"], c["message"]["content"],
            j["usage"]["prompt_tokens_details"]["cached_tokens"])


# How clients send a reply back: as received (the SDK), stripped with NUL removed
# (Open WebUI persists that), or with surrounding whitespace of their own.
CLIENTS = {
    "raw": lambda t: t,
    "owui": lambda t: t.replace("\x00", "").strip(),
    "padded": lambda t: "\n " + t + " \n",
}


class OwuiChat:
    """The parent-token-v1 headers Open WebUI sends for one chat."""

    def __init__(self, chat_id, user="u1"):
        self.chat_id, self.user, self.n, self.last = chat_id, user, 0, ""

    def next(self):
        self.n += 1
        h = {"X-OpenWebUI-User-Id": self.user, "X-OpenWebUI-Chat-Id": self.chat_id,
             "X-WKVM-Stateful-Chat": "parent-token-v1",
             "X-WKVM-Assistant-Message-ID": f"{self.chat_id}-a{self.n}",
             "X-WKVM-User-Message-ID": f"{self.chat_id}-u{self.n}",
             "X-WKVM-Parent-Message-ID": self.last}
        self.last = f"{self.chat_id}-a{self.n}"
        return h


def converse(s, client, turns, owui=None, first="Read this document. " * 12, check_infer=True,
             max_tokens=12, model=None):
    """Runs a chat; checks every follow-up continues the exact retained tokens.
    Returns the per-turn (prompt ids, reply ids, cached) and the messages."""
    msgs = [{"role": "system", "content": "You answer in bytes."},
            {"role": "user", "content": first}]
    out, prev = [], None
    odd = 0
    for t in range(turns):
        j = chat(s, msgs, headers=owui.next() if owui else None, max_tokens=max_tokens,
                 mid=os.path.basename(model) if model else MID)
        P, G, text, cached = parts(j)
        if prev is not None:
            held = prev[0] + prev[1]  # everything the previous state consumed
            assert P[:len(held)] == held, (client, t, P[:len(held)], held)
            assert cached == len(held), (client, t, cached, len(held), j["usage"])
        if check_infer:
            assert G == infer_greedy(P, len(G), model), (client, t)
        try:
            text.encode("utf-8").decode("ascii")
        except UnicodeDecodeError:
            odd += 1
        if text != text.strip() or "\ufffd" in text:
            odd += 1
        out.append((P, G, cached))
        prev = (P, G)
        msgs = msgs + [{"role": "assistant", "content": CLIENTS[client](text)},
                       {"role": "user", "content": f"go on {t}"}]
    return out, msgs, odd


def test_every_follow_up_reuses_for_every_client():
    with Stack(model=MODEL, slots=4) as s:
        up(s)
        odd = 0
        for client in CLIENTS:
            # (each conversation its own document: no prompt repeats another's)
            _, _, o = converse(s, client, 5, first=f"Read this {client} document. " * 12)
            odd += o
            _, _, o = converse(s, client, 5, owui=OwuiChat(f"chat-{client}"),
                               first=f"Read this {client} chat. " * 12)
            odd += o
        # The model really did produce awkward replies (not a clean-text run).
        assert odd >= 5, odd
        assert metric(s, "wkvm_reuse_hits_total", 'kind="checkpoint"') >= 12
        assert metric(s, "wkvm_parent_bound_continuation_hits_total") >= 12
        # No contract turn fell back because of a reply's bytes.
        assert metric(s, "wkvm_parent_bound_continuation_rejections_total",
                      'reason="template_prefix_mismatch"') == 0


def test_hybrid_qwen35_follow_ups_reuse():
    """The same on a Qwen3.5 layout: GDN states plus attention KV pages; every
    follow-up resumes the previous turn's state (cached = all it consumed), and
    the reply equals a recompute. Prints the reused fraction of each prompt."""
    model = make_qwen35()
    with Stack(model=model, slots=4) as s:
        up(s)
        for client in ("raw", "owui"):
            out, _, _ = converse(s, client, 4, first=f"Read this {client} text. " * 10,
                                 model=model)
            fr = ["%.2f" % (c / len(P)) for P, _, c in out[1:]]
            print("qwen3_5 %s client: reused fraction of each follow-up's prompt %s"
                  % (client, " ".join(fr)), flush=True)
            assert all(c > 0 for _, _, c in out[1:]), out


def test_hybrid_qwen35_full_worker_cache():
    """Issue #27: a hybrid's checkpoints carry their KV (here ~150-250 KB each), so a
    worker's host cache (--host-cache-bytes, 4 MB here: about twenty) fills long before
    the controller's warm budget (GBs). A checkpoint the worker refuses then displaces
    the oldest warm copies there (counted evictions) instead of being skipped: with
    three chats interleaved, every follow-up still resumes everything the previous turn
    consumed and every regenerate (an exact repeat, right after its turn as a client
    sends it) its pre-reply checkpoint, answering the same tokens."""
    model = make_qwen35()
    mid = os.path.basename(model)
    with Stack(model=model, slots=4) as s:
        s.start_controller()
        s.start_worker("w0", extra=["--host-cache-bytes", str(4 << 20)])
        s.wait(lambda: s.get("/ready").status == 200, "ready")
        chats = [[{"role": "system", "content": "You answer in bytes."},
                  {"role": "user", "content": f"Read text number {i}. " * 8}] for i in range(3)]
        prev = [None] * 3
        for t in range(4):
            for i, msgs in enumerate(chats):
                P, G, text, cached = parts(chat(s, msgs, mid=mid))
                if prev[i] is not None:
                    held = prev[i][0] + prev[i][1]
                    assert P[:len(held)] == held and cached == len(held), (i, t, cached, len(held))
                if t == 3:  # regenerate: the same request again
                    P2, G2, _, cached2 = parts(chat(s, msgs, mid=mid))
                    assert P2 == P and cached2 == len(P) - 1 and G2 == G, (i, cached2, len(P))
                prev[i] = (P, G)
                chats[i] = msgs + [{"role": "assistant", "content": text},
                                   {"role": "user", "content": f"go on {t}"}]
        assert metric(s, "wkvm_checkpoints_skipped_total") == 0
        assert metric(s, "wkvm_reuse_hits_total", 'kind="regenerate"') == 3
        # (the worker really was full: copies were displaced)
        assert metric(s, "wkvm_state_cache_evictions_total", 'tier="warm"') >= 5


def test_hybrid_nemotron_h_follow_ups_reuse():
    """The same on a Nemotron-H layout (Mamba2 states plus attention KV pages)."""
    model = make_nemotron_h()
    with Stack(model=model, slots=4) as s:
        up(s)
        out, _, _ = converse(s, "raw", 4, first="Read this text. " * 10, model=model)
        fr = ["%.2f" % (c / len(P)) for P, _, c in out[1:]]
        print("nemotron_h raw client: reused fraction of each follow-up's prompt %s"
              % " ".join(fr), flush=True)
        assert all(c > 0 for _, _, c in out[1:]), out


def test_cut_characters_stops_and_regenerate():
    r"""max_tokens cutting a multi-byte character, a stop string inside one, an exact
    repeat (regenerate), an edit of the last user message."""
    with Stack(model=MODEL, slots=4) as s:
        up(s)
        msgs = [{"role": "user", "content": "\u00e9\u00e8\u4f60\u597d " * 10}]
        for mt in (1, 2, 3):
            j = chat(s, msgs, max_tokens=mt)
            P, G, text, _ = parts(j)
            msgs2 = msgs + [{"role": "assistant", "content": text},
                            {"role": "user", "content": "more"}]
            j2 = chat(s, msgs2)
            P2, G2, _, cached = parts(j2)
            assert P2[:len(P) + len(G)] == P + G and cached == len(P) + len(G), (mt, cached)
            assert G2 == infer_greedy(P2, len(G2))
        # A stop string right after a byte that starts a multi-byte character (the
        # reply is cut inside that character), else any ASCII byte of the reply.
        j = chat(s, msgs, max_tokens=16)
        P, G, text, _ = parts(j)
        raw = b"".join(bytes([t - 1]) for t in G if 1 <= t <= 256)
        cands = [chr(raw[i]) for i in range(1, len(raw))
                 if raw[i - 1] >= 0xc0 and 0x21 <= raw[i] < 0x7f]
        cands += [chr(b) for b in raw if 0x21 <= b < 0x7f]
        stop = cands[0] if cands else "e"
        j = chat(s, msgs, max_tokens=16, stop=[stop])
        P, G, text, cached = parts(j)
        assert cached == len(P) - 1, (cached, len(P))  # a repeat of the prompt
        msgs2 = msgs + [{"role": "assistant", "content": text}, {"role": "user", "content": "x"}]
        P2, G2, _, cached2 = parts(chat(s, msgs2))
        # (at least: the "max_tokens 3" follow-up above may share a longer prefix)
        assert P2[:len(P) + len(G)] == P + G and cached2 >= len(P) + len(G), \
            (cached2, len(P), len(G), P2[len(P) - 2:len(P) + len(G) + 2], G, repr(text))
        assert G2 == infer_greedy(P2, len(G2))
        # Regenerate: the same request again computes one token and answers the same.
        r1 = chat(s, msgs2)
        assert parts(r1)[3] == len(P2) - 1 and parts(r1)[1] == G2
        # Edit the last user message: the previous reply's state is still the prefix.
        P3, G3, _, cached3 = parts(chat(s, msgs2[:-1] + [{"role": "user", "content": "y!"}]))
        assert cached3 >= len(P) + len(G), (cached3, len(P) + len(G))
        assert G3 == infer_greedy(P3, len(G3))
        assert metric(s, "wkvm_reuse_hits_total", 'kind="regenerate"') >= 2


def test_pressure_restart_and_owners():
    """3x more concurrent chats than slots, each with a regenerate and an edit: every
    follow-up reuses, nothing comes back session_unavailable. Then a controller
    restart: reuse continues from disk. Owners never share a checkpoint."""
    with Stack(model=MODEL, slots=2, extra_ctl=["--prefill-chunk", "64"]) as s:
        up(s)
        n = 6
        errors, results = [], {}

        def one(i):
            try:
                owui = OwuiChat(f"p{i}", user=f"user{i % 2}") if i % 2 else None
                res, msgs, _ = converse(s, "owui" if owui else "raw", 3, owui=owui,
                                        first=f"Chat {i}. " * 20, check_infer=False)
                # regenerate the last turn (same messages as the last request)
                last = msgs[:-2]
                j = chat(s, last, headers=owui.next() if owui else None)
                assert parts(j)[3] == len(parts(j)[0]) - 1, ("regen", i, j["usage"])
                # edit the last user message
                ed = last[:-1] + [{"role": "user", "content": f"edited {i}"}]
                j = chat(s, ed, headers=owui.next() if owui else None)
                assert parts(j)[3] > 0, ("edit", i, j["usage"])
                results[i] = res
            except Exception as e:  # noqa: BLE001
                errors.append(f"chat {i}: {e}")

        th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in th:
            t.start()
        for t in th:
            t.join(timeout=300)
        assert not errors, errors
        assert metric(s, "wkvm_parent_bound_continuation_rejections_total",
                      'reason="session_unavailable"') == 0
        # Two owners with the same prompt: the second owner computes it all.
        same = [{"role": "user", "content": "identical prompt " * 10}]
        a = chat(s, same, headers={"X-OpenWebUI-User-Id": "alice"})
        b = chat(s, same, headers={"X-OpenWebUI-User-Id": "bob"})
        a2 = chat(s, same, headers={"X-OpenWebUI-User-Id": "alice"})
        assert parts(a)[3] == 0 and parts(b)[3] == 0, (a["usage"], b["usage"])
        assert parts(a2)[3] == len(parts(a2)[0]) - 1
        # A graceful controller restart: the checkpoints are on disk, reuse goes on.
        P, G, text, _ = parts(a2)
        follow = same + [{"role": "assistant", "content": text}, {"role": "user", "content": "?"}]
        s.kill_controller(signal.SIGTERM)
        s.start_controller()
        s.wait(lambda: s.get("/ready").status == 200, "ready after restart")
        cache = s.get("/admin/cache").json()
        assert cache["tiers"]["disk"]["entries"] > 0, cache
        j = chat(s, follow, headers={"X-OpenWebUI-User-Id": "alice"})
        P2, G2, _, cached = parts(j)
        assert P2[:len(P) + len(G)] == P + G and cached == len(P) + len(G), j["usage"]
        assert G2 == infer_greedy(P2, len(G2))
        # The shutdown said what it wrote; with no time for it, it says what it did not.
        log_path = os.path.join(s.data, "controld.log")
        with open(log_path) as f:
            log = f.read()
        assert "writing warm checkpoints to disk at shutdown entries=" in log, log[-2000:]
        assert re.search(r"checkpoints written to disk at shutdown entries=[1-9]", log), log[-2000:]
        s.extra_ctl += ["--checkpoint-flush-ms", "0"]
        s.kill_controller(signal.SIGTERM)
        s.start_controller()
        s.wait(lambda: s.get("/ready").status == 200, "ready after the second restart")
        chat(s, follow + [{"role": "user", "content": "more"}],
             headers={"X-OpenWebUI-User-Id": "alice"})
        s.kill_controller(signal.SIGTERM)
        with open(log_path) as f:
            log = f.read()
        assert re.search(r"entries=0 not_written=[1-9]\d* seconds=[0-9.]+: the time budget", log), \
            log[-2000:]


def test_budgets_switches_and_admin():
    """A tiny warm budget moves checkpoints to disk and a tiny disk budget evicts by
    LRU, counted; --prefix-cache off and "cache": false reuse nothing; the admin
    route and wkvmctl cache show and clear the cache; completions reuse too."""
    state_bytes = None
    with Stack(model=MODEL, slots=4, extra_ctl=["--state-cache-bytes", "20000",
                                                "--state-cache-disk-bytes", "60000"]) as s:
        up(s)
        state_bytes = [m for m in s.get("/v1/models").json()["data"]][0]["state_bytes_per_slot"]
        assert 20000 < 3 * state_bytes and 60000 < 20 * state_bytes, state_bytes
        for i in range(8):
            chat(s, [{"role": "user", "content": f"budget {i} " * 8}])
        s.wait(lambda: metric(s, "wkvm_state_cache_evictions_total", 'tier="disk"') > 0,
               "disk evictions")
        assert metric(s, "wkvm_state_cache_evictions_total", 'tier="warm"') > 0
        assert metric(s, "wkvm_state_cache_bytes", 'tier="disk"') <= 60000
        s.wait(lambda: metric(s, "wkvm_state_cache_bytes", 'tier="warm"') <= 20000, "warm budget")
        # The most recent prompt is still reusable (from whichever tier holds it).
        j = chat(s, [{"role": "user", "content": "budget 7 " * 8}])
        assert parts(j)[3] == len(parts(j)[0]) - 1, j["usage"]
        # Completions: an exact repeat, and a prompt that extends an earlier one.
        prompt = [(i * 31) % 500 + 1 for i in range(90)]
        body = {"model": MID, "prompt": prompt, "max_tokens": 4, "temperature": 0,
                "return_token_ids": True}
        c1 = s.post("/v1/completions", body=body).json()
        c2 = s.post("/v1/completions", body=body).json()
        assert c2["usage"]["prompt_tokens_details"]["cached_tokens"] == 89, c2["usage"]
        assert c1["choices"][0]["token_ids"] == c2["choices"][0]["token_ids"]
        ext = dict(body, prompt=prompt + [7, 8, 9])
        c3 = s.post("/v1/completions", body=ext).json()
        assert c3["usage"]["prompt_tokens_details"]["cached_tokens"] >= 89, c3["usage"]
        assert c3["choices"][0]["token_ids"] == infer_greedy(prompt + [7, 8, 9], 4)
        # "cache": false: nothing looked up, nothing left.
        nb = dict(body, prompt=prompt[:60], cache=False)
        n1 = s.post("/v1/completions", body=nb).json()
        n2 = s.post("/v1/completions", body=nb).json()
        assert n1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert n2["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        bad = s.post("/v1/completions", body=dict(body, cache="yes"))
        assert bad.status == 400 and bad.json()["error"]["param"] == "cache", bad.body
        # Admin: per-owner entries, and clear.
        cache = s.get("/admin/cache").json()
        assert cache["enabled"] and cache["owners"]["local"]["entries"] > 0, cache
        assert cache["lookups"] > 0 and 0 < cache["hit_rate"] <= 1, cache
        ctl = os.path.join(BUILD, "tools", "wkvmctl")
        out = subprocess.run([ctl, "--url", s.url, "cache"], capture_output=True, text=True,
                             timeout=30)
        assert out.returncode == 0 and "local" in out.stdout, (out.stdout, out.stderr)
        out = subprocess.run([ctl, "--url", s.url, "--json", "cache"], capture_output=True,
                             text=True, timeout=30)
        assert json.loads(out.stdout)["owners"]["local"]["entries"] > 0, out.stdout
        bad = subprocess.run([ctl, "--url", s.url, "cache", "frobnicate"], capture_output=True,
                             text=True, timeout=30)
        assert bad.returncode == 2 and bad.stderr.strip(), bad
        out = subprocess.run([ctl, "--url", s.url, "cache", "clear"], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        s.wait(lambda: s.get("/admin/cache").json()["entries"] == 0, "cache cleared")
        c4 = s.post("/v1/completions", body=body).json()
        assert c4["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, c4["usage"]
    with Stack(model=MODEL, slots=4, extra_ctl=["--prefix-cache", "false"]) as s:
        up(s)
        msgs = [{"role": "user", "content": "off " * 10}]
        chat(s, msgs)
        assert parts(chat(s, msgs))[3] == 0
        assert s.get("/admin/cache").json()["enabled"] is False


def test_busy_preferred_worker():
    """A checkpoint warm on a worker whose slots are all held goes to another worker
    (its bytes relayed) instead of waiting for that worker."""
    with Stack(model=MODEL, slots=1) as s:
        s.start_controller()
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready")
        prompt = [(i * 17) % 500 + 1 for i in range(70)]
        body = {"model": MID, "prompt": prompt, "max_tokens": 4, "temperature": 0,
                "return_token_ids": True}
        first = s.post("/v1/completions", body=body).json()  # its checkpoints: warm on w0
        s.start_worker("w1")
        s.wait(lambda: sum(w["state"] == "ready" for w in s.workers_list()) == 2, "two workers")
        # A hot state in each worker's only slot (the scheduler may pick w1 up a moment
        # after the pool reports it ready: create until both hold one).
        slots = []
        for i in range(40):
            r = s.post("/v1/states", body={"name": f"s{i}", "prompt": f"state {i}"})
            assert r.status == 201, r.body
            slots = s.get("/admin/slots").json()["slots"]
            if sorted(x["worker"] for x in slots) == ["w0", "w1"]:
                break
            time.sleep(0.1)
        assert sorted(x["worker"] for x in slots) == ["w0", "w1"], slots
        on_w1 = [x["id"] for x in slots if x["worker"] == "w1"][0]
        ev = s.post(f"/admin/slots/{on_w1}/evict")
        assert ev.status == 200, ev.body
        r = http("POST", s.url + "/v1/completions", body=body, timeout=20)
        assert r.status == 200, r.body
        j = r.json()
        assert j["usage"]["prompt_tokens_details"]["cached_tokens"] == len(prompt) - 1, j["usage"]
        assert j["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]


if __name__ == "__main__":
    rc = run_tests([test_every_follow_up_reuses_for_every_client,
                    test_hybrid_qwen35_follow_ups_reuse,
                    test_hybrid_qwen35_full_worker_cache,
                    test_hybrid_nemotron_h_follow_ups_reuse,
                    test_cut_characters_stops_and_regenerate,
                    test_pressure_restart_and_owners,
                    test_budgets_switches_and_admin,
                    test_busy_preferred_worker])
    TMP.cleanup()
    sys.exit(rc)
