"""Which trajectories of a step are kept for inspection, and how each is written.

``<run>/trajectories/step_N.jsonl``: a seeded share of the step's samples (``monitor.sample_share``,
every ``save_trajectories_every`` steps) plus every sample a detector flagged (every step), one
JSON object per line (``trajectory_record``). A record's ``id`` (``"<step>-<index in batch>"``) is
what alerts list in ``trajectory_ids``.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from rlvr.types import Scored


def trajectory_id(step: int, index: int) -> str:
    return f"{step}-{index}"


def sampled_indices(n: int, share: float, seed: int, step: int) -> list[int]:
    """``ceil(share * n)`` distinct indices of ``range(n)`` (none when ``share`` is 0), drawn by an
    RNG seeded from ``(seed, step)``: the same run keeps the same samples, resumed or not."""
    k = min(n, math.ceil(share * n - 1e-9)) if share > 0 else 0
    rng = random.Random(f"rlvr.monitor.sampling/{seed}/{step}")  # str seeds hash (sha512), not seed + step
    return sorted(rng.sample(range(n), k))


def trajectory_record(step: int, index: int, s: Scored, flags: list[dict], kept: str) -> dict[str, Any]:
    """One line of ``step_N.jsonl``; ``flags``: ``{"detector", "severity", "note"}`` each;
    ``kept``: ``"flagged"`` or ``"sampled"``."""
    t = s.trajectory
    record = {"id": trajectory_id(step, index), "step": step, "index": index, "task_id": t.task_id,
              "domain": s.task.domain, "level": s.task.level, "group_id": t.group_id,
              "prompt": [dict(m) for m in s.task.prompt], "completion": t.completion}
    if t.episode is not None:
        record.update(messages=[dict(m) for m in t.messages], info=t.episode.to_dict())
    record.update(finish_reason=t.finish_reason, reward=s.reward, terms=dict(s.terms),
                  verdict=s.verdict.to_dict(), flags=list(flags), kept=kept)
    if s.scores:  # each reward source's own score (reward.sources): what a proxy paid beside the gold
        record["scores"] = dict(s.scores)
    return record


def write_trajectories(run_dir: Path, step: int, scored: list[Scored], flags: dict[int, list[dict]],
                       sampled: list[int]) -> Path | None:
    """Write the flagged and sampled samples of ``step`` (in batch order); None when there are none."""
    keep = sorted(set(flags) | set(sampled))
    if not keep:
        return None
    path = run_dir / "trajectories" / f"step_{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i in keep:
            kept = "flagged" if flags.get(i) else "sampled"
            f.write(json.dumps(trajectory_record(step, i, scored[i], flags.get(i, []), kept)) + "\n")
    return path
