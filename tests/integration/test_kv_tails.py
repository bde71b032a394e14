"""A hybrid's stored responses on disk as KV tails (issue #31).

A stored response's end state is written through to disk. On a hybrid model
the state image is the recurrent layers' fixed part plus the attention KV of
every token so far, so writing each turn's whole image again wrote the whole
conversation's KV every turn. A turn resumed from the previous response's
checkpoint now writes its fixed part and the KV past that checkpoint (a
tail); the rest is read back through the chain of records.

A controller and one CPU worker serve a random Qwen3.5-layout hybrid (Gated
DeltaNet and gated attention layers), raw byte tokens, plain HTTP:

  1. six turns by previous_response_id, each waiting for its state on disk:
     the first is written whole, the next five as tails, each smaller than
     the first whole image; every turn resumes the previous state exactly
     (cached_tokens) and equals a recompute of its prompt (cache off);
  2. the worker is SIGKILLed (its warm copies die with it): a completion
     continuing turn 6's tokens resumes its state from the chain on disk
     with the logprobs of a recompute, bit for bit (greedy tokens alone do
     not tell a random model's KV from zeros), and turn 7 resumes it too;
  3. controller and worker are SIGKILLed and restarted: the chain is read
     back (none dropped), and the same for turn 7's state and turn 8 (a tail
     again);
  4. both stop and the chain's first record (the whole image) is deleted:
     loading turn 8's state fails (logged; the entry goes) and turn 9 is
     recomputed from the stored items (still the recompute's reply);
  5. the checkpoints are cleared (bases and tails together): turn 11 still
     answers, recomputed.

Costs a few seconds: 4 layers, a 512-token vocabulary, 8 tokens a reply.
"""
import os
import re
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import Stack, gen_qwen35, run_tests  # noqa: E402

TMP = tempfile.TemporaryDirectory(prefix="wkvm-kv-tails-")
KEEP = os.environ.get("KEEP_DATA")  # a directory to keep the controller's data and logs in
MAXT = 8


def metric(s, name, labels=""):
    body = s.get("/metrics").body.decode()
    for line in body.splitlines():
        if line.startswith(name + labels + " ") or (not labels and line.startswith(name + " ")):
            return float(line.split()[-1])
    return 0.0


def disk_writes(s):
    return {r: (metric(s, "wkvm_state_cache_disk_writes_total", f'{{record="{r}"}}'),
                metric(s, "wkvm_state_cache_disk_write_bytes_total", f'{{record="{r}"}}'))
            for r in ("image", "tail")}


def wait_writes(s, n):
    """Until n checkpoint records were written to disk (the write-through is asynchronous)."""
    until = time.time() + 60
    while time.time() < until:
        w = disk_writes(s)
        if w["image"][0] + w["tail"][0] >= n:
            return w
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} checkpoint writes: {disk_writes(s)}")


def turn(s, mid, text, prev=None):
    body = {"model": mid, "input": text, "max_output_tokens": MAXT, "temperature": 0,
            "return_token_ids": True}
    if prev is not None:
        body["previous_response_id"] = prev["id"]
    r = s.post("/v1/responses", body=body, timeout=120)
    assert r.status == 200, r.body
    j = r.json()
    assert j["status"] in ("completed", "incomplete"), j
    ids, n_prompt = j["state_token_ids"], j["prompt_token_count"]
    assert 0 < n_prompt < len(ids), (n_prompt, len(ids))
    if prev is not None:
        assert ids[:len(prev["state_token_ids"])] == prev["state_token_ids"], \
            "the prompt does not start with the previous state"
    # the same prompt computed from scratch gives the same reply (raw token ids: the text of
    # a random byte-vocabulary model need not be UTF-8)
    k = len(ids) - n_prompt
    c = s.post("/v1/completions", body={"model": mid, "prompt": ids[:n_prompt], "max_tokens": k,
                                        "temperature": 0, "ignore_eos": True, "cache": False,
                                        "return_token_ids": True}, timeout=120)
    assert c.status == 200, c.body
    got = c.json()["choices"][0]["token_ids"]
    assert got == ids[n_prompt:], ("not the recompute", got, ids[n_prompt:])
    return j


def same_logprobs(s, mid, state_ids):
    """A completion continuing a stored state (found by its tokens, read back from disk) has
    the logprobs of its recompute, bit for bit: greedy tokens alone do not tell a random
    model's KV from zeros, its logprobs do."""
    prompt = state_ids + [5, 6, 7]
    out = []
    for cache in (True, False):
        r = s.post("/v1/completions", body={"model": mid, "prompt": prompt, "max_tokens": 4,
                                            "temperature": 0, "ignore_eos": True,
                                            "logprobs": 1, "cache": cache}, timeout=120)
        assert r.status == 200, r.body
        j = r.json()
        got = (j["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        assert got == (len(state_ids) if cache else 0), (j["usage"], len(state_ids), cache)
        out.append(j["choices"][0]["logprobs"]["token_logprobs"])
    assert out[0] == out[1], ("the resumed state is not the recomputed one", out)


def restored(s):
    """(entries, dropped) of each "checkpoints restored" line the controller logged."""
    log = open(os.path.join(s.data, "controld.log"), errors="replace").read()
    return re.findall(r"checkpoints restored from disk entries=(\d+) dropped=(\d+)", log)


def cached(j):
    return j["usage"]["input_tokens_details"]["cached_tokens"]


def restart_all(s, between=None):
    s.kill_worker("w0", signal.SIGKILL)
    s.kill_controller(signal.SIGKILL)
    if between is not None:
        between()
    s.start_controller()
    s.start_worker("w0")
    s.wait(lambda: s.get("/ready").status == 200, "ready after the restart")


def test_kv_tails():
    model = gen_qwen35(os.path.join(TMP.name, "tiny-qwen35"), 23)
    mid = os.path.basename(model)
    if KEEP:
        shutil.rmtree(KEEP, ignore_errors=True)
        os.makedirs(KEEP)
    with Stack(model=model, slots=4, data=KEEP) as s:
        s.start_controller()
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready")
        # 1. a long first turn (its image mostly KV), then short ones, each on disk before the
        # next: the first written whole, the rest as tails of the one before
        turns = [turn(s, mid, "Read the following text and remember it. " * 12)]
        w = wait_writes(s, 1)
        assert w["image"][0] == 1 and w["tail"][0] == 0, w
        whole = w["image"][1]
        for t in range(2, 7):
            j = turn(s, mid, f"turn {t}: go on", prev=turns[-1])
            assert cached(j) == len(turns[-1]["state_token_ids"]), (j["usage"], t)
            turns.append(j)
            w = wait_writes(s, t)
        assert w["image"][0] == 1 and w["tail"][0] == 5, w
        # each tail: the fixed part and ~10 tokens of KV, against ~470 tokens in the whole image
        assert w["tail"][1] / 5 < whole / 2, (w, whole)
        # 2. the warm copies die with the worker: turn 7 resumes turn 6 from the chain on disk
        s.kill_worker("w0", signal.SIGKILL)
        s.start_worker("w0")
        s.wait(lambda: s.get("/ready").status == 200, "ready after the worker's restart")
        same_logprobs(s, mid, turns[-1]["state_token_ids"])
        j = turn(s, mid, "turn 7: after the worker died", prev=turns[-1])
        assert cached(j) == len(turns[-1]["state_token_ids"]), j["usage"]
        turns.append(j)
        w = wait_writes(s, 7)
        assert w["image"][0] == 1 and w["tail"][0] == 6, w  # (a tail of the chain read back)
        # 3. both die (nothing flushed): the chain is read back and continues
        restart_all(s)
        m = restored(s)
        assert m and int(m[-1][0]) >= 7 and m[-1][1] == "0", m
        same_logprobs(s, mid, turns[-1]["state_token_ids"])
        j = turn(s, mid, "turn 8: after both died", prev=turns[-1])
        assert cached(j) == len(turns[-1]["state_token_ids"]), j["usage"]
        turns.append(j)
        w = wait_writes(s, 1)  # (this controller's counters)
        assert w["tail"][0] == 1, w
        # 4. the chain's root (its whole image, the largest record) goes while both are down:
        # the tails that needed it are dropped at the restart, and the turn is recomputed
        def drop_root():
            blobs = os.path.join(s.data, "blobs")
            files = [os.path.join(blobs, f) for f in os.listdir(blobs)]
            os.unlink(max(files, key=os.path.getsize))
        restart_all(s, between=drop_root)
        j = turn(s, mid, "turn 9: after the chain broke", prev=turns[-1])
        assert cached(j) < len(turns[-1]["state_token_ids"]), j["usage"]
        log = open(os.path.join(s.data, "controld.log"), errors="replace").read()
        assert "checkpoint not loaded" in log, "the broken chain was not noticed"
        turns.append(j)
        turns.append(turn(s, mid, "turn 10: go on", prev=turns[-1]))
        # 5. bases and tails cleared together: the conversation goes on, recomputed
        r = s.post("/admin/cache/clear")
        assert r.status == 200, r.body
        j = turn(s, mid, "turn 11: after the cache was cleared", prev=turns[-1])
        assert cached(j) < len(turns[-1]["state_token_ids"]), j["usage"]


if __name__ == "__main__":
    sys.exit(run_tests([test_kv_tails]))
