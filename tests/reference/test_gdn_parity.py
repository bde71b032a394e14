#!/usr/bin/python3
"""Gated DeltaNet parity: wkvm-infer (the C CPU backend) against gdn_ref.py.

For a matrix of small random fla `gated_deltanet` models (F32 / BF16 / F16,
one .safetensors or two shards, tied and untied head, use_gate on and off,
allow_neg_eigval, grouped value heads, value heads wider than one
recurrence column block, conv sizes 2..4, a prompt longer than one pass)
this runner:
  1. generates the model into a temp dir (gen_gdn.py),
  2. runs `wkvm-infer --model DIR --tokens ... --logits-out F --generate 16`
     and the numpy reference, and requires max|diff| / std(ref logits) < 1e-3
     over every position and the reference's greedy ids,
  3. repeats 2 with `--prefill-chunk` 1, 7 and 64 (and --fp32 for 16-bit
     weights),
  4. requires the logits bit-identical with --threads 1, with a pass of 5
     tokens (WKVM_CPU_PASS_TOKENS=5: rows split across passes), and the
     AVX2 and AVX-512 paths to agree bit for bit (WKVM_CPU_ISA; the ISA
     that really ran is read from wkvm-infer's "backend: ... isa=" line and
     checked against /proc/cpuinfo: on a CPU without AVX-512 the comparison
     is skipped by name, "avx512 comparison skipped: CPU has no AVX-512",
     never passed by comparing AVX2 with itself),
  5. runs `--batch-check 5` (the row alone and in a batch of random rows
     must give the same bits, logits and final state),
  6. for the hybrid models (attention layers with the paged KV pool:
     GQA / MQA, qk_norm, qkv_bias, a head dim that is not a multiple of 8,
     prompts of many 16-token pages, one longer than a pass), runs `--slot-check` (fork, hibernate/resume,
     migration to another slot continue bit-identically; image sizes;
     WK_EQUOTA / WK_EINVAL refusals that change nothing) with the default
     pool and with a pool of a few pages more than the prompt needs,
and checks that broken checkpoints (wrong shape, missing tensor, unexpected
tensor, config.json that contradicts the shapes or asks for what is not
supported) make wkvm-infer exit non-zero naming the tensor or key.

Exit 0 when everything passes, 1 on any failure, 77 (meson's skip) when
numpy or wkvm-infer is missing. Environment: WKVM_BUILD_DIR (default
../../build), WKVM_PARITY_KEEP=1 keeps the temp dir, WKVM_PARITY_ONLY=substr
runs only matching cases, WKVM_PARITY_BACKEND=cuda passes --backend cuda
(then: 77 without a device; the CPU-only checks of 4-6 are skipped; the
hybrid models run 1-3 on the CUDA KV pool).
"""

import glob
import json
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
import gdn_ref  # noqa: E402
import gen_gdn  # noqa: E402
from test_parity import (CHUNKS, N_GEN, N_PROMPT, RUN_TIMEOUT, TOL, Result,  # noqa: E402
                         build_dir, check_greedy, compare_logits, cuda_skip_reason,
                         parse_ids, prompt_tokens, run_infer)

MATRIX = [
    ("f32-st-gate", dict(seed=401)),
    ("bf16-st-tied", dict(seed=402, dtype="bf16", tied=True)),
    ("f16-shard-nogate", dict(seed=403, dtype="f16", format="sharded", use_gate=False)),
    ("f32-gva-conv3", dict(seed=404, heads=2, v_heads=4, head_dim=16, expand_v=1.5, conv=3)),
    ("bf16-neg-L3C128K32", dict(seed=405, dtype="bf16", allow_neg_eigval=True, layers=3,
                                hidden=128, heads=2, head_dim=32, ffn=352, vocab=1000)),
    ("f32-odd-Vd96-conv2", dict(seed=406, hidden=72, heads=3, head_dim=48, expand_v=2.0,
                                ffn=200, vocab=613, conv=2)),
    ("bf16-shard-tied-nogate-gva", dict(seed=407, dtype="bf16", format="sharded", tied=True,
                                        use_gate=False, heads=1, v_heads=3, head_dim=32,
                                        expand_v=1.0, hidden=96, ffn=256, vocab=500)),
    ("f32-long300", dict(seed=408, hidden=128, heads=4, head_dim=16, ffn=256, vocab=500,
                         prompt=300)),
    # hybrid: attention layers (fla Attention) with the paged KV pool (16-token pages)
    ("hyb-f32-gqa-L4", dict(seed=411, layers=4, attn_layers=(1, 3), attn_heads=4,
                            attn_kv_heads=2, prompt=150)),
    ("hyb-bf16-qknorm-bias-tied", dict(seed=412, dtype="bf16", layers=3, attn_layers=(0,),
                                       attn_heads=8, attn_kv_heads=4, qk_norm=True,
                                       qkv_bias=True, rope_theta=500000.0, tied=True,
                                       prompt=150)),
    ("hyb-f16-shard-mqa-long300", dict(seed=413, dtype="f16", format="sharded", layers=3,
                                       attn_layers=(2,), hidden=128, attn_heads=2,
                                       attn_kv_heads=1, ffn=256, vocab=500, prompt=300)),
    # head dim 12 (a dot's tail after its 8 lanes), 3 query heads per KV head (attention
    # blocks of 15 queries: register quads plus a remainder)
    ("hyb-f32-gqa3-dim12", dict(seed=414, layers=3, attn_layers=(1,), hidden=72, attn_heads=6,
                                attn_kv_heads=2, prompt=90)),
]
BATCH_CHECK = ("f32-st-gate", "bf16-neg-L3C128K32", "f32-odd-Vd96-conv2",
               "bf16-shard-tied-nogate-gva", "hyb-f32-gqa-L4", "hyb-bf16-qknorm-bias-tied",
               "hyb-f32-gqa3-dim12")


def run(cmd, env=None):
    e = dict(os.environ)
    e.update(env or {})
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=RUN_TIMEOUT, env=e)
    except subprocess.TimeoutExpired:
        return 124, "", "timed out after %ds: %s" % (RUN_TIMEOUT, " ".join(cmd))
    return (p.returncode, p.stdout.decode("utf-8", "replace"),
            p.stderr.decode("utf-8", "replace"))


SKIPPED = []  # comparisons skipped, by name, printed in the summary


def skip(what):
    if what not in SKIPPED:
        SKIPPED.append(what)
        print("SKIP " + what, flush=True)


def cpu_flags():
    """The CPU's feature flags from /proc/cpuinfo; None where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def check_model(exe, name, mdir, tokens, tmp, dtype, batch_check, slot_check=False):
    res = Result(name)
    ref = gdn_ref.GDN.load(mdir)
    ref_ids, ref_logits, _ = ref.generate(tokens, N_GEN)
    base = os.path.join(tmp, re.sub(r"\W+", "_", name))
    runs = [("default", None, False)] + [("chunk %d" % c, c, False) for c in CHUNKS]
    if dtype != "f32":
        runs.append(("--fp32", None, True))
    default_path = None
    for label, ch, fp32 in runs:
        lpath = "%s.%s.logits" % (base, re.sub(r"\W+", "_", label))
        rc, out, err = run_infer(exe, mdir, tokens, logits_out=lpath, generate=N_GEN,
                                 chunk=ch, fp32=fp32)
        if rc != 0:
            res.add("run " + label, False, "wkvm-infer exit %d: %s" % (rc, err.strip()[-400:]))
            continue
        if label == "default":
            default_path = lpath
        try:
            got = gdn_ref.read_logits(lpath, ref.V)
        except (OSError, ValueError) as e:
            res.add("logits " + label, False, str(e))
            got = None
        if got is not None:
            compare_logits(res, "logits " + label, ref_logits, got)
        ids = parse_ids(out, N_GEN)
        if ids is None:
            res.add("greedy " + label, False, "no line of %d ids: %r" % (N_GEN, out[-200:]))
            continue
        check_greedy(res, label, ids, ref_ids, ref, tokens, ref_logits.std())

    if os.environ.get("WKVM_PARITY_BACKEND"):
        return res  # the checks below are the CPU backend's (threads, ISA, bits, KV pool)

    # the same bits whatever the thread count, the pass size or the vector width
    toks = ",".join(str(t) for t in tokens)

    ran_isa = {}  # label -> the ISA wkvm-infer says it ran

    def bits(label, extra, env):
        lpath = "%s.%s.logits" % (base, re.sub(r"\W+", "_", label))
        rc, out, err = run([exe, "--model", mdir, "--tokens", toks, "--logits-out", lpath]
                           + extra, env)
        if rc != 0:
            res.add("bits " + label, False, "exit %d: %s" % (rc, err.strip()[-300:]))
            return None
        m = re.search(r"^wkvm-infer: backend: .*\bisa=(\w+)", err, re.M)
        ran_isa[label] = m.group(1) if m else None
        with open(lpath, "rb") as f:
            return f.read()

    if default_path is not None:
        with open(default_path, "rb") as f:
            want = f.read()
        for label, extra, env in (("--threads 1", ["--threads", "1"], None),
                                  ("pass 5 tokens", [], {"WKVM_CPU_PASS_TOKENS": "5"})):
            got = bits(label, extra, env)
            if got is not None:
                res.add("bits " + label, got == want, "logits differ from the default run")
    a512 = bits("isa avx512", [], {"WKVM_CPU_ISA": "avx512"})
    a2 = bits("isa avx2", [], {"WKVM_CPU_ISA": "avx2"})
    if a512 is not None and a2 is not None:
        isa512, isa2 = ran_isa["isa avx512"], ran_isa["isa avx2"]
        flags = cpu_flags()
        order = ["scalar", "avx2", "avx512"]
        if flags is not None:  # what each request must run: min(request, the CPU's best)
            hw = 2 if "avx512f" in flags else 1 if {"avx2", "fma"} <= flags else 0
            want512, want2 = order[min(2, hw)], order[min(1, hw)]
        else:
            want512, want2 = isa512, isa2
        if isa512 is None or isa2 is None:
            res.add("isa reported", False, "wkvm-infer printed no 'backend: ... isa=' line")
        elif (isa512, isa2) != (want512, want2):
            res.add("isa reported", False, "WKVM_CPU_ISA=avx512 ran isa=%s, =avx2 ran isa=%s; "
                    "this CPU (/proc/cpuinfo) should run %s and %s"
                    % (isa512, isa2, want512, want2))
        elif isa2 != "avx2":
            skip("avx2 comparison skipped: CPU has no AVX2 (WKVM_CPU_ISA=avx2 ran isa=%s)"
                 % isa2)
        elif isa512 != "avx512":
            skip("avx512 comparison skipped: CPU has no AVX-512 (WKVM_CPU_ISA=avx512 ran "
                 "isa=%s)" % isa512)
        else:
            res.add("bits avx2 vs avx512", a512 == a2, "logits differ between the two paths")

    if batch_check:
        for ch in (7, 64):
            rc, out, err = run([exe, "--model", mdir, "--tokens",
                                ",".join(str(t) for t in tokens), "--batch-check", "5",
                                "--prefill-chunk", str(ch), "--generate", "8"])
            res.add("batch-check chunk %d" % ch, rc == 0,
                    "exit %d: %s" % (rc, (err + out).strip()[-300:]))

    if slot_check:
        # the default pool, then one a few pages over what the fork needs (two copies)
        n_pages = 2 * ((len(tokens) + 8 + 15) // 16) + 2
        for label, extra in (("default pool", []), ("%d pages" % n_pages,
                                                    ["--kv-pages", str(n_pages)])):
            for ch in (1, 7, 64):
                rc, out, err = run([exe, "--model", mdir, "--tokens", toks, "--slot-check",
                                    "--generate", "8", "--prefill-chunk", str(ch)] + extra)
                res.add("slot-check %s chunk %d" % (label, ch),
                        rc == 0 and "slot-check: ok" in out,
                        "exit %d: %s" % (rc, (err + out).strip()[-300:]))
    return res


def negative_cases(tmp):
    """(name, model dir, strings the message must contain one of)."""
    cases = []
    base = gen_gdn.default_cfg(seed=501)

    def mk(label, cfg, edit_named=None, edit_config=None):
        named = gen_gdn.make_params(cfg)
        conf = gen_gdn.config_json(cfg)
        accept = []
        if edit_named:
            accept += edit_named(named)
        if edit_config:
            accept += edit_config(conf)
        d = os.path.join(tmp, "neg-" + label)
        gen_gdn.write_model(d, cfg, named=named, config=conf)
        cases.append(("neg " + label, d, accept))

    def wrong_kproj(named):
        n = "model.layers.1.attn.k_proj.weight"
        named[n] = np.zeros((32, 65))
        return [n]

    def wrong_conv(named):
        n = "model.layers.0.attn.v_conv1d.weight"
        named[n] = np.zeros((64, 4))  # [D, W]: missing the middle 1
        return [n]

    def missing_dt_bias(named):
        n = "model.layers.1.attn.dt_bias"
        del named[n]
        return [n]

    def missing_head(named):
        del named["lm_head.weight"]
        return ["lm_head.weight"]

    def extra_bias(named):
        n = "model.layers.0.attn.q_conv1d.bias"
        named[n] = np.zeros(32)
        return [n]

    def cfg_heads(conf):
        conf["num_heads"] = 3
        conf["head_dim"] = 16
        return ["num_heads"]

    def cfg_hidden(conf):
        conf["hidden_size"] = 96
        return ["hidden_size"]

    def cfg_attn_window(conf):
        conf["attn"] = {"layers": [1], "num_heads": 4, "window_size": 512}
        return ["attn.window_size"]

    def cfg_attn_unknown(conf):
        conf["attn"]["rope_scaling"] = {"type": "linear", "factor": 2.0}
        return ["attn.rope_scaling"]

    def cfg_attn_kv(conf):
        conf["attn"]["num_kv_heads"] = 3
        return ["attn.num_kv_heads"]

    def cfg_attn_layer(conf):
        conf["attn"]["layers"] = [1, 7]
        return ["attn.layers"]

    def cfg_attn_all(conf):
        conf["attn"]["layers"] = [0, 1, 2, 3]
        return ["attn.layers"]

    def cfg_attn_theta(conf):
        conf["attn"]["rope_theta"] = None
        return ["attn.rope_theta"]

    def cfg_attn_qknorm(conf):
        conf["attn"]["qk_norm"] = True
        return ["q_norm.weight"]

    def missing_attn_k(named):
        n = "model.layers.1.attn.k_proj.weight"
        del named[n]
        return [n]

    def wrong_attn_v(named):
        n = "model.layers.3.attn.v_proj.weight"
        named[n] = np.zeros((64, 64))  # GQA: 2 KV heads of 16 -> [32, 64]
        return [n]

    def gdn_tensor_in_attn(named):
        n = "model.layers.1.attn.A_log"
        named[n] = np.zeros(2)
        return [n]

    def extra_bias_attn(named):
        n = "model.layers.3.attn.q_proj.bias"
        named[n] = np.zeros(64)
        return [n]

    def cfg_act(conf):
        conf["hidden_act"] = "gelu"
        return ["hidden_act"]

    def cfg_nogate(conf):
        conf["use_gate"] = False
        return ["g_proj", "use_gate"]

    def cfg_tied(conf):
        conf["tie_word_embeddings"] = True
        return ["lm_head.weight"]

    def cfg_expand(conf):
        conf["expand_v"] = 1.0
        return ["expand_v"]

    def cfg_mode(conf):
        conf["attn_mode"] = "parallel"
        return ["attn_mode"]

    mk("k_proj-shape", base, wrong_kproj)
    mk("v_conv-2d", dict(base, dtype="bf16"), wrong_conv)
    mk("dt_bias-missing", dict(base, format="sharded"), missing_dt_bias)
    mk("lm_head-missing", base, missing_head)
    mk("conv-bias-unexpected", base, extra_bias)
    mk("cfg-num_heads", base, edit_config=cfg_heads)
    mk("cfg-hidden_size", base, edit_config=cfg_hidden)
    mk("cfg-attn-window_size", base, edit_config=cfg_attn_window)
    hyb = gen_gdn.default_cfg(seed=502, layers=4, attn_layers=(1, 3), attn_heads=4,
                              attn_kv_heads=2)
    mk("hyb-cfg-unknown-key", hyb, edit_config=cfg_attn_unknown)
    mk("hyb-cfg-num_kv_heads", hyb, edit_config=cfg_attn_kv)
    mk("hyb-cfg-layer-range", hyb, edit_config=cfg_attn_layer)
    mk("hyb-cfg-all-attention", hyb, edit_config=cfg_attn_all)
    mk("hyb-cfg-rope_theta-null", hyb, edit_config=cfg_attn_theta)
    mk("hyb-cfg-qk_norm-without-weights", hyb, edit_config=cfg_attn_qknorm)
    mk("hyb-k_proj-missing", hyb, missing_attn_k)
    mk("hyb-v_proj-shape", dict(hyb, dtype="bf16"), wrong_attn_v)
    mk("hyb-gdn-tensor-in-attention-layer", hyb, gdn_tensor_in_attn)
    mk("hyb-bias-without-qkv_bias", hyb, extra_bias_attn)
    mk("cfg-hidden_act", base, edit_config=cfg_act)
    mk("cfg-use_gate-vs-g_proj", base, edit_config=cfg_nogate)
    mk("cfg-tied-vs-lm_head", base, edit_config=cfg_tied)
    mk("cfg-expand_v", base, edit_config=cfg_expand)
    mk("cfg-attn_mode", base, edit_config=cfg_mode)
    return cases


def main():
    build = build_dir()
    exe = os.path.join(build, "tools", "wkvm-infer")
    if not os.access(exe, os.X_OK):
        print("SKIP: %s is not built" % exe)
        return 77
    backend = os.environ.get("WKVM_PARITY_BACKEND")
    if backend == "cuda":
        why = cuda_skip_reason(exe)
        if why is not None:
            print("SKIP: CUDA parity needs a CUDA build and device: %s" % why)
            return 77
    only = os.environ.get("WKVM_PARITY_ONLY", "")
    keep = os.environ.get("WKVM_PARITY_KEEP") == "1"
    tmp = tempfile.mkdtemp(prefix="wkvm-gdn-parity-")
    t0 = time.time()
    results = []
    rng = np.random.default_rng(2025)
    try:
        for name, kw in MATRIX:
            if only and only not in name:
                continue
            kw = dict(kw)
            n_prompt = kw.pop("prompt", N_PROMPT)
            cfg = gen_gdn.default_cfg(**kw)
            d = os.path.join(tmp, name)
            gen_gdn.write_model(d, cfg)
            toks = prompt_tokens(rng, cfg["vocab"], n_prompt)
            res = check_model(exe, name, d, toks, tmp, cfg["dtype"], name in BATCH_CHECK,
                              slot_check=bool(cfg["attn_layers"]))
            results.append(res)
            print("%-4s %s" % ("ok" if res.ok else "FAIL", name), flush=True)
        if not only or only in "negative":
            for name, d, accept in negative_cases(tmp):
                res = Result(name)
                rc, out, err = run_infer(exe, d, [1, 2, 3], generate=1)
                msg = (err + out).strip()
                res.message = msg
                crashed = rc < 0 or rc >= 128
                res.add("refused", rc != 0 and not crashed,
                        "exit %d%s" % (rc, " (signal)" if crashed else ""))
                res.add("names it", any(a in msg for a in accept),
                        "wanted one of %s in: %r" % (accept, msg[-300:]))
                results.append(res)
                print("%-4s %s" % ("ok" if res.ok else "FAIL", name), flush=True)
    finally:
        if keep:
            print("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    print("\n=== Gated DeltaNet parity summary (tolerance max|diff|/std < %g, %d prompt "
          "tokens, %d greedy) ===" % (TOL, N_PROMPT, N_GEN))
    nfail = 0
    for r in results:
        print("%-4s %s" % ("ok" if r.ok else "FAIL", r.name))
        worst = None
        for what, ok, detail in r.checks:
            if not ok:
                print("       FAIL %-20s %s" % (what, detail))
            elif detail.startswith("near tie"):
                print("       note %-20s %s" % (what, detail))
            elif what.startswith("logits"):
                m = re.match(r"max\|d\|/std (\S+)", detail)
                if m and (worst is None or float(m.group(1)) > worst[0]):
                    worst = (float(m.group(1)), what, detail)
        if worst:
            print("            worst %-13s %s" % (worst[1][7:], worst[2]))
        if getattr(r, "message", None):
            print("            message: %s" % r.message.splitlines()[-1][-200:])
        nfail += not r.ok
    for what in SKIPPED:
        print("SKIP " + what)
    print("%d/%d cases passed in %.1fs" % (len(results) - nfail, len(results), time.time() - t0))
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())
