"""llama.cpp's converter through bench/qwen35-gguf.py, each conversion in a
process forked from one that has already imported what it needs.

Run as a script, python gguf_zygote.py SCRIPT imports torch, transformers and
numpy (imports only, no torch op: no thread pool exists when it forks), and
for every request line (JSON: args, stdout and stderr paths, timeout) it
prepares the converter directory named by args[0] once (gguf-py and the
converter's `conversion` package imported; its models/ggml-vocab-qwen35.gguf
read with gguf.GGUFReader and kept), then forks: the child runs SCRIPT
as __main__ with those args, its output in the two files, as
`python SCRIPT ARGS...` would, and the parent answers its exit status. Each
conversion still runs in a process of its own and starts from the same
state; what it no longer pays is the imports and the parse of
ggml-vocab-qwen35.gguf (~150k tokens and merges), 9-11 s of each conversion.

From a test: run(script, args, timeout) returns a subprocess.CompletedProcess
(text stdout / stderr) and raises subprocess.TimeoutExpired like
subprocess.run([sys.executable, script] + args, capture_output=True,
text=True, timeout=timeout).
"""
import atexit
import json
import os
import subprocess
import sys
import tempfile
import time

_zygotes = {}


def _start(script):
    z = _zygotes.get(script)
    if z is None or z.poll() is not None:
        z = subprocess.Popen([sys.executable, os.path.abspath(__file__), script],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        _zygotes[script] = z
    return z


@atexit.register
def _close():
    for z in _zygotes.values():
        if z.poll() is None:
            z.stdin.close()
            try:
                z.wait(timeout=10)
            except subprocess.TimeoutExpired:
                z.kill()
                z.wait()


def run(script, args, timeout=600):
    script = os.path.abspath(script)
    z = _start(script)
    with tempfile.TemporaryDirectory(prefix="wkvm-zygote-") as d:
        out, err = os.path.join(d, "stdout"), os.path.join(d, "stderr")
        z.stdin.write(json.dumps({"args": [str(a) for a in args], "stdout": out, "stderr": err,
                                  "timeout": timeout}) + "\n")
        z.stdin.flush()
        line = z.stdout.readline()
        if not line:
            raise RuntimeError("gguf_zygote for %s exited (%s)" % (script, z.poll()))
        rc = json.loads(line)["rc"]
        with open(out, errors="replace") as f:
            o = f.read()
        with open(err, errors="replace") as f:
            e = f.read()
    if rc is None:
        raise subprocess.TimeoutExpired([script] + list(args), timeout, o, e)
    return subprocess.CompletedProcess([script] + list(args), rc, o, e)


def _prepare(conv, done):
    """The converter dir conv (once): gguf-py and `conversion` imported, the Qwen3.5
    test vocabulary parsed and kept for gguf.GGUFReader of the same path."""
    if conv in done or not os.path.isdir(os.path.join(conv, "gguf-py")):
        return
    done.add(conv)
    sys.path.insert(0, os.path.join(conv, "gguf-py"))
    sys.path.insert(0, conv)
    import gguf
    import conversion  # noqa: F401
    reader = gguf.GGUFReader
    vocab = os.path.join(os.path.realpath(conv), "models", "ggml-vocab-qwen35.gguf")
    kept = {vocab: reader(vocab)} if os.path.exists(vocab) else {}

    def cached(path, *a, **k):
        r = kept.get(os.path.realpath(str(path))) if not a and not k else None
        return r if r is not None else reader(path, *a, **k)
    gguf.GGUFReader = cached


def _child(script, req):
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    import runpy
    import traceback
    code = 0
    try:
        sys.argv = [script] + req["args"]
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - reported as the script's own error would be
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main():
    script = sys.argv[1]
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    sys.path.insert(0, os.path.dirname(script))
    done = set()
    proto = sys.stdout
    for line in sys.stdin:
        req = json.loads(line)
        conv = req["args"][0] if req["args"] else ""
        _prepare(conv if os.path.isdir(conv) else os.path.dirname(conv), done)
        proto.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(script, req)
        deadline = time.time() + req["timeout"]
        rc = None
        while True:
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.time() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                break
            time.sleep(0.02)
        proto.write(json.dumps({"rc": rc}) + "\n")
        proto.flush()


if __name__ == "__main__":
    main()
