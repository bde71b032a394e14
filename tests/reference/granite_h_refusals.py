#!/usr/bin/python3
"""family/wrk_granite_h.c on checkpoints it must load and ones it must refuse,
naming the key or the tensor (numpy only: tests/reference/gen_granite_h.py
writes the models; no transformers needed).

Loads: the dense and MoE layouts, the transformers-5 layer names
(linear_attention / full_attention), time_step_limit [0, {"__float__":
"Infinity"}] as save_pretrained writes it, no layer_types at all (every layer
Mamba2). Refused, with the reason in wkvm-infer's error: attention_bias,
mamba_proj_bias, mamba_conv_bias false, a time_step_limit other than [0, inf],
hidden_act gelu, an unknown layer type, no Mamba2 layer, logits_scaling 0,
rope_type yarn with position_embedding_type rope, a missing expert tensor, a
shared MLP of the wrong width, mamba_d_head that does not tile d_inner, a
tensor the family does not declare.

Exit 0 when every case behaves, 1 otherwise; 77 when wkvm-infer is not built.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_granite_h  # noqa: E402
import gen_model  # noqa: E402

BUILD = os.environ.get("WKVM_BUILD_DIR") or os.path.join(HERE, "..", "..", "build")
EXE = os.path.join(BUILD, "tools", "wkvm-infer")


def config_edit(**kv):
    def f(d):
        p = os.path.join(d, "config.json")
        c = json.load(open(p))
        for k, v in kv.items():
            if v is None:
                c.pop(k, None)
            else:
                c[k] = v
        json.dump(c, open(p, "w"))
    return f


def tensors_edit(fn):
    def f(d):
        cfg = json.load(open(os.path.join(d, "config.json")))
        named = gen_granite_h.make_params(CFGS[cfg["num_local_experts"] > 0])
        fn(named)
        gen_model.write_safetensors(os.path.join(d, "model.safetensors"), named, "f32",
                                    {"format": "pt"})
    return f


def drop(name):
    return tensors_edit(lambda p: p.pop(name))


def reshape(name, shape):
    def f(p):
        p[name] = p[name].reshape(-1)[:int(__import__("numpy").prod(shape))].reshape(shape)
    return tensors_edit(f)


CFGS = {False: gen_granite_h.default_cfg(seed=3),
        True: gen_granite_h.default_cfg(seed=4, experts=4, top_k=2)}
NEW_NAMES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]

# (name, moe, edit, expected: None loads, else a substring of the error)
CASES = [
    ("dense", False, None, None),
    ("moe", True, None, None),
    ("transformers-5 layer names", True, config_edit(layer_types=NEW_NAMES), None),
    ("time_step_limit as save_pretrained writes it", False,
     config_edit(time_step_limit=[0.0, {"__float__": "Infinity"}]), None),
    ("all mamba", False,
     lambda d: (config_edit(layer_types=None)(d),
                tensors_edit(lambda p: [p.pop(k) for k in list(p) if "self_attn" in k]
                             + [p.update(gen_granite_h.make_params(
                                 gen_granite_h.default_cfg(seed=3, attn_layers=[])))])(d)),
     None),
    ("attention_bias", True, config_edit(attention_bias=True), "attention_bias"),
    ("mamba_proj_bias", False, config_edit(mamba_proj_bias=True), "mamba_proj_bias"),
    ("mamba_conv_bias false", False, config_edit(mamba_conv_bias=False), "mamba_conv_bias"),
    ("time_step_limit", False, config_edit(time_step_limit=[0.001, 0.1]), "time_step_limit"),
    ("hidden_act gelu", False, config_edit(hidden_act="gelu"), "hidden_act"),
    ("unknown layer type", False, config_edit(layer_types=["mamba", "mamba", "moe", "attention"]),
     "layer_types[2]"),
    ("no mamba layer", False, config_edit(layer_types=["attention"] * 4), "no mamba layer"),
    ("logits_scaling 0", False, config_edit(logits_scaling=0), "logits_scaling"),
    ("rope yarn", False,
     config_edit(position_embedding_type="rope",
                 rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0}), "rope_type"),
    ("missing expert tensor", True, drop("model.layers.1.block_sparse_moe.output_linear.weight"),
     "model.layers.1.block_sparse_moe.output_linear.weight: missing"),
    ("shared MLP width", True, reshape("model.layers.0.shared_mlp.input_linear.weight", (128, 64)),
     "model.layers.0.shared_mlp.input_linear.weight"),
    ("mamba_d_head", False, config_edit(mamba_d_head=12), "mamba_d_head"),
    ("a tensor no layer declares", False,
     tensors_edit(lambda p: p.update({"model.layers.0.mamba.extra": p["model.norm.weight"]})),
     "model.layers.0.mamba.extra"),
]


def main():
    if not os.access(EXE, os.X_OK):
        print("skipped: %s is not built" % EXE)
        return 77
    tmp = tempfile.mkdtemp(prefix="wkvm-granite-refuse-")
    fails = 0
    try:
        base = {}
        for moe in (False, True):
            base[moe] = os.path.join(tmp, "base-%d" % moe)
            gen_granite_h.write_model(base[moe], CFGS[moe])
        for i, (name, moe, edit, want) in enumerate(CASES):
            d = os.path.join(tmp, "case%d" % i)
            shutil.copytree(base[moe], d)
            if edit is not None:
                edit(d)
            p = subprocess.run([EXE, "--model", d, "--tokens", "1,2,3", "--logits-out",
                                os.path.join(tmp, "l")], capture_output=True, text=True,
                               timeout=60)
            out = (p.stdout + p.stderr).strip()
            if want is None:
                ok = p.returncode == 0
            else:
                ok = p.returncode != 0 and want in out
            fails += not ok
            print("%-4s %-44s %s" % ("ok" if ok else "FAIL", name,
                                     out.splitlines()[0] if out and (want or not ok) else ""))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("granite_h_refusals: %d passed, %d failed" % (len(CASES) - fails, fails))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
