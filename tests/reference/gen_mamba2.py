#!/usr/bin/python3
"""Writes small random Mamba2 checkpoints for tests.

The weights are random but scaled so that the model is numerically meaningful:
RMSNorm weights near 1, time steps dt = softplus(dt_raw + dt_bias) mostly in
(0.005, 0.3), A = -exp(A_log) in (-16, -1) so the per-step decays exp(dt A)
spread over (0.01, 1) (the recurrence neither dies nor explodes), conv and
projection outputs of unit scale, logits with a standard deviation of a few
units.

Two checkpoint conventions:
  hf   Hugging Face transformers `mamba2`: backbone.embeddings.weight,
       lm_head.weight (absent when tied), config.json with model_type mamba2,
       hidden_size, state_size, n_groups, head_dim, num_heads, ...
  ssm  mamba_ssm / state-spaces: backbone.embedding.weight, lm_head tied to
       the embedding and absent, config.json with d_model, n_layer and an
       ssm_cfg object (d_state, d_conv, expand, headdim, ngroups), no
       model_type.
Both share the layer names backbone.layers.N.norm.weight and
backbone.layers.N.mixer.{in_proj.weight, conv1d.weight, conv1d.bias, dt_bias,
A_log, D, norm.weight, out_proj.weight} and backbone.norm_f.weight.
Weights in F32, BF16 or F16, as one model.safetensors or two shards plus an
index. A tokenizer.json is written beside them when tests/reference/bpe_json.py
exists.

make_params() returns the internal parameters already rounded to the stored
dtype, as float64, so independent checks run on exactly the values written.
This module never reads anything a test compares against; mamba2_ref.py loads
what this writes.

Usage:
  gen_mamba2.py --out DIR [--seed S --convention hf|ssm --dtype f32|bf16|f16
               --format safetensors|sharded --layers L --d-model C
               --d-state N --headdim P --expand E --ngroups G --d-conv K
               --vocab V --tied yes|no]
"""

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_model import DTYPES, round_to, write_safetensors, write_sharded  # noqa: E402

EPS = 1e-5


def default_cfg(**kw):
    cfg = dict(layers=2, d_model=64, d_state=16, headdim=16, expand=2, ngroups=1, d_conv=4,
               vocab=300, convention="hf", dtype="f32", format="safetensors", tied=None,
               eps=EPS, seed=1)
    cfg.update(kw)
    if cfg["tied"] is None:
        cfg["tied"] = cfg["convention"] == "ssm"
    d_inner = cfg["expand"] * cfg["d_model"]
    if d_inner % cfg["headdim"] != 0:
        raise ValueError("expand * d_model must be a multiple of headdim")
    H = d_inner // cfg["headdim"]
    if H % cfg["ngroups"] != 0:
        raise ValueError("the head count %d must be a multiple of ngroups" % H)
    if cfg["d_conv"] < 2:
        raise ValueError("d_conv must be at least 2")
    return cfg


def dims(cfg):
    """(C, d_inner, H, P, G, N, K, conv_dim, d_in_proj, V)"""
    C, P, G, N, K = cfg["d_model"], cfg["headdim"], cfg["ngroups"], cfg["d_state"], cfg["d_conv"]
    d_inner = cfg["expand"] * C
    H = d_inner // P
    conv_dim = d_inner + 2 * G * N
    return C, d_inner, H, P, G, N, K, conv_dim, 2 * d_inner + 2 * G * N + H, cfg["vocab"]


def make_params(cfg):
    """Random internal parameters.

    Returns dict: emb [V, C], norm_f [C], lm_head [V, C] or None (tied),
    layers: list of dicts with norm [C], in_proj [d_in_proj, C] (rows z, xBC,
    dt), conv_w [conv_dim, 1, K], conv_b [conv_dim], dt_bias [H], A_log [H],
    D [H], gnorm [d_inner], out_proj [C, d_inner]. Every array is float64
    holding values exactly representable in cfg['dtype'].
    """
    rng = np.random.default_rng(cfg["seed"])
    C, d_inner, H, P, G, N, K, conv_dim, d_in, V = dims(cfg)
    dt = cfg["dtype"]

    def nrm(shape, std):
        return round_to(rng.standard_normal(shape) * std, dt)

    def normw(n):
        return round_to(1.0 + rng.standard_normal(n) * 0.1, dt)

    p = {"layers": []}
    if cfg["tied"]:
        # the embedding is the head too: small rows, logits std of a few units
        p["emb"] = nrm((V, C), 3.0 / np.sqrt(C))
        p["lm_head"] = None
    else:
        p["emb"] = nrm((V, C), 1.0)
        p["lm_head"] = nrm((V, C), 3.0 / np.sqrt(C))
    p["norm_f"] = normw(C)
    for _ in range(cfg["layers"]):
        L = {"norm": normw(C)}
        w = rng.standard_normal((d_in, C)) / np.sqrt(C)
        w[2 * d_inner + 2 * G * N:] *= 0.5  # dt rows: raw dt of std ~0.5
        L["in_proj"] = round_to(w, dt)
        L["conv_w"] = nrm((conv_dim, 1, K), 0.8 / np.sqrt(K))
        L["conv_b"] = nrm((conv_dim,), 0.1)
        # dt_bias = softplus^-1(dt0), dt0 log-uniform in (0.005, 0.2)
        dt0 = np.exp(rng.uniform(np.log(0.005), np.log(0.2), H))
        L["dt_bias"] = round_to(dt0 + np.log(-np.expm1(-dt0)), dt)
        L["A_log"] = round_to(np.log(rng.uniform(1.0, 16.0, H)), dt)
        L["D"] = round_to(1.0 + rng.standard_normal(H) * 0.2, dt)
        L["gnorm"] = normw(d_inner)
        L["out_proj"] = nrm((C, d_inner), 0.5 / np.sqrt(d_inner))
        p["layers"].append(L)
    return p


def to_named(p, convention):
    """Maps internal params to an ordered dict of checkpoint name -> array."""
    out = {}
    if convention == "hf":
        out["backbone.embeddings.weight"] = p["emb"]
    elif convention == "ssm":
        out["backbone.embedding.weight"] = p["emb"]
    else:
        raise ValueError("unknown convention %r" % convention)
    for i, L in enumerate(p["layers"]):
        b = "backbone.layers.%d." % i
        out[b + "norm.weight"] = L["norm"]
        m = b + "mixer."
        out[m + "in_proj.weight"] = L["in_proj"]
        out[m + "conv1d.weight"] = L["conv_w"]
        out[m + "conv1d.bias"] = L["conv_b"]
        out[m + "dt_bias"] = L["dt_bias"]
        out[m + "A_log"] = L["A_log"]
        out[m + "D"] = L["D"]
        out[m + "norm.weight"] = L["gnorm"]
        out[m + "out_proj.weight"] = L["out_proj"]
    out["backbone.norm_f.weight"] = p["norm_f"]
    if p["lm_head"] is not None:
        out["lm_head.weight"] = p["lm_head"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def config_dict(cfg):
    """config.json contents for cfg's convention."""
    C, d_inner, H, P, G, N, K, conv_dim, d_in, V = dims(cfg)
    if cfg["convention"] == "hf":
        return {
            "architectures": ["Mamba2ForCausalLM"],
            "model_type": "mamba2",
            "hidden_size": C,
            "num_hidden_layers": cfg["layers"],
            "vocab_size": V,
            "state_size": N,
            "expand": cfg["expand"],
            "conv_kernel": K,
            "n_groups": G,
            "head_dim": P,
            "num_heads": H,
            "layer_norm_epsilon": cfg["eps"],
            "rms_norm": True,
            "residual_in_fp32": True,
            "use_bias": False,
            "use_conv_bias": True,
            "hidden_act": "silu",
            "chunk_size": 256,
            "tie_word_embeddings": bool(cfg["tied"]),
            "torch_dtype": {"f32": "float32", "bf16": "bfloat16",
                            "f16": "float16"}[cfg["dtype"]],
        }
    return {
        "d_model": C,
        "d_intermediate": 0,
        "n_layer": cfg["layers"],
        "vocab_size": V,
        "ssm_cfg": {"layer": "Mamba2", "d_state": N, "d_conv": K, "expand": cfg["expand"],
                    "headdim": P, "ngroups": G},
        "attn_layer_idx": [],
        "attn_cfg": {},
        "rms_norm": True,
        "residual_in_fp32": True,
        "fused_add_norm": True,
        "pad_vocab_size_multiple": 1,
        "tie_embeddings": bool(cfg["tied"]),
    }


def write_tokenizer(out, vocab):
    """tokenizer.json via bpe_json when that module exists and the vocab holds
    its special token and 256 byte tokens (vocab >= 257); returns whether
    written."""
    if vocab < 257:
        return False
    try:
        import bpe_json  # optional: written beside this module
    except ImportError:
        return False
    bpe_json.write_tokenizer_json(os.path.join(out, "tokenizer.json"), vocab)
    return True


def write_model(out, cfg, named=None, config=None):
    """Writes a full model dir for cfg. named overrides the tensors and config
    the config.json dict (tests use them to break a checkpoint). Returns
    (params, named); params is None when named was given."""
    os.makedirs(out, exist_ok=True)
    p = None
    if named is None:
        p = make_params(cfg)
        named = to_named(p, cfg["convention"])
    if cfg["format"] == "sharded":
        write_sharded(out, named, cfg["dtype"])
    elif cfg["format"] == "safetensors":
        write_safetensors(os.path.join(out, "model.safetensors"), named, cfg["dtype"],
                          {"format": "pt"})
    else:
        raise ValueError("unknown format %r" % cfg["format"])
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config if config is not None else config_dict(cfg), f, indent=2)
    write_tokenizer(out, cfg["vocab"])
    return p, named


def main(argv=None):
    ap = argparse.ArgumentParser(description="write a small random Mamba2 model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--convention", choices=("hf", "ssm"), default="hf")
    ap.add_argument("--dtype", choices=DTYPES, default="f32")
    ap.add_argument("--format", choices=("safetensors", "sharded"), default="safetensors")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--d-state", type=int, default=16)
    ap.add_argument("--headdim", type=int, default=16)
    ap.add_argument("--expand", type=int, default=2)
    ap.add_argument("--ngroups", type=int, default=1)
    ap.add_argument("--d-conv", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=300)
    ap.add_argument("--tied", choices=("yes", "no", "auto"), default="auto",
                    help="lm_head tied to the embedding (auto: ssm yes, hf no)")
    a = ap.parse_args(argv)
    cfg = default_cfg(layers=a.layers, d_model=a.d_model, d_state=a.d_state, headdim=a.headdim,
                      expand=a.expand, ngroups=a.ngroups, d_conv=a.d_conv, vocab=a.vocab,
                      convention=a.convention, dtype=a.dtype, format=a.format, seed=a.seed,
                      tied=None if a.tied == "auto" else a.tied == "yes")
    write_model(a.out, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
