#!/usr/bin/python3
"""RWKV-7: wkvm-infer against BlinkDL's own implementation (the `rwkv` package).

The numpy reference (rwkv7_ref.py) is written from the same equations as the C
code, so it cannot catch a misreading of the model shared by both. This test
runs the package BlinkDL's checkpoints are made for (PyPI `rwkv`, pinned in
deploy/install-ref-venv; RWKV_V7_ON=1, strategy "cpu fp32") on random
BlinkDL-format .pth checkpoints (gen_model.py) and requires wkvm-infer --fp32
to give the same logits at every position, max |diff| / std(logits) < TOL,
on both of the package's paths: the whole sequence at once (forward_seq,
full_output) against wkvm's whole-prompt prefill, and one token at a time
(forward_one) against wkvm's --prefill-chunk 1. The numpy reference
is held to the same bound against the package.

Cases: head sizes 64, 32 and 16 (BlinkDL's GroupNorm eps is 64e-5 at every
head size; wkvm used N * 1e-5, which the 32 and 16 cases catch), layer-0
value LoRA stored or not, F32 and BF16 weights, and a Hugging Face (fla
rwkv7) checkpoint with tie_word_embeddings (no lm_head.weight; wkvm refused
it before), compared with the package running the same weights converted to
BlinkDL names (head = embedding; head size 64, norm_eps 1e-5, where both
conventions' epsilons agree).

The package's loader passes torch.load(mmap=True), which torch 2.1 added;
under Debian's torch 1.13 the keyword is dropped (the whole file is read
instead of mapped: the same tensors).

Exit 0 when every case agrees, 1 on a disagreement, 77 (skip) when the
package cannot be installed (no package index) or wkvm-infer is not built.
Prints the worst max|diff|/std per comparison (docs/FAMILIES.md quotes it).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import upstream_venv  # noqa: E402

upstream_venv.enter("upstream_rwkv7", ["rwkv", "torch", "numpy"])

os.environ["RWKV_V7_ON"] = "1"
os.environ["RWKV_JIT_ON"] = "1"
os.environ["RWKV_CUDA_ON"] = "0"
import numpy as np  # noqa: E402
import torch  # noqa: E402

_torch_load = torch.load


def _load_no_mmap(*a, **kw):
    kw.pop("mmap", None)  # torch < 2.1 has no mmap; reading the whole file is the same
    return _torch_load(*a, **kw)


torch.load = _load_no_mmap
import rwkv  # noqa: E402
from rwkv.model import RWKV  # noqa: E402

import gen_model  # noqa: E402
import rwkv7_ref  # noqa: E402

TOL = 1e-4        # max |diff| / std(logits); measured ~3e-6 .. 1e-5
N_TOKENS = 40

CASES = [
    ("blink-f32-N64-l0v", dict(convention="blink", dtype="f32", format="pth", layer0_v=True,
                               layers=2, embd=128, head_size=64, ffn=384, vocab=600, seed=401)),
    ("blink-f32-N32-L3", dict(convention="blink", dtype="f32", format="pth",
                              layers=3, embd=128, head_size=32, ffn=256, vocab=500, seed=402)),
    ("blink-f32-N16", dict(convention="blink", dtype="f32", format="pth", layer0_v=True,
                           layers=2, embd=64, head_size=16, ffn=256, vocab=300, seed=403)),
    ("blink-bf16-N64-C192", dict(convention="blink", dtype="bf16", format="pth",
                                 layers=2, embd=192, head_size=64, ffn=512, vocab=700,
                                 lora_w=24, lora_a=20, lora_v=12, lora_g=40, seed=404)),
    ("hf-tied-f32-N64", dict(convention="hf", dtype="f32", format="safetensors", tied=True,
                             layers=2, embd=128, head_size=64, ffn=256, vocab=500, seed=405)),
]



def run_upstream(pth_base, tokens):
    """(one token at a time [T, V], whole sequence [T, V]) from the rwkv package."""
    m = RWKV(pth_base, strategy="cpu fp32")
    one, st = [], None
    for t in tokens:
        o, st = m.forward([t], st)
        one.append(o.float().numpy().astype(np.float64))
    seq, _ = m.forward(list(tokens), None, full_output=True)
    return np.stack(one), seq.float().numpy().astype(np.float64)


def main():
    build = upstream_venv.build_dir()
    exe = os.path.join(build, "tools", "wkvm-infer")
    if not os.access(exe, os.X_OK):
        upstream_venv.skip("upstream_rwkv7", "%s is not built" % exe)
    print("rwkv %s (RWKV_V7_ON=1, cpu fp32), torch %s, numpy %s"
          % (getattr(rwkv, "__version__", "") or _pkg_version("rwkv"), torch.__version__,
             np.__version__), flush=True)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    rng = np.random.default_rng(17)
    tmp = tempfile.mkdtemp(prefix="wkvm-up-rwkv7-")
    worst = {}
    fails = 0
    t0 = time.time()
    try:
        for name, kw in CASES:
            cfg = gen_model.default_cfg(**kw)
            d = os.path.join(tmp, name)
            p, _ = gen_model.write_model(d, cfg)
            if cfg["convention"] == "blink":
                base = os.path.join(d, "rwkv7-test")
            else:  # the same weights under BlinkDL names, for the package
                bd = os.path.join(tmp, name + "-as-blink")
                os.makedirs(bd)
                gen_model.write_pth(os.path.join(bd, "rwkv7-test.pth"),
                                    gen_model.to_named(p, "blink"), cfg["dtype"])
                base = os.path.join(bd, "rwkv7-test")
            V = cfg["vocab"]
            toks = [int(x) for x in rng.integers(0, V, N_TOKENS)]
            toks[1], toks[N_TOKENS // 2] = 0, V - 1
            one, seq = run_upstream(base, toks)
            figures = {}
            try:
                lp = os.path.join(tmp, name + ".logits")
                got = upstream_venv.run_wkvm(exe, d, toks, lp, V)
                got1 = upstream_venv.run_wkvm(exe, d, toks, lp, V, chunk=1)
                figures["wkvm vs rwkv sequence"] = upstream_venv.rel_err(seq, got)
                figures["wkvm vs rwkv one-by-one"] = upstream_venv.rel_err(one, got1)
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
                figures["wkvm"] = None
                print("FAIL %s: %s" % (name, e))
            ref, _ = rwkv7_ref.RWKV7.load(d).forward(toks)
            figures["numpy ref vs rwkv one-by-one"] = upstream_venv.rel_err(one, ref)
            ok = all(v is not None and v < TOL for v in figures.values())
            fails += not ok
            print("%-4s %-22s %s" % ("ok" if ok else "FAIL", name, "  ".join(
                "%s %s" % (k, "error" if v is None else "%.2e" % v)
                for k, v in figures.items())), flush=True)
            for k, v in figures.items():
                if v is not None:
                    worst[k] = max(worst.get(k, 0.0), v)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n=== RWKV-7 vs BlinkDL rwkv package (max|diff|/std < %g, %d tokens) ===" %
          (TOL, N_TOKENS))
    for k, v in worst.items():
        print("worst %-30s %.2e" % (k, v))
    print("upstream_rwkv7: %d passed, %d failed in %.1fs" % (len(CASES) - fails, fails,
                                                             time.time() - t0))
    return 1 if fails else 0


def _pkg_version(name):
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:  # noqa: BLE001
        return "?"


if __name__ == "__main__":
    sys.exit(main())
