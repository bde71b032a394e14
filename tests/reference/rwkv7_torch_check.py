#!/usr/bin/python3
"""Cross-checks rwkv7_ref.py (numpy) against a second, torch implementation.

The torch forward below is written in the BlinkDL matrix style (F.layer_norm,
F.group_norm, vk / ab outer products) and runs on the parameters gen_model
produced in memory, while the numpy reference loads the files gen_model
wrote. A match therefore checks the reference math, both name mappings, the
safetensors / .pth readers and the dtype widening in one go.

Exit 0 when every case matches (max |diff| / std < 1e-9 in float64), 1
otherwise, 77 when torch or numpy is missing.
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
import gen_model  # noqa: E402
import rwkv7_ref  # noqa: E402


def torch_forward(p, tokens, gn_eps):
    """gn_eps: the GroupNorm epsilon of the checkpoint's convention (BlinkDL
    64e-5 at any head size, HF head_dim * norm_eps), given by the caller."""
    T = lambda a: torch.tensor(np.asarray(a), dtype=torch.float64)
    emb, head = T(p["emb"]), T(p["head"])
    V, C = emb.shape
    H, N = p["layers"][0]["r_k"].shape
    Ls = [{k: T(v) for k, v in L.items()} for L in p["layers"]]
    nl = len(Ls)
    att_x = torch.zeros(nl, C, dtype=torch.float64)
    ffn_x = torch.zeros(nl, C, dtype=torch.float64)
    wkv = torch.zeros(nl, H, N, N, dtype=torch.float64)
    out = []
    for tok in tokens:
        x = F.layer_norm(emb[tok], (C,), T(p["ln0_w"]), T(p["ln0_b"]), eps=1e-5)
        v_first = None
        for i, L in enumerate(Ls):
            xa_ = F.layer_norm(x, (C,), L["ln1_w"], L["ln1_b"], eps=1e-5)
            sx = att_x[i] - xa_
            att_x[i] = xa_
            mix = [xa_ + sx * L[n] for n in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g")]
            xr, xw, xk, xv, xa, xg = mix
            r, k, v = L["Wr"] @ xr, L["Wk"] @ xk, L["Wv"] @ xv
            w = torch.exp(-torch.exp(torch.tensor(-0.5, dtype=torch.float64))
                          * torch.sigmoid(L["w0"] + torch.tanh(xw @ L["w1"]) @ L["w2"]))
            a = torch.sigmoid(L["a0"] + (xa @ L["a1"]) @ L["a2"])
            g = torch.sigmoid(xg @ L["g1"]) @ L["g2"]
            kk = F.normalize((k * L["k_k"]).view(H, N), dim=-1, p=2.0, eps=1e-12).view(C)
            k = k * (1 + (a - 1) * L["k_a"])
            if i == 0:
                v_first = v
            else:
                v = v + (v_first - v) * torch.sigmoid(L["v0"] + (xv @ L["v1"]) @ L["v2"])
            vk = v.view(H, N, 1) @ k.view(H, 1, N)
            ab = (-kk).view(H, N, 1) @ (kk * a).view(H, 1, N)
            s = wkv[i]
            s = s * w.view(H, 1, N) + s @ ab + vk
            wkv[i] = s
            y = (s @ r.view(H, N, 1)).view(1, C)
            y = F.group_norm(y, num_groups=H, weight=L["lnx_w"], bias=L["lnx_b"],
                             eps=gn_eps).view(C)
            y = y + ((r * k * L["r_k"].view(C)).view(H, N).sum(dim=-1, keepdim=True)
                     * v.view(H, N)).view(C)
            x = x + L["Wo"] @ (y * g)
            xb = F.layer_norm(x, (C,), L["ln2_w"], L["ln2_b"], eps=1e-5)
            kx = xb + (ffn_x[i] - xb) * L["ffn_x_k"]
            ffn_x[i] = xb
            x = x + L["ffn_value"] @ (torch.relu(L["ffn_key"] @ kx) ** 2)
        x = F.layer_norm(x, (C,), T(p["ln_out_w"]), T(p["ln_out_b"]), eps=1e-5)
        out.append(head @ x)
    return torch.stack(out).numpy(), (att_x.numpy(), ffn_x.numpy(), wkv.numpy())


CASES = [
    dict(convention="hf", dtype="f32", format="safetensors", layer0_v=False,
         layers=2, embd=64, head_size=16, ffn=256, vocab=300, seed=11),
    dict(convention="blink", dtype="bf16", format="pth", layer0_v=True,
         layers=3, embd=64, head_size=32, ffn=128, vocab=400, seed=12),
    dict(convention="blink", dtype="f16", format="safetensors", layer0_v=False,
         layers=2, embd=128, head_size=64, ffn=256, vocab=500, seed=13),
    dict(convention="hf", dtype="bf16", format="sharded", layer0_v=True,
         layers=2, embd=64, head_size=16, ffn=192, vocab=333, seed=14),
]


def main():
    rng = np.random.default_rng(5)
    fails = 0
    with tempfile.TemporaryDirectory(prefix="wkvm-tcheck-") as tmp:
        for n, kw in enumerate(CASES):
            cfg = gen_model.default_cfg(**kw)
            d = os.path.join(tmp, "m%d" % n)
            p, _ = gen_model.write_model(d, cfg)
            toks = [int(t) for t in rng.integers(0, cfg["vocab"], 20)]
            ref = rwkv7_ref.RWKV7.load(d)
            lr, st = ref.forward(toks)
            gn_eps = 64e-5 if cfg["convention"] == "blink" else cfg["head_size"] * 1e-5
            lt, (ax, fx, wkv) = torch_forward(p, toks, gn_eps)
            std = lr.std()
            err = np.abs(lr - lt).max() / std
            serr = max(np.abs(st.att_shift - ax).max(), np.abs(st.ffn_shift - fx).max(),
                       np.abs(st.wkv - wkv).max() / max(np.abs(wkv).max(), 1e-30))
            ok = err < 1e-9 and serr < 1e-9
            fails += not ok
            print("%-4s %-5s %-5s %-11s l0v=%d C=%-3d N=%-2d  logit std %.3f  "
                  "rel err %.2e  state err %.2e  %s"
                  % ("ok" if ok else "FAIL", cfg["convention"], cfg["dtype"], cfg["format"],
                     cfg["layer0_v"], cfg["embd"], cfg["head_size"], std, err, serr,
                     "" if ok else "<--"))
    print("torch check: %d/%d cases match" % (len(CASES) - fails, len(CASES)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
