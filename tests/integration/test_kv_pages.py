"""Admission by KV pages on a hybrid-linear model (GDN + attention layers).

One CPU worker with a small KV pool (--kv-pages 6, 16 tokens a page):
- /admin/workers, /v1/models and /metrics report the pool;
- a request whose context (prompt + max_tokens) can never fit the pool is
  refused at admission with 400 context_length_exceeded naming the pool;
- concurrent requests that together need more pages than the pool wait for
  pages (none fails) and produce what they produce alone;
- a cached state holds the pages of its context; a request that needs them
  evicts it (LRU, like slot pressure), and the state later continues
  bit-identically from its warm/cold copy;
- the pages gauges move with what slots hold.
"""
import json
import os
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(__file__))
from wkvm_harness import Stack, run_tests  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.normpath(os.path.join(HERE, "..", "reference"))
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
TMP = tempfile.TemporaryDirectory(prefix="wkvm-kv-pages-")
PAGES = 6


def make_model():
    d = os.path.join(TMP.name, "tiny-gdn-hybrid")
    subprocess.run([PY, os.path.join(REF, "gen_gdn.py"), "--out", d, "--seed", "21",
                    "--layers", "4", "--attn-layers", "1,3", "--attn-heads", "4",
                    "--attn-kv-heads", "2"], check=True, capture_output=True, timeout=120)
    return d


def gauge(s, name):
    text = s.get("/metrics").body.decode()
    for line in text.splitlines():
        if line.startswith(name + '{worker="w0"}'):
            return float(line.split()[-1])
    return None


def complete(s, name, prompt, n):
    r = s.post("/v1/completions", body={"model": name, "prompt": prompt, "max_tokens": n,
                                        "temperature": 0, "ignore_eos": True,
                                        "return_token_ids": True})
    return r


def test_kv_pages():
    model = make_model()
    name = os.path.basename(model)
    with Stack(model=model, slots=4) as s:
        s.start_controller()
        s.start_worker("w0", extra=["--kv-pages", str(PAGES)])
        s.wait(lambda: s.get("/ready").status == 200, "ready")
        m = s.get("/v1/models").json()["data"][0]
        pt = m["kv_page_tokens"]
        assert m["kv_bytes_per_token"] > 0 and pt > 0, m
        w = s.workers_list()[0]
        assert w["kv"]["pages_total"] == PAGES and w["kv"]["page_tokens"] == pt, w
        s.wait(lambda: gauge(s, "wkvm_kv_pages_total") == PAGES, "pages total gauge")
        assert gauge(s, "wkvm_kv_pages_free") == PAGES

        # Larger than the pool: refused at admission.
        prompt = list(range(5, 13))
        r = complete(s, name, prompt, PAGES * pt)
        assert r.status == 400, (r.status, r.body)
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded", err
        assert "KV pool" in err["message"] and str(PAGES) in err["message"], err

        # Concurrent requests wait for pages: each needs 3 of the 6 pages.
        n3 = 3 * pt - len(prompt)
        prompts = [[p + k for p in prompt] for k in range(4)]
        want = []
        for p in prompts:
            r = complete(s, name, p, n3)
            assert r.status == 200, r.body
            want.append(r.json()["choices"][0]["token_ids"])
        got = [None] * len(prompts)

        def run(i):
            r = complete(s, name, prompts[i], n3)
            got[i] = (r.status, r.json()["choices"][0]["token_ids"] if r.status == 200
                      else r.body)

        th = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in th:
            t.start()
        for t in th:
            t.join(timeout=300)
        for i in range(len(prompts)):
            assert got[i] == (200, want[i]), (i, got[i])
        s.wait(lambda: gauge(s, "wkvm_kv_pages_free") == PAGES, "all pages back")

        # A cached state holds the pages of its context ...
        P = list(range(30, 30 + pt + 4))  # two pages
        Q = [40, 41, 42]
        base = complete(s, name, P + Q, 12)
        assert base.status == 200, base.body
        base = base.json()["choices"][0]["token_ids"]
        r = s.post("/v1/states", body={"model": name, "name": "st", "prompt_ids": P})
        assert r.status == 201, r.body
        s.wait(lambda: gauge(s, "wkvm_kv_pages_free") == PAGES - 2, "a state holds 2 pages")
        w = s.workers_list()[0]
        assert w["kv"]["pages_reserved"] == 2, w
        # ... and is evicted when a request needs them (5 pages: only 4 are free).
        r = complete(s, name, prompt, 5 * pt - len(prompt))
        assert r.status == 200, r.body
        assert len(r.json()["choices"][0]["token_ids"]) == 5 * pt - len(prompt)
        s.wait(lambda: gauge(s, "wkvm_kv_pages_free") == PAGES, "pages back after the request")
        # The evicted state continues bit-identically.
        r = s.post("/v1/states/st@1/generate", body={"prompt_ids": Q, "max_tokens": 12,
                                                     "temperature": 0, "ignore_eos": True,
                                                     "return_token_ids": True})
        assert r.status == 200, r.body
        assert r.json()["choices"][0]["token_ids"] == base, (r.json(), base)


if __name__ == "__main__":
    rc = run_tests([test_kv_pages])
    TMP.cleanup()
    sys.exit(rc)
