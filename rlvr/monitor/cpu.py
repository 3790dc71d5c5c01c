"""How idle the machine is, for benchmarks that must report the load they ran under."""

from __future__ import annotations

import time
from pathlib import Path


def idle_cpu(seconds: float = 1.0) -> float:
    """Fraction of CPU time idle over a short window (Linux ``/proc/stat``; NaN elsewhere).

    Load averages mislead on these VMs, so this samples idle + iowait jiffies directly."""
    def read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)
    try:
        i0, t0 = read()
        time.sleep(seconds)
        i1, t1 = read()
        return (i1 - i0) / max(t1 - t0, 1)
    except OSError:
        return float("nan")
