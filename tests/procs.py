"""Processes of this test run: the descendants of a process, and those among them whose command
line starts with a name. Tests that kill or count processes look only here, never at the whole
machine (another test session on it has processes of the same names)."""

from __future__ import annotations

import os
from pathlib import Path


def descendants(pid: int | None = None) -> list[int]:
    """Every process below ``pid`` (default: this one), children first."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [os.getpid() if pid is None else pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def named(prefix: str, pid: int | None = None) -> list[int]:
    """The descendants of ``pid`` (default: this process) whose command line starts with ``prefix``
    (Ray names its workers' processes ``ray::ActorClass``)."""
    found = []
    for p in descendants(pid):
        try:
            if Path(f"/proc/{p}/cmdline").read_bytes().startswith(prefix.encode()):
                found.append(p)
        except OSError:
            pass
    return found
