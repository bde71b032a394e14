#!/usr/bin/python3
"""GPU suite: wkvm-infer's --batch-check and --slot-check on the CUDA
backend, one small random model per family (RWKV-7, Mamba2, Gated DeltaNet,
a hybrid GDN with attention layers and the paged KV pool, a Qwen3.5-MoE, a
Nemotron-H and a Granite-4.0-H MoE layout).

Usage: run_cuda_checks.py TEST_CUDA_FAMILIES_EXE WKVM_INFER_EXE

The CUDA backend agrees across batch shapes and chunkings to GEMM rounding,
not bit for bit (be.h), so both checks run with --check-tolerance 1e-3
(max|diff|/std, the parity tolerance): a row alone and among 4 companion rows
(prefill chunks 7 and 64); fork, hibernate/resume and migration to another
slot continuing like the uninterrupted run; on the hybrid, a full KV pool's
refusals changing nothing. Asks the test binary first (`--probe`): 77
(meson's skip) only without a CUDA device, a failure when a device is there
but does not answer or numpy is missing.
"""

import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "reference")
TOL = "1e-3"

# (name, generator module, generator config)
MODELS = [
    ("rwkv7-bf16-N64", "gen_model", dict(layers=2, embd=128, head_size=64, ffn=256, vocab=300,
                                         dtype="bf16", seed=801)),
    ("mamba2-bf16-G2", "gen_mamba2", dict(convention="hf", dtype="bf16", layers=2, d_model=64,
                                          d_state=32, headdim=16, ngroups=2, vocab=500,
                                          seed=802)),
    ("gdn-f32", "gen_gdn", dict(seed=803)),
    ("gdn-hybrid", "gen_gdn", dict(seed=804, layers=3, attn_layers=(1,), attn_heads=4,
                                   attn_kv_heads=2)),
    ("q35moe-bf16", "gen_qwen35", dict(seed=805, dtype="bf16", experts=8, top_k=2)),
    ("nemotron-h", "gen_nemotron_h", dict(seed=806)),
    ("granite-h-moe", "gen_granite_h", dict(seed=807, experts=4, top_k=2, rope=True)),
]
# generators whose every model has attention layers (the small-pool check)
HYBRIDS = ("gen_qwen35", "gen_nemotron_h", "gen_granite_h")


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def main():
    if len(sys.argv) != 3:
        print("usage: run_cuda_checks.py TEST_CUDA_FAMILIES_EXE WKVM_INFER_EXE", file=sys.stderr)
        return 2
    probe, infer = sys.argv[1], sys.argv[2]
    rc = subprocess.run([probe, "--probe"]).returncode
    if rc != 0:
        return 77 if rc == 77 else rc
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("FAIL: numpy is not installed for %s (deploy/install-deps installs it)"
              % sys.executable)
        return 1
    sys.path.insert(0, REF)
    tokens = ",".join(str((i * 7919 + 13) % 290 + 1) for i in range(40))
    tmp = tempfile.mkdtemp(prefix="wkvm-cuda-checks-")
    passed = failed = 0
    try:
        for name, module, kw in MODELS:
            gen = __import__(module)
            d = os.path.join(tmp, name)
            gen.write_model(d, gen.default_cfg(**kw))
            base = [infer, "--model", d, "--backend", "cuda", "--tokens", tokens,
                    "--generate", "8", "--check-tolerance", TOL]
            checks = [("batch-check chunk %d" % ch, base + ["--batch-check", "5",
                                                           "--prefill-chunk", str(ch)],
                       "batch-check: within tolerance") for ch in (7, 64)]
            checks += [("slot-check chunk %d" % ch, base + ["--slot-check", "--prefill-chunk",
                                                           str(ch)], "slot-check: ok")
                       for ch in (1, 7)]
            if "attn_layers" in kw or module in HYBRIDS:
                checks.append(("slot-check small pool", base + ["--slot-check", "--kv-pages",
                                                               "12", "--prefill-chunk", "7"],
                               "slot-check: ok"))
            for what, cmd, want in checks:
                rc, out, err = run(cmd)
                ok = rc == 0 and want in out
                passed += ok
                failed += not ok
                line = [l for l in out.splitlines() if l.startswith(want.split(":")[0])]
                print("%s %s %s: %s" % ("ok  " if ok else "FAIL", name, what,
                                        (line[-1] if ok and line else
                                         "exit %d: %s" % (rc, (err + out).strip()[-400:]))),
                      flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
