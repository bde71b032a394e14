#!/usr/bin/python3
"""Cross-checks mamba2_ref.py (numpy, token by token) against a second, torch
implementation of the same model.

transformers is not assumed: the torch forward below is written separately in
the chunked "state space duality" form (the whole sequence at once: F.conv1d
with left padding for the causal conv, then per chunk an intra-chunk masked
decay matrix L[t, s] = exp(sum a over (s, t]) applied to (C_t . B_s) dt_s x_s,
plus the carried state decayed into each position, and the chunk's end state
passed on). It runs on the parameters gen_mamba2 produced in memory, while the
numpy reference loads the files gen_mamba2 wrote, so a match checks the
sequential scan, both name conventions, the config reading and the dtype
widening in one go. The chunk size (5) does not divide the prompt, so the
chunk boundaries are exercised too.

Exit 0 when every case matches (max |diff| / std < 1e-9 in float64, final
conv and SSM states too), 1 otherwise, 77 when torch or numpy is missing.
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
import gen_mamba2  # noqa: E402
import mamba2_ref  # noqa: E402

CHUNK = 5


def _rms_last(x, w, eps):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def ssd_scan(xs, dt, A, B, Cm, chunk):
    """xs [T, H, P], dt [T, H], A [H], B/Cm [T, H, N] (already per head).
    Returns y [T, H, P] (without the D term) and the final state [H, P, N]."""
    T, H, P = xs.shape
    N = B.shape[-1]
    S = torch.zeros(H, P, N, dtype=torch.float64)
    ys = []
    for c0 in range(0, T, chunk):
        c1 = min(T, c0 + chunk)
        a = dt[c0:c1] * A  # [l, H] log decays
        acum = torch.cumsum(a, dim=0)  # [l, H]
        l = c1 - c0
        diff = acum[:, None, :] - acum[None, :, :]  # [t, s, H]: sum a over (s, t]
        mask = torch.tril(torch.ones(l, l, dtype=torch.bool))
        Lm = torch.where(mask[:, :, None], torch.exp(diff), torch.zeros_like(diff))
        cb = torch.einsum("thn,shn->tsh", Cm[c0:c1], B[c0:c1])
        u = xs[c0:c1] * dt[c0:c1, :, None]  # [s, H, P]
        y_in = torch.einsum("tsh,shp->thp", cb * Lm, u)
        y_carry = torch.einsum("hpn,thn->thp", S, Cm[c0:c1]) * torch.exp(acum)[:, :, None]
        ys.append(y_in + y_carry)
        decay_end = torch.exp(acum[-1][None, :] - acum)  # [s, H]
        S = S * torch.exp(acum[-1])[:, None, None] + torch.einsum(
            "sh,shp,shn->hpn", decay_end, u, B[c0:c1])
    return torch.cat(ys, dim=0), S


def torch_forward(p, cfg, tokens):
    T_ = lambda a: torch.tensor(np.asarray(a), dtype=torch.float64)
    C, d_inner, H, P, G, N, K, conv_dim, d_in, V = gen_mamba2.dims(cfg)
    eps = cfg["eps"]
    emb = T_(p["emb"])
    head = emb if p["lm_head"] is None else T_(p["lm_head"])
    tok = torch.tensor(tokens, dtype=torch.long)
    T = len(tokens)
    x = emb[tok]  # [T, C]
    convs, ssms = [], []
    for L in p["layers"]:
        Lt = {k: T_(v) for k, v in L.items()}
        u = _rms_last(x, Lt["norm"], eps)
        proj = u @ Lt["in_proj"].T
        z, xbc_in, dt_raw = torch.split(proj, [d_inner, conv_dim, H], dim=-1)
        seq = xbc_in.T[None]  # [1, conv_dim, T]
        conv = F.conv1d(F.pad(seq, (K - 1, 0)), Lt["conv_w"], Lt["conv_b"], groups=conv_dim)
        xbc = F.silu(conv[0].T)  # [T, conv_dim]
        padded = F.pad(seq[0], (K - 1, 0))
        convs.append(padded[:, -(K - 1):].numpy())
        xs = xbc[:, :d_inner].reshape(T, H, P)
        B = xbc[:, d_inner:d_inner + G * N].reshape(T, G, N).repeat_interleave(H // G, dim=1)
        Cm = xbc[:, d_inner + G * N:].reshape(T, G, N).repeat_interleave(H // G, dim=1)
        dt = F.softplus(dt_raw + Lt["dt_bias"], beta=1.0, threshold=20.0)
        A = -torch.exp(Lt["A_log"])
        y, S = ssd_scan(xs, dt, A, B, Cm, CHUNK)
        ssms.append(S.numpy())
        y = y + xs * Lt["D"][None, :, None]
        y = y.reshape(T, d_inner) * F.silu(z)
        yg = y.reshape(T, G, d_inner // G)
        yn = (yg * torch.rsqrt((yg * yg).mean(dim=-1, keepdim=True) + eps)).reshape(T, d_inner)
        x = x + (yn * Lt["gnorm"]) @ Lt["out_proj"].T
    logits = _rms_last(x, T_(p["norm_f"]), eps) @ head.T
    return logits.numpy(), np.stack(convs), np.stack(ssms)


CASES = [
    dict(convention="hf", dtype="f32", format="safetensors", layers=2, d_model=64,
         d_state=16, headdim=16, vocab=300, seed=11),
    dict(convention="ssm", dtype="bf16", format="safetensors", layers=3, d_model=48,
         d_state=8, headdim=12, ngroups=2, vocab=257, seed=12),
    dict(convention="hf", dtype="f16", format="sharded", layers=2, d_model=64, d_state=32,
         headdim=32, ngroups=2, d_conv=3, tied=True, vocab=333, seed=13),
    dict(convention="ssm", dtype="f32", format="sharded", layers=1, d_model=40, d_state=24,
         headdim=10, ngroups=4, d_conv=5, tied=False, vocab=260, seed=14),
]


def main():
    rng = np.random.default_rng(5)
    fails = 0
    with tempfile.TemporaryDirectory(prefix="wkvm-m2check-") as tmp:
        for n, kw in enumerate(CASES):
            cfg = gen_mamba2.default_cfg(**kw)
            d = os.path.join(tmp, "m%d" % n)
            p, _ = gen_mamba2.write_model(d, cfg)
            toks = [int(t) for t in rng.integers(0, cfg["vocab"], 23)]
            ref = mamba2_ref.Mamba2.load(d)
            lr, st = ref.forward(toks)
            lt, conv, ssm = torch_forward(p, cfg, toks)
            std = lr.std()
            err = np.abs(lr - lt).max() / std
            serr = max(np.abs(st.conv - conv).max() / max(np.abs(conv).max(), 1e-30),
                       np.abs(st.ssm - ssm).max() / max(np.abs(ssm).max(), 1e-30))
            ok = err < 1e-9 and serr < 1e-9
            fails += not ok
            print("%-4s %-3s %-4s %-11s G=%d K=%d C=%-3d N=%-2d P=%-2d  logit std %.3f  "
                  "|ssm| %.2f  rel err %.2e  state err %.2e  %s"
                  % ("ok" if ok else "FAIL", cfg["convention"], cfg["dtype"], cfg["format"],
                     cfg["ngroups"], cfg["d_conv"], cfg["d_model"], cfg["d_state"],
                     cfg["headdim"], std, np.abs(ssm).max(), err, serr, "" if ok else "<--"))
    print("torch check: %d/%d cases match" % (len(CASES) - fails, len(CASES)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
