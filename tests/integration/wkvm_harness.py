"""Helpers for integration tests: start the real daemons on loopback with a
temporary data dir, talk HTTP like a client, and clean up every process."""
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

BUILD = os.environ.get("WKVM_BUILD_DIR", os.path.join(os.path.dirname(__file__), "../../build"))
# The workers' backend: cpu, or (the gpu suite) cuda on device 0, where a
# test without a CUDA device skips (77) before it starts anything.
BACKEND = os.environ.get("WKVM_TEST_BACKEND", "cpu")
if BACKEND == "cuda" and not glob.glob("/dev/nvidia[0-9]*"):
    print("SKIP: WKVM_TEST_BACKEND=cuda and no CUDA device (no /dev/nvidia<N>)", flush=True)
    sys.exit(77)
CONTROLD = os.path.join(BUILD, "controld", "wkvm-controld")
WORKERD = os.path.join(BUILD, "workerd", "wkvm-workerd")
MKMODEL = os.path.join(BUILD, "tools", "wkvm-mkmodel")


def gen_qwen35(out, seed, *args):
    """A random-weight Qwen3.5-layout hybrid (tests/reference/gen_qwen35.py: 4 layers,
    attention every 2nd, a 512-token raw-byte vocabulary, plus args) written to out."""
    ref = os.path.join(os.path.dirname(__file__), "..", "reference", "gen_qwen35.py")
    subprocess.run([sys.executable, ref, "--out", out, "--seed", str(seed), "--layers", "4",
                    "--interval", "2", "--vocab", "512"] + list(args), check=True,
                   capture_output=True, timeout=120)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Response:
    def __init__(self, status, body, headers):
        self.status = status
        self.body = body
        self.headers = headers

    def json(self):
        return json.loads(self.body)


def http(method, url, body=None, headers=None, timeout=30):
    data = None
    hdrs = dict(headers or {})
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return Response(r.status, r.read(), dict(r.headers))
    except urllib.error.HTTPError as e:
        return Response(e.code, e.read(), dict(e.headers))


class Stack:
    """A controller plus workers in a temp data dir. Use as a context manager."""

    def __init__(self, model=None, workers_expected=1, slots=4, extra_ctl=(), data=None):
        self.tmp = None if data else tempfile.TemporaryDirectory(prefix="wkvm-it-")
        self.data = data or self.tmp.name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = model
        self.workers_expected = workers_expected
        self.slots = slots
        self.extra_ctl = list(extra_ctl)
        self.ctl = None
        self.workers = {}
        self.procs = []  # every process started, for cleanup
        self.logs = []

    def _log(self, name):
        path = os.path.join(self.data, f"{name}.log")
        self.logs.append(path)
        return open(path, "ab")

    def start_controller(self):
        args = [CONTROLD, "--port", str(self.port), "--data-dir", self.data,
                "--workers", str(self.workers_expected), "--slots", str(self.slots),
                "--heartbeat-ms", "200"] + self.extra_ctl
        if self.model:
            args += ["--model", self.model]
        self.ctl = subprocess.Popen(args, stdout=self._log("controld"), stderr=subprocess.STDOUT)
        self.procs.append(self.ctl)
        self.wait(lambda: self.get("/health").status == 200, "controller /health")

    def start_worker(self, wid="w0", extra=()):
        args = [WORKERD, "--data-dir", self.data, "--id", wid, "--backend", BACKEND,
                "--threads", "1"] + list(extra)
        p = subprocess.Popen(args, stdout=self._log(f"worker-{wid}"), stderr=subprocess.STDOUT)
        self.procs.append(p)
        self.workers.setdefault(wid, p)
        return p

    def kill_worker(self, wid, sig=signal.SIGKILL):
        p = self.workers.pop(wid)
        p.send_signal(sig)
        p.wait(timeout=20)

    def kill_controller(self, sig=signal.SIGKILL):
        self.ctl.send_signal(sig)
        self.ctl.wait(timeout=20)
        self.ctl = None

    def get(self, path, **kw):
        try:
            return http("GET", self.url + path, **kw)
        except (ConnectionError, urllib.error.URLError, OSError):
            return Response(0, b"", {})

    def post(self, path, body=None, **kw):
        return http("POST", self.url + path, body=body, **kw)

    def wait(self, cond, what, timeout=60):
        t0 = time.time()
        while time.time() - t0 < timeout:
            try:
                if cond():
                    return
            except (ConnectionError, urllib.error.URLError, OSError, ValueError, KeyError,
                    IndexError, TypeError):
                pass
            if self.ctl is not None and self.ctl.poll() is not None:
                raise AssertionError(f"controller exited ({self.ctl.returncode}) waiting for "
                                     f"{what}\n{self.tail()}")
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}\n{self.tail()}")

    def workers_list(self, **kw):
        return self.get("/admin/workers", **kw).json()["workers"]

    def tail(self):
        out = []
        for p in self.logs:
            try:
                with open(p, "rb") as f:
                    out.append(f"--- {p}\n" + f.read()[-3000:].decode(errors="replace"))
            except OSError:
                pass
        return "\n".join(out)

    def stop(self):
        self.workers.clear()
        # Workers first, then the controller (it is last in start order only by chance).
        procs = [p for p in self.procs if p is not self.ctl] + [p for p in self.procs if p is self.ctl]
        for p in procs:
            if p.poll() is None:
                if p is self.ctl and self.tmp is not None:
                    # Its data dir is removed next: SIGKILL. A graceful stop (SIGTERM)
                    # writes checkpoints nobody reads and waits out civetweb's poll
                    # (~2 s a stack); the tests that need it call kill_controller(SIGTERM).
                    p.kill()
                else:
                    p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        if self.tmp:
            self.tmp.cleanup()


def run_tests(tests):
    """Runs test functions, prints a summary line, returns the exit code."""
    passed = failed = 0
    for t in tests:
        t0 = time.time()
        try:
            t()
            passed += 1
            print(f"PASS {t.__name__} ({time.time() - t0:.1f}s)", flush=True)
        except Exception as e:  # noqa: BLE001 - report every failure
            failed += 1
            print(f"FAIL {t.__name__}: {e}", flush=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0
