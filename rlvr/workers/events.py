"""``workers.jsonl`` in the run directory: what the cluster did to the run (retries, replaced
actors, trainer restarts), one JSON line each, also printed as one line on stderr."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path


class EventLog:
    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / "workers.jsonl"
        self._lock = threading.Lock()

    def write(self, event: dict) -> None:
        event = {"time": round(time.time(), 3), **event}
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps(event) + "\n")
        detail = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("time", "event"))
        print(f"rlvr workers: {event.get('event')} {detail}", file=sys.stderr, flush=True)


def read_events(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "workers.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
