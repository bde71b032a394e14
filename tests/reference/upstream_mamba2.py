#!/usr/bin/python3
"""Mamba2: wkvm-infer against transformers' Mamba2ForCausalLM (CPU slow path).

The numpy reference (mamba2_ref.py) is written from the same equations as the
C code. This test loads random Hugging Face `mamba2` checkpoints
(gen_mamba2.py) with transformers itself (Mamba2ForCausalLM.from_pretrained,
pinned in deploy/install-ref-venv, float32, torch_forward: mamba_ssm and
causal_conv1d are not installed) and requires wkvm-infer --fp32 to give the
same logits at every position, max |diff| / std(logits) < TOL:
  - its whole-prompt prefill against the whole sequence at once (the
    chunked SSD scan), and
  - its --prefill-chunk 1 against one token at a time from a zero cache (the recurrent decode path; the
    cache is made by hand with seqlen_offset 1 because transformers 4.46.3
    cannot prefill a single token: torch_forward squeezes its time axis),
for tied and untied heads.

n_groups > 1. wkvm follows mamba_ssm, where the checkpoints come from: the
gated RMSNorm normalises each group of d_inner / n_groups channels
(RMSNormGated(group_size=...)), and head h reads B and C of group
h // (H / n_groups). transformers 4.46.3 normalises over the whole inner
width (MambaRMSNormGated), and its sequence path also tiles the groups over
the heads (B.repeat: head h reads group h mod n_groups; its decode path
expands them as mamba_ssm). So with n_groups > 1 wkvm is compared with a
per-group reference: transformers' decode path, one token at a time, with its
MambaRMSNormGated replaced by mamba_ssm's per-group form. The stock
transformers figures are printed for the record (docs/FAMILIES.md), not
held to TOL.

transformers 4.46.3 clamps dt to time_step_min in the decode path only (its
sequence path and mamba_ssm don't); the checkpoints are loaded with
time_step_min=0 so both paths compute what mamba_ssm computes.

Exit 0 when every case agrees, 1 on a disagreement, 77 (skip) when the
packages cannot be installed (no package index) or wkvm-infer is not built.
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

upstream_venv.enter("upstream_mamba2", ["transformers", "torch", "numpy"])

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import Mamba2ForCausalLM  # noqa: E402
from transformers.models.mamba2 import modeling_mamba2  # noqa: E402

import gen_mamba2  # noqa: E402
import mamba2_ref  # noqa: E402

TOL = 1e-4        # max |diff| / std(logits); measured ~1e-6 .. 1e-5
N_TOKENS = 40

CASES = [
    ("hf-f32-G1-untied", dict(dtype="f32", layers=2, d_model=64, d_state=16, headdim=16,
                              ngroups=1, tied=False, vocab=300, seed=501)),
    ("hf-f32-G1-tied-K3", dict(dtype="f32", layers=3, d_model=64, d_state=24, headdim=16,
                               ngroups=1, d_conv=3, tied=True, vocab=400, seed=502)),
    ("hf-bf16-G1-P64N128", dict(dtype="bf16", layers=2, d_model=128, d_state=128, headdim=64,
                                ngroups=1, tied=False, vocab=500, seed=503)),
    ("hf-f32-G2-tied", dict(dtype="f32", layers=2, d_model=64, d_state=16, headdim=16,
                            ngroups=2, tied=True, vocab=300, seed=504)),
    ("hf-f32-G4-untied-K5", dict(dtype="f32", layers=2, d_model=64, d_state=20, headdim=8,
                                 ngroups=4, d_conv=5, tied=False, vocab=300, seed=505)),
]


def _per_group_forward(self, hidden_states, gate=None):
    """mamba_ssm's RMSNormGated(norm_before_gate=False, group_size=d_inner/G)."""
    dtype = hidden_states.dtype
    h = hidden_states.to(torch.float32)
    if gate is not None:
        h = h * torch.nn.functional.silu(gate.to(torch.float32))
    g = h.view(*h.shape[:-1], self.wkvm_groups, h.shape[-1] // self.wkvm_groups)
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * g.view(h.shape).to(dtype)


def per_group_norms(model, groups):
    for mod in model.modules():
        if isinstance(mod, modeling_mamba2.MambaRMSNormGated):
            mod.wkvm_groups = groups
            mod.forward = _per_group_forward.__get__(mod)


def upstream_sequence(model, tokens):
    with torch.no_grad():
        out = model(torch.tensor([tokens]), use_cache=False).logits[0]
    return out.double().numpy()


def upstream_one_by_one(model, tokens):
    cache = modeling_mamba2.Mamba2Cache(model.config, 1, dtype=torch.float32)
    cache.seqlen_offset = 1  # decode path from the zero state (see the module doc)
    rows = []
    with torch.no_grad():
        for i, t in enumerate(tokens):
            o = model(torch.tensor([[t]]), cache_params=cache, use_cache=True,
                      cache_position=torch.tensor([i + 1]))
            cache = o.cache_params
            rows.append(o.logits[0, -1].double().numpy())
    return np.stack(rows)



def main():
    build = upstream_venv.build_dir()
    exe = os.path.join(build, "tools", "wkvm-infer")
    if not os.access(exe, os.X_OK):
        upstream_venv.skip("upstream_mamba2", "%s is not built" % exe)
    print("transformers %s (Mamba2ForCausalLM, torch_forward), torch %s"
          % (transformers.__version__, torch.__version__), flush=True)
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    rng = np.random.default_rng(23)
    tmp = tempfile.mkdtemp(prefix="wkvm-up-mamba2-")
    worst, stock = {}, {}
    fails = 0
    t0 = time.time()
    try:
        for name, kw in CASES:
            cfg = gen_mamba2.default_cfg(convention="hf", format="safetensors", **kw)
            d = os.path.join(tmp, name)
            gen_mamba2.write_model(d, cfg)
            V, G = cfg["vocab"], cfg["ngroups"]
            toks = [int(x) for x in rng.integers(0, V, N_TOKENS)]
            toks[1] = V - 1
            model = Mamba2ForCausalLM.from_pretrained(d, torch_dtype=torch.float32,
                                                      time_step_min=0.0).eval()
            tied = model.lm_head.weight is model.backbone.embeddings.weight
            figures = {}
            try:
                lp = os.path.join(tmp, name + ".logits")
                got = upstream_venv.run_wkvm(exe, d, toks, lp, V)
                got1 = upstream_venv.run_wkvm(exe, d, toks, lp, V, chunk=1)
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
                got = None
                figures["wkvm"] = None
                print("FAIL %s: %s" % (name, e))
            if G == 1:
                seq = upstream_sequence(model, toks)
                one = upstream_one_by_one(model, toks)
                if got is not None:
                    figures["wkvm vs transformers sequence"] = upstream_venv.rel_err(seq, got)
                    figures["wkvm vs transformers one-by-one"] = upstream_venv.rel_err(one, got1)
            else:
                if got is not None:
                    stock["G%d sequence" % G] = upstream_venv.rel_err(
                        upstream_sequence(model, toks), got)
                    stock["G%d one-by-one" % G] = upstream_venv.rel_err(
                        upstream_one_by_one(model, toks), got1)
                per_group_norms(model, G)
                one = upstream_one_by_one(model, toks)
                if got is not None:
                    figures["wkvm vs per-group one-by-one"] = upstream_venv.rel_err(one, got1)
            ref, _ = mamba2_ref.Mamba2.load(d).forward(toks)
            figures["numpy ref vs upstream one-by-one"] = upstream_venv.rel_err(one, ref)
            if tied != bool(cfg["tied"]):
                figures["transformers tied the head as config.json says"] = None
            ok = all(v is not None and v < TOL for v in figures.values())
            fails += not ok
            print("%-4s %-20s %s" % ("ok" if ok else "FAIL", name, "  ".join(
                "%s %s" % (k, "error" if v is None else "%.2e" % v)
                for k, v in figures.items())), flush=True)
            for k, v in figures.items():
                if v is not None:
                    worst[k] = max(worst.get(k, 0.0), v)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n=== Mamba2 vs transformers %s (max|diff|/std < %g, %d tokens) ==="
          % (transformers.__version__, TOL, N_TOKENS))
    for k, v in worst.items():
        print("worst %-34s %.2e" % (k, v))
    for k, v in stock.items():
        print("for the record, wkvm vs stock transformers %s: %.2e (whole-width "
              "gated RMSNorm%s)" % (k, v, ", groups tiled over heads" if "sequence" in k else ""))
    print("upstream_mamba2: %d passed, %d failed in %.1fs" % (len(CASES) - fails, fails,
                                                              time.time() - t0))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
