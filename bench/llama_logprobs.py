#!/usr/bin/python3
"""wkvm against llama.cpp's own numbers on the SAME GGUF file: next-token
argmax and the log-probabilities llama-server reports (a manual check; CI has
no llama.cpp build).

wkvm-infer runs the directory holding the file (a link to it) with
--generate N after the prompt ids, then the prompt plus those ids with
--logits-out (its log-softmax at each of the N positions). llama-server
(bench/peer-setup.sh's build, -t 2) is asked, for the prompt and each prefix
of wkvm's continuation, for one greedy token (temperature 0) and the
log-probabilities of its top-K candidates (n_probs K, before sampling).
Prints per position both argmaxes, llama.cpp's top-two gap and the max
|logprob difference| over its candidates; then the worst.

llama.cpp's CPU Q8_0 matmul quantizes the activations to Q8_0 blocks too (its
vec_dot_q8_0_q8_0), wkvm's multiplies float32 activations, so the two are
not expected to agree in the last digits: this says how far apart they are.

usage: llama_logprobs.py --build BUILD --peer PEER --gguf FILE --vocab V
                         [--prompt 1,2,3 | --prompt-len 24 --seed S] [--n 16] [--k 8]
Stdlib + numpy (/usr/bin/python3).
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np


def llama(a, prompts):
    """Per prompt: (llama.cpp's greedy next id, {id: logprob} of its top k candidates)."""
    srv = os.path.join(a.peer, "llama.cpp", "build", "bin", "llama-server")
    port = 47600 + os.getpid() % 300
    log = open(os.path.join(tempfile.gettempdir(), "llama-logprobs-%d.log" % port), "wb")
    proc = subprocess.Popen([srv, "-m", a.gguf, "--host", "127.0.0.1", "--port", str(port),
                             "-t", "2", "-tb", "2", "-np", "1", "-c", "1024", "--no-webui"],
                            stdout=log, stderr=subprocess.STDOUT)
    out = []
    try:
        t0 = time.time()
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.time() - t0 > 600:
                raise SystemExit("llama-server did not start; see " + log.name)
            time.sleep(0.5)
        for prompt in prompts:
            body = {"prompt": prompt, "n_predict": 1, "temperature": 0.0, "n_probs": a.k,
                    "post_sampling_probs": False, "cache_prompt": False, "ignore_eos": True}
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            c.request("POST", "/completion", body=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json"})
            r = json.loads(c.getresponse().read())
            steps = r.get("completion_probabilities")
            if not steps:
                raise SystemExit("llama-server gave no completion_probabilities: %r"
                                 % str(r)[:400])
            out.append((int(steps[0]["id"]),
                        {int(t["id"]): float(t["logprob"]) for t in steps[0]["top_logprobs"]}))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    return out


def wkvm(a, prompt, tmp):
    d = os.path.join(tmp, "m")
    os.makedirs(d)
    os.symlink(os.path.abspath(a.gguf), os.path.join(d, "model.gguf"))
    exe = os.path.join(a.build, "tools", "wkvm-infer")
    toks = ",".join(map(str, prompt))
    p = subprocess.run([exe, "--model", d, "--tokens", toks, "--generate", str(a.n),
                        "--threads", "2"], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit("wkvm-infer: %s" % p.stderr[-600:])
    ids = [int(x) for x in p.stdout.split()[-a.n:]]
    lp = os.path.join(tmp, "l")
    toks = ",".join(map(str, prompt + ids[:-1]))
    p = subprocess.run([exe, "--model", d, "--tokens", toks, "--logits-out", lp, "--threads",
                        "2"], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit("wkvm-infer: %s" % p.stderr[-600:])
    lg = np.fromfile(lp, dtype="<f4").astype(np.float64).reshape(-1, a.vocab)
    lg = lg[len(prompt) - 1:]
    m = lg.max(axis=1, keepdims=True)
    return ids, lg - m - np.log(np.exp(lg - m).sum(axis=1, keepdims=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--peer", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--vocab", type=int, required=True, help="the model's vocab_size (rows)")
    ap.add_argument("--prompt", default=None)
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--k", type=int, default=8)
    a = ap.parse_args()
    if a.prompt:
        prompt = [int(x) for x in a.prompt.split(",")]
    else:  # ids above 255: the byte tokens' neighbours may be control tokens in a random vocab
        prompt = [int(x) for x in np.random.default_rng(a.seed).integers(256, a.vocab - 16,
                                                                          a.prompt_len)]
    tmp = tempfile.mkdtemp(prefix="wkvm-llama-lp-")
    try:
        wids, wlp = wkvm(a, prompt, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # llama.cpp on the prompt and on each prefix of wkvm's greedy continuation (one
    # request each, prompt not cached): both engines' distributions on the same sequence
    steps = llama(a, [prompt + wids[:i] for i in range(a.n)])
    print("prompt %d ids; wkvm's greedy continuation %s" % (len(prompt), wids))
    worst, same = 0.0, 0
    for i, (lid, cand) in enumerate(steps):
        d = max(abs(wlp[i, t] - lp) for t, lp in cand.items())
        top = sorted(cand.values(), reverse=True)
        same += lid == wids[i]
        print("step %2d: llama.cpp id %4d, wkvm id %4d, max |dlogprob| over llama.cpp's top %d "
              "%.2e (its top-two gap %.2e)" % (i, lid, wids[i], len(cand), d,
                                               top[0] - top[1] if len(top) > 1 else 0))
        worst = max(worst, d)
    print("worst |dlogprob| %.2e; next-token argmax equal at %d of %d positions"
          % (worst, same, len(steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
