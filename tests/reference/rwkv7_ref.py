#!/usr/bin/python3
"""Independent numpy reference for the RWKV-7 ("x070") forward pass.

Written from the math of BlinkDL's x070 reference model (RWKV-LM, RWKV-v7),
written out below, not from the C backend. All arithmetic is float64;
weights are read exactly as stored (F32, F16, BF16 are widened without
rounding), so a backend that computes in fp32 on the same stored weights
should match to ~1e-6 relative.

Per token (LN = LayerNorm, x the residual stream, x = LN0(emb[token]) first):
  time mix of layer i: a = LN1(x); xx = att_shift - a; att_shift = a
    x_* = a + xx * mu_*   for * in r, w, k, v, a, g
    r, k, v = Wr x_r, Wk x_k, Wv x_v
    w = exp(-e^-0.5 sigmoid(w0 + tanh(x_w w1) w2))      (per-channel decay)
    iclr = sigmoid(a0 + x_a a1 a2);  g = sigmoid(x_g g1) g2
    kk = L2-normalise per head (k * k_k);  k = k * (1 + (iclr - 1) k_a)
    layer 0: v_first = v; later: v += (v_first - v) sigmoid(v0 + x_v v1 v2)
    per head, S [N v, N k]:  S = S diag(w) + (S (-kk)) (kk * iclr)^T + v k^T
    y = GroupNorm_head(S r) * lnx_w + lnx_b + (sum(r * k * r_k) per head) v
    x = x + Wo (y * g)
  channel mix: b = LN2(x); kx = b + (ffn_shift - b) ffn_x_k; ffn_shift = b
    x = x + ffn_value relu(ffn_key kx)^2
then logits = head LN_out(x).

Loads a model directory in any layout the worker accepts:
  - Hugging Face (fla rwkv7): config.json + model.safetensors, or
    model.safetensors.index.json + shards;
  - BlinkDL: one *.safetensors or *.pth with blocks.* names.
Safetensors are parsed here with numpy (8-byte length, JSON header, raw LE
data); .pth goes through torch.load. Both name conventions are mapped to one
internal form (BlinkDL orientation, vectors flattened).

State per layer (what a slot holds): att_shift [C], ffn_shift [C],
wkv [H, N, N] float64 laid out S[h, v_index, k_index] (the slot layout of
workerd/backend/be.h and docs/STATE_FORMAT.md).

CLI:
  rwkv7_ref.py --model DIR --tokens 1,2,3 [--logits-out F] [--generate N]
               [--state-out F.npz]
--logits-out writes float32 little-endian, one row of V floats per input
position (the wkvm-infer format). --generate prints the N greedy ids that
follow the prompt, space separated, on one stdout line (as wkvm-infer).
"""

import argparse
import glob
import json
import os
import struct
import sys

import numpy as np

LN_EPS = 1e-5       # LayerNorm eps: BlinkDL; HF config.json norm_eps (default 1e-5)
BLINK_GN_EPS = 64e-5  # BlinkDL GroupNorm eps, any head size (1e-5 * head_size_divisor 8 ** 2)
# HF (fla rwkv7) GroupNorm (g_norm) eps: head_dim * norm_eps

# ---------------------------------------------------------------------------
# checkpoint reading


def _st_decode(dtype, raw, shape, name):
    if dtype == "F32":
        a = np.frombuffer(raw, dtype="<f4").astype(np.float64)
    elif dtype == "F16":
        a = np.frombuffer(raw, dtype="<f2").astype(np.float64)
    elif dtype == "BF16":
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        a = u.view(np.float32).astype(np.float64)
    else:
        raise ValueError("%s: unsupported dtype %s" % (name, dtype))
    n = int(np.prod(shape)) if len(shape) else 1
    if a.size != n:
        raise ValueError("%s: %d elements for shape %s" % (name, a.size, shape))
    return a.reshape(shape)


def read_safetensors(path):
    """Returns {name: float64 array} for one .safetensors file."""
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise ValueError("%s: too short" % path)
    (hlen,) = struct.unpack("<Q", buf[:8])
    if 8 + hlen > len(buf):
        raise ValueError("%s: header length past end of file" % path)
    header = json.loads(buf[8:8 + hlen].decode("utf-8"))
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        if not (0 <= b <= e <= len(buf) - base):
            raise ValueError("%s: %s: data offsets out of range" % (path, name))
        out[name] = _st_decode(info["dtype"], buf[base + b:base + e], list(info["shape"]), name)
    return out


def read_pth(path):
    import torch
    sd = torch.load(path, map_location="cpu")
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    out = {}
    for name, t in sd.items():
        if hasattr(t, "float"):
            out[name] = t.detach().float().numpy().astype(np.float64)
    return out


def find_checkpoint(path):
    """Returns the list of checkpoint files for a model dir (or file)."""
    if os.path.isfile(path):
        if path.endswith(".index.json"):
            with open(path) as f:
                idx = json.load(f)
            d = os.path.dirname(path)
            return [os.path.join(d, s) for s in sorted(set(idx["weight_map"].values()))]
        return [path]
    idx = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(idx):
        return find_checkpoint(idx)
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    cands = sorted(glob.glob(os.path.join(path, "*.safetensors")) +
                   glob.glob(os.path.join(path, "*.pth")))
    if len(cands) != 1:
        raise ValueError("%s: expected one checkpoint, found %d" % (path, len(cands)))
    return cands


def read_checkpoint(path):
    named = {}
    for fn in find_checkpoint(path):
        part = read_pth(fn) if fn.endswith((".pth", ".pt")) else read_safetensors(fn)
        for k in part:
            if k in named:
                raise ValueError("%s: duplicate tensor %s" % (fn, k))
        named.update(part)
    return named


# ---------------------------------------------------------------------------
# name mapping -> internal form


def _need(named, name):
    if name not in named:
        raise KeyError("missing tensor %s" % name)
    return named[name]


def to_internal(named, config=None):
    """Maps either convention to the internal dict (see gen_model.make_params),
    plus "convention", "ln_eps" and "gn_eps" (see above); config is the HF
    config.json as a dict (None when absent). An HF head is tied to the
    embedding when config says tie_word_embeddings (without config.json: when
    lm_head.weight is absent), as transformers does."""
    flat = lambda a: np.asarray(a).reshape(-1)
    p = {"layers": []}
    if "emb.weight" in named:
        g = lambda n: _need(named, n)
        p["emb"] = g("emb.weight")
        p["ln0_w"], p["ln0_b"] = g("blocks.0.ln0.weight"), g("blocks.0.ln0.bias")
        p["ln_out_w"], p["ln_out_b"] = g("ln_out.weight"), g("ln_out.bias")
        p["head"] = g("head.weight")
        p["convention"], p["ln_eps"], p["gn_eps"] = "blink", LN_EPS, BLINK_GN_EPS
        i = 0
        while "blocks.%d.ln1.weight" % i in named:
            b = "blocks.%d." % i
            L = {"ln1_w": g(b + "ln1.weight"), "ln1_b": g(b + "ln1.bias"),
                 "ln2_w": g(b + "ln2.weight"), "ln2_b": g(b + "ln2.bias")}
            for nm in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "w0", "a0", "k_k", "k_a"):
                L[nm] = flat(g(b + "att." + nm))
            for nm in ("w1", "w2", "a1", "a2", "g1", "g2", "r_k"):
                L[nm] = g(b + "att." + nm)
            if i > 0:
                L["v0"] = flat(g(b + "att.v0"))
                L["v1"], L["v2"] = g(b + "att.v1"), g(b + "att.v2")
            L["Wr"] = g(b + "att.receptance.weight")
            L["Wk"] = g(b + "att.key.weight")
            L["Wv"] = g(b + "att.value.weight")
            L["Wo"] = g(b + "att.output.weight")
            L["lnx_w"], L["lnx_b"] = g(b + "att.ln_x.weight"), g(b + "att.ln_x.bias")
            L["ffn_x_k"] = flat(g(b + "ffn.x_k"))
            L["ffn_key"] = g(b + "ffn.key.weight")
            L["ffn_value"] = g(b + "ffn.value.weight")
            p["layers"].append(L)
            i += 1
    elif "model.embeddings.weight" in named:
        g = lambda n: _need(named, n)
        p["emb"] = g("model.embeddings.weight")
        p["ln0_w"] = g("model.layers.0.pre_norm.weight")
        p["ln0_b"] = g("model.layers.0.pre_norm.bias")
        p["ln_out_w"], p["ln_out_b"] = g("model.norm.weight"), g("model.norm.bias")
        tied = (config or {}).get("tie_word_embeddings",
                                  config is None and "lm_head.weight" not in named)
        if tied and "lm_head.weight" in named:
            raise ValueError("lm_head.weight present but tie_word_embeddings is true")
        p["head"] = p["emb"] if tied else g("lm_head.weight")
        p["convention"], p["tied"] = "hf", bool(tied)
        p["ln_eps"] = float((config or {}).get("norm_eps", LN_EPS))
        i = 0
        while "model.layers.%d.attn_norm.weight" % i in named:
            b = "model.layers.%d." % i
            L = {"ln1_w": g(b + "attn_norm.weight"), "ln1_b": g(b + "attn_norm.bias"),
                 "ln2_w": g(b + "ffn_norm.weight"), "ln2_b": g(b + "ffn_norm.bias")}
            for nm in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "k_k", "k_a"):
                L[nm] = flat(g(b + "attn." + nm))
            L["r_k"] = g(b + "attn.r_k")
            lora = ("w", "a", "v") if i > 0 else ("w", "a")
            for s in lora:
                L[s + "1"] = g(b + "attn.%s_lora.lora.0.weight" % s).T
                L[s + "2"] = g(b + "attn.%s_lora.lora.2.weight" % s).T
                L[s + "0"] = flat(g(b + "attn.%s_lora.lora.2.bias" % s))
            L["g1"] = g(b + "attn.g_lora.lora.0.weight").T
            L["g2"] = g(b + "attn.g_lora.lora.2.weight").T
            L["Wr"] = g(b + "attn.r_proj.weight")
            L["Wk"] = g(b + "attn.k_proj.weight")
            L["Wv"] = g(b + "attn.v_proj.weight")
            L["Wo"] = g(b + "attn.o_proj.weight")
            L["lnx_w"], L["lnx_b"] = g(b + "attn.g_norm.weight"), g(b + "attn.g_norm.bias")
            L["ffn_x_k"] = flat(g(b + "ffn.x_k"))
            L["ffn_key"] = g(b + "ffn.key.weight")
            L["ffn_value"] = g(b + "ffn.value.weight")
            p["layers"].append(L)
            i += 1
    else:
        raise ValueError("unknown checkpoint convention (no emb.weight or model.embeddings.weight)")
    if not p["layers"]:
        raise ValueError("no layers found")
    if p["convention"] == "hf":
        p["gn_eps"] = p["layers"][0]["r_k"].shape[1] * p["ln_eps"]
    return p


def read_config(path):
    """config.json beside the checkpoint as a dict, None when there is none."""
    d = path if os.path.isdir(path) else os.path.dirname(path)
    fn = os.path.join(d, "config.json")
    if not os.path.isfile(fn):
        return None
    with open(fn) as f:
        return json.load(f)


# ---------------------------------------------------------------------------
# the model


def _ln(x, w, b, eps=LN_EPS):
    mu = x.mean()
    var = ((x - mu) ** 2).mean()
    return (x - mu) / np.sqrt(var + eps) * w + b


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


class State:
    """One slot's recurrent state (float64)."""

    def __init__(self, n_layer, C, H, N):
        self.att_shift = np.zeros((n_layer, C))
        self.ffn_shift = np.zeros((n_layer, C))
        self.wkv = np.zeros((n_layer, H, N, N))  # [layer, head, v, k]

    def copy(self):
        s = State.__new__(State)
        s.att_shift = self.att_shift.copy()
        s.ffn_shift = self.ffn_shift.copy()
        s.wkv = self.wkv.copy()
        return s


class RWKV7:
    def __init__(self, params, gn_eps=None, ln_eps=None):
        """gn_eps / ln_eps override the checkpoint's (see to_internal); params
        without them (gen_model.make_params) get BlinkDL's."""
        self.p = params
        self.V, self.C = params["emb"].shape
        self.H, self.N = params["layers"][0]["r_k"].shape
        self.n_layer = len(params["layers"])
        self.gn_eps = gn_eps if gn_eps is not None else params.get("gn_eps", BLINK_GN_EPS)
        self.ln_eps = ln_eps if ln_eps is not None else params.get("ln_eps", LN_EPS)
        self._check()

    def _check(self):
        C, H, N, V = self.C, self.H, self.N, self.V
        if H * N != C:
            raise ValueError("r_k shape %s does not match C=%d" % ((H, N), C))
        p = self.p
        for nm, shp in (("head", (V, C)), ("ln0_w", (C,)), ("ln_out_w", (C,))):
            if p[nm].shape != shp:
                raise ValueError("%s: shape %s, expected %s" % (nm, p[nm].shape, shp))
        for i, L in enumerate(p["layers"]):
            F = L["ffn_key"].shape[0]
            for nm, shp in (("Wr", (C, C)), ("Wk", (C, C)), ("Wv", (C, C)), ("Wo", (C, C)),
                            ("ffn_key", (F, C)), ("ffn_value", (C, F)), ("r_k", (H, N)),
                            ("lnx_w", (C,)), ("k_k", (C,)), ("k_a", (C,))):
                if L[nm].shape != shp:
                    raise ValueError("layer %d %s: shape %s, expected %s"
                                     % (i, nm, L[nm].shape, shp))

    @classmethod
    def load(cls, path, **kw):
        return cls(to_internal(read_checkpoint(path), read_config(path)), **kw)

    def new_state(self):
        return State(self.n_layer, self.C, self.H, self.N)

    def _att(self, i, L, x, st, v_first):
        H, N = self.H, self.N
        a = _ln(x, L["ln1_w"], L["ln1_b"], self.ln_eps)
        xx = st.att_shift[i] - a
        st.att_shift[i] = a
        xr, xw, xk = a + xx * L["x_r"], a + xx * L["x_w"], a + xx * L["x_k"]
        xv, xa, xg = a + xx * L["x_v"], a + xx * L["x_a"], a + xx * L["x_g"]
        r = L["Wr"] @ xr
        k = L["Wk"] @ xk
        v = L["Wv"] @ xv
        w = np.exp(-np.exp(-0.5) * _sigmoid(L["w0"] + np.tanh(xw @ L["w1"]) @ L["w2"]))
        iclr = _sigmoid(L["a0"] + (xa @ L["a1"]) @ L["a2"])
        g = _sigmoid(xg @ L["g1"]) @ L["g2"]
        kk = (k * L["k_k"]).reshape(H, N)
        kk = kk / np.maximum(np.sqrt((kk * kk).sum(axis=1, keepdims=True)), 1e-12)
        k = k * (1.0 + (iclr - 1.0) * L["k_a"])
        if i == 0:
            v_first = v
        else:
            v = v + (v_first - v) * _sigmoid(L["v0"] + (xv @ L["v1"]) @ L["v2"])
        rh, kh, vh = r.reshape(H, N), k.reshape(H, N), v.reshape(H, N)
        wh, ah = w.reshape(H, N), iclr.reshape(H, N)
        S = st.wkv[i]
        sa = np.einsum("hvk,hk->hv", S, -kk)  # S (-kk)
        S = (S * wh[:, None, :] + sa[:, :, None] * (kk * ah)[:, None, :]
             + vh[:, :, None] * kh[:, None, :])
        st.wkv[i] = S
        y = np.einsum("hvk,hk->hv", S, rh)
        mu = y.mean(axis=1, keepdims=True)
        var = ((y - mu) ** 2).mean(axis=1, keepdims=True)
        y = ((y - mu) / np.sqrt(var + self.gn_eps)).reshape(-1) * L["lnx_w"] + L["lnx_b"]
        bonus = (rh * kh * L["r_k"]).sum(axis=1, keepdims=True) * vh
        y = y + bonus.reshape(-1)
        return x + L["Wo"] @ (y * g), v_first

    def _ffn(self, i, L, x, st):
        b = _ln(x, L["ln2_w"], L["ln2_b"], self.ln_eps)
        kx = b + (st.ffn_shift[i] - b) * L["ffn_x_k"]
        st.ffn_shift[i] = b
        h = np.maximum(L["ffn_key"] @ kx, 0.0) ** 2
        return x + L["ffn_value"] @ h

    def step(self, token, st):
        """One token; updates st in place; returns logits [V] (float64)."""
        p = self.p
        if not (0 <= token < self.V):
            raise ValueError("token %d out of range (vocab %d)" % (token, self.V))
        x = _ln(p["emb"][token], p["ln0_w"], p["ln0_b"], self.ln_eps)
        v_first = None
        for i, L in enumerate(p["layers"]):
            x, v_first = self._att(i, L, x, st, v_first)
            x = self._ffn(i, L, x, st)
        x = _ln(x, p["ln_out_w"], p["ln_out_b"], self.ln_eps)
        return p["head"] @ x

    def forward(self, tokens, state=None):
        """Runs tokens from state (a new zero state when None; not modified).
        Returns (logits [T, V] float64, final state)."""
        st = self.new_state() if state is None else state.copy()
        out = np.zeros((len(tokens), self.V))
        for t, tok in enumerate(tokens):
            out[t] = self.step(int(tok), st)
        return out, st

    def generate(self, tokens, n, state=None):
        """Greedy: the n ids that follow tokens (argmax, lowest id on ties).
        Returns (ids, logits of the prompt [T, V], final state)."""
        logits, st = self.forward(tokens, state)
        ids = []
        last = logits[-1]
        for _ in range(n):
            nxt = int(np.argmax(last))
            ids.append(nxt)
            last = self.step(nxt, st)
        return ids, logits, st


def write_logits(path, logits):
    np.ascontiguousarray(logits, dtype="<f4").tofile(path)


def read_logits(path, vocab):
    a = np.fromfile(path, dtype="<f4")
    if a.size % vocab != 0:
        raise ValueError("%s: %d floats is not a multiple of vocab %d" % (path, a.size, vocab))
    return a.reshape(-1, vocab).astype(np.float64)


def main(argv=None):
    ap = argparse.ArgumentParser(description="numpy float64 RWKV-7 reference")
    ap.add_argument("--model", required=True, help="model dir or checkpoint file")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--logits-out", help="float32 LE logits, one row per input position")
    ap.add_argument("--generate", type=int, default=0, help="print N greedy ids")
    ap.add_argument("--state-out", help="write the final state (.npz)")
    ap.add_argument("--gn-eps", type=float, default=None,
                    help="GroupNorm eps (default: the checkpoint's; BlinkDL 64e-5, HF head_dim * norm_eps)")
    a = ap.parse_args(argv)
    toks = [int(t) for t in a.tokens.replace(" ", "").split(",") if t != ""]
    if not toks:
        ap.error("--tokens is empty")
    m = RWKV7.load(a.model, gn_eps=a.gn_eps)
    ids, logits, st = m.generate(toks, a.generate)
    if a.logits_out:
        write_logits(a.logits_out, logits)
    if a.state_out:
        np.savez(a.state_out, att_shift=st.att_shift, ffn_shift=st.ffn_shift, wkv=st.wkv)
    if a.generate:
        print(" ".join(str(i) for i in ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
