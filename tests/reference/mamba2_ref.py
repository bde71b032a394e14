#!/usr/bin/python3
"""Independent numpy reference for the Mamba2 forward pass.

Written from the math (the Mamba-2 paper's recurrent form, written out
below; slot layout in docs/FAMILIES.md, "Slot layouts"), not from the C
backend: float64 throughout, one token at a time, the sequential scan.
Weights are read exactly as stored (F32, F16 and BF16 widen without
rounding), so a backend computing in fp32 on the same weights should agree
to ~1e-6 relative.

Per layer, with x the residual stream:
  x += mixer(rmsnorm(x) * norm.weight)
  mixer(u):
    z | xBC | dt_raw = in_proj u             ([d_inner], [conv_dim], [H])
    xBC = silu(conv_b + sum_k conv_w[:, k] * xBC_{t-K+1+k})   (causal, depthwise)
    xs [H, P] | B [G, N] | C [G, N] = xBC
    dt = softplus(dt_raw + dt_bias)            (torch's: x > 20 -> x)
    per head h, group g = h // (H / G):
      S_h = S_h * exp(dt_h * A_h) + dt_h * xs_h (outer) B_g, A_h = -exp(A_log_h)
      y_h = S_h C_g + D_h * xs_h
    y = rmsnorm_per_group(y * silu(z)) * norm.weight   (groups of d_inner / G)
    out_proj y
then logits = lm_head (rmsnorm(x) * norm_f.weight), lm_head tied to the
embedding when the checkpoint has none.

State per layer (one slot): conv [conv_dim, K-1] = the last K-1 xBC inputs,
oldest first; ssm [H, P, N].

The checkpoint: a model dir with config.json and model.safetensors (or an
index + shards), names of Hugging Face transformers (backbone.embeddings,
lm_head) or mamba_ssm (backbone.embedding, tied). Dimensions come from the
tensor shapes; config.json supplies n_groups (ngroups in ssm_cfg) and the
RMSNorm epsilon.

CLI:
  mamba2_ref.py --model DIR --tokens 1,2,3 [--logits-out F] [--generate N]
--logits-out writes float32 little-endian, one row of V floats per input
position (the wkvm-infer format); --generate prints the N greedy ids that
follow the prompt on one stdout line.
"""

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from rwkv7_ref import read_checkpoint, read_logits, write_logits  # noqa: E402,F401

SOFTPLUS_THRESHOLD = 20.0


def _softplus(x):
    return np.where(x > SOFTPLUS_THRESHOLD, x,
                    np.log1p(np.exp(np.minimum(x, SOFTPLUS_THRESHOLD))))


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean() + eps) * w


def read_config(path):
    """(n_groups, eps) from path/config.json (either convention); defaults 1, 1e-5."""
    cfgp = os.path.join(path, "config.json") if os.path.isdir(path) else None
    if cfgp is None or not os.path.isfile(cfgp):
        return 1, 1e-5
    with open(cfgp) as f:
        c = json.load(f)
    sub = c.get("ssm_cfg") or {}
    G = c.get("n_groups", sub.get("ngroups", 1))
    eps = c.get("layer_norm_epsilon", c.get("norm_epsilon", 1e-5))
    if c.get("norm_before_gate", sub.get("norm_before_gate", False)):
        raise ValueError("norm_before_gate = true is not the Mamba2 this reference computes")
    return int(G), float(eps)


class State:
    def __init__(self, n_layer, conv_dim, K, H, P, N):
        self.conv = np.zeros((n_layer, conv_dim, K - 1))
        self.ssm = np.zeros((n_layer, H, P, N))

    def copy(self):
        s = State.__new__(State)
        s.conv = self.conv.copy()
        s.ssm = self.ssm.copy()
        return s


class Mamba2:
    def __init__(self, named, n_groups=1, eps=1e-5):
        if "backbone.embeddings.weight" in named:
            self.emb = named["backbone.embeddings.weight"]
        elif "backbone.embedding.weight" in named:
            self.emb = named["backbone.embedding.weight"]
        else:
            raise KeyError("no backbone.embeddings.weight / backbone.embedding.weight")
        self.head = named.get("lm_head.weight", self.emb)
        self.norm_f = named["backbone.norm_f.weight"].reshape(-1)
        self.V, self.C = self.emb.shape
        self.eps = eps
        self.G = n_groups
        self.layers = []
        i = 0
        while "backbone.layers.%d.norm.weight" % i in named:
            b = "backbone.layers.%d." % i
            m = b + "mixer."
            L = {"norm": named[b + "norm.weight"].reshape(-1),
                 "in_proj": named[m + "in_proj.weight"],
                 "conv_w": named[m + "conv1d.weight"],
                 "conv_b": named[m + "conv1d.bias"].reshape(-1),
                 "dt_bias": named[m + "dt_bias"].reshape(-1),
                 "A": -np.exp(named[m + "A_log"].reshape(-1)),
                 "D": named[m + "D"].reshape(-1),
                 "gnorm": named[m + "norm.weight"].reshape(-1),
                 "out_proj": named[m + "out_proj.weight"]}
            self.layers.append(L)
            i += 1
        if not self.layers:
            raise ValueError("no layers")
        L0 = self.layers[0]
        self.H = L0["A"].shape[0]
        self.d_inner = L0["out_proj"].shape[1]
        self.P = self.d_inner // self.H
        self.conv_dim, _, self.K = L0["conv_w"].shape
        self.N = (self.conv_dim - self.d_inner) // (2 * self.G)
        d_in = 2 * self.d_inner + 2 * self.G * self.N + self.H
        for j, L in enumerate(self.layers):
            if L["in_proj"].shape != (d_in, self.C):
                raise ValueError("layer %d in_proj shape %s, expected %s"
                                 % (j, L["in_proj"].shape, (d_in, self.C)))
            if L["conv_w"].shape != (self.conv_dim, 1, self.K):
                raise ValueError("layer %d conv1d shape %s" % (j, L["conv_w"].shape))
        if self.P * self.H != self.d_inner or self.H % self.G:
            raise ValueError("inconsistent head / group sizes")
        self.n_layer = len(self.layers)

    @classmethod
    def load(cls, path):
        G, eps = read_config(path)
        return cls(read_checkpoint(path), n_groups=G, eps=eps)

    def new_state(self):
        return State(self.n_layer, self.conv_dim, self.K, self.H, self.P, self.N)

    def _mixer(self, i, L, u, st):
        di, G, N, H, P, K = self.d_inner, self.G, self.N, self.H, self.P, self.K
        proj = L["in_proj"] @ u
        z = proj[:di]
        xbc_in = proj[di:di + self.conv_dim]
        dt_raw = proj[di + self.conv_dim:]
        window = np.concatenate([st.conv[i], xbc_in[:, None]], axis=1)  # [conv_dim, K]
        st.conv[i] = window[:, 1:]
        xbc = _silu(L["conv_b"] + (window * L["conv_w"][:, 0, :]).sum(axis=1))
        xs = xbc[:di].reshape(H, P)
        B = xbc[di:di + G * N].reshape(G, N)
        Cm = xbc[di + G * N:].reshape(G, N)
        dt = _softplus(dt_raw + L["dt_bias"])
        hpg = H // G
        y = np.zeros((H, P))
        for h in range(H):
            g = h // hpg
            S = st.ssm[i, h] * np.exp(dt[h] * L["A"][h]) + dt[h] * np.outer(xs[h], B[g])
            st.ssm[i, h] = S
            y[h] = S @ Cm[g] + L["D"][h] * xs[h]
        y = y.reshape(-1) * _silu(z)
        gs = di // G
        yn = np.concatenate([_rms(y[g * gs:(g + 1) * gs], L["gnorm"][g * gs:(g + 1) * gs],
                                  self.eps) for g in range(G)])
        return L["out_proj"] @ yn

    def step(self, token, st):
        """One token; updates st in place; returns logits [V] (float64)."""
        if not (0 <= token < self.V):
            raise ValueError("token %d out of range (vocab %d)" % (token, self.V))
        x = self.emb[token].astype(np.float64)
        for i, L in enumerate(self.layers):
            x = x + self._mixer(i, L, _rms(x, L["norm"], self.eps), st)
        return self.head @ _rms(x, self.norm_f, self.eps)

    def forward(self, tokens, state=None):
        """Runs tokens from state (zeros when None; not modified).
        Returns (logits [T, V], final state)."""
        st = self.new_state() if state is None else state.copy()
        out = np.zeros((len(tokens), self.V))
        for t, tok in enumerate(tokens):
            out[t] = self.step(int(tok), st)
        return out, st

    def generate(self, tokens, n, state=None):
        """Greedy: the n ids that follow tokens (argmax, lowest id on ties).
        Returns (ids, prompt logits [T, V], final state)."""
        logits, st = self.forward(tokens, state)
        ids = []
        last = logits[-1]
        for _ in range(n):
            nxt = int(np.argmax(last))
            ids.append(nxt)
            last = self.step(nxt, st)
        return ids, logits, st


def main(argv=None):
    ap = argparse.ArgumentParser(description="numpy float64 Mamba2 reference")
    ap.add_argument("--model", required=True, help="model dir")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--logits-out", help="float32 LE logits, one row per input position")
    ap.add_argument("--generate", type=int, default=0, help="print N greedy ids")
    a = ap.parse_args(argv)
    toks = [int(t) for t in a.tokens.replace(" ", "").split(",") if t != ""]
    if not toks:
        ap.error("--tokens is empty")
    m = Mamba2.load(a.model)
    ids, logits, _ = m.generate(toks, a.generate)
    if a.logits_out:
        write_logits(a.logits_out, logits)
    if a.generate:
        print(" ".join(str(i) for i in ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
