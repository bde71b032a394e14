#!/usr/bin/python3
"""Mamba2 parity: wkvm-infer (the C CPU backend) against the numpy reference.

For a matrix of small random Mamba2 models (both checkpoint conventions,
F32 / BF16 / F16 weights, one .safetensors or two shards, tied and untied
heads, n_groups 1, 2 and 4, conv kernels 3..5, d_state not a multiple of 8,
a 130m-like head (P 64, N 128), a long prompt), this runner:
  1. generates the model into a temp dir (gen_mamba2.py),
  2. runs `wkvm-infer --model DIR --tokens ... --logits-out F --generate 16`
     and mamba2_ref.py, and requires max|diff| / std(ref logits) < 1e-3 over
     every prompt position and the reference's greedy ids,
  3. repeats 2 with `--prefill-chunk` 1, 7 and 64 (and --fp32 for 16-bit
     weights), and requires the chunked runs' logits to be bit-identical to
     the default run's,
  4. runs `wkvm-infer --batch-check 5` (the prompt alone and inside a batch
     of random rows must give the same bits, logits and state), with chunks
     7 and 1 and with WKVM_CPU_PASS_TOKENS=5 (rows cut across passes),
and finally checks that broken checkpoints (a wrong shape, a missing tensor,
an unexpected tensor, config.json keys that contradict the shapes or select
an unsupported variant) make wkvm-infer exit non-zero naming the tensor or
the key.

Exit 0 when everything passes, 1 on any failure, 77 (meson's skip) when
numpy or wkvm-infer is missing. Environment: WKVM_BUILD_DIR (default
../../build), WKVM_PARITY_KEEP=1 keeps the temp dir, WKVM_PARITY_ONLY=substr
runs only matching cases, WKVM_PARITY_BACKEND=cuda passes --backend cuda
(then: 77 without a device, and the CPU-only checks of bit-identical
chunkings and --batch-check are skipped: CUDA agrees to GEMM rounding).
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
import gen_mamba2  # noqa: E402
import mamba2_ref  # noqa: E402
from test_parity import (CHUNKS, N_GEN, N_PROMPT, RUN_TIMEOUT, TOL, Result,  # noqa: E402
                         build_dir, check_greedy, compare_logits, cuda_skip_reason,
                         parse_ids, prompt_tokens, run_infer)

# name: gen_mamba2 config (default_cfg fills the rest)
MATRIX = [
    ("hf-f32-st-G1", dict(convention="hf", dtype="f32", format="safetensors", layers=2,
                          d_model=64, d_state=16, headdim=16, vocab=300, seed=101)),
    ("hf-bf16-st-G2", dict(convention="hf", dtype="bf16", format="safetensors", layers=2,
                           d_model=64, d_state=32, headdim=16, ngroups=2, vocab=500, seed=102)),
    ("hf-f16-shard-odd-N24K3", dict(convention="hf", dtype="f16", format="sharded", layers=2,
                                    d_model=48, d_state=24, headdim=12, ngroups=2, d_conv=3,
                                    vocab=613, seed=103)),
    ("hf-f32-st-tied", dict(convention="hf", dtype="f32", format="safetensors", layers=2,
                            d_model=64, d_state=16, headdim=32, tied=True, vocab=333,
                            seed=104)),
    ("ssm-f32-st-tied-G1", dict(convention="ssm", dtype="f32", format="safetensors", layers=2,
                                d_model=64, d_state=16, headdim=32, vocab=300, seed=201)),
    ("ssm-bf16-shard-L3-N20K5", dict(convention="ssm", dtype="bf16", format="sharded",
                                     layers=3, d_model=96, d_state=20, headdim=24, ngroups=2,
                                     d_conv=5, vocab=400, seed=202)),
    ("ssm-f16-st-untied-G4", dict(convention="ssm", dtype="f16", format="safetensors",
                                  layers=2, d_model=64, d_state=8, headdim=8, ngroups=4,
                                  tied=False, vocab=257, seed=203)),
    ("hf-bf16-st-P64N128", dict(convention="hf", dtype="bf16", format="safetensors", layers=2,
                                d_model=128, d_state=128, headdim=64, vocab=512, seed=105)),
    # a long prompt: several chunks of 64 and 7 and several passes, state carried across
    ("hf-f32-st-long150", dict(convention="hf", dtype="f32", format="safetensors", layers=2,
                               d_model=128, d_state=32, headdim=32, ngroups=2, vocab=500,
                               seed=106, prompt=150)),
]

BATCH_CHECKS = [  # (label, --prefill-chunk, WKVM_CPU_PASS_TOKENS)
    ("batch-check chunk 7", 7, None),
    ("batch-check chunk 1", 1, None),
    ("batch-check pass 5", 64, "5"),
]


def run_cmd(cmd, env=None):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=RUN_TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        return 124, "", "timed out after %ds: %s" % (RUN_TIMEOUT, " ".join(cmd))
    return (p.returncode, p.stdout.decode("utf-8", "replace"),
            p.stderr.decode("utf-8", "replace"))


def check_model(exe, name, mdir, tokens, tmp, dtype):
    res = Result(name)
    ref = mamba2_ref.Mamba2.load(mdir)
    ref_ids, ref_logits, _ = ref.generate(tokens, N_GEN)
    runs = [("default", None, False)] + [("chunk %d" % c, c, False) for c in CHUNKS]
    if dtype != "f32":
        runs.append(("--fp32", None, True))
    first = None  # the default run's logits: every chunking must give the same bits
    for label, ch, fp32 in runs:
        lpath = os.path.join(tmp, "%s.%s.logits" % (re.sub(r"\W+", "_", name), label.strip("-")))
        rc, out, err = run_infer(exe, mdir, tokens, logits_out=lpath, generate=N_GEN,
                                 chunk=ch, fp32=fp32)
        if rc != 0:
            res.add("run " + label, False, "wkvm-infer exit %d: %s" % (rc, err.strip()[-400:]))
            continue
        try:
            got = mamba2_ref.read_logits(lpath, ref.V)
        except (OSError, ValueError) as e:
            res.add("logits " + label, False, str(e))
            got = None
        if got is not None:
            compare_logits(res, "logits " + label, ref_logits, got)
            if first is None:
                first = got
            elif not fp32 and not os.environ.get("WKVM_PARITY_BACKEND"):
                # bit-exact chunkings: the CPU's promise (CUDA agrees to GEMM rounding)
                same = np.array_equal(first, got)
                res.add("bits " + label, same,
                        "" if same else "logits differ from the default chunking's")
        ids = parse_ids(out, N_GEN)
        if ids is None:
            res.add("greedy " + label, False,
                    "no line of %d ids in stdout: %r" % (N_GEN, out[-200:]))
            continue
        check_greedy(res, label, ids, ref_ids, ref, tokens, ref_logits.std())
    if not os.environ.get("WKVM_PARITY_BACKEND"):
        for label, ch, pass_tokens in BATCH_CHECKS:
            env = dict(os.environ)
            if pass_tokens:
                env["WKVM_CPU_PASS_TOKENS"] = pass_tokens
            cmd = [exe, "--model", mdir, "--tokens", ",".join(str(t) for t in tokens),
                   "--batch-check", "5", "--generate", str(N_GEN), "--prefill-chunk", str(ch)]
            rc, out, err = run_cmd(cmd, env)
            if rc != 0 and "batch-check" in err and "unrecognized" in err:
                # the check is part of this test's contract: a wkvm-infer without
                # it cannot show that batching leaves a row's logits alone
                res.add(label, False, "wkvm-infer does not recognise --batch-check")
                break
            res.add(label, rc == 0, (out + err).strip()[-300:])
    return res


def negative_cases(tmp):
    """(name, model dir, strings the message may use to name the culprit)."""
    cases = []
    base = gen_mamba2.default_cfg(layers=2, d_model=64, d_state=16, headdim=16, vocab=300,
                                  seed=301)

    def mk(label, cfg, edit_named=None, edit_config=None):
        p = gen_mamba2.make_params(cfg)
        named = gen_mamba2.to_named(p, cfg["convention"])
        conf = gen_mamba2.config_dict(cfg)
        accept = []
        if edit_named is not None:
            accept += edit_named(named)
        if edit_config is not None:
            accept += edit_config(conf)
        d = os.path.join(tmp, "neg-" + label)
        gen_mamba2.write_model(d, cfg, named=named, config=conf)
        cases.append(("neg " + label, d, accept))

    L = "backbone.layers.%d."

    def wrong_in_proj(named):
        n = L % 1 + "mixer.in_proj.weight"
        named[n] = np.zeros((named[n].shape[0] + 2, 64))
        return [n]

    def wrong_conv_k(named):
        n = L % 1 + "mixer.conv1d.weight"
        named[n] = named[n][:, :, :3].copy()
        return [n]

    def reshaped_out_proj(named):  # same element count, transposed shape
        n = L % 0 + "mixer.out_proj.weight"
        named[n] = named[n].T.copy()
        return [n]

    def wrong_alog(named):
        n = L % 1 + "mixer.A_log"
        named[n] = np.zeros(5)
        return [n]

    def missing_d(named):
        n = L % 1 + "mixer.D"
        del named[n]
        return [n]

    def missing_layer(named):  # layer 1 of 3 gone entirely
        for k in [k for k in named if k.startswith(L % 1)]:
            del named[k]
        return [L % 1]

    def unexpected(named):
        n = L % 0 + "mixer.extra.weight"
        named[n] = np.zeros(4)
        return [n]

    def missing_head(named):
        del named["lm_head.weight"]
        return ["lm_head.weight"]

    def cfg_ngroups(conf):
        conf["n_groups"] = 3
        return ["n_groups"]

    def cfg_state(conf):
        conf["state_size"] = 32
        return ["state_size"]

    def cfg_nbg(conf):
        conf["ssm_cfg"]["norm_before_gate"] = True
        return ["norm_before_gate"]

    def cfg_conv_bias(conf):
        conf["use_conv_bias"] = False
        return ["conv1d.bias", "use_conv_bias"]

    def cfg_dt_limit(conf):
        conf["time_step_limit"] = [0.001, 100.0]
        return ["time_step_limit"]

    def cfg_type(conf):
        conf["n_groups"] = "two"
        return ["n_groups"]

    mk("in_proj-shape", base, wrong_in_proj)
    mk("conv1d-kernel", dict(base, dtype="bf16"), wrong_conv_k)
    mk("out_proj-transposed", dict(base, convention="ssm"), reshaped_out_proj)
    mk("A_log-shape", base, wrong_alog)
    mk("D-missing", dict(base, convention="ssm"), missing_d)
    mk("layer-missing", dict(base, layers=3), missing_layer)
    mk("unexpected-tensor", base, unexpected)
    mk("lm_head-missing-untied", dict(base, tied=False), missing_head)
    mk("config-n_groups", base, edit_config=cfg_ngroups)
    mk("config-state_size", base, edit_config=cfg_state)
    mk("config-norm_before_gate", dict(base, convention="ssm"), edit_config=cfg_nbg)
    mk("config-use_conv_bias", base, edit_config=cfg_conv_bias)
    mk("config-time_step_limit", base, edit_config=cfg_dt_limit)
    mk("config-type", base, edit_config=cfg_type)
    return cases


def run_negative(exe, tmp):
    results = []
    for name, d, accept in negative_cases(tmp):
        res = Result(name)
        rc, out, err = run_infer(exe, d, [1, 2, 3], generate=1)
        msg = (err + out).strip()
        res.message = msg
        crashed = rc < 0 or rc >= 128
        res.add("refused", rc != 0 and not crashed,
                "exit %d%s" % (rc, " (signal)" if crashed else ""))
        res.add("names culprit", any(a in msg for a in accept), "message: %r" % msg[-300:])
        results.append(res)
    return results


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
    tmp = tempfile.mkdtemp(prefix="wkvm-m2parity-")
    t0 = time.time()
    results = []
    rng = np.random.default_rng(2025)
    try:
        for name, kw in MATRIX:
            if only and only not in name:
                continue
            kw = dict(kw)
            n_prompt = kw.pop("prompt", N_PROMPT)
            cfg = gen_mamba2.default_cfg(**kw)
            d = os.path.join(tmp, name)
            gen_mamba2.write_model(d, cfg)
            toks = prompt_tokens(rng, cfg["vocab"], n_prompt)
            res = check_model(exe, name, d, toks, tmp, cfg["dtype"])
            results.append(res)
            print("%-4s %s" % ("ok" if res.ok else "FAIL", name), flush=True)
        if not only or only in "negative":
            for res in run_negative(exe, tmp):
                results.append(res)
                print("%-4s %s" % ("ok" if res.ok else "FAIL", res.name), flush=True)
    finally:
        if keep:
            print("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    print("\n=== Mamba2 parity summary (tolerance max|diff|/std < %g, %d prompt tokens, "
          "%d greedy) ===" % (TOL, N_PROMPT, N_GEN))
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
