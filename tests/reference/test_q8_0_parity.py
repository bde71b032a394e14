#!/usr/bin/python3
"""Q8_0 parity: `wkvm-infer --quantize q8_0` (CPU backend) against the numpy
reference run on the same Q8_0 blocks, dequantized.

For a few small random RWKV-7 models (HF and BlinkDL layouts, BF16 and F32,
a tied head, LoRA ranks that are and are not multiples of 32), this runner:
  1. quantizes, in numpy, the matrices wkvm quantizes (the projections, the
     channel mix, the ICLR / value / gate LoRAs and the head, when their input
     dim is a multiple of 32; not the decay LoRA, the embedding or vectors)
     with ggml's quantize_row_q8_0_ref arithmetic in float32 (gguf-py's
     Q8_0.quantize_blocks), and runs rwkv7_ref on d * q;
  2. requires wkvm's logits within max|diff| / std(ref) < 1e-3 and its
     greedy ids equal (the near-tie rule of test_parity.py);
  3. requires bit-identical logits for --prefill-chunk 1, 7 and 64 (chunked
     prefill equals token by token), and on each ISA path the CPU has
     (WKVM_CPU_ISA=scalar, avx2, avx512) logits within the tolerance and
     chunk 7 bit-identical to that path's whole-prompt run;
  4. requires --batch-check 5 and --slot-check to pass under Q8_0;
  5. requires the logits to differ from the unquantized run (the flag took
     effect) and the Q8_0 reference to be closer to wkvm than the
     unquantized reference is (it is the Q8_0 blocks that are checked).

Exit 0 when all pass, 1 on a failure, 77 without numpy or wkvm-infer.
Environment: WKVM_BUILD_DIR (default ../../build).
"""

import os
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
import gen_model  # noqa: E402
import rwkv7_ref  # noqa: E402
import test_parity  # noqa: E402

TOL = 1e-3
N_PROMPT = 24
N_GEN = 16

MODELS = [
    ("hf-bf16-C128-lora32", dict(convention="hf", dtype="bf16", layers=2, embd=128,
                                 head_size=32, ffn=256, vocab=500, lora_w=32, lora_a=32,
                                 lora_v=32, lora_g=64, seed=301)),
    ("blink-f32-C64-lora-odd", dict(convention="blink", dtype="f32", layers=2, embd=64,
                                    head_size=16, ffn=192, vocab=300, lora_w=16, lora_a=24,
                                    lora_v=32, lora_g=40, layer0_v=True, seed=302)),
    ("hf-f32-tied-C96", dict(convention="hf", dtype="f32", layers=3, embd=96, head_size=32,
                             ffn=320, vocab=400, tied=True, seed=303)),
]


def np_roundf(n):
    """gguf-py's round half away from zero, exact for float32 inputs."""
    a = np.abs(n).astype(np.float64)
    fl = np.floor(a)
    return np.sign(n) * (fl + np.floor(2 * (a - fl)))


def q8_0_rows(w):
    """w [rows, K] -> d * q (float64) of its Q8_0 blocks along K."""
    rows, K = w.shape
    b = np.asarray(w, dtype=np.float32).reshape(rows * K // 32, 32)
    d = np.abs(b).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        idv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np_roundf((b * idv).astype(np.float32))
    d16 = d.astype(np.float16).astype(np.float64)
    return (q * d16).reshape(rows, K)


def quantize_params(p):
    """The internal params with wkvm's --quantize q8_0 matrices dequantized."""
    q = dict(p)
    q["layers"] = []
    for L in p["layers"]:
        L = dict(L)
        for nm in ("Wr", "Wk", "Wv", "Wo", "ffn_key", "ffn_value"):  # [out, in]
            if L[nm].shape[1] % 32 == 0:
                L[nm] = q8_0_rows(L[nm])
        for nm in ("a1", "a2", "v1", "v2", "g1", "g2"):  # [in, out] (x @ W)
            if nm in L and L[nm].shape[0] % 32 == 0:
                L[nm] = q8_0_rows(L[nm].T).T
        q["layers"].append(L)
    if p["head"].shape[1] % 32 == 0:
        q["head"] = q8_0_rows(p["head"])  # a new array: a tied embedding stays
    return q


def run(exe, mdir, tokens, extra, env=None):
    cmd = [exe, "--model", mdir, "--tokens", ",".join(str(t) for t in tokens)] + extra
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e, timeout=120)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def isa_names():
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    names = ["scalar"]
    if " avx2" in flags and " fma" in flags:
        names.append("avx2")
    if " avx512f" in flags:
        names.append("avx512")
    return names


def check(exe, name, kw, tmp, rng):
    res = test_parity.Result(name)
    cfg = gen_model.default_cfg(format="safetensors", **kw)
    mdir = os.path.join(tmp, name)
    gen_model.write_model(mdir, cfg)
    toks = test_parity.prompt_tokens(rng, cfg["vocab"], N_PROMPT)
    base = rwkv7_ref.RWKV7.load(mdir)
    ref = rwkv7_ref.RWKV7(quantize_params(base.p))
    ref_ids, ref_logits, _ = ref.generate(toks, N_GEN)
    _, base_logits, _ = base.generate(toks, N_GEN)
    std = ref_logits.std()

    def logits(label, extra, env=None):
        path = os.path.join(tmp, "%s.%s.logits" % (name, label))
        rc, out, err = run(exe, mdir, toks, ["--logits-out", path, "--generate", str(N_GEN)]
                           + extra, env)
        if rc != 0:
            res.add("run " + label, False, "exit %d: %s" % (rc, err.strip()[-300:]))
            return None, None, None
        with open(path, "rb") as f:
            raw = f.read()
        return raw, rwkv7_ref.read_logits(path, ref.V), test_parity.parse_ids(out, N_GEN)

    q = ["--quantize", "q8_0"]
    raw, got, ids = logits("q8_0", q)
    if raw is None:
        return res
    test_parity.compare_logits(res, "logits q8_0", ref_logits, got)
    if ids is None:
        res.add("greedy", False, "no ids printed")
    else:
        test_parity.check_greedy(res, "q8_0", ids, ref_ids, ref, toks, std)
    d_q = float(np.abs(got - ref_logits).max() / std)
    d_base = float(np.abs(got - base_logits).max() / std)
    res.add("the Q8_0 blocks are what runs", d_q < d_base,
            "vs Q8_0 reference %.2e, vs unquantized reference %.2e" % (d_q, d_base))
    for ch in (1, 7, 64):
        r2, _, _ = logits("chunk%d" % ch, q + ["--prefill-chunk", str(ch)])
        if r2 is not None:
            res.add("chunk %d bit-identical" % ch, r2 == raw)
    for isa in isa_names():
        # the Q8_0 GEMM gives the same bits on every path (test_be_cpu's
        # test_gemm_q8_0); the rest of the step (WKV, norms) differs between
        # paths, so here each path is held to the reference and to itself
        env = {"WKVM_CPU_ISA": isa}
        r1, g1, _ = logits("isa-" + isa, q, env)
        r2, _, _ = logits("isa-%s-chunk7" % isa, q + ["--prefill-chunk", "7"], env)
        if r1 is not None:
            test_parity.compare_logits(res, "logits " + isa, ref_logits, g1)
        if r1 is not None and r2 is not None:
            res.add("%s chunk 7 bit-identical" % isa, r1 == r2)
    r2, _, _ = logits("plain", [])
    if r2 is not None:
        res.add("--quantize changes the logits", r2 != raw)
    for label, extra in (("batch-check", ["--batch-check", "5"]), ("slot-check", ["--slot-check"])):
        rc, out, err = run(exe, mdir, toks, q + ["--generate", "6"] + extra)
        res.add(label, rc == 0, (out + err).strip()[-200:])
    return res


def main():
    build = test_parity.build_dir()
    exe = os.path.join(build, "tools", "wkvm-infer")
    if not os.access(exe, os.X_OK):
        print("SKIP: %s is not built" % exe)
        return 77
    tmp = tempfile.mkdtemp(prefix="wkvm-q8-parity-")
    rng = np.random.default_rng(2025)
    nfail = 0
    try:
        for name, kw in MODELS:
            res = check(exe, name, kw, tmp, rng)
            print("%-4s %s" % ("ok" if res.ok else "FAIL", name))
            for what, ok, detail in res.checks:
                if not ok or what.startswith("logits") or what.startswith("the Q8_0"):
                    print("       %s %-28s %s" % ("ok  " if ok else "FAIL", what, detail))
            nfail += not res.ok
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d/%d models passed" % (len(MODELS) - nfail, len(MODELS)))
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())
