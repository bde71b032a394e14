#!/usr/bin/python3
"""wkvm-infer against transformers' own Qwen3.5 modeling code (models/qwen3_5,
transformers 5.x on CPU torch): the family wkvm serves as `qwen3_5`.

Random checkpoints are built by transformers itself (Qwen3_5ForCausalLM,
model_type qwen3_5_text, weights under model.*; and
Qwen3_5ForConditionalGeneration, model_type qwen3_5, the text model under
model.language_model.* with a vision tower wkvm skips), their parameters
drawn so that every convention shows (norm weights away from 0 for the
(1 + weight) RMSNorms and away from 1 for the gated norm, A_log and
dt_bias spread), saved with save_pretrained, and loaded back by transformers
for the reference. wkvm-infer --fp32 must give the same logits at every
position, max |diff| / std(logits) < TOL:
  - its whole-prompt prefill against the whole sequence at once
    (use_cache=False: transformers' chunked gated delta rule, chunk 64), and
  - its --prefill-chunk 1 against one token at a time through transformers'
    cache (the recurrent gated delta rule and causal_conv1d_update).
The greedy ids (argmax per position) must be equal too, except where the
reference's top two logits are within 1e-4 std of each other; prefill in
chunks of 1 and 7 must be bit-identical to the whole prompt, and
--batch-check (the row alone and among random rows) and --slot-check (fork,
hibernate/resume, KV pages) must pass.

Tolerance: transformers' own float32 path differs from the float64 run of
the same code by up to ~9e-5 std on these models (its two float32 paths from
each other by up to 1e-4), so wkvm is held to 1e-4 against float64 (it lands
at 1.7e-5 to 4.1e-5, the same size as transformers' float32 error) and
3e-4 against float32; a misread model (e.g. full instead of partial
rotary) is off by 0.5 or more.

fla and causal_conv1d are kept from loading (transformers would take fla's
Triton kernels, which need a GPU), so transformers runs its torch fallbacks,
the code its docs call the reference implementation.

GGUF: three cases (f32 dense with grouped value heads, f32 MoE, f32 Qwen3-Next
with 8 value heads on 2 key heads; a bf16 file was
checked the same way by hand: the norms are float32 in either)
are also converted by llama.cpp's own convert_hf_to_gguf.py (through
bench/qwen35-gguf.py) and the file, alone in a directory, must give the
same logits bit for bit.

Cases: Qwen3.5 layer pattern (3 Gated DeltaNet : 1 attention), grouped key
heads (linear_num_value_heads > linear_num_key_heads), GQA attention, partial
rotary 0.25 and 0.5, an explicit layer_types with two attention layers,
conv 3, a tied head, the multimodal layout (vision tower skipped), BF16
weights, and one case at Qwen3.5's real widths (transformers' defaults:
hidden 1024 here with 128-wide linear heads, 16 key heads and 32 value heads,
attention head_dim 256) for 4 layers.

The packages come from `deploy/install-ref-venv --fla` (transformers 5.24,
torch 2.15 CPU); WKVM_REF_FLA=0 skips. Exit 0 when every case agrees, 1 on a
disagreement, 77 (skip) when the venv cannot be had or wkvm-infer is not
built.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import upstream_venv  # noqa: E402
import gguf_zygote  # noqa: E402  (the conversions: forks of one warm process)

NAME = "upstream_qwen35"
upstream_venv.enter(NAME, ["transformers", "torch", "numpy", "safetensors"], fla=True)

# transformers picks fla's / causal_conv1d's kernels when they import: keep them out
sys.modules["fla"] = None
sys.modules["causal_conv1d"] = None

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (Qwen3_5Config, Qwen3_5ForCausalLM,  # noqa: E402
                          Qwen3_5ForConditionalGeneration, Qwen3_5MoeConfig,
                          Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration,
                          Qwen3_5MoeTextConfig, Qwen3_5TextConfig, Qwen3NextConfig,
                          Qwen3NextForCausalLM)

TOL = 1e-4      # max |diff| / std(logits) against the float64 run of the same code
TOL_F32 = 3e-4  # against the stock float32 run (its own two paths differ by up to ~1e-4)
N_TOKENS = 40


def f64_module(pkg, modname):
    """transformers' models/<pkg>/<modname>.py with its float32 casts made
    float64 (the same code, evaluated in double precision), as a module of
    its own."""
    import importlib
    import importlib.util
    mq = importlib.import_module("transformers.models.%s.%s" % (pkg, modname))
    src = open(mq.__file__).read()
    for a, b in (("torch.float32", "torch.float64"), (".float()", ".double()"),
                 ("dtype=torch.float)", "dtype=torch.float64)")):
        src = src.replace(a, b)
    name = "transformers.models.%s.%s_f64" % (pkg, modname)
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "transformers.models." + pkg
    mod.__file__ = mq.__file__
    sys.modules[name] = mod
    exec(compile(src, mq.__file__, "exec"), mod.__dict__)
    return mod


def f64_classes():
    q35 = f64_module("qwen3_5", "modeling_qwen3_5")
    moe = f64_module("qwen3_5_moe", "modeling_qwen3_5_moe")
    nxt = f64_module("qwen3_next", "modeling_qwen3_next")
    return {Qwen3_5ForCausalLM: q35.Qwen3_5ForCausalLM,
            Qwen3_5ForConditionalGeneration: q35.Qwen3_5ForConditionalGeneration,
            Qwen3_5MoeForCausalLM: moe.Qwen3_5MoeForCausalLM,
            Qwen3_5MoeForConditionalGeneration: moe.Qwen3_5MoeForConditionalGeneration,
            Qwen3NextForCausalLM: nxt.Qwen3NextForCausalLM}

SMALL = dict(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_key_head_dim=16,
             linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
             linear_conv_kernel_dim=4)

CASES = [
    ("text-f32", dict(SMALL), {"gguf": "f32"}),
    ("text-f32-gqa1-rope0.5-conv3-2attn",
     dict(SMALL, num_key_value_heads=1, linear_conv_kernel_dim=3, num_hidden_layers=5,
          layer_types=["linear_attention", "full_attention", "linear_attention",
                       "linear_attention", "full_attention"],
          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                           "partial_rotary_factor": 0.5}), {}),
    ("text-f32-tied-eqheads",
     dict(SMALL, tie_word_embeddings=True, linear_num_value_heads=2, linear_value_head_dim=24),
     {}),
    ("multimodal-f32", dict(SMALL), {"multimodal": True}),
    ("text-bf16", dict(SMALL), {"dtype": "bf16", "amx": True}),
    ("moe-f32-E8k2-shared", dict(SMALL, num_experts=8, num_experts_per_tok=2,
                                 moe_intermediate_size=32, shared_expert_intermediate_size=48),
     {"arch": "moe", "gguf": "f32"}),
    ("moe-multimodal-bf16-E6k3",
     dict(SMALL, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=64,
          shared_expert_intermediate_size=32),
     {"arch": "moe", "multimodal": True, "dtype": "bf16"}),
    ("next-f32-sparse2-nonorm",
     dict(SMALL, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
          shared_expert_intermediate_size=48, decoder_sparse_step=2, norm_topk_prob=False,
          mlp_only_layers=[3]), {"arch": "next"}),
    ("next-f32-gva4",
     dict(SMALL, linear_num_value_heads=8, num_experts=4, num_experts_per_tok=1,
          moe_intermediate_size=32, shared_expert_intermediate_size=32),
     {"arch": "next", "gguf": "f32"}),
    ("text-real-width-L4",
     dict(vocab_size=512, hidden_size=1024, intermediate_size=3584, num_hidden_layers=4,
          num_attention_heads=8, num_key_value_heads=2), {"tokens": 20}),
]


def randomize(model, seed):
    """Parameters drawn so that every convention matters (see the docstring)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "visual" in name:
                continue
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.1, 2.5, generator=g).log())
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5 + 0.5)
            elif "linear_attn.norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:  # the (1 + weight) RMSNorms
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("mlp.gate.weight"):  # routers: distinct top-k, no near ties
                p.copy_(torch.randn(p.shape, generator=g) * (3.0 / p.shape[-1] ** 0.5))
            elif "conv1d" in name:
                p.copy_(0.4 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 / fan_in ** 0.5))


def write_case(tmp, name, cfg_kw, opt, seed):
    d = os.path.join(tmp, name)
    torch.manual_seed(seed)
    arch = opt.get("arch", "dense")
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                  out_hidden_size=cfg_kw["hidden_size"], patch_size=4, num_position_embeddings=16)
    tie = cfg_kw.get("tie_word_embeddings", False)
    if arch == "next":
        model = Qwen3NextForCausalLM(Qwen3NextConfig(**cfg_kw))
    elif opt.get("multimodal"):
        if arch == "moe":
            model = Qwen3_5MoeForConditionalGeneration(Qwen3_5MoeConfig(
                text_config=cfg_kw, vision_config=vision, tie_word_embeddings=tie))
        else:
            model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(
                text_config=cfg_kw, vision_config=vision, tie_word_embeddings=tie))
    elif arch == "moe":
        model = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**cfg_kw))
    else:
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**cfg_kw))
    randomize(model, seed)
    if opt.get("dtype") == "bf16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(d)
    # the references run the stored weights (bf16 values exactly) in float32 and float64
    cls = type(model)
    # experts: the eager per-expert loop (modeling code), not torch's grouped_mm kernels
    kw = {"experts_implementation": "eager"} if arch != "dense" else {}
    ref = cls.from_pretrained(d, dtype=torch.float32, **kw).eval()
    ref64 = F64[cls].from_pretrained(d, dtype=torch.float64, **kw).eval()
    return d, cfg_kw["vocab_size"], ref, ref64


def upstream(model, tokens):
    """(whole sequence [T, V], one token at a time [T, V]) in float64."""
    rows, cache = [], None
    with torch.no_grad():
        seq = model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].double().numpy()
        for t in tokens:
            o = model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            rows.append(o.logits[0, -1].double().numpy())
    return seq, np.stack(rows)


def converter_dir():
    """llama.cpp's converter (deploy/install-gguf-converter), or None when it cannot be had."""
    inst = os.path.join(HERE, "..", "..", "deploy", "install-gguf-converter")
    p = subprocess.run([inst, sys.executable], capture_output=True, text=True, timeout=900)
    return p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else None


def gguf_of(conv, d, outtype, tmp, name):
    """The model converted by llama.cpp's converter (bench/qwen35-gguf.py), alone in a dir."""
    gdir = os.path.join(tmp, name + "-gguf")
    os.makedirs(gdir, exist_ok=True)
    script = os.path.join(HERE, "..", "..", "bench", "qwen35-gguf.py")
    p = gguf_zygote.run(script, [conv, d, os.path.join(gdir, "model.gguf"),
                        "--outtype", outtype], timeout=600)
    if p.returncode != 0:
        raise RuntimeError("qwen35-gguf.py: " + (p.stderr or p.stdout)[-800:])
    return gdir


def greedy_mismatch(ref, got):
    """Positions where argmax differs and the reference's top two are not a near tie."""
    bad = 0
    std = ref.std()
    for r, g in zip(ref, got):
        a, b = int(np.argmax(r)), int(np.argmax(g))
        if a != b and abs(r[a] - r[b]) > 1e-4 * std:
            bad += 1
    return bad


def amx_figures(exe, d, toks, lp, V, model, seq64, figures, bounds):
    """--cpu-matmul bf16 (activations rounded to bf16 on AMX tiles, else on
    AVX512-BF16 dot products: the engine this CPU has): prefill in
    chunks of 3 and 7 bit-identical to the whole prompt, --batch-check, and
    the logits against float64 no farther than transformers' own bf16 run
    (which rounds every activation, not only the matmul inputs), and against
    that bf16 run within 1.5 times its distance. The distances depend on the
    random model (max |d|/std on text-bf16: transformers bf16 0.43 to 0.91
    off float64, wkvm bf16 0.11 to 0.30, wkvm's default fp32 mode 1.4e-5 to
    3e-5; the dot products on AMD EPYC 0.30 at this seed), so the bound is
    transformers' own, not a number. Where the CPU has neither wkvm must
    refuse."""
    mm = ["--cpu-matmul", "bf16"]
    with open("/proc/cpuinfo") as f:
        flags = f.read().split()
    has = ("amx_bf16" in flags and "amx_tile" in flags) or "avx512_bf16" in flags
    # both engines switched off (as on a CPU with neither): one clear line, exit non-zero
    off = dict(os.environ, WKVM_CPU_AMX="off", WKVM_CPU_BF16DP="off")
    p = subprocess.run([exe, "--model", d, "--tokens", "1,2", "--generate", "1"] + mm,
                       capture_output=True, text=True, timeout=120, env=off)
    if p.returncode == 0 or "AMX" not in p.stderr:
        raise ValueError("--cpu-matmul bf16 with both engines off: %s" % p.stderr[-300:])
    p = subprocess.run([exe, "--model", d, "--tokens", "1,2", "--generate", "1"] + mm,
                       capture_output=True, text=True, timeout=120)
    if not has:
        if p.returncode == 0 or "AMX" not in p.stderr:
            raise ValueError("--cpu-matmul bf16 without an engine: %s" % p.stderr[-300:])
        print("  (--cpu-matmul bf16 refused as it should: neither AMX-BF16 nor AVX512_BF16)")
        return
    engine = re.search(r"^wkvm-infer: backend: .*\bmatmul=(\S+)", p.stderr, re.M)
    if p.returncode != 0 or engine is None or not engine.group(1).startswith("bf16-"):
        raise ValueError("--cpu-matmul bf16 on a CPU with an engine: %s" % p.stderr[-300:])
    print("  --cpu-matmul bf16 on %s" % engine.group(1))
    got = upstream_venv.run_wkvm(exe, d, toks, lp, V, fp32=False, extra=mm)
    for c in (3, 7):
        if not np.array_equal(got, upstream_venv.run_wkvm(exe, d, toks, lp, V, chunk=c,
                                                          fp32=False, extra=mm)):
            raise ValueError("--cpu-matmul bf16: chunk %d is not bit-identical to whole" % c)
    p = subprocess.run([exe, "--model", d, "--tokens", ",".join(map(str, toks[:17])),
                        "--batch-check", "5"] + mm, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise ValueError("--cpu-matmul bf16 --batch-check: %s" % (p.stdout + p.stderr)[-300:])
    bf = type(model).from_pretrained(d, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        tfb = bf(input_ids=torch.tensor([toks]), use_cache=False).logits[0].double().numpy()
    own = upstream_venv.rel_err(seq64, tfb)
    figures["tf-bf16 vs tf64"] = own
    figures["wkvm-bf16 vs tf64"] = upstream_venv.rel_err(seq64, got)
    figures["wkvm-bf16 vs tf-bf16"] = upstream_venv.rel_err(tfb, got)
    bounds["tf-bf16 vs tf64"] = float("inf")  # reported only
    bounds["wkvm-bf16 vs tf64"] = own
    bounds["wkvm-bf16 vs tf-bf16"] = 1.5 * own


def main():
    build = upstream_venv.build_dir()
    exe = os.path.join(build, "tools", "wkvm-infer")
    if not os.access(exe, os.X_OK):
        upstream_venv.skip(NAME, "%s is not built" % exe)
    print("transformers %s, torch %s (torch fallbacks of the gated delta rule and conv)"
          % (transformers.__version__, torch.__version__), flush=True)
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    global F64, CONV
    F64 = f64_classes()
    CONV = converter_dir()
    print("llama.cpp converter: %s" % (CONV or "not available (GGUF cases skipped)"), flush=True)
    rng = np.random.default_rng(35)
    tmp = tempfile.mkdtemp(prefix="wkvm-up-q35-")
    worst = {}
    fails = 0
    t0 = time.time()
    ran = 0
    try:
        only = os.environ.get("WKVM_ONLY_CASE")  # a developer's filter: a substring of names
        for i, (name, kw, opt) in enumerate(CASES):
            if only and only not in name:
                continue
            ran += 1
            d, V, model, model64 = write_case(tmp, name, kw, opt, 3500 + i)
            n = opt.get("tokens", N_TOKENS)
            toks = [int(x) for x in rng.integers(0, V, n)]
            toks[1] = V - 1
            seq, one = upstream(model, toks)
            seq64, one64 = upstream(model64, toks)
            figures, bounds = {}, {}
            greedy = 0
            try:
                lp = os.path.join(tmp, name + ".logits")
                got = upstream_venv.run_wkvm(exe, d, toks, lp, V)
                got1 = upstream_venv.run_wkvm(exe, d, toks, lp, V, chunk=1)
                figures["wkvm vs tf64 sequence"] = upstream_venv.rel_err(seq64, got)
                figures["wkvm vs tf64 one-by-one"] = upstream_venv.rel_err(one64, got1)
                figures["wkvm vs tf32 sequence"] = upstream_venv.rel_err(seq, got)
                figures["wkvm vs tf32 one-by-one"] = upstream_venv.rel_err(one, got1)
                greedy = greedy_mismatch(seq64, got) + greedy_mismatch(one64, got1)
                got7 = upstream_venv.run_wkvm(exe, d, toks, lp, V, chunk=7)
                if not (np.array_equal(got, got1) and np.array_equal(got, got7)):
                    raise ValueError("chunked prefill (1, 7) is not bit-identical to whole")
                ids = ",".join(map(str, toks[:17]))
                if opt.get("gguf") and CONV is not None:
                    gdir = gguf_of(CONV, d, opt["gguf"], tmp, name)
                    gotg = upstream_venv.run_wkvm(exe, gdir, toks, lp, V)
                    if not np.array_equal(got, gotg):
                        raise ValueError("the %s GGUF from llama.cpp's converter is not bit-identical"
                                         " (max |d| %.3g)" % (opt["gguf"], np.abs(got - gotg).max()))
                    figures["gguf %s = safetensors" % opt["gguf"]] = 0.0
                for flag in (["--batch-check", "5"], ["--slot-check"]):
                    p = subprocess.run([exe, "--model", d, "--tokens", ids] + flag,
                                       capture_output=True, text=True, timeout=120)
                    if p.returncode != 0 or ": ok" not in p.stdout + p.stderr and \
                            "identical" not in p.stdout + p.stderr:
                        raise ValueError("%s: %s" % (flag[0], (p.stdout + p.stderr)[-300:]))
                if opt.get("amx"):
                    amx_figures(exe, d, toks, lp, V, model, seq64, figures, bounds)
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
                figures["wkvm"] = None
                print("FAIL %s: %s" % (name, e))
            figures["tf32 sequence vs tf64"] = upstream_venv.rel_err(seq64, seq)
            # as exact as transformers' own float32: within TOL, or twice its distance
            own = figures["tf32 sequence vs tf64"]
            for k in figures:
                if k in bounds:
                    continue
                if k.startswith("gguf"):
                    bounds[k] = 1e-300  # bit-identical, checked above
                    continue
                bounds[k] = (max(TOL, 2 * own) if "tf64" in k and k.startswith("wkvm")
                             else max(TOL_F32, 3 * own))
            ok = all(v is not None and v < bounds[k] for k, v in figures.items()) and greedy == 0
            fails += not ok
            print("%-4s %-34s %s  greedy mismatches %d" % ("ok" if ok else "FAIL", name, "  ".join(
                "%s %s" % (k, "error" if v is None else "%.2e" % v)
                for k, v in figures.items()), greedy), flush=True)
            for k, v in figures.items():
                if v is not None:
                    worst[k] = max(worst.get(k, 0.0), v)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n=== Qwen3.5 vs transformers (max|diff|/std < %g against float64, < %g against "
          "float32) ===" % (TOL, TOL_F32))
    for k, v in worst.items():
        print("worst %-30s %.2e" % (k, v))
    print("%s: %d passed, %d failed in %.1fs" % (NAME, ran - fails, fails,
                                                 time.time() - t0))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
