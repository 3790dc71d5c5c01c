"""The verify phase of a rollout batch: one verdict per episode, in order.

A single-turn completion (an episode without an environment) is judged by its task's verifier,
all of them in one ``check_all`` batch (code runs in the sandbox together); a multi-turn episode
by the environment that holds its final state (hidden tests on the final workspace, the answer
and the tool results it rests on), concurrently.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from rlvr.types import Task, Trajectory, Verdict
from rlvr.verifiers.base import check_all


class Judged(Protocol):
    """An episode as the judge sees it (``rlvr.rollout.episodes.Episode``): its trajectory and
    the environment that played it, or None for a single-turn completion."""

    trajectory: Trajectory
    env: object | None


def judge(tasks: list[Task], episodes: list[Judged], workers: int = 8) -> list[Verdict]:
    """Verdicts in the order of ``episodes``; ``tasks[trajectory.group_id]`` is an episode's task."""
    verdicts: list[Verdict | None] = [None] * len(episodes)
    bulk = [i for i, ep in enumerate(episodes) if ep.env is None]
    for i, v in zip(bulk, check_all([(tasks[episodes[i].trajectory.group_id], episodes[i].trajectory.completion)
                                     for i in bulk])):
        verdicts[i] = v
    played = [i for i, ep in enumerate(episodes) if ep.env is not None]
    with ThreadPoolExecutor(max_workers=workers) as threads:
        for i, v in zip(played, threads.map(lambda i: episodes[i].env.verify(), played)):
            verdicts[i] = v
    return verdicts  # type: ignore[return-value]
