#!/usr/bin/env python3
"""The walk of one chat turn between the controller's modules: traces a
parent-token-v1 turn that continues its parked session (4 reply tokens, the
tiny model of tests/integration/test_sessions.py; with --spilled, a session
the controller spilled to disk first, --session-idle-ms 300, which keeps its
slot until one is needed) with gdb breakpoints on
every function of ctl_sched.c, ctl_vm.c and ctl_resid.c (whichever the
build has), on the request's thread and the worker's step loop, from
ctl_vm_take to the park, and prints the entries in order (public functions
called from outside their module: not a module's calls of its own), the
entries per module and the alternations between ctl_sched and ctl_vm
(docs/ARCHITECTURE.md, "Residence").

    /usr/bin/python3 bench/walk.py --build build [--spilled]

Needs gdb and permission to attach to a child process (ptrace_scope 0 or 1).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = ("ctl_sched", "ctl_vm", "ctl_resid")


def functions(build):
    """{symbol: (module, public)} of the traced modules' objects."""
    out = {}
    for lib in ("libwkctl_sched.a", "libwkctl_vm.a", "libwkctl_resid.a"):
        path = os.path.join(build, "controld", lib)
        if not os.path.exists(path):
            continue
        obj = None
        for line in subprocess.run(["nm", path], capture_output=True, text=True).stdout.splitlines():
            if line.endswith(":"):
                obj = os.path.basename(line[:-1]).split("_", 1)[-1].replace(".c.o", "")
                continue
            f = line.split()
            if len(f) == 3 and f[1] in "tT" and obj in MODULES:
                out[f[2]] = (obj, f[1] == "T")
                out.setdefault(f[2].split(".")[0], (obj, f[1] == "T"))  # (a .constprop clone)
    return out


def trace(build, log, spilled):
    os.environ["WKVM_BUILD_DIR"] = os.path.abspath(build)
    sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
    argv, sys.argv = sys.argv, sys.argv[:1]
    import test_sessions as ts  # noqa: E402  (builds the tiny model)
    from wkvm_harness import Stack  # noqa: E402
    sys.argv = argv
    fns = functions(build)
    script = log + ".gdb.py"
    with open(script, "w") as fh:
        fh.write("import gdb\nlog = open(%r, 'w')\n"
                 "class B(gdb.Breakpoint):\n"
                 "    def stop(self):\n"
                 "        up = gdb.selected_frame().older()\n"
                 "        caller = (up.name() if up is not None else None) or '?'\n"
                 "        log.write('%%d %%s %%s\\n' %% (gdb.selected_thread().num, self.location,\n"
                 "                                      caller))\n"
                 "        log.flush()\n"
                 "        return False\n" % log)
        for fn in sorted(fns):
            fh.write("try:\n    B(%r, internal=True)\nexcept Exception:\n    pass\n" % fn)
    extra = ["--session-idle-ms", "300"] if spilled else []
    with Stack(model=ts.MODEL, extra_ctl=extra) as s:
        ts.up(s)
        c = ts.Chat(s, "walk")
        c.turn(ts.clean_text(s, [], "hello"))
        if spilled:  # (as test_idle_sessions_move_to_disk)
            s.wait(lambda: ts.metric(s, "wkvm_sessions", 'tier="cold"') >= 1 and
                   ts.metric(s, "wkvm_sessions", 'tier="hot"') == 0, "idle session spilled")
        g = subprocess.Popen(["gdb", "-q", "-batch", "-p", str(s.ctl.pid), "-ex",
                              "set pagination off", "-ex", "source " + script, "-ex", "continue"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(8)  # gdb attached, breakpoints set
        j = c.turn("and then", max_tokens=4)
        time.sleep(1)
        g.send_signal(2)
        time.sleep(2)
        g.kill()
    cached = (j.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return fns, cached


def walk(fns, log):
    lines = [ln.split() for ln in open(log) if len(ln.split()) == 3]
    start = next(i for i, ln in enumerate(lines) if ln[1] == "ctl_vm_take")
    req = lines[start][0]
    end = max(i for i, ln in enumerate(lines) if ln[0] == req and ln[1].startswith("ctl_vm_put"))
    win = lines[start:end + 1]
    threads = {req} | {ln[0] for ln in win if ln[1].startswith(("ctl_job_hook", "ctl_sched_pick"))}
    def mod(fn):
        base = fn.split(".")[0]
        if base in fns:
            return fns[base][0]
        # a static function the compiler inlined has no symbol: its name says its module
        prefixes = [(m + "_", m) for m in MODULES] + [("ctl_job_", "ctl_sched")]
        return next((m for p, m in prefixes if base.startswith(p)), "?")
    # entries: public functions called from outside their module (ctl_ckpt, ctl_chat, ...
    # or the other traced module), not a module's calls of its own public functions
    calls = [fns.get(ln[1].split(".")[0], ("?", False)) + (ln[1], mod(ln[2])) for ln in win
             if ln[0] in threads]
    pub = [(m, name) for m, p, name, by in calls if p and by != m]
    mods = [m for m, _ in pub]
    sv = [m for m in mods if m in ("ctl_sched", "ctl_vm")]
    alt = sum(1 for a, b in zip(sv, sv[1:]) if a != b)
    print(" > ".join(name for _, name in pub))
    print(f"entries {len(pub)}: " + ", ".join(f"{m} {mods.count(m)}" for m in MODULES) +
          f"; ctl_sched<->ctl_vm alternations {alt}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("WKVM_BUILD_DIR", os.path.join(SRC, "build")))
    ap.add_argument("--spilled", action="store_true",
                    help="trace a turn whose parked session had been spilled to disk")
    ap.add_argument("--keep", metavar="LOG", help="also copy the raw trace (thread, function, "
                    "caller per line) to LOG")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="wkvm-walk-") as tmp:
        log = os.path.join(tmp, "trace.log")
        fns, cached = trace(args.build, log, args.spilled)
        print(f"(the traced turn resumed {cached} cached tokens)")
        walk(fns, log)
        if args.keep:
            shutil.copyfile(log, args.keep)


if __name__ == "__main__":
    main()
