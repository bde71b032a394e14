#!/usr/bin/python3
"""Q8_0 for Mamba2 and Gated DeltaNet: `wkvm-infer --quantize q8_0` (CPU
backend) against each family's numpy reference run on the same Q8_0 blocks,
dequantized.

For small random models of both families (F32 and BF16, tied and untied
heads, a hybrid GDN with attention layers), this runner:
  1. quantizes, in numpy, the matrices wkvm quantizes (Mamba2: in_proj,
     out_proj and the head; GDN: every q/k/v/a/b/g/o projection, the MLP
     and the head; each when its input dim is a multiple of 32; a tied head
     is quantized as the head's own copy while the embedding lookup stays
     unquantized) with ggml's quantize_row_q8_0_ref arithmetic
     (test_q8_0_parity.q8_0_rows) and runs the family's reference on d * q;
  2. requires wkvm's logits within max|diff| / std(ref) < 1e-3 and its
     greedy ids equal;
  3. requires --prefill-chunk 7 bit-identical to the whole-prompt run and
     --batch-check 5 to pass under Q8_0;
  4. requires the logits to differ from the unquantized run and the Q8_0
     reference to be closer to wkvm than the unquantized reference is.

Exit 0 when all pass, 1 on a failure, 77 without numpy or wkvm-infer.
Environment: WKVM_BUILD_DIR (default ../../build).
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy is not installed for %s" % sys.executable)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gdn_ref  # noqa: E402
import gen_gdn  # noqa: E402
import gen_mamba2  # noqa: E402
import mamba2_ref  # noqa: E402
from test_parity import (N_GEN, RUN_TIMEOUT, TOL, Result, build_dir,  # noqa: E402
                         check_greedy, compare_logits, parse_ids, prompt_tokens)
from test_q8_0_parity import q8_0_rows  # noqa: E402

N_PROMPT = 20

# the weight names wkvm's quant_mats hooks name, by family
M2_QUANT = re.compile(r"\.(in_proj|out_proj)\.weight$|^lm_head\.weight$")
GDN_QUANT = re.compile(r"\.(q_proj|k_proj|v_proj|a_proj|b_proj|g_proj|o_proj|gate_proj|up_proj|"
                       r"down_proj)\.weight$|^lm_head\.weight$")

MODELS = [
    ("mamba2", "m2-hf-f32-untied", dict(convention="hf", dtype="f32", format="safetensors",
                                        layers=2, seed=501)),
    ("mamba2", "m2-ssm-bf16-tied", dict(convention="ssm", dtype="bf16", format="safetensors",
                                        layers=2, tied=True, seed=502)),
    ("gdn", "gdn-f32-gate", dict(seed=511)),
    ("gdn", "gdn-bf16-tied", dict(seed=512, dtype="bf16", tied=True)),
    ("gdn", "gdn-hyb-f32", dict(seed=513, layers=3, attn_layers=(1,), attn_heads=4,
                                attn_kv_heads=2)),
]


def quantized(named, pattern):
    """named with the matching [out, in] matrices replaced by d * q; the count."""
    out, n = dict(named), 0
    for k, w in named.items():
        if pattern.search(k) and w.ndim == 2 and w.shape[1] % 32 == 0:
            out[k] = q8_0_rows(w)
            n += 1
    return out, n


def load_ref(family, mdir, quant):
    if family == "mamba2":
        named = mamba2_ref.read_checkpoint(mdir)
        if quant:
            named, n = quantized(named, M2_QUANT)
            assert n > 0, "no Mamba2 matrix to quantize"
        G, eps = mamba2_ref.read_config(mdir)
        ref = mamba2_ref.Mamba2(named, n_groups=G, eps=eps)
        if quant and ref.head is ref.emb:
            ref.head = q8_0_rows(ref.emb)  # tied: the head's own copy
        return ref, mamba2_ref.read_logits
    conf = None
    cp = os.path.join(mdir, "config.json")
    if os.path.isfile(cp):
        import json
        with open(cp) as f:
            conf = json.load(f)
    named = gdn_ref.read_checkpoint(mdir)
    if quant:
        named, n = quantized(named, GDN_QUANT)
        assert n > 0, "no GDN matrix to quantize"
    ref = gdn_ref.GDN(named, conf)
    if quant and ref.tied:
        ref.head = q8_0_rows(ref.head)  # the embedding's rows; the lookup keeps them
    return ref, gdn_ref.read_logits


def infer(exe, mdir, tokens, lpath, extra=()):
    cmd = [exe, "--model", mdir, "--tokens", ",".join(str(t) for t in tokens),
           "--logits-out", lpath, "--generate", str(N_GEN)] + list(extra)
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        return 124, "", "timed out"
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def check(exe, family, name, kw, tmp, rng):
    res = Result(name)
    kw = dict(kw)
    if family == "mamba2":
        cfg = gen_mamba2.default_cfg(**kw)
        gen = gen_mamba2
    else:
        cfg = gen_gdn.default_cfg(**kw)
        gen = gen_gdn
    mdir = os.path.join(tmp, name)
    gen.write_model(mdir, cfg)
    vocab = cfg.get("vocab") or cfg.get("vocab_size")
    tokens = prompt_tokens(rng, vocab, N_PROMPT)
    ref_q, read_logits = load_ref(family, mdir, True)
    ref_b, _ = load_ref(family, mdir, False)
    ids_q, logits_q, _ = ref_q.generate(tokens, N_GEN)
    _, logits_b, _ = ref_b.generate(tokens, N_GEN)

    q = ["--quantize", "q8_0"]
    base = os.path.join(tmp, name)
    rc, out, err = infer(exe, mdir, tokens, base + ".q.logits", q)
    if rc != 0:
        res.add("run --quantize q8_0", False, "exit %d: %s" % (rc, err.strip()[-400:]))
        return res
    got = read_logits(base + ".q.logits", ref_q.V)
    compare_logits(res, "logits vs the Q8_0 reference", logits_q, got)
    ids = parse_ids(out, N_GEN)
    if ids is None:
        res.add("greedy", False, "no line of %d ids: %r" % (N_GEN, out[-200:]))
    else:
        check_greedy(res, "Q8_0", ids, ids_q, ref_q, tokens, logits_q.std())
    d_q = np.abs(got - logits_q).max()
    d_b = np.abs(got - logits_b).max()
    res.add("closer to the Q8_0 reference than to the unquantized one", d_q < d_b,
            "vs Q8_0 reference %.2e, vs unquantized reference %.2e" % (d_q, d_b))
    rc, _, err = infer(exe, mdir, tokens, base + ".raw.logits")
    if rc == 0:
        with open(base + ".raw.logits", "rb") as f1, open(base + ".q.logits", "rb") as f2:
            res.add("--quantize changes the logits", f1.read() != f2.read())
    else:
        res.add("run unquantized", False, err.strip()[-300:])
    rc, _, err = infer(exe, mdir, tokens, base + ".c7.logits", q + ["--prefill-chunk", "7"])
    if rc == 0:
        with open(base + ".c7.logits", "rb") as f1, open(base + ".q.logits", "rb") as f2:
            res.add("chunk 7 bit-identical under Q8_0", f1.read() == f2.read())
    else:
        res.add("run chunk 7", False, err.strip()[-300:])
    cmd = [exe, "--model", mdir, "--tokens", ",".join(str(t) for t in tokens),
           "--batch-check", "5", "--generate", str(N_GEN)] + q
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=RUN_TIMEOUT)
    res.add("--batch-check 5 under Q8_0", p.returncode == 0,
            (p.stdout + p.stderr).decode("utf-8", "replace").strip()[-300:])
    return res


def main():
    exe = os.path.join(build_dir(), "tools", "wkvm-infer")
    if not os.access(exe, os.X_OK):
        print("SKIP: %s is not built" % exe)
        return 77
    tmp = tempfile.mkdtemp(prefix="wkvm-q8fam-")
    rng = np.random.default_rng(2026)
    failed = 0
    try:
        for family, name, kw in MODELS:
            res = check(exe, family, name, kw, tmp, rng)
            print("%-4s %s" % ("ok" if res.ok else "FAIL", name), flush=True)
            for what, ok, detail in res.checks:
                if not ok or detail:
                    print("       %s %s: %s" % ("ok  " if ok else "FAIL", what, detail))
            failed += not res.ok
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (len(MODELS) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
