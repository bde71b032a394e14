#!/usr/bin/python3
"""Writes a small random Nemotron-H model (numpy only): config.json as
transformers' save_pretrained writes it for NemotronHForCausalLM
(model_type "nemotron_h", layers_block_type), the weights in
model.safetensors under the checkpoints' names (backbone.*, one tensor per
expert, lm_head), and a tokenizer.json whose vocab has the 256 raw single
bytes (bpe_json).

Per layer backbone.layers.<l>.norm.weight and backbone.layers.<l>.mixer.*:
Mamba2 (in_proj, conv1d weight / bias, dt_bias, A_log, D, norm, out_proj),
attention (q/k/v/o_proj), squared-ReLU MLP (up_proj, down_proj) or MoE
(gate.weight, gate.e_score_correction_bias, experts.<e>.{up,down}_proj,
shared_experts.{up,down}_proj). tests/reference/upstream_nemotron_h.py
checks wkvm against transformers itself on models transformers writes; this
generator is for the tests that need no transformers (serving, states).

  gen_nemotron_h.py --out DIR [--seed S --dtype f32|bf16 --pattern M*M-ME
                    --hidden C --vocab V --no-tokenizer --legacy-config
                    --heads H --kv-heads K --head-dim D --ffn F --m2-heads H2
                    --m2-head-dim P --groups G --state N --experts E --top-k K
                    --moe-ffn FE --shared-ffn FS --n-group NG --topk-group TG --scale S]

--legacy-config writes the older spelling the released dense checkpoints
(Nemotron-H-8B/4B) use: hybrid_override_pattern, mamba_n_groups,
mamba_d_conv and no MoE keys. llama.cpp's converter needs it for a dense
model (it reads the MLP layers of a layers_block_type list as "moe" only);
bench/hybrid-gguf.py's benchmark model is written so.
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

KINDS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}


def default_cfg(**kw):
    cfg = dict(pattern="M*M-ME", hidden=64, vocab=300, heads=4, kv_heads=2, head_dim=16,
               ffn=96, m2_heads=8, m2_head_dim=16, groups=2, state=16, conv=4, experts=8,
               top_k=2, moe_ffn=32, shared_ffn=48, n_group=2, topk_group=1, scale=2.5,
               eps=1e-5, tied=False, dtype="f32", seed=1)
    for k in kw:
        if k not in cfg:
            raise KeyError("unknown gen_nemotron_h option %r" % k)
    cfg.update(kw)
    return cfg


def make_params(cfg):
    rng = np.random.default_rng(cfg["seed"])
    C, V = cfg["hidden"], cfg["vocab"]
    H, P, G, N = cfg["m2_heads"], cfg["m2_head_dim"], cfg["groups"], cfg["state"]
    DI, QD, KVD = H * P, cfg["heads"] * cfg["head_dim"], cfg["kv_heads"] * cfg["head_dim"]
    CD = DI + 2 * G * N
    E, Fe, Fs, F = cfg["experts"], cfg["moe_ffn"], cfg["shared_ffn"], cfg["ffn"]

    def mat(o, i):
        return (rng.standard_normal((o, i)) * (0.7 / np.sqrt(i))).astype(np.float32)

    def vec(n, center=1.0, scale=0.3):
        return (center + scale * rng.standard_normal(n)).astype(np.float32)

    p = {"backbone.embeddings.weight": rng.standard_normal((V, C)).astype(np.float32)}
    for l, k in enumerate(cfg["pattern"]):
        q = "backbone.layers.%d." % l
        p[q + "norm.weight"] = vec(C)
        m = q + "mixer."
        if k == "M":
            p[m + "in_proj.weight"] = mat(DI + CD + H, C)
            p[m + "conv1d.weight"] = (0.4 * rng.standard_normal((CD, 1, cfg["conv"]))).astype(
                np.float32)
            p[m + "conv1d.bias"] = vec(CD, 0.0, 0.2)
            p[m + "dt_bias"] = vec(H, 0.5, 0.5)
            p[m + "A_log"] = np.log(rng.uniform(0.1, 2.5, H)).astype(np.float32)
            p[m + "D"] = vec(H)
            p[m + "norm.weight"] = vec(DI)
            p[m + "out_proj.weight"] = mat(C, DI)
        elif k == "*":
            p[m + "q_proj.weight"] = mat(QD, C)
            p[m + "k_proj.weight"] = mat(KVD, C)
            p[m + "v_proj.weight"] = mat(KVD, C)
            p[m + "o_proj.weight"] = mat(C, QD)
        elif k == "-":
            p[m + "up_proj.weight"] = mat(F, C)
            p[m + "down_proj.weight"] = mat(C, F)
        else:
            p[m + "gate.weight"] = (rng.standard_normal((E, C)) * (3.0 / np.sqrt(C))).astype(
                np.float32)
            p[m + "gate.e_score_correction_bias"] = vec(E, 0.0, 0.2)
            for e in range(E):
                p[m + "experts.%d.up_proj.weight" % e] = mat(Fe, C)
                p[m + "experts.%d.down_proj.weight" % e] = mat(C, Fe)
            p[m + "shared_experts.up_proj.weight"] = mat(Fs, C)
            p[m + "shared_experts.down_proj.weight"] = mat(C, Fs)
    p["backbone.norm_f.weight"] = vec(C)
    if not cfg["tied"]:
        p["lm_head.weight"] = mat(V, C)
    return p


def config_json(cfg):
    return {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "vocab_size": cfg["vocab"],
        "hidden_size": cfg["hidden"],
        "layers_block_type": [KINDS[k] for k in cfg["pattern"]],
        "num_attention_heads": cfg["heads"],
        "num_key_value_heads": cfg["kv_heads"],
        "head_dim": cfg["head_dim"],
        "intermediate_size": cfg["ffn"],
        "mlp_hidden_act": "relu2",
        "mamba_hidden_act": "silu",
        "mamba_num_heads": cfg["m2_heads"],
        "mamba_head_dim": cfg["m2_head_dim"],
        "n_groups": cfg["groups"],
        "ssm_state_size": cfg["state"],
        "conv_kernel": cfg["conv"],
        "use_conv_bias": True,
        "chunk_size": 128,
        "time_step_min": 0.001,
        "n_routed_experts": cfg["experts"],
        "num_experts_per_tok": cfg["top_k"],
        "moe_intermediate_size": cfg["moe_ffn"],
        "moe_shared_expert_intermediate_size": cfg["shared_ffn"],
        "moe_latent_size": None,
        "n_group": cfg["n_group"],
        "topk_group": cfg["topk_group"],
        "norm_topk_prob": True,
        "routed_scaling_factor": cfg["scale"],
        "layer_norm_epsilon": cfg["eps"],
        "attention_bias": False,
        "mlp_bias": False,
        "use_bias": False,
        "tie_word_embeddings": cfg["tied"],
        "dtype": {"f32": "float32", "bf16": "bfloat16"}[cfg["dtype"]],
    }


def legacy_config(c):
    """config_json in the older spelling (no MoE layers): hybrid_override_pattern, mamba_*."""
    inv = {v: k for k, v in KINDS.items()}
    c["hybrid_override_pattern"] = "".join(inv[k] for k in c.pop("layers_block_type"))
    c["num_hidden_layers"] = len(c["hybrid_override_pattern"])
    c["mamba_n_groups"] = c.pop("n_groups")
    c["mamba_d_conv"] = c.pop("conv_kernel")
    for k in list(c):
        if "expert" in k or k in ("n_group", "topk_group", "routed_scaling_factor",
                                  "norm_topk_prob", "moe_latent_size"):
            del c[k]
    return c


def write_model(out, cfg, tokenizer=True, legacy=False):
    os.makedirs(out, exist_ok=True)
    named = make_params(cfg)
    gen_model.write_safetensors(os.path.join(out, "model.safetensors"), named, cfg["dtype"],
                                {"format": "pt"})
    c = config_json(cfg)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(legacy_config(c) if legacy else c, f, indent=2)
    if tokenizer:
        gen_gdn.write_tokenizer(out, cfg["vocab"])
    return named


def main(argv=None):
    ap = argparse.ArgumentParser(description="write a small random Nemotron-H model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--pattern", default="M*M-ME", help="layer kinds: M Mamba2, * attention, "
                    "- MLP, E MoE")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=300)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--no-tokenizer", action="store_true", help="write no tokenizer.json")
    ap.add_argument("--legacy-config", action="store_true",
                    help="hybrid_override_pattern, mamba_* keys, no MoE keys (no E layers)")
    shape = ("heads", "kv_heads", "head_dim", "ffn", "m2_heads", "m2_head_dim", "groups",
             "state", "experts", "top_k", "moe_ffn", "shared_ffn", "n_group", "topk_group")
    for k in shape:
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=None)
    ap.add_argument("--scale", type=float, default=None, help="routed_scaling_factor")
    a = ap.parse_args(argv)
    if not a.pattern or any(k not in KINDS for k in a.pattern):
        ap.error("--pattern: letters of M * - E")
    if a.legacy_config and "E" in a.pattern:
        ap.error("--legacy-config: the older config spelling has no MoE layers")
    kw = {k: getattr(a, k) for k in shape + ("scale",) if getattr(a, k) is not None}
    cfg = default_cfg(seed=a.seed, dtype=a.dtype, pattern=a.pattern, hidden=a.hidden,
                      vocab=a.vocab, tied=a.tied, **kw)
    write_model(a.out, cfg, tokenizer=not a.no_tokenizer, legacy=a.legacy_config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
