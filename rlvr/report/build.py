"""Read a run directory into what the report shows: config, metrics, status, evals, alerts and
trajectory samples.

Two kinds of directory are read: a GRPO run (``rlvr train``: ``config.yaml``, ``metrics.jsonl``,
``eval/``, ``alerts.jsonl``, ``trajectories/``, ``final/``) and a quickstart (``rlvr quickstart``:
the GRPO run in ``grpo/`` plus the before/after evals in ``eval/``). Everything is optional
except a config or metrics file: a crashed run is reported with what it left. Lines that are not
JSON are skipped and counted, never fatal. This module renders nothing (``rlvr.report.html``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlvr.errors import UserError

STAGE_LABELS = {"sft": "SFT", "dpo": "SFT + DPO", "rl": "after GRPO"}  # quickstart eval/<name>.json


@dataclass
class Status:
    """``finished`` or ``crashed``; ``step`` the last logged step of ``steps`` configured."""

    state: str
    step: int
    steps: int | None
    note: str


@dataclass
class RunData:
    path: Path
    kind: str  # "grpo" | "quickstart"
    config_text: str
    config: dict
    metrics: list[dict]
    status: Status
    evals: dict[str, dict]  # label -> eval report (rlvr eval format), in display order
    eval_steps: list[int]  # steps of the periodic evals (eval/step_N.json)
    alerts: list[dict]
    trajectories: list[dict]  # normalised samples, every step
    summary: dict | None = None  # the quickstart's report.json
    plots: dict[str, bytes] = field(default_factory=dict)  # PNGs the run drew, by file name
    skipped_lines: int = 0  # lines of JSONL files that were not JSON objects


def read_run(path: str | Path, *, error: str | None = None) -> RunData:
    """The report's data for a GRPO run or quickstart directory. ``error``: the exception that
    stopped the run, when the caller knows it (the quickstart's own report of a crash)."""
    root = Path(path)
    if not root.is_dir():
        raise UserError(f"{root}: {'not a directory' if root.exists() else 'no such run directory'}")
    config_text, config = _read_config(root)
    quickstart = isinstance(config.get("grpo"), dict) and isinstance(config.get("pretrain"), dict)
    run = root / "grpo" if quickstart else root
    if not quickstart and not config_text and not (root / "metrics.jsonl").exists():
        raise UserError(f"{root}: not a run directory (no config.yaml or metrics.jsonl in it)")
    skipped = [0]
    metrics = _jsonl(run / "metrics.jsonl", skipped)
    alerts = _jsonl(run / "alerts.jsonl", skipped)
    run_config = _read_config(run)[1] if quickstart else config
    evals, eval_steps = _read_evals(root, run, quickstart)
    summary = _json(root / "report.json") if quickstart else None
    return RunData(
        path=root, kind="quickstart" if quickstart else "grpo", config_text=config_text, config=config,
        metrics=metrics, status=run_status(run, metrics, run_config, error=error, summary=summary,
                                           quickstart=quickstart, alerts=alerts),
        evals=evals, eval_steps=eval_steps, alerts=alerts,
        trajectories=read_trajectories(run / "trajectories", skipped), summary=summary,
        plots=_read_plots(root, run), skipped_lines=skipped[0],
    )


def run_status(run: Path, metrics: list[dict], config: dict, *, error: str | None = None,
               summary: dict | None = None, quickstart: bool = False, alerts: list[dict] = ()) -> Status:
    """Finished when the final model exists and the metrics reach the configured steps (and, for
    a quickstart, its report.json was written); otherwise stopped, when a detector's alert says
    it stopped the run, else crashed, at the last logged step."""
    steps = config.get("steps") if isinstance(config.get("steps"), int) else None
    step = max((m["step"] for m in metrics if isinstance(m.get("step"), int)), default=0)
    missing = []
    if not (run / "final").is_dir():
        missing.append("no final/ model")
    if steps is not None and step < steps:
        missing.append(f"metrics stop at step {step} of {steps}")
    if quickstart and summary is None:
        missing.append("no report.json (the quickstart did not reach its end)")
    if error:
        missing.insert(0, error)
    if not missing:
        return Status("finished", step, steps, f"finished: {step} steps")
    if quickstart and not run.is_dir():
        return Status("crashed", 0, steps, "crashed before GRPO started: " + "; ".join(missing))
    stop = next((a for a in alerts if a.get("action") == "stopped"), None)
    if stop is not None:
        return Status("stopped", step, steps, f"stopped at step {step} by detector '{stop.get('detector')}' "
                                              f"(its alert at step {stop.get('step')}): " + "; ".join(missing))
    return Status("crashed", step, steps, f"crashed at step {step}: " + "; ".join(missing))


def read_trajectories(folder: Path, skipped: list[int] | None = None) -> list[dict]:
    """Every sample of ``trajectories/step_N.jsonl``, in step order, normalised (``normalise``)."""
    skipped = skipped if skipped is not None else [0]
    files = sorted(folder.glob("step_*.jsonl"), key=_step_of) if folder.is_dir() else []
    return [normalise(row, _step_of(f), i) for f in files for i, row in enumerate(_jsonl(f, skipped))]


def normalise(row: dict, step: int, index: int) -> dict:
    """A trajectory sample with every field the report reads, filled in for older lines: ``id``
    ``<step>-<index>``, ``domain`` and ``level`` from a built-in task id
    (``domain/version/split/level/number``), empty flags, ``kept`` ``sampled``."""
    task_id = str(row.get("task_id", ""))
    parts = task_id.split("/")
    level = row.get("level")
    if level is None and len(parts) == 5 and parts[3].isdigit():
        level = int(parts[3])
    verdict = row.get("verdict") if isinstance(row.get("verdict"), dict) else {}
    return {
        **row,
        "id": str(row.get("id") or f"{row.get('step', step)}-{row.get('index', index)}"),
        "step": _int(row.get("step"), step), "index": _int(row.get("index"), index), "task_id": task_id,
        "domain": row.get("domain") or (parts[0] if len(parts) > 1 else ""), "level": level,
        "prompt": row.get("prompt") if isinstance(row.get("prompt"), list) else [],
        "messages": row.get("messages") if isinstance(row.get("messages"), list) else [],
        "completion": str(row.get("completion", "")),
        "terms": row.get("terms") if isinstance(row.get("terms"), dict) else {},
        "verdict": verdict,
        "flags": [f for f in row.get("flags", []) if isinstance(f, dict)] if isinstance(row.get("flags"), list) else [],
        "kept": row.get("kept", "sampled"),
    }


def select_trajectories(data: RunData, per_step: int = 4, max_flagged: int = 40) -> tuple[list[dict], dict[int, list[dict]]]:
    """What the report renders: the flagged samples (flags, kept ``flagged``, or linked from an
    alert; at most ``max_flagged``, those linked from an alert first) and, per step, the first
    ``per_step`` others."""
    linked = {str(i) for a in data.alerts for i in a.get("trajectory_ids", []) or []}
    flagged = [t for t in data.trajectories if t["flags"] or t["kept"] == "flagged" or t["id"] in linked]
    flagged = sorted(flagged, key=lambda t: t["id"] not in linked)[:max_flagged]
    shown = {t["id"] for t in flagged}
    by_step: dict[int, list[dict]] = {}
    for t in data.trajectories:
        if t["id"] not in shown:
            by_step.setdefault(t["step"], []).append(t)
    return flagged, {step: _spread(ts)[:per_step] for step, ts in by_step.items()}


def _spread(samples: list[dict]) -> list[dict]:
    """One sample of each task first, then the second of each, ...: a step's first few shown
    samples cover several groups, not one group's near-copies."""
    seen: dict[str, int] = {}
    rank = []
    for t in samples:
        seen[t["task_id"]] = seen.get(t["task_id"], -1) + 1
        rank.append(seen[t["task_id"]])
    return [t for _, t in sorted(zip(rank, samples), key=lambda p: p[0])]


def series(metrics: list[dict], name: str) -> list[tuple[float, float]]:
    """``(step, value)`` of one metric, finite values only."""
    out = []
    for m in metrics:
        v = m.get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf"):
            out.append((float(m.get("step", 0)), float(v)))
    return out


def names_with_prefix(metrics: list[dict], prefix: str) -> list[str]:
    """The metric names ``prefix<suffix>`` present in any line, sorted."""
    return sorted({k for m in metrics for k in m if k.startswith(prefix) and len(k) > len(prefix)})


# --------------------------------------------------------------------------- files


def _read_config(folder: Path) -> tuple[str, dict]:
    for name in ("config.yaml", "config.json"):
        path = folder / name
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError:
                data = None
            return text, data if isinstance(data, dict) else {}
    return "", {}


def _read_evals(root: Path, run: Path, quickstart: bool) -> tuple[dict[str, dict], list[int]]:
    """Quickstart: the stage evals (SFT, DPO, after GRPO). GRPO run: the first and last periodic
    evals and the final one; every periodic step is listed for the curves."""
    periodic = sorted((run / "eval").glob("step_*.json"), key=_step_of) if (run / "eval").is_dir() else []
    evals: dict[str, dict] = {}
    if quickstart:
        for name, label in STAGE_LABELS.items():
            report = _json(root / "eval" / f"{name}.json")
            if report is not None:
                evals[label] = report
    else:
        for path in dict.fromkeys(periodic[:1] + periodic[-1:]):
            report = _json(path)
            if report is not None:
                evals[f"step {_step_of(path)}"] = report
        final = _json(run / "eval" / "final.json")
        if final is not None:
            evals["final"] = final
    return {k: v for k, v in evals.items() if isinstance(v.get("by_domain"), dict)}, [_step_of(p) for p in periodic]


def _read_plots(root: Path, run: Path) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for folder in dict.fromkeys([root / "plots", run / "plots"]):
        if folder.is_dir():
            for png in sorted(folder.glob("*.png")):
                found.setdefault(png.name, png.read_bytes())
    return found


def _json(path: Path) -> Any:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _jsonl(path: Path, skipped: list[int]) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:  # a line cut by a crash mid-write
            row = None
        if isinstance(row, dict):
            rows.append(row)
        else:
            skipped[0] += 1
    return rows


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _step_of(path: Path) -> int:
    m = re.search(r"step_(\d+)", path.name)
    return int(m.group(1)) if m else 0
