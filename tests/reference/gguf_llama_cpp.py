#!/usr/bin/python3
"""GGUF files written by llama.cpp's own converter load in wkvm and run
bit-identically to the safetensors checkpoints they were converted from.

llama.cpp's convert_hf_to_gguf.py (from the PyPI sdist of llama-cpp-python,
deploy/install-gguf-converter; run under the deploy/install-ref-venv venv
through bench/gguf-convert.py) converts small random Hugging Face models:
  - RWKV-7 (wkvm-mkmodel, with the real World vocab of the `rwkv` package):
    f32 -> --outtype f32, its f16 copy -> f16, a bf16 model -> bf16;
  - Mamba2 (gen_mamba2.py, hf convention): n_groups 2 untied and n_groups 1
    tied, f32 -> f32, bf16 -> bf16, f32 -> f16 (see below).
For each, a directory holding only the .gguf (Mamba2: plus the
tokenizer.json, which the converter cannot read: its pre-tokenizer hash is
unknown to it) must give the same wkvm-infer logits, bit for bit, as the
safetensors directory, both with weights as stored and with --fp32, and the
same greedy tokens. Mamba2: the converter stores A = -exp(A_log) (torch,
float32) instead of A_log, and wrk_gguf maps it back to the float whose
-expf is exactly that A; identity with the safetensors run then needs
torch's exp to agree with glibc's expf on every A_log, which is checked and
reported per model. The n_groups 2 models have their A_log moved by a few
ulps where the two differ, so bit identity is required of them; the G1 model
keeps its natural A_log (torch differs by 1 ulp on one head) and is held to
max|diff|/std < 1e-5 unless identical, the figure printed. An f16 Mamba2 cannot be converted on
Debian's torch 1.13 (the converter computes exp in Half, which its CPU
kernels lack; newer torch would round A to f16): the f32 model is converted
--outtype f16, which stores only the 2-D matrices in F16 (checked), and
compared with a safetensors copy whose 2-D matrices are rounded to f16.

Tokenizer: the World vocab comes from the GGUF metadata (tokenizer.ggml.tokens)
when the directory has no vocab file. wkvm-tokdump must list the same ids and
bytes from the .gguf as from rwkv_vocab_v20230424.txt, and wkvm-infer
--encode must give the same ids on every text from the .gguf directory as from
the safetensors one.

Errors: copies of a converted file rewritten with gguf-py (another
general.architecture, a tensor dropped, a tensor of the wrong shape) must be
refused with a message naming the architecture or the tensor.

Exit 0 when all agree, 1 on any disagreement or failure, 77 (skip) only when
pip cannot reach a package index for the venv or the sdist, or wkvm is not built.
"""
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import upstream_venv  # noqa: E402

NAME = "gguf_llama_cpp"
upstream_venv.enter(NAME, ["transformers", "torch", "numpy", "rwkv", "safetensors"])

import numpy as np  # noqa: E402
import rwkv  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

import gen_mamba2  # noqa: E402

SRC = upstream_venv.SRC
INSTALL = os.path.join(SRC, "deploy", "install-gguf-converter")
SHIM = os.path.join(SRC, "bench", "gguf-convert.py")
VOCAB = os.path.join(os.path.dirname(os.path.abspath(rwkv.__file__)), "rwkv_vocab_v20230424.txt")
BUILD = upstream_venv.build_dir()
INFER = os.path.join(BUILD, "tools", "wkvm-infer")
MKMODEL = os.path.join(BUILD, "tools", "wkvm-mkmodel")
TOKDUMP = os.path.join(BUILD, "tests", "wkvm-tokdump")

TEXTS = [
    "Hello world, the quick brown fox jumps over the lazy dog.\n\nUser: hi\n\nAssistant:",
    "\u4e2d\u6587\u6587\u672c\uff0c\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001"
    "\ud55c\uad6d\uc5b4 \u0440\u0443\u0441\u0441\u043a\u0438\u0439 \u0627\u0644\u0639\u0631"
    "\u0628\u064a\u0629 \U0001f600\U0001f680",
    "[PAD65530] <s> </s> \\x41 \\n '\"' b'\\xff' \t\r\n  trailing   ",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n",
    "".join(chr(c) for c in range(32, 127)) + "\x00\x01\x7f",
]


def run(cmd, timeout=600, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                          **kw)


def converter_dir():
    p = run([INSTALL, sys.executable], timeout=1200)
    err = p.stderr.decode("utf-8", "replace").strip()
    if p.returncode == 2:
        if any(h.lower() in err.lower() for h in upstream_venv.NETWORK_HINTS):
            k = err.find("pip could not install")
            upstream_venv.skip(NAME, err[k:][:3000] if k >= 0 else err[-2000:])
        raise RuntimeError("install-gguf-converter: pip failed, and not for want of a "
                           "package index:\n" + err[-3000:])
    if p.returncode != 0:
        raise RuntimeError("install-gguf-converter exit %d: %s" % (p.returncode, err[-2000:]))
    if err:
        print(err, flush=True)
    return p.stdout.decode().strip().splitlines()[-1]


def convert(conv, src, outtype, out):
    t0 = time.time()
    p = run([sys.executable, SHIM, os.path.join(conv, "convert_hf_to_gguf.py"), src,
             "--outtype", outtype, "--outfile", out])
    if p.returncode != 0:
        raise RuntimeError("convert_hf_to_gguf.py %s --outtype %s: exit %d:\n%s" % (
            src, outtype, p.returncode, p.stderr.decode("utf-8", "replace")[-3000:]))
    return time.time() - t0


def infer(mdir, tokens, out, fp32, generate=0):
    cmd = [INFER, "--model", mdir, "--tokens", ",".join(map(str, tokens)),
           "--logits-out", out, "--threads", "2"]
    if fp32:
        cmd.append("--fp32")
    if generate:
        cmd += ["--generate", str(generate)]
    p = run(cmd, timeout=300)
    if p.returncode != 0:
        raise RuntimeError("wkvm-infer --model %s: exit %d: %s" % (
            mdir, p.returncode, p.stderr.decode("utf-8", "replace")[-1000:]))
    with open(out, "rb") as f:
        return f.read(), p.stdout.decode().split()


def f16_copy(src, dst, matrices_only=False):
    """The f32 safetensors model src as f16 (numpy's round to nearest even, what the
    converter's --outtype f16 does to each tensor it stores in F16); matrices_only:
    only the 2-D tensors, the rest kept f32."""
    os.makedirs(dst)
    for fn in os.listdir(src):
        if fn.endswith(".safetensors"):
            t = load_file(os.path.join(src, fn))
            save_file({k: v.astype(np.float16) if v.ndim == 2 or not matrices_only else v
                       for k, v in t.items()}, os.path.join(dst, fn))
        else:
            shutil.copy(os.path.join(src, fn), os.path.join(dst, fn))


def gguf_module(conv):
    sys.path.insert(0, os.path.join(conv, "gguf-py"))
    import gguf
    return gguf


def rewrite(gguf, src, dst, arch=None, drop=(), replace=None):
    """Copies the GGUF file src to dst with another architecture, tensors dropped
    or replaced (name -> numpy array, same GGML type)."""
    r = gguf.GGUFReader(src)
    a = arch or r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, a)
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        vt = f.types[0]
        st = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), vt, sub_type=st)
    ts = [(t.name, (replace or {}).get(t.name, t.data), t.tensor_type) for t in r.tensors
          if t.name not in drop]
    for name, data, tt in ts:
        w.add_tensor_info(name, data.shape, data.dtype, data.nbytes, tt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, data, tt in ts:
        w.write_tensor_data(np.ascontiguousarray(data))
    w.close()


def libm_expf():
    libm = ctypes.CDLL("libm.so.6")
    libm.expf.restype = ctypes.c_float
    libm.expf.argtypes = [ctypes.c_float]
    return libm.expf


def a_log_agree(st_dir):
    """Moves each A_log of the model in st_dir up by the fewest steps of its dtype
    until torch's float32 exp (what the converter computes, on the whole tensor)
    equals glibc's expf (what wkvm computes) on it, so that bit identity is
    required of the GGUF run. Returns the number of values moved."""
    import torch
    from safetensors.torch import load_file as load_torch, save_file as save_torch
    expf = libm_expf()
    path = os.path.join(st_dir, "model.safetensors")
    t = load_torch(path)
    moved = 0
    for k in [k for k in t if k.endswith("A_log")]:
        v = t[k].clone()
        for _ in range(64):
            e = torch.exp(v.to(torch.float32)).numpy()
            bad = [i for i, x in enumerate(v.to(torch.float32).numpy())
                   if np.float32(expf(float(x))) != e[i]]
            if not bad:
                break
            moved += len(bad)
            bits = v.view(torch.int16 if v.dtype == torch.bfloat16 else torch.int32)
            for i in bad:
                bits[i] += 1  # A_log > 0 here: the next larger value
        t[k] = v
    save_torch(t, path, metadata={"format": "pt"})
    return moved


def a_agreement(gguf, gg_path, st_dir):
    """(heads whose stored A equals -expf(A_log) in glibc, heads): the condition for
    bit identity of a Mamba2 GGUF with its safetensors source."""
    expf = libm_expf()
    from safetensors.torch import load_file as load_torch  # numpy has no bfloat16
    st = {}
    for fn in os.listdir(st_dir):
        if fn.endswith(".safetensors"):
            st.update({k: v.float().numpy() for k, v in
                       load_torch(os.path.join(st_dir, fn)).items() if k.endswith("A_log")})
    r = gguf.GGUFReader(gg_path)
    same = total = 0
    for t in r.tensors:
        if not t.name.endswith(".ssm_a"):
            continue
        layer = int(t.name.split(".")[1])
        a_log = st["backbone.layers.%d.mixer.A_log" % layer]
        for x, a in zip(a_log.astype(np.float32).ravel(), np.asarray(t.data).ravel()):
            total += 1
            same += np.float32(-expf(float(x))) == np.float32(a)
    return same, total


def main():
    for exe in (INFER, MKMODEL, TOKDUMP):
        if not os.access(exe, os.X_OK):
            upstream_venv.skip(NAME, "%s is not built" % exe)
    conv = converter_dir()
    gguf = gguf_module(conv)
    with open(os.path.join(conv, "wkvm-sdist.txt")) as f:
        print("converter: %s (%s)" % (os.path.join(conv, "convert_hf_to_gguf.py"),
                                      f.read().strip()))
    tmp = tempfile.mkdtemp(prefix="wkvm-gguf-")
    fails = []
    n_ok = 0
    try:
        # --- the models, in the dtype each GGUF is compared in -------------------------
        cases = []  # (name, safetensors dir, converter input dir, outtype, family)
        rw32 = os.path.join(tmp, "rwkv7-f32")
        rw16 = os.path.join(tmp, "rwkv7-bf16")
        for d, dt in ((rw32, "f32"), (rw16, "bf16")):
            p = run([MKMODEL, "--out", d, "--vocab-file", VOCAB, "--layers", "2", "--embd", "64",
                     "--head-size", "32", "--dtype", dt, "--seed", "19"])
            if p.returncode != 0:
                raise RuntimeError("wkvm-mkmodel: %s" % p.stderr.decode()[-500:])
        rwf16 = os.path.join(tmp, "rwkv7-f16")
        f16_copy(rw32, rwf16)
        cases += [("rwkv7 f32", rw32, rw32, "f32", "rwkv7"),
                  ("rwkv7 f16", rwf16, rwf16, "f16", "rwkv7"),
                  ("rwkv7 bf16", rw16, rw16, "bf16", "rwkv7")]
        for name, kw in (("mamba2 G2 untied", dict(ngroups=2, tied=False, seed=41)),
                         ("mamba2 G1 tied", dict(ngroups=1, tied=True, seed=42))):
            for dt in ("f32", "bf16") if "G2" in name else ("f32",):
                d = os.path.join(tmp, "%s-%s" % (name.replace(" ", "-"), dt))
                cfg = gen_mamba2.default_cfg(layers=2, d_model=64, d_state=16, headdim=16,
                                             vocab=300, dtype=dt, **kw)
                gen_mamba2.write_model(d, cfg)
                if "G2" in name:
                    print("     %s %s: %d A_log values moved so that torch's exp == glibc's "
                          "expf" % (name, dt, a_log_agree(d)))
                cases.append(("%s %s" % (name, dt), d, d, dt, "mamba2"))
                if dt == "f32" and "G2" in name:
                    # an f16 Mamba2 cannot be converted on torch 1.13 (exp of Half, for
                    # A = -exp(A_log)): the f32 model goes to --outtype f16, which stores
                    # only the 2-D matrices as F16 (in_proj, out_proj, embeddings, head),
                    # and is compared with that model's matrices rounded to f16
                    d16 = d.replace("-f32", "-f16")
                    f16_copy(d, d16, matrices_only=True)
                    cases.append(("%s f16" % name, d16, d, "f16", "mamba2"))

        tokens = [1, 72, 101, 108, 108, 111, 44, 33, 261, 3, 200, 17, 99, 250, 5, 44] * 3
        for name, st_dir, conv_src, outtype, fam in cases:
            gdir = st_dir + "-gguf"
            os.makedirs(gdir)
            gpath = os.path.join(gdir, "model-%s.gguf" % outtype)
            src = conv_src
            if fam == "mamba2":
                # the converter refuses this tokenizer.json (unknown pre-tokenizer hash)
                src = st_dir + "-notok"
                os.makedirs(src)
                for fn in os.listdir(conv_src):
                    if fn != "tokenizer.json":
                        os.symlink(os.path.join(conv_src, fn), os.path.join(src, fn))
                shutil.copy(os.path.join(st_dir, "tokenizer.json"), gdir)
            secs = convert(conv, src, outtype, gpath)
            r = gguf.GGUFReader(gpath)
            types = sorted({t.tensor_type.name for t in r.tensors})
            exact = None
            if fam == "mamba2":
                same, total = a_agreement(gguf, gpath, conv_src)
                f16 = sorted(t.name for t in r.tensors
                             if t.tensor_type == gguf.GGMLQuantizationType.F16)
                if outtype == "f16" and f16 != sorted(
                        [t.name for t in r.tensors if t.name.endswith(
                            ("ssm_in.weight", "ssm_out.weight"))] +
                        ["token_embd.weight"] +
                        (["output.weight"] if "untied" in name else [])):
                    fails.append("%s: the converter stored %s as F16, not the matrices the "
                                 "f16 copy rounds" % (name, f16))
                exact = same == total
                print("     %s: A = -exp(A_log) stored by the converter equals glibc's -expf "
                      "on %d of %d heads" % (name, same, total))
            for fp32 in (False, True):
                want, want_gen = infer(st_dir, tokens, os.path.join(tmp, "a.bin"), fp32, 12)
                got, got_gen = infer(gdir, tokens, os.path.join(tmp, "b.bin"), fp32, 12)
                mode = "--fp32" if fp32 else "as stored"
                a = np.frombuffer(want, dtype="<f4").astype(np.float64)
                b = np.frombuffer(got, dtype="<f4").astype(np.float64)
                rel = float(np.abs(a - b).max() / a.std()) if a.shape == b.shape else float("inf")
                if fam == "mamba2" and not exact:
                    ok = rel < 1e-5
                    what = "logits bit-identical %s, max|diff|/std %.3g (< 1e-5: torch's exp " \
                        "!= glibc's expf on some head)" % (want == got, rel)
                else:
                    ok = want == got and want_gen == got_gen
                    what = "logits bit-identical %s, greedy %s" % (
                        want == got, "same" if want_gen == got_gen else "differ")
                print("%-4s %-22s %-9s (%s, converted in %.1f s) vs safetensors: %s"
                      % ("ok" if ok else "FAIL", name, mode, "/".join(types), secs, what))
                if ok:
                    n_ok += 1
                else:
                    fails.append("%s %s: %s" % (name, mode, what))

        # --- the World tokenizer from the metadata -----------------------------------------
        gg = os.path.join(rw32 + "-gguf", "model-f32.gguf")
        a = run([TOKDUMP, VOCAB])
        b = run([TOKDUMP, gg])
        if a.returncode != 0 or b.returncode != 0:
            fails.append("wkvm-tokdump: %s %s" % (a.stderr[-300:], b.stderr[-300:]))
        else:
            la = a.stdout.decode().splitlines()[1:]  # the digest differs: not the same bytes
            lb = b.stdout.decode().splitlines()[1:]
            ok = la == lb
            print("%-4s tokenizer from tokenizer.ggml.tokens: %s ids/bytes as from %s"
                  % ("ok" if ok else "FAIL", la[1].split()[-1], os.path.basename(VOCAB)))
            n_ok += ok
            if not ok:
                diff = [(x, y) for x, y in zip(la, lb) if x != y][:3]
                fails.append("tokdump of the .gguf differs from the vocab file: %s" % diff)
        bad = []
        for s in TEXTS:
            e1 = run([INFER, "--model", rw32, "--encode"], input=s.encode("utf-8"))
            e2 = run([INFER, "--model", rw32 + "-gguf", "--encode"], input=s.encode("utf-8"))
            if e1.returncode or e2.returncode or e1.stdout != e2.stdout:
                bad.append((s[:20], e1.stdout[:40], e2.stdout[:40], e2.stderr[-200:]))
        print("%-4s wkvm-infer --encode of %d texts: same ids from the .gguf alone as from the "
              "vocab file" % ("FAIL" if bad else "ok", len(TEXTS)))
        n_ok += not bad
        if bad:
            fails.append("--encode differs: %s" % bad[:2])

        # --- refused files ------------------------------------------------------------------
        m2 = os.path.join(tmp, "mamba2-G2-untied-f32-gguf", "model-f32.gguf")
        r = gguf.GGUFReader(m2)
        ssm_d = next(t for t in r.tensors if t.name == "blk.0.ssm_d").data
        out_w = next(t for t in r.tensors if t.name == "blk.1.ssm_out.weight").data
        bad_cases = [
            ("another architecture", dict(arch="llama"), 'general.architecture "llama"'),
            ("rwkv7 arch on mamba2 tensors", dict(arch="rwkv7"), "rwkv7.block_count"),
            ("missing tensor", dict(drop=("blk.1.ssm_out.weight",)),
             "backbone.layers.1.mixer.out_proj.weight: missing (GGUF blk.1.ssm_out.weight)"),
            ("wrong shape ssm_d", dict(replace={"blk.0.ssm_d": np.concatenate(
                [ssm_d, ssm_d[:1]])}), "blk.0.ssm_d: expected [8, 1]"),
            ("transposed ssm_out", dict(replace={"blk.1.ssm_out.weight": np.ascontiguousarray(
                out_w.T)}), "(GGUF blk.1.ssm_out.weight)"),
        ]
        for what, kw, want in bad_cases:
            d = os.path.join(tmp, "bad-" + what.replace(" ", "-"))
            os.makedirs(d)
            shutil.copy(os.path.join(os.path.dirname(m2), "tokenizer.json"), d)
            rewrite(gguf, m2, os.path.join(d, "bad.gguf"), **kw)
            p = run([INFER, "--model", d, "--tokens", "1,2", "--generate", "1"])
            err = p.stderr.decode("utf-8", "replace")
            ok = p.returncode != 0 and want in err
            print("%-4s refused, %s: %s" % ("ok" if ok else "FAIL", what,
                                            err.strip().splitlines()[0] if err else "(none)"))
            n_ok += ok
            if not ok:
                fails.append("%s: exit %d, want %r in %r" % (what, p.returncode, want, err[-400:]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for f in fails:
        print("FAIL " + f)
    print("%s: %d passed, %d failed" % (NAME, n_ok, len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
        print("FAIL %s" % e)
        print("%s: 0 passed, 1 failed" % NAME)
        sys.exit(1)
