"""The operation audit log: one JSON line per operation, each chained to the one before by hash.

A record is ``{"seq", "time", "op", ...fields, "prev", "hash"}``: ``prev`` is the previous
record's ``hash`` (64 zeros for the first) and ``hash`` the SHA-256 of ``prev`` and the record's
other fields as canonical JSON, so editing, deleting or reordering a line breaks the chain at that
line. The file is opened for appending only; records are flushed as written and fsynced every
``FSYNC_EVERY`` records or ``FSYNC_S`` seconds, and on close. A record cut short by a crash (the
last line, without its newline) is dropped when the log is opened again, and the chain goes on
from the last whole record, saying so in a ``log_recovered`` record.

Operations written (the ``op`` field): ``tool_call`` (every tool call of a tool environment, with
the tool, a SHA-256 of its arguments, the outcome ``ok | error | refused``, the grant violated when
refused, the tool's grant and the seconds),
``sandbox_exec`` (every sandbox execution: task, kind, code hash, status, seconds), in a GRPO
run ``run_config`` (the config's digest; a resume says at which step) and ``model_load``, in
``rlvr serve --op-log PATH`` ``http_request`` (method, path, status, outcome, client, a digest of
the bearer key, never the key), ``model_load`` and ``weights_update``, and ``log_opened`` /
``log_recovered`` / ``log_closed``. A training run writes ``<run>/operations.jsonl`` (``open_log``;
the process's current log is what ``write`` appends to; a Ray actor ``capture``s its records and
the trainer ``replay``s them, with ``origin`` and ``at``). ``verify(path)`` checks the chain and
counts; ``flags`` says what deserves a look; ``rlvr audit log PATH`` prints both.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GENESIS = "0" * 64
FSYNC_EVERY = 64
FSYNC_S = 1.0


def digest(value: Any) -> str:
    """SHA-256 of ``value`` as canonical JSON (what a record keeps of arguments)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _chain_hash(prev: str, body: dict) -> str:
    return hashlib.sha256((prev + json.dumps(body, sort_keys=True, separators=(",", ":"))).encode()).hexdigest()


class OpLog:
    """An open, append-only, hash-chained log (thread-safe)."""

    def __init__(self, path: str | Path, actor: str = "") -> None:
        self.path, self.actor = Path(path), actor
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.seq, self.prev, cut = 0, GENESIS, 0
        if self.path.exists():
            self.seq, self.prev, cut = _tail(self.path)
        self._file = open(self.path, "a", encoding="utf-8")
        self._unsynced, self._synced_at = 0, time.monotonic()
        self.write("log_recovered" if cut else "log_opened", **({"cut_bytes": cut} if cut else {}))

    def write(self, op: str, **fields: Any) -> None:
        with self._lock:
            body = {"seq": self.seq + 1, "time": round(time.time(), 3), "op": op, **fields,
                    **({"actor": self.actor} if self.actor else {}), "prev": self.prev}
            h = _chain_hash(self.prev, body)
            self._file.write(json.dumps({**body, "hash": h}, separators=(",", ":")) + "\n")
            self._file.flush()
            self.seq, self.prev = self.seq + 1, h
            self._unsynced += 1
            if self._unsynced >= FSYNC_EVERY or time.monotonic() - self._synced_at >= FSYNC_S:
                self._sync()

    def _sync(self) -> None:
        os.fsync(self._file.fileno())
        self._unsynced, self._synced_at = 0, time.monotonic()

    def close(self) -> None:
        self.write("log_closed")
        with self._lock:
            self._sync()
            self._file.close()


def _tail(path: Path) -> tuple[int, str, int]:
    """(seq, hash) of the last whole record, and the bytes of a cut last line, which is removed."""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    cut = len(data) - end
    if cut:
        with open(path, "r+b") as f:
            f.truncate(end)
    lines = data[:end].splitlines()
    if not lines:
        return 0, GENESIS, cut
    last = json.loads(lines[-1])
    return int(last["seq"]), str(last["hash"]), cut


# ---------------------------------------------------------------- the process's current log

class Capture:
    """Records kept in memory instead of written: a worker process (a Ray actor) that has no
    run log captures its operations and returns them with its results; ``replay`` writes them
    into the run's log."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, op: str, **fields: Any) -> None:
        self.records.append({"op": op, "at": round(time.time(), 3), **fields})


_CURRENT: OpLog | Capture | None = None


@contextmanager
def capture() -> Iterator[list[dict[str, Any]]]:
    """For the block, ``write`` collects into the yielded list (then the previous log is back)."""
    global _CURRENT
    previous, cap = _CURRENT, Capture()
    _CURRENT = cap
    try:
        yield cap.records
    finally:
        _CURRENT = previous


def replay(records: list[dict[str, Any]], origin: str) -> None:
    """Write captured ``records`` into the current log, each with its ``origin`` (the worker) and
    ``at`` (when it happened there)."""
    for rec in records:
        fields = {k: v for k, v in rec.items() if k != "op"}
        write(rec["op"], origin=origin, **fields)


def open_log(path: str | Path, actor: str = "") -> OpLog:
    """Open ``path`` as this process's operation log (``write`` appends to it)."""
    global _CURRENT
    _CURRENT = OpLog(path, actor)
    return _CURRENT


def close_log() -> None:
    global _CURRENT
    if _CURRENT is not None:
        _CURRENT.close()
        _CURRENT = None


def write(op: str, **fields: Any) -> None:
    """Append to the current log; nothing when none is open."""
    if _CURRENT is not None:
        _CURRENT.write(op, **fields)


# ---------------------------------------------------------------- verification


@dataclass
class Verified:
    records: int = 0
    intact: bool = True
    broken_line: int | None = None
    reason: str = ""
    cut_tail: bool = False
    ops: Counter = field(default_factory=Counter)
    refused: list[dict] = field(default_factory=list)
    tools: Counter = field(default_factory=Counter)  # tool calls by tool
    violations: Counter = field(default_factory=Counter)  # refused tool calls by grant violation
    minutes: Counter = field(default_factory=Counter)  # records by minute (epoch // 60)


def verify(path: str | Path) -> Verified:
    """Check the chain of ``path`` line by line: each record's ``prev`` is the hash before it, its
    ``hash`` recomputes, ``seq`` counts up. A last line without its newline is a record cut by a
    crash (``cut_tail``), not a break. Counts the operations and lists refused or failed ones."""
    out, prev, seq = Verified(), GENESIS, 0
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:
        out.cut_tail = True
        lines.pop()
    for n, raw in enumerate(lines, 1):
        try:
            rec = json.loads(raw)
            h = rec.pop("hash")
        except (ValueError, KeyError, AttributeError):
            return _broken(out, n, "not a record")
        if rec.get("prev") != prev:
            return _broken(out, n, "does not follow the record before it (a record deleted, reordered or edited)")
        if _chain_hash(prev, rec) != h:
            return _broken(out, n, "its hash does not match its content (the line was edited)")
        if rec.get("seq") != seq + 1 and rec.get("op") not in ("log_opened", "log_recovered"):
            return _broken(out, n, f"seq {rec.get('seq')} after {seq}")
        prev, seq = h, int(rec.get("seq", seq + 1))
        out.records += 1
        out.ops[rec.get("op", "?")] += 1
        if isinstance(rec.get("time"), (int, float)):
            out.minutes[int(rec["time"] // 60)] += 1
        if rec.get("op") == "tool_call":
            out.tools[str(rec.get("tool"))] += 1
            if rec.get("outcome") == "refused":
                out.violations[str(rec.get("violation", "?"))] += 1
        if rec.get("outcome") in ("error", "refused") or rec.get("status") not in (None, "ok"):
            out.refused.append(rec)
    return out


BURST_FACTOR = 5.0  # a minute with this many times the median minute's records is a burst ...
BURST_MIN = 100  # ... if it also has at least this many
REFUSED_SHARE = 0.1  # refused tool calls above this share of all tool calls are flagged


def flags(v: Verified, declared: set[str] | None = None, baseline: set[str] | None = None) -> list[str]:
    """What in a verified log deserves a look, one line each: tool calls refused outside their
    grants (by violation, and when they are over ``REFUSED_SHARE`` of the calls), tools that no
    environment declares (``declared``) or that a baseline log never called (``baseline``), and
    bursts (a minute over ``BURST_FACTOR`` times the median minute and ``BURST_MIN`` records)."""
    out = []
    calls, refused = sum(v.tools.values()), sum(v.violations.values())
    if refused:
        kinds = ", ".join(f"{k} {n}" for k, n in v.violations.most_common())
        share = refused / calls
        out.append(f"grants exceeded: {refused} tool call(s) refused ({kinds})"
                   + (f", {share:.0%} of all tool calls" if share > REFUSED_SHARE else ""))
    for tool in sorted(v.tools):
        if tool == "(malformed)":
            continue
        if declared is not None and tool not in declared:
            out.append(f"undeclared tool: {tool} ({v.tools[tool]} calls) is not declared by any environment")
        if baseline is not None and tool not in baseline:
            out.append(f"new tool: {tool} ({v.tools[tool]} calls) never called in the baseline log")
    if v.minutes:
        per = sorted(v.minutes.values())
        median = per[len(per) // 2]
        for minute, n in sorted(v.minutes.items()):
            if n >= BURST_MIN and n > BURST_FACTOR * median:
                when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(minute * 60))
                out.append(f"burst: {n} records in the minute from {when} UTC (median {median} per minute)")
    return out


def _broken(out: Verified, line: int, reason: str) -> Verified:
    out.intact, out.broken_line, out.reason = False, line, reason
    return out
