"""keep_freed_memory: a step's large tensors reuse the previous step's pages (no page faults)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or not os.path.exists("/proc/self/stat"),
                                reason="glibc's malloc on Linux only")

# Allocate, touch and free the same large tensors a few times, as training steps do; report the
# minor page faults of the last rounds (the first ones may grow the heap).
PROGRAM = """
import json, resource, sys, torch
from rlvr.train.allocator import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
def step():
    a = torch.ones(48 << 18)          # 48 MiB: above glibc's largest dynamic mmap threshold
    b = torch.ones(6 << 18) * 2       # 6 MiB
    return float(a[-1] + b[-1])
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(json.dumps({"applied": applied, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _faults(mode: str, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_memory_is_reused_without_page_faults():
    default, kept = _faults("default"), _faults("keep")
    assert kept["applied"] is True
    # 5 rounds x 54 MiB of fresh pages by default (4 KiB each: ~69,000 faults); none when kept.
    assert default["faults"] > 5 * (48 << 20) // 4096 * 0.9
    assert kept["faults"] < 200


def test_can_be_turned_off():
    off = _faults("keep", RLVR_KEEP_FREED_MEMORY="0")
    assert off["applied"] is False and off["faults"] > 5 * (48 << 20) // 4096 * 0.9
