"""Task pool: cycles through a fixed set of training tasks in seeded, reshuffled epochs.

The simplest curriculum: uniform over the pool, learning nothing from the batches (``observe``,
``on_eval`` and ``metrics`` do nothing; ``rlvr.curriculum.scheduler.Curriculum`` is the one that
does). Its state (order, cursor, epoch) is part of every checkpoint so a resumed run draws exactly
the tasks an uninterrupted one would.
"""

from __future__ import annotations

import random

from rlvr.types import Scored, Task


class TaskPool:
    learns = False  # outcomes never change its draws (the asynchronous producer, rlvr.rollout.async_rollout)

    def __init__(self, tasks: list[Task], seed: int) -> None:
        if not tasks:
            raise ValueError("the task pool is empty")
        self.tasks = tasks
        self.seed = seed
        self.epoch = 0
        self.cursor = 0
        self.order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def next(self, n: int, step: int = 0) -> list[Task]:
        out = []
        while len(out) < n:
            if self.cursor == len(self.order):
                self.epoch += 1
                self.order, self.cursor = self._shuffled(self.epoch), 0
            out.append(self.tasks[self.order[self.cursor]])
            self.cursor += 1
        return out

    def observe(self, scored: list[Scored], step: int = 0) -> None:
        """Uniform sampling ignores outcomes."""

    def on_eval(self, step: int, by_domain: dict[str, dict]) -> list[dict]:
        return []

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor = state["epoch"], state["cursor"]
        self.order = self._shuffled(self.epoch)
