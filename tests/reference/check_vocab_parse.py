#!/usr/bin/python3
"""Checks wk_tok against Python itself on World-format vocab files.

Usage: check_vocab_parse.py TOKDUMP VOCAB [VOCAB...]

For each vocab: every literal is parsed with ast.literal_eval (str literals
UTF-8 encoded), exactly as the reference RWKV TRIE_TOKENIZER reads the file,
and compared byte for byte with `TOKDUMP VOCAB` (the C parser's view). The
SHA-256 digest is compared with hashlib's. Then a set of texts (fixed ones and
seeded random byte strings built from vocab pieces) is encoded with a Python
greedy longest-match tokenizer written like the reference one, and with
`TOKDUMP VOCAB encode`, and the id sequences must match.

If the environment variable WKVM_REAL_VOCAB names a file (for instance
rwkv_vocab_v20230424.txt from the `rwkv` Python package), it is checked too.
Standard library only. Exit 0 on success, 1 on a mismatch; a missing
WKVM_REAL_VOCAB file is reported and skipped.
"""
import ast
import hashlib
import os
import random
import subprocess
import sys


def py_vocab(path):
    idx2tok = {}
    with open(path, "r", encoding="utf-8") as f:
        for lineno, l in enumerate(f.readlines(), 1):
            idx = int(l[:l.index(" ")])
            x = ast.literal_eval(l[l.index(" "):l.rindex(" ")].strip())
            x = x.encode("utf-8") if isinstance(x, str) else x
            assert isinstance(x, bytes), lineno
            assert len(x) == int(l[l.rindex(" "):]), lineno
            idx2tok[idx] = x
    return idx2tok


def py_encoder(idx2tok):
    tok2idx = {}
    for k, v in idx2tok.items():
        tok2idx[v] = k
    maxlen = max(len(v) for v in tok2idx)

    def encode(src):
        out, i = [], 0
        while i < len(src):
            for n in range(min(maxlen, len(src) - i), 0, -1):
                t = tok2idx.get(src[i:i + n])
                if t is not None:
                    out.append(t)
                    i += n
                    break
            else:
                raise ValueError("no token at %d" % i)
        return out
    return encode


def check(tokdump, path):
    fails = 0
    expect = py_vocab(path)
    res = subprocess.run([tokdump, path], capture_output=True, check=True)
    lines = res.stdout.decode("ascii").splitlines()
    head = dict(l.split(" ", 1) for l in lines[:3])
    got = {}
    for l in lines[3:]:
        i, h = l.split(" ")
        got[int(i)] = bytes.fromhex(h)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if head["digest"] != digest:
        print("%s: digest %s, expected %s" % (path, head["digest"], digest))
        fails += 1
    if int(head["vocab_size"]) != max(expect) + 1 or int(head["count"]) != len(expect):
        print("%s: size/count mismatch: %r" % (path, head))
        fails += 1
    for i in sorted(set(expect) | set(got)):
        if expect.get(i) != got.get(i):
            print("%s: id %d: python %r, C %r" % (path, i, expect.get(i), got.get(i)))
            fails += 1
            if fails > 20:
                return fails

    encode = py_encoder(expect)
    rng = random.Random(20230424)
    pieces = list(expect.values())
    texts = [b"", b"Hello, world!", "The 世界 is 😀 über\r\n\n\n  café".encode(),
             bytes(range(256)), b"\xff\xfe\xe4\xb8", "Abcde xyzxy".encode(),
             " the of and to in".encode()]
    for _ in range(300):
        n = rng.randrange(1, 40)
        t = b"".join(rng.choice(pieces) if rng.random() < 0.7 else bytes([rng.randrange(256)])
                     for _ in range(n))
        texts.append(t)
    stdin = "".join(t.hex() + "\n" for t in texts).encode("ascii")
    res = subprocess.run([tokdump, path, "encode"], input=stdin, capture_output=True,
                         check=True)
    outs = res.stdout.decode("ascii").split("\n")
    for k, t in enumerate(texts):
        c_ids = [int(x) for x in outs[k].split()]
        p_ids = encode(t)
        if c_ids != p_ids:
            print("%s: encode %r: python %r, C %r" % (path, t, p_ids, c_ids))
            fails += 1
    print("%s: %d tokens, %d texts, %d mismatches" % (path, len(expect), len(texts), fails))
    return fails


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    tokdump = sys.argv[1]
    paths = sys.argv[2:]
    real = os.environ.get("WKVM_REAL_VOCAB")
    if real:
        if os.path.exists(real):
            paths.append(real)
        else:
            print("WKVM_REAL_VOCAB=%s not found, skipped" % real)
    fails = sum(check(tokdump, p) for p in paths)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
