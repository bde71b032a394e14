#!/usr/bin/python3
"""Writes a small random Granite-4.0-H model (numpy only): config.json as
the hub's granitemoehybrid checkpoints have it (model_type
"granitemoehybrid", layer_types "mamba" / "attention", Granite's
multipliers), the weights in model.safetensors under the hub's tensor names,
and a tokenizer.json whose vocab has the 256 raw single bytes (bpe_json).

Per layer: input_layernorm, post_attention_layernorm, shared_mlp.{input_linear
[2 Fs, C], output_linear [C, Fs]}, with --experts E block_sparse_moe.{router.layer
[E, C], input_linear [E, 2 F, C], output_linear [E, C, F]}, and either
mamba.{in_proj, conv1d.weight, conv1d.bias, dt_bias, A_log, D, norm, out_proj}
or self_attn.{q,k,v,o}_proj. tests/reference/upstream_granite_h.py checks
wkvm against transformers itself on models transformers writes; this
generator is for the tests that need no transformers (the serving and
state-operation tests).

  gen_granite_h.py --out DIR [--seed S --dtype f32|bf16 --layers L --attn-layers 1,3
                   --hidden C --vocab V --experts E --top-k K --groups G --rope --tied]
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_gdn  # noqa: E402  (the tokenizer writer)
import gen_model  # noqa: E402  (dtype rounding and the safetensors writers)


def default_cfg(**kw):
    cfg = dict(layers=4, attn_layers=[3], hidden=64, vocab=300, heads=4, kv_heads=2,
               m2_heads=8, m2_head_dim=16, m2_state=16, m2_conv=4, groups=1, experts=0,
               top_k=2, ffn=32, shared_ffn=128, rope=False, tied=True, eps=1e-5,
               emb_mul=12.0, res_mul=0.22, attn_mul=0.0078125, logits_scaling=6.0,
               dtype="f32", seed=1)
    for k in kw:
        if k not in cfg:
            raise KeyError("unknown gen_granite_h option %r" % k)
    cfg.update(kw)
    return cfg


def layer_types(cfg):
    return ["attention" if i in cfg["attn_layers"] else "mamba" for i in range(cfg["layers"])]


def make_params(cfg):
    rng = np.random.default_rng(cfg["seed"])
    C, V, E, F, Fs = cfg["hidden"], cfg["vocab"], cfg["experts"], cfg["ffn"], cfg["shared_ffn"]
    H2, DI = cfg["m2_heads"], cfg["m2_heads"] * cfg["m2_head_dim"]
    CD = DI + 2 * cfg["groups"] * cfg["m2_state"]
    Da = C // cfg["heads"]

    def mat(*shape):
        return (rng.standard_normal(shape) * (0.5 / np.sqrt(shape[-1]))).astype(np.float32)

    def vec(n, center=1.0, scale=0.3):
        return (center + scale * rng.standard_normal(n)).astype(np.float32)

    p = {"model.embed_tokens.weight": (0.1 * rng.standard_normal((V, C))).astype(np.float32)}
    for l, kind in enumerate(layer_types(cfg)):
        q = "model.layers.%d." % l
        p[q + "input_layernorm.weight"] = vec(C)
        if kind == "mamba":
            p[q + "mamba.in_proj.weight"] = mat(DI + CD + H2, C)
            p[q + "mamba.conv1d.weight"] = (
                0.4 * rng.standard_normal((CD, 1, cfg["m2_conv"]))).astype(np.float32)
            p[q + "mamba.conv1d.bias"] = vec(CD, 0.0, 0.1)
            p[q + "mamba.dt_bias"] = vec(H2, -1.5, 0.5)
            p[q + "mamba.A_log"] = np.log(rng.uniform(0.5, 8.0, H2)).astype(np.float32)
            p[q + "mamba.D"] = vec(H2, 0.0, 1.0)
            p[q + "mamba.norm.weight"] = vec(DI)
            p[q + "mamba.out_proj.weight"] = mat(C, DI)
        else:
            p[q + "self_attn.q_proj.weight"] = mat(cfg["heads"] * Da, C)
            p[q + "self_attn.k_proj.weight"] = mat(cfg["kv_heads"] * Da, C)
            p[q + "self_attn.v_proj.weight"] = mat(cfg["kv_heads"] * Da, C)
            p[q + "self_attn.o_proj.weight"] = mat(C, cfg["heads"] * Da)
        p[q + "post_attention_layernorm.weight"] = vec(C)
        if E > 0:
            p[q + "block_sparse_moe.router.layer.weight"] = (
                rng.standard_normal((E, C)) * (3.0 / np.sqrt(C))).astype(np.float32)
            p[q + "block_sparse_moe.input_linear.weight"] = mat(E, 2 * F, C)
            p[q + "block_sparse_moe.output_linear.weight"] = mat(E, C, F)
        p[q + "shared_mlp.input_linear.weight"] = mat(2 * Fs, C)
        p[q + "shared_mlp.output_linear.weight"] = mat(C, Fs)
    p["model.norm.weight"] = vec(C)
    if not cfg["tied"]:
        p["lm_head.weight"] = mat(V, C)
    return p


def config_json(cfg):
    return {
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "model_type": "granitemoehybrid",
        "vocab_size": cfg["vocab"],
        "hidden_size": cfg["hidden"],
        "intermediate_size": cfg["ffn"],
        "shared_intermediate_size": cfg["shared_ffn"],
        "num_hidden_layers": cfg["layers"],
        "num_attention_heads": cfg["heads"],
        "num_key_value_heads": cfg["kv_heads"],
        "num_local_experts": cfg["experts"],
        "num_experts_per_tok": cfg["top_k"],
        "hidden_act": "silu",
        "rms_norm_eps": cfg["eps"],
        "attention_bias": False,
        "layer_types": layer_types(cfg),
        "mamba_n_heads": cfg["m2_heads"],
        "mamba_d_head": cfg["m2_head_dim"],
        "mamba_d_state": cfg["m2_state"],
        "mamba_d_conv": cfg["m2_conv"],
        "mamba_n_groups": cfg["groups"],
        "mamba_expand": cfg["m2_heads"] * cfg["m2_head_dim"] // cfg["hidden"],
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "position_embedding_type": "rope" if cfg["rope"] else "nope",
        "rope_theta": 10000.0,
        "embedding_multiplier": cfg["emb_mul"],
        "residual_multiplier": cfg["res_mul"],
        "attention_multiplier": cfg["attn_mul"],
        "logits_scaling": cfg["logits_scaling"],
        "tie_word_embeddings": cfg["tied"],
        "max_position_embeddings": 131072,
        "dtype": {"f32": "float32", "bf16": "bfloat16"}[cfg["dtype"]],
    }


def write_model(out, cfg, tokenizer=True):
    os.makedirs(out, exist_ok=True)
    named = make_params(cfg)
    gen_model.write_safetensors(os.path.join(out, "model.safetensors"), named, cfg["dtype"],
                                {"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config_json(cfg), f, indent=2)
    if tokenizer:
        gen_gdn.write_tokenizer(out, cfg["vocab"])
    return named


def main(argv=None):
    ap = argparse.ArgumentParser(description="write a small random Granite-4.0-H model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--attn-layers", default="3", help="comma-separated attention layers")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=300)
    ap.add_argument("--experts", type=int, default=0, help="0: the dense (Micro) layout")
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--groups", type=int, default=1, help="mamba_n_groups")
    ap.add_argument("--rope", action="store_true", help="position_embedding_type rope")
    ap.add_argument("--untied", action="store_true")
    ap.add_argument("--no-tokenizer", action="store_true", help="write no tokenizer.json")
    a = ap.parse_args(argv)
    attn = [int(x) for x in a.attn_layers.split(",") if x != ""]
    cfg = default_cfg(seed=a.seed, dtype=a.dtype, layers=a.layers, attn_layers=attn,
                      hidden=a.hidden, vocab=a.vocab, experts=a.experts, top_k=a.top_k,
                      groups=a.groups, rope=a.rope, tied=not a.untied)
    write_model(a.out, cfg, tokenizer=not a.no_tokenizer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
