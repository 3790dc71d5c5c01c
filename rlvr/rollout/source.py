"""The trainer's rollout interface: where verified batches come from.

The GRPO loop (``rlvr.train.grpo.run_grpo``) asks a ``RolloutSource`` for the batch of each step
and hands it the new weights after each update; it never knows how the batch was produced:

    batch = source.next(trainer_version)   tasks drawn, generated, verified, rewarded
    ... advantages, update ...
    source.push(model, version)            the trainer's weights after the update
    source.metrics(batch, trainer_version) what the producer reports about that batch
    source.close()                         at the end (or on an error)

Implementations: ``SyncRollout`` (``rlvr.rollout.sync_rollout``: one phase after the other in
the caller's thread, with the trainer's own model) and ``AsyncRollout``
(``rlvr.rollout.async_rollout``: background threads on an engine copy, staleness bounded) run in
the trainer's process; ``RayRollout`` and ``RayAsyncRollout`` (``rlvr.workers.ray_rollout``) are
the same two with the generate and verify phases on Ray actors (``backend: ray``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from rlvr.types import Scored, Task


@dataclass
class RolloutBatch:
    """One verified batch, as the trainer receives it."""

    index: int                  # 0-based batch number over the run (= the step it was made for - 1)
    tasks: list[Task]
    scored: list[Scored]
    version: int                # policy version that generated every trajectory in it
    pool_state: dict            # task pool state right after drawing ``tasks`` (what a checkpoint saves)
    mismatch_kl: float | None   # sampling log-probs vs a full forward at the same weights, when the
                                # producer measured it (an engine copy); None: the trainer measures it
    timings: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)  # what the producer counted (dynamic sampling rounds, ...)


class RolloutSource(Protocol):
    """What the trainer needs from whatever produces its batches."""

    takes_weights: bool
    """Whether ``push`` must be called after each update: False where the batches are generated
    with the trainer's own model (the in-process synchronous source), so there is nothing to copy."""

    def next(self, trainer_version: int) -> RolloutBatch:
        """The batch to train at ``trainer_version`` (blocks until it is ready)."""
        ...

    def push(self, model: torch.nn.Module, version: int) -> None:
        """The trainer's weights after its update to ``version``."""
        ...

    def metrics(self, batch: RolloutBatch, trainer_version: int) -> dict[str, float]:
        """The producer's own metrics for ``batch`` (timings, staleness, ...)."""
        ...

    def close(self) -> None:
        """Stop producing and release what the source holds. Idempotent."""
        ...
