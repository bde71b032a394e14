"""The Responses API on durable states, through the official OpenAI Python SDK.

A controller (with API keys) and one CPU worker serve a random-weight model
whose tokens are raw single bytes. CLIENT_SCRIPT runs in the SDK venv of
test_openai_client.py in phases around a SIGKILL of the worker and of the
controller (nothing flushed: the stored states were written through), then
restarts under another model name and under a short TTL:

  a  a 10-turn conversation by previous_response_id, turns 1..6: every turn's
     cached_tokens is the previous state's token count and its prompt starts
     with those tokens; the output equals a recompute of the same token ids
     (/v1/completions, cache off, temperature 0); a fork (two continuations
     of one response, each continued once more); streaming (create(stream=True)
     and responses.stream()) reassembled equal to the blocking response;
     retrieve / input_items / delete; another key's id is 404; bad inputs 4xx.
  b  after both died: turns 7..10 continue, the first of them from the stored
     state on disk (cached_tokens as before); wkvmctl lists and deletes.
  c  a previous id of another model is 400.   d  expired ids are 404, counted; a fresh
     one lives its whole TTL.
  r  reasoning items (test_chat_template's Qwen3.5).   t  function calls and forced calls
     (tool_choice required / named: constrained decoding) with Qwen3.5-4B.jinja.

Costs a few seconds: 2 layers, 64 wide, at most 8 tokens a reply.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import BUILD, MKMODEL, Stack  # noqa: E402
from test_openai_client import SYSTEM_PYTHON, ensure_venv, venv_python  # noqa: E402,F401
import test_golden  # noqa: E402

MID = "tiny"
ALICE = "sk-alice-000000001"
BOB = "sk-bob-00000000002"
OPS = "sk-ops-00000000003"
CAROL = "sk-carol-0000000004"  # only the golden shapes: an owner without checkpoints

CLIENT_SCRIPT = r'''
import json
import sys
import time
import traceback

import openai

URL, MID, PHASE, STATE = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
ALICE, BOB = sys.argv[5], sys.argv[6]
MODEL, TEMPLATE_EXE = (sys.argv[7], sys.argv[8]) if len(sys.argv) > 8 else (None, None)
client = openai.OpenAI(base_url=URL + "/v1", api_key=ALICE, max_retries=0, timeout=60)
bob = openai.OpenAI(base_url=URL + "/v1", api_key=BOB, max_retries=0, timeout=60)
MAXT = 8
EXT = {"return_token_ids": True}
try:
    st = json.load(open(STATE))
except OSError:
    st = {}


def turn(prev, text, **kw):
    """One blocking turn at temperature 0, with the state's token ids (extension)."""
    r = client.responses.create(model=MID, input=text, previous_response_id=prev,
                                max_output_tokens=MAXT, temperature=0, extra_body=EXT, **kw)
    assert r.object == "response" and r.id.startswith("resp_"), r
    assert r.status in ("completed", "incomplete"), r.status
    assert r.model == MID and len(r.output) == 1, r
    msg = r.output[0]
    assert msg.type == "message" and msg.role == "assistant", msg
    assert msg.content[0].type == "output_text", msg
    assert r.output_text == msg.content[0].text, r
    u = r.usage
    assert 0 < u.output_tokens <= MAXT, u
    assert u.total_tokens == u.input_tokens + u.output_tokens, u
    ids = r.model_extra["state_token_ids"]
    n_prompt = r.model_extra["prompt_token_count"]
    assert n_prompt == u.input_tokens, (n_prompt, u)
    assert len(ids) >= n_prompt, (len(ids), n_prompt)
    return r, ids, n_prompt


def recompute(ids, n_prompt, want):
    """The same prompt tokens computed from scratch give the same reply."""
    c = client.completions.create(model=MID, prompt=ids[:n_prompt], max_tokens=MAXT,
                                  temperature=0, stop=["\n\n"], extra_body={"cache": False})
    assert c.usage.prompt_tokens_details is None or \
        (c.usage.prompt_tokens_details.cached_tokens or 0) == 0, c.usage
    assert c.choices[0].text == want, (c.choices[0].text, want)


def resumed(r, ids, n_prompt, prev_ids, fork=False):
    """r continued the previous state exactly: cached = all its tokens, prompt starts with them.
    A fork's second branch may reuse more (a checkpoint the first branch left past them)."""
    cached = r.usage.input_tokens_details.cached_tokens
    assert cached == len(prev_ids) or (fork and len(prev_ids) <= cached < n_prompt), \
        (r.usage, len(prev_ids))
    assert ids[:len(prev_ids)] == prev_ids, "the prompt does not start with the previous state"
    assert n_prompt - len(prev_ids) < 40, (n_prompt, len(prev_ids))


def conversation(first, last):
    prev = st.get("prev")
    prev_ids = st.get("prev_ids")
    for t in range(first, last + 1):
        r, ids, n_prompt = turn(prev, f"turn {t}: tell me more",
                                instructions="Be brief." if t > 0 else None)
        if prev is None:
            assert r.usage.input_tokens_details.cached_tokens == 0, r.usage
        else:
            resumed(r, ids, n_prompt, prev_ids)
            assert r.previous_response_id == prev, r
        recompute(ids, n_prompt, r.output_text)
        prev, prev_ids = r.id, ids
        st["turns"] = st.get("turns", []) + [r.id]
    st["prev"], st["prev_ids"] = prev, prev_ids


def conversation_a():
    conversation(1, 6)


def conversation_b():
    assert len(st["turns"]) == 6, st
    conversation(7, 10)
    assert len(st["turns"]) == 10
    # the whole chain is there: the last response's input items hold every turn
    items = client.responses.input_items.list(st["prev"], order="asc", limit=100)
    texts = [i.content[0].text for i in items.data]
    assert len(texts) == 19, texts
    assert texts[0] == "turn 1: tell me more" and texts[-1] == "turn 10: tell me more", texts


def fork():
    base, base_ids, _ = turn(None, "a root to fork", instructions="Be brief.")
    # two continuations of one response at once: each from its own copy of the state
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as ex:
        futs = [ex.submit(turn, base.id, f"go {w}", instructions="Be brief.")
                for w in ("left", "right")]
        branches = [f.result() for f in futs]
    kids = []
    for r, ids, n_prompt in branches:
        resumed(r, ids, n_prompt, base_ids, fork=True)
        recompute(ids, n_prompt, r.output_text)
        kids.append((r, ids))
    # each branch continues from its own state: neither disturbed the other
    for r, ids in kids:
        g, gids, n_prompt = turn(r.id, "and after that?", instructions="Be brief.")
        resumed(g, gids, n_prompt, ids)
        recompute(gids, n_prompt, g.output_text)


def fallback():
    """Other instructions re-render the history differently: no exact resume, the longest
    prefix checkpoint (here none past the start), and still the recomputed output."""
    base, base_ids, _ = turn(None, "fallback root", instructions="Be brief.")
    r, ids, n_prompt = turn(base.id, "next", instructions="Be verbose.")
    assert r.usage.input_tokens_details.cached_tokens < len(base_ids), r.usage
    assert ids[:len(base_ids)] != base_ids
    recompute(ids, n_prompt, r.output_text)
    # the history is the API's all the same: the previous input and output come first
    items = client.responses.input_items.list(r.id, order="asc")
    assert [i.role for i in items.data] == ["user", "assistant", "user"], items
    assert items.data[1].content[0].text == base.output_text, items


def streaming():
    base, base_ids, _ = turn(None, "stream root")
    want, _, _ = turn(base.id, "stream me")
    stream = client.responses.create(model=MID, input="stream me", previous_response_id=base.id,
                                     max_output_tokens=MAXT, temperature=0, stream=True)
    events = list(stream)
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"], types
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done",
                          "response.completed" if want.status == "completed"
                          else "response.incomplete"], types
    assert [e.sequence_number for e in events] == list(range(len(events))), events
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == want.output_text, (text, want.output_text)
    done = events[-1].response
    assert done.output_text == want.output_text and done.id != want.id, done
    assert done.usage.output_tokens == want.usage.output_tokens, (done.usage, want.usage)
    assert done.usage.input_tokens == want.usage.input_tokens, (done.usage, want.usage)
    # (a fork of base again: it reuses at least base's state, more when want left checkpoints)
    assert done.usage.input_tokens_details.cached_tokens >= \
        want.usage.input_tokens_details.cached_tokens, (done.usage, want.usage)
    # the SDK's stream manager accumulates the same response (its final response needs a
    # response.completed event: a reply cut by max_output_tokens ends response.incomplete,
    # as OpenAI's does)
    with client.responses.stream(model=MID, input="stream me", previous_response_id=base.id,
                                 max_output_tokens=MAXT, temperature=0) as s:
        evs = list(s)
        deltas = "".join(e.delta for e in evs if e.type == "response.output_text.delta")
        last = evs[-1].response
        if evs[-1].type == "response.completed":
            last = s.get_final_response()
    assert deltas == want.output_text and last.output_text == want.output_text, \
        (deltas, last.output_text)
    # a streamed response is stored too and continues like any other
    nxt, _, _ = turn(done.id, "after the stream")
    assert nxt.usage.input_tokens_details.cached_tokens > 0, nxt.usage


def retrieve_delete():
    r, _, _ = turn(None, "keep me", metadata={"k": "v"}, user="u1")
    g = client.responses.retrieve(r.id)
    assert g.id == r.id and g.output_text == r.output_text and g.metadata == {"k": "v"}, g
    assert g.usage.input_tokens == r.usage.input_tokens, (g.usage, r.usage)
    items = client.responses.input_items.list(r.id)
    assert [i.role for i in items.data] == ["user"], items
    assert items.data[0].content[0].text == "keep me", items
    # another key: the id does not exist for it, whatever it asks
    for call in (lambda: bob.responses.retrieve(r.id),
                 lambda: bob.responses.input_items.list(r.id),
                 lambda: bob.responses.delete(r.id)):
        try:
            call()
            raise AssertionError("another key saw the response")
        except openai.NotFoundError:
            pass
    try:
        bob.responses.create(model=MID, input="x", previous_response_id=r.id, max_output_tokens=2)
        raise AssertionError("another key continued the response")
    except openai.NotFoundError as e:
        assert e.body["code"] == "previous_response_not_found", e.body
    client.responses.delete(r.id)
    try:
        client.responses.retrieve(r.id)
        raise AssertionError("deleted response still there")
    except openai.NotFoundError:
        pass
    try:
        client.responses.create(model=MID, input="x", previous_response_id=r.id,
                                max_output_tokens=2)
        raise AssertionError("deleted response continued")
    except openai.NotFoundError as e:
        assert e.body["code"] == "previous_response_not_found", e.body
    # offered tools: the model answers with a message (it never calls one yet)
    tools = [{"type": "function", "name": "f", "description": "d",
              "parameters": {"type": "object", "properties": {}}}]
    r, _, _ = turn(None, "use a tool if you like", tools=tools, tool_choice="auto")
    assert r.output[0].type == "message" and r.tools[0].name == "f", r
    # store: false answers but keeps nothing
    r, _, _ = turn(None, "forget me", store=False)
    try:
        client.responses.retrieve(r.id)
        raise AssertionError("store: false response kept")
    except openai.NotFoundError:
        pass


def wait_done(r, timeout=60):
    """Polls a background response until it left queued / in_progress."""
    import time
    deadline = time.time() + timeout
    while r.status in ("queued", "in_progress"):
        assert time.time() < deadline, f"background response still {r.status}"
        time.sleep(0.05)
        r = client.responses.retrieve(r.id)
    return r


def long_background(text):
    """A background response that runs for a long while ('a' biased up: no turn end)."""
    r = client.responses.create(model=MID, input=text, background=True, max_output_tokens=20000,
                                temperature=0, extra_body={"logit_bias": {"98": 100}})
    assert r.background is True and r.status == "queued", r
    assert r.output == [] and r.usage is None, r
    return r


def background():
    """background: true answers at once (queued), GET polls it to its end, the reply is the
    blocking one's, and the stored state continues like any other; cancel stops one."""
    want, _, _ = turn(None, "in the background")
    r = client.responses.create(model=MID, input="in the background", background=True,
                                max_output_tokens=MAXT, temperature=0)
    assert r.background is True and r.status == "queued", r
    r = wait_done(r)
    assert r.status == want.status and r.output_text == want.output_text, (r, want)
    assert r.usage.input_tokens == want.usage.input_tokens, (r.usage, want.usage)
    assert r.usage.output_tokens == want.usage.output_tokens, (r.usage, want.usage)
    nxt, ids, n_prompt = turn(r.id, "and after the background?")
    assert nxt.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens, nxt.usage
    recompute(ids, n_prompt, nxt.output_text)
    for call, err in ((lambda: client.responses.cancel(r.id), openai.BadRequestError),
                      (lambda: client.responses.cancel(want.id), openai.BadRequestError)):
        try:
            call()
            raise AssertionError("cancelled a finished or foreground response")
        except err:
            pass
    # cancel: the generation stops within a step; stored as cancelled, no output, no state
    import time
    big = long_background("go on and on")
    try:
        bob.responses.cancel(big.id)
        raise AssertionError("another key cancelled the response")
    except openai.NotFoundError:
        pass
    t0 = time.time()
    c = client.responses.cancel(big.id)
    took = time.time() - t0
    assert c.status == "cancelled" and c.output == [] and c.background is True, c
    assert took < 5, took
    g = client.responses.retrieve(big.id)
    assert g.status == "cancelled" and g.output == [], g
    assert client.responses.cancel(big.id).status == "cancelled"  # (again: the same answer)
    # a follow-up of a cancelled response: its history is its input alone
    f = client.responses.create(model=MID, input="after the cancel", previous_response_id=big.id,
                                max_output_tokens=2)
    items = client.responses.input_items.list(f.id, order="asc")
    assert [i.content[0].text for i in items.data] == ["go on and on", "after the cancel"], items
    # a running one cannot be continued yet
    run = long_background("still running")
    try:
        client.responses.create(model=MID, input="x", previous_response_id=run.id,
                                max_output_tokens=2)
        raise AssertionError("continued a running response")
    except openai.BadRequestError as e:
        assert e.body["param"] == "previous_response_id", e.body
    assert client.responses.cancel(run.id).status == "cancelled"
    print(f"cancel answered in {took * 1e3:.0f} ms", flush=True)


def background_stream():
    """background with stream: typed events from response.created (queued) and
    response.queued to response.completed, reassembled equal to the blocking answer; a reader
    that went away resumes by GET ?stream=true&starting_after=N with exactly the events after
    N (while it runs, and after); cancel ends the stream and stores it cancelled."""
    import time
    want, _, _ = turn(None, "streamed in the background")
    events = list(client.responses.create(model=MID, input="streamed in the background",
                                          background=True, stream=True,
                                          max_output_tokens=MAXT, temperature=0))
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.queued", "response.in_progress"], types
    assert [e.sequence_number for e in events] == list(range(len(events))), types
    assert events[0].response.status == "queued" and events[0].response.background, events[0]
    last = events[-1]
    assert last.type == want.status.replace("completed", "response.completed").replace(
        "incomplete", "response.incomplete"), types
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == want.output_text == last.response.output_text, (text, want.output_text)
    rid = last.response.id
    g = client.responses.retrieve(rid)
    assert g.status == want.status and g.output_text == want.output_text, g
    again = list(client.responses.retrieve(rid, stream=True, starting_after=3))
    assert [e.model_dump() for e in again] == [e.model_dump() for e in events[4:]], again
    # a long one: the first reader leaves after a few deltas, a second resumes while it runs
    kw = dict(model=MID, input="a long background stream", background=True, stream=True,
              max_output_tokens=400, temperature=0, extra_body={"logit_bias": {"98": 100}})
    first, s1 = [], client.responses.create(**kw)
    for e in s1:
        first.append(e)
        if sum(x.type == "response.output_text.delta" for x in first) >= 3:
            break
    s1.close()
    rid = first[0].response.id
    assert client.responses.retrieve(rid).status in ("queued", "in_progress")
    rest = list(client.responses.retrieve(rid, stream=True,
                                          starting_after=first[-1].sequence_number))
    allev = first + rest
    assert [e.sequence_number for e in allev] == list(range(len(allev))), \
        [e.type for e in allev]
    assert allev[-1].type in ("response.completed", "response.incomplete"), allev[-1].type
    text = "".join(e.delta for e in allev if e.type == "response.output_text.delta")
    assert text == client.responses.retrieve(rid).output_text, "the resumed stream differs"
    # cancel while a reader follows: its stream ends, the response is stored cancelled
    s2 = client.responses.create(**dict(kw, max_output_tokens=20000))
    seen = []
    t0 = None
    for e in s2:
        seen.append(e)
        if e.type == "response.output_text.delta" and t0 is None:
            t0 = time.time()
            assert client.responses.cancel(seen[0].response.id).status == "cancelled"
    took = time.time() - t0
    assert seen[-1].type not in ("response.completed", "response.failed"), seen[-1].type
    assert client.responses.retrieve(seen[0].response.id).status == "cancelled"
    for bad in (dict(stream=True, starting_after=-1), dict(stream=False, starting_after=2)):
        try:
            list(client.responses.retrieve(rid, **bad)) if bad["stream"] else \
                client.responses.retrieve(rid, **bad)
            raise AssertionError(f"accepted {bad}")
        except openai.BadRequestError as e:
            assert e.body["param"] == "starting_after", e.body
    try:
        list(client.responses.retrieve(want.id, stream=True))  # (a foreground one: no log)
        raise AssertionError("streamed a response that has no event log")
    except openai.BadRequestError as e:
        assert e.body["param"] == "stream", e.body
    try:
        list(bob.responses.retrieve(rid, stream=True))
        raise AssertionError("another key read the stream")
    except openai.NotFoundError:
        pass
    print(f"background stream: {len(events)} events; resumed after {len(first)}; "
          f"the cancelled stream ended {time.time() - t0:.2f} s after the cancel "
          f"({took:.2f})", flush=True)


def orphan_start():
    """A background response running when the controller is SIGKILLed (phase c reads it)."""
    st["orphan"] = long_background("cut by a SIGKILL").id


def orphan_read():
    """The controller that ran it is gone: it reads as failed, and a cancel is refused."""
    g = client.responses.retrieve(st["orphan"])
    assert g.status == "failed" and "controller stopped" in g.error.message, g
    try:
        client.responses.cancel(st["orphan"])
        raise AssertionError("cancelled a failed response")
    except openai.BadRequestError:
        pass


def bad_inputs():
    cases = [
        (dict(input=[{"type": "function_call_output", "call_id": "c", "output": "x"}]),
         "input[0].type"),
        (dict(input=[{"type": "bogus", "role": "user", "content": "x"}]), "input[0].type"),
        (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
         "input[0].content[0].type"),
        (dict(input=[{"role": "tool", "content": "x"}]), "input[0].role"),
        (dict(input="x", text={"format": {"type": "json_object"}}), "text.format"),
        (dict(input="x", extra_body={"frobnicate": 1}), "frobnicate"),
        (dict(input="x", tools=[{"type": "function", "name": "f", "parameters": {}}],
              tool_choice="required"), "tool_choice"),
        (dict(input="x", max_output_tokens=0), "max_output_tokens"),
        (dict(input="x", temperature=3), "temperature"),
        (dict(input=[]), "input"),
        (dict(input="x", reasoning={"effort": "huge"}), "reasoning.effort"),
        (dict(input="x", reasoning={"summary": "long"}), "reasoning.summary"),
        (dict(input="x", reasoning={"generate_summary": 1}), "reasoning.generate_summary"),
        (dict(input="x", background=True, store=False), "background"),
        (dict(input=[{"type": "reasoning", "summary": [], "encrypted_content": "e"}]),
         "input[0].encrypted_content"),
        (dict(input="x", extra_body={"logit_bias": {"512": 1}}), "logit_bias"),
    ]
    for kw, param in cases:
        try:
            client.responses.create(model=MID, **kw)
            raise AssertionError(f"accepted {kw}")
        except openai.BadRequestError as e:
            assert e.body["param"] == param, (kw, e.body)
    for pid in ("resp_0123456789abcdef", "nope"):
        try:
            client.responses.create(model=MID, input="x", previous_response_id=pid)
            raise AssertionError(f"accepted {pid}")
        except openai.NotFoundError as e:
            assert e.body["code"] == "previous_response_not_found", e.body
            assert e.body["param"] == "previous_response_id", e.body
    try:
        client.responses.create(model="other", input="x")
        raise AssertionError("accepted another model")
    except openai.NotFoundError:
        pass


def evicted_state():
    """The previous state's checkpoint is gone (an operator cleared the cache): the response
    still continues, from the longest checkpoint left, with the recomputed output."""
    r, ids, n_prompt = turn(st["prev"], "after the cache was cleared",
                            instructions="Be brief.")
    assert r.usage.input_tokens_details.cached_tokens < len(st["prev_ids"]), r.usage
    assert ids[:len(st["prev_ids"])] == st["prev_ids"]
    recompute(ids, n_prompt, r.output_text)


def other_model():
    try:
        client.responses.create(model=MID, input="x", previous_response_id=st["prev"],
                                max_output_tokens=2)
        raise AssertionError("continued a response of another model")
    except openai.BadRequestError as e:
        assert e.body["param"] == "previous_response_id", e.body


def ttl():
    """--responses-ttl 2: a fresh response lives its 2 s, then it and the old ones answer 404."""
    import time
    try:
        client.responses.create(model=MID, input="x", previous_response_id=st["turns"][1],
                                max_output_tokens=2)
        raise AssertionError("continued an expired response")
    except openai.NotFoundError as e:
        assert e.body["code"] == "previous_response_not_found", e.body
        assert "expired" in e.body["message"], e.body
    # still there just after its created_at second + 2 (a TTL of 2 s lives 2 s, to the ms;
    # it lived 1 to 2 s: a flake under load), checked when that is well before t0 + 2 (it
    # is stored after t0: when created_at is t0's second, t0 late in it; a first stored
    # response takes the quota's drop of the expired ones, so the timed one is stored at once)
    client.responses.create(model=MID, input="first", max_output_tokens=1)
    while abs(time.time() % 1 - 0.6) > 0.02:
        time.sleep(0.005)
    t0 = time.time()
    r = client.responses.create(model=MID, input="short-lived", max_output_tokens=2)
    t1 = time.time()  # (stored before this)
    assert client.responses.retrieve(r.id).id == r.id
    late = r.created_at + 2.02
    if late + 0.4 < t0 + 2:
        time.sleep(max(0.0, late - time.time()))
        assert client.responses.retrieve(r.id).id == r.id, "gone before its TTL"
    time.sleep(max(0.0, t1 + 2.1 - time.time()))
    for rid in (r.id, st["prev"]):
        try:
            client.responses.retrieve(rid)
            raise AssertionError("an expired response is still there")
        except openai.NotFoundError:
            pass


def quota():
    """--max-responses-per-user 3: the fourth stored response of a user is 429; store: false
    and a deletion make way."""
    ids = [bob.responses.create(model=MID, input=f"q{i}", max_output_tokens=2).id
           for i in range(3)]
    try:
        bob.responses.create(model=MID, input="one too many", max_output_tokens=2)
        raise AssertionError("a fourth stored response was accepted")
    except openai.RateLimitError as e:
        assert e.body["code"] == "quota_exceeded", e.body
    bob.responses.create(model=MID, input="not kept", max_output_tokens=2, store=False)
    bob.responses.delete(ids[0])
    bob.responses.create(model=MID, input="room again", max_output_tokens=2)


# Phase r: a random Qwen3.5 with a Qwen3-style template (test_chat_template's model; the
# prompt leaves the reply thinking, added tokens <|im_start|> 508, <|im_end|> 509, <think> 510,
# </think> 511). MODEL is its directory, TEMPLATE_EXE renders a request as the server must.
THINK_END, IM_END = 511, 509


def tj_decoder():
    tj = json.load(open(MODEL + "/tokenizer.json", encoding="utf-8"))
    added = {t["id"]: t["content"].encode() for t in tj["added_tokens"]}
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    u2b = {chr(c): b for b, c in zip(bs, cs)}
    piece = {i: bytes(u2b[ch] for ch in p) for p, i in tj["model"]["vocab"].items()
             if i not in added}
    return lambda ids: b"".join(added.get(i) or piece[i] for i in ids).decode("utf-8", "replace")


def render(messages, kwargs=None):
    import subprocess
    req = {"messages": messages}
    if kwargs:
        req["chat_template_kwargs"] = kwargs
    return subprocess.run([TEMPLATE_EXE, "--model", MODEL, "-"], input=json.dumps(req).encode(),
                          capture_output=True, timeout=60, check=True).stdout.decode()


def think_turn(prev=None, text="Say something about state slots.", bias=None, **kw):
    extra = {"return_token_ids": True, "frequency_penalty": 2, "presence_penalty": 2}
    if bias is not None:
        extra["logit_bias"] = {str(THINK_END): bias}
    return client.responses.create(model=MID, input=text, instructions="Be brief.",
                                   previous_response_id=prev, max_output_tokens=10,
                                   temperature=0, extra_body=extra, **kw)


def gen_ids(r):
    """The reply's token ids as the state consumed them (the eos it stopped on dropped)."""
    ids = r.model_extra["state_token_ids"][r.model_extra["prompt_token_count"]:]
    return ids[:-1] if ids and ids[-1] == IM_END else ids


def reasoning():
    """The reply split at the think markers: a reasoning item (reasoning_text) then the message,
    each the decoded ids either side of </think>; streamed as response.reasoning_text.* events
    that reassemble to the same; a follow-up carries it and equals a recompute."""
    decode = tj_decoder()
    for tenth in range(0, 80, 5):  # the smallest bias that closes the thinking mid-reply
        r = think_turn(bias=tenth / 10)
        ids = gen_ids(r)
        if THINK_END in ids[1:]:
            break
    else:
        raise AssertionError("no bias made the model close its thinking mid-reply")
    n_prompt = r.model_extra["prompt_token_count"]
    want = render([{"role": "system", "content": "Be brief."},
                   {"role": "user", "content": "Say something about state slots."}])
    assert decode(r.model_extra["state_token_ids"][:n_prompt]) == want, want
    k = ids.index(THINK_END)
    assert [o.type for o in r.output] == ["reasoning", "message"], r.output
    rs, msg = r.output
    assert rs.id.startswith("rs_") and rs.summary == [] and rs.status == "completed", rs
    assert [p.type for p in rs.content] == ["reasoning_text"], rs
    assert rs.content[0].text == decode(ids[:k]), (rs, ids)
    assert r.output_text == msg.content[0].text == decode(ids[k + 1:]), (r.output_text, ids)
    assert r.usage.output_tokens_details.reasoning_tokens == k + 1, (r.usage, k)
    # streamed: the reasoning item at output_index 0, the message at 1
    events = list(think_turn(bias=tenth / 10, stream=True))
    types = [e.type for e in events]
    assert types[:5] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added",
                         "response.reasoning_text.delta"], types
    assert [e.sequence_number for e in events] == list(range(len(events))), types
    rtext = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    ttext = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert rtext == rs.content[0].text and ttext == r.output_text, ((rtext, ttext), r.output)
    done = [e for e in events if e.type == "response.reasoning_text.done"]
    assert len(done) == 1 and done[0].text == rtext and done[0].output_index == 0, done
    assert all(e.output_index == 1 for e in events if e.type == "response.output_text.delta")
    assert types.index("response.reasoning_text.done") < types.index("response.output_text.delta")
    last = events[-1].response
    assert [o.type for o in last.output] == ["reasoning", "message"], last.output
    assert last.output[0].content[0].text == rtext and last.output_text == ttext, last.output
    # the SDK's stream manager accumulates it (a reply cut by max_output_tokens ends incomplete)
    with client.responses.stream(model=MID, input="Say something about state slots.",
                                 instructions="Be brief.", max_output_tokens=10, temperature=0,
                                 extra_body={"logit_bias": {str(THINK_END): tenth / 10},
                                             "frequency_penalty": 2,
                                             "presence_penalty": 2}) as s:
        evs = list(s)
    assert [o.type for o in evs[-1].response.output] == ["reasoning", "message"], evs[-1]
    # a follow-up: the template drops earlier reasoning, so the prefix index resumes the end
    # of the first turn's user message, and the reply equals a recompute of the same ids
    f = think_turn(prev=r.id, text="And the KV pages?")
    cached = f.usage.input_tokens_details.cached_tokens
    assert 0 < cached < len(r.model_extra["state_token_ids"]), f.usage
    n_f = f.model_extra["prompt_token_count"]
    hist = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Say something about state slots."},
            {"role": "assistant", "content": r.output_text,
             "reasoning_content": rs.content[0].text},
            {"role": "user", "content": "And the KV pages?"}]
    assert decode(f.model_extra["state_token_ids"][:n_f]) == render(hist), "follow-up prompt"
    c = client.completions.create(model=MID, prompt=f.model_extra["state_token_ids"][:n_f],
                                  max_tokens=10, temperature=0,
                                  extra_body={"cache": False, "return_token_ids": True,
                                              "frequency_penalty": 2, "presence_penalty": 2})
    cids = c.choices[0].model_extra["token_ids"]
    fids = f.model_extra["state_token_ids"][n_f:]
    assert fids == cids[:len(fids)] and (len(fids) == len(cids) or fids[-1] == IM_END), \
        (fids, cids)
    # the same history sent as items (manual context: the reasoning item given back) renders
    # the same prompt
    items = [{"role": "user", "content": "Say something about state slots."},
             rs.model_dump(exclude_none=True), msg.model_dump(exclude_none=True),
             {"role": "user", "content": "And the KV pages?"}]
    m = client.responses.create(model=MID, input=items, instructions="Be brief.",
                                max_output_tokens=2, extra_body={"return_token_ids": True})
    assert m.model_extra["state_token_ids"][:m.model_extra["prompt_token_count"]] == \
        f.model_extra["state_token_ids"][:n_f], "items render differently"
    got = client.responses.input_items.list(m.id, order="asc")
    assert [i.type for i in got.data] == ["message", "reasoning", "message", "message"], got
    assert got.data[1].content[0].text == rs.content[0].text, got.data[1]
    print(f"reasoning split at token {k} of {len(ids)} (bias {tenth / 10}); follow-up reused "
          f"{cached} of {f.usage.input_tokens}", flush=True)


def reasoning_effort():
    """effort "none" reaches a template that reads enable_thinking (no reasoning item); an
    effort the template cannot read is echoed and changes nothing."""
    decode = tj_decoder()
    r = think_turn(reasoning={"effort": "none"})
    n = r.model_extra["prompt_token_count"]
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Say something about state slots."}]
    want = render(msgs, {"enable_thinking": False})
    assert decode(r.model_extra["state_token_ids"][:n]) == want, want
    assert want.endswith("<think>\n\n</think>\n\n"), want
    assert r.reasoning.effort == "none" and [o.type for o in r.output] == ["message"], r
    assert r.usage.output_tokens_details.reasoning_tokens == 0, r.usage
    h = think_turn(reasoning={"effort": "high", "summary": "auto"})
    assert decode(h.model_extra["state_token_ids"][:h.model_extra["prompt_token_count"]]) == \
        render(msgs), "effort high changed a template that does not read it"
    assert h.reasoning.effort == "high" and h.output[0].type == "reasoning", h
    # no summarizer: the summary asked for is echoed, the item's summary is the empty list
    # (the reasoning itself is the item's content)
    assert h.reasoning.summary == "auto" and h.output[0].summary == [], h
    assert h.output[0].content[0].type == "reasoning_text" and h.output[0].content[0].text, h
    g = client.responses.retrieve(h.id)
    assert g.reasoning.summary == "auto" and g.output[0].summary == [], g
    assert think_turn().reasoning.summary is None


# Phase t: test_tool_calls' model (added tokens <|im_start|> 505, <|im_end|> 506, <think> 507,
# </think> 508, CALL 509: one whole get_weather call in Qwen3.5's XML format) with llama.cpp's
# Qwen3.5-4B.jinja (--chat-template).
T_IM_END, T_CALL = 506, 509
TOOLS_R = [{"type": "function", "name": "get_weather", "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"},
                "metric": {"type": "boolean"}}, "required": ["city"]}}]


def tool_turn(prev=None, items="What is the weather in Paris?", bias=None, tools=TOOLS_R,
              max_output_tokens=4, **kw):
    extra = {"return_token_ids": True, "frequency_penalty": 2, "presence_penalty": 2}
    if bias is not None:
        extra["logit_bias"] = bias
    return client.responses.create(model=MID, input=items, instructions="Be brief.",
                                   previous_response_id=prev, tools=tools,
                                   reasoning={"effort": "none"},
                                   max_output_tokens=max_output_tokens, temperature=0,
                                   extra_body=extra, **kw)


def round_trip(r, out, **kw):
    """out (function_call_output items) sent by previous_response_id after r: it resumes r's
    exact state (cached_tokens all of it) and its reply equals a recompute of the same ids."""
    f = tool_turn(prev=r.id, items=out, **kw)
    n_f = f.model_extra["prompt_token_count"]
    prev_ids = r.model_extra["state_token_ids"]
    cached = f.usage.input_tokens_details.cached_tokens
    assert f.model_extra["state_token_ids"][:len(prev_ids)] == prev_ids, "not the exact state"
    assert cached == len(prev_ids), (f.usage, len(prev_ids))
    c = client.completions.create(model=MID, prompt=f.model_extra["state_token_ids"][:n_f],
                                  max_tokens=4, temperature=0,
                                  extra_body={"cache": False, "return_token_ids": True,
                                              "frequency_penalty": 2, "presence_penalty": 2})
    cids = c.choices[0].model_extra["token_ids"]
    fids = f.model_extra["state_token_ids"][n_f:]
    assert fids == cids[:len(fids)], (fids, cids)
    return f, cached


def schema_valid(v, s, path="$"):
    """v against the JSON schema subset the tools declare (type, properties, required, no
    undeclared property); raises on the first violation."""
    types = {"object": dict, "string": str, "boolean": bool, "array": list}
    t = s.get("type")
    if t == "integer":
        assert isinstance(v, int) and not isinstance(v, bool), (path, v)
    elif t is not None:
        assert isinstance(v, types[t]), (path, t, v)
    if t == "object":
        props = s.get("properties", {})
        assert set(v) <= set(props), (path, "undeclared", set(v) - set(props))
        assert set(s.get("required", [])) <= set(v), (path, "missing", s.get("required"))
        for k, x in v.items():
            schema_valid(x, props[k], f"{path}.{k}")


def forced_call(bias, **kw):
    """A forced call, blocking and streamed: the same single function_call item, its
    arguments valid for the offered function's schema; returns the blocking response."""
    r = tool_turn(bias=bias, tools=TOOLS_F, max_output_tokens=64, **kw)
    assert r.status == "completed", (r.status, r.output)
    assert [o.type for o in r.output] == ["function_call"], r.output
    fc = r.output[0]
    schema = {t["name"]: t["parameters"] for t in TOOLS_F}
    schema_valid(json.loads(fc.arguments), schema[fc.name])
    assert r.tool_choice == kw["tool_choice"] or r.tool_choice.name == kw["tool_choice"]["name"]
    events = list(tool_turn(bias=bias, tools=TOOLS_F, max_output_tokens=64, stream=True, **kw))
    types = [e.type for e in events]
    assert "response.output_text.delta" not in types, types
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    last = events[-1]
    assert last.type == "response.completed" and args == fc.arguments and done == [args], types
    assert [(o.type, o.name, o.arguments) for o in last.response.output] == \
        [("function_call", fc.name, fc.arguments)], last.response.output
    assert last.response.model_extra["state_token_ids"] == r.model_extra["state_token_ids"]
    return r


# Forced calls: the bias favours the byte "x" over "t" over <|im_end|> over CALL (get_weather,
# city and days): unconstrained that is text; required is a call spelled out byte by byte ("x"
# and the end of text are not allowed before a call, and CALL is an added token: the grammar
# keeps control tokens out of argument values), "t" picking get_time over get_weather, then
# the end; a named get_time is spelled out the same way.
TOOLS_F = TOOLS_R + [{"type": "function", "name": "get_time", "description": "The time.",
                      "parameters": {"type": "object", "properties": {}}}]


def forced_calls():
    """tool_choice required and a named function through the chat route's constrained
    decoding: a schema-valid call where the unconstrained reply has none, streamed equal to
    blocking, and its output sent back by previous_response_id resumes the exact state."""
    t0 = time.time()
    vocab = json.load(open(MODEL + "/tokenizer.json", encoding="utf-8"))["model"]["vocab"]
    bias = {str(vocab["x"]): 100, str(vocab["t"]): 90, str(T_IM_END): 70, str(T_CALL): 60}
    free = tool_turn(bias=bias, tools=TOOLS_F)
    assert "function_call" not in [o.type for o in free.output], free.output
    r = forced_call(bias, tool_choice="required")
    gen = r.model_extra["state_token_ids"][r.model_extra["prompt_token_count"]:]
    assert T_CALL not in gen and gen[-1] == T_IM_END, gen
    assert r.output[0].name == "get_time" and r.output[0].arguments == "{}", r.output
    n = forced_call(bias, tool_choice={"type": "function", "name": "get_time"},
                    parallel_tool_calls=False)
    assert n.output[0].name == "get_time" and n.parallel_tool_calls is False, n.output
    out = [{"type": "function_call_output", "call_id": r.output[0].call_id, "output": "21"}]
    f, cached = round_trip(r, out, tools=TOOLS_F)  # (the same tools: the same prompt prefix)
    pattern = [dict(TOOLS_R[0], parameters={"type": "object", "properties": {
        "city": {"type": "string", "pattern": "^[A-Z]"}}})]
    for choice, tools, param in (
            ({"type": "function", "name": "nope"}, TOOLS_R, "tool_choice"),
            ({"type": "allowed_tools", "mode": "required", "tools": []}, TOOLS_R,
             "tool_choice.tools"),
            ({"type": "allowed_tools", "mode": "sometimes",
              "tools": [{"type": "function", "name": "get_weather"}]}, TOOLS_R,
             "tool_choice.mode"),
            ({"type": "allowed_tools", "mode": "auto",
              "tools": [{"type": "function", "name": "nope"}]}, TOOLS_R,
             "tool_choice.tools[0]"),
            ({"type": "allowed_tools", "mode": "auto",
              "tools": [{"type": "mcp", "server_label": "x"}]}, TOOLS_R,
             "tool_choice.tools[0]"),
            ("required", pattern, "tools")):  # (a construct the grammar does not enforce)
        try:
            tool_turn(tool_choice=choice, tools=tools)
            raise AssertionError(f"accepted {choice}")
        except openai.BadRequestError as e:
            assert e.body["param"] == param, e.body
    print(f"forced calls: required {r.output[0].arguments}, named get_time in "
          f"{n.usage.output_tokens} tokens; the round trip resumed {cached} tokens "
          f"({time.time() - t0:.1f} s)", flush=True)


CALL_BIAS = {}  # function_calls' bias that makes the unconstrained reply [CALL, eos]


def function_calls():
    """The reply parsed into a function_call item (call_id, name, arguments typed by the
    schema), streamed as response.function_call_arguments.* events; its output sent back by
    previous_response_id resumes the exact state and equals a recompute; the same turn sent as
    items renders the same prompt; tool_choice none keeps the call as text."""
    for tenth in range(0, 120, 5):  # the smallest lead of CALL over <|im_end|>: [CALL, eos]
        bias = {str(T_CALL): 100, str(T_IM_END): 100 - tenth / 10}
        r = tool_turn(bias=bias)
        ids = r.model_extra["state_token_ids"][r.model_extra["prompt_token_count"]:]
        if ids[:1] == [T_CALL] and T_CALL not in ids[1:] and r.status == "completed":
            break
    else:
        raise AssertionError("no bias made the model emit the call then stop")
    CALL_BIAS.update(bias, response=r)
    assert [o.type for o in r.output] == ["function_call"], r.output
    fc = r.output[0]
    assert fc.name == "get_weather" and fc.status == "completed", fc
    assert fc.id.startswith("fc_") and fc.call_id.startswith("call_"), fc
    assert fc.arguments == '{"city": "Paris", "days": 3}', fc
    assert r.tools[0].name == "get_weather" and r.reasoning.effort == "none", r
    # streamed: the same item, its arguments as delta events
    events = list(tool_turn(bias=bias, stream=True))
    types = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events))), types
    assert "response.output_text.delta" not in types, types
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [e.item.type for e in added] == ["function_call"], added
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert args == fc.arguments and len(done) == 1 and done[0].arguments == args, (args, done)
    last = events[-1]
    assert last.type == "response.completed", types
    assert [(o.type, o.name, o.arguments) for o in last.response.output] == \
        [("function_call", fc.name, fc.arguments)], last.response.output
    # the SDK's stream manager accumulates the call
    with client.responses.stream(model=MID, input="What is the weather in Paris?",
                                 instructions="Be brief.", tools=TOOLS_R,
                                 reasoning={"effort": "none"}, max_output_tokens=4,
                                 temperature=0, extra_body={"logit_bias": bias,
                                                            "frequency_penalty": 2,
                                                            "presence_penalty": 2}) as s:
        final = s.get_final_response()
    assert [(o.type, o.arguments) for o in final.output] == [("function_call", fc.arguments)], \
        final.output
    # the round trip: the tool's output by previous_response_id
    out = [{"type": "function_call_output", "call_id": fc.call_id, "output": '{"temp": 21}'}]
    f, cached = round_trip(r, out)
    n_f = f.model_extra["prompt_token_count"]
    items = client.responses.input_items.list(f.id, order="asc")
    assert [i.type for i in items.data] == ["message", "function_call",
                                            "function_call_output"], items
    assert items.data[1].call_id == fc.call_id and items.data[2].output == '{"temp": 21}', items
    # the same conversation as items (the call given back as the SDK returned it)
    m = client.responses.create(model=MID, instructions="Be brief.", tools=TOOLS_R,
                                reasoning={"effort": "none"}, max_output_tokens=2,
                                input=[{"role": "user", "content": "What is the weather in Paris?"},
                                       fc.model_dump(exclude_none=True)] + out,
                                extra_body={"return_token_ids": True})
    assert m.model_extra["state_token_ids"][:m.model_extra["prompt_token_count"]] == \
        f.model_extra["state_token_ids"][:n_f], "items render differently"
    # tool_choice none: the reply is not parsed, the call's text is the message
    t = tool_turn(bias=bias, tool_choice="none")
    assert [o.type for o in t.output] == ["message"] and "<tool_call>" in t.output_text, t.output
    assert t.tool_choice == "none", t
    print(f"function call (bias lead {tenth / 10}); the round trip resumed {cached} of "
          f"{f.usage.input_tokens} tokens", flush=True)


def allowed_calls():
    """tool_choice allowed_tools: every tool reaches the template (the prompt is tool_choice
    auto's), and a call may name only the listed functions: mode required constrains the reply
    to a call of one of them (where a named or plain required call would be get_weather), mode
    auto leaves the reply free and a call to another function text."""
    vocab = json.load(open(MODEL + "/tokenizer.json", encoding="utf-8"))["model"]["vocab"]
    # "w" makes a plain required call get_weather (a call is spelled byte by byte: CALL is an
    # added token, kept out of constrained replies), whose city "x"... runs past
    # max_output_tokens: that call comes back as text, which still names it
    bias = {str(vocab["x"]): 100, str(vocab["w"]): 90, str(T_IM_END): 70, str(T_CALL): 60}
    only_time = {"type": "allowed_tools", "mode": "required",
                 "tools": [{"type": "function", "name": "get_time"}]}
    a = tool_turn(bias=bias, tools=TOOLS_F, max_output_tokens=64, tool_choice=only_time)
    assert [(o.type, o.name) for o in a.output] == [("function_call", "get_time")], a.output
    assert a.tool_choice.model_dump() == only_time, a.tool_choice
    req = tool_turn(bias=bias, tools=TOOLS_F, max_output_tokens=64, tool_choice="required")
    named = req.output[0].name if req.output[0].type == "function_call" else req.output_text
    # (the constraint decided it)
    assert "get_weather" in named and "get_time" not in named, req.output
    n, ids = a.model_extra["prompt_token_count"], a.model_extra["state_token_ids"]
    assert ids[:n] == req.model_extra["state_token_ids"][:req.model_extra["prompt_token_count"]]
    events = list(tool_turn(bias=bias, tools=TOOLS_F, max_output_tokens=64, stream=True,
                            tool_choice=only_time))
    last = events[-1]
    assert last.type == "response.completed", [e.type for e in events]
    assert [(o.type, o.name, o.arguments) for o in last.response.output] == \
        [("function_call", "get_time", a.output[0].arguments)], last.response.output
    assert last.response.model_extra["state_token_ids"] == ids
    # mode auto: function_calls' bias makes the free reply a get_weather call
    cb = {k: v for k, v in CALL_BIAS.items() if k != "response"}
    free = CALL_BIAS["response"]
    weather = {"type": "allowed_tools", "mode": "auto",
               "tools": [{"type": "function", "name": "get_weather"}]}
    w = tool_turn(bias=cb, tool_choice=weather)
    assert [(o.type, o.arguments) for o in w.output] == \
        [("function_call", free.output[0].arguments)], w.output
    time_only = dict(weather, tools=[{"type": "function", "name": "get_time"}])
    t = tool_turn(bias=cb, tools=TOOLS_F, tool_choice=time_only)
    assert [o.type for o in t.output] == ["message"] and "<tool_call>" in t.output_text, t.output
    full = tool_turn(bias=cb, tools=TOOLS_F)
    assert t.model_extra["state_token_ids"] == full.model_extra["state_token_ids"], \
        "allowed_tools auto changed the prompt or the reply"
    assert [o.type for o in full.output] == ["function_call"], full.output
    st = list(tool_turn(bias=cb, tools=TOOLS_F, tool_choice=time_only, stream=True))
    text = "".join(e.delta for e in st if e.type == "response.output_text.delta")
    assert text == t.output_text and "response.function_call_arguments.delta" not in \
        [e.type for e in st], text


TESTS = {"a": [conversation_a, fork, fallback, streaming, retrieve_delete, bad_inputs,
               background, background_stream],
         "b": [conversation_b], "c": [other_model, quota, orphan_read], "d": [ttl],
         "e": [evicted_state, orphan_start],
         "r": [reasoning, reasoning_effort], "t": [function_calls, forced_calls, allowed_calls]}
for t in TESTS[PHASE]:
    try:
        t_0 = time.time()
        t()
        print(f"PASS {t.__name__} ({time.time() - t_0:.1f} s)", flush=True)
    except Exception as e:  # noqa: BLE001
        detail = "".join(traceback.format_exception(type(e), e, e.__traceback__)).strip()
        print(f"FAIL {t.__name__}: {detail[-2500:]}", flush=True)
json.dump(st, open(STATE, "w"))
'''


def golden_mask(v, key=None):
    """test_golden's masking plus this API's varying fields (times, generated deltas, hex)."""
    if isinstance(v, dict):
        return {k: golden_mask(x, k) for k, x in v.items()}
    if isinstance(v, list):
        return [golden_mask(x) for x in v]
    if key in ("created_at", "expires_at"):
        assert isinstance(v, int) and abs(v - time.time()) < 86400 * 31, (key, v)
        return "<timestamp>"
    if key in ("item_id", "previous_response_id", "first_id", "last_id") and isinstance(v, str):
        return test_golden.HEX.sub("<hex>", v)
    if key == "delta" and isinstance(v, str):
        return "<text>"
    return v


def golden(name, r, status):
    """The HTTP status and the JSON shape of r against tests/fixtures/golden/NAME.json."""
    assert r.status == status, f"{name}: HTTP {r.status}, expected {status}: {r.body[:300]!r}"
    test_golden.check_value(name, golden_mask(r.json()))


def golden_shapes(s):
    """The Responses shapes as files (WKVM_GOLDEN_REGEN=1 rewrites them; review the diff)."""
    hdr = {"Authorization": f"Bearer {CAROL}"}
    body = {"model": MID, "input": "hi", "max_output_tokens": 3, "temperature": 0,
            "instructions": "Be brief.", "metadata": {"k": "v"}}
    r = s.post("/v1/responses", body=body, headers=hdr)
    golden("responses_create", r, 200)
    rid = r.json()["id"]
    golden("responses_get", s.get(f"/v1/responses/{rid}", headers=hdr), 200)
    follow = dict(body, input=[{"role": "user", "content": [{"type": "input_text",
                                                              "text": "more"}]}],
                  previous_response_id=rid, stream=True)
    r = test_golden.http("POST", s.url + "/v1/responses", body=follow, headers=hdr)
    assert r.status == 200, r.body
    events = []
    for block in r.body.decode().split("\n\n"):
        lines = block.split("\n")
        if len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "):
            ev = json.loads(lines[1][6:])
            assert ev["type"] == lines[0][7:], (lines[0], ev["type"])
            events.append(ev)
    test_golden.check_value("responses_stream", golden_mask(events))
    last = events[-1]["response"]["id"]
    golden("responses_input_items", s.get(f"/v1/responses/{last}/input_items?order=asc",
                                          headers=hdr), 200)
    golden("responses_error_param", s.post("/v1/responses", body=dict(body, frob=1),
                                           headers=hdr), 400)
    golden("responses_error_previous", s.post("/v1/responses", body=dict(
        body, previous_response_id="resp_00"), headers=hdr), 404)
    golden("responses_deleted", test_golden.http("DELETE", f"{s.url}/v1/responses/{rid}",
                                                 headers=hdr), 200)


def main():
    t_start = time.time()
    for exe in ("controld/wkvm-controld", "workerd/wkvm-workerd", "tools/wkvm-mkmodel"):
        if not os.access(os.path.join(BUILD, exe), os.X_OK):
            print(f"FAIL setup: {exe} is not built in {BUILD}")
            print("0 passed, 1 failed")
            return 1
    try:
        venv = ensure_venv()
    except AssertionError as e:
        print(f"FAIL venv: {e}")
        print("0 passed, 1 failed")
        return 1
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="wkvm-responses-") as tmp:
        model = os.path.join(tmp, MID)
        subprocess.run([MKMODEL, "--out", model, "--layers", "2", "--embd", "64", "--head-size",
                        "16", "--ffn", "128", "--vocab", "512", "--seed", "7"], check=True,
                       capture_output=True, timeout=60)
        script = os.path.join(tmp, "client.py")
        with open(script, "w") as f:
            f.write(CLIENT_SCRIPT)
        keys = os.path.join(tmp, "keys")
        with open(keys, "w") as f:
            f.write(f"{ALICE} alice\n{BOB} bob\n{OPS} ops admin\n{CAROL} carol\n")
        os.chmod(keys, 0o600)
        state = os.path.join(tmp, "state.json")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PYTHON"))}
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        base = ["--api-keys", keys]
        with Stack(model=model, slots=4, extra_ctl=base) as s:

            def run(phase):
                nonlocal passed, failed
                r = subprocess.run([venv_python(venv), script, s.url, MID, phase, state, ALICE,
                                    BOB], capture_output=True, text=True, timeout=300, env=env)
                n = 0
                for line in r.stdout.splitlines():
                    print(line, flush=True)
                    if line.startswith("PASS "):
                        passed += 1
                        n += 1
                    elif line.startswith("FAIL "):
                        failed += 1
                        n += 1
                if r.returncode != 0 or n == 0:
                    failed += 1
                    print(f"FAIL client phase {phase}: exit {r.returncode}\n{r.stderr[-3000:]}")

            def restart(extra=(), sig=signal.SIGTERM):
                s.kill_controller(sig)
                s.extra_ctl = base + list(extra)
                s.start_controller()
                s.wait(lambda: s.get("/ready").status == 200, "ready after restart")

            try:
                s.start_controller()
                s.start_worker("w0")
                s.wait(lambda: s.get("/ready").status == 200, "ready")
                run("a")
                try:
                    golden_shapes(s)
                    passed += 1
                    print("PASS golden_shapes", flush=True)
                except AssertionError as e:
                    failed += 1
                    print(f"FAIL golden_shapes: {e}")
                m = s.get("/metrics", headers={"Authorization": f"Bearer {OPS}"}).body.decode()
                forks = [ln for ln in m.splitlines()
                         if ln.startswith("wkvm_responses_forks_total ")]
                misses = [ln for ln in m.splitlines()
                          if ln.startswith('wkvm_responses_misses_total{reason="not_found"}')]
                if not forks or float(forks[0].split()[-1]) < 2 or not misses:
                    failed += 1
                    print(f"FAIL fork/miss metrics: {forks} {misses}")
                # the worker dies (its warm copies with it), then the controller (SIGKILL both:
                # nothing is flushed; the stored states were written through)
                s.kill_worker("w0")
                s.start_worker("w0")
                restart(sig=signal.SIGKILL)
                run("b")
                m = s.get("/metrics", headers={"Authorization": f"Bearer {OPS}"}).body.decode()
                # (counters of this controller's life: phase b only)
                for series in ("wkvm_responses_stored_total ",
                               'wkvm_responses_resumes_total{result="exact"} '):
                    v = [ln for ln in m.splitlines() if ln.startswith(series)]
                    if not v or float(v[0].split()[-1]) < 4:
                        failed += 1
                        print(f"FAIL metrics: {series}{v}")
                listing = s.get("/admin/responses?owner=alice",
                                headers={"Authorization": f"Bearer {OPS}"})
                if listing.status != 200 or len(listing.json()["data"]) < 10:
                    failed += 1
                    print(f"FAIL admin list: {listing.status} {listing.body[:300]}")
                else:
                    passed += 1
                    print("PASS admin_list", flush=True)
                # wkvmctl lists and deletes them (an admin key)
                ctl = [os.path.join(BUILD, "tools", "wkvmctl"), "--url", s.url, "--key", OPS]
                victim = json.load(open(state))["turns"][0]
                out = subprocess.run(ctl + ["responses", "--owner", "alice"], capture_output=True,
                                     text=True, timeout=30)
                gone = subprocess.run(ctl + ["responses", "delete", victim], capture_output=True,
                                      text=True, timeout=30)
                again = subprocess.run(ctl + ["responses", "delete", victim],
                                       capture_output=True, text=True, timeout=30)
                bob = subprocess.run(ctl + ["responses", "--owner", "bob"], capture_output=True,
                                     text=True, timeout=30)
                if (out.returncode != 0 or victim not in out.stdout or gone.returncode != 0
                        or again.returncode == 0 or victim in bob.stdout or "resp_" in bob.stdout):
                    failed += 1
                    print(f"FAIL wkvmctl responses: {out.returncode} {out.stdout[:400]}"
                          f"{out.stderr[:400]} / {gone.returncode} {gone.stderr[:300]} / "
                          f"{again.returncode} / {bob.stdout[:300]}")
                else:
                    passed += 1
                    print("PASS wkvmctl_responses", flush=True)
                # an operator clears alice's checkpoints: her responses continue all the same
                s.post("/admin/cache/clear?owner=alice",
                       headers={"Authorization": f"Bearer {OPS}"})
                run("e")
                # served under another name, the stored ids belong to another model
                # (SIGKILL: phase e left a background response running; c reads it failed)
                restart(["--served-model-name", "tiny-b", "--max-responses-per-user", "3"],
                        sig=signal.SIGKILL)
                r = subprocess.run([venv_python(venv), script, s.url, "tiny-b", "c", state, ALICE,
                                    BOB], capture_output=True, text=True, timeout=120, env=env)
                print(r.stdout, end="", flush=True)
                passed += r.stdout.count("PASS ")
                failed += r.stdout.count("FAIL ") + (r.returncode != 0)
                # a short TTL: expired responses answer 404, the sweep counts evictions
                restart(["--responses-ttl", "2", "--max-responses-per-user", "3"])
                run("d")
                ops = {"Authorization": f"Bearer {OPS}"}
                left = s.get("/admin/responses", headers=ops).json()["data"]
                m = s.get("/metrics", headers=ops).body.decode()
                ev = [ln for ln in m.splitlines()
                      if ln.startswith("wkvm_responses_evictions_total")]
                if left or not ev or float(ev[0].split()[-1]) < 10:
                    failed += 1
                    print(f"FAIL ttl sweep: left={len(left)} {ev}")
                else:
                    passed += 1
                    print(f"PASS ttl_sweep ({ev[0]})", flush=True)
                # a clean shutdown (SIGTERM) stops a running background response: failed
                hdr = {"Authorization": f"Bearer {ALICE}"}
                r = s.post("/v1/responses", headers=hdr, body={
                    "model": MID, "input": "stopped by a shutdown", "background": True,
                    "max_output_tokens": 20000, "temperature": 0, "logit_bias": {"98": 100}})
                bid = r.json().get("id") if r.status == 200 else None
                t0 = time.time()
                restart()
                took = time.time() - t0
                g = s.get(f"/v1/responses/{bid}", headers=hdr) if bid else None
                gj = g.json() if g is not None and g.status == 200 else {}
                if (r.status != 200 or gj.get("status") != "failed" or
                        "shut down" not in (gj.get("error") or {}).get("message", "")):
                    failed += 1
                    print(f"FAIL shutdown_background: {r.status} {r.body[:200]} / {gj}")
                else:
                    passed += 1
                    print(f"PASS shutdown_background (restart {took:.1f} s)", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"FAIL stack: {e}")
                failed += 1
            if failed:
                print(s.tail())
        # phase r: reasoning items, on test_chat_template's Qwen3.5 with its own template
        try:
            import test_chat_template
            qmodel = os.path.join(tmp, test_chat_template.MID)
            os.makedirs(qmodel)
            test_chat_template.make_model(qmodel)
            with Stack(model=qmodel, slots=2) as s:
                s.start_controller()
                s.start_worker("w0")
                s.wait(lambda: s.get("/ready").status == 200, "ready (qwen35)")
                r = subprocess.run([venv_python(venv), script, s.url, test_chat_template.MID, "r",
                                    state, ALICE, BOB, qmodel, test_chat_template.TEMPLATE_EXE],
                                   capture_output=True, text=True, timeout=300, env=env)
                print(r.stdout, end="", flush=True)
                passed += r.stdout.count("PASS ")
                failed += r.stdout.count("FAIL ") + (r.returncode != 0)
                if r.returncode != 0 or "FAIL " in r.stdout:
                    print(r.stderr[-3000:])
                    print(s.tail())
        except Exception as e:  # noqa: BLE001
            print(f"FAIL qwen35 stack: {e}")
            failed += 1
        # phase t: function calls, on test_tool_calls' model with Qwen3.5-4B.jinja (skipped
        # without llama.cpp's template corpus, as test_tool_calls is)
        try:
            import glob
            import test_tool_calls
            sys.path.insert(0, test_tool_calls.REF)
            import jinja_corpus
            corpus = os.environ.get("WKVM_JINJA_CORPUS") or next(iter(sorted(glob.glob(
                os.path.join(jinja_corpus.CACHE, "llama.cpp-convert-*", "models", "templates")),
                reverse=True)), None)
            template = os.path.join(corpus, "Qwen3.5-4B.jinja") if corpus else ""
            if not os.path.exists(template):
                print("SKIP function_calls: no Qwen3.5-4B.jinja (deploy/install-gguf-converter)")
            else:
                tmodel = os.path.join(tmp, test_tool_calls.MID)
                os.makedirs(tmodel)
                test_tool_calls.make_model(tmodel)
                with Stack(model=tmodel, slots=2, extra_ctl=["--chat-template", template]) as s:
                    s.start_controller()
                    s.start_worker("w0")
                    s.wait(lambda: s.get("/ready").status == 200, "ready (tools)")
                    r = subprocess.run([venv_python(venv), script, s.url, test_tool_calls.MID,
                                        "t", state, ALICE, BOB, tmodel, ""],
                                       capture_output=True, text=True, timeout=300, env=env)
                    print(r.stdout, end="", flush=True)
                    passed += r.stdout.count("PASS ")
                    failed += r.stdout.count("FAIL ") + (r.returncode != 0)
                    if r.returncode != 0 or "FAIL " in r.stdout:
                        print(r.stderr[-3000:])
                        print(s.tail())
        except Exception as e:  # noqa: BLE001
            print(f"FAIL tools stack: {e}")
            failed += 1
    print(f"wall {time.time() - t_start:.1f}s")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
