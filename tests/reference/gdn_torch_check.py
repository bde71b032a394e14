#!/usr/bin/python3
"""Cross-checks gdn_ref.py (numpy) against a second, torch implementation.

The torch forward below is written the way flash-linear-attention's model
runs a whole sequence: each projection over all positions at once, the short
convolutions as one padded depthwise F.conv1d over the sequence, the q / k
heads repeated for grouped value heads, and the gated delta rule in fla's
naive recurrent formulation (state [B, H, K, V], the old state decayed, the
delta computed against it, the new state read by q), then fla's gated
RMSNorm. Hybrid attention layers run as a whole-sequence transformer block
would: projections over all positions, RoPE from cos / sin tables
(rotate-half), the KV heads repeated for GQA, and torch's
scaled_dot_product_attention with is_causal=True (an explicit causal mask
and torch.softmax on torch < 2.0). It runs on the
parameters gen_gdn produced in memory, while the
numpy reference (token by token, conv from its history buffers) loads the
files gen_gdn wrote: a match checks the reference math, the name mapping,
the safetensors reader and the dtype widening in one go.

Exit 0 when every case matches (max |diff| / std < 1e-9 in float64, for the
logits and the final states), 1 otherwise, 77 when torch or numpy is missing.
"""

import os
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gdn_ref  # noqa: E402
import gen_gdn  # noqa: E402


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def naive_recurrent(q, k, v, beta, g, scale):
    """fla naive_recurrent_gated_delta_rule re-expressed: q, k [T, H, K],
    v [T, H, V], beta / g [T, H]. Returns o [T, H, V], state [H, K, V]."""
    T, H, K = k.shape
    Vd = v.shape[-1]
    h = torch.zeros(H, K, Vd, dtype=torch.float64)
    o = torch.zeros(T, H, Vd, dtype=torch.float64)
    q = q * scale
    for t in range(T):
        h = h * g[t].exp()[:, None, None]
        delta = (v[t] - (h * k[t][:, :, None]).sum(-2)) * beta[t][:, None]
        h = h + k[t][:, :, None] * delta[:, None, :]
        o[t] = torch.einsum("hk,hkv->hv", q[t], h)
    return o, h


def rope_tables(T, Da, theta):
    inv = theta ** (-torch.arange(0, Da, 2, dtype=torch.float64) / Da)
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)  # [T, Da/2]
    return torch.cos(ang).repeat(1, 2), torch.sin(ang).repeat(1, 2)  # [T, Da]


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def attention_block(P, b, cfg, h, T):
    """fla Attention over the whole sequence (h [T, C] normed input); returns [T, C]."""
    Hq, Hkv, Da = gen_gdn.attn_dims(cfg)
    q = h @ P[b + "attn.q_proj.weight"].T
    k = h @ P[b + "attn.k_proj.weight"].T
    v = h @ P[b + "attn.v_proj.weight"].T
    if cfg["qkv_bias"]:
        q = q + P[b + "attn.q_proj.bias"]
        k = k + P[b + "attn.k_proj.bias"]
        v = v + P[b + "attn.v_proj.bias"]
    q, k, v = q.view(T, Hq, Da), k.view(T, Hkv, Da), v.view(T, Hkv, Da)
    if cfg["qk_norm"]:
        q = rmsnorm(q, P[b + "attn.q_norm.weight"], 1e-5)
        k = rmsnorm(k, P[b + "attn.k_norm.weight"], 1e-5)
    cos, sin = rope_tables(T, Da, cfg["rope_theta"])
    q = q * cos[:, None] + rotate_half(q) * sin[:, None]
    k = k * cos[:, None] + rotate_half(k) * sin[:, None]
    k = k.repeat_interleave(Hq // Hkv, dim=1)
    v = v.repeat_interleave(Hq // Hkv, dim=1)
    q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [Hq, T, Da]
    if hasattr(F, "scaled_dot_product_attention"):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale Da^-0.5
    else:  # torch < 2.0: the same with an explicit causal mask
        sc = (q @ k.transpose(1, 2)) * Da ** -0.5
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        o = torch.softmax(sc.masked_fill(mask, float("-inf")), dim=-1) @ v
    return o.transpose(0, 1).reshape(T, Hq * Da) @ P[b + "attn.o_proj.weight"].T


def torch_forward(named, cfg, tokens):
    P = {n: torch.tensor(a, dtype=torch.float64) for n, a in named.items()}
    C, H, K, HV, Vd, KD, VD, Fd, V, W = gen_gdn.dims(cfg)
    eps = cfg["norm_eps"]
    T = len(tokens)
    x = P["model.embeddings.weight"][torch.tensor(tokens)]  # [T, C]
    states = []
    for i in range(cfg["layers"]):
        b = "model.layers.%d." % i
        h = rmsnorm(x, P[b + "attn_norm.weight"], eps)
        if i in cfg["attn_layers"]:
            x = x + attention_block(P, b, cfg, h, T)
            m = rmsnorm(x, P[b + "mlp_norm.weight"], eps)
            act = F.silu(m @ P[b + "mlp.gate_proj.weight"].T) * (m @ P[b + "mlp.up_proj.weight"].T)
            x = x + act @ P[b + "mlp.down_proj.weight"].T
            states.append(None)  # no recurrent state; the KV is the sequence itself
            continue
        convs = []
        conv_tail = []
        for nm in ("q", "k", "v"):
            y = h @ P[b + "attn.%s_proj.weight" % nm].T  # [T, D]
            wt = P[b + "attn.%s_conv1d.weight" % nm]      # [D, 1, W]
            z = F.conv1d(y.T[None], wt, padding=W - 1, groups=wt.shape[0])[0, :, :T].T
            convs.append(F.silu(z))
            tail = torch.cat([torch.zeros(W - 1, y.shape[1], dtype=y.dtype), y])[-(W - 1):]
            conv_tail.append(tail)
        q, k, v = convs
        q = q.view(T, H, K)
        k = k.view(T, H, K)
        v = v.view(T, HV, Vd)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        q = q.repeat_interleave(HV // H, dim=1)
        k = k.repeat_interleave(HV // H, dim=1)
        beta = torch.sigmoid(h @ P[b + "attn.b_proj.weight"].T)
        if cfg["allow_neg_eigval"]:
            beta = beta * 2
        g = -P[b + "attn.A_log"].exp() * F.softplus(h @ P[b + "attn.a_proj.weight"].T
                                                     + P[b + "attn.dt_bias"])
        o, S = naive_recurrent(q, k, v, beta, g, K ** -0.5)
        o = rmsnorm(o, P[b + "attn.o_norm.weight"], eps)
        if cfg["use_gate"]:
            o = o * F.silu((h @ P[b + "attn.g_proj.weight"].T).view(T, HV, Vd))
        x = x + o.reshape(T, VD) @ P[b + "attn.o_proj.weight"].T
        m = rmsnorm(x, P[b + "mlp_norm.weight"], eps)
        act = F.silu(m @ P[b + "mlp.gate_proj.weight"].T) * (m @ P[b + "mlp.up_proj.weight"].T)
        x = x + act @ P[b + "mlp.down_proj.weight"].T
        states.append((conv_tail[0], conv_tail[1], conv_tail[2], S))
    head = P["model.embeddings.weight"] if cfg["tied"] else P["lm_head.weight"]
    logits = rmsnorm(x, P["model.norm.weight"], eps) @ head.T
    return logits.numpy(), states


CASES = [
    dict(seed=11),
    dict(seed=12, dtype="bf16", use_gate=False, tied=True),
    dict(seed=13, dtype="f16", format="sharded", allow_neg_eigval=True, layers=3),
    dict(seed=14, heads=2, v_heads=4, head_dim=16, expand_v=1.5, conv=3),
    dict(seed=15, conv=2, hidden=48, heads=3, head_dim=8, ffn=96, vocab=257),
    dict(seed=16, layers=4, attn_layers=(1, 3), attn_heads=4, attn_kv_heads=2),
    dict(seed=17, dtype="bf16", layers=3, attn_layers=(0,), attn_heads=8, attn_kv_heads=8,
         qk_norm=True, qkv_bias=True, rope_theta=500000.0, tied=True),
]


def main():
    tmp = tempfile.mkdtemp(prefix="wkvm-gdn-torch-")
    rng = np.random.default_rng(5)
    fails = 0
    for kw in CASES:
        cfg = gen_gdn.default_cfg(**kw)
        d = os.path.join(tmp, "m%d" % cfg["seed"])
        named = gen_gdn.write_model(d, cfg)
        toks = [int(t) for t in rng.integers(0, cfg["vocab"], 70 if cfg["attn_layers"] else 20)]
        ref = gdn_ref.GDN.load(d)
        ref_logits, st = ref.forward(toks)
        tl, tstates = torch_forward(named, cfg, toks)
        std = ref_logits.std()
        worst = np.abs(ref_logits - tl).max() / std
        sworst = 0.0
        for i, tst in enumerate(tstates):
            if tst is None:
                continue
            qc, kc, vc, S = tst
            for a, b_ in ((st.q_conv[i], qc), (st.k_conv[i], kc), (st.v_conv[i], vc),
                          (st.S[i], S)):
                b_ = b_.numpy()
                sworst = max(sworst, np.abs(a - b_).max() / max(np.abs(b_).max(), 1e-30))
        ok = worst < 1e-9 and sworst < 1e-9
        fails += not ok
        print("%-4s %-60s logits std %.3f max|d|/std %.2e state %.2e"
              % ("ok" if ok else "FAIL", ",".join("%s=%s" % i for i in kw.items()), std,
                 worst, sworst))
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
