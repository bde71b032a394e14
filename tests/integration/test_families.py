"""The generic state-operation suite, run against every model family.

For RWKV-7 (wkvm-mkmodel), Mamba2 (tests/reference/gen_mamba2.py) and Gated
DeltaNet (tests/reference/gen_gdn.py) small random models, a controller and
two CPU workers are started and every state operation must continue
bit-identically to the uninterrupted run (greedy and seeded sampling):
create + generate, hibernate/resume (warm), fork, export/import, a stream
migrated mid-way to the other worker, a worker restart (cold, from the
blob) and a controller restart. /v1/models and /admin/workers must report
the family and the state bytes per slot, and a chat turn must work through
the family's tokenizer (tokenizer.json for Mamba2/GDN, the World vocab for
RWKV-7).

"gdn-hybrid" is a Gated DeltaNet with two full-attention layers
(gen_gdn.py --attn-layers): its slot images grow with context (recurrent
bytes + KV per token), and every operation must carry the KV too;
migration goes over NNG with the reason "hybrid state (KV pages)".
"qwen3_5-hybrid" is a Qwen3.5 checkpoint (tests/reference/gen_qwen35.py:
transformers' multimodal layout, gated attention in layers 1 and 3, BF16
shards, a vision tower and MTP layer that are skipped), served through the
same Gated DeltaNet backend with its KV in the pool.
"nemotron_h-hybrid" is a Nemotron-H checkpoint (tests/reference/
gen_nemotron_h.py: Mamba2, attention, squared-ReLU MLP and MoE layers, the
same layer-list backend).
"granite_h-hybrid" is a Granite-4.0-H checkpoint (tests/reference/
gen_granite_h.py: Mamba2 layers and one attention layer, experts with the
shared MLP, Granite's multipliers), the same layer-list backend.

WKVM_FAMILIES=rwkv7,mamba2 limits the families (all seven by default).
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import MKMODEL, Stack, http, run_tests  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.normpath(os.path.join(HERE, "..", "reference"))
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
TMP = tempfile.TemporaryDirectory(prefix="wkvm-families-")
P = [5, 6, 7, 8, 9, 10, 11, 12, 200, 201, 17]
Q = [40, 41, 42]
SAMPLING = [dict(temperature=0), dict(temperature=0.8, top_p=0.95, seed=1234)]
# Long enough to be still running when migrated: the slot is found running ~10 tokens in
# and migrated at once; the rest (~1 s at the tiny RWKV-7's 4000 tokens/s) runs on the other
# worker. The hybrids stop at half their KV pool (~3000 tokens) the same way.
N_STREAM = 4000


def make_model(family):
    d = os.path.join(TMP.name, "tiny-" + family)
    if family == "rwkv7":
        cmd = [MKMODEL, "--out", d, "--layers", "2", "--embd", "64", "--head-size", "16",
               "--ffn", "128", "--vocab", "512", "--seed", "11"]
    elif family == "mamba2":
        cmd = [PY, os.path.join(REF, "gen_mamba2.py"), "--out", d, "--seed", "12"]
    elif family == "gdn":
        cmd = [PY, os.path.join(REF, "gen_gdn.py"), "--out", d, "--seed", "13"]
    elif family == "gdn-hybrid":
        # Hybrid-linear: GDN layers with full-attention layers 1 and 3 (a paged KV pool).
        cmd = [PY, os.path.join(REF, "gen_gdn.py"), "--out", d, "--seed", "14", "--layers", "4",
               "--attn-layers", "1,3", "--attn-heads", "4", "--attn-kv-heads", "2"]
    elif family == "qwen3_5-hybrid":
        # Qwen3.5 (transformers' qwen3_5 layout, multimodal: the text model under
        # model.language_model.*, a vision tower and MTP layer skipped), layers 1 and 3
        # gated attention over the paged KV pool, BF16 sharded.
        cmd = [PY, os.path.join(REF, "gen_qwen35.py"), "--out", d, "--seed", "15", "--layers",
               "4", "--interval", "2", "--multimodal", "--dtype", "bf16", "--format", "sharded"]
    elif family == "nemotron_h-hybrid":
        # Nemotron-H (transformers' nemotron_h names, backbone.*): Mamba2 with 2 groups,
        # attention without RoPE over the KV pool, a squared-ReLU MLP and a MoE layer.
        cmd = [PY, os.path.join(REF, "gen_nemotron_h.py"), "--out", d, "--seed", "16",
               "--pattern", "M*M-ME"]
    elif family == "granite_h-hybrid":
        # Granite-4.0-H (tests/reference/gen_granite_h.py: the hub's granitemoehybrid
        # names): Mamba2 layers, attention in layer 3 without position encoding over the
        # paged KV pool, a mixture of experts with the shared MLP, Granite's multipliers.
        cmd = [PY, os.path.join(REF, "gen_granite_h.py"), "--out", d, "--seed", "16",
               "--experts", "4"]
    else:
        raise ValueError(family)
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    return d


class Fam:
    def __init__(self, family):
        self.hybrid = family.endswith("-hybrid")
        self.family = family[:-len("-hybrid")] if self.hybrid else family
        self.dir = make_model(family)
        self.name = os.path.basename(self.dir)


def up(s, workers=2):
    s.start_controller()
    for i in range(workers):
        s.start_worker(f"w{i}")
    s.wait(lambda: s.get("/ready").status == 200, "ready")


def baseline(s, f, tokens, n=12, **samp):
    body = {"model": f.name, "prompt": tokens, "max_tokens": n, "return_token_ids": True,
            "ignore_eos": True}
    body.update(samp)
    r = s.post("/v1/completions", body=body)
    assert r.status == 200, r.body
    return r.json()["choices"][0]["token_ids"]


def gen(s, ref, prompt_ids, n=12, **samp):
    body = {"max_tokens": n, "return_token_ids": True, "ignore_eos": True,
            "prompt_ids": prompt_ids}
    body.update(samp)
    r = s.post(f"/v1/states/{ref}/generate", body=body)
    assert r.status == 200, r.body
    return r.json()["choices"][0]["token_ids"]


def check(s, ref, want, what):
    for x in SAMPLING:
        got = gen(s, ref, Q, **x)
        assert got == want[json.dumps(x)], (what, ref, x, got, want[json.dumps(x)])


def running_slot(s):
    for sl in s.get("/admin/slots").json()["slots"]:
        if sl["state"] == "running":
            return sl
    return None


def migrate_stream(s, f, samp):
    n = N_STREAM
    if f.hybrid:  # the context must fit the KV pool (on both workers): half of it
        kv = s.workers_list()[0]["kv"]
        n = min(n, kv["pages_total"] * kv["page_tokens"] // 2 - 8)
    b = {"model": f.name, "prompt": [7, 8, 9, 10], "max_tokens": n, "ignore_eos": True,
         "return_token_ids": True}
    b.update(samp)
    want = s.post("/v1/completions", body=b).json()["choices"][0]["token_ids"]
    req = urllib.request.Request(s.url + "/v1/completions", method="POST",
                                 data=json.dumps(dict(b, stream=True)).encode(),
                                 headers={"Content-Type": "application/json"})
    st = urllib.request.urlopen(req, timeout=120)
    head = [st.readline() for _ in range(4)]
    s.wait(lambda: running_slot(s) is not None, "a running slot")
    sl = running_slot(s)
    assert sl is not None, "the stream ended before it could be migrated"
    dst = "w1" if sl["worker"] == "w0" else "w0"
    r = s.post(f"/admin/slots/{sl['id']}/migrate", body={"to": dst})
    assert r.status == 200 and r.json()["result"] == "committed", r.body
    if f.hybrid:
        assert r.json().get("transport_reason") == "hybrid state (KV pages)", r.body
    ids = []
    for line in head + list(st):
        line = line.strip()
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            ev = json.loads(line[6:])
            assert "error" not in ev, ev
            ids += ev["choices"][0].get("token_ids", [])
    assert ids == want, (f.family, samp, len(ids), len(want))


def run_family(f):
    with Stack(model=f.dir, slots=3, workers_expected=2) as s:
        up(s)
        # What one slot of this model is.
        models = s.get("/v1/models").json()["data"]
        assert models[0]["id"] == f.name and models[0]["family"] == f.family, models
        ws = s.get("/admin/workers").json()["workers"]
        sb = ws[0]["model"]["state_bytes"]
        assert ws[0]["model"]["family"] == f.family and sb > 0, ws
        assert models[0]["state_bytes_per_slot"] == sb, models
        # Hybrid models: a slot also holds KV per token of context (0 for recurrent ones).
        kvb = models[0].get("kv_bytes_per_token", 0)
        assert (kvb > 0) == f.hybrid, models
        assert ws[0].get("kv_bytes_per_token", 0) == kvb, ws
        # A chat turn through the family's tokenizer.
        r = s.post("/v1/chat/completions", body={
            "model": f.name, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Hello, world! Tell me a story."}]})
        assert r.status == 200, r.body
        c = r.json()
        assert c["usage"]["prompt_tokens"] > 0 and c["usage"]["completion_tokens"] > 0, c

        want = {json.dumps(x): baseline(s, f, P + Q, **x) for x in SAMPLING}
        r = s.post("/v1/states", body={"model": f.name, "name": "base", "prompt_ids": P})
        assert r.status == 201, r.body
        check(s, "base@1", want, "hot")
        r = s.post("/v1/states/base@1/hibernate")
        assert r.status == 200 and r.json()["tier"] in ("warm", "cold"), r.body
        check(s, "base@1", want, "hibernated")
        assert s.post("/v1/states/base@1/resume").status == 200
        check(s, "base@1", want, "resumed")
        kids = s.post("/v1/states/base@1/fork", body={"name": "kid", "count": 2}).json()["data"]
        for k in kids:
            check(s, k["id"], want, "fork")
        blob = http("GET", s.url + "/v1/states/base@1/export")
        assert blob.status == 200 and blob.body[:8] == b"WKVMSTAT", blob.status
        imp = http("POST", s.url + "/v1/states/import?name=again", body=blob.body)
        assert imp.status == 201, imp.body
        check(s, imp.json()["id"], want, "import")
        # A running stream moves to the other worker mid-way.
        for x in SAMPLING:
            migrate_stream(s, f, x)
        # Worker restarts: the state runs from its blob.
        s.kill_worker("w0")
        s.kill_worker("w1")
        s.start_worker("w0")
        s.start_worker("w1")
        s.wait(lambda: s.get("/ready").status == 200, "ready after worker restarts")
        check(s, "base@1", want, "after worker restart")
        # Controller restart.
        s.kill_controller()
        s.start_controller()
        s.wait(lambda: s.get("/ready").status == 200, "ready after controller restart")
        check(s, "base@1", want, "after controller restart")
        check(s, "again@1", want, "import after controller restart")


def families():
    env = os.environ.get("WKVM_FAMILIES")
    return env.split(",") if env else ["rwkv7", "mamba2", "gdn", "gdn-hybrid", "qwen3_5-hybrid",
                                       "nemotron_h-hybrid", "granite_h-hybrid"]


def make_tests():
    tests = []
    for fam in families():
        def t(fam=fam):
            run_family(Fam(fam))
        t.__name__ = "test_family_" + fam
        tests.append(t)
    return tests


if __name__ == "__main__":
    rc = run_tests(make_tests())
    TMP.cleanup()
    sys.exit(rc)
