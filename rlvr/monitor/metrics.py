"""Metrics sink: one JSONL line per step plus TensorBoard events, under the same names; the
optional trackers (``rlvr.monitor.trackers``: MLflow, W&B) get the same numbers too.

Names are namespaced: ``rollout/*``, ``train/*``, ``eval/*``, ``time/*``. On resume the JSONL is
truncated to the checkpoint's step, so a resumed run's file reads as if it never stopped.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

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
        kept = [
            line for line in self.path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step
        ]
        self.path.write_text("".join(line + "\n" for line in kept))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        clean = {k: (float(v) if isinstance(v, (int, float)) else v) for k, v in metrics.items()}
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **clean}) + "\n")
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


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
