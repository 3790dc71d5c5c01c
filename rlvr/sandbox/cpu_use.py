"""What the pool's CPU accounting reads from ``/proc``: a run's processes and the CPU time they used."""

from __future__ import annotations

import os


def stat_ticks(pid: int) -> tuple[int, int, bool] | None:
    """(parent pid, utime + stime + reaped children's in clock ticks, runnable) of a process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    return int(fields[1]), sum(int(x) for x in fields[11:15]), fields[0] == b"R"


def run_members(runs: list[tuple[int, int | None, int | None]], by_uid: bool) -> list[set[int]]:
    """The live processes of each run; ``runs`` holds (worker pid, run pid, slot uid). With a
    uid per slot they are the ones owned by that uid (a cheap stat of each ``/proc`` entry) plus
    the run's first process (which may be non-dumpable, so root-owned in ``/proc``); otherwise
    every descendant of the worker (a read of every process's ``stat``)."""
    members: list[set[int]] = [{run} if run else set() for _, run, _ in runs]
    try:
        entries = [e for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        entries = []
    if by_uid:
        slot_of = {uid: i for i, (_, _, uid) in enumerate(runs) if uid is not None}
        for e in entries:
            try:
                i = slot_of.get(e.stat().st_uid)
            except OSError:
                continue
            if i is not None:
                members[i].add(int(e.name))
        return members
    children: dict[int, list[int]] = {}
    for e in entries:
        st = stat_ticks(int(e.name))
        if st is not None:
            children.setdefault(st[0], []).append(int(e.name))
    for i, (worker, _, _) in enumerate(runs):
        todo = list(children.get(worker, []))
        while todo:
            pid = todo.pop()
            members[i].add(pid)
            todo += children.get(pid, [])
    return members


def cpu_ticks(pids: set[int]) -> tuple[int, bool]:
    """(CPU ticks used so far, whether any is runnable now) of these processes (gone ones: 0)."""
    stats = [st for st in map(stat_ticks, pids) if st is not None]
    return sum(st[1] for st in stats), any(st[2] for st in stats)
