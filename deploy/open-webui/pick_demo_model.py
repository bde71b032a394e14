#!/usr/bin/env python3
"""Generates the Open WebUI demo helper's random-weight model.

wkvm's demo model has random weights, so its replies are arbitrary token
sequences: a first token without a leading space, a split UTF-8 sequence, a
trailing space. wkvm continues a chat from the exact tokens the model
produced whatever their bytes (the reply records of the prefix index, see
docs/OPERATIONS.md "Reuse"), so that no longer stops a continuation; it
still makes the smoke's transcript look unlike a chat model's.

So, deterministically: try wkvm-mkmodel seeds (same shapes as `deploy/wkvm up`'s
demo model) until the greedy replies to the smoke conversation's first two
turns (demo_common.TURNS, demo_common.PARAMS) are clean the way a trained
model's are. Nothing about wkvm is changed or bypassed: the model is just
the first seed that behaves like a chat model on this conversation. Prints
the seed.

    pick_demo_model.py --build BUILD_DIR --out DIR [--max-seed N]
"""
import argparse
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from demo_common import PARAMS, TURNS, clean_reply, render  # noqa: E402


def run(args, data=None):
    return subprocess.run(args, input=data, capture_output=True, timeout=300, check=True).stdout


def greedy_reply(infer, model, msgs, n):
    ids = run([infer, "--model", model, "--threads", "0", "--encode"],
              render(msgs).encode()).split()
    gen = run([infer, "--model", model, "--threads", "0", "--tokens",
               ",".join(x.decode() for x in ids), "--generate", str(n)]).split()
    if b"0" in gen:  # end of text: the server would stop there
        return None
    raw = run([infer, "--model", model, "--decode"], b" ".join(gen))
    try:
        return raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-seed", type=int, default=200)
    a = ap.parse_args()
    mk = os.path.join(a.build, "tools", "wkvm-mkmodel")
    infer = os.path.join(a.build, "tools", "wkvm-infer")
    tmp = a.out + ".tmp"
    for seed in range(1, a.max_seed + 1):
        shutil.rmtree(tmp, ignore_errors=True)
        run([mk, "--out", tmp, "--seed", str(seed)])
        msgs, ok = [], True
        for text in TURNS:
            msgs.append({"role": "user", "content": text})
            reply = greedy_reply(infer, tmp, msgs, PARAMS["max_tokens"])
            if reply is None or not clean_reply(reply):
                ok = False
                break
            msgs.append({"role": "assistant", "content": reply.strip()})
        if ok:
            with open(os.path.join(tmp, "wkvm-demo-seed"), "w") as f:
                f.write(f"{seed}\n")
            shutil.rmtree(a.out, ignore_errors=True)
            os.rename(tmp, a.out)
            print(seed)
            return 0
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"pick_demo_model: no seed in 1..{a.max_seed} gives clean greedy replies",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
