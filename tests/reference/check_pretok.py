#!/usr/bin/python3
"""Checks wkvm's regex pre-tokenizers (common/text/wk_pretok.c behind wk_bpe) and
its byte-level BPE tokenizers from GGUF metadata against Hugging Face.

Usage: check_pretok.py TOKDUMP

1. llama.cpp's tokenizer test pairs (deploy/install-gguf-converter keeps
   models/ggml-vocab-*.gguf with .inp texts and .out ids, the ids Hugging
   Face's tokenizer gives): every text of every supported vocab is encoded
   by `TOKDUMP X.gguf encode` from the GGUF alone, and must give the .out
   ids; falcon (not supported) must be refused with its name in the diag,
   gpt-neox (no tokenizer.ggml.pre) as such.
2. `tokenizers` itself: tokenizer.json files are built here from those GGUF
   vocabularies (tokens, merges, added tokens) with the real pre_tokenizer
   JSON of Qwen2, Qwen3.5 (no normalizer), Llama-3 (ignore_merges), a
   GPT-4o-style pattern, DeepSeek-Coder and StarCoder (Digits), Qwen2 with
   single_word / lstrip / rstrip / normalized added tokens (its strings keep
   to characters Unicode 14 assigns: single_word's \\w has Unicode 15
   tables in tokenizers, 14 in PCRE2 10.42), and two made-up Sequences that use every Split behavior, invert, String
   patterns, empty matches and ^/$. Generated strings (WKVM_PRETOK_N,
   default 100000: 30% of it for Qwen3.5, 10% for each other file, 110000
   in all; random code points of many scripts, digit and whitespace runs
   with \\r\\n\\t and Unicode spaces, emoji and ZWJ sequences, contractions
   in mixed case, the added tokens embedded, and invalid UTF-8 in one
   string in eight) go through Tokenizer.encode_batch(add_special_tokens=
   False) and through one `TOKDUMP FILE encode` process per file; the ids
   must be the same. For a string with invalid UTF-8, wkvm's documented
   rule is checked: the expected ids are those of each well-formed run
   encoded alone, with each other byte as its own byte token. The real
   vocabularies are also loaded from the GGUF files, and must agree with
   the tokenizer.json built here.

Runs under the venv of deploy/install-ref-venv (tokenizers); exits 77 only
when that venv or the converter cannot be installed (no package index).
"""
import json
import os
import random
import re
import struct
import subprocess
import sys
import tempfile
import time
import unicodedata
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import upstream_venv  # noqa: E402

NAME = "pretok_reference"
SRC = upstream_venv.SRC
SUPPORTED = ["gpt-2", "llama-bpe", "qwen2", "qwen35", "deepseek-llm", "deepseek-coder",
             "starcoder", "refact", "command-r", "mpt"]
# refused GGUF vocabularies: what the diag must say
REFUSED = {"falcon": 'tokenizer.ggml.pre "falcon" is not supported',
           "gpt-neox": "without tokenizer.ggml.pre"}

QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}"
          r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
         r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
         r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
         r"[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def split(pat, behavior="Isolated", invert=False, kind="Regex"):
    return {"type": "Split", "pattern": {kind: pat}, "behavior": behavior, "invert": invert}


def bytelevel(use_regex=False):
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
            "use_regex": use_regex}


def seq(*members):
    return {"type": "Sequence", "pretokenizers": list(members)}


NFC = {"type": "NFC"}
# name: (vocab, normalizer, pre_tokenizer, ignore_merges, the GGUF pre that must agree)
CONFIGS = {
    "qwen2": ("qwen2", NFC, seq(split(QWEN2), bytelevel()), False, "qwen2"),
    "qwen35": ("qwen35", None, seq(split(QWEN35), bytelevel()), False, "qwen35"),
    "llama3": ("llama-bpe", None, seq(split(LLAMA3), bytelevel()), True, "llama-bpe"),
    "gpt4o": ("qwen2", None, seq(split(GPT4O), bytelevel()), False, None),
    "deepseek-coder": ("deepseek-coder", None,
                       seq(split(r"[\r\n]"), split(r"\s?\p{L}+"), split(r"\s?\p{P}+"),
                           split("[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"),
                           {"type": "Digits", "individual_digits": True}, bytelevel()),
                       False, "deepseek-coder"),
    "starcoder": ("starcoder", None, seq({"type": "Digits", "individual_digits": True},
                                         bytelevel(True)), False, "starcoder"),
    # lstrip / rstrip added tokens, some of them normalized (matched after NFC)
    "addedflags": ("qwen2", NFC, seq(split(QWEN2), bytelevel()), False, None),
    "behaviors1": ("qwen2", NFC,
                   seq(split("<>", "MergedWithNext", kind="String"),
                       split(r"\p{N}+", "Contiguous"),
                       split(r"[,.;]", "MergedWithPrevious"),
                       split(r"\s+", "MergedWithNext", invert=True),
                       split(r"x*"),
                       split(r"^\s|\s$", "Removed"),
                       bytelevel()), False, None),
    "behaviors2": ("qwen2", None,
                   seq(split(r"(?i:ab|ſt)", "Removed", invert=True),
                       split("'", "Contiguous", kind="String"),
                       split(r"(?<=\p{L})(?=\p{N})|$"),
                       split(r"[\p{Han}\p{Hiragana}]+", "MergedWithPrevious", invert=True),
                       {"type": "Digits", "individual_digits": False},
                       bytelevel(True)), False, None),
}

# WKVM_PRETOK_ASSIGNED=1: only characters assigned in this Python's Unicode
ASSIGNED_ONLY = os.environ.get("WKVM_PRETOK_ASSIGNED") == "1"
# the share of WKVM_PRETOK_N each config gets (the rest: 0.1 each)
SHARE = {"qwen35": 0.3}

SCRIPTS = [(0x41, 0x7a), (0xc0, 0x24f), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x4ff),
           (0x530, 0x58f), (0x590, 0x5ff), (0x600, 0x6ff), (0x900, 0x97f), (0xe00, 0xe7f),
           (0x10a0, 0x10ff), (0x1100, 0x11ff), (0x1e00, 0x1fff), (0x2000, 0x206f),
           (0x2100, 0x218f), (0x2460, 0x24ff), (0x3040, 0x30ff), (0x4e00, 0x9fff),
           (0xac00, 0xd7a3), (0xff00, 0xffef), (0x1d400, 0x1d7ff), (0x1f300, 0x1faff),
           (0x20000, 0x2a6df), (0xe0000, 0xe007f), (0x10400, 0x1044f)]
SPACES = [" ", " ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\u00a0", "\u2003",
          "\u3000", "\u0085", "\u2028", "\u2029", "\u180e", "\u200b", "\ufeff",
          "\u000b", "\u000c", "\u1680", "\u202f", "\u205f"]
DIGITS = "0123456789\u0660\u0661\u06f5\u0966\u0e51\uff11\u00b2\u00bd\u2167\u2460\u3007" \
         "\U0001d7ce\U00011f50\U0001d2c0"
WORDS = ["the", "The", "HELLO", "don't", "DON'T", "we'Re", "I'M", "you'LL", "she'D", "it'S",
         "they've", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'x", "’s", "ſ", "'ſ",
         "\u212a", "'\u212a", "İstanbul", "ß", "ﬀ", "ǅ", "café", "cafe\u0301", "é", "e\u0301",
         "Ελληνικά", "Привет", "日本語", "中文", "한국어", "مرحبا", "हिन्दी", "ไทย", "😀",
         "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "❤\ufe0f", "1️⃣", "a+b=c", "foo()", "{x: 1}",
         "--flag", "#include", "...", "!!", "«»", "—", "€100", "x/y", "http://a.b/c",
         "ab", "AB", "ſt", "xx", "<>", ",", ";", ".", "a1", "z9", "ー", "々"]


def gen_piece(rng, added):
    k = rng.random()
    if k < 0.30:
        return rng.choice(WORDS)
    if k < 0.45:
        return "".join(rng.choice(SPACES) for _ in range(rng.randint(1, 4)))
    if k < 0.55:
        return "".join(rng.choice(DIGITS) for _ in range(rng.randint(1, 8)))
    if k < 0.75:
        lo, hi = rng.choice(SCRIPTS)
        return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 5)))
    if k < 0.80 and added:
        return rng.choice(added)
    if k < 0.90:
        out = []
        for _ in range(rng.randint(1, 4)):
            c = rng.randint(1, 0x10ffff)
            while 0xd800 <= c < 0xe000:
                c = rng.randint(1, 0x10ffff)
            out.append(chr(c))
        return "".join(out)
    return rng.choice(["'", "’", "-", "_", "/", "\\", "\"", "@", "$", "%", "^", "~", "|"])


def gen_strings(n, added, seed=20261203, assigned_only=False):
    """n strings as bytes; one in eight carries invalid UTF-8. assigned_only:
    only characters Python's Unicode (14.0) assigns."""
    rng = random.Random(seed)
    out = []
    bad_bytes = [b"\xff", b"\xc0", b"\x80", b"\xe2\x82", b"\xed\xa0\x80", b"\xf0\x9f\x98",
                 b"\xc3", b"\xfe\xfe", b"\xf4\x90\x80\x80"]
    for i in range(n):
        parts = [gen_piece(rng, added) for _ in range(rng.randint(1, 8))]
        text = "".join(parts)
        if ASSIGNED_ONLY or assigned_only:
            text = "".join(c for c in text if unicodedata.category(c) != "Cn")
        b = text.encode("utf-8")
        if rng.random() < 0.125:
            for _ in range(rng.randint(1, 3)):
                p = rng.randint(0, len(b))
                b = b[:p] + rng.choice(bad_bytes) + b[p:]
        out.append(b)
    return out


ESCAPED = re.compile("([\udc80-\udcff])")


def valid_runs(b):
    """Splits b into ('text', str) and ('byte', int) items, as wk_pretok does:
    the bytes outside well-formed UTF-8 are those surrogateescape escapes
    (each byte of a maximal ill-formed subpart; none of them can start a
    well-formed character)."""
    try:
        return [("text", b.decode("utf-8"))] if b else []
    except UnicodeDecodeError:
        pass
    items = []
    for part in ESCAPED.split(b.decode("utf-8", "surrogateescape")):
        if len(part) == 1 and "\udc80" <= part <= "\udcff":
            items.append(("byte", ord(part) - 0xdc00))
        elif part:
            items.append(("text", part))
    return items


def is_valid(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def bytes_to_unicode():
    bs = list(range(0x21, 0x7f)) + list(range(0xa1, 0xad)) + list(range(0xae, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


B2U = bytes_to_unicode()
ALPHA = set(B2U.values())


SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
          11: "<q", 12: "<d"}


def read_vocab(conv, name):
    """tokens, types, merges of models/ggml-vocab-NAME.gguf (a small GGUF
    metadata reader: gguf-py takes 6 s per vocabulary)."""
    with open(os.path.join(conv, "models", "ggml-vocab-%s.gguf" % name), "rb") as f:
        buf = f.read()
    if buf[:4] != b"GGUF":
        raise RuntimeError("%s: not a GGUF file" % name)
    off = 8 + 8
    n_kv = struct.unpack_from("<Q", buf, off)[0]
    off += 8

    def string(off):
        n = struct.unpack_from("<Q", buf, off)[0]
        return buf[off + 8:off + 8 + n].decode("utf-8"), off + 8 + n

    def value(t, off):
        if t in SCALAR:
            fmt = SCALAR[t]
            return struct.unpack_from(fmt, buf, off)[0], off + struct.calcsize(fmt)
        if t == 8:
            return string(off)
        et, n = struct.unpack_from("<IQ", buf, off)
        off += 12
        if et in SCALAR:
            fmt = SCALAR[et]
            sz = struct.calcsize(fmt)
            return list(struct.unpack_from("<%d%s" % (n, fmt[1]), buf, off)), off + n * sz
        out = []
        for _ in range(n):
            v, off = value(et, off)
            out.append(v)
        return out, off
    kv = {}
    for _ in range(n_kv):
        k, off = string(off)
        t = struct.unpack_from("<I", buf, off)[0]
        kv[k], off = value(t, off + 4)
    return (kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"],
            kv["tokenizer.ggml.merges"])


def build_json(tokens, types, merges, normalizer, pre, ignore_merges):
    vocab, added = {}, []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (3, 4):
            added.append({"id": i, "content": t, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": ty == 3})
            # in the model's vocab too, as in real files: `tokenizers` keeps the
            # id of an added token only when the vocab has it (or it comes last)
            vocab.setdefault(t, i)
        elif ty != 5 and all(c in ALPHA for c in t):
            vocab[t] = i
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges}}, added


def tokdump_encode(exe, path, strings):
    data = "".join(s.hex() + "\n" for s in strings)
    p = subprocess.run([exe, path, "encode"], input=data, capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        raise RuntimeError("%s: %s" % (path, p.stderr.strip()[-800:]))
    lines = p.stdout.split("\n")
    return [[int(x) for x in ln.split()] for ln in lines[:len(strings)]]


def compare(label, strings, want, got):
    """Prints the count of mismatches (and the first few); returns it."""
    bad = [i for i in range(len(strings)) if got[i] != want[i]]
    invalid = sum(1 for x in strings if not is_valid(x))
    print("%-48s %6d strings (%5d with invalid UTF-8), %d mismatches" %
          (label, len(strings), invalid, len(bad)))
    for i in bad[:5]:
        print("   %r\n     want %s\n     got  %s" % (strings[i][:80], want[i][:24], got[i][:24]))
    return len(bad)


def pairs(exe, conv, extra):
    """llama.cpp's pairs, each vocab from its GGUF alone, in one process per
    vocab with the generated strings of extra[vocab] = (strings, want)."""
    fails = 0
    models = os.path.join(conv, "models")
    for v in SUPPORTED:
        g = os.path.join(models, "ggml-vocab-%s.gguf" % v)
        with open(g + ".inp", encoding="utf-8", newline="") as f:
            inp = f.read().split("\n__ggml_vocab_test__\n")
        if inp and inp[-1] == "":
            inp.pop()
        with open(g + ".out", encoding="utf-8") as f:
            exp = [[int(x) for x in ln.split()] for ln in f.read().split("\n")[:len(inp)]]
        texts = [x.encode("utf-8") for x in inp]
        more, more_want = extra.get(v, ([], []))
        try:
            got = tokdump_encode(exe, g, texts + more)
        except RuntimeError as e:
            print("FAIL %s: %s" % (v, e))
            fails += 1
            continue
        fails += bool(compare("llama.cpp pairs %s (GGUF)" % v, texts, exp, got[:len(texts)]))
        if more:
            fails += bool(compare("tokenizers, %s from its GGUF" % v, more, more_want,
                                  got[len(texts):]))
    for v, why in REFUSED.items():
        g = os.path.join(models, "ggml-vocab-%s.gguf" % v)
        p = subprocess.run([exe, g, "info"], capture_output=True, text=True, timeout=120)
        ok = p.returncode != 0 and why in p.stderr
        print("llama.cpp pairs %s: refused (%s)" % (v, "as it must" if ok else "WRONG: " +
                                                    p.stderr.strip()[-300:]))
        fails += not ok
    return fails


def expected_ids(tok, strings, vocab_of_byte):
    """HF ids of each string; strings with invalid UTF-8 by the rule in the docstring."""
    jobs, plan = [], []
    for s in strings:
        items = valid_runs(s)
        plan.append(items)
        for kind, v in items:
            if kind == "text":
                jobs.append(v)
    encs = tok.encode_batch(jobs, add_special_tokens=False)
    k = 0
    out = []
    for items in plan:
        ids = []
        for kind, v in items:
            if kind == "text":
                ids += encs[k].ids
                k += 1
            elif vocab_of_byte.get(v) is not None:
                ids.append(vocab_of_byte[v])
        out.append(ids)
    return out


def main():
    upstream_venv.enter(NAME, ["tokenizers"])
    import tokenizers
    if len(sys.argv) != 2:
        print("usage: check_pretok.py TOKDUMP")
        sys.exit(2)
    exe = sys.argv[1]
    p = subprocess.run([os.path.join(SRC, "deploy", "install-gguf-converter"), sys.executable],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=900)
    if p.returncode == 2:
        upstream_venv.skip(NAME, "install-gguf-converter: pip could not download the sdist: " +
                           p.stderr.decode(errors="replace")[-1500:])
    if p.returncode != 0:
        print("install-gguf-converter exit %d: %s" % (p.returncode,
                                                      p.stderr.decode(errors="replace")[-1500:]))
        print("%s: 0 passed, 1 failed" % NAME)
        sys.exit(1)
    conv = p.stdout.decode().strip().splitlines()[-1]
    t0 = time.time()
    fails = 0
    total = int(os.environ.get("WKVM_PRETOK_N", "100000"))
    checked = 0
    vocabs = {}
    extra = {}
    tmp = tempfile.mkdtemp(prefix="wkvm-pretok-")
    for name, (vname, norm, pre, ign, gguf_pre) in CONFIGS.items():
        if vname not in vocabs:
            vocabs[vname] = read_vocab(conv, vname)
        tokens, types, merges = vocabs[vname]
        tj, added = build_json(tokens, types, merges, norm, pre, ign)
        if name == "addedflags":
            for k, a in enumerate(added):
                a.update(lstrip=k % 3 == 0, rstrip=k % 4 == 1, normalized=k % 5 == 2,
                         single_word=k % 7 == 3)
        path = os.path.join(tmp, name + ".json")
        if vname + ":text" not in vocabs:
            vocabs[vname + ":text"] = (json.dumps(tj["model"]["vocab"], ensure_ascii=False),
                                       json.dumps(tj["model"]["merges"], ensure_ascii=False))
        vtext, mtext = vocabs[vname + ":text"]
        model = dict(tj["model"], vocab="@V@", merges="@M@")
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(dict(tj, model=model), ensure_ascii=False)
                    .replace('"@V@"', vtext, 1).replace('"@M@"', mtext, 1))
        tok = tokenizers.Tokenizer.from_file(path)
        n = int(total * SHARE.get(name, 0.1))
        checked += n
        # single_word tests \w with Rust's Unicode 15 tables, PCRE2 10.42 has
        # Unicode 14's: a character assigned since next to such a token differs
        strings = gen_strings(n, [a["content"] for a in added[:64]],
                              seed=zlib.crc32(name.encode()), assigned_only=name == "addedflags")
        byte_id = {b: tj["model"]["vocab"].get(B2U[b]) for b in range(256)}
        want = expected_ids(tok, strings, byte_id)
        try:
            got = tokdump_encode(exe, path, strings)
            fails += bool(compare("tokenizers, %s tokenizer.json" % name, strings, want, got))
        except RuntimeError as e:
            print("FAIL %s: %s" % (name, e))
            fails += 1
        if gguf_pre is not None:
            extra[gguf_pre] = (strings, want)
        os.unlink(path)
    os.rmdir(tmp)
    fails += pairs(exe, conv, extra)
    print("tokenizers %s: %d strings, %.1f s" % (tokenizers.__version__, checked,
                                                  time.time() - t0))
    if fails:
        print("%s: 0 passed, %d failed" % (NAME, fails))
        sys.exit(1)
    print("%s: 1 passed, 0 failed" % NAME)


if __name__ == "__main__":
    main()
