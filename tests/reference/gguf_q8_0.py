#!/usr/bin/python3
"""A Q8_0 GGUF written by llama.cpp's own converter and `wkvm-infer
--quantize q8_0` of the same fp32 checkpoint hold the same Q8_0 blocks.

llama.cpp's convert_hf_to_gguf.py --outtype q8_0 (from the llama-cpp-python
sdist, deploy/install-gguf-converter, run through bench/gguf-convert.py in the
deploy/install-ref-venv venv) converts a small random fp32 RWKV-7 model
(wkvm-mkmodel, HF layout, the real World vocab). The converter quantizes the
embedding too (token_embd), which wkvm keeps as stored; so a copy of the
safetensors model gets the GGUF's dequantized embedding (d * q, exact in
fp32), every other tensor unchanged. Then:
  - the directory holding only the .gguf, and that copy run with
    --quantize q8_0, must give bit-identical logits and the same greedy ids:
    the matrices wkvm quantizes, and how, are the converter's (a different
    rounding of one block, or a matrix quantized by one and not the other,
    changes the logits);
  - the copy without --quantize must differ (the comparison can fail).

Exit 0 when they agree, 1 when not, 77 (skip) only when pip cannot reach a
package index for the venv or the sdist, or wkvm is not built.
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import upstream_venv  # noqa: E402

NAME = "gguf_q8_0"
upstream_venv.enter(NAME, ["transformers", "torch", "numpy", "rwkv", "safetensors"])

import numpy as np  # noqa: E402
import rwkv  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

SRC = upstream_venv.SRC
INSTALL = os.path.join(SRC, "deploy", "install-gguf-converter")
SHIM = os.path.join(SRC, "bench", "gguf-convert.py")
VOCAB = os.path.join(os.path.dirname(os.path.abspath(rwkv.__file__)), "rwkv_vocab_v20230424.txt")
BUILD = upstream_venv.build_dir()
INFER = os.path.join(BUILD, "tools", "wkvm-infer")
MKMODEL = os.path.join(BUILD, "tools", "wkvm-mkmodel")


def run(cmd, timeout=600):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)


def converter_dir():
    p = run([INSTALL, sys.executable], timeout=1200)
    err = p.stderr.decode("utf-8", "replace").strip()
    if p.returncode == 2:
        if any(h.lower() in err.lower() for h in upstream_venv.NETWORK_HINTS):
            upstream_venv.skip(NAME, err[-2000:])
        raise RuntimeError("install-gguf-converter: pip failed:\n" + err[-3000:])
    if p.returncode != 0:
        raise RuntimeError("install-gguf-converter exit %d: %s" % (p.returncode, err[-2000:]))
    return p.stdout.decode().strip().splitlines()[-1]


def infer(mdir, tokens, out, extra):
    cmd = [INFER, "--model", mdir, "--tokens", ",".join(map(str, tokens)), "--logits-out", out,
           "--threads", "2", "--generate", "12"] + extra
    p = run(cmd, timeout=300)
    if p.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), p.returncode,
                                                p.stderr.decode("utf-8", "replace")[-1000:]))
    with open(out, "rb") as f:
        return f.read(), p.stdout.decode().split()


def main():
    for exe in (INFER, MKMODEL):
        if not os.access(exe, os.X_OK):
            upstream_venv.skip(NAME, "%s is not built" % exe)
    conv = converter_dir()
    sys.path.insert(0, os.path.join(conv, "gguf-py"))
    import gguf
    tmp = tempfile.mkdtemp(prefix="wkvm-gguf-q8-")
    try:
        src = os.path.join(tmp, "rwkv7-f32")
        p = run([MKMODEL, "--out", src, "--vocab-file", VOCAB, "--layers", "2", "--embd", "64",
                 "--head-size", "32", "--dtype", "f32", "--seed", "23"])
        if p.returncode != 0:
            raise RuntimeError("wkvm-mkmodel: %s" % p.stderr.decode()[-500:])
        gdir = os.path.join(tmp, "gguf")
        os.makedirs(gdir)
        gpath = os.path.join(gdir, "model-q8_0.gguf")
        p = run([sys.executable, SHIM, os.path.join(conv, "convert_hf_to_gguf.py"), src,
                 "--outtype", "q8_0", "--outfile", gpath], timeout=1200)
        if p.returncode != 0:
            raise RuntimeError("converter: %s" % p.stderr.decode()[-3000:])
        r = gguf.GGUFReader(gpath)
        nq = sum(t.tensor_type == gguf.GGMLQuantizationType.Q8_0 for t in r.tensors)
        emb_t = [t for t in r.tensors if t.name == "token_embd.weight"][0]
        emb = gguf.quants.dequantize(emb_t.data, emb_t.tensor_type).astype(np.float32)
        copy = os.path.join(tmp, "rwkv7-f32-embq")
        os.makedirs(copy)
        for fn in os.listdir(src):
            if fn != "model.safetensors":
                shutil.copy(os.path.join(src, fn), copy)
        st = load_file(os.path.join(src, "model.safetensors"))
        st["model.embeddings.weight"] = emb.reshape(st["model.embeddings.weight"].shape)
        save_file(st, os.path.join(copy, "model.safetensors"))

        tokens = [1, 72, 101, 108, 108, 111, 44, 33, 261, 3, 200, 17, 99, 250, 5, 44] * 2
        a, ga = infer(gdir, tokens, os.path.join(tmp, "a.bin"), [])
        b, gb = infer(copy, tokens, os.path.join(tmp, "b.bin"), ["--quantize", "q8_0"])
        c, _ = infer(copy, tokens, os.path.join(tmp, "c.bin"), [])
        checks = [
            ("GGUF (%d Q8_0 tensors) == --quantize q8_0: logits bit-identical" % nq, a == b),
            ("greedy ids the same", ga == gb),
            ("without --quantize the logits differ", a != c),
        ]
        nfail = 0
        for what, ok in checks:
            print("%-4s %s" % ("ok" if ok else "FAIL", what))
            nfail += not ok
        print("%s: %d passed, %d failed" % (NAME, len(checks) - nfail, nfail))
        return 1 if nfail else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
