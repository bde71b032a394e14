#!/usr/bin/python3
"""wkvm-infer against fla (flash-linear-attention), the implementation the
fla-hub checkpoints come from: RWKV-7 under the HF `rwkv7` names, and Gated
DeltaNet (`gated_deltanet`).

Usage: upstream_fla.py rwkv7|gdn

Random checkpoints in the fla-hub layout (gen_model.py --convention hf,
gen_gdn.py) are loaded with fla's own models (RWKV7ForCausalLM,
GatedDeltaNetForCausalLM through transformers' AutoModelForCausalLM.
from_pretrained, float32) and wkvm-infer --fp32 must give the same logits at
every position, max |diff| / std(logits) < TOL:
  - its whole-prompt prefill against the whole sequence at once (under 64
    tokens, so both layers take their fused-recurrent Triton kernels), and
  - its --prefill-chunk 1 against one token at a time through fla's cache.
fla's kernels are Triton; they run on the CPU under TRITON_INTERPRET=1 (the
fused-recurrent path; the chunk path does not run in the interpreter). The
interpreter has no device to benchmark autotune candidates on, so each
autotuned kernel takes its last config, the widest block (BT rows, BD
channels, B elements, BV value columns): the kernels autotuned on these
paths (norms, token shift, addcmul, causal conv, swiglu, the RWKV-7
recurrence) treat the rows / channels / columns of a block independently,
so the logits are bit-identical to the narrowest block's (checked on every
case), and the interpreter runs one program per block (GDN: 75 s to 40 s). The interpreter also rescans triton.language with
inspect.getmembers at every device-function call, to patch what its kernel
launch has already patched; a device function is patched once per launch
here (bit-identical logits again, 40 s to 23 s).

RWKV-7 cases: head sizes 64, 32 and 16 (fla's g_norm eps is head_dim *
norm_eps), a norm_eps other than 1e-5, a tied head (tie_word_embeddings, no
lm_head.weight), BF16 weights. Gated DeltaNet cases: gate on and off,
allow_neg_eigval, GVA (num_v_heads > num_heads), tied, conv sizes 2..4, BF16.
Hybrid GDN models (attention layers) are not compared: fla's Attention needs
flash-attn, a CUDA-only package.

Tolerance: 1e-3, not the 1e-4 of the other upstream tests. Most positions
agree to ~3e-6, but fla's fp32 kernels (as the interpreter runs them) can
stray further at a rare position: one GDN case (f32-gate, the last of 40
tokens) showed 1.2e-4 against wkvm and the same against the float64 numpy
reference, which agrees with wkvm to ~1e-6 there, so the deviation is
fla's rounding, not a difference in the model. A misread model is off by
1e-2 or more.

The packages come from `deploy/install-ref-venv --fla` (torch and triton from
PyPI: 5.6 GB with the CUDA libraries torch's wheel depends on, about 200 s
cold); WKVM_REF_FLA=0 skips instead. Exit 0 when every case agrees, 1 on a
disagreement, 77 (skip) when the venv cannot be had or wkvm-infer is not
built.
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

FAMILY = sys.argv[1] if len(sys.argv) == 2 else None
NAME = {"rwkv7": "upstream_fla_rwkv7", "gdn": "upstream_fla_gdn"}.get(FAMILY)
if NAME is None:
    print(__doc__)
    sys.exit(2)
upstream_venv.enter(NAME, ["fla", "triton", "transformers", "torch", "numpy"], fla=True)

os.environ["TRITON_INTERPRET"] = "1"
import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton.runtime.autotuner as _autotuner  # noqa: E402

import triton.runtime.interpreter as _interp  # noqa: E402

_prune = _autotuner.Autotuner.prune_configs
_autotuner.Autotuner.prune_configs = lambda self, *a, **k: _prune(self, *a, **k)[-1:]

# A device-function call patches triton.language once per kernel launch, not at every call
# (triton's InterpretedFunction.__call__ without the repeated _patch_lang).
_patched = set()
_grid_call = _interp.GridExecutor.__call__


def _grid_call_fresh(self, *args, **kwargs):
    _patched.clear()
    return _grid_call(self, *args, **kwargs)


def _device_call(self, *args, **kwargs):
    if self.fn not in _patched:
        _interp._patch_lang(self.fn)
        _patched.add(self.fn)
    fn = self.rewrite()
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raise _interp.InterpreterError(repr(e)) from e


_interp.GridExecutor.__call__ = _grid_call_fresh
_interp.InterpretedFunction.__call__ = _device_call

import fla  # noqa: E402,F401  (registers rwkv7 / gated_deltanet with transformers)
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import gdn_ref  # noqa: E402
import gen_gdn  # noqa: E402
import gen_model  # noqa: E402
import rwkv7_ref  # noqa: E402

TOL = 1e-3        # max |diff| / std(logits); see the note above
N_TOKENS = 24     # < 64: fla's fused-recurrent path

RWKV7_CASES = [
    ("hf-f32-N64", dict(dtype="f32", layers=2, embd=128, head_size=64, ffn=256, vocab=500,
                        seed=601)),
    ("hf-f32-N32-L3", dict(dtype="f32", layers=3, embd=128, head_size=32, ffn=256, vocab=400,
                           seed=602)),
    ("hf-f32-N16-eps1e-3", dict(dtype="f32", layers=2, embd=64, head_size=16, ffn=256,
                                vocab=300, norm_eps=1e-3, seed=603)),
    ("hf-f32-tied-N64", dict(dtype="f32", layers=2, embd=128, head_size=64, ffn=256, vocab=500,
                             tied=True, seed=604)),
    ("hf-bf16-C192-odd-lora", dict(dtype="bf16", layers=2, embd=192, head_size=64, ffn=320,
                                   vocab=613, lora_w=24, lora_a=20, lora_v=12, lora_g=40,
                                   seed=605)),
]
GDN_CASES = [
    ("f32-gate", dict(seed=611)),
    ("bf16-tied", dict(seed=612, dtype="bf16", tied=True)),
    ("f32-nogate-conv2", dict(seed=613, use_gate=False, conv=2)),
    ("f32-gva-conv3", dict(seed=614, heads=2, v_heads=4, head_dim=16, expand_v=1.5, conv=3)),
    ("f32-neg-L3C128K32", dict(seed=615, allow_neg_eigval=True, layers=3, hidden=128, heads=2,
                               head_dim=32, ffn=352, vocab=1000)),
]


def write_case(family, tmp, name, kw):
    d = os.path.join(tmp, name)
    if family == "rwkv7":
        cfg = gen_model.default_cfg(convention="hf", format="safetensors", **kw)
        gen_model.write_model(d, cfg)
        return d, cfg["vocab"], lambda toks: rwkv7_ref.RWKV7.load(d).forward(toks)[0]
    cfg = gen_gdn.default_cfg(**kw)
    gen_gdn.write_model(d, cfg)
    return d, cfg["vocab"], lambda toks: gdn_ref.GDN.load(d).forward(toks)[0]


def upstream(model, tokens):
    """(whole sequence [T, V], one token at a time [T, V])."""
    rows, cache = [], None
    with torch.no_grad():
        seq = model(torch.tensor([tokens]), use_cache=False).logits[0].double().numpy()
        for t in tokens:
            o = model(torch.tensor([[t]]), past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            rows.append(o.logits[0, -1].double().numpy())
    return seq, np.stack(rows)



def main():
    build = upstream_venv.build_dir()
    exe = os.path.join(build, "tools", "wkvm-infer")
    if not os.access(exe, os.X_OK):
        upstream_venv.skip(NAME, "%s is not built" % exe)
    from importlib.metadata import version
    print("fla %s, transformers %s, torch %s, triton %s (TRITON_INTERPRET=1)"
          % (version("flash-linear-attention"), transformers.__version__, torch.__version__,
             version("triton")), flush=True)
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    cases = RWKV7_CASES if FAMILY == "rwkv7" else GDN_CASES
    rng = np.random.default_rng(29)
    tmp = tempfile.mkdtemp(prefix="wkvm-up-fla-")
    worst = {}
    fails = 0
    t0 = time.time()
    try:
        for name, kw in cases:
            d, V, reference = write_case(FAMILY, tmp, name, kw)
            toks = [int(x) for x in rng.integers(0, V, N_TOKENS)]
            toks[1] = V - 1
            model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
            seq, one = upstream(model, toks)
            figures = {}
            try:
                lp = os.path.join(tmp, name + ".logits")
                got = upstream_venv.run_wkvm(exe, d, toks, lp, V)
                got1 = upstream_venv.run_wkvm(exe, d, toks, lp, V, chunk=1)
                figures["wkvm vs fla sequence"] = upstream_venv.rel_err(seq, got)
                figures["wkvm vs fla one-by-one"] = upstream_venv.rel_err(one, got1)
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
                figures["wkvm"] = None
                print("FAIL %s: %s" % (name, e))
            figures["numpy ref vs fla sequence"] = upstream_venv.rel_err(seq, reference(toks))
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
    print("\n=== %s vs fla (max|diff|/std < %g, %d tokens) ==="
          % ("RWKV-7 (HF rwkv7)" if FAMILY == "rwkv7" else "Gated DeltaNet", TOL, N_TOKENS))
    for k, v in worst.items():
        print("worst %-28s %.2e" % (k, v))
    print("%s: %d passed, %d failed in %.1fs" % (NAME, len(cases) - fails, fails,
                                                 time.time() - t0))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
