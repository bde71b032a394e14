#!/usr/bin/python3
"""RWKV-7 parity: wkvm-infer (the C CPU backend) against the numpy reference.

For a matrix of small random models (several shapes, both checkpoint
conventions, F32 / BF16 / F16 weights, one .safetensors / two shards / .pth,
layer-0 value LoRA present or absent) plus one model written by
wkvm-mkmodel, this runner:
  1. generates the model into a temp dir (gen_model.py / wkvm-mkmodel),
  2. runs `wkvm-infer --model DIR --tokens ... --logits-out F` and the
     reference, and requires max|diff| / std(ref logits) < 1e-3 over every
     position (the reference widens the stored 16-bit weights exactly, so the
     same bound holds for BF16 / F16),
  3. requires `--generate 16` to give the reference's greedy ids,
  4. repeats 2 and 3 with `--prefill-chunk` 1, 7 and 64 (and, for 16-bit
     weights, with `--fp32`),
and finally checks that broken checkpoints (a tensor of the wrong shape, a
missing tensor) make wkvm-infer exit non-zero naming the tensor.

Exit 0 when everything passes, 1 on any failure, 77 (meson's skip) when
numpy or the wkvm-infer binary is missing, or (WKVM_PARITY_BACKEND=cuda)
when the build has no CUDA backend or no CUDA device answers. Environment: WKVM_BUILD_DIR (the
meson build dir; default: ../../build next to this file), WKVM_PARITY_KEEP=1
keeps the temp dir, WKVM_PARITY_ONLY=substr runs only matching cases,
WKVM_PARITY_BACKEND=cuda passes --backend cuda (the GPU parity run).
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
except ImportError:
    if os.environ.get("WKVM_PARITY_BACKEND") == "cuda" and glob.glob("/dev/nvidia*"):
        # a GPU is here: the gpu suite runs whole or fails, it never skips quietly
        print("FAIL: numpy is not installed for %s (deploy/install-deps installs it)"
              % sys.executable)
        sys.exit(1)
    print("SKIP: numpy is not installed for %s" % sys.executable)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_model  # noqa: E402
import rwkv7_ref  # noqa: E402

TOL = 1e-3          # max |diff| / std(ref logits)
N_PROMPT = 24       # prompt tokens per case (a case may set "prompt")
N_GEN = 16          # greedy tokens compared
CHUNKS = (1, 7, 64)  # --prefill-chunk values that must agree
RUN_TIMEOUT = 120   # seconds per wkvm-infer call

# name: gen_model config (default_cfg fills the rest)
MATRIX = [
    ("hf-f32-st-C64N16", dict(convention="hf", dtype="f32", format="safetensors",
                              layers=2, embd=64, head_size=16, ffn=256, vocab=300, seed=101)),
    ("hf-bf16-st-C64N32", dict(convention="hf", dtype="bf16", format="safetensors",
                               layers=2, embd=64, head_size=32, ffn=256, vocab=500, seed=102)),
    ("hf-f16-st-L3C128N64", dict(convention="hf", dtype="f16", format="safetensors",
                                 layers=3, embd=128, head_size=64, ffn=512, vocab=1000,
                                 seed=103)),
    ("hf-f32-shard-l0v", dict(convention="hf", dtype="f32", format="sharded", layer0_v=True,
                              layers=2, embd=64, head_size=16, ffn=256, vocab=400, seed=104)),
    ("hf-bf16-shard-C128N32", dict(convention="hf", dtype="bf16", format="sharded",
                                   layers=2, embd=128, head_size=32, ffn=384, vocab=700,
                                   seed=105)),
    ("hf-f32-st-C192N64-odd", dict(convention="hf", dtype="f32", format="safetensors",
                                   layers=2, embd=192, head_size=64, ffn=320, vocab=613,
                                   lora_w=24, lora_a=20, lora_v=12, lora_g=40, seed=106)),
    ("blink-f32-st-l0v", dict(convention="blink", dtype="f32", format="safetensors",
                              layer0_v=True, layers=2, embd=64, head_size=16, ffn=256,
                              vocab=300, seed=201)),
    ("blink-bf16-pth-l0v", dict(convention="blink", dtype="bf16", format="pth", layer0_v=True,
                                layers=2, embd=64, head_size=32, ffn=256, vocab=500,
                                seed=202)),
    ("blink-f16-pth-L3C128N64", dict(convention="blink", dtype="f16", format="pth",
                                     layers=3, embd=128, head_size=64, ffn=512, vocab=800,
                                     seed=203)),
    ("blink-f32-pth-L1N64", dict(convention="blink", dtype="f32", format="pth", layer0_v=True,
                                 layers=1, embd=64, head_size=64, ffn=128, vocab=320,
                                 seed=204)),
    ("blink-bf16-st-L4C128N64", dict(convention="blink", dtype="bf16", format="safetensors",
                                     layers=4, embd=128, head_size=64, ffn=448, vocab=1000,
                                     seed=205)),
    # HF tie_word_embeddings (no lm_head.weight: the head is the embedding),
    # and a norm_eps other than 1e-5 (LayerNorms norm_eps, g_norm N * norm_eps)
    ("hf-f32-st-tied", dict(convention="hf", dtype="f32", format="safetensors", tied=True,
                            layers=2, embd=64, head_size=32, ffn=256, vocab=400, seed=108)),
    ("hf-bf16-st-N16-eps1e-3", dict(convention="hf", dtype="bf16", format="safetensors",
                                    norm_eps=1e-3, layers=2, embd=64, head_size=16, ffn=256,
                                    vocab=300, seed=109)),
    # a long prompt: several chunks of 64 and 7, state carried across them
    ("hf-f32-st-long150", dict(convention="hf", dtype="f32", format="safetensors",
                               layers=2, embd=128, head_size=64, ffn=256, vocab=500,
                               seed=107, prompt=150)),
]


def build_dir():
    d = os.environ.get("WKVM_BUILD_DIR")
    if d:
        return d
    return os.path.normpath(os.path.join(HERE, "..", "..", "build"))


class Result:
    def __init__(self, name):
        self.name = name
        self.checks = []  # (what, ok, detail)

    def add(self, what, ok, detail=""):
        self.checks.append((what, bool(ok), detail))

    @property
    def ok(self):
        return all(c[1] for c in self.checks) and bool(self.checks)


def run_infer(exe, model, tokens, logits_out=None, generate=0, chunk=None, fp32=False):
    cmd = [exe, "--model", model, "--tokens", ",".join(str(t) for t in tokens)]
    backend = os.environ.get("WKVM_PARITY_BACKEND")
    if backend:
        cmd += ["--backend", backend]
    if fp32:
        cmd += ["--fp32"]
    if logits_out:
        cmd += ["--logits-out", logits_out]
    if generate:
        cmd += ["--generate", str(generate)]
    if chunk is not None:
        cmd += ["--prefill-chunk", str(chunk)]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        return 124, "", "timed out after %ds: %s" % (RUN_TIMEOUT, " ".join(cmd))
    return (p.returncode, p.stdout.decode("utf-8", "replace"),
            p.stderr.decode("utf-8", "replace"))


_IDS_LINE = re.compile(r"^\s*(?:[A-Za-z_ ]+[:=]\s*)?\[?\s*(\d+(?:\s*[, ]\s*\d+)*)\s*\]?\s*$")


def parse_ids(stdout, n):
    """The greedy ids wkvm-infer printed: the last stdout line that is a list
    of n integers (optionally prefixed by a label such as 'ids:')."""
    for line in reversed(stdout.splitlines()):
        m = _IDS_LINE.match(line)
        if m:
            ids = [int(t) for t in re.split(r"[,\s]+", m.group(1).strip()) if t]
            if len(ids) == n:
                return ids
    return None


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b)) if len(a) != len(b) else -1


# A greedy id that differs from the reference's is accepted on the CUDA
# backend only at a near tie: where, given the same history, the reference's
# logit of its own pick exceeds its logit of the CUDA pick by less than
# NEAR_TIE standard deviations of the reference's prompt logits. Each side's
# logits are within TOL std of the reference, so a flip needs a gap under
# 2 * TOL; anything wider is a bug. Later ids follow a different history and
# are not compared. The CPU backend gets no such slack.
NEAR_TIE = 2 * TOL


def check_greedy(res, label, ids, ref_ids, ref, tokens, std):
    """Adds the "greedy LABEL" check of ids (wkvm-infer's) against ref_ids
    (ref.generate(tokens)); ref is the family's reference model (forward /
    step), std the spread of its prompt logits."""
    k = first_diff(ids, ref_ids)
    if k < 0:
        res.add("greedy " + label, True)
        return
    detail = "first differs at step %d: got %s, reference %s" % (k, ids, ref_ids)
    if (os.environ.get("WKVM_PARITY_BACKEND") != "cuda" or k >= min(len(ids), len(ref_ids))
            or not 0 <= ids[k] < ref.V):
        res.add("greedy " + label, False, detail)
        return
    logits, st = ref.forward(tokens)
    last = logits[-1]
    for t in ref_ids[:k]:
        last = ref.step(t, st)
    gap = float(last[ref_ids[k]] - last[ids[k]]) / std
    ok = gap < NEAR_TIE
    note = "%s; reference gap %.2e std between %d and %d (near-tie bound %.0e)" % (
        detail, gap, ref_ids[k], ids[k], NEAR_TIE)
    if ok:
        note = "near tie accepted: " + note
        print("       note greedy %s: %s" % (label, note), flush=True)
    res.add("greedy " + label, ok, note)


def compare_logits(res, what, ref, got):
    if got.shape != ref.shape:
        res.add(what, False, "shape %s, reference %s" % (got.shape, ref.shape))
        return
    std = ref.std()
    diff = np.abs(got - ref)
    rel = diff.max() / std
    pos, col = np.unravel_index(np.argmax(diff), diff.shape)
    per_pos = diff.max(axis=1) / std
    detail = "max|d|/std %.2e at pos %d id %d (ref %.5f got %.5f; std %.3f)" % (
        rel, pos, col, ref[pos, col], got[pos, col], std)
    if not rel < TOL:
        bad = np.nonzero(per_pos >= TOL)[0]
        detail += "; %d/%d positions over, first %d" % (len(bad), len(per_pos), bad[0])
    res.add(what, rel < TOL, detail)


def check_model(exe, name, mdir, tokens, tmp, dtype):
    """Logits and greedy ids of wkvm-infer vs the reference, for the default
    prefill chunk, each of CHUNKS, and --fp32 when the weights are 16-bit."""
    res = Result(name)
    ref = rwkv7_ref.RWKV7.load(mdir)
    ref_ids, ref_logits, _ = ref.generate(tokens, N_GEN)
    runs = [("default", None, False)] + [("chunk %d" % c, c, False) for c in CHUNKS]
    if dtype != "f32":
        runs.append(("--fp32", None, True))
    for label, ch, fp32 in runs:
        lpath = os.path.join(tmp, "%s.%s.logits" % (re.sub(r"\W+", "_", name), label.strip("-")))
        rc, out, err = run_infer(exe, mdir, tokens, logits_out=lpath, generate=N_GEN,
                                 chunk=ch, fp32=fp32)
        if rc != 0:
            res.add("run " + label, False, "wkvm-infer exit %d: %s" % (rc, err.strip()[-400:]))
            continue
        try:
            got = rwkv7_ref.read_logits(lpath, ref.V)
        except (OSError, ValueError) as e:
            res.add("logits " + label, False, str(e))
            got = None
        if got is not None:
            compare_logits(res, "logits " + label, ref_logits, got)
        ids = parse_ids(out, N_GEN)
        if ids is None:
            res.add("greedy " + label, False,
                    "no line of %d ids in stdout: %r" % (N_GEN, out[-200:]))
            continue
        check_greedy(res, label, ids, ref_ids, ref, tokens, ref_logits.std())
    return res, ref


def prompt_tokens(rng, vocab, n):
    """n random ids that include 0 (end of text) and vocab-1 (the last row)."""
    t = [int(x) for x in rng.integers(0, vocab, n)]
    if n >= 4:
        t[1], t[n // 2] = 0, vocab - 1
    return t


def negative_cases(exe, tmp):
    """(name, model dir, names the message may use for the broken tensor)."""
    cases = []
    base = gen_model.default_cfg(layers=2, embd=64, head_size=16, ffn=128, vocab=300, seed=301)

    def mk(label, cfg, edit):
        p = gen_model.make_params(cfg)
        named = gen_model.to_named(p, cfg["convention"])
        accept = edit(named)
        d = os.path.join(tmp, "neg-" + label)
        gen_model.write_model(d, cfg, named=named)
        cases.append(("neg " + label, d, accept))

    def wrong_kproj(named):
        n = "model.layers.1.attn.k_proj.weight"
        named[n] = np.zeros((64, 72))
        return [n]

    def wrong_ffn_value(named):
        n = "model.layers.0.ffn.value.weight"
        named[n] = np.zeros((64, 129))
        return [n]

    def reshaped_rk(named):  # same element count, wrong shape
        n = "blocks.1.att.r_k"
        named[n] = named[n].reshape(8, 8)
        return [n]

    def wrong_head(named):
        n = "head.weight"
        named[n] = np.zeros((301, 64))
        return [n, "emb.weight"]

    def missing_gnorm(named):
        n = "model.layers.1.attn.g_norm.weight"
        del named[n]
        return [n]

    mk("hf-k_proj-shape", dict(base, convention="hf"), wrong_kproj)
    mk("hf-ffn.value-shape", dict(base, convention="hf", dtype="bf16"), wrong_ffn_value)
    mk("blink-r_k-reshaped", dict(base, convention="blink"), reshaped_rk)
    mk("blink-head-rows", dict(base, convention="blink", format="pth"), wrong_head)
    mk("hf-g_norm-missing", dict(base, convention="hf"), missing_gnorm)
    results = []
    for name, d, accept in cases:
        res = Result(name)
        rc, out, err = run_infer(exe, d, [1, 2, 3], generate=1)
        msg = (err + out).strip()
        res.message = msg
        named_ok = any(a in msg for a in accept)
        crashed = rc < 0 or rc >= 128
        res.add("refused", rc != 0 and not crashed,
                "exit %d%s" % (rc, " (signal)" if crashed else ""))
        res.add("names tensor", named_ok, "message: %r" % msg[-300:])
        results.append(res)
    return results


def mkmodel_case(build, tmp):
    exe = os.path.join(build, "tools", "wkvm-mkmodel")
    if not os.access(exe, os.X_OK):
        return None, "wkvm-mkmodel not built"
    d = os.path.join(tmp, "mkmodel")
    p = subprocess.run([exe, "--out", d, "--seed", "7"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=RUN_TIMEOUT)
    if p.returncode != 0:
        return None, "wkvm-mkmodel failed: %s" % p.stderr.decode(errors="replace")
    return d, p.stdout.decode().strip()


def cuda_skip_reason(exe):
    """Why the CUDA parity run cannot happen here (no CUDA backend in the
    build, no device), or None. Any other failure is left to the cases,
    which then fail with the real message."""
    tmp = tempfile.mkdtemp(prefix="wkvm-parity-probe-")
    try:
        d = os.path.join(tmp, "probe")
        gen_model.write_model(d, gen_model.default_cfg(layers=1, embd=64, head_size=16,
                                                       ffn=128, vocab=300, seed=1))
        rc, out, err = run_infer(exe, d, [1, 2, 3], generate=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    msg = (err + out).strip()
    if rc != 0 and ("no CUDA device" in msg or "not available in this build" in msg):
        return msg.splitlines()[-1]
    return None


def main():
    build = build_dir()
    exe = os.path.join(build, "tools", "wkvm-infer")
    if not os.access(exe, os.X_OK):
        print("SKIP: %s is not built" % exe)
        return 77
    if os.environ.get("WKVM_PARITY_BACKEND") == "cuda":
        why = cuda_skip_reason(exe)
        if why is not None:
            print("SKIP: CUDA parity needs a CUDA build and device: %s" % why)
            return 77
    only = os.environ.get("WKVM_PARITY_ONLY", "")
    keep = os.environ.get("WKVM_PARITY_KEEP") == "1"
    tmp = tempfile.mkdtemp(prefix="wkvm-parity-")
    t0 = time.time()
    results = []
    rng = np.random.default_rng(2024)
    try:
        for name, kw in MATRIX:
            if only and only not in name:
                continue
            kw = dict(kw)
            n_prompt = kw.pop("prompt", N_PROMPT)
            cfg = gen_model.default_cfg(**kw)
            d = os.path.join(tmp, name)
            gen_model.write_model(d, cfg)
            toks = prompt_tokens(rng, cfg["vocab"], n_prompt)
            res, _ = check_model(exe, name, d, toks, tmp, cfg["dtype"])
            results.append(res)
            print("%-4s %s" % ("ok" if res.ok else "FAIL", name), flush=True)
        if not only or only in "mkmodel":
            d, info = mkmodel_case(build, tmp)
            if d is None:
                r = Result("wkvm-mkmodel")
                r.add("built", False, info)
                results.append(r)
            else:
                toks = prompt_tokens(rng, 4096, N_PROMPT)
                res, _ = check_model(exe, "wkvm-mkmodel (%s)" % info.split(":")[-1].strip()
                                     .split(",")[0], d, toks, tmp, "bf16")
                results.append(res)
                print("%-4s %s" % ("ok" if res.ok else "FAIL", res.name), flush=True)
        if not only or only in "negative":
            for res in negative_cases(exe, tmp):
                results.append(res)
                print("%-4s %s" % ("ok" if res.ok else "FAIL", res.name), flush=True)
    finally:
        if keep:
            print("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    print("\n=== RWKV-7 parity summary (tolerance max|diff|/std < %g, %d prompt tokens, "
          "%d greedy) ===" % (TOL, N_PROMPT, N_GEN))
    nfail = 0
    for r in results:
        print("%-4s %s" % ("ok" if r.ok else "FAIL", r.name))
        worst = None
        for what, ok, detail in r.checks:
            if not ok:
                print("       FAIL %-16s %s" % (what, detail))
            elif detail.startswith("near tie"):
                print("       note %-16s %s" % (what, detail))
            elif what.startswith("logits"):
                m = re.match(r"max\|d\|/std (\S+)", detail)
                if m and (worst is None or float(m.group(1)) > float(worst[1].split()[1])):
                    worst = (what, detail)
        if worst:
            print("            worst %-13s %s" % (worst[0][7:], worst[1]))
        if getattr(r, "message", None):
            print("            message: %s" % r.message.splitlines()[-1][-160:])
        nfail += not r.ok
    print("%d/%d cases passed in %.1fs" % (len(results) - nfail, len(results), time.time() - t0))
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())
