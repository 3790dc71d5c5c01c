"""Synchronous rollouts: each batch drawn, generated and verified when the trainer asks for it.

The default ``RolloutSource`` (``rlvr.rollout.source``): one phase after the other in the
caller's thread. The trainer's phase function generates with the trainer's own model (so
``push`` has nothing to copy) and the run's one random generator, which makes a run with a fixed
seed repeat exactly.

Dynamic sampling (``refill_rounds`` > 0: the curriculum's ``filter.refill_rounds`` or
``algo.dynamic_sampling_rounds``; DAPO, Yu et al. 2025, Sec. 3.2): groups whose rewards are all
equal carry no signal; for each of them another task is drawn, generated and verified, up to
``refill_rounds`` more times, so the update sees ``tasks_per_step`` groups with signal whenever the
pool has them. Each round draws only the missing groups, so the signal groups never exceed
``tasks_per_step``. Every round's batch goes to the pool's ``observe``. The counts (rounds, groups
drawn, zero-variance share) are logged under ``refill_metrics`` (``curriculum/``, ``dynamic_sampling/``).
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable

import torch

from rlvr.algos.advantages import group_has_variance
from rlvr.rollout.source import RolloutBatch
from rlvr.types import Scored, Task


class SyncRollout:
    """``generate(tasks, version) -> episodes`` and ``verify(tasks, episodes) -> scored`` are the
    trainer's phase functions; ``pool`` is the task pool (curriculum) the batches are drawn from;
    ``refill_metrics`` the prefix of the dynamic-sampling counts."""

    takes_weights = False  # the phase functions generate with the trainer's own model

    def __init__(self, *, pool, tasks_per_step: int, generate: Callable, verify: Callable,
                 refill_rounds: int = 0, refill_metrics: str = "curriculum") -> None:
        self.pool, self.tasks_per_step = pool, tasks_per_step
        self.generate_fn, self.verify_fn = generate, verify
        self.refill_rounds, self.refill_metrics = refill_rounds, refill_metrics

    def next(self, trainer_version: int) -> RolloutBatch:
        tasks, scored, timings, counts = draw_verified(
            lambda n: self.pool.next(n, step=trainer_version), lambda more: self.generate_fn(more, trainer_version),
            self.verify_fn, lambda new: self.pool.observe(new, step=trainer_version), tasks_per_step=self.tasks_per_step,
            refill_rounds=self.refill_rounds, refill_metrics=self.refill_metrics)
        pool_state = dict(self.pool.state_dict())
        return RolloutBatch(trainer_version, tasks, scored, trainer_version, pool_state, None, timings, counts)

    def push(self, model: torch.nn.Module, version: int) -> None:
        """Nothing to copy: the trainer updates the model the phase function generates with."""

    def metrics(self, batch: RolloutBatch, trainer_version: int) -> dict[str, float]:
        return {**batch.timings, **batch.counts, **self.pool.metrics()}

    def close(self) -> None:
        """Nothing runs in the background; the environments belong to the caller."""


def draw_verified(draw: Callable, generate: Callable, verify: Callable, observe: Callable, *, tasks_per_step: int,
                  refill_rounds: int, refill_metrics: str) -> tuple[list[Task], list[Scored], dict, dict]:
    """One batch: ``draw(n)`` tasks, ``generate(tasks)`` and ``verify(tasks, episodes)`` them,
    ``observe(scored)`` each round, and draw again for the groups without signal up to
    ``refill_rounds`` more times. Returns (tasks, scored, timings, dynamic-sampling counts); the
    synchronous source and the asynchronous producer (``rlvr.rollout.async_rollout``) share it."""
    timings: dict[str, float] = defaultdict(float)
    tasks: list[Task] = []
    scored: list[Scored] = []
    wanted, rounds, drawn_groups = tasks_per_step, 0, 0
    while wanted:
        t0 = time.perf_counter()
        more = draw(wanted)
        t1 = time.perf_counter()
        episodes = generate(more)
        t2 = time.perf_counter()
        new = verify(more, episodes)
        observe(new)
        t3 = time.perf_counter()
        for k, v in (("time/curriculum", t1 - t0), ("time/rollout", t2 - t1), ("time/verify", t3 - t2)):
            timings[k] += v
        scored += [_regroup(s, len(tasks)) for s in new]
        tasks += more
        rounds, drawn_groups = rounds + 1, drawn_groups + len(more)
        if rounds > refill_rounds:
            break
        wanted = tasks_per_step - signal_groups(scored)
    name = refill_metrics
    counts = {f"{name}/rounds": float(rounds), f"{name}/groups_drawn": float(drawn_groups),
              f"{name}/zero_variance_frac": 1.0 - signal_groups(scored) / drawn_groups} if refill_rounds else {}
    return tasks, scored, dict(timings), counts


def signal_groups(scored: list[Scored]) -> int:
    """Groups (``trajectory.group_id``) whose rewards are not all equal (``group_has_variance``)."""
    if not scored:
        return 0
    groups = torch.tensor([s.trajectory.group_id for s in scored], dtype=torch.long)
    keep = group_has_variance(torch.tensor([s.reward for s in scored], dtype=torch.float32), groups)
    return len(set(groups[keep].tolist()))


def _regroup(s: Scored, offset: int) -> Scored:
    """``s`` with its group id shifted past the groups of earlier rounds."""
    if not offset:
        return s
    return dataclasses.replace(s, trajectory=dataclasses.replace(s.trajectory, group_id=s.trajectory.group_id + offset))
