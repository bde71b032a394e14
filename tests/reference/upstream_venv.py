"""Runs an upstream reference test under the venv deploy/install-ref-venv makes.

The upstream tests (upstream_*.py) compare wkvm with the implementations the
checkpoints come from (BlinkDL's rwkv package, transformers). They need
packages Debian does not ship; deploy/install-ref-venv installs pinned
versions into a venv cached outside the clone. A test calls
enter(name, modules) first thing:
  - when the running interpreter already imports every module, it returns;
  - else it runs deploy/install-ref-venv (which builds the venv when needed)
    and re-executes the test under the venv's python;
  - when that cannot be had it prints "skipped: pip could not install ...:
    <error>" (or the reason) and exits 77, meson's skip.
enter(name, modules, fla=True) does the same with the fla venv
(install-ref-venv --fla: torch and triton from PyPI, several GB); setting
WKVM_REF_FLA=0 skips those tests instead of installing it.
A test that runs and disagrees exits 1: installed packages never skip.
"""
import importlib.util
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("WKVM_SOURCE_DIR") or os.path.normpath(os.path.join(HERE, "..", ".."))
INSTALL = os.path.join(SRC, "deploy", "install-ref-venv")
SKIP = 77
INSTALL_TIMEOUT = 900  # seconds: a cold install is 11 s (fla: 200 s)
# pip's words for "no package index reachable" (as tests/reference/check_bpe.py)
NETWORK_HINTS = ("Could not find a version", "No matching distribution", "connection",
                 "Temporary failure", "Network is unreachable", "Name or service not known",
                 "timed out", "ProxyError")


def _has(modules):
    return all(importlib.util.find_spec(m) is not None for m in modules)


def skip(name, why):
    print("skipped: %s" % why)
    print("%s: 0 passed, 0 failed, 1 skipped" % name)
    sys.exit(SKIP)


def enter(name, modules, fla=False):
    """Returns when modules import here; else re-executes under the venv (the
    fla one when fla) or exits 77 naming why it cannot."""
    if _has(modules):
        return
    if os.environ.get("WKVM_IN_REF_VENV"):
        skip(name, "%s cannot import %s" % (sys.executable, ", ".join(modules)))
    if fla and os.environ.get("WKVM_REF_FLA") == "0":
        skip(name, "WKVM_REF_FLA=0: the fla venv (torch + triton from PyPI, 5.6 GB with "
             "the CUDA libraries its torch wheel depends on) is not installed")
    try:
        p = subprocess.run([INSTALL] + (["--fla"] if fla else []), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=INSTALL_TIMEOUT)
    except FileNotFoundError:
        skip(name, "%s not found" % INSTALL)
    except subprocess.TimeoutExpired:
        skip(name, "%s did not finish in %d s" % (INSTALL, INSTALL_TIMEOUT))
    err = p.stderr.decode("utf-8", "replace").strip()
    if p.returncode == 2:
        if any(h.lower() in err.lower() for h in NETWORK_HINTS):
            k = err.find("pip could not install")
            skip(name, err[k:][:3000] if k >= 0 else "pip could not install: " + err[-2000:])
        print("pip failed, and not for want of a package index:\n" + err[-3000:])
        print("%s: 0 passed, 1 failed" % name)
        sys.exit(1)
    if p.returncode == 4:
        skip(name, "not enough disk for the fla venv: " + err[-500:])
    if p.returncode != 0:
        skip(name, "deploy/install-ref-venv exit %d: %s" % (p.returncode, err[-2000:]))
    if err:
        print(err, flush=True)
    py = p.stdout.decode().strip().splitlines()[-1]
    env = dict(os.environ, WKVM_IN_REF_VENV="1")
    sys.stdout.flush()
    os.execve(py, [py, os.path.abspath(sys.argv[0])] + sys.argv[1:], env)


def build_dir():
    d = os.environ.get("WKVM_BUILD_DIR")
    if d:
        return d
    return os.path.normpath(os.path.join(HERE, "..", "..", "build"))


def run_wkvm(exe, mdir, tokens, out, vocab, chunk=None, timeout=120, fp32=True, extra=()):
    """Logits [T, V] (float64) of `wkvm-infer --fp32` on tokens from the zero
    state; chunk=1 prefills one token at a time; fp32=False runs the weights as
    stored (Q8_0 blocks on the Q8_0 kernels); extra: more wkvm-infer options.
    Raises RuntimeError on a non-zero exit."""
    import subprocess
    from rwkv7_ref import read_logits
    cmd = [exe, "--model", mdir] + (["--fp32"] if fp32 else []) + [
        "--tokens", ",".join(map(str, tokens)), "--logits-out", out] + list(extra)
    if chunk is not None:
        cmd += ["--prefill-chunk", str(chunk)]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError("wkvm-infer exit %d: %s" % (p.returncode,
                                                       p.stderr.decode(errors="replace")[-500:]))
    return read_logits(out, vocab)


def rel_err(ref, got):
    """max |got - ref| / std(ref), the figure every upstream test reports."""
    import numpy as np
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    if ref.shape != got.shape:
        raise ValueError("shape %s, reference %s" % (got.shape, ref.shape))
    return float(np.abs(got - ref).max() / ref.std())
