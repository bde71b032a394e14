#!/usr/bin/python3
"""The World tokenizer (common/text/wk_tok) against BlinkDL's TRIE_TOKENIZER.

Usage: upstream_world_tok.py TOKDUMP

Loads the real rwkv_vocab_v20230424.txt that the `rwkv` package ships (the
vocab of every RWKV World / RWKV-7 release) with rwkv.rwkv_tokenizer's
TRIE_TOKENIZER and with wk_tok (through TOKDUMP, tests/reference/
wkvm_tokdump.c), and requires:
  1. every token's bytes to be the same (all 65529 ids);
  2. the same ids for several hundred strings (TRIE_TOKENIZER.encode):
     Latin with accents, Greek, Cyrillic, Armenian, Georgian, Hebrew, Arabic,
     Devanagari, Bengali, Tamil, Thai, Lao, Tibetan, Khmer, CJK, kana,
     Hangul, emoji (ZWJ sequences, skin tones, flags, keycaps), combining
     marks (stacked, Zalgo), control characters, NUL, DEL, C1, BOM, CRLF and
     lone CR, tabs, long runs, code, JSON, URLs, digits, and seeded random
     mixes of all of these; plus random bytes (invalid UTF-8) through
     encodeBytes;
  3. decoding to the same bytes (decodeBytes): the ids of every string
     (decode(encode(s)) == s), and random id sequences, which split UTF-8
     sequences between tokens. (TRIE_TOKENIZER.decode turns a whole text
     with any invalid byte into one U+FFFD; wkvm's streaming decoder replaces
     each invalid sequence instead, so the bytes are what is compared.)
  4. wkvm-mkmodel --vocab-file (the demo model deploy/wkvm up makes when this
     vocab is installed) to copy the vocab byte for byte, size the model to
     65536 rows, and wkvm-infer --encode on that model to give the same ids.

Exit 0 when everything matches, 1 on a mismatch, 77 (skip) when the package
cannot be installed (deploy/install-ref-venv) or TOKDUMP is missing.
"""
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import upstream_venv  # noqa: E402

upstream_venv.enter("upstream_world_tok", ["rwkv"])

import rwkv  # noqa: E402
from rwkv.rwkv_tokenizer import TRIE_TOKENIZER  # noqa: E402

VOCAB = os.path.join(os.path.dirname(os.path.abspath(rwkv.__file__)), "rwkv_vocab_v20230424.txt")

FIXED = [
    "", " ", "  ", "\n", "\n\n", "\r\n", "\r\n\r\n", "\r", "a\rb", "\t", "\t\t\tx", "a",
    "Hello, world!", " Hello world", "The quick brown fox jumps over the lazy dog.",
    "User: hi\n\nAssistant: hello", "User: What is 2+2?\r\nAssistant: 4\r\n",
    "café naïve façade jalapeño Ærøskøbing Łódź İstanbul ǅemal ß ẞ",
    "Ελληνικά: Γειά σου Κόσμε, ή αλλιώς ΑΒΓΔ αβγδ ώ ΐ",
    "Русский текст: Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Українська: Ґанок, їжак, європа", "Հայերեն լեզու", "ქართული ენა",
    "עברית: שלום עולם, עִבְרִית עם ניקוד", "العربية: مرحبا بالعالم، السَّلامُ عَلَيْكُم ١٢٣",
    "हिन्दी: नमस्ते दुनिया, क्षत्रिय", "বাংলা ভাষা", "தமிழ் மொழி", "ภาษาไทย สวัสดีครับ",
    "ພາສາລາວ", "བོད་ཡིག", "ភាសាខ្មែរ", "中文：你好，世界！我们一起学习自然语言处理。",
    "日本語：こんにちは世界。カタカナ、ひらがな、漢字。ｶﾀｶﾅ半角", "한국어: 안녕하세요 세계",
    "繁體中文與简体中文混合「引號」『雙引號』", "𠀀𠀁𪚥𰻞 (CJK ext B, G)",
    "emoji 😀😃😄😁 👍🏻👍🏿 👨‍👩‍👧‍👦 🏳️‍🌈 🇺🇸🇯🇵🇩🇪 1️⃣ #️⃣ ❤️ ☺︎",
    "🧑🏽‍🚀 flying to 🌕 with 🐕‍🦺", "e\u0301 a\u0300\u0323 o\u0308\u0304 n\u0303",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349"
    "\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L"
    "\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b"
    "\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d"
    "\u0333", "\u1100\u1161\u11a8 (conjoining jamo)", "ﬁ ﬂ ﬀ ligatures; Ⅻ ⅻ; ① ②; ㎏ ㎡",
    "\x00", "a\x00b", "\x00\x00\x00", "\x01\x02\x03\x04\x05\x06\x07\x08\x0b\x0c\x0e\x0f",
    "\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f", "\x7f", "\x1b[31mred\x1b[0m",
    "\x80\x85\x9f (C1)", "\ufeffBOM at start", "zero\u200bwidth\u200cjoin\u200d\u2060",
    "rtl \u202ehidden\u202c mark \u200f", "nbsp\u00a0thin\u2009ideographic\u3000space",
    "line\u2028sep\u2029para", "\ufffd replacement \ufffd", "\U0010ffff \U000e0001 tags",
    "def f(x):\n    return x * 2  # comment\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    '{"key": "value", "n": [1, 2.5e-3, null, true], "nested": {"a": "\\u00e9"}}',
    "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
    "https://example.com/path?q=a+b&x=%E2%9C%93#frag", "user@example.org",
    "0123456789 3.14159265358979 -1e-10 1,000,000 ١٢٣٤ ۱۲۳ १२३",
    "$$\\int_0^\\infty e^{-x^2} dx = \\frac{\\sqrt{\\pi}}{2}$$", "∀x∈ℝ: x² ≥ 0 ⇒ √(x²)=|x| ∑∏∫≈≠≤",
    "«guillemets» „Anführungszeichen“ “curly” ‘single’ — – … • · ¡¿",
    "Mixed: English, 中文, русский, العربية, हिन्दी, 😀 in one line.",
    "a" * 1000, " " * 500, "\n" * 300, "\r\n" * 200, "\t" * 100, "ab" * 400, "=" * 257,
    "😀" * 100, "中" * 300, "e\u0301" * 150, "\x00" * 64, "." * 1000, "-" * 80 + "\n" + "-" * 80,
    "The " * 200, " the" * 200, "0" * 500, "1234567890" * 50,
]

POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿœšžłńść",
    "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔ",
    "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВ",
    "אבגדהוזחטיכלמנסעפצקרשת", "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "अआइईउऊएऐओऔकखगघचछजझटठडढणतथदधनपफबभमयरलवशषसह्ािीुूेैोौं",
    "กขคงจฉชซญดตถทนบปผพฟมยรลวศสหอฮะาิีึืุูเแโใไ่้๊๋",
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
    "あいうえおかきくけこさしすせそアイウエオカキクケコ", "가나다라마바사아자차카타파하한글",
    "😀😂🥲😍🤔👍👎🙏🔥✨🎉💯❤️🇫🇷👩‍💻",
    "\u0300\u0301\u0302\u0303\u0308\u0327\u0328\u0338\u20dd\u200d\ufe0f",
    "\x00\x01\x07\x08\x0b\x0c\x1b\x7f\x85\u2028\ufeff",
    " \t\n\r\n  \n\n", "0123456789.,;:!?-+=*/()[]{}<>\"'`~@#$%^&|\\_",
]


def random_strings(rng, n):
    out = []
    for _ in range(n):
        k = rng.randint(1, 4)
        pools = [rng.choice(POOLS) for _ in range(k)]
        parts = []
        for _ in range(rng.randint(1, 60)):
            pool = rng.choice(pools)
            run = rng.choice((1, 1, 1, 2, 3, 8, 40))
            parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, run))))
            if rng.random() < 0.3:
                parts.append(rng.choice((" ", "\n", "\r\n", "", "  ")))
        out.append("".join(parts))
    return out


def tokdump(exe, mode, lines):
    p = subprocess.run([exe, VOCAB, mode], input="\n".join(lines) + "\n",
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError("wkvm-tokdump %s exit %d: %s" % (mode, p.returncode, p.stderr[-500:]))
    out = p.stdout.split("\n")
    if out and out[-1] == "":
        out.pop()
    if len(out) != len(lines):
        raise RuntimeError("wkvm-tokdump %s: %d lines for %d inputs" % (mode, len(out), len(lines)))
    return out


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    exe = sys.argv[1]
    if not os.access(exe, os.X_OK):
        upstream_venv.skip("upstream_world_tok", "%s is not built" % exe)
    t0 = time.time()
    tok = TRIE_TOKENIZER(VOCAB)
    print("vocab %s (%d tokens)" % (VOCAB, len(tok.idx2token)), flush=True)
    fails = []

    # 1. pieces
    p = subprocess.run([exe, VOCAB], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=300)
    if p.returncode != 0:
        print("FAIL wkvm-tokdump cannot load the vocab: %s" % p.stderr[-500:])
        print("upstream_world_tok: 0 passed, 1 failed")
        return 1
    pieces = {}
    for line in p.stdout.splitlines():
        f = line.split(" ")
        if len(f) == 2 and f[0].isdigit():
            pieces[int(f[0])] = bytes.fromhex(f[1])
    bad = [i for i in tok.idx2token if pieces.get(i) != tok.idx2token[i]]
    extra = sorted(set(pieces) - set(tok.idx2token))
    n_checks = 1
    if bad or extra:
        fails.append("pieces: %d differ (first id %s), %d extra" % (len(bad), bad[:5], len(extra)))
    print("%-4s pieces: %d ids" % ("FAIL" if bad or extra else "ok", len(tok.idx2token)))

    # 2. encode
    rng = random.Random(20230424)
    texts = FIXED + random_strings(rng, 300)
    raw = [s.encode("utf-8") for s in texts]
    raw += [bytes(rng.randrange(256) for _ in range(rng.randint(1, 200))) for _ in range(60)]
    raw += [b"\xe4\xb8", b"\xf0\x9f\x98", b"\xff\xfe\xfd", b"\xc0\x80", b"\xed\xa0\x80",
            b"abc\xe4" * 50]
    got = tokdump(exe, "encode", [b.hex() for b in raw])
    n_enc_bad = 0
    ref_ids = []
    for i, (b, line) in enumerate(zip(raw, got)):
        want = tok.encodeBytes(b)
        ref_ids.append(want)
        ids = [int(x) for x in line.split()]
        if ids != want:
            n_enc_bad += 1
            if n_enc_bad <= 5:
                k = next((j for j, (x, y) in enumerate(zip(ids, want)) if x != y),
                         min(len(ids), len(want)))
                fails.append("encode %r: first differs at token %d: wkvm %s, rwkv %s"
                             % (b[:60], k, ids[k:k + 5], want[k:k + 5]))
    n_checks += len(raw)
    print("%-4s encode: %d strings (%d texts, %d byte strings), %d tokens"
          % ("FAIL" if n_enc_bad else "ok", len(raw), len(texts), len(raw) - len(texts),
             sum(map(len, ref_ids))))
    if n_enc_bad:
        fails.append("encode: %d of %d strings differ" % (n_enc_bad, len(raw)))
    # the texts' ids decode back to the texts in the package itself
    n_rt_bad = sum(1 for s, ids in zip(texts, ref_ids) if tok.decode(ids) != s)
    if n_rt_bad:
        fails.append("rwkv decode(encode(s)) != s for %d texts" % n_rt_bad)

    # 3. decode: the texts' ids, and random id sequences
    max_id = max(tok.idx2token)
    seqs = ref_ids[:len(texts)]
    seqs += [[rng.randint(1, max_id) for _ in range(rng.randint(1, 80))] for _ in range(300)]
    got = tokdump(exe, "decode", [" ".join(map(str, s)) for s in seqs])
    n_dec_bad = 0
    for s, line in zip(seqs, got):
        want = tok.decodeBytes(s)
        if bytes.fromhex(line) != want:
            n_dec_bad += 1
            if n_dec_bad <= 5:
                fails.append("decode %s: wkvm %r, rwkv %r" % (s[:8], bytes.fromhex(line)[:40],
                                                              want[:40]))
    n_checks += len(seqs)
    print("%-4s decode: %d id sequences (%d of the texts, %d random)"
          % ("FAIL" if n_dec_bad else "ok", len(seqs), len(texts), len(seqs) - len(texts)))
    if n_dec_bad:
        fails.append("decode: %d of %d sequences differ" % (n_dec_bad, len(seqs)))

    # 4. the demo model with this vocab
    n_mk_bad = 0
    build = upstream_venv.build_dir()
    mk = os.path.join(build, "tools", "wkvm-mkmodel")
    infer = os.path.join(build, "tools", "wkvm-infer")
    if os.access(mk, os.X_OK) and os.access(infer, os.X_OK):
        import json
        import shutil
        import tempfile
        tmp = tempfile.mkdtemp(prefix="wkvm-up-tok-")
        try:
            d = os.path.join(tmp, "demo")
            p = subprocess.run([mk, "--out", d, "--vocab-file", VOCAB, "--layers", "1",
                                "--embd", "64"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, timeout=120)
            why = None
            if p.returncode != 0:
                why = "wkvm-mkmodel --vocab-file exit %d: %s" % (p.returncode, p.stderr[-300:])
            else:
                with open(os.path.join(d, "rwkv_vocab_v20230424.txt"), "rb") as f, \
                        open(VOCAB, "rb") as g:
                    if f.read() != g.read():
                        why = "the demo's vocab is not a copy of %s" % VOCAB
                with open(os.path.join(d, "config.json")) as f:
                    if json.load(f).get("vocab_size") != 65536:
                        why = "the demo model's vocab_size is not 65536"
            for s in texts[:40] if why is None else []:
                q = subprocess.run([infer, "--model", d, "--encode"], input=s.encode("utf-8"),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
                if [int(x) for x in q.stdout.split()] != tok.encode(s):
                    why = "wkvm-infer --encode %r on the demo model: %s, rwkv %s" % (
                        s[:30], q.stdout[:60], tok.encode(s)[:8])
                    break
            if why:
                n_mk_bad = 1
                fails.append(why)
            print("%-4s wkvm-mkmodel --vocab-file: copy, 65536 rows, wkvm-infer --encode on 40 texts"
                  % ("FAIL" if why else "ok"))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    else:
        print("skip wkvm-mkmodel --vocab-file: %s or %s not built" % (mk, infer))

    for f in fails:
        print("FAIL " + f)
    groups = [bool(bad or extra), bool(n_enc_bad), bool(n_dec_bad), bool(n_rt_bad),
              bool(n_mk_bad)]
    print("upstream_world_tok: %d passed, %d failed in %.1fs (%d strings and sequences)"
          % (groups.count(False), groups.count(True), time.time() - t0, n_checks))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
