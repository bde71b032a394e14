#!/usr/bin/env python3
"""Chaos under load, the benchmark-sized run of tests/integration/test_chaos.py:
50 streaming clients (chats with reuse, state creates/forks/exports/generates)
while every round SIGKILLs a worker and the controller, SIGSTOPs a worker past
its deadline and fills the data disk (a tmpfs; root only). Prints the figures
as JSON (rounds, faults, requests, errors by kind, states verified) and exits
non-zero when any answer, state or chat turn was wrong.

Usage: bench/chaos.py [--clients 50] [--rounds 5] [--json FILE]
(build first: meson compile -C build; WKVM_BUILD_DIR picks another build dir)
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
os.environ.setdefault("WKVM_BUILD_DIR", os.path.join(HERE, "..", "build"))

import test_chaos  # noqa: E402

if __name__ == "__main__":
    if "--clients" not in sys.argv:
        sys.argv += ["--clients", "50"]
    if "--rounds" not in sys.argv:
        sys.argv += ["--rounds", "5"]
    sys.exit(test_chaos.main())
