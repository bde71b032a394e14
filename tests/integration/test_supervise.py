#!/usr/bin/env python3
"""deploy/wkvm up keeps its processes alive, as a user sees it.

`up` runs on a temporary data dir; its build dir is a copy of the real
one's binaries except wkvm-workerd, a wrapper that runs the real worker
unless a flag file says to fail at start-up (a crash the test can switch
on). Checked:
  - a worker killed with SIGKILL is restarted, counted in `status`, and the
    stack is ready again; `status` shows /ready's 503 and reason while the
    worker is away, not "no answer";
  - the controller killed with SIGKILL is restarted; a state created before
    is still there and continues identically;
  - a worker that fails at every start is given up on after 5 failures
    within 60 s, and `status` says so with its last log lines;
  - `down` stops everything (nothing is restarted behind it).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wkvm_harness import CONTROLD, MKMODEL, WORKERD, free_port, http, run_tests  # noqa: E402

WKVM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "wkvm")
ROOT = tempfile.mkdtemp(prefix="wkvm-supervise-")
FAKE = os.path.join(ROOT, "build")
CRASH = os.path.join(ROOT, "crash-at-start")
DATA = os.path.join(ROOT, "data")
PORT = free_port()
URL = "http://127.0.0.1:%d" % PORT


def fake_build():
    os.makedirs(os.path.join(FAKE, "controld"))
    os.makedirs(os.path.join(FAKE, "workerd"))
    os.makedirs(os.path.join(FAKE, "tools"))
    open(os.path.join(FAKE, "build.ninja"), "w").close()  # "an existing build": used as is
    os.symlink(os.path.abspath(CONTROLD), os.path.join(FAKE, "controld", "wkvm-controld"))
    os.symlink(os.path.abspath(MKMODEL), os.path.join(FAKE, "tools", "wkvm-mkmodel"))
    os.symlink(os.path.abspath(os.path.join(os.path.dirname(MKMODEL), "wkvmctl")),
               os.path.join(FAKE, "tools", "wkvmctl"))
    w = os.path.join(FAKE, "workerd", "wkvm-workerd")
    with open(w, "w") as f:
        f.write("#!/bin/sh\nif [ -e '%s' ]; then echo 'injected start-up crash' >&2; exit 3; fi\n"
                "exec '%s' \"$@\"\n" % (CRASH, os.path.abspath(WORKERD)))
    os.chmod(w, 0o755)


def wkvm(*args, timeout=300):
    env = dict(os.environ, WKVM_BUILD_DIR=FAKE, WKVM_UP_TIMEOUT="120")
    return subprocess.run([WKVM] + list(args), capture_output=True, text=True, timeout=timeout,
                          env=env)


def status():
    return wkvm("status", "--data", DATA)


def pid(name):
    with open(os.path.join(DATA, "run", name + ".pid")) as f:
        return int(f.read())


def wait(cond, what, timeout=90):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            if cond():
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise AssertionError("timed out waiting for %s\n%s" % (what, status().stdout))


def ready():
    try:
        return http("GET", URL + "/ready", timeout=5).status == 200
    except OSError:
        return False


def gen(state):
    r = http("POST", URL + "/v1/states/%s/generate" % state,
             body={"prompt_ids": [5, 6, 7], "max_tokens": 8, "temperature": 0,
                   "return_token_ids": True, "ignore_eos": True})
    assert r.status == 200, r.body
    return r.json()["choices"][0]["token_ids"]


def test_up_restarts_and_gives_up():
    p = wkvm("up", "--data", DATA, "--port", str(PORT), "--slots", "4")
    assert p.returncode == 0, p.stdout + p.stderr
    st = status()
    assert st.returncode == 0, st.stdout
    assert "worker-0:   running" in st.stdout and "restarts 0" in st.stdout, st.stdout
    assert "ready:      yes (HTTP 200)" in st.stdout, st.stdout
    # where things are, readable: URL, data, build, model, the wkvmctl to use, a workers table,
    # the logs command for this data dir, which worker id each worker process has
    for want in ("url:        " + URL, "data:       " + DATA, "build:      " + FAKE,
                 "deploy/wkvm logs --data " + DATA + ")", "restarts 0, worker id w0)",
                 "model:      " + os.path.join(DATA, "models", "wkvm-demo"),
                 "wkvmctl:    " + os.path.join(FAKE, "tools", "wkvmctl") + " --url " + URL):
        assert want in st.stdout, (want, st.stdout)
    assert "{" not in st.stdout and "    ID " in st.stdout.upper(), st.stdout
    lg = wkvm("logs", "--data", DATA, "-n", "2", "controld")
    assert lg.returncode == 0 and len(lg.stdout.splitlines()) == 2, lg.stdout + lg.stderr
    lg = wkvm("logs", "--data", DATA, "-n", "1", "nope")
    assert lg.returncode == 1 and "controld" in lg.stderr, lg.stderr
    r = http("POST", URL + "/v1/states",
             body={"model": "wkvm-demo", "name": "keep", "prompt_ids": [1, 2, 3, 4]})
    assert r.status == 201, r.body
    want = gen("keep@1")

    # the worker dies: restarted, counted, ready again
    old = pid("worker-0")
    os.kill(old, signal.SIGKILL)
    seen = {}

    def away():  # /ready's answer while the worker is away, as status prints it
        out = status().stdout
        if "(HTTP 503)" in out:
            seen["503"] = out
        return "503" in seen or ready()
    wait(away, "status while the worker is away")
    wait(lambda: ready() and pid("worker-0") != old, "the restarted worker")
    st = status()
    assert "worker-0:   running" in st.stdout and "restarts 1" in st.stdout, st.stdout
    if "503" in seen:  # usually seen; a very fast restart may beat the poll
        assert "no worker registered" in seen["503"] and "no answer" not in seen["503"], seen
    assert gen("keep@1") == want

    # the controller dies: restarted; the state is there and continues the same
    old = pid("controld")
    os.kill(old, signal.SIGKILL)
    wait(lambda: ready() and pid("controld") != old, "the restarted controller")
    assert "controld:   running" in status().stdout
    got = http("GET", URL + "/v1/states/keep@1")
    assert got.status == 200 and got.json()["token_ids"] == [1, 2, 3, 4], got.body
    assert gen("keep@1") == want

    # a worker that fails at every start is given up on, and status says why
    open(CRASH, "w").close()
    os.kill(pid("worker-0"), signal.SIGKILL)
    wait(lambda: os.path.exists(os.path.join(DATA, "run", "worker-0.gaveup")),
         "the supervisor giving up", timeout=120)
    st = status()
    assert st.returncode == 1, st.stdout
    assert "worker-0:   given up after 4 restarts" in st.stdout, st.stdout
    assert "injected start-up crash" in st.stdout, st.stdout
    assert "controld:   running" in st.stdout, st.stdout
    sup = open(os.path.join(DATA, "logs", "supervisor.log")).read()
    assert "failed 5 times within 60 s: given up" in sup, sup[-800:]

    # down stops everything; nothing comes back
    os.unlink(CRASH)
    pids = [pid("controld"), pid("supervisor")]
    d = wkvm("down", "--data", DATA)
    assert d.returncode == 0, d.stdout + d.stderr
    time.sleep(2)
    for p_ in pids:
        try:
            os.kill(p_, 0)
            raise AssertionError("pid %d still alive after down" % p_)
        except ProcessLookupError:
            pass
    assert not ready()
    assert "not running" in status().stdout


def test_help_and_bad_arguments():
    """Every command answers --help (test --help runs nothing); a missing value is an
    error naming the option, not a bash message."""
    for args in (["--help"], ["up", "--help"], ["down", "--help"], ["status", "--help"],
                 ["logs", "--help"], ["test", "--help"]):
        p = wkvm(*args, timeout=20)
        assert p.returncode == 0 and "deploy/wkvm" in p.stdout, (args, p.stdout, p.stderr)
        assert "==" not in p.stdout, (args, p.stdout)  # (test's run prints "== build")
    p = wkvm("--version", timeout=20)
    assert p.returncode == 0 and p.stdout.startswith("wkvm "), p.stdout
    for args in (["status", "--data"], ["up", "--port"], ["logs", "-n"]):
        p = wkvm(*args, timeout=20)
        assert p.returncode == 1 and "needs a value" in p.stderr, (args, p.stderr)
        assert "unbound" not in p.stderr, p.stderr


def main():
    fake_build()
    try:
        return run_tests([test_help_and_bad_arguments, test_up_restarts_and_gives_up])
    finally:
        wkvm("down", "--data", DATA, timeout=200)
        shutil.rmtree(ROOT, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
