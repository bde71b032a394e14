#!/usr/bin/env python3
"""wkvm's CPU backend against llama.cpp on the SAME Q8_0 GGUF file.

bench/bench_cpu.sh --peer runs this. The model is the 0.1B-shaped random
RWKV-7 of bench_cpu.sh (BF16 safetensors, HF layout), converted once by
llama.cpp's own convert_hf_to_gguf.py --outtype q8_0 (through
bench/gguf-convert.py). Then, in R rounds that alternate the engines (so a
busy spell of this shared machine hits both alike):
  - wkvm Q8_0:  wkvm-bench-cpu --model <dir holding the GGUF> (--rounds 1)
  - wkvm BF16:  wkvm-bench-cpu on the BF16 safetensors (the 1.7x target)
  - llama.cpp:  llama-bench -t 2 on the GGUF (tg64 = decode batch 1, pp512 =
                prefill), llama-batched-bench -t 2 -npp 32 -ntg 32 -npl B
                (S_TG = decode tok/s with B sequences; the prompt part of its
                run is not counted)
Every figure is the best of its R rounds; ratios are taken from them. Prints
a Markdown table (best of R), the same table of medians, and the commands.
With --gguf Q8_0_FILE (a model wkvm reads as safetensors only, e.g. a
Qwen3.5 converted by bench/qwen35-gguf.py), that file is llama.cpp's and
wkvm's Q8_0 is --quantize q8_0 of the BF16 model at load (the same Q8_0
blocks as llama.cpp's converter writes); --gguf-bf16 BF16_FILE adds llama.cpp
on the BF16 file as a fifth engine (column "llama.cpp BF16"). --gguf-bf16
alone (no --gguf) runs only the two BF16 engines, wkvm on the BF16
safetensors and llama.cpp on the converter's BF16 file (e.g. a Nemotron-H,
bench/qwen35-gguf.py's conversion too).
With --base-build BASE, a fourth engine (BASE's wkvm-bench-cpu on the same
GGUF, e.g. a build of the previous commit) runs in the same rounds, so a
change and its baseline are measured alternately in one session (column
"before"). Stdlib only.

usage: peer_cpu.py --build BUILD --peer PEER_DIR --model BF16_DIR [--rounds R]
                   [--batches 8,32] [--threads 2] [--base-build BASE]
                   [--gguf Q8_0_FILE] [--gguf-bf16 BF16_FILE]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402


def sh(cmd, timeout=1800):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit("peer_cpu: %s failed (%d):\n%s" % (" ".join(cmd), p.returncode,
                                                            (p.stderr or p.stdout)[-3000:]))
    return p.stdout


def make_gguf(a):
    """The Q8_0 GGUF of the BF16 model, and a wkvm model dir holding (a link to) it."""
    gdir = os.path.join(a.peer, "gguf")
    gguf = os.path.join(gdir, "rwkv7-0.1b-q8_0.gguf")
    wdir = os.path.join(gdir, "rwkv7-0.1b-q8_0")
    if not os.path.exists(gguf):
        # the converter reads the real World vocab (peer-setup.sh's copy) next to the weights
        src = os.path.join(gdir, "rwkv7-0.1b-src")
        os.makedirs(src, exist_ok=True)
        for name, frm in (("config.json", a.model), ("model.safetensors", a.model),
                          ("rwkv_vocab_v20230424.txt", a.peer)):
            dst = os.path.join(src, name)
            if not os.path.lexists(dst):
                os.symlink(os.path.abspath(os.path.join(frm, name)), dst)
        sh([os.path.join(a.peer, "venv", "bin", "python"), os.path.join(HERE, "gguf-convert.py"),
            os.path.join(a.peer, "llama.cpp", "convert_hf_to_gguf.py"), src, "--outtype", "q8_0",
            "--outfile", gguf])
    if not os.path.isdir(wdir):
        os.makedirs(wdir)
        os.symlink(os.path.abspath(gguf), os.path.join(wdir, "model.gguf"))
    return gguf, wdir


WKVM_ROW = re.compile(r"^\| (decode batch (\d+)|prefill (\d+) tokens) \| ([0-9.]+) \|")


def wkvm(a, model, extra=(), build=None):
    cmd = [os.path.join(build or a.build, "bench", "wkvm-bench-cpu"), "--model", model, "--threads",
           str(a.threads), "--batches", ",".join(["1"] + a.batches), "--prefill", "512",
           "--rounds", "1", "--bw-mib", "64", "--sgemm-n", "256"] + list(extra)
    out = sh(cmd)
    r = {}
    for line in out.splitlines():
        m = WKVM_ROW.match(line)
        if m:
            key = "b" + m.group(2) if m.group(2) else "pp" + m.group(3)
            r[key] = float(m.group(4))
    return r, " ".join(cmd)


def llama(a, gguf):
    bin_ = os.path.join(a.peer, "llama.cpp", "build", "bin")
    r = {}
    cmd1 = [os.path.join(bin_, "llama-bench"), "-m", gguf, "-t", str(a.threads), "-p", "512",
            "-n", "64", "-r", "1", "-o", "json"]
    for res in json.loads(sh(cmd1)):
        if res.get("n_gen", 0) > 0 and res.get("n_prompt", 0) == 0:
            r["b1"] = float(res["avg_ts"])
        elif res.get("n_prompt", 0) > 0 and res.get("n_gen", 0) == 0:
            r["pp512"] = float(res["avg_ts"])
    pls = [int(b) for b in a.batches]
    cmd2 = [os.path.join(bin_, "llama-batched-bench"), "-m", gguf, "-t", str(a.threads), "-tb",
            str(a.threads), "-c", str(max(pls) * 64), "-npp", "32", "-ntg", "32", "-npl",
            ",".join(a.batches), "--output-format", "jsonl"]
    for line in sh(cmd2).splitlines():
        line = line.strip()
        if line.startswith("{"):
            j = json.loads(line)
            r["b%d" % j["pl"]] = float(j["speed_tg"])
    return r, [" ".join(cmd1), " ".join(cmd2)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--peer", required=True)
    ap.add_argument("--model", required=True, help="the BF16 model dir (bench_cpu.sh's)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--base-build", default=None,
                    help="a second build whose wkvm Q8_0 runs alternately as the baseline")
    ap.add_argument("--gguf", default=None,
                    help="llama.cpp's Q8_0 file of the model; wkvm quantizes the BF16 model")
    ap.add_argument("--gguf-bf16", default=None, help="llama.cpp's BF16 file of the model")
    a = ap.parse_args()
    a.batches = [b for b in a.batches.split(",") if b]
    bf16_only = a.gguf_bf16 is not None and a.gguf is None
    if bf16_only and a.base_build:
        raise SystemExit("peer_cpu: --base-build compares Q8_0 runs; give --gguf too")
    if a.gguf or bf16_only:
        gguf, wdir, q8extra = a.gguf or a.gguf_bf16, a.model, ("--quantize", "q8_0")
    else:
        (gguf, wdir), q8extra = make_gguf(a), ()
    mach = benchlib.machine()
    if bf16_only:
        engines = ("bf16", "llamabf16")
    else:
        engines = ("q8", "llama", "bf16") + (("q8base",) if a.base_build else ()) + \
            (("llamabf16",) if a.gguf_bf16 else ())
    best = {e: {} for e in engines}
    vals = {e: {} for e in engines}
    cmds = {}
    for rnd in range(a.rounds):
        for eng in engines:
            if eng == "q8":
                r, cmds["q8"] = wkvm(a, wdir, q8extra)
            elif eng == "q8base":
                r, cmds["q8base"] = wkvm(a, wdir, q8extra, build=a.base_build)
            elif eng == "bf16":
                r, cmds["bf16"] = wkvm(a, a.model)
            elif eng == "llamabf16":
                r, cmds["llamabf16"] = llama(a, a.gguf_bf16)
            else:
                r, cmds["llama"] = llama(a, gguf)
            for k, v in r.items():
                best[eng][k] = max(best[eng].get(k, 0.0), v)
                vals[eng].setdefault(k, []).append(v)
        print("peer_cpu: round %d/%d done, load %.2f" % (rnd + 1, a.rounds, os.getloadavg()[0]),
              file=sys.stderr)
    commit = "unknown"
    cpath = os.path.join(a.peer, "llama.cpp.commit")
    if os.path.exists(cpath):
        commit = open(cpath).read().strip()
    sdist = ""
    spath = os.path.join(a.peer, "llama-cpp-python.sdist")
    if os.path.exists(spath):
        sdist = open(spath).read().strip()
    print("machine: %s, %s CPUs, load average at start %s, after %.2f" % (
        mach.get("cpu"), mach.get("cores"),
        " ".join("%.2f" % x for x in mach.get("loadavg_start", [])), os.getloadavg()[0]))
    print("llama.cpp: %s (commit %s), CPU only, %d threads" % (sdist, commit, a.threads))
    print("GGUF: %s (%.1f MB, %s by convert_hf_to_gguf.py)%s" % (
        gguf, os.path.getsize(gguf) / 1e6, "BF16" if bf16_only else "Q8_0",
        "; wkvm Q8_0: --quantize q8_0 of %s" % a.model if a.gguf else ""))
    print("best of %d alternating rounds\n" % a.rounds)
    rows = [("decode batch 1", "b1")] + [("decode batch %s" % b, "b" + b) for b in a.batches] + \
        [("prefill 512 tokens", "pp512")]
    med = {e: {k: statistics.median(v) for k, v in vals[e].items()} for e in engines}
    for title, fig in (("best of %d rounds" % a.rounds, best),
                       ("median of %d rounds" % a.rounds, med)):
        if fig is med:
            print("\n" + title + ":\n")
        if bf16_only:
            print("| workload | wkvm BF16 tok/s | llama.cpp BF16 tok/s | wkvm / llama.cpp |")
            print("|---|---:|---:|---:|")
            for label, k in rows:
                b, o = fig["bf16"].get(k), fig["llamabf16"].get(k)
                print("| %s | %s | %s | %s |" % (label, "%.1f" % b if b else "-",
                                                 "%.1f" % o if o else "-",
                                                 "%.2fx" % (b / o) if b and o else "-"))
            continue
        before = a.base_build is not None
        lb = a.gguf_bf16 is not None
        print("| workload | wkvm Q8_0 tok/s | wkvm BF16 tok/s | llama.cpp Q8_0 tok/s | "
              "Q8_0 / BF16 | wkvm / llama.cpp |" + (" Q8_0 before tok/s | before / BF16 |"
                                                   if before else "") +
              (" llama.cpp BF16 tok/s | wkvm / llama.cpp BF16 |" if lb else ""))
        print("|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if before else "") +
              ("---:|---:|" if lb else ""))
        for label, k in rows:
            q, b, l = fig["q8"].get(k), fig["bf16"].get(k), fig["llama"].get(k)
            f = lambda x: "%.1f" % x if x else "-"
            rq = "%.2fx" % (q / b) if q and b else "-"
            rl = "%.2fx" % (q / l) if q and l else "-"
            line = "| %s | %s | %s | %s | %s | %s |" % (label, f(q), f(b), f(l), rq, rl)
            if before:
                o = fig["q8base"].get(k)
                line += " %s | %s |" % (f(o), "%.2fx" % (o / b) if o and b else "-")
            if lb:
                o = fig["llamabf16"].get(k)
                line += " %s | %s |" % (f(o), "%.2fx" % (b / o) if o and b else "-")
            print(line)
    print("\ncommands (each round):")
    if "q8" in cmds:
        print("  " + cmds["q8"])
    if "q8base" in cmds:
        print("  " + cmds["q8base"])
    print("  " + cmds["bf16"])
    for c in cmds.get("llama", []) + cmds.get("llamabf16", []):
        print("  " + c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
