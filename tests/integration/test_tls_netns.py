#!/usr/bin/env python3
"""The worker link across a real network boundary, with mutual TLS.

The test makes two network namespaces joined by a veth pair (10.77.N.1 in
"A", 10.77.N.2 in "B", N from the pid so parallel runs do not collide),
then runs itself inside A: the controller listens for workers on
tls+tcp://10.77.N.1 with a CA made by deploy/wkvm-certs; worker w1 runs in B
and dials it across the veth pair. Checked:
  - a chat completion served by the worker in the other namespace;
  - a live migration of a running stream from w1 (B) to w2 (A) across the
    link: the client gets exactly the tokens of an unmigrated run;
  - a worker whose certificate comes from another CA is never admitted
    (and says so in its log), nor is one expecting another server name;
  - plain tcp:// to the non-loopback address is refused by both daemons.
Needs root and `ip netns` (iproute2): exits 77 with the reason otherwise.
The namespaces are removed whatever happens.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wkvm_harness import CONTROLD, MKMODEL, WORKERD, Stack, run_tests  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CERTS = os.path.join(HERE, "..", "..", "deploy", "wkvm-certs")
# names from the outer process's pid (the inner one, in namespace A, gets them from it)
TAG = int(os.environ.get("WKVM_NETNS_TAG", os.getpid()))
os.environ["WKVM_NETNS_TAG"] = str(TAG)
NET = 10 + TAG % 200  # the third octet
NS_A, NS_B = "wkvm-a-%d" % TAG, "wkvm-b-%d" % TAG
ADDR_A, ADDR_B = "10.77.%d.1" % NET, "10.77.%d.2" % NET
N = 3000  # stream length: long enough to be caught mid-way


def sh(*cmd, check=True):
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True, timeout=60)


def netns_up():
    """Makes the namespaces and the veth pair; returns None or why not."""
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip)"
    try:
        sh("ip", "netns", "add", NS_A)
        sh("ip", "netns", "add", NS_B)
        va, vb = "wkva%d" % (TAG % 100000), "wkvb%d" % (TAG % 100000)
        sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
        sh("ip", "link", "set", va, "netns", NS_A)
        sh("ip", "link", "set", vb, "netns", NS_B)
        for ns, dev, addr in ((NS_A, va, ADDR_A), (NS_B, vb, ADDR_B)):
            sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, OSError) as e:
        netns_down()
        err = getattr(e, "stderr", "") or str(e)
        return "ip netns is not usable here: %s" % err.strip()
    return None


def netns_down():
    for ns in (NS_A, NS_B):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=60)


class NetStack(Stack):
    """A Stack whose controller listens on tls+tcp://ADDR_A (this process
    runs inside namespace A) and whose workers may run in namespace B."""

    def __init__(self, pki, model, **kw):
        self.pki = pki
        self.link_port = 20000 + TAG % 20000
        self.link = "tls+tcp://%s:%d" % (ADDR_A, self.link_port)
        extra = ["--worker-url", self.link, "--worker-tls-ca", pki + "/ca.pem",
                 "--worker-tls-cert", pki + "/ctl.pem", "--worker-tls-key", pki + "/ctl.key"]
        super().__init__(model=model, extra_ctl=extra, **kw)

    def start_net_worker(self, wid, ns=None, cert=None, ca=None, server_name="ctl"):
        cert = cert or "%s/%s" % (self.pki, wid)
        args = [WORKERD, "--data-dir", self.data, "--id", wid, "--backend", "cpu",
                "--threads", "1", "--controller", self.link,
                "--tls-ca", ca or self.pki + "/ca.pem", "--tls-cert", cert + ".pem",
                "--tls-key", cert + ".key", "--tls-server-name", server_name]
        if ns:
            args = ["ip", "netns", "exec", ns] + args
        p = subprocess.Popen(args, stdout=self._log("worker-" + wid), stderr=subprocess.STDOUT)
        self.procs.append(p)
        self.workers[wid] = p
        return p


def make_pki(root):
    pki, other = os.path.join(root, "pki"), os.path.join(root, "other-ca")
    for cmd in (["init", pki], ["issue", pki, "ctl"], ["issue", pki, "w1"],
                ["issue", pki, "w2"], ["issue", pki, "w3"], ["init", other],
                ["issue", other, "rogue"]):
        sh(CERTS, *cmd)
    return pki, other


def body(**kw):
    b = {"model": "tiny", "prompt": [7, 8, 9, 10], "max_tokens": N, "ignore_eos": True,
         "return_token_ids": True, "temperature": 0}
    b.update(kw)
    return b


def ids_of(lines):
    out = []
    for line in lines:
        line = line.strip()
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            ev = json.loads(line[6:])
            assert "error" not in ev, ev
            out += ev["choices"][0].get("token_ids", [])
    return out


def registered(s, state=None):
    return sorted(w["id"] for w in s.workers_list() if state is None or w["state"] == state)


def inner(root):
    model = os.path.join(root, "tiny")
    sh(MKMODEL, "--out", model, "--layers", "2", "--embd", "64", "--head-size", "16",
       "--ffn", "128", "--vocab", "512", "--seed", "5")
    pki, other = make_pki(root)

    def test_chat_and_migration_across_namespaces():
        with NetStack(pki, model, slots=2, workers_expected=1) as s:
            s.start_controller()
            s.start_net_worker("w1", ns=NS_B)
            s.wait(lambda: s.get("/ready").status == 200, "w1 (namespace B) ready over TLS")
            r = s.post("/v1/chat/completions",
                       body={"model": "tiny", "max_tokens": 8, "temperature": 0,
                             "messages": [{"role": "user", "content": "hello across"}]})
            assert r.status == 200, r.body
            assert r.json()["choices"][0]["message"]["content"] is not None
            want = s.post("/v1/completions", body=body()).json()["choices"][0]["token_ids"]
            assert len(want) == N
            req = urllib.request.Request(s.url + "/v1/completions", method="POST",
                                         data=json.dumps(body(stream=True)).encode(),
                                         headers={"Content-Type": "application/json"})
            st = urllib.request.urlopen(req, timeout=120)
            head = [st.readline() for _ in range(4)]
            s.start_net_worker("w2")  # namespace A, over the same TLS listener
            s.wait(lambda: registered(s, "ready") == ["w1", "w2"] and
                   s.get("/ready").json()["workers_ready"] == 2, "w2 ready and scheduled")
            found = {}

            def mid():
                for sl in s.get("/admin/slots").json()["slots"]:
                    if sl["state"] == "running" and 4 < sl["tokens"] < 4 + N:
                        found["sl"] = sl
                        return True
                return False
            s.wait(mid, "the stream running mid-way", timeout=120)
            assert found["sl"]["worker"] == "w1", found
            r = s.post("/admin/slots/%s/migrate" % found["sl"]["id"], body={"to": "w2"})
            assert r.status == 200, r.body
            rep = r.json()
            assert rep["result"] == "committed" and rep["to"].startswith("w2:"), rep
            assert rep["bytes"] > 0, rep
            got = ids_of(head) + ids_of(st)
            assert got == want, (len(got), len(want))

    def test_foreign_certificates_refused():
        with NetStack(pki, model, slots=2, workers_expected=1) as s:
            s.start_controller()
            # a certificate from another CA, from the other namespace
            s.start_net_worker("rogue", ns=NS_B, cert=other + "/rogue")
            # the right CA and certificate, but expecting another controller name
            s.start_net_worker("w3", ns=NS_B, server_name="not-the-controller")
            s.start_net_worker("w1", ns=NS_B)
            s.wait(lambda: registered(s) == ["w1"], "w1 registered")
            # the refused ones keep retrying: they are still out after the
            # link warning (10 s), which names TLS
            s.wait(lambda: all("no controller connection" in open(
                os.path.join(s.data, "worker-%s.log" % w)).read() for w in ("rogue", "w3")),
                "the refused workers' link warnings", timeout=60)
            assert registered(s) == ["w1"], registered(s)
            log = open(os.path.join(s.data, "worker-rogue.log")).read()
            assert "TLS: check" in log, log[-500:]
            assert s.get("/ready").status == 200

    def test_plain_tcp_to_a_remote_address_refused():
        port = 40000 + TAG % 20000
        d = tempfile.mkdtemp(prefix="wkvm-plain-", dir=root)
        p = subprocess.run([CONTROLD, "--data-dir", d, "--port", str(port + 1),
                            "--worker-url", "tcp://%s:%d" % (ADDR_A, port)],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and "refusing to listen" in p.stderr, (p.returncode, p.stderr)
        p = subprocess.run(["ip", "netns", "exec", NS_B, WORKERD, "--data-dir", d,
                            "--backend", "cpu", "--controller", "tcp://%s:%d" % (ADDR_A, port)],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and "refusing to dial" in p.stderr, (p.returncode, p.stderr)
        # TLS files with a plain URL, and a tls+tcp URL without them, are usage errors
        p = subprocess.run([CONTROLD, "--data-dir", d, "--worker-url",
                            "tls+tcp://%s:%d" % (ADDR_A, port)],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and "--link-tls-ca" in p.stderr, p.stderr  # (old flags: aliases)

    return run_tests([test_chat_and_migration_across_namespaces,
                      test_foreign_certificates_refused,
                      test_plain_tcp_to_a_remote_address_refused])


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--inner":
        return inner(sys.argv[2])
    why = netns_up()
    if why is not None:
        print("SKIP: " + why)
        return 77
    root = tempfile.mkdtemp(prefix="wkvm-netns-")
    try:
        p = subprocess.run(["ip", "netns", "exec", NS_A, sys.executable, os.path.abspath(__file__),
                            "--inner", root], timeout=900)
        return p.returncode
    finally:
        netns_down()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
