"""Alerts of a run: one JSON line each in ``<run>/alerts.jsonl`` and one printed line.

An alert is a dict with at least ``step``, ``detector``, ``severity`` and ``evidence``. Only a
critical alert or one that stops the run is printed; the others are counted (``AlertLog.summary``,
the trainer's progress line) and grouped by detector in the report. The
detectors' alerts (``rlvr.monitor.detectors``, made by ``make_alert``) are exactly

    {"step": int, "detector": str, "severity": "info" | "warning" | "critical", "evidence": {...},
     "trajectory_ids": ["<step>-<index in batch>", ...], "action": "logged" | "zeroed" | "stopped",
     "domain": str (only when the alert concerns one domain)}

(the curriculum's seesaw writes its own: ``group`` and ``action: "raised weight"``). On resume the
file is cut back to the checkpoint's step, like ``metrics.jsonl``. ``RunStopped`` is the error a
detector with action ``stop`` ends a run with, after its alert is written.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from rlvr.errors import UserError

SEVERITIES = ("info", "warning", "critical")
ACTIONS = {"log": "logged", "zero": "zeroed", "stop": "stopped"}  # config action -> what the alert says


def make_alert(step: int, detector: str, severity: str, evidence: dict[str, Any], trajectory_ids: list[str],
               action: str, domain: str | None = None) -> dict[str, Any]:
    """One detector alert (the schema above); ``action`` is the config's ``log | zero | stop``."""
    if severity not in SEVERITIES:
        raise ValueError(f"alert severity {severity!r}; choose one of: {', '.join(SEVERITIES)}")
    alert = {"step": int(step), "detector": detector, "severity": severity, "evidence": evidence,
             "trajectory_ids": list(trajectory_ids), "action": ACTIONS[action]}
    if domain is not None:
        alert["domain"] = domain
    return alert


class RunStopped(UserError):
    """A detector with action ``stop`` ended the run (its alert is in ``alerts.jsonl``).
    ``checkpoint``: the model is at a step boundary, so the trainer may save it before exiting."""

    def __init__(self, alert: dict[str, Any], alerts_path: Path, checkpoint: bool = True) -> None:
        self.alert, self.checkpoint = alert, checkpoint
        name = alert["detector"]
        ids = alert.get("trajectory_ids") or []
        what = f"{len(ids)} sample(s) flagged" if ids else ", ".join(f"{k}={v}" for k, v in alert["evidence"].items())
        where = f" [{alert['domain']}]" if "domain" in alert else ""
        super().__init__(f"run stopped at step {alert['step']} by detector '{name}'{where} "
                         f"(monitor.{name}.action = stop): {what}; see {alerts_path}")


class AlertLog:
    def __init__(self, run_dir: str | Path, *, resume_step: int | None = None, echo=print, pusher=None) -> None:
        """``pusher``: an ``rlvr.monitor.push.AlertPusher`` that gets a copy of each alert (or None)."""
        self.path = Path(run_dir) / "alerts.jsonl"
        self.echo = echo
        self.pusher = pusher
        self.counts: Counter = Counter()
        if resume_step is None:
            self.path.write_text("")
        elif self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, alert: dict) -> None:
        """Append ``alert``; print it only when it is critical or stops the run (the others are
        counted: ``summary``, the progress line)."""
        with self.path.open("a") as f:
            f.write(json.dumps(alert) + "\n")
        self.counts[alert["detector"]] += 1
        if self.pusher is not None:
            self.pusher.push(alert)
        if self.echo is not None and (alert.get("severity") == "critical" or alert.get("action") == "stopped"):
            where = alert.get("group", alert.get("domain", ""))
            self.echo(f"[alert] step {alert['step']} {alert['detector']} ({alert['severity']}){' ' + where if where else ''}: "
                      f"{describe(alert.get('evidence', {}))}; {alert.get('action', 'logged')}")

    def close(self, wait_s: float = 5.0) -> None:
        """Stop pushing, after up to ``wait_s`` seconds for what is queued."""
        if self.pusher is not None:
            self.pusher.close(wait_s)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        """One line: how many alerts this process wrote, by detector, and where they are."""
        if not self.total:
            return f"alerts: none ({self.path})"
        parts = ", ".join(f"{name} {n}" for name, n in self.counts.most_common())
        pushed = ""
        if self.pusher is not None:
            c = self.pusher.counts
            pushed = f"; pushed {c['pushed']}" + (f", failed {c['failed']}" if c["failed"] else "") + \
                (f", dropped {c['dropped']}" if c["dropped"] else "")
        return f"alerts: {self.total} ({parts}){pushed}; {self.path}, grouped in the report"


def describe(evidence: dict[str, Any]) -> str:
    """Evidence as a reader wants it: ``key value`` pairs, numbers rounded, notes as ``id: note``."""
    parts = []
    for key, value in evidence.items():
        if isinstance(value, dict):
            value = "; ".join(f"{k}: {v}" for k, v in value.items())
        elif isinstance(value, float):
            value = f"{value:.4g}"
        elif isinstance(value, list):
            value = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in value)
        parts.append(f"{key.replace('_', ' ')} {value}")
    return ", ".join(parts)


def read_alerts(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "alerts.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
