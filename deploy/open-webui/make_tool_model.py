#!/usr/bin/env python3
"""Generates the Open WebUI kit's tool-calling demo model: a small random-weight
Qwen3.5 (tests/reference/gen_qwen35.py, 4 layers, a 512-token raw-byte BPE
vocabulary with Qwen3.5's special tokens added) carrying Qwen3.5's real chat
template (llama.cpp's models/templates/Qwen3.5-4B.jinja, copied to the model
dir as chat_template.jinja), the same construction as
tests/integration/test_tool_constrained.py.

Its weights are random: it never decides to call a tool by itself. The smoke
makes the call happen with a named tool_choice, which wkvm enforces by
constrained decoding (docs/OPENAI_COMPAT.md, "Constrained tool calls"); see
docs/OPEN_WEBUI.md, "Tools and native function calling".

    make_tool_model.py --out DIR [--template Qwen3.5-4B.jinja]

Runs with a Python that has numpy (Debian's /usr/bin/python3).
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "..", "tests", "reference")
# ids 507..511: the template's markers, and "\n</parameter>\n" as one token
ADDED = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "\n</parameter>\n"]
VOCAB = 512


def find_template():
    """Qwen3.5's template from the llama.cpp converter cache (deploy/install-gguf-converter)."""
    cache = os.environ.get("WKVM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "wkvm")
    hits = sorted(glob.glob(os.path.join(cache, "llama.cpp-convert-*", "models", "templates",
                                         "Qwen3.5-4B.jinja")), reverse=True)
    return hits[0] if hits else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--template", help="Qwen3.5's chat template (default: the converter cache's)")
    ap.add_argument("--seed", type=int, default=23)
    a = ap.parse_args()
    template = a.template or find_template()
    if not template or not os.path.exists(template):
        sys.exit("make_tool_model: no Qwen3.5-4B.jinja: run deploy/install-gguf-converter "
                 "(it keeps llama.cpp's models/templates) or pass --template")
    tmp = a.out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([sys.executable, os.path.join(REF, "gen_qwen35.py"), "--out", tmp,
                    "--seed", str(a.seed), "--layers", "4", "--interval", "2",
                    "--vocab", str(VOCAB)], check=True, timeout=300)
    sys.path.insert(0, REF)
    import bpe_json
    base = VOCAB - len(ADDED)
    tj = bpe_json.tokenizer_json(base)
    for i, c in enumerate(ADDED):
        tj["model"]["vocab"][c] = base + i
        tj["added_tokens"].append({"id": base + i, "content": c, "single_word": False,
                                   "lstrip": False, "rstrip": False, "normalized": False,
                                   "special": i < 2})
    with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f)
    shutil.copyfile(template, os.path.join(tmp, "chat_template.jinja"))
    shutil.rmtree(a.out, ignore_errors=True)
    os.rename(tmp, a.out)
    print(a.out)


if __name__ == "__main__":
    main()
