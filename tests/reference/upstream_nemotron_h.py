#!/usr/bin/python3
"""wkvm-infer against transformers' own Nemotron-H modeling code
(models/nemotron_h, transformers 5.x on CPU torch): the family wkvm serves
as `nemotron_h`, a hybrid of Mamba2, attention, squared-ReLU MLP and MoE
layers on wkvm's one layer-list pass.

Random checkpoints are built by transformers itself (NemotronHForCausalLM,
saved with save_pretrained: backbone.* names, one tensor per expert), their
parameters drawn so that every convention shows (norm weights away from 1,
A_log and dt_bias spread, routers and score biases that give distinct top-k
choices), and loaded back by transformers for the reference. wkvm-infer
--fp32 must give the same logits at every position, max |diff| / std(logits)
< TOL:
  - its whole-prompt prefill against the whole sequence at once
    (use_cache=False: transformers' chunked Mamba2 scan, one chunk), and
  - its --prefill-chunk 1 against one token at a time through transformers'
    cache (mamba2_selective_state_update and causal_conv1d_update),
both against the float64 run of transformers' code, and the whole prompt
against its float32 sequence run too.
The greedy ids (argmax per position) must be equal too, except where the
reference's top two logits are within 1e-4 std of each other; prefill in
chunks of 1 and 7 must be bit-identical to the whole prompt, and
--batch-check (the row alone and among random rows) and --slot-check (fork,
hibernate/resume, KV pages) must pass.

Knowing the reference (docs/FAMILIES.md, Nemotron-H): transformers 5.24's
NemotronHMamba2Mixer hard-codes time_step_limit = (time_step_min, inf) and
clamps dt with it on the whole-sequence (chunked) path only; its cached
path clamps only a cache's first token (which runs the chunked path) and
none after; the checkpoints' config.json says time_step_limit [0, inf]. wkvm
applies no clamp (the config's limit; as mamba_ssm's step kernel and
llama.cpp), so the references here run transformers' code with its mixers'
time_step_limit set to (0, inf) on both paths; each case also reports (a)
the whole-sequence path with chunk_size 8 (three chunks) against 128 (one
chunk), (b) the sequence path against the cached one, both float64 and
within 1e-9 (5.24's chunked scan is right past the first chunk; 5.5.4's was
not), and (c) the stock clamped sequence path against the unclamped one:
equal where the clamp never binds (softplus(dt + dt_bias) far above
time_step_min, every case but one), and off by > 1e-3 std in "dt-clamp",
whose dt_bias is drawn so low that it binds.

GGUF: two cases (f32 MoE, f32 dense with the legacy config) are also converted
by llama.cpp's own convert_hf_to_gguf.py (through bench/qwen35-gguf.py, which
gives it a tokenizer) and the file, alone in a directory, must give the same
logits bit for bit, unless the converter's A = -exp(A_log) (torch) differs by
an ulp from glibc's expf for some head (counted and printed; then within
1e-5 std), and pass --batch-check.

Q8_0: the MoE case (and with WKVM_REF_Q8_ALL=1 the dense one too) is
converted with --outtype q8_0 too, from a copy
whose tensors hold the values the converter's file will (converter_q8_0: the
matrices as their dequantized Q8_0 blocks, the embedding included, float16
where a row is not whole blocks; Q8_0 of those values gives the same blocks
back), and wkvm on that file (weights as stored: the Q8_0 kernels, not --fp32,
which dequantizes at load) must be within TOL of transformers' float64 run
of the copy with the same greedy ids: wkvm's Q8_0 kernels multiply the
dequantized blocks in float32 activations, so the float32 bound holds; the
unquantized float64 run must be more than 10x farther (the Q8_0 values are
what is checked), and --prefill-chunk 7 bit-identical. (The MoE file needs
the experts' stacked Q8_0 tensors split per expert, which wkvm refused before.)

Tolerance as upstream_qwen35.py: wkvm within 1e-4 std of the float64 run of
transformers' own code (or twice transformers' float32 error), within 3e-4
of its float32 run.

mamba_ssm and causal_conv1d are kept from loading, so transformers runs its
torch fallbacks. The packages come from `deploy/install-ref-venv --fla`
(transformers 5.24, torch 2.15 CPU); WKVM_REF_FLA=0 skips. Exit 0 when every
case agrees, 1 on a disagreement, 77 (skip) when the venv cannot be had or
wkvm-infer is not built.
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
import gguf_zygote  # noqa: E402  (the conversions: forks of one warm process)

NAME = "upstream_nemotron_h"
upstream_venv.enter(NAME, ["transformers", "torch", "numpy", "safetensors"], fla=True)

# transformers picks mamba_ssm's / causal_conv1d's kernels when they import: keep them out
sys.modules["mamba_ssm"] = None
sys.modules["causal_conv1d"] = None

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import NemotronHConfig, NemotronHForCausalLM  # noqa: E402

import converter_q8_0  # noqa: E402  (numpy, in the venv)

TOL = 1e-4
# the Q8_0 conversion of the dense case too (10 s of CPU, mostly the converter's start-up;
# CI converts the MoE case only, for its time budget)
Q8_ALL = os.environ.get("WKVM_REF_Q8_ALL") == "1"
TOL_F32 = 3e-4
N_TOKENS = 24


def f64_class():
    """transformers' modeling_nemotron_h with its float32 casts made float64."""
    import importlib
    import importlib.util
    mq = importlib.import_module("transformers.models.nemotron_h.modeling_nemotron_h")
    src = open(mq.__file__).read()
    for a, b in (("torch.float32", "torch.float64"), (".float()", ".double()"),
                 ("dtype=torch.float)", "dtype=torch.float64)")):
        src = src.replace(a, b)
    name = "transformers.models.nemotron_h.modeling_nemotron_h_f64"
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "transformers.models.nemotron_h"
    mod.__file__ = mq.__file__
    sys.modules[name] = mod
    exec(compile(src, mq.__file__, "exec"), mod.__dict__)
    return mod.NemotronHForCausalLM


# Nemotron 3 Nano's proportions, scaled down: Mamba2 heads of 16 in groups,
# GQA attention without position encoding, squared-ReLU MLP, 8 routed experts
# top-2 with a shared expert, routed_scaling_factor 2.5
SMALL = dict(vocab_size=304, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, intermediate_size=96, mamba_num_heads=8, mamba_head_dim=16,
             n_groups=2, ssm_state_size=16, conv_kernel=4, n_routed_experts=8,
             num_experts_per_tok=2, moe_intermediate_size=32,
             moe_shared_expert_intermediate_size=48, n_group=1, topk_group=1,
             routed_scaling_factor=2.5, norm_topk_prob=True)

CASES = [
    ("hybrid-f32-nano", dict(SMALL, layers_block_type=[
        "linear_attention", "moe", "linear_attention", "full_attention", "moe",
        "linear_attention", "mlp"]), {}),
    ("pattern-f32-g4-conv3-tied-mlp",
     dict(SMALL, n_groups=4, conv_kernel=3, tie_word_embeddings=True, num_key_value_heads=1,
          hybrid_override_pattern="M-M*-M-"), {"legacy": True, "gguf": "f32", "q8_0": "all"}),
    ("moe-f32-E16k4-grouped-nonorm",
     dict(SMALL, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
          norm_topk_prob=False, routed_scaling_factor=1.0,
          layers_block_type=["linear_attention", "moe", "full_attention", "moe",
                             "linear_attention"]), {"gguf": "f32", "q8_0": True}),
    ("hybrid-bf16", dict(SMALL, layers_block_type=[
        "linear_attention", "moe", "full_attention", "linear_attention", "mlp"]),
     {"dtype": "bf16"}),
    ("dt-clamp", dict(SMALL, layers_block_type=["linear_attention", "full_attention", "mlp",
                                             "linear_attention"]),
     {"dt_bias": -9.0}),
]


# --full-width (a manual check, not in CI: ~1.3 GB of float32 weights, docs/FAMILIES.md):
# three layers (M * -) at Nemotron-H-8B's widths, which are NemotronHConfig's defaults
# (hidden 4096; Mamba2 128 heads of 64 in 8 groups, state 128, conv 4; 32 query / 8 KV
# heads of 128; squared-ReLU MLP 21504), the vocabulary cut to 512 tokens
FULL = [("nemotron-h-8b-widths-M*-", dict(vocab_size=512, layers_block_type=[
    "linear_attention", "full_attention", "mlp"]), {})]
FULL_TOKENS = 8


def randomize(model, seed, dt_bias=None):
    """Parameters drawn so that every convention matters (see the docstring)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.1, 2.5, generator=g).log())
            elif name.endswith("dt_bias"):
                if dt_bias is not None:
                    p.copy_(dt_bias + 0.5 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5 + 0.5)
            elif name.endswith(".D"):
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("gate.weight"):  # routers: distinct top-k, no near ties
                p.copy_(torch.randn(p.shape, generator=g) * (3.0 / p.shape[-1] ** 0.5))
            elif p.ndim == 1:  # RMSNorm weights (block, gated, final), conv bias
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif "conv1d" in name:
                p.copy_(0.4 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) * (0.7 / fan_in ** 0.5))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn(b.shape, generator=g))


def write_case(tmp, name, cfg_kw, opt, seed):
    d = os.path.join(tmp, name)
    torch.manual_seed(seed)
    model = NemotronHForCausalLM(NemotronHConfig(**cfg_kw))
    randomize(model, seed, opt.get("dt_bias"))
    if opt.get("dtype") == "bf16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(d)
    if opt.get("legacy"):  # the older config spelling: hybrid_override_pattern, mamba_* keys
        import json
        p = os.path.join(d, "config.json")
        c = json.load(open(p))
        c["hybrid_override_pattern"] = cfg_kw["hybrid_override_pattern"]
        del c["layers_block_type"]
        c["mamba_n_groups"] = c.pop("n_groups")
        c["mamba_d_conv"] = c.pop("conv_kernel")
        for k in list(c):  # no experts: Nemotron-H's configs have no MoE keys (GGUF nemotron_h)
            if "expert" in k or k in ("n_group", "topk_group", "routed_scaling_factor",
                                      "norm_topk_prob", "moe_latent_size"):
                del c[k]
        json.dump(c, open(p, "w"), indent=2)
    kw = {"experts_implementation": "eager"}
    ref = NemotronHForCausalLM.from_pretrained(d, dtype=torch.float32, **kw).eval()
    ref64 = F64.from_pretrained(d, dtype=torch.float64, **kw).eval()
    return d, cfg_kw["vocab_size"], ref, ref64


def converter_dir():
    """llama.cpp's converter (deploy/install-gguf-converter), or None when it cannot be had."""
    inst = os.path.join(HERE, "..", "..", "deploy", "install-gguf-converter")
    p = subprocess.run([inst, sys.executable], capture_output=True, text=True, timeout=900)
    return p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else None


def gguf_of(conv, d, outtype, tmp, name):
    """The model converted by llama.cpp's converter (through bench/qwen35-gguf.py, which
    gives it a tokenizer), alone in a directory."""
    gdir = os.path.join(tmp, name + "-gguf")
    os.makedirs(gdir, exist_ok=True)
    script = os.path.join(HERE, "..", "..", "bench", "qwen35-gguf.py")
    p = gguf_zygote.run(script, [conv, d, os.path.join(gdir, "model.gguf"),
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
            al = st["backbone.layers.%s.mixer.A_log" % t.name.split(".")[1]].reshape(-1)
            n += sum(-libm.expf(float(x)) != float(y)
                     for x, y in zip(al, np.array(t.data).reshape(-1)))
    return n


def set_mixers(model, **attrs):
    for m in model.modules():
        if type(m).__name__ == "NemotronHMamba2Mixer":
            for k, v in attrs.items():
                setattr(m, k, v)


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


def whole(model, tokens, **attrs):
    """The whole-sequence logits with the Mamba2 mixers' attributes changed (then restored)."""
    old = {}
    for m in model.modules():
        if type(m).__name__ == "NemotronHMamba2Mixer":
            old = {k: getattr(m, k) for k in attrs}
            break
    set_mixers(model, **attrs)
    try:
        with torch.no_grad():
            return model(input_ids=torch.tensor([tokens]),
                         use_cache=False).logits[0].double().numpy()
    finally:
        set_mixers(model, **old)


def greedy_mismatch(ref, got):
    bad = 0
    std = ref.std()
    for r, g in zip(ref, got):
        a, b = int(np.argmax(r)), int(np.argmax(g))
        if a != b and abs(r[a] - r[b]) > 1e-4 * std:
            bad += 1
    return bad


def check_q8_0(exe, d, toks, lp, V, figures, seq64):
    """The converter's --outtype q8_0 file against transformers (float64) on the values it
    holds (converter_q8_0: Q8_0 blocks dequantized, float16 where a row is not whole
    blocks); returns the greedy mismatches. wkvm's Q8_0 kernels multiply the dequantized
    blocks in float32, so the bound is the float32 one (TOL); the unquantized reference
    must be farther (it is the blocks that are checked)."""
    t0 = time.time()
    tmp, name = os.path.dirname(lp), os.path.basename(d)
    src = os.path.join(tmp, name + "-q8src")
    n = converter_q8_0.write_rounded_copy(d, src)
    m64 = F64.from_pretrained(src, dtype=torch.float64, experts_implementation="eager").eval()
    set_mixers(m64, time_step_limit=(0.0, float("inf")))
    ref = whole(m64, toks)
    gdir = gguf_of(CONV, src, "q8_0", tmp, name + "-q8")
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


def check_wkvm(exe, d, toks, lp, V, figures, seq, seq64, one64, opt):
    got = upstream_venv.run_wkvm(exe, d, toks, lp, V)
    got1 = upstream_venv.run_wkvm(exe, d, toks, lp, V, chunk=1)
    figures["wkvm vs tf64 sequence"] = upstream_venv.rel_err(seq64, got)
    figures["wkvm vs tf64 one-by-one"] = upstream_venv.rel_err(one64, got1)
    figures["wkvm vs tf32 sequence"] = upstream_venv.rel_err(seq, got)
    greedy = greedy_mismatch(seq64, got) + greedy_mismatch(one64, got1)
    got7 = upstream_venv.run_wkvm(exe, d, toks, lp, V, chunk=7)
    if not (np.array_equal(got, got1) and np.array_equal(got, got7)):
        raise ValueError("chunked prefill (1, 7) is not bit-identical to whole")
    ids = ",".join(map(str, toks[:17]))
    if opt.get("gguf") and CONV is not None:
        gdir = gguf_of(CONV, d, opt["gguf"], os.path.dirname(lp), os.path.basename(d))
        gotg = upstream_venv.run_wkvm(exe, gdir, toks, lp, V)
        ulps = a_ulps(d, gdir)
        if ulps == 0 and not np.array_equal(got, gotg):
            raise ValueError("the GGUF from llama.cpp's converter is not bit-identical")
        figures["gguf vs safetensors (%d A ulps)" % ulps] = upstream_venv.rel_err(got, gotg)
        p = subprocess.run([exe, "--model", gdir, "--tokens", ids, "--batch-check", "3"],
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise ValueError("gguf --batch-check: %s" % (p.stdout + p.stderr)[-300:])
    if opt.get("q8_0") and CONV is not None and (opt["q8_0"] is True or Q8_ALL):
        greedy += check_q8_0(exe, d, toks, lp, V, figures, seq64)
    for flag in (["--batch-check", "5"], ["--slot-check"]):
        p = subprocess.run([exe, "--model", d, "--tokens", ids] + flag,
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0 or ": ok" not in p.stdout + p.stderr and \
                "identical" not in p.stdout + p.stderr:
            raise ValueError("%s: %s" % (flag[0], (p.stdout + p.stderr)[-300:]))
    return greedy


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
    rng = np.random.default_rng(36)
    full = "--full-width" in sys.argv[1:]
    cases, n_tokens = (FULL, FULL_TOKENS) if full else (CASES, N_TOKENS)
    tmp = tempfile.mkdtemp(prefix="wkvm-up-nh-")
    worst = {}
    fails = 0
    t0 = time.time()
    try:
        for i, (name, kw, opt) in enumerate(cases):
            d, V, model, model64 = write_case(tmp, name, kw, opt, 3600 + i)
            toks = [int(x) for x in rng.integers(0, V, n_tokens)]
            toks[1] = V - 1
            # the stock 5.24 whole-sequence path (dt clamped at time_step_min), then the
            # references: both paths with the config's time_step_limit (0, inf), no clamp
            tmin = model64.config.time_step_min
            stock = whole(model64, toks, time_step_limit=(tmin, float("inf")))
            for m in (model, model64):
                set_mixers(m, time_step_limit=(0.0, float("inf")))
            seq = whole(model, toks)  # float32: the sequence path only (time)
            seq64, one64 = upstream(model64, toks)
            clamp = opt.get("dt_bias") is not None
            figures, bounds = {}, {}
            # the reference against itself: chunking, its two paths, the stock dt clamp
            figures["tf64 chunk 8 vs 128"] = upstream_venv.rel_err(
                seq64, whole(model64, toks, chunk_size=8))
            figures["tf64 sequence vs cached"] = upstream_venv.rel_err(one64, seq64)
            figures["tf64 stock clamped vs unclamped"] = upstream_venv.rel_err(seq64, stock)
            greedy = 0
            try:
                greedy = check_wkvm(exe, d, toks, os.path.join(tmp, name + ".logits"), V,
                                    figures, seq, seq64, one64, opt)
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
                figures["wkvm"] = None
                print("FAIL %s: %s" % (name, e))
            figures["tf32 sequence vs tf64"] = upstream_venv.rel_err(seq64, seq)
            own = figures["tf32 sequence vs tf64"]
            for k in figures:
                if k == "tf64 stock clamped vs unclamped" and clamp:
                    bounds[k] = None  # must disagree: the clamp binds (checked below)
                elif k.startswith("q8_0"):
                    bounds[k] = max(TOL, 2 * own)  # float32 arithmetic on the same values
                elif k.startswith("gguf"):
                    bounds[k] = 1e-5  # bit-identical unless the converter's A differs (above)
                elif k.startswith("tf64"):
                    bounds[k] = 1e-9  # transformers' own paths, float64
                elif "tf64" in k and k.startswith("wkvm"):
                    bounds[k] = max(TOL, 2 * own)
                else:
                    bounds[k] = max(TOL_F32, 3 * own)
            ok = greedy == 0
            for k, v in figures.items():
                if bounds.get(k, 0.0) is None:
                    ok = ok and v is not None and v > 1e-3
                else:
                    ok = ok and v is not None and v < bounds[k]
            fails += not ok
            print("%-4s %-30s %s  greedy mismatches %d" % ("ok" if ok else "FAIL", name, "  ".join(
                "%s %s" % (k, "error" if v is None else "%.2e" % v)
                for k, v in figures.items()), greedy), flush=True)
            for k, v in figures.items():
                if v is not None and not (clamp and k.startswith("tf64 stock")):
                    worst[k] = max(worst.get(k, 0.0), v)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n=== Nemotron-H vs transformers (max|diff|/std < %g against float64, < %g against "
          "float32) ===" % (TOL, TOL_F32))
    for k, v in worst.items():
        print("worst %-34s %.2e" % (k, v))
    print("%s: %d passed, %d failed in %.1fs" % (NAME, len(cases) - fails, fails,
                                                 time.time() - t0))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
