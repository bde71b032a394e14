#!/usr/bin/env python3
"""Runs llama.cpp's convert_hf_to_gguf.py (argv[1]) with the rest of argv, on
Debian's torch 1.13: the converter names dtypes that torch added later
(float8_*, uint16/32/64) in a lookup table at import time. They are stand-ins
here, never used for a bf16/f32 checkpoint (a checkpoint in those dtypes would
fail loudly in the converter). Used by bench/chat.py's llama mode.

    build/peer/venv/bin/python bench/gguf-convert.py build/peer/llama.cpp/convert_hf_to_gguf.py \\
        MODEL_DIR --outtype bf16 --outfile model.gguf
"""
import os
import runpy
import sys

import torch

for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
             "float8_e8m0fnu", "float4_e2m1fn_x2", "uint16", "uint32", "uint64"):
    if not hasattr(torch, name):
        setattr(torch, name, torch.uint8 if name.startswith("float") else torch.int64)

if len(sys.argv) < 2:
    raise SystemExit("usage: gguf-convert.py CONVERT_HF_TO_GGUF.PY ARGS...")
script = os.path.abspath(sys.argv[1])
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(script))
runpy.run_path(script, run_name="__main__")
