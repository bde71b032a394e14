#!/usr/bin/python3
"""Writes a small random Qwen3.5 model (numpy only): config.json as
transformers' save_pretrained writes it for Qwen3_5ForCausalLM
(model_type "qwen3_5_text", weights under model.*) or, with --multimodal,
for Qwen3_5ForConditionalGeneration (model_type "qwen3_5", text_config,
the text model under model.language_model.*, plus a token vision tower under
model.visual.* and an MTP layer under mtp.* that wkvm must skip), the
weights in model.safetensors (or shards with an index), and a tokenizer.json
whose vocab has the 256 raw single bytes (bpe_json).

The tensor names and shapes are transformers 5.x's (models/qwen3_5): per
layer input_layernorm, post_attention_layernorm, mlp.{gate,up,down}_proj and
either linear_attn.{in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d,
dt_bias, A_log, norm, out_proj} (Gated DeltaNet) or self_attn.{q_proj (query
and output gate per head), k_proj, v_proj, o_proj, q_norm, k_norm}.
tests/reference/upstream_qwen35.py checks wkvm against transformers itself on
models transformers writes; this generator is for the tests that need no
transformers (the serving and state-operation tests).

  gen_qwen35.py --out DIR [--seed S --dtype f32|bf16 --layers L --interval N
                --hidden C --vocab V --ffn F --heads H --kv-heads H --head-dim D
                --lin-k-heads H --lin-v-heads H --lin-dim D --tied --multimodal
                --format safetensors|sharded --no-tokenizer --experts E --top-k K]

--experts E writes a Qwen3.5-MoE model (model_type qwen3_5_moe_text): every
MLP a mixture of E experts (mlp.gate, the fused mlp.experts.gate_up_proj
[E, 2 Fe, C] / down_proj [E, C, Fe]) plus the gated shared expert.
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
    cfg = dict(layers=4, interval=4, hidden=64, ffn=160, vocab=300, heads=4, kv_heads=2,
               head_dim=32, lin_k_heads=2, lin_v_heads=4, lin_k_dim=16, lin_v_dim=16, conv=4,
               partial_rotary=0.25, rope_theta=10000000.0, eps=1e-6, tied=False,
               multimodal=False, dtype="f32", format="safetensors", seed=1,
               experts=0, top_k=2, moe_ffn=32, shared_ffn=48)
    for k in kw:
        if k not in cfg:
            raise KeyError("unknown gen_qwen35 option %r" % k)
    cfg.update(kw)
    return cfg


def layer_types(cfg):
    return ["full_attention" if (i + 1) % cfg["interval"] == 0 else "linear_attention"
            for i in range(cfg["layers"])]


def make_params(cfg):
    rng = np.random.default_rng(cfg["seed"])
    C, F, V = cfg["hidden"], cfg["ffn"], cfg["vocab"]
    KD = cfg["lin_k_heads"] * cfg["lin_k_dim"]
    VD = cfg["lin_v_heads"] * cfg["lin_v_dim"]
    HV = cfg["lin_v_heads"]
    QD = cfg["heads"] * cfg["head_dim"]
    KVD = cfg["kv_heads"] * cfg["head_dim"]
    pre = "model.language_model." if cfg["multimodal"] else "model."

    def mat(o, i):
        return (rng.standard_normal((o, i)) * (0.5 / np.sqrt(i))).astype(np.float32)

    def vec(n, center=0.0, scale=0.3):
        return (center + scale * rng.standard_normal(n)).astype(np.float32)

    p = {pre + "embed_tokens.weight": rng.standard_normal((V, C)).astype(np.float32)}
    for l, kind in enumerate(layer_types(cfg)):
        q = "%slayers.%d." % (pre, l)
        p[q + "input_layernorm.weight"] = vec(C)
        if kind == "linear_attention":
            p[q + "linear_attn.in_proj_qkv.weight"] = mat(2 * KD + VD, C)
            p[q + "linear_attn.in_proj_z.weight"] = mat(VD, C)
            p[q + "linear_attn.in_proj_b.weight"] = mat(HV, C)
            p[q + "linear_attn.in_proj_a.weight"] = mat(HV, C)
            p[q + "linear_attn.conv1d.weight"] = (
                0.4 * rng.standard_normal((2 * KD + VD, 1, cfg["conv"]))).astype(np.float32)
            p[q + "linear_attn.dt_bias"] = vec(HV, 0.5, 0.5)
            p[q + "linear_attn.A_log"] = np.log(rng.uniform(0.1, 2.5, HV)).astype(np.float32)
            p[q + "linear_attn.norm.weight"] = vec(cfg["lin_v_dim"], 1.0)
            p[q + "linear_attn.out_proj.weight"] = mat(C, VD)
        else:
            p[q + "self_attn.q_proj.weight"] = mat(2 * QD, C)
            p[q + "self_attn.k_proj.weight"] = mat(KVD, C)
            p[q + "self_attn.v_proj.weight"] = mat(KVD, C)
            p[q + "self_attn.o_proj.weight"] = mat(C, QD)
            p[q + "self_attn.q_norm.weight"] = vec(cfg["head_dim"])
            p[q + "self_attn.k_norm.weight"] = vec(cfg["head_dim"])
        p[q + "post_attention_layernorm.weight"] = vec(C)
        if cfg["experts"]:  # Qwen3.5-MoE: fused experts (transformers 5's layout)
            E, Fe, Fs = cfg["experts"], cfg["moe_ffn"], cfg["shared_ffn"]
            p[q + "mlp.gate.weight"] = mat(E, C)
            p[q + "mlp.experts.gate_up_proj"] = np.stack([mat(2 * Fe, C) for _ in range(E)])
            p[q + "mlp.experts.down_proj"] = np.stack([mat(C, Fe) for _ in range(E)])
            p[q + "mlp.shared_expert.gate_proj.weight"] = mat(Fs, C)
            p[q + "mlp.shared_expert.up_proj.weight"] = mat(Fs, C)
            p[q + "mlp.shared_expert.down_proj.weight"] = mat(C, Fs)
            p[q + "mlp.shared_expert_gate.weight"] = mat(1, C)
            continue
        p[q + "mlp.gate_proj.weight"] = mat(F, C)
        p[q + "mlp.up_proj.weight"] = mat(F, C)
        p[q + "mlp.down_proj.weight"] = mat(C, F)
    p[pre + "norm.weight"] = vec(C)
    if not cfg["tied"]:
        p["lm_head.weight"] = mat(V, C)
    if cfg["multimodal"]:  # what wkvm skips: a token vision tower and an MTP layer
        p["model.visual.patch_embed.proj.weight"] = mat(32, 48)
        p["model.visual.blocks.0.norm1.weight"] = vec(32, 1.0)
        p["mtp.fc.weight"] = mat(C, 2 * C)
        p["mtp.norm.weight"] = vec(C)
    return p


def config_json(cfg):
    text = {
        "model_type": "qwen3_5_text",
        "vocab_size": cfg["vocab"],
        "hidden_size": cfg["hidden"],
        "intermediate_size": cfg["ffn"],
        "num_hidden_layers": cfg["layers"],
        "num_attention_heads": cfg["heads"],
        "num_key_value_heads": cfg["kv_heads"],
        "head_dim": cfg["head_dim"],
        "hidden_act": "silu",
        "rms_norm_eps": cfg["eps"],
        "attention_bias": False,
        "linear_conv_kernel_dim": cfg["conv"],
        "linear_key_head_dim": cfg["lin_k_dim"],
        "linear_value_head_dim": cfg["lin_v_dim"],
        "linear_num_key_heads": cfg["lin_k_heads"],
        "linear_num_value_heads": cfg["lin_v_heads"],
        "layer_types": layer_types(cfg),
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg["rope_theta"],
                            "partial_rotary_factor": cfg["partial_rotary"],
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        "tie_word_embeddings": cfg["tied"],
        "max_position_embeddings": 32768,
        "dtype": {"f32": "float32", "bf16": "bfloat16"}[cfg["dtype"]],
    }
    moe = cfg["experts"] > 0
    if moe:
        text.update({"model_type": "qwen3_5_moe_text", "num_experts": cfg["experts"],
                     "num_experts_per_tok": cfg["top_k"],
                     "moe_intermediate_size": cfg["moe_ffn"],
                     "shared_expert_intermediate_size": cfg["shared_ffn"]})
    if not cfg["multimodal"]:
        text["architectures"] = ["Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"]
        return text
    return {"architectures": ["Qwen3_5MoeForConditionalGeneration" if moe
                              else "Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5_moe" if moe else "qwen3_5",
            "text_config": text, "vision_config": {"model_type": "qwen3_5_vision", "depth": 1},
            "tie_word_embeddings": cfg["tied"], "image_token_id": 248056}


def write_model(out, cfg, tokenizer=True):
    os.makedirs(out, exist_ok=True)
    named = make_params(cfg)
    if cfg["format"] == "sharded":
        gen_model.write_sharded(out, named, cfg["dtype"])
    else:
        gen_model.write_safetensors(os.path.join(out, "model.safetensors"), named, cfg["dtype"],
                                    {"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config_json(cfg), f, indent=2)
    if tokenizer:
        gen_gdn.write_tokenizer(out, cfg["vocab"])
    return named


def main(argv=None):
    ap = argparse.ArgumentParser(description="write a small random Qwen3.5 model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--format", choices=("safetensors", "sharded"), default="safetensors")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--interval", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=300)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--multimodal", action="store_true")
    ap.add_argument("--ffn", type=int, default=160)
    ap.add_argument("--heads", type=int, default=4, help="attention query heads")
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32, help="attention head dim")
    ap.add_argument("--lin-k-heads", type=int, default=2)
    ap.add_argument("--lin-v-heads", type=int, default=4)
    ap.add_argument("--lin-dim", type=int, default=16, help="linear key and value head dim")
    ap.add_argument("--no-tokenizer", action="store_true", help="write no tokenizer.json")
    ap.add_argument("--experts", type=int, default=0, help="Qwen3.5-MoE with E experts")
    ap.add_argument("--top-k", type=int, default=2, help="experts per token")
    a = ap.parse_args(argv)
    cfg = default_cfg(seed=a.seed, dtype=a.dtype, format=a.format, layers=a.layers,
                      interval=a.interval, hidden=a.hidden, vocab=a.vocab, tied=a.tied,
                      multimodal=a.multimodal, ffn=a.ffn, heads=a.heads, kv_heads=a.kv_heads,
                      head_dim=a.head_dim, lin_k_heads=a.lin_k_heads, lin_v_heads=a.lin_v_heads,
                      lin_k_dim=a.lin_dim, lin_v_dim=a.lin_dim, experts=a.experts,
                      top_k=a.top_k)
    write_model(a.out, cfg, tokenizer=not a.no_tokenizer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
