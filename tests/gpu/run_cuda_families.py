#!/usr/bin/python3
"""GPU suite: the CUDA Mamba2 and hybrid layer-list steps against the CPU
backend (test_cuda_families.c) on small random models from
tests/reference/gen_mamba2.py, gen_gdn.py, gen_qwen35.py (Gated DeltaNet +
gated attention with partial rotary and (1 + weight) norms; dense and MoE),
gen_nemotron_h.py (Mamba2 + position-free attention + squared-ReLU MLPs +
sigmoid-routed experts with groups and a score bias, mixer-only and
MLP-only layers) and gen_granite_h.py (Mamba2 + attention with Granite's
multipliers, dense or top-k-then-softmax experts), and the CUDA RWKV-7 step
on tests/reference/gen_model.py's RWKV-7 models.

Usage: run_cuda_families.py TEST_CUDA_FAMILIES_EXE

Asks the test binary first (`--probe`) and exits 77 (meson's skip) without
a CUDA backend or device, before generating anything; then 77 without
numpy. Otherwise writes the models into a temp dir and runs the binary on
all of them (hybrid GDN models with attention layers and the paged KV
pool included), passing its exit status on. WKVM_PARITY_KEEP=1 keeps the dir.
"""

import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "reference")

# (name, generator module name, generator config)
MAMBA2 = [
    ("m2-hf-bf16-G2-N32", dict(convention="hf", dtype="bf16", layers=2, d_model=64, d_state=32,
                               headdim=16, ngroups=2, vocab=500, seed=601)),
    ("m2-ssm-f16-tied-N24-K3", dict(convention="ssm", dtype="f16", layers=2, d_model=48,
                                    d_state=24, headdim=12, ngroups=2, d_conv=3, vocab=613,
                                    seed=602)),
    # the scan's state in shared memory (P 64, N 128: 32 KiB) ...
    ("m2-hf-f32-P64-N128", dict(convention="hf", dtype="f32", layers=2, d_model=128,
                                d_state=128, headdim=64, vocab=300, seed=603)),
    # ... and in global memory (P 64, N 256: 64 KiB)
    ("m2-hf-bf16-P64-N256-K5", dict(convention="hf", dtype="bf16", layers=1, d_model=64,
                                    d_state=256, headdim=64, d_conv=5, vocab=300, seed=604)),
]
GDN = [
    ("gdn-f32-gate", dict(seed=701)),
    ("gdn-bf16-tied-neg", dict(seed=702, dtype="bf16", tied=True, allow_neg_eigval=True)),
    ("gdn-f16-nogate-gva-conv3", dict(seed=703, dtype="f16", use_gate=False, heads=2, v_heads=4,
                                      head_dim=16, expand_v=1.5, conv=3)),
    # Vd 80: a partial 32-column tile; conv 2
    ("gdn-f32-Vd80-conv2", dict(seed=704, hidden=72, heads=3, head_dim=40, expand_v=2.0,
                                ffn=200, vocab=613, conv=2)),
    # K 384: the delta rule's state tile in global memory
    ("gdn-bf16-K384", dict(seed=705, dtype="bf16", layers=1, hidden=64, heads=1, head_dim=384,
                           expand_v=0.25, ffn=128, vocab=300)),
    # hybrid: attention layers over the paged KV pool (GQA; q/k norm + qkv bias; head dim 64
    # over two attention layers)
    ("gdn-hybrid-gqa", dict(seed=711, layers=3, attn_layers=(1,), attn_heads=4, attn_kv_heads=2)),
    ("gdn-hybrid-bf16-qknorm-bias", dict(seed=712, dtype="bf16", layers=3, attn_layers=(0, 2),
                                         attn_heads=8, attn_kv_heads=4, qk_norm=True,
                                         qkv_bias=True, tied=True)),
    ("gdn-hybrid-f16-D64", dict(seed=713, dtype="f16", layers=2, attn_layers=(1,), hidden=128,
                                attn_heads=2, attn_kv_heads=1, ffn=256, vocab=500)),
]
# Qwen3.5 (gen_qwen35: layer_types by full_attention_interval; attention with the output gate
# in q_proj, q / k norm, partial rotary 0.25, GQA; (1 + weight) norms; grouped key heads)
QWEN35 = [
    ("q35-f32", dict(seed=801)),
    # two attention layers of four, tied head, bf16; rotary over half the head
    ("q35-bf16-tied-i2", dict(seed=802, dtype="bf16", interval=2, tied=True,
                              partial_rotary=0.5)),
    # no grouping of key heads, conv 3, f32 over three layers (one attention)
    ("q35-f32-conv3", dict(seed=803, layers=3, interval=3, lin_k_heads=4, lin_v_heads=4,
                           conv=3, hidden=96, head_dim=64, heads=2, kv_heads=1)),
    # Qwen3.5-MoE: softmax routing, top-k renormalised, the sigmoid-gated shared expert
    ("q35moe-f32", dict(seed=804, experts=8, top_k=2)),
    ("q35moe-bf16-k4", dict(seed=805, dtype="bf16", experts=6, top_k=4, interval=2,
                            tied=True)),
]
# Nemotron-H (gen_nemotron_h: layers_block_type from the pattern; M Mamba2, * attention
# without rotary, - squared-ReLU MLP, E sigmoid-routed experts + ungated shared expert)
NEMOTRON_H = [
    ("nemo-f32", dict(seed=811)),
    # bf16; one expert group; Mamba2 with 4 groups, a longer MoE-heavy pattern
    ("nemo-bf16-EE", dict(seed=812, dtype="bf16", pattern="ME*E-M", groups=4, n_group=1,
                          topk_group=1, experts=6, top_k=3)),
    # four expert groups, two kept; top 1
    ("nemo-f32-g4", dict(seed=813, pattern="E*M", n_group=4, topk_group=2, top_k=1,
                         experts=8)),
]
# Granite-4.0-H (gen_granite_h: Mamba2 + attention, embedding / residual / attention /
# logit multipliers; dense shared MLP or top-k-then-softmax experts + shared MLP)
GRANITE_H = [
    ("granite-f32-dense", dict(seed=821)),
    ("granite-bf16-moe-rope", dict(seed=822, dtype="bf16", experts=4, top_k=2, rope=True,
                                   groups=2, attn_layers=[1], tied=False)),
    ("granite-f32-moe", dict(seed=823, experts=8, top_k=3, layers=3, attn_layers=[0, 2])),
]
# RWKV-7 (gen_model: both checkpoint conventions, the three weight dtypes, a tied head, layer
# 0's unused value LoRA present, head sizes 16 and 64, three layers: v_first across layers)
RWKV7 = [
    ("rwkv7-hf-f32", dict(seed=901)),
    ("rwkv7-blink-bf16-l0v", dict(seed=902, convention="blink", dtype="bf16", layers=3,
                                  layer0_v=True, lora_v=16)),
    ("rwkv7-hf-f16-tied-N64", dict(seed=903, dtype="f16", tied=True, embd=128, head_size=64,
                                   ffn=192, vocab=500, lora_w=8, lora_a=8, lora_v=4,
                                   lora_g=16)),
]
# (name, generator module, config) of models the CPU backend serves and the
# CUDA backend must refuse with WK_ENOTSUP: an RWKV-7 head over the WKV
# kernels' 1024 (one head of 2048)
REFUSE = [
    ("rwkv7-head2048", "gen_model", dict(layers=1, embd=2048, head_size=2048, ffn=64,
                                         vocab=300, lora_w=8, lora_a=8, lora_v=8, lora_g=8,
                                         seed=901)),
]


def main():
    if len(sys.argv) != 2:
        print("usage: run_cuda_families.py TEST_CUDA_FAMILIES_EXE", file=sys.stderr)
        return 2
    exe = sys.argv[1]
    rc = subprocess.run([exe, "--probe"]).returncode
    if rc != 0:
        return 77 if rc == 77 else rc
    try:
        import numpy  # noqa: F401
    except ImportError:
        # the binary found a device: the gpu suite runs whole or fails, never skips quietly
        print("FAIL: numpy is not installed for %s (deploy/install-deps installs it)"
              % sys.executable)
        return 1
    sys.path.insert(0, REF)
    import gen_gdn
    import gen_model
    import gen_granite_h
    import gen_mamba2
    import gen_nemotron_h
    import gen_qwen35

    keep = os.environ.get("WKVM_PARITY_KEEP") == "1"
    tmp = tempfile.mkdtemp(prefix="wkvm-cuda-families-")
    try:
        args = []
        for name, kw in MAMBA2:
            d = os.path.join(tmp, name)
            gen_mamba2.write_model(d, gen_mamba2.default_cfg(**kw))
            args.append(d)
        for name, kw in GDN:
            d = os.path.join(tmp, name)
            gen_gdn.write_model(d, gen_gdn.default_cfg(**kw))
            args.append(d)
        for gen, models in ((gen_qwen35, QWEN35), (gen_nemotron_h, NEMOTRON_H),
                            (gen_granite_h, GRANITE_H)):
            for name, kw in models:
                d = os.path.join(tmp, name)
                gen.write_model(d, gen.default_cfg(**kw))
                args.append(d)
        for name, kw in RWKV7:
            d = os.path.join(tmp, name)
            gen_model.write_model(d, gen_model.default_cfg(**kw))
            args.append(d)
        for name, module, kw in REFUSE:
            gen = __import__(module)
            d = os.path.join(tmp, name)
            gen.write_model(d, gen.default_cfg(**kw))
            args.append("refuse:" + d)
        return subprocess.run([exe] + args).returncode
    finally:
        if keep:
            print("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
