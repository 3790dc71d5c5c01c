"""Traffic capture of ``rlvr serve --capture DIR``: every completed request and every feedback on
it, one JSON line each, in files the flywheel reads (``rlvr.flywheel.harvest``, docs/flywheel.md).

Files are ``DIR/traffic-<UTC time>-<pid>-<n>.jsonl``; names sort in the order they were opened.
A file is closed and a new one opened once it holds ``rotate_bytes`` or has been open
``rotate_seconds``. Each record is written whole by one ``os.write`` on a file opened with
``O_APPEND``, before the response's last byte leaves the server: a process that dies (SIGKILL
included) has every response a client received in the log, and at most the record being written
is cut short. ``read_traffic`` skips such a torn last line of a file and counts it; a torn line
anywhere else is an error naming file and line. The page cache is flushed (``fsync``) when a
file is rotated and when the server stops; a power loss can lose what was written since.

Records (``type``): ``response`` (id, time, endpoint, model, model_version, request, params,
prompt_token_ids (a list of lists for a completions request with several prompts), choices with
text, token ids and finish reason, usage, latency_s) and
``feedback`` (id of the response, choice, rating ``up``/``down``, correction, label, reason).
With a content filter (``--filter``) the stored texts (the request's messages, the completions
as served, a correction) have every match of the filter's rules redacted, and no token ids are
stored (they would hold what the redaction hides).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rlvr.errors import UserError

PREFIX, SUFFIX = "traffic-", ".jsonl"
ROTATE_BYTES = 64 << 20
ROTATE_SECONDS = 3600.0


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class TrafficLog:
    """The append-only capture directory of one server (thread-safe)."""

    def __init__(self, directory: str | Path, *, rotate_bytes: int = ROTATE_BYTES,
                 rotate_seconds: float = ROTATE_SECONDS, content_filter=None) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rotate_bytes, self.rotate_seconds = rotate_bytes, rotate_seconds
        self.content_filter = content_filter
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._opened = 0.0
        self._size = 0
        self._n = 0
        self.known: set[str] = {r["id"] for _, r in read_traffic(self.dir) if r.get("type") == "response"}
        """Response ids in the directory (feedback may name them)."""
        self.failed = 0
        """Records the server could not write (``rlvr.serve.handlers`` counts them and serves on)."""

    # -- writing -----------------------------------------------------------------------------------
    def _open(self) -> None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%f")
        self._n += 1
        path = self.dir / f"{PREFIX}{stamp}-{os.getpid()}-{self._n:04d}{SUFFIX}"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._opened, self._size = time.monotonic(), 0

    def _close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None

    def append(self, record: dict) -> None:
        """Write ``record`` as one line (one ``os.write``), rotating first when the file is full or old."""
        line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._fd is not None and (self._size >= self.rotate_bytes
                                         or time.monotonic() - self._opened >= self.rotate_seconds):
                self._close()
            if self._fd is None:
                self._open()
            written = os.write(self._fd, line)
            while written < len(line):  # a short write (a full disk raises instead): finish the line
                written += os.write(self._fd, line[written:])
            self._size += len(line)
            if record.get("type") == "response":
                self.known.add(record["id"])

    def close(self) -> None:
        with self._lock:
            self._close()

    # -- what is stored ----------------------------------------------------------------------------
    @property
    def redacting(self) -> bool:
        return self.content_filter is not None

    def text(self, text: str | None) -> str | None:
        """``text`` as stored: every match of the filter's rules redacted (none without a filter)."""
        if text is None or self.content_filter is None:
            return text
        from rlvr.content_filter import redact, scan

        return redact(text, scan(text, list(self.content_filter.actions)))

    def ids(self, ids: list[int] | None) -> list[int] | None:
        """Token ids as stored: none with a filter."""
        return None if self.content_filter is not None else ids


# -- reading ---------------------------------------------------------------------------------------
@dataclass
class ReadStats:
    files: int = 0
    records: int = 0
    torn: int = 0
    """Last lines cut short by a crash (skipped)."""


def traffic_files(directory: str | Path) -> list[Path]:
    d = Path(directory)
    if not d.is_dir():
        raise UserError(f"traffic directory {d} does not exist (start rlvr serve with --capture {d})")
    return sorted(p for p in d.iterdir() if p.name.startswith(PREFIX) and p.name.endswith(SUFFIX))


def read_traffic(directory: str | Path, stats: ReadStats | None = None) -> Iterator[tuple[str, dict]]:
    """Every record of the directory as ``(FILE:LINE, record)``, files in name order. A file's last
    line without its newline (the record a crash cut) is skipped and counted in ``stats.torn``;
    any other line that is not a JSON object is a ``UserError`` naming file and line."""
    stats = stats if stats is not None else ReadStats()
    for path in traffic_files(directory):
        stats.files += 1
        data = path.read_bytes()
        lines = data.split(b"\n")
        complete, tail = lines[:-1], lines[-1]
        for i, raw in enumerate(complete, 1):
            where = f"{path}:{i}"
            try:
                record = json.loads(raw)
            except ValueError as e:
                raise UserError(f"{where}: not a JSON record ({e})") from None
            if not isinstance(record, dict) or "type" not in record or "id" not in record:
                raise UserError(f"{where}: not a traffic record (no 'type' and 'id')")
            stats.records += 1
            yield where, record
        if tail:
            stats.torn += 1
