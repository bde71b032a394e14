#!/usr/bin/python3
"""wkvm-infer against transformers' own Granite-4.0-H modeling code
(models/granitemoehybrid, transformers 5.x on CPU torch): the family wkvm
serves as `granite_h`.

Random checkpoints are built by transformers itself
(GraniteMoeHybridForCausalLM: Mamba2 layers and a few attention layers, the
shared MLP, a mixture of experts in the MoE cases), in the proportions of
the real configs scaled down (Granite-4.0-H-Micro: dense, Mamba2 with one
group, attention without position encoding; Granite-4.0-H-Tiny: 64 experts,
6 per token, shared MLP twice an expert's width), with Granite's real
multipliers (embedding x12, residual x0.22..0.25, attention scale 1/128,
logits / 6..8), their parameters drawn so that every convention shows (norm
weights away from 1, A_log, dt_bias and D spread, routers with distinct
top-k), saved with save_pretrained and loaded back by transformers for the
reference. wkvm-infer --fp32 must give the same logits at every position,
max |diff| / std(logits) < TOL:
  - its whole-prompt prefill against the whole sequence at once
    (use_cache=False: transformers' chunked Mamba2 scan), and
  - its --prefill-chunk 1 against one token at a time through transformers'
    cache (the recurrent selective-state update and causal_conv1d_update).
The greedy ids (argmax per position) must be equal too, except where the
reference's top two logits are within 1e-4 std of each other; prefill in
chunks of 1 and 7 must be bit-identical to the whole prompt, and
--batch-check (the row alone and among random rows) and --slot-check (fork,
hibernate/resume, KV pages) must pass.

Tolerance: as upstream_qwen35.py (transformers' float32 against the float64
run of the same code: wkvm within 1e-4 of float64, or twice transformers'
own float32 distance; within 3e-4 of float32). A misread model (a
multiplier dropped, the router's softmax over all experts, rope on a nope
model) is off by far more.

The Mamba2 mixer with mamba_n_groups > 1 here is transformers' (and
mamba_ssm's): the gated RMSNorm normalises each of the n_groups groups of
d_inner / n_groups channels on its own.

GGUF: the two nope cases (dense and MoE) are also converted by llama.cpp's
own convert_hf_to_gguf.py (granitehybrid, through bench/qwen35-gguf.py, which
gives it a tokenizer; from a copy of the config with the hub's layer_types
names, the only ones the converter reads), and wkvm must read the file back
to the safetensors' logits bit for bit (unless the converter's
A = -exp(A_log) differs from wkvm's expf in the last bit, as for Nemotron-H),
with --batch-check passing on it. The rope case is not converted: the
converter marks only Bamba as using RoPE, so its file would be a nope model.
The MoE case is converted with --outtype q8_0 too and checked against
transformers' float64 run on the values the file holds, as in
upstream_nemotron_h (converter_q8_0; within TOL, greedy ids equal, the
unquantized reference more than 10x farther, chunk 7 bit-identical); its
expert down projections (24 inputs) and shared MLP output (48) are not whole
Q8_0 blocks, so the converter writes them as float16: that path is checked too.
Skipped (with a line) when deploy/install-gguf-converter cannot be had.

causal_conv1d and mamba_ssm are kept from loading (transformers would take
their CUDA kernels), so transformers runs its torch fallbacks.

Cases: Micro-like dense (3 Mamba2 : 1 attention, nope, tied); Tiny-like MoE
(8 experts, top 3, shared MLP, nope, tied); and a rope case with two Mamba2
groups, GQA 4:1, conv 3, an untied head and the older layer_types names
("mamba" / "attention").

The packages come from `deploy/install-ref-venv --fla` (transformers 5.24,
torch 2.15 CPU); WKVM_REF_FLA=0 skips. Exit 0 when every case agrees, 1 on a
disagreement, 77 (skip) when the venv cannot be had or wkvm-infer is not
built.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import upstream_venv  # noqa: E402
import gguf_zygote  # noqa: E402  (the conversions: forks of one warm process)

NAME = "upstream_granite_h"
upstream_venv.enter(NAME, ["transformers", "torch", "numpy", "safetensors"], fla=True)

# transformers picks these kernels when they import: keep them out
for mod in ("fla", "causal_conv1d", "mamba_ssm"):
    sys.modules[mod] = None

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM  # noqa: E402

import converter_q8_0  # noqa: E402  (numpy, in the venv)

TOL = 1e-4      # max |diff| / std(logits) against the float64 run of the same code
TOL_F32 = 3e-4  # against the stock float32 run
N_TOKENS = 24
GGUF_CASES = ("micro-dense-f32", "tiny-moe-f32-E8k3")  # converted to GGUF too (see above)
Q8_CASES = ("tiny-moe-f32-E8k3",)  # and to a Q8_0 GGUF (see above)
CONV = None  # llama.cpp's converter dir, set in main()


def f64_class():
    """transformers' modeling_granitemoehybrid.py with its float32 casts made
    float64 (the same code, evaluated in double precision), as a module of its
    own: its GraniteMoeHybridForCausalLM."""
    import importlib
    import importlib.util
    mq = importlib.import_module("transformers.models.granitemoehybrid.modeling_granitemoehybrid")
    src = open(mq.__file__).read()
    for a, b in (("torch.float32", "torch.float64"), (".float()", ".double()"),
                 ("dtype=torch.float)", "dtype=torch.float64)")):
        src = src.replace(a, b)
    name = "transformers.models.granitemoehybrid.modeling_granitemoehybrid_f64"
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "transformers.models.granitemoehybrid"
    mod.__file__ = mq.__file__
    sys.modules[name] = mod
    exec(compile(src, mq.__file__, "exec"), mod.__dict__)
    return mod.GraniteMoeHybridForCausalLM


M, A = "mamba", "attention"
BASE = dict(vocab_size=320, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, mamba_n_heads=8, mamba_d_head=16, mamba_expand=2,
            mamba_d_state=16, mamba_d_conv=4, mamba_n_groups=1, mamba_chunk_size=256,
            layer_types=["linear_attention", "linear_attention", "linear_attention",
                         "full_attention"],
            position_embedding_type="nope", tie_word_embeddings=True, rms_norm_eps=1e-5,
            attention_multiplier=0.0078125, embedding_multiplier=12.0)

CASES = [
    # Granite-4.0-H-Micro's proportions: dense, the shared MLP 4x hidden
    ("micro-dense-f32", dict(BASE, num_local_experts=0, shared_intermediate_size=256,
                             intermediate_size=256, residual_multiplier=0.246,
                             logits_scaling=8.0)),
    # Granite-4.0-H-Tiny's: experts a third of hidden, shared MLP twice an expert
    ("tiny-moe-f32-E8k3", dict(BASE, num_local_experts=8, num_experts_per_tok=3,
                               intermediate_size=24, shared_intermediate_size=48,
                               residual_multiplier=0.22, logits_scaling=6.0)),
    # rope, two Mamba2 groups, GQA 4:1, conv 3, an untied head, the older layer names
    ("rope-g2-gqa4-conv3-untied", dict(BASE, num_hidden_layers=5, num_key_value_heads=1,
                                       mamba_n_groups=2, mamba_d_conv=3,
                                       layer_types=[M, A, M, M, A],
                                       position_embedding_type="rope",
                                       rope_parameters={"rope_type": "default",
                                                        "rope_theta": 10000.0},
                                       tie_word_embeddings=False, num_local_experts=4,
                                       num_experts_per_tok=2, intermediate_size=32,
                                       shared_intermediate_size=64, residual_multiplier=0.25,
                                       logits_scaling=6.0)),
]


# --full-width (a manual check, not in CI: ~1.2 GB of float32 weights, docs/FAMILIES.md):
# two layers (Mamba2, attention; each with the shared MLP and the experts) at
# Granite-4.0-H-Tiny's widths: hidden 1536; Mamba2 48 heads of 64, one group, state 128;
# 12 query / 4 KV heads of 128, no position encoding; 64 experts of 512, top 6; shared
# MLP 1024; the vocabulary cut to 512 tokens
FULL = [("granite-4.0-h-tiny-widths", dict(
    BASE, vocab_size=512, hidden_size=1536, num_hidden_layers=2, layer_types=[M, A],
    num_attention_heads=12, num_key_value_heads=4, mamba_n_heads=48, mamba_d_head=64,
    mamba_d_state=128, mamba_n_groups=1, num_local_experts=64, num_experts_per_tok=6,
    intermediate_size=512, shared_intermediate_size=1024, residual_multiplier=0.22,
    logits_scaling=6.0, tie_word_embeddings=True))]
FULL_TOKENS = 8


def randomize(model, seed):
    """Parameters drawn so that every convention matters (see the docstring)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.5, 8.0, generator=g).log())
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5 - 1.5)
            elif name.endswith(".D"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif "conv1d" in name:
                p.copy_((0.4 if p.ndim > 1 else 0.1) * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:  # the RMSNorms (and the gated one)
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif "router" in name:  # distinct top-k, no near ties
                p.copy_(torch.randn(p.shape, generator=g) * (3.0 / p.shape[-1] ** 0.5))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 / fan_in ** 0.5))


def write_case(tmp, name, cfg_kw, seed):
    d = os.path.join(tmp, name)
    torch.manual_seed(seed)
    model = GraniteMoeHybridForCausalLM(GraniteMoeHybridConfig(**cfg_kw))
    randomize(model, seed)
    model.save_pretrained(d)
    # the config as it is on the hub: the older layer names when the case uses them
    if M in cfg_kw.get("layer_types", []):
        p = os.path.join(d, "config.json")
        c = json.load(open(p))
        c["layer_types"] = cfg_kw["layer_types"]
        json.dump(c, open(p, "w"), indent=2)
    kw = {"experts_implementation": "eager"} if cfg_kw.get("num_local_experts", 0) > 0 else {}
    ref = GraniteMoeHybridForCausalLM.from_pretrained(d, dtype=torch.float32, **kw).eval()
    ref64 = F64.from_pretrained(d, dtype=torch.float64, **kw).eval()
    return d, cfg_kw["vocab_size"], ref, ref64


def upstream(model, tokens):
    """(whole sequence [T, V], one token at a time [T, V]) in float64."""
    rows, cache = [], None
    with torch.no_grad():
        seq = model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].double().numpy()
        for t in tokens:
            o = model(input_ids=torch.tensor([[t]]), cache=cache, use_cache=True)
            cache = getattr(o, "cache", None)
            if cache is None:
                cache = o.past_key_values
            rows.append(o.logits[0, -1].double().numpy())
    return seq, np.stack(rows)


def greedy_mismatch(ref, got):
    """Positions where argmax differs and the reference's top two are not a near tie."""
    bad = 0
    std = ref.std()
    for r, g in zip(ref, got):
        a, b = int(np.argmax(r)), int(np.argmax(g))
        if a != b and abs(r[a] - r[b]) > 1e-4 * std:
            bad += 1
    return bad


def converter_dir():
    """llama.cpp's converter (deploy/install-gguf-converter), or None when it cannot be had."""
    inst = os.path.join(HERE, "..", "..", "deploy", "install-gguf-converter")
    p = subprocess.run([inst, sys.executable], capture_output=True, text=True, timeout=900)
    return p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else None


def gguf_of(d, tmp, name, outtype="f32"):
    """The model converted by llama.cpp's converter (f32 unless told, from a copy of the
    config with the hub's layer_types names "mamba" / "attention"), alone in a directory."""
    src, gdir = os.path.join(tmp, name + "-src"), os.path.join(tmp, name + "-gguf")
    os.makedirs(src, exist_ok=True)
    os.makedirs(gdir, exist_ok=True)
    c = json.load(open(os.path.join(d, "config.json")))
    if c.get("layer_types"):
        c["layer_types"] = [A if t in (A, "full_attention") else M for t in c["layer_types"]]
    json.dump(c, open(os.path.join(src, "config.json"), "w"), indent=2)
    os.symlink(os.path.join(d, "model.safetensors"), os.path.join(src, "model.safetensors"))
    script = os.path.join(HERE, "..", "..", "bench", "qwen35-gguf.py")
    p = gguf_zygote.run(script, [CONV, src, os.path.join(gdir, "model.gguf"),
                        "--outtype", outtype], timeout=600)
    if p.returncode != 0:
        raise RuntimeError("convert: " + (p.stderr or p.stdout)[-800:])
    return gdir


def a_ulps(d, gdir):
    """Mamba2 heads whose A = -exp(A_log) the converter (torch.exp) stored differently from
    the -expf(A_log) wkvm computes from the safetensors (glibc)."""
    import ctypes
    from safetensors.numpy import load_file
    sys.path.insert(0, os.path.join(CONV, "gguf-py"))
    import gguf
    libm = ctypes.CDLL("libm.so.6")
    libm.expf.restype, libm.expf.argtypes = ctypes.c_float, [ctypes.c_float]
    st = load_file(os.path.join(d, "model.safetensors"))
    n = 0
    for t in gguf.GGUFReader(os.path.join(gdir, "model.gguf")).tensors:
        if t.name.endswith(".ssm_a"):
            al = st["model.layers.%s.mamba.A_log" % t.name.split(".")[1]].reshape(-1)
            n += sum(-libm.expf(float(x)) != float(y)
                     for x, y in zip(al, np.array(t.data).reshape(-1)))
    return n


def check_gguf(exe, tmp, name, d, V, toks, got, figures):
    """The converter's GGUF of the case against its safetensors (figures gets the distance)."""
    lp = os.path.join(tmp, name + ".gguf.logits")
    gdir = gguf_of(d, tmp, name)
    gotg = upstream_venv.run_wkvm(exe, gdir, toks, lp, V)
    ulps = a_ulps(d, gdir)
    if ulps == 0 and not np.array_equal(got, gotg):
        raise ValueError("the GGUF from llama.cpp's converter is not bit-identical")
    figures["gguf vs safetensors (%d A ulps)" % ulps] = upstream_venv.rel_err(got, gotg)
    ids = ",".join(map(str, toks[:17]))
    p = subprocess.run([exe, "--model", gdir, "--tokens", ids, "--batch-check", "3"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise ValueError("gguf --batch-check: %s" % (p.stdout + p.stderr)[-300:])


def check_q8_0(exe, tmp, name, d, V, toks, figures, seq64):
    """The converter's --outtype q8_0 file against transformers (float64) on the values it
    holds (converter_q8_0: Q8_0 blocks dequantized, float16 where a row is not whole
    blocks); returns the greedy mismatches. wkvm's Q8_0 kernels multiply the dequantized
    blocks in float32, so the bound is the float32 one (TOL); the unquantized reference
    must be farther (it is the blocks that are checked)."""
    t0 = time.time()
    src = os.path.join(tmp, name + "-q8src")
    n = converter_q8_0.write_rounded_copy(d, src)
    m64 = F64.from_pretrained(src, dtype=torch.float64, experts_implementation="eager").eval()
    with torch.no_grad():
        ref = m64(input_ids=torch.tensor([toks]), use_cache=False).logits[0].double().numpy()
    gdir = gguf_of(src, tmp, name + "-q8", "q8_0")
    lp = os.path.join(tmp, name + ".q8.logits")
    got = upstream_venv.run_wkvm(exe, gdir, toks, lp, V, fp32=False)  # the Q8_0 kernels
    if not np.array_equal(got, upstream_venv.run_wkvm(exe, gdir, toks, lp, V, chunk=7,
                                                      fp32=False)):
        raise ValueError("q8_0 GGUF: chunked prefill (7) is not bit-identical to whole")
    own = upstream_venv.rel_err(ref, got)
    far = upstream_venv.rel_err(seq64, got)
    figures["q8_0 gguf vs tf64 on its values"] = own
    if not far > 10 * own:
        raise ValueError("q8_0 GGUF: the unquantized reference (%.2e) is not farther than "
                         "the Q8_0 one (%.2e)" % (far, own))
    print("     q8_0 GGUF (%d tensors Q8_0, %d F16): vs the unquantized tf64 %.2e (the "
          "quantization); %.1f s" % (n["q8_0"], n["f16"], far, time.time() - t0))
    return greedy_mismatch(ref, got)


def check_case(exe, tmp, name, d, V, toks, figures):
    """wkvm's runs of one case; figures gets its distances. Raises on a failure."""
    lp = os.path.join(tmp, name + ".logits")
    got = upstream_venv.run_wkvm(exe, d, toks, lp, V)
    got1 = upstream_venv.run_wkvm(exe, d, toks, lp, V, chunk=1)
    got7 = upstream_venv.run_wkvm(exe, d, toks, lp, V, chunk=7)
    if not (np.array_equal(got, got1) and np.array_equal(got, got7)):
        raise ValueError("chunked prefill (1, 7) is not bit-identical to whole")
    ids = ",".join(map(str, toks[:17]))
    for flag in (["--batch-check", "5"], ["--slot-check"]):
        p = subprocess.run([exe, "--model", d, "--tokens", ids] + flag, capture_output=True,
                           text=True, timeout=120)
        if p.returncode != 0 or ": ok" not in p.stdout + p.stderr and \
                "identical" not in p.stdout + p.stderr:
            raise ValueError("%s: %s" % (flag[0], (p.stdout + p.stderr)[-300:]))
    if name in GGUF_CASES and CONV is not None:
        check_gguf(exe, tmp, name, d, V, toks, got, figures)
    return got, got1


def main():
    build = upstream_venv.build_dir()
    exe = os.path.join(build, "tools", "wkvm-infer")
    if not os.access(exe, os.X_OK):
        upstream_venv.skip(NAME, "%s is not built" % exe)
    print("transformers %s, torch %s (torch fallbacks of the Mamba2 scan and conv)"
          % (transformers.__version__, torch.__version__), flush=True)
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    global F64, CONV
    F64 = f64_class()
    CONV = converter_dir()
    print("llama.cpp converter: %s" % (CONV or "not available (GGUF checks skipped)"), flush=True)
    rng = np.random.default_rng(4)
    full = "--full-width" in sys.argv[1:]
    cases, n_tokens = (FULL, FULL_TOKENS) if full else (CASES, N_TOKENS)
    tmp = tempfile.mkdtemp(prefix="wkvm-up-granite-")
    worst = {}
    fails = 0
    t0 = time.time()
    try:
        for i, (name, kw) in enumerate(cases):
            d, V, model, model64 = write_case(tmp, name, kw, 4000 + i)
            toks = [int(x) for x in rng.integers(0, V, n_tokens)]
            toks[1] = V - 1
            seq, one = upstream(model, toks)
            seq64, one64 = upstream(model64, toks)
            figures, bounds = {}, {}
            greedy = 0
            try:
                got, got1 = check_case(exe, tmp, name, d, V, toks, figures)
                figures["wkvm vs tf64 sequence"] = upstream_venv.rel_err(seq64, got)
                figures["wkvm vs tf64 one-by-one"] = upstream_venv.rel_err(one64, got1)
                figures["wkvm vs tf32 sequence"] = upstream_venv.rel_err(seq, got)
                figures["wkvm vs tf32 one-by-one"] = upstream_venv.rel_err(one, got1)
                greedy = greedy_mismatch(seq64, got) + greedy_mismatch(one64, got1)
                if name in Q8_CASES and CONV is not None:
                    greedy += check_q8_0(exe, tmp, name, d, V, toks, figures, seq64)
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
                figures["wkvm"] = None
                print("FAIL %s: %s" % (name, e))
            figures["tf32 sequence vs tf64"] = upstream_venv.rel_err(seq64, seq)
            figures["tf64 sequence vs one-by-one"] = upstream_venv.rel_err(seq64, one64)
            own = figures["tf32 sequence vs tf64"]
            for k in figures:
                bounds[k] = (max(TOL, 2 * own) if "tf64" in k and k[:4] in ("wkvm", "q8_0")
                             else 1e-5 if k.startswith("gguf")  # bit-identical but for A ulps
                             else max(TOL_F32, 3 * own))
            ok = all(v is not None and v < bounds[k] for k, v in figures.items()) and greedy == 0
            fails += not ok
            print("%-4s %-28s %s  greedy mismatches %d" % ("ok" if ok else "FAIL", name, "  ".join(
                "%s %s" % (k, "error" if v is None else "%.2e" % v)
                for k, v in figures.items()), greedy), flush=True)
            for k, v in figures.items():
                if v is not None:
                    worst[k] = max(worst.get(k, 0.0), v)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n=== Granite-4.0-H vs transformers (max|diff|/std < %g against float64, < %g "
          "against float32) ===" % (TOL, TOL_F32))
    for k, v in worst.items():
        print("worst %-30s %.2e" % (k, v))
    print("%s: %d passed, %d failed in %.1fs" % (NAME, len(cases) - fails, fails,
                                                 time.time() - t0))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
