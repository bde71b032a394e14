#!/usr/bin/python3
"""Independent numpy reference for the Gated DeltaNet (fla `gated_deltanet`) forward.

Written from the math (the fla model's definition, written out below; slot
layout in docs/FAMILIES.md, "Slot layouts"), not from the C backend: float64
throughout, one token at a time, weights read exactly as stored (F32 / F16 /
BF16 widen without rounding), so a backend computing in fp32 on the same
weights matches to ~1e-6 relative.

Per token, per layer (RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w):
  h = RMSNorm(x)
  q, k, v = SiLU(causal depthwise conv_W(q_proj h | k_proj h | v_proj h))
  q, k L2-normalised per head: x / sqrt(sum(x^2) + 1e-6)
  beta = sigmoid(b_proj h)            (x2 when allow_neg_eigval)
  g = -exp(A_log) * softplus(a_proj h + dt_bias)   per value head
  per value head j (key head i = j // (HV / H)), state S_j [K, Vd]:
    S = S * exp(g);  u = beta (v - S^T k);  S = S + k u^T;  o = S^T (q K^-0.5)
  o = RMSNorm_head(o) * o_norm.weight * SiLU(g_proj h)   (no gate: plain norm)
  x = x + o_proj o
  x = x + down(SiLU(gate(RMSNorm(x))) * up(RMSNorm(x)))
then the final RMSNorm and lm_head (the embedding when tied).

State per layer (what a slot holds): q_conv [W-1, KD], k_conv [W-1, KD],
v_conv [W-1, VD] (the last W-1 projection outputs, oldest first) and
S [HV, K, Vd].

Hybrid models (config.json "attn": {layers, num_heads, num_kv_heads,
qkv_bias, qk_norm, rope_theta}, fla's Attention in the listed layers), per
token at absolute position p (the tokens seen before it):
  h = RMSNorm(x); q = q_proj h (+ bias), k, v likewise, split in heads of
  Da = q rows / num_heads; with qk_norm q, k = RMSNorm_head(.) * w (eps 1e-5)
  RoPE, rotate-half (GPT-NeoX): for i < Da/2, f_i = theta^(-2i/Da), a = p f_i
    (x_i, x_{i+Da/2}) -> (x_i cos a - x_{i+Da/2} sin a, x_i sin a + x_{i+Da/2} cos a)
  append k, v to the layer's cache; query head j reads KV head j // (Hq/Hkv)
  o_j = softmax_t(q_j . k_t / sqrt(Da)) v_t over t = 0..p
  x = x + o_proj o
Such layers keep no recurrent state: their cache is the list of k, v.

CLI:
  gdn_ref.py --model DIR --tokens 1,2,3 [--logits-out F] [--generate N]
--logits-out writes float32 little-endian, one row of V floats per input
position (the wkvm-infer format); --generate prints the N greedy ids.
"""

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from rwkv7_ref import read_checkpoint, read_logits, write_logits  # noqa: E402,F401

L2_EPS = 1e-6  # fla's in-kernel q/k L2 normalisation


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x) + eps) * w


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _silu(x):
    return x * _sigmoid(x)


def _softplus(x):
    return np.logaddexp(0.0, x)


class State:
    """One sequence's recurrent state (float64)."""

    def __init__(self, m):
        n = m.n_layer
        self.q_conv = np.zeros((n, m.W - 1, m.KD))
        self.k_conv = np.zeros((n, m.W - 1, m.KD))
        self.v_conv = np.zeros((n, m.W - 1, m.VD))
        self.S = np.zeros((n, m.HV, m.K, m.Vd))
        # attention layers: per layer index, lists of K / V [Hkv, Da] per position
        self.kv = {i: ([], []) for i in m.attn_layers}

    def copy(self):
        s = State.__new__(State)
        for k, v in self.__dict__.items():
            if k == "kv":
                s.kv = {i: (list(a), list(b)) for i, (a, b) in v.items()}
            else:
                setattr(s, k, v.copy())
        return s


class GDN:
    def __init__(self, named, config):
        cfg = dict(config or {})
        self.named = named
        g = self._need
        emb = g("model.embeddings.weight")
        self.V, self.C = emb.shape
        self.n_layer = 0
        while "model.layers.%d.attn_norm.weight" % self.n_layer in named:
            self.n_layer += 1
        if self.n_layer == 0:
            raise ValueError("no layers")
        ac = cfg.get("attn") or None
        self.attn_layers = set(int(i) for i in ac["layers"]) if ac else set()
        if ac:
            if ac.get("window_size") is not None:
                raise ValueError("sliding-window attention is not modelled")
            self.Hq = int(ac["num_heads"])
            self.Hkv = int(ac.get("num_kv_heads") or self.Hq)
            self.qkv_bias = bool(ac.get("qkv_bias") or False)
            self.qk_norm = bool(ac.get("qk_norm") or False)
            self.theta = float(ac.get("rope_theta", 10000.0))
        l0 = min(i for i in range(self.n_layer) if i not in self.attn_layers)
        b0 = "model.layers.%d." % l0
        q = g(b0 + "attn.q_proj.weight")
        v = g(b0 + "attn.v_proj.weight")
        self.KD, self.VD = q.shape[0], v.shape[0]
        self.HV = g(b0 + "attn.A_log").size
        self.H = int(cfg.get("num_heads") or self.HV)
        self.K = int(cfg.get("head_dim") or self.KD // self.H)
        if self.H * self.K != self.KD:
            raise ValueError("num_heads x head_dim != q_proj rows")
        if self.HV % self.H or self.VD % self.HV:
            raise ValueError("value heads do not divide")
        self.Vd = self.VD // self.HV
        self.W = g(b0 + "attn.q_conv1d.weight").shape[-1]
        self.eps = float(cfg.get("norm_eps", 1e-6))
        self.use_gate = bool(cfg.get("use_gate", True))
        self.neg = bool(cfg.get("allow_neg_eigval", False))
        self.tied = "lm_head.weight" not in named
        self.head = emb if self.tied else g("lm_head.weight")
        self.layers = []
        for i in range(self.n_layer):
            b = "model.layers.%d." % i
            if i in self.attn_layers:
                L = {"attn_norm": g(b + "attn_norm.weight"),
                     "Wq": g(b + "attn.q_proj.weight"), "Wk": g(b + "attn.k_proj.weight"),
                     "Wv": g(b + "attn.v_proj.weight"), "Wo": g(b + "attn.o_proj.weight"),
                     "mlp_norm": g(b + "mlp_norm.weight"),
                     "Wgate": g(b + "mlp.gate_proj.weight"), "Wup": g(b + "mlp.up_proj.weight"),
                     "Wdown": g(b + "mlp.down_proj.weight")}
                self.Da = L["Wq"].shape[0] // self.Hq
                for nm in ("q", "k", "v"):
                    L["b" + nm] = (g(b + "attn.%s_proj.bias" % nm) if self.qkv_bias
                                   else np.zeros(L["W" + nm].shape[0]))
                if self.qk_norm:
                    L["nq"] = g(b + "attn.q_norm.weight").reshape(-1)
                    L["nk"] = g(b + "attn.k_norm.weight").reshape(-1)
                self.layers.append(L)
                continue
            L = {
                "attn_norm": g(b + "attn_norm.weight"),
                "Wq": g(b + "attn.q_proj.weight"), "Wk": g(b + "attn.k_proj.weight"),
                "Wv": g(b + "attn.v_proj.weight"), "Wa": g(b + "attn.a_proj.weight"),
                "Wb": g(b + "attn.b_proj.weight"), "Wo": g(b + "attn.o_proj.weight"),
                # conv taps [D, W]: tap W-1 multiplies the current input
                "cq": g(b + "attn.q_conv1d.weight").reshape(self.KD, self.W),
                "ck": g(b + "attn.k_conv1d.weight").reshape(self.KD, self.W),
                "cv": g(b + "attn.v_conv1d.weight").reshape(self.VD, self.W),
                "A": np.exp(g(b + "attn.A_log").reshape(-1)),
                "dt_bias": g(b + "attn.dt_bias").reshape(-1),
                "o_norm": g(b + "attn.o_norm.weight").reshape(-1),
                "mlp_norm": g(b + "mlp_norm.weight"),
                "Wgate": g(b + "mlp.gate_proj.weight"), "Wup": g(b + "mlp.up_proj.weight"),
                "Wdown": g(b + "mlp.down_proj.weight"),
            }
            if self.use_gate:
                L["Wg"] = g(b + "attn.g_proj.weight")
            self.layers.append(L)
        self.norm = g("model.norm.weight")

    def _need(self, name):
        if name not in self.named:
            raise KeyError("missing tensor %s" % name)
        return self.named[name]

    @classmethod
    def load(cls, path):
        conf = None
        cp = os.path.join(path, "config.json")
        if os.path.isfile(cp):
            with open(cp) as f:
                conf = json.load(f)
        return cls(read_checkpoint(path), conf)

    def new_state(self):
        return State(self)

    @staticmethod
    def _conv(taps, hist, cur):
        """SiLU(causal conv) of the current input; returns (out, new history)."""
        win = np.concatenate([hist, cur[None, :]], axis=0)  # [W, D], oldest first
        out = (win.T * taps).sum(axis=1)
        return _silu(out), win[1:]

    def _attn(self, i, L, x, st):
        H, K, HV, Vd = self.H, self.K, self.HV, self.Vd
        h = _rms(x, L["attn_norm"], self.eps)
        q, st.q_conv[i] = self._conv(L["cq"], st.q_conv[i], L["Wq"] @ h)
        k, st.k_conv[i] = self._conv(L["ck"], st.k_conv[i], L["Wk"] @ h)
        v, st.v_conv[i] = self._conv(L["cv"], st.v_conv[i], L["Wv"] @ h)
        q = q.reshape(H, K)
        k = k.reshape(H, K)
        v = v.reshape(HV, Vd)
        q = q / np.sqrt((q * q).sum(axis=1, keepdims=True) + L2_EPS)
        k = k / np.sqrt((k * k).sum(axis=1, keepdims=True) + L2_EPS)
        q = q * K ** -0.5
        beta = _sigmoid(L["Wb"] @ h) * (2.0 if self.neg else 1.0)
        gdec = -L["A"] * _softplus(L["Wa"] @ h + L["dt_bias"])
        o = np.zeros((HV, Vd))
        grp = HV // H
        for j in range(HV):
            kh, qh = k[j // grp], q[j // grp]
            S = st.S[i, j] * np.exp(gdec[j])
            u = beta[j] * (v[j] - S.T @ kh)
            S = S + np.outer(kh, u)
            st.S[i, j] = S
            o[j] = S.T @ qh
        o = o / np.sqrt(np.mean(o * o, axis=1, keepdims=True) + self.eps) * L["o_norm"]
        if self.use_gate:
            o = o * _silu((L["Wg"] @ h).reshape(HV, Vd))
        return x + L["Wo"] @ o.reshape(-1)

    def _rope(self, x, pos):
        """Rotate-half RoPE of x [n, Da] at position pos (float64)."""
        half = self.Da // 2
        f = self.theta ** (-np.arange(half) * 2.0 / self.Da)
        c, s = np.cos(pos * f), np.sin(pos * f)
        x1, x2 = x[:, :half], x[:, half:]
        return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=1)

    def _softmax_attn(self, i, L, x, st):
        Hq, Hkv, Da = self.Hq, self.Hkv, self.Da
        h = _rms(x, L["attn_norm"], self.eps)
        q = (L["Wq"] @ h + L["bq"]).reshape(Hq, Da)
        k = (L["Wk"] @ h + L["bk"]).reshape(Hkv, Da)
        v = (L["Wv"] @ h + L["bv"]).reshape(Hkv, Da)
        if self.qk_norm:
            q = q / np.sqrt(np.mean(q * q, axis=1, keepdims=True) + 1e-5) * L["nq"]
            k = k / np.sqrt(np.mean(k * k, axis=1, keepdims=True) + 1e-5) * L["nk"]
        ks, vs = st.kv[i]
        pos = len(ks)
        q = self._rope(q, pos)
        k = self._rope(k, pos)
        ks.append(k)
        vs.append(v)
        K = np.stack(ks)  # [p+1, Hkv, Da]
        Vv = np.stack(vs)
        o = np.zeros((Hq, Da))
        grp = Hq // Hkv
        for j in range(Hq):
            sc = K[:, j // grp, :] @ q[j] / np.sqrt(Da)
            w = np.exp(sc - sc.max())
            o[j] = (w / w.sum()) @ Vv[:, j // grp, :]
        return x + L["Wo"] @ o.reshape(-1)

    def _mlp(self, L, x):
        h = _rms(x, L["mlp_norm"], self.eps)
        return x + L["Wdown"] @ (_silu(L["Wgate"] @ h) * (L["Wup"] @ h))

    def step(self, token, st):
        """One token; updates st in place; returns logits [V] (float64)."""
        if not (0 <= token < self.V):
            raise ValueError("token %d out of range (vocab %d)" % (token, self.V))
        x = self.named["model.embeddings.weight"][token].copy()
        for i, L in enumerate(self.layers):
            if i in self.attn_layers:
                x = self._softmax_attn(i, L, x, st)
            else:
                x = self._attn(i, L, x, st)
            x = self._mlp(L, x)
        return self.head @ _rms(x, self.norm, self.eps)

    def forward(self, tokens, state=None):
        """Runs tokens from state (zero when None; not modified).
        Returns (logits [T, V] float64, final state)."""
        st = self.new_state() if state is None else state.copy()
        out = np.zeros((len(tokens), self.V))
        for t, tok in enumerate(tokens):
            out[t] = self.step(int(tok), st)
        return out, st

    def generate(self, tokens, n, state=None):
        """Greedy: the n ids after tokens (argmax, lowest id on ties).
        Returns (ids, logits of the prompt [T, V], final state)."""
        logits, st = self.forward(tokens, state)
        ids = []
        last = logits[-1]
        for _ in range(n):
            nxt = int(np.argmax(last))
            ids.append(nxt)
            last = self.step(nxt, st)
        return ids, logits, st


def main(argv=None):
    ap = argparse.ArgumentParser(description="numpy float64 Gated DeltaNet reference")
    ap.add_argument("--model", required=True, help="model dir")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--logits-out", help="float32 LE logits, one row per input position")
    ap.add_argument("--generate", type=int, default=0, help="print N greedy ids")
    a = ap.parse_args(argv)
    toks = [int(t) for t in a.tokens.replace(" ", "").split(",") if t != ""]
    if not toks:
        ap.error("--tokens is empty")
    m = GDN.load(a.model)
    ids, logits, _ = m.generate(toks, a.generate)
    if a.logits_out:
        write_logits(a.logits_out, logits)
    if a.generate:
        print(" ".join(str(i) for i in ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
