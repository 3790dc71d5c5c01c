"""Synchronous rollouts: each batch drawn, generated and verified when the trainer asks for it.

The default ``RolloutSource`` (``rlvr.rollout.source``): one phase after the other in the
caller's thread. The trainer's phase function generates with the trainer's own model (so
``push`` has nothing to copy) and the run's one random generator, which makes a run with a fixed
seed repeat exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from rlvr.rollout.source import RolloutBatch


class SyncRollout:
    """``generate(tasks, version) -> episodes`` and ``verify(tasks, episodes) -> scored`` are the
    trainer's phase functions; ``pool`` is the task pool (curriculum) the batches are drawn from."""

    def __init__(self, *, pool, tasks_per_step: int, generate: Callable, verify: Callable) -> None:
        self.pool, self.tasks_per_step = pool, tasks_per_step
        self.generate_fn, self.verify_fn = generate, verify

    def next(self, trainer_version: int) -> RolloutBatch:
        t0 = time.perf_counter()
        tasks = self.pool.next(self.tasks_per_step)
        pool_state = dict(self.pool.state_dict())
        t1 = time.perf_counter()
        episodes = self.generate_fn(tasks, trainer_version)
        t2 = time.perf_counter()
        scored = self.verify_fn(tasks, episodes)
        t3 = time.perf_counter()
        timings = {"time/curriculum": t1 - t0, "time/rollout": t2 - t1, "time/verify": t3 - t2}
        return RolloutBatch(trainer_version, tasks, scored, trainer_version, pool_state, None, timings)

    def push(self, model: torch.nn.Module, version: int) -> None:
        """Nothing to copy: the trainer updates the model the phase function generates with."""

    def metrics(self, batch: RolloutBatch, trainer_version: int) -> dict[str, float]:
        return dict(batch.timings)

    def close(self) -> None:
        """Nothing runs in the background; the environments belong to the caller."""
