#!/usr/bin/python3
"""Writes small byte-level BPE tokenizer.json files (the Hugging Face
`tokenizers` format used by GPT-NeoX / Mamba2 / fla checkpoints) for the test
models of the non-RWKV families, and small Llama-2 style (SentencePiece BPE,
"hf-spm") ones with a reference encoder (write_spm_tokenizer_json,
spm_encode).

Layout: id 0 is the special token <|endoftext|> (as in GPT-NeoX), ids 1..256
are the 256 byte symbols of the GPT-2 byte-level alphabet, and the remaining
ids come from BPE merges learnt on a small fixed English corpus, in rank
order, until vocab_size ids exist or no pair is left. Deterministic: the
same vocab_size always gives the same file.

Usage: bpe_json.py OUT_PATH VOCAB_SIZE
"""

import collections
import json
import sys

_CORPUS = (
    "the of and to in is was for that on as with by he it at from his an "
    "were are which this be or has had not but first one their its new after "
    "who they have her she two been other when there all during into school "
    "time may years more most only over city some world would where later up "
    "such used many can state about national out known university united then "
    "made no you we what so if do like just people think good very see make "
    "hello model state token water light house story small large great little "
    "Hello, world! The quick brown fox jumps over the lazy dog. 12345 67890 "
    "User: Assistant: System: question answer thanks please"
)


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def _words():
    b2u = bytes_to_unicode()
    out = []
    for i, w in enumerate(_CORPUS.split(" ")):
        raw = (" " + w if i else w).encode("utf-8")
        out.append(tuple(b2u[b] for b in raw))
    return out


def build(vocab_size):
    """(vocab dict, merges list) for vocab_size ids (at least 257)."""
    if vocab_size < 257:
        raise ValueError("vocab_size %d < 257 (special + 256 bytes)" % vocab_size)
    b2u = bytes_to_unicode()
    vocab = {"<|endoftext|>": 0}
    for b in range(256):
        vocab[b2u[b]] = 1 + b
    merges = []
    words = collections.Counter(_words())
    while len(vocab) < vocab_size:
        pairs = collections.Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        tok = best[0] + best[1]
        if tok in vocab:  # already made by another merge: keep the merge, no new id
            merges.append(best)
        else:
            vocab[tok] = len(vocab)
            merges.append(best)
        nw = collections.Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(tok)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            nw[tuple(out)] += c
        words = nw
    return vocab, merges


def tokenizer_json(vocab_size):
    vocab, merges = build(vocab_size)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": 0, "content": "<|endoftext|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": [a + " " + b for a, b in merges]},
    }


def write_tokenizer_json(path, vocab_size):
    """Writes tokenizer.json (and returns the number of ids it defines)."""
    tj = tokenizer_json(vocab_size)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False, indent=1)
    return len(tj["model"]["vocab"])


SPM_MS = "\u2581"  # the SentencePiece space mark


def spm_build(vocab_size):
    """(vocab dict, merges list) of a Llama-2 style tokenizer: <unk>=0, <s>=1,
    </s>=2, "<0x00>".."<0xFF>" = 3..258, then "\u2581" and the corpus's
    characters, then merges learnt on the corpus words written "\u2581word",
    in rank order, until vocab_size ids exist or no pair is left."""
    if vocab_size < 300:
        raise ValueError("vocab_size %d < 300" % vocab_size)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = 3 + b
    words = collections.Counter(tuple(SPM_MS + w) for w in _CORPUS.split(" "))
    for ch in sorted({c for w in words for c in w}, key=lambda c: (c != SPM_MS, c)):
        vocab[ch] = len(vocab)
    merges = []
    while len(vocab) < vocab_size:
        pairs = collections.Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        tok = best[0] + best[1]
        merges.append(best)
        if tok not in vocab:
            vocab[tok] = len(vocab)
        nw = collections.Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(tok)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            nw[tuple(out)] += c
        words = nw
    return vocab, merges


def spm_tokenizer_json(vocab_size):
    """The tokenizer.json of the Llama-2 conversion: normalizer Prepend +
    Replace, no pre-tokenizer, byte fallback, Llama decoder."""
    vocab, merges = spm_build(vocab_size)
    special = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True}
               for i, c in enumerate(["<unk>", "<s>", "</s>"])]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": SPM_MS},
            {"type": "Replace", "pattern": {"String": " "}, "content": SPM_MS}]},
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPM_MS}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [a + " " + b for a, b in merges]},
    }


def write_spm_tokenizer_json(path, vocab_size):
    """Writes a Llama-2 style tokenizer.json (and returns the number of ids it defines)."""
    tj = spm_tokenizer_json(vocab_size)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False, indent=1)
    return len(tj["model"]["vocab"])


def spm_encode(vocab_size, text, prepend=True):
    """Reference encoding of text (no added tokens in it) with the tokenizer
    of spm_build(vocab_size), as `tokenizers` does: Prepend (when prepend;
    False is a continuation of earlier text), spaces to "\u2581", characters
    as symbols or their UTF-8 bytes' "<0xXX>", then the lowest-rank merge,
    leftmost first, until none applies."""
    vocab, merges = spm_build(vocab_size)
    rank = {m: i for i, m in enumerate(merges)}
    norm = (SPM_MS if prepend and text else "") + text.replace(" ", SPM_MS)
    syms = []
    for ch in norm:
        if ch in vocab:
            syms.append(ch)
        else:
            syms.extend("<0x%02X>" % b for b in ch.encode("utf-8"))
    while len(syms) > 1:
        best = min(range(len(syms) - 1),
                   key=lambda i: (rank.get((syms[i], syms[i + 1]), 1 << 30), i))
        if (syms[best], syms[best + 1]) not in rank:
            break
        syms[best:best + 2] = [syms[best] + syms[best + 1]]
    return [vocab[s] for s in syms]


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: bpe_json.py OUT_PATH VOCAB_SIZE")
    n = write_tokenizer_json(sys.argv[1], int(sys.argv[2]))
    print("wrote %s: %d ids" % (sys.argv[1], n))
