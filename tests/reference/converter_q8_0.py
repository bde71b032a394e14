"""The values llama.cpp's convert_hf_to_gguf.py --outtype q8_0 stores, in numpy.

For the reference tests that check a converter's Q8_0 GGUF against
transformers on the same values: write_rounded_copy writes a copy of a
checkpoint directory whose model.safetensors (float32) holds, per tensor,
what the converter's file will hold dequantized:
  - vectors (ndim <= 1), norms, the conv weights and the routers (the
    converter's always-F32 list: SSM_CONV1D, FFN_GATE_INP) as they are;
  - every other matrix (projections, experts, embedding, head) as d * q of
    its Q8_0 blocks along the last dim (ggml's quantize_row_q8_0_ref,
    test_q8_0_parity.q8_0_rows), or rounded to float16 when that dim is not
    a multiple of 32 (the converter's fallback).
Q8_0 of d * q gives back the same d and q (the largest |x| of a block is
127 |d|, and 127 |d| / 127 and x / d are exact in float32), so converting the
copy writes the blocks converting the original would, and transformers run
on the copy is the reference for that file. Values the converter computes
itself (A = -exp(A_log)) are left to the caller.
"""
import os
import re
import shutil

import numpy as np

from test_q8_0_parity import q8_0_rows

# kept as stored: the converter's F32 tensors (names of transformers' checkpoints)
KEEP = re.compile(r"(conv1d\.weight|mixer\.gate\.weight|router\.layer\.weight|norm\.weight)$")


def rounded(name, w):
    """(value the converter's Q8_0 file holds for tensor `name`, 'q8_0' | 'f16' | None)."""
    if w.ndim <= 1 or KEEP.search(name):
        return w, None
    flat = np.asarray(w, dtype=np.float32).reshape(-1, w.shape[-1])
    if w.shape[-1] % 32:
        return flat.astype(np.float16).astype(np.float32).reshape(w.shape), "f16"
    return q8_0_rows(flat).astype(np.float32).reshape(w.shape), "q8_0"


def write_rounded_copy(src, dst):
    """dst: src's files with model.safetensors replaced by the rounded float32 values;
    returns {'q8_0': n, 'f16': n} (tensors rounded each way)."""
    from safetensors.numpy import load_file, save_file
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f != "model.safetensors" and os.path.isfile(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    out, n = {}, {"q8_0": 0, "f16": 0}
    for k, w in load_file(os.path.join(src, "model.safetensors")).items():
        w = w.astype(np.float32) if w.dtype != np.float32 else w
        out[k], how = rounded(k, w)
        if how:
            n[how] += 1
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return n
