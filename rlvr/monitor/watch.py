"""The run's monitor: detectors applied step by step, their actions, and the trajectory sample.

The trainer calls, each step (``rlvr.train.grpo.run_grpo``):

    scored = monitor.screen(step, scored)   sample detectors, after verify and before the advantages:
                                            alerts; ``zero`` replaces the flagged rewards; ``stop``
                                            writes the step's trajectories and raises ``RunStopped``
    monitor.guard_finite(step, values)      (only when ``nan_inf.action`` is stop) inside the update,
                                            before each optimizer step: a NaN/inf loss or gradient
                                            norm stops the run with the weights still finite
    monitor.watch(step, metrics)            step detectors over the metrics history, after logging
    monitor.keep(step, scored)              trajectories/step_N.jsonl: the sampled share + the flagged

The history is the plain metrics rows (``time/*`` left out), rebuilt from ``metrics.jsonl`` on
resume; detectors report conditions only on the step they begin (``step_findings``; a condition
must have been gone ``monitor.rearm_steps`` steps to alert again), so a resumed run writes no alert
twice. Nothing else is kept between steps.

Alerts are for changes worth a look. Every sample detector's flags are kept (trajectories) and
counted each step (``monitor/flagged/<name>``, ``monitor/eligible/<name>``: the samples it looks at,
``monitor/rate/<name>``); an alert follows its ``alert`` mode: ``each`` flagged step (``tampering``,
a signature never normal), or ``rate`` (the others): the flagged share over a window reaching a floor
and rising against the run's own lowest level (``rate_onset``). A ``stop`` action stops on the first
flagged sample in either mode; ``zero`` zeroes every flagged sample.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rlvr.monitor.alerts import AlertLog, RunStopped, make_alert
from rlvr.monitor.config import MonitorConfig
from rlvr.monitor.detectors import DETECTORS, CodeTools, nonfinite, step_findings
from rlvr.monitor.sampling import sampled_indices, trajectory_id, write_trajectories
from rlvr.rewards import RewardConfig
from rlvr.types import Scored

HISTORY = 1000  # metrics rows kept (the windows of the step detectors are far shorter)
NOTES_IN_EVIDENCE = 5  # sample notes quoted in an alert's evidence (the trajectories hold them all)


def rate_onset(series: list[tuple[float, float]], cfg, rearm: int = 1) -> tuple[bool, float, float]:
    """A sample detector's rate condition (``SampleDetectorConfig``, mode ``rate``) over ``series``
    (``(flagged, eligible)`` per step, this step last): ``(new onset, rate, baseline)``. The rate at
    a step is flagged / eligible over the ``window`` steps ending there; the baseline its lowest
    value at the steps before (0 at the first). An onset: true now, false at the ``rearm`` steps before."""
    rates = []
    for t in range(len(series)):
        part = series[max(0, t - cfg.window + 1): t + 1]
        total = sum(e for _, e in part)
        rates.append(sum(f for f, _ in part) / total if total else 0.0)

    def holds(t: int) -> bool:
        base = min(rates[:t]) if t else 0.0
        return rates[t] >= cfg.min_rate and rates[t] - base >= cfg.min_rise

    t = len(rates) - 1
    onset = holds(t) and not any(holds(t - k) for k in range(1, min(rearm, t) + 1))
    return onset, rates[t], (min(rates[:t]) if t else 0.0)


def history_row(step: int, metrics: dict[str, Any]) -> dict[str, Any]:
    """A metrics row as ``metrics.jsonl`` reads back: numbers as floats, no ``time/*``."""
    row = {k: float(v) for k, v in metrics.items()
           if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.startswith("time/")}
    return {**row, "step": step}


def zeroed(s: Scored, reward: RewardConfig) -> Scored:
    """``s`` with its reward and terms at the fail value of its domain (outcome = fail_reward,
    every other term 0)."""
    fail = reward.for_domain(s.task.domain).fail_reward
    terms = {k: 0.0 for k in s.terms} | {"outcome": fail}
    return dataclasses.replace(s, reward=fail, terms=terms)


class Monitor:
    """``code``: the code detectors' sandbox side (``rlvr.train.code_tools.code_tools()``)."""

    def __init__(self, cfg: MonitorConfig, run_dir: Path, alerts: AlertLog, reward: RewardConfig, code: CodeTools, *,
                 seed: int, history: list[dict] = (), trajectories_every: int = 1) -> None:
        self.cfg, self.dir, self.alerts, self.reward, self.code = cfg, Path(run_dir), alerts, reward, code
        self.seed, self.every = seed, trajectories_every
        self.history = [history_row(int(r["step"]), r) for r in history][-HISTORY:]
        self.flags: dict[int, list[dict]] = {}  # this step's flagged batch indices
        self.counts: dict[str, float] = {}  # this step's monitor/* metrics

    def enabled(self, kind: str) -> list:
        if not self.cfg.enabled:
            return []
        return [d for d in map(DETECTORS.get, DETECTORS.names())
                if d.kind == kind and self.cfg.detector(d.name).enabled]

    @property
    def stops_on_nonfinite(self) -> bool:
        return self.cfg.enabled and self.cfg.nan_inf.enabled and self.cfg.nan_inf.action == "stop"

    # ------------------------------------------------------------------ per sample

    def screen(self, step: int, scored: list[Scored]) -> list[Scored]:
        self.flags, self.counts, stops, zero = {}, {}, [], set()
        for d in self.enabled("sample"):
            cfg = self.cfg.detector(d.name)
            notes = d.check(scored, cfg, self.code)
            eligible = sum(1 for s in scored if d.eligible(s))
            self.counts[f"monitor/flagged/{d.name}"] = float(len(notes))
            self.counts[f"monitor/eligible/{d.name}"] = float(eligible)
            if eligible:
                self.counts[f"monitor/rate/{d.name}"] = len(notes) / eligible
            if not notes:
                continue
            for i, note in notes.items():
                self.flags.setdefault(i, []).append({"detector": d.name, "severity": d.severity, "note": note})
            zero |= set(notes) if cfg.action == "zero" else set()
            evidence = {"flagged": len(notes), "samples": eligible}
            if cfg.alert == "rate":
                onset, rate, baseline = rate_onset(self._flag_series(d.name), cfg, self.cfg.rearm_steps)
                if not onset and cfg.action != "stop":
                    continue  # flagged and counted, not (yet) a change worth an alert
                evidence |= {"rate": round(rate, 4), "baseline": round(baseline, 4), "window": cfg.window}
            evidence["notes"] = {trajectory_id(step, i): notes[i] for i in sorted(notes)[:NOTES_IN_EVIDENCE]}
            ids = [trajectory_id(step, i) for i in sorted(notes)]
            alert = make_alert(step, d.name, d.severity, evidence, ids, cfg.action)
            self.alerts.write(alert)
            stops += [alert] if cfg.action == "stop" else []
        if zero:
            scored = [zeroed(s, self.reward) if i in zero else s for i, s in enumerate(scored)]
            self.counts["monitor/zeroed"] = float(len(zero))
        if stops:
            self.keep(step, scored)
            raise RunStopped(stops[0], self.alerts.path)
        return scored

    def _flag_series(self, name: str) -> list[tuple[float, float]]:
        """``(flagged, eligible)`` of detector ``name`` per step so far, this step's last."""
        rows = self.history + [self.counts]
        return [(float(r.get(f"monitor/flagged/{name}", 0.0)), float(r.get(f"monitor/eligible/{name}", 0.0)))
                for r in rows]

    # ------------------------------------------------------------------ per step

    def watch(self, step: int, metrics: dict[str, Any]) -> None:
        """The step detectors on the history with this step's ``metrics`` added (after the update
        and the metrics line: a ``stop`` here loses nothing of the step)."""
        self.history = (self.history + [history_row(step, metrics)])[-HISTORY:]
        stops = []
        for d in self.enabled("step"):
            cfg = self.cfg.detector(d.name)
            for finding in step_findings(d, self.history, cfg, self.cfg.rearm_steps):
                alert = make_alert(step, d.name, d.severity, finding.evidence, [], cfg.action, finding.domain)
                self.alerts.write(alert)
                stops += [alert] if cfg.action == "stop" else []
        if stops:
            raise RunStopped(stops[0], self.alerts.path)

    def guard_finite(self, step: int, values: dict[str, float], *, at_boundary: bool) -> None:
        """``nan_inf`` with action stop, before an optimizer step: raise on a non-finite value.
        ``at_boundary``: no optimizer step of this update has run yet (the weights are the last
        step's, so the trainer may checkpoint them)."""
        bad = nonfinite(values)
        if bad:
            alert = make_alert(step, "nan_inf", DETECTORS.get("nan_inf").severity,
                               {"nonfinite": bad, "before_optimizer_step": True}, [], "stop")
            self.alerts.write(alert)
            raise RunStopped(alert, self.alerts.path, checkpoint=at_boundary)

    # ------------------------------------------------------------------ trajectories

    def keep(self, step: int, scored: list[Scored]) -> Path | None:
        """Write this step's flagged samples and (every ``trajectories_every`` steps) its sampled share."""
        sampled = sampled_indices(len(scored), self.cfg.sample_share, self.seed, step) if step % self.every == 0 else []
        return write_trajectories(self.dir, step, scored, self.flags, sampled)
