"""Alerts of a run: one JSON line each in ``<run>/alerts.jsonl`` and one printed line.

An alert is a dict with at least ``step``, ``detector``, ``severity`` and ``evidence``. On resume
the file is cut back to the checkpoint's step, like ``metrics.jsonl``.
"""

from __future__ import annotations

import json
from pathlib import Path


class AlertLog:
    def __init__(self, run_dir: str | Path, *, resume_step: int | None = None, echo=print) -> None:
        self.path = Path(run_dir) / "alerts.jsonl"
        self.echo = echo
        if resume_step is None:
            self.path.write_text("")
        elif self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, alert: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(alert) + "\n")
        if self.echo is not None:
            evidence = ", ".join(f"{k}={v}" for k, v in alert.get("evidence", {}).items())
            self.echo(f"[alert] step {alert['step']} {alert['detector']} ({alert['severity']}): "
                      f"{alert.get('group', '')} {evidence}; {alert.get('action', 'logged')}")


def read_alerts(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "alerts.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
