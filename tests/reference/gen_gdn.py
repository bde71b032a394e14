#!/usr/bin/python3
"""Writes small random Gated DeltaNet (fla-hub `gated_deltanet`) checkpoints.

The layout is what flash-linear-attention's GatedDeltaNetForCausalLM saves:
config.json (model_type "gated_deltanet") plus model.safetensors, or an
index and shards, with the fla names (model.embeddings.weight,
model.layers.N.attn.{q,k,v,a,b,g,o}_proj.weight, attn.{q,k,v}_conv1d.weight
[D, 1, W], attn.A_log, attn.dt_bias, attn.o_norm.weight, attn_norm, mlp_norm,
mlp.{gate,up,down}_proj, model.norm.weight, lm_head.weight unless tied).

Hybrid models (--attn-layers 1,3): the listed layers are fla's Attention
(config "attn" = {layers, num_heads, num_kv_heads, qkv_bias, window_size
null, rope_theta[, qk_norm]} as GatedDeltaNetConfig fills it), with
attn.{q,k,v,o}_proj.weight (q/o [C, C], k/v [Hkv * C / H, C]; head dim
C / num_heads as fla's Attention derives it), attn.{q,k,v}_proj.bias with
--qkv-bias, attn.{q,k}_norm.weight [head dim] with --qk-norm, plus
attn_norm, mlp_norm and the MLP like every layer. Their scores have a
standard deviation of about 2 (neither uniform nor one-hot), so the
attention output depends on the whole context.

The weights are random but scaled to be numerically meaningful: RMSNorm
weights near 1, per-head decays exp(g) spread over roughly (0.4, 1), write
strengths beta spread over (0, 1), logits with a standard deviation of a few
units. The delta-rule state stays bounded (normalised keys, beta <= 2).

make_params() returns the parameters already rounded to the stored dtype, as
float64 arrays keyed by their checkpoint names, so independent checks run on
exactly the values that were written. This module never computes anything a
test compares against (gdn_ref.py does).

Usage:
  gen_gdn.py --out DIR [--seed S --dtype f32|bf16|f16 --format safetensors|sharded
             --layers L --hidden C --heads H --head-dim K --expand-v E
             --v-heads HV --ffn F --vocab V --conv W --no-gate --neg-eigval --tied
             --attn-layers 1,3 --attn-heads H --attn-kv-heads Hkv --qk-norm --qkv-bias
             --rope-theta T]
"""

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_model  # noqa: E402  (dtype rounding and the safetensors writers)

DTYPES = gen_model.DTYPES


def default_cfg(**kw):
    """A small model; keyword arguments override any key."""
    cfg = dict(layers=2, hidden=64, heads=2, head_dim=16, expand_v=2.0, v_heads=None,
               ffn=160, vocab=300, conv=4, use_gate=True, allow_neg_eigval=False,
               tied=False, norm_eps=1e-6, dtype="f32", format="safetensors", seed=1,
               attn_mode="chunk", attn_layers=(), attn_heads=4, attn_kv_heads=None,
               qk_norm=False, qkv_bias=False, rope_theta=10000.0)
    for k in kw:
        if k not in cfg:
            raise KeyError("unknown gen_gdn option %r" % k)
    cfg.update(kw)
    return cfg


def dims(cfg):
    """(C, H, K, HV, Vd, KD, VD, F, V, W) of cfg."""
    C, H, K = cfg["hidden"], cfg["heads"], cfg["head_dim"]
    HV = cfg["v_heads"] or H
    Vd = int(round(K * cfg["expand_v"]))
    return C, H, K, HV, Vd, H * K, HV * Vd, cfg["ffn"], cfg["vocab"], cfg["conv"]


def attn_dims(cfg):
    """(Hq, Hkv, Da) of cfg's attention layers (fla: head dim = hidden / num_heads)."""
    Hq = cfg["attn_heads"]
    Hkv = cfg["attn_kv_heads"] or Hq
    if cfg["hidden"] % Hq or Hq % Hkv or (cfg["hidden"] // Hq) % 2:
        raise ValueError("attention heads do not divide hidden / each other, or odd head dim")
    return Hq, Hkv, cfg["hidden"] // Hq


def make_params(cfg):
    """{checkpoint name: float64 array rounded to cfg's dtype}."""
    rng = np.random.default_rng(cfg["seed"])
    C, H, K, HV, Vd, KD, VD, F, V, W = dims(cfg)
    dt = cfg["dtype"]
    p = {}

    def put(name, a):
        p[name] = gen_model.round_to(a, dt)

    def lin(n_out, n_in, gain=1.0):
        return rng.standard_normal((n_out, n_in)) * gain / np.sqrt(n_in)

    def normw(n):
        return 1.0 + 0.1 * rng.standard_normal(n)

    # Logit std ~ 3: the head rows have norm ~3 against a unit-RMS input.
    put("model.embeddings.weight", rng.standard_normal((V, C)) * 3.0 / np.sqrt(C))
    for i in range(cfg["layers"]):
        b = "model.layers.%d." % i
        if i in cfg["attn_layers"]:
            Hq, Hkv, Da = attn_dims(cfg)
            put(b + "attn_norm.weight", normw(C))
            # q, k rows of norm ~sqrt(Da) * 1.4: scores q.k / sqrt(Da) with std ~2
            put(b + "attn.q_proj.weight", lin(Hq * Da, C, 1.4))
            put(b + "attn.k_proj.weight", lin(Hkv * Da, C, 1.4))
            put(b + "attn.v_proj.weight", lin(Hkv * Da, C))
            if cfg["qkv_bias"]:
                put(b + "attn.q_proj.bias", 0.3 * rng.standard_normal(Hq * Da))
                put(b + "attn.k_proj.bias", 0.3 * rng.standard_normal(Hkv * Da))
                put(b + "attn.v_proj.bias", 0.3 * rng.standard_normal(Hkv * Da))
            put(b + "attn.o_proj.weight", lin(C, Hq * Da))
            if cfg["qk_norm"]:
                put(b + "attn.q_norm.weight", 1.4 * normw(Da))
                put(b + "attn.k_norm.weight", 1.4 * normw(Da))
            put(b + "mlp_norm.weight", normw(C))
            put(b + "mlp.gate_proj.weight", lin(F, C))
            put(b + "mlp.up_proj.weight", lin(F, C))
            put(b + "mlp.down_proj.weight", lin(C, F))
            continue
        put(b + "attn_norm.weight", normw(C))
        put(b + "attn.q_proj.weight", lin(KD, C))
        put(b + "attn.k_proj.weight", lin(KD, C))
        put(b + "attn.v_proj.weight", lin(VD, C))
        put(b + "attn.a_proj.weight", lin(HV, C, 0.5))
        put(b + "attn.b_proj.weight", lin(HV, C))
        if cfg["use_gate"]:
            put(b + "attn.g_proj.weight", lin(VD, C))
        for nm, D in (("q", KD), ("k", KD), ("v", VD)):
            # depthwise taps: the newest input weighs most
            w = rng.standard_normal((D, 1, W)) * 0.3
            w[:, 0, W - 1] += 0.8
            put(b + "attn.%s_conv1d.weight" % nm, w)
        # decay exp(-A * softplus(a x + dt_bias)): A in [1, 8], dt in [1e-3, 0.3]
        A = rng.uniform(1.0, 8.0, HV)
        dtv = np.exp(rng.uniform(np.log(1e-3), np.log(0.3), HV))
        put(b + "attn.A_log", np.log(A))
        put(b + "attn.dt_bias", dtv + np.log(-np.expm1(-dtv)))
        put(b + "attn.o_norm.weight", normw(Vd))
        put(b + "attn.o_proj.weight", lin(C, VD))
        put(b + "mlp_norm.weight", normw(C))
        put(b + "mlp.gate_proj.weight", lin(F, C))
        put(b + "mlp.up_proj.weight", lin(F, C))
        put(b + "mlp.down_proj.weight", lin(C, F))
    put("model.norm.weight", normw(C))
    if not cfg["tied"]:
        put("lm_head.weight", rng.standard_normal((V, C)) * 3.0 / np.sqrt(C))
    return p


def attn_config(cfg):
    """config.json's "attn" (None without attention layers), as fla fills it."""
    if not cfg["attn_layers"]:
        return None
    Hq, Hkv, _ = attn_dims(cfg)
    a = {"layers": sorted(int(i) for i in cfg["attn_layers"]), "num_heads": Hq,
         "num_kv_heads": Hkv, "qkv_bias": cfg["qkv_bias"], "window_size": None,
         "rope_theta": cfg["rope_theta"]}
    if cfg["qk_norm"]:
        a["qk_norm"] = True
    return a


def config_json(cfg):
    C, H, K, HV, Vd, KD, VD, F, V, W = dims(cfg)
    conf = {
        "architectures": ["GatedDeltaNetForCausalLM"],
        "model_type": "gated_deltanet",
        "attn_mode": cfg["attn_mode"],
        "hidden_size": C,
        "num_hidden_layers": cfg["layers"],
        "num_heads": H,
        "head_dim": K,
        "expand_v": cfg["expand_v"],
        "use_gate": cfg["use_gate"],
        "use_short_conv": True,
        "allow_neg_eigval": cfg["allow_neg_eigval"],
        "conv_size": W,
        "hidden_ratio": 4,
        "intermediate_size": F,
        "hidden_act": "swish",
        "norm_eps": cfg["norm_eps"],
        "attn": attn_config(cfg),
        "max_position_embeddings": 2048,
        "vocab_size": V,
        "tie_word_embeddings": cfg["tied"],
        "fuse_norm": True,
        "fuse_swiglu": True,
        "fuse_cross_entropy": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[cfg["dtype"]],
    }
    if cfg["v_heads"] is not None:
        conf["num_v_heads"] = cfg["v_heads"]
    return conf


def write_tokenizer(out, vocab):
    """tokenizer.json through bpe_json when that module exists; False otherwise."""
    try:
        import bpe_json
    except ImportError:
        return False
    bpe_json.write_tokenizer_json(os.path.join(out, "tokenizer.json"), vocab)
    return True


def write_model(out, cfg, named=None, config=None):
    """Writes a full model dir for cfg. named overrides the tensors and config
    the config.json object (tests use them to break a checkpoint). Returns
    the named parameters written."""
    os.makedirs(out, exist_ok=True)
    if named is None:
        named = make_params(cfg)
    if config is None:
        config = config_json(cfg)
    if cfg["format"] == "sharded":
        gen_model.write_sharded(out, named, cfg["dtype"])
    elif cfg["format"] == "safetensors":
        gen_model.write_safetensors(os.path.join(out, "model.safetensors"), named,
                                    cfg["dtype"], {"format": "pt"})
    else:
        raise ValueError("unknown format %r" % cfg["format"])
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    write_tokenizer(out, cfg["vocab"])
    return named


def main(argv=None):
    ap = argparse.ArgumentParser(description="write a small random Gated DeltaNet model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", choices=DTYPES, default="f32")
    ap.add_argument("--format", choices=("safetensors", "sharded"), default="safetensors")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--expand-v", type=float, default=2.0)
    ap.add_argument("--v-heads", type=int, default=None)
    ap.add_argument("--ffn", type=int, default=160)
    ap.add_argument("--vocab", type=int, default=300)
    ap.add_argument("--conv", type=int, default=4)
    ap.add_argument("--no-gate", action="store_true")
    ap.add_argument("--neg-eigval", action="store_true")
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--attn-layers", default="", help="comma-separated attention layer indices")
    ap.add_argument("--attn-heads", type=int, default=4)
    ap.add_argument("--attn-kv-heads", type=int, default=None)
    ap.add_argument("--qk-norm", action="store_true")
    ap.add_argument("--qkv-bias", action="store_true")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    a = ap.parse_args(argv)
    al = tuple(int(x) for x in a.attn_layers.replace(" ", "").split(",") if x != "")
    cfg = default_cfg(seed=a.seed, dtype=a.dtype, format=a.format, layers=a.layers,
                      hidden=a.hidden, heads=a.heads, head_dim=a.head_dim,
                      expand_v=a.expand_v, v_heads=a.v_heads, ffn=a.ffn, vocab=a.vocab,
                      conv=a.conv, use_gate=not a.no_gate, allow_neg_eigval=a.neg_eigval,
                      tied=a.tied, attn_layers=al, attn_heads=a.attn_heads,
                      attn_kv_heads=a.attn_kv_heads, qk_norm=a.qk_norm, qkv_bias=a.qkv_bias,
                      rope_theta=a.rope_theta)
    write_model(a.out, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
