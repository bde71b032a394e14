"""Helpers shared by the benchmark drivers in bench/ (stdlib only)."""
import math
import os
import platform
import subprocess


def percentile(xs, p):
    """Linear interpolation between closest ranks; None for an empty list."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def machine():
    """CPU model (lscpu), core count and the load average at the start."""
    info = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            if k.strip() == "Model name":
                info["cpu"] = v.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        info["loadavg_start"] = list(os.getloadavg())
    except OSError:
        pass
    return info
