"""Metrics sink: one JSONL line per step plus TensorBoard events, under the same names; the
optional trackers (``rlvr.monitor.trackers``: MLflow, W&B) get the same numbers too.

Names are namespaced: ``rollout/*``, ``train/*``, ``eval/*``, ``time/*``. On resume the JSONL is
truncated to the checkpoint's step, so a resumed run's file reads as if it never stopped: the kept
lines are written to a temporary file that replaces the log in one rename (a crash during the
truncation leaves the old file whole), and a last line cut short by a crash mid-write is dropped.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from rlvr.atomic import write_text_atomic
from rlvr.errors import UserError
from rlvr.faults import fault_point
from rlvr.monitor.trackers import Tracker


class MetricsLogger:
    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True, resume_step: int | None = None,
                 trackers: Sequence[Tracker] = ()):
        self.trackers = list(trackers)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        if resume_step is None:
            self.path.write_text("")
        else:
            self._truncate_after(resume_step)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=resume_step)

    def _truncate_after(self, step: int) -> None:
        if not self.path.exists():
            self.path.write_text("")
            return
        kept = [line for line in self.path.read_text().splitlines() if _step_of(line) <= step]
        write_text_atomic(self.path, "".join(line + "\n" for line in kept))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        clean = {k: (float(v) if isinstance(v, (int, float)) else v) for k, v in metrics.items()}
        line = json.dumps({"step": step, **clean}) + "\n"
        fault_point("metrics")
        with self.path.open("a") as f:
            fault_point("metrics_line", before=lambda: (f.write(line[: len(line) // 2]), f.flush()))
            f.write(line)
        if self._tb is not None:
            for k, v in clean.items():
                if isinstance(v, float) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
        numbers = {k: v for k, v in clean.items() if isinstance(v, float)}
        for tracker in self.trackers:
            tracker.log(step, numbers)

    def close(self) -> None:
        """Flush TensorBoard and close each tracker (once, however many times this is called)."""
        trackers, self.trackers = self.trackers, []
        try:
            if self._tb is not None:
                self._tb.flush()
                self._tb.close()
        finally:
            for tracker in trackers:
                tracker.close()


def _step_of(line: str) -> float:
    """The step of a metrics line; infinity for a blank or cut-short line (never kept on resume)."""
    try:
        return json.loads(line).get("step", 0)
    except ValueError:
        return math.inf


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's metrics rows. A last line cut short by a crash mid-write is left out; a damaged
    line before it is a ``UserError`` naming the file and line."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    lines = [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    rows = []
    for i, (n, line) in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except ValueError:
            if i == len(lines) - 1:
                break  # the record being written when the run stopped
            raise UserError(f"{path}:{n}: not a JSON metrics row") from None
    return rows
