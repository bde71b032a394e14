#!/usr/bin/env python3
"""Converts a Qwen3.5 checkpoint directory (config.json + safetensors, e.g. from
tests/reference/gen_qwen35.py) to GGUF with llama.cpp's own converter, for the
benchmarks that run llama.cpp on the same weights as wkvm.

A random benchmark model has no tokenizer of its own, and the converter needs
one: this writes a Hugging Face tokenizer.json / tokenizer_config.json built
from llama.cpp's test vocabulary models/ggml-vocab-qwen35.gguf (a Qwen
byte-level BPE vocabulary with the Qwen3.5 pre-tokenizer: tokens, merges,
control tokens; a model smaller than it gets its first vocab_size tokens and
the merges among them; the placeholder [PAD<id>] entries are left out, as the
converter writes them back) beside links to the checkpoint's files, and tells the
converter that the pre-tokenizer is "qwen35" (its hash check only knows the
released tokenizers). The vocabulary is padded to the model's vocab_size by
the converter, as for a real model. Token ids are all a benchmark feeds.

    PYTHON bench/qwen35-gguf.py CONVERTER_DIR MODEL_DIR OUT.gguf [--outtype bf16|f32|f16|q8_0]
                                [--config-json]

The same conversion serves the other families llama.cpp's converter reads
from a random model (Nemotron-H: tests/reference/upstream_nemotron_h.py and
the bench/peer_cpu.py benchmark in docs/PERFORMANCE.md). --config-json makes
the converter read config.json as written instead of transformers'
AutoConfig of it: AutoConfig fills in the defaults of every key, and for a
dense Nemotron-H (the older hybrid_override_pattern config, no MoE keys)
its default num_experts_per_tok turns the file into a nemotron_h_moe GGUF
that llama.cpp cannot load (it has no dense layers); with the config as
written it is a "nemotron_h" file, as the released dense models' are.

CONVERTER_DIR: deploy/install-gguf-converter's directory (convert_hf_to_gguf.py,
gguf-py, models/ggml-vocab-qwen35.gguf). PYTHON needs torch, transformers 5
and numpy (deploy/install-ref-venv --fla's venv).
"""
import json
import os
import runpy
import shutil
import sys
import tempfile


def write_tokenizer(conv_dir, out_dir, vocab_size):
    sys.path.insert(0, os.path.join(conv_dir, "gguf-py"))
    import gguf
    r = gguf.GGUFReader(os.path.join(conv_dir, "models", "ggml-vocab-qwen35.gguf"))

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def ints(key):
        f = r.fields[key]
        return [int(f.parts[i][0]) for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = strings("tokenizer.ggml.merges")
    types = ints("tokenizer.ggml.token_type")
    eos = ints("tokenizer.ggml.eos_token_id")[0]
    pattern = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?"
               "[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    if len(tokens) > vocab_size:  # a small test model: the first vocab_size tokens
        tokens, types = tokens[:vocab_size], types[:vocab_size]
        eos = eos if eos < vocab_size else vocab_size - 1
        # the merges among them; none making or using the eos, which the converter then
        # writes as a control token (a merge result outside the BPE vocab)
        have = set(tokens) - {tokens[eos]}
        merges = [m for m in merges if m.replace(" ", "", 1) in have and
                  all(p in have for p in m.split(" ", 1))]
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i, t in enumerate(tokens) if types[i] == 3]
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  # the control tokens in the vocab too, as Qwen's own tokenizer.json: without
                  # them the converter writes [PAD<id>] fillers in their place (eos included)
                  "vocab": {t: i for i, t in enumerate(tokens) if types[i] in (1, 3)},
                  "merges": [m.split(" ", 1) for m in merges]},
    }
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": tokens[eos],
                   "unk_token": None, "bos_token": None,
                   "pad_token": tokens[eos], "model_max_length": 262144}, f)


def main():
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    conv_dir, model_dir, out = (os.path.abspath(a) for a in sys.argv[1:4])
    outtype = "bf16"
    rest = sys.argv[4:]
    config_json = "--config-json" in rest
    rest = [x for x in rest if x != "--config-json"]
    if len(rest) >= 2 and rest[0] == "--outtype":
        outtype = rest[1]
    tmp = tempfile.mkdtemp(prefix="wkvm-q35-gguf-")
    try:
        for name in os.listdir(model_dir):
            if name.endswith((".safetensors", ".json")) and not name.startswith("tokenizer"):
                os.symlink(os.path.join(model_dir, name), os.path.join(tmp, name))
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        write_tokenizer(conv_dir, tmp, cfg.get("text_config", cfg)["vocab_size"])
        sys.path.insert(0, conv_dir)
        sys.path.insert(0, os.path.join(conv_dir, "gguf-py"))
        from conversion import base
        base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen35"
        if config_json:
            def load_config(dir_model, is_mistral_format):
                with open(os.path.join(str(dir_model), "config.json")) as f:
                    return json.load(f)
            base.ModelBase.load_hparams = staticmethod(load_config)
        sys.argv = ["convert_hf_to_gguf.py", tmp, "--outtype", outtype, "--outfile", out]
        # a benchmark model has no MTP layers; the converter refuses the flag for Granite
        if not any(x.startswith("GraniteMoeHybrid") for x in cfg.get("architectures", [])):
            sys.argv.append("--no-mtp")
        runpy.run_path(os.path.join(conv_dir, "convert_hf_to_gguf.py"), run_name="__main__")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
