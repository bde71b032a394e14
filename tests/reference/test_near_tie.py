#!/usr/bin/env python3
"""The parity scripts' greedy rule (test_parity.check_greedy) on a fake
reference with chosen logits: on the CUDA backend a differing greedy id is
accepted only at a near tie (the reference's gap under NEAR_TIE std), a
wide gap fails, and the CPU backend gets no slack at all. 77 without numpy."""
import os
import sys

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy is not installed for %s" % sys.executable)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_parity import NEAR_TIE, Result, check_greedy  # noqa: E402


class FakeRef:
    """Logits after the prompt, then after each step, fixed in advance."""

    V = 4

    def __init__(self, rows):
        self.rows = [np.asarray(r, dtype=np.float64) for r in rows]

    def forward(self, tokens, state=None):
        st = {"i": 0}
        return np.stack([self.rows[0]] * len(tokens)), st

    def step(self, token, st):
        st["i"] += 1
        return self.rows[st["i"]]


def verdict(backend, gap):
    os.environ["WKVM_PARITY_BACKEND"] = backend
    # the reference picks 1, then 2 (gap `gap` over 3); wkvm picks 1, then 3
    ref = FakeRef([[0, 5, 0, 0], [0, 0, 3 + gap, 3], [0] * 4])
    res = Result("fake")
    check_greedy(res, "x", [1, 3], [1, 2], ref, [7, 7], 1.0)
    return res.checks[0]


def main():
    fails = 0
    cases = [("cuda", NEAR_TIE / 4, True), ("cuda", NEAR_TIE * 4, False),
             ("", NEAR_TIE / 4, False), ("cpu", NEAR_TIE / 4, False)]
    for backend, gap, want in cases:
        what, ok, detail = verdict(backend, gap)
        good = ok == want and (not ok or detail.startswith("near tie"))
        fails += not good
        print("%s backend=%r gap=%.1e: %s %s" % ("ok  " if good else "FAIL", backend, gap,
                                               "accepted" if ok else "refused", detail))
    os.environ["WKVM_PARITY_BACKEND"] = "cuda"
    res = Result("same")
    check_greedy(res, "x", [1, 2], [1, 2], FakeRef([[0] * 4] * 3), [7], 1.0)
    fails += not res.checks[0][1]
    print("%d passed, %d failed" % (len(cases) + 1 - fails, fails))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
