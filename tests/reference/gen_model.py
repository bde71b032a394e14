#!/usr/bin/python3
"""Writes small random RWKV-7 ("x070") checkpoints for tests.

The weights are random but scaled so that the model is numerically meaningful:
LayerNorm weights near 1, decays spread over roughly (0.55, 0.97), in-context
learning rates spread over (0, 1), logits with a standard deviation of a few
units. Both checkpoint conventions are supported (BlinkDL `blocks.*` names and
Hugging Face fla `rwkv7` names), in F32, BF16 or F16, as one .safetensors, two
shards plus an index, or a torch .pth. A World-format vocab file with exactly
V-1 tokens (ids 1..V-1) is written beside the checkpoint.

This module never reads anything a test compares against; rwkv7_ref.py loads
what this writes. make_params() returns the internal (BlinkDL-orientation)
parameters already rounded to the stored dtype, as float64, so independent
checks can run on exactly the values that were written.

Usage:
  gen_model.py --out DIR [--layers L --embd C --head-size N --ffn F --vocab V
               --lora-w D --lora-a D --lora-v D --lora-g D --convention hf|blink
               --dtype f32|bf16|f16 --format safetensors|pth|sharded
               --layer0-v yes|no --tied --seed S]
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

# ---------------------------------------------------------------------------
# dtype rounding (exact, round-to-nearest-even) and raw encodings

DTYPES = ("f32", "bf16", "f16")
ST_DTYPE = {"f32": "F32", "bf16": "BF16", "f16": "F16"}


def f32_to_bf16_bits(a):
    """float32 array -> uint16 bfloat16 bits, round to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = np.isnan(np.asarray(a, dtype=np.float32))
    rounding = ((u >> 16) & 1) + 0x7FFF
    b = ((u + rounding) >> 16).astype(np.uint16)
    b[nan] = 0x7FC0
    return b


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to(a, dtype):
    """Rounds a float array to dtype and returns it as float64 (exact values)."""
    a32 = np.asarray(a, dtype=np.float32)
    if dtype == "f32":
        return a32.astype(np.float64)
    if dtype == "bf16":
        return bf16_bits_to_f32(f32_to_bf16_bits(a32)).astype(np.float64)
    if dtype == "f16":
        return a32.astype(np.float16).astype(np.float64)
    raise ValueError("unknown dtype %r" % dtype)


def encode(a, dtype):
    """Little-endian raw bytes of a (already representable) array in dtype."""
    a32 = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "f32":
        return a32.astype("<f4").tobytes()
    if dtype == "bf16":
        return f32_to_bf16_bits(a32).astype("<u2").tobytes()
    if dtype == "f16":
        return a32.astype("<f2").tobytes()
    raise ValueError("unknown dtype %r" % dtype)


# ---------------------------------------------------------------------------
# configuration and parameters


def default_cfg(**kw):
    cfg = dict(layers=2, embd=64, head_size=16, ffn=256, vocab=300,
               lora_w=16, lora_a=16, lora_v=8, lora_g=32,
               convention="hf", dtype="f32", format="safetensors",
               layer0_v=False, tied=False, seed=1)
    cfg.update(kw)
    if cfg["tied"] and cfg["convention"] != "hf":
        raise ValueError("tied needs the hf convention (BlinkDL always stores head.weight)")
    if cfg["embd"] % cfg["head_size"] != 0:
        raise ValueError("embd must be a multiple of head-size")
    return cfg


def make_params(cfg):
    """Random internal parameters (BlinkDL orientation, vectors flattened).

    Returns dict: emb [V,C], ln0_w/b, ln_out_w/b, head [V,C],
    layers: list of dicts with ln1_w/b, ln2_w/b, x_r..x_g [C], w0 [C],
    w1 [C,Dw], w2 [Dw,C], a0, a1, a2, v0, v1, v2 (v* present in layer 0 only
    when cfg['layer0_v']), g1 [C,Dg], g2 [Dg,C], k_k [C], k_a [C], r_k [H,N],
    Wr, Wk, Wv, Wo [C,C], lnx_w/b [C], ffn_x_k [C], ffn_key [F,C],
    ffn_value [C,F]. Every array is float64 holding values exactly
    representable in cfg['dtype'].
    """
    rng = np.random.default_rng(cfg["seed"])
    C, N, F, V = cfg["embd"], cfg["head_size"], cfg["ffn"], cfg["vocab"]
    H = C // N
    Dw, Da, Dv, Dg = cfg["lora_w"], cfg["lora_a"], cfg["lora_v"], cfg["lora_g"]
    dt = cfg["dtype"]

    def nrm(shape, std):
        return round_to(rng.standard_normal(shape) * std, dt)

    def uni(shape, lo, hi):
        return round_to(rng.uniform(lo, hi, shape), dt)

    def lnw():
        return round_to(1.0 + rng.standard_normal(C) * 0.1, dt)

    p = {
        "emb": nrm((V, C), 0.5),
        "ln0_w": lnw(), "ln0_b": nrm((C,), 0.05),
        "ln_out_w": lnw(), "ln_out_b": nrm((C,), 0.05),
        "head": nrm((V, C), 2.0 / np.sqrt(C)),
        "layers": [],
    }
    if cfg.get("tied"):
        p["head"] = p["emb"]  # HF tie_word_embeddings: no lm_head.weight is written
    for i in range(cfg["layers"]):
        L = {
            "ln1_w": lnw(), "ln1_b": nrm((C,), 0.05),
            "ln2_w": lnw(), "ln2_b": nrm((C,), 0.05),
        }
        for nm in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"):
            L[nm] = uni((C,), 0.0, 1.0)
        # decay: sigmoid(w0 + ...) spread so w = exp(-e^-0.5 sigmoid) varies
        L["w0"] = nrm((C,), 1.5)
        L["w1"] = nrm((C, Dw), 1.0 / np.sqrt(C))
        L["w2"] = nrm((Dw, C), 0.5 / np.sqrt(Dw))
        L["a0"] = nrm((C,), 1.0)
        L["a1"] = nrm((C, Da), 1.0 / np.sqrt(C))
        L["a2"] = nrm((Da, C), 0.5 / np.sqrt(Da))
        if i > 0 or cfg["layer0_v"]:
            L["v0"] = nrm((C,), 1.0)
            L["v1"] = nrm((C, Dv), 1.0 / np.sqrt(C))
            L["v2"] = nrm((Dv, C), 0.5 / np.sqrt(Dv))
        L["g1"] = nrm((C, Dg), 1.0 / np.sqrt(C))
        L["g2"] = nrm((Dg, C), 1.0 / np.sqrt(Dg))
        L["k_k"] = uni((C,), 0.6, 1.1)
        L["k_a"] = uni((C,), 0.5, 1.5)
        L["r_k"] = nrm((H, N), 0.3)
        L["Wr"] = nrm((C, C), 1.0 / np.sqrt(C))
        L["Wk"] = nrm((C, C), 1.0 / np.sqrt(C))
        L["Wv"] = nrm((C, C), 1.0 / np.sqrt(C))
        L["Wo"] = nrm((C, C), 0.5 / np.sqrt(C))
        L["lnx_w"] = lnw()
        L["lnx_b"] = nrm((C,), 0.05)
        L["ffn_x_k"] = uni((C,), 0.0, 1.0)
        L["ffn_key"] = nrm((F, C), 1.0 / np.sqrt(C))
        L["ffn_value"] = nrm((C, F), 0.5 / np.sqrt(F))
        p["layers"].append(L)
    return p


# ---------------------------------------------------------------------------
# naming conventions


def to_named(p, convention):
    """Maps internal params to an ordered dict of checkpoint name -> array."""
    out = {}
    C = p["emb"].shape[1]
    vec3 = lambda a: a.reshape(1, 1, -1)
    if convention == "blink":
        out["emb.weight"] = p["emb"]
        out["blocks.0.ln0.weight"] = p["ln0_w"]
        out["blocks.0.ln0.bias"] = p["ln0_b"]
        for i, L in enumerate(p["layers"]):
            b = "blocks.%d." % i
            out[b + "ln1.weight"] = L["ln1_w"]
            out[b + "ln1.bias"] = L["ln1_b"]
            out[b + "ln2.weight"] = L["ln2_w"]
            out[b + "ln2.bias"] = L["ln2_b"]
            for nm in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"):
                out[b + "att." + nm] = vec3(L[nm])
            out[b + "att.w0"] = vec3(L["w0"])
            out[b + "att.w1"] = L["w1"]
            out[b + "att.w2"] = L["w2"]
            out[b + "att.a0"] = vec3(L["a0"])
            out[b + "att.a1"] = L["a1"]
            out[b + "att.a2"] = L["a2"]
            if "v0" in L:
                out[b + "att.v0"] = vec3(L["v0"])
                out[b + "att.v1"] = L["v1"]
                out[b + "att.v2"] = L["v2"]
            out[b + "att.g1"] = L["g1"]
            out[b + "att.g2"] = L["g2"]
            out[b + "att.k_k"] = vec3(L["k_k"])
            out[b + "att.k_a"] = vec3(L["k_a"])
            out[b + "att.r_k"] = L["r_k"]
            out[b + "att.receptance.weight"] = L["Wr"]
            out[b + "att.key.weight"] = L["Wk"]
            out[b + "att.value.weight"] = L["Wv"]
            out[b + "att.output.weight"] = L["Wo"]
            out[b + "att.ln_x.weight"] = L["lnx_w"]
            out[b + "att.ln_x.bias"] = L["lnx_b"]
            out[b + "ffn.x_k"] = vec3(L["ffn_x_k"])
            out[b + "ffn.key.weight"] = L["ffn_key"]
            out[b + "ffn.value.weight"] = L["ffn_value"]
        out["ln_out.weight"] = p["ln_out_w"]
        out["ln_out.bias"] = p["ln_out_b"]
        out["head.weight"] = p["head"]
    elif convention == "hf":
        out["model.embeddings.weight"] = p["emb"]
        for i, L in enumerate(p["layers"]):
            b = "model.layers.%d." % i
            if i == 0:
                out[b + "pre_norm.weight"] = p["ln0_w"]
                out[b + "pre_norm.bias"] = p["ln0_b"]
            out[b + "attn_norm.weight"] = L["ln1_w"]
            out[b + "attn_norm.bias"] = L["ln1_b"]
            out[b + "ffn_norm.weight"] = L["ln2_w"]
            out[b + "ffn_norm.bias"] = L["ln2_b"]
            for nm in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"):
                out[b + "attn." + nm] = vec3(L[nm])
            out[b + "attn.k_k"] = L["k_k"]
            out[b + "attn.k_a"] = L["k_a"]
            out[b + "attn.r_k"] = L["r_k"]
            out[b + "attn.r_proj.weight"] = L["Wr"]
            out[b + "attn.k_proj.weight"] = L["Wk"]
            out[b + "attn.v_proj.weight"] = L["Wv"]
            out[b + "attn.o_proj.weight"] = L["Wo"]
            for short, lo in (("w", "w"), ("a", "a"), ("v", "v")):
                if short + "0" not in L:
                    continue
                out[b + "attn.%s_lora.lora.0.weight" % lo] = L[short + "1"].T
                out[b + "attn.%s_lora.lora.2.weight" % lo] = L[short + "2"].T
                out[b + "attn.%s_lora.lora.2.bias" % lo] = L[short + "0"]
            out[b + "attn.g_lora.lora.0.weight"] = L["g1"].T
            out[b + "attn.g_lora.lora.2.weight"] = L["g2"].T
            out[b + "attn.g_norm.weight"] = L["lnx_w"]
            out[b + "attn.g_norm.bias"] = L["lnx_b"]
            out[b + "ffn.x_k"] = L["ffn_x_k"]
            out[b + "ffn.key.weight"] = L["ffn_key"]
            out[b + "ffn.value.weight"] = L["ffn_value"]
        out["model.norm.weight"] = p["ln_out_w"]
        out["model.norm.bias"] = p["ln_out_b"]
        if p["head"] is not p["emb"]:  # tied: transformers ties lm_head to the embedding
            out["lm_head.weight"] = p["head"]
    else:
        raise ValueError("unknown convention %r" % convention)
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


# ---------------------------------------------------------------------------
# writers


def write_safetensors(path, named, dtype, metadata=None):
    """Writes named arrays as one safetensors file (data 8-byte aligned)."""
    header = {}
    blobs = []
    off = 0
    for name, arr in named.items():
        raw = encode(arr, dtype)
        header[name] = {"dtype": ST_DTYPE[dtype], "shape": list(arr.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def write_sharded(dirpath, named, dtype, nshards=2):
    names = list(named.keys())
    total = sum(named[n].size for n in names)
    shards = [dict() for _ in range(nshards)]
    acc = 0
    for n in names:
        idx = min(nshards - 1, acc * nshards // max(total, 1))
        shards[idx][n] = named[n]
        acc += named[n].size
    weight_map = {}
    for i, sh in enumerate(shards):
        fn = "model-%05d-of-%05d.safetensors" % (i + 1, nshards)
        write_safetensors(os.path.join(dirpath, fn), sh, dtype, {"format": "pt"})
        for n in sh:
            weight_map[n] = fn
    esz = {"f32": 4, "bf16": 2, "f16": 2}[dtype]
    idx = {"metadata": {"total_size": total * esz}, "weight_map": weight_map}
    with open(os.path.join(dirpath, "model.safetensors.index.json"), "w") as f:
        json.dump(idx, f, indent=2)


def write_pth(path, named, dtype):
    import torch
    tdt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    d = {}
    for n, a in named.items():
        d[n] = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(tdt).contiguous()
    tmp = path + ".tmp"
    torch.save(d, tmp)
    os.replace(tmp, path)


def write_config(dirpath, cfg):
    C = cfg["embd"]
    conf = {
        "architectures": ["RWKV7ForCausalLM"],
        "model_type": "rwkv7",
        "hidden_size": C,
        "num_hidden_layers": cfg["layers"],
        "head_dim": cfg["head_size"],
        "num_heads": C // cfg["head_size"],
        "intermediate_size": cfg["ffn"],
        "vocab_size": cfg["vocab"],
        "decay_low_rank_dim": cfg["lora_w"],
        "a_low_rank_dim": cfg["lora_a"],
        "v_low_rank_dim": cfg["lora_v"],
        "gate_low_rank_dim": cfg["lora_g"],
        "norm_eps": cfg.get("norm_eps", 1e-5),
        "hidden_act": "sqrelu",
        "torch_dtype": {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[cfg["dtype"]],
        "tie_word_embeddings": bool(cfg.get("tied", False)),
    }
    with open(os.path.join(dirpath, "config.json"), "w") as f:
        json.dump(conf, f, indent=2)


# ---------------------------------------------------------------------------
# vocab

_WORDS = (
    "the of and to in is was for that on as with by he it at from his an "
    "were are which this be or has had not but first one their its new after "
    "who they have her she two been other when there all during into school "
    "time may years more most only over city some world would where later up "
    "such used many can state about national out known university united then "
    "made no you we what so if do like just people think good very see make "
    "hello model state token water light house story small large great little"
).split()


def vocab_tokens(nv):
    """Exactly nv tokens (bytes) for ids 1..nv: single bytes first, then
    words, pieces and a few multi-byte UTF-8 strings, all distinct."""
    toks = [bytes([i]) for i in range(min(nv, 256))]
    seen = set(toks)

    def add(b):
        if len(toks) < nv and b not in seen:
            seen.add(b)
            toks.append(b)

    extra = ["\n\n", ". ", ", ", "'s", " '", "\"", "é", "ü", "中文", "日本", "→",
             "—", " über", "😀"]
    for s in extra:
        add(s.encode())
    add(b"\xe4\xb8")  # a partial UTF-8 sequence: written as a bytes literal
    add(b"\xff\xfe")
    for w in _WORDS:
        add((" " + w).encode())
        add(w.encode())
        add((" " + w.capitalize()).encode())
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    for a in letters:
        for b in letters:
            add((a + b).encode())
            add((" " + a + b).encode())
    n = 0
    while len(toks) < nv:
        a, b, c = letters[n % 26], letters[(n // 26) % 26], letters[(n // 676) % 26]
        add((a + b + c + ("s" * (n // 17576))).encode())
        n += 1
    return toks


def token_literal(b):
    """The literal the World vocab file uses for token bytes b."""
    try:
        s = b.decode("utf-8")
        return repr(s)
    except UnicodeDecodeError:
        return repr(b)


def write_vocab(path, vocab_size):
    toks = vocab_tokens(max(vocab_size - 1, 0))
    with open(path, "w", encoding="utf-8") as f:
        for i, b in enumerate(toks):
            f.write("%d %s %d\n" % (i + 1, token_literal(b), len(b)))


# ---------------------------------------------------------------------------


def write_model(out, cfg, named=None):
    """Writes a full model dir for cfg. named overrides the tensors (tests use
    it to corrupt a shape). Returns (params, named)."""
    os.makedirs(out, exist_ok=True)
    p = None
    if named is None:
        p = make_params(cfg)
        named = to_named(p, cfg["convention"])
    fmt, conv, dt = cfg["format"], cfg["convention"], cfg["dtype"]
    if fmt == "pth":
        write_pth(os.path.join(out, "rwkv7-test.pth"), named, dt)
    elif fmt == "sharded":
        write_sharded(out, named, dt)
    elif fmt == "safetensors":
        fn = "model.safetensors" if conv == "hf" else "rwkv7-test.safetensors"
        write_safetensors(os.path.join(out, fn), named, dt, {"format": "pt"})
    else:
        raise ValueError("unknown format %r" % fmt)
    if conv == "hf":
        write_config(out, cfg)
    write_vocab(os.path.join(out, "rwkv_vocab_v20230424.txt"), cfg["vocab"])
    return p, named


def main(argv=None):
    ap = argparse.ArgumentParser(description="write a small random RWKV-7 model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--head-size", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=300)
    ap.add_argument("--lora-w", type=int, default=16)
    ap.add_argument("--lora-a", type=int, default=16)
    ap.add_argument("--lora-v", type=int, default=8)
    ap.add_argument("--lora-g", type=int, default=32)
    ap.add_argument("--convention", choices=("hf", "blink"), default="hf")
    ap.add_argument("--dtype", choices=DTYPES, default="f32")
    ap.add_argument("--format", choices=("safetensors", "pth", "sharded"), default="safetensors")
    ap.add_argument("--layer0-v", choices=("yes", "no"), default="no")
    ap.add_argument("--tied", action="store_true",
                    help="HF only: no lm_head.weight, tie_word_embeddings true")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    # the layouts the loader accepts: HF = config.json + model.safetensors
    # (or an index + shards); BlinkDL = one *.safetensors or *.pth
    if a.format == "sharded" and a.convention != "hf":
        ap.error("--format sharded needs --convention hf")
    if a.format == "pth" and a.convention != "blink":
        ap.error("--format pth needs --convention blink")
    cfg = default_cfg(layers=a.layers, embd=a.embd, head_size=a.head_size, ffn=a.ffn,
                      vocab=a.vocab, lora_w=a.lora_w, lora_a=a.lora_a, lora_v=a.lora_v,
                      lora_g=a.lora_g, convention=a.convention, dtype=a.dtype,
                      format=a.format, layer0_v=(a.layer0_v == "yes"), tied=a.tied,
                      seed=a.seed)
    write_model(a.out, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
